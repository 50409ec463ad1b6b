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
# can write and test without a cluster: which rank does what, when a generator may take
# new weights and start a new group, and, after a crash and a restore, which generated
# samples count. A fourth exercise is the one equation that makes the trainers' data
# parallelism exact: each trainer's share of the loss (11.1). The fifth is what makes a
# restart safe across agents: how the ranks of a new start agree on their attempt, played
# against a store that still holds everything the dead attempt wrote.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `assign_roles`: a rank's role and its process groups | 10 | ★☆☆ | 10 min |
# | 2. `sync_and_admit`: the weight-version handshake | 15 | ★★☆ | 20 min |
# | 3. `restart_accounting`: which samples count after a restore | 20 | ★★☆ | 25 min |
# | 4. `data_parallel_losses`: each trainer's loss, over the global token count (11.1) | 15 | ★★☆ | 20 min |
# | 5. `join_step`: agreeing on the attempt after a restart | 20 | ★★★ | 35 min |

# %%
import itertools
import random

import torch

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
# way, starting without weights, admitting with the version held before the pull and
# missing validation are named in the message.
#
# (At full size: `course_lib.capstone.generator.Generator.run`, with
# `course_lib.rl.staleness.may_start_group`.)


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
# (At full size: `course_lib.capstone.ledger`: `SampleLedger.resume` and `audit`.)


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
# ## Exercise 4 · Each trainer's loss: the global token count (★★☆, 20 min, 15 points)
#
# The `n_trainers` trainers share an update data-parallel: trainer `r` takes its shard
# $S_r$ of the update's groups, computes a loss $L_r$ on it, backpropagates, and an
# all-reduce **sums** the trainers' gradients. The update must be the one a single process
# would make on the whole batch: the gradient of lesson 07's loss (07.2), the mean over all
# $N_{tok}$ real tokens of $-\mathrm{sg}[w_{it}]\, A_i \log\pi$. So each trainer divides its
# sum by the token count of the **whole** batch, every shard's real tokens together (the
# lesson's equation (11.1)):
#
# $$L_r = -\frac{1}{N_{tok}} \sum_{(i,t) \in S_r} \mathrm{sg}[w_{it}]\, A_i\, \log\pi_u(y_{it}\mid x, y_{i,<t}),
#   \qquad \nabla L = \sum_{r=1}^{N_t} \nabla L_r$$
#
# with $w_{it} = \min(c, \pi_u / \mu)$ the truncated per-token weight (07.1), a constant
# for the gradient ($\mathrm{sg}$, stop-gradient). $N_{tok}$ costs the job one all-reduce
# of a single number before the backward pass.
#
# **Why not each shard's own count?** Answers have ragged lengths, so shards hold different
# numbers of tokens. Say shard 0 holds 3 tokens and shard 1 holds 9 ($N_{tok} = 12$). With
# the global count every token's term is divided by 12 in both shards, exactly as in the
# single-process loss. Dividing by the local count (shard 0 by 3, shard 1 by 9), the summed
# gradient weighs each of shard 0's tokens by 1/3 and each of shard 1's by 1/9: the short
# shard's tokens count **3x** as much, and the whole gradient is twice too large. Taking
# each shard's mean and averaging over the ranks (what averaging the gradients, DDP's
# default, does with per-shard means) fixes the scale, 1/6 and 1/18, but not the 3x. The
# local answers agree with (07.2) only when every shard holds the same number of tokens,
# which ragged answers never promise.
#
# Write `data_parallel_losses(shards, clip_c)`, playing every trainer in one process. Each
# shard is a dict of tensors as one trainer holds them, its rows padded to its own longest
# (prompt positions and padding have `mask` False):
#
# - `"logp_new"` `[n_r, T_r]`: $\log\pi_u$ per position, requires grad;
# - `"logp_behaviour"` `[n_r, T_r]`: $\log\mu$, the generator's log-probs (garbage outside the mask);
# - `"adv"` `[n_r]`: $A_i$, one advantage per answer;
# - `"mask"` `[n_r, T_r]` bool: True at the real answer tokens.
#
# Return the list `[L_0, ..., L_{N_t - 1}]`, one scalar tensor per shard. Compute $L_r$ from
# shard `r`'s tensors and $N_{tok}$ only (that number is all the trainers share), and write
# it from its terms, without course_lib's `pipeline_loss`.
#
# **How it is graded:** random batches of 1 to 4 shards with ragged masks and token counts,
# `clip_c` from 1 to 5, some answers with a zero advantage (a group whose rewards are all
# alike): the sum of the shards' values must equal the whole batch's (07.2), computed in one
# process, and the sum of the shards' gradients (each shard's `logp_new`, torch autograd)
# its gradient; the worked example (3 and 9 tokens, every weight 1: each token's gradient
# is $-A_i / 12$); equal shards; padding values changing nothing; each shard's loss
# depending only on its own shard. Dividing by the local token count, averaging the
# shards' means over the ranks, a weight without sg, padding counted in $N_{tok}$, the
# tokens of zero-advantage answers left out of $N_{tok}$, an unmasked sum, untruncated
# weights, a truncation fixed at 2 whatever `clip_c` is and calling course_lib's loss are
# named in the message.
#
# (At full size: `course_lib.capstone.trainer.shard_loss` and `Trainer.update`, which
# all-reduce the count first.)


