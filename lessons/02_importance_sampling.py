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
# # 02 · Importance sampling: no free lunch
#
# Asynchronous RL systems (IMPALA, pipeline RL, AReaL) keep actors and learner busy at
# once, and pay for it in **staleness**: the learner trains on samples that an *older*
# policy $\mu$ generated, while it differentiates its *current* policy $\pi$. The
# importance weight $w = \pi/\mu$ keeps the gradient unbiased, but its variance grows with
# the divergence between the two policies: no free lunch. Truncating the weights, clipping the objective and bounding the staleness are the
# engineering answers; this lesson measures each.
#
# **Learning goals**
# 1. Write the off-policy gradient with the importance weight, and compute weights in
#    log space so that nothing over- or underflows.
# 2. Measure that importance sampling (IS) is unbiased and that its variance is the
#    $\chi^2$ divergence of the policies, which grows at least like $e^{\mathrm{KL}(\pi\|\mu)}$.
# 3. See why a sequence's weight (the product of its token ratios) is hopeless for long
#    answers, and why per-token ratios are what LLM trainers use.
# 4. Trade bias for variance with truncated IS, read PPO's clip as the same trade, and
#    use the effective sample size (ESS) as the dashboard number.
# 5. Train CartPole on batches generated $k$ updates ago with no correction, per-step IS,
#    truncated IS, PPO clipping and decoupled PPO, and say which wins at which staleness
#    (at one large step size).
#
# Builds on lesson 01 (the score-function estimator, advantages, the surrogate loss).

# %%
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, pick

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## Key equations
#
# **On-policy gradient** (lesson 01, eq. 01.2/01.5), with advantages $A$:
#
# $$g = \mathbb{E}_{a\sim\pi_\theta}\big[A(a)\,\nabla_\theta\log\pi_\theta(a)\big]. \qquad (02.1)$$
#
# **Off-policy gradient with the full importance weight.** The samples come from $\mu$
# (the policy of a few updates ago). Since $\mathbb{E}_{x\sim\pi}[f] = \sum_x \mu(x)\frac{\pi(x)}{\mu(x)}f(x)$:
#
# $$g = \mathbb{E}_{a\sim\mu}\big[w(a)\,A(a)\,\nabla_\theta\log\pi_\theta(a)\big],\qquad
#   w(a) = \frac{\pi_\theta(a)}{\mu(a)} = \exp\big(\log\pi_\theta(a) - \log\mu(a)\big);
#   \qquad \widehat{\mathbb{E}_\pi f} = \frac1N\sum_{i=1}^N w_i f(x_i),\ x_i\sim\mu. \qquad (02.2)$$
#
# Unbiased whenever $\mu > 0$ where $\pi f \neq 0$. Trainers store the sampler's
# log-probabilities $\log\mu$ with every sample and form $w$ from the difference of logs.
#
# **Sequences.** An answer $y$ of $T$ tokens has $\pi(y) = \prod_t \pi(y_t\mid y_{<t})$, so its
# weight is the product of the per-token ratios:
#
# $$w_t = \frac{\pi(y_t\mid y_{<t})}{\mu(y_t\mid y_{<t})},\qquad
#   w_{\text{seq}} = \prod_{t=1}^{T} w_t = \exp\Big(\sum_{t=1}^T \log w_t\Big). \qquad (02.3)$$
#
# **Truncated IS** caps each weight at $c$ (IMPALA: $\bar\rho = 1$, Espeholt et al. 2018;
# PipelineRL's default loss: per token, the capped weight not differentiated):
#
# $$\bar w = \min(w, c),\qquad L_{\text{TIS}}(\theta) = -\frac1N\sum_i \mathrm{sg}\big[\min(w_i, c)\big]\,A_i\log\pi_\theta(a_i). \qquad (02.4)$$
#
# **PPO's clipped surrogate** (Schulman et al. 2017, arXiv 1707.06347), with $r_i = w_i$
# as a function of $\theta$:
#
# $$L^{\text{CLIP}}(\theta) = \frac1N\sum_i \min\big(r_i A_i,\ \mathrm{clip}(r_i, 1-\epsilon, 1+\epsilon)\,A_i\big). \qquad (02.5)$$
#
# **Effective sample size** (Kong 1992; Owen, *Monte Carlo theory, methods and examples*,
# ch. 9): $N$ weighted samples are worth about
#
# $$\mathrm{ESS} = \frac{\big(\sum_i w_i\big)^2}{\sum_i w_i^2},\qquad
#   \frac{\mathbb{E}[\mathrm{ESS}]}{N} \approx \frac{1}{\mathbb{E}_\mu[w^2]} \quad(\text{large } N). \qquad (02.6)$$
#
# **The variance is a divergence.** $\mathbb{E}_\mu[w] = 1$ and $\mathbb{E}_\mu[w^2] = \sum_x \pi(x)^2/\mu(x)$, so
#
# $$\mathrm{Var}_\mu[w] = \chi^2(\pi\,\|\,\mu) = e^{D_2(\pi\|\mu)} - 1 \;\ge\; e^{\mathrm{KL}(\pi\|\mu)} - 1,
#   \qquad \frac{\mathrm{ESS}}{N} \lesssim e^{-\mathrm{KL}(\pi\|\mu)}, \qquad (02.7)$$
#
# for large $N$ (the expected ESS; one batch's can look better, section 1), because the
# Rényi divergence $D_\alpha$ grows with its order and $D_1 = \mathrm{KL}$. The
# weight's variance grows **at least exponentially** in the KL divergence between the
# policies (the estimate's too, unless $f$ is small where $w$ is large).
#
# **Every correction is a weight on the score.** With $w_i$ per sample (step or token):
#
# $$g = \frac1N\sum_i \psi_i\,\nabla_\theta\log\pi_\theta(a_i\mid s_i),\quad
#   \psi_i = \begin{cases} A_i & \text{no correction}\\ w_i A_i & \text{IS}\\
#   \min(w_i, c)\,A_i & \text{truncated IS}\\ w_i A_i\,\mathbb{1}[w_i\ \text{not clipped}] & \text{PPO clip}\\
#   \min(v_i, c)\,r_i A_i\,\mathbb{1}[r_i\ \text{not clipped}] & \text{decoupled PPO}\end{cases} \qquad (02.8)$$
#
# where PPO's clip is active when $w_i > 1+\epsilon$ with $A_i > 0$, or $w_i < 1-\epsilon$ with $A_i < 0$.
# Decoupled PPO (AReaL, Fu et al. 2025) clips $r_i = \pi/\pi_{\text{prox}}$ against a recent
# *proximal* policy and weights by $v_i = \pi_{\text{prox}}/\mu$; AReaL drops the tokens
# whose $v_i$ passes an optional cap (off by default). This lesson's variant truncates
# $v_i$ at $c$ instead: it is ours, not AReaL's.
#
# **Pseudocode** (an asynchronous learner; $k$ = how many updates old the batch is)
# ```
# actors (in parallel):  act with a copy of the policy, version v;
#                        store (s, a, r, log mu(a|s), v) for every step
# learner, update t:     take a batch; lag k = t - v   (drop it if k > max_lag: bounded staleness)
#                        w_i   = exp(log pi_theta(a_i|s_i) - log mu_i)          # (02.2), log space
#                        psi_i = A_i | w_i A_i | min(w_i, c) A_i | clip rules    # (02.8)
#                        theta <- theta + lr * mean_i psi_i grad log pi_theta(a_i|s_i)
#                        log ESS/N of w, KL(pi || mu), share clipped             # (02.6)
# ```
#
# | equation | function in `course_lib` |
# |---|---|
# | (02.2) weights, IS estimate | `importance.log_ratios`, `.importance_weights`, `.is_estimate` |
# | (02.3) per-token ratios, sequence product | `importance.masked_log_ratios`, `.token_and_sequence_ratios` |
# | (02.4) truncated weights, truncated-IS loss | `importance.truncated_weights`, `.truncated_is_loss(level="token"/"sequence")` |
# | (02.5) clipped surrogate | `importance.clipped_surrogate`, `.clipped_surrogate_loss(level="token"/"sequence")` |
# | (02.4)-(02.5) PPO's loss times $\mathrm{sg}[\min(\pi_{\text{old}}/\mu, c)]$ (TIS) | `importance.tis_ppo_loss` (exercise 1) |
# | (02.6) effective sample size | `importance.effective_sample_size`, `.ess_from_log_weights` |
# | (02.6)-(02.7) large-batch ESS/N $= 1/(1+\chi^2) \le e^{-\mathrm{KL}}$ | `importance.expected_ess_fraction` |
# | (02.7) KL, $\chi^2$, exact IS bias and variance | `importance.categorical_kl`, `.chi_square`, `.exact_is_moments` |
# | (02.8) the corrections as score weights | `importance.correction_coefficients` |
# | the staleness experiment | `staleness.run_staleness_grid(StalenessConfig(...))` |

