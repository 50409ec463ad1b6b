"""Lesson 01's graded exercises: leave-one-out advantages, the surrogate loss, group-relative
advantages and a complete REINFORCE update.

The learner writes:

* ``rloo_advantages(rewards [B, G]) -> [B, G]``  (RLOO, the unbiased group baseline)
* ``surrogate_loss(logits [N, K], actions [N], advantages [N]) -> scalar tensor``  (01.7)
* ``group_relative_advantages(rewards [B, G], normalize_std=True, eps=1e-6) -> [B, G]``  (01.6)
* ``reinforce_update(policy, optimizer, obs, actions, rewards, dones, gamma) -> float``

The checks never call ``course_lib.rl.pg`` or ``course_lib.rl.reinforce``: they compare with
the deliberately naive oracles below, which mirror the closed forms (a sum per step, an
explicit log-sum-exp per row, explicit sums per group), with hand-computed values, and
with properties. torch is imported inside the checks that need it, so loading this
module stays light.

What each exercise teaches, and how the checks observe it (not only its values):

* rloo_advantages, mechanism: each answer's baseline is the mean of the other G - 1 rewards of
  its own row, so the estimator stays unbiased; observed by the exact expectation of the
  estimator over every group of G answers to a 4-way softmax (E[g] / grad J = 1, where the
  group mean gives 1 - 1/G), raising one reward by 1 (its advantage moves by exactly 1), G = 2,
  constant groups, rows computed alone, and named mistakes (the own reward kept, a division by
  G, the whole batch's mean).
* surrogate_loss, mechanism: a numerically stable log-softmax, each row's taken action picked,
  weighted by the detached advantage, averaged and negated, so that autograd gives (01.4);
  observed by the gradient against (01.4), a repeated batch (a mean), a gradient into
  ``advantages`` (detached), logits 1000 apart (log(softmax(...)) underflows to -inf or is
  clipped) and the autograd graph (a log taken of a softmax is named).
* group_relative_advantages, mechanism: each row's own mean and std (population or sample, the
  statement accepts either, read from groups of 2 and 3 answers and then required everywhere),
  eps outside the square root, the std only when asked; observed by rows computed alone, both
  settings, constant groups, eps values, a scale and shift.
* reinforce_update, mechanism: reward-to-go (the library's discounted_returns or the learner's
  own loop) and the learner's surrogate_loss composed with a batch-normalised baseline and one
  step of the optimizer it is given; observed by checking the surrogate_loss it calls first (a
  slip there is named there), the parameter change against -lr * grad at several discounts and
  dones dtypes, stale .grad, and an optimizer with weight decay (the step must be the given
  optimizer's, not plain SGD).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    CheckFailure,
    Exercise,
    LearnerError,
    assert_allclose,
    assert_array,
    assert_float_dtype,
    assert_inputs_unchanged,
    assert_true,
    call,
    check_case,
    copy_input,
    fail,
    fmt_number,
)
from course_lib.course.grading.helpers import (
    assert_scalar_tensor,
    call_on_copies,
    call_text,
    fail_if_known_mistake,
    torch_seeded,
)

if TYPE_CHECKING:
    import torch

LESSON = "01_policy_gradients"

# ---------------------------------------------------------------------------------------
# Oracles: naive, formula-mirroring implementations
# ---------------------------------------------------------------------------------------


def naive_reward_to_go(rewards: Any, dones: Any, gamma: float) -> NDArray[np.float64]:
    """``G[t, b] = sum_{k=t}^{e(t,b)} gamma^(k-t) r[k, b]``: one explicit sum per step and env.

    ``e(t, b)`` is the first ``k >= t`` with ``dones[k, b]`` set, or ``T - 1`` if none is.
    """
    r = [[float(x) for x in row] for row in np.asarray(rewards, dtype=np.float64).tolist()]
    d = [[bool(x) for x in row] for row in np.asarray(dones).tolist()]
    n_t = len(r)
    n_b = np.asarray(rewards).shape[1] if np.asarray(rewards).ndim == 2 else 0
    out = np.zeros((n_t, n_b), dtype=np.float64)
    for b in range(n_b):
        for t in range(n_t):
            end = t
            while not d[end][b] and end < n_t - 1:
                end += 1
            out[t, b] = sum(gamma ** (k - t) * r[k][b] for k in range(t, end + 1))
    return out


def naive_log_softmax_row(row: Sequence[float]) -> list[float]:
    """``z_k - log sum_j exp(z_j)`` for one row, in float64 with an explicit max shift."""
    z = [float(x) for x in row]
    m = max(z)
    log_norm = m + math.log(sum(math.exp(x - m) for x in z))
    return [x - log_norm for x in z]


def naive_surrogate(logits: Any, actions: Any, advantages: Any) -> float:
    """``-(1/N) sum_i A_i log pi(a_i | s_i)`` with an explicit loop over samples."""
    rows = np.asarray(logits, dtype=np.float64).tolist()
    acts = [int(a) for a in np.asarray(actions).tolist()]
    adv = [float(a) for a in np.asarray(advantages, dtype=np.float64).tolist()]
    total = sum(adv[i] * naive_log_softmax_row(rows[i])[acts[i]] for i in range(len(rows)))
    return -total / len(rows)


def naive_surrogate_grad(logits: Any, actions: Any, advantages: Any) -> NDArray[np.float64]:
    """``dL/dz_i = -(1/N) A_i (onehot(a_i) - pi_i)``: the score-function formula (01.4), row by row."""
    rows = np.asarray(logits, dtype=np.float64).tolist()
    acts = [int(a) for a in np.asarray(actions).tolist()]
    adv = [float(a) for a in np.asarray(advantages, dtype=np.float64).tolist()]
    n = len(rows)
    out = np.zeros((n, len(rows[0]) if rows else 0))
    for i in range(n):
        pi = [math.exp(v) for v in naive_log_softmax_row(rows[i])]
        for k in range(len(pi)):
            out[i, k] = -adv[i] * ((1.0 if k == acts[i] else 0.0) - pi[k]) / n
    return out


def naive_group_advantages(rewards: Any, normalize_std: bool, eps: float, ddof: int = 0) -> NDArray[np.float64]:
    """Eq. (01.6) with explicit sums per group: mean, std (population ``ddof = 0`` or sample ``ddof = 1``),
    then the ratio."""
    rows = np.asarray(rewards, dtype=np.float64).tolist()
    out = np.zeros(np.asarray(rewards).shape, dtype=np.float64)
    for i, row in enumerate(rows):
        n = len(row)
        mean = sum(row) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / (n - ddof))
        for j, x in enumerate(row):
            if normalize_std:
                out[i, j] = (x - mean) / (std + eps) if std + eps > 0 else 0.0
            else:
                out[i, j] = x - mean
    return out


def naive_normalized(values: NDArray[np.float64], ddof: int = 0) -> NDArray[np.float64]:
    """``(x - mean) / (std + 1e-8)`` over every element, with explicit sums."""
    flat = [float(x) for x in values.reshape(-1)]
    n = len(flat)
    mean = sum(flat) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in flat) / (n - ddof))
    return np.array([(x - mean) / (std + 1e-8) for x in flat]).reshape(values.shape)


def naive_reinforce_loss_and_grad(
    policy: torch.nn.Module,
    obs: NDArray[Any],
    actions: NDArray[Any],
    weights: NDArray[np.float64],
) -> tuple[float, NDArray[np.float64]]:
    """The surrogate loss ``-(1/N) sum_i w_i log pi(a_i|s_i)`` of a float64 copy of
    ``policy``, one sample at a time, and its gradient flattened in parameter order."""
    import torch

    model = copy.deepcopy(policy).double()
    n = int(np.prod(actions.shape))
    x = torch.tensor(np.asarray(obs, dtype=np.float64).reshape(n, -1))
    acts = [int(a) for a in np.asarray(actions).reshape(-1)]
    w = [float(v) for v in weights.reshape(-1)]
    logits = model(x)
    loss = torch.zeros((), dtype=torch.float64)
    for i in range(n):
        z = logits[i]
        loss = loss - w[i] * (z[acts[i]] - torch.logsumexp(z, dim=0))
    loss = loss / n
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    return float(loss.detach()), torch.cat([g.reshape(-1) for g in grads]).numpy()


# ---------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------


def random_rollout(
    seed: int, n_t: int, n_b: int, p_done: float = 0.25
) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    """Seeded ``(rewards [T, B], dones [T, B] bool)``; any step may end an episode."""
    rng = np.random.default_rng(seed)
    return np.round(rng.normal(size=(n_t, n_b)), 3), rng.random((n_t, n_b)) < p_done


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


# ---------------------------------------------------------------------------------------
# Exercise 1: rloo_advantages
# ---------------------------------------------------------------------------------------

LOO = "rloo_advantages"


def naive_rloo(rewards: Any) -> NDArray[np.float64]:
    """``A_ij = r_ij - (1/(G-1)) sum_{k != j} r_ik``: an explicit sum over the other answers of each row."""
    rows = np.asarray(rewards, dtype=np.float64).tolist()
    out = np.zeros(np.asarray(rewards).shape, dtype=np.float64)
    for i, row in enumerate(rows):
        n_g = len(row)
        for j in range(n_g):
            others = sum(row[k] for k in range(n_g) if k != j)
            out[i, j] = row[j] - others / (n_g - 1)
    return out


def _loo_mistakes(rewards: Any) -> dict[str, Any]:
    """Known wrong advantages, by the message that names each."""
    r = np.asarray(rewards, dtype=np.float64)
    n_b, n_g = r.shape
    total = r.sum(axis=1, keepdims=True)
    return {
        "each answer's own reward is in its baseline (r - mean of the whole group, GRPO's baseline): leave it "
        "out, the baseline of answer j is the mean of the other G - 1 rewards": lambda: r - total / n_g,
        "the other answers' rewards are divided by G; there are G - 1 of them": lambda: r - (total - r) / n_g,
        "the baseline is the mean of the other rewards of the whole batch; use only the answer's own prompt's row": (
            lambda: r - (r.sum() - r) / (n_b * n_g - 1)
        ),
        "the rewards are not centred at all; subtract the mean of the other G - 1 rewards": lambda: r.copy(),
        "the advantages have the wrong sign: reward minus baseline, not baseline minus reward": lambda: (
            (total - r) / (n_g - 1) - r
        ),
    }


def _loo_values(fn: Callable[..., Any], rewards: Any, what: str) -> None:
    expected = naive_rloo(rewards)
    got = call_on_copies(fn, np.asarray(rewards))
    arr = assert_array(got, what=what, shape=expected.shape)
    if not np.allclose(arr.astype(np.float64), expected, rtol=1e-6, atol=1e-9):
        fail_if_known_mistake(arr.astype(np.float64), _loo_mistakes(rewards), expected=expected, what=what)
    assert_allclose(arr, expected, what=what)


@check_case("returns a float64 numpy array of shape [B, G], from integer rewards too")
def _loo_shape(fn: Callable[..., Any]) -> None:
    rewards = np.array([[1, 0, 0, 1, 1], [0, 0, 1, 0, 0], [1, 1, 1, 0, 1]])
    what = f"{LOO}(integer rewards of shape {rewards.shape})"
    arr = assert_array(call_on_copies(fn, rewards), what=what, shape=(3, 5))
    assert_float_dtype(arr, what=what)
    if arr.dtype != np.float64:
        fail(f"{what} has dtype {arr.dtype}; the statement asks for float64")


@check_case("hand-computed values: one right answer of four, three right of four")
def _loo_known(fn: Callable[..., Any]) -> None:
    # [1, 0, 0, 0]: 1 - 0 = 1, 0 - 1/3; [1, 1, 0, 1]: 1 - 2/3 = 1/3, 0 - 1 = -1
    _loo_values(fn, np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0]]), f"{LOO}([[1, 0, 0, 0], [1, 1, 0, 1]])")


@check_case("G = 2: each answer's advantage is its reward minus the other's")
def _loo_pair(fn: Callable[..., Any]) -> None:
    _loo_values(fn, np.array([[1.0, 0.0], [0.5, 2.0], [3.0, 3.0]]), f"{LOO}([[1, 0], [0.5, 2], [3, 3]])")


@check_case("a group whose rewards are all equal gives zeros")
def _loo_constant(fn: Callable[..., Any]) -> None:
    _loo_values(fn, np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]), f"{LOO}([[1, 1, 1, 1], [0, 0, 0, 0]])")


@check_case("an answer's own reward is not in its baseline: changing r_ij moves A_ij by exactly as much")
def _loo_own(fn: Callable[..., Any]) -> None:
    rewards = np.array([[0.0, 1.0, 0.0, 1.0, 0.5]])
    base = assert_array(call_on_copies(fn, rewards), what=f"{LOO}({rewards.tolist()})", shape=(1, 5)).astype(float)
    for j in range(5):
        bumped = rewards.copy()
        bumped[0, j] += 1.0
        moved = np.asarray(call_on_copies(fn, bumped), dtype=np.float64)[0, j] - base[0, j]
        if not math.isclose(moved, 1.0, rel_tol=1e-6, abs_tol=1e-9):
            fail(
                f"raising r[0, {j}] by 1 moved A[0, {j}] by {fmt_number(moved)}; expected 1: the baseline of answer "
                f"{j} is the mean of the other answers' rewards and must not contain its own "
                f"({fmt_number(1 - 1 / 5)} = 1 - 1/G means it does)"
            )


@check_case("each group uses only its own answers")
def _loo_rows(fn: Callable[..., Any]) -> None:
    rewards = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [5.0, 3.0, 4.0, 4.0]])
    together = assert_array(call_on_copies(fn, rewards), what=f"{LOO}(rewards of shape (3, 4))", shape=(3, 4))
    for i in range(3):
        assert_allclose(
            call_on_copies(fn, rewards[i : i + 1]),
            together[i : i + 1],
            what=f"group {i} computed alone, compared with row {i} of the batch",
        )


@check_case("matches explicit sums over the other answers on random rewards, G from 2 to 16")
def _loo_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for case, (n_b, n_g) in enumerate([(1, 2), (4, 8), (16, 3), (5, 16), (3, 5)]):
        rewards = np.round(rng.normal(size=(n_b, n_g)), 3) if case % 2 else (rng.random((n_b, n_g)) < 0.4).astype(float)
        _loo_values(fn, rewards, f"random case {case + 1} (B={n_b}, G={n_g})")


#: The exact table case: one prompt, a softmax over K candidates with these rewards, every one of the K^G groups.
_TABLE_PI = np.array([0.4, 0.3, 0.2, 0.1])
_TABLE_REWARD = np.array([1.0, 0.0, 0.0, 0.5])


def exact_gradient_ratio(fn: Callable[..., Any], group_size: int) -> tuple[float, NDArray[np.float64]]:
    """``E[g] . grad J / |grad J|^2`` and ``E[g]`` of the estimator ``1/G sum_j A_j (e_{a_j} - pi)`` with ``fn``'s
    advantages, its expectation taken exactly over all ``K^G`` groups of answers (each a row of one call)."""
    import itertools

    pi, reward = _TABLE_PI, _TABLE_REWARD
    k = len(pi)
    outcomes = np.array(list(itertools.product(range(k), repeat=group_size)))
    probs = pi[outcomes].prod(axis=1)
    adv = assert_array(
        call_on_copies(fn, reward[outcomes]),
        what=f"{LOO}(rewards of shape ({len(outcomes)}, {group_size}))",
        shape=outcomes.shape,
    ).astype(np.float64)
    onehot = np.eye(k)[outcomes]  # [O, G, K]
    per_group = ((adv[:, :, None] * (onehot - pi)).sum(axis=1)) / group_size
    expected_g = probs @ per_group
    grad_j = pi * (reward - pi @ reward)
    return float(expected_g @ grad_j / (grad_j @ grad_j)), expected_g


@check_case("unbiased: E[g] / grad J = 1 exactly, over every group of G = 2, 3, 4 answers to a 4-way softmax")
def _loo_unbiased(fn: Callable[..., Any]) -> None:
    grad_j = _TABLE_PI * (_TABLE_REWARD - _TABLE_PI @ _TABLE_REWARD)
    for group_size in (2, 3, 4):
        ratio, expected_g = exact_gradient_ratio(fn, group_size)
        if not math.isclose(ratio, 1.0, rel_tol=1e-6, abs_tol=1e-9) or not np.allclose(expected_g, grad_j, atol=1e-9):
            shrunk = 1 - 1 / group_size
            why = (
                f"; {fmt_number(ratio)} = 1 - 1/G: each answer's own reward is in its baseline (GRPO's shrinkage)"
                if math.isclose(ratio, shrunk, rel_tol=1e-6)
                else ": the baseline of an answer must not depend on that answer"
            )
            fail(
                f"with G = {group_size}, the exact expectation of (1/G) sum_j A_j (e_a_j - pi) over all "
                f"{len(_TABLE_PI) ** group_size} groups is {fmt_number(ratio)} x grad J, expected 1 x grad J{why}"
            )


@check_case("accepts lists and does not modify its input")
def _loo_inputs(fn: Callable[..., Any]) -> None:
    as_list = [[1, 0, 1], [0, 0, 1]]
    assert_allclose(call(fn, [row[:] for row in as_list]), naive_rloo(as_list), what=f"{LOO}({as_list})")
    assert_inputs_unchanged(fn, LOO, rewards=np.array([[1.0, 0.0, 2.0], [3.0, 3.0, 1.0]]))


RLOO_ADVANTAGES = Exercise(
    name=LOO,
    points=10,
    title="leave-one-out (RLOO) advantages: each answer against the mean of the other G - 1",
    advice="from each row's sum, without the answer's own reward",
    checks=(
        _loo_shape,
        _loo_known,
        _loo_pair,
        _loo_constant,
        _loo_own,
        _loo_rows,
        _loo_oracle,
        _loo_unbiased,
        _loo_inputs,
    ),
    hints=(
        "Each row is one prompt's group. Answer j's baseline is the average of the other G - 1 rewards in its row: "
        "no other prompt's rewards, and not its own.",
        "You do not need a loop over j: the sum of the others is the row's total minus the answer's own reward, and "
        "a row total kept as shape `[B, 1]` broadcasts against `[B, G]`.",
        "Check the properties the grader checks: raising one answer's reward by 1 must raise its advantage by exactly "
        "1; with G = 2 the two advantages are r1 - r2 and r2 - r1; a constant row gives zeros. If your advantages "
        "are (1 - 1/G) times these, the answer's own reward is still in its baseline.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: surrogate_loss
# ---------------------------------------------------------------------------------------

SUR = "surrogate_loss"


def _sur_inputs(seed: int, n: int, k: int, dtype: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    rng = np.random.default_rng(seed)
    dtype = dtype or torch.float32
    logits = torch.tensor(rng.normal(scale=2.0, size=(n, k)), dtype=dtype, requires_grad=True)
    actions = torch.tensor(rng.integers(0, k, size=n), dtype=torch.int64)
    advantages = torch.tensor(rng.normal(size=n), dtype=dtype)
    return logits, actions, advantages


def _sur_value(fn: Callable[..., Any], logits: Any, actions: Any, advantages: Any, what: str) -> torch.Tensor:
    """Call the learner's loss and require a scalar tensor."""
    return assert_scalar_tensor(
        call(fn, logits, actions, advantages),
        what=what,
        advice="autograd needs it: don't call .item() or .numpy()",
        type_text=lambda out: f"a {type(out).__name__}",
    )


