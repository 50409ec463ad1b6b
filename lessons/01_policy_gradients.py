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
# times, grade the answers, reinforce what worked.** The *score-function estimator*
# (REINFORCE) turns that sentence into an unbiased estimate of the gradient of the
# expected reward, from samples alone. Its weakness is **variance**. Reward-to-go and a
# baseline reduce it; group-relative advantages make it independent of how the reward is
# written (an offset), and GRPO's group statistics also rescale the estimate, per prompt.
# We measure each.
#
# **Learning goals**
# 1. Derive the score-function estimator and check it against an exact gradient.
# 2. Write the surrogate loss whose gradient is the policy gradient.
# 3. Run *sample, grade, reinforce* on a verifiable-answer task and measure each
#    estimator's bias and variance, group-relative (GRPO, RLOO) ones included.
# 4. Train REINFORCE on gymnasium's `CartPole-v1` over several seeds, and measure how much
#    reward-to-go and a baseline cut the gradient's variance.
#
# Builds on lesson 00's return $G_t$ with episode ends.

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
# (With $\gamma<1$ we drop the exact gradient's factor $\gamma^t$, as almost every
# implementation does.)
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
# its own baseline, divided by its spread:
#
# $$A_{ij} = \frac{r_{ij} - \mathrm{mean}_j\, r_{ij}}{\mathrm{std}_j\, r_{ij} + \epsilon}. \qquad (01.6)$$
#
# DeepSeekMath does not say which std. TRL's `GRPOTrainer` and verl's
# `compute_grpo_outcome_advantage` take the sample std (`torch.std`), with
# $\epsilon = 10^{-4}$ and $10^{-6}$ (this lesson: verl's). Dr. GRPO (Liu et al. 2025) and
# PipelineRL's default config drop the division. The leave-one-out baseline (Kool et al.
# 2019; RLOO in Ahmadian et al. 2024) compares each answer with the mean of the *other*
# $G - 1$ answers instead.
#
# **Surrogate loss.** Autograd computes (01.2)-(01.6) from a loss whose gradient is
# $-\hat g$. The weights $A_i$ are constants (detached): the estimator multiplies the
# score by them, it does not differentiate through them.
#
# $$L(\theta) = -\frac1N\sum_i A_i \log\pi_\theta(a_i\mid s_i), \qquad \nabla_\theta L = -\hat g . \qquad (01.7)$$
#
# Here $i$ runs over the batch's *steps*, so $N = \sum_e T_e$ for $E$ episodes of
# $T_1..T_E$ steps: (01.5)'s sum over episodes divided by $N$, not $E$, so a long episode
# weighs in proportion to its length (for language models, DAPO's *token-mean*, Yu et al.
# 2025).
#
# **Variance** of an estimator, from $M$ independent estimates $\hat g_1..\hat g_M$:
#
# $$\mathrm{Var}[\hat g] = \mathbb{E}\,\lVert \hat g - \mathbb{E}\hat g\rVert^2, \qquad
#   \text{relative variance} = \mathrm{Var}[\hat g] \,/\, \lVert\mathbb{E}\hat g\rVert^2 . \qquad (01.8)$$
#
# GRPO's full objective (DeepSeekMath, eq. 3) adds a ratio to the sampling policy, PPO's
# clip and a KL penalty to a reference; with one step per batch and no penalty its gradient
# is (01.7) with each answer's tokens weighted $1/|o_i|$. Lesson 02 takes up the ratio and
# the clip; lesson 07 runs GRPO-style training.
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
# | (01.6) group-relative advantage; RLOO's leave-one-out | `pg.group_relative_advantages`; exercise 1 |
# | (01.7) surrogate loss | `pg.surrogate_loss` |
# | (01.8) variance statistics | `pg.gradient_variance` |
# | the whole REINFORCE loop | `reinforce.train_reinforce(ReinforceConfig(...))` |
# | sample, grade, reinforce on arithmetic | `verifiable.make_arithmetic_task`, `.verify`, `.train_answer_policy` |

