"""What a lesson grader's tests assert about whole outcomes, written once: the reference
solution scores full marks on every check, and the untouched stub is reported "not implemented
yet" by its first check, the others skipped. ``tests/test_grading_lessonNN.py`` call it with
their lesson and exercise names (lessons 11 and 12 so far; lesson 10's variant also checks its
scratch folders)."""

from __future__ import annotations

from conftest import solution_function, stub_function

from course_lib.course.grading.checks import NOT_IMPLEMENTED, run_exercise
from course_lib.course.grading.lessons import get_exercise


def assert_solution_full_and_stub_not_implemented(lesson: str, name: str) -> None:
    """Exercise ``name`` of ``lesson``: the solution passes every check; the stub fails with
    exactly the "not implemented yet" message, every check after the first skipped."""
    exercise = get_exercise(lesson, name)
    outcome = run_exercise(exercise, solution_function(lesson, name))
    assert outcome.passed, outcome.message
    assert outcome.n_passed == len(exercise.checks)
    stub = run_exercise(exercise, stub_function(lesson, name))
    assert not stub.passed and stub.message == NOT_IMPLEMENTED
    assert [r.status for r in stub.results][1:] == ["skipped"] * (len(stub.results) - 1)
