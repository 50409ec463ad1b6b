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
# # 03 · IMPALA: actors, learner, V-trace (and SEED RL)
#
# Lesson 01's loop does one thing at a time: act, then learn, then act again. While the
# learner computes a gradient the environments wait, and while the environments step the
# learner waits. **Decoupling acting from learning buys throughput**: many *actor*
# processes step environments all the time and stream trajectories to one *learner*,
# which never waits for an episode to finish (Espeholt et al. 2018, IMPALA, reached
# 250,000 frames/s this way). The price: an actor acts with the weights it had when its
# unroll started, so by the time the learner uses the data, **the actor's policy lags the
# learner's** by some updates. The data is off-policy, and lesson 02's importance weights
# return. **V-trace** corrects for the lag with *truncated* importance weights, which keep
# the variance bounded. Finally, **SEED RL** (Espeholt et al. 2020) moves inference from
# the actors to the learner's accelerator.
#
# **Learning goals**
# 1. Say where the throughput of an actor-learner split comes from, and where the policy lag comes from.
# 2. Compute V-trace targets and advantages (03.1-03.4) on a trajectory batch, check them
#    against a naive implementation of the paper's formula, and know its off-by-one.
# 3. Run a real multi-process IMPALA system (shared-memory rollout buffers, versioned
#    weights), read its per-phase timers, and measure the policy lag of every batch.
# 4. Measure, with a *controlled* lag, what no correction, V-trace and on-policy learning do.
# 5. Compare the IMPALA and SEED RL layouts: frames/s measured here, and when each wins.
#
# Builds on lesson 01 (the policy gradient with a baseline) and lesson 02 (importance
# weights, truncation, staleness).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, pick

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## Key equations
#
# An actor acts with the **behaviour policy** $\mu$ (the learner's weights from some
# updates ago) and records, for every step $t$ of an unroll of length $T$: $x_t$, $a_t$,
# $r_t$, whether the episode ended ($\gamma_t = \gamma$, or 0 at an episode end), and
# $\log\mu(a_t\mid x_t)$. The learner's policy is $\pi$, its value estimate $V$. With the
# *truncated* importance weights
#
# $$\rho_t = \min\Big(\bar\rho, \frac{\pi(a_t\mid x_t)}{\mu(a_t\mid x_t)}\Big), \qquad
#   c_i = \min\Big(\bar c, \frac{\pi(a_i\mid x_i)}{\mu(a_i\mid x_i)}\Big), \qquad \bar\rho \ge \bar c, \qquad (03.1)$$
#
# the **V-trace target** of $V(x_s)$ is (Espeholt et al. 2018, eq. 1, its $n$-step sum run to the end of
# the unroll, $n = T - s$)
#
# $$v_s = V(x_s) + \sum_{t=s}^{T-1} \Big(\prod_{i=s}^{t-1} \gamma_i c_i\Big)\, \delta_t V, \qquad
#   \delta_t V = \rho_t\big(r_t + \gamma_t V(x_{t+1}) - V(x_t)\big). \qquad (03.2)$$
#
# **Mind the index:** the product stops at $t - 1$, so the first term ($t = s$) has no
# $c$ at all. Running it to $t$ is the classic off-by-one; it gives other numbers (we
# check it below). In one backward pass from the bootstrap value $V(x_T)$:
#
# $$v_s - V(x_s) = \delta_s V + \gamma_s c_s\,\big(v_{s+1} - V(x_{s+1})\big), \qquad v_T = V(x_T). \qquad (03.3)$$
#
# The **policy-gradient advantage** looks one step ahead with the target and truncates
# its ratio with a third threshold $\bar\rho_{pg}$:
#
# $$A_s = \min\Big(\bar\rho_{pg}, \frac{\pi(a_s\mid x_s)}{\mu(a_s\mid x_s)}\Big)\big(r_s + \gamma_s v_{s+1} - V(x_s)\big), \qquad v_T = V(x_T). \qquad (03.4)$$
#
# The **loss** of a batch (targets and advantages are constants), averaged over its steps:
#
# $$L = -A_s\log\pi(a_s\mid x_s) \;+\; c_V\,\tfrac12\big(v_s - V(x_s)\big)^2 \;-\; c_H\,\mathcal H\big(\pi(\cdot\mid x_s)\big). \qquad (03.5)$$
#
# What each part does: with all ratios 1 (on-policy) $v_s$ is the $n$-step bootstrapped
# return. $\bar\rho$ decides *which* policy's value $v_s$ estimates: $\pi$ when
# $\bar\rho = \infty$, a policy between $\mu$ and $\pi$ for finite $\bar\rho$ (Theorem 1 of
# the paper). $\bar c$ only affects how fast the estimate converges (how far the trace
# reaches). Both caps keep the products of ratios, whose variance lesson 02 measured, bounded.
# **No correction** is (03.2)-(03.5) with every ratio set to 1.
#
# **Policy lag.** The learner's weights have version $u$ after $u$ updates; every action
# is stamped with the version that chose it; a batch consumed at version $u$ has lag
# $u - \min_t \text{version}_t$ per rollout.
#
# **Pseudocode** (IMPALA; TorchBeast's MonoBeast layout)
# ```
# actor i (a process, forever):                    learner (one process):
#     index = next free slot                           wait for batch_size full slots (with a timeout)
#     pull the newest weights if their version moved   copy them into one batch; free the slots
#     for t in 0..T-1: x_t -> a_t ~ mu, log mu,        lag of each rollout = version - its oldest version
#         version; step envs -> r_t, done_t            v_s, A_s = V-trace(...); gradient step on L
#     slot.obs[T] = x_T; hand the index back as full   publish weights, version += 1
# ```
#
# | equation | function in `course_lib` |
# |---|---|
# | (03.1) truncated ratios | `vtrace.truncated_ratios` |
# | (03.2)-(03.4) targets and advantages | `vtrace.vtrace(log_rhos, discounts, rewards, values, bootstrap_value, ...)` |
# | (03.3) the backward recursion alone | `vtrace.vtrace_recursion(deltas, discounts, cs)` |
# | (03.2) the naive double sum (the test oracle) | `vtrace.vtrace_naive` |
# | $\gamma_t = \gamma(1 - d_t)$ | `vtrace.discounts_from_dones` |
# | (03.5) the loss, V-trace or no correction | `actor_learner.learner.loss_terms`, `Learner.update` |
# | policy lag per rollout | `actor_learner.learner.rollout_lag` |
# | one unroll of an actor | `actor_learner.actor.unroll` |
# | slots, weights with a version | `actor_learner.buffers.RolloutBuffers`, `SharedWeights` |
# | the processes, supervision, timers | `actor_learner.system.ActorLearnerSystem`, `actor_learner.timers.Timings` |
# | SEED RL's central inference | `actor_learner.seed.inference_main`, `seed_actor_main` |
# | the controlled-lag ablation | `lag.run_lag_ablation(arms, seeds, LagConfig(...))` |

