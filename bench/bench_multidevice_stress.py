"""Do lesson 05's multi-device programs always finish? Each one, many times, each time in a fresh process.

A start-up scheduling hang (two CPU host devices blocking XLA's shared intra-op pool:
:mod:`course_lib.scaling.devices`) shows up, if at all, in *some* runs of a fresh process, not in
a process that already ran the program once. So every repetition here starts a new
interpreter (``python bench/bench_multidevice_stress.py --child KIND``), which sets its
device count before its first JAX computation, runs the program under
:func:`course_lib.runtime.watchdog.watchdog` (exit code 124 on expiry) and prints one
``DONE <program>`` line per program it finished; the parent also kills a child that
outlives ``CHILD_TIMEOUT_S`` (a hang the watchdog did not catch). Programs:

- ``dp_ppo``: data-parallel PPO (:func:`course_lib.scaling.ppo_dp.run_dp`) on 2 devices, a small
  config; one program per process (a hang at its start-up is what we look for).
- ``dp_halves``: the ceiling run of lesson 05's throughput comparison
  (:func:`course_lib.scaling.checklist.two_halves`): two 1-device PPO programs dispatched on device 0
  and device 1 at once, no collective; one program per process.
- ``ring_psum``: the ppermute ring all-reduce and XLA's ``psum`` on 4 devices, results compared;
- ``tp_mlp``: the tensor-parallel MLP's forward and gradient on a 2 x 2 (data x model)
  mesh, compared with the unsharded MLP. ``ring_psum`` and ``tp_mlp`` share a process per
  repetition (both 4 devices), one watchdog each.
- ``mp_psum``: the 2-process ``psum`` of :mod:`course_lib.scaling.multihost` (two fresh
  processes, one CPU device each, gloo collectives), through
  :func:`course_lib.runtime.jax_processes.launch`; skipped if those modules are absent.

Each program's tally is finished / hung (watchdog or timeout) / failed (another error) /
not run (an earlier program of the same process hung).

``--reproduce-hang`` runs the root cause's minimal reproducer instead: ``jit(shard_map(qr))``
called 100 times (blocked) on ``x [256, 64, 64]`` over 2 CPU devices (a LAPACK call on two
devices at once), under a 20 s watchdog (up to 3 fresh processes, until one hangs), and
reports whether it hung. On 2026-11-23 (jaxlib 0.10.2) 100 calls hung in 6 of 6 processes on
the idle machine (load about 1) and in none of 3 + 2 at load 2.5-3; a single call finished in
9 of 9 at load 3-4. Run it on an idle machine.

    python bench/bench_multidevice_stress.py --runs 30      # the tallies, to stdout
    python bench/bench_multidevice_stress.py --reproduce-hang
    python bench/run.py multidevice_stress                  # the table into BENCHMARKS.md

JSON to ``outputs/bench/multidevice_stress.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.course.paths import output_dir

RUNS = 30
WATCHDOG_S = 120.0  # per program, inside the child (compiles included: slow on a loaded machine)
CHILD_TIMEOUT_S = 200.0  # the parent's backstop per child process
HANG_REPRO_S = 20.0
CHILDREN: dict[str, tuple[str, ...]] = {
    "dp_ppo": ("dp_ppo",),
    "dp_halves": ("dp_halves",),
    "collectives_tp": ("ring_psum", "tp_mlp"),
}
PROGRAMS = ("dp_ppo", "dp_halves", "ring_psum", "tp_mlp", "mp_psum")
OUTCOMES = ("finished", "hung", "failed", "not run")


def json_path() -> Path:
    return output_dir() / "bench" / "multidevice_stress.json"


def multiprocess_available() -> bool:
    return all(
        importlib.util.find_spec(m) is not None
        for m in ("course_lib.scaling.multihost", "course_lib.runtime.jax_processes")
    )


# ---------------------------------------------------------------------------------------
# The children: one program (or two) in a fresh process
# ---------------------------------------------------------------------------------------


def child_dp_ppo() -> None:
    from course_lib.scaling.devices import use_cpu_devices

    use_cpu_devices(2)  # before any JAX computation in this process
    import numpy as np

    from course_lib.runtime.watchdog import watchdog
    from course_lib.scaling.devices import data_mesh
    from course_lib.scaling.ppo_dp import PPOConfig, run_dp

    config = PPOConfig(
        num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2, update_epochs=2, hidden=16
    )
    with watchdog(WATCHDOG_S, "stress: data-parallel PPO on 2 CPU devices"):
        params, _ = run_dp(config, data_mesh(2), seed=0)
    if not np.isfinite(params).all():
        raise RuntimeError("data-parallel PPO returned non-finite parameters")
    print("DONE dp_ppo", flush=True)


def child_dp_halves() -> None:
    from course_lib.scaling.devices import use_cpu_devices

    use_cpu_devices(2)  # before any JAX computation in this process
    import jax
    import numpy as np

    from course_lib.runtime.watchdog import watchdog
    from course_lib.scaling.checklist import two_halves
    from course_lib.scaling.ppo_dp import PPOConfig, env_keys, init_flat_params

    config = PPOConfig(
        num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2, update_epochs=2, hidden=16
    )
    key = jax.random.key(0)
    flat0, keys0 = init_flat_params(key, config), env_keys(key, config.num_envs)  # on one device, before
    with watchdog(WATCHDOG_S, "stress: two 1-device PPO programs at once on 2 CPU devices"):
        results = jax.block_until_ready(two_halves(config, flat0, keys0, key)())
    if not all(np.isfinite(np.asarray(params)).all() for params, _ in results):
        raise RuntimeError("a half returned non-finite parameters")
    print("DONE dp_halves", flush=True)


def child_collectives_tp() -> None:
    from course_lib.scaling.devices import use_cpu_devices

    use_cpu_devices(4)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from course_lib.runtime.watchdog import watchdog
    from course_lib.scaling.collectives import allreduce_programs
    from course_lib.scaling.devices import check_multidevice_safe, data_mesh
    from course_lib.scaling.tensor_parallel import (
        init_mlp,
        mlp_reference,
        shard_batch,
        shard_mlp_params,
        tp_mlp,
        tp_mlp_mesh,
    )

    mesh = data_mesh(4)
    x = jax.device_put(
        np.random.default_rng(0).standard_normal(4 * 4096, dtype=np.float32), NamedSharding(mesh, P("data"))
    )
    with watchdog(WATCHDOG_S, "stress: ring all-reduce vs psum on 4 CPU devices"):
        out = {
            name: np.asarray(jax.block_until_ready(check_multidevice_safe(p, x)(x)))
            for name, p in allreduce_programs(mesh).items()
        }
    if not np.allclose(out["ring"], out["psum"], atol=1e-4):
        raise RuntimeError("ring all-reduce and psum disagree")
    print("DONE ring_psum", flush=True)

    params = init_mlp(jax.random.key(0), 8, 16, 4)  # one device, outside the multi-device program
    xb = jax.random.normal(jax.random.key(1), (8, 8))
    tp_mesh = tp_mlp_mesh(2, 2)

    def loss(p: Any, xs: jax.Array, fn: Any) -> jax.Array:
        return jnp.mean(fn(p, xs) ** 2)

    ref_val, ref_grad = jax.value_and_grad(loss)(params, xb, mlp_reference)
    placed_p, placed_x = shard_mlp_params(params, tp_mesh), shard_batch(xb, tp_mesh)
    step = jax.jit(jax.value_and_grad(lambda p, xs: loss(p, xs, lambda q, a: tp_mlp(q, a, tp_mesh))))
    with watchdog(WATCHDOG_S, "stress: tensor-parallel MLP forward + grad on a 2 x 2 mesh"):
        val, grad = jax.block_until_ready(check_multidevice_safe(step, placed_p, placed_x)(placed_p, placed_x))
    diffs = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(grad), jax.tree.leaves(ref_grad), strict=True)]
    if abs(float(val) - float(ref_val)) > 1e-4 or max(diffs) > 1e-4:
        raise RuntimeError(
            f"tensor-parallel MLP disagrees with the reference: {float(val)} vs {float(ref_val)}, {diffs}"
        )
    print("DONE tp_mlp", flush=True)


def child_qr_hang() -> None:
    """The root cause's minimal reproducer (course_lib.scaling.devices): a batched QR on 2 devices at once."""
    from course_lib.scaling.devices import use_cpu_devices

    use_cpu_devices(2)
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from course_lib.runtime.watchdog import watchdog
    from course_lib.scaling.devices import data_mesh

    mesh = data_mesh(2)
    x = jax.device_put(jax.random.normal(jax.random.key(0), (256, 64, 64)), NamedSharding(mesh, P("data")))
    f = jax.jit(jax.shard_map(lambda a: jnp.linalg.qr(a)[0], mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    with watchdog(
        HANG_REPRO_S,
        "100 calls of jit(shard_map(qr)) on x [256, 64, 64] over 2 CPU devices",
        hint="LAPACK on 2 devices",
    ):
        for i in range(100):  # one call can get lucky; a hundred blocked calls in a row do not
            jax.block_until_ready(f(x + i))  # deliberately NOT check_multidevice_safe: this is the hazard it refuses
    print("DONE qr", flush=True)


_CHILD_FUNCS = {
    "dp_ppo": child_dp_ppo,
    "dp_halves": child_dp_halves,
    "collectives_tp": child_collectives_tp,
    "qr": child_qr_hang,
}


# ---------------------------------------------------------------------------------------
# The parent
# ---------------------------------------------------------------------------------------


def _run_child(kind: str, timeout_s: float) -> tuple[int | None, str, str, float]:
    """Run ``--child kind`` in a fresh interpreter: (exit code or None if killed at the timeout, stdout, stderr, s)."""
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--child", kind],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        return done.returncode, done.stdout, done.stderr, time.monotonic() - t0
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed it
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return None, out, err, time.monotonic() - t0


def _classify(programs: tuple[str, ...], code: int | None, stdout: str) -> dict[str, str]:
    """Each program's outcome from its ``DONE`` line and the child's exit code."""
    outcome: dict[str, str] = {}
    stopped = False
    for name in programs:
        if f"DONE {name}" in stdout:
            outcome[name] = "finished"
        elif stopped:
            outcome[name] = "not run"
        else:
            outcome[name] = "hung" if code in (None, 124) else "failed"
            stopped = True
    return outcome


def _run_mp_psum(timeout_s: float) -> tuple[str, float, str]:
    from course_lib.runtime.jax_processes import LaunchTimeout, ProcessFailed, launch

    t0 = time.monotonic()
    try:
        results = launch(
            "course_lib.scaling.multihost", 2, timeout_s, args=["--program", "psum", "--watchdog-s", str(WATCHDOG_S)]
        )
    except LaunchTimeout as e:
        return "hung", time.monotonic() - t0, str(e)[-400:]
    except ProcessFailed as e:
        return ("hung" if e.exit_code == 124 else "failed"), time.monotonic() - t0, str(e)[-400:]
    ok = all(r.result is not None and r.result.get("reduced") == results[0].result["reduced"] for r in results)
    return ("finished" if ok else "failed"), time.monotonic() - t0, ""


def stress(runs: int = RUNS, include_multiprocess: bool = True, partial_path: Path | None = None) -> dict[str, Any]:
    """``runs`` repetitions of every program, each in fresh processes; tallies and times as JSON data
    (also written to ``partial_path`` after every repetition, ``runs_done`` saying how far it got)."""
    mp = include_multiprocess and multiprocess_available()
    programs = [p for p in PROGRAMS if mp or p != "mp_psum"]
    tally = {p: dict.fromkeys(OUTCOMES, 0) for p in programs}
    seconds: dict[str, list[float]] = {k: [] for k in (*CHILDREN, *(["mp_psum"] if mp else []))}
    problems: list[str] = []
    load_before = os.getloadavg()
    t_start = time.monotonic()
    for r in range(runs):
        for kind, names in CHILDREN.items():
            code, out, err, s = _run_child(kind, CHILD_TIMEOUT_S)
            seconds[kind].append(s)
            for name, what in _classify(names, code, out).items():
                tally[name][what] += 1
                if what in ("hung", "failed"):
                    problems.append(f"run {r}: {name} {what} (exit {code}): {err.strip()[-300:]}")
                    print(problems[-1], flush=True)
        if mp:
            what, s, why = _run_mp_psum(CHILD_TIMEOUT_S)
            seconds["mp_psum"].append(s)
            tally["mp_psum"][what] += 1
            if why:
                problems.append(f"run {r}: mp_psum {what}: {why}")
                print(problems[-1], flush=True)
        if partial_path is not None:
            partial_path.parent.mkdir(parents=True, exist_ok=True)
            partial_path.write_text(json.dumps({"runs_done": r + 1, "tally": tally, "problems": problems}, indent=1))
        done = ", ".join(f"{p} {tally[p]['finished']}" for p in programs)
        print(f"run {r + 1}/{runs}: finished so far: {done}; load {os.getloadavg()[0]:.1f}", flush=True)
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "runs": runs,
        "watchdog_s": WATCHDOG_S,
        "child_timeout_s": CHILD_TIMEOUT_S,
        "tally": tally,
        "seconds_per_process": {k: sorted(v) for k, v in seconds.items()},
        "total_s": time.monotonic() - t_start,
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "problems": problems,
    }


def reproduce_hang(tries: int = 3) -> dict[str, Any]:
    """Run the QR reproducer in fresh processes under a 20 s watchdog, up to ``tries`` times or
    until one hangs: did it hang, and in which try?"""
    attempts = []
    for _ in range(tries):
        code, out, err, s = _run_child("qr", HANG_REPRO_S + 30)
        attempts.append(
            {"exit_code": code, "seconds": s, "finished": "DONE qr" in out, "stderr_head": err.strip()[:300]}
        )
        if code in (None, 124):
            break
    hung = attempts[-1]["exit_code"] in (None, 124)
    return {"hung": hung, "tries": len(attempts), "attempts": attempts, "load": list(os.getloadavg())}


def result_from(data: dict[str, Any]) -> Result:
    rows = []
    for name, t in data["tally"].items():
        kind = next((k for k, v in CHILDREN.items() if name in v), name)
        times = data["seconds_per_process"][kind]
        rows.append([name, *(str(t[o]) for o in OUTCOMES), f"{times[len(times) // 2]:.1f}" if times else "-"])
    return Result(
        title="Lesson 05: multi-device programs, each run many times in a fresh process (finishes vs hangs)",
        columns=["program", *OUTCOMES, "median s per process"],
        rows=rows,
        notes=[
            f"{data['runs']} repetitions, each program in a fresh interpreter (ring_psum and tp_mlp share one), "
            f"each under a {data['watchdog_s']:g} s watchdog and a {data['child_timeout_s']:g} s kill; total "
            f"{data['total_s'] / 60:.1f} min.",
            "dp_ppo: data-parallel PPO on 2 CPU devices (4 envs x 16 steps, 2 updates); dp_halves: the same config's "
            "two halves as 1-device programs on the 2 devices at once (lesson 05's throughput ceiling); ring_psum: the ppermute ring "
            "and psum on 4 devices; tp_mlp: tensor-parallel MLP forward + grad on a 2 x 2 mesh; mp_psum: psum over "
            "2 processes of 1 device (gloo). 'median s per process' includes interpreter and JAX start-up and compile.",
            f"Load average (1 min): {data['load_before'][0]:.1f} before, {data['load_after'][0]:.1f} after; "
            f"{data['cpu_count']} cores; measured {data['date']}; raw numbers in `outputs/bench/multidevice_stress.json`.",
            *(f"Problem: {p}" for p in data["problems"][:5]),
        ],
    )


def run() -> Result:
    data = stress(RUNS)
    path = json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    return result_from(data)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=sorted(_CHILD_FUNCS), help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=RUNS, help="repetitions of every program")
    parser.add_argument("--no-multiprocess", action="store_true", help="leave out the 2-process psum")
    parser.add_argument("--reproduce-hang", action="store_true", help="run the QR reproducer under a 20 s watchdog")
    args = parser.parse_args(argv)
    if args.child:
        _CHILD_FUNCS[args.child]()
        return 0
    if args.reproduce_hang:
        rep = reproduce_hang()
        verdict = "HUNG (the watchdog ended it)" if rep["hung"] else "did NOT hang"
        runs = ", ".join(f"exit {a['exit_code']} after {a['seconds']:.1f} s" for a in rep["attempts"])
        print(
            f"jit(shard_map(qr)) on [256, 64, 64] over 2 CPU devices: {verdict} in {rep['tries']} fresh "
            f"process(es) ({runs}); load {rep['load'][0]:.1f}"
        )
        return 0
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    partial = json_path().with_suffix(".partial.json")
    data = stress(args.runs, include_multiprocess=not args.no_multiprocess, partial_path=partial)
    path = json_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))
    from run import render

    print(render("multidevice_stress", result_from(data)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
