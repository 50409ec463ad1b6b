"""What a checkpoint costs a training loop: the save against the state's size, and the
training time each checkpoint takes away, blocking against asynchronous (lesson 10).

Two measurements, both with Orbax's ``CheckpointManager`` on the arrays of a JAX state:

- :func:`save_costs`: for each state size, a blocking save (the call returns once the step
  is committed), and an asynchronous one, timed twice: the ``save`` call (what the loop
  waits for, eq. 10.4's ``C_block``) and until ``wait_until_finished`` returns (written and
  committed). Sizes and modes interleaved, fresh directories, ``reps`` of each.
- :func:`training_time_lost`: the same jitted training loop run with no checkpoint, with a
  blocking save every ``every`` steps and with an asynchronous one, interleaved
  (none, blocking, async, none, ...). The cost of a checkpoint to training, eq. 10.1's
  ``C``, is ``(wall time with - wall time without) / checkpoints`` (runs of one repeat
  paired, median over repeats): for an asynchronous
  save that counts the call *and* whatever the background write takes from the loop
  (cores, memory bandwidth, the wait when a save is still being written at the next).

The ``save`` call is timed after ``jax.block_until_ready`` (JAX dispatches steps ahead; the
call would otherwise wait for the queued steps too); the clock of a run stops when its last
checkpoint is committed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODES = ("none", "blocking", "async")


def make_state(mib: float, n_mats: int = 4, seed: int = 0) -> dict[str, Any]:
    """``n_mats`` float32 square matrices of ``mib`` MiB in all (rounded down to whole rows), on the device."""
    import jax

    if not mib > 0 or n_mats < 1:
        raise ValueError(f"need mib > 0 and n_mats >= 1, got mib={mib}, n_mats={n_mats}")
    side = int((mib * 2**20 / 4 / n_mats) ** 0.5)
    if side < 1:
        raise ValueError(f"{mib} MiB over {n_mats} matrices is less than one float32 each")
    state = {f"w{i}": jax.random.normal(jax.random.key(seed + i), (side, side)) for i in range(n_mats)}
    return jax.block_until_ready(state)


def state_bytes(state: dict[str, Any]) -> int:
    """Bytes of every array of ``state``."""
    return int(sum(x.nbytes for x in state.values()))


def _manager(directory: Path, asynchronous: bool) -> Any:
    import orbax.checkpoint as ocp
    from orbax.checkpoint import checkpoint_managers

    options = ocp.CheckpointManagerOptions(
        preservation_policy=checkpoint_managers.LatestN(n=1), enable_async_checkpointing=asynchronous
    )
    return ocp.CheckpointManager(directory, options=options)


@dataclass(frozen=True)
class SaveCost:
    """Median seconds of the saves of one state size (``runs`` keeps every repeat).

    Attributes:
        mib: the state's size, MiB.
        blocking: a blocking save, call to commit.
        async_call: the asynchronous ``save`` call (what the loop waits for).
        async_written: the asynchronous save until written and committed.
    """

    mib: float
    blocking: float
    async_call: float
    async_written: float
    runs: dict[str, list[float]] = field(compare=False, repr=False)


def save_costs(sizes_mib: Sequence[float], reps: int = 3, root: Path | None = None) -> list[SaveCost]:
    """Time Orbax saves of states of ``sizes_mib`` MiB, blocking and asynchronous, interleaved; medians of ``reps``."""
    import orbax.checkpoint as ocp

    if reps < 1 or not sizes_mib:
        raise ValueError(f"need reps >= 1 and at least one size, got reps={reps}, sizes={list(sizes_mib)}")
    work = Path(tempfile.mkdtemp(prefix="save-costs-", dir=root))
    states = {mib: make_state(mib) for mib in sizes_mib}
    runs: dict[float, dict[str, list[float]]] = {
        m: {"blocking": [], "async_call": [], "async_written": []} for m in states
    }
    try:
        for rep in range(reps):
            for mib, state in states.items():
                for asynchronous in (False, True):
                    mgr = _manager(work / f"{mib}-{asynchronous}-{rep}", asynchronous)
                    start = time.perf_counter()
                    mgr.save(0, args=ocp.args.StandardSave(state))
                    called = time.perf_counter() - start
                    mgr.wait_until_finished()
                    written = time.perf_counter() - start
                    mgr.close()
                    if asynchronous:
                        runs[mib]["async_call"].append(called)
                        runs[mib]["async_written"].append(written)
                    else:
                        runs[mib]["blocking"].append(written)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [
        SaveCost(
            mib=state_bytes(states[m]) / 2**20,
            blocking=statistics.median(r["blocking"]),
            async_call=statistics.median(r["async_call"]),
            async_written=statistics.median(r["async_written"]),
            runs=r,
        )
        for m, r in runs.items()
    ]


@dataclass(frozen=True)
class TimeLost:
    """The training loop's wall seconds with no checkpoint, blocking and asynchronous saves.

    Attributes:
        seconds: ``{mode: [wall seconds of each repeat]}``, modes as in :data:`MODES`.
        calls: ``{mode: [mean seconds of the save call in each repeat]}`` (not for ``none``).
        n_checkpoints: checkpoints per run.
        steps: training steps per run.
        mib: the state's size, MiB.
    """

    seconds: dict[str, list[float]]
    calls: dict[str, list[float]]
    n_checkpoints: int
    steps: int
    mib: float

    def median(self, mode: str) -> float:
        """Median wall seconds of a run in ``mode``."""
        return statistics.median(self.seconds[mode])

    def lost_per_checkpoint(self, mode: str) -> float:
        """Training seconds a checkpoint costs (eq. 10.1's C): the median over repeats of (this
        repeat's run with checkpoints - its run without) / checkpoints. Pairing the runs of one
        repeat, which ran back to back, cancels most of the drift of a shared machine's load."""
        pairs = zip(self.seconds[mode], self.seconds["none"], strict=True)
        return statistics.median((w - wo) / self.n_checkpoints for w, wo in pairs)

    def call(self, mode: str) -> float:
        """Median seconds the ``save`` call blocked."""
        return statistics.median(self.calls[mode])


def train_with_checkpoints(
    params: Any, mode: str, steps: int, every: int, passes: int, directory: Path
) -> tuple[float, float]:
    """Wall seconds of ``steps`` jitted steps (``passes`` elementwise updates of every parameter
    each) with a checkpoint every ``every`` (mode ``none`` / ``sync`` / ``async``; none at the last
    step), and the mean seconds the ``save`` call blocked. Also bench/bench_checkpoint.py's run."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    @jax.jit
    def step(p: Any) -> Any:  # `passes` elementwise updates of every parameter: a stand-in for a training step
        def update(_: Any, q: Any) -> Any:
            return jax.tree.map(lambda w: w - 1e-3 * (w * jnp.abs(w) - 0.5 * w), q)

        return jax.lax.fori_loop(0, passes, update, p)

    mgr = None if mode == "none" else _manager(directory, mode == "async")
    p = jax.block_until_ready(step(params))  # compiled before the clock starts
    calls: list[float] = []
    start = time.perf_counter()
    for k in range(1, steps + 1):
        p = step(p)
        if mgr is not None and k % every == 0 and k < steps:  # none at the end: each save has `every` steps to overlap
            jax.block_until_ready(p)
            t = time.perf_counter()
            mgr.save(k, args=ocp.args.StandardSave(p))
            calls.append(time.perf_counter() - t)
    jax.block_until_ready(p)
    if mgr is not None:
        mgr.wait_until_finished()
    seconds = time.perf_counter() - start
    if mgr is not None:
        mgr.close()
    return seconds, statistics.mean(calls) if calls else 0.0


def training_time_lost(
    mib: float, steps: int = 80, every: int = 20, reps: int = 3, passes: int = 4, root: Path | None = None
) -> TimeLost:
    """Run a jitted loop over a ``mib`` MiB state ``steps`` steps, a checkpoint every ``every``
    (none at the last step), with no checkpoint / blocking / asynchronous saves, interleaved,
    ``reps`` times each after one untimed warm-up run. A step is ``passes`` elementwise updates
    of every parameter (more passes: a longer step, more time for an asynchronous write to overlap)."""
    if not (steps >= 2 and 1 <= every < steps and reps >= 1 and passes >= 1):
        raise ValueError(
            f"need steps >= 2, 1 <= every < steps, reps >= 1, passes >= 1; got {steps}, {every}, {reps}, {passes}"
        )
    work = Path(tempfile.mkdtemp(prefix="time-lost-", dir=root))
    params = make_state(mib)
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    calls: dict[str, list[float]] = {m: [] for m in MODES[1:]}
    try:
        train_with_checkpoints(params, "none", steps, every, passes, work / "warm-up")
        for rep in range(reps):
            for mode in MODES:
                s, c = train_with_checkpoints(params, mode, steps, every, passes, work / f"{mode}-{rep}")
                seconds[mode].append(s)
                if mode != "none":
                    calls[mode].append(c)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return TimeLost(seconds, calls, (steps - 1) // every, steps, state_bytes(params) / 2**20)


def seal_seconds(mib: float, reps: int = 3, root: Path | None = None) -> float:
    """Median seconds :class:`~course_lib.checkpoint.jax_state.JaxCheckpoints` adds to a committed
    Orbax step of a ``mib`` MiB state when it seals it: re-read every file, SHA-256 it, write and
    fsync the manifest (:func:`~course_lib.checkpoint.atomic.write_manifest`). The step's files were
    just written, so the re-read is mostly from the page cache: a lower bound on a cold read."""
    import orbax.checkpoint as ocp

    from course_lib.checkpoint.atomic import MANIFEST, write_manifest

    if reps < 1:
        raise ValueError(f"need reps >= 1, got {reps}")
    work = Path(tempfile.mkdtemp(prefix="seal-cost-", dir=root))
    try:
        mgr = _manager(work, asynchronous=False)
        mgr.save(0, args=ocp.args.StandardSave(make_state(mib)))
        mgr.wait_until_finished()
        mgr.close()
        times = []
        for _ in range(reps):
            (work / "0" / MANIFEST).unlink(missing_ok=True)
            start = time.perf_counter()
            write_manifest(work / "0", 0)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def plot_save_costs(costs: Sequence[SaveCost], lost: TimeLost | None = None, ax: Any = None) -> Any:
    """Seconds against state size (log-log): blocking save, async call, async until written; and,
    given ``lost``, the training time lost per checkpoint at its size. Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    mib = [c.mib for c in costs]
    ax.plot(mib, [c.blocking for c in costs], "o-", label="blocking save (call = until committed)")
    ax.plot(mib, [c.async_written for c in costs], "s--", label="async save, until committed")
    ax.plot(mib, [c.async_call for c in costs], "^-", label="async save, the call only")
    if lost is not None:
        for mode, marker in (("blocking", "o"), ("async", "s")):
            ax.plot(
                [lost.mib],
                [max(lost.lost_per_checkpoint(mode), 1e-4)],
                marker,
                ms=11,
                mfc="none",
                mew=2,
                label=f"training time lost per checkpoint, {mode}",
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(mib, [f"{m:.0f}" for m in mib])
    ax.minorticks_off()
    ax.set_xlabel("state size (MiB)")
    ax.set_ylabel("seconds (median)")
    import jax

    ax.set_title(f"What an Orbax checkpoint costs, against the state's size ({jax.default_backend()}, this machine)")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def load_average() -> float:
    """The 1-minute load average (0.0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:  # pragma: no cover - Windows
        return 0.0
