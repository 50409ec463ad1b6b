"""course_lib.rl.pg: discounted returns against a naive oracle, known values, properties."""

import numpy as np
import pytest

from course_lib.rl.pg import discounted_returns, finished_episode_returns


def naive_returns(rewards, dones, gamma, bootstrap=0.0):
    """Eq. (00.1) written out: sum over the rest of t's episode, O(T^2)."""
    T = len(rewards)
    out = np.zeros(T)
    for t in range(T):
        total, k = 0.0, t
        while True:
            total += gamma ** (k - t) * rewards[k]
            if dones[k] or k == T - 1:
                break
            k += 1
        if k == T - 1 and not dones[k]:
            total += gamma ** (T - t) * bootstrap
        out[t] = total
    return out


def test_known_values():
    got = discounted_returns([1, 1, 1, 1], [0, 1, 0, 0], 0.5)
    np.testing.assert_allclose(got, [1.5, 1.0, 1.5, 1.0])


def test_bootstrap_only_when_last_step_did_not_end():
    np.testing.assert_allclose(discounted_returns([1.0, 1.0], [0, 0], 0.5, bootstrap=4.0), [2.5, 3.0])
    np.testing.assert_allclose(discounted_returns([1.0, 1.0], [0, 1], 0.5, bootstrap=4.0), [1.5, 1.0])


@pytest.mark.parametrize("seed", range(5))
def test_matches_naive_oracle(seed):
    rng = np.random.default_rng(seed)
    T = int(rng.integers(1, 40))
    rewards = rng.normal(size=T)
    dones = (rng.random(T) < 0.2).astype(float)
    gamma = float(rng.uniform(0, 1))
    boot = float(rng.normal())
    np.testing.assert_allclose(
        discounted_returns(rewards, dones, gamma, boot), naive_returns(rewards, dones, gamma, boot), rtol=1e-12
    )


def test_batched_equals_columns():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(12, 3))
    dones = (rng.random((12, 3)) < 0.3).astype(float)
    boot = rng.normal(size=3)
    batched = discounted_returns(rewards, dones, 0.9, boot)
    for b in range(3):
        np.testing.assert_allclose(batched[:, b], discounted_returns(rewards[:, b], dones[:, b], 0.9, boot[b]))


def test_two_episodes_equal_apart():
    r1, r2 = [1.0, 2.0, 3.0], [4.0, 5.0]
    together = discounted_returns(r1 + r2, [0, 0, 1, 0, 1], 0.7)
    np.testing.assert_allclose(together[:3], discounted_returns(r1, [0, 0, 1], 0.7))
    np.testing.assert_allclose(together[3:], discounted_returns(r2, [0, 1], 0.7))


def test_gamma_zero_gives_rewards_and_empty_is_empty():
    np.testing.assert_array_equal(discounted_returns([3.0, -1.0, 2.0], [0, 0, 0], 0.0), [3.0, -1.0, 2.0])
    assert discounted_returns([], [], 0.9).shape == (0,)


def test_finished_episode_returns_known_values_and_gamma_one_returns():
    np.testing.assert_array_equal(finished_episode_returns([1, 2, 3, 4, 5, 6], [0, 1, 0, 0, 1, 0]), [3.0, 12.0])
    np.testing.assert_array_equal(finished_episode_returns([1.0, -1.0], [1, 1]), [1.0, -1.0])
    for rewards, dones in (([1.0, 2.0], [0, 0]), ([], [])):
        out = finished_episode_returns(rewards, dones)
        assert out.shape == (0,) and out.dtype == np.float64
    rng = np.random.default_rng(3)
    rewards, dones = rng.normal(size=200), (rng.random(200) < 0.1).astype(float)
    ends = np.flatnonzero(dones)
    starts = np.r_[0, ends[:-1] + 1]
    got = finished_episode_returns(rewards, dones)
    np.testing.assert_allclose(got, discounted_returns(rewards, dones, 1.0)[starts], rtol=1e-12)  # R_j = G_{s_j}
    assert got.sum() == pytest.approx(rewards[: ends[-1] + 1].sum())
    with pytest.raises(ValueError, match=r"\[T\]"):
        finished_episode_returns(np.zeros((2, 2)), np.zeros((2, 2)))


@pytest.mark.parametrize(
    "args, match",
    [
        (([1.0, 2.0], [0], 0.9), "same shape"),
        (([1.0], [0], 1.5), "gamma"),
        ((np.zeros((2, 2, 2)), np.zeros((2, 2, 2)), 0.9), r"\[T\]"),
    ],
)
def test_bad_input_named(args, match):
    with pytest.raises(ValueError, match=match):
        discounted_returns(*args)