@check_case("returns a scalar torch tensor")
def _sur_scalar(fn: Callable[..., Any]) -> None:
    logits, actions, adv = _sur_inputs(0, 5, 3)
    _sur_value(fn, logits, actions, adv, f"{SUR}(logits [5, 3], actions [5], advantages [5])")


@check_case("hand-computed value: uniform policy, advantages 1 and 3 give 2 ln 2")
def _sur_known(fn: Callable[..., Any]) -> None:
    import torch

    logits = torch.zeros(2, 2, requires_grad=True)
    loss = _sur_value(
        fn, logits, torch.tensor([0, 1]), torch.tensor([1.0, 3.0]), f"{SUR}(zeros [2, 2], [0, 1], [1, 3])"
    )
    got = float(loss.detach())
    expected = 2 * math.log(2)  # -(1 * ln .5 + 3 * ln .5) / 2
    if abs(got - expected) > 1e-5:
        fail(
            f"{SUR}(zeros [2, 2], actions [0, 1], advantages [1, 3]) = {fmt_number(got)}; "
            f"expected -(1 * ln 0.5 + 3 * ln 0.5) / 2 = {fmt_number(expected)}"
        )


@check_case("a gradient step on the loss makes positive-advantage actions more likely")
def _sur_sign(fn: Callable[..., Any]) -> None:
    import torch

    logits, actions, _ = _sur_inputs(1, 6, 4)
    adv = torch.tensor([1.0, -1.0, 2.0, -0.5, 1.5, -2.0])
    loss = _sur_value(fn, logits, actions, adv, f"{SUR}(...)")
    (grad,) = torch.autograd.grad(loss, logits)
    with torch.no_grad():
        before = torch.softmax(logits, -1)[torch.arange(6), actions]
        after = torch.softmax(logits - 0.1 * grad, -1)[torch.arange(6), actions]
    for i in range(6):
        if float(adv[i]) > 0 and not after[i] > before[i]:
            fail(
                f"after a gradient-descent step on your loss, the action taken in sample {i} (advantage "
                f"{fmt_number(float(adv[i]))}) became less likely; minimising L must raise log pi for A > 0 "
                "(check the minus sign)"
            )
        if float(adv[i]) < 0 and not after[i] < before[i]:
            fail(
                f"after a gradient-descent step on your loss, the action taken in sample {i} (advantage "
                f"{fmt_number(float(adv[i]))}) became more likely; check the sign of the loss"
            )


