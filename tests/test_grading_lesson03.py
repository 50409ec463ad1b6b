"""Lesson 03's graders, beyond what tests/test_exercises.py checks for every lesson (solution
passes, stub fails, planted bugs caught): the lesson's registry, the paper's classic slips
among the planted bugs, the library's own reference implementations pass the graders, and
`course grade` end to end."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import grading_helpers as gh
import numpy as np
import torch
from conftest import solution_function

from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import exercises_for, get_exercise
from course_lib.course.grading.lessons import l03_impala_vtrace as l03

ROOT = Path(__file__).resolve().parents[1]
LESSON = "03_impala_vtrace"
SOURCE = ROOT / "exercises" / "src" / f"{LESSON}.py"
NAMES = ("vtrace_targets", "pg_advantages", "learner_step", "actor_unroll")


def load_mutants() -> list[Any]:
    spec = importlib.util.spec_from_file_location("l03_mutants", ROOT / "tests" / "mutants" / f"l{LESSON}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS


MUTANTS = load_mutants()


def test_registry_lists_the_four_exercises():
    gh.assert_registry(LESSON, NAMES, ("3", "impala_vtrace"), points=55, min_checks=5)
    for e in exercises_for(LESSON):
        descriptions = [c.description for c in e.checks]
        assert len(set(descriptions)) == len(descriptions)
    assert get_exercise(LESSON, "learner_step") is l03.LEARNER_STEP


def test_the_papers_off_by_one_and_the_swap_are_among_the_planted_bugs():
    ids = {m.id for m in MUTANTS}
    assert {"vtrace_targets-inclusive_product", "vtrace_targets-rho_and_c_swapped"} <= ids


def test_the_long_case_leaves_no_trace_product_below_1():
    """A double sum stopping where the product gamma_s c_s ... reaches 0 (or gets small) must still be O(T^2)."""
    data = l03.long_trajectory()
    assert data["log_rhos"].shape == (l03.LONG_T, l03.LONG_B)
    assert (data["discounts"] == 1.0).all()
    assert (np.minimum(l03.LONG_C_BAR, np.exp(data["log_rhos"])) == 1.0).all()
    assert (np.exp(data["log_rhos"]) > l03.LONG_RHO_BAR).any()  # rho_bar still clips some ratios


def test_checks_leave_the_global_torch_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run_exercise(l03.ACTOR_UNROLL, solution_function(LESSON, "actor_unroll"))
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------------------
# The library's reference implementations pass the same checks (two independent codes agree)
# ---------------------------------------------------------------------------------------


def test_course_lib_vtrace_passes_the_graders():
    from course_lib.rl.vtrace import vtrace

    def targets(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0):
        return vtrace(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar, c_bar, None).vs

    for check in l03.VTRACE_TARGETS.checks:  # without the runner's guard, which refuses the library in a notebook
        check.fn(targets)
    # the library computes the advantages from its own targets: compare them with the oracle's formula
    data = l03.random_trajectory(3, 7, 3)
    out = vtrace(*(data[k] for k in l03.VT_ARGS), 1.5, 0.8, 1.2)
    np.testing.assert_allclose(
        out.pg_advantages,
        l03.naive_pg_advantages(
            data["log_rhos"], data["discounts"], data["rewards"], data["values"], out.vs, data["bootstrap_value"], 1.2
        ),
    )


def test_the_systems_learner_step_and_unroll_pass_the_checks():
    """The multi-process system's own pieces (``RolloutBuffers.batch``, ``rollout_lag``, the
    order of ``ActorLearnerSystem._learn``, ``actor.unroll``) satisfy the checks, run without
    the runner's guard (the guard refuses them in a learner's notebook)."""
    from course_lib.actor_learner.actor import unroll
    from course_lib.actor_learner.buffers import RolloutBuffers
    from course_lib.actor_learner.learner import rollout_lag

    def learner_step(slots, full, free_queue, learner, weights):
        buffers = RolloutBuffers(unroll=0, n_envs=0, obs_dim=0, n_slots=0, tensors=slots)
        batch = buffers.batch(list(full))  # copies: the slots can be refilled at once
        for index in full:
            free_queue.put(index)
        lags = rollout_lag(learner.version, batch["versions"])
        learner.update(batch)
        weights.publish(learner.model, learner.version)
        return lags

    def actor_unroll(envs, policy, obs, slot, version, generator):
        return unroll(envs, policy, obs, slot, version, generator)

    for exercise, fn in ((l03.LEARNER_STEP, learner_step), (l03.ACTOR_UNROLL, actor_unroll)):
        for check in exercise.checks:
            check.fn(fn)


def test_the_fake_free_queue_refills_a_slot_the_moment_it_is_freed():
    slots = l03._ls_slots(0, 3, 4, 2, {0: 5, 1: 6})
    kept = {k: t[1].clone() for k, t in slots.items()}
    view = slots["versions"][0]
    events = l03.LearnerEvents()
    l03.FakeFreeQueue(slots, events).put(0)
    assert events.freed() == [0]
    assert (view == l03.REFILL_VERSION).all() and torch.isnan(slots["rewards"][0]).all()
    assert all(torch.equal(slots[k][1], kept[k]) for k in slots)


def test_naive_nstep_return_agrees_with_discounted_returns():
    from course_lib.rl.pg import discounted_returns

    rng = np.random.default_rng(0)
    rewards, dones, boot = rng.normal(size=(9, 3)), rng.random((9, 3)) < 0.3, rng.normal(size=3)
    np.testing.assert_allclose(
        l03.naive_nstep_return(0.9 * (1 - dones), rewards, boot), discounted_returns(rewards, dones, 0.9, boot)
    )


# ---------------------------------------------------------------------------------------
# End to end through `course grade`
# ---------------------------------------------------------------------------------------


def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = ("inclusive_product", "uses_v_s", "frees_before_copying", "greedy")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
