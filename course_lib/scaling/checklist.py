r"""The scaling checklist, executable (lesson 05): five things to measure before trusting a run on N devices.

Going from one device to ``N`` is only a speed-up if the answer is the same, the
communication is cheap, the memory fits and the run can be repeated. Each row of
:func:`scaling_checklist` measures one of these on data-parallel PPO
(:mod:`course_lib.scaling.ppo_dp`) and gives a verdict, ``ok`` or ``warn``, with the reason:

(a) **Learning rate for the global batch.** A batch ``k = B / B_0`` times the one the
    rate was tuned at takes ``k`` times fewer steps for the same samples; the rules of
    :mod:`course_lib.scaling.lr_rules` suggest ``lr_0 * k`` (linear) or ``lr_0 * sqrt(k)``
    (square root). ``B`` is the global minibatch (``config.minibatch_size``: one gradient
    step's samples over all devices). In :mod:`course_lib.scaling.ppo_dp` ``num_envs`` is the
    *global* count, so changing the device count does not change ``B``; the row matters
    when ``B`` grew because you added devices at a fixed number of envs per device
    (pass ``base_batch``, the minibatch the rate was tuned at). ``ok`` when
    ``config.lr`` lies between the two suggestions (or ``k = 1``).
(b) **One device and N devices give the same parameters** (the same seed, the same global
    batch): ``max |theta_1 - theta_N|`` after a whole run, ``ok`` at most ``tolerance``
    (float summation order moves it ~1e-7). This is the check that catches the check_vma
    trap (``sync="trap"``: ``N`` times the gradient).
(c) **Communication: the whole cost of keeping the devices in step.** A data-parallel run
    pays for its all-reduces three times: the bytes moved, the rendezvous (every device
    must arrive before any leaves) and the waiting of the faster device for the slower.
    The row measures all three at once against the *ceiling*, the same work without any
    synchronisation (:func:`dp_scaling`: ``N`` pieces of ``1/N`` of the envs, the
    1-device program on each device at once), from interleaved runs::

        sync_share = 1 - speedup / ceiling = 1 - t_pieces / t_N    (the share of the ideal lost to synchronising)

    and, beside it, the pure transfer share (what the row measured before): ``S``
    dependent ``pmean``\ s of a gradient-sized float32 vector (``P`` parameters, ``S`` the
    run's gradient steps) as one compiled ``lax.scan`` on the same mesh, timed in the same
    interleaved rounds, over the ``N``-device run's time::

        transfer_share = t_allreduces / t_N

    The difference between the two is rendezvous and waiting, not bytes. ``ok`` when
    ``sync_share`` is below ``sync_warn`` (default 20 %: at least 80 % of the speed-up the
    hardware gives, the usual bar for efficient data-parallel scaling -- Horovod reports
    ~90 % on 128 GPUs, Sergeev & Del Balso 2018 -- and on this 2-core machine quiet runs of
    the lesson's config lose 5-12 % while a run sharing a core with another job loses 25 %
    or more). :func:`communication_row` gives the verdict from the numbers, and its
    :class:`CommunicationRow` carries them as attributes.
(d) **Memory per device**, from XLA's ``compiled.memory_analysis()`` of the run on 1 and
    on N devices: argument, output and temporary bytes (per device: each device runs the
    partitioned program). Data parallelism replicates parameters and optimiser state (they
    do not shrink; ZeRO/FSDP would shard them) and splits activations (temporaries shrink
    about ``1/N``). ``ok`` if the N-device total is not above the 1-device total.
(e) **Reproducibility**: two N-device runs with the same seed are bitwise equal (``ok``)
    -- the randomness is per environment and nothing depends on thread timing.

Every multi-device program runs under :func:`course_lib.runtime.watchdog.watchdog` and
blocks on its result; the compiled PPO programs are :func:`course_lib.scaling.ppo_dp.compiled_dp_train`'s
(cached per config and mesh, and checked for LAPACK calls).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.devices import check_multidevice_safe, data_mesh
from course_lib.scaling.ppo_dp import (
    PPOConfig,
    Sync,
    compiled_dp_train,
    env_keys,
    init_flat_params,
    run_dp,
    shard_inputs,
)

Verdict = Literal["ok", "warn"]

#: The name of the gradient all-reduces' timing in the checklist's :class:`Scaling` (``measured["timings"]``).
ALLREDUCES_RUN = "gradient all-reduces alone"

#: The rows' names, in order.
CHECKS: tuple[str, ...] = ("lr scaling", "1 vs N devices", "communication", "memory per device", "reproducible")


@dataclass(frozen=True)
class CheckRow:
    """One measured check: its ``name``, the measured ``value`` (as text), ``verdict`` and why."""

    name: str
    value: str
    verdict: Verdict
    explanation: str


@dataclass(frozen=True)
class CommunicationRow(CheckRow):
    """Row (c) with its numbers: ``speedup`` (t_1 / t_N) and ``ceiling`` (t_1 / t_pieces) of the
    ``n_devices``-device run, ``sync_share`` (``1 - speedup / ceiling``: the share of the ideal
    lost to transfers, rendezvous and waiting), ``transfer_share`` (the gradient all-reduces
    alone, over the N-device run's time) and ``threshold`` (``sync_share`` at or above it warns)."""

    speedup: float
    ceiling: float
    sync_share: float
    transfer_share: float
    threshold: float
    n_devices: int


@dataclass
class ScalingReport:
    """The checklist's rows, the numbers behind them (``measured``) and notes (what was skipped)."""

    n_devices: int
    rows: list[CheckRow]
    measured: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self, name: str) -> CheckRow:
        """The row called ``name`` (one of :data:`CHECKS`)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r} in this report; it has {[r.name for r in self.rows]}")

    @property
    def ok(self) -> bool:
        """Whether every row's verdict is ``ok``."""
        return all(r.verdict == "ok" for r in self.rows)

    def table(self) -> str:
        """A markdown table: check | value | verdict | why, then the notes."""
        cell: Callable[[str], str] = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["| check | value | verdict | why |", "|---|---|---|---|"]
        lines += [f"| {cell(r.name)} | {cell(r.value)} | {r.verdict} | {cell(r.explanation)} |" for r in self.rows]
        lines += [f"\n{n}" for n in self.notes]
        return "\n".join(lines)


