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
# Lesson 07 ran RL on two cores, as a pipeline (a generator core, a trainer core) and as
# conventional RL (both phases on both cores). A real run has $N$ GPUs and one
# question before anything else: **how many should generate and how many should train,
# and in which layout** (synchronous, one-step off-policy, or a pipeline with in-flight
# updates), to get the most RL tokens per second while **no sample** is staler than the
# learning algorithm tolerates? (Applied Compute's talk "Efficient RL" frames it this way.)
# This lesson answers it with pen and paper: what one GPU can generate and train, two
# invariants, and the best split that keeps them. Then it holds the model against three
# things: a discrete-event simulator of the same system, lesson 07's real processes
# measured here, and the speedups that verl and PipelineRL published.
#
# **Learning goals**
# 1. Derive what bounds a sampler GPU (a paged KV cache caps the batch; the step is the
#    longer of its memory time and its compute time) and a trainer GPU (FLOPs over prompt
#    and answer, the extra forward passes, and the memory of sharded Adam), from a model's
#    shape and a GPU's datasheet (H100 and H20; an H800 has the H100's figures here).
# 2. State the two invariants of an asynchronous RL cluster, production = consumption and
#    **every sample's** lag within the bound, and find the best split that keeps both.
# 3. Tell apart what an admission rule bounds: AReaL's rule bounds what *starts*; whether
#    a straggler's lag stays bounded depends on what the trainer does with it (take it
#    late, wait for it, or drop it), and each choice has a price in tokens/s.
# 4. Calibrate the model on measured parts (lesson 07's sampler and trainer) and compare
#    its predictions with measured runs, with the errors stated.
# 5. Hold the model against published systems (verl, PipelineRL): where it agrees, where
#    it does not, and what it lacks.
# 6. Size a real run with a calculator that prints the maximum lag and refuses a layout
#    that breaks a constraint.
#
# Builds on lesson 07 (the three regimes, backpressure, per-token lag) and lesson 02
# (why staleness costs: importance weights).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, pick, progress, show_source

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## Key equations
#
# **One sampler GPU** (an inference engine with a *paged* KV cache, as vLLM and SGLang).
# Each generated token leaves a key and a value vector per layer and KV head. A paged
# engine holds only the tokens a sequence has written so far: a sequence of $L$ answer
# tokens after $P$ prompt tokens holds $P + j$ tokens at its $j$-th step, so the mean it
# holds while it runs (longer sequences run longer) is $R$, and the sequences that fit
# beside the weights ($M$ memory, fraction $f$ usable, $W$ weight bytes) number
#
# $$\text{kv} = 2\, n_{layers}\, n_{kv}\, d_{head}\, \text{bytes}_{kv} \qquad (08.1)$$
#
# $$R = P + \frac{E[L^2] - E[L]}{2 E[L]}, \qquad B_{max} = \Big\lfloor \frac{f M - W}{\text{kv} \cdot R} \Big\rfloor \qquad (08.2)$$
#
# (the pessimistic engine reserves the whole context $P + L_{limit}$ per sequence instead of $R$).
# One decode step advances every running sequence by one token. It reads the weights once
# and the resident cache ($R_t$ tokens), and computes $2 n_{params}$ FLOPs per token it
# processes: the $B$ answer tokens and the prompts of the $S_t$ sequences starting now
# (chunked prefill). It takes the longer of its memory time and its compute time (a
# roofline at an efficiency $\eta$ of peak bandwidth $\beta$ and peak FLOP/s $F$):
#
# $$l = \max\big(a_s + b_s B + r_s R_t,\ \ f_s (B + P S_t)\big), \quad a_s = \frac{W}{\eta\beta},\ r_s = \frac{\text{kv}}{\eta\beta},\ f_s = \frac{2 n_{params}}{\eta F} \qquad (08.3)$$
#
# ($b_s$: a per-sequence cost; 0 for the roofline, fitted for a measured engine.) In steady
# state $R_t = B R$ and $S_t = B / E[L]$, and a full engine makes
#
# $$p = \frac{B_{max}}{l(B_{max})} \quad \text{answer tokens/s} \qquad (08.4)$$
#
# **One trainer GPU.** A sample of $P + L$ tokens costs $6 n_{params}$ FLOPs per token for the
# update and $2 n_{params}$ per extra forward pass ($k$ of them: old-policy log-probs when they
# are recomputed, a reference model for a KL term), at a model-FLOPs utilisation $u$; in
# answer tokens per second:
#
# $$c = \frac{u F\, E[L]}{(6 + 2k)\, n_{params}\, (P + E[L])} \qquad (08.5)$$
#
# Its memory: mixed-precision Adam keeps 16 bytes per parameter (ZeRO), sharded over the
# $N_t$ trainers:
#
# $$\frac{16\, n_{params}}{N_t} \le f M \quad\Longrightarrow\quad N_t \ge N_t^{min} \qquad (08.5b)$$
#
# **The balance.** $N_s$ samplers produce $P_{rod} = N_s p$, $N_t = N - N_s$ trainers consume
# $C = N_t c$; the cluster runs at $\min(P_{rod}, C)$, and the split that wastes neither is
#
# $$N_s^* = \frac{N c}{p + c} \qquad (08.6)$$
#
# **The straggler.** A synchronous layout waits for the batch's last answer. Each engine
# runs continuous batching; summing (08.3) over the steps of its schedule gives its phase
# exactly, and the batch is done when the slowest engine is:
#
# $$T_{gen} = \max_e \sum_t l(B_{e,t}, R_{e,t}, S_{e,t}) \qquad (08.7)$$
#
# **The layouts** ($G$ answer tokens per batch, $K$ batches generated per weight version,
# $T_{train} = K G / (N_t c)$, $d$ the weight sync):
#
# $$\text{sync\_colocated:}\ \ t = T_{gen}(N) + \frac{K G}{N c} + d \qquad (08.8)$$
#
# $$\text{sync\_split:}\ \ t = T_{gen}(N_s) + T_{train} + d \qquad (08.9)$$
#
# $$\text{one\_step:}\ \ t = \max\big(T_{gen}(N_s),\ T_{train} + d\big) \qquad (08.10)$$
#
# and tokens/s $= K G / t$, with lags $0 .. K-1$ (one_step: $1 .. K$).
#
# **The pipeline** (in-flight weight updates; a sample's lag counts from the weights its
# first token used). AReaL's admission rule with staleness $k_{max}$ (`max_lag`): a sample
# may start only while fewer than $(k_{max} + 1) B_{batch}$ samples are *held* (started,
# and not consumed by an update whose weights have reached the samplers). Held are the
# samples in flight, the finished ones queued (half a batch on average), the batch being
# trained (for the share $T_{train} / t_{step}$ of the time) and the one whose weights are on
# their way ($d / t_{step}$), so at most $I$ sequences are in flight:
#
# $$I = (k_{max} + 1) B_{batch} - B_{batch}\Big(\tfrac12 + \tfrac{T_{train} + d}{t_{step}}\Big),\quad B_{eff} = \min\Big(B_{max}, \frac{I}{N_s}\Big),\quad \text{tokens/s} = \min\Big(\frac{N_s B_{eff}}{l(B_{eff})}, N_t c\Big) \qquad (08.11)$$
#
# (solved as a fixed point: $t_{step}$ depends on tokens/s). The mean lag by Little's law
# (samples in the system = rate $\times$ time in the system), and the lag of the longest
# answer, $(L_{max} - E[L])\, l(B_{eff})$ seconds behind the mean one, if nothing stops it:
#
# $$\overline{\text{lag}} = \min\Big(k_{max},\ \frac{N_s B_{eff} + B_{batch}/2}{B_{batch}} + \frac{d}{t_{step}}\Big) \qquad (08.12)$$
#
# $$\text{lag}_{max} = \Big\lceil \overline{\text{lag}} + \frac{(L_{max} - E[L])\, l(B_{eff})}{t_{step}} \Big\rceil \qquad (08.13)$$
#
# **What keeps the maximum within the bound.** AReaL's rule bounds what *starts*. It bounds
# every sample's lag only if samples are consumed in the order they started; what the
# trainer does with a straggler decides:
#
# - **FIFO**: finished samples are consumed first come, first served; a straggler is taken
#   late, with the lag (08.13), past the bound when answers have a long tail.
# - **wait** (a hard bound by waiting): the trainer takes the oldest sample first when a
#   deadline forces it, and waits for it. A straggler started at version $s$ must be done
#   before update $s + k_{max}$ starts, so the step can be no shorter than
#
# $$t_{step} \ge \frac{L_{max}\, l(B_w) + d}{\lfloor k_{max} \rfloor} \qquad (08.14)$$
#
#   While it waits, the window fills with finished samples and the engines run only what is
#   consumed: $B_w$ is the batch at which $N_s B_w / l(B_w)$ equals the throughput, so the
#   straggler decodes faster than in a full engine. $L_{max}$ is the generation limit: any
#   batch may hold an answer that reaches it, so a bound that must hold plans for it.
#
# - **drop** (a hard bound by refusing): a sample that cannot be consumed in time is
#   aborted and its tokens wasted; answers longer than
#   $L_{cut} = (\lfloor k_{max}\rfloor t_{step} - d) / l(B_{eff})$ are dropped, and the trainer
#   gets the kept ones:
#
# $$\text{useful tokens/s} = \min\Big(\text{production} \cdot \frac{E[L;\ L \le L_{cut}]}{E[\min(L, L_{cut})]},\ N_t c\Big) \qquad (08.15)$$
#
#   Dropping the long answers biases the training sample towards short ones, a cost this
#   model does not price: it calls a split that drops more than 2% infeasible (a straggler
#   tail of about 1%, the talk's, may go whole).
#
# ### The two invariants, and where the best split comes from
#
# 1. **Production = consumption.** In steady state the trainers consume exactly what the
#    samplers produce: if $P_{rod} > C$ finished samples pile up (or the admission rule
#    idles the samplers); if $P_{rod} < C$ the trainers wait. Throughput is $\min(P_{rod}, C)$,
#    rising in $N_s$ on one side and in $N - N_s$ on the other, so its maximum is where the
#    two cross, (08.6).
# 2. **Every sample's lag within the bound.** A sample started with weights $v$ and consumed
#    by update $u$ has lag $u - v$; the bound is on the **maximum**, not the mean. It is a
#    constraint: a split whose maximum lag (08.13, or the hard rule's cap) exceeds
#    `max_lag` is infeasible, and so is one whose trainers cannot hold the model (08.5b).
#    The best split is the fastest *feasible* one, which the bound can move away from (08.6).
#
# **Pseudocode** (what `layout.model.best_split` does)
# ```
# for each layout in (sync_colocated, sync_split, one_step, pipeline):
#     for N_s in 1 .. N-1:                              # sync_colocated: no split
#         tokens/s from (08.8)-(08.11), under the rule (08.14)/(08.15)
#         max lag from (08.13), capped by a hard rule
#         feasible if N - N_s >= N_t_min (08.5b) and max lag <= max_lag
#     best[layout] = the feasible N_s with the most tokens/s, else the constraint that failed
# recommend the layout with the most tokens/s
# ```
#
# | equation | function in `course_lib.layout` |
# |---|---|
# | (08.1) KV bytes per token | `model.kv_bytes_per_token` |
# | (08.2) resident tokens, largest batch | `model.resident_tokens`, `model.max_batch` |
# | (08.3) the decode step | `model.step_costs`, `SystemSpec.latency_s`; a measured engine: `model.fit_decode_latency` |
# | (08.4) engine tokens/s | `SystemSpec.engine_full_tokens_per_s` |
# | (08.5), (08.5b) trainer tokens/s and memory | `model.train_tokens_per_s_per_gpu`, `model.min_trainers` |
# | (08.6) balanced split | `model.balanced_samplers` |
# | (08.7) the straggler, exactly | `model.generation_time_s` (`engine_schedule`) |
# | (08.8)-(08.15) the layouts, lags, admission rules | `model.predict`; best split: `model.sweep`, `model.best_split` |
# | the same system, event by event | `sim.simulate`, `sim.gantt` |
# | lesson 07 as a 2-GPU cluster | `calibrate` (`Rates`, `lesson07_spec`, `measure_round`, `compare_regimes`) |
# | published systems | `published.CASES`, `published.predicted_speedup` |
# | the calculator | `calc.recommend`, `calc.recommendation_text` |
#
# The heart of the pipeline's throughput, (08.11): the sequences the window leaves in
# flight at a given throughput, and what the engines make with them (the fixed point and
# the lags are in `_pipeline`; its maximum-lag rule is exercise 3's to write):