def _log_of_softmax(loss: torch.Tensor) -> bool:
    """Whether the autograd graph of ``loss`` takes a log of a softmax (``torch.log`` applied to
    a value computed from ``torch.softmax``, with or without a clamp or an added eps)."""
    seen: set[int] = set()

    def below(node: Any, wanted: str) -> bool:
        stack = [node]
        while stack:
            current = stack.pop()
            if current is None or id(current) in seen:
                continue
            seen.add(id(current))
            if type(current).__name__ == wanted:
                return True
            stack.extend(nxt for nxt, _ in getattr(current, "next_functions", ()))
        return False

    logs, stack, visited = [], [loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        if type(node).__name__ == "LogBackward0":
            logs.append(node)
        stack.extend(nxt for nxt, _ in getattr(node, "next_functions", ()))
    return any(below(node, "SoftmaxBackward0") for node in logs)


_LOG_SOFTMAX_ADVICE = "use torch.log_softmax(logits, dim=-1) (z - logsumexp(z), never forming pi)"


@check_case("a stable log-softmax: logits 1000 apart give a finite, exact loss and gradient (not log(softmax(...)))")
def _sur_stable(fn: Callable[..., Any]) -> None:
    import torch

    # row 0 takes an action whose logit is 1003 below the best: pi = e^-1003 is 0.0 in floating
    # point, so log(softmax) gives log(0) = -inf; row 1 would overflow exp(1000) if not shifted
    rows = [[0.0, -1000.0, 3.0], [1000.0, 0.0, 1.0], [0.5, -0.5, 0.0]]
    actions, adv = torch.tensor([1, 1, 2]), torch.tensor([1.0, -0.5, 2.0])
    expected = naive_surrogate(rows, actions, adv)
    expected_grad = naive_surrogate_grad(rows, actions, adv)
    for dtype in (torch.float32, torch.float64):
        logits = torch.tensor(rows, dtype=dtype, requires_grad=True)
        what = f"{SUR}(logits 1000 apart, {str(dtype).removeprefix('torch.')})"
        loss = _sur_value(fn, logits, actions, adv.to(dtype), what)
        got = float(loss.detach())
        if not math.isfinite(got):
            fail(
                f"{what} = {fmt_number(got)}: softmax gives exactly 0.0 for a logit 1000 below the others, and "
                f"log(0) = -inf; {_LOG_SOFTMAX_ADVICE}"
            )
        if not math.isclose(got, expected, rel_tol=1e-5, abs_tol=1e-5):
            clipped = " (the log of a softmax clipped or shifted by an eps)" if _log_of_softmax(loss) else ""
            fail(
                f"{what} = {fmt_number(got)}; expected {fmt_number(expected)}: the taken action's log-probability "
                f"is -1003.05, whatever floating point does to pi itself{clipped}; {_LOG_SOFTMAX_ADVICE}"
            )
        if _log_of_softmax(loss):
            fail(f"your loss takes torch.log of a softmax, which underflows to log(0) = -inf; {_LOG_SOFTMAX_ADVICE}")
        if not loss.requires_grad:
            fail(f"{what} does not depend on `logits` through autograd; compute it with torch operations on logits")
        (grad,) = torch.autograd.grad(loss, logits)
        assert_allclose(
            grad.detach().double().numpy(),
            expected_grad,
            what=f"the gradient of {what} w.r.t. logits",
            rtol=1e-5,
            atol=1e-7,
        )


@check_case("value matches a naive float64 log-softmax implementation on random inputs")
def _sur_oracle(fn: Callable[..., Any]) -> None:
    import torch

    for case, (seed, n, k, dtype) in enumerate(
        [(2, 1, 2, torch.float32), (3, 7, 3, torch.float32), (4, 16, 5, torch.float64), (5, 9, 2, torch.float64)]
    ):
        logits, actions, adv = _sur_inputs(seed, n, k, dtype)
        loss = _sur_value(fn, logits, actions, adv, f"{SUR} on random case {case + 1}")
        got = float(loss.detach())
        expected = naive_surrogate(logits.detach(), actions, adv)
        tol = 1e-5 if dtype == torch.float32 else 1e-9
        if not math.isclose(got, expected, rel_tol=tol, abs_tol=tol):
            fail(
                f"random case {case + 1} (N={n}, K={k}, {str(dtype).replace('torch.', '')}): loss "
                f"{fmt_number(got)}, expected -mean(A * log_softmax(logits)[action]) = {fmt_number(expected)}"
            )


@check_case("gradient w.r.t. the logits is -(1/N) A_i (onehot(a_i) - pi_i)")
def _sur_grad(fn: Callable[..., Any]) -> None:
    import torch

    logits, actions, adv = _sur_inputs(6, 8, 3, torch.float64)
    loss = _sur_value(fn, logits, actions, adv, f"{SUR}(...)")
    if not loss.requires_grad:
        fail(
            f"{SUR}'s result does not depend on `logits` through autograd (requires_grad is False); "
            "compute it with torch operations on `logits`, without .detach() or numpy"
        )
    (grad,) = torch.autograd.grad(loss, logits)
    assert_allclose(
        grad.numpy(),
        naive_surrogate_grad(logits.detach(), actions, adv),
        what="the gradient of your loss w.r.t. logits",
        rtol=1e-6,
        atol=1e-10,
    )


@check_case("a mean over samples: repeating the batch leaves the loss unchanged")
def _sur_mean(fn: Callable[..., Any]) -> None:

    logits, actions, adv = _sur_inputs(7, 5, 3)
    once = float(_sur_value(fn, logits, actions, adv, f"{SUR}(...)").detach())
    logits2 = logits.detach().repeat(2, 1).requires_grad_(True)
    twice = float(_sur_value(fn, logits2, actions.repeat(2), adv.repeat(2), f"{SUR}(...)").detach())
    if not math.isclose(once, twice, rel_tol=1e-5, abs_tol=1e-6):
        fail(
            f"the loss of a batch is {fmt_number(once)} but of the same batch twice {fmt_number(twice)}; "
            "average over the N samples (.mean()), don't sum"
        )


@check_case("no gradient flows into the advantages (they are constants)")
def _sur_detach(fn: Callable[..., Any]) -> None:

    logits, actions, adv = _sur_inputs(8, 4, 3)
    adv = adv.clone().requires_grad_(True)
    loss = _sur_value(fn, logits, actions, adv, f"{SUR}(...)")
    if not adv.requires_grad:
        fail(
            "the caller's `advantages` tensor no longer requires grad after the call: detaching it in place "
            "(requires_grad_(False), detach_()) changes the caller's tensor; use advantages.detach(), a new tensor"
        )
    loss.backward()
    if adv.grad is not None and bool((adv.grad != 0).any()):
        fail(
            "the loss backpropagated into `advantages`; they weight the score and must be constants: "
            "use advantages.detach()"
        )


@check_case("does not modify its inputs")
def _sur_inputs_unchanged(fn: Callable[..., Any]) -> None:
    logits, actions, adv = _sur_inputs(9, 5, 4)
    saved = [t.detach().clone() for t in (logits, actions, adv)]
    _sur_value(fn, logits, actions, adv, f"{SUR}(...)")
    for name, before, now in zip(("logits", "actions", "advantages"), saved, (logits, actions, adv), strict=True):
        assert_true(bool((now.detach() == before).all()), f"{SUR} changed the `{name}` tensor it was given")


SURROGATE_LOSS = Exercise(
    name=SUR,
    points=10,
    title="the surrogate loss whose gradient is minus the policy gradient (eq. 01.7)",
    advice="from torch.log_softmax, the taken actions' entries and a mean (eq. 01.7)",
    checks=(
        _sur_scalar,
        _sur_sign,
        _sur_known,
        _sur_oracle,
        _sur_grad,
        _sur_stable,
        _sur_mean,
        _sur_detach,
        _sur_inputs_unchanged,
    ),
    hints=(
        "Three steps: the log-probabilities of every action under each state's logits, the one of the action actually "
        "taken in each row, then the advantage-weighted mean of those, negated.",
        "`torch.log_softmax` over the last axis gives the `[N, K]` log-probabilities in a numerically stable way. "
        "Select one entry per row, column `actions[i]` of row `i`, with `gather` along dim 1 (or by indexing with "
        "`torch.arange(N)` and the actions).",
        "Check the properties the grader checks: a gradient-descent step on the loss must make actions with a "
        "positive advantage more likely; repeating the batch must leave the loss unchanged (a mean, not a sum); no gradient "
        "may reach `advantages`; logits 1000 apart must give a finite loss; and the gradient with respect to row i's "
        "logits is -(A_i / N)(onehot(a_i) - pi_i), eq. (01.4).",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: group_relative_advantages
# ---------------------------------------------------------------------------------------

GRA = "group_relative_advantages"

#: The two std conventions the statement accepts: the population std (numpy's default) and the sample std
#: (torch.std's default; TRL's and verl's GRPO).
DDOF_NAMES = {0: "the population std (ddof = 0)", 1: "the sample std (ddof = 1)"}
#: The largest default eps accepted (TRL uses 1e-4, verl 1e-6).
MAX_DEFAULT_EPS = 1e-3


def _gra_what(shape: tuple[int, ...], **kwargs: Any) -> str:
    return call_text(GRA, f"rewards of shape {shape}", **kwargs)


class _Convention(NamedTuple):
    """The std convention and default eps the learner's function uses."""

    ddof: int
    eps: float


def _gra_convention(fn: Callable[..., Any]) -> _Convention:
    """Read the learner's std convention from groups of 2 and 3 answers with eps = 0 (the two conventions
    differ by sqrt(G / (G - 1))), require the same one in both, then its default eps from a call without it."""
    found = []
    for row in ([0.0, 1.0], [0.0, 0.0, 3.0]):
        rewards = np.array([row])
        got = assert_array(
            call_on_copies(fn, rewards, normalize_std=True, eps=0.0),
            what=_gra_what(rewards.shape, normalize_std=True, eps=0.0),
            shape=rewards.shape,
        ).astype(np.float64)
        options = {ddof: naive_group_advantages(rewards, True, 0.0, ddof) for ddof in DDOF_NAMES}
        match = [ddof for ddof, want in options.items() if np.allclose(got, want, rtol=1e-6, atol=1e-9)]
        if not match:
            fail(
                f"{GRA}([{row}], normalize_std=True, eps=0) = {np.round(got, 6).tolist()}; expected "
                f"{np.round(options[0], 6).tolist()} ({DDOF_NAMES[0]}) or {np.round(options[1], 6).tolist()} "
                f"({DDOF_NAMES[1]}): (r - mean) / std, both over the row"
            )
        found.append(match[0])
    if found[0] != found[1]:
        fail(
            f"{GRA} used {DDOF_NAMES[found[0]]} for a group of 2 answers and {DDOF_NAMES[found[1]]} for a group "
            "of 3: use one convention for every group"
        )
    ddof = found[0]
    rewards = np.array([[0.0, 1.0]])
    value = float(np.asarray(call_on_copies(fn, rewards), dtype=np.float64).reshape(-1)[1])
    std = math.sqrt(0.25 * 2 / (2 - ddof))
    eps = 0.5 / value - std if value > 0 else float("inf")
    if not -1e-9 <= eps <= MAX_DEFAULT_EPS:
        fail(
            f"{GRA}([[0, 1]])[0, 1] (the default eps) = {fmt_number(value)}, which is 0.5 / (std + eps) with eps = "
            f"{fmt_number(eps)}; keep the default eps small (the statement's 1e-6; TRL uses 1e-4)"
        )
    return _Convention(ddof, max(eps, 0.0))


@check_case("returns a float numpy array of shape [B, G]")
def _gra_shape(fn: Callable[..., Any]) -> None:
    rewards = np.array([[1, 0, 0, 1, 1], [0, 0, 1, 0, 0], [1, 1, 1, 0, 1]])
    what = _gra_what(rewards.shape)
    arr = assert_array(call_on_copies(fn, rewards), what=what, shape=(3, 5))
    assert_float_dtype(arr, what=what)


@check_case("hand-computed values, without the std")
def _gra_known_mean(fn: Callable[..., Any]) -> None:
    assert_allclose(
        call_on_copies(fn, np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 1.0]]), normalize_std=False),
        [[0.5, -0.5, -0.5, 0.5], [1.0, -1.0, 0.0, 0.0]],
        what=_gra_what((2, 4), normalize_std=False),
    )


