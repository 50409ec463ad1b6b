"""What lesson 11's capstone learns, per class of problems, over seeds: the pipeline (async)
and the colocated synchronous baseline (sync-colocated), each seed one torchrun launch of
both arms, every rank pinned to 2 cores.

Not part of ``bench/run.py`` (it takes about a minute per seed); run it by hand::

    python bench/capstone_learning.py OUT_DIR                       # the defaults, seeds 0-4
    python bench/capstone_learning.py OUT_DIR --lr 1e-3 --warm-steps 30   # the old defaults

It prints, per arm and seed, the evaluation reward and the mean answer length at the start
and the end for each quotient class (``course_lib.lm.task.QUOTIENT_CLASSES``), and writes
them to ``OUT_DIR/capstone_learning.json``. Figures: BENCHMARKS.md, "Lesson 11: what the
capstone learns".
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from course_lib.capstone.config import CapstoneConfig
from course_lib.capstone.launch import run_arms


def main() -> None:
    defaults = CapstoneConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--updates", type=int, default=defaults.n_updates)
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--warm-steps", type=int, default=defaults.warm_steps)
    # sync-colocated as lesson 11 runs it: one rank per core (2 x 16 answers), the other two ranks idle
    parser.add_argument("--arms", nargs="+", default=["async", "sync-colocated@2x16"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for seed in args.seeds:
        t0 = time.time()
        runs = run_arms(
            args.out / f"seed{seed}", args.arms, deadline_s=900, show_progress=False, echo=None, cores=2,
            calibrate=False, n_trainers=2, n_slots=32, seed=seed, n_updates=args.updates, lr=args.lr,
            warm_steps=args.warm_steps,
        )  # fmt: skip
        for name, rep in runs:
            start, end = rep.by_class("start"), rep.by_class("end")
            results[f"{name}/seed{seed}"] = {
                "updates_per_s": rep.updates_per_s, "eval": rep.held_out(), "start": start, "end": end,
            }  # fmt: skip
            print(f"{name} seed {seed} ({time.time() - t0:.0f} s): {rep.updates_per_s:.1f} updates/s, evaluation "
                  f"reward {rep.held_out()[0]:.3f} -> {rep.held_out()[1]:.3f}")  # fmt: skip
            print("   " + " | ".join(
                f"q {a['quotients'][0]}-{a['quotients'][1]}: {a['reward']:.2f} -> {b['reward']:.2f}, "
                f"{a['answer_tokens']:.1f} -> {b['answer_tokens']:.1f} tokens"
                for a, b in zip(start, end)
            ))  # fmt: skip
    (args.out / "capstone_learning.json").write_text(
        json.dumps(vars(args) | {"out": str(args.out), "results": results}, indent=1)
    )


if __name__ == "__main__":
    main()
