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
# # Exercises 08 · Laying out the cluster
#
# This notebook is generated from `exercises/src/08_cluster_layout.py`; the worked
# solutions are in `solutions/08_cluster_layout.ipynb`. Write the function bodies where
# they raise `NotImplementedError`, run the *check yourself* cell under each one, and when
# all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/08_cluster_layout.ipynb
# ```
#
# The equations are numbered as in `lessons/08_cluster_layout.ipynb` and the docstring of
# `course_lib/layout/model.py`. These are the four pen-and-paper pieces of the lesson's
# throughput model: how many sequences one sampler GPU holds, how to split the GPUs so
# production meets consumption, how stale the pipeline's slowest sample is under an
# admission rule (and what a hard bound costs), and the continuous-batching schedule
# behind the straggler.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `max_batch`: the largest batch beside the weights | 10 | ★☆☆ | 15 min |
# | 2. `balanced_split`: production meets consumption | 10 | ★★☆ | 15 min |
# | 3. `max_lag_steps` and `hard_bound_step_s`: the maximum lag under an admission rule | 15 | ★★☆ | 25 min |
# | 4. `engine_schedule`: the continuous-batching slot refill | 15 | ★★☆ | 20 min |

# %%
import heapq
import math

import numpy as np

from course_lib import check
from course_lib.layout.model import H100_SXM, QWEN25_7B, QWEN25_32B

# %% [markdown]
# ## Exercise 1 · The largest batch beside the weights (★☆☆, 15 min, 10 points)
#
# A sampler GPU holds the model's weights and, beside them, the KV cache of every
# sequence in flight. Each token of a sequence leaves a **key and a value** vector in
# **every layer**, one per KV head:
#
# $$\text{kv\_bytes\_per\_token} = 2 \cdot n_{layers} \cdot n_{kv\_heads} \cdot \text{head\_dim} \cdot \text{kv\_bytes\_per\_elem} \qquad (08.1)$$
#
# Only `memory_fraction` of the GPU's memory is usable (the rest: activations, the CUDA
# context, fragmentation), and the weights take `weight_bytes` of it; `context_tokens` is
# what one sequence holds (the mean resident tokens of a paged cache, which keeps only the
# tokens written so far, or the full context when every sequence reserves it). The
# sequences that fit:
#
# $$\text{max\_batch} = \left\lfloor \frac{\text{memory\_fraction} \cdot \text{memory\_bytes} - \text{weight\_bytes}}{\text{kv\_bytes\_per\_token} \cdot \text{context\_tokens}} \right\rfloor \qquad (08.2)$$
#
# Inputs: `shape`, a `course_lib.layout.model.ModelShape` (attributes `n_params`, `n_layers`,
# `n_kv_heads`, `head_dim`, `weight_bytes_per_param`, `kv_bytes_per_elem`, and the property
# `weight_bytes = n_params * weight_bytes_per_param`); `gpu`, a `course_lib.layout.model.GPU`
# (attribute `memory_bytes`); `context_tokens` and `memory_fraction`. Every size is in
# **bytes**. Return an `int`. If not even one sequence fits (or the weights alone do not),
# raise `ValueError`: a batch of 0 is no sampler.
#
# **How it is graded:** Qwen2.5-7B and Qwen2.5-32B on an H100 (hand-computed: 241 and 6
# sequences of 4,096 tokens), then random shapes, GPUs and contexts against the formula
# written out term by term; the result must be an `int`, and a model that leaves no room
# must raise `ValueError`. Forgetting K and V or the layers, counting bits instead of
# bytes, rounding instead of flooring, using all the memory, taking the usable share of
# what the weights leave ($f(M - W)$ instead of $fM - W$), or not subtracting the weights
# are named in the message.


