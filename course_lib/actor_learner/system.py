"""Start, run, supervise and stop an actor-learner system of real processes (lesson 03).

::

    with ActorLearnerSystem(SystemConfig(layout="impala", n_actors=2)) as system:
        report = system.train(n_updates=100)
    # every child process has exited here, whatever happened inside the block

Layouts:

* ``"impala"``: ``n_actors`` actor processes (:mod:`.actor`), each with its own policy
  copy, fill shared-memory slots (:mod:`.buffers`) with whole unrolls;
* ``"seed"``: ``n_actors`` env-only actors and one central inference process
  (:mod:`.seed`) that batches their observations and assembles the unrolls.

The learner runs in this (the calling) process: it waits for full slots, learns from a
batch with V-trace (:mod:`.learner`), publishes the new weights with a version number,
and hands the slots back. The learner never blocks for long: every wait gives up after
``poll_s`` to check that the children are alive.

**Channels.** TorchBeast's MonoBeast passes slot indices through two shared queues (free
and full). Here every actor (or the inference server) has its own pipe to the learner
for the same two messages: a process killed while it holds a shared queue's internal
lock would wedge every other process using that queue; a killed process only breaks
its own pipe.

**Faults.** A child that dies (crash, ``kill -9``) is detected within ``poll_s``; an
actor that is alive but silent (``SIGSTOP``, a deadlock) is detected by its heartbeat
(:mod:`.heartbeats`, ``SupervisorConfig.heartbeat_timeout_s``) and killed. Either is
reported in :attr:`ActorLearnerSystem.events`, its slots are reclaimed and it is
restarted, acting with the learner's current weights, up to ``max_restarts`` times;
after that, or if the inference server dies, the system shuts down cleanly and raises
:class:`SystemFault`. If no data arrives for ``stall_timeout_s`` (heartbeats off, or a
frozen inference server, which has no heartbeat) it shuts down too. :meth:`stop` (also
run by the context manager, at interpreter exit, and on any exception) sets the stop
event, joins with a timeout, then terminates and kills what is left. Injected faults
while training and their cost: :mod:`.faults`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch

from course_lib.actor_learner.actor import ACTOR_PHASES, actor_main
from course_lib.actor_learner.buffers import RolloutBuffers
from course_lib.actor_learner.envs import make_envs
from course_lib.actor_learner.heartbeats import Heartbeats, SupervisorConfig
from course_lib.actor_learner.learner import Learner, LossConfig, rollout_lag
from course_lib.actor_learner.model import ActorCritic
from course_lib.actor_learner.seed import (
    SEED_ACTOR_PHASES,
    SERVER_PHASES,
    allocate_channels,
    inference_main,
    seed_actor_main,
)
from course_lib.runtime.processes import ChildProcessSystem, SharedFlag, exit_reason, stop_processes
from course_lib.runtime.weights import SharedWeights

Layout = Literal["impala", "seed"]


@dataclass(frozen=True)
class SystemConfig:
    """Everything a run of the actor-learner system depends on."""

    layout: Layout = field(
        default="impala", metadata={"help": "'impala' (policy in every actor) or 'seed' (central inference)"}
    )
    env_id: str = field(default="CartPole-v1", metadata={"help": "gymnasium id (discrete actions, flat observations)"})
    n_actors: int = field(default=2, metadata={"help": "actor processes"})
    envs_per_actor: int = field(default=8, metadata={"help": "environments each actor steps (B of a slot)"})
    unroll: int = field(default=16, metadata={"help": "steps per unroll (T)"})
    batch_size: int = field(default=2, metadata={"help": "slots (unrolls) per learner batch"})
    slots_per_actor: int = field(default=2, metadata={"help": "shared-memory slots per actor"})
    hidden: int = field(default=64, metadata={"help": "width of the policy and value MLPs"})
    lr: float = field(default=2e-3, metadata={"help": "Adam learning rate"})
    loss: LossConfig = field(default=LossConfig(), metadata={"help": "gamma, costs and V-trace thresholds"})
    correct: bool = field(default=True, metadata={"help": "V-trace (True) or no off-policy correction (False)"})
    seed: int = field(default=0, metadata={"help": "seeds the model and every child process"})
    batch_wait_s: float = field(
        default=0.0005, metadata={"help": "SEED: how long the server waits for more actors before a batch"}
    )
    poll_s: float = field(
        default=0.1, metadata={"help": "longest single wait of any process before it checks on the others"}
    )
    stall_timeout_s: float = field(default=60.0, metadata={"help": "no batch for this long: shut down and raise"})
    join_timeout_s: float = field(
        default=3.0, metadata={"help": "stop: how long to wait for children before terminate/kill"}
    )
    max_restarts: int = field(default=3, metadata={"help": "actor restarts before giving up"})
    crash_after: int | None = field(
        default=None, metadata={"help": "fault injection: every actor's first process raises after this many unrolls"}
    )
    start_method: str = field(
        default="forkserver",
        metadata={"help": "'forkserver' (fast starts) or 'spawn'; fork is unsafe with torch threads"},
    )

    @property
    def n_slots(self) -> int:
        return self.n_actors * self.slots_per_actor


class SystemFault(RuntimeError):
    """The system could not go on (an actor kept dying, the server died, no data came)."""


@dataclass
class SystemReport:
    """What :meth:`ActorLearnerSystem.train` measured.

    Attributes:
        layout: ``"impala"`` or ``"seed"``.
        updates: learner updates done.
        frames: env frames the learner consumed after the first batch arrived.
        seconds: wall-clock seconds from the first batch to the last update.
        lags: ``[n_rollouts]`` policy lag of every consumed unroll (its oldest step).
        returns: returns of the episodes that finished, in arrival order.
        return_updates: the update each of ``returns`` arrived at.
        metrics: one dict of learner metrics per update.
        timings: ``{process: {phase: seconds}}`` over the same window as ``seconds``.
        events: the supervisor's log (crashes, freezes, restarts, shutdown).
        queue_lags: ``[n_rollouts]`` the part of each lag spent queued: updates between the
            unroll's arrival at the learner and its use (at most
            :func:`~course_lib.actor_learner.faults.lag_bound`; the rest of ``lags`` accrued
            while it was being written).
        restarts: actor restarts since the system started.
        lost_unrolls: half-written slots reclaimed from dead or frozen actors since the start
            (their steps are thrown away and the slot is written again from scratch).
    """

    layout: str
    updates: int
    frames: int
    seconds: float
    lags: np.ndarray
    returns: list[float]
    return_updates: list[int]
    metrics: list[dict[str, float]]
    timings: dict[str, dict[str, float]]
    events: list[str]
    queue_lags: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    restarts: int = 0
    lost_unrolls: int = 0

    @property
    def frames_per_second(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else float("nan")


@dataclass
class _Child:
    """One child process and how the learner talks to it."""

    name: str
    process: Any
    conn: Connection | None  # the learner's end (IMPALA actors, the SEED server); None for SEED actors
    row: int  # its row in the shared timing table
    outstanding: set[int] = field(default_factory=set)  # slots sent to it, not yet back
    restart: Restart | None = None  # how it replaced a dead or frozen actor, if it did


@dataclass
class Restart:
    """One restart of an actor, and the weights its replacement first acted with.

    Attributes:
        actor: the actor's index.
        old_pid, new_pid: the dead (or frozen, then killed) process and its replacement.
        reason: ``"died"`` or ``"frozen"``.
        learner_version: the learner's (= the published) weight version at the restart.
        first_version: the oldest weight version in the replacement's first unroll the
            learner consumed (IMPALA only; ``None`` until then, and for SEED actors, whose
            policy is the server's): ``>= learner_version`` when it starts from fresh weights.
        first_lag: the policy lag of that unroll when the learner consumed it.
        at: ``time.monotonic()`` of the restart.
        recovery_s: seconds from the restart until the learner consumed the replacement's
            first unroll (IMPALA only): how long the system ran one actor short.
    """

    actor: int
    old_pid: int
    new_pid: int
    reason: str
    learner_version: int
    first_version: int | None = None
    first_lag: int | None = None
    at: float = field(default_factory=time.monotonic)
    recovery_s: float | None = None


#: A full slot the learner has received and not yet learned from: (who filled it, slot index,
#: finished returns, the learner's version when it arrived).
_Full = tuple[_Child, int, list[float], int]


@dataclass
class _Run:
    """What one call of :meth:`ActorLearnerSystem.train` accumulates."""

    last_data: float  # time.monotonic() when the last full slot arrived (for the stall timeout)
    lags: list[int] = field(default_factory=list)
    queue_lags: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    return_updates: list[int] = field(default_factory=list)
    metrics: list[dict[str, float]] = field(default_factory=list)
    frames: int = 0
    first_batch: float | None = None  # time.perf_counter() at the first batch: throughput is measured from there
    at_first_batch: dict[str, dict[str, float]] = field(default_factory=dict)  # timings then

    def finished(self, n_updates: int | None, seconds: float | None) -> bool:
        """``n_updates`` updates done, or ``seconds`` passed since the first batch."""
        if n_updates is not None and len(self.metrics) >= n_updates:
            return True
        if seconds is None or self.first_batch is None:
            return False
        return time.perf_counter() - self.first_batch >= seconds


MAX_PHASES = 4


class ActorLearnerSystem(ChildProcessSystem):
    """An IMPALA- or SEED-style system of real processes; see the module docstring."""

    def __init__(self, config: SystemConfig = SystemConfig(), supervisor: SupervisorConfig | None = None) -> None:
        """``supervisor``: heartbeat settings (:class:`SupervisorConfig`; its defaults if ``None``)."""
        self.config = config
        self.supervisor = supervisor if supervisor is not None else SupervisorConfig()
        self.events: list[str] = []
        self.restarts = 0
        self.restart_log: list[Restart] = []
        self.lost_unrolls = 0
        self.actors: list[_Child] = []
        self.server: _Child | None = None
        # full slots received but not yet learned from; kept across train() calls: a slot
        # dropped here would never be handed back, and its actor would starve
        self._pending: list[_Full] = []

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Allocate shared memory and start every child process."""
        cfg = self.config
        self._ctx = self._begin(cfg.start_method, __name__)
        probe = make_envs(cfg.env_id, 1)
        obs_shape, action_space = probe.single_observation_space.shape, probe.single_action_space
        if obs_shape is None or not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"{cfg.env_id}: the system needs flat observations and discrete actions")
        self.obs_dim = int(np.prod(obs_shape))
        self.n_actions = int(action_space.n)
        probe.close()
        torch.manual_seed(cfg.seed)
        self.learner = Learner(ActorCritic(self.obs_dim, self.n_actions, cfg.hidden), cfg.lr, cfg.loss, cfg.correct)
        self.buffers = RolloutBuffers.allocate(cfg.unroll, cfg.envs_per_actor, self.obs_dim, cfg.n_slots)
        self.weights = SharedWeights(self.learner.model)
        self._stop = SharedFlag(self._ctx)  # no lock: a frozen actor cannot wedge the others
        self._timing = torch.zeros(cfg.n_actors + 1, MAX_PHASES, dtype=torch.float64).share_memory_()
        self.heartbeats = Heartbeats(cfg.n_actors)
        atexit.register(self.stop)
        try:
            if cfg.layout == "impala":
                self._start_impala_layout()
            elif cfg.layout == "seed":
                self._start_seed_layout()
            else:
                raise ValueError(f"layout must be 'impala' or 'seed', got {cfg.layout!r}")
        except BaseException:
            self.stop()
            raise

    def _start_impala_layout(self) -> None:
        """``n_actors`` actors, each handed its own ``slots_per_actor`` free slots."""
        cfg = self.config
        for i in range(cfg.n_actors):
            self.actors.append(self._start_impala_actor(i, cfg.crash_after))
        for i, actor in enumerate(self.actors):
            for index in range(i * cfg.slots_per_actor, (i + 1) * cfg.slots_per_actor):
                self._send_free(actor, index)

    def _start_seed_layout(self) -> None:
        """The inference server (handed every free slot), then ``n_actors`` env-only actors,
        each with a pipe to the server."""
        cfg = self.config
        self._channels = allocate_channels(cfg.n_actors, cfg.envs_per_actor, self.obs_dim)
        pipes = [self._ctx.Pipe() for _ in range(cfg.n_actors)]
        learner_end, server_end = self._ctx.Pipe()
        process = self._ctx.Process(
            target=inference_main,
            name="inference",
            args=(
                cfg,
                self.n_actions,
                self.buffers,
                self.weights,
                self._channels,
                [p[0] for p in pipes],
                server_end,
                self._stop,
                self._timing[cfg.n_actors],
                cfg.seed + 10_000,
            ),
            daemon=True,
        )
        process.start()
        server_end.close()
        self.server = _Child("inference server", process, learner_end, cfg.n_actors)
        for i, (server_side, actor_side) in enumerate(pipes):
            server_side.close()
            self.actors.append(self._start_seed_actor(i, actor_side, cfg.crash_after))
        for index in range(cfg.n_slots):
            self._send_free(self.server, index)

    def _child_seed(self, i: int) -> int:
        return self.config.seed * 1000 + i + 100 * self.restarts

    def _spawn_actor(
        self, target: Any, name: str, i: int, shared: tuple[Any, ...], actor_end: Connection, crash_after: int | None
    ) -> Any:
        """Start actor ``i`` running ``target`` with the layout's ``shared`` objects; its pipe end stays with it."""
        self.heartbeats.spawned(i)
        args = (i, self.config, *shared, actor_end, self._stop, self._timing[i], self._child_seed(i), crash_after)
        process = self._ctx.Process(target=target, name=name, args=(*args, self.heartbeats.row(i)), daemon=True)
        process.start()
        actor_end.close()
        return process

    def _start_impala_actor(self, i: int, crash_after: int | None) -> _Child:
        learner_end, actor_end = self._ctx.Pipe()
        shared = (self.buffers, self.weights)
        process = self._spawn_actor(actor_main, f"actor-{i}", i, shared, actor_end, crash_after)
        return _Child(f"actor {i}", process, learner_end, i)

    def _start_seed_actor(self, i: int, actor_end: Connection, crash_after: int | None) -> _Child:
        process = self._spawn_actor(seed_actor_main, f"seed-actor-{i}", i, (self._channels,), actor_end, crash_after)
        return _Child(f"actor {i}", process, None, i)

    def _send_free(self, child: _Child, index: int) -> None:
        child.outstanding.add(index)
        # if it died, the supervisor restarts it and resends its slots
        with contextlib.suppress(BrokenPipeError, OSError):
            child.conn.send(("free", index))  # type: ignore[union-attr]

    @property
    def children(self) -> list[_Child]:
        return self.actors + ([self.server] if self.server is not None else [])

    def held_slots(self) -> dict[str, int]:
        """Who holds each rollout slot between two :meth:`train` calls: ``{child: slots sent to
        it and not yet back, "learner": full slots received and not yet learned from}``. The
        values always sum to ``config.n_slots``: a slot dropped anywhere would starve its actor."""
        held = {c.name: len(c.outstanding) for c in self.children}
        held["learner"] = len(self._pending)
        return held

    def pids(self) -> list[int]:
        """Process ids of the children started (and not yet replaced)."""
        return [c.process.pid for c in self.children]

    def stop(self, timeout: float | None = None) -> None:
        """Stop every child: stop event, join with a timeout, then terminate, then kill.

        Idempotent; also registered with ``atexit`` while the system runs.
        """
        if not self._stopping():
            return
        self._stop.set()
        self.events += stop_processes(
            [(c.name, c.process) for c in self.children], self.config.join_timeout_s if timeout is None else timeout
        )
        for child in self.children:
            if child.conn is not None:
                child.conn.close()
            try:
                child.process.close()
            except ValueError:
                self.events.append(f"stop: {child.name} (pid {child.process.pid}) could not be reaped")
        self.events.append(f"stop: all {len(self.children)} child processes exited")

    # -- faults --------------------------------------------------------------------------

    def kill_actor(self, i: int) -> int:
        """Send ``SIGKILL`` to actor ``i`` (fault injection); returns its pid."""
        pid = self.actors[i].process.pid
        os.kill(pid, signal.SIGKILL)
        return pid

    def _supervise(self) -> None:
        """Restart dead and frozen actors (or give up); a dead inference server is fatal."""
        if self.server is not None and not self.server.process.is_alive():
            self.events.append(f"{self.server.name}: {exit_reason(self.server.process.exitcode)}")
            self.stop()
            raise SystemFault("the inference server died; the system was shut down cleanly")
        for i, actor in enumerate(self.actors):
            pid = actor.process.pid
            if not actor.process.is_alive():
                actor.process.join()
                self._restart(i, "died", f"{actor.name} (pid {pid}) died: {exit_reason(actor.process.exitcode)}")
            elif (silent := self.heartbeats.silent_for(i, self.supervisor)) is not None:
                os.kill(pid, signal.SIGKILL)  # a stopped process dies of SIGKILL too
                actor.process.join(self.config.join_timeout_s)
                self._restart(i, "frozen", f"{actor.name} (pid {pid}) frozen: no heartbeat for {silent:.1f} s")

    def _restart(self, i: int, reason: str, message: str) -> None:
        """Replace the dead actor ``i`` by a new process and hand it the slots the old one
        held (its half-written slot is rewritten from scratch); :class:`SystemFault` once
        ``max_restarts`` are used up."""
        actor = self.actors[i]
        if self.restarts >= self.config.max_restarts:
            self.events.append(message + f"; {self.restarts} restarts used up: shutting down")
            self.stop()
            raise SystemFault(f"{message}; gave up after {self.restarts} restarts (clean shutdown)")
        self.restarts += 1
        self.lost_unrolls += int(self.heartbeats.mid_unroll(i))
        if self.config.layout == "impala":
            if actor.conn is not None:
                actor.conn.close()
            new = self._start_impala_actor(i, None)
            for index in sorted(actor.outstanding):  # its half-written and queued slots go to the new actor
                self._send_free(new, index)
        else:
            new = self._start_seed_actor(i, self._attach_to_server(i, message), None)
        new.restart = Restart(i, actor.process.pid, new.process.pid, reason, self.learner.version)
        self.restart_log.append(new.restart)
        self.actors[i] = new
        try:
            actor.process.close()
        except ValueError:  # SIGKILL not yet delivered after join_timeout_s: stop() reaps the rest
            self.events.append(f"{actor.name} (pid {actor.process.pid}) could not be reaped yet")
        verb = "killed and restarted" if reason == "frozen" else "restarted"
        self.events.append(message + f"; {verb} as pid {new.process.pid}")

    def _attach_to_server(self, i: int, message: str) -> Connection:
        """A new pipe for a restarted SEED actor; the server gets its end (and drops the old
        actor, reclaiming its half-written slot). Returns the actor's end."""
        server_end, actor_end = self._ctx.Pipe()
        try:
            self.server.conn.send(("attach", i, server_end))  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            self.events.append(message + "; the inference server is gone too: shutting down")
            self.stop()
            raise SystemFault("the inference server died; the system was shut down cleanly") from None
        finally:
            server_end.close()
        return actor_end

    # -- the learner ---------------------------------------------------------------------

    def timings(self) -> dict[str, dict[str, float]]:
        """``{process: {phase: seconds}}`` of every child (from shared memory) and the learner,
        accumulated since the start."""
        out: dict[str, dict[str, float]] = {}
        actor_phases = ACTOR_PHASES if self.config.layout == "impala" else SEED_ACTOR_PHASES
        table = self._timing.numpy()
        for i in range(self.config.n_actors):
            out[f"actor {i}"] = {p: float(table[i, j]) for j, p in enumerate(actor_phases)}
        if self.config.layout == "seed":
            out["inference server"] = {p: float(table[self.config.n_actors, j]) for j, p in enumerate(SERVER_PHASES)}
        out["learner"] = self.learner.timings.as_dict()
        return out

    def _receive(self, pending: list[_Full]) -> None:
        """Wait up to ``poll_s`` for full slots; supervise the children."""
        sources: dict[Connection, _Child] = {c.conn: c for c in self.children if c.conn is not None}
        ready = wait(list(sources), timeout=self.config.poll_s)
        for conn, child in sources.items():
            if conn not in ready:
                continue
            try:
                while conn.poll():
                    kind, index, finished = conn.recv()
                    if kind == "full":
                        child.outstanding.discard(index)
                        pending.append((child, index, finished, self.learner.version))
            except (EOFError, OSError):
                pass  # it died; _supervise notices
        self._supervise()

    def train(
        self,
        n_updates: int | None = None,
        seconds: float | None = None,
        progress: Callable[[int, dict[str, float]], None] | None = None,
        until: Callable[[], bool] | None = None,
    ) -> SystemReport:
        """Learn until ``n_updates`` updates or ``seconds`` of wall-clock time (after the
        first batch), or until ``until()`` is true (checked after each update), whichever
        comes first.

        Each update: wait for ``batch_size`` full slots (:meth:`_wait_for_batch`), copy them
        out and hand them back (:meth:`_hand_back`), learn and publish (:meth:`_learn`).

        Raises:
            SystemFault: a child kept dying, or no data arrived for ``stall_timeout_s``.
        """
        if not self._started or self._stopped:
            raise RuntimeError("start() the system first (or use it as a context manager)")
        if n_updates is None and seconds is None:
            raise ValueError("give n_updates or seconds (a bound), with until= or without")
        run = _Run(last_data=time.monotonic())
        pending = self._pending  # what an earlier call received beyond its last batch is learned from first
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny net: more threads only spin against the actors for the 2 cores
        try:
            while not run.finished(n_updates, seconds) and not (until is not None and run.metrics and until()):
                taken = self._wait_for_batch(pending, run)
                if run.first_batch is None:  # measure from here: start-up is not throughput
                    run.first_batch = time.perf_counter()
                    run.at_first_batch = self.timings()
                m = self._learn(taken, run)
                if progress is not None:
                    progress(len(run.metrics), m)
        except BaseException:
            self.stop()
            raise
        finally:
            torch.set_num_threads(previous_threads)
        return self._report(run)

    def train_until(self, event: Callable[[], bool], what: str, timeout_s: float) -> SystemReport:
        """Learn until ``event()`` is true (checked after each update, so at least one update
        runs), for at most ``timeout_s`` seconds after the first batch (before it, a system
        that sends no data raises :class:`SystemFault` after ``stall_timeout_s``). A demo of something that happens after a
        *time* (a heartbeat timeout, a restart) waits for that event instead of doing a
        fixed amount of work, which a fast machine finishes first and a slow one overruns.

        Raises:
            TimeoutError: ``event()`` was still false after ``timeout_s`` seconds; the
                message says that ``what`` did not happen and how many updates ran. The
                system is stopped first (no process is left behind).
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        report = self.train(seconds=timeout_s, until=event)
        if not event():
            recent = self.events[-3:] or ["none"]
            self.stop()
            raise TimeoutError(
                f"{what}: did not happen within {timeout_s:g} s ({report.updates} updates ran); "
                f"the system's last events: {'; '.join(recent)}"
            )
        return report

    def _wait_for_batch(self, pending: list[_Full], run: _Run) -> list[_Full]:
        """Receive until ``batch_size`` full slots are pending; take them out of ``pending``.

        Raises:
            SystemFault: no slot arrived for ``stall_timeout_s`` (since the last one).
        """
        cfg = self.config
        with self.learner.timings.phase("wait for batch"):
            while len(pending) < cfg.batch_size:
                before = len(pending)
                self._receive(pending)
                if len(pending) > before:
                    run.last_data = time.monotonic()
                elif time.monotonic() - run.last_data > cfg.stall_timeout_s:
                    self.events.append(f"learner: no data for {cfg.stall_timeout_s:g} s: shutting down")
                    raise SystemFault(f"no rollout arrived for {cfg.stall_timeout_s:g} s (clean shutdown)")
        taken = pending[: cfg.batch_size]
        del pending[: cfg.batch_size]
        return taken

    def _hand_back(self, taken: list[_Full], run: _Run) -> None:
        """Free the slots ``taken`` (to the child that filled them, or its replacement) and
        record the returns of the episodes that finished in them."""
        for child, index, finished, _ in taken:
            owner = child if child.conn is not None and child in self.children else None
            if owner is None:  # its actor was restarted meanwhile: give the slot to the new one
                owner = next(c for c in self.children if c.row == child.row)
            self._send_free(owner, index)
            run.returns += finished
            run.return_updates += [len(run.metrics)] * len(finished)

    def _learn(self, taken: list[_Full], run: _Run) -> dict[str, float]:
        """One update on the slots ``taken``: copy them, hand them back, measure their policy
        lag, update (03.5) and publish the new weights. Returns the update's metrics."""
        cfg = self.config
        batch = self.buffers.batch([index for _, index, _, _ in taken])  # copies: the slots can be refilled at once
        self._hand_back(taken, run)
        per_column = rollout_lag(self.learner.version, batch["versions"])
        run.lags += per_column[:: cfg.envs_per_actor].tolist()  # one lag per unroll
        run.queue_lags += [self.learner.version - arrived for *_, arrived in taken]
        self._note_first_unrolls(taken, batch["versions"])
        m = self.learner.update(batch)
        with self.learner.timings.phase("publish weights"):
            self.weights.publish(self.learner.model, self.learner.version)
        m["lag_max"] = float(per_column.max())
        run.metrics.append(m)
        if len(run.metrics) > 1:
            run.frames += batch["actions"].numel()
        return m

    def _note_first_unrolls(self, taken: list[_Full], versions: torch.Tensor) -> None:
        """For a restarted IMPALA actor's first consumed unroll: the weight version it acted
        with and its lag (:class:`Restart`). ``versions``: ``[T, len(taken) * B]``."""
        b = self.config.envs_per_actor
        for j, (child, _, _, _) in enumerate(taken):
            record = child.restart
            if record is not None and record.first_version is None and self.config.layout == "impala":
                record.first_version = int(versions[:, j * b : (j + 1) * b].min())
                record.first_lag = self.learner.version - record.first_version
                record.recovery_s = time.monotonic() - record.at

    def _report(self, run: _Run) -> SystemReport:
        """The :class:`SystemReport` of ``run``, its timings counted from the first batch."""
        elapsed = time.perf_counter() - run.first_batch if run.first_batch is not None else 0.0
        window = {
            process: {
                phase: seconds - run.at_first_batch.get(process, {}).get(phase, 0.0)
                for phase, seconds in phases.items()
            }
            for process, phases in self.timings().items()
        }
        return SystemReport(
            layout=self.config.layout,
            updates=len(run.metrics),
            frames=run.frames,
            seconds=elapsed,
            lags=np.array(run.lags, dtype=np.int64),
            returns=run.returns,
            return_updates=run.return_updates,
            metrics=run.metrics,
            timings=window,
            events=list(self.events),
            queue_lags=np.array(run.queue_lags, dtype=np.int64),
            restarts=self.restarts,
            lost_unrolls=self.lost_unrolls,
        )


