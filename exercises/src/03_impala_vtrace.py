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
# # Exercises 03 · IMPALA: actors, learner, V-trace
#
# This notebook is generated from `exercises/src/03_impala_vtrace.py`; the worked
# solutions are in `solutions/03_impala_vtrace.ipynb`. Write the function bodies where
# they raise `NotImplementedError`, run the *check yourself* cell under each one, and when
# all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/03_impala_vtrace.ipynb
# ```
#
# The equations are numbered as in `lessons/03_impala_vtrace.ipynb`. Every array is
# time-major: `x[t, b]` is step `t` of trajectory (environment) `b`.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `vtrace_targets` | 15 | ★★☆ | 20 min |
# | 2. `pg_advantages` | 10 | ★☆☆ | 10 min |
# | 3. `learner_step`: one step of the learner | 15 | ★★☆ | 20 min |
# | 4. `actor_unroll`: one unroll of an actor | 15 | ★★☆ | 20 min |

# %%
import numpy as np
import torch

from course_lib import check

# %% [markdown]
# ## Exercise 1 · V-trace targets (★★☆, 20 min, 15 points)
#
# An actor acted with a behaviour policy $\mu$ (the learner's weights of some updates
# ago); the learner's policy is now $\pi$. With the truncated importance weights
#
# $$\rho_t = \min\Big(\bar\rho, \frac{\pi(a_t\mid x_t)}{\mu(a_t\mid x_t)}\Big), \qquad
#   c_i = \min\Big(\bar c, \frac{\pi(a_i\mid x_i)}{\mu(a_i\mid x_i)}\Big), \qquad \bar\rho \ge \bar c, \qquad (03.1)$$
#
# the V-trace target of the value at $x_s$ is (Espeholt et al. 2018, eq. 1)
#
# $$v_s = V(x_s) + \sum_{t=s}^{T-1} \Big(\prod_{i=s}^{t-1} \gamma_i c_i\Big)\, \delta_t V, \qquad
#   \delta_t V = \rho_t\big(r_t + \gamma_t V(x_{t+1}) - V(x_t)\big) \qquad (03.2)$$
#
# where the product is empty (= 1) for $t = s$: it stops at $t - 1$. Here
# $\gamma_t$ is `discounts[t]` (0 where an episode ended at step $t$), $V(x_T)$ is
# `bootstrap_value`, and `log_rhos[t] = log pi(a_t|x_t) - log mu(a_t|x_t)`. The sum
# satisfies a backward recursion that computes all targets in one pass:
#
# $$v_s - V(x_s) = \delta_s V + \gamma_s c_s\,\big(v_{s+1} - V(x_{s+1})\big), \qquad v_T = V(x_T). \qquad (03.3)$$
#
# Inputs: `log_rhos`, `discounts`, `rewards`, `values` are `[T, B]` numpy arrays,
# `bootstrap_value` is `[B]`. Return `v` as a float64 `[T, B]` array; do not modify the inputs.
#
# **How it is graded:** against a deliberately naive implementation of (03.2), an
# explicit double sum with an explicit product per term, on random inputs whose ratios
# cross both thresholds (with $\bar\rho \ne \bar c$, so swapping them shows); a
# hand-computed example; properties: all ratios 1 give the n-step bootstrapped return, a
# trajectory holding two episodes equals the two computed apart, columns are independent,
# inputs are unchanged; and a trajectory of $T$ = 200,000 steps within 8 s, checked step by
# step against (03.3): one episode with $\gamma_t = 1$, $\bar c = 1$ and every ratio
# $\ge 1$, so no trace product shrinks. The recursion is one pass, while the double sum of
# (03.2) is $O(T^2)$, far too slow even if it stops where the product reaches 0 (or, as a
# `[T, T]` array, far too large). Common slips (the product
# including $c_t$, $\bar\rho$ and $\bar c$ swapped, no truncation, a forgotten bootstrap, an
# $O(T^2)$ sum) are named in the message.

