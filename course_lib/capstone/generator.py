"""The generator ranks: lesson 07's KV-cache sampler, continuous batching, in-flight weight updates.

Each generator runs one :class:`~course_lib.lm.sampler.SlotSampler` and loops::

    stop, announced, consumed <- store (one request: a consistent snapshot)
    if announced > my version:   receive it (lesson 09's engine or the shared buffer), keep the KV cache
    for every free slot:         start the next answer of the group being issued; a new group needs a
                                 ticket k (store counter) and admission k < consumed + (max_lag + 1) B
    one decoding step; verify the answers that ended; hand over every complete group

**Lag bound** (lesson 07's backpressure, now across processes and generators): trainer 0
announces version ``v``, sends it, and only then raises ``consumed`` to ``vB``; a snapshot
that shows ``consumed = vB`` also shows ``announced >= v``, and the generator receives that
before it starts anything. So group ``k`` starts with a version ``>= consumed / B`` and is
consumed by update ``floor(k / B) <= consumed / B + max_lag``: no token lags more than
``max_lag`` updates (``max_lag = 0``: synchronous RL, every group of update ``u`` sampled
by version ``u``).

**Handing a group over.** A ``generated`` line goes to the metrics first (the ledger's
evidence), then the group (JSON: prompt, answers with their tokens, behaviour log-probs,
per-token versions, rewards) to the store key ``g/{k}``, where its trainer waits for it.
A group's prompt depends only on ``(seed, k)``: the same stream whichever generator draws
it, and again after a restart.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np

from course_lib.capstone.channels import WeightChannel
from course_lib.capstone.config import CapstoneConfig
from course_lib.capstone.context import RunStore
from course_lib.capstone.faults import kill_once
from course_lib.capstone.ledger import answers_digest
from course_lib.capstone.metrics import MetricsWriter
from course_lib.lm.model import TinyLM
from course_lib.lm.sampler import SlotSampler, generator_for
from course_lib.lm.task import EOS, CountdownTask, Problem
from course_lib.rl.staleness import may_start_group

#: How often an idle generator (at the backpressure bound, or waiting for weights) asks the store again.
IDLE_POLL_S = 0.002


def problem_for(task: CountdownTask, seed: int, k: int) -> Problem:
    """Group ``k``'s prompt: a function of ``(seed, k)`` only."""
    return task.sample(np.random.default_rng([seed, k]), 1)[0]


def completed_group(
    metrics: MetricsWriter,
    k: int,
    rank: int,
    attempt: int,
    start_version: int,
    problem: Problem,
    answers: list[dict[str, Any]],
) -> dict[str, Any]:
    """Group ``k``'s ``generated`` line (the ledger's evidence: its answers' lengths and a digest of
    their tokens) written first, then the group itself, as its trainer receives it."""
    metrics.log(
        "generated",
        k=k,
        samples=len(answers),
        tokens=sum(len(a["answer"]) for a in answers),
        lengths=[len(a["answer"]) for a in answers],
        digest=answers_digest(a["answer"] for a in answers),
        start_version=start_version,
    )
    return {
        "k": k,
        "rank": rank,
        "attempt": attempt,
        "start_version": start_version,
        "prompt": problem.prompt,
        "answers": answers,
    }


