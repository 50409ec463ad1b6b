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
  (continuous batching). Lag <= ``max_lag``. With ``inflight=False`` (**drain-then-swap**)
  it takes newer weights only once its live sequences have finished: when a newer version
  is waiting it starts nothing new, lets the slots drain, then swaps and refills.
* ``"conventional"`` (PipelineRL's baseline, Piche et al. 2025): a round generates
  ``steps_per_round`` batches with one version of the weights (continuous batching inside
  the round), then the trainer takes ``steps_per_round`` optimizer steps on them, so the
  round's batches lag ``0 .. steps_per_round - 1``; the next round starts when the last
  batch is consumed. ``colocated=True`` runs it as the paper does, alternating generation
  and training on all the hardware: in this process, on the two cores the split arms use
  (two torch threads), no child process
  (each batch of a round is trained on as soon as it is complete, between decoding steps of
  the round's other batches: the same serial work as generating the whole round first, and
  the same lags). ``steps_per_round=1`` is then the colocated synchronous loop.
  ``n_generators=2`` instead runs an inference engine process per core (half the slots
  each), and ``dp_trainers=2`` a data-parallel trainer: a second process on the other core
  computes the gradient of half of each batch, summed into the trainer's before the step
  (:func:`balanced_shares`, :func:`dp_trainer_main`); lesson 07's synchronous arms.

**Lag bound by backpressure.** Groups are numbered in the order they start; update ``u``
consumes groups ``u B .. (u + 1) B - 1`` (``B = groups_per_batch``). The generator may
start group ``k`` only when ``k < consumed + (bound + 1) B``, reading ``consumed`` (which
the trainer raises after publishing) *before* it pulls the weights. Then group ``k``
starts with a version ``>= consumed / B`` and is consumed by update ``<= consumed / B +
bound``: no token is ever more than ``bound`` updates old (``bound`` = 0, 1 or
``max_lag``). The trainer checks it on every batch (a violation goes to ``events``; the tests
and lesson 07 assert that none occurs). The argument needs the read of ``consumed`` to come
before the weights' read and the trainer's publish before its store of ``consumed``: x86-64
keeps both orders; on arm64 nothing in Python fences these plain shared-memory accesses
(see :class:`~course_lib.runtime.weights.SharedWeights`), and the check is what would catch
a reordering. The rule,
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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
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

Regime = Literal["sync", "one_step", "pipeline", "conventional"]
REGIMES: tuple[Regime, ...] = ("sync", "one_step", "pipeline", "conventional")
TASK = TaskConfig()
LM = LMConfig(vocab=TASK.vocab, max_len=TASK.max_len)


@dataclass(frozen=True)
class PipelineConfig:
    """Everything one run of a regime depends on."""

    regime: Regime = field(default="pipeline", metadata={"help": "'sync', 'one_step', 'pipeline' or 'conventional'"})
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
    inflight: bool = field(
        default=True,
        metadata={"help": "pipeline: swap weights between decoding steps; False: drain the slots first"},
    )
    steps_per_round: int = field(
        default=4, metadata={"help": "conventional: optimizer steps (batches) per generation round"}
    )
    n_generators: int = field(
        default=1,
        metadata={
            "help": "conventional (not colocated): generator processes, one per core, each with n_slots / "
            "n_generators slots; the trainer waits for each whole round, then trains on the cores they used"
        },
    )
    dp_trainers: int = field(
        default=1,
        metadata={
            "help": "conventional with n_generators > 1: trainer ranks, one process per core; each computes "
            "the gradient of its share of every batch and the shares are summed (data parallel)"
        },
    )
    colocated: bool = field(
        default=False,
        metadata={"help": "conventional: generate and train in turn in this process, on two cores"},
    )
    split: str | None = field(
        default=None,
        metadata={"help": "prompts drawn from: None (every problem) or 'train' (never a held-out pair)"},
    )
    gap_probe_every: int = field(
        default=0,
        metadata={
            "help": "generator: every this many answers that saw a swap, measure log mu against a "
            "same-version recompute (0: never)"
        },
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
        if self.regime in ("sync", "one_step") and self.n_slots != self.batch_sequences:
            raise ValueError(
                f"regime {self.regime!r} generates whole batches: n_slots must equal group_size x "
                f"groups_per_batch = {self.batch_sequences}, got {self.n_slots}"
            )
        if self.regime == "pipeline" and self.max_lag < 1:
            raise ValueError(
                f"pipeline needs max_lag >= 1 (a token sampled during an update is 1 behind), got {self.max_lag}"
            )
        if self.regime == "conventional" and self.steps_per_round < 1:
            raise ValueError(f"conventional needs steps_per_round >= 1, got {self.steps_per_round}")
        if self.n_generators < 1 or self.n_slots % self.n_generators:
            raise ValueError(f"n_generators must be >= 1 and divide n_slots = {self.n_slots}, got {self.n_generators}")
        if self.n_generators > 1 and (self.regime != "conventional" or self.colocated):
            raise ValueError(
                "n_generators > 1 is conventional RL with an inference engine per core (regime 'conventional', "
                f"colocated=False); got regime {self.regime!r}, colocated={self.colocated}"
            )
        if self.dp_trainers < 1 or (self.dp_trainers > 1 and self.n_generators < self.dp_trainers):
            raise ValueError(
                f"dp_trainers must be >= 1 and, above 1, at most n_generators (one trainer rank per engine's "
                f"core, trained on after the round): got dp_trainers={self.dp_trainers}, "
                f"n_generators={self.n_generators}"
            )
        if self.colocated and self.regime != "conventional":
            raise ValueError(
                f"colocated=True alternates generation and training, which only regime 'conventional' does "
                f"(steps_per_round=1 is the colocated synchronous loop); regime {self.regime!r} overlaps them"
            )
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {self.group_size}")
        if self.gap_probe_every < 0:
            raise ValueError(f"gap_probe_every must be >= 0 (0: never), got {self.gap_probe_every}")
        if self.snapshot_every < 0:
            raise ValueError(f"snapshot_every must be >= 0 (0: no snapshots), got {self.snapshot_every}")

    @property
    def batch_sequences(self) -> int:
        return self.group_size * self.groups_per_batch

    @property
    def lag_bound(self) -> int:
        """The most updates any consumed token may lag: 0, 1, ``max_lag`` or ``steps_per_round - 1``."""
        return {"sync": 0, "one_step": 1, "pipeline": self.max_lag, "conventional": self.steps_per_round - 1}[
            self.regime
        ]

    @property
    def arm(self) -> str:
        """The arm's name: the regime, or a variant of it (see :attr:`RegimeReport.arm`)."""
        if self.regime == "conventional" and self.n_generators > 1:
            kind = "dp" if self.dp_trainers > 1 else "engines"
            return f"sync_{kind}" if self.steps_per_round == 1 else f"conventional_{kind}"
        if self.regime == "conventional":
            where = "colocated" if self.colocated else "split"
            return f"{where}_sync" if self.steps_per_round == 1 else f"conventional{'' if self.colocated else '_split'}"
        if not self.correction:
            return f"{self.regime}_no_is"
        if self.regime == "pipeline" and not self.inflight:
            return "pipeline_drain"
        return f"{self.regime}_recompute" if self.recompute_cache and self.regime == "pipeline" else self.regime

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


def _pin_two(cfg: PipelineConfig) -> set[int] | None:
    """Colocated arms: this process on the two cores the split arms' processes use (cores 0
    and 1, if ``cfg.pin_cores`` and there are two); returns the previous affinity, to restore."""
    if not cfg.pin_cores or not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2:
        return None
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(sorted(previous)[:2]))
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


def probe_cache_gap(sampler: SlotSampler, slot: int, since: int) -> np.ndarray:
    """``|log mu - log pi_v|`` of the tokens of ``slot``'s finished answer that the current
    version ``v`` sampled after position ``since`` (the first position it sampled), where
    ``log pi_v`` is a fresh forward pass of the same weights: zero up to rounding unless
    the keys and values the sampler read were written by older weights (a kept cache)."""
    res = sampler.result(slot)
    versions = res["versions"]
    mine = (versions == sampler.version) & (torch.arange(len(versions)) >= since)
    if not bool(mine.any()):
        return np.zeros(0)
    with torch.no_grad():
        fresh = sequence_logprobs(sampler.model, res["tokens"][None].to(sampler.device))[0].cpu()
    return (fresh - res["logp"])[mine].abs().numpy()


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
        self.recomputed_tokens = 0
        self.gap = [0.0, 0.0, 0.0]  # sum, tokens, max of the probed |log mu - log pi_v|

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
            "recomputed_tokens": self.recomputed_tokens,
            "gap": list(self.gap),
        }
        self.intervals = self.intervals[-1:]  # the last one may still grow
        self.busy_slot_steps, self.steps, self.swaps, self.swap_seconds = 0, 0, [], 0.0
        self.recomputed_tokens, self.gap = 0, [0.0, 0.0, 0.0]
        return out


