"""Child processes: their lifecycle, how they end, and what is still alive.

Every system that starts real processes stands on this module: lesson 03's actors and
inference server, 07's generator, 09's torch.distributed ranks, and their tests, which
check that nothing is left behind.

- :class:`ChildProcessSystem`: start once, always stop (a context manager).
- :func:`stop_processes`: join, then terminate, then kill, within a deadline.
- :func:`child_setup` / :func:`watch_parent`: what a child does first; no orphan
  survives its parent.
- :func:`exit_reason`: a child's exit code in words (``killed by SIGKILL``).
- :func:`live_children`, :func:`wait_gone`: what is still running.
- :func:`free_port`: a TCP port for a rendezvous or a server.
- :class:`SharedFlag`: a stop signal without a lock (a killed child cannot wedge it).

Imports only psutil at import time (torch only inside :func:`child_setup`).
"""

from __future__ import annotations

import atexit
import os
import signal
import time
from collections.abc import Sequence
from typing import Any, Self

import psutil

#: Exit code of a child that crashed on purpose (fault injection: ``crash_after``).
INJECTED_CRASH_EXIT = 17
#: Exceptions that end a child quietly: the other end of its pipe went away, or it is being stopped.
QUIET_EXIT = (EOFError, OSError, KeyboardInterrupt)


def exit_reason(exitcode: int | None) -> str:
    """``exit code 17 (injected crash)``, ``killed by SIGKILL``, ..."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    if exitcode == INJECTED_CRASH_EXIT:
        return f"exit code {exitcode} (injected crash)"
    return f"exit code {exitcode}"


def child_setup(seed: int, parent_pid: int | None = None) -> None:
    """What every torch child process does first: one torch thread (small models; the
    cores are shared by all processes), a seed, and the parent watchdog.

    ``parent_pid``: the parent the launcher expects (its ``os.getpid()`` for a ``spawn``
    or ``fork`` child), see :func:`watch_parent`.
    """
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    watch_parent(parent_pid=parent_pid)


def port_is_free(port: int, ip: str = "127.0.0.1") -> bool:
    """Whether ``ip:port`` can be bound now (SO_REUSEADDR, as servers bind)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def free_port(ip: str = "127.0.0.1", preferred: Sequence[int] = ()) -> int:
    """The first free port of ``preferred``, else one the OS hands out (free now; a
    rendezvous binds it soon after)."""
    import socket

    for port in preferred:
        if port_is_free(port, ip):
            return port
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def live_children() -> list[psutil.Process]:
    """This process's live descendants, leaving out multiprocessing's own helpers.

    The resource tracker and the forkserver are started once per interpreter and exit
    with it; they are this process's direct children. Processes *forked from* the
    forkserver (actors, ranks: the same command line) are its children, so they are
    listed. After a system has stopped the list must be empty: no orphans.
    """
    me = os.getpid()
    out = []
    for p in psutil.Process(me).children(recursive=True):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            helper = p.ppid() == me and any(h in " ".join(p.cmdline()) for h in ("resource_tracker", "forkserver"))
        except psutil.Error:
            continue
        if not helper:
            out.append(p)
    return out


def stop_multiprocessing_helpers() -> None:
    """Stop this interpreter's forkserver and resource tracker (they restart on demand).

    They are started once per interpreter by the first child process and otherwise live
    until it exits; a test suite that asserts "this process has no children" calls this
    after the last system has stopped. Uses the private ``_stop`` methods CPython's own
    tests use; a no-op where they are missing.
    """
    from multiprocessing import forkserver, resource_tracker

    for helper in (getattr(forkserver, "_forkserver", None), getattr(resource_tracker, "_resource_tracker", None)):
        stop = getattr(helper, "_stop", None)
        if stop is not None:
            stop()