# %% [markdown]
# ## 1. V-trace on a batch of trajectories
#
# A hand-sized example: two trajectories (`B = 2`) of `T = 5` steps, time-major, the
# second holding an episode end at step 2. The ratios $\pi/\mu$ fall on both sides of the
# thresholds $\bar\rho = 1.5$, $\bar c = 0.8$, $\bar\rho_{pg} = 1$:

# %%
from course_lib.rl.vtrace import discounts_from_dones, vtrace

ratios = np.array([[2.5, 0.5], [1.2, 0.9], [0.3, 3.0], [1.0, 1.1], [0.7, 0.6]])
dones = np.array([[0, 0], [0, 0], [0, 1], [0, 0], [0, 0]])
rewards = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 0.5]])
values = np.array([[0.5, 0.2], [0.4, 0.9], [0.6, 0.8], [0.3, 0.1], [0.7, 0.4]])
bootstrap = np.array([0.6, 0.5])
discounts = discounts_from_dones(dones, gamma=0.9)
out = vtrace(np.log(ratios), discounts, rewards, values, bootstrap,
             clip_rho_threshold=1.5, clip_c_threshold=0.8, clip_pg_rho_threshold=1.0)
header = ("pi/mu", "rho_t", "c_t", "gamma_t", "v_t", "A_t")
print(f"{'t':>2} | " + " | ".join(f"{h:>11}" for h in header) + "   (env 0, env 1 in each column)")
for t in range(5):
    cols = [ratios[t], out.clipped_rhos[t], out.cs[t], discounts[t], out.vs[t], out.pg_advantages[t]]
    print(f"{t:>2} | " + " | ".join(f"{c[0]:>5.2f} {c[1]:>5.2f}" for c in cols))

# %% [markdown]
# The learner turns these targets into the loss (03.5). In `loss_terms`, look at where the
# log-ratios come from (its own log-probabilities minus the actor's), at the targets
# entering the loss as constants, and at no correction: the same code, its log-ratios times 0:

# %%
from course_lib import show_source
from course_lib.actor_learner.learner import loss_terms

show_source(loss_terms)

# %% [markdown]
# `vtrace` itself is the backward recursion (03.3), one pass from the last step to the
# first. The test of this code is the formula itself, written as
# naively as possible: `vtrace_naive`, an explicit double sum with an explicit product per
# term, O(T^2), sharing no code with the recursion (the TorchBeast test's idea; the grader
# of this lesson's exercises uses the same oracle). On random inputs crossing both
# thresholds:

# %%
from course_lib.rl.vtrace import vtrace_naive

worst, worst_inclusive = 0.0, 0.0
rng = np.random.default_rng(0)
for _ in range(20):
    args = (rng.normal(scale=0.8, size=(12, 4)),  # log(pi/mu): ratios on both sides of 0.8 and 1.5
            0.9 * (rng.random((12, 4)) > 0.2),  # discounts, 0 where an episode ended
            rng.normal(size=(12, 4)), rng.normal(size=(12, 4)), rng.normal(size=4))  # rewards, values, V(x_T)
    fast = vtrace(*args, clip_rho_threshold=1.5, clip_c_threshold=0.8).vs
    worst = max(worst, np.abs(fast - vtrace_naive(*args, 1.5, 0.8)).max())
    worst_inclusive = max(worst_inclusive, np.abs(fast - vtrace_naive(*args, 1.5, 0.8, inclusive=True)).max())