@dataclass
class LayoutRun:
    """One run of :func:`compare_layouts`: what the learner measured, and the CPU it cost.

    Attributes:
        report: the learner's :class:`SystemReport`.
        cpu_seconds: CPU seconds (user + system) of the learner and every child process,
            over the same window as ``report.frames`` (from the first update to the last).
    """

    report: SystemReport
    cpu_seconds: float

    @property
    def cpu_ms_per_1k_frames(self) -> float:
        """CPU milliseconds the whole system spent per 1,000 env frames consumed."""
        return 1e6 * self.cpu_seconds / self.report.frames if self.report.frames else float("nan")


def _cpu_seconds(pids: list[int]) -> float:
    """CPU seconds used so far by this process and the processes ``pids`` (gone ones count 0)."""
    import psutil

    total = time.process_time()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def _timed_run(config: SystemConfig, seconds: float) -> LayoutRun:
    """Start a system, train it for ``seconds``, stop it; count its CPU time from the first update."""
    cpu_at_first_update: list[float] = []
    with ActorLearnerSystem(config) as system:
        pids = system.pids()

        def first_update(n: int, _metrics: dict[str, float]) -> None:
            if n == 1:
                cpu_at_first_update.append(_cpu_seconds(pids))

        report = system.train(seconds=seconds, progress=first_update)
        cpu = _cpu_seconds(pids) - cpu_at_first_update[0]
    return LayoutRun(report, cpu)


