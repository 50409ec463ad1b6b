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
# # 01 · Policy gradients: sample, grade, reinforce
#
# Reinforcement learning for reasoning models fits in one sentence: **try a problem many
# times, grade the answers, reinforce what worked.** This lesson turns that sentence into
# a gradient. The *score-function estimator* (REINFORCE) makes "reinforce what worked"
# an unbiased estimate of the gradient of the expected reward, from samples alone, with
# no model of the environment or the grader. Its weakness is **variance**: one batch of
# samples points the gradient in a noisy direction, and every trick in this lesson
# (reward-to-go, baselines, group-relative advantages) exists to reduce that noise
# without biasing the estimate. We measure each one.
#
# **Learning goals**
# 1. Derive the score-function estimator and check it numerically against an exact
#    gradient; see its error shrink like $1/\sqrt{N}$.
# 2. Write the surrogate loss whose gradient is the policy gradient, and say why the
#    advantage in it is a constant.
# 3. Run *sample, grade, reinforce* on a verifiable-answer task with group-relative
#    (GRPO-style) advantages, and measure the gradient variance of each estimator.
# 4. Train REINFORCE on gymnasium's `CartPole-v1` with torch, over several seeds.
# 5. Measure how much reward-to-go and a baseline cut the variance of the gradient.
#
# Builds on lesson 00 (the return $G_t$ with episode ends).

# %%
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, pick

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## Key equations
#
# A policy $\pi_\theta(a\mid s)$ acts; a trajectory $\tau = (s_0, a_0, r_0, s_1, \dots)$
# earns the return $R(\tau) = \sum_t \gamma^t r_t$. We want to climb
#
# $$J(\theta) = \mathbb{E}_{\tau\sim\pi_\theta}\big[R(\tau)\big]. \qquad (01.1)$$
#
# **The score-function identity.** For any distribution $p_\theta(x)$ and any $f$ that
# does not depend on $\theta$, since $\nabla p = p\,\nabla \log p$:
#
# $$\nabla_\theta\,\mathbb{E}_{x\sim p_\theta}[f(x)] = \sum_x \nabla_\theta p_\theta(x)\,f(x)
#   = \mathbb{E}_{x\sim p_\theta}\big[f(x)\,\nabla_\theta \log p_\theta(x)\big].$$
#
# For a trajectory, $\log p_\theta(\tau) = \log\rho(s_0) + \sum_t \big[\log\pi_\theta(a_t\mid s_t)
# + \log P(s_{t+1}\mid s_t, a_t)\big]$ and only the policy terms depend on $\theta$. So
# the environment's dynamics drop out and (Williams, 1992)
#
# $$\nabla_\theta J = \mathbb{E}_\tau\Big[\sum_t \nabla_\theta \log\pi_\theta(a_t\mid s_t)\;R(\tau)\Big]
#   \approx \hat g = \frac1N \sum_{i=1}^N \sum_t \nabla_\theta \log\pi_\theta(a^i_t\mid s^i_t)\;R(\tau^i). \qquad (01.2)$$
#
# **Reward-to-go.** An action cannot change rewards that came before it, so those terms
# have zero mean and only add noise; weight step $t$ by what follows it, lesson 00's return:
#
# $$G_t = \sum_{k=t}^{e(t)} \gamma^{k-t} r_k = r_t + \gamma(1-d_t)G_{t+1}. \qquad (01.3)$$
#
# (With $\gamma<1$ the exact gradient of the discounted objective would also carry a
# factor $\gamma^t$; like almost every implementation we drop it and treat $\gamma$ as a
# variance-reduction knob.)
#
# **Softmax score.** For logits $z$ and $\pi = \mathrm{softmax}(z)$:
#
# $$\nabla_z \log\pi(a) = \mathbf{e}_a - \pi . \qquad (01.4)$$
#
# **Baseline.** Any $b(s)$ that does not depend on the action has
# $\mathbb{E}_{a\sim\pi}[\nabla\log\pi(a\mid s)\,b(s)] = b(s)\,\nabla\sum_a\pi(a\mid s) = b(s)\,\nabla 1 = 0$,
# so subtracting it keeps the estimate unbiased and can shrink its variance:
#
# $$\hat g = \frac1N\sum_{i,t} \nabla_\theta\log\pi_\theta(a^i_t\mid s^i_t)\,\big(G^i_t - b(s^i_t)\big). \qquad (01.5)$$
#
# **Group-relative advantage** (GRPO; Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).
# Sample $G$ answers $o_{i1..iG}$ to prompt $i$, grade them $r_{ij}$, and use the group as
# its own baseline (and, optionally, its spread as the scale):
#
# $$A_{ij} = \frac{r_{ij} - \mathrm{mean}_j\, r_{ij}}{\mathrm{std}_j\, r_{ij} + \epsilon}. \qquad (01.6)$$
#
# **Surrogate loss.** Autograd computes (01.2)-(01.6) for us if we hand it a loss whose
# gradient is $-\hat g$. The weights $A_i$ are constants (detached): the estimator
# multiplies the score by them, it does not differentiate through them.
#
# $$L(\theta) = -\frac1N\sum_i A_i \log\pi_\theta(a_i\mid s_i), \qquad \nabla_\theta L = -\hat g . \qquad (01.7)$$
#
# **Variance** of an estimator, from $M$ independent estimates $\hat g_1..\hat g_M$:
#
# $$\mathrm{Var}[\hat g] = \mathbb{E}\,\lVert \hat g - \mathbb{E}\hat g\rVert^2, \qquad
#   \text{relative variance} = \mathrm{Var}[\hat g] \,/\, \lVert\mathbb{E}\hat g\rVert^2 . \qquad (01.8)$$
#
# **Pseudocode** (REINFORCE; for a language model, read "episode" as "answer")
# ```
# for iteration = 1, 2, ...:
#     sample:     run pi_theta: N episodes (or G answers to each of B prompts)
#     grade:      rewards r_t from the environment (or an exact verifier)
#     weight:     A_t = G_t - b   (reward-to-go minus a baseline; or group-relative A_ij)
#     reinforce:  L = -mean_t A_t * log pi_theta(a_t | s_t);  theta <- optimizer step on grad L
# ```
#
# | equation | function in `course_lib` |
# |---|---|
# | (01.1), exact $\nabla J$ of a bandit | `bandits.CategoricalBandit.expected_reward`, `.exact_gradient` |
# | (01.2) with whole-episode $R(\tau)$ | `pg.episode_returns` |
# | (01.2), (01.4), (01.5) for one softmax | `pg.score_function_gradient`, `pg.categorical_score` |
# | (01.3) reward-to-go with episode ends | `pg.discounted_returns` (lesson 00) |
# | (01.5) batch-mean baseline (+ std scale) | `pg.normalize_advantages`, `reinforce.step_weights` |
# | (01.6) group-relative advantage | `pg.group_relative_advantages` |
# | (01.7) surrogate loss | `pg.surrogate_loss` |
# | (01.8) variance statistics | `pg.gradient_variance` |
# | the whole REINFORCE loop | `reinforce.train_reinforce(ReinforceConfig(...))` |
# | sample, grade, reinforce on arithmetic | `verifiable.make_arithmetic_task`, `.verify`, `.train_answer_policy` |

