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
# # Exercises 07 · Pipeline RL: in-flight weight updates
#
# This notebook is generated from `exercises/src/07_pipeline_rl.py`; the worked
# solutions are in `solutions/07_pipeline_rl.ipynb`. Write the function bodies where they
# raise `NotImplementedError`, run the *check yourself* cell under each one, and when all
# pass grade the notebook from a terminal:
#
# ```
# course grade exercises/07_pipeline_rl.ipynb
# ```
#
# The equations are numbered as in `lessons/07_pipeline_rl.ipynb`. A batch holds `N`
# answers padded to `T` positions; `mask[i, t]` is True at the real answer tokens.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `token_is_loss` | 15 | ★★☆ | 15 min |
# | 2. `token_lags` | 10 | ★☆☆ | 10 min |
# | 3. `share_loss` | 10 | ★★☆ | 15 min |
# | 4. `inflight_decode` | 15 | ★★☆ | 20 min |
# | 5. `refill_free_slots` | 15 | ★★☆ | 20 min |

# %%
import numpy as np
import torch

from course_lib.runtime.weights import load_flat_parameters
from course_lib import check

# %% [markdown]
# ## Exercise 1 · The per-token truncated-IS loss with mixed versions (★★☆, 15 min, 15 points)
#
# Each answer token was sampled by some policy version with behaviour log-probability
# $\log\mu_{it}$ (`logp_behaviour`); the trainer's current policy gives $\log\pi_{it}$
# (`logp_new`, which requires grad). With one truncated weight per token
#
# $$w_{it} = \min\big(c,\ \exp(\log\pi_{it} - \log\mu_{it})\big) \qquad (07.1)$$
#
# the loss is the mean over the real tokens, the weight being a constant (no gradient
# flows through it):
#
# $$L = -\frac{1}{N_{tok}}\sum_{i,t:\ \text{mask}_{it}} \mathrm{sg}[w_{it}]\, A_i\, \log\pi_{it}. \qquad (07.2)$$
#
# Inputs: `logp_new`, `logp_behaviour` `[N, T]` float tensors, `advantages` `[N]` (one
# per answer), `mask` `[N, T]` bool, `c` a float. Return a scalar tensor. Padding
# positions (mask False) may hold any value, even -inf, and must affect neither the loss
# nor its gradient.
#
# **How it is graded:** against a term-by-term loop over the real tokens, on batches whose
# ratios cross `c` (from 1 to 5) and whose padding holds garbage; the gradient with respect
# to `logp_new` is compared with the oracle's (the weight must be a constant); properties:
# on-policy tokens weigh 1, padding changes nothing, padding holding -inf (in `logp_new`,
# in `logp_behaviour`, in both) leaves the loss and its gradient finite and right. A
# missing truncation, a truncation level written as a number instead of `c`, a gradient
# through the weight, a ratio per sequence instead of per token, $\mu/\pi$ instead of
# $\pi/\mu$, a mean over all positions, a mean per answer then over the answers, or a mask
# applied by multiplication (-inf * 0 is nan) are named in the message.

# %% tags=["exercise"]
def token_is_loss(logp_new, logp_behaviour, advantages, mask, c):
    """Per-token truncated importance-weighted REINFORCE loss (eq. 07.1-07.2).

    Args:
        logp_new: [N, T] log pi of the sampled tokens under the current policy (requires grad).
        logp_behaviour: [N, T] log mu, as the sampler recorded it.
        advantages: [N] one advantage per answer.
        mask: [N, T] bool, the real answer tokens.
        c: truncation level of the weights.

    Returns:
        a scalar torch tensor.
    """
    ### BEGIN SOLUTION
    # select the real tokens before computing with them: padding may hold -inf, and -inf * 0 is nan
    logp_new = torch.where(mask, logp_new, 0.0)  # the padding's terms are then w * A * 0 = 0
    logp_behaviour = torch.where(mask, logp_behaviour, 0.0)
    log_ratio = logp_new.detach() - logp_behaviour
    w = torch.clamp(torch.exp(log_ratio), max=c)
    return -(w * advantages[:, None] * logp_new).sum() / mask.sum()
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# one answer of two tokens: ratios 2 (truncated to 1.5) and 0.5, advantage 1
example = dict(logp_new=torch.log(torch.tensor([[0.4, 0.1]])), logp_behaviour=torch.log(torch.tensor([[0.2, 0.2]])),
               advantages=torch.tensor([1.0]), mask=torch.tensor([[True, True]]), c=1.5)