def _lr_row(config: PPOConfig, base_batch: int, base_lr: float) -> CheckRow | None:
    try:
        from course_lib.scaling.lr_rules import scaled_lr
    except ImportError:
        return None
    batch = config.minibatch_size
    linear = scaled_lr(base_lr, base_batch, batch, "linear")
    sqrt = scaled_lr(base_lr, base_batch, batch, "sqrt")
    lo, hi = min(linear, sqrt), max(linear, sqrt)
    within = lo * (1 - 1e-6) <= config.lr <= hi * (1 + 1e-6)
    k = batch / base_batch
    value = f"B = {batch} vs B0 = {base_batch} (k = {k:g}): linear {linear:.3g}, sqrt {sqrt:.3g}; config.lr = {config.lr:.3g}"
    if k == 1:
        why = "the global minibatch is the one the rate was tuned at: no scaling needed"
    elif within:
        why = "config.lr lies between the sqrt (Adam's usual) and linear (SGD, with warm-up) suggestions"
    else:
        why = (
            f"B changed ({k:g}x the batch the rate was tuned at): retune the rate; the rules' range "
            f"[{lo:.3g}, {hi:.3g}] comes from SGD, no prescription for Adam (PPO's optimiser)"
        )
    return CheckRow(CHECKS[0], value, "ok" if k == 1 or within else "warn", why)


