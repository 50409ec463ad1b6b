"""Launch N fresh Python processes that form one JAX program, and never leave one behind.

Multi-controller JAX (lesson 05) runs *one process per host* (or per GPU): every process
runs the same script, calls ``jax.distributed.initialize(coordinator, num_processes,
process_id)``, and from then on sees the devices of all processes as one mesh. On one
machine the same thing runs as N local processes that rendezvous on ``127.0.0.1:PORT``;
this module is their launcher, the local stand-in for ``srun``/``mpirun``/a TPU pod's
runtime:

- :func:`launch` starts N interpreters with :class:`subprocess.Popen` (fresh
  interpreters, not forks: each JAX process must start its own backend), each in its own
  process group, with the rendezvous in its environment (:data:`COORDINATOR_ENV`,
  :data:`NUM_PROCESSES_ENV`, :data:`PROCESS_ID_ENV`) and a file to write its JSON result
  to (:data:`RESULT_FILE_ENV`). It waits with a deadline and returns one
  :class:`ProcessResult` per process.
- **One process dies, all die.** A collective waits for every process, so when one
  process dies the others hang in their next all-reduce or in ``jax.distributed``'s
  shutdown barrier (measured: 100 s, JAX's heartbeat timeout, before the survivor
  exits). The launcher therefore stops all the others the moment one exits non-zero
  (``killpg``: SIGTERM, then SIGKILL after ``kill_wait_s``; note that JAX's preemption
  service, on by default, *catches* SIGTERM: the course's worker turns it off) and raises
  :class:`ProcessFailed` naming the process that died first, its exit code in words
  (``124`` = its watchdog fired, negative = a signal) and the end of its standard error.
  Past the deadline it does the same and raises :class:`LaunchTimeout` (a
  ``TimeoutError``).
- **No orphans, whatever happens.** Every exit path of :func:`launch`, an exception or a
  ``KeyboardInterrupt`` in the parent included, runs the same ``finally`` that stops
  every process group; a worker that outlives a parent killed by SIGKILL ends itself
  (:func:`course_lib.runtime.processes.watch_parent`, which the worker starts).

Worker side: :func:`process_info` reads the rendezvous from the environment and
:func:`write_result` writes the JSON result. Both import nothing heavy: this module never
imports JAX, so a notebook that already runs JAX can launch processes that start theirs.

The course's worker is :mod:`course_lib.scaling.multihost`::

    results = launch("course_lib.scaling.multihost", 2, timeout_s=60, args=["--program", "psum"])
    results[1].result["reduced"]        # what process 1 wrote
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_lib.runtime.processes import exit_reason, free_port, stop_processes
from course_lib.runtime.watchdog import WATCHDOG_EXIT

#: Environment variables a launched process finds its place in the run by.
COORDINATOR_ENV = "COURSE_COORDINATOR_ADDRESS"  # "127.0.0.1:PORT": process 0 serves it, all connect
NUM_PROCESSES_ENV = "COURSE_NUM_PROCESSES"
PROCESS_ID_ENV = "COURSE_PROCESS_ID"
RESULT_FILE_ENV = "COURSE_RESULT_FILE"  # where the process writes its JSON result

#: Lines of a process's output that are the C++ runtime talking, not the program: absl log
#: lines (``E1123 09:41:10.796628   21487 coordination_service.cc:1520] ...`` and the lines
#: that continue them), gloo's connection notices, and a fatal check's native stack trace.
_ABSL_HEADER = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ [^\s:]+:\d+\]")
_NOISE_LINE = re.compile(
    r"^(\[Gloo\] |\*\*\* Check failure stack trace|\s+@\s+0x|WARNING: All log messages before absl::InitializeLog)"
)
#: Lines that end an absl message's continuation: the program speaks again.
_PROGRAM_LINE = re.compile(r"^(Traceback |WATCHDOG|INJECTED|\[process |\S+\.py:\d+: |\w+(Error|Exception)\b)")


def filter_noise(text: str) -> str:
    """``text`` without the gloo/absl log lines of the JAX runtime (see :data:`_ABSL_HEADER`).

    An absl message may span several lines; the lines after its header are dropped up to
    the next line that is the program's own (a traceback, the watchdog, a ``*.py:N:``
    warning) or a blank line.
    """
    out = []
    in_absl = False
    for line in text.splitlines():
        if _ABSL_HEADER.match(line):
            in_absl = True
            continue
        if in_absl and (not line.strip() or _PROGRAM_LINE.match(line)):
            in_absl = False
        if in_absl or _NOISE_LINE.match(line):
            continue
        out.append(line)
    return "\n".join(out) + ("\n" if out and text.endswith("\n") else "")


def describe_exit(code: int | None) -> str:
    """A process's exit code in words: :func:`~course_lib.runtime.processes.exit_reason`,
    plus what 124 (:data:`~course_lib.runtime.watchdog.WATCHDOG_EXIT`) means."""
    reason = exit_reason(code)
    if code == WATCHDOG_EXIT:
        reason += " (its watchdog fired: the program hung and was ended; see its stderr)"
    return reason


@dataclass(frozen=True)
class ProcessResult:
    """What one launched process did. ``stdout``/``stderr`` are complete and unfiltered
    (:func:`filter_noise` cleans them); ``result`` is the JSON it wrote to
    :data:`RESULT_FILE_ENV`, or None if it wrote none."""

    process_id: int
    pid: int
    exit_code: int | None  # negative: ended by that signal; None: still running (SIGKILL did not end it)
    stdout: str
    stderr: str
    result: Any
    wall_s: float


@dataclass(frozen=True)
class ProcessInfo:
    """A launched process's place in the run, read from its environment by :func:`process_info`."""

    coordinator_address: str
    num_processes: int
    process_id: int
    result_file: str | None


