"""course_lib.envs.cartpole against gymnasium's CartPole-v1 (the oracle), gymnax style:
step both from the same state with the same actions and compare observations, rewards,
terminations and truncations; plus the auto-reset and jit/vmap behaviour."""

from __future__ import annotations

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.envs import cartpole

pytestmark = pytest.mark.timeout(300)

STEP_ENV = jax.jit(cartpole.step_env)
STEP = jax.jit(cartpole.step)


def _near_threshold(state: np.ndarray, params: cartpole.EnvParams, tol: float = 1e-5) -> bool:
    """True when float32 vs float64 rounding could flip a termination test."""
    return bool(
        abs(abs(state[0]) - params.x_threshold) < tol or abs(abs(state[2]) - params.theta_threshold_radians) < tol
    )


def test_one_step_from_the_same_state_matches_gymnasium_over_many_random_steps():
    """Lock-step: before every step the JAX state is set to gymnasium's, so float32 vs
    float64 rounding cannot accumulate; 3000 random actions over many episodes."""
    params = cartpole.DEFAULT_PARAMS
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    n_terminated = n_compared = 0
    for _ in range(3000):
        state = np.array(env.unwrapped.state, dtype=np.float64)
        elapsed = env._elapsed_steps  # the TimeLimit wrapper's counter
        action = int(rng.integers(2))
        np.testing.assert_allclose(
            np.asarray(cartpole.get_obs(cartpole.state_from_array(state, elapsed))), obs, rtol=1e-6, atol=1e-6
        )
        obs, reward, terminated, truncated, _ = env.step(action)
        j_obs, _, j_reward, j_term, j_trunc = STEP_ENV(
            jax.random.key(0), cartpole.state_from_array(jnp.asarray(state, jnp.float32), elapsed), action, params
        )
        np.testing.assert_allclose(np.asarray(j_obs), obs, rtol=1e-5, atol=1e-5)
        assert float(j_reward) == reward == 1.0
        if not _near_threshold(np.asarray(env.unwrapped.state), params):
            assert bool(j_term) == terminated
            n_compared += 1
        assert bool(j_trunc) == truncated
        n_terminated += terminated
        if terminated or truncated:
            obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
    assert n_terminated > 50  # the test crossed many episode ends, both ways
    assert n_compared > 2900


def test_trajectories_match_gymnasium_in_float64():
    """Free-running in double precision: the JAX env alone (no re-sync) follows
    gymnasium's states for whole episodes, to float64 rounding."""
    with jax.enable_x64(True):
        params = cartpole.DEFAULT_PARAMS
        env = gym.make("CartPole-v1")
        rng = np.random.default_rng(1)
        for episode in range(20):
            env.reset(seed=episode)
            state = cartpole.state_from_array(jnp.asarray(env.unwrapped.state, jnp.float64))
            for _ in range(500):
                action = int(rng.integers(2))
                obs, reward, terminated, truncated, _ = env.step(action)
                j_obs, state, j_reward, j_term, j_trunc = cartpole.step_env(None, state, action, params)
                assert state.x.dtype == jnp.float64
                np.testing.assert_allclose(
                    np.stack([state.x, state.x_dot, state.theta, state.theta_dot]),
                    env.unwrapped.state,
                    rtol=1e-9,
                    atol=1e-12,
                )
                np.testing.assert_array_equal(np.asarray(j_obs), obs)
                assert (float(j_reward), bool(j_term), bool(j_trunc)) == (reward, terminated, truncated)
                if terminated or truncated:
                    break
            assert terminated  # random actions end every episode by a fall


def test_truncation_at_500_steps_is_apart_from_termination():
    """Gymnasium's TimeLimit truncates at step 500; the JAX env reports it the same way and
    does not call it a termination."""
    params = cartpole.DEFAULT_PARAMS
    env = gym.make("CartPole-v1")
    env.reset(seed=3)
    env.unwrapped.state = np.zeros(4)
    env._elapsed_steps = 499
    _, _, terminated, truncated, _ = env.step(0)
    _, _, _, j_term, j_trunc = STEP_ENV(None, cartpole.state_from_array(jnp.zeros(4), 499), 0, params)
    assert (terminated, truncated) == (False, True) == (bool(j_term), bool(j_trunc))
    _, _, _, j_term, j_trunc = STEP_ENV(None, cartpole.state_from_array(jnp.zeros(4), 498), 0, params)
    assert not bool(j_trunc) and not bool(j_term)


