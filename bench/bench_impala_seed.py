"""IMPALA vs SEED RL layouts of lesson 03: env frames/s of the same system, runs interleaved.

Both layouts run the same CartPole actor-learner system (`course_lib.actor_learner`): 2
actor processes x 8 envs, unrolls of 16 steps, batches of 2 unrolls, the V-trace learner
in the main process. IMPALA actors run their own policy copy; SEED actors only step
environments and a central inference process batches their observations. The runs
alternate IMPALA, SEED, IMPALA, SEED, ... (`course_lib.actor_learner.system.compare_layouts`,
the same function the lesson calls), so both layouts see the same drift of the machine's
load; each cell is the median of `REPEATS` runs of `SECONDS` seconds each (start-up
excluded), at two network widths. The load average is printed before and after, because
on a shared 2-core machine the answer depends on it (see the notes).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.actor_learner.system import SystemConfig, compare_layouts

SECONDS = 4.0
REPEATS = 5
HIDDEN = (64, 512)


def load() -> str:
    """The 1-, 5- and 15-minute load averages, e.g. ``"0.4 / 0.9 / 1.1"``."""
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def run() -> Result:
    base = SystemConfig(n_actors=2, envs_per_actor=8, unroll=16, batch_size=2)
    load_before = load()
    reports = compare_layouts(base, HIDDEN, REPEATS, SECONDS)
    load_after = load()
    rows = []
    for hidden in HIDDEN:
        fps = {layout: [r.report.frames_per_second for r in reports[layout, hidden]] for layout in ("impala", "seed")}
        cpu = {layout: [r.cpu_ms_per_1k_frames for r in reports[layout, hidden]] for layout in ("impala", "seed")}
        lag = {layout: [float(r.report.lags.mean()) for r in reports[layout, hidden]] for layout in ("impala", "seed")}
        pairs = [s / i for i, s in zip(fps["impala"], fps["seed"])]  # each SEED run over the IMPALA run before it
        impala, seed = statistics.median(fps["impala"]), statistics.median(fps["seed"])
        rows.append(
            [
                str(hidden),
                f"{impala:,.0f}",
                f"{seed:,.0f}",
                f"{seed / impala:.2f}",
                f"{min(pairs):.2f}-{max(pairs):.2f}",
                f"{statistics.median(cpu['impala']):.0f}",
                f"{statistics.median(cpu['seed']):.0f}",
                f"{statistics.median(lag['impala']):.1f}",
                f"{statistics.median(lag['seed']):.1f}",
            ]
        )
    return Result(
        title="Lesson 03: IMPALA vs SEED RL layout, env frames/s on CartPole (interleaved runs)",
        columns=[
            "policy MLP width",
            "IMPALA frames/s (median)",
            "SEED frames/s (median)",
            "SEED / IMPALA (medians)",
            "SEED / IMPALA per pair (min-max)",
            "IMPALA CPU ms / 1k frames",
            "SEED CPU ms / 1k frames",
            "IMPALA mean lag",
            "SEED mean lag",
        ],
        rows=rows,
        notes=[
            f"2 actors x 8 envs, T = 16, batch 2 unrolls, V-trace learner; {REPEATS} runs of {SECONDS:g} s per "
            "layout and width, layouts interleaved (IMPALA, SEED, IMPALA, SEED, ...); frames counted by the "
            "learner after its first batch; CPU ms / 1k frames: user + system CPU time of the learner and every child process "
            "over the same window, per 1,000 frames (median).",
            f"Load average (1 / 5 / 15 min) before: {load_before}; after: {load_after} (2 cores).",
            "No accelerator here: SEED's central inference runs on the same 2 CPU cores as everything else. It "
            "replaces one forward pass per actor by one batched pass, but every env step becomes a round trip "
            "through the server (its actors wait for actions most of the time): with a tiny MLP the batching saves "
            "less CPU than the messaging costs, so a SEED frame costs more CPU than an IMPALA frame (the CPU "
            "columns). Frames/s, the wall-clock result, depends on the machine's load (see the per-pair range); "
            "no direction holds across loads. Central batched inference wins when the policy's forward pass is "
            "expensive relative to an env step and the actors would otherwise compete for cores (large models, "
            "an accelerator beside the learner).",
            "Same measurement in the notebook: lessons/03_impala_vtrace.ipynb, section 5.",
        ],
    )
