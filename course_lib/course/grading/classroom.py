"""``course grade-class DIR``: grade a whole workshop's submissions in one command.

``DIR`` holds one entry per participant: a subfolder (the participant is the folder's
name; every ``*.ipynb`` in it is found, recursively, leaving out hidden folders such as
``.ipynb_checkpoints``) or a single ``.ipynb`` file (the participant is its stem). Each
notebook is graded as ``course grade`` grades it (:func:`course_lib.course.grading.runner.grade_notebook`:
a fresh kernel, cell and total time limits, a watchdog); the lesson comes from the
notebook's metadata or file name, and ``--lesson`` overrides it for all.

``--lessons 00,01,02`` grades only the notebooks of those lessons (participants usually
hand in their whole ``exercises/`` folder); the others are listed as not graded, are not
run, and do not count. The pass rule, printed under the tables: a participant passes when
every notebook that counts reaches the pass mark (with ``--lessons``: and there is a
notebook of each lesson asked for; without: and there is at least one notebook). A
notebook that cannot be read fails ("unreadable notebook: <reason>"), and counts unless
``--lessons`` leaves out its lesson (told by its file name; none told: left out too); the
course's solution notebook handed in (metadata ``course.kind == "solution"``, or the
bytes of ``solutions/NN_*.ipynb``) is graded, flagged, and counts as not passed.

The terminal shows a progress line per participant, then a table per participant and
notebook (each failing exercise as ``name: <what failed>``, wrapped to the terminal's
width) and a table per exercise (every participant counted: how many passed it, the mean
points, how many left the stub as it was, whose notebook could not be graded, who had no
notebook of the lesson, and the most common failure among the answers attempted, equals
in alphabetical order); ``--csv`` and ``--json`` export the
same, with each exercise's status and, where it failed, its first hint. The exit status
is 0 if every participant passes, 1 otherwise, 2 on a usage error. A bad submission (a
stub, a crash, a timeout, an unreadable or truncated notebook, an empty folder, a
notebook of an unknown lesson) is reported on its participant's line and never stops the
run.

Keeping submissions apart
-------------------------
* Every submission is read into memory (a snapshot of its bytes) before any is graded;
  ``DIR`` itself is never written to (exports inside it are refused).
* Each participant is graded from a copy of its own snapshot, in a fresh private
  temporary folder (its kernels' working folder holds only its own files; ``TMPDIR``,
  ``IPYTHONDIR`` and ``JUPYTER_RUNTIME_DIR`` point inside it), by a separate child
  process in its own session, whose environment names neither ``DIR`` nor the grader's
  working folder. After ``--participant-timeout`` seconds that process, its process group
  and everything it started are killed and the participant is reported as timed out; a
  child that dies (the submission kills its parent process, exhausts memory, ...) is a
  crash on that participant's line only. On Linux the grader is a child subreaper while
  it runs, so whatever a submission leaves running, even in a new session, is found and
  killed before the next participant starts.
* Results are kept in the grader's memory as soon as each participant is done, so a
  later submission cannot alter an earlier one's.

This is NOT a security sandbox. Submissions run as your user: they can read and write
whatever you can (your home folder, the course's virtual environment, where a ``.pth``
file would run in every later kernel), find ``DIR`` by looking at the grader's process
(``/proc/PID/cwd``, its command line), and fake their own grade. For untrusted code, run
the grader in a container or under a throwaway account.

This module imports nothing heavy at import time (``course --help`` stays fast).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from course_lib.course.grading.checks import NOT_IMPLEMENTED
from course_lib.course.grading.cli import add_limit_arguments, positive_seconds_arg
from course_lib.course.grading.report import (
    DEFAULT_PASS_MARK,
    ExerciseResult,
    NotebookReport,
    cut_text,
    format_points,
    write_text,
)

PROG = "course grade-class"

#: Largest event file read back from a child (its reports).
MAX_EVENTS_BYTES = 64 * 1024 * 1024
#: Seconds added per notebook to the runner's own bound (kernel shutdown, restarts).
PER_NOTEBOOK_SLACK_S = 20.0
#: Seconds added per participant (the child's interpreter start and imports).
STARTUP_SLACK_S = 30.0
#: Width of the tables when the terminal's cannot be told (output to a file or a pipe).
DEFAULT_WIDTH = 150
#: Narrowest and widest tables: the last column wraps to fit what is left.
MIN_WIDTH, MAX_WIDTH = 100, 220
#: Narrowest wrapped column, whatever the other columns take.
MIN_WRAP = 30
#: Longest text of one problem or failure in the tables (CSV and JSON keep all of it).
MAX_PROBLEM_CHARS = 400

EPILOG = """\
DIR holds one entry per participant: a subfolder (every *.ipynb in it, recursively,
hidden folders such as .ipynb_checkpoints left out) or a single .ipynb file.

Isolation: every submission is read into memory before any is graded; each participant
is graded from a copy in a fresh private temporary folder, by a separate process that is
killed, with everything it started, after --participant-timeout seconds; DIR is never
written to; earlier results stay in the grader's memory.

This is NOT a security sandbox: submissions run as your user and can read and write
anything you can (your home folder, the course's virtual environment). For untrusted
code, run the grader in a container or under a throwaway account.

Which notebooks count: with --lessons, those of the lessons named (a participant without
a notebook of one of them does not pass); the others are listed as not graded, not run.
Without it, every notebook found. A participant passes when every notebook that counts
reaches the pass mark; an unreadable notebook that counts fails; the course's solution
notebook handed in (metadata course.kind = solution, or byte for byte
solutions/NN_*.ipynb) is flagged and does not pass. The summary states the rule applied.

Exit status: 0 if every participant passes, 1 if not, 2 on a usage error."""

_WORKER_CODE = (
    "import sys; from course_lib.course.grading.classroom import worker_main; sys.exit(worker_main(sys.argv[1:]))"
)


class UsageError(Exception):
    """A bad command line (missing folder, unwritable export); the message is one line."""


# ---------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------


@dataclass
class Submission:
    """One notebook's snapshot.

    Attributes:
        rel: its path relative to ``DIR`` (``alice/00_welcome.ipynb``), as reported.
        inner: its path inside the participant's folder (the copy keeps it).
        data: its bytes, read before any grading (None if it could not be read;
            emptied once copied for grading).
        problem: why it could not be read.
    """

    rel: str
    inner: str
    data: bytes | None = None
    problem: str | None = None


@dataclass
class NotebookEntry:
    """One notebook a participant handed in, and what became of it.

    Attributes:
        report: its grade; for a notebook not graded, its path and lesson (no exercises).
        skipped: why it was not graded and does not count (``--lessons`` leaves its
            lesson out, or its lesson cannot be told); None when it counts.
        unreadable: why it could not be read or parsed (it counts, and fails).
        solution: why it is taken for the course's solution notebook (it is graded, but
            counts as 0 points and not passed).
    """

    report: NotebookReport
    skipped: str | None = None
    unreadable: str | None = None
    solution: str | None = None

    @property
    def counts(self) -> bool:
        return self.skipped is None

    @property
    def passed(self) -> bool:
        return self.counts and self.unreadable is None and self.solution is None and self.report.passed

    @property
    def score(self) -> float:
        """The points that count: none for a notebook skipped, unreadable or the solution's."""
        return self.report.score if self.counts and self.solution is None and self.unreadable is None else 0.0

    @property
    def max_score(self) -> float:
        return self.report.max_score if self.counts else 0.0

    @property
    def status(self) -> str:
        """``graded``, ``not graded``, ``unreadable`` or ``solution notebook``."""
        if self.skipped is not None:
            return "not graded"
        if self.unreadable is not None:
            return "unreadable"
        return "solution notebook" if self.solution is not None else "graded"

    def to_dict(self) -> dict[str, Any]:
        doc = self.report.to_dict()
        doc["graded_score"] = doc["score"]
        doc.update(
            status=self.status,
            counts=self.counts,
            score=self.score,
            max_score=self.max_score,
            fraction=round(self.score / self.max_score, 6) if self.max_score > 0 else 0.0,
            passed=self.passed,
            not_graded=self.skipped,
            unreadable=self.unreadable,
            solution_notebook=self.solution,
        )
        for exercise, result in zip(doc["exercises"], self.report.exercises, strict=True):
            exercise["status"] = entry_exercise_status(self, result)
            exercise["failure"] = "" if result.passed else failure_text(result)
        return doc


