"""``course grade-class DIR``: grade a whole workshop's submissions in one command.

``DIR`` holds one entry per participant: a subfolder (the participant is the folder's
name; every ``*.ipynb`` in it is graded, recursively, leaving out hidden folders such as
``.ipynb_checkpoints``) or a single ``.ipynb`` file (the participant is its stem). Each
notebook is graded as ``course grade`` grades it (:func:`course_lib.course.grading.runner.grade_notebook`:
a fresh kernel, cell and total time limits, a watchdog); the lesson comes from the
notebook's metadata or file name, and ``--lesson`` overrides it for all.

The terminal shows a progress line per participant, then a table per participant and
notebook and a table per exercise (how many participants passed it, the mean points,
the most common failure); ``--csv`` and ``--json`` export the same. The exit status is 0
if every participant reaches the pass mark in every notebook, 1 otherwise, 2 on a usage
error. A bad submission (a stub, a crash, a timeout, an unreadable or truncated notebook,
an empty folder, a notebook of an unknown lesson) is reported on its participant's line
and never stops the run.

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
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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
#: Width of the problems column of the participant table.
PROBLEMS_WIDTH = 110
#: Width of the failure column of the exercise table.
FAILURE_WIDTH = 60

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

Exit status: 0 if every participant reaches the pass mark in every notebook, 1 if not,
2 on a usage error."""

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
class Participant:
    """One participant: the snapshot of its submissions and, once graded, its reports.

    Attributes:
        name: the folder's name, or the notebook's stem.
        source: the entry of ``DIR`` (``alice/`` or ``zoe.ipynb``).
        submissions: its notebooks, in path order.
        reports: one per submission, once graded.
        problems: what went wrong beyond single notebooks (an empty or unreadable folder,
            processes left running); a crash or a timeout is on the notebooks' lines.
        outcome: ``graded``, ``timed out`` or ``crashed`` (the child process's fate).
        seconds: wall time spent grading it.
    """

    name: str
    source: str
    submissions: list[Submission] = field(default_factory=list)
    reports: list[NotebookReport] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    outcome: str = "graded"
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return float(sum(r.score for r in self.reports))

    @property
    def max_score(self) -> float:
        return float(sum(r.max_score for r in self.reports))

    @property
    def passed(self) -> bool:
        """At least one notebook, and every notebook reaches the pass mark."""
        return bool(self.reports) and all(r.passed for r in self.reports)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "source": self.source,
            "passed": self.passed,
            "score": self.score,
            "max_score": self.max_score,
            "problems": list(self.problems),
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
            "notebooks": [r.to_dict() for r in self.reports],
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


