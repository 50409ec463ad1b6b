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
# # Exercises 11 · Capstone: a multi-process asynchronous RL run
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
# can write and test without a cluster: which rank does what, which generated samples
# count after a crash and a restore, and how the ranks of a new start agree on their
# attempt, played against a store that still holds everything the dead attempt wrote. Two
# more exercises explain what section 8 measured: what an update of the colocated
# synchronous baseline costs (its tail), and why the runner-up layout ran faster than the
# model said (trainers that wait give their share of the cores away).
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `assign_roles`: a rank's role and its process groups | 10 | ★☆☆ | 10 min |
# | 2. `colocated_sync_update`: what a colocated synchronous update costs, the tail | 15 | ★★☆ | 20 min |
# | 3. `restart_accounting`: which samples count after a restore | 20 | ★★☆ | 25 min |
# | 4. `trainers_finish`: sharing cores, one reason the runner-up ran faster than the model said | 15 | ★★★ | 25 min |
# | 5. `join_step`: agreeing on the attempt after a restart | 20 | ★★★ | 35 min |

# %%
import itertools
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
# a trainer. Handing the work to it or to its `Roles` is refused: write the rule yourself.)


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
# ## Exercise 2 · What a colocated synchronous update costs: the tail (★★☆, 20 min, 15 points)
#
# Section 8's baseline **sync-colocated** runs synchronous RL as verl does: each of the `n`
# ranks samples its share of the batch with the current weights, then trains on it. The
# ranks meet at the gradient all-reduce, so an update lasts as long as the slowest rank's
# decoding and training together:
#
# $$t_{update} = \max_r \big(t^{decode}_r + t^{train}_r\big)$$
#
# A rank starts all its answers at once: each is fed its prompt, `P` steps, then decodes its
# answer, one token a step, so answer `i` of `L_i` tokens is **live** for `P + L_i` steps. A
# decoding step with `m` live answers costs `a_s + b_s m` seconds (lesson 08's linear engine),
# and the rank decodes until its longest answer is done (steps `0 .. P + max L - 1`), the live
# count shrinking as answers finish. That is the **tail** (08.7): slots emptying while the
# longest answer goes on, every step still paying `a_s`. The pipeline refills a freed slot at
# once, which is where its speed-up over this baseline comes from. Training a rank's share
# costs `sum_i (P + L_i) / train_steps_per_s` seconds. The **slot use** says what the tail
# wastes: the live answer-steps over the slot-steps the decoding held, pooled over the ranks,
#
# $$\text{slot use} = \frac{\sum_r \sum_{i \in r} (P + L_i)}{\sum_r n_r\,(P + \max_{i \in r} L_i)}$$
#
# with `n_r` the answers of rank `r` (1.0 when there is no answer at all).
#
# Write `colocated_sync_update(shares, prompt_steps, a_s, b_s, train_steps_per_s)`. `shares`
# holds one list per rank, its answers' lengths in tokens (each >= 1); a rank may hold none:
# it decodes and trains nothing, but still takes part in the all-reduce. Return a dict:
# `"update_s"`, `"decode_s"` and `"train_s"` (lists, one value per rank) and `"slot_use"`.
# Raise `ValueError`, with a message naming the argument, on an empty `shares`, a length < 1,
# `prompt_steps < 0`, `a_s < 0` or `b_s < 0`, and `train_steps_per_s <= 0`.
#
# A worked example: 2 ranks, `P = 3`, `a_s = 0.01` s, `b_s = 0.001` s, 100 steps trained per
# second. Rank 0 holds answers of 1 and 9 tokens (live 4 and 12 steps), rank 1 two answers of
# 3 tokens (6 steps each). Rank 0 decodes 12 steps, 4 with two answers and 8 with one: 4 x
# 0.012 + 8 x 0.011 = 0.136 s, then trains 16 steps, 0.16 s: 0.296 s. Rank 1 decodes 6 steps
# with two answers, 0.072 s, and trains 12 steps, 0.12 s: 0.192 s. The update takes 0.296 s
# (rank 1 waits 0.104 s in the all-reduce), and the slot use is 28 / (2 x 12 + 2 x 6) = 0.778:
# one of rank 0's two slots sat empty for 8 of its 12 steps.
#
# **How it is graded:** the worked example, a rank with no answers, one answer per rank and
# equal lengths (a slot use of 1), random batches against an oracle that plays the decoding
# step by step (to 1e-9 relative), and `ValueError` on bad arguments. Decoding for the mean
# length instead of the longest, every step costed at the full live count (no shrinking), the
# prompt steps left out of decoding or of training, the update as the sum or the mean over the
# ranks instead of the slowest, the slot use averaged over the ranks instead of pooled, and
# missing validation are named in the message.
#
# (At full size: `course_lib.capstone.plan.colocated_sync_rate`, section 8's prediction for this
# arm, with lesson 08's `course_lib.layout.model.generation_time_s` for the tail. Calling these,
# or any other piece of lesson 08's engine model, is refused: sum the steps yourself.)