@check_case("the std is the population std (ddof = 0) or the sample std (ddof = 1), the same for every group size")
def _gra_ddof(fn: Callable[..., Any]) -> None:
    _gra_convention(fn)


@check_case("eps is added to the std, outside the square root")
def _gra_eps(fn: Callable[..., Any]) -> None:
    ddof = _gra_convention(fn).ddof
    # (r - 0.5) / (std + 0.5) with std = 0.5 (ddof 0) or 0.707107 (ddof 1)
    rewards = np.array([[0.0, 1.0], [2.0, 0.0]])
    for eps in (0.5, 0.01):
        assert_allclose(
            call_on_copies(fn, rewards, normalize_std=True, eps=eps),
            naive_group_advantages(rewards, True, eps, ddof),
            what=_gra_what(rewards.shape, normalize_std=True, eps=eps) + f" (with {DDOF_NAMES[ddof]})",
        )


@check_case("a group whose rewards are all equal gives zeros, not NaN")
def _gra_constant(fn: Callable[..., Any]) -> None:
    conv = _gra_convention(fn)
    rewards = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    what = _gra_what(rewards.shape)
    assert_allclose(call_on_copies(fn, rewards), naive_group_advantages(rewards, True, conv.eps, conv.ddof), what=what)


@check_case("each group uses its own mean and std")
def _gra_rows(fn: Callable[..., Any]) -> None:
    conv = _gra_convention(fn)
    rewards = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [5.0, 3.0, 4.0, 4.0]])
    for flag in (False, True):
        together = assert_array(
            call_on_copies(fn, rewards, normalize_std=flag, eps=1e-6),
            what=_gra_what(rewards.shape, normalize_std=flag, eps=1e-6),
            shape=rewards.shape,
        )
        for i in range(rewards.shape[0]):
            alone = call_on_copies(fn, rewards[i : i + 1], normalize_std=flag, eps=1e-6)
            assert_allclose(
                alone,
                together[i : i + 1],
                what=f"group {i} computed alone (normalize_std={flag}), compared with row {i} of the batch",
            )
        assert_allclose(
            together,
            naive_group_advantages(rewards, flag, 1e-6, conv.ddof),
            what=_gra_what(rewards.shape, normalize_std=flag, eps=1e-6),
        )


