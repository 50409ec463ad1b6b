"""Scaling out in JAX (lesson 05): one module per concept.

- :mod:`~course_lib.scaling.devices`: CPU host devices, meshes sized from the devices present, the multi-device safety rule
- :mod:`~course_lib.scaling.collectives`: the collectives, a ring all-reduce from ``ppermute``, the alpha-beta model
- :mod:`~course_lib.scaling.ppo_dp`: lesson 04's PPO, data-parallel in one ``jit(shard_map(...))``
- :mod:`~course_lib.scaling.tensor_parallel`: Megatron's column/row-parallel MLP on a data x model mesh
- :mod:`~course_lib.scaling.fsdp`: parameters and optimizer state sharded over ``data`` (ZeRO-3 / FSDP)
- :mod:`~course_lib.scaling.topology`: multi-slice (hybrid ICI/DCN) meshes and published link figures
- :mod:`~course_lib.scaling.multihost`: the multi-process worker (``jax.distributed``)
- :mod:`~course_lib.scaling.remat`, :mod:`~course_lib.scaling.precision`, :mod:`~course_lib.scaling.accumulation`,
  :mod:`~course_lib.scaling.lr_rules`: memory and precision tools, measured
- :mod:`~course_lib.scaling.profiling`: ``jax.profiler.trace`` and a reader for its trace
- :mod:`~course_lib.scaling.checklist`: the executable scaling checklist

Nothing is imported here: :func:`course_lib.scaling.devices.use_cpu_devices` must run
before JAX starts its backend, so importing the package starts nothing.
"""
