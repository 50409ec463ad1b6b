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
# | 1. `is_estimate` | 10 | ★☆☆ | 10 min |
# | 2. `effective_sample_size` | 10 | ★☆☆ | 10 min |
# | 3. `expected_ess_fraction` | 10 | ★☆☆ | 10 min |
# | 4. `token_and_sequence_ratios` | 10 | ★★☆ | 15 min |
# | 5. `clipped_surrogate_loss` | 15 | ★★☆ | 20 min |

# %%
import numpy as np
import torch

from course_lib import check

# %% [markdown]
# ## Exercise 1 · The importance-sampling estimate (★☆☆, 10 min, 10 points)
#
# Samples $x_1..x_N$ were drawn from $\mu$; estimate the expectation of $f$ under $\pi$
# (eq. 02.2):
#
# $$\mathbb{E}_{x\sim\pi}[f(x)] = \mathbb{E}_{x\sim\mu}\big[w(x) f(x)\big]
#   \approx \frac1N \sum_{i=1}^N w_i f(x_i), \qquad
#   w_i = \frac{\pi(x_i)}{\mu(x_i)} = \exp\big(\log\pi(x_i) - \log\mu(x_i)\big).$$
#
# `values[i]` is $f(x_i)$, `logp_target[i]` is $\log\pi(x_i)$ and `logp_behaviour[i]`
# is $\log\mu(x_i)$ (arrays or lists of length `N >= 1`). Return one Python `float`.
# Work with the difference of log-probabilities: the probability of a long answer can be
# $e^{-1000}$, which is 0.0 in floating point, while its log is an ordinary number.
#
# **How it is graded:** against a naive loop over the samples on random inputs;
# hand-computed values; properties: when $\pi = \mu$ it is the plain mean of the values;
# averaged over every possible single sample $x \sim \mu$ it gives exactly
# $\mathbb{E}_\pi[f]$ (unbiased), a sample that $\mu$ draws with probability $e^{-30}$
# included (its weight is $e^{29}$: keep it whole, do not cap or clamp it);
# log-probabilities near $-1000$ work; the inputs are unchanged.

# %% tags=["exercise"]
def is_estimate(values, logp_target, logp_behaviour):
    """Importance-sampling estimate of E_pi[f] from N samples of mu (eq. 02.2).

    Args:
        values: [N] f(x_i).
        logp_target: [N] log pi(x_i).
        logp_behaviour: [N] log mu(x_i), the policy that drew x_i.

    Returns:
        float: (1/N) sum_i exp(log pi(x_i) - log mu(x_i)) f(x_i).
    """
    ### BEGIN SOLUTION
    f = np.asarray(values, dtype=np.float64)
    log_w = np.asarray(logp_target, dtype=np.float64) - np.asarray(logp_behaviour, dtype=np.float64)
    return float(np.mean(np.exp(log_w) * f))
    ### END SOLUTION


# %% [markdown]
# Try it: three actions, an old policy $\mu$ that is uniform and a new policy $\pi$ that
# prefers action 0. Estimate $\pi$'s expected reward from 10,000 of $\mu$'s samples.

# %% tags=["raises-in-stub"]
rng = np.random.default_rng(0)
pi, mu, reward = np.array([0.6, 0.3, 0.1]), np.array([1 / 3, 1 / 3, 1 / 3]), np.array([1.0, 0.0, 2.0])
actions = rng.choice(3, size=10_000, p=mu)
estimate = is_estimate(reward[actions], np.log(pi[actions]), np.log(mu[actions]))
print(f"IS estimate {estimate:.3f}   exact E_pi[r] = {pi @ reward:.3f}   naive mean of mu's rewards {reward[actions].mean():.3f}")

# %% tags=["exercise-check"]
check("02_importance_sampling", "is_estimate", is_estimate)

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
# Try it on lesson 02's bandit family: the target $\pi = \mathrm{softmax}(3p)$ and an older
# policy $\mu_\delta$ pushed away from the arms $\pi$ likes. How much of a batch is left at
# each divergence, and how far below the bound $e^{-\mathrm{KL}}$ is it? The last line finds
# the largest $\delta$ whose samples keep at least half their worth.

# %% tags=["raises-in-stub"]
p = np.array([0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1])
direction = (p - p.mean()) / p.std()
log_pi = 3 * p - np.log(np.sum(np.exp(3 * p)))


