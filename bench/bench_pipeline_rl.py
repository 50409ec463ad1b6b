"""Synchronous vs one-step async vs pipeline RL (lesson 07): tokens/s and per-token lag, side by side.

The three regimes of `course_lib.pipeline.system` run from the same warm-started TinyLM
(2 layers, width 64) on the countdown task: one generator process with 32 decoding slots
and the trainer in this process (cores 0 and 1), one torch thread each, 4 prompts x 8 answers per update,
`N_UPDATES` updates per run. The regimes are interleaved (sync, one-step, pipeline, sync,
...) `REPEATS` times so that all see the same machine load; each cell is the median.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.actor_learner.model import flat_parameters
from course_lib.lm import CountdownTask, TinyLM
from course_lib.lm.task import warm_start
from course_lib.pipeline.system import LM, REGIMES, PipelineConfig, PipelineSystem, RegimeReport

N_UPDATES = 100
REPEATS = 3
MAX_LAG = 2
TOLERANCE = 0.1


def warm_weights() -> torch.Tensor:
    torch.manual_seed(0)
    model = TinyLM(LM)
    warm_start(model, CountdownTask(), steps=50)
    return flat_parameters(model)


def run() -> Result:
    init = warm_weights()
    base = PipelineConfig(n_updates=N_UPDATES, max_lag=MAX_LAG)
    reports: dict[str, list[RegimeReport]] = {r: [] for r in REGIMES}
    for repeat in range(REPEATS):
        for regime in REGIMES:
            with PipelineSystem(replace(base, regime=regime, seed=repeat), init) as system:
                reports[regime].append(system.train())
    sync_tps = statistics.median(r.tokens_per_second for r in reports["sync"])
    rows = []
    for regime in REGIMES:
        rs = reports[regime]
        tps = statistics.median(r.tokens_per_second for r in rs)
        rows.append(
            [
                regime,
                str(rs[0].lag_bound),
                f"{tps:,.0f}",
                f"{tps / sync_tps:.2f}",
                f"{statistics.median(r.busy_fraction('generator') for r in rs):.2f}",
                f"{statistics.median(r.slot_occupancy for r in rs):.2f}",
                f"{statistics.median(r.busy_fraction('trainer') for r in rs):.2f}",
                str(max(int(r.token_lags.max()) for r in rs)),
                f"{statistics.median(float(r.token_lags.mean()) for r in rs):.2f}",
                f"{statistics.median(float(r.series('ess').mean()) for r in rs):.3f}",
                f"{np.mean([r.series('reward')[N_UPDATES // 2 :].mean() for r in rs]):.3f}",
            ]
        )
    ratio = statistics.median(r.tokens_per_second for r in reports["pipeline"]) / sync_tps
    lag_ok = all(int(r.token_lags.max()) <= r.lag_bound for rs in reports.values() for r in rs)
    late = {k: np.mean([r.series("reward")[N_UPDATES // 2 :].mean() for r in rs]) for k, rs in reports.items()}
    reward_ok = late["pipeline"] >= late["sync"] - TOLERANCE
    return Result(
        title="Lesson 07: synchronous vs one-step async vs pipeline RL, answer tokens/s on 2 CPU cores (same run)",
        columns=[
            "regime",
            "lag bound",
            "tokens/s",
            "x sync",
            "gen busy",
            "slots useful",
            "train busy",
            "max lag",
            "mean lag",
            "ESS/N",
            "reward, 2nd half",
        ],
        rows=rows,
        notes=[
            f"One generator process (32 slots, pinned to core 0) + the trainer (this process, core 1), one torch thread each; 4 prompts x 8 "
            f"answers per update; {N_UPDATES} updates per run from the same 50-step warm start; regimes interleaved, "
            f"median of {REPEATS} runs (seeds 0..{REPEATS - 1}); reward: mean over the runs of the batches' reward "
            "in the second half of the updates.",
            f"Claims checked in this run: pipeline / sync tokens/s = {ratio:.2f} (target >= 1.5): "
            f"{'holds' if ratio >= 1.5 else 'FAILS'}; every consumed token within its regime's lag bound: "
            f"{'holds' if lag_ok else 'FAILS'}; pipeline reward per sample >= sync - {TOLERANCE}: "
            f"{'holds' if reward_ok else 'FAILS'}.",
            "Timings depend on the machine's load (the 2 cores were shared with other jobs); the ratio is the claim, "
            "not the absolute tokens/s. No GPU was lent for this lesson: full scale is not measured.",
            "Same measurement in the notebook: lessons/07_pipeline_rl.ipynb, section 3.",
        ],
    )
