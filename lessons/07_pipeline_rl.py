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
# **Conventional RL** for language models alternates: all the hardware generates answers
# with one version of the weights, then all of it trains, taking $k$ optimizer steps on
# what was generated (the last steps train on data $k - 1$ updates old). While one phase
# runs, the other's hardware idles, and each generation round waits for its longest
# answer. **Pipeline RL** (Piché et al. 2025) runs generation and training at the same
# time: when the trainer publishes new weights, the generator swaps them in *between two
# decoding steps*, keeps its KV cache and carries on, and refills a finished answer's slot
# at once. A sequence then holds tokens from several policy versions; the staleness is
# bounded by backpressure and corrected per token with truncated importance weights
# (lesson 02). On 128 H100s the paper reports about 2x faster learning than conventional
# RL, from about twice the samples per second.
#
# **The question of this lesson:** on the same two CPU cores, what does pipeline RL buy
# over conventional RL, in answers per second, in staleness and in reward, and what does
# each of its pieces (the overlap, the in-flight swap, the kept cache, the correction)
# contribute? Seven arms, twelve seeds each, and a difference counts only if it is larger
# than twice its standard error over the seeds.
#
# **Learning goals**
# 1. Say where conventional RL idles, and measure it on a timeline.
# 2. Build a KV-cache sampler whose weights change between two decoding steps, and say
#    what keeping its cache means.
# 3. Write the per-token truncated-IS loss (07.1-07.3) for sequences that mix versions.
# 4. Bound the per-token lag with backpressure, and check the bound on every batch.
# 5. Compare the arms fairly: throughput in answers/s, lag, and reward over seeds, with a
#    verdict only where the seeds separate them.
#
# Builds on lessons 01 (group-relative advantages), 02 (truncated importance weights, ESS)
# and 03 (processes, versioned shared weights).

# %%
import matplotlib.pyplot as plt
import numpy as np
import torch

import course_lib
from course_lib import current_scale

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
# The weight is per *token*: it corrects the choice of each token given its prefix, but
# not the fact that the prefix itself was drawn by older policies, so (07.2) is a
# **biased** estimate of the on-policy gradient (lesson 02's per-token weights), with a
# bias that grows with the lag; truncating at $c$ adds bias and removes variance. It needs
# no product of ratios, whose variance lesson 02 showed explodes with length. "As the
# sampler computed it" matters: after an in-flight update with a kept cache, $\mu_{it}$
# comes from the new weights reading keys and values that older weights wrote.
#
# **Lag bound by backpressure.** Groups are numbered as they start; update $u$ consumes
# groups $uB \dots (u+1)B - 1$. The generator may start group $j$ only if
# $j < \text{consumed} + (\text{bound} + 1)B$, reading `consumed` before pulling the
# weights. Group $j$ then starts with a version $\ge \text{consumed}/B$ and is consumed by
# update $\le \text{consumed}/B + \text{bound}$: **no token lags more than the bound**.
#
# **Pseudocode**
# ```
# conventional RL (k steps per round)        pipeline RL (bound max_lag)
# every core, in turn:                       generator (core 0), never stops:
#   an engine per core pulls version u         pull weights if newer (keep the KV cache)
#   generate k batches, refilling slots        start groups in free slots while backpressure allows
#     until the round's last answer ends       one decoding step of every live slot
#   k steps (lag 0..k-1), a trainer rank       send each finished group
#     per core, gradients summed             trainer (core 1): take the next B groups,
#   publish u + k                              check lag <= max_lag, one step (07.1-07.3), publish
# ```
#
# | equation | function in `course_lib` |
# |---|---|
# | (07.1)-(07.2) per-token truncated-IS loss | `pipeline.loss.pipeline_loss` (`correct=False`: no correction) |
# | (07.3) group advantages on tokens | `pipeline.loss.group_token_advantages` |
# | (07.4) per-token lag, ESS / N | `pipeline.loss.token_lags`, `pipeline.loss.token_ess_fraction` |
# | decoding step with a KV cache | `lm.model.TinyLM.step`, `lm.sampler.SlotSampler` |
# | backpressure (the lag bound) | `rl.staleness.may_start_group` |
# | the generator, the trainer, the arms | `pipeline.system.GroupGenerator`, `PipelineSystem`, `PipelineConfig` |
# | the experiment over seeds | `pipeline.experiment` (`ARMS`, `run_seed`, `run_grid`) |

# %% [markdown]
# ## 1. A verifiable task with a long tail
#
# Division by repeated subtraction: prompt `n k`, the answer is the scratchpad of every
# intermediate value down to the remainder, then `<eos>`. The verifier is exact (every
# token must match). Quotients follow a power law, so most answers are short and a few
# are very long, as reasoning traces are. One `(n, k)` pair per quotient is **held out**:
# training never draws it.

# %%
from course_lib.lm.task import CountdownTask, Problem, synchronous_slot_occupancy