# %% tags=["exercise"]
def vtrace_targets(log_rhos, discounts, rewards, values, bootstrap_value, rho_bar=1.0, c_bar=1.0):
    """V-trace value targets v_s (eq. 03.2-03.3).

    Args:
        log_rhos: [T, B] log pi(a_t|x_t) - log mu(a_t|x_t).
        discounts: [T, B] gamma_t (0 where the episode ended at step t).
        rewards: [T, B] r_t.
        values: [T, B] V(x_t).
        bootstrap_value: [B] V(x_T).
        rho_bar, c_bar: truncation thresholds (rho_bar >= c_bar).

    Returns:
        np.ndarray [T, B], dtype float64.
    """
    ### BEGIN SOLUTION
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    discounts = np.asarray(discounts, dtype=np.float64)
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    rhos = np.exp(log_rhos)
    clipped_rhos, cs = np.minimum(rho_bar, rhos), np.minimum(c_bar, rhos)
    values_tp1 = np.concatenate([values[1:], bootstrap_value[None]], axis=0)
    deltas = clipped_rhos * (rewards + discounts * values_tp1 - values)
    vs = np.zeros_like(values)
    acc = np.zeros_like(bootstrap_value)
    for t in reversed(range(values.shape[0])):
        acc = deltas[t] + discounts[t] * cs[t] * acc
        vs[t] = values[t] + acc
    return vs
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# two steps, one trajectory: ratios pi/mu = 2 (truncated to 1) and 0.5
example = dict(log_rhos=np.log([[2.0], [0.5]]), discounts=np.array([[0.9], [0.9]]), rewards=np.array([[1.0], [2.0]]),
               values=np.array([[0.5], [1.0]]), bootstrap_value=np.array([3.0]))
print("v_s =", vtrace_targets(**example).ravel().round(4), " (by hand: 3.565, 2.85)")

# %% tags=["exercise-check"]
check("03_impala_vtrace", "vtrace_targets", vtrace_targets)

# %% [markdown]
# ## Exercise 2 · Clipped policy-gradient advantages (★☆☆, 10 min, 10 points)
#
# The actor-critic update of IMPALA weighs $\nabla\log\pi(a_s\mid x_s)$ by an advantage
# that looks one step ahead with the V-trace target, and truncates the ratio with its own
# threshold $\bar\rho_{pg}$ (Espeholt et al. 2018, section 4.2):
#
# $$A_s = \min\Big(\bar\rho_{pg}, \frac{\pi(a_s\mid x_s)}{\mu(a_s\mid x_s)}\Big)\,\big(r_s + \gamma_s\, v_{s+1} - V(x_s)\big),
#   \qquad v_T = V(x_T). \qquad (03.4)$$
#
# Inputs as in exercise 1, plus `vs` (`[T, B]`, the targets of exercise 1). Return a
# float64 `[T, B]` array; do not modify the inputs.
#
# **How it is graded:** against an element-by-element implementation of (03.4) on random
# inputs crossing the threshold, a hand-computed example, and properties: at an episode
# end ($\gamma_s = 0$) the advantage is $\rho(r_s - V(x_s))$; only `pg_rho_bar` truncates;
# inputs are unchanged. Using $V(x_{s+1})$ or $v_s$ instead of $v_{s+1}$ is named in the message.

# %% tags=["exercise"]
def pg_advantages(log_rhos, discounts, rewards, values, vs, bootstrap_value, pg_rho_bar=1.0):
    """V-trace policy-gradient advantages (eq. 03.4).

    Args:
        log_rhos, discounts, rewards, values: [T, B] as in vtrace_targets.
        vs: [T, B] V-trace targets v_s.
        bootstrap_value: [B] V(x_T) (= v_T).
        pg_rho_bar: truncation threshold of the ratio.

    Returns:
        np.ndarray [T, B], dtype float64.
    """
    ### BEGIN SOLUTION
    vs = np.asarray(vs, dtype=np.float64)
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    vs_tp1 = np.concatenate([vs[1:], bootstrap_value[None]], axis=0)
    weights = np.minimum(pg_rho_bar, np.exp(np.asarray(log_rhos, dtype=np.float64)))
    return weights * (np.asarray(rewards, dtype=np.float64) + np.asarray(discounts, dtype=np.float64) * vs_tp1
                      - np.asarray(values, dtype=np.float64))
    ### END SOLUTION


