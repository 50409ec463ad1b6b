# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Laying out the cluster: throughput, split and staleness on paper
#
# A real RL run has $N$ GPUs and one question first: **how many generate, how many train,
# and in which layout** (synchronous, one-step off-policy, or a pipeline with in-flight
# updates), for the most tokens per second while **no sample** is staler than learning
# tolerates? (Applied Compute's talk "Efficient RL" frames it so.) This lesson answers it on
# paper, then tests the model: against lesson 07's processes measured here, a simulator,
# and what verl and PipelineRL published.
#
# **Learning goals**
# 1. Derive what bounds a sampler GPU and a trainer GPU from a model's shape and a GPU's
#    datasheet.
# 2. State the two invariants, production = consumption and **every sample's** lag within
#    the bound, and find the best split that keeps both.
# 3. Tell what an admission rule bounds (what *starts*) from what the trainer does with a
#    straggler (take it late, wait for it, drop it), and what each costs.
# 4. Validate the model: calibrate it on a baseline's measured stage times, predict the
#    other system, and name what it lacks where it misses.
# 5. Size a run with a calculator that prints a range, not a point, with its sensitivity.
#
# Builds on lessons 07 (the regimes, per-token lag) and 02 (why staleness costs).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, pick, progress, show_source

print(f"course_lib {course_lib.__version__} | scale: {current_scale()} | {os.cpu_count()} CPU cores")

# %% [markdown]
# ## Key equations
#
# **One sampler GPU** (a *paged* KV cache, as vLLM and SGLang). A sequence of $L$ answer
# tokens after $P$ prompt tokens holds $P + j$ tokens of KV at its $j$-th step, $R$ on
# average. With $M$ memory, a usable fraction $f$ and $W$ bytes of weights, the sequences
# that fit are
#
# $$\text{kv} = 2\, n_{layers}\, n_{kv}\, d_{head}\, \text{bytes}_{kv} \qquad (08.1)$$
#
# $$R = P + \frac{E[L^2] - E[L]}{2 E[L]}, \qquad B_{max} = \Big\lfloor \frac{f M - W}{\text{kv} \cdot R} \Big\rfloor \qquad (08.2)$$
#
# A decode step reads the weights and the resident cache ($R_t$ tokens) and computes
# $2 n_{params}$ FLOPs per token processed ($B$ answer tokens, the prompts of $S_t$
# starters): the longer of the two times, at an efficiency $\eta$ of peak bandwidth $\beta$
# and FLOP/s $F$:
#
# $$l = \max\big(a_s + b_s B + r_s R_t,\ \ f_s (B + P S_t)\big), \quad a_s = \frac{W}{\eta\beta},\ r_s = \frac{\text{kv}}{\eta\beta},\ f_s = \frac{2 n_{params}}{\eta F} \qquad (08.3)$$
#
# ($b_s$: a per-sequence cost, fitted for a measured engine.) A full engine makes
# $p = B_{max} / l(B_{max})$ answer tokens/s (08.4).
#
# **One trainer GPU.** $6 n_{params}$ FLOPs per token, $2 n_{params}$ per extra forward pass
# ($k$: recomputed log-probs, a reference model), at an MFU $u$; Adam keeps 16 bytes per
# parameter, sharded over $N_t$ trainers:
#
# $$c = \frac{u F\, E[L]}{(6 + 2k)\, n_{params}\, (P + E[L])} \qquad (08.5) \qquad\qquad \frac{16\, n_{params}}{N_t} \le f M \qquad (08.5b)$$
#
# **The balance.** $N_s$ samplers produce $N_s p$, $N - N_s$ trainers consume $N_t c$; the
# split that wastes neither is
#
# $$N_s^* = \frac{N c}{p + c} \qquad (08.6)$$
#
# **The straggler.** A synchronous layout waits for the batch's last answer; (08.3) summed
# over each engine's continuous-batching schedule:
#
# $$T_{gen} = \max_e \sum_t l(B_{e,t}, R_{e,t}, S_{e,t}) \qquad (08.7)$$
#
# **The layouts** ($G$ answer tokens per batch, $K$ independently drawn batches per weight
# version, $T_{train} = K G / (N_t c)$, $d$ the weight sync), tokens/s $= K G / t$:
#
# $$\text{sync\_colocated: } t = T_{gen}(N) + \tfrac{K G}{N c} + d \quad (08.8) \qquad \text{sync\_split: } t = T_{gen}(N_s) + T_{train} + d \quad (08.9)$$
#
# $$\text{one\_step: } t = \max\big(T_{gen}(N_s),\ T_{train} + d\big) \qquad (08.10)$$
#
# **The pipeline** (in-flight weight updates). AReaL's admission rule with bound $k_{max}$
# (`max_lag`): a sample may start only while fewer than $(k_{max} + 1) B_{batch}$ are
# *held* (started, not yet consumed by an update whose weights reached the samplers). The
# queue, the batch in training and the one in transit take their share of the window:
#
# $$I = (k_{max} + 1) B_{batch} - B_{batch}\Big(\tfrac12 + \tfrac{T_{train} + d}{t_{step}}\Big),\quad B_{eff} = \min\Big(B_{max}, \frac{I}{N_s}\Big),\quad \text{tokens/s} = \min\Big(\frac{N_s B_{eff}}{l(B_{eff})}, C\Big) \qquad (08.11)$$
#
# a fixed point ($t_{step}$ depends on tokens/s); $C = N_t c$, or $G / (G / (N_t c) + d)$
# when sending the weights stops the trainers. The mean lag is Little's law on what the
# window holds (in flight and queued); the longest answer runs $(L_{max} - E[L])\, l(B_{eff})$
# seconds behind the mean one:
#
# $$\overline{\text{lag}} = \min\Big(k_{max},\ \frac{\text{held} - B_{batch}/2}{B_{batch}} + \frac{d}{t_{step}}\Big) \qquad (08.12) \qquad\qquad \text{lag}_{max} = \Big\lceil \overline{\text{lag}} + \frac{(L_{max} - E[L])\, l(B_{eff})}{t_{step}} \Big\rceil \qquad (08.13)$$
#
# A sample's lag counts from its *first* token; with in-flight updates a token decoded a
# fraction $x$ through an answer is about $x L\, l / t_{step}$ steps fresher (`calc.token_lag`).
#
# **What keeps the maximum within the bound.** The admission rule bounds what *starts*;
# what the trainer does with a straggler decides the rest:
#
# - **FIFO**: finished samples are consumed in order; a straggler is taken late, with the
#   lag (08.13), past the bound when answers have a long tail.
# - **wait**: the trainer waits for a straggler at its deadline: started at version $s$,
#   it must be done before update $s + k_{max}$, so
#
# $$t_{step} \ge \frac{L_{max}\, l(B_w) + d}{\lfloor k_{max} \rfloor} \qquad (08.14)$$
#
#   where $B_w$ is the lighter batch at which the engines make only what is consumed.
# - **drop**: answers longer than $L_{cut} = (\lfloor k_{max}\rfloor t_{step} - d) / l(B_{eff})$
#   are aborted, their tokens wasted, and the trainer gets the kept ones:
#
# $$\text{useful tokens/s} = \min\Big(\text{production} \cdot \frac{E[L;\ L \le L_{cut}]}{E[\min(L, L_{cut})]},\ C\Big) \qquad (08.15)$$
#
#   This biases training to short answers, unpriced: a split dropping over 2% is infeasible.
#
# **The two invariants.** (1) Production = consumption: throughput is the lower of the
# two, highest where they cross (08.6). (2) Every sample's lag within the bound, a
# constraint on the **maximum**: a split past `max_lag`, or whose trainers cannot hold the
# model (08.5b), is infeasible.
#
# **Pseudocode** (`layout.model.best_split`, `layout.calc.near_optimal_splits`)
# ```
# for each layout in (sync_colocated, sync_split, one_step, pipeline):
#     for N_s in 1 .. N-1:                                  # sync_colocated: no split
#         tokens/s from (08.8)-(08.11) under the rule (08.14)/(08.15); max lag (08.13)
#         feasible if N - N_s >= N_t_min (08.5b) and max lag <= max_lag
#     near-optimal[layout] = feasible N_s within 5% of the fastest, else why none is feasible
# ```
#
# | equation | function in `course_lib.layout` |
# |---|---|
# | (08.1)-(08.2) | `model.kv_bytes_per_token`, `model.resident_tokens`, `model.max_batch` |
# | (08.3)-(08.5b) | `model.step_costs`, `SystemSpec.latency_s`, `model.train_tokens_per_s_per_gpu`, `model.min_trainers` |
# | (08.6), (08.7) | `model.balanced_samplers`, `model.generation_time_s` |
# | (08.8)-(08.15) | `model.predict`, `model.sweep`, `model.best_split` |
# | per-token lag | `calc.token_lag` |
# | the same system, event by event | `sim.simulate`, `sim.gantt` |
# | lesson 07 as a 2-GPU cluster | `calibrate.measure_round`, `calibrate.compare_regimes` |
# | published systems | `published.CASES`, `published.calibrated_table`, `published.held_out_checks` |
# | the calculator | `calc.recommend`, `calc.near_optimal_splits`, `calc.sensitivity`, `calc.compare_admissions` |
#
# The core of (08.7): $B_t$, $R_t$ and $S_t$ of one engine's schedule by difference arrays:

