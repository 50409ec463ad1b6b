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
# # 09 · Checkpoint-engine weight sync: from minutes to seconds
#
# In RL post-training the trainer updates the weights and the inference engines that
# generate the next rollouts must get them, every step. Lesson 07 moved weights between
# processes as one object; here we look at **how** they move, because at scale it decides
# how long the GPUs of the inference fleet sit idle. **Moving fresh weights is a
# bandwidth problem.** The naive way (save a checkpoint, let every engine load it) goes
# through storage twice and takes minutes for a large model. A broadcast over the
# interconnect sends each byte once per link; sending a few large **buckets** instead of
# hundreds of tensors removes the per-message cost; **pipelining** the three stages
# (stage into a buffer, transfer, reload into the engine) hides all but the slowest; and
# **resharding on the receiving side** lets each engine keep only its tensor-parallel
# shard. MoonshotAI's checkpoint-engine does exactly this and updates the 1-trillion-parameter
# Kimi-K2 across 256 GPUs in about 16 seconds.
#
# **Learning goals**
# 1. Write down the time of an update (09.1-09.5) and say which term dominates for each method.
# 2. Build bucket plans (names, shapes, dtypes, byte offsets sent once), pack and unpack them.
# 3. Run five weight-sync methods between real processes (torch.distributed, gloo) and measure
#    latency and effective bandwidth against the single-buffer roofline, from 16 MiB up.
# 4. Make an update safe: versions, a checksum per bucket, all-or-nothing commits; watch a
#    corrupt bucket, an out-of-order bucket, a shape mismatch and a killed sender be rejected.
# 5. Measure what bf16 and delta updates cost in accuracy, and what resharding saves in memory.
# 6. Calibrate an analytic model on these measurements and extrapolate it to a 1T-parameter
#    model on hundreds of GPUs.
#
# Builds on lesson 07 (in-flight weight updates between processes).

# %%
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib.scale import current_scale, pick

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")

# %% [markdown]
# ## Key equations
#
# An update moves $B$ bytes from a sender to $N$ receivers. A message costs a fixed
# latency $\alpha$ (software, synchronisation) plus its bytes over the link bandwidth
# $\beta$. Sending $n$ messages (**transfer**):
#
# $$T_{x} = n\,\alpha + \frac{B}{\beta}. \qquad (09.1)$$
#
# With $n = 1$ (one flat buffer, already packed) this is the **roofline**; with one
# message per tensor, $n$ is in the hundreds (thousands for mixture-of-experts models).
# **Bucketing** packs the tensors into $n = \lceil B / b \rceil$ buckets of $b$ bytes, at
# the price of a **stage** (pack, at rate $\sigma$; on GPUs the host-to-device copy) and a
# **reload** (unpack into the engine's weights, rate $\rho$). Done one after the other:
#
# $$T_{\text{bucketed}} = n\,\alpha + \frac{B}{\beta} + \frac{B}{\sigma} + \frac{B}{\rho}. \qquad (09.2)$$
#
# With two buffers on each side (ping-pong) bucket $b+1$ is staged while bucket $b$ is on
# the wire and bucket $b-1$ is being reloaded; after the first bucket, the slowest stage
# sets the pace:
#
# $$T_{\text{pipelined}} = t_1 + (n - 1)\,\max\Big(\frac{b}{\sigma},\; \alpha + \frac{b}{\beta},\; \frac{b}{\rho}\Big),
#   \qquad t_1 = \frac{b}{\sigma} + \alpha + \frac{b}{\beta} + \frac{b}{\rho}. \qquad (09.3)$$
#
# A pipelined broadcast to $N$ receivers (a tree or a chain, as NCCL does it) adds hops
# of latency, not bandwidth: $n\alpha \to (n + \lceil\log_2 N\rceil)\alpha$ (09.4); a loop of
# blocking per-tensor broadcasts pays the hops on every message, $n \lceil\log_2 N\rceil \alpha$. With
# **resharding** each of the $tp$ tensor-parallel ranks of an engine receives the bucket
# but reloads only its shard, $B / tp$ bytes, so $\rho \to tp\,\rho$; the rows rank $r$
# keeps of a dimension of size $s$, with $q, m = \operatorname{divmod}(s, tp)$:
#
# $$[\,r q + \min(r, m),\;\; (r+1) q + \min(r+1, m)\,). \qquad (09.5)$$
#
# **Integrity.** Every bucket carries a header (version, index, size) and a checksum
# $c = \sum_k w_k \bmod 2^{64}$ of its 64-bit words (09.6); a receiver rejects a bucket
# whose version, index, size or checksum is off, and commits an update only when every
# bucket of it has been verified. The naive path: one writer, $N$ readers of shared
# storage, $T_{\text{naive}} = B/W_{\text{write}} + N B / W_{\text{read}} + B/\rho$.
#
# **Pseudocode** (the pipelined, verified, resharding update)
# ```
# once:      sender broadcasts the plan (name, shape, dtype, bucket, offset per tensor); receivers check it
# sender:    for b in buckets: pack b into buffer b % 2; write header + checksum;    (09.2, 09.6)
#                              wait until bucket b - 1 has left; broadcast buffer b % 2 (async)
# receiver:  post receive of bucket 0 into buffer 0
#            for b in buckets: wait for bucket b; post receive of b + 1 into buffer (b + 1) % 2   (09.3)
#                              verify header and checksum of b; copy its shard into staging      (09.5, 09.6)
# all:       all-reduce a status code; if every rank is fine, receivers swap staging <-> active
# ```
#
# | equation | function in `course_lib.weight_sync` |
# |---|---|
# | the model's tensors | `specs.model_of_size`, `specs.transformer_specs` |
# | (09.1) transfer, roofline | `methods.Sender` / `Receiver` with `SyncConfig("per_tensor")`, `SyncConfig("flat")` |
# | (09.2) bucket plan, pack, unpack | `buckets.plan_buckets`, `buckets.pack`, `buckets.unpack`; `SyncConfig("bucketed")` |
# | (09.3) double-buffered pipeline | `SyncConfig("pipelined")` |
# | (09.5) shards | `reshard.shard_range`, `reshard.shard_index`; `SyncConfig(..., reshard=True)` |
# | (09.6) headers, checksums, errors | `integrity.BucketHeader`, `integrity.checksum`, `integrity.verify_bucket` |
# | all-or-nothing commit | `store.WeightStore.commit` |
# | bf16 and delta updates | `SyncConfig(wire_dtype="bf16", delta=True)` |
# | zero-copy buckets (no pack, no unpack) | `SyncConfig(in_place=True)`, `store.WeightStore.in_bucket_layout` |
# | real processes | `launch.run_trials(trials, world_size)` |
# | (09.1)-(09.5) as a model, the calculator | `scale_model.update_time`, `scale_model.calibrate_link`, `scale_model.calculator` |

