"""Lesson 03's graded exercises: V-trace targets, clipped policy-gradient advantages,
one step of the learner over the shared-memory rollout slots, and one unroll of an actor.

The learner writes:

* ``vtrace_targets(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0) -> vs [T, B]``  (03.2-03.3)
* ``pg_advantages(log_rhos, discounts, rewards, values, vs, bootstrap_value, pg_rho_bar=1.0) -> [T, B]``  (03.4)
* ``learner_step(slots, full, free_queue, learner, weights) -> lags [len(full) * B]``
* ``actor_unroll(envs, policy, obs, slot, version, generator) -> next obs``

What each exercise teaches, and how its checks observe it:

* ``vtrace_targets``, mechanism: the truncated-importance-weighted backward recursion (03.3), rho_bar on the
  TD error and c_bar on the trace, cut by each step's own discount; observed: the paper's double sum on inputs
  whose ratios cross both thresholds, several (rho_bar, c_bar), a different gamma_t at every step, two episodes
  in one trajectory, columns apart, and a 200,000-step trajectory within a time limit (checked by the recursion's
  identity): one O(T) pass, which any O(T^2) form of the double sum, loops or a [T, T] array, cannot meet. The
  long trajectory is one episode with gamma_t = 1, c_bar = 1 and every ratio >= 1, so every trace product is 1:
  a double sum whose inner loop stops once the product reaches 0 (exact) cannot stop early.
* ``pg_advantages``, mechanism: the one-step look-ahead with the next V-trace target, weighted by the ratio
  truncated at pg_rho_bar alone; observed: an element-by-element oracle over several thresholds and per-step
  discounts, episode ends.
* ``learner_step``, mechanism: the learner's half of the slot protocol: copy the full slots out of shared
  memory, hand them back before learning (acting and learning overlap), measure each column's lag from its
  oldest version at the version that learns, refuse a future version before learning, publish the updated
  model with the new version; observed: fakes that log the order of events, a free queue that refills a slot
  the moment it is freed (so a batch that is still a view changes), the batch the update receives, what is
  published and when.
* ``actor_unroll``, mechanism: one unroll written in place into a shared-memory slot: the observation acted on,
  an action sampled from the policy with the given generator, log mu, the version, done = terminated or
  truncated, the bootstrap observation, with autograd off; observed: a fake vector env that logs every
  transition and ends episodes both ways, the slot tensors' identity, the action frequencies, two generators
  seeded alike, the policy's grad mode at every call.

The checks never call the course's implementations (``course_lib.rl.vtrace.vtrace``,
``course_lib.actor_learner``): they compare with deliberately naive oracles that mirror
the paper's formula term by term (``course_lib.rl.vtrace.vtrace_naive``, an explicit O(T^2)
double sum with an explicit product per term; the ones below), with hand-computed values,
with properties, on inputs whose ratios cross both clip thresholds, and with fakes that
record what the learner's code did.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    CheckTimeout,
    Exercise,
    LearnerError,
    assert_allclose,
    assert_array,
    assert_finite,
    assert_inputs_unchanged,
    assert_true,
    call,
    check_case,
    fail,
    time_limit,
)
from course_lib.course.grading.helpers import (
    assert_numpy_result,
    call_on_copies,
    call_text,
    fail_if_known_mistake,
    torch_seeded,
)
from course_lib.rl.vtrace import vtrace_naive

LESSON = "03_impala_vtrace"

# ---------------------------------------------------------------------------------------
# Oracles: naive, formula-mirroring implementations
# ---------------------------------------------------------------------------------------


def naive_pg_advantages(
    log_rhos: Any,
    discounts: Any,
    rewards: Any,
    values: Any,
    vs: Any,
    bootstrap_value: Any,
    pg_rho_bar: float | None = 1.0,
) -> NDArray[np.float64]:
    """The advantages of eq. 03.4 (``pg_rho_bar=None``: untruncated), element by element."""
    lr = np.asarray(log_rhos, dtype=np.float64)
    n_t, n_b = lr.shape
    out = np.zeros((n_t, n_b))
    for s in range(n_t):
        for b in range(n_b):
            ratio = math.exp(float(lr[s, b]))
            weight = ratio if pg_rho_bar is None else min(pg_rho_bar, ratio)
            v_next = float(np.asarray(vs)[s + 1, b]) if s + 1 < n_t else float(np.asarray(bootstrap_value)[b])
            out[s, b] = weight * (
                float(np.asarray(rewards)[s, b])
                + float(np.asarray(discounts)[s, b]) * v_next
                - float(np.asarray(values)[s, b])
            )
    return out


def naive_nstep_return(discounts: Any, rewards: Any, bootstrap_value: Any) -> NDArray[np.float64]:
    """``G_s = sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i) r_t + (prod_{i=s}^{T-1} gamma_i) V(x_T)``."""
    disc = np.asarray(discounts, dtype=np.float64)
    r = np.asarray(rewards, dtype=np.float64)
    n_t, n_b = r.shape
    out = np.zeros((n_t, n_b))
    for b in range(n_b):
        for s in range(n_t):
            total, product = 0.0, 1.0
            for t in range(s, n_t):
                total += product * float(r[t, b])
                product *= float(disc[t, b])
            out[s, b] = total + product * float(np.asarray(bootstrap_value)[b])
    return out


def random_trajectory(
    seed: int, n_t: int, n_b: int, gamma: float | None = None, p_done: float = 0.2, spread: float = 0.8
) -> dict[str, NDArray[np.float64]]:
    """Seeded V-trace inputs; ``log_rhos ~ N(0, spread^2)``, so ratios fall on both sides of 1
    (and of thresholds like 0.8 and 1.5); discounts are 0 where an episode ended, and
    ``gamma`` elsewhere, or (``gamma=None``) a different gamma_t in [0.5, 1] at every step, so
    that an implementation reading them as one gamma times "not done" shows."""
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(scale=spread, size=(n_t, n_b))
    log_rhos.flat[0] = math.log(3.0)  # at least one ratio far above every threshold
    log_rhos.flat[-1] = math.log(0.3)  # and one far below
    gammas = np.round(rng.uniform(0.5, 1.0, size=(n_t, n_b)), 3) if gamma is None else np.full((n_t, n_b), gamma)
    return {
        "log_rhos": log_rhos,
        "discounts": np.where(rng.random((n_t, n_b)) > p_done, gammas, 0.0),
        "rewards": np.round(rng.normal(size=(n_t, n_b)), 3),
        "values": np.round(rng.normal(size=(n_t, n_b)), 3),
        "bootstrap_value": np.round(rng.normal(size=n_b), 3),
    }


def _compare(
    got: Any, expected: NDArray[np.float64], known_bugs: Callable[[], dict[str, NDArray[np.float64]]], what: str
) -> None:
    """``got`` must equal ``expected``; if it equals what a known bug returns instead, name the bug."""
    arr = assert_array(got, what=what, shape=expected.shape)
    if arr.dtype.kind in "biuf" and not np.allclose(arr.astype(np.float64), expected, rtol=1e-6, atol=1e-8):
        fail_if_known_mistake(arr, known_bugs(), expected=expected)
    assert_allclose(arr, expected, what=what)


def _unchanged(fn: Callable[..., Any], name: str, data: dict[str, Any], keys: tuple[str, ...]) -> None:
    """Call ``fn`` on copies of ``data[keys]`` and require the copies unchanged afterwards."""
    assert_inputs_unchanged(fn, name, advice="work on copies", **{k: data[k] for k in keys})


def _float_array(got: Any, what: str, shape: tuple[int, ...]) -> None:
    arr = assert_array(got, what=what, shape=shape)
    assert_true(arr.dtype.kind == "f", f"{what} has dtype {arr.dtype}; expected float64")


# ---------------------------------------------------------------------------------------
# Exercise 1: vtrace_targets
# ---------------------------------------------------------------------------------------

VT = "vtrace_targets"
VT_ARGS = ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")


def _vt(fn: Callable[..., Any], data: dict[str, Any], **kw: Any) -> Any:
    return call_on_copies(fn, *(data[k] for k in VT_ARGS), **kw)


def _vt_what(data: dict[str, Any], **kw: Any) -> str:
    return call_text(VT, f"inputs of shape {tuple(np.shape(data['log_rhos']))}", **kw)


def _naive(data: dict[str, Any], rho_bar: float | None, c_bar: float | None, **bug: bool) -> NDArray[np.float64]:
    """The oracle's targets on ``data`` (``bug``: ``inclusive`` / ``trace_discount``, see :func:`vtrace_naive`)."""
    log_rhos, discounts, rewards, values, bootstrap = (data[k] for k in VT_ARGS)
    return vtrace_naive(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, **bug)


