"""A discrete-event simulator of an async-RL cluster layout (lesson 08), built on SimPy.

The analytic model (:mod:`course_lib.layout.model`) predicts the throughput of a layout from
steady-state rates; this module *runs* the same system, one decode step at a time, so
the model can be checked where its assumptions hold and trusted less where they do
not (length tails, stragglers, start-up, backpressure). Both follow the lesson's shared
semantics; the rules below are the ones this simulator implements.

The system::

    decode step of an engine (08.3):  l = max(a_s + b_s * B + r_s * R,  f_s * (B + P * sum 1/L))   seconds
    optimizer step on a batch of G generated tokens:      T = G / (n_trainers * c) seconds
    weights of version v + 1 reach the samplers:          weight_sync_s after step v ends
    lag of a sample = (trainer version when it is consumed) - (version it started with)

with ``B`` sequences running in the step, ``R`` KV tokens resident (every running sequence
holds its ``P = prompt_tokens`` prompt tokens plus the tokens it has generated so far: 0 at
its first step) and the prompts' prefill spread over the answers (chunked prefill: a running
sequence of ``L`` answer tokens carries ``P / L`` prompt tokens of compute into each of its
steps, so the sum runs over the running sequences). With ``r_s = f_s = 0`` the step is
linear, ``l(B) = a_s + b_s * B``.

* **Sampler engine** (one per sampler GPU): continuous batching with at most
  ``max_batch`` sequences in flight. Each decode step takes ``l`` and gives every
  in-flight sequence one token; a sequence of length ``L`` finishes after ``L`` decode
  steps and goes to the sample queue (a :class:`simpy.FilterStore`). Free slots are
  refilled at step boundaries, if the layout's admission rule lets a new sequence start.
  An engine never creates per-token objects: it keeps a heap of finish steps (O(log B)
  per finished sequence) and the count and sum of the start steps of its running
  sequences, so ``R = B (P + t) - sum(start steps)`` at step ``t`` is O(1) per decode
  step besides the SimPy event (as the model's ``_step_clock_s``).
* **Trainer** (all trainer GPUs, data parallel): takes ``batch_samples`` finished
  samples, trains for ``T`` seconds, increments the version, then syncs the weights.
  With ``sync_blocks_trainer=True`` the trainer GPUs are busy sending the weights for
  ``weight_sync_s`` (a ``"sync"`` interval) before they can start the next step; with
  ``False`` the sync is a pure delay on the samplers' side. The default (``None``)
  follows the lesson's formulas: blocking for the synchronous layouts and ``one_step``
  (step = max(generation, training + sync)), non-blocking for ``pipeline``
  (throughput = min(production, consumption), no sync term). For the synchronous
  layouts the choice does not change anything: the samplers wait for the weights and
  the trainer waits for the samplers.

Admission (who may start a new sequence, and with which weights):

* ``"sync_colocated"`` / ``"sync_split"``: batch ``k`` is dealt evenly to the engines
  (engine ``e`` gets ``batch_samples // n_engines``, plus one if ``e < batch_samples %
  n_engines``) and generated with version ``k``, so it starts only once version ``k``
  has reached the samplers. The trainer waits for the batch's last sample (the
  straggler). Colocated: the same ``n_gpus`` GPUs generate, then train, then sync.
* ``"one_step"``: batch ``k`` is generated with version ``max(k - 1, 0)``; an engine
  starts it once it has started all of its share of batch ``k - 1`` and that version
  has arrived, so generation of batch ``k + 1`` overlaps training on batch ``k``. The
  trainer consumes batch ``k`` (exactly its samples) at version ``k``: lag 1 after the
  first batch.
* ``"pipeline"`` (in-flight weight updates: a running sequence keeps generating across
  updates, its lag counts from its start version ``s``). Backpressure (R1)::

      start a new sequence only while  n_started - n_dropped - s_vis * batch_samples < (max_lag + 1) * batch_samples

  with ``s_vis`` the version the samplers hold. ``s_vis * batch_samples`` is the number
  of samples consumed by the optimizer steps whose weights the samplers have received:
  what a sampler can know about consumption. (Counting a batch as consumed as soon as
  the trainer takes it would let ``max_lag = 0`` start the next batch during training,
  at lag 1.) ``max_lag`` may be fractional (verl's ``staleness_threshold``: ``0.5`` holds
  at most 1.5 batches) or ``math.inf`` (no window: the engines stay full; ``"fifo"``
  only). With ``max_lag = 0`` the pipeline is the synchronous layout (generate a batch,
  train on it) under every rule. With (R1) every sample that starts at version ``s`` is
  one of the first ``(s + max_lag + 1) * batch_samples`` samples ever started (dropped
  ones aside). With equal lengths samples finish in start order and (R1) alone bounds
  the lag by ``max_lag``; with unequal lengths a long sample can be overtaken. What the
  trainer does about it is ``admission`` (the model's section 7); the hard rules bound
  every consumed sample's lag by ``floor(max_lag)`` and need ``max_lag >= 1`` (or 0):

  - ``"fifo"``: the trainer takes the oldest finished samples first come, first served
    and never waits for a straggler, whose lag can exceed ``max_lag`` ((R1) then bounds
    only the typical lag).
  - ``"wait"`` (a hard bound by waiting): the trainer takes the sample with the oldest
    start version first whenever (R2) requires it::

        need_w = #{unconsumed samples with s + floor(max_lag) <= w} - (w - v) * batch_samples  for w >= v

    (at trainer version ``v``: if ``need_w > 0`` for some ``w``, the next pick must have a
    deadline ``s + floor(max_lag) <= w``, and the oldest does). If that sample is still
    being generated the trainer waits for it. (R1) guarantees ``need_w <= batch_samples``
    when its window is ``(floor(max_lag) + 1)`` batches, so under ``"wait"`` the window
    is that (a fractional part would start more samples at a version than the updates up
    to their deadline can consume); the lag never exceeds ``floor(max_lag)``, and the
    price is that the trainer can wait for a straggler.
  - ``"drop"`` (a hard bound by refusing): the trainer is FIFO, but before each pick for
    update ``v`` every unconsumed sample with ``s + floor(max_lag) < v`` is dropped: a
    finished one is removed from the queue, a running one is aborted (its slot frees at
    its engine's next step boundary; the tokens of the step in progress count as
    generated, and all its tokens are wasted). A sample taken from the queue that is
    already too old (possible when the weights reach the samplers late) is dropped too.
    Dropped samples are never consumed; they leave the (R1) window at once (the trainer
    aborts them, so the samplers know), which wakes idle engines. The window stays
    ``(max_lag + 1)`` batches.

  Load balance (R3, ``balance_engines=True``, the default): an engine admits a sequence
  only while it holds fewer than its fair share, ``ceil((in flight + admissible) /
  n_engines)``, as a least-loaded router would. Without it the first engines to reach a
  step boundary fill up to ``max_batch`` and the others idle, which matters when the lag
  bound admits fewer sequences than all engines could hold (the model's eq. 08.11 spreads
  them evenly).

Statistics are taken over the measured steps ``warmup_steps + 1 .. n_steps``: the
window runs from the end of optimizer step ``warmup_steps`` (time 0 if none) to the
end of step ``n_steps`` (the end of a step = the end of its training), so every
measured step holds one generation, one training and one sync.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import simpy
from numpy.typing import NDArray

from course_lib.layout.model import ADMISSIONS, LAYOUTS, Admission, Layout, SystemSpec

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LengthSampler = Callable[[np.random.Generator], int]
_Proc = Generator[simpy.Event, Any, None]

#: Colours of the Gantt chart's interval kinds.
KIND_COLOURS = {"decode": "#4a86e8", "train": "#e69138", "sync": "#6aa84f", "idle": "#e6e6e6"}


@dataclass(frozen=True)
class SimConfig:
    """One layout to simulate; times in seconds, rates in generated tokens per second.

    ``lengths`` is either a callable ``rng -> int`` (called once per sample with a
    :class:`numpy.random.Generator` seeded by ``seed``) or a sequence of answer lengths
    in tokens that samples draw from uniformly (``(L,)``: every answer has ``L`` tokens).
    For the split layouts give ``n_samplers`` (``n_trainers`` defaults to the rest of
    ``n_gpus``); for ``"sync_colocated"`` both are ``n_gpus``. ``r_s``, ``f_s`` and
    ``prompt_tokens`` make the decode step (08.3) (0: linear); ``admission`` is the
    pipeline's rule for stragglers (``"fifo"``, ``"wait"`` or ``"drop"``, module docstring).
    """

    layout: Layout
    n_gpus: int
    n_samplers: int | None = None
    n_trainers: int | None = None
    batch_samples: int = 64
    max_batch: int = 32
    a_s: float = 0.01
    b_s: float = 0.0005
    train_tokens_per_s_per_gpu: float = 5000.0
    weight_sync_s: float = 0.0
    max_lag: float = 1
    n_steps: int = 20
    warmup_steps: int = 2
    lengths: Sequence[int] | NDArray[np.integer] | LengthSampler = (256,)
    seed: int = 0
    sync_blocks_trainer: bool | None = None
    admission: Admission = "fifo"
    balance_engines: bool = True
    r_s: float = 0.0
    f_s: float = 0.0
    prompt_tokens: float = 0.0
    timeline_max_intervals: int = 20_000

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        _check_int("n_gpus", self.n_gpus, 1)
        if self.layout == "sync_colocated":
            for name in ("n_samplers", "n_trainers"):
                value = getattr(self, name)
                if value is not None and value != self.n_gpus:
                    raise ValueError(
                        f"{name}={value}: in 'sync_colocated' all n_gpus={self.n_gpus} GPUs both sample and "
                        f"train; leave {name} unset (None)"
                    )
            object.__setattr__(self, "n_samplers", self.n_gpus)
            object.__setattr__(self, "n_trainers", self.n_gpus)
        else:
            if self.n_gpus < 2:
                raise ValueError(f"n_gpus={self.n_gpus}: layout {self.layout!r} needs >= 2 GPUs (samplers + trainers)")
            ns, nt = self.n_samplers, self.n_trainers
            if ns is None and nt is None:
                raise ValueError(f"layout {self.layout!r} splits the GPUs: give n_samplers (and/or n_trainers)")
            ns = self.n_gpus - nt if ns is None and nt is not None else ns
            nt = self.n_gpus - ns if nt is None and ns is not None else nt
            assert ns is not None and nt is not None
            _check_int("n_samplers", ns, 1)
            _check_int("n_trainers", nt, 1)
            if ns + nt != self.n_gpus:
                raise ValueError(
                    f"n_samplers={ns} + n_trainers={nt} must equal n_gpus={self.n_gpus} (every GPU has one role)"
                )
            object.__setattr__(self, "n_samplers", ns)
            object.__setattr__(self, "n_trainers", nt)
        _check_int("batch_samples", self.batch_samples, 1)
        _check_int("max_batch", self.max_batch, 1)
        ml = self.max_lag
        if isinstance(ml, bool) or not isinstance(ml, int | float | np.integer | np.floating) or not ml >= 0:
            raise ValueError(f"max_lag must be a number >= 0 (optimizer steps; math.inf: no window), got {ml!r}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {self.admission!r}")
        if self.admission != "fifo" and math.isinf(ml):
            raise ValueError(
                f"max_lag=inf with admission={self.admission!r}: a hard rule needs a finite max_lag to bound lags "
                "by; use admission='fifo' for no window"
            )
        if self.admission != "fifo" and 0 < ml < 1:
            raise ValueError(
                f"max_lag={ml!r} with admission={self.admission!r}: the hard rules bound every lag by "
                f"floor(max_lag) = 0, which is synchronous RL (max_lag=0); use max_lag >= 1, or "
                "admission='fifo' for a fractional window"
            )
        _check_int("n_steps", self.n_steps, 1)
        _check_int("warmup_steps", self.warmup_steps, 0)
        _check_int("timeline_max_intervals", self.timeline_max_intervals, 0)
        if self.warmup_steps >= self.n_steps:
            raise ValueError(
                f"warmup_steps={self.warmup_steps} must be < n_steps={self.n_steps}: at least one step is measured"
            )
        for name in ("a_s", "b_s", "weight_sync_s", "r_s", "f_s", "prompt_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                unit = "tokens" if name == "prompt_tokens" else "seconds"
                raise ValueError(f"{name} must be a finite number >= 0 ({unit}), got {value!r}")
        if self.a_s + self.b_s + self.f_s <= 0:
            raise ValueError(
                "a_s + b_s + f_s must be > 0: a decode step max(a_s + b_s B + r_s R, f_s (B + P S)) must take time"
            )
        c = self.train_tokens_per_s_per_gpu
        if not (isinstance(c, int | float) and math.isfinite(c) and c > 0):
            raise ValueError(f"train_tokens_per_s_per_gpu must be a finite number > 0, got {c!r}")
        if not callable(self.lengths):
            try:
                arr = np.asarray(self.lengths)
            except Exception as exc:  # pragma: no cover - numpy rejects ragged input
                raise ValueError(f"lengths must be a callable rng -> int or a sequence of ints: {exc}") from exc
            if arr.ndim != 1 or arr.size == 0:
                raise ValueError(f"lengths must be a non-empty 1-D sequence of answer lengths, got shape {arr.shape}")
            whole = np.issubdtype(arr.dtype, np.integer) or (
                np.issubdtype(arr.dtype, np.floating) and bool(np.all(arr == np.round(arr)))
            )
            if not whole:
                raise ValueError(f"lengths must be whole numbers of tokens, got dtype {arr.dtype}")
            if np.any(arr < 1):
                raise ValueError(f"every answer length must be >= 1 token, got min {arr.min()}")
            object.__setattr__(self, "lengths", tuple(int(x) for x in arr))
        if self.sync_blocks_trainer is None:  # the spec's formulas: (+ sync) in one_step, none in pipeline
            object.__setattr__(self, "sync_blocks_trainer", self.layout != "pipeline")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer):
            raise ValueError(f"seed must be an int, got {self.seed!r}")

    @property
    def n_engines(self) -> int:
        """Sampler engines (one per sampler GPU)."""
        assert self.n_samplers is not None
        return self.n_samplers

    @property
    def n_train_gpus(self) -> int:
        """GPUs the optimizer step is data-parallel over."""
        assert self.n_trainers is not None
        return self.n_trainers

    @property
    def lag_bound(self) -> int:
        """``floor(max_lag)``: the lag every consumed sample keeps under ``"wait"`` and ``"drop"``."""
        return sys.maxsize if math.isinf(self.max_lag) else math.floor(self.max_lag + 1e-9)

    @property
    def linear_step(self) -> bool:
        """Whether the decode step is ``a_s + b_s * B`` (``r_s = f_s = 0``)."""
        return self.r_s == 0 and self.f_s == 0

    def decode_step_s(self, in_flight: int, resident_tokens: float = 0.0, prefill_tokens: float = 0.0) -> float:
        """(08.3): seconds of one decode step with ``B = in_flight`` sequences running,
        ``R = resident_tokens`` KV tokens resident and ``S = starting`` sequences started at
        this step boundary: ``max(a_s + b_s B + r_s R, f_s (B + P S))`` (``a_s + b_s B`` when
        ``r_s = f_s = 0``)."""
        memory_s = self.a_s + self.b_s * in_flight
        if self.linear_step:
            return memory_s
        memory_s += self.r_s * resident_tokens
        return max(memory_s, self.f_s * (in_flight + prefill_tokens))


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


class Interval(NamedTuple):
    """One bar of the Gantt chart: ``role`` ("sampler", "trainer" or "gpu" when colocated)."""

    role: str
    resource_index: int
    start_s: float
    end_s: float
    kind: str


@dataclass(frozen=True, eq=False)
class SimResult:
    """What :func:`simulate` measured (fractions and rates over the measured steps).

    Per-sample arrays are indexed by sample id (start order); ``consumed_version`` is -1
    for samples not consumed when the run stopped, ``dropped_version`` -1 for samples not
    dropped (else the trainer version that dropped them: ``"drop"`` only). Every sample
    started is consumed, dropped, or still unconsumed at the end (running or queued).
    """

    config: SimConfig
    tokens_per_s: float  # generated tokens consumed per second, measured steps
    step_s: float  # mean seconds per measured optimizer step
    measured_s: float  # length of the measured window (seconds)
    measured_tokens: int  # generated tokens consumed in the measured steps
    step_end_s: NDArray[np.float64]  # when each optimizer step's training ended
    lags: NDArray[np.int64]  # per consumed sample of the measured steps, in consumption order
    lag_mean: float
    lag_max: int
    sampler_busy_frac: float  # decoding (mean over engines)
    sampler_idle_frac: float  # neither decoding, training nor syncing
    sampler_mean_in_flight: float  # time-weighted mean B while decoding
    trainer_busy_frac: float  # training
    trainer_sync_frac: float  # sending weights (0 unless sync_blocks_trainer)
    trainer_idle_frac: float  # waiting for samples (colocated: neither decoding, training nor syncing)
    n_decode_steps: int  # all engines, the whole run
    decoded_tokens: int  # sum of B over all decode steps, the whole run
    n_started: int
    n_finished: int  # samples whose last token was generated (a dropped one too, if it got there)
    n_consumed: int
    n_dropped: int  # samples dropped by the "drop" rule (never consumed)
    dropped_tokens: int  # tokens generated for the dropped samples: wasted decode work
    consumed_ids: NDArray[np.int64]  # sample ids in the order the trainer took them
    sample_lengths: NDArray[np.int64]
    sample_start_version: NDArray[np.int64]
    sample_consumed_version: NDArray[np.int64]
    sample_progress_tokens: NDArray[np.int64]  # tokens generated so far (= length when finished)
    sample_dropped_version: NDArray[np.int64]  # trainer version that dropped the sample, -1 if not
    version_visible_s: NDArray[np.float64]  # [k - 1]: when version k reached the samplers
    timeline: list[Interval] = field(repr=False)
    timeline_end_s: float = 0.0  # the timeline (idle gaps included) covers [0, timeline_end_s]
    timeline_truncated: bool = False


class _Sample:
    __slots__ = ("batch", "length", "sid", "start_version")

    def __init__(self, sid: int, start_version: int, batch: int, length: int) -> None:
        self.sid = sid
        self.start_version = start_version
        self.batch = batch
        self.length = length


def _has_version(version: int, sample: _Sample) -> bool:
    return sample.start_version == version


class _Lengths:
    """Draws answer lengths from the config's sampler, in sample start order."""

    def __init__(self, cfg: SimConfig) -> None:
        self.rng = np.random.default_rng(int(cfg.seed))
        src = cfg.lengths
        self.fn: LengthSampler | None = src if callable(src) else None
        self.table = np.asarray(src if not callable(src) else (1,), dtype=np.int64)
        self.buf: list[int] = []

    def draw(self) -> int:
        if self.fn is not None:
            n = self.fn(self.rng)
            if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
                raise ValueError(f"the lengths callable must return an int >= 1 (tokens), got {n!r}")
            return int(n)
        if len(self.table) == 1:
            return int(self.table[0])
        if not self.buf:
            self.buf = self.table[self.rng.integers(0, len(self.table), size=4096)][::-1].tolist()
        return self.buf.pop()


