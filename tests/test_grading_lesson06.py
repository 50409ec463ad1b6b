"""Lesson 06's graders beyond what tests/test_exercises.py checks for every lesson: the
graders' oracles agree with the reference solutions and with hand-computed values, every
slip an oracle can name changes the answer on the grader's own cases, bad submissions get
a report (never a crash or a hang), and one planted bug per exercise is caught end to end
through `course grade`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grading_helpers as gh
import numpy as np
import pytest
from conftest import mutant_function, solution_function
from mutants.l06_off_policy_scale import MUTANTS

from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import l06_off_policy_scale as l06

ROOT = Path(__file__).resolve().parents[1]
LESSON = "06_off_policy_scale"
NAMES = ("bicycle_step", "sumtree_find", "importance_weights", "soft_bellman_target", "sumtree_update")

pytestmark = pytest.mark.timeout(300)


def test_registry_lists_the_five_exercises():
    gh.assert_registry(LESSON, NAMES, ("6", "off_policy_scale"), points=65)


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "bicycle_step-beta_without_ratio",
        "bicycle_step-moves_along_psi",
        "bicycle_step-divides_by_wheelbase",
        "bicycle_step-speed_before_position",
        "bicycle_step-no_clip_at_zero",
        "bicycle_step-steer_in_degrees",
        "sumtree_find-returns_tree_index",
        "sumtree_find-less_or_equal",
        "sumtree_find-no_subtraction",
        "sumtree_find-starts_at_index_0",
        "sumtree_find-leaf_off_by_one",
        "sumtree_find-searchsorted_scan",
        "sumtree_find-asarray_scan",
        "sumtree_find-python_loop_scan",
        "sumtree_find-stops_one_level_early",
        "importance_weights-mean_normalisation",
        "importance_weights-not_normalised",
        "importance_weights-beta_sign",
        "importance_weights-n_missing",
        "importance_weights-power_on_p_only",
        "soft_bellman_target-max_of_critics",
        "soft_bellman_target-plus_alpha_logp",
        "soft_bellman_target-no_done_mask",
        "soft_bellman_target-mask_on_reward",
        "soft_bellman_target-entropy_outside",
        "sumtree_update-first_write_wins",
        "sumtree_update-parent_delta_set",
        "sumtree_update-parent_delta_add",
        "sumtree_update-scatter_decides_repeats",
        "sumtree_update-loop_over_entries",
        "sumtree_update-rebuild_whole_tree",
    }
    gh.assert_slips_planted(MUTANTS, slips, NAMES)


# ---------------------------------------------------------------------------------------
# The graders' oracles agree with the solutions and the hand-computed values
# ---------------------------------------------------------------------------------------


def test_bicycle_oracle_equals_the_solution_and_the_hand_values():
    solve = solution_function(LESSON, "bicycle_step")
    for seed, n in ((0, 64), (10, 200)):
        cars = l06.bicycle_cars(seed, n)
        got = np.stack([np.asarray(a, dtype=np.float64) for a in solve(*cars)])
        np.testing.assert_allclose(got, l06.naive_bicycle(*cars), rtol=l06.BS_RTOL, atol=l06.BS_ATOL)
    for _, args, by_hand in l06.BS_KNOWN:
        np.testing.assert_allclose(l06.naive_bicycle(*args), by_hand, atol=1e-6)
    # the circle: the yaw rate v sin(beta) / l_r turns the car by exactly 2 pi in 40 steps
    beta = math.atan(2.0 / 4.0 * 2.0)
    assert math.isclose(beta, math.pi / 4)
    omega = l06.CIRCLE_V * math.sin(beta) / l06.CIRCLE_LR
    assert math.isclose(omega * l06.CIRCLE_DT * l06.CIRCLE_STEPS, 2 * math.pi)


def test_each_bicycle_slip_changes_the_answer_on_the_hand_steps():
    """A slip the grader can name must differ from (06.1) somewhere in the hand-computed steps."""
    for message, slip in l06.BS_SLIPS.items():
        assert any(
            not np.allclose(l06.naive_bicycle(*args, **slip), l06.naive_bicycle(*args), atol=1e-3)
            for _, args, _ in l06.BS_KNOWN
        ), message


def test_sumtree_oracle_equals_the_solution_and_the_tree_is_built_right():
    solve = solution_function(LESSON, "sumtree_find")
    rng = np.random.default_rng(7)
    for trial in range(60):
        leaves = l06.random_leaves(rng, 2 ** (trial % 8))
        tree = l06.build_tree(leaves)
        assert tree[1] == leaves.sum() and math.isnan(tree[0])
        for u in l06._probe_points(leaves, rng, 20):
            want = l06.naive_find(leaves, u)
            assert leaves[want] > 0
            assert solve(tree, u) == l06.slipped_descent(tree, u) == want
    leaves = np.asarray(l06.PRIORITIES) ** l06.ALPHA
    assert (l06.DRAWS * leaves / leaves.sum()).tolist() == [160, 80, 0, 240, 120, 0, 320, 80]


def test_each_sumtree_slip_changes_the_answer_on_the_hand_trees():
    hand = ([1.0, 0.0, 3.0, 4.0], [0.0, 3.0], [1.0, 1.0], [0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    for message, slip in l06.ST_SLIPS.items():
        assert any(
            l06.slipped_descent(l06.build_tree(leaves), u, **slip) != l06.naive_find(leaves, u)
            for leaves in hand
            for u in l06._probe_points(np.asarray(leaves), np.random.default_rng(0), 3)
        ), message


# ---------------------------------------------------------------------------------------
# The read-counting tree: a natural descent passes, a scan cannot hide
# ---------------------------------------------------------------------------------------


def _descent_reading_both_children(tree, u):
    """A correct descent written another natural way: tree.shape, both children, the root read."""
    capacity = tree.shape[0] // 2
    node, total = 1, tree[1]
    assert u < total
    while node < capacity:
        left, right = tree[2 * node], tree[2 * node + 1]
        if u < left or right == 0:
            node = 2 * node
        else:
            u = u - left
            node = 2 * node + 1
    return node - capacity


def _recursive_descent(tree, u, i=1):
    capacity = len(tree) // 2
    if i >= capacity:
        return i - capacity
    left = tree[np.int64(2 * i)]  # a numpy int index works too
    return _recursive_descent(tree, u, 2 * i) if u < left else _recursive_descent(tree, u - left, 2 * i + 1)


@pytest.mark.parametrize("descent", [_descent_reading_both_children, _recursive_descent])
def test_other_natural_descents_pass(descent):
    outcome = run_exercise(l06.SUMTREE_FIND, descent)
    assert outcome.passed, outcome.message


def test_the_read_counting_tree_counts_single_reads_and_refuses_bulk_access():
    values = l06.build_tree([1.0, 0.0, 3.0, 4.0])
    tree = l06.ReadCountingTree(values)
    assert len(tree) == 8 and tree.shape == (8,) and tree.size == 8 and tree.ndim == 1
    assert tree[1] == 8.0 and tree[np.int32(2)] == 1.0 and tree[-1] == 4.0 and isinstance(tree[3], np.float64)
    assert tree.nodes_read == {1, 2, 3, 7}
    refused = {
        "slice": lambda: tree[4:],
        "index array": lambda: tree[np.arange(4, 8)],
        "list": lambda: list(tree),
        "sum": lambda: sum(tree),
        "in": lambda: 3.0 in tree,
        "np.asarray": lambda: np.asarray(tree),
        "np.cumsum": lambda: np.cumsum(tree),
        "np.searchsorted": lambda: np.searchsorted(tree, 1.0),
        ".sum()": lambda: tree.sum(),
        ".tolist()": lambda: tree.tolist(),
        "write": lambda: tree.__setitem__(4, 0.0),
        "float index": lambda: tree[2.0],
    }
    for name, access in refused.items():
        with pytest.raises(l06.TreeRefusal):
            access()
        assert tree.nodes_read == {1, 2, 3, 7}, name
    with pytest.raises(IndexError):
        tree[8]
    assert not hasattr(tree, "cumsum")  # numpy's and JAX's probes move on to __array__
    assert [l06.read_limit(c) for c in (1, 2, 1024, 16384)] == [1, 3, 21, 29]


def test_the_tree_hides_its_values_from_attribute_access():
    """The node values live in a closure: no attribute, private name, vars(), copy or pickle
    reaches them, and the learner's code cannot clear the record of reads."""
    import copy
    import pickle

    tree = l06.ReadCountingTree(l06.build_tree([1.0, 0.0, 3.0, 4.0]))
    assert tree[1] == 8.0
    private = {
        "_values": lambda: tree._values,
        "_read": lambda: tree._read,
        "__dict__": lambda: tree.__dict__,
        "__slots__": lambda: tree.__slots__,
        "__getstate__": lambda: tree.__getstate__(),
        "__reduce_ex__": lambda: tree.__reduce_ex__(4),
        "__secret": lambda: getattr(tree, "__secret"),
    }
    for name, access in private.items():
        with pytest.raises(l06.TreeAttributeError, match="the tree's inside"):
            access()
        assert tree.nodes_read == {1}, name
    for access in (
        lambda: vars(tree),
        lambda: copy.copy(tree),
        lambda: copy.deepcopy(tree),
        lambda: pickle.dumps(tree),
        lambda: type(tree).__reduce_ex__(tree, 4),
    ):
        with pytest.raises((TypeError, AttributeError, copy.Error, pickle.PicklingError)):
            access()
    for write in (
        lambda: setattr(tree, "__class__", object),
        lambda: setattr(tree, "nodes_read", set()),
        lambda: delattr(tree, "_read"),
    ):
        with pytest.raises(l06.TreeReadError):
            write()
    assert isinstance(tree.nodes_read, frozenset) and tree.nodes_read == {1}
    assert tree.__class__ is l06.ReadCountingTree and not isinstance(tree, np.ndarray)