# %% tags=["exercise"]
def colocated_sync_update(shares, prompt_steps, a_s, b_s, train_steps_per_s):
    """One synchronous update when every rank decodes its share, then trains on it.

    Args:
        shares: one list per rank of its answers' lengths in tokens (each >= 1; may be empty).
        prompt_steps: P, the steps that feed each answer's prompt before its first token.
        a_s, b_s: a decoding step with m live answers costs a_s + b_s * m seconds.
        train_steps_per_s: sequence steps a rank trains on per second.

    Returns:
        {"update_s": float, "decode_s": [per rank], "train_s": [per rank], "slot_use": float}.
    """
    ### BEGIN SOLUTION
    if not shares:
        raise ValueError("shares is empty: the update needs at least one rank")
    if any(n < 1 for share in shares for n in share):
        raise ValueError(f"every answer length in shares must be >= 1 token, got {shares}")
    if prompt_steps < 0:
        raise ValueError(f"prompt_steps must be >= 0, got {prompt_steps}")
    if a_s < 0 or b_s < 0:
        raise ValueError(f"a_s and b_s must be >= 0, got a_s={a_s}, b_s={b_s}")
    if train_steps_per_s <= 0:
        raise ValueError(f"train_steps_per_s must be > 0, got {train_steps_per_s}")
    decode_s, train_s = [], []
    live, held = 0, 0  # answer-steps decoded, slot-steps held
    for share in shares:
        steps = [prompt_steps + n for n in share]  # each answer is live for its prompt, then its tokens
        longest = max(steps, default=0)
        # the sum over the steps of a_s + b_s * m: a_s once a step until the longest ends, b_s once a live answer-step
        decode_s.append(a_s * longest + b_s * sum(steps))
        train_s.append(sum(steps) / train_steps_per_s)
        live += sum(steps)
        held += len(steps) * longest
    update_s = max(d + t for d, t in zip(decode_s, train_s))  # the all-reduce waits for the slowest rank
    return {"update_s": update_s, "decode_s": decode_s, "train_s": train_s, "slot_use": live / held if held else 1.0}
    ### END SOLUTION


# %% tags=["raises-in-stub"]
out = colocated_sync_update([[1, 9], [3, 3]], prompt_steps=3, a_s=0.01, b_s=0.001, train_steps_per_s=100)
for r, (d, t) in enumerate(zip(out["decode_s"], out["train_s"])):
    print(f"rank {r}: decode {d:.3f} s + train {t:.3f} s = {d + t:.3f} s")
print(f"update {out['update_s']:.3f} s, slot use {out['slot_use']:.3f}")

# %% tags=["exercise-check"]
check("11_capstone", "colocated_sync_update", colocated_sync_update)

# %% [markdown]
# ## Exercise 3 · Which samples count after a restore (★★☆, 25 min, 20 points)
#
# A run may die and be restarted from its newest complete checkpoint; each start is an
# **attempt** (0, 1, ...). Every generator writes a line `(attempt, k, samples)` for each
# group it generates, so the same group number `k` can appear once per attempt. Attempt
# `a` resumed from the checkpoint of step `resumed_from[a]` (`resumed_from[0] == 0`, a
# fresh start): the updates before that step survive as the checkpoint recorded them, and
# every update from that step on was done again by attempt `a`, on groups it generated
# again. Its generators number their groups from `resumed_from[a] * B` on (the group
# counter restarts there), so an attempt never generates a group of an update before the
# step it resumed from. The run ended after `final_step` updates, during the last attempt.
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
# What is checked is each line's class against that history: the copy of update `u` that
# counts is the one of the last attempt that resumed at or before `u` (as no attempt
# generates below its resume step, that is also the newest copy of each of its groups).
# Keeping groups generated after the checkpoint (counting a group twice), keeping the
# older attempt's copy, an off-by-one at the step boundary or at the last update, an
# earlier attempt's late groups counted as leftover, and totals in groups instead of
# samples are named in the message.
#
# (At full size: `course_lib.capstone.ledger`: `SampleLedger.resume` and `audit`. Handing the
# work to the ledger is refused: classify the lines yourself.)


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

