"""Lesson 02's graded exercises: PPO's loss with the truncated behaviour weight (TIS), the effective sample size, the ESS
fraction expected from the divergence, and per-token and per-sequence ratios.

The learner writes:

* ``tis_ppo_loss(logp_new, logp_old, logp_behaviour [N, T], advantages [N], mask [N, T], eps=0.2, c=2.0) -> scalar tensor``  (02.4-02.5)
* ``effective_sample_size(weights [N]) -> float``  (02.6)
* ``expected_ess_fraction(logp_target [K], logp_behaviour [K]) -> float``  (02.6-02.7)
* ``token_and_sequence_ratios(logp_new [N, T], logp_old [N, T], mask [N, T]) -> ([N, T], [N])``  (02.3)

The checks never call ``course_lib.rl.importance``: they compare with the naive oracles
below (explicit loops over samples and tokens with ``math.exp``, mirroring the
equations), with hand-computed values, and with properties. Inputs cross the
clip thresholds on both sides. Where a wrong answer matches a known mistake (inverted
ratio, a capped product w A, the KL bound instead of the exact fraction, ...), the message
names the mistake. torch is imported inside the checks that need it.

What each exercise teaches, and how the checks observe it (not only its values):

* tis_ppo_loss, mechanism: r = exp(clamp(where(mask, logp_new - sg[logp_old], 0), -20, 20)) and
  v = exp(clamp(where(mask, sg[logp_old] - sg[logp_behaviour], 0), -20, log c)) per token; PPO's
  min(r A, clip(r) A) times the constant v, summed over the real tokens and divided by their number;
  observed by its gradient at logp_new = logp_old (a weight built from logp_new and differentiated,
  named), the cap on pi_old / mu alone and from above only (pi_theta / mu capped, v r capped,
  clip(v, 1/c, c): named), the clip against pi_old (against mu: named), min of the two terms and a
  two-sided clip (max, or an upper clip only, wrong for A < 0: named), eps and c, masks with holes and
  NaN / -inf there, the mean over real tokens (not N * T, not per answer, not PipelineRL's / N: named),
  float32 log-ratios of +-100 (an unclamped exp gives 0 * inf = NaN in the gradient) and -800, and with
  A < 0 (the unclipped branch) a log-ratio of 30 in float32 and 800 in float64 (an unclamped float64 upcast: named),
  and log(pi_old / mu) = 100 with c = inf in float32 (log v clamped at 20 too).
* effective_sample_size, mechanism: (sum w)^2 / sum w^2 with a guard for all-zero weights;
  observed by equal weights over N from 1 to 1000, one non-zero weight, scale invariance,
  [1, N], random weights of growing spread.
* expected_ess_fraction, mechanism: 1 / sum_k exp(2 log pi_k - log mu_k), an expectation under
  the sampler mu summed over the actions, in log space; observed against chi^2 summed another way,
  along lesson 02's family (falling, below exp(-KL)), against 200,000 samples of mu, at -800.
* token_and_sequence_ratios, mechanism: per-token log-ratios selected by the mask (0 where it is
  False), summed per row and exponentiated at the end; observed by masks with holes (a prompt
  before the answer, padding after: a mask rebuilt from its lengths is wrong there), -inf and
  NaN at masked positions (a mask multiplied in gives 0 * inf = NaN), -800 log-probabilities, and an
  answer whose running product of token ratios passes e^709 before coming back to 1 (a product of
  exponentials overflows; the exponential of the summed log-ratios does not).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    assert_allclose,
    assert_array,
    assert_float_dtype,
    assert_inputs_unchanged,
    assert_true,
    call,
    check_case,
    describe_type,
    fail,
    fmt_number,
)
from course_lib.course.grading.helpers import assert_scalar_tensor, call_on_copies, fail_if_known_mistake
from course_lib.course.grading.vocab import quiet_floats

LESSON = "02_importance_sampling"

# ---------------------------------------------------------------------------------------
# Oracles: naive, formula-mirroring implementations
# ---------------------------------------------------------------------------------------


def _floats(x: Any) -> list[float]:
    return [float(v) for v in np.asarray(x, dtype=np.float64).reshape(-1).tolist()]


def naive_expected_ess_fraction(logp_target: Any, logp_behaviour: Any) -> float:
    """``1 / (1 + chi2)`` with ``chi2 = sum_k (pi_k - mu_k)^2 / mu_k``, one action at a time (moderate log-probabilities).

    Deliberately not the learner's route (``1 / sum_k pi_k^2 / mu_k``): the two agree
    because ``sum_k pi_k = sum_k mu_k = 1``.
    """
    pi = [math.exp(x) for x in _floats(logp_target)]
    mu = [math.exp(x) for x in _floats(logp_behaviour)]
    chi2 = sum((pi[k] - mu[k]) ** 2 / mu[k] for k in range(len(pi)))
    return 1.0 / (1.0 + chi2)


def naive_ess(weights: Any) -> float:
    """``(sum w)^2 / sum w^2`` with explicit sums; 0 when every weight is 0."""
    w = _floats(weights)
    squares = sum(x * x for x in w)
    return 0.0 if squares == 0 else sum(w) ** 2 / squares


def naive_token_and_sequence_ratios(
    logp_new: Any, logp_old: Any, mask: Any
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Token ratios ``exp(new - old)`` (1 at padding) and, per row, the product of the real ones."""
    new = np.asarray(logp_new, dtype=np.float64).tolist()
    old = np.asarray(logp_old, dtype=np.float64).tolist()
    real = np.asarray(mask).astype(bool).tolist()
    n_rows, n_t = len(new), (len(new[0]) if new else 0)
    tokens = np.ones((n_rows, n_t), dtype=np.float64)
    seqs = np.ones(n_rows, dtype=np.float64)
    for i in range(n_rows):
        log_seq = 0.0
        for t in range(n_t):
            if real[i][t]:
                tokens[i, t] = math.exp(new[i][t] - old[i][t])
                log_seq += new[i][t] - old[i][t]
        seqs[i] = math.exp(log_seq)
    return tokens, seqs


def naive_clipped_terms(logp_new: Any, logp_old: Any, advantages: Any, eps: float) -> tuple[list[float], list[float]]:
    """Per sample: the clipped objective ``min(r A, clip(r) A)`` and its derivative in ``log pi``.

    The derivative is ``r A`` where the unclipped term is the smaller one, else 0.
    """
    lt, lb, adv = _floats(logp_new), _floats(logp_old), _floats(advantages)
    values, slopes = [], []
    for i in range(len(lt)):
        r = math.exp(lt[i] - lb[i])
        unclipped = r * adv[i]
        clipped = min(max(r, 1.0 - eps), 1.0 + eps) * adv[i]
        values.append(min(unclipped, clipped))
        slopes.append(unclipped if unclipped <= clipped else 0.0)
    return values, slopes


def naive_clipped_loss_and_grad(
    logp_new: Any, logp_old: Any, advantages: Any, eps: float
) -> tuple[float, NDArray[np.float64]]:
    """``L = -(1/N) sum_i min(r_i A_i, clip(r_i) A_i)`` and ``dL / d log pi_i``."""
    values, slopes = naive_clipped_terms(logp_new, logp_old, advantages, eps)
    n = len(values)
    return -sum(values) / n, np.array([-s / n for s in slopes], dtype=np.float64)


