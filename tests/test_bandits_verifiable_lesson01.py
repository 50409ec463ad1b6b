"""course_lib.rl.bandits and course_lib.rl.verifiable (lesson 01): exact gradients against finite
differences, estimators against exact expectations, the verifier on known cases."""

import math

import numpy as np
import pytest

from course_lib.rl.bandits import CategoricalBandit, finite_difference_gradient
from course_lib.rl.pg import score_function_gradient, softmax
from course_lib.rl.verifiable import (
    ESTIMATORS,
    ArithmeticTask,
    GroupBatch,
    advantages,
    gradients_by_estimator,
    logit_table_gradient,
    make_arithmetic_task,
    sample_and_grade,
    sample_answers,
    train_answer_policy,
    verify,
)

BANDIT = CategoricalBandit((0.2, 0.4, 0.6, 0.8, 0.9))
Z = np.array([0.5, -0.3, 0.0, 0.2, -0.6])

# ---------------------------------------------------------------------------------------
# bandits
# ---------------------------------------------------------------------------------------


def test_bandit_exact_gradient_matches_finite_differences():
    np.testing.assert_allclose(
        BANDIT.exact_gradient(Z), finite_difference_gradient(BANDIT.expected_reward, Z), atol=1e-9
    )
    assert math.isclose(BANDIT.expected_reward(np.zeros(5)), 0.58)  # uniform policy: mean of mu
    assert BANDIT.n_arms == 5 and BANDIT.mu.shape == (5,)


def test_finite_difference_gradient_of_a_quadratic():
    f = lambda x: float(x @ np.array([[2.0, 1.0], [1.0, 4.0]]) @ x)  # noqa: E731 - gradient (A + A^T) x
    np.testing.assert_allclose(finite_difference_gradient(f, [1.0, -2.0]), [0.0, -14.0], atol=1e-6)


@pytest.mark.parametrize("probs", [(0.5,), (0.2, 1.5), ((0.1, 0.2),)])
def test_bandit_rejects_bad_probabilities(probs):
    with pytest.raises(ValueError, match="success_probs"):
        CategoricalBandit(probs)


def test_bandit_pull_frequencies():
    arms, rewards = BANDIT.pull(Z, 200_000, np.random.default_rng(0))
    np.testing.assert_allclose(np.bincount(arms, minlength=5) / arms.size, softmax(Z), atol=4e-3)
    assert set(np.unique(rewards)) <= {0.0, 1.0}
    assert abs(rewards.mean() - BANDIT.expected_reward(Z)) < 5e-3


def test_vectorised_estimates_equal_the_score_function_formula():
    """`estimates` (bincount) must give exactly what `score_function_gradient` gives on the same draws."""
    n, reps = 50, 7
    est = BANDIT.estimates(Z, n, reps, np.random.default_rng(3), baseline=0.4)
    rng = np.random.default_rng(3)  # replay the same random numbers
    cdf = np.cumsum(softmax(Z))
    arms = np.minimum(np.searchsorted(cdf, rng.random((reps, n)), side="right"), 4)
    rewards = (rng.random((reps, n)) < BANDIT.mu[arms]).astype(float)
    for r in range(reps):
        np.testing.assert_allclose(est[r], score_function_gradient(Z, arms[r], rewards[r] - 0.4), atol=1e-12)


def test_estimates_are_unbiased_and_the_baseline_reduces_error():
    est = BANDIT.estimates(Z, 1_000, 400, np.random.default_rng(1))
    exact = BANDIT.exact_gradient(Z)
    se = est.std(axis=0) / math.sqrt(400)
    assert np.all(np.abs(est.mean(axis=0) - exact) < 5 * se + 1e-12)
    one = BANDIT.estimate(Z, 10, np.random.default_rng(0))
    assert one.shape == (5,)
    plain = BANDIT.estimate_errors(Z, [10, 1000], 300, seed=2)
    base = BANDIT.estimate_errors(Z, [10, 1000], 300, seed=2, baseline=BANDIT.expected_reward(Z))
    assert np.all(base < plain)
    assert 5 < plain[0] / plain[1] < 20  # 100x the samples: about 10x smaller error


