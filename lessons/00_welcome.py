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
# **Efficient RL Systems** teaches how modern reinforcement-learning training systems are
# made fast, cheap and predictable: from the policy-gradient estimator, through
# actor-learner systems (IMPALA, V-trace), whole training loops compiled for the
# accelerator (PureJaxRL), to the LLM post-training machinery of pipeline RL, cluster
# layout and checkpoint-engine weight sync, and a capstone asynchronous run, first on
# torchrun (lesson 11) and then on Ray (lesson 12).
#
# Every lesson runs on a 2-core CPU in minutes; its `full` scale runs the same code at the
# sizes that show the real effect, on a GPU where the lesson uses one.
#
# **Learning goals of this lesson**
# 1. Know the map of the course and which lesson builds on which.
# 2. Run a lesson, at either scale, and know what the committed outputs promise.
# 3. Check your machine with `course doctor`.
# 4. Meet the return $G_t$ with episode ends, the quantity every later lesson estimates,
#    and the episode return $R_j$ that every learning curve plots.
# 5. Do two short graded exercises end to end: edit, self-check, `course grade`.

# %% [markdown]
# The first cell imports the course library. If it fails, run `make lab` from the
# course folder (it creates `.venv` and installs everything) and pick that kernel.

# %%
import course_lib
from course_lib import current_scale

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## 1. The course map
#
# Each lesson from 01 on has learning goals, key equations, pseudocode, an *equation →
# function* table, runnable demos backed by the tested library `course_lib`, plots, at
# least one measured result, a glossary of the metrics it logs, references, and graded
# exercises.
# Later lessons import `course_lib`'s reference implementations, never your exercise
# code, so being stuck on one exercise never blocks the next lesson.

# %%
from course_lib.course.catalog import LESSONS

for lesson in LESSONS:
    needs = ", ".join(f"{r:02d}" for r in lesson.requires) or "-"
    print(f"{lesson.id:<22} needs {needs:<17} {lesson.title}")

# %%
import matplotlib.pyplot as plt

from course_lib.course.plots import course_map

fig = course_map()
plt.show()

# %% [markdown]
# Solid boxes are lessons whose notebook is in your checkout (a planned one would be
# dashed). A dotted arrow skips a column: it is drawn across the boxes it passes, and
# links only its two ends (the table above lists every prerequisite).
#
# **Takeaway:** the foundations (01-02) lead to IMPALA (03), off-policy correction in an
# actor-learner system, which both later tracks need: whole loops on the accelerator
# (04-06) and LLM RL systems (07-10); the capstone (11 on torchrun, 12 the same run on Ray)
# draws on both.

# %% [markdown]
# ## 2. Running a lesson, and the two scales
#
# | what | command |
# |---|---|
# | open the course in JupyterLab | `make lab` |
# | run every test (unit, grader, notebook sync, nbval on every notebook; about 40 min on 2 cores) | `make test` |
# | execute lessons headless with a timing table | `course run 01 02` |
# | the same at the full scale (sized for a GPU) | `course run 04 --scale full` |
# | check this machine; `--time` also times lesson 00 against the reference machine | `course doctor` |
# | put an exercise notebook, or one exercise, back to its stub (a backup is kept) | `course reset exercises/00_welcome.ipynb --exercise 1` |
#
# `course` is `.venv/bin/course` in the course folder (or plain `course` once the
# virtual environment is activated: `source .venv/bin/activate`).
#
# The run contract, read in one place (`course_lib.course.scale`):
#
# - `COURSE_SCALE=cpu` (default): the sizes of the committed outputs, which CI re-checks
#   with nbval. Every notebook is sized to finish within 150 s on an idle 2-core CPU
#   (`BENCHMARKS.md`, "Notebook execution time": each under 150 s there); it takes several
#   times longer when other work loads the machine.
# - `COURSE_SCALE=full`: the sizes that show the real effect. `BENCHMARKS.md`, "Full scale
#   on a GPU", records the lessons run at that scale so far (03, 04, 06, 07, 09, 11), with
#   their figures and what failed; the others have not been run there yet.
#
# Lessons take every size from `pick`, so one notebook serves both scales:

