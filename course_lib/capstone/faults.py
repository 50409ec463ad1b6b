"""Fault injection for the restart tests and the report's demo: a rank SIGKILLs itself, once.

``--kill-rank R --kill-at-update U``: trainer rank ``R`` dies right after update ``U``
(after its weights went out and any checkpoint of ``U + 1`` was committed); generator rank
``R`` dies as it receives the weights of version ``U``, with answers in flight. A marker
file ``run_dir/kills/rank{R}-update{U}`` is written first, so the attempt torchrun restarts
(``--max-restarts``) runs through instead of dying again.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from course_lib.capstone.metrics import MetricsWriter


def kill_once(run_dir: str, rank: int, update: int, metrics: MetricsWriter, role: str) -> None:
    """SIGKILL this process unless the marker ``run_dir/kills/rank{rank}-update{update}`` says it
    already happened (so the restarted attempt runs through); writes the marker first."""
    marker = Path(run_dir) / "kills" / f"rank{rank}-update{update}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"rank": rank, "update": update, "attempt": metrics.attempt, "t": time.time()}))
    metrics.event(f"fault injection: {role} rank {rank} kills itself (SIGKILL) at update {update}", fault="kill")
    metrics.close()
    os.kill(os.getpid(), signal.SIGKILL)