# %% [markdown]
# ## 1. The score-function estimator, checked against the exact gradient
#
# The smallest policy-gradient problem: a softmax policy over $K = 5$ arms, where arm $k$
# pays reward 1 with probability $\mu_k$. Here $J(z) = \sum_k \pi_k\mu_k$ and its exact
# gradient is $\nabla_z J = \pi \odot (\mu - J)$. We check that formula by finite
# differences, then the *sampled* estimate (01.2) against it.

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
# $r_i(\mathbf{e}_{a_i} - \pi)$ (01.2 with the score 01.4). One draw of it at each $N$:

# %%
rng = np.random.default_rng(0)
lines = []
for n in (100, 10_000, 1_000_000):
    est = bandit.estimate(z, n, rng)
    lines.append(f"N = {n:>9,}: one draw {np.round(est, 4)}   error {np.linalg.norm(est - exact):.4f}")
lines.append(f"exact              {np.round(exact, 4)}")
print("\n".join(lines))

# %% [markdown]
# One draw's error is itself random. Repeat each estimate many times, without and with a
# baseline $b = J$ (weights $r_i - J$, 01.5), and measure its root-mean-square error:

# %%
sample_sizes = [10, 30, 100, 300, 1_000, 3_000, 10_000, 30_000]
n_repeats = pick(cpu=300, full=2_000)
err_plain = bandit.estimate_errors(z, sample_sizes, n_repeats, seed=1)
err_base = bandit.estimate_errors(z, sample_sizes, n_repeats, seed=1, baseline=bandit.expected_reward(z))
print(f"{'N':>7}  {'RMS error, b = 0':>17}  {'RMS error, b = J':>17}  {'variance ratio':>14}")
for n, e0, e1 in zip(sample_sizes, err_plain, err_base):
    print(f"{n:>7,}  {e0:>17.3g}  {e1:>17.3g}  {(e0 / e1) ** 2:>14.1f}")
gain = err_plain[sample_sizes.index(100)] / err_plain[sample_sizes.index(10_000)]
ratios = (err_plain / err_base) ** 2
assert 8 < gain < 12.5 and 1.8 < ratios.min() and ratios.max() < 3
print(f"100x the samples (N = 100 -> 10,000): RMS error {gain:.0f}x smaller; a baseline: "
      f"{ratios.min():.1f}-{ratios.max():.1f}x less variance")

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
# **Takeaway:** the estimate is unbiased and its RMS error falls like $1/\sqrt{N}$: 100x
# the samples buys only 10x the accuracy. A baseline shifts the whole line down (the
# variance ratio printed above). Here $b = J$ is an *oracle*, the exact expected reward;
# practice must estimate it, from a value network or, next, from other answers to the same
# prompt.

# %% [markdown]
# ## 2. Sample, grade, reinforce on a verifiable-answer task
#
# The loop of RL for reasoning models, in miniature. A *prompt* is a generated
# arithmetic problem (`"29 - 36 ="`); the "model" proposes one of $K = 8$ candidate
# answers (the right one and plausible slips); an **exact verifier** grades each answer 1
# (right) or 0 (wrong). The policy is a table of logits, one softmax per prompt, so the
# exact gradient of the expected accuracy $J$ is known. It starts from "pretrained"
# logits that prefer the right answer a little.

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
# all wrong) would get zero advantages: it teaches nothing.

# %%
from course_lib.rl.pg import group_relative_advantages

