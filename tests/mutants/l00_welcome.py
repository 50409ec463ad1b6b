"""Planted bugs for lesson 00 (`exercises/src/00_welcome.py`), as one-place edits.

Each `Mutant` is the real solution cell of `function` with `old` replaced by `new` (see
`tests/conftest.py`), and `expected` a fragment the grader's message must contain.
`tests/test_exercises.py` checks that every one is caught with that message. The
whole-function wrong answers `discounted_returns_*.py` beside this file are graded
through a real kernel by `tests/test_grading.py` and `tests/test_grading_kernel.py`.
"""

from __future__ import annotations

from conftest import Mutant

# ---------------------------------------------------------------------------------------
# Exercise 1 · discounted_returns
# ---------------------------------------------------------------------------------------

DISCOUNTED_RETURNS = [
    # the backward pass starts from 0 whatever the value after the buffer
    Mutant(
        "discounted_returns",
        "ignores_bootstrap",
        old="running = float(bootstrap)  # G_T",
        new="running = 0.0",
        expected="bootstrap=4.0",
    ),
    # the carried return is never cut at an episode end
    Mutant(
        "discounted_returns",
        "ignores_dones",
        old="gamma * (1.0 - dones[t]) * running",
        new="gamma * running",
        expected="got 3.439, expected 1.9",
    ),
    # cuts at the step after the end (dones[t - 1]): the end step keeps the next episode's return
    Mutant(
        "discounted_returns",
        "cuts_one_step_late",
        old="gamma * (1.0 - dones[t]) * running",
        new="gamma * (1.0 - dones[t - 1]) * running",
        expected="got 2.71, expected 1.9",
    ),
    # bootstraps at every episode end (misreading "a truncation keeps its bootstrap"): a
    # truncation inside the buffer takes V, the value after the buffer, instead of cutting to 0
    Mutant(
        "discounted_returns",
        "bootstraps_at_every_end",
        old="gamma * (1.0 - dones[t]) * running",
        new="gamma * (bootstrap if dones[t] else running)",
        expected="the truncation at step 1 ends its episode inside the buffer",
    ),
    # walks forwards: each step gets the discounted past instead of the future
    Mutant(
        "discounted_returns",
        "walks_forwards",
        old="for t in reversed(range(len(rewards))):",
        new="for t in range(len(rewards)):",
        expected="hand-computed values, one episode cut off after the last step",
    ),
    # keeps integer inputs as integers: the returns are truncated
    Mutant(
        "discounted_returns",
        "integer_dtype",
        old="rewards = np.asarray(rewards, dtype=np.float64)",
        new="rewards = np.asarray(rewards)",
        expected="has dtype int64; expected a float array",
    ),
    # wrong mechanism (issue 45): writes into one module-level buffer it reuses across calls
    # (to save an allocation), so the array it returned before changes under the caller
    Mutant(
        "discounted_returns",
        "reused_buffer",
        old="    out = np.zeros_like(rewards)",
        new="""\
    global _BUFFER
    if "_BUFFER" not in globals() or _BUFFER.size < len(rewards):
        _BUFFER = np.zeros(max(len(rewards), 1024))
    out = _BUFFER[: len(rewards)]""",
        expected="return a new array from each call",
    ),
]

# ---------------------------------------------------------------------------------------
# Exercise 2 · finished_episode_returns
# ---------------------------------------------------------------------------------------

FINISHED_EPISODE_RETURNS = [
    # the running sum is never restarted: each "return" is everything so far
    Mutant(
        "finished_episode_returns",
        "no_restart",
        old="            out.append(running)\n            running = 0.0",
        new="            out.append(running)",
        expected="the running sum was not restarted at 0",
    ),
    # restarts before adding the end step's reward: it lands in the next episode
    Mutant(
        "finished_episode_returns",
        "end_reward_in_next_episode",
        old="        running += rewards[t]\n        if dones[t]:\n            out.append(running)\n            running = 0.0",
        new="        if dones[t]:\n            out.append(running)\n            running = 0.0\n        running += rewards[t]",
        expected="the reward of the step that ends an episode belongs to that episode",
    ),
    # also returns the unfinished episode at the end of the buffer
    Mutant(
        "finished_episode_returns",
        "keeps_unfinished",
        old="return np.array(out, dtype=np.float64)",
        new="return np.array(out + [running] if running else out, dtype=np.float64)",
        expected="the episode still running after the last step has no return yet",
    ),
    # returns the Python list
    Mutant(
        "finished_episode_returns",
        "returns_list",
        old="return np.array(out, dtype=np.float64)",
        new="return out",
        expected="numpy array",
    ),
    # one value per step: the running sum at every step
    Mutant(
        "finished_episode_returns",
        "one_per_step",
        old="        if dones[t]:\n            out.append(running)\n            running = 0.0",
        new="        out.append(running)\n        if dones[t]:\n            running = 0.0",
        expected="expected one per finished episode",
    ),
    # wrong mechanism (issue 45): marks the end steps in a per-step array and keeps its non-zero
    # entries, so an episode whose rewards add up to 0 disappears (it ended all the same)
    Mutant(
        "finished_episode_returns",
        "selects_by_value",
        old="""\
    out = []
    running = 0.0
    for t in range(len(rewards)):
        running += rewards[t]
        if dones[t]:
            out.append(running)
            running = 0.0
    return np.array(out, dtype=np.float64)""",
        new="""\
    at_end = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards)):
        running += rewards[t]
        if dones[t]:
            at_end[t] = running
            running = 0.0
    return at_end[at_end != 0]""",
        expected="the episodes whose rewards add up to 0 are missing",
    ),
    # wrong mechanism (issue 45): never restarts a sum; each return is a difference of one running
    # total (np.cumsum), which carries the rounding of every reward before the episode
    Mutant(
        "finished_episode_returns",
        "cumsum_differences",
        old="""\
    out = []
    running = 0.0
    for t in range(len(rewards)):
        running += rewards[t]
        if dones[t]:
            out.append(running)
            running = 0.0
    return np.array(out, dtype=np.float64)""",
        new="""\
    ends = np.flatnonzero(np.asarray(dones, dtype=bool))
    total = np.cumsum(rewards)
    return np.diff(np.concatenate([[0.0], total[ends]]))""",
        expected="restart the sum at 0 at each episode end",
    ),
]

MUTANTS: list[Mutant] = DISCOUNTED_RETURNS + FINISHED_EPISODE_RETURNS