def test_reading_the_trees_private_values_is_caught_and_correct_descents_still_pass():
    """The reviewer's bypass: `tree._values` read past the one-node reads, then a linear scan."""
    (mutant,) = [m for m in MUTANTS if m.name == "private_values_scan"]
    outcome = run_exercise(l06.SUMTREE_FIND, mutant_function(LESSON, mutant))
    assert not outcome.passed
    assert "tree._values" in outcome.message and "one node at a time" in outcome.message, outcome.message
    for descent in (solution_function(LESSON, "sumtree_find"), _descent_reading_both_children, _recursive_descent):
        outcome = run_exercise(l06.SUMTREE_FIND, descent)
        assert outcome.passed, outcome.message


def test_the_solution_reads_one_node_per_level():
    solve = solution_function(LESSON, "sumtree_find")
    rng = np.random.default_rng(3)
    for capacity in (1, 8, 1024):
        leaves = l06.random_leaves(rng, capacity)
        for u in l06._probe_points(leaves, rng, 5):
            tree = l06.ReadCountingTree(l06.build_tree(leaves))
            assert solve(tree, u) == l06.naive_find(leaves, u)
            assert len(tree.nodes_read) == capacity.bit_length() - 1  # the left child at each level


# ---------------------------------------------------------------------------------------
# Importance weights (06.8)
# ---------------------------------------------------------------------------------------