# %%
from course_lib.layout.model import _step_clock_s

show_source(_step_clock_s)

# %% [markdown]
# ## 1. What one GPU can do: Qwen2.5-7B and 32B on an H100 and an H20
#
# Shapes from the models' `config.json`, GPUs from NVIDIA's datasheets: the H100 SXM has
# 80 GB at 3.35 TB/s and 989 dense bf16 TFLOP/s; the H20 (verl's runs) 96 GB at 4.0 TB/s
# but 148 TFLOP/s. Assumptions used throughout: answers log-normal, mean 2,000 tokens,
# 99th percentile 8x the median, capped at 16,384; 1,024 prompt tokens; decode at 70% of
# peak; training at 40% MFU (Llama 3 reports 38-43% on H100s); 90% of memory usable.
# %%
from course_lib.layout.model import (
    H20,
    H100_SXM,
    QWEN25_7B,
    QWEN25_32B,
    kv_bytes_per_token,
    lognormal_lengths,
    max_batch,
    min_trainers,
    spec_from_hardware,
)

LIMIT, PROMPT = 16384, 1024
lengths = lognormal_lengths(2000, 8.0, seed=0, max_tokens=LIMIT)
batch256 = lengths.batch(256, seed=0)
planned = spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=2, batch_samples=256, answer_tokens=batch256,
                             prompt_tokens=PROMPT, generation_limit=LIMIT)
print(f"answers: mean {lengths.mean_tokens:,.0f} tokens, median {lengths.quantile_tokens(0.5):,.0f}, 99th percentile "
      f"{lengths.quantile_tokens(0.99):,.0f}, capped at {LIMIT:,}; the planned batch of 256 (its longest answer at the "
      f"cap) holds R = {planned.resident_tokens:,.0f} tokens per paged sequence on average, a reserving one "
      f"{PROMPT + LIMIT:,}")
print(f"\n{'model':<12} {'GPU':<9} {'KV KB/tok':>9} {'B_max paged':>11} {'reserve':>8} {'l(B_max) ms':>11} "
      f"{'bound by':>9} {'p tok/s':>8} {'c tok/s':>8} {'N_t min':>8}")
one_gpu = {}
for shape in (QWEN25_7B, QWEN25_32B):
    for gpu in (H100_SXM, H20):
        try:
            spec = spec_from_hardware(shape, gpu, n_gpus=2, batch_samples=256, answer_tokens=batch256,
                                      prompt_tokens=PROMPT, generation_limit=LIMIT)
            reserve = max_batch(shape, gpu, PROMPT + LIMIT)
        except ValueError as exc:
            print(f"{shape.name:<12} {gpu.name:<9} {kv_bytes_per_token(shape) / 1e3:>9.1f}  {str(exc).split(':')[0]}")
            continue
        b = spec.max_batch
        memory = spec.a_s + spec.r_s * b * spec.resident_tokens
        compute = spec.f_s * b * (1 + PROMPT / spec.mean_answer_tokens)
        one_gpu[(shape.name, gpu.name)] = (spec, reserve, memory, compute)
        print(f"{shape.name:<12} {gpu.name:<9} {kv_bytes_per_token(shape) / 1e3:>9.1f} {b:>11} {reserve:>8} "
              f"{1e3 * spec.latency_s(b):>11.1f} {'memory' if memory >= compute else 'compute':>9} "
              f"{spec.engine_full_tokens_per_s:>8,.0f} {spec.train_tokens_per_s_per_gpu:>8,.0f} "
              f"{min_trainers(shape, gpu):>8}")

