"""Off-policy RL at scale (lesson 06): replay on the device, SAC as one compiled program,
the model-size x scenario-diversity sweep, and SAC sharded over a device mesh.

- :mod:`course_lib.offpolicy.replay`: a uniform ring buffer and prioritized replay on a
  sum-tree, as pytrees of device arrays.
- :mod:`course_lib.offpolicy.sac`: SAC's equations and the whole training loop as one
  jitted ``lax.scan`` (acting, storing, sampling, learning).
- :mod:`course_lib.offpolicy.sweep`: the model-size sweep of the lesson.
"""
