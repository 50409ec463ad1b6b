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
# # Exercises 01 · Policy gradients: sample, grade, reinforce
#
# This notebook is generated from `exercises/src/01_policy_gradients.py`; the worked
# solutions are in `solutions/01_policy_gradients.ipynb`. Write the function bodies where
# they raise `NotImplementedError`, run the *check yourself* cell under each one, and when
# all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/01_policy_gradients.ipynb
# ```
#
# The equations are numbered as in `lessons/01_policy_gradients.ipynb`.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `rloo_advantages`: the leave-one-out baseline | 10 | ★☆☆ | 10 min |
# | 2. `surrogate_loss` | 10 | ★★☆ | 15 min |
# | 3. `group_relative_advantages` | 10 | ★☆☆ | 10 min |
# | 4. `reinforce_update`: a complete REINFORCE step | 15 | ★★★ | 25 min |

# %%
import numpy as np
import torch

from course_lib import check
from course_lib.rl.pg import discounted_returns  # lesson 00's reward-to-go, for exercise 4

# %% [markdown]
# ## Exercise 1 · Leave-one-out advantages (★☆☆, 10 min, 10 points)
#
# Lesson §2 measured that the group mean, used as a baseline, shrinks the expected gradient
# to $(1 - 1/G)\,\nabla J$: each answer's own reward sits in its own baseline, so the
# baseline depends on the action. RLOO (Ahmadian et al. 2024, arXiv 2402.14740) leaves it
# out. For `G` answers to each of `B` prompts, answer $j$'s baseline is the mean reward of
# the *other* $G - 1$ answers to the same prompt:
#
# $$A_{ij} = r_{ij} - \frac{1}{G-1}\sum_{k\ne j} r_{ik} .$$
#
# `rewards` is `[B, G]`, one row per prompt, `G >= 2`. Return a float64 `[B, G]` array; do
# not modify the input.
#
# **How it is graded:** against explicit sums over the other answers on random rewards
# (`G` from 2 to 16) and hand-computed values; properties: raising one answer's reward by 1
# raises its own advantage by exactly 1; with `G = 2` each advantage is the difference of the
# two rewards; a constant group gives zeros; each row computed alone equals that row of the
# batch; and, what the lesson measured, the estimator $\frac1G\sum_j A_{ij}(\mathbf e_{a_{ij}} - \pi)$
# has expectation exactly $\nabla J$ (not $(1 - 1/G)\,\nabla J$), computed over every group of
# `G` = 2, 3 and 4 answers to a 4-way softmax.

# %% tags=["exercise"]
def rloo_advantages(rewards):
    """Leave-one-out advantages of G answers to each of B prompts.

    Args:
        rewards: array-like [B, G], reward of answer j to prompt i (G >= 2).

    Returns:
        np.ndarray [B, G], dtype float64.
    """
    ### BEGIN SOLUTION
    r = np.asarray(rewards, dtype=np.float64)
    others = (r.sum(axis=1, keepdims=True) - r) / (r.shape[1] - 1)
    return r - others
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# two prompts, four answers each, graded right (1) or wrong (0)
graded = np.array([[1, 0, 0, 0], [1, 1, 0, 1]])
print(np.round(rloo_advantages(graded), 3))

# %% tags=["exercise-check"]
check("01_policy_gradients", "rloo_advantages", rloo_advantages)

# %% [markdown]
# ## Exercise 2 · The surrogate loss (★★☆, 15 min, 10 points)
#
# Autograd computes the policy gradient for you if you give it a loss whose gradient is
# minus the estimate (eq. 01.7):
#
# $$L(\theta) = -\frac1N \sum_{i=1}^{N} A_i \log\pi_\theta(a_i\mid s_i), \qquad \nabla_\theta L = -\hat g .$$
#
# `logits` is the policy network's output `[N, K]` for the `N` visited states, `actions`
# the `[N]` integer actions taken, `advantages` the `[N]` weights $A_i$. The weights are
# **constants**: the estimator multiplies the score by them and must not differentiate
# through them (detach them). Return a scalar (0-dimensional) torch tensor; use a
# numerically stable log-softmax, not `log(softmax(...))`.
#
# **How it is graded:** the value against a naive float64 implementation (an explicit
# log-sum-exp per row) on random inputs and a hand-computed case; the gradient with
# respect to the logits against the score-function formula (01.4),
# $-\frac1N A_i(\mathbf{e}_{a_i} - \pi_i)$ for row $i$; properties: a gradient step makes
# actions with positive advantage more likely, logits 1000 apart give a finite and exact
# loss and gradient (where `log(softmax(...))` gives $\log 0 = -\infty$), repeating the
# batch leaves the loss unchanged (a mean, not a sum), no gradient reaches `advantages`,
# inputs are unchanged.