class LaunchError(RuntimeError):
    """A launch that did not succeed; ``results`` holds every process's :class:`ProcessResult`
    (exit codes after the launcher stopped them, outputs), ``events`` how they were stopped."""

    def __init__(self, message: str, results: list[ProcessResult], events: list[str]) -> None:
        super().__init__(message)
        self.results = results
        self.events = events

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.results]


class ProcessFailed(LaunchError):
    """A process exited non-zero or was killed; ``process_id``, ``exit_code`` name the first one."""

    def __init__(
        self, message: str, results: list[ProcessResult], events: list[str], process_id: int, exit_code: int
    ) -> None:
        super().__init__(message, results, events)
        self.process_id = process_id
        self.exit_code = exit_code


class LaunchTimeout(LaunchError, TimeoutError):
    """The processes did not all finish within ``timeout_s``; ``still_running`` names those that had not."""

    def __init__(self, message: str, results: list[ProcessResult], events: list[str], still_running: list[int]) -> None:
        super().__init__(message, results, events)
        self.still_running = still_running


class _Group:
    """A launched process and its process group, as :func:`stop_processes` drives them
    (``join``/``is_alive``/``terminate``/``kill``): the signals go to the whole group.

    One waiter thread per process reaps it (``Popen.wait``) and reports its exit on a
    queue, in the order the processes really ended. The group is signalled only while
    the waiter has not reaped the leader, so a reused pid is never hit.
    """

    def __init__(self, process_id: int, proc: subprocess.Popen[bytes], exits: queue.Queue[tuple[int, int]]) -> None:
        self.process_id = process_id
        self.proc = proc
        self.ended_at: float | None = None

        def wait() -> None:
            code = proc.wait()
            self.ended_at = time.monotonic()
            exits.put((process_id, code))

        self.waiter = threading.Thread(target=wait, name=f"wait for process {process_id}", daemon=True)
        self.waiter.start()

    def join(self, timeout: float | None = None) -> None:
        self.waiter.join(timeout)

    def is_alive(self) -> bool:
        return self.waiter.is_alive()

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


def _command(target: str | Sequence[str], args: Sequence[str]) -> list[str]:
    if isinstance(target, str):
        if not target or not all(part.isidentifier() for part in target.split(".")):
            raise ValueError(
                f"target {target!r} is not a module name; pass a module ('course_lib.scaling.multihost') or an argv list"
            )
        return [sys.executable, "-m", target, *map(str, args)]
    argv = [str(a) for a in target]
    if not argv:
        raise ValueError("target is an empty argv list; pass a module name or ['python', 'script.py', ...]")
    return [*argv, *map(str, args)]


