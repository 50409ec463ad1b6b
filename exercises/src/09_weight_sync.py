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
# # Exercises 09 · Checkpoint-engine weight sync
#
# This notebook is generated from `exercises/src/09_weight_sync.py`; the worked
# solutions are in `solutions/09_weight_sync.ipynb`. Write the function bodies where
# they raise `NotImplementedError`, run the *check yourself* cell under each one, and when
# all pass grade the notebook from a terminal:
#
# ```
# course grade exercises/09_weight_sync.ipynb
# ```
#
# The equations are numbered as in `lessons/09_weight_sync.ipynb`. The first four are the
# pieces of a bucketed, pipelined, resharding, verified weight update; the fifth is the
# lesson's model of how long such an update takes.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `pack_buckets`: tensors into flat buckets at aligned offsets | 15 | ★★☆ | 20 min |
# | 2. `pipeline_schedule`: the double-buffered schedule | 10 | ★☆☆ | 15 min |
# | 3. `shard_range`: which rows a tensor-parallel rank keeps | 10 | ★☆☆ | 10 min |
# | 4. `verify_bucket`: versions, order and checksums | 15 | ★★☆ | 20 min |
# | 5. `update_time`: naive, per-tensor, bucketed and pipelined updates timed | 15 | ★★☆ | 25 min |

# %%
import numpy as np
import torch

from course_lib import check
from course_lib.weight_sync.integrity import HEADER_BYTES, MAGIC, CorruptBucketError, OutOfOrderBucketError

# %% [markdown]
# ## Exercise 1 · Packing tensors into buckets (★★☆, 20 min, 15 points)
#
# A bucketed broadcast sends a few big flat buffers instead of hundreds of tensors. Both
# sides agree once on a **plan**: for every tensor, the bucket it lives in and its byte
# offset there (the $n$ buckets of (09.2)). Build the plan greedily, in order:
#
# - a tensor goes at the current bucket's next offset if it **ends** within `bucket_bytes`;
#   otherwise it starts a new bucket at offset 0;
# - a tensor larger than `bucket_bytes` therefore sits alone in a bucket of its own (never
#   open an empty bucket before it);
# - after a tensor, the next offset is its end rounded **up** to a multiple of `align`
#   (so every tensor starts aligned for its dtype and for an 8-byte checksum);
# - a bucket's length is its last tensor's end rounded up to `align`.
#
# Then copy each tensor's **bytes** into its bucket (`t.reshape(-1).view(torch.uint8)` is a
# tensor's bytes, its elements in logical order). Tensors may have different dtypes (`float32`,
# `bfloat16`, `int64`) and may be views of larger tensors (a slice, a transposed matrix), as a
# model's state dict can hold them: sizes are in bytes, `t.numel() * t.element_size()`, never
# in elements and never the size of the storage behind a view.
#
# Return `(buckets, places)`: `buckets` a list of 1-D `torch.uint8` tensors,
# `places` a list with one `(bucket_index, byte_offset)` tuple of ints per tensor.
# Unpacking is then a view: `buckets[b][o:o + nbytes].view(t.dtype).view(t.shape)`.
#
# **How it is graded:** against a byte-by-byte oracle that builds each bucket as a Python
# `bytearray`, on tensors of mixed dtypes and sizes (many small ones, some larger than a
# bucket), with bucket sizes that are and are not multiples of `align`; the places must match
# exactly, every bucket's bytes must match (padding zero), unpacking at your offsets must give
# back every tensor, views, slices and transposed tensors are packed by the bytes they show,
# inputs are unchanged. Common slips (offsets in elements, no alignment, the fit tested on the
# aligned end, an empty bucket before an oversized tensor, `>=` instead of `>`, a view's
# storage size) are named in the message.

