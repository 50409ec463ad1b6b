"""Single source: generating exercise/solution notebooks and the `course build --check` sync check."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib.course.notebooks import build
from course_lib.course.notebooks.execute import execute_notebook, write_notebook
from course_lib.course.notebooks.source import STUB_LINE, SourceError, Target, render, targets_for
from course_lib.course.paths import repo_root

LESSON = """# %% [markdown]
# # Tiny lesson

# %%
print(1 + 1)
"""

EXERCISE = '''# %%
def double(x):
    """Twice x."""
    ### BEGIN SOLUTION
    return 2 * x
    ### END SOLUTION

# %% tags=["raises-in-stub"]
double(3)

# %% [markdown] tags=["solution-only"]
# Only in the solution.
'''


@pytest.fixture
def course(tmp_path: Path) -> Path:
    (tmp_path / "lessons").mkdir()
    (tmp_path / "exercises" / "src").mkdir(parents=True)
    (tmp_path / "solutions").mkdir()
    (tmp_path / "lessons" / "00_welcome.py").write_text(LESSON)
    (tmp_path / "exercises" / "src" / "00_welcome.py").write_text(EXERCISE)
    return tmp_path


def _target(course: Path, kind: str) -> Target:
    return next(t for t in targets_for("00_welcome", course) if t.kind == kind)


def test_stub_and_solution_from_one_source(course):
    stub = render(_target(course, "exercise"))
    sol = render(_target(course, "solution"))
    assert STUB_LINE in stub.cells[0].source and "return 2 * x" not in stub.cells[0].source
    assert '"""Twice x."""' in stub.cells[0].source  # signature and docstring kept
    assert "return 2 * x" in sol.cells[0].source and "BEGIN SOLUTION" not in sol.cells[0].source
    assert stub.cells[1].metadata["tags"] == ["raises-exception"]
    assert sol.cells[1].metadata.get("tags", []) == []
    assert len(stub.cells) == 2 and len(sol.cells) == 3
    assert stub.metadata["course"] == {"lesson": "00_welcome", "kind": "exercise"}


def test_executed_stub_stores_not_implemented(course):
    nb = render(_target(course, "exercise"))
    execute_notebook(nb, course / "exercises")
    err = nb.cells[1].outputs[0]
    assert err.output_type == "error" and err.ename == "NotImplementedError"
    assert err.evalue == "not implemented yet"


@pytest.mark.parametrize(
    "text, match",
    [
        ("# %%\ndef f():\n    ### BEGIN SOLUTION\n    return 1\n", "never closed"),
        ("# %%\ndef f():\n    return 1\n    ### END SOLUTION\n", "without"),
        ("# %%\ndef f():\n    return 1\n", "at least one"),
    ],
)
def test_malformed_exercise_sources_are_named(course, text, match):
    (course / "exercises" / "src" / "00_welcome.py").write_text(text)
    with pytest.raises(SourceError, match=match):
        render(_target(course, "exercise"))


def test_check_names_each_problem_then_passes_after_build(course):
    problems = build.check(course)
    assert len(problems) == 3 and all("missing" in p for p in problems)

    build.build(["00_welcome"], course, execute=False)
    problems = build.check(course)
    assert len(problems) == 3 and all("not executed" in p for p in problems)

    build.build(["00_welcome"], course, execute=True)
    assert build.check(course) == []

    (course / "lessons" / "00_welcome.py").write_text(LESSON + "\n# %%\nprint(3)\n")
    (course / "solutions" / "99_stray.ipynb").write_text(nbformat.writes(nbformat.v4.new_notebook()))
    problems = build.check(course)
    assert any("lessons/00_welcome.ipynb: out of sync" in p and "2 cells vs 3" in p for p in problems)
    assert any("solutions/99_stray.ipynb: no text source" in p for p in problems)


def test_corrupt_committed_notebook_is_reported(course):
    build.build(["00_welcome"], course, execute=False)
    (course / "exercises" / "00_welcome.ipynb").write_text("{not json")
    assert any("not a readable notebook" in p for p in build.check(course))


def test_write_is_stable(course, tmp_path):
    nb = render(_target(course, "lesson"))
    a, b = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    write_notebook(nb, a)
    write_notebook(nbformat.read(a, as_version=4), b)
    assert a.read_text() == b.read_text()


def test_repository_notebooks_in_sync():
    """The committed notebooks match their sources and are executed (`course build --check`)."""
    assert build.check(repo_root()) == []


def test_cli_entry_points():
    for cmd in (["course", "--help"], [sys.executable, "-m", "course_lib", "--help"]):
        exe = Path(sys.executable).parent / "course" if cmd[0] == "course" else None
        done = subprocess.run([str(exe)] + cmd[1:] if exe else cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        for sub in ("doctor", "lab", "build", "run", "grade"):
            assert sub in done.stdout


def test_build_unknown_lesson_is_a_clear_error():
    done = subprocess.run(
        [sys.executable, "-m", "course_lib", "build", "42"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "no lesson named '42'" in done.stderr