class _Sim:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.env = simpy.Environment()
        self.queue: simpy.FilterStore = simpy.FilterStore(self.env)
        self.done = self.env.event()
        self.version = 0  # trainer's version (optimizer steps completed)
        self.visible = 0  # version the samplers hold
        self.wake_event = self.env.event()  # succeeds (and is replaced) when a version arrives or samples drop
        self.version_visible_s: list[float] = []
        self.lengths = _Lengths(cfg)
        self.samples: list[_Sample] = []
        self.start_step: list[int] = []
        self.engine_of: list[int] = []
        self.finished: list[bool] = []
        self.consumed_version: list[int] = []
        self.consumed_ids: list[int] = []
        self.lags: list[int] = []
        self.step_end_s: list[float] = []
        self.unconsumed_by_version: dict[int, int] = {}
        self.n_finished = 0
        # pipeline window (R1) in batches: None = no window; "wait" needs whole batches (module docstring)
        ml = cfg.max_lag
        self.window: float | None = None if math.isinf(ml) else (cfg.lag_bound if cfg.admission == "wait" else ml) + 1
        # the "drop" rule
        self.drop = cfg.layout == "pipeline" and cfg.admission == "drop"
        self.dropped_version: list[int] = []
        self.n_dropped = 0
        self.ids_by_version: dict[int, list[int]] = {}  # "drop" only: sample ids by start version
        self.abort_pending: list[list[int]] = [[] for _ in range(cfg.n_engines)]  # dropped while running
        self.abort_progress: dict[int, int] = {}  # aborted sample -> tokens generated when its slot freed
        self.n_aborted = 0  # aborted samples whose slots have been freed
        ne = cfg.n_engines
        self.colocated = cfg.layout == "sync_colocated"
        # sync / one_step: engine e's share of every batch, and the batch it is working on
        self.quota = [cfg.batch_samples // ne + (1 if e < cfg.batch_samples % ne else 0) for e in range(ne)]
        self.next_batch = [0] * ne
        self.left_in_batch = list(self.quota)
        # engine accounting (whole run) and the step in progress
        self.eng_steps = [0] * ne
        self.eng_tokens = [0] * ne
        self.eng_busy = [0.0] * ne
        self.eng_bdt = [0.0] * ne
        self.eng_cur = [(0.0, 0.0, 0)] * ne  # (start, dt, B) of the decode step in progress
        self.eng_step_now = [0] * ne
        self.open_since: list[float | None] = [None] * ne  # start of each engine's open decode bar
        # trainer accounting: cumulative train / sync seconds and the activity in progress
        self.tr_train = 0.0
        self.tr_sync = 0.0
        self.tr_cur = ("", 0.0, 0.0)  # (kind, start, dt)
        self.snapshots: list[tuple[float, list[float], list[float], float, float]] = []
        # timeline
        self.timeline: list[Interval] = []
        self.timeline_stop_s: float | None = None
        self.sampler_role = "gpu" if self.colocated else "sampler"
        self.trainer_role = "gpu" if self.colocated else "trainer"

    # ----------------------------------------------------------------------------- timeline
    def record(self, role: str, index: int, start: float, end: float, kind: str) -> None:
        if end <= start:
            return
        stop = self.timeline_stop_s
        if stop is None and len(self.timeline) >= self.cfg.timeline_max_intervals:
            stop = self.timeline_stop_s = self.env.now
        if stop is not None:
            if start >= stop:
                return
            end = min(end, stop)
        self.timeline.append(Interval(role, index, float(start), float(end), kind))

    def record_trainers(self, start: float, end: float, kind: str) -> None:
        for i in range(self.cfg.n_train_gpus):
            self.record(self.trainer_role, i, start, end, kind)

    # ---------------------------------------------------------------------------- admission
    def gen_version(self, batch: int) -> int:
        return max(batch - 1, 0) if self.cfg.layout == "one_step" else batch

    def admit(self, e: int, free: int, step: int) -> list[tuple[int, int]]:
        """Start up to ``free`` sequences on engine ``e`` if the layout allows; (finish step, id) each."""
        cfg = self.cfg
        started: list[tuple[int, int]] = []
        if cfg.layout == "pipeline":
            if self.window is None:  # no window: the engines stay full
                allowed = free
            else:  # (R1); dropped samples have left the window
                held = len(self.samples) - self.n_dropped
                limit = (self.visible + self.window) * cfg.batch_samples
                allowed = limit - held if isinstance(limit, int) else math.ceil(limit - held - 1e-9)
                if cfg.balance_engines and allowed > 0:  # (R3): no engine above its fair share
                    in_flight = len(self.samples) - self.n_finished - self.n_aborted
                    share = math.ceil((in_flight + allowed) / cfg.n_engines)
                    allowed = min(allowed, share - (cfg.max_batch - free))
            for _ in range(min(free, allowed)):
                started.append(self.start(e, self.visible, -1, step))
            return started
        if self.quota[e] == 0:
            return started
        # no cap on the batch index: sync batch k waits for version k, one_step runs at most one batch ahead
        while free > 0 and self.visible >= self.gen_version(self.next_batch[e]):
            j = self.next_batch[e]
            m = min(free, self.left_in_batch[e])
            for _ in range(m):
                started.append(self.start(e, self.gen_version(j), j, step))
            free -= m
            self.left_in_batch[e] -= m
            if self.left_in_batch[e] == 0:
                self.next_batch[e] += 1
                self.left_in_batch[e] = self.quota[e]
        return started

    def start(self, e: int, version: int, batch: int, step: int) -> tuple[int, int]:
        sid = len(self.samples)
        length = self.lengths.draw()
        self.samples.append(_Sample(sid, version, batch, length))
        self.start_step.append(step)
        self.engine_of.append(e)
        self.finished.append(False)
        self.consumed_version.append(-1)
        self.dropped_version.append(-1)
        self.unconsumed_by_version[version] = self.unconsumed_by_version.get(version, 0) + 1
        if self.drop:
            self.ids_by_version.setdefault(version, []).append(sid)
        return (step + length, sid)

    # ------------------------------------------------------------------------------ engines
    def engine(self, e: int) -> _Proc:
        env, cfg = self.env, self.cfg
        a, b, max_batch = cfg.a_s, cfg.b_s, cfg.max_batch
        linear = cfg.linear_step
        heap: list[tuple[int, int]] = []  # (finish step, sample id): no per-token state
        start_sum = 0  # sum of the start steps of the running sequences: R = B (P + step) - start_sum
        inv_len_sum = 0.0  # sum of 1 / L of the running sequences: their spread prefill is P * inv_len_sum
        step = 0
        while True:
            free = max_batch - len(heap)
            if free > 0:
                for item in self.admit(e, free, step):
                    heapq.heappush(heap, item)
                    start_sum += step
                    inv_len_sum += 1.0 / self.samples[item[1]].length
            if not heap:
                since = self.open_since[e]
                if since is not None:  # one coalesced bar per busy period
                    self.record(self.sampler_role, e, since, env.now, "decode")
                    self.open_since[e] = None
                yield self.wake_event  # a new version or a drop: the only things that can let an idle engine start
                continue
            if self.open_since[e] is None:
                self.open_since[e] = env.now
            n = len(heap)
            resident = 0.0 if linear else n * (cfg.prompt_tokens + step) - start_sum
            dt = a + b * n if linear else cfg.decode_step_s(n, resident, cfg.prompt_tokens * inv_len_sum)
            self.eng_cur[e] = (env.now, dt, n)
            yield env.timeout(dt)
            self.eng_cur[e] = (env.now, 0.0, 0)
            self.eng_busy[e] += dt
            self.eng_bdt[e] += n * dt
            self.eng_tokens[e] += n
            self.eng_steps[e] += 1
            step += 1
            self.eng_step_now[e] = step
            while heap and heap[0][0] == step:
                sid = heapq.heappop(heap)[1]
                start_sum -= self.start_step[sid]
                inv_len_sum -= 1.0 / self.samples[sid].length
                self.finished[sid] = True
                self.n_finished += 1
                if self.dropped_version[sid] < 0:
                    self.queue.put(self.samples[sid])  # unbounded store: the put succeeds at once
            if self.abort_pending[e]:  # "drop": free the slots of the sequences aborted during this step
                aborted = {sid for sid in self.abort_pending[e] if not self.finished[sid]}
                self.abort_pending[e] = []
                if aborted:
                    heap = [item for item in heap if item[1] not in aborted]
                    heapq.heapify(heap)
                    for sid in aborted:
                        start_sum -= self.start_step[sid]
                        inv_len_sum -= 1.0 / self.samples[sid].length
                        self.abort_progress[sid] = step - self.start_step[sid]
                    self.n_aborted += len(aborted)

    # ------------------------------------------------------------------------------ trainer
    def take_batch(self, v: int) -> Generator[simpy.Event, Any, list[_Sample]]:
        cfg = self.cfg
        batch: list[_Sample] = []
        while len(batch) < cfg.batch_samples:
            if cfg.layout != "pipeline":
                get = self.queue.get(lambda s: s.batch == v)
            else:
                if self.drop:
                    self.drop_stale(v)
                oldest = self.forced_oldest(v) if cfg.admission == "wait" else None  # (R2)
                get = self.queue.get() if oldest is None else self.queue.get(partial(_has_version, oldest))
            sample: _Sample = yield get
            self.release(sample.start_version)
            if self.drop and sample.start_version + cfg.lag_bound < v:  # started after the sweep, too old already
                self.mark_dropped(sample.sid, v)
                self.wake()
                continue
            self.consumed_version[sample.sid] = v  # taken: no later sweep of this update may drop it
            batch.append(sample)
        return batch

    def release(self, version: int) -> None:
        """One sample of start version ``version`` leaves the unconsumed ones (consumed or dropped)."""
        by_v = self.unconsumed_by_version
        by_v[version] -= 1
        if by_v[version] == 0:
            del by_v[version]

    def mark_dropped(self, sid: int, v: int) -> None:
        self.dropped_version[sid] = v
        self.n_dropped += 1

    def drop_stale(self, v: int) -> None:
        """``"drop"``: drop every unconsumed sample that would be consumed at a lag above the bound."""
        bound = self.cfg.lag_bound
        stale = [s for s in self.unconsumed_by_version if s + bound < v]
        if not stale:
            return
        queued: set[int] = set()
        for version in stale:
            for sid in self.ids_by_version.pop(version, []):
                if self.consumed_version[sid] >= 0 or self.dropped_version[sid] >= 0:
                    continue
                self.mark_dropped(sid, v)
                self.release(version)
                if self.finished[sid]:
                    queued.add(sid)
                else:  # running: abort it, its slot frees at its engine's next step boundary
                    self.abort_pending[self.engine_of[sid]].append(sid)
        if queued:
            items = self.queue.items
            items[:] = [s for s in items if s.sid not in queued]
        self.wake()

    def forced_oldest(self, v: int) -> int | None:
        """(R2): the oldest start version if some deadline forces the next pick, else None."""
        by_v = self.unconsumed_by_version
        if not by_v:
            return None
        cfg = self.cfg
        bound = cfg.lag_bound
        lo, hi = min(by_v), max(by_v)
        cum = 0
        for s in range(lo, hi + 1):
            cum += by_v.get(s, 0)
            if cum - (s + bound - v) * cfg.batch_samples > 0:
                return lo
        return None

    def trainer(self) -> _Proc:
        env, cfg = self.env, self.cfg
        rate = cfg.n_train_gpus * cfg.train_tokens_per_s_per_gpu
        if cfg.warmup_steps == 0:
            self.snapshot()
        for v in range(cfg.n_steps):
            batch = yield from self.take_batch(v)
            tokens = 0
            for s in batch:
                tokens += s.length
                self.consumed_ids.append(s.sid)
                self.lags.append(v - s.start_version)
            train_s = tokens / rate
            self.tr_cur = ("train", env.now, train_s)
            self.record_trainers(env.now, env.now + train_s, "train")
            yield env.timeout(train_s)
            self.tr_train += train_s
            self.tr_cur = ("", env.now, 0.0)
            self.version = v + 1
            self.step_end_s.append(env.now)
            if v + 1 == cfg.warmup_steps or v + 1 == cfg.n_steps:
                self.snapshot()
            if v + 1 == cfg.n_steps:
                self.done.succeed()
                return
            if cfg.sync_blocks_trainer:
                self.tr_cur = ("sync", env.now, cfg.weight_sync_s)
                self.record_trainers(env.now, env.now + cfg.weight_sync_s, "sync")
                yield env.timeout(cfg.weight_sync_s)
                self.tr_sync += cfg.weight_sync_s
                self.tr_cur = ("", env.now, 0.0)
                self.publish(v + 1)
            else:
                env.process(self.publish_later(v + 1))

    def publish_later(self, version: int) -> _Proc:
        yield self.env.timeout(self.cfg.weight_sync_s)
        self.publish(version)

    def publish(self, version: int) -> None:
        self.visible = version
        self.version_visible_s.append(self.env.now)
        self.wake()

    def wake(self) -> None:
        """Let the idle engines look at admission again (a new version, or dropped samples)."""
        event, self.wake_event = self.wake_event, self.env.event()
        event.succeed()

    # -------------------------------------------------------------------------- accounting
    def snapshot(self) -> None:
        """Cumulative busy seconds (the step in progress up to now included) at this instant."""
        now = self.env.now
        busy, bdt = [], []
        for e in range(self.cfg.n_engines):
            start, dt, n = self.eng_cur[e]
            part = min(max(now - start, 0.0), dt)
            busy.append(self.eng_busy[e] + part)
            bdt.append(self.eng_bdt[e] + n * part)
        kind, start, dt = self.tr_cur
        part = min(max(now - start, 0.0), dt)
        train = self.tr_train + (part if kind == "train" else 0.0)
        sync = self.tr_sync + (part if kind == "sync" else 0.0)
        self.snapshots.append((now, busy, bdt, train, sync))

    def run(self) -> SimResult:
        cfg, env = self.cfg, self.env
        for e in range(cfg.n_engines):
            env.process(self.engine(e))
        env.process(self.trainer())
        env.run(until=self.done)
        return self.result()

    def result(self) -> SimResult:
        cfg = self.cfg
        (t0, busy0, bdt0, train0, sync0), (t1, busy1, bdt1, train1, sync1) = self.snapshots
        window = t1 - t0
        ne = cfg.n_engines
        decode_s = sum(busy1) - sum(busy0)
        sampler_busy = decode_s / (ne * window) if window > 0 else 0.0
        mean_b = (sum(bdt1) - sum(bdt0)) / decode_s if decode_s > 0 else 0.0
        trainer_busy = (train1 - train0) / window if window > 0 else 0.0
        trainer_sync = (sync1 - sync0) / window if window > 0 else 0.0
        if self.colocated:
            idle = max(0.0, 1.0 - sampler_busy - trainer_busy - trainer_sync)
            sampler_idle = trainer_idle = idle
        else:
            sampler_idle = 1.0 - sampler_busy
            trainer_idle = max(0.0, 1.0 - trainer_busy - trainer_sync)
        first = cfg.warmup_steps * cfg.batch_samples
        measured_ids = np.asarray(self.consumed_ids[first:], dtype=np.int64)
        lengths = np.asarray([s.length for s in self.samples], dtype=np.int64)
        measured_tokens = int(lengths[measured_ids].sum())
        lags = np.asarray(self.lags[first:], dtype=np.int64)
        progress = np.asarray([self.progress(s) for s in self.samples], dtype=np.int64)
        dropped_version = np.asarray(self.dropped_version, dtype=np.int64)
        timeline, end_s, truncated = self.finish_timeline()
        n_steps = cfg.n_steps - cfg.warmup_steps
        return SimResult(
            config=cfg,
            tokens_per_s=measured_tokens / window if window > 0 else float("inf"),
            step_s=window / n_steps,
            measured_s=window,
            measured_tokens=measured_tokens,
            step_end_s=np.asarray(self.step_end_s),
            lags=lags,
            lag_mean=float(lags.mean()),
            lag_max=int(lags.max()),
            sampler_busy_frac=sampler_busy,
            sampler_idle_frac=sampler_idle,
            sampler_mean_in_flight=mean_b,
            trainer_busy_frac=trainer_busy,
            trainer_sync_frac=trainer_sync,
            trainer_idle_frac=trainer_idle,
            n_decode_steps=sum(self.eng_steps),
            decoded_tokens=sum(self.eng_tokens),
            n_started=len(self.samples),
            n_finished=self.n_finished,
            n_consumed=len(self.consumed_ids),
            n_dropped=self.n_dropped,
            dropped_tokens=int(progress[dropped_version >= 0].sum()),
            consumed_ids=np.asarray(self.consumed_ids, dtype=np.int64),
            sample_lengths=lengths,
            sample_start_version=np.asarray([s.start_version for s in self.samples], dtype=np.int64),
            sample_consumed_version=np.asarray(self.consumed_version, dtype=np.int64),
            sample_progress_tokens=progress,
            sample_dropped_version=dropped_version,
            version_visible_s=np.asarray(self.version_visible_s),
            timeline=timeline,
            timeline_end_s=end_s,
            timeline_truncated=truncated,
        )

    def progress(self, s: _Sample) -> int:
        """Tokens generated for sample ``s``: all if finished, up to its abort if its slot was freed."""
        if self.finished[s.sid]:
            return s.length
        done = self.abort_progress.get(s.sid)
        return self.eng_step_now[self.engine_of[s.sid]] - self.start_step[s.sid] if done is None else done

    def finish_timeline(self) -> tuple[list[Interval], float, bool]:
        """Close the decode bars still open, then add the idle gaps of every row."""
        env, cfg = self.env, self.cfg
        truncated = self.timeline_stop_s is not None
        for e in range(cfg.n_engines):  # an engine still decoding at the end: its bar runs to now
            since = self.open_since[e]
            if since is not None:
                self.record(self.sampler_role, e, since, env.now, "decode")
        truncated = truncated or self.timeline_stop_s is not None
        end = self.timeline_stop_s if self.timeline_stop_s is not None else env.now
        rows: dict[tuple[str, int], list[Interval]] = {}
        for e in range(cfg.n_engines):
            rows[(self.sampler_role, e)] = []
        for i in range(cfg.n_train_gpus):
            rows.setdefault((self.trainer_role, i), [])
        for iv in self.timeline:
            rows[(iv.role, iv.resource_index)].append(iv)
        out: list[Interval] = []
        for (role, index), bars in rows.items():
            bars.sort(key=lambda iv: iv.start_s)
            t = 0.0
            for iv in bars:
                if iv.start_s > t:
                    out.append(Interval(role, index, t, iv.start_s, "idle"))
                out.append(iv)
                t = max(t, iv.end_s)
            if end > t:
                out.append(Interval(role, index, t, end, "idle"))
        return out, end, truncated


def sim_config(spec: SystemSpec, layout: Layout, **sim: Any) -> SimConfig:
    """The simulator's twin of the model's ``spec``: the same GPUs, split, batch, engine
    (08.3: ``a_s``, ``b_s``, ``r_s``, ``f_s``, ``prompt_tokens``), trainer rate, weight sync,
    lag bound, admission rule and (pipeline) whether the weight sync blocks the trainers,
    for ``layout``. ``sim`` sets the simulator's own fields
    (``n_steps``, ``warmup_steps``, ``seed``, ...) and may replace any copied one, ``lengths``
    included (default: the spec's one batch of answer lengths, drawn from uniformly).

    The simulator generates one batch per weight version: a spec with
    ``batches_per_generation != 1`` raises unless the caller passes
    ``batches_per_generation=1`` (simulate it with one batch per round anyway).
    ``min_trainers`` (a memory constraint) plays no part in the simulation."""
    given = "batches_per_generation" in sim
    k = sim.pop("batches_per_generation") if given else spec.batches_per_generation
    if k != 1:
        raise ValueError(
            f"{'' if given else 'spec.'}batches_per_generation={k!r}: the simulator generates one batch per "
            "weight version; pass batches_per_generation=1 to sim_config to simulate the spec that way anyway"
        )
    answer = spec.answer_tokens
    fields: dict[str, Any] = dict(
        n_gpus=spec.n_gpus,
        n_samplers=None if layout == "sync_colocated" else spec.n_samplers,
        batch_samples=spec.batch_samples,
        max_batch=spec.max_batch,
        a_s=spec.a_s,
        b_s=spec.b_s,
        r_s=spec.r_s,
        f_s=spec.f_s,
        prompt_tokens=spec.prompt_tokens,
        train_tokens_per_s_per_gpu=spec.train_tokens_per_s_per_gpu,
        weight_sync_s=spec.weight_sync_s,
        max_lag=spec.max_lag,
        admission=spec.admission,
        lengths=(answer,) if isinstance(answer, int) else answer,
    )
    if layout == "pipeline":  # the synchronous layouts' formulas always count d in series
        fields["sync_blocks_trainer"] = spec.sync_blocks_trainer
    fields.update(sim)
    return SimConfig(layout=layout, **fields)


def simulate(cfg: SimConfig) -> SimResult:
    """Run ``cfg.n_steps`` optimizer steps of the layout and measure the last
    ``n_steps - warmup_steps`` (see the module docstring for the rules)."""
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"simulate expects a SimConfig, got {type(cfg).__name__}")
    return _Sim(cfg).run()