# %%
s7h, r7h, m7h, c7h = one_gpu[("Qwen2.5-7B", "H100 SXM")]
s7z, r7z, m7z, c7z = one_gpu[("Qwen2.5-7B", "H20")]
assert s7h.max_batch > 3 * r7h and m7h > c7h and c7z > m7z
assert s7z.train_tokens_per_s_per_gpu < s7h.train_tokens_per_s_per_gpu / 5
assert ("Qwen2.5-32B", "H100 SXM") not in one_gpu or one_gpu[("Qwen2.5-32B", "H100 SXM")][0].max_batch < 16
print("asserted: a paged cache holds more than 3x the sequences of a reserving one; at B_max the 7B step is "
      "memory-bound on an H100 and compute-bound on an H20; an H20 trains at less than a fifth of an H100's rate")

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 3.6), sharey=False)
for ax, (spec, name) in zip(axes, ((s7h, "H100 SXM"), (s7z, "H20"))):
    bs = np.arange(1, spec.max_batch + 1)
    mem = 1e3 * (spec.a_s + spec.r_s * bs * spec.resident_tokens)
    comp = 1e3 * spec.f_s * bs * (1 + PROMPT / spec.mean_answer_tokens)
    ax.plot(bs, mem, label="memory time: weights + resident KV")
    ax.plot(bs, comp, label="compute time: 2 n_params per token")
    ax.plot(bs, np.maximum(mem, comp), "k", lw=2, alpha=0.4, label="the step l(B) (08.3)")
    ax.set_xlabel("sequences in flight B")
    ax.set_ylabel("decode step (ms)")
    ax.set_title(f"Qwen2.5-7B on one {name}: B_max = {spec.max_batch} (paged)")
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()


# %% [markdown]
# **Takeaway:** on an H100 the 7B step is memory-bound up to a full cache: a bigger batch
# amortises the weight read, so tokens/s climbs until memory runs out. The H20, with 6.7x
# less compute, turns compute-bound at a few dozen sequences, and trains five times slower.
# Reserving the whole context per sequence would cut the batch by 3x. The 32B model's
# weights leave room for few sequences on one GPU and its Adam state needs 8 trainer GPUs:
# it runs on tensor-parallel groups (section 5).

# %% [markdown]
# ## 2. The first test: lesson 07's cluster, measured
#
# Lesson 07's generator (one core) and trainer (another) are, for the model, a cluster of
# **2 GPUs: 1 sampler, 1 trainer**. Its inputs, measured here (`course_lib.layout.calibrate`):
# $a_s$ is the slot sampler's bare step at 32 slots, $b_s$ what the generator loop adds per
# live slot, the lengths are 1,024 answers of the warm-started policy, and $c$ is each
# run's own trainer rate (its busy intervals); $d = 0$ (publishing is inside the update).
# The runs use `lr = 0`: the trainer does all its work but the policy, hence the lengths,
# stay still, so the model's inputs hold for the whole run.

# %%
from dataclasses import replace

import torch

from course_lib.layout.calibrate import sample_answer_tokens, sequence_steps, time_decode_steps
from course_lib.layout.model import LengthDist, fit_decode_latency
from course_lib.lm import TinyLM
from course_lib.lm.task import CountdownTask, warm_start
from course_lib.pipeline.system import LM
from course_lib.runtime.weights import flat_parameters

task = CountdownTask()
torch.manual_seed(0)
model = TinyLM(LM)
warm_steps = pick(cpu=30, full=60)
warm_start(model, task, steps=warm_steps - 10)
warm_start(model, task, steps=10, seed=1)
init_flat = flat_parameters(model)
answers = sample_answer_tokens(model, task, 1024, seed=7)
lengths07 = LengthDist.from_samples(sequence_steps(answers))
SLOTS = [8, 16, 32, 48, 64]
step_s = time_decode_steps(model, task, SLOTS, n_steps=40)
a07, b07 = fit_decode_latency(SLOTS, step_s)
assert np.percentile(answers, 99) > 3 * answers.mean() and a07 > 32 * b07 > 0, (a07, b07)
print("answers have a long tail (99th percentile > 3x the mean); the sampler's step has a fixed part larger than "
      "what 32 slots add (a_s > 32 b_s), like a GPU's weight read")

# %% [markdown]
# Three rounds; each times the generator's parts, then runs `sync`, `one_step` and
# `pipeline` (`max_lag` 8) back to back, 50 updates each, so calibration and runs share
# the machine's load. The first 10 updates (the queue filling) are left out.

# %%
from course_lib.layout.calc import token_lag
from course_lib.layout.calibrate import REGIMES, compare_regimes, lesson07_spec, measure_round
from course_lib.layout.model import predict
from course_lib.pipeline.system import PipelineConfig
from course_lib.runtime.processes import live_children

base07 = PipelineConfig(n_updates=pick(cpu=50, full=200), max_lag=8, lr=0.0)
SKIP, ROUNDS = 10, 3
rates_by_round, reports_by_round = [], []
for i in range(ROUNDS):
    with progress(len(REGIMES) * base07.n_updates, f"round {i}: {', '.join(REGIMES)}", unit="update") as bar:
        rates, reports = measure_round(model, task, base07, init_flat, seed=i, skip=SKIP,
                                       on_update=lambda u, m: bar.update())
    rates_by_round.append(rates)
    reports_by_round.append(reports)
cmp = compare_regimes(base07, rates_by_round, reports_by_round, answers, SKIP)
pipe_spec07 = lesson07_spec(base07, rates_by_round[0].for_regime("pipeline"), lengths07.batch(base07.batch_sequences))
lag07 = {}  # the model's pipeline lag, per sample and per token, with the trainer 10% slower, as measured, 10% faster
for scale in (0.9, 1.0, 1.1):
    spec_c = replace(pipe_spec07, train_tokens_per_s_per_gpu=scale * pipe_spec07.train_tokens_per_s_per_gpu)
    lag07[scale] = token_lag(predict("pipeline", spec_c), spec_c)

