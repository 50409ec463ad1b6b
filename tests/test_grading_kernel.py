"""``course grade`` end to end: learner notebooks run in a real kernel.

Every test grades through :func:`grade`, which also checks what must hold in every case:
the JSON, JUnit and Markdown reports are written and parse, the run stayed within its
time bound, and no kernel (or other child process) is left behind. Time limits are
small so the whole file runs in well under a minute or two on 2 cores.
"""

from __future__ import annotations

import json
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest
from conftest import exercise_function_source

from course_lib.course.grading import cli
from course_lib.course.grading.runner import GradeOptions, grade_notebook

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = sorted((ROOT / "tests" / "mutants").glob("discounted_returns_*.py"))
FIXTURES = ROOT / "tests" / "grading_fixtures"

# small limits keep the suite fast; each test also bounds its own wall time
FAST = ["--cell-timeout", "4", "--total-timeout", "30", "--check-timeout", "1"]

# the real solution and stub cells, from the single source the notebooks are generated from
SOLUTION = exercise_function_source("00_welcome", "discounted_returns", "solution")
STUB = exercise_function_source("00_welcome", "discounted_returns", "exercise")

CHECK_CELL = 'check("00_welcome", "discounted_returns", discounted_returns)'

# lesson 00's second exercise, solved (or the stub), as the last cell: these tests are about the first
SECOND = exercise_function_source("00_welcome", "finished_episode_returns", "solution")
SECOND_STUB = exercise_function_source("00_welcome", "finished_episode_returns", "exercise")