# %% [markdown]
# ## Exercise 4 · Sharing cores: one reason the runner-up ran faster than the model said (★★★, 25 min, 15 points)
#
# Section 8 runs the four ranks pinned to 2 cores, and the model (11.3) gives every rank a
# fixed share of a core, $\sigma$ = cores / ranks = 0.5, the whole time. With $B = 4$ groups an
# update and 3 trainers, one trainer trains 2 groups and two train 1. Those two finish first and
# wait in the gradient all-reduce, and waiting does not use the CPU: the operating system shares
# the cores among the processes that still have work, so the busy trainer and the generator run
# faster than $\sigma$. The lesson measured the runner-up layout (3 trainers) as fast as the chosen
# one or faster, although the model ranked it lower; this exercise computes the part of that the
# shares explain.
#
# **Processor sharing.** At any moment, with `R` runnable processes (the trainers that still
# have work, plus `background` processes that always have work: the generators), each runs at
# `min(1, cores / R)` of a core (a process cannot use more than one core). A trainer that needs
# `w` CPU-seconds at a full core finishes when the core time it has received reaches `w`.
#
# Write `trainers_finish(work, cores, background)`: `work` lists the CPU-seconds each trainer
# needs for this update (each >= 0), `cores` is the cores the job is pinned to (> 0, maybe
# fractional) and `background` the number of processes that are always runnable (>= 0). Return a
# dict:
#
# - `"finish_s"`: the time each trainer finishes, in the order of `work` (0 for no work);
# - `"update_s"`: the last finish (the all-reduce waits for it);
# - `"fixed_share_s"`: what the fixed-share model says, `max(work) / min(1, cores / (len(work) +
#   background))`.
#
# Raise `ValueError` on an empty `work`, a negative work, `cores <= 0` or `background < 0`.
#
# A worked example, on 2 cores with a group costing 1 CPU-second. **3 trainers, 1 generator**,
# `work = [2, 1, 1]`, `background = 1`: 4 processes share 2 cores, half a core each, so the two
# one-group trainers finish at 2 s, when the first has done 1 of its 2 CPU-seconds. From then on
# it and the generator have a core each: it finishes 1 s later, `finish_s = [3, 2, 2]`, an update
# of 3 s, where the fixed share says 2 / 0.5 = 4 s. **2 trainers, 2 generators**, `work = [2,
# 2]`, `background = 2`: 4 processes runnable to the end, `finish_s = [4, 4]`, 4 s, as the fixed
# share says. The fixed share puts the two layouts level, 4 s an update each; shared cores make
# the 3-trainer layout's update 25% shorter (and its generator gets a whole core for its last
# second).
#
# **How it is graded:** the worked example; hand-made cases (equal work, trainers with no work,
# more cores than processes, where every process has a whole core, no background); random cases
# against an oracle in exact fractions (to 1e-9 relative); `ValueError` on bad arguments. Every
# trainer at the fixed share throughout, a share not capped at one core, the background
# processes forgotten, the mean finish instead of the last, finished trainers still counted as
# runnable, and missing validation are named in the message.
#
# (At full size: `course_lib.capstone.plan.rank_share` is the fixed share the model gives every
# rank; the job itself leaves the sharing to the operating system.)


# %% tags=["exercise"]
def trainers_finish(work, cores, background):
    """When each trainer finishes its update's work under processor sharing (see the statement).

    Args:
        work: CPU-seconds each trainer needs at a full core (each >= 0).
        cores: the cores the job is pinned to (> 0).
        background: processes that are always runnable (the generators, >= 0).

    Returns:
        {"finish_s": [per trainer], "update_s": float, "fixed_share_s": float}.
    """
    ### BEGIN SOLUTION
    if not work:
        raise ValueError("work is empty: the update needs at least one trainer")
    if any(w < 0 for w in work):
        raise ValueError(f"every work in work must be >= 0 CPU-seconds, got {work}")
    if cores <= 0:
        raise ValueError(f"cores must be > 0, got {cores}")
    if background < 0:
        raise ValueError(f"background must be >= 0, got {background}")
    finish = [0.0] * len(work)
    t, done = 0.0, 0.0  # the clock, and the core time every unfinished trainer has received so far
    order = sorted(range(len(work)), key=lambda k: work[k])  # the least work finishes first
    for j, i in enumerate(order):
        runnable = len(work) - j + background  # the trainers with work left, and the background
        rate = min(1.0, cores / runnable)  # each one's share of a core until the next finish
        t += (work[i] - done) / rate
        done = work[i]
        finish[i] = t
    fixed_share_s = max(work) / min(1.0, cores / (len(work) + background))
    return {"finish_s": finish, "update_s": max(finish), "fixed_share_s": fixed_share_s}
    ### END SOLUTION


