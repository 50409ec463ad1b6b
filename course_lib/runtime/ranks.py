"""N torch.distributed ranks on this machine: start them, hear from them, always stop them.

Lesson 09's systems run real ``torch.distributed`` process groups: the weight-sync ranks
(:mod:`course_lib.weight_sync.launch`) and the sharded-checkpoint ranks
(:mod:`course_lib.checkpoint.sharded`). What they share lives here:

- in the parent, :class:`RankGroup` (a :class:`~course_lib.runtime.processes.ChildProcessSystem`):
  ``world_size`` ``forkserver`` processes named ``{name}{rank}``, a results queue, a free
  port on 127.0.0.1; :meth:`RankGroup.silent_exits` names the ranks that exited without a
  last report, and leaving the ``with`` block always stops every rank
  (:func:`~course_lib.runtime.processes.stop_processes`: join, terminate, kill);
- in each rank, the group's entry point: it watches the launcher (no orphan survives it),
  runs one torch thread (and, under NCCL, one GPU per rank), joins the process group with
  a timeout on every collective, runs the system's ``work(rank, results, *args)``, puts
  ``fail(rank, exc)`` on the queue if that raises ``catch``, and always leaves the group.

A system keeps only what is its own: the work a rank does, its messages, and how it reads
them. Imports no torch at import time (the ranks import it; the forkserver preloads the
system's module).
"""

from __future__ import annotations

import atexit
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from course_lib.runtime.processes import ChildProcessSystem, free_port, stop_processes, watch_parent


@dataclass(frozen=True)
class GroupSpec:
    """What every rank needs to join the group: its size, the rendezvous port on 127.0.0.1,
    the backend (``"gloo"``, or ``"nccl"`` with one GPU per rank), the timeout of every
    collective, and the pid of the launcher to watch."""

    world_size: int
    port: int
    backend: str
    timeout_s: float
    launcher_pid: int


def _rank_entry(
    rank: int,
    group: GroupSpec,
    work: Callable[..., None],
    fail: Callable[[int, BaseException], Any],
    catch: type[BaseException],
    results: Any,
    args: tuple[Any, ...],
) -> None:
    """One rank: watch the launcher, join the group, ``work(rank, results, *args)``, leave the group.

    ``catch`` raised by joining or by ``work`` puts ``fail(rank, exc)`` on ``results``.
    """
    import datetime as dt

    import torch
    import torch.distributed as dist

    # a forkserver child: its parent is the forkserver, not the launcher, so it watches the launcher
    watch_parent(launcher_pid=group.launcher_pid)
    torch.set_num_threads(1)
    if group.backend == "nccl":  # one GPU per rank
        torch.cuda.set_device(rank % torch.cuda.device_count())
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(group.port)
    try:
        dist.init_process_group(
            group.backend, rank=rank, world_size=group.world_size, timeout=dt.timedelta(seconds=group.timeout_s)
        )
        work(rank, results, *args)
    except catch as exc:
        results.put(fail(rank, exc))
    finally:
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass


class RankGroup(ChildProcessSystem):
    """``world_size`` rank processes in one process group; ``with RankGroup(...) as g:``.

    Each rank runs ``work(rank, results, *args)`` (a module-level function: a
    ``forkserver`` child imports it by name) after joining the group, and reports through
    ``self.results`` (a queue); an exception of type ``catch`` puts ``fail(rank, exc)`` there
    instead. ``preload`` is the module the forkserver imports once (the system's own).
    A subclass passes per-start arguments through :meth:`_rank_args`. Stopping joins each
    rank for ``stop_timeout_s`` in total, then terminates, then kills (``kill_wait_s``
    after each); its event lines go to ``self.events``.
    """

    def __init__(
        self,
        world_size: int,
        work: Callable[..., None],
        fail: Callable[[int, BaseException], Any],
        *,
        name: str,
        preload: str,
        timeout_s: float,
        backend: str = "gloo",
        catch: type[BaseException] = Exception,
        args: tuple[Any, ...] = (),
        stop_timeout_s: float = 5.0,
        kill_wait_s: float = 3.0,
    ) -> None:
        self.world_size = world_size
        self.work, self.fail, self.catch, self.args = work, fail, catch, args
        self.name, self.preload = name, preload
        self.backend, self.timeout_s = backend, timeout_s
        self.stop_timeout_s, self.kill_wait_s = stop_timeout_s, kill_wait_s
        self.events: list[str] = []
        self.processes: list[Any] = []
        self._exited: dict[int, float] = {}

    def _rank_args(self) -> tuple[Any, ...]:
        """The arguments after ``(rank, results)`` of every rank's ``work``; called once, at start."""
        return self.args

    def start(self) -> None:
        """Make the results queue, pick a port, start every rank (a failed start stops those started)."""
        ctx = self._begin("forkserver", self.preload)
        self.results = ctx.Queue()
        group = GroupSpec(self.world_size, free_port(), self.backend, self.timeout_s, os.getpid())
        common = (group, self.work, self.fail, self.catch, self.results, self._rank_args())
        self.processes = [
            ctx.Process(target=_rank_entry, args=(r, *common), daemon=True, name=f"{self.name}{r}")
            for r in range(self.world_size)
        ]
        atexit.register(self.stop)
        try:
            for p in self.processes:
                p.start()
        except BaseException:
            self.stop()
            raise

    def silent_exits(self, answered: Collection[int], grace_s: float) -> dict[int, int]:
        """``{rank: exit code}`` of the ranks not in ``answered`` that exited more than ``grace_s``
        seconds ago (a report can still be in the pipe when its rank has exited)."""
        now, gone = time.monotonic(), {}
        for r, p in enumerate(self.processes):
            if p.exitcode is None or r in answered:
                continue
            if now - self._exited.setdefault(r, now) > grace_s:
                gone[r] = p.exitcode
        return gone

    def stop(self) -> None:
        """Stop every started rank (join, then terminate, then kill) and close the queue."""
        if not self._stopping():
            return
        started = [(p.name, p) for p in self.processes if p.pid is not None]
        self.events += stop_processes(started, timeout=self.stop_timeout_s, kill_wait=self.kill_wait_s)
        self.results.close()