print("max |recursion - O(T^2) formula| over 20 random batches:             ", "< 1e-12" if worst < 1e-12 else worst)
print(f"max |recursion - formula with the product running to t (off-by-one)|: {worst_inclusive:.2f}")
assert worst < 1e-12 and worst_inclusive > 0.1

# %% [markdown]
# Two properties pin the boundary cases: on-policy data (all ratios 1) gives lesson 00's
# discounted return with a bootstrap (the $n$-step return), and an episode end cuts the
# trace, so a trajectory holding two episodes equals the two computed apart:

# %%
from course_lib.rl.pg import discounted_returns

on_policy = vtrace(np.zeros_like(ratios), discounts, rewards, values, bootstrap)
print("on-policy v_t, env 0:", on_policy.vs[:, 0].round(4))
print("n-step return, env 0:", discounted_returns(rewards, dones, 0.9, bootstrap)[:, 0].round(4))
assert np.allclose(on_policy.vs, discounted_returns(rewards, dones, 0.9, bootstrap))
apart = [vtrace(np.log(ratios[rows, 1:]), discounts[rows, 1:], rewards[rows, 1:], values[rows, 1:], boot,
                1.5, 0.8, 1.0).vs[:, 0] for rows, boot in ((slice(0, 3), np.array([99.0])), (slice(3, 5), bootstrap[1:]))]
print("env 1 whole:", out.vs[:, 1].round(4), "| its two episodes apart:", np.concatenate(apart).round(4))
assert np.allclose(np.concatenate(apart), out.vs[:, 1])

# %% [markdown]
# **What the truncation buys.** A one-state chain with two actions: action 0 pays 1,
# action 1 pays 0, $\gamma = 0.9$. The target policy $\pi$ takes action 0 with
# probability 0.8, so $V^\pi = 8$. The behaviour $\mu$ drifts away from it (as a stale
# actor's does). Each estimator learns $V$ as the fixed point of its own targets from
# 2,000 behaviour trajectories of 20 steps: no correction (ratios ignored), V-trace
# ($\bar\rho = \bar c = 1$) and untruncated importance sampling.

# %%
from course_lib.pipeline.lag import two_action_chain_targets

