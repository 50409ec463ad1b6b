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
# parallelism exact: each trainer's share of the loss (11.1).
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `assign_roles`: a rank's role and its process groups | 10 | ★☆☆ | 10 min |
# | 2. `sync_and_admit`: the weight-version handshake | 15 | ★★☆ | 20 min |
# | 3. `restart_accounting`: which samples count after a restore | 20 | ★★☆ | 25 min |
# | 4. `data_parallel_losses`: each trainer's loss, over the global token count (11.1) | 15 | ★★☆ | 20 min |

# %%
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
# `course_lib.rl.staleness.may_start_group`.)
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
# **How it is graded:** random batches of 1 to 4 shards with ragged masks and token counts:
# the sum of the shards' values must equal the whole batch's (07.2), computed in one
# process, and the sum of the shards' gradients (each shard's `logp_new`, torch autograd)
# its gradient; the worked example (3 and 9 tokens, every weight 1: each token's gradient
# is $-A_i / 12$); equal shards; padding values changing nothing; each shard's loss
# depending only on its own shard. Dividing by the local token count, averaging the
# shards' means over the ranks, a weight without sg, padding counted in $N_{tok}$, an
# unmasked sum, untruncated weights and calling course_lib's loss are named in the message.
#
# (At full size: `course_lib.capstone.trainer.shard_loss` and `Trainer.update`, which
# all-reduce the count first.)
#
# <details><summary>Hint 1</summary>
# Two steps, as on the cluster: first the one number the trainers all-reduce, the real
# tokens of every shard, <code>sum(int(s["mask"].sum()) for s in shards)</code>; then each
# shard's sum of sg[w] A log pi over its real tokens, divided by that number.
# </details>
# <details><summary>Hint 2</summary>
# The weight is <code>torch.clamp(torch.exp(logp_new.detach() - logp_behaviour), max=clip_c)</code>:
# <code>.detach()</code> is the sg[]. The advantage is per answer: <code>adv[:, None]</code>
# broadcasts it over the answer's tokens.
# </details>
# <details><summary>Hint 3</summary>
# <code>m = mask.to(logp_new.dtype)</code>;
# <code>-(w * adv[:, None] * logp_new * m).sum() / n_tokens</code>, with the same
# <code>n_tokens</code> for every shard.
# </details>


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
