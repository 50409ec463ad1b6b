"""``course grade-class DIR``: a whole class graded in one command, each participant apart.

One run over a class built in tmp_path from lesson 00's notebooks (the quickest lesson to
grade) holds a good submission (the solution notebook), a stub (the exercise notebook), a
crash, a submission that tampers with the others' files, one that kills its grading
process, an endless loop, a truncated notebook, a notebook of an unknown lesson and an
empty folder; the tests read that run's tables, CSV and JSON. The rest are the usage
errors and the pieces, without kernels.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
import psutil
import pytest

from course_lib.course import cli as course_cli
from course_lib.course.grading import classroom
from course_lib.course.grading.report import ExerciseResult, NotebookReport
from course_lib.course.grading.runner import GRADING_GRACE_S, WATCHDOG_SLACK_S

ROOT = Path(__file__).resolve().parents[1]
SOLUTION = ROOT / "solutions" / "00_welcome.ipynb"
STUB = ROOT / "exercises" / "00_welcome.ipynb"
EXERCISES = ("discounted_returns", "finished_episode_returns")
POINTS = 20.0  # lesson 00: 10 + 10

#: The participant limit of the class run: far above a good submission's few seconds, and
#: what stops the endless loop (the cell limit is higher, so the runner does not).
PARTICIPANT_TIMEOUT = 20.0
LIMITS = ["--cell-timeout", "60", "--total-timeout", "120", "--check-timeout", "5"]
LIMITS += ["--participant-timeout", f"{PARTICIPANT_TIMEOUT:g}"]

#: The other participants, whose files the tampering submission goes after.
VICTIMS = ("alice", "bob", "carol", "zoe")

# Mallory's first cell: overwrite and delete the other participants' notebooks wherever it
# can guess them to be (next to its own folder, up the tree, in any folder the environment
# names), write into `../alice/`, then delete every notebook and text file it finds one
# level up. It only touches paths under a folder named like a victim (or `zoe.ipynb`), so
# it harms nothing outside the class even if the isolation failed.
TAMPER = f"""
import os, pathlib
victims = {VICTIMS!r}
here = pathlib.Path.cwd()
bases = {{here.parent, here.parent.parent}}
for value in os.environ.values():
    for part in value.split(os.pathsep):
        if os.path.isabs(part) and os.path.isdir(part):
            bases.add(pathlib.Path(part))
hits = []
for base in bases:
    for name in victims:
        folder, single = base / name, base / (name + ".ipynb")
        try:
            if folder.is_dir():
                for nb in list(folder.rglob("*.ipynb")):
                    nb.write_text("pwned")
                    hits.append(str(nb))
                    nb.unlink()
                (folder / "pwned.txt").write_text("pwned")
            if single.is_file():
                single.write_text("pwned")
                hits.append(str(single))
        except OSError:
            pass
os.makedirs("../alice", exist_ok=True)
pathlib.Path("../alice/pwned.txt").write_text("pwned")
for p in list(pathlib.Path("..").rglob("*")):
    if p.is_file() and p.suffix in (".ipynb", ".txt"):
        p.unlink()
print(len(hits), "files tampered with")
"""
# Mallory's second cell: a process in a session of its own (out of reach of the kernel's
# process group) that keeps overwriting every private copy of the grader it can find, so it
# would spoil the participants graded after it if it outlived its turn; it gives up after 60 s.
SPOIL = """
import glob, os, time
base = os.path.dirname(os.path.dirname(os.environ["TMPDIR"]))
end = time.time() + 60
while time.time() < end:
    for path in glob.glob(os.path.join(base, "course-grade-class-*", "work", "**", "*.ipynb"), recursive=True):
        try:
            open(path, "w").write("spoiled")
        except OSError:
            pass
    time.sleep(0.05)
