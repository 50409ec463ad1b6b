"""Lesson 01's graded exercises: reward-to-go, the surrogate loss, group-relative
advantages and a complete REINFORCE update.

The learner writes:

* ``reward_to_go(rewards [T, B], dones [T, B], gamma) -> [T, B]``  (eq. 01.3)
* ``surrogate_loss(logits [N, K], actions [N], advantages [N]) -> scalar tensor``  (01.7)
* ``group_relative_advantages(rewards [B, G], normalize_std=True, eps=1e-6) -> [B, G]``  (01.6)
* ``reinforce_update(policy, optimizer, obs, actions, rewards, dones, gamma) -> float``

The checks never call ``course_lib.rl.pg`` or ``course_lib.rl.reinforce``: they compare with
the deliberately naive oracles below, which mirror the closed forms (a sum per step, an
explicit log-sum-exp per row, explicit sums per group), with hand-computed values, and
with properties. torch is imported inside the checks that need it, so loading this
module stays light.

What each exercise teaches, and how the checks observe it (not only its values):

* reward_to_go, mechanism: lesson 00's backward recursion run on whole rows, one running
  return per env, cut by that env's own done; observed by envs ending at different steps,
  each column computed alone, gamma from 0 to 1, bool, integer and float dones, a float64
  result (the statement's dtype).
* surrogate_loss, mechanism: a numerically stable log-softmax, each row's taken action picked,
  weighted by the detached advantage, averaged and negated, so that autograd gives (01.4);
  observed by the gradient against (01.4), a repeated batch (a mean), a gradient into
  ``advantages`` (detached), logits 1000 apart (log(softmax(...)) underflows to -inf or is
  clipped) and the autograd graph (a log taken of a softmax is named).
* group_relative_advantages, mechanism: each row's own mean and population std, eps outside the
  square root, the std only when asked; observed by rows computed alone, both settings,
  constant groups, eps values, a scale and shift.
* reinforce_update, mechanism: the learner's reward_to_go and surrogate_loss composed with a
  batch-normalised baseline and one step of the optimizer it is given; observed by checking
  the reward_to_go and surrogate_loss it calls first (a slip there is named there), the
  parameter change against -lr * grad at several discounts and dones dtypes, stale .grad,
  and an optimizer with weight decay (the step must be the given optimizer's, not plain SGD).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

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


def naive_group_advantages(rewards: Any, normalize_std: bool, eps: float) -> NDArray[np.float64]:
    """Eq. (01.6) with explicit sums per group: mean, population std, then the ratio."""
    rows = np.asarray(rewards, dtype=np.float64).tolist()
    out = np.zeros(np.asarray(rewards).shape, dtype=np.float64)
    for i, row in enumerate(rows):
        n = len(row)
        mean = sum(row) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in row) / n)
        for j, x in enumerate(row):
            out[i, j] = (x - mean) / (std + eps) if normalize_std else x - mean
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
# Exercise 1: reward_to_go
# ---------------------------------------------------------------------------------------

RTG = "reward_to_go"


def _rtg_what(shape: tuple[int, ...], gamma: float, extra: str = "") -> str:
    return f"{RTG}(rewards of shape {shape}, dones, gamma={gamma:g}){extra}"


@check_case("returns a float64 numpy array of shape [T, B]")
def _rtg_shape(fn: Callable[..., Any]) -> None:
    rewards, dones = random_rollout(0, 5, 3)
    what = _rtg_what(rewards.shape, 0.9)
    arr = assert_array(call_on_copies(fn, rewards, dones, 0.9), what=what, shape=(5, 3))
    assert_float_dtype(arr, what=what)
    if arr.dtype != np.float64:
        fail(f"{what} has dtype {arr.dtype}; the statement asks for float64 (np.asarray(rewards, dtype=np.float64))")


@check_case("hand-computed values, two envs with episode ends at different steps")
def _rtg_known(fn: Callable[..., Any]) -> None:
    # env 0: episode = steps 0-1 (done at 1), then steps 2-3 cut off: 1.5, 1, 1.5, 1
    # env 1: episode = steps 0-2 (done at 2), then step 3 cut off: 1.75, 1.5, 1, 1
    rewards = np.ones((4, 2))
    dones = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    expected = [[1.5, 1.75], [1.0, 1.5], [1.5, 1.0], [1.0, 1.0]]
    assert_allclose(call_on_copies(fn, rewards, dones, 0.5), expected, what=_rtg_what((4, 2), 0.5))


@check_case("boolean dones, as gymnasium returns them")
def _rtg_bool(fn: Callable[..., Any]) -> None:
    rewards, dones = random_rollout(1, 6, 2, p_done=0.4)
    assert_allclose(
        call_on_copies(fn, rewards, dones.astype(bool), 0.9),
        naive_reward_to_go(rewards, dones, 0.9),
        what=_rtg_what(rewards.shape, 0.9, " with bool dones"),
    )


@check_case("integer rewards and dones give float returns")
def _rtg_int(fn: Callable[..., Any]) -> None:
    rewards = np.array([[1, 2], [3, 4], [5, 6]])
    dones = np.array([[0, 0], [0, 1], [0, 0]])
    # env 0: 1 + .5*3 + .25*5 = 3.75, 3 + .5*5 = 5.5, 5;  env 1: 2 + .5*4 = 4, 4, 6
    assert_allclose(
        call_on_copies(fn, rewards, dones, 0.5),
        [[3.75, 4.0], [5.5, 4.0], [5.0, 6.0]],
        what=_rtg_what((3, 2), 0.5, " with integer inputs"),
    )


@check_case("each env's column equals that column computed alone")
def _rtg_columns(fn: Callable[..., Any]) -> None:
    rewards, dones = random_rollout(2, 7, 3, p_done=0.3)
    together = assert_array(call_on_copies(fn, rewards, dones, 0.9), what=_rtg_what(rewards.shape, 0.9), shape=(7, 3))
    for b in range(3):
        alone = call_on_copies(fn, rewards[:, b : b + 1], dones[:, b : b + 1], 0.9)
        assert_allclose(
            alone,
            together[:, b : b + 1],
            what=f"{RTG} of env {b}'s column alone (shape (7, 1)), compared with column {b} of the batch",
        )


@check_case("gamma = 0 gives the rewards")
def _rtg_gamma0(fn: Callable[..., Any]) -> None:
    rewards, dones = random_rollout(3, 4, 5)
    assert_allclose(call_on_copies(fn, rewards, dones, 0.0), rewards, what=_rtg_what(rewards.shape, 0.0))


@check_case("matches the naive sum over each episode on random rollouts")
def _rtg_oracle(fn: Callable[..., Any]) -> None:
    cases = [(10, 1, 1, 0.9), (11, 9, 4, 0.99), (12, 30, 3, 0.9), (13, 12, 6, 1.0), (14, 3, 8, 0.5)]
    for case, (seed, n_t, n_b, gamma) in enumerate(cases):
        rewards, dones = random_rollout(seed, n_t, n_b)
        assert_allclose(
            call_on_copies(fn, rewards, dones, gamma),
            naive_reward_to_go(rewards, dones, gamma),
            what=f"random case {case + 1} (T={n_t}, B={n_b}, gamma={gamma:g})",
        )


@check_case("an empty rollout (T = 0) gives an empty [0, B] float array")
def _rtg_empty(fn: Callable[..., Any]) -> None:
    what = _rtg_what((0, 3), 0.9)
    arr = assert_array(call_on_copies(fn, np.zeros((0, 3)), np.zeros((0, 3), dtype=bool), 0.9), what=what, shape=(0, 3))
    assert_float_dtype(arr, what=what)


@check_case("does not modify its inputs")
def _rtg_inputs(fn: Callable[..., Any]) -> None:
    rewards, dones = random_rollout(20, 6, 3, p_done=0.4)
    assert_inputs_unchanged(fn, RTG, 0.9, rewards=rewards, dones=dones.astype(np.float64))


REWARD_TO_GO = Exercise(
    name=RTG,
    points=10,
    title="reward-to-go of a time-major [T, B] rollout, cut at episode ends (eq. 01.3)",
    advice="one backward pass over the time steps, a running return per env (eq. 01.3)",
    checks=(
        _rtg_shape,
        _rtg_known,
        _rtg_bool,
        _rtg_int,
        _rtg_columns,
        _rtg_gamma0,
        _rtg_oracle,
        _rtg_empty,
        _rtg_inputs,
    ),
    hints=(
        "Lesson 00's backward recursion works unchanged on whole rows: carry one running return per env, a vector of "
        "shape `[B]`, and update every env at once at each step.",
        "Convert both inputs to float64 arrays first (booleans become 0.0/1.0, so `1 - d` works). Time is axis 0: "
        "loop `t` from `T - 1` down to 0, updating the `[B]` running return from row `t` of the rewards and of the "
        "dones, and store it into row `t` of the output.",
        "Start the running return at `np.zeros` of shape `[B]` (the rewards' shape without its first axis) and the "
        "output at `np.zeros_like` of the float rewards: an empty rollout then gives `[0, B]` with no special case. "
        "Traps: a loop over the envs as well (not needed), reading the dones of step `t + 1` instead of `t`, and "
        "writing into the caller's arrays.",
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
        "`gather` wants an int64 index of shape `[N, 1]` (`.long()`, `.unsqueeze(1)`; `.squeeze(1)` afterwards). "
        "Weight by the detached advantages (constants: no gradient may reach them), average with `.mean()`, not "
        "`.sum()`, negate, and return the tensor itself, not `.item()`.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: group_relative_advantages
# ---------------------------------------------------------------------------------------

GRA = "group_relative_advantages"


def _gra_what(shape: tuple[int, ...], **kwargs: Any) -> str:
    return call_text(GRA, f"rewards of shape {shape}", **kwargs)


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


@check_case("the std is the population std (ddof = 0)")
def _gra_ddof(fn: Callable[..., Any]) -> None:
    # group [0, 1]: mean 0.5, population std 0.5 -> [-1, 1] (ddof = 1 would give std 0.707)
    assert_allclose(
        call_on_copies(fn, np.array([[0.0, 1.0]]), normalize_std=True, eps=0.0),
        [[-1.0, 1.0]],
        what=_gra_what((1, 2), normalize_std=True, eps=0.0),
    )


@check_case("eps is added to the std, outside the square root")
def _gra_eps(fn: Callable[..., Any]) -> None:
    # (r - 0.5) / (0.5 + 0.5) = [-0.5, 0.5]
    assert_allclose(
        call_on_copies(fn, np.array([[0.0, 1.0]]), normalize_std=True, eps=0.5),
        [[-0.5, 0.5]],
        what=_gra_what((1, 2), normalize_std=True, eps=0.5),
    )


@check_case("a group whose rewards are all equal gives zeros, not NaN")
def _gra_constant(fn: Callable[..., Any]) -> None:
    rewards = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])
    what = _gra_what(rewards.shape)
    assert_allclose(call_on_copies(fn, rewards), naive_group_advantages(rewards, True, 1e-6), what=what)


@check_case("each group uses its own mean and std")
def _gra_rows(fn: Callable[..., Any]) -> None:
    rewards = np.array([[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0], [5.0, 3.0, 4.0, 4.0]])
    for flag in (False, True):
        together = assert_array(
            call_on_copies(fn, rewards, normalize_std=flag),
            what=_gra_what(rewards.shape, normalize_std=flag),
            shape=rewards.shape,
        )
        for i in range(rewards.shape[0]):
            alone = call_on_copies(fn, rewards[i : i + 1], normalize_std=flag)
            assert_allclose(
                alone,
                together[i : i + 1],
                what=f"group {i} computed alone (normalize_std={flag}), compared with row {i} of the batch",
            )
        assert_allclose(
            together, naive_group_advantages(rewards, flag, 1e-6), what=_gra_what(rewards.shape, normalize_std=flag)
        )


@check_case("matches explicit per-group sums on random rewards, with and without the std")
def _gra_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for case, (n_b, n_g) in enumerate([(1, 2), (4, 8), (16, 3), (5, 16)]):
        rewards = np.round(rng.normal(size=(n_b, n_g)), 3) if case % 2 else (rng.random((n_b, n_g)) < 0.4).astype(float)
        for flag in (True, False):
            assert_allclose(
                call_on_copies(fn, rewards, normalize_std=flag),
                naive_group_advantages(rewards, flag, 1e-6),
                what=f"random case {case + 1} (B={n_b}, G={n_g}, normalize_std={flag})",
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
    as_list = [[1, 0, 1], [0, 0, 1]]
    assert_allclose(
        call(fn, [row[:] for row in as_list]), naive_group_advantages(as_list, True, 1e-6), what=f"{GRA}({as_list})"
    )
    assert_inputs_unchanged(fn, GRA, rewards=np.array([[1.0, 0.0, 2.0], [3.0, 3.0, 1.0]]))


GROUP_RELATIVE_ADVANTAGES = Exercise(
    name=GRA,
    points=10,
    title="group-relative advantages of G answers per prompt (GRPO, eq. 01.6)",
    advice="from each row's mean and population std (eq. 01.6)",
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
        "Use numpy's population std (`.std` with its default `ddof=0`; torch's `.std()` defaults to `ddof=1`), and "
        "add `eps` to the std, outside the square root: a row of equal rewards then gives 0 / eps = 0, not NaN. Work "
        "on a float64 copy, never on the caller's array.",
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
) -> tuple[float, NDArray[np.float64]]:
    """The oracle's loss and SGD parameter change ``-lr * grad L`` (or those of a named bug)."""
    dones = np.zeros_like(data["dones"]) if ignore_dones else data["dones"]
    g = naive_reward_to_go(data["rewards"], dones, gamma)
    weights = naive_normalized(g, ddof) if normalize else g
    loss, grad = naive_reinforce_loss_and_grad(policy, data["obs"], data["actions"], weights)
    return loss, -lr * grad