# %% tags=["exercise"]
def pack_buckets(tensors, bucket_bytes, align=64):
    """Greedy in-order bucket plan and the packed buckets (the buckets of eq. 09.2).

    Args:
        tensors: list of torch tensors (any shapes and dtypes).
        bucket_bytes: int, the largest bucket (a bigger tensor gets a bucket of its own).
        align: int, every offset and every bucket length is a multiple of it.

    Returns:
        (buckets, places): list of 1-D uint8 tensors; list of (bucket index, byte offset) per tensor.
    """
    ### BEGIN SOLUTION
    places, sizes = [], []
    offset = 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if not sizes or (offset > 0 and offset + nbytes > bucket_bytes):
            sizes.append(0)
            offset = 0
        places.append((len(sizes) - 1, offset))
        offset = -(-(offset + nbytes) // align) * align
        sizes[-1] = offset
    buckets = [torch.zeros(size, dtype=torch.uint8) for size in sizes]
    for t, (b, off) in zip(tensors, places):
        nbytes = t.numel() * t.element_size()
        buckets[b][off:off + nbytes] = t.contiguous().reshape(-1).view(torch.uint8)
    return buckets, places
    ### END SOLUTION


# %% tags=["raises-in-stub"]
example = [torch.ones(3), torch.arange(5, dtype=torch.int64), torch.zeros(40), torch.full((2,), 2.0, dtype=torch.bfloat16)]
buckets, places = pack_buckets(example, bucket_bytes=128, align=16)
print("places:", places, "| bucket lengths:", [b.numel() for b in buckets])
print("tensor 1 unpacked:", buckets[places[1][0]][places[1][1]:places[1][1] + 40].view(torch.int64).tolist())

# %% tags=["exercise-check"]
check("09_weight_sync", "pack_buckets", pack_buckets)

# %% [markdown]
# ## Exercise 2 · The double-buffered pipeline (★☆☆, 15 min, 10 points)
#
# Three stages move a bucket: the sender **packs** it into a buffer, the link **sends** it
# (into the receiver's buffer), the receiver **unpacks** it into the model. Done in turn,
# `n` buckets take `3n` steps. With two buffers on each side (ping-pong), bucket `b` uses
# buffer `b % 2` on both sides, and in step `s` the three stages work on three different
# buckets at once (the schedule whose time (09.3) models):
#
# $$\text{step } s:\quad \text{pack } s,\quad \text{send } s - 1,\quad \text{unpack } s - 2 \qquad (s = 0, \dots, n + 1)$$
#
# leaving out the buckets that do not exist (below 0 or from `n` on). Return the schedule
# as a list of `n + 2` steps (`[]` for `n = 0`); each step a list of `(stage, bucket, buffer)`
# tuples in the order pack, send, unpack, e.g. step 2 of a long update is
# `[("pack", 2, 0), ("send", 1, 1), ("unpack", 0, 0)]`.
#
# **How it is graded:** against the schedule written out by hand for small `n`, per-bucket
# timelines up to `n = 40`, and properties for `n` up to 9: `n + 2` steps; every bucket packed, then sent, then unpacked,
# in consecutive steps; the two stages of one side never use the same buffer in the same
# step (the sender's pack and send, the receiver's receive and unpack). A schedule that
# does not overlap, a buffer per bucket, or an unpack in the step of its own send are
# named in the message.

# %% tags=["exercise"]
def pipeline_schedule(n_buckets):
    """The double-buffered schedule that eq. 09.3 times: list of steps, each a list of (stage, bucket, buffer).

    Args:
        n_buckets: int >= 0.

    Returns:
        list of n_buckets + 2 steps ([] when n_buckets == 0).
    """
    ### BEGIN SOLUTION
    if n_buckets == 0:
        return []
    steps = []
    for s in range(n_buckets + 2):
        step = []
        for stage, b in (("pack", s), ("send", s - 1), ("unpack", s - 2)):
            if 0 <= b < n_buckets:
                step.append((stage, b, b % 2))
        steps.append(step)
    return steps
    ### END SOLUTION


# %% tags=["raises-in-stub"]
for s, step in enumerate(pipeline_schedule(3)):
    print(f"step {s}: {step}")

# %% tags=["exercise-check"]
check("09_weight_sync", "pipeline_schedule", pipeline_schedule)

# %% [markdown]
# ## Exercise 3 · Which rows a tensor-parallel rank keeps (★☆☆, 10 min, 10 points)
#
# With resharding on the receiving side, every receiver gets the whole bucket but keeps
# only its shard of each matrix: the rows (or columns) that its tensor-parallel rank owns
# (eq. 09.5). Split a dimension of `size` rows over `tp_size` ranks as evenly as possible,
# the first `size % tp_size` ranks taking one extra row:
#
# $$q, m = \operatorname{divmod}(\text{size}, \text{tp}), \qquad
#   \text{start}_r = r\,q + \min(r, m), \qquad \text{stop}_r = \text{start}_r + q + [r < m]. \qquad (09.5)$$
#
# Return `(start, stop)` as ints. Raise `ValueError` if `tp_size < 1` or `tp_rank` is not
# in `[0, tp_size)`. (`torch.chunk` splits differently: ceil-sized chunks, the last one short
# or missing, so it is not this split.)
#
# **How it is graded:** known values; for many `(size, tp_size)` the shards must tile
# `[0, size)` in rank order, differ by at most one row, extra rows on the first ranks,
# empty shards allowed when `size < tp_size` (compared with an oracle that deals rows one
# by one like cards); `ValueError` for a bad rank or `tp_size`.

# %% tags=["exercise"]
def shard_range(size, tp_rank, tp_size):
    """[start, stop) of rank tp_rank's rows when `size` rows are split over tp_size ranks (eq. 09.5)."""
    ### BEGIN SOLUTION
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank}")
    q, m = divmod(size, tp_size)
    start = tp_rank * q + min(tp_rank, m)
    return start, start + q + (1 if tp_rank < m else 0)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
