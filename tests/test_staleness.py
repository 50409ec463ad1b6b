"""course_lib.rl.staleness: the vectorised stale-batch CartPole grid of lesson 02, section 4."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from course_lib import describe
from course_lib.rl.importance import clipped_surrogate_loss, correction_coefficients, tis_ppo_loss, truncated_is_loss
from course_lib.rl.staleness import (
    StaleBatch,
    StalenessConfig,
    label,
    linear_policy_gradient,
    log_policy,
    normalized_advantages,
    run_staleness_grid,
    stale_policy,
)

TINY = dict(n_seeds=2, n_envs=2, n_updates=4, max_episode_steps=20)


def test_log_policy_is_a_log_softmax_per_run():
    rng = np.random.default_rng(0)
    params, x = rng.normal(size=(3, 5, 2)), rng.normal(size=(4, 3, 2, 5))
    logp = log_policy(params, x)
    np.testing.assert_allclose(np.exp(logp).sum(axis=-1), 1.0)
    z = np.einsum("tgei,gio->tgeo", x, params)
    np.testing.assert_allclose(logp, z - np.log(np.exp(z).sum(axis=-1, keepdims=True)))


@pytest.mark.parametrize("correction", ["none", "is", "truncated", "clip", "decoupled"])
def test_closed_form_gradient_equals_autograd_of_the_losses(correction):
    """linear_policy_gradient(psi) is minus the gradient of importance.py's losses, run by run."""
    rng = np.random.default_rng(1)
    n_t, n_runs, n_envs = 7, 2, 3
    params = rng.normal(scale=0.5, size=(n_runs, 5, 2))
    behaviour = params + rng.normal(scale=0.3, size=params.shape)
    prox = params + rng.normal(scale=0.1, size=params.shape)  # decoupled PPO's pi_{t-1}
    x = rng.normal(size=(n_t, n_runs, n_envs, 5))
    actions = rng.integers(0, 2, size=(n_t, n_runs, n_envs))
    mask = rng.random((n_t, n_runs, n_envs)) < 0.8
    adv = rng.normal(size=(n_t, n_runs, n_envs))
    take = lambda lp: np.take_along_axis(lp, actions[..., None], -1)[..., 0]  # noqa: E731
    w = np.exp(take(log_policy(params, x)) - take(log_policy(behaviour, x)))
    v = np.exp(take(log_policy(prox, x)) - take(log_policy(behaviour, x)))
    psi = correction_coefficients(correction, w, adv, c=1.0, eps=0.2, prox_ratios=v)
    ours = linear_policy_gradient(params, x, actions, psi, mask)
    for g in range(n_runs):
        weights = torch.tensor(params[g], requires_grad=True)
        real = mask[:, g]
        feats = torch.tensor(x[:, g][real])
        logp_new = torch.log_softmax(feats @ weights, -1).gather(1, torch.tensor(actions[:, g][real])[:, None])[:, 0]
        logp_old = torch.tensor(take(log_policy(behaviour, x))[:, g][real])
        a = torch.tensor(adv[:, g][real])
        if correction == "decoupled":
            logp_prox = torch.tensor(take(log_policy(prox, x))[:, g][real])
            loss = tis_ppo_loss(logp_new, logp_prox, logp_old, a, eps=0.2, c=1.0)
        elif correction == "clip":
            loss = clipped_surrogate_loss(logp_new, logp_old, a, eps=0.2)
        elif correction == "none":
            loss = truncated_is_loss(logp_new, logp_new.detach(), a)  # weight 1: REINFORCE
        else:
            loss = truncated_is_loss(logp_new, logp_old, a, c=1.0 if correction == "truncated" else np.inf)
        (grad,) = torch.autograd.grad(loss, weights)
        np.testing.assert_allclose(ours[g], -grad.numpy(), rtol=1e-9, atol=1e-12)


def test_normalized_advantages_per_run():
    rewards = np.ones((3, 4))  # [T, G * E] with G = 2 runs of E = 2 envs
    dones = np.array([[0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 1, 0]], dtype=float)
    mask = np.ones((3, 2, 2), dtype=bool)
    batch = StaleBatch(
        np.zeros((3, 2, 2, 5)), np.zeros((3, 2, 2), dtype=np.int64), rewards, dones, mask, np.zeros((3, 2, 2))
    )
    adv = normalized_advantages(batch, gamma=1.0)
    for g in range(2):
        np.testing.assert_allclose(adv[:, g].mean(), 0.0, atol=1e-12)
        np.testing.assert_allclose(adv[:, g].std(), 1.0, rtol=1e-6)


