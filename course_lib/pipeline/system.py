"""Three RL regimes for an LLM-like policy, with a generator and a trainer process (lesson 07).

::

    with PipelineSystem(PipelineConfig(regime="pipeline"), init_flat) as system:
        report = system.train()
    # the generator process has exited here, whatever happened inside the block

One **generator** process decodes with a :class:`~course_lib.lm.sampler.SlotSampler`
(``n_slots`` slots, one torch thread, core 0); the **trainer** runs in the calling process (one
torch thread, core 1), so on two cores both can work at the same time. Weights travel as one
flat shared tensor with a version under a seqlock (the runtime's
:class:`~course_lib.runtime.weights.SharedWeights`, as in lesson 03); finished groups of
answers travel through a pipe.

Regimes (``PipelineConfig.regime``):

* ``"sync"``: generate a whole batch (every slot, wait for the longest answer), train on
  it, publish, repeat. Lag 0; the generator idles while the trainer trains and vice versa.
* ``"one_step"``: the generator starts batch ``j + 1`` while the trainer trains on batch
  ``j``, with the weights of one update ago. Lag <= 1.
* ``"pipeline"``: the generator never stops: it pulls new weights between two decoding
  steps (keeping the KV cache, or recomputing it), and refills a finished slot at once
  (continuous batching). Lag <= ``max_lag``.

**Lag bound by backpressure.** Groups are numbered in the order they start; update ``u``
consumes groups ``u B .. (u + 1) B - 1`` (``B = groups_per_batch``). The generator may
start group ``k`` only when ``k < consumed + (bound + 1) B``, reading ``consumed`` (which
the trainer raises after publishing) *before* it pulls the weights. Then group ``k``
starts with a version ``>= consumed / B`` and is consumed by update ``<= consumed / B +
bound``: no token is ever more than ``bound`` updates old (``bound`` = 0, 1 or
``max_lag``). The trainer checks it on every batch. The rule,
:func:`~course_lib.rl.staleness.may_start_group`, lives with the other staleness maths (the
capstone's generators use it too); it is importable from here as well.

**Faults.** Every wait has a timeout (``poll_s``) after which the trainer checks the
generator; a dead generator is reported in ``events`` and the run ends cleanly with
:class:`PipelineFault`. The generator exits if its parent dies. :meth:`PipelineSystem.stop`
sets the stop event, joins with a timeout, then terminates and kills.
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Literal

import numpy as np
import torch

from course_lib.lm.model import LMConfig, TinyLM, sequence_logprobs
from course_lib.lm.sampler import SlotSampler
from course_lib.lm.task import EOS, CountdownTask, Problem, TaskConfig
from course_lib.pipeline.loss import (
    group_token_advantages,
    pad_groups,
    pipeline_loss,
    token_ess_fraction,
    token_lags,
)
from course_lib.rl.staleness import may_start_group
from course_lib.runtime.processes import (
    INJECTED_CRASH_EXIT,
    QUIET_EXIT,
    ChildProcessSystem,
    SharedFlag,
    child_setup,
    exit_reason,
    stop_processes,
)
from course_lib.runtime.weights import SharedWeights, load_flat_parameters

Regime = Literal["sync", "one_step", "pipeline"]
REGIMES: tuple[Regime, ...] = ("sync", "one_step", "pipeline")
TASK = TaskConfig()
LM = LMConfig(vocab=TASK.vocab, max_len=TASK.max_len)


@dataclass(frozen=True)
class PipelineConfig:
    """Everything one run of a regime depends on."""

    regime: Regime = field(default="pipeline", metadata={"help": "'sync', 'one_step' or 'pipeline'"})
    n_slots: int = field(
        default=32, metadata={"help": "decoding slots of the generator (= G x groups_per_batch for sync/one_step)"}
    )
    group_size: int = field(default=8, metadata={"help": "G answers sampled per prompt (one GRPO group)"})
    groups_per_batch: int = field(default=4, metadata={"help": "B groups per update"})
    max_lag: int = field(default=2, metadata={"help": "pipeline: most updates a token may lag (sync: 0, one_step: 1)"})
    n_updates: int = field(default=100, metadata={"help": "trainer updates in a run"})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    clip_c: float = field(default=2.0, metadata={"help": "truncation level c of the per-token weights (07.1)"})
    correction: bool = field(
        default=True, metadata={"help": "truncated IS (07.1); False: every token weighs 1 (no correction)"}
    )
    train_chunk: int = field(default=8, metadata={"help": "trainer: sequences per forward pass, sorted by length"})
    pin_cores: bool = field(
        default=True, metadata={"help": "generator on core 0, trainer on core 1 (its own hardware, as GPUs would be)"}
    )
    recompute_cache: bool = field(
        default=False, metadata={"help": "pipeline: rebuild the KV cache after an in-flight update"}
    )
    seed: int = field(default=0, metadata={"help": "seeds the prompts, the sampler and the trainer"})
    poll_s: float = field(default=0.05, metadata={"help": "longest single wait before checking on the other process"})
    stall_timeout_s: float = field(default=60.0, metadata={"help": "no data for this long: shut down and raise"})
    join_timeout_s: float = field(default=3.0, metadata={"help": "stop: wait this long before terminate/kill"})
    snapshot_every: int = field(
        default=0, metadata={"help": "the trainer keeps a copy of its weights every this many updates (0: none)"}
    )
    crash_after_groups: int | None = field(
        default=None, metadata={"help": "fault injection: the generator exits after sending this many groups"}
    )
    start_method: str = field(
        default="forkserver", metadata={"help": "'forkserver' or 'spawn' (fork is unsafe with torch threads)"}
    )
    lm: LMConfig = field(default=LM, metadata={"help": "model sizes"})
    task: TaskConfig = field(default=TASK, metadata={"help": "the countdown task"})

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            raise ValueError(f"regime must be one of {REGIMES}, got {self.regime!r}")
        if self.regime != "pipeline" and self.n_slots != self.batch_sequences:
            raise ValueError(
                f"regime {self.regime!r} generates whole batches: n_slots must equal group_size x "
                f"groups_per_batch = {self.batch_sequences}, got {self.n_slots}"
            )
        if self.regime == "pipeline" and self.max_lag < 1:
            raise ValueError(
                f"pipeline needs max_lag >= 1 (a token sampled during an update is 1 behind), got {self.max_lag}"
            )
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0 (0: no snapshots), got {self.snapshot_every}")

    @property
    def batch_sequences(self) -> int:
        return self.group_size * self.groups_per_batch

    @property
    def lag_bound(self) -> int:
        """The most updates any consumed token may lag: 0, 1 or ``max_lag``."""
        return {"sync": 0, "one_step": 1, "pipeline": self.max_lag}[self.regime]

    @property
    def capacity_groups(self) -> int:
        """Groups that may be started and not yet consumed (the backpressure window)."""
        return (self.lag_bound + 1) * self.groups_per_batch


def _pin(cfg: PipelineConfig, core: int) -> set[int] | None:
    """Give this process core ``core`` alone (if ``cfg.pin_cores`` and there are two cores);
    returns the previous affinity, to restore."""
    if not cfg.pin_cores or not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        return None
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {sorted(previous)[core]})
    return previous


def swap_in_newer_weights(weights: SharedWeights, sampler: SlotSampler, recompute: bool) -> bool:
    """The in-flight weight update, between two decoding steps: if the trainer published a
    newer version, load it into the sampler's model in place, stamp the tokens sampled from
    now on with it, and keep the live sequences' KV cache (or rebuild it, ``recompute``).
    Returns True if live sequences saw the swap (an in-flight update)."""
    new = weights.pull(sampler.model, sampler.version)  # a no-op if nothing newer was published
    if new == sampler.version:
        return False
    in_flight = sampler.n_active > 0
    sampler.weights_changed(new, recompute=recompute and in_flight)
    return in_flight


class PipelineFault(RuntimeError):
    """The run could not go on (the generator died or stalled); everything was shut down."""


# ---------------------------------------------------------------------------------------
# The generator process
# ---------------------------------------------------------------------------------------

CONSUMED = 0  # index in the shared counters: groups consumed by the trainer (raised after publishing)


@dataclass
class _Group:
    problem: Problem
    start_version: int
    answers: list[dict[str, Any]] = field(default_factory=list)


class _Timeline:
    """Decoding steps merged into busy intervals ``(start, end)``, plus slot-steps."""

    def __init__(self) -> None:
        self.intervals: list[list[float]] = []
        self.busy_slot_steps = 0
        self.steps = 0
        self.swaps: list[tuple[float, int]] = []
        self.swap_seconds = 0.0

    def busy(self, t0: float, t1: float) -> None:
        """Computing, but not a decoding step (an in-flight swap, a cache rebuild)."""
        if self.intervals and t0 - self.intervals[-1][1] < 2e-4:
            self.intervals[-1][1] = t1
        else:
            self.intervals.append([t0, t1])

    def add(self, t0: float, t1: float, n_active: int) -> None:
        """A decoding step with ``n_active`` live slots."""
        self.busy(t0, t1)
        self.busy_slot_steps += n_active
        self.steps += 1

    def flush(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "intervals": self.intervals[:-1],
            "busy_slot_steps": self.busy_slot_steps,
            "steps": self.steps,
            "swaps": self.swaps,
            "swap_seconds": self.swap_seconds,
        }
        self.intervals = self.intervals[-1:]  # the last one may still grow
        self.busy_slot_steps, self.steps, self.swaps, self.swap_seconds = 0, 0, [], 0.0
        return out


class GroupGenerator:
    """What the generator process does between two looks at the stop event: start groups of
    answers in a :class:`~course_lib.lm.sampler.SlotSampler`'s free slots, decode one step,
    verify the answers that ended and send every group that is complete.

    Groups are numbered in the order they start; each is ``G`` answers to one prompt. In
    ``sync`` and ``one_step`` a whole batch (``B`` groups, every slot) starts once all slots
    are idle; in ``pipeline`` a slot that finishes is refilled at once, and newer weights
    are swapped in between two decoding steps. Either way no group starts before
    backpressure (:func:`may_start_group`) allows it.

    :func:`generator_main` runs one in its own process; ``conn`` is anything with ``send``.
    """

    def __init__(
        self,
        cfg: PipelineConfig,
        weights: SharedWeights,
        sampler: SlotSampler,
        task: CountdownTask,
        rng: np.random.Generator,
        conn: Any,
    ) -> None:
        self.cfg, self.weights, self.sampler, self.task, self.rng, self.conn = cfg, weights, sampler, task, rng, conn
        self.groups: dict[int, _Group] = {}
        self.owner: dict[int, int] = {}  # slot -> the group its answer belongs to
        self.next_group = 0
        self.sent = 0
        self.issuing, self.left = -1, 0  # the group whose answers are being started, and how many are left to start
        self.timeline = _Timeline()

    def start_groups(self, consumed: int) -> None:
        """Start what the regime and backpressure allow, given the groups the trainer has
        ``consumed`` (read *before* any weights are pulled: see "lag bound" in the module docstring)."""
        B = self.cfg.groups_per_batch
        if self.cfg.regime == "pipeline":
            self._refill_free_slots(consumed)
        elif self.sampler.n_active == 0 and may_start_group(self.next_group + B - 1, consumed, self.cfg.lag_bound, B):
            self._start_batch()

    def decode_step(self) -> None:
        """One decoding step of every live slot; verify the answers that ended."""
        n_active = self.sampler.n_active
        t0 = time.perf_counter()
        finished = self.sampler.step()
        self.timeline.add(t0, time.perf_counter(), n_active)
        for slot in finished:
            self._finish_answer(slot)

    def _pull(self) -> None:
        """Swap in newer weights, if any (between two decoding steps), and time the swap."""
        t0 = time.perf_counter()
        if swap_in_newer_weights(self.weights, self.sampler, self.cfg.recompute_cache):
            t1 = time.perf_counter()
            self.timeline.busy(t0, t1)
            self.timeline.swap_seconds += t1 - t0
            self.timeline.swaps.append((t1, self.sampler.version))

    def _new_group(self) -> int:
        """Draw the next group's prompt; it starts with the sampler's current version."""
        k = self.next_group
        self.groups[k] = _Group(self.task.sample(self.rng, 1)[0], self.sampler.version)
        self.next_group += 1
        return k

    def _start(self, slot: int, k: int) -> None:
        self.sampler.start(slot, self.groups[k].problem.prompt)
        self.owner[slot] = k

    def _refill_free_slots(self, consumed: int) -> None:
        """``pipeline``: pull newer weights, then start an answer in every free slot, group after
        group, until backpressure holds the next group back."""
        self._pull()
        for slot in self.sampler.free_slots():
            if self.left == 0:
                if not may_start_group(self.next_group, consumed, self.cfg.lag_bound, self.cfg.groups_per_batch):
                    break  # backpressure
                self.issuing, self.left = self._new_group(), self.cfg.group_size
            self._start(slot, self.issuing)
            self.left -= 1

    def _start_batch(self) -> None:
        """``sync`` and ``one_step``: pull newer weights, then start ``B`` groups of ``G`` answers in all slots."""
        self._pull()
        slots = iter(range(self.cfg.n_slots))
        for _ in range(self.cfg.groups_per_batch):
            k = self._new_group()
            for _ in range(self.cfg.group_size):
                self._start(next(slots), k)

    def _finish_answer(self, slot: int) -> None:
        """Verify the answer that ended in ``slot``; send its group if that completes it."""
        k = self.owner.pop(slot)
        res = self.sampler.result(slot)
        p = int(res["prompt_len"])
        answer = res["tokens"][p:].tolist()
        group = self.groups[k]
        group.answers.append(
            {
                "answer": answer,
                "logp": res["logp"][p:].tolist(),
                "versions": res["versions"][p:].tolist(),
                "reward": self.task.reward(group.problem, answer),
            }
        )
        if len(group.answers) == self.cfg.group_size:
            self._send_group(k)

    def _send_group(self, k: int) -> None:
        """Send group ``k`` with the timeline since the last group; crash here if asked to (fault injection)."""
        g = self.groups.pop(k)
        payload = {"prompt": g.problem.prompt, "start_version": g.start_version, "answers": g.answers}
        self.conn.send(("group", k, payload, self.timeline.flush()))
        self.sent += 1
        if self.cfg.crash_after_groups is not None and self.sent >= self.cfg.crash_after_groups:
            os._exit(INJECTED_CRASH_EXIT)


def generator_main(
    cfg: PipelineConfig, weights: SharedWeights, counters: torch.Tensor, conn: Connection, stop: Any, go: Any, seed: int
) -> None:
    """The generator process: decode, verify, send finished groups (see the module docstring
    and :class:`GroupGenerator`)."""
    child_setup(seed)
    _pin(cfg, 0)
    task = CountdownTask(cfg.task)
    rng = np.random.default_rng(seed)
    model = TinyLM(cfg.lm)
    sampler = SlotSampler(model, cfg.n_slots, EOS, torch.Generator().manual_seed(seed))
    sampler.version = weights.pull(model, -1)
    conn.send(("ready", os.getpid()))
    while not go.wait(cfg.poll_s):
        if stop.is_set():
            return
    generator = GroupGenerator(cfg, weights, sampler, task, rng, conn)
    try:
        while not stop.is_set():
            generator.start_groups(int(counters[CONSUMED]))  # read before any pull: see "lag bound"
            if sampler.n_active == 0:
                time.sleep(0.0005)  # backpressure: nothing may start yet
                continue
            generator.decode_step()
    except QUIET_EXIT:
        pass


# ---------------------------------------------------------------------------------------
# The trainer (this process) and the report
# ---------------------------------------------------------------------------------------


@dataclass
class RegimeReport:
    """What one run measured (times in seconds from the start signal).

    ``metrics``: one dict per update (``reward``, ``lag_max``, ``lag_mean``, ``ess``,
    ``clipped``, ``tokens``, ``time``, ``loss``); ``token_lags``: the lag of every consumed
    token; ``generator`` / ``trainer``: busy intervals ``[(start, end)]``; ``swaps``:
    ``(time, version)`` of every in-flight weight update the generator applied;
    ``swap_seconds``: the generator's time spent in them (loading, and rebuilding the cache if
    ``recompute_cache``); ``final_state``: the trainer's weights at the end; ``snapshots``:
    ``(updates done, time, weights)`` at the start and every ``snapshot_every`` updates
    (:meth:`state_at`).
    """

    regime: str
    lag_bound: int
    seconds: float
    tokens: int
    samples: int
    metrics: list[dict[str, float]]
    token_lags: np.ndarray
    generator: list[tuple[float, float]]
    trainer: list[tuple[float, float]]
    swaps: list[tuple[float, int]]
    slot_occupancy: float
    events: list[str]
    swap_seconds: float = 0.0
    correction: bool = True
    recompute_cache: bool = False
    final_state: dict[str, torch.Tensor] = field(default_factory=dict)
    snapshots: list[tuple[int, float, dict[str, torch.Tensor]]] = field(default_factory=list)

    def state_at(self, seconds: float) -> tuple[int, float, dict[str, torch.Tensor]]:
        """The latest snapshot taken at or before ``seconds`` from the start: ``(updates done,
        time, weights)``; the policy the trainer had then, to compare runs at equal wall-clock.

        Raises:
            ValueError: no snapshot that early (run with a smaller ``snapshot_every``).
        """
        taken = [snap for snap in self.snapshots if snap[1] <= seconds]
        if not taken:
            raise ValueError(
                f"no snapshot at or before {seconds:.2f} s (the first is at {self.snapshots[0][1]:.2f} s)"
                if self.snapshots
                else "this run kept no snapshots: set snapshot_every"
            )
        return taken[-1]

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    def busy_fraction(self, who: str) -> float:
        """Fraction of the run's wall time ``who`` (``generator`` or ``trainer``) was computing."""
        spans = getattr(self, who)
        return sum(min(b, self.seconds) - a for a, b in spans if a < self.seconds) / self.seconds

    @property
    def generation_utilisation(self) -> float:
        """Busy fraction of the generator x the fraction of its slots doing useful work."""
        return self.busy_fraction("generator") * self.slot_occupancy

    def series(self, key: str) -> np.ndarray:
        return np.array([m[key] for m in self.metrics])

    @property
    def arm(self) -> str:
        """``sync``, ``one_step``, ``pipeline``, ``pipeline_no_is`` (no correction) or
        ``pipeline_recompute`` (KV cache rebuilt after every in-flight update)."""
        if not self.correction:
            return f"{self.regime}_no_is"
        return f"{self.regime}_recompute" if self.recompute_cache and self.regime == "pipeline" else self.regime

    @property
    def fresh_gap(self) -> float:
        """Mean ``|log pi_u - log mu|`` over the consumed tokens of lag 0 (sampled by the
        trainer's own weights): rounding only, unless a kept KV cache made them differ."""
        return float(self.series("fresh_gap_sum").sum() / max(self.series("fresh_tokens").sum(), 1.0))


