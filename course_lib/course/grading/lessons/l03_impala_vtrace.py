"""Lesson 03's graded exercises: V-trace targets, clipped policy-gradient advantages,
policy-lag accounting, and one unroll of an actor.

The learner writes:

* ``vtrace_targets(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0) -> vs [T, B]``  (03.2-03.3)
* ``pg_advantages(log_rhos, discounts, rewards, values, vs, bootstrap_value, pg_rho_bar=1.0) -> [T, B]``  (03.4)
* ``rollout_lag(learner_version, versions [T, B]) -> [B]``
* ``actor_unroll(envs, policy, obs, slot, version, generator) -> next obs``

The checks never call the course's implementations (``course_lib.rl.vtrace.vtrace``,
``course_lib.actor_learner``): they compare with deliberately naive oracles that mirror
the paper's formula term by term (``course_lib.rl.vtrace.vtrace_naive``, an explicit O(T^2)
double sum with an explicit product per term, which the lesson also shows; the ones
below), with hand-computed values, and with properties, on inputs whose ratios cross
both clip thresholds.
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
    assert_inputs_unchanged,
    assert_true,
    call,
    check_case,
    fail,
)
from course_lib.course.grading.helpers import (
    assert_numpy_result,
    assert_raises,
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
    seed: int, n_t: int, n_b: int, gamma: float = 0.9, p_done: float = 0.2, spread: float = 0.8
) -> dict[str, NDArray[np.float64]]:
    """Seeded V-trace inputs; ``log_rhos ~ N(0, spread^2)``, so ratios fall on both sides of 1
    (and of thresholds like 0.8 and 1.5); discounts are 0 where an episode ended."""
    rng = np.random.default_rng(seed)
    log_rhos = rng.normal(scale=spread, size=(n_t, n_b))
    log_rhos.flat[0] = math.log(3.0)  # at least one ratio far above every threshold
    log_rhos.flat[-1] = math.log(0.3)  # and one far below
    return {
        "log_rhos": log_rhos,
        "discounts": np.where(rng.random((n_t, n_b)) > p_done, gamma, 0.0),
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
    assert_allclose(_vt(fn, data), expected, what=_vt_what(data) + " with all log_rhos = 0")


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


@check_case("does not modify its inputs")
def _vt_inputs(fn: Callable[..., Any]) -> None:
    _unchanged(fn, VT, random_trajectory(50, 5, 2), VT_ARGS)


VTRACE_TARGETS = Exercise(
    name=VT,
    points=15,
    title="V-trace value targets v_s with truncated rho and c (eq. 03.2-03.3)",
    checks=(_vt_shape, _vt_known, _vt_on_policy, _vt_oracle, _vt_thresholds, _vt_episodes, _vt_columns, _vt_inputs),
    hints=(
        "go backwards: acc = delta_t + gamma_t * c_t * acc, and v_t = V(x_t) + acc, starting from acc = 0 after "
        "the last step (eq. 03.3)",
        "rho_t = min(rho_bar, exp(log_rho_t)) multiplies delta_t; c_t = min(c_bar, exp(log_rho_t)) multiplies the "
        "trace; V(x_{t+1}) is values[t + 1], or bootstrap_value at t = T - 1",
        "values_tp1 = np.concatenate([values[1:], bootstrap_value[None]]); "
        "deltas = rho * (rewards + discounts * values_tp1 - values)",
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
        "the advantage looks one step ahead with the V-trace target: r_s + gamma_s * v_{s+1} - V(x_s), weighted "
        "by min(pg_rho_bar, exp(log_rho_s))",
        "v_{s+1} is vs[s + 1] for s < T - 1 and bootstrap_value at the last step: "
        "np.concatenate([vs[1:], bootstrap_value[None]])",
        "np.minimum(pg_rho_bar, np.exp(log_rhos)) * (rewards + discounts * vs_tp1 - values)",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: rollout_lag
# ---------------------------------------------------------------------------------------

LAG = "rollout_lag"


def _lag(fn: Callable[..., Any], learner_version: int, versions: Any) -> Any:
    return call_on_copies(fn, learner_version, versions)


def _lag_what(learner_version: int, versions: Any) -> str:
    return f"{LAG}({learner_version}, versions of shape {tuple(np.shape(versions))})"


def _lag_compare(fn: Callable[..., Any], learner_version: int, versions: NDArray[np.int64]) -> None:
    expected = np.array([learner_version - min(int(x) for x in versions[:, b]) for b in range(versions.shape[1])])
    got = _lag(fn, learner_version, versions)
    arr = assert_array(got, what=_lag_what(learner_version, versions), shape=expected.shape)
    if arr.dtype.kind in "biuf" and not np.allclose(arr, expected):
        mistakes = {
            "the lag is counted from the newest version in the rollout; count it from the oldest (min over t)": (
                learner_version - versions.max(axis=0)
            ),
            "the lag has the wrong sign: learner_version - version, not version - learner_version": -expected,
            "the lag is counted from the mean version; count it from the oldest (min over t)": (
                learner_version - versions.mean(axis=0)
            ),
        }
        fail_if_known_mistake(arr, mistakes, rtol=1e-5)
    assert_allclose(arr, expected, what=_lag_what(learner_version, versions), check_dtype=False)
    assert_true(
        arr.dtype.kind in "iu",
        f"{_lag_what(learner_version, versions)} has dtype {arr.dtype}; lags count updates: return integers",
    )


@check_case("returns an integer numpy array of shape [B]")
def _lag_shape(fn: Callable[..., Any]) -> None:
    versions = np.array([[3, 5], [3, 5]])
    got = assert_array(_lag(fn, 7, versions), what=_lag_what(7, versions), shape=(2,))
    assert_true(got.dtype.kind in "iu", f"{_lag_what(7, versions)} has dtype {got.dtype}; return integers")


@check_case("hand-computed lags, one version per rollout")
def _lag_known(fn: Callable[..., Any]) -> None:
    versions = np.array([[10, 7, 12], [10, 7, 12], [10, 7, 12]])
    _lag_compare(fn, 12, versions)
    assert_allclose(_lag(fn, 12, versions), [2, 5, 0], what=_lag_what(12, versions), check_dtype=False)


@check_case("weights that change mid-rollout: the lag counts from the oldest step")
def _lag_mid_rollout(fn: Callable[..., Any]) -> None:
    versions = np.array([[4, 6], [4, 6], [5, 7], [5, 7], [6, 7]])
    _lag_compare(fn, 8, versions)


@check_case("on-policy data has lag 0")
def _lag_zero(fn: Callable[..., Any]) -> None:
    _lag_compare(fn, 3, np.full((4, 3), 3))


@check_case("a version newer than the learner's raises ValueError")
def _lag_future(fn: Callable[..., Any]) -> None:
    versions = np.array([[2, 9], [2, 9]])
    assert_raises(
        ValueError,
        fn,
        5,
        versions.copy(),
        other_error=lambda exc: (
            f"{_lag_what(5, versions)} raised {type(exc).__name__}; expected ValueError (version 9 > learner's 5)"
        ),
        no_error=f"{_lag_what(5, versions)} returned; expected ValueError: version 9 is newer than the learner's 5, "
        "a bookkeeping bug that must not pass silently",
    )


@check_case("accepts torch tensors (the buffers hold them) and lists")
def _lag_inputs(fn: Callable[..., Any]) -> None:
    import torch

    versions = np.array([[1, 2, 3], [2, 2, 3]])
    got = _lag(fn, 4, torch.as_tensor(versions))
    assert_numpy_result(got, LAG)
    assert_allclose(got, [3, 2, 1], what=f"{LAG}(4, a torch int64 tensor)", check_dtype=False)
    assert_allclose(_lag(fn, 4, versions.tolist()), [3, 2, 1], what=f"{LAG}(4, a list of lists)", check_dtype=False)


@check_case("does not modify its input")
def _lag_unchanged(fn: Callable[..., Any]) -> None:
    assert_inputs_unchanged(fn, LAG, leading=(5,), advice="", versions=np.array([[1, 2], [3, 4]]))


ROLLOUT_LAG = Exercise(
    name=LAG,
    points=10,
    title="policy lag of each rollout column",
    checks=(_lag_shape, _lag_known, _lag_mid_rollout, _lag_zero, _lag_future, _lag_inputs, _lag_unchanged),
    hints=(
        "lag = learner_version - (the oldest version that chose an action in that column): "
        "np.asarray(versions).min(axis=0)",
        "check first: if any version is larger than learner_version, raise ValueError",
        "v = np.asarray(versions, dtype=np.int64); return learner_version - v.min(axis=0)",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: actor_unroll
# ---------------------------------------------------------------------------------------

UNR = "actor_unroll"


class FakeVecEnv:
    """A deterministic vector env with same-step autoreset, for checking unrolls.

    ``B`` envs, 3-number observations ``[env index, step in episode, last action]``;
    reward ``1 + action + 0.1 * env index``; env ``b``'s episodes last ``3 + b`` steps;
    the step that ends an episode returns the first observation of the next one. Every
    transition is logged in :attr:`log` as ``(obs_before, action, reward, done, obs_after)``.
    """

    def __init__(self, n_envs: int) -> None:
        self.num_envs = n_envs
        self.t = np.zeros(n_envs, dtype=np.int64)
        self.log: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

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
        terminated = self.t >= 3 + np.arange(self.num_envs)
        self.t[terminated] = 0
        self.obs = self.observe(a.astype(np.float64))
        self.log.append((before, a.copy(), reward, terminated.copy(), self.obs.copy()))
        return self.obs.copy(), reward, terminated, np.zeros(self.num_envs, dtype=bool), {}


def _fake_policy(probs_first: float = 0.7) -> Any:
    """``obs [N, 3] -> (logits [N, 2], values [N])`` with P(action 0) depending on the obs;
    one parameter so that a recorded gradient would show."""
    import torch
    from torch import nn

    class Policy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.tensor(1.0))

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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
    fn: Callable[..., Any], n_t: int, n_b: int, seed: int = 0, version: int = 7, probs_first: float = 0.7
) -> tuple[FakeVecEnv, dict[str, Any], dict[str, Any], np.ndarray, Any]:
    import torch

    env = FakeVecEnv(n_b)
    obs = env.reset()
    slot = _slot(n_t, n_b)
    originals = dict(slot)
    policy = _fake_policy(probs_first)
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
    assert_allclose(
        originals["dones"].numpy(), np.stack([e[3] for e in env.log]), what=_where("dones"), check_dtype=False
    )


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


@check_case("actions are sampled from the policy (not its argmax), with the given generator")
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


@check_case("records no gradients (acting runs under torch.no_grad())")
def _unr_no_grad(fn: Callable[..., Any]) -> None:
    _, _, originals, _, _ = _run_unroll(fn, 3, 2)
    for name, t in originals.items():
        assert_true(
            not t.requires_grad,
            f"{_where(name)} requires grad after the unroll: act under torch.no_grad() "
            "(the learner recomputes log pi itself)",
        )


ACTOR_UNROLL = Exercise(
    name=UNR,
    points=15,
    title="one unroll of an IMPALA actor into a shared-memory slot",
    checks=(_unr_transitions, _unr_bootstrap, _unr_logp, _unr_versions, _unr_sampling, _unr_no_grad),
    hints=(
        "for t in range(T): write obs into slot['obs'][t], sample the action, write action, log-prob and version, "
        "step the envs, write reward and done; after the loop slot['obs'][T] = the last observation",
        "logp = torch.log_softmax(logits, -1); a = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1); "
        "logp.gather(1, a[:, None]).squeeze(1) is log mu(a|x)",
        "wrap the loop in `with torch.no_grad():`, write with slot[name][t] = ... (never rebind slot[name]), and "
        "return the observations after the last step",
    ),
)

EXERCISES: tuple[Exercise, ...] = (VTRACE_TARGETS, PG_ADVANTAGES, ROLLOUT_LAG, ACTOR_UNROLL)
