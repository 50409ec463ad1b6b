"""Lesson 07's fair comparison: the arms PipelineRL is measured against, over seeds.

PipelineRL (Piche et al. 2025) compares itself with **conventional RL**, which alternates
between generating with all the hardware and training on all of it, taking ``k``
optimizer steps per generation round (lags ``0 .. k - 1``). The arms here
(:data:`ARMS`), all from the same warm-started weights, the same prompts per seed, the same
batch (4 prompts x 8 answers) and the same number of updates:

===================== =========================================================== ==========
arm                   what runs                                                    lag bound
===================== =========================================================== ==========
``sync_dp``           generate one batch on both cores, train one step on both     0
``conventional_dp``   generate ``k`` batches, then take ``k`` steps, both cores    ``k - 1``
``one_step``          generator (core 0) one batch ahead of the trainer (core 1)   1
``pipeline``          in-flight weight updates, continuous batching, cores 0 and 1 ``max_lag``
``pipeline_drain``    the same without the in-flight swap: drain, then swap        ``max_lag``
``pipeline_no_is``    pipeline RL without the truncated-IS correction              ``max_lag``
``pipeline_recompute`` pipeline RL rebuilding the live prefixes' KV cache at a swap ``max_lag``
===================== =========================================================== ==========

The synchronous arms run as conventional RL runs on a cluster: an inference engine per
core (``n_generators=2``, each with half the slots) generates the round, then a
data-parallel trainer, a rank per core (``dp_trainers=2``), trains on it; the cores
alternate between the two jobs.
``k`` is matched to the pipeline's lag bound (``k = max_lag + 1``: both arms' tokens lag
at most ``max_lag``). The arms of one seed run back to back, in an order drawn from the
seed (seed 0: every arm, then seed 1, ...), so that they share the machine's load and no
arm always runs first. Each run records its throughput (answers/s
and tokens/s, which longer answers inflate), the lag of every consumed token, the busy
fractions, and the reward of its final policy on two fixed evaluation sets: fresh draws of
the **training problems**, and the **held-out pairs** that no training prompt is
(:class:`~course_lib.lm.task.CountdownTask` ``split="held_out"``). The synchronous arms
keep snapshots, so that their reward *at the moment pipeline RL finished* can be measured
(equal wall-clock).

Run from the command line (prints progress, writes JSON that :func:`load` reads)::

    python -m course_lib.pipeline.experiment --seeds 12 --out course_lib/pipeline/recorded/arms_cpu.json

The committed record (:data:`RECORDED`) is what lesson 07 reads beside the one seed it
runs live; ``BENCHMARKS.md`` says when and where it was measured.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from course_lib.lm.model import TinyLM
from course_lib.lm.task import CountdownTask, evaluate, warm_start
from course_lib.pipeline.system import LM, PipelineConfig, PipelineSystem, RegimeReport
from course_lib.runtime.weights import flat_parameters

RECORDED = Path(__file__).parent / "recorded" / "arms_cpu.json"
MAX_LAG = 3
# an engine (32 slots, what the pipeline's one generator holds) and a trainer rank per core
ENGINES = {"n_generators": 2, "dp_trainers": 2, "n_slots": 64, "snapshot_every": 1}
ARMS: dict[str, dict[str, Any]] = {
    "sync_dp": {"regime": "conventional", "steps_per_round": 1, **ENGINES},
    "conventional_dp": {"regime": "conventional", "steps_per_round": MAX_LAG + 1, **ENGINES},
    "one_step": {"regime": "one_step"},
    "pipeline": {"regime": "pipeline"},
    "pipeline_drain": {"regime": "pipeline", "inflight": False},
    "pipeline_no_is": {"regime": "pipeline", "correction": False},
    "pipeline_recompute": {"regime": "pipeline", "recompute_cache": True},
}
SWEEP_LAGS = (1, 2, 5, 8)  # and MAX_LAG, the pipeline arm itself
SWEEP_K = (2, 8, 16)  # conventional RL's steps per round, besides 1 (sync_dp) and MAX_LAG + 1
SWEEP_NO_IS = 8  # pipeline RL without the correction at this bound too, where the lag is largest
# throughput with the policy frozen (lr = 0): every arm decodes the warm start's answers, so
# answers/s compares the systems alone, not the answer lengths their policies drift to
THROUGHPUT_ARMS = ("sync_dp", "conventional_dp", "one_step", "pipeline", "pipeline_drain", "pipeline_recompute")
THROUGHPUT_UPDATES = 60
# and, frozen too, the sweeps' configurations: conventional RL's k and pipeline RL's bound
THROUGHPUT_SWEEP: dict[str, dict[str, Any]] = {
    **{f"k{k}": {"regime": "conventional", "steps_per_round": k, **ENGINES} for k in SWEEP_K},
    **{f"lag{b}": {"regime": "pipeline", "max_lag": b} for b in (1, 2, 5, 8)},
}
EVAL_PROMPTS, EVAL_SEED = 1024, 123
WARM_STEPS = 30
N_UPDATES = 150


def base_config(n_updates: int = N_UPDATES, max_lag: int = MAX_LAG) -> PipelineConfig:
    """The configuration every arm starts from: training prompts only (``split="train"``)."""
    return PipelineConfig(n_updates=n_updates, max_lag=max_lag, split="train")


def warm_policy(steps: int = WARM_STEPS) -> tuple[TinyLM, torch.Tensor, list[float]]:
    """The lesson's supervised warm start on the training problems: ``(model, the weights
    10 steps before the end, the loss of every step)``; deterministic (seeded)."""
    torch.manual_seed(0)
    model = TinyLM(LM)
    task = CountdownTask(split="train")
    losses = warm_start(model, task, steps=steps - 10)
    before = flat_parameters(model)
    losses += warm_start(model, task, steps=10, seed=1)
    return model, before, losses


def policy_from(state: dict[str, torch.Tensor]) -> TinyLM:
    model = TinyLM(LM)
    model.load_state_dict(state)
    return model


def rewards_of(model: TinyLM) -> dict[str, float]:
    """Exact-match reward on the two fixed evaluation sets (same prompts and sampling noise for every policy)."""
    return {
        "train": evaluate(model, CountdownTask(split="train"), n=EVAL_PROMPTS, seed=EVAL_SEED),
        "held_out": evaluate(model, CountdownTask(split="held_out"), n=EVAL_PROMPTS, seed=EVAL_SEED),
    }


def summary(report: RegimeReport) -> dict[str, Any]:
    """What one run measured, as plain numbers (JSON-able)."""
    lags = report.token_lags.astype(int)
    return {
        "arm": report.arm,
        "lag_bound": report.lag_bound,
        "seconds": report.seconds,
        "answers_per_s": report.answers_per_second,
        "tokens_per_s": report.tokens_per_second,
        "answer_tokens": report.answer_tokens,
        "lag_mean": float(lags.mean()),
        "lag_max": int(lags.max()),
        "lag_counts": np.bincount(lags, minlength=report.lag_bound + 1).tolist(),
        "gen_busy": report.busy_fraction("generator"),
        "train_busy": report.busy_fraction("trainer"),
        "slots_useful": report.slot_occupancy,
        "swap_seconds": report.swap_seconds,
        "recomputed_tokens": report.recomputed_tokens,
        "generator_gap": None if not report.gap[1] else report.generator_gap,
        "generator_gap_tokens": int(report.gap[1]),
        "ess": float(report.series("ess").mean()),
        # one training step's phases (rank 0, median ms): batch preparation, its own share of
        # the gradient, waiting for the other ranks' shares, optimizer step and publish
        "step_ms": {
            k: 1000 * float(np.median(report.series(k))) for k in ("t_prepare", "t_share", "t_others", "t_step")
        },
        "batch_reward": report.series("reward").round(4).tolist(),
        "time": report.series("time").round(4).tolist(),
        "events": [e for e in report.events if "lags" in e],
    }


def run_seed(
    seed: int,
    init_flat: torch.Tensor,
    arms: dict[str, dict[str, Any]],
    base: PipelineConfig,
    progress: Callable[[str], None] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
    frozen: Sequence[str] = (),
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """Every run of one seed, back to back in an order drawn from the seed: the ``arms``, the
    ``extra`` (sweep) configurations, and the ``frozen`` arms again with the policy frozen
    (``lr = 0``, :data:`THROUGHPUT_UPDATES` updates, timed only). Then the final policies'
    rewards, and the synchronous arms' reward at the moment ``pipeline`` finished (if both
    ran). Returns ``(arms, extra, frozen)`` results by name."""
    extra = extra or {}
    runs = [("arm", name, kw) for name, kw in arms.items()] + [("extra", name, kw) for name, kw in extra.items()]
    frozen_kw = {"lr": 0.0, "n_updates": THROUGHPUT_UPDATES, "snapshot_every": 0}
    runs += [("frozen", name, {**arms[name], **frozen_kw}) for name in frozen]
    out: dict[str, dict[str, dict[str, Any]]] = {"arm": {}, "extra": {}, "frozen": {}}
    reports: dict[str, RegimeReport] = {}
    for position, i in enumerate(np.random.default_rng(seed).permutation(len(runs))):
        kind, name, kw = runs[i]
        cfg = replace(base, seed=seed, **kw)
        with PipelineSystem(cfg, init_flat) as system:
            report = system.train()
        result = summary(report) | {"position": position}
        if kind != "frozen":
            result["reward"] = rewards_of(policy_from(report.final_state))
        if kind == "arm":
            reports[name] = report
        out[kind][name] = result
        if progress is not None:
            progress(f"seed {seed} {kind} {name}: {report.seconds:.1f} s")
    if "pipeline" in reports:
        finish = reports["pipeline"].seconds
        for arm, report in reports.items():
            if report.snapshots and arm != "pipeline":
                updates, _, state = report.state_at(finish)
                out["arm"][arm]["at_pipeline_finish"] = {"updates": updates, "reward": rewards_of(policy_from(state))}
    return out["arm"], out["extra"], out["frozen"]


def run_grid(
    seeds: Sequence[int],
    arms: dict[str, dict[str, Any]] | None = None,
    sweep_lags: Sequence[int] = (),
    sweep_k: Sequence[int] = (),
    no_is_lag: int | None = None,
    frozen: Sequence[str] = (),
    n_updates: int = N_UPDATES,
    progress: Callable[[str], None] | None = print,
    warm_steps: int = WARM_STEPS,
) -> dict[str, Any]:
    """The whole experiment: ``runs[arm][i]`` for seed ``seeds[i]``; the ``max_lag`` sweep of
    the pipeline arm (``sweep[str(max_lag)][i]``), the ``k`` sweep of conventional RL
    (``sweep_k[str(k)][i]``) and pipeline RL without the correction at ``no_is_lag``
    (``sweep["no_is_<lag>"]``), and the ``frozen`` arms' throughput with the policy frozen
    (``throughput[arm][i]``); each seed's runs back to back, in an order drawn from the seed."""
    arms = ARMS if arms is None else arms
    model, _, _ = warm_policy(warm_steps)
    init = flat_parameters(model)
    warm = rewards_of(model)
    base = base_config(n_updates)
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
    extra: dict[str, dict[str, Any]] = {str(lag): {"regime": "pipeline", "max_lag": lag} for lag in sweep_lags}
    if no_is_lag is not None:
        extra[f"no_is_{no_is_lag}"] = {"regime": "pipeline", "max_lag": no_is_lag, "correction": False}
    extra |= {f"k{k}": {"regime": "conventional", "steps_per_round": k, **ENGINES} for k in sweep_k}
    sweep: dict[str, list[dict[str, Any]]] = {name: [] for name in extra}
    loads = []
    t0 = time.perf_counter()
    throughput: dict[str, list[dict[str, Any]]] = {name: [] for name in frozen}
    for seed in seeds:
        by_arm, by_extra, by_frozen = run_seed(seed, init, arms, base, progress, extra, frozen)
        for store, results in ((runs, by_arm), (sweep, by_extra), (throughput, by_frozen)):
            for name, result in results.items():
                store[name].append(result)
        loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"))
    return {
        "meta": {
            "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "torch": torch.__version__,
            "command": " ".join(["python -m course_lib.pipeline.experiment", *sys.argv[1:]]),
            "seeds": list(seeds),
            "n_updates": n_updates,
            "warm_steps": warm_steps,
            "config": {k: v for k, v in asdict(base).items() if k not in ("lm", "task")},
            "arms": arms,
            "sweep": extra,
            "throughput_updates": THROUGHPUT_UPDATES,
            "loads": loads,
            "seconds": time.perf_counter() - t0,
        },
        "warm_reward": warm,
        "runs": runs,
        "sweep": sweep,
        "throughput": throughput,
    }


