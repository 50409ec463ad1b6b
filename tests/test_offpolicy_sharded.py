"""course_lib.offpolicy.sharded: SAC over 1, 2 and 4 CPU devices (the session has 4, conftest).

- One update with plain SGD (which, unlike Adam, does not hide a gradient D times too
  large: the check_vma trap) against the same update computed on one device with sac.py's
  functions, shard by shard, the gradient steps averaged.
- A whole run on 1, 2 and 4 devices: the same parameters (measured 2026-11 on the PointMass
  env below: max |difference| 1.2e-7 after 296 updates; tolerance 1e-5) and the same
  episode counts.
- The layout: each device holds its own logical shards, and each shard's replay only its own
  envs' transitions. Bytes per transition against a real buffer's nbytes. Clear errors.

Every multi-device program runs under the watchdog and is blocked on (the sharded driver
does both). The tiny PointMass env of tests/test_offpolicy_sac.py keeps compilation short.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from test_offpolicy_sac import PointMass

from course_lib.envs import driving
from course_lib.offpolicy import replay, sac
from course_lib.offpolicy import sharded as sh
from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.devices import data_mesh

pytestmark = pytest.mark.timeout(600)

ENV = {"env": PointMass, "env_params": PointMass.DEFAULT_PARAMS}
S = 4  # logical shards
#: 16 envs, batch 64, uniform replay; 3 chunks of 100 vectorised steps, 4 of warm-up: 296 updates.
CONFIG = dataclasses.replace(sh.CPU_SHARDED_CONFIG, width=32)
TOL = 1e-5


@pytest.fixture(scope="module")
def runs():
    return sh.run_on_device_counts(CONFIG, S, (1, 2, 4), seed=0, **ENV)


def test_one_to_four_devices_give_the_same_parameters(runs):
    one = runs[1].state.learner
    start = sh.make_sharded_train(CONFIG, S, data_mesh(1), **ENV).init(jax.random.key(0)).learner
    assert sh.max_param_difference(one, start) > 100 * TOL  # the comparison is of trained parameters
    for d in (2, 4):
        assert sh.max_param_difference(runs[d].state.learner, one) < TOL, d
        np.testing.assert_array_equal(runs[d].metrics["charts/episodes"], runs[1].metrics["charts/episodes"])
        np.testing.assert_allclose(runs[d].metrics["losses/critic"], runs[1].metrics["losses/critic"], rtol=1e-4)
    assert int(runs[4].state.step) == CONFIG.num_chunks * CONFIG.steps_per_chunk
    assert runs[1].metrics["charts/env_steps"][-1] == CONFIG.env_steps_per_run


def test_each_device_holds_its_own_shards_and_each_buffer_its_own_envs(runs):
    n_local = CONFIG.num_envs // S
    for d, run in runs.items():
        state = run.state
        per_device = S // d
        for arr in (state.shard_ids, state.buffers.data.obs, state.envs.obs):
            shards = sorted(arr.addressable_shards, key=lambda x: x.device.id)
            assert [x.device for x in shards] == jax.devices()[:d]
            for i, x in enumerate(shards):  # device i holds logical shards i*S/D .. (i+1)*S/D - 1
                assert x.index[0].indices(S)[:2] == (i * per_device, (i + 1) * per_device)
        assert np.array_equal(np.asarray(state.shard_ids), np.arange(S))
        buffers, envs = jax.device_get((state.buffers, state.envs))
        steps = int(state.step)
        for g in range(S):
            # exactly its own envs' transitions: N/S per step, not the others' ...
            assert buffers.size[g] == min(steps * n_local, buffers.capacity)
            # ... and the newest N/S are its envs' last steps (next_obs = their obs, unless just reset)
            last = (buffers.insert[g] - n_local + np.arange(n_local)) % buffers.capacity
            same = np.all(buffers.data.next_obs[g][last] == envs.obs[g], axis=-1)
            assert np.all(same | (envs.episode_return[g] == 0.0)), g
            assert same.sum() >= n_local // 2
        newest_of_0 = (buffers.insert[0] - n_local + np.arange(n_local)) % buffers.capacity
        assert not np.all(buffers.data.next_obs[0][newest_of_0] == envs.obs[1], axis=-1).any()  # not shard 1's


def _sgd() -> sac.Optimizers:
    return sac.Optimizers(optax.sgd(0.1), optax.sgd(0.1), optax.sgd(0.1))


def _mean(trees):
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]) / len(xs), *trees)


@pytest.mark.parametrize("devices", [2])
def test_one_update_is_the_mean_gradient_over_all_shards(devices):
    """The sharded program's first update against sac.py on one device: per shard, the
    critic step (then the actor and temperature step) with plain SGD; SGD steps average
    like gradients, so the mean of the per-shard steps is the step on the mean gradient.
    A missing 1/D (the check_vma trap) or 1/S makes the update 2-4 times too large."""
    config = dataclasses.replace(CONFIG, num_envs=8, batch_size=16, learning_starts=32, steps_per_chunk=1)
    program = sh.make_sharded_train(config, S, data_mesh(devices), opt=_sgd(), **ENV)
    with watchdog(120, f"one sharded SGD update on {devices} devices"):
        state = program.init(jax.random.key(3))
        for _ in range(config.warmup_steps):  # the warm-up: random actions, no update
            state = jax.block_until_ready(program.run_chunk(state)[0])
        before = jax.device_get(state.learner)
        run_key, step = jax.device_get(state.key), int(state.step)
        state = jax.block_until_ready(program.run_chunk(state)[0])  # one env step, one update
    after, buffers = jax.device_get((state.learner, state.buffers))

    cfg, opt = sh.shard_config(config, S), _sgd()
    plain = before._replace(**{f: getattr(before, f)[1] for f in ("actor_opt", "critic_opt", "alpha_opt")})
    batches, k_critic, k_actor = [], [], []
    for g in range(S):
        k_learn = sh.shard_keys(run_key, jnp.int32(step), jnp.int32(g), config.updates_per_step)[3][0]
        k_sample, k_update = jax.random.split(k_learn)  # as sac.learn_step
        buffer = jax.tree.map(lambda x, g=g: x[g], buffers)
        batches.append(sac.buffer_sample(cfg, buffer, k_sample))
        kc, ka = jax.random.split(k_update)  # as sac.sac_update
        k_critic.append(kc)
        k_actor.append(ka)
    critics = _mean([sac.critic_step(plain, b, w, k, cfg, opt)[0].critics for (b, _, w), k in zip(batches, k_critic)])
    mid = plain._replace(critics=critics)
    actor_steps = [sac.actor_and_temperature_step(mid, b.obs, k, cfg, opt)[0] for (b, _, _), k in zip(batches, k_actor)]
    reference = mid._replace(
        actor=_mean([lr.actor for lr in actor_steps]),
        log_alpha=_mean([lr.log_alpha for lr in actor_steps]),
        targets=sac.polyak_update(plain.targets, critics, config.tau),
    )
    moved = sh.max_param_difference(reference, plain)
    assert moved > 1e-2  # a step large enough that 2x or 4x of it shows
    assert sh.max_param_difference(after, reference) < 1e-5 * max(moved, 1.0)


def test_bytes_per_transition_match_a_real_buffer():
    cfg = dataclasses.replace(sac.CPU_CONFIG, buffer_capacity=2**10)
    example = sh.example_transition(driving)
    real = sac.Transition(*(jnp.zeros(x.shape, x.dtype) for x in example))
    for prioritized, expected in ((False, 525), (True, 533)):
        buffer = sac.buffer_init(dataclasses.replace(cfg, prioritized=prioritized), real)
        stored = sum(x.nbytes for x in jax.tree.leaves(buffer.data))
        if prioritized:
            assert isinstance(buffer, replay.PrioritizedReplay)
            stored += buffer.tree.nbytes
        assert (
            stored == cfg.buffer_capacity * sh.transition_nbytes(driving, prioritized) == cfg.buffer_capacity * expected
        )
    opt = sac.make_optimizers(sac.FULL_CONFIG)
    learner = sac.init_learner(jax.random.key(0), sac.FULL_CONFIG, driving.OBS_DIM, driving.ACTION_DIM, opt)
    assert sh.learner_nbytes(sac.FULL_CONFIG) == sum(np.asarray(x).nbytes for x in jax.tree.leaves(learner))


def test_replay_capacity_on_h100_and_h200():
    h100 = sh.replay_capacity(sh.DEVICE_MEMORY["H100 80GB"])
    h200 = sh.replay_capacity(sh.DEVICE_MEMORY["H200 141GB"])
    for cap in (h100, h200):
        used = cap.headroom_bytes + cap.learner_bytes + cap.env_bytes + cap.transitions * cap.transition_bytes
        assert used <= cap.memory_bytes < used + cap.transition_bytes
        assert cap.power_of_two <= cap.transitions < 2 * cap.power_of_two
    assert 100e6 < h100.transitions < h200.transitions  # ~1.4e8 and ~2.6e8
    assert h100.power_of_two == 2**27 and h200.power_of_two == 2**27


def test_bad_splits_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"num_envs = 18 is not divisible by num_shards = 4.*multiple of 4"):
        sh.check_sharding(dataclasses.replace(CONFIG, num_envs=18), S)
    with pytest.raises(ValueError, match=r"batch_size = 66 is not divisible by num_shards = 4"):
        sh.check_sharding(dataclasses.replace(CONFIG, batch_size=66), S)
    with pytest.raises(ValueError, match=r"num_shards = 4 is not divisible by 3 devices"):
        sh.make_sharded_train(CONFIG, S, data_mesh(3), **ENV)
    with pytest.raises(ValueError, match=r"JAX has 4 .*use_cpu_devices\(8\)"):
        sh.check_sharding(dataclasses.replace(CONFIG, num_envs=32, batch_size=64), 8, 8)
    with pytest.raises(ValueError, match=r"devices"):
        sh.run_on_device_counts(CONFIG, S, (1, 8), **ENV)