# ---------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------


def _scalar(got: Any, what: str) -> float:
    """Require one real number (a Python or numpy scalar, or a 0-d array)."""
    if got is None:
        fail(f"{what} is None; did you forget to `return` it?")
    if isinstance(got, (bool, np.bool_)):
        fail(f"{what} is a bool; expected a float")
    if isinstance(got, np.ndarray) and got.ndim == 0:
        got = got[()]
    if isinstance(got, np.ndarray):
        fail(f"{what} is an array of shape {got.shape}; expected one number (a float): average over the samples")
    if hasattr(got, "detach"):
        fail(f"{what} is a torch tensor; expected a Python float")
    if not isinstance(got, (int, float, np.integer, np.floating)):
        fail(f"{what} is {describe_type(got)}; expected a float")
    return float(got)


def _diagnose(got: Any, candidates: dict[str, Any], what: str, expected: Any, rtol: float = 1e-6) -> None:
    """Fail naming the known mistake whose answer ``got`` matches; else compare with ``expected``."""
    if not hasattr(got, "detach"):
        fail_if_known_mistake(got, candidates, what=what, rtol=rtol, atol=1e-9, equal_nan=True)
    if np.ndim(expected) == 0:
        value = _scalar(got, what)
        if not math.isclose(value, float(expected), rel_tol=rtol, abs_tol=1e-9):
            fail(f"{what} = {fmt_number(value)}; expected {fmt_number(expected)}")
    else:
        assert_allclose(got, expected, what=what, rtol=rtol, atol=1e-9)


# ---------------------------------------------------------------------------------------
# Exercise 1: tis_ppo_loss
# ---------------------------------------------------------------------------------------

TIS = "tis_ppo_loss"
CLAMP = 20.0  # both log-ratios are clamped to [-20, 20] before exp (verl's bound)

#: ``(logp_new [N, T], logp_old [N, T], logp_behaviour [N, T], advantages [N], mask [N, T])``
Batch = tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]


def naive_tis_ppo_loss_and_grad(batch: Batch, eps: float, c: float) -> tuple[float, NDArray[np.float64]]:
    """``L = -(1/#real) sum_real min(v, c) min(r A, clip(r) A)`` and ``dL / d log pi_theta``, one token at a time.

    ``r = exp(clamp(new - old))``, ``v = exp(clamp(old - behaviour))``; the weight is a constant.
    """
    new_a, old_a, beh_a, adv_a, mask_a = batch
    new, old, beh = (np.asarray(a, dtype=np.float64).tolist() for a in (new_a, old_a, beh_a))
    adv = _floats(adv_a)
    real = np.asarray(mask_a).astype(bool).tolist()
    n_rows, n_t = len(new), len(new[0])
    n_real = sum(sum(row) for row in real)
    log_c = math.log(c) if c < math.inf else math.inf
    total, grad = 0.0, np.zeros((n_rows, n_t), dtype=np.float64)
    for i in range(n_rows):
        for t in range(n_t):
            if not real[i][t]:
                continue
            log_r = new[i][t] - old[i][t]
            r = math.exp(min(max(log_r, -CLAMP), CLAMP))
            v = math.exp(min(max(old[i][t] - beh[i][t], -CLAMP), min(log_c, CLAMP)))
            unclipped, clipped = r * adv[i], min(max(r, 1.0 - eps), 1.0 + eps) * adv[i]
            total += v * min(unclipped, clipped)
            if unclipped <= clipped and abs(log_r) < CLAMP:
                grad[i, t] = -v * unclipped / n_real
    return -total / n_real, grad


def _tis_tensors(batch: Batch, dtype: Any = None, const_grad: bool = False) -> tuple[Any, Any, Any, Any, Any]:
    import torch

    dtype = dtype or torch.float64
    new, old, beh, adv, mask = batch
    return (
        torch.tensor(np.asarray(new, dtype=np.float64), dtype=dtype).requires_grad_(),
        torch.tensor(np.asarray(old, dtype=np.float64), dtype=dtype, requires_grad=const_grad),
        torch.tensor(np.asarray(beh, dtype=np.float64), dtype=dtype, requires_grad=const_grad),
        torch.tensor(np.asarray(adv, dtype=np.float64), dtype=dtype, requires_grad=const_grad),
        torch.as_tensor(np.asarray(mask)),
    )


def _tis_random(seed: int, n_rows: int, n_t: int, spread: float = 0.3) -> Batch:
    """A padded batch: r on both sides of both clip thresholds, v on both sides of 1 and of 2, garbage at padding."""
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 0.95, size=(n_rows, n_t)))
    new = old + rng.normal(scale=spread, size=(n_rows, n_t))
    beh = old - rng.normal(scale=0.8, size=(n_rows, n_t))
    lengths = rng.integers(1, n_t + 1, size=n_rows)
    mask = np.arange(n_t)[None, :] < lengths[:, None]
    pad = int((~mask).sum())
    beh[~mask] = np.where(rng.random(pad) < 0.5, np.nan, -np.inf)
    old[~mask] = np.where(rng.random(pad) < 0.5, np.nan, -np.inf)
    new[~mask] = -5.0
    return new, old, beh, np.round(rng.normal(size=n_rows), 3), mask


def _tis_grad(
    fn: Callable[..., Any], tensors: tuple[Any, ...], eps: float, c: float, what: str
) -> tuple[float, NDArray[np.float64]]:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = assert_scalar_tensor(
            call(fn, *tensors, eps, c), what=what, advice="autograd needs it: don't call .item()"
        )
    if not loss.requires_grad:
        fail(f"{what} does not depend on logp_new through autograd; build the loss from logp_new with torch operations")
    (grad,) = torch.autograd.grad(loss, tensors[0], allow_unused=True)
    if grad is None:
        fail(f"no gradient reaches logp_new in {what}")
    return float(loss.detach()), grad.detach().double().numpy()


def _tis_candidates(batch: Batch, eps: float, c: float) -> dict[str, float]:
    """What known mistakes give as the loss of a batch without garbage at padding."""
    new, old, beh, adv, mask = batch
    a = adv[:, None] * np.ones_like(new)
    n_real = mask.sum()
    r, v, w = np.exp(new - old), np.exp(old - beh), np.exp(new - beh)

    def surrogate(ratio: NDArray[np.float64], low: float = 1.0 - eps, combine: Any = np.minimum) -> Any:
        return combine(ratio * a, np.clip(ratio, low, 1.0 + eps) * a)

    def loss(terms: NDArray[np.float64], denominator: float = n_real) -> float:
        return float(-np.sum(np.where(mask, terms, 0.0)) / denominator)

    right = np.minimum(v, c) * surrogate(r)
    per_row = np.where(mask, right, 0.0).sum(axis=1) / mask.sum(axis=1)
    return {
        "the behaviour weight pi_old / mu was not capped: multiply by min(v, c), in log space min(log v, log c)": loss(
            v * surrogate(r)
        ),
        "the cap is on pi_theta / mu; TIS caps the sampler's correction pi_old / mu = exp(logp_old - logp_behaviour)": (
            loss(np.minimum(w, c) * surrogate(r))
        ),
        "weights below 1 were raised: the cap is from above only, min(v, c), not clip(v, 1/c, c)": loss(
            np.clip(v, 1 / c, c) * surrogate(r)
        ),
        "the cap was applied to the weighted term v * PPO's term; cap the weight v = pi_old / mu alone": loss(
            np.minimum(v * surrogate(r), c)
        ),
        "PPO's ratio was taken against mu; it is r = pi_theta / pi_old = exp(logp_new - logp_old), the clip anchored "
        "at the trainer's pi_old": loss(np.minimum(v, c) * surrogate(w)),
        "that is torch.max of the two terms; PPO takes the minimum (the pessimistic bound)": loss(
            np.minimum(v, c) * surrogate(r, combine=np.maximum)
        ),
        "the ratio was clipped from above only; clip it to [1 - eps, 1 + eps]: for A < 0 the lower bound binds": loss(
            np.minimum(v, c) * surrogate(r, low=-np.inf)
        ),
        "divided by every position, padding included; average over the real tokens (divide by mask.sum())": loss(
            right, mask.size
        ),
        "summed over tokens and divided by the number of answers (PipelineRL's normalisation); this loss averages over "
        "the real tokens": loss(right, mask.shape[0]),
        "averaged each answer's tokens, then the answers; average over all real tokens at once": float(-per_row.mean()),
        "the loss has the wrong sign: minimise minus PPO's objective": -loss(right),
    }


