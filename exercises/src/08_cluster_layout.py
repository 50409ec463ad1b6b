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
# The equations are numbered as in `lessons/08_cluster_layout.ipynb`. These are the four
# pen-and-paper pieces of the lesson's throughput model: how many sequences one sampler
# GPU holds, how to split the GPUs so production meets consumption, how stale a layout's
# samples are, and the continuous-batching schedule behind the straggler.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `max_batch`: the largest batch beside the weights | 10 | ★☆☆ | 15 min |
# | 2. `balanced_split`: production meets consumption | 10 | ★★☆ | 15 min |
# | 3. `mean_lag`: how stale a layout's samples are | 15 | ★★☆ | 25 min |
# | 4. `engine_schedule`: the continuous-batching slot refill | 15 | ★★☆ | 20 min |

# %%
import heapq
import math

import numpy as np

from course_lib import check
from course_lib.layout import H100_SXM, QWEN25_7B, QWEN25_32B, SystemSpec

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
# context, fragmentation), and the weights take `weight_bytes` of it; a sequence reserves
# the cache of `context_tokens` tokens. The sequences that fit:
#
# $$\text{max\_batch} = \left\lfloor \frac{\text{memory\_fraction} \cdot \text{memory\_bytes} - \text{weight\_bytes}}{\text{kv\_bytes\_per\_token} \cdot \text{context\_tokens}} \right\rfloor \qquad (08.2)$$
#
# Inputs: `shape`, a `course_lib.layout.ModelShape` (attributes `n_params`, `n_layers`,
# `n_kv_heads`, `head_dim`, `weight_bytes_per_param`, `kv_bytes_per_elem`, and the property
# `weight_bytes = n_params * weight_bytes_per_param`); `gpu`, a `course_lib.layout.GPU`
# (attribute `memory_bytes`); `context_tokens` and `memory_fraction`. Every size is in
# **bytes**. Return an `int`. If not even one sequence fits (or the weights alone do not),
# raise `ValueError`: a batch of 0 is no sampler.
#
# **How it is graded:** Qwen2.5-7B and Qwen2.5-32B on an H100 (hand-computed: 241 and 6
# sequences of 4,096 tokens), then random shapes, GPUs and contexts against the formula
# written out term by term; the result must be an `int`, and a model that leaves no room
# must raise `ValueError`. Forgetting K and V or the layers, counting bits instead of
# bytes, rounding instead of flooring, using all the memory, or not subtracting the
# weights are named in the message.
#
# <details><summary>Hint 1</summary>
# Three steps: the bytes one token occupies (08.1), the bytes left for the cache
# (<code>memory_fraction * gpu.memory_bytes - shape.weight_bytes</code>), then how many
# whole sequences of <code>context_tokens</code> fit in them.
# </details>
# <details><summary>Hint 2</summary>
# <code>math.floor(free_bytes / (kv_per_token * context_tokens))</code> is an <code>int</code>
# (round down: a sequence that fits only partly does not fit); raise <code>ValueError</code>
# when it is below 1.
# </details>
# <details><summary>Hint 3</summary>
# Qwen2.5-7B in bf16: <code>2 * 28 * 4 * 128 * 2 = 57,344</code> bytes a token; on an H100,
# <code>0.9 * 80e9 - 15.24e9 = 56.76e9</code> bytes are left, 241.6 sequences of 4,096 tokens.
# </details>


