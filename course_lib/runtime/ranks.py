"""N torch.distributed ranks on this machine: start them, hear from them, always stop them.

Lesson 09's systems run real ``torch.distributed`` process groups: the weight-sync ranks
(:mod:`course_lib.weight_sync.launch`) and the sharded-checkpoint ranks
(:mod:`course_lib.checkpoint.sharded`). What they share lives here:

- in the parent, :class:`RankGroup` (a :class:`~course_lib.runtime.processes.ChildProcessSystem`):
  ``world_size`` ``forkserver`` processes named ``{name}{rank}``, a results queue, a free
  port on 127.0.0.1 (one node: every rank runs on this machine, and there is no option
  for another rendezvous address); :func:`check_backend` refuses, before any rank starts,
  a backend it does not know and NCCL with fewer visible GPUs than ranks (NCCL cannot put
  two ranks of one group on one GPU); :meth:`RankGroup.silent_exits` names the ranks that exited without a
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

#: The process-group backends a :class:`RankGroup` runs: ``gloo`` (CPU tensors) and ``nccl`` (one GPU per rank).
BACKENDS = ("gloo", "nccl")


def visible_gpus() -> int:
    """The CUDA GPUs this process sees (``CUDA_VISIBLE_DEVICES`` narrows them); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_backend(backend: str, world_size: int) -> None:
    """Refuse a group that cannot start: an unknown backend, or NCCL with fewer GPUs than ranks.

    Every rank of a :class:`RankGroup` runs on this machine, and under NCCL rank ``r`` takes
    GPU ``r``: NCCL refuses two ranks of one communicator on one GPU (an obscure "duplicate
    GPU" error from inside ``init_process_group`` or the first collective), so the parent
    says it here, before any rank starts. Imports torch only for ``nccl``.

    Raises:
        ValueError: ``world_size`` is below 1, ``backend`` is not in :data:`BACKENDS`, or it
            is ``"nccl"`` and this host has fewer visible GPUs than ``world_size``; the
            message names the counts and the ways out.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use one of {', '.join(map(repr, BACKENDS))}")
    if backend != "nccl":
        return
    n_gpus = visible_gpus()
    if n_gpus >= world_size:
        return
    seen = "no CUDA GPU is visible" if n_gpus == 0 else f"only {n_gpus} GPU(s) are visible"
    fewer = "" if n_gpus == 0 else f"start at most {n_gpus} rank(s), "
    raise ValueError(
        f"backend='nccl' needs one GPU per rank, and every rank runs on this host: {world_size} ranks, "
        f"but {seen} (torch.cuda.device_count(); CUDA_VISIBLE_DEVICES narrows it). NCCL cannot put two "
        f"ranks of one group on one GPU: {fewer}use backend='gloo' (CPU tensors), "
        f"or run on a host with at least {world_size} GPUs"
    )


@dataclass(frozen=True)
class GroupSpec:
    """What every rank needs to join the group: its size, the rendezvous port on 127.0.0.1,
    the backend (``"gloo"``, or ``"nccl"`` with rank ``r`` on GPU ``r``), the timeout of every
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
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(group.port)  # one node: this machine
    try:
        if group.backend == "nccl":  # one GPU per rank: rank r on GPU r (the parent checked there are enough)
            check_backend(group.backend, group.world_size)  # again: this rank may see other GPUs than the parent
            torch.cuda.set_device(rank)
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

    One node: every rank runs on this machine and meets the others on 127.0.0.1. ``backend``
    is ``"gloo"`` or ``"nccl"``; under NCCL rank ``r`` takes GPU ``r``, so this machine must
    show at least ``world_size`` GPUs.

    Raises:
        ValueError: at construction, before any rank starts (:func:`check_backend`): an
            unknown backend, ``world_size`` below 1, or NCCL with fewer visible GPUs than ranks.
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
        check_backend(backend, world_size)
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
