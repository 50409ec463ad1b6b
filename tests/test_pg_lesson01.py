"""course_lib.rl.pg, lesson 01 additions: oracles, known values and properties."""

import math

import numpy as np
import pytest
import torch

from course_lib.rl.pg import (
    VarianceStats,
    categorical_score,
    discounted_returns,
    episode_returns,
    gradient_variance,
    group_relative_advantages,
    normalize_advantages,
    score_function_gradient,
    softmax,
    surrogate_loss,
)

# ---------------------------------------------------------------------------------------
# episode_returns: R(tau) of each step's episode
# ---------------------------------------------------------------------------------------


def naive_episode_returns(rewards, dones, gamma):
    """Find each step's episode [start, end] by scanning, then sum gamma^(k - start) r_k."""
    T = len(rewards)
    out = np.zeros(T)
    for t in range(T):
        start = t
        while start > 0 and not dones[start - 1]:
            start -= 1
        end = t
        while end < T - 1 and not dones[end]:
            end += 1
        out[t] = sum(gamma ** (k - start) * rewards[k] for k in range(start, end + 1))
    return out


def test_episode_returns_known_values():
    # episode 1 = steps 0-1, episode 2 = steps 2-4: R = 1 + .5 = 1.5 and 1 + .5 + .25 = 1.75
    got = episode_returns([1, 1, 1, 1, 1], [0, 1, 0, 0, 1], 0.5)
    np.testing.assert_allclose(got, [1.5, 1.5, 1.75, 1.75, 1.75])


@pytest.mark.parametrize("seed", range(5))
def test_episode_returns_matches_naive(seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 30))
    r, d = rng.normal(size=T), (rng.random(T) < 0.3).astype(float)
    gamma = float(rng.choice([0.5, 0.9, 1.0]))
    np.testing.assert_allclose(episode_returns(r, d, gamma), naive_episode_returns(r, d, gamma))


def test_episode_returns_first_step_equals_reward_to_go_and_batched_columns():
    rng = np.random.default_rng(0)
    r, d = rng.normal(size=(15, 3)), (rng.random((15, 3)) < 0.25).astype(float)
    R, G = episode_returns(r, d, 0.9), discounted_returns(r, d, 0.9)
    starts = np.vstack([np.ones((1, 3), bool), d[:-1] > 0])
    np.testing.assert_allclose(R[starts], G[starts])  # at an episode's first step R(tau) = G_t
    for b in range(3):
        np.testing.assert_allclose(R[:, b], episode_returns(r[:, b], d[:, b], 0.9))
    assert episode_returns([], [], 0.9).shape == (0,)


# ---------------------------------------------------------------------------------------
# softmax, categorical_score, score_function_gradient
# ---------------------------------------------------------------------------------------


def test_softmax_properties():
    z = np.array([[1000.0, 1000.0, 0.0], [-3.0, 0.0, 2.0]])
    p = softmax(z)
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=-1), 1.0)
    np.testing.assert_allclose(p[0], [0.5, 0.5, 0.0], atol=1e-12)
    np.testing.assert_allclose(softmax(z[1] + 7.0), p[1])  # shift invariant
    np.testing.assert_allclose(softmax(z.T, axis=0), p.T)


def test_categorical_score_is_the_gradient_of_log_softmax():
    z = np.array([0.3, -1.0, 2.0, 0.5])
    score = categorical_score(z, np.array([2, 0]))
    h = 1e-6
    for row, a in enumerate([2, 0]):
        fd = [(np.log(softmax(z + h * e)[a]) - np.log(softmax(z - h * e)[a])) / (2 * h) for e in np.eye(4)]
        np.testing.assert_allclose(score[row], fd, atol=1e-8)
    np.testing.assert_allclose(score.sum(axis=1), 0.0, atol=1e-12)  # onehot - pi sums to 0


def test_categorical_score_per_row_logits_and_errors():
    z = np.array([[0.0, 0.0], [np.log(3.0), 0.0]])
    np.testing.assert_allclose(categorical_score(z, np.array([0, 1])), [[0.5, -0.5], [-0.75, 0.75]])
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        categorical_score(z, np.array([0, 2]))
    with pytest.raises(ValueError, match=r"actions must be \[N\]"):
        categorical_score(z, np.array([[0]]))
    with pytest.raises(ValueError, match="logits must be"):
        categorical_score(np.zeros((3, 2)), np.array([0, 1]))