print("10 rows over 4 ranks:", [shard_range(10, r, 4) for r in range(4)])
weight = torch.arange(10 * 3).reshape(10, 3)
start, stop = shard_range(10, 1, 4)
print("rank 1 keeps rows", list(range(start, stop)), "->", weight[start:stop].tolist())

# %% tags=["exercise-check"]
check("09_weight_sync", "shard_range", shard_range)

# %% [markdown]
# ## Exercise 4 · Verifying a bucket (★★☆, 20 min, 15 points)
#
# A received bucket is a flat `uint8` tensor `slot`: the payload, then a header of
# `HEADER_BYTES = 64` bytes, eight little-endian `int64` words:
# `[MAGIC, version, index, n_buckets, nbytes, checksum, 0, 0]`. The checksum is
# **sum64**: the payload read as unsigned 64-bit words, summed modulo $2^{64}$ (eq. 09.6).
# The header keeps it in a signed `int64` word with the same 64 bits, so compare it with
# `words[5] % 2**64` (Python's `%` turns a negative word back into the unsigned value):
#
# $$\text{sum64}(p) = \sum_{k} w_k \bmod 2^{64}, \qquad w_k = \text{bytes } 8k..8k+7 \text{ of } p \text{ (little-endian)}. \qquad (09.6)$$
#
# Check, in this order, and raise the first problem found:
#
# 1. word 0 is not `MAGIC`: `CorruptBucketError` (not a bucket at all);
# 2. `version != expected_version`: `OutOfOrderBucketError` (a stale or future update);
# 3. `index != expected_index`: `OutOfOrderBucketError` (out of order: repeated or skipped);
# 4. `nbytes` differs from the payload's length: `CorruptBucketError`;
# 5. the checksum differs: `CorruptBucketError`.
#
# If all hold, return the payload (the first `len(slot) - HEADER_BYTES` bytes). Do not
# modify `slot`.
#
# **How it is graded:** against an oracle that adds the words as Python integers one by
# one, on random buckets: good buckets pass and the payload comes back, those whose checksum
# has its top bit set (about half) too; one flipped bit anywhere in the payload (the top bit
# of a word too), a damaged magic number, a wrong size, a stale or future version, a repeated
# or skipped index each raise the right error; a bucket with two faults raises the first in
# the order above; words whose sum overflows 64 bits check (mod $2^{64}$); the header is not
# part of the checksum; the slot is unchanged. Forgetting the wrap-around, a signed
# comparison, summing the header too, checking the checksum before the header, or mixing up
# the two errors are named in the message.