# %% tags=["exercise"]
def data_parallel_losses(shards, clip_c):
    """Each trainer's term ``L_r`` of (11.1): its shard's sum of sg[w] A log pi over the
    global token count, so that the sum of the shards' gradients is (07.2)'s on the whole batch.

    Args:
        shards: one dict per trainer: ``"logp_new"`` [n_r, T_r] (requires grad),
            ``"logp_behaviour"`` [n_r, T_r], ``"adv"`` [n_r], ``"mask"`` [n_r, T_r] bool.
        clip_c: the truncation c of the weight (07.1).

    Returns:
        [L_0, ..., L_{N_t - 1}]: one scalar tensor per shard.
    """
    ### BEGIN SOLUTION
    n_tokens = sum(int(s["mask"].sum()) for s in shards)  # the all-reduce of one number
    losses = []
    for s in shards:
        logp_new, m = s["logp_new"], s["mask"].to(s["logp_new"].dtype)
        w = torch.clamp(torch.exp(logp_new.detach() - s["logp_behaviour"]), max=clip_c)  # sg[w]
        losses.append(-(w * s["adv"][:, None] * logp_new * m).sum() / n_tokens)
    return losses
    ### END SOLUTION


# %% tags=["raises-in-stub"]
def toy_shard(n_answers, n_tokens):
    """n_answers answers of n_tokens tokens each, on-policy (every weight 1), advantage 1."""
    logp = torch.full((n_answers, n_tokens), -0.5, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(n_answers, n_tokens, dtype=torch.bool)
    adv = torch.ones(n_answers, dtype=torch.float64)
    return {"logp_new": logp, "logp_behaviour": logp.detach().clone(), "adv": adv, "mask": mask}


shards = [toy_shard(1, 3), toy_shard(3, 3)]  # 3 and 9 tokens
losses = data_parallel_losses(shards, clip_c=2.0)
sum(losses).backward()  # what the all-reduce adds up
for r, s in enumerate(shards):
    print(f"shard {r}: {int(s['mask'].sum())} tokens, gradient per token {s['logp_new'].grad[0, 0].item():+.4f}")
print("each token's gradient in (07.2) over all 12 tokens: -A / 12 =", f"{-1 / 12:+.4f}")

# %% tags=["exercise-check"]
check("11_capstone", "data_parallel_losses", data_parallel_losses)

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
# attempt wrote. Section 7 of the lesson describes the protocol the job runs; here it is as
# rules, with the keys named:
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