def _tis_expect(loss: float, grad: NDArray[np.float64], batch: Batch, eps: float, c: float, what: str) -> None:
    """Compare a loss and its gradient with the oracle, naming a known mistake where one matches."""
    new, old, beh, adv, mask = batch
    expected, expected_grad = naive_tis_ppo_loss_and_grad(batch, eps, c)
    if not (math.isfinite(loss) and np.isfinite(grad).all()):
        fail(
            f"{what}: the loss or its gradient holds NaN or inf. Where mask is False the log-probabilities hold NaN "
            "and -inf, and multiplying by a 0 mask keeps them (0 * NaN is NaN), as does torch.where after the product "
            "(its gradient sends 0 * NaN back): select the real log-ratios with torch.where before exponentiating"
        )
    if all(np.all(np.isfinite(x[mask])) for x in (new, old, beh)):
        clean: Batch = (np.where(mask, new, 0.0), np.where(mask, old, 0.0), np.where(mask, beh, 0.0), adv, mask)
        fail_if_known_mistake(
            loss,
            _tis_candidates(clean, eps, c),
            expected=expected,
            what=what,
            rtol=1e-6,
            atol=1e-9,
        )
    assert_true(
        math.isclose(loss, expected, rel_tol=1e-4, abs_tol=1e-6),
        f"{what}: loss {fmt_number(loss)}, expected {fmt_number(expected)}",
    )
    # a weight built from logp_new and differentiated adds -(1/#real) v * surrogate where v < c
    with np.errstate(invalid="ignore"):
        log_v = np.where(mask, np.nan_to_num(old - beh, nan=0.0), 0.0)
        r = np.exp(np.clip(np.where(mask, np.nan_to_num(new - old, nan=0.0), 0.0), -CLAMP, CLAMP))
        a = adv[:, None] * np.ones_like(r)
        surr = np.minimum(r * a, np.clip(r, 1 - eps, 1 + eps) * a)
        extra = np.where(mask & (log_v < math.log(c)), -np.exp(np.minimum(log_v, CLAMP)) * surr / mask.sum(), 0.0)
        if np.any(np.abs(extra) > 1e-6) and np.allclose(grad, expected_grad + extra, rtol=1e-4, atol=1e-7):
            fail(
                f"the gradient of {what} carries the weight's own derivative: the weight was built from logp_new "
                "and differentiated. It is a constant, sg[min(pi_old / mu, c)]: compute it from logp_old and "
                "logp_behaviour"
            )
    if np.any(grad[~mask] != 0):
        fail(f"a gradient reaches logp_new where mask is False in {what}: only real tokens carry the loss")
    assert_allclose(grad, expected_grad, what=f"the gradient of {what} with respect to logp_new", rtol=1e-4, atol=1e-7)


def _tis_run(fn: Callable[..., Any], batch: Batch, eps: float, c: float, what: str, dtype: Any = None) -> None:
    loss, grad = _tis_grad(fn, _tis_tensors(batch, dtype=dtype), eps, c, what)
    _tis_expect(loss, grad, batch, eps, c, what)


@check_case("returns a scalar torch tensor")
def _tis_scalar(fn: Callable[..., Any]) -> None:
    _tis_grad(fn, _tis_tensors(_tis_random(0, 3, 4)), 0.2, 2.0, f"{TIS}(logp_new [3, 4], ...)")


@check_case("with pi_theta = pi_old = mu it is REINFORCE: -mean over real tokens of A, gradient -A / #real")
def _tis_on_policy(fn: Callable[..., Any]) -> None:
    logp = np.log([[0.5, 0.2, 0.9], [0.4, 0.6, 0.7]])
    mask = np.array([[True, True, True], [True, False, False]])
    what = f"{TIS}(all three log-probabilities equal, A = [1, -2], 4 real tokens)"
    _tis_run(fn, (logp, logp.copy(), logp.copy(), np.array([1.0, -2.0]), mask), 0.2, 2.0, what)


@check_case("at pi_theta = pi_old the weight pi_old / mu is a constant: the gradient is -min(v, c) A / #real")
def _tis_constant_weight(fn: Callable[..., Any]) -> None:
    old = np.log([[0.6, 0.2, 0.3], [0.4, 0.1, 0.5]])
    beh = np.log([[0.2, 0.4, 0.2], [0.1, 0.4, 0.5]])
    mask = np.array([[True, True, True], [True, True, False]])
    what = f"{TIS}(logp_new = logp_old, pi_old / mu = [[3, 0.5, 1.5], [4, 0.25, padding]], A [1, -2], c=2)"
    _tis_run(fn, (old.copy(), old, beh, np.array([1.0, -2.0]), mask), 0.2, 2.0, what)


@check_case("hand-computed value and gradient: r across both clip thresholds, v across c, A of both signs")
def _tis_known(fn: Callable[..., Any]) -> None:
    old = np.log([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])
    new = old + np.log([[1.5, 0.5, 1.1, 0.9], [1.5, 0.5, 1.1, 0.9]])
    beh = old - np.log([[3.0, 1.0, 0.5, 1.0], [1.0, 3.0, 1.0, 0.5]])
    mask = np.ones(old.shape, dtype=bool)
    what = f"{TIS}(r = [1.5, 0.5, 1.1, 0.9] per answer, v = [[3, 1, 0.5, 1], [1, 3, 1, 0.5]], A [1, -1], c=2)"
    _tis_run(fn, (new, old, beh, np.array([1.0, -1.0]), mask), 0.2, 2.0, what)


@check_case("eps and c are respected (eps 0.1-0.3; c 1.2, 2, 5, math.inf)")
def _tis_params(fn: Callable[..., Any]) -> None:
    batch = _tis_random(5, 4, 6)
    for eps, c in ((0.2, 1.2), (0.1, 2.0), (0.3, 5.0), (0.2, math.inf)):
        _tis_run(fn, batch, eps, c, f"{TIS}(a random padded batch [4, 6], eps={eps:g}, c={c:g})")


