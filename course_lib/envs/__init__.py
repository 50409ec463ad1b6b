"""Environments written as pure JAX functions (lessons 04-06).

Each environment is a module of pure functions in the gymnax style (Lange, 2022):
frozen ``EnvState`` / ``EnvParams`` dataclasses registered as pytrees, ``reset(key,
params)``, ``step_env`` (one transition, no reset) and ``step`` (the same with an
automatic reset when an episode ends). Nothing is hidden in an object, so ``jax.jit``,
``jax.vmap`` and ``jax.lax.scan`` apply to them directly.

- :mod:`course_lib.envs.cartpole`: gymnasium's ``CartPole-v1``, step for step.
"""

import os as _os

#: XLA flag that the JAX code of lessons 04-06 needs on a CPU backend. With XLA's
#: concurrency-optimised scheduler (the default in jaxlib 0.10.2), a vmapped training
#: program of nested ``lax.scan`` loops sometimes never finishes on a 2-core machine:
#: every XLA worker thread waits for work and ``block_until_ready`` waits forever (seen
#: with 16 vmapped PPO seeds; a gdb backtrace shows all pool threads idle). The default
#: scheduler order runs the same program reliably and as fast.
#:
#: Not solved by this flag (measured 2026-11-21, jaxlib 0.10.2, 2 cores): the same 16-seed
#: program split over two host devices (``--xla_force_host_platform_device_count=2``, then
#: ``jit(shard_map(vmap(train)))``, no collectives) ran 2.2x faster when it finished but hung
#: in 1 of 3 runs even with ``--xla_cpu_multi_thread_eigen=false``; one executable per device
#: from one process hung in 3 of 4. Code that needs two CPU devices must run under a timeout.
XLA_CPU_FLAGS = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def use_reliable_xla_cpu_flags() -> None:
    """Add :data:`XLA_CPU_FLAGS` to ``XLA_FLAGS`` (read when JAX first starts its backend).

    Called when :mod:`course_lib.envs` is imported, so it takes effect in any process that
    imports the course's JAX code before running its first JAX computation.
    """
    flags = _os.environ.get("XLA_FLAGS", "")
    if XLA_CPU_FLAGS.split("=")[0] not in flags:
        _os.environ["XLA_FLAGS"] = f"{flags} {XLA_CPU_FLAGS}".strip()


use_reliable_xla_cpu_flags()
