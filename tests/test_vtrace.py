"""course_lib.rl.vtrace against a deliberately naive O(T^2) implementation of the paper's formula
(``vtrace_naive``, the oracle of lesson 03's grader, which mirrors Espeholt et al. 2018, eq. 1
term by term), on inputs whose ratios cross both clip thresholds, plus properties."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from course_lib.course.grading.lessons.l03_impala_vtrace import (
    naive_nstep_return,
    naive_pg_advantages,
    random_trajectory,
)
from course_lib.rl.pg import discounted_returns
from course_lib.rl.vtrace import (
    VTraceReturns,
    discounts_from_dones,
    truncated_ratios,
    vtrace,
    vtrace_naive,
    vtrace_recursion,
)

ARGS = ("log_rhos", "discounts", "rewards", "values", "bootstrap_value")

# (T, B, rho_bar, c_bar, pg_rho_bar): equal thresholds, rho_bar > c_bar, no truncation at all
CASES = [
    (6, 3, 1.0, 1.0, 1.0),
    (9, 2, 1.5, 0.8, 1.2),
    (4, 5, 2.0, 0.5, 0.7),
    (12, 1, None, None, None),
    (1, 4, 1.0, 1.0, 1.0),
]


def run(
    data: dict[str, Any], rho_bar: float | None = 1.0, c_bar: float | None = 1.0, pg_rho_bar: float | None = 1.0
) -> VTraceReturns:
    log_rhos, discounts, rewards, values, bootstrap = (data[k] for k in ARGS)
    return vtrace(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, pg_rho_bar)


def naive(data: dict[str, Any], rho_bar: float | None, c_bar: float | None, **bug: bool) -> np.ndarray:
    log_rhos, discounts, rewards, values, bootstrap = (data[k] for k in ARGS)
    return vtrace_naive(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, **bug)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_matches_the_naive_formula_on_inputs_crossing_both_thresholds(case):
    n_t, n_b, rho_bar, c_bar, pg_rho_bar = CASES[case]
    data = random_trajectory(case, n_t, n_b)
    ratios = np.exp(data["log_rhos"])
    if rho_bar is not None and n_t * n_b > 4:  # the inputs really do cross both thresholds
        assert (
            (ratios > rho_bar).any()
            and (ratios < c_bar).any()
            and ((ratios > c_bar) & (ratios < rho_bar)).any() | (rho_bar == c_bar)
        )
    out = run(data, rho_bar, c_bar, pg_rho_bar)
    expected_vs = naive(data, rho_bar, c_bar)
    np.testing.assert_allclose(out.vs, expected_vs, rtol=1e-12, atol=1e-12)
    expected_pg = naive_pg_advantages(
        data["log_rhos"],
        data["discounts"],
        data["rewards"],
        data["values"],
        expected_vs,
        data["bootstrap_value"],
        pg_rho_bar,
    )
    np.testing.assert_allclose(out.pg_advantages, expected_pg, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out.rhos, ratios)
    np.testing.assert_allclose(out.clipped_rhos, truncated_ratios(data["log_rhos"], rho_bar))
    np.testing.assert_allclose(out.cs, truncated_ratios(data["log_rhos"], c_bar))


def test_hand_computed_two_step_example():
    # rho = c = [1, 0.5]; delta_1 = 0.5 (2 + 0.9 * 3 - 1) = 1.85; v_1 = 2.85
    # delta_0 = 1 + 0.9 - 0.5 = 1.4; v_0 = 0.5 + 1.4 + 0.9 * 1 * 1.85 = 3.565
    out = vtrace(np.log([[2.0], [0.5]]), [[0.9], [0.9]], [[1.0], [2.0]], [[0.5], [1.0]], [3.0])
    np.testing.assert_allclose(out.vs, [[3.565], [2.85]])
    # A_0 = 1 * (1 + 0.9 * 2.85 - 0.5); A_1 = 0.5 * (2 + 0.9 * 3 - 1)
    np.testing.assert_allclose(out.pg_advantages, [[3.065], [1.85]])


def test_the_product_stops_at_t_minus_1_not_t():
    """The off-by-one of the paper's product index: the inclusive product gives other numbers."""
    data = random_trajectory(3, 6, 2)
    out = run(data).vs
    inclusive = naive(data, 1.0, 1.0, inclusive=True)
    assert not np.allclose(out, inclusive)
    np.testing.assert_allclose(out, naive(data, 1.0, 1.0))


def test_on_policy_equals_the_nstep_lambda_1_return():
    rng = np.random.default_rng(0)
    n_t, n_b, gamma = 11, 3, 0.95
    rewards = rng.normal(size=(n_t, n_b))
    dones = rng.random((n_t, n_b)) < 0.2
    values = rng.normal(size=(n_t, n_b))
    bootstrap = rng.normal(size=n_b)
    discounts = discounts_from_dones(dones, gamma)
    for thresholds in ((1.0, 1.0, 1.0), (None, None, None), (2.0, 1.0, 1.5)):  # any thresholds >= 1
        out = vtrace(np.zeros((n_t, n_b)), discounts, rewards, values, bootstrap, *thresholds)
        # the n-step return does not depend on V(x_t) for t < T at all
        np.testing.assert_allclose(out.vs, discounted_returns(rewards, dones, gamma, bootstrap), atol=1e-12)
        np.testing.assert_allclose(out.vs, naive_nstep_return(discounts, rewards, bootstrap), atol=1e-12)
        vs_tp1 = np.concatenate([out.vs[1:], bootstrap[None]])
        np.testing.assert_allclose(out.pg_advantages, rewards + discounts * vs_tp1 - values, atol=1e-12)