# %% [markdown]
# ## 1. A transformer-like set of tensors, and its bucket plan
#
# Real checkpoints hold many small tensors (norms, biases) beside a few dozen large
# matrices that hold almost all the bytes. Our stand-in is a 32-layer decoder with 12
# tensors per layer; its hidden size sets the total:

# %%
from course_lib.weight_sync.buckets import plan_buckets
from course_lib.weight_sync.specs import describe, model_of_size, total_bytes, transformer_specs

sizes_mb = pick(cpu=[16, 64, 256], full=[64, 256, 1024, 4096])
models = {mb: tuple(model_of_size(mb)) for mb in sizes_mb}
for mb, specs in models.items():
    print(f"{mb:>5} MiB target: {describe(list(specs))}")

# %% [markdown]
# The plan is the metadata sent **once**: every tensor's bucket and byte offset (aligned
# to 64 bytes), its shape and dtype. With 4 MiB buckets for the 64 MiB model:

# %%
specs64 = list(models[64])
plan = plan_buckets(specs64, bucket_bytes=4 * 2**20)
print(f"{len(plan.metas)} tensors in {plan.n_buckets} buckets of <= 4 MiB; plan holds {plan.total_nbytes / 2**20:.1f} MiB")
print(f"{'tensor':<26} {'shape':>12} {'dtype':>14} {'bucket':>6} {'offset':>9} {'bytes':>9}")
for m in plan.metas[:7]:
    print(f"{m.name:<26} {str(m.shape):>12} {str(m.dtype):>14} {m.bucket:>6} {m.offset:>9} {m.nbytes:>9}")

# %% [markdown]
# Packing copies each tensor into its bucket at its offset; unpacking is a *view* of the
# same bytes, so the round trip is exact. A header with the version, index, size and a
# checksum (09.6) travels at the end of every bucket, and a single flipped bit is caught:

# %%
import torch

from course_lib.weight_sync.buckets import pack, unpack
from course_lib.weight_sync.integrity import HEADER_BYTES, BucketHeader, CorruptBucketError, checksum, verify_bucket
from course_lib.weight_sync.specs import make_weights

weights64 = make_weights(specs64, seed=0)
metas = plan.in_bucket(1)
slot = torch.zeros(plan.bucket_nbytes[1] + HEADER_BYTES, dtype=torch.uint8)
payload = pack(weights64, metas, slot[:-HEADER_BYTES])
BucketHeader(version=3, index=1, n_buckets=plan.n_buckets, nbytes=payload.numel(), checksum=checksum(payload)).write(slot)
back = unpack(slot[:-HEADER_BYTES], metas)
print(f"bucket 1: {len(metas)} tensors, {payload.numel():,} bytes; round trip exact: "
      f"{all(torch.equal(back[m.name], weights64[m.name]) for m in metas)}")
