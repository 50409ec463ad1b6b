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
# # 00 · Welcome and setup
#
# **Efficient RL Systems** teaches how reinforcement-learning training systems are made
# fast, cheap and predictable: the policy-gradient estimator, actor-learner systems
# (IMPALA), training loops compiled for the accelerator (PureJaxRL), the machinery of LLM
# post-training (pipeline RL, cluster layout, weight sync, fault tolerance), and a capstone
# asynchronous run on torchrun and on Ray. Every lesson runs on a 2-core CPU in minutes;
# its `full` scale runs the same code sized for one GPU.
#
# **Learning goals of this lesson**
# 1. Know the map of the course, its two paths, and how long each takes.
# 2. Picture an RL training system: actors, learner, weights and the lag between them.
# 3. Run a lesson at either scale, and check your machine with `course doctor`.
# 4. Meet the return $G_t$ with episode ends, which lessons 01, 03 and 04 compute for their
#    training targets, and the episode return $R_j$ that their learning curves plot.
# 5. Do two short graded exercises end to end: edit, self-check, `course grade`.

# %% [markdown]
# The first cell imports the course library. If it fails, run `make lab` from the
# course folder (it creates `.venv` and installs everything) and pick that kernel.

# %%
import course_lib
from course_lib import current_scale

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## 1. The course map, its paths and its hours
#
# Later lessons import the tested library `course_lib`, never your exercise code, so
# being stuck on one exercise never blocks the next lesson. The hours below are
# `course pace --self-study`'s: each lesson's text read closely, plus the time it takes
# to run, plus each exercise's stated time.

# %%
from course_lib.course.catalog import LESSONS, PATHS, path_lessons
from course_lib.course.pacing import SELF_STUDY_WPM, lesson_plans, load_reference

plans = lesson_plans(load_reference())
hours = {n: plan.study_min / 60 for n, plan in plans.items()}
print(f"hours = reading at {SELF_STUDY_WPM} words/min and running the lesson + the exercises' stated minutes")
for lesson in LESSONS:
    needs = ", ".join(f"{r:02d}" for r in lesson.requires) or "-"
    print(f"{lesson.number:02d}  {hours[lesson.number]:3.1f} h  needs {needs:<19} {lesson.title}")
for name in PATHS:
    numbers = path_lessons(name)
    print(f"{name}: {', '.join(f'{n:02d}' for n in numbers)}: {sum(hours[n] for n in numbers):.0f} h")
print(f"the whole course: {sum(hours.values()):.0f} h")
assert set(hours) == {lesson.number for lesson in LESSONS}
assert 5 in path_lessons("LLM-systems path") and 6 not in path_lessons("LLM-systems path")

# %%
import matplotlib.pyplot as plt

from course_lib.course.plots import course_map

fig = course_map()
plt.show()

# %% [markdown]
# An arrow leads from a lesson to one that builds on it, drawn only where no longer path
# implies it; a lesson needs everything upstream of it (the table lists its prerequisites).
#
# **Takeaway:** both paths take the foundations (00-02) and the actor-learner system (03).
# The accelerator path ends at 06. The LLM-systems path (07-10) ends at the capstone
# (11-12), which uses lesson 05's collectives, so it takes 04-05 too and leaves out only 06.

# %% [markdown]
# ## 2. An RL training system in one minute
#
# Every system in this course has four parts. **Actors** play the current policy in their
# environments and write what happened (states, actions, rewards $r_t$, episode ends
# $d_t$) to a buffer. The **learner** turns each buffer into training targets (section 4)
# and a loss, and updates the policy's **weights**. The new weights travel back to the actors;
# until they arrive, the actors play with older ones: the **lag**, counted in learner
# updates (0 when actors and learner take turns, as in lesson 01).
#
# **Pseudocode**
# ```
# repeat:
#     actors:  play pi(theta_old) for T steps per environment
#              -> buffer (s_t, a_t, r_t, d_t, log mu(a_t|s_t), version of theta_old)
#     learner: targets from the buffer (G_t with a bootstrap; V-trace in 03, GAE in 04),
#              a loss from them, theta <- theta_new
#     sync:    send theta_new to the actors; until it arrives they act with theta_old (the lag)
#     log:     the return R_j of every episode that ended (00.3)
# ```
#
# Making this loop fast is the course: actors and learner run at once (03, 07), the loop
# is compiled for the accelerator (04-06), placed on a cluster (08), the weights move
# quickly (09) and the run survives crashes (10). Lessons 02, 03, 07, 11 and 12 correct
# for the lag.