print(f"L = {token_is_loss(**example).item():.4f}  (by hand: -(1.5 log 0.4 + 0.5 log 0.1) / 2 = 1.2629)")

# %% tags=["exercise-check"]
check("07_pipeline_rl", "token_is_loss", token_is_loss)

# %% [markdown]
# ## Exercise 2 · Lag accounting per token (★☆☆, 10 min, 10 points)
#
# With in-flight weight updates, the tokens of one answer can come from different
# versions. The trainer at version `trainer_version` counts, for every real token,
#
# $$\text{lag}_{it} = u - v_{it} \qquad (07.4)$$
#
# Inputs: `versions` `[N, T]` integers (array, tensor or list; padding may hold anything,
# e.g. -1), `mask` `[N, T]` bool. Return an int64 numpy array `[N, T]`, with 0 at the
# padding. A real token with a version newer than the trainer's is a bookkeeping bug:
# raise `ValueError`.
#
# **How it is graded:** hand-computed lags for sequences that change version midway,
# padding holding -1, the integer dtype, inputs unchanged, tensors accepted, and the
# `ValueError`. Counting at the padding, the wrong sign, or one lag per sequence are named.

# %% tags=["exercise"]
def token_lags(trainer_version, versions, mask):
    """Per-token lag (eq. 07.4): trainer_version - version on real tokens, 0 elsewhere.

    Returns:
        np.ndarray [N, T], dtype int64.
    """
    ### BEGIN SOLUTION
    v = np.asarray(versions, dtype=np.int64)
    m = np.asarray(mask, dtype=bool)
    if (v[m] > trainer_version).any():
        raise ValueError(f"a token's version is newer than the trainer's {trainer_version}")
    return np.where(m, trainer_version - v, 0).astype(np.int64)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
print(token_lags(7, np.array([[-1, 5, 6, 7]]), np.array([[False, True, True, True]])), " (by hand: [[0 2 1 0]])")

# %% tags=["exercise-check"]
check("07_pipeline_rl", "token_lags", token_lags)

# %% [markdown]
# ## Exercise 3 · Data-parallel shares whose gradients sum to the batch's (★★☆, 15 min, 10 points)
#
# The lesson's conventional arms train **data-parallel**: each of the $n$ trainer ranks
# computes the loss of its *share* of the batch's rows and backpropagates it, and the
# ranks' gradients are **summed** before the optimizer step. That step must be the one a
# single process would take on the whole batch, the gradient of (07.2). The loss (07.2) is a
# mean over the *whole batch's* $N_{tok}$ real tokens, so the loss of a share $S$ (a set of
# rows) is its rows' terms divided by that same count:
#
# $$L_S = -\frac{1}{N_{tok}} \sum_{i \in S,\ t:\ \text{mask}_{it}} \mathrm{sg}[w_{it}]\, A_i\, \log\pi_{it},
#   \qquad \sum_S L_S = L, \quad \sum_S \nabla L_S = \nabla L$$
#
# for any partition of the rows into shares, with $w_{it}$ exercise 1's truncated weight
# (07.1). Dividing by the share's **own** token count instead is the classic data-parallel
# pitfall with token-mean losses: answers are ragged, so shares hold different numbers of
# tokens. With shares of 3 and 9 tokens ($N_{tok} = 12$), the own counts weigh each token of
# the first share by 1/3 and each of the second by 1/9 instead of 1/12 for all: the short
# share's tokens count 3x as much, and the summed gradient is not the batch's.
#
# Inputs: as in exercise 1, the **whole batch's** `logp_new`, `logp_behaviour` `[N, T]`
# (`logp_new` requires grad), `advantages` `[N]`, `mask` `[N, T]` bool and `c`; `rows`, a
# 1-D `torch.long` tensor of the share's row indices (in any order; empty for a rank with no
# rows this update); `n_real`, the whole batch's real-token count $N_{tok}$ (an int: the one
# number the ranks agree on). Return $L_S$, a scalar tensor. Padding positions may hold any
# value, even -inf, and must affect neither the loss nor its gradient. (The lesson's trainer
# does this in `course_lib.pipeline.system.batch_share_loss`, which also cuts the share into
# chunks of similar length; write yours from its terms.)
#
# **How it is graded:** hand-computed values (the example below, and three answers with a
# truncated ratio); random batches split into 1 to 4 shares of random rows, `c` from 1 to 5,
# against a term-by-term loop: each share's loss, so that the shares sum to the batch's
# (07.2), and each share's gradient with respect to `logp_new`, so that they sum to its
# gradient (the weight a constant); an empty share gives 0 without error; the inputs are left
# unchanged; padding holding -inf gives no nan and no gradient at the padding. Dividing by
# the share's own real-token count, dividing by the number of shares (averaging the ranks'
# gradients), a mean per answer, a gradient through the importance weight, a loss over every
# row instead of the share's, and a mask applied by multiplication (-inf * 0 is nan) are
# named in the message.