"""
LINGER = (
    "import subprocess, sys\n"
    f"subprocess.Popen([sys.executable, '-c', {SPOIL!r}], start_new_session=True,\n"
    "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
)
KILL_PARENT = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)"
FOREVER = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
RAISES = 'raise RuntimeError("boom in the setup cell")'
SYNTAX_ERROR = "def discounted_returns(rewards, dones, gamma)\n    return rewards"


def notebook_bytes(
    source: Path,
    *,
    first: tuple[str, ...] = (),
    replace: dict[str, str] | None = None,
    lesson: str | None = None,
) -> bytes:
    """``source`` with code cells ``first`` put before its first code cell, the code cell
    defining each key of ``replace`` replaced by its value, and its metadata lesson set."""
    nb = nbformat.read(source, as_version=4)
    for name, new in (replace or {}).items():
        (cell,) = [c for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source]
        cell.source = new
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells[at:at] = [nbformat.v4.new_code_cell(src) for src in first]
    if lesson is not None:
        nb.metadata["course"]["lesson"] = lesson
    return nbformat.writes(nb).encode()


def build_class(root: Path) -> Path:
    """The class folder: one entry per participant (see the module docstring)."""
    files = {
        "alice/00_welcome.ipynb": SOLUTION.read_bytes(),
        "alice/.ipynb_checkpoints/00_welcome-checkpoint.ipynb": b"not graded: a checkpoint",
        "bob/00_welcome.ipynb": STUB.read_bytes(),
        "carol/week1/00_welcome.ipynb": notebook_bytes(
            SOLUTION, first=(RAISES,), replace={"discounted_returns": SYNTAX_ERROR}
        ),
        "eve/00_welcome.ipynb": notebook_bytes(SOLUTION, first=(KILL_PARENT,)),
        "frank/00_welcome.ipynb": notebook_bytes(SOLUTION, first=(FOREVER,)),
        "gina/00_welcome.ipynb": SOLUTION.read_bytes()[:2000],  # truncated mid-file
        "hank.ipynb": notebook_bytes(SOLUTION, lesson="99_no_such_lesson"),
        "mallory/00_welcome.ipynb": notebook_bytes(SOLUTION, first=(TAMPER, LINGER)),
        "zoe.ipynb": SOLUTION.read_bytes(),
        "README.md": b"submissions of the workshop\n",
    }
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (root / "dave").mkdir()
    return root


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file's bytes and every folder (None) under ``root``."""
    return {p.relative_to(root).as_posix(): (None if p.is_dir() else p.read_bytes()) for p in sorted(root.rglob("*"))}


@dataclass
class ClassRun:
    rc: int
    out: str
    err: str
    seconds: float
    doc: dict[str, Any]
    rows: list[dict[str, str]]
    before: dict[str, bytes | None]
    after: dict[str, bytes | None]
    leftovers: list[str]

    def participant(self, name: str) -> dict[str, Any]:
        (found,) = [p for p in self.doc["participants"] if p["name"] == name]
        return found

    def notebook(self, name: str) -> dict[str, Any]:
        (nb,) = self.participant(name)["notebooks"]
        return nb

    def table_row(self, name: str) -> str:
        (line,) = [ln for ln in self.out.splitlines() if ln.startswith(f"  {name} ")]
        return line


@pytest.fixture(scope="module")
def class_run(tmp_path_factory: pytest.TempPathFactory) -> ClassRun:
    """``course grade-class`` over the class, from inside the class folder and with the
    folder named in the environment too (where a submission could look for it)."""
    base = tmp_path_factory.mktemp("grade-class")
    root = build_class(base / "class")
    exports = base / "exports"
    before = tree(root)
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("PWD", str(root))
        mp.setenv("CLASS_SUBMISSIONS", str(root))
        t0 = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = classroom.main(
                [".", "--csv", str(exports / "class.csv"), "--json", str(exports / "class.json"), *LIMITS]
            )
        seconds = time.monotonic() - t0
    leftovers = [
        f"{p.pid} {p.name()}" for p in psutil.Process().children(recursive=True) if p.pid not in children_before
    ]
    with open(exports / "class.csv", newline="", encoding="utf-8") as stream:
        rows = list(csv.DictReader(stream))
    doc = json.loads((exports / "class.json").read_text())
    return ClassRun(rc, out.getvalue(), err.getvalue(), seconds, doc, rows, before, tree(root), leftovers)


# ---------------------------------------------------------------------------------------
# The class run
# ---------------------------------------------------------------------------------------


def test_run_is_bounded_leaves_nothing_running_and_fails_the_class(class_run: ClassRun) -> None:
    assert class_run.rc == 1
    assert class_run.leftovers == []
    # ten participants of a few seconds each, plus the endless loop stopped at its limit
    assert class_run.seconds < 100, class_run.seconds
    names = ["alice", "bob", "carol", "dave", "eve", "frank", "gina", "hank", "mallory", "zoe"]
    assert [p["name"] for p in class_run.doc["participants"]] == names
    assert class_run.doc["ignored"] == ["README.md"]
    for number, name in enumerate(names, 1):
        assert f"[{number}/10] {name} ..." in class_run.out
    assert "3/10 participants reached the pass mark" in class_run.out
    assert not class_run.doc["passed"]


