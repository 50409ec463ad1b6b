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
# Kimi-K2 across thousands of GPUs in about 20 seconds (its README's headline; its table
# measures 16 s on 256 H20 GPUs).
#
# **Learning goals**
# 1. Write down the time of an update (09.1-09.5) and say which term dominates for each method.
# 2. Build bucket plans (names, shapes, dtypes, byte offsets sent once), pack and unpack them.
# 3. Run five weight-sync methods between real processes (torch.distributed, gloo) and measure
#    latency and effective bandwidth against the single-buffer roofline, from 16 MiB up.
# 4. Make an update safe: versions, a checksum per bucket, all-or-nothing commits; watch a
#    corrupt bucket, an out-of-order bucket, a shape mismatch and a killed sender be rejected.
# 5. Measure what bf16 and delta updates cost in accuracy, and what resharding saves in memory.
# 6. Calibrate an analytic model on these measurements, then model checkpoint-engine's published
#    updates (up to 1T parameters on 256 GPUs) stage by stage, and test that model on a table
#    its constants were not chosen on.
#
# Builds on lesson 07 (in-flight weight updates between processes).

# %%
import matplotlib.pyplot as plt
import numpy as np

import course_lib
from course_lib import current_scale, pick

print(f"course_lib {course_lib.__version__} | scale: {current_scale()}")
# every multi-process run below gives up with its own error before the notebook's cell limit
# (300 s under nbval, 1800 s under `course run`) would kill the kernel with none
DEADLINE_S = pick(cpu=240, full=1500)  # below course run's 1800 s cell limit at full scale

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
# $$T_{\text{bucketed}} = n\,\alpha + \frac{B}{\beta} + \frac{B}{\sigma} + \frac{B}{\rho} + 2k\gamma, \qquad (09.2)$$
#
# where the last term is a fixed cost $\gamma$ per tensor on each side (one small copy of
# each of the $k$ tensors when packing, one when unpacking; in (09.3) each bucket's stage
# and reload carry their tensors' share of it).
#
# With two buffers on each side (ping-pong) bucket $b+1$ is staged while bucket $b$ is on
# the wire and bucket $b-1$ is being reloaded; after the first bucket, the slowest stage
# sets the pace, if the stages really run side by side:
#
# $$T_{\text{pipelined}} = t_1 + (n - 1)\,\big[m + (1 - \eta)\,(t_1 - m)\big], \qquad
#   m = \max\Big(\frac{b}{\sigma},\; \alpha + \frac{b}{\beta},\; \frac{b}{\rho}\Big),
#   \qquad t_1 = \frac{b}{\sigma} + \alpha + \frac{b}{\beta} + \frac{b}{\rho}. \qquad (09.3)$$
#
# The **overlap efficiency** $\eta$ says how much of the other stages the pipeline hides:
# $\eta = 1$ is the ideal (only the slowest stage counts), $\eta = 0$ runs the stages in
# turn, which is (09.2) again, and $\eta < 0$ means that the pipelined update took longer
# than (09.2) with the measured stage times: either the stages compete for the same
# hardware, or the stage times, measured one by one, undercount what an update costs.
# We will fit it, and section 8 shows which of the two a negative value means here.
#
# A pipelined broadcast to $N$ receivers in which every node forwards each chunk once (a
# chain, i.e. the ring along which NCCL pipelines its broadcast, or a double binary tree)
# adds hops of latency, not bandwidth: $n\alpha \to (n + h)\alpha$ (09.4), with
# $h = N - 1$ for a chain and about $\log_2 N$ for the trees. A plain binary tree, where
# every parent sends each chunk to two children, also halves the bandwidth. A loop of
# blocking per-tensor broadcasts pays the hops on every message, $n h \alpha$. With
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
# | one interface, a class per method | `methods.SyncMethod` (`make_plan`, `send`, `receive`; stage, transfer, reload timed in `config.Phases`), chosen from a `SyncConfig` by `methods.method_class` |
# | (09.1) transfer, roofline | `endpoints.Sender` / `Receiver` with `SyncConfig("per_tensor")`, `SyncConfig("flat")` |
# | (09.2) bucket plan, pack, unpack | `buckets.plan_buckets`, `buckets.pack`, `buckets.unpack`; `SyncConfig("bucketed")` |
# | (09.3) double-buffered pipeline | `SyncConfig("pipelined")` |
# | (09.5) shards | `reshard.shard_range`, `reshard.shard_index`; `SyncConfig(..., reshard=True)` |
# | (09.6) headers, checksums, errors | `integrity.BucketHeader`, `integrity.checksum`, `integrity.verify_bucket` |
# | all-or-nothing commit | `store.WeightStore.commit` |
# | injected faults (teaching and tests only) | `faults.CorruptBucket`, `faults.ReorderBuckets`, `faults.StaleVersion`, `faults.KillSender`, armed with `Trial(..., fault=...)` |
# | bf16 and delta updates | `SyncConfig(wire_dtype="bf16", delta=True)` |
# | zero-copy buckets (no pack, no unpack) | `SyncConfig(in_place=True)`, `store.WeightStore.in_bucket_layout` |
# | real processes | `launch.run_trials(trials, world_size)` |
# | (09.1)-(09.5) as a model, the calculator | `scale_model.update_time`, `scale_model.pipelined_from_stages`, `scale_model.fit_overlap`, `scale_model.calibrate_link`, `scale_model.calibrate_stages`, `scale_model.calculator` |
# | checkpoint-engine's schedule, stage by stage (section 9) | `engine_model.engine_update`, `engine_model.published_comparison`, `engine_model.hardware_only`, `engine_model.fit_software`, `engine_model.bytes_line`, `engine_model.EARLIER_TABLE`, `engine_model.P2P_TABLE` (published, not modelled) |

# %% [markdown]
# ## 1. A transformer-like set of tensors, and its bucket plan
#
# Real checkpoints hold many small tensors (norms, biases) beside a few dozen large
# matrices that hold almost all the bytes. Our stand-in is a 32-layer decoder with 12
# tensors per layer; its hidden size sets the total:

# %%
from course_lib.weight_sync.buckets import plan_buckets
from course_lib.weight_sync.specs import describe_model, model_of_size, total_bytes, transformer_specs

sizes_mb = pick(cpu=[16, 64, 256], full=[64, 256, 1024, 4096])
models = {mb: tuple(model_of_size(mb)) for mb in sorted({*sizes_mb, 16, 64})}  # 16, 64 MiB: later sections' fixed sizes
for mb in sizes_mb:
    print(f"{mb:>5} MiB target: {describe_model(list(models[mb]))}")

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
from course_lib.weight_sync.integrity import HEADER_BYTES, BucketHeader, checksum
from course_lib.weight_sync.specs import make_weights

