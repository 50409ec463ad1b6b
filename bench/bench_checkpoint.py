"""Lesson 10: what a checkpoint of a 256 MiB state costs, and the training time it takes away.

**Save and restore.** One 256 MiB float32 state (25 tensors: a 64 MiB embedding and 4
transformer-like layers of 4-16 MiB matrices and 4 KiB norms) saved and restored by each
library, interleaved round by round (``torch.save``, safetensors, Orbax sync, Orbax async,
DCP), median of ``ROUNDS``. Every save goes to a fresh directory in a temporary folder on
the disk of the checkout and is durable when timed (torch.save and safetensors are
followed by an ``fsync`` of the file; DCP fsyncs its files itself; Orbax writes through
TensorStore and commits by renaming its temporary directory). Before every restore the
files are fsynced and evicted from the page cache (``posix_fadvise(DONTNEED)``), so
restores read the disk; every restored tensor is touched on every page (mmap loads are
lazy). DCP: 2 gloo ranks save their row halves (``course_lib.checkpoint.sharded``); 1 rank
or 2 load them; the time is the slowest rank's, from a barrier (process start excluded).

**Training time lost per checkpoint.** A jitted JAX step updates 256 MiB of parameters
(4 matrices 4096 x 4096, an SGD-like elementwise update: 90-170 ms a step on this shared
2-core machine); ``STEPS`` steps with a checkpoint every ``EVERY`` steps (not at the last
step: every save has ``EVERY`` steps to overlap) with no checkpoint, a blocking Orbax save
and an asynchronous one, interleaved. Lost per checkpoint = (time with - time without) /
number of checkpoints (eq. 10.1's C, measured); the asynchronous save's blocking part is
eq. 10.4's C_block, timed after ``block_until_ready`` (JAX dispatches steps ahead: the
``save`` call would also wait for the queued steps). The clock stops when the last
checkpoint is committed (``wait_until_finished``).

    python bench/run.py checkpoint      # table into BENCHMARKS.md
    python bench/bench_checkpoint.py    # table to stdout only
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import torch
from run import Result, render

from course_lib.checkpoint.atomic import fsync_file
from course_lib.checkpoint.cost import train_with_checkpoints
from course_lib.checkpoint.sharded import load_resharded, save_sharded

ROUNDS = 3
TRAIN_ROUNDS = 5
STEPS = 60
EVERY = 15
LAYERS = 4
D, FF, VOCAB = 1024, 4096, 16384
SHAPES: tuple[tuple[str, tuple[int, ...]], ...] = (("embed", (VOCAB, D)),) + tuple(
    (f"layer{i}_{name}", shape)
    for i in range(LAYERS)
    for name, shape in (
        ("qkv", (3 * D, D)),
        ("out", (D, D)),
        ("up", (FF, D)),
        ("down", (D, FF)),
        ("norm1", (D,)),
        ("norm2", (D,)),
    )
)
NBYTES = 4 * sum(int(np.prod(s)) for _, s in SHAPES)
MB = 1e6


def make_state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, generator=gen) for name, shape in SHAPES}


def touch(arrays: Iterator[Any]) -> float:
    """Read one float of every 4 KiB page of every array (forces lazy/mmap loads in)."""
    return float(sum(np.asarray(a).reshape(-1)[::1024].sum() for a in arrays))


def evict(path: Path) -> None:
    """fsync every file under ``path`` and drop it from the page cache: the next read hits the disk."""
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


@contextmanager
def fresh_dir(root: Path, name: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- save / restore, one method each


def bench_torch(state: dict[str, torch.Tensor], d: Path) -> dict[str, float]:
    f = d / "state.pt"

    def save() -> None:
        torch.save(state, f)
        fsync_file(f)

    out = {"save": timed(save)}
    evict(f)
    out["restore"] = timed(lambda: touch(iter(torch.load(f).values())))
    return out


def bench_safetensors(state: dict[str, torch.Tensor], d: Path) -> dict[str, float]:
    from safetensors.torch import load_file, save_file

    f = d / "state.safetensors"

    def save() -> None:
        save_file(state, str(f))
        fsync_file(f)

    out = {"save": timed(save)}
    evict(f)
    out["restore"] = timed(lambda: touch(iter(load_file(str(f)).values())))
    return out


def orbax_manager(d: Path, asynchronous: bool) -> Any:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=asynchronous)
    return ocp.CheckpointManager(d, options=options)


def bench_orbax(tree: dict[str, Any], d: Path, asynchronous: bool) -> dict[str, float]:
    import jax
    import orbax.checkpoint as ocp

    out: dict[str, float] = {}
    with orbax_manager(d / "ckpt", asynchronous) as mgr:
        start = time.perf_counter()
        mgr.save(1, args=ocp.args.StandardSave(tree))
        out["block"] = time.perf_counter() - start
        mgr.wait_until_finished()
        out["save"] = time.perf_counter() - start
    evict(d / "ckpt")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    with orbax_manager(d / "ckpt", False) as mgr:
        start = time.perf_counter()
        restored = mgr.restore(1, args=ocp.args.StandardRestore(abstract))
        touch(iter(jax.block_until_ready(restored).values()))
        out["restore"] = time.perf_counter() - start
    return out


def bench_dcp(d: Path) -> dict[str, float]:
    """2 ranks save their halves; 1 rank, then 2 ranks, load (slowest rank, from a barrier)."""
    common = dict(shapes=SHAPES, optimizer=False, return_shards=False, timeout_s=120.0, deadline_s=300.0)
    saved = save_sharded(d / "dcp", 2, steps=0, **common)  # type: ignore[arg-type]
    out = {"save": max(saved.seconds.values())}
    for world in (1, 2):
        evict(d / "dcp")
        loaded = load_resharded(d / "dcp", world, **common)  # type: ignore[arg-type]
        out[f"restore{world}"] = max(loaded.seconds.values())
    return out


def measure_save_restore(root: Path) -> dict[str, list[dict[str, float]]]:
    import jax.numpy as jnp

    state = make_state()
    tree = {k: jnp.asarray(v.numpy()) for k, v in state.items()}
    methods: dict[str, Callable[[Path], dict[str, float]]] = {
        "torch": lambda d: bench_torch(state, d),
        "safetensors": lambda d: bench_safetensors(state, d),
        "orbax_sync": lambda d: bench_orbax(tree, d, asynchronous=False),
        "orbax_async": lambda d: bench_orbax(tree, d, asynchronous=True),
        "dcp": bench_dcp,
    }
    with fresh_dir(root, "warmup") as d:  # first-use costs (imports, Orbax's thread pools) out of the timings
        small = {k: v[:8] for k, v in tree.items()}
        bench_orbax(small, d, asynchronous=True)
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in range(ROUNDS):
        for name, fn in methods.items():
            with fresh_dir(root, name) as d:
                results[name].append(fn(d))
            print(f"  round {r + 1}/{ROUNDS} {name}: {results[name][-1]}", flush=True)
    return results


# ----------------------------------------------------------------------------- training time lost


def training_run(params: Any, mode: str, root: Path) -> dict[str, float]:
    """``STEPS`` jitted steps, a checkpoint every ``EVERY`` (mode none / sync / async); wall seconds, blocking."""
    with fresh_dir(root, f"train-{mode}") as d:
        seconds, block = train_with_checkpoints(params, mode, STEPS, EVERY, 1, d / "ckpt")
    return {"seconds": seconds, "block": block}


def measure_training(root: Path) -> dict[str, list[dict[str, float]]]:
    import jax

    keys = jax.random.split(jax.random.key(0), 4)
    params = {f"w{i}": jax.random.normal(k, (4096, 4096)) for i, k in enumerate(keys)}
    training_run(params, "none", root)  # warm-up, untimed: the first run pays for fresh 256 MiB buffers
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in range(TRAIN_ROUNDS):
        for mode in ("none", "sync", "async"):
            results[mode].append(training_run(params, mode, root))
            print(f"  round {r + 1}/{TRAIN_ROUNDS} train {mode}: {results[mode][-1]}", flush=True)
    return results


# ----------------------------------------------------------------------------- table


def med(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def row(label: str, save: float, restore: float, block: float | None = None) -> list[str]:
    return [
        label,
        f"{save:.2f}",
        f"{NBYTES / MB / save:.0f}",
        f"{block:.3f}" if block is not None else f"{save:.2f}",
        f"{restore:.2f}" if restore else "-",
        f"{NBYTES / MB / restore:.0f}" if restore else "-",
    ]


def run() -> Result:
    root = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        load0 = os.getloadavg()
        io = measure_save_restore(root)
        load1 = os.getloadavg()
        train = measure_training(root)
        load2 = os.getloadavg()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [
        row("torch.save / torch.load (reference)", med(io["torch"], "save"), med(io["torch"], "restore")),
        row("safetensors save_file / load_file", med(io["safetensors"], "save"), med(io["safetensors"], "restore")),
        row("Orbax sync (CheckpointManager)", med(io["orbax_sync"], "save"), med(io["orbax_sync"], "restore")),
        row(
            "Orbax async (CheckpointManager)",
            med(io["orbax_async"], "save"),
            med(io["orbax_async"], "restore"),
            block=med(io["orbax_async"], "block"),
        ),
        row("DCP, 2 ranks save / 1 rank loads", med(io["dcp"], "save"), med(io["dcp"], "restore1")),
        row("DCP, 2 ranks save / 2 ranks load", med(io["dcp"], "save"), med(io["dcp"], "restore2")),
    ]
    n_ckpt = (STEPS - 1) // EVERY
    none = med(train["none"], "seconds")
    lost = {m: (med(train[m], "seconds") - none) / n_ckpt for m in ("sync", "async")}
    notes = [
        f"State: {len(SHAPES)} float32 tensors, {NBYTES / 2**20:.0f} MiB ({NBYTES / MB:.0f} MB; MB/s = 1e6 bytes/s). "
        f"Median of {ROUNDS} rounds, methods interleaved. Load average (1/5/15 min) of this shared 2-core machine: "
        f"{load0[0]:.1f}/{load0[1]:.1f}/{load0[2]:.1f} before, {load1[0]:.1f}/{load1[1]:.1f}/{load1[2]:.1f} after "
        f"the save/restore rounds, {load2[0]:.1f}/{load2[1]:.1f}/{load2[2]:.1f} after the training rounds.",
        "Save = until durable (fsync; Orbax: until committed, `wait_until_finished`); 'blocks' = what the caller "
        "waits for (Orbax async: the `save` call; the rest is written in the background). Restore = every page "
        "of every tensor read, the files evicted from this VM's page cache (`posix_fadvise(DONTNEED)`); the "
        "virtual disk may still be cached by the host, so restores are upper bounds on a cold read.",
        "DCP times are inside the ranks (slowest rank, from a barrier); starting the ranks (~2-4 s here) is "
        "not counted.",
        f"Training time lost per checkpoint (jitted JAX loop over 256 MiB of parameters, {STEPS} steps, a "
        f"checkpoint every {EVERY} steps, none at the end: {n_ckpt} checkpoints of 256 MiB; median of {TRAIN_ROUNDS} "
        f"runs, interleaved): no checkpoint {none:.2f} s ({none / STEPS * 1e3:.0f} ms/step); blocking Orbax save "
        f"{med(train['sync'], 'seconds'):.2f} s = **{lost['sync']:.2f} s lost per checkpoint** (the `save` call: "
        f"{med(train['sync'], 'block'):.2f} s); async Orbax save {med(train['async'], 'seconds'):.2f} s = "
        f"**{lost['async']:.2f} s lost per checkpoint**, of which the `save` call blocked "
        f"{med(train['async'], 'block'):.3f} s (eq. 10.4's C_block). The `save` calls are timed after "
        "`block_until_ready` (JAX runs dispatched steps later).",
        "In the loop a save also deletes the previous checkpoint (`max_to_keep=1`). The async `save` call returns "
        "after a few ms on CPU (Orbax keeps references to the immutable JAX arrays; with donated buffers it must "
        "copy first) unless the previous save is still being written, which it then waits for (Orbax logs "
        "'Waiting for previous save to complete').",
        "On 2 cores the asynchronous writer competes with the training step for the same cores (XLA uses both), "
        "so the overlap is partial: the async save hides the disk wait but not the CPU work of serialising; on a "
        "GPU host the step runs on the accelerator and the host cores are free for the writer.",
    ]
    return Result(
        title="Checkpoint cost of a 256 MiB state: save, restore, and training time lost (lesson 10)",
        columns=["method", "save s", "save MB/s", "blocks s", "restore s", "restore MB/s"],
        rows=rows,
        notes=notes,
    )


if __name__ == "__main__":
    print(render("checkpoint", run()))
