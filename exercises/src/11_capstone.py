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
# # Exercises 11 · Capstone: a multi-device asynchronous RL run
#
# This notebook is generated from `exercises/src/11_capstone.py`; the worked solutions
# are in `solutions/11_capstone.ipynb`. Write the function bodies where they raise
# `NotImplementedError`, run the *check yourself* cell under each one, and when all pass
# grade the notebook from a terminal:
#
# ```
# course grade exercises/11_capstone.ipynb
# ```
#
# The equations are numbered as in `lessons/11_capstone.ipynb`. The capstone job
# (`course_lib/capstone/`, run by `course capstone`) is one script that torchrun starts
# on every rank. Three small decisions hold it together, and each is a pure function you
# can write and test without a cluster: which rank does what, when a generator may take
# new weights and start a new group, and, after a crash and a restore, which generated
# samples count.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `assign_roles`: a rank's role and its process groups | 10 | ★☆☆ | 10 min |
# | 2. `sync_and_admit`: the weight-version handshake | 15 | ★★☆ | 20 min |
# | 3. `restart_accounting`: which samples count after a restore | 20 | ★★☆ | 25 min |

# %%
import random

from course_lib import check

# %% [markdown]
# ## Exercise 1 · A rank's role and its process groups (★☆☆, 10 min, 10 points)
#
# torchrun starts `world_size` identical processes and tells each its `rank`. The job
# splits them: the first `n_trainers` ranks train (data parallel), every other rank
# generates.
#
# ```
# rank:    0          1 .. T-1        T .. W-1
# role:    trainer 0  trainers        generators
# groups:  |----- trainer group ----|               gradients (all-reduce)
#          |-- sync group --|       |----------|    weights (broadcast from rank 0)
# ```
#
# Write `assign_roles(rank, world_size, n_trainers)` returning a dict:
#
# - `"role"`: `"trainer"` or `"generator"`;
# - `"index"`: the rank's position **within its role**, counted from 0 (trainer `i` is rank
#   `i`; the first generator, rank `T`, is generator 0);
# - `"trainer_group"`: the ranks of the trainer group, ascending;
# - `"sync_group"`: the ranks of the weight-sync group, ascending: trainer 0 (the source of
#   every weight update) and every generator, never the other trainers (they would wait
#   on a transfer they take no part in).
#
# Every rank must return the **same** group lists: `torch.distributed.new_group` is called
# by all ranks with identical lists, or it hangs. Raise `ValueError` when the layout is
# impossible: fewer than one trainer, no generator left (`n_trainers >= world_size`), or a
# rank outside `0 .. world_size - 1`.
#
# **How it is graded:** hand-made layouts (4 ranks with 2 trainers, 2 ranks, 8 ranks with
# 3 trainers), every layout of up to 10 ranks against an oracle that hands the ranks out
# one by one, the properties every rank relies on (each index once, the same groups on
# every rank, trainer 0 the only rank in both groups), and `ValueError` on impossible
# layouts. An off-by-one at the trainer/generator boundary, generators counted from the
# wrong end or by their global rank, a sync group without trainer 0 or with every trainer,
# and missing validation are named in the message.
#
# (At full size: `course_lib.capstone.roles.assign_roles`, which also routes each group to
# a trainer.)
#
# <details><summary>Hint 1</summary>
# Check the three impossible cases first; then one comparison, <code>rank &lt; n_trainers</code>,
# decides the role.
# </details>
# <details><summary>Hint 2</summary>
# A generator's index is its distance from the first generator: <code>rank - n_trainers</code>.
# </details>
# <details><summary>Hint 3</summary>
# <code>list(range(n_trainers))</code> and <code>[0] + list(range(n_trainers, world_size))</code>
# do not depend on <code>rank</code>: that is what makes them the same on every rank.
# </details>


