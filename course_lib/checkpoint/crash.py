"""The kill harness: run a function in a child process, SIGKILL it, see what survived.

A checkpoint is only as good as what is on disk when the process dies without warning
(a preempted host, the OOM killer, ``kill -9``). The tests and the lesson reproduce that
with real ``SIGKILL``\\s, two ways:

- from outside, at a time: :func:`run_in_child` starts ``target(*args)`` in a fresh
  process and kills it after ``kill_after_s`` seconds (random points, drawn by the
  caller with a fixed seed);
- from inside, at a named point: training code calls :func:`maybe_kill` with a
  :class:`KillPoint`, and the process kills itself exactly there (:func:`kill_self`),
  e.g. ``"mid_save"``: after the first of several files is written, before the
  manifest and the rename.

Every child also watches its parent (:func:`course_lib.runtime.processes.watch_parent`):
no child outlives the process that started it. :func:`save_known_steps` is a child
target whose checkpoints hold known content (a function of the step), so what survives
a kill can be checked byte for byte.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args

from course_lib.runtime.processes import exit_reason, watch_parent

Phase = Literal["before_save", "mid_save", "after_save", "mid_update"]
PHASES: tuple[Phase, ...] = get_args(Phase)


@dataclass(frozen=True)
class KillPoint:
    """Where a process kills itself: at ``phase`` of step ``step``.

    Phases, in the order a training step meets them:

    - ``"mid_update"``: in the middle of update ``step`` (its gradient step is taken, its
      results are not yet recorded), the work since the last checkpoint is lost;
    - ``"before_save"``: at the start of saving checkpoint ``step``, nothing written yet;
    - ``"mid_save"``: after the first file of checkpoint ``step`` is written and fsynced,
      before the rest, the manifest and the rename (a half-written checkpoint);
    - ``"after_save"``: right after checkpoint ``step`` is committed (renamed, fsynced).
    """

    step: int
    phase: Phase

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise ValueError(f"KillPoint.phase must be one of {PHASES}, got {self.phase!r}")
        if self.step < 0:
            raise ValueError(f"KillPoint.step must be >= 0, got {self.step}")


def kill_self() -> NoReturn:
    """SIGKILL this process: no ``finally``, no ``atexit``, no flush, as a real crash."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL did not end the process")  # pragma: no cover


def maybe_kill(kill_point: KillPoint | None, step: int, phase: Phase) -> None:
    """:func:`kill_self` if ``kill_point`` is ``KillPoint(step, phase)``; else nothing."""
    if kill_point is not None and kill_point.step == step and kill_point.phase == phase:
        kill_self()


@dataclass(frozen=True)
class ChildOutcome:
    """How a child run by :func:`run_in_child` ended.

    Attributes:
        exitcode: the process's exit code (``-9`` when SIGKILLed, 0 when it returned,
            1 when it raised: its traceback is on stderr).
        killed: it died of SIGKILL (ours at ``kill_after_s`` or at the timeout, or its own).
        timed_out: it was still running at ``timeout_s`` and we killed it.
        seconds: wall-clock seconds from start to its end.
    """

    exitcode: int | None
    killed: bool
    timed_out: bool
    seconds: float

    @property
    def reason(self) -> str:
        """The exit code in words: ``killed by SIGKILL``, ``exit code 0``, ..."""
        return exit_reason(self.exitcode)


def _child_main(target: Callable[..., Any], args: tuple[Any, ...], parent_pid: int) -> None:
    """In the child: watch the parent that started it (``parent_pid``: exit at once if it
    already died while this child was starting), then run the target."""
    watch_parent(launcher_pid=parent_pid, parent_pid=parent_pid)
    target(*args)