@check_case("matches explicit per-group sums on random rewards, with and without the std")
def _gra_oracle(fn: Callable[..., Any]) -> None:
    ddof = _gra_convention(fn).ddof
    rng = np.random.default_rng(0)
    for case, (n_b, n_g) in enumerate([(1, 2), (4, 8), (16, 3), (5, 16), (3, 5)]):
        rewards = np.round(rng.normal(size=(n_b, n_g)), 3) if case % 2 else (rng.random((n_b, n_g)) < 0.4).astype(float)
        for flag in (True, False):
            assert_allclose(
                call_on_copies(fn, rewards, normalize_std=flag, eps=1e-6),
                naive_group_advantages(rewards, flag, 1e-6, ddof),
                what=f"random case {case + 1} (B={n_b}, G={n_g}, normalize_std={flag}, eps=1e-6)",
            )


@check_case("with the std, scaling and shifting the rewards (a * r + c, a > 0) changes nothing")
def _gra_invariance(fn: Callable[..., Any]) -> None:
    rewards = np.round(np.random.default_rng(1).normal(size=(3, 6)), 3)
    base = assert_array(
        call_on_copies(fn, rewards, eps=0.0), what=_gra_what(rewards.shape, eps=0.0), shape=rewards.shape
    )
    assert_allclose(
        call_on_copies(fn, 3.0 * rewards + 7.0, eps=0.0),
        base,
        what=f"{GRA}(3 * rewards + 7, eps=0.0) compared with {GRA}(rewards, eps=0.0)",
        rtol=1e-6,
        atol=1e-9,
    )


