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
# # Exercises 02 · Importance sampling: no free lunch
#
# This notebook is generated from `exercises/src/02_importance_sampling.py`; the worked
# solutions are in `solutions/02_importance_sampling.ipynb`. Write the function bodies
# where they raise `NotImplementedError`, run the *check yourself* cell under each one,
# and when all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/02_importance_sampling.ipynb
# ```
#
# The equations are numbered as in `lessons/02_importance_sampling.ipynb`. Throughout,
# $\pi$ is the policy being trained (the *target*) and $\mu$ the older policy that sampled
# the data (the *behaviour*); you get log-probabilities, never probabilities.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `tis_ppo_loss` | 10 | ★★★ | 25 min |
# | 2. `effective_sample_size` | 10 | ★☆☆ | 10 min |
# | 3. `expected_ess_fraction` | 10 | ★☆☆ | 10 min |
# | 4. `token_and_sequence_ratios` | 10 | ★★☆ | 15 min |

# %%
import math

import numpy as np
import torch

from course_lib import check

# %% [markdown]
# ## Exercise 1 · PPO's loss with the truncated behaviour weight (★★★, 25 min, 10 points)
#
# In an LLM trainer (verl and SkyRL call it TIS) three log-probabilities meet per token:
# $\log\pi_\theta$ of the model being trained; $\log\pi_{\text{old}}$, the trainer's own
# recomputation at the start of the step; and $\log\mu$, stored by the inference engine
# that sampled the token (a stale policy, or the same weights computed by other kernels).
# PPO clips the ratio to $\pi_{\text{old}}$, and the whole term is multiplied by the
# sampler's correction $\pi_{\text{old}}/\mu$, **truncated** at $c$ and not differentiated
# (sg = stop-gradient), averaged over the batch's real tokens:
#
# $$L = -\frac{1}{\#\text{real}}\sum_{i,t\ \text{real}} \mathrm{sg}\big[\min(v_{i,t}, c)\big]\,
#   \min\big(r_{i,t} A_i,\ \mathrm{clip}(r_{i,t}, 1-\epsilon, 1+\epsilon)\,A_i\big),
#   \qquad r_{i,t} = \frac{\pi_\theta}{\pi_{\text{old}}},\quad v_{i,t} = \frac{\pi_{\text{old}}}{\mu}.$$
#
# `logp_new` is a `[N, T]` torch tensor of $\log\pi_\theta$ that requires grad;
# `logp_old` and `logp_behaviour` (`[N, T]`) and `advantages` (`[N]`, one per answer,
# shared by its tokens) are constants: no gradient may flow into them. `mask` is `[N, T]`,
# true (or 1) at real tokens; where it is false the log-probabilities hold anything,
# `-inf` and NaN included, and no NaN may reach the loss or its gradient. Form both ratios
# from differences of log-probabilities, clamp each log-ratio to $[-20, 20]$ before `exp`
# (as verl does: $e^{89}$ overflows float32, and its gradient becomes $0\cdot\infty$ =
# NaN), and cap $\log v$ at $\log c$ (`c` may be `math.inf`). Return a scalar tensor.
# (Under data parallelism each rank holds part of the batch; a production trainer divides
# by the real-token count all-reduced over the ranks, not by its own. verl's default loss
# also bounds $-rA$ by $3|A|$ where $A < 0$, a dual clip left out here.)
#
# **How it is graded:** value and gradient against a naive loop over the real tokens on
# random padded batches (float64 and float32), ratios on both sides of both clip
# thresholds and of $c$, advantages of both signs; hand-computed values; properties: with
# $\pi_\theta = \pi_{\text{old}} = \mu$ it is REINFORCE's $-\mathrm{mean}(A)$; the weight is
# a constant; the cap applies to $\pi_{\text{old}}/\mu$ (not $\pi_\theta/\mu$, not the
# product with $r$); the clip is against $\pi_{\text{old}}$ (not $\mu$); `eps` and `c` are
# respected; the mean runs over real tokens; the mask is read position by position;
# log-ratios of $\pm 100$ in float32, of 30 (float32) and 800 (float64) with $A < 0$, a
# $\log v$ of 100 at $c = \infty$, and log-probabilities near $-800$ give a finite, clamped
# loss and gradient; no gradient reaches the constants; the inputs are unchanged.