# %% tags=["exercise"]
def verify_bucket(slot, expected_version, expected_index):
    """Check a received bucket (eq. 09.6); return its payload or raise.

    Args:
        slot: 1-D uint8 tensor, payload + 64-byte header.
        expected_version, expected_index: ints.

    Raises:
        CorruptBucketError: bad magic, size or checksum.
        OutOfOrderBucketError: wrong version or index.
    """
    ### BEGIN SOLUTION
    words = slot[-HEADER_BYTES:].view(torch.int64).tolist()
    magic, version, index, _, nbytes, sent = words[:6]
    payload = slot[:-HEADER_BYTES]
    if magic != MAGIC:
        raise CorruptBucketError("bad magic number: not a bucket")
    if version != expected_version:
        raise OutOfOrderBucketError(f"version {version}, expected {expected_version}")
    if index != expected_index:
        raise OutOfOrderBucketError(f"bucket {index}, expected {expected_index}")
    if nbytes != payload.numel():
        raise CorruptBucketError(f"header says {nbytes} bytes, payload has {payload.numel()}")
    total = int(np.add.reduce(payload.numpy().view(np.uint64), dtype=np.uint64))
    if total != sent % 2**64:
        raise CorruptBucketError("checksum mismatch")
    return payload
    ### END SOLUTION


# %% tags=["raises-in-stub"]
from course_lib.weight_sync.integrity import BucketHeader, checksum

payload = torch.arange(32, dtype=torch.float32).view(torch.uint8)
slot = torch.cat([payload, torch.zeros(HEADER_BYTES, dtype=torch.uint8)])
BucketHeader(version=7, index=0, n_buckets=1, nbytes=payload.numel(), checksum=checksum(payload)).write(slot)
print("good bucket:", verify_bucket(slot, 7, 0).numel(), "payload bytes")
for name, version, flip in (("stale", 6, False), ("corrupt", 7, True)):
    bad = slot.clone()
    if flip:
        bad[5] ^= 4
    try:
        verify_bucket(bad, version, 0)
    except (CorruptBucketError, OutOfOrderBucketError) as exc:
        print(f"{name}: {type(exc).__name__}")

# %% tags=["exercise-check"]
check("09_weight_sync", "verify_bucket", verify_bucket)

# %% [markdown]
# ## Exercise 5 · The time of an update (★★☆, 25 min, 15 points)
#
# Before any of the pieces above run, the lesson's model says how long an update takes and
# which term dominates it. Write that model for an update of $B$ bytes in $k$ tensors from
# one sender to one receiver, with the rates in a dict `rates`:
#
# | key | what | unit |
# |---|---|---|
# | `alpha` | $\alpha$, the fixed latency of one message | s |
# | `beta` | $\beta$, the link bandwidth | bytes/s |
# | `sigma`, `rho` | $\sigma$ and $\rho$, the stage (pack) and reload (unpack) rates | bytes/s |
# | `gamma` | $\gamma$, the fixed cost of one tensor on one side (one small copy) | s |
# | `eta` | $\eta$, the pipeline's overlap efficiency (1 ideal, 0 stages in turn, below 0 worse) | |
# | `write`, `read` | the shared storage's write and read bandwidth of the naive path | bytes/s |
#
# `update_time(method, nbytes, n_tensors, bucket_bytes, rates)` returns the seconds of one
# update by `method`:
#
# - `"naive"`: the sender saves a checkpoint to shared storage, the receiver reads it back
#   and reloads it: $B / \text{write} + B / \text{read} + B / \rho$ (the lesson's
#   $T_{\text{naive}}$ with $N = 1$);
# - `"per_tensor"`: one message per tensor, each tensor sent as it is (no stage, no
#   reload): (09.1) with $n = k$;
# - `"bucketed"`: (09.2), with $n = \lceil B / \text{bucket\_bytes} \rceil$ buckets;
# - `"pipelined"`: (09.3) on the same $n$ buckets. The model's buckets are **equal**, of
#   $b = B / n$ bytes each (unlike exercise 1's greedy plan), and each bucket's stage and
#   reload carry their share $k\gamma / n$ of the per-tensor cost, so a bucket's three
#   stages take
#
# $$\frac{b}{\sigma} + \frac{k\gamma}{n}, \qquad \alpha + \frac{b}{\beta}, \qquad \frac{b}{\rho} + \frac{k\gamma}{n},$$
#
#   $t_1$ is their sum and $m$ their maximum:
#   $T_{\text{pipelined}} = t_1 + (n - 1)\,[m + (1 - \eta)(t_1 - m)]$. With $\eta = 0$ this is
#   (09.2) again, and with one bucket there is nothing to overlap.
#
# Raise `ValueError` for any other method. Do not change `rates`.
#
# **How it is graded:** not against these formulas but against a simulation that walks
# every message and every bucket through the three stages and the two buffers of each side
# (exercise 2's schedule with durations), blending the stages side by side and in turn by
# $\eta$: hand-computed values for a 1 GB update by each method; 30 random updates with rates
# over orders of magnitude, bucket sizes that divide $B$, do not, or exceed it, and $\eta$ from
# −0.5 to 1; pipelined updates in which each stage in turn, and then the message latency, is
# the slowest ($\eta = 1$); one bucket and $\eta = 0$ give the bucketed time; over bucket sizes
# from $B / 4096$ to $B$ your pipelined time must be smallest where the simulation's is. A
# missing ceiling, buckets of `bucket_bytes` instead of $B / n$, a forgotten fill $t_1$, $\eta$ the
# wrong way round, the latency left out of the pace, the per-tensor cost counted once or not
# shared among the buckets, and per-tensor updates charged a stage and a reload are named in
# the message.


