r"""A finite pool of procedurally generated scenarios: how much *distinct* data a run sees (lesson 06).

A procedural env such as :mod:`course_lib.envs.driving` draws a whole scenario (road,
lanes, traffic, route) from the key its ``reset`` gets, so a training run normally meets a
new scenario at every episode: its data are as diverse as its number of episodes. A
dataset-driven simulator (V-Max on Waymax replays the Waymo Open Motion Dataset) has a
*finite* set of scenarios, and how many of them a run may use is a data-size axis of its
own, distinct from how many environment steps it takes. :class:`ScenarioPool` turns any
such env into one with a pool of ``K`` scenarios::

    index  = first + randint(reset_key, 0, K)      which scenario of the pool
    obs, s = base.reset(fold_in(pool_key, index), base_params)

The pool is **data, not code**: ``pool_key``, ``first`` and ``K`` live in
:class:`PoolParams`, the env's params pytree, so one compiled training program serves every
pool size (``jax.jit`` traces the params as arguments; ``jax.vmap`` can even give every run
of a batch its own ``K``). Scenario ``i`` is the same for every ``K``, so the pools are
nested: the pool of 4 is the first 4 scenarios of the pool of 32.

- **Unlimited data** is ``K =`` :data:`UNLIMITED` (``2^30`` indices): a run of ``n``
  resets repeats a scenario with probability about ``n^2 / 2^31`` (0.05 % for 1,000 resets).
- **Held-out scenarios** are the indices from :data:`HELD_OUT_FIRST` = ``2^30`` on
  (:func:`held_out_params`): no training pool, of any size, ever contains one, by
  construction of the indices (two different indices give the same scenario only if
  ``fold_in`` collides, as likely as two fresh keys colliding).

The wrapper keeps the :class:`~course_lib.offpolicy.sac.ContinuousEnv` interface (``step``
auto-resets into the pool, ``info`` carries the base env's episode metrics), so SAC and its
evaluation run on it unchanged (:mod:`course_lib.offpolicy.sweep`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array

from course_lib.envs.interface import step_with_auto_reset

#: ``K`` for "every reset a fresh scenario": the whole training index range ``[0, 2^30)``.
UNLIMITED = 2**30
#: The first held-out index: training pools use ``[0, K)`` with ``K <= UNLIMITED``, held-out
#: scenarios ``[2^30, 2^31)``; the two never meet.
HELD_OUT_FIRST = 2**30


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class PoolParams:
    """A scenario pool's params (a pytree; every field is data, so it can be traced and vmapped).

    Attributes:
        base: the base env's params (its static fields stay static).
        pool_key: the key every scenario is folded from: scenario ``i`` is ``reset(fold_in(pool_key, i))``.
        first: int32, the pool's first index (0 for training pools, :data:`HELD_OUT_FIRST` for held-out).
        size: int32, ``K``, the number of scenarios in the pool (1 .. :data:`UNLIMITED`).
    """

    base: Any
    pool_key: Array
    first: Array
    size: Array


def check_pool_size(size: int) -> None:
    """Refuse a pool size the index arithmetic cannot hold."""
    if not 1 <= int(size) <= UNLIMITED:
        raise ValueError(
            f"a scenario pool needs 1 <= K <= UNLIMITED (= 2**30, every reset fresh), got K = {size}; "
            "pass scenarios.UNLIMITED for unlimited data"
        )


def pool_params(base_params: Any, pool_key: Array, size: int) -> PoolParams:
    """Params of the training pool of the first ``size`` scenarios of ``pool_key``."""
    check_pool_size(size)
    return PoolParams(base_params, pool_key, jnp.int32(0), jnp.int32(size))


def held_out_params(base_params: Any, pool_key: Array, size: int = UNLIMITED) -> PoolParams:
    """Params that draw only held-out scenarios (indices ``HELD_OUT_FIRST + [0, size)``):
    never in any training pool of the same ``pool_key``."""
    check_pool_size(size)
    return PoolParams(base_params, pool_key, jnp.int32(HELD_OUT_FIRST), jnp.int32(size))


@dataclass(unsafe_hash=True)
class ScenarioPool:
    """``base`` (a continuous-action env module) with its resets drawn from a :class:`PoolParams` pool.

    ``info_fn`` is the base env's episode-metrics function, the one its own ``step`` passes
    to :func:`~course_lib.envs.interface.step_with_auto_reset` (default: ``base.episode_metrics``,
    the driving env's). Hashable (by its fields), so it can be a static argument of ``jax.jit``;
    never change its fields after construction.
    """

    base: Any
    info_fn: Callable[[Any, Any], dict[str, Array]] | None = None
    #: The base env's sizes (set from ``base``; the env interface's names).
    OBS_DIM: int = field(init=False)
    ACTION_DIM: int = field(init=False)

    def __post_init__(self) -> None:
        self.OBS_DIM = int(self.base.OBS_DIM)
        self.ACTION_DIM = int(self.base.ACTION_DIM)

    def scenario_key(self, key: Array, params: PoolParams) -> Array:
        """The key of the pool scenario a reset with ``key`` starts: ``fold_in(pool_key, first + randint(key, 0, K))``."""
        index = params.first + jax.random.randint(key, (), 0, params.size, dtype=jnp.int32)
        return jax.random.fold_in(params.pool_key, index)

    def reset(self, key: Array, params: PoolParams) -> tuple[Array, Any]:
        """A scenario of the pool, chosen uniformly by ``key``: ``(obs, state)`` of the base env."""
        return self.base.reset(self.scenario_key(key, params), params.base)

    def step_env(self, key: Array | None, state: Any, action: Array, params: PoolParams) -> Any:
        """The base env's transition (no reset)."""
        return self.base.step_env(key, state, action, params.base)

    def step(
        self, key: Array, state: Any, action: Array, params: PoolParams
    ) -> tuple[Array, Any, Array, Array, Array, dict[str, Array]]:
        """The base env's transition, then, where the episode ended, a reset into the pool."""
        info_fn = self.info_fn if self.info_fn is not None else self.base.episode_metrics
        return step_with_auto_reset(
            self.reset,
            self.step_env,
            key,
            state,
            action,
            params,
            info_fn=lambda s, p: info_fn(s, p.base),
        )

    def episode_success(self, collision: Array, offroad: Array, progress_ratio: Array, params: PoolParams) -> Array:
        """The base env's success rule (V-Max's accuracy for the driving env)."""
        return self.base.episode_success(collision, offroad, progress_ratio, params.base)


__all__ = [
    "HELD_OUT_FIRST",
    "UNLIMITED",
    "PoolParams",
    "ScenarioPool",
    "check_pool_size",
    "held_out_params",
    "pool_params",
]
