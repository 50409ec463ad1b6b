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
# # 07 · Pipeline RL: in-flight weight updates
#
# In reinforcement learning of language models, **generation dominates**: the policy
# writes its answers one token at a time, and the answers have a **long tail of
# lengths**. A synchronous RL loop generates a batch, waits for its *longest* answer,
# trains, and only then generates again: while the longest answer is being written, most
# decoding slots sit empty, and while the trainer trains, the generator sits idle.
# **Pipeline RL** (Piché et al. 2025) keeps the generators running all the time: when the
# trainer publishes new weights, a generator swaps them in *between two decoding steps*,
# keeps its KV cache and carries on; a finished answer's slot is refilled at once
# (continuous batching). A sequence then holds tokens from **several policy versions**.
# Throughput goes up; the price is staleness, which we measure **per token**, bound with
# backpressure, and correct with truncated importance weights (lesson 02).
#
# **Learning goals**
# 1. Say where a synchronous RL loop for an LLM idles (stragglers in a batch, generation
#    waiting for training and vice versa), and measure it on a timeline.
# 2. Build a KV-cache sampler whose weights can change between two decoding steps, and
#    know what the kept cache means (keys and values from the old weights) and what
#    recomputing it costs.
# 3. Write the per-token truncated-IS loss (07.1-07.3) for sequences that mix versions,
#    with group-relative advantages.
# 4. Bound the per-token lag with backpressure, and check the bound on every batch.
# 5. Run the synchronous, one-step asynchronous and pipeline regimes with real processes
#    on the same hardware and compare tokens/s, lag, and reward per sample and per second.
#
# Builds on lesson 01 (policy gradients, group-relative advantages), lesson 02 (truncated
# importance weights, ESS) and lesson 03 (processes, shared weights with a version).

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import course_lib
from course_lib.scale import current_scale, pick

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## Key equations
#
# A prompt $x$ gets a group of $G$ answers $y_1 \dots y_G$, graded by an exact verifier
# with rewards $r_i \in \{0, 1\}$. Token $t$ of answer $i$ was sampled by policy version
# $v_{it}$ with behaviour log-probability $\log\mu_{it}$; with in-flight updates $v_{it}$
# can change *within* a sequence. The trainer, at version $u$, weighs every token by its
# own truncated importance weight
#
# $$w_{it} = \min\Big(c,\ \frac{\pi_u(y_{it}\mid x, y_{i,<t})}{\mu_{it}}\Big),
#   \qquad \mu_{it} = \pi_{v_{it}}(y_{it}\mid x, y_{i,<t})\ \text{as the sampler computed it} \qquad (07.1)$$
#
# and minimises, over the $N_{tok}$ real answer tokens of the batch (the weight is a constant, $\mathrm{sg}$),
#
# $$L = -\frac{1}{N_{tok}} \sum_{i,t} \mathrm{sg}[w_{it}]\, A_i\, \log\pi_u(y_{it}\mid x, y_{i,<t}) \qquad (07.2)$$
#
# with the group-relative advantage of its sequence (GRPO, lesson 01's 01.6)
#
# $$A_i = \frac{r_i - \operatorname{mean}_j r_j}{\operatorname{std}_j r_j + \epsilon}. \qquad (07.3)$$
#
# **Lag and effective sample size, per token:**
#
# $$\text{lag}_{it} = u - v_{it}, \qquad \frac{\text{ESS}}{N} = \frac{\big(\sum w\big)^2}{N \sum w^2}
#   \ \text{(untruncated ratios of the batch's tokens)}. \qquad (07.4)$$
#
# The ratio is per *token*, not per sequence: a sequence that mixes versions needs no
# product of ratios (whose variance lesson 02 showed explodes with length), and tokens
# sampled by the current weights get weight 1. "As the sampler computed it" matters: after
# an in-flight update with a kept cache, $\mu_{it}$ comes from the new weights *reading
# keys and values the old weights wrote*, a distribution no single version defines; the
# sampler records it, and (07.1) corrects towards $\pi_u$ from whatever it was.
#
# **Lag bound by backpressure.** Groups are numbered as they start; update $u$ consumes
# groups $uB \dots (u+1)B - 1$. The generator may start group $k$ only if
# $k < \text{consumed} + (\text{bound} + 1)B$, reading `consumed` before pulling the
# weights. Group $k$ then starts with a version $\ge \text{consumed}/B$ and is consumed by
# update $\le \text{consumed}/B + \text{bound}$: **no token lags more than the bound**
# (0 synchronous, 1 one-step, `max_lag` pipeline).
#
# **Pseudocode** (one generator process with $S$ decoding slots, one trainer process)
# ```
# synchronous (bound 0)            one-step async (bound 1)         pipeline RL (bound max_lag)
# loop:                            generator loop:                  generator loop, never stops:
#   pull weights (version u)         wait: batch j < consumed + 2B    pull weights if newer (keep KV cache)
#   fill all S slots, decode         pull weights (version >= j-1)    refill every free slot at once
#   until the LONGEST ends           decode until the longest ends    one decoding step for all slots
#   train on the batch (07.1-07.3)   send the batch                   send each finished group
#   publish u + 1                  trainer loop: train, publish     trainer loop: take the next B groups,
#                                                                     check lag <= bound, train, publish
# ```
#
# | equation | function in `course_lib` |
# |---|---|
# | (07.1)-(07.2) per-token truncated-IS loss | `pipeline.loss.pipeline_loss` (= `importance.truncated_is_loss(level="token")`) |
# | (07.3) group advantages on tokens | `pipeline.loss.group_token_advantages` (uses `pg.group_relative_advantages`) |
# | (07.4) per-token lag, ESS / N | `pipeline.loss.token_lags`, `pipeline.loss.token_ess_fraction` |
# | $\log\pi_u$ of every token, one pass | `lm.model.sequence_logprobs` |
# | decoding step with a KV cache | `lm.model.TinyLM.step` |
# | slots, in-flight swap, $\mu_{it}$ and $v_{it}$ | `lm.sampler.SlotSampler` (`step`, `load_weights(..., recompute=)`) |
# | the three regimes, backpressure, faults | `pipeline.system.PipelineSystem`, `PipelineConfig` |
# | timelines, curves, lag histogram | `pipeline.timeline` |

