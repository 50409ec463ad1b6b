"""Actor faults while training: the lag bound, a fault injector, and faults vs none (lesson 10).

At scale some actor is always dying. The actor-learner system of lesson 03 survives it:
the supervisor (:mod:`.system`, :mod:`.heartbeats`) sees a dead or frozen actor,
reclaims its slots and restarts it with the learner's current weights; the learner
only waits a little longer for its next batch. The work a kill loses is the unroll the
actor had in flight (``SystemReport.lost_unrolls``), on average half an unroll: the
``tau / (2 M)`` term of (10.1) with ``tau`` one unroll, since every handed-in unroll is a
committed "checkpoint" that costs nothing extra (``C = 0``); the restart cost ``R`` is the
replacement's start-up. What that costs in throughput and learning is measured here:

* :func:`lag_bound`: the policy lag the slot design allows an unroll queued at the
  learner, which faults must not break;
* :class:`FaultInjector`: ``SIGKILL`` a random actor every ``kill_every_s`` seconds;
* :func:`compare_faults`: the same system with and without injected faults, runs
  interleaved, reporting throughput, restarts, lost unrolls, lag and learning.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from course_lib.actor_learner.heartbeats import SupervisorConfig
from course_lib.actor_learner.system import ActorLearnerSystem, SystemConfig, SystemReport

ARMS = ("none", "faults")


def lag_bound(config: SystemConfig) -> int:
    """The most updates an IMPALA-layout unroll can wait at the learner after it is complete:
    ``(n_slots - 1) // batch_size`` with ``n_slots = n_actors * slots_per_actor``.

    An unroll's policy lag (:func:`~course_lib.actor_learner.learner.rollout_lag`) has two
    parts: updates while it is written (*acting*) and updates while it waits in the
    learner's queue (*queued*, :attr:`SystemReport.queue_lags`).

    Queued, the slot design bounds it exactly. The learner consumes full slots first in,
    first out, ``batch_size`` per update. When slot ``s`` arrives, the slots ahead of it are
    full slots that have not been consumed yet; each slot is in the queue at most once, so
    there are at most ``n_slots - 1`` of them, and they fill at most
    ``(n_slots - 1) // batch_size`` updates before the one that uses ``s``::

        queued lag <= (n_slots - 1) // batch_size       (1 for 2 actors x 2 slots, batches of 2)

    No fault changes it: a dead or frozen actor's half-written slot never enters the queue
    (its replacement rewrites it from scratch, with the weights current then), and its full
    slots stay queued where they were.

    Acting, the slots bound nothing: while one actor writes an unroll, another can fill
    and hand in its own ``slots_per_actor`` slots again and again (an actor descheduled on
    a busy machine, or just restarted, is slower than the rest). With equally fast actors it
    adds at most ``1 + (n_slots - 1) // batch_size`` (the update in flight when the slot is
    handed out, plus the slots handed out before it); a frozen actor's unroll is bounded in
    seconds instead, by ``SupervisorConfig.heartbeat_timeout_s``, after which it is
    discarded. The measured total (``lags``) is therefore reported, not asserted.
    """
    return (config.n_slots - 1) // config.batch_size


class FaultInjector:
    """``SIGKILL`` a random actor of ``system`` every ``kill_every_s`` seconds, or every
    ``kill_every_updates`` learner updates (seeded; give exactly one).

    Call it from the learner loop (it is a ``progress`` callback of
    :meth:`ActorLearnerSystem.train`: ``injector(n_updates, metrics)``). On a clock, the
    first call starts it and every call after the next deadline kills one actor; on an
    update schedule, the call after update ``k * kill_every_updates`` kills one, so the
    number of kills in a run of ``n`` updates is the same on a fast and a slow machine.
    Each kill logs ``"fault injector: SIGKILL actor 1 (pid N) after update U"`` in
    ``system.events``.
    """

    def __init__(
        self,
        system: ActorLearnerSystem,
        kill_every_s: float | None = None,
        seed: int = 0,
        kill_every_updates: int | None = None,
    ) -> None:
        if (kill_every_s is None) == (kill_every_updates is None):
            raise ValueError("give exactly one of kill_every_s (a clock) and kill_every_updates (a schedule)")
        if kill_every_s is not None and kill_every_s <= 0:
            raise ValueError(f"kill_every_s must be > 0, got {kill_every_s}")
        if kill_every_updates is not None and kill_every_updates < 1:
            raise ValueError(f"kill_every_updates must be >= 1, got {kill_every_updates}")
        self.system = system
        self.kill_every_s = kill_every_s
        self.kill_every_updates = kill_every_updates
        self.rng = np.random.default_rng(seed)
        self.next_kill: float | None = None
        self.killed: list[int] = []  # pids, in order

    def __call__(self, n_updates: int = 0, metrics: dict[str, float] | None = None) -> None:
        if self.kill_every_updates is not None:
            if n_updates > 0 and n_updates % self.kill_every_updates == 0:
                self._kill(n_updates)
            return
        assert self.kill_every_s is not None
        now = time.monotonic()
        if self.next_kill is None:
            self.next_kill = now + self.kill_every_s
        elif now >= self.next_kill:
            self._kill(n_updates)
            self.next_kill = now + self.kill_every_s

    def _kill(self, n_updates: int) -> None:
        i = int(self.rng.integers(self.system.config.n_actors))
        pid = self.system.kill_actor(i)
        self.killed.append(pid)
        self.system.events.append(f"fault injector: SIGKILL actor {i} (pid {pid}) after update {n_updates}")


@dataclass
class FaultRun:
    """One run of :func:`compare_faults`.

    Attributes:
        arm: ``"none"`` or ``"faults"``.
        seed: the system's seed (the same for both arms of a repeat).
        report: the learner's :class:`SystemReport` (``restarts``, ``lost_unrolls``, lags, returns).
        kills: actors the injector killed.
        lag_bound: :func:`lag_bound` of the config (bounds :attr:`queue_lag_max`).
        recoveries_s: per restart, seconds until the learner used the replacement's first
            unroll (:attr:`Restart.recovery_s`; restarts the run ended before are left out).
    """

    arm: str
    seed: int
    report: SystemReport
    kills: int
    lag_bound: int
    recoveries_s: list[float]

    @property
    def recovery_s(self) -> float:
        """Mean seconds an actor was missing after a kill (``nan`` without restarts)."""
        return float(np.mean(self.recoveries_s)) if self.recoveries_s else float("nan")

    @property
    def frames_per_second(self) -> float:
        return self.report.frames_per_second

    @property
    def updates_per_second(self) -> float:
        r = self.report
        return (r.updates - 1) / r.seconds if r.seconds > 0 else float("nan")

    @property
    def lag_max(self) -> int:
        """The largest policy lag of any consumed unroll (acting + queued)."""
        return int(self.report.lags.max()) if len(self.report.lags) else 0

    @property
    def queue_lag_max(self) -> int:
        """The largest queued part of a lag (at most :attr:`lag_bound`)."""
        return int(self.report.queue_lags.max()) if len(self.report.queue_lags) else 0

    def _returns_between(self, start: float, stop: float) -> float:
        """Mean return of the episodes that finished in ``[start, stop)`` of the run (fractions of its updates)."""
        r = self.report
        picked = [g for g, u in zip(r.returns, r.return_updates) if start * r.updates <= u < stop * r.updates]
        return float(np.mean(picked)) if picked else float("nan")

    @property
    def first_return(self) -> float:
        """Mean return of the episodes that finished in the first quarter of the updates."""
        return self._returns_between(0.0, 0.25)

    @property
    def final_return(self) -> float:
        """Mean return of the episodes that finished in the last quarter of the updates."""
        return self._returns_between(0.75, 1.0 + 1e-9)

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.report.returns)) if self.report.returns else float("nan")


@dataclass
class FaultComparison:
    """``runs[arm]``: the :class:`FaultRun` of each repeat, in the order they ran."""

    runs: dict[str, list[FaultRun]]
    kill_every_s: float

    def summary(self) -> dict[str, dict[str, tuple[float, float]]]:
        """``{arm: {metric: (mean, standard deviation over repeats)}}`` for frames/s,
        updates/s, restarts, lost unrolls, recovery s (``nan`` for no faults), lag max, queued lag max, first and final return."""
        metrics: dict[str, Callable[[FaultRun], float]] = {
            "frames/s": lambda r: r.frames_per_second,
            "updates/s": lambda r: r.updates_per_second,
            "restarts": lambda r: r.report.restarts,
            "lost unrolls": lambda r: r.report.lost_unrolls,
            "recovery s": lambda r: r.recovery_s,
            "lag max": lambda r: r.lag_max,
            "queued lag max": lambda r: r.queue_lag_max,
            "first return": lambda r: r.first_return,
            "final return": lambda r: r.final_return,
        }
        return {
            arm: {name: _mean_sd([f(r) for r in runs]) for name, f in metrics.items()}
            for arm, runs in self.runs.items()
        }

    def throughput_ratio(self) -> float:
        """Median over repeats of (frames/s with faults) / (frames/s of the no-fault run before it)."""
        pairs = zip(self.runs["none"], self.runs["faults"])
        return statistics.median(f.frames_per_second / n.frames_per_second for n, f in pairs)


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0


def fault_run(
    config: SystemConfig,
    seconds: float | None,
    n_updates: int | None,
    kill_every_s: float | None,
    supervisor: SupervisorConfig | None = None,
    kill_every_updates: int | None = None,
) -> FaultRun:
    """Start a system, train it (killing an actor every ``kill_every_s`` seconds or every
    ``kill_every_updates`` updates; no faults if both are ``None``), stop it; restarts are
    unlimited (``max_restarts = 10**6``)."""
    config = replace(config, max_restarts=10**6)
    with ActorLearnerSystem(config, supervisor) as system:
        faulty = kill_every_s is not None or kill_every_updates is not None
        injector = FaultInjector(system, kill_every_s, config.seed, kill_every_updates) if faulty else None
        report = system.train(n_updates=n_updates, seconds=seconds, progress=injector)
    arm = "none" if injector is None else "faults"
    kills = len(injector.killed) if injector else 0
    recoveries = [r.recovery_s for r in system.restart_log if r.recovery_s is not None]
    return FaultRun(arm, config.seed, report, kills, lag_bound(config), recoveries)


def compare_faults(
    config: SystemConfig,
    seconds: float | None = 5.0,
    n_updates: int | None = None,
    kill_every_s: float | None = 1.0,
    repeats: int = 3,
    supervisor: SupervisorConfig | None = None,
    progress: Callable[[FaultRun], None] | None = None,
    kill_every_updates: int | None = None,
) -> FaultComparison:
    """Train the same system with no faults and with an actor killed every
    ``kill_every_s`` seconds (or, with ``kill_every_s=None``, every ``kill_every_updates``
    updates), interleaved: ``none, faults, none, faults, ...``.

    Repeat ``r`` runs both arms with seed ``config.seed + r`` (paired: same model init,
    same env seeds), so the spread over repeats is over seeds and machine load. Each run
    is a fresh system, trained for ``seconds`` (after the first batch) or ``n_updates``,
    whichever comes first. ``n_updates`` with ``kill_every_updates`` (and ``seconds=None``)
    makes every run the same amount of learning with the same number of kills, whatever
    the machine's speed; the throughput (frames/s) is still measured on the clock.

    Returns:
        :class:`FaultComparison` (``runs["none"]``, ``runs["faults"]``, ``summary()``).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if kill_every_s is not None and kill_every_updates is not None:
        raise ValueError("give kill_every_s or kill_every_updates, not both (kill_every_s=None for a schedule)")
    if kill_every_s is None and kill_every_updates is None:
        raise ValueError("give kill_every_s (a clock) or kill_every_updates (a schedule): the faults arm needs one")
    runs: dict[str, list[FaultRun]] = {arm: [] for arm in ARMS}
    for r in range(repeats):
        seeded = replace(config, seed=config.seed + r)
        for arm in ARMS:
            faults = arm == "faults"
            run = fault_run(
                seeded,
                seconds,
                n_updates,
                kill_every_s if faults else None,
                supervisor,
                kill_every_updates if faults else None,
            )
            runs[arm].append(run)
            if progress is not None:
                progress(run)
    return FaultComparison(runs, kill_every_s if kill_every_s is not None else float("nan"))