def make_notebook(
    path: Path,
    function_source: str,
    *,
    lesson: str | None = "00_welcome",
    kind: str = "exercise",
    before: tuple[str, ...] = (),
    after: tuple[str, ...] = (),
    call_cell: bool = True,
    second: str = SECOND,
) -> Path:
    """An exercise notebook laid out like the generated ones (metadata, tags, check cell)."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if lesson is not None:
        nb.metadata["course"] = {"lesson": lesson, "kind": kind}
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Lesson 00 exercises"),
        nbformat.v4.new_code_cell("import numpy as np\nfrom course_lib.course.grading import check"),
        *[nbformat.v4.new_code_cell(src) for src in before],
        nbformat.v4.new_code_cell(function_source),
        *[
            nbformat.v4.new_code_cell(
                "discounted_returns([1.0, 2.0, 3.0], [0, 0, 1], 0.9)", metadata={"tags": ["raises-exception"]}
            )
            for _ in range(call_cell)
        ],
        *[nbformat.v4.new_code_cell(src) for src in after],
        nbformat.v4.new_code_cell(CHECK_CELL, metadata={"tags": ["exercise-check"]}),
        nbformat.v4.new_code_cell(second),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@dataclass
class Graded:
    rc: int
    out: str
    doc: dict[str, Any]
    junit: ET.Element
    markdown: str
    seconds: float

    def notebook(self, i: int = 0) -> dict[str, Any]:
        return self.doc["notebooks"][i]

    def exercise(self, i: int = 0) -> dict[str, Any]:
        return self.doc["notebooks"][i]["exercises"][0]


def grade(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *paths: Path | str, args: list[str] = FAST, bound: float = 30.0
) -> Graded:
    """Run ``course grade`` on ``paths`` and check the invariants of every run."""
    reports = tmp_path / f"reports-{time.monotonic_ns()}"
    t0 = time.monotonic()
    rc = cli.main(
        [
            *map(str, paths),
            "--json",
            str(reports / "g.json"),
            "--junit",
            str(reports / "g.xml"),
            "--markdown",
            str(reports / "g.md"),
            *args,
        ]
    )
    seconds = time.monotonic() - t0
    out = capsys.readouterr().out
    assert seconds < bound, f"grading took {seconds:.1f} s"
    assert psutil.Process().children(recursive=True) == []
    doc = json.loads((reports / "g.json").read_text())
    junit = ET.parse(reports / "g.xml").getroot()
    markdown = (reports / "g.md").read_text()
    assert len(doc["notebooks"]) == len(paths) == len(junit.findall("testsuite"))
    for nb_doc, suite in zip(doc["notebooks"], junit.findall("testsuite"), strict=True):
        cases = suite.findall("testcase")
        if nb_doc["exercises"]:
            assert [c.get("name") for c in cases] == [e["name"] for e in nb_doc["exercises"]]
            for case, ex in zip(cases, nb_doc["exercises"], strict=True):
                assert (case.find("failure") is None) == ex["passed"]
        else:
            assert [c.get("name") for c in cases] == ["notebook"] and cases[0].find("failure") is not None
        assert f"`{nb_doc['path']}`" in markdown
    assert rc == (0 if doc["passed"] else 1)
    assert "Traceback" not in out
    return Graded(rc, out, doc, junit, markdown, seconds)


def test_solution_scores_full_marks(tmp_path, capsys):
    path = make_notebook(tmp_path / "solutions" / "00_welcome.ipynb", SOLUTION, kind="solution")
    g = grade(tmp_path, capsys, path)
    assert g.rc == 0
    nb = g.notebook()
    assert (nb["score"], nb["max_score"], nb["fraction"], nb["passed"]) == (20, 20, 1.0, True)
    ex = g.exercise()
    assert ex["passed"] and ex["message"] == "" and ex["checks_passed"] == len(ex["checks"]) >= 5
    rows = [line.split() for line in g.out.splitlines()]
    assert ["discounted_returns", "10/10", "PASS"] in rows and ["finished_episode_returns", "10/10", "PASS"] in rows
    assert "total: 20/20 points (100%), pass mark 70%: PASS" in g.out
    assert nb["notes"] == []  # the raises-exception cell ran fine and nothing else went wrong


def test_stub_scores_zero_with_not_implemented(tmp_path, capsys):
    path = make_notebook(tmp_path / "exercises" / "00_welcome.ipynb", STUB, second=SECOND_STUB)
    g = grade(tmp_path, capsys, path)
    assert g.rc == 1
    assert g.notebook()["score"] == 0
    assert "not implemented yet" in g.exercise()["message"]
    assert "not implemented yet" in g.junit.find("testsuite/testcase/failure").get("message")
    assert "hint: Equation 00.2 gives a step's return from the return of the step after it" in g.out  # hint 1
    assert g.notebook()["notes"] == []  # the stub call is tagged raises-exception: not a note


def test_planted_bugs_fail_through_the_grader(tmp_path, capsys):
    paths = []
    for mutant in MUTANTS:
        source = mutant.read_text()
        paths.append(make_notebook(tmp_path / f"00_{mutant.stem}.ipynb", source))
    g = grade(tmp_path, capsys, *paths, bound=60)
    assert g.rc == 1
    for mutant, nb in zip(MUTANTS, g.doc["notebooks"], strict=True):
        expected = next(line for line in mutant.read_text().splitlines() if line.startswith("EXPECTED = "))
        fragment = json.loads(expected.removeprefix("EXPECTED = "))
        ex = nb["exercises"][0]
        assert not ex["passed"] and ex["score"] == 0 and not nb["passed"]
        assert fragment in ex["message"], (mutant.name, ex["message"])


def test_several_paths_exit_nonzero_if_any_fails(tmp_path, capsys):
    good = make_notebook(tmp_path / "00_a.ipynb", SOLUTION)
    bad = make_notebook(tmp_path / "00_b.ipynb", STUB)
    g = grade(tmp_path, capsys, good, bad)
    assert g.rc == 1
    assert [nb["passed"] for nb in g.doc["notebooks"]] == [True, False]
    assert "1/2 notebooks reached the pass mark" in g.out
    # the pass mark decides: with 0 required, the stub passes too
    g = grade(tmp_path, capsys, good, bad, args=[*FAST, "--pass-mark", "0"])
    assert g.rc == 0


def test_exception_in_learner_code(tmp_path, capsys):
    source = "def discounted_returns(rewards, dones, gamma):\n    return rewards[len(rewards)] * gamma\n"
    g = grade(tmp_path, capsys, make_notebook(tmp_path / "00_welcome.ipynb", source))
    message = g.exercise()["message"]
    assert "raised IndexError: list index out of range in discounted_returns(" in message
    assert g.exercise()["score"] == 0


def test_infinite_loop_in_function_hits_the_check_limit(tmp_path, capsys):
    source = "def discounted_returns(rewards, dones, gamma):\n    while True:\n        pass\n"
    path = make_notebook(tmp_path / "00_welcome.ipynb", source)
    g = grade(
        tmp_path, capsys, path, args=["--cell-timeout", "2", "--total-timeout", "20", "--check-timeout", "1"], bound=20
    )
    ex = g.exercise()
    assert ex["message"].endswith("did not finish within 1 s (an infinite loop?)")
    assert [c["status"] for c in ex["checks"]][:2] == ["timeout", "skipped"]


def test_infinite_loop_that_swallows_timeouts_hits_the_cell_limit(tmp_path, capsys):
    source = (
        "import time\n"
        "def discounted_returns(rewards, dones, gamma):\n"
        "    while True:\n"
        "        try:\n"
        "            time.sleep(0.01)\n"
        "        except BaseException:\n"
        "            pass\n"
    )
    path = make_notebook(tmp_path / "00_welcome.ipynb", source, call_cell=False)
    # 5 s of cell time leaves room for the grading cell's imports on a loaded machine
    g = grade(tmp_path, capsys, path, args=["--cell-timeout", "5", "--total-timeout", "30", "--check-timeout", "1"])
    message = g.exercise()["message"]
    # The check's 1 s timeout is an exception raised inside the loop: the loop swallows it when it lands inside the
    # try, and then the cell limit stops it; when it lands between two iterations (outside the try) it ends the
    # check. Both are a clear message and no points; which one happens is a race.
    assert "ran past the 5 s cell time limit during check" in message or "did not finish within 1 s" in message, message
    assert g.exercise()["score"] == 0


def test_infinite_loop_at_top_level_is_interrupted_and_grading_goes_on(tmp_path, capsys):
    path = make_notebook(tmp_path / "00_welcome.ipynb", SOLUTION, after=("while True:\n    pass",))
    g = grade(tmp_path, capsys, path, args=["--cell-timeout", "2", "--total-timeout", "20", "--check-timeout", "1"])
    nb = g.notebook()
    assert nb["passed"] and nb["score"] == 20
    assert any("(`while True:`) ran past the 2 s cell time limit and was interrupted" in n for n in nb["notes"])


def test_top_level_loop_ignoring_interrupts_is_left_out_of_a_fresh_kernel(tmp_path, capsys):
    stubborn = "while True:\n    try:\n        time.sleep(0.01)\n    except BaseException:\n        pass"
    path = make_notebook(tmp_path / "00_welcome.ipynb", SOLUTION, before=("import time",), after=(stubborn,))
    g = grade(tmp_path, capsys, path, args=["--cell-timeout", "2", "--total-timeout", "20", "--check-timeout", "1"])
    nb = g.notebook()
    assert nb["score"] == 20
    (stuck,) = [n for n in nb["notes"] if "ignored the interrupt" in n]
    assert stuck.startswith("cell 6 (`while True:`) ran past the 2 s cell time limit and ignored the interrupt")
    assert "the notebook was re-run in a fresh kernel without cell 6" in nb["notes"]


def test_total_timeout_stops_the_notebook(tmp_path, capsys):
    slow = tuple("time.sleep(1.5)" for _ in range(6))
    path = make_notebook(tmp_path / "00_welcome.ipynb", SOLUTION, before=("import time",), after=slow)
    g = grade(
        tmp_path, capsys, path, args=["--cell-timeout", "3", "--total-timeout", "6", "--check-timeout", "1"], bound=20
    )
    nb = g.notebook()
    assert any("were not run: the notebook ran past the 6 s total time limit" in n for n in nb["notes"])
    assert nb["score"] == 10  # the first function was defined before the deadline and is still graded


def test_wrong_shape_dtype_and_nan(tmp_path, capsys):
    sources = {
        "shape": "def discounted_returns(rewards, dones, gamma):\n    return np.zeros((len(rewards), 1))\n",
        "dtype": "def discounted_returns(rewards, dones, gamma):\n    return np.zeros(len(rewards), dtype=int)\n",
        "nan": "def discounted_returns(rewards, dones, gamma):\n    return np.full(len(rewards), np.nan)\n",
    }
    paths = [make_notebook(tmp_path / f"00_{k}.ipynb", v) for k, v in sources.items()]
    g = grade(tmp_path, capsys, *paths)
    shape, dtype, nan = (nb["exercises"][0]["message"] for nb in g.doc["notebooks"])
    assert "has shape (4, 1); expected shape (4,)" in shape
    assert "has dtype int64; expected a float array" in dtype
    assert "contains nan at index 0; expected" in nan


def test_syntax_error_names_the_defining_cell(tmp_path, capsys):
    source = "def discounted_returns(rewards, dones, gamma):\n    return [1,\n"
    g = grade(tmp_path, capsys, make_notebook(tmp_path / "00_welcome.ipynb", source))
    message = g.exercise()["message"]
    assert message.startswith("`discounted_returns` is not defined: the cell defining it raised SyntaxError: ")
    assert "(line 2)" in message and ".py" not in message
    assert any("raised SyntaxError" in n for n in g.notebook()["notes"])


def test_missing_function(tmp_path, capsys):
    source = SOLUTION.replace("def discounted_returns(", "def discounted_return(")
    g = grade(tmp_path, capsys, make_notebook(tmp_path / "00_welcome.ipynb", source))
    assert g.exercise()["message"] == (
        "`discounted_returns` is not defined: no cell defines it (keep the function name `discounted_returns` from the exercise)"
    )


def test_not_a_function(tmp_path, capsys):
    g = grade(tmp_path, capsys, make_notebook(tmp_path / "00_welcome.ipynb", "discounted_returns = 42"))
    assert g.exercise()["message"] == "`discounted_returns` is an int, not a function"


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "no such file"),
        ('{"cells": [{"cell_type": "code", "sour', "is not valid JSON"),
        ("def discounted_returns(): pass\n", "is not valid JSON"),
        ('{"hello": "world"}', "is JSON but not a Jupyter notebook"),
    ],
    ids=["missing", "corrupt", "not-json", "not-notebook"],
)
def test_unreadable_files_still_get_a_full_report(tmp_path, capsys, content, fragment):
    path = tmp_path / "00_welcome.ipynb"
    if content is not None:
        path.write_text(content)
    g = grade(tmp_path, capsys, path, bound=10)
    nb = g.notebook()
    assert fragment in nb["error"]
    assert nb["lesson"] == "00_welcome"  # from the file name: the report still lists the exercise
    assert nb["exercises"][0]["score"] == 0 and fragment in nb["exercises"][0]["message"]
    assert g.rc == 1


def test_unknown_lesson_without_metadata(tmp_path, capsys):
    path = tmp_path / "mine.ipynb"
    path.write_text("{")
    g = grade(tmp_path, capsys, path, bound=10)
    assert "is not valid JSON" in g.notebook()["error"]
    assert g.junit.find("testsuite/testcase").get("name") == "notebook"


def test_notebook_of_another_lesson(tmp_path, capsys):
    path = make_notebook(tmp_path / "mine.ipynb", SOLUTION, lesson="01_policy_gradients")
    g = grade(tmp_path, capsys, path, args=[*FAST, "--lesson", "00_welcome"], bound=10)
    message = g.exercise()["message"]
    assert "this notebook is lesson 01_policy_gradients's, not 00_welcome's" in message
    assert g.notebook()["score"] == 0 and g.rc == 1


def test_a_lesson_without_graded_exercises_is_said_clearly(tmp_path, monkeypatch):
    """Every lesson of the course has graded exercises now: a made-up checks module with none."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    path = make_notebook(tmp_path / "other.ipynb", SOLUTION, lesson="01_policy_gradients")
    options = GradeOptions(lesson="01_policy_gradients", total_timeout=30, checks_module="grading_no_exercises")
    report = grade_notebook(path, options)
    assert report.error == "lesson 01_policy_gradients has no graded exercises; there is nothing to grade"
    assert report.exercises == []


