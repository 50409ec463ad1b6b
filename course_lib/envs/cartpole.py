r"""CartPole-v1 as pure JAX functions: the environment of lesson 04.

The physics and the episode rules are gymnasium's ``CartPole-v1`` (Barto, Sutton &
Anderson, 1983; Florian, 2007, "Correct equations for the dynamics of the cart-pole
system"), written in the functional style of gymnax's ``cartpole.py`` (Lange, 2022):
the state is an immutable :class:`EnvState`, the constants an immutable
:class:`EnvParams`, and every function returns new values instead of mutating.

One Euler step of length ``tau`` (eq. 04.1 of the lesson), with ``F = +-force_mag``,
``m = masspole``, ``M = masscart + masspole`` and ``l = length`` (half the pole)::

    temp       = (F + m l theta_dot^2 sin theta) / M
    theta_acc  = (g sin theta - cos theta * temp) / (l (4/3 - m cos^2 theta / M))
    x_acc      = temp - m l theta_acc cos theta / M
    x' = x + tau x_dot,  x_dot' = x_dot + tau x_acc,  theta' = theta + tau theta_dot,  theta_dot' = theta_dot + tau theta_acc

The reward is 1 for every step. An episode **terminates** when ``|x'| > 2.4`` or
``|theta'| > 12 degrees`` (the pole fell: no future reward) and is **truncated** when it
reaches ``max_steps_in_episode`` = 500 steps (a time limit: the state still has a
value). The two are returned apart, like gymnasium >= 0.26 and gymnax >= 1.0.

API: the course's env interface (:mod:`course_lib.envs.interface`; every function is
pure, so it jits, vmaps and scans)::

    obs, state = reset(key, params)                                     # obs [4] float32
    obs, state, reward, terminated, truncated = step_env(key, state, action, params)
    obs, state, reward, terminated, truncated, info = step(key, state, action, params)

``step`` resets the env in the same call when the episode ends (``terminated or
truncated``): it returns the first observation of the new episode and keeps the last
observation of the old one in ``info["final_obs"]`` (a learner needs it: after a
truncation the return is bootstrapped from the value of that observation). It computes both branches and
selects with ``jnp.where``, so there is no Python ``if`` on traced values; it is the
interface's :func:`~course_lib.envs.interface.step_with_auto_reset` of this module's
``reset`` and ``step_env``, which splits the key before the reset.

The parity test (``tests/test_envs_cartpole.py``) steps gymnasium's env and this one
from the same states with the same actions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax import Array

from course_lib.envs.interface import auto_reset, step_with_auto_reset

#: Observation layout: ``[x, x_dot, theta, theta_dot]``.
OBS_NAMES: tuple[str, ...] = (
    "cart position (m)",
    "cart velocity (m/s)",
    "pole angle (rad)",
    "pole angular velocity (rad/s)",
)
OBS_DIM = 4
N_ACTIONS = 2


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class EnvState:
    """The complete state of one CartPole env; every field is a scalar array (``[B]`` when vmapped).

    Attributes:
        x: cart position (m).
        x_dot: cart velocity (m/s).
        theta: pole angle from upright (rad).
        theta_dot: pole angular velocity (rad/s).
        time: steps taken in the current episode (int32).
    """

    x: Array
    x_dot: Array
    theta: Array
    theta_dot: Array
    time: Array


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class EnvParams:
    """CartPole's constants (gymnasium's defaults). A pytree: vmap over a field to batch
    physically different envs (e.g. several gravities) in one program."""

    gravity: float = 9.8
    masscart: float = 1.0
    masspole: float = 0.1
    length: float = 0.5
    force_mag: float = 10.0
    tau: float = 0.02
    theta_threshold_radians: float = 12 * 2 * math.pi / 360
    x_threshold: float = 2.4
    max_steps_in_episode: int = field(default=500, metadata={"static": True})

    @property
    def total_mass(self) -> float:
        return self.masspole + self.masscart

    @property
    def polemass_length(self) -> float:
        return self.masspole * self.length


DEFAULT_PARAMS = EnvParams()


def get_obs(state: EnvState) -> Array:
    """``[4]`` float32 observation ``[x, x_dot, theta, theta_dot]`` (``[B, 4]`` for a batch)."""
    return jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot], axis=-1).astype(jnp.float32)


def is_terminal(state: EnvState, params: EnvParams = DEFAULT_PARAMS) -> Array:
    """True when the cart left the track or the pole fell past the threshold."""
    return (
        (state.x < -params.x_threshold)
        | (state.x > params.x_threshold)
        | (state.theta < -params.theta_threshold_radians)
        | (state.theta > params.theta_threshold_radians)
    )


def reset(key: Array, params: EnvParams = DEFAULT_PARAMS) -> tuple[Array, EnvState]:
    """A new episode: each of the 4 state variables uniform in ``[-0.05, 0.05]``.

    Returns:
        ``(obs [4] float32, state)``.
    """
    x, x_dot, theta, theta_dot = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05)
    state = EnvState(x=x, x_dot=x_dot, theta=theta, theta_dot=theta_dot, time=jnp.zeros((), jnp.int32))
    return get_obs(state), state


def step_env(
    key: Array | None, state: EnvState, action: Array | int, params: EnvParams = DEFAULT_PARAMS
) -> tuple[Array, EnvState, Array, Array, Array]:
    """One transition (eq. 04.1), with no reset.

    Args:
        key: unused (CartPole's dynamics are deterministic); kept so that every env has
            the same signature.
        state: the current state.
        action: 0 (push left) or 1 (push right).
        params: the constants.

    Returns:
        ``(obs [4] float32, next_state, reward (float32, 1.0), terminated (bool),
        truncated (bool))``.
    """
    del key
    force = jnp.where(action == 1, params.force_mag, -params.force_mag)
    costheta = jnp.cos(state.theta)
    sintheta = jnp.sin(state.theta)
    temp = (force + params.polemass_length * state.theta_dot**2 * sintheta) / params.total_mass
    theta_acc = (params.gravity * sintheta - costheta * temp) / (
        params.length * (4.0 / 3.0 - params.masspole * costheta**2 / params.total_mass)
    )
    x_acc = temp - params.polemass_length * theta_acc * costheta / params.total_mass
    next_state = EnvState(
        x=state.x + params.tau * state.x_dot,
        x_dot=state.x_dot + params.tau * x_acc,
        theta=state.theta + params.tau * state.theta_dot,
        theta_dot=state.theta_dot + params.tau * theta_acc,
        time=state.time + 1,
    )
    terminated = is_terminal(next_state, params)
    truncated = next_state.time >= params.max_steps_in_episode
    reward = jnp.ones((), jnp.float32)
    return get_obs(next_state), next_state, reward, terminated, truncated


def step(
    key: Array, state: EnvState, action: Array | int, params: EnvParams = DEFAULT_PARAMS
) -> tuple[Array, EnvState, Array, Array, Array, dict[str, Array]]:
    """:func:`step_env`, then a reset in the same call if the episode ended.

    Both the stepped and the reset state are computed and one is selected with
    ``jnp.where`` (no Python branch, so it traces once and vmaps).

    Returns:
        ``(obs, state, reward, terminated, truncated, info)``: ``obs`` / ``state`` start
        the next episode when ``terminated | truncated``; ``info["final_obs"]`` is the
        observation the step reached before any reset (bootstrap a truncated step from
        its value: see :func:`course_lib.ppo.jax_ppo.td_targets`).

    ``key`` is split in two, one half for the transition and one for the reset, so that
    no key is used twice even for an env whose dynamics are random
    (:func:`course_lib.envs.interface.step_with_auto_reset`).
    """
    return step_with_auto_reset(reset, step_env, key, state, action, params)


def state_from_array(values: Array, time: Array | int = 0) -> EnvState:
    """An :class:`EnvState` from ``[..., 4]`` values ``[x, x_dot, theta, theta_dot]`` (e.g.
    gymnasium's ``env.unwrapped.state``) and a step count."""
    v = jnp.asarray(values)
    return EnvState(
        x=v[..., 0],
        x_dot=v[..., 1],
        theta=v[..., 2],
        theta_dot=v[..., 3],
        time=jnp.broadcast_to(jnp.asarray(time, jnp.int32), v.shape[:-1]),
    )


__all__ = [
    "DEFAULT_PARAMS",
    "N_ACTIONS",
    "OBS_DIM",
    "OBS_NAMES",
    "EnvParams",
    "EnvState",
    "auto_reset",
    "get_obs",
    "is_terminal",
    "reset",
    "state_from_array",
    "step",
    "step_env",
]