verify_bucket(slot[:-HEADER_BYTES], BucketHeader.read(slot), version=3, index=1)
slot[12345] ^= 0x04
try:
    verify_bucket(slot[:-HEADER_BYTES], BucketHeader.read(slot), version=3, index=1)
except CorruptBucketError as exc:
    print(f"after one flipped bit: {type(exc).__name__}: {exc}")

# %% [markdown]
# Which checksum: `sum64` (above) adds the payload's 64-bit words modulo $2^{64}$. It runs
# at memory speed, which matters because both sides read every byte once more; it catches
# flipped bits, truncated and stale buffers, the faults of a transport or a reused buffer,
# but not two swapped words. `zlib.crc32` catches those too at ~2 GB/s on this machine
# (`SyncConfig(checksum="crc32")`); GPU systems use a cheap reduction for the same reason.

# %% [markdown]
# ## 2. Five methods between real processes: latency vs model size
#
# Two processes (rank 0 sends, rank 1 receives) join a gloo process group over
# 127.0.0.1; every method sits behind the same `Sender.send(weights, version)` /
# `Receiver.receive(version)` interface, and the receiver commits only a complete update:
#
# - **naive**: `safetensors` `save_file` + `fsync`, the file dropped from the page cache
#   (a receiver on another machine reads it from storage), `load_file`, copy into the
#   model, one full read of every tensor;
# - **per-tensor**: one `dist.broadcast` per tensor, straight into the receiver's model;
# - **flat**: one broadcast of one already-packed buffer: the roofline of (09.1);
# - **bucketed**: 16 MiB buckets, pack + header + checksum, verify + unpack (09.2);
# - **pipelined**: the same with two buffers per side, send and receive asynchronous (09.3);
# - **zero-copy**: pipelined, but both sides keep their weights as views of bucket-layout
#   storage (`in_place=True`, as a trainer with one contiguous parameter buffer does), so
#   there is nothing to pack or unpack: what remains of the stages is the checksums. Every
#   bucket has storage of its own, so all buckets are in flight at once (no buffer to
#   wait for): the sender checksums bucket b + 1 while b is on the wire, the receiver
#   verifies b while later buckets arrive.
#
# Each cell is the median of 3 timed updates (after one warm-up), from a barrier until
# the receiver has committed.

# %%
from course_lib.weight_sync.launch import Trial, run_trials
from course_lib.weight_sync.methods import SyncConfig

methods = {
    "naive": SyncConfig("naive", workdir="set-by-run_trials"),
    "per-tensor": SyncConfig("per_tensor"),
    "flat (roofline)": SyncConfig("flat"),
    "bucketed": SyncConfig("bucketed", bucket_mb=16),
    "pipelined": SyncConfig("pipelined", bucket_mb=16),
    "zero-copy": SyncConfig("pipelined", bucket_mb=16, in_place=True),
}
grid = [(mb, name) for mb in sizes_mb for name in methods]
print(f"{len(grid)} trials, 2 processes, sizes {sizes_mb} MiB, 3 timed updates each")

# %%
# NBVAL_IGNORE_OUTPUT
from tqdm.auto import tqdm

results = {}
for mb in tqdm(sizes_mb, desc="model sizes", unit="size"):
    trials = [Trial(cfg, models[mb], updates=3, warmup=1) for cfg in methods.values()]
    for name, res in zip(methods, run_trials(trials, timeout_s=120, deadline_s=600)):
        results[mb, name] = res
print(f"{'MiB':>5} | " + " | ".join(f"{n:>15}" for n in methods) + "   (ms per update; GB/s below)")
for mb in sizes_mb:
    print(f"{mb:>5} | " + " | ".join(f"{results[mb, n].median_s * 1e3:>15.1f}" for n in methods))
    print(f"{'':>5} | " + " | ".join(f"{results[mb, n].gb_per_s:>12.2f} GB/s"[-15:] for n in methods))

# %%
assert all(not r.errors for r in results.values())
assert all(r.final_abs_error == 0.0 for (mb, n), r in results.items() if n != "flat (roofline)")
big, small = max(sizes_mb), min(sizes_mb)
best = min(results[big, "bucketed"].median_s, results[big, "pipelined"].median_s)
assert best < results[big, "naive"].median_s
assert 2 * results[small, "bucketed"].median_s < results[small, "per-tensor"].median_s
print(f"every update arrived bit-exact; at {small} MiB (latency-bound) the bucketed broadcast is more than twice "
      f"as fast as per-tensor, and at {big} MiB it beats the naive save/load")