class _Bug(TypedDict, total=False):
    """A known wrong variant of the update, as keyword arguments of :func:`_expected_change`."""

    ignore_dones: bool
    normalize: bool
    ddof: int


_KNOWN_BUGS: dict[str, _Bug] = {
    "the returns run across episode ends (use dones to cut them)": {"ignore_dones": True},
    "the weights are not normalised: A = (G - mean G) / (std G + 1e-8)": {"normalize": False},
    "the std is the sample std (ddof = 1, torch's default); use the population std (ddof = 0)": {"ddof": 1},
}


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
    _, expected = _expected_change(reference, data, gamma, lr)
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr)
    if stale_grads:
        for p in policy.parameters():
            p.grad = torch.full_like(p, 5.0)
    before = _flat_params(policy)
    _run_update(fn, policy, optimizer, data, gamma)
    change = _flat_params(policy) - before
    if np.allclose(change, expected, rtol=1e-3, atol=1e-6):
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


@check_case("its reward_to_go and surrogate_loss pass their checks; one SGD step moves the parameters by -lr * grad L")
def _upd_step(fn: Callable[..., Any]) -> None:
    # a slip in the learner's reward_to_go or surrogate_loss (a sum for a mean) is named there,
    # not as a parameter that moved too far; the stub calls neither and reads "not implemented yet"
    _require_own_exercise(fn, RTG, 1, REWARD_TO_GO)
    _require_own_exercise(fn, SUR, 2, SURROGATE_LOSS)
    _check_step(fn, seed=0, stale_grads=False)