# %% tags=["exercise"]
def assign_roles(rank, world_size, n_trainers):
    """The role of ``rank`` when ranks 0 .. n_trainers-1 train and the rest generate.

    Returns:
        {"role": "trainer" | "generator", "index": int, "trainer_group": [ranks],
         "sync_group": [ranks]}.

    Raises:
        ValueError: no trainer, no generator, or a rank outside the world.
    """
    ### BEGIN SOLUTION
    if n_trainers < 1:
        raise ValueError(f"the job needs at least one trainer, got n_trainers={n_trainers}")
    if n_trainers >= world_size:
        raise ValueError(f"{n_trainers} trainers leave no generator in a world of {world_size} ranks")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the world of {world_size} ranks (0 .. {world_size - 1})")
    if rank < n_trainers:
        role, index = "trainer", rank
    else:
        role, index = "generator", rank - n_trainers
    trainer_group = list(range(n_trainers))
    sync_group = [0] + list(range(n_trainers, world_size))  # the source, then every generator
    return {"role": role, "index": index, "trainer_group": trainer_group, "sync_group": sync_group}
    ### END SOLUTION


# %% tags=["raises-in-stub"]
for rank in range(5):
    print(rank, assign_roles(rank, 5, 2))

# %% tags=["exercise-check"]
check("11_capstone", "assign_roles", assign_roles)

# %% [markdown]
# ## Exercise 2 · The weight-version handshake (★★☆, 20 min, 15 points)
#
# Trainer 0 publishes version `v` (the weights after `v` updates) in three moves, in this
# order: it **announces** `v` in the rendezvous store, **sends** the weights, and only then
# raises **`consumed`** to `v * B` (the groups its `v` updates trained on; `B` groups an
# update). A generator, between two decoding steps, reads `announced` and `consumed`
# together (one consistent snapshot) and decides two things:
#
# 1. **Pull?** If `announced` is newer than the version it holds, it loads that version
#    before the next decoding step (the in-flight update: the KV cache is kept). It never
#    goes back to an older one: with the shared-buffer channel a generator reads whatever
#    the buffer holds, which can be newer than the announcement it saw.
# 2. **Start group `k`?** Groups are numbered `k = 0, 1, ...` as they start, and update `u`
#    trains on `k = uB .. (u+1)B - 1`. Group `k` may start only with weights in hand
#    (version `-1` means none yet) and under the backpressure bound
#
# $$k < \mathrm{consumed} + (\mathrm{max\_lag} + 1)\, B$$
#
# Why that bound gives the lag guarantee: a snapshot that shows `consumed = vB` also shows
# `announced >= v` (the trainer raised `consumed` last), so after step 1 the generator holds
# a version `>= v`; group `k < (v + max_lag + 1) B` is trained on by update `floor(k / B) <=
# v + max_lag`, so none of its tokens is more than `max_lag` updates stale. With `max_lag =
# 0` this is synchronous RL (the lag bound, eq. 11.2).
#
# Write `sync_and_admit(announced, consumed, version, k, max_lag, B)` returning `(version
# after this step's pull, may_start)`, an int and a bool. Raise `ValueError` if `max_lag <
# 0` or `B < 1`.
#
# **How it is graded:** hand-made snapshots, every combination of small values against an
# oracle that writes the bound as a lag (`floor(k / B) - consumed / B <= max_lag`), a
# simulated run (a trainer publishing in the right order, two generators, both channels,
# random interleavings) in which no group may lag more than `max_lag` updates, no
# generator may go back a version and the run must finish, and `ValueError` on bad
# arguments. Pulling an older version, never pulling, an off-by-one in the bound either
# way, starting without weights and missing validation are named in the message.
#
# (At full size: `course_lib.capstone.generator.Generator.run`, with
# `course_lib.staleness.may_start_group`.)
#
# <details><summary>Hint 1</summary>
# Two independent decisions: first the version (compare <code>announced</code> with
# <code>version</code>), then admission, using the version you will hold after the pull.
# </details>
# <details><summary>Hint 2</summary>
# With <code>max_lag = 0</code> and <code>B = 4</code>, after one update (<code>consumed = 4</code>)
# groups 4..7 may start and group 8 may not: it would be trained on by update 2, two
# versions after the one the generator holds.
# </details>
# <details><summary>Hint 3</summary>
# <code>if announced &gt; version: version = announced</code>; then
# <code>version &gt;= 0 and k &lt; consumed + (max_lag + 1) * B</code>.
# </details>