#: The message for discounts read as one gamma times "not done" (right only when every gamma_t is equal).
ONE_GAMMA = (
    "discounts[t] is the step's own gamma_t (it may differ from step to step, 0 where an episode ended): use "
    "the array as given, not one gamma times (discounts > 0)"
)


def one_gamma(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` with its discounts replaced by one gamma (their maximum) where they are not 0."""
    d = np.asarray(data["discounts"], dtype=np.float64)
    return {**data, "discounts": d.max() * (d > 0)}


def _vt_known_bugs(data: dict[str, Any], rho_bar: float, c_bar: float) -> dict[str, NDArray[np.float64]]:
    """What some plausible wrong answers return on ``data``, keyed by the message naming the bug."""
    zero_boot = {**data, "bootstrap_value": np.zeros_like(data["bootstrap_value"])}
    return {
        "the trace product includes c_t of the term itself: it runs over i = s .. t-1, "
        "so the term t = s has product 1": _naive(data, rho_bar, c_bar, inclusive=True),
        "rho_bar and c_bar are swapped: rho_t = min(rho_bar, ratio) weighs delta_t, c_i = min(c_bar, ratio) "
        "weighs the trace": _naive(data, c_bar, rho_bar),
        "the ratios are not truncated: use min(rho_bar, exp(log_rhos)) and min(c_bar, exp(log_rhos))": _naive(
            data, None, None
        ),
        "the bootstrap value V(x_T) is ignored: V(x_{t+1}) at the last step is bootstrap_value": _naive(
            zero_boot, rho_bar, c_bar
        ),
        "the trace ignores the discounts: acc = delta_t + gamma_t * c_t * acc, so that an episode end "
        "(gamma_t = 0) cuts it": _naive(data, rho_bar, c_bar, trace_discount=False),
        "the result is v_s - V(x_s); add V(x_s) to get the target v_s": _naive(data, rho_bar, c_bar)
        - np.asarray(data["values"]),
        ONE_GAMMA: _naive(one_gamma(data), rho_bar, c_bar),
    }


def _vt_compare(
    fn: Callable[..., Any], data: dict[str, Any], rho_bar: float = 1.0, c_bar: float = 1.0, what: str = ""
) -> None:
    expected = _naive(data, rho_bar, c_bar)
    _compare(
        _vt(fn, data, rho_bar=rho_bar, c_bar=c_bar),
        expected,
        lambda: _vt_known_bugs(data, rho_bar, c_bar),
        what or _vt_what(data, rho_bar=rho_bar, c_bar=c_bar),
    )


@check_case("returns a float numpy array of shape [T, B]")
def _vt_shape(fn: Callable[..., Any]) -> None:
    data = random_trajectory(0, 5, 3)
    _float_array(_vt(fn, data), _vt_what(data), (5, 3))


@check_case("hand-computed two-step example (ratios 2 and 0.5)")
def _vt_known(fn: Callable[..., Any]) -> None:
    # rho = c = [min(1, 2), min(1, 0.5)] = [1, 0.5]
    # delta_1 = 0.5 * (2 + 0.9 * 3 - 1) = 1.85;  v_1 = 1 + 1.85 = 2.85
    # delta_0 = 1 * (1 + 0.9 * 1 - 0.5) = 1.4;   v_0 = 0.5 + 1.4 + 0.9 * 1 * 1.85 = 3.565
    data = {
        "log_rhos": np.log([[2.0], [0.5]]),
        "discounts": np.array([[0.9], [0.9]]),
        "rewards": np.array([[1.0], [2.0]]),
        "values": np.array([[0.5], [1.0]]),
        "bootstrap_value": np.array([3.0]),
    }
    _vt_compare(fn, data)
    assert_allclose(_vt(fn, data), [[3.565], [2.85]], what=_vt_what(data))


@check_case("on-policy (all ratios 1) gives the n-step bootstrapped return")
def _vt_on_policy(fn: Callable[..., Any]) -> None:
    data = random_trajectory(1, 7, 4)
    data["log_rhos"] = np.zeros((7, 4))
    expected = naive_nstep_return(data["discounts"], data["rewards"], data["bootstrap_value"])
    single = one_gamma(data)
    _compare(
        _vt(fn, data),
        expected,
        lambda: {ONE_GAMMA: naive_nstep_return(single["discounts"], data["rewards"], data["bootstrap_value"])},
        _vt_what(data) + " with all log_rhos = 0",
    )


@check_case("matches the paper's formula on random inputs crossing both thresholds")
def _vt_oracle(fn: Callable[..., Any]) -> None:
    for case, (n_t, n_b, rho_bar, c_bar) in enumerate([(6, 3, 1.0, 1.0), (9, 2, 1.5, 0.8), (4, 5, 2.0, 0.5)]):
        data = random_trajectory(10 + case, n_t, n_b)
        _vt_compare(
            fn,
            data,
            rho_bar,
            c_bar,
            what=f"random case {case + 1} (T={n_t}, B={n_b}, rho_bar={rho_bar:g}, c_bar={c_bar:g})",
        )


@check_case("rho_bar and c_bar act where the equation puts them")
def _vt_thresholds(fn: Callable[..., Any]) -> None:
    data = random_trajectory(20, 8, 3, spread=1.2)
    _vt_compare(fn, data, rho_bar=3.0, c_bar=0.3)


@check_case("a trajectory holding two episodes equals the two computed apart")
def _vt_episodes(fn: Callable[..., Any]) -> None:
    data = random_trajectory(30, 8, 2, p_done=0.0)
    data["discounts"][4] = 0.0  # both episodes end at step 4
    whole = assert_array(_vt(fn, data), what=_vt_what(data), shape=(8, 2))
    first = {k: v[:5] for k, v in data.items() if k != "bootstrap_value"}
    first["bootstrap_value"] = np.array([123.0, -45.0])  # unused: the episode ended at its last step
    second = {k: v[5:] for k, v in data.items() if k != "bootstrap_value"}
    second["bootstrap_value"] = data["bootstrap_value"]
    assert_allclose(_vt(fn, first), whole[:5], what="the first episode computed alone, compared with steps 0-4")
    assert_allclose(_vt(fn, second), whole[5:], what="the second episode computed alone, compared with steps 5-7")


@check_case("columns are independent (batch and no batch agree)")
def _vt_columns(fn: Callable[..., Any]) -> None:
    data = random_trajectory(40, 6, 4)
    together = assert_array(_vt(fn, data), what=_vt_what(data), shape=(6, 4))
    for b in range(4):
        alone = {k: (v[:, b : b + 1] if v.ndim == 2 else v[b : b + 1]) for k, v in data.items()}
        assert_allclose(_vt(fn, alone), together[:, b : b + 1], what=f"column {b} computed alone")


#: The long trajectory, T steps of B columns: the backward recursion (03.3) is one numpy loop of T [B]-sized
#: steps (about a second); the double sum of (03.2) is T^2 B / 2 = 4 * 10^10 terms, and a vectorised one
#: builds a [T, T] array (320 GB in float64). It is one episode (no gamma_t = 0), gamma_t = 1, c_bar = 1 and
#: every ratio >= 1, so every trace product gamma_s c_s ... gamma_t-1 c_t-1 is exactly 1: a double sum that
#: breaks its inner loop when the product reaches 0 (or gets small) still does all T^2 / 2 terms.
LONG_T, LONG_B = 200_000, 2
#: Seconds the long trajectory may take: below every check's time limit, so that this check, not the
#: runner's timeout, says why.
LONG_S = 8.0
#: The message for any O(T^2) form of the targets (too slow, or too large to allocate).
QUADRATIC = (
    "O(T^2): the double sum of (03.2); use the backward recursion (03.3), one pass from t = T - 1 down to 0 "
    "writing into a preallocated [T, B] array"
)


#: The thresholds of the long trajectory: c_bar = 1 with every ratio >= 1 makes every c_t exactly 1.
LONG_RHO_BAR, LONG_C_BAR = 1.2, 1.0


def long_trajectory() -> dict[str, NDArray[np.float64]]:
    """The long case's inputs: one episode (no gamma_t = 0), gamma_t = 1, every ratio >= 1."""
    data = random_trajectory(60, LONG_T, LONG_B, gamma=1.0, p_done=0.0)
    data["log_rhos"] = np.abs(data["log_rhos"])
    return data


@check_case(f"one backward pass (03.3): a trajectory of T = {LONG_T:,} steps, B = {LONG_B}, within {LONG_S:g} s")
def _vt_long(fn: Callable[..., Any]) -> None:
    data = long_trajectory()
    rho_bar, c_bar = LONG_RHO_BAR, LONG_C_BAR
    what = f"{VT}(inputs of shape ({LONG_T}, {LONG_B}), rho_bar={rho_bar:g}, c_bar={c_bar:g})"
    try:
        with time_limit(LONG_S):
            got = _vt(fn, data, rho_bar=rho_bar, c_bar=c_bar)
    except CheckTimeout:
        fail(f"{what} did not finish within {LONG_S:g} s: {QUADRATIC}")
    except LearnerError as exc:
        if not isinstance(exc.error, MemoryError):
            raise
        fail(f"{what} ran out of memory: {QUADRATIC}")
    vs = assert_array(got, what=what, shape=(LONG_T, LONG_B)).astype(np.float64)
    assert_finite(vs, what=what)
    # the recursion's identity at every step: v_s - V(x_s) - gamma_s c_s (v_{s+1} - V(x_{s+1})) = delta_s V
    rhos = np.exp(data["log_rhos"])
    values, boot = data["values"], data["bootstrap_value"][None]
    values_tp1 = np.concatenate([values[1:], boot])
    deltas = np.minimum(rho_bar, rhos) * (data["rewards"] + data["discounts"] * values_tp1 - values)
    carried = data["discounts"] * np.minimum(c_bar, rhos) * (np.concatenate([vs[1:], boot]) - values_tp1)
    assert_allclose(
        vs - values - carried,
        deltas,
        what=f"v_s - V(x_s) - gamma_s c_s (v_s+1 - V(x_s+1)) on {what} (it must equal delta_s V, eq. 03.3)",
        rtol=1e-6,
        atol=1e-6,
    )


@check_case("does not modify its inputs")
def _vt_inputs(fn: Callable[..., Any]) -> None:
    _unchanged(fn, VT, random_trajectory(50, 5, 2), VT_ARGS)


VTRACE_TARGETS = Exercise(
    name=VT,
    points=15,
    title="V-trace value targets v_s with truncated rho and c (eq. 03.2-03.3)",
    checks=(
        _vt_shape,
        _vt_known,
        _vt_on_policy,
        _vt_oracle,
        _vt_thresholds,
        _vt_episodes,
        _vt_columns,
        _vt_long,
        _vt_inputs,
    ),
    hints=(
        "V-trace is a backward recursion like the discounted return (eq. 03.3): each target is the value estimate "
        "plus a correction that accumulates the clipped TD errors of the steps ahead, shrunk by the discounts and the "
        "traces.",
        "First, for every step at once: the ratios (the exponential of `log_rhos`), clipped twice (at `rho_bar` to "
        "weigh the TD errors, at `c_bar` for the traces), the next-state values (`values` shifted by one step, with "
        "`bootstrap_value` after the last) and the TD errors. Then one loop backwards from `T - 1`, with a running "
        "correction that starts at 0.",
        "`np.minimum` clips and `np.concatenate` shifts (give `bootstrap_value` a leading axis of length 1). In the "
        "loop, the correction is this step's TD error plus discount times trace times the correction carried from the "
        "step after; the target is `values[t]` plus it. Traps: `rho_bar` in the trace, and the unclipped ratio in the "
        "TD error.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: pg_advantages
# ---------------------------------------------------------------------------------------

PG = "pg_advantages"
PG_ARGS = ("log_rhos", "discounts", "rewards", "values", "vs", "bootstrap_value")


def _pg_data(seed: int, n_t: int, n_b: int, spread: float = 0.8) -> dict[str, Any]:
    data = random_trajectory(seed, n_t, n_b, spread=spread)
    data["vs"] = np.round(np.random.default_rng(seed + 1).normal(size=(n_t, n_b)), 3)
    return data


def _pg(fn: Callable[..., Any], data: dict[str, Any], **kw: Any) -> Any:
    return call_on_copies(fn, *(data[k] for k in PG_ARGS), **kw)


def _pg_what(data: dict[str, Any], **kw: Any) -> str:
    return call_text(PG, f"inputs of shape {tuple(np.shape(data['log_rhos']))}", **kw)


def _naive_pg(data: dict[str, Any], pg_rho_bar: float | None) -> NDArray[np.float64]:
    """:func:`naive_pg_advantages` on the ``PG_ARGS`` of ``data``."""
    log_rhos, discounts, rewards, values, vs, bootstrap = (data[k] for k in PG_ARGS)
    return naive_pg_advantages(log_rhos, discounts, rewards, values, vs, bootstrap, pg_rho_bar)


def _pg_known_bugs(data: dict[str, Any], pg_rho_bar: float) -> dict[str, NDArray[np.float64]]:
    d = data
    n_t = d["vs"].shape[0]
    shifted_values = {**d, "vs": np.concatenate([d["values"][1:], d["values"][-1:]])}
    vs_now = np.asarray(d["vs"])
    return {
        "the advantage bootstraps from V(x_{s+1}); use the V-trace target v_{s+1} (vs[s + 1], "
        "bootstrap_value at the last step)": _naive_pg(shifted_values, pg_rho_bar),
        "the advantage uses v_s; it needs the next target v_{s+1}": np.minimum(pg_rho_bar, np.exp(d["log_rhos"]))
        * (d["rewards"] + d["discounts"] * vs_now - d["values"]),
        "the ratio is not truncated: weigh by min(pg_rho_bar, exp(log_rhos))": _naive_pg(d, None),
        "the ratio is missing: weigh each step by min(pg_rho_bar, pi/mu)": _naive_pg(
            {**d, "log_rhos": np.zeros_like(d["log_rhos"])}, pg_rho_bar
        ),
        "gamma_s is missing: discount v_{s+1} by discounts[s], so that an episode end cuts it": _naive_pg(
            {**d, "discounts": np.ones_like(d["discounts"])}, pg_rho_bar
        ),
        "the baseline subtracted is v_s; subtract the value estimate V(x_s)": _naive_pg(
            {**d, "values": vs_now}, pg_rho_bar
        )
        if n_t
        else vs_now,
        ONE_GAMMA: _naive_pg(one_gamma(d), pg_rho_bar),
    }


def _pg_compare(fn: Callable[..., Any], data: dict[str, Any], pg_rho_bar: float = 1.0, what: str = "") -> None:
    expected = _naive_pg(data, pg_rho_bar)
    _compare(
        _pg(fn, data, pg_rho_bar=pg_rho_bar),
        expected,
        lambda: _pg_known_bugs(data, pg_rho_bar),
        what or _pg_what(data, pg_rho_bar=pg_rho_bar),
    )


@check_case("returns a float numpy array of shape [T, B]")
def _pg_shape(fn: Callable[..., Any]) -> None:
    data = _pg_data(0, 5, 3)
    _float_array(_pg(fn, data), _pg_what(data), (5, 3))


@check_case("hand-computed two-step example (ratios 2 and 0.5)")
def _pg_known(fn: Callable[..., Any]) -> None:
    # A_0 = min(1, 2) * (1 + 0.9 * v_1 - V_0) = 1 * (1 + 0.9 * 2.85 - 0.5) = 3.065
    # A_1 = min(1, 0.5) * (2 + 0.9 * V(x_2) - V_1) = 0.5 * (2 + 2.7 - 1) = 1.85
    data = {
        "log_rhos": np.log([[2.0], [0.5]]),
        "discounts": np.array([[0.9], [0.9]]),
        "rewards": np.array([[1.0], [2.0]]),
        "values": np.array([[0.5], [1.0]]),
        "vs": np.array([[3.565], [2.85]]),
        "bootstrap_value": np.array([3.0]),
    }
    _pg_compare(fn, data)
    assert_allclose(_pg(fn, data), [[3.065], [1.85]], what=_pg_what(data))


@check_case("matches A_s = min(pg_rho_bar, pi/mu) (r_s + gamma_s v_{s+1} - V(x_s)) on random inputs")
def _pg_oracle(fn: Callable[..., Any]) -> None:
    for case, (n_t, n_b, bar) in enumerate([(6, 3, 1.0), (9, 2, 1.5), (4, 5, 0.7)]):
        _pg_compare(
            fn,
            _pg_data(10 + case, n_t, n_b),
            bar,
            what=f"random case {case + 1} (T={n_t}, B={n_b}, pg_rho_bar={bar:g})",
        )


@check_case("pg_rho_bar truncates the ratio (and only pg_rho_bar)")
def _pg_threshold(fn: Callable[..., Any]) -> None:
    data = _pg_data(20, 8, 3, spread=1.5)
    for bar in (0.5, 4.0):
        _pg_compare(fn, data, bar)


@check_case("the discount is 0 at an episode end: A_s = rho (r_s - V(x_s)) there")
def _pg_episode_end(fn: Callable[..., Any]) -> None:
    data = _pg_data(30, 5, 2)
    data["discounts"] = np.full((5, 2), 0.9)
    data["discounts"][2] = 0.0
    data["discounts"][4] = 0.0
    got = assert_array(_pg(fn, data), what=_pg_what(data), shape=(5, 2))
    rho = np.minimum(1.0, np.exp(data["log_rhos"]))
    for t in (2, 4):
        assert_allclose(
            got[t],
            rho[t] * (data["rewards"][t] - data["values"][t]),
            what=f"the advantage at step {t}, where both episodes ended",
        )
    _pg_compare(fn, data)


@check_case("does not modify its inputs")
def _pg_inputs(fn: Callable[..., Any]) -> None:
    _unchanged(fn, PG, _pg_data(40, 5, 2), PG_ARGS)


PG_ADVANTAGES = Exercise(
    name=PG,
    points=10,
    title="clipped policy-gradient advantages of V-trace (eq. 03.4)",
    checks=(_pg_shape, _pg_known, _pg_oracle, _pg_threshold, _pg_episode_end, _pg_inputs),
    hints=(
        "The policy-gradient advantage looks one step ahead with the V-trace targets instead of the value estimates: "
        "the reward plus the discounted next target, minus the current value estimate, weighted by a clipped "
        "importance ratio.",
        "The next target of step s is `vs[s + 1]`, and `bootstrap_value` at the last step: shift the targets by one "
        "as in exercise 1. The weight is the ratio clipped at `pg_rho_bar` (not `rho_bar`).",
        "No loop is needed: `np.concatenate` for the shift, `np.minimum` for the clip, `np.exp` of `log_rhos`; "
        "subtract `values` (the estimates V(x_s)), not `vs`. Convert every input to float64 first.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: learner_step
# ---------------------------------------------------------------------------------------

LS = "learner_step"
#: The fields of a rollout slot (``course_lib.actor_learner.buffers``' layout): dtype and shape after [T(+1), B].
SLOT_FIELDS = ("obs", "actions", "behaviour_logp", "rewards", "dones", "versions")
#: What the fake actor writes into a slot the moment it is freed (it refills it at once).
REFILL_VERSION = 1_000_000


class LearnerEvents:
    """What the fakes saw, in order: ``("free", index)``, ``("update", version_before)``,
    ``("publish", version, model_is_learners)``; the batch the update received (copied when
    it arrived) and the slots already free then."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.batch: dict[str, Any] | None = None
        self.batch_type = ""
        self.freed_at_update: list[int] = []

    def kinds(self) -> list[str]:
        return [e[0] for e in self.log]

    def freed(self) -> list[int]:
        return [e[1] for e in self.log if e[0] == "free"]


class FakeFreeQueue:
    """The actors' free queue. ``put(index)`` records the index and refills that slot at once,
    as an actor waiting for a free slot does: every field is overwritten (a version of
    :data:`REFILL_VERSION`, NaN rewards), so a batch that still points at the slot changes."""

    def __init__(self, slots: dict[str, Any], events: LearnerEvents) -> None:
        self.slots, self.events = slots, events

    def put(self, index: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(index, int | np.integer) and not (hasattr(index, "ndim") and index.ndim == 0):
            raise TypeError(f"free_queue.put takes one slot index (an int), got {type(index).__name__}")
        i = int(index)
        self.events.log.append(("free", i))
        if 0 <= i < len(self.slots["versions"]):
            for name, tensor in self.slots.items():
                fill = {"versions": REFILL_VERSION, "rewards": float("nan"), "dones": True}.get(name, -7)
                tensor[i] = fill

    put_nowait = put


class FakeLearner:
    """The learner: ``version``, ``model`` and ``update(batch)``, which records a copy of the
    batch and the slots already free, then increments the version (one gradient step)."""

    def __init__(self, version: int, events: LearnerEvents) -> None:
        self.version, self.events = version, events
        self.model = object()  # what publish must be handed: the learner's (updated) model

    def update(self, batch: Any) -> dict[str, float]:
        self.events.log.append(("update", self.version))
        self.events.batch_type = type(batch).__name__
        if isinstance(batch, Mapping):
            self.events.batch = {k: np.array(np.asarray(v), copy=True) for k, v in batch.items()}
        self.events.freed_at_update = self.events.freed()
        self.version += 1
        return {"loss": 0.0}


class FakeWeights:
    """The published weights: ``publish(model, version)`` records what was published and when."""

    def __init__(self, learner: FakeLearner, events: LearnerEvents) -> None:
        self.learner, self.events = learner, events

    def publish(self, model: Any, version: Any) -> None:
        self.events.log.append(("publish", int(version), model is self.learner.model))


def _ls_slots(seed: int, n_slots: int, n_t: int, n_b: int, versions: dict[int, Any]) -> dict[str, Any]:
    """``n_slots`` filled slots of ``T = n_t`` steps of ``n_b`` envs (torch tensors, as shared
    memory holds them); slot ``i``'s versions are ``versions[i]`` (a number or a ``[T, B]`` array)."""
    import torch

    rng = np.random.default_rng(seed)
    vers = np.zeros((n_slots, n_t, n_b), np.int64)
    for i, v in versions.items():
        vers[i] = v
    return {
        "obs": torch.as_tensor(rng.normal(size=(n_slots, n_t + 1, n_b, 3)).astype(np.float32)),
        "actions": torch.as_tensor(rng.integers(0, 2, (n_slots, n_t, n_b))),
        "behaviour_logp": torch.as_tensor(-rng.random((n_slots, n_t, n_b)).astype(np.float32)),
        "rewards": torch.as_tensor(rng.normal(size=(n_slots, n_t, n_b)).astype(np.float32)),
        "dones": torch.as_tensor(rng.random((n_slots, n_t, n_b)) < 0.2),
        "versions": torch.as_tensor(vers),
    }


class LearnerRun(NamedTuple):
    """One call of the learner's step with fakes: what it returned and what the fakes saw."""

    got: Any
    events: LearnerEvents
    before: dict[str, NDArray[Any]]
    learner: FakeLearner
    what: str


def _ls_run(
    fn: Callable[..., Any], full: list[int], version: int, versions: dict[int, Any], n_slots: int = 4, seed: int = 0
) -> LearnerRun:
    slots = _ls_slots(seed, n_slots, 5, 2, versions)
    before = {k: t.numpy().copy() for k, t in slots.items()}
    events = LearnerEvents()
    learner = FakeLearner(version, events)
    what = f"{LS}(slots, full={full}, ...) with learner.version = {version}"
    try:
        got = call(fn, slots, list(full), FakeFreeQueue(slots, events), learner, FakeWeights(learner, events))
    except LearnerError as err:
        if isinstance(err.error, ValueError) and events.freed():
            fail(
                f"{what} raised ValueError after freeing slots {events.freed()}: it read the "
                f"versions of slots an actor had already refilled (version {REFILL_VERSION}); read everything from "
                "the batch copied before the slots were freed"
            )
        raise
    return LearnerRun(got, events, before, learner, what)


def _ls_expected_batch(before: dict[str, NDArray[Any]], full: list[int]) -> dict[str, NDArray[Any]]:
    """The full slots side by side along the environment axis (axis 1 of a slot), one loop per field."""
    return {name: np.concatenate([before[name][i] for i in full], axis=1) for name in SLOT_FIELDS}


def _ls_expected_lags(before: dict[str, NDArray[Any]], full: list[int], version: int) -> NDArray[np.int64]:
    lags = [version - min(int(v) for v in before["versions"][i][:, b]) for i in full for b in range(2)]
    return np.array(lags, np.int64)


def _ls_batch_problem(run: LearnerRun, full: list[int]) -> str | None:
    """What is wrong with the batch the update received, or None."""
    events = run.events
    if events.batch is None:
        return (
            f"{run.what}: learner.update received a {events.batch_type or 'nothing'}; pass it the batch, a dict "
            f"of the six fields {list(SLOT_FIELDS)}"
        )
    if set(events.batch) != set(SLOT_FIELDS):
        return f"{run.what}: the batch has fields {sorted(events.batch)}; expected every field of a slot {list(SLOT_FIELDS)}"
    expected = _ls_expected_batch(run.before, full)
    for name in SLOT_FIELDS:
        got, want = events.batch[name], expected[name]
        if got.shape != want.shape:
            stacked = (len(full), *run.before[name].shape[1:])
            hint = " (the slots stacked on a new axis)" if got.shape == stacked else ""
            return (
                f"{run.what}: batch[{name!r}] has shape {got.shape}{hint}; expected {want.shape}: the slots side by "
                "side along the environment axis (dim 1), slot full[0] first"
            )
    if (events.batch["versions"] == REFILL_VERSION).any() or np.isnan(events.batch["rewards"]).any():
        return (
            f"{run.what}: the batch changed after the slots were freed (it holds what an actor refilling them "
            "wrote): a slot's tensors are views of shared memory; copy the full slots into the batch before "
            "free_queue.put hands them back"
        )
    for name in SLOT_FIELDS:
        got, want = events.batch[name], expected[name]
        if np.array_equal(got, want):
            continue
        reordered = np.concatenate([run.before[name][i] for i in sorted(full)], axis=1)
        if sorted(full) != full and np.array_equal(got, reordered):
            return f"{run.what}: batch[{name!r}] holds the slots in sorted order; keep the order of `full`"
        return f"{run.what}: batch[{name!r}] does not hold the full slots' data side by side in the order of `full`"
    return None


def _ls_lag_compare(run: LearnerRun, full: list[int], version: int) -> None:
    expected = _ls_expected_lags(run.before, full, version)
    arr = assert_array(run.got, what=run.what, shape=expected.shape)
    if not np.array_equal(arr, expected):
        v = np.concatenate([run.before["versions"][i] for i in full], axis=1)
        fail_if_known_mistake(
            arr,
            {
                "the lag is measured after the update (one too many): count it against the learner's version "
                "before learner.update, the weights that compute this gradient": expected + 1,
                "the lag is counted from the newest version in the column; count it from the oldest (min over t)": (
                    version - v.max(axis=0)
                ),
                "the lag has the wrong sign: learner.version - version, not version - learner.version": -expected,
                "the lag is counted from the mean version; count it from the oldest (min over t)": (
                    version - v.mean(axis=0)
                ),
            },
            what=run.what,
            expected=expected,
        )
    assert_allclose(arr, expected, what=f"{run.what}: the lags", check_dtype=False)
    assert_true(arr.dtype.kind in "iu", f"{run.what}: the lags have dtype {arr.dtype}; they count updates: integers")


@check_case("returns one integer lag per column of the batch, and passes learner.update the whole batch")
def _ls_batch(fn: Callable[..., Any]) -> None:
    full = [2, 0]
    run = _ls_run(fn, full, 9, {0: 7, 2: 8})
    assert_numpy_result(run.got, LS)
    if "update" not in run.events.kinds():
        fail(f"{run.what} never called learner.update(batch): the step is a gradient step on the batch")
    problem = _ls_batch_problem(run, full)
    if problem:
        fail(problem)
    _ls_lag_compare(run, full, 9)


@check_case("frees every full slot exactly once, before the update, so the actors refill while it learns")
def _ls_frees_first(fn: Callable[..., Any]) -> None:
    full = [3, 1, 2]
    run = _ls_run(fn, full, 5, {1: 4, 2: 5, 3: 3})
    freed = run.events.freed()
    if sorted(freed) != sorted(full):
        fail(
            f"{run.what} handed back slots {freed} to free_queue; every slot in full, once each: {sorted(full)} "
            "(a slot never freed is lost to the actors, one freed twice is filled by two of them)"
        )
    kinds = run.events.kinds()
    if "update" in kinds and len(run.events.freed_at_update) < len(full):
        fail(
            f"{run.what} frees the slots after learner.update: the actors wait for free slots during the whole "
            "gradient step; copy the batch, free the slots, then learn (acting and learning overlap)"
        )
    problem = _ls_batch_problem(run, full)
    if problem:
        fail(problem)


@check_case("the lag of each column counts from its oldest version at the learner's version before the update")
def _ls_lags(fn: Callable[..., Any]) -> None:
    mid = np.array([[4, 6], [4, 6], [5, 7], [5, 7], [6, 7]])  # weights that arrived mid-unroll (SEED style)
    for full, version, versions in (([1], 8, {1: mid}), ([0, 3], 12, {0: 12, 3: mid + 5}), ([2], 3, {2: 3})):
        run = _ls_run(fn, full, version, versions, seed=version)
        _ls_lag_compare(run, full, version)


@check_case("a version newer than the learner's raises ValueError, before anything is learned or published")
def _ls_future(fn: Callable[..., Any]) -> None:
    slots = _ls_slots(1, 3, 5, 2, {0: 4, 1: 6})
    events = LearnerEvents()
    learner = FakeLearner(5, events)
    what = f"{LS}(slots, full=[0, 1], ...) with learner.version = 5 and version 6 in slot 1"
    try:
        fn(slots, [0, 1], FakeFreeQueue(slots, events), learner, FakeWeights(learner, events))
    except ValueError:
        pass
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(f"{what} raised {type(exc).__name__}; expected ValueError (a version from the future)")
    else:
        fail(f"{what} returned; expected ValueError: a version newer than the learner's is a bookkeeping bug")
    learned = [k for k in events.kinds() if k in ("update", "publish")]
    assert_true(
        not learned,
        f"{what} called {' and '.join(f'learner.{k}' if k == 'update' else 'weights.publish' for k in learned)} "
        "before raising: check the versions before the update, so that broken data never trains the model",
    )


@check_case("publishes the updated model once, after the update, stamped with the new version")
def _ls_publish(fn: Callable[..., Any]) -> None:
    run = _ls_run(fn, [1, 0], 6, {0: 5, 1: 6})
    publishes = [e for e in run.events.log if e[0] == "publish"]
    if len(publishes) != 1:
        fail(f"{run.what} published the weights {len(publishes)} times; once per update, after it")
    kinds = run.events.kinds()
    if "update" not in kinds or kinds.index("publish") < kinds.index("update"):
        fail(
            f"{run.what} publishes before learner.update: the actors would pull the weights of before this "
            "step; publish after the update"
        )
    _, version, same_model = publishes[0]
    if not same_model:
        fail(f"{run.what} published another object than learner.model: publish the learner's updated model")
    if version == 6:
        fail(
            f"{run.what} published version 6, the version before the update: the new weights are version 7 "
            "(learner.version after the update); actors stamp their actions with it, so every lag would be one off"
        )
    if version == 8:
        fail(
            f"{run.what} published version 8; expected 7: learner.update already moves learner.version on by one, "
            "so moving it again counts every update twice"
        )
    assert_true(version == 7, f"{run.what} published version {version}; expected 7 (learner.version after the update)")


LEARNER_STEP = Exercise(
    name=LS,
    points=15,
    title="the learner's step: copy the full slots, free them, measure the lag, update, publish",
    checks=(_ls_batch, _ls_frees_first, _ls_lags, _ls_future, _ls_publish),
    hints=(
        "Five things, in the order the system's learner does them: take the full slots out of shared memory as one "
        "batch, give the slots back to the actors, measure each column's policy lag, take the gradient step, and "
        "publish the new weights with their version.",
        "A slot's tensors are views of shared memory: the moment its index is back in the free queue an actor may "
        "overwrite it, so the batch must already be a copy (concatenating the slots along the environment axis, "
        "dim 1, makes one). The lag of a column is the learner's version minus the oldest version in that column, "
        "read before the update moves the version on.",
        "Check the versions before learning: one newer than `learner.version` means broken bookkeeping, so raise "
        "`ValueError` before `learner.update` is called. After the update, `learner.version` is the new version: "
        "that is the one to stamp on `learner.model` when you publish, since the actors' next actions carry it.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: actor_unroll
# ---------------------------------------------------------------------------------------

UNR = "actor_unroll"


class FakeVecEnv:
    """A deterministic vector env with same-step autoreset, for checking unrolls.

    ``B`` envs, 3-number observations ``[env index, step in episode, last action]``;
    reward ``1 + action + 0.1 * env index``; env ``b``'s episodes end after ``3 + b`` steps
    by a termination when ``b`` is even, after ``2 + b`` steps by a time limit (truncated)
    when ``b`` is odd, so both kinds of end occur; the step that ends an episode returns the
    first observation of the next one. Every transition is logged in :attr:`log` as
    ``(obs_before, action, reward, done, obs_after, truncated)``.
    """

    def __init__(self, n_envs: int) -> None:
        self.num_envs = n_envs
        self.t = np.zeros(n_envs, dtype=np.int64)
        self.log: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def observe(self, last_action: np.ndarray) -> np.ndarray:
        return np.stack([np.arange(self.num_envs), self.t, last_action], axis=1).astype(np.float32)

    def reset(self) -> np.ndarray:
        self.t[:] = 0
        self.obs = self.observe(np.zeros(self.num_envs))
        return self.obs.copy()

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        a = np.asarray(actions)
        if a.shape != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, one per env, got shape {a.shape}")
        before = self.obs.copy()
        reward = (1.0 + a + 0.1 * np.arange(self.num_envs)).astype(np.float32)
        self.t += 1
        b = np.arange(self.num_envs)
        odd = b % 2 == 1
        ended = self.t >= np.where(odd, 2 + b, 3 + b)
        terminated, truncated = ended & ~odd, ended & odd
        self.t[ended] = 0
        self.obs = self.observe(a.astype(np.float64))
        self.log.append((before, a.copy(), reward, ended.copy(), self.obs.copy(), truncated.copy()))
        return self.obs.copy(), reward, terminated, truncated, {}


def _fake_policy(probs_first: float = 0.7) -> Any:
    """``obs [N, 3] -> (logits [N, 2], values [N])`` with P(action 0) depending on the obs;
    one parameter so that a recorded gradient would show. ``grad_modes`` records, for every
    call, whether autograd was on (``torch.is_grad_enabled()``)."""
    import torch
    from torch import nn

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(1.0))
            self.grad_modes: list[bool] = []

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.grad_modes.append(torch.is_grad_enabled())
            base = math.log(probs_first / (1 - probs_first))
            shift = 0.5 * obs[:, 1] - 0.3 * obs[:, 0]
            logits = torch.stack([self.scale * (base + shift), torch.zeros_like(shift)], dim=1)
            return logits, obs.sum(dim=1)

    return Policy()


def _slot(n_t: int, n_b: int) -> dict[str, Any]:
    import torch

    return {
        "obs": torch.zeros(n_t + 1, n_b, 3),
        "actions": torch.zeros(n_t, n_b, dtype=torch.int64),
        "behaviour_logp": torch.zeros(n_t, n_b),
        "rewards": torch.zeros(n_t, n_b),
        "dones": torch.zeros(n_t, n_b, dtype=torch.bool),
        "versions": torch.zeros(n_t, n_b, dtype=torch.int64),
    }


def _run_unroll(
    fn: Callable[..., Any],
    n_t: int,
    n_b: int,
    seed: int = 0,
    version: int = 7,
    probs_first: float = 0.7,
    policy: Any = None,
) -> tuple[FakeVecEnv, dict[str, Any], dict[str, Any], np.ndarray, Any]:
    import torch

    env = FakeVecEnv(n_b)
    obs = env.reset()
    slot = _slot(n_t, n_b)
    originals = dict(slot)
    policy = _fake_policy(probs_first) if policy is None else policy
    got = call(fn, env, policy, obs.copy(), slot, version, torch.Generator().manual_seed(seed))
    return env, slot, originals, obs, got


def _where(what: str) -> str:
    return f"{UNR}: slot[{what!r}]"


@check_case("steps the envs T times and records what they returned")
def _unr_transitions(fn: Callable[..., Any]) -> None:
    env, slot, originals, _, _ = _run_unroll(fn, 5, 3)
    assert_true(len(env.log) == 5, f"{UNR} called envs.step {len(env.log)} times for an unroll of T = 5 steps")
    for name, t in originals.items():
        assert_true(
            slot[name] is t,
            f"{UNR} replaced slot[{name!r}] by a new tensor; write into the given one "
            "(slot[name][t] = ...), it is shared memory the learner reads",
        )
    before = np.stack([e[0] for e in env.log])
    assert_allclose(
        originals["obs"][:5].numpy(),
        before,
        what=_where("obs") + "[t] (the observation the action was chosen at)",
        check_dtype=False,
    )
    assert_allclose(
        originals["actions"].numpy(), np.stack([e[1] for e in env.log]), what=_where("actions"), check_dtype=False
    )
    assert_allclose(
        originals["rewards"].numpy(), np.stack([e[2] for e in env.log]), what=_where("rewards"), check_dtype=False
    )
    ended, truncated = np.stack([e[3] for e in env.log]), np.stack([e[5] for e in env.log])
    dones = originals["dones"].numpy()
    if truncated.any() and np.array_equal(dones.astype(bool), ended & ~truncated):
        fail(
            _where("dones") + " holds the terminations only: an episode cut by a time limit (truncated) ended too, "
            "and the next observation starts a new one; done = terminated or truncated"
        )
    assert_allclose(dones, ended, what=_where("dones") + " (terminated or truncated)", check_dtype=False)


@check_case("obs[T] is the bootstrap state, and it is returned")
def _unr_bootstrap(fn: Callable[..., Any]) -> None:
    env, _slot, originals, _, got = _run_unroll(fn, 4, 2)
    after = env.log[-1][4]
    assert_allclose(
        originals["obs"][4].numpy(),
        after,
        what=_where("obs") + "[T] (the observation after the last step)",
        check_dtype=False,
    )
    if got is None:
        fail(f"{UNR} returned None; return the observations after the last step (the next unroll's x_0)")
    got_np = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    assert_allclose(
        got_np, after, what=f"what {UNR} returned (the observations after the last step)", check_dtype=False
    )


@check_case("behaviour_logp is log mu(a_t|x_t) of the acting policy")
def _unr_logp(fn: Callable[..., Any]) -> None:
    import torch

    _, _, originals, _, _ = _run_unroll(fn, 6, 3)
    logits, _ = _fake_policy()(originals["obs"][:6].reshape(-1, 3))
    expected = (
        torch.log_softmax(logits.detach().double(), dim=-1).gather(1, originals["actions"].reshape(-1, 1)).reshape(6, 3)
    )
    got = originals["behaviour_logp"].detach().double()
    if torch.allclose(got, expected.exp(), atol=1e-5) and not torch.allclose(got, expected, atol=1e-5):
        fail(_where("behaviour_logp") + " holds probabilities; store log-probabilities (log_softmax)")
    assert_allclose(got.numpy(), expected.numpy(), what=_where("behaviour_logp"), rtol=1e-5, atol=1e-6)


@check_case("versions record the weight version that acted")
def _unr_versions(fn: Callable[..., Any]) -> None:
    _, _, originals, _, _ = _run_unroll(fn, 3, 2, version=42)
    assert_allclose(
        originals["versions"].numpy(), np.full((3, 2), 42), what=_where("versions") + " (version=42)", check_dtype=False
    )


@check_case("actions are sampled from the policy (not its argmax), with the given generator", time_limit=30.0)
def _unr_sampling(fn: Callable[..., Any]) -> None:
    import torch

    n_t, n_b = 150, 16
    _, _, first, _, _ = _run_unroll(fn, n_t, n_b, seed=3, probs_first=0.7)
    acts = first["actions"].numpy()
    logits, _ = _fake_policy(0.7)(first["obs"][:n_t].reshape(-1, 3))
    p0 = torch.softmax(logits.detach().double(), dim=-1)[:, 0].numpy()
    observed, expected = float((acts.reshape(-1) == 0).mean()), float(p0.mean())
    if observed in (0.0, 1.0) or abs(observed - expected) > 0.05:
        fail(
            f"action 0 was taken in {observed:.0%} of {n_t * n_b} steps where the policy gives it {expected:.0%} "
            "on average: sample with torch.multinomial(softmax(logits), 1, generator=generator)"
        )
    with torch_seeded(123):  # a different global RNG state must not change the actions
        _, _, second, _, _ = _run_unroll(fn, n_t, n_b, seed=3, probs_first=0.7)
    assert_true(
        np.array_equal(second["actions"].numpy(), acts),
        "two unrolls with generators seeded alike gave different actions: sample with the `generator` "
        "argument, not torch's global random state",
    )


@check_case("records no gradients: the policy runs under torch.no_grad()")
def _unr_no_grad(fn: Callable[..., Any]) -> None:
    policy = _fake_policy()
    _, _, originals, _, _ = _run_unroll(fn, 3, 2, policy=policy)
    for name, t in originals.items():
        assert_true(
            not t.requires_grad,
            f"{_where(name)} requires grad after the unroll: act under torch.no_grad() "
            "(the learner recomputes log pi itself)",
        )
    recorded = sum(policy.grad_modes)
    assert_true(
        recorded == 0,
        f"{UNR} ran the policy with autograd on ({recorded} of its {len(policy.grad_modes)} calls): torch built a "
        "graph at every step that nothing uses (time and memory on every actor), even if the outputs are detached; "
        "act under torch.no_grad()",
    )


ACTOR_UNROLL = Exercise(
    name=UNR,
    points=15,
    title="one unroll of an IMPALA actor into a shared-memory slot",
    checks=(_unr_transitions, _unr_bootstrap, _unr_logp, _unr_versions, _unr_sampling, _unr_no_grad),
    hints=(
        "One loop over the `T` steps of the slot: at each step record what the actor saw and did (the observation, "
        "the action, its log-probability under the behaviour policy, the weights' version), step the envs, then "
        "record what came back (reward, done). After the loop the slot also needs the observation after the last "
        "step.",
        "Sample from the policy's logits with the given `generator`, so that the unroll is reproducible: "
        "`torch.log_softmax` for the log-probabilities, `torch.multinomial` on their exponential, and `gather` for "
        "the taken action's log-probability. A done is terminated or truncated (`np.logical_or`).",
        "Run the loop under `torch.no_grad()` (an actor never backpropagates), convert observations and rewards with "
        "`torch.as_tensor(..., dtype=torch.float32)`, and write into the slot in place, `slot[name][t] = ...`: "
        "rebinding `slot[name]` writes nothing into the shared buffers. Keep each step's new observations for the "
        "next step and return the last ones.",
    ),
)

EXERCISES: tuple[Exercise, ...] = (VTRACE_TARGETS, PG_ADVANTAGES, LEARNER_STEP, ACTOR_UNROLL)