# %% tags=["raises-in-stub"]
vs_example = vtrace_targets(**example)
print("A_s =", pg_advantages(vs=vs_example, **example).ravel().round(4), " (by hand: 3.065, 1.85)")

# %% tags=["exercise-check"]
check("03_impala_vtrace", "pg_advantages", pg_advantages)

# %% [markdown]
# ## Exercise 3 · The learner's step: slots, lag, weights (★★☆, 20 min, 15 points)
#
# In section 3 of the lesson the actors and the learner share `n_slots` preallocated
# rollout slots in shared memory, and only a slot's *index* travels between them: an
# actor fills a free slot with one unroll and hands its index back as full; the learner
# takes `batch_size` full slots, learns from them, and hands them back as free. The
# learner counts its updates: its weights have *version* $u$ after $u$ updates, and every
# action an actor takes is stamped with the version that chose it, so a slot carries
# `versions[t, b]`. Write one step of the learner: from the full slots `full`, one
# gradient step, the freed slots, the published weights and the policy lag of each column.
#
# What must hold when your function returns:
#
# * **The batch is a copy, and the slots are free before the update.** A slot's tensors
#   are views of shared memory: once its index is back in `free_queue`, an actor may
#   overwrite it at once. Every slot of `full` (and no other) is handed back exactly once,
#   and all of them before `learner.update` is called, so acting and learning overlap
#   (that overlap is the split's throughput); the batch `learner.update` receives must not
#   change when an actor refills a freed slot.
# * **The lag is measured at the version that learns.** The return value holds, per column
#   of the batch, the learner's version *before* the update minus the *oldest* version in
#   that column (weights can arrive in the middle of an unroll, so a column's versions may
#   differ). A version newer than the learner's means broken bookkeeping: raise
#   `ValueError`, and then neither learn nor publish.
# * **One update, then one publish of the new version.** `learner.update` is called once;
#   afterwards the weights are published once, as `learner.model` stamped with the
#   version the update produced: the actors stamp their next actions with it, so a wrong
#   stamp makes every later lag wrong.
#
# `slots` is a dict of torch tensors, one per field, with the slot index first:
# `obs [n_slots, T + 1, B, obs_dim]`, `actions`, `behaviour_logp`, `rewards`, `dones`,
# `versions [n_slots, T, B]`; `full` is the list of full slot indices in the order they
# arrived (slot `full[0]` first in the batch); `free_queue.put(index)` hands one slot back;
# `learner` has `.version`, `.model` and `.update(batch)`; `weights` has
# `.publish(model, version)`. The batch is a dict of the same six fields, each
# `[T (+1), len(full) * B, ...]`.
#
# **How it is graded:** with fakes that record the order of events: a free queue whose
# `put` overwrites the slot at once, as an actor refilling it would (a batch that is still
# a view of the slots changes); a learner whose `update` records the batch it receives and
# which slots were already free; weights that record what was published, and when. Each
# invariant above is checked for 1, 2 and 3 slots, with versions that change mid-unroll;
# the usual slips (freeing before copying or after the update, the lag from the newest
# version or after the update, publishing the old version or before the update) are
# named in the message.

# %% tags=["exercise"]
def learner_step(slots, full, free_queue, learner, weights):
    """One update of the IMPALA learner from the full rollout slots ``full``.

    Args:
        slots: dict of shared-memory torch tensors, field -> [n_slots, T (+1), B, ...].
        full: list of slot indices filled by the actors, in arrival order.
        free_queue: free_queue.put(index) hands a slot back to the actors.
        learner: .version (updates so far), .model, .update(batch) (one step; version += 1).
        weights: .publish(model, version) makes weights visible to the actors.

    Returns:
        np.ndarray [len(full) * B] int64: the policy lag of each column of the batch.

    Raises:
        ValueError: if a version in the batch is newer than learner.version.
    """
    ### BEGIN SOLUTION
    batch = {name: torch.cat([tensor[i] for i in full], dim=1) for name, tensor in slots.items()}
    for index in full:  # the batch is a copy: the actors may refill these slots while we learn
        free_queue.put(index)
    versions = batch["versions"].numpy()
    if (versions > learner.version).any():
        raise ValueError(f"a rollout has version {versions.max()}, newer than the learner's {learner.version}")
    lags = learner.version - versions.min(axis=0)
    learner.update(batch)
    weights.publish(learner.model, learner.version)
    return lags
    ### END SOLUTION