# %% tags=["exercise"]
def share_loss(logp_new, logp_behaviour, advantages, mask, rows, n_real, c):
    """The loss (07.2) of the batch rows `rows` alone, over the whole batch's real-token count,
    so that the shares of any partition of the rows sum to the batch's loss and gradient.

    Args:
        logp_new: [N, T] log pi of the whole batch's tokens under the current policy (requires grad).
        logp_behaviour: [N, T] log mu, as the sampler recorded it.
        advantages: [N] one advantage per answer.
        mask: [N, T] bool, the real answer tokens.
        rows: 1-D torch.long tensor, the share's rows (any order, possibly empty).
        n_real: the whole batch's number of real tokens.
        c: truncation level of the weights.

    Returns:
        a scalar torch tensor.
    """
    ### BEGIN SOLUTION
    m = mask[rows]
    # the share's rows, their padding selected away before any arithmetic (it may hold -inf)
    logp_new = torch.where(m, logp_new[rows], 0.0)
    logp_behaviour = torch.where(m, logp_behaviour[rows], 0.0)
    w = torch.clamp(torch.exp(logp_new.detach() - logp_behaviour), max=c)
    return -(w * advantages[rows][:, None] * logp_new).sum() / n_real  # the batch's count, not the share's
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# answer 0 has 1 real token (log 0.5), answer 1 has 3 (log 0.25 each); the padding holds -inf (log 0);
# on-policy (every weight 1), advantages 1: n_real = 4
logp = torch.log(torch.tensor([[0.5, 0.0, 0.0], [0.25, 0.25, 0.25]], dtype=torch.float64))
example = dict(logp_new=logp, logp_behaviour=logp.clone(), advantages=torch.tensor([1.0, 1.0], dtype=torch.float64),
               mask=torch.tensor([[True, False, False], [True, True, True]]), n_real=4, c=1.5)
shares = [share_loss(rows=torch.tensor([0]), **example), share_loss(rows=torch.tensor([1]), **example)]
print(f"L_0 + L_1 = {shares[0].item():.4f} + {shares[1].item():.4f} = {(shares[0] + shares[1]).item():.4f}",
      " (by hand: -log 0.5 / 4 = 0.1733 and -3 log 0.25 / 4 = 1.0397, which sum to the batch's loss 1.2130)")

# %% tags=["exercise-check"]
check("07_pipeline_rl", "share_loss", share_loss)

# %% [markdown]
# ## Exercise 4 · The in-flight weight swap in a decoding loop (★★☆, 20 min, 15 points)
#
# A generator in Pipeline RL never stops decoding. Before **every** decoding step it asks
# whether newer weights were published; if so it loads them into the model *in place*
# and carries on with the **same KV cache**. Every token it samples is recorded with its
# log-probability and the version of the weights that sampled it.
#
# Inputs: `model`, a `course_lib.lm.TinyLM`; `cache`, its KV cache (from
# `model.new_cache(B)`), filled for the positions before `pos`; `tokens` `[B]` the last
# token of each sequence (not yet fed) at positions `pos` `[B]`, one per row (the slots of
# a continuous batch started their answers at different times, so each row decodes at its
# own position); `n_steps`; `poll()`, which returns `None` or `(new_version,
# flat_weights)`; `version`, the version the model holds now; `generator`, a
# `torch.Generator` for sampling. One decoding step is
# `logits = model.step(tokens, pos, cache)` (it writes the cache at `pos`); sample the next
# token with `torch.multinomial(probs, 1, generator=generator)`; feed it at `pos + 1`.
# Load weights with `load_flat_parameters(model, flat)` (imported above) into `model`
# itself, in place; only a version **newer** than the one held is loaded. Leave the
# `tokens` and `pos` tensors you are given as they were (work on copies). Return
# `(new_tokens, logp, versions)`, each `[B, n_steps]` (long, float, long).
#
# **How it is graded:** without updates, the log-probs must equal a full forward pass over
# the finished sequences and the tokens must follow `generator`; with an update, every step
# is replayed through `model.step` with your tokens fed back (teacher forcing): its
# log-probs must be those of the weights held at that step (the new ones from the swap on),
# its tokens `torch.multinomial`'s draws with `generator`, and `model` must hold the new
# weights afterwards; the tokens before the update equal those of a run without it, the
# cache written before it is left as it was, later tokens carry the new version, and an
# older version is ignored; nothing requires grad; dtypes, and `tokens` and `pos`
# unchanged; rows at different positions, each replayed at its own. Clearing the cache,
# stamping the old version, stamping the new version without loading its weights, loading
# them into a copy of the model, sampling greedily, from another distribution or from the
# global random state, and one position counter shared by every row are named in the
# message.