def test_lesson_from_file_name_and_override(tmp_path, capsys):
    path = make_notebook(tmp_path / "00-my-try.ipynb", SOLUTION, lesson=None)
    g = grade(tmp_path, capsys, path)
    assert g.notebook()["lesson"] == "00_welcome" and g.rc == 0
    other = make_notebook(tmp_path / "attempt.ipynb", SOLUTION, lesson=None)
    g = grade(tmp_path, capsys, other, args=[*FAST, "--lesson", "0"])
    assert g.notebook()["lesson"] == "00_welcome" and g.rc == 0


def test_huge_printed_output(tmp_path, capsys):
    spam = 'print("x" * 30_000_000)\nfor i in range(100_000):\n    print(i)'
    loud = SOLUTION.replace("    return out", "    print('y' * 5_000_000)\n    return out")
    path = make_notebook(tmp_path / "00_welcome.ipynb", loud, after=(spam,))
    rss_before = psutil.Process().memory_info().rss
    g = grade(tmp_path, capsys, path)
    assert g.notebook()["passed"]
    assert len(g.out) < 5_000
    assert psutil.Process().memory_info().rss - rss_before < 200 * 2**20


def test_kernel_dies_while_checking(tmp_path, capsys):
    source = "import os\ndef discounted_returns(rewards, dones, gamma):\n    os._exit(3)\n"
    g = grade(tmp_path, capsys, make_notebook(tmp_path / "00_welcome.ipynb", source))
    message = g.exercise()["message"]
    assert message.startswith("the kernel died while checking it during check 'returns a finite float numpy array")
    assert "os._exit()" in message
    # the notebook's own call of the function (cell 4) killed the first kernel already
    notes = g.notebook()["notes"]
    assert any(n.startswith("cell 4 (`discounted_returns([1.0, 2.0, 3.0], [...`) killed the kernel") for n in notes)
    assert "the notebook was re-run in a fresh kernel without cell 4" in notes


