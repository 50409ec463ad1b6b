"""Lesson 12's capstone on Ray: the layouts, the weight-sync paths, and lesson 11's torchrun job on the
same task, interleaved on one machine.

Every Ray process must talk over loopback only, so ``run()`` re-runs this file inside a loopback-only
network namespace (``course_lib.runtime.netns``) and reads its JSON. Rounds: ``sync_colocated``,
``pipeline`` (max_lag 4), ``sync_split`` (max_lag 0) on Ray and lesson 11's job under torchrun (async,
max_lag 4), each 120 updates of 4 prompts x 8 answers, seed = round; then the two weight-sync paths for
three model sizes (5 transfers each, medians). Cells are medians over ``ROUNDS`` rounds, with every
round's value beside it; the load average is recorded before each run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

ROUNDS = 3
N_UPDATES = 120
WINDOW = 40  # (12.2) over updates 0-39, as lesson 12 checks it
SIZES = ((2, 64), (4, 256), (8, 512))


def measure() -> dict[str, Any]:
    """The rounds, in this process (which must be in a loopback-only namespace)."""
    from course_lib.capstone_ray import syncbench
    from course_lib.capstone_ray.cluster import start_ray, stop_ray
    from course_lib.capstone_ray.controller import RayRunConfig, run
    from course_lib.capstone_ray.report import layout_check, run_torchrun_same_task

    out: dict[str, Any] = {"arms": {}, "sync": {}, "loads": [], "check": []}
    start_ray(num_cpus=2)
    try:
        for r in range(ROUNDS):
            arms = {
                "Ray sync_colocated": lambda r=r: run(
                    RayRunConfig(layout="sync_colocated", n_updates=N_UPDATES, seed=r)
                ),
                "Ray pipeline (max_lag 4)": lambda r=r: run(
                    RayRunConfig(layout="pipeline", n_updates=N_UPDATES, seed=r)
                ),
                "Ray sync_split (max_lag 0)": lambda r=r: run(
                    RayRunConfig(layout="sync_split", max_lag=0, n_updates=N_UPDATES, seed=r)
                ),
                "torchrun async (lesson 11, max_lag 4)": lambda r=r: run_torchrun_same_task(
                    seed=r, n_updates=N_UPDATES
                ),
            }
            reports = {}
            for name, fn in arms.items():
                out["loads"].append(os.getloadavg()[0])
                rep = reports[name] = fn()
                out["arms"].setdefault(name, []).append(
                    {k: rep.get(k) for k in ("updates_per_s", "samples_per_s", "controller_overhead_ms_per_update",
                                             "lag_max", "eval_start", "eval_end")}
                    | {"audit_ok": rep["audit"]["ok"] if "audit" in rep else None}
                )  # fmt: skip
            c = layout_check(reports["Ray sync_colocated"], reports["Ray sync_split (max_lag 0)"],
                             reports["Ray pipeline (max_lag 4)"], WINDOW)  # fmt: skip
            out["check"].append(
                {"split": c["ratio"]["sync_split"], "same_tokens": c["same_tokens"], "at_bound": c["pipeline_at_bound"],
                 "idle": c["window"]["pipeline"]["waiting"], "tokens": c["window"]["pipeline"]["tokens"]
                 / c["window"]["sync_colocated"]["tokens"],
                 "pipe_train": c["ratio"]["pipeline"], "occ_split": c["occupancy"]["sync_split"],
                 "occ_pipe": c["occupancy"]["pipeline"]}
            )  # fmt: skip
            for row in syncbench.compare(sizes=SIZES, reps=5):
                out["sync"].setdefault(f"{row['n_layers']} x {row['d_model']}", []).append(row)
    finally:
        stop_ray()
    return out


def _cell(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({', '.join(format(v, fmt) for v in values)})"


def run() -> Result:
    from course_lib.runtime import netns

    cmd = netns.command([sys.executable, str(Path(__file__).resolve()), "--measure-json"])
    done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3000)
    data = json.loads(done.stdout.strip().splitlines()[-1])
    rows = []
    for name, reps in data["arms"].items():
        ctrl = [x["controller_overhead_ms_per_update"] for x in reps if x["controller_overhead_ms_per_update"]]
        rows.append([
            name,
            _cell([x["updates_per_s"] for x in reps], ".1f"),
            _cell([x["samples_per_s"] for x in reps], ".0f"),
            _cell(ctrl, ".1f") if ctrl else "-",
            str(max(x["lag_max"] for x in reps)),
            ", ".join(f"{x['eval_start']:.3f}->{x['eval_end']:.3f}" for x in reps),
            "exact" if all(x["audit_ok"] for x in reps if x["audit_ok"] is not None) else "FAILED",
        ])  # fmt: skip
    chk = data["check"]
    rows.append([
        f"(12.2) over updates 0-{WINDOW - 1}: measured rate / predicted, sync_split | pipeline (slower side, "
        "generators at its slot occupancy)",
        _cell([x["split"] for x in chk], ".2f"),
        _cell([x["pipe_train"] for x in chk], ".2f"),
        "-", "-",
        "pipeline: tokens at lag 3-4 " + ", ".join(f"{x['at_bound']:.0%}" for x in chk) + "; trainers idle "
        + ", ".join(f"{x['idle']:.0%}" for x in chk) + "; slots busy, sync_split | pipeline "
        + ", ".join(f"{x['occ_split']:.0%} | {x['occ_pipe']:.0%}" for x in chk) + "; answer tokens / colocated's "
        + ", ".join(f"{x['tokens']:.2f}" for x in chk),
        "sync_split = colocated's tokens" if all(x["same_tokens"] for x in chk) else "tokens DIFFER",
    ])  # fmt: skip
    for size, reps in data["sync"].items():
        rows.append([
            f"weight sync {size} ({reps[0]['mbytes']:.1f} MB): engine / object store, ms",
            _cell([x["engine_ms"] for x in reps], ".1f"),
            _cell([x["object_store_ms"] for x in reps], ".1f"),
            "-", "-", "-", "bit-exact" if all(x["bit_exact"] for x in reps) else "NOT bit-exact",
        ])  # fmt: skip
    loads = data["loads"]
    return Result(
        title="The capstone on Ray (lesson 12) beside lesson 11's torchrun job, interleaved",
        columns=[
            "arm",
            "updates/s, median (rounds)",
            "samples/s",
            "controller ms/update",
            "lag max",
            "held-out reward per round",
            "audit",
        ],
        rows=rows,
        notes=[
            f"{ROUNDS} rounds, each: the four arms in turn (120 updates, seed = round), then weight sync at "
            f"{len(SIZES)} sizes (5 transfers each; for those rows the columns are engine ms and object store ms).",
            f"1-minute load average before the runs: {min(loads):.1f}-{max(loads):.1f} on 2 shared cores.",
            "Inside a loopback-only network namespace (`python -m course_lib.runtime.netns`).",
        ],
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--measure-json"]:
        print(json.dumps(measure(), default=float))
    else:
        print(run())
