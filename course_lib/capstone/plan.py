"""Choosing the layout with lesson 08's model, calibrated on this machine in about a second.

Rank 0 times the parts (:func:`calibrate`), then asks :func:`course_lib.layout.predict` for
every split of the ``W`` ranks it may use (``n_trainers >= 2``, at least one generator) and
every slot count of :data:`~course_lib.capstone.config.SLOT_CHOICES`, and keeps the one
with the most predicted answer tokens/s (:func:`choose_layout`). The mapping of the parts
onto the model is lesson 08's for lesson 07's processes
(:mod:`course_lib.layout.calibrate`):

* a generator is an engine with ``max_batch = n_slots``; its
  :class:`~course_lib.lm.sampler.SlotSampler` computes every slot at every step, so
  ``a_s = l(n_slots)``, measured (:func:`~course_lib.layout.calibrate.time_decode_steps`), ``b_s = 0``;
* a trainer consumes ``c`` sequence steps per second (prompt + answer positions: its
  forward pass covers both), timed as one forward and backward pass over teacher-forced
  reference answers of half a batch (:func:`_train_steps_per_s`): the run's update also
  holds Adam, chunking by length and the loss's bookkeeping, which this leaves out;
* the weight update's time ``d`` is not given to the model (0): the calibration runs
  before the other ranks join, so nothing can be sent yet; a run's sends are in its phases
  (lesson 11, section 3), and the capstone's trainer 0 waits for its own send;
* lengths are sequence steps (:func:`~course_lib.layout.calibrate.sequence_steps`) of answers
  sampled from the warm-started policy; predictions are turned back into answer tokens/s;
* ranks share compute units (:func:`rank_share`): on CPUs a rank gets ``min(1, cores /
  busy ranks)`` of a core, the cores and ranks of its own host; on GPUs with one per rank
  (NCCL) a whole GPU; colocated, every rank of a host is on its GPU 0, ``1 / busy ranks``
  each. The parts are timed alone, on the ranks' device, and scaled by the share;
* *busy ranks* depend on the regime: in the pipeline every local rank works at once; in
  synchronous RL (``max_lag = 0``) the generators decode while the trainers wait and the
  other way round, so each phase has its side's ranks alone (:func:`spec_for`);
* the trainers split each batch of ``B`` groups; with ``T`` trainers the update lasts as
  long as the trainer with ``ceil(B / T)`` groups, so they consume as ``B / ceil(B / T)``
  whole trainers (``T`` is capped at ``B``: a trainer with no group is a wasted rank);
* the capstone's trainer takes its groups in ticket order and waits for a straggler
  (lesson 08's ``admission="wait"``, eq. 08.14); a split the model calls infeasible is
  never chosen.

With ``max_lag = 0`` the model's pipeline *is* the synchronous split layout (eq. 08.9), so
the same call predicts the synchronous baseline (the lesson and the benchmark measure both).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from course_lib.capstone.config import SLOT_CHOICES, CapstoneConfig
from course_lib.layout.calibrate import sample_answer_tokens, sequence_steps, time_decode_steps
from course_lib.layout.model import Prediction, SystemSpec, predict
from course_lib.lm.model import TinyLM, sequence_logprobs
from course_lib.lm.task import CountdownTask, teacher_forcing_batch


@dataclass(frozen=True)
class Rates:
    """What :func:`calibrate` measured (seconds, steps per second)."""

    decode_step_s: dict[int, float]  # n_slots -> l(n_slots), one thread, this machine
    train_steps_per_s: float  # c: sequence steps one trainer consumes per second
    answer_tokens: tuple[int, ...]  # one batch of the policy's answer lengths (tokens, <eos> included)
    cpu_share: float  # the pipeline's share of a compute unit per rank (rank_share with every local rank busy)
    seconds: float  # how long the calibration took
    device: str = "cpu"  # where the parts were timed: "cpu" or "cuda"
    units: int = 1  # compute units of a host: cores (cpu) or GPUs (cuda)
    local_ranks: int = 1  # ranks on one host (torchrun's LOCAL_WORLD_SIZE)
    colocated: bool = False  # every rank of a host on one GPU

    def share(self, busy_ranks: int) -> float:
        """A rank's share of its compute unit while ``busy_ranks`` ranks of its host work (:func:`rank_share`)."""
        return rank_share(self.device, self.units, busy_ranks, self.colocated)