# %% tags=["exercise"]
def max_batch(shape, gpu, context_tokens, memory_fraction=0.9):
    """Sequences of ``context_tokens`` whose KV cache fits beside the weights (eq. 08.1-08.2).

    Args:
        shape: a ModelShape (n_layers, n_kv_heads, head_dim, kv_bytes_per_elem, weight_bytes).
        gpu: a GPU (memory_bytes).
        context_tokens: the KV cache one sequence holds, in tokens.
        memory_fraction: the usable share of the GPU's memory.

    Returns:
        an int >= 1; raises ValueError if not one sequence fits.
    """
    ### BEGIN SOLUTION
    kv_per_token = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem  # K and V
    free_bytes = memory_fraction * gpu.memory_bytes - shape.weight_bytes
    n = math.floor(free_bytes / (kv_per_token * context_tokens))
    if n < 1:
        raise ValueError(f"not one sequence of {context_tokens} tokens fits beside the weights")
    return n
    ### END SOLUTION


# %% tags=["raises-in-stub"]
for shape in (QWEN25_7B, QWEN25_32B):
    print(f"{shape.name} on an H100, 4,096-token context: {max_batch(shape, H100_SXM, 4096)} sequences")
print("(by hand: 241 and 6)")

# %% tags=["exercise-check"]
check("08_cluster_layout", "max_batch", max_batch)

# %% [markdown]
# ## Exercise 2 · Production meets consumption (★★☆, 15 min, 10 points)
#
# A decode step with `B` sequences in flight takes
#
# $$l(B) = a_s + b_s B$$
#
# seconds (the lesson's (08.3) when the step is memory-bound and the KV-cache term is left
# out: $a_s$ reads the weights, $b_s$ is the cost of each sequence in the batch) and gives
# each sequence one token, so a full sampler engine produces
#
# $$p = \frac{\text{max\_batch}}{l(\text{max\_batch})} \qquad (08.4)$$
#
# tokens/s, and a trainer GPU consumes `c` tokens/s. With `N` GPUs, `N_s` samplers produce
# `N_s p` and the `N - N_s` trainers consume `(N - N_s) c`; the pipeline runs at the smaller.
# The split that wastes neither side solves `N_s p = (N - N_s) c`:
#
# $$N_s^* = \frac{N c}{p + c} \qquad (08.6)$$
#
# `N_s^*` is real; a cluster needs a whole number of samplers, `1 <= N_s <= N - 1` (at
# least one of each role). The best whole split maximises `min(N_s p, (N - N_s) c)`: it is
# one of the two whole numbers around `N_s^*` (kept within `1 .. N - 1`), **not
# necessarily the nearest**; on a tie, take the fewer samplers.
#
# Inputs: `n_gpus` (an int >= 2), `max_batch`, `a_s`, `b_s` (seconds), `c` (tokens/s per
# trainer GPU). Return the tuple `(n_star, n_samplers)`: a float and an int.
#
# **How it is graded:** hand-computed splits (one where the nearest whole number is not
# the best, a tie), random rates against trying every split `1 .. N - 1`, and the
# extremes (samplers far faster or far slower than trainers). Swapping `p` and `c`, solving
# `N_s p = N c`, taking `p` per step instead of per second, rounding `N_s^*` to the
# nearest or always down, leaving the range `1 .. N - 1`, or breaking a tie towards more
# samplers are named in the message.


# %% tags=["exercise"]
def balanced_split(n_gpus, max_batch, a_s, b_s, c):
    """The balanced split of ``n_gpus`` into samplers and trainers (eq. 08.3, 08.4, 08.6).

    Returns:
        (n_star, n_samplers): the real-valued N_s* = N c / (p + c), and the whole number of
        samplers in 1 .. n_gpus - 1 with the highest min(N_s p, (N - N_s) c) (ties: fewer).
    """
    ### BEGIN SOLUTION
    p = max_batch / (a_s + b_s * max_batch)  # tokens/s of one full engine
    n_star = n_gpus * c / (p + c)
    candidates = {min(max(math.floor(n_star), 1), n_gpus - 1), min(max(math.ceil(n_star), 1), n_gpus - 1)}
    n_samplers = max(sorted(candidates), key=lambda n: min(n * p, (n_gpus - n) * c))
    return n_star, n_samplers
    ### END SOLUTION


