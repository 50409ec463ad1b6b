r"""The interface every JAX environment of the course follows (gymnax style; lessons 04-06).

An environment is a **module of pure functions** over two pytrees (Lange, 2022, gymnax's
``environment.py``; :mod:`course_lib.envs.cartpole` is the first)::

    OBS_DIM: int                    observations are [OBS_DIM] float32
    N_ACTIONS: int                  actions are the integers 0 .. N_ACTIONS - 1
    DEFAULT_PARAMS: EnvParams       the constants an episode runs with

    obs, state = reset(key, params)                                           # a new episode
    obs, state, reward, terminated, truncated = step_env(key, state, action, params)
    obs, state, reward, terminated, truncated, info = step(key, state, action, params)

What a module must guarantee, so that ``jax.jit``, ``jax.vmap`` and ``jax.lax.scan`` apply
to it directly and a learner (:mod:`course_lib.ppo.jax_ppo`) can use any env unchanged:

- ``EnvState`` and ``EnvParams`` are immutable pytrees: frozen dataclasses registered
  with ``jax.tree_util.register_dataclass``; what decides shapes or loop lengths (e.g. an
  episode's step limit) is a static field. Functions return new values, never mutate.
- No Python ``if`` on traced values (select with ``jnp.where``), so one trace serves a
  single env and a ``vmap``-ed batch.
- ``reward`` is a float32 scalar; ``terminated`` (the MDP ended: no future reward) and
  ``truncated`` (a time limit cut the episode: the state still has a value) are bool
  scalars, kept apart as in gymnasium >= 0.26 and gymnax >= 1.0.
- ``step_env`` is one transition with no reset. ``step`` is ``step_env`` followed, in the
  same call, by a reset when ``terminated | truncated``: it returns the new episode's first
  observation and keeps the one the step reached in ``info["final_obs"]`` (a learner
  bootstraps a truncated step from its value). Write ``step`` as
  :func:`step_with_auto_reset` of the module's own ``reset`` and ``step_env``: it splits
  ``key`` so that the reset never reuses the transition's key.

:class:`JaxEnv` states this as a ``typing.Protocol`` that a module satisfies
structurally: ``env: JaxEnv[EnvState, EnvParams] = cartpole`` type-checks, and
``tests/test_envs_cartpole.py`` checks the behaviour of every env it lists.
:class:`ContinuousJaxEnv` is the same for continuous actions (``ACTION_DIM`` floats in
``[-1, 1]`` instead of ``N_ACTIONS`` integers; lesson 06's :mod:`course_lib.envs.driving`,
checked in ``tests/test_envs_driving.py``). An env whose ``info`` carries more than
``final_obs`` passes ``info_fn`` to :func:`step_with_auto_reset`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar, runtime_checkable

import jax
import jax.numpy as jnp
from jax import Array

StateT = TypeVar("StateT")
ParamsT = TypeVar("ParamsT")
ActionT = TypeVar("ActionT")

#: ``step_env``'s result: ``(obs, next_state, reward, terminated, truncated)``.
StepResult = tuple[Array, StateT, Array, Array, Array]
#: ``step``'s result: ``step_env``'s with an info dict (``final_obs``) after it.
AutoResetStepResult = tuple[Array, StateT, Array, Array, Array, dict[str, Array]]


@runtime_checkable
class JaxEnv(Protocol[StateT, ParamsT]):
    """A JAX environment module (see the module docstring for what each member guarantees)."""

    OBS_DIM: int
    N_ACTIONS: int
    DEFAULT_PARAMS: ParamsT

    def reset(self, key: Array, params: ParamsT) -> tuple[Array, StateT]:
        """A new episode: ``(obs [OBS_DIM] float32, state)``."""
        ...

    def step_env(self, key: Array | None, state: StateT, action: Array | int, params: ParamsT) -> StepResult[StateT]:
        """One transition, no reset: ``(obs, next_state, reward, terminated, truncated)``."""
        ...

    def step(self, key: Array, state: StateT, action: Array | int, params: ParamsT) -> AutoResetStepResult[StateT]:
        """``step_env``, then a reset if the episode ended (:func:`step_with_auto_reset`)."""
        ...


@runtime_checkable
class ContinuousJaxEnv(Protocol[StateT, ParamsT]):
    """A JAX environment module with continuous actions: ``action [ACTION_DIM] float32`` in
    ``[-1, 1]`` (the env scales it; out-of-range values are clipped). Otherwise the same
    guarantees as :class:`JaxEnv` (see the module docstring); e.g. :mod:`course_lib.envs.driving`."""

    OBS_DIM: int
    ACTION_DIM: int
    DEFAULT_PARAMS: ParamsT

    def reset(self, key: Array, params: ParamsT) -> tuple[Array, StateT]:
        """A new episode: ``(obs [OBS_DIM] float32, state)``."""
        ...

    def step_env(self, key: Array | None, state: StateT, action: Array, params: ParamsT) -> StepResult[StateT]:
        """One transition, no reset: ``(obs, next_state, reward, terminated, truncated)``."""
        ...

    def step(self, key: Array, state: StateT, action: Array, params: ParamsT) -> AutoResetStepResult[StateT]:
        """``step_env``, then a reset if the episode ended (:func:`step_with_auto_reset`)."""
        ...


def step_with_auto_reset(
    reset: Callable[[Array, ParamsT], tuple[Array, StateT]],
    step_env: Callable[[Array, StateT, ActionT, ParamsT], StepResult[StateT]],
    key: Array,
    state: StateT,
    action: ActionT,
    params: ParamsT,
    info_fn: Callable[[StateT, ParamsT], dict[str, Array]] | None = None,
) -> AutoResetStepResult[StateT]:
    """An env's ``step``: ``step_env``, then ``reset`` in the same call where the episode ended.

    ``key`` is split in two first, one half for the transition and one for the reset, so
    that no key is used twice even for an env whose dynamics are random. Both the stepped
    and the reset state are computed and one is selected per field (:func:`auto_reset`), so
    there is no Python branch: it traces once and vmaps.

    Returns:
        ``(obs, state, reward, terminated, truncated, info)``: ``obs`` / ``state`` start
        the next episode when ``terminated | truncated``; ``info["final_obs"]`` is the
        observation the step reached before any reset; with ``info_fn``, also
        ``info_fn(stepped_state, params)``'s entries (e.g. episode metrics), evaluated on
        the state the step reached, before any reset.
    """
    key_step, key_reset = jax.random.split(key)
    obs_step, state_step, reward, terminated, truncated = step_env(key_step, state, action, params)
    obs, state_next = auto_reset(terminated | truncated, (obs_step, state_step), reset(key_reset, params))
    info = {"final_obs": obs_step}
    if info_fn is not None:
        info |= info_fn(state_step, params)
    return obs, state_next, reward, terminated, truncated, info


def auto_reset(done: Array, stepped: tuple[Array, StateT], fresh: tuple[Array, StateT]) -> tuple[Array, StateT]:
    """``fresh`` (an ``(obs, state)`` pair from ``reset``) where ``done``, else ``stepped``.

    Branch-free (``jnp.where`` on every field of the state pytree), so it works unchanged
    under ``vmap`` with ``done [B]``. :func:`step_with_auto_reset` draws ``fresh`` itself; a
    rollout can instead draw the reset states of all its steps in one call before its scan
    (see :func:`course_lib.ppo.jax_ppo.collect_rollout`).
    """
    obs_step, state_step = stepped
    obs_reset, state_reset = fresh
    state = jax.tree.map(lambda r, s: jnp.where(_expand(done, r), r, s), state_reset, state_step)
    return jnp.where(_expand(done, obs_reset), obs_reset, obs_step), state


def _expand(done: Array, like: Array) -> Array:
    """``done`` with trailing axes added to broadcast against ``like`` (``[B] -> [B, 4]``)."""
    return jnp.reshape(done, done.shape + (1,) * (like.ndim - done.ndim))


__all__ = ["AutoResetStepResult", "ContinuousJaxEnv", "JaxEnv", "StepResult", "auto_reset", "step_with_auto_reset"]