def run_in_child(
    target: Callable[..., Any],
    *args: Any,
    timeout_s: float,
    kill_after_s: float | None = None,
    kill_when: Callable[[], bool] | None = None,
    start_method: str = "spawn",
) -> ChildOutcome:
    """Run ``target(*args)`` in a new process; SIGKILL it ``kill_after_s`` seconds after
    it starts or, with ``kill_when``, that long after ``kill_when()`` is first true.

    ``kill_when`` is polled every 5 ms: a kill that must land while the child is *doing*
    something (committing checkpoints, say) waits for a sign of that work, instead of a
    fixed time that a slow machine spends starting the child and a fast one finishing it.
    ``target`` must be a module-level function (a ``spawn`` child imports it by name).
    Without ``kill_after_s`` and ``kill_when`` the child runs to its end. Either way it is
    SIGKILLed at ``timeout_s`` if still alive (``timed_out``; also when ``kill_when()`` never
    became true): this never hangs, and it returns only once the child is gone (reaped).

    Raises:
        ValueError: for a ``timeout_s <= 0`` or a ``kill_after_s`` outside ``[0, timeout_s]``.
    """
    import multiprocessing as mp

    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s}")
    if kill_after_s is not None and not 0 <= kill_after_s <= timeout_s:
        raise ValueError(f"kill_after_s must lie in [0, timeout_s={timeout_s}], got {kill_after_s}")
    # not daemonic: a target may start processes of its own (they watch their parent too)
    ctx: Any = mp.get_context(start_method)
    process = ctx.Process(target=_child_main, args=(target, args, os.getpid()))
    start = time.monotonic()
    process.start()
    timed_out = False
    try:
        if kill_when is not None:
            while process.is_alive() and time.monotonic() - start < timeout_s and not kill_when():
                time.sleep(0.005)
            event_seen = time.monotonic() - start < timeout_s
            if event_seen and process.is_alive():
                process.join(kill_after_s or 0.0)
                if process.is_alive():
                    process.kill()
        elif kill_after_s is not None:
            process.join(kill_after_s)
            if process.is_alive():
                process.kill()
        process.join(max(0.0, timeout_s - (time.monotonic() - start)))
        timed_out = process.is_alive()
    finally:  # a timeout, or an interrupt (Ctrl-C) while waiting: never leave it running
        if process.is_alive():
            process.kill()
        process.join(10.0)
    if process.is_alive():  # pragma: no cover - SIGKILL cannot be ignored
        raise RuntimeError(f"child {process.pid} survived SIGKILL for 10 s; kill it by hand: kill -9 {process.pid}")
    seconds = time.monotonic() - start
    code = process.exitcode
    process.close()
    return ChildOutcome(exitcode=code, killed=code == -signal.SIGKILL, timed_out=timed_out, seconds=seconds)


def known_files(step: int, n_files: int = 3, size: int = 64 * 1024) -> dict[str, bytes]:
    """The content of checkpoint ``step`` written by :func:`save_known_steps`:
    ``n_files`` files of ``size`` bytes each, a deterministic function of ``step``."""
    import numpy as np

    rng = np.random.default_rng(step)
    return {f"part_{i}.bin": rng.bytes(size) for i in range(n_files)}


def save_known_steps(root: str, n_steps: int, kill_point: KillPoint | None = None, size: int = 64 * 1024) -> None:
    """A child target: commit checkpoints ``latest + 1, ...`` of :func:`known_files` content.

    Resumes after the newest complete checkpoint in ``root`` (as a training run does),
    commits ``n_steps`` more, keeps the last 3 (:func:`keep_last`) after each, and honours
    ``kill_point``.
    """
    from course_lib.checkpoint.atomic import commit, keep_last, latest_complete

    found = latest_complete(Path(root))
    first = 0 if found is None else found[0] + 1
    for step in range(first, first + n_steps):
        commit(Path(root), step, known_files(step, size=size), metadata={"step": step}, kill_point=kill_point)
        keep_last(Path(root), 3)


def save_in_place(root: str, step: int, kill_point: KillPoint | None = None, size: int = 64 * 1024) -> None:
    """A child target: checkpoint ``step`` of :func:`known_files` content written the *wrong*
    way, straight into its final name ``root/step_XXXXXXXX`` (no temporary directory, no
    rename), each file fsynced, the manifest last.

    ``KillPoint(step, "mid_save")`` kills the process with half of the second file written:
    the committed-looking directory then holds one whole file, one torn file and no third
    file or manifest. Lesson 10 shows what a restore makes of it; never use this to save.
    """
    from course_lib.checkpoint.atomic import step_dir, write_manifest

    path = step_dir(Path(root), step)
    path.mkdir(parents=True, exist_ok=True)
    for i, (name, data) in enumerate(known_files(step, size=size).items()):
        with open(path / name, "wb") as f:
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            os.fsync(f.fileno())
            if i == 1:
                maybe_kill(kill_point, step, "mid_save")
            f.write(data[half:])
            f.flush()
            os.fsync(f.fileno())
    write_manifest(path, step)
    maybe_kill(kill_point, step, "after_save")


def write_then_die(path: str, size: int, seed: int = 0) -> None:
    """A child target: write ``size`` known bytes (``numpy`` ``default_rng(seed)``) to ``path``
    with **no** flush to disk beyond Python's (no ``fsync``), then SIGKILL itself.

    What survives is what the kernel holds: the page cache belongs to the kernel, not to the
    process, so a kill loses nothing written, fsync or not. Only a power loss or a kernel
    crash before the write-back (Linux: dirty pages older than about 30 s by default) loses
    unsynced bytes; a kill cannot show why ``fsync`` is needed.
    """
    import numpy as np

    with open(path, "wb") as f:
        f.write(np.random.default_rng(seed).bytes(size))
        f.flush()  # Python's buffer into the kernel; no os.fsync
    kill_self()