def compare_layouts(
    base: SystemConfig,
    widths: tuple[int, ...],
    repeats: int,
    seconds: float,
    progress: Callable[[], None] | None = None,
) -> dict[tuple[str, int], list[LayoutRun]]:
    """Train the IMPALA and the SEED layout of ``base`` for ``seconds`` each, interleaved.

    The runs alternate ``impala, seed, impala, seed, ...`` at every width, ``repeats``
    times over, so that both layouts see the same drift of the machine's load; compare
    their medians. Every run is a fresh system (started and stopped). Besides frames/s,
    each run records the CPU time the whole system spent (learner + children), counted
    from the first update, like the frames.

    Args:
        base: the system; its ``layout`` and ``hidden`` are replaced.
        widths: hidden widths of the policy and value MLPs to measure.
        repeats: runs of each (layout, width).
        seconds: training seconds per run (start-up excluded).
        progress: called after every run.

    Returns:
        ``{(layout, width): [LayoutRun] * repeats}``, each list in the order it ran.
    """
    out: dict[tuple[str, int], list[LayoutRun]] = {
        (layout, width): [] for width in widths for layout in ("impala", "seed")
    }
    for _ in range(repeats):
        for width in widths:
            for layout in ("impala", "seed"):
                out[layout, width].append(_timed_run(replace(base, layout=layout, hidden=width), seconds))
                if progress is not None:
                    progress()
    return out
