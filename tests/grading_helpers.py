"""Test bodies the lesson grader tests (``tests/test_grading_lessonNN.py``) share, written
once: the registry's shape, the brief's slips among the planted bugs, bad submissions and
infinite loops reported (never a crash or a hang), one planted bug per exercise caught end
to end through ``course grade``. Each lesson file keeps its own specifics (names, points,
its bad submissions, which bugs it plants) and calls these."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import Mutant, grade_with_planted_bugs

from course_lib.course.grading.checks import NOT_IMPLEMENTED, Exercise, ExerciseOutcome, run_exercise
from course_lib.course.grading.lessons import exercises_for, get_exercise

#: A lesson's bad submissions: exercise name -> (function, fragment its report must contain).
BadSubmissions = Mapping[str, Sequence[tuple[Callable[..., Any], str]]]


def assert_registry(
    lesson: str, names: Sequence[str], aliases: Iterable[str], points: int, min_checks: int = 3
) -> None:
    """The lesson's registry lists ``names`` in order, under each alias too, worth ``points``
    in all; each exercise has a title, three hints and at least ``min_checks`` checks."""
    exercises = exercises_for(lesson)
    assert tuple(e.name for e in exercises) == tuple(names)
    for alias in aliases:
        assert exercises_for(alias) == exercises, alias
    assert sum(e.points for e in exercises) == points
    for e in exercises:
        assert len(e.hints) == 3 and e.title and len(e.checks) >= min_checks, e.name


def assert_slips_planted(mutants: Sequence[Mutant], ids: set[str], names: Sequence[str] = ()) -> None:
    """The brief's slips ``ids`` are among the planted bugs; with ``names``, each of those
    exercises has at least three."""
    assert ids <= {m.id for m in mutants}, ids - {m.id for m in mutants}
    if names:
        counts = {n: sum(m.function == n for m in mutants) for n in names}
        assert all(c >= 3 for c in counts.values()), counts


def bad_submissions(bad: BadSubmissions) -> list[Any]:
    """``bad`` as pytest parameters ``(name, fn, fragment)``, with ids ``name-index``."""
    return [
        pytest.param(name, fn, fragment, id=f"{name}-{i}")
        for name, cases in bad.items()
        for i, (fn, fragment) in enumerate(cases)
    ]


def assert_bad_submission_reported(lesson: str, name: str, fn: Callable[..., Any], fragment: str) -> ExerciseOutcome:
    """A bad submission of ``name`` fails with a report that contains ``fragment`` (and is not
    mistaken for an untouched stub)."""
    fn.__name__ = name
    outcome = run_exercise(get_exercise(lesson, name), fn)
    assert not outcome.passed
    assert fragment in outcome.message, outcome.message
    assert NOT_IMPLEMENTED not in outcome.message
    return outcome


def assert_infinite_loop_times_out(
    exercise: Exercise, forever: Callable[..., Any], statuses: Sequence[str] | None = None
) -> ExerciseOutcome:
    """A submission that never returns is stopped at the check limit: its first check times
    out (with ``statuses``, the checks' statuses are exactly these)."""
    outcome = run_exercise(exercise, forever, time_limit_s=0.5)
    assert outcome.results[0].status == "timeout", outcome.results[0]
    if statuses is not None:
        assert [r.status for r in outcome.results] == list(statuses)
    return outcome


def assert_planted_bugs_caught_end_to_end(
    lesson: str, mutants: Sequence[Mutant], picked: Sequence[str], tmp_path: Path
) -> None:
    """``course grade`` on the solution notebook with each exercise's function cell replaced by
    the planted bug in ``picked`` (one per exercise, by name or by id): score 0, non-zero
    exit, and each exercise's message names its own bug."""
    chosen = {m.function: m for m in mutants if m.name in picked or m.id in picked}
    assert len(chosen) == len(exercises_for(lesson)) == len(picked), sorted(chosen)
    rc, report = grade_with_planted_bugs(lesson, chosen, tmp_path)
    assert rc != 0 and report["score"] == 0
    assert {ex["name"] for ex in report["exercises"]} == set(chosen)
    for ex in report["exercises"]:
        assert chosen[ex["name"]].expected in ex["message"], (ex["name"], ex["message"])