def gantt(result: SimResult, ax: Axes | None = None, until_s: float | None = None) -> Axes:
    """Gantt chart of ``result.timeline``: one row per GPU, bars coloured by kind
    (decode, train, sync, idle), thin vertical lines where a new weight version reaches
    the samplers. ``until_s`` limits the time axis (seconds)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if until_s is not None and not until_s > 0:
        raise ValueError(f"until_s must be > 0 seconds (or None for the whole timeline), got {until_s!r}")
    if ax is None:
        _, ax = plt.subplots(figsize=(11, 0.45 * _n_rows(result) + 1.6))
    end = result.timeline_end_s if until_s is None else min(until_s, result.timeline_end_s)
    rows: dict[tuple[str, int], int] = {}
    for iv in sorted(result.timeline, key=lambda iv: (iv.role != "sampler", iv.role, iv.resource_index)):
        rows.setdefault((iv.role, iv.resource_index), len(rows))
    by_row_kind: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for iv in result.timeline:
        if iv.start_s >= end:
            continue
        y = rows[(iv.role, iv.resource_index)]
        by_row_kind.setdefault((y, iv.kind), []).append((iv.start_s, min(iv.end_s, end) - iv.start_s))
    for (y, kind), spans in by_row_kind.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=KIND_COLOURS.get(kind, "#999999"), linewidth=0)
    for t in result.version_visible_s:
        if t <= end:
            ax.axvline(float(t), color="#444444", linewidth=0.5, alpha=0.4)
    ax.set_yticks(list(rows.values()), [f"{role} {index}" for role, index in rows])
    ax.invert_yaxis()
    ax.set_xlim(0.0, end)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GPU (role, index)")
    cfg = result.config
    name = f"{cfg.layout} ({cfg.admission})" if cfg.layout == "pipeline" else cfg.layout
    title = f"{name}: {result.tokens_per_s:,.0f} tokens/s, mean lag {result.lag_mean:.2f}"
    if result.n_dropped:
        title += f", {result.n_dropped} dropped"
    ax.set_title(title, loc="left")
    kinds = [k for k in KIND_COLOURS if any(kk == k for _, kk in by_row_kind)]
    handles = [Patch(facecolor=KIND_COLOURS[k], label=k) for k in kinds]
    if len(result.version_visible_s):
        handles.append(Patch(facecolor="#444444", label="new weights at samplers"))
    ax.legend(
        handles=handles,
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize="small",
        ncol=len(handles),
        frameon=False,
    )
    return ax


def _n_rows(result: SimResult) -> int:
    return len({(iv.role, iv.resource_index) for iv in result.timeline})