@dataclass(frozen=True)
class ClassOptions:
    """How to grade the class: the runner's options, and the participant time limit.

    ``participant_timeout`` None means :func:`participant_limit`'s default.
    """

    lesson: str | None = None
    pass_mark: float = DEFAULT_PASS_MARK
    cell_timeout: float = 60.0
    total_timeout: float = 300.0
    check_timeout: float = 10.0
    participant_timeout: float | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ClassOptions:
        """The options of a parsed ``course grade-class`` command line."""
        return cls(
            lesson=args.lesson,
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


def _template(copy: Path, rel: str, options: ClassOptions) -> NotebookReport:
    """What the notebook is graded as (lesson, its exercises at 0 points), told without
    running it, so a crash or a timeout still lists every exercise."""
    from course_lib.course.grading.lessons import exercises_for
    from course_lib.course.grading.runner import load_notebook, resolve_lesson

    report = NotebookReport(path=rel, lesson=None, pass_mark=options.pass_mark)
    nb = None
    with contextlib.suppress(Exception):  # unreadable, or deep enough to exhaust the JSON parser
        nb = load_notebook(copy)
    with contextlib.suppress(Exception):
        lesson_id, _ = resolve_lesson(copy, nb, options.lesson)
        if lesson_id is not None:
            report.lesson = lesson_id
            report.exercises = [ExerciseResult(e.name, float(e.points), hint=e.hint) for e in exercises_for(lesson_id)]
    return report


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
    slots: list[NotebookReport | None] = []
    templates: list[NotebookReport] = []
    copies: list[Path] = []
    for sub in participant.submissions:
        if sub.data is None:
            report = NotebookReport(path=sub.rel, lesson=None, pass_mark=options.pass_mark)
            report.error = sub.problem or f"{sub.rel} cannot be read"
            slots.append(report)
            continue
        copy = work / sub.inner
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(sub.data)
        sub.data = b""  # the copy is all that is needed now: release the memory
        slots.append(None)
        templates.append(_template(copy, sub.rel, options))
        copies.append(copy)
    graded: list[NotebookReport] = []
    if copies:
        limit = participant_limit(options, len(copies))
        run = _run_child(private, work, child_environment(root, private, work), copies, options, limit, before)
        paths = {str(c): t.path for c, t in zip(copies, templates, strict=True)}
        paths[str(work)] = participant.source.rstrip("/")
        graded = _collect(participant, templates, run, limit, paths)
    iterator = iter(graded)
    participant.reports = [slot if slot is not None else next(iterator) for slot in slots]


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


def notebook_problems(report: NotebookReport) -> list[str]:
    """What went wrong in one notebook, most important first: the error, the failed
    exercises (grouped by message), then the notes."""
    out = [report.error] if report.error else []
    by_message: dict[str, list[str]] = {}
    for e in report.exercises:
        if not e.passed and not (report.error and e.message == f"not graded: {report.error}"):
            by_message.setdefault(" ".join(e.message.split()) or "failed", []).append(e.name)
    out += [f"{', '.join(names)}: {message}" for message, names in by_message.items()]
    return out + list(report.notes)


def _format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        return "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def participant_rows(participants: Sequence[Participant]) -> list[tuple[str, str, str, str, str, str]]:
    """One row per participant and notebook (one for a participant without notebooks)."""
    rows = []
    for p in participants:
        if not p.reports:
            rows.append(
                (p.name, "-", "-", "0/0", "FAIL", cut_text("; ".join(p.problems) or "nothing graded", PROBLEMS_WIDTH))
            )
        for i, r in enumerate(p.reports):
            problems = notebook_problems(r) + (p.problems if i == len(p.reports) - 1 else [])
            rows.append(
                (
                    p.name,
                    r.path.removeprefix(f"{p.name}/"),
                    r.lesson or "?",
                    f"{format_points(r.score)}/{format_points(r.max_score)}",
                    "PASS" if r.passed else "FAIL",
                    cut_text("; ".join(problems), PROBLEMS_WIDTH),
                )
            )
    return rows


@dataclass
class ExerciseStats:
    """How the class did on one exercise (each participant counted once: its best notebook)."""

    lesson: str
    exercise: str
    max_points: float
    participants: int = 0
    passed: int = 0
    total_points: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)

    @property
    def mean_points(self) -> float:
        return self.total_points / self.participants if self.participants else 0.0

    @property
    def common_failure(self) -> tuple[str, int]:
        return self.failures.most_common(1)[0] if self.failures else ("", 0)

    def to_dict(self) -> dict[str, Any]:
        message, count = self.common_failure
        return {
            "lesson": self.lesson,
            "exercise": self.exercise,
            "max_points": self.max_points,
            "participants": self.participants,
            "passed": self.passed,
            "mean_points": round(self.mean_points, 6),
            "common_failure": message,
            "common_failure_count": count,
        }


def exercise_stats(participants: Sequence[Participant]) -> list[ExerciseStats]:
    """Per exercise of every lesson graded: participants who passed it, mean points, the
    most common failure message (among participants who did not pass it)."""
    stats: dict[tuple[str, str], ExerciseStats] = {}
    for p in participants:
        best: dict[tuple[str, str], list[ExerciseResult]] = {}
        for r in p.reports:
            for e in r.exercises:
                if r.lesson is not None:
                    best.setdefault((r.lesson, e.name), []).append(e)
        for key, results in best.items():
            s = stats.setdefault(key, ExerciseStats(key[0], key[1], results[0].points))
            s.participants += 1
            s.total_points += max(e.score for e in results)
            if any(e.passed for e in results):
                s.passed += 1
            else:
                s.failures[" ".join(results[0].message.split()) or "failed"] += 1
    order: dict[tuple[str, str], int] = {}
    for p in participants:  # the lesson's own order of exercises, lessons sorted
        for r in p.reports:
            for i, e in enumerate(r.exercises):
                order.setdefault((r.lesson or "", e.name), i)
    return sorted(stats.values(), key=lambda s: (s.lesson, order.get((s.lesson, s.exercise), 0)))