# %% tags=["raises-in-stub"]
print(balanced_split(7, 1, 0.25, 0.0, 1.0), " (by hand: (1.4, 2))")
print(balanced_split(10, 1, 1.0, 0.0, 2.0), " (by hand: (6.67, 6): 6 and 7 samplers both run at 6 tokens/s)")

# %% tags=["exercise-check"]
check("08_cluster_layout", "balanced_split", balanced_split)

# %% [markdown]
# ## Exercise 3 · The maximum lag under an admission rule (★★☆, 25 min, 15 points)
#
# The **lag** of a sample is the number of optimizer steps between the weights that
# generated it (its first token) and the update that trains on it. The lesson's pipeline
# gives the *mean* lag (08.12); a staleness bound `max_lag` is a promise about *every*
# sample, so what it has to hold is the *maximum*. Lag grows with length: every decode
# step takes `l` seconds (`l = l(B_eff)`, the step time at the pipeline's engine batch) and
# gives each answer one token, so the longest answer, `max(L)` tokens, finishes
# `(max(L) - mean(L)) * l` seconds after the mean one. Divided by the optimizer step time
# `step_s`, that is how many more updates it misses; a sample that misses part of an update
# misses it, so round **up**:
#
# $$\text{lag}_{max} = \Big\lceil \overline{\text{lag}} + \frac{(L_{max} - \bar L)\, l}{t_{step}} \Big\rceil \qquad (08.13)$$
#
# Whether that is the answer depends on the **admission rule**, what the trainer does with
# a straggler:
#
# * `"fifo"`: the trainer takes finished samples first come, first served. Nothing stops
#   the straggler: its lag is (08.13), past `max_lag` when the longest answer is long.
# * `"wait"`: when a deadline comes, the trainer takes the oldest sample first and waits
#   for it if it is still generating. Every lag is at most `floor(max_lag)` (lags are whole
#   steps: a bound of 2.5 steps allows 2).
# * `"drop"`: a sample that would break the bound is aborted (its tokens are wasted, a cost
#   the lesson's (08.15) prices). Every lag is at most `floor(max_lag)` too.
#
# So under `"wait"` and `"drop"` the maximum lag is `min((08.13), floor(max_lag))`; under
# `"fifo"` it is (08.13) itself.
#
# **What waiting costs.** A straggler that starts on weights version `s` must be finished,
# and the weights trained on it synced to the samplers (`d = weight_sync_s` seconds),
# before update `s + floor(max_lag)` starts. So `floor(max_lag)` steps must cover the
# straggler's `L_max * l` seconds and one sync:
#
# $$t_{step} \ge \frac{L_{max}\, l + d}{\lfloor \text{max\_lag} \rfloor} \qquad (08.14)$$
#
# The right side is the shortest step a `"wait"` trainer can keep: if its trainers could go
# faster, the straggler sets the pace instead. A bound below one whole step
# (`floor(max_lag) = 0`) is synchronous RL, not a pipeline: raise `ValueError`.
#
# Write both functions in the cell below:
#
# * `max_lag_steps(mean_lag, lengths_tokens, step_latency_s, step_s, max_lag, admission)`:
#   `mean_lag` (steps, a float from (08.12)), `lengths_tokens` (one batch's answer lengths, a
#   list or an array: leave it unchanged), `step_latency_s` (`l`, seconds a decode step),
#   `step_s` (seconds an optimizer step), `max_lag` (the bound, maybe fractional) and
#   `admission` (`"fifo"`, `"wait"` or `"drop"`; anything else: raise `ValueError` whose
#   message names the three). Return an `int`. Subtract a tiny `1e-9` inside the ceiling,
#   as the lesson's model does, so float noise such as `4.000000000000001` is not a fifth step.
# * `hard_bound_step_s(lengths_tokens, step_latency_s, weight_sync_s, max_lag)`: (08.14), in
#   seconds (a float); `ValueError` when `max_lag < 1`.
#
# Worked example: a batch of 8 answers, seven of 100 tokens and one of 900 (mean 200),
# `l = 0.02` s, `step_s = 4` s, mean lag 1.3, `max_lag = 3`, `d = 1` s. The straggler
# finishes `700 * 0.02 = 14` s, 3.5 steps, after the mean answer: under `"fifo"` its lag is
# `ceil(1.3 + 3.5) = 5`, past the bound; `"wait"` and `"drop"` hold it to 3. Waiting costs:
# `(900 * 0.02 + 1) / 3 = 6.33` s a step instead of 4, 37% fewer tokens/s. With
# `max_lag = 3.5` the answers are the same (`floor(3.5) = 3`).
#
# **How it is graded:** the worked example under the three rules and a fractional
# `max_lag` (hand-computed), then random batches, latencies, step times and rules against
# (08.13) written out term by term; the result must be an `int`, the lengths left unchanged,
# and an unknown rule must raise `ValueError` naming `fifo`, `wait` and `drop`. Then
# `hard_bound_step_s`: hand-computed values and random batches against (08.14), and
# `ValueError` for `max_lag < 1`. Two hand cases sum to a whole number that floats write a
# hair above it (`15.000000000000002`). Returning the mean lag (or its ceiling) for the
# maximum, the FIFO value under a hard rule, a cap under `"fifo"`, an unfloored `max_lag`,
# the whole longest answer or its lead over the shortest instead of its lead over the mean,
# seconds instead of steps, rounding to the nearest or down, float noise counted as a step;
# in the hard bound, the mean answer or the lead for the longest, the sync forgotten or paid
# every step, an unfloored `max_lag`, or `floor(max_lag) + 1` steps are named in the message.