p_behaviour = np.array([0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
chain = [two_action_chain_targets(0.8, p) for p in p_behaviour]
names = ("no correction", "V-trace", "importance sampling")
print(f"{'mu(action 0)':>12} | " + " | ".join(f"{n + ' (mean, std)':>31}" for n in names) + " | V-trace theory")
for p, c in zip(p_behaviour, chain):
    print(f"{p:>12.1f} | " + " | ".join(f"{c[n].mean():>22.2f} {c[n].std():>8.2f}" for n in names)
          + f" | {c['V-trace fixed point'][0]:>14.2f}")
n_traj = len(chain[0]["V-trace"])
mean_of = {n: np.array([c[n].mean() for c in chain]) for n in names}
std_of = {n: np.array([c[n].std() for c in chain]) for n in names}
theory = np.array([c["V-trace fixed point"][0] for c in chain])
drift = p_behaviour < 0.8
print(f"Monte-Carlo s.e. of a mean (std / sqrt({n_traj:,})): at most "
      + ", ".join(f"{n} {std_of[n].max() / np.sqrt(n_traj):.3f}" for n in names)
      + f"; largest |V-trace mean - theory|: {np.abs(mean_of['V-trace'] - theory).max():.2f}")
assert all(np.abs(mean_of["no correction"] - 8)[drift] > np.abs(mean_of["V-trace"] - 8)[drift])
assert all(std_of["V-trace"][drift] < std_of["importance sampling"][drift])
far = p_behaviour <= 0.4
assert all(std_of["importance sampling"][far] > 3 * std_of["V-trace"][far])
assert np.abs(mean_of["V-trace"] - theory).max() < 0.25 and np.abs(mean_of["importance sampling"] - 8).max() < 0.5

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
for name, marker in zip(names, "o^s"):
    axes[0].plot(p_behaviour, [c[name].mean() for c in chain], marker + "-", label=name)
    axes[1].semilogy(p_behaviour, [c[name].std() for c in chain], marker + "-", label=name)
axes[0].plot(p_behaviour, [c["V-trace fixed point"][0] for c in chain], "k:", label=r"$V^{\pi_{\bar\rho}}$ (theory)")
axes[0].axhline(8.0, color="k", lw=0.8, label=r"$V^\pi = 8$")
axes[0].set_ylabel("mean target v_0 (return units)")
axes[0].set_title("What each target estimates")
axes[1].set_ylabel("std of one target v_0 (return units, log scale)")
axes[1].set_title("How noisy one target is")
for ax in axes:
    ax.invert_xaxis()
    ax.set_xlabel(r"behaviour $\mu$(action 0); the target $\pi$ takes it with 0.8")
    ax.legend(fontsize=8)
fig.suptitle("Off-policy targets in a two-action chain as the behaviour drifts from the target")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** no correction estimates the *behaviour's* value (biased as soon as the
# policies differ); importance sampling stays near $V^\pi = 8$, but one of its targets is
# several times noisier than V-trace's once $\mu$ drifts far. V-trace sits in between: the
# lowest variance, and a bias towards $V^{\pi_{\bar\rho}}$, the value of a policy between
# $\mu$ and $\pi$ (the paper's Theorem 1); its mean lands near it (the largest gap is
# printed above, beside the Monte-Carlo s.e.). The noisier the targets, the noisier the
# gradient steps; that is why IMPALA truncates.

# %% [markdown]
# ## 2. Two layouts: IMPALA and SEED RL
#
# **IMPALA** puts a copy of the policy in every actor: inference runs on the actors'
# CPUs, whole unrolls travel to the learner, and new weights travel back. **SEED RL**
# keeps the policy on the learner: actors only step environments, send one observation
# per step and wait for the action that a central, batched inference returns. Our
# implementation has both layouts behind one class; the learner cannot tell them apart.

# %%
from course_lib.actor_learner.diagrams import architecture_diagram

fig = architecture_diagram()
plt.show()

# %% [markdown]
# **Takeaway:** IMPALA moves big things rarely (a whole unroll, a whole weight vector);
# SEED moves small things every step and keeps the accelerator busy with one big batch.
#
# How the processes talk, in `course_lib.actor_learner`: the rollout buffers are
# preallocated tensors in shared memory (`tensor.share_memory_()`), `n_slots` unrolls of
# `[T, B]`; only a slot's *index* travels (TorchBeast's free and full queues). Each actor
# has its own pipe to the learner for those indices, so a killed actor can only break its
# own pipe. Weights are published as one flat shared tensor with a version number under
# a seqlock, so no actor can block the learner. The seqlock, writer and reader:

# %%
from course_lib.runtime.weights import SharedWeights

show_source(SharedWeights.publish)
show_source(SharedWeights.pull)

# %% [markdown]
# The writer makes the sequence number odd while it copies; a reader retries if the
# number was odd or changed during its copy. This relies on the stores becoming visible
# in program order, as on x86; a weakly ordered CPU (ARM) would need memory fences,
# which these tensor writes do not issue.

# %% [markdown]
# ## 3. A real IMPALA system on this machine
#
# Actor processes with eight CartPoles each, unrolls of 16 steps; the learner runs in
# this notebook's process. Everything the run depends on:

# %%
from course_lib import describe
from course_lib.actor_learner.system import ActorLearnerSystem, SystemConfig
from course_lib.runtime.processes import live_children

system_config = SystemConfig(n_actors=pick(cpu=2, full=8), envs_per_actor=8, unroll=16, batch_size=pick(cpu=2, full=8))
train_seconds = pick(cpu=6.0, full=60.0)
print(describe(system_config, exclude=("stall_timeout_s", "join_timeout_s", "max_restarts", "crash_after")))

# %% [markdown]
# We train for a fixed wall-clock time. The `with` block guarantees that every child
# process is stopped when it ends, whatever happens inside it:

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.actor_learner.timers import timing_table

with ActorLearnerSystem(system_config) as system:
    impala = system.train(seconds=train_seconds)
    pids = system.pids()
first_20, last_20 = np.mean(impala.returns[:20]), np.mean(impala.returns[-20:])
print(f"{impala.updates} updates, {impala.frames:,} frames in {impala.seconds:.1f} s: "
      f"{impala.frames_per_second:,.0f} env frames/s on {os.cpu_count()} cores")
print(f"episode return: first 20 episodes {first_20:.0f}, last 20 {last_20:.0f}: "
      + ("the policy learned" if last_20 > first_20 else "the policy did not learn in this run"))
print(timing_table({process: {**phases, "unaccounted": max(0.0, impala.seconds - sum(phases.values()))}
                    for process, phases in impala.timings.items()}, impala.seconds))

# %%
import psutil

assert impala.frames_per_second > 0 and impala.updates > 10
if current_scale() == "cpu":
    assert last_20 > first_20, (first_20, last_20)
assert not live_children() and not any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie" for p in pids)
for process, phases in impala.timings.items():
    assert all(0 <= s <= 1.5 * impala.seconds for s in phases.values()), (process, phases)
print("every phase timer is within the wall time; no child process is left")

# %% [markdown]
# Reading the timers (phases in the glossary; "unaccounted" is the rest of the wall
# time): they measure wall time, so when the load average exceeds the core count a phase
# also counts the time its process waited for a CPU, and a share is not compute.
# "Waiting" is where the balance shows: a learner that waits is starved of data (more
# actors help only on idle cores), actors that wait for free slots are ahead of it.
#
# **The measured policy lag.** Every consumed unroll has a lag (the learner's version
# minus the oldest version that acted in it):

# %%
lags = impala.lags
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.bar(*np.unique(lags, return_counts=True), width=0.8)
ax.set_xlabel("policy lag of an unroll (learner updates between acting and learning)")
ax.set_ylabel("unrolls (count)")
ax.set_title(f"Measured policy lag, IMPALA layout ({system_config.n_actors} actors, {len(lags)} unrolls)")
fig.tight_layout()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
median_lag, within_2 = np.median(lags), np.mean(lags <= 2)
assert lags.min() >= 0 and median_lag <= 2, (median_lag, np.unique(lags, return_counts=True))
print(f"lag of the {len(lags)} unrolls: median {median_lag:.0f} updates, {100 * within_2:.0f}% within 2 updates, "
      f"largest {lags.max()}")

# %% [markdown]
# **Takeaway:** even a few actors on one machine produce data that is off-policy by the
# lag printed above. The lag is not a parameter you set: it comes from the number of
# slots in flight, the actors' speed and the learner's speed. With hundreds of actors it
# is larger and varies more, which is why the learner must correct for it.

# %% [markdown]
# ## 4. The ablation: controlled lag, no correction vs V-trace
#
# To see what the lag does to learning we control it instead: the batch for update $u$
# is collected with the learner's weights of update $u - k$ (a ring of parameter
# snapshots), so every rollout is exactly $k$ updates stale (in the first $k$ updates the
# initial weights act, so the lag grows from 0 to $k$). We compare no correction and
# V-trace at each $k$, and on-policy learning ($k = 0$, where both coincide). Every
# (method, $k$, seed) is an independent agent; all train at once with one `vmap`-ed
# network (seeded, so the run is reproducible on a given machine). CartPole runs vary a
# lot from seed to seed, so we report the mean over seeds $\pm$ its standard error (s.e.
# = standard deviation over seeds / $\sqrt{\text{seeds}}$); a difference counts only where
# it exceeds twice its s.e. The ring hands each agent its acting weights (the clamp at 0
# is the warm-up):

# %%
from course_lib.pipeline.lag import _PolicyRing

show_source(_PolicyRing.behaviour)

# %% [markdown]
# The configuration (the whole ablation runs in one process, on one torch thread):

# %%
from course_lib.pipeline.lag import METHODS, LagConfig, default_arms, run_lag_ablation

lag_config = LagConfig(n_updates=pick(cpu=500, full=1000), n_envs=pick(cpu=16, full=32), hidden=64, lr=3e-3)
lag_values = pick(cpu=[16, 64], full=[4, 16, 64, 128])
arms = default_arms(lag_values)
lag_seeds = list(range(pick(cpu=16, full=32)))
print(describe(lag_config))
print("arms:", ", ".join(a.label for a in arms), f"| seeds: 0..{lag_seeds[-1]} ({len(lag_seeds)} per arm)")

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib import progress

with progress(lag_config.n_updates, "ablation updates (all agents at once)", unit="update") as bar:
    ablation = run_lag_ablation(arms, lag_seeds, lag_config, progress=lambda _: bar.update())
print(f"{len(arms) * len(lag_seeds)} agents x {lag_config.n_updates} updates x {ablation.frames} frames "
      f"in {ablation.seconds:.0f} s (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")

# %% [markdown]
# Per arm: the mean return over the last 25% of the updates (one number per seed), the
# policy's entropy over the same updates, how far the learner's policy is from the one
# that acted (mean $|\log\pi(a|x) - \log\mu(a|x)|$ over the batch, measured for every arm),
# and how many seeds *collapsed* (ended below a return of 50: a near-deterministic policy
# that drops the pole at once):

# %%
# NBVAL_IGNORE_OUTPUT
def mean_se(x):
    """Mean and standard error over seeds (the last axis)."""
    return x.mean(axis=-1), x.std(axis=-1, ddof=1) / np.sqrt(x.shape[-1])


final = ablation.final()  # [arms, seeds]
n_tail = lag_config.n_updates // 4
final_entropy = ablation.entropy[..., -n_tail:].mean(axis=-1)  # [arms, seeds]
final_divergence = ablation.divergence[..., -n_tail:].mean(axis=(-1, -2))  # [arms]
collapsed = (final < 50).sum(axis=-1)
ret_mean, ret_se = mean_se(final)
ent_mean, ent_se = mean_se(final_entropy)
print(f"{'arm':<24} {'return (mean +- s.e.)':>22} {'min':>5} {'max':>5} {'collapsed':>10} "
      f"{'entropy (mean +- s.e.)':>23} {'|log pi/mu|':>12}")
for i, arm in enumerate(arms):
    print(f"{arm.label:<24} {ret_mean[i]:>14.0f} +- {ret_se[i]:<4.0f} {final[i].min():>5.0f} {final[i].max():>5.0f} "
          f"{collapsed[i]:>5}/{len(lag_seeds):<4} {ent_mean[i]:>15.2f} +- {ent_se[i]:.2f} {final_divergence[i]:>12.2f}")
index = {(a.method, a.lag): i for i, a in enumerate(arms)}
print("\nV-trace minus no correction, in units of the difference's standard error:")
gap = {}
for k in lag_values:
    vt, nc = index["v-trace", k], index["no correction", k]
    for name, m, se in (("return", ret_mean, ret_se), ("entropy", ent_mean, ent_se)):
        d, s = m[vt] - m[nc], np.hypot(se[vt], se[nc])
        gap[name, k] = d / s
        print(f"  k = {k:>2}  {name:<8} {d:>+7.2f} +- {s:.2f}  ({d / s:+.1f} s.e.)")

on_policy, k_max = index["v-trace", 0], max(lag_values)
nc_max, vt_max = index["no correction", k_max], index["v-trace", k_max]
nc_entropy = ablation.entropy[nc_max].mean(axis=0)  # [updates], mean over seeds
print(f"\nat k = {k_max}, entropy (nats) over the last 25% of updates: no correction {ent_mean[nc_max]:.2f}, V-trace "
      f"{ent_mean[vt_max]:.2f}, on-policy {ent_mean[on_policy]:.2f}; collapsed seeds {collapsed[nc_max]} and "
      f"{collapsed[vt_max]} of {len(lag_seeds)}; no correction's entropy: {nc_entropy[0]:.2f} at update 0, "
      f"{nc_entropy[k_max]:.2f} at update {k_max} (the end of the warm-up)")


def verdict(d, s):
    return f"{d / s:+.2f} s.e.: " + ("separated" if abs(d) > 2 * s else "not separated")


separated = [k for k in lag_values if gap["return", k] > 2]
print("V-trace's return above no correction's by more than 2 s.e. at lags:", ", ".join(map(str, separated)) or "none")
print("on-policy minus each lagged arm, return:")
for i, arm in enumerate(arms):
    if i != on_policy:
        print(f"  {arm.label:<24} {verdict(ret_mean[on_policy] - ret_mean[i], np.hypot(ret_se[on_policy], ret_se[i]))}")

# %%
assert all(gap["return", k] > -2 for k in lag_values), gap  # V-trace's mean return is never lower by 2 s.e.
assert gap["entropy", k_max] > 2, gap  # at the largest lag V-trace keeps more entropy, by more than 2 s.e.
assert nc_entropy[k_max] < nc_entropy[0] / 2, nc_entropy[[0, k_max]]  # no correction's falls inside the warm-up
assert all(final_divergence[index[m, k_max]] > final_divergence[index[m, min(lag_values)]] for m in METHODS)
print(f"V-trace's mean return is at no lag lower than no correction's by 2 s.e.; at k = {k_max} V-trace keeps more "
      "entropy (by more than 2 s.e.); no correction's entropy falls below half its start within the warm-up; the "
      "policies drift further apart at the larger lag")

# %%
smooth = ablation.smoothed(window=25)
updates = np.arange(lag_config.n_updates)
fig, axes = plt.subplots(1, len(lag_values) + 1, figsize=(5 * (len(lag_values) + 1), 4), sharey=False)


def band(ax, curves, colour, label):
    m, se = mean_se(curves.T)  # over seeds, per update
    ax.plot(updates, m, color=colour, label=label)
    ax.fill_between(updates, m - se, m + se, color=colour, alpha=0.2, lw=0)


for ax, k in zip(axes, lag_values):
    band(ax, smooth[index["v-trace", 0]], "k", "on-policy (k = 0)")
    for method, colour in (("no correction", "tab:red"), ("v-trace", "tab:blue")):
        band(ax, smooth[index[method, k]], colour, method)
    ax.set_title(f"lag k = {k} updates")
    ax.set_xlabel("learner update")
    ax.set_ylabel("episode return (steps balanced, 25-update mean)")
    ax.legend(fontsize=8, loc="upper left")
ax = axes[-1]
for (method, k), colour in ((("v-trace", 0), "k"), (("no correction", max(lag_values)), "tab:red"),
                            (("v-trace", max(lag_values)), "tab:blue")):
    band(ax, ablation.entropy[index[method, k]], colour, "on-policy (k = 0)" if k == 0 else f"{method}, k = {k}")
ax.set_title("policy entropy of the learner")
ax.set_xlabel("learner update")
ax.set_ylabel("mean entropy of pi (nats; ln 2 = uniform)")
ax.legend(fontsize=8)
fig.suptitle(f"CartPole-v1 with a controlled policy lag (mean over {len(lag_seeds)} seeds; band: +- 1 s.e.)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** V-trace's mean return is never below no correction's by 2 s.e.; the lags
# where it is above, and where on-policy learning is above a lagged arm, are printed
# above, each "separated" or "not separated"; elsewhere the spread between seeds is as
# large as the effect. What separates the methods at the largest lag is the entropy: the
# learner has moved far from the policy that acted (the $|\log\pi/\mu|$ column), and
# without correction the policy's entropy ends lower. The curves show when: no
# correction's entropy falls during the warm-up itself (update 0 against update $k$,
# printed above), while the weights that act are still the initial, near-uniform ones.
# Why is not tested here; one hypothesis is that the uncorrected gradient, taken on
# actions a uniform $\mu$ chose, does not fade as the softmax saturates the way the
# on-policy one does ($\pi(a)(1-\pi(a))$), while V-trace's weights $\min(1, \pi/\mu)$
# damp it. Truncation also throws signal away (ratios cut, traces $c_i$ shortened), so
# V-trace learns from less of each batch.
#
# Two limits of this design: every arm learns with one learning rate (printed in the
# configuration), and in the first $k$ updates the initial weights act (the clamp in the
# ring above), a larger share of training at a larger $k$.

# %% [markdown]
# ## 5. SEED RL: central inference, and throughput measured here
#
# The same system with the `seed` layout: the actors only step environments; one
# inference process gathers the observations of all actors (waiting at most
# `batch_wait_s` for stragglers), runs one batched forward pass, writes the actions back
# and assembles the unrolls into the same shared-memory slots. Unlike SEED RL, where
# inference runs inside the learner on its accelerator, ours is a separate CPU process
# beside the learner that pulls the weights through the seqlock. Its loop:

# %%
from course_lib.actor_learner.seed import _InferenceServer

show_source(_InferenceServer.serve)

# %% [markdown]
# We measure both layouts at the default network (hidden width 64) and a wider one
# (512), where inference is a larger share of the work. The machine's load drifts, so
# `compare_layouts` *interleaves* the runs (IMPALA, SEED, IMPALA, SEED, ...), we compare
# medians of 3 runs each, and print the load average beside them. The IMPALA rows repeat
# section 3's configuration in shorter runs taken while SEED's processes come and go, so
# their frames/s differ from section 3's with the run length and the load, not the layout.
# The CPU column is what a frame costs (see the glossary). When the load exceeds the core
# count, frames/s also measures which layout's processes won more of the CPUs.

# %%
# NBVAL_IGNORE_OUTPUT
import statistics

from course_lib.actor_learner.system import compare_layouts

widths, repeats = (64, 512), 3
load_before = os.getloadavg()
with progress(2 * len(widths) * repeats, "system runs (IMPALA, SEED, IMPALA, SEED, ...)", unit="run") as bar:
    runs = compare_layouts(system_config, widths, repeats, seconds=pick(cpu=2.5, full=30.0), progress=bar.update)
load_after = os.getloadavg()
fps = {key: [r.report.frames_per_second for r in rs] for key, rs in runs.items()}
cpu = {key: [r.cpu_ms_per_1k_frames for r in rs] for key, rs in runs.items()}
print(f"load average (1 min) before: {load_before[0]:.1f}, after: {load_after[0]:.1f}, on {os.cpu_count()} cores")
print(f"{'layout':<7} {'hidden':>6} {'frames/s: median':>17} {'(runs)':<22} {'CPU ms / 1k frames':>19} {'mean lag':>9}  "
      "where actor 0's time went (median run)")
for (layout, hidden), rs in runs.items():
    mid = sorted(rs, key=lambda r: r.report.frames_per_second)[len(rs) // 2].report
    phases = mid.timings["actor 0"]
    busy = ", ".join(f"{k} {100 * v / mid.seconds:.0f}%" for k, v in phases.items())
    busy += f", unaccounted {max(0.0, 100 * (1 - sum(phases.values()) / mid.seconds)):.0f}%"
    each = ", ".join(f"{f:,.0f}" for f in fps[layout, hidden])
    print(f"{layout:<7} {hidden:>6} {statistics.median(fps[layout, hidden]):>17,.0f} ({each:<20}) "
          f"{statistics.median(cpu[layout, hidden]):>19.0f} {mid.lags.mean():>9.1f}  {busy}")
speed = {h: statistics.median(fps["seed", h]) / statistics.median(fps["impala", h]) for h in widths}
cost = {h: statistics.median(cpu["seed", h]) / statistics.median(cpu["impala", h]) for h in widths}
print("SEED / IMPALA, medians: frames/s " + ", ".join(f"hidden {h}: {r:.2f}x" for h, r in speed.items())
      + " | CPU per frame " + ", ".join(f"hidden {h}: {r:.2f}x" for h, r in cost.items()))

# %%
assert all(r.report.frames_per_second > 0 and r.report.updates > 0 for rs in runs.values() for r in rs)
assert not live_children()
seed_wait = [r.report.timings["actor 0"]["wait for actions"] / r.report.seconds for h in widths for r in runs["seed", h]]
assert min(seed_wait) > 0.5, seed_wait
assert cost[min(widths)] > 1.0, cost  # central inference saves nothing on a cheap forward pass
if current_scale() == "cpu":
    assert all(cost[h] > 1.0 for h in widths), cost  # 2 actors: too few observations to batch
print("in every SEED run the actors spent more than half of the wall time waiting for actions, and at "
      f"{'both widths' if all(cost[h] > 1.0 for h in widths) else f'width {min(widths)}'} a SEED frame cost more CPU "
      "than an IMPALA frame (medians); frames/s: see the table")

# %% [markdown]
# What crosses the wire per environment frame, from `seed.wire_bytes_per_frame`, for our
# CartPole runs and for an Atari-like setting (84x84x4 bytes per observation, a network
# of 1.6 million parameters, IMPALA actors with one environment each and unrolls of 20):

# %%
from course_lib.actor_learner.model import ActorCritic
from course_lib.actor_learner.seed import wire_bytes_per_frame

cartpole_params = sum(p.numel() for p in ActorCritic(4, 2, 64).parameters())
settings = {"CartPole (ours)": (16, cartpole_params, 16, 8), "Atari-like": (84 * 84 * 4, 1_600_000, 20, 1)}
print(f"{'setting':<16} {'layout':<7} {'actor -> learner':>17} {'learner -> actor':>17}   (bytes per frame)")
for name, (obs_bytes, n_params, unroll, n_envs) in settings.items():
    for layout in ("impala", "seed"):
        w = wire_bytes_per_frame(layout, obs_bytes, n_params, unroll, n_envs)
        print(f"{name:<16} {layout:<7} {w['actor -> learner']:>17,.0f} {w['learner -> actor']:>17,.0f}")

# %% [markdown]
# **When each layout wins**
#
# | | IMPALA (inference on the actors) | SEED RL (central batched inference) |
# |---|---|---|
# | what crosses the wire | whole unrolls, once per unroll; the **weights**, to every actor, whenever they change | one observation + reward up and one action down, **every step** |
# | bandwidth | grows with the model size (weights x actors x update rate); fine for small nets | grows with observation size x frame rate; independent of the model size |
# | where the accelerator is used | only for learning; actors run inference on CPUs, one small batch each | for learning **and** inference, in big batches (the 40-80% cost reduction SEED reports comes from here) |
# | latency per env step | none added: the policy is local | one round trip actor -> server -> actor per step; needs a fast network and many envs per actor to hide it |
# | policy lag | an unroll is stale by the time it arrives (weights pulled once per unroll) | each step uses the server's newest weights, but an unroll still waits for the learner, so it is off-policy too (the lag column above) and V-trace still applies |
# | wins when | small models, cheap inference, slow or far-away network, no accelerator | large models (inference dominates), an accelerator next to the learner, a fast local network |
#
# Here there is no accelerator: a batched forward pass of a 64- or 512-wide MLP saves
# less CPU than the per-step round trips through the server cost (the CPU column), and
# SEED's actors mostly wait for actions. Frames/s depends on how the processes share the
# cores, so the notebook asserts no direction for it.

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | env frames/s | environment steps consumed by the learner per wall-clock second, from its first batch on (start-up excluded) |
# | CPU ms / 1k frames | CPU time (user + system) of the learner and every child process per 1,000 frames, over the same window: what a frame costs |
# | load average | the operating system's 1-minute average of runnable processes; above the core count the processes queue for CPU |
# | phase timers | seconds each process spent per phase over the same window: actors (wait for free slot, weight sync, inference, env step / wait for actions), inference server (wait for requests, inference, bookkeeping, wait for free slot), learner (wait for batch, learn, publish weights) |
# | % of wall | a phase's seconds over the measured wall time, including any wait for a CPU; "unaccounted" is the rest, so a process's rows add up to 100% |
# | episode return | undiscounted sum of rewards of one episode (CartPole: steps balanced, at most 500) |
# | bytes per frame | what crosses between actor and learner per environment step, by direction |
#
# ## Summary
#
# - Actors that act while the learner learns keep both busy; the cost is a policy lag
#   that the system's timing decides, measured here per batch.
# - V-trace (03.1-03.4) corrects for the lag with truncated importance weights: bounded
#   variance, a bias towards a policy between $\mu$ and $\pi$. Its test is the
#   paper's formula written naively; its classic bug is the product's upper index.
# - At the largest lag, no correction's entropy ends lower than V-trace's by more than
#   2 s.e.; in return V-trace is never below it by 2 s.e., and whether V-trace or less
#   lag is above is printed per arm as separated or not separated.
# - SEED RL trades trajectories and weights on the wire for observations and actions
#   every step, and puts inference on the learner's accelerator: it wins with big models
#   and an accelerator. On CPUs with a 64-wide MLP its per-step round trips cost more CPU
#   per frame than batching saves; frames/s then depends on how processes share the cores.
# - A production actor-learner system is mostly about waits: every one needs a timeout,
#   a supervisor, and a plan for the state a dead process held (lesson 10).
#
# **Full scale.** `COURSE_SCALE=full` runs 8 actors with batches of 8 unrolls, 60-second system runs, and an
# ablation over $k \in \{4, 16, 64, 128\}$ with 32 seeds, 32 envs per agent and 1,000 updates; run it with
# `.venv/bin/course run 03 --scale full` on a machine with at least 8 cores.
#
# **References.** L. Espeholt, H. Soyer, R. Munos et al., *IMPALA: Scalable Distributed
# Deep-RL with Importance Weighted Actor-Learner Architectures*, ICML 2018, arXiv
# 1802.01561 (V-trace, eq. 1 and Theorem 1). H. Küttler, N. Nardelli, T. Lavril et al.,
# *TorchBeast: A PyTorch Platform for Distributed RL*, arXiv 1910.03552, 2019 (MonoBeast's
# shared-memory buffers, `vtrace_test.py`'s naive ground truth, per-phase timings).
# L. Espeholt, R. Marinier, P. Stanczyk, K. Wang, M. Michalski, *SEED RL: Scalable and
# Efficient Deep-RL with Accelerated Central Inference*, ICLR 2020, arXiv 1910.06591.
# DeepMind rlax, `vtrace.py` (per-trajectory functions that also take a $\lambda$ mixing
# the traces, $c_i = \lambda \min(1, \pi/\mu)$; ours is TorchBeast's `[T, B]` style, $\lambda = 1$).
#
# **Exercises:** `exercises/03_impala_vtrace.ipynb`: V-trace targets, the clipped
# policy-gradient advantages, policy-lag accounting, and one unroll of an actor. Grade with
# `course grade exercises/03_impala_vtrace.ipynb`.