batch = sample_and_grade(task, init_logits, n_prompts=3, group_size=8, rng=np.random.default_rng(5))
adv_mean = group_relative_advantages(batch.rewards, normalize_std=False)
adv_std = group_relative_advantages(batch.rewards, normalize_std=True, ddof=1)
for i, p in enumerate(batch.prompt_ids):
    answers = [task.candidates[p][a] for a in batch.answer_ids[i]]
    print(f"{task.prompts[p]:<10} answers  {' '.join(f'{a:>6}' for a in answers)}")
    print(f"{'':<10} reward   {' '.join(f'{r:>6.0f}' for r in batch.rewards[i])}")
    print(f"{'':<10} r - mean {' '.join(f'{a:>6.2f}' for a in adv_mean[i])}")
    print(f"{'':<10} / std    {' '.join(f'{a:>6.2f}' for a in adv_std[i])}")

# %% [markdown]
# **Measuring the variance.** At the initial policy, draw many independent batches
# (32 prompts x $G = 8$ answers) and compute four estimators on the *same* batches: no
# baseline ($A = r$), the group mean, RLOO's leave-one-out mean, and GRPO's mean and std,
# for rewards written "right 1 / wrong 0" and "right 2 / wrong 1". The last column is
# $\mathbb{E}\hat g$ projected on $\nabla J$: 1 = unbiased. Every estimator is the same
# score-function sum (01.2) over one batch, with its own weights $w_{ij}$ (01.6):

# %%
from course_lib import show_source
from course_lib.rl.verifiable import logit_table_gradient

show_source(logit_table_gradient)

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
scale = {(c, n): x for c, n, _, x in rows}
assert abs(scale["1 / 0", "no baseline"] - 1) < 0.05 and abs(scale["1 / 0", "leave-one-out"] - 1) < 0.03
assert abs(scale["1 / 0", "group mean"] - (1 - 1 / 8)) < 0.03 and scale["1 / 0", "group mean / std"] > 1.5
for name in ESTIMATORS[1:]:
    assert np.isclose(variance["1 / 0", name].total_variance, variance["2 / 1", name].total_variance, rtol=1e-9)
assert variance["2 / 1", "no baseline"].relative_variance > 5 * variance["1 / 0", "no baseline"].relative_variance
print(f"E[g] / grad J: group mean {scale['1 / 0', 'group mean']:.2f} (1 - 1/G = {1 - 1 / 8:.3f}), leave-one-out "
      f"{scale['1 / 0', 'leave-one-out']:.2f}; the group estimators are identical under both reward conventions")

# %% [markdown]
# The group mean counts each answer's own reward in its baseline, so the baseline depends
# on the action: $\mathbb{E}\hat g = (1 - 1/G)\,\nabla J$. Leave-one-out is unbiased (exercise
# 1 checks exactly this); the std rescales each prompt. The group estimators ignore the
# reward's offset; "no baseline" does not. Sweep the offset $c$ (right $= 1 + c$, wrong $= c$):

# %%
offsets = np.array([-1.0, -0.5, -0.25, 0.0, 0.5, 1.0, 2.0])
n_sweep = pick(cpu=300, full=3_000)
sweep = {name: [] for name in ESTIMATORS}
plain_total = []
for c in offsets:
    samples = gradients_by_estimator(task, init_logits, n_sweep, n_prompts=32, group_size=8, seed=3, reward_offset=c)
    for name in ESTIMATORS:
        sweep[name].append(gradient_variance(samples[name], exact_task).relative_variance)
    plain_total.append(gradient_variance(samples["no baseline"], exact_task).total_variance)
# the same batches at every c: the no-baseline estimate is g(0) + c h, so its variance is a parabola in c
fit = np.polyfit(offsets, plain_total, 2)
assert np.abs(np.polyval(fit, offsets) - plain_total).max() < 1e-6 * min(plain_total)
best_b, mean_reward = fit[1] / (2 * fit[0]), task.accuracy(init_logits)
assert 0.03 < mean_reward - best_b and -0.25 < -best_b < 0
group_vs_best = max(sweep["group mean"]) / min(sweep["no baseline"])
worst = max(sweep["no baseline"]) / min(sweep["no baseline"])
assert group_vs_best < 1.6 and worst > 10 * group_vs_best
print(f"no baseline: variance = parabola in c (fit exact to 1e-6); best constant baseline b* = {best_b:.3f}, "
      f"not the mean reward J = {mean_reward:.3f}\nrelative variance / the sweep's best: group mean "
      f"{group_vs_best:.1f}x at every c, no baseline up to {worst:.0f}x")