# ---------------------------------------------------------------------------------------
# the verifier and the task
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt, answer, ok",
    [
        ("8 * 7 =", "56", True),
        ("8 * 7 =", "57", False),
        ("29 - 36 =", "-7", True),
        ("2 + 2 =", " 4 ", True),
        ("2 + 2 =", "four", False),
        ("2 + 2 =", "4.0", False),
        ("2 + 2 =", "", False),
        ("-3 * -3 =", "9", True),
    ],
)
def test_verify(prompt, answer, ok):
    assert verify(prompt, answer) is ok


def test_verify_rejects_non_prompts():
    with pytest.raises(ValueError, match="arithmetic prompt"):
        verify("what is 2 + 2?", "4")


def test_make_arithmetic_task_is_seeded_and_has_exactly_one_right_answer():
    task = make_arithmetic_task(40, 6, seed=3)
    again = make_arithmetic_task(40, 6, seed=3)
    assert task.prompts == again.prompts and task.candidates == again.candidates
    assert task.n_prompts == 40 and task.n_candidates == 6 and task.correct.shape == (40, 6)
    np.testing.assert_array_equal(task.correct.sum(axis=1), 1)
    for p, cands in zip(task.prompts, task.candidates):
        assert len(set(cands)) == 6
        assert sum(verify(p, c) for c in cands) == 1
    assert make_arithmetic_task(40, 6, seed=4).prompts != task.prompts
    with pytest.raises(ValueError, match="n_candidates"):
        make_arithmetic_task(3, 1, seed=0)


def small_task() -> ArithmeticTask:
    return make_arithmetic_task(6, 4, seed=0)


def test_task_accuracy_rewards_and_exact_gradient():
    task = small_task()
    z = np.random.default_rng(0).normal(size=(6, 4))
    assert math.isclose(task.accuracy(z), float(np.mean((softmax(z) * task.correct).sum(axis=1))))
    assert math.isclose(task.accuracy(50 * task.correct), 1.0)
    f = lambda flat: task.accuracy(flat.reshape(6, 4))  # noqa: E731
    np.testing.assert_allclose(
        task.exact_gradient(z), finite_difference_gradient(f, z.reshape(-1)).reshape(6, 4), atol=1e-9
    )
    r = task.rewards(np.array([0, 1]), np.array([[0, 1, 2], [3, 3, 0]]))
    np.testing.assert_array_equal(r, [task.correct[0, [0, 1, 2]], task.correct[1, [3, 3, 0]]])


def test_sample_answers_frequencies():
    z = np.log(np.array([[0.1, 0.2, 0.7], [0.5, 0.5, 0.0 + 1e-300]]))
    a = sample_answers(z, np.array([0, 1]), 100_000, np.random.default_rng(0))
    assert a.shape == (2, 100_000) and a.dtype == np.int64
    np.testing.assert_allclose(np.bincount(a[0], minlength=3) / 1e5, [0.1, 0.2, 0.7], atol=5e-3)
    assert a[1].max() <= 1


# ---------------------------------------------------------------------------------------
# estimators
# ---------------------------------------------------------------------------------------


def dense_logit_table_gradient(z, prompt_ids, answer_ids, w):
    """Oracle: loop over every sample, add w * (onehot - pi) to its prompt's row."""
    g = np.zeros_like(z)
    n_b, n_g = answer_ids.shape
    for i in range(n_b):
        pi = softmax(z[prompt_ids[i]])
        for j in range(n_g):
            onehot = np.eye(z.shape[1])[answer_ids[i, j]]
            g[prompt_ids[i]] += w[i, j] * (onehot - pi)
    return g / (n_b * n_g)