def test_good_submissions_pass_with_full_points(class_run: ClassRun) -> None:
    for name, path in (("alice", "alice/00_welcome.ipynb"), ("zoe", "zoe.ipynb")):
        p = class_run.participant(name)
        assert p["passed"] and p["outcome"] == "graded" and p["problems"] == []
        (nb,) = p["notebooks"]  # alice's checkpoint copy is not graded
        assert nb["path"] == path and nb["lesson"] == "00_welcome"
        assert nb["score"] == nb["max_score"] == POINTS and nb["error"] is None and nb["notes"] == []
        assert all(e["passed"] for e in nb["exercises"])
        assert "PASS" in class_run.table_row(name) and "20/20" in class_run.table_row(name)


def test_the_stub_and_the_crash_fail_with_their_reasons(class_run: ClassRun) -> None:
    bob = class_run.notebook("bob")
    assert bob["score"] == 0 and not bob["passed"]
    assert [e["message"] for e in bob["exercises"]] == ["not implemented yet"] * 2
    assert "discounted_returns, finished_episode_returns: not implemented yet" in class_run.table_row("bob")

    carol = class_run.notebook("carol")
    assert carol["path"] == "carol/week1/00_welcome.ipynb"  # found one folder down
    assert carol["score"] == 10 and not carol["passed"]  # the second exercise is still right
    (broken, fine) = carol["exercises"]
    assert "`discounted_returns` is not defined" in broken["message"] and "SyntaxError" in broken["message"]
    assert fine["passed"]
    assert any("RuntimeError: boom in the setup cell" in n for n in carol["notes"])
    assert "SyntaxError" in class_run.table_row("carol") and "FAIL" in class_run.table_row("carol")


def test_process_killers_and_endless_loops_are_stopped_on_their_own_lines(class_run: ClassRun) -> None:
    eve = class_run.participant("eve")
    assert eve["outcome"] == "crashed" and not eve["passed"]
    assert "killed by SIGKILL" in eve["notebooks"][0]["error"]
    assert "while grading this notebook" in eve["notebooks"][0]["error"]
    assert "crashed" in class_run.table_row("eve")

    frank = class_run.participant("frank")
    assert frank["outcome"] == "timed out" and not frank["passed"]
    assert f"past the {PARTICIPANT_TIMEOUT:g} s participant time limit" in frank["notebooks"][0]["error"]
    assert PARTICIPANT_TIMEOUT <= frank["seconds"] < PARTICIPANT_TIMEOUT + 15
    assert "[6/10] frank ... FAIL (TIMED OUT)" in class_run.out
    # both still list every exercise of their lesson, at 0 points
    for name in ("eve", "frank"):
        nb = class_run.notebook(name)
        assert nb["lesson"] == "00_welcome" and nb["max_score"] == POINTS and nb["score"] == 0


def test_unreadable_unknown_and_empty_submissions_are_reported(class_run: ClassRun) -> None:
    gina = class_run.notebook("gina")
    assert "is not valid JSON" in gina["error"] and "truncated" in gina["error"]
    assert gina["path"] == "gina/00_welcome.ipynb" and gina["lesson"] == "00_welcome"  # from its file name
    assert "course-grade-class-" not in gina["error"]  # the private copy's path is not shown
    assert gina["error"].startswith("gina/00_welcome.ipynb is not valid JSON")

    hank = class_run.notebook("hank")
    assert hank["lesson"] is None and hank["exercises"] == []
    assert "'99_no_such_lesson', which is not a lesson of this course" in hank["error"]

    dave = class_run.participant("dave")
    assert dave["notebooks"] == [] and not dave["passed"]
    assert dave["problems"] == ["no notebooks in dave/ (it is empty)"]
    assert "no notebooks in dave/" in class_run.table_row("dave")


def test_tampering_reaches_neither_the_others_nor_the_submissions_folder(class_run: ClassRun) -> None:
    # the submissions folder is byte for byte what it was, nothing added or removed
    assert class_run.after == class_run.before
    # the participants graded before and after the tampering one keep full marks
    assert class_run.participant("alice")["score"] == class_run.participant("zoe")["score"] == POINTS
    # and the tampering one is graded on its own line like anyone else; the process it left
    # behind was stopped before the next participant's turn
    mallory = class_run.participant("mallory")
    assert mallory["passed"] and mallory["notebooks"][0]["path"] == "mallory/00_welcome.ipynb"
    assert mallory["problems"] == ["1 process it started was still running after grading and was killed"]
    assert "PASS" in class_run.table_row("mallory") and "was killed" in class_run.table_row("mallory")


