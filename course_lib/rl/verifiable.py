"""Sample, grade, reinforce: a verifiable-answer task in miniature (lesson 01).

RL for reasoning models tries each prompt several times, grades every answer with an
exact verifier, and reinforces the answers that were right. Here the "model" is a
table of logits: for each generated arithmetic prompt (``"37 + 48 ="``) a softmax over
``K`` candidate answers (the right one and plausible slips). Because the policy is a
table, the exact gradient of the expected accuracy is known, so every estimator can be
compared with the truth::

    J(theta)          = (1/P) sum_p sum_k pi_pk c_pk                 c_pk = verify(prompt_p, cand_pk)
    grad_{theta_p} J  = (1/P) pi_p * (c_p - pi_p . c_p)
    g_hat             = 1/(B G) sum_i sum_j A_ij (onehot(a_ij) - pi_{p_i})   (in row p_i)

with ``A_ij`` the reward (no baseline), or the group-relative advantage of GRPO
(Shao et al. 2024, arXiv 2402.03300), :func:`course_lib.rl.pg.group_relative_advantages`.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from course_lib.rl.pg import group_relative_advantages, leave_one_out_advantages, softmax

_OPS: dict[str, Callable[[int, int], int]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_PROMPT = re.compile(r"^\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*=\s*$")
_INT = re.compile(r"^\s*-?\d+\s*$")

Estimator = Literal["no baseline", "group mean", "leave-one-out", "group mean / std"]
ESTIMATORS: tuple[Estimator, ...] = ("no baseline", "group mean", "leave-one-out", "group mean / std")


def verify(prompt: str, answer: str) -> bool:
    """The exact verifier: is ``answer`` the value of the expression in ``prompt``?

    Args:
        prompt: ``"a op b ="`` with integers ``a, b`` and ``op`` in ``+ - *``.
        answer: the proposed answer as text; anything that is not an integer is wrong.

    Raises:
        ValueError: if ``prompt`` is not of that form.
    """
    m = _PROMPT.match(prompt)
    if m is None:
        raise ValueError(f"not an arithmetic prompt of the form 'a op b =': {prompt!r}")
    if not _INT.match(answer):
        return False
    a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
    return _OPS[op](a, b) == int(answer)


@dataclass(frozen=True)
class ArithmeticTask:
    """``P`` prompts, each with ``K`` candidate answers, graded once by :func:`verify`.

    Attributes:
        prompts: ``P`` prompts like ``"37 + 48 ="``.
        candidates: ``P`` tuples of ``K`` candidate answers (text).
        correct: ``[P, K]`` float64, 1 where :func:`verify` accepts the candidate. The
            verifier is deterministic, so grading each (prompt, candidate) pair once and
            looking rewards up is the same as calling it on every sample.
    """

    prompts: tuple[str, ...]
    candidates: tuple[tuple[str, ...], ...]
    correct: NDArray[np.float64]

    @property
    def n_prompts(self) -> int:
        return len(self.prompts)

    @property
    def n_candidates(self) -> int:
        return len(self.candidates[0])

    def rewards(self, prompt_ids: ArrayLike, answer_ids: ArrayLike) -> NDArray[np.float64]:
        """``[B, G]`` 0/1 rewards of answers ``answer_ids [B, G]`` to prompts ``prompt_ids [B]``."""
        p = np.asarray(prompt_ids)
        return self.correct[p[:, None], np.asarray(answer_ids)]

    def accuracy(self, logits: ArrayLike) -> float:
        """``J``: the probability that a sampled answer to a uniformly drawn prompt is right."""
        return float(np.mean(np.sum(softmax(logits) * self.correct, axis=1)))

    def exact_gradient(self, logits: ArrayLike) -> NDArray[np.float64]:
        """``[P, K]`` exact ``grad_theta J``: row ``p`` is ``pi_p * (c_p - pi_p . c_p) / P``."""
        pi = softmax(logits)
        j_p = np.sum(pi * self.correct, axis=1, keepdims=True)
        return pi * (self.correct - j_p) / self.n_prompts


def _slips(a: int, op: str, b: int) -> list[int]:
    """Plausible wrong answers: off by one or ten, the wrong operation, swapped digits."""
    c = _OPS[op](a, b)
    other = [o for o in _OPS if o != op]
    slips = [c + 1, c - 1, c + 10, c - 10] + [_OPS[o](a, b) for o in other]
    if abs(c) >= 10:
        digits = str(abs(c))[::-1]
        slips.append(int(digits) * (1 if c >= 0 else -1))
    return slips


def make_arithmetic_task(n_prompts: int, n_candidates: int, seed: int, max_operand: int = 50) -> ArithmeticTask:
    """Generate ``n_prompts`` prompts ``"a op b ="`` with ``n_candidates`` shuffled candidates each.

    Exactly one candidate is right; the others are slips (:func:`_slips`) topped up with
    random nearby integers. Seeded: the same arguments give the same task.
    """
    if n_candidates < 2:
        raise ValueError(f"n_candidates must be >= 2, got {n_candidates}")
    rng = np.random.default_rng(seed)
    prompts: list[str] = []
    candidates: list[tuple[str, ...]] = []
    ops = list(_OPS)
    for _ in range(n_prompts):
        op = ops[int(rng.integers(len(ops)))]
        hi = max_operand if op != "*" else max(2, max_operand // 4)
        a, b = int(rng.integers(1, hi + 1)), int(rng.integers(1, hi + 1))
        c = _OPS[op](a, b)
        wrong = list(dict.fromkeys(s for s in _slips(a, op, b) if s != c))
        rng.shuffle(wrong)
        wrong = wrong[: n_candidates - 1]
        while len(wrong) < n_candidates - 1:
            s = c + int(rng.integers(-20, 21))
            if s != c and s not in wrong:
                wrong.append(s)
        answers = [c, *wrong]
        rng.shuffle(answers)
        prompts.append(f"{a} {op} {b} =")
        candidates.append(tuple(str(x) for x in answers))
    correct = np.array([[float(verify(p, x)) for x in cands] for p, cands in zip(prompts, candidates, strict=True)])
    return ArithmeticTask(tuple(prompts), tuple(candidates), correct)


def sample_answers(
    logits: ArrayLike, prompt_ids: ArrayLike, group_size: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """``[B, G]``: ``G`` answers sampled from ``softmax(logits[p])`` for each prompt ``p``."""
    pi = softmax(np.asarray(logits, dtype=np.float64)[np.asarray(prompt_ids)])
    cdf = np.cumsum(pi, axis=1)
    u = rng.random((pi.shape[0], group_size, 1))
    idx = np.sum(u > cdf[:, None, :-1], axis=2)  # inverse-CDF sampling, one row at a time
    return idx.astype(np.int64)


def advantages(rewards: ArrayLike, estimator: Estimator) -> NDArray[np.float64]:
    """``[B, G]`` weights of the score for each estimator of lesson 01, section 3."""
    r = np.asarray(rewards, dtype=np.float64)
    if estimator == "no baseline":
        return r.copy()
    if estimator == "group mean":
        return group_relative_advantages(r, normalize_std=False)
    if estimator == "leave-one-out":  # RLOO: the mean of the other G - 1 answers
        return leave_one_out_advantages(r)
    if estimator == "group mean / std":  # the sample std and eps of verl's GRPO (TRL: the same std, eps 1e-4)
        return group_relative_advantages(r, normalize_std=True, eps=1e-6, ddof=1)
    raise ValueError(f"unknown estimator {estimator!r}; use one of {ESTIMATORS}")


def logit_table_gradient(
    logits: ArrayLike, prompt_ids: ArrayLike, answer_ids: ArrayLike, weights: ArrayLike
) -> NDArray[np.float64]:
    """``[P, K]`` estimate ``1/(B G) sum_ij w_ij (onehot(a_ij) - pi_{p_i})``, scattered into rows ``p_i``."""
    z = np.asarray(logits, dtype=np.float64)
    p = np.asarray(prompt_ids)
    a = np.asarray(answer_ids)
    w = np.asarray(weights, dtype=np.float64)
    n_b, n_g = a.shape
    pi = softmax(z[p])  # [B, K]
    rows = -w.sum(axis=1, keepdims=True) * pi  # sum_j w_ij * (-pi_{p_i})
    np.add.at(rows, (np.repeat(np.arange(n_b), n_g), a.reshape(-1)), w.reshape(-1))
    grad = np.zeros_like(z)
    np.add.at(grad, p, rows)
    return grad / (n_b * n_g)


@dataclass(frozen=True)
class GroupBatch:
    """One sample-and-grade round: ``B`` prompts, ``G`` answers each."""

    prompt_ids: NDArray[np.int64]
    answer_ids: NDArray[np.int64]
    rewards: NDArray[np.float64]

    @property
    def zero_signal_fraction(self) -> float:
        """Share of groups whose answers all got the same reward (zero group-relative advantage)."""
        return float(np.mean(np.ptp(self.rewards, axis=1) == 0))


def sample_and_grade(
    task: ArithmeticTask, logits: ArrayLike, n_prompts: int, group_size: int, rng: np.random.Generator
) -> GroupBatch:
    """Draw ``n_prompts`` distinct prompts uniformly, sample ``group_size`` answers each, grade them."""
    prompt_ids = rng.choice(task.n_prompts, size=n_prompts, replace=False).astype(np.int64)
    answer_ids = sample_answers(logits, prompt_ids, group_size, rng)
    return GroupBatch(prompt_ids, answer_ids, task.rewards(prompt_ids, answer_ids))


def gradients_by_estimator(
    task: ArithmeticTask,
    logits: ArrayLike,
    n_batches: int,
    n_prompts: int,
    group_size: int,
    seed: int,
    estimators: tuple[Estimator, ...] = ESTIMATORS,
    reward_offset: float = 0.0,
) -> dict[Estimator, NDArray[np.float64]]:
    """``{estimator: [n_batches, P*K]}`` gradient estimates, every estimator on the same batches.

    ``reward_offset`` is added to every reward (right = 1 + c, wrong = c): a different
    reward convention with the same optimal policy.
    """
    rng = np.random.default_rng(seed)
    out: dict[Estimator, list[NDArray[np.float64]]] = {e: [] for e in estimators}
    for _ in range(n_batches):
        batch = sample_and_grade(task, logits, n_prompts, group_size, rng)
        rewards = batch.rewards + reward_offset
        for e in estimators:
            g = logit_table_gradient(logits, batch.prompt_ids, batch.answer_ids, advantages(rewards, e))
            out[e].append(g.reshape(-1))
    return {e: np.stack(v) for e, v in out.items()}


@dataclass(frozen=True)
class AnswerTrainingCurve:
    """What :func:`train_answer_policy` logs after each update.

    Attributes:
        accuracy: ``[steps + 1]`` exact expected accuracy ``J``, before each update and after the last.
        zero_signal: ``[steps]`` share of groups with identical rewards in each batch.
        entropy: ``[steps + 1]`` mean over prompts of the policy's entropy (nats), when ``accuracy`` is.
        final_logits: ``[P, K]`` the trained table.
    """

    accuracy: NDArray[np.float64]
    zero_signal: NDArray[np.float64]
    entropy: NDArray[np.float64]
    final_logits: NDArray[np.float64]


def train_answer_policy(
    task: ArithmeticTask,
    init_logits: ArrayLike,
    estimator: Estimator,
    steps: int,
    n_prompts: int,
    group_size: int,
    lr: float,
    seed: int,
    reward_offset: float = 0.0,
) -> AnswerTrainingCurve:
    """Sample, grade, reinforce: ``steps`` rounds of plain gradient ascent ``theta += lr * g_hat``.

    ``reward_offset`` is added to every reward (right = 1 + c, wrong = c).
    """
    rng = np.random.default_rng(seed)
    z = np.array(init_logits, dtype=np.float64)
    acc, ent = [task.accuracy(z)], [policy_entropy(z)]
    zero = []
    for _ in range(steps):
        batch = sample_and_grade(task, z, n_prompts, group_size, rng)
        w = advantages(batch.rewards + reward_offset, estimator)
        z += lr * logit_table_gradient(z, batch.prompt_ids, batch.answer_ids, w)
        acc.append(task.accuracy(z))
        ent.append(policy_entropy(z))
        zero.append(batch.zero_signal_fraction)
    return AnswerTrainingCurve(np.array(acc), np.array(zero), np.array(ent), z)


def policy_entropy(logits: ArrayLike) -> float:
    """Mean over prompts of ``-sum_k pi_k log pi_k`` (nats): 0 when every prompt's softmax is one-hot."""
    pi = softmax(logits)
    return float(np.mean(-np.sum(pi * np.log(np.maximum(pi, 1e-300)), axis=1)))