def test_policy_gradient_matches_the_dense_loop():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(5, 4))
    p = np.array([0, 3, 3, 1])  # a repeated prompt accumulates
    a = rng.integers(0, 4, size=(4, 6))
    w = rng.normal(size=(4, 6))
    np.testing.assert_allclose(logit_table_gradient(z, p, a, w), dense_logit_table_gradient(z, p, a, w), atol=1e-12)


def test_advantages_per_estimator():
    r = np.array([[1.0, 0.0, 0.0, 1.0]])
    np.testing.assert_allclose(advantages(r, "no baseline"), r)
    np.testing.assert_allclose(advantages(r, "group mean"), [[0.5, -0.5, -0.5, 0.5]])
    # GRPO as TRL and verl compute it: the sample std, (1 - 0.5) / sqrt(1/3)
    np.testing.assert_allclose(advantages(r, "group mean / std"), np.array([[1, -1, -1, 1]]) * np.sqrt(0.75), atol=1e-5)
    with pytest.raises(ValueError, match="unknown estimator"):
        advantages(r, "rloo")


def test_sample_and_grade_batch():
    task = small_task()
    batch = sample_and_grade(task, np.zeros((6, 4)), 6, 5, np.random.default_rng(0))
    assert isinstance(batch, GroupBatch)
    assert sorted(batch.prompt_ids.tolist()) == list(range(6))  # all prompts, no repeats
    np.testing.assert_array_equal(batch.rewards, task.rewards(batch.prompt_ids, batch.answer_ids))
    ties = GroupBatch(np.array([0, 1]), np.zeros((2, 3), dtype=np.int64), np.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]))
    assert ties.zero_signal_fraction == 0.5


def test_estimators_are_unbiased_up_to_their_known_scale():
    """Exact expectations: no baseline = grad J; group mean = (1 - 1/G) grad J; offsets change nothing."""
    task = small_task()
    z = np.random.default_rng(2).normal(size=(6, 4))
    exact = task.exact_gradient(z).reshape(-1)
    group = 4
    samples = gradients_by_estimator(task, z, 4_000, n_prompts=6, group_size=group, seed=0, reward_offset=1.0)
    for name, scale in (("no baseline", 1.0), ("group mean", 1 - 1 / group)):
        mean = samples[name].mean(axis=0)
        se = samples[name].std(axis=0) / math.sqrt(4_000)
        assert np.all(np.abs(mean - scale * exact) < 5 * se + 1e-12), name
    assert set(samples) == set(ESTIMATORS) and samples["group mean"].shape == (4_000, 24)


def test_group_estimators_ignore_the_reward_offset():
    task = small_task()
    z = np.zeros((6, 4))
    a = gradients_by_estimator(task, z, 20, 6, 4, seed=5, reward_offset=0.0)
    b = gradients_by_estimator(task, z, 20, 6, 4, seed=5, reward_offset=3.0)
    np.testing.assert_allclose(a["group mean"], b["group mean"], atol=1e-12)
    np.testing.assert_allclose(a["group mean / std"], b["group mean / std"], atol=1e-9)
    assert not np.allclose(a["no baseline"], b["no baseline"])


def test_train_answer_policy_learns_and_is_seeded():
    task = make_arithmetic_task(16, 4, seed=1)
    z0 = np.zeros((16, 4))
    curve = train_answer_policy(task, z0, "group mean / std", steps=60, n_prompts=8, group_size=4, lr=5.0, seed=0)
    assert curve.accuracy.shape == (61,) and curve.zero_signal.shape == (60,) and curve.final_logits.shape == (16, 4)
    assert curve.accuracy[0] == pytest.approx(0.25) and curve.accuracy[-1] > 0.8
    again = train_answer_policy(task, z0, "group mean / std", steps=60, n_prompts=8, group_size=4, lr=5.0, seed=0)
    np.testing.assert_array_equal(curve.accuracy, again.accuracy)
    assert np.all(z0 == 0)  # the initial logits are not modified