@pytest.mark.parametrize("where", ["environment", "next-door"])
def test_the_tampering_cell_does_damage_without_isolation(where: str, tmp_path: Path) -> None:
    """The attack is real: run where a naive grader would let it (with the class folder in
    its environment, or in the participant's own folder of the class), it overwrites and
    deletes the other participants' notebooks."""
    root = build_class(tmp_path / "class")
    env = {**os.environ, "CLASS_SUBMISSIONS": str(root)} if where == "environment" else dict(os.environ)
    cwd = root / "mallory" if where == "next-door" else (tmp_path / "elsewhere" / "mallory")
    cwd.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-c", TAMPER], cwd=cwd, env=env, check=True, capture_output=True)
    assert not (root / "alice" / "00_welcome.ipynb").exists()
    assert not (root / "carol" / "week1" / "00_welcome.ipynb").exists()
    zoe = root / "zoe.ipynb"
    assert not zoe.exists() or zoe.read_bytes() != SOLUTION.read_bytes()


def test_csv_has_a_row_per_participant_notebook_and_exercise(class_run: ClassRun) -> None:
    assert list(class_run.rows[0]) == list(classroom.CSV_COLUMNS)
    keys = [(r["participant"], r["notebook"], r["lesson"], r["exercise"]) for r in class_run.rows]
    graded = {
        "alice": "alice/00_welcome.ipynb",
        "bob": "bob/00_welcome.ipynb",
        "carol": "carol/week1/00_welcome.ipynb",
        "eve": "eve/00_welcome.ipynb",
        "frank": "frank/00_welcome.ipynb",
        "gina": "gina/00_welcome.ipynb",
        "mallory": "mallory/00_welcome.ipynb",
        "zoe": "zoe.ipynb",
    }
    expected = [(name, path, "00_welcome", ex) for name, path in graded.items() for ex in EXERCISES]
    expected += [("dave", "", "", ""), ("hank", "hank.ipynb", "", "")]
    assert sorted(keys) == sorted(expected)
    by_key = {(r["participant"], r["exercise"]): r for r in class_run.rows}
    assert by_key["alice", "discounted_returns"] == {
        "participant": "alice",
        "notebook": "alice/00_welcome.ipynb",
        "lesson": "00_welcome",
        "exercise": "discounted_returns",
        "points": "10",
        "max_points": "10",
        "passed": "True",
        "message": "",
    }
    assert by_key["bob", "finished_episode_returns"]["message"] == "not implemented yet"
    assert by_key["bob", "finished_episode_returns"]["passed"] == "False"
    assert "killed by SIGKILL" in by_key["eve", "discounted_returns"]["message"]
    assert "participant time limit" in by_key["frank", "discounted_returns"]["message"]
    assert "not valid JSON" in by_key["gina", "discounted_returns"]["message"]
    assert "not a lesson of this course" in by_key["hank", ""]["message"]
    assert by_key["dave", ""]["message"] == "no notebooks in dave/ (it is empty)"


def test_exercise_table_counts_participants_and_the_common_failure(class_run: ClassRun) -> None:
    stats = {s["exercise"]: s for s in class_run.doc["exercises"]}
    assert list(stats) == list(EXERCISES)
    # eight participants handed in lesson 00; alice, mallory and zoe solved both, carol the second
    first, second = stats["discounted_returns"], stats["finished_episode_returns"]
    assert (first["participants"], first["passed"], second["passed"]) == (8, 3, 4)
    assert first["mean_points"] == pytest.approx(10 * 3 / 8) and second["mean_points"] == pytest.approx(10 * 4 / 8)
    assert (first["common_failure"], first["common_failure_count"]) == ("not implemented yet", 1)
    assert "00_welcome  discounted_returns        3/8     3.8/10" in class_run.out


def test_lesson_override_reaches_the_grader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "class"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / "00_welcome.ipynb").write_bytes(SOLUTION.read_bytes())
    rc = classroom.main([str(root), "--lesson", "01", "--json", str(tmp_path / "out.json")])
    assert rc == 1
    (nb,) = json.loads((tmp_path / "out.json").read_text())["participants"][0]["notebooks"]
    assert nb["lesson"] == "01_policy_gradients" and nb["score"] == 0
    assert "this notebook is lesson 00_welcome's, not 01_policy_gradients's" in nb["error"]
    assert "[1/1] alice ..." in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# Usage errors: one line on stderr, exit status 2, nothing graded or written
