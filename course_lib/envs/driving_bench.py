"""Environment steps per second of lesson 06's driving simulator: JAX ``jit(scan(vmap(step)))``
against the classic numpy env in gymnasium's ``SyncVectorEnv``.

:func:`measure_env_throughput` times one compiled program per env count: ``steps`` steps
of ``vmap(step)`` (auto-reset included, uniform random actions drawn inside the program)
under ``lax.scan``, after a warm-up call; the compile is not timed.
:func:`measure_numpy_throughput` times ``SyncVectorEnv`` of
:class:`~course_lib.envs.driving_numpy.DrivingNumpyEnv` (gymnasium's own auto-reset),
one env after the other in one Python process, as classic RL code steps its envs.
Both report env steps per second (one env advancing one step is one env step).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import jax
import numpy as np
from jax import Array

from course_lib.envs import driving
from course_lib.envs.driving import ACTION_DIM, DEFAULT_PARAMS, EnvParams, EnvState
from course_lib.envs.driving_numpy import DrivingNumpyEnv


def make_random_rollout(num_envs: int, steps: int, params: EnvParams = DEFAULT_PARAMS) -> jax.stages.Wrapped:
    """``rollout(states [num_envs], key) -> (states, rewards [steps, num_envs])``, jitted:
    ``steps`` steps of ``vmap(driving.step)`` with uniform random actions, under ``lax.scan``."""
    vstep = jax.vmap(driving.step, in_axes=(0, 0, 0, None))

    def rollout(states: EnvState, key: Array) -> tuple[EnvState, Array]:
        def one_step(states: EnvState, k: Array) -> tuple[EnvState, Array]:
            k_act, k_step = jax.random.split(k)
            actions = jax.random.uniform(k_act, (num_envs, ACTION_DIM), minval=-1.0, maxval=1.0)
            _, states, reward, _, _, _ = vstep(jax.random.split(k_step, num_envs), states, actions, params)
            return states, reward

        return jax.lax.scan(one_step, states, jax.random.split(key, steps))

    return jax.jit(rollout)


def _best_seconds(run: Callable[[], object], repeats: int) -> float:
    """The shortest wall time of ``repeats`` calls of ``run`` (it blocks until its result is ready)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def measure_env_throughput(
    num_envs_list: Sequence[int] = (1, 64, 1024, 4096),
    steps: int = 32,
    params: EnvParams = DEFAULT_PARAMS,
    seed: int = 0,
    repeats: int = 2,
) -> dict[int, float]:
    """Env steps per second of ``jit(scan(vmap(step)))`` for each env count.

    Each count compiles its own program (a few seconds on 2 CPU cores, not timed; all counts
    compile at once, one thread each), runs it once to warm up, then takes the best of
    ``repeats`` timed calls of ``steps`` steps, one count after the other.

    Returns:
        ``{num_envs: env steps per second}``.
    """
    key_reset, key_run = jax.random.split(jax.random.key(seed))
    reset = jax.jit(jax.vmap(driving.reset, in_axes=(0, None)))
    starts = {n: reset(jax.random.split(key_reset, n), params)[1] for n in num_envs_list}

    def compile_one(num_envs: int) -> jax.stages.Compiled:
        return make_random_rollout(num_envs, steps, params).lower(starts[num_envs], key_run).compile()

    with ThreadPoolExecutor(len(num_envs_list)) as pool:  # XLA compiles on every core at once
        programs = dict(zip(num_envs_list, pool.map(compile_one, num_envs_list)))
    rates = {}
    for num_envs, compiled in programs.items():  # timed one after the other
        states = starts[num_envs]
        jax.block_until_ready(compiled(states, key_run))  # warm-up

        def run(compiled: jax.stages.Compiled = compiled, states: EnvState = states, key: Array = key_run) -> None:
            jax.block_until_ready(compiled(states, key))

        rates[num_envs] = num_envs * steps / _best_seconds(run, repeats)
    return rates


def measure_numpy_throughput(
    num_envs_list: Sequence[int] = (1, 8, 64),
    steps: int = 100,
    params: EnvParams = DEFAULT_PARAMS,
    seed: int = 0,
    repeats: int = 2,
) -> dict[int, float]:
    """Env steps per second of ``gymnasium.vector.SyncVectorEnv`` of ``DrivingNumpyEnv``,
    uniform random actions drawn before the timed loop (best of ``repeats`` loops of ``steps``).

    Returns:
        ``{num_envs: env steps per second}``.
    """
    rates = {}
    rng = np.random.default_rng(seed)
    for num_envs in num_envs_list:
        envs = gym.vector.SyncVectorEnv([lambda: DrivingNumpyEnv(params) for _ in range(num_envs)])
        envs.reset(seed=seed)
        actions = rng.uniform(-1.0, 1.0, (steps, num_envs, ACTION_DIM)).astype(np.float32)

        def run(envs: gym.vector.SyncVectorEnv = envs, actions: np.ndarray = actions) -> None:
            for action in actions:
                envs.step(action)

        rates[num_envs] = num_envs * steps / _best_seconds(run, repeats)
        envs.close()
    return rates


__all__ = ["make_random_rollout", "measure_env_throughput", "measure_numpy_throughput"]
