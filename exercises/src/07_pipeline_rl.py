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
# | 3. `time_to_target` | 10 | ★★☆ | 15 min |
# | 4. `inflight_decode` | 15 | ★★☆ | 20 min |
# | 5. `refill_free_slots` | 15 | ★★☆ | 20 min |

# %%
import math

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
# ## Exercise 3 · Time to a reward level, from a reward-vs-wall-clock curve (★★☆, 15 min, 10 points)
#
# The lesson compares runs at equal wall-clock; PipelineRL's paper reads its learning
# curves the other way: how long a run takes to reach a reward level. A run logs,
# for every update `i`, the wall-clock time `times[i]` (seconds since the start) and the
# mean reward of the batch it trained on, `rewards[i]`. One batch is noisy, so the run is
# judged on the trailing mean over the last `window` batches,
#
# $$\bar r_i = \frac{1}{\text{window}} \sum_{j=i-\text{window}+1}^{i} r_j \qquad \text{(full windows only: } i \ge \text{window} - 1\text{)},$$
#
# and its **time to target** is `times[i]` at the first `i` with $\bar r_i \ge$ `target`,
# or `math.inf` if that never happens. Inputs: `times`, `rewards`, 1-D arrays or lists of
# the same length; `target` a float; `window` an integer >= 1. Return a float.
#
# **How it is graded:** against a loop that averages each full window from scratch, on
# random curves at several targets and windows; hand-computed values; properties: a target
# never reached gives `math.inf`, a higher target is never reached sooner, shifting every
# time by a constant shifts the answer by it. Counting the partial windows at the start
# (one lucky first batch), a centred window, returning the update index instead of the
# time, the last crossing instead of the first, a strict `>`, or `None` for "never" are
# named in the message.

# %% tags=["exercise"]
def time_to_target(times, rewards, target, window):
    """Wall-clock time at which the trailing mean of `window` batch rewards first reaches `target`.

    Returns:
        a float: times[i] of the first full window ending at i with mean >= target; math.inf if none.
    """
    ### BEGIN SOLUTION
    r = np.asarray(rewards, dtype=np.float64)
    means = np.convolve(r, np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(means >= target)
    if hits.size == 0:
        return math.inf
    return float(np.asarray(times, dtype=np.float64)[hits[0] + window - 1])
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# updates every 10 s; one lucky first batch, then a real rise
print(time_to_target([10, 20, 30, 40, 50, 60], [1.0, 0.0, 0.0, 0.0, 1.0, 1.0], 0.75, 2),
      " (by hand: 60.0; the window [1.0, 0.0] ending at 20 s has mean 0.5)")

# %% tags=["exercise-check"]
check("07_pipeline_rl", "time_to_target", time_to_target)

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