# %% tags=["exercise"]
def tis_ppo_loss(logp_new, logp_old, logp_behaviour, advantages, mask, eps=0.2, c=2.0):
    """PPO's clipped loss times sg[min(pi_old / mu, c)], mean over real tokens (verl's and SkyRL's TIS).

    Args:
        logp_new: torch.Tensor [N, T], log pi_theta of the sampled tokens, requires grad.
        logp_old: torch.Tensor [N, T], the trainer's log pi_old (a constant).
        logp_behaviour: torch.Tensor [N, T], the sampler's log mu (a constant).
        advantages: torch.Tensor [N], one per answer (constants).
        mask: torch.Tensor [N, T], True (or 1) at real tokens.
        eps: PPO's clip range.
        c: cap of the behaviour weight pi_old / mu (math.inf: no cap).

    Returns:
        torch.Tensor of shape () (a scalar).
    """
    ### BEGIN SOLUTION
    real = mask.bool()
    old = logp_old.detach()
    log_r = torch.clamp(torch.where(real, logp_new - old, 0.0), -20.0, 20.0)
    log_c = min(math.log(c), 20.0)  # c = math.inf too: log v is clamped to [-20, 20] like log r
    log_v = torch.clamp(torch.where(real, old - logp_behaviour.detach(), 0.0), -20.0, log_c)
    ratio = torch.exp(log_r)
    adv = advantages.detach()[:, None]
    surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv)
    per_token = torch.where(real, torch.exp(log_v) * surrogate, 0.0)
    return -per_token.sum() / real.sum()
    ### END SOLUTION


# %% [markdown]
# Try it: two answers, the second a token shorter. The trainer has moved a little since
# $\pi_{\text{old}}$, and the sampler disagreed with the trainer. Which tokens does the cap
# at $c = 2$ change, which does the clip silence, and what does each token's gradient
# become?

# %% tags=["raises-in-stub"]
logp_behaviour = torch.log(torch.tensor([[0.2, 0.4, 0.2], [0.1, 0.4, 0.5]], dtype=torch.float64))
logp_behaviour[1, 2] = float("nan")  # padding holds anything
logp_old = torch.log(torch.tensor([[0.6, 0.2, 0.3], [0.4, 0.1, 0.5]], dtype=torch.float64))
logp_new = (logp_old + torch.tensor([[0.3, -0.1, 0.0], [-0.4, 0.1, 0.0]], dtype=torch.float64)).requires_grad_()
mask = torch.tensor([[True, True, True], [True, True, False]])
advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
loss = tis_ppo_loss(logp_new, logp_old, logp_behaviour, advantages, mask, eps=0.2, c=2.0)
loss.backward()
print("r = pi / pi_old  ", torch.exp(logp_new - logp_old).detach().numpy().round(2).tolist())
print("v = pi_old / mu  ", torch.exp(logp_old - logp_behaviour).nan_to_num(1.0).numpy().round(2).tolist())
print(f"loss = {loss.item():.4f}")
print("d loss / d logp_new =", (logp_new.grad.numpy().round(4) + 0.0).tolist())

# %% tags=["exercise-check"]
check("02_importance_sampling", "tis_ppo_loss", tis_ppo_loss)

# %% [markdown]
# ## Exercise 2 · Effective sample size (★☆☆, 10 min, 10 points)
#
# $N$ weighted samples are worth about as much as $\mathrm{ESS}$ unweighted ones
# (eq. 02.6; Kong 1992, Owen's *Monte Carlo theory*, ch. 9):
#
# $$\mathrm{ESS} = \frac{\big(\sum_{i=1}^N w_i\big)^2}{\sum_{i=1}^N w_i^2} .$$
#
# `weights` is a 1-D array or list of $N \ge 1$ non-negative weights. Return one Python
# `float`: $N$ when all weights are equal, 1 when a single weight is non-zero, and `0.0`
# (not NaN) when every weight is 0.
#
# **How it is graded:** against a naive sum on random weights; hand-computed values;
# properties: equal weights give $N$, one non-zero weight gives 1, scaling every weight
# by the same factor changes nothing, $1 \le \mathrm{ESS} \le N$, all-zero weights give
# 0.0; lists work and the input is unchanged.