def test_c_bar_zero_gives_one_step_td_targets():
    data = random_trajectory(4, 7, 3)
    out = run(data, rho_bar=1.0, c_bar=0.0)
    values_tp1 = np.concatenate([data["values"][1:], data["bootstrap_value"][None]])
    td = data["rewards"] + data["discounts"] * values_tp1 - data["values"]
    np.testing.assert_allclose(out.vs, data["values"] + np.minimum(1.0, np.exp(data["log_rhos"])) * td, atol=1e-12)


def test_two_episodes_in_one_trajectory_equal_the_two_computed_apart():
    data = random_trajectory(5, 10, 3, p_done=0.0)
    data["discounts"][3] = 0.0  # every column's first episode ends at step 3
    whole = run(data, 1.5, 0.8, 1.2)
    first = {k: v[:4] for k, v in data.items() if k != "bootstrap_value"}
    first["bootstrap_value"] = np.array([1e6, -1e6, 7.0])  # must not matter: the episode ended
    second = {k: v[4:] for k, v in data.items() if k != "bootstrap_value"}
    second["bootstrap_value"] = data["bootstrap_value"]
    for part, rows in ((first, slice(0, 4)), (second, slice(4, 10))):
        alone = run(part, 1.5, 0.8, 1.2)
        np.testing.assert_allclose(alone.vs, whole.vs[rows], atol=1e-12)
        np.testing.assert_allclose(alone.pg_advantages, whole.pg_advantages[rows], atol=1e-12)


def test_batch_and_no_batch_agree():
    data = random_trajectory(6, 8, 5)
    together = run(data, 1.5, 0.8, 1.2)
    for b in range(5):
        alone = run({k: (v[:, b : b + 1] if v.ndim == 2 else v[b : b + 1]) for k, v in data.items()}, 1.5, 0.8, 1.2)
        np.testing.assert_allclose(alone.vs, together.vs[:, b : b + 1], atol=1e-12)
        np.testing.assert_allclose(alone.pg_advantages, together.pg_advantages[:, b : b + 1], atol=1e-12)


def test_inputs_are_left_unchanged_and_lists_work():
    data = random_trajectory(7, 5, 2)
    given = {k: v.copy() for k, v in data.items()}
    run(given)
    for k in ARGS:
        np.testing.assert_array_equal(given[k], data[k])
    as_lists = run({k: v.tolist() for k, v in data.items()})
    np.testing.assert_allclose(as_lists.vs, run(data).vs)


def test_bad_shapes_and_thresholds_raise():
    data = random_trajectory(8, 4, 2)
    with pytest.raises(ValueError, match="time-major"):
        vtrace(data["log_rhos"][:, 0], *(data[k] for k in ARGS[1:]))
    with pytest.raises(ValueError, match="rewards"):
        vtrace(data["log_rhos"], data["discounts"], data["rewards"][:3], data["values"], data["bootstrap_value"])
    with pytest.raises(ValueError, match="bootstrap_value"):
        vtrace(*(data[k] for k in ARGS[:4]), np.zeros(3))
    with pytest.raises(ValueError, match="rho_bar >= c_bar"):
        run(data, rho_bar=0.5, c_bar=1.0)
    with pytest.raises(ValueError, match="gamma"):
        discounts_from_dones([[0]], 1.5)


def test_truncation_bites_only_above_the_threshold():
    log_rhos = np.log([[0.25, 1.0, 4.0]])
    np.testing.assert_allclose(truncated_ratios(log_rhos, 1.0), [[0.25, 1.0, 1.0]])
    np.testing.assert_allclose(truncated_ratios(log_rhos, None), [[0.25, 1.0, 4.0]])
    assert math.isclose(float(truncated_ratios(np.log([[3.0]]), 2.0)[0, 0]), 2.0)


def test_the_recursion_alone_is_the_sum_of_discounted_traced_deltas():
    """``vtrace_recursion`` (the function the lesson shows) against the explicit sum of (03.2)."""
    rng = np.random.default_rng(9)
    n_t, n_b = 7, 3
    deltas, discounts, cs = rng.normal(size=(n_t, n_b)), 0.9 * (rng.random((n_t, n_b)) > 0.2), rng.random((n_t, n_b))
    expected = np.zeros((n_t, n_b))
    for s in range(n_t):
        for t in range(s, n_t):
            expected[s] += np.prod(discounts[s:t] * cs[s:t], axis=0) * deltas[t]
    np.testing.assert_allclose(vtrace_recursion(deltas, discounts, cs), expected, atol=1e-12)
