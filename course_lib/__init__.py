"""Efficient RL Systems: the tested library every lesson notebook imports.

Modules are named for the concept they hold (see ``catalog`` for the lesson map):
``scale`` (the run contract), ``paths``, ``pg`` (returns, estimators), ``plots``,
``bandits`` and ``verifiable`` (the estimator on tasks with exact gradients),
``reinforce`` (the classic CPU training loop), ``doctor``, ``lab``, ``notebooks``
(build, execute, sync check) and ``grading``.
"""

__version__ = "0.1.0"
