"""Lesson 11's capstone job: asynchronous (pipeline RL, bounded lag) vs synchronous, same script; and
colocated weight updates through a shared buffer vs memcpy.

Part 1 runs the whole torchrun job (`course_lib.capstone.run`: 4 ranks on this machine, gloo) at
the default layout, which lesson 08's model picks in the first run (calibrated here), then
pinned for every run so that both arms use the same split and slots; the synchronous arm is
the same job with `--max-lag 0` (every group of update u sampled by version u: the generators
wait while the trainers train). Arms are interleaved A B A B A B; each cell is the median of
`REPEATS` runs; the load average is recorded before each run. A third arm, colocated, moves
the weights through a `/dev/shm` buffer instead of lesson 09's broadcast.

Part 2 times the colocated update itself for a `COLOCATED_MIB` MiB model: the trainer's side
(parameters -> shared slot, one copy) and the generator's (its parameters re-pointed at the
slot, no copy), against one in-process `copy_` of the same bytes (memcpy), interleaved,
medians; and, for comparison, a generator that copies the slot into parameters of its own.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.capstone import run as run_capstone
from course_lib.capstone.colocated import SharedBuffer
from course_lib.capstone.report import CapstoneReport

N_UPDATES = 120
REPEATS = 3
COLOCATED_MIB = 64
COPY_REPEATS = 15


def _job(run_dir: Path, **overrides: Any) -> CapstoneReport:
    return run_capstone(
        run_dir, nproc_per_node=4, max_restarts=0, deadline_s=600, show_progress=False, echo=None,
        n_updates=N_UPDATES, eval_prompts=256, **overrides,
    )  # fmt: skip


def measure_jobs(root: Path) -> tuple[dict[str, list[CapstoneReport]], list[float], dict[str, Any]]:
    """The arms interleaved, ``REPEATS`` rounds; returns the reports per arm, the load averages, the layout."""
    first = _job(root / "layout")  # calibrates and chooses the layout
    plan = first.layout
    pinned = {"calibrate": False, "n_trainers": int(plan["n_trainers"]), "n_slots": int(plan["n_slots"])}
    arms: dict[str, dict[str, Any]] = {
        "async": {},
        "sync (max_lag 0)": {"max_lag": 0},
        "async, colocated": {"colocated": True},
    }
    reports: dict[str, list[CapstoneReport]] = {arm: [] for arm in arms}
    loads = []
    for r in range(REPEATS):
        for i, (arm, extra) in enumerate(arms.items()):
            loads.append(os.getloadavg()[0])
            reports[arm].append(_job(root / f"{r}-{i}", seed=r, **pinned, **extra))
    return reports, loads, plan


def measure_colocated() -> dict[str, float]:
    """Median seconds: memcpy of the model's bytes; the trainer's publish (one copy into the shared
    slot); the generator's attach (its parameters re-pointed at the slot, no copy); and, for
    comparison, a generator that copied the slot into parameters of its own (a second copy)."""
    numel = COLOCATED_MIB * 2**20 // 4
    params = [torch.randn(numel // 4) for _ in range(4)]  # a model in 4 tensors
    dst = [torch.empty_like(p) for p in params]
    mine = [torch.nn.Parameter(torch.empty_like(p)) for p in params]
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as d:
        writer = SharedBuffer(Path(d) / "w", numel, create=True)
        reader = SharedBuffer(Path(d) / "w", numel)
        times: dict[str, list[float]] = {"memcpy": [], "publish": [], "attach": [], "copy_out": []}
        for v in range(1, COPY_REPEATS + 2):
            params[0][0] = float(v)
            t0 = time.perf_counter()
            for a, b in zip(dst, params):
                a.copy_(b)
            t1 = time.perf_counter()
            writer.publish(params, v)
            t2 = time.perf_counter()
            got = reader.attach(mine, reader=0)
            t3 = time.perf_counter()
            slot = reader.slots[int(reader.header[1])]
            offset = 0
            for a in dst:  # the two-copy reader: slot -> its own parameters
                a.copy_(slot[offset : offset + a.numel()])
                offset += a.numel()
            t4 = time.perf_counter()
            assert got == v and all(torch.equal(a, b) for a, b in zip(mine, params))
            assert all(torch.equal(a, b) for a, b in zip(dst, params))
            if v > 2:  # the first round of each slot touches fresh pages
                times["memcpy"].append(t1 - t0)
                times["publish"].append(t2 - t1)
                times["attach"].append(t3 - t2)
                times["copy_out"].append(t4 - t3)
    return {k: statistics.median(v) for k, v in times.items()}


def run() -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        reports, loads, plan = measure_jobs(Path(tmp))
    copies = measure_colocated()

    def med(arm: str, value: Any) -> float:
        return float(statistics.median(value(r) for r in reports[arm]))

    def send_ms(r: CapstoneReport) -> float:
        s = r.syncs
        return 1e3 * float(statistics.median(s["total"][s["side"] == "send"]))

    def recv_ms(r: CapstoneReport) -> float:
        s = r.syncs
        return 1e3 * float(statistics.median(s["total"][s["side"] == "receive"]))

    def paired(arm: str, base: str) -> list[float]:
        """updates/s of ``arm`` over ``base``'s, round by round (the arms of a round ran back to back)."""
        return [a.updates_per_s / b.updates_per_s for a, b in zip(reports[arm], reports[base])]

    rows = []
    for arm in reports:
        ratios_arm = paired(arm, "sync (max_lag 0)")
        rows.append(
            [
                arm,
                f"{med(arm, lambda r: r.updates_per_s):.1f}",
                f"{med(arm, lambda r: r.samples_per_s):,.0f}",
                f"{med(arm, lambda r: r.tokens_per_s):,.0f}",
                f"{med(arm, lambda r: float(r.updates['tokens'].sum() / r.updates['samples'].sum())):.1f}",
                f"{statistics.median(ratios_arm):.2f}",
                f"{med(arm, lambda r: float(r.updates['lag_mean'].mean())):.2f}",
                str(max(int(r.updates["lag_max"].max()) for r in reports[arm])),
                f"{med(arm, send_ms):.1f}",
                f"{med(arm, recv_ms):.1f}",
                f"{med(arm, lambda r: r.held_out()[0]):.3f} -> {med(arm, lambda r: r.held_out()[1]):.3f}",
            ]
        )
    ratios = paired("async", "sync (max_lag 0)")
    colocated = paired("async, colocated", "async")
    nbytes = COLOCATED_MIB * 2**20
    bw = {k: nbytes / v / 1e9 for k, v in copies.items()}
    end_to_end = nbytes / (copies["publish"] + copies["attach"]) / 1e9
    two_copies = nbytes / (copies["publish"] + copies["copy_out"]) / 1e9
    audits = all(r.result["audit"]["ok"] for rs in reports.values() for r in rs)
    return Result(
        title="Lesson 11: the capstone job, asynchronous vs synchronous (same script, --max-lag 0), and colocated "
        "weight updates vs memcpy, on 2 CPU cores (same run)",
        columns=[
            "arm",
            "updates/s",
            "samples/s",
            "answer tokens/s",
            "answer length",
            "x sync (updates/s, median of per-round ratios)",
            "mean lag",
            "max lag",
            "weight send ms (trainer 0)",
            "weight receive ms (generator)",
            "held-out reward",
        ],
        rows=rows,
        notes=[
            f"torchrun, 4 ranks on 2 cores, gloo: layout chosen by lesson 08's model in a first calibrated run, "
            f"then pinned: {plan['n_trainers']} trainers + {plan['world_size'] - plan['n_trainers']} generators x "
            f"{plan['n_slots']} slots (predicted {plan['predicted_tokens_per_s']:,.0f} answer tokens/s async, "
            f"{plan['predicted_sync_tokens_per_s']:,.0f} sync); {N_UPDATES} updates of 4 prompts x 8 answers per run, "
            f"max_lag 4 (async) or 0 (sync); arms interleaved, median of {REPEATS} runs (seeds 0..{REPEATS - 1}); "
            f"load average (1 min) before each run: {', '.join(f'{x:.1f}' for x in loads)}.",
            f"async / sync updates/s per round: {', '.join(f'{x:.2f}' for x in ratios)} (median "
            f"{statistics.median(ratios):.2f}; goal > 1.1, lesson 11's claim: "
            f"{'met' if statistics.median(ratios) > 1.1 else 'NOT met'}); "
            f"colocated / async per round: {', '.join(f'{x:.2f}' for x in colocated)}. Rates are per second of "
            "updating (first update's start to the last one's end; start-up, warm start and evaluation left out); "
            "every update is one batch of 32 answers, so updates/s and samples/s compare the arms, while answer "
            "tokens/s also moves with the answers' length (its column). Every run's sample ledger balanced exactly: "
            f"{'yes' if audits else 'NO'}.",
            "Weight send: trainer 0's whole update (announce, lesson 09's pipelined checksummed broadcast on the sync "
            "group, or the shared-buffer write); receive: a generator's, from joining to weights loaded (0.5 MB model).",
            f"Colocated update of a {COLOCATED_MIB} MiB model (4 tensors), medians of {COPY_REPEATS - 1}: memcpy "
            f"{1e3 * copies['memcpy']:.1f} ms ({bw['memcpy']:.1f} GB/s); trainer's write into the shared slot "
            f"{1e3 * copies['publish']:.1f} ms ({bw['publish'] / bw['memcpy']:.2f} of memcpy); generator's attach "
            f"(parameters re-pointed at the slot, no copy) {1e6 * copies['attach']:.0f} us; end to end "
            f"{end_to_end / bw['memcpy']:.2f} of memcpy (goal >= 0.5: "
            f"{'met' if end_to_end / bw['memcpy'] >= 0.5 else 'NOT met'}). A generator copying the slot into "
            f"parameters of its own (a second copy, {1e3 * copies['copy_out']:.1f} ms) would make it "
            f"{two_copies / bw['memcpy']:.2f} of memcpy.",
            "Timings depend on the machine's load (4 ranks oversubscribe 2 cores, and other jobs share them); the "
            "ratios are the claim. Same job, plots and a kill-and-recover demo: lesson 11's report notebook.",
        ],
    )


if __name__ == "__main__":
    from run import render

    print(render("capstone", run()))
