"""Lesson 02's graded exercises: the IS estimate, the effective sample size, the ESS
fraction expected from the divergence, per-token and per-sequence ratios, and PPO's
clipped surrogate loss.

The learner writes:

* ``is_estimate(values [N], logp_target [N], logp_behaviour [N]) -> float``  (eq. 02.2)
* ``effective_sample_size(weights [N]) -> float``  (02.6)
* ``expected_ess_fraction(logp_target [K], logp_behaviour [K]) -> float``  (02.6-02.7)
* ``token_and_sequence_ratios(logp_new [N, T], logp_old [N, T], mask [N, T]) -> ([N, T], [N])``  (02.3)
* ``clipped_surrogate_loss(logp_new [N], logp_old [N], advantages [N], eps=0.2) -> scalar tensor``  (02.5)

The checks never call ``course_lib.rl.importance``: they compare with the naive oracles
below (explicit loops over samples and tokens with ``math.exp``, mirroring the
equations), with hand-computed values, and with properties. Inputs cross the
clip thresholds on both sides. Where a wrong answer matches a known mistake (inverted
ratio, self-normalised mean, the KL bound instead of the exact fraction, ...), the message
names the mistake. torch is imported inside the checks that need it.

What each exercise teaches, and how the checks observe it (not only its values):

* is_estimate, mechanism: every sample weighted by its full ratio exp(log pi - log mu), formed in
  log space, and averaged over N; observed by the average over every single sample x ~ mu
  (unbiased), including a sample mu draws with probability e^-30 (a weight of e^29: a cap or a
  clamp on the weight or its log, truncated IS (02.4), is named), and log-probabilities near -1000.
* effective_sample_size, mechanism: (sum w)^2 / sum w^2 with a guard for all-zero weights;
  observed by equal weights over N from 1 to 1000, one non-zero weight, scale invariance,
  [1, N], random weights of growing spread.
* expected_ess_fraction, mechanism: 1 / sum_k exp(2 log pi_k - log mu_k), an expectation under
  the sampler mu summed over the actions, in log space; observed against chi^2 summed another way,
  along lesson 02's family (falling, below exp(-KL)), against 200,000 samples of mu, at -800.
* token_and_sequence_ratios, mechanism: per-token log-ratios selected by the mask (0 where it is
  False), summed per row and exponentiated at the end; observed by masks with holes (a prompt
  before the answer, padding after: a mask rebuilt from its lengths is wrong there), -inf and
  NaN at masked positions (a mask multiplied in gives 0 * inf = NaN), -800 log-probabilities.
* clipped_surrogate_loss, mechanism: r = exp(logp_new - sg[logp_old]), min(r A, clip(r) A) per
  sample, averaged and negated; observed by its value and gradient on both sides of both
  thresholds with A of both signs, eps from 0.1 to 0.3, gradients into logp_old and advantages,
  and log-probabilities near -800 (a ratio of probabilities is 0 / 0 there).
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


def naive_is_estimate(values: Any, logp_target: Any, logp_behaviour: Any) -> float:
    """``(1/N) sum_i exp(log pi_i - log mu_i) f_i``, one sample at a time."""
    f, lt, lb = _floats(values), _floats(logp_target), _floats(logp_behaviour)
    return sum(math.exp(lt[i] - lb[i]) * f[i] for i in range(len(f))) / len(f)


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
# Exercise 1: is_estimate
# ---------------------------------------------------------------------------------------

ISE = "is_estimate"


def _ise_random(
    seed: int, n: int, spread: float = 1.0
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    rng = np.random.default_rng(seed)
    lb = np.log(rng.uniform(0.05, 1.0, size=n))
    return np.round(rng.normal(size=n), 3), lb + rng.normal(scale=spread, size=n), lb


@check_case("returns one float")
def _ise_scalar(fn: Callable[..., Any]) -> None:
    values, lt, lb = _ise_random(0, 5)
    _scalar(call_on_copies(fn, values, lt, lb), f"{ISE}(5 samples)")


@check_case("with pi = mu it is the plain mean of the values")
def _ise_on_policy(fn: Callable[..., Any]) -> None:
    values, _, lb = _ise_random(1, 6)
    got = _scalar(call_on_copies(fn, values, lb, lb), f"{ISE}(values, logp, logp)")
    assert_true(
        math.isclose(got, float(np.mean(values)), rel_tol=1e-9, abs_tol=1e-12),
        f"{ISE}(values, logp, logp) = {fmt_number(got)}; expected the mean of the values, "
        f"{fmt_number(np.mean(values))} (every weight is exp(0) = 1)",
    )


@check_case("hand-computed values: weights 2, 0.5, 1 give 4/3")
def _ise_known(fn: Callable[..., Any]) -> None:
    values = [1.0, 0.0, 2.0]
    pi, mu = [0.5, 0.25, 0.25], [0.25, 0.5, 0.25]
    got = _scalar(
        call_on_copies(fn, values, np.log(pi), np.log(mu)),
        f"{ISE}([1, 0, 2], log [0.5, 0.25, 0.25], log [0.25, 0.5, 0.25])",
    )
    what = f"{ISE}(values [1, 0, 2], pi [0.5, 0.25, 0.25], mu [0.25, 0.5, 0.25])"
    _diagnose(
        got,
        {
            "the weights are inverted; w = pi / mu = exp(logp_target - logp_behaviour)": (0.5 * 1 + 2 * 0 + 1 * 2) / 3,
            "divided by the sum of the weights (the self-normalised estimate); divide by N": 4 / 3.5,
            "summed over the samples; average them (divide by N)": 4.0,
            "the values are missing: average w_i * values[i], not w_i": 3.5 / 3,
        },
        what,
        4 / 3,
    )


@check_case("averaged over every single sample x ~ mu it gives E_pi[f] exactly (unbiased), rare samples included")
def _ise_unbiased(fn: Callable[..., Any]) -> None:
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    mu = np.array([0.4, 0.3, 0.2, 0.1])
    f = np.array([3.0, -1.0, 0.5, 2.0])
    mean = sum(
        mu[x] * _scalar(call_on_copies(fn, [f[x]], [math.log(pi[x])], [math.log(mu[x])]), f"{ISE} of one sample")
        for x in range(4)
    )
    exact = float(pi @ f)
    assert_true(
        math.isclose(mean, exact, rel_tol=1e-9, abs_tol=1e-12),
        f"the average over x ~ mu of {ISE}([f(x)], [log pi(x)], [log mu(x)]) is {fmt_number(mean)}; "
        f"expected E_pi[f] = {fmt_number(exact)}: the estimate is biased",
    )
    # mu draws arm 3 with probability e^-30, pi with 0.4: its weight is e^29.1 = 4.3e12, and it
    # carries a third of E_pi[f]; capping or clamping the weight (or its log) drops that share
    log_mu = [math.log(0.5), math.log(0.3), math.log(0.2 - math.exp(-30.0)), -30.0]
    log_pi = [math.log(0.1), math.log(0.2), math.log(0.3), math.log(0.4)]
    singles = [_scalar(call_on_copies(fn, [f[x]], [log_pi[x]], [log_mu[x]]), f"{ISE} of one sample") for x in range(4)]
    mean = sum(math.exp(log_mu[x]) * singles[x] for x in range(4))
    if math.isclose(mean, exact, rel_tol=1e-9, abs_tol=1e-12):
        return
    rare = math.exp(log_pi[3] - log_mu[3]) * f[3]
    if math.isfinite(singles[3]) and singles[3] < rare * (1 - 1e-6):
        fail(
            f"a sample mu draws with probability e^-30 and pi with 0.4 has weight e^29.1 = {fmt_number(rare / f[3])}, "
            f"but {ISE}([2.0], [log 0.4], [-30]) = {fmt_number(singles[3])}: capping or clamping the weight (or "
            "its log) is truncated IS (02.4), which is biased; the IS estimate (02.2) keeps the full weight"
        )
    fail(
        f"the average over x ~ mu of {ISE}([f(x)], [log pi(x)], [log mu(x)]) with a rare x (mu = e^-30) is "
        f"{fmt_number(mean)}; expected E_pi[f] = {fmt_number(exact)}: the estimate is biased"
    )


@check_case("matches a naive loop over the samples on random inputs")
def _ise_oracle(fn: Callable[..., Any]) -> None:
    for case, (seed, n, spread) in enumerate([(10, 1, 0.5), (11, 7, 1.0), (12, 50, 2.0), (13, 300, 0.3)]):
        values, lt, lb = _ise_random(seed, n, spread)
        got = _scalar(call_on_copies(fn, values, lt, lb), f"random case {case + 1} (N={n})")
        expected = naive_is_estimate(values, lt, lb)
        assert_true(
            math.isclose(got, expected, rel_tol=1e-7, abs_tol=1e-12),
            f"random case {case + 1} (N={n}): got {fmt_number(got)}, expected {fmt_number(expected)}",
        )


@check_case("log-probabilities near -1000 (probabilities underflow to 0.0)")
def _ise_stable(fn: Callable[..., Any]) -> None:
    values = np.array([1.0, 1.0, 3.0])
    lt = np.array([-1000.0, -1001.0, -999.5])
    lb = np.array([-1001.0, -1000.0, -999.5])
    expected = (math.e + 1 / math.e + 3.0) / 3
    with quiet_floats():
        got = _scalar(
            call_on_copies(fn, values, lt, lb), f"{ISE}([1, 1, 3], [-1000, -1001, -999.5], [-1001, -1000, -999.5])"
        )
    if not math.isfinite(got):
        fail(
            f"{ISE} with log-probabilities near -1000 returned {fmt_number(got)}: exp(-1000) is 0.0 in floating "
            "point, so pi / mu becomes 0 / 0; compute exp(logp_target - logp_behaviour)"
        )
    assert_true(
        math.isclose(got, expected, rel_tol=1e-9),
        f"{ISE} with log-probabilities near -1000 = {fmt_number(got)}; expected (e + 1/e + 3) / 3 = "
        f"{fmt_number(expected)}",
    )


@check_case("accepts lists and does not modify its inputs")
def _ise_inputs(fn: Callable[..., Any]) -> None:
    got = _scalar(
        call(fn, [2.0, 4.0], [math.log(0.5), math.log(0.5)], [math.log(0.25), math.log(0.75)]),
        f"{ISE}([2, 4], [log 0.5, log 0.5], [log 0.25, log 0.75])",
    )
    expected = (2 * 2.0 + 4 * (2 / 3)) / 2
    assert_true(
        math.isclose(got, expected, rel_tol=1e-9),
        f"{ISE} on lists = {fmt_number(got)}; expected {fmt_number(expected)}",
    )
    values, lt, lb = _ise_random(20, 6)
    assert_inputs_unchanged(fn, ISE, values=values, logp_target=lt, logp_behaviour=lb)


IS_ESTIMATE = Exercise(
    name=ISE,
    points=10,
    title="the importance-sampling estimate of E_pi[f] from samples of mu (eq. 02.2)",
    advice="from the log-ratios, np.exp and a mean (eq. 02.2)",
    checks=(_ise_scalar, _ise_known, _ise_on_policy, _ise_unbiased, _ise_oracle, _ise_stable, _ise_inputs),
    hints=(
        "Each sample is weighted by how much more (or less) likely the target policy makes it than the behaviour "
        "policy that drew it; the estimate is the plain average of weight times value.",
        "Work with the log-probabilities: a ratio of probabilities is the exponential of a difference of logs, target "
        "minus behaviour. Never exponentiate the two log-probabilities separately (`exp(-1000)` is 0.0).",
        "Convert the three inputs to float64 arrays, apply `np.exp` once to the difference, and average with "
        "`np.mean`: divide by N, not by the sum of the weights (that is the biased, self-normalised estimate). Return "
        "a Python `float`.",
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
    checks=(_tsr_shapes, _tsr_known, _tsr_padding, _tsr_mask_holes, _tsr_product, _tsr_oracle, _tsr_long, _tsr_inputs),
    hints=(
        "A token's ratio is the exponential of its log-ratio; a sequence's ratio is the product of its tokens' "
        "ratios, that is the exponential of the sum of their log-ratios. Padding must count as a ratio of 1.",
        "Compute the `[B, L]` log-ratios once and set them to 0 at the padding (`np.where` with the mask as a boolean "
        "array): exp(0) = 1, and 0 adds nothing to a sum.",
        "The sequence's log-ratio is a sum along axis 1, one number per row; exponentiate after summing, not before "
        "(a product of many small ratios underflows). Return a tuple: the per-token ratios `[B, L]`, then the "
        "per-sequence ones `[B]`.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 5: clipped_surrogate_loss
# ---------------------------------------------------------------------------------------

CSL = "clipped_surrogate_loss"


def _csl_tensors(
    logp_old: Sequence[float], ratios: Sequence[float], adv: Sequence[float], dtype: Any = None, old_grad: bool = False
) -> tuple[Any, Any, Any]:
    import torch

    dtype = dtype or torch.float64
    old = torch.tensor(list(logp_old), dtype=dtype, requires_grad=old_grad)
    new = (old.detach() + torch.log(torch.tensor(list(ratios), dtype=dtype))).requires_grad_()
    return new, old, torch.tensor(list(adv), dtype=dtype, requires_grad=old_grad)


def _csl_random(seed: int, n: int) -> tuple[list[float], list[float], list[float]]:
    """Ratios log-normal around 1 (both clip thresholds crossed), advantages of both signs."""
    rng = np.random.default_rng(seed)
    old = np.log(rng.uniform(0.05, 0.95, size=n)).tolist()
    ratios = np.exp(rng.normal(scale=0.4, size=n)).tolist()
    adv = np.round(rng.normal(size=n), 3).tolist()
    return old, ratios, adv


def _csl_value(fn: Callable[..., Any], new: Any, old: Any, adv: Any, eps: float, what: str) -> Any:
    return assert_scalar_tensor(call(fn, new, old, adv, eps), what=what, advice="autograd needs it: don't call .item()")


def _csl_grad(
    fn: Callable[..., Any], new: Any, old: Any, adv: Any, eps: float, what: str
) -> tuple[float, NDArray[np.float64]]:
    import torch

    loss = _csl_value(fn, new, old, adv, eps, what)
    if not loss.requires_grad:
        fail(f"{what} does not depend on logp_new through autograd; build the loss from logp_new with torch operations")
    (grad,) = torch.autograd.grad(loss, new, allow_unused=True)
    if grad is None:
        fail(f"no gradient reaches logp_new in {what}")
    return float(loss.detach()), grad.detach().double().numpy()


@check_case("returns a scalar torch tensor")
def _csl_scalar(fn: Callable[..., Any]) -> None:
    new, old, adv = _csl_tensors(*_csl_random(0, 4))
    _csl_value(fn, new, old, adv, 0.2, f"{CSL}(4 samples)")


@check_case("with ratios 1 the loss is -mean(A) and its gradient -A / N (REINFORCE)")
def _csl_ratio_one(fn: Callable[..., Any]) -> None:
    adv = [1.0, -2.0, 0.5, 3.0]
    new, old, a = _csl_tensors([-1.0, -0.5, -2.0, -0.1], [1.0] * 4, adv)
    loss, grad = _csl_grad(fn, new, old, a, 0.2, f"{CSL}(ratios 1, A = {adv})")
    expected = -sum(adv) / 4
    if math.isclose(loss, -expected, rel_tol=1e-9):
        fail(
            f"{CSL}(ratios 1, A = {adv}) = {fmt_number(loss)}; expected -mean(A) = {fmt_number(expected)}: "
            "minimise minus the surrogate"
        )
    assert_true(
        math.isclose(loss, expected, rel_tol=1e-6),
        f"{CSL}(ratios 1, A = {adv}) = {fmt_number(loss)}; expected -mean(A) = {fmt_number(expected)}",
    )
    if np.allclose(grad, [a_i / 4 for a_i in adv], rtol=1e-5):
        fail(
            f"the gradient of {CSL}(ratios 1) with respect to logp_new points the wrong way: the ratio is "
            "r = exp(logp_new - logp_old), which grows with logp_new"
        )
    assert_allclose(
        grad, [-a_i / 4 for a_i in adv], what=f"the gradient of {CSL}(ratios 1) with respect to logp_new", rtol=1e-5
    )


@check_case("hand-computed value and gradient across both clip thresholds, A of both signs")
def _csl_known(fn: Callable[..., Any]) -> None:
    ratios, adv = [1.5, 0.5, 1.5, 0.5, 1.1], [1.0, 1.0, -1.0, -1.0, 2.0]
    new, old, a = _csl_tensors([math.log(0.3)] * 5, ratios, adv)
    what = f"{CSL}(ratios {ratios}, A {adv}, eps=0.2)"
    loss, grad = _csl_grad(fn, new, old, a, 0.2, what)
    # terms: min(1.5, 1.2) = 1.2 (clipped), 0.5, min(-1.5, -1.2) = -1.5, min(-0.5, -0.8) = -0.8 (clipped), 2.2
    _diagnose(
        loss,
        {
            "the loss has the wrong sign: minimise minus the surrogate": 0.32,
            "that is torch.max of the two terms; PPO takes the minimum (the pessimistic bound)": -(
                1.5 + 0.8 - 1.2 - 0.5 + 2.2
            )
            / 5,
            "that is the clipped term alone; take the minimum of the unclipped and the clipped terms": -(
                1.2 + 0.8 - 1.2 - 0.8 + 2.2
            )
            / 5,
            "summed over the samples; average them": -1.6,
        },
        what,
        -1.6 / 5,
        rtol=1e-5,
    )
    expected_grad = [0.0, -0.5 / 5, 1.5 / 5, 0.0, -2.2 / 5]
    assert_allclose(grad, expected_grad, what=f"the gradient of {what} with respect to logp_new", rtol=1e-5)


@check_case("value matches a naive float64 loop on random ratios and advantages")
def _csl_oracle(fn: Callable[..., Any]) -> None:
    import torch

    for case, (seed, n, eps, dtype) in enumerate(
        [
            (10, 1, 0.2, torch.float64),
            (11, 9, 0.2, torch.float32),
            (12, 64, 0.1, torch.float64),
            (13, 200, 0.3, torch.float32),
        ]
    ):
        old, ratios, adv = _csl_random(seed, n)
        new_t, old_t, adv_t = _csl_tensors(old, ratios, adv, dtype=dtype)
        what = f"random case {case + 1} (N={n}, eps={eps:g}, {str(dtype).removeprefix('torch.')})"
        loss = float(_csl_value(fn, new_t, old_t, adv_t, eps, what).detach())
        expected, _ = naive_clipped_loss_and_grad(new_t.detach(), old_t, adv_t, eps)
        assert_true(
            math.isclose(loss, expected, rel_tol=1e-4, abs_tol=1e-6),
            f"{what}: loss {fmt_number(loss)}, expected {fmt_number(expected)}",
        )


@check_case("gradient: -(1/N) r A where the unclipped term is smaller, 0 where the clip is active")
def _csl_gradient(fn: Callable[..., Any]) -> None:
    for case, (seed, n, eps) in enumerate([(20, 12, 0.2), (21, 50, 0.1)]):
        old, ratios, adv = _csl_random(seed, n)
        new_t, old_t, adv_t = _csl_tensors(old, ratios, adv)
        what = f"random case {case + 1} (N={n}, eps={eps:g})"
        _, grad = _csl_grad(fn, new_t, old_t, adv_t, eps, what)
        _, expected = naive_clipped_loss_and_grad(new_t.detach(), old_t, adv_t, eps)
        assert_allclose(grad, expected, what=f"the gradient of {what} with respect to logp_new", rtol=1e-5)


@check_case("log-probabilities near -800 (probabilities underflow to 0.0): a finite loss and gradient")
def _csl_stable(fn: Callable[..., Any]) -> None:
    # a sequence-level log-probability (GSPO's ratio, lesson 02's long answers) is easily -800
    ratios, adv = [1.5, 0.5, 1.1, 0.9], [1.0, -1.0, 2.0, -0.5]
    old = [-800.0, -800.5, -799.0, -801.0]
    new, old_t, a = _csl_tensors(old, ratios, adv)
    what = f"{CSL}(log-probabilities near -800, ratios {ratios}, A {adv})"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = _csl_value(fn, new, old_t, a, 0.2, what)
    if not math.isfinite(float(loss.detach())):
        fail(
            f"{what} = {fmt_number(float(loss.detach()))}: exp(-800) is 0.0 in floating point, so "
            "exp(logp_new) / exp(logp_old) is 0 / 0; form the ratio as exp(logp_new - logp_old)"
        )
    expected, expected_grad = naive_clipped_loss_and_grad(new.detach(), old_t, a, 0.2)
    got, grad = _csl_grad(fn, new, old_t, a, 0.2, what)
    assert_true(
        math.isclose(got, expected, rel_tol=1e-6), f"{what} = {fmt_number(got)}; expected {fmt_number(expected)}"
    )
    assert_allclose(grad, expected_grad, what=f"the gradient of {what} with respect to logp_new", rtol=1e-5)


@check_case("no gradient reaches logp_old or the advantages")
def _csl_detached(fn: Callable[..., Any]) -> None:
    new, old, adv = _csl_tensors(*_csl_random(30, 6), old_grad=True)
    loss = _csl_value(fn, new, old, adv, 0.2, f"{CSL}(6 samples, logp_old and advantages requiring grad)")
    loss.backward()
    for name, t in (("logp_old", old), ("advantages", adv)):
        if t.grad is not None and bool((t.grad != 0).any()):
            fail(f"a gradient flowed into `{name}`: it is a constant of the loss; use {name}.detach()")


@check_case("eps sets the clip range")
def _csl_eps(fn: Callable[..., Any]) -> None:
    ratios, adv = [1.15, 0.85], [1.0, -1.0]
    for eps, expected in ((0.1, -(1.1 - 0.9) / 2), (0.2, -(1.15 - 0.85) / 2)):
        new, old, a = _csl_tensors([-1.0, -1.0], ratios, adv)
        loss = float(_csl_value(fn, new, old, a, eps, f"{CSL}(ratios {ratios}, A {adv}, eps={eps:g})").detach())
        assert_true(
            math.isclose(loss, expected, rel_tol=1e-5),
            f"{CSL}(ratios {ratios}, A {adv}, eps={eps:g}) = {fmt_number(loss)}; expected {fmt_number(expected)}: "
            "clip the ratio to [1 - eps, 1 + eps]",
        )


@check_case("does not modify its inputs")
def _csl_inputs(fn: Callable[..., Any]) -> None:
    new, old, adv = _csl_tensors(*_csl_random(40, 5))
    assert_inputs_unchanged(fn, CSL, 0.2, logp_new=new.detach().requires_grad_(), logp_old=old, advantages=adv)


CLIPPED_SURROGATE_LOSS = Exercise(
    name=CSL,
    points=15,
    title="minus PPO's clipped surrogate, averaged (eq. 02.5)",
    advice="from torch.exp, torch.clamp, torch.min and a mean (eq. 02.5)",
    checks=(
        _csl_scalar,
        _csl_ratio_one,
        _csl_known,
        _csl_eps,
        _csl_oracle,
        _csl_gradient,
        _csl_stable,
        _csl_detached,
        _csl_inputs,
    ),
    hints=(
        "PPO compares, per sample, the ratio times the advantage with the same product for the ratio clipped to [1 - "
        "eps, 1 + eps], keeps the pessimistic (smaller) of the two, and averages; the loss is minus that average.",
        "The ratio is `torch.exp` of the new minus the old log-probabilities. The old log-probabilities and the "
        "advantages are constants (detach them); only the new log-probabilities carry the gradient.",
        "`torch.clamp` clips the ratio (not the product); `torch.min` of the two terms is elementwise (the minimum, "
        "not the maximum); average with `.mean()`, then negate, because optimisers minimise. Return the tensor, not "
        "`.item()`.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (
    IS_ESTIMATE,
    EFFECTIVE_SAMPLE_SIZE,
    EXPECTED_ESS_FRACTION,
    TOKEN_AND_SEQUENCE_RATIOS,
    CLIPPED_SURROGATE_LOSS,
)