weights64 = make_weights(specs64, seed=0)
metas = plan.in_bucket(1)
slot = torch.zeros(plan.bucket_nbytes[1] + HEADER_BYTES, dtype=torch.uint8)
payload = pack(weights64, metas, slot[:-HEADER_BYTES])
BucketHeader(version=3, index=1, n_buckets=plan.n_buckets, nbytes=payload.numel(), checksum=checksum(payload)).write(slot)
back = unpack(slot[:-HEADER_BYTES], metas)
print(f"bucket 1: {len(metas)} tensors, {payload.numel():,} bytes; round trip exact: "
      f"{all(torch.equal(back[m.name], weights64[m.name]) for m in metas)}")
assert checksum(slot[:-HEADER_BYTES]) == BucketHeader.read(slot).checksum  # as sent
slot[12345] ^= 0x04  # one bit flipped on the way
print(f"after one flipped bit the payload's sum64 differs from the one in the header: "
      f"{checksum(slot[:-HEADER_BYTES]) != BucketHeader.read(slot).checksum} (exercise 4 writes the receiver's check)")
assert checksum(slot[:-HEADER_BYTES]) != BucketHeader.read(slot).checksum

# %% [markdown]
# Which checksum: `sum64` (above) adds the payload's 64-bit words modulo $2^{64}$. It runs
# at memory speed, which matters because both sides read every byte once more; it catches
# flipped bits, truncated and stale buffers, the faults of a transport or a reused buffer,
# but not two swapped words. `zlib.crc32` catches those too, at a higher cost per byte
# (`SyncConfig(checksum="crc32")`; not timed in this lesson); GPU systems use a cheap
# reduction for the same reason.

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
# - **flat + checksums**: the flat broadcast with the same sum64 pass on each side (the
#   sender checksums the buffer, the receiver verifies it): the like-for-like roofline of
#   the checksummed methods (`SyncConfig("flat", verify=True)`).
#
# Each cell is the median of 5 timed updates, one per round, each after one warm-up; the
# methods are interleaved round by round, so that all of them see the same load of this
# shared machine. A time runs from a barrier until the receiver has committed.

# %%
from course_lib.weight_sync.launch import Trial, run_interleaved, run_trials
from course_lib.weight_sync.methods import SyncConfig

methods = {
    "naive": SyncConfig("naive", workdir="set-by-run_trials"),
    "per-tensor": SyncConfig("per_tensor"),
    "flat (roofline)": SyncConfig("flat"),
    "flat + checksums": SyncConfig("flat", verify=True),
    "bucketed": SyncConfig("bucketed", bucket_mb=16),
    "pipelined": SyncConfig("pipelined", bucket_mb=16),
    "zero-copy": SyncConfig("pipelined", bucket_mb=16, in_place=True),
}
ROUNDS = 5
print(f"{len(methods)} methods x {len(sizes_mb)} sizes {sizes_mb} MiB x {ROUNDS} rounds, 2 processes")

# %%
# NBVAL_IGNORE_OUTPUT
import os

from course_lib import progress

load_before = os.getloadavg()[0]
results = {}
with progress(len(sizes_mb), "model sizes", unit="size") as bar:
    for mb in sizes_mb:
        trials = {name: Trial(cfg, models[mb], updates=1, warmup=1) for name, cfg in methods.items()}
        for name, res in run_interleaved(trials, ROUNDS, timeout_s=120, deadline_s=DEADLINE_S).items():
            results[mb, name] = res
        bar.update()