# %%
# NBVAL_IGNORE_OUTPUT
print(f"load average (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
print(f"{'regime':<9} {'measured tok/s':>14} {'model':>7} {'model error, round by round':>28} | {'lag: runs (per token)':>21}")
for regime, row in cmp.items():
    errs = ", ".join(f"{100 * e:+.0f}%" for e in row.model_errors)
    print(f"{regime:<9} {row.measured_tokens_per_s:>14,.0f} {row.model_tokens_per_s:>7,.0f} {errs:>28} | "
          f"{row.measured_lag:>21.1f}")
print("pipeline's mean lag in the model (round 0), per sample / per token, with its trainer's c x 0.9, 1.0, 1.1: "
      + ", ".join(f"{t.sample_mean:.1f} / {t.token_mean:.1f}" for t in lag07.values()))

# %%
measured = {regime: cmp[regime].measured_tokens_per_s for regime in REGIMES}
assert not live_children()
assert all(reports["sync"].token_lags.max() == 0 for reports in reports_by_round)
assert cmp["sync"].model_lag == 0.0 and cmp["one_step"].model_lag == 1.0
assert abs(cmp["one_step"].measured_lag - 1.0) < 0.05, cmp["one_step"].measured_lag
assert cmp["sync"].model_tokens_per_s < cmp["one_step"].model_tokens_per_s < cmp["pipeline"].model_tokens_per_s
assert measured["sync"] < measured["pipeline"] and measured["one_step"] < measured["pipeline"], measured
assert all(r["pipeline"].token_lags.max() <= base07.max_lag for r in reports_by_round)
assert lag07[1.1].sample_mean <= lag07[1.0].sample_mean <= lag07[0.9].sample_mean <= base07.max_lag
print("asserted: the lags of sync (0) and one_step (1) are what the model says; model and runs rank the regimes "
      "alike (the pipeline fastest); no run's token lag passed the bound; in the model a faster trainer never "
      "raises the lag")

# %% [markdown]
# **What it shows.** The synchronous lags are exact by construction. The pipeline is
# trainer-bound, so calibrated on its own trainer it is a consistency check: the model
# counts that trainer busy all the time and errs high by the share it waited on the pipe.
# `sync` and `one_step` are the real test: their generation phase (08.7) comes from the
# separately timed sampler step, with hand-offs (a batch through the pipe, waking a
# process) the model leaves out. The errors are printed round by round, as they are, on
# shared cores. The pipeline's **lag** the model cannot forecast here: this cluster sits
# at the balance, where 10% on the trainer's rate moves the model's mean lag between about
# 1.5 and the bound (printed): the queue either stays short or fills the window. The runs,
# per token, land in between. Near the balance (08.12) brackets the lag; it does not
# predict it.
#
# **On a GPU.** Lesson 11's capstone ran on one H200 with its layout from this model,
# calibrated on that GPU (BENCHMARKS, 2026-11-27). The asynchronous runs came within 20%:
# 2,125 tokens/s predicted, 1,944 measured, and 20% and 6% low at the full sizes. The
# synchronous run missed by 2x (1,971 predicted, 1,003 measured): its three trainers'
# all-reduce went through host memory (gloo), about 90 ms per update, a cost the model
# does not count.

# %% [markdown]
# ## 3. Model and simulator at full scale: the admission rules
#
# From here on: Qwen2.5-7B on the H100s of section 1. The simulator (`layout.sim`, SimPy)
# plays the same system event by event. First the model's home ground: lengths with a mild
# tail (99th percentile 2x the median), 16 GPUs, `max_lag` 4, FIFO, each layout at its
# fastest split (24 simulated steps, the first 8 not measured):

# %%
from course_lib.layout.calibrate import relative_error
from course_lib.layout.model import SystemSpec, best_split, sweep
from course_lib.layout.sim import sim_config, simulate


def fastest(layout: str, spec: SystemSpec):
    """The layout at its highest-throughput split, whatever its lag (sync_colocated has no split)."""
    if layout == "sync_colocated":
        return predict(layout, spec)
    sw = sweep(layout, spec)
    return predict(layout, replace(spec, n_samplers=int(sw.n_samplers[np.argmax(sw.tokens_per_s)])))


mild = lognormal_lengths(1000, 2.0, seed=0, max_tokens=4096)
spec16 = spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=16, batch_samples=256, answer_tokens=mild.batch(256, seed=0),
                            prompt_tokens=PROMPT, weight_sync_s=QWEN25_7B.weight_bytes / 125e9, max_lag=4)
agree = {}
print(f"{'layout':<15} {'samplers':>8} {'model tok/s':>12} {'sim tok/s':>10} {'diff':>6} {'model lag mean/max':>19} "
      f"{'sim lag mean/max':>17}")
for layout in ("sync_colocated", "sync_split", "one_step", "pipeline"):
    p = fastest(layout, spec16)
    s = simulate(sim_config(replace(spec16, n_samplers=None if layout == "sync_colocated" else p.n_samplers), layout,
                            n_steps=24, warmup_steps=8, lengths=mild.tokens, seed=1))
    agree[layout] = relative_error(s.tokens_per_s, p.tokens_per_s)
    shown = 0.0 if abs(agree[layout]) < 5e-4 else agree[layout]  # no sign on a difference that rounds to 0
    print(f"{layout:<15} {p.n_samplers:>8} {p.tokens_per_s:>12,.0f} {s.tokens_per_s:>10,.0f} "
          f"{100 * shown:>+5.1f}% {p.mean_lag_steps:>12.2f} / {p.max_lag_steps:<4} {s.lag_mean:>11.2f} / {s.lag_max:<4}")

# %%
assert all(abs(agree[k]) < 0.025 for k in ("sync_colocated", "sync_split", "pipeline")), agree
assert 0 <= agree["one_step"] < 0.06, agree
pipe16 = fastest("pipeline", spec16)
assert pipe16.max_lag_steps > spec16.max_lag
print(f"asserted: with a mild tail the model is within 2.5% of the simulator for sync_colocated, sync_split and "
      f"pipeline, and one_step's simulator is faster by under 6%; but the pipeline's maximum lag, "
      f"{pipe16.max_lag_steps}, is past its bound of {spec16.max_lag:g}")

# %% [markdown]
# The simulator's `one_step` is faster by design: its engines start the next batch in the
# slots that short answers free, while (08.10) waits for the whole batch. And even a mild
# tail puts the longest answers of a full window past the bound.
#
# ### The straggler
#
# The talk's example: 99% of the samples done in about 40 s, the last 1% needing about 80 s
# more. Here: 8 GPUs (4 samplers, 4 trainers), batches of 400, the body's lengths spread
# from 200 to 3,000 tokens, and 1% of answers made long enough to keep an engine busy 80 s
# after its body is done (that 80 s is built into the lengths). One engine's schedule (08.7):

# %%
from course_lib.layout.model import body_tail_lengths, deal_to_engines, engine_finish_times_s, tail_tokens_for_extra_s


def straggler_spec(lengths_dist, **kw):
    return spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=8, n_samplers=4, batch_samples=400, prompt_tokens=PROMPT,
                              answer_tokens=lengths_dist.batch(400, seed=0), **kw)


BODY_MAX = 3000
draft = straggler_spec(body_tail_lengths(400, 200, BODY_MAX, BODY_MAX, tail_fraction=0.01))
tail = tail_tokens_for_extra_s(80.0, BODY_MAX, 1, draft.latency_s(1), 0.0)
straggly = body_tail_lengths(400, 200, BODY_MAX, tail, tail_fraction=0.01)
spec8 = straggler_spec(straggly, max_lag=2)
share = deal_to_engines(spec8.lengths_tokens, 4)[0]
finish = np.sort(engine_finish_times_s(share, spec8.max_batch, spec8.a_s, spec8.b_s, r_s=spec8.r_s, f_s=spec8.f_s,
                                       prompt_tokens=PROMPT))
