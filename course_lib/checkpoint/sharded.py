"""Sharded torch checkpoints with ``torch.distributed.checkpoint`` (DCP), resharded on load.

A model's state lives sharded over ``N`` gloo ranks: every weight is a ``DTensor`` placed
``Shard(0)`` on a CPU ``DeviceMesh``, so rank ``r`` holds rows ``[r*c, min((r+1)*c, n))`` of
an ``n``-row weight, ``c = ceil(n / N)`` (:func:`row_shard`; a late rank may hold none).
Adam's moments are sharded the same way. :func:`save_sharded` starts ``N`` real ranks that
train ``steps`` Adam steps and save with ``dcp.save``; :func:`load_resharded` starts ``M``
ranks (any ``M``) that build the same model in *their* sharding and ``dcp.load`` into it:
each rank reads every saved chunk that overlaps the rows it now owns (``FileSystemReader``
loads such a chunk whole, then narrows it to the overlap). :func:`load_full` reads the
whole state in this process, with no process group, for inspection.

On-disk layout of a DCP checkpoint directory (``FileSystemWriter``)::

    .metadata        pickled ``Metadata``: every key's global shape, dtype and chunks
                     (offsets, sizes) and where each chunk's bytes lie
    __0_0.distcp     rank 0's bytes (``__{rank}_{file}``; one file per rank by default)
    __1_0.distcp     rank 1's bytes ...

The commit: every rank writes (and fsyncs) its own ``.distcp`` file; the coordinator
(rank 0) gathers every rank's write results and only then writes ``.metadata.tmp``, fsyncs
it and renames it to ``.metadata``. ``.metadata`` is therefore the commit record: a save
killed before that rename (any rank, any moment) leaves data files but no ``.metadata``,
and :func:`check_complete` refuses the directory (:class:`IncompleteCheckpoint`). A save
goes to a fresh directory per step, so the previous checkpoint is never touched. (DCP
does not fsync the directory after the rename; a power cut, unlike a killed process, could
still lose the rename.)

Every wait has a deadline: gloo collectives time out after ``timeout_s``, the parent
gives up after ``deadline_s`` and stops every rank (join, terminate, kill); a rank exits
by itself if its parent dies.
"""

from __future__ import annotations

import math
import os
import queue as queue_mod
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_lib.runtime.processes import exit_reason
from course_lib.runtime.ranks import RankGroup

#: A small model with uneven row counts (7 rows over 2 or 3 ranks; 2 rows leave rank 2 empty).
SMALL_SHAPES: tuple[tuple[str, tuple[int, ...]], ...] = (("w0", (7, 5)), ("w1", (2, 3)), ("bias", (4,)))
METADATA = ".metadata"


class IncompleteCheckpoint(RuntimeError):
    """A DCP directory without its commit record (``.metadata``): the save did not finish."""


class RanksFailed(RuntimeError):
    """A rank failed or died, or the ranks missed their deadline; every rank was stopped."""


@dataclass
class ShardedRun:
    """What one group of ranks reported.

    ``shards[rank][key]`` is that rank's local rows of ``key`` (``model.w0``,
    ``optim.w0.exp_avg``, ``optim.w0.step``: the step is a replicated scalar), ``seconds[rank]``
    the time it spent in ``dcp.save`` / ``dcp.load`` (from a barrier).
    """

    world_size: int
    shards: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    lr: dict[int, float] = field(default_factory=dict)  # after a load with the optimizer: Adam's restored lr

    def full(self, key: str) -> torch.Tensor:
        """``key``'s whole tensor: the ranks' rows concatenated in rank order (a scalar: rank 0's)."""
        parts = [self.shards[r][key] for r in range(self.world_size)]
        return parts[0] if parts[0].dim() == 0 else torch.cat(parts)


