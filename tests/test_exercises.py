"""What every lesson's graded exercises must satisfy, written once for all lessons.

For each lesson with an exercise source (`exercises/src/NN_slug.py`): the registry lists
exactly the functions the source defines, in order; the source states difficulty, time,
points, how it is graded and tiered hints for each; the real solution passes every check;
the stub fails with "not implemented yet"; every planted bug in
`tests/mutants/lNN_slug.py` is caught with its expected message. Lesson-specific tests
(oracles against the library, end-to-end grading of mutants) live in
`tests/test_grading_lessonNN.py`.
"""

from __future__ import annotations

import importlib
import re

import pytest
from conftest import Mutant, mutant_function, solution_function, stub_function

from course_lib.course.catalog import available_lessons, get_lesson
from course_lib.course.grading.checks import NOT_IMPLEMENTED, run_exercise
from course_lib.course.grading.lessons import exercises_for, get_exercise
from course_lib.course.notebooks.source import render, targets_for
from course_lib.course.paths import repo_root

ROOT = repo_root()
LESSONS = [lesson.id for lesson in available_lessons(ROOT) if lesson.exercise_source(ROOT).exists()]
EXERCISES = [(lid, ex.name) for lid in LESSONS for ex in exercises_for(lid)]


def planted(lesson_id: str) -> list[Mutant]:
    """The lesson's planted bugs (one-place edits of the real solution), if it keeps them as a list."""
    if not (ROOT / "tests" / "mutants" / f"l{lesson_id}.py").exists():
        return []
    return list(importlib.import_module(f"mutants.l{lesson_id}").MUTANTS)


MUTANTS = [(lid, m) for lid in LESSONS for m in planted(lid)]


def _solution_notebook(lesson_id: str):
    return render(next(t for t in targets_for(lesson_id, ROOT) if t.kind == "solution"))


@pytest.mark.parametrize("lesson_id", LESSONS)
def test_registry_matches_the_functions_the_source_defines(lesson_id):
    nb = _solution_notebook(lesson_id)
    defined = [
        re.match(r"def (\w+)\(", c.source).group(1) for c in nb.cells if "exercise" in c.metadata.get("tags", [])
    ]
    exercises = exercises_for(lesson_id)
    assert [e.name for e in exercises] == defined
    assert exercises_for(str(get_lesson(lesson_id).number)) == exercises
    for e in exercises:
        assert e.points > 0 and e.title and len(e.hints) >= 2, e.name
        descriptions = [c.description for c in e.checks]
        assert len(descriptions) >= 3 and len(set(descriptions)) == len(descriptions), e.name


@pytest.mark.parametrize("lesson_id", LESSONS)
def test_source_states_difficulty_time_points_grading_and_hints(lesson_id):
    nb = _solution_notebook(lesson_id)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    exercises = exercises_for(lesson_id)
    for i, ex in enumerate(exercises, 1):
        header = re.search(rf"## Exercise {i} · .*\((★[★☆]{{2}}), (\d+) min, (\d+) points\)", markdown)
        assert header, f"{lesson_id}: exercise {i} needs a header '## Exercise {i} · title (★☆☆, N min, P points)'"
        assert int(header.group(3)) == ex.points, f"{lesson_id}: exercise {i} points differ from the registry"
        row = rf"\| {i}\. `{ex.name}`[^|]*\| {ex.points} \| {header.group(1)} \| {header.group(2)} min \|"
        assert re.search(row, markdown), (
            f"{lesson_id}: the overview table needs a row for exercise {i} matching the header"
        )
    assert markdown.count("**How it is graded:**") == len(exercises)
    assert markdown.count("<summary>Hint 2</summary>") == len(exercises)
    checks = [c.source for c in nb.cells if "exercise-check" in c.metadata.get("tags", [])]
    assert checks == [f'check("{lesson_id}", "{e.name}", {e.name})' for e in exercises]


@pytest.mark.parametrize(("lesson_id", "name"), EXERCISES)
def test_solution_passes_every_check(lesson_id, name):
    exercise = get_exercise(lesson_id, name)
    outcome = run_exercise(exercise, solution_function(lesson_id, name))
    assert outcome.passed, outcome.message
    assert outcome.n_passed == len(exercise.checks)


@pytest.mark.parametrize(("lesson_id", "name"), EXERCISES)
def test_stub_is_not_implemented(lesson_id, name):
    outcome = run_exercise(get_exercise(lesson_id, name), stub_function(lesson_id, name))
    assert not outcome.passed and outcome.message == NOT_IMPLEMENTED
    assert [r.status for r in outcome.results][1:] == ["skipped"] * (len(outcome.results) - 1)


@pytest.mark.parametrize(("lesson_id", "mutant"), MUTANTS, ids=[f"{lid}-{m.id}" for lid, m in MUTANTS])
def test_every_planted_bug_is_caught_with_its_message(lesson_id, mutant):
    outcome = run_exercise(get_exercise(lesson_id, mutant.function), mutant_function(lesson_id, mutant))
    assert not outcome.passed
    assert mutant.expected in outcome.message, outcome.message
    assert NOT_IMPLEMENTED not in outcome.message


@pytest.mark.parametrize("lesson_id", [lid for lid in LESSONS if planted(lid)])
def test_enough_planted_bugs_per_exercise(lesson_id):
    mutants = planted(lesson_id)
    names = [e.name for e in exercises_for(lesson_id)]
    counts = {n: sum(m.function == n for m in mutants) for n in names}
    assert all(c >= 3 for c in counts.values()), counts
    assert {m.function for m in mutants} <= set(names)
    assert len({m.id for m in mutants}) == len(mutants)
