"""Efficient RL Systems: the tested library every lesson notebook imports.

The layout, floor by floor (``course_lib/README.md`` has the map and where new code goes):

- ``course/``: course tooling, not RL: the run contract (``scale``), paths, the lesson
  catalog, progress bars and inline source (``display``), the shared figures (``plots``),
  notebook build and execution, grading, the ``course`` command, the environment doctor,
  JupyterLab.
- ``rl/``: the RL maths, pure functions a learner reads line by line, and the first loops:
  ``pg`` (returns, advantages, estimators), ``bandits`` and ``verifiable`` (problems with exact
  answers), ``reinforce`` (01), ``importance`` and ``staleness`` (02), ``vtrace`` (03).
- ``envs/``: environments as pure JAX functions behind one interface (lessons 04-06).
- ``ppo/`` (04): ``config``, ``jax_ppo`` and its classic twin ``torch_ppo``.
- ``scaling/`` (05) and ``offpolicy/`` (06): JAX across devices; replay and SAC at scale.
- ``runtime/``: the floor the systems stand on: child processes and their lifecycle,
  shared versioned weights, torch.distributed ranks.
- Systems, siblings on that floor: ``actor_learner/`` (03), ``lm/`` and ``pipeline/`` (07,
  with ``pipeline.lag``, lesson 03's policy-lag ablation), ``layout/`` (08), ``weight_sync/``
  (09), ``checkpoint/`` (10), ``capstone/`` (11).

What every lesson needs is importable from here: ``from course_lib import pick, progress``.
"""

from course_lib.course.display import describe, progress, show_source
from course_lib.course.grading import check, hint
from course_lib.course.scale import current_scale, pick

__version__ = "0.1.0"
__all__ = ["check", "current_scale", "describe", "hint", "pick", "progress", "show_source"]