def run_throughput(
    seeds: Sequence[int],
    configs: dict[str, dict[str, Any]],
    progress: Callable[[str], None] | None = print,
    warm_steps: int = WARM_STEPS,
) -> dict[str, Any]:
    """Throughput alone, with the policy frozen (``lr = 0``, :data:`THROUGHPUT_UPDATES`
    updates, no snapshots): every configuration of ``configs`` for each seed, back to back in
    an order drawn from the seed. Returns ``{"meta": ..., "throughput": {name: [summary per seed]}}``."""
    model, _, _ = warm_policy(warm_steps)
    init = flat_parameters(model)
    base = replace(base_config(THROUGHPUT_UPDATES), lr=0.0, snapshot_every=0)
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    loads, t0 = [], time.perf_counter()
    for seed in seeds:
        names = list(configs)
        for position, i in enumerate(np.random.default_rng(seed).permutation(len(names))):
            kw = {k: v for k, v in configs[names[i]].items() if k != "snapshot_every"}
            with PipelineSystem(replace(base, seed=seed, **kw), init) as system:
                report = system.train()
            out[names[i]].append(summary(report) | {"position": position})
            if progress is not None:
                progress(f"seed {seed} frozen {names[i]}: {report.seconds:.1f} s")
        loads.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"))
    meta = {
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m course_lib.pipeline.experiment", *sys.argv[1:]]),
        "seeds": list(seeds),
        "updates": THROUGHPUT_UPDATES,
        "loads": loads,
        "seconds": time.perf_counter() - t0,
    }
    return {"meta": meta, "throughput": out}