fig, ax = plt.subplots(figsize=(7, 4))
for name, marker in zip(ESTIMATORS, "o^Ds"):
    ax.semilogy(offsets, sweep[name], marker + "-", label=name)
ax.axvline(-best_b, color="k", ls=":", lw=1, label=f"c = -b* = {-best_b:.2f} (best constant)")
ax.axvline(-mean_reward, color="k", ls="--", lw=1, label=f"c = -J = {-mean_reward:.2f} (mean reward)")
ax.set_xlabel("reward offset c (right = 1 + c, wrong = c; reward units)")
ax.set_ylabel("relative variance Var[g] / |E g|^2 (unitless)")
ax.set_title(f"Gradient noise vs reward convention, arithmetic task ({n_sweep} batches of 32 x 8)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** without a baseline the gradient's noise depends on an arbitrary choice,
# where the reward's zero sits, and grows quadratically away from a sweet spot. The best
# constant is not the mean reward: it weighs each sample by its score's squared size, and
# the less likely (mostly wrong) answers have the larger scores. The group baselines stay
# close to that spot for *every* convention.
#
# Finally, reinforce: plain gradient ascent $\theta \leftarrow \theta + \alpha\,\hat g$
# with one step size, $\alpha = 10$, from the same start, five seeds per estimator, with
# small batches (8 prompts x 4 answers) so that the noise shows.

# %%
from course_lib.rl.verifiable import train_answer_policy

steps = pick(cpu=150, full=500)
runs = {
    "no baseline, rewards 1/0": ("no baseline", 0.0),
    "no baseline, rewards 2/1": ("no baseline", 1.0),
    "no baseline, rewards 4/3": ("no baseline", 3.0),
    "group mean": ("group mean", 0.0),
    "leave-one-out (RLOO)": ("leave-one-out", 0.0),
    "group mean / std (GRPO)": ("group mean / std", 0.0),
}
curves = {}
for label, (estimator, offset) in runs.items():
    curves[label] = [
        train_answer_policy(task, init_logits, estimator, steps, n_prompts=8, group_size=4, lr=10.0, seed=s,
                            reward_offset=offset)
        for s in range(5)
    ]


def locked_wrong(logits):
    """Share of prompts whose policy puts more than 0.9 on one wrong answer."""
    pi = np.exp(logits - logits.max(axis=1, keepdims=True))
    pi /= pi.sum(axis=1, keepdims=True)
    top = pi.argmax(axis=1)
    return float(np.mean((pi.max(axis=1) > 0.9) & (task.correct[np.arange(len(top)), top] == 0)))


summary = {}
for label, cs in curves.items():
    summary[label] = (np.mean([c.accuracy[-1] for c in cs]), np.mean([c.entropy[-1] for c in cs]),
                      np.array([locked_wrong(c.final_logits) for c in cs]),
                      np.mean([c.zero_signal[-20:].mean() for c in cs]))
print(f"after {steps} updates, mean of 5 seeds; entropy at the start {curves['group mean'][0].entropy[0]:.2f} nats")
print(f"{'run':<26} {'accuracy':>8} {'entropy (nats)':>14} {'prompts locked on a wrong answer':>33} {'zero-signal groups':>18}")
for label, (acc, ent, wrong, zero) in summary.items():
    zero_text = "" if label.startswith("no baseline") else f"{zero:.0%}"
    print(f"{label:<26} {acc:>8.2f} {ent:>14.2f} {wrong.mean():>33.0%} {zero_text:>18}")
stalled = curves["no baseline, rewards 4/3"]
assert summary["no baseline, rewards 4/3"][0] < 0.6 and summary["no baseline, rewards 4/3"][2].min() >= 0.3
assert all(c.entropy[-1] < c.entropy[0] / 3 for c in stalled)
early = {label: np.mean([c.entropy[30] for c in cs]) for label, cs in curves.items()}
assert min(early, key=early.get) == "no baseline, rewards 4/3", early
group_runs = ("group mean", "leave-one-out (RLOO)", "group mean / std (GRPO)")
assert all(summary[k][2].max() == 0 for k in group_runs)
assert all(c.entropy[-1] < c.entropy[0] / 3 for k in group_runs for c in curves[k])
mid = {k: np.mean([c.accuracy[50] for c in curves[k]]) for k in ("group mean", "leave-one-out (RLOO)")}
assert mid["leave-one-out (RLOO)"] - mid["group mean"] > 0.04, mid
zero_early = np.mean([c.zero_signal[:20].mean() for k in group_runs for c in curves[k]])
assert all(summary[k][3] > zero_early + 0.2 for k in group_runs)
print(f"accuracy after 50 updates: group mean {mid['group mean']:.2f}, leave-one-out {mid['leave-one-out (RLOO)']:.2f}; "
      f"zero-signal groups in the first 20 updates: {zero_early:.0%}")


# %%
def band(ax, x, ys, label, **kw):
    """Mean over seeds as a line, min..max over seeds as a shaded band."""
    ys = np.asarray(ys)
    (line,) = ax.plot(x, ys.mean(axis=0), label=label, **kw)
    ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.2, lw=0)