# %% [markdown]
# ## 3. Running a lesson, and checking your machine
#
# | what | command |
# |---|---|
# | open the course in JupyterLab | `make lab` |
# | execute lessons headless, with a timing table | `course run 01 02` |
# | the same at the full scale (sized for one GPU) | `course run 04 --scale full` |
# | the same without Jupyter | `course run 04 --scale full --no-kernel` |
# | check this machine | `course doctor` |
# | put an exercise back to its stub (a backup is kept) | `course reset exercises/00_welcome.ipynb --exercise 1` |
#
# `course` is `.venv/bin/course` in the course folder (or plain `course` once the
# virtual environment is activated: `source .venv/bin/activate`).
#
# `COURSE_SCALE` picks the scale: `cpu` (the default) gives the outputs stored in the
# notebooks; `full` is sized for one GPU (BENCHMARKS.md, "Full scale on a GPU", lists what
# has run there and what failed). Lessons take every size from `pick`, so one notebook
# serves both:

# %%
from course_lib import pick

n_episodes = pick(cpu=200, full=5_000)
print(f"at scale {current_scale()!r} this cell would train for {n_episodes} episodes")

# %% [markdown]
# `course doctor` checks Python, the libraries at their pinned versions, the devices, the
# memory, writable folders and the notebook kernel. A FAIL stops the course; a WARN says
# what it costs (without Ray, only lesson 12). Below is its one-line summary; for the full
# report, run `course doctor` in a terminal.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.course.doctor import doctor, in_kernel, one_line

results = doctor(print_report=False, no_kernel=not in_kernel())
print(one_line(results))
failed = [r.name for r in results if r.status == "FAIL"]
assert not failed, f"fix these before going on (`course doctor` in a terminal says how): {failed}"

# %% [markdown]
# ## 4. The return, with episode ends
#
# An agent acts at steps $t = 0, 1, \dots, T-1$ and receives reward $r_t$ after each
# action (Sutton and Barto call this reward $R_{t+1}$; the course indexes it by the step
# whose action earned it). A rollout buffer holds several episodes back to back; $d_t = 1$
# marks the step at which an episode ended (terminated, or truncated by a time limit). The
# *discounted return* of step $t$ sums the rewards that follow it **within its own
# episode**:
#
# $$G_t = \sum_{k=t}^{e(t)} \gamma^{\,k-t}\, r_k \qquad (00.1)$$
#
# where $e(t)$ is the last step of $t$'s episode. Computed backwards in one pass:
#
# $$G_t = r_t + \gamma\,(1 - d_t)\,G_{t+1}, \qquad G_T = 0 . \qquad (00.2)$$
#
# | equation | function |
# |---|---|
# | (00.1), (00.2) | `course_lib.rl.pg.discounted_returns(rewards, dones, gamma, bootstrap=0.0)` |
#
# The $(1-d_t)$ factor is what stops one episode's rewards leaking into the previous
# episode's returns: forget it, and every episode boundary is silently wrong. (Most code,
# this course's included, multiplies; a product lets a diverged value cross the boundary,
# as $0 \cdot \mathrm{NaN} = \mathrm{NaN}$, where `np.where(d, 0, G)` would not.)
#
# **Where this return stops, and a value target does not.** $G_T = 0$ and $d_t = 1$ at a
# truncation give the return of the episode *as played*, which is what a learning curve
# reports. A *training target* should tell the two endings apart (CleanRL's and PureJaxRL's
# PPO treat a truncation as a termination; lesson 04 does not): after a truncation (a time
# limit) or at the end of a buffer that stops mid-episode, the next state still has a value,
# and the target bootstraps from an estimate $V$ of it instead of 0 (Pardo et al. 2018,
# "Time limits in reinforcement learning"). `discounted_returns(..., bootstrap=V)` starts
# the backward pass from $G_T = V$ (exercise 1). A truncation inside the buffer needs the
# two flags apart, per step:
#
# $$G_t = r_t + \gamma\,\big[(1 - \mathrm{term}_t)(1 - \mathrm{trunc}_t)\,G_{t+1} + \mathrm{trunc}_t\,(1 - \mathrm{term}_t)\,V(s'_t)\big],$$
#
# with $s'_t$ the state the truncated step reached; the environments' interface keeps
# `terminated` and `truncated` apart, and lesson 04's targets bootstrap this way.

