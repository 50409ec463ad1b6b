"""Lesson 01's graders beyond what tests/test_exercises.py checks for every lesson:
catch every planted bug in tests/mutants/l01_policy_gradients.py with its message, and
their oracles agree with the library's reference implementations; end to end through
`course grade` too."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
import torch
from conftest import Mutant, mutant_function
from mutants.l01_policy_gradients import MUTANTS

from course_lib.course.grading import check
from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import exercises_for
from course_lib.course.grading.lessons import l01_policy_gradients as l01
from course_lib.course.notebooks.source import Target, render

ROOT = Path(__file__).resolve().parents[1]
LESSON = "01_policy_gradients"
SOURCE = ROOT / "exercises" / "src" / f"{LESSON}.py"
NAMES = ("rloo_advantages", "surrogate_loss", "group_relative_advantages", "reinforce_update")


def exercise_namespace(kind: Literal["exercise", "solution"]) -> dict[str, Any]:
    """Execute the import cell and the `exercise` cells of the generated notebook of `kind`."""
    nb = render(Target(LESSON, kind, SOURCE, ROOT / f"{kind}.ipynb"))
    ns: dict[str, Any] = {}
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "code" and ("exercise" in tags or cell.source.startswith("import")):
            exec(compile(cell.source, f"<{kind} cell>", "exec"), ns)
    return ns


@pytest.fixture(scope="module")
def solution() -> dict[str, Any]:
    return exercise_namespace("solution")


@pytest.fixture(scope="module")
def stub() -> dict[str, Any]:
    return exercise_namespace("exercise")


def find_mutant(function: str, name: str) -> Mutant:
    return next(m for m in MUTANTS if (m.function, m.name) == (function, name))


# ---------------------------------------------------------------------------------------
# Registry and exercise source
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# Solutions, stubs, planted bugs
# ---------------------------------------------------------------------------------------


def test_check_prints_deterministic_lines(solution, capsys):
    assert bool(check(LESSON, "group_relative_advantages", solution["group_relative_advantages"])) is True
    n = len(l01.GROUP_RELATIVE_ADVANTAGES.checks)
    assert capsys.readouterr().out == f"group_relative_advantages: PASS ({n}/{n} checks)\n"
    buggy = mutant_function(LESSON, find_mutant("surrogate_loss", "not_detached"))
    outputs = []
    for _ in range(2):
        assert bool(check(LESSON, "surrogate_loss", buggy)) is False
        outputs.append(capsys.readouterr().out)
    # the same verdict every time; the next hint tier on the repeat
    assert outputs[0].splitlines()[0] == outputs[1].splitlines()[0] and "0x" not in outputs[0]
    head, hint_line = outputs[0].splitlines()
    hints = l01.SURROGATE_LOSS.hints
    assert outputs[1].splitlines()[1] == f"hint 2/{len(hints)}: {hints[1]}"
    n = len(l01.SURROGATE_LOSS.checks)
    assert head.startswith(f"surrogate_loss: FAIL ({n - 1}/{n} checks): no gradient flows into the advantages")
    assert hint_line == f"hint: {l01.SURROGATE_LOSS.hints[0]}"


def test_checks_leave_the_global_torch_rng_alone(solution):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    run_exercise(l01.REINFORCE_UPDATE, solution["reinforce_update"])
    assert torch.equal(torch.rand(3), expected)


# ---------------------------------------------------------------------------------------
# The oracles against the library's reference implementations (two independent codes)
# ---------------------------------------------------------------------------------------


def test_oracle_reward_to_go_agrees_with_discounted_returns():
    from course_lib.rl.pg import discounted_returns

    for seed in range(10):
        rewards, dones = l01.random_rollout(seed, 1 + seed % 7 * 3, 1 + seed % 4)
        np.testing.assert_allclose(l01.naive_reward_to_go(rewards, dones, 0.9), discounted_returns(rewards, dones, 0.9))
    assert l01.naive_reward_to_go(np.zeros((0, 2)), np.zeros((0, 2)), 0.9).shape == (0, 2)


def test_oracle_rloo_agrees_with_the_library_and_the_group_mean_shrinks_by_1_minus_1_over_g():
    from course_lib.rl.pg import group_relative_advantages, leave_one_out_advantages

    rewards = np.random.default_rng(0).normal(size=(5, 7))
    np.testing.assert_allclose(l01.naive_rloo(rewards), leave_one_out_advantages(rewards), atol=1e-12)
    for group_size in (2, 3, 4):
        assert math.isclose(l01.exact_gradient_ratio(leave_one_out_advantages, group_size)[0], 1.0, rel_tol=1e-12)
        mean_only = l01.exact_gradient_ratio(lambda r: group_relative_advantages(r, normalize_std=False), group_size)
        assert math.isclose(mean_only[0], 1 - 1 / group_size, rel_tol=1e-12)


def test_oracle_surrogate_agrees_with_the_reference_and_autograd():
    from course_lib.rl.pg import surrogate_loss

    logits, actions, adv = l01._sur_inputs(3, 7, 4, torch.float64)
    loss = surrogate_loss(logits, actions, adv)
    assert math.isclose(loss.item(), l01.naive_surrogate(logits.detach(), actions, adv), rel_tol=1e-12)
    (grad,) = torch.autograd.grad(loss, logits)
    np.testing.assert_allclose(grad.numpy(), l01.naive_surrogate_grad(logits.detach(), actions, adv), atol=1e-12)


def test_oracle_group_advantages_agrees_with_the_reference():
    from course_lib.rl.pg import group_relative_advantages

    rewards = np.random.default_rng(0).normal(size=(5, 7))
    rewards[2] = 1.0
    for flag in (True, False):
        for ddof in (0, 1):
            np.testing.assert_allclose(
                l01.naive_group_advantages(rewards, flag, 1e-6, ddof),
                group_relative_advantages(rewards, flag, 1e-6, ddof=ddof),
                atol=1e-12,
            )


@pytest.mark.parametrize(
    ("function", "old", "new"),
    [
        # the population std (numpy's default) instead of the solution's sample std
        ("group_relative_advantages", "ddof=1, keepdims=True", "keepdims=True"),
        # TRL's default eps
        ("group_relative_advantages", "eps=1e-6):", "eps=1e-4):"),
        # torch's .std() (the sample std) for the batch normalisation, as CleanRL and SB3 write it
        (
            "reinforce_update",
            "    g = discounted_returns(rewards, dones, gamma)\n    adv = (g - g.mean()) / (g.std() + 1e-8)",
            "    g = torch.as_tensor(discounted_returns(rewards, dones, gamma))\n"
            "    adv = ((g - g.mean()) / (g.std() + 1e-8)).numpy()",
        ),
    ],
    ids=["gra-population-std", "gra-trl-eps", "update-torch-std"],
)
def test_either_std_convention_passes(function, old, new):
    """The statements accept the population and the sample std (TRL, verl, CleanRL use torch's sample std)."""
    variant = Mutant(function, "accepted_variant", old=old, new=new, expected="")
    outcome = run_exercise(getattr(l01, function.upper()), mutant_function(LESSON, variant))
    assert outcome.passed, outcome.message


def test_oracle_reinforce_gradient_agrees_with_the_reference_loop():
    from course_lib.rl.pg import discounted_returns, normalize_advantages, surrogate_loss

    data = l01._rollout(7, n_t=5, n_b=3, obs_dim=3, n_actions=3)
    policy = l01._make_policy(3, 3, 7).double()
    w = normalize_advantages(discounted_returns(data["rewards"], data["dones"], 0.9))
    loss = surrogate_loss(
        policy(torch.tensor(data["obs"].reshape(15, 3), dtype=torch.float64)),
        torch.tensor(data["actions"].reshape(-1)),
        torch.tensor(w.reshape(-1)),
    )
    grads = torch.autograd.grad(loss, list(policy.parameters()))
    oracle_w = l01.naive_normalized(l01.naive_reward_to_go(data["rewards"], data["dones"], 0.9))
    oracle_loss, oracle_grad = l01.naive_reinforce_loss_and_grad(policy, data["obs"], data["actions"], oracle_w)
    assert math.isclose(loss.item(), oracle_loss, rel_tol=1e-10)
    np.testing.assert_allclose(torch.cat([g.reshape(-1) for g in grads]).numpy(), oracle_grad, atol=1e-12)


# ---------------------------------------------------------------------------------------
# End to end through `course grade`
# ---------------------------------------------------------------------------------------


def test_the_exercises_are_worth_45_points():
    """``course grade`` on the committed notebooks (full marks, zero, their totals) is
    tests/test_grade_course_notebooks.py, for every lesson."""
    assert sum(e.points for e in exercises_for(LESSON)) == 45


def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug.

    reinforce_update calls the notebook's own surrogate_loss, which is checked first: with a
    bug in surrogate_loss, reinforce_update's report names surrogate_loss (and its bug), not
    its own; the other exercises fail with their own bugs' messages."""
    from conftest import grade_with_planted_bugs

    picked = (
        "rloo_advantages-own_reward_included",
        "surrogate_loss-not_detached",
        "group_relative_advantages-batch_mean",
        "reinforce_update-returns_tensor",
    )
    chosen = {m.function: m for m in MUTANTS if m.id in picked}
    rc, report = grade_with_planted_bugs(LESSON, chosen, tmp_path)
    assert rc != 0 and report["score"] == 0
    messages = {ex["name"]: ex["message"] for ex in report["exercises"]}
    assert set(messages) == set(NAMES)
    for name in NAMES[:3]:
        assert chosen[name].expected in messages[name], (name, messages[name])
    assert "fix surrogate_loss first (exercise 2; reinforce_update calls it)" in messages["reinforce_update"]
    assert chosen["surrogate_loss"].expected in messages["reinforce_update"]


# ---------------------------------------------------------------------------------------
# A slip in exercise 2 is named there, not in exercise 4 (issue 45)
# ---------------------------------------------------------------------------------------


def reinforce_update_beside(planted: Mutant | None = None, stub: str = "") -> Any:
    """The solution's reinforce_update, defined in a namespace where ``planted`` (a planted bug of
    surrogate_loss) or the stub of ``stub`` replaces that function."""
    from conftest import _namespace, exercise_function_source, mutant_source

    namespace = dict(_namespace(LESSON, "solution"))
    if planted is not None:
        exec(compile(mutant_source(LESSON, planted), "<planted>", "exec"), namespace)
    if stub:
        exec(compile(exercise_function_source(LESSON, stub, "exercise"), "<stub>", "exec"), namespace)
    exec(compile(exercise_function_source(LESSON, "reinforce_update", "solution"), "<update>", "exec"), namespace)
    return namespace["reinforce_update"]


@pytest.mark.parametrize(
    ("function", "name"),
    [("surrogate_loss", "sum"), ("surrogate_loss", "log_of_softmax")],
)
def test_a_slip_in_a_function_it_calls_is_named_first(function, name):
    """The brief's case: a sum for a mean in surrogate_loss once scored 0 on reinforce_update
    with "parameter 42 changed by -0.240667"; now the message names surrogate_loss and its slip."""
    planted = find_mutant(function, name)
    outcome = run_exercise(l01.REINFORCE_UPDATE, reinforce_update_beside(planted))
    assert not outcome.passed
    assert outcome.message.startswith(l01.REINFORCE_UPDATE.checks[0].description + ": ")
    assert f"fix {function} first (exercise {NAMES.index(function) + 1}; reinforce_update calls it)" in outcome.message
    assert planted.expected in outcome.message, outcome.message
    assert "changed by" not in outcome.message


def test_an_unsolved_function_it_calls_is_named():
    outcome = run_exercise(l01.REINFORCE_UPDATE, reinforce_update_beside(stub="surrogate_loss"))
    assert not outcome.passed
    assert "reinforce_update calls your surrogate_loss, which is not implemented yet: solve exercise 2 first" in (
        outcome.message
    )


def test_the_library_functions_the_statement_offers_are_allowed(solution):
    """The statement offers course_lib.rl.pg's discounted_returns (which the solution calls) and
    surrogate_loss to a learner stuck on exercise 2: reinforce_update built on them passes (and
    the library's surrogate_loss is not checked as the learner's own)."""
    from conftest import _namespace, exercise_function_source

    namespace = dict(_namespace(LESSON, "solution"))
    exec("from course_lib.rl.pg import surrogate_loss", namespace)
    exec(compile(exercise_function_source(LESSON, "reinforce_update", "solution"), "<update>", "exec"), namespace)
    outcome = run_exercise(l01.REINFORCE_UPDATE, namespace["reinforce_update"])
    assert outcome.passed, outcome.message