@check_case("accepts lists and does not modify its input")
def _gra_inputs(fn: Callable[..., Any]) -> None:
    conv = _gra_convention(fn)
    as_list = [[1, 0, 1], [0, 0, 1]]
    assert_allclose(
        call(fn, [row[:] for row in as_list]),
        naive_group_advantages(as_list, True, conv.eps, conv.ddof),
        what=f"{GRA}({as_list})",
    )
    assert_inputs_unchanged(fn, GRA, rewards=np.array([[1.0, 0.0, 2.0], [3.0, 3.0, 1.0]]))


GROUP_RELATIVE_ADVANTAGES = Exercise(
    name=GRA,
    points=10,
    title="group-relative advantages of G answers per prompt (GRPO, eq. 01.6)",
    advice="from each row's mean and std (eq. 01.6)",
    checks=(
        _gra_shape,
        _gra_known_mean,
        _gra_ddof,
        _gra_constant,
        _gra_eps,
        _gra_rows,
        _gra_oracle,
        _gra_invariance,
        _gra_inputs,
    ),
    hints=(
        "Each row is one prompt's group and is its own baseline: subtract the row's mean from every reward in the "
        "row, then, with `normalize_std`, divide by the row's spread.",
        "Reduce along axis 1 with `keepdims=True`, so that the per-row statistics have shape `[B, 1]` and broadcast "
        "against `[B, G]`. Compute the centred rewards once; without `normalize_std` they are the answer.",
        "Check the properties the grader checks: a row of equal rewards gives zeros, not NaN (so `eps` belongs "
        "outside the square root); each row computed alone equals that row of the batch; with the std, `3 * r + 7` "
        "gives the same advantages as `r`; and the same std convention (population or sample) for every group size.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: reinforce_update
# ---------------------------------------------------------------------------------------

UPD = "reinforce_update"


def _make_policy(obs_dim: int, n_actions: int, seed: int) -> torch.nn.Module:
    from torch import nn

    with torch_seeded(seed):
        return nn.Sequential(nn.Linear(obs_dim, 6), nn.Tanh(), nn.Linear(6, n_actions))


def _flat_params(policy: torch.nn.Module) -> NDArray[np.float64]:
    import torch

    with torch.no_grad():
        return torch.cat([p.detach().reshape(-1) for p in policy.parameters()]).double().numpy().copy()


def _rollout(seed: int, n_t: int, n_b: int, obs_dim: int, n_actions: int, dones_dtype: Any = bool) -> dict[str, Any]:
    """Seeded rollout arrays; ``dones`` as bool (gymnasium), or 0/1 ``int64`` or ``float64``."""
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, size=(n_t, n_b)).astype(np.float64)
    dones = rng.random((n_t, n_b)) < 0.3
    dones[1, 0] = True  # at least one episode end inside the rollout
    return {
        "obs": rng.normal(size=(n_t, n_b, obs_dim)).astype(np.float32),
        "actions": rng.integers(0, n_actions, size=(n_t, n_b)),
        "rewards": rewards,
        "dones": dones.astype(dones_dtype),
    }


def _expected_change(
    policy: torch.nn.Module,
    data: dict[str, Any],
    gamma: float,
    lr: float,
    *,
    ignore_dones: bool = False,
    normalize: bool = True,
    ddof: int = 0,
    per_column: bool = False,
) -> tuple[float, NDArray[np.float64]]:
    """The oracle's loss and SGD parameter change ``-lr * grad L`` (or those of a named bug);
    ``ddof`` 0 or 1 are both right (the statement accepts either std)."""
    dones = np.zeros_like(data["dones"]) if ignore_dones else data["dones"]
    g = naive_reward_to_go(data["rewards"], dones, gamma)
    if per_column:
        weights = np.stack([naive_normalized(g[:, b], ddof) for b in range(g.shape[1])], axis=1)
    else:
        weights = naive_normalized(g, ddof) if normalize else g
    loss, grad = naive_reinforce_loss_and_grad(policy, data["obs"], data["actions"], weights)
    return loss, -lr * grad


class _Bug(TypedDict, total=False):
    """A known wrong variant of the update, as keyword arguments of :func:`_expected_change`."""

    ignore_dones: bool
    normalize: bool
    ddof: int
    per_column: bool


_KNOWN_BUGS: dict[str, _Bug] = {
    "the returns run across episode ends (use dones to cut them)": {"ignore_dones": True},
    "the weights are not normalised: A = (G - mean G) / (std G + 1e-8)": {"normalize": False},
    "the weights are normalised within each env's column; normalise over the whole [T, B] batch": {"per_column": True},
}

#: The two std conventions the statement accepts for the batch normalisation.
_DDOFS = (0, 1)


def _matches_either(change: NDArray[np.float64], expected: dict[int, NDArray[np.float64]]) -> bool:
    return any(np.allclose(change, e, rtol=1e-3, atol=1e-6) for e in expected.values())


def _run_update(
    fn: Callable[..., Any], policy: torch.nn.Module, optimizer: Any, data: dict[str, Any], gamma: float
) -> Any:
    return call(
        fn,
        policy,
        optimizer,
        copy_input(data["obs"]),
        copy_input(data["actions"]),
        copy_input(data["rewards"]),
        copy_input(data["dones"]),
        gamma,
    )


def _check_step(
    fn: Callable[..., Any], seed: int, stale_grads: bool, gamma: float = 0.9, dones_dtype: Any = bool
) -> None:
    import torch

    data = _rollout(seed, n_t=5, n_b=3, obs_dim=3, n_actions=3, dones_dtype=dones_dtype)
    lr = 0.1
    policy = _make_policy(3, 3, seed)
    reference = copy.deepcopy(policy)  # the learner's step changes `policy`
    both = {ddof: _expected_change(reference, data, gamma, lr, ddof=ddof)[1] for ddof in _DDOFS}
    expected = both[0]
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr)
    if stale_grads:
        for p in policy.parameters():
            p.grad = torch.full_like(p, 5.0)
    before = _flat_params(policy)
    _run_update(fn, policy, optimizer, data, gamma)
    change = _flat_params(policy) - before
    if _matches_either(change, both):
        return
    if stale_grads and np.allclose(change, expected - lr * 5.0, rtol=1e-3, atol=1e-6):
        fail(
            "gradients left in .grad before the call leaked into the step: call optimizer.zero_grad() "
            "before loss.backward()"
        )
    if np.allclose(change, 2 * expected, rtol=1e-3, atol=1e-6):
        fail("the parameters moved twice as far as one SGD step: call optimizer.step() once per update")
    if np.allclose(change, -expected, rtol=1e-3, atol=1e-6):
        fail("the parameters moved opposite to a policy-gradient step: minimise -mean(A * log pi), not +mean")
    if np.allclose(change, 0.0, atol=1e-9):
        fail("the parameters did not change: call loss.backward() and optimizer.step()")
    n = data["actions"].size
    if np.allclose(change, n * expected, rtol=1e-3, atol=1e-6):
        fail(
            f"the parameters moved {n} times as far as expected: the loss is a sum over the T * B = {n} steps; average"
        )
    mistakes: dict[str, Any] = {
        message: lambda bug=bug: _expected_change(reference, data, gamma, lr, **bug)[1]
        for message, bug in _KNOWN_BUGS.items()
    }
    for other in (0.0, 0.5, 0.9, 0.99, 1.0):
        if other != gamma:
            mistakes[
                f"the returns are discounted with gamma={other:g}, not the gamma passed in ({gamma:g}): "
                "pass `gamma` on to the returns"
            ] = lambda other=other: _expected_change(reference, data, other, lr)[1]
    fail_if_known_mistake(change, mistakes, rtol=1e-3, atol=1e-6)
    bad = int(np.argmax(np.abs(change - expected)))
    fail(
        f"after one SGD step (lr={lr:g}, gamma={gamma:g}) parameter {bad} changed by {fmt_number(change[bad])}; "
        f"expected -lr * dL/dtheta = {fmt_number(expected[bad])}"
    )


