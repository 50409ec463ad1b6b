"""Structured metrics: every rank appends JSON lines to ``run_dir/metrics/rank{R}.jsonl``.

One line per event, each with ``kind``, wall-clock ``t`` (``time.time()``, seconds since
the epoch: comparable across the processes of a host, and across hosts with NTP), ``rank``,
``role`` and ``attempt``. The kinds (their fields: :mod:`course_lib.capstone.report`, which
reads them back):

==============  =================================================================
``start``       a rank began an attempt (restart count, resumed step, layout)
``phase``       a span of work: ``phase``, ``start``, ``end`` (a Gantt bar)
``update``      trainer 0, per update: reward, tokens, lag histogram, ESS, loss
``sync``        a weight update: sender or receiver side, seconds per step
``generated``   a generator handed group ``k`` over (the ledger's evidence)
``eval``        evaluation reward on fixed prompts (trainer 0: ``when`` = ``start`` or ``end``)
``event``       something a human should read: a restart, a kill, the end
``layout``      rank 0: the calibrated rates, the chosen split, the prediction
==============  =================================================================

A line is written with one ``os.write`` on a file opened ``O_APPEND``: lines of one file
never interleave, and a rank killed mid-run leaves whole lines (the reader skips a torn
last line, should one ever appear).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: Where the metrics of a run live, below its run directory.
METRICS_DIR = "metrics"
#: Busy intervals closer than this are merged into one Gantt bar (seconds).
MERGE_GAP_S = 2e-3


def metrics_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / METRICS_DIR / f"rank{rank}.jsonl"


class MetricsWriter:
    """Append-only JSON lines for one rank of one attempt (see the module docstring)."""

    def __init__(self, run_dir: str | Path, rank: int, role: str, attempt: int) -> None:
        self.rank, self.role, self.attempt = rank, role, attempt
        path = metrics_path(run_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._busy: list[float] | None = None  # the decode interval still growing

    def log(self, kind: str, **fields: Any) -> None:
        """Append one line ``{"kind": kind, "t": now, "rank", "role", "attempt", **fields}``."""
        record = {"kind": kind, "t": time.time(), "rank": self.rank, "role": self.role, "attempt": self.attempt}
        record.update(fields)
        os.write(self._fd, (json.dumps(record) + "\n").encode())

    def event(self, message: str, **fields: Any) -> None:
        """A line for humans, also printed (torchrun prefixes it with the rank)."""
        print(f"[capstone rank {self.rank} {self.role}, attempt {self.attempt}] {message}", flush=True)
        self.log("event", message=message, **fields)

    def span(self, phase: str, start: float, end: float, **fields: Any) -> None:
        self.log("phase", phase=phase, start=start, end=end, **fields)

    @contextmanager
    def phase(self, name: str, **fields: Any) -> Iterator[None]:
        """Time the ``with`` block as one ``phase`` line (written even if the block raises)."""
        start = time.time()
        try:
            yield
        finally:
            self.span(name, start, time.time(), **fields)

    def busy(self, start: float, end: float, phase: str = "decode") -> None:
        """A short busy interval (a decoding step): merged with the previous one if they
        touch, written once it can no longer grow (few lines for thousands of steps)."""
        if self._busy is not None and start - self._busy[1] < MERGE_GAP_S:
            self._busy[1] = end
            return
        self.flush_busy(phase)
        self._busy = [start, end]

    def flush_busy(self, phase: str = "decode") -> None:
        if self._busy is not None:
            self.span(phase, self._busy[0], self._busy[1])
            self._busy = None

    def sync(self) -> None:
        """Flush the decode interval and ``fsync`` the file: rank 0 reads every rank's lines at the
        end, and on a shared filesystem of several hosts (NFS: close-to-open) unsynced lines may
        not be there yet."""
        self.flush_busy()
        os.fsync(self._fd)

    def close(self) -> None:
        self.flush_busy()
        os.close(self._fd)


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """Every whole JSON line of a metrics file (a torn or unreadable line is skipped)."""
    out = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
