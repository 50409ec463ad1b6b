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
# Lesson 07 ran RL with one generator and one trainer. A real run has $N$ GPUs and one
# question before anything else: **how many should generate and how many should train,
# and in which layout** (synchronous, one-step off-policy, or a pipeline with in-flight
# updates), to get the most RL tokens per second without training on data staler than
# the learning algorithm tolerates? (Applied Compute's talk "Efficient RL" frames it this
# way.) This lesson answers it with pen and paper: a first-principles model of what one GPU
# can generate and train, two invariants, and an optimal split. Then it checks the model
# three ways: against a discrete-event simulator of the same system, against lesson 07's
# real processes measured here, and against published cluster layouts.
#
# **Learning goals**
# 1. Derive what bounds a sampler GPU (the KV cache caps the batch, the weight read sets
#    the step's floor) and a trainer GPU (FLOPs), from a model's shape and a GPU's datasheet.
# 2. State the two invariants of an asynchronous RL cluster, production = consumption
#    and staleness within the bound, and derive the optimal split from them.
# 3. Predict tokens/s and lag for the four layouts, and find where the synchronous
#    layouts lose (the straggler) and what the staleness bound buys.
# 4. Calibrate the model on measured parts (lesson 07's sampler and trainer) and compare
#    its predictions with measured runs, with the errors stated.
# 5. Use a discrete-event simulator to see where the model's assumptions break (length
#    tails with a hard lag bound, bursty weight updates) and read a cluster's timeline.
# 6. Size a real run (Qwen2.5-7B and 32B on 64-256 H100s) with a calculator, and compare
#    its recommendation with the layouts that AReaL, verl and PipelineRL published.
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
# **One sampler GPU.** Each generated token leaves a key and a value vector per layer and
# KV head in the cache; the sequences an engine can hold at once are those whose cache
# fits beside the weights ($M$ memory, fraction $f$ usable, $W$ weight bytes, $T_{ctx}$
# tokens reserved per sequence):
#
# $$\text{kv} = 2\, n_{layers}\, n_{kv}\, d_{head}\, \text{bytes}_{kv} \qquad (08.1)$$
#
# $$B_{max} = \Big\lfloor \frac{f M - W}{\text{kv} \cdot T_{ctx}} \Big\rfloor \qquad (08.2)$$
#
# A decode step advances every sequence by one token. It reads all the weights once
# (shared by the batch) and each sequence's cache, and does $2 n_{params}$ FLOPs per
# sequence ($\beta$: memory bandwidth, $F$: peak FLOP/s):
#
# $$l(B) = a_s + b_s B, \qquad a_s = \frac{W}{\beta}, \quad b_s = \frac{\text{kv}\cdot T_{ctx}}{\beta} + \frac{2 n_{params}}{F} \qquad (08.3)$$
#
# $$p = \frac{B_{max}}{l(B_{max})} \quad \text{tokens/s of one full engine} \qquad (08.4)$$
#
# **One trainer GPU** (forward and backward: $6 n_{params}$ FLOPs per token, at a
# model-FLOPs utilisation $u$):
#
# $$c = \frac{u F}{6\, n_{params}} \qquad (08.5)$$
#
# **The balance.** $N_s$ samplers produce $P = N_s p$, $N_t = N - N_s$ trainers consume
# $C = N_t c$; the cluster runs at $\min(P, C)$, and the split that wastes neither is
#
# $$N_s^* = \frac{N c}{p + c} \qquad (08.6)$$
#
# **The straggler.** A synchronous layout waits for the batch's last answer. With
# continuous batching and $l(B)$ linear, engine $e$'s phase is exactly its step count
# $S_e$ times the weight read plus its token count $K_e$ times the per-sequence cost:
#
# $$T_{gen} = \max_e \big(a_s S_e + b_s K_e\big) \qquad (08.7)$$
#
# **The layouts** ($G$ tokens per batch, $T_{train} = G / (N_t c)$, $d$ the weight sync):
#
# $$\text{sync\_colocated:}\ \ t_{step} = T_{gen}(N) + \frac{G}{N c} + d \qquad (08.8)$$
#
# $$\text{sync\_split:}\ \ t_{step} = T_{gen}(N_s) + T_{train} + d \qquad (08.9)$$
#
# $$\text{one\_step:}\ \ t_{step} = \max\big(T_{gen}(N_s),\ T_{train} + d\big) \qquad (08.10)$$
#
# and the **pipeline**, whose engines never wait for a batch; backpressure lets at most
# $k_{max}$ batches be in flight besides the one training ($k_{max}$ = `max_lag`):
#
# $$B_{eff} = \min\Big(B_{max}, \frac{k_{max} B_{batch}}{N_s}\Big), \qquad \text{tokens/s} = \min\Big(\frac{N_s B_{eff}}{l(B_{eff})},\ N_t c\Big) \qquad (08.11)$$
#
# **Lag from Little's law** (samples in the system = rate x time in the system):
#
# $$\overline{\text{lag}} = \min\Big(k_{max},\ \frac{N_s B_{eff} + B_{batch}/2}{B_{batch}} + \frac{d}{t_{step}}\Big) \qquad (08.12)$$
#
# $$\text{lag}_{max} = \Big\lceil \overline{\text{lag}} + \frac{(L_{max} - \bar L)\, l(B_{eff})}{t_{step}} \Big\rceil \qquad (08.13)$$
#
# ### The two invariants, and where the optimal split comes from
#
# 1. **Production = consumption.** In steady state the trainer consumes exactly what the
#    samplers produce: if $P > C$ finished samples pile up (the queue grows without bound,
#    or backpressure idles the samplers); if $P < C$ the trainers wait. Throughput is
#    $\min(P, C)$, linear in $N_s$ on one side and in $N - N_s$ on the other, so its
#    maximum over $N_s$ is where the two lines cross: $N_s p = (N - N_s) c$, which is
#    (08.6). Anything else wastes GPUs on the side that is not the bottleneck.
# 2. **Staleness within the bound.** A sample started with weights $v$ and consumed by the
#    update $u$ has lag $u - v$. By Little's law the samples in the system (in flight
#    plus queued) equal the consumption rate times their time in the system, and dividing
#    that time by the step time counts the updates a sample missed: (08.12). Backpressure
#    makes the bound hard: no sample may start while $(k_{max} + 1)$ batches are started and
#    not consumed. The bound then moves the optimum: if the balanced split (08.6) needs
#    more samples in flight than $k_{max}$ batches, the samplers run below $B_{max}$
#    (08.11), and the best split is the one with the most throughput *among those whose
#    lag is within the bound*.
#
# **Pseudocode** (what `layout.best_split` does)
# ```
# for each layout in (sync_colocated, sync_split, one_step, pipeline):
#     for N_s in 1 .. N-1:                         # sync_colocated: no split
#         step time from (08.8)-(08.11); lag from (08.12)-(08.13)
#         keep N_s if lag <= max_lag
#     best[layout] = the kept N_s with the most tokens/s
# recommend the layout with the most tokens/s
# ```
#
# | equation | function in `course_lib` |
# |---|---|
# | (08.1) KV bytes per token | `layout.kv_bytes_per_token` |
# | (08.2) largest batch | `layout.max_batch` |
# | (08.3) decode step latency, roofline and fit | `layout.decode_latency_roofline`, `layout.fit_decode_latency` |
# | (08.4) engine tokens/s | `layout.engine_tokens_per_s` |
# | (08.5) trainer tokens/s per GPU | `layout.train_tokens_per_s_per_gpu` |
# | (08.6) balanced split | `layout.balanced_samplers` (`production_tokens_per_s`, `consumption_tokens_per_s`) |
# | (08.7) the straggler, exactly | `layout.generation_time_s` (`engine_schedule`, `engine_finish_times_s`) |
# | (08.8)-(08.13) the four layouts, lag | `layout.predict`; best split: `layout.sweep`, `layout.best_split` |
# | the same system, event by event | `layout_sim.simulate`, `layout_sim.gantt` |
# | lesson 07 as a 2-GPU cluster | `layout_calibrate` (`Rates`, `lesson07_spec`, `measure_round`, `compare_regimes`) |
# | the calculator | `layout_calc.recommend`, `layout_calc.recommendation_text` |