@dataclass(frozen=True)
class Plan:
    """The layout a run uses, and what the model predicted for it (``None`` without calibration)."""

    world_size: int
    n_trainers: int
    n_slots: int
    predicted_tokens_per_s: float | None = None
    predicted_sync_tokens_per_s: float | None = None
    predicted_mean_lag: float | None = None
    rates: dict[str, Any] | None = None

    @property
    def n_generators(self) -> int:
        return self.world_size - self.n_trainers

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        return cls(**data)

    def text(self, cfg: CapstoneConfig) -> str:
        """What rank 0 prints at the start."""
        split = (
            f"{self.n_trainers} trainers (data parallel) + {self.n_generators} generator(s) x {self.n_slots} slots"
            if self.n_generators
            else f"{self.n_trainers} ranks that each sample their share ({self.n_slots} slots), then train on it"
        )
        head = (
            f"layout: {self.world_size} ranks = {split}; batch {cfg.groups_per_batch} prompts x {cfg.group_size} "
            f"answers; max_lag {cfg.max_lag}"
        )
        if self.predicted_tokens_per_s is None or self.rates is None:
            return head + " (given, not calibrated)"
        r = self.rates
        steps = ", ".join(f"{n} slots {1e3 * s:.2f} ms" for n, s in sorted(r["decode_step_s"].items()))
        return (
            f"{head}\ncalibrated in {r['seconds']:.1f} s: decode step {steps}; trainer {r['train_steps_per_s']:,.0f} "
            f"sequence steps/s; share of a {'core' if r.get('device', 'cpu') == 'cpu' else 'GPU'} "
            f"{r['cpu_share']:.2f} per rank\n"
            f"lesson 08's model predicts {self.predicted_tokens_per_s:,.0f} answer tokens/s "
            f"(mean lag {self.predicted_mean_lag:.1f} updates); synchronous (max_lag 0) on the same split: "
            f"{self.predicted_sync_tokens_per_s:,.0f}"
        )


def rank_share(device: str, units: int, busy_ranks: int, colocated: bool) -> float:
    """The share of a compute unit one rank gets while ``busy_ranks`` ranks of its host work.

    * CPUs (``units`` cores): ``min(1, units / busy_ranks)``;
    * GPUs, colocated: every rank on GPU 0 whatever ``units`` is: ``1 / busy_ranks``;
    * GPUs, one per rank (NCCL): 1.

    Raises:
        ValueError: no unit or no busy rank.
    """
    if units < 1 or busy_ranks < 1:
        raise ValueError(f"need at least one compute unit and one busy rank, got {units} and {busy_ranks}")
    if device == "cuda":
        return 1.0 / busy_ranks if colocated else 1.0
    return min(1.0, units / busy_ranks)


def _train_steps_per_s(model: TinyLM, task: CountdownTask, n_sequences: int, seed: int, reps: int = 3) -> float:
    """Sequence steps per second of a forward + backward pass over ``n_sequences`` answers (teacher forcing)."""
    problems = task.sample(np.random.default_rng(seed), n_sequences)
    tokens, mask = teacher_forcing_batch(problems, model.cfg.max_len)
    steps = int(mask.sum()) + n_sequences * 3  # answer tokens + prefill positions
    device = next(model.parameters()).device
    tokens, mask = tokens.to(device), mask.to(device)
    best = np.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        model.zero_grad()
        (sequence_logprobs(model, tokens) * mask).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    model.zero_grad()
    return steps / best