print(f"load average (1 min) of this {os.cpu_count()}-core machine: {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
print(f"{'ms per update (GB/s)':<20} | " + " | ".join(f"{f'{mb} MiB':>16}" for mb in sizes_mb))
for n in methods:
    print(f"{n:<20} | " + " | ".join(f"{results[mb, n].median_s * 1e3:>7.1f} ({results[mb, n].gb_per_s:>4.2f})"
                                    for mb in sizes_mb))
for n in ("bucketed", "pipelined", "zero-copy"):
    print(f"{n + ' / flat':<20} | " + " | ".join(
        f"{results[mb, n].median_s / results[mb, 'flat (roofline)'].median_s:>15.2f}x" for mb in sizes_mb))

# %%
big, small = max(sizes_mb), min(sizes_mb)
t = {key: r.median_s for key, r in results.items()}
assert all(not r.errors for r in results.values())
assert all(r.final_abs_error == 0.0 for (mb, n), r in results.items() if not n.startswith("flat"))
assert t[big, "naive"] > max(t[big, n] for n in methods if n != "naive")
latency_bound = [mb for mb in sizes_mb if mb < 64]  # sizes where per-message latency dominates
assert latency_bound or current_scale() != "cpu"
assert all(2 * t[mb, "bucketed"] < t[mb, "per-tensor"] for mb in latency_bound)
assert all(t[small, n] > 1.5 * t[small, "flat (roofline)"] for n in ("bucketed", "pipelined"))
print(f"every update arrived bit-exact; at {big} MiB the naive save/load is the slowest method; "
      + (f"at {', '.join(map(str, latency_bound))} MiB (latency-bound) the bucketed broadcast is more than twice as "
         "fast as per-tensor; " if latency_bound else "no size of this run is latency-bound (below 64 MiB): "
         "bucketed vs per-tensor is not asserted; ")
      + f"at {small} MiB the bucketed and pipelined updates take more than 1.5x the roofline's time")

# %%
import matplotlib.ticker as mticker

fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
mb_actual = [total_bytes(list(models[mb])) / 2**20 for mb in sizes_mb]
for name, marker in zip(methods, "sovxD^P"):
    axes[0].loglog(mb_actual, [results[mb, name].median_s * 1e3 for mb in sizes_mb], marker + "-", label=name)
    axes[1].semilogx(mb_actual, [results[mb, name].gb_per_s for mb in sizes_mb], marker + "-", label=name)
axes[0].set_xlabel("model size (MiB, float32)")
axes[0].set_ylabel("time per update (ms, median)")
axes[0].set_title("Latency of one weight update")
axes[1].set_xlabel("model size (MiB, float32)")
axes[1].set_ylabel("effective bandwidth (GB/s = model bytes / time)")
axes[1].set_title("Effective bandwidth; the flat buffer is the roofline")
for ax in axes:
    ax.set_xticks(mb_actual, [f"{mb:.0f}" for mb in mb_actual])  # the sizes measured, no crowded minor labels
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    ax.legend(fontsize=8)
fig.suptitle("Weight sync between two processes over gloo (2 CPU cores)")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** per-tensor broadcasts pay the per-message latency $\alpha$ hundreds of
# times, and that dominates small models: at 16 MiB the bucketed broadcast is more than
# twice as fast (asserted above at the cpu scale). The advantage shrinks as the bytes
# grow: in the full-scale run (`BENCHMARKS.md`, 12 cores of a GPU host) the bucketed update
# of the 64 MiB model took 40.4 ms against per-tensor's 50.6 ms, 1.25x and not twice, so
# that run asserts nothing about it (its smallest size is 64 MiB). As the model grows the bytes dominate, and at 256 MiB the naive
# save/load, which pays storage twice (write + fsync, then a read from disk), is the
# slowest method. Buckets remove most of the latency, but what they add around the
# transfer costs time too: at 16 MiB, where one bucket holds the whole model, the bucketed
# and pipelined updates take more than 1.5x the roofline's time, because the extra copies
# (pack, checksum, verify, unpack) run on the same two cores as the transfer. At the
# larger sizes the `/ flat` rows move between runs of this shared machine (the load
# average before and after is printed with the table). The zero-copy variant removes the copies and keeps
# only the checksums; its like-for-like reference is `flat + checksums`, one buffer with the
# same two passes. "Roofline" is a name for a reference here, not a bound: the zero-copy
# update keeps all its buckets in flight at once and can come out faster than the single
# flat message (its `/ flat` row below 1x where it does). The ratios measured side by side with a 256 MiB model (five rounds,
# the prestaged transfer against the plain roofline, the checksummed updates against the
# checksummed one) are in `BENCHMARKS.md` (`python bench/run.py weight_sync`).

# %% [markdown]
# ## 3. Where the time goes: stage, transfer, reload
#
# Every rank timed what its own (main) thread did: the sender's **stage** (pack and
# checksum), everyone's **transfer** (blocked, waiting on messages), the receiver's
# **reload** (verify, unpack, commit). In the bucketed method nothing else happens, so
# the three add up to the wall time. In the pipelined method a bucket is on the wire (in
# gloo's background thread) *while* the main thread stages the next one or reloads the
# previous one, so the time spent blocked on the transfer is what overlap can shrink.
# The pipelined method's sender and receiver, and the all-or-nothing commit, are these:

# %%
from course_lib import show_source
from course_lib.weight_sync.endpoints import Receiver
from course_lib.weight_sync.methods import BucketMethod, Pipelined

show_source(Pipelined.send)  # two slots per side: stage b + 1 while b is on the wire (asynchronous broadcast)
show_source(Pipelined.receive)  # post the receive of b + 1, then verify and reload b
show_source(BucketMethod.agree)  # after the last bucket: all-reduce a status code over the receivers
show_source(Receiver.receive)  # commit (swap staging in) only if no rank rejected the update

# %%
# NBVAL_IGNORE_OUTPUT
def mean_phases(res, rank):
    keys = ("stage", "transfer", "reload", "total")
    return {k: float(np.mean([p[k] for p in res.phases[rank]])) for k in keys}


print(f"{big} MiB model, ms per update (means over the {ROUNDS} rounds; section 2's table gives medians)")
print(f"{'':<31}stage  transfer  reload   wall")
for name in ("bucketed", "pipelined"):
    for rank, who in ((0, "sender"), (1, "receiver")):
        p = mean_phases(results[big, name], rank)
        print(f"{name:>10} {who:<9}          {p['stage'] * 1e3:>6.1f} {p['transfer'] * 1e3:>9.1f} "
              f"{p['reload'] * 1e3:>7.1f} {p['total'] * 1e3:>6.1f}")
print("pipelined / bucketed wall time: " + ", ".join(
    f"{mb} MiB {t[mb, 'pipelined'] / t[mb, 'bucketed']:.2f}" for mb in sizes_mb))

# %%
for name in ("bucketed", "pipelined"):
    for rank in (0, 1):
        p = mean_phases(results[big, name], rank)
        assert abs(p["stage"] + p["transfer"] + p["reload"] - p["total"]) < 0.05 * p["total"]
print("every rank's stage + transfer + reload is its wall time (its main thread does one thing at a time)")

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
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
fig.tight_layout()
plt.show()

# %% [markdown]
# **Takeaway:** each rank's main thread does one thing at a time, so its stage, transfer
# and reload add up to its wall time; a rank's *transfer* includes waiting for the other
# rank (the receiver waits while the sender packs, the sender while the receiver unpacks
# and verifies). Pipelining is meant to move the stage and the reload into the shadow of
# the transfer, which gloo runs in a background thread. Whether that pays needs spare
# hardware, and two shared cores have none: the transfer itself is CPU work (gloo over
# loopback is a memory copy in the kernel), so packing next to it competes with it, and
# whether pipelining gains or loses moves with the machine's load (the `pipelined /
# bucketed` line of this run). Section 8 turns it into a number, the overlap efficiency
# $\eta$ of (09.3). On a GPU node the three stages use
# different engines: copy engines for the host-to-device stage, NICs and NVLink for the
# transfer, SMs or copy engines for the reload. That is where (09.3) pays, and why
# checkpoint-engine pipelines with a ping-pong buffer. The other way to shrink the stage
# and reload terms is to remove them: `SyncConfig(in_place=True)` (the zero-copy row)
# keeps both sides' weights as views of bucket-layout storage, so buckets leave from and
# land in the weights themselves and only the checksums remain.

# %% [markdown]
# ## 4. Bucket size: fewer messages vs bigger buffers
#
# Small buckets pay $\alpha$ many times; large ones need large buffers (GPU memory that
# the inference engine could have used) and, in a pipelined update, make the fill time
# $t_1$ of (09.3) longer. The sweep runs the bucketed method (stages in turn, no ping-pong
# buffer) on the 64 MiB model, from 64 KiB to 64 MiB buckets (interleaved, median of 5
# rounds), so it shows the first effect, the per-message latency:

# %%
# NBVAL_IGNORE_OUTPUT
bucket_sizes = pick(cpu=[0.0625, 0.25, 1.0, 4.0, 16.0, 64.0], full=[0.0625, 0.25, 1.0, 4.0, 16.0, 32.0, 64.0])
# (at both scales the largest bucket is the model's size: 2 buckets of the 64.1 MiB model; larger ones are 1 bucket)
sweep_trials = {b: Trial(SyncConfig("bucketed", bucket_mb=b), models[64], updates=1, warmup=1) for b in bucket_sizes}
sweep = run_interleaved(sweep_trials, ROUNDS, timeout_s=120, deadline_s=DEADLINE_S)
for b, r in sweep.items():
    n = plan_buckets(specs64, int(b * 2**20)).n_buckets
    print(f"bucket {b:>7.4g} MiB: {n:>4} buckets, {r.median_s * 1e3:>6.1f} ms, {r.gb_per_s:.2f} GB/s")

# %%
assert all(not r.errors and r.final_abs_error == 0.0 for r in sweep.values())
fastest = min(sweep, key=lambda b: sweep[b].median_s)
assert fastest >= 1.0 and sweep[bucket_sizes[0]].median_s > 1.5 * sweep[fastest].median_s
print("buckets under 1 MiB are never the fastest here, and 64 KiB buckets are more than 1.5x slower than the best: "
      "per-message latency shows once buckets are small")

# %% [markdown]
# **Takeaway:** below about 1 MiB the per-message cost $\alpha$ decides: hundreds of
# buckets pay hundreds of per-message costs, as per-tensor broadcasts do. Above a few MiB there are only a handful
# of messages and the time is set by the bytes and the copies; where exactly the best size
# lies, and whether the largest buckets are a little slower or faster than it, moves with
# the load of this shared machine. On GPUs, checkpoint-engine's published runs use
# buckets of 1.4 to 8 GiB (its two tables, quoted in section 9).

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
full_copy, resharded = run_trials(shard_trials, world_size=3, timeout_s=120, deadline_s=DEADLINE_S)
print(f"whole model on each receiver: {full_copy.median_s * 1e3:.0f} ms; "
      f"resharded (tp = 2): {resharded.median_s * 1e3:.0f} ms per update")

# %%
assert not full_copy.errors and not resharded.errors
for rank in (1, 2):
    print(f"receiver rank {rank} (tp rank {rank - 1}): keeps {resharded.kept_bytes[rank] / 2**20:.1f} MiB of "
          f"{full_copy.kept_bytes[rank] / 2**20:.1f} MiB; max |error| against its exact shard: "
          f"{resharded.final_abs_error:.1f}")
print("the rows each tp rank keeps follow (09.5); exercise 3 asks you to write it")

# %% [markdown]
# **Takeaway:** resharding happens in the reload stage, as a strided copy out of the
# received bucket; every receiver still receives all $B$ bytes (a broadcast), but holds
# and reloads only about $B / tp$. Engines with a different parallel layout than the
# trainer's need exactly this step, which is why checkpoint-engine lets the engine pick
# the shards it needs from the shared buffer.

# %% [markdown]
# ## 6. Fewer bytes: bf16 on the wire, and delta updates
#
# Sending bf16 instead of float32 halves $B$, at the price of rounding every weight to 7
# stored mantissa bits (8 significant bits with the implicit leading one): round to
# nearest errs by at most $2^{-8}$ of a weight's magnitude. A **delta** update sends $W_{\text{new}} - W_{\text{old}}$ instead:
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
prec = dict(zip(precision, run_trials(prec_trials, timeout_s=120, deadline_s=DEADLINE_S)))
wire = {name: plan_buckets(list(models[16]), 2**24, torch.bfloat16 if "bf16" in name else None).total_nbytes
        for name in precision}
import math

order = lambda e: "0" if e == 0 else f"<1e{math.ceil(math.log10(e)):+03d}"  # a bound: stable across CPUs
print(f"{'wire format':<11} {'MiB sent':>9}   max |error| after versions 1..5, as a bound (weights ~ 0.02 scale)")
for name, r in prec.items():
    assert not r.errors
    print(f"{name:<11} {wire[name] / 2**20:>9.1f}   " + "  ".join(order(e) for e in r.max_abs_error))
w16 = torch.cat([w.flatten() for w in make_weights(list(models[16]), seed=0).values()])
w16 = w16[w16 != 0]
worst_rel = float(((w16.bfloat16().float() - w16).abs() / w16.abs()).max())
print(f"largest relative rounding error of one weight in bf16: {worst_rel:.2e} (bound 2^-8 = {2**-8:.2e})")
assert 2**-9 < worst_rel <= 2**-8

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
# **Takeaway:** bf16 halves the bytes, and rounding to its 8 significant bits moves a
# weight by at most $2^{-8}$ of its magnitude (the largest relative error above lies
# between $2^{-9}$ and that bound) on every update; a delta update's first version is a plain bf16 update (the receiver
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
from course_lib.runtime.processes import live_children
from course_lib.weight_sync.faults import CorruptBucket, KillSender, ReorderBuckets, StaleVersion

faults = {"corrupt bucket": dict(fault=CorruptBucket(2)), "out-of-order bucket": dict(fault=ReorderBuckets()),
          "stale version": dict(fault=StaleVersion()),
          "shape mismatch": dict(receiver_specs=tuple(transformer_specs(models[16][1].shape[0] + 16, n_layers=32))),
          "sender killed": dict(fault=KillSender(after_bucket=1))}
fault_trials = [Trial(SyncConfig("pipelined", bucket_mb=1), models[16], updates=2, warmup=1, drift=True, **kw)
                for kw in faults.values()]
outcomes = dict(zip(faults, run_trials(fault_trials, timeout_s=20, deadline_s=DEADLINE_S)))
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
# ## 8. The scale model: calibrated here
#
# First the form of (09.3), on its own terms. At each size and in each round we know what
# the three stages cost when they run in turn: the bucketed method's sender stage and
# receiver reload, and the flat broadcast of the same bytes. (09.3) turns them and the
# number of buckets into a pipelined time; its one free parameter, the overlap efficiency
# $\eta$, is fitted to the measured pipelined times (`fit_overlap`: least squares on the
# log of predicted / measured, over the models of several buckets). Each round is compared
# with itself (its methods ran within seconds of each other, under the same load), and the
# table gives the median over the rounds of predicted / measured.
#
# Then the rates for *this* machine, to predict every method from the bytes alone:
# $\alpha$ from the per-tensor minus the flat time (the extra messages) and $\beta$ from
# the flat time (09.1); $\sigma$, $\rho$ and a fixed cost $\gamma$ per tensor from the
# bucketed method's stage and reload times, a line in the bytes over the three sizes
# (`calibrate_stages`: the slope is the rate, the intercept the fixed work per tensor);
# the storage rates from the naive method's phases.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.weight_sync import scale_model as sm


def median_phase(res, rank, key):
    return float(np.median([p[key] for p in res.phases[rank]]))


nbytes = [total_bytes(list(models[mb])) for mb in sizes_mb]
n_tensors = [len(models[mb]) for mb in sizes_mb]
stages = [(median_phase(results[mb, "bucketed"], 0, "stage"), t[mb, "flat (roofline)"],
           median_phase(results[mb, "bucketed"], 1, "reload"), plan_buckets(list(models[mb]), 16 * 2**20).n_buckets)
          for mb in sizes_mb]


def round_stages(mb, r):  # round r's stage times at size mb: measured within seconds of its pipelined update
    bucketed = results[mb, "bucketed"]
    return (bucketed.phases[0][r]["stage"], results[mb, "flat (roofline)"].seconds[r], bucketed.phases[1][r]["reload"],
            plan_buckets(list(models[mb]), 16 * 2**20).n_buckets)


pairs = [(mb, r) for mb in sizes_mb for r in range(ROUNDS)]
eta = sm.fit_overlap([results[mb, "pipelined"].seconds[r] for mb, r in pairs], [round_stages(mb, r) for mb, r in pairs])


def paired_ratio(mb, overlap):  # median over rounds of predicted / measured, each round against itself
    return float(np.median([sm.pipelined_from_stages(*round_stages(mb, r), overlap=overlap)
                            / results[mb, "pipelined"].seconds[r] for r in range(ROUNDS)]))


staged = {mb: paired_ratio(mb, eta) for mb in sizes_mb}
ideal = {mb: paired_ratio(mb, 1.0) for mb in sizes_mb}
in_turn = {mb: (st[0] + st[1] + st[2]) / t[mb, "bucketed"] for mb, st in zip(sizes_mb, stages)}
print(f"overlap efficiency fitted to the pipelined times: eta = {eta:.2f}")
if eta < 0:
    print(f"verdict: eta < 0, yet the pipelined update was no slower than the bucketed one at "
          f"{sum(t[mb, 'pipelined'] <= 1.02 * t[mb, 'bucketed'] for mb in sizes_mb)} of {len(sizes_mb)} sizes: the "
          f"stage times measured one by one add up to only {min(in_turn.values()):.2f}-{max(in_turn.values()):.2f} "
          "of the bucketed update's time (column 'in turn'), so (09.2) undercounts the stages and eta absorbs "
          "that model error")
else:
    print("verdict: " + (f"the pipeline falls short of the ideal overlap (eta = {eta:.2f} < 1)" if eta < 0.995 else
                         "the pipeline reached the ideal overlap (eta = 1)"))
print(f"{'MiB':>5} {'buckets':>8} {'stage ms':>9} {'flat ms':>8} {'reload ms':>10} {'in turn':>8} {'pipelined ms':>13} "
      f"{'(09.3) / measured':>18} {'eta = 1 / measured':>19}")
for mb, (stage_s, flat_s, reload_s, n) in zip(sizes_mb, stages):
    print(f"{mb:>5} {n:>8} {stage_s * 1e3:>9.1f} {flat_s * 1e3:>8.1f} {reload_s * 1e3:>10.1f} {in_turn[mb]:>8.2f} "
          f"{t[mb, 'pipelined'] * 1e3:>13.1f} {staged[mb]:>18.2f} {ideal[mb]:>19.2f}")
print("in turn: (stage + flat + reload) / the bucketed update's measured time")

alpha, beta = sm.calibrate_link(nbytes, [t[mb, "flat (roofline)"] for mb in sizes_mb],
                                 [t[mb, "per-tensor"] for mb in sizes_mb], n_tensors)
sigma, rho, gamma = sm.calibrate_stages(nbytes, n_tensors, [st[0] for st in stages], [st[2] for st in stages])
b_big = total_bytes(list(models[big]))
here = sm.Hardware(bandwidth=beta, latency=alpha, stage_bw=sigma, reload_bw=rho, tensor_cost=gamma, overlap=eta,
                   write_bw=b_big / median_phase(results[big, "naive"], 0, "stage"),
                   read_bw=b_big / median_phase(results[big, "naive"], 1, "reload"))
print(f"\nrates: alpha = {alpha * 1e6:.0f} us per message, beta = {beta / 1e9:.2f} GB/s, "
      f"sigma = {sigma / 1e9:.1f} GB/s, rho = {rho / 1e9:.1f} GB/s, gamma = {gamma * 1e6:.1f} us per tensor, "
      f"storage write {here.write_bw / 1e9:.2f} GB/s, read {here.read_bw / 1e9:.2f} GB/s")
model_method = {"naive": "naive", "per-tensor": "per_tensor", "flat (roofline)": "flat", "bucketed": "bucketed",
                "pipelined": "pipelined"}
ratios = {}
print(f"{'MiB':>5} | " + " | ".join(f"{n:>15}" for n in model_method) + "   (rate model / measured)")
for mb, nb, k in zip(sizes_mb, nbytes, n_tensors):
    for name in model_method:
        pred = sm.update_time(model_method[name], nb, here, n_tensors=k, bucket_bytes=16 * 2**20)
        ratios[mb, name] = pred / t[mb, name]
    print(f"{mb:>5} | " + " | ".join(f"{ratios[mb, n]:>15.2f}" for n in model_method))

# %%
assert all(1 / 2 < staged[mb] < 2 for mb in sizes_mb), staged  # a bound that holds on a loaded machine too; see below
assert eta >= 0 or min(in_turn.values()) < 0.95, (eta, in_turn)  # a negative eta comes with stages that undercount
print("with the fitted overlap, (09.3) is within 2x of the pipelined method's measured time for every model "
      "(the ratios are in the table above); if the fitted eta is negative, the stages measured one by one add up "
      "to less than 0.95 of the bucketed update at some size (asserted)")

# %% [markdown]
# The pipelined method is the one we extrapolate, so its equation is the one held to a
# bound: within 2x of every measured update (what holds beside a CPU hog too; a single
# bucket's update is a few tens of milliseconds in which the pipeline's fixed costs weigh
# as much as its bytes, a cost (09.3) has no term for). Read the fitted $\eta$ with care.
# (09.3) builds its stages-in-turn time from the stage, flat and reload times measured
# one by one; the `in turn` column compares their sum with the bucketed update's measured
# time. Under load that sum can fall well short of it (the flat broadcast ran in another
# slot of the round, and per-bucket work such as headers and hand-offs falls between the
# stages), and then (09.3)'s baseline is too short: the one free parameter absorbs the
# gap and $\eta$ comes out negative even where the pipelined update was faster than the
# bucketed one (section 3's `pipelined / bucketed` line). So a negative $\eta$ here is
# model error, not evidence that overlapping made the update slower; the assert above
# ties the sign to the undercount. The ideal $\eta = 1$ (last column) is what the ping-pong buffer could
# reach if the stages ran fully side by side on separate hardware; on two busy cores they
# cannot, and how close this run came varies with the load. The rate model goes one step
# further and predicts from the bytes alone, with one rate per stage; its rows show what
# that leaves out. Fixed costs of an update (an `fsync`, opening a file, a barrier)
# matter most for the small models, and one $\beta$, $\sigma$ or $\rho$ cannot follow
# how this machine's per-byte costs change with the size and, on a shared machine, with
# the load (compare the flat row across sizes). The rates fitted here (e.g. $\gamma$, a
# few microseconds per tensor on these cores) are this machine's; section 9's per-tensor
# cost at scale is a different software path (an inference engine's weight loader) and
# is not derived from them.
#
# ## 9. checkpoint-engine's published runs, stage by stage
#
# At scale the same three stages run on different hardware, and checkpoint-engine's
# schedule (its `ps.py`, summarised in `course_lib.weight_sync.engine_model`) decides how
# they overlap. Each of the $W$ GPUs holds $B/W$ bytes of the new weights in pinned host
# memory, cut into buckets of at most $b$ bytes. In each **round** every GPU copies its
# next bucket host-to-device over its own PCIe link (all at once, then a synchronise),
# while the inference engine is still reloading the previous round's last bucket; then
# the $W$ owners **broadcast** their buckets one after another (an NCCL ring: NVLink
# inside a node, the RDMA NICs between nodes) into a ping-pong buffer, while the engine
# **reloads** the previous bucket (every tensor through its weight loader, each TP rank
# keeping its shard); a barrier and a message hand each bucket over. With $n$ buckets
# (rounds $\times\,W$) of $b$ bytes, each holding $K/n$ of the checkpoint's $K$ tensors:
#
# $$T = T_0 + \underbrace{t_h + (\text{rounds}-1)\big[\max(t_h + t_{bc}, t_{rl}) - \max(t_{bc}, t_{rl})\big]}_{\text{H2D not hidden}}
#   + (n-1)\max(t_{bc}, t_{rl}) + t_{bc} + t_{rl} + n\,o,$$
# $$t_h = \frac{b}{h},\quad t_{bc} = (W-1)\Big(a + \frac{k\,c}{\beta}\Big) + \frac{b}{\beta},\quad
#   t_{rl} = \frac{K}{n}\,\gamma + \frac{b}{tp\,m/2}.$$
#
# The hardware rates are datasheet figures, the same for every row: PCIe Gen5 x16 ($h$ =
# 50 GB/s, 80% of its 63 GB/s), NVLink (H800 400 GB/s, H20 900 GB/s, both directions),
# HBM ($m$), 8 x 400 Gb/s NICs per node (the Kimi-K2 report's H800 cluster; assumed for
# the H20 nodes), NCCL at 80% of the link. The ring's fill $(W-1)(a + kc/\beta)$ is the
# time for the first chunk ($c$ = 512 KiB, NCCL's default buffer over its 8 steps) to pass
# $W - 1$ hops of latency $a$ = 5 us; NCCL splits the bucket over $k$ channels, each
# moving its share at $\beta/k$, and the model assumes $k$ = 16 (NCCL picks the count from
# the topology it detects; 16 is assumed, not read from these runs). The software costs are not: $o$ = 1 ms per
# bucket, and the two that matter, $\gamma$ = 0.1 ms per tensor reloaded and $T_0$ = 1 s
# per update, are round values chosen **with this table in view**, the same for every
# row. The table prints the model, and in the column `hw only` what the hardware stages
# alone (the same schedule with $\gamma = o = T_0 = 0$) take, as a share of the published
# time:

# %%
from course_lib.weight_sync import engine_model as em

engine_rows = em.published_comparison()
print("seconds of one broadcast update (H2D: not hidden; bcast, reload, ring: that stage's seconds over all buckets)")
print(em.format_table(engine_rows))
shares = [r.hardware_share for r in engine_rows]
print(f"the hardware stages alone: {min(shares):.0%} to {max(shares):.0%} of the published times; "
      "the per-tensor reload gamma and the fixed T0 carry the rest")
gamma_ls, t0_ls = em.fit_software()
print(f"gamma: chosen {em.PER_TENSOR_S * 1e3:.3f} ms, least squares over these six rows {gamma_ls * 1e3:.3f} ms; "
      f"T0: chosen {em.PER_UPDATE_S:.2f} s, least squares {t0_ls:.2f} s")
rate, cut, line_ratios = em.bytes_line()
print(f"a line in the bytes alone, T = B / {rate / 1e9:.0f} GB/s {cut:+.2f} s (also fitted to these rows):")
for r, x in zip(engine_rows, line_ratios):
    print(f"  {r.setting:<50} stage model {r.ratio:.2f}   bytes-only line {x:.2f}")
ring_added = [r.predicted_s - em.engine_update(c, g, w, tp, b * em.GIB, ring_latency=False).total
              for r, (c, g, w, tp, b, _) in zip(engine_rows, em.PUBLISHED_TABLE)]
print(f"what the ring's latency adds to the total: at most {max(ring_added) * 1e3:.0f} ms in any row "
      "(the broadcast is hidden under the reload)")

# %%
assert len(engine_rows) == 6 and all(1 / 1.25 <= r.ratio <= 1.25 for r in engine_rows)  # a fit of 2 constants
assert all(r.stages.bound == "reload" for r in engine_rows)
assert all(s < 0.7 for s in shares) and sum(s < 0.4 for s in shares) == 4  # H20 rows: under 40%
assert abs(gamma_ls / em.PER_TENSOR_S - 1) < 0.1 and abs(t0_ls - em.PER_UPDATE_S) < 0.3  # the chosen values ~ the fit
assert all(1 / 1.25 <= x <= 1.25 for x in line_ratios)  # bytes alone fit these rows as well
assert max(ring_added) < 0.01
for model in ("DeepSeek-V3.1 FP8", "Kimi-K2 FP8"):
    few = next(r for r in engine_rows if r.setting.startswith(model) and "16xH20" in r.setting)
    many = next(r for r in engine_rows if r.setting.startswith(model) and "256xH20" in r.setting)
    assert many.stages.h2d < few.stages.h2d and many.predicted_s < few.predicted_s  # published: the other way
print(f"every row within 1.25x of the published time (ratios {min(r.ratio for r in engine_rows):.2f} to "
      f"{max(r.ratio for r in engine_rows):.2f}), but that is two constants fitted to six numbers; the bytes-only "
      f"line is as close ({min(line_ratios):.2f} to {max(line_ratios):.2f}); from 16 to 256 GPUs the model "
      "predicts less time (less H2D per GPU), where the published times are 11-12% longer")

# %% [markdown]
# So agreement on these six rows proves little. The hardware at datasheet rates explains
# under a third to two-thirds of each published time; the rest is $K\gamma + T_0$, and the
# least-squares values of those two constants over the same rows lie close to the round
# values chosen (printed above). Nor can these rows say that the reload, rather than
# something per byte, paces the updates: a line in the bytes alone fits them as well,
# because the tensors and the bytes of these checkpoints grow together. And $T_0$ is not
# a property of the engine: verl reports a 7B update through checkpoint-engine in 0.02 s
# (REFERENCES.md), so whatever $T_0$ holds in this benchmark (the request to vLLM,
# allocating three buckets of GPU memory and their IPC handles, the post-load hook of a
# large FP8 model, tearing down the process group) grows with the model or is absent in
# verl's integration; the model has no term for it. The ring's latency, about 8 ms per
# bucket on 256 GPUs (a 512 KiB chunk at a sixteenth of the rate, 255 hops), adds almost
# nothing to the total (printed above), because the broadcast runs under the reload.
#
# A real test needs data the constants were not chosen on. The engine's README at its
# first commit (7185b55) published the same six settings with other bucket sizes; the
# same model, nothing changed:

# %%
earlier_rows = em.published_comparison(em.EARLIER_TABLE)
print(em.format_table(earlier_rows))
outside = [r for r in earlier_rows if not 1 / 1.25 <= r.ratio <= 1.25]
print(f"rows outside 1.25x: {len(outside)} (" + ", ".join(f"{r.setting.rsplit(', bucket', 1)[0]}: {r.ratio:.2f}"
                                                   for r in outside) + ")")
print(f"{'setting (earlier -> current bucket)':<48} {'published change':>16} {'model change':>13}")
for old, new, (c, g, w, _tp, b_old, _), (*_, b_new, _p) in zip(earlier_rows, engine_rows, em.EARLIER_TABLE,
                                                             em.PUBLISHED_TABLE):
    label = f"{c.name}, {w}x{g} ({b_old:.2f} -> {b_new:.2f} GiB)"
    print(f"{label:<48} {new.published_s / old.published_s - 1:>+16.0%} {new.predicted_s / old.predicted_s - 1:>+13.0%}")

# %%
assert [r.setting.split(",")[1] for r in earlier_rows] == [r.setting.split(",")[1] for r in engine_rows]
assert all(1 / 1.25 <= r.ratio <= 1.25 for r in earlier_rows if "256x" not in r.setting)
assert len(outside) == 2 and all("256x" in r.setting and 0.7 <= r.ratio < 1 / 1.25 for r in outside)
published_change = [abs(n.published_s / o.published_s - 1) for o, n in zip(earlier_rows, engine_rows)]
model_change = [abs(n.predicted_s / o.predicted_s - 1) for o, n in zip(earlier_rows, engine_rows)]
assert max(model_change) < 0.05 and min(published_change) > 0.06
print("held out: the 8- and 16-GPU rows within 1.25x, the two 256-GPU rows 0.70-0.80x (outside the band); "
      "the model changes by under 5% between the tables, the published times by 7% or more")

# %% [markdown]
# The held-out table is the honest verdict: on 8 and 16 GPUs the model stays within
# 1.25x, on 256 GPUs it predicts about three quarters of the published time, and it
# cannot follow the change between the tables at all. Part of that change is not the
# bucket size: Qwen3 ran 8.5% slower at an almost identical bucket (2.69 against 2.67
# GiB), so the engine or its setup changed too. The README says how: between the two
# commits it adds "We bind each GPU to its corresponding NUMA node to ensure stable H2D
# transfer speeds", its metadata-gathering times fall 19-43% and its P2P times 2.1-2.8x
# (the commits between them rework the P2P path and make the GPU count and memory
# fraction configurable). On 256 GPUs the earlier Kimi-K2 run had
# twice the buckets (512: two rounds) and took 5.5 s longer, far more than the model's
# 1 ms overhead and 8 ms of ring latency per bucket (the latter hidden under the reload); the earlier DeepSeek-V3.1 run had as many buckets as the current one
# in the model (256) and still took 2.5 s longer. Something that grows with the cluster
# (stragglers at each barrier of 256 ranks, a congested fabric, uneven shards: the
# benchmark splits the tensors, not the bytes, evenly) is missing, and these two tables
# cannot say which. Also not modelled: two GPUs sharing one PCIe switch (which would
# lower the H2D rate while both copy) and the engine's fallback without an H2D buffer
# when memory is short.
#
# The bucket size is not free either: the engine uses
# $\min(\max(8\text{ GiB}, \text{largest tensor}), \text{free}/3)$, so buckets never fall
# below the largest tensor (the embedding, 1.2 to 2.2 GiB here) and where the published
# bucket is below 8 GiB it is the free-memory limit. The plot draws each curve solid over
# that range and dotted outside it:

# %%
sizes_gib = [2.0**k for k in np.arange(-8, 6.01, 0.25)]
fig, ax = plt.subplots(figsize=(8, 4.2))
feasible = {}
for ckpt, gpu, n_gpus, tp, bucket_gib, published in em.PUBLISHED_TABLE:
    lo, hi = ckpt.largest_tensor / em.GIB, bucket_gib  # the engine's range: largest tensor .. its bucket (free/3 or 8 GiB)
    curve = [em.engine_update(ckpt, gpu, n_gpus, tp, g * em.GIB).total for g in sizes_gib]
    line, = ax.loglog(sizes_gib, curve, ":", lw=1)
    inside = [(g, c) for g, c in zip(sizes_gib, curve) if lo <= g <= hi] + [(hi, em.engine_update(
        ckpt, gpu, n_gpus, tp, hi * em.GIB).total)]
    inside.sort()
    ax.plot(*zip(*inside), "-", lw=2.5, color=line.get_color(), label=f"{ckpt.name}, {n_gpus}x{gpu}")
    ax.plot(bucket_gib, published, "*", ms=11, color=line.get_color())
    feasible[ckpt.name, n_gpus] = inside
ax.set_xlabel("bucket size (GiB)")
ax.set_ylabel("time of one update (s)")
ax.set_title("The engine model against the bucket size (solid: sizes the engine can run)\nstars: published")
ax.legend(fontsize=7, loc="upper right")
fig.tight_layout()
plt.show()
qwen = [em.engine_update(em.QWEN3_235B, "H800", 8, 8, g * em.GIB).total for g in sizes_gib]
qwen_ok = [c for g, c in feasible["Qwen3-235B-A22B BF16", 8]]
assert qwen[0] > 2 * min(qwen) and max(qwen_ok) < 1.05 * min(qwen_ok)
print(f"Qwen3-235B on 8xH800: {qwen[0]:.0f} s with {sizes_gib[0] * 1024:.0f} MiB buckets (far below what the engine "
      f"runs); over the buckets it can run (1.16 to 2.67 GiB) {min(qwen_ok):.2f} to {max(qwen_ok):.2f} s")

# %% [markdown]
# **Takeaway:** the stage model gets the hardware right and says what it cannot explain.
# At datasheet rates the network and the copies would take 30-67% of the published
# times (26-62% on the earlier table; most on the H800 rows, whose BF16 checkpoints have
# many bytes per tensor); the rest is
# software, carried by a per-tensor reload cost and a fixed cost per update that are, in
# effect, fitted to the six rows they are compared with, and those rows cannot tell a
# cost per tensor from one per byte. On a table held out (the engine's earlier one) the
# model is within 1.25x on 8 and 16 GPUs and at about 0.7-0.8x on 256 GPUs, and it
# predicts almost no effect of the bucket size over the range the engine can run, where
# the published times changed by 7-25% (with software changes mixed in). What it does
# rule out firmly is tiny buckets, far below any size the engine runs.
#
# **The engine's other mode, P2P.** Everything above is the broadcast, which updates every
# instance at once. P2P is for **new instances joining while the others keep serving**
# (after a restart, or as GPUs become available): to leave the serving GPUs alone, the
# weights go from the existing instances' pinned **CPU memory** over RDMA
# (`mooncake-transfer-engine`) straight to the new instances' GPUs, and the engine assigns
# the buckets to each sender-receiver pair so that every sender's and receiver's NICs stay
# busy. Its README (at a291782) publishes a P2P column beside the broadcast one, measured
# updating at most 16 GPUs of each cluster. The numbers are printed below as published;
# **P2P is not modelled here** (nothing above predicts them):

# %%
print(f"published update times, README at a291782 (P2P: at most {em.P2P_MAX_UPDATED_GPUS} GPUs of the cluster updated)")
print(em.format_p2p_table())
p2p_ratio = [p[5] / b[5] for p, b in zip(em.P2P_TABLE, em.PUBLISHED_TABLE)]
assert all(1 < x < 1.25 for x in p2p_ratio) and max(p2p_ratio[4:]) < min(p2p_ratio[:4])
print(f"P2P takes {min(p2p_ratio):.2f}-{max(p2p_ratio):.2f}x the broadcast's time; closest on the 256-GPU "
      "clusters, where it still updates only 16 GPUs")

# %% [markdown]
# The calculator below is the simpler model of (09.1)-(09.5) with assumed cluster rates
# (`scale_model.CLUSTER_ASSUMED`: ideal overlap, **no per-tensor cost**): it shows what
# the bytes alone would cost through the network and the copies, not what section 9's
# reload adds, so for the published settings it answers differently:

# %%
kimi_calc = sm.update_time("pipelined", em.KIMI_K2.nbytes, sm.CLUSTER_ASSUMED, bucket_bytes=8 * em.GIB,
                           n_receivers=256, tp=16)
print(f"Kimi-K2 on 256xH20, 8 GiB buckets: calculator (bytes only, assumed rates) {kimi_calc:.1f} s; "
      f"section 9's stage model {engine_rows[-1].predicted_s:.1f} s; published {engine_rows[-1].published_s:.2f} s")
sm.calculator()

# %% [markdown]
# ## Glossary of the metrics in this lesson
#
# | metric | meaning |
# |---|---|
# | time per update | seconds from a barrier of all ranks until every receiver committed the new version (naive: and read every tensor once); median over updates |
# | effective bandwidth | model bytes / time per update (GB/s, $10^9$ bytes/s) |
# | roofline | the flat method: one broadcast of one already-packed buffer, no copies (09.1 with $n = 1$); a reference, not a bound (zero-copy can beat it) |
# | flat + checksums | the roofline with the same sum64 pass on each side: the like-for-like roofline of the checksummed methods |
# | stage / transfer / reload | per rank: packing and checksums (sender), waiting on messages, verifying and unpacking into the model (receiver) |
# | bucket size | bytes per flat buffer; the number of buckets is the number of messages $n$ |
# | kept bytes | bytes of weights a receiver holds (its shard with resharding) |
# | max abs error | largest $\lvert$received $-$ exact$\rvert$ over all weights, for bf16 and delta updates |
# | version | the update's number; a receiver commits only increasing versions |
# | kept version | the version a receiver's active weights hold after a rejected update |
# | alpha, beta, sigma, rho | the scale model's per-message latency, link bandwidth, staging and reload rates |
# | gamma | the scale model's fixed cost per tensor packed or unpacked (seconds) |
# | eta | overlap efficiency of the pipelined method (09.3): 1 hides all but the slowest stage, 0 runs them in turn, < 0 slower than in turn |
#
# ## Summary
#
# - A weight update is $B$ bytes through three stages (stage, transfer, reload); per
#   message it also pays a latency $\alpha$ (09.1).
# - Per-tensor broadcasts pay $\alpha$ per tensor; buckets pay it per bucket, and the
#   metadata (names, shapes, dtypes, offsets) goes once. What keeps a bucketed update
#   from the flat broadcast is the copies and checksums around the transfer (section 3);
#   the zero-copy update removes the copies.
# - With double buffers the stages can overlap, and ideally the slowest one sets the time
#   (09.3, $\eta = 1$); that needs the stages to run on different hardware, as on GPU
#   nodes. On two CPU cores the fitted overlap efficiency $\eta$ is below 1 and can come out
#   negative: then it absorbs the stage times' undercount of the bucketed update (section 8),
#   not a slowdown by overlapping.
# - Receivers reshard while reloading (09.5); bf16 halves the bytes, deltas make its
#   rounding error more than 10x smaller (asserted; section 6 prints the errors).
# - Versions, per-bucket checksums, a status all-reduce and a staging copy make an update
#   all-or-nothing; a corrupt bucket, a stale version, a shape mismatch or a dead sender
#   leave the old weights in place.
# - checkpoint-engine's schedule at datasheet rates explains only part of its published
#   times (30-67%); a per-tensor reload cost and a fixed cost per update, in effect fitted
#   to the same six rows, carry the rest, and a line in the bytes fits those rows as well.
#   On the engine's earlier table (held out) the model is within 1.25x on 8 and 16 GPUs
#   but at 0.72-0.76x on 256 GPUs, and it misses the 11-12% that 256 GPUs add over 16.
#
# **Full scale.** `COURSE_SCALE=full` measures models of 64 MiB to 4 GiB and buckets up to
# 1 GiB; run it with `.venv/bin/course run 09 --scale full`. On GPUs the same code runs
# with `run_trials(..., backend="nccl")`: every rank takes its own GPU, and the buffers,
# the weights, the control messages and the sum64 checksums move to it (NCCL needs one
# GPU per rank, so at least two). The full-scale figures (gloo on the CPUs of a GPU host,
# 64, 256 and 1024 MiB; the 4096 MiB group did not fit in the time) and the CPU figures are
# in `BENCHMARKS.md`; the NCCL path was not measured (it needs a GPU per rank, at least two,
# and the machines lent to this course had one).
#
# **References.** MoonshotAI, *checkpoint-engine* (README: Kimi-K2 updated across thousands
# of GPUs in about 20 s; its published table, quoted above, measures 16.04 s on 256 H20
# GPUs; buckets, ping-pong buffer, broadcast and P2P modes). Perplexity research, 2025: 1.3 s cross-machine updates of Kimi-K2 with one-sided
# RDMA writes and a precomputed transfer schedule. open-instruct issue: per-parameter RPCs
# turning a ~0.5 s NCCL transfer into a >120 s sync. PyTorch `torch.distributed`
# (broadcast, all_reduce, gloo/NCCL backends); Hugging Face `safetensors`.
#
# **Exercises:** `exercises/09_weight_sync.ipynb`: bucket packing with offsets, the
# double-buffered schedule, shard ranges for resharding, and bucket verification. Grade
# with `course grade exercises/09_weight_sync.ipynb`.