# %%
import numpy as np

from course_lib.rl.pg import discounted_returns

rewards = np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
dones = np.array([0, 0, 1, 0, 0, 0, 0, 1])
gamma = 0.9
returns = discounted_returns(rewards, dones, gamma)
leaky = discounted_returns(rewards, np.zeros_like(dones), gamma)
print("returns           ", np.round(returns, 3))
print("ignoring episodes ", np.round(leaky, 3))
ends = np.flatnonzero(dones)
assert np.all(returns[ends] == rewards[ends])  # an episode's last step: nothing may follow it
starts = np.r_[0, ends[:-1] + 1]
for s0, e in zip(starts, ends, strict=True):  # ignoring d_t adds the next episode's return, discounted
    leaked = 0.0 if e + 1 == len(rewards) else leaky[e + 1]
    t = np.arange(s0, e + 1)
    assert np.allclose(leaky[t] - returns[t], gamma ** (e + 1 - t) * leaked)

# %%
fig, ax = plt.subplots(figsize=(8, 3.2))
steps = np.arange(len(rewards))
ax.bar(steps, rewards, color="#cccccc", label="reward $r_t$")
ax.plot(steps, returns, "o-", label=r"return $G_t$ (episodes respected)")
ax.plot(steps, leaky, "x--", label=r"return ignoring $d_t$ (wrong)")
for t in np.flatnonzero(dones):
    ax.axvline(t + 0.5, color="k", lw=0.8, ls=":")
ax.set_xlabel("step t (dotted line: episode ends after this step)")
ax.set_ylabel("reward / return (reward units)")
ax.set_title(f"Discounted returns with episode ends, gamma = {gamma}")
ax.legend(fontsize=8, loc="upper right")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** returns restart at every episode boundary; ignoring $d_t$ adds everything
# after the episode's last step $e$ (the wrong return from step $e+1$ on, which runs through
# every later episode), discounted by $\gamma^{e+1-t}$, to every step $t$ of that episode.

# %% [markdown]
# **The episode return.** $G_t$ is what a learner trains on; what a learning curve plots
# is simpler: the undiscounted sum of one whole episode's rewards, one number per
# episode (CleanRL logs it as `charts/episodic_return`). For the $j$-th episode that ends
# in the buffer, from its first step $s_j$ to its last step $e_j$ ($d_{e_j} = 1$):
#
# $$R_j = \sum_{t=s_j}^{e_j} r_t = G_{s_j}\big|_{\gamma = 1} . \qquad (00.3)$$
#
# An episode still running after the buffer's last step has no return yet: it is left
# out here. A logger that keeps a running sum per environment across buffers (gymnasium's
# `RecordEpisodeStatistics`, which CleanRL uses) reports it whole when it ends.
#
# | equation | function |
# |---|---|
# | (00.3) | `course_lib.rl.pg.finished_episode_returns(rewards, dones)` |

# %%
from course_lib.rl.pg import finished_episode_returns

buffer_rewards = np.array([1.0, 1.0, 1.0, 0.0, 2.0, 2.0, 1.0, 1.0])
buffer_dones = np.array([0, 0, 1, 0, 0, 1, 0, 0])  # two episodes end; steps 6-7 are still running
ep_returns = finished_episode_returns(buffer_rewards, buffer_dones)
undiscounted = discounted_returns(buffer_rewards, buffer_dones, gamma=1.0)
print("episode returns R_j      ", ep_returns)
print("G_t with gamma = 1       ", undiscounted)
assert ep_returns.tolist() == [3.0, 4.0]  # steps 0-2 and 3-5; steps 6-7 have no return yet
assert ep_returns.tolist() == undiscounted[[0, 3]].tolist()  # R_j = G at each episode's first step