# %% [markdown]
# Your step on the course's real pieces: three slots of the shared-memory buffer the
# multi-process system uses, the learner that runs its loss (03.5) with Adam, and the
# seqlocked shared weights the actors pull. Slot 0 acted with version 6; slot 2 with
# version 7 until new weights arrived at its step 3:

# %% tags=["raises-in-stub"]
import queue

from course_lib.actor_learner.buffers import RolloutBuffers
from course_lib.actor_learner.learner import Learner, LossConfig
from course_lib.actor_learner.model import ActorCritic
from course_lib.runtime.weights import SharedWeights

torch.manual_seed(0)
buffers = RolloutBuffers.allocate(unroll=5, n_envs=2, obs_dim=4, n_slots=3)
buffers.tensors["obs"].normal_()
buffers.tensors["versions"][0] = 6
buffers.tensors["versions"][2] = 7
buffers.tensors["versions"][2, 3:] = 8
learner = Learner(ActorCritic(obs_dim=4, n_actions=2, hidden=16), lr=1e-3, cfg=LossConfig())
learner.version = 8
weights = SharedWeights(learner.model)
free_slots = queue.SimpleQueue()
lags = learner_step(buffers.tensors, [2, 0], free_slots, learner, weights)
print(f"lags per column: {lags.tolist()}; learner at version {learner.version}, the actors can pull version "
      f"{weights.version}; slots handed back: {[free_slots.get() for _ in range(free_slots.qsize())]}")

# %% tags=["exercise-check"]
check("03_impala_vtrace", "learner_step", learner_step)

# %% [markdown]
# ## Exercise 4 · One unroll of an actor (★★☆, 20 min, 15 points)
#
# An IMPALA actor owns a copy of the policy and a vector of `B` environments. Given one
# free slot of the shared-memory rollout buffer (a dict of preallocated torch tensors),
# it fills the slot with one unroll of `T = slot["actions"].shape[0]` steps, starting
# from the observations `obs` (`envs` resets an ended episode in the same step). When it
# returns, row `t` of the slot describes step `t` of the unroll, for every `t < T`:
#
# | field | row `t` holds |
# |---|---|
# | `obs` (`[T + 1, B, obs_dim]`) | $x_t$, the observation the action was chosen at; row `T` holds $x_T$, the bootstrap state |
# | `actions` (`[T, B]`, like the rest) | $a_t$, *sampled* from $\mu(\cdot\mid x_t)$ = softmax of the policy's logits, with `generator` only |
# | `behaviour_logp` | $\log\mu(a_t\mid x_t)$ under the acting policy (the learner needs it for $\pi/\mu$) |
# | `versions` | `version`, the weights that chose $a_t$ |
# | `rewards`, `dones` | what the step returned: $r_t$, and whether the episode ended (terminated *or* truncated) |
#
# The function returns $x_T$ (the next unroll starts there).
#
# `obs` is the `[B, obs_dim]` numpy array of current observations; `policy` maps a
# float32 tensor `[B, obs_dim]` to `(logits [B, K], values [B])`. Act under
# `torch.no_grad()`, and write into the slot's tensors in place (`slot[name][t] = ...`):
# they live in shared memory that the learner reads, so rebinding `slot[name]` loses the data.
#
# **How it is graded:** with a deterministic fake vector env that logs every transition:
# the slot must hold exactly the observations, actions, rewards and episode ends of those
# transitions, `obs[T]` and the return value the last observation, `behaviour_logp` the
# log-probability of the acting policy, `versions` the version; actions must follow the
# policy's probabilities (not its argmax) and depend only on `generator`; nothing may
# require grad.