def test_importance_weights_oracle_equals_the_solution_and_the_library():
    from course_lib.offpolicy import replay

    solve = solution_function(LESSON, "importance_weights")
    for seed, n_items, k in ((0, 64, 32), (9, 1000, 256), (2, 5, 1)):
        p, n, beta = l06.iw_batch(seed, n_items, k)
        for normalize in (True, False):
            np.testing.assert_allclose(
                np.asarray(solve(p, n, beta, normalize=normalize)), l06.naive_weights(p, n, beta, normalize), rtol=1e-5
            )
        lib = replay.importance_weights(p.astype(np.float32), n, beta)
        np.testing.assert_allclose(np.asarray(lib), l06.naive_weights(p, n, beta), rtol=1e-5)
    p, n = l06.IW_HAND
    for beta, raw, normalised in l06.IW_HAND_WEIGHTS:
        np.testing.assert_allclose(l06.naive_weights(p, n, beta, False), raw)
        np.testing.assert_allclose(l06.naive_weights(p, n, beta, True), normalised)


def test_each_weight_slip_changes_the_answer_on_the_hand_batches():
    """A slip the grader can name must differ from (06.8) on the hand batch or the uniform one
    (5 items of 8, so the batch size is not N), raw or normalised, and (where both are
    possible) be told apart from the other slips there."""
    beta = l06.IW_HAND_WEIGHTS[0][0]
    batches = (l06.IW_HAND, (np.full(5, 1 / 8), 8))
    answers = {}
    for message, slip in l06.IW_SLIPS.items():
        wrong = [l06.naive_weights(p, n, beta, normalize, **slip) for p, n in batches for normalize in (False, True)]
        right = [l06.naive_weights(p, n, beta, normalize) for p, n in batches for normalize in (False, True)]
        assert any(not np.allclose(w, r) for w, r in zip(wrong, right)), message
        answers[message] = np.concatenate(wrong)
    messages = list(answers)
    for i, a in enumerate(messages):
        for b in messages[i + 1 :]:
            assert not np.allclose(answers[a], answers[b]), (a, b)


