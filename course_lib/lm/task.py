"""A verifiable task with a long tail of answer lengths: division by repeated subtraction.

Prompt ``n k``; the answer is the scratchpad of repeated subtraction, every intermediate
value down to the remainder, then the end token::

    prompt  <bos> 23 5 <sep>        answer  18 13 8 3 <eos>        (23 = 4 x 5 + 3)

The answer has ``n // k`` numbers (the quotient) plus ``<eos>``. Quotients are drawn from
a power law, ``P(L) ~ L^-alpha`` on ``1..max_quotient``: most answers are short, a few are
very long, as the reasoning traces of an LLM are. The reward is exact: 1 if the sampled
answer equals the scratchpad token for token (ending with ``<eos>``), else 0.

**Held-out problems by construction.** ``CountdownTask(split="train")`` never draws one
``(n, k)`` pair per quotient (a fixed draw, :func:`held_out_pairs`), and
``CountdownTask(split="held_out")`` draws only those pairs, with the same power law over
quotients: a policy measured on the held-out split has never trained on its problems. The
default, ``split=None``, draws from every pair.

Token ids: 0 pad, 1 ``<bos>``, 2 ``<sep>``, 3 ``<eos>``, then the numbers ``0..max_number``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from course_lib.lm.model import TinyLM

PAD, BOS, SEP, EOS = 0, 1, 2, 3
N_SPECIAL = 4
PROMPT_LEN = 4


@dataclass(frozen=True)
class TaskConfig:
    """The countdown task's distribution."""

    max_quotient: int = 64
    steps: tuple[int, ...] = (1, 2, 3)
    alpha: float = 1.2

    def __post_init__(self) -> None:
        if self.max_quotient < 1 or not self.steps or min(self.steps) < 1:
            raise ValueError(f"max_quotient and every step must be >= 1, got {self}")

    @property
    def max_number(self) -> int:
        return self.max_quotient * max(self.steps) + max(self.steps) - 1

    @property
    def vocab(self) -> int:
        """Smallest vocabulary that holds every token (round it up for the model)."""
        return N_SPECIAL + self.max_number + 1

    @property
    def max_len(self) -> int:
        """Prompt + the longest answer + ``<eos>``."""
        return PROMPT_LEN + self.max_quotient + 1


def num(x: int) -> int:
    """Token id of the number ``x``."""
    return N_SPECIAL + int(x)


@dataclass(frozen=True)
class Problem:
    n: int
    k: int

    @property
    def prompt(self) -> list[int]:
        return [BOS, num(self.n), num(self.k), SEP]

    @property
    def answer(self) -> list[int]:
        """The exact scratchpad: ``n - k, n - 2k, ..., n mod k, <eos>``."""
        return [num(self.n - i * self.k) for i in range(1, self.n // self.k + 1)] + [EOS]


SPLITS = (None, "train", "held_out")
#: Classes of problems by quotient (answer length - 1) for reporting what a policy learned: short,
#: middle and long answers, each class about twice the one before (``quotient_class``).
QUOTIENT_CLASSES: tuple[tuple[int, int], ...] = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 64))


def quotient_class(quotient: int, classes: tuple[tuple[int, int], ...] = QUOTIENT_CLASSES) -> int:
    """Index of the class of ``classes`` (inclusive ranges) that holds ``quotient``.

    Raises:
        ValueError: no class holds it.
    """
    for i, (lo, hi) in enumerate(classes):
        if lo <= quotient <= hi:
            return i
    raise ValueError(f"quotient {quotient} is in no class of {classes}")


HOLDOUT_SEED = 2025


def held_out_pairs(config: TaskConfig) -> dict[int, tuple[int, int]]:
    """Quotient ``q`` -> the one ``(k, r)`` (step, remainder) held out of training for it:
    a fixed uniform draw among the ``(k, r)`` pairs of that quotient (seed ``HOLDOUT_SEED``).
    The problem ``n = q k + r, k`` is then never drawn by ``split="train"``."""
    rng = np.random.default_rng(HOLDOUT_SEED)
    pairs = [(k, r) for k in config.steps for r in range(k)]
    if len(pairs) < 2:
        raise ValueError(f"a held-out split needs at least 2 (step, remainder) pairs per quotient, got {pairs}")
    return {q: pairs[int(rng.integers(len(pairs)))] for q in range(1, config.max_quotient + 1)}


