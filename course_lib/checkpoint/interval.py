"""How often to checkpoint: the waste model of lesson 10, its optima, and a Monte Carlo check.

A run checkpoints every ``tau`` seconds of work; a save blocks training for ``C`` seconds;
failures arrive as a Poisson process with mean time between failures ``M`` (MTBF); after a
failure the run pays a restart cost ``R`` and redoes the work since the last *completed*
checkpoint (a save in flight at the failure is lost too). The waste fraction is the extra
wall time per second of useful work, first order in ``tau / M`` and ``C / M``::

    W(tau) = C / tau + (tau + C) / (2 M) + R / M        (10.1)

Its minimum (Young) and Daly's higher-order correction::

    tau^* = sqrt(2 C M)        (10.2)
    tau^* = sqrt(2 C M) (1 + (1/3) sqrt(C / (2 M)) + (1/9) (C / (2 M))) - C   (C < 2M)        (10.3)
    tau^* = M   (C >= 2M)

An asynchronous save blocks only for the host copy of the state; the write to disk overlaps
training while it finishes before the next save::

    C_block = S / B_copy,   S / B_disk < tau        (10.4)

:func:`simulate_lost_work` measures the waste of the same model by simulation (no
expansion), and :func:`exact_waste_fraction` is its closed-form mean; the two agree, and
both sit above eq. 10.1 once ``C`` and ``tau`` are not small against ``M`` (failures also
strike the redone work). :func:`sweep` gathers all of it for the lesson's plot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

#: z-value of a two-sided 95% normal confidence band.
Z95 = 1.959963984540054


def _positive(**values: float) -> None:
    """Raise ValueError naming every argument that is not a finite positive number."""
    for name, value in values.items():
        if not (isinstance(value, int | float | np.integer | np.floating) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a finite number > 0 (seconds or bytes); got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if not (isinstance(value, int | float | np.integer | np.floating) and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number >= 0 (seconds); got {value!r}")


def _taus(tau: ArrayLike) -> NDArray[np.float64]:
    arr = np.asarray(tau, dtype=np.float64)
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"tau must be finite and > 0 (seconds of work between checkpoints); got {tau!r}")
    return arr


def _scalar_or_array(arr: NDArray[np.float64]) -> Any:
    return float(arr) if arr.ndim == 0 else arr


def waste_fraction(tau: ArrayLike, C: float, M: float, R: float = 0.0) -> Any:
    """First-order waste fraction (10.1): extra wall time per second of useful work.

    Args:
        tau: seconds of work between checkpoints (a float or an array of them, any shape).
        C: seconds a blocking save takes.
        M: mean time between failures (MTBF), seconds.
        R: restart cost after a failure, seconds.

    Returns:
        a float for a scalar ``tau``, else an array of ``tau``'s shape.
    """
    _positive(C=C, M=M)
    _non_negative("R", R)
    t = _taus(tau)
    return _scalar_or_array(C / t + (t + C) / (2 * M) + R / M)


def exact_waste_fraction(tau: ArrayLike, C: float, M: float, R: float = 0.0) -> Any:
    """The simulated model's mean waste without expansion: a segment of ``L = tau + C`` seconds
    with exponential failures (rate ``1/M``) and a failure-free restart ``R`` takes on average
    ``(M + R)(exp(L / M) - 1)`` seconds, so the waste is that over ``tau``, minus 1. Expanded to
    second order in ``L / M`` it is eq. 10.1 plus ``C (tau + C) / (2 M tau) + R C / (M tau)``:
    two terms of first order in ``C / M`` that eq. 10.1 drops (a failure also strikes the save
    in flight, and the restart is paid per segment of ``tau + C``, not per ``tau``), plus the
    terms of order ``(L / M)^2``. It is always above eq. 10.1.

    Returns:
        a float for a scalar ``tau``, else an array of ``tau``'s shape.
    """
    _positive(C=C, M=M)
    _non_negative("R", R)
    t = _taus(tau)
    return _scalar_or_array((M + R) * np.expm1((t + C) / M) / t - 1.0)


def young_interval(C: float, M: float) -> float:
    """Young's optimal checkpoint interval (10.2), the minimiser of (10.1), in seconds of work."""
    _positive(C=C, M=M)
    return math.sqrt(2 * C * M)