# %% tags=["exercise"]
def surrogate_loss(logits, actions, advantages):
    """The REINFORCE surrogate loss -mean_i A_i log pi(a_i | s_i).

    Args:
        logits: torch.Tensor [N, K], requires grad.
        actions: torch.Tensor [N], integer actions in [0, K).
        advantages: torch.Tensor [N], weights A_i (treated as constants).

    Returns:
        torch.Tensor of shape () (a scalar).
    """
    ### BEGIN SOLUTION
    logp = torch.log_softmax(logits, dim=-1)
    logp_taken = logp.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return -(advantages.detach().to(logp_taken.dtype) * logp_taken).mean()
    ### END SOLUTION


# %% tags=["raises-in-stub"]
logits = torch.zeros(2, 2, requires_grad=True)  # pi = (1/2, 1/2) in both states
loss = surrogate_loss(logits, torch.tensor([0, 1]), torch.tensor([1.0, 3.0]))
loss.backward()
print(f"loss = {loss.item():.6f}  (2 ln 2 = {2 * np.log(2):.6f})")
print("grad wrt logits:", logits.grad.tolist())

# %% tags=["exercise-check"]
check("01_policy_gradients", "surrogate_loss", surrogate_loss)

# %% [markdown]
# ## Exercise 3 · Group-relative advantages (★☆☆, 10 min, 10 points)
#
# GRPO (Shao et al. 2024, arXiv 2402.03300) samples `G` answers to each of `B` prompts,
# grades them, and uses each prompt's group as its own baseline (eq. 01.6):
#
# $$A_{ij} = \frac{r_{ij} - \mathrm{mean}_j\, r_{ij}}{\mathrm{std}_j\, r_{ij} + \epsilon}
#   \quad\text{(normalize\_std=True)}, \qquad A_{ij} = r_{ij} - \mathrm{mean}_j\, r_{ij}
#   \quad\text{(normalize\_std=False)} .$$
#
# `rewards` is `[B, G]`, one row per prompt (`G >= 2`). Mean and std are over each row
# only; `eps` is added to the std, outside the square root. The paper leaves the std
# open: TRL and verl use the sample std (`torch.std`'s default, `ddof=1`), numpy's default
# is the population std (`ddof=0`); either is accepted, used the same way throughout.
# Return a float64 `[B, G]` array; do not modify the input.
#
# **How it is graded:** against a naive implementation (explicit sums per row, with the
# std convention your function uses) on random rewards, both settings; hand-computed
# values; properties: a row whose rewards are all equal gives zeros (not NaN); rows do
# not influence each other; with the std, a reward scale and shift `a * r + c` (`a > 0`)
# changes nothing; `eps` sits where the equation puts it.

# %% tags=["exercise"]
def group_relative_advantages(rewards, normalize_std=True, eps=1e-6):
    """Group-relative advantages of G answers to each of B prompts.

    Args:
        rewards: array-like [B, G], reward of answer j to prompt i.
        normalize_std: divide by each group's std (sample or population).
        eps: added to the std.

    Returns:
        np.ndarray [B, G], dtype float64.
    """
    ### BEGIN SOLUTION
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_std:
        return centred
    return centred / (r.std(axis=1, ddof=1, keepdims=True) + eps)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# three prompts, four answers each, graded right (1) or wrong (0)
graded = np.array([[1, 0, 0, 0], [1, 1, 0, 1], [1, 1, 1, 1]])
print(np.round(group_relative_advantages(graded), 3))
print(np.round(group_relative_advantages(graded, normalize_std=False), 3))

# %% tags=["exercise-check"]
check("01_policy_gradients", "group_relative_advantages", group_relative_advantages)

