"""course_lib.ppo.torch_ppo, the classic-loop baseline: its GAE and loss agree with the JAX
versions on the same inputs and weights, its rollout masks gymnasium's next-step reset
steps, and a short run learns and is reproducible."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from course_lib.ppo.config import PPOConfig
from course_lib.ppo.jax_ppo import Transition, gae, init_params, ppo_loss
from course_lib.ppo.torch_ppo import gae_numpy, make_actor_critic, ppo_loss_torch, train_torch

pytestmark = pytest.mark.timeout(600)


def test_gae_numpy_equals_the_jax_reverse_scan():
    """With next-step auto-reset the step after an end observes the final observation, so the
    torch loop's values[t + 1] is the JAX loop's V(final obs) of step t."""
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(2, 30, 4)).astype(np.float32)
    terminated = rng.random((30, 4)) < 0.1
    truncated = rng.random((30, 4)) < 0.1
    assert (truncated & ~terminated).any()
    last = rng.normal(size=4).astype(np.float32)
    dones = (terminated | truncated).astype(np.float32)
    adv, tgt = gae_numpy(rewards, values, terminated.astype(np.float32), dones, last, 0.99, 0.95)
    final_values = np.concatenate([values[1:], last[None]], 0)  # V(the obs each step reached)
    j_adv, j_tgt = gae(
        *(jnp.asarray(x) for x in (rewards, values, terminated, truncated, final_values, last)), 0.99, 0.95
    )
    np.testing.assert_allclose(adv, np.asarray(j_adv), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tgt, np.asarray(j_tgt), rtol=1e-5, atol=1e-5)


def _torch_from_jax(params):
    actor, critic = make_actor_critic(4, 2, 16)
    with torch.no_grad():
        for net, layers in ((actor, params["actor"]), (critic, params["critic"])):
            linears = [m for m in net if isinstance(m, torch.nn.Linear)]
            for lin, layer in zip(linears, layers, strict=True):
                lin.weight.copy_(torch.from_numpy(np.asarray(layer["w"]).T.copy()))
                lin.bias.copy_(torch.from_numpy(np.asarray(layer["b"]).copy()))
    return actor, critic


def test_the_torch_loss_equals_the_jax_loss_on_the_same_weights_and_batch():
    rng = np.random.default_rng(1)
    params = init_params(jax.random.key(0), hidden=16)
    params = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.key(1), x.shape), params)
    n = 32
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    action = rng.integers(2, size=n)
    old_logp = np.log(rng.uniform(0.2, 0.8, size=n)).astype(np.float32)
    old_value = rng.normal(size=n).astype(np.float32)
    adv = rng.normal(size=n).astype(np.float32)
    targets = rng.normal(size=n).astype(np.float32)
    config = PPOConfig()
    batch = Transition(
        jnp.asarray(obs),
        jnp.asarray(action),
        jnp.asarray(old_logp),
        jnp.asarray(old_value),
        jnp.zeros(n),
        jnp.zeros(n, bool),
        jnp.zeros(n, bool),
        jnp.zeros(n),
    )
    j_total, j_parts = ppo_loss(
        params, batch, jnp.asarray(adv), jnp.asarray(targets), config.clip_eps, config.vf_coef, config.ent_coef
    )
    actor, critic = _torch_from_jax(params)
    t_total, t_parts = ppo_loss_torch(
        actor,
        critic,
        torch.from_numpy(obs),
        torch.from_numpy(action),
        torch.from_numpy(old_logp),
        torch.from_numpy(old_value),
        torch.from_numpy(adv),
        torch.from_numpy(targets),
        None,
        config,
    )
    np.testing.assert_allclose(float(t_total.detach()), float(j_total), rtol=1e-4)
    for k in ("losses/policy", "losses/value", "losses/entropy"):
        np.testing.assert_allclose(float(t_parts[k].detach()), float(j_parts[k]), rtol=1e-4, err_msg=k)
    # all-valid mask == no mask
    m_total, _ = ppo_loss_torch(
        actor,
        critic,
        torch.from_numpy(obs),
        torch.from_numpy(action),
        torch.from_numpy(old_logp),
        torch.from_numpy(old_value),
        torch.from_numpy(adv),
        torch.from_numpy(targets),
        torch.ones(n),
        config,
    )
    np.testing.assert_allclose(float(m_total.detach()), float(t_total.detach()), rtol=1e-5)


def test_a_masked_sample_does_not_change_the_loss():
    rng = np.random.default_rng(2)
    actor, critic = make_actor_critic(4, 2, 8)
    config = PPOConfig()
    n = 16
    args = [
        torch.from_numpy(rng.normal(size=(n, 4)).astype(np.float32)),
        torch.from_numpy(rng.integers(2, size=n)),
        torch.full((n,), -0.7),
        torch.zeros(n),
        torch.from_numpy(rng.normal(size=n).astype(np.float32)),
        torch.zeros(n),
    ]
    valid = torch.ones(n)
    valid[3] = 0.0
    base, _ = ppo_loss_torch(actor, critic, *args, valid, config)
    args[4] = args[4].clone()
    args[4][3] = 1e3  # a huge advantage on the masked (reset) step
    changed, _ = ppo_loss_torch(actor, critic, *args, valid, config)
    np.testing.assert_allclose(float(changed.detach()), float(base.detach()), rtol=1e-5)


def test_short_run_is_reproducible_and_counts_every_update():
    config = PPOConfig(total_timesteps=4 * 128 * 50)
    a = train_torch(config, seed=3, n_updates=6)
    b = train_torch(config, seed=3, n_updates=6)
    assert a.env_steps == 6 * config.batch_size and len(a.update_seconds) == 6
    np.testing.assert_array_equal(a.episode_return, b.episode_return)
    assert a.episodes.sum() > 20 and torch.get_num_threads() >= 1
    assert a.steady_steps_per_second() > 0


def test_the_sync_vector_env_gives_the_same_interface():
    config = PPOConfig(total_timesteps=4 * 128 * 50)
    r = train_torch(config, seed=0, n_updates=3, vectorization="sync")
    assert r.episodes.sum() > 5 and np.isfinite(r.final_return())


def test_classic_loop_learns_cartpole():
    """60k steps with the same hyperparameters as the JAX loop: returns rise well above random."""
    config = PPOConfig(total_timesteps=60_000)
    r = train_torch(config, seed=0)
    assert np.nanmean(r.episode_return[:5]) < 40
    assert r.final_return() > 100


def test_the_classic_baseline_imports_no_jax_and_sets_no_xla_flags():
    """The torch loop reads the shared PPOConfig from course_lib.ppo.config, which has no JAX in it."""
    code = (
        "import os, sys; import course_lib.ppo.torch_ppo, course_lib.ppo.config; "
        "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith(('jax.', 'jaxlib', 'optax')))); "
        "print(os.environ.get('XLA_FLAGS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split("\n")[:2] == ["[]", "None"], out.stdout