@dataclass
class Participant:
    """One participant: the snapshot of its submissions and, once graded, its notebooks.

    Attributes:
        name: the folder's name, or the notebook's stem.
        source: the entry of ``DIR`` (``alice/`` or ``zoe.ipynb``).
        submissions: its notebooks, in path order.
        entries: one per submission, once graded.
        missing: the lessons of ``--lessons`` it has no notebook of.
        problems: what went wrong beyond single notebooks (an empty or unreadable folder,
            processes left running); a crash or a timeout is on the notebooks' lines.
        outcome: ``graded``, ``timed out`` or ``crashed`` (the child process's fate).
        seconds: wall time spent grading it.
    """

    name: str
    source: str
    submissions: list[Submission] = field(default_factory=list)
    entries: list[NotebookEntry] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    outcome: str = "graded"
    seconds: float = 0.0

    @property
    def counted(self) -> list[NotebookEntry]:
        """The notebooks that count (all of them, without ``--lessons``)."""
        return [e for e in self.entries if e.counts]

    @property
    def reports(self) -> list[NotebookReport]:
        """The reports of the notebooks that count."""
        return [e.report for e in self.counted]

    @property
    def score(self) -> float:
        return float(sum(e.score for e in self.counted))

    @property
    def max_score(self) -> float:
        return float(sum(e.max_score for e in self.counted))

    @property
    def solution_submitted(self) -> bool:
        return any(e.solution is not None for e in self.counted)

    @property
    def passed(self) -> bool:
        """At least one notebook that counts, none of the lessons asked for missing, and
        every notebook that counts passes (readable, not the solution, at the pass mark)."""
        counted = self.counted
        return bool(counted) and not self.missing and all(e.passed for e in counted)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "passed": self.passed,
            "score": self.score,
            "max_score": self.max_score,
            "missing_lessons": list(self.missing),
            "solution_submitted": self.solution_submitted,
            "problems": list(self.problems),
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
            "notebooks": [e.to_dict() for e in self.entries],
        }


# ---------------------------------------------------------------------------------------
# Finding and reading the submissions
# ---------------------------------------------------------------------------------------