# %% [markdown]
# ## Exercise 4 · A complete REINFORCE update (★★★, 25 min, 15 points)
#
# Put the pieces together into one policy-gradient step on a rollout. The rollout is
# time-major, as a vector env fills it: `obs [T, B, obs_dim]`, `actions [T, B]`, `rewards [T, B]`,
# `dones [T, B]` (numpy arrays; every step is a real step; episodes follow each other in
# each column). `policy` maps a float32 tensor `[N, obs_dim]` to logits `[N, n_actions]`.
#
# 1. weights: the reward-to-go $G_{t,b}$ (01.3) minus its mean over the whole batch,
#    divided by its std over the whole batch plus `1e-8` (numpy's population std or torch's
#    sample std: either is accepted) (01.5):
#    $A = (G - \bar G)/(\mathrm{std}(G) + 10^{-8})$;
# 2. the surrogate loss (01.7) over all `T * B` steps;
# 3. one step of the `optimizer` you are given (it may be SGD, Adam, with momentum or weight
#    decay): clear old gradients, backpropagate, `optimizer.step()`;
# 4. return the loss (computed before the step) as a Python `float`.
#
# For the reward-to-go, call lesson 00's `discounted_returns(rewards, dones, gamma)`
# (imported at the top; it takes `[T, B]` arrays) or write the backward loop yourself. Call your `surrogate_loss` from exercise 2, or, if you are stuck on
# it, the library's (`from course_lib.rl.pg import surrogate_loss`); these two are the only
# course_lib functions this exercise accepts. Yours is checked first: if it fails exercise
# 2's checks, this exercise says so.
#
# **How it is graded:** with plain SGD the parameters must move by exactly
# $-\text{lr}\cdot\nabla L$, where $L$ is computed independently (naive returns per step,
# a log-softmax per sample), at discounts from 0 to 1 and with boolean, 0/1 integer and
# float `dones`; the returned loss must equal $L$; stale gradients left in `.grad` before
# the call must not leak into the step; episode ends must cut the returns; with SGD with
# weight decay the step must be that optimizer's; the inputs must be unchanged; and a few
# dozen updates must teach a policy a two-context task (the right action in each context)
# to at least 90% accuracy.

# %% tags=["exercise"]
def reinforce_update(policy, optimizer, obs, actions, rewards, dones, gamma):
    """One REINFORCE step with reward-to-go and a normalised batch-mean baseline.

    Args:
        policy: torch.nn.Module, float32 [N, obs_dim] -> logits [N, n_actions].
        optimizer: a torch optimizer over policy's parameters.
        obs: np.ndarray [T, B, obs_dim] observations.
        actions: np.ndarray [T, B] integer actions taken.
        rewards: np.ndarray [T, B] rewards.
        dones: np.ndarray [T, B] (bool or 0/1), 1 where an episode ended.
        gamma: discount in [0, 1].

    Returns:
        float: the surrogate loss before the step.
    """
    ### BEGIN SOLUTION
    g = discounted_returns(rewards, dones, gamma)
    adv = (g - g.mean()) / (g.std() + 1e-8)
    obs_t = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
    obs_t = obs_t.reshape(-1, obs_t.shape[-1])
    actions_t = torch.as_tensor(np.asarray(actions)).reshape(-1).long()
    adv_t = torch.as_tensor(adv.reshape(-1), dtype=torch.float32)
    loss = surrogate_loss(policy(obs_t), actions_t, adv_t)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
    ### END SOLUTION


# %% [markdown]
# Your update, in a complete training loop on CartPole: `course_lib.rl.reinforce` collects
# one episode from each of 16 vectorised envs per update and lays them back to back in
# one column, the layout your function takes. About 5 seconds:

# %% tags=["raises-in-stub"]
# NBVAL_IGNORE_OUTPUT
from course_lib.rl.reinforce import ReinforceConfig, collect_episodes, make_env, make_policy

torch.manual_seed(0)
torch.set_num_threads(1)  # tiny network: one thread is fastest
envs = make_env(ReinforceConfig(n_envs=16))
policy = make_policy(obs_dim=4, n_actions=2, hidden=32)
optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
generator = torch.Generator().manual_seed(0)
mean_returns = []
for update in range(40):
    batch = collect_episodes(envs, policy, seed=update, generator=generator)
    reinforce_update(policy, optimizer, *batch.back_to_back(), gamma=0.99)
    mean_returns.append(batch.returns.mean())
print(f"mean return: first update {mean_returns[0]:.0f}, last 5 updates {np.mean(mean_returns[-5:]):.0f}")

# %% tags=["raises-in-stub"]
assert len(mean_returns) == 40, "the training loop above did not finish"
assert np.mean(mean_returns[-5:]) > 3 * mean_returns[0], "the policy should balance much longer after training"
print("your update learns CartPole")

# %% tags=["exercise-check"]
check("01_policy_gradients", "reinforce_update", reinforce_update)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/01_policy_gradients.ipynb`.