body_done = finish[int(0.99 * len(share)) - 1]
print(f"lengths: body 200..{BODY_MAX} tokens, tail {tail:,} tokens (1%); engine 0: {len(share)} answers, 99% done at "
      f"{body_done:.0f} s, the last at {finish[-1]:.0f} s")
assert body_done < 40

fig, ax = plt.subplots(figsize=(7.5, 3.2))
ax.step(finish, np.arange(1, len(finish) + 1) / len(finish), where="post", color="tab:blue")
ax.axvline(body_done, color="tab:gray", ls=":", label="99% of the answers done")
ax.set_xlabel("time since the batch started (s)")
ax.set_ylabel("fraction of engine 0's answers done")
ax.set_title("One engine's batch with a 1% tail: the last answer alone takes the rest")
ax.legend(loc="lower right")
plt.show()

# %% [markdown]
# The last answer runs alone, paying the full weight read ($a_s$) for one token per step.
#
# ### Three ways to treat a straggler, with `max_lag` = 2
#
# The synchronous layouts pay for the straggler in every step (08.7); the pipeline hides
# it, and the rule decides its lag. Model against simulator:

# %%
# NBVAL_IGNORE_OUTPUT
rules = {}
with progress(5, "straggler: 5 simulations", unit="run") as bar:
    for layout, admission in (("sync_split", "fifo"), ("one_step", "fifo"), ("pipeline", "fifo"),
                              ("pipeline", "wait"), ("pipeline", "drop")):
        spec_r = replace(spec8, admission=admission)
        p = predict(layout, spec_r)
        s = simulate(sim_config(spec_r, layout, n_steps=30, warmup_steps=8, lengths=straggly.tokens, seed=0))
        rules[(layout, admission)] = (p, s)
        bar.update()
print(f"{'layout':<10} {'rule':<5} {'model tok/s':>11} {'sim tok/s':>10} {'model lag mean/max':>19} "
      f"{'sim lag mean/max':>17} {'dropped model/sim':>18}")
for (layout, admission), (p, s) in rules.items():
    rule = admission if layout == "pipeline" else "-"
    sim_drop = s.n_dropped / max(1, s.n_started)
    print(f"{layout:<10} {rule:<5} {p.tokens_per_s:>11,.0f} {s.tokens_per_s:>10,.0f} {p.mean_lag_steps:>12.2f} / "
          f"{p.max_lag_steps:<4} {s.lag_mean:>11.2f} / {s.lag_max:<4} {100 * p.dropped_fraction:>8.1f}% / "
          f"{100 * sim_drop:>4.1f}%")

# %%
(ps, ss), (pf, sf) = rules[("sync_split", "fifo")], rules[("pipeline", "fifo")]
(pw, sw_), (pd, sd) = rules[("pipeline", "wait")], rules[("pipeline", "drop")]
bound = spec8.max_lag
assert abs(relative_error(ss.tokens_per_s, ps.tokens_per_s)) < 0.05
assert pf.max_lag_steps > bound and sf.lag_max > bound  # FIFO: the stragglers run past the bound
assert pw.max_lag_steps <= bound and sw_.lag_max <= bound and pd.max_lag_steps <= bound and sd.lag_max <= bound
assert pw.tokens_per_s < pf.tokens_per_s and sw_.tokens_per_s < sf.tokens_per_s  # waiting costs
assert abs(relative_error(sf.tokens_per_s, pf.tokens_per_s)) < 0.10
assert abs(relative_error(sw_.tokens_per_s, pw.tokens_per_s)) < 0.25
assert sd.n_dropped > 0 and pd.dropped_fraction > 0
assert min(pw.tokens_per_s, sw_.tokens_per_s) > 1.5 * max(ps.tokens_per_s, ss.tokens_per_s)
print("asserted: sync_split, model = simulator within 5%; FIFO lets the stragglers' lag pass the bound in both; "
      "waiting and dropping keep it in both; waiting costs tokens/s against FIFO "
      "(model within 25% of the simulator); even the waiting pipeline is over 1.5x the synchronous split")

# %% [markdown]
# **Takeaway:** under FIFO the pipeline's throughput holds but the stragglers arrive past
# the bound. The hard rules keep every lag within it, at a price: **waiting** lets the
# straggler set the trainer's pace (08.14), **dropping** wastes what it aborts and trains
# on shorter answers (08.15). The FIFO and drop rows are trainer-bound, so they agree by
# construction; the waiting row is the test of (08.14). `one_step`'s simulator is again
# faster, for the reason above. The model's two hard rules, the code behind the
# calculator's default (the rest of `_pipeline`, with the maximum-lag rule, is exercise 3):

# %%
from course_lib.layout.model import _drop_rule, _wait_rule

show_source(_wait_rule)
show_source(_drop_rule)

# %% [markdown]
# **The best split under each rule.** A bigger cluster (24 GPUs, batches of 1,024, the same
# lengths): throughput at every split, infeasible splits hollow.

# %%
from course_lib.layout.model import ADMISSIONS, balanced_samplers

spec24 = spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=24, batch_samples=1024, prompt_tokens=PROMPT,
                            answer_tokens=straggly.batch(1024, seed=0), max_lag=2)
fig, ax = plt.subplots(figsize=(7.5, 3.8))
best_by_rule = {}
for admission, colour in zip(ADMISSIONS, ("tab:red", "tab:blue", "tab:green")):
    sw = sweep("pipeline", replace(spec24, admission=admission))
    ok = sw.feasible
    ax.plot(sw.n_samplers[ok], sw.tokens_per_s[ok] / 1e3, "o", color=colour, label=f"{admission}: feasible")
    ax.plot(sw.n_samplers[~ok], sw.tokens_per_s[~ok] / 1e3, "o", mfc="none", color=colour,
            label=f"{admission}: infeasible")
    try:
        best_by_rule[admission] = best_split("pipeline", replace(spec24, admission=admission)).prediction
    except ValueError as exc:
        best_by_rule[admission] = str(exc)
n_bal = balanced_samplers(24, spec24.engine_full_tokens_per_s, spec24.train_tokens_per_s_per_gpu)
ax.axvline(n_bal, color="k", ls=":", lw=1, label=f"balance (08.6): {n_bal:.1f}")
ax.set_xlabel("sampler GPUs N_s (of 24)")
ax.set_ylabel("generated tokens/s (thousands)")
ax.set_title("Pipeline, max_lag 2, 1% stragglers: throughput against the split, by rule")
ax.legend(fontsize=8, ncol=3)
plt.show()
for admission, b in best_by_rule.items():
    if isinstance(b, str):
        print(f"{admission:<5}: {b}")
    else:
        print(f"{admission:<5}: best split {b.n_samplers} samplers / {b.n_trainers} trainers, {b.tokens_per_s:,.0f} "
              f"tokens/s, max lag {b.max_lag_steps}, dropped {100 * b.dropped_fraction:.1f}%")