# %%
from course_lib.layout import generation_time_s, predict

show_source(generation_time_s)
show_source(predict)

# %% [markdown]
# ## 1. What one GPU can do: Qwen2.5-7B on an H100
#
# The shapes come from the models' published `config.json` (Hugging Face); the GPU from
# NVIDIA's H100 SXM datasheet: 80 GB of HBM3 at 3.35 TB/s, 989 TFLOP/s dense bf16. We
# reserve 1,024 prompt tokens plus a 7,168-token answer limit per sequence (8,192 tokens of
# KV cache), use 90% of the memory, and take 40% MFU for training.

# %%
from course_lib.layout import (
    H100_SXM,
    QWEN25_7B,
    QWEN25_32B,
    decode_latency_roofline,
    engine_tokens_per_s,
    kv_bytes_per_token,
    max_batch,
    train_tokens_per_s_per_gpu,
)

CONTEXT = 8192
print(f"{'model':<12} {'weights GB':>10} {'KV KB/token':>12} {'B_max':>6} {'a_s ms':>7} {'b_s ms':>7} "
      f"{'p tok/s':>8} {'c tok/s':>8} {'p/c':>5}")
for shape in (QWEN25_7B, QWEN25_32B):
    try:
        bmax = max_batch(shape, H100_SXM, CONTEXT)
    except ValueError as exc:
        print(f"{shape.name:<12} {shape.weight_bytes / 1e9:>10.1f}  does not fit one H100: {str(exc).split(':')[0]}")
        continue
    a_s, b_s = decode_latency_roofline(shape, H100_SXM, CONTEXT)
    p, c = engine_tokens_per_s(bmax, a_s, b_s), train_tokens_per_s_per_gpu(shape, H100_SXM)
    print(f"{shape.name:<12} {shape.weight_bytes / 1e9:>10.1f} {kv_bytes_per_token(shape) / 1e3:>12.1f} {bmax:>6} "
          f"{1e3 * a_s:>7.2f} {1e3 * b_s:>7.3f} {p:>8,.0f} {c:>8,.0f} {p / c:>5.2f}")

# %%
a7, b7 = decode_latency_roofline(QWEN25_7B, H100_SXM, CONTEXT)
bmax7 = max_batch(QWEN25_7B, H100_SXM, CONTEXT)
batches = np.arange(1, bmax7 + 1)
fig, ax1 = plt.subplots(figsize=(7.5, 3.6))
ax1.plot(batches, 1e3 * (a7 + b7 * batches), color="tab:blue")
ax1.set_xlabel("sequences in flight B")
ax1.set_ylabel("decode step l(B) (ms)", color="tab:blue")
ax2 = ax1.twinx()
ax2.plot(batches, batches / (a7 + b7 * batches), color="tab:orange")
ax2.set_ylabel("tokens/s of one engine", color="tab:orange")
ax1.axvline(bmax7, color="k", ls=":", lw=1)
ax1.set_title(f"Qwen2.5-7B on one H100 (roofline, {CONTEXT} tokens of KV per sequence): B_max = {bmax7}")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** the step's floor is the weight read ($a_s$, 4.5 ms for 15 GB at 3.35 TB/s);
# each extra sequence adds its KV read, so tokens/s climbs with the batch until the KV cache
# is full at $B_{max}$: memory, not FLOPs, caps a sampler. The 32B model's 65.5 GB of weights
# leave room for only 3 sequences on one 80 GB GPU: it needs tensor-parallel groups (section 4).