# %% tags=["exercise"]
def effective_sample_size(weights):
    """Kish/Kong effective sample size (sum w)^2 / sum w^2 (eq. 02.6).

    Args:
        weights: [N] non-negative weights.

    Returns:
        float; 0.0 when every weight is 0.
    """
    ### BEGIN SOLUTION
    w = np.asarray(weights, dtype=np.float64)
    total = w.sum()
    squares = np.sum(w * w)
    if squares == 0:
        return 0.0
    return float(total * total / squares)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
print(f"equal weights: {effective_sample_size(np.ones(100)):.1f}   "
      f"one big weight among 100: {effective_sample_size(np.r_[100.0, np.ones(99)]):.2f}")

# %% tags=["exercise-check"]
check("02_importance_sampling", "effective_sample_size", effective_sample_size)

# %% [markdown]
# ## Exercise 3 · The expected ESS from the divergence (★☆☆, 10 min, 10 points)
#
# A batch's ESS (exercise 2) can only see the weights it drew. What $\mu$'s samples are
# worth *before* you draw them follows from the two distributions (eq. 02.6-02.7): as the
# batch grows, ESS/N tends to
#
# $$\frac{\mathrm{ESS}}{N} \;\to\; \frac{1}{\mathbb{E}_\mu[w^2]}
#   = \frac{1}{\sum_k \mu_k \big(\pi_k/\mu_k\big)^2}
#   = \frac{1}{1 + \chi^2(\pi\,\|\,\mu)} \;\le\; e^{-\mathrm{KL}(\pi\|\mu)} .$$
#
# `logp_target[k]` is $\log\pi_k$ and `logp_behaviour[k]` is $\log\mu_k$, over the `K`
# actions of one state (arrays or lists; $\mu_k > 0$ everywhere). Return one Python
# `float` in $[0, 1]$: 1 on-policy, falling as $\mu$ moves away from $\pi$. Stay in log
# space: $\mu_k\,w_k^2 = \pi_k^2/\mu_k = \exp(2\log\pi_k - \log\mu_k)$, and a rare action
# can have $\log\mu_k = -800$, where $\mu_k$ is 0.0 in floating point.
#
# **How it is graded:** against $1/(1+\chi^2)$ with $\chi^2 = \sum_k (\pi_k-\mu_k)^2/\mu_k$
# summed naively on random distributions; hand-computed values; properties: $\pi = \mu$
# gives 1; along lesson 02's family $\mu_\delta$ it falls as the KL grows and never exceeds
# $e^{-\mathrm{KL}}$; it is what the ESS/N of 200,000 of $\mu$'s samples measures;
# log-probabilities near $-800$ work; lists work and the inputs are unchanged.

# %% tags=["exercise"]
def expected_ess_fraction(logp_target, logp_behaviour):
    """Large-batch ESS/N of mu's samples for pi: 1 / E_mu[w^2] = 1 / (1 + chi2(pi || mu)) (eq. 02.6-02.7).

    Args:
        logp_target: [K] log pi over K actions.
        logp_behaviour: [K] log mu, the policy that samples (mu > 0 everywhere).

    Returns:
        float in [0, 1].
    """
    ### BEGIN SOLUTION
    log_pi = np.asarray(logp_target, dtype=np.float64)
    log_mu = np.asarray(logp_behaviour, dtype=np.float64)
    second_moment = np.sum(np.exp(2.0 * log_pi - log_mu))  # E_mu[w^2] = sum_k mu_k (pi_k / mu_k)^2
    return float(1.0 / second_moment)
    ### END SOLUTION


# %% [markdown]
# Try it on lesson 02's bandit family ($\pi = \mathrm{softmax}(3p)$, an older policy
# $\mu_\delta$ pushed away from the arms $\pi$ likes): how far can $\mu$ drift before its
# samples are worth half as many fresh ones, and where would the bound $e^{-\mathrm{KL}}$
# have put that line?

