"""Command line: ``python -m course_lib.capstone_ray run|syncbench ...``, one JSON line per result.

    python -m course_lib.runtime.netns -- python -m course_lib.capstone_ray run --layout pipeline --kill-at 40
    python -m course_lib.runtime.netns -- python -m course_lib.capstone_ray run --layouts sync_colocated,sync_split,pipeline
    python -m course_lib.runtime.netns -- python -m course_lib.capstone_ray syncbench --reps 5

It starts Ray, runs, and stops Ray (asserting that no process is left). Outside a loopback-only
network namespace it refuses (Ray would listen on every interface) unless ``--allow-network``.
Exit status: 0 if every run's claims hold (:func:`~course_lib.capstone_ray.controller.check_run`),
1 if one does not, 2 on refusal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

SUMMARY = (
    "updates_per_s",
    "samples_per_s",
    "controller_overhead_ms_per_update",
    "lag_max",
    "lag_bound",
    "eval_start",
    "eval_end",
    "sync_send_ms_median",
    "phases_ms_median",
    "kill",
    "fails",
    "wall_s",
    "load_1min_before",
)


def parser() -> argparse.ArgumentParser:
    from course_lib.capstone_ray.controller import RayRunConfig

    p = argparse.ArgumentParser(prog="python -m course_lib.capstone_ray", description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=["run", "syncbench"])
    for f in dataclasses.fields(RayRunConfig):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            p.add_argument(flag, type=type(f.default), default=f.default)
    p.add_argument("--layouts", default="", help="comma-separated layouts run one after another in one Ray session")
    p.add_argument("--reps", type=int, default=5, help="syncbench: timed updates per size")
    p.add_argument("--sizes", default="2x64,4x256", help="syncbench: n_layers x d_model, comma-separated")
    p.add_argument("--ray-timeout-s", type=float, default=60.0, help="the most Ray's start may take")
    p.add_argument(
        "--address", default=None, help="join a running Ray cluster (its GCS address) instead of starting one"
    )
    p.add_argument("--full", action="store_true", help="print whole reports (per-update metrics included)")
    p.add_argument("--allow-network", action="store_true", help="run outside a loopback-only namespace")
    return p


def main(argv: list[str] | None = None) -> int:
    from course_lib.capstone_ray import cluster
    from course_lib.capstone_ray.controller import RayRunConfig, run

    args = parser().parse_args(argv)
    if not cluster.loopback_only() and not args.allow_network:
        print(
            "refusing to start Ray: this process's network is not loopback-only, and Ray listens on every "
            "interface. Run it in a namespace of its own: python -m course_lib.runtime.netns -- python -m "
            "course_lib.capstone_ray ... (or pass --allow-network)",
            file=sys.stderr,
        )
        return 2
    try:
        base = RayRunConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(RayRunConfig)})
        runs = [dataclasses.replace(base, layout=x) for x in args.layouts.split(",")] if args.layouts else [base]
        sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    except ValueError as exc:
        print(f"bad arguments: {exc}", file=sys.stderr)
        return 2
    fails = 0
    t_start = cluster.start_ray(timeout_s=args.ray_timeout_s, death_info_ms=base.death_info_ms, address=args.address)
    try:
        if args.cmd == "syncbench":
            from course_lib.capstone_ray.syncbench import compare

            for row in compare([(n, d) for n, d in sizes], args.reps):
                print(json.dumps(row), flush=True)
        else:
            for cfg in runs:
                rep = run(cfg)
                out: dict[str, Any] = rep if args.full else {k: rep[k] for k in SUMMARY}
                out = out | {"layout": cfg.layout, "sync": cfg.sync, "audit_ok": rep["audit"]["ok"]}
                print(json.dumps(out, default=str), flush=True)
                fails += bool(rep["fails"])
    finally:
        t_stop = cluster.stop_ray()
    print(json.dumps({"ray_start_s": round(t_start, 2), "ray_stop_s": round(t_stop, 2)}))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
