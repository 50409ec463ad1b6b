"""Lesson 07's graded exercises: the per-token truncated-IS loss, per-token lags, a
data-parallel rank's share of that loss, the in-flight weight swap in a decoding loop, and the
generator's slot refill under backpressure.

The learner writes:

* ``token_is_loss(logp_new, logp_behaviour, advantages, mask, c) -> scalar tensor``  (07.1-07.2)
* ``token_lags(trainer_version, versions, mask) -> [N, T] int64``  (07.4)
* ``share_loss(logp_new, logp_behaviour, advantages, mask, rows, n_real, c) -> scalar tensor``  (07.2, data-parallel)
* ``inflight_decode(model, cache, tokens, pos, n_steps, poll, version, generator) -> (tokens, logp, versions)``
* ``refill_free_slots(sampler, prompts, state, consumed, max_lag, group_size, groups_per_batch) -> int``

What each exercise teaches, and how its checks observe it:

* token_is_loss: mechanism: one truncated weight min(c, pi/mu) per token, held constant, times
  the answer's advantage and log pi, averaged over the batch's real tokens; observed by random
  batches whose ratios cross c (c from 1 to 5), garbage padding, the gradient against the
  stop-gradient oracle's, on-policy tokens weighing 1, padding holding -inf (in logp_new, in
  logp_behaviour, in both) changing neither the loss nor its gradient.
* token_lags: mechanism: trainer version minus each real token's own version, 0 at padding, a
  future version refused; observed by versions changing inside sequences, garbage padding
  (a future version there is no error), tensors and lists, int64, inputs unchanged.
* share_loss: mechanism: a rank's share of the rows contributes exercise 1's terms over its
  real tokens divided by the WHOLE batch's real-token count n_real, so that the shares' losses
  and gradients sum to the batch's (07.2); observed by hand-computed shares, random batches
  split into 1 to 4 shares of random rows (each share's value and gradient against the
  term-by-term oracle), empty shares, the inputs left unchanged, and padding holding -inf.
* inflight_decode: mechanism: poll before every decoding step, load a newer version in place
  into the model given, keep the KV cache, sample with torch.multinomial and the generator,
  stamp each token with the version that sampled it; observed by the poll count, a full
  forward pass without updates, a teacher-forced replay through ``TinyLM.step`` (the old
  weights before the swap, the new ones after, and the generator's multinomial draws), the
  model's parameters after the call, the cache written before the swap, the cache given
  after the call against the replay's (every step written into it, in place, none rewritten
  at the swap), an older or equal version ignored, dtypes, the input tensors left
  unchanged, and rows at different positions (a continuous batch) each decoded at its own.
* refill_free_slots: mechanism: continuous batching under backpressure: every free slot, in
  order, takes the next answer owed (the rest of the current group first, whatever the bound),
  and a new group (one prompt, taken only once admitted) starts only while its number is below
  consumed + (max_lag + 1) B; observed with a fake sampler that refuses busy slots and a
  prompt queue that counts what is taken, against a simulation that lists the answers owed,
  and on the state kept between calls.

The checks never call ``course_lib.pipeline`` or ``course_lib.rl.staleness``: they compare
with the naive loops below (one term per token, one share at a time, the answers owed one
at a time), hand-computed values and properties. The decoding checks use only ``TinyLM``
(its full forward pass and its own ``step``) and the weight plumbing
(``course_lib.runtime.weights``) as references, never the sampler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    assert_allclose,
    assert_array,
    assert_inputs_unchanged,
    assert_true,
    call,
    check_case,
    fail,
    fmt_number,
)
from course_lib.course.grading.helpers import assert_numpy_result, fail_if_known_mistake
from course_lib.course.grading.vocab import assert_value_error

LESSON = "07_pipeline_rl"

# ---------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------


def naive_token_loss(
    logp_new: Any,
    logp_behaviour: Any,
    advantages: Any,
    mask: Any,
    c: float | None,
    *,
    per_sequence: bool = False,
    inverted: bool = False,
    all_positions: bool = False,
    per_answer: bool = False,
) -> float:
    """``-(1/N_tok) sum_{real i,t} min(c, pi/mu) A_i log pi``, one term at a time (floats).

    The keyword switches compute known slips, to name them in messages (``per_answer``: the
    mean over each answer's tokens, then over the answers).
    """
    lp, lm, a, m = (np.asarray(x, dtype=np.float64) for x in (logp_new, logp_behaviour, advantages, mask))
    n, t = lp.shape
    total, count, answer_means = 0.0, 0, []
    for i in range(n):
        seq = sum(lp[i, s] - lm[i, s] for s in range(t) if m[i, s])
        answer_total, answer_count = 0.0, 0
        for s in range(t):
            if not m[i, s]:
                continue
            log_ratio = seq if per_sequence else lp[i, s] - lm[i, s]
            ratio = math.exp(-log_ratio if inverted else log_ratio)
            w = ratio if c is None else min(c, ratio)
            total += w * a[i] * lp[i, s]
            count += 1
            answer_total, answer_count = answer_total + w * a[i] * lp[i, s], answer_count + 1
        if answer_count:
            answer_means.append(answer_total / answer_count)
    if per_answer:
        return -sum(answer_means) / len(answer_means)
    return -total / (n * t if all_positions else count)


def naive_token_weights(
    logp_new: Any, logp_behaviour: Any, advantages: Any, mask: Any, c: float
) -> NDArray[np.float64]:
    """``dL/dlogp_new`` with the weight held constant: ``-min(c, pi/mu) A_i / N_tok`` at real tokens."""
    lp, lm, a, m = (np.asarray(x, dtype=np.float64) for x in (logp_new, logp_behaviour, advantages, mask))
    out = np.zeros_like(lp)
    count = int(m.sum())
    for i in range(lp.shape[0]):
        for s in range(lp.shape[1]):
            if m[i, s]:
                out[i, s] = -min(c, math.exp(lp[i, s] - lm[i, s])) * a[i] / count
    return out


def loss_batch(seed: int, n: int = 4, t: int = 6, spread: float = 1.0) -> dict[str, Any]:
    """Random log-probs whose ratios cross 1 and 1.5, a ragged mask, garbage at the padding."""
    import torch

    rng = np.random.default_rng(seed)
    logp_new = np.log(rng.uniform(0.05, 0.95, size=(n, t)))
    logp_mu = logp_new + rng.normal(0.0, spread, size=(n, t))
    mask = np.zeros((n, t), dtype=bool)
    for i, length in enumerate(rng.integers(1, t + 1, size=n)):
        mask[i, t - length :] = True
    logp_mu[~mask] = 50.0  # garbage at the padding
    return {
        "logp_new": torch.tensor(logp_new, dtype=torch.float64, requires_grad=True),
        "logp_behaviour": torch.tensor(logp_mu, dtype=torch.float64),
        "advantages": torch.tensor(rng.normal(size=n), dtype=torch.float64),
        "mask": torch.tensor(mask),
    }


# ---------------------------------------------------------------------------------------
# Exercise 1: token_is_loss
# ---------------------------------------------------------------------------------------

LOSS = "token_is_loss"


def _loss_value(fn: Callable[..., Any], data: dict[str, Any], c: float) -> tuple[float, Any]:
    import torch

    logp_new = data["logp_new"].detach().clone().requires_grad_(True)
    got = call(fn, logp_new, data["logp_behaviour"].clone(), data["advantages"].clone(), data["mask"].clone(), c)
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        fail(f"{LOSS} returned {type(got).__name__}; expected a scalar torch tensor (keep the graph for backward)")
    if not got.requires_grad:
        fail(f"{LOSS}'s result does not require grad: compute it from logp_new (not from a detached copy or numpy)")
    return float(got.detach()), (got, logp_new)


def _loss_compare(fn: Callable[..., Any], data: dict[str, Any], c: float) -> None:
    value, _ = _loss_value(fn, data, c)
    args = (data["logp_new"].detach(), data["logp_behaviour"], data["advantages"], data["mask"])
    expected = naive_token_loss(*args, c)
    if math.isclose(value, expected, rel_tol=1e-6, abs_tol=1e-9):
        return
    bugs = {
        "the weights are not truncated: use min(c, pi/mu)": naive_token_loss(*args, None),
        "the ratio is one per sequence (a product over its tokens); (07.1) takes one weight per token": naive_token_loss(
            *args, c, per_sequence=True
        ),
        "the ratio is inverted: the weight is pi/mu = exp(logp_new - logp_behaviour)": naive_token_loss(
            *args, c, inverted=True
        ),
        "the mean runs over every position; divide by the number of real tokens (mask.sum())": naive_token_loss(
            *args, c, all_positions=True
        ),
        "the mean is taken per answer, then over the answers; (07.2) averages over the batch's N_tok real tokens, "
        "so a long answer weighs more": naive_token_loss(*args, c, per_answer=True),
    }
    for level in (1.5, 2.0):  # a level written as a constant instead of the argument c
        if level != c:
            bugs[f"the weights are truncated at {level:g}, not at the argument c = {c:g}"] = naive_token_loss(
                *args, level
            )
    for message, wrong in bugs.items():
        if not math.isclose(wrong, expected, rel_tol=1e-6) and math.isclose(value, wrong, rel_tol=1e-6, abs_tol=1e-9):
            fail(message)
    fail(f"{LOSS} = {value:.6g}; expected {expected:.6g} (the mean over real tokens of -min(c, pi/mu) A log pi)")


@check_case("returns a scalar tensor that requires grad")
def _loss_shape(fn: Callable[..., Any]) -> None:
    _loss_value(fn, loss_batch(0), 1.5)


@check_case("hand-computed value: ratios 2 (truncated to 1.5) and 0.5")
def _loss_known(fn: Callable[..., Any]) -> None:
    import torch

    data = {
        "logp_new": torch.log(torch.tensor([[0.4, 0.1]], dtype=torch.float64)),
        "logp_behaviour": torch.log(torch.tensor([[0.2, 0.2]], dtype=torch.float64)),
        "advantages": torch.tensor([1.0], dtype=torch.float64),
        "mask": torch.tensor([[True, True]]),
    }
    _loss_compare(fn, data, 1.5)


#: Truncation levels of the random batches: c is an argument, not a constant
LOSS_LEVELS = (1.5, 1.0, 2.0, 3.0, 1.2, 5.0)


@check_case("random batches with mixed versions, ratios crossing c = 1 to 5, garbage in the padding")
def _loss_oracle(fn: Callable[..., Any]) -> None:
    for seed, c in enumerate(LOSS_LEVELS):
        _loss_compare(fn, loss_batch(seed), c)


@check_case("the gradient treats the weight as a constant (stop-gradient)")
def _loss_gradient(fn: Callable[..., Any]) -> None:
    data = loss_batch(7)
    _, (loss, logp_new) = _loss_value(fn, data, 1.5)
    loss.backward()
    expected = naive_token_weights(
        data["logp_new"].detach(), data["logp_behaviour"], data["advantages"], data["mask"], 1.5
    )
    got = logp_new.grad
    if got is None:
        fail(f"{LOSS}'s result has no gradient with respect to logp_new")
    got = got.numpy()
    if not np.allclose(got, expected, atol=1e-9):
        fail(
            "the gradient differs from that of sum sg[w] A log pi: the weight must be a constant; "
            "compute the ratio from logp_new.detach()"
        )


@check_case("on-policy tokens weigh 1; padding values change nothing")
def _loss_properties(fn: Callable[..., Any]) -> None:
    import torch

    data = loss_batch(3)
    data["logp_behaviour"] = torch.where(data["mask"], data["logp_new"].detach(), data["logp_behaviour"])
    _loss_compare(fn, data, 1.5)
    value, _ = _loss_value(fn, data, 1.5)
    shifted = dict(
        data, logp_behaviour=torch.where(data["mask"], data["logp_behaviour"], torch.tensor(-7.0, dtype=torch.float64))
    )
    assert_true(
        math.isclose(value, _loss_value(fn, shifted, 1.5)[0], rel_tol=1e-9, abs_tol=1e-12),
        f"{LOSS} changed when only the padding of logp_behaviour changed: apply the mask to every term",
    )


def inf_padding_batch(seed: int) -> dict[str, Any]:
    """A random batch whose padding holds -inf, cycling through three patterns: in logp_new
    only, in logp_behaviour only, in both at once (where log pi - log mu is -inf - -inf = nan)."""
    import torch

    data = loss_batch(seed)
    pad = ~data["mask"]
    kind = torch.arange(pad.numel()).reshape(pad.shape) % 3
    assert all(bool((pad & (kind == k)).any()) for k in range(3)), "a batch with every pattern of -inf padding"
    inf = torch.tensor(-math.inf, dtype=torch.float64)
    logp_new = torch.where(pad & (kind != 1), inf, data["logp_new"].detach()).requires_grad_(True)
    logp_behaviour = torch.where(pad & (kind != 0), inf, data["logp_behaviour"])
    return dict(data, logp_new=logp_new, logp_behaviour=logp_behaviour)


#: The seeds of :func:`inf_padding_batch` that the -inf check grades (each has every pattern)
INF_PADDING_SEEDS = (2, 5)

SELECT_THE_REAL_TOKENS = (
    "select the real tokens first: torch.where(mask, logp_new, 0.0) (and logp_behaviour), or logp_new[mask]"
)


@check_case("padding holding -inf (in logp_new, in logp_behaviour, in both) changes neither the loss nor its gradient")
def _loss_inf_padding(fn: Callable[..., Any]) -> None:
    for seed in INF_PADDING_SEEDS:
        data = inf_padding_batch(seed)
        value, (loss, logp_new) = _loss_value(fn, data, 1.5)
        if not math.isfinite(value):
            fail(
                f"{LOSS} = {value} with -inf at the padding: padding may hold any value, and multiplying by the mask "
                f"turns -inf * 0 into nan; {SELECT_THE_REAL_TOKENS}"
            )
        _loss_compare(fn, data, 1.5)
        loss.backward()
        got = logp_new.grad
        if got is None:
            fail(f"{LOSS}'s result has no gradient with respect to logp_new")
        if not bool(got.isfinite().all()):
            fail(
                "the loss is right but its gradient is nan at padding holding -inf: a term computed there and "
                "discarded later (a torch.where on the product) still sends nan back through backward; "
                f"{SELECT_THE_REAL_TOKENS}"
            )
        expected = naive_token_weights(
            data["logp_new"].detach(), data["logp_behaviour"], data["advantages"], data["mask"], 1.5
        )
        if not np.allclose(got.numpy(), expected, atol=1e-9):
            fail(
                "with -inf at the padding, the gradient differs from that of sum sg[w] A log pi over the real tokens: "
                "the padding must get no gradient"
            )


TOKEN_IS_LOSS = Exercise(
    name=LOSS,
    points=15,
    title="per-token truncated-IS loss for sequences with mixed versions (eq. 07.1-07.2)",
    checks=(_loss_shape, _loss_known, _loss_oracle, _loss_gradient, _loss_properties, _loss_inf_padding),
    hints=(
        "One weight per token, that token's truncated importance ratio min(c, pi/mu), treated as a constant; the loss "
        "is minus the mean, over the real tokens of the batch, of weight times advantage times log-probability.",
        "Compute the log-ratio from `logp_new.detach()`, so that the weight carries no gradient, exponentiate it, and "
        "truncate from above only (`torch.clamp` with `max=`). The advantages are per answer: give them a token axis "
        "(`[:, None]`) so that they broadcast over the answer's tokens.",
        "Traps: padding may hold -inf, and -inf * 0 is nan, so the mask must keep the padding out of every "
        "computation, not multiply a finished product (a nan there also comes back through backward); and (07.2) "
        "is one mean over the batch's real tokens, not over every position, nor per answer.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: token_lags
# ---------------------------------------------------------------------------------------

LAG = "token_lags"


def _lag_compare(fn: Callable[..., Any], u: int, versions: NDArray[np.int64], mask: NDArray[np.bool_]) -> None:
    expected = np.zeros(versions.shape, dtype=np.int64)
    for i in range(versions.shape[0]):
        for t in range(versions.shape[1]):
            if mask[i, t]:
                expected[i, t] = u - int(versions[i, t])
    what = f"{LAG}({u}, versions of shape {versions.shape}, mask)"
    got = call(fn, u, versions.copy(), mask.copy())
    arr = assert_array(got, what=what, shape=expected.shape)
    if arr.dtype.kind in "biuf" and not np.array_equal(arr, expected):
        mistakes = {
            "lags are counted at the padding too: put 0 where mask is False": u - versions,
            "the lag has the wrong sign: trainer_version - version": -expected,
            "one lag per sequence (its oldest token) was copied to every token; (07.4) counts each token": np.where(
                mask, (u - np.where(mask, versions, u).min(axis=1))[:, None], 0
            ),
        }
        fail_if_known_mistake(arr, mistakes, rtol=0.0, atol=0.0)
    assert_allclose(arr, expected, what=what, check_dtype=False)
    assert_true(arr.dtype.kind in "iu", f"{what} has dtype {arr.dtype}; lags count updates: return int64")


@check_case("hand-computed lags, versions changing midway, padding holding -1")
def _lag_known(fn: Callable[..., Any]) -> None:
    versions = np.array([[-1, -1, 3, 4, 5], [-1, 5, 5, 5, -1], [-1, 2, 2, 4, 5]])
    mask = versions >= 0
    _lag_compare(fn, 5, versions, mask)


@check_case("random batches of mixed versions")
def _lag_random(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for _ in range(5):
        versions = np.sort(rng.integers(3, 10, size=(4, 7)), axis=1)
        mask = rng.random((4, 7)) < 0.7
        versions[~mask] = -1
        _lag_compare(fn, 9, versions, mask)


@check_case("returns int64 and leaves its inputs unchanged")
def _lag_dtype(fn: Callable[..., Any]) -> None:
    versions, mask = np.array([[1, 2], [2, -1]]), np.array([[True, True], [True, False]])
    given_v, given_m = versions.copy(), mask.copy()
    got = assert_array(call(fn, 3, given_v, given_m), what=f"{LAG}(3, ...)", shape=(2, 2))
    assert_true(got.dtype.kind in "iu", f"{LAG} returned dtype {got.dtype}; lags count updates: return int64")
    assert_true(
        np.array_equal(given_v, versions) and np.array_equal(given_m, mask),
        f"{LAG} changed an input array it was given; work on a copy",
    )


@check_case("accepts torch tensors and lists")
def _lag_inputs(fn: Callable[..., Any]) -> None:
    import torch

    versions, mask = [[0, 1, 2]], [[True, True, False]]
    got = call(fn, 2, torch.tensor(versions), torch.tensor(mask))
    assert_numpy_result(got, LAG)
    assert_allclose(got, [[2, 1, 0]], what=f"{LAG}(2, tensors)", check_dtype=False)
    assert_allclose(call(fn, 2, versions, mask), [[2, 1, 0]], what=f"{LAG}(2, lists)", check_dtype=False)


@check_case("a real token newer than the trainer raises ValueError; padding may hold anything")
def _lag_future(fn: Callable[..., Any]) -> None:
    versions, mask = np.array([[3, 9]]), np.array([[True, True]])
    what = f"{LAG}(5, a version 9)"
    no_error = f"{what} returned; expected ValueError: a token newer than the trainer is a bookkeeping bug"
    assert_value_error(fn, 5, versions.copy(), mask.copy(), what=what, no_error=no_error)
    _lag_compare(fn, 5, np.array([[3, 99]]), np.array([[True, False]]))


TOKEN_LAGS = Exercise(
    name=LAG,
    points=10,
    title="per-token lag of mixed-version sequences (eq. 07.4)",
    checks=(_lag_known, _lag_random, _lag_dtype, _lag_inputs, _lag_future),
    hints=(
        "Every real token has its own lag: how many versions the trainer is ahead of the version that generated that "
        "token; padding gets 0.",
        "Convert the versions to an int64 array and the mask to a boolean one. Check first that no real token's "
        "version is newer than the trainer's (`ValueError`), looking only at the tokens the mask keeps: padding may "
        "hold anything, -1 for instance.",
        "Trap: computing or checking lags at the padding as well: whatever it holds (-1 here) is no version, so it "
        "must neither get a lag nor raise. Lags count updates: the result is an integer array.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: share_loss, a data-parallel rank's share of the batch's loss
# ---------------------------------------------------------------------------------------

SHARE = "share_loss"


def naive_share_loss(
    logp_new: Any,
    logp_behaviour: Any,
    advantages: Any,
    mask: Any,
    rows: Any,
    n_real: float,
    c: float,
    *,
    own_count: bool = False,
    per_rank: str | None = None,
    per_answer: str | None = None,
    whole_batch: bool = False,
) -> float:
    """``-(1/n_real) sum_{i in rows, real t} min(c, pi/mu) A_i log pi``, one term at a time
    (floats; 0 for an empty share).

    The keyword switches compute known slips, to name them in messages: ``own_count`` (the
    share's own real tokens as the denominator; nan for an empty share); ``per_rank``
    (``"own"`` or ``"n_real"``: that mean, or the right one, scaled by ``len(rows) / N``, the
    share's part of the rows, which is dividing by the number of equal shares, as averaging
    the ranks' gradients does); ``per_answer`` (``"batch"`` or ``"share"``: each answer's mean
    over its real tokens, summed over the share's answers and divided by the batch's number
    of answers or the share's); ``whole_batch`` (every row of the batch, ``rows`` ignored).
    """
    lp, lm, a, m = (np.asarray(x, dtype=np.float64) for x in (logp_new, logp_behaviour, advantages, mask))
    n, t = lp.shape
    picked = list(range(n)) if whole_batch else [int(i) for i in np.asarray(rows).reshape(-1)]
    total, count, answer_means = 0.0, 0, []
    for i in picked:
        answer_total, answer_count = 0.0, 0
        for s in range(t):
            if m[i, s]:
                answer_total += min(c, math.exp(lp[i, s] - lm[i, s])) * a[i] * lp[i, s]
                answer_count += 1
        total, count = total + answer_total, count + answer_count
        if answer_count:
            answer_means.append(answer_total / answer_count)
    if per_answer is not None:
        answers = n if per_answer == "batch" else len(picked)
        return -sum(answer_means) / answers if answers else math.nan
    own = own_count or per_rank == "own"
    value = (-total / count if count else math.nan) if own else -total / n_real
    return value * len(picked) / n if per_rank is not None else value


def naive_share_weights(
    logp_new: Any,
    logp_behaviour: Any,
    advantages: Any,
    mask: Any,
    rows: Any,
    n_real: float,
    c: float,
    *,
    through_weight: bool = False,
) -> NDArray[np.float64]:
    """``dL_share/dlogp_new``: ``-min(c, pi/mu) A_i / n_real`` at the share's real tokens, 0
    elsewhere. ``through_weight`` computes the slip's: the weight differentiated too, so
    ``-(pi/mu)(1 + log pi) A_i / n_real`` where the ratio is below c."""
    lp, lm, a, m = (np.asarray(x, dtype=np.float64) for x in (logp_new, logp_behaviour, advantages, mask))
    out = np.zeros_like(lp)
    for i in (int(r) for r in np.asarray(rows).reshape(-1)):
        for s in range(lp.shape[1]):
            if m[i, s]:
                ratio = math.exp(lp[i, s] - lm[i, s])
                slope = ratio * (1.0 + lp[i, s]) if through_weight and ratio < c else min(c, ratio)
                out[i, s] = -slope * a[i] / n_real
    return out


def random_shares(rng: np.random.Generator, n: int, k: int) -> list[Any]:
    """A random partition of the rows ``0 .. n-1`` into ``k`` non-empty shares, each a 1-D
    ``torch.long`` tensor of rows in shuffled order (a rank's rows need not be contiguous)."""
    import torch

    order = rng.permutation(n)
    cuts = np.sort(rng.choice(np.arange(1, n), size=k - 1, replace=False))
    return [torch.as_tensor(part, dtype=torch.long) for part in np.split(order, cuts)]


#: Known slips of a share's loss: (message, the switches of :func:`naive_share_loss` that compute it)
SHARE_OWN_COUNT = (
    "each share divides by its own real-token count, not by n_real: the summed gradient then weighs the tokens of "
    "a share holding fewer of them more; divide by the whole batch's count n_real"
)
SHARE_RANKS = (
    "the share's loss is divided by the number of shares (scaled by len(rows) / N, as averaging the ranks' "
    "gradients does): the gradients are summed, and n_real alone makes their sum the batch's (07.2)"
)
SHARE_PER_ANSWER = (
    "the mean is taken per answer, then over the answers; (07.2) averages over the batch's n_real real tokens, "
    "so a long answer weighs more"
)
SHARE_SLIPS: tuple[tuple[str, dict[str, Any]], ...] = (
    (SHARE_OWN_COUNT, dict(own_count=True)),
    (SHARE_RANKS, dict(per_rank="own")),
    (SHARE_RANKS, dict(per_rank="n_real")),
    (SHARE_PER_ANSWER, dict(per_answer="batch")),
    (SHARE_PER_ANSWER, dict(per_answer="share")),
    (
        "the loss covers every row of the batch, not only the share's `rows`: summed over the shares, it counts the "
        "batch once per share",
        dict(whole_batch=True),
    ),
)
SHARE_THROUGH_WEIGHT = (
    "the values are right but the gradient flows through the importance weight: the weight is a constant (sg), "
    "compute the ratio from logp_new.detach()"
)


def _share_text(rows: Any, n_real: float, c: float) -> str:
    return f"{SHARE}(rows={rows.tolist()}, n_real={fmt_number(n_real)}, c={fmt_number(c)})"


def _share_call(fn: Callable[..., Any], data: dict[str, Any], rows: Any, n_real: float, c: float) -> tuple[Any, Any]:
    """The learner's loss of the share ``rows``, on copies of ``data`` with a fresh ``logp_new``
    leaf: (the loss, the leaf)."""
    import torch

    logp_new = data["logp_new"].detach().clone().requires_grad_(True)
    given = (data["logp_behaviour"].clone(), data["advantages"].clone(), data["mask"].clone(), rows.clone())
    got = call(fn, logp_new, *given, n_real, c)
    what = _share_text(rows, n_real, c)
    if not isinstance(got, torch.Tensor) or got.numel() != 1:
        fail(f"{what} returned {type(got).__name__}; expected a scalar torch tensor (keep the graph for backward)")
    if len(rows) and not got.requires_grad:
        fail(f"{what}'s result does not require grad: compute it from logp_new (not from a detached copy or numpy)")
    return got, logp_new


def _share_compare(fn: Callable[..., Any], data: dict[str, Any], shares: list[Any], c: float) -> None:
    """Each share's loss and gradient against the term-by-term oracle's (so that they sum to the
    batch's loss (07.2) and its gradient); a known slip is named."""
    import torch

    n_real = int(data["mask"].sum())
    args = (data["logp_new"].detach(), data["logp_behaviour"], data["advantages"], data["mask"])
    answers = [_share_call(fn, data, rows, n_real, c) for rows in shares]
    values = np.array([float(loss.detach()) for loss, _ in answers])
    expected = np.array([naive_share_loss(*args, rows, n_real, c) for rows in shares])
    where = f"shares {[r.tolist() for r in shares]} of {len(data['mask'])} answers, n_real = {n_real}"

    def close(a: Any, b: Any) -> bool:
        return bool(np.allclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True))

    if not close(values, expected):
        named = []  # the slips that give these values; named only when they tell one story
        for message, slip in SHARE_SLIPS:
            wrong = np.array([naive_share_loss(*args, rows, n_real, c, **slip) for rows in shares])
            if not close(wrong, expected) and close(values, wrong) and message not in named:
                named.append(message)
        if len(named) == 1:
            fail(f"{where}: {named[0]}")
        if any(not len(rows) and not math.isfinite(v) for rows, v in zip(shares, values)):
            fail(
                f"{where}: the empty share's loss is nan, not 0: dividing by its own real-token count divides 0 by 0; "
                "a rank with no rows adds nothing, divide by n_real"
            )
        if not np.isfinite(values).all():
            fail(
                f"{where}: a share's loss is {values[~np.isfinite(values)][0]}: the padding may hold -inf, and "
                "multiplying by the mask turns -inf * 0 into nan; select the share's real tokens first (torch.where)"
            )
        k = int(np.flatnonzero(~np.isclose(values, expected, rtol=1e-6, atol=1e-9))[0])
        fail(
            f"{where}: share {k}'s loss is {values[k]:.6g}; expected {expected[k]:.6g}, -(sum of sg[w] A log pi over "
            f"its real tokens) / n_real (so that the shares sum to the batch's {naive_token_loss(*args, c):.6g})"
        )
    for k, ((loss, leaf), rows) in enumerate(zip(answers, shares)):
        if not loss.requires_grad:
            continue  # an empty share may return a constant 0
        (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
        got = np.zeros(leaf.shape) if grad is None else grad.numpy()
        if not np.isfinite(got).all():
            fail(
                f"{where}: share {k}'s loss is right but its gradient is nan at padding holding -inf: a term computed "
                "there and discarded later (a torch.where on the product) still sends nan back through backward"
            )
        want = naive_share_weights(*args, rows, n_real, c)
        if np.allclose(got, want, atol=1e-9):
            continue
        if np.allclose(got, naive_share_weights(*args, rows, n_real, c, through_weight=True), atol=1e-9):
            fail(f"{where}: {SHARE_THROUGH_WEIGHT}")
        outside = np.ones(len(got), dtype=bool)
        outside[rows.numpy()] = False
        if np.abs(got[outside]).max(initial=0.0) > 0:
            fail(f"{where}: share {k}'s loss has a gradient at rows outside its `rows`: a rank has its own rows only")
        fail(
            f"{where}: share {k}'s gradient with respect to logp_new is not -sg[w] A / n_real at its real tokens (0 "
            "elsewhere): the shares' gradients do not sum to the batch's"
        )


def share_example() -> tuple[dict[str, Any], list[Any]]:
    """The statement's example: answer 0 has 1 real token (log 0.5), answer 1 has 3 (log 0.25
    each), the padding holds -inf (log 0); on-policy, advantages 1; the shares [0] and [1]."""
    import torch

    logp = torch.log(torch.tensor([[0.5, 0.0, 0.0], [0.25, 0.25, 0.25]], dtype=torch.float64))
    data = {
        "logp_new": logp,
        "logp_behaviour": logp.clone(),
        "advantages": torch.tensor([1.0, 1.0], dtype=torch.float64),
        "mask": torch.tensor([[True, False, False], [True, True, True]]),
    }
    return data, [torch.tensor([0]), torch.tensor([1])]


@check_case("returns a scalar tensor that requires grad")
def _share_shape(fn: Callable[..., Any]) -> None:
    import torch

    data = loss_batch(0, n=6)
    _share_call(fn, data, torch.tensor([4, 1, 2]), int(data["mask"].sum()), 1.5)


@check_case("hand-computed values: three answers with a truncated ratio; the statement's shares of 1 and 3 tokens")
def _share_known(fn: Callable[..., Any]) -> None:
    import torch

    # answers of 1, 3 and 2 real tokens (n_real = 6), padding -inf; answer 2's first ratio is 2, truncated to 1.5,
    # and its advantage -1; shares [2, 0]: -(log 0.5 - (1.5 + 1) log 0.8) / 6 = 0.0225, and [1]: -3 log 0.25 / 6 = 0.6931
    logp = torch.log(torch.tensor([[0.5, 0.0, 0.0], [0.25, 0.25, 0.25], [0.8, 0.8, 0.0]], dtype=torch.float64))
    three = {
        "logp_new": logp,
        "logp_behaviour": torch.where(
            torch.tensor([[False] * 3, [False] * 3, [True, False, False]]), math.log(0.4), logp
        ),
        "advantages": torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64),
        "mask": torch.isfinite(logp),
    }
    shares = [torch.tensor([2, 0]), torch.tensor([1])]
    args = (three["logp_new"], three["logp_behaviour"], three["advantages"], three["mask"])
    by_hand = (-(math.log(0.5) - 2.5 * math.log(0.8)) / 6, -3 * math.log(0.25) / 6)
    assert all(math.isclose(naive_share_loss(*args, r, 6, 1.5), v) for r, v in zip(shares, by_hand))
    _share_compare(fn, three, shares, 1.5)
    data, shares = share_example()
    args = (data["logp_new"], data["logp_behaviour"], data["advantages"], data["mask"])
    by_hand = (-math.log(0.5) / 4, -3 * math.log(0.25) / 4)  # 0.1733 and 1.0397: they sum to 1.2130, the batch's
    assert all(math.isclose(naive_share_loss(*args, r, 4, 1.5), v) for r, v in zip(shares, by_hand))
    _share_compare(fn, data, shares, 1.5)
    _share_compare(fn, data, [torch.tensor([1, 0])], 1.5)  # one share: the batch's loss itself


@check_case(
    "random batches split into 1 to 4 shares of random rows, c from 1 to 5: each share's loss and gradient, so "
    "that the shares sum to the batch's loss (07.2) and to its gradient (the weight a constant)"
)
def _share_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for seed, c in enumerate(LOSS_LEVELS):
        for k in (1 + seed % 4, 2 + (seed + 1) % 3):
            _share_compare(fn, loss_batch(20 + seed, n=8), random_shares(rng, 8, k), c)


@check_case("an empty share (a rank with no rows this update) gives 0, without error")
def _share_empty(fn: Callable[..., Any]) -> None:
    import torch

    data = loss_batch(4, n=5)
    empty = torch.zeros(0, dtype=torch.long)
    _share_compare(fn, data, [torch.tensor([2, 0]), empty, torch.tensor([1, 3, 4])], 2.0)
    _share_compare(fn, data, [empty, torch.tensor([3, 0, 4, 1, 2])], 1.5)


@check_case("leaves its inputs unchanged")
def _share_inputs(fn: Callable[..., Any]) -> None:
    import torch

    data = inf_padding_batch(INF_PADDING_SEEDS[0])
    assert_inputs_unchanged(
        fn,
        SHARE,
        int(data["mask"].sum()),
        1.5,
        logp_new=data["logp_new"],
        logp_behaviour=data["logp_behaviour"],
        advantages=data["advantages"],
        mask=data["mask"],
        rows=torch.tensor([2, 0]),
    )


@check_case("padding holding -inf (in logp_new, in logp_behaviour, in both): no nan, and no gradient at the padding")
def _share_inf_padding(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(1)
    for seed in INF_PADDING_SEEDS:
        _share_compare(fn, inf_padding_batch(seed), random_shares(rng, 4, 2), 1.5)


SHARE_LOSS = Exercise(
    name=SHARE,
    points=10,
    title="a data-parallel rank's share of the loss (07.2): the shares' gradients sum to the batch's",
    checks=(_share_shape, _share_known, _share_oracle, _share_empty, _share_inputs, _share_inf_padding),
    hints=(
        "A share's loss is the part of (07.2) that its rows contribute: exercise 1's terms over the share's real "
        "tokens only, divided by the same count as the whole batch's loss, so that the shares add up to it.",
        "Pick the share's rows out of every per-row input with `rows` (an empty `rows` picks none), then weigh their "
        "real tokens as in exercise 1. `n_real` is the one number the ranks agree on before their backward passes.",
        "Traps: dividing by the share's own token count, averaging per answer, or dividing by the number of shares "
        "each weigh some tokens wrongly in the summed gradient; a weight that carries gradient changes the gradient "
        "but not the value; padding that holds -inf must be left out before any arithmetic touches it.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: inflight_decode
# ---------------------------------------------------------------------------------------

DEC = "inflight_decode"
N_PREFIX, N_STEPS, SWAP_AT = 4, 6, 2


def _lm_pair() -> tuple[Any, Any]:
    import torch

    from course_lib.lm.model import LMConfig, TinyLM

    cfg = LMConfig(vocab=11, d_model=16, n_layers=2, n_heads=2, max_len=N_PREFIX + N_STEPS + 1)
    torch.manual_seed(0)
    return TinyLM(cfg), TinyLM(cfg)


#: Every row's position in the checks (the token at it not yet fed), and in the ragged check
#: (a continuous batch: its slots started their answers at different times)
UNIFORM, RAGGED = (N_PREFIX - 1,) * 3, (3, 1, 2)


def _prefill(model: Any, prefix: Any, starts: tuple[int, ...]) -> Any:
    """A KV cache holding row i's prefix tokens at positions ``0 .. starts[i] - 1``, written by
    ``model.step`` for the rows together; a row already at its position feeds its last prefix
    token there again, which writes the same keys and values."""
    import torch

    assert min(starts) >= 1 and max(starts) < N_PREFIX, "every row has a prefix to prefill, and a token to feed"
    last = torch.tensor(starts) - 1
    rows = torch.arange(len(starts))
    cache = model.new_cache(len(starts))
    with torch.no_grad():
        for p in range(max(starts)):
            at = torch.clamp(last, max=p)
            model.step(prefix[rows, at], at, cache)
    return cache


def _decode(
    fn: Callable[..., Any],
    schedule: dict[int, tuple[int, Any]],
    version: int = 0,
    seed: int = 0,
    global_seed: int = 0,
    starts: tuple[int, ...] = UNIFORM,
) -> tuple[Any, ...]:
    """Prefill 3 sequences up to their positions ``starts``, run the learner's loop with ``poll``
    returning ``schedule[call]``; returns (model, cache before, cache after, prefix, outputs, poll calls)."""
    import torch

    model, _ = _lm_pair()
    prefix = torch.randint(0, 11, (3, N_PREFIX), generator=torch.Generator().manual_seed(seed))
    cache = _prefill(model, prefix, starts)
    before = (cache[0].clone(), cache[1].clone())
    torch.manual_seed(global_seed)  # torch's global random state must not matter: `generator` decides
    calls: list[int] = []

    def poll() -> Any:
        calls.append(len(calls))
        return schedule.get(len(calls) - 1)

    pos = torch.tensor(starts)
    tokens = prefix[torch.arange(3), pos].clone()
    given = (tokens.clone(), pos.clone())
    out = call(fn, model, cache, tokens, pos, N_STEPS, poll, version, torch.Generator().manual_seed(seed))
    for name, now, then in (("tokens", tokens, given[0]), ("pos", pos, given[1])):
        if not torch.equal(now, then):
            fail(f"{DEC} changed the `{name}` tensor it was given (an in-place += or copy_): work on a copy")
    if not (isinstance(out, tuple) and len(out) == 3):
        fail(f"{DEC} returned {type(out).__name__}; expected a tuple (new_tokens, logp, versions)")
    for name, x in zip(("new_tokens", "logp", "versions"), out):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (3, N_STEPS):
            fail(f"{DEC}'s {name} is not a [B, n_steps] = [3, {N_STEPS}] torch tensor")
        if name != "logp" and x.dtype != torch.long:
            fail(f"{DEC}'s {name} has dtype {x.dtype}; expected torch.long (token ids and versions are int64)")
        if name == "logp" and not x.dtype.is_floating_point:
            fail(f"{DEC}'s logp has dtype {x.dtype}; expected a float tensor of log-probabilities")
    return model, before, cache, prefix, out, calls


@check_case("without updates: log-probs equal a full forward pass, tokens follow the generator")
def _dec_no_update(fn: Callable[..., Any]) -> None:
    import torch

    from course_lib.lm.model import sequence_logprobs

    model, _, _, prefix, (tokens, logp, versions), calls = _decode(fn, {})
    assert_true(
        len(calls) == N_STEPS, f"poll() was called {len(calls)} times in {N_STEPS} steps; call it before every step"
    )
    full = torch.cat([prefix, tokens], dim=1)
    with torch.no_grad():
        ref = sequence_logprobs(model, full)[:, N_PREFIX:]
    if not torch.allclose(logp.float(), ref, atol=1e-4):
        if torch.allclose(logp.float(), ref.exp(), atol=1e-4):
            fail(f"{DEC}'s logp holds probabilities; record log-probabilities")
        fail(
            f"{DEC}'s logp differs from a full forward pass over the sequences: feed each new token at the next "
            "position (pos + 1) and record the log-prob of the sampled token"
        )
    assert_true(bool((versions == 0).all()), f"{DEC} stamped versions {versions.unique().tolist()} without any update")
    _, _, _, _, (again, _, _), _ = _decode(fn, {}, global_seed=1)
    assert_true(
        torch.equal(tokens, again),
        f"{DEC} is not reproducible with the same generator: sample with "
        "torch.multinomial(..., generator=generator), not torch's global random state",
    )
    with torch.no_grad():
        greedy = model(full)[:, N_PREFIX - 1 : -1].argmax(-1)
    if torch.equal(tokens, greedy):
        fail(f"{DEC} picks the most likely token; sample with torch.multinomial")


@check_case("an update is loaded before the next step: later tokens carry the new version")
def _dec_versions(fn: Callable[..., Any]) -> None:
    import torch

    from course_lib.runtime.weights import flat_parameters

    _, newer = _lm_pair()
    _, _, _, _, (_, _, versions), _ = _decode(fn, {SWAP_AT: (4, flat_parameters(newer))})
    expected = torch.tensor([[0] * SWAP_AT + [4] * (N_STEPS - SWAP_AT)] * 3)
    if not torch.equal(versions.long(), expected):
        fail(
            f"versions of the new tokens are {versions[0].tolist()}; expected {expected[0].tolist()}: tokens sampled "
            "after an update must be stamped with the new version"
        )


@check_case("the swap keeps the KV cache and the tokens before it")
def _dec_keeps_cache(fn: Callable[..., Any]) -> None:
    import torch

    from course_lib.runtime.weights import flat_parameters

    _, newer = _lm_pair()
    _, before, after, _, (tokens, _, _), _ = _decode(fn, {SWAP_AT: (1, flat_parameters(newer))})
    kept = N_PREFIX - 1 + SWAP_AT  # positions written before the swap
    for name, b, a in (("keys", before[0], after[0]), ("values", before[1], after[1])):
        if (
            not torch.equal(b[:, :, :, : N_PREFIX - 1], a[:, :, :, : N_PREFIX - 1])
            or not a[:, :, :, :kept].abs().sum() > 0
        ):
            fail(
                f"the KV cache's {name} written before the swap changed: an in-flight update keeps the cache "
                "(do not clear or rebuild it)"
            )
    _, _, _, _, (plain, _, _), _ = _decode(fn, {})
    assert_true(
        torch.equal(tokens[:, :SWAP_AT], plain[:, :SWAP_AT]),
        "the tokens before the update differ from a run without it; load weights only when poll() returns them",
    )


@check_case("an older or equal version is ignored; nothing requires grad")
def _dec_older(fn: Callable[..., Any]) -> None:
    import torch

    from course_lib.runtime.weights import flat_parameters

    old, newer = _lm_pair()
    _, _, _, _, (plain, _, _), _ = _decode(fn, {}, version=3)
    for offered, slip in ((2, ""), (3, " (compare with >, not >=: version 3 is the one held)")):
        model, _, _, _, (tokens, logp, versions), _ = _decode(
            fn, {SWAP_AT: (offered, flat_parameters(newer))}, version=3
        )
        assert_true(
            bool((versions == 3).all())
            and bool((tokens == plain).all())
            and torch.equal(flat_parameters(model), flat_parameters(old)),
            f"{DEC} loaded version {offered} while holding version 3: load only versions newer than the one held{slip}",
        )
        assert_true(not logp.requires_grad, f"{DEC}'s logp requires grad: decode under torch.no_grad()")


def _dec_cache_compare(after: tuple[Any, Any], ref: tuple[Any, Any], first: int, stop: int) -> None:
    """The learner's KV cache after the call against the teacher-forced replay's, at the positions
    ``first .. stop - 1`` that decoding steps ``0 .. stop - first - 1`` wrote (the swap at step
    ``SWAP_AT``): the steps must have written the cache given, each with the weights held then."""
    import torch

    for p in range(first, stop):
        t = p - first
        for name, got, want in (("keys", after[0], ref[0]), ("values", after[1], ref[1])):
            got_p, want_p = got[:, :, :, p], want[:, :, :, p]
            if torch.allclose(got_p.float(), want_p.float(), atol=1e-5):
                continue
            if not bool(got_p.any()):
                fail(
                    f"after the call, the KV cache you were given holds no {name} at the position of step {t}: the "
                    "steps wrote into a copy of it; decode with the cache given, in place (model.step writes it), "
                    "for the generator carries on from it with the next answers' steps"
                )
            if t < SWAP_AT:
                fail(
                    f"the KV cache's {name} written at step {t}, before the swap, were rewritten (recomputed with the "
                    "new weights?): an in-flight update keeps the cache as the old weights wrote it; only the steps "
                    "after the swap write with the new weights"
                )
            fail(
                f"the KV cache's {name} written at step {t} are not those the model's own step writes with the "
                "weights held at that step: feed each sampled token at the next position, into the cache given"
            )


@check_case(
    "teacher-forced through TinyLM.step: every step's log-probs are those of the weights held (the new ones from "
    "the swap on, loaded into the model given) and its tokens are torch.multinomial's draws with the generator; "
    "the steps wrote the KV cache given"
)
def _dec_teacher_forced(fn: Callable[..., Any]) -> None:
    import torch

    from course_lib.runtime.weights import flat_parameters, load_flat_parameters

    _, newer = _lm_pair()
    new_flat = flat_parameters(newer)
    model, _, after, prefix, (tokens, logp, _), _ = _decode(fn, {SWAP_AT: (4, new_flat)})
    swapped, kept = _lm_pair()[0], _lm_pair()[0]  # the old weights; `swapped` takes the new ones at the swap
    caches = (swapped.new_cache(3), kept.new_cache(3))
    generator = torch.Generator().manual_seed(0)
    fed, pos = prefix[:, -1], torch.full((3,), N_PREFIX - 1)
    with torch.no_grad():
        for p in range(N_PREFIX - 1):
            for ref, cache in zip((swapped, kept), caches):
                ref.step(prefix[:, p], torch.full((3,), p), cache)
        for t in range(N_STEPS):
            if t == SWAP_AT:
                load_flat_parameters(swapped, new_flat)
            lp, lp_old = (torch.log_softmax(r.step(fed, pos, c), dim=-1) for r, c in zip((swapped, kept), caches))
            drawn = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(1)
            token = tokens[:, t].long()
            got, want = logp[:, t].float(), lp.gather(1, token[:, None]).squeeze(1)
            if not torch.allclose(got, want, atol=1e-4):
                if t >= SWAP_AT and torch.allclose(got, lp_old.gather(1, token[:, None]).squeeze(1), atol=1e-4):
                    fail(
                        f"step {t}, after the swap: the log-probs are the OLD weights': the tokens were stamped with "
                        "the new version but sampled by the old weights; load them into the model "
                        "(load_flat_parameters(model, flat))"
                    )
                if t >= SWAP_AT:
                    _dec_cache_compare(after, caches[0], N_PREFIX - 1, N_PREFIX - 1 + SWAP_AT)
                fail(
                    f"step {t}: the log-probs differ from the model's own step with the weights held (kept KV cache): "
                    "record log_softmax(model.step(...)) at the sampled token"
                )
            if not torch.equal(token, drawn):
                fail(
                    f"step {t}: the tokens {token.tolist()} are not torch.multinomial(probabilities, 1, "
                    f"generator=generator)'s draws {drawn.tolist()}: sample from the model's distribution (the "
                    "softmax of its logits, no temperature, not uniform), one call per step for the whole batch"
                )
            fed, pos = token, pos + 1
    if not torch.equal(flat_parameters(model), new_flat):
        fail(
            "after the swap, the model you were given still holds the old weights: the new ones were loaded into a "
            "copy; load them into `model` in place (the generator decodes its next answers with it)"
        )
    _dec_cache_compare(after, caches[0], N_PREFIX - 1, N_PREFIX - 1 + N_STEPS)


def _dec_replay(prefix: Any, tokens: Any, first: Any) -> Any:
    """The log-probs of ``tokens`` teacher-forced through ``TinyLM.step`` from the ragged
    prefill, step t feeding its rows at positions ``first + t`` (``first`` ``[3]``); ``[3, N_STEPS]``."""
    import torch

    model = _lm_pair()[0]
    cache = _prefill(model, prefix, RAGGED)
    fed, out = prefix[torch.arange(3), torch.tensor(RAGGED)], []
    with torch.no_grad():
        for t in range(N_STEPS):
            lp = torch.log_softmax(model.step(fed, first + t, cache), dim=-1)
            fed = tokens[:, t].long()
            out.append(lp.gather(1, fed[:, None]).squeeze(1))
    return torch.stack(out, 1)


@check_case(
    f"slots at different positions (pos = {list(RAGGED)}, as in a continuous batch): every row decodes at its own "
    "position, teacher-forced through TinyLM.step"
)
def _dec_ragged(fn: Callable[..., Any]) -> None:
    import torch

    _, _, _, prefix, (tokens, logp, _), _ = _decode(fn, {}, starts=RAGGED)
    want = _dec_replay(prefix, tokens, torch.tensor(RAGGED))
    got = logp.float()
    if torch.allclose(got, want, atol=1e-4):
        return
    for shared in sorted(set(RAGGED)):  # one counter for the whole batch: pos[0], the largest, the smallest
        if torch.allclose(got, _dec_replay(prefix, tokens, torch.full((3,), shared)), atol=1e-4):
            fail(
                f"with the slots at positions pos = {list(RAGGED)}, every row was decoded at position {shared} + t: "
                "every slot decodes at its own position pos[i]; a shared counter (one position for the whole batch, "
                "e.g. int(pos[0]) + t) corrupts a continuous batch, whose slots sit at different positions; "
                "advance pos itself"
            )
    bad = ~torch.isclose(got, want, atol=1e-4)
    row, t = (int(i) for i in torch.nonzero(bad)[0])
    fail(
        f"with the slots at positions pos = {list(RAGGED)}: at step {t}, row {row}'s log-prob differs from the model's "
        f"own step at that row's position pos[{row}] + {t} = {RAGGED[row] + t}: every slot decodes at its own "
        "position pos[i], advancing by one each step"
    )


INFLIGHT_DECODE = Exercise(
    name=DEC,
    allowed=("course_lib.lm.model.TinyLM", "course_lib.runtime.weights.load_flat_parameters"),
    points=15,
    title="a decoding loop that swaps in new weights between steps, keeping the KV cache",
    checks=(_dec_no_update, _dec_versions, _dec_keeps_cache, _dec_teacher_forced, _dec_older, _dec_ragged),
    hints=(
        "Decode `n_steps` tokens one step at a time; before each step, ask `poll()` whether newer weights arrived "
        "and, if so, load them into the model and remember their version, without touching the KV cache. Every token "
        "records the version that generated it.",
        "`poll()` returns None or a pair (version, flat weights): only a version newer than the one you hold counts, "
        "and its weights go into the model you were given. Each step samples from the model's own distribution with "
        "the given generator and records the token, its log-probability and the version held; every row then moves "
        "on by one position (the rows of a continuous batch sit at different positions).",
        "Traps: changing the caller's `tokens` or `pos` in place, recording gradients while decoding, and clearing, "
        "copying or recomputing the KV cache at a swap: the in-flight update keeps the cache as the old weights "
        "wrote it.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 5: refill_free_slots, continuous batching with backpressure
# ---------------------------------------------------------------------------------------

RF = "refill_free_slots"


class SlotMisuse(Exception):
    """The learner started an answer in a slot that is not free (or not a slot)."""


class FakeSampler:
    """A sampler of ``n_slots`` slots for the checks: ``free_slots()`` lists the free ones in
    ``order`` (a permutation of the slots), ``start(slot, prompt, group)`` records the start
    and refuses a slot that is not free; :meth:`finish` frees slots between refills."""

    def __init__(self, n_slots: int, order: list[int] | None = None, busy: set[int] | None = None) -> None:
        self._order = list(order) if order is not None else list(range(n_slots))
        self._busy: set[int] = set(busy or ())
        self.started: list[tuple[int, Any, int]] = []

    def free_slots(self) -> list[int]:
        return [s for s in self._order if s not in self._busy]

    def start(self, slot: Any, prompt: Any, group: Any) -> None:
        if not isinstance(slot, int | np.integer) or int(slot) not in self._order:
            raise SlotMisuse(f"start({slot!r}, ...): not a slot of this sampler (use the numbers free_slots() lists)")
        if int(slot) in self._busy:
            raise SlotMisuse(f"start({int(slot)}, ...): slot {int(slot)} is busy; start answers in free slots only")
        self._busy.add(int(slot))
        self.started.append((int(slot), prompt, group))

    def finish(self, slots: set[int]) -> None:
        self._busy -= slots

    @property
    def busy(self) -> frozenset[int]:
        return frozenset(self._busy)


class PromptQueue:
    """An iterator of prompts ``"prompt 0"``, ``"prompt 1"``, ... that counts how many were taken."""

    def __init__(self, size: int = 1000) -> None:
        self.taken, self._size = 0, size

    def __iter__(self) -> PromptQueue:
        return self

    def __next__(self) -> str:
        if self.taken >= self._size:
            raise StopIteration
        self.taken += 1
        return f"prompt {self.taken - 1}"


def fresh_state() -> dict[str, Any]:
    return {"next_group": 0, "group": -1, "prompt": None, "left": 0}


def naive_refill(
    free: list[int],
    state: dict[str, Any],
    taken: int,
    consumed: int,
    max_lag: int,
    group_size: int,
    groups_per_batch: int,
    *,
    window: str = "groups",
    off_by_one: bool = False,
    prompt_per_answer: bool = False,
    prompt_first: bool = False,
    gate_every_answer: bool = False,
    whole_groups: bool = False,
    order: str = "given",
) -> tuple[list[tuple[int, str, int]], dict[str, Any], int]:
    """The oracle: the answers the generator owes, in order (the rest of the current group,
    then whole new groups while their number is below the bound), dealt to the free slots in
    order. Returns (the starts (slot, prompt, group), the new state, the prompts taken).

    The switches compute known slips: ``window`` ``"updates"`` (consumed read as updates:
    ``(consumed + max_lag + 1) B``) or ``"no_plus_one"`` (``consumed + max_lag B``);
    ``off_by_one`` (``<=``); ``prompt_per_answer``; ``prompt_first`` (a prompt taken before
    the admission test, lost when it fails); ``gate_every_answer`` (the test on
    ``next_group`` before every answer, the rest of a started group too); ``whole_groups``
    (a new group only when all its answers fit); ``order`` ``"sorted"`` or ``"reversed"``."""
    bound = {
        "groups": consumed + (max_lag + 1) * groups_per_batch,
        "updates": (consumed + max_lag + 1) * groups_per_batch,
        "no_plus_one": consumed + max_lag * groups_per_batch,
    }[window] + (1 if off_by_one else 0)
    slots = {"given": list(free), "sorted": sorted(free), "reversed": list(reversed(free))}[order]
    st = dict(state)
    starts: list[tuple[int, str, int]] = []
    for n, slot in enumerate(slots):
        if gate_every_answer and st["next_group"] >= bound:
            break
        if st["left"] == 0:
            if prompt_first:
                prompt, taken = f"prompt {taken}", taken + 1
            if st["next_group"] >= bound or (whole_groups and len(slots) - n < group_size):
                break
            if not prompt_first:
                prompt, taken = f"prompt {taken}", taken + 1
            st.update(group=st["next_group"], prompt=prompt, left=group_size, next_group=st["next_group"] + 1)
        elif prompt_per_answer:
            st["prompt"], taken = f"prompt {taken}", taken + 1
        starts.append((slot, st["prompt"], st["group"]))
        st["left"] -= 1
    return starts, st, taken


RF_SLIPS: dict[str, dict[str, Any]] = {
    "consumed counts groups, not updates: the bound is consumed + (max_lag + 1) B, not (consumed + max_lag + 1) B": (
        dict(window="updates")
    ),
    "a new group k may start only while k < consumed + (max_lag + 1) B: off by one (<= lets one group too many in, "
    "its tokens then lag max_lag + 1 updates)": dict(off_by_one=True),
    "the window is (max_lag + 1) B groups past consumed, not max_lag B: the batch the trainer is about to consume "
    "is in the window too": dict(window="no_plus_one"),
    "a prompt was taken for a group that backpressure then held back: it is lost; take the prompt only once the "
    "group is admitted": dict(prompt_first=True),
    "the rest of a group already started was held back: backpressure gates new groups only, and the trainer waits "
    "for all G answers of a group": dict(gate_every_answer=True),
    "a new group waited for G free slots: its answers may start in different refills; fill every free slot": dict(
        whole_groups=True
    ),
    "the free slots were visited in sorted order; visit them in the order free_slots() lists them": dict(
        order="sorted"
    ),
    "the free slots were visited in reverse order; visit them in the order free_slots() lists them": dict(
        order="reversed"
    ),
}

RF_STATE = "the state is the generator's, kept between calls: update the dict you are given in place"


def _rf_text(consumed: int, max_lag: int, group_size: int, groups_per_batch: int) -> str:
    return f"{RF}(consumed={consumed}, max_lag={max_lag}, group_size={group_size}, groups_per_batch={groups_per_batch})"


def _rf_refill(
    fn: Callable[..., Any],
    sampler: FakeSampler,
    queue: PromptQueue,
    state: dict[str, Any],
    consumed: int,
    max_lag: int,
    group_size: int,
    groups_per_batch: int,
    label: str = "",
) -> None:
    """One refill by the learner, compared with the oracle: the starts, the count returned,
    the prompts taken and the state; a known slip is named."""
    what = label or _rf_text(consumed, max_lag, group_size, groups_per_batch)
    free, before, taken = sampler.free_slots(), dict(state), queue.taken
    n_started = len(sampler.started)
    args = (free, before, taken, consumed, max_lag, group_size, groups_per_batch)
    want_starts, want_state, want_taken = naive_refill(*args)
    try:
        got = call(fn, sampler, queue, state, consumed, max_lag, group_size, groups_per_batch)
    except LearnerError as exc:
        if isinstance(exc.error, SlotMisuse):
            fail(f"{what}: {exc.error}")
        if isinstance(exc.error, StopIteration):
            fail(f"{what} took every prompt of the queue: take one prompt per new group, with next(prompts)")
        raise
    starts = sampler.started[n_started:]
    if starts != want_starts or queue.taken != want_taken:
        groups: dict[Any, set[Any]] = {}
        for _, prompt, group in starts:
            groups.setdefault(group, set()).add(prompt)
        mixed = next((g for g, p in groups.items() if len(p) > 1), None)
        if mixed is not None:
            fail(
                f"{what}: the answers of group {mixed} got {len(groups[mixed])} different prompts: every answer of a "
                "group answers the group's one prompt (GRPO compares them); take a prompt per new group only"
            )
        for message, slip in RF_SLIPS.items():
            wrong_starts, _, wrong_taken = naive_refill(*args, **slip)
            if (wrong_starts, wrong_taken) != (want_starts, want_taken) and (starts, queue.taken) == (
                wrong_starts,
                wrong_taken,
            ):
                fail(f"{what}: {message}")
        if starts == want_starts:
            fail(
                f"{what} took {queue.taken - taken} prompts for {want_taken - taken} new groups: one prompt per new "
                "group, taken only once the group is admitted"
            )
        k = next((i for i, (a, b) in enumerate(zip(starts, want_starts)) if a != b), min(len(starts), len(want_starts)))
        shown = starts[k] if k < len(starts) else "nothing"
        expected = want_starts[k] if k < len(want_starts) else "nothing (the refill stops there)"
        fail(
            f"{what} with free slots {free} and state {before}: start {k} is {shown}; expected {expected} as "
            "(slot, prompt, group)"
        )
    if isinstance(got, bool) or not isinstance(got, int | np.integer) or int(got) != len(want_starts):
        fail(f"{what} returned {got!r}; expected {len(want_starts)}, the number of answers started")
    for key in ("next_group", "group", "prompt", "left"):
        if state.get(key) != want_state[key]:
            fail(
                f"{what}: state[{key!r}] is {state.get(key)!r} after the call; expected {want_state[key]!r}: {RF_STATE}"
            )


@check_case(
    "hand-computed: a fresh generator fills six slots, a full window holds a group back, a consumed batch frees it"
)
def _rf_known(fn: Callable[..., Any]) -> None:
    sampler, queue, state = FakeSampler(6), PromptQueue(), fresh_state()
    # G = 2, B = 2, max_lag = 1: groups 0..3 may start while nothing is consumed
    assert naive_refill([0, 1, 2, 3, 4, 5], fresh_state(), 0, 0, 1, 2, 2)[0] == [
        (0, "prompt 0", 0),
        (1, "prompt 0", 0),
        (2, "prompt 1", 1),
        (3, "prompt 1", 1),
        (4, "prompt 2", 2),
        (5, "prompt 2", 2),
    ]  # the statement's demo
    _rf_refill(fn, sampler, queue, state, 0, 1, 2, 2, f"{_rf_text(0, 1, 2, 2)} on a fresh generator with 6 free slots")
    sampler.finish({0, 1, 4, 5})
    _rf_refill(fn, sampler, queue, state, 0, 1, 2, 2, f"{_rf_text(0, 1, 2, 2)}, 4 slots free again")  # group 3; 4 waits
    _rf_refill(fn, sampler, queue, state, 2, 1, 2, 2, f"{_rf_text(2, 1, 2, 2)}, after the first batch")  # group 4
    sampler.finish({2, 3})
    _rf_refill(fn, sampler, queue, state, 2, 1, 2, 2, f"{_rf_text(2, 1, 2, 2)}, 2 more slots free")  # group 5
    sampler.finish({0, 5})
    _rf_refill(fn, sampler, queue, state, 2, 1, 2, 2, f"{_rf_text(2, 1, 2, 2)}, the window full")  # group 6 waits
    sampler.finish({1, 2, 3, 4})
    _rf_refill(fn, sampler, queue, state, 6, 1, 2, 2, f"{_rf_text(6, 1, 2, 2)}, every slot free")  # groups 6, 7, 8
    _rf_refill(fn, sampler, queue, state, 6, 1, 2, 2, f"{_rf_text(6, 1, 2, 2)} with no free slot")  # nothing
    # G = 3 in 4 free slots: group 0 takes 3, group 1 starts in the 4th with 2 answers left
    sampler, queue, state = FakeSampler(4), PromptQueue(), fresh_state()
    _rf_refill(fn, sampler, queue, state, 0, 1, 3, 2, f"{_rf_text(0, 1, 3, 2)} with 4 free slots")


@check_case("a group straddles two refills and finishes through backpressure; nothing starts without a free slot")
def _rf_straddle(fn: Callable[..., Any]) -> None:
    # G = 4, B = 1, max_lag = 0: one group in flight; group 0 starts in 3 slots, its 4th answer in the next refill
    sampler, queue, state = FakeSampler(5, order=[3, 0, 4, 1, 2], busy={4, 1}), PromptQueue(), fresh_state()
    _rf_refill(fn, sampler, queue, state, 0, 0, 4, 1, f"{_rf_text(0, 0, 4, 1)}, slots 3, 0, 2 free")
    sampler.finish({4, 1})
    _rf_refill(fn, sampler, queue, state, 0, 0, 4, 1, f"{_rf_text(0, 0, 4, 1)}, group 0 has 1 answer left")
    _rf_refill(fn, sampler, queue, state, 1, 0, 4, 1, f"{_rf_text(1, 0, 4, 1)}, group 0 consumed")
    sampler.finish({3, 0, 4, 1, 2})
    _rf_refill(fn, sampler, queue, state, 1, 0, 4, 1, f"{_rf_text(1, 0, 4, 1)}, every slot free again")


@check_case("30 random generators, 40 refills each, against a simulation that lists the answers owed in order")
def _rf_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for trial in range(30):
        n_slots = int(rng.integers(1, 25))
        group_size, groups_per_batch, max_lag = (
            int(rng.integers(1, 7)),
            int(rng.integers(1, 5)),
            int(rng.integers(0, 4)),
        )
        order = [int(s) for s in rng.permutation(n_slots)]
        sampler, queue, state, consumed = FakeSampler(n_slots, order), PromptQueue(), fresh_state(), 0
        for step in range(40):
            busy = sorted(sampler.busy)
            sampler.finish({s for s in busy if rng.random() < 0.4})  # answers that ended
            if rng.random() < 0.3 and consumed + groups_per_batch <= state["next_group"]:
                consumed += groups_per_batch  # the trainer took a batch
            label = (
                f"{_rf_text(consumed, max_lag, group_size, groups_per_batch)} (random generator {trial}, refill {step})"
            )
            _rf_refill(fn, sampler, queue, state, consumed, max_lag, group_size, groups_per_batch, label)


RF_HINTS = (
    "Walk the free slots in order. A slot goes to the current group while it has answers left; when it has none, "
    "the next group is admitted only if its number is below consumed + (max_lag + 1) B, otherwise the refill "
    "stops.",
    "The dict `state` carries everything between calls: which group is being started, its prompt, how many of its "
    "answers are left, and the number the next group will get. Admitting a group means: test the bound, take one "
    "prompt, then set those four entries.",
    "Traps: testing the bound before every answer (backpressure gates new groups only: a started group must "
    "finish), taking a prompt before the group is admitted (a group held back would lose it), and a state that "
    "does not outlive the call (the generator keeps the dict it gave you).",
)

REFILL_FREE_SLOTS = Exercise(
    name=RF,
    points=15,
    title="continuous batching with backpressure: refill every free slot, admit a group only within the lag bound",
    checks=(_rf_known, _rf_straddle, _rf_oracle),
    hints=RF_HINTS,
)

EXERCISES: tuple[Exercise, ...] = (TOKEN_IS_LOSS, TOKEN_LAGS, SHARE_LOSS, INFLIGHT_DECODE, REFILL_FREE_SLOTS)