# ---------------------------------------------------------------------------------------


def _one_submission(tmp: Path) -> None:
    (tmp / "class" / "alice").mkdir(parents=True)
    (tmp / "class" / "alice" / "00_welcome.ipynb").write_bytes(b"{}")


def _only_readme(tmp: Path) -> None:
    (tmp / "class").mkdir()
    (tmp / "class" / "README.md").write_text("x")


def _and_a_file(tmp: Path) -> None:
    _one_submission(tmp)
    (tmp / "file").write_text("x")


USAGE_ERRORS = {
    "missing": (None, ["{root}"], "class: no such folder"),
    "file": (lambda t: (t / "class").write_text("x"), ["{root}"], "is a file, not a folder"),
    "empty": (lambda t: (t / "class").mkdir(), ["{root}"], "holds no submissions: expected one subfolder or .ipynb"),
    "no-submissions": (_only_readme, ["{root}"], "holds no submissions: expected one subfolder or .ipynb"),
    "csv-under-a-file": (_and_a_file, ["{root}", "--csv", "{tmp}/file/out.csv"], "file is a file, not a folder"),
    "csv-inside": (_one_submission, ["{root}", "--csv", "{root}/grades.csv"], "inside the submissions folder"),
    "json-folder": (_one_submission, ["{root}", "--json", "{tmp}"], "it is a folder"),
    "same-file": (_one_submission, ["{root}", "--csv", "{tmp}/a", "--json", "{tmp}/a"], "name the same file"),
    "lesson": (_one_submission, ["{root}", "--lesson", "99"], "--lesson:"),
}


@pytest.mark.parametrize(("setup", "args", "fragment"), list(USAGE_ERRORS.values()), ids=list(USAGE_ERRORS))
def test_usage_errors(
    setup: Any, args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if setup is not None:
        setup(tmp_path)
    before = tree(tmp_path)
    argv = [a.format(root=tmp_path / "class", tmp=tmp_path) for a in args]
    assert classroom.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("course grade-class: error: ") and fragment in line, line
    assert tree(tmp_path) == before  # nothing graded, nothing written


@pytest.mark.parametrize("bad", [["--pass-mark", "1.5"], ["--participant-timeout", "0"], []])
def test_bad_option_values_exit_2(bad: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path), *bad] if bad else []
    with pytest.raises(SystemExit) as info:
        classroom.main(argv)
    assert info.value.code == 2
    assert "course grade-class: error:" in capsys.readouterr().err