# %%
from course_lib.layout.model import _flow, _step_clock_s

show_source(_flow)

# %% [markdown]
# And (08.3) summed over one engine's continuous-batching schedule, the core of (08.7):
# $B_t$, the resident tokens $R_t$ and the starters $S_t$ come from the schedule by
# difference arrays, one step at a time:

# %%
show_source(_step_clock_s)

# %% [markdown]
# ## 1. What one GPU can do: Qwen2.5-7B and 32B on an H100 and an H20
#
# The shapes come from the models' published `config.json` (Hugging Face); the GPUs from
# NVIDIA's datasheets: the H100 SXM has 80 GB of HBM3 at 3.35 TB/s and 989 TFLOP/s dense
# bf16; the H20 (the export Hopper verl's runs used) 96 GB at 4.0 TB/s but only 148 TFLOP/s
# (the H800 is the H100 with a slower NVLink: the same here). Stated assumptions, used
# throughout: answers log-normal with a mean of 2,000 tokens and a 99th percentile 8x the
# median, capped at 16,384; 1,024 prompt tokens; decode at 70% of peak bandwidth and FLOP/s;
# training at 40% MFU (large dense runs report 38-43% on H100s: Llama 3, arXiv 2407.21783);
# 90% of memory usable.

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
# **Takeaway:** on an H100 the 7B step stays memory-bound up to a full paged cache: its
# floor is the weight read and each sequence adds its resident KV, so a bigger batch
# amortises the weight read and tokens/s climbs until memory runs out. On the H20, with
# 6.7x less compute and more bandwidth, the compute line overtakes the memory line at a
# few dozen sequences: the engine is compute-bound at $B_{max}$, and a trainer (pure
# FLOPs) is more than five times slower than on an H100. Reserving the whole context per
# sequence would cut the batch by more than 3x (table). The 32B model's 65.5 GB of weights
# leave room for few sequences on one 80 GB GPU, and its Adam state needs at least 8
# trainer GPUs (08.5b): it runs on tensor-parallel groups (section 5).