# %%
from course_lib import pick

n_episodes = pick(cpu=200, full=5_000)
print(f"at scale {current_scale()!r} this cell would train for {n_episodes} episodes")

# %% [markdown]
# Every random thing is seeded and printed numbers are rounded to what is stable, so a
# re-run reproduces the committed outputs. Cells whose output honestly varies (timings,
# process interleavings, your machine's versions) carry `# NBVAL_IGNORE_OUTPUT` and are
# followed by an `assert` of the claim they show, so the claim is still checked.

# %% [markdown]
# ## 3. Check your machine
#
# `course doctor` (or `python -m course_lib doctor` in a terminal) prints one
# PASS/WARN/FAIL line per check and a block to paste into an issue. A FAIL stops the
# course; a WARN names what it costs: without Ray only lesson 12 is affected; without a
# network namespace lessons 00-11 run, but `make test` stops before its first test (it runs
# Ray's tests inside one). Workshop instructors: ask everyone to run it the day before.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.course.doctor import doctor

results = doctor()

# %%
failed = [r.name for r in results if r.status == "FAIL"]
assert not failed, f"fix these before going on: {failed}"
print(f"doctor ran {len(results)} checks; none failed")

# %% [markdown]
# ## 4. The return, with episode ends
#
# An agent acts at steps $t = 0, 1, \dots, T-1$ and receives reward $r_t$ after each
# action. A rollout buffer holds several episodes back to back; $d_t = 1$ marks the step
# at which an episode ended (terminated, or truncated by a time limit). The *discounted return* of step
# $t$ sums the rewards that follow it **within its own episode**:
#
# $$G_t = \sum_{k=t}^{e(t)} \gamma^{\,k-t}\, r_k \qquad (00.1)$$
#
# where $e(t)$ is the last step of $t$'s episode. Computed backwards in one pass:
#
# $$G_t = r_t + \gamma\,(1 - d_t)\,G_{t+1}, \qquad G_T = 0 . \qquad (00.2)$$
#
# **Pseudocode**
# ```
# G_T = 0
# for t = T-1 down to 0:
#     G_t from r_t, d_t and G_{t+1} by (00.2)
# ```
#
# | equation | function |
# |---|---|
# | (00.1), (00.2) | `course_lib.rl.pg.discounted_returns(rewards, dones, gamma, bootstrap=0.0)` |
#
# The $(1-d_t)$ factor is what stops one episode's rewards leaking into the previous
# episode's returns: forget it, and every episode boundary is silently wrong.
#
# **Where this return stops, and a value target does not.** $G_T = 0$ and $d_t = 1$ at a
# truncation give the return of the episode *as played*, which is what a learning curve
# reports. A *training target* must tell the two endings apart: after a truncation (a time
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
# every later episode), discounted by $\gamma^{e+1-t}$, to every step $t$ of that episode
# (here it inflates them, what follows being positive; negative rewards would deflate them).

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
# `RecordEpisodeStatistics` wrapper, which CleanRL uses) reports it whole when it ends; this function alone,
# called on the next buffer, would report only that buffer's part of it.
#
# | equation | function |
# |---|---|
# | (00.3) | `course_lib.rl.pg.finished_episode_returns(rewards, dones)` |

# %%
from course_lib.rl.pg import finished_episode_returns

buffer_rewards = np.array([1.0, 1.0, 1.0, 0.0, 2.0, 1.0, 1.0, 1.0])
buffer_dones = np.array([0, 0, 1, 0, 0, 1, 0, 0])  # two episodes end; steps 6-7 are still running
ep_returns = finished_episode_returns(buffer_rewards, buffer_dones)
undiscounted = discounted_returns(buffer_rewards, buffer_dones, gamma=1.0)
print("episode returns R_j      ", ep_returns)
print("G_t with gamma = 1       ", undiscounted)
assert ep_returns.tolist() == [3.0, 3.0]  # steps 0-2 and 3-5; steps 6-7 have no return yet
assert ep_returns.tolist() == undiscounted[[0, 3]].tolist()  # R_j = G at each episode's first step