# %%
assert isinstance(best_by_rule["fifo"], str) and "max lag" in best_by_rule["fifo"]
for admission in ("wait", "drop"):
    b = best_by_rule[admission]
    assert not isinstance(b, str) and b.feasible and b.max_lag_steps <= spec24.max_lag
assert best_by_rule["wait"].n_samplers > best_by_rule["drop"].n_samplers
assert best_by_rule["wait"].tokens_per_s < best_by_rule["drop"].tokens_per_s
print("asserted: no FIFO split keeps every lag within 2 (the error names the constraint); waiting and dropping "
      "do; waiting puts more GPUs on sampling than dropping, and makes fewer tokens/s")

# %% [markdown]
# **Takeaway:** a calculator that checked only the mean lag would have recommended a FIFO
# split anyway. A waiting trainer idles while a straggler finishes, and a straggler
# decodes faster on a lightly loaded engine, so waiting moves GPUs to sampling; dropping
# never waits and stays nearer the balance (08.6).
#
# **Blocking weight sync.** If sending the weights stops the trainers (no double buffer),
# a trainer-bound pipeline pays it every step ($C$ in (08.11)). FIFO on the straggler
# cluster, with a 15 s sync:

# %%
d15 = replace(spec8, weight_sync_s=15.0)
sync_rows = {}
for blocks in (False, True):
    p = predict("pipeline", replace(d15, sync_blocks_trainer=blocks))
    s = simulate(sim_config(d15, "pipeline", n_steps=30, warmup_steps=8, lengths=straggly.tokens, seed=0,
                            sync_blocks_trainer=blocks))
    sync_rows[blocks] = (p.tokens_per_s, s.tokens_per_s)
    print(f"sync {'blocks the trainers' if blocks else 'overlapped':<20}: model {p.tokens_per_s:,.0f} tokens/s, "
          f"simulator {s.tokens_per_s:,.0f}")
assert all(abs(relative_error(s, m)) < 0.10 for m, s in sync_rows.values())
assert sync_rows[True][0] < 0.85 * sync_rows[False][0]
print("asserted: model within 10% of the simulator either way; blocking costs more than 15% of the tokens/s")

# %% [markdown]
# ### The timeline
#
# The straggler system, synchronous and pipelined (FIFO): what each GPU does; thin lines
# mark new weights reaching the samplers.

# %%
from course_lib.layout.sim import gantt

fig, axes = plt.subplots(2, 1, figsize=(11, 6.5))
timelines = [simulate(sim_config(spec8, layout, n_steps=12, warmup_steps=2, lengths=straggly.tokens, seed=0))
             for layout in ("sync_split", "pipeline")]
span_s = min(r.timeline_end_s for r in timelines)
for ax, r in zip(axes, timelines):
    gantt(r, ax=ax, until_s=span_s)