# %% [markdown]
# **Takeaway:** two episodes ended, so there are two returns (3 and 4, in time order),
# each equal to $G$ at the episode's first step with $\gamma = 1$; the two rewards of the
# unfinished third episode are not reported yet.

# %% [markdown]
# ## 5. Exercises and grading
#
# Each lesson's exercises live in `exercises/NN_topic.ipynb`, worked solutions in
# `solutions/NN_topic.ipynb`. An exercise gives a function signature, its docstring, a time
# estimate and hints in tiers; the body raises `NotImplementedError("not implemented yet")`
# until you write it. The *check yourself* cell below it runs the grader's checks and
# prints PASS or the first thing that is wrong. The checks compare your function with an
# independent implementation of the equation, hand-computed values and properties, never
# with the solution's code. The grader refuses a function that imports, calls or wraps
# `course_lib`'s own implementation (a check of your work, not a sandbox).
#
# To grade a whole notebook, run `course grade exercises/00_welcome.ipynb` in a terminal; it
# exits 0 when the score reaches the pass mark. Below it grades a fresh copy of the
# exercise notebook, as you first get it (two exercises, 10 points each):

# %%
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from course_lib.course.paths import repo_root
from course_lib.course.reset import stub_notebook

if in_kernel():  # grading runs the notebook in a Jupyter kernel
    with tempfile.TemporaryDirectory() as tmp:
        stub = Path(tmp) / "00_welcome.ipynb"
        nbformat.write(stub_notebook("00_welcome", repo_root()), stub)
        cmd = [sys.executable, "-m", "course_lib", "grade", str(stub)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    lines = [line.strip() for line in done.stdout.splitlines()]
    failing = next((line for line in lines if line.startswith("discounted_returns: ")), done.stdout[-300:])
    total = next((line for line in lines if line.startswith("total: ")), done.stderr[-300:])
    print(failing)
    print(total)
    assert done.returncode != 0 and failing.endswith("not implemented yet")
    assert total.startswith("total: 0/20 points (0%)")
else:
    print("no Jupyter kernel here (course run --no-kernel): grading skipped")

# %% [markdown]
# Now open `exercises/00_welcome.ipynb`, implement `discounted_returns` (eq. 00.1-00.2,
# with the bootstrap value above) and `finished_episode_returns` (eq. 00.3), run each
# check cell, then grade the notebook (`course reset`, section 3, restores a stub).
#
# ## Glossary
#
# | term | meaning |
# |---|---|
# | step $t$ | one action and the reward $r_t$ that follows it |
# | episode end $d_t$ | 1 where the episode terminated or was truncated at step $t$ |
# | discount $\gamma$ | weight of a reward one step later, in $[0, 1]$ |
# | return $G_t$ | discounted sum of the rewards from $t$ to the end of $t$'s episode |
# | bootstrap $V$ | an estimate of the value of the state after a buffer's last step (or after a truncation), where the episode goes on |
# | episode return $R_j$ | undiscounted sum of one whole episode's rewards; what learning curves plot |
# | scale | `cpu` (default, the stored outputs) or `full` (sized for one GPU), from `COURSE_SCALE` |
# | actor, learner | the processes that play the policy and write the buffer, and the one that updates the weights from it |
# | lag | how many learner updates old the weights an actor played with are |
#
# ## References
#
# - R. S. Sutton and A. G. Barto, *Reinforcement Learning: An Introduction*, 2nd ed., 2018,
#   sections 3.3-3.4 (returns and episodes; eqs. 3.9 and 3.11).
# - F. Pardo, A. Tavakoli, V. Levdik, P. Kormushev, "Time limits in reinforcement
#   learning", ICML 2018 (bootstrapping at time-limit truncations).
# - S. Huang et al., "CleanRL: high-quality single-file implementations of deep
#   reinforcement learning algorithms", JMLR 2022 (`charts/episodic_return`).
#
# **Next:** lesson 01, `lessons/01_policy_gradients.ipynb`: the policy-gradient estimator,
# which weights each action's log-probability by the return $G_t$ of this lesson, minus a
# baseline.
