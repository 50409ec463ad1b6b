"""course_lib.rl.reinforce: the CartPole REINFORCE loop (lesson 01), its pieces and a learning smoke test."""

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from course_lib import describe
from course_lib.rl.pg import discounted_returns
from course_lib.rl.reinforce import (
    VARIANTS,
    EpisodeBatch,
    ReinforceConfig,
    ReinforceResult,
    batch_loss,
    collect_episodes,
    flat_policy_gradient,
    gradients_by_variant,
    make_env,
    make_policy,
    step_weights,
    train_reinforce,
)


def tiny_batch() -> EpisodeBatch:
    """Two episodes of lengths 3 and 1, padded to T = 3 (env 1 idles after step 0)."""
    return EpisodeBatch(
        obs=(np.arange(3 * 2 * 4).reshape(3, 2, 4) / 10).astype(np.float32),
        actions=np.array([[0, 1], [1, 0], [1, 0]]),
        rewards=np.array([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]]),
        dones=np.array([[0.0, 1.0], [0.0, 1.0], [1.0, 1.0]]),
        mask=np.array([[True, True], [True, False], [True, False]]),
    )


def batch_from_env(n_envs: int = 4, seed: int = 0) -> tuple[EpisodeBatch, torch.nn.Module]:
    torch.manual_seed(seed)
    envs = make_env(ReinforceConfig(n_envs=n_envs))
    policy = make_policy(4, 2, 8)
    batch = collect_episodes(envs, policy, seed=seed, generator=torch.Generator().manual_seed(seed))
    envs.close()
    return batch, policy


def test_config_defaults_and_help():
    cfg = ReinforceConfig()
    text = describe(cfg)
    assert cfg.env_id == "CartPole-v1" and cfg.torch_threads == 1
    assert len(text.splitlines()) == 13 and all("#" in line and line.split("# ")[1] for line in text.splitlines())


@pytest.mark.parametrize("mode", ["vector_entry_point", "sync"])
def test_make_env_both_vectorisations(mode):
    envs = make_env(ReinforceConfig(n_envs=3, vectorization=mode))
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 4) and envs.single_action_space.n == 2
    envs.close()


def test_make_policy_shapes():
    policy = make_policy(4, 3, 16)
    assert policy(torch.zeros(5, 4)).shape == (5, 3)
    assert sum(p.numel() for p in policy.parameters()) == 4 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3


def test_collect_episodes_one_complete_episode_per_env():
    batch, _ = batch_from_env(n_envs=5)
    lengths = batch.mask.sum(axis=0)
    assert batch.obs.shape[:2] == batch.mask.shape and batch.obs.dtype == np.float32
    np.testing.assert_array_equal(batch.returns, lengths)  # CartPole pays 1 per step
    assert batch.n_steps == lengths.sum()
    for b in range(5):
        real = np.flatnonzero(batch.mask[:, b])
        np.testing.assert_array_equal(real, np.arange(lengths[b]))  # real steps first, then padding
        assert batch.dones[lengths[b] - 1, b] == 1 and not batch.dones[: lengths[b] - 1, b].any()
        assert batch.dones[lengths[b] :, b].all() and (batch.rewards[lengths[b] :, b] == 0).all()
    assert batch.mask[:, np.argmax(lengths)].all()  # the longest episode fills T


def test_collect_episodes_is_seeded():
    a, _ = batch_from_env(seed=3)
    b, _ = batch_from_env(seed=3)
    np.testing.assert_array_equal(a.actions, b.actions)
    np.testing.assert_array_equal(a.obs, b.obs)


def test_collect_episodes_guards_against_endless_episodes():
    envs = make_env(ReinforceConfig(n_envs=2))
    with pytest.raises(RuntimeError, match="still running after 3 steps"):
        collect_episodes(envs, make_policy(4, 2, 4), seed=0, generator=torch.Generator(), max_steps=3)
    envs.close()


def test_back_to_back_layout():
    obs, actions, rewards, dones = tiny_batch().back_to_back()
    assert obs.shape == (4, 1, 4) and actions.shape == rewards.shape == dones.shape == (4, 1)
    np.testing.assert_array_equal(dones[:, 0], [0, 0, 1, 1])
    np.testing.assert_array_equal(actions[:, 0], [0, 1, 1, 1])
    np.testing.assert_array_equal(obs[3, 0], tiny_batch().obs[0, 1])  # env 1's only step comes last
    np.testing.assert_allclose(discounted_returns(rewards, dones, 1.0)[:, 0], [3, 2, 1, 1])


