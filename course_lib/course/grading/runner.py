"""Grade a learner's notebook: run it in a separate kernel, then check each exercise there.

:func:`grade_notebook` never runs learner code in its own process and never raises on
a bad submission. It

1. reads the notebook (a missing, non-JSON, truncated or non-notebook file becomes a
   one-line error in the report) and tells its lesson (metadata ``course.lesson``, else
   the file name; ``lesson=`` overrides, and a disagreement is reported, not graded);
2. starts a ``python3`` kernel (nbclient) in the notebook's folder and executes its code
   cells one by one, skipping the ``exercise-check`` cells: each cell under
   ``cell_timeout`` (interrupted when over, so the next cell still runs), all of them
   under the ``total_timeout`` deadline; outputs are dropped as they arrive, so a
   notebook that prints gigabytes costs no memory;
3. injects one cell per exercise that runs the lesson's checks on the learner's globals
   (:func:`course_lib.course.grading.kernel.grade_exercise`), each check under its own time
   limit, appending results to a JSON-lines file that survives a killed kernel;
4. always shuts the kernel down, killing its whole process group if need be. A watchdog
   thread kills the kernel if it outlives the deadline, so grading cannot hang. If the
   kernel dies while checking one exercise, a fresh kernel re-runs the notebook to check
   the remaining ones.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from course_lib.course.catalog import get_lesson
from course_lib.course.grading.checks import Exercise, first_failure_message
from course_lib.course.grading.report import DEFAULT_PASS_MARK, ExerciseResult, NotebookReport

if TYPE_CHECKING:
    from nbformat import NotebookNode

#: Tag of the "check yourself" cells; the grader skips them and runs the checks itself.
CHECK_TAG = "exercise-check"
#: Tag of cells expected to raise (stub calls); their errors are not reported as notes.
RAISES_TAG = "raises-exception"
#: Largest notebook file the grader reads.
MAX_NOTEBOOK_BYTES = 64 * 1024 * 1024
#: Seconds the grading cells may still use after the total deadline (at most the cell timeout).
GRADING_GRACE_S = 10.0
#: Seconds a tiny probe cell gets to show that an interrupted kernel is responsive again.
PROBE_S = 2.0
#: Seconds past the last deadline after which the watchdog kills the kernel outright.
WATCHDOG_SLACK_S = 15.0
#: Most notes (cell errors and such) a report keeps.
MAX_NOTES = 12
#: ename of the reply nbclient substitutes for a cell that ran past its timeout.
_TIMEOUT_ENAME = "CellTimeoutError"

_LOG = logging.getLogger("course_lib.course.grading.kernel_client")
_LOG.addHandler(logging.NullHandler())
_LOG.propagate = False


@dataclass(frozen=True)
class GradeOptions:
    """How to grade (the ``course grade`` options).

    Attributes:
        lesson: grade as this lesson (overrides the notebook's metadata and file name).
        pass_mark: fraction of the points needed to pass.
        cell_timeout: seconds each cell may run before it is interrupted.
        total_timeout: seconds the whole notebook may run (grading gets a short grace).
        check_timeout: cap on each check's own time limit, in seconds.
        kernel_name: the Jupyter kernel to run the notebook in.
        checks_module: load the exercises from this module instead of the lesson's (tests).
    """

    lesson: str | None = None
    pass_mark: float = DEFAULT_PASS_MARK
    cell_timeout: float = 60.0
    total_timeout: float = 300.0
    check_timeout: float = 10.0
    kernel_name: str = "python3"
    checks_module: str | None = None


class NotebookProblem(Exception):
    """The file cannot be graded; the message says why in one line."""


# ---------------------------------------------------------------------------------------
# Reading the notebook and telling its lesson
# ---------------------------------------------------------------------------------------


def load_notebook(path: Path) -> NotebookNode:
    """Read ``path`` as a v4 notebook.

    Raises:
        NotebookProblem: if it is missing, a folder, too large, not UTF-8 text, not
            JSON, or JSON that is not a valid notebook.
    """
    import nbformat

    if not path.exists():
        raise NotebookProblem(f"{path}: no such file")
    if path.is_dir():
        raise NotebookProblem(f"{path} is a folder, not a notebook")
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        raise NotebookProblem(f"{path} is larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB; clear its outputs and retry")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise NotebookProblem(f"{path} is not a notebook: it is not UTF-8 text") from None
    except OSError as exc:
        raise NotebookProblem(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookProblem(
            f"{path} is not valid JSON ({exc.msg}{' ' if exc.msg.endswith(' at') else ' at '}line {exc.lineno}, "
            f"column {exc.colno}): "
            "the file is corrupt or truncated; restore it from git or re-save it in Jupyter"
        ) from None
    if not isinstance(data, dict) or "cells" not in data or "nbformat" not in data:
        raise NotebookProblem(f'{path} is JSON but not a Jupyter notebook (it has no "cells" and "nbformat")')
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            nb = nbformat.reads(text, as_version=4)
            nbformat.validate(nb)
        except Exception as exc:
            first = str(getattr(exc, "message", None) or exc).strip().splitlines()
            raise NotebookProblem(
                f"{path} is not a valid notebook: {first[0] if first else type(exc).__name__}"
            ) from None
    return nb


def notebook_lesson(nb: NotebookNode | None) -> str | None:
    """The ``course.lesson`` the notebook's metadata names, if any."""
    if nb is None:
        return None
    course = nb.metadata.get("course")
    lesson = course.get("lesson") if isinstance(course, dict) else None
    return str(lesson) if lesson else None


def lesson_from_filename(path: Path) -> str | None:
    """``00_welcome.ipynb`` -> ``00_welcome``; ``00-mine.ipynb`` -> ``00_welcome``; else None."""
    stem = path.name.removesuffix(".ipynb")
    with contextlib.suppress(KeyError):
        return get_lesson(stem).id
    digits = re.match(r"\d+", stem)
    if digits:
        with contextlib.suppress(KeyError):
            return get_lesson(int(digits.group())).id
    return None


def resolve_lesson(path: Path, nb: NotebookNode | None, requested: str | None) -> tuple[str | None, str | None]:
    """Decide which lesson to grade ``path`` as.

    Returns:
        ``(lesson_id, problem)``: ``lesson_id`` is None when it cannot be told at all;
        ``problem`` is a one-line reason not to grade (e.g. the notebook is another
        lesson's), in which case every exercise of ``lesson_id`` scores 0.
    """
    meta = notebook_lesson(nb)
    meta_id: str | None = None
    meta_problem: str | None = None
    if meta is not None:
        try:
            meta_id = get_lesson(meta).id
        except KeyError:
            meta_problem = f"the notebook's metadata names lesson {meta!r}, which is not a lesson of this course"
    if requested is not None:
        try:
            lesson_id = get_lesson(requested).id
        except KeyError as exc:
            return None, str(exc.args[0])
        if meta_id is not None and meta_id != lesson_id:
            return lesson_id, (
                f"this notebook is lesson {meta_id}'s, not {lesson_id}'s (its metadata says "
                f"course.lesson = {meta_id}); grade it with --lesson {meta_id} or pick the right file"
            )
        return lesson_id, None
    if meta_id is not None:
        return meta_id, None
    from_name = lesson_from_filename(path)
    if from_name is not None:
        return from_name, None
    return None, meta_problem or (
        f"cannot tell which lesson {path.name} belongs to (no course.lesson in its metadata and "
        "no lesson number in its name); pass --lesson, e.g. --lesson 00_welcome"
    )


# ---------------------------------------------------------------------------------------
# Messages about cells
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellIssue:
    """Something that went wrong with one learner cell.

    Attributes:
        index: 0-based position in the notebook.
        kind: ``error`` (it raised), ``timeout``, ``not_run`` (total deadline),
            ``died`` (the kernel died in it) or ``stuck`` (ignored the interrupt).
        ename, evalue: the exception, for ``error``.
    """

    index: int
    kind: Literal["error", "timeout", "not_run", "died", "stuck"]
    ename: str = ""
    evalue: str = ""


_SYNTAX_FILE = re.compile(r"\((?:[^()]*?\.py|<[^>]*>), line (\d+)\)")


def clean_evalue(evalue: str, limit: int = 200) -> str:
    """An exception text as one short line; IPython's ``(1063758517.py, line 2)`` -> ``(line 2)``."""
    text = _SYNTAX_FILE.sub(r"(line \1)", " ".join(str(evalue).split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _first_line(source: str, limit: int = 40) -> str:
    for line in source.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


def _cell_name(nb: NotebookNode, index: int) -> str:
    first = _first_line(nb.cells[index].source)
    return f"cell {index + 1} (`{first}`)" if first else f"cell {index + 1}"


def describe_issue(issue: CellIssue, options: GradeOptions) -> str:
    """What happened to the cell, as a verb phrase: ``raised ValueError: ...``."""
    if issue.kind == "error":
        return f"raised {issue.ename}: {clean_evalue(issue.evalue)}" if issue.evalue else f"raised {issue.ename}"
    if issue.kind == "timeout":
        return f"ran past the {options.cell_timeout:g} s cell time limit and was interrupted"
    if issue.kind == "stuck":
        return f"ran past the {options.cell_timeout:g} s cell time limit and ignored the interrupt, so the kernel was stopped"
    if issue.kind == "died":
        return "killed the kernel (os._exit(), a crash, or out of memory?)"
    return f"was not run: the notebook ran past the {options.total_timeout:g} s total time limit"


def defining_cell(nb: NotebookNode, name: str, issues: dict[int, CellIssue]) -> int | None:
    """Index of the code cell that defines ``name`` at top level (``def``/``class``/``=``).

    Among several, the last one that had a problem, else the last one.
    """
    pattern = re.compile(
        rf"^(?:async\s+def|def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*(?::[^=]*)?=[^=]", re.M
    )
    found = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and pattern.search(c.source)]
    if not found:
        return None
    with_issue = [i for i in found if i in issues]
    return (with_issue or found)[-1]


def undefined_message(nb: NotebookNode, name: str, issues: dict[int, CellIssue], options: GradeOptions) -> str:
    """Why the learner's ``name`` is not defined after running the notebook."""
    base = f"`{name}` is not defined"
    index = defining_cell(nb, name, issues)
    if index is None:
        return f"{base}: no cell defines it (keep the function name `{name}` from the exercise)"
    if CHECK_TAG in nb.cells[index].metadata.get("tags", []):
        return f"{base}: it is defined only in cell {index + 1}, an `{CHECK_TAG}` cell, which the grader skips"
    issue = issues.get(index)
    if issue is None:
        return f"{base} after running the notebook, although cell {index + 1} defines it (is it deleted later?)"
    return f"{base}: the cell defining it {describe_issue(issue, options)} (cell {index + 1})"


# ---------------------------------------------------------------------------------------
# One kernel
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CellRun:
    """How running one cell went: ``ok``, ``error``, ``timeout``, ``died`` or ``stuck``."""

    status: Literal["ok", "error", "timeout", "died", "stuck"]
    ename: str = ""
    evalue: str = ""


@functools.cache
def _make_client_class() -> type:
    from nbclient import NotebookClient

    class GradingClient(NotebookClient):
        """nbclient that drops every output as it arrives and records each cell's reply."""

        last_reply: dict[str, Any] | None = None

        def output(self, outs: list[Any], msg: dict[str, Any], display_id: str | None, cell_index: int) -> None:
            return None  # keep nothing: a cell may print gigabytes

    return GradingClient


class KernelSession:
    """A kernel running a copy of the learner's notebook, with a watchdog.

    Use as a context manager; leaving it always stops the kernel and its children.
    """

    def __init__(self, nb: NotebookNode, cwd: Path, options: GradeOptions, kill_at: float) -> None:
        self.nb = nb
        self.cwd = cwd
        self.options = options
        self.kill_at = kill_at
        self.killed_by_watchdog = False
        self._limit = options.cell_timeout
        self._pgid: int | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._watchdog: threading.Timer | None = None
        client_class = _make_client_class()
        self.client = client_class(
            nb,
            kernel_name=options.kernel_name,
            allow_errors=True,
            interrupt_on_timeout=True,
            timeout_func=self._timeout,
            iopub_timeout=1,
            shutdown_kernel="immediate",
            startup_timeout=60,
            record_timing=False,
            log=_LOG,
        )
        self.client.on_cell_executed = self._on_cell_executed

    def _timeout(self, cell: Any) -> float:
        return self._limit

    def _on_cell_executed(self, **kwargs: Any) -> None:
        self.client.last_reply = kwargs.get("execute_reply")

    def __enter__(self) -> KernelSession:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the kernel (output to /dev/null, in the notebook's folder) and the watchdog."""
        km = self.client.create_kernel_manager()
        km.log = _LOG
        self.client.start_new_kernel(cwd=str(self.cwd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        provisioner = getattr(km, "provisioner", None)
        self._popen = getattr(provisioner, "process", None)
        pid = getattr(self._popen, "pid", None)
        self._pgid = getattr(provisioner, "pgid", None) or (pid if pid else None)
        self._watchdog = threading.Timer(max(0.0, self.kill_at - time.monotonic()), self._watchdog_kill)
        self._watchdog.daemon = True
        self._watchdog.start()
        self.client.start_new_kernel_client()

    def _watchdog_kill(self) -> None:
        self.killed_by_watchdog = True
        self._kill_group()

    def _kill_group(self) -> None:
        if self._pgid is not None and self._pgid != os.getpgid(0):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._pgid, signal.SIGKILL)
        elif self._popen is not None:
            with contextlib.suppress(ProcessLookupError):
                self._popen.kill()

    def run(self, index: int, limit: float) -> CellRun:
        """Execute cell ``index`` of ``self.nb`` with a ``limit``-second timeout."""
        from nbclient.exceptions import DeadKernelError

        cell = self.nb.cells[index]
        self._limit = max(0.5, limit)
        self.client.error_on_timeout = {"ename": _TIMEOUT_ENAME, "evalue": f"over {limit:g} s", "traceback": []}
        self.client.last_reply = None
        try:
            self.client.execute_cell(cell, index)
        except DeadKernelError:
            return CellRun("died")
        except Exception as exc:
            if not self.alive():
                return CellRun("died")
            return CellRun("error", type(exc).__name__, str(exc))
        if self.killed_by_watchdog or not self.alive():
            return CellRun("died")
        reply = (self.client.last_reply or {}).get("content", {})
        if reply.get("status") == "error":
            if reply.get("ename") == _TIMEOUT_ENAME:
                return CellRun("stuck") if not self._responsive() else CellRun("timeout")
            return CellRun("error", str(reply.get("ename", "Error")), str(reply.get("evalue", "")))
        return CellRun("ok")

    def run_source(self, source: str, limit: float) -> CellRun:
        """Append a code cell holding ``source`` to the notebook and execute it."""
        import nbformat

        self.nb.cells.append(nbformat.v4.new_code_cell(source))
        return self.run(len(self.nb.cells) - 1, limit)

    def _responsive(self) -> bool:
        """After an interrupt: does the kernel run a trivial cell again?"""
        import nbformat

        self.nb.cells.append(nbformat.v4.new_code_cell("pass"))
        index = len(self.nb.cells) - 1
        self._limit = PROBE_S
        self.client.last_reply = None
        try:
            self.client.execute_cell(self.nb.cells[index], index)
        except Exception:
            return False
        reply = (self.client.last_reply or {}).get("content", {})
        return reply.get("status") == "ok"

    def alive(self) -> bool:
        """Is the kernel process running? (True when its process is unknown: nbclient then notices a death.)"""
        return self._popen is None or self._popen.poll() is None

    def close(self) -> None:
        """Stop the kernel, its client and every process in its group; reap it."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        try:
            if self.client.km is not None:
                self.client._cleanup_kernel()
        except Exception:
            pass
        finally:
            self._kill_group()
            if self._popen is not None:
                with contextlib.suppress(Exception):
                    self._popen.wait(timeout=10)


# ---------------------------------------------------------------------------------------
# Grading
# ---------------------------------------------------------------------------------------


def _read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines results written so far (a line cut by a kill is skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict):
                events.append(record)
    return events


def _grading_source(lesson_id: str, name: str, results: Path, options: GradeOptions) -> str:
    return (
        "__import__('course_lib.course.grading.kernel', fromlist=['grade_exercise']).grade_exercise("
        f"{lesson_id!r}, {name!r}, globals(), {str(results)!r}, "
        f"check_timeout={options.check_timeout!r}, module={options.checks_module!r})"
    )


def _fill_result(
    result: ExerciseResult,
    exercise: Exercise,
    events: list[dict[str, Any]],
    run: CellRun,
    nb: NotebookNode,
    issues: dict[int, CellIssue],
    options: GradeOptions,
) -> None:
    """Turn the kernel's events (and how its cell ended) into ``result``."""
    from course_lib.course.grading.checks import CheckResult

    mine = [e for e in events if e.get("exercise") == exercise.name]
    checks = [
        CheckResult(str(e.get("description", "")), e.get("status", "error"), str(e.get("message", "")))
        for e in mine
        if e.get("event") == "check"
    ]
    ended = any(e.get("event") == "end" for e in mine)
    if any(e.get("event") == "missing" for e in mine):
        result.message = undefined_message(nb, exercise.name, issues, options)
        return
    if not ended:
        pending = exercise.checks[len(checks)].description if len(checks) < len(exercise.checks) else ""
        during = f" during check '{pending}'" if pending and any(e.get("event") == "start" for e in mine) else ""
        if run.status == "died":
            why = f"the kernel died while checking it{during} (did the code call os._exit(), crash, or run out of memory?)"
            status = "error"
        elif run.status in ("timeout", "stuck"):
            why = f"checking it ran past the {options.cell_timeout:g} s cell time limit{during}"
            status = "timeout"
        elif run.status == "error":
            why = f"the checks could not run in the kernel: {run.ename}: {clean_evalue(run.evalue)}"
            status = "error"
        else:
            why = "the checks produced no result"
            status = "error"
        checks.append(CheckResult(pending, status, why))  # type: ignore[arg-type]
        result.checks = [c.to_dict() for c in checks]
        result.message = why
        return
    result.checks = [c.to_dict() for c in checks]
    result.passed = bool(checks) and all(c.passed for c in checks)
    result.score = float(exercise.points) if result.passed else 0.0
    result.message = first_failure_message(checks)


def _notes(nb: NotebookNode, issues: dict[int, CellIssue], options: GradeOptions) -> list[str]:
    notes = []
    not_run = sorted(i for i, issue in issues.items() if issue.kind == "not_run")
    for index in sorted(issues):
        issue = issues[index]
        if issue.kind == "not_run":
            continue
        if issue.kind == "error" and RAISES_TAG in nb.cells[index].metadata.get("tags", []):
            continue
        notes.append(f"{_cell_name(nb, index)} {describe_issue(issue, options)}")
    if not_run:
        notes.append(
            f"cells {not_run[0] + 1}-{len(nb.cells)} were not run: the notebook ran past the "
            f"{options.total_timeout:g} s total time limit"
        )
    if len(notes) > MAX_NOTES:
        notes = notes[:MAX_NOTES] + [f"... and {len(notes) - MAX_NOTES} more"]
    return notes


def _run_learner_cells(
    session: KernelSession, nb: NotebookNode, deadline: float, skip: set[int]
) -> tuple[dict[int, CellIssue], int | None]:
    """Execute the learner's cells in order, leaving out ``skip``.

    Returns:
        The issues, and the index of the cell that killed or wedged the kernel (None if
        the kernel is still usable).
    """
    issues: dict[int, CellIssue] = {}
    for index, cell in enumerate(nb.cells):
        if index in skip or cell.cell_type != "code" or not cell.source.strip():
            continue
        if CHECK_TAG in cell.metadata.get("tags", []):
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            issues[index] = CellIssue(index, "not_run")
            continue
        run = session.run(index, min(session.options.cell_timeout, remaining))
        if run.status == "ok":
            continue
        if run.status == "died" and session.killed_by_watchdog:
            issues[index] = CellIssue(index, "not_run")
            return issues, index
        kind = "error" if run.status == "error" else run.status
        issues[index] = CellIssue(index, kind, run.ename, run.evalue)
        if run.status in ("died", "stuck"):
            return issues, index
    return issues, None


def grade_notebook(path: str | Path, options: GradeOptions | None = None) -> NotebookReport:
    """Grade one notebook; never raises on a bad submission.

    Args:
        path: the learner's ``.ipynb``.
        options: lesson override, pass mark and time limits.

    Returns:
        A report with one result per exercise of the lesson (0 points with a message
        for each exercise that could not be graded).
    """
    options = options or GradeOptions()
    started = time.monotonic()
    path = Path(path)
    report = NotebookReport(path=str(path), lesson=None, pass_mark=options.pass_mark)
    try:
        _grade_into(report, path, options, started)
    finally:
        report.seconds = time.monotonic() - started
    return report


def _grade_into(report: NotebookReport, path: Path, options: GradeOptions, started: float) -> None:
    from course_lib.course.grading.lessons import exercises_for

    nb: NotebookNode | None = None
    problem: str | None = None
    try:
        nb = load_notebook(path)
    except NotebookProblem as exc:
        problem = str(exc)
    lesson_id, lesson_problem = resolve_lesson(path, nb, options.lesson)
    if lesson_id is None:
        report.error = problem or lesson_problem
        return
    report.lesson = lesson_id
    try:
        exercises = exercises_for(lesson_id, options.checks_module)
    except Exception as exc:
        report.error = f"the checks of lesson {lesson_id} could not be loaded: {type(exc).__name__}: {exc}"
        return
    report.exercises = [ExerciseResult(e.name, float(e.points), hint=e.hint) for e in exercises]
    fatal = problem or lesson_problem
    if fatal is None and not exercises:
        fatal = f"lesson {lesson_id} has no graded exercises; there is nothing to grade"
    if fatal is not None:
        report.error = fatal
        for result in report.exercises:
            result.message = f"not graded: {fatal}"
        return
    assert nb is not None
    _execute_and_check(report, nb, path, lesson_id, exercises, options, started)


def _execute_and_check(
    report: NotebookReport,
    nb: NotebookNode,
    path: Path,
    lesson_id: str,
    exercises: tuple[Exercise, ...],
    options: GradeOptions,
    started: float,
) -> None:
    """Run the notebook and check every exercise, restarting the kernel when it dies.

    A learner cell that kills or wedges the kernel is left out of a fresh kernel's run;
    an exercise whose checks kill it scores 0 and a fresh kernel checks the others.
    """
    tmp = Path(tempfile.mkdtemp(prefix="course-grade-"))
    grading = _GradingRun(report, nb, path, lesson_id, options, started, tmp / "results.jsonl", list(exercises))
    try:
        while grading.pending:
            if time.monotonic() >= grading.final_deadline:
                grading.out_of_time()
                break
            grading.in_fresh_kernel()
    except Exception as exc:
        report.error = f"could not run the notebook in the {options.kernel_name} kernel: {type(exc).__name__}: {exc}"
        grading.give_up(report.error)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        report.notes = _notes(nb, grading.issues, options) + grading.restart_notes


class _GradingRun:
    """One notebook's grading across kernels: the deadlines, the exercises still to check,
    and what the kernels have shown so far (cell issues, cells to skip, restarts)."""

    def __init__(
        self,
        report: NotebookReport,
        nb: NotebookNode,
        path: Path,
        lesson_id: str,
        options: GradeOptions,
        started: float,
        results_path: Path,
        pending: list[Exercise],
    ) -> None:
        self.nb, self.path, self.lesson_id, self.options = nb, path, lesson_id, options
        self.deadline = started + options.total_timeout
        self.final_deadline = self.deadline + min(options.cell_timeout, GRADING_GRACE_S)
        self.kill_at = self.final_deadline + WATCHDOG_SLACK_S
        self.results_path = results_path
        self.pending = pending
        self.by_name = {r.name: r for r in report.exercises}
        self.issues: dict[int, CellIssue] = {}
        self.skip: set[int] = set()
        self.restart_notes: list[str] = []

    def give_up(self, why: str) -> None:
        """Every exercise not checked yet scores 0, with ``why``."""
        for ex in self.pending:
            self.by_name[ex.name].message = f"not graded: {why}"
        self.pending.clear()

    def out_of_time(self) -> None:
        self.give_up(f"the notebook ran past the {self.options.total_timeout:g} s total time limit")

    def in_fresh_kernel(self) -> None:
        """Run the learner's cells in a new kernel, then check exercises there until one kills it."""
        with KernelSession(copy.deepcopy(self.nb), self.path.resolve().parent, self.options, self.kill_at) as session:
            if self._run_learner_cells(session):
                self._check_pending(session)

    def _run_learner_cells(self, session: KernelSession) -> bool:
        """Run the cells; False when one killed or wedged the kernel (it is skipped next time)."""
        cell_issues, stopped_at = _run_learner_cells(session, session.nb, self.deadline, self.skip)
        for index, issue in cell_issues.items():
            self.issues.setdefault(index, issue)
        if stopped_at is None:
            return True
        if session.killed_by_watchdog:
            self.out_of_time()
        else:
            self.skip.add(stopped_at)
            self.restart_notes.append(f"the notebook was re-run in a fresh kernel without cell {stopped_at + 1}")
        return False

    def _check_pending(self, session: KernelSession) -> None:
        """Check the pending exercises in order; stop when the time is up or the kernel dies."""
        while self.pending:
            exercise = self.pending[0]
            remaining = self.final_deadline - time.monotonic()
            if remaining <= 0:
                self.out_of_time()
                return
            self.pending.pop(0)
            run = session.run_source(
                _grading_source(self.lesson_id, exercise.name, self.results_path, self.options),
                min(self.options.cell_timeout, remaining),
            )
            result = self.by_name[exercise.name]
            _fill_result(result, exercise, _read_events(self.results_path), run, self.nb, self.issues, self.options)
            if run.status in ("died", "stuck") and self.pending:
                what = "died" if run.status == "died" else "stopped responding"
                self.restart_notes.append(
                    f"the kernel {what} while checking `{exercise.name}`; "
                    "the notebook was re-run in a fresh kernel for the other exercises"
                )
                return