def test_kernel_dies_at_top_level_and_the_rest_is_still_graded(tmp_path, capsys):
    path = make_notebook(tmp_path / "00_welcome.ipynb", SOLUTION, after=("import os\nos._exit(1)",))
    g = grade(tmp_path, capsys, path)
    assert g.notebook()["score"] == 20
    assert any(n.startswith("cell 5 (`import os`) killed the kernel") for n in g.notebook()["notes"])


def test_function_defined_in_a_cell_that_kills_the_kernel(tmp_path, capsys):
    source = SOLUTION + "\nimport os\nos._exit(1)\n"
    g = grade(tmp_path, capsys, make_notebook(tmp_path / "00_welcome.ipynb", source))
    message = g.exercise()["message"]
    assert message.startswith("`discounted_returns` is not defined: the cell defining it killed the kernel")


def test_learner_subprocesses_do_not_outlive_grading(tmp_path, capsys):
    spawn = "import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
    path = make_notebook(tmp_path / "00_welcome.ipynb", SOLUTION, after=(spawn,))
    before = {p.pid for p in psutil.process_iter()}
    g = grade(tmp_path, capsys, path)
    assert g.rc == 0
    time.sleep(0.2)
    leftovers = [
        p
        for p in psutil.process_iter(["pid", "cmdline"])
        if p.pid not in before and "time.sleep(600)" in " ".join(p.info["cmdline"] or [])
    ]
    assert leftovers == []


