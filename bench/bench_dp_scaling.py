"""Data-parallel PPO throughput on 1 vs 2 CPU devices, lesson 05 (the issue's goal: >= 1.7x on 2 devices).

One config where compute dominates (`CONFIG`: 128 envs x 128 steps per update, 4 epochs x 4
minibatches of 4096 samples, hidden 64), run whole by `course_lib.ppo_dp`'s compiled
program (`compiled_dp_train`: one `jit(shard_map(...))`, the gradient `pmean` inside) on a
1-device and on a 2-device mesh. Compilation and a warm-up run are excluded; then the two
are timed interleaved, 1 2 1 2 ..., `REPEATS` times each, every call blocked, under the
watchdog. Throughput is env steps per second of the whole run (rollout and learning):
`config.steps_per_run / median seconds`. The 1-minute load average is recorded before and
after: on a shared 2-core machine another process takes a core from the 2-device run
first, so the ratio is an honest lower bound only at a load below ~1.

The measurement runs in a child process (`python bench/bench_dp_scaling.py --measure`)
that asks for 2 CPU devices before its first JAX computation, so `bench/run.py` keeps its
own JAX settings; the child writes `outputs/bench/dp_scaling.json`, `run()` renders it.

    python bench/run.py dp_scaling          # table into BENCHMARKS.md
    python bench/bench_dp_scaling.py        # table to stdout only
"""

from __future__ import annotations

import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.course.paths import output_dir
from course_lib.ppo_config import PPOConfig

CONFIG = PPOConfig(num_envs=128, num_steps=128, total_timesteps=128 * 128 * 2, hidden=64)
REPEATS = 5
GOAL = 1.7
CHILD_TIMEOUT_S = 900


def json_path() -> Path:
    return output_dir() / "bench" / "dp_scaling.json"


def measure(config: PPOConfig = CONFIG, repeats: int = REPEATS) -> dict[str, Any]:
    """In this process: 2 CPU devices; 1- and 2-device runs compiled, warmed, then timed interleaved."""
    from course_lib.devices import use_cpu_devices

    use_cpu_devices(2)  # before any JAX computation in this process

    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from course_lib.devices import data_mesh
    from course_lib.ppo_dp import compiled_dp_train, env_keys, init_flat_params, shard_inputs
    from course_lib.runtime.watchdog import watchdog

    key = jax.random.key(0)
    k_init, k_envs = jax.random.split(key)
    flat0, keys0 = init_flat_params(k_init, config), env_keys(k_envs, config.num_envs)
    runs: dict[int, Any] = {}
    compile_s: dict[int, float] = {}
    load_before = os.getloadavg()
    with watchdog(CHILD_TIMEOUT_S - 60, "data-parallel PPO on 1 and 2 CPU devices (throughput)"):
        outs = {}
        for n in (1, 2):
            mesh = data_mesh(n)
            t0 = time.perf_counter()
            compiled = compiled_dp_train(config, mesh)
            compile_s[n] = time.perf_counter() - t0
            args = (*shard_inputs(mesh, flat0, keys0), jax.device_put(key, NamedSharding(mesh, P())))
            outs[n] = np.asarray(jax.block_until_ready(compiled(*args))[0])  # warm-up
            runs[n] = (compiled, args)
        times: dict[int, list[float]] = {1: [], 2: []}
        cpu: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(repeats):
            for n in (1, 2):
                compiled, args = runs[n]
                t0, c0 = time.perf_counter(), time.process_time()
                jax.block_until_ready(compiled(*args))
                times[n].append(time.perf_counter() - t0)
                cpu[n].append((time.process_time() - c0) / times[n][-1])
    load_after = os.getloadavg()
    medians = {n: statistics.median(t) for n, t in times.items()}
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "config": {
            "num_envs": config.num_envs,
            "num_steps": config.num_steps,
            "num_updates": config.num_updates,
            "update_epochs": config.update_epochs,
            "num_minibatches": config.num_minibatches,
            "hidden": config.hidden,
            "steps_per_run": config.steps_per_run,
        },
        "repeats": repeats,
        "compile_s": {str(n): s for n, s in compile_s.items()},
        "times_s": {str(n): t for n, t in times.items()},
        "median_s": {str(n): s for n, s in medians.items()},
        "steps_per_s": {str(n): config.steps_per_run / s for n, s in medians.items()},
        "cpu_per_wall": {str(n): statistics.median(c) for n, c in cpu.items()},
        "speedup": medians[1] / medians[2],
        "max_abs_diff_1_vs_2": float(np.max(np.abs(outs[1] - outs[2]))),
        "load_before": list(load_before),
        "load_after": list(load_after),
    }


def result_from(data: dict[str, Any]) -> Result:
    c = data["config"]
    rows = [
        [
            n,
            f"{data['median_s'][n]:.2f}",
            f"{data['steps_per_s'][n]:,.0f}",
            f"{min(data['times_s'][n]):.2f} - {max(data['times_s'][n]):.2f}",
            f"{data['cpu_per_wall'][n]:.2f}",
            f"{data['compile_s'][n]:.1f}",
            "1.00" if n == "1" else f"{data['speedup']:.2f}",
        ]
        for n in ("1", "2")
    ]
    verdict = "meets" if data["speedup"] >= GOAL else "does not meet"
    return Result(
        title="Lesson 05: data-parallel PPO throughput, 1 vs 2 CPU devices (one compiled program, gradient pmean inside)",
        columns=[
            "devices",
            "run s (median)",
            "env steps/s",
            "run s (min - max)",
            "CPU s per wall s",
            "compile s",
            "speed-up",
        ],
        rows=rows,
        notes=[
            f"Config: {c['num_envs']} envs x {c['num_steps']} steps per update, {c['num_updates']} updates, "
            f"{c['update_epochs']} epochs x {c['num_minibatches']} minibatches, hidden {c['hidden']}: "
            f"{c['steps_per_run']:,} env steps per run. Medians of {data['repeats']} runs each, interleaved 1 2 1 2, "
            "every run blocked, compile and a warm-up run excluded.",
            f"The 2-device speed-up {data['speedup']:.2f}x {verdict} the goal of {GOAL}x. Final parameters of the "
            f"1- and 2-device runs differ by at most {data['max_abs_diff_1_vs_2']:.1e} (summation order).",
            f"Load average (1 min): {data['load_before'][0]:.1f} before, {data['load_after'][0]:.1f} after, on "
            f"{data['cpu_count']} cores: with other work on the machine the 2-device run loses a core first, so "
            "the ratio is a lower bound whenever the load is above ~1.",
            "CPU s per wall s: the process's CPU time (all threads) over the run's wall time; near 1.0 for the "
            "2-device run means its two devices did not compute at the same time.",
            f"jax {data['jax']}; measured {data['date']} in a child process with 2 CPU devices "
            "(`python bench/bench_dp_scaling.py --measure`); raw numbers in `outputs/bench/dp_scaling.json`.",
        ],
    )


def run() -> Result:
    path = json_path()
    path.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure"], timeout=CHILD_TIMEOUT_S, check=False
    )
    if done.returncode != 0:
        why = " (the watchdog ended it: a multi-device run hung)" if done.returncode == 124 else ""
        raise RuntimeError(f"the data-parallel throughput measurement exited with code {done.returncode}{why}")
    return result_from(json.loads(path.read_text()))


def main(argv: list[str]) -> int:
    if argv == ["--measure"]:
        data = measure()
        path = json_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
        print(f"wrote {path}")
        return 0
    from run import render

    print(render("dp_scaling", run()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