def test_reset_draws_every_variable_in_the_gymnasium_range():
    obs, state = jax.vmap(cartpole.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(0), 1000), cartpole.DEFAULT_PARAMS
    )
    assert obs.shape == (1000, 4) and obs.dtype == jnp.float32
    assert float(jnp.abs(obs).max()) <= 0.05 and float(jnp.abs(obs).min()) < 1e-3
    assert float(obs.std(0).min()) > 0.025  # uniform on [-0.05, 0.05] has std 0.029
    assert (np.asarray(state.time) == 0).all()


def test_step_resets_when_the_episode_ends_and_keeps_the_final_observation():
    params = cartpole.DEFAULT_PARAMS
    falling = cartpole.state_from_array(jnp.array([0.0, 0.0, 0.2, 2.0]), 17)  # past 12 degrees after one step
    obs, state, reward, terminated, truncated, info = STEP(jax.random.key(5), falling, 1, params)
    expected_final, _, _, _, _ = STEP_ENV(None, falling, 1, params)
    assert bool(terminated) and not bool(truncated) and float(reward) == 1.0
    np.testing.assert_array_equal(np.asarray(info["final_obs"]), np.asarray(expected_final))
    fresh_obs, _fresh_state = cartpole.reset(jax.random.split(jax.random.key(5))[1], params)  # step's reset half
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(fresh_obs))
    assert int(state.time) == 0 and float(jnp.abs(obs).max()) <= 0.05

    upright = cartpole.state_from_array(jnp.array([0.0, 0.0, 0.0, 0.0]), 3)
    obs, state, _, terminated, _, info = STEP(jax.random.key(5), upright, 1, params)
    assert not bool(terminated) and int(state.time) == 4
    np.testing.assert_array_equal(np.asarray(obs), np.asarray(info["final_obs"]))


def test_a_truncating_step_resets_and_keeps_the_final_observation():
    """At the time limit the env resets like after a fall, and exposes the state it reached
    (a learner bootstraps from its value)."""
    params = cartpole.DEFAULT_PARAMS
    upright = cartpole.state_from_array(jnp.array([0.01, 0.0, 0.0, 0.0]), params.max_steps_in_episode - 1)
    obs, state, _, terminated, truncated, info = STEP(jax.random.key(2), upright, 1, params)
    reached, _, _, _, _ = STEP_ENV(None, upright, 1, params)
    assert bool(truncated) and not bool(terminated) and int(state.time) == 0
    np.testing.assert_array_equal(np.asarray(info["final_obs"]), np.asarray(reached))
    assert not np.allclose(np.asarray(obs), np.asarray(reached))


def test_vmap_equals_a_loop_of_single_steps():
    params = cartpole.DEFAULT_PARAMS
    keys = jax.random.split(jax.random.key(1), 64)
    _, states = jax.vmap(cartpole.reset, in_axes=(0, None))(keys, params)
    actions = jax.random.bernoulli(jax.random.key(2), 0.5, (64,)).astype(jnp.int32)
    batched = jax.jit(jax.vmap(cartpole.step, in_axes=(0, 0, 0, None)))(keys, states, actions, params)
    for i in range(0, 64, 9):
        single = cartpole.step(keys[i], jax.tree.map(lambda x, i=i: x[i], states), actions[i], params)
        for b, s in zip(jax.tree.leaves(batched), jax.tree.leaves(single), strict=True):
            np.testing.assert_allclose(np.asarray(b[i]), np.asarray(s), rtol=1e-6)


def test_env_params_are_a_pytree_so_physics_can_be_vmapped():
    """Two gravities in one vmapped call: only the pole's angular acceleration changes."""
    state = cartpole.state_from_array(jnp.array([0.0, 0.0, 0.1, 0.0]))
    params = cartpole.EnvParams(gravity=jnp.array([9.8, 1.62]))
    obs, _, _, _, _ = jax.vmap(
        cartpole.step_env,
        in_axes=(
            None,
            None,
            None,
            cartpole.EnvParams(
                gravity=0,
                masscart=None,
                masspole=None,
                length=None,
                force_mag=None,
                tau=None,
                theta_threshold_radians=None,
                x_threshold=None,
            ),
        ),
    )(None, state, 0, params)
    assert obs.shape == (2, 4)
    assert float(obs[0, 3]) > float(obs[1, 3])  # stronger gravity tips the pole faster
    np.testing.assert_allclose(
        np.asarray(obs[0]), np.asarray(STEP_ENV(None, state, 0, cartpole.DEFAULT_PARAMS)[0]), rtol=1e-6
    )