# %% [markdown]
# ## 1. A verifiable task with a long tail
#
# Division by repeated subtraction: prompt `n k`, the answer is the scratchpad of every
# intermediate value down to the remainder, then `<eos>`. The verifier is exact (every
# token must match). Quotients follow a power law, so most answers are short and a few
# are very long, as reasoning traces are:

# %%
from course_lib.lm.task import CountdownTask, Problem, synchronous_slot_occupancy

task = CountdownTask()
p = Problem(23, 5)
print("prompt:", task.render(p.prompt), "| answer:", task.render(p.answer))
print("reward of the right answer:", task.reward(p, p.answer), "| of one wrong token:",
      task.reward(p, p.answer[:2] + p.answer[3:]))
quotients = np.array([len(q.answer) - 1 for q in task.sample(np.random.default_rng(0), 20_000)])
print(f"answer length (numbers): median {np.median(quotients):.0f}, mean {quotients.mean():.1f}, "
      f"99th percentile {np.percentile(quotients, 99):.0f}, max {quotients.max()}")
mean_steps, max_steps = synchronous_slot_occupancy(task, 32)
print(f"a batch of 32 answers: {mean_steps:.1f} decoding steps per answer on average, but the batch runs "
      f"{max_steps:.1f} steps (its longest): {100 * mean_steps / max_steps:.0f}% of the slot-steps do useful work")

# %%
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.hist(quotients, bins=np.arange(1, 66) - 0.5, density=True, color="tab:gray")
ax.axvline(max_steps - 4, color="tab:red", ls="--", label="expected longest answer in a batch of 32")
ax.set_yscale("log")
ax.set_xlabel("answer length (numbers before <eos>)")
ax.set_ylabel("fraction of answers (log scale)")
ax.set_title("Answer lengths: a long tail (P(L) ~ L^-1.2)")
ax.legend()
plt.show()

# %% [markdown]
# **Takeaway:** with a long tail, a synchronous batch is as slow as its slowest member:
# here three quarters of its decoding slot-steps are padding after the short answers have
# ended. Continuous batching refills those slots at once.