task, held_out = CountdownTask(split="train"), CountdownTask(split="held_out")
p = Problem(23, 5)
print("prompt:", task.render(p.prompt), "| answer:", task.render(p.answer))
print("reward of the right answer:", task.reward(p, p.answer), "| of one wrong token:",
      task.reward(p, p.answer[:2] + p.answer[3:]))
quotients = np.array([len(q.answer) - 1 for q in task.sample(np.random.default_rng(0), 20_000)])
print(f"answer length (numbers): median {np.median(quotients):.0f}, mean {quotients.mean():.1f}, "
      f"99th percentile {np.percentile(quotients, 99):.0f}, max {quotients.max()}")
print(f"held-out problems: {len(held_out.held_out)} pairs, never drawn for training")
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
# **Takeaway:** a batch generated as one block is as slow as its longest answer: here three
# quarters of its decoding slot-steps are padding. Refilling a finished slot at once
# (continuous batching) recovers them, within a round of conventional RL as in pipeline RL.

# %% [markdown]
# ## 2. A tiny transformer, its KV cache, and an in-flight weight swap
#
# A 2-layer decoder (width 64, 4 heads), about 0.13 M parameters. A short supervised warm
# start on the training problems leaves RL room to show; we keep the weights of 10 steps
# before its end, to have two nearby policy versions for the demonstration below. Every
# policy in this lesson is measured on the same 1024 fresh draws of the **training
# problems** and of the **held-out pairs**:

# %%
from course_lib.lm import TinyLM
from course_lib.pipeline import experiment
from course_lib.pipeline.system import LM
from course_lib.runtime.weights import flat_parameters

warm_steps = experiment.WARM_STEPS  # 30 supervised steps
model, snapshot, losses = experiment.warm_policy(warm_steps)
init_flat = flat_parameters(model)
print(f"TinyLM: {sum(p.numel() for p in model.parameters()):,} parameters, {LM}")

# %%
# NBVAL_IGNORE_OUTPUT
warm_reward = experiment.rewards_of(model)
print(f"{warm_steps} warm-start steps: loss {losses[0]:.2f} -> {losses[-1]:.2f}; reward of sampled answers: "
      f"training problems {warm_reward['train']:.3f}, held-out pairs {warm_reward['held_out']:.3f}")

# %%
assert 0.08 < warm_reward["train"] < 0.5 and warm_reward["held_out"] < warm_reward["train"] / 4, warm_reward
print("the warm start leaves RL room on the training problems; on the held-out pairs it scores less than a quarter "
      "as much: a 0.13 M-parameter model memorises the problems it saw more than it learns to subtract")

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
# **An in-flight swap.** Between two decoding steps the generator loads newer weights in
# place; the live sequences carry on with their KV cache, or the cache of their prefixes
# is rebuilt (`recompute`, a prefill of every token in flight). From then on the sampler
# stamps every token with the new version:

# %%
from course_lib import show_source

show_source(SlotSampler.weights_changed)
show_source(SlotSampler.recompute_cache)

# %% [markdown]
# Four slots decode the same long problem with the older weights (version 0); after 8
# decoding steps (3 of them read the prompt) the newer ones (version 1) are swapped in. With the cache kept, the later tokens'
# log-probs come from the new weights reading keys and values the old weights wrote; with
# the cache recomputed they equal a fresh forward pass of the new weights:

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


demo_gap = {}  # recompute -> max |log mu - log pi_1| over the tokens after the swap
for recompute in (False, True):
    s = swap_demo(recompute)
    with torch.no_grad():
        fresh = sequence_logprobs(model, s.tokens[:, :20])
    after = s.versions[:, :20] == 1
    assert after.sum() > 10
    gap = demo_gap[recompute] = float((fresh - s.logp[:, :20])[after].abs().max())
    print(f"recompute={recompute!s:<5} versions of slot 0: {''.join(str(int(v)) for v in s.versions[0, 4:20] if v >= 0)} "
          f"| log mu == a fresh pass of version 1: {gap < 1e-4}")
    assert (gap < 1e-4) == recompute

# %% [markdown]
# **Takeaway:** a sequence now holds tokens of two versions, and the sampler records, for
# each token, the version and the log-probability that actually produced it. Keeping the
# cache costs nothing at the swap and leaves $\mu$ slightly off every single version;
# recomputing is exact and costs a prefill of every token in flight. Section 6 measures
# both in the running system.

# %% [markdown]
# ## 3. The loop the lag bound rests on
#
# The generator process runs one loop: read how many groups the trainer has consumed,
# start what the arm and backpressure allow (`start_groups`), then one decoding step of
# every live slot. `start_groups` is where the arms differ: pipeline RL swaps in newer
# weights and refills free slots at once (the refill, group after group under the rule
# below, is exercise 5); drain-then-swap takes newer weights only once its slots are
# empty; conventional RL opens a round of $k$ batches only when the trainer has consumed
# the last one.

# %%
from course_lib.pipeline.system import GroupGenerator, PipelineSystem, generator_main
from course_lib.rl.staleness import may_start_group

