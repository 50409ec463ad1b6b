"""Efficient RL Systems: the tested library every lesson notebook imports.

The layout, floor by floor (``course_lib/README.md`` has the map and where new code goes):

- ``course/``: course tooling, not RL: the run contract (``scale``), paths, the lesson
  catalog, progress bars and inline source (``display``), notebook build and execution,
  grading, the ``course`` command, the environment doctor, JupyterLab.
- The RL maths, pure functions a learner reads line by line: ``pg`` (returns, advantages,
  estimators), ``importance`` (ratios, ESS, truncation), ``vtrace``.
- Problems with exact answers, to test estimators on: ``bandits``, ``verifiable``.
- ``envs/``: environments as pure JAX functions behind one interface (lessons 04-06).
- Training loops: ``reinforce`` (lesson 01), ``staleness`` (02), ``lag`` (03), ``ppo_jax``
  and ``ppo_torch`` (04), sharing ``ppo_config``.
- ``runtime/``: the floor the systems stand on: child processes and their lifecycle,
  shared versioned weights.
- Systems, siblings on that floor: ``actor_learner/`` (03), ``lm/`` and ``pipeline/`` (07),
  ``weight_sync/`` (09).
- ``plots``: the lessons' shared figures.

What every lesson needs is importable from here: ``from course_lib import pick, progress``.
"""

from course_lib.course.display import describe, progress, show_source
from course_lib.course.grading import check, hint
from course_lib.course.scale import current_scale, pick

__version__ = "0.1.0"
__all__ = ["check", "current_scale", "describe", "hint", "pick", "progress", "show_source"]