# %% tags=["exercise"]
def inflight_decode(model, cache, tokens, pos, n_steps, poll, version, generator):
    """Decode n_steps tokens per sequence, swapping in newer weights between steps (keep the cache).

    Returns:
        (new_tokens [B, n_steps] long, logp [B, n_steps] float, versions [B, n_steps] long)
    """
    ### BEGIN SOLUTION
    tokens, pos = tokens.clone(), pos.clone()
    new_tokens, logps, versions = [], [], []
    with torch.no_grad():
        for _ in range(n_steps):
            update = poll()
            if update is not None and update[0] > version:
                version, flat = update
                load_flat_parameters(model, flat)
            logp = torch.log_softmax(model.step(tokens, pos, cache), dim=-1)
            tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
            new_tokens.append(tokens)
            logps.append(logp.gather(1, tokens[:, None]).squeeze(1))
            versions.append(torch.full_like(tokens, version))
            pos = pos + 1
    return torch.stack(new_tokens, 1), torch.stack(logps, 1), torch.stack(versions, 1)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
from course_lib.runtime.weights import flat_parameters
from course_lib.lm import LMConfig, TinyLM

torch.manual_seed(0)
lm, newer = TinyLM(LMConfig(vocab=12, d_model=16, n_layers=1, n_heads=2, max_len=16)), TinyLM(LMConfig(vocab=12, d_model=16, n_layers=1, n_heads=2, max_len=16))
updates = iter([None, None, (1, flat_parameters(newer))] + [None] * 10)
out = inflight_decode(lm, lm.new_cache(2), torch.tensor([1, 2]), torch.tensor([0, 0]), 6, lambda: next(updates), 0,
                      torch.Generator().manual_seed(0))
print("versions of the 6 new tokens:", out[2].tolist(), " (expected: [[0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])")

# %% tags=["exercise-check"]
check("07_pipeline_rl", "inflight_decode", inflight_decode)


