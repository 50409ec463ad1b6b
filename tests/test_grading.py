"""The grader's pieces, in-process and fast: oracle, assertion helpers, checks, self-check,
registry, lesson detection, reports. End-to-end grading in a kernel is in
``test_grading_kernel.py``.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import json
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import ModuleType

import nbformat
import numpy as np
import pytest
from conftest import solution_function, stub_function

from course_lib.course.catalog import LESSONS
from course_lib.course.grading import check, hint, selfcheck
from course_lib.course.grading.checks import (
    NOT_IMPLEMENTED,
    CheckFailure,
    CheckTimeout,
    assert_allclose,
    assert_array,
    assert_finite,
    call,
    check_case,
    run_check,
    run_exercise,
    short_repr,
    time_limit,
)
from course_lib.course.grading.lessons import exercises_for, get_exercise
from course_lib.course.grading.lessons.l00_welcome import (
    DISCOUNTED_RETURNS,
    FINISHED_EPISODE_RETURNS,
    episode_end,
    naive_discounted_returns,
    naive_finished_episode_returns,
)
from course_lib.course.grading.report import (
    ExerciseResult,
    NotebookReport,
    render_table,
    to_json,
    to_junit,
    to_markdown,
)
from course_lib.course.grading.runner import (
    GradeOptions,
    NotebookProblem,
    clean_evalue,
    grade_notebook,
    lesson_from_filename,
    load_notebook,
    resolve_lesson,
)

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = sorted((ROOT / "tests" / "mutants").glob("discounted_returns_*.py"))


def load_mutant(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"mutant_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


correct = solution_function("00_welcome", "discounted_returns")  # the real solution, from its source
stub = stub_function("00_welcome", "discounted_returns")  # what the exercise notebook ships


# ---------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------


def test_oracle_hand_computed_values():
    np.testing.assert_allclose(naive_discounted_returns([1.0, 0.0, 2.0], [0, 0, 0], 0.5), [1.5, 1.0, 2.0])
    np.testing.assert_allclose(naive_discounted_returns([1, 1, 1, 1], [0, 1, 0, 0], 0.9), [1.9, 1.0, 1.9, 1.0])
    np.testing.assert_allclose(naive_discounted_returns([1, 2, 3], [0, 0, 1], 1.0), [6.0, 5.0, 3.0])
    assert naive_discounted_returns([], [], 0.9).shape == (0,)
    assert naive_discounted_returns([1, 2], [0, 0], 0.9).dtype == np.float64


def test_finished_episode_oracle_agrees_with_the_library():
    from course_lib.rl.pg import finished_episode_returns

    np.testing.assert_allclose(naive_finished_episode_returns([1, 2, 3, 4, 5, 6], [0, 1, 0, 0, 1, 0]), [3.0, 12.0])
    assert naive_finished_episode_returns([1.0, 2.0], [0, 0]).shape == (0,)
    assert naive_finished_episode_returns([], []).dtype == np.float64
    rng = np.random.default_rng(0)
    for length in (1, 7, 50):
        rewards, dones = rng.normal(size=length), (rng.random(length) < 0.3).astype(float)
        np.testing.assert_allclose(
            naive_finished_episode_returns(rewards, dones), finished_episode_returns(rewards, dones), rtol=1e-12
        )
    refused = run_exercise(FINISHED_EPISODE_RETURNS, finished_episode_returns)  # right values, not the learner's code
    assert not refused.passed and "course_lib.rl.pg.finished_episode_returns, the library's own" in refused.message


def test_oracle_episode_end():
    dones = [0, 1, 0, 0, 1, 0]
    assert [episode_end(dones, t) for t in range(6)] == [1, 1, 4, 4, 4, 5]


def test_oracle_agrees_with_the_reference_implementation():
    # the checks never call course_lib.rl.pg; here the two independent implementations vouch for each other
    from course_lib.rl.pg import discounted_returns

    rng = np.random.default_rng(0)
    for _ in range(20):
        T = int(rng.integers(0, 30))
        r, d = rng.normal(size=T), (rng.random(T) < 0.3).astype(float)
        gamma = float(rng.choice([0.0, 0.5, 0.99, 1.0]))
        np.testing.assert_allclose(naive_discounted_returns(r, d, gamma), discounted_returns(r, d, gamma))


# What a check may import from the course besides the grading package: the models and
# parameter containers it drives the learner's code with (the network whose weights an
# exercise swaps, whose full forward pass is the naive oracle of a KV-cache decode; the
# CartPole constants, whose oracle is gymnasium itself; the error classes and header tag an
# exercise must use). Never a module that implements a graded function.
CHECK_FIXTURES = (
    "course_lib.lm.model",
    "course_lib.actor_learner.model",
    "course_lib.runtime.weights.flat_parameters",  # how a check hands weights to the learner's swap code
    # and how lesson 07's teacher-forced replay loads them into its own copy of the model (the
    # exercise allows the learner the same call: loading is not what it grades)
    "course_lib.runtime.weights.load_flat_parameters",
    "course_lib.envs.cartpole.EnvParams",
    "course_lib.weight_sync.integrity.MAGIC",
    "course_lib.weight_sync.integrity.CorruptBucketError",
    "course_lib.weight_sync.integrity.OutOfOrderBucketError",
    # an oracle, not an implementation: V-trace as the paper's explicit O(T^2) double sum, kept
    # in the library so lesson 03 can show and use it too (it shares no code with vtrace())
    "course_lib.rl.vtrace.vtrace_naive",
    # the safety rules every multi-device program obeys (lesson 05): refuse a LAPACK call on
    # several CPU devices before it can deadlock, end a hang with a clear message; they
    # implement no graded function
    "course_lib.scaling.devices.check_multidevice_safe",
    "course_lib.scaling.devices.MultiDeviceHazard",
    "course_lib.runtime.watchdog.watchdog",
    # lesson 05's remat exercise: the deep MLP's parameters and data, and XLA's memory
    # analysis of a compiled program; remat.py has no segment checkpointing (the graded
    # function), and the oracle is the grader's own plain scan of the layers
    "course_lib.scaling.remat.mlp_problem",
    "course_lib.scaling.remat.peak_memory",
    # lesson 08's inputs: frozen data containers and the published model / GPU numbers the
    # learner's functions read (the graded formulas live in functions of course_lib.layout.model,
    # which a check never imports)
    "course_lib.layout.model.ModelShape",
    "course_lib.layout.model.GPU",
    "course_lib.layout.model.SystemSpec",
    "course_lib.layout.model.QWEN25_7B",
    "course_lib.layout.model.QWEN25_32B",
    "course_lib.layout.model.H100_SXM",
)


def _allowed(name: str) -> bool:
    return (
        not name.startswith("course_lib.")
        or name.startswith("course_lib.course.grading")
        or any(name == f or name.startswith(f + ".") for f in CHECK_FIXTURES)
    )


def test_checks_modules_never_import_the_reference():
    paths = sorted((ROOT / "course_lib" / "course" / "grading" / "lessons").glob("l*.py"))
    assert len(paths) >= 7, paths  # the folder moved once and this check silently read nothing
    for path in paths:
        references = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                references |= {a.name for a in node.names if not _allowed(a.name)}
            elif isinstance(node, ast.ImportFrom) and node.module:
                references |= {f"{node.module}.{a.name}" for a in node.names if not _allowed(f"{node.module}.{a.name}")}
        assert not references, (path, references)


# ---------------------------------------------------------------------------------------
# Assertion helpers
# ---------------------------------------------------------------------------------------


def failure(fn, *args, **kwargs) -> str:
    with pytest.raises(CheckFailure) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_assert_allclose_messages():
    assert "is a list of length 2; expected a numpy array of shape (3,)" in failure(
        assert_allclose, [1.0, 2.0], np.zeros(3), what="x"
    )
    assert "is a list of length 3; expected a numpy array of shape (3,) (return np.asarray" in failure(
        assert_allclose, [1.0, 2.0, 3.0], np.zeros(3), what="x"
    )
    assert failure(assert_allclose, None, np.zeros(3), what="x") == "x is None; did you forget to `return` it?"
    assert (
        failure(assert_allclose, np.zeros((3, 1)), np.zeros(3), what="x") == "x has shape (3, 1); expected shape (3,)"
    )
    assert "x has dtype int64; expected a float array" in failure(
        assert_allclose, np.zeros(3, dtype=np.int64), np.zeros(3), what="x"
    )
    assert (
        failure(assert_allclose, np.array([1.0, np.nan, 3.0]), np.array([1.0, 2.0, 3.0]), what="x")
        == "x contains nan at index 1; expected 2.0"
    )
    assert "x contains inf at index 2" in failure(assert_allclose, np.array([1.0, 2.0, np.inf]), np.ones(3), what="x")
    assert (
        failure(assert_allclose, np.array([1.0, 2.0, 3.5, 0.0]), np.array([1.0, 2.0, 3.0, 4.0]), what="x")
        == "x is wrong at index 2: got 3.5, expected 3.0 (2 of 4 values differ)"
    )
    assert "x is wrong at index [1, 0]" in failure(
        assert_allclose, np.array([[1.0], [5.0]]), np.array([[1.0], [2.0]]), what="x"
    )
    assert (
        failure(assert_allclose, np.array(["a", None], dtype=object), np.zeros(2), what="x")
        == "x has dtype object; expected numbers"
    )
    assert_allclose(np.array([1.0, 2.0 + 1e-9]), [1.0, 2.0])  # within tolerance: no failure
    assert_allclose(np.array([1, 2]), np.array([1, 2]))  # integer expected: integer allowed


def test_assert_helpers_misc():
    assert "contains nan at index 0" in failure(assert_finite, np.array([np.nan]))
    assert "is a dict; expected a numpy array" in failure(assert_array, {}, what="r")
    arr = np.arange(3.0)
    assert assert_array(arr, shape=(3,)) is arr
    assert short_repr(np.arange(10.0)) == "array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, ...], shape=(10,))"
    assert short_repr([1, 2.5, None]) == "[1, 2.5, None]"
    assert short_repr(object()) == "<object>"  # never a memory address


# ---------------------------------------------------------------------------------------
# Running checks
# ---------------------------------------------------------------------------------------


def test_run_check_classifies_outcomes():
    ok = check_case("ok")(lambda fn: None)
    assert run_check(ok, correct).status == "pass"

    wrong = check_case("wrong")(lambda fn: assert_allclose(call(fn, [1.0], [0], 0.5), [2.0], what="f"))
    result = run_check(wrong, correct)
    assert (result.status, result.message) == (
        "fail",
        "f is wrong at index 0: got 1.0, expected 2.0 (1 of 1 values differ)",
    )

    def raises(rewards, dones, gamma):
        raise ValueError("bad gamma")

    result = run_check(wrong, raises)
    assert result.status == "error"
    assert result.message == "raised ValueError: bad gamma in raises([1.0], [0], 0.5)"

    assert run_check(wrong, stub).status == "not_implemented"

    def exits(*args):
        sys.exit(3)

    result = run_check(wrong, exits)
    assert (result.status, result.message) == ("error", "raised SystemExit: 3")


def test_time_limit_stops_an_infinite_loop_and_restores_the_handler():
    previous = signal.getsignal(signal.SIGALRM)

    def spin(*args):
        while True:
            try:  # noqa: SIM105
                pass
            except Exception:  # a learner's catch-all must not swallow the timeout
                pass

    loop = check_case("loops", time_limit=0.3)(lambda fn: fn())
    t0 = time.monotonic()
    result = run_check(loop, spin)
    assert time.monotonic() - t0 < 2.0
    assert result.status == "timeout"
    assert result.message == "did not finish within 0.3 s (an infinite loop?)"
    assert signal.getsignal(signal.SIGALRM) is previous
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    with pytest.raises(CheckTimeout), time_limit(0.05):
        time.sleep(1)


def test_run_exercise_skips_after_a_timeout_and_reports_progress():
    seen = []

    def slow(rewards, dones, gamma):
        time.sleep(5)

    outcome = run_exercise(DISCOUNTED_RETURNS, slow, time_limit_s=0.2, on_result=seen.append)
    assert [r.status for r in outcome.results] == ["timeout"] + ["skipped"] * (len(DISCOUNTED_RETURNS.checks) - 1)
    assert seen == list(outcome.results)
    assert outcome.message.endswith("did not finish within 0.2 s (an infinite loop?)")


def test_correct_answer_passes_every_check_and_stub_is_not_implemented():
    outcome = run_exercise(DISCOUNTED_RETURNS, correct)
    assert outcome.passed, outcome.message
    assert outcome.n_passed == len(DISCOUNTED_RETURNS.checks) >= 5
    stubbed = run_exercise(DISCOUNTED_RETURNS, stub)
    assert not stubbed.passed
    assert stubbed.message == NOT_IMPLEMENTED
    # the library's implementation gets every value right, and is refused: the checks grade the learner's code
    from course_lib.rl.pg import discounted_returns

    refused = run_exercise(DISCOUNTED_RETURNS, discounted_returns)
    assert not refused.passed and "course_lib.rl.pg.discounted_returns, the library's own" in refused.message

    def quadratic(rewards, dones, gamma, bootstrap=0.0):  # eq. 00.1 summed per step: right, but O(T^2)
        r, d = np.asarray(rewards, dtype=np.float64), np.asarray(dones, dtype=bool)
        out = np.zeros(len(r))
        for t in range(len(r)):
            for k in range(t, len(r)):
                out[t] += gamma ** (k - t) * r[k]
                if d[k]:
                    break
            else:
                out[t] += gamma ** (len(r) - t) * bootstrap
        return out

    slow = run_exercise(DISCOUNTED_RETURNS, quadratic, time_limit_s=2.0)
    assert [r.passed for r in slow.results[:-3]] == [True] * (len(slow.results) - 3)
    assert not slow.passed and "did not finish within 2 s" in slow.message


def test_list_inputs_and_array_inputs_are_both_used():
    calls = []

    def spy(rewards, dones, gamma, bootstrap=0.0):
        calls.append((type(rewards), type(dones)))
        return correct(rewards, dones, gamma, bootstrap)

    assert run_exercise(DISCOUNTED_RETURNS, spy).passed
    assert (list, list) in calls and (np.ndarray, np.ndarray) in calls


@pytest.mark.parametrize("path", MUTANTS, ids=lambda p: p.stem.removeprefix("discounted_returns_"))
def test_every_planted_bug_is_caught_with_a_meaningful_message(path):
    mutant = load_mutant(path)
    outcome = run_exercise(DISCOUNTED_RETURNS, mutant.discounted_returns)
    assert not outcome.passed
    assert mutant.EXPECTED in outcome.message, outcome.message
    assert NOT_IMPLEMENTED not in outcome.message


def test_there_are_enough_planted_bugs():
    assert len(MUTANTS) >= 4


# ---------------------------------------------------------------------------------------
# check() in a notebook
# ---------------------------------------------------------------------------------------


def test_check_prints_deterministic_lines(capsys):
    assert bool(check("00_welcome", "discounted_returns", correct)) is True
    n = len(DISCOUNTED_RETURNS.checks)
    assert capsys.readouterr().out == f"discounted_returns: PASS ({n}/{n} checks)\n"

    assert bool(check("00_welcome", "discounted_returns", stub)) is False
    assert capsys.readouterr().out == (
        f"discounted_returns: FAIL: not implemented yet\nhint: {DISCOUNTED_RETURNS.hints[0]}\n"
    )

    mutant = load_mutant(ROOT / "tests" / "mutants" / "discounted_returns_ignores_dones.py")
    outputs = []
    hints = DISCOUNTED_RETURNS.hints
    for _ in range(len(hints) + 1):  # same verdict every time; the next hint on each repeat
        assert bool(check("00_welcome", "discounted_returns", mutant.discounted_returns)) is False
        outputs.append(capsys.readouterr().out.splitlines())
    assert len({tuple(o[:-1]) for o in outputs}) == 1
    head = outputs[0][0]
    assert head.startswith(f"discounted_returns: FAIL (6/{n} checks): hand-computed values")
    assert "got 3.439, expected 1.9" in head
    # the stub above did not count: the first graded failure shows hint 1, then 2, ...
    expected = [f"hint: {hints[0]}"] + [f"hint {k}/{len(hints)}: {hints[k - 1]}" for k in range(2, len(hints) + 1)]
    assert [o[-1] for o in outputs] == expected + expected[-1:]  # the last hint repeats
    assert "0x" not in "".join(outputs[0])
    # a pass does not start them over; another exercise keeps its own count
    assert bool(check("00_welcome", "discounted_returns", correct)) is True
    assert bool(check("00_welcome", "finished_episode_returns", lambda r, d: [])) is False
    assert capsys.readouterr().out.splitlines()[-1] == f"hint: {FINISHED_EPISODE_RETURNS.hints[0]}"
    assert bool(check("0", "discounted_returns", mutant.discounted_returns)) is False
    assert capsys.readouterr().out.splitlines()[-1] == expected[-1]
    selfcheck.reset_hint_tiers()
    assert bool(check("00_welcome", "discounted_returns", mutant.discounted_returns)) is False
    assert capsys.readouterr().out.splitlines()[-1] == expected[0]


def test_check_never_raises(capsys, monkeypatch):
    monkeypatch.setattr(selfcheck, "run_exercise", functools.partial(run_exercise, time_limit_s=0.2))

    def loops(*args):
        while True:
            pass

    def interrupt(*args):
        raise KeyboardInterrupt

    assert bool(check("00_welcome", "discounted_returns", loops)) is False
    assert "FAIL (0/" in capsys.readouterr().out
    assert bool(check("00_welcome", "discounted_returns", interrupt)) is False
    assert capsys.readouterr().out == "discounted_returns: interrupted\n"
    assert bool(check("00_welcome", "discounted_returns", None)) is False
    assert "`discounted_returns` is None, not a function" in capsys.readouterr().out
    assert bool(check("00_welcome", "nope", correct)) is False
    assert capsys.readouterr().out == (
        "check: lesson 00_welcome has no exercise named 'nope' "
        "(its exercises: discounted_returns, finished_episode_returns)\n"
    )
    assert bool(check("99_nothing", "x", correct)) is False
    assert capsys.readouterr().out.startswith("check: no lesson named '99_nothing'")


def test_hint_tiers(capsys):
    hint("00_welcome", "discounted_returns", 2)
    n = len(DISCOUNTED_RETURNS.hints)
    assert capsys.readouterr().out == f"discounted_returns hint 2/{n}: {DISCOUNTED_RETURNS.hints[1]}\n"
    hint("00_welcome", "discounted_returns", 99)
    assert capsys.readouterr().out.startswith(f"discounted_returns hint {n}/{n}: ")


# ---------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------


def test_registry():
    exercise, second = exercises_for("00_welcome")
    assert (exercise, second) == (DISCOUNTED_RETURNS, FINISHED_EPISODE_RETURNS)
    assert exercises_for("0") == exercises_for("welcome") == (exercise, second)
    ungraded = [lesson.id for lesson in LESSONS if not exercises_for(lesson.id)]
    assert ungraded == [], f"every lesson of the catalog has graded exercises; these have none: {ungraded}"
    assert exercise.points > 0 and len(exercise.hints) >= 2 and exercise.hint == exercise.hints[0]
    descriptions = [c.description for c in exercise.checks]
    assert len(set(descriptions)) == len(descriptions)
    assert get_exercise("00_welcome", "discounted_returns") is exercise
    with pytest.raises(KeyError, match="has no exercise named 'x'"):
        get_exercise("00_welcome", "x")


def test_grading_cli_import_is_light():
    code = (
        "import sys, course_lib.course.grading.cli, course_lib.course.grading; "
        "heavy = [m for m in ('numpy', 'nbclient', 'nbformat', 'jupyter_client') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------
# Reading notebooks and telling their lesson (no kernel)
# ---------------------------------------------------------------------------------------


def write_nb(path: Path, lesson: str | None = "00_welcome") -> Path:
    nb = nbformat.v4.new_notebook()
    if lesson:
        nb.metadata["course"] = {"lesson": lesson, "kind": "exercise"}
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nbformat.write(nb, path)
    return path


def test_lesson_from_filename():
    assert lesson_from_filename(Path("exercises/00_welcome.ipynb")) == "00_welcome"
    assert lesson_from_filename(Path("00-my-attempt.ipynb")) == "00_welcome"
    assert lesson_from_filename(Path("3_mine.ipynb")) == "03_impala_vtrace"
    assert lesson_from_filename(Path("mine.ipynb")) is None
    assert lesson_from_filename(Path("42_mine.ipynb")) is None


def test_resolve_lesson(tmp_path):
    meta01 = load_notebook(write_nb(tmp_path / "a.ipynb", "01_policy_gradients"))
    plain = load_notebook(write_nb(tmp_path / "b.ipynb", None))
    assert resolve_lesson(Path("00_welcome.ipynb"), meta01, None) == ("01_policy_gradients", None)  # metadata wins
    assert resolve_lesson(Path("00_welcome.ipynb"), plain, None) == ("00_welcome", None)
    lesson, problem = resolve_lesson(Path("x.ipynb"), meta01, "0")
    assert lesson == "00_welcome"
    assert problem is not None and problem.startswith("this notebook is lesson 01_policy_gradients's, not 00_welcome's")
    assert resolve_lesson(Path("x.ipynb"), plain, "welcome") == ("00_welcome", None)
    lesson, problem = resolve_lesson(Path("x.ipynb"), plain, None)
    assert lesson is None and "pass --lesson" in (problem or "")
    lesson, problem = resolve_lesson(Path("x.ipynb"), plain, "nope")
    assert lesson is None and "no lesson named 'nope'" in (problem or "")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ('{"cells": [', "is not valid JSON (Expecting value at line 1, column 12): the file is corrupt or truncated"),
        ("print('hello')\n", "is not valid JSON"),
        ('{"a": 1}', "is JSON but not a Jupyter notebook"),
        ('{"cells": 5, "nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "is not a valid notebook"),
        (b"\xff\xfe\x00binary", "is not UTF-8 text"),
    ],
    ids=["missing", "truncated", "python", "json", "invalid", "binary"],
)
def test_load_notebook_problems_are_one_line(tmp_path, content, expected):
    path = tmp_path / "00_welcome.ipynb"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(NotebookProblem) as info:
        load_notebook(path)
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_load_notebook_folder(tmp_path):
    with pytest.raises(NotebookProblem, match="is a folder, not a notebook"):
        load_notebook(tmp_path)


def test_problem_notebooks_still_report_every_exercise_with_zero(tmp_path):
    path = tmp_path / "00_welcome.ipynb"
    path.write_text('{"cells": [')
    report = grade_notebook(path, GradeOptions())
    assert report.lesson == "00_welcome"
    assert [e.name for e in report.exercises] == ["discounted_returns", "finished_episode_returns"]
    assert report.score == 0 and not report.passed
    assert report.exercises[0].message.startswith("not graded: ")
    assert "corrupt or truncated" in report.exercises[0].message


def test_clean_evalue():
    assert clean_evalue("invalid syntax (1063758517.py, line 2)") == "invalid syntax (line 2)"
    assert clean_evalue("a\n  b") == "a b"


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------


def sample_reports() -> list[NotebookReport]:
    good = NotebookReport(
        "a.ipynb", "00_welcome", exercises=[ExerciseResult("f", 10, 10, True, checks=[{"status": "pass"}])]
    )
    bad = NotebookReport(
        "b.ipynb",
        "00_welcome",
        exercises=[
            ExerciseResult("f", 6, 0, False, message="wrong <at> index 0 | \x1b[31m", hint="try harder"),
            ExerciseResult("g", 4, 4, True),
        ],
        notes=["cell 2 raised ValueError: x"],
    )
    empty = NotebookReport("c.ipynb", None, error="c.ipynb: no such file")
    return [good, bad, empty]


def test_report_scores():
    good, bad, empty = sample_reports()
    assert (good.score, good.max_score, good.passed) == (10, 10, True)
    assert (bad.score, bad.max_score, round(bad.fraction, 2), bad.passed) == (4, 10, 0.4, False)
    assert (empty.max_score, empty.passed) == (0, False)
    bad.pass_mark = 0.4
    assert bad.passed


def test_json_junit_markdown_render(tmp_path):
    reports = sample_reports()
    doc = json.loads(to_json(reports))
    assert doc["passed"] is False
    assert [n["score"] for n in doc["notebooks"]] == [10, 4, 0]
    assert doc["notebooks"][1]["exercises"][0]["hint"] == "try harder"

    root = ET.fromstring(to_junit(reports).encode())
    suites = root.findall("testsuite")
    assert len(suites) == 3
    assert [c.get("name") for c in suites[1].findall("testcase")] == ["f", "g"]
    assert suites[1].get("failures") == "1"
    assert suites[1].find("testcase/failure").get("message") == "wrong <at> index 0 | ?[31m"
    assert [c.get("name") for c in suites[2].findall("testcase")] == ["notebook"]  # nothing graded: still red
    assert root.get("tests") == "4" and root.get("failures") == "2"

    md = to_markdown(reports)
    assert "| `f` | 0/6 | fail | wrong <at> index 0 \\| ?[31m | try harder |" in md
    assert "**4/10 points (40%): FAIL**" in md

    table = render_table(reports[1])
    assert "note: cell 2 raised ValueError: x" in table
    assert "total: 4/10 points (40%), pass mark 70%: FAIL" in table