# %% [markdown]
# ## 2. A tiny transformer, its KV cache, and an in-flight weight swap
#
# A 2-layer decoder (width 64, 4 heads), about 0.13 M parameters. A short supervised warm
# start (teacher forcing on the scratchpads) brings it to a reward clearly above 0 and
# clearly below 1; we keep a snapshot 10 steps before the end, to have two nearby policy
# versions for the demonstration below:

# %%
from course_lib.actor_learner.model import flat_parameters
from course_lib.lm import TinyLM
from course_lib.lm.task import evaluate, warm_start
from course_lib.pipeline.system import LM

torch.manual_seed(0)
model = TinyLM(LM)
print(f"TinyLM: {sum(p.numel() for p in model.parameters()):,} parameters, {LM}")
warm_steps = pick(cpu=50, full=60)
losses = warm_start(model, task, steps=warm_steps - 10)
snapshot = flat_parameters(model)
losses += warm_start(model, task, steps=10, seed=1)
init_flat = flat_parameters(model)

# %%
# NBVAL_IGNORE_OUTPUT
warm_reward = evaluate(model, task, n=256, seed=123)
print(f"{warm_steps} warm-start steps: loss {losses[0]:.2f} -> {losses[-1]:.2f}; "
      f"reward of sampled answers (256 prompts): {warm_reward:.2f}")

# %%
assert 0.1 < warm_reward < 0.7, warm_reward
print("the warm start leaves RL room: its reward is clearly above 0 and clearly below 1")

# %% [markdown]
# **The cache is exact when nothing changes.** The sampler decodes 16 answers with
# continuous batching in 8 slots; a full forward pass over each finished sequence gives
# the same log-probabilities as those the sampler recorded token by token:

# %%
from course_lib.lm.model import sequence_logprobs
from course_lib.lm.sampler import SlotSampler, sample_problems
from course_lib.lm.task import EOS

problems = task.sample(np.random.default_rng(1), 16)
results = sample_problems(model, [q.prompt for q in problems], n_slots=8, eos=EOS,
                          generator=torch.Generator().manual_seed(0))
worst = 0.0
with torch.no_grad():
    for r in results:
        full = sequence_logprobs(model, r["tokens"][None])[0]
        worst = max(worst, float((full[4:] - r["logp"][4:]).abs().max()))
assert worst < 1e-4
print("16 answers, 8 slots: the KV-cache log-probs equal a full recompute (max difference below 1e-4)")

# %% [markdown]
# **An in-flight swap.** Four slots decode the same long problem with the snapshot's
# weights (version 0); after 8 steps the newer weights (version 1) are swapped in. With
# the cache kept, the later tokens are stamped with version 1 and their log-probs come
# from the new weights reading keys and values the old weights wrote; with the cache
# recomputed they equal a fresh forward pass of the new weights:

# %%
def swap_demo(recompute: bool) -> SlotSampler:
    demo = TinyLM(LM)
    demo.load_state_dict(model.state_dict())
    sampler = SlotSampler(demo, 4, EOS, torch.Generator().manual_seed(3))
    sampler.load_weights(snapshot, version=0)
    for slot in range(4):
        sampler.start(slot, Problem(15, 1).prompt)
    for step in range(18):
        if step == 8:
            sampler.load_weights(init_flat, version=1, recompute=recompute)
        sampler.step()
    return sampler


for recompute in (False, True):
    s = swap_demo(recompute)
    with torch.no_grad():
        fresh = sequence_logprobs(model, s.tokens[:, :20])
    after = s.versions[:, :20] == 1
    assert after.sum() > 10
    gap = float((fresh - s.logp[:, :20])[after].abs().max())
    print(f"recompute={recompute!s:<5} versions of slot 0: {''.join(str(int(v)) for v in s.versions[0, 4:20] if v >= 0)} "
          f"| log mu == a fresh pass of version 1: {gap < 1e-4}")
    assert (gap < 1e-4) == recompute