# %% [markdown]
# ## 2. The lesson 07 cluster, measured: calibrate, predict, compare
#
# Lesson 07's generator process (pinned to core 0) and trainer (core 1) are, for the model,
# a cluster of **2 GPUs: 1 sampler, 1 trainer**. The mapping, part by part
# (`course_lib.layout_calibrate`):
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
# stay those of the warm start. With learning on, lengths drift within a run (in 60-update
# runs of lesson 07's regimes made while writing this lesson, the last updates averaged 4
# to 16 tokens per answer, from the warm start's 11): then the model needs the current
# lengths, which it cannot predict.
#
# First the warm start (lesson 07's, same seeds), the sampler's step against the number of
# slots (08.3) and the policy's answer lengths:

# %%
import torch

from course_lib.layout import LengthDist, fit_decode_latency
from course_lib.layout_calibrate import sample_answer_tokens, sequence_steps, time_decode_steps
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
assert a07 > 0 and b07 > 0 and a07 > 10 * b07, (a07, b07)
print("the sampler's step has a large fixed part and a small per-slot part (a_s > 10 b_s): as on a GPU, "
      "a bigger batch is nearly free per step")

# %% [markdown]
# **The runs.** Three rounds; each round times the generator's parts in this process, then
# runs `sync`, `one_step` and `pipeline` back to back (50 updates each, `lr = 0`), so the
# calibration and the runs it predicts share the machine's load of the moment. A run's
# **steady state** leaves out its first 10 updates (the pipeline's queue fills up there).

# %%
from dataclasses import replace

from course_lib.layout_calibrate import REGIMES, compare_regimes, lesson07_spec, measure_round, relative_error
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
assert abs(med_err["pipeline"]) < 0.25, med_err
print("asserted: the lags of sync (0) and one_step (1) are what the model says; model and runs rank the "
      "regimes alike (the pipeline fastest); the model's pipeline tokens/s is within 25% of the measured "
      "(median over rounds)")

# %% [markdown]
# **What holds, what does not.** The table varies from run to run of this notebook; the
# assertions above are what held on every re-run while it was written. The verdict for
# this run, against the 15% goal:

# %%
# NBVAL_IGNORE_OUTPUT
for regime in REGIMES:
    e = med_err[regime]
    print(f"{regime:<9} median model error {100 * e:+.0f}%: " + ("within 15%" if abs(e) <= 0.15 else "NOT within 15%")
          + f" (rounds: {', '.join(f'{100 * x:+.0f}%' for x in cmp[regime].model_errors)})")
print(f"pipeline lag: model {cmp['pipeline'].model_lag:.2f} (per sample, at the bound), simulator "
      f"{cmp['pipeline'].sim_lag:.2f} (per sample), runs {cmp['pipeline'].measured_lag:.2f} (per token)")

# %% [markdown]
# What we saw over the re-runs made while writing this lesson:
#
# - **Lag of the synchronous layouts**: exact. `sync` has lag 0 and `one_step` lag 1 (after
#   the first update) in the model, the simulator and every run (asserted).
# - **Pipeline tokens/s**: the model says the trainer is the bottleneck (the sampler
#   produces more than the trainer consumes: the rounds' lines above), so tokens/s = $c$.
#   The runs' trainers are busy most of the time, not all of it (the last column: an update
#   also waits for its groups to come through the pipe), so the model is a little high or
#   low by round. On a quiet machine (load average about 1) the median error was within a
#   few percent; it is asserted at 25%, because the two shared cores drift.
# - **`sync` and `one_step` tokens/s**: the model is optimistic, by an amount that grows
#   with the machine's load. On a quiet machine (load average about 1, the trainer near
#   21k slot steps/s) the median error was mostly within 15% (single rounds from -5% to
#   +25%; `bench/bench_layout.py` has five more rounds); in runs made while other jobs
#   shared the two cores (the trainer at 10-14k slot steps/s, load averages of 1 to 3) it
#   was roughly 15-55%. This run's verdict is printed above. The generator's steps ran
#   slower inside the run than the same step timed alone in this process, and the
#   hand-offs (a batch through the pipe, a weight pull, waking a process) grow; in the
#   pipeline they hide behind the trainer, in the synchronous layouts every millisecond of
#   them is on the critical path. Interleaving the calibration with the runs shares the
#   load between them; it does not make a process that is preempted mid-step predictable.
# - **Pipeline lag**: the model says the bound, $k_{max} = 8$ (a trainer-bound pipeline
#   fills its backpressure window). The runs show less: their lag is per *token* (tokens
#   sampled after an in-flight update carry the newer version), and with production not
#   far above consumption, random answer lengths leave the window less than full at times.
#   The simulator, which plays the same system per sample, lands in between (at the bound
#   only when the trainer is much the slower). The model's lag is an upper bound here, not
#   a forecast.
# - **The simulator** agrees with the model on `sync` and `pipeline` tokens/s (the same
#   assumptions, played out). On `one_step` it is faster: its engines start the next
#   batch in the slots the current batch's short answers free while the long ones finish;
#   lesson 07's generator, like (08.10), waits until every slot is free.