# %% tags=["exercise"]
def max_lag_steps(mean_lag, lengths_tokens, step_latency_s, step_s, max_lag, admission):
    """The largest lag, in optimizer steps, of a batch under ``admission`` (eq. 08.13).

    Args:
        mean_lag: the pipeline's mean lag in steps (08.12).
        lengths_tokens: one batch's answer lengths (a list or an array; left unchanged).
        step_latency_s: l, seconds per decode step at the engines' batch.
        step_s: seconds per optimizer step.
        max_lag: the staleness bound in steps (may be fractional).
        admission: "fifo", "wait" or "drop".

    Returns:
        an int: (08.13), capped at floor(max_lag) under "wait" and "drop".
    """
    ### BEGIN SOLUTION
    if admission not in ("fifo", "wait", "drop"):
        raise ValueError(f"unknown admission {admission!r}: use 'fifo', 'wait' or 'drop'")
    lengths = np.asarray(lengths_tokens, dtype=np.float64)
    lead_s = (lengths.max() - lengths.mean()) * step_latency_s  # the longest answer after the mean one
    lag = math.ceil(mean_lag + lead_s / step_s - 1e-9)  # (08.13); 1e-9: float noise is no extra step
    if admission == "fifo":  # first come, first served: nothing stops the straggler
        return lag
    return min(lag, math.floor(max_lag))  # a hard rule: every lag within floor(max_lag)
    ### END SOLUTION


def hard_bound_step_s(lengths_tokens, step_latency_s, weight_sync_s, max_lag):
    """The shortest optimizer step, in seconds, a "wait" trainer can keep (eq. 08.14).

    Returns:
        (max(L) * l + d) / floor(max_lag); raises ValueError if floor(max_lag) < 1.
    """
    ### BEGIN SOLUTION
    steps = math.floor(max_lag)  # lags are whole steps
    if steps < 1:
        raise ValueError(f"max_lag={max_lag} bounds every lag by 0 steps: that is synchronous RL, not a pipeline")
    longest = max(lengths_tokens)  # the straggler sets the pace
    return (longest * step_latency_s + weight_sync_s) / steps
    ### END SOLUTION