def behaviour(delta):
    """log mu_delta and KL(pi || mu_delta)."""
    z = 3 * p - delta * direction
    log_mu = z - np.log(np.sum(np.exp(z)))
    return log_mu, float(np.sum(np.exp(log_pi) * (log_pi - log_mu)))


print(f"{'delta':>5} {'KL(pi||mu)':>10} {'ESS/N expected':>14} {'exp(-KL)':>9}")
for delta in np.arange(0.0, 3.01, 0.5):
    log_mu, kl = behaviour(delta)
    print(f"{delta:>5.1f} {kl:>10.3f} {expected_ess_fraction(log_pi, log_mu):>14.3f} {np.exp(-kl):>9.3f}")
half = max(d for d in np.arange(0.0, 3.001, 0.01) if expected_ess_fraction(log_pi, behaviour(d)[0]) >= 0.5)
print(f"largest delta with ESS/N >= 0.5: {half:.2f} (KL = {behaviour(half)[1]:.2f} nats)")

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
# ## Exercise 5 · PPO's clipped surrogate loss (★★☆, 20 min, 15 points)
#
# PPO (Schulman et al. 2017, arXiv 1707.06347) maximises the clipped surrogate
# (eq. 02.5); as a loss to minimise, averaged over the `N` samples:
#
# $$L = -\frac1N\sum_{i=1}^N \min\big(r_i A_i,\ \mathrm{clip}(r_i, 1-\epsilon, 1+\epsilon)\,A_i\big),
#   \qquad r_i = \exp\big(\log\pi_\theta(a_i\mid s_i) - \log\mu(a_i\mid s_i)\big).$$
#
# `logp_new` is a `[N]` torch tensor of $\log\pi_\theta$ that requires grad; `logp_old`
# (`[N]`, $\log\mu$, recorded when the samples were drawn) and `advantages` (`[N]`) are
# constants: no gradient may flow into them, even if they require grad. Form $r_i$ from the
# difference of the log-probabilities: a sequence's log-probability can be $-800$, where
# its probability is 0.0. Return a scalar (0-dimensional) tensor. The gradient then is
# $-\frac1N A_i r_i \nabla\log\pi_\theta(a_i\mid s_i)$ for the samples where the
# unclipped term is the smaller one, and **zero** where the clip is active
# ($r_i > 1+\epsilon$ with $A_i > 0$, or $r_i < 1-\epsilon$ with $A_i < 0$).
#
# **How it is graded:** the value against a naive float64 loop on random ratios on both
# sides of both clip thresholds, with positive and negative advantages; the gradient with
# respect to `logp_new` against the formula above; hand-computed values; properties: with
# $r = 1$ the loss is $-\mathrm{mean}(A)$ and its gradient is REINFORCE's; no gradient
# reaches `logp_old` or `advantages`; `eps` is respected; a mean, not a sum;
# log-probabilities near $-800$ give a finite loss and gradient; the inputs are unchanged.

# %% tags=["exercise"]
def clipped_surrogate_loss(logp_new, logp_old, advantages, eps=0.2):
    """Minus PPO's clipped surrogate, averaged over the samples (eq. 02.5).

    Args:
        logp_new: torch.Tensor [N], log pi_theta(a_i|s_i), requires grad.
        logp_old: torch.Tensor [N], log mu(a_i|s_i) (a constant).
        advantages: torch.Tensor [N] (constants).
        eps: clip range.

    Returns:
        torch.Tensor of shape () (a scalar).
    """
    ### BEGIN SOLUTION
    ratio = torch.exp(logp_new - logp_old.detach())
    adv = advantages.detach()
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps, 1.0 + eps) * adv
    return -torch.min(unclipped, clipped).mean()
    ### END SOLUTION


# %% [markdown]
# Try it: five samples whose ratios sit on both sides of both thresholds ($\epsilon = 0.2$).
# Which samples still push the policy?

# %% tags=["raises-in-stub"]
ratios = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.1], dtype=torch.float64)
adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 2.0], dtype=torch.float64)
logp_old = torch.log(torch.full((5,), 0.3, dtype=torch.float64))
logp_new = (logp_old + torch.log(ratios)).requires_grad_()
loss = clipped_surrogate_loss(logp_new, logp_old, adv, eps=0.2)
loss.backward()
print(f"loss = {loss.item():.4f}")
print("d loss / d logp_new =", np.round(logp_new.grad.numpy(), 4).tolist())

# %% tags=["exercise-check"]
check("02_importance_sampling", "clipped_surrogate_loss", clipped_surrogate_loss)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/02_importance_sampling.ipynb`.
