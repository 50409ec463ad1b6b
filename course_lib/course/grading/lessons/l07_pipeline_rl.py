"""Lesson 07's graded exercises: the per-token truncated-IS loss, per-token lags, the time a
run takes to reach a reward level, and the in-flight weight swap in a decoding loop.

The learner writes:

* ``token_is_loss(logp_new, logp_behaviour, advantages, mask, c) -> scalar tensor``  (07.1-07.2)
* ``token_lags(trainer_version, versions, mask) -> [N, T] int64``  (07.4)
* ``time_to_target(times, rewards, target, window) -> float`` (seconds, ``math.inf`` if never)
* ``inflight_decode(model, cache, tokens, pos, n_steps, poll, version, generator) -> (tokens, logp, versions)``

The checks never call ``course_lib.pipeline``: they compare with the naive loops below
(one term per token, one window at a time), hand-computed values and properties. The
decoding check uses only ``TinyLM``'s full forward pass (``course_lib.lm.model``) as the
reference for log-probabilities, never the sampler.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    Exercise,
    assert_allclose,
    assert_array,
    assert_true,
    call,
    check_case,
    fail,
)
from course_lib.course.grading.helpers import assert_numpy_result, assert_raises, fail_if_known_mistake

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
) -> float:
    """``-(1/N_tok) sum_{real i,t} min(c, pi/mu) A_i log pi``, one term at a time (floats).

    The keyword switches compute known slips, to name them in messages.
    """
    lp, lm, a, m = (np.asarray(x, dtype=np.float64) for x in (logp_new, logp_behaviour, advantages, mask))
    n, t = lp.shape
    total, count = 0.0, 0
    for i in range(n):
        seq = sum(lp[i, s] - lm[i, s] for s in range(t) if m[i, s])
        for s in range(t):
            if not m[i, s]:
                continue
            log_ratio = seq if per_sequence else lp[i, s] - lm[i, s]
            ratio = math.exp(-log_ratio if inverted else log_ratio)
            w = ratio if c is None else min(c, ratio)
            total += w * a[i] * lp[i, s]
            count += 1
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
    }
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


@check_case("random batches with mixed versions, ratios crossing c, garbage in the padding")
def _loss_oracle(fn: Callable[..., Any]) -> None:
    for seed in range(6):
        _loss_compare(fn, loss_batch(seed), 1.5)


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


TOKEN_IS_LOSS = Exercise(
    name=LOSS,
    points=15,
    title="per-token truncated-IS loss for sequences with mixed versions (eq. 07.1-07.2)",
    checks=(_loss_shape, _loss_known, _loss_oracle, _loss_gradient, _loss_properties),
    hints=(
        "one weight per token, w = min(c, exp(logp_new - logp_behaviour)), computed from logp_new.detach()",
        "w = torch.clamp(torch.exp(log_ratio), max=c); m = mask.to(logp_new.dtype); "
        "loss = -(w * advantages[:, None] * logp_new * m).sum() / m.sum()",
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
    assert_raises(
        ValueError,
        fn,
        5,
        versions.copy(),
        mask.copy(),
        other_error=lambda exc: f"{LAG}(5, a version 9) raised {type(exc).__name__}; expected ValueError",
        no_error=f"{LAG}(5, a version 9) returned; expected ValueError: a token newer than the trainer is a "
        "bookkeeping bug",
    )
    _lag_compare(fn, 5, np.array([[3, 99]]), np.array([[True, False]]))


TOKEN_LAGS = Exercise(
    name=LAG,
    points=10,
    title="per-token lag of mixed-version sequences (eq. 07.4)",
    checks=(_lag_known, _lag_random, _lag_dtype, _lag_inputs, _lag_future),
    hints=(
        "every real token has its own lag: trainer_version - its version; padding gets 0",
        "v = np.asarray(versions, dtype=np.int64); m = np.asarray(mask, dtype=bool); raise ValueError if "
        "(v[m] > trainer_version).any(); return np.where(m, trainer_version - v, 0).astype(np.int64)",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: time_to_target
# ---------------------------------------------------------------------------------------

TTT = "time_to_target"


def naive_time_to_target(
    times: Any,
    rewards: Any,
    target: float,
    window: int,
    *,
    partial: bool = False,
    centred: bool = False,
    last: bool = False,
    strict: bool = False,
    index: bool = False,
    start: bool = False,
) -> float:
    """Every window averaged from scratch, one update at a time; the keyword switches compute
    known slips (partial windows at the start, a centred window, the last crossing, ``>``,
    the index instead of the time), to name them in messages."""
    t = [float(x) for x in times]
    r = [float(x) for x in rewards]
    found = math.inf
    for i in range(len(r)):
        if centred:
            lo, hi = i - window // 2, i - window // 2 + window
            if lo < 0 or hi > len(r):
                continue
        else:
            lo, hi = i - window + 1, i + 1
            if lo < 0:
                if not partial:
                    continue
                lo = 0
        mean = sum(r[lo:hi]) / (hi - lo)
        if mean > target if strict else mean >= target:
            found = float(i) if index else t[lo] if start else t[i]
            if not last:
                return found
    return found


def _ttt_compare(fn: Callable[..., Any], times: Any, rewards: Any, target: float, window: int) -> None:
    expected = naive_time_to_target(times, rewards, target, window)
    what = f"{TTT}(times, rewards of {len(rewards)} updates, target={target:g}, window={window})"
    got = call(fn, list(times) if isinstance(times, list) else np.array(times), np.array(rewards), target, window)
    if got is None:
        fail(f"{what} returned None; a target never reached is math.inf (a time that never comes)")
    try:
        value = float(got)
    except (TypeError, ValueError):
        fail(f"{what} returned {type(got).__name__}; expected a float (seconds)")
    if value == expected or (math.isinf(value) and math.isinf(expected)):
        return
    bugs = {
        "partial windows at the start are counted: one lucky first batch is not a trailing mean over "
        "`window` batches; start at i = window - 1": dict(partial=True),
        "the window is centred on the update; the trailing mean looks only backwards (batches i - window + 1 .. i)": dict(
            centred=True
        ),
        "this is the last time the mean is at or above the target; the time to target is the first": dict(last=True),
        "a mean equal to the target counts as reaching it: use >=": dict(strict=True),
        "this is the update index; return the wall-clock time of that update, times[i]": dict(index=True),
        "this is the time of the window's first update; its trailing mean is known at its last update, times[i]": dict(
            start=True
        ),
    }
    for message, slip in bugs.items():
        wrong = naive_time_to_target(times, rewards, target, window, **slip)
        if wrong != expected and (value == wrong or (math.isinf(value) and math.isinf(wrong))):
            fail(message)
    fail(f"{what} = {value:g}; expected {expected:g}")


@check_case("hand-computed: a lucky first batch does not count, a rise does")
def _ttt_known(fn: Callable[..., Any]) -> None:
    times = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    rewards = [1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    _ttt_compare(fn, times, rewards, 0.75, 2)  # 60
    _ttt_compare(fn, [10.0, 20.0, 30.0, 40.0], [0.5, 0.5, 0.0, 1.0], 0.5, 2)  # 20: equal counts
    _ttt_compare(fn, times, rewards, 1.0, 1)  # 10: a window of one batch
    _ttt_compare(fn, [1.5, 2.0, 4.5, 7.0], [0.2, 0.4, 0.6, 0.6], 0.5, 2)  # 4.5: uneven times


@check_case("random reward curves at several targets and windows, against a loop over full windows")
def _ttt_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for _ in range(12):
        n = int(rng.integers(8, 40))
        times = np.cumsum(rng.uniform(0.1, 2.0, size=n)).round(3)
        rewards = (np.linspace(0.1, 0.6, n) + rng.normal(0, 0.15, size=n)).round(2)
        for window in (1, 3, 5):
            for target in (0.2, 0.4, float(rewards[window - 1 :].max()) - 0.01):
                _ttt_compare(fn, times, rewards, target, window)


@check_case("never reached gives math.inf; a higher target is never reached sooner; a time shift shifts it")
def _ttt_properties(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.uniform(0.5, 1.5, size=30))
    rewards = np.clip(np.linspace(0.0, 0.8, 30) + rng.normal(0, 0.1, size=30), 0, 1)
    got = call(fn, times.copy(), rewards.copy(), 2.0, 4)
    assert_true(
        got is not None and math.isinf(float(got)) and float(got) > 0,
        f"{TTT} returned {got!r} for a target above every reward; expected math.inf",
    )
    previous = -math.inf
    for target in np.linspace(0.0, 0.7, 8):
        value = float(call(fn, times.copy(), rewards.copy(), float(target), 4))
        assert_true(
            value >= previous,
            f"{TTT} reached target {target:.2f} at {value:g} s, before a lower target ({previous:g} s)",
        )
        previous = value
    base = float(call(fn, times.copy(), rewards.copy(), 0.4, 3))
    shifted = float(call(fn, times + 100.0, rewards.copy(), 0.4, 3))
    assert_true(
        math.isclose(shifted, base + 100.0),
        f"{TTT}: adding 100 s to every time moved the answer from {base:g} to {shifted:g}; "
        "return the time of the update, times[i]",
    )


TIME_TO_TARGET = Exercise(
    name=TTT,
    points=10,
    title="wall-clock time to a reward level, from a run's reward-vs-time curve",
    checks=(_ttt_known, _ttt_oracle, _ttt_properties),
    hints=(
        "average each full window of `window` batch rewards (the first ends at update window - 1); "
        "return times[i] of the first window whose mean is >= target, math.inf if none",
        'means = np.convolve(rewards, np.ones(window) / window, mode="valid"); '
        "hits = np.flatnonzero(means >= target); return math.inf if hits.size == 0 else "
        "float(times[hits[0] + window - 1])",
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


def _decode(
    fn: Callable[..., Any], schedule: dict[int, tuple[int, Any]], version: int = 0, seed: int = 0, global_seed: int = 0
) -> tuple[Any, ...]:
    """Prefill 3 sequences, run the learner's loop with ``poll`` returning ``schedule[call]``;
    returns (model, cache before, cache after, prefix, outputs, poll calls)."""
    import torch

    model, _ = _lm_pair()
    prefix = torch.randint(0, 11, (3, N_PREFIX), generator=torch.Generator().manual_seed(seed))
    cache = model.new_cache(3)
    with torch.no_grad():
        for p in range(N_PREFIX - 1):
            model.step(prefix[:, p], torch.full((3,), p), cache)
    before = (cache[0].clone(), cache[1].clone())
    torch.manual_seed(global_seed)  # torch's global random state must not matter: `generator` decides
    calls: list[int] = []

    def poll() -> Any:
        calls.append(len(calls))
        return schedule.get(len(calls) - 1)

    out = call(
        fn,
        model,
        cache,
        prefix[:, -1].clone(),
        torch.full((3,), N_PREFIX - 1),
        N_STEPS,
        poll,
        version,
        torch.Generator().manual_seed(seed),
    )
    if not (isinstance(out, tuple) and len(out) == 3):
        fail(f"{DEC} returned {type(out).__name__}; expected a tuple (new_tokens, logp, versions)")
    for name, x in zip(("new_tokens", "logp", "versions"), out):
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (3, N_STEPS):
            fail(f"{DEC}'s {name} is not a [B, n_steps] = [3, {N_STEPS}] torch tensor")
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
    from course_lib.runtime.weights import flat_parameters

    _, newer = _lm_pair()
    _, _, _, _, (tokens, logp, versions), _ = _decode(fn, {SWAP_AT: (2, flat_parameters(newer))}, version=3)
    _, _, _, _, (plain, _, _), _ = _decode(fn, {}, version=3)
    assert_true(
        bool((versions == 3).all()) and bool((tokens == plain).all()),
        f"{DEC} loaded version 2 while holding version 3: load only versions newer than the one held",
    )
    assert_true(not logp.requires_grad, f"{DEC}'s logp requires grad: decode under torch.no_grad()")


INFLIGHT_DECODE = Exercise(
    name=DEC,
    points=15,
    title="a decoding loop that swaps in new weights between steps, keeping the KV cache",
    checks=(_dec_no_update, _dec_versions, _dec_keeps_cache, _dec_older),
    hints=(
        "before each step: update = poll(); if it is newer than `version`, load_flat_parameters(model, flat) and "
        "remember the new version; never touch the cache",
        "logp = torch.log_softmax(model.step(tokens, pos, cache), -1); tokens = torch.multinomial(logp.exp(), 1, "
        "generator=generator).squeeze(1); record logp.gather(1, tokens[:, None]).squeeze(1); pos = pos + 1",
    ),
)

EXERCISES: tuple[Exercise, ...] = (TOKEN_IS_LOSS, TOKEN_LAGS, TIME_TO_TARGET, INFLIGHT_DECODE)
