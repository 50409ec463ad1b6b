"""`course grade` (the console script) on the committed notebooks of every lesson with
exercises: solutions score 100% with no notes and exit 0; untouched exercises score 0, say
"not implemented yet" for each exercise and exit non-zero; both print their total."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from course_lib.course.catalog import available_lessons
from course_lib.course.grading.checks import NOT_IMPLEMENTED
from course_lib.course.paths import repo_root

ROOT = repo_root()
COURSE = Path(sys.executable).parent / "course"
GRADED = [lesson.id for lesson in available_lessons(ROOT) if lesson.exercise_source(ROOT).exists()]


def grade(path: Path, tmp_path: Path) -> tuple[int, dict, str]:
    report = tmp_path / "report.json"
    junit = tmp_path / "report.xml"
    done = subprocess.run(
        [str(COURSE), "grade", str(path), "--json", str(report), "--junit", str(junit)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert junit.exists() and junit.read_text().startswith("<?xml")
    return done.returncode, json.loads(report.read_text()), done.stdout


def test_some_lesson_is_graded():
    assert "00_welcome" in GRADED


@pytest.mark.parametrize("lesson_id", GRADED)
def test_solutions_score_full_marks(lesson_id, tmp_path):
    rc, report, out = grade(ROOT / "solutions" / f"{lesson_id}.ipynb", tmp_path)
    (nb,) = report["notebooks"]
    assert rc == 0, out
    assert nb["score"] == nb["max_score"] > 0, out
    assert nb["passed"] and all(ex["passed"] for ex in nb["exercises"]) and nb["notes"] == [], out
    assert f"total: {nb['max_score']:g}/{nb['max_score']:g} points (100%)" in out, out


@pytest.mark.parametrize("lesson_id", GRADED)
def test_untouched_exercises_score_zero(lesson_id, tmp_path):
    rc, report, out = grade(ROOT / "exercises" / f"{lesson_id}.ipynb", tmp_path)
    (nb,) = report["notebooks"]
    assert rc != 0
    assert nb["score"] == 0 and not nb["passed"] and nb["exercises"], out
    for ex in nb["exercises"]:
        assert ex["message"] == NOT_IMPLEMENTED, (ex["name"], ex["message"])
    assert f"total: 0/{nb['max_score']:g} points (0%)" in out, out