# %% [markdown]
# ## 2. The lesson 07 cluster, measured: calibrate, predict, compare
#
# Lesson 07's generator process (pinned to core 0) and trainer (core 1) are, for the model,
# a cluster of **2 GPUs: 1 sampler, 1 trainer**. The mapping, part by part
# (`course_lib.layout.calibrate`):
#
# | lesson 07 | model input | how it is measured here |
# |---|---|---|
# | `SlotSampler.step` computes all 32 slots, busy or not | $a_s = l(32)$, $B_{max}$ = 32 slots | the bare step, timed in this process (`time_decode_steps`) |
# | the generator loop: start, verify, pickle answers | $b_s$ per live slot step | the loop, timed in this process (`time_generator_steps`) minus the bare step |
# | a sequence: 3 prompt steps + its answer | lengths in slot steps | 1,024 answers of the warm-started policy (`sample_answer_tokens`) |
# | the trainer's update (loss, backward, Adam, publish) | $c$ in slot steps per second | the trainer's own busy intervals in the runs (`trainer_timing`) |
# | publishing is inside the update | $d = 0$ | |
# | `sync` / `one_step` / `pipeline` (`max_lag` 8) | `sync_split` / `one_step` / `pipeline` | |
#
# To keep the model's inputs still, the validation runs use **`lr = 0`**: the trainer does
# all its work (loss, backward, Adam step, publish) but the policy, hence the answer lengths,
# stay those of the warm start. With learning on, lengths drift within a run, and the model
# would need the current lengths, which it cannot predict (section 4 meets the same drift
# in published runs). The engine here is lesson 07's slot sampler, a *linear* engine
# ($r_s = f_s = 0$ in (08.3)): its step is measured and fitted, not derived from a datasheet.
#
# First the warm start (lesson 07's, same seeds), the sampler's step against the number of
# slots (08.3) and the policy's answer lengths:

# %%
import torch

from course_lib.layout.model import LengthDist, fit_decode_latency
from course_lib.layout.calibrate import sample_answer_tokens, sequence_steps, time_decode_steps
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

# %%
# NBVAL_IGNORE_OUTPUT
print(f"warm-started policy, 1024 answers: mean {answers.mean():.1f} tokens, median {np.median(answers):.0f}, "
      f"99th percentile {np.percentile(answers, 99):.0f}, longest {answers.max()} (the limit: {LM.max_len - 4})")

# %%
assert np.median(answers) < answers.mean() < np.percentile(answers, 99) <= LM.max_len - 4
assert np.percentile(answers, 99) > 3 * answers.mean()
print("a long tail: the mean answer is above the median, the 99th percentile more than 3x the mean")

# %%
# NBVAL_IGNORE_OUTPUT
SLOTS = [8, 16, 32, 48, 64]
step_s = time_decode_steps(model, task, SLOTS, n_steps=40)
a07, b07 = fit_decode_latency(SLOTS, step_s)
print("bare decode step (ms) at " + ", ".join(f"{s} slots {1e3 * t:.2f}" for s, t in zip(SLOTS, step_s)))
print(f"fit (08.3): l(B) = {1e3 * a07:.3f} ms + {1e3 * b07:.4f} ms x B; the weight-read-like floor is "
      f"{100 * a07 / (a07 + 32 * b07):.0f}% of l(32)")

# %%
assert a07 > 0 and b07 > 0 and a07 > 32 * b07, (a07, b07)
print("the sampler's step has a fixed part larger than what 32 slots add (a_s > 32 b_s): as with a GPU's "
      "weight read, more slots amortise it, so tokens/s rises with the batch")

# %% [markdown]
# **The runs.** Three rounds; each round times the generator's parts in this process, then
# runs `sync`, `one_step` and `pipeline` back to back (50 updates each, `lr = 0`), so the
# calibration and the runs it predicts share the machine's load of the moment. A run's
# **steady state** leaves out its first 10 updates (the pipeline's queue fills up there).

# %%
from dataclasses import replace

from course_lib.layout.calibrate import REGIMES, compare_regimes, lesson07_spec, measure_round, relative_error
from course_lib.pipeline.system import PipelineConfig
from course_lib.runtime.processes import live_children

show_source(measure_round)
base07 = PipelineConfig(n_updates=pick(cpu=50, full=200), max_lag=8, lr=0.0)
SKIP, ROUNDS = 10, 3
rates_by_round, reports_by_round, loads = [], [], []
for i in range(ROUNDS):
    with progress(len(REGIMES) * base07.n_updates, f"round {i}: {', '.join(REGIMES)}", unit="update") as bar:
        rates, reports = measure_round(model, task, base07, init_flat, seed=i, skip=SKIP,
                                       on_update=lambda u, m: bar.update())
    rates_by_round.append(rates)
    reports_by_round.append(reports)
    loads.append(os.getloadavg()[0])

# %%
# NBVAL_IGNORE_OUTPUT
print(f"load average (1 min) after each round: {', '.join(f'{x:.1f}' for x in loads)} (2 cores, shared)")
for i, r in enumerate(rates_by_round):
    production = base07.n_slots / (r.step_s + base07.n_slots * r.per_slot_step_s)
    print(f"round {i}: l(32) {1e3 * r.step_s:.2f} ms, loop adds {1e6 * r.per_slot_step_s:.1f} us per live slot step: "
          f"production {production:,.0f} vs consumption {r.trainer_steps_per_s:,.0f} slot steps/s")
cmp = compare_regimes(base07, rates_by_round, reports_by_round, answers, SKIP)
print(f"\n{'regime':<9} {'measured tok/s':>14} {'model':>7} {'sim':>7} {'model err per round':>22} "
      f"{'median err':>10} | {'lag: measured':>13} {'model':>6} {'sim':>5} | {'trainer busy':>12}")
for regime, row in cmp.items():
    errs = ", ".join(f"{100 * e:+.0f}%" for e in row.model_errors)
    print(f"{regime:<9} {row.measured_tokens_per_s:>14,.0f} {row.model_tokens_per_s:>7,.0f} {row.sim_tokens_per_s:>7,.0f} "
          f"{errs:>22} {100 * row.model_error:>+9.0f}% | {row.measured_lag:>13.2f} {row.model_lag:>6.2f} "
          f"{row.sim_lag:>5.2f} | {100 * row.trainer_busy:>11.0f}%")

# %%
med_err = {regime: cmp[regime].model_error for regime in REGIMES}
measured = {regime: cmp[regime].measured_tokens_per_s for regime in REGIMES}
assert not live_children()
assert all(reports["sync"].token_lags.max() == 0 for reports in reports_by_round)
assert cmp["sync"].model_lag == 0.0 and cmp["one_step"].model_lag == 1.0
assert abs(cmp["one_step"].measured_lag - 1.0) < 0.05, cmp["one_step"].measured_lag
assert cmp["sync"].model_tokens_per_s < cmp["one_step"].model_tokens_per_s < cmp["pipeline"].model_tokens_per_s
assert measured["sync"] < measured["pipeline"] and measured["one_step"] < measured["pipeline"], measured
assert abs(med_err["pipeline"]) < 0.35, med_err
print("asserted: the lags of sync (0) and one_step (1) are what the model says; model and runs rank the "
      "regimes alike (the pipeline fastest); the model's pipeline tokens/s is within 35% of the measured "
      "(median over rounds)")

# %% [markdown]
# **What holds, what does not.** The table varies from run to run of this notebook (the
# processes share two cores with whatever else runs); the assertions above are the claims
# this lesson makes about it. The verdict for this run, against a 15% goal:

# %%
# NBVAL_IGNORE_OUTPUT
for regime in REGIMES:
    e = med_err[regime]
    print(f"{regime:<9} median model error {100 * e:+.0f}%: " + ("within 15%" if abs(e) <= 0.15 else "NOT within 15%")
          + f" (rounds: {', '.join(f'{100 * x:+.0f}%' for x in cmp[regime].model_errors)})")
print(f"pipeline lag: model {cmp['pipeline'].model_lag:.2f} (per sample, median over rounds), simulator "
      f"{cmp['pipeline'].sim_lag:.2f} (per sample), runs {cmp['pipeline'].measured_lag:.2f} (per token)")

