"""``course grade-class DIR``: a whole class graded in one command, each participant apart.

One run over a class built in tmp_path from lesson 00's notebooks (the quickest lesson to
grade), graded with ``--lessons 00``, holds a good submission, the stub (the exercise
notebook), a crash, wrong answers, the course's solution notebook handed in, a
submission that tampers with the others' files, one that kills its grading process, an
endless loop, truncated notebooks (of lesson 00, and of no lesson that can be told), a
notebook of an unknown lesson, notebooks of other lessons (not run) and an empty folder;
the tests read that run's tables, CSV and JSON. A second, smaller run grades without
``--lessons`` (every notebook counts). The rest are the usage errors and the pieces,
without kernels.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import re
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
STUB_01 = ROOT / "exercises" / "01_policy_gradients.ipynb"
STUB_02 = ROOT / "exercises" / "02_importance_sampling.ipynb"
EXERCISES = ("discounted_returns", "finished_episode_returns")
POINTS = 20.0  # lesson 00: 10 + 10

#: The participant limit of the class run: far above a good submission's few seconds, and
#: what stops the endless loop (the cell limit is higher, so the runner does not).
PARTICIPANT_TIMEOUT = 20.0
LIMITS = ["--cell-timeout", "60", "--total-timeout", "120", "--check-timeout", "5"]
LIMITS += ["--participant-timeout", f"{PARTICIPANT_TIMEOUT:g}"]
#: The terminal width the class runs' tables are drawn for.
COLUMNS = 150

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
# Wrong answers: returns not cut at episode ends, and the unfinished episode's return kept.
UNCUT = """
def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    out = np.zeros(len(rewards), dtype=np.float64)
    running = float(bootstrap)
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out
"""
KEEPS_UNFINISHED = """
def finished_episode_returns(rewards, dones):
    out, running = [], 0.0
    for r, d in zip(rewards, dones):
        running += r
        if d:
            out.append(running)
            running = 0.0
    if len(rewards) and not dones[-1]:
        out.append(running)
    return np.array(out, dtype=np.float64)
