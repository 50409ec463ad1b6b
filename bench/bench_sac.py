"""SAC on the driving env, lesson 06: how fast the one-program loop runs on the CPU, and where its time goes.

1. **Throughput at a few ``num_envs``** (the cpu-scale `CPU_CONFIG`, then the same with more
   envs, `updates_per_step` unchanged): env steps/s and gradient updates/s of the jitted `run_chunk`
   after the warm-up (one seed; the state donated between chunks). Every run is compiled
   first; then `ROUNDS` interleaved rounds (each run timed for `CHUNKS` chunks in each
   round), the median and the range over rounds.
2. **Seeds: one after another, one thread each, or one vmapped program.** `SEEDS` seeds of
   the cpu config, in the same rounds: env steps/s of all seeds together; and the same
   vmapped-vs-single comparison with uniform replay.
3. **Time breakdown** (`course_lib.offpolicy.sac.time_breakdown`, cpu config): each part of a
   training step jitted and timed alone in a `lax.scan` (the difference of `2n` and `n`
   iterations, medians of `ROUNDS` runs), against the whole training step.

    python bench/run.py sac          # table into BENCHMARKS.md
    python bench/bench_sac.py        # table to stdout only
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result, render

from course_lib.offpolicy.sac import CPU_CONFIG, SACConfig, jitted_programs, time_breakdown

ROUNDS = 3
CHUNKS = 3
SEEDS = 3
NUM_ENVS = (CPU_CONFIG.num_envs, 32, 128)
UNIFORM = dataclasses.replace(CPU_CONFIG, prioritized=False)


class Runner:
    """Compiled training chunks past the warm-up for ``n_states`` runs; :meth:`timed` runs
    ``CHUNKS`` chunks of every run (``mode``: one after another, one thread per run, or one
    vmapped program for all) and returns the seconds."""

    def __init__(self, config: SACConfig, n_states: int, mode: str) -> None:
        import jax

        from course_lib.envs import driving

        self.config, self.mode = config, mode
        init, chunk = jitted_programs(config, driving, driving.DEFAULT_PARAMS, vmapped=mode == "vmap")
        keys = jax.random.split(jax.random.key(0), n_states)
        self.states = [init(keys)] if mode == "vmap" else [init(k) for k in keys]
        self.chunk = chunk
        self.pool = ThreadPoolExecutor(len(self.states))
        for _ in range(-(-config.warmup_steps // config.steps_per_chunk) + 1):
            self._chunks(1)

    def _run(self, state: Any, n: int) -> Any:
        import jax

        for _ in range(n):
            state, metrics = self.chunk(state)
        jax.block_until_ready(metrics)
        return state

    def _chunks(self, n: int) -> None:
        if self.mode == "threads":
            self.states = list(self.pool.map(lambda s: self._run(s, n), self.states))
        else:
            self.states = [self._run(s, n) for s in self.states]

    def timed(self) -> float:
        t0 = time.perf_counter()
        self._chunks(CHUNKS)
        return time.perf_counter() - t0


def measure() -> dict[str, Any]:
    out: dict[str, Any] = {"load_start": os.getloadavg()[0]}
    runs = {f"envs={n}": (dataclasses.replace(CPU_CONFIG, num_envs=n), 1, "sequential") for n in NUM_ENVS}
    for mode in ("sequential", "threads", "vmap"):
        runs[f"seeds-{mode}"] = (CPU_CONFIG, SEEDS, mode)
    runs["uniform-1"] = (UNIFORM, 1, "sequential")
    runs["uniform-vmap"] = (UNIFORM, SEEDS, "vmap")
    runners = {name: Runner(*spec) for name, spec in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runners}
    loads = []
    for i in range(ROUNDS):
        for name in list(runners) if i % 2 == 0 else list(reversed(runners)):
            times[name].append(runners[name].timed())
        loads.append(os.getloadavg()[0])
    for runner in runners.values():
        runner.pool.shutdown()
    for name, (config, n_states, _) in runs.items():
        rates = [n_states * config.num_envs * config.steps_per_chunk * CHUNKS / t for t in times[name]]
        out[name] = (statistics.median(rates), min(rates), max(rates))
    out["loads"] = loads
    out["breakdown"] = time_breakdown(CPU_CONFIG, repeats=ROUNDS)
    out["load_end"] = os.getloadavg()[0]
    return out


def _row(label: str, rates: tuple[float, float, float], config: SACConfig, n_states: int) -> list[str]:
    med, lo, hi = rates
    per_step_ms = 1e3 * n_states * config.num_envs / med
    return [
        label,
        f"{med:,.0f} ({lo:,.0f}-{hi:,.0f})",
        f"{med / config.num_envs * config.updates_per_step:,.0f}",
        f"{per_step_ms:.2f}",
    ]


def run() -> Result:
    m = measure()
    c = CPU_CONFIG
    rows = [_row(f"1 seed, {n} envs", m[f"envs={n}"], dataclasses.replace(c, num_envs=n), 1) for n in NUM_ENVS]
    for mode, label in (
        ("sequential", "one after another"),
        ("threads", "one thread each"),
        ("vmap", "one vmapped program"),
    ):
        rows.append(_row(f"{SEEDS} seeds, {label} (all seeds' steps)", m[f"seeds-{mode}"], c, SEEDS))
    rows.append(_row("uniform replay: 1 seed", m["uniform-1"], UNIFORM, 1))
    rows.append(_row(f"uniform replay: {SEEDS} seeds, one vmapped program", m["uniform-vmap"], UNIFORM, SEEDS))
    b = m["breakdown"]
    parts = ", ".join(
        f"{name.replace('_', ' ')} {1e6 * b[name]:.0f} us"
        for name in ("env_step", "act", "replay_add", "replay_sample", "update")
    )
    scaled = {
        n: b[n] * (c.updates_per_step if n in ("replay_sample", "update") else 1)
        for n in ("env_step", "replay_sample", "update")
    }
    share = {n: v / b["parts_sum"] for n, v in scaled.items()}
    vmap_vs_seq = m["seeds-vmap"][0] / m["seeds-sequential"][0]
    threads_vs_seq = m["seeds-threads"][0] / m["seeds-sequential"][0]
    uniform_vmap = m["uniform-vmap"][0] / m["uniform-1"][0]  # seeds one after another run at one seed's rate
    return Result(
        title="Lesson 06: SAC on the driving env, one jitted program per chunk (env steps/s and gradient updates/s)",
        columns=["run", "env steps/s (range)", "updates/s", "ms per vectorised step (all seeds)"],
        rows=rows,
        notes=[
            f"cpu config (`sac.CPU_CONFIG`): {c.num_envs} envs, {c.updates_per_step} update(s) per vectorised step (UTD {c.utd:g}), batch {c.batch_size}, width "
            f"{c.width} x depth {c.depth}, buffer {c.buffer_capacity:,}, {'prioritized' if c.prioritized else 'uniform'} "
            "replay; a vectorised step is one step of every env, its transitions stored and updates_per_step gradient updates. "
            f"Timed after the warm-up: {CHUNKS} chunks of {c.steps_per_chunk} steps per measurement, {ROUNDS} "
            "interleaved rounds (median, range); more envs per step at the same updates_per_step: more env steps/s, fewer updates/s.",
            f"Seeds: {SEEDS} seeds as one vmapped program ran at {vmap_vs_seq:.2f}x the rate of the same seeds one "
            f"after another, as {SEEDS} threads at {threads_vs_seq:.2f}x (2 cores); with uniform replay the vmapped "
            f"program ran at {uniform_vmap:.2f}x seeds one after another. Vmapping gains little where each update's "
            "small products already keep a core busy, and loses with prioritized replay, whose sum-tree scatters "
            "batch badly; threads use the second core, so `sac.train` runs seeds as threads on a CPU.",
            f"Time breakdown of one training step at the cpu config (`sac.time_breakdown`: each part alone, jitted, "
            f"in a scan of {c.steps_per_chunk}; medians of {ROUNDS}): {parts}; the whole training step "
            f"{1e6 * b['train_step']:.0f} us, the parts add up to {1e6 * b['parts_sum']:.0f} us. Shares of the parts: "
            f"gradient update {share['update']:.0%}, replay sampling {share['replay_sample']:.0%}, env stepping "
            f"{share['env_step']:.0%}.",
            f"Load average (1 min): {m['load_start']:.1f} at the start, {', '.join(f'{x:.1f}' for x in m['loads'])} after "
            f"each round, {m['load_end']:.1f} at the end. The machine is shared: absolute rates vary with the load; the "
            "runs are compared within the same rounds.",
        ],
    )


if __name__ == "__main__":
    print(render("sac", run()))