# %% [markdown]
# How to read it:
#
# - **Lag of the synchronous layouts**: exact. `sync` has lag 0 and `one_step` lag 1 (after
#   the first update) in the model, the simulator and every run (asserted).
# - **Pipeline tokens/s: a consistency check, not a forecast.** $c$ is measured from the
#   same runs' trainer busy intervals, and when production exceeds consumption (the lines
#   above) the model's pipeline is trainer-bound, tokens/s = $c$: it can only be off by the
#   share of time the runs' trainer was not busy (the last column: it waits for groups to
#   come through the pipe). Asserted within 35% (median over rounds): the two shared cores
#   drift, and a round whose trainer waited on the pipe more falls short of c.
# - **`sync` and `one_step` tokens/s: the real test.** Here the generation phase (08.7),
#   predicted from the separately timed sampler step, is on the critical path, with the
#   hand-offs the model leaves out (a batch through the pipe, a weight pull, waking a
#   process); the verdict above says how far off it was in this run, round by round. A
#   round whose calibration or runs were preempted mid-step can err either way, and the
#   generator loop's extra cost per slot, when it is below the timing noise, can come out
#   as 0 (it is clamped: it cannot be negative).
# - **Pipeline lag: not a forecast here.** (08.12) has two branches: a round whose
#   production exceeds its consumption is trainer-bound, its window fills and the model says
#   the bound, $k_{max} = 8$; a round just below the balance gets Little's law, a lag of one
#   or two. Lesson 07's cluster sits near the balance (the rounds' lines above), so the
#   model's median over rounds jumps between the two, while the runs (per *token*: tokens
#   sampled after an in-flight update carry the newer version) and the simulator (per
#   sample) land in between. Applied Compute's post on staleness in fully asynchronous RL
#   derives the mean lag smoothly from utilisation and the length tail; (08.12) does not.
# - **The simulator** agrees with the model on `sync` and `pipeline` tokens/s (the same
#   assumptions, played out; asserted within 10% below). On `one_step` it can be faster: its
#   engines start the next batch in the slots the current batch's short answers free while
#   the long ones finish; lesson 07's generator, like (08.10), waits until every slot is free.

# %%
for regime in ("sync", "pipeline"):
    assert abs(relative_error(cmp[regime].sim_tokens_per_s, cmp[regime].model_tokens_per_s)) < 0.10, cmp[regime]
print("asserted: from the same measured rates, the simulator is within 10% of the model for sync and pipeline")

# %% [markdown]
# ## 3. Simulator and model at full scale: the admission rules and the maximum lag
#
# From here on the hardware is the H100 of section 1 and the model Qwen2.5-7B. First the
# model's home ground: answers of mixed but not heavy-tailed lengths (log-normal, 99th
# percentile 2x the median), 16 GPUs, an admission window of 4 batches beyond the one in
# training, FIFO, every layout at its fastest split (feasible or not: the lag constraint
# comes next), the simulator (`layout.sim`, SimPy) running 24 optimizer steps of the same
# system, decode step (08.3) and all (the first 8 steps not measured).

# %%
from course_lib.layout.model import SystemSpec, best_split, predict, sweep
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
print("where its assumptions hold (no heavy tail), the model is within 2.5% of the simulator for sync_colocated, "
      "sync_split and pipeline; for one_step the simulator is faster by design (its engines start the next batch in "
      "the slots the current batch frees; (08.10) waits for the whole batch), by less than 6%")
pipe16 = fastest("pipeline", spec16)
assert pipe16.max_lag_steps > spec16.max_lag
print(f"but the pipeline's maximum lag, {pipe16.max_lag_steps} in the model, is past its window of {spec16.max_lag:g}: "
      "even a mild tail puts the longest answers of a full window over the bound (the subject of the next part)")

# %% [markdown]
# The same cluster with a tighter bound, `max_lag` = 2. Now the window, not the KV cache,
# limits what is in flight: of the 3 batches it holds, the queue, the batch in training
# and the one whose weights are on their way take their share (08.11), and the engines run
# below $B_{max}$:

# %%
spec16_2 = replace(spec16, max_lag=2)
p2 = fastest("pipeline", spec16_2)
s2 = simulate(sim_config(replace(spec16_2, n_samplers=p2.n_samplers), "pipeline", n_steps=24, warmup_steps=8,
                         lengths=mild.tokens, seed=1))
tight = relative_error(s2.tokens_per_s, p2.tokens_per_s)
print(f"pipeline, max_lag 2, {p2.n_samplers} samplers: model {p2.tokens_per_s:,.0f} tokens/s with {p2.engine_batch:.0f} "
      f"sequences per engine (B_max {spec16_2.max_batch}); simulator {s2.tokens_per_s:,.0f} tokens/s ({100 * tight:+.0f}%) "
      f"with {s2.sampler_mean_in_flight:.0f} per engine")
assert p2.cap_binds and abs(tight) < 0.10, (p2, tight)

# %% [markdown]
# **Takeaway:** where its assumptions hold the model is within a few percent of the
# simulator (asserted above, and 10% with the window binding). Read the rows with
# care: a trainer-bound row (here the open-window pipeline) agrees by construction, both
# give $N_t c$; the tests of the engine model are the synchronous rows and the sampler-bound
# pipeline with the tight window. Counting everything the window holds, not only the
# sequences in flight, is what keeps a tight bound honest: a model that gave the whole
# window to generation would overstate the engines' batch.
#
# ### The straggler
#
# The talk's example: 99% of the samples are done in about 40 s, the last 1% need about
# 80 s more. Here: 8 GPUs (4 samplers, 4 trainers), batches of 400 answers, 100 per engine;
# the body's lengths are evenly spread from 200 to 3,000 tokens and 1% of the answers are
# long enough to keep an engine busy 80 s after its body is done
# (`model.tail_tokens_for_extra_s`, at the step of a batch of one). One engine's schedule (08.7):

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
print(f"lengths: body 200..{BODY_MAX} tokens, tail {tail:,} tokens (1%); mean {straggly.mean_tokens:,.0f}")
print(f"engine 0: {len(share)} answers, 99% done at {finish[int(0.99 * len(share)) - 1]:.0f} s, "
      f"the last at {finish[-1]:.0f} s")

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.4))
ax.step(finish, np.arange(1, len(finish) + 1) / len(finish), where="post", color="tab:blue")
ax.axvline(finish[-2], color="tab:gray", ls=":", label="99% of the answers done")
ax.set_xlabel("time since the batch started (s)")
ax.set_ylabel("fraction of engine 0's answers done")
ax.set_title("One engine's batch with a 1% tail: the last answer alone takes the rest")
ax.legend(loc="lower right")
plt.show()

# %%
assert finish[int(0.99 * len(share)) - 1] < 40 and abs(finish[-1] - finish[-2] - 80) < 8
print("asserted: 99% of the engine's answers are done in under 40 s, the last one about 80 s later (within 10%)")

# %% [markdown]
# **Takeaway:** the body is done in under 40 s; the one long answer keeps the engine (and,
# in a synchronous layout, the whole cluster) busy for about 80 s more, running a batch of
# one: every step pays the full weight read ($a_s$) for a single token.
#
# ### Three ways to treat a straggler, with `max_lag` = 2
#
# The synchronous layouts pay for the straggler in every step (08.7). The pipeline hides
# it, but the straggler's lag is then what (08.13) says. What each admission rule makes of
# it, model against simulator:

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
      f"{'sim lag mean/max':>17} {'dropped model/sim':>18} {'sim trainer busy':>17}")