class Generator:
    """One generator rank (see the module docstring)."""

    def __init__(
        self,
        cfg: CapstoneConfig,
        rank: int,
        attempt: int,
        model: TinyLM,
        n_slots: int,
        store: RunStore,
        metrics: MetricsWriter,
        channel: WeightChannel,
    ) -> None:
        self.cfg, self.rank, self.attempt = cfg, rank, attempt
        self.model, self.store, self.metrics, self.channel = model, store, metrics, channel
        self.task = CountdownTask()
        gen = generator_for(model, cfg.seed * 1_000_003 + rank * 1009 + attempt)  # on the model's device
        self.sampler = SlotSampler(model, n_slots, EOS, gen, version=-1)
        self.groups: dict[int, dict[str, Any]] = {}
        self.owner: dict[int, int] = {}  # slot -> group
        self.ticket: int | None = None  # a group number drawn but not admitted yet
        self.issuing, self.left = -1, 0  # the group whose answers are being started, how many are left
        self.handed = 0
        self.tokens = 0

    def receive(self, version: int) -> None:
        """The in-flight update: load ``version`` between two decoding steps, keep the KV cache."""
        t0 = time.time()
        timing = self.channel.receive(self.model, version)
        t1 = time.time()
        self.sampler.weights_changed(timing.version, recompute=False)
        self.metrics.span("sync", t0, t1, version=timing.version)
        self.metrics.log("sync", side="receive", in_flight=self.sampler.n_active, **timing.as_dict())
        if self.cfg.kill_rank == self.rank and timing.version == self.cfg.kill_at_update:
            kill_once(self.cfg.run_dir, self.rank, timing.version, self.metrics, "generator")

    def refill(self, consumed: int) -> None:
        """Start an answer in every free slot, group after group, while admission allows."""
        B = self.cfg.groups_per_batch
        for slot in self.sampler.free_slots():
            if self.left == 0:
                if self.ticket is None:
                    self.ticket = self.store.add("next_group", 1) - 1
                if not may_start_group(self.ticket, consumed, self.cfg.max_lag, B):
                    return  # backpressure
                k, self.ticket = self.ticket, None
                problem = problem_for(self.task, self.cfg.seed, k)
                self.groups[k] = {"problem": problem, "start_version": self.sampler.version, "answers": []}
                self.issuing, self.left = k, self.cfg.group_size
            self.sampler.start(slot, self.groups[self.issuing]["problem"].prompt)
            self.owner[slot] = self.issuing
            self.left -= 1

    def finish(self, slot: int) -> None:
        """Verify the answer that ended in ``slot``; hand its group over if that completes it."""
        k = self.owner.pop(slot)
        res = self.sampler.result(slot)
        p = int(res["prompt_len"])
        group = self.groups[k]
        answer = res["tokens"][p:].tolist()
        group["answers"].append(
            {
                "answer": answer,
                "logp": res["logp"][p:].tolist(),
                "versions": res["versions"][p:].tolist(),
                "reward": self.task.reward(group["problem"], answer),
            }
        )
        self.tokens += len(answer)
        if len(group["answers"]) == self.cfg.group_size:
            self.hand_over(k)

    def hand_over(self, k: int) -> None:
        g = self.groups.pop(k)
        payload = completed_group(
            self.metrics, k, self.rank, self.attempt, g["start_version"], g["problem"], g["answers"]
        )
        self.store.set(f"g/{k}", json.dumps(payload))
        self.handed += 1

    def run(self) -> None:
        """Decode until trainer 0 sets ``stop`` (see the module docstring)."""
        stalled_since = time.monotonic()
        last_consumed = -1
        while True:
            stop, announced, consumed = self.store.ints("stop", "announced", "consumed")
            if stop:
                break
            if announced > self.sampler.version:
                self.receive(announced)
            if consumed != last_consumed:
                last_consumed, stalled_since = consumed, time.monotonic()
            elif time.monotonic() - stalled_since > 4 * self.cfg.timeout_s:
                raise TimeoutError(f"the trainers consumed nothing for {4 * self.cfg.timeout_s:g} s: giving up")
            if self.sampler.version >= 0:
                self.refill(consumed)
            if self.sampler.n_active == 0:
                # backpressure, or waiting for weights: poll the store every 2 ms, not in a tight loop (an idle
                # generator must leave its core to the ranks that work, synchronous RL's trainers above all)
                time.sleep(IDLE_POLL_S)
                continue
            t0 = time.time()
            finished = self.sampler.step()
            self.metrics.busy(t0, time.time())
            for slot in finished:
                self.finish(slot)
        self.metrics.flush_busy()
        self.metrics.log("generator_done", handed=self.handed, tokens=self.tokens, swaps=self.sampler.swaps)
