"""course_lib.ppo.jax_ppo: GAE against a Python-loop oracle, the PPO loss against a
formula-by-formula numpy version, and make_train's contract (pure, vmappable over seeds
and learning rates, learns CartPole)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.ppo import jax_ppo as ppo_jax
from course_lib.ppo.config import PPOConfig
from course_lib.ppo.jax_ppo import (
    Transition,
    final_return,
    gae,
    init_params,
    make_train,
    policy_value,
    ppo_loss,
    shuffle_order,
    td_targets,
)

pytestmark = pytest.mark.timeout(600)


def naive_gae(rewards, values, terminated, truncated, final_values, last_value, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k}, cut at the first episode end, one (t, b) at a time;
    delta_k bootstraps from 0 after a termination, from V(final obs) after a truncation."""
    n_t, n_b = rewards.shape
    out = np.zeros((n_t, n_b))
    for b in range(n_b):
        for t in range(n_t):
            total, weight = 0.0, 1.0
            for k in range(t, n_t):
                if terminated[k, b]:
                    reached = 0.0
                elif truncated[k, b]:
                    reached = final_values[k, b]
                else:
                    reached = values[k + 1, b] if k + 1 < n_t else last_value[b]
                total += weight * (rewards[k, b] + gamma * reached - values[k, b])
                if terminated[k, b] or truncated[k, b]:
                    break
                weight *= gamma * lam
            out[t, b] = total
    return out


def _rollout(seed: int, n_t: int = 20, n_b: int = 3):
    rng = np.random.default_rng(seed)
    rewards, values, final_values = rng.normal(size=(3, n_t, n_b))
    terminated = rng.random((n_t, n_b)) < 0.15
    truncated = rng.random((n_t, n_b)) < 0.15
    return rewards, values, terminated, truncated, final_values, rng.normal(size=n_b)


def test_gae_matches_the_sum_of_discounted_deltas_with_both_kinds_of_episode_end():
    data = _rollout(0)
    assert (data[2] & ~data[3]).any() and (data[3] & ~data[2]).any() and (data[2] & data[3]).any()
    adv, targets = jax.jit(gae, static_argnums=(6, 7))(*(jnp.asarray(x) for x in data), 0.99, 0.95)
    expected = naive_gae(*data, 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(targets), expected + data[1], rtol=1e-4, atol=1e-5)


def test_a_truncated_step_bootstraps_from_the_final_observation_a_terminated_one_from_zero():
    rewards, values, last = jnp.ones((3, 1)), jnp.array([[1.0], [2.0], [3.0]]), jnp.array([5.0])
    final_values = jnp.array([[7.0], [8.0], [9.0]])
    no = jnp.zeros((3, 1), bool)
    at_1 = jnp.array([[False], [True], [False]])
    y_trunc = td_targets(rewards, values, no, at_1, final_values, last, 0.5)
    y_term = td_targets(rewards, values, at_1, no, final_values, last, 0.5)
    y_both = td_targets(rewards, values, at_1, at_1, final_values, last, 0.5)
    np.testing.assert_allclose(np.asarray(y_trunc)[:, 0], [2.0, 1 + 0.5 * 8, 1 + 0.5 * 5])
    np.testing.assert_allclose(np.asarray(y_term)[:, 0], [2.0, 1.0, 3.5])
    np.testing.assert_allclose(np.asarray(y_both), np.asarray(y_term))  # termination wins


def test_gae_with_lambda_one_and_no_ends_is_the_bootstrapped_return_minus_value():
    rewards = jnp.ones((5, 1))
    values = jnp.zeros((5, 1))
    no = jnp.zeros((5, 1), bool)
    adv, _ = gae(rewards, values, no, no, jnp.zeros((5, 1)), jnp.array([10.0]), 0.5, 1.0)
    # A_0 = 1 + 0.5 + 0.25 + 0.125 + 0.0625 + 0.5^5 * 10
    assert float(adv[0, 0]) == pytest.approx(1.9375 + 10 / 32)


