"""Named per-phase timers, the TorchBeast ``prof.Timings`` idea (lesson 03).

Every process of the actor-learner system owns a :class:`Timings`: seconds spent in each
named phase (``env step``, ``inference``, ``learn``, ``wait for batch``, ...) accumulated
with a context manager::

    timings = Timings(("env step", "inference"))
    with timings.phase("env step"):
        envs.step(actions)

A child process passes a row of a shared-memory table (``shared``) so the supervisor
reads every process's totals at any time, without messages; the parent's own timings
live in an ordinary array.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from numpy.typing import NDArray


class Timings:
    """Seconds per named phase.

    Args:
        phases: the phase names, in display order.
        shared: optional float64 array to accumulate into (a numpy view of a row of a
            shared-memory table; its first ``len(phases)`` entries are used); a private
            array otherwise.
    """

    def __init__(self, phases: Sequence[str], shared: NDArray[np.float64] | None = None) -> None:
        self.phases = tuple(phases)
        self._index = {name: i for i, name in enumerate(self.phases)}
        if shared is not None and (shared.ndim != 1 or shared.shape[0] < len(self.phases)):
            raise ValueError(f"shared row must be 1-D with at least {len(self.phases)} entries, got {shared.shape}")
        self.totals = np.zeros(len(self.phases)) if shared is None else shared[: len(self.phases)]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Add the time spent in the block to ``name``."""
        i = self._index[name]
        start = time.perf_counter()
        try:
            yield
        finally:
            self.totals[i] += time.perf_counter() - start

    def add(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to ``name``."""
        self.totals[self._index[name]] += seconds

    def as_dict(self) -> dict[str, float]:
        """``{phase: seconds}`` (a copy)."""
        return {name: float(self.totals[i]) for i, name in enumerate(self.phases)}


def timing_table(rows: dict[str, dict[str, float]], wall_seconds: float) -> str:
    """A text table: one line per (process, phase) with seconds and share of ``wall_seconds``."""
    lines = [f"{'process':<18} {'phase':<22} {'seconds':>8} {'% of wall':>9}"]
    for process, phases in rows.items():
        for phase, seconds in phases.items():
            share = 100.0 * seconds / wall_seconds if wall_seconds > 0 else float("nan")
            lines.append(f"{process:<18} {phase:<22} {seconds:>8.2f} {share:>8.0f}%")
    return "\n".join(lines)