# %% [markdown]
# ## 1. Unbiased, but at what variance?
#
# A controlled family of policies. Lesson 01's bandit: $K = 8$ arms, arm $k$ pays 1 with
# probability $p_k$. The target $\pi = \mathrm{softmax}(3p)$ prefers the good arms. The
# behaviour $\mu_\delta = \mathrm{softmax}(3p - \delta s)$, with $s$ the standardised $p$,
# is an *older* policy that had learned less: $\delta = 0$ is on-policy, and growing
# $\delta$ moves $\mu$ away from the arms $\pi$ likes. For each $\delta$ we estimate $\pi$'s
# expected reward $J = \sum_k \pi_k p_k$ from $N = 100$ of $\mu$'s pulls (eq. 02.2), repeat,
# and compare the measured mean and variance with the exact ones:
# $\mathrm{Var}[w r] = \sum_k \pi_k^2 p_k/\mu_k - J^2$ per sample.

# %%
from course_lib.rl.bandits import CategoricalBandit
from course_lib.rl.importance import (categorical_kl, chi_square, effective_sample_size, exact_is_moments,
                                   expected_ess_fraction, importance_weights, is_estimate)
from course_lib.rl.pg import softmax

bandit = CategoricalBandit(success_probs=(0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1))
z_target = 3.0 * bandit.mu
pi = softmax(z_target)
direction = (bandit.mu - bandit.mu.mean()) / bandit.mu.std()
J = bandit.expected_reward(z_target)


def behaviour_logits(delta: float) -> np.ndarray:
    """Logits of mu_delta: the target's, pushed away from the arms it likes."""
    return z_target - delta * direction


arms, rewards = bandit.pull(behaviour_logits(1.0), 5, np.random.default_rng(0))
mu_1 = softmax(behaviour_logits(1.0))
print(f"pi = {np.round(pi, 3)}, J = E_pi[r] = {J:.4f}")
print(f"one estimate from 5 pulls of mu_1: arms {arms}, rewards {rewards}, "
      f"weights {np.round(importance_weights(np.log(pi[arms]), np.log(mu_1[arms])), 2)}, "
      f"IS estimate {is_estimate(rewards, np.log(pi[arms]), np.log(mu_1[arms])):.3f}")

# %%
deltas = np.linspace(0.0, 3.0, 13)
n_samples, n_repeats = 100, pick(cpu=2_000, full=20_000)
rng = np.random.default_rng(1)
rows = []
for delta in deltas:
    mu = softmax(behaviour_logits(delta))
    arms, rewards = bandit.pull(behaviour_logits(delta), n_samples * n_repeats, rng)
    w = importance_weights(np.log(pi[arms]), np.log(mu[arms])).reshape(n_repeats, n_samples)
    estimates = (w * rewards.reshape(n_repeats, n_samples)).mean(axis=1)  # eq. 02.2 for each repeat
    mean, second = exact_is_moments(pi, mu, bandit.mu, bandit.mu)  # rewards are 0/1: E[r^2|a] = p_a
    rows.append({
        "delta": delta, "kl": categorical_kl(pi, mu), "chi2": abs(round(chi_square(pi, mu), 12)),
        "var_exact": second - float(mean) ** 2, "var_measured": n_samples * estimates.var(ddof=1),
        "z": (estimates.mean() - J) / (estimates.std(ddof=1) / np.sqrt(n_repeats)),
        "ess": float(np.mean(effective_sample_size(w))) / n_samples,
        "ess_limit": expected_ess_fraction(np.log(pi), np.log(mu)),
    })
print(f"on-policy variance of one reward: J (1 - J) = {J * (1 - J):.3g}")
print(f"{'delta':>5} {'KL(pi||mu)':>10} {'chi2=Var w':>10} {'e^KL - 1':>9} {'Var[w r] exact':>14} {'measured':>9} "
      f"{'bias / SE':>9} {'ESS/N':>6} {'1/(1+chi2)':>10}")
for r in rows:
    print(f"{r['delta']:>5.2f} {r['kl']:>10.3f} {r['chi2']:>10.3g} {np.expm1(r['kl']):>9.3g} {r['var_exact']:>14.3g} "
          f"{r['var_measured']:>9.3g} {r['z']:>9.1f} {r['ess']:>6.3f} {r['ess_limit']:>10.3f}")

# %%
kl, chi2, var_exact, var_measured, ess_measured, ess_limit, z = (
    np.array([r[key] for r in rows]) for key in ("kl", "chi2", "var_exact", "var_measured", "ess", "ess_limit", "z"))
