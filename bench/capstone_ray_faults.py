"""Lesson 12's failure comparison, at several moments: a generator killed in the Ray pipeline and
in lesson 11's torchrun job, at the same updates, both committing trainer 0's state every 40 updates.

    python -m course_lib.runtime.netns -- python bench/capstone_ray_faults.py OUT_DIR [--kills 4]

Kill updates are drawn uniformly from 5..114 (numpy seed 0), and each is run on Ray (a kill while
the generator decodes, between two transfers) and under torchrun, one after the other; then Ray
kills during an engine weight transfer at the first two of those updates, and one run of each
other fault kind (``unavailable``: a decoding call's reply dropped; ``kill_final``: no restart
left). 120 updates of 4 prompts x 8 answers, seed 0, lesson 12's sizes. Writes
``OUT_DIR/capstone_ray_faults.json`` and prints one line per run. Figures: BENCHMARKS.md, "Lesson
12: what a generator's death costs, at several moments".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

N_UPDATES = 120
EVERY = 40


def _pause(times: list[float]) -> float:
    return float(np.diff(np.sort(np.asarray(times, dtype=float))).max())


def ray_run(kill_at: int, **kw: Any) -> dict[str, Any]:
    from course_lib.capstone_ray.controller import RayRunConfig, run

    rep = run(RayRunConfig(layout="pipeline", n_updates=N_UPDATES, kill_at=kill_at, checkpoint_every=EVERY, **kw))
    k, t = rep["kill"], [m["time"] for m in rep["metrics"]]
    return {
        "orchestration": "ray",
        "kill_at": kill_at,
        "fault": k["fault"],
        "during_sync": k["during_sync"],
        "detect_ms": 1e3 * k["detect_s"],
        "restart_ready_s": k["restart_ready_s"],
        "first_group_s": k["first_group_s"],
        "new_process_groups": sum(1 for r in rep["returns"] if r[1] == 1 and r[2] > 0),
        "lost_samples": rep["audit"]["lost_samples"],
        "updates_redone": len(rep["metrics"]) - len({m["u"] for m in rep["metrics"]}),
        "longest_pause_s": _pause(t),
        "updates_per_s_first_to_last": (len(t) - 1) / (max(t) - min(t)),
        "sync_errors": len(rep["sync_errors"]),
        "gone": rep["gone"],
        "audit_ok": rep["audit"]["ok"],
        "eval": [rep["eval_start"], rep["eval_end"]],
        "driver_kb_per_update": rep["driver_kb_per_update"],
        "controller_ms_per_update": rep["controller_overhead_ms_per_update"],
        "load": os.getloadavg()[0],
    }


def torchrun_run(kill_at: int) -> dict[str, Any]:
    from course_lib.capstone_ray.report import run_torchrun_same_task

    tr = run_torchrun_same_task(seed=0, n_updates=N_UPDATES, kill_at=kill_at, checkpoint_every=EVERY)
    rs, t = tr["restart"], tr["reward_time"]
    return {
        "orchestration": "torchrun",
        "kill_at": kill_at,
        "resumed_step": rs["resumed_step"],
        "kill_to_first_update_s": rs["kill_to_first_update_s"],
        "discarded_samples": rs["discarded_samples"],
        "updates_redone": rs["updates_redone"],
        "longest_pause_s": _pause(t),
        "updates_per_s_first_to_last": (N_UPDATES - 1) / (max(t) - min(t)),
        "audit_ok": rs["audit_ok"],
        "eval": [tr["eval_start"], tr["eval_end"]],
        "load": os.getloadavg()[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--kills", type=int, default=4)
    args = p.parse_args()
    from course_lib.capstone_ray.cluster import loopback_only, start_ray, stop_ray

    if not loopback_only():
        print("run it inside a loopback-only namespace: python -m course_lib.runtime.netns -- ...", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    kills = sorted(int(k) for k in np.random.default_rng(0).integers(5, N_UPDATES - 5, size=args.kills))
    runs: list[dict[str, Any]] = []
    t0 = time.time()
    start_ray(num_cpus=2)
    try:
        plan: list[tuple[str, Any]] = []
        for k in kills:
            plan += [("ray", lambda k=k: ray_run(k)), ("torchrun", lambda k=k: torchrun_run(k))]
        plan += [("ray", lambda k=k: ray_run(k, kill_during_sync=True)) for k in kills[:2]]
        plan += [("ray", lambda: ray_run(kills[0], fault="unavailable"))]
        plan += [("ray", lambda: ray_run(kills[0], fault="kill_final"))]
        for _, fn in plan:
            r = fn()
            runs.append(r)
            print(json.dumps(r, default=float), flush=True)
    finally:
        stop_ray()
    out = {"kills": kills, "n_updates": N_UPDATES, "checkpoint_every": EVERY, "seconds": time.time() - t0, "runs": runs}
    (args.out / "capstone_ray_faults.json").write_text(json.dumps(out, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