def _tail(text: str, lines: int) -> str:
    """The last ``lines`` lines of ``text`` without the runtime's noise, indented; a watchdog's
    message (which precedes its long stack dump) is kept even when it is further up."""
    shown = filter_noise(text).strip("\n").splitlines() or text.strip("\n").splitlines()
    head = []
    starts = [i for i, line in enumerate(shown) if line.startswith("WATCHDOG:")]
    if starts and starts[-1] < len(shown) - lines:
        head = [*shown[starts[-1] : starts[-1] + 2], "..."]
    return "\n".join("    " + line for line in head + shown[-lines:]) or "    (nothing)"


class _Echo:
    """Print what the processes write, line by line, prefixed ``[process i]``, noise filtered."""

    def __init__(self, paths: list[tuple[int, Path]]) -> None:
        self.paths = paths
        self.offsets = {path: 0 for _, path in paths}
        self.partial = {path: "" for _, path in paths}

    def poll(self, final: bool = False) -> None:
        for process_id, path in self.paths:
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except OSError:
                continue
            self.offsets[path] += len(data)
            text = self.partial[path] + data.decode("utf-8", "replace")
            lines = text.split("\n")
            self.partial[path] = "" if final else lines.pop()
            for line in filter_noise("\n".join(lines)).splitlines():
                print(f"[process {process_id}] {line}", flush=True)


def launch(
    target: str | Sequence[str],
    n_processes: int,
    timeout_s: float,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    echo: bool = False,
    cwd: str | os.PathLike[str] | None = None,
    kill_wait_s: float = 2.0,
    tail_lines: int = 15,
) -> list[ProcessResult]:
    """Run ``target`` as ``n_processes`` processes that rendezvous on a free localhost port.

    Args:
        target: a module run as ``python -m target`` with this interpreter, or a full argv
            (``[sys.executable, "script.py"]``).
        n_processes: how many processes (>= 1); process ``i`` gets ``PROCESS_ID=i``.
        timeout_s: wall-clock limit for the whole run, start-up included (JAX takes
            1-4 s to start per process on this machine).
        args: appended to every process's command line.
        env: variables set in every process's environment, over this process's.
        echo: print the processes' output as it comes, ``[process i] line``, with the
            gloo/absl noise left out (:func:`filter_noise`).
        cwd: the processes' working directory (default: this one's).
        kill_wait_s: how long to wait after SIGTERM (then after SIGKILL) when stopping.
        tail_lines: how many lines of a failed process's stderr the error shows.

    Returns:
        One :class:`ProcessResult` per process, in process order, when every one exited 0.

    Raises:
        ValueError: bad arguments (nothing is started).
        ProcessFailed: a process exited non-zero or was killed; the others were stopped at once.
        LaunchTimeout: not all finished within ``timeout_s``; all were stopped.
    """
    if isinstance(n_processes, bool) or not isinstance(n_processes, int) or n_processes < 1:
        raise ValueError(f"n_processes must be an int >= 1, got {n_processes!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
    command = _command(target, args)
    coordinator = f"127.0.0.1:{free_port()}"
    workdir = Path(tempfile.mkdtemp(prefix="jax_processes_"))
    exits: queue.Queue[tuple[int, int]] = queue.Queue()
    groups: list[_Group] = []
    events: list[str] = []
    files = [
        (workdir / f"stdout_{i}.txt", workdir / f"stderr_{i}.txt", workdir / f"result_{i}.json")
        for i in range(n_processes)
    ]
    echoer = _Echo([(i, p) for i, (out, err, _) in enumerate(files) for p in (out, err)]) if echo else None
    start = time.monotonic()

    def stop_all() -> None:
        events.extend(
            stop_processes([(f"process {g.process_id}", g) for g in groups], timeout=0.0, kill_wait=kill_wait_s)
        )

    def collect() -> list[ProcessResult]:
        results = []
        for g, (out, err, res) in zip(groups, files):
            result = None
            if res.exists() and g.proc.returncode == 0:
                try:
                    result = json.loads(res.read_text())
                except ValueError as e:
                    raise RuntimeError(f"process {g.process_id} wrote a result that is not JSON ({res}): {e}") from e
            ended = g.ended_at if g.ended_at is not None else time.monotonic()
            results.append(
                ProcessResult(
                    process_id=g.process_id,
                    pid=g.proc.pid,
                    exit_code=g.proc.returncode,
                    stdout=out.read_text(errors="replace") if out.exists() else "",
                    stderr=err.read_text(errors="replace") if err.exists() else "",
                    result=result,
                    wall_s=ended - start,
                )
            )
        return results

    try:
        for i, (out, err, res) in enumerate(files):
            child_env = {**os.environ, **(env or {})}
            child_env.update(
                {
                    COORDINATOR_ENV: coordinator,
                    NUM_PROCESSES_ENV: str(n_processes),
                    PROCESS_ID_ENV: str(i),
                    RESULT_FILE_ENV: str(res),
                    "PYTHONUNBUFFERED": "1",  # output reaches the files as it is written
                }
            )
            with open(out, "wb") as stdout, open(err, "wb") as stderr:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=stdout,
                    stderr=stderr,
                    env=child_env,
                    cwd=cwd,
                    start_new_session=True,  # its own process group: killpg reaches it and only it
                )
            groups.append(_Group(i, proc, exits))

        finished: set[int] = set()
        failed: tuple[int, int] | None = None
        deadline = start + timeout_s
        while len(finished) < n_processes:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                process_id, code = exits.get(timeout=min(0.1, left))
            except queue.Empty:
                if echoer is not None:
                    echoer.poll()
                continue
            finished.add(process_id)
            if code != 0:
                failed = (process_id, code)
                break
        stop_all()
        if echoer is not None:
            echoer.poll(final=True)
        results = collect()
        elapsed = time.monotonic() - start
        if failed is not None:
            process_id, code = failed
            others = [r for r in results if r.process_id != process_id]
            stopped = ", ".join(f"process {r.process_id}: {describe_exit(r.exit_code)}" for r in others) or "none"
            raise ProcessFailed(
                f"process {process_id} of {n_processes} failed after {elapsed:.1f} s: {describe_exit(code)}.\n"
                f"The launcher stopped the others at once (then: {stopped}).\n"
                f"Command: {' '.join(command)}\n"
                f"Last lines of process {process_id}'s stderr (gloo/absl log lines left out):\n"
                f"{_tail(results[process_id].stderr, tail_lines)}",
                results,
                events,
                process_id,
                code,
            )
        if len(finished) < n_processes:
            running = [g.process_id for g in groups if g.process_id not in finished]
            tails = "\n".join(
                f"  process {i} ({describe_exit(results[i].exit_code)} by the launcher):\n{_tail(results[i].stderr, tail_lines)}"
                for i in running
            )
            raise LaunchTimeout(
                f"{len(running)} of {n_processes} processes did not finish in {timeout_s:g} s (timeout_s): "
                f"process {', '.join(map(str, running))} still running; the launcher stopped them all.\n"
                f"Command: {' '.join(command)}\nLast lines of their stderr (gloo/absl log lines left out):\n{tails}",
                results,
                events,
                running,
            )
        return results
    finally:
        stop_all()  # a no-op after a normal exit; on an exception or Ctrl-C it stops every group
        shutil.rmtree(workdir, ignore_errors=True)


