"""All-reduce time vs message size on 2 and 4 CPU devices, lesson 05: XLA's psum vs the ppermute ring.

For each message size (float32 bytes per device, 4 KiB to 16 MiB) and each mesh (the first
2, then all 4 CPU host devices), `course_lib.scaling.collectives.measure_allreduce` compiles
`psum` and `ring_allreduce` (reduce-scatter + all-gather from `ppermute`), checks they
agree, and times each `REPEATS` times, interleaved (psum ring, ring psum, ...), every call
blocked, under the watchdog; cells are medians. The alpha-beta model
`t = 2 (N-1) alpha + 2 (N-1)/N * nbytes / bandwidth` is fitted to each implementation's
medians (relative least squares) and the ring's prediction is printed beside its time.
"Bus bandwidth" is nccl-tests' figure: the bytes each device sends in a ring,
`2 (N-1)/N * nbytes`, per second.

The measurement runs in a child process (`python bench/bench_collectives.py --measure`)
that asks for 4 CPU devices (`use_cpu_devices(4)`) before its first JAX computation, so
that `bench/run.py`, which runs every benchmark in one process, keeps its own JAX
settings for the others. The child writes `outputs/bench/collectives.json`; `run()`
reads it and renders the table.

    python bench/run.py collectives          # table into BENCHMARKS.md
    python bench/bench_collectives.py        # table to stdout only
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result, child_main, measure_in_child

from course_lib.course.paths import output_dir

N_DEVICES = (2, 4)
SIZES_BYTES = tuple(4096 * 4**k for k in range(7))  # 4 KiB .. 16 MiB per device
REPEATS = 7
CHILD_TIMEOUT_S = 900


def json_path() -> Path:
    return output_dir() / "bench" / "collectives.json"


def measure() -> dict[str, Any]:
    """In this process: 4 CPU devices, both meshes measured, everything as plain JSON data."""
    from course_lib.scaling.devices import use_cpu_devices

    use_cpu_devices(max(N_DEVICES))  # before any JAX computation in this process

    import jax

    from course_lib.scaling.collectives import measure_allreduce
    from course_lib.scaling.devices import data_mesh

    out: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "repeats": REPEATS,
        "sizes_bytes": list(SIZES_BYTES),
        "meshes": [],
    }
    for n in N_DEVICES:
        m = measure_allreduce(data_mesh(n), SIZES_BYTES, repeats=REPEATS, watchdog_s=600)
        out["meshes"].append(
            {
                "n_devices": n,
                "load_before": list(m.load_before),
                "load_after": list(m.load_after),
                "fits": {
                    name: {
                        "alpha_s": fit.alpha_s,
                        "bandwidth_bytes_per_s": fit.bandwidth_bytes_per_s,
                        "rel_rms_error": fit.rel_rms_error,
                    }
                    for name, fit in (("psum", m.psum_fit), ("ring", m.ring_fit))
                },
                "rows": [
                    {
                        "nbytes": r.nbytes,
                        "psum_s": r.psum_s,
                        "ring_s": r.ring_s,
                        "ring_over_psum": r.ring_over_psum,
                        "psum_bus_bytes_per_s": r.bus_bytes_per_s(r.psum_s),
                        "ring_bus_bytes_per_s": r.bus_bytes_per_s(r.ring_s),
                        "ring_model_s": r.ring_model_s,
                        "psum_model_s": r.psum_model_s,
                        "max_abs_diff": r.max_abs_diff,
                    }
                    for r in m.rows
                ],
            }
        )
        print(f"measured {n} devices; load {m.load_after[0]:.1f}", flush=True)
    return out


def _size(nbytes: int) -> str:
    return f"{nbytes // 2**20} MiB" if nbytes >= 2**20 else f"{nbytes // 2**10} KiB"


def result_from(data: dict[str, Any]) -> Result:
    rows = []
    for mesh in data["meshes"]:
        for r in mesh["rows"]:
            rows.append(
                [
                    str(mesh["n_devices"]),
                    _size(r["nbytes"]),
                    f"{1e3 * r['psum_s']:.3f}",
                    f"{1e3 * r['ring_s']:.3f}",
                    f"{r['ring_over_psum']:.2f}",
                    f"{r['psum_bus_bytes_per_s'] / 1e9:.2f}",
                    f"{r['ring_bus_bytes_per_s'] / 1e9:.2f}",
                    f"{1e3 * r['ring_model_s']:.3f}",
                ]
            )
    fits = []
    for mesh in data["meshes"]:
        for name in ("psum", "ring"):
            f = mesh["fits"][name]
            fits.append(
                f"{mesh['n_devices']} devices, {name}: alpha = {1e6 * f['alpha_s']:.1f} us per step, "
                f"bandwidth = {f['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, relative rms error of the fit "
                f"{100 * f['rel_rms_error']:.0f} %"
            )
    loads = "; ".join(
        f"{m['n_devices']} devices: {m['load_before'][0]:.1f} before, {m['load_after'][0]:.1f} after"
        for m in data["meshes"]
    )
    worst = max(r["max_abs_diff"] for m in data["meshes"] for r in m["rows"])
    return Result(
        title="Lesson 05: all-reduce time vs message size, XLA's psum vs the ppermute ring (CPU host devices)",
        columns=[
            "devices",
            "message (per device)",
            "psum ms",
            "ring ms",
            "ring / psum",
            "psum bus GB/s",
            "ring bus GB/s",
            "ring model ms",
        ],
        rows=rows,
        notes=[
            f"Medians of {data['repeats']} interleaved calls each (psum ring, ring psum, ...), every call blocked; "
            "float32 buffers of the given size on every device; the ring's and psum's results agreed on every "
            f"size (largest difference {worst:.1e}).",
            "Bus GB/s: the bytes each device sends in a ring all-reduce, 2 (N-1)/N x message, per second "
            "(nccl-tests' convention). Ring model ms: the alpha-beta model t = 2 (N-1) alpha + 2 (N-1)/N x "
            "message / bandwidth, fitted to the ring's medians (least squares on relative error).",
            *[f"Fit: {f}." for f in fits],
            "The CPU host devices are threads of one process sharing memory on 2 cores: a 'link' is a memory "
            "copy, XLA's all-reduce is not a ring (it meets all devices at one rendezvous and reduces in shared "
            "memory), and every ppermute step of the ring is a rendezvous of its own, so the ring pays "
            "2 (N-1) of them plus its copies. On GPUs the same model holds with NCCL's constants.",
            f"Load average (1 min) per mesh: {loads}. jax {data['jax']}; measured {data['date']} in a child "
            "process with 4 CPU devices (`python bench/bench_collectives.py --measure`); raw numbers in "
            "`outputs/bench/collectives.json`.",
        ],
    )


def run() -> Result:
    data = measure_in_child(__file__, json_path(), CHILD_TIMEOUT_S, "collectives", "a collective hung")
    return result_from(data)


def main(argv: list[str]) -> int:
    return child_main(argv, "collectives", measure, json_path(), run)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