def _called_names(fn: Any) -> set[str]:
    """The global names the learner's ``fn`` reads, with those of the learner's own helper
    functions it reads (defined in the same namespace), and of nested code (lambdas, inner
    functions). A static walk: nothing is run."""
    import types

    if not isinstance(fn, types.FunctionType):
        return set()
    namespace, names, seen = fn.__globals__, set(), set()
    stack = [fn.__code__]
    while stack:
        code = stack.pop()
        if id(code) in seen:
            continue
        seen.add(id(code))
        for name in code.co_names:
            names.add(name)
            value = namespace.get(name)
            if isinstance(value, types.FunctionType) and value.__globals__ is namespace:
                stack.append(value.__code__)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def _require_own_exercise(fn: Any, name: str, number: int, exercise: Exercise) -> None:
    """If ``fn`` reads the learner's own ``name`` (exercise ``number``), run that exercise's checks
    on it and fail, naming it, at the first that fails. The library's function (the statement
    offers it) is not checked here."""
    dep = getattr(fn, "__globals__", {}).get(name)
    if name not in _called_names(fn) or not callable(dep):
        return
    if str(getattr(dep, "__module__", "") or "").startswith("course_lib"):
        return
    head = f"fix {name} first (exercise {number}; {UPD} calls it)"
    for chk in exercise.checks:
        try:
            chk.fn(dep)
        except NotImplementedError:
            fail(f"{UPD} calls your {name}, which is not implemented yet: solve exercise {number} first")
        except LearnerError as exc:
            if isinstance(exc.error, NotImplementedError):
                fail(f"{UPD} calls your {name}, which is not implemented yet: solve exercise {number} first")
            fail(f"{head}: {name} raised {type(exc.error).__name__}: {exc.error} in {exc.call_repr}")
        except CheckFailure as exc:
            fail(f"{head}: {exc}")