def process_info(environ: Mapping[str, str] | None = None) -> ProcessInfo | None:
    """In a launched process: its place in the run, from the environment :func:`launch` set;
    None when the variables are absent (not launched by :func:`launch`)."""
    environ = os.environ if environ is None else environ
    if COORDINATOR_ENV not in environ:
        return None
    try:
        info = ProcessInfo(
            coordinator_address=environ[COORDINATOR_ENV],
            num_processes=int(environ[NUM_PROCESSES_ENV]),
            process_id=int(environ[PROCESS_ID_ENV]),
            result_file=environ.get(RESULT_FILE_ENV),
        )
    except (KeyError, ValueError) as e:
        raise ValueError(
            f"{COORDINATOR_ENV} is set but {NUM_PROCESSES_ENV}/{PROCESS_ID_ENV} are missing or not integers ({e}); "
            f"set all three, or launch with course_lib.runtime.jax_processes.launch"
        ) from e
    if not 0 <= info.process_id < info.num_processes:
        raise ValueError(
            f"{PROCESS_ID_ENV}={info.process_id} must be in 0..{info.num_processes - 1} ({NUM_PROCESSES_ENV})"
        )
    return info


def write_result(result: Any, path: str | os.PathLike[str] | None = None) -> None:
    """In a launched process: write ``result`` (JSON-able) where the launcher reads it
    (``path``, default :data:`RESULT_FILE_ENV`; nothing when neither is set). Written to a
    temporary file and renamed, so the launcher never reads half a result."""
    path = path if path is not None else os.environ.get(RESULT_FILE_ENV)
    if path is None:
        return
    target = Path(path)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(target)