fig.suptitle(f"Simulated timeline, 4 samplers + 4 trainers, 1% stragglers (first {span_s:.0f} s)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** synchronously, every GPU waits for the engine that drew a straggler, and
# the trainers work only between batches. In the pipeline the samplers pause only for the
# admission window and the trainers train back to back: they are this cluster's bottleneck.

# %% [markdown]
# ## 4. The model against published systems
#
# `layout.published` holds each comparison as data: the setting the source states (model,
# GPUs, split, batch, generation limit, staleness knob, recomputed log-probs) and the
# published speedup. Two predictions per case:
#
# - **datasheet**: what the sources do not state is chosen once for all cases (answer
#   lengths with a 2,000-token mean and the case's own limit, 256 prompt tokens, 40% MFU,
#   decode at 70% of peak, the sync at 125 GB/s), and each round's batches are drawn
#   independently. The 2,000-token mean was picked against verl's colocated 128-GPU update
#   time, so that case's datasheet agreement is partly built in.
# - **calibrated**: decode and training rates each rescaled by one factor so the model
#   reproduces the *baseline* arm's published generation and training seconds per step;
#   then the *system* arm is predicted. Nothing is fitted to the system.
#
# A hit is the same side of 1 and within 25% (calibrated: speedup and system step); a
# predicted slowdown against a measured speedup is a miss.

# %%
from course_lib.layout.published import CASES, calibrated_table, held_out_checks

table = calibrated_table()
print(f"{'case':<26} {'published':>9} {'datasheet':>9} {'calibrated':>10} {'system step s pub/cal':>21}  "
      f"{'verdict':<13} {'faster per GPU than calibrated: trainer, engine':>12}")
for r in table:
    cal = "-" if r.calibrated_speedup is None else f"{r.calibrated_speedup:.1f}x"
    steps = "-" if r.calibrated_step_s is None else f"{r.published_step_s:.0f} / {r.calibrated_step_s:.0f}"
    verdict = ("hit" if r.datasheet_hit else "miss") + " / " + ("-" if r.calibrated_hit is None else
                                                               "hit" if r.calibrated_hit else "miss")
    factors = ", ".join("-" if f is None else f"{f:.1f}x" for f in (r.trainer_factor, r.engine_factor))
    print(f"{r.name:<26} {r.published_speedup:>8.1f}x {r.datasheet_speedup:>8.1f}x {cal:>10} {steps:>21}  "
          f"{verdict:<13} {factors}")

# %%
fig, ax = plt.subplots(figsize=(6.5, 4.2))
top = 3.0
xs = np.linspace(0, top, 2)
ax.plot(xs, xs, "k-", lw=1, label="model = published")
ax.fill_between(xs, 0.75 * xs, 1.25 * xs, color="k", alpha=0.08, label="within 25%")
ax.axhline(1.0, color="tab:gray", ls=":", lw=1, label="no speedup")
for r, colour in zip(table, plt.rcParams["axes.prop_cycle"].by_key()["color"]):
    ax.plot(r.published_speedup, r.datasheet_speedup, "o", color=colour, ms=7, label=r.name)
    if r.calibrated_speedup is not None:
        ax.plot(r.published_speedup, r.calibrated_speedup, "s", mfc="none", color=colour, ms=9)
ax.set_xlim(0, top)
ax.set_ylim(0, top)
ax.set_xlabel("published speedup (x)")
ax.set_ylabel("model's speedup (x): datasheet o, calibrated □")
ax.set_title("The layout model against published async-vs-sync speedups")
ax.legend(fontsize=7, loc="upper left")
plt.show()

# %%
rows = {r.name: r for r in table}
assert rows["PipelineRL, 128 H100"].datasheet_hit and rows["PipelineRL, 128 H100"].calibrated_hit is None
assert all(r.mechanism for r in table if not r.hit)
verl = [r for r in table if r.name.startswith("verl")]
assert all(not r.calibrated_hit and r.calibrated_speedup < r.published_speedup for r in verl)
assert all(r.trainer_factor > 1.0 for r in verl) and all(r.engine_factor > 1.0 for r in verl if "one-step" in r.name)
assert not rows["verl one-step-off, FSDP2"].datasheet_hit  # a predicted slowdown is not a hit
print("asserted: PipelineRL's ratio is a datasheet hit (no stage times to calibrate on); every verl case misses "
      "calibrated, always predicting less speedup than published; in every one the separated trainer, and in the "
      "one-step cases the dedicated engines, ran faster per GPU than the colocated ones the model was calibrated on")

# %% [markdown]
# **What the misses say.** One mechanism explains them, and the last columns size it:
# calibrated on a **colocated** baseline, the model carries the colocated GPU's rates over
# to the separated system, while verl's own stage times show the separated trainer 1.1-2.3x
# faster per GPU and the dedicated one-step engines at least 1.4-1.9x faster. A colocated
# GPU shares its memory between engine and training state: it offloads, runs smaller
# micro-batches, switches context every step. A FLOP-charging model cannot see that. Two
# smaller gaps: partial rollouts (at most 3-5% here: the model's trainers are already busy
# 95-97% of the time) and lengths drifting over training (verl's 128-GPU ratio is 2.65x at
# 100-300 steps, 2.35x at 400). PipelineRL, the one separated baseline, lands within 25%.
#
# **What else the model lacks:** prefix sharing across a group's samples (GRPO's 16
# samples per prompt share the prompt's KV and prefill), attention FLOPs at long contexts
# (08.3 and 08.5 count $2 n_{params}$ and $6 n_{params}$ per token), activation memory in
# the trainer's minimum (08.5b), and tensor-parallel overheads.
#
# **Held out.** Results kept out of the cases, checked after the fact, nothing tuned:

# %%
for name, pub, pred, ok, _why in held_out_checks():
    print(f"{name:<58} published {pub:.2f}, model {pred:.2f}: {'agrees' if ok else 'DISAGREES'}")

# %% [markdown]
# None agrees. Streaming without staleness (verl's 1.6x) is synchronous in the model, which
# does not overlap one batch's generation with its training; partial rollouts keep verl's
# engines busy at staleness 0.1, so the model overstates what a small window costs; and at
# 40% MFU on H800s its trainer is the scarcer side, so it prefers 50/50 where AReaL found
# 75/25 better (with the shared assumptions: AReaL's setting is not in our references).
# The model reasons about a layout you can measure; it does not forecast another team's
# run. Calibrate it on the layout you will run.

# %% [markdown]
# ## 5. Sizing a run: Qwen2.5-7B and 32B on 64-256 H100s
#
# The assumptions of section 1, batches of 1,024, the weights synchronised at 125 GB/s
# (verl's 0.12 s for a 7B model), `max_lag` 2 held by waiting for stragglers (the
# calculator's default). The 32B model runs on tensor-parallel pairs (ideal scaling, an
# optimistic assumption). The calculator prints every layout's best feasible split, the
# range of splits within 5% of it, tokens/s per GPU, and the lag per sample and per token:

# %%
from course_lib.layout.calc import (
    admissions_text,
    best_tokens_per_s_vs_lag,
    compare_admissions,
    fmt_sig,
    recommend,
    recommendation_text,
    robust_splits,
    sensitivity,
    sensitivity_text,
)

CASES_FULL = [(128, QWEN25_7B.name), (64, QWEN25_32B.name), (256, QWEN25_32B.name)]
recs = {case: recommend(case[0], case[1], max_lag=2) for case in CASES_FULL}
rec7 = recs[(128, QWEN25_7B.name)]
print(f"== {QWEN25_7B.name} on 128 H100s, max_lag 2, stragglers waited for")
print(recommendation_text(rec7))
for (n, name), rec in recs.items():
    if rec is not rec7:
        print(f"== {name} on {n} H100s (tensor-parallel pairs): {rec.layout}, {rec.split_range.samplers_text()} "
              f"sampler GPUs, {fmt_sig(rec.prediction.tokens_per_s)} tokens/s")

# %%
ratios = {}
for case, rec in recs.items():
    p = rec.prediction
    assert rec.layout == "pipeline" and p.admission == "wait" and p.max_lag_steps <= 2 and p.feasible
    sync_best = max(q.tokens_per_s for k, q in rec.best.items() if k != "pipeline" and q is not None)
    ratios[case] = p.tokens_per_s / sync_best
rng7 = rec7.split_range
assert all(1.2 < r < 3.0 for r in ratios.values()), ratios
assert rng7.lo <= rng7.best <= rng7.hi and rng7.width > 0.3 * 128, rng7
print("asserted: the pipeline is 1.2-3x the best synchronous layout in all three clusters "
      + f"({', '.join(f'{r:.1f}x' for r in ratios.values())}); for the 7B run the splits within 5% of the best span "
      + "more than 30% of the cluster")

# %% [markdown]
# **The optimum is flat.** With every lag held by waiting, the step is the straggler's
# time over the bound (08.14), and any split in the range makes nearly the same tokens/s:
# the single argmax is an artefact of the inputs' last digits. And the inputs are
# uncertain: MFU, decode bandwidth and mean answer length each by ±30%. How the range moves:

# %%
args7 = dict(n_gpus=128, model=QWEN25_7B.name, max_lag=2)
sens7 = sensitivity(**args7)
print(sensitivity_text(sens7))

# %%
robust = robust_splits(sens7)
tps = [row.best_tokens_per_s for row in sens7]
assert robust and min(tps) < 0.8 * tps[0] < tps[0] < 1.2 * tps[0] < max(tps)
print(f"asserted: {len(robust)} splits stay within 5% of the best under every ±30% change, while the predicted "
      "tokens/s moves by more than 20% either way: the split is more certain than the throughput")

# %% [markdown]
# The three admission rules side by side, lag per sample (first token) and per token:

# %%
rows7 = compare_admissions(rec7.spec)
print(admissions_text(rows7, max_lag=2))

# %%
by_rule = {row.admission: row for row in rows7}
assert not by_rule["fifo"].feasible and by_rule["wait"].feasible and by_rule["drop"].feasible
assert by_rule["drop"].tokens_per_s > by_rule["wait"].tokens_per_s
assert by_rule["fifo"].token_lag.token_share_over_bound > 0.05
assert by_rule["wait"].token_lag.token_mean < by_rule["wait"].token_lag.sample_mean
print("asserted: FIFO breaks the bound (and a share of its tokens lag past it, not only first tokens); dropping "
      "makes more tokens/s than waiting, at the cost of a sample biased to short answers; under waiting the "
      "per-token lag is below the per-sample lag")

# %% [markdown]
# **Takeaway:** with a 1% tail and a hard bound of 2, most of the cluster waits for one
# answer per batch (2 sequences per engine); dropping stragglers, capping the length or
# loosening the bound are the levers. Per token the lag is lower than per sample: tokens
# decoded after an in-flight swap come from newer weights. Published splits (AReaL 75/25,
# verl 96:32, PipelineRL 48:80) move with the workload and the rule, as here.
#
# **The staleness bound.** The best feasible pipeline throughput at each `max_lag` (0 is
# synchronous), for the three clusters:

# %%
LAGS = np.arange(0, 9)
curves = {case: best_tokens_per_s_vs_lag(rec.spec, LAGS) for case, rec in recs.items()}
fig, ax = plt.subplots(figsize=(7.5, 3.8))
for (n, name), t in curves.items():
    ax.plot(LAGS, t / 1e3, "o-", label=f"{name}, {n} H100s")
ax.set_xlabel("max staleness max_lag (optimizer steps)")
ax.set_ylabel("best generated tokens/s (thousands)")
ax.set_title("Best feasible pipeline throughput against the staleness bound (wait)")
ax.legend(fontsize=8)
plt.show()

# %%
for t in curves.values():
    assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= -1e-6 * t[:-1])
    assert t[2] - t[1] > t[1] - t[0] and t[8] > 2 * t[2]
