"""Environments written as pure JAX functions (lessons 04-06).

Each environment is a module of pure functions in the gymnax style (Lange, 2022), behind
one interface, :mod:`course_lib.envs.interface`: frozen ``EnvState`` / ``EnvParams``
dataclasses registered as pytrees, ``reset(key, params)``, ``step_env`` (one transition,
no reset) and ``step`` (the same with an automatic reset when an episode ends, its key
split before the reset), ``OBS_DIM`` and ``N_ACTIONS``. Nothing is hidden in an object,
so ``jax.jit``, ``jax.vmap`` and ``jax.lax.scan`` apply to them directly.

- :mod:`course_lib.envs.interface`: the :class:`~course_lib.envs.interface.JaxEnv`
  protocol and the auto-reset every env's ``step`` is made of.
- :mod:`course_lib.envs.cartpole`: gymnasium's ``CartPole-v1``, step for step.
- :mod:`course_lib.envs.driving`: lesson 06's procedurally generated driving simulator
  (kinematic bicycle ego, IDM traffic, V-Max-style observation and metrics), continuous
  actions (:class:`~course_lib.envs.interface.ContinuousJaxEnv`); its numpy
  ``gymnasium.Env`` twin :mod:`~course_lib.envs.driving_numpy`, the top-down picture
  :mod:`~course_lib.envs.driving_render` and the throughput benchmark
  :mod:`~course_lib.envs.driving_bench` (``tests/test_envs_driving.py``).
- :mod:`course_lib.envs.scenarios`: a finite pool of ``K`` procedural scenarios around any
  such env (:class:`~course_lib.envs.scenarios.ScenarioPool`, the pool as data in the
  params) and held-out scenarios no pool contains: lesson 06's data-diversity axis.

A new environment is a new module here that follows the interface, added to ``ENVS`` in
``tests/test_envs_cartpole.py``, which checks every env listed there against it (and, with
mypy, that the module type-checks as a ``JaxEnv``). Importing this package has
no side effect (the XLA CPU flag the training programs need is set by
:mod:`course_lib.ppo.jax_ppo`).
"""