"""
#: The check description lesson 00's report puts before that failure, and the failure itself.
UNFINISHED_CHECK = "returns a float numpy array with one value per finished episode"
UNFINISHED_FAILURE = "has 3 values but only 2 episode(s) ended"


def notebook_bytes(
    source: Path,
    *,
    first: tuple[str, ...] = (),
    replace: dict[str, str] | None = None,
    lesson: str | None = None,
    kind: str = "exercise",
) -> bytes:
    """``source`` with code cells ``first`` put before its first code cell, the code cell
    defining each key of ``replace`` replaced by its value, and its metadata lesson and kind
    set (an exercise notebook by default: a participant's work, not the solution's file)."""
    nb = nbformat.read(source, as_version=4)
    for name, new in (replace or {}).items():
        (cell,) = [c for c in nb.cells if c.cell_type == "code" and f"def {name}(" in c.source]
        cell.source = new
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells[at:at] = [nbformat.v4.new_code_cell(src) for src in first]
    if lesson is not None:
        nb.metadata["course"]["lesson"] = lesson
    nb.metadata["course"]["kind"] = kind
    return nbformat.writes(nb).encode()


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def build_class(root: Path) -> Path:
    """The class folder: one entry per participant (see the module docstring)."""
    good = notebook_bytes(SOLUTION)
    write_files(
        root,
        {
            "alice/00_welcome.ipynb": good,
            "alice/.ipynb_checkpoints/00_welcome-checkpoint.ipynb": b"not graded: a checkpoint",
            # the rest of alice's exercises folder: not in --lessons, so never run (this one
            # would kill its grading process if it were)
            "alice/01_policy_gradients.ipynb": notebook_bytes(STUB_01, first=(KILL_PARENT,)),
            "alice/02_importance_sampling.ipynb": STUB_02.read_bytes(),
            "bob/00_welcome.ipynb": STUB.read_bytes(),
            "carol/week1/00_welcome.ipynb": notebook_bytes(
                SOLUTION, first=(RAISES,), replace={"discounted_returns": SYNTAX_ERROR}
            ),
            "eve/00_welcome.ipynb": notebook_bytes(SOLUTION, first=(KILL_PARENT,)),
            "frank/00_welcome.ipynb": notebook_bytes(SOLUTION, first=(FOREVER,)),
            "gina/00_welcome.ipynb": SOLUTION.read_bytes()[:2000],  # truncated mid-file
            "hank.ipynb": notebook_bytes(SOLUTION, lesson="99_no_such_lesson"),
            "ivy.ipynb": SOLUTION.read_bytes()[:1500],  # truncated, and its name tells no lesson
            "kim/01_policy_gradients.ipynb": STUB_01.read_bytes(),  # handed in the wrong lesson only
            "lee/00_welcome.ipynb": notebook_bytes(
                SOLUTION, replace={"discounted_returns": UNCUT, "finished_episode_returns": KEEPS_UNFINISHED}
            ),
            "mallory/00_welcome.ipynb": notebook_bytes(SOLUTION, first=(TAMPER, LINGER)),
            "sol/00_welcome.ipynb": SOLUTION.read_bytes(),  # the course's own solution notebook
            "zoe.ipynb": good,
            "README.md": b"submissions of the workshop\n",
        },
    )
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
        (nb,) = [nb for nb in self.participant(name)["notebooks"] if nb["counts"]]
        return nb

    def table_lines(self, name: str) -> list[str]:
        """The participant table's lines of ``name``: from its first row (name and verdict)
        to the next participant's."""
        lines = self.out.splitlines()
        start = lines.index("Participants") + 3
        end = lines.index("", start)
        (first,) = [i for i in range(start, end) if lines[i].startswith(f"  {name} ")]
        after = [i for i in range(first + 1, end) if lines[i][2:3] != " "]
        return lines[first : after[0] if after else end]

    def table_row(self, name: str) -> str:
        """``name``'s lines of the participant table, joined into one line of words."""
        return " ".join(" ".join(self.table_lines(name)).split())

    def exercise_line(self, exercise: str) -> str:
        (line,) = [ln for ln in self.out.splitlines() if ln.startswith(f"  00      {exercise} ")]
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
        mp.setenv("COLUMNS", str(COLUMNS))
        t0 = time.monotonic()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = classroom.main(
                [".", "--lessons", "00", "--csv", str(exports / "class.csv"), "--json", str(exports / "class.json")]
                + LIMITS
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


NAMES = ["alice", "bob", "carol", "dave", "eve", "frank", "gina", "hank", "ivy", "kim", "lee", "mallory", "sol", "zoe"]


def test_run_is_bounded_leaves_nothing_running_and_fails_the_class(class_run: ClassRun) -> None:
    assert class_run.rc == 1
    assert class_run.leftovers == []
    # nine participants' notebooks graded in a few seconds each, the endless loop stopped at
    # its limit; the others need no kernel
    assert class_run.seconds < 100, class_run.seconds
    assert [p["name"] for p in class_run.doc["participants"]] == NAMES
    assert class_run.doc["ignored"] == ["README.md"]
    for number, name in enumerate(NAMES, 1):
        assert f"[{number}/{len(NAMES)}] {name} ..." in class_run.out
    assert "3/14 participants passed. Handed in the solution notebook: sol." in class_run.out
    assert [p["name"] for p in class_run.doc["participants"] if p["passed"]] == ["alice", "mallory", "zoe"]
    assert not class_run.doc["passed"] and class_run.doc["participants_passed"] == 3
    assert class_run.doc["lessons"] == ["00_welcome"]


def test_the_pass_rule_is_stated(class_run: ClassRun) -> None:
    rule = (
        "Pass rule: a participant passes when they hand in a notebook of lesson 00 (--lessons) and every notebook "
        "of that lesson reaches the pass mark (70% of its points); notebooks of other lessons are not graded and "
        "do not count. An unreadable notebook fails; a solution notebook handed in is not counted as passed."
    )
    assert class_run.doc["pass_rule"] == rule
    assert rule in " ".join(class_run.out.split())


def test_tables_fit_the_terminal_width(class_run: ClassRun) -> None:
    table = class_run.out[class_run.out.index("Participants") :]
    assert max(len(line) for line in table.splitlines()) <= COLUMNS
    assert max(len(line) for line in table.splitlines()) > COLUMNS - 10  # and use it


def test_good_submissions_pass_with_full_points(class_run: ClassRun) -> None:
    for name, path in (("alice", "alice/00_welcome.ipynb"), ("zoe", "zoe.ipynb")):
        p = class_run.participant(name)
        assert p["passed"] and p["outcome"] == "graded" and p["problems"] == [] and not p["solution_submitted"]
        nb = class_run.notebook(name)  # alice's checkpoint copy is not graded
        assert nb["path"] == path and nb["lesson"] == "00_welcome" and nb["status"] == "graded"
        assert nb["score"] == nb["max_score"] == POINTS and nb["error"] is None and nb["notes"] == []
        assert all(e["passed"] and e["status"] == "passed" for e in nb["exercises"])
        assert class_run.table_lines(name)[0].split() == [
            name,
            "PASS",
            path.removeprefix(f"{name}/"),
            "00",
            "20/20",
            "PASS",
        ]
        assert "20/20 PASS" in class_run.table_row(name)


def test_notebooks_of_other_lessons_are_listed_but_not_run(class_run: ClassRun) -> None:
    alice = class_run.participant("alice")
    assert alice["score"] == alice["max_score"] == POINTS and alice["outcome"] == "graded"  # its 01 would crash
    skipped = [nb for nb in alice["notebooks"] if not nb["counts"]]
    assert [(nb["path"], nb["status"], nb["not_graded"], nb["exercises"]) for nb in skipped] == [
        ("alice/01_policy_gradients.ipynb", "not graded", "not graded (lesson 01 not in --lessons)", []),
        ("alice/02_importance_sampling.ipynb", "not graded", "not graded (lesson 02 not in --lessons)", []),
    ]
    assert "[1/14] alice ... PASS 20/20" in class_run.out and "; 2 notebook(s) not graded)" in class_run.out
    _, second = class_run.table_lines("alice")
    assert " ".join(second.split()) == "2 notebooks 01,02 - - not graded (lessons 01, 02 not in --lessons)"
    # a participant who handed in only another lesson's notebook has none of lesson 00
    kim = class_run.participant("kim")
    assert kim["missing_lessons"] == ["00_welcome"] and not kim["passed"] and kim["max_score"] == 0
    assert "no notebook of lesson 00" in class_run.table_row("kim")
    assert "01_policy_gradients.ipynb 01 - - not graded (lesson 01 not in --lessons)" in class_run.table_row("kim")
    # the exercise table has lesson 00's exercises only
    assert [(s["lesson"], s["exercise"]) for s in class_run.doc["exercises"]] == [("00_welcome", e) for e in EXERCISES]


def test_the_stub_and_wrong_answers_fail_with_their_reasons(class_run: ClassRun) -> None:
    bob = class_run.notebook("bob")
    assert bob["score"] == 0 and not bob["passed"]
    assert [(e["message"], e["status"]) for e in bob["exercises"]] == [("not implemented yet", "not implemented")] * 2
    assert "discounted_returns, finished_episode_returns: not implemented yet" in class_run.table_row("bob")

    carol = class_run.notebook("carol")
    assert carol["path"] == "carol/week1/00_welcome.ipynb"  # found one folder down
    assert carol["score"] == 10 and not carol["passed"]  # the second exercise is still right
    (broken, fine) = carol["exercises"]
    assert "`discounted_returns` is not defined" in broken["message"] and "SyntaxError" in broken["message"]
    assert broken["status"] == "error" and fine["passed"]
    assert any("RuntimeError: boom in the setup cell" in n for n in carol["notes"])
    # the SyntaxError keeps its line and cell numbers in the table
    assert re.search(
        r"discounted_returns: `discounted_returns` is not defined: the cell defining it raised SyntaxError: "
        r"expected ':' \(line 1\) \(cell \d+\)",
        class_run.table_row("carol"),
    )

    lee = class_run.notebook("lee")
    assert [e["status"] for e in lee["exercises"]] == ["failed", "failed"]
    second = lee["exercises"][1]
    assert second["message"].startswith(f"{UNFINISHED_CHECK}: finished_episode_returns(")
    assert second["failure"].startswith("finished_episode_returns(") and UNFINISHED_FAILURE in second["failure"]
    # the table shows `name: failure`, without the check's description, wrapped but whole
    row = class_run.table_row("lee")
    assert UNFINISHED_CHECK not in row
    assert f"finished_episode_returns: {second['failure']}" in row
    assert "discounted_returns: discounted_returns([1, 1, 1, 1], [0, 1, 0, 0], gamma=0.9) is wrong" in row


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
    assert "[6/14] frank ... FAIL (TIMED OUT)" in class_run.out
    # both still list every exercise of their lesson, at 0 points, as not graded
    for name in ("eve", "frank"):
        nb = class_run.notebook(name)
        assert nb["lesson"] == "00_welcome" and nb["max_score"] == POINTS and nb["score"] == 0
        assert [e["status"] for e in nb["exercises"]] == ["not graded"] * 2


def test_unreadable_unknown_and_empty_submissions_are_reported(class_run: ClassRun) -> None:
    gina = class_run.notebook("gina")  # its lesson told by its file name: it counts, and fails
    assert gina["status"] == "unreadable" and not gina["passed"] and gina["max_score"] == POINTS
    assert gina["unreadable"].startswith("not valid JSON (") and "truncated" in gina["unreadable"]
    assert gina["error"] == f"unreadable notebook: {gina['unreadable']}"
    assert gina["path"] == "gina/00_welcome.ipynb" and gina["lesson"] == "00_welcome"
    assert "course-grade-class-" not in gina["error"]  # the private copy's path is not shown
    assert [e["status"] for e in gina["exercises"]] == ["unreadable"] * 2
    assert "00_welcome.ipynb 00 0/20 FAIL unreadable notebook: not valid JSON (" in class_run.table_row("gina")
    assert "[7/14] gina ... FAIL 0/20" in class_run.out

    # a notebook whose lesson cannot be told is none of --lessons: listed, not graded
    hank = class_run.participant("hank")
    (nb,) = hank["notebooks"]
    assert nb["lesson"] is None and nb["exercises"] == [] and nb["status"] == "not graded"
    assert "'99_no_such_lesson', which is not a lesson of this course" in nb["not_graded"]
    assert hank["missing_lessons"] == ["00_welcome"] and not hank["passed"]

    ivy = class_run.participant("ivy")  # its only notebook is corrupt and tells no lesson
    (nb,) = ivy["notebooks"]
    assert nb["unreadable"].startswith("not valid JSON (") and not ivy["passed"]
    row = class_run.table_row("ivy")
    assert "no notebook of lesson 00" in row and "ivy.ipynb ? - - unreadable notebook: not valid JSON (" in row

    dave = class_run.participant("dave")
    assert dave["notebooks"] == [] and not dave["passed"]
    assert dave["problems"] == ["no notebooks in dave/ (it is empty)"]
    assert "dave FAIL - - - - no notebook of lesson 00 no notebooks in dave/ (it is empty)" in class_run.table_row(
        "dave"
    )


def test_the_solution_notebook_is_flagged_and_does_not_pass(class_run: ClassRun) -> None:
    sol = class_run.participant("sol")
    assert sol["solution_submitted"] and not sol["passed"] and sol["score"] == 0
    nb = class_run.notebook("sol")
    assert nb["status"] == "solution notebook" and not nb["passed"]
    assert nb["solution_notebook"] == "byte for byte the course's solutions/00_welcome.ipynb"
    assert nb["graded_score"] == POINTS and nb["score"] == 0  # graded, but not counted
    assert (
        "sol FAIL 00_welcome.ipynb 00 0/20 FAIL submitted the solution notebook (byte for byte the course's "
        "solutions/00_welcome.ipynb): not counted as passed (its grading gave 20/20)"
    ) in class_run.table_row("sol")
    rows = [r for r in class_run.rows if r["participant"] == "sol"]
    assert [(r["status"], r["passed"], r["points"]) for r in rows] == [("solution notebook", "False", "0")] * 2
    # the participants who handed in their own work, starting from the same code, are not flagged
    assert not any(class_run.participant(n)["solution_submitted"] for n in NAMES if n != "sol")


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
    assert "mallory PASS" in class_run.table_row("mallory") and "was killed" in class_run.table_row("mallory")


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
    assert list(classroom.CSV_COLUMNS)[-3:] == ["status", "message", "hint"]
    keys = [(r["participant"], r["notebook"], r["lesson"], r["exercise"]) for r in class_run.rows]
    graded = {
        "alice": "alice/00_welcome.ipynb",
        "bob": "bob/00_welcome.ipynb",
        "carol": "carol/week1/00_welcome.ipynb",
        "eve": "eve/00_welcome.ipynb",
        "frank": "frank/00_welcome.ipynb",
        "gina": "gina/00_welcome.ipynb",
        "lee": "lee/00_welcome.ipynb",
        "mallory": "mallory/00_welcome.ipynb",
        "sol": "sol/00_welcome.ipynb",
        "zoe": "zoe.ipynb",
    }
    expected = [(name, path, "00_welcome", ex) for name, path in graded.items() for ex in EXERCISES]
    expected += [(name, "", "00_welcome", "") for name in ("dave", "hank", "ivy", "kim")]  # no notebook of 00
    expected += [
        ("alice", "alice/01_policy_gradients.ipynb", "01_policy_gradients", ""),
        ("alice", "alice/02_importance_sampling.ipynb", "02_importance_sampling", ""),
        ("hank", "hank.ipynb", "", ""),
        ("ivy", "ivy.ipynb", "", ""),
        ("kim", "kim/01_policy_gradients.ipynb", "01_policy_gradients", ""),
    ]
    assert sorted(keys) == sorted(expected)
    by_key = {(r["participant"], r["notebook"], r["exercise"]): r for r in class_run.rows}
    assert by_key["alice", "alice/00_welcome.ipynb", "discounted_returns"] == {
        "participant": "alice",
        "notebook": "alice/00_welcome.ipynb",
        "lesson": "00_welcome",
        "exercise": "discounted_returns",
        "points": "10",
        "max_points": "10",
        "passed": "True",
        "status": "passed",
        "message": "",
        "hint": "",
    }
    hints = {e.name: e.hint for e in lesson_exercises("00_welcome")}
    bob = by_key["bob", "bob/00_welcome.ipynb", "finished_episode_returns"]
    assert (bob["message"], bob["passed"], bob["status"]) == ("not implemented yet", "False", "not implemented")
    assert bob["hint"] == hints["finished_episode_returns"] != ""
    lee = by_key["lee", "lee/00_welcome.ipynb", "finished_episode_returns"]
    assert lee["status"] == "failed" and UNFINISHED_FAILURE in lee["message"]
    assert lee["hint"] == hints["finished_episode_returns"]
    carol = by_key["carol", "carol/week1/00_welcome.ipynb", "discounted_returns"]
    assert carol["status"] == "error" and carol["hint"] == hints["discounted_returns"]
    assert by_key["carol", "carol/week1/00_welcome.ipynb", "finished_episode_returns"]["hint"] == ""  # passed
    eve = by_key["eve", "eve/00_welcome.ipynb", "discounted_returns"]
    assert "killed by SIGKILL" in eve["message"] and eve["status"] == "not graded" and eve["hint"] == ""
    frank = by_key["frank", "frank/00_welcome.ipynb", "discounted_returns"]
    assert "participant time limit" in frank["message"] and frank["status"] == "not graded"
    gina = by_key["gina", "gina/00_welcome.ipynb", "discounted_returns"]
    assert gina["message"].startswith("unreadable notebook: not valid JSON") and gina["status"] == "unreadable"
    assert "not a lesson of this course" in by_key["hank", "hank.ipynb", ""]["message"]
    assert by_key["hank", "hank.ipynb", ""]["status"] == "not graded"
    assert by_key["ivy", "ivy.ipynb", ""]["message"].startswith("unreadable notebook: not valid JSON")
    skipped = by_key["alice", "alice/01_policy_gradients.ipynb", ""]
    assert (skipped["status"], skipped["message"]) == ("not graded", "not graded (lesson 01 not in --lessons)")
    dave = by_key["dave", "", ""]
    assert (dave["status"], dave["message"]) == (
        "no notebook",
        "no notebook of lesson 00; no notebooks in dave/ (it is empty)",
    )
    assert by_key["kim", "", ""]["message"] == "no notebook of lesson 00"


def test_exercise_table_counts_every_participant_and_the_failures_of_attempts(class_run: ClassRun) -> None:
    stats = {s["exercise"]: s for s in class_run.doc["exercises"]}
    assert list(stats) == list(EXERCISES)
    first, second = stats["discounted_returns"], stats["finished_episode_returns"]
    # all 14 participants count; alice, mallory and zoe solved both, carol the second
    assert (first["participants"], first["passed"], second["passed"]) == (14, 3, 4)
    assert first["mean_points"] == pytest.approx(10 * 3 / 14) and second["mean_points"] == pytest.approx(10 * 4 / 14)
    # the stub (bob) and the solution notebook (sol) are not attempts; eve, frank, gina and
    # ivy's notebooks could not be graded; dave, hank and kim have none of lesson 00
    for s in (first, second):
        assert (s["not_attempted"], s["not_graded"], s["no_notebook"]) == (2, 4, 3)
        assert s["passed"] + s["failed_attempts"] + s["not_attempted"] + s["not_graded"] + s["no_notebook"] == 14
    # the most common failure is an attempted answer's; carol's and lee's tie, alphabetical order decides
    assert (first["failed_attempts"], first["common_failure_count"]) == (2, 1)
    assert first["common_failure"].startswith("`discounted_returns` is not defined")
    assert (second["common_failure_count"], second["failed_attempts"]) == (1, 1)
    assert (
        second["common_failure"].startswith("finished_episode_returns(")
        and UNFINISHED_CHECK not in (second["common_failure"])
    )
    line = class_run.exercise_line("discounted_returns")
    assert line.split()[2:8] == ["3/14", "2.1/10", "2", "4", "3", "1/2:"]
    table = class_run.out[class_run.out.index("Exercises") : class_run.out.index("  mean: points per participant")]
    assert "not implemented" not in table
    assert "1/1: finished_episode_returns([1.0," in class_run.exercise_line("finished_episode_returns")


def lesson_exercises(lesson: str) -> Any:
    from course_lib.course.grading.lessons import exercises_for

    return exercises_for(lesson)


def test_without_lessons_every_notebook_counts_and_an_unreadable_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --lessons: jo's stub of lesson 01 counts (and fails jo), and ivy, whose only
    notebook is corrupt and tells no lesson, counts in every lesson's exercises."""
    root = write_files(
        tmp_path / "class",
        {
            "ivy.ipynb": SOLUTION.read_bytes()[:1500],
            "jo/00_welcome.ipynb": notebook_bytes(SOLUTION),
            "jo/01_policy_gradients.ipynb": STUB_01.read_bytes(),
        },
    )
    monkeypatch.setenv("COLUMNS", "120")
    rc = classroom.main([str(root), "--json", str(tmp_path / "out.json"), *LIMITS])
    out = capsys.readouterr().out
    assert rc == 1
    doc = json.loads((tmp_path / "out.json").read_text())
    ivy, jo = doc["participants"]
    assert not ivy["passed"] and not jo["passed"] and doc["participants_passed"] == 0
    (nb,) = ivy["notebooks"]
    assert nb["counts"] and nb["lesson"] is None and nb["status"] == "unreadable"
    assert [nb["passed"] for nb in jo["notebooks"]] == [True, False] and jo["score"] == POINTS
    assert "Pass rule: a participant passes when they hand in at least one notebook and every notebook handed in" in (
        " ".join(out.split())
    )
    assert "0/2 participants passed." in out
    ivy_line = next(line for line in out.splitlines() if line.startswith("  ivy "))
    assert ivy_line.split()[:7] == ["ivy", "FAIL", "ivy.ipynb", "?", "0/0", "FAIL", "unreadable"]
    stats = {(s["lesson"], s["exercise"]): s for s in doc["exercises"]}
    assert sorted({lesson for lesson, _ in stats}) == ["00_welcome", "01_policy_gradients"]
    for (lesson, _), s in stats.items():
        assert s["participants"] == 2 and s["not_graded"] == 1  # ivy's
        assert (s["passed"], s["not_attempted"]) == ((1, 0) if lesson == "00_welcome" else (0, 1))
    assert max(len(line) for line in out[out.index("Participants") :].splitlines()) <= 120


def test_lesson_override_reaches_the_grader(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "class"
    (root / "alice").mkdir(parents=True)
    (root / "alice" / "00_welcome.ipynb").write_bytes(notebook_bytes(SOLUTION))
    rc = classroom.main([str(root), "--lesson", "01", "--json", str(tmp_path / "out.json")])
    assert rc == 1
    doc = json.loads((tmp_path / "out.json").read_text())
    (nb,) = doc["participants"][0]["notebooks"]
    assert nb["lesson"] == "01_policy_gradients" and nb["score"] == 0
    assert "this notebook is lesson 00_welcome's, not 01_policy_gradients's" in nb["error"]
    assert [e["status"] for e in nb["exercises"]] == ["not graded"] * 4
    out = capsys.readouterr().out
    assert "[1/1] alice ..." in out
    assert "each graded as lesson 01 (--lesson)" in " ".join(out.split())


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
    "lessons": (_one_submission, ["{root}", "--lessons", "00,99"], "--lessons: no lesson named '99'; choose"),
    "lessons-repeated": (_one_submission, ["{root}", "--lessons", "00", "--lessons", "nope"], "no lesson named 'nope'"),
    "lessons-empty": (_one_submission, ["{root}", "--lessons", " , "], "--lessons: no lesson given"),
    "lesson-and-lessons": (_one_submission, ["{root}", "--lesson", "00", "--lessons", "00"], "cannot be combined"),
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
    assert "--lessons LIST grade only the notebooks of these lessons" in text
    assert "A participant passes when every notebook that counts reaches the pass mark" in text
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


def test_lessons_are_resolved_by_number_id_or_slug_in_any_mix() -> None:
    assert classroom.parse_lessons(None) is None
    assert classroom.parse_lessons(["02,0", "policy_gradients", "01_policy_gradients", "2,"]) == (
        "00_welcome",
        "01_policy_gradients",
        "02_importance_sampling",
    )
    args = classroom.build_parser().parse_args(["dir", "--lessons", "00,01", "--lessons", "importance_sampling"])
    options = classroom.ClassOptions.from_args(args)
    assert options.lessons == ("00_welcome", "01_policy_gradients", "02_importance_sampling")
    assert "lessons" not in options.runner_options()
    with pytest.raises(classroom.UsageError, match="--lessons: no lesson named 'x'"):
        classroom.parse_lessons(["00,x"])


def _result(name: str, message: str = "", *, passed: bool = False, checks: list[dict[str, str]] | None = None) -> Any:
    return ExerciseResult(
        name, 10.0, score=10.0 if passed else 0.0, passed=passed, message=message, checks=checks or []
    )


def _check(description: str, status: str, message: str) -> dict[str, str]:
    return {"description": description, "status": status, "message": message}


def test_failure_text_drops_the_check_description_only() -> None:
    failing = _result(
        "finished_episode_returns",
        f"{UNFINISHED_CHECK}: f([1.0]) {UNFINISHED_FAILURE}:\n  leave it out",
        checks=[_check("first", "pass", ""), _check(UNFINISHED_CHECK, "fail", "f([1.0]) ...")],
    )
    assert classroom.failure_text(failing) == f"f([1.0]) {UNFINISHED_FAILURE}: leave it out"
    # a message from no check (the function is not defined) is kept whole, line and cell numbers included
    syntax = "`f` is not defined: the cell defining it raised SyntaxError: expected ':' (line 1) (cell 5)"
    assert classroom.failure_text(_result("f", syntax)) == syntax
    # a check without a description, or a message that does not start with it, is kept whole
    assert classroom.failure_text(_result("f", "boom", checks=[_check("", "error", "boom")])) == "boom"
    assert classroom.failure_text(_result("f", "other: x", checks=[_check("desc", "fail", "x")])) == "other: x"
    assert classroom.failure_text(_result("f")) == "failed"


@pytest.mark.parametrize(
    ("result", "status"),
    [
        (_result("f", passed=True), "passed"),
        (_result("f", "not implemented yet", checks=[_check("d", "not_implemented", "")]), "not implemented"),
        (_result("f", "not implemented yet"), "not implemented"),
        (_result("f", "d: wrong", checks=[_check("d", "pass", ""), _check("d", "fail", "wrong")]), "failed"),
        (_result("f", "d: raised", checks=[_check("d", "error", "ValueError")]), "error"),
        (_result("f", "checking it ran past", checks=[_check("d", "timeout", "over")]), "timeout"),
        (_result("f", "`f` is not defined: no cell defines it (keep the function name)"), "not defined"),
        (_result("f", "`f` is not defined: the cell defining it raised SyntaxError: x (cell 3)"), "error"),
        (_result("f", "`f` is not defined: the cell defining it ran past the 5 s cell time limit (cell 3)"), "timeout"),
        (_result("f", "not graded: crashed: the grading process died"), "not graded"),
    ],
)
def test_exercise_status(result: ExerciseResult, status: str) -> None:
    assert classroom.exercise_status(result) == status


def _participant(name: str, *entries: classroom.NotebookEntry) -> classroom.Participant:
    return classroom.Participant(name=name, source=f"{name}/", entries=list(entries))


def _entry(lesson: str | None, *results: ExerciseResult, **flags: Any) -> classroom.NotebookEntry:
    report = NotebookReport(path="x.ipynb", lesson=lesson, exercises=list(results))
    return classroom.NotebookEntry(report, **flags)


def test_exercise_stats_leave_stubs_out_of_the_failures_and_break_ties_alphabetically() -> None:
    lesson = "00_welcome"
    wrong_b, wrong_a = "f(x) is wrong: b", "f(x) is wrong: a"
    participants = [
        _participant("p1", _entry(lesson, _result("f", "not implemented yet"))),
        _participant("p2", _entry(lesson, _result("f", "not implemented yet"))),
        _participant("p3", _entry(lesson, _result("f", "not implemented yet"))),
        _participant("p4", _entry(lesson, _result("f", f"d: {wrong_b}", checks=[_check("d", "fail", wrong_b)]))),
        _participant("p5", _entry(lesson, _result("f", f"d: {wrong_a}", checks=[_check("d", "fail", wrong_a)]))),
        _participant("p6", _entry(lesson, _result("f", passed=True))),
        _participant("p7", _entry(lesson, _result("f", passed=True), solution="its metadata says so")),
        _participant("p8", _entry(lesson, _result("f", "not graded: x"), unreadable="not valid JSON")),
        _participant("p9"),
        # a stub and an attempt of the same lesson: the attempt is what counts
        _participant("p10", _entry(lesson, _result("f", "not implemented yet")), _entry(lesson, _result("f", "g"))),
    ]
    (s,) = classroom.exercise_stats(participants, [lesson])
    assert (s.participants, s.passed, s.not_attempted, s.not_graded, s.no_notebook, s.failed) == (10, 1, 4, 1, 1, 3)
    assert s.common_failure == (wrong_a, 1)  # three failures once each: the alphabetically first
    assert classroom.exercise_stats(list(reversed(participants)), [lesson])[0].common_failure == (wrong_a, 1)
    s.failures["zz"] += 2
    assert s.common_failure == ("zz", 2)  # the most frequent first
    (row,) = classroom.exercise_rows([s])
    assert row == (("00", "f", "1/10", "1.0/10", "4", "1", "1"), ["2/5: zz"])


def test_participant_rules_count_lessons_unreadable_and_solution_notebooks() -> None:
    good = _entry("00_welcome", _result("f", passed=True))
    assert _participant("a", good).passed
    assert not _participant("a").passed  # nothing handed in
    assert not _participant("a", good, _entry(None, unreadable="not valid JSON")).passed
    assert _participant("a", good, _entry("01_policy_gradients", skipped="not graded (...)")).passed
    flagged = _participant("a", _entry("00_welcome", _result("f", passed=True), solution="byte for byte"))
    assert not flagged.passed and flagged.solution_submitted and flagged.score == 0 and flagged.max_score == 10
    missing = _participant("a", good)
    missing.missing = ["01_policy_gradients"]
    assert not missing.passed


def test_solution_notebooks_are_told_by_metadata_or_bytes() -> None:
    data = SOLUTION.read_bytes()
    nb = nbformat.reads(data.decode(), as_version=4)
    digests = classroom.solution_digests()
    assert digests[hashlib.sha256(data).hexdigest()] == "solutions/00_welcome.ipynb" and len(digests) >= 12
    assert classroom.solution_reason(data, nb, digests) == "byte for byte the course's solutions/00_welcome.ipynb"
    assert classroom.solution_reason(data, nb, {}) == "its metadata says course.kind = solution"
    mine = notebook_bytes(SOLUTION)
    assert classroom.solution_reason(mine, nbformat.reads(mine.decode(), as_version=4), digests) is None
    # the same bytes with the metadata made an exercise's: still the solution's file
    stripped = data.replace(b'"kind": "solution"', b'"kind": "exercise"')
    assert stripped != data
    fake = {hashlib.sha256(stripped).hexdigest(): "solutions/00_welcome.ipynb"}
    assert classroom.solution_reason(stripped, nbformat.reads(stripped.decode(), as_version=4), fake) == (
        "byte for byte the course's solutions/00_welcome.ipynb"
    )
    assert classroom.solution_reason(b"x", None, digests) is None


def test_unreadable_reasons_lose_the_path_they_start_with() -> None:
    assert classroom.unreadable_reason("/tmp/x/a.ipynb is not valid JSON (y)", "/tmp/x/a.ipynb") == "not valid JSON (y)"
    assert classroom.unreadable_reason("a.ipynb: no such file", "a.ipynb") == "no such file"
    assert classroom.unreadable_reason("a.ipynb cannot be read: denied", "a.ipynb") == "cannot be read: denied"
    assert classroom.unreadable_reason("something else", "a.ipynb") == "something else"


@pytest.mark.parametrize("width", [120, 160])
def test_tables_wrap_their_last_column_to_the_width(width: int) -> None:
    long = "finished_episode_returns: " + " ".join(f"word{i}" for i in range(40))
    rows: list[classroom.Row] = [
        (("alice", "FAIL", "exercises/02_importance_sampling.ipynb", "02", "0/55", "FAIL"), [long, "short"]),
        (("", "", "00_welcome.ipynb", "00", "20/20", "PASS"), []),
    ]
    lines = classroom.format_table(classroom.PARTICIPANT_HEADER, rows, width)
    assert max(len(line) for line in lines) <= width
    assert " ".join(" ".join(lines[2:-1]).split()).endswith(f"FAIL {long} short")
    column = lines[0].index("problems")
    assert all(line[column - 2 :].startswith("  ") for line in lines[3:-1])  # continuation lines: blank cells
    assert lines[-1].split() == ["00_welcome.ipynb", "00", "20/20", "PASS"]
    # an item longer than MAX_PROBLEM_CHARS is cut (the CSV and JSON keep it whole)
    huge = classroom.format_table(classroom.PARTICIPANT_HEADER, [(rows[0][0], ["x " * 1000])], width)
    assert len(" ".join(" ".join(huge[2:]).split())) < classroom.MAX_PROBLEM_CHARS + 100