@check_case("value and gradient match a naive loop over the real tokens on random padded batches")
def _tis_oracle(fn: Callable[..., Any]) -> None:
    import torch

    for case, (seed, n_rows, n_t, eps, c, dtype) in enumerate(
        [
            (10, 1, 1, 0.2, 2.0, torch.float64),
            (11, 4, 8, 0.2, 2.0, torch.float32),
            (12, 16, 30, 0.1, 1.2, torch.float64),
            (13, 3, 64, 0.3, 5.0, torch.float32),
        ]
    ):
        what = (
            f"random case {case + 1} (N={n_rows}, T={n_t}, eps={eps:g}, c={c:g}, {str(dtype).removeprefix('torch.')})"
        )
        _tis_run(fn, _tis_random(seed, n_rows, n_t), eps, c, what, dtype=dtype)


@check_case("the mask, position by position: a prompt before the answer, a hole inside, NaN and -inf there")
def _tis_mask_holes(fn: Callable[..., Any]) -> None:
    mask = np.array([[False, False, True, True, False], [True, False, True, True, True]])
    old = np.log(np.full(mask.shape, 0.3))
    new = old + np.array([[0, 0, 0.5, -0.25, 0], [1.0, 0, -0.5, 0.1, 0.9]])
    beh = old - np.array([[0, 0, 1.0, -0.5, 0], [0.2, 0, 0.9, -1.0, 0.1]])
    beh[0, :2], beh[0, 4], beh[1, 1] = -np.inf, np.nan, np.nan
    old[0, 0], old[1, 1] = np.nan, -np.inf
    new[~mask] = -7.0
    what = f"{TIS}(a mask with a prompt, a hole and padding; NaN and -inf where it is False)"
    _tis_run(fn, (new, old, beh, np.array([0.5, -1.5]), mask), 0.2, 2.0, what)


@check_case("log-ratios of +-100, 30 and 800 and log-probabilities near -800: finite and clamped")
def _tis_stable(fn: Callable[..., Any]) -> None:
    import torch

    old = np.array([[-800.0, -801.0, -799.0, -5.0], [-800.5, -798.0, -802.0, -5.0]])
    new = old + np.array([[1.0, -0.5, 0.25, 100.0], [-1.0, 0.5, 0.1, -100.0]])
    beh = old - np.array([[0.5, -0.5, 1.0, 100.0], [-1.0, 0.25, 0.0, -100.0]])
    mask = np.ones(old.shape, dtype=bool)
    for dtype in (torch.float64, torch.float32):
        what = f"{TIS}(log-probabilities near -800, log-ratios of +-100, {str(dtype).removeprefix('torch.')})"
        batch = (new, old, beh, np.array([1.0, -1.0]), mask)  # A > 0 at +100 and A < 0 at -100: clipped, flat
        loss, grad = _tis_grad(fn, _tis_tensors(batch, dtype=dtype), 0.2, 2.0, what)
        if not (math.isfinite(loss) and np.isfinite(grad).all()):
            fail(
                f"{what}: the loss or its gradient is not finite. exp(100) overflows float32 (and exp(-800) is 0.0, "
                "so a ratio of probabilities is 0 / 0): form each ratio from a difference of log-probabilities "
                "and clamp it to [-20, 20] before torch.exp"
            )
        _tis_expect(loss, grad, batch, 0.2, 2.0, what)
    # A < 0 keeps the unclipped branch r A however large r is, so only the clamp bounds it there:
    # exp(30) is finite in float32 (an unclamped loss is 2e4 x too large), exp(800) is inf in float64
    for dtype, log_r in ((torch.float32, 30.0), (torch.float64, 800.0)):
        old = np.log(np.array([[0.3, 0.5, 0.2]]))
        new = old + np.array([[0.1, log_r, -0.1]])
        batch = (new, old, old.copy(), np.array([-1.0]), np.ones(old.shape, dtype=bool))
        what = f"{TIS}(a log-ratio of {log_r:g} with A < 0, {str(dtype).removeprefix('torch.')})"
        loss, grad = _tis_grad(fn, _tis_tensors(batch, dtype=dtype), 0.2, 2.0, what)
        expected, _ = naive_tis_ppo_loss_and_grad(batch, 0.2, 2.0)
        if not (math.isfinite(loss) and np.isfinite(grad).all()) or abs(loss) > 2 * abs(expected):
            fail(
                f"{what}: loss {fmt_number(loss)}, expected {fmt_number(expected)}; only the clamp bounds r A when "
                "A < 0: clamp the log-ratio to [-20, 20] before torch.exp, in any dtype (float64 overflows at 709)"
            )
        _tis_expect(loss, grad, batch, 0.2, 2.0, what)
    # c = inf (no cap): log v must still be clamped at 20, or a sampler that rated a token e^-100
    # below the trainer gives exp(100) = inf in float32
    old = np.log(np.array([[0.3, 0.5, 0.2]]))
    beh = old - np.array([[0.1, 100.0, -0.1]])
    batch = (old + 0.05, old, beh, np.array([1.0]), np.ones(old.shape, dtype=bool))
    what = f"{TIS}(log(pi_old / mu) = 100, c=inf, float32)"
    loss, grad = _tis_grad(fn, _tis_tensors(batch, dtype=torch.float32), 0.2, math.inf, what)
    if not (math.isfinite(loss) and np.isfinite(grad).all()):
        fail(
            f"{what}: the loss or its gradient is not finite. With c = math.inf the cap log c is inf, so clamp "
            "log v to [-20, 20] as well: min(log c, 20)"
        )
    _tis_expect(loss, grad, batch, 0.2, math.inf, what)


@check_case("no gradient reaches logp_old, logp_behaviour or the advantages")
def _tis_detached(fn: Callable[..., Any]) -> None:
    new, old, beh, adv, mask = _tis_random(30, 3, 5)
    old[~mask], beh[~mask] = -3.0, -3.0  # finite, so that a leak shows as a number
    tensors = _tis_tensors((new, old, beh, adv, mask), const_grad=True)
    what = f"{TIS}(logp_old, logp_behaviour and advantages requiring grad)"
    loss = assert_scalar_tensor(call(fn, *tensors, 0.2, 2.0), what=what, advice="autograd needs it: don't call .item()")
    loss.backward()
    for name, t in (("logp_old", tensors[1]), ("logp_behaviour", tensors[2]), ("advantages", tensors[3])):
        if t.grad is not None and bool((t.grad != 0).any()):
            fail(
                f"a gradient flowed into `{name}`: it is a constant of the loss (the weight is sg[min(v, c)]); "
                f"use {name}.detach()"
            )


