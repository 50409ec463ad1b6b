"""Lesson 10: throughput and learning of lesson 03's actor-learner system under injected
actor faults (an actor SIGKILLed every 2 s, every 5 s) against none, runs interleaved.

The IMPALA layout of lesson 03 (2 actor processes x 8 CartPoles, unrolls of 16 steps,
batches of 2 unrolls, the V-trace learner in the main process). A fault run kills a random
actor every `kill_every_s` seconds (`course_lib.actor_learner.faults.FaultInjector`); the
supervisor restarts it with the learner's current weights. The runs alternate none,
every 5 s, every 2 s, none, ... (`fault_run`, the function `compare_faults` uses), each
repeat with its own seed shared by the three arms; each cell is the median of `REPEATS`
runs of `SECONDS` seconds (start-up excluded). The load average is printed before and
after: on a shared 2-core machine the answer depends on it.
"""

from __future__ import annotations

import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.actor_learner.faults import FaultRun, fault_run
from course_lib.actor_learner.system import SystemConfig

SECONDS = 10.0
REPEATS = 3
KILL_EVERY_S: tuple[float | None, ...] = (None, 5.0, 2.0)


def load() -> str:
    """The 1-, 5- and 15-minute load averages, e.g. ``"0.4 / 0.9 / 1.1"``."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _median(runs: list[FaultRun], f: Callable[[FaultRun], float]) -> float:
    return statistics.median(f(r) for r in runs)


def run() -> Result:
    base = SystemConfig(n_actors=2, envs_per_actor=8, unroll=16, batch_size=2)
    load_before = load()
    runs: dict[float | None, list[FaultRun]] = {k: [] for k in KILL_EVERY_S}
    for r in range(REPEATS):
        for kill_every_s in KILL_EVERY_S:
            runs[kill_every_s].append(fault_run(replace(base, seed=r), SECONDS, None, kill_every_s))
    load_after = load()
    rows = []
    for kill_every_s, rs in runs.items():
        pairs = [r.frames_per_second / n.frames_per_second for r, n in zip(rs, runs[None])]  # same repeat
        rows.append(
            [
                "none" if kill_every_s is None else f"every {kill_every_s:g} s",
                f"{_median(rs, lambda r: r.frames_per_second):,.0f}",
                f"{statistics.median(pairs):.2f} ({min(pairs):.2f}-{max(pairs):.2f})",
                f"{_median(rs, lambda r: r.updates_per_second):.1f}",
                f"{_median(rs, lambda r: r.kills):g}",
                f"{_median(rs, lambda r: r.report.restarts):g}",
                f"{_median(rs, lambda r: r.report.lost_unrolls):g}",
                "-" if kill_every_s is None else f"{_median(rs, lambda r: r.recovery_s):.2f}",
                f"{_median(rs, lambda r: r.first_return):.0f}",
                f"{_median(rs, lambda r: r.final_return):.0f}",
                f"{min(r.final_return for r in rs):.0f}-{max(r.final_return for r in rs):.0f}",
                f"{max(r.lag_max for r in rs)} / {max(r.queue_lag_max for r in rs)} (<= {rs[0].lag_bound})",
            ]
        )
    return Result(
        title="Lesson 10: actor faults in the IMPALA system, throughput and learning vs none (interleaved runs)",
        columns=[
            "actor SIGKILL",
            "frames/s (median)",
            "frames/s vs none, per repeat: median (min-max)",
            "updates/s",
            "kills",
            "restarts",
            "lost unrolls",
            "recovery s (mean per kill)",
            "return, first quarter",
            "return, last quarter (median)",
            "last quarter, min-max",
            "lag max / queued lag max (bound)",
        ],
        rows=rows,
        notes=[
            f"2 actors x 8 envs, T = 16, batch 2 unrolls, V-trace learner, CartPole-v1; {REPEATS} runs of "
            f"{SECONDS:g} s per arm, arms interleaved (none, every 5 s, every 2 s, ...), repeat r seeded r in every "
            "arm; frames counted by the learner after its first batch; returns: mean over the episodes that ended "
            "in the first / last quarter of the run's updates.",
            f"Load average (1 / 5 / 15 min) before: {load_before}; after: {load_after} (2 cores).",
            "A killed actor is detected within poll_s (0.1 s), its slots are reclaimed (its half-written unroll "
            "is the lost work) and a replacement forks from the forkserver, loads the current weights and goes on; "
            "the learner only waits for its batch. Recovery s: from the restart until the learner used the "
            "replacement's first unroll. Each kill costs one actor for that long plus at most one unroll "
            "(128 frames); on 2 cores the surviving actor meanwhile gets more CPU, so the throughput cost is "
            "smaller than the load noise between runs (see the per-repeat range). Learning goes on under faults (the "
            "last quarter's return is above the first quarter's in every arm); the arms' returns differ by less "
            "than their spread over seeds.",
            "Queued lag: updates an unroll waits at the learner, bounded by (n_slots - 1) // batch_size "
            "(course_lib.actor_learner.faults.lag_bound) with or without faults; the total lag also counts updates "
            "while the unroll was written, which the slots do not bound (an actor descheduled on the loaded machine can "
            "come back with a lag of tens of updates, faults or not).",
            "Same measurement in the notebook: lessons/10 (compare_faults).",
        ],
    )
