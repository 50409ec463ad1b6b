"""Lesson 11's capstone on one GPU: every rank colocated on it (gloo for the trainers'
all-reduce, the weights through CUDA IPC slots), at the cpu and the full scale.

Not part of ``bench/run.py`` (CI has no GPU); run it on a machine with a CUDA GPU::

    python bench/capstone_gpu.py OUT_DIR            # prints one JSON line per run, writes OUT_DIR/capstone_gpu.json

A machine with a single GPU cannot run the NCCL path (one GPU per rank); this script says so
and runs the colocated one. Figures: BENCHMARKS.md, "Full scale on a GPU".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch


def summarise(rep: Any, seconds: float) -> dict[str, Any]:
    syncs = rep.syncs
    send = syncs["side"] == "send"
    recv = syncs["side"] == "receive"
    u = rep.updates
    return {
        "wall_s": round(seconds, 1),
        "updates": int(rep.result["updates"]),
        "layout": {k: rep.layout[k] for k in ("world_size", "n_trainers", "n_slots")},
        "predicted_answer_tokens_per_s": rep.layout.get("predicted_tokens_per_s"),
        "predicted_sync_answer_tokens_per_s": rep.layout.get("predicted_sync_tokens_per_s"),
        "rates": rep.layout.get("rates"),
        "answer_tokens_per_s": rep.tokens_per_s,
        "updates_per_s": rep.updates_per_s,
        "samples_per_s": rep.samples_per_s,
        "mean_answer_tokens": float(np.sum(u["tokens"]) / np.sum(u["samples"])),
        "send_ms_median": 1e3 * float(np.median(syncs["total"][send])) if send.any() else None,
        "receive_ms_median": 1e3 * float(np.median(syncs["total"][recv])) if recv.any() else None,
        "weight_bytes": int(syncs["nbytes"][send][0]) if send.any() else None,
        "time_wait_ms": 1e3 * float(np.median(u["time_wait"])),
        "time_train_ms": 1e3 * float(np.median(u["time_train"])),
        "time_allreduce_ms": 1e3 * float(np.median(u["time_allreduce"])),
        "lag_max": int(np.nanmax(u["lag_max"])),
        "held_out": rep.held_out(),
        "audit_ok": bool(rep.result["audit"]["ok"]),
    }


def main(out: Path) -> int:
    from course_lib.capstone import run

    out.mkdir(parents=True, exist_ok=True)
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    head = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0) if n_gpus else None,
        "gpus": n_gpus,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "nccl_path": "not run: one GPU per rank needs 4 GPUs" if n_gpus < 4 else "possible",
    }
    print(json.dumps(head), flush=True)
    if not n_gpus:
        print("no CUDA GPU: nothing to run", file=sys.stderr)
        return 1
    results: dict[str, Any] = {"machine": head}
    runs = {  # (scale, overrides, deadline in seconds)
        "full scale, colocated, 400 updates": ("full", {"n_updates": 400}, 300),
        "cpu scale, colocated, 120 updates": ("cpu", {"n_updates": 120}, 120),
        "cpu scale, colocated, synchronous (max_lag 0), 120 updates": ("cpu", {"n_updates": 120, "max_lag": 0}, 120),
    }
    for name, (scale, overrides, deadline) in runs.items():
        env_scale = os.environ.get("COURSE_SCALE")
        os.environ["COURSE_SCALE"] = scale
        # the config's defaults read COURSE_SCALE at import: run each scale in a child process
        code = (
            "import json, sys, time; from pathlib import Path; sys.path.insert(0, 'bench');"
            "from capstone_gpu import summarise; from course_lib.capstone import run;"
            f"t = time.time(); rep = run(Path({str(out / name.split(',')[0].replace(' ', '_'))!r}) / str(time.time_ns()),"
            f" colocated=True, max_restarts=0, deadline_s={deadline}, show_progress=False, echo=None, **{overrides!r});"
            "print('RESULT ' + json.dumps(summarise(rep, time.time() - t)))"
        )
        t0 = time.time()
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=deadline + 60)
        if env_scale is None:
            os.environ.pop("COURSE_SCALE", None)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            results[name] = {"error": (done.stdout + done.stderr)[-3000:], "seconds": time.time() - t0}
        else:
            results[name] = json.loads(line[len("RESULT ") :])
        print(name, json.dumps(results[name]), flush=True)
        (out / "capstone_gpu.json").write_text(json.dumps(results, indent=1))
    _ = run  # imported above to fail early when the package is not importable
    return 0 if all("error" not in v for k, v in results.items() if k != "machine") else 1


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "capstone_gpu")))