def render_class(participants: Sequence[Participant], stats: Sequence[ExerciseStats], pass_mark: float) -> str:
    """Both tables and the summary line, as plain text."""
    lines = ["Participants"]
    lines += _format_table(
        ("participant", "notebook", "lesson", "points", "result", "problems"), participant_rows(participants)
    )
    if stats:
        lines += ["", "Exercises"]
        rows = []
        for s in stats:
            message, count = s.common_failure
            failure = f"{cut_text(message, FAILURE_WIDTH)} (x{count})" if count else ""
            rows.append(
                (
                    s.lesson,
                    s.exercise,
                    f"{s.passed}/{s.participants}",
                    f"{s.mean_points:.1f}/{format_points(s.max_points)}",
                    failure,
                )
            )
        lines += _format_table(("lesson", "exercise", "passed", "mean points", "most common failure"), rows)
    passed = sum(p.passed for p in participants)
    lines += [
        "",
        f"{passed}/{len(participants)} participants reached the pass mark ({pass_mark:.0%} of the points of each notebook)",
    ]
    return "\n".join(lines)


CSV_COLUMNS = ("participant", "notebook", "lesson", "exercise", "points", "max_points", "passed", "message")


def to_csv(participants: Sequence[Participant]) -> str:
    """One row per participant x notebook x exercise; a notebook with no exercises (or a
    participant with no notebook) gets one row with an empty exercise and the reason."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for p in participants:
        if not p.reports:
            writer.writerow((p.name, "", "", "", 0, 0, False, "; ".join(p.problems)))
        for r in p.reports:
            if not r.exercises:
                writer.writerow((p.name, r.path, r.lesson or "", "", 0, 0, False, "; ".join(notebook_problems(r))))
            for e in r.exercises:
                message = e.message if e.passed or e.message else (r.error or "")
                writer.writerow(
                    (
                        p.name,
                        r.path,
                        r.lesson or "",
                        e.name,
                        format_points(e.score),
                        format_points(e.points),
                        e.passed,
                        message,
                    )
                )
    return buffer.getvalue()


def to_class_json(
    participants: Sequence[Participant], stats: Sequence[ExerciseStats], pass_mark: float, ignored: Sequence[str]
) -> str:
    doc = {
        "passed": all(p.passed for p in participants),
        "pass_mark": pass_mark,
        "participants": [p.to_dict() for p in participants],
        "exercises": [s.to_dict() for s in stats],
        "ignored": list(ignored),
    }
    return json.dumps(doc, indent=2) + "\n"


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``course grade-class``'s arguments (and its epilog) to ``parser``."""
    parser.epilog = EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("dir", metavar="DIR", help="folder with one subfolder or .ipynb file per participant")
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
        f"(default: about (total timeout + 45 s) x notebooks + {STARTUP_SLACK_S:g} s)",
    )
    parser.add_argument(
        "--csv", metavar="FILE", default=None, help="write one row per participant x notebook x exercise"
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="write the full results as JSON")


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """Grade every participant of ``args.dir``; print the tables; write the exports.

    Returns:
        0 if every participant reaches the pass mark, 1 otherwise, 2 on a usage error
        (or an export that could not be written).
    """
    root = Path(args.dir).expanduser()
    options = ClassOptions.from_args(args)
    exports: list[tuple[str, Path]] = []
    try:
        if options.lesson is not None:
            from course_lib.course.catalog import get_lesson

            try:
                get_lesson(options.lesson)
            except KeyError as exc:
                raise UsageError(f"--lesson: {exc.args[0]}") from None
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
            print(
                f" {verdict} {format_points(participant.score)}/{format_points(participant.max_score)} "
                f"({participant.seconds:.1f} s)",
                flush=True,
            )
    stats = exercise_stats(participants)
    print()
    print(render_class(participants, stats, options.pass_mark), flush=True)
    status = 0 if all(p.passed for p in participants) else 1
    for flag, target in exports:
        text = (
            to_csv(participants) if flag == "--csv" else to_class_json(participants, stats, options.pass_mark, ignored)
        )
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