# %% [markdown]
# **Takeaway:** a sequence now holds tokens of two versions, and the sampler records, for
# each token, the version and the log-probability that actually produced it. Keeping the
# cache is free and slightly off-policy for every version (the kept keys and values are
# old); recomputing is exact but costs a forward pass over every slot's whole prefix at
# every update. Pipeline RL keeps the cache and lets (07.1) correct what is left.

# %% [markdown]
# ## 3. Three regimes on the same two cores
#
# One generator process (32 slots, one torch thread, pinned to core 0) and the trainer in
# this process (one torch thread, pinned to core 1): each role has its own hardware, as
# generator and trainer GPUs do in a real system, and both can compute at the same time,
# if the regime lets them.
# Same warm-started weights, same prompts stream, same batch (4 prompts x 8 answers) and
# the same number of updates in every regime:

# %%
from dataclasses import fields, replace

from course_lib.pipeline.system import PipelineConfig, PipelineSystem

base = PipelineConfig(n_updates=pick(cpu=100, full=400), max_lag=2)
for f in fields(base):
    if f.name not in ("lm", "task", "start_method"):
        print(f"{f.name:<19} = {getattr(base, f.name)!r:<8} # {f.metadata['help']}")

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm.auto import tqdm

from course_lib.procs import live_children

reports = {}
for regime in ("sync", "one_step", "pipeline"):
    with tqdm(total=base.n_updates, desc=regime, unit="update") as bar:
        with PipelineSystem(replace(base, regime=regime), init_flat) as system:
            reports[regime] = system.train(progress=lambda u, m: bar.update())
print(f"{'regime':<15} {'tokens/s':>9} {'x sync':>7} {'gen busy':>9} {'slots useful':>13} {'train busy':>11} "
      f"{'lag max':>8} {'lag mean':>9} {'ESS/N':>6} {'seconds':>8}")
for name, r in reports.items():
    print(f"{name:<15} {r.tokens_per_second:>9,.0f} {r.tokens_per_second / reports['sync'].tokens_per_second:>7.2f} "
          f"{100 * r.busy_fraction('generator'):>8.0f}% {100 * r.slot_occupancy:>12.0f}% "
          f"{100 * r.busy_fraction('trainer'):>10.0f}% {r.token_lags.max():>8} {r.token_lags.mean():>9.2f} "
          f"{r.series('ess').mean():>6.3f} {r.seconds:>8.1f}")

# %%
assert all(r.token_lags.max() <= r.lag_bound for r in reports.values())
assert reports["sync"].token_lags.max() == 0 and reports["pipeline"].token_lags.max() >= 1
assert not live_children()
print("no consumed token lagged more than its regime's bound; no child process is left")

# %% [markdown]
# **Throughput, side by side.** The runs above took turns over a minute or more, and this
# machine's two cores are shared with other jobs whose load drifts, so one run per regime
# is a noisy comparison. The claim is measured with short runs of the two regimes
# interleaved, three rounds, and the median ratio:

# %%
# NBVAL_IGNORE_OUTPUT
ratios = []
for round_ in range(3):
    pair = {}
    for regime in ("sync", "pipeline"):
        with PipelineSystem(replace(base, regime=regime, n_updates=40, seed=10 + round_), init_flat) as system:
            pair[regime] = system.train().tokens_per_second
    ratios.append(pair["pipeline"] / pair["sync"])
    print(f"round {round_}: sync {pair['sync']:,.0f} tokens/s, pipeline {pair['pipeline']:,.0f} tokens/s, "
          f"ratio {ratios[-1]:.2f}")
speedup = float(np.median(ratios))
print(f"median pipeline / sync tokens/s: {speedup:.2f}")

# %%
assert speedup >= 1.5, ratios
assert not live_children()
print("pipeline RL's tokens/s is at least 1.5x the synchronous regime's, measured side by side in this run")

# %% [markdown]
# **Where the hardware idles.** One second from the middle of each run; a coloured bar is
# a process computing, white is idle:

# %%
from course_lib.pipeline.timeline import gantt

fig, axes = plt.subplots(3, 1, figsize=(11, 6))
for ax, r in zip(axes, reports.values()):
    start = 0.4 * r.seconds
    gantt(ax, r, (start, start + 1.0))