def wait_gone(pids: list[int], within: float = 5.0) -> bool:
    """True once none of ``pids`` is a live (non-zombie) process; False after ``within`` seconds."""
    import time

    deadline = time.monotonic() + within
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop_processes(processes: list[tuple[str, Any]], timeout: float, kill_wait: float = 2.0) -> list[str]:
    """Join ``(name, multiprocessing.Process)`` pairs within ``timeout`` seconds in total,
    then ``terminate``, then ``kill`` whatever is still alive, waiting ``kill_wait`` after each.

    The caller has already asked them to stop (an event, a message). Returns one event line
    per escalation (``"stop: NAME did not exit in time; sent terminate"``); never blocks
    longer than ``timeout + 2 * kill_wait``.
    """
    import time

    events = []
    deadline = time.monotonic() + timeout
    for _, process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for how in ("terminate", "kill"):
        left = [(name, p) for name, p in processes if p.is_alive()]
        for name, process in left:
            getattr(process, how)()
            events.append(f"stop: {name} did not exit in time; sent {how}")
        for _, process in left:
            process.join(kill_wait)
    return events


def watch_parent(launcher_pid: int | None = None, poll_s: float = 0.5, parent_pid: int | None = None) -> None:
    """In a child process: exit at once (code 3) if its parent dies, or the process that
    launched it (``launcher_pid``, e.g. the notebook kernel behind a forkserver) goes away.

    A daemon thread polls every ``poll_s`` seconds, so no orphan survives its parent,
    whatever killed the parent (``kill -9`` included).

    ``parent_pid`` is the parent the launcher expects, passed by the launcher (its own
    ``os.getpid()`` for a ``spawn`` or ``fork`` child). Without it the parent is read here,
    when the child has started; a parent that died while the child was still starting has
    then been replaced already (the child was re-parented), and the watchdog would watch
    the wrong process for ever. With it the child exits at once if its parent is not, or
    no longer, ``parent_pid``.
    """
    import threading
    import time

    parent = os.getppid() if parent_pid is None else parent_pid
    if os.getppid() != parent:  # the parent died while this child was starting
        os._exit(3)

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if launcher_pid is not None:
                try:
                    os.kill(launcher_pid, 0)
                except ProcessLookupError:
                    os._exit(3)
                except PermissionError:
                    pass
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="watch-parent").start()


class SharedFlag:
    """A stop (or go) signal shared with child processes, with no lock.

    ``multiprocessing.Event`` takes a lock on every ``is_set()``: a child SIGKILLed, or
    SIGSTOPped (a frozen actor, lesson 10), while it holds that lock leaves it taken, and
    every other process that asks, the parent's ``set()`` included, blocks forever. One
    byte written by one side and read by the others needs no lock (the seqlock of
    :class:`~course_lib.runtime.weights.SharedWeights` avoids locks for the same reason).
    ``ctx``: the multiprocessing context the children are started with; pass the flag to
    them as a ``Process`` argument.
    """

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float, poll_s: float = 0.002) -> bool:
        """Whether the flag is set, waiting at most ``timeout`` seconds for it (by polling)."""
        deadline = time.monotonic() + timeout
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(poll_s, left))
        return True


class ChildProcessSystem:
    """The lifecycle of a system that owns child processes (lessons 03 and 07).

    A context manager: ``with System(...) as s:`` starts it and always stops it. It starts
    once (a stopped system is not restarted: make a new one) and :meth:`_stopping` makes
    ``stop`` idempotent and unregisters it from ``atexit``. Subclasses implement ``start``
    (beginning with :meth:`_begin`) and ``stop`` (beginning with ``if not
    self._stopping(): return``).
    """

    _started = False
    _stopped = False

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _begin(self, start_method: str, preload_module: str) -> Any:
        """Mark the system started; return the multiprocessing context to start children with.

        With ``forkserver`` the server imports ``preload_module`` (torch & co) once, and
        every child forks from it instead of importing them again.
        """
        if self._started:
            raise RuntimeError("this system was already started; make a new one")
        self._started = True
        import multiprocessing as mp

        ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            ctx.set_forkserver_preload([preload_module])
        return ctx

    def _stopping(self) -> bool:
        """True the first time a started system is stopped; False when there is nothing to do."""
        if self._stopped or not self._started:
            return False
        self._stopped = True
        atexit.unregister(self.stop)
        return True