for (layout, admission), (p, s) in rules.items():
    rule = admission if layout == "pipeline" else "-"
    sim_drop = s.n_dropped / max(1, s.n_started)
    print(f"{layout:<10} {rule:<5} {p.tokens_per_s:>11,.0f} {s.tokens_per_s:>10,.0f} {p.mean_lag_steps:>12.2f} / "
          f"{p.max_lag_steps:<4} {s.lag_mean:>11.2f} / {s.lag_max:<4} {100 * p.dropped_fraction:>8.1f}% / "
          f"{100 * sim_drop:>4.1f}% {100 * s.trainer_busy_frac:>16.0f}%")

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
print("asserted: sync_split, model = simulator within 5% (08.7 is exact for the straggler); FIFO lets the "
      "stragglers' lag run past the bound in both; waiting and dropping keep every lag within it in both; waiting "
      "costs tokens/s against FIFO (model within 25% of the simulator there); dropping aborts samples; even the "
      "waiting pipeline is more than 1.5x the synchronous split")

# %% [markdown]
# **Takeaway:** this is the invariant as a constraint. Under FIFO the pipeline's throughput
# holds, but the stragglers are consumed with a lag past the bound (the model's (08.13) and
# the simulator's maximum, printed; (08.13) is the more conservative of the two). The two
# hard rules keep every lag within it, at a price: **waiting** lets a straggler set the
# trainer's pace (08.14), **dropping** wastes the tokens of what it aborts and trains on
# shorter answers (08.15): here the 1% tail, and a little more in the simulator, whose
# batches draw their own stragglers (printed). The FIFO and drop rows are trainer-bound, so
# their tokens/s agree by construction; the waiting row is the test of (08.14). A layout is
# only as good as the rule that keeps its staleness honest.
#
# **The best split under each rule.** The model's sweep of a bigger cluster (24 GPUs,
# batches of 1,024, the same straggly lengths): throughput at every split, the infeasible
# splits (a lag past the bound, or trainers that cannot hold the model) hollow.

# %%
from course_lib.layout.model import ADMISSIONS, balanced_samplers, sweep

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
print(f"balance with full engines (08.6): N_s* = {n_bal:.1f}")
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
print("asserted: under FIFO no split of this cluster keeps every lag within 2 (the error says which constraint "
      "failed); under waiting and dropping the best split keeps it; waiting puts more GPUs on sampling than "
      "dropping, and makes fewer tokens/s")

# %% [markdown]
# **Takeaway:** with a 1% tail no FIFO split keeps the stragglers within the bound: a
# calculator that checked only the mean lag would have recommended one anyway. The hard
# rules keep the bound, and their best splits differ (printed): a waiting trainer idles
# while a straggler finishes, and a straggler decodes faster on a lightly loaded engine,
# so more GPUs go to sampling; dropping never waits and its trainers stay busy: its best
# split is the one closer to the balance of full engines (08.6, printed). The simulator's
# side of the rules, the trainer's pick when a deadline forces it (wait) and the sweep that
# aborts what can no longer make its deadline (drop):

# %%
from course_lib.layout.sim import _Sim

show_source(_Sim.forced_oldest)
show_source(_Sim.drop_stale)

# %% [markdown]
# **Bursty weight updates.** The model's pipeline overlaps the weight sync $d$ with
# generation (it only enters the window, (08.11)). If sending the weights blocks the
# trainer GPUs (no double buffer), each step pays it. The FIFO straggler cluster, whose
# trainers are its bottleneck (busy 100% in the table above):

# %%
# NBVAL_IGNORE_OUTPUT
burst = {}
for d in (0.0, 5.0, 15.0):
    spec_d = replace(spec8, weight_sync_s=d)
    p = predict("pipeline", spec_d)
    s_free = simulate(sim_config(spec_d, "pipeline", n_steps=30, warmup_steps=8, lengths=straggly.tokens, seed=0))
    s_block = simulate(sim_config(spec_d, "pipeline", n_steps=30, warmup_steps=8, lengths=straggly.tokens, seed=0,
                                  sync_blocks_trainer=True))
    burst[d] = (p.tokens_per_s, s_free.tokens_per_s, s_block.tokens_per_s, p.step_s)
    print(f"weight sync {d:>4.0f} s (model step {p.step_s:.0f} s): model {p.tokens_per_s:,.0f} tok/s, simulator "
          f"{s_free.tokens_per_s:,.0f} overlapped, {s_block.tokens_per_s:,.0f} when the sync blocks the trainers")

# %%
assert all(abs(relative_error(sim_free, model)) < 0.10 for model, sim_free, _, _ in burst.values())
assert burst[15.0][2] < 0.8 * burst[15.0][1]
print("overlapped, the sync costs the trainer-bound pipeline nothing the model does not see (model within 10% of the "
      "simulator at every d); blocking the trainers for 15 s costs more than a fifth of the tokens/s")

# %% [markdown]
# **Takeaway:** an overlapped sync hides behind the trainers' work: it only holds part of
# the window (08.11). One that blocks the trainer GPUs comes straight off a trainer-bound
# pipeline's throughput (the simulator's third column), and the model, which has no term
# for blocking, cannot see it: one reason production systems overlap or double-buffer the
# sync (lesson 09). Under the hard bound of waiting, even an overlapped sync costs
# something: a straggler's deadline counts from when the new weights *arrive* (08.14).
#
# ### The timeline
#
# The straggler system, synchronous and pipelined (FIFO); bars: what each GPU is doing;
# thin lines: new weights reaching the samplers.

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
# **Takeaway:** in the synchronous layout an engine that drew a straggler decodes until it
# is done, most of that time as a batch of one (the bar does not show how full an engine
# is); an engine that drew none idles once its body is done; every GPU waits for the slowest
# engine, and the trainers work only between batches. In the pipeline the samplers' bars
# are broken only by the admission window, and the trainers train back to back: under FIFO
# this cluster's trainers are its bottleneck.
#
# ### Per-token lag: lesson 07's runs against the simulator

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.4))
measured_lags = np.concatenate([reports["pipeline"].token_lags for reports in reports_by_round])
spec07 = lesson07_spec(base07, rates_by_round[0], lengths07.batch(base07.batch_sequences))
sim07 = simulate(sim_config(replace(spec07, admission="wait"), "pipeline", n_steps=60, warmup_steps=10, lengths=lengths07.tokens, seed=0))
bins = np.arange(base07.max_lag + 2) - 0.5
ax.hist(measured_lags, bins=bins, density=True, alpha=0.6, label="lesson 07 runs (per token, all updates)")
ax.hist(sim07.lags, bins=bins, density=True, alpha=0.6, label="simulator, hard bound (per sample, steady state)")
ax.set_xlabel("lag (updates)")
ax.set_ylabel("fraction")
ax.set_title(f"Pipeline lag, max_lag = {base07.max_lag}: measured vs simulated")
ax.legend(fontsize=8)
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
print(f"lesson 07 runs: mean {measured_lags.mean():.2f}, at the bound {100 * (measured_lags == base07.max_lag).mean():.0f}% "
      f"of tokens | simulator: mean {sim07.lags.mean():.2f}, at the bound {100 * (sim07.lags == base07.max_lag).mean():.0f}% "
      f"of samples | model (08.12): {predict('pipeline', spec07).mean_lag_steps:.2f}")
assert measured_lags.max() <= base07.max_lag and sim07.lag_max <= base07.max_lag
assert measured_lags.mean() < base07.max_lag  # a full window is the most the mean can reach

# %% [markdown]
# **Takeaway:** a trainer-bound pipeline fills its window, so the model puts the mean lag
# at the bound (08.12). The runs and the simulator (round 0's measured rates, the hard
# bound) put fewer samples there (printed above): the runs' lag is per token (a token
# sampled after an in-flight update carries the newer version) and their histogram
# includes each run's start, when the queue fills (so its mean is not section 2's median of
# the steady state; the simulator here runs round 0's rates under the hard bound, section 2's
# each round's under FIFO). For the mean lag the model is an upper
# bound here, not a forecast; the *maximum*, which is what the bound constrains, stays within
# it in the runs and in the simulator (asserted).