# %% [markdown]
# ## Exercise 5 · Continuous batching with backpressure: refilling the free slots (★★☆, 20 min, 15 points)
#
# Pipeline RL's generator never waits for a whole batch: between two decoding steps it
# starts a new answer in **every slot that has just become free** (continuous batching).
# Answers come in groups: `G = group_size` answers to one prompt (GRPO compares them with
# each other), and the trainer's update `u` consumes groups `uB .. (u + 1)B - 1`
# (`B = groups_per_batch`), in the order they were started. Left alone, the generator would
# run ahead of the trainer and its samples would grow stale without bound; **backpressure**
# bounds the lag. Groups are numbered as they start; when the trainer has consumed
# `consumed` groups, the weights the generator holds are at least version
# `consumed / B`, and group `k` will be trained on by update `k // B`. Its tokens then lag
# by at most `max_lag` updates if and only if
#
# $$k < \text{consumed} + (\text{max\_lag} + 1)\,B .$$
#
# So a **new** group may start only while its number is below that bound; otherwise the
# refill stops and the remaining slots stay free until the trainer consumes more. A group
# that has **already started** is different: it was admitted, and the trainer waits for all
# `G` of its answers, so its remaining answers always take the next free slots (holding
# them back would leave the trainer waiting for a group that never completes). The prompt of
# a new group is taken from the queue **only once the group is admitted**: a prompt taken
# for a group that is then held back would be lost.
#
# Write `refill_free_slots(sampler, prompts, state, consumed, max_lag, group_size,
# groups_per_batch)`:
#
# * `sampler.free_slots()` returns the list of free slot numbers; visit them **in that
#   order**. `sampler.start(slot, prompt, group)` starts an answer to `prompt`, belonging to
#   group number `group`, in a free `slot`.
# * `prompts` is an iterator: `next(prompts)` takes the next prompt, one per new group.
# * `state` is the generator's dict, kept from one call to the next: **update it in place**.
#   `state["next_group"]` is the number the next new group gets; `state["group"]` and
#   `state["prompt"]` are the group whose answers are being started and its prompt;
#   `state["left"]` how many of its answers are still to start. A fresh generator has
#   `{"next_group": 0, "group": -1, "prompt": None, "left": 0}`.
# * `consumed`, `max_lag`, `group_size` and `groups_per_batch` are ints (`max_lag >= 0`).
#
# Return the number of answers started.
#
# **How it is graded:** a fake sampler (it refuses a slot that is not free) and a queue of
# prompts that counts what is taken. Hand-computed refills (a fresh generator filling six
# slots; a full window that holds a group back; the trainer consuming a batch that lets it
# start); a group that straddles two refills and finishes through backpressure; calls with
# no free slot or a full window, which start nothing and take no prompt; and 30 random
# generators, 40 refills each (slots, `G`, `B`, `max_lag` from 0 to 3, the trainer consuming
# as it goes) against a simulation that lists the answers owed, in order. A window off by
# one, `max_lag B` for `(max_lag + 1) B`, `consumed` counted in updates instead of groups,
# a prompt per answer, a prompt taken for a group held back, the rest of a started group
# held back, new groups started only when all `G` of their answers fit, the free slots
# visited in another order, and a state not kept between calls are named in the message.


# %% tags=["exercise"]
def refill_free_slots(sampler, prompts, state, consumed, max_lag, group_size, groups_per_batch):
    """Start an answer in every free slot, group after group, until backpressure holds the
    next group back.

    Args:
        sampler: free_slots() -> list of free slots; start(slot, prompt, group) starts an answer.
        prompts: an iterator of prompts (next(prompts): one per new group, once it is admitted).
        state: dict with "next_group", "group", "prompt", "left", updated in place.
        consumed: groups the trainer has consumed.
        max_lag: the lag bound in updates (>= 0).
        group_size: G, answers per prompt.
        groups_per_batch: B, groups per update.

    Returns:
        the number of answers started.
    """
    ### BEGIN SOLUTION
    started = 0
    for slot in sampler.free_slots():
        if state["left"] == 0:  # the current group is fully started: admit a new one, or stop
            k = state["next_group"]
            if k >= consumed + (max_lag + 1) * groups_per_batch:
                break  # backpressure: group k's tokens would lag more than max_lag updates
            state.update(group=k, prompt=next(prompts), left=group_size, next_group=k + 1)
        sampler.start(slot, state["prompt"], state["group"])
        state["left"] -= 1
        started += 1
    return started
    ### END SOLUTION


# %% tags=["raises-in-stub"]
class Slots:  # a sampler of n slots that prints every answer it starts
    def __init__(self, n):
        self.n, self.busy = n, set()

    def free_slots(self):
        return [s for s in range(self.n) if s not in self.busy]

    def start(self, slot, prompt, group):
        assert slot not in self.busy, f"slot {slot} is busy"
        self.busy.add(slot)
        print(f"  slot {slot}: group {group}, {prompt}")


slots, queue = Slots(6), iter(f"prompt {i}" for i in range(100))
state = {"next_group": 0, "group": -1, "prompt": None, "left": 0}
print("G = 2, B = 2, max_lag = 1: groups 0..3 may start while nothing is consumed")
print("started", refill_free_slots(slots, queue, state, 0, 1, 2, 2), "answers; state", state)
slots.busy -= {0, 1, 4, 5}  # four answers finished
print("four slots free, still nothing consumed:")
print("started", refill_free_slots(slots, queue, state, 0, 1, 2, 2), "answers (group 4 waits); state", state)
print("the trainer consumed one batch (2 groups):")
print("started", refill_free_slots(slots, queue, state, 2, 1, 2, 2), "answers; state", state)

# %% tags=["exercise-check"]
check("07_pipeline_rl", "refill_free_slots", refill_free_slots)