# %% tags=["raises-in-stub"]
for label, work, background in (("3 trainers, 1 generator", [2, 1, 1], 1), ("2 trainers, 2 generators", [2, 2], 2)):
    out = trainers_finish(work, cores=2, background=background)
    print(f"{label}: finish {out['finish_s']}, update {out['update_s']:.2f} s, fixed share {out['fixed_share_s']:.2f} s")

# %% tags=["exercise-check"]
check("11_capstone", "trainers_finish", trainers_finish)

# %% [markdown]
# ## Exercise 5 · Agreeing on the attempt after a restart (★★★, 35 min, 20 points)
#
# When a rank dies, torchrun starts every rank again: a new **attempt**. Its ranks must agree
# on its number, because all their keys in the store (`a{n}/...`) and their process group
# hang on it: a rank that took the dead attempt's number would read what the dead attempt
# left and wait forever for ranks that are gone. `TORCHELASTIC_RESTART_COUNT` cannot give the
# number: each agent counts only the restarts *it* decided, so with two nodes the agent whose
# rank died counts one and the other (which saw a membership change) does not. The launch's
# store can, since it lives as long as the launch; but it still holds every key the dead
# attempt wrote. The job runs this protocol (`course_lib.capstone.context.join_attempt`,
# blocking, on torch's TCP store); here it is as rules, with the keys named:
#
# - **rank 0** takes the next number once, at its first call: `n = attempts + 1`, stored back
#   in the counter `attempts` (0 when absent). At every call it first compares `attempts` with
#   `n`: if a newer attempt took a number, this one is dead and rank 0 **steps aside**.
#   Otherwise, for every rank `k` that has not confirmed at `ready/{n}/{k}`, it reads the nonce
#   at `join/{k}` and, if it has not welcomed that very nonce yet, posts the welcome
#   `welcome/{nonce} = n`. It has joined when every other rank has confirmed.
# - **every other rank `k`** posts a fresh nonce (from `me["fresh"]()`: a value no process ever
#   had) at `join/{k}` and waits for `welcome/{nonce}`: a key only this process can be waiting
#   for, so nothing a dead attempt wrote can answer it. When the welcome is there, it checks
#   that its number is still the newest (`attempts`): if not, a dead attempt's rank 0 sent it,
#   and the rank posts a fresh nonce and waits again; if so, it confirms at `ready/{n}/{k}`
#   (writing its nonce there) and has joined `n`.
#
# Two things of a dead attempt can be around: every key it wrote (`join/{k}` holding a dead
# rank's nonce, its welcomes, its `ready/...`), and its rank 0 itself, still running while
# it is being killed: it may go on polling, and its last welcomes may land after the new
# rank 0 took its number.
#
# Write `join_step(store, me)`: **one call** of one rank's side of the protocol, which never
# waits (as in lesson 12's controller loop, the waiting is the caller's: it calls again).
# The grader starts the ranks, calls `join_step` for one process at a time in a random order,
# kills the processes of an attempt midway, starts new ones, and so on. `store` is a dict
# (the launch's store; a missing key is absent), `me` is this process's own dict, the only
# memory that survives between its calls: it arrives with `me["rank"]`, `me["world_size"]`
# and `me["fresh"]`; keep anything else you need in it. Return:
#
# - `None`: not joined yet (call again);
# - `("joined", n)`: this process belongs to attempt `n` (returned once: it is not called again);
# - `("superseded", newest)`: rank 0 only, when a newer attempt has taken the number `newest`.
#
# **How it is graded:** hand-made launches of 3 ranks (a fresh start with rank 0 last; a
# restart with every key of attempt 1 in the store and the new rank 0 late; a restart where
# `join/1` still holds the dead rank 1's nonce when rank 0 first reads it; three starts
# killed midway); launches where the dead attempt's rank 0 lingers and its last welcomes
# land late; 36 random launches (2 to 4 ranks, up to 3 restarts, kills after a random number
# of calls). Every process must join its own attempt's number (the numbers count the starts
# whose rank 0 ran: 1, 2, ...), never an older one; a rank 0 may join only once every rank of
# its attempt confirmed at `ready/{n}/{k}`; a dead rank 0 must step aside at its first call
# after a newer number was taken; every rank of the last start must join within a bounded
# number of calls; one call may use the store only a few dozen times (waiting inside a call
# would spin forever: nothing changes during it). The grader's store records who wrote each
# key, so a rank that took its number from `attempts` itself, one that waited at a key a
# dead attempt wrote (a fixed key, or a nonce that was not fresh), a welcome accepted without
# checking `attempts`, a rank 0 that counted `join/{k}` as joined, one that welcomed each rank
# once instead of each nonce, and a rank 0 that never steps aside are named in the message.
#
# (At full size: `course_lib.capstone.context.join_attempt`, blocking, on torch's TCP store;
# `tests/test_capstone_multinode.py` kills a rank under one of two agents.)


