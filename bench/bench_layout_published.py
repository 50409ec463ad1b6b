"""The layout model (lesson 08) against published asynchronous-RL speedups.

Every case of :data:`course_lib.layout.published.CASES` (verl fully-async at 32, 64 and 128
H20s; verl one-step-off with FSDP2 and Megatron; PipelineRL on 128 H100s) through the
model with the shared assumptions of :data:`course_lib.layout.published.SHARED` (nothing
fitted per case): the predicted speedup beside the published one, their ratio, the model's
step and trainer times beside the published stage times, and the MFU at which the model's
trainer would take the published trainer time (above 1: impossible with the shared lengths).
The model is deterministic: this table depends on no machine.

    python bench/run.py layout_published    # table into BENCHMARKS.md
    python bench/bench_layout_published.py  # table to stdout only
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result, render

from course_lib.layout.published import CASES, SHARED, predicted_speedup


def _pair(a: float | None, b: float | None, fmt: str) -> str:
    return " / ".join("-" if x is None else format(x, fmt) for x in (a, b))


def run() -> Result:
    rows = []
    for case in CASES:
        r = predicted_speedup(case)
        mfu = r.implied_mfu()
        rows.append(
            [
                case.name,
                f"{case.system.label()} vs {case.baseline.label()}",
                f"{case.published_speedup:.2f}x",
                f"{r.predicted_speedup:.2f}x",
                f"{r.ratio:.2f} ({'within 25%' if r.within_25_percent else 'misses'})",
                f"{_pair(r.system.step_s, r.baseline.step_s, '.0f')} (published "
                f"{_pair(*case.published_step_s, '.0f')})",
                f"{_pair(r.system.train_s, r.baseline.train_s, '.0f')} (published "
                f"{_pair(*case.published_train_s, '.0f')})",
                _pair(*mfu, ".2f"),
            ]
        )
    s = SHARED
    return Result(
        title="Lesson 08: the layout model against published async-vs-sync speedups",
        columns=[
            "case",
            "system vs baseline",
            "published",
            "model",
            "model / published",
            "step s, system / baseline",
            "trainer s per step",
            "implied MFU",
        ],
        rows=rows,
        notes=[
            f"Shared assumptions (course_lib.layout.published.SHARED, one choice for every case): answers log-normal, "
            f"mean {s.mean_answer_tokens:,.0f} tokens, p99/median {s.p99_over_median:g}, capped at each case's "
            f"generation limit; {s.prompt_tokens} prompt tokens; {s.mfu:.0%} MFU; decode at "
            f"{s.decode_efficiency:.0%} of peak; {s.memory_fraction:.0%} of memory usable; weight sync at "
            f"{s.sync_bytes_per_s / 1e9:.0f} GB/s.",
            "Every miss predicts less than was published. The verl fully-async runs' stage times need their "
            "separated trainers to run at a higher MFU than the colocated ones (above 1 at 16 and 32 trainers): "
            "their answers were shorter than the colocated baselines', so the published ratio mixes a systems "
            "speedup with a workload that drifted, which a fixed-workload model does not reproduce "
            "(PublishedCase.known_gap names each).",
            "Sources: verl docs advance/fully_async.md and advance/one_step_off.md; PipelineRL arXiv 2509.19128 "
            "sec. 5 and its repository's conf/base.yaml.",
        ],
    )


if __name__ == "__main__":
    print(render("layout_published", run()))
