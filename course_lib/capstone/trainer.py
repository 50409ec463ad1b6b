"""The trainer ranks: a data-parallel learner with lesson 07's truncated-IS loss.

Every trainer holds the same model and Adam state. Update ``u``::

    wait for my groups of u (store keys g/{k}, k = uB .. (u+1)B-1 routed to me)     phase "wait"
    loss_t = sum over my tokens of (07.2)'s terms;  backward                          phase "train"
    [grads, n, stats] = all_reduce([my grads, my answer tokens, my reward, lag
        histogram, sum w, sum w^2, group identities ...], SUM): one message          phase "allreduce"
    grads /= n   (n: the whole batch's tokens, so grads = (07.2)'s gradient on the whole batch)
    Adam step (identical on every trainer: identical gradients, identical state)      "train"
    trainer 0: announce u+1, send the weights (lesson 09's engine), consumed = (u+1)B    phase "sync"
    trainer 0: every checkpoint_every updates, a checkpoint (lesson 10's atomic commit)  phase "checkpoint"

Each shard's loss is a sum over its tokens; the all-reduced sum of the trainers' gradients,
divided by the *global* token count that travels in the same message, is exactly the gradient
of (07.2) over the whole batch (tested against the single-process loss). One collective per
update: at half a megabyte its cost is mostly latency, which a second and third message (the
token count first, the statistics after) would pay again. An explicit all-reduce rather than
DDP, which would average and needs one forward per step (the trainer runs one forward per
chunk of similar lengths).

**Checkpoint** (trainer 0, :func:`~course_lib.checkpoint.torch_state.save_torch_state`, atomic):
model weights, Adam moments and step counts, the update count, the sample ledger, the layout,
the config and the evaluation reward at the start. **Resume** restores these bit-exactly
(trainer 0 loads, the others receive them by broadcast); the groups after the checkpoint are
sampled again, from the same prompts (a group's prompt depends only on ``(seed, k)``) but
with other sampling noise and other in-flight timing, so the continuation is not bitwise the
uninterrupted run's (asynchronous RL is not a deterministic function of the seed).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from course_lib.capstone.channels import WeightChannel
from course_lib.capstone.config import CapstoneConfig
from course_lib.capstone.context import RunStore
from course_lib.capstone.faults import kill_once
from course_lib.capstone.ledger import SampleLedger, answers_digest
from course_lib.capstone.metrics import MetricsWriter
from course_lib.capstone.roles import Roles
from course_lib.lm.model import TinyLM, sequence_logprobs
from course_lib.lm.sampler import generator_for, sample_problems
from course_lib.lm.task import EOS, PROMPT_LEN, QUOTIENT_CLASSES, CountdownTask, quotient_class
from course_lib.pipeline.loss import group_token_advantages, pad_groups, pipeline_loss, token_lags

#: The checkpoints of a run, below its run directory.
CHECKPOINTS = "checkpoints"


def shard_loss(
    model: TinyLM, batch: dict[str, Any], n_tokens: int, clip_c: float, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """This shard's part of (07.2): ``sum over its real tokens of sg[w] A log pi / n_tokens``,
    where ``n_tokens`` counts the real tokens of the *whole* batch (all shards).

    Sequences go through the model in chunks of ``chunk``, sorted by length and each padded
    only to its own longest. Returns (the loss to backpropagate, ``log pi - log mu`` of the
    real tokens, detached, in chunk order).
    """
    mask = batch["mask"]
    adv = group_token_advantages(batch["rewards"], mask)
    ends = mask.shape[1] - mask.flip(1).float().argmax(1)
    device = next(model.parameters()).device
    loss = torch.zeros((), device=device)
    log_ratios = []
    for rows in torch.argsort(ends, stable=True).split(chunk):
        n_t = int(ends[rows].max())
        m = mask[rows, :n_t].to(device)
        logp_b = batch["logp"][rows, :n_t].to(device)
        logp_new = sequence_logprobs(model, batch["tokens"][rows, :n_t].to(device))
        part = pipeline_loss(logp_new, logp_b, adv[rows, :n_t].to(device), m, clip_c)
        loss = loss + part * m.sum() / n_tokens
        log_ratios.append((logp_new.detach() - logp_b)[m])
    return loss, torch.cat(log_ratios)


def loss_rows(groups: list[dict[str, Any]], batch: dict[str, Any]) -> list[list[Any]]:
    """``[attempt, k, rows, tokens, digest]`` per group of ``batch`` (:func:`pad_groups` of ``groups``):
    the rows and answer tokens that enter the loss (under the mask), and a digest of those tokens
    (:func:`~course_lib.capstone.ledger.answers_digest`), to be held against the generator's."""
    tokens, mask = batch["tokens"], batch["mask"]
    out, row = [], 0
    for g in groups:
        answers = [tokens[i][mask[i]].tolist() for i in range(row, row + len(g["answers"]))]
        row += len(g["answers"])
        out.append([g["attempt"], g["k"], len(answers), sum(len(a) for a in answers), answers_digest(answers)])
    return out