def _state_copy(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of ``model``'s weights that later updates leave alone."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass
class _TrainerRun:
    """What one call of :meth:`PipelineSystem.train` accumulates (times in seconds from ``t0``,
    the start signal)."""

    t0: float
    received: dict[int, dict[str, Any]] = field(default_factory=dict)  # groups not consumed yet, by number
    metrics: list[dict[str, float]] = field(default_factory=list)
    lags: list[np.ndarray] = field(default_factory=list)  # per update: the lag of every consumed token
    trainer: list[tuple[float, float]] = field(default_factory=list)
    generator: list[tuple[float, float]] = field(default_factory=list)
    swaps: list[tuple[float, int]] = field(default_factory=list)
    swap_seconds: float = 0.0
    busy_slot_steps: int = 0
    steps: int = 0
    snapshots: list[tuple[int, float, dict[str, torch.Tensor]]] = field(default_factory=list)

    def add_timeline(self, timeline: dict[str, Any]) -> None:
        """Add the generator's timeline that came with a group (:meth:`_Timeline.flush`)."""
        self.generator += [(a - self.t0, b - self.t0) for a, b in timeline["intervals"]]
        self.swaps += [(t - self.t0, v) for t, v in timeline["swaps"]]
        self.swap_seconds += timeline["swap_seconds"]
        self.busy_slot_steps += timeline["busy_slot_steps"]
        self.steps += timeline["steps"]


class PipelineSystem(ChildProcessSystem):
    """A generator process and this process's trainer for one regime; see the module docstring."""

    def __init__(self, config: PipelineConfig, init_flat: torch.Tensor) -> None:
        self.config = config
        self.events: list[str] = []
        self.model = TinyLM(config.lm)
        load_flat_parameters(self.model, init_flat)
        self.process: Any = None

    def start(self) -> None:
        """Share the weights, start the generator and wait until it is ready."""
        cfg = self.config
        ctx = self._begin(cfg.start_method, __name__)
        self.weights = SharedWeights(self.model)
        self.counters = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._stop, self._go = SharedFlag(ctx), SharedFlag(ctx)
        self.conn, child_end = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=generator_main,
            name="generator",
            daemon=True,
            args=(cfg, self.weights, self.counters, child_end, self._stop, self._go, cfg.seed * 1000 + 1),
        )
        atexit.register(self.stop)
        try:
            self.process.start()
            child_end.close()
            message = self._recv(cfg.stall_timeout_s, "the generator to start")
            assert message[0] == "ready"
        except BaseException:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def stop(self) -> None:
        """Stop event, join with a timeout, then terminate, then kill. Idempotent."""
        if not self._stopping():
            return
        # a flag without a lock (SharedFlag): a generator SIGKILLed while reading it cannot wedge
        # set(); an mp.Event's lock could (a clean-clone CI run once hung so)
        self._stop.set()
        if self.process is not None and self.process.pid is not None:
            self.events += stop_processes([("the generator", self.process)], self.config.join_timeout_s)
            self.process.close()
        self.conn.close()
        self.events.append("stop: the generator process exited")

    def _recv(self, timeout: float, what: str) -> tuple[Any, ...]:
        """The next message, waiting at most ``timeout`` s in ``poll_s`` slices, checking the generator."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.conn.poll(self.config.poll_s):
                try:
                    return self.conn.recv()
                except (EOFError, OSError):
                    pass
            if not self.process.is_alive():
                self.process.join()
                message = f"generator (pid {self.process.pid}) died: {exit_reason(self.process.exitcode)}"
                self.events.append(message + "; shutting down")
                self.stop()
                raise PipelineFault(message + " (clean shutdown)")
        self.events.append(f"trainer: waited {timeout:g} s for {what}: shutting down")
        self.stop()
        raise PipelineFault(f"waited {timeout:g} s for {what} (clean shutdown)")

    def train(self, progress: Callable[[int, dict[str, float]], None] | None = None) -> RegimeReport:
        """Run ``n_updates`` updates; returns the :class:`RegimeReport`.

        Update ``u`` waits for its groups (:meth:`_receive_groups`), then takes one step on
        them and publishes version ``u + 1`` (:meth:`_update`).

        Raises:
            PipelineFault: the generator died, or no group came for ``stall_timeout_s``.
        """
        cfg = self.config
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        previous_cores = _pin(cfg, 1)
        torch.manual_seed(cfg.seed)
        opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self._go.set()
        run = _TrainerRun(t0=time.perf_counter())
        if cfg.snapshot_every:
            run.snapshots.append((0, 0.0, _state_copy(self.model)))
        try:
            for u in range(cfg.n_updates):
                groups = self._receive_groups(u, run)
                start = time.perf_counter()
                m = self._update(u, groups, opt, run.lags)
                end = time.perf_counter()
                run.trainer.append((start - run.t0, end - run.t0))
                m["time"] = end - run.t0
                run.metrics.append(m)
                if cfg.snapshot_every and (u + 1) % cfg.snapshot_every == 0:
                    run.snapshots.append((u + 1, m["time"], _state_copy(self.model)))
                if progress is not None:
                    progress(u + 1, m)
        except BaseException:
            self.stop()
            raise
        finally:
            torch.set_num_threads(previous_threads)
            if previous_cores is not None:
                os.sched_setaffinity(0, previous_cores)
        return self._report(run, seconds=time.perf_counter() - run.t0)

    def _receive_groups(self, u: int, run: _TrainerRun) -> list[dict[str, Any]]:
        """The groups update ``u`` consumes, ``u B .. (u + 1) B - 1``, waiting for those that
        have not arrived; groups that arrive early wait in ``run.received``."""
        B = self.config.groups_per_batch
        wanted = range(u * B, (u + 1) * B)
        while any(k not in run.received for k in wanted):
            missing = min(set(wanted) - set(run.received))
            _kind, k, payload, timeline = self._recv(self.config.stall_timeout_s, f"group {missing}")
            run.received[k] = payload
            run.add_timeline(timeline)
        return [run.received.pop(k) for k in wanted]

    def _report(self, run: _TrainerRun, seconds: float) -> RegimeReport:
        """The :class:`RegimeReport` of ``run``, which took ``seconds``."""
        cfg = self.config
        return RegimeReport(
            regime=cfg.regime,
            lag_bound=cfg.lag_bound,
            seconds=seconds,
            tokens=sum(int(m["tokens"]) for m in run.metrics),
            samples=cfg.n_updates * cfg.batch_sequences,
            metrics=run.metrics,
            token_lags=np.concatenate(run.lags),
            generator=run.generator,
            trainer=run.trainer,
            swaps=run.swaps,
            slot_occupancy=run.busy_slot_steps / max(run.steps * cfg.n_slots, 1),
            events=list(self.events),
            swap_seconds=run.swap_seconds,
            correction=cfg.correction,
            recompute_cache=cfg.recompute_cache,
            final_state=_state_copy(self.model),
            snapshots=run.snapshots,
        )

    def _update(
        self, u: int, groups: list[dict[str, Any]], opt: torch.optim.Optimizer, lags: list[np.ndarray]
    ) -> dict[str, float]:
        """One trainer step at version ``u`` on ``groups`` (07.1-07.4); publishes version ``u + 1``."""
        cfg = self.config
        batch = pad_groups(groups)
        mask = batch["mask"]
        lag = token_lags(u, batch["versions"].numpy(), mask.numpy())
        if lag.max() > cfg.lag_bound:
            self.events.append(f"update {u}: a token lags {int(lag.max())} > bound {cfg.lag_bound}")
        lags.append(lag[mask.numpy()])
        adv = group_token_advantages(batch["rewards"], mask)
        # (07.2) over chunks of similar length, each padded only to its own longest: the same
        # loss (chunk means weighted by their token counts), without computing the long tail's padding
        ends = mask.shape[1] - mask.flip(1).float().argmax(1)
        n_real = mask.sum()
        fresh = torch.as_tensor(lag == 0) & mask  # sampled by exactly the weights the trainer holds
        loss = torch.zeros(())
        ratios, fresh_gaps = [], []
        for rows in torch.argsort(ends, stable=True).split(cfg.train_chunk):
            n_t = int(ends[rows].max())
            m = mask[rows, :n_t]
            logp_new = sequence_logprobs(self.model, batch["tokens"][rows, :n_t])
            chunk = pipeline_loss(logp_new, batch["logp"][rows, :n_t], adv[rows, :n_t], m, cfg.clip_c, cfg.correction)
            loss = loss + chunk * m.sum() / n_real
            log_ratio = logp_new.detach() - batch["logp"][rows, :n_t]
            ratios.append(log_ratio[m])
            fresh_gaps.append(log_ratio[fresh[rows, :n_t]].abs())
        opt.zero_grad()
        loss.backward()
        opt.step()
        self.weights.publish(self.model, u + 1)
        self.counters[CONSUMED] = (u + 1) * cfg.groups_per_batch  # after publishing: see "lag bound"
        log_ratio = torch.cat(ratios).numpy()
        gaps = torch.cat(fresh_gaps).numpy()
        real = mask.numpy()
        return {
            "reward": float(batch["rewards"].mean()),
            "lag_max": float(lag[real].max()),
            "lag_mean": float(lag[real].mean()),
            "ess": token_ess_fraction(log_ratio, np.ones_like(log_ratio, bool)),
            "clipped": float((log_ratio > np.log(cfg.clip_c)).mean()),
            # |log pi_u - log mu| of the lag-0 tokens: 0 up to rounding, unless a kept KV cache
            # (keys and values written by older weights) changed what the new weights sampled
            "fresh_gap_sum": float(gaps.sum()),
            "fresh_gap_max": float(gaps.max()) if gaps.size else 0.0,
            "fresh_tokens": float(gaps.size),
            "tokens": float(real.sum()),
            "loss": loss.item(),
        }
