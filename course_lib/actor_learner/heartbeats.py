"""Heartbeats: how the supervisor tells a frozen actor from a slow one (lesson 10).

A dead child is easy to see (``process.is_alive()`` is False); a *frozen* one (stopped
with ``SIGSTOP``, deadlocked, swapped out) is alive and silent. Every actor therefore
stamps its row of a small shared-memory table every unroll, and every time it polls for
work while idle::

    row = [monotonic time, unrolls done, weight version, mid-unroll (1.0 or 0.0)]

``time.monotonic()`` is ``CLOCK_MONOTONIC``, one clock for every process of the machine,
so the supervisor compares the stamp with its own clock: an actor whose heartbeat is
older than ``heartbeat_timeout_s`` is frozen, and is killed and restarted. Before its first
stamp (while the process starts) the looser ``start_timeout_s`` applies; the parent marks
the row ``unrolls = -1`` when it spawns the actor. The SEED inference server has no
heartbeat: a frozen server is caught by the learner's ``stall_timeout_s`` (no data).

The table is plain shared memory written by one process per row (no lock): a torn read
of a float64 row can only make a heartbeat look a little older or newer for one poll.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

#: columns of a heartbeat row
TIME, UNROLLS, VERSION, MID_UNROLL = range(4)


@dataclass(frozen=True)
class SupervisorConfig:
    """How the supervisor of :class:`~course_lib.actor_learner.system.ActorLearnerSystem`
    watches its actors (kept apart from ``SystemConfig``, which lesson 03 prints)."""

    heartbeat_timeout_s: float | None = field(
        default=5.0,
        metadata={"help": "an actor silent this long is frozen: SIGKILL and restart it (None: off)"},
    )
    start_timeout_s: float = field(
        default=30.0, metadata={"help": "a just-started actor may take this long to send its first heartbeat"}
    )

    def __post_init__(self) -> None:
        if self.heartbeat_timeout_s is not None and self.heartbeat_timeout_s <= 0:
            raise ValueError(f"heartbeat_timeout_s must be > 0 or None (off), got {self.heartbeat_timeout_s}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be > 0, got {self.start_timeout_s}")


def beat(row: torch.Tensor | None, unrolls: int, version: int, mid_unroll: bool) -> None:
    """The child's side: stamp ``row`` (``[4]`` float64 shared) with now; no-op for ``None``."""
    if row is not None:
        row[UNROLLS] = unrolls
        row[VERSION] = version
        row[MID_UNROLL] = float(mid_unroll)
        row[TIME] = time.monotonic()


class Heartbeats:
    """The supervisor's side: ``[n_actors, 4]`` float64 rows in shared memory (module docstring)."""

    def __init__(self, n_actors: int) -> None:
        self.table = torch.zeros(n_actors, 4, dtype=torch.float64).share_memory_()

    def row(self, i: int) -> torch.Tensor:
        """Actor ``i``'s row, a view to hand to its process."""
        return self.table[i]

    def spawned(self, i: int) -> None:
        """Mark actor ``i`` as just started: now, no unroll yet (``unrolls = -1``), not mid-unroll."""
        self.table[i] = torch.tensor([time.monotonic(), -1.0, -1.0, 0.0], dtype=torch.float64)

    def silent_for(self, i: int, config: SupervisorConfig, now: float | None = None) -> float | None:
        """Seconds since actor ``i``'s last heartbeat if that exceeds its timeout (it is
        frozen), else ``None``; always ``None`` with heartbeats off."""
        if config.heartbeat_timeout_s is None:
            return None
        row = self.table[i].tolist()
        age = (time.monotonic() if now is None else now) - row[TIME]
        limit = config.start_timeout_s if row[UNROLLS] < 0 else config.heartbeat_timeout_s
        return age if age > limit else None

    def mid_unroll(self, i: int) -> bool:
        """Whether actor ``i`` was writing an unroll at its last heartbeat (its slot is half-written)."""
        return bool(self.table[i, MID_UNROLL] > 0)
