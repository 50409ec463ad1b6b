"""Data-parallel PPO throughput on 1 vs 2 CPU devices, lesson 05 (the issue's goal: >= 1.7x on 2 devices).

For each config in `CONFIGS`, lesson 04's PPO is run whole by `course_lib.scaling.ppo_dp`'s
compiled program (`compiled_dp_train`: one `jit(shard_map(...))`, the gradient `pmean`
inside) three ways:

- **1 device**: the whole global batch on one CPU device (XLA may still spread one
  device's large operations over both cores: its intra-op pool);
- **2 devices**: the data-parallel program on a 2-device mesh, same global batch and
  same answer (parameters compared);
- **2 halves, no communication**: the 1-device program on *half* the environments,
  launched on device 0 and on device 1 at the same time (JAX dispatch is asynchronous),
  both blocked. That is the 2-device run's work without its all-reduces: the most the two
  cores of this machine can give it. The ratio 1 device / this is the *ceiling*.

Compilation and a warm-up run are excluded; then the three are timed interleaved,
`REPEATS` times each, every call blocked, under the watchdog. Throughput is env steps per
second of the whole run (rollout and learning). The 1-minute load average is recorded
before and after: another process on the shared 2-core machine takes a core from the
2-device runs first.

The measurement runs in a child process (`python bench/bench_dp_scaling.py --measure`)
that asks for 2 CPU devices before its first JAX computation, so `bench/run.py` keeps its
own JAX settings; the child writes `outputs/bench/dp_scaling.json`, `run()` renders it.

    python bench/run.py dp_scaling          # table into BENCHMARKS.md
    python bench/bench_dp_scaling.py        # table to stdout only
"""

from __future__ import annotations

import datetime as dt
import os
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result, child_main, measure_in_child

from course_lib.course.paths import output_dir
from course_lib.ppo_config import PPOConfig
from course_lib.scaling.checklist import SPEEDUP_RUNS as VARIANTS

#: Compute-heavy (the issue's PPO step at 128 envs) and the lesson notebook's config (32 envs).
CONFIGS = (
    PPOConfig(num_envs=128, num_steps=128, total_timesteps=128 * 128 * 2, hidden=64),
    PPOConfig(num_envs=32, num_steps=128, total_timesteps=32 * 128 * 8, hidden=64),
)
REPEATS = 7
GOAL = 1.7
CHILD_TIMEOUT_S = 900


def json_path() -> Path:
    return output_dir() / "bench" / "dp_scaling.json"


def measure_config(config: PPOConfig, repeats: int = REPEATS) -> dict[str, Any]:
    """:func:`course_lib.scaling.checklist.dp_speedup`'s three runs of one config, as JSON-ready numbers."""
    from course_lib.scaling.checklist import dp_speedup

    r = dp_speedup(config, repeats)
    return {
        "config": {
            "num_envs": config.num_envs,
            "num_steps": config.num_steps,
            "num_updates": config.num_updates,
            "update_epochs": config.update_epochs,
            "num_minibatches": config.num_minibatches,
            "hidden": config.hidden,
            "steps_per_run": config.steps_per_run,
        },
        "times_s": r.times,
        "median_s": {v: r.median(v) for v in VARIANTS},
        "steps_per_s": {v: r.steps_per_s(v) for v in VARIANTS},
        "cpu_per_wall": {v: statistics.median(c) for v, c in r.cpu_per_wall.items()},
        "speedup": r.speedup,
        "ceiling": r.ceiling,
        "max_abs_diff_1_vs_2": r.max_abs_diff,
    }


def measure(configs: tuple[PPOConfig, ...] = CONFIGS, repeats: int = REPEATS) -> dict[str, Any]:
    """In this process: 2 CPU devices, then every config measured (:func:`measure_config`)."""
    from course_lib.scaling.devices import use_cpu_devices

    use_cpu_devices(2)  # before any JAX computation in this process

    import jax

    from course_lib.runtime.watchdog import watchdog

    load_before = os.getloadavg()
    with watchdog(CHILD_TIMEOUT_S - 60, "data-parallel PPO on 1 and 2 CPU devices (throughput)"):
        results = [measure_config(c, repeats) for c in configs]
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "repeats": repeats,
        "results": results,
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
    }


def result_from(data: dict[str, Any]) -> Result:
    rows = []
    for r in data["results"]:
        c = r["config"]
        label = f"{c['num_envs']} envs x {c['num_steps']}, {c['num_updates']} updates"
        for v in VARIANTS:
            rows.append(
                [
                    label if v == VARIANTS[0] else "",
                    v,
                    f"{r['median_s'][v]:.3f}",
                    f"{r['steps_per_s'][v]:,.0f}",
                    f"{min(r['times_s'][v]):.3f} - {max(r['times_s'][v]):.3f}",
                    f"{r['cpu_per_wall'][v]:.2f}",
                    "1.00" if v == VARIANTS[0] else f"{r['median_s'][VARIANTS[0]] / r['median_s'][v]:.2f}",
                ]
            )
    best = max(r["speedup"] for r in data["results"])
    best_ceiling = max(r["ceiling"] for r in data["results"])
    verdict = "meets" if best >= GOAL else "does not meet"
    diffs = ", ".join(f"{r['max_abs_diff_1_vs_2']:.1e}" for r in data["results"])
    return Result(
        title="Lesson 05: data-parallel PPO throughput, 1 vs 2 CPU devices (one compiled program, gradient pmean inside)",
        columns=["config", "run", "s (median)", "env steps/s", "s (min - max)", "CPU s per wall s", "speed-up"],
        rows=rows,
        notes=[
            "Every config: 4 epochs x 4 minibatches per update, hidden 64, the env steps of the whole run (rollout "
            f"and learning). Medians of {data['repeats']} runs each, interleaved, every run blocked, compile and a "
            "warm-up run excluded.",
            "2 halves, no communication: the 1-device program on half the environments, on device 0 and device 1 "
            "at the same time: the 2-device run's work without its all-reduces, so 1 device / this is the most "
            "the two cores give (the ceiling).",
            f"Best 2-device speed-up {best:.2f}x: it {verdict} the goal of {GOAL}x; the ceiling on this machine is "
            f"at most {best_ceiling:.2f}x. Final parameters of the 1- and 2-device runs differ by at most {diffs} "
            "(summation order).",
            f"Load average (1 min): {data['load_before'][0]:.1f} before, {data['load_after'][0]:.1f} after, on "
            f"{data['cpu_count']} cores: with other work on the machine the 2-device runs lose a core first.",
            "CPU s per wall s: the process's CPU time (all threads, spinning pool threads included) over the "
            "run's wall time; above 1.0 for the 1-device run means XLA already spreads one device's work over "
            "both cores.",
            f"jax {data['jax']}; measured {data['date']} in a child process with 2 CPU devices "
            "(`python bench/bench_dp_scaling.py --measure`); raw numbers in `outputs/bench/dp_scaling.json`.",
        ],
    )


def run() -> Result:
    data = measure_in_child(
        __file__, json_path(), CHILD_TIMEOUT_S, "data-parallel throughput", "a multi-device run hung"
    )
    return result_from(data)


def main(argv: list[str]) -> int:
    return child_main(argv, "dp_scaling", measure, json_path(), run)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
