"""Exercise grading: in-notebook self-checks and the ``course grade`` command.

* :func:`check` (``from course_lib import check``, re-exported from here): a notebook's "check
  yourself" cell; runs one exercise's checks in-process and prints a short,
  deterministic summary.
* :func:`hint`: print a tiered hint.
* ``course grade PATH...`` (:mod:`course_lib.course.grading.cli`): runs a learner's notebook in
  a separate kernel, checks every exercise there, and writes table/JSON/JUnit/Markdown
  reports (:mod:`.runner`, :mod:`.report`).
* Lessons' exercises: :mod:`course_lib.course.grading.lessons` (one ``lNN_slug`` module each),
  written with :mod:`course_lib.course.grading.checks` (the framework and basic assertions)
  and :mod:`course_lib.course.grading.helpers` (the scaffolding every lesson shares).

This package imports nothing heavy at import time: numpy and nbclient load when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from course_lib.course.grading.selfcheck import CheckOutcome

__all__ = ["check", "hint"]


def check(lesson_id: str, name: str, fn: Any) -> CheckOutcome:
    """Run exercise ``name`` of ``lesson_id`` against ``fn``; print PASS/FAIL; never raise.

    See :func:`course_lib.course.grading.selfcheck.check`.
    """
    from course_lib.course.grading.selfcheck import check as _check

    return _check(lesson_id, name, fn)


def hint(lesson_id: str, name: str, level: int = 1) -> None:
    """Print hint ``level`` of exercise ``name``; see :func:`course_lib.course.grading.selfcheck.hint`."""
    from course_lib.course.grading.selfcheck import hint as _hint

    _hint(lesson_id, name, level)