# %% [markdown]
# ## 1. The score-function estimator, checked against the exact gradient
#
# The smallest policy-gradient problem: a softmax policy over $K = 5$ arms, where arm $k$
# pays reward 1 with probability $\mu_k$ (right or wrong, like a verifier). Here
# $J(z) = \sum_k \pi_k\mu_k$ and differentiating through the softmax gives the exact
# gradient $\nabla_z J = \pi \odot (\mu - J)$. First we check that formula by finite
# differences, then we check the *sampled* estimate (01.2) against it.

# %%
from course_lib.rl.bandits import CategoricalBandit, finite_difference_gradient

bandit = CategoricalBandit(success_probs=(0.2, 0.4, 0.6, 0.8, 0.9))
z = np.array([0.5, -0.3, 0.0, 0.2, -0.6])  # the policy's logits
exact = bandit.exact_gradient(z)
numeric = finite_difference_gradient(bandit.expected_reward, z)
print("policy pi           ", np.round(np.exp(z) / np.exp(z).sum(), 3))
print(f"J(z) = {bandit.expected_reward(z):.4f}")
print("exact grad J        ", np.round(exact, 5))
print("finite differences  ", np.round(numeric, 5))
assert np.allclose(exact, numeric, atol=1e-8)

# %% [markdown]
# Now the estimator: pull $N$ arms from $\pi$, see 0/1 rewards, and average
# $r_i(\mathbf{e}_{a_i} - \pi)$ (01.2 with the score 01.4). With a baseline $b = J$
# (01.5) the weights become $r_i - J$.