# %% [markdown]
# ## 4. The model against published systems
#
# The question a production engineer asks first: does the model predict what others
# measured? `layout.published` holds each comparison as data: the setting the source
# states (model, GPU kind and count, the split, the batch, the generation limit, the
# staleness knob, whether the trainer recomputes the old log-probs) and the published
# speedup over its baseline. What the sources do not state is chosen **once** and shared
# by all cases (`published.SHARED`: the answer-length distribution of section 1 with the
# case's own generation limit, 256 prompt tokens, 40% MFU, decode at 70% of peak, the
# weight sync at 125 GB/s); nothing is fitted to a case.

# %%
from course_lib.layout.published import CASES, predicted_speedup

show_source(predicted_speedup)
comparisons = [predicted_speedup(case) for case in CASES]
print(f"\n{'case':<28} {'system':<18} {'baseline':<22} {'published':>9} {'model':>6} {'model/pub':>9}  verdict")
for r in comparisons:
    c = r.case
    verdict = "within 25%" if r.within_25_percent else "MISSES"
    print(f"{c.name:<28} {c.system.label():<18} {c.baseline.label():<22} {c.published_speedup:>8.2f}x "
          f"{r.predicted_speedup:>5.2f}x {r.ratio:>9.2f}  {verdict}")

# %%
fig, ax = plt.subplots(figsize=(6.5, 4.2))
pub = np.array([r.case.published_speedup for r in comparisons])
mod = np.array([r.predicted_speedup for r in comparisons])
top = 1.1 * max(pub.max(), mod.max())
xs = np.linspace(0, top, 2)
ax.plot(xs, xs, "k-", lw=1, label="model = published")
ax.fill_between(xs, 0.75 * xs, 1.25 * xs, color="k", alpha=0.08, label="within 25%")
for r, marker in zip(comparisons, "os^vDP"):
    ax.plot(r.case.published_speedup, r.predicted_speedup, marker, ms=8, label=r.case.name)
ax.set_xlim(0, top)
ax.set_ylim(0, top)
ax.set_xlabel("published speedup (x)")
ax.set_ylabel("model's speedup, same setting (x)")
ax.set_title("The layout model against published async-vs-sync speedups")
ax.legend(fontsize=7, loc="upper left")
plt.show()

# %%
hits = [r.case.name for r in comparisons if r.within_25_percent]
misses = [r for r in comparisons if not r.within_25_percent]
assert "PipelineRL, 128 H100" in hits
assert all(r.case.known_gap for r in misses)
assert all(r.predicted_speedup < r.case.published_speedup for r in misses)
slower = [r.case.name for r in comparisons if r.predicted_speedup < 1]
print(f"within 25%: {len(hits)} of {len(comparisons)} ({', '.join(hits)}); every miss predicts less than was published, "
      f"and names what the model lacks (below); the model even predicts a slowdown for {len(slower)}: "
      + ", ".join(slower))

# %% [markdown]
# The stage times the verl documents publish say where the misses come from. The model's
# trainer seconds per step beside the published ones, and the MFU at which the model's
# trainer, with the shared lengths, would take the published time (`implied_mfu`: above 1
# is impossible, so the published run processed fewer tokens than the shared lengths give):

# %%
print(f"{'case':<28} {'model step s sys/base':>22} {'published':>16} {'model train s sys/base':>23} {'published':>16} "
      f"{'implied MFU sys/base':>21}")
for r in comparisons:
    c = r.case
    if c.published_train_s == (None, None):
        continue
    mfu_s, mfu_b = r.implied_mfu()
    print(f"{c.name:<28} {r.system.step_s:>10.0f} / {r.baseline.step_s:<9.0f} {c.published_step_s[0]:>6.0f} / "
          f"{c.published_step_s[1]:<7.0f} {r.system.train_s:>11.0f} / {r.baseline.train_s:<9.0f} "
          f"{c.published_train_s[0]:>6.0f} / {c.published_train_s[1]:<7.0f} {mfu_s:>9.2f} / {mfu_b:<9.2f}")
for r in misses:
    print(f"\n{r.case.name}: {r.case.known_gap}")

# %%
v128 = next(r for r in comparisons if r.case.name == "verl fully-async, 128 H20")
assert abs(relative_error(v128.baseline.step_s, v128.case.published_step_s[1])) < 0.25
assert all(r.implied_mfu()[0] > r.implied_mfu()[1] for r in comparisons if r.case.name.startswith("verl fully"))
assert any(r.implied_mfu()[0] > 1 for r in comparisons)
print("asserted: the model's colocated 128-GPU step is within 25% of verl's published one; in every verl "
      "fully-async case the separated trainer needs a higher MFU than the colocated one to match its published "
      "time, and in at least one an impossible MFU above 1")

# %% [markdown]
# **Takeaway, held against the world.**
#
# - **Where it agrees.** PipelineRL's comparison is a pipeline at its published split
#   (48 generating, 80 training, 64 sequences per engine) against the conventional
#   baseline that generates 32 batches per weight version on half the GPUs, then trains:
#   the model's ratio lands on the published ~2x, for the paper's own reason (the
#   conventional layout leaves each half of the cluster idle while the other works). And
#   the model's colocated verl step at 128 GPUs is close to the published one (asserted):
#   generation there is the straggler's (08.7), training is FLOPs.
# - **Where it does not.** The other verl cases miss (the FSDP2 one-step case is just
#   inside 25%, though the model predicts a slight slowdown where verl measured a gain), all
#   in the same direction: the model predicts *less* speedup, and for
#   some a slowdown (printed). The stage times say why: verl's separated trainers
#   updated as fast on half the GPUs as the colocated ones on all of them, which needs an
#   MFU above what the colocated runs show, and at 16 and 32 trainers an impossible one.
#   So those runs processed fewer tokens per step than the shared lengths give, or their
#   trainers ran far more efficiently than their colocated baselines' (verl's own notes say
#   response lengths changed with the asynchrony settings). Either way the published ratio
#   holds something a fixed-workload, FLOP-charged model does not. On the compute-poor H20
#   the model's trainer is the bottleneck of both one-step arms, so moving 4 GPUs to
#   generation buys nothing in the model; the published stage times show generation and
#   training of similar length.
# - **What the model lacks**, then: the workload's drift over a run (lengths grow or shrink
#   with the policy); a trainer whose efficiency depends on where it runs (a colocated one
#   shares its memory with the engine's weights and cache, offloads, and pays the switch
#   between generating and training every step); the engine-side pause while in-flight
#   weights are loaded; a paged engine that runs out of blocks and preempts when long
#   answers cluster; the start-up and evaluation time of a real run. Most of these cost the
#   colocated baselines more than the separated systems, the direction of the misses.
#
# PipelineRL's own analytic estimate (its appendix A.4) gives up to 1.57x at 128 GPUs with
# a batch of 128 and 44 generating GPUs, a different setting from its measured run; the
# model's figure above is for the measured one, against its conventional baseline.
#
# Not listed above, so not modelled here: AReaL's up to 2.77x (its setting is in the paper,
# not in our references), ROLL Flash's 2.24-2.72x, LlamaRL's 10.7x at 405B (an MoE or
# 405B model needs tensor and pipeline parallelism the model only approximates, section 5).