def test_score_function_gradient_known_value_and_unbiased():
    # uniform over 2 arms, one sample of arm 0 with reward 2: 2 * ([1, 0] - [.5, .5]) = [1, -1]
    np.testing.assert_allclose(score_function_gradient([0.0, 0.0], [0], [2.0]), [1.0, -1.0])
    z, mu = np.array([0.2, -0.4, 1.0]), np.array([1.0, 3.0, -2.0])
    pi = softmax(z)
    exact = pi * (mu - pi @ mu)
    # expectation over a ~ pi computed exactly: sum_a pi_a * mu_a (onehot(a) - pi)
    expect = sum(pi[a] * score_function_gradient(z, [a], [mu[a]]) for a in range(3))
    np.testing.assert_allclose(expect, exact, atol=1e-12)
    # a constant baseline leaves the expectation unchanged
    expect_b = sum(pi[a] * score_function_gradient(z, [a], [mu[a] - 5.0]) for a in range(3))
    np.testing.assert_allclose(expect_b, exact, atol=1e-12)
    assert score_function_gradient(z, np.array([], dtype=int), np.array([])).shape == (3,)
    with pytest.raises(ValueError, match="weights"):
        score_function_gradient(z, [0, 1], [1.0])


# ---------------------------------------------------------------------------------------
# normalize_advantages, group_relative_advantages
# ---------------------------------------------------------------------------------------


def test_normalize_advantages():
    a = normalize_advantages([1.0, 2.0, 3.0, 6.0])
    assert abs(a.mean()) < 1e-12 and abs(a.std() - 1.0) < 1e-6
    np.testing.assert_allclose(normalize_advantages([2.0, 2.0]), [0.0, 0.0])
    assert normalize_advantages([]).shape == (0,)


def naive_group(rewards, normalize_std, eps):
    out = np.zeros((len(rewards), len(rewards[0])))
    for i, row in enumerate(rewards):
        m = sum(row) / len(row)
        s = math.sqrt(sum((x - m) ** 2 for x in row) / len(row))
        out[i] = [(x - m) / (s + eps) if normalize_std else x - m for x in row]
    return out


def test_group_relative_advantages_known_values():
    r = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]]
    np.testing.assert_allclose(group_relative_advantages(r[:1], eps=0.0)[0], [1, -1, -1, 1])
    np.testing.assert_allclose(group_relative_advantages(r)[1], [0, 0, 0, 0])  # ties carry no signal
    np.testing.assert_allclose(group_relative_advantages(r, normalize_std=False)[0], [0.5, -0.5, -0.5, 0.5])
    np.testing.assert_allclose(group_relative_advantages([[0.0, 1.0]], eps=0.5), [[-0.5, 0.5]])


@pytest.mark.parametrize("seed", range(4))
def test_group_relative_advantages_matches_naive_and_is_invariant(seed):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(int(rng.integers(1, 6)), int(rng.integers(2, 9))))
    for flag in (True, False):
        np.testing.assert_allclose(group_relative_advantages(r, flag), naive_group(r.tolist(), flag, 1e-6))
    np.testing.assert_allclose(group_relative_advantages(3 * r + 2, eps=0.0), group_relative_advantages(r, eps=0.0))
    np.testing.assert_allclose(group_relative_advantages(r).sum(axis=1), 0.0, atol=1e-9)


def test_group_relative_advantages_bad_shape():
    with pytest.raises(ValueError, match=r"\[B, G\]"):
        group_relative_advantages([1.0, 0.0])
    assert group_relative_advantages(np.zeros((3, 0))).shape == (3, 0)


# ---------------------------------------------------------------------------------------
# surrogate_loss
# ---------------------------------------------------------------------------------------


def test_surrogate_loss_known_value_and_gradient():
    logits = torch.zeros(2, 2, requires_grad=True)
    loss = surrogate_loss(logits, torch.tensor([0, 1]), torch.tensor([1.0, 3.0]))
    assert loss.shape == () and math.isclose(loss.item(), 2 * math.log(2), rel_tol=1e-6)
    loss.backward()
    # -(1/N) A_i (onehot(a_i) - pi_i): row 0: -(1/2)(1)([1, 0] - .5) = [-.25, .25]
    np.testing.assert_allclose(logits.grad.numpy(), [[-0.25, 0.25], [0.75, -0.75]])


def test_surrogate_loss_gradient_is_minus_the_score_function_estimate():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(6, 4))
    a = rng.integers(0, 4, size=6)
    w = rng.normal(size=6)
    logits = torch.tensor(z, requires_grad=True)
    surrogate_loss(logits, torch.tensor(a), torch.tensor(w)).backward()
    expected = -(w[:, None] * categorical_score(z, a)) / 6
    np.testing.assert_allclose(logits.grad.numpy(), expected, atol=1e-12)