class GroupGenerator:
    """What the generator process does between two looks at the stop event: start groups of
    answers in a :class:`~course_lib.lm.sampler.SlotSampler`'s free slots, decode one step,
    verify the answers that ended and send every group that is complete.

    Groups are numbered in the order they start; each is ``G`` answers to one prompt. In
    ``sync`` and ``one_step`` a whole batch (``B`` groups, every slot) starts once all slots
    are idle; in ``pipeline`` a slot that finishes is refilled at once, and newer weights
    are swapped in between two decoding steps (or, drain-then-swap, once the slots are
    empty); in ``conventional`` a round of ``steps_per_round`` batches starts once the last
    round is consumed, with one version of the weights. Either way no group starts before
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
        offset: int = 0,
        stride: int = 1,
    ) -> None:
        self.cfg, self.weights, self.sampler, self.task, self.rng, self.conn = cfg, weights, sampler, task, rng, conn
        self.groups: dict[int, _Group] = {}
        self.owner: dict[int, int] = {}  # slot -> the group its answer belongs to
        self.offset, self.stride = offset, stride  # this generator starts groups offset, offset + stride, ...
        self.next_group = offset
        self.rounds = 0  # conventional: rounds opened so far
        self.sent = 0
        self.issuing, self.left = -1, 0  # the group whose answers are being started, and how many are left to start
        self.round_left = 0  # conventional: groups of the current round not started yet
        self.slot_since: dict[int, int] = {}  # slot -> the sampler's swap count when its answer started
        self.probed = 0  # answers that saw a swap (gap probe)
        self.timeline = _Timeline()

    def start_groups(self, consumed: int) -> None:
        """Start what the regime and backpressure allow, given the groups the trainer has
        ``consumed`` (read *before* any weights are pulled: see "lag bound" in the module docstring)."""
        B = self.cfg.groups_per_batch
        if self.cfg.regime == "pipeline":
            if self.cfg.inflight:
                self._refill_free_slots(consumed)
            elif self.sampler.n_active == 0 or self.weights.version == self.sampler.version:
                self._refill_free_slots(consumed, pull=self.sampler.n_active == 0)
            # else drain-then-swap: newer weights wait, so nothing starts until the live answers end
        elif self.cfg.regime == "conventional":
            self._refill_round(consumed)
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
        live = int(self.sampler.pos[self.sampler.active].sum())
        if swap_in_newer_weights(self.weights, self.sampler, self.cfg.recompute_cache):
            if self.cfg.recompute_cache:
                self.timeline.recomputed_tokens += live
            t1 = time.perf_counter()
            self.timeline.busy(t0, t1)
            self.timeline.swap_seconds += t1 - t0
            self.timeline.swaps.append((t1, self.sampler.version))

    def _new_group(self) -> int:
        """Draw the next group's prompt; it starts with the sampler's current version. Group
        ``k``'s prompt depends on the seed and ``k`` alone, so every arm (one generator or
        several) trains on the same prompts in the same order."""
        k = self.next_group
        problem = self.task.sample(np.random.default_rng((self.cfg.seed, k)), 1)[0]
        self.groups[k] = _Group(problem, self.sampler.version)
        self.next_group += self.stride
        return k

    def _start(self, slot: int, k: int) -> None:
        self.sampler.start(slot, self.groups[k].problem.prompt)
        self.owner[slot] = k
        self.slot_since[slot] = self.sampler.swaps

    def _refill_free_slots(self, consumed: int, pull: bool = True) -> None:
        """``pipeline``: pull newer weights, then start an answer in every free slot, group after
        group, until backpressure holds the next group back."""
        if pull:
            self._pull()
        for slot in self.sampler.free_slots():
            if self.left == 0:
                if not may_start_group(self.next_group, consumed, self.cfg.lag_bound, self.cfg.groups_per_batch):
                    break  # backpressure
                self.issuing, self.left = self._new_group(), self.cfg.group_size
            self._start(slot, self.issuing)
            self.left -= 1

    def _refill_round(self, consumed: int) -> None:
        """``conventional``: once every group started so far is consumed, pull the newest
        weights and open a round of ``steps_per_round`` batches; fill free slots with the
        round's groups (continuous batching inside the round, no weight swap)."""
        cfg = self.cfg
        if self.round_left == 0 and self.left == 0:
            start = self.rounds * cfg.steps_per_round * cfg.groups_per_batch  # the round's first group
            if self.sampler.n_active or consumed < start:
                return  # the trainer has not consumed the last round yet
            self._pull()
            self.next_group = start + self.offset
            self.round_left = len(
                range(start + self.offset, start + cfg.steps_per_round * cfg.groups_per_batch, self.stride)
            )
            self.rounds += 1
        for slot in self.sampler.free_slots():
            if self.left == 0:
                if self.round_left == 0:
                    break
                if not may_start_group(self.next_group, consumed, cfg.lag_bound, cfg.groups_per_batch):
                    break  # cannot happen inside a round; kept so that the bound is checked the same way
                self.issuing, self.left = self._new_group(), cfg.group_size
                self.round_left -= 1
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
        swaps_then = self.slot_since.pop(slot)
        if self.cfg.gap_probe_every and self.sampler.swaps > swaps_then:  # weights changed during this answer
            self.probed += 1
            if self.probed % self.cfg.gap_probe_every == 0:
                gap = probe_cache_gap(self.sampler, slot, int(self.sampler.prompt_len[slot]))
                if gap.size:
                    g = self.timeline.gap
                    g[0], g[1], g[2] = g[0] + float(gap.sum()), g[1] + gap.size, max(g[2], float(gap.max()))
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
    cfg: PipelineConfig,
    weights: SharedWeights,
    counters: torch.Tensor,
    conn: Connection,
    stop: Any,
    go: Any,
    seed: int,
    index: int = 0,
) -> None:
    """The generator process ``index`` (of ``cfg.n_generators``, on core ``index``): decode,
    verify, send finished groups (see the module docstring and :class:`GroupGenerator`)."""
    child_setup(seed)
    _pin(cfg, index)
    task = CountdownTask(cfg.task, split=cfg.split)
    rng = np.random.default_rng(seed)
    model = TinyLM(cfg.lm)
    sampler = SlotSampler(model, cfg.n_slots // cfg.n_generators, EOS, torch.Generator().manual_seed(seed))
    sampler.version = weights.pull(model, -1)
    conn.send(("ready", os.getpid()))
    while not go.wait(cfg.poll_s):
        if stop.is_set():
            return
    generator = GroupGenerator(cfg, weights, sampler, task, rng, conn, offset=index, stride=cfg.n_generators)
    # conventional RL's engines wait out the trainer's whole turn on the cores it trains on:
    # poll gently there (a wake-up every 0.5 ms slowed its trainer); elsewhere the generator
    # has its core to itself and resumes within 0.5 ms of the trainer consuming
    idle = 0.002 if cfg.regime == "conventional" else 0.0005
    try:
        while not stop.is_set():
            generator.start_groups(int(counters[CONSUMED]))  # read before any pull: see "lag bound"
            if sampler.n_active == 0:
                time.sleep(idle)  # backpressure, or the trainer's turn: nothing may start yet
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
    arm_name: str = ""
    n_generators: int = 1
    recomputed_tokens: int = 0
    gap: tuple[float, float, float] = (0.0, 0.0, 0.0)
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

    @property
    def answers_per_second(self) -> float:
        """Answers the trainer consumed per second: unlike tokens/s, not inflated by longer answers."""
        return self.samples / self.seconds

    @property
    def answer_tokens(self) -> float:
        """Mean tokens per consumed answer (``<eos>`` included)."""
        return self.tokens / self.samples

    @property
    def generator_gap(self) -> float:
        """Mean ``|log mu - log pi_v|`` the generator's probe measured (``gap_probe_every``): the
        kept cache's error against a same-version recompute; NaN if nothing was probed."""
        return self.gap[0] / self.gap[1] if self.gap[1] else float("nan")

    def busy_fraction(self, who: str) -> float:
        """Fraction of the run's wall time ``who`` (``generator`` or ``trainer``) was computing
        (with several generators: the mean over them)."""
        spans = getattr(self, who)
        share = self.n_generators if who == "generator" else 1
        return sum(min(b, self.seconds) - a for a, b in spans if a < self.seconds) / self.seconds / share

    @property
    def generation_utilisation(self) -> float:
        """Busy fraction of the generator x the fraction of its slots doing useful work."""
        return self.busy_fraction("generator") * self.slot_occupancy

    def series(self, key: str) -> np.ndarray:
        return np.array([m[key] for m in self.metrics])

    @property
    def arm(self) -> str:
        """``sync``, ``one_step``, ``pipeline``, ``pipeline_no_is`` (no correction),
        ``pipeline_recompute`` (KV cache rebuilt after every in-flight update),
        ``pipeline_drain`` (drain-then-swap), ``conventional`` or ``colocated_sync``
        (:attr:`PipelineConfig.arm`)."""
        if self.arm_name:
            return self.arm_name
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
    recomputed_tokens: int = 0
    gap: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    busy_slot_steps: int = 0
    steps: int = 0
    snapshots: list[tuple[int, float, dict[str, torch.Tensor]]] = field(default_factory=list)

    def add_timeline(self, timeline: dict[str, Any]) -> None:
        """Add the generator's timeline that came with a group (:meth:`_Timeline.flush`)."""
        self.generator += [(a - self.t0, b - self.t0) for a, b in timeline["intervals"]]
        self.swaps += [(t - self.t0, v) for t, v in timeline["swaps"]]
        self.swap_seconds += timeline["swap_seconds"]
        self.recomputed_tokens += timeline["recomputed_tokens"]
        g = timeline["gap"]
        self.gap = [self.gap[0] + g[0], self.gap[1] + g[1], max(self.gap[2], g[2])]
        self.busy_slot_steps += timeline["busy_slot_steps"]
        self.steps += timeline["steps"]


class _LocalPipe:
    """The colocated generator's outbox: what a pipe would carry, kept in this process."""

    def __init__(self) -> None:
        self.messages: deque[tuple[Any, ...]] = deque()

    def send(self, message: tuple[Any, ...]) -> None:
        self.messages.append(message)

    def close(self) -> None:
        self.messages.clear()


class PipelineSystem(ChildProcessSystem):
    """A generator process and this process's trainer for one regime (or, ``colocated``, both
    in this process, taking turns); see the module docstring."""

    conn: Any  # the pipe from the generator process, or the colocated generator's _LocalPipe

    def __init__(self, config: PipelineConfig, init_flat: torch.Tensor) -> None:
        self.config = config
        self.events: list[str] = []
        self.model = TinyLM(config.lm)
        load_flat_parameters(self.model, init_flat)
        self.process: Any = None
        self.processes: list[Any] = []
        self.conns: list[Any] = []
        self.dp_conns: list[Any] = []  # to trainer ranks 1 .. dp_trainers - 1

    def start(self) -> None:
        """Share the weights, start the generator and wait until it is ready (colocated: make
        the generator here; it samples with its own copy of the weights, as an engine does)."""
        cfg = self.config
        if cfg.colocated:
            self._begin("spawn", __name__)  # marks the system started; no child process
            self.weights = SharedWeights(self.model)
            self.counters = torch.zeros(1, dtype=torch.int64)
            self.conn = _LocalPipe()
            seed = cfg.seed * 1000 + 1
            sampler = SlotSampler(TinyLM(cfg.lm), cfg.n_slots, EOS, torch.Generator().manual_seed(seed))
            sampler.version = self.weights.pull(sampler.model, -1)
            task = CountdownTask(cfg.task, split=cfg.split)
            self.local = GroupGenerator(cfg, self.weights, sampler, task, np.random.default_rng(seed), self.conn)
            atexit.register(self.stop)
            return
        ctx = self._begin(cfg.start_method, __name__)
        self.weights = SharedWeights(self.model)
        self.counters = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._stop, self._go = SharedFlag(ctx), SharedFlag(ctx)
        self.conns, self.processes, child_ends = [], [], []
        for i in range(cfg.n_generators):
            conn, child_end = ctx.Pipe(duplex=False)
            self.conns.append(conn)
            child_ends.append(child_end)
            self.processes.append(
                ctx.Process(
                    target=generator_main,
                    name=f"generator-{i}" if cfg.n_generators > 1 else "generator",
                    daemon=True,
                    args=(
                        cfg,
                        self.weights,
                        self.counters,
                        child_end,
                        self._stop,
                        self._go,
                        cfg.seed * 1000 + 1 + i,
                        i,
                    ),
                )
            )
        n_params = sum(p.numel() for p in self.model.parameters())
        self.dp_grad = torch.zeros(max(cfg.dp_trainers - 1, 1), n_params).share_memory_()
        for rank in range(1, cfg.dp_trainers):
            conn, child_end = ctx.Pipe(duplex=True)
            self.dp_conns.append(conn)
            child_ends.append(child_end)
            self.processes.append(
                ctx.Process(
                    target=dp_trainer_main,
                    name=f"trainer-{rank}",
                    daemon=True,
                    args=(cfg, self.weights, self.dp_grad[rank - 1], child_end, self._stop, rank),
                )
            )
        self.conn, self.process = self.conns[0], self.processes[0]
        atexit.register(self.stop)
        try:
            for process, child_end in zip(self.processes, child_ends):
                process.start()
                child_end.close()
            for _ in range(cfg.n_generators):
                message = self._recv(cfg.stall_timeout_s, "the generator to start")
                assert message[0] == "ready"
            for conn in self.dp_conns:
                message = self._recv(cfg.stall_timeout_s, "a trainer rank to start", [conn])
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
        if self.config.colocated:
            self.conn.close()
            self.events.append("stop: colocated, no process to stop")
            return
        # a flag without a lock (SharedFlag): a generator SIGKILLed while reading it cannot wedge
        # set(); an mp.Event's lock could (a clean-clone CI run once hung so)
        self._stop.set()
        started = [p for p in getattr(self, "processes", []) if p.pid is not None]
        if started:
            names = ["the generator"] if len(started) == 1 else [p.name.replace("-", " ") for p in started]
            self.events += stop_processes(list(zip(names, started)), self.config.join_timeout_s)
            for process in started:
                process.close()
        for conn in getattr(self, "conns", []) + getattr(self, "dp_conns", []):
            conn.close()
        self.events.append("stop: the generator process exited")

    def _check_children(self) -> None:
        """Raise :class:`PipelineFault` (after a clean shutdown) if a child process has died."""
        for process in self.processes:
            if not process.is_alive():
                process.join()
                who = "trainer rank" if process.name.startswith("trainer") else "generator"
                message = f"{who} (pid {process.pid}) died: {exit_reason(process.exitcode)}"
                self.events.append(message + "; shutting down")
                self.stop()
                raise PipelineFault(message + " (clean shutdown)")

    def _recv(self, timeout: float, what: str, conns: list[Any] | None = None) -> tuple[Any, ...]:
        """The next message on ``conns`` (default: the generators'), waiting at most ``timeout`` s
        in ``poll_s`` slices, checking every child process."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready: list[Any] = wait(self.conns if conns is None else conns, self.config.poll_s)
            for conn in ready:
                try:
                    return tuple(conn.recv())
                except (EOFError, OSError):
                    pass
            self._check_children()
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
        if cfg.dp_trainers > 1:  # rank 0 of the data-parallel trainer: core 0, one thread
            torch.set_num_threads(1)
            previous_cores = _pin(cfg, 0)
        elif cfg.colocated or cfg.n_generators > 1:  # generation and training take turns on the two cores
            previous_cores = _pin_two(cfg)
            torch.set_num_threads(2)
        else:
            torch.set_num_threads(1)
            previous_cores = _pin(cfg, 1)
        torch.manual_seed(cfg.seed)
        opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        if not cfg.colocated:
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
        cfg = self.config
        B = cfg.groups_per_batch
        wanted = range(u * B, (u + 1) * B)
        if cfg.n_generators > 1 and u % cfg.steps_per_round == 0:  # wait for the whole round: the
            wanted = range(u * B, (u + cfg.steps_per_round) * B)  # engines' cores train only after it
        while any(k not in run.received for k in wanted):
            missing = min(set(wanted) - set(run.received))
            if self.config.colocated:
                _kind, k, payload, timeline = self._generate_here(f"group {missing}")
            else:
                _kind, k, payload, timeline = self._recv(self.config.stall_timeout_s, f"group {missing}")
            run.received[k] = payload
            run.add_timeline(timeline)
        return [run.received.pop(k) for k in range(u * B, (u + 1) * B)]

    def _generate_here(self, what: str) -> tuple[Any, ...]:
        """Colocated: decode in this process until the generator sends a group; the trainer
        waits meanwhile, as conventional RL's training does while all the hardware generates."""
        deadline = time.monotonic() + self.config.stall_timeout_s
        while not self.conn.messages:
            self.local.start_groups(int(self.counters[CONSUMED]))
            if self.local.sampler.n_active == 0:
                raise PipelineFault(f"the colocated generator has nothing to decode while the trainer waits for {what}")
            self.local.decode_step()
            if time.monotonic() > deadline:
                raise PipelineFault(f"waited {self.config.stall_timeout_s:g} s for {what}")
        return self.conn.messages.popleft()

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
            slot_occupancy=run.busy_slot_steps / max(run.steps * (cfg.n_slots // cfg.n_generators), 1),
            n_generators=cfg.n_generators,
            events=list(self.events),
            swap_seconds=run.swap_seconds,
            correction=cfg.correction,
            recompute_cache=cfg.recompute_cache,
            arm_name=cfg.arm,
            recomputed_tokens=run.recomputed_tokens,
            gap=(run.gap[0], run.gap[1], run.gap[2]),
            final_state=_state_copy(self.model),
            snapshots=run.snapshots,
        )

    def _send_shares(self, u: int, part: dict[str, torch.Tensor], shares: list[torch.Tensor], n_real: float) -> None:
        """Send trainer ranks 1, 2, .. their ``shares`` of update ``u``'s batch ``part``."""
        for r, (conn, rows) in enumerate(zip(self.dp_conns, shares), start=1):
            try:
                conn.send(("batch", u, {k: v[rows].numpy() for k, v in part.items()}, n_real))
            except OSError:  # a dead rank's pipe; name it (BrokenPipeError is an OSError)
                deadline = time.monotonic() + self.config.join_timeout_s
                while time.monotonic() < deadline:
                    self._check_children()
                    time.sleep(self.config.poll_s)
                self.stop()
                raise PipelineFault(f"could not send update {u}'s share to trainer rank {r} (clean shutdown)") from None

    def _add_shares(self, log_ratio: np.ndarray, gaps: np.ndarray, loss: float) -> tuple[np.ndarray, np.ndarray, float]:
        """Wait for every other trainer rank's gradient and add it to this model's (an all-reduce
        of the ranks, through shared memory); returns the metrics with theirs added."""
        for r, conn in enumerate(self.dp_conns, start=1):
            _kind, ratio_r, gaps_r, loss_r = self._recv(self.config.stall_timeout_s, f"trainer rank {r}", [conn])
            offset = 0
            for p in self.model.parameters():
                size = p.numel()
                theirs = self.dp_grad[r - 1, offset : offset + size].view_as(p)
                p.grad = theirs.clone() if p.grad is None else p.grad + theirs
                offset += size
            log_ratio, gaps = np.concatenate([log_ratio, ratio_r]), np.concatenate([gaps, gaps_r])
            loss += loss_r
        return log_ratio, gaps, loss

    def _update(
        self, u: int, groups: list[dict[str, Any]], opt: torch.optim.Optimizer, lags: list[np.ndarray]
    ) -> dict[str, float]:
        """One trainer step at version ``u`` on ``groups`` (07.1-07.4); publishes version ``u + 1``.

        With ``dp_trainers`` ranks, each rank takes a share of the batch's length-sorted chunks
        (:func:`balanced_shares`); the other ranks' gradients are added to this one's before the
        step (:func:`dp_trainer_main`)."""
        cfg = self.config
        t0 = time.perf_counter()
        batch = pad_groups(groups)
        mask = batch["mask"]
        lag = token_lags(u, batch["versions"].numpy(), mask.numpy())
        if lag.max() > cfg.lag_bound:
            self.events.append(f"update {u}: a token lags {int(lag.max())} > bound {cfg.lag_bound}")
        lags.append(lag[mask.numpy()])
        part = {
            "tokens": batch["tokens"],
            "logp": batch["logp"],
            "adv": group_token_advantages(batch["rewards"], mask),
            "mask": mask,
            "fresh": torch.as_tensor(lag == 0) & mask,  # sampled by exactly the weights the trainer holds
        }
        n_real = float(mask.sum())
        shares = balanced_shares(mask, cfg.train_chunk, cfg.dp_trainers)
        self._send_shares(u, part, shares[1:], n_real)  # data parallel: the other ranks compute meanwhile
        mine = shares[0]
        opt.zero_grad()
        t1 = time.perf_counter()
        loss, log_ratio, gaps = batch_share_loss(self.model, {k: v[mine] for k, v in part.items()}, n_real, cfg)
        t2 = time.perf_counter()
        log_ratio, gaps, loss = self._add_shares(log_ratio, gaps, loss)  # their gradients, summed into ours
        t3 = time.perf_counter()
        opt.step()
        self.weights.publish(self.model, u + 1)
        self.counters[CONSUMED] = (u + 1) * cfg.groups_per_batch  # after publishing: see "lag bound"
        t4 = time.perf_counter()
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
            "loss": float(loss),
            # seconds of this step: preparing the batch (and sending the other ranks' shares),
            # this rank's share, waiting for and adding the others', the optimizer step and publish
            "t_prepare": t1 - t0,
            "t_share": t2 - t1,
            "t_others": t3 - t2,
            "t_step": t4 - t3,
        }


def balanced_shares(mask: torch.Tensor, chunk: int, n: int) -> list[torch.Tensor]:
    """The rows of a batch for each of ``n`` trainer ranks: the rows sorted by answer length,
    cut into chunks of ``chunk`` (as :func:`batch_share_loss` cuts them), the chunks dealt
    out longest first in a snake order (ranks 0, 1, .., n - 1, n - 1, .., 0, 0, ..), so that
    every rank gets as many chunks as the others, give or take one, and its share of the
    long tail. (A chunk's cost is mostly per forward pass at this size, so rows dealt out one
    by one, or chunks weighed by their padded tokens alone, leave one rank the slower.)"""
    ends = mask.shape[1] - mask.flip(1).float().argmax(1)
    chunks = sorted(torch.argsort(ends, stable=True).split(chunk), key=lambda c: -int(ends[c].max()))
    shares: list[list[torch.Tensor]] = [[] for _ in range(n)]
    for i, c in enumerate(chunks):
        r = i % n if (i // n) % 2 == 0 else n - 1 - i % n
        shares[r].append(c)
    return [torch.cat(s) if s else torch.zeros(0, dtype=torch.long) for s in shares]


def batch_share_loss(
    model: TinyLM, part: dict[str, torch.Tensor], n_real: float, cfg: PipelineConfig
) -> tuple[float, np.ndarray, np.ndarray]:
    """Backpropagate the loss of a share of a batch (rows ``tokens``, ``logp``, ``adv``,
    ``mask``, ``fresh``), over chunks of similar length, each padded only to its own longest
    (07.2): the same gradient as the whole batch's loss restricted to these rows, without
    computing the long tail's padding. Token means are over ``n_real``, the *whole* batch's
    tokens, so that the shares' gradients sum to the batch's. Returns ``(this share's loss,
    its log-ratios log pi - log mu, |log-ratio| of its lag-0 tokens)``."""
    mask = part["mask"]
    if len(mask) == 0:  # a rank with no share this update (fewer chunks than ranks)
        return 0.0, np.zeros(0, np.float32), np.zeros(0, np.float32)
    ends = mask.shape[1] - mask.flip(1).float().argmax(1)
    loss, ratios, fresh_gaps = 0.0, [], []
    for rows in torch.argsort(ends, stable=True).split(cfg.train_chunk):
        n_t = int(ends[rows].max())
        m = mask[rows, :n_t]
        logp_new = sequence_logprobs(model, part["tokens"][rows, :n_t])
        behaviour = part["logp"][rows, :n_t]
        chunk = pipeline_loss(logp_new, behaviour, part["adv"][rows, :n_t], m, cfg.clip_c, cfg.correction)
        chunk = chunk * m.sum() / n_real
        chunk.backward()  # per chunk: only one chunk's activations are alive at a time
        loss += float(chunk.detach())
        log_ratio = logp_new.detach() - behaviour
        ratios.append(log_ratio[m])
        fresh_gaps.append(log_ratio[part["fresh"][rows, :n_t]].abs())
    return loss, torch.cat(ratios).numpy(), torch.cat(fresh_gaps).numpy()


def dp_trainer_main(
    cfg: PipelineConfig, weights: SharedWeights, grad: torch.Tensor, conn: Connection, stop: Any, rank: int
) -> None:
    """Trainer rank ``rank`` of ``cfg.dp_trainers`` (conventional RL with engines; core
    ``rank``, one torch thread): for each batch share it is sent, load the weights of the
    update it belongs to, backpropagate the share's loss (:func:`batch_share_loss`), write the
    gradient into ``grad`` (shared memory) and reply; rank 0 adds it and steps."""
    child_setup(cfg.seed * 1000 + 500 + rank)
    _pin(cfg, rank)
    model = TinyLM(cfg.lm)
    params = list(model.parameters())
    version = weights.pull(model, -1)
    conn.send(("ready", os.getpid()))
    try:
        while not stop.is_set():
            if not conn.poll(cfg.poll_s):
                continue
            _kind, u, part, n_real = conn.recv()
            deadline = time.monotonic() + cfg.stall_timeout_s
            while version < u:  # rank 0 published version u before sending update u's share
                version = weights.pull(model, version)
                if version < u and (stop.is_set() or time.monotonic() > deadline):
                    return
            for p in params:
                p.grad = None
            loss, ratios, gaps = batch_share_loss(model, {k: torch.from_numpy(v) for k, v in part.items()}, n_real, cfg)
            torch.cat([(torch.zeros_like(p) if p.grad is None else p.grad).flatten() for p in params], out=grad)
            conn.send(("grad", ratios, gaps, loss))
    except QUIET_EXIT:
        pass