assert np.all(np.abs(z) < 4), "IS must be unbiased: every mean within 4 standard errors of J"
assert np.all(chi2 >= np.expm1(kl) - 1e-12), "Var[w] = chi2 >= e^KL - 1 (eq. 02.7)"
moderate = kl <= 2.0
assert np.allclose(var_measured[moderate], var_exact[moderate], rtol=0.25), "measured variance matches the exact one"
blow_up = var_exact[-1] / (J * (1 - J))
assert blow_up > 100
assert np.allclose(ess_limit, 1 / (1 + chi2)) and np.all(ess_limit <= np.exp(-kl) + 1e-12), "eq. 02.6-02.7"
assert np.all(np.diff(ess_limit) < 0), "the expected ESS/N falls as the divergence grows"
assert ess_limit[-1] < np.exp(-kl[-1]) / 4, "at 3.6 nats the exact ESS/N sits far below its bound e^-KL"
assert ess_measured[-1] > 5 * ess_limit[-1], "at large divergence the batch ESS overstates the true one"
print(f"unbiased at every divergence (|bias| < 4 SE); at KL = {kl[-1]:.1f} nats the variance per sample is "
      f"{blow_up:.0f}x the on-policy one")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
ax1.semilogy(kl, var_exact, "-", color="C0", label=r"Var$[w r]$ per sample, exact")
ax1.semilogy(kl, var_measured, "o", color="C0", label=r"Var$[w r]$, measured (N Var of the mean)")
ax1.semilogy(kl[1:], chi2[1:], "-", color="C1", label=r"Var$[w] = \chi^2(\pi\|\mu)$")
ax1.semilogy(kl[1:], np.expm1(kl[1:]), ":", color="C1", label=r"lower bound $e^{KL} - 1$ (02.7)")
ax1.axhline(J * (1 - J), color="k", ls="--", lw=1, label="on-policy Var[r]")
ax1.set_xlabel(r"KL($\pi\,\|\,\mu$) (nats)")
ax1.set_ylabel("variance per sample (reward$^2$)")
ax1.set_title("IS estimate of J: variance vs divergence")
ax1.legend(fontsize=7)
ax2.plot(kl, ess_measured, "o", label="ESS / N measured (N = 100)")
ax2.plot(kl, ess_limit, "-", label=r"$1 / (1 + \chi^2)$ (large-N limit, expected_ess_fraction)")
ax2.plot(kl, np.exp(-kl), ":", label=r"bound $e^{-KL}$")
ax2.set_yscale("log")
ax2.set_xlabel(r"KL($\pi\,\|\,\mu$) (nats)")
ax2.set_ylabel("effective sample size / N (fraction)")
ax2.set_title("Effective sample size vs divergence")
ax2.legend(fontsize=7)
fig.suptitle(f"Controlled family: 8-armed bandit, {n_repeats} repeats of N = {n_samples} pulls of $\\mu_\\delta$, "
             f"$\\delta$ = 0..3", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** importance sampling stays unbiased at every divergence, but its variance
# per sample grows from 0.22 (on-policy) to about 170 at 3.6 nats of KL, exponentially in
# the KL, as eq. 02.7 says: at 3.6 nats, 100 stale samples estimate $J$ less precisely
# than a single fresh one would.
#
# The right panel's solid line is what a batch of $\mu$'s samples is worth before it is
# drawn, $1/(1+\chi^2)$ (`expected_ess_fraction`, exercise 3): it falls faster than its
# bound $e^{-\mathrm{KL}}$, to 0.005 at 3.6 nats against 0.027, half a sample per 100.
#
# The right panel also shows a trap. Past about 2 nats the measured ESS stops falling and
# sits far above its true value: a batch of 100 usually does not contain the rare arm whose
# huge weight dominates the variance, so the weights it *did* draw look tame.

# %% [markdown]
# ## 2. Sequences: per-token ratios vs their product
#
# For a language model an action is a whole answer, and its weight is the product of its
# token ratios (02.3). A toy "language model": at each position the target is a
# categorical over $V = 32$ tokens with random logits, and the stale sampler's logits differ
# by a little noise. We sample batches of $N = 64$ answers from $\mu$ and compare, at
# growing length $T$, their sequence weights with their per-token ones.

# %%
from course_lib.rl.importance import ess_from_log_weights

vocab, t_max = 32, 1024
n_answers, n_batches = 64, pick(cpu=100, full=400)
token_rng = np.random.default_rng(2)
token_logits = token_rng.normal(scale=2.0, size=(t_max, vocab))
pi_tok = softmax(token_logits)
mu_tok = softmax(token_logits + 0.2 * token_rng.normal(size=(t_max, vocab)))
kl_tok, chi2_tok = categorical_kl(pi_tok, mu_tok), chi_square(pi_tok, mu_tok)
log_ratio_table = np.log(pi_tok) - np.log(mu_tok)  # [t, token]

cdf = np.cumsum(mu_tok, axis=1)
u = token_rng.random((t_max, n_batches * n_answers))
log_w_tok = np.empty((t_max, n_batches * n_answers))
for t in range(t_max):  # sample every answer's token t from mu, record its log-ratio
    tokens = np.minimum(np.searchsorted(cdf[t], u[t], side="right"), vocab - 1)
    log_w_tok[t] = log_ratio_table[t, tokens]
log_w_seq = np.cumsum(log_w_tok, axis=0)  # [T, answers]: log-weight of each prefix of length T

lengths = [1, 4, 16, 64, 256, 1024]
seq_rows = []
for T in lengths:
    lw = log_w_seq[T - 1].reshape(n_batches, n_answers)
    tok = np.exp(log_w_tok[:T].reshape(T, n_batches, n_answers)).transpose(1, 0, 2).reshape(n_batches, -1)
    shifted = np.exp(lw - lw.max(axis=1, keepdims=True))
    seq_rows.append({
        "T": T, "kl": kl_tok[:T].sum(), "std": lw.std(),
        "ess_seq": float(np.mean(ess_from_log_weights(lw))) / n_answers,
        "limit": float(np.exp(-np.sum(np.log1p(chi2_tok[:T])))),
        "ess_tok": float(np.mean(effective_sample_size(tok))) / (T * n_answers),
        "top": float(np.mean(shifted.max(axis=1) / shifted.sum(axis=1))),
        "decades": float(np.diff(np.percentile(log_w_seq[T - 1], [5, 95]))[0] / np.log(10)),
    })
print(f"per token: KL = {kl_tok.mean():.4f} nats, chi2 = {chi2_tok.mean():.4f} (mean over positions), "
      f"1 / (1 + chi2) = {1 / (1 + chi2_tok.mean()):.3f}")
print(f"{'T':>5} {'KL(seq)':>8} {'std log w_seq':>13} {'5-95% (decades)':>15} {'ESS/N seq':>9} {'1/E[w_seq^2]':>12} "
      f"{'ESS/N tokens':>12} {'top answer share':>16}")
for r in seq_rows:
    limit = f"{r['limit']:.2g}" if r["limit"] >= 1e-4 else f"< 1e{int(np.floor(np.log10(r['limit']))) + 1}"
    print(f"{r['T']:>5} {r['kl']:>8.2f} {r['std']:>13.2f} {r['decades']:>15.1f} {r['ess_seq']:>9.3f} {limit:>12} "
          f"{r['ess_tok']:>12.3f} {r['top']:>16.2f}")

# %%
ess_seq, ess_tok, spread, top_share = (np.array([r[key] for r in seq_rows]) for key in ("ess_seq", "ess_tok", "std", "top"))
assert ess_seq[-1] < 0.1 and top_share[-1] > 0.5, "1024-token weights: one answer carries most of the weight"
assert np.all(ess_tok > 0.95), "per-token weights keep their ESS at every length"
pooled_limit = [1 / (1 + chi2_tok[:T].mean()) for T in lengths]
assert np.allclose(ess_tok, pooled_limit, atol=0.005), "pooled per-token ESS/N = 1 / (1 + chi2_tok), by construction"
assert 3.2 < spread[-1] / spread[lengths.index(64)] < 4.8, "std of log w_seq grows like sqrt(T): x4 from 64 to 1024"
print(f"T = 1024: sequence-level ESS/N = {ess_seq[-1]:.3f} (the largest weight holds {top_share[-1]:.0%} of the "
      f"batch); per-token ESS/N = {ess_tok[-1]:.3f}")

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
ax1.semilogx(lengths, ess_seq, "o-", label="sequence weights, measured (batches of 64)")
ax1.semilogx(lengths, [r["limit"] for r in seq_rows], ":", label=r"sequence, large-N limit $1/\prod_t(1+\chi^2_t)$")
ax1.semilogx(lengths, ess_tok, "s-", label="per-token weights, measured")
ax1.set_yscale("log")
ax1.set_ylim(1e-3, 1.5)
ax1.set_xlabel("answer length T (tokens)")
ax1.set_ylabel("effective sample size / N (fraction)")
ax1.set_title("ESS of sequence vs per-token weights")
ax1.legend(fontsize=7)
log10_w = log_w_seq[np.array(lengths) - 1] / np.log(10)
q = np.percentile(log10_w, [5, 50, 95], axis=1)
ax2.fill_between(lengths, q[0], q[2], alpha=0.3, label="5%..95% of answers")
ax2.semilogx(lengths, q[1], "o-", label="median")
ax2.axhline(0, color="k", lw=0.8)
ax2.set_xlabel("answer length T (tokens)")
ax2.set_ylabel(r"$\log_{10} w_{seq}$ (orders of magnitude)")
ax2.set_title("Spread of the sequence weight")
ax2.legend(fontsize=7)
fig.suptitle(f"Toy LM, V = {vocab}, {kl_tok.mean():.3f} nats of KL per token, "
             f"{n_batches} batches of {n_answers} answers", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** at a per-token KL of 0.015 nats, the weights of 64-token answers already
# span about two orders of magnitude (5% to 95%), and at 1024 tokens one answer holds most of a batch's weight
# (its large-batch ESS/N is below $10^{-13}$). The log-weight is a sum of $T$ terms, so
# its spread grows like $\sqrt T$ and the weight's exponentially. This is why LLM trainers
# (PPO for RLHF, GRPO, PipelineRL) use per-token ratios. Their cost is bias, which their
# ESS/N (97% here, whatever $T$) cannot show: each token is weighted by its own ratio while
# its advantage depends on the other tokens, drawn from $\mu$ (this toy's positions are
# independent, so it has no such bias). GSPO (arXiv 2507.18071) uses a
# length-normalised sequence ratio, $w_{seq}^{1/T}$, for the same reason.

# %% [markdown]
# ## 3. Truncated IS: buying variance with bias
#
# Back to the bandit, at $\delta = 2$ (KL = 1.8 nats), and now the quantity RL needs: the
# policy gradient $\nabla_z J = \pi\odot(p - J)$ (lesson 01). Its IS estimate from $N$ of
# $\mu$'s pulls, with truncated weights (02.4),
#
# $$\hat g_c = \frac1N\sum_i \min(w_i, c)\,(r_i - J)\,(\mathbf e_{a_i} - \pi),$$
#
# has an exact mean and variance (`exact_is_moments`). Truncation *shrinks* the gradient
# and tilts it (bias), and cuts its noise (variance). A shrink is a change of step size
# (Adam rescales each coordinate), so what matters most is the **direction**: we report $\cos(\mathbb E\hat g_c, \nabla J)$ (the
# direction bias), the relative variance $\mathrm{tr\,Cov}(\hat g_c)/\lVert\mathbb E\hat g_c\rVert^2$
# per sample (lesson 01, eq. 01.8), and, measured, the mean cosine between one batch's
# estimate and the true gradient, which combines both, for three batch sizes.

# %%
from course_lib.rl.importance import truncated_weights

delta_trunc = 2.0
mu = softmax(behaviour_logits(delta_trunc))
exact_grad = bandit.exact_gradient(z_target)
score = np.eye(bandit.n_arms) - pi  # row a: grad_z log pi(a) = e_a - pi
second_adv = bandit.mu * (1 - J) ** 2 + (1 - bandit.mu) * J**2  # E[(r - J)^2 | a]
levels = [0.25, 0.5, 1.0, 1.2, 2.0, 3.0, 5.0, 10.0, 30.0, np.inf]
batch_sizes = [8, 64, 512]
n_trunc = pick(cpu=1_000, full=5_000)
trunc_rng = np.random.default_rng(3)
samples = {}
for n in batch_sizes:
    arms, rewards = bandit.pull(behaviour_logits(delta_trunc), n * n_trunc, trunc_rng)
    samples[n] = arms.reshape(n_trunc, n), rewards.reshape(n_trunc, n)
trunc_rows = []
for c in levels:
    mean, second = exact_is_moments(pi, mu, (bandit.mu - J)[:, None] * score, second_adv * (score**2).sum(axis=1), c=c)
    row = {"c": c, "cos_bias": mean @ exact_grad / np.linalg.norm(mean) / np.linalg.norm(exact_grad),
           "scale": np.linalg.norm(mean) / np.linalg.norm(exact_grad), "relvar": (second - mean @ mean) / (mean @ mean)}
    for n, (arms, rewards) in samples.items():
        weights = truncated_weights(np.log(pi[arms]) - np.log(mu[arms]), c) * (rewards - J)
        g = np.einsum("mn,mnk->mk", weights, score[arms]) / n
        norms = np.linalg.norm(g, axis=1) * np.linalg.norm(exact_grad)
        row[n] = float(np.mean(np.where(norms > 0, g @ exact_grad / np.where(norms > 0, norms, 1.0), 0.0)))
    trunc_rows.append(row)
print(f"delta = {delta_trunc}: KL(pi||mu) = {categorical_kl(pi, mu):.2f} nats, weights per arm "
      f"{np.round(pi / mu, 2)}")
print(f"{'c':>5} {'cos(E g, grad J)':>16} {'|E g| / |grad J|':>16} {'relative var':>12} "
      + " ".join(f"{'E cos, N=' + str(n):>12}" for n in batch_sizes))
for r in trunc_rows:
    print(f"{r['c']:>5g} {r['cos_bias']:>16.3f} {r['scale']:>16.3f} {r['relvar']:>12.1f} "
          + " ".join(f"{r[n]:>12.3f}" for n in batch_sizes))

# %%
relvar = np.array([r["relvar"] for r in trunc_rows])
best_c = {n: levels[int(np.argmax([r[n] for r in trunc_rows]))] for n in batch_sizes}
full_is, at_one = trunc_rows[-1], trunc_rows[levels.index(1.0)]
assert relvar[-1] > 5 * at_one["relvar"], "c = 1 cuts the relative variance more than 5x"
assert full_is["cos_bias"] > 0.999 > 0.95 > at_one["cos_bias"], "full IS points right on average; c = 1 is tilted"
assert best_c[8] <= best_c[64] <= best_c[512] and best_c[512] >= 1.0, "bigger batches prefer less truncation"
assert at_one[64] > full_is[64] + 0.1, "at N = 64, c = 1 gives better directions than full IS"
assert best_c[512] < np.inf and max(r[512] for r in trunc_rows[:-1]) > full_is[512], "N = 512: some c still beats full IS"
print(f"best c by mean cosine: {best_c}; at N = 64, c = 1 reaches {at_one[64]:.2f} against {full_is[64]:.2f} for full IS")

# %%
fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
finite = np.array([c if np.isfinite(c) else 100.0 for c in levels])  # plot c = inf at 100
axes[0].semilogx(finite, [r["cos_bias"] for r in trunc_rows], "o-")
axes[0].set_ylabel(r"cos(E$\hat g_c$, $\nabla J$) (1 = unbiased direction)")
axes[0].set_title("Bias: direction of the mean estimate")
axes[1].loglog(finite, relvar, "o-", color="C1")
axes[1].set_ylabel("relative variance per sample (unitless)")
axes[1].set_title("Variance")
for n in batch_sizes:
    axes[2].semilogx(finite, [r[n] for r in trunc_rows], "o-", label=f"N = {n}")
axes[2].set_ylabel(r"mean cos($\hat g_c$, $\nabla J$) of one batch")
axes[2].set_title("Bias and variance together")
axes[2].legend(fontsize=8)
for ax in axes:
    ax.axvline(1.0, color="k", ls=":", lw=0.8)
    ax.set_xlabel("truncation level c (100 = no truncation)")
fig.suptitle(f"Truncated IS of the policy gradient, bandit at KL = {categorical_kl(pi, mu):.1f} nats "
             f"({n_trunc} batches per point; dotted: c = 1)", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** truncating at $c = 1$ tilts the mean gradient by about 25 degrees
# (cosine 0.90) but divides its relative variance by 8, and for a batch of 64 the
# truncated estimate points closer to the true gradient than full IS does. The best $c$
# grows with the batch: variance falls like $1/N$, bias does not, so bigger batches
# tolerate less truncation. IMPALA
# truncates at 1 and accepts the bias: its value targets converge to the value of
# $\pi_{\bar\rho} \propto \min(\bar\rho\mu, \pi)$, between $\mu$ and $\pi$ (lesson 03).
#
# **In production**, verl and SkyRL's TIS caps a different ratio, $\pi_{\text{old}}/\mu$
# (the trainer's recomputed log-probabilities against the sampler's), at $c = 2$, and
# multiplies PPO's *clipped* loss by it (exercise 1). Its first reason is not staleness:
# the two engines' kernels and precision differ, so the ratio is not 1 even at lag 0.
#
# **PPO's clip is the same trade, decided per sample.** Where a sample's ratio has already
# left $[1-\epsilon, 1+\epsilon]$ *in the direction its advantage pushes*, the clipped
# objective (02.5) is flat and the sample contributes no gradient:

# %%
from course_lib.rl.importance import clipped_surrogate

ratio_grid = np.linspace(0.0, 2.0, 201)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), sharey=False)
for ax, adv in zip(axes, (1.0, -1.0)):
    ax.plot(ratio_grid, ratio_grid * adv, ":", color="gray", label=r"unclipped $rA$ (IS)")
    ax.plot(ratio_grid, clipped_surrogate(ratio_grid, np.full_like(ratio_grid, adv), eps=0.2), lw=2,
            label=r"$\min(rA, \mathrm{clip}(r)A)$")
    ax.axvline(1.0, color="k", lw=0.6)
    ax.set_xlabel(r"ratio $r = \pi_\theta(a|s) / \mu(a|s)$ (unitless)")
    ax.set_ylabel("per-sample objective (advantage units)")
    ax.set_title(f"PPO clipped objective, A = {adv:+.0f}, eps = 0.2")
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** for $A > 0$ the objective stops rewarding ratios above $1.2$; for $A < 0$
# it stops rewarding ratios below $0.8$; in the other direction it is the unclipped IS
# objective, so mistakes are still corrected (as in Fig. 1 of the PPO paper). The clip
# bounds how far the policy may move **away from $\mu$**; the next section shows what that
# means when $\mu$ is many updates old.

# %% [markdown]
# ## 4. Staleness: training on batches from $k$ updates ago
#
# A real training loop: CartPole (episodes capped at 200 steps), a linear softmax
# policy over $[s, 1]$, REINFORCE with lesson 01's reward-to-go and normalised baseline,
# one full-batch Adam step per batch at a large learning rate (0.2). The batch used at
# update $t$ was sampled by the policy of update $t-k$, as if queued for $k$ updates. Each
# lag runs the five corrections of (02.8) with per-step ratios, $c = 1$, $\epsilon = 0.2$.
# Three are simplified: decoupled PPO\* (the star marks our variant) takes $\pi_{t-1}$ as
# its proximal policy, where AReaL's, at one step per batch, would make it per-step IS;
# PPO clip takes its old log-probabilities from $\mu$ and runs no epochs; and per-step IS
# corrects the action taken, not the states visited nor $\mu$'s later actions inside the
# reward-to-go, so it is biased too.
#
# The learning curve is the **learner's** return: each update also plays one batch with
# $\pi_t$ (the stale batch's return is $\pi_{t-k}$'s, $k$ updates late). As in a system that
# has just started, the first $k$ updates train on the initial policy's batches, so the
# realised lag is $\min(t, k)$; the table prints its mean.
#
# All runs step together in one vectorised CartPole. The lag, the corrections and one
# update are these three functions:

# %%
from course_lib import describe, show_source
from course_lib.rl.importance import correction_coefficients
from course_lib.rl.staleness import LABELS, StalenessConfig, run_staleness_grid, stale_policy, stale_update

show_source(stale_policy)
show_source(correction_coefficients)
show_source(stale_update)

# %%
config = StalenessConfig(n_seeds=pick(cpu=16, full=64), n_updates=pick(cpu=60, full=150))
print(describe(config))
print(f"{len(config.runs)} cells x {config.n_seeds} seeds = {len(config.runs) * config.n_seeds} runs, "
      f"{2 * len(config.runs) * config.n_seeds * config.n_envs} CartPoles stepping together (stale batch + learner's)")

# %% [markdown]
# Training the whole grid (the bar counts updates; every run takes one step per update):

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib import progress

with progress(config.n_updates, "updates (all runs at once)", unit="update") as bar:
    grid = run_staleness_grid(config, progress=lambda _: bar.update())
print(f"{grid.env_steps:,} env steps in {grid.seconds:.1f} s ({grid.env_steps / grid.seconds:,.0f} steps/s)")

# %%
# NBVAL_IGNORE_OUTPUT
table, last = grid.table(), grid.table(last=20)
stale = [k for k in config.lags if k > 0]
on_policy, on_se = table[0, "none"]
mean_lag = {k: np.minimum(np.arange(config.n_updates), k).mean() for k in stale}
print(f"learning speed: mean return of pi_t over all {config.n_updates} updates, mean +- s.e. over seeds; "
      f"on-policy (k = 0): {on_policy:.1f} +- {on_se:.1f}")
print(f"{'k':>2} {'mean lag':>8} " + " ".join(f"{LABELS[m]:>14}" for m in config.corrections)
      + f" {'best/on-policy':>14}")
for k in stale:
    cells = " ".join(f"{table[k, m][0]:>7.1f} +-{table[k, m][1]:>4.1f}" for m in config.corrections)
    print(f"{k:>2} {mean_lag[k]:>8.1f} {cells} {max(table[k, m][0] for m in config.corrections) / on_policy:>14.2f}")
print(f"\nfinal return: mean return of pi_t over the last 20 updates +- s.e. (on-policy {last[0, 'none'][0]:.0f} +- "
      f"{last[0, 'none'][1]:.0f})")
print(f"{'k':>2} " + " ".join(f"{LABELS[m]:>14}" for m in config.corrections))
for k in stale:
    print(f"{k:>2} " + " ".join(f"{last[k, m][0]:>7.0f} +-{last[k, m][1]:>4.0f}" for m in config.corrections))
print(f"\n{'k':>2} {'ESS/N of w':>10} {'KL(pi||mu)':>10}  (truncated IS runs) | share of steps clipped: PPO clip, "
      "decoupled PPO*")
for k in stale:
    i_t, i_c, i_d = grid.index(k, "truncated"), grid.index(k, "clip"), grid.index(k, "decoupled")
    print(f"{k:>2} {grid.ess[:, i_t].mean():>10.2f} {grid.kl[:, i_t].mean():>10.3f}  | "
          f"{grid.modified[:, i_c].mean():.2f}, {grid.modified[:, i_d].mean():.2f}")

# %%
speed = {cell: value for cell, (value, _) in table.items()}
se = {cell: s for cell, (_, s) in table.items()}
share = {(k, m): grid.modified[:, grid.index(k, m)].mean() for k in stale for m in ("clip", "decoupled")}
fastest = {k: max(speed[k, m] for m in config.corrections) for k in stale}


def ahead(k: int, a: str, b: str, scores: dict = table) -> float:
    """How many combined standard errors a's score is above b's at lag k (learning speed by default)."""
    return (scores[k, a][0] - scores[k, b][0]) / np.hypot(scores[k, a][1], scores[k, b][1])


def verdict(k: int, scores: dict) -> str:
    """The two highest corrections at lag k, and whether the first is separated from the second."""
    first, second = sorted(config.corrections, key=lambda m: -scores[k, m][0])[:2]
    lead = ahead(k, first, second, scores)
    return f"{LABELS[first]}, then {LABELS[second]} ({f'ahead by {lead:.1f} s.e.' if lead > 2 else 'not separated'})"


first_bind = min((k for k in stale if share[k, "clip"] > 0.04), default=0)
kept = [k for k in stale if fastest[k] >= 0.8 * on_policy]
max_lag = max(kept, default=0)
assert max_lag >= 4 and kept == [k for k in stale if k <= max_lag], "the best keeps 80% up to max_lag"
assert 2 * max_lag in stale and fastest[2 * max_lag] < 0.8 * on_policy, "and not at twice max_lag"
below_from_2 = min((on_policy - fastest[k]) / np.hypot(on_se, se[k, m]) for k in stale if k >= 2
                   for m in config.corrections if speed[k, m] == fastest[k])
assert below_from_2 > 2, "from k = 2 even the fastest is below on-policy by more than 2 s.e."
for k in stale:
    ranked = sorted(config.corrections, key=lambda m: -speed[k, m])
    if k <= 2:
        assert set(ranked[:2]) == {"clip", "decoupled"} and ahead(k, ranked[1], ranked[2]) > 2, f"leaders, k = {k}"
    elif k <= 8:
        assert ranked[0] == "decoupled" and ahead(k, "decoupled", ranked[1]) > 2, f"decoupled PPO leads at k = {k}"
    else:
        assert ahead(k, ranked[0], "truncated") < 2, f"truncated IS leads or is not separated from the lead, k = {k}"
    assert ranked[0] != "is" and share[k, "decoupled"] < 0.1, "per-step IS is never fastest; decoupled rarely clips"
    if k >= 8:
        assert ranked[-1] == "clip" and share[k, "clip"] > 0.15, f"PPO clip binds often and is the slowest at k = {k}"
assert 2 <= first_bind <= 4, "the clip against mu binds on more than 4% of steps from k = 2-4 on"
ess_by_lag = [grid.ess[:, grid.index(k, "truncated")].mean() for k in stale]
assert np.all(np.diff(ess_by_lag) < 0), "the dashboard's ESS/N falls as the lag grows"
assert ess_by_lag[0] > 0.98 and share[1, "clip"] < 0.02, "at k = 1 the weights are about 1 and the clip rarely binds"
for k in stale:
    print(f"k = {k:>2}: fastest {verdict(k, table)}")
print(f"the clip against mu binds on > 4% of steps from k = {first_bind}; max_lag = {max_lag} (the best keeps 80% "
      "of on-policy's speed)")

# %%
updates = np.arange(1, config.n_updates + 1)


def draw_curves(ax, k: int) -> None:
    """The learner's return per update at lag k, each correction against on-policy (band: +- 1 s.e.)."""
    ax.plot(updates, grid.returns[:, grid.index(0, "none")].mean(axis=1), "k--", lw=1.5, label="on-policy (k = 0)")
    for m in config.corrections:
        i = grid.index(k, m)
        mean_curve = grid.returns[:, i].mean(axis=1)
        band = grid.returns[:, i].std(axis=1, ddof=1) / np.sqrt(config.n_seeds)
        (line,) = ax.plot(updates, mean_curve, label=LABELS[m])
        ax.fill_between(updates, mean_curve - band, mean_curve + band, color=line.get_color(), alpha=0.2, lw=0)
    ax.set_xlabel(f"update ({config.n_envs} episodes each)")
    ax.set_ylabel(r"return of the learner's $\pi_t$ (steps balanced, cap 200)")
    ax.set_title(f"batches from k = {k} updates ago, mean of {config.n_seeds} seeds")
    ax.legend(fontsize=8, loc="upper left")


fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, k in zip(axes, (2, 8)):
    draw_curves(ax, k)
fig.suptitle("CartPole learning curves with stale batches (band: +- 1 s.e. over seeds)", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** at $k = 8$ PPO clip, anchored at the stale $\mu$, learns slowest, and
# decoupled PPO\* learns fastest. Learning speed (the mean over the run)
# ranks how fast a method learns, not where it ends; the end of this section runs longer.

# %% [markdown]
# Drag the lag to see the curves of every cell of the grid:

# %%
# NBVAL_IGNORE_OUTPUT
import ipywidgets as widgets


def show_lag(k: int) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    draw_curves(ax, k)
    fig.tight_layout()
    plt.show()


widgets.interactive(show_lag, k=widgets.SelectionSlider(options=stale, value=8, description="lag k"))

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4))
for m in config.corrections:
    ax1.plot(stale, [speed[k, m] for k in stale], "o-", label=LABELS[m])
    ax2.plot(stale, [grid.kl[:, grid.index(k, m)].mean() for k in stale], "o-", label=LABELS[m])