# %% [markdown]
# ## 3. Simulator and model at full scale: where they agree, where they part
#
# From here on the hardware is the H100 of section 1 and the model is Qwen2.5-7B. First the
# model's home ground: answers of mixed but not heavy-tailed lengths (log-normal, 99th
# percentile 2x the median), 16 GPUs, a staleness bound of 4, every layout at the
# model's best split, the simulator running 24 optimizer steps of the same system (the
# first 8 not measured).
# The model bounds the *mean* lag (08.12), so the simulator's pipeline applies the same
# admission rule and consumes finished samples first come, first served
# (`enforce_max_lag=False`); what a hard bound on every sample costs comes next.

# %%
from course_lib.layout import best_split, lognormal_lengths, spec_from_hardware
from course_lib.layout_sim import sim_config, simulate

mild = lognormal_lengths(1000, 2.0, seed=0, max_tokens=4096)
spec16 = spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=16, batch_samples=256, answer_tokens=mild.batch(256, seed=0),
                            context_tokens=1024 + 4096, weight_sync_s=QWEN25_7B.weight_bytes / 125e9, max_lag=4)
agree = {}
print(f"{'layout':<15} {'samplers':>8} {'model tok/s':>12} {'sim tok/s':>10} {'diff':>6} {'model lag mean/max':>19} "
      f"{'sim lag mean/max':>17}")
for layout in ("sync_colocated", "sync_split", "one_step", "pipeline"):
    p = best_split(layout, spec16).prediction
    s = simulate(sim_config(replace(spec16, n_samplers=None if layout == "sync_colocated" else p.n_samplers), layout,
                            n_steps=24, warmup_steps=8, lengths=mild.tokens, seed=1, enforce_max_lag=False))
    agree[layout] = relative_error(s.tokens_per_s, p.tokens_per_s)
    print(f"{layout:<15} {p.n_samplers:>8} {p.tokens_per_s:>12,.0f} {s.tokens_per_s:>10,.0f} "
          f"{100 * agree[layout]:>+5.1f}% {p.mean_lag_steps:>12.2f} / {p.max_lag_steps:<4} {s.lag_mean:>11.2f} / {s.lag_max:<4}")

# %%
assert all(abs(e) < 0.05 for e in agree.values()), agree
print("where its assumptions hold (no heavy tail), the model is within 5% of the simulator for all four layouts")

# %% [markdown]
# The same cluster with a tighter bound, `max_lag` = 2. Now the bound, not the KV cache,
# limits what is in flight (08.11: $B_{eff} = k_{max} B_{batch} / N_s$ is below $B_{max}$):

# %%
spec16_2 = replace(spec16, max_lag=2)
p2 = best_split("pipeline", spec16_2).prediction
s2 = simulate(sim_config(replace(spec16_2, n_samplers=p2.n_samplers), "pipeline", n_steps=24, warmup_steps=8,
                         lengths=mild.tokens, seed=1, enforce_max_lag=False))
print(f"pipeline, max_lag 2, {p2.n_samplers} samplers: model {p2.tokens_per_s:,.0f} tokens/s with {p2.engine_batch:.1f} "
      f"sequences per engine; simulator {s2.tokens_per_s:,.0f} tokens/s with {s2.sampler_mean_in_flight:.1f} per engine, "
      f"trainers busy {100 * s2.trainer_busy_frac:.0f}%")
assert s2.tokens_per_s < 0.95 * p2.tokens_per_s and s2.sampler_mean_in_flight < p2.engine_batch

# %% [markdown]
# **Takeaway:** where its assumptions hold (no heavy tail, and at `max_lag` 4 the samplers
# have some capacity to spare) the model is within a few percent of the simulator (asserted:
# 5%); the differences are the simulator drawing every batch's lengths afresh, the model
# using one batch. At `max_lag` 2 the model is optimistic: (08.11) gives all of the window
# but the batch in training to sequences in flight, but finished samples waiting for the
# trainer hold part of it too, so the engines run fewer sequences than the model says
# (printed), and at a split where production at the cap only just meets consumption, the
# trainers then wait. A tight bound costs more than (08.11) says.

# %% [markdown]
# ### The straggler
#
# The talk's example: 99% of the samples are done in about 40 s, the last 1% need about
# 80 s more. Here: 8 GPUs (4 samplers, 4 trainers), batches of 400 answers, 100 per engine;
# the body's lengths are evenly spread from 200 to 3,000 tokens and 1% of the answers are
# long enough to keep an engine busy 80 s after its body is done
# (`layout.tail_tokens_for_extra_s`). The step costs are section 1's (8,192 tokens of KV per
# sequence: a paged cache holds what a sequence has written, and the tail's few sequences
# fit beside the batch). One engine's schedule (08.7):

# %%
from course_lib.layout import body_tail_lengths, deal_to_engines, engine_finish_times_s, tail_tokens_for_extra_s

spec8 = spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=8, n_samplers=4, batch_samples=400, answer_tokens=1000,
                           context_tokens=CONTEXT, max_lag=2)
BODY_MAX = 3000
tail = tail_tokens_for_extra_s(80.0, BODY_MAX, 1, spec8.a_s, spec8.b_s)
straggly = body_tail_lengths(400, 200, BODY_MAX, tail, tail_fraction=0.01)
spec8 = replace(spec8, answer_tokens=straggly.batch(400, seed=0))
share = deal_to_engines(spec8.lengths_tokens, 4)[0]
finish = np.sort(engine_finish_times_s(share, spec8.max_batch, spec8.a_s, spec8.b_s))
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