def test_step_weights_every_variant_against_hand_values():
    b = tiny_batch()
    # gamma = 1. reward-to-go: env 0: 3, 2, 1; env 1: 1. whole-episode return: 3, 3, 3; 1
    rtg = step_weights(b, 1.0, reward_to_go=True, baseline="none", normalize=False)
    np.testing.assert_allclose(rtg, [[3, 1], [2, 0], [1, 0]])
    tot = step_weights(b, 1.0, reward_to_go=False, baseline="none", normalize=False)
    np.testing.assert_allclose(tot, [[3, 1], [3, 0], [3, 0]])
    centred = step_weights(b, 1.0, reward_to_go=True, baseline="mean", normalize=False)
    np.testing.assert_allclose(centred, [[1.25, -0.75], [0.25, 0], [-0.75, 0]])  # mean of (3, 2, 1, 1) = 1.75
    norm = step_weights(b, 1.0, reward_to_go=True, baseline="mean", normalize=True)
    real = norm[b.mask]
    assert abs(real.mean()) < 1e-12 and abs(real.std() - 1) < 1e-6 and (norm[~b.mask] == 0).all()
    with pytest.raises(ValueError, match="baseline"):
        step_weights(b, 1.0, True, "value", False)


def test_batch_loss_and_policy_gradient_agree_with_a_manual_sum():
    batch, policy = batch_from_env(n_envs=3)
    w = step_weights(batch, 0.99, True, "mean", True)
    loss = batch_loss(policy, batch, w)
    obs = torch.from_numpy(batch.obs[batch.mask])
    logp = torch.log_softmax(policy(obs), -1)[torch.arange(batch.n_steps), torch.from_numpy(batch.actions[batch.mask])]
    manual = -(torch.from_numpy(w[batch.mask]).float() * logp).sum() / batch.n_steps
    assert math.isclose(loss.item(), manual.item(), rel_tol=1e-5)
    g = flat_policy_gradient(policy, batch, w)
    grads = torch.autograd.grad(manual, list(policy.parameters()))
    np.testing.assert_allclose(g, -torch.cat([x.reshape(-1) for x in grads]).double().numpy(), rtol=1e-4, atol=1e-7)
    assert all(p.grad is None for p in policy.parameters())  # flat_policy_gradient takes no step, leaves .grad alone


def test_train_reinforce_smoke_seeded_and_restores_threads():
    cfg = ReinforceConfig(n_envs=4, n_updates=3, hidden=8, seed=1)
    threads = torch.get_num_threads()
    calls = []
    r = train_reinforce(cfg, progress=lambda i, batch: calls.append((i, batch.n_steps)))
    assert torch.get_num_threads() == threads
    assert isinstance(r, ReinforceResult) and r.returns.shape == r.lengths.shape == (3, 4)
    assert r.loss.shape == r.entropy.shape == r.grad_norm.shape == (3,)
    assert np.all((r.entropy > 0) & (r.entropy <= math.log(2) + 1e-6)) and np.all(r.grad_norm > 0)
    assert [c[0] for c in calls] == [0, 1, 2] and sum(c[1] for c in calls) == r.env_steps == r.lengths.sum()
    np.testing.assert_array_equal(r.episode_returns, r.returns.reshape(-1))
    assert math.isclose(r.final_mean_return(4), r.returns[-1].mean())
    assert r.seconds >= r.act_seconds > 0 and r.steps_per_second > 0
    assert r.summary()["final_mean_return"] == r.final_mean_return()
    again = train_reinforce(cfg)
    np.testing.assert_array_equal(r.returns, again.returns)


def test_train_reinforce_learns_cartpole():
    """The lesson's claim at a smaller budget: one seed clearly improves within 30 updates."""
    r = train_reinforce(ReinforceConfig(n_updates=30, seed=0))
    assert r.returns[0].mean() < 40
    assert r.returns[-3:].mean() > 150


def test_lr_anneal_and_other_variants_run():
    for cfg in (
        ReinforceConfig(n_envs=2, n_updates=2, lr_anneal=True),
        ReinforceConfig(n_envs=2, n_updates=2, reward_to_go=False, baseline="none", normalize=False),
        ReinforceConfig(n_envs=2, n_updates=2, vectorization="sync"),
    ):
        assert np.all(np.isfinite(train_reinforce(cfg).loss))


def test_gradients_by_variant_share_batches_and_reduce_variance():
    cfg = ReinforceConfig(n_envs=4)
    torch.manual_seed(0)
    policy = make_policy(4, 2, 32)
    grads = gradients_by_variant(policy, cfg, n_batches=30, gamma=1.0, seed=0)
    n_params = sum(p.numel() for p in policy.parameters())
    assert set(grads) == set(VARIANTS) and all(g.shape == (30, n_params) for g in grads.values())
    var = {k: g.var(axis=0, ddof=1).sum() for k, g in grads.items()}
    assert var["reward-to-go - baseline"] < var["total return"]
    again = gradients_by_variant(policy, replace(cfg), n_batches=2, gamma=1.0, seed=0)
    np.testing.assert_array_equal(again["total return"], grads["total return"][:2])