# ---------------------------------------------------------------------------------------
# Several exercises in one notebook (a made-up lesson from tests/grading_fixtures)
# ---------------------------------------------------------------------------------------


@pytest.fixture
def fake_lesson(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))  # the kernel inherits it
    return GradeOptions(
        lesson="00_welcome", cell_timeout=4, total_timeout=30, check_timeout=1, checks_module="grading_fake_lesson"
    )


def two_exercise_notebook(path: Path, square: str, double: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(square), nbformat.v4.new_code_cell(double)]
    nbformat.write(nb, path)
    return path


def test_several_exercises_partial_score(tmp_path, fake_lesson):
    path = two_exercise_notebook(
        tmp_path / "n.ipynb", "def square(x):\n    return x * x", "def double(x):\n    return x + 1"
    )
    report = grade_notebook(path, fake_lesson)
    assert [(e.name, e.score, e.passed) for e in report.exercises] == [("square", 5, True), ("double", 0, False)]
    assert report.exercises[1].message == "double(4) is 8: double(4) returned 5; expected 8"
    assert report.exercises[1].hint == "add x to itself"
    assert (report.score, report.passed) == (5, False)
    assert psutil.Process().children(recursive=True) == []


def test_kernel_death_in_one_exercise_does_not_sink_the_others(tmp_path, fake_lesson):
    path = two_exercise_notebook(
        tmp_path / "n.ipynb", "import os\ndef square(x):\n    os._exit(1)", "def double(x):\n    return 2 * x"
    )
    report = grade_notebook(path, fake_lesson)
    square, double = report.exercises
    assert square.message.startswith("the kernel died while checking it") and square.score == 0
    assert double.passed and double.score == 5
    assert any("re-run in a fresh kernel" in n for n in report.notes)
    assert psutil.Process().children(recursive=True) == []


def test_a_kernel_that_cannot_start_is_reported(tmp_path):
    path = make_notebook(tmp_path / "00_welcome.ipynb", SOLUTION)
    report = grade_notebook(path, GradeOptions(kernel_name="no-such-kernel", total_timeout=10))
    assert report.error is not None and report.error.startswith(
        "could not run the notebook in the no-such-kernel kernel: "
    )
    assert report.exercises[0].message.startswith("not graded: could not run the notebook")
    assert not report.passed
    assert psutil.Process().children(recursive=True) == []