def test_config_cells_and_validation():
    config = StalenessConfig(lags=(0, 2), corrections=("none", "clip"))
    assert config.runs == ((0, "none"), (2, "none"), (2, "clip"))
    assert label(0, "clip") == "on-policy (k = 0)" and label(4, "truncated") == "k = 4, truncated IS"
    assert "max_episode_steps" in describe(config)
    with pytest.raises(ValueError, match=">= 0"):
        StalenessConfig(lags=(-1,))
    with pytest.raises(ValueError, match="unknown corrections"):
        StalenessConfig(corrections=("vtrace",))
    with pytest.raises(ValueError, match="c >= 1"):
        StalenessConfig(c=0.5)


def test_tiny_grid_shapes_and_on_policy_invariants():
    config = StalenessConfig(lags=(0, 1, 3), **TINY)
    grid = run_staleness_grid(config)
    shape = (config.n_updates, len(config.runs), config.n_seeds)
    assert (
        grid.returns.shape
        == grid.sampler_returns.shape
        == grid.ess.shape
        == grid.kl.shape
        == grid.modified.shape
        == shape
    )
    for returns in (grid.returns, grid.sampler_returns):
        assert np.all((returns >= 1) & (returns <= config.max_episode_steps))
    on = grid.index(0, "clip")
    assert on == grid.index(0, "none") == 0
    np.testing.assert_allclose(grid.ess[:, on], 1.0)
    np.testing.assert_allclose(grid.kl[:, on], 0.0, atol=1e-12)
    np.testing.assert_allclose(grid.kl[0], 0.0, atol=1e-12)  # at update 0 every sampler is the initial policy
    assert np.all(grid.kl[1:, grid.index(1, "none")] > 0)
    assert grid.env_steps > 0 and grid.seconds > 0
    table = grid.table()
    assert set(table) == set(config.runs)
    assert grid.best(1) in config.corrections
    np.testing.assert_allclose(grid.mean_return(last=1), grid.returns[-1])


def test_grid_is_deterministic():
    config = StalenessConfig(lags=(0, 2), **TINY)
    a, b = run_staleness_grid(config), run_staleness_grid(config)
    np.testing.assert_array_equal(a.returns, b.returns)
    np.testing.assert_array_equal(a.kl, b.kl)


def test_stale_policy_picks_the_weights_of_k_updates_ago():
    history = [np.full((3, 5, 2), float(v)) for v in range(4)]  # versions 0..3, current = 3
    picked = stale_policy(history, np.array([0, 2, 7]))
    np.testing.assert_array_equal(picked[:, 0, 0], [3.0, 1.0, 0.0])  # lag 7 > kept history: the oldest


def test_a_lag_beyond_the_run_keeps_sampling_the_initial_policy():
    config = StalenessConfig(lags=(0, 50), corrections=("none",), **TINY)
    grid = run_staleness_grid(config)
    # with lag 50 the sampler stays the initial policy while the learner moves away from it
    assert np.all(grid.kl[1:, grid.index(50, "none")] > 0)
    np.testing.assert_allclose(grid.ess[:, grid.index(0, "none")], 1.0)


def test_progress_is_called_once_per_update():
    seen = []
    run_staleness_grid(StalenessConfig(lags=(0,), **TINY), progress=seen.append)
    assert seen == [0, 1, 2, 3]


def test_the_learning_curve_is_the_learners_not_the_stale_samplers():
    """With a lag beyond the run the sampler stays the initial policy; the logged return is pi_t's."""
    config = StalenessConfig(lags=(0, 50), corrections=("truncated",), **{**TINY, "n_updates": 12, "n_seeds": 4})
    grid = run_staleness_grid(config)
    i = grid.index(50, "truncated")
    assert not np.array_equal(grid.returns[:, i], grid.sampler_returns[:, i])
    decoupled = StalenessConfig(lags=(1,), corrections=("clip", "decoupled"), **TINY)
    g = run_staleness_grid(decoupled)  # at lag 1, pi_{t-1} is mu: decoupled PPO never truncates, clips like PPO
    assert np.all(g.modified[:, g.index(1, "decoupled")] <= 1.0)


def test_the_on_policy_cell_learns_whichever_corrections_the_grid_runs():
    """The lag-0 cell is ('none') in every grid: it must be updated even when 'none' is not a correction."""
    tiny = {**TINY, "n_updates": 6}
    with_none = run_staleness_grid(StalenessConfig(lags=(0,), corrections=("none",), **tiny))
    without = run_staleness_grid(StalenessConfig(lags=(0,), corrections=("truncated",), **tiny))
    assert without.runs == with_none.runs == ((0, "none"),)
    # one cell, the same seeds: the same on-policy updates, so the same curve
    np.testing.assert_array_equal(with_none.returns, without.returns)
    assert not np.array_equal(with_none.returns, run_staleness_grid(replace(with_none.config, lr=0.0)).returns)