# %% [markdown]
# ## 5. A full-scale worked example: Qwen2.5-7B and 32B on 64-256 H100s
#
# The assumptions of section 1, batches of 1,024 answers, the weights synchronised at
# 125 GB/s (the rate behind verl's 0.12 s for a 7B model), `max_lag` 2 enforced by waiting
# (the calculator's default rule). The 32B model runs on tensor-parallel pairs (2 GPUs as
# one unit with twice the memory, bandwidth and FLOP/s: ideal scaling, an optimistic
# assumption), the smallest group that leaves half its memory for the KV cache.

# %%
from course_lib.layout.calc import best_tokens_per_s_vs_lag, recommend, recommendation_text

CASES_FULL = [(128, QWEN25_7B.name), (64, QWEN25_32B.name), (256, QWEN25_32B.name)]
recs = {}
for n, name in CASES_FULL:
    recs[(n, name)] = recommend(n, name, max_lag=2)
    print(f"== {name} on {n} H100s, max_lag 2, stragglers waited for")
    print(recommendation_text(recs[(n, name)]) + "\n")

# %%
ratios = {}
for case, rec in recs.items():
    p = rec.prediction
    assert rec.layout == "pipeline" and p.admission == "wait" and p.max_lag_steps <= 2 and p.feasible
    sync_best = max(q.tokens_per_s for k, q in rec.best.items() if k != "pipeline" and q is not None)
    ratios[case] = p.tokens_per_s / sync_best
assert all(1.2 < r < 3.0 for r in ratios.values()), ratios
print("pipeline over the best synchronous or one-step layout: "
      + ", ".join(f"{name} on {n}: {r:.1f}x" for (n, name), r in ratios.items())
      + " (asserted: between 1.2x and 3x, every recommended split within the lag bound)")

# %% [markdown]
# **Takeaway:** with a long tail the synchronous layouts are bound by their stragglers (a
# step of over a minute for the 7B model, most of it the engine that drew the answer at the
# generation limit); the pipeline overlaps generation and training, and with every lag held
# within 2 by waiting for stragglers it is faster by the ratios printed above. Do not read them as a match for the
# published ~2x: under waiting the pipeline's step is the straggler's time over the bound
# (08.14), so the ratio is set by the bound and grows with it (the sensitivity curve
# below), and PipelineRL ran with no bound at all. Each table prints the maximum lag beside
# the mean: the bound is on the maximum.
#
# **The split.** For the 7B case the pipeline's tokens/s at every split, with the balance
# point (08.6):

# %%
from course_lib.layout.model import balanced_samplers

rec7 = recs[(128, QWEN25_7B.name)]
s7 = rec7.spec
sw7 = sweep("pipeline", s7)
n_star = balanced_samplers(s7.n_gpus, s7.engine_full_tokens_per_s, s7.train_tokens_per_s_per_gpu)
best7 = rec7.prediction
ok = sw7.feasible
fig, ax = plt.subplots(figsize=(7.5, 3.6))
ax.plot(sw7.n_samplers[ok], sw7.tokens_per_s[ok] / 1e3, ".", color="tab:blue", label="pipeline (wait), feasible")
ax.plot(sw7.n_samplers[~ok], sw7.tokens_per_s[~ok] / 1e3, ".", mfc="none", color="tab:gray",
        label="infeasible (trainer memory)")
ax.plot(sw7.n_samplers, sw7.n_samplers * s7.engine_full_tokens_per_s / 1e3, ":", color="tab:green",
        label="production, full engines N_s p")
ax.plot(sw7.n_samplers, (s7.n_gpus - sw7.n_samplers) * s7.train_tokens_per_s_per_gpu / 1e3, "--", color="tab:orange",
        label="consumption (N - N_s) c")
ax.axvline(n_star, color="k", ls=":", lw=1, label=f"balance (08.6): N_s* = {n_star:.1f}")
ax.set_ylim(0, 1.5 * best7.tokens_per_s / 1e3)
ax.set_xlabel("sampler GPUs N_s (of 128)")
ax.set_ylabel("generated tokens/s (thousands)")
ax.set_title("Qwen2.5-7B on 128 H100s, max_lag 2 (wait): throughput against the split")
ax.legend(fontsize=8)
plt.show()
print(f"balance with full engines (08.6): N_s* = {n_star:.1f}; best feasible split: {best7.n_samplers} samplers / "
      f"{best7.n_trainers} trainers, {best7.tokens_per_s:,.0f} tokens/s, {best7.engine_batch:.0f} sequences per engine "
      f"(B_max {s7.max_batch}); stragglers set the pace: {best7.wait_binds}; trainers idle "
      f"{100 * best7.trainer_idle_fraction:.0f}%")

# %%
assert best7.wait_binds and best7.n_samplers > n_star
print("asserted: the straggler, not production = consumption, sets the best split here: waiting for it, the "
      "trainers have time to spare, so the best split moves GPUs from training to sampling, past the balance")

# %% [markdown]
# **Takeaway:** throughput is the lower of production and consumption only while nothing
# else binds. Here the hard bound binds first: the step is the straggler's generation over
# the bound (08.14), and a straggler decodes faster on a lightly loaded engine, so the best
# split spreads sampling over most of the GPUs, each running only a few sequences, with
# just enough trainers for the pace the straggler sets (printed). Read as an engineer would:
# with a 1% tail and a hard bound of 2, most of the cluster waits for one answer per
# batch; cap the answer length, loosen the bound, or drop stragglers (section 3's drop
# rule). AReaL found a 75/25 inference/training split better than 50/50 (arXiv 2505.24298,
# sec. 6.1), verl's fully-async recipe uses 96:32 on 128 GPUs for Qwen3-30B-A3B, and
# PipelineRL 48:80: the split moves with the workload and the rule, which is the point of
# computing it.
#
# **Sensitivity to the staleness bound.** The best feasible pipeline throughput at each
# `max_lag` (0 is synchronous: the pipeline with one batch admitted at a time is
# `sync_split`), for the three clusters:

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
for (n, name), t in curves.items():
    print(f"{name} on {n:>3} H100s: " + ", ".join(f"lag {k}: {v / 1e3:,.0f}k" for k, v in zip(LAGS, t)))

# %%
for t in curves.values():
    assert np.all(np.isfinite(t)) and np.all(np.diff(t) >= -1e-6 * t[:-1])
    assert t[2] - t[1] > t[1] - t[0] and t[8] > 2 * t[2]
print("more staleness never lowers the best throughput; with stragglers waited for, going from a bound of 1 to 2 "
      "gains more than going from 0 to 1, and a bound of 8 more than doubles a bound of 2, in all three clusters")

# %% [markdown]
# **Takeaway:** when every lag is held by waiting, the bound sets the pace: a straggler
# must finish within $k_{max}$ steps, so the step is about its generation time over
# $k_{max}$ (08.14) and throughput grows almost in proportion to the bound (printed), until
# production or consumption binds instead. A bound of 1 is one-step off-policy with a
# straggler in every step: it buys little. This is the staleness-throughput trade in one
# curve: the throughput the bound buys is paid in learning (lesson 02), and a rule that
# drops stragglers instead pays in a biased sample.

# %% [markdown]
# ## 6. The calculator
#
# The widgets only call `layout.calc.recommend` and print its table (the logic is in
# `course_lib`, tested): every layout's best feasible split with its mean and maximum lag,
# the admission rule, and for a layout with no feasible split the constraint that failed.
# Without a kernel, the static figure below shows the answer for a grid of cluster sizes.

# %%
show_source(recommend)

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
# A layout the constraints refuse, with the reason: FIFO on the 7B cluster, whose 1%
# stragglers run past a bound of 2 at every split:

# %%
print(recommendation_text(recommend(128, QWEN25_7B.name, max_lag=2, admission="fifo")))