def test_help_says_it_is_not_a_sandbox(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        course_cli.main(["grade-class", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "This is NOT a security sandbox" in text and "container or under a throwaway account" in text
    assert "--participant-timeout" in text and "--csv" in text
    assert "NOT a security sandbox" in " ".join((classroom.__doc__ or "").split())


# ---------------------------------------------------------------------------------------
# The pieces
# ---------------------------------------------------------------------------------------


def test_discover_reads_every_submission_first(tmp_path: Path) -> None:
    root = tmp_path / "class"
    for rel, data in {
        "ann/00_welcome.ipynb": b"a",
        "ann/extra/01_policy_gradients.ipynb": b"b",
        "ann/.ipynb_checkpoints/00_welcome-checkpoint.ipynb": b"skip",
        "ann/.hidden.ipynb": b"skip",
        "ann/notes.txt": b"skip",
        "ben/draft.py": b"skip",
        "zoe/00_welcome.ipynb": b"c",
        "zoe.ipynb": b"d",
        ".git/config": b"skip",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    os.mkfifo(root / "ann" / "pipe.ipynb")  # reading it would block forever
    participants, ignored = classroom.discover(root)
    assert ignored == []
    got = {p.name: [(s.rel, s.inner, s.data, s.problem) for s in p.submissions] for p in participants}
    assert got == {
        "ann": [
            ("ann/00_welcome.ipynb", "00_welcome.ipynb", b"a", None),
            ("ann/pipe.ipynb", "pipe.ipynb", None, "ann/pipe.ipynb is not a regular file; it cannot be graded"),
            ("ann/extra/01_policy_gradients.ipynb", "extra/01_policy_gradients.ipynb", b"b", None),
        ],
        "ben": [],
        "zoe": [("zoe/00_welcome.ipynb", "00_welcome.ipynb", b"c", None)],
        "zoe.ipynb": [("zoe.ipynb", "zoe.ipynb", b"d", None)],  # a folder and a file named alike
    }
    (ben,) = [p for p in participants if p.name == "ben"]
    assert ben.problems == ["no notebooks in ben/ (it holds only draft.py)"]


def test_participant_limit_defaults_to_the_runner_bound_per_notebook() -> None:
    options = classroom.ClassOptions(cell_timeout=5, total_timeout=100)
    per_notebook = 100 + min(5, GRADING_GRACE_S) + WATCHDOG_SLACK_S + classroom.PER_NOTEBOOK_SLACK_S
    assert classroom.participant_limit(options, 3) == 3 * per_notebook + classroom.STARTUP_SLACK_S
    assert classroom.participant_limit(options, 3) > 3 * (100 + 5 + WATCHDOG_SLACK_S)
    assert GRADING_GRACE_S + WATCHDOG_SLACK_S + classroom.PER_NOTEBOOK_SLACK_S == 45  # as --help says
    explicit = classroom.ClassOptions(total_timeout=100, participant_timeout=42)
    assert classroom.participant_limit(explicit, 3) == 42


def test_child_environment_names_neither_the_folder_nor_the_grader_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, private = tmp_path / "class", tmp_path / "private"
    work = private / "work" / "alice"
    work.mkdir(parents=True)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("CLASS_SUBMISSIONS", f"/x{os.pathsep}{root}/alice")
    monkeypatch.setenv("GRADER_CWD", str(tmp_path / "cwd"))
    monkeypatch.setenv("OLDPWD", str(tmp_path))
    monkeypatch.setenv("UNRELATED", f"{root}-other")  # another folder, only named alike
    env = classroom.child_environment(root, private, work)
    assert "CLASS_SUBMISSIONS" not in env and "GRADER_CWD" not in env and "OLDPWD" not in env
    assert env["UNRELATED"] == f"{root}-other"
    assert env["PWD"] == str(work)
    assert all(not v.startswith(str(root) + os.sep) and v != str(root) for v in env.values())
    for key in ("TMPDIR", "IPYTHONDIR", "JUPYTER_RUNTIME_DIR"):
        assert Path(env[key]).parent == private and Path(env[key]).is_dir()
    assert (Path(env["PYTHONPATH"].split(os.pathsep)[0]) / "course_lib" / "__init__.py").exists()


def test_a_report_from_the_child_cannot_change_the_lesson_or_the_points() -> None:
    template = NotebookReport(path="alice/x.ipynb", lesson="00_welcome")
    template.exercises = [ExerciseResult("discounted_returns", 10.0), ExerciseResult("finished_episode_returns", 10.0)]
    forged = {
        "lesson": "00_welcome",
        "error": None,
        "notes": ["ran in /tmp/private/x.ipynb"],
        "exercises": [
            {"name": "discounted_returns", "passed": True, "score": 999, "points": 999, "message": ""},
            {"name": "made_up", "passed": True, "score": 50},
        ],
    }
    report = classroom.merge_report(template, forged, {"/tmp/private/x.ipynb": "alice/x.ipynb"})
    assert [(e.name, e.score, e.points, e.passed) for e in report.exercises] == [
        ("discounted_returns", 10.0, 10.0, True),
        ("finished_episode_returns", 0.0, 10.0, False),
    ]
    assert report.exercises[1].message == "not graded: missing from the grading report"
    assert report.notes == ["ran in alice/x.ipynb"]
    other = classroom.merge_report(template, {**forged, "lesson": "01_policy_gradients"})
    assert other.score == 0 and "names lesson '01_policy_gradients', not '00_welcome'" in (other.error or "")
    assert (
        classroom.merge_report(template, ["not", "a", "dict"]).error == "the grading process wrote a malformed report"
    )


def test_options_reach_the_runner_unchanged() -> None:
    import dataclasses

    from course_lib.course.grading.runner import GradeOptions

    args = classroom.build_parser().parse_args(
        ["dir", "--lesson", "00", "--pass-mark", "0.5", "--cell-timeout", "3", "--total-timeout", "9"]
    )
    assert args.participant_timeout is None
    options = classroom.ClassOptions.from_args(args)
    runner = GradeOptions(**options.runner_options())
    assert (runner.lesson, runner.pass_mark, runner.cell_timeout, runner.total_timeout) == ("00", 0.5, 3.0, 9.0)
    assert set(options.runner_options()) == {f.name for f in dataclasses.fields(GradeOptions)} - {
        "kernel_name",
        "checks_module",
    }