def daly_interval(C: float, M: float) -> float:
    """Daly's higher-order optimal interval (10.3), in seconds of work; ``M`` once ``C >= 2M``.

    It tends to Young's (10.2) as ``C / M -> 0`` and is shorter than it for any ``C > 0``
    below ``2M`` (the ``- C`` outweighs the positive corrections).
    """
    _positive(C=C, M=M)
    if C >= 2 * M:
        return float(M)
    x = C / (2 * M)
    return math.sqrt(2 * C * M) * (1 + math.sqrt(x) / 3 + x / 9) - C


@dataclass(frozen=True)
class AsyncSaveCost:
    """What an asynchronous save costs the training loop (eq. 10.4).

    Attributes:
        blocking_s: seconds the loop stops for the snapshot copy, ``S / B_copy``.
        write_s: seconds the background write takes, ``S / B_disk``.
        keeps_up: whether the write finishes before the next save, ``S / B_disk < tau``
            (if not, saves queue up and the loop ends up waiting for the disk after all).
    """

    blocking_s: float
    write_s: float
    keeps_up: bool


def async_blocking_cost(state_bytes: float, copy_bw: float, disk_bw: float, tau: float) -> AsyncSaveCost:
    """The blocking cost of an asynchronous save and whether its write keeps up (10.4).

    Args:
        state_bytes: ``S``, bytes of train state saved.
        copy_bw: ``B_copy``, bytes/s of the snapshot copy (device or host memory to a host buffer).
        disk_bw: ``B_disk``, bytes/s of the write to storage.
        tau: seconds of work between saves.
    """
    _positive(state_bytes=state_bytes, copy_bw=copy_bw, disk_bw=disk_bw, tau=tau)
    write_s = state_bytes / disk_bw
    return AsyncSaveCost(blocking_s=state_bytes / copy_bw, write_s=write_s, keeps_up=write_s < tau)


@dataclass(frozen=True)
class LostWork:
    """The waste of one checkpoint interval measured over ``n_runs`` simulated runs.

    Attributes:
        tau: the interval, seconds of work.
        waste: mean over runs of ``(wall seconds - work seconds) / work seconds``.
        stderr: standard error of that mean.
        low, high: its 95% confidence band, ``waste -/+ 1.96 stderr``.
        failures_per_run: mean number of failures a run met.
        per_run: [n_runs] the waste of each run (left out of ``==`` and the repr).
    """

    tau: float
    waste: float
    stderr: float
    low: float
    high: float
    failures_per_run: float
    per_run: NDArray[np.float64] = field(compare=False, repr=False)


def simulate_lost_work(
    tau: float,
    C: float,
    M: float,
    R: float = 0.0,
    horizon: float = 1e6,
    n_runs: int = 200,
    seed: int = 0,
) -> LostWork:
    """Monte Carlo waste of checkpointing every ``tau`` seconds of work (compare with eq. 10.1).

    Each run must do ``ceil(horizon / tau)`` segments of ``tau`` work plus a ``C`` save
    (``L = tau + C`` seconds). Failures are exponential with mean ``M``; one inside a
    segment (the save included) loses everything since the last completed save, costs a
    restart ``R`` (failure-free) and the segment starts over. A segment's failures before it
    completes are geometric with success probability ``exp(-L / M)``, so a run's count is
    negative binomial and each failure time is an exponential truncated to ``[0, L)``;
    everything is drawn in a few vectorised numpy calls (no Python loop over failures).

    Args:
        tau, C, M, R: seconds, as in eq. 10.1.
        horizon: seconds of useful work each run must complete.
        n_runs: independent runs (the confidence band comes from their spread).
        seed: seed of the numpy generator: same seed, same result.
    """
    _positive(tau=tau, C=C, M=M, horizon=horizon)
    _non_negative("R", R)
    if not (isinstance(n_runs, int | np.integer) and n_runs >= 2):
        raise ValueError(f"n_runs must be an int >= 2 (the band needs a spread); got {n_runs!r}")
    rng = np.random.default_rng(seed)
    segments = math.ceil(horizon / tau)
    length = tau + C
    p_survive = math.exp(-length / M)
    if p_survive < 1e-12:
        raise ValueError(
            f"a segment of tau + C = {length:g} s survives a failure rate of 1/{M:g} s with probability "
            f"{p_survive:.1e}: the run would never finish; checkpoint more often than every {M:g} s"
        )
    failures = rng.negative_binomial(segments, p_survive, size=n_runs)
    u = rng.random(int(failures.sum()))
    lost = -M * np.log1p(u * math.expm1(-length / M))  # exponential truncated to [0, L), by inversion
    run_of = np.repeat(np.arange(n_runs), failures)
    lost_per_run = np.bincount(run_of, weights=lost, minlength=n_runs)
    work = segments * tau
    wall = segments * length + lost_per_run + failures * R
    per_run = (wall - work) / work
    mean = float(per_run.mean())
    stderr = float(per_run.std(ddof=1) / math.sqrt(n_runs))
    return LostWork(
        tau=float(tau),
        waste=mean,
        stderr=stderr,
        low=mean - Z95 * stderr,
        high=mean + Z95 * stderr,
        failures_per_run=float(failures.mean()),
        per_run=per_run,
    )