@check_case("its surrogate_loss passes its checks; one SGD step moves the parameters by -lr * grad L")
def _upd_step(fn: Callable[..., Any]) -> None:
    # a slip in the learner's surrogate_loss (a sum for a mean) is named there,
    # not as a parameter that moved too far; the stub does not call it and reads "not implemented yet"
    _require_own_exercise(fn, SUR, 2, SURROGATE_LOSS)
    _check_step(fn, seed=0, stale_grads=False)


@check_case("returns the loss before the step as a float")
def _upd_loss(fn: Callable[..., Any]) -> None:
    import torch

    data = _rollout(1, n_t=4, n_b=2, obs_dim=3, n_actions=2)
    policy = _make_policy(3, 2, 1)
    losses = [_expected_change(policy, data, 0.9, 0.1, ddof=ddof)[0] for ddof in _DDOFS]
    expected_loss = losses[0]
    got = _run_update(fn, policy, torch.optim.SGD(policy.parameters(), lr=0.1), data, 0.9)
    if _is_tensor(got):
        fail(f"{UPD} returned a torch tensor; return a Python float (loss.item())")
    if not isinstance(got, (float, np.floating)):
        fail(f"{UPD} returned {type(got).__name__}; expected the loss as a Python float")
    if not any(math.isclose(float(got), loss, rel_tol=1e-4, abs_tol=1e-6) for loss in losses):
        fail(
            f"{UPD} returned {fmt_number(got)}; expected the surrogate loss before the step, "
            f"{fmt_number(expected_loss)}"
        )


@check_case("stale gradients in .grad do not leak into the step")
def _upd_zero_grad(fn: Callable[..., Any]) -> None:
    _check_step(fn, seed=2, stale_grads=True, gamma=0.5)


@check_case("episode ends cut the returns, at gamma 0.99, 1 and 0, with 0/1 integer and float dones")
def _upd_dones(fn: Callable[..., Any]) -> None:
    _check_step(fn, seed=3, stale_grads=False, gamma=0.99, dones_dtype=np.int64)
    _check_step(fn, seed=6, stale_grads=False, gamma=1.0, dones_dtype=np.float64)
    _check_step(fn, seed=7, stale_grads=False, gamma=0.0)


@check_case("the step is the given optimizer's (SGD with weight decay here), not plain SGD")
def _upd_optimizer(fn: Callable[..., Any]) -> None:
    import torch

    data = _rollout(8, n_t=5, n_b=3, obs_dim=3, n_actions=3)
    gamma, lr, decay = 0.9, 0.1, 0.5
    policy = _make_policy(3, 3, 8)
    reference = copy.deepcopy(policy)
    plains = {ddof: _expected_change(reference, data, gamma, lr, ddof=ddof)[1] for ddof in _DDOFS}
    # the optimizer's own rule: p <- p - lr * (grad + decay * p)
    both = {ddof: plain - lr * decay * _flat_params(reference) for ddof, plain in plains.items()}
    expected = both[0]
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr, weight_decay=decay)
    before = _flat_params(policy)
    _run_update(fn, policy, optimizer, data, gamma)
    change = _flat_params(policy) - before
    if _matches_either(change, both):
        return
    if _matches_either(change, plains):
        fail(
            f"the parameters moved by -lr * grad, a plain SGD step, but the optimizer passed in has "
            f"weight_decay={decay:g}: take the step with optimizer.step() (it may be Adam, momentum, weight decay)"
        )
    bad = int(np.argmax(np.abs(change - expected)))
    fail(
        f"with torch.optim.SGD(lr={lr:g}, weight_decay={decay:g}) parameter {bad} changed by "
        f"{fmt_number(change[bad])}; the optimizer's step gives {fmt_number(expected[bad])}"
    )


@check_case("does not modify its inputs")
def _upd_inputs(fn: Callable[..., Any]) -> None:
    import torch

    data = _rollout(4, n_t=4, n_b=2, obs_dim=3, n_actions=2)
    policy = _make_policy(3, 2, 4)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.1)
    assert_inputs_unchanged(fn, UPD, 0.9, leading=(policy, optimizer), advice="", **data)


@check_case("learns a two-context task to at least 90% accuracy in 40 updates")
def _upd_learns(fn: Callable[..., Any]) -> None:
    import torch

    # one-step episodes: context c in {0, 1} is observed as onehot(c); action c pays 1, the others 0
    n_b, n_actions = 64, 3
    policy = _make_policy(2, n_actions, 5)
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    eye = torch.eye(2)

    def accuracy() -> float:
        with torch.no_grad():
            return float(torch.softmax(policy(eye), -1)[torch.arange(2), torch.arange(2)].mean())

    start = accuracy()
    for _ in range(40):
        contexts = rng.integers(0, 2, size=n_b)
        obs = np.eye(2, dtype=np.float32)[contexts]
        with torch.no_grad():
            acts = torch.multinomial(torch.softmax(policy(torch.from_numpy(obs)), -1), 1, generator=gen)
        acts_np = acts.squeeze(1).numpy()
        rewards = (acts_np == contexts).astype(np.float64)
        call(fn, policy, optimizer, obs[None], acts_np[None], rewards[None], np.ones((1, n_b), dtype=bool), 0.99)
    end = accuracy()
    assert_true(np.isfinite(end), f"the policy's probabilities became {fmt_number(end)} after training")
    assert_true(
        end >= 0.9,
        f"after 40 updates the right action has probability {end:.2f} (from {start:.2f}); "
        "expected >= 0.90: your update does not reinforce what worked",
    )


REINFORCE_UPDATE = Exercise(
    name=UPD,
    points=15,
    title="one REINFORCE step: reward-to-go, normalised baseline, surrogate loss, optimizer step",
    checks=(_upd_step, _upd_loss, _upd_zero_grad, _upd_dones, _upd_optimizer, _upd_inputs, _upd_learns),
    allowed=("course_lib.rl.pg.discounted_returns", "course_lib.rl.pg.surrogate_loss"),
    advice="from discounted_returns (or your own loop), your surrogate_loss (or the library's), torch and numpy",
    hints=(
        "One REINFORCE step in four parts: the reward-to-go of the rollout (lesson 00's recursion, or "
        "`discounted_returns`), advantages normalised over the whole rollout, the surrogate loss on every step of it "
        "(exercise 2), then one optimizer step.",
        "Normalise the returns over the whole `[T, B]` array (not per env): minus their mean, divided by their std "
        "plus `1e-8`. The policy takes a batch of observations, so flatten time and env together: "
        "observations to `[T * B, obs_dim]`, actions and advantages to `[T * B]`, as torch tensors (float32; the "
        "actions int64).",
        "Check the properties the grader checks: with plain SGD the parameters must move by exactly -lr times the "
        "gradient of the loss you return, and by the optimizer's own rule when it has weight decay; gradients left "
        "in `.grad` by an earlier call must not leak in; the returned loss is the one before the step, a Python float; "
        "and a reward after an episode end must not reach the steps before it.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (RLOO_ADVANTAGES, SURROGATE_LOSS, GROUP_RELATIVE_ADVANTAGES, REINFORCE_UPDATE)
