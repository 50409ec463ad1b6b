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
# # Exercises 00 · Welcome and setup
#
# This notebook is generated from `exercises/src/00_welcome.py`; the worked solutions
# are in `solutions/00_welcome.ipynb`. Edit the function bodies where they raise
# `NotImplementedError`, run the *check yourself* cell under each one, and when all pass
# grade the notebook from a terminal:
#
# ```
# course grade exercises/00_welcome.ipynb
# ```
#
# In every exercise of the course the checks grade your own code: an answer that hands the
# work to `course_lib`'s own implementation (an import, a wrapper, a call) is refused; only
# the pieces a statement names as allowed may be used.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `discounted_returns` | 10 | ★☆☆ | 10 min |
# | 2. `finished_episode_returns` | 10 | ★☆☆ | 10 min |

# %%
import numpy as np

from course_lib import check

# %% [markdown]
# ## Exercise 1 · Discounted returns with episode ends (★☆☆, 10 min, 10 points)
#
# A rollout buffer holds episodes back to back. `rewards[t]` is the reward after the
# action at step `t`; `dones[t] = 1` means the episode ended at step `t`. Return the
# discounted return of every step, within its own episode (lesson 00, eq. 00.1-00.2), with
# one addition the lesson describes but does not code: the buffer usually stops in the
# middle of an episode, and the state after its last step still has a value $V$ (an
# estimate, passed in as `bootstrap`). The backward pass then starts from it:
#
# $$G_t = r_t + \gamma\,(1 - d_t)\,G_{t+1}, \qquad G_T = V \;(\text{default } 0) .$$
#
# If the last step ended an episode, $(1 - d_{T-1}) = 0$ and $V$ is not used. Return a 1-D
# float numpy array of length `T` (`T` may be 0). Do not call `course_lib`'s own
# implementation: the grader refuses it.
#
# **How it is graded:** against an independent implementation of
# $G_t = \sum_{k=t}^{e(t)} \gamma^{k-t} r_k$ (plus $\gamma^{T-t} V$ for an episode still
# running) on random trajectories, hand-computed values, properties (with $\gamma = 0$ the
# returns are the rewards; two episodes computed together equal the two computed apart;
# an episode end inside the buffer cuts the return whatever its cause, a time-limit
# truncation too; each call returns a new array), and a 200,000-step buffer that only one
# backward pass finishes within the time limit.

# %% tags=["exercise"]
def discounted_returns(rewards, dones, gamma, bootstrap=0.0):
    """Discounted return of every step, cut at episode ends.

    Args:
        rewards: sequence of T rewards.
        dones: sequence of T flags, 1 where an episode ended at that step.
        gamma: discount factor in [0, 1].
        bootstrap: the value of the state after the last step (used only if the
            last step did not end an episode). With gymnasium, pass
            `dones = terminated | truncated`: every episode end cuts the return. A
            buffer that stops mid-episode passes V(next state) as `bootstrap`; if its
            last step was a truncation, clear that flag (`dones[-1] = terminated[-1]`)
            and pass V(the state it reached). A value target that bootstraps at a
            truncation inside the buffer needs the two-flag form (lesson 00, section 4;
            lesson 04's targets).

    Returns:
        np.ndarray of shape (T,), dtype float64.
    """
    ### BEGIN SOLUTION
    rewards = np.asarray(rewards, dtype=np.float64)
    dones = np.asarray(dones, dtype=np.float64)
    out = np.zeros_like(rewards)
    running = float(bootstrap)  # G_T
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * (1.0 - dones[t]) * running
        out[t] = running
    return out
    ### END SOLUTION


# %% tags=["raises-in-stub"]
discounted_returns([1.0, 1.0, 1.0, 1.0], [0, 1, 0, 0], gamma=0.5, bootstrap=2.0)  # [1.5, 1.0, 2.0, 2.0]

# %% tags=["exercise-check"]
check("00_welcome", "discounted_returns", discounted_returns)

# %% [markdown]
# ## Exercise 2 · The return of every finished episode (★☆☆, 10 min, 10 points)
#
# The number a learning curve plots is the *episodic return*: the plain sum of an
# episode's rewards, one number per episode (lesson 00, eq. 00.3):
#
# $$R_j = \sum_{t=s_j}^{e_j} r_t ,$$
#
# where episode $j$ starts at step $s_j$ (step 0, or the step after the previous episode
# ended) and ends at the step $e_j$ with `dones[e_j] = 1`. Return a 1-D float numpy array
# with one return per episode that **ended** in the buffer, in time order. An episode still
# running after the last step has no return yet: leave it out. With no finished episode
# (or `T = 0`) return an empty float array.
#
# **How it is graded:** against an independent implementation (the undiscounted return
# $G_{s_j}$ of eq. 00.1, with $\gamma = 1$, at each finished episode's first step) on
# random trajectories; hand-computed values; properties: every step done gives the
# rewards; an unfinished last episode is left out; an episode whose rewards add up to 0
# still has its return, 0.0; the returns add up to the rewards up to the last episode end;
# an episode's return is the same after an episode with a large return as alone; integer
# inputs work and the inputs are unchanged.

# %% tags=["exercise"]
def finished_episode_returns(rewards, dones):
    """The undiscounted return of every episode that ended, in time order.

    Args:
        rewards: sequence of T rewards, episodes back to back.
        dones: sequence of T flags, 1 where an episode ended at that step.

    Returns:
        np.ndarray of shape (number of finished episodes,), dtype float64.
    """
    ### BEGIN SOLUTION
    rewards = np.asarray(rewards, dtype=np.float64)
    out = []
    running = 0.0
    for t in range(len(rewards)):
        running += rewards[t]
        if dones[t]:
            out.append(running)
            running = 0.0
    return np.array(out, dtype=np.float64)
    ### END SOLUTION


# %% [markdown]
# Try it on lesson 00's buffer: two episodes of three steps, and one still running.

# %% tags=["raises-in-stub"]
finished_episode_returns([1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 1.0, 1.0], [0, 0, 1, 0, 0, 1, 0, 0])

# %% tags=["exercise-check"]
check("00_welcome", "finished_episode_returns", finished_episode_returns)

# %% [markdown]
# When both checks pass, grade the whole notebook: `course grade exercises/00_welcome.ipynb`.