# %% tags=["raises-in-stub"]
p = np.array([0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
direction = (p - p.mean()) / p.std()
log_pi = 3 * p - np.log(np.sum(np.exp(3 * p)))


def behaviour(delta):
    """log mu_delta and KL(pi || mu_delta)."""
    z = 3 * p - delta * direction
    log_mu = z - np.log(np.sum(np.exp(z)))
    return log_mu, float(np.sum(np.exp(log_pi) * (log_pi - log_mu)))


half = max(d for d in np.arange(0.0, 3.001, 0.01) if expected_ess_fraction(log_pi, behaviour(d)[0]) >= 0.5)
bound = max(d for d in np.arange(0.0, 3.001, 0.01) if np.exp(-behaviour(d)[1]) >= 0.5)
print(f"largest delta with ESS/N >= 0.5: {half:.2f} (KL = {behaviour(half)[1]:.2f} nats); "
      f"the bound exp(-KL) >= 0.5 would allow delta = {bound:.2f} (KL = {behaviour(bound)[1]:.2f} nats)")

# %% tags=["exercise-check"]
check("02_importance_sampling", "expected_ess_fraction", expected_ess_fraction)

# %% [markdown]
# ## Exercise 4 · Per-token and per-sequence ratios (★★☆, 15 min, 10 points)
#
# A language model's answer $y_i$ is a sequence of tokens, and its probability is the
# product of the token probabilities. So the sequence's importance weight is the product
# of the per-token ratios (eq. 02.3):
#
# $$w_{i,t} = \frac{\pi(y_{i,t}\mid y_{i,<t})}{\mu(y_{i,t}\mid y_{i,<t})}, \qquad
#   w_i = \frac{\pi(y_i)}{\mu(y_i)} = \prod_{t\ \text{real}} w_{i,t}
#   = \exp\Big(\sum_{t\ \text{real}} \log w_{i,t}\Big).$$
#
# `logp_new` and `logp_old` are `[N, T]` token log-probabilities under $\pi$ and $\mu$;
# `mask` is `[N, T]`, true (or 1) at the answer's real tokens and false elsewhere: padding
# (shorter answers are padded to `T`) and, in a batch that keeps them, the prompt before the
# answer or a tool's output inside it. Where `mask` is false the numbers are arbitrary,
# `-inf` and NaN included: ignore them. Return a tuple
# `(token_ratios, sequence_ratios)`: float64 arrays of shapes `[N, T]` (1.0 at padding)
# and `[N]`. Stay in log space until the end: a token probability can be $e^{-800}$.
#
# **How it is graded:** against a naive double loop on random padded batches;
# hand-computed values; properties: padding changes nothing (token ratio 1 there, not in
# the product), the mask is read position by position (false before, inside and after the
# real tokens, holding `-inf` and NaN), each sequence ratio is the product of its real
# token ratios (not their mean or geometric mean), log-probabilities near $-800$ work, the
# inputs are unchanged.

# %% tags=["exercise"]
def token_and_sequence_ratios(logp_new, logp_old, mask):
    """Per-token ratios and their product over each sequence's real tokens (eq. 02.3).

    Args:
        logp_new: [N, T] token log-probabilities under the current policy pi.
        logp_old: [N, T] under the behaviour policy mu that sampled the tokens.
        mask: [N, T] True at real tokens, False at padding.

    Returns:
        (token_ratios [N, T] with 1.0 at padding, sequence_ratios [N]), float64.
    """
    ### BEGIN SOLUTION
    new = np.asarray(logp_new, dtype=np.float64)
    old = np.asarray(logp_old, dtype=np.float64)
    real = np.asarray(mask, dtype=bool)
    log_ratio = np.where(real, new - old, 0.0)
    return np.exp(log_ratio), np.exp(log_ratio.sum(axis=1))
    ### END SOLUTION


# %% [markdown]
# Try it: two answers, the second one a token shorter. Every token of the first is a
# little more likely under $\pi$; watch the product grow with the length.

# %% tags=["raises-in-stub"]
logp_old = np.log([[0.5, 0.5, 0.5], [0.4, 0.2, 0.9]])
logp_new = np.log([[0.6, 0.6, 0.6], [0.2, 0.4, 0.123]])  # the last entry is padding
mask = np.array([[True, True, True], [True, True, False]])
token_ratios, sequence_ratios = token_and_sequence_ratios(logp_new, logp_old, mask)
print("per-token ratios\n", np.round(token_ratios, 3))
print("per-sequence ratios", np.round(sequence_ratios, 3))

# %% tags=["exercise-check"]
check("02_importance_sampling", "token_and_sequence_ratios", token_and_sequence_ratios)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/02_importance_sampling.ipynb`.