def test_surrogate_loss_detaches_advantages_and_checks_shapes():
    logits = torch.randn(3, 2, requires_grad=True)
    adv = torch.randn(3, requires_grad=True)
    surrogate_loss(logits, torch.tensor([0, 1, 1]), adv).backward()
    assert adv.grad is None and logits.grad is not None
    with pytest.raises(ValueError, match=r"\[N, K\]"):
        surrogate_loss(torch.zeros(3), torch.tensor([0]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"must be \[N\]"):
        surrogate_loss(torch.zeros(3, 2), torch.tensor([0, 1]), torch.zeros(3))


# ---------------------------------------------------------------------------------------
# gradient_variance
# ---------------------------------------------------------------------------------------


def test_gradient_variance_known_values():
    samples = np.array([[1.0, 0.0], [3.0, 0.0], [1.0, 2.0], [3.0, 2.0]])
    s = gradient_variance(samples, reference=[1.0, 0.0])
    assert isinstance(s, VarianceStats) and s.n_samples == 4
    assert math.isclose(s.mean_sq_norm, 2.0**2 + 1.0**2)
    assert math.isclose(s.total_variance, 4 / 3 + 4 / 3)  # each coordinate: var ddof=1 of (1, 3, 1, 3)
    assert math.isclose(s.relative_variance, (8 / 3) / 5)
    cos = [1.0, 1.0, 1 / math.sqrt(5), 3 / math.sqrt(13)]
    assert math.isclose(s.cosine_to_reference, float(np.mean(cos)))
    assert math.isnan(gradient_variance(samples).cosine_to_reference)


def test_gradient_variance_scale_free_relative_variance_and_errors():
    rng = np.random.default_rng(0)
    g = rng.normal(loc=1.0, size=(50, 4))
    a, b = gradient_variance(g), gradient_variance(10 * g)
    assert math.isclose(a.relative_variance, b.relative_variance) and math.isclose(
        100 * a.total_variance, b.total_variance
    )
    assert gradient_variance(np.zeros((3, 2))).relative_variance == float("inf")
    with pytest.raises(ValueError, match="M >= 2"):
        gradient_variance(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="reference"):
        gradient_variance(g, reference=np.zeros(3))


def test_group_relative_advantages_sample_std():
    """ddof = 1 is TRL's and verl's std: (r - mean) / (std_{G-1} + eps)."""
    r = np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_allclose(
        group_relative_advantages(r[:1], eps=0.0, ddof=1)[0], np.array([1, -1, -1, 1]) * np.sqrt(0.75)
    )
    np.testing.assert_allclose(group_relative_advantages(r, ddof=1)[1], 0.0)
    with pytest.raises(ValueError, match="ddof"):
        group_relative_advantages(r, ddof=2)
    with pytest.raises(ValueError, match="G >= 2"):
        group_relative_advantages([[1.0], [0.0]], ddof=1)


def test_leave_one_out_advantages_exclude_each_answers_own_reward():
    from course_lib.rl.pg import leave_one_out_advantages

    r = np.array([[1.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [3.0, 1.0, 0.0, 0.0]])
    naive = np.array([[r[i, j] - np.delete(r[i], j).mean() for j in range(4)] for i in range(3)])
    np.testing.assert_allclose(leave_one_out_advantages(r), naive, atol=1e-12)
    np.testing.assert_allclose(leave_one_out_advantages([[1, 0]]), [[1.0, -1.0]])
    # exact expectation on one softmax, all K^G groups enumerated: E[g] = grad J (the group mean gives 1 - 1/G)
    import itertools

    pi = np.array([0.5, 0.3, 0.2])
    reward = np.array([1.0, 0.0, 0.5])
    grad_j = pi * (reward - pi @ reward)
    for g_size in (2, 3):
        outcomes = np.array(list(itertools.product(range(3), repeat=g_size)))
        probs = pi[outcomes].prod(axis=1)
        for adv_fn, scale in (
            (leave_one_out_advantages, 1.0),
            (lambda x: group_relative_advantages(x, normalize_std=False), 1 - 1 / g_size),
        ):
            adv = adv_fn(reward[outcomes])
            est = sum(
                p * sum(adv[o, j] * (np.eye(3)[a] - pi) for j, a in enumerate(outcomes[o])) / g_size
                for o, p in enumerate(probs)
            )
            np.testing.assert_allclose(est, scale * grad_j, atol=1e-12)
    with pytest.raises(ValueError, match="G >= 2"):
        leave_one_out_advantages([[1.0]])