def _read_snapshot(path: Path, rel: str, inner: str) -> Submission:
    """Read ``path``'s bytes (a regular file no larger than the runner reads)."""
    from course_lib.course.grading.runner import MAX_NOTEBOOK_BYTES

    sub = Submission(rel=rel, inner=inner)
    try:
        info = os.stat(path)  # follows a symlink: what the participant's notebook points to
        if not stat.S_ISREG(info.st_mode):
            sub.problem = f"{rel} is not a regular file; it cannot be graded"
        elif info.st_size > MAX_NOTEBOOK_BYTES:
            sub.problem = f"{rel} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB; clear its outputs and resubmit"
        else:
            with open(path, "rb") as stream:
                data = stream.read(MAX_NOTEBOOK_BYTES + 1)
            if len(data) > MAX_NOTEBOOK_BYTES:
                sub.problem = f"{rel} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB; clear its outputs and resubmit"
            else:
                sub.data = data
    except OSError as exc:
        sub.problem = f"{rel} cannot be read: {exc.strerror or exc}"
    return sub


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _snapshot_folder(folder: Path, participant: Participant) -> None:
    """Read every ``*.ipynb`` under ``folder`` (hidden folders and files left out)."""
    errors: list[OSError] = []
    others: list[str] = []
    found: list[tuple[str, Path]] = []
    for here, dirs, files in os.walk(folder, onerror=errors.append, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in sorted(files):
            path = Path(here) / name
            inner = path.relative_to(folder).as_posix()
            if name.endswith(".ipynb") and not _hidden(name):
                found.append((inner, path))
            else:
                others.append(inner)
    for inner, path in found:
        participant.submissions.append(_read_snapshot(path, f"{participant.name}/{inner}", inner))
    for exc in errors:
        where = Path(exc.filename).relative_to(folder.parent).as_posix() if exc.filename else participant.source
        participant.problems.append(f"{where} cannot be read: {exc.strerror or exc}")
    if not found and not errors:
        what = "it is empty" if not others else "it holds only " + _listing(others)
        participant.problems.append(f"no notebooks in {participant.source} ({what})")


def _listing(names: Sequence[str], most: int = 4) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def discover(root: Path) -> tuple[list[Participant], list[str]]:
    """Find the participants of ``root`` and read (snapshot) all their notebooks.

    Returns:
        The participants, sorted by name, and the top-level entries that are neither a
        folder nor a notebook (left out).

    Raises:
        UsageError: ``root`` is missing, not a folder, unreadable, or holds no submission.
    """
    if not root.exists():
        raise UsageError(f"{root}: no such folder")
    if not root.is_dir():
        raise UsageError(
            f"{root} is a file, not a folder; give the folder that holds one subfolder or notebook per participant"
        )
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        raise UsageError(f"{root} cannot be read: {exc.strerror or exc}") from None
    participants: list[Participant] = []
    ignored: list[str] = []
    for entry in entries:
        if _hidden(entry.name):
            continue
        try:
            is_dir = entry.is_dir()
        except OSError:
            is_dir = False
        if is_dir:
            participant = Participant(name=entry.name, source=f"{entry.name}/")
            _snapshot_folder(Path(entry.path), participant)
        elif entry.name.endswith(".ipynb"):
            participant = Participant(name=entry.name.removesuffix(".ipynb"), source=entry.name)
            participant.submissions.append(_read_snapshot(Path(entry.path), entry.name, entry.name))
        else:
            ignored.append(entry.name)
            continue
        participants.append(participant)
    if not participants:
        held = f"it holds only {_listing(ignored)}" if ignored else "it is empty"
        raise UsageError(f"{root} holds no submissions: expected one subfolder or .ipynb file per participant ({held})")
    names = Counter(p.name for p in participants)
    for participant in participants:  # a folder `zoe` and a file `zoe.ipynb`: the file keeps its suffix
        if names[participant.name] > 1 and not participant.source.endswith("/"):
            participant.name = participant.source
    participants.sort(key=lambda p: (p.name.casefold(), p.name))
    return participants, ignored


# ---------------------------------------------------------------------------------------
# Options and checks of the command line
# ---------------------------------------------------------------------------------------


def parse_lessons(values: Sequence[str] | None) -> tuple[str, ...] | None:
    """``--lessons`` values (each comma-separated) as lesson ids, in course order.

    Raises:
        UsageError: a name that is no lesson, or no name at all.
    """
    if values is None:
        return None
    from course_lib.course.catalog import get_lesson

    names = [name.strip() for value in values for name in value.split(",")]
    if not any(names):
        raise UsageError("--lessons: no lesson given; name them, e.g. --lessons 00,01,02")
    ids: set[str] = set()
    for name in names:
        if not name:
            continue
        try:
            ids.add(get_lesson(name).id)
        except KeyError as exc:
            raise UsageError(f"--lessons: {exc.args[0]}") from None
    return tuple(sorted(ids))


def lesson_number(lesson_id: str) -> str:
    """``00_welcome`` -> ``00`` (how the tables and messages name a lesson)."""
    return lesson_id.split("_", 1)[0]


@dataclass(frozen=True)
class ClassOptions:
    """How to grade the class: the runner's options, the lessons that count, and the
    participant time limit.

    ``lessons`` None means every notebook counts; ``participant_timeout`` None means
    :func:`participant_limit`'s default.
    """

    lesson: str | None = None
    lessons: tuple[str, ...] | None = None
    pass_mark: float = DEFAULT_PASS_MARK
    cell_timeout: float = 60.0
    total_timeout: float = 300.0
    check_timeout: float = 10.0
    participant_timeout: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClassOptions:
        """The options of a parsed ``course grade-class`` command line.

        Raises:
            UsageError: an unknown lesson in ``--lessons`` or ``--lesson``, or both given.
        """
        lessons = parse_lessons(args.lessons)
        if args.lesson is not None:
            from course_lib.course.catalog import get_lesson

            try:
                get_lesson(args.lesson)
            except KeyError as exc:
                raise UsageError(f"--lesson: {exc.args[0]}") from None
            if lessons is not None:
                raise UsageError(
                    "--lesson and --lessons cannot be combined: --lesson grades every notebook as that one lesson, "
                    "--lessons grades only the notebooks of the lessons it names"
                )
        return cls(
            lesson=args.lesson,
            lessons=lessons,
            pass_mark=args.pass_mark,
            cell_timeout=args.cell_timeout,
            total_timeout=args.total_timeout,
            check_timeout=args.check_timeout,
            participant_timeout=args.participant_timeout,
        )

    def runner_options(self) -> dict[str, Any]:
        """The :class:`course_lib.course.grading.runner.GradeOptions` fields, as JSON."""
        return {
            "lesson": self.lesson,
            "pass_mark": self.pass_mark,
            "cell_timeout": self.cell_timeout,
            "total_timeout": self.total_timeout,
            "check_timeout": self.check_timeout,
        }


def participant_limit(options: ClassOptions, notebooks: int) -> float:
    """Seconds a participant's grading may take before it is stopped.

    ``--participant-timeout`` if given; otherwise the runner's own bound per notebook
    (total timeout, the checks' grace, the watchdog's slack) plus ``PER_NOTEBOOK_SLACK_S``,
    times the number of notebooks, plus ``STARTUP_SLACK_S``.
    """
    if options.participant_timeout is not None:
        return options.participant_timeout
    from course_lib.course.grading.runner import GRADING_GRACE_S, WATCHDOG_SLACK_S

    per_notebook = (
        options.total_timeout + min(options.cell_timeout, GRADING_GRACE_S) + WATCHDOG_SLACK_S + PER_NOTEBOOK_SLACK_S
    )
    return max(1, notebooks) * per_notebook + STARTUP_SLACK_S


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_export(target: str, root: Path, flag: str) -> Path:
    """Refuse an export path that cannot be written, or lies inside ``root``.

    Creates nothing: the file is written once grading is done.

    Raises:
        UsageError: with a one-line reason.
    """
    path = Path(target).expanduser().resolve()
    if _inside(path, root.resolve()):
        raise UsageError(
            f"{flag} {target} lies inside the submissions folder {root}, which is never written to; write it elsewhere"
        )
    if path.is_dir():
        raise UsageError(f"cannot write {flag} {target}: it is a folder")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise UsageError(f"cannot write {flag} {target}: permission denied")
        return path
    ancestor = next(p for p in path.parents if p.exists())
    if not ancestor.is_dir():
        raise UsageError(f"cannot write {flag} {target}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write {flag} {target}: no permission to create files in {ancestor}")
    return path


# ---------------------------------------------------------------------------------------
# The child process: grade one participant's copies, one event line per step
# ---------------------------------------------------------------------------------------


def _die_with_parent(parent: int) -> None:
    """Linux: get SIGKILL when the grader dies; everywhere: exit if it is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        raise SystemExit(3)


def _emit(stream: IO[str], record: dict[str, Any]) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()


def worker_main(argv: Sequence[str]) -> int:
    """The child's entry point: grade the notebooks its spec file lists, in order.

    For each it appends ``{"event": "start", "index": i}`` and then
    ``{"event": "report", "index": i, "report": {...}}`` to the spec's events file, so the
    grader keeps what was graded even if this process is killed midway.
    """
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    _die_with_parent(int(spec["parent"]))
    from course_lib.course.grading.runner import GradeOptions, grade_notebook

    options = GradeOptions(**spec["options"])
    with open(spec["events"], "a", encoding="utf-8") as stream:
        for index, path in enumerate(spec["notebooks"]):
            _emit(stream, {"event": "start", "index": index})
            try:
                report = grade_notebook(path, options)
            except Exception as exc:
                report = NotebookReport(path=str(path), lesson=None, pass_mark=options.pass_mark)
                report.error = f"internal grader error: {type(exc).__name__}: {exc}"
            _emit(stream, {"event": "report", "index": index, "report": report.to_dict()})
    return 0


# ---------------------------------------------------------------------------------------
# Processes: what a participant's grading left running
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """Linux: make this process the child subreaper while grading, so whatever a
    submission leaves running (even after ``setsid``) stays our descendant and is killed."""
    prctl = None
    previous = 0
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            prctl = ctypes.CDLL(None, use_errno=True).prctl
            value = ctypes.c_int(0)
            prctl(37, ctypes.byref(value))  # PR_GET_CHILD_SUBREAPER
            previous = value.value
            prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            prctl = None
    try:
        yield
    finally:
        if prctl is not None:
            prctl(36, previous)


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def _kill_all(procs: Sequence[Any]) -> int:
    """SIGKILL ``procs`` and wait for them; returns how many were still running."""
    import psutil

    running = 0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE:
                running += 1
            proc.kill()
    psutil.wait_procs(list(procs), timeout=5)
    return running


def stop_leftovers(before: set[int]) -> int:
    """Kill this process's descendants that are not in ``before`` (and reap them).

    Returns:
        How many were still running.
    """
    killed = 0
    for _ in range(10):  # a process may fork while we kill its parent: look again
        procs = [p for p in _descendants(os.getpid()) if p.pid not in before]
        if not procs:
            break
        killed += _kill_all(procs)
    return killed


def _stop_child(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child, its process group and every descendant (kernels run in their own session)."""
    below = _descendants(proc.pid)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    _kill_all(below)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def child_environment(root: Path, private: Path, work: Path) -> dict[str, str]:
    """The child's environment: the grader's, less every variable that names ``root``
    (or the grader's working folder, ``PWD``, ``OLDPWD``), with private temporary,
    IPython and Jupyter runtime folders, and the course library on ``PYTHONPATH``."""
    import course_lib

    hidden = {str(root), str(root.resolve()), os.getcwd()}
    patterns = [re.compile(re.escape(h) + r"(?![\w.\-])") for h in hidden if h not in ("", os.sep)]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("PWD", "OLDPWD") and not any(p.search(value) for p in patterns)
    }
    for key, sub in (("TMPDIR", "tmp"), ("IPYTHONDIR", "ipython"), ("JUPYTER_RUNTIME_DIR", "runtime")):
        folder = private / sub
        folder.mkdir(mode=0o700, exist_ok=True)
        env[key] = str(folder)
    env["PWD"] = str(work)
    library = str(Path(course_lib.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([library, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


# ---------------------------------------------------------------------------------------
# Grading one participant
# ---------------------------------------------------------------------------------------


@functools.cache
def solution_digests() -> dict[str, str]:
    """The SHA-256 of each of the course's solution notebooks -> its path (``solutions/00_welcome.ipynb``);
    empty if the checkout cannot be found."""
    from course_lib.course.paths import repo_root

    try:
        folder = repo_root() / "solutions"
    except FileNotFoundError:
        return {}
    digests: dict[str, str] = {}
    for path in sorted(folder.glob("*.ipynb")):
        with contextlib.suppress(OSError):
            digests[hashlib.sha256(path.read_bytes()).hexdigest()] = f"solutions/{path.name}"
    return digests


def solution_reason(data: bytes, nb: Any, digests: dict[str, str]) -> str | None:
    """Why the notebook (``data``, parsed as ``nb``) is the course's solution notebook, or None."""
    known = digests.get(hashlib.sha256(data).hexdigest())
    if known is not None:
        return f"byte for byte the course's {known}"
    metadata = getattr(nb, "metadata", None)
    course = metadata.get("course") if isinstance(metadata, dict) else None
    if isinstance(course, dict) and course.get("kind") == "solution":
        return "its metadata says course.kind = solution"
    return None


def unreadable_reason(message: str, path: str) -> str:
    """A reader's one-line problem without the path it starts with:
    ``x.ipynb is not valid JSON (...)`` -> ``not valid JSON (...)``."""
    text = " ".join(message.split())
    if path and text.startswith(path):
        text = text[len(path) :].lstrip(": ").removeprefix("is ")
    return text or "it cannot be read"


def _entry_for(
    sub: Submission, copy: Path | None, options: ClassOptions, digests: dict[str, str]
) -> tuple[NotebookEntry, bool]:
    """What the notebook is, told without running it: readable or not, its lesson and
    that lesson's exercises (at 0 points, so a crash or a timeout still lists them all),
    whether ``--lessons`` leaves it out, whether it is the solution notebook.

    Returns:
        The entry (its report is the template of the grading) and whether to grade it.
    """
    from course_lib.course.grading.lessons import exercises_for
    from course_lib.course.grading.runner import NotebookProblem, load_notebook, resolve_lesson

    report = NotebookReport(path=sub.rel, lesson=None, pass_mark=options.pass_mark)
    entry = NotebookEntry(report)
    nb = None
    if copy is None:
        entry.unreadable = unreadable_reason(sub.problem or f"{sub.rel} cannot be read", sub.rel)
    else:
        try:
            nb = load_notebook(copy)
        except NotebookProblem as exc:
            entry.unreadable = unreadable_reason(str(exc), str(copy))
        except Exception as exc:  # nested deep enough to exhaust the JSON parser, ...
            entry.unreadable = f"it cannot be parsed ({type(exc).__name__})"
    lesson_id: str | None = None
    lesson_problem: str | None = None
    try:
        lesson_id, lesson_problem = resolve_lesson(Path(sub.inner), nb, options.lesson)
    except Exception as exc:
        lesson_problem = f"its lesson cannot be told ({type(exc).__name__})"
    report.lesson = lesson_id
    if options.lessons is not None:
        if lesson_id is None:
            why = "" if entry.unreadable is not None or lesson_problem is None else f": {lesson_problem}"
            entry.skipped = f"not graded (its lesson cannot be told, so it is none of --lessons{why})"
            return entry, False
        if lesson_id not in options.lessons:
            entry.skipped = f"not graded (lesson {lesson_number(lesson_id)} not in --lessons)"
            return entry, False
    if lesson_id is not None:
        with contextlib.suppress(Exception):  # the child reports checks that cannot be loaded
            report.exercises = [ExerciseResult(e.name, float(e.points), hint=e.hint) for e in exercises_for(lesson_id)]
    if entry.unreadable is not None:
        report.error = f"unreadable notebook: {entry.unreadable}"
        for result in report.exercises:
            result.message = f"not graded: {report.error}"
        return entry, False
    if lesson_id is None:  # what the runner would say, without starting it
        report.error = lesson_problem or f"cannot tell which lesson {Path(sub.inner).name} belongs to"
        return entry, False
    entry.solution = solution_reason(sub.data or b"", nb, digests)
    return entry, True


def _not_graded(template: NotebookReport, why: str) -> NotebookReport:
    report = NotebookReport(path=template.path, lesson=template.lesson, pass_mark=template.pass_mark, error=why)
    report.exercises = [
        ExerciseResult(e.name, e.points, hint=e.hint, message=f"not graded: {why}") for e in template.exercises
    ]
    return report


def merge_report(template: NotebookReport, data: Any, paths: dict[str, str] | None = None) -> NotebookReport:
    """The child's JSON report of one notebook, read onto ``template``.

    The exercise list (names, points) and the lesson come from ``template``, which the
    grader told itself; a report that disagrees is an error, and scores follow from
    ``passed`` (all or nothing, as the runner grades). In every message each key of
    ``paths`` (the private copy's path) is replaced by its value (the path in ``DIR``).
    """

    def text(value: Any) -> str:
        out = str(value)
        for old, new in (paths or {}).items():
            out = out.replace(old, new)
        return out

    if not isinstance(data, dict):
        return _not_graded(template, "the grading process wrote a malformed report")
    report = NotebookReport(path=template.path, lesson=template.lesson, pass_mark=template.pass_mark)
    error = data.get("error")
    report.error = text(error) if error else None
    notes = data.get("notes")
    report.notes = [text(n) for n in notes] if isinstance(notes, list) else []
    with contextlib.suppress(TypeError, ValueError):
        report.seconds = float(data.get("seconds") or 0.0)
    if data.get("lesson") != template.lesson:
        return _not_graded(template, f"the grading report names lesson {data.get('lesson')!r}, not {template.lesson!r}")
    exercises = data.get("exercises")
    got = {e.get("name"): e for e in exercises if isinstance(e, dict)} if isinstance(exercises, list) else {}
    for t in template.exercises:
        result = ExerciseResult(t.name, t.points, hint=t.hint)
        e = got.get(t.name)
        if e is None:
            result.message = "not graded: missing from the grading report"
        else:
            result.passed = e.get("passed") is True
            result.score = t.points if result.passed else 0.0
            result.message = text(e.get("message") or "")
            checks = e.get("checks")
            if isinstance(checks, list):
                result.checks = [{str(k): text(v) for k, v in c.items()} for c in checks if isinstance(c, dict)]
        report.exercises.append(result)
    return report


def _read_events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    with open(path, "rb") as stream:
        raw = stream.read(MAX_EVENTS_BYTES)
    events = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError, RecursionError):
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("index"), int):
                events.append(record)
    return events


def _log_tail(path: Path) -> str:
    with contextlib.suppress(OSError):
        with open(path, "rb") as stream:
            stream.seek(max(0, path.stat().st_size - 4096))
            lines = [ln.strip() for ln in stream.read().decode("utf-8", errors="replace").splitlines() if ln.strip()]
        if lines:
            return lines[-1] if len(lines[-1]) <= 160 else lines[-1][:157] + "..."
    return ""


def _remove(folder: Path) -> bool:
    """Remove a private folder even if the submission made parts of it read-only."""
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        for here, dirs, _ in os.walk(folder):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(Path(here) / name, 0o700)
        shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


@dataclass
class _ChildRun:
    events: list[dict[str, Any]]
    returncode: int | None
    timed_out: bool
    log_tail: str
    leftovers: int


def _run_child(
    private: Path,
    work: Path,
    env: dict[str, str],
    copies: list[Path],
    options: ClassOptions,
    limit: float,
    before: set[int],
) -> _ChildRun:
    """Grade ``copies`` in a child process under ``limit`` seconds; then kill whatever is left."""
    out = private / "out"
    out.mkdir(mode=0o700)
    spec, events, log = out / "spec.json", out / "events.jsonl", out / "child.log"
    spec.write_text(
        json.dumps(
            {
                "parent": os.getpid(),
                "notebooks": [str(c) for c in copies],
                "options": options.runner_options(),
                "events": str(events),
            }
        ),
        encoding="utf-8",
    )
    timed_out = False
    with open(log, "wb") as log_stream:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _WORKER_CODE, str(spec)],
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_stream,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:  # also on Ctrl-C: nothing of this participant's outlives its turn
        if proc.poll() is None:
            _stop_child(proc)
        leftovers = stop_leftovers(before)
    return _ChildRun(_read_events(events), proc.returncode, timed_out, _log_tail(log), leftovers)


def grade_participant(participant: Participant, root: Path, options: ClassOptions, before: set[int]) -> None:
    """Grade ``participant`` from its snapshot, in a private folder, by a child process."""
    started = time.monotonic()
    private = Path(tempfile.mkdtemp(prefix="course-grade-class-"))
    try:
        _grade_in(participant, root, options, before, private)
    finally:
        if not _remove(private):
            participant.problems.append(f"its temporary folder {private} could not be removed")
        participant.seconds = time.monotonic() - started


def _grade_in(participant: Participant, root: Path, options: ClassOptions, before: set[int], private: Path) -> None:
    work = private / "work" / participant.name
    work.mkdir(parents=True)
    digests = solution_digests()
    to_grade: list[tuple[NotebookEntry, Path]] = []
    for sub in participant.submissions:
        copy = None
        if sub.data is not None:
            copy = work / sub.inner
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(sub.data)
        entry, grade = _entry_for(sub, copy, options, digests)
        if sub.data is not None:
            sub.data = b""  # the copy is all that is needed now: release the memory
        participant.entries.append(entry)
        if grade and copy is not None:
            to_grade.append((entry, copy))
        elif copy is not None:
            copy.unlink()  # not run: the kernels need not see it
    if to_grade:
        copies = [copy for _, copy in to_grade]
        templates = [entry.report for entry, _ in to_grade]
        limit = participant_limit(options, len(copies))
        run = _run_child(private, work, child_environment(root, private, work), copies, options, limit, before)
        paths = {str(c): t.path for c, t in zip(copies, templates, strict=True)}
        paths[str(work)] = participant.source.rstrip("/")
        for (entry, _), report in zip(to_grade, _collect(participant, templates, run, limit, paths), strict=True):
            entry.report = report
    if options.lessons is not None:
        handed_in = {e.report.lesson for e in participant.counted}
        participant.missing = [lesson for lesson in options.lessons if lesson not in handed_in]


def _collect(
    participant: Participant, templates: list[NotebookReport], run: _ChildRun, limit: float, paths: dict[str, str]
) -> list[NotebookReport]:
    """Each template's report from the child's events, or why it has none."""
    reports: dict[int, Any] = {}
    started: set[int] = set()
    for event in run.events:
        if event.get("event") == "report":
            reports[event["index"]] = event.get("report")
        elif event.get("event") == "start":
            started.add(event["index"])
    if run.timed_out:
        stopped = f"timed out: grading ran past the {limit:g} s participant time limit and was stopped"
        participant.outcome = "timed out"
    elif run.returncode != 0:
        from course_lib.runtime.processes import exit_reason

        stopped = (
            f"crashed: the grading process died ({exit_reason(run.returncode)}); did the submission kill its "
            "parent process, or exhaust memory?" + (f" Last output: {run.log_tail}" if run.log_tail else "")
        )
        participant.outcome = "crashed"
    else:
        stopped = "the grading process ended without a report" + (
            f" (last output: {run.log_tail})" if run.log_tail else ""
        )
    if run.leftovers:
        many = run.leftovers > 1
        participant.problems.append(
            f"{run.leftovers} process{'es' if many else ''} it started {'were' if many else 'was'} still running "
            f"after grading and {'were' if many else 'was'} killed"
        )
    out = []
    for index, template in enumerate(templates):
        if index in reports:
            out.append(merge_report(template, reports[index], paths))
        elif index in started:
            out.append(_not_graded(template, f"{stopped} (while grading this notebook)"))
        else:
            out.append(_not_graded(template, f"{stopped} (before this notebook)"))
    return out


# ---------------------------------------------------------------------------------------
# Tables and exports
# ---------------------------------------------------------------------------------------

_CHECK_STATUS = {"fail": "failed", "error": "error", "timeout": "timeout", "not_implemented": "not implemented"}
_UNDEFINED = re.compile(r"`[^`]+` is not defined")
#: The statuses of an answer that failed on its own account: the CSV gives them a hint.
HINTED = frozenset({"failed", "error", "timeout", "not implemented", "not defined"})


def exercise_status(result: ExerciseResult) -> str:
    """What became of one exercise: ``passed``, ``failed`` (a wrong answer), ``not implemented``
    (the stub), ``error`` (it raised, or the cell defining it did), ``timeout``, ``not defined``
    (no cell defines it) or ``not graded`` (the notebook could not be graded: it crashed
    its grader, ran past a time limit of the whole notebook, is another lesson's, ...)."""
    if result.passed:
        return "passed"
    for check in result.checks:
        status = check.get("status")
        if status not in ("pass", "skipped"):
            return _CHECK_STATUS.get(str(status), "error")
    message = " ".join(result.message.split())
    if message == NOT_IMPLEMENTED:
        return "not implemented"
    if message.startswith("not graded"):
        return "not graded"
    if _UNDEFINED.match(message):
        if "the cell defining it" not in message:
            return "not defined"
        return "timeout" if "time limit" in message else "error"
    return "failed"


def entry_exercise_status(entry: NotebookEntry, result: ExerciseResult) -> str:
    """:func:`exercise_status`, or what the whole notebook is (``not graded``, ``unreadable``,
    ``solution notebook``)."""
    return exercise_status(result) if entry.status == "graded" else entry.status


def failure_text(result: ExerciseResult) -> str:
    """The failure of one exercise without the description of the check the report puts
    before it (``returns a float array ...: f(...) has 3 values ...`` -> ``f(...) has 3 values ...``)."""
    message = " ".join(result.message.split())
    for check in result.checks:
        if check.get("status") in ("pass", "skipped"):
            continue
        description = " ".join(str(check.get("description", "")).split())
        if description and message.startswith(description + ": "):
            return message[len(description) + 2 :] or message
        break
    return message or "failed"


def notebook_problems(report: NotebookReport) -> list[str]:
    """What went wrong in one notebook, most important first: the error, the failed
    exercises (``name: failure``, those failing alike grouped), then the notes."""
    out = [report.error] if report.error else []
    by_failure: dict[str, list[str]] = {}
    for e in report.exercises:
        if not e.passed and not (report.error and e.message == f"not graded: {report.error}"):
            by_failure.setdefault(failure_text(e), []).append(e.name)
    out += [f"{', '.join(names)}: {failure}" for failure, names in by_failure.items()]
    return out + list(report.notes)


def entry_problems(entry: NotebookEntry) -> list[str]:
    """:func:`notebook_problems`, led by what the notebook is when not simply graded."""
    unreadable = [f"unreadable notebook: {entry.unreadable}"] if entry.unreadable is not None else []
    if entry.skipped is not None:
        return [*unreadable, entry.skipped]
    if unreadable:
        return unreadable
    out = notebook_problems(entry.report)
    if entry.solution is not None:
        graded = f"{format_points(entry.report.score)}/{format_points(entry.report.max_score)}"
        out.insert(
            0, f"submitted the solution notebook ({entry.solution}): not counted as passed (its grading gave {graded})"
        )
    return out


def _wrap(text: str, width: int) -> list[str]:
    return textwrap.wrap(
        cut_text(text, MAX_PROBLEM_CHARS), width, subsequent_indent="  ", break_long_words=True, break_on_hyphens=False
    ) or [""]


#: A table row: its fixed cells, and the items of its last column (wrapped, one after the other).
Row = tuple[tuple[str, ...], list[str]]


def format_table(header: Sequence[str], rows: Sequence[Row], width: int = DEFAULT_WIDTH) -> list[str]:
    """Columns padded to their widest cell; the last one's items wrapped to what is left of
    ``width`` (at least ``MIN_WRAP``), each on lines of its own, indented when continued."""
    fixed = len(header) - 1
    widths = [max([len(header[i]), *(len(cells[i]) for cells, _ in rows)]) for i in range(fixed)]
    room = max(MIN_WRAP, width - 2 - sum(w + 2 for w in widths))
    wrapped = [[line for item in items for line in _wrap(item, room)] or [""] for _, items in rows]
    widths.append(max([len(header[-1]), *(len(line) for lines in wrapped for line in lines)]))

    def line(cells: Sequence[str]) -> str:
        return ("  " + "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip()

    out = [line(header), line(["-" * w for w in widths])]
    for (cells, _), lines in zip(rows, wrapped, strict=True):
        out.append(line([*cells, lines[0]]))
        out += [line([*([""] * fixed), text]) for text in lines[1:]]
    return out


def _number_ranges(numbers: Sequence[str]) -> str:
    """``["01", "02", "03", "05"]`` -> ``01-03,05``."""
    values = sorted({int(n) for n in numbers})
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][-1] + 1:
            runs[-1].append(value)
        else:
            runs.append([value])
    return ",".join(f"{r[0]:02d}-{r[-1]:02d}" if len(r) > 2 else ",".join(f"{v:02d}" for v in r) for r in runs)


PARTICIPANT_HEADER = ("participant", "verdict", "notebook", "lesson", "points", "result", "problems")


def participant_rows(participants: Sequence[Participant]) -> list[Row]:
    """Per participant: a row of its own problems (lessons of ``--lessons`` it has no
    notebook of, an empty folder, processes left running) if any, one row per notebook
    that counts or could not be placed, and one row for the notebooks ``--lessons`` left out.
    The participant's name and verdict are on its first row only."""
    rows: list[Row] = []
    for p in participants:
        mine: list[Row] = []
        own = [f"no notebook of lesson {lesson_number(lesson)}" for lesson in p.missing] + p.problems
        if own or not p.entries:
            mine.append((("-", "-", "-", "-"), own or ["nothing graded"]))
        left_out = [e for e in p.entries if e.skipped is not None and e.report.lesson is not None]
        for e in p.entries:
            if e.skipped is not None and e.report.lesson is not None:
                continue
            r = e.report
            counted = e.counts
            mine.append(
                (
                    (
                        r.path.removeprefix(f"{p.name}/"),
                        lesson_number(r.lesson) if r.lesson else "?",
                        f"{format_points(e.score)}/{format_points(e.max_score)}" if counted else "-",
                        ("PASS" if e.passed else "FAIL") if counted else "-",
                    ),
                    entry_problems(e),
                )
            )
        if left_out:
            numbers = sorted({lesson_number(e.report.lesson or "") for e in left_out})
            what = (
                left_out[0].report.path.removeprefix(f"{p.name}/")
                if len(left_out) == 1
                else f"{len(left_out)} notebooks"
            )
            lessons = f"lesson{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}"
            mine.append(((what, _number_ranges(numbers), "-", "-"), [f"not graded ({lessons} not in --lessons)"]))
        for i, (cells, problems) in enumerate(mine):
            lead = (p.name, "PASS" if p.passed else "FAIL") if i == 0 else ("", "")
            rows.append(((*lead, *cells), problems))
    return rows


@dataclass
class ExerciseStats:
    """How the class did on one exercise: every participant counted once (its best
    notebook of the lesson), those without a readable one of it included.

    Attributes:
        participants: every participant of the class.
        passed: those whose notebook passes it.
        not_attempted: those who left the stub as it was ("not implemented yet"), or handed
            in the solution notebook.
        not_graded: those whose notebook of the lesson could not be graded (unreadable, it
            crashed its grader or ran past a time limit of the whole notebook, ...), or who
            have an unreadable notebook of no lesson that can be told and none of this one.
        no_notebook: those with no notebook of the lesson (the "missing" column).
        failures: the failures of the answers attempted and graded that did not pass, by text.
    """

    lesson: str
    exercise: str
    max_points: float
    participants: int = 0
    passed: int = 0
    not_attempted: int = 0
    not_graded: int = 0
    no_notebook: int = 0
    total_points: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def mean_points(self) -> float:
        return self.total_points / self.participants if self.participants else 0.0

    @property
    def failed(self) -> int:
        """How many attempted answers failed."""
        return sum(self.failures.values())

    @property
    def common_failure(self) -> tuple[str, int]:
        """The most frequent failure of the attempted answers; among equals, the first in
        alphabetical order. ``("", 0)`` when none failed."""
        if not self.failures:
            return "", 0
        return min(self.failures.items(), key=lambda item: (-item[1], item[0]))

    def to_dict(self) -> dict[str, Any]:
        message, count = self.common_failure
        return {
            "lesson": self.lesson,
            "exercise": self.exercise,
            "max_points": self.max_points,
            "participants": self.participants,
            "passed": self.passed,
            "mean_points": round(self.mean_points, 6),
            "not_attempted": self.not_attempted,
            "not_graded": self.not_graded,
            "no_notebook": self.no_notebook,
            "failed_attempts": self.failed,
            "common_failure": message,
            "common_failure_count": count,
        }


def _exercises_of(lesson: str, participants: Sequence[Participant]) -> list[tuple[str, float]]:
    """The exercises of ``lesson`` (name, points), in the lesson's order."""
    for p in participants:
        for e in p.counted:
            if e.report.lesson == lesson and e.report.exercises:
                return [(x.name, x.points) for x in e.report.exercises]
    from course_lib.course.grading.lessons import exercises_for

    with contextlib.suppress(Exception):
        return [(x.name, float(x.points)) for x in exercises_for(lesson)]
    return []


def class_lessons(participants: Sequence[Participant], lessons: Sequence[str] | None = None) -> list[str]:
    """``lessons`` (``--lessons``) if given, else every lesson of a notebook that counts."""
    if lessons is not None:
        return list(lessons)
    return sorted({e.report.lesson for p in participants for e in p.counted if e.report.lesson})


def exercise_stats(participants: Sequence[Participant], lessons: Sequence[str] | None = None) -> list[ExerciseStats]:
    """Per exercise of each lesson of :func:`class_lessons`, in the lesson's order: see
    :class:`ExerciseStats`. Every participant counts in every lesson's exercises."""
    out: list[ExerciseStats] = []
    for lesson in class_lessons(participants, lessons):
        stats = [ExerciseStats(lesson, name, points) for name, points in _exercises_of(lesson, participants)]
        for p in participants:
            mine = [e for e in p.counted if e.report.lesson == lesson]
            # a notebook that cannot be read nor placed in a lesson may be this lesson's
            unplaced = any(e.unreadable is not None and e.report.lesson is None for e in p.entries)
            answers = [e for e in mine if e.status == "graded"]
            for s in stats:
                s.participants += 1
                results = [r for e in answers for r in e.report.exercises if r.name == s.exercise]
                s.total_points += max((r.score for r in results), default=0.0)
                statuses = {exercise_status(r) for r in results}
                if "passed" in statuses:
                    s.passed += 1
                elif statuses - {"not implemented", "not graded"}:
                    failed = next(r for r in results if exercise_status(r) not in ("not implemented", "not graded"))
                    s.failures[failure_text(failed)] += 1
                elif "not implemented" in statuses or any(e.solution is not None for e in mine):
                    s.not_attempted += 1
                elif "not graded" in statuses or mine or unplaced:
                    s.not_graded += 1
                else:
                    s.no_notebook += 1
        out += stats
    return out


EXERCISE_HEADER = (
    "lesson",
    "exercise",
    "passed",
    "mean",
    "not attempted",
    "not graded",
    "missing",
    "most common failure",
)


def exercise_rows(stats: Sequence[ExerciseStats]) -> list[Row]:
    rows: list[Row] = []
    for s in stats:
        message, count = s.common_failure
        rows.append(
            (
                (
                    lesson_number(s.lesson),
                    s.exercise,
                    f"{s.passed}/{s.participants}",
                    f"{s.mean_points:.1f}/{format_points(s.max_points)}",
                    str(s.not_attempted),
                    str(s.not_graded),
                    str(s.no_notebook),
                ),
                [f"{count}/{s.failed}: {message}"] if count else [],
            )
        )
    return rows


def pass_rule(options: ClassOptions) -> str:
    """The rule that decides whether a participant passes, in one sentence."""
    mark = f"the pass mark ({options.pass_mark:.0%} of its points)"
    if options.lessons is not None:
        many = len(options.lessons) > 1
        names = ", ".join(lesson_number(lesson) for lesson in options.lessons)
        which = "each of lessons" if many else "lesson"
        core = (
            f"hand in a notebook of {which} {names} (--lessons) and every notebook of "
            f"{'those lessons' if many else 'that lesson'} reaches {mark}; notebooks of other lessons are not graded "
            "and do not count"
        )
    elif options.lesson is not None:
        core = (
            f"hand in at least one notebook and every notebook, each graded as lesson {options.lesson} (--lesson), "
            f"reaches {mark}"
        )
    else:
        core = f"hand in at least one notebook and every notebook handed in reaches {mark}"
    return (
        f"Pass rule: a participant passes when they {core}. An unreadable notebook fails; "
        "a solution notebook handed in is not counted as passed."
    )


def _paragraph(text: str, width: int) -> list[str]:
    return textwrap.wrap(text, max(MIN_WRAP, width - 2), initial_indent="  ", subsequent_indent="    ")


def render_class(
    participants: Sequence[Participant],
    stats: Sequence[ExerciseStats],
    options: ClassOptions,
    width: int = DEFAULT_WIDTH,
) -> str:
    """Both tables, what the exercise table's columns count, the pass rule and the
    summary line, as plain text no wider than ``width`` where words allow."""
    lines = ["Participants"]
    lines += format_table(PARTICIPANT_HEADER, participant_rows(participants), width)
    lines += _paragraph("verdict: the participant's (the pass rule below); result: the notebook's.", width)
    if stats:
        lines += ["", "Exercises (each participant counted once: its best notebook of the lesson)"]
        lines += format_table(EXERCISE_HEADER, exercise_rows(stats), width)
        lines += _paragraph(
            "mean: points per participant. not attempted: the stub left as it was (not implemented yet), or the "
            "solution notebook handed in. not graded: the notebook could not be graded (unreadable, crashed, over a "
            "time limit of the whole notebook, another lesson's). missing: no notebook of the lesson. most common "
            "failure: among the answers attempted that failed, how many gave it / how many failed; equals in "
            "alphabetical order.",
            width,
        )
    passed = sum(p.passed for p in participants)
    lines += ["", *textwrap.wrap(pass_rule(options), max(MIN_WRAP, width))]
    summary = f"{passed}/{len(participants)} participants passed."
    solutions = [p.name for p in participants if p.solution_submitted]
    if solutions:
        summary += f" Handed in the solution notebook: {', '.join(solutions)}."
    lines.append(summary)
    return "\n".join(lines)


CSV_COLUMNS = (
    "participant",
    "notebook",
    "lesson",
    "exercise",
    "points",
    "max_points",
    "passed",
    "status",
    "message",
    "hint",
)


def to_csv(participants: Sequence[Participant]) -> str:
    """One row per participant x notebook x exercise. A notebook without exercises (not
    graded, unreadable, of no lesson) gets one row with an empty exercise and the reason; a
    lesson of ``--lessons`` a participant has no notebook of, one row of status ``no
    notebook``; so does a participant without any notebook."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for p in participants:
        for i, lesson in enumerate(p.missing):
            message = f"no notebook of lesson {lesson_number(lesson)}"
            if i == 0 and not p.entries and p.problems:
                message += "; " + "; ".join(p.problems)
            writer.writerow((p.name, "", lesson, "", 0, 0, False, "no notebook", message, ""))
        if not p.entries and not p.missing:
            writer.writerow((p.name, "", "", "", 0, 0, False, "no notebook", "; ".join(p.problems), ""))
        for entry in p.entries:
            r = entry.report
            if not r.exercises or not entry.counts:
                problems = "; ".join(entry_problems(entry))
                writer.writerow((p.name, r.path, r.lesson or "", "", 0, 0, False, entry.status, problems, ""))
                continue
            for e in r.exercises:
                status = entry_exercise_status(entry, e)
                if entry.solution is not None:
                    message = f"submitted the solution notebook ({entry.solution})"
                elif entry.unreadable is not None:
                    message = f"unreadable notebook: {entry.unreadable}"
                else:
                    message = e.message if e.passed or e.message else (r.error or "")
                counted = entry.status == "graded"
                writer.writerow(
                    (
                        p.name,
                        r.path,
                        r.lesson or "",
                        e.name,
                        format_points(e.score if counted else 0.0),
                        format_points(e.points),
                        e.passed and counted,
                        status,
                        message,
                        e.hint if status in HINTED else "",
                    )
                )
    return buffer.getvalue()


def to_class_json(
    participants: Sequence[Participant],
    stats: Sequence[ExerciseStats],
    options: ClassOptions,
    ignored: Sequence[str],
) -> str:
    doc = {
        "passed": all(p.passed for p in participants),
        "pass_mark": options.pass_mark,
        "lessons": list(options.lessons) if options.lessons is not None else None,
        "pass_rule": pass_rule(options),
        "participants_passed": sum(p.passed for p in participants),
        "participants": [p.to_dict() for p in participants],
        "exercises": [s.to_dict() for s in stats],
        "ignored": list(ignored),
    }
    return json.dumps(doc, indent=2) + "\n"


def table_width() -> int:
    """The terminal's width (``COLUMNS`` if set), between ``MIN_WIDTH`` and ``MAX_WIDTH``;
    ``DEFAULT_WIDTH`` when the output is not a terminal."""
    columns = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    return min(MAX_WIDTH, max(MIN_WIDTH, columns))


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``course grade-class``'s arguments (and its epilog) to ``parser``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("dir", metavar="DIR", help="folder with one subfolder or .ipynb file per participant")
    parser.add_argument(
        "--lessons",
        action="append",
        default=None,
        metavar="LIST",
        help="grade only the notebooks of these lessons (numbers, ids or slugs, comma-separated or the option "
        "repeated: --lessons 00,01,02); the others are listed as not graded, are not run and do not count, and a "
        "participant without a notebook of one of these lessons does not pass",
    )
    parser.add_argument(
        "--lesson",
        default=None,
        help="grade every notebook as this lesson (number, id or slug); default: each notebook's metadata, "
        "else its file name",
    )
    add_limit_arguments(parser)
    parser.add_argument(
        "--participant-timeout",
        type=positive_seconds_arg,
        default=None,
        metavar="S",
        help="seconds one participant's grading may take before it is stopped and reported as timed out "
        f"(default: about (total timeout + 45 s) x notebooks graded + {STARTUP_SLACK_S:g} s)",
    )
    parser.add_argument(
        "--csv",
        metavar="FILE",
        default=None,
        help="write one row per participant x notebook x exercise (with its status and, where it failed, its hint)",
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="write the full results as JSON")


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Grade every participant of ``args.dir``; print the tables; write the exports.

    Returns:
        0 if every participant passes (:func:`pass_rule`), 1 otherwise, 2 on a usage error
        (or an export that could not be written).
    """
    root = Path(args.dir).expanduser()
    exports: list[tuple[str, Path]] = []
    try:
        options = ClassOptions.from_args(args)
        if root.is_dir():  # export paths first: a typo should not cost a whole grading run
            requested = [(flag, target) for flag, target in (("--csv", args.csv), ("--json", args.json)) if target]
            exports = [(flag, check_export(target, root, flag)) for flag, target in requested]
            if len({path for _, path in exports}) < len(exports):
                raise UsageError("--csv and --json name the same file")
        participants, ignored = discover(root)
    except UsageError as exc:
        return _error(str(exc))
    return _grade_class(root, participants, ignored, options, exports)


def _grade_class(
    root: Path,
    participants: list[Participant],
    ignored: list[str],
    options: ClassOptions,
    exports: list[tuple[str, Path]],
) -> int:
    import psutil

    if ignored:
        print(f"left out (neither a folder nor a notebook): {_listing(ignored)}")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    total = len(participants)
    with _subreaper():
        for number, participant in enumerate(participants, 1):
            print(f"[{number}/{total}] {participant.name} ...", end="", flush=True)
            grade_participant(participant, root, options, before)
            verdict = "PASS" if participant.passed else "FAIL"
            if participant.outcome != "graded":
                verdict += f" ({participant.outcome.upper()})"
            left_out = sum(not e.counts for e in participant.entries)
            print(
                f" {verdict} {format_points(participant.score)}/{format_points(participant.max_score)} "
                f"({participant.seconds:.1f} s" + (f"; {left_out} notebook(s) not graded)" if left_out else ")"),
                flush=True,
            )
    stats = exercise_stats(participants, options.lessons)
    print()
    print(render_class(participants, stats, options, table_width()), flush=True)
    status = 0 if all(p.passed for p in participants) else 1
    for flag, target in exports:
        text = to_csv(participants) if flag == "--csv" else to_class_json(participants, stats, options, ignored)
        try:
            write_text(target, text)
        except OSError as exc:
            print(f"{PROG}: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
            status = 2
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="grade a folder of participants' submissions (one subfolder or notebook each)"
    )
    add_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.course.grading.classroom DIR``: the same as ``course grade-class DIR``."""
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
