"""Efficient RL Systems: the tested library every lesson notebook imports.

Modules are named for the concept they hold (see ``catalog`` for the lesson map):
``scale`` (the run contract), ``paths``, ``pg`` (returns, estimators), ``plots``,
``doctor``, ``notebooks`` (build, execute, sync check) and ``grading``.
"""

__version__ = "0.1.0"
