"""course_lib.envs.cartpole against gymnasium's CartPole-v1 (the oracle), gymnax style:
step both from the same state with the same actions and compare observations, rewards,
terminations and truncations; plus the auto-reset and jit/vmap behaviour. First, every
env module in ``ENVS`` against the env interface (course_lib.envs.interface)."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.envs import cartpole
from course_lib.envs.interface import JaxEnv, step_with_auto_reset

pytestmark = pytest.mark.timeout(300)

#: Every JAX env of the course; a new env module is added here and must pass the interface tests.
ENVS = [cartpole]
#: mypy checks that the module follows the protocol (each of its members, with its signature).
_CARTPOLE: JaxEnv[cartpole.EnvState, cartpole.EnvParams] = cartpole


def _assert_frozen_pytree(x, what):
    assert dataclasses.is_dataclass(x) and type(x).__dataclass_params__.frozen, f"{what} is not a frozen dataclass"
    leaves = jax.tree.leaves(x)
    assert leaves and leaves[0] is not x, f"{what} is a single leaf: register it as a pytree"


@pytest.mark.parametrize("env", ENVS, ids=lambda e: e.__name__.rsplit(".", 1)[-1])
def test_env_follows_the_interface(env):
    """Members, shapes and dtypes of reset / step_env / step, one env and a vmapped batch, under jit."""
    assert isinstance(env, JaxEnv)
    params = env.DEFAULT_PARAMS
    _assert_frozen_pytree(params, "EnvParams")
    obs, state = jax.jit(env.reset)(jax.random.key(0), params)
    _assert_frozen_pytree(state, "EnvState")
    assert obs.shape == (env.OBS_DIM,) and obs.dtype == jnp.float32
    for action in range(env.N_ACTIONS):
        out = jax.jit(env.step_env)(jax.random.key(1), state, action, params)
        assert len(out) == 5
        next_obs, next_state, reward, terminated, truncated = out
        assert next_obs.shape == (env.OBS_DIM,) and next_obs.dtype == jnp.float32
        assert jax.tree.structure(next_state) == jax.tree.structure(state)
        assert (reward.shape, reward.dtype) == ((), jnp.float32)
        assert (terminated.shape, terminated.dtype, truncated.shape, truncated.dtype) == ((), bool, (), bool)
        out = jax.jit(env.step)(jax.random.key(1), state, action, params)
        assert len(out) == 6 and out[5]["final_obs"].shape == (env.OBS_DIM,)
    keys = jax.random.split(jax.random.key(2), 5)
    obs, states = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
    actions = jnp.arange(5) % env.N_ACTIONS
    obs, _, reward, terminated, _, info = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))(
        keys, states, actions, params
    )
    assert obs.shape == info["final_obs"].shape == (5, env.OBS_DIM) and reward.shape == terminated.shape == (5,)


def test_step_with_auto_reset_never_gives_the_reset_the_transition_key():
    """The keys step_env and reset receive differ from each other and from the key given to step."""
    seen = {}

    def reset(key, params):
        seen["reset"] = key
        return cartpole.reset(key, params)

    def step_env(key, state, action, params):
        seen["step_env"] = key
        return cartpole.step_env(key, state, action, params)

    key = jax.random.key(4)
    _, state = cartpole.reset(jax.random.key(0))
    step_with_auto_reset(reset, step_env, key, state, 1, cartpole.DEFAULT_PARAMS)
    data = [tuple(np.asarray(jax.random.key_data(k)).ravel()) for k in (key, seen["step_env"], seen["reset"])]
    assert len(set(data)) == 3


@pytest.mark.parametrize("env", ENVS, ids=lambda e: e.__name__.rsplit(".", 1)[-1])
def test_step_is_step_env_then_a_reset_drawn_with_its_own_key(env):
    """Over a random rollout that crosses many episode ends: ``step`` equals the interface's
    auto-reset of the env's own ``reset`` and ``step_env``; where an episode ended its new
    observation is not the one a reset with the step's key would draw (the key was split)."""
    params, n = env.DEFAULT_PARAMS, 32
    step = jax.jit(jax.vmap(env.step, in_axes=(0, 0, 0, None)))
    reference = jax.jit(jax.vmap(lambda *a: step_with_auto_reset(env.reset, env.step_env, *a), in_axes=(0, 0, 0, None)))
    reset_with = jax.jit(jax.vmap(env.reset, in_axes=(0, None)))
    _, state = reset_with(jax.random.split(jax.random.key(0), n), params)
    ended = 0
    for t in range(60):
        keys = jax.random.split(jax.random.key(100 + t), n)
        actions = jax.random.randint(jax.random.key(200 + t), (n,), 0, env.N_ACTIONS)
        out = step(keys, state, actions, params)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(reference(keys, state, actions, params)), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        obs, state, _, terminated, truncated, info = out
        done = np.asarray(terminated | truncated)
        same_key_obs, _ = reset_with(keys, params)
        assert not np.isclose(np.asarray(obs)[done], np.asarray(same_key_obs)[done]).all(-1).any()
        np.testing.assert_array_equal(np.asarray(obs)[~done], np.asarray(info["final_obs"])[~done])
        ended += int(done.sum())
    assert ended > 20


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