# %% tags=["exercise"]
def sync_and_admit(announced, consumed, version, k, max_lag, B):
    """One generator step's handshake: the version to hold, and whether group ``k`` may start.

    Args:
        announced: the newest version trainer 0 announced (-1: none yet).
        consumed: the groups the trainer has consumed (a multiple of B).
        version: the version this generator holds (-1: no weights yet).
        k: the group this generator would start next.
        max_lag: the most updates a token may lag (>= 0).
        B: groups per update (>= 1).

    Returns:
        (version after the pull, may_start).
    """
    ### BEGIN SOLUTION
    if max_lag < 0 or B < 1:
        raise ValueError(f"need max_lag >= 0 and B >= 1, got max_lag={max_lag}, B={B}")
    if announced > version:  # newer weights: load them before the next decoding step
        version = announced
    may_start = version >= 0 and k < consumed + (max_lag + 1) * B
    return version, may_start
    ### END SOLUTION


# %% tags=["raises-in-stub"]
B, max_lag = 4, 1
print("fresh generator, nothing announced:", sync_and_admit(-1, 0, -1, 0, max_lag, B))
print("version 0 announced:              ", sync_and_admit(0, 0, -1, 0, max_lag, B))
print("group 7 after no update:          ", sync_and_admit(0, 0, 0, 7, max_lag, B))
print("group 8 after no update:          ", sync_and_admit(0, 0, 0, 8, max_lag, B))
print("group 8 after one update:         ", sync_and_admit(1, 4, 0, 8, max_lag, B))
print("holding 3, the store says 2:      ", sync_and_admit(2, 8, 3, 12, max_lag, B))

# %% tags=["exercise-check"]
check("11_capstone", "sync_and_admit", sync_and_admit)

