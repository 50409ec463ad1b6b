"""Lesson 07's fair comparison, side by side in one run: conventional RL (k optimizer steps per
generation round, as PipelineRL measures against) and the synchronous loop (k = 1), both with an
inference engine and a data-parallel trainer rank per core, one-step async, pipeline RL with in-flight weight updates, drain-then-swap, pipeline RL without the
IS correction and with the KV cache recomputed (`course_lib.pipeline.experiment.ARMS`).

Every arm starts from the lesson's warm start and trains `N_UPDATES` updates of 4 prompts x 8
answers on the training problems; the arms of one seed run back to back, `SEEDS` seeds. Each
cell is the median over the seeds; ratios are medians of the per-seed ratios (each seed's
arms ran seconds apart, under the same load, in an order drawn from the seed). The lesson's recorded run with more seeds
and the sweeps: `python -m course_lib.pipeline.experiment --seeds 12`
(`course_lib/pipeline/recorded/arms_cpu.json`).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.pipeline import experiment

N_UPDATES = experiment.N_UPDATES
SEEDS = (0, 1, 2)
COLUMNS = [
    "arm",
    "lag bound",
    "answers/s",
    "x conventional",
    "tokens/s",
    "tokens/answer",
    "mean lag",
    "gen busy",
    "slots useful",
    "train busy",
    "reward gain (train problems)",
]


def rows_of(result: dict[str, Any]) -> tuple[list[list[str]], dict[str, float]]:
    """The table's rows and the paired ratios a lesson claim rests on."""
    runs = result["runs"]
    warm = result["warm_reward"]["train"]

    def med(arm: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[arm]))

    def paired(a: str, b: str, key: str = "answers_per_s") -> float:
        return float(statistics.median(x[key] / y[key] for x, y in zip(runs[a], runs[b])))

    rows = []
    for arm, rs in runs.items():
        gains = [r["reward"]["train"] - warm for r in rs]
        m, se = experiment.mean_se(gains)
        rows.append(
            [
                arm,
                str(rs[0]["lag_bound"]),
                f"{med(arm, 'answers_per_s'):,.0f}",
                f"{paired(arm, 'conventional_dp'):.2f}",
                f"{med(arm, 'tokens_per_s'):,.0f}",
                f"{med(arm, 'answer_tokens'):.1f}",
                f"{med(arm, 'lag_mean'):.2f}",
                f"{med(arm, 'gen_busy'):.2f}",
                f"{med(arm, 'slots_useful'):.2f}",
                f"{med(arm, 'train_busy'):.2f}",
                f"{m:+.3f} +- {se:.3f}",
            ]
        )
    ratios = {
        "pipeline / conventional": paired("pipeline", "conventional_dp"),
        "pipeline / synchronous": paired("pipeline", "sync_dp"),
        "in-flight / drain-then-swap": paired("pipeline", "pipeline_drain"),
        "keep / recompute": paired("pipeline", "pipeline_recompute"),
    }
    return rows, ratios


def run() -> Result:
    result = experiment.run_grid(SEEDS, sweep_lags=(), n_updates=N_UPDATES, progress=None)
    rows, ratios = rows_of(result)
    lag_ok = all(r["lag_max"] <= r["lag_bound"] for rs in result["runs"].values() for r in rs)
    loads = result["meta"]["loads"]
    return Result(
        title="Lesson 07: conventional RL vs pipeline RL and its ablations, answers/s on 2 CPU cores (same run)",
        columns=COLUMNS,
        rows=rows,
        notes=[
            f"{N_UPDATES} updates of 4 prompts x 8 answers per run from the lesson's {experiment.WARM_STEPS}-step warm "
            f"start; seeds {', '.join(map(str, SEEDS))}, each seed's arms back to back; the synchronous arms alternate "
            "generation (an engine process per core) and training (a data-parallel trainer rank per core); the "
            "others run a generator process (core 0) beside the trainer (core 1), one thread each. "
            f"Load average (1 min) after each seed: {', '.join(f'{x:.1f}' for x in loads)}.",
            "x conventional: median over seeds of the per-seed answers/s ratio. Reward gain: final policy on 1024 "
            "fresh draws of the training problems minus the warm start's, mean +- s.e. over the seeds.",
            "Paired ratios (median over seeds): "
            + "; ".join(f"{k} {v:.2f}" for k, v in ratios.items())
            + f"; every consumed token within its arm's lag bound: {'holds' if lag_ok else 'FAILS'}. "
            "PipelineRL (Piche et al. 2025) reports about 2x faster learning than conventional RL (32 optimizer "
            "steps per round) on 128 H100 GPUs, from about 2x the sample throughput.",
            "Timings depend on the machine's load (the 2 cores are shared with other jobs); the paired ratios are "
            "the claim, not the absolute rates.",
        ],
    )


def recorded_markdown(path: Path = experiment.RECORDED) -> str:
    """The recorded grid (lesson 07's seeds and the sweeps) as the markdown that
    BENCHMARKS.md holds: `python bench/bench_pipeline_rl.py --recorded`."""
    result = experiment.load(path)
    meta, warm = result["meta"], result["warm_reward"]["train"]
    rows, ratios = rows_of(result)
    header = COLUMNS
    lines = [
        f"Command: `{meta['command']}` (then `python bench/bench_pipeline_rl.py --recorded` for this table). "
        f"Measured {meta['date_utc'][:10]} on {meta['machine']}, torch {meta['torch']}, {meta['seconds']:.0f} s; "
        f"load average after each seed: {', '.join(f'{x:.1f}' for x in meta['loads'])}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        f"- {len(meta['seeds'])} seeds x {meta['n_updates']} updates; paired ratios (median over seeds): "
        + "; ".join(f"{k} {v:.2f}" for k, v in ratios.items())
        + ".",
    ]
    for arm, runs in result.get("throughput", {}).items():
        ratio = statistics.median(
            x["answers_per_s"] / y["answers_per_s"] for x, y in zip(runs, result["throughput"]["conventional_dp"])
        )
        lines.append(
            f"- policy frozen (lr = 0, {meta.get('throughput_updates', '?')} updates), {arm}: "
            f"{statistics.median(r['answers_per_s'] for r in runs):,.0f} answers/s, x conventional {ratio:.2f}, "
            f"{statistics.median(r['answer_tokens'] for r in runs):.1f} tokens/answer, gen busy "
            f"{statistics.median(r['gen_busy'] for r in runs):.2f}, train busy "
            f"{statistics.median(r['train_busy'] for r in runs):.2f}, slots useful "
            f"{statistics.median(r['slots_useful'] for r in runs):.2f}"
        )
    for name, runs in result["sweep"].items():
        gains = [r["reward"]["train"] - warm for r in runs]
        m, se = experiment.mean_se(gains)
        what = (
            f"conventional RL with k = {name[1:]}"
            if name.startswith("k")
            else f"pipeline without the correction at max_lag {name[6:]}"
            if name.startswith("no_is_")
            else f"pipeline at max_lag {name}"
        )
        lines.append(
            f"- {what}: {statistics.median(r['answers_per_s'] for r in runs):,.0f} answers/s, "
            f"mean lag {statistics.median(r['lag_mean'] for r in runs):.2f}, train busy "
            f"{statistics.median(r['train_busy'] for r in runs):.2f}, reward gain {m:+.3f} +- {se:.3f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--recorded"]:
        print(recorded_markdown())
    else:
        print("usage: python bench/bench_pipeline_rl.py --recorded (the measurement: python bench/run.py pipeline_rl)")