# %%
SIZES = [32, 64, 128, 256]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
grid = {}
for ax, name in zip(axes, (QWEN25_7B.name, QWEN25_32B.name)):
    for lag, style in ((1, "^-"), (4, "s-")):
        grid[(name, lag)] = [recommend(n, name, max_lag=lag) for n in SIZES]
        ax.plot(SIZES, [r.prediction.tokens_per_s / 1e3 for r in grid[(name, lag)]], style, label=f"max_lag {lag}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("H100 GPUs")
    ax.set_title(f"{name}: recommended layout's throughput (wait)")
axes[0].set_ylabel("generated tokens/s (thousands)")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()
for (name, lag), rs in grid.items():
    print(f"{name}, max_lag {lag}: " + ", ".join(f"{n} GPUs {r.prediction.tokens_per_s / 1e3:,.0f}k ({r.layout})"
                                                for n, r in zip(SIZES, rs)))

# %%
for name in (QWEN25_7B.name, QWEN25_32B.name):
    tight = [r.prediction.tokens_per_s for r in grid[(name, 1)]]
    loose = [r.prediction.tokens_per_s for r in grid[(name, 4)]]
    assert tight[-1] < 1.15 * tight[0] and loose[-1] / loose[0] > tight[-1] / tight[0] and min(loose) > 2 * max(tight)
print("asserted: at a bound of 1, 8x the GPUs buy less than 15% more tokens/s; at a bound of 4 they buy more than "
      "at 1, and every cluster size is more than twice as fast as any at 1")

# %% [markdown]
# **Takeaway:** with stragglers waited for, the bound matters more than the cluster: at a
# bound of 1 the straggler sets every step and more GPUs buy almost nothing; at 4 they buy
# more, still far less than their number (the batch of 1,024 answers is fixed, and each
# step still waits for its straggler). The layout the calculator picks is printed with
# each figure.

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | tokens/s | generated answer tokens trained on per second (model: steady state; simulator: over its measured steps; runs: answer tokens of the updates after the first 10, over their wall time; drop: the kept ones) |
# | R, resident tokens | KV tokens a sequence holds on average while it runs in a paged cache (08.2) |
# | B_max | sequences one engine can hold: their resident KV fits beside the weights (08.2) |
# | sequences per engine (B_eff) | sequences an engine runs at once in steady state: B_max, or fewer when the admission window caps what is in flight (08.11) |
# | l(B), a_s, r_s, f_s, b_s | seconds of one decode step; its weight read, KV read per resident token, compute per token, and per-sequence cost (08.3) |
# | memory- / compute-bound | which side of the max in (08.3) sets the step |
# | p, c | answer tokens/s of one full sampler engine (08.4); of one trainer GPU (08.5) |
# | N_t min | the fewest trainer GPUs whose sharded Adam state fits (08.5b) |
# | production, consumption | N_s p and N_t c: what the samplers can make and the trainers can use (08.6) |
# | samplers, trainers | GPUs (or tensor-parallel units x their size) per role |
# | step s | seconds per optimizer step |
# | lag mean / max | optimizer steps between the weights a sample's first token (model, simulator) or a token (lesson 07's runs) was generated with and the update that trains on it (08.12, 08.13) |
# | admission rule: fifo, wait, drop | what the trainer does with a sample that would break the bound: take it late, wait for it, abort it (08.14, 08.15) |
# | dropped | the share of started samples a drop pipeline aborts |
# | feasible | trainers hold the model (08.5b), every lag within max_lag, at most 2% dropped |
# | model err | (model - measured) / measured tokens/s of a run, per round of lesson 07 runs |
# | trainer busy | fraction of wall time the trainer spends in updates (runs) or training (simulator) |
# | l(32), loop per live slot step | lesson 07's bare sampler step at 32 slots; what the generator loop adds per live slot step |
# | slot steps | decoding steps a sequence holds a slot: 3 prompt steps + its answer tokens (lesson 07's unit of work) |
# | load average | the machine's 1-minute load average (2 cores, shared with other jobs): above 2, timings drift |
# | published / model speedup | a system's tokens/s over its baseline's, as published and as the model predicts for the same setting |
# | implied MFU | the MFU at which the model's trainer would take a published trainer time per step |
#
# ## Summary
#
# - A sampler GPU is bounded by memory twice: a paged KV cache caps the batch at what the
#   sequences hold so far, and the weight read sets the step's floor; the step is the longer
#   of its memory and compute time, so on a compute-poor GPU (H20) it turns compute-bound
#   early. A trainer GPU is bounded by FLOPs over prompt and answer plus the extra forward
#   passes, and a split is only possible if its trainers hold the sharded Adam state.
# - Two invariants set the layout: production = consumption gives the balance (08.6); every
#   sample's lag within the bound is a constraint, and it binds on the maximum, which a
#   straggler sets. AReaL's admission rule bounds what starts; the trainer must also wait for
#   or drop what would exceed the bound, and both cost tokens/s (08.14, 08.15).
# - The model agrees with the simulator where its assumptions hold (section 3), predicted
#   the lags of lesson 07's synchronous regimes exactly (section 2; its pipeline tokens/s
#   there is a consistency check, not a forecast), and lands on PipelineRL's published ~2x;
#   it predicts less than verl published, and the published stage times show those runs'
#   separated trainers did a step's work in less time than FLOPs at the shared lengths allow
#   (section 4).
# - At full scale, with every lag held within the bound by waiting for stragglers, the
#   bound sets the pipeline's pace (08.14): its gain over the best synchronous layout grows
#   with the bound, and with a 1% tail most of the cluster waits for one answer per batch
#   (section 5). Capping the answer length, loosening the bound or dropping stragglers are
#   the levers.
#
# **Full scale.** `COURSE_SCALE=full` runs 200 updates per lesson 07 run; nothing in this
# lesson uses a GPU (the analytic and simulated sections do not change with the scale, and
# lesson 07's processes are CPU processes). Calibrating the model on a real inference engine
# is not part of the course code: it means timing the engine's decode step at several batch
# sizes and resident lengths (with the device synchronised around each timing) and the
# trainer's tokens/s, fitting $a_s$, $r_s$ and $f_s$ (`model.fit_decode_latency` fits the
# linear part), and handing a `SystemSpec` to `model.best_split`.
#
# **References.** Applied Compute, "Efficient RL" (talk: throughput under a compute budget
# and a staleness bound, production = consumption, the straggler example). W. Kwon et al.,
# *Efficient memory management for LLM serving with PagedAttention*, SOSP 2023 (the paged
# KV cache). S. Rajbhandari et al., *ZeRO*, SC 2020 (16 bytes per parameter of
# mixed-precision Adam, sharded). W. Fu et al., *AReaL*, arXiv 2505.24298, 2025 (the
# admission rule; the 75/25 split). verl documentation: fully-async and one-step-off
# recipes (settings, per-stage times and speedups). A. Piché et al., *PipelineRL*,
# arXiv 2509.19128, 2025 (sec. 5: 128 H100s, 48 generating and 80 training, ~2x over
# conventional RL) and its repository's `conf/base.yaml`. A. Grattafiori et al., *The
# Llama 3 herd of models*, arXiv 2407.21783 (38-43% MFU). Qwen2.5 model cards and
# config.json (shapes); NVIDIA H100 and H20 datasheets. J. D. C. Little, "A proof for the
# queuing formula L = lambda W", 1961. Q. Ho et al., *More effective distributed ML via a
# stale synchronous parallel parameter server*, NIPS 2013.
#
# **Exercises:** `exercises/08_cluster_layout.ipynb`. Grade with
# `course grade exercises/08_cluster_layout.ipynb`.