# %% tags=["exercise"]
def join_step(store, me):
    """One non-blocking call of rank ``me["rank"]``'s side of the attempt protocol.

    Args:
        store: the launch's store, a dict (``attempts``, ``join/{k}``, ``welcome/{nonce}``,
            ``ready/{n}/{k}``).
        me: this process's own memory: ``"rank"``, ``"world_size"``, ``"fresh"`` (a function
            returning a new nonce), and whatever this function keeps there between calls.

    Returns:
        None (not joined yet), ("joined", n) or, for rank 0, ("superseded", newest).
    """
    ### BEGIN SOLUTION
    rank = me["rank"]
    if rank == 0:
        if "n" not in me:  # the first call: take the next number, once
            me["n"] = store.get("attempts", 0) + 1
            store["attempts"] = me["n"]
            me["welcomed"] = {}  # rank -> the nonce rank 0 welcomed there
        n = me["n"]
        if store["attempts"] != n:  # a newer attempt started: this one is dead
            return ("superseded", store["attempts"])
        missing = 0
        for k in range(1, me["world_size"]):
            if f"ready/{n}/{k}" in store:
                continue
            missing += 1
            nonce = store.get(f"join/{k}")
            if nonce is not None and me["welcomed"].get(k) != nonce:  # a dead rank's nonce gets one too: unread
                store[f"welcome/{nonce}"] = n
                me["welcomed"][k] = nonce
        return None if missing else ("joined", n)
    if "nonce" not in me:  # post a key only this process will wait at
        me["nonce"] = me["fresh"]()
        store[f"join/{rank}"] = me["nonce"]
        return None
    n = store.get(f"welcome/{me['nonce']}")
    if n is None:
        return None
    if n != store.get("attempts", 0):  # welcomed by a dead attempt's rank 0: join again
        me["nonce"] = me["fresh"]()
        store[f"join/{rank}"] = me["nonce"]
        return None
    store[f"ready/{n}/{rank}"] = me["nonce"]
    return ("joined", n)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
def start(world_size, nonces):
    """The processes of one start: each rank's own memory."""
    return [{"rank": r, "world_size": world_size, "fresh": lambda: f"nonce-{next(nonces)}"} for r in range(world_size)]


def poll(store, procs, order):
    """Call join_step for the ranks in `order` (skipping those that returned); the results."""
    results = {}
    for r in order:
        if r not in results:
            got = join_step(store, procs[r])
            if got is not None:
                results[r] = got
    return results


store, nonces = {}, itertools.count()
first = start(3, nonces)
print("start 1:", poll(store, first, [1, 2, 0, 1, 2, 0, 1, 2, 0]))
# rank 1 dies; torchrun starts all three again. The store keeps attempt 1's keys, and the new
# ranks 1 and 2 run before the new rank 0 has taken its number.
second = start(3, nonces)
print("start 2:", poll(store, second, [1, 2, 1, 2, 1, 2, 0, 1, 2, 0, 1, 2, 0]))
print("keys left in the store:", sorted(store))

# %% tags=["exercise-check"]
check("11_capstone", "join_step", join_step)