def calibrate(model: TinyLM, task: CountdownTask, cfg: CapstoneConfig, local_ranks: int) -> Rates:
    """Time the parts of a run on this machine (one torch thread, as every rank runs), on the
    device ``model`` is on (the ranks' device: a CPU core, or a GPU under NCCL or colocated).
    The rates are per core (CPU) or per GPU alone; ``local_ranks`` (the ranks of one host)
    and the host's cores or GPUs give each rank's share of them (:func:`rank_share`)."""
    t0 = time.perf_counter()
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        slots = [cfg.n_slots] if cfg.n_slots else list(SLOT_CHOICES)
        step_s = time_decode_steps(model, task, slots, n_steps=8, seed=cfg.seed)
        answers = sample_answer_tokens(model, task, cfg.batch_sequences, seed=cfg.seed)
        per_trainer = max(cfg.batch_sequences // 2, 1)
        c = _train_steps_per_s(model, task, per_trainer, cfg.seed)
    finally:
        torch.set_num_threads(previous)
    device = next(model.parameters()).device.type
    units = compute_units(device)
    return Rates(
        decode_step_s={int(n): float(s) for n, s in zip(slots, step_s)},
        train_steps_per_s=float(c),
        answer_tokens=tuple(int(a) for a in answers),
        cpu_share=rank_share(device, units, local_ranks, cfg.colocated),
        seconds=time.perf_counter() - t0,
        device=device,
        units=units,
        local_ranks=local_ranks,
        colocated=cfg.colocated,
    )


def compute_units(device: str) -> int:
    """This host's compute units: the GPUs torch sees (``"cuda"``), else the cores this process may use."""
    if device == "cuda":
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def trainer_capacity(n_trainers: int, groups_per_batch: int) -> float:
    """Whole trainers' worth of consumption: the update lasts as long as the trainer with
    ``ceil(B / T)`` groups, so ``T`` trainers consume as ``B / ceil(B / T)`` of them."""
    return groups_per_batch / math.ceil(groups_per_batch / n_trainers)


def spec_for(
    rates: Rates,
    cfg: CapstoneConfig,
    world_size: int,
    n_trainers: int,
    n_slots: int,
    *,
    max_lag: int | None = None,
    answer_tokens: tuple[int, ...] | None = None,
    weight_sync_s: float = 0.0,
) -> SystemSpec:
    """Lesson 08's :class:`~course_lib.layout.SystemSpec` of one candidate layout (see the module docstring).

    ``max_lag`` (default ``cfg.max_lag``) 0 is synchronous RL: generators and trainers take
    turns, so each side's rate is scaled by its share with its own side's ranks busy;
    otherwise every local rank is busy. ``answer_tokens`` replaces the calibration's answer
    lengths (to re-predict with the lengths a run really produced). ``weight_sync_s`` is lesson
    08's ``d``: the calibration cannot time a send before the run, so the plan uses 0; give a
    run's measured send to re-predict with it (trainer 0 sends in series: it blocks the trainer).
    """
    if weight_sync_s < 0:
        raise ValueError(f"weight_sync_s must be >= 0 (seconds of trainer 0's send), got {weight_sync_s}")
    lag = cfg.max_lag if max_lag is None else max_lag
    local = rates.local_ranks
    n_generators = world_size - n_trainers
    if lag == 0:  # per node: the side's share of this host's ranks (rounded up), the other side idle
        gen_busy = max(1, math.ceil(local * n_generators / world_size))
        train_busy = max(1, math.ceil(local * n_trainers / world_size))
        gen_share, train_share = rates.share(gen_busy), rates.share(train_busy)
    else:
        gen_share = train_share = rates.share(local)
    per_trainer = trainer_capacity(n_trainers, cfg.groups_per_batch) / n_trainers
    return SystemSpec(
        n_gpus=world_size,
        n_samplers=n_generators,
        batch_samples=cfg.batch_sequences,
        max_batch=n_slots,
        a_s=rates.decode_step_s[n_slots] / gen_share,
        b_s=0.0,
        train_tokens_per_s_per_gpu=rates.train_steps_per_s * train_share * per_trainer,
        answer_tokens=tuple(int(s) for s in sequence_steps(batch_of(answer_tokens or rates.answer_tokens, cfg))),
        max_lag=lag,
        # The capstone's trainer takes groups in ticket order and waits for a straggler: lesson
        # 08's "wait" rule (08.14), which also charges the wait for the longest answer.
        admission="wait" if lag >= 1 else "fifo",
        weight_sync_s=weight_sync_s,
    )


def batch_of(answer_tokens: tuple[int, ...], cfg: CapstoneConfig) -> tuple[int, ...]:
    """``answer_tokens`` as one batch of ``cfg.batch_sequences`` lengths: the same lengths when
    there are that many; else a *typical* batch of their distribution, its ``i``-th answer at
    the quantile ``(i + 1/2) / n``. (Not the extreme ones: a run's single longest answer among
    thousands would charge every update of the straggler rule (08.14) with it; the typical
    batch's longest sits near the expected longest of ``n`` draws.)"""
    n = cfg.batch_sequences
    if len(answer_tokens) == n:
        return tuple(answer_tokens)
    if not answer_tokens:
        raise ValueError("no answer lengths to predict with")
    levels = (np.arange(n) + 0.5) / n
    return tuple(int(x) for x in np.quantile(np.asarray(answer_tokens), levels, method="inverted_cdf"))


def answer_rate(
    rates: Rates,
    cfg: CapstoneConfig,
    world_size: int,
    n_trainers: int,
    n_slots: int,
    *,
    max_lag: int | None = None,
    answer_tokens: tuple[int, ...] | None = None,
    weight_sync_s: float = 0.0,
) -> Prediction:
    """Lesson 08's prediction for one layout, its ``tokens_per_s`` in *answer* tokens/s (the unit
    the run reports; the model counts sequence steps, prompt included); ``weight_sync_s``: ``d``
    (:func:`spec_for`)."""
    answers = batch_of(answer_tokens or rates.answer_tokens, cfg)
    spec = spec_for(
        rates, cfg, world_size, n_trainers, n_slots, max_lag=max_lag, answer_tokens=answers, weight_sync_s=weight_sync_s
    )
    p = predict("pipeline", spec)
    to_answer = float(np.sum(answers) / sequence_steps(answers).sum())
    return replace(p, tokens_per_s=p.tokens_per_s * to_answer)


def colocated_sync_rate(
    rates: Rates, cfg: CapstoneConfig, n_ranks: int, *, answer_tokens: tuple[int, ...] | None = None
) -> Prediction:
    """Lesson 08's ``sync_colocated`` prediction (08.8) for ``--colocated-sync`` on ``n_ranks``
    ranks: each decodes its share of the batch, then each trains; those ranks busy in both
    phases, any other rank of the host idle.

    A rank decodes ``ceil(B / n_ranks) G`` answers at once: the step of the timed slot count
    that holds them (or the smallest timed one; on these tiny models a step is launch-bound,
    nearly independent of the slots). ``tokens_per_s`` in answer tokens/s."""
    answers = batch_of(answer_tokens or rates.answer_tokens, cfg)
    share = rates.share(min(n_ranks, rates.local_ranks))
    world_size = n_ranks
    per_rank = math.ceil(cfg.groups_per_batch / n_ranks) * cfg.group_size
    smallest = min((s for s in rates.decode_step_s if s >= per_rank), default=max(rates.decode_step_s))
    spec = SystemSpec(
        n_gpus=world_size,
        batch_samples=cfg.batch_sequences,
        max_batch=per_rank,
        a_s=rates.decode_step_s[smallest] / share,
        b_s=0.0,
        train_tokens_per_s_per_gpu=rates.train_steps_per_s
        * share
        * trainer_capacity(world_size, cfg.groups_per_batch)
        / world_size,
        answer_tokens=tuple(int(x) for x in sequence_steps(answers)),
        max_lag=0,
    )
    p = predict("sync_colocated", spec)
    to_answer = float(np.sum(answers) / sequence_steps(answers).sum())
    return replace(p, tokens_per_s=p.tokens_per_s * to_answer)


def trainer_choices(cfg: CapstoneConfig, world_size: int) -> list[int]:
    """Trainer counts the layout may use: ``cfg.n_trainers`` if set, else ``2 .. min(W - 1, B)``
    (at least one generator; no more trainers than groups per batch)."""
    if cfg.n_trainers:
        return [cfg.n_trainers]
    return list(range(min(world_size - 1, cfg.groups_per_batch), 1, -1))


def choose_layout(rates: Rates, cfg: CapstoneConfig, world_size: int) -> Plan:
    """The feasible candidate with the most predicted answer tokens/s (ties: more trainers, then
    fewer slots); candidates: :func:`trainer_choices` x (``cfg.n_slots`` or :data:`SLOT_CHOICES`).

    Raises:
        ValueError: no candidate is feasible (the message has the model's reasons).
    """
    best: tuple[float, int, int] | None = None
    reasons = []
    for n_trainers in trainer_choices(cfg, world_size):
        for n_slots in sorted(rates.decode_step_s):
            p = answer_rate(rates, cfg, world_size, n_trainers, n_slots)
            if p.infeasible:
                reasons.append(f"{n_trainers} trainers x {n_slots} slots: {p.infeasible}")
                continue
            if best is None or p.tokens_per_s > best[0] * (1 + 1e-9):
                best = (p.tokens_per_s, n_trainers, n_slots)
    if best is None:
        raise ValueError("lesson 08's model finds no feasible layout: " + "; ".join(reasons))
    _, n_trainers, n_slots = best
    chosen = answer_rate(rates, cfg, world_size, n_trainers, n_slots)
    sync = answer_rate(rates, cfg, world_size, n_trainers, n_slots, max_lag=0)
    rates_json = asdict(rates)
    rates_json["decode_step_s"] = {str(k): v for k, v in rates.decode_step_s.items()}
    return Plan(
        world_size=world_size,
        n_trainers=n_trainers,
        n_slots=n_slots,
        predicted_tokens_per_s=float(chosen.tokens_per_s),
        predicted_sync_tokens_per_s=float(sync.tokens_per_s),
        predicted_mean_lag=float(chosen.mean_lag_steps),
        rates=rates_json,
    )


def rates_from_plan(plan: dict[str, Any]) -> Rates:
    """The :class:`Rates` a plan saved (``plan.json``, a report's ``layout``)."""
    if plan.get("rates") is None:
        raise ValueError("this run's layout was given, not calibrated: it saved no rates (run with --calibrate)")
    data = dict(plan["rates"])
    data["decode_step_s"] = {int(k): float(v) for k, v in data["decode_step_s"].items()}
    data["answer_tokens"] = tuple(data["answer_tokens"])
    return Rates(**data)


def given_layout(cfg: CapstoneConfig, world_size: int) -> Plan:
    """Without calibration: ``cfg.n_trainers`` (default 2) and ``cfg.n_slots`` (default 32)."""
    return Plan(world_size=world_size, n_trainers=cfg.n_trainers or 2, n_slots=cfg.n_slots or 32)


@dataclass(frozen=True)
class LayoutRow:
    """One candidate layout of :func:`layout_rows`: rates in answer tokens/s."""

    trainers: int
    slots: int
    decode_step_s: float  # l1(S): one decoding step of ``slots`` slots, a rank alone
    production: float  # the generators alone: (W - T) S sigma / l1(S)
    consumption: float  # the trainers alone: T c1 sigma (B / ceil(B / T) / T each)
    tokens_per_s: float  # lesson 08's prediction (11.3), every bound applied
    updates_per_s: float
    bound: (
        str  # what limits it: "production", "consumption", "the admission window (08.11)", "the straggler wait (08.14)"
    )


def layout_rows(rates: Rates, cfg: CapstoneConfig, world_size: int) -> list[LayoutRow]:
    """Every split and timed slot count with lesson 08's prediction: the table :func:`choose_layout`
    keeps the fastest row of (trainers from :func:`trainer_choices`, slots ascending)."""
    answers = np.asarray(rates.answer_tokens, dtype=np.float64)
    to_answer = float(answers.sum() / sequence_steps(rates.answer_tokens).sum())  # sequence steps -> answer tokens
    rows = []
    for trainers in trainer_choices(cfg, world_size):
        for slots in sorted(rates.decode_step_s):
            spec = spec_for(rates, cfg, world_size, trainers, slots)
            production = (world_size - trainers) * slots / spec.a_s * to_answer
            consumption = trainers * spec.train_tokens_per_s_per_gpu * to_answer
            p = answer_rate(rates, cfg, world_size, trainers, slots)
            bound = (
                "the straggler wait (08.14)" if p.wait_binds
                else "the admission window (08.11)" if p.cap_binds
                else "consumption" if consumption <= production
                else "production"
            )  # fmt: skip
            rows.append(
                LayoutRow(
                    trainers, slots, rates.decode_step_s[slots], production, consumption, p.tokens_per_s,
                    1 / p.step_s, bound,
                )
            )  # fmt: skip
    return rows


def format_layout_rows(rows: list[LayoutRow], world_size: int, chosen: tuple[int, int] | None = None) -> str:
    """:func:`layout_rows` as a text table, the ``chosen`` (trainers, slots) row marked."""
    head = (
        f"{'trainers':>8} {'generators':>10} {'slots':>5} {'l1(S) ms':>8} {'production':>11} {'consumption':>12} "
        f"{'predicted answer tokens/s':>26} {'updates/s':>10}  bound"
    )
    lines = [head]
    for r in rows:
        mark = "   <- chosen" if (r.trainers, r.slots) == chosen else ""
        lines.append(
            f"{r.trainers:>8} {world_size - r.trainers:>10} {r.slots:>5} {1e3 * r.decode_step_s:>8.2f} "
            f"{r.production:>11,.0f} {r.consumption:>12,.0f} {r.tokens_per_s:>26,.0f} {r.updates_per_s:>10.1f}  "
            f"{r.bound}{mark}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class ArmPrediction:
    """Lesson 08's prediction for one arm of lesson 11's comparison (:func:`predict_arm`)."""

    gen_share: float  # the share of a core (or GPU) a generator gets while it decodes
    train_share: float  # ... a trainer while it trains (per trainer, its part of the batch counted)
    updates_per_s: float  # with the calibration's rates and the arm's answer lengths
    updates_per_s_measured_cd: float  # ... and c, d taken from the run (``rates_run``, ``weight_sync_s``)
    mean_lag: float  # (08.12) with c, d measured; 0 for synchronous arms


def predict_arm(
    rates: Rates,
    cfg: CapstoneConfig,
    world_size: int,
    name: str,
    n_trainers: int,
    n_slots: int,
    answer_tokens: tuple[int, ...],
    rates_run: Rates,
    weight_sync_s: float = 0.0,
) -> ArmPrediction:
    """What the model says of an arm (:data:`~.config.ARMS` ``name``) that ran with ``n_trainers``
    and ``n_slots`` (for ``sync-colocated``: ``n_trainers`` ranks each sample, then train) and
    produced ``answer_tokens``; ``rates_run`` are ``rates`` with the trainer rate a run measured,
    ``weight_sync_s`` the arm's median send (lesson 08's ``d``)."""
    if name == "sync-colocated":  # one rank per unit decodes, then trains: no send, no lag
        p_arm = colocated_sync_rate(rates, cfg, n_trainers, answer_tokens=answer_tokens)
        p_run = colocated_sync_rate(rates_run, cfg, n_trainers, answer_tokens=answer_tokens)
        share = rates.share(min(n_trainers, rates.local_ranks))
        return ArmPrediction(share, share, 1 / p_arm.step_s, 1 / p_run.step_s, 0.0)
    lag = 0 if name.startswith("sync") else cfg.max_lag
    spec = spec_for(rates, cfg, world_size, n_trainers, n_slots, max_lag=lag)
    p_arm = answer_rate(rates, cfg, world_size, n_trainers, n_slots, max_lag=lag, answer_tokens=answer_tokens)
    p_run = answer_rate(
        rates_run, cfg, world_size, n_trainers, n_slots, max_lag=lag, answer_tokens=answer_tokens,
        weight_sync_s=weight_sync_s,
    )  # fmt: skip
    per_trainer = trainer_capacity(n_trainers, cfg.groups_per_batch) / n_trainers
    return ArmPrediction(
        rates.decode_step_s[n_slots] / spec.a_s,
        spec.train_tokens_per_s_per_gpu / rates.train_steps_per_s / per_trainer,
        1 / p_arm.step_s,
        1 / p_run.step_s,
        float(p_run.mean_lag_steps),
    )