@check_case("returns the loss before the step as a float")
def _upd_loss(fn: Callable[..., Any]) -> None:
    import torch

    data = _rollout(1, n_t=4, n_b=2, obs_dim=3, n_actions=2)
    policy = _make_policy(3, 2, 1)
    expected_loss, _ = _expected_change(policy, data, 0.9, 0.1)
    got = _run_update(fn, policy, torch.optim.SGD(policy.parameters(), lr=0.1), data, 0.9)
    if _is_tensor(got):
        fail(f"{UPD} returned a torch tensor; return a Python float (loss.item())")
    if not isinstance(got, (float, np.floating)):
        fail(f"{UPD} returned {type(got).__name__}; expected the loss as a Python float")
    if not math.isclose(float(got), expected_loss, rel_tol=1e-4, abs_tol=1e-6):
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
    _, plain = _expected_change(reference, data, gamma, lr)
    # the optimizer's own rule: p <- p - lr * (grad + decay * p)
    expected = plain - lr * decay * _flat_params(reference)
    optimizer = torch.optim.SGD(policy.parameters(), lr=lr, weight_decay=decay)
    before = _flat_params(policy)
    _run_update(fn, policy, optimizer, data, gamma)
    change = _flat_params(policy) - before
    if np.allclose(change, expected, rtol=1e-3, atol=1e-6):
        return
    if np.allclose(change, plain, rtol=1e-3, atol=1e-6):
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
    advice="from your reward_to_go and surrogate_loss (or the library's, which the statement offers), torch and numpy",
    hints=(
        "One REINFORCE step in four parts, reusing your earlier exercises: the reward-to-go of the rollout (exercise "
        "1), advantages normalised over the whole rollout, the surrogate loss on every step of it (exercise 2), then "
        "one optimizer step.",
        "Normalise the returns over the whole `[T, B]` array: minus their mean, divided by their std plus `1e-8` (in "
        "numpy: the population std). The policy takes a batch of observations, so flatten time and env together: "
        "observations to `[T * B, obs_dim]`, actions and advantages to `[T * B]`, as torch tensors (float32; the "
        "actions int64).",
        "The optimizer step is the usual three calls, in this order: clear the stale gradients, backpropagate the "
        "loss, step (clearing after the backward pass throws the gradient away). Return the loss as a Python float "
        "(`.item()`). Traps: calling the policy on the unflattened `[T, B, obs_dim]` array, and a sum where the "
        "surrogate takes a mean.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (REWARD_TO_GO, SURROGATE_LOSS, GROUP_RELATIVE_ADVANTAGES, REINFORCE_UPDATE)