class CountdownTask:
    """Samples problems, renders and verifies answers (see the module docstring).

    ``split``: ``None`` (every problem), ``"train"`` (never a held-out pair) or
    ``"held_out"`` (only held-out pairs, one per quotient)."""

    def __init__(self, config: TaskConfig = TaskConfig(), split: str | None = None) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.config = config
        self.split = split
        lengths = np.arange(1, config.max_quotient + 1)
        p = lengths.astype(np.float64) ** -config.alpha
        self.quotient_probs = p / p.sum()
        self.held_out = held_out_pairs(config) if split is not None else {}

    def is_held_out(self, problem: Problem) -> bool:
        """True if ``problem`` is one of the held-out pairs (never drawn by ``split="train"``)."""
        q, r = divmod(problem.n, problem.k)
        return self.held_out.get(q) == (problem.k, r) if self.held_out else False

    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """``n`` problems: a power-law quotient, a step, a remainder below the step (within
        the split: see the class docstring)."""
        cfg = self.config
        q = rng.choice(cfg.max_quotient, size=n, p=self.quotient_probs) + 1
        k = rng.choice(np.array(cfg.steps), size=n)
        r = (rng.random(n) * k).astype(np.int64)
        if self.split == "held_out":
            kr = np.array([self.held_out[int(qi)] for qi in q]).reshape(n, 2)
            k, r = kr[:, 0], kr[:, 1]
        elif self.split == "train":
            bad = np.array([self.held_out[int(qi)] == (int(ki), int(ri)) for qi, ki, ri in zip(q, k, r)], bool)
            while bad.any():  # draw the step and remainder again for those, as the default split would
                k[bad] = rng.choice(np.array(cfg.steps), size=int(bad.sum()))
                r[bad] = (rng.random(int(bad.sum())) * k[bad]).astype(np.int64)
                bad = np.array([self.held_out[int(qi)] == (int(ki), int(ri)) for qi, ki, ri in zip(q, k, r)], bool)
        return [Problem(int(qi * ki + ri), int(ki)) for qi, ki, ri in zip(q, k, r)]

    @staticmethod
    def reward(problem: Problem, answer: list[int]) -> float:
        """The exact verifier: 1.0 if ``answer`` is the scratchpad token for token, else 0.0."""
        return float(list(answer) == problem.answer)

    @staticmethod
    def render(tokens: list[int]) -> str:
        names = {PAD: "<pad>", BOS: "<bos>", SEP: "<sep>", EOS: "<eos>"}
        return " ".join(names.get(t, str(t - N_SPECIAL)) for t in tokens)

    def mean_answer_tokens(self) -> float:
        """Expected answer length in tokens (quotient + ``<eos>``)."""
        return float((self.quotient_probs * (np.arange(1, self.config.max_quotient + 1) + 1)).sum())


def teacher_forcing_batch(problems: list[Problem], max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``tokens [B, T]`` (prompt + answer, padded) and ``mask [B, T]`` of the answer tokens."""
    seqs = [p.prompt + p.answer for p in problems]
    n_t = max(len(s) for s in seqs)
    if n_t > max_len:
        raise ValueError(f"a sequence has {n_t} tokens, more than max_len = {max_len}")
    tokens = torch.zeros(len(seqs), n_t, dtype=torch.long)
    mask = torch.zeros(len(seqs), n_t, dtype=torch.bool)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.as_tensor(s)
        mask[i, PROMPT_LEN : len(s)] = True
    return tokens, mask


def warm_start(
    model: TinyLM, task: CountdownTask, steps: int, batch: int = 64, lr: float = 3e-3, seed: int = 0
) -> list[float]:
    """Supervised warm start: ``steps`` Adam steps of next-token cross-entropy on the answers.

    Kept short on purpose, so that RL starts clearly above 0 and clearly below 1.
    Returns the loss of every step.
    """
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        tokens, mask = teacher_forcing_batch(task.sample(rng, batch), model.cfg.max_len)
        logits = model(tokens)[:, :-1]
        nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
        loss = (nll * mask[:, 1:].reshape(-1)).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def steps_per_sequence(quotient: int | np.ndarray) -> int | np.ndarray:
    """Decoding steps a sequence occupies a slot: ``PROMPT_LEN - 1`` prefill steps, then one
    per answer token (``quotient`` numbers + ``<eos>``)."""
    return PROMPT_LEN - 1 + quotient + 1


def synchronous_slot_occupancy(task: CountdownTask, n: int) -> tuple[float, float]:
    """(mean steps of one sequence, expected steps of a batch of ``n``): a synchronous batch
    runs until its longest answer ends, ``E[max] = sum_s P(max >= s)``, ``P(max <= s) = F(s)^n``.
    Their ratio is the fraction of slot-steps doing useful work."""
    q = np.arange(1, task.config.max_quotient + 1)
    steps = np.asarray(steps_per_sequence(q))
    cdf = np.cumsum(task.quotient_probs)
    expected_max = steps[0] + float(np.sum(1.0 - cdf[:-1] ** n))
    return float((task.quotient_probs * steps).sum()), expected_max


def evaluate(model: TinyLM, task: CountdownTask, n: int, seed: int, n_slots: int = 128) -> float:
    """Mean exact-match reward of ``n`` sampled answers (temperature 1) on fresh problems.

    The same ``seed`` draws the same problems and sampling noise, so two policies compared
    on it differ by their weights, not by the prompts; the estimate's standard error is
    about ``sqrt(r (1 - r) / n)`` (0.014 for r = 0.2, n = 1024)."""
    from course_lib.lm.sampler import generator_for, sample_problems

    problems = task.sample(np.random.default_rng(seed), n)
    results = sample_problems(model, [p.prompt for p in problems], n_slots, EOS, generator_for(model, seed))
    return float(np.mean([task.reward(p, r["tokens"][PROMPT_LEN:].tolist()) for p, r in zip(problems, results)]))