# %% [markdown]
# **Takeaway:** two episodes ended, so there are two returns (3 and 3), each equal to
# $G$ at the episode's first step with $\gamma = 1$; the two rewards of the unfinished
# third episode are not reported yet.

# %% [markdown]
# ## 5. Exercises and grading
#
# Each lesson's exercises live in `exercises/NN_topic.ipynb`, worked solutions in
# `solutions/NN_topic.ipynb`; both are generated from one source, so they never drift.
# An exercise gives a function signature, its docstring, a difficulty and time estimate
# and tiered hints; the body raises `NotImplementedError("not implemented yet")` until
# you write it. Below each exercise a *check yourself* cell runs the same checks the
# grader runs and prints PASS or the first thing that is wrong.
#
# The checks compare your function with an independent naive implementation that mirrors
# the equation, with hand-computed values, and with properties (for example: with
# $\gamma = 0$ the returns are the rewards), never with the solution's code.
#
# To grade a whole notebook, in a terminal:
#
# ```
# course grade exercises/00_welcome.ipynb                 # table in the terminal
# course grade exercises/*.ipynb --json report.json --junit report.xml
# ```
#
# The grader runs your notebook in a separate kernel with a time limit per cell and per
# check, so an infinite loop or a crash in your code gives a clear message instead of a
# hang. It exits 0 when the score reaches the pass mark. In your fork on GitHub, the
# workflow `.github/workflows/grade.yml` grades every exercise notebook on every push, so it
# stays red until all of them reach the pass mark. Every exercise refuses an answer that
# hands the work to `course_lib`'s own implementation (an import, a wrapper, a computed
# module name): the grader
# reads your function before the checks and watches the calls it makes into `course_lib`
# while they run (a guard, not a sandbox).
#
# Here the grader is run on lesson 00's solution notebook and on the untouched exercise
# notebook (two exercises, 10 points each):

# %%
# NBVAL_IGNORE_OUTPUT
import subprocess
import sys


def grade(path: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "course_lib", "grade", path]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(done.stdout)
    return done


solved = grade("../solutions/00_welcome.ipynb")
untouched = grade("../exercises/00_welcome.ipynb")

# %%
assert solved.returncode == 0, "the solution notebook must reach the pass mark"
assert "total: 20/20 points (100%)" in solved.stdout
assert untouched.returncode != 0 and "not implemented yet" in untouched.stdout
assert "total: 0/20 points (0%)" in untouched.stdout
print("solutions pass with 20/20 points; untouched exercises score 0/20, failing with 'not implemented yet'")

# %% [markdown]
# Now open `exercises/00_welcome.ipynb`, implement `discounted_returns` (eq. 00.1-00.2,
# with the bootstrap value above) and `finished_episode_returns` (eq. 00.3), run each
# check cell, then grade the notebook. Broke it? `course reset exercises/00_welcome.ipynb
# --exercise 1` puts exercise 1 back to its stub and keeps your other answers.
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
# | scale | `cpu` (default, CI-verified outputs) or `full` (GPU sizes), from `COURSE_SCALE` |
# | pass mark | fraction of an exercise notebook's points that `course grade` needs to exit 0 |
#
# ## References
#
# - R. S. Sutton and A. G. Barto, *Reinforcement Learning: An Introduction*, 2nd ed., 2018,
#   section 3.3 (returns and episodes; eq. 3.8).
# - F. Pardo, A. Tavakoli, V. Levdik, P. Kormushev, "Time limits in reinforcement
#   learning", ICML 2018 (bootstrapping at time-limit truncations).
# - S. Huang et al., "CleanRL: high-quality single-file implementations of deep
#   reinforcement learning algorithms", JMLR 2022 (`charts/episodic_return`).