# %%
rng = np.random.default_rng(0)
lines = []
for n in (100, 10_000, 1_000_000):
    est = bandit.estimate(z, n, rng)
    lines.append(f"N = {n:>9,}: estimate {np.round(est, 4)}   error {np.linalg.norm(est - exact):.4f}")
lines.append(f"exact              {np.round(exact, 4)}")
print("\n".join(lines))

# %% [markdown]
# The estimate converges to the exact gradient, but slowly. How slowly? Repeat each
# estimate many times and measure its root-mean-square error for a range of $N$:

# %%
sample_sizes = [10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000]
n_repeats = pick(cpu=300, full=2_000)
err_plain = bandit.estimate_errors(z, sample_sizes, n_repeats, seed=1)
err_base = bandit.estimate_errors(z, sample_sizes, n_repeats, seed=1, baseline=bandit.expected_reward(z))
print(f"{'N':>7}  {'RMS error, b = 0':>17}  {'RMS error, b = J':>17}  {'variance ratio':>14}")
for n, e0, e1 in zip(sample_sizes, err_plain, err_base):
    print(f"{n:>7,}  {e0:>17.3g}  {e1:>17.3g}  {(e0 / e1) ** 2:>14.1f}")

# %%
fig, ax = plt.subplots(figsize=(7, 4))
ax.loglog(sample_sizes, err_plain, "o-", label="score-function estimate, no baseline")
ax.loglog(sample_sizes, err_base, "s-", label="with baseline b = J")
ref = err_plain[0] * np.sqrt(sample_sizes[0] / np.array(sample_sizes))
ax.loglog(sample_sizes, ref, "k:", label=r"$\propto 1/\sqrt{N}$")
ax.set_xlabel("samples per estimate N (arm pulls)")
ax.set_ylabel(r"RMS error $\sqrt{E\|\hat g - \nabla J\|^2}$ (reward / logit)")
ax.set_title(f"Score-function estimate vs exact gradient, 5-armed bandit ({n_repeats} repeats per N)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** the estimate is unbiased and its error falls like $1/\sqrt{N}$: 100x the
# samples buys only 10x the accuracy. A baseline shifts the whole line down (here about
# 2.3x less variance) at no cost, which is why every practical estimator has one.

# %% [markdown]
# ## 2. Sample, grade, reinforce on a verifiable-answer task
#
# Now the loop of RL for reasoning models, in miniature. A *prompt* is a generated
# arithmetic problem (`"29 - 36 ="`); the "model" proposes one of $K = 8$ candidate
# answers (the right one and plausible slips: off by one or ten, the wrong operation,
# swapped digits); an **exact verifier** grades each answer 1 (right) or 0 (wrong). The
# policy is a table of logits, one softmax per prompt, so the exact gradient of the
# expected accuracy $J$ is known and every estimator can be compared with the truth.
# We start it from "pretrained" logits that already prefer the right answer a little.

# %%
from course_lib.rl.verifiable import make_arithmetic_task, sample_and_grade, verify

task = make_arithmetic_task(n_prompts=32, n_candidates=8, seed=0)
init_rng = np.random.default_rng(1)
init_logits = init_rng.normal(size=(task.n_prompts, task.n_candidates)) + 1.0 * task.correct
print(f"{task.n_prompts} prompts x {task.n_candidates} candidates; e.g. {task.prompts[0]!r} -> {task.candidates[0]}")
print("verify('8 * 7 =', '56') ->", verify("8 * 7 =", "56"), "| verify('8 * 7 =', '57') ->", verify("8 * 7 =", "57"),
      "| verify('8 * 7 =', 'fifty-six') ->", verify("8 * 7 =", "fifty-six"))
print(f"initial accuracy J = {task.accuracy(init_logits):.3f}")

# %% [markdown]
# One round: sample $G = 8$ answers to each of three prompts, grade them, and turn the
# rewards into group-relative advantages (01.6). A group whose answers are all right (or
# all wrong) gets zero advantage everywhere: it teaches nothing.

# %%
from course_lib.rl.pg import group_relative_advantages

batch = sample_and_grade(task, init_logits, n_prompts=3, group_size=8, rng=np.random.default_rng(5))
adv_mean = group_relative_advantages(batch.rewards, normalize_std=False)
adv_std = group_relative_advantages(batch.rewards, normalize_std=True)
for i, p in enumerate(batch.prompt_ids):
    answers = [task.candidates[p][a] for a in batch.answer_ids[i]]
    print(f"{task.prompts[p]:<10} answers  {' '.join(f'{a:>6}' for a in answers)}")
    print(f"{'':<10} reward   {' '.join(f'{r:>6.0f}' for r in batch.rewards[i])}")
    print(f"{'':<10} r - mean {' '.join(f'{a:>6.2f}' for a in adv_mean[i])}")
    print(f"{'':<10} / std    {' '.join(f'{a:>6.2f}' for a in adv_std[i])}")

# %% [markdown]
# **Measuring the variance.** At the initial policy, draw many independent batches
# (all 32 prompts, $G = 8$ answers each) and compute three estimators on the *same*
# batches: no baseline ($A = r$), the group mean as baseline, and GRPO's mean and std.
# Because the group baselines subtract a constant per prompt, they do not care how the
# reward is written: "right 1 / wrong 0" and "right 2 / wrong 1" (say, a bonus for a
# well-formed answer) give them identical updates. Without a baseline they differ, so we
# measure both conventions. Columns (eq. 01.8): the total variance, the relative variance
# (scale free, so estimators of different scale compare), the mean cosine between one
# batch's estimate and the exact gradient, and $\mathbb{E}\hat g$ projected on $\nabla J$
# (1 = unbiased; the group mean includes each answer's own reward, which scales the
# gradient by $1 - 1/G$; dividing by the std rescales each prompt).

# %%
from course_lib.rl.pg import gradient_variance
from course_lib.rl.verifiable import ESTIMATORS, gradients_by_estimator

n_batches = pick(cpu=1_000, full=10_000)
exact_task = task.exact_gradient(init_logits).reshape(-1)
rows = []
for offset, convention in ((0.0, "1 / 0"), (1.0, "2 / 1")):
    samples = gradients_by_estimator(
        task, init_logits, n_batches, n_prompts=32, group_size=8, seed=2, reward_offset=offset
    )
    for name in ESTIMATORS:
        stats = gradient_variance(samples[name], exact_task)
        scale = float(samples[name].mean(axis=0) @ exact_task / (exact_task @ exact_task))
        rows.append((convention, name, stats, scale))
print(f"{'rewards right/wrong':<20} {'estimator':<17} {'total var':>10} {'relative var':>12} {'cos to exact':>12} {'E[g] / grad J':>13}")
for convention, name, s, scale in rows:
    print(f"{convention:<20} {name:<17} {s.total_variance:>10.3g} {s.relative_variance:>12.3g} "
          f"{s.cosine_to_reference:>12.3f} {scale:>13.2f}")
variance = {(c, n): s for c, n, s, _ in rows}

# %% [markdown]
# The relative variance of "no baseline" depends on the reward's offset; the group
# estimators' does not. Sweep the offset $c$ (right $= 1 + c$, wrong $= c$):

# %%
offsets = np.array([-1.0, -0.5, -0.25, 0.0, 0.5, 1.0, 2.0])
n_sweep = pick(cpu=300, full=3_000)
sweep = {name: [] for name in ESTIMATORS}
for c in offsets:
    samples = gradients_by_estimator(task, init_logits, n_sweep, n_prompts=32, group_size=8, seed=3, reward_offset=c)
    for name in ESTIMATORS:
        sweep[name].append(gradient_variance(samples[name], exact_task).relative_variance)

fig, ax = plt.subplots(figsize=(7, 4))
for name, marker in zip(ESTIMATORS, "o^s"):
    ax.semilogy(offsets, sweep[name], marker + "-", label=name)
ax.set_xlabel("reward offset c (right = 1 + c, wrong = c; reward units)")
ax.set_ylabel("relative variance Var[g] / |E g|^2 (unitless)")
ax.set_title(f"Gradient noise vs reward convention, arithmetic task ({n_sweep} batches of 32 x 8)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** without a baseline the gradient's noise depends on an arbitrary choice,
# where the reward's zero sits, and grows quadratically away from a sweet spot (here
# between $c = -0.25$ and $0$: for a peaked softmax the best constant baseline is not the
# mean reward). The group baseline sits near that spot for *every* convention, automatically.
#
# Finally, reinforce: plain gradient ascent $\theta \leftarrow \theta + \alpha\,\hat g$
# from the same start, five seeds per estimator, with small batches (8 prompts x 4
# answers) so that the noise shows.

# %%
from course_lib.rl.verifiable import train_answer_policy

steps = pick(cpu=150, full=500)
runs = {
    "no baseline, rewards 1/0": ("no baseline", 0.0),
    "no baseline, rewards 2/1": ("no baseline", 1.0),
    "no baseline, rewards 4/3": ("no baseline", 3.0),
    "group mean": ("group mean", 0.0),
    "group mean / std (GRPO)": ("group mean / std", 0.0),
}
curves = {}
for label, (estimator, offset) in runs.items():
    curves[label] = [
        train_answer_policy(task, init_logits, estimator, steps, n_prompts=8, group_size=4, lr=10.0, seed=s,
                            reward_offset=offset)
        for s in range(5)
    ]
print(f"{'run':<26} {'accuracy after ' + str(steps) + ' steps (mean of 5 seeds)':>42} {'groups with zero signal, last 20 steps':>40}")
for label, cs in curves.items():
    acc = np.mean([c.accuracy[-1] for c in cs])
    zero = np.mean([c.zero_signal[-20:].mean() for c in cs])
    print(f"{label:<26} {acc:>42.2f} {zero:>40.0%}")


# %%
def band(ax, x, ys, label, **kw):
    """Mean over seeds as a line, min..max over seeds as a shaded band."""
    ys = np.asarray(ys)
    (line,) = ax.plot(x, ys.mean(axis=0), label=label, **kw)
    ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2, lw=0)


fig, ax = plt.subplots(figsize=(7, 4))
for label, cs in curves.items():
    band(ax, np.arange(steps + 1), [c.accuracy for c in cs], label)
ax.set_xlabel("update (8 prompts x 4 answers each)")
ax.set_ylabel("expected accuracy J (fraction right)")
ax.set_title("Sample, grade, reinforce: accuracy on 32 arithmetic prompts (5 seeds, band = min..max)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** all these estimators point the same way on average, yet without a
# baseline a mere relabelling of the rewards (1/0 -> 4/3) makes learning stall: the noise
# drowns the signal. The group baseline is immune to the relabelling. (It learns a bit
# slower than "1/0 without baseline" here because including each answer's own reward in
# the mean shrinks the step by $1 - 1/G$.) GRPO's division by the group std is mostly a
# *step-size* choice: it enlarges updates on prompts whose answers rarely disagree (1 right
# out of 4 has a small std), which speeds learning at the same learning rate; Liu et al.
# 2025 (Dr. GRPO, arXiv 2503.20783) discuss the bias it introduces. As the policy improves,
# more groups are all right and carry no signal at all.

# %% [markdown]
# ## 3. REINFORCE on CartPole-v1
#
# Now a real environment: gymnasium's `CartPole-v1` (push a cart left or right to keep a
# pole upright; reward 1 per step; an episode ends when the pole falls or after 500
# steps). The policy is a small torch MLP; each update runs 16 vectorised envs until each
# finishes one episode (acting under `torch.no_grad()`), weights every step by its
# reward-to-go (01.3) minus the batch mean, divided by the batch std (01.5), and takes an
# Adam step on the surrogate loss (01.7). `course_lib.rl.reinforce.train_reinforce` is that
# loop, top to bottom; later lessons reuse it as *the classic CPU loop*. The whole
# configuration:

# %%
from course_lib import describe
from course_lib.rl.reinforce import ReinforceConfig, train_reinforce

config = ReinforceConfig(n_updates=pick(cpu=50, full=150), lr_anneal=pick(cpu=False, full=True))
seeds = list(range(pick(cpu=5, full=10)))
print(describe(config))
print(f"seeds: {seeds}")

# %% [markdown]
# Training all seeds (the progress bar counts updates):

# %%
# NBVAL_IGNORE_OUTPUT
import os
from dataclasses import replace

from course_lib import progress

results = []
with progress(len(seeds) * config.n_updates, "REINFORCE updates", unit="update") as bar:
    for seed in seeds:
        results.append(train_reinforce(replace(config, seed=seed), progress=lambda *_: bar.update()))
print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the timings below grow with it)")
print(f"{'seed':>4} {'first update mean return':>25} {'mean return, last 100 episodes':>31} {'env steps':>10} {'seconds':>8} {'steps/s':>8}")
for r in results:
    print(f"{r.config.seed:>4} {r.returns[0].mean():>25.1f} {r.final_mean_return(100):>31.1f} {r.env_steps:>10,} "
          f"{r.seconds:>8.1f} {r.steps_per_second:>8,.0f}")

# %%
first = np.array([r.returns[0].mean() for r in results])
final = np.array([r.final_mean_return(100) for r in results])
target = pick(cpu=195, full=475)
assert first.mean() < 40, f"an untrained policy should balance ~20 steps, got {first.mean():.1f}"
assert final.min() >= 195, f"every seed must learn: mean returns over the last 100 episodes {final.round(1)}"
assert final.mean() >= target, f"mean over seeds {final.mean():.1f} < {target}"
assert max(r.seconds for r in results) < 60, "each seed trains in under a minute, even on a loaded 2-core machine"
print(f"learned: from < 40 steps at the start to a mean return >= {target} over the last 100 episodes "
      f"(mean of {len(seeds)} seeds; every seed >= 195)")

# %%
fig, ax = plt.subplots(figsize=(8, 4))
episodes = (np.arange(config.n_updates) + 1) * config.n_envs
band(ax, episodes, [r.returns.mean(axis=1) for r in results], f"mean over {len(seeds)} seeds (band: min..max)")
ax.axhline(195, color="k", ls=":", lw=1, label="195 (CartPole-v0's 'solved')")
ax.axhline(500, color="k", ls="--", lw=1, label="500 (the episode cap)")
ax.set_xlabel("episodes played")
ax.set_ylabel("episode return (steps balanced, mean per update)")
ax.set_title(f"REINFORCE on CartPole-v1: reward-to-go + mean baseline, {config.n_envs} episodes/update")
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** from ~20 steps (a random policy) to the 500-step cap in well under a
# thousand episodes, on every seed, in under a minute per seed on a 2-core CPU even when
# it is loaded (the table's seconds column; the load average is printed above it).
# Learning is not monotone: single updates can undo progress, because each step follows
# a noisy estimate.
#
# *Why `torch_threads = 1`?* The network is tiny (two layers of 32): one forward pass is
# microseconds of arithmetic and tens of microseconds of framework overhead, so extra
# threads only add synchronisation; on a shared 2-core machine 2 threads was many times
# slower than 1 (3-5x) when we measured it. `train_reinforce` sets 1 thread for the run and
# restores the previous setting afterwards.

# %% [markdown]
# ## 4. Gradient variance with and without reward-to-go and a baseline
#
# Fix a policy, draw many independent batches of 8 episodes from it, and compute four
# estimates of the gradient on each batch: weights $R(\tau)$ (whole-episode return, 01.2)
# or $G_t$ (reward-to-go, 01.3), each with and without the batch-mean baseline (01.5).
# With $\gamma = 1$ all four estimate the same gradient (the baseline from the same batch
# adds only an $O(1/N)$ bias), so their variances compare directly. We use two policies:
# the untrained one (episodes ~20 steps) and the one after 10 updates (longer episodes).

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.rl.reinforce import VARIANTS, gradients_by_variant

probe = replace(config, n_envs=8, seed=0)
n_var_batches = pick(cpu=100, full=1_000)
var_table = {}
for stage, n_updates in (("untrained", 0), ("after 10 updates", 10)):
    trained = train_reinforce(replace(probe, n_updates=n_updates))
    grads = gradients_by_variant(trained.policy, probe, n_var_batches, gamma=1.0, seed=1)
    consensus = np.mean([g.mean(axis=0) for g in grads.values()], axis=0)
    for name, g in grads.items():
        var_table[stage, name] = gradient_variance(g, consensus)
print(f"{n_var_batches} batches of {probe.n_envs} episodes per policy")
print(f"{'policy':<17} {'weights':<24} {'total var':>10} {'var / best':>10} {'relative var':>12} {'cos to mean':>11}")
for stage in ("untrained", "after 10 updates"):
    best = min(var_table[stage, name].total_variance for name in VARIANTS)
    for name in VARIANTS:
        s = var_table[stage, name]
        print(f"{stage:<17} {name:<24} {s.total_variance:>10.3g} {s.total_variance / best:>10.1f} "
              f"{s.relative_variance:>12.3g} {s.cosine_to_reference:>11.2f}")

# %%
for stage in ("untrained", "after 10 updates"):
    plain = var_table[stage, "total return"].total_variance
    best = var_table[stage, "reward-to-go - baseline"].total_variance
    assert plain / best >= 3, f"{stage}: reward-to-go + baseline cut the variance only {plain / best:.1f}x"
    assert var_table[stage, "reward-to-go"].total_variance < plain
    assert var_table[stage, "total return - baseline"].total_variance < plain
print("at both policies, reward-to-go and the baseline each reduce the variance; together at least 3x")

# %%
fig, ax = plt.subplots(figsize=(8, 4))
names = list(VARIANTS)
width = 0.38
for j, stage in enumerate(("untrained", "after 10 updates")):
    vals = [var_table[stage, name].total_variance for name in names]
    ax.bar(np.arange(len(names)) + (j - 0.5) * width, vals, width, label=f"policy: {stage}")
ax.set_yscale("log")
ax.set_xticks(np.arange(len(names)))
ax.set_xticklabels(names, fontsize=8)
ax.set_ylabel("total variance of the gradient (squared gradient units)")
ax.set_xlabel("weights of the score in (01.2)/(01.5)")
ax.set_title(f"CartPole policy-gradient variance, {n_var_batches} batches of {probe.n_envs} episodes (lower is better)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** same expected gradient, several times less noise: dropping the rewards
# an action could not have influenced (reward-to-go) and centring the weights (baseline)
# each cut the variance, at both policies. Less variance per batch means fewer samples per
# useful step; samples are what the systems in the rest of this course produce faster.

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | $J$ / expected reward / accuracy | probability-weighted reward of the current policy, exact where the policy is a table |
# | RMS error | $\sqrt{\mathbb{E}\lVert\hat g - \nabla J\rVert^2}$ of an estimate against the exact gradient |
# | total variance | $\mathbb{E}\lVert\hat g - \mathbb{E}\hat g\rVert^2$, summed over all parameters (01.8) |
# | relative variance | total variance / $\lVert\mathbb{E}\hat g\rVert^2$: noise-to-signal, independent of the gradient's scale |
# | cos to exact / to mean | mean cosine between one batch's estimate and the exact (or consensus) gradient; 1 = every batch points the right way |
# | zero-signal groups | share of prompts whose $G$ answers all got the same reward, so every group-relative advantage is 0 |
# | episode return | undiscounted sum of rewards of one episode (CartPole: steps balanced, at most 500) |
# | mean return, last 100 episodes | the learning-curve summary asserted above |
# | env steps, steps/s | environment transitions sampled, and their rate over the whole run (acting + learning) |
# | entropy, grad norm | logged by `train_reinforce` per update: policy entropy (nats) and the gradient's L2 norm |
#
# ## Summary
#
# - The score-function identity turns "reinforce what worked" into an unbiased gradient
#   estimate that needs only samples and their grades (01.2); its error falls like $1/\sqrt{N}$.
# - In code it is one line of loss (01.7): $-\mathrm{mean}(A \cdot \log\pi(a\mid s))$ with $A$ detached.
# - Reward-to-go and baselines keep the expectation and cut the variance; group-relative
#   advantages (GRPO) get a baseline for free from several answers to the same prompt.
#
# **References.** R. J. Williams, *Simple statistical gradient-following algorithms for
# connectionist reinforcement learning*, Machine Learning 8, 1992 (REINFORCE, baselines).
# R. S. Sutton et al., *Policy gradient methods for reinforcement learning with function
# approximation*, NeurIPS 2000. Z. Shao et al., *DeepSeekMath*, arXiv 2402.03300, 2024
# (GRPO, eq. 01.6). A. Ahmadian et al., *Back to Basics: Revisiting REINFORCE Style
# Optimization for Learning from Human Feedback in LLMs*, arXiv 2402.14740, 2024
# (leave-one-out baselines). Z. Liu et al., *Understanding R1-Zero-Like Training: A
# Critical Perspective*, arXiv 2503.20783, 2025 (Dr. GRPO). OpenAI Spinning Up, *Vanilla
# Policy Gradient* (the key-equations / pseudocode layout).
#
# **Exercises:** `exercises/01_policy_gradients.ipynb`: reward-to-go on a vectorised
# rollout, the surrogate loss, group-relative advantages, and a complete REINFORCE update
# that learns CartPole. Grade with `course grade exercises/01_policy_gradients.ipynb`.