fig, (ax, ax_ent) = plt.subplots(1, 2, figsize=(11, 4))
for label, cs in curves.items():
    band(ax, np.arange(steps + 1), [c.accuracy for c in cs], label)
    band(ax_ent, np.arange(steps + 1), [c.entropy for c in cs], label)
ax.set_xlabel("update (8 prompts x 4 answers each)")
ax.set_ylabel("expected accuracy J (fraction right)")
ax.set_title("Accuracy on 32 arithmetic prompts", fontsize=10)
ax_ent.set_xlabel("update (8 prompts x 4 answers each)")
ax_ent.set_ylabel("policy entropy, mean over prompts (nats)")
ax_ent.set_title("Entropy: every run sharpens; 4/3 sharpens onto wrong answers", fontsize=10)
ax.legend(fontsize=8)
fig.suptitle("Sample, grade, reinforce (5 seeds, band = min..max)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** at this step size, a mere relabelling of the rewards (1/0 -> 4/3) stalls
# learning without a baseline. The shift adds $c\sum_j(\mathbf{e}_{a_j} - \pi)$ to each estimate: zero mean, pure noise, and
# large with $c = 3$. The policy samples its own pushes, so that noise drives a prompt's
# softmax to one answer, often a wrong one; there the score $\mathbf{e}_a - \pi$ vanishes
# and no later sample undoes it. The 4/3 run's entropy falls fastest (right plot), onto
# wrong answers (the table's **locked prompts**). The group baselines locked no prompt on a wrong answer here, but
# their entropy falls too: production runs see entropy collapse *under* GRPO (DAPO's
# clip-higher counters it). The group mean learns slower than leave-one-out, but only
# because its step is smaller: $A_{\text{RLOO}} = \tfrac{G}{G-1}A_{\text{mean}}$, one estimator
# at two step sizes (the group mean at $\tfrac{4}{3}\alpha$ would match it). Likewise
# GRPO's lead is partly its larger step ($\mathbb E\hat g/\nabla J = 1.87$): one step size
# for all runs ranks them by step as much as by estimator. As the policy improves, more
# groups are all right and carry no signal.

# %% [markdown]
# ## 3. REINFORCE on CartPole-v1
#
# A real environment: gymnasium's `CartPole-v1` (keep a pole upright; reward 1 per step;
# an episode ends when the pole falls, the cart leaves the track, or after 500 steps).
# The policy is a small torch
# MLP; each update runs 16 vectorised envs for one episode each, weights every step by its
# reward-to-go (01.3) minus the batch mean, over the batch std (01.5), and takes an Adam
# step on (01.7). Later lessons reuse this loop as *the classic CPU
# loop*. The collector, masking the envs that have finished:

# %%
from course_lib.rl.reinforce import collect_episodes, train_reinforce

show_source(collect_episodes)

# %% [markdown]
# And the loop: each update collects a batch, takes one gradient step (the weights and
# loss of exercise 4, hidden here) and logs the returns and the policy's entropy.

# %%
show_source(train_reinforce)

# %% [markdown]
# The whole configuration. Everything here runs on the CPU; the `full` scale runs more
# seeds and updates and turns on `lr_anneal`, so its curves are not directly comparable:

# %%
from course_lib import describe
from course_lib.rl.reinforce import ReinforceConfig

config = ReinforceConfig(n_updates=pick(cpu=50, full=150), lr_anneal=pick(cpu=False, full=True))
seeds = list(range(pick(cpu=5, full=10)))
print(describe(config))
print(f"seeds: {seeds}")

# %% [markdown]
# Training all seeds:

# %%
# NBVAL_IGNORE_OUTPUT
from dataclasses import replace

from course_lib import progress

results = []
with progress(len(seeds) * config.n_updates, "REINFORCE updates", unit="update") as bar:
    for seed in seeds:
        results.append(train_reinforce(replace(config, seed=seed), progress=lambda *_: bar.update()))
print(f"{'seed':>4} {'first update mean return':>25} {'mean return, last 100 episodes':>31} {'env steps':>10}")
for r in results:
    print(f"{r.config.seed:>4} {r.returns[0].mean():>25.1f} {r.final_mean_return(100):>31.1f} {r.env_steps:>10,}")

# %%
first = np.array([r.returns[0].mean() for r in results])
final = np.array([r.final_mean_return(100) for r in results])
assert first.mean() < 40, f"an untrained policy should balance ~20 steps, got {first.mean():.1f}"
assert final.min() >= 450, f"every seed must reach >= 450: mean returns over the last 100 episodes {final.round(1)}"
assert final.mean() >= 475, f"mean over seeds {final.mean():.1f} < 475"
print(f"learned: from < 40 steps at the start to a mean return >= 450 over the last 100 episodes on every one of "
      f"{len(seeds)} seeds, >= 475 (CartPole-v1's 'solved') on average, at most "
      f"{config.n_updates * config.n_envs:,} episodes each")

# %%
fig, ax = plt.subplots(figsize=(8, 4))
episodes = (np.arange(config.n_updates) + 1) * config.n_envs
band(ax, episodes, [r.returns.mean(axis=1) for r in results], f"mean over {len(seeds)} seeds (band: min..max)")
ax.axhline(475, color="k", ls=":", lw=1, label="475 (CartPole-v1's 'solved')")
ax.axhline(500, color="k", ls="--", lw=1, label="500 (the episode cap)")
ax.set_xlabel("episodes played")
ax.set_ylabel("episode return (steps balanced, mean per update)")
ax.set_title(f"REINFORCE on CartPole-v1: reward-to-go + mean baseline, {config.n_envs} episodes/update")
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** from ~20 steps (a random policy) to near the 500-step cap, on every seed.
# Learning is not monotone: each step follows a noisy estimate and can undo progress.

# %% [markdown]
# ## 4. Gradient variance with and without reward-to-go and a baseline
#
# Fix a policy, draw many independent batches of 8 episodes, and compute four gradient
# estimates on each: weights $R(\tau)$ (01.2) or $G_t$ (01.3), each with and without the
# batch-mean baseline (01.5).
# With $\gamma = 1$ all four estimate nearly the same target, $\nabla J / \mathbb{E}[T]$ ((01.7)
# divides by the batch's step count), up to an $O(1/E)$ bias for $E$ episodes per batch
# (the step count is random, and the batch-mean baseline contains each episode's own
# return); so their variances compare directly. We use two policies:
# the untrained one and the one after 10 updates.

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
print(f"{'policy':<17} {'weights':<24} {'total var':>10} {'var / best':>10} {'cos to mean':>11}")
for stage in ("untrained", "after 10 updates"):
    best = min(var_table[stage, name].total_variance for name in VARIANTS)
    for name in VARIANTS:
        s = var_table[stage, name]
        print(f"{stage:<17} {name:<24} {s.total_variance:>10.3g} {s.total_variance / best:>10.1f} "
              f"{s.cosine_to_reference:>11.2f}")

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
# **Takeaway:** nearly the same expected gradient, several times less noise: reward-to-go and the
# baseline each cut the variance, at both policies. Less variance means fewer samples per
# useful step; samples are what the rest of this course produces faster.

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | $J$ / expected reward / accuracy | probability-weighted reward of the current policy |
# | RMS error | $\sqrt{\mathbb{E}\lVert\hat g - \nabla J\rVert^2}$ of an estimate against the exact gradient |
# | total variance | $\mathbb{E}\lVert\hat g - \mathbb{E}\hat g\rVert^2$, summed over all parameters (01.8) |
# | relative variance | total variance / $\lVert\mathbb{E}\hat g\rVert^2$: noise-to-signal |
# | cos to exact / to mean | mean cosine of one batch's estimate to the exact (or consensus) gradient |
# | zero-signal groups | share of prompts whose $G$ answers all got the same reward (all advantages 0) |
# | episode return | undiscounted sum of rewards of one episode (CartPole: steps balanced, at most 500) |
# | entropy | $-\sum_a \pi(a)\log\pi(a)$, mean over prompts (nats): 0 when the policy is one-hot |
#
# ## Summary
#
# - The score-function identity turns "reinforce what worked" into an unbiased gradient
#   estimate from samples and grades (01.2), one line of loss in code (01.7); its error
#   falls like $1/\sqrt{N}$.
# - Reward-to-go and a baseline cut the variance (7x here); GRPO gets a baseline from
#   several answers to one prompt, which makes the noise independent of the reward's offset
#   (RLOO, leaving each answer's own reward out, stays unbiased). Without one, a shifted
#   reward can lock prompts onto wrong answers.
#
# **References.** R. J. Williams, *Simple statistical gradient-following algorithms for
# connectionist reinforcement learning*, Machine Learning 8, 1992 (REINFORCE, baselines).
# Z. Shao et al., *DeepSeekMath*, arXiv 2402.03300, 2024 (GRPO, eq. 01.6). W. Kool, H. van Hoof,
# M. Welling, *Buy 4 REINFORCE samples, get a baseline for free!*, ICLR 2019 workshop
# (leave-one-out). A. Ahmadian et al., *Back to Basics: Revisiting REINFORCE Style
# Optimization for Learning from Human Feedback in LLMs*, arXiv 2402.14740, 2024
# (leave-one-out baselines). Z. Liu et al., *Understanding R1-Zero-Like Training: A
# Critical Perspective*, arXiv 2503.20783, 2025 (Dr. GRPO). Q. Yu et al., *DAPO: An
# Open-Source LLM Reinforcement Learning System at Scale*, arXiv 2503.14476, 2025
# (token-mean, clip-higher). OpenAI Spinning Up, *Vanilla Policy Gradient*.
#
# **Exercises:** `exercises/01_policy_gradients.ipynb`: leave-one-out (RLOO) advantages,
# the surrogate loss, group-relative advantages, and a complete REINFORCE update that
# learns CartPole. Grade with `course grade exercises/01_policy_gradients.ipynb`.