@functools.cache
def _allreduce_chain(mesh: Mesh, n_elements: int, steps: int) -> Any:
    """A compiled program of ``steps`` dependent ``pmean``\\ s of a ``[n_elements]`` float32 vector per device."""
    axis = str(mesh.axis_names[0])

    def body(x: jax.Array) -> jax.Array:
        out, _ = jax.lax.scan(lambda c, _: (jax.lax.pmean(c, axis), None), x, None, length=steps)
        return out

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False))
    spec = jax.ShapeDtypeStruct((mesh.size * n_elements,), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    return check_multidevice_safe(program, spec)


def allreduce_chain_seconds(mesh: Mesh, n_elements: int, steps: int, repeats: int = 3) -> float:
    """Median wall time of ``steps`` dependent all-reduces (``pmean``) of ``n_elements`` float32 per
    device, in one compiled program on ``mesh`` (1-D), every call blocked. Run it under a watchdog."""
    if len(mesh.axis_names) != 1:
        raise ValueError(f"need a 1-D mesh (course_lib.scaling.devices.data_mesh), got axes {mesh.axis_names}")
    if n_elements < 1 or steps < 1 or repeats < 1:
        raise ValueError(f"n_elements, steps and repeats must be >= 1, got {n_elements}, {steps}, {repeats}")
    program = _allreduce_chain(mesh, n_elements, steps)
    x = jax.device_put(jnp.ones(mesh.size * n_elements, jnp.float32), NamedSharding(mesh, P(mesh.axis_names[0])))
    jax.block_until_ready(program(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(program(x))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def device_run(n: int) -> str:
    """The name of :func:`dp_scaling`'s data-parallel run on ``n`` devices (``"1 device"``, ``"2 devices"``, ...)."""
    return "1 device" if n == 1 else f"{n} devices"


def ceiling_run(n: int) -> str:
    """The name of :func:`dp_scaling`'s no-communication run for ``n`` devices (``n`` pieces of ``1/n`` of the envs)."""
    return "2 halves, no communication" if n == 2 else f"{n} pieces, no communication"


@dataclass
class Scaling:
    """Wall times (seconds, every run blocked) of :func:`dp_scaling`'s runs of one config, and
    what follows from them for each device count ``N`` in ``device_counts``."""

    config: PPOConfig
    device_counts: tuple[int, ...]
    times: dict[str, list[float]]
    cpu_per_wall: dict[str, list[float]]
    max_abs_diff: dict[int, float]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]

    def median(self, run: str) -> float:
        return statistics.median(self.times[run])

    def steps_per_s(self, run: str) -> float:
        """Env steps per second of the whole run (rollout and learning), from the median time."""
        return self.config.steps_per_run / self.median(run)

    def speedup(self, n: int) -> float:
        """1-device time / ``n``-device time (medians)."""
        return self.median(device_run(1)) / self.median(device_run(n))

    def ceiling(self, n: int) -> float:
        """1-device time / the ``n`` pieces' time: the most ``n`` devices give without communication (1 for ``n = 1``)."""
        return 1.0 if n == 1 else self.median(device_run(1)) / self.median(ceiling_run(n))

    def fraction(self, n: int) -> float:
        """``speedup(n) / ceiling(n)`` = t_pieces / t_n: how much of the no-communication ceiling the run reaches."""
        return self.speedup(n) / self.ceiling(n)

    def sync_share(self, n: int) -> float:
        """``1 - fraction(n)``: the share of the ideal lost to synchronisation (transfers, rendezvous, waiting)."""
        return 1.0 - self.fraction(n)


#: The three runs of :func:`dp_speedup` (:func:`dp_scaling`'s names for N = 1 and 2).
SPEEDUP_RUNS: tuple[str, ...] = (device_run(1), device_run(2), ceiling_run(2))


@dataclass
class Speedup:
    """Wall times (seconds, every run blocked) of :func:`dp_speedup`'s three runs of one config."""

    config: PPOConfig
    times: dict[str, list[float]]
    cpu_per_wall: dict[str, list[float]]
    max_abs_diff: float

    def median(self, run: str) -> float:
        return statistics.median(self.times[run])

    def steps_per_s(self, run: str) -> float:
        """Env steps per second of the whole run (rollout and learning), from the median time."""
        return self.config.steps_per_run / self.median(run)

    @property
    def speedup(self) -> float:
        """1-device time / 2-device time (medians)."""
        return self.median(SPEEDUP_RUNS[0]) / self.median(SPEEDUP_RUNS[1])

    @property
    def ceiling(self) -> float:
        """1-device time / the two halves' time: the most 2 devices give without communication."""
        return self.median(SPEEDUP_RUNS[0]) / self.median(SPEEDUP_RUNS[2])

    @property
    def fraction(self) -> float:
        """``speedup / ceiling``: the share of the no-communication ceiling the 2-device run reaches."""
        return self.speedup / self.ceiling


def _devices(devices: Sequence[Any] | None) -> list[Any]:
    return list(devices) if devices is not None else jax.devices()


def n_pieces(
    config: PPOConfig, n: int, flat0: jax.Array, keys0: jax.Array, key: jax.Array, devices: Sequence[Any] | None = None
) -> Callable[[], list[Any]]:
    """The ceiling run for ``n`` devices, compiled: a call that dispatches the 1-device program
    on piece ``i`` (``1/n`` of the environments) to device ``i``, for every ``i``, then returns
    the results without waiting (JAX dispatch is asynchronous, so the pieces run at the same
    time; block on the returned list). ``n`` single-device programs that share the CPU's
    cores and nothing else: no collective, no rendezvous -- the ``n``-device run's work
    without its synchronisation. ``devices``: where (default ``jax.devices()``).
    """
    devs = _devices(devices)
    if len(devs) < n:
        raise ValueError(f"{n} pieces need {n} devices, there are {len(devs)}: call use_cpu_devices({n}) first")
    if n < 1 or config.num_envs % n:
        raise ValueError(f"num_envs = {config.num_envs} must split evenly over {n} devices")
    piece = replace(config, num_envs=config.num_envs // n, total_timesteps=config.total_timesteps // n)
    calls = []
    for i, device in enumerate(devs[:n]):
        mesh = data_mesh(1, devices=[device])
        share = keys0[i * piece.num_envs : (i + 1) * piece.num_envs]
        args = (*shard_inputs(mesh, flat0, share), jax.device_put(key, NamedSharding(mesh, P())))
        calls.append(functools.partial(compiled_dp_train(piece, mesh), *args))
    return lambda: [c() for c in calls]  # all dispatched before any is waited for


def two_halves(
    config: PPOConfig, flat0: jax.Array, keys0: jax.Array, key: jax.Array, devices: Sequence[Any] | None = None
) -> Callable[[], list[Any]]:
    """:func:`n_pieces` for 2 devices: the ceiling run of :func:`dp_speedup`."""
    devs = _devices(devices)
    if len(devs) < 2:
        raise ValueError(f"two_halves needs 2 devices, there are {len(devs)}: call use_cpu_devices(2) first")
    if config.num_envs % 2:
        raise ValueError(f"num_envs = {config.num_envs} must be even to split over 2 devices")
    return n_pieces(config, 2, flat0, keys0, key, devs)


def dp_scaling(
    config: PPOConfig,
    device_counts: tuple[int, ...] = (1, 2, 4),
    repeats: int = 5,
    seed: int = 0,
    *,
    sync: Sync = "pmean",
    extra_runs: dict[str, Callable[[], Any]] | None = None,
    devices: Sequence[Any] | None = None,
) -> Scaling:
    """Data-parallel PPO's throughput against the device count, each count with its ceiling.

    For every ``N`` in ``device_counts`` (1 must be among them: it is the reference):

    - :func:`device_run` ``(N)``: the run data-parallel on an ``N``-device mesh (the same
      training whatever ``N``: ``max_abs_diff[N]`` is ``max |theta_1 - theta_N|``);
    - :func:`ceiling_run` ``(N)`` (``N > 1``): the 1-device program on ``1/N`` of the
      environments, dispatched on each of the ``N`` devices before any is waited for
      (:func:`n_pieces`): the ``N``-device run's work without its all-reduces -- not a
      correct training run, but the most the hardware can give it, so ``ceiling(N) = t_1 /
      t_pieces``, and ``1 - speedup(N) / ceiling(N)`` is what synchronising costs.

    Compilation and a warm-up call of each are excluded; then every run (and every call
    of ``extra_runs``, timed the same way, under its own name) is timed in turn,
    ``repeats`` rounds, so drift on a shared machine hits all alike. The 1-minute load
    average is recorded before and after. Needs ``max(device_counts)`` devices (of ``devices``,
    default ``jax.devices()``); run it under a watchdog.
    """
    devs = _devices(devices)
    counts = tuple(sorted(set(device_counts)))
    if not counts or counts[0] != 1 or any(isinstance(n, bool) or not isinstance(n, int) for n in counts):
        raise ValueError(f"device_counts must be ints and include 1 (the reference), got {device_counts!r}")
    if counts[-1] > len(devs):
        raise ValueError(
            f"device_counts {device_counts} need {counts[-1]} devices, there are {len(devs)}: "
            f"call use_cpu_devices({counts[-1]}) before JAX starts"
        )
    uneven = [n for n in counts if config.num_envs % n]
    if uneven:
        raise ValueError(f"num_envs = {config.num_envs} does not split evenly over {uneven} devices: use a multiple")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    own = {device_run(n) for n in counts} | {ceiling_run(n) for n in counts if n > 1}
    clash = sorted(own & set(extra_runs or {}))
    if clash:
        raise ValueError(f"extra runs {clash} have the names of dp_scaling's own runs: rename them")
    load_before = os.getloadavg()
    key = jax.random.key(seed)
    k_init, k_envs = jax.random.split(key)
    flat0, keys0 = init_flat_params(k_init, config), env_keys(k_envs, config.num_envs)
    calls: dict[str, Callable[[], Any]] = {}
    finals: dict[int, np.ndarray] = {}
    for n in counts:
        mesh = data_mesh(n, devices=devs)
        args = (*shard_inputs(mesh, flat0, keys0), jax.device_put(key, NamedSharding(mesh, P())))
        calls[device_run(n)] = functools.partial(compiled_dp_train(config, mesh, "data", sync), *args)
        finals[n] = np.asarray(jax.block_until_ready(calls[device_run(n)]())[0])  # warm-up
        if n > 1:
            calls[ceiling_run(n)] = n_pieces(config, n, flat0, keys0, key, devs)
            jax.block_until_ready(calls[ceiling_run(n)]())
    for name, call in (extra_runs or {}).items():
        calls[name] = call
        jax.block_until_ready(call())
    times: dict[str, list[float]] = {r: [] for r in calls}
    cpu: dict[str, list[float]] = {r: [] for r in calls}
    for _ in range(repeats):
        for run, call in calls.items():
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(call())
            times[run].append(time.perf_counter() - t0)
            cpu[run].append((time.process_time() - c0) / times[run][-1])
    diffs = {n: float(np.max(np.abs(finals[n] - finals[1]))) for n in counts}
    return Scaling(config, counts, times, cpu, diffs, load_before, os.getloadavg())


def dp_speedup(config: PPOConfig, repeats: int = 5, seed: int = 0, devices: Sequence[Any] | None = None) -> Speedup:
    """Data-parallel PPO on 1 vs 2 devices, and the ceiling: :func:`dp_scaling` for ``(1, 2)``.

    - ``"1 device"``: the whole global batch on device 0 (XLA may still spread one
      device's large operations over several cores);
    - ``"2 devices"``: the same run data-parallel on a 2-device mesh (same answer up to
      summation order: ``max_abs_diff``);
    - ``"2 halves, no communication"``: the 1-device program on *half* the environments,
      dispatched on device 0 and on device 1 before either is waited for (JAX dispatch is
      asynchronous), so the two run at the same time. That is the 2-device run's work
      without its all-reduces -- not a correct training run, but the most the hardware can
      give it: ``ceiling = t_1 / t_halves``. The gap between ``speedup`` and ``ceiling`` is
      what synchronising the devices costs.

    Compilation and a warm-up call of each are excluded; then the three are timed in
    turn, ``repeats`` times. Needs 2 devices; run it under a watchdog.
    """
    devs = _devices(devices)
    if len(devs) < 2:
        raise ValueError(f"dp_speedup needs 2 devices, there are {len(devs)}: call use_cpu_devices(2) first")
    if config.num_envs % 2:
        raise ValueError(f"num_envs = {config.num_envs} must be even to split over 2 devices")
    r = dp_scaling(config, (1, 2), repeats, seed, devices=devs)
    return Speedup(
        config,
        {run: r.times[run] for run in SPEEDUP_RUNS},
        {run: r.cpu_per_wall[run] for run in SPEEDUP_RUNS},
        r.max_abs_diff[2],
    )


def communication_row(
    speedup: float,
    ceiling: float,
    transfer_share: float,
    *,
    n_devices: int,
    run_s: float,
    grad_steps: int,
    n_params: int,
    repeats: int,
    threshold: float = 0.2,
) -> CommunicationRow:
    """Row (c) from its numbers (module docstring): ``sync_share = 1 - speedup / ceiling`` against
    ``threshold`` (``ok`` below it), with the pure all-reduce ``transfer_share`` beside it."""
    if not (speedup > 0 and ceiling > 0 and run_s > 0 and transfer_share >= 0):
        raise ValueError(
            f"speedup, ceiling and run_s must be > 0 and transfer_share >= 0, got {speedup}, {ceiling}, {run_s}, "
            f"{transfer_share}: pass medians of timed runs"
        )
    if not 0 < threshold < 1:
        raise ValueError(f"threshold is a share of the ideal speed-up, in (0, 1); got {threshold}")
    sync_share = 1.0 - speedup / ceiling
    ok = sync_share < threshold
    value = (
        f"{100 * sync_share:.0f}% of the ideal lost to synchronisation ({n_devices} devices {speedup:.2f}x vs "
        f"{ceiling:.2f}x without communication); gradient all-reduces alone ({grad_steps} of {n_params} f32, "
        f"{_kib(4 * n_params)}): {100 * transfer_share:.0f}% of the run's {1e3 * run_s:.1f} ms"
    )
    why = (
        f"1 - speed-up / ceiling, medians of {repeats} interleaved rounds of the {n_devices}-device run, the same "
        f"work in {n_devices} pieces with no communication, and the all-reduces alone; "
        + (
            "the rest of the loss is rendezvous and waiting for the slower device. "
            if sync_share > transfer_share
            else "the loss is within the all-reduces' own time and the timing noise. "
        )
        + (
            f"Below {100 * threshold:.0f}%: the devices' time goes to compute"
            if ok
            else f"At or above {100 * threshold:.0f}%: fewer rendezvous (fuse small collectives), more compute "
            "per rendezvous (a larger per-device batch, fewer minibatches), overlap; or a quieter machine"
        )
    )
    return CommunicationRow(
        CHECKS[2],
        value,
        "ok" if ok else "warn",
        why,
        speedup=speedup,
        ceiling=ceiling,
        sync_share=sync_share,
        transfer_share=transfer_share,
        threshold=threshold,
        n_devices=n_devices,
    )


def _memory(compiled: Any) -> dict[str, int]:
    m = compiled.memory_analysis()
    out = {
        "argument_bytes": int(m.argument_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes),
    }
    out["total_bytes"] = sum(out.values())
    return out


def _kib(b: int) -> str:
    return f"{b / 1024:.0f} KiB"


def scaling_checklist(
    config: PPOConfig,
    n_devices: int = 2,
    seed: int = 0,
    *,
    sync: Sync = "pmean",
    base_batch: int | None = None,
    base_lr: float | None = None,
    tolerance: float = 1e-5,
    repeats: int = 5,
    sync_warn: float = 0.2,
    watchdog_s: float = 300.0,
    devices: Sequence[Any] | None = None,
) -> ScalingReport:
    """Measure the five checks (module docstring) for data-parallel PPO on 1 vs ``n_devices`` devices.

    Args:
        config: the run (``num_envs`` global, divisible by ``n_devices``).
        n_devices: devices of the multi-device side (the first ``n_devices`` of ``devices``).
        seed: the runs' seed.
        sync: :func:`course_lib.scaling.ppo_dp.make_dp_train`'s gradient sync (``"trap"`` shows check (b) failing).
        base_batch, base_lr: the minibatch and rate the rate was tuned at (default: this
            config's global minibatch and ``config.lr``, i.e. nothing to scale).
        tolerance: largest ``max |theta_1 - theta_N|`` called equal.
        repeats: timed rounds of (c): 1 device, ``n_devices`` devices, the same work in pieces without
            communication, the gradient all-reduces alone (interleaved; medians).
        sync_warn: share of the ideal speed-up lost to synchronisation at or above which (c) warns.
        watchdog_s: the limit of the watchdog around all the multi-device work.
        devices: the devices to use (default ``jax.devices()``; on a one-GPU machine lesson 05
            passes CPU host devices, :func:`course_lib.scaling.devices.device_plan`).

    Returns a :class:`ScalingReport` (``.table()`` prints it). Raises ``ValueError`` for a
    device count JAX does not have or a config that does not split over it.
    """
    devs = _devices(devices)
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or not 2 <= n_devices <= len(devs):
        raise ValueError(
            f"n_devices must be an int in 2..{len(devs)} (the devices given), got {n_devices!r}: "
            "ask for more with course_lib.scaling.devices.use_cpu_devices(n) before JAX starts"
        )
    if config.num_envs % n_devices:
        raise ValueError(f"num_envs = {config.num_envs} does not split over {n_devices} devices: use a multiple")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    base_batch = config.minibatch_size if base_batch is None else base_batch
    base_lr = config.lr if base_lr is None else base_lr
    load_before = os.getloadavg()
    mesh_1, mesh_n = data_mesh(1, devices=devs), data_mesh(n_devices, devices=devs)
    rows: list[CheckRow] = []
    notes: list[str] = []
    measured: dict[str, Any] = {}

    lr_row = _lr_row(config, base_batch, base_lr)
    if lr_row is None:
        notes.append("(a) lr scaling skipped: course_lib.scaling.lr_rules is not available in this checkout.")
    else:
        rows.append(lr_row)

    with watchdog(watchdog_s, f"scaling checklist: data-parallel PPO on 1 and {n_devices} {devs[0].platform} devices"):
        # (b) 1 vs N devices, and (e) the same N-device run twice
        params_1, _ = run_dp(config, mesh_1, seed=seed, sync=sync)
        params_n, _ = run_dp(config, mesh_n, seed=seed, sync=sync)
        params_n2, _ = run_dp(config, mesh_n, seed=seed, sync=sync)
        diff = float(np.max(np.abs(params_n - params_1)))
        measured["max_abs_diff"] = diff
        rows.append(
            CheckRow(
                CHECKS[1],
                f"max |theta_1 - theta_{n_devices}| = {diff:.1e} (tolerance {tolerance:g})",
                "ok" if diff <= tolerance else "warn",
                "the same seed and global batch give the same parameters up to summation order"
                if diff <= tolerance
                else "the runs disagree beyond summation order: is the gradient averaged once "
                "(check_vma trap: N x the gradient), is the randomness per env, are the minibatches the same?",
            )
        )

        # (c) communication: the N-device run against its no-communication ceiling, and the
        # gradient all-reduces alone, all timed in the same interleaved rounds
        n_params = int(params_1.size)
        grad_steps = config.num_updates * config.update_epochs * config.num_minibatches
        chain = _allreduce_chain(mesh_n, n_params, grad_steps)
        x = jax.device_put(jnp.ones(n_devices * n_params, jnp.float32), NamedSharding(mesh_n, P("data")))
        timed = dp_scaling(
            config,
            (1, n_devices),
            repeats,
            seed,
            sync=sync,
            extra_runs={ALLREDUCES_RUN: lambda: chain(x)},
            devices=devs,
        )
    t_run, t_comm = timed.median(device_run(n_devices)), timed.median(ALLREDUCES_RUN)
    comm_row = communication_row(
        timed.speedup(n_devices),
        timed.ceiling(n_devices),
        t_comm / t_run,
        n_devices=n_devices,
        run_s=t_run,
        grad_steps=grad_steps,
        n_params=n_params,
        repeats=repeats,
        threshold=sync_warn,
    )
    measured.update(
        run_s=t_run,
        comm_s=t_comm,
        overhead=comm_row.transfer_share,
        sync_share=comm_row.sync_share,
        speedup=comm_row.speedup,
        ceiling=comm_row.ceiling,
        timings=timed,
        grad_steps=grad_steps,
        n_params=n_params,
    )
    rows.append(comm_row)

    # (d) memory per device, from the compiled programs
    mem_1 = _memory(compiled_dp_train(config, mesh_1, "data", sync))
    mem_n = _memory(compiled_dp_train(config, mesh_n, "data", sync))
    measured.update(memory_1=mem_1, memory_n=mem_n)
    rows.append(
        CheckRow(
            CHECKS[3],
            f"1 device: args {_kib(mem_1['argument_bytes'])}, out {_kib(mem_1['output_bytes'])}, temp "
            f"{_kib(mem_1['temp_bytes'])}; {n_devices} devices: args {_kib(mem_n['argument_bytes'])}, out "
            f"{_kib(mem_n['output_bytes'])}, temp {_kib(mem_n['temp_bytes'])} (per device)",
            "ok" if mem_n["total_bytes"] <= mem_1["total_bytes"] else "warn",
            "parameters and optimiser state are replicated (they do not shrink; ZeRO/FSDP shard them); "
            "activations and rollouts are split, so temporaries shrink with the device count",
        )
    )

    # (e) reproducibility
    same = bool(np.array_equal(params_n, params_n2))
    measured["bitwise_equal"] = same
    rows.append(
        CheckRow(
            CHECKS[4],
            "bitwise equal" if same else f"differ by up to {float(np.max(np.abs(params_n - params_n2))):.1e}",
            "ok" if same else "warn",
            "randomness per environment (fold_in), fixed reduction order: a rerun is an exact replay"
            if same
            else "two runs with one seed differ: a nondeterministic reduction or randomness that depends on timing",
        )
    )
    load_after = os.getloadavg()
    measured.update(load_before=load_before, load_after=load_after)
    notes.append(
        f"Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} cores: "
        "timings on a shared machine drift 1.5-2x."
    )
    return ScalingReport(n_devices=n_devices, rows=rows, measured=measured, notes=notes)
