"""Child processes: what is still alive, how to stop them, and how a child follows its parent.

Used by every lesson that starts real processes (03's actor-learner system, 07's
generators, 09's torch.distributed ranks) and by their tests, to check that nothing is
left behind. Imports only psutil, so asking costs nothing.
"""

from __future__ import annotations

import atexit
import os
from typing import Any, Self

import psutil


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


def watch_parent(launcher_pid: int | None = None, poll_s: float = 0.5) -> None:
    """In a child process: exit at once (code 3) if its parent dies, or the process that
    launched it (``launcher_pid``, e.g. the notebook kernel behind a forkserver) goes away.

    A daemon thread polls every ``poll_s`` seconds, so no orphan survives its parent,
    whatever killed the parent (``kill -9`` included).
    """
    import threading
    import time

    parent = os.getppid()

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