show_source(may_start_group)
show_source(generator_main)
show_source(GroupGenerator.start_groups)

# %% [markdown]
# The trainer's step: the lag of every consumed token is checked against the bound, the
# loss (07.2) is computed over chunks of similar length (`batch_share_loss`; the
# conventional arms' data-parallel trainer splits those chunks between its ranks), and
# only after publishing the new weights does it raise `consumed`, which is what makes the
# bound hold:

# %%
from course_lib.pipeline.system import batch_share_loss

show_source(PipelineSystem._update)
show_source(batch_share_loss)

# %% [markdown]
# ## 4. The fair comparison: seven arms on the same two cores
#
# Every arm starts from the same warm start, draws the same training prompts for a given
# seed, and takes the same number of updates on the same batch (4 prompts x 8 answers),
# with 32 decoding slots in all:
#
# | arm | how it runs | lag bound |
# |---|---|---|
# | synchronous ($k$ = 1) | an engine per core generates one batch, then a trainer rank per core takes one step | 0 |
# | conventional RL ($k$ = 4) | the engines generate 4 batches, then the two ranks take 4 steps | 3 |
# | one-step async | generator (core 0) one batch ahead of the trainer (core 1) | 1 |
# | pipeline RL | generator (core 0) with in-flight swaps, trainer (core 1) | `max_lag` = 3 |
# | pipeline, drain-then-swap | the same, but new weights wait until the live answers end | 3 |
# | pipeline, no IS correction | every weight of (07.1) is 1 | 3 |
# | pipeline, KV cache recomputed | the live prefixes are re-prefilled at every swap | 3 |
#
# The synchronous arms run as conventional RL runs on a cluster, every device taking part
# in both phases: an inference engine on each core decodes half of the round's answers
# (16 slots each, continuous batching inside the round); then a data-parallel trainer, a
# rank on each core, computes the gradient of half of each batch (whole chunks of similar
# length, so that each rank gets its share of the long tail), and the halves are summed
# before the step. $k$ is matched to the pipeline's bound, so both arms' tokens lag at
# most 3 updates. Pipeline RL gives each role one core. The arms of one seed run back to
# back, seconds apart, in an order drawn from the seed. The recorded seeds come from the
# command printed below; this notebook repeats seed 0 live, every arm, beside them.

# %%
record = experiment.load()  # the same at both scales: see "Full scale" at the end
meta, rec = record["meta"], record["runs"]
SEEDS, N_UPDATES = meta["seeds"], meta["n_updates"]
assert meta["warm_steps"] == warm_steps and abs(record["warm_reward"]["train"] - warm_reward["train"]) < 0.02
print(f"recorded: {len(SEEDS)} seeds x {len(rec)} arms x {N_UPDATES} updates, {meta['date_utc'][:10]}, "
      f"{meta['machine']}: `{meta['command']}`")

# %%
# NBVAL_IGNORE_OUTPUT
from dataclasses import replace

from course_lib import progress
from course_lib.runtime.processes import live_children

base = experiment.base_config(N_UPDATES)
live = {}  # arm -> this notebook's RegimeReport of seed 0
with progress(len(experiment.ARMS), "seed 0, every arm, live", unit="arm") as bar:
    for arm, extra in experiment.ARMS.items():
        with PipelineSystem(replace(base, seed=0, **extra), init_flat) as system:
            live[arm] = system.train()
        bar.update()
print(", ".join(f"{arm} {r.seconds:.1f} s" for arm, r in live.items()))

# %%
assert all(r.token_lags.max() <= r.lag_bound for r in live.values()), {a: r.token_lags.max() for a, r in live.items()}
assert live["sync_dp"].token_lags.max() == 0 and live["conventional_dp"].token_lags.max() == 3
assert not live_children()
overlap = {arm: live[arm].busy_fraction("generator") + live[arm].busy_fraction("trainer") for arm in live}
assert overlap["conventional_dp"] < 1.02 and overlap["pipeline"] > 1.2, overlap
print("live: every consumed token within its arm's bound; conventional RL's last batch of a round lags exactly "
      "3; its two phases take turns on the cores (busy fractions add up to at most 1) while the pipeline's roles "
      "overlap (more than 1.2); no child process is left")

# %% [markdown]
# **Throughput.** Answers per second is the measure; tokens per second would reward an
# arm whose policy writes longer answers. "x conv." is the median over seeds of each
# seed's ratio to conventional RL; "live" is the same ratio in this notebook's run of seed 0:

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.pipeline.timeline import LABELS


def med(arm, key):  # median over the recorded seeds; arm: a name, or a list of runs
    return float(np.median([r[key] for r in (rec[arm] if isinstance(arm, str) else arm)]))


def ratios(a, b, key="answers_per_s"):  # per seed; a, b: names, or lists of runs
    a, b = (rec[x] if isinstance(x, str) else x for x in (a, b))
    return np.array([x[key] / y[key] for x, y in zip(a, b)])