# %% tags=["exercise"]
def max_batch(shape, gpu, context_tokens, memory_fraction=0.9):
    """Sequences of ``context_tokens`` whose KV cache fits beside the weights (eq. 08.1-08.2).

    Args:
        shape: a ModelShape (n_layers, n_kv_heads, head_dim, kv_bytes_per_elem, weight_bytes).
        gpu: a GPU (memory_bytes).
        context_tokens: the KV cache reserved per sequence, in tokens.
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
# $$l(B) = a_s + b_s B \qquad (08.3)$$
#
# seconds and gives each sequence one token, so a full sampler engine produces
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
#
# <details><summary>Hint 1</summary>
# <code>p = max_batch / (a_s + b_s * max_batch)</code>, then (08.6). For the whole split,
# compare the throughput <code>min(n * p, (n_gpus - n) * c)</code> of the two candidates.
# </details>
# <details><summary>Hint 2</summary>
# The candidates are <code>math.floor(n_star)</code> and <code>math.ceil(n_star)</code>, each
# clipped to <code>1 .. n_gpus - 1</code>; try them in increasing order and keep the first best
# (<code>max(sorted(candidates), key=...)</code> keeps the first on a tie).
# </details>
# <details><summary>Hint 3</summary>
# With <code>p = 4</code>, <code>c = 1</code> and 7 GPUs, <code>N_s^* = 1.4</code>: 1 sampler gives
# <code>min(4, 6) = 4</code> tokens/s, 2 samplers <code>min(8, 5) = 5</code>. The nearest is not the best.
# </details>


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
# ## Exercise 3 · How stale a layout's samples are (★★☆, 25 min, 15 points)
#
# The **lag** of a sample is the number of optimizer steps between the weights that
# generated it and the step that trains on it. The synchronous layouts (`"sync_colocated"`,
# `"sync_split"`) have lag 0; `"one_step"` generates batch `k + 1` while the trainer works
# on batch `k`, so its lag is 1. The `"pipeline"` never waits: its backpressure admits a
# new sequence only while fewer than `(max_lag + 1)` batches are held, which leaves
# `max_lag * batch_samples` sequences in flight over `N_s` engines, so each engine runs
#
# $$B_{eff} = \min\Big(\text{max\_batch},\ \frac{\text{max\_lag} \cdot \text{batch\_samples}}{N_s}\Big), \qquad \text{tokens\_per\_s} = \min\Big(\frac{N_s B_{eff}}{l(B_{eff})},\ N_t c\Big) \qquad (08.11)$$
#
# Little's law gives its mean lag: a sample waits in flight (`N_s B_eff` sequences) and in
# the queue (about half a batch), and the weight sync adds `d / step_s`, with `d =
# weight_sync_s` and `step_s = G / tokens_per_s` (`G` = generated tokens per batch):
#
# $$\text{mean\_lag} = \min\Big(\text{max\_lag},\ \frac{N_s B_{eff} + \text{batch\_samples}/2}{\text{batch\_samples}} + \frac{d}{\text{step\_s}}\Big) \qquad (08.12)$$
#
# When the trainers are the bottleneck (`N_t c <= N_s B_eff / l(B_eff)`), the queue fills
# until the cap binds: the system holds exactly `max_lag + 1` batches and the mean lag is
# `max_lag`. With `max_lag = 0` the pipeline admits one batch at a time: lag 0.
#
# Inputs: `layout`, one of the four names above (anything else: raise `ValueError`);
# `spec`, a `course_lib.layout.SystemSpec` with `n_gpus` (`N`), `n_samplers` (`N_s`;
# `n_trainers = N - N_s`), `batch_samples`, `max_batch`, `a_s`, `b_s`,
# `train_tokens_per_s_per_gpu` (`c`), `batch_tokens` (`G`), `weight_sync_s` and `max_lag`.
# In every graded spec, `max_lag * batch_samples >= n_samplers` (each engine holds at
# least one sequence). Return a float (steps).
#
# **How it is graded:** hand-computed lags of the four layouts on one spec (engines full,
# the cap binding, the trainers the bottleneck, a weight sync), then random specs against
# the two equations written out; an unknown layout must raise `ValueError`. One-step at lag
# 0, a pipeline without the cap `max_lag`, without the trainer-bound rule, without the
# queued half batch or the weight sync, with engines always at `max_batch` (no
# backpressure), or counting the batch in training as one more step are named in the message.
#
# <details><summary>Hint 1</summary>
# Branch on the layout first. For the pipeline: <code>B_eff</code>, then production
# <code>N_s * B_eff / (a_s + b_s * B_eff)</code> and consumption <code>N_t * c</code> (tokens/s);
# if consumption is at most production, the answer is <code>max_lag</code>.
# </details>
# <details><summary>Hint 2</summary>
# Otherwise the pipeline runs at the production rate: <code>step_s = spec.batch_tokens /
# production</code>; then (08.12), capped at <code>max_lag</code>. Return early when
# <code>max_lag == 0</code> (there is no sequence in flight to divide by).
# </details>
# <details><summary>Hint 3</summary>
# 8 GPUs, 4 samplers, batches of 64 answers of 256 tokens, <code>max_batch = 32</code>,
# <code>l(B) = 0.01 + 0.0005 B</code>, <code>c = 5000</code>, <code>max_lag = 4</code>,
# <code>d = 0.5</code>: <code>B_eff = 32</code>, production 4,923 tokens/s (consumption 20,000),
# <code>step_s = 3.33</code> s, mean lag <code>(128 + 32) / 64 + 0.5 / 3.33 = 2.65</code>.
# </details>


# %% tags=["exercise"]
def mean_lag(layout, spec):
    """The mean lag, in optimizer steps, of ``layout`` on ``spec`` (eq. 08.11-08.12).

    Returns:
        a float: 0 for the synchronous layouts, 1 for one_step, (08.12) for the pipeline.
    """
    ### BEGIN SOLUTION
    if layout in ("sync_colocated", "sync_split"):
        return 0.0
    if layout == "one_step":
        return 1.0
    if layout != "pipeline":
        raise ValueError(f"unknown layout {layout!r}")
    if spec.max_lag == 0:  # one batch at a time: the synchronous split
        return 0.0
    n_s = spec.n_samplers
    b_eff = min(spec.max_batch, spec.max_lag * spec.batch_samples / n_s)  # backpressure
    production = n_s * b_eff / (spec.a_s + spec.b_s * b_eff)
    consumption = (spec.n_gpus - n_s) * spec.train_tokens_per_s_per_gpu
    if consumption <= production:  # the trainers are the bottleneck: the cap binds
        return float(spec.max_lag)
    step_s = spec.batch_tokens / production
    little = (n_s * b_eff + spec.batch_samples / 2) / spec.batch_samples + spec.weight_sync_s / step_s
    return min(float(spec.max_lag), little)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
spec = SystemSpec(
    n_gpus=8,
    n_samplers=4,
    batch_samples=64,
    max_batch=32,
    a_s=0.01,
    b_s=0.0005,
    train_tokens_per_s_per_gpu=5000.0,
    answer_tokens=256,
    weight_sync_s=0.5,
    max_lag=4,
)
for layout in ("sync_colocated", "sync_split", "one_step", "pipeline"):
    print(f"{layout:15s} mean lag {mean_lag(layout, spec):.3f}")
print("(by hand: 0, 0, 1 and 2.650)")

# %% tags=["exercise-check"]
check("08_cluster_layout", "mean_lag", mean_lag)

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
# sequences start in order). Static batching (waiting for the whole group), a freed slot
# taken one step late, an end step one short, shortest-first order, or one slot too many are
# named in the message.
#
# <details><summary>Hint 1</summary>
# Keep, for every slot, the step at which it is next free (all 0 at first). Sequence
# <code>j</code> starts at the earliest of them; that slot is then free at
# <code>start + lengths[j]</code>.
# </details>
# <details><summary>Hint 2</summary>
# A min-heap does it in O(log B) a sequence: <code>free_at = [0] * min(max_batch, n)</code>;
# for each sequence <code>s = heapq.heappop(free_at)</code>, record it, then
# <code>heapq.heappush(free_at, s + length)</code>.
# </details>
# <details><summary>Hint 3</summary>
# Lengths <code>[3, 1, 2, 4, 1]</code> on 2 slots: starts <code>[0, 0, 1, 3, 3]</code>, ends
# <code>[3, 1, 3, 7, 4]</code>; the engine runs 7 steps.
# </details>


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