def test_soft_bellman_oracle_equals_the_solution_and_each_slip_differs():
    solve = solution_function(LESSON, "soft_bellman_target")
    for seed, n in ((0, 64), (11, 300)):
        batch = l06.sb_batch(seed, n)
        np.testing.assert_allclose(np.asarray(solve(*batch)), l06.naive_target(*batch), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(l06.naive_target(*l06.SB_HAND), [2.98, 3.51, -1.0, 0.236])
    for message, slip in l06.SB_SLIPS.items():
        assert not np.allclose(l06.naive_target(*l06.SB_HAND, **slip), l06.naive_target(*l06.SB_HAND)), message


# ---------------------------------------------------------------------------------------
# The sum tree's write-back: the oracle, its slips, and the program probe
# ---------------------------------------------------------------------------------------


def test_sumtree_update_oracle_equals_the_solution_and_the_library():
    import jax.numpy as jnp

    from course_lib.offpolicy import replay

    solve = solution_function(LESSON, "sumtree_update")
    rng = np.random.default_rng(5)
    for capacity, k in ((1, 3), (8, 20), (64, 48), (1024, 256)):
        tree = l06.float32_tree(l06.random_leaves(rng, capacity))
        indices, values = l06.su_batch(rng, capacity, k)
        want = l06.naive_update(tree, indices, values)
        args = (jnp.asarray(tree), jnp.asarray(indices), jnp.asarray(values))
        np.testing.assert_array_equal(np.asarray(solve(*args)), want)
        for method in ("sequential", "vectorised"):  # the library keeps the last write too
            lib = np.asarray(replay.sumtree_update(*args, method=method))
            np.testing.assert_array_equal(lib[1:], want[1:])
    tree = l06.float32_tree(l06.DRAWN)
    for indices, values, by_hand in l06.SU_HAND:
        assert l06.naive_update(tree, indices, values)[1:].tolist() == by_hand


def test_each_sumtree_update_slip_changes_the_answer_on_the_hand_trees():
    tree = l06.float32_tree(l06.DRAWN)
    for message, slip in l06._su_level_slips(4).items():
        assert any(
            not np.allclose(l06.naive_update(tree, i, v, **slip), l06.naive_update(tree, i, v))
            for i, v, _ in l06.SU_HAND
        ), message


def _fori_levels(tree, indices, values):
    """Another natural write-back: a stable argsort finds the last writes, a lax.fori_loop (a
    scan) walks the levels."""
    import jax
    import jax.numpy as jnp

    capacity = tree.shape[0] // 2
    order = jnp.argsort(indices, stable=True)
    last = jnp.append(indices[order][1:] != indices[order][:-1], True)
    keep = jnp.zeros(indices.shape, bool).at[order].set(last)
    tree = tree.at[jnp.where(keep, capacity + indices, tree.shape[0])].set(values, mode="drop")

    def level(_, carry):
        t, nodes = carry
        nodes = nodes // 2
        return t.at[nodes].set(t[2 * nodes] + t[2 * nodes + 1]), nodes

    return jax.lax.fori_loop(0, capacity.bit_length() - 1, level, (tree, capacity + indices))[0]


def _probe(fn, capacity=4096, k=32):
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    tree = jnp.asarray(l06.float32_tree(l06.random_leaves(rng, capacity)))
    indices = rng.choice(capacity, size=k, replace=False).astype(np.int32)
    indices[5] = indices[7]  # a repeated index, with two different values
    indices = jnp.asarray(indices)
    values = jnp.arange(k, dtype=jnp.float32)
    closed = jax.make_jaxpr(fn)(tree, indices, values)
    probe = l06.TreeProgramProbe(2 * capacity, whole=capacity // 2)
    (out,) = l06.run_jaxpr(closed.jaxpr, list(closed.consts), [tree, indices, values], probe)
    want = l06.naive_update(np.asarray(tree), np.asarray(indices), np.asarray(values))
    np.testing.assert_array_equal(np.asarray(out)[1:], want[1:])  # run op by op, the program computes the write-back
    return probe


def test_the_program_probe_sees_writes_loops_whole_tree_work_and_repeated_writes():
    probe = _probe(solution_function(LESSON, "sumtree_update"))
    assert (probe.writes, probe.big, probe.conflict) == (13, [], None)
    probe = _probe(_fori_levels)
    assert (probe.writes, probe.big, probe.conflict) == (13, [], None)
    names = {m.name: m for m in MUTANTS if m.function == "sumtree_update"}
    assert _probe(mutant_function(LESSON, names["loop_over_entries"])).writes == 32 * 13
    assert "add" in _probe(mutant_function(LESSON, names["rebuild_whole_tree"])).big
    assert _probe(mutant_function(LESSON, names["scatter_decides_repeats"])).conflict is not None


def test_the_program_probe_counts_the_elements_of_the_tree_touched():
    limit = l06.SU_TOUCH_FACTOR * 32 * 13  # capacity 4096: 12 levels above the leaves, K = 32
    assert _probe(solution_function(LESSON, "sumtree_update")).touched == 32 + 12 * 3 * 32
    assert _probe(_fori_levels).touched <= limit
    names = {m.name: m for m in MUTANTS if m.function == "sumtree_update"}
    upper = _probe(mutant_function(LESSON, names["upper_levels_rebuilt"]))
    assert (upper.writes, upper.big, upper.conflict) == (1 + 1 + 11, [], None)  # what the old probe saw: fine
    assert upper.touched > 2 * 2047 > limit  # but every level of 1024 nodes and fewer read whole (and written)


def test_the_program_probe_sees_work_that_grows_with_the_capacity():
    names = {m.name: m for m in MUTANTS if m.function == "sumtree_update"}
    small, wide = l06.PROBE_CAPACITY, l06.PROBE_WIDE
    levels = wide.bit_length() - small.bit_length()
    for fn in (solution_function(LESSON, "sumtree_update"), _fori_levels):
        touched = [l06._su_probe(fn, c)[0].touched for c in (small, wide)]
        assert touched[1] - touched[0] == levels * 3 * 32  # 3 K more per level: two children read, K parents written
    top = mutant_function(LESSON, names["top_fraction_rebuilt"])
    touched = [l06._su_probe(top, c)[0].touched for c in (small, wide)]
    assert touched[0] <= l06._su_touch_limit(small) and touched[1] <= l06._su_touch_limit(wide)  # under each bound
    assert touched[1] - touched[0] > l06.SU_GROWTH_FACTOR * 32 * levels  # but it grows with the capacity


def test_another_natural_write_back_passes():
    outcome = run_exercise(l06.SUMTREE_UPDATE, _fori_levels)
    assert outcome.passed, outcome.message


# ---------------------------------------------------------------------------------------
# Bad submissions: a report, never a crash or a hang
# ---------------------------------------------------------------------------------------


def _forever(*args):
    while True:
        pass


BAD: dict[str, list[tuple[Callable[..., Any], str]]] = {
    "bicycle_step": [
        (lambda *a: None, "expected a tuple (x', y', psi', v')"),
        (lambda *a: [a[0], a[1], a[2]], "expected a tuple (x', y', psi', v')"),
        (lambda *a: tuple(np.full(np.broadcast_shapes(*map(np.shape, a)), np.nan) for _ in range(4)), "x' = nan"),
        (lambda *a: tuple(np.zeros(3) for _ in range(4)), "expected ()"),
        (lambda *a: ("x", "y", "psi", "v"), "expected an array"),
    ],
    "importance_weights": [
        (lambda p, n, b, normalize=True: None, "did you forget to `return` it?"),
        (lambda p, n, b, normalize=True: float(np.sum(p)), "expected (4,)"),
        (lambda p, n, b, normalize=True: list(p), "expected an array"),
        (lambda p, n, b, normalize=True: np.ones(len(p), dtype=np.int64), "expected a float array"),
    ],
    "sumtree_find": [
        (lambda tree, u: None, "expected an int item index"),
        (lambda tree, u: 0.0, "not a float"),
        (lambda tree, u: True, "expected an int item index"),
        (lambda tree, u: 99, "not an item index"),
    ],
    "soft_bellman_target": [
        (lambda r, d, q1, q2, lp, a, g: None, "did you forget to `return` it?"),
        (lambda r, d, q1, q2, lp, a, g: float(np.sum(r)), "expected (4,)"),
        (lambda r, d, q1, q2, lp, a, g: r > 0, "expected a float array"),
        (lambda r, d, q1, q2, lp, a, g: list(r), "expected an array"),
    ],
    "sumtree_update": [
        (lambda tree, indices, values: None, "did you forget to `return` it?"),
        (lambda tree, indices, values: tree[:4], "expected the tree's (8,)"),
        (lambda tree, indices, values: tree > 0, "expected a float array"),
    ],
}


@pytest.mark.parametrize(("name", "fn", "fragment"), gh.bad_submissions(BAD))
def test_bad_submissions_are_reported(name, fn, fragment):
    gh.assert_bad_submission_reported(LESSON, name, fn, fragment)


def test_an_infinite_loop_times_out_and_an_exception_is_reported():
    gh.assert_infinite_loop_times_out(l06.SUMTREE_FIND, _forever, ["timeout"] + ["skipped"] * 4)

    def broken(tree, indices, values):
        return tree.no_such_attribute

    outcome = run_exercise(l06.SUMTREE_UPDATE, broken)
    assert outcome.results[0].status == "error" and "AttributeError" in outcome.message


def test_not_a_function_is_reported():
    outcome = run_exercise(l06.BICYCLE_STEP, 0.5)
    assert not outcome.passed and "not a function" in outcome.message


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_orphans")
def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = ("speed_before_position", "searchsorted_scan", "mean_normalisation", "max_of_critics", "first_write_wins")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