# %% tags=["exercise"]
def update_time(method, nbytes, n_tensors, bucket_bytes, rates):
    """Predicted seconds of one weight update by ``method`` (eq. 09.1-09.3 and the naive path).

    Args:
        method: "naive", "per_tensor", "bucketed" or "pipelined".
        nbytes: B, the bytes of the update (int > 0).
        n_tensors: k, the number of tensors (int >= 1).
        bucket_bytes: the largest bucket (int > 0); the update is cut into ceil(B / bucket_bytes) equal buckets.
        rates: dict with alpha, beta, sigma, rho, gamma, eta, write, read (see the table above).

    Returns:
        seconds, a float.
    """
    ### BEGIN SOLUTION
    B, k = nbytes, n_tensors
    alpha, beta, sigma, rho, gamma = (rates[name] for name in ("alpha", "beta", "sigma", "rho", "gamma"))
    if method == "naive":
        return B / rates["write"] + B / rates["read"] + B / rho
    if method == "per_tensor":
        return k * alpha + B / beta
    if method not in ("bucketed", "pipelined"):
        raise ValueError(f"unknown method {method!r}")
    n = -(-B // bucket_bytes)
    if method == "bucketed":
        return n * alpha + B / beta + B / sigma + B / rho + 2 * k * gamma
    b = B / n
    stages = (b / sigma + k * gamma / n, alpha + b / beta, b / rho + k * gamma / n)
    t_1, m = sum(stages), max(stages)
    return t_1 + (n - 1) * (m + (1 - rates["eta"]) * (t_1 - m))
    ### END SOLUTION


# %% tags=["raises-in-stub"]
laptop = {"alpha": 250e-6, "beta": 4.2e9, "sigma": 7.7e9, "rho": 7.9e9, "gamma": 7e-6, "eta": 0.0,
          "write": 1.2e9, "read": 1.2e9}  # about the rates section 8 of the lesson fitted on two CPU cores
gpus = {"alpha": 50e-6, "beta": 50e9, "sigma": 100e9, "rho": 1000e9, "gamma": 1e-6, "eta": 1.0,
        "write": 10e9, "read": 50e9}  # the calculator's assumed GPU cluster (lesson, section 9), plus 1 us a tensor
B, k = 16 * 10**9, 20_000  # an 8B-parameter mixture-of-experts model in bf16: many small tensors
print(f"{'method':>10} {'2 CPU cores':>12} {'GPU node':>9}   (seconds, 1 GB buckets)")
for method in ("naive", "per_tensor", "bucketed", "pipelined"):
    here, there = update_time(method, B, k, 10**9, laptop), update_time(method, B, k, 10**9, gpus)
    print(f"{method:>10} {here:>12.2f} {there:>9.3f}")
sweep = {2**j: update_time("pipelined", B, k, 2**j, gpus) for j in range(20, 35, 2)}
print("pipelined on the GPU node by bucket size:", ", ".join(f"{b / 2**20:g} MiB {t:.3f} s" for b, t in sweep.items()))

# %% tags=["exercise-check"]
check("09_weight_sync", "update_time", update_time)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/09_weight_sync.ipynb`.