def test_shuffle_order_gives_one_independent_permutation_per_epoch():
    order = np.asarray(jax.jit(shuffle_order, static_argnums=(1, 2))(jax.random.key(0), 4, 512))
    assert order.shape == (4, 512)
    for row in order:
        np.testing.assert_array_equal(np.sort(row), np.arange(512))
    assert len({tuple(row) for row in order}) == 4
    assert not np.array_equal(order[0], np.arange(512))
    # over many draws every sample lands in every position about equally often (uniform)
    many = np.asarray(shuffle_order(jax.random.key(1), 4000, 8))
    counts = np.stack([(many == i).sum(0) for i in range(8)])  # [sample, position]
    assert counts.min() > 400 and counts.max() < 600  # expected 500 each
    # above 2^16 samples (too many for the packed index) each epoch is a jax.random.permutation
    big = np.asarray(jax.jit(shuffle_order, static_argnums=(1, 2))(jax.random.key(0), 2, 1024 * 128))
    assert big.shape == (2, 1024 * 128) and big.dtype == np.int32
    for row in big:
        np.testing.assert_array_equal(np.sort(row), np.arange(1024 * 128))
    assert not np.array_equal(big[0], big[1]) and not np.array_equal(big[0], np.arange(1024 * 128))


def _batch(seed: int, n: int = 64):
    rng = np.random.default_rng(seed)
    params = init_params(jax.random.key(seed), hidden=8)
    obs = jnp.asarray(rng.normal(size=(n, 4)), jnp.float32)
    logits, value = policy_value(params, obs)
    action = jnp.asarray(rng.integers(2, size=n))
    logp = jax.nn.log_softmax(logits)[jnp.arange(n), action]
    old_logp = logp + jnp.asarray(rng.normal(scale=0.3, size=n), jnp.float32)  # ratios on both sides of the clip
    old_value = value + jnp.asarray(rng.normal(scale=0.5, size=n), jnp.float32)
    no = jnp.zeros(n, bool)
    batch = Transition(obs, action, old_logp, old_value, jnp.ones(n), no, no, jnp.zeros(n))
    adv = jnp.asarray(rng.normal(size=n), jnp.float32)
    targets = jnp.asarray(rng.normal(size=n), jnp.float32)
    return params, batch, adv, targets


def test_ppo_loss_matches_the_equations_term_by_term():
    params, batch, adv, targets = _batch(0)
    total, parts = ppo_loss(params, batch, adv, targets, 0.2, 0.5, 0.01)
    logits, value = (np.asarray(x, np.float64) for x in policy_value(params, batch.obs))
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ratio = np.exp(logp_all[np.arange(64), np.asarray(batch.action)] - np.asarray(batch.log_prob))
    a = np.asarray(adv, np.float64)
    a = (a - a.mean()) / (a.std() + 1e-8)
    policy = -np.mean([min(r * x, np.clip(r, 0.8, 1.2) * x) for r, x in zip(ratio, a, strict=True)])
    old_v, tgt = np.asarray(batch.value), np.asarray(targets)
    value_loss = 0.5 * np.mean(np.maximum((value - tgt) ** 2, (old_v + np.clip(value - old_v, -0.2, 0.2) - tgt) ** 2))
    entropy = -np.mean((np.exp(logp_all) * logp_all).sum(-1))
    assert (np.abs(ratio - 1) > 0.2).any() and (np.abs(ratio - 1) < 0.2).any()
    np.testing.assert_allclose(float(parts["losses/policy"]), policy, rtol=1e-4)
    np.testing.assert_allclose(float(parts["losses/value"]), value_loss, rtol=1e-4)
    np.testing.assert_allclose(float(parts["losses/entropy"]), entropy, rtol=1e-4)
    np.testing.assert_allclose(float(total), policy + 0.5 * value_loss - 0.01 * entropy, rtol=1e-4)


def test_ppo_loss_on_policy_has_zero_policy_loss_and_no_clipping():
    params, batch, adv, targets = _batch(1)
    logits, _ = policy_value(params, batch.obs)
    batch = batch._replace(log_prob=jax.nn.log_softmax(logits)[jnp.arange(64), batch.action])
    _, parts = ppo_loss(params, batch, adv, targets, 0.2, 0.5, 0.01)
    assert abs(float(parts["losses/policy"])) < 1e-6  # ratio 1 and normalised advantages of mean 0
    assert float(parts["losses/clip_frac"]) == 0.0 and abs(float(parts["losses/approx_kl"])) < 1e-6


SMALL = PPOConfig(total_timesteps=4 * 128 * 6, num_steps=128)


@pytest.fixture(scope="module")
def small_train():
    return jax.jit(make_train(SMALL))


