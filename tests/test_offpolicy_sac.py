"""course_lib.offpolicy.sac: SAC's maths against naive numpy formulas, the tanh-Gaussian density
against the change of variables, and the training program's contract (deterministic under
a key, chunked = one-shot, warm-up, truncation bootstraps, metrics from the episode ends,
learns) on a tiny 2-D point-mass env with the driving env's interface."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import Array

from course_lib.envs.interface import step_with_auto_reset
from course_lib.offpolicy import sac
from course_lib.offpolicy.sac import (
    SACConfig,
    chunk_metrics,
    critic_loss,
    episode_end_sums,
    evaluate,
    evaluate_random,
    make_train,
    make_train_fn,
    policy_loss,
    polyak_update,
    q_values,
    sample_action,
    soft_bellman_target,
    tanh_gaussian_log_prob,
    temperature_loss,
    train,
)

pytestmark = pytest.mark.timeout(600)


# ---------------------------------------------------------------------------------------
# A tiny continuous env with the driving env's interface: a point mass steered to a target
# ---------------------------------------------------------------------------------------


class PointState(NamedTuple):
    pos: Array  # [2]
    target: Array  # [2]
    obstacle: Array  # [2]
    start_dist: Array
    time: Array


class PointParams(NamedTuple):
    max_steps: int = 40
    speed: float = 0.1
    bound: float = 1.5
    goal_radius: float = 0.15
    obstacle_radius: float = 0.2
    min_progress: float = 0.9


class PointMass:
    """Velocity-controlled point mass in ``[-1.5, 1.5]^2``: reach the target (success), avoid
    the obstacle disc (collision) and the border (off-road); 40 steps at most (truncation).
    Reward: 10 x the distance gained, -1 on a collision or off-road, +1 at the goal."""

    OBS_DIM = 6
    ACTION_DIM = 2
    DEFAULT_PARAMS = PointParams()

    @staticmethod
    def obs(s: PointState) -> Array:
        return jnp.concatenate([s.pos, s.target - s.pos, s.obstacle - s.pos])

    @staticmethod
    def reset(key: Array, params: PointParams) -> tuple[Array, PointState]:
        k_pos, k_target, k_obstacle = jax.random.split(key, 3)
        pos = jax.random.uniform(k_pos, (2,), minval=-1.0, maxval=1.0)
        target = jax.random.uniform(k_target, (2,), minval=-1.0, maxval=1.0)
        obstacle = jax.random.uniform(k_obstacle, (2,), minval=-1.0, maxval=1.0)
        s = PointState(pos, target, obstacle, jnp.linalg.norm(target - pos) + 1e-3, jnp.int32(0))
        return PointMass.obs(s), s

    @staticmethod
    def metrics(s: PointState, params: PointParams) -> dict[str, Array]:
        dist = jnp.linalg.norm(s.target - s.pos)
        goal = dist < params.goal_radius
        return {
            "collision": jnp.linalg.norm(s.obstacle - s.pos) < params.obstacle_radius,
            "offroad": jnp.any(jnp.abs(s.pos) > params.bound),
            "goal": goal,
            "progress_ratio": jnp.where(goal, 1.0, jnp.clip(1.0 - dist / s.start_dist, 0.0, 1.0)),
        }

    @staticmethod
    def step_env(
        key: Array | None, s: PointState, action: Array, params: PointParams
    ) -> tuple[Array, PointState, Array, Array, Array]:
        pos = s.pos + params.speed * jnp.clip(action, -1.0, 1.0)
        new = s._replace(pos=pos, time=s.time + 1)
        m = PointMass.metrics(new, params)
        gained = jnp.linalg.norm(s.target - s.pos) - jnp.linalg.norm(s.target - pos)
        reward = 10.0 * gained - 1.0 * (m["collision"] | m["offroad"]) + 1.0 * m["goal"]
        terminated = m["collision"] | m["offroad"] | m["goal"]
        truncated = new.time >= params.max_steps
        return PointMass.obs(new), new, reward.astype(jnp.float32), terminated, truncated

    @staticmethod
    def step(key: Array, s: PointState, action: Array, params: PointParams):
        return step_with_auto_reset(
            PointMass.reset, PointMass.step_env, key, s, action, params, info_fn=PointMass.metrics
        )

    @staticmethod
    def episode_success(collision: Array, offroad: Array, progress_ratio: Array, params: PointParams) -> Array:
        return ~collision & ~offroad & (progress_ratio >= params.min_progress)


PARAMS = PointMass.DEFAULT_PARAMS

#: One small run shared by the program tests (one compiled program each).
TINY = SACConfig(
    num_envs=8,
    total_env_steps=24_000,
    learning_starts=512,
    buffer_capacity=2**14,
    batch_size=64,
    width=32,
    actor_lr=1e-3,
    critic_lr=1e-3,
    alpha_lr=1e-3,
    prioritized=False,
    steps_per_chunk=100,
)


# ---------------------------------------------------------------------------------------
# The maths against naive formulas
# ---------------------------------------------------------------------------------------


def naive_target(r, d, q1, q2, logp, alpha, gamma):
    """(06.2) one transition at a time."""
    return np.array([r[i] + (0.0 if d[i] else gamma * (min(q1[i], q2[i]) - alpha * logp[i])) for i in range(len(r))])


def test_soft_bellman_target_known_values():
    y = soft_bellman_target(
        jnp.array([1.0, 0.0, -1.0, 2.0]),
        jnp.array([0.0, 0.0, 1.0, 0.0]),
        jnp.array([2.0, 5.0, 9.0, -1.0]),
        jnp.array([3.0, 4.0, 9.0, -2.0]),
        jnp.array([-1.0, 0.5, 3.0, -0.2]),
        0.2,
        0.9,
    )
    np.testing.assert_allclose(y, [2.98, 3.51, -1.0, 0.236], rtol=1e-6)


def test_soft_bellman_target_matches_the_naive_formula_and_masks_terminated():
    rng = np.random.default_rng(0)
    r, q1, q2, logp = rng.normal(size=(4, 64)).astype(np.float32)
    done = rng.random(64) < 0.3
    y = soft_bellman_target(jnp.asarray(r), jnp.asarray(done), q1, q2, logp, 0.3, 0.97)
    np.testing.assert_allclose(y, naive_target(r, done, q1, q2, logp, 0.3, 0.97), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(y)[done], r[done])  # a terminated step: its reward, whatever Q says
    # the twin minimum: swapping the critics changes nothing, raising the larger changes nothing
    np.testing.assert_array_equal(y, soft_bellman_target(jnp.asarray(r), jnp.asarray(done), q2, q1, logp, 0.3, 0.97))
    higher = np.maximum(q1, q2) + 5.0
    np.testing.assert_allclose(
        y, soft_bellman_target(jnp.asarray(r), jnp.asarray(done), np.minimum(q1, q2), higher, logp, 0.3, 0.97)
    )


def test_critic_loss_is_the_mean_over_batch_and_both_critics():
    rng = np.random.default_rng(1)
    q1, q2, y, w = rng.normal(size=(4, 32)).astype(np.float32)
    w = np.abs(w)
    naive = np.mean([(q1[i] - y[i]) ** 2 for i in range(32)] + [(q2[i] - y[i]) ** 2 for i in range(32)])
    np.testing.assert_allclose(critic_loss(q1, q2, y), naive, rtol=1e-5)
    weighted = np.mean(
        [w[i] * (q1[i] - y[i]) ** 2 for i in range(32)] + [w[i] * (q2[i] - y[i]) ** 2 for i in range(32)]
    )
    np.testing.assert_allclose(critic_loss(q1, q2, y, jnp.asarray(w)), weighted, rtol=1e-5)
    # the target is a constant: no gradient flows into it
    grad_y = jax.grad(lambda t: critic_loss(jnp.asarray(q1), jnp.asarray(q2), t))(jnp.asarray(y))
    np.testing.assert_array_equal(grad_y, 0.0)


def test_policy_and_temperature_losses_against_naive_formulas():
    rng = np.random.default_rng(2)
    logp, q1, q2 = rng.normal(size=(3, 16)).astype(np.float32)
    naive = np.mean([0.2 * logp[i] - min(q1[i], q2[i]) for i in range(16)])
    np.testing.assert_allclose(policy_loss(logp, q1, q2, 0.2), naive, rtol=1e-5)
    log_alpha = jnp.float32(-1.5)
    naive_t = np.mean([1.5 * (logp[i] - 2.0) for i in range(16)])  # -log_alpha = 1.5
    np.testing.assert_allclose(temperature_loss(log_alpha, jnp.asarray(logp), -2.0), naive_t, rtol=1e-5)
    # log pi is stopped: only log alpha gets a gradient
    grad_logp = jax.grad(lambda lp: temperature_loss(log_alpha, lp, -2.0))(jnp.asarray(logp))
    np.testing.assert_array_equal(grad_logp, 0.0)


@pytest.mark.parametrize(("entropy", "direction"), [(-4.0, +1), (1.0, -1)])
def test_temperature_moves_towards_the_target_entropy(entropy, direction):
    """Entropy (-E log pi) below the target -2 raises alpha; above it lowers alpha."""
    logp = jnp.full((64,), -entropy)
    opt = optax.adam(1e-2)
    log_alpha = jnp.float32(math.log(0.1))
    state = opt.init(log_alpha)
    for _ in range(20):
        grad = jax.grad(temperature_loss)(log_alpha, logp, -2.0)
        updates, state = opt.update(grad, state)
        log_alpha = optax.apply_updates(log_alpha, updates)
    assert direction * (float(log_alpha) - math.log(0.1)) > 0.15


def test_polyak_update_properties():
    target = {"a": [jnp.ones(3), jnp.zeros((2, 2))], "b": jnp.float32(4.0)}
    online = {"a": [jnp.zeros(3), jnp.ones((2, 2))], "b": jnp.float32(0.0)}
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.all(x == y)), polyak_update(target, online, 0.0), target))
    assert jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.all(x == y)), polyak_update(target, online, 1.0), online))
    step = jax.jit(lambda t: polyak_update(t, online, 0.05))
    moved = target
    for _ in range(60):
        moved = step(moved)
    gap = jax.tree.map(lambda m, t, o: (m - o) / jnp.where(t == o, 1.0, t - o), moved, target, online)
    for leaf, t, o in zip(jax.tree.leaves(gap), jax.tree.leaves(target), jax.tree.leaves(online)):
        np.testing.assert_allclose(np.asarray(leaf)[np.asarray(t != o)], 0.95**60, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# The tanh-squashed Gaussian
# ---------------------------------------------------------------------------------------


def test_tanh_gaussian_log_prob_is_the_change_of_variables():
    """log pi(a) = log N(atanh a; m, s) - log(1 - a^2) per dimension (float64 reference)."""
    rng = np.random.default_rng(3)
    mean, log_std = rng.normal(size=(2, 50, 2))
    log_std = np.clip(log_std, -2.0, 1.0)
    u = mean + np.exp(log_std) * rng.normal(size=(50, 2))
    a = np.tanh(u)
    gauss = -0.5 * ((np.arctanh(a) - mean) / np.exp(log_std)) ** 2 - log_std - 0.5 * np.log(2 * np.pi)
    reference = (gauss - np.log(1.0 - a**2)).sum(-1)
    got = tanh_gaussian_log_prob(
        jnp.asarray(u, jnp.float32), jnp.asarray(mean, jnp.float32), jnp.asarray(log_std, jnp.float32)
    )
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-3)
    # finite far in the tails, where 1 - tanh(u)^2 rounds to 0 in float32
    far = tanh_gaussian_log_prob(jnp.array([[12.0, -15.0]]), jnp.array([[12.0, -15.0]]), jnp.zeros((1, 2)))
    assert np.isfinite(far).all()


def test_tanh_gaussian_density_integrates_to_one():
    """exp(log pi) over a fine grid of (-1, 1) (one dimension, the other's density integrated apart)."""
    a = np.linspace(-1 + 1e-6, 1 - 1e-6, 200_001)
    u = np.arctanh(a)
    density = np.exp(tanh_gaussian_log_prob(jnp.asarray(u[:, None], jnp.float32), jnp.float32(0.4), jnp.float32(-0.3)))
    assert abs(np.trapezoid(np.asarray(density, np.float64), a) - 1.0) < 2e-3


def test_sample_action_log_prob_matches_sample_frequencies():
    """Samples of a = tanh(u): their histogram matches exp(log pi) (change of variables by sampling)."""
    actor = sac.init_actor(jax.random.key(0), 3, 1, 16, 2)
    obs = jnp.tile(jnp.array([[0.5, -1.0, 2.0]]), (200_000, 1))
    action, logp = sample_action(actor, obs, jax.random.key(1))
    assert action.shape == (200_000, 1) and logp.shape == (200_000,)
    assert float(jnp.abs(action).max()) < 1.0
    counts, edges = np.histogram(np.asarray(action[:, 0]), bins=40, range=(-1, 1))
    centres = 0.5 * (edges[1:] + edges[:-1])
    order = np.argsort(np.asarray(action[:, 0]))
    density_at = np.interp(centres, np.asarray(action[order, 0]), np.exp(np.asarray(logp[order])))
    expected = density_at * len(action) * (edges[1] - edges[0])
    big = expected > 2000
    np.testing.assert_allclose(counts[big], expected[big], rtol=0.06)


def test_q_values_runs_both_critics_at_once():
    critics = jax.jit(sac.init_critics, static_argnums=(1, 2, 3, 4))(jax.random.key(0), 5, 2, 8, 2)
    obs, action = jnp.ones((7, 5)), jnp.zeros((7, 2))
    q = jax.jit(q_values)(critics, obs, action)
    assert q.shape == (2, 7)
    first = jax.tree.map(lambda x: x[0], critics)
    one = jax.jit(sac.mlp)(first, jnp.concatenate([obs, action], -1))
    np.testing.assert_allclose(q[0], one[:, 0], rtol=1e-5)
    assert not np.allclose(q[0], q[1])  # two independently initialised critics


# ---------------------------------------------------------------------------------------
# Metrics plumbing
# ---------------------------------------------------------------------------------------


def test_episode_end_sums_read_the_info_flags_at_episode_ends():
    done = jnp.array([True, False, True, True])
    ret = jnp.array([5.0, 100.0, -1.0, 2.0])
    info = {
        "collision": jnp.array([False, True, True, False]),
        "offroad": jnp.array([False, True, False, False]),
        "progress_ratio": jnp.array([0.95, 0.99, 0.2, 0.5]),
    }
    sums = episode_end_sums(PointMass, PARAMS, done, ret, info)
    expected = {"episodes": 3, "return": 6.0, "success": 1, "collision": 1, "offroad": 0, "progress_ratio": 1.65}
    for k, v in expected.items():
        np.testing.assert_allclose(sums[k], v, rtol=1e-6, err_msg=k)
    learn = {"losses/critic": jnp.array([jnp.nan, 1.0, 3.0])}
    per_step = {k: jnp.stack([v, jnp.zeros_like(v)]) for k, v in sums.items()}
    m = chunk_metrics(per_step, learn, jnp.int32(99))
    np.testing.assert_allclose(m["charts/accuracy"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(m["charts/episode_return"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(m["charts/progress_ratio"], 0.55, rtol=1e-6)
    np.testing.assert_allclose(m["losses/critic"], 2.0)  # the warm-up's NaN left out
    none = chunk_metrics({k: jnp.zeros(2) for k in sums}, learn, jnp.int32(99))
    assert np.isnan(none["charts/accuracy"]) and none["charts/episodes"] == 0


def test_evaluate_scripted_policies_on_the_same_episodes():
    """Two scripted policies, one group of envs each, in one program: rates read at each
    episode's end; every episode ends by success, collision or off-road within 40 steps."""
    both = sac.evaluate_policies((_go_to_target, _drive_out), None, jax.random.key(0), PARAMS, 64, PointMass)
    towards, outward = sac._take(both, 0), sac._take(both, 1)
    assert float(towards.accuracy) > 0.6 and float(towards.offroad_rate) == 0.0
    np.testing.assert_allclose(towards.accuracy + towards.collision_rate, 1.0, atol=1e-6)  # only the obstacle stops it
    assert float(outward.offroad_rate) > 0.7  # (a target on the way up-right is a success)
    np.testing.assert_allclose(outward.accuracy + outward.collision_rate + outward.offroad_rate, 1.0, atol=1e-6)
    assert float(towards.progress_ratio) > float(outward.progress_ratio) + 0.3


def _go_to_target(key: Array, obs: Array, params: PointParams) -> Array:
    return jnp.clip(10.0 * obs[:, 2:4], -1.0, 1.0)


def _drive_out(key: Array, obs: Array, params: PointParams) -> Array:
    return jnp.ones((obs.shape[0], 2))


# ---------------------------------------------------------------------------------------
# The training program
# ---------------------------------------------------------------------------------------


def test_config_is_checked():
    with pytest.raises(ValueError, match="power of 2"):
        make_train(dataclasses.replace(TINY, buffer_capacity=3000), PointMass, PARAMS)
    with pytest.raises(ValueError, match="batch_size"):
        make_train(dataclasses.replace(TINY, learning_starts=16), PointMass, PARAMS)
    with pytest.raises(ValueError, match="one chunk"):
        make_train(dataclasses.replace(TINY, total_env_steps=100), PointMass, PARAMS)
    assert all(f.metadata.get("help") for f in dataclasses.fields(SACConfig))


def test_env_step_stores_terminated_and_bootstraps_truncated_from_the_final_obs():
    params = PARAMS._replace(max_steps=3, goal_radius=0.0, obstacle_radius=0.0)  # only the time limit ends it
    obs, state = jax.vmap(PointMass.reset, in_axes=(0, None))(jax.random.split(jax.random.key(0), 4), params)
    carry = sac.EnvCarry(state, obs, jnp.zeros(4))
    still = jnp.zeros((4, 2))
    for t in range(3):
        carry, transition, sums = sac.env_step(PointMass, params, 2.0, carry, still, jax.random.key(t))
    # the third step truncates every env: stored as not terminated, next_obs the observation reached
    assert not bool(transition.terminated.any())
    np.testing.assert_allclose(transition.next_obs, transition.obs, atol=1e-6)  # standing still
    assert not np.allclose(carry.obs, transition.next_obs)  # the carry holds the new episodes
    assert float(sums["episodes"]) == 4
    np.testing.assert_array_equal(carry.episode_return, 0.0)


@pytest.fixture(scope="module")
def tiny_runs():
    """TINY for two seeds by the chunked driver (one thread per seed), and the one-shot
    program (every chunk in one scan) compiled for one seed."""
    keys = jax.random.split(jax.random.key(0), 2)
    chunked = train(TINY, keys, progress=False, env=PointMass, env_params=PARAMS)
    one_shot = jax.jit(make_train_fn(TINY, PointMass, PARAMS))
    return keys, chunked, one_shot, one_shot(keys[1])


def test_chunked_training_equals_one_shot_training(tiny_runs):
    """Seed 1 of the driver's run (jitted chunks, in its own thread) is bit for bit the
    one-shot program's run of the same key. (Vmapped over seeds, the programs would round
    differently in the last bits, which the learning dynamics amplify after a few chunks.)"""
    _, chunked, _, whole = tiny_runs
    for k, v in chunked.metrics.items():
        assert v.shape == (2, TINY.num_chunks)
        np.testing.assert_array_equal(v[1], whole.metrics[k], err_msg=k)
    for a, b in zip(jax.tree.leaves(chunked.state.learner), jax.tree.leaves(whole.state.learner)):
        np.testing.assert_array_equal(a[1], b)


def test_the_run_is_deterministic_under_a_key(tiny_runs):
    keys, chunked, one_shot, first = tiny_runs
    again = one_shot(keys[1])
    for a, b in zip(
        jax.tree.leaves((first.metrics, first.state.learner)), jax.tree.leaves((again.metrics, again.state.learner))
    ):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(chunked.metrics["losses/critic"][0], chunked.metrics["losses/critic"][1])  # two keys


def test_seeds_as_one_vmapped_program_has_a_seed_axis():
    """``train(..., seeds="vmap")`` runs jax.vmap of init and run_chunk; their shapes, traced
    without compiling (the vmapped run itself is timed in bench/bench_sac.py)."""
    init, run_chunk = make_train(TINY, PointMass, PARAMS)
    state = jax.eval_shape(jax.vmap(init), jax.random.split(jax.random.key(3), 2))
    after, metrics = jax.eval_shape(jax.vmap(run_chunk), state)
    assert metrics["charts/accuracy"].shape == (2,) and after.learner.actor[0]["w"].shape == (2, 6, TINY.width)
    assert after.buffer.data.obs.shape == (2, TINY.buffer_capacity, PointMass.OBS_DIM)
    with pytest.raises(ValueError, match="seeds"):
        train(
            TINY, jax.random.split(jax.random.key(3), 2), progress=False, env=PointMass, env_params=PARAMS, seeds="pmap"
        )


def test_warmup_then_learning(tiny_runs):
    _, chunked, _, _ = tiny_runs
    m = {k: v[0] for k, v in chunked.metrics.items()}
    np.testing.assert_array_equal(m["charts/env_steps"], np.arange(1, TINY.num_chunks + 1) * TINY.steps_per_chunk_env)
    assert np.isfinite(m["losses/critic"]).all()  # the first chunk learns after 64 warm-up steps
    assert TINY.updates_per_run == (TINY.num_chunks * TINY.steps_per_chunk - TINY.warmup_steps) * TINY.updates_per_step
    assert (m["losses/alpha"] > 0).all() and np.isfinite(m["losses/entropy"]).all()
    assert np.nanmean(m["charts/accuracy"][-5:]) > np.nanmean(m["charts/accuracy"][:2]) + 0.3


def test_sac_learns_the_point_mass(tiny_runs):
    """The trained actor against an untrained one and random actions, on the same episodes;
    ``evaluate`` of actors stacked on a seed axis returns one rate per actor."""
    _, chunked, _, _ = tiny_runs
    untrained = sac.init_actor(jax.random.key(5), PointMass.OBS_DIM, 2, TINY.width, TINY.depth)
    actors = jax.tree.map(lambda a, b: jnp.stack([a[0], b]), chunked.state.learner.actor, untrained)
    key = jax.random.key(7)
    random = evaluate_random(key, PARAMS, 256, env=PointMass)
    trained, before = (sac._take(evaluate(actors, key, PARAMS, 256, env=PointMass), i) for i in (0, 1))
    assert float(random.accuracy) < 0.1 and float(before.accuracy) < 0.2
    assert float(trained.accuracy) > 0.6, trained
    assert float(trained.episode_return) > float(random.episode_return) + 3.0
    assert float(trained.offroad_rate) < float(random.offroad_rate)


def test_prioritized_replay_path_runs_and_rewrites_priorities():
    config = dataclasses.replace(TINY, prioritized=True, total_env_steps=1600, steps_per_chunk=100, learning_starts=512)
    init, run_chunk = make_train(config, PointMass, PARAMS)
    state = jax.jit(init)(jax.random.key(0))
    chunk = jax.jit(run_chunk)
    state, _ = chunk(state)  # warm-up and the first updates
    state, m1 = chunk(state)
    assert np.isfinite(m1["losses/critic"])
    leaves = np.asarray(state.buffer.tree[config.buffer_capacity : config.buffer_capacity + int(state.buffer.size)])
    assert float(state.buffer.max_priority) != 1.0  # TD errors were written back
    assert len(np.unique(leaves)) > 100