@dataclass(frozen=True)
class WasteSweep:
    """Waste against the checkpoint interval, simulated and modelled, for one ``(C, M, R)``.

    Attributes:
        C, M, R: seconds, as in eq. 10.1.
        taus: [K] intervals, seconds of work.
        simulated, stderr: [K] the simulated mean waste and its standard error.
        first_order: [K] eq. 10.1.
        exact: [K] :func:`exact_waste_fraction`, the simulated model's mean.
        young, daly: the optimal intervals of eq. 10.2 and eq. 10.3.
    """

    C: float
    M: float
    R: float
    taus: NDArray[np.float64]
    simulated: NDArray[np.float64]
    stderr: NDArray[np.float64]
    first_order: NDArray[np.float64]
    exact: NDArray[np.float64]
    young: float
    daly: float


def sweep(
    C: float,
    M: float,
    R: float = 0.0,
    taus: ArrayLike | None = None,
    horizon: float | None = None,
    n_runs: int = 100,
    seed: int = 0,
) -> WasteSweep:
    """Simulate the waste at each interval of ``taus`` (default: 30 intervals spaced
    geometrically from a tenth of Young's to ten times it) beside eq. 10.1 and the optima.

    ``horizon`` defaults to ``30 M`` of work per run (about 30 failures a run, a few
    thousand over the runs); interval ``k`` uses seed ``seed + k``.
    """
    young = young_interval(C, M)
    grid = young * np.geomspace(0.1, 10.0, 30) if taus is None else _taus(taus).ravel()
    work = 30 * M if horizon is None else horizon
    results = [simulate_lost_work(float(t), C, M, R, work, n_runs, seed + k) for k, t in enumerate(grid)]
    return WasteSweep(
        C=float(C),
        M=float(M),
        R=float(R),
        taus=np.asarray(grid, dtype=np.float64),
        simulated=np.array([r.waste for r in results]),
        stderr=np.array([r.stderr for r in results]),
        first_order=np.asarray(waste_fraction(grid, C, M, R)),
        exact=np.asarray(exact_waste_fraction(grid, C, M, R)),
        young=young,
        daly=daly_interval(C, M),
    )


def plot_sweep(result: WasteSweep, ax: Any = None) -> Any:
    """Waste vs interval (log x): simulated points with 95% bars, eq. 10.1, the exact mean,
    and Young's and Daly's optima as vertical lines. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    ax.errorbar(result.taus, result.simulated, yerr=Z95 * result.stderr, fmt="o", ms=3, label="simulated (95% band)")
    ax.plot(result.taus, result.first_order, label="first order, eq. 10.1")
    ax.plot(result.taus, result.exact, "--", label="exact mean of the model")
    ax.axvline(result.young, color="C3", lw=1, label=f"Young, eq. 10.2: {result.young:.3g} s")
    ax.axvline(result.daly, color="C4", lw=1, ls=":", label=f"Daly, eq. 10.3: {result.daly:.3g} s")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval tau (s of work)")
    ax.set_ylabel("waste fraction (extra s per s of work)")
    ax.set_title(f"Waste vs checkpoint interval (C = {result.C:g} s, MTBF = {result.M:g} s, R = {result.R:g} s)")
    ax.legend(fontsize=8)
    return ax