print("asserted: more staleness never lowers the best throughput; a bound of 1 gains less over 0 than 2 over 1, and "
      "a bound of 8 more than doubles a bound of 2, in all three clusters")

# %% [markdown]
# **Takeaway:** when every lag is held by waiting, the step is about the straggler's
# generation time over $k_{max}$ (08.14), so throughput grows almost in proportion to the
# bound until production or consumption binds. A bound of 1 is one-step off-policy with a
# straggler in every step. The throughput the bound buys is paid in learning (lesson 02).
#
# ## 6. The calculator
#
# The widgets call `calc.recommend` and print its table (the logic is in `course_lib`,
# tested). Without a kernel, the cell after them shows a refusal.

# %%
# NBVAL_IGNORE_OUTPUT
import ipywidgets as widgets

from course_lib.layout.calc import MODELS


def show_layout(n_gpus: int, model_name: str, batch: int, max_lag: int, admission: str, mean_tokens: int,
                tail: float) -> None:
    try:
        rec = recommend(n_gpus, model_name, batch_samples=batch, max_lag=max_lag, admission=admission,
                        mean_tokens=mean_tokens, p99_over_median=tail)
    except ValueError as exc:
        print(f"no layout: {exc}")
        return
    print(recommendation_text(rec))


widgets.interactive(
    show_layout,
    n_gpus=widgets.IntSlider(value=128, min=16, max=512, step=16, description="GPUs"),
    model_name=widgets.Dropdown(options=list(MODELS), value=QWEN25_7B.name, description="model"),
    batch=widgets.IntSlider(value=1024, min=128, max=4096, step=128, description="batch"),
    max_lag=widgets.IntSlider(value=2, min=1, max=8, description="max_lag"),
    admission=widgets.Dropdown(options=list(ADMISSIONS), value="wait", description="rule"),
    mean_tokens=widgets.IntSlider(value=2000, min=250, max=8000, step=250, description="mean tokens"),
    tail=widgets.FloatSlider(value=8.0, min=1.0, max=16.0, step=0.5, description="p99/median"),
)

# %% [markdown]
# A split the constraints refuse, with the reason and what to change: the 7B cluster with
# a single trainer.

# %%
from course_lib.layout.calc import check_split

try:
    check_split("pipeline", replace(rec7.spec, n_samplers=127))
except ValueError as exc:
    refusal = str(exc)
print(refusal)
assert "trainer memory" in refusal and "Feasible instead" in refusal

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | tokens/s | generated answer tokens trained on per second (drop: the kept ones) |
# | tokens/s per GPU | tokens/s over all GPUs of the cluster, samplers and trainers |
# | B_max, sequences per engine | what one engine can hold (08.2); what it runs (08.11) |
# | p, c | answer tokens/s of one full engine (08.4), of one trainer GPU (08.5) |
# | lag per sample / per token | optimizer steps from the weights a sample's first token (or each token) was generated with to the update that trains on it |
# | fifo, wait, drop | what the trainer does with a sample that would break the bound: take it late, wait for it, abort it |
# | feasible | trainers hold the model, every lag within max_lag, at most 2% dropped |
# | near-optimal range | every feasible split within 5% of the fastest |
# | model error | (model - measured) / measured tokens/s |
# | datasheet / calibrated prediction | from datasheets and the shared assumptions / with decode and training rescaled to a baseline's published stage times |
#
# ## Summary
#
# - A sampler GPU is bounded by memory twice (the KV cache caps the batch, the weight read
#   floors the step); a trainer GPU by FLOPs and by holding the sharded Adam state.
# - Production = consumption gives the balance (08.6); the lag bound constrains the
#   maximum, which stragglers set. Waiting for or dropping them keeps it, at a price.
# - Tested: right lags and ranking on lesson 07's cluster, within a few percent of the
#   simulator where its assumptions hold, and against published systems a colocation gap
#   of up to 2x per GPU that a FLOP-charging model cannot see.
# - Sizing: a range of near-optimal splits, per-GPU throughput and its sensitivity.
#
# **Full scale.** `COURSE_SCALE=full` runs 200 updates per lesson 07 run; the rest does
# not change. On a GPU, time the engine's step at several batch sizes and the trainer's
# tokens/s, and hand a `SystemSpec` to `model.best_split`, as lesson 11's capstone does.
#
# **References.** Applied Compute, "Efficient RL" (talk). Kwon et al., PagedAttention,
# SOSP 2023. Rajbhandari et al., ZeRO, SC 2020. Fu et al., AReaL, arXiv 2505.24298. verl
# documentation: fully-async and one-step-off recipes. Piché et al., PipelineRL, arXiv
# 2509.19128, and its `conf/base.yaml`. Grattafiori et al., The Llama 3 herd of models,
# arXiv 2407.21783. Qwen2.5 model cards; NVIDIA H100 and H20 datasheets. Little, "A proof
# for the queuing formula L = lambda W", 1961.
#
# **Exercises:** `exercises/08_cluster_layout.ipynb`. Grade with
# `course grade exercises/08_cluster_layout.ipynb`.