fig.suptitle("Timelines: generator and trainer processes (coloured: computing; white: idle)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** synchronous: the two processes take turns, and the generator's long bars
# are mostly padding (its slots wait for the batch's longest answer). One-step async
# overlaps them, but each batch still waits for its straggler. Pipeline RL keeps the
# generator decoding with nearly full slots, swapping weights in flight (the ticks), and
# the trainer takes the next batch as soon as it is done: here the trainer becomes the
# bottleneck, which is where a real system puts its money.

# %% [markdown]
# ## 4. Learning: per second and per sample

# %%
from course_lib.pipeline.timeline import learning_curves

fig, axes = plt.subplots(1, 2, figsize=(11, 4))
learning_curves(axes, list(reports.values()), window=25)
fig.suptitle("Countdown task, from the same warm start: reward of the batches the trainer consumed")
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
half = base.n_updates // 2
late = {name: r.series("reward")[half:].mean() for name, r in reports.items()}
print("mean reward of the samples consumed in the second half of the updates: "
      + ", ".join(f"{k} {v:.3f}" for k, v in late.items()))
print("seconds to finish the same updates: " + ", ".join(f"{k} {r.seconds:.1f}" for k, r in reports.items()))

# %%
TOLERANCE = 0.1
assert late["pipeline"] >= late["sync"] - TOLERANCE, late
assert reports["pipeline"].seconds < reports["sync"].seconds
print(f"per sample, pipeline RL's reward is within {TOLERANCE} of the synchronous regime's (or better), "
      "and it finished the same updates in less wall-clock time")

# %% [markdown]
# The batch rewards above are noisy because the prompts' difficulty varies from batch to
# batch (the three regimes see the same stream of prompts, so the bumps line up). A
# cleaner measure of learning: the reward of each final policy on the same 256 held-out
# prompts, against the warm start's.

# %%
# NBVAL_IGNORE_OUTPUT
final_reward = {}
for name, r in reports.items():
    policy = TinyLM(LM)
    policy.load_state_dict(r.final_state)
    final_reward[name] = evaluate(policy, task, n=256, seed=123)
print(f"held-out reward: warm start {warm_reward:.2f} -> " + ", ".join(f"{k} {v:.2f}" for k, v in final_reward.items()))

# %%
assert np.mean(list(final_reward.values())) > warm_reward, (warm_reward, final_reward)
assert final_reward["pipeline"] >= final_reward["sync"] - TOLERANCE
print(f"on average the regimes improved on the warm start; pipeline RL's final policy is within {TOLERANCE} "
      "of the synchronous one's (or better)")

# %% [markdown]
# **Takeaway:** per sample, the three regimes learn at a similar pace; the stale regimes
# may trail the synchronous one by a few points of reward (their samples come from
# policies up to 1 or 2 updates old, and a single run of a small RL problem is noisy,
# hence the tolerance of 0.1). Per second, pipeline RL gets there first because it
# produces the samples faster. The truncated weights keep the stale tokens from pulling
# the policy back: at this lag their ESS stays close to 1.

# %% [markdown]
# ## 5. The lag, per token

# %%
from course_lib.pipeline.timeline import lag_histogram

fig, ax = plt.subplots(figsize=(7, 3.5))
lag_histogram(ax, list(reports.values()))
plt.show()
for name, r in reports.items():
    print(f"{name:<9} bound {r.lag_bound}: observed max {r.token_lags.max()}")

# %% [markdown]
# **Takeaway:** the bound is a hard guarantee of the backpressure rule, checked on every
# batch; the distribution under it depends on timing. In the pipeline regime the queue of
# finished groups fills up to the bound because the generator is faster than the trainer.
# A lower `max_lag` trades some throughput (the generator waits sooner) for fresher data.

# %% [markdown]
# ## 6. Faults: a dying generator, and no orphans
#
# The trainer waits for data at most `poll_s` at a time and checks the generator after
# each wait; a dead generator ends the run cleanly with `PipelineFault` (there is only one
# generator here, so there is nobody to continue with), the generator exits if its parent
# dies, and `stop` (the `with` block) joins, then terminates, then kills. We kill the
# generator with `SIGKILL` after 3 updates:

# %%
import os
import signal

import psutil

from course_lib.pipeline.system import PipelineFault

fault = None
with PipelineSystem(replace(base, regime="pipeline", n_updates=1000), init_flat) as system:
    pid = system.pid
    try:
        system.train(progress=lambda u, m: os.kill(pid, signal.SIGKILL) if u == 3 else None)
    except PipelineFault as exc:
        fault = exc
print("PipelineFault:", str(fault).replace(str(pid), "PID"))
for event in system.events:
    print(" ", event.replace(str(pid), "PID"))

# %%
assert fault is not None and "killed by SIGKILL" in str(fault)
assert not live_children() and not (psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie")
print("the killed generator was reported, the run ended cleanly, and no process is left")

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | tokens/s | answer tokens the trainer consumed (trained on) per wall-clock second, from the start signal to the last update |
# | gen busy | fraction of the run's wall time the generator spent in decoding steps |
# | slots useful | fraction of the generator's slot-steps that advanced a live sequence (the rest are empty slots of a batch waiting for its longest answer) |
# | gen util | gen busy x slots useful: the share of the generator's hardware doing useful work |
# | train busy (train util) | fraction of the run's wall time the trainer spent computing an update and publishing |
# | lag (per token) | trainer version minus the version that sampled the token (07.4); max and mean over consumed tokens |
# | ESS/N | effective sample size of the batch's untruncated token weights over the number of tokens (07.4); 1 on-policy |
# | reward | exact-match reward of an answer (1 if every token matches the scratchpad); per batch: the mean over its 32 answers |
# | swaps | in-flight weight updates the generator applied between decoding steps |
#
# ## Summary
#
# - A synchronous RL loop for an LLM idles twice: slots wait for the longest answer of a
#   batch, and generation and training wait for each other.
# - Pipeline RL keeps the generator running: new weights are swapped in between decoding
#   steps, the KV cache is kept, finished slots are refilled at once. Here that gave at
#   least 1.5x the tokens/s of the synchronous loop on the same two cores.
# - A sequence then mixes policy versions; the per-token truncated importance weight
#   (07.1-07.2) handles it without products of ratios, with the version and log-prob the
#   sampler recorded for each token.
# - Staleness is bounded by construction (backpressure on starting new groups) and
#   measured per token; the run checks the bound on every batch.
# - Every wait has a timeout, a dead generator ends the run cleanly, and no process is
#   left behind.
#
# **Full scale.** `COURSE_SCALE=full` runs 400 updates per regime from a 60-step warm
# start; on a GPU, the same classes take a larger `LMConfig` (e.g. `d_model=256,
# n_layers=4`) and more slots (`n_slots=256`), where a decoding step costs nearly the
# same for 8 or 256 busy slots and the stragglers' waste grows with the batch. Run it with
# `.venv/bin/course run 07 --scale full`. No GPU was available when this lesson was
# written, so no full-scale figures are quoted; one generator process is implemented
# (several generators sharing the group numbering are left for lesson 11). The throughput
# and lag figures are also measured by `python bench/run.py pipeline_rl` (see `BENCHMARKS.md`).
#
# **References.** A. Piché, E. Kamalloo, R. Pardinas, X. Chen, D. Bahdanau, *PipelineRL:
# Faster On-policy Reinforcement Learning for Long Sequence Generation*, arXiv 2509.19128,
# 2025 (in-flight weight updates, per-token truncated IS, ServiceNow/PipelineRL).
# Z. Shao et al., *DeepSeekMath*, arXiv 2402.03300, 2024 (GRPO group advantages).
# L. Espeholt et al., *IMPALA*, arXiv 1802.01561, 2018 (truncated importance weights for
# lagged actors). W. Kwon et al., *Efficient Memory Management for LLM Serving with
# PagedAttention*, SOSP 2023 (continuous batching and KV caches in inference engines).
#
# **Exercises:** `exercises/07_pipeline_rl.ipynb`: the per-token truncated-IS loss with
# mixed versions, per-token lag accounting, group advantages on tokens, and the in-flight
# swap in a decoding loop. Grade with `course grade exercises/07_pipeline_rl.ipynb`.
