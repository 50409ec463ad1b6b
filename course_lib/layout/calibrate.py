"""The layout model (:mod:`course_lib.layout.model`) calibrated on lesson 07's measured parts (lesson 08).

Lesson 07 runs one generator process (core 0) and one trainer (core 1). The model sees
that as a cluster of **two GPUs, one sampler and one trainer** (``n_gpus=2,
n_samplers=1``), mapped part by part:

* **Decode step.** :class:`~course_lib.lm.sampler.SlotSampler` runs one batched forward
  pass over *all* its ``n_slots`` slots every step, busy or not, so its step costs
  ``l(n_slots)`` whatever the number of live sequences: in eq. 08.3 that is ``a_s =
  l(n_slots)`` (measured, :func:`time_decode_steps`), and the engine's ``max_batch`` is
  ``n_slots``. The generator loop around it (starting answers, verifying finished ones,
  pickling groups for the pipe) costs about the same per *sequence*, i.e. per live slot
  step once spread over its tokens: that is ``b_s`` (:func:`time_generator_steps`,
  :meth:`GeneratorTiming.per_slot_step_s`).
* **Lengths.** A sequence occupies its slot for ``PREFILL_STEPS`` prompt steps plus one
  step per answer token (:func:`sequence_steps`); the model's "tokens" are these slot
  steps. Answer lengths come from the warm-started policy (:func:`sample_answer_tokens`).
  Predicted throughput is converted back to *answer* tokens/s, the unit lesson 07 reports.
* **Trainer.** ``c`` (eq. 08.5) is sequence steps per second of the trainer's update
  (loss, backward, Adam, publish), fitted on a calibration run's per-update timings
  (:func:`trainer_timing`): the trainer's forward pass covers prompt and answer, so its
  cost follows sequence steps rather than answer tokens alone.
* **Weight sync** ``d = 0``: publishing is part of the trainer's update (timed in ``c``);
  the generator's pull of 0.13 M parameters takes well under a millisecond.
* **Regimes**: ``sync`` is ``sync_split``, ``one_step`` is ``one_step``, ``pipeline`` is
  ``pipeline`` with ``max_lag`` = the run's bound.

Every batch of a run has its own lengths; the synchronous layouts' step depends on the
batch's longest answer, so :func:`predict_regime` averages the model over many batches
drawn from the measured lengths: ``tokens/s = sum(answer tokens) / sum(step_s)``.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from numpy.typing import NDArray

from course_lib.layout.model import Layout, SystemSpec, predict
from course_lib.layout.sim import sim_config, simulate
from course_lib.lm.model import TinyLM
from course_lib.lm.sampler import SlotSampler, generator_for, sample_problems
from course_lib.lm.task import EOS, PROMPT_LEN, CountdownTask
from course_lib.pipeline.system import GroupGenerator, PipelineConfig, PipelineSystem, Regime, RegimeReport
from course_lib.runtime.weights import SharedWeights

#: Decoding steps a sequence spends on its prompt before its first answer token.
PREFILL_STEPS = PROMPT_LEN - 1
#: Lesson 07's regimes as the model's layouts.
REGIME_LAYOUT: dict[str, Layout] = {"sync": "sync_split", "one_step": "one_step", "pipeline": "pipeline"}


def time_decode_steps(
    model: TinyLM, task: CountdownTask, slot_counts: Sequence[int], n_steps: int = 30, seed: int = 0
) -> NDArray[np.float64]:
    """Median seconds of one :meth:`SlotSampler.step` at each slot count, every slot busy
    (a finished slot is refilled at once), with one torch thread (as lesson 07's generator).

    Returns ``[len(slot_counts)]`` seconds. The slot counts are interleaved step by step
    (round robin), so a change of the machine's load hits all of them alike.
    """
    if n_steps < 1 or not slot_counts:
        raise ValueError(f"need n_steps >= 1 and at least one slot count, got {n_steps}, {slot_counts}")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    prompts = [p.prompt for p in task.sample(rng, 4096)]
    samplers = [SlotSampler(model, int(s), EOS, generator_for(model, seed)) for s in slot_counts]
    times = np.zeros((len(samplers), n_steps))
    i = 0
    try:
        for k in range(n_steps + 3):  # 3 untimed steps first
            for j, sampler in enumerate(samplers):
                for slot in sampler.free_slots():
                    sampler.start(slot, prompts[i % len(prompts)])
                    i += 1
                t0 = time.perf_counter()
                sampler.step()
                if k >= 3:
                    times[j, k - 3] = time.perf_counter() - t0
    finally:
        torch.set_num_threads(previous)
    return np.median(times, axis=1)


class _PickleSink:
    """Stands in for the generator's pipe: pickles every message (a pipe's cost on the
    sender's side) and drops it."""

    def __init__(self) -> None:
        self.bytes = 0

    def send(self, message: object) -> None:
        self.bytes += len(pickle.dumps(message))


@dataclass(frozen=True)
class GeneratorTiming:
    """Lesson 07's generator loop, timed: wall seconds per decoding step and the mean number
    of live slots per step (slot steps of real sequences)."""

    step_s: float
    live_slots: float

    def per_slot_step_s(self, bare_step_s: float) -> float:
        """``b_s``: what the loop adds to the bare ``l(n_slots)`` per live slot step (starting,
        verifying and sending answers, spread over their tokens)."""
        return max(self.step_s - bare_step_s, 0.0) / self.live_slots


def time_generator_steps(
    model: TinyLM, task: CountdownTask, cfg: PipelineConfig, n_steps: int = 300
) -> GeneratorTiming:
    """Lesson 07's generator loop (a :class:`~course_lib.pipeline.system.GroupGenerator` in
    this process, one torch thread, no backpressure, every free slot refilled at once): the
    sampler's step *plus* starting answers, verifying the finished ones and pickling the
    finished groups, as the generator process does between two steps."""
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        sampler = SlotSampler(model, cfg.n_slots, EOS, generator_for(model, cfg.seed))
        weights = SharedWeights(model)
        gen = GroupGenerator(cfg, weights, sampler, task, np.random.default_rng(cfg.seed), _PickleSink())
        unbounded = 10**9  # groups "consumed": backpressure never holds a group back
        for _ in range(5):  # untimed: fill the slots
            gen.start_groups(unbounded)
            gen.decode_step()
        live = 0
        t0 = time.perf_counter()
        for _ in range(n_steps):
            gen.start_groups(unbounded)
            live += sampler.n_active
            gen.decode_step()
        return GeneratorTiming(step_s=(time.perf_counter() - t0) / n_steps, live_slots=live / n_steps)
    finally:
        torch.set_num_threads(previous)


def sequence_steps(answer_tokens: NDArray[np.integer] | Sequence[int]) -> NDArray[np.int64]:
    """Slot steps of each sequence: ``PREFILL_STEPS`` + its answer tokens (``<eos>`` included)."""
    a = np.asarray(answer_tokens, dtype=np.int64)
    if a.size and a.min() < 1:
        raise ValueError(f"an answer has at least one token (<eos>), got a minimum of {a.min()}")
    return a + PREFILL_STEPS


def sample_answer_tokens(model: TinyLM, task: CountdownTask, n: int, seed: int = 0) -> NDArray[np.int64]:
    """Answer lengths (tokens, ``<eos>`` included) of ``n`` answers the policy samples at
    temperature 1 on fresh prompts, as lesson 07's generator would."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    problems = task.sample(np.random.default_rng(seed), n)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # as the generator process; small ops run slower on two contended threads
    try:
        results = sample_problems(model, [p.prompt for p in problems], 64, EOS, generator_for(model, seed))
    finally:
        torch.set_num_threads(previous)
    return np.array([len(r["tokens"]) - PROMPT_LEN for r in results], dtype=np.int64)


@dataclass(frozen=True)
class TrainerTiming:
    """Per update of a run: the sequence steps trained on and the trainer's busy seconds."""

    steps: NDArray[np.int64]
    seconds: NDArray[np.float64]

    @property
    def steps_per_s(self) -> float:
        """``c`` (eq. 08.5) in sequence steps per trainer second: total steps / total seconds."""
        return float(self.steps.sum() / self.seconds.sum())


def trainer_timing(report: RegimeReport, batch_sequences: int, skip: int = 2) -> TrainerTiming:
    """The trainer's per-update cost in ``report`` (its busy intervals and tokens), the
    first ``skip`` updates left out (warm-up of the allocator and caches)."""
    if len(report.metrics) <= skip:
        raise ValueError(f"the run has {len(report.metrics)} updates; need more than skip={skip}")
    answer = report.series("tokens")[skip:].astype(np.int64)
    steps = answer + PREFILL_STEPS * batch_sequences
    seconds = np.array([b - a for a, b in report.trainer[skip:]], dtype=np.float64)
    return TrainerTiming(steps=steps, seconds=seconds)


@dataclass(frozen=True)
class Throughput:
    """Answer tokens per second and mean per-token lag of a run, a prediction or a simulation."""

    tokens_per_s: float
    mean_lag: float
    step_s: float


def steady_state(report: RegimeReport, skip: int) -> Throughput:
    """Updates ``skip + 1 .. n`` of a run: answer tokens consumed over the time they took
    (from the end of update ``skip`` to the end of the last), the token-weighted mean lag,
    and seconds per update. Leaves out the start, where the pipeline's queue fills up."""
    n = len(report.metrics)
    if not 1 <= skip < n - 1:
        raise ValueError(f"skip must be in 1 .. {n - 2} for a run of {n} updates, got {skip}")
    t = report.series("time")
    tokens = report.series("tokens")[skip:]
    lag = report.series("lag_mean")[skip:]
    seconds = float(t[-1] - t[skip - 1])
    return Throughput(
        tokens_per_s=float(tokens.sum() / seconds),
        mean_lag=float((lag * tokens).sum() / tokens.sum()),
        step_s=seconds / (n - skip),
    )


@dataclass(frozen=True)
class Rates:
    """The measured parts the model needs, in lesson 07's units.

    Attributes:
        step_s: ``a_s``: the sampler's bare step at ``n_slots`` slots, ``l(n_slots)`` (s).
        per_slot_step_s: ``b_s``: the generator loop's extra cost per live slot step (s).
        trainer_steps_per_s: ``c``: sequence steps the trainer consumes per busy second
            (the median over the round's runs).
        trainer_by_regime: ``(regime, c)`` of each run of the round, measured on its own
            trainer's busy intervals (:meth:`for_regime`).
    """

    step_s: float
    per_slot_step_s: float
    trainer_steps_per_s: float
    trainer_by_regime: tuple[tuple[str, float], ...] = ()

    def for_regime(self, regime: str) -> Rates:
        """These rates with ``c`` taken from ``regime``'s own run, where it was measured (a
        run's trainer is predicted from its own busy intervals, not another run's)."""
        own = dict(self.trainer_by_regime)
        if regime not in own:
            return self
        return replace(self, trainer_steps_per_s=own[regime])


def lesson07_spec(
    cfg: PipelineConfig, rates: Rates, steps_batch: Sequence[int] | NDArray[np.integer] | int
) -> SystemSpec:
    """Lesson 07's two processes as a 2-GPU system (1 sampler, 1 trainer; see the module
    docstring): ``a_s = l(n_slots)``, ``b_s`` = the loop's cost per live slot step,
    ``max_batch = n_slots``, lengths in slot steps."""
    answer: int | tuple[int, ...] = steps_batch if isinstance(steps_batch, int) else tuple(int(s) for s in steps_batch)
    return SystemSpec(
        n_gpus=2,
        n_samplers=1,
        batch_samples=cfg.batch_sequences,
        max_batch=cfg.n_slots,
        a_s=rates.step_s,
        b_s=rates.per_slot_step_s,
        train_tokens_per_s_per_gpu=rates.trainer_steps_per_s,
        answer_tokens=answer,
        weight_sync_s=0.0,
        max_lag=cfg.lag_bound,
        admission="fifo",  # lesson 07's trainer takes finished groups in order; its bound is per token
    )


def predict_regime(
    cfg: PipelineConfig,
    rates: Rates,
    answer_tokens: NDArray[np.integer] | Sequence[int],
    n_batches: int = 200,
    seed: int = 0,
) -> Throughput:
    """The model's prediction for lesson 07's ``cfg.regime``, averaged over ``n_batches``
    batches drawn (with replacement) from the measured ``answer_tokens``."""
    if n_batches < 1:
        raise ValueError(f"n_batches must be >= 1, got {n_batches}")
    answers = np.asarray(answer_tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    layout = REGIME_LAYOUT[cfg.regime]
    total_s, total_answer, lags = 0.0, 0, []
    for _ in range(n_batches):
        batch = rng.choice(answers, size=cfg.batch_sequences, replace=True)
        p = predict(layout, lesson07_spec(cfg, rates, sequence_steps(batch)))
        total_s += p.step_s
        total_answer += int(batch.sum())
        lags.append(p.mean_lag_steps)
    return Throughput(tokens_per_s=total_answer / total_s, mean_lag=float(np.mean(lags)), step_s=total_s / n_batches)


def simulate_regime(
    cfg: PipelineConfig,
    rates: Rates,
    answer_tokens: NDArray[np.integer] | Sequence[int],
    n_steps: int = 60,
    warmup_steps: int = 20,
    seed: int = 0,
) -> Throughput:
    """The same 2-GPU system in the simulator (:mod:`course_lib.layout.sim`); lengths drawn
    from the measured ``answer_tokens``; answer tokens/s over the measured steps."""
    layout = REGIME_LAYOUT[cfg.regime]
    steps = sequence_steps(answer_tokens)
    spec = lesson07_spec(cfg, rates, round(float(steps.mean())))  # the samples draw from all of `steps`
    lengths = tuple(int(s) for s in steps)
    sim = simulate(sim_config(spec, layout, n_steps=n_steps, warmup_steps=warmup_steps, lengths=lengths, seed=seed))
    first = warmup_steps * cfg.batch_sequences
    ids = sim.consumed_ids[first:]
    answer = int((sim.sample_lengths[ids] - PREFILL_STEPS).sum())
    return Throughput(tokens_per_s=answer / sim.measured_s, mean_lag=sim.lag_mean, step_s=sim.step_s)


def relative_error(predicted: float, measured: float) -> float:
    """``(predicted - measured) / measured``; 0 when both are 0 (e.g. the lag of a synchronous run)."""
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


#: Lesson 07's three regimes, in the order a round runs them.
REGIMES: tuple[Regime, ...] = ("sync", "one_step", "pipeline")


def measure_round(
    model: TinyLM,
    task: CountdownTask,
    base: PipelineConfig,
    init_flat: torch.Tensor,
    seed: int,
    skip: int,
    on_update: Callable[[int, dict[str, float]], None] | None = None,
) -> tuple[Rates, dict[str, RegimeReport]]:
    """One round of the validation: time the generator's parts in this process (the bare
    step at ``base.n_slots`` slots, the loop), then run every regime of :data:`REGIMES` from
    ``init_flat`` with ``seed``, back to back, so that the calibration and the runs share the
    machine's load. Each run's ``c`` is measured on its own trainer's busy intervals (the
    first ``skip`` updates left out) and kept per regime (``Rates.for_regime``); the
    median of the three is ``trainer_steps_per_s``. ``on_update`` is passed to ``train``."""
    bare = float(time_decode_steps(model, task, [base.n_slots], n_steps=60, seed=seed)[0])
    loop = time_generator_steps(model, task, replace(base, regime="pipeline", seed=seed), n_steps=200)
    reports: dict[str, RegimeReport] = {}
    for regime in REGIMES:
        with PipelineSystem(replace(base, regime=regime, seed=seed), init_flat) as system:
            reports[regime] = system.train(progress=on_update)
    own = tuple(
        (regime, trainer_timing(r, base.batch_sequences, skip=skip).steps_per_s) for regime, r in reports.items()
    )
    c = float(np.median([rate for _, rate in own]))
    rates = Rates(step_s=bare, per_slot_step_s=loop.per_slot_step_s(bare), trainer_steps_per_s=c, trainer_by_regime=own)
    return rates, reports


@dataclass(frozen=True)
class RegimeComparison:
    """One regime over the rounds: measured steady state, the model's and the simulator's
    predictions from each round's rates (medians over rounds), and the per-round errors
    (read them as they are: :attr:`error_range` is their spread, not a confidence interval)."""

    regime: str
    measured_tokens_per_s: float
    model_tokens_per_s: float
    sim_tokens_per_s: float
    model_errors: tuple[float, ...]
    sim_errors: tuple[float, ...]
    measured_lag: float
    model_lag: float
    sim_lag: float
    trainer_busy: float

    @property
    def model_error(self) -> float:
        """Median over rounds of ``(model - measured) / measured`` tokens/s."""
        return float(np.median(self.model_errors))

    @property
    def sim_error(self) -> float:
        return float(np.median(self.sim_errors))

    @property
    def error_range(self) -> tuple[float, float]:
        """The lowest and highest per-round model error."""
        return float(min(self.model_errors)), float(max(self.model_errors))


def compare_regimes(
    base: PipelineConfig,
    rates_by_round: Sequence[Rates],
    reports_by_round: Sequence[dict[str, RegimeReport]],
    answer_tokens: NDArray[np.integer] | Sequence[int],
    skip: int,
) -> dict[str, RegimeComparison]:
    """Model and simulator against the measured rounds of :func:`measure_round`, per regime
    (round ``i`` is predicted from its own rates, seed ``i``, and each run's trainer from its
    own measured ``c``: ``Rates.for_regime``)."""
    if len(rates_by_round) != len(reports_by_round) or not rates_by_round:
        raise ValueError("need one Rates per round of reports, and at least one round")
    out: dict[str, RegimeComparison] = {}
    for regime in REGIMES:
        cfg = replace(base, regime=regime)
        meas = [steady_state(reports[regime], skip) for reports in reports_by_round]
        own = [r.for_regime(regime) for r in rates_by_round]
        pred = [predict_regime(cfg, r, answer_tokens, n_batches=200, seed=i) for i, r in enumerate(own)]
        sim = [simulate_regime(cfg, r, answer_tokens, n_steps=60, warmup_steps=20, seed=i) for i, r in enumerate(own)]
        out[regime] = RegimeComparison(
            regime=regime,
            measured_tokens_per_s=float(np.median([m.tokens_per_s for m in meas])),
            model_tokens_per_s=float(np.median([p.tokens_per_s for p in pred])),
            sim_tokens_per_s=float(np.median([s.tokens_per_s for s in sim])),
            model_errors=tuple(relative_error(p.tokens_per_s, m.tokens_per_s) for p, m in zip(pred, meas)),
            sim_errors=tuple(relative_error(s.tokens_per_s, m.tokens_per_s) for s, m in zip(sim, meas)),
            measured_lag=float(np.median([m.mean_lag for m in meas])),
            model_lag=float(np.median([p.mean_lag for p in pred])),
            sim_lag=float(np.median([s.mean_lag for s in sim])),
            trainer_busy=float(np.median([reports[regime].busy_fraction("trainer") for reports in reports_by_round])),
        )
    return out