# %% [markdown]
# **Takeaway:** the body is done in about 40 s; the one long answer keeps the engine (and,
# in a synchronous layout, the whole cluster) busy for about 80 s more, running a batch of
# one: every step pays the full weight read ($a_s$) for a single token.
#
# What each layout makes of it, model against simulator (the simulator run twice for the
# pipeline: with the hard lag bound (R2: the trainer waits for a straggler whose lag would
# exceed `max_lag`) and without it (FIFO: a straggler is consumed late, its lag unbounded)):

# %%
# NBVAL_IGNORE_OUTPUT
tail_rows = {}
with progress(4, "straggler: 4 simulations", unit="run") as bar:
    for layout, enforce in (("sync_split", True), ("one_step", True), ("pipeline", True), ("pipeline", False)):
        p = predict(layout, spec8)
        s = simulate(sim_config(spec8, layout, n_steps=40, warmup_steps=8, lengths=straggly.tokens, seed=0,
                                enforce_max_lag=enforce))
        tail_rows[(layout, enforce)] = (p, s)
        bar.update()
print(f"{'layout':<10} {'lag bound':<10} {'model tok/s':>11} {'sim tok/s':>10} {'model lag mean/max':>19} "
      f"{'sim lag mean/max':>17} {'sim trainer busy':>17}")
for (layout, enforce), (p, s) in tail_rows.items():
    print(f"{layout:<10} {'hard' if enforce else 'FIFO':<10} {p.tokens_per_s:>11,.0f} {s.tokens_per_s:>10,.0f} "
          f"{p.mean_lag_steps:>12.2f} / {p.max_lag_steps:<4} {s.lag_mean:>11.2f} / {s.lag_max:<4} "
          f"{100 * s.trainer_busy_frac:>16.0f}%")

# %%
(ps, ss), (po, so) = tail_rows[("sync_split", True)], tail_rows[("one_step", True)]
(pp, sp_hard), (_, sp_fifo) = tail_rows[("pipeline", True)], tail_rows[("pipeline", False)]
assert abs(relative_error(ss.tokens_per_s, ps.tokens_per_s)) < 0.05
assert pp.tokens_per_s > 3 * ps.tokens_per_s and sp_fifo.tokens_per_s > 3 * ss.tokens_per_s
assert abs(relative_error(sp_fifo.tokens_per_s, pp.tokens_per_s)) < 0.10
assert sp_hard.lag_max <= 2 and sp_hard.tokens_per_s < 0.75 * sp_fifo.tokens_per_s
assert sp_fifo.lag_max > 2 * spec8.max_lag
print("asserted: sync_split, model = simulator within 5% (08.7 is exact for the straggler); the pipeline "
      "is more than 3x faster in both; without a hard bound the model's pipeline tokens/s holds (10%), but the "
      "stragglers' lag goes past twice the bound; with the hard bound the lag holds and the pipeline loses "
      "more than a quarter of its tokens/s, waiting for stragglers: a cost the model (08.11) does not see")

# %% [markdown]
# **Takeaway:** the straggler is the synchronous layouts' whole problem: the model
# charges it exactly (08.7) and agrees with the simulator. The pipeline hides it, as the
# model says, *only if a straggler may be consumed late*: its lag is then far past the
# bound (the model's (08.13) estimate is in the table). Enforce the bound strictly and the
# trainer waits for the straggler instead, at a cost in tokens/s that the steady-state
# model misses: the place to trust the simulator, or to cap answer lengths, or to let the
# bound apply to the mean.
#
# **Bursty weight updates.** The model's pipeline ignores the weight sync $d$ (it is
# overlapped). If sending the weights blocks the trainer GPUs (no double buffer), each
# step pays it:

# %%
# NBVAL_IGNORE_OUTPUT
burst = {}
for d in (0.0, 10.0, 30.0):
    spec_d = replace(spec8, weight_sync_s=d)
    p = predict("pipeline", spec_d)
    s_free = simulate(sim_config(spec_d, "pipeline", n_steps=30, warmup_steps=8, lengths=straggly.tokens, seed=0,
                                 enforce_max_lag=False))
    s_block = simulate(sim_config(spec_d, "pipeline", n_steps=30, warmup_steps=8, lengths=straggly.tokens, seed=0,
                                  enforce_max_lag=False, sync_blocks_trainer=True))
    burst[d] = (p.tokens_per_s, s_free.tokens_per_s, s_block.tokens_per_s, p.step_s)
    print(f"weight sync {d:>4.0f} s (step {p.step_s:.0f} s): model {p.tokens_per_s:,.0f} tok/s, simulator "
          f"{s_free.tokens_per_s:,.0f} overlapped, {s_block.tokens_per_s:,.0f} when the sync blocks the trainers")

# %%
assert burst[30.0][2] < burst[0.0][2] * 0.9 and abs(relative_error(burst[30.0][1], burst[30.0][0])) < 0.15
print("a blocking 30 s sync costs the pipeline more than 10% of its tokens/s in the simulator; overlapped, "
      "the model's figure holds (15%)")

# %% [markdown]
# **Takeaway:** a weight sync that is overlapped costs the pipeline (almost) nothing, as
# the model assumes. One that blocks the trainer GPUs comes off their time: here the
# trainers had slack (the samplers are the bottleneck of this cluster), so a 10 s sync hid
# in it, and a 30 s one did not. The model, which has no term for it, cannot tell the two
# apart: one reason production systems overlap or double-buffer the sync (lesson 09).
#
# ### The timeline
#
# The same straggler system, 12 steps, synchronous and pipelined; bars: what each GPU is
# doing; thin lines: new weights reaching the samplers.