# %% [markdown]
# ## Exercise 3 · Which samples count after a restore (★★☆, 25 min, 20 points)
#
# A run may die and be restarted from its newest complete checkpoint; each start is an
# **attempt** (0, 1, ...). Every generator writes a line `(attempt, k, samples)` for each
# group it generates, so the same group number `k` can appear once per attempt. Attempt
# `a` resumed from the checkpoint of step `resumed_from[a]` (`resumed_from[0] == 0`, a
# fresh start): the updates before that step survive as the checkpoint recorded them, and
# every update from that step on was done again by attempt `a`, on groups it generated
# again. The run ended after `final_step` updates, during the last attempt.
#
# Classify every line:
#
# - **consumed**: group `k` was trained on by update `floor(k / B) < final_step` of the
#   final run, and this line is the copy that update used (the one of the attempt that did
#   that update);
# - **leftover**: the last attempt generated it beyond the last update (`k >= final_step *
#   B`), still in flight at the end;
# - **discarded**: everything else, the groups whose update was lost with its attempt or
#   never happened.
#
# Write `restart_accounting(generated, resumed_from, final_step, B)`. `generated` is a
# list of `(attempt, k, samples)` tuples in any order (each `(attempt, k)` once; read
# `samples` from the line). Return a dict with `"consumed"`, `"discarded"` and
# `"leftover"`, each a sorted list of `(attempt, k)` tuples, and `"samples"`, a dict of the
# sample totals `"generated"`, `"consumed"`, `"discarded"` and `"leftover"`. The audit
# `generated == consumed + discarded + leftover` (eq. 11.6) must hold, and each `k < final_step * B`
# must be consumed exactly once. Do not modify `generated`.
#
# A worked example with `B = 2`: attempt 0 wrote a checkpoint at step 3, did updates 3 and
# 4, and died with groups up to `k = 11` generated; attempt 1 resumed from step 3,
# generated `k = 6 .. 13` and ended after update 5 (`final_step = 6`). Consumed: attempt
# 0's `k = 0 .. 5` and attempt 1's `k = 6 .. 11`; discarded: attempt 0's `k = 6 .. 11`
# (updates 3 and 4 were lost with it); leftover: attempt 1's `k = 12, 13`.
#
# **How it is graded:** the worked example, then runs simulated attempt by attempt
# (checkpoints written every few updates, a corrupt newest checkpoint sometimes skipped,
# so an attempt may resume from an older step than the one before it) whose true history
# the grader knows, lines shuffled; the audit identity and the inputs left unchanged.
# Keeping groups generated after the checkpoint (counting a group twice), keeping the
# older attempt's copy, an off-by-one at the step boundary or at the last update, an
# earlier attempt's late groups counted as leftover, and totals in groups instead of
# samples are named in the message.
#
# (At full size: `course_lib.capstone.ledger`: `SampleLedger.resume` and `audit`.)
#
# <details><summary>Hint 1</summary>
# Update <code>u</code> of the final run was done by the <b>last</b> attempt that resumed at or
# before it: <code>max(a for a, s in enumerate(resumed_from) if s &lt;= u)</code>.
# </details>
# <details><summary>Hint 2</summary>
# For each line, <code>u = k // B</code>: if <code>u &gt;= final_step</code> the line is leftover (last
# attempt) or discarded (any other); otherwise it is consumed exactly when its attempt is
# the one that did update <code>u</code>.
# </details>
# <details><summary>Hint 3</summary>
# Collect <code>(attempt, k)</code> into three lists and add <code>samples</code> to the line's
# total and to <code>"generated"</code>; sort the lists at the end.
# </details>


# %% tags=["exercise"]
def restart_accounting(generated, resumed_from, final_step, B):
    """Classify every generated group of a run that was restored (see the statement).

    Args:
        generated: [(attempt, k, samples)], any order, each (attempt, k) once.
        resumed_from: resumed_from[a] = the step attempt a resumed from (resumed_from[0] == 0).
        final_step: updates done when the run ended (in the last attempt).
        B: groups per update.

    Returns:
        {"consumed": [(attempt, k)], "discarded": [...], "leftover": [...],
         "samples": {"generated": int, "consumed": int, "discarded": int, "leftover": int}}.
    """
    ### BEGIN SOLUTION
    last = len(resumed_from) - 1
    groups = {"consumed": [], "discarded": [], "leftover": []}
    samples = {"generated": 0, "consumed": 0, "discarded": 0, "leftover": 0}
    for attempt, k, n in generated:
        update = k // B
        if update >= final_step:  # beyond the last update: in flight at the end
            kind = "leftover" if attempt == last else "discarded"
        else:
            owner = 0  # who did this update: the last attempt that resumed at or before it
            for a, step in enumerate(resumed_from):
                if step <= update:
                    owner = a
            kind = "consumed" if attempt == owner else "discarded"
        groups[kind].append((attempt, k))
        samples[kind] += n
        samples["generated"] += n
    return {**{kind: sorted(keys) for kind, keys in groups.items()}, "samples": samples}
    ### END SOLUTION


# %% tags=["raises-in-stub"]
B = 2
log = [(0, k, 4) for k in range(12)] + [(1, k, 4) for k in range(6, 14)]
random.Random(0).shuffle(log)
out = restart_accounting(log, [0, 3], 6, B)
for kind in ("consumed", "discarded", "leftover"):
    print(f"{kind:9s} {out[kind]}")
print("samples:", out["samples"])

# %% tags=["exercise-check"]
check("11_capstone", "restart_accounting", restart_accounting)