# %% tags=["raises-in-stub"]
lengths = [100] * 7 + [900]
for rule in ("fifo", "wait", "drop"):
    print(f"{rule}: max lag {max_lag_steps(1.3, lengths, 0.02, 4.0, 3, rule)} steps")
print(f"a 'wait' trainer's shortest step: {hard_bound_step_s(lengths, 0.02, 1.0, 3):.2f} s")
lag, step = max_lag_steps(1.3, lengths, 0.02, 4.0, 3.5, "wait"), hard_bound_step_s(lengths, 0.02, 1.0, 3.5)
print(f"max_lag 3.5, 'wait': max lag {lag} steps, shortest step {step:.2f} s")
print("(by hand: 5, 3, 3; 6.33 s; 3 steps, 6.33 s)")

# %% tags=["exercise-check"]
check("08_cluster_layout", "max_lag_steps", max_lag_steps)

# %% [markdown]
# ## Exercise 4 · The continuous-batching slot refill (★★☆, 20 min, 15 points)
#
# A sampler engine holds at most `max_batch` sequences. Each decode step gives every
# sequence in flight one token, so a sequence of `L` tokens runs for `L` consecutive steps.
# The engine's event handler at a step boundary: the sequences whose last token was just
# generated leave, and the freed slots are taken **at once** (at that same boundary) by the
# next waiting sequences, **in the given order**. At step 0 the first `max_batch`
# sequences start.
#
# Return `(start_step, end_step)`, two int64 numpy arrays of the length of `lengths`:
# sequence `j` runs during steps `start_step[j] .. end_step[j] - 1`, so
# `end_step[j] - start_step[j] = lengths[j]`, and the slot it frees is taken at step
# `end_step[j]`. The engine's step count is `end_step.max()`; with `l(B)` linear the
# generation phase of the engine lasts `a_s * steps + b_s * tokens` seconds (eq. 08.7), so
# one long answer (the straggler) adds steps at a small batch, each paying the full
# weight read `a_s`. `lengths` may be a list or an array (leave it unchanged); an empty
# one gives two empty arrays.
#
# **How it is graded:** a hand-computed schedule, random lengths and slot counts against
# a step-by-step simulation of the engine, and properties (each sequence runs for its
# length, never more than `max_batch` at once, no slot idle while a sequence waits,
# sequences start in order, the lengths list or array left unchanged). Static batching
# (waiting for the whole group), a freed slot taken one step late, an end step one short,
# shortest-first order, one slot too many, a fixed queue per slot (sequence `j` after
# sequence `j - max_batch`), or a countdown of the array you were given are named in the
# message.


# %% tags=["exercise"]
def engine_schedule(lengths, max_batch):
    """``(start_step, end_step)`` of each sequence on one continuous-batching engine.

    Args:
        lengths: [n] answer lengths in tokens (>= 1), in the order the sequences start.
        max_batch: the engine's slots.

    Returns:
        (start_step [n] int64, end_step [n] int64), end_step - start_step = lengths.
    """
    ### BEGIN SOLUTION
    lengths = np.asarray(lengths, dtype=np.int64)
    free_at = [0] * min(max_batch, lengths.size)  # the step at which each slot is free, a min-heap
    start = np.zeros(lengths.size, dtype=np.int64)
    for j, length in enumerate(lengths):
        start[j] = heapq.heappop(free_at)
        heapq.heappush(free_at, int(start[j]) + int(length))
    return start, start + lengths
    ### END SOLUTION


# %% tags=["raises-in-stub"]
start, end = engine_schedule([3, 1, 2, 4, 1], 2)
print("start", start.tolist(), "end", end.tolist(), " (by hand: [0, 0, 1, 3, 3] and [3, 1, 3, 7, 4])")

# %% tags=["exercise-check"]
check("08_cluster_layout", "engine_schedule", engine_schedule)