# %%
fig, axes = plt.subplots(2, 1, figsize=(11, 6.5))
for ax, layout in zip(axes, ("sync_split", "pipeline")):
    r = simulate(sim_config(spec8, layout, n_steps=12, warmup_steps=2, lengths=straggly.tokens, seed=0, enforce_max_lag=False))
    from course_lib.layout_sim import gantt

    gantt(r, ax=ax, until_s=600.0)
fig.suptitle("Simulated timeline, 4 samplers + 4 trainers, 1% stragglers (first 600 s)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** in the synchronous layout an engine that drew a straggler decodes for about
# 120 s, most of it a batch of one (the bar does not show how full an engine is); an engine
# that drew none idles after about 40 s; every GPU waits for the slowest engine, and the
# trainers work only between batches. In the pipeline the samplers' bars are solid and the
# trainers train every step, with time to spare: this cluster's samplers are its bottleneck.
#
# ### Per-token lag: lesson 07's runs against the simulator

# %%
fig, ax = plt.subplots(figsize=(7.5, 3.4))
measured_lags = np.concatenate([reports["pipeline"].token_lags for reports in reports_by_round])
spec07 = lesson07_spec(base07, rates_by_round[0], lengths07.batch(base07.batch_sequences))
sim07 = simulate(sim_config(spec07, "pipeline", n_steps=60, warmup_steps=10, lengths=lengths07.tokens, seed=0))
bins = np.arange(base07.max_lag + 2) - 0.5
ax.hist(measured_lags, bins=bins, density=True, alpha=0.6, label="lesson 07 runs (per token, all updates)")
ax.hist(sim07.lags, bins=bins, density=True, alpha=0.6, label="simulator (per sample, steady state)")
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
assert measured_lags.mean() < base07.max_lag  # the model's lag (08.12) is an upper bound here

# %% [markdown]
# **Takeaway:** the model puts every sample at the bound (a trainer-bound pipeline fills its
# window). The simulator, playing the same system with each round's measured rates, puts
# anywhere from a few percent to nearly all of its samples there (printed above): the
# further production exceeds consumption (the rounds' lines in section 2; under load the
# trainer slows most), the fuller the window. The runs' mean per-token lag stays below the
# bound (asserted; the means are printed above and in section 2): a token sampled after an
# in-flight update carries the newer version, and the histogram includes each run's start
# (the queue filling). For lag, the model is an
# upper bound, not a forecast.

# %% [markdown]
# ## 4. A full-scale worked example: Qwen2.5-7B and 32B on 64-256 H100s
#
# Assumptions, stated: H100 SXM as in section 1; answers log-normal with a mean of 2,000
# tokens and a 99th percentile 8x the median, capped at 16,384 (a reasoning workload's long
# tail); prompts of 1,024 tokens, so 17,408 tokens of KV cache reserved per sequence;
# batches of 1,024 answers; 40% MFU for training; the weights synchronised at 125 GB/s (the
# rate behind verl's 0.12 s for a 7B model). The 32B model runs on tensor-parallel pairs
# (2 GPUs as one unit with twice the memory, bandwidth and FLOP/s: ideal scaling, an
# optimistic assumption), the smallest group that leaves half its memory for the KV cache.

# %%
from course_lib.layout_calc import best_tokens_per_s_vs_lag, recommend, recommendation_text

CASES = [(128, QWEN25_7B.name), (64, QWEN25_32B.name), (256, QWEN25_32B.name)]
recs = {}
for n, name in CASES:
    recs[(n, name)] = recommend(n, name, max_lag=2)
    print(f"== {name} on {n} H100s, max_lag 2")
    print(recommendation_text(recs[(n, name)]) + "\n")

# %%
rec7 = recs[(128, QWEN25_7B.name)]
assert rec7.layout == "pipeline"
assert all(rec.prediction.tokens_per_s > 1.5 * max(p.tokens_per_s for k, p in rec.best.items() if k != "pipeline" and p)
           for rec in recs.values())
print("in every case the pipeline is recommended, at more than 1.5x the best synchronous or one-step layout")

# %% [markdown]
# **Takeaway:** with a long tail the synchronous layouts are bound by their stragglers
# (a step of over a minute for the 7B model, most of it one long answer per engine); the
# pipeline keeps the engines busy and is faster at a lag of at most 2: 1.8x for the 32B
# model on 64 GPUs (its TP pairs hold only 17 sequences each, so the pipeline is short of
# samplers: mean lag 0.94), about 6x for the 7B model on 128 and the 32B on 256.
#
# **The split, and the published ones.** For the 7B case the pipeline's tokens/s at every
# split, with the balance point (08.6):

# %%
from course_lib.layout import balanced_samplers, sweep

s7 = rec7.spec
sw = sweep("pipeline", s7)
p_full = s7.engine_full_tokens_per_s
c_gpu = s7.train_tokens_per_s_per_gpu
n_star = balanced_samplers(s7.n_gpus, p_full, c_gpu)
best7 = rec7.prediction
b_eff = np.minimum(s7.max_batch, s7.max_lag * s7.batch_samples / sw.n_samplers)  # (08.11)
production = sw.n_samplers * engine_tokens_per_s(b_eff, s7.a_s, s7.b_s)
fig, ax = plt.subplots(figsize=(7.5, 3.6))
ax.plot(sw.n_samplers, sw.tokens_per_s / 1e3, color="tab:blue", lw=3, alpha=0.5, label="pipeline, max_lag 2 (08.11)")
ax.plot(sw.n_samplers, sw.n_samplers * p_full / 1e3, ":", color="tab:green", label="production, full engines N_s p")
ax.plot(sw.n_samplers, production / 1e3, "--", color="tab:green", label="production at the lag bound")
ax.plot(sw.n_samplers, (s7.n_gpus - sw.n_samplers) * c_gpu / 1e3, "--", color="tab:orange",
        label="consumption (N - N_s) c")
ax.axvline(n_star, color="k", ls=":", lw=1, label=f"balance (08.6): N_s* = {n_star:.1f}")
ax.set_ylim(0, 1.3 * best7.tokens_per_s / 1e3)
ax.set_xlabel("sampler GPUs N_s (of 128)")
ax.set_ylabel("generated tokens/s (thousands)")
ax.set_title("Qwen2.5-7B on 128 H100s: throughput against the split")
ax.legend(fontsize=8)
plt.show()
i7 = best7.n_samplers - 1
print(f"balance with full engines (08.6): N_s* = {n_star:.1f}; best split under max_lag 2: {best7.n_samplers} samplers / "
      f"{best7.n_trainers} trainers ({100 * best7.n_samplers / s7.n_gpus:.0f}% sampling), {best7.tokens_per_s:,.0f} "
      f"tokens/s, {b_eff[i7]:.1f} sequences per engine (B_max {s7.max_batch})")
print(f"there: production {production[i7]:,.0f} vs consumption {best7.n_trainers * c_gpu:,.0f} tokens/s; one GPU off "
      f"the best split loses {100 * best_split('pipeline', s7).off_by_one_loss_fraction:.1f}%")

# %% [markdown]
# **Takeaway:** throughput is the lower of production and consumption and peaks where
# they cross, as the first invariant says. The second invariant moves the crossing: with
# at most 2 batches in flight, 105 samplers hold under 20 sequences each, well below
# $B_{max}$, so each engine makes fewer tokens/s than a full one and the best split has
# more samplers (105, 82%) than the full-engine balance (08.6, about 99). Published
# layouts are in the same region: AReaL found a 75/25 inference/training split better than
# 50/50 (arXiv 2505.24298, sec. 6.1), verl's fully-async recipe uses 96:32 (75%) on 128
# GPUs for Qwen3-30B-A3B (verl docs), and PipelineRL ran on 128 H100s (arXiv 2509.19128;
# its split is not quoted in our references). Our model puts more on sampling because its
# lengths are long (mean 2,000, tail to 16k) and its trainers run at an optimistic 40% MFU
# with no sequence-packing losses; a slower trainer moves the balance towards training.
#
# **Sensitivity to the staleness bound.** The best pipeline throughput at each `max_lag`
# (0 is synchronous: the pipeline with one batch admitted at a time is `sync_split`), for
# the three clusters:

# %%
LAGS = np.arange(0, 9)
curves = {case: best_tokens_per_s_vs_lag(rec.spec, LAGS) for case, rec in recs.items()}
fig, ax = plt.subplots(figsize=(7.5, 3.8))
for (n, name), t in curves.items():
    ax.plot(LAGS, t / 1e3, "o-", label=f"{name}, {n} H100s")
ax.set_xlabel("max staleness max_lag (optimizer steps)")
ax.set_ylabel("best generated tokens/s (thousands)")
ax.set_title("Best pipeline throughput against the staleness bound")
ax.legend(fontsize=8)
plt.show()
for (n, name), t in curves.items():
    print(f"{name} on {n:>3} H100s: " + ", ".join(f"lag {k}: {v / 1e3:,.0f}k" for k, v in zip(LAGS, t)))

# %%
for t in curves.values():
    assert np.all(np.diff(t) >= -1e-6 * t[:-1]) and t[1] > 2 * t[0]
print("more staleness never lowers the best throughput, and allowing a lag of 1 already more than doubles it "
      "over the synchronous 0 in all three clusters")

# %% [markdown]
# **Takeaway:** the step from lag 0 to lag 1 is the largest in every cluster (the samplers
# run while the trainers train, and a batch's worth stays in flight); each further step
# adds less, and the curve is flat once the samplers can stay full (from lag 1-2 for the
# 32B clusters, about 6 for the 7B one, whose faster engines need more sequences in
# flight). Past the knee more staleness buys no throughput and only costs learning
# (lesson 02).

# %% [markdown]
# ## 5. The calculator
#
# The widgets only call `layout_calc.recommend` and print its table (the logic is in
# `course_lib`, tested). Without a kernel, the static figure below shows the answer for a
# grid of cluster sizes.

# %%
show_source(recommend)

# %%
# NBVAL_IGNORE_OUTPUT
import ipywidgets as widgets

from course_lib.layout_calc import MODELS


def show_layout(n_gpus: int, model_name: str, batch: int, max_lag: int, mean_tokens: int, tail: float) -> None:
    try:
        rec = recommend(n_gpus, model_name, batch_samples=batch, max_lag=max_lag, mean_tokens=mean_tokens,
                        p99_over_median=tail)
    except ValueError as exc:
        print(f"no layout: {exc}")
        return
    print(recommendation_text(rec))


widgets.interactive(
    show_layout,
    n_gpus=widgets.IntSlider(value=128, min=16, max=512, step=16, description="GPUs"),
    model_name=widgets.Dropdown(options=list(MODELS), value=QWEN25_7B.name, description="model"),
    batch=widgets.IntSlider(value=1024, min=128, max=4096, step=128, description="batch"),
    max_lag=widgets.IntSlider(value=2, min=0, max=8, description="max_lag"),
    mean_tokens=widgets.IntSlider(value=2000, min=250, max=8000, step=250, description="mean tokens"),
    tail=widgets.FloatSlider(value=8.0, min=1.0, max=16.0, step=0.5, description="p99/median"),
)

# %%
SIZES = [32, 64, 128, 256, 512]
fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
for ax, name in zip(axes, (QWEN25_7B.name, QWEN25_32B.name)):
    for lag, style in ((0, "s-"), (1, "^-"), (2, "o-"), (8, "d-")):
        ax.plot(SIZES, [recommend(n, name, max_lag=lag).prediction.tokens_per_s / 1e3 for n in SIZES], style,
                label=f"max_lag {lag}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("H100 GPUs")
    ax.set_title(f"{name}: recommended layout's throughput")
axes[0].set_ylabel("generated tokens/s (thousands)")
axes[0].legend(fontsize=8)
fig.tight_layout()
plt.show()
for name in (QWEN25_7B.name, QWEN25_32B.name):
    for lag in (0, 2):
        recs_n = [recommend(n, name, max_lag=lag) for n in SIZES]
        print(f"{name}, max_lag {lag}: " + ", ".join(f"{n} GPUs {r.prediction.tokens_per_s / 1e3:,.0f}k ({r.layout})"
                                                    for n, r in zip(SIZES, recs_n)))
print()
print(recommendation_text(recommend(128, QWEN25_7B.name, max_lag=1)))

# %% [markdown]
# **Takeaway:** at a lag of 2 throughput grows with the cluster (the 32B model's about
# doubles with each doubling up to 256 GPUs; the 7B model's grows more slowly, the fixed
# batch of 1,024 spread over more samplers); a synchronous layout (lag 0) hardly grows at
# all: its step is set by the longest answer, which more GPUs do not shorten.

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | tokens/s | generated answer tokens trained on per second (model: steady state; simulator: over its measured steps; runs: answer tokens of the updates after the first 10, over their wall time) |
# | B_max | sequences one engine can hold: their KV cache fits beside the weights (08.2) |
# | sequences per engine (B_eff) | sequences an engine runs at once in steady state: B_max, or fewer when the lag bound caps what is in flight (08.11) |
# | l(B), a_s, b_s | seconds of one decode step with B sequences; its fixed part (the weight read) and per-sequence part (08.3) |
# | p, c | tokens/s of one full sampler engine (08.4); tokens/s one trainer GPU consumes (08.5) |
# | production, consumption | N_s p and N_t c: what the samplers can make and the trainers can use (08.6) |
# | samplers, trainers | GPUs (or tensor-parallel units x their size) per role |
# | step s | seconds per optimizer step |
# | lag mean / max, at the bound | optimizer steps between the weights a sample (model, simulator) or token (lesson 07's runs) was generated with and the update that trains on it (08.12, 08.13); at the bound: the share whose lag equals max_lag |
# | model err | (model - measured) / measured tokens/s of a run, per round of lesson 07 runs |
# | trainer busy | fraction of wall time the trainer spends in updates (runs) or training (simulator) |
# | l(32), loop per live slot step | lesson 07's bare sampler step at 32 slots; what the generator loop adds per live slot step |
# | slot steps | decoding steps a sequence holds a slot: 3 prompt steps + its answer tokens (lesson 07's unit of generation and training work) |
# | load average | the machine's 1-minute load average (2 cores, shared with other jobs): above 2, timings drift |
# | max_lag | the staleness bound: backpressure admits no sample while (max_lag + 1) batches are started and not consumed |
# | off-by-one loss | the tokens/s lost by a split one GPU away from the best |
#
# ## Summary
#
# - A sampler GPU is bounded by memory: the KV cache caps the batch, the weight read sets
#   the step's floor, and a bigger batch is nearly free per step until the cache is full.
#   A trainer GPU is bounded by FLOPs.
# - Two invariants set the layout: production = consumption gives the split (08.6); the
#   staleness bound limits what may be in flight (08.11-08.12) and can move the optimum.
# - Synchronous layouts pay for every straggler (08.7); a pipeline hides them, at a lag
#   that a hard bound can only keep by waiting (the simulator shows the cost).
# - Calibrated on lesson 07's measured parts, the model predicted the lags of the
#   synchronous regimes exactly and, on a quiet machine, the tokens/s of all three regimes
#   mostly within 15%; the busier the machine, the more optimistic it was for the
#   synchronous regimes (up to roughly 55%), whose critical path holds overheads the model
#   leaves out. Its pipeline lag is an upper bound.
# - At full scale (Qwen2.5-7B on 128 H100s, long answers) the model recommends a pipeline
#   with about four fifths of the GPUs sampling, in the region of AReaL's and verl's
#   published 75/25 splits.
#
# **Full scale.** `COURSE_SCALE=full` runs 200 updates per lesson 07 run (the analytic and
# simulated sections do not change with the scale). On a GPU machine, the same calibration
# applies to a real inference engine: time its decode step at several batch sizes
# (`layout.fit_decode_latency`) and the trainer's tokens/s, then `layout.best_split`.
#
# **References.** Applied Compute, "Efficient RL" (talk: throughput under a compute budget
# and a staleness bound, production = consumption, the straggler example). W. Fu et al.,
# *AReaL*, arXiv 2505.24298, 2025 (admission rule bounding staleness; the 75/25 split).
# verl fully-async documentation (96:32 split, staleness threshold, 0.12 s 7B weight
# update). A. Piché et al., *PipelineRL*, arXiv 2509.19128, 2025 (128 H100s). Qwen2.5
# model cards and config.json (shapes); NVIDIA H100 datasheet. J. D. C. Little, "A proof
# for the queuing formula L = lambda W", 1961. Q. Ho et al., *More effective distributed
# ML via a stale synchronous parallel parameter server*, NIPS 2013.
#
# **Exercises:** `exercises/08_cluster_layout.ipynb`. Grade with
# `course grade exercises/08_cluster_layout.ipynb`.
