"""The learner's "check yourself" cells: :func:`check` and :func:`hint`.

An exercise notebook imports ``from course_lib import check`` and, after each
exercise, runs ``check("00_welcome", "discounted_returns", discounted_returns)``. The
checks run in the notebook's own process, each under its time limit, and print a short
summary that is the same on every machine (nbval compares it verbatim)::

    discounted_returns: PASS (9/9 checks)
    discounted_returns: FAIL: not implemented yet
    hint: loop backwards over t, ...

Hints are tiered: the first failure of an exercise in a process prints its first hint,
each later failure of the same exercise the next one (``hint 2/3: ...``), up to the last;
a pass does not start them over. A stub ("not implemented yet") shows the current hint
without moving on. The hints also sit, collapsed, under each statement of the notebook.
"""

from __future__ import annotations

from typing import Any

from course_lib.course.catalog import get_lesson
from course_lib.course.grading.checks import Exercise, ExerciseOutcome, run_exercise
from course_lib.course.grading.lessons import get_exercise

#: How many graded failures (not stubs) each (lesson, exercise) has had in this process.
_failures: dict[tuple[str, str], int] = {}


def reset_hint_tiers() -> None:
    """Forget every failure seen so far: the next failure of each exercise shows hint 1."""
    _failures.clear()


def hint_line(exercise: Exercise, tier: int = 1) -> str:
    """The printed line of hint ``tier`` (1 = the first, shown as ``hint: ...``)."""
    if not exercise.hints:
        return ""
    tier = max(1, min(tier, len(exercise.hints)))
    if tier == 1:
        return f"hint: {exercise.hints[0]}"
    return f"hint {tier}/{len(exercise.hints)}: {exercise.hints[tier - 1]}"


def summary_lines(outcome: ExerciseOutcome, tier: int = 1) -> list[str]:
    """The lines :func:`check` prints for ``outcome``: a verdict, then hint ``tier`` if it failed."""
    ex = outcome.exercise
    if outcome.passed:
        return [f"{ex.name}: PASS ({outcome.n_passed}/{outcome.n_checks} checks)"]
    message = outcome.message
    if any(r.status == "not_implemented" for r in outcome.results):
        head = f"{ex.name}: FAIL: {message}"
    else:
        head = f"{ex.name}: FAIL ({outcome.n_passed}/{len(ex.checks)} checks): {message}"
    line = hint_line(ex, tier)
    return [head] + ([line] if line else [])


class CheckOutcome:
    """What :func:`check` returns: truthy iff every check passed.

    It displays nothing in a notebook (the printed lines already say it all), so a
    check cell shows no stray ``True``/``False``.
    """

    def __init__(self, passed: bool) -> None:
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __repr__(self) -> str:
        return f"CheckOutcome(passed={self.passed})"

    def _ipython_display_(self) -> None:
        """Show nothing: the summary was printed."""


def check(lesson_id: str, name: str, fn: Any) -> CheckOutcome:
    """Run exercise ``name`` of lesson ``lesson_id`` against ``fn`` and print a summary.

    Never raises: a wrong answer, an exception in ``fn``, an infinite loop (each check
    has a time limit) or an unknown exercise is reported in the printed lines. A failure
    prints the exercise's next hint: hint 1 the first time, then 2, ... up to the last.

    Args:
        lesson_id: the lesson, e.g. ``"00_welcome"``.
        name: the exercise (the function's name), e.g. ``"discounted_returns"``.
        fn: the learner's function.

    Returns:
        a :class:`CheckOutcome`, truthy if every check passed.
    """
    try:
        exercise = get_exercise(lesson_id, name)
    except KeyError as exc:
        print(f"check: {exc.args[0] if exc.args else exc}")
        return CheckOutcome(False)
    try:
        outcome = run_exercise(exercise, fn)
    except KeyboardInterrupt:
        print(f"{name}: interrupted")
        return CheckOutcome(False)
    except BaseException as exc:
        print(f"{name}: FAIL: the checks could not run: {type(exc).__name__}: {exc}")
        return CheckOutcome(False)
    key = (get_lesson(lesson_id).id, name)
    tier = _failures.get(key, 0) + 1
    if not outcome.passed and not any(r.status == "not_implemented" for r in outcome.results):
        _failures[key] = tier
    for line in summary_lines(outcome, tier):
        print(line)
    return CheckOutcome(outcome.passed)


def hint(lesson_id: str, name: str, level: int = 1) -> None:
    """Print hint number ``level`` (1 = gentlest) of exercise ``name``; the last if too high."""
    try:
        exercise = get_exercise(lesson_id, name)
    except KeyError as exc:
        print(f"hint: {exc.args[0] if exc.args else exc}")
        return
    if not exercise.hints:
        print(f"{name}: no hints")
        return
    level = max(1, min(level, len(exercise.hints)))
    print(f"{name} hint {level}/{len(exercise.hints)}: {exercise.hints[level - 1]}")