def decode_core_ms(arm):  # core time spent decoding per consumed answer (mean busy fraction x cores)
    cores = 2 if arm.endswith("_dp") else 1
    return 1000 * float(np.median([r["gen_busy"] * r["seconds"] * cores for r in rec[arm]])) / (
        N_UPDATES * base.batch_sequences)


def ms_per_update(arm, role):  # busy time of one role per update, median over seeds
    return 1000 * float(np.median([r[f"{role}_busy"] * r["seconds"] for r in rec[arm]])) / N_UPDATES


print(f"{'arm':<32}{'answers/s':>10}{'x conv.':>8}{'live':>6}{'tokens/s':>9}{'tok/answer':>11}{'lag mean':>9}"
      f"{'gen busy':>9}{'train busy':>11}{'slots useful':>13}")
for arm in rec:
    print(f"{LABELS[arm]:<32}{med(arm, 'answers_per_s'):>10,.0f}{np.median(ratios(arm, 'conventional_dp')):>8.2f}"
          f"{live[arm].answers_per_second / live['conventional_dp'].answers_per_second:>6.2f}"
          f"{med(arm, 'tokens_per_s'):>9,.0f}"
          f"{med(arm, 'answer_tokens'):>11.1f}{med(arm, 'lag_mean'):>9.2f}{med(arm, 'gen_busy'):>9.0%}"
          f"{med(arm, 'train_busy'):>11.0%}{med(arm, 'slots_useful'):>13.0%}")
speedup, longer = ratios("pipeline", "conventional_dp"), ratios("pipeline", "conventional_dp", "answer_tokens")
print("pipeline / conventional per seed, answers/s: " + ", ".join(f"{x:.2f}" for x in speedup))
print("                          answer length: " + ", ".join(f"{x:.2f}" for x in longer))
slope, at_equal_length = np.polyfit(np.log(longer), np.log(speedup), 1)
print(f"answers/s ratio at equal answer length (a line through the seeds, log-log): {np.exp(at_equal_length):.2f}")
print(f"decoding, core time per answer: {decode_core_ms('conventional_dp'):.2f} ms on two engines of 16 slots, "
      f"{decode_core_ms('pipeline'):.2f} ms on one of 32")
print(f"training, time per update: {ms_per_update('conventional_dp', 'train'):.0f} ms on two data-parallel ranks, "
      f"{ms_per_update('pipeline', 'train'):.0f} ms on one core")

# %%
swap_verdict = experiment.separated(np.log(ratios("pipeline", "pipeline_drain")))
conv_verdict = experiment.separated(np.log(speedup))
dp_gain = ms_per_update("pipeline", "train") / ms_per_update("conventional_dp", "train")
assert conv_verdict == "a > b" and np.median(speedup) > 1.3 and np.exp(at_equal_length) > 1.3, (speedup, slope)
assert med("pipeline", "gen_busy") > 0.6 and med("pipeline", "train_busy") > 0.7
assert med("conventional_dp", "gen_busy") + med("conventional_dp", "train_busy") < 1
assert 1.1 < dp_gain < 2 and decode_core_ms("conventional_dp") > 1.1 * decode_core_ms("pipeline"), dp_gain
assert med("conventional_dp", "slots_useful") > med("sync_dp", "slots_useful") + 0.15
assert med("pipeline_drain", "slots_useful") < med("pipeline", "slots_useful")
assert swap_verdict == "not separated", swap_verdict
print(f"pipeline RL consumed {np.median(speedup):.1f}x the answers per second of conventional RL (median over "
      f"{len(SEEDS)} seeds, separated), {np.exp(at_equal_length):.1f}x at equal answer length; the data-parallel "
      f"trainer took {dp_gain:.1f}x less time per update than one core; in-flight swaps against drain-then-swap: "
      f"{np.median(ratios('pipeline', 'pipeline_drain')):.2f}x, not separated")

# %% [markdown]
# **Where the hardware idles.** One second from the middle of three live runs; a coloured
# bar is a role computing, white is idle (conventional RL's engines and trainer ranks take
# turns on both cores):

# %%
from course_lib.pipeline.timeline import gantt

fig, axes = plt.subplots(3, 1, figsize=(11, 6))
for ax, arm in zip(axes, ("conventional_dp", "pipeline_drain", "pipeline")):
    r = live[arm]
    gantt(ax, r, (0.4 * r.seconds, 0.4 * r.seconds + 1.0))