ax1.axhline(on_policy, color="k", ls="--", lw=1, label="on-policy (k = 0)")
ax1.axvline(max_lag, color="gray", ls=":", lw=1)
ax1.set_ylabel(f"mean return of $\\pi_t$ over {config.n_updates} updates (steps)")
ax1.set_title("Learning speed vs staleness (dotted: max_lag)")
ax2.set_ylabel(r"mean KL($\pi_t\,\|\,\mu$) per state (nats)")
ax2.set_yscale("log")
ax2.set_title("How far the trained policy is from the sampler")
for ax in (ax1, ax2):
    ax.set_xscale("log", base=2)
    ax.set_xticks(stale, [str(k) for k in stale])
    ax.set_xlabel("lag k (updates between sampling and training)")
    ax.legend(fontsize=8)
fig.suptitle(f"Staleness grid: {len(config.runs)} cells x {config.n_seeds} seeds on CartPole", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# At $k = 1$ the weights are about 1 (ESS/N above 0.98) and PPO's clip removes under 2% of
# the steps, yet PPO clip learns far faster than per-step IS, from which it differs only on
# those steps, and its runs stay closer to $\mu$ (the KL panel, and the last column below).
# One reading: those few clipped steps limit how far one large step on a delayed batch
# moves the policy, as a trust region does. If the step is the cause, a smaller one should
# shrink the gap. Lags 0 and 1, first 60 updates, at lr 0.05 (differences paired by seed):

# %%
# NBVAL_IGNORE_OUTPUT
from dataclasses import replace

window = 60  # updates: both learning rates' runs are compared over the same first 60
small = run_staleness_grid(replace(config, lags=(0, 1), lr=0.05, n_updates=window))
print(f"learning speed over the first {window} updates at k = 1 / on-policy's, {config.n_seeds} seeds")
print(f"{'Adam lr':>7} {'on-policy':>9} {'per-step IS':>11} {'PPO clip':>8} {'clip - IS':>16} "
      f"{'KL(pi||mu), clip / IS':>21}")
gap, kl_at = {}, {}
for run in (grid, small):
    seed_speed = run.returns[:window].mean(axis=0)  # [cells, seeds]
    on = seed_speed[run.index(0, "none")].mean()
    rel = {m: seed_speed[run.index(1, m)] / on for m in config.corrections}
    diff = rel["clip"] - rel["is"]
    gap[run.config.lr] = (diff.mean(), diff.std(ddof=1) / np.sqrt(config.n_seeds))
    kl_ratio = kl_at[run.config.lr] = run.kl[:window, run.index(1, "clip")].mean() / run.kl[:window, run.index(1, "is")].mean()
    print(f"{run.config.lr:>7} {on:>9.1f} {rel['is'].mean():>11.2f} {rel['clip'].mean():>8.2f} "
          f"{gap[run.config.lr][0]:>9.2f} +- {gap[run.config.lr][1]:.2f} {kl_ratio:>21.2f}")
(big_gap, big_se), (small_gap, small_se) = gap[config.lr], gap[small.config.lr]
shrink = (big_gap - small_gap) / np.hypot(big_se, small_se)
assert big_gap > 2 * big_se and shrink > 2, "the clip's lead at k = 1 is separated at lr 0.2 and shrinks at lr 0.05"
assert kl_at[config.lr] < 0.75 < kl_at[small.config.lr], "at lr 0.2 the clip runs stay closer to mu; at 0.05 they do not"
print(f"the clip's lead over per-step IS at k = 1 shrinks by {shrink:.1f} combined s.e. from lr 0.2 to lr 0.05")

# %% [markdown]
# **Takeaway:** at lr 0.05 the clip's lead over per-step IS at $k = 1$ shrinks: it came
# with the step size, not the weights (a smaller step also learns less per update, so
# this does not say how).
#
# Which learns fastest where, at lr 0.2:
#
# | lag $k$ | fastest | why |
# |---|---|---|
# | 1-2 | **PPO clip** and **decoupled PPO\*** | at $k = 1$, $\pi_{t-1}$ *is* $\mu$: the same method |
# | 4-8 | **decoupled PPO\*** | its clip, against $\pi_{t-1}$, rarely binds |
# | 16-32 | **truncated IS**, first or within 2 s.e. of the first | a capped weight |
# | 8-32 | PPO clip is the slowest | it binds often, holding $\pi$ near $\mu$ |
#
# Per-step IS is never the fastest. The data do not isolate why decoupled PPO\* leads at 4-8:
# its clip binds on few steps, and its weight $\min(\pi_{t-1}/\mu, c)\,\pi_t/\pi_{t-1}$
# differs from truncated IS's $\min(\pi_t/\mu, c)$ even where the clip is idle.
#
# From $k = 2$ every method is below on-policy by more than 2 s.e., and the best keeps 80%
# of on-policy's speed up to the printed `max_lag`, not at twice it. Beyond it, read the
# rows as slow rather than as a fine ranking: the warm-up (the mean-lag column) and where
# in a run its collapses fall (below) move them.
#
# **Fast is not stable.** One lag, $k = 8$, for 150 updates: on-policy and the five
# corrections, the same seeds. The on-policy row is the metric's noise floor: at lr 0.2
# some of its runs dip too.

# %%
# NBVAL_IGNORE_OUTPUT
horizon, k_long = 150, 8
long = grid if config.n_updates >= horizon else run_staleness_grid(
    replace(config, lags=(0, k_long), n_updates=horizon))
curves = {"on-policy": long.returns[:horizon, long.index(0, "none")]}  # [updates, seeds]
curves |= {LABELS[m]: long.returns[:horizon, long.index(k_long, m)] for m in config.corrections}
# each run's curve, averaged over 10 updates, and its largest fall from a running peak
smoothed = {n: np.stack([np.convolve(run, np.ones(10) / 10, mode="valid") for run in c.T]) for n, c in curves.items()}
fall = {n: (np.maximum.accumulate(sm, axis=1) - sm).max(axis=1) for n, sm in smoothed.items()}  # [seeds]
print(f"k = {k_long}: mean return of pi_t per 30 updates (mean +- s.e. over {config.n_seeds} seeds) | runs whose return "
      "falls > 50 from a peak, median fall")
print(f"{'':>14} " + " ".join(f"{f'{u + 1}-{u + 30}':>11}" for u in range(0, horizon, 30)) + " | falls  median")
for name, c in curves.items():
    blocks = c.reshape(horizon // 30, 30, -1).mean(axis=1)  # [block, seed]
    print(f"{name:>14} " + " ".join(f"{b.mean():>5.0f} +- {b.std(ddof=1) / np.sqrt(b.size):>2.0f}" for b in blocks)
          + f" | {np.mean(fall[name] > 50):>5.0%} {np.median(fall[name]):>7.0f}")
collapse = {name: float(np.mean(f > 50)) for name, f in fall.items()}
assert all(collapse[LABELS[m]] > 0.6 for m in ("none", "truncated", "decoupled")), "most of their runs collapse"
assert all(np.median(fall[LABELS[m]]) > 100 for m in ("none", "truncated", "decoupled")), "by more than 100 steps"
assert max(collapse[n] for n in ("on-policy", LABELS["is"], LABELS["clip"])) < 0.5, "a minority of on-policy, IS, clip runs"

# %%
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
steps = np.arange(1, horizon + 1)
for name, c in curves.items():
    mean_curve, band = c.mean(axis=1), c.std(axis=1, ddof=1) / np.sqrt(c.shape[1])
    style = dict(color="k", ls="--") if name == "on-policy" else {}
    (line,) = ax1.plot(steps, mean_curve, label=name, **style)
    ax1.fill_between(steps, mean_curve - band, mean_curve + band, color=line.get_color(), alpha=0.2, lw=0)
for name, color in ((LABELS["truncated"], "C2"), (LABELS["is"], "C1")):
    for i in range(3):
        ax2.plot(steps[9:], smoothed[name][i], color=color, lw=1, label=name if i == 0 else None)
ax1.set_title(f"mean of {config.n_seeds} seeds (band: +- 1 s.e.)")
ax2.set_title("three single runs each (10-update average)")
ax1.set_ylabel(r"return of the learner's $\pi_t$ (steps balanced, cap 200)")
for ax in (ax1, ax2):
    ax.set_xlabel(f"update ({config.n_envs} episodes each)")
    ax.legend(fontsize=8, loc="lower right")
fig.suptitle(f"Batches from k = {k_long} updates ago, {horizon} updates", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** at lag 8 most runs of no correction, truncated IS and decoupled PPO\*
# collapse, by a median of more than 100 steps. Single runs of truncated IS (right) reach
# 200, fall nearly to the bottom and climb again. Per-step IS and PPO clip climb slowly,
# and, as with on-policy, a minority of their runs fall: per-step IS is never the fastest,
# but it is the one correction here that neither freezes nor collapses. A ranking by final
# return depends on where in this cycle a run stops, so this lesson ranks by speed.
#
# Two readings, which the grid does not separate. The methods that collapse step, wholly
# or in part, along the gradient of the policy of 8 updates ago (a cap at $c = 1$ drops
# the correction wherever $\pi_t$ now prefers an action more than $\mu$ did: section 3's
# bias, in time), so they keep pushing on batches that cannot yet show where the policy
# has gone: a delayed feedback loop. And the collapses start at the 200-step cap, where
# every episode has the same length, the normalised advantage depends on the time step,
# not on the action, and Adam still takes a full-size step.
#
# So: bound the lag (PipelineRL's `max_lag`, AReaL's `max_head_offpolicyness`), and watch
# the return over the whole run, not one point of it.
# Lesson 03 adds V-trace, lesson 07 per-token lag.

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | importance weight / ratio $w$ | $\pi(a\mid s)/\mu(a\mid s)$ for one step or token, computed as $\exp(\log\pi - \log\mu)$; 1 on-policy |
# | lag $k$, staleness | how many learner updates separate the policy that sampled a batch from the one trained on it |
# | KL($\pi\,\|\,\mu$) | $\sum_a \pi(a)\log(\pi(a)/\mu(a))$ in nats, averaged over the batch's states; how far the learner has moved from the sampler |
# | $\chi^2(\pi\,\|\,\mu)$ | $\mathbb E_\mu[w^2] - 1$: the variance of the weight (02.7) |
# | ESS, ESS/N | $(\sum w)^2/\sum w^2$ and its fraction of the batch; PipelineRL logs ESS/N of its token ratios. Blind to weights the batch did not draw |
# | share clipped | fraction of steps whose gradient the clip removed |
# | learning speed | mean episode return of the learner's policy $\pi_t$ over all updates of a run (area under the learning curve / its length) |
# | max_lag | the largest lag a system lets a batch reach before it drops or waits for it (bounded staleness) |
#
# ## Summary
#
# - IS makes stale samples unbiased: $w = \exp(\log\pi - \log\mu)$, always from log-probabilities.
# - Its price is variance: $\mathrm{Var}[w] = \chi^2 \ge e^{\mathrm{KL}} - 1$; a sequence's
#   weight multiplies $T$ token ratios and becomes useless for long answers.
# - Truncation and clipping trade that variance for bias. At lr 0.2 our decoupled PPO\*
#   learned fastest at lags 4-8, but at lag 8 most of its runs, and of truncated IS's,
#   collapsed within 150 updates; few per-step IS runs did.
# - Bound the staleness: from lag 2 every method is below on-policy; the best keeps 80%
#   of its speed only up to `max_lag`, a line that moves with the step size and the run.
#
# **References.** D. Precup, R. Sutton and S. Singh, *Eligibility traces for off-policy
# policy evaluation*, ICML 2000; T. Degris, M. White and R. Sutton, *Off-policy
# actor-critic*, ICML 2012 (the off-policy step (02.2)). H. Kahn and A. Marshall, *Methods of reducing sample size in Monte Carlo
# computations*, 1953 (importance sampling). A. Kong, *A note on importance sampling using
# standardized weights*, 1992 (ESS). A. B. Owen, *Monte Carlo theory, methods and
# examples*, 2013, ch. 9 (IS variance, ESS, its blind spot). J. Schulman et al., *Proximal Policy Optimization Algorithms*, arXiv 1707.06347,
# 2017. L. Espeholt et al., *IMPALA*, arXiv 1802.01561, 2018 (truncated IS, V-trace).
# A. Piché et al., *PipelineRL*, arXiv 2509.19128, 2025 (truncated per-token IS loss, ESS
# logging, `max_lag`). F. Yao et al., *Your efficient RL framework secretly brings you
# off-policy RL training*, 2025 (TIS). W. Fu et al., *AReaL*, arXiv 2505.24298, 2025 (staleness bound,
# decoupled PPO). C. Zheng et al., *Group Sequence Policy Optimization*, arXiv 2507.18071,
# 2025.
#
# **Exercises:** `exercises/02_importance_sampling.ipynb` (TIS on PPO's loss, the ESS, the
# expected ESS/N, token and sequence ratios); grade with `course grade`.