@check_case("accepts a 0/1 mask and does not modify its inputs")
def _tis_inputs(fn: Callable[..., Any]) -> None:
    import torch

    new, old, beh, adv, mask = _tis_random(40, 3, 4)
    expected, _ = naive_tis_ppo_loss_and_grad((new, old, beh, adv, mask), 0.2, 2.0)
    new_t, old_t, beh_t, adv_t, _ = _tis_tensors((new, old, beh, adv, mask))
    what = f"{TIS}(a 0/1 float mask)"
    float_mask = torch.tensor(mask, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = assert_scalar_tensor(
            call(fn, new_t, old_t, beh_t, adv_t, float_mask, 0.2, 2.0), what=what, advice="don't call .item()"
        )
    loss = float(out.detach())
    assert_true(
        math.isclose(loss, expected, rel_tol=1e-6), f"{what} = {fmt_number(loss)}; expected {fmt_number(expected)}"
    )
    old[~mask], beh[~mask] = -3.0, -3.0
    new_t, old_t, beh_t, adv_t, mask_t = _tis_tensors((new, old, beh, adv, mask))
    assert_inputs_unchanged(
        fn,
        TIS,
        0.2,
        2.0,
        logp_new=new_t.detach().requires_grad_(),
        logp_old=old_t,
        logp_behaviour=beh_t,
        advantages=adv_t,
        mask=mask_t,
    )


TIS_PPO_LOSS = Exercise(
    name=TIS,
    points=10,
    title="PPO's clipped loss times sg[min(pi_old / mu, c)], mean over the real tokens (TIS)",
    advice="from masked, clamped log-ratios, torch.min of PPO's two terms, a detached capped weight and a mean over "
    "real tokens",
    checks=(
        _tis_scalar,
        _tis_on_policy,
        _tis_constant_weight,
        _tis_known,
        _tis_params,
        _tis_mask_holes,
        _tis_oracle,
        _tis_stable,
        _tis_detached,
        _tis_inputs,
    ),
    hints=(
        "Two ratios per real token: PPO's r = pi_theta / pi_old, which carries the gradient and is clipped, and the "
        "sampler's correction v = pi_old / mu, a capped constant that multiplies PPO's term. Average over the real "
        "tokens and negate.",
        "Build both log-ratios with torch.where(mask, ..., 0.0), so that NaN at padding never reaches the loss, and "
        "clamp them to [-20, 20]; the weight's log-ratio uses detached inputs only and is also capped at log c.",
        "PPO's term is the smaller of r A and clip(r, 1 - eps, 1 + eps) A, with one advantage per answer broadcast "
        "over its tokens (advantages[:, None]); keep the real tokens' terms and divide their sum by their number, "
        "not by N * T or N. Return the tensor, not `.item()`.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: effective_sample_size
# ---------------------------------------------------------------------------------------

ESS = "effective_sample_size"


def _ess(fn: Callable[..., Any], weights: Any, what: str) -> float:
    return _scalar(call_on_copies(fn, weights), what)


def _ess_expect(
    fn: Callable[..., Any], weights: Any, expected: float, what: str, bugs: dict[str, Any] | None = None
) -> None:
    got = _ess(fn, weights, what)
    _diagnose(got, bugs or {}, what, expected)


@check_case("returns one float")
def _ess_scalar(fn: Callable[..., Any]) -> None:
    _ess(fn, np.array([1.0, 2.0, 0.5]), f"{ESS}([1, 2, 0.5])")


@check_case("hand-computed value: weights 1, 2, 3 give 36 / 14")
def _ess_known(fn: Callable[..., Any]) -> None:
    _ess_expect(
        fn,
        np.array([1.0, 2.0, 3.0]),
        36 / 14,
        f"{ESS}([1, 2, 3])",
        {
            "that is sum w^2 / (sum w)^2, the inverse of the ESS": 14 / 36,
            "the sum of the weights must be squared: (sum w)^2 / sum w^2": 6 / 14,
            "that is ESS / N; return the ESS itself, (sum w)^2 / sum w^2": 36 / 14 / 3,
            "the denominator is the sum of the squared weights, not their mean": 36 / (14 / 3),
        },
    )


@check_case("equal weights give N")
def _ess_equal(fn: Callable[..., Any]) -> None:
    for n, value in ((1, 1.0), (5, 1.0), (17, 0.3), (1000, 2.5)):
        _ess_expect(fn, np.full(n, value), float(n), f"{ESS} of {n} equal weights {fmt_number(value)}")


@check_case("one non-zero weight gives 1")
def _ess_one(fn: Callable[..., Any]) -> None:
    _ess_expect(fn, np.array([0.0, 0.0, 4.0, 0.0]), 1.0, f"{ESS}([0, 0, 4, 0])")


@check_case("scaling every weight by the same factor changes nothing")
def _ess_scale(fn: Callable[..., Any]) -> None:
    w = np.random.default_rng(1).exponential(size=12)
    base = _ess(fn, w, f"{ESS}(w)")
    for factor in (1e-3, 7.0, 1e3):
        scaled = _ess(fn, factor * w, f"{ESS}({fmt_number(factor)} * w)")
        assert_true(
            math.isclose(scaled, base, rel_tol=1e-9),
            f"{ESS}({fmt_number(factor)} * w) = {fmt_number(scaled)} but {ESS}(w) = {fmt_number(base)}",
        )


@check_case("lies in [1, N] and matches explicit sums on random weights")
def _ess_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(2)
    for case, n in enumerate((2, 10, 100, 1000)):
        w = np.exp(rng.normal(scale=1.0 + case, size=n))
        got = _ess(fn, w, f"random case {case + 1} (N={n})")
        assert_true(
            1.0 - 1e-9 <= got <= n + 1e-9, f"random case {case + 1}: ESS {fmt_number(got)} is outside [1, N={n}]"
        )
        expected = naive_ess(w)
        assert_true(
            math.isclose(got, expected, rel_tol=1e-9),
            f"random case {case + 1} (N={n}): got {fmt_number(got)}, expected {fmt_number(expected)}",
        )


@check_case("all-zero weights give 0.0, not NaN")
def _ess_zero(fn: Callable[..., Any]) -> None:
    with quiet_floats():
        got = _ess(fn, np.zeros(4), f"{ESS}([0, 0, 0, 0])")
    assert_true(
        got == 0.0,
        f"{ESS}([0, 0, 0, 0]) = {fmt_number(got)}; expected 0.0 (check for a zero sum of squares before dividing)",
    )


@check_case("accepts lists and does not modify its input")
def _ess_inputs(fn: Callable[..., Any]) -> None:
    _ess_expect(fn, [1, 1, 2], 16 / 6, f"{ESS}([1, 1, 2]) (a list of ints)")
    assert_inputs_unchanged(fn, ESS, weights=np.array([0.5, 2.0, 1.0]))


EFFECTIVE_SAMPLE_SIZE = Exercise(
    name=ESS,
    points=10,
    title="the effective sample size (sum w)^2 / sum w^2 (eq. 02.6)",
    advice="from two sums over the weights (eq. 02.6)",
    checks=(_ess_scalar, _ess_known, _ess_equal, _ess_one, _ess_scale, _ess_oracle, _ess_zero, _ess_inputs),
    hints=(
        "The ESS compares the square of the total weight with the sum of the squared weights: it is N for N equal "
        "weights and 1 when a single weight carries everything.",
        "Two sums over the weights as a float64 array, then one division; check your formula by hand on `[1, 1]` (ESS "
        "2) and `[0, 1]` (ESS 1).",
        "Guard the division: when the sum of squares is 0 (every weight 0), return `0.0` before dividing, and wrap "
        "the result in `float(...)`. Trap: the square of the sum and the sum of the squares swapped, which gives 1 / "
        "ESS.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: expected_ess_fraction
# ---------------------------------------------------------------------------------------

EEF = "expected_ess_fraction"


def _eef(fn: Callable[..., Any], lt: Any, lb: Any, what: str) -> float:
    return _scalar(call_on_copies(fn, lt, lb), what)


def _bandit_family(delta: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Lesson 02's controlled family: ``log pi = log softmax(3p)``, ``log mu_delta = log softmax(3p - delta s)``."""
    p = np.array([0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
    z_pi = 3.0 * p
    z_mu = z_pi - delta * (p - p.mean()) / p.std()
    return z_pi - np.log(np.sum(np.exp(z_pi))), z_mu - np.log(np.sum(np.exp(z_mu)))


def _kl(lt: Any, lb: Any) -> float:
    """``KL(pi || mu) = sum_k pi_k (log pi_k - log mu_k)``, one action at a time."""
    a, b = _floats(lt), _floats(lb)
    return sum(math.exp(a[k]) * (a[k] - b[k]) for k in range(len(a)))


def _eef_bugs(pi: Sequence[float], mu: Sequence[float]) -> dict[str, float]:
    """What known mistakes return for the distributions ``pi``, ``mu`` (probabilities)."""
    second = sum(p * p / m for p, m in zip(pi, mu, strict=True))
    return {
        "that is E_mu[w^2] = 1 + chi2 itself; the fraction is its inverse, 1 / E_mu[w^2]": second,
        "the weights are inverted; w = pi / mu, so mu_k w_k^2 = pi_k^2 / mu_k": 1.0
        / sum(m * m / p for p, m in zip(pi, mu, strict=True)),
        "that is the bound exp(-KL(pi || mu)) of eq. 02.7, not the exact fraction 1 / E_mu[w^2]": math.exp(
            -sum(p * math.log(p / m) for p, m in zip(pi, mu, strict=True))
        ),
        "w^2 was averaged over pi; the samples come from mu: E_mu[w^2] = sum_k mu_k w_k^2": 1.0
        / sum(p**3 / m**2 for p, m in zip(pi, mu, strict=True)),
        "divided by chi2; the fraction is 1 / (1 + chi2) = 1 / E_mu[w^2]": 1.0 / (second - 1.0),
        "averaged the terms over the K actions; E_mu[w^2] is their sum, sum_k pi_k^2 / mu_k": len(pi) / second,
    }


@check_case("returns one float")
def _eef_scalar(fn: Callable[..., Any]) -> None:
    lt, lb = _bandit_family(1.0)
    _eef(fn, lt, lb, f"{EEF}(log pi, log mu) of lesson 02's bandit at delta = 1")


@check_case("hand-computed values: pi = (0.5, 0.5), mu = (0.8, 0.2) give 0.64")
def _eef_known(fn: Callable[..., Any]) -> None:
    for pi, mu, expected in (([0.5, 0.5], [0.8, 0.2], 0.64), ([0.9, 0.1], [0.5, 0.5], 1 / 1.64)):
        what = f"{EEF}(log {pi}, log {mu})".replace("[", "(").replace("]", ")")
        got = _eef(fn, np.log(pi), np.log(mu), what)
        _diagnose(got, _eef_bugs(pi, mu), what, expected)


@check_case("pi = mu gives 1 (on-policy: every weight is 1)")
def _eef_on_policy(fn: Callable[..., Any]) -> None:
    log_p = np.log(np.random.default_rng(3).dirichlet(np.ones(6)))
    got = _eef(fn, log_p, log_p, f"{EEF}(log p, log p)")
    assert_true(math.isclose(got, 1.0, rel_tol=1e-9), f"{EEF}(log p, log p) = {fmt_number(got)}; expected 1.0")


@check_case("matches 1 / (1 + chi2), chi2 summed naively, on random distributions")
def _eef_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(4)
    for case, (k, concentration) in enumerate([(2, 1.0), (5, 0.5), (20, 2.0), (100, 1.0)]):
        pi, mu = rng.dirichlet(np.full(k, concentration)), rng.dirichlet(np.full(k, concentration))
        mu = 0.9 * mu + 0.1 / k  # keep mu away from 0 so that chi2 is moderate
        got = _eef(fn, np.log(pi), np.log(mu), f"random case {case + 1} (K={k})")
        expected = naive_expected_ess_fraction(np.log(pi), np.log(mu))
        assert_true(
            math.isclose(got, expected, rel_tol=1e-7),
            f"random case {case + 1} (K={k}): got {fmt_number(got)}, expected 1 / (1 + chi2) = {fmt_number(expected)}",
        )


@check_case("falls as mu_delta moves away from pi, and never exceeds exp(-KL) (eq. 02.7)")
def _eef_falls_with_kl(fn: Callable[..., Any]) -> None:
    previous = math.inf
    for delta in (0.0, 0.5, 1.0, 1.5, 2.0, 3.0):
        lt, lb = _bandit_family(delta)
        what = f"{EEF} of lesson 02's bandit at delta = {delta:g}"
        got = _eef(fn, lt, lb, what)
        bound = math.exp(-_kl(lt, lb))
        assert_true(
            got <= bound * (1 + 1e-9),
            f"{what} = {fmt_number(got)} exceeds the bound exp(-KL) = {fmt_number(bound)}",
        )
        assert_true(
            got < previous,
            f"{what} = {fmt_number(got)}: it must fall as the divergence grows (previous delta gave "
            f"{fmt_number(previous)})",
        )
        previous = got


@check_case("is the large-batch limit of the measured ESS/N (200,000 samples of mu)")
def _eef_measured(fn: Callable[..., Any]) -> None:
    lt, lb = _bandit_family(1.0)
    arms = np.random.default_rng(5).choice(len(lt), size=200_000, p=np.exp(lb) / np.exp(lb).sum())
    w = np.exp(lt[arms] - lb[arms])
    measured = float(w.sum() ** 2 / np.sum(w * w) / len(w))
    got = _eef(fn, lt, lb, f"{EEF} of lesson 02's bandit at delta = 1")
    assert_true(
        math.isclose(got, measured, rel_tol=0.02),
        f"{EEF} of lesson 02's bandit at delta = 1 is {fmt_number(got)}, but 200,000 samples of mu have "
        f"ESS/N = {fmt_number(measured)}",
    )


@check_case("log-probabilities near -800 (probabilities underflow to 0.0)")
def _eef_stable(fn: Callable[..., Any]) -> None:
    # a rare action: pi = e^-400, mu = e^-800, so mu w^2 = pi^2 / mu = e^0 = 1 and E_mu[w^2] = 0.5 + 0.5 + 1
    lt = [math.log(0.5), math.log(0.5), -400.0]
    lb = [math.log(0.5), math.log(0.5), -800.0]
    what = f"{EEF}([log 0.5, log 0.5, -400], [log 0.5, log 0.5, -800])"
    with quiet_floats():
        got = _eef(fn, np.array(lt), np.array(lb), what)
    if not math.isfinite(got):
        fail(
            f"{what} returned {fmt_number(got)}: exp(-800) is 0.0 in floating point, so pi^2 / mu becomes 0 / 0; "
            "compute exp(2 log pi - log mu)"
        )
    assert_true(math.isclose(got, 0.5, rel_tol=1e-9), f"{what} = {fmt_number(got)}; expected 1 / (1 + 1) = 0.5")


@check_case("accepts lists and does not modify its inputs")
def _eef_inputs(fn: Callable[..., Any]) -> None:
    lt, lb = [math.log(0.25), math.log(0.75)], [math.log(0.5), math.log(0.5)]
    got = _eef(fn, lt, lb, f"{EEF}([log 0.25, log 0.75], [log 0.5, log 0.5]) (lists)")
    expected = 1 / (0.25**2 / 0.5 + 0.75**2 / 0.5)
    assert_true(
        math.isclose(got, expected, rel_tol=1e-9),
        f"{EEF} on lists = {fmt_number(got)}; expected {fmt_number(expected)}",
    )
    lt_arr, lb_arr = _bandit_family(2.0)
    assert_inputs_unchanged(fn, EEF, logp_target=lt_arr, logp_behaviour=lb_arr)


EXPECTED_ESS_FRACTION = Exercise(
    name=EEF,
    points=10,
    title="the large-batch ESS fraction 1 / E_mu[w^2] = 1 / (1 + chi2) from the two distributions (eq. 02.6-02.7)",
    advice="from one sum of exp(2 log pi - log mu) over the actions (eq. 02.6-02.7)",
    checks=(
        _eef_scalar,
        _eef_known,
        _eef_on_policy,
        _eef_oracle,
        _eef_falls_with_kl,
        _eef_measured,
        _eef_stable,
        _eef_inputs,
    ),
    hints=(
        "Two steps: the second moment of the weight under the behaviour policy mu (the sampler), then its inverse.",
        "E_mu[w^2] = sum over the actions k of mu_k (pi_k / mu_k)^2 = sum_k pi_k^2 / mu_k: a sum over the actions, "
        "not a mean, and weighted by mu, not by pi.",
        "Form each term in log space, one `np.exp` per action of twice the target's log-probability minus the "
        "behaviour's (a probability of `exp(-800)` is 0.0, its log is not), then `np.sum` and invert; return a Python "
        "float. Not `exp(-KL)`: that is only the bound.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: token_and_sequence_ratios
# ---------------------------------------------------------------------------------------

TSR = "token_and_sequence_ratios"


def _tsr(fn: Callable[..., Any], new: Any, old: Any, mask: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    got = call_on_copies(fn, new, old, mask)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        fail(f"{what} is {describe_type(got)}; expected a tuple (token_ratios [N, T], sequence_ratios [N])")
    n_rows, n_t = np.shape(new)
    tokens = assert_array(got[0], what=f"the token ratios of {what}", shape=(n_rows, n_t))
    seqs = assert_array(got[1], what=f"the sequence ratios of {what}", shape=(n_rows,))
    return tokens, seqs


def _padded_batch(
    seed: int, n_rows: int, n_t: int
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """Random token log-probabilities, each row padded after a random length, garbage at padding."""
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 1.0, size=(n_rows, n_t)))
    new = old + rng.normal(scale=0.3, size=(n_rows, n_t))
    lengths = rng.integers(1, n_t + 1, size=n_rows)
    mask = np.arange(n_t)[None, :] < lengths[:, None]
    new[~mask], old[~mask] = 30.0, -30.0  # padding: exp(60) per padded token if it leaked
    return new, old, mask


@check_case("returns (token ratios [N, T], sequence ratios [N]) as float arrays")
def _tsr_shapes(fn: Callable[..., Any]) -> None:
    new, old, mask = _padded_batch(0, 3, 5)
    what = f"{TSR}(logp_new [3, 5], logp_old [3, 5], mask [3, 5])"
    tokens, seqs = _tsr(fn, new, old, mask, what)
    assert_float_dtype(tokens, what=f"the token ratios of {what}")
    assert_float_dtype(seqs, what=f"the sequence ratios of {what}")


@check_case("hand-computed values, no padding")
def _tsr_known(fn: Callable[..., Any]) -> None:
    new = np.log([[0.5, 0.5], [0.2, 0.4]])
    old = np.log([[0.25, 0.5], [0.4, 0.4]])
    mask = np.ones((2, 2), dtype=bool)
    what = f"{TSR}(log [[0.5, 0.5], [0.2, 0.4]], log [[0.25, 0.5], [0.4, 0.4]], all real)"
    tokens, seqs = _tsr(fn, new, old, mask, what)
    _diagnose(
        tokens,
        {"the token ratios are inverted: w = pi / mu = exp(logp_new - logp_old)": [[0.5, 1.0], [2.0, 1.0]]},
        f"the token ratios of {what}",
        [[2.0, 1.0], [0.5, 1.0]],
    )
    _diagnose(
        seqs,
        {
            "that is the geometric mean of the token ratios; the sequence ratio is their product": [
                math.sqrt(2),
                math.sqrt(0.5),
            ],
            "that is the arithmetic mean of the token ratios; the sequence ratio is their product": [1.5, 0.75],
            "that is the sum of the token ratios; the sequence ratio is their product": [3.0, 1.5],
        },
        f"the sequence ratios of {what}",
        [2.0, 0.5],
    )


@check_case("padding changes nothing: token ratio 1 there, and left out of the product")
def _tsr_padding(fn: Callable[..., Any]) -> None:
    new = np.log([[0.5, 0.3, 0.9, 1.0], [0.2, 1.0, 1.0, 1.0]])
    old = np.log([[0.25, 0.3, 0.45, 1.0], [0.1, 1.0, 1.0, 1.0]])
    mask = np.array([[True, True, True, False], [True, False, False, False]])
    new[~mask], old[~mask] = 30.0, -30.0
    what = f"{TSR}(a batch with padding)"
    tokens, seqs = _tsr(fn, new, old, mask, what)
    if np.any(tokens[~mask] > 1e10):
        fail(
            f"the token ratios of {what} include the padding (got {fmt_number(tokens[~mask].max())} at a padded "
            "position); set the log-ratio to 0 where mask is False"
        )
    if np.allclose(tokens[~mask], 0.0):
        fail(f"the token ratios of {what} are 0 at padding; expected 1.0 (exp(0): padding has no weight to correct)")
    assert_allclose(tokens, [[2.0, 1.0, 2.0, 1.0], [2.0, 1.0, 1.0, 1.0]], what=f"the token ratios of {what}")
    if np.any(seqs > 1e10):
        fail(
            f"the sequence ratios of {what} include the padding (got {fmt_number(seqs.max())}); "
            "multiply only the real tokens' ratios"
        )
    assert_allclose(seqs, [4.0, 2.0], what=f"the sequence ratios of {what}")


@check_case("the mask, position by position: a prompt before the answer, a hole inside, -inf and NaN where it is False")
def _tsr_mask_holes(fn: Callable[..., Any]) -> None:
    # mask False: row 0's prompt (2 tokens) and padding; a tool output inside row 1; row 2's first token
    mask = np.array(
        [
            [False, False, True, True, True, False],
            [True, True, False, True, False, False],
            [False, True, True, True, True, True],
        ]
    )
    log_ratio = np.array(
        [[0.0, 0.0, 0.5, -0.25, 0.75, 0.0], [0.25, -0.5, 0.0, 1.0, 0.0, 0.0], [0.0, 0.5, 0.5, -1, 0.25, 0.1]]
    )
    old = np.log(np.full(mask.shape, 0.3))
    new = old + log_ratio
    # where mask is False a batch holds anything: -inf (the log of a padded probability), NaN
    new[0, :2], old[0, :2] = -np.inf, -np.inf
    new[0, 5], old[0, 5] = np.nan, 0.0
    new[1, 2], old[1, 2] = np.inf, -2.0
    new[1, 4:], old[1, 4:] = 0.0, np.nan
    new[2, 0], old[2, 0] = -np.inf, -1.0
    expected_tokens = np.where(mask, np.exp(log_ratio), 1.0)
    expected_seqs = np.exp(np.where(mask, log_ratio, 0.0).sum(axis=1))
    what = f"{TSR}(a mask with a prompt, a hole and padding)"
    with quiet_floats():
        tokens, seqs = _tsr(fn, new, old, mask, what)
    tokens_f = np.asarray(tokens, dtype=np.float64)
    skipped = mask & np.isclose(tokens_f, 1.0) & ~np.isclose(expected_tokens, 1.0)
    if skipped.any():
        i, t = (int(k) for k in np.argwhere(skipped)[0])
        fail(
            f"the token ratio at [{i}, {t}] of {what} is 1.0, but mask is True there (after a prompt or a hole): "
            f"expected {fmt_number(expected_tokens[i, t])}. Read the mask position by position: a mask rebuilt "
            "from each row's length assumes the real tokens come first"
        )
    if not (np.isfinite(tokens_f).all() and np.isfinite(np.asarray(seqs, dtype=np.float64)).all()):
        fail(
            f"{what} contains NaN or inf: where mask is False the batch holds -inf and NaN, and multiplying by a 0 "
            "mask keeps them (0 * inf is NaN): select the real tokens (np.where on the mask) instead of multiplying"
        )
    assert_allclose(tokens, expected_tokens, what=f"the token ratios of {what}")
    assert_allclose(seqs, expected_seqs, what=f"the sequence ratios of {what}", rtol=1e-9)


@check_case("each sequence ratio is the product of its real token ratios")
def _tsr_product(fn: Callable[..., Any]) -> None:
    new, old, mask = _padded_batch(1, 6, 9)
    tokens, seqs = _tsr(fn, new, old, mask, f"{TSR}(a random padded batch [6, 9])")
    products = np.array([np.prod(tokens[i][mask[i]]) for i in range(6)])
    assert_allclose(
        seqs,
        products,
        what="the sequence ratios (compared with the product of each row's real token ratios)",
        rtol=1e-9,
    )


@check_case("matches a naive double loop on random padded batches")
def _tsr_oracle(fn: Callable[..., Any]) -> None:
    for case, (seed, n_rows, n_t) in enumerate([(10, 1, 1), (11, 4, 8), (12, 16, 30), (13, 3, 64)]):
        new, old, mask = _padded_batch(seed, n_rows, n_t)
        what = f"random case {case + 1} (N={n_rows}, T={n_t})"
        tokens, seqs = _tsr(fn, new, old, mask, what)
        exp_tokens, exp_seqs = naive_token_and_sequence_ratios(new, old, mask)
        assert_allclose(tokens, exp_tokens, what=f"the token ratios of {what}")
        assert_allclose(seqs, exp_seqs, what=f"the sequence ratios of {what}", rtol=1e-9)


@check_case("log-probabilities near -800 (probabilities underflow to 0.0)")
def _tsr_long(fn: Callable[..., Any]) -> None:
    n_t = 400
    old = np.full((2, n_t), -800.0)
    new = old + np.array([[-0.01], [0.005]])
    mask = np.ones((2, n_t), dtype=bool)
    what = f"{TSR}(2 sequences of {n_t} tokens with log-probabilities near -800)"
    with quiet_floats():
        tokens, seqs = _tsr(fn, new, old, mask, what)
    if not (np.all(np.isfinite(tokens)) and np.all(np.isfinite(seqs))):
        fail(
            f"{what} contains NaN or inf: exp(-800) is 0.0 in floating point, so a ratio of probabilities is 0 / 0; "
            "subtract the log-probabilities first"
        )
    assert_allclose(
        seqs, [math.exp(-0.01 * n_t), math.exp(0.005 * n_t)], what=f"the sequence ratios of {what}", rtol=1e-9
    )


@check_case("a long answer whose ratio climbs past e^12000 and comes back: exponentiate after summing")
def _tsr_climb(fn: Callable[..., Any]) -> None:
    # 2,000 tokens with log-ratio +6, then 2,000 with -6: the sequence's log-ratio is 0 (ratio 1), but a
    # running product of the token ratios passes e^12000, where float64 (e^709) and even x86's long
    # double (e^11356) overflow to inf
    n_t = 4000
    old = np.full((2, n_t), -2.0)
    new = old + np.where(np.arange(n_t) < n_t // 2, 6.0, -6.0)[None, :] * np.array([[1.0], [0.5]])
    mask = np.ones((2, n_t), dtype=bool)
    what = f"{TSR}(2 answers of {n_t} tokens, log-ratios +6 (+3) then -6 (-3))"
    with quiet_floats():
        _, seqs = _tsr(fn, new, old, mask, what)
    seqs_f = np.asarray(seqs, dtype=np.float64)
    if not np.all(np.isfinite(seqs_f)) or not np.allclose(seqs_f, 1.0, rtol=1e-9):
        fail(
            f"the sequence ratios of {what} are {[fmt_number(v) for v in seqs_f]}; expected [1, 1]: a product of "
            "the token ratios overflows (e^12000 is inf, even in long double) before the later tokens bring it back; "
            "exponentiate the sum "
            "of the log-ratios"
        )


@check_case("accepts lists and a 0/1 mask, and does not modify its inputs")
def _tsr_inputs(fn: Callable[..., Any]) -> None:
    new = [[math.log(0.5), math.log(0.8)], [math.log(0.3), 0.0]]
    old = [[math.log(0.25), math.log(0.4)], [math.log(0.6), 0.0]]
    _, seqs = _tsr(fn, new, old, [[1, 1], [1, 0]], f"{TSR} on lists with a 0/1 integer mask")
    assert_allclose(seqs, [4.0, 0.5], what=f"the sequence ratios of {TSR} on lists with a 0/1 integer mask")
    n_new, n_old, n_mask = _padded_batch(20, 3, 4)
    assert_inputs_unchanged(fn, TSR, logp_new=n_new, logp_old=n_old, mask=n_mask)


TOKEN_AND_SEQUENCE_RATIOS = Exercise(
    name=TSR,
    points=10,
    title="per-token ratios and their product over each sequence, with padding (eq. 02.3)",
    advice="from the masked log-ratios, a sum per row and np.exp (eq. 02.3)",
    checks=(
        _tsr_shapes,
        _tsr_known,
        _tsr_padding,
        _tsr_mask_holes,
        _tsr_product,
        _tsr_oracle,
        _tsr_long,
        _tsr_climb,
        _tsr_inputs,
    ),
    hints=(
        "A token's ratio is the exponential of its log-ratio; a sequence's ratio is the product of its tokens' "
        "ratios, that is the exponential of the sum of their log-ratios. Padding must count as a ratio of 1.",
        "Compute the `[N, T]` log-ratios once and set them to 0 at the padding (`np.where` with the mask as a boolean "
        "array): exp(0) = 1, and 0 adds nothing to a sum.",
        "The sequence's log-ratio is a sum along axis 1, one number per row; exponentiate after summing, not before "
        "(a product of many small ratios underflows). Return a tuple: the per-token ratios `[N, T]`, then the "
        "per-sequence ones `[N]`.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (
    TIS_PPO_LOSS,
    EFFECTIVE_SAMPLE_SIZE,
    EXPECTED_ESS_FRACTION,
    TOKEN_AND_SEQUENCE_RATIOS,
)