fig.suptitle("Timelines of the live runs (coloured: computing; white: idle)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** pipeline RL consumed about 1.3 times the answers per second of
# conventional RL (median over twelve seeds, 0.8 to 2.2 by seed; separated), 1.4 at equal
# answer length and in tokens/s. Much of the spread between seeds is answer length: the
# arms' policies drift apart. Both arms use both cores, so the lead is not an idle core. It is what
# splitting costs: an engine decoding 16 slots spent 0.70 ms of core time per answer, the
# pipeline's generator of 32 slots 0.54 ms (a decoding step's fixed cost is shared by
# fewer answers), and two trainer ranks took 15 ms per update against one core's 19, not
# half, because preparing the batch, the optimizer step and publishing the weights run on
# one rank. Pipeline RL gives each role a whole core and its whole batch, and overlaps them. Continuous batching does
# not separate the arms: inside a round conventional RL refills its slots too (71% useful,
# the pipeline 60%), unlike the synchronous loop (41%). Drain-then-swap idles more slots
# (47%) while new weights wait for the live answers to end, but its answers/s are not
# separated from the in-flight swap's (1.08x).
#
# **The lag, per token.** Both bounds are 3, and the distributions differ:

# %%
fig, ax = plt.subplots(figsize=(7, 3.2))
shown = ("conventional_dp", "pipeline_drain", "pipeline")
for i, arm in enumerate(shown):
    counts = np.sum([r["lag_counts"] for r in rec[arm]], axis=0)
    ax.bar(np.arange(len(counts)) + (i - 1) * 0.27, counts / counts.sum(), 0.27, label=LABELS[arm])
ax.set_xlabel("lag of a consumed token (updates)")
ax.set_ylabel("fraction of tokens")
ax.set_title(f"Per-token lag, all recorded seeds (bound 3)")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# **Takeaway:** conventional RL spreads its tokens evenly over lags 0 to 3 (mean 1.5: each
# round's batches are trained on one after another). Pipeline RL runs with its queue
# nearly full, 69% of its tokens at lag 3 (mean 2.7), because here the trainer is the
# bottleneck: the generator fills the window backpressure allows, then waits.
# PipelineRL's "faster *and* fresher" rests on generation being the bottleneck; on this machine pipeline RL is faster and
# *staler*. Section 7 shows what the bound costs.

# %% [markdown]
# ## 5. Learning, over seeds
#
# The reward of each final policy on 1024 fresh draws of the training problems, minus the
# warm start's; and at **equal wall-clock**: the synchronous arms kept their weights after
# every update, so we can measure the policy they had at the moment pipeline RL finished.
# Every difference is paired by seed and reported as mean +- standard error over the
# seeds; it is called a difference only when the mean is more than two standard errors
# from zero (here about 0.014: smaller differences cannot be seen with twelve seeds):

# %%
# NBVAL_IGNORE_OUTPUT
warm_train = record["warm_reward"]["train"]


def gain(arm):  # per seed; arm: a name, or a list of runs
    return np.array([r["reward"]["train"] - warm_train for r in (rec[arm] if isinstance(arm, str) else arm)])


def verdict(diffs):  # ("mean +- s.e.", whether mean -/+ 2 s.e. clears zero)
    m, se = experiment.mean_se(diffs)
    words = {"a > b": "separated: higher", "a < b": "separated: lower", "not separated": "not separated"}
    return f"{m:+.3f} +- {se:.3f}", words[experiment.separated(diffs)]


print(f"{'arm':<32}{f'gain ({N_UPDATES} updates)':>24}{'minus conventional':>20}  verdict")
for arm in rec:
    m, se = experiment.mean_se(gain(arm))
    diff, v = verdict(gain(arm) - gain("conventional_dp")) if arm != "conventional_dp" else ("", "")
    print(f"{LABELS[arm]:<32}{m:>+15.3f} +- {se:.3f}{diff:>20}  {v}")
held = [r["reward"]["held_out"] for rs in rec.values() for r in rs]
print(f"held-out pairs ({len(held_out.held_out)} problems), final policies: mean {np.mean(held):.3f}, "
      f"max {np.max(held):.3f} (warm start {record['warm_reward']['held_out']:.3f})")
at_finish = {arm: np.array([r["at_pipeline_finish"]["reward"]["train"] for r in rec[arm]])
             for arm in ("sync_dp", "conventional_dp")}
for arm, rewards in at_finish.items():
    done = [r["at_pipeline_finish"]["updates"] for r in rec[arm]]
    diff, v = verdict(np.array([r["reward"]["train"] for r in rec["pipeline"]]) - rewards)
    print(f"equal wall-clock: when pipeline RL had finished, {LABELS[arm]} had done {np.median(done):.0f} of "
          f"{N_UPDATES} updates (median; {min(done)}-{max(done)}); pipeline RL ahead by {diff}: {v}")

# %%
per_update = {arm: experiment.separated(gain(arm) - gain("conventional_dp")) for arm in rec if arm != "conventional_dp"}
pipeline_final = np.array([r["reward"]["train"] for r in rec["pipeline"]])
equal_time = {arm: experiment.separated(pipeline_final - rewards) for arm, rewards in at_finish.items()}
assert all(experiment.mean_se(gain(arm))[0] - 2 * experiment.mean_se(gain(arm))[1] > 0 for arm in rec)
assert set(per_update.values()) == {"not separated"}, per_update
assert equal_time == {"sync_dp": "not separated", "conventional_dp": "not separated"}, equal_time
assert np.mean(held) < record["warm_reward"]["held_out"] and np.max(held) < 0.05
print("every arm learned (mean - 2 s.e. > 0); per update no arm is separated from conventional RL; at equal wall-clock pipeline RL is not separated from either synchronous arm")

# %%
from course_lib.pipeline.timeline import COLOURS, smoothed

fig, axes = plt.subplots(1, 2, figsize=(12, 4))
for arm in ("sync_dp", "conventional_dp", "pipeline"):
    time_ = np.mean([r["time"] for r in rec[arm]], axis=0)
    curves = np.array([smoothed(np.array(r["batch_reward"]), 15) for r in rec[arm]])
    m, se = curves.mean(0), curves.std(0, ddof=1) / np.sqrt(len(curves))
    for ax, x in ((axes[0], time_), (axes[1], np.arange(1, N_UPDATES + 1))):
        ax.plot(x, m, color=COLOURS[arm], label=LABELS[arm])
        ax.fill_between(x, m - se, m + se, color=COLOURS[arm], alpha=0.2)
for ax, xlabel in zip(axes, ("wall-clock time since the start (s, mean over seeds)", "trainer updates")):
    ax.axhline(warm_train, color="k", ls=":", lw=1, label=f"warm start ({warm_train:.2f})")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("batch reward (15-update mean)")
    ax.legend(fontsize=8)
axes[0].set_title("Reward vs wall-clock")
axes[1].set_title("Reward vs updates")
fig.suptitle(f"Reward of the consumed batches, mean +- s.e. over {len(SEEDS)} seeds")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** every arm learns, and per update no arm is separated from conventional
# RL: a lag of up to 3 costs no reward twelve seeds can see. Pipeline RL's lead in
# speed does not show as reward at equal wall-clock: when it had finished, conventional
# RL had done about 108 of its 150 updates and the synchronous loop about 60, and pipeline
# RL's lead over them (+0.006 +- 0.007 and +0.009 +- 0.007) is not separated: by then the
# reward rises slowly. On the held-out pairs RL lowered the reward on average (0.013 at the warm
# start, 0.001 after): this model memorises the problems it trains on, so every reward
# claim here is about the training problems.

# %% [markdown]
# ## 6. What each piece buys: the in-flight swap, the kept cache, the correction
#
# Each variant against pipeline RL itself, paired by seed. "swap time" is the generator's
# time spent loading new weights (and, recomputing, re-prefilling the live prefixes), as a
# share of the run. The **log-prob gap** is measured in the generator: for every answer
# that lived through a swap, the log-probs the sampler recorded against a fresh pass of
# the same weights. The probe costs a forward pass per answer, so it runs in two extra
# live runs of seed 0, not in the timed ones. The last row is the correction dropped at
# bound 8 (from the sweep of section 7), where tokens lag most:

# %%
# NBVAL_IGNORE_OUTPUT
probe = {}
for arm in ("pipeline", "pipeline_recompute"):
    with PipelineSystem(replace(base, seed=0, gap_probe_every=1, **experiment.ARMS[arm]), init_flat) as system:
        probe[arm] = system.train()
sweep = {int(k): v for k, v in record["sweep"].items() if k.isdigit()} | {3: rec["pipeline"]}
no_is_8 = record["sweep"]["no_is_8"]
print(f"{'arm':<32}{'answers/s':>10}{'x pipeline':>11}{'swap time':>10}{'re-prefilled':>13}{'gap':>8}{'ESS/N':>7}"
      f"{'reward vs pipeline':>20}  verdict")
rows = [(LABELS[a], rec[a], rec["pipeline"], a) for a in ("pipeline", "pipeline_drain", "pipeline_recompute",
                                                          "pipeline_no_is")]
rows.append(("pipeline, no IS, bound 8", no_is_8, sweep[8], "no_is_8"))
for label, runs, ref, arm in rows:
    diff, v = verdict(gain(runs) - gain(ref)) if arm != "pipeline" else ("", "")
    gap = f"{probe[arm].generator_gap:.0e}" if arm in probe else "-"
    swap = np.median([r["swap_seconds"] / r["seconds"] for r in runs])
    print(f"{label:<32}{med(runs, 'answers_per_s'):>10,.0f}{np.median(ratios(runs, ref)):>11.2f}{swap:>10.1%}"
          f"{med(runs, 'recomputed_tokens') / N_UPDATES:>9.0f}/upd{gap:>8}{med(runs, 'ess'):>7.3f}{diff:>20}  {v}")
print("(the bound-8 row is against pipeline RL at bound 8)")

# %%
recompute_speed = experiment.separated(np.log(ratios("pipeline", "pipeline_recompute")))
no_is = {bound: experiment.separated(gain(runs) - gain(ref))
         for bound, runs, ref in ((3, rec["pipeline_no_is"], rec["pipeline"]), (8, no_is_8, sweep[8]))}
assert recompute_speed == "not separated", recompute_speed
assert no_is == {3: "not separated", 8: "not separated"}, no_is
assert probe["pipeline_recompute"].generator_gap < 1e-5 < 1e-3 < probe["pipeline"].generator_gap, probe
assert min(p.gap[1] for p in probe.values()) > 100  # tokens probed
assert med("pipeline", "ess") > 0.95 and med(no_is_8, "ess") < med("pipeline", "ess")
assert all(experiment.separated(gain(a) - gain("pipeline")) == "not separated"
           for a in ("pipeline_drain", "pipeline_recompute"))
print("keeping vs recomputing the cache: answers/s and reward not separated; the kept cache leaves a gap "
      "above 1e-3 in log-prob, recomputing removes it (below 1e-5); dropping the correction: not separated at "
      "bound 3 or 8; drain-then-swap's reward: not separated")

# %% [markdown]
# **Takeaway:** no variant is separated from pipeline RL, in reward or in answers/s.
# Recomputing spends 8% of the run in swaps (1% keeping), re-prefilling about 65 tokens
# per update, on a generator that waits for the trainer anyway; a large model with long answers in flight pays a prefill
# of all of them at every swap, which is why PipelineRL and SkyRL keep the cache (AReaL
# recomputes after an interrupt). What keeping costs is a log-prob gap of the order of
# 1e-2, which (07.1) treats as a small extra mismatch between $\mu$ and $\pi_u$; the
# PipelineRL paper also found it negligible (its Figure 7). Dropping the correction is not
# separated at either bound. At bound 8, where ESS/N falls to 0.85, the uncorrected runs
# gained less in 9 of the 12 seeds and one fell below its warm start; the correction
# guards against such a collapse, but the mean over twelve seeds cannot establish it.

# %% [markdown]
# ## 7. The knobs: `max_lag`, and conventional RL's $k$
#
# Pipeline RL at five bounds and conventional RL at four steps per round, the same twelve
# seeds. A larger bound lets the generator run further ahead of the trainer; a larger $k$
# generates more batches per round with one version of the weights:

# %%
# NBVAL_IGNORE_OUTPUT
ks = {1: rec["sync_dp"], 4: rec["conventional_dp"]} | {int(k[1:]): v for k, v in record["sweep"].items()
                                                          if k.startswith("k")}
print(f"{'':>22}{'answers/s':>10}{'tokens/s':>9}{'tok/answer':>11}{'lag mean':>9}{'train busy':>11}{'gain':>18}")
for name, runs in [(f"pipeline, max_lag {b}", r) for b, r in sorted(sweep.items())] + \
                  [(f"conventional, k = {k}", r) for k, r in sorted(ks.items())]:
    m, se = experiment.mean_se(gain(runs))
    print(f"{name:>22}{med(runs, 'answers_per_s'):>10,.0f}{med(runs, 'tokens_per_s'):>9,.0f}"
          f"{med(runs, 'answer_tokens'):>11.1f}{med(runs, 'lag_mean'):>9.2f}{med(runs, 'train_busy'):>11.0%}"
          f"{m:>+11.3f} +- {se:.3f}")

# %%
rate = {lag: med(runs, "answers_per_s") for lag, runs in sweep.items()}
bounds = sorted(sweep)
pairs = {(a, b): experiment.separated(gain(sweep[a]) - gain(sweep[b])) for a in bounds for b in bounds if a < b}
assert rate[1] * 1.2 < rate[3] and med(sweep[8], "lag_mean") > 2 * med(sweep[3], "lag_mean")
assert all(med(sweep[lag], "train_busy") > 0.9 for lag in (5, 8)) and med(sweep[1], "train_busy") < 0.8
assert abs(rate[8] / rate[5] - 1) < 0.1
k_rate = {k: med(runs, "answers_per_s") for k, runs in ks.items()}
assert k_rate[1] < k_rate[2] < k_rate[4] < k_rate[8] < rate[3], k_rate
k_pairs = {(a, b): experiment.separated(gain(ks[a]) - gain(ks[b])) for a in ks for b in ks if a < b}
assert set(pairs.values()) == set(k_pairs.values()) == {"not separated"}, (pairs, k_pairs)
print(f"bound 8 against bound 3: {rate[8] / rate[3]:.2f}x the answers/s, a mean lag "
      f"{med(sweep[8], 'lag_mean') / med(sweep[3], 'lag_mean'):.1f}x larger; conventional RL at k = 8: "
      f"{k_rate[8] / rate[3]:.2f}x pipeline RL's answers/s at bound 3; no two bounds, and no two k, separated "
      "in reward")

# %% [markdown]
# **Takeaway:** the bound trades freshness for speed until the trainer saturates. From
# bound 1 to 3 the answers/s grow by 40%; past 3 the trainer is busy 96% of the time and
# they grow little, while the mean lag keeps growing. Conventional RL also speeds up with
# $k$ (fewer round boundaries, each waiting for its longest answer), but at $k$ = 8, whose
# tokens may lag 7 updates, it stays below pipeline RL at bound 3. No two bounds and no
# two $k$ are separated in reward at this step size and length. Choose the smallest bound
# at which the trainer stays busy: a larger one only makes every token staler.

# %% [markdown]
# ## 8. Against the published systems
#
# - **PipelineRL** (128 H100s, Qwen2.5-7B): about 2x faster learning than conventional RL
#   with $k$ = 32 steps per round, from about 2x the samples per second, with fresher data.
#   (The paper estimated its baseline's throughput from 2 generation and 2 training nodes,
#   and its own analytic model gives at most 1.57x at 128 GPUs.) Here, against
#   conventional RL run the same way (an engine and a trainer rank on every core, $k$ = 4):
#   1.3x the answers per second, the same reward per update, no reward lead separated at
#   equal wall-clock, and staler, not fresher, data, because this trainer is the
#   bottleneck (sections 4 and 7). The mechanism agrees with the paper's: conventional RL
#   splits each phase over all the hardware, and small per-device batches use it less
#   well than one role per device does. The size does not carry over: here a batch is 32
#   answers of a 130k-parameter model.
# - **Drop or block.** Here backpressure blocks the generator. PipelineRL, run without a
#   `max_lag`, bounds its queue instead: when the queue is full its preprocessor drops the
#   oldest data (`pop_old_data`). prime-rl bounds how far inference runs ahead with
#   `max_async_level` (the role of `max_lag` here) and discards rollouts older than
#   `max_off_policy_steps`.
# - **Keep or recompute.** PipelineRL and SkyRL keep the cache (vLLM's pause "keep" mode);
#   AReaL recomputes after an interrupt; NeMo-RL exposes both
#   (`recompute_kv_cache_after_weight_updates`).
# - What this machine cannot show: a generator and a trainer on separate GPUs with
#   different speeds, where the bottleneck (section 7) sets both the speedup and the lag.

# %% [markdown]
# ## Summary
#
# - Conventional RL alternates generation and training on all the hardware; pipeline RL
#   overlaps them, swaps new weights in between two decoding steps and refills slots at once.
# - On two CPU cores, against conventional RL with an engine and a data-parallel trainer
#   rank per core and $k$ matched to the bound, pipeline RL consumed about 1.3x the answers
#   per second (1.4x at equal answer length): one role per core, overlapped, used the cores
#   better than each phase split over both.
# - Per update the corrected arms learned alike over twelve seeds; at equal wall-clock
#   pipeline RL's reward lead was not separated.
# - Drain-then-swap, recomputing the cache and dropping the correction were not separated
#   from pipeline RL in reward; dropping the correction at bound 8 lowered the gain in 9 of
#   12 seeds and collapsed one. The kept cache's log-prob gap is of order 1e-2.
# - Backpressure bounds the lag; a larger bound buys speed only until the trainer saturates.
#
# **Full scale.** This lesson's experiment is the recorded one at both scales; to measure
# it again, run `python -m course_lib.pipeline.experiment --seeds 12 --out my_run.json`
# (about 14 minutes on two cores) and load it with `experiment.load(Path("my_run.json"))`.
# No device path is implemented: the sampler and the trainer run on the CPU (lesson 11's
# capstone runs on GPUs).
#
# **References.** A. Piché, E. Kamalloo, R. Pardinas, X. Chen, D. Bahdanau, *PipelineRL:
# Faster On-policy Reinforcement Learning for Long Sequence Generation*, arXiv 2509.19128,
# 2025 (ServiceNow/PipelineRL). W. Fu et al., *AReaL*,
# arXiv 2505.24298, 2025. Z. Shao et al., *DeepSeekMath*, arXiv 2402.03300, 2024 (GRPO).
# L. Espeholt et al., *IMPALA*, arXiv 1802.01561, 2018 (truncated importance weights).
# G.-I. Yu et al., *Orca: A Distributed Serving System for Transformer-Based Generative
# Models*, OSDI 2022 (continuous batching: scheduling per decoding step).
#
# ## Glossary
#
# | term | meaning |
# |---|---|
# | answers/s | answers the trainer consumed per second of the run |
# | lag (per token) | trainer version minus the version that sampled the token (07.4) |
# | gen busy, train busy | fraction of the run's wall time each role spent computing |
# | slots useful | fraction of decoding slot-steps that advanced a live answer |
# | KV cache | the keys and values of earlier tokens, kept so that each step decodes one token |
# | continuous batching | a finished answer's slot takes a new one at once |
# | backpressure | the generator may not start a group the bound would make too stale |
# | in-flight update | new weights loaded between two decoding steps of live answers |
# | log-prob gap | $\lvert\log\mu - \log\pi_v\rvert$ of tokens sampled after a swap, against a fresh pass of the same weights |
# | gain | final reward on the training problems minus the warm start's |
#
# **Exercises:** `exercises/07_pipeline_rl.ipynb`: the per-token truncated-IS loss with
# mixed versions, per-token lag accounting, the time a run takes to reach a reward level,
# the in-flight swap in a decoding loop, and the refill of free slots under backpressure.
# Grade with `course grade exercises/07_pipeline_rl.ipynb`.