def row_range(n_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """The rows ``[start, end)`` that ``Shard(0)`` gives ``rank`` of ``world_size``: chunks of ``ceil(n / world)``."""
    chunk = math.ceil(n_rows / world_size)
    start = min(rank * chunk, n_rows)
    return start, min(start + chunk, n_rows)


def row_shard(full: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """``rank``'s rows of ``full`` under ``Shard(0)`` over ``world_size`` ranks (a scalar stays whole)."""
    if full.dim() == 0:
        return full
    start, end = row_range(full.shape[0], rank, world_size)
    return full[start:end]


def check_complete(directory: str | Path) -> Path:
    """``directory`` if it holds a committed DCP checkpoint (its ``.metadata``), else raise.

    Raises:
        IncompleteCheckpoint: no such directory, or data files without ``.metadata``.
    """
    path = Path(directory)
    if not path.is_dir():
        raise IncompleteCheckpoint(f"no checkpoint directory {path}: save there first (save_sharded)")
    if not (path / METADATA).is_file():
        found = sorted(p.name for p in path.iterdir())
        raise IncompleteCheckpoint(
            f"{path} is not a complete DCP checkpoint: it has no {METADATA} (found {found}). DCP's coordinator "
            "writes .metadata last, after every rank's data, so the save that wrote here was interrupted; "
            "load the previous checkpoint directory instead."
        )
    return path


# ----------------------------------------------------------------------------- in a rank


def _build(shapes: tuple[tuple[str, tuple[int, ...]], ...], seed: int, lr: float) -> tuple[Any, Any]:
    """The model (``ParameterDict`` of ``Shard(0)`` DTensors, values from ``seed``) and its Adam, in this world."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    gen = torch.Generator().manual_seed(seed)
    params = {
        name: torch.nn.Parameter(
            distribute_tensor(torch.randn(shape, generator=gen), mesh, [Shard(0)], src_data_rank=None)
        )
        for name, shape in shapes
    }  # every rank draws the same full tensors and keeps its rows: no communication
    model = torch.nn.ParameterDict(params)
    return model, torch.optim.Adam(model.parameters(), lr=lr)


def _train(model: Any, optimizer: Any, steps: int) -> None:
    """``steps`` Adam steps on ``sum(sin(p) * p)`` (elementwise: each rank's gradient is its rows')."""
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum((torch.sin(p) * p).sum() for p in model.values())
        loss.backward()
        optimizer.step()


def _state(model: Any, optimizer: Any | None) -> dict[str, Any]:
    """DCP's state dict: ``{"model": ...}`` plus ``{"optim": ...}`` (keyed by parameter name)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd}


def _local(model: Any, optimizer: Any | None) -> dict[str, np.ndarray]:
    """This rank's rows of every parameter and Adam moment (``numpy``: pickled by value through the queue)."""

    def rows(t: Any) -> np.ndarray:
        local = t.to_local() if hasattr(t, "to_local") else t
        return np.array(local.detach(), copy=True)

    out = {f"model.{name}": rows(p) for name, p in model.items()}
    if optimizer is not None:
        for name, p in model.items():
            for key, value in optimizer.state[p].items():
                out[f"optim.{name}.{key}"] = rows(value)
    return out


def _killing_writer(directory: str) -> Any:
    """A ``FileSystemWriter`` whose rank SIGKILLs itself once its data file is written: before the commit."""
    from torch.distributed.checkpoint import FileSystemWriter

    class KillAfterWrite(FileSystemWriter):
        def write_data(self, plan: Any, planner: Any) -> Any:
            super().write_data(plan, planner).wait()
            os.kill(os.getpid(), signal.SIGKILL)

    return KillAfterWrite(directory)


def _save(task: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    model, optimizer = _build(task["shapes"], task["seed"], task["lr"])
    _train(model, optimizer, task["steps"])
    state = _state(model, optimizer if task["optimizer"] else None)
    writer = _killing_writer(task["directory"]) if task["kill_rank"] == rank else None
    dist.barrier()
    start = time.perf_counter()
    dcp.save(state, checkpoint_id=task["directory"], storage_writer=writer)
    seconds = time.perf_counter() - start
    shards = _local(model, optimizer if task["optimizer"] else None) if task["return_shards"] else {}
    return {"seconds": seconds, "shards": shards}


def _load(task: dict[str, Any], rank: int) -> dict[str, Any]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    # other values, another lr: the load must overwrite them all
    model, optimizer = _build(task["shapes"], task["seed"] + 1, task["lr"] * 3)
    opt = optimizer if task["optimizer"] else None
    state = _state(model, opt)  # with an optimizer: Adam's state initialised, so DCP has tensors to load into
    dist.barrier()
    start = time.perf_counter()
    dcp.load(state, checkpoint_id=task["directory"])
    seconds = time.perf_counter() - start
    if opt is None:
        set_model_state_dict(model, state["model"])
    else:
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    out: dict[str, Any] = {"seconds": seconds, "lr": opt.param_groups[0]["lr"] if opt else None}
    out["shards"] = _local(model, opt) if task["return_shards"] else {}
    return out


def _describe(exc: BaseException) -> str:
    """``"ValueError: Size mismatch ..."``; for DCP's ``CheckpointException`` the ranks' own errors, not tracebacks."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = [w[0] if isinstance(w, tuple) else w for w in failures.values()]  # (exception, traceback)
        return "; ".join(sorted({f"{type(e).__name__}: {e}" for e in inner}))
    return f"{type(exc).__name__}: {exc}"


def _rank_work(rank: int, results: Any, task: dict[str, Any]) -> None:
    """One rank, in its gloo group (collectives time out after ``task["timeout_s"]``): run the task, report."""
    report = (_save if task["kind"] == "save" else _load)(task, rank)
    results.put((rank, report, None))


def _rank_failed(rank: int, exc: BaseException) -> tuple[int, None, str]:
    return (rank, None, _describe(exc))


# ----------------------------------------------------------------------------- in the parent


class DcpRanks(RankGroup):
    """``world_size`` rank processes running one DCP task; ``with DcpRanks(...) as g: g.collect(...)``.

    Leaving the block always stops every rank (``stop_processes``: join, terminate, kill).
    """

    def __init__(self, world_size: int, task: dict[str, Any]) -> None:
        super().__init__(
            world_size,
            _rank_work,
            _rank_failed,
            name="dcp-rank",
            preload=__name__,
            timeout_s=task["timeout_s"],
            catch=BaseException,  # DCP's CheckpointException is a BaseException
            args=(task,),
            stop_timeout_s=5.0,
            kill_wait_s=3.0,
        )
        self.task = task

    def collect(self, deadline_s: float) -> dict[int, dict[str, Any]]:
        """Every rank's report. Raises :class:`RanksFailed` naming each rank's error or exit (``killed by SIGKILL``)."""
        reports: dict[int, dict[str, Any]] = {}
        failures: dict[int, str] = {}
        end = time.monotonic() + deadline_s
        while len(reports) + len(failures) < self.world_size:
            try:
                rank, report, error = self.results.get(timeout=0.2)
            except queue_mod.Empty:
                # a rank that exited without a report, 1 s after its exit (a report may still be in the pipe)
                for r, code in self.silent_exits(reports.keys() | failures.keys(), grace_s=1.0).items():
                    failures[r] = f"died without a report ({exit_reason(code)})"
                if time.monotonic() > end:
                    failures[-1] = f"the ranks did not finish within {deadline_s:.0f} s"
                    break
                continue
            if error is None:
                reports[rank] = report
            else:
                failures[rank] = error
        if failures:
            lines = [f"rank {r}: {why}" for r, why in sorted(failures.items())]
            raise RanksFailed("; ".join(lines) + "; every rank was stopped")
        return reports


def _run(world_size: int, task: dict[str, Any], deadline_s: float) -> ShardedRun:
    """Run ``task`` in ``world_size`` fresh ranks; merge their reports (shards back as torch tensors)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    with DcpRanks(world_size, task) as group:
        reports = group.collect(deadline_s)
    run = ShardedRun(world_size)
    for rank, report in reports.items():
        run.seconds[rank] = report["seconds"]
        if report.get("lr") is not None:
            run.lr[rank] = report["lr"]
        run.shards[rank] = {k: torch.from_numpy(v) for k, v in report["shards"].items()}
    return run


def save_sharded(
    directory: str | Path,
    world_size: int,
    seed: int = 0,
    *,
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = SMALL_SHAPES,
    steps: int = 2,
    optimizer: bool = True,
    lr: float = 0.1,
    kill_rank: int | None = None,
    return_shards: bool = True,
    timeout_s: float = 10.0,
    deadline_s: float = 60.0,
) -> ShardedRun:
    """Train ``steps`` Adam steps on ``world_size`` ranks, then ``dcp.save`` to ``directory`` (a fresh one).

    Every rank writes its rows (``__{rank}_0.distcp``); rank 0 commits ``.metadata`` last.
    ``optimizer`` saves Adam's moments and step beside the weights (``get_state_dict``).
    ``kill_rank`` SIGKILLs that rank after its data file is written, before the commit (a
    crash mid-save): the save raises :class:`RanksFailed` and ``directory`` has no
    ``.metadata``. Returns each rank's saved rows and its seconds in ``dcp.save``.
    """
    if Path(directory).exists() and any(Path(directory).iterdir()):
        raise FileExistsError(f"{directory} is not empty: save each checkpoint to a fresh directory")
    task = dict(
        kind="save",
        directory=str(directory),
        shapes=shapes,
        seed=seed,
        steps=steps,
        optimizer=optimizer,
        lr=lr,
        kill_rank=kill_rank,
        return_shards=return_shards,
        timeout_s=timeout_s,
    )
    return _run(world_size, task, deadline_s)


def load_resharded(
    directory: str | Path,
    world_size: int,
    *,
    shapes: tuple[tuple[str, tuple[int, ...]], ...] = SMALL_SHAPES,
    optimizer: bool = True,
    lr: float = 0.1,
    return_shards: bool = True,
    timeout_s: float = 10.0,
    deadline_s: float = 60.0,
) -> ShardedRun:
    """``dcp.load`` a committed checkpoint into ``world_size`` ranks, each in its own ``Shard(0)`` rows.

    The ranks build the model (other values, Adam at ``3 * lr``) and load into it, then
    ``set_state_dict``: weights, Adam's moments, step and learning rate all come from the
    checkpoint. Rank ``r``'s rows of a key equal ``row_shard(saved_full, r, world_size)``
    bitwise. Raises :class:`IncompleteCheckpoint` before starting any rank if
    ``directory`` has no ``.metadata``.
    """
    check_complete(directory)
    task = dict(
        kind="load",
        directory=str(directory),
        shapes=shapes,
        seed=0,
        optimizer=optimizer,
        lr=lr,
        return_shards=return_shards,
        timeout_s=timeout_s,
    )
    return _run(world_size, task, deadline_s)


def load_full(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint, whole, in this process with no process group.

    DCP's single-process path: read ``.metadata``, allocate each tensor at its global
    shape and dtype, and ``dcp.load`` into those plain tensors (with no process group DCP
    loads locally, reading every rank's chunks). Keys are DCP's flattened names:
    ``model.w0``, ``optim.state.w0.exp_avg``, ``optim.state.w0.step``; non-tensor entries
    (Adam's ``param_groups``) are left out.
    """
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    path = check_complete(directory)
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    state = {
        key: torch.empty(md.size, dtype=md.properties.dtype)
        for key, md in metadata.state_dict_metadata.items()
        if isinstance(md, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path))
    return state
