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
  forward pass covers both), timed on a batch of the warm-started policy's own answers;
* lengths are sequence steps (:func:`~course_lib.layout.calibrate.sequence_steps`) of answers
  sampled from the warm-started policy; predictions are turned back into answer tokens/s;
* ``W`` ranks on fewer cores share them: every rate is scaled by ``cpu_share = min(1,
  cores / W)`` (an honest prediction for an oversubscribed laptop); on GPUs, ``min(1,
  GPUs / W)`` (1 with a GPU per rank), the parts timed on the GPU.

With ``max_lag = 0`` the model's pipeline *is* the synchronous split layout (eq. 08.9), so
the same call predicts the synchronous baseline the benchmark measures.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch

from course_lib.capstone.config import SLOT_CHOICES, CapstoneConfig
from course_lib.layout.calibrate import sample_answer_tokens, sequence_steps, time_decode_steps
from course_lib.layout.model import SystemSpec, predict
from course_lib.lm.model import TinyLM, sequence_logprobs
from course_lib.lm.task import CountdownTask, teacher_forcing_batch


@dataclass(frozen=True)
class Rates:
    """What :func:`calibrate` measured (seconds, steps per second)."""

    decode_step_s: dict[int, float]  # n_slots -> l(n_slots), one thread, this machine
    train_steps_per_s: float  # c: sequence steps one trainer consumes per second
    answer_tokens: tuple[int, ...]  # one batch of the policy's answer lengths (tokens, <eos> included)
    cpu_share: float  # min(1, cores / ranks)
    seconds: float  # how long the calibration took


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
        head = (
            f"layout: {self.world_size} ranks = {self.n_trainers} trainers (data parallel) + {self.n_generators} "
            f"generator(s) x {self.n_slots} slots; batch {cfg.groups_per_batch} prompts x {cfg.group_size} answers; "
            f"max_lag {cfg.max_lag}"
        )
        if self.predicted_tokens_per_s is None or self.rates is None:
            return head + " (given, not calibrated)"
        r = self.rates
        steps = ", ".join(f"{n} slots {1e3 * s:.2f} ms" for n, s in sorted(r["decode_step_s"].items()))
        return (
            f"{head}\ncalibrated in {r['seconds']:.1f} s: decode step {steps}; trainer {r['train_steps_per_s']:,.0f} "
            f"sequence steps/s; cpu share {r['cpu_share']:.2f} per rank\n"
            f"lesson 08's model predicts {self.predicted_tokens_per_s:,.0f} answer tokens/s "
            f"(mean lag {self.predicted_mean_lag:.1f} updates); synchronous (max_lag 0) on the same split: "
            f"{self.predicted_sync_tokens_per_s:,.0f}"
        )


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


def calibrate(model: TinyLM, task: CountdownTask, cfg: CapstoneConfig, world_size: int) -> Rates:
    """Time the parts of a run on this machine (one torch thread, as every rank runs), on the
    device ``model`` is on (the ranks' device: a CPU core, or a GPU under NCCL or colocated).
    The rates are per core (CPU) or per GPU, scaled by the ranks' share of them."""
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
    device = next(model.parameters()).device
    if device.type == "cuda":  # ranks share the GPUs (colocated) or have one each
        units = torch.cuda.device_count()
    else:
        units = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return Rates(
        decode_step_s={int(n): float(s) for n, s in zip(slots, step_s)},
        train_steps_per_s=float(c),
        answer_tokens=tuple(int(a) for a in answers),
        cpu_share=min(1.0, units / world_size),
        seconds=time.perf_counter() - t0,
    )


def spec_for(rates: Rates, cfg: CapstoneConfig, world_size: int, n_trainers: int, n_slots: int) -> SystemSpec:
    """Lesson 08's :class:`~course_lib.layout.SystemSpec` of one candidate layout (see the module docstring)."""
    share = rates.cpu_share
    return SystemSpec(
        n_gpus=world_size,
        n_samplers=world_size - n_trainers,
        batch_samples=cfg.batch_sequences,
        max_batch=n_slots,
        a_s=rates.decode_step_s[n_slots] / share,
        b_s=0.0,
        train_tokens_per_s_per_gpu=rates.train_steps_per_s * share,
        answer_tokens=tuple(int(s) for s in sequence_steps(rates.answer_tokens)),
        max_lag=cfg.max_lag,
        # The capstone's trainer takes groups in ticket order and waits for them, which bounds every
        # lag; the planner keeps lesson 08's FIFO rule, which does not charge that wait, so its
        # prediction is optimistic where a straggler is long (lesson 11, section 3).
        admission="fifo",
    )


def choose_layout(rates: Rates, cfg: CapstoneConfig, world_size: int) -> Plan:
    """The candidate with the most predicted answer tokens/s (ties: fewer generators, then fewer slots).

    Candidates: ``n_trainers`` = ``cfg.n_trainers`` if set, else ``2 .. W - 1``; ``n_slots`` =
    ``cfg.n_slots`` if set, else :data:`SLOT_CHOICES`.
    """
    answer = np.asarray(rates.answer_tokens, dtype=np.float64)
    to_answer = answer.sum() / sequence_steps(rates.answer_tokens).sum()  # steps/s -> answer tokens/s
    trainers = [cfg.n_trainers] if cfg.n_trainers else list(range(world_size - 1, 1, -1))
    best: tuple[float, int, int] | None = None
    for n_trainers in trainers:
        for n_slots in sorted(rates.decode_step_s):
            p = predict("pipeline", spec_for(rates, cfg, world_size, n_trainers, n_slots))
            if best is None or p.tokens_per_s > best[0] * (1 + 1e-9):
                best = (p.tokens_per_s, n_trainers, n_slots)
    assert best is not None
    _, n_trainers, n_slots = best
    spec = spec_for(rates, cfg, world_size, n_trainers, n_slots)
    chosen = predict("pipeline", spec)
    sync = predict("pipeline", replace(spec, max_lag=0))
    rates_json = asdict(rates)
    rates_json["decode_step_s"] = {str(k): v for k, v in rates.decode_step_s.items()}
    return Plan(
        world_size=world_size,
        n_trainers=n_trainers,
        n_slots=n_slots,
        predicted_tokens_per_s=float(chosen.tokens_per_s * to_answer),
        predicted_sync_tokens_per_s=float(sync.tokens_per_s * to_answer),
        predicted_mean_lag=float(chosen.mean_lag_steps),
        rates=rates_json,
    )


def given_layout(cfg: CapstoneConfig, world_size: int) -> Plan:
    """Without calibration: ``cfg.n_trainers`` (default 2) and ``cfg.n_slots`` (default 32)."""
    return Plan(world_size=world_size, n_trainers=cfg.n_trainers or 2, n_slots=cfg.n_slots or 32)
