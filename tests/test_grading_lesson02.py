"""Lesson 02's graders beyond what tests/test_exercises.py checks for every lesson:
planted bugs of tests/mutants/l02_importance_sampling.py in context,
and their oracles agree with course_lib.rl.importance; end to end through `course grade` too."""

from __future__ import annotations

import math
from pathlib import Path

import grading_helpers as gh
import numpy as np
import pytest
import torch
from conftest import Mutant, mutant_function, solution_function
from mutants.l02_importance_sampling import MUTANTS

from course_lib.course.grading import check
from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import exercises_for, get_exercise
from course_lib.course.grading.lessons import l02_importance_sampling as l02

ROOT = Path(__file__).resolve().parents[1]
LESSON = "02_importance_sampling"
SOURCE = ROOT / "exercises" / "src" / f"{LESSON}.py"
NAMES = (
    "tis_ppo_loss",
    "effective_sample_size",
    "expected_ess_fraction",
    "token_and_sequence_ratios",
)


def find_mutant(function: str, name: str) -> Mutant:
    return next(m for m in MUTANTS if (m.function, m.name) == (function, name))


# ---------------------------------------------------------------------------------------
# Registry and exercise source
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# Solutions, stubs, planted bugs
# ---------------------------------------------------------------------------------------


def test_check_prints_deterministic_lines(capsys):
    name = "expected_ess_fraction"
    assert bool(check(LESSON, name, solution_function(LESSON, name))) is True
    n = len(l02.EXPECTED_ESS_FRACTION.checks)
    assert capsys.readouterr().out == f"{name}: PASS ({n}/{n} checks)\n"
    wrong = mutant_function(LESSON, find_mutant(name, "probability_space"))
    outputs = []
    for _ in range(2):
        assert bool(check(LESSON, name, wrong)) is False
        outputs.append(capsys.readouterr().out)
    # the same verdict every time; the next hint tier on the repeat
    assert outputs[0].splitlines()[0] == outputs[1].splitlines()[0] and "0x" not in outputs[0]
    head, hint_line = outputs[0].splitlines()
    hints = l02.EXPECTED_ESS_FRACTION.hints
    assert outputs[1].splitlines()[1] == f"hint 2/{len(hints)}: {hints[1]}"
    assert head.startswith(f"{name}: FAIL ({n - 1}/{n} checks): log-probabilities near -800")
    assert hint_line == f"hint: {l02.EXPECTED_ESS_FRACTION.hints[0]}"


def test_checks_leave_the_global_random_states_alone():
    torch.manual_seed(123)
    np.random.seed(123)
    expected = torch.rand(3), np.random.rand(3)
    torch.manual_seed(123)
    np.random.seed(123)
    for name in NAMES:
        run_exercise(get_exercise(LESSON, name), solution_function(LESSON, name))
    assert torch.equal(torch.rand(3), expected[0]) and np.array_equal(np.random.rand(3), expected[1])


# ---------------------------------------------------------------------------------------
# The oracles against course_lib.rl.importance (two independent codes vouch for each other)
# ---------------------------------------------------------------------------------------


def test_oracles_agree_with_the_library():
    from course_lib.rl import importance

    rng = np.random.default_rng(0)
    for k in (2, 8, 50):
        pi, mu = rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k))
        assert l02.naive_expected_ess_fraction(np.log(pi), np.log(mu)) == pytest.approx(
            importance.expected_ess_fraction(np.log(pi), np.log(mu)), rel=1e-10
        )
        assert importance.expected_ess_fraction(np.log(pi), np.log(mu)) <= math.exp(-importance.categorical_kl(pi, mu))
    w = rng.exponential(size=30)
    assert l02.naive_ess(w) == pytest.approx(importance.effective_sample_size(w), rel=1e-12)
    assert l02.naive_ess(np.zeros(3)) == importance.effective_sample_size(np.zeros(3)) == 0.0
    new, old, mask = l02._padded_batch(3, 5, 9)
    for ours, theirs in zip(
        l02.naive_token_and_sequence_ratios(new, old, mask),
        importance.token_and_sequence_ratios(new, old, mask),
        strict=True,
    ):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_tis_ppo_oracle_agrees_with_the_library_loss_and_autograd():
    from course_lib.rl.importance import tis_ppo_loss

    new, old, beh, _, mask = batch = l02._tis_random(7, 6, 12, spread=0.5)
    assert np.isnan(beh[~mask]).any() and np.isinf(old[~mask]).any(), "padding holds NaN and -inf"
    for eps, c in ((0.2, 1.2), (0.1, 2.0), (0.3, math.inf)):
        new_t, old_t, beh_t, adv_t, mask_t = l02._tis_tensors(batch)
        loss = tis_ppo_loss(new_t, old_t, beh_t, adv_t, mask_t, eps=eps, c=c)
        (grad,) = torch.autograd.grad(loss, new_t)
        oracle_loss, oracle_grad = l02.naive_tis_ppo_loss_and_grad(batch, eps, c)
        assert loss.item() == pytest.approx(oracle_loss, rel=1e-12)
        np.testing.assert_allclose(grad.numpy(), oracle_grad, atol=1e-14)
    r, v = np.exp(new[mask] - old[mask]), np.exp(old[mask] - beh[mask])
    assert r.min() < 0.8 and r.max() > 1.2 and v.min() < 1 < 2 < v.max(), "both thresholds and c = 2 are crossed"


def test_the_library_losses_stay_finite_at_a_float32_log_ratio_of_100():
    from course_lib.rl.importance import clipped_surrogate_loss, tis_ppo_loss

    new = torch.tensor([[95.0, -1.0]], dtype=torch.float32, requires_grad=True)
    old = torch.tensor([[-5.0, -1.2]], dtype=torch.float32)
    adv = torch.tensor([1.0], dtype=torch.float32)
    for loss in (clipped_surrogate_loss(new[0], old[0], adv.expand(2)), tis_ppo_loss(new, old, old, adv)):
        (grad,) = torch.autograd.grad(loss, new)
        assert torch.isfinite(loss) and torch.isfinite(grad).all()


# ---------------------------------------------------------------------------------------
# End to end through `course grade`
# ---------------------------------------------------------------------------------------


def test_the_exercises_are_worth_40_points():
    """``course grade`` on the committed notebooks (full marks, zero, their totals) is
    tests/test_grade_course_notebooks.py, for every lesson."""
    assert sum(e.points for e in exercises_for(LESSON)) == 40


def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug
    (each exercise's first)."""
    picked = [next(m for m in MUTANTS if m.function == name).id for name in NAMES]
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