def test_train_is_deterministic_per_key_and_reports_one_value_per_update(small_train):
    a = small_train(jax.random.key(0))
    b = small_train(jax.random.key(0))
    c = small_train(jax.random.key(1))
    for k, v in a.metrics.items():
        assert v.shape == (SMALL.num_updates,), k
    np.testing.assert_array_equal(np.asarray(a.metrics["losses/total"]), np.asarray(b.metrics["losses/total"]))
    assert not np.allclose(np.asarray(a.metrics["losses/total"]), np.asarray(c.metrics["losses/total"]))
    assert int(np.asarray(a.metrics["charts/episodes"]).sum()) > 20  # a random policy ends episodes in ~20 steps


def test_vmap_over_seeds_equals_separate_runs(small_train):
    keys = jax.random.split(jax.random.key(7), 3)
    together = jax.jit(jax.vmap(make_train(SMALL)))(keys)
    for i in range(3):
        alone = small_train(keys[i])
        np.testing.assert_allclose(
            np.asarray(together.metrics["charts/episode_return"][i]),
            np.asarray(alone.metrics["charts/episode_return"]),
            rtol=1e-4,
        )
        np.testing.assert_allclose(
            np.asarray(together.metrics["losses/total"][i]),
            np.asarray(alone.metrics["losses/total"]),
            rtol=1e-3,
            atol=1e-4,
        )


def test_learning_rate_is_a_vmappable_argument():
    """lr = 0 leaves the weights at their initialisation; a positive lr moves them."""
    train = make_train(SMALL)
    out = jax.jit(jax.vmap(train, in_axes=(None, 0)))(jax.random.key(3), jnp.array([0.0, 1e-3]))
    init = init_params(jax.random.split(jax.random.key(3), 3)[1], hidden=SMALL.hidden)
    w0 = [np.asarray(x) for x in jax.tree.leaves(init)]
    w = [np.asarray(x) for x in jax.tree.leaves(out.params)]
    assert all(np.array_equal(a[0], b) for a, b in zip(w, w0, strict=True))
    assert not all(np.allclose(a[1], b) for a, b in zip(w, w0, strict=True))


def test_bad_configs_are_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="num_minibatches"):
        make_train(PPOConfig(num_envs=3, num_steps=5, num_minibatches=4))
    with pytest.raises(ValueError, match="total_timesteps"):
        make_train(PPOConfig(total_timesteps=100))


def test_learns_cartpole():
    """100k steps: the mean return of the last episodes is far above a random policy's ~22."""
    config = PPOConfig(total_timesteps=100_000)
    result = jax.jit(make_train(config))(jax.random.key(0))
    returns = np.asarray(result.metrics["charts/episode_return"])
    assert np.nanmean(returns[:5]) < 40
    assert float(final_return(result.metrics)) > 150


def _xla_flags_after(statements: str) -> str:
    """XLA_FLAGS in a fresh interpreter that starts with another flag set and runs ``statements``;
    also asserts that JAX's backend was not started by them (so the flag is still in time)."""
    code = (
        f"{statements}\n"
        "import os, sys\n"
        "if 'jax' in sys.modules:\n"
        "    from jax._src import xla_bridge\n"
        "    assert not xla_bridge.backends_are_initialized(), 'the backend started before XLA_FLAGS was final'\n"
        "print(os.environ['XLA_FLAGS'])"
    )
    env = dict(os.environ, XLA_FLAGS="--xla_cpu_multi_thread_eigen=true")
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_importing_ppo_jax_sets_the_xla_cpu_flag_before_jax_starts_and_the_envs_do_not():
    assert _xla_flags_after("import course_lib.envs.cartpole") == "--xla_cpu_multi_thread_eigen=true"
    assert (
        _xla_flags_after("import course_lib.ppo.jax_ppo")
        == f"--xla_cpu_multi_thread_eigen=true {ppo_jax.XLA_CPU_FLAGS}"
    )
    twice = "import course_lib.ppo.jax_ppo as p; p.use_reliable_xla_cpu_flags(); p.use_reliable_xla_cpu_flags()"
    assert _xla_flags_after(twice).count("concurrency_optimized_scheduler") == 1


def test_ppo_jax_and_the_torch_loop_share_one_config_class():
    assert ppo_jax.PPOConfig is PPOConfig