def save(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))


def load(path: Path = RECORDED) -> dict[str, Any]:
    """A result written by :func:`save` (the command line), e.g. the committed :data:`RECORDED`."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist: run `python -m course_lib.pipeline.experiment --out {path}` to record it"
        )
    return dict(json.loads(path.read_text()))


def mean_se(x: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error over seeds."""
    a = np.asarray(x, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1) / np.sqrt(len(a))) if len(a) > 1 else float("nan")


def separated(differences: Sequence[float]) -> str:
    """The verdict on paired per-seed differences ``a - b``: ``"a > b"`` if mean - 2 s.e. > 0,
    ``"a < b"`` if mean + 2 s.e. < 0, else ``"not separated"``."""
    m, se = mean_se(differences)
    if m - 2 * se > 0:
        return "a > b"
    if m + 2 * se < 0:
        return "a < b"
    return "not separated"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 (default 5)")
    parser.add_argument("--updates", type=int, default=N_UPDATES, help=f"updates per run (default {N_UPDATES})")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sweeps (and their frozen-policy runs)")
    parser.add_argument("--out", type=Path, default=RECORDED, help=f"JSON to write (default {RECORDED})")
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="measure only the policy-frozen throughput of every arm and sweep configuration, and store it "
        "in the record at --out (which must exist) in place of its throughput runs",
    )
    args = parser.parse_args(argv)
    if args.throughput_only:
        record = load(args.out)
        frozen = run_throughput(range(args.seeds), {name: ARMS[name] for name in THROUGHPUT_ARMS} | THROUGHPUT_SWEEP)
        record["throughput"], record["meta"]["throughput_run"] = frozen["throughput"], frozen["meta"]
        save(record, args.out)
        print(f"updated the throughput runs of {args.out} ({frozen['meta']['seconds']:.0f} s)")
        return 0
    if args.seeds < 2:
        parser.error(f"--seeds must be >= 2 to estimate a spread over seeds, got {args.seeds}")
    configs = {name: ARMS[name] for name in THROUGHPUT_ARMS}
    if args.no_sweep:
        result = run_grid(range(args.seeds), n_updates=args.updates)
    else:
        result = run_grid(
            range(args.seeds),
            sweep_lags=SWEEP_LAGS,
            sweep_k=SWEEP_K,
            no_is_lag=SWEEP_NO_IS,
            n_updates=args.updates,
        )
        configs |= THROUGHPUT_SWEEP
    frozen = run_throughput(range(args.seeds), configs)  # then the throughput, with the policy frozen
    result["throughput"], result["meta"]["throughput_run"] = frozen["throughput"], frozen["meta"]
    save(result, args.out)
    print(f"wrote {args.out} ({result['meta']['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