# %% tags=["exercise"]
def actor_unroll(envs, policy, obs, slot, version, generator):
    """Fill one rollout slot with T steps of `envs` acted by `policy`; return the last observations.

    Args:
        envs: vector env with same-step autoreset (step(actions [B]) -> obs, reward, terminated, truncated, info).
        policy: torch module, float32 [B, obs_dim] -> (logits [B, K], values [B]).
        obs: np.ndarray [B, obs_dim], the current observations x_0.
        slot: dict of torch tensors: obs [T+1, B, obs_dim], actions, behaviour_logp, rewards, dones, versions [T, B].
        version: int, the version of the policy's weights.
        generator: torch.Generator to sample actions with.

    Returns:
        np.ndarray [B, obs_dim]: x_T.
    """
    ### BEGIN SOLUTION
    n_t = slot["actions"].shape[0]
    with torch.no_grad():
        for t in range(n_t):
            x = torch.as_tensor(obs, dtype=torch.float32)
            logits, _ = policy(x)
            logp = torch.log_softmax(logits, dim=-1)
            actions = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
            slot["obs"][t] = x
            slot["actions"][t] = actions
            slot["behaviour_logp"][t] = logp.gather(1, actions.unsqueeze(1)).squeeze(1)
            slot["versions"][t] = version
            obs, reward, terminated, truncated, _ = envs.step(actions.numpy())
            slot["rewards"][t] = torch.as_tensor(reward, dtype=torch.float32)
            slot["dones"][t] = torch.as_tensor(np.logical_or(terminated, truncated))
        slot["obs"][n_t] = torch.as_tensor(obs, dtype=torch.float32)
    return obs
    ### END SOLUTION


# %% [markdown]
# Your unroll on real CartPoles, with the course's actor-critic network and a slot of the
# shared-memory buffer the multi-process system uses; then your V-trace on that unroll,
# pretending the learner's policy is a slightly different one:

# %% tags=["raises-in-stub"]
from course_lib.actor_learner.buffers import RolloutBuffers
from course_lib.actor_learner.envs import make_envs
from course_lib.actor_learner.model import ActorCritic

torch.manual_seed(0)
envs = make_envs("CartPole-v1", 4)
obs, _ = envs.reset(seed=0)
net = ActorCritic(obs_dim=4, n_actions=2, hidden=16)
buffers = RolloutBuffers.allocate(unroll=20, n_envs=4, obs_dim=4, n_slots=1)
slot = buffers.slot(0)
next_obs = actor_unroll(envs, net, obs, slot, version=3, generator=torch.Generator().manual_seed(0))
print(f"rewards collected: {slot['rewards'].sum().item():.0f} over {slot['actions'].numel()} steps; "
      f"episodes ended: {int(slot['dones'].sum())}; versions: {sorted(set(slot['versions'].flatten().tolist()))}")
assert np.allclose(slot["obs"][20].numpy(), next_obs)

# %% tags=["raises-in-stub"]
with torch.no_grad():
    logits, values = net(slot["obs"])  # [T + 1, B, 2], [T + 1, B]
    learner_logp = torch.log_softmax(1.3 * logits[:20], -1).gather(-1, slot["actions"].unsqueeze(-1)).squeeze(-1)
log_rhos = (learner_logp - slot["behaviour_logp"]).double().numpy()
discounts = 0.99 * (1.0 - slot["dones"].double().numpy())
targets = vtrace_targets(log_rhos, discounts, slot["rewards"].numpy(), values[:20].double().numpy(),
                         values[20].double().numpy())
advantages = pg_advantages(log_rhos, discounts, slot["rewards"].numpy(), values[:20].double().numpy(), targets,
                           values[20].double().numpy())
print(f"ratios pi/mu from {np.exp(log_rhos).min():.2f} to {np.exp(log_rhos).max():.2f}; "
      f"mean target {targets.mean():.2f}; mean advantage {advantages.mean():.2f}")

# %% tags=["exercise-check"]
check("03_impala_vtrace", "actor_unroll", actor_unroll)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/03_impala_vtrace.ipynb`.