def heldout_by_class(model: TinyLM, task: CountdownTask, n: int, seed: int, shard: int, n_shards: int) -> np.ndarray:
    """This shard's share of ``n`` fixed prompts of ``task`` (every ``n_shards``-th, from
    ``shard``), one answer each at temperature 1 (lesson 07's measure, split over the
    trainers), per class of :data:`~course_lib.lm.task.QUOTIENT_CLASSES`: an array
    ``[class, (sum of rewards, prompts, sum of answer tokens)]``, to be summed over shards."""
    out = np.zeros((len(QUOTIENT_CLASSES), 3))
    problems = task.sample(np.random.default_rng(seed), n)[shard::n_shards]
    if not problems:
        return out
    gen = generator_for(model, seed * 1000 + shard)  # on the model's device, as the sampler's tensors
    with torch.no_grad():
        results = sample_problems(model, [p.prompt for p in problems], 128, EOS, gen)
    for p, r in zip(problems, results):
        answer = r["tokens"][PROMPT_LEN:].tolist()
        out[quotient_class(p.n // p.k)] += (task.reward(p, answer), 1, len(answer))
    return out


def heldout_reward(
    model: TinyLM, task: CountdownTask, n: int, seed: int, shard: int, n_shards: int
) -> tuple[float, int]:
    """(sum of rewards, count) of this shard's share (:func:`heldout_by_class`, all classes)."""
    per_class = heldout_by_class(model, task, n, seed, shard, n_shards)
    return float(per_class[:, 0].sum()), int(per_class[:, 1].sum())


@dataclass
class TrainerState:
    """What a trainer starts from: fresh (warm start) or restored from a checkpoint."""

    model: TinyLM
    optimizer: torch.optim.Optimizer
    step: int  # updates already done
    ledger: SampleLedger
    eval_start: float | None  # evaluation reward before any RL update (None until measured)
    resumed_from: Path | None = None


def state_digest(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 of a state dict's bytes (names sorted): equal digests mean bitwise-equal weights."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


class Trainer:
    """One trainer rank (see the module docstring)."""

    def __init__(
        self,
        cfg: CapstoneConfig,
        roles: Roles,
        rank: int,
        attempt: int,
        state: TrainerState,
        store: RunStore,
        metrics: MetricsWriter,
        trainer_group: dist.ProcessGroup,
        channel: WeightChannel | None,
        device: torch.device,
    ) -> None:
        self.cfg, self.roles, self.rank, self.attempt = cfg, roles, rank, attempt
        self.state, self.store, self.metrics = state, store, metrics
        self.group, self.channel, self.device = trainer_group, channel, device
        self.task = CountdownTask()  # the evaluation draws its fixed prompts from the training distribution
        self.index = roles.trainers.index(rank)
        if cfg.colocated_sync:  # this rank also samples its share of every batch
            self.sampler_gen = generator_for(state.model, cfg.seed * 1_000_003 + rank * 1009 + attempt)
        self._spans: list[tuple[str, float, float]] = []  # this update's all-reduces (name, start, end)

    # ---- collectives of the trainer group ------------------------------------------------

    def _sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        t0 = time.time()
        dist.all_reduce(t, group=self.group)
        out = [float(x) for x in t.tolist()]
        self._spans.append(("allreduce", t0, time.time()))
        return out

    def _all_reduce_grads(self, stats: list[float]) -> list[float]:
        """One all-reduce of every gradient, flattened, with ``stats`` appended (one message, as
        DDP's buckets): ``stats[0]`` is this shard's token count, by which the summed gradients are
        then divided (each shard's loss is a sum: (11.1)). Returns the summed ``stats``, exact
        while every value is an integer below 2**24 or a float sum (float32, as the gradients)."""
        params = [p for p in self.state.model.parameters()]
        extra = torch.tensor(stats, dtype=torch.float32, device=params[0].device)
        flat = torch.cat(
            [p.grad.reshape(-1) if p.grad is not None else torch.zeros_like(p).reshape(-1) for p in params] + [extra]
        )
        if flat.is_cuda:  # the backward pass is asynchronous: let it finish before the all-reduce's clock starts
            torch.cuda.synchronize(flat.device)
        t0 = time.time()
        dist.all_reduce(flat, group=self.group)
        if flat.is_cuda:
            torch.cuda.synchronize(flat.device)
        self._spans.append(("allreduce", t0, time.time()))
        summed = flat[flat.numel() - len(stats) :].double().tolist()
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p) / summed[0]  # the whole batch's tokens: (07.2)'s mean
            offset += n
        return summed

    def evaluate(self, when: str) -> float:
        """Evaluation reward on ``eval_prompts`` fixed prompts (drawn as the training prompts are: the
        task has a few hundred problems, so this measures what the policy learned, not how it
        generalises), split over the trainers; trainer 0 logs it, with the reward, prompts and mean
        answer length per quotient class."""
        with self.metrics.phase("eval"), self.device:  # the sampler's tensors beside the model
            local = heldout_by_class(
                self.state.model,
                self.task,
                self.cfg.eval_prompts,
                self.cfg.eval_seed,
                self.index,
                self.roles.n_trainers,
            )
            per_class = np.reshape(self._sum(local.reshape(-1).tolist()), local.shape)
        total, count = float(per_class[:, 0].sum()), float(per_class[:, 1].sum())
        reward = total / max(count, 1.0)
        if self.rank == 0:
            by_class = [
                {
                    "quotients": [lo, hi],
                    "prompts": int(n),
                    "reward": r / n if n else None,
                    "answer_tokens": t / n if n else None,
                }
                for (lo, hi), (r, n, t) in zip(QUOTIENT_CLASSES, per_class.tolist())
            ]
            self.metrics.log(
                "eval", when=when, reward=reward, prompts=int(count), step=self.state.step, by_class=by_class
            )
        return reward

    # ---- one update ----------------------------------------------------------------------

    def _generate_groups(self, u: int) -> list[dict[str, Any]]:
        """Synchronous RL on the same ranks (``--colocated-sync``): sample my groups of update ``u``
        with my own weights, the version ``u`` every trainer holds (no transfer: the trainer's model
        is the sampler's), all at once, until the longest answer ends."""
        from course_lib.capstone.generator import completed_group, problem_for

        cfg, model = self.cfg, self.state.model
        ks = self.roles.groups_for(self.rank, u, cfg.groups_per_batch)
        problems = [problem_for(self.task, cfg.seed, k) for k in ks]
        prompts = [p.prompt for p in problems for _ in range(cfg.group_size)]
        with self.metrics.phase("decode", update=u), self.device, torch.no_grad():
            results = sample_problems(model, prompts, len(prompts), EOS, self.sampler_gen)
        groups = []
        for i, (k, problem) in enumerate(zip(ks, problems)):
            answers = []
            for r in results[i * cfg.group_size : (i + 1) * cfg.group_size]:
                p = int(r["prompt_len"])
                answer = r["tokens"][p:].tolist()
                answers.append(
                    {
                        "answer": answer,
                        "logp": r["logp"][p:].tolist(),
                        "versions": [u] * len(answer),
                        "reward": self.task.reward(problem, answer),
                    }
                )
            groups.append(completed_group(self.metrics, k, self.rank, self.attempt, u, problem, answers))
        return groups

    def _wait_groups(self, u: int) -> list[dict[str, Any]]:
        """My groups of update ``u`` from the store (deleted once read), in ``k`` order."""
        out = []
        for k in self.roles.groups_for(self.rank, u, self.cfg.groups_per_batch):
            out.append(self.store.get_json(f"g/{k}", f"group {k} (update {u}) from the generators"))
            self.store.delete(f"g/{k}")
        return out

    def update(self, u: int, groups: list[dict[str, Any]], opt: torch.optim.Optimizer) -> dict[str, Any]:
        """One data-parallel step at version ``u`` on my ``groups``; returns the global metrics."""
        cfg, model = self.cfg, self.state.model
        batch = pad_groups(groups)
        mask = batch["mask"]
        lag = token_lags(u, batch["versions"].numpy(), mask.numpy())[mask.numpy()]
        loss, log_ratio = shard_loss(model, batch, 1, cfg.clip_c, cfg.train_chunk)  # a sum: / n after the all-reduce
        opt.zero_grad()
        loss.backward()
        w = torch.exp(log_ratio.double().clamp(max=20.0))  # w, w^2 summed in float32 (the one message): finite
        bins = cfg.max_lag + 2  # 0 .. max_lag, and one bin for "more" (never filled if the bound holds)
        hist = np.bincount(np.minimum(lag, bins - 1), minlength=bins)
        # the groups' own identities (generation attempt, k, answers), from every trainer: the ledger's record
        per = math.ceil(cfg.groups_per_batch / self.roles.n_trainers)
        if len(groups) > per:
            raise RuntimeError(
                f"trainer {self.rank} got {len(groups)} groups in update {u}, at most {per} routed to it"
            )
        ids = np.zeros((self.roles.n_trainers, per, 3))
        for i, g in enumerate(groups):
            ids[self.index, i] = (g["attempt"] + 1, g["k"] + 1, len(g["answers"]))  # 0 = no group
        local = [
            float(mask.sum()),  # first: the summed gradients are divided by it
            float(batch["rewards"].sum()),
            float(batch["rewards"].size),
            float(w.sum()),
            float((w * w).sum()),
            float((log_ratio > math.log(cfg.clip_c)).sum()),
            float(loss.detach()),
            float(lag.sum()),
            *hist.astype(float).tolist(),
            *ids.reshape(-1).tolist(),
        ]
        # what entered this shard's loss, group by group, read back from the padded batch: the ledger's content check
        self.metrics.log("trained", update=u, groups=loss_rows(groups, batch))
        n_tokens, r_sum, n_seq, w_sum, w2_sum, clipped, loss_sum, lag_sum, *rest = self._all_reduce_grads(local)
        opt.step()
        hist_all = [int(h) for h in rest[:bins]]
        consumed = [(int(a) - 1, int(k) - 1, int(n)) for a, k, n in np.reshape(rest[bins:], (-1, 3)) if a > 0]
        return {
            "update": u,
            "reward": r_sum / n_seq,
            "tokens": int(n_tokens),
            "samples": int(n_seq),
            "groups": [g["k"] for g in groups],
            "consumed": consumed,
            "ess": w_sum**2 / (n_tokens * w2_sum),
            "clipped": clipped / n_tokens,
            "loss": loss_sum / n_tokens,
            "lag_mean": lag_sum / n_tokens,
            "lag_max": max(i for i, h in enumerate(hist_all) if h),
            "lag_hist": hist_all,
        }

    # ---- the loop ------------------------------------------------------------------------

    def publish(self, version: int) -> None:
        """Trainer 0: announce ``version`` and send it to every generator (a broadcast is announced
        first, since the generators must join it; a shared buffer is written first), then let them
        start the groups it frees by raising ``consumed``."""
        assert self.channel is not None
        if self.channel.announce_first:
            self.store.set_int("announced", version)
        with self.metrics.phase("sync", version=version):
            timing = self.channel.send(self.state.model, version)
        if not self.channel.announce_first:
            self.store.set_int("announced", version)
        self.store.set_int("consumed", version * self.cfg.groups_per_batch)
        self.metrics.log("sync", side="send", **timing.as_dict())

    def save_checkpoint(self, step: int, plan: dict[str, Any]) -> None:
        from course_lib.checkpoint.atomic import keep_last
        from course_lib.checkpoint.torch_state import save_torch_state

        extra = {
            "ledger": self.state.ledger.to_json(),
            "config": self.cfg.to_dict(),
            "plan": plan,
            "eval_start": self.state.eval_start,
            "attempt": self.attempt,
        }
        root = checkpoint_root(self.cfg.run_dir)
        with self.metrics.phase("checkpoint", step=step):
            save_torch_state(root, step, self.state.model, self.state.optimizer, extra=extra)
            keep_last(root, self.cfg.keep_checkpoints)
        self.metrics.log("checkpoint", step=step)

    def maybe_kill(self, u: int) -> None:
        """Fault injection: SIGKILL this rank once, after update ``kill_at_update`` (a marker file says it happened)."""
        cfg = self.cfg
        if cfg.kill_rank != self.rank or u != cfg.kill_at_update:
            return
        kill_once(cfg.run_dir, self.rank, u, self.metrics, "trainer")

    def run(self, plan: dict[str, Any]) -> None:
        """Updates ``state.step .. n_updates - 1``; trainer 0 publishes and checkpoints; then stop and evaluate."""
        cfg, st = self.cfg, self.state
        if self.channel is not None:
            self.publish(st.step)  # the generators start from the trainer's weights
        for u in range(st.step, cfg.n_updates):
            t0 = time.time()
            groups = self._generate_groups(u) if cfg.colocated_sync else self._wait_groups(u)
            t1 = time.time()
            self._spans.clear()
            m = self.update(u, groups, st.optimizer)
            t2 = time.time()
            if not cfg.colocated_sync:  # (sampling its own groups is the "decode" phase, logged by itself)
                self.metrics.span("wait", t0, t1, update=u)
            # train = the update minus its all-reduces (where a trainer also waits for the others)
            start = t1
            for name, a, b in self._spans:
                self.metrics.span("train", start, a, update=u)
                self.metrics.span(name, a, b, update=u)
                start = b
            self.metrics.span("train", start, t2, update=u)
            t_reduce = sum(b - a for _, a, b in self._spans)
            st.ledger.consume(self.attempt, u, m.pop("consumed"), m["tokens"])
            st.step = u + 1
            if self.rank == 0:
                if u + 1 < cfg.n_updates and self.channel is not None:
                    self.publish(u + 1)
                self.metrics.log(
                    "update",
                    started=t0,
                    time_wait=t1 - t0,
                    time_train=t2 - t1 - t_reduce,
                    time_allreduce=t_reduce,
                    **m,
                )
                if (u + 1) % cfg.checkpoint_every == 0 or u + 1 == cfg.n_updates:
                    self.save_checkpoint(u + 1, plan)
            self.maybe_kill(u)
        if self.rank == 0:
            self.store.set_int("stop", 1)
        self.evaluate("end")