# %%
fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
mb_actual = [total_bytes(list(models[mb])) / 2**20 for mb in sizes_mb]
for name, marker in zip(methods, "sovD^P"):
    axes[0].loglog(mb_actual, [results[mb, name].median_s * 1e3 for mb in sizes_mb], marker + "-", label=name)
    axes[1].semilogx(mb_actual, [results[mb, name].gb_per_s for mb in sizes_mb], marker + "-", label=name)
axes[0].set_xlabel("model size (MiB, float32)")
axes[0].set_ylabel("time per update (ms, median)")
axes[0].set_title("Latency of one weight update")
axes[1].set_xlabel("model size (MiB, float32)")
axes[1].set_ylabel("effective bandwidth (GB/s = model bytes / time)")
axes[1].set_title("Effective bandwidth; the flat buffer is the roofline")
for ax in axes:
    ax.legend(fontsize=8)
fig.suptitle("Weight sync between two processes over gloo (2 CPU cores)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** per-tensor broadcasts pay the per-message latency $\alpha$ hundreds of
# times; it dominates small models. At 256 MiB the bytes dominate and the gap shrinks
# (how much varies with the load of this shared machine). Buckets remove most of the
# latency. The gap that remains between them and the single-buffer roofline (up to about 2x on
# this machine) is the extra copies (pack, checksum, verify, unpack) that two CPU cores
# cannot run beside the transfer. The zero-copy variant only checksums: on a quiet machine
# it comes closest to the roofline, under load its lead can vanish in the noise; the
# buckets' transfer alone reaches about 0.9 of the roofline (`prestaged` in `BENCHMARKS.md`). Naive save/load pays storage twice (write +
# fsync, then a read from disk) and is the slowest at every size. The ratios measured side
# by side with a 256 MiB model are in `BENCHMARKS.md` (`python bench/run.py weight_sync`).

# %% [markdown]
# ## 3. Where the time goes: stage, transfer, reload
#
# Every rank timed what its own (main) thread did: the sender's **stage** (pack and
# checksum), everyone's **transfer** (blocked, waiting on messages), the receiver's
# **reload** (verify, unpack, commit). In the bucketed method nothing else happens, so
# the three add up to the wall time. In the pipelined method a bucket is on the wire (in
# gloo's background thread) *while* the main thread stages the next one or reloads the
# previous one, so the time spent blocked on the transfer is what overlap can shrink:

# %%
# NBVAL_IGNORE_OUTPUT
def mean_phases(res, rank):
    keys = ("stage", "transfer", "reload", "total")
    return {k: float(np.mean([p[k] for p in res.phases[rank]])) for k in keys}


print(f"{big} MiB model, ms per update   stage  transfer  reload   wall")
for name in ("bucketed", "pipelined"):
    for rank, who in ((0, "sender"), (1, "receiver")):
        p = mean_phases(results[big, name], rank)
        print(f"{name:>10} {who:<9}          {p['stage'] * 1e3:>6.1f} {p['transfer'] * 1e3:>9.1f} "
              f"{p['reload'] * 1e3:>7.1f} {p['total'] * 1e3:>6.1f}")

# %%
fig, ax = plt.subplots(figsize=(9, 3.2))
colours = {"stage": "tab:orange", "transfer": "tab:blue", "reload": "tab:green"}
labels = []
for i, (name, rank) in enumerate([(n, r) for n in ("bucketed", "pipelined") for r in (0, 1)]):
    p = mean_phases(results[big, name], rank)
    left = 0.0
    for k, c in colours.items():
        ax.barh(i, p[k] * 1e3, left=left, color=c, label=k if i == 0 else None)
        left += p[k] * 1e3
    ax.plot([p["total"] * 1e3] * 2, [i - 0.4, i + 0.4], "k-", lw=2, label="wall time" if i == 0 else None)
    labels.append(f"{name}, {'sender' if rank == 0 else 'receiver'}")
ax.set_yticks(range(len(labels)), labels)
ax.set_xlabel("ms per update (stages stacked; black bar = wall time)")
ax.set_title(f"Stage times vs wall time, {big} MiB model")
ax.legend(fontsize=8, loc="lower right")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** in the bucketed method stage + transfer + reload is the wall time, as
# (09.2) says. Pipelining moves the stage and the reload into the shadow of the transfer,
# but only if there is spare hardware to run them on. On two shared cores there is not:
# the transfer itself is CPU work (gloo over loopback is a memory copy in the kernel), so
# packing next to it mostly slows it down, and the gain is small and varies with the
# machine's load. On a GPU node the three stages use different engines: copy engines for
# the host-to-device stage, NICs and NVLink for the transfer, SMs or copy engines for the
# reload. That is where (09.3) pays, and why checkpoint-engine pipelines with a ping-pong buffer.
# The other way to shrink the stage and reload terms is to remove them:
# `SyncConfig(in_place=True)` keeps the sender's and the receivers' weights as views of
# bucket-layout storage (as a trainer with one contiguous parameter buffer does), so
# buckets leave from and land in the weights themselves and only the checksums remain;
# `BENCHMARKS.md` measures it beside the other methods.

# %% [markdown]
# ## 4. Bucket size: fewer messages vs a longer pipeline fill
#
# Small buckets pay $\alpha$ many times; large ones need large buffers (GPU memory that
# the inference engine could have used) and make the pipeline's fill time $t_1$ longer.
# The bucketed method on the 64 MiB model, from 64 KiB to 64 MiB buckets:

# %%
# NBVAL_IGNORE_OUTPUT
bucket_sizes = pick(cpu=[0.0625, 0.25, 1.0, 4.0, 16.0, 64.0], full=[0.25, 1.0, 4.0, 16.0, 64.0, 256.0, 1024.0])
sweep_trials = [Trial(SyncConfig("bucketed", bucket_mb=b), models[64], updates=3, warmup=1) for b in bucket_sizes]
sweep = dict(zip(bucket_sizes, run_trials(sweep_trials, timeout_s=120, deadline_s=600)))
for b, r in sweep.items():
    n = plan_buckets(specs64, int(b * 2**20)).n_buckets
    print(f"bucket {b:>7.4g} MiB: {n:>4} buckets, {r.median_s * 1e3:>6.1f} ms, {r.gb_per_s:.2f} GB/s")

# %%
assert all(not r.errors and r.final_abs_error == 0.0 for r in sweep.values())
assert sweep[bucket_sizes[0]].median_s > min(r.median_s for r in sweep.values())
print("the smallest buckets are not the fastest: per-message latency shows once buckets are small")

# %% [markdown]
# ## 5. Resharding on the receiving side
#
# An inference engine with tensor parallelism $tp$ runs on $tp$ GPUs, each holding a
# slice of every matrix. With a broadcast every GPU receives every bucket and **keeps only
# its shard** (09.5): the column-parallel matrices (QKV, MLP up) by rows, the
# row-parallel ones (attention out, MLP down) by columns, norms and the remaining biases
# whole. Three processes: one sender, two receivers forming one engine with $tp = 2$:

# %%
# NBVAL_IGNORE_OUTPUT
shard_trials = [Trial(SyncConfig("pipelined", bucket_mb=16), models[64], updates=2),
                Trial(SyncConfig("pipelined", bucket_mb=16, reshard=True), models[64], updates=2)]
full_copy, resharded = run_trials(shard_trials, world_size=3, timeout_s=120, deadline_s=600)
print(f"whole model on each receiver: {full_copy.median_s * 1e3:.0f} ms; "
      f"resharded (tp = 2): {resharded.median_s * 1e3:.0f} ms per update")

# %%
from course_lib.weight_sync.reshard import shard_range

assert not full_copy.errors and not resharded.errors
for rank in (1, 2):
    print(f"receiver rank {rank} (tp rank {rank - 1}): keeps {resharded.kept_bytes[rank] / 2**20:.1f} MiB of "
          f"{full_copy.kept_bytes[rank] / 2**20:.1f} MiB; max |error| against its exact shard: "
          f"{resharded.final_abs_error:.1f}")
print("rows of a 10-row matrix over tp = 4:", [shard_range(10, r, 4) for r in range(4)])

# %% [markdown]
# **Takeaway:** resharding happens in the reload stage, as a strided copy out of the
# received bucket; every receiver still receives all $B$ bytes (a broadcast), but holds
# and reloads only about $B / tp$. Engines with a different parallel layout than the
# trainer's need exactly this step, which is why checkpoint-engine lets the engine pick
# the shards it needs from the shared buffer.

# %% [markdown]
# ## 6. Fewer bytes: bf16 on the wire, and delta updates
#
# Sending bf16 instead of float32 halves $B$, at the price of rounding every weight to 8
# bits of mantissa. A **delta** update sends $W_{\text{new}} - W_{\text{old}}$ instead:
# deltas are small, so the same bf16 rounding makes a much smaller absolute error. The
# sender keeps a mirror of what the receivers hold, so each delta also carries the
# previous rounding error and errors do not pile up. Five versions of a drifting 16 MiB
# model (every version moves each weight by about 0.1% of its scale, like a training step):

# %%
precision = {
    "fp32": SyncConfig("bucketed", bucket_mb=16),
    "bf16": SyncConfig("bucketed", bucket_mb=16, wire_dtype="bf16"),
    "bf16 delta": SyncConfig("bucketed", bucket_mb=16, wire_dtype="bf16", delta=True),
}
prec_trials = [Trial(cfg, models[16], updates=5, warmup=0, drift=True) for cfg in precision.values()]
prec = dict(zip(precision, run_trials(prec_trials, timeout_s=120, deadline_s=600)))
wire = {name: plan_buckets(list(models[16]), 2**24, torch.bfloat16 if "bf16" in name else None).total_nbytes
        for name in precision}
print(f"{'wire format':<11} {'MiB sent':>9}   max |error| after versions 1..5 (weights ~ 0.02 scale)")
for name, r in prec.items():
    assert not r.errors
    print(f"{name:<11} {wire[name] / 2**20:>9.1f}   " + "  ".join(f"{e:.1e}" for e in r.max_abs_error))

# %%
fig, ax = plt.subplots(figsize=(7, 3.6))
for name, marker in zip(("bf16", "bf16 delta"), "os"):
    ax.semilogy(range(1, 6), prec[name].max_abs_error, marker + "-", label=name)
ax.set_xlabel("weight version (update number)")
ax.set_ylabel("max |received - exact| (weight units)")
ax.set_title("Rounding error of bf16 updates (fp32: exactly 0)")
ax.legend()
fig.tight_layout()
plt.show()
assert prec["fp32"].max_abs_error == [0.0] * 5
assert max(prec["bf16 delta"].max_abs_error[1:]) < min(prec["bf16"].max_abs_error) / 10

# %% [markdown]
# **Takeaway:** bf16 halves the bytes and gives a relative error of about $2^{-9}$ on
# every update; a delta update's first version is a plain bf16 update (the receiver
# starts from zeros), and from then on the error falls by more than 10x, because only
# the small change is rounded. FP8 weights (Kimi-K2's published runs) and compressed
# deltas push the same trade-off further.

# %% [markdown]
# ## 7. When things go wrong: integrity and all-or-nothing updates
#
# We inject faults into the sender's first timed update (version 2, after version 1 went
# through): a bit flipped in bucket 2 after its checksum was taken, buckets 1 and 2 sent
# with swapped indices, a stale version number, a receiver built with a different model
# (shape mismatch), and last a sender killed with `SIGKILL` after bucket 1. Each time the
# receiver must reject the update, keep version 1 exactly, and nobody may hang:

# %%
from course_lib.procs import live_children

faults = {"corrupt bucket": dict(fault="corrupt:2"), "out-of-order bucket": dict(fault="reorder"),
          "stale version": dict(fault="stale"),
          "shape mismatch": dict(receiver_specs=tuple(transformer_specs(models[16][1].shape[0] + 16, n_layers=32))),
          "sender killed": dict(fault="kill:1")}
fault_trials = [Trial(SyncConfig("pipelined", bucket_mb=1), models[16], updates=2, warmup=1, drift=True, **kw)
                for kw in faults.values()]
outcomes = dict(zip(faults, run_trials(fault_trials, timeout_s=20, deadline_s=300)))
print(f"{'fault':<20} {'receiver':<24} {'sender':<20} {'kept version':>12} {'weights exact':>14}")
for name, r in outcomes.items():
    receiver = r.errors.get(1, "-").split(":")[0]
    sender = r.errors.get(0, "-").split(":")[0]
    exact = "yes" if r.final_abs_error == 0.0 else "no" if r.final_abs_error else "(no update)"
    print(f"{name:<20} {receiver:<24} {sender:<20} {r.kept_version[1]:>12} {exact:>14}")
print("a receiver's message:", outcomes["corrupt bucket"].errors[1])
print("rank processes left:", len(live_children()))

# %%
assert all(r.kept_version[1] == (0 if name == "shape mismatch" else 1) for name, r in outcomes.items())
assert all(r.final_abs_error == 0.0 for name, r in outcomes.items() if name != "shape mismatch")
assert outcomes["sender killed"].errors[1].startswith("SenderLostError") and not live_children()
print("every fault was rejected; the receiver kept version 1 bit-exact (or its initial weights); no process is left")

# %% [markdown]
# **Takeaway:** the receiver writes every update into a staging copy and swaps it in only
# after all buckets verified and every rank reported success (an all-reduced status code,
# like checkpoint-engine's), so inference never reads half-updated weights. A bad bucket
# does not stop the receiver from draining the rest of the stream, so the sender is not
# left blocked; a dead sender surfaces as a closed connection (or the process group's
# timeout) and becomes a clear `SenderLostError`. The shape mismatch is found in the
# handshake, before a single weight byte moves.

# %% [markdown]
# ## 8. The scale model: calibrated here, extrapolated to 1T parameters
#
# First, the model's parameters for *this* machine, from the runs above: $\alpha$ from
# the per-tensor minus the flat time (the extra messages), $\beta$ from the flat time
# (09.1), medians over the model sizes; $\sigma$ and $\rho$
# from the bucketed method's stage and reload times, the storage rates from the naive
# method's phases. Then the model predicts every method at every size:

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.weight_sync import scale_model as sm

alpha, beta = sm.calibrate_link([total_bytes(list(models[mb])) for mb in sizes_mb],
                                 [results[mb, "flat (roofline)"].median_s for mb in sizes_mb],
                                 [results[mb, "per-tensor"].median_s for mb in sizes_mb],
                                 [len(models[mb]) for mb in sizes_mb])
b_big = total_bytes(list(models[big]))
stage = mean_phases(results[big, "bucketed"], 0)["stage"]
reload_ = mean_phases(results[big, "bucketed"], 1)["reload"]
naive0, naive1 = mean_phases(results[big, "naive"], 0), mean_phases(results[big, "naive"], 1)
here = sm.Hardware(bandwidth=beta, latency=alpha, stage_bw=b_big / stage, reload_bw=b_big / reload_,
                   write_bw=b_big / naive0["stage"], read_bw=b_big / naive1["reload"])
print(f"fitted: alpha = {alpha * 1e6:.0f} us per message, beta = {beta / 1e9:.2f} GB/s, "
      f"sigma = {here.stage_bw / 1e9:.1f} GB/s, rho = {here.reload_bw / 1e9:.1f} GB/s, "
      f"storage write {here.write_bw / 1e9:.2f} GB/s, read {here.read_bw / 1e9:.2f} GB/s")
model_method = {"naive": "naive", "per-tensor": "per_tensor", "flat (roofline)": "flat", "bucketed": "bucketed",
                "pipelined": "pipelined"}
ratios = {}
print(f"{'MiB':>5} | " + " | ".join(f"{n:>15}" for n in model_method) + "   (model / measured)")
for mb in sizes_mb:
    nb = total_bytes(list(models[mb]))
    for name in model_method:
        pred = sm.update_time(model_method[name], nb, here, n_tensors=len(models[mb]), bucket_bytes=16 * 2**20)
        ratios[mb, name] = pred / results[mb, name].median_s
    print(f"{mb:>5} | " + " | ".join(f"{ratios[mb, n]:>15.2f}" for n in model_method))

# %%
assert all(1 / 3 < ratios[big, name] < 3 for name in model_method), ratios
print(f"calibrated on this machine, the model is within a factor of 3 of every method's measured time at {big} MiB")

# %% [markdown]
# The model leaves out fixed costs (an `fsync`, opening a file, starting a transfer), so
# it underestimates the smallest naive updates; from 64 MiB on the bytes dominate and the
# form of (09.1)-(09.3) holds (how close depends on how steady the shared machine was
# during the runs). Now the same equations with the rates of a GPU cluster. These rates are **assumptions**
# (a 400 Gb/s NIC per GPU, staging by the bucket owners' PCIe copies, a shared file system;
# see `scale_model.CLUSTER_ASSUMED`), not measurements; the published figures are
# checkpoint-engine's table for Kimi-K2 (1T parameters, FP8, about 1 byte per parameter):

# %%
cluster = sm.CLUSTER_ASSUMED
print(f"assumed: link {cluster.bandwidth / 1e9:.0f} GB/s per GPU, staging {cluster.stage_bw / 1e9:.0f} GB/s, "
      f"storage write {cluster.write_bw / 1e9:.0f} GB/s, read {cluster.read_bw / 1e9:.0f} GB/s (all readers)")
print(f"{'setting':<46} {'published':>10} {'model, pipelined':>17} {'model, naive':>13}")
for name, published, piped, naive in sm.kimi_k2_table(cluster):
    print(f"{name:<46} {published:>9.2f}s {piped:>16.1f}s {naive / 60:>10.1f} min")

# %%
params = np.logspace(8, 12, 9)
fig, ax = plt.subplots(figsize=(8, 4.2))
for method, style in (("naive", "s-"), ("per_tensor", "v-"), ("bucketed", "D-"), ("pipelined", "^-")):
    ax.loglog(params, [sm.update_time(method, p, cluster, n_tensors=max(1, int(p / 15e6)), bucket_bytes=8 * 2**30,
                                      n_receivers=256 if method != "naive" else 16, tp=16) for p in params],
              style, label=f"model: {method}")
for name, (published, gpus, tp, _) in sm.PUBLISHED.items():
    ax.plot(sm.KIMI_K2_BYTES, published, "k*", ms=12, label=f"published: {name}" if gpus == 256 else None)
ax.set_xlabel("model size (parameters, FP8: bytes)")
ax.set_ylabel("time of one update (s)")
ax.set_title("Update time at scale: 256 GPUs in 16 engines of TP16 (assumed rates)")
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** at 1T parameters the pipelined broadcast is bounded by the link: about
# $B / \beta = 10^{12} / 5\cdot10^{10} = 20$ s, the same order as the published 14-16 s
# (our cluster rates are rough assumptions; the point is the order of magnitude, and that
# the number of GPUs hardly matters for a pipelined broadcast). The naive path writes a terabyte once and has 16 engines read it back
# through shared storage: minutes, which is what the published systems replaced. The
# per-tensor method (an assumed tensor per 15 M parameters, so tens of thousands at 1T)
# pays every tree hop on every tensor, $n\lceil\log_2 N\rceil\alpha$, and falls behind as
# models and clusters grow; with per-parameter RPCs instead of collectives it gets much
# worse (a reported open-instruct problem turned a ~0.5 s NCCL transfer into a >120 s sync).
#
# Try it yourself: the calculator evaluates (09.1)-(09.5) for any setting.

# %%
sm.calculator()

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | time per update | seconds from a barrier of all ranks until every receiver committed the new version (naive: and read every tensor once); median over updates |
# | effective bandwidth | model bytes / time per update (GB/s, $10^9$ bytes/s) |
# | roofline | the flat method: one broadcast of one already-packed buffer, no copies (09.1 with $n = 1$) |
# | stage / transfer / reload | per rank: packing and checksums (sender), waiting on messages, verifying and unpacking into the model (receiver) |
# | bucket size | bytes per flat buffer; the number of buckets is the number of messages $n$ |
# | kept bytes | bytes of weights a receiver holds (its shard with resharding) |
# | max abs error | largest $\lvert$received $-$ exact$\rvert$ over all weights, for bf16 and delta updates |
# | version | the update's number; a receiver commits only increasing versions |
# | kept version | the version a receiver's active weights hold after a rejected update |
# | alpha, beta, sigma, rho | the scale model's per-message latency, link bandwidth, staging and reload rates |
#
# ## Summary
#
# - A weight update is $B$ bytes through three stages (stage, transfer, reload); per
#   message it also pays a latency $\alpha$ (09.1).
# - Per-tensor broadcasts pay $\alpha$ per tensor; buckets pay it per bucket and get close
#   to the single-buffer roofline; the metadata (names, shapes, dtypes, offsets) goes once.
# - With double buffers the stages overlap and the slowest one sets the time (09.3); that
#   needs the stages to run on different hardware, as on GPU nodes, not on two CPU cores.
# - Receivers reshard while reloading (09.5); bf16 halves the bytes, deltas make its
#   rounding error 10x smaller.
# - Versions, per-bucket checksums, a status all-reduce and a staging copy make an update
#   all-or-nothing; a corrupt bucket, a stale version, a shape mismatch or a dead sender
#   leave the old weights in place.
# - The same equations, with a cluster's rates, put a 1T-parameter update at tens of
#   seconds by broadcast and minutes through storage, as published.
#
# **Full scale.** `COURSE_SCALE=full` measures models of 64 MiB to 4 GiB and buckets up to
# 1 GiB; run it with `.venv/bin/course run 09 --scale full`. On GPUs the same code runs
# with `run_trials(..., backend="nccl")`: every rank takes its own GPU, and the buffers,
# the weights, the control messages and the sum64 checksums move to it (NCCL needs one
# GPU per rank, so at least two). No GPU was lent while this lesson was written: the NCCL
# path is written but not yet measured, and the full-scale figures are still to be taken;
# the CPU figures are in `BENCHMARKS.md`.
#
# **References.** MoonshotAI, *checkpoint-engine* (README: Kimi-K2 updated in about 16 s on
# 256 H20 GPUs, the published table quoted above; buckets, ping-pong buffer, broadcast and
# P2P modes). Perplexity research, 2025: 1.3 s cross-machine updates of Kimi-K2 with one-sided
# RDMA writes and a precomputed transfer schedule. open-instruct issue: per-parameter RPCs
# turning a ~0.5 s NCCL transfer into a >120 s sync. PyTorch `torch.distributed`
# (broadcast, all_reduce, gloo/NCCL backends); Hugging Face `safetensors`.
#
# **Exercises:** `exercises/09_weight_sync.ipynb`: bucket packing with offsets, the
# double-buffered schedule, shard ranges for resharding, and bucket verification. Grade
# with `course grade exercises/09_weight_sync.ipynb`.
