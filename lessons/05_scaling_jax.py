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
# # 05 · Scaling out in JAX: devices, sharding, collectives, many processes
#
# Lesson 04 compiled a whole PPO run into one XLA program. **Once the training step is one
# compiled program, scaling out is a question of *where each array lives* and *which
# collective moves it*.** Data parallelism is a batch split over devices plus an all-reduce
# of gradients; tensor parallelism splits the weights instead and moves activations. The
# same program runs on one device, many devices or many hosts, and it must give the same
# answer: that is the first thing we test, and the thing most scaled-out training code
# gets subtly wrong.
#
# This machine has no accelerator, so XLA splits the CPU into several *host devices*.
# Each is a full JAX device with its own buffers: meshes, shardings and collectives behave
# as on GPUs or TPUs, and the code below runs unchanged on a pod. Only the speeds differ.
#
# **Learning goals**
# 1. Place arrays on a `Mesh` with `NamedSharding` / `PartitionSpec`, see the placement,
#    and know what `jax.jit` does with sharded inputs (and the error when they disagree).
# 2. Use the collectives inside `jax.shard_map` (`psum`, `pmean`, `all_gather`,
#    `psum_scatter`, `ppermute`); build a ring all-reduce from `ppermute` and compare
#    its measured time with the bandwidth model $2\frac{N-1}{N}M$.
# 3. Shard lesson 04's PPO over devices and check that 1 and N devices give the same
#    parameters; meet the `check_vma` trap and see why Adam hides it.
# 4. Split an MLP over a 2-D `data` x `model` mesh (column- then row-parallel) and count
#    the communication each layout needs.
# 5. Run the data-parallel step in several processes (`jax.distributed`), and use the
#    memory and precision tools (remat, bf16, gradient accumulation, learning-rate
#    scaling) with their costs measured.
# 6. Read a profile of a data-parallel step, and run the scaling checklist.
#
# Builds on lesson 04 (the jitted PPO, `course_lib.ppo_jax`).

# %% [markdown]
# The device count is fixed when JAX starts its backend (the first computation), so the
# first cell asks for 4 CPU devices before anything else touches JAX.

# %%
from course_lib.scaling.devices import use_cpu_devices

use_cpu_devices(4)

import os
import re
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import course_lib
from course_lib import current_scale, pick, show_source
from course_lib.scaling.devices import check_multidevice_safe, data_mesh
from course_lib.runtime.watchdog import watchdog

print(f"course_lib {course_lib.__version__} | scale: {current_scale()} | backend: {jax.default_backend()}")
print("devices:", jax.devices())

# %% [markdown]
# ### Reliability first: why every multi-device cell runs under a watchdog
#
# On this machine (jaxlib 0.10.2, 2 cores) multi-device CPU programs used to hang now and
# then. We found the cause with `gdb` on a hung process: all host devices share one
# intra-op thread pool (one thread per core), and JAX's LAPACK kernels (QR, Cholesky,
# eigh: `jnp.linalg.*`, and `jax.nn.initializers.orthogonal`, which lesson 04's PPO uses)
# split a batched call into tasks on that pool and *block* a pool thread until they
# finish. Two devices in such a kernel at once block both threads, and nobody is left to
# run the tasks: a deadlock. The minimal reproducer, `jit(shard_map(qr))` of a
# `[256, 64, 64]` batch over 2 devices called 100 times, hung in 6 runs of 6 on the idle
# machine (and in none of 5 with other work on the cores: the two devices must be inside
# the kernel at the same moment); with the orthogonal
# initialisation moved out of the sharded program, the 16-seed PPO that hung 4 runs in 6
# ran 8 in 8.
#
# Two rules follow, and the course's code keeps both:
# * **no linear algebra inside a program that runs on several CPU devices**: initialise
#   on one device and pass the result in. `check_multidevice_safe(jitted, *args)`
#   compiles a program and refuses it if it holds a LAPACK call;
# * **every multi-device computation runs under `watchdog(seconds, what)`**: a hung XLA
#   call cannot be interrupted from Python, so on expiry the watchdog prints what hung,
#   the likely cause and every thread's stack, and ends the process (exit code 124)
#   instead of leaving a notebook that never finishes.
#
# The stress test (`bench/bench_multidevice_stress.py`) runs each of this lesson's
# multi-device programs 30 times in fresh processes; BENCHMARKS.md records the result.

# %% [markdown]
# ## 1 · Devices, meshes and shardings
#
# A **mesh** arranges devices in a named grid; a **`PartitionSpec`** says, per array
# dimension, which mesh axis splits it (`None`: not split); a **`NamedSharding`** is the
# pair. A batch `[B, D]` with `P("data")` is cut into row blocks, one per device; the
# parameters with `P()` are *replicated*: every device holds a full copy.

# %%
mesh = data_mesh(4)  # 1-D mesh over 4 devices, axis "data"
batch = jnp.arange(8 * 3, dtype=jnp.float32).reshape(8, 3)
weights = jnp.ones((3, 2))
batch_sharded = jax.device_put(batch, NamedSharding(mesh, P("data")))
weights_replicated = jax.device_put(weights, NamedSharding(mesh, P()))
for name, arr in (("batch P('data')", batch_sharded), ("weights P()", weights_replicated)):
    shards = [(s.device.id, s.data.shape) for s in arr.addressable_shards]
    print(f"{name:16} global {arr.shape} -> shard per device {shards}")
jax.debug.visualize_array_sharding(batch_sharded)
jax.debug.visualize_array_sharding(weights_replicated)

# %% [markdown]
# **What `jit` does with shardings.** `jax.jit` compiles for the shardings its inputs
# carry; XLA's partitioner then decides the output's sharding and inserts any collective
# the computation needs. Multiplying a row-sharded batch by replicated weights needs no
# communication (each device multiplies its rows) and the product stays row-sharded; a
# sum over the batch needs an all-reduce, and XLA adds it.

# %%
with watchdog(60, "jit on sharded inputs (4 CPU devices)"):
    product = jax.block_until_ready(jax.jit(lambda x, w: x @ w)(batch_sharded, weights_replicated))
    total = jax.block_until_ready(jax.jit(lambda x: x.sum(0))(batch_sharded))
print("x @ w sharding:", product.sharding.spec, "| x.sum(0) sharding:", total.sharding.spec)
hlo = jax.jit(lambda x: x.sum(0)).lower(batch_sharded).compile().as_text()
print("collectives XLA inserted for x.sum(0):", sorted({op for op in ("all-reduce", "all-gather") if op in hlo}))
assert product.sharding.spec[0] == "data" and "all-reduce" in hlo

# %% [markdown]
# When the shardings a program is told to expect disagree with the arrays it gets, JAX
# does not silently move data: `shard_map` with an explicit mesh refuses an input placed
# differently from its `in_specs`.

# %%
unplaced = jnp.ones((8, 3))  # on device 0 only, not split
try:
    jax.jit(jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(unplaced)
except ValueError as err:
    print("ValueError:", str(err).split(". ")[0])

# %% [markdown]
# ## 2 · Collectives inside `shard_map`
#
# `jax.shard_map(f, mesh, in_specs, out_specs)` runs `f` once per device on that
# device's block: the *per-device view*, as an MPI or NCCL program would be written. The
# devices talk only through collectives over a named mesh axis. Device $i$ starts with
# row $i$ of a $4 \times 4$ matrix:
#
# | collective | each device ends with |
# |---|---|
# | `psum` (all-reduce) | the sum of all devices' values |
# | `pmean` | their mean |
# | `all_gather` | every device's value, stacked |
# | `psum_scatter` (reduce-scatter) | one $1/N$ slice of the sum |
# | `ppermute` | a neighbour's value (here: from device $i-1$) |

# %%
from course_lib.scaling.collectives import collective_demo, format_collective_demo, ring_allreduce

demo = collective_demo(mesh)
print(format_collective_demo(demo))
assert np.array_equal(demo["ring_allreduce"], demo["psum"])

# %% [markdown]
# ### A ring all-reduce from `ppermute`
#
# NCCL and gloo implement a large all-reduce as a **ring**: cut the $M$-byte buffer into
# $N$ chunks; in $N-1$ *reduce-scatter* steps each device passes one chunk to its
# neighbour and adds the chunk it receives, so that each device ends up owning the full
# sum of one chunk; in $N-1$ *all-gather* steps the finished chunks travel round the ring.
# Each step sends $M/N$ bytes, so every device sends
#
# $$\text{bytes sent per device} = 2\,\frac{N-1}{N}\,M \tag{05.2}$$
#
# independent of $N$ for large $N$: the ring uses every link's bandwidth at once. With a
# per-step latency $\alpha$ and a link bandwidth $\beta$, the time is
# $t(M) = 2(N-1)\,\alpha + 2\frac{N-1}{N}\frac{M}{\beta}$ (the $\alpha$-$\beta$ model).

# %%
show_source(ring_allreduce)

# %% [markdown]
# We time the ring against the built-in `psum` over message sizes, interleaved, and fit
# the $\alpha$-$\beta$ model to each. On host devices the "links" are memory copies, so
# the absolute numbers say little about a GPU cluster; the *shape* (latency-bound small
# messages, bandwidth-bound large ones) is the same everywhere.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.collectives import measure_allreduce

SIZES = pick(cpu=[2**k for k in range(12, 23, 2)], full=[2**k for k in range(12, 27, 2)])
measured = measure_allreduce(mesh, SIZES, repeats=pick(cpu=5, full=9))
print(f"load average {os.getloadavg()[0]:.1f} | 4 devices | medians of {measured.repeats} interleaved calls")
print(f"{'MiB':>8} {'psum ms':>9} {'ring ms':>9} {'ring/psum':>9} {'ring model ms':>14} {'max |diff|':>10}")
for row in measured.rows:
    print(
        f"{row.nbytes / 2**20:8.3f} {row.psum_s * 1e3:9.3f} {row.ring_s * 1e3:9.3f} {row.ring_over_psum:9.2f}"
        f" {row.ring_model_s * 1e3:14.3f} {row.max_abs_diff:10.1e}"
    )
for name, fit in (("psum", measured.psum_fit), ("ring", measured.ring_fit)):
    print(f"{name}: alpha = {fit.alpha_s * 1e6:.0f} us/step, beta = {fit.bandwidth_bytes_per_s / 1e9:.2f} GB/s")

fig, ax = plt.subplots(figsize=(6, 3.5))
mib = np.array([r.nbytes for r in measured.rows]) / 2**20
ax.loglog(mib, [r.psum_s * 1e3 for r in measured.rows], "o-", label="psum (XLA's all-reduce)")
ax.loglog(mib, [r.ring_s * 1e3 for r in measured.rows], "s-", label="ring from ppermute")
ax.loglog(mib, [r.ring_model_s * 1e3 for r in measured.rows], "k--", label="alpha-beta fit of the ring")
ax.set_xlabel("message size per device (MiB)")
ax.set_ylabel("time (ms)")
ax.set_title("All-reduce on 4 CPU host devices")
ax.legend()
plt.show()

# %%
# The claims the table shows, on any load: the ring is exact, and the cost per byte falls
# with the message (latency-bound at the small end, bandwidth-bound at the large end:
# 1000x the bytes for far less than 1000x the time).
assert max(r.max_abs_diff for r in measured.rows) < 1e-3
small, large = measured.rows[0], measured.rows[-1]
for name in ("ring_s", "psum_s"):
    assert getattr(large, name) / large.nbytes < 0.2 * getattr(small, name) / small.nbytes, name
assert np.median([r.ring_over_psum for r in measured.rows]) > 1  # the next cell's point: XLA's own is faster

# %% [markdown]
# The hand-written ring is exact but slower than XLA's own all-reduce here: `psum` on host
# devices is one in-memory reduction that the runtime schedules as a unit, while our ring
# pays a rendezvous for each of its $2(N-1)$ steps. On a GPU cluster, NCCL runs this
# ring (or a tree) in a single fused kernel. The lesson of eq. 05.2 is what each device
# must *send*, and that is the same for both.

# %% [markdown]
# ## 3 · Data-parallel PPO: one program, one answer, any device count
#
# Each of $N$ devices runs `num_envs / N` environments and computes the PPO gradient on
# its share of every minibatch; the devices average their gradients before the identical
# Adam step:
#
# $$g = \frac{1}{N}\sum_{d=1}^{N} g_d, \qquad g_d = \nabla_\theta \frac{1}{|B_d|}\sum_{i \in B_d} \ell_i(\theta) \tag{05.1}$$
#
# With equal shares $|B_d| = |B|/N$, $g$ is exactly the full minibatch's gradient. Every
# device then applies the same update to the same parameters, so they stay identical
# without being broadcast.
#
# ```
# params <- init on ONE device (orthogonal init = QR: not inside the multi-device program)
# train = jit(shard_map(body, in_specs=(P(), P("data"), P()), out_specs=P()))
# body(params, my_env_keys):                       # runs on each device
#     for update u:                                # lax.scan
#         rollout of MY envs, noise from fold_in(env_key, u)     # no communication
#         GAE on MY envs                                          # no communication
#         for each minibatch (slots m of every one of MY envs):   # lax.scan
#             mean, std of advantages  <- pmean over "data"       # 2 tiny all-reduces
#             g_d = grad(local mean loss)
#             g   = pmean(g_d, "data")                            # THE all-reduce (05.1)
#             params <- Adam(clip(g))                             # identical everywhere
# ```
#
# Three choices make the answer independent of $N$ (`course_lib.scaling.ppo_dp`): randomness per
# *environment*, not per device; minibatches stratified by environment (minibatch $m$
# takes slots $m$ of every env's shuffled steps, so a global minibatch is the union of the
# local ones); and global statistics by collectives (advantage normalisation, metrics).

# %%
from course_lib.scaling.ppo_dp import PPOConfig, compiled_dp_train, env_keys, init_flat_params, run_dp, shard_inputs, synced_gradient

N_ENVS = pick(cpu=32, full=4096)
DP_CONFIG = PPOConfig(num_envs=N_ENVS, num_steps=128, total_timesteps=N_ENVS * 128 * 4)
runs = {}
with watchdog(300, "data-parallel PPO on 1, 2 and 4 CPU devices"):
    for n in (1, 2, 4):
        runs[n] = run_dp(DP_CONFIG, data_mesh(n), seed=0)
start = np.asarray(init_flat_params(jax.random.split(jax.random.key(0))[0], DP_CONFIG))  # what run_dp starts from
print(f"{DP_CONFIG.num_updates} updates x {DP_CONFIG.grad_steps_per_update} minibatch steps, {DP_CONFIG.num_envs} envs, {len(start)} parameters")
moved = np.abs(runs[1][0] - start).max()
print(f"how far training moved the parameters (max |change|): {'> 1e-3' if moved > 1e-3 else f'{moved:.1e}'}")
for n in (2, 4):
    diff = np.abs(runs[n][0] - runs[1][0]).max()
    print(f"{n} devices vs 1 device: max |param difference| {'< 1e-5' if diff < 1e-5 else f'= {diff:.1e}'}")
    assert diff < 1e-5
    assert np.array_equal(runs[n][1]["charts/episodes"], runs[1][1]["charts/episodes"])
assert moved > 1e-3  # 100x the tolerance: the comparison is of trained parameters

# %% [markdown]
# The parameters agree to float rounding (summing two halves instead of one whole changes
# the last bits) after every minibatch step of every update, and the episode counts agree
# exactly. **Reproducibility** is the stronger, bitwise property of running the same
# program twice:

# %%
with watchdog(120, "data-parallel PPO twice on 2 CPU devices"):
    again = run_dp(DP_CONFIG, data_mesh(2), seed=0)[0]
print("same seed, same devices, bitwise equal:", np.array_equal(again, runs[2][0]))
assert np.array_equal(again, runs[2][0])

# %% [markdown]
# ### The `check_vma` trap
#
# `shard_map` tracks which values vary across devices (`check_vma=True`, the default).
# Then the gradient of a replicated `P()` parameter, taken inside the map, comes back
# **already summed** over devices (the transpose of the implicit broadcast is a `psum`),
# and a `pmean` on it does nothing: the gradient is $N$ times eq. 05.1. Two spellings are
# right: `check_vma=False` with an explicit `pmean` (`sync="pmean"`), or `check_vma=True`
# with the loss scaled by $1/N$ (`sync="vma"`). `sync="trap"` is the bug.

# %%
def mse(params, batch):
    x, y = batch
    return ((jnp.tanh(x @ params["w"]) @ params["v"] - y) ** 2).mean()


k = jax.random.split(jax.random.key(0), 4)
toy_params = {"w": jax.random.normal(k[0], (5, 7)), "v": jax.random.normal(k[1], (7,))}
toy_batch = (jax.random.normal(k[2], (16, 5)), jax.random.normal(k[3], (16,)))
one_device = jax.grad(mse)(toy_params, toy_batch)["v"]
with watchdog(60, "synced gradients on 4 CPU devices"):
    ratios = {
        s: float(np.linalg.norm(synced_gradient(mse, toy_params, toy_batch, mesh, sync=s)["v"]) / np.linalg.norm(one_device))
        for s in ("pmean", "vma", "trap")
    }
for sync, ratio in ratios.items():
    print(f"sync={sync:6} |gradient| / |one-device gradient| = {ratio:.3f}")
assert abs(ratios["pmean"] - 1) < 1e-4 and abs(ratios["vma"] - 1) < 1e-4 and abs(ratios["trap"] - 4) < 1e-3

# %% [markdown]
# Why does such a bug survive in real code? Because **Adam hides it**: Adam divides the
# gradient's running mean by the root of its running second moment, so a gradient 4 times
# too large gives nearly the same step (and gradient clipping rescales it anyway). Plain
# SGD, weight decay relative to the gradient, a logged gradient norm or loss scaling all
# see the factor. One Adam step and one SGD step with $g$ and $4g$:

# %%
g = {"v": one_device}
for name, opt in (("adam", optax.adam(1e-3, eps=1e-5)), ("sgd", optax.sgd(1e-3))):
    step = lambda grad, opt=opt: opt.update(grad, opt.init(toy_params["v"]))[0]  # noqa: E731
    u1, u4 = step(g["v"]), step(4 * g["v"])
    print(f"{name}: |step(4g)| / |step(g)| = {float(jnp.linalg.norm(u4) / jnp.linalg.norm(u1)):.3f}")

# %% [markdown]
# So test the *equivalence* of 1 and N devices (section 3's first cell), not only that the
# loss goes down: a loss curve under Adam looks the same with the bug.
#
# ### Throughput: 1 device vs 2
#
# On CPU host devices every all-reduce is a rendezvous of the devices' threads, about
# 0.1 ms whatever its size (section 2's fit), so `ppo_dp` keeps their *count* low: one per
# minibatch step (the gradient, flattened into one vector), two per update for the
# advantage statistics of all the update's minibatches at once, and the metrics once after
# the last update. `scaling.dp_speedup` times three runs, interleaved, 5 each, medians:
#
# - **1 device**: the whole run on device 0;
# - **2 devices**: the data-parallel run (the same training, as section 3 asserted);
# - **2 halves, no communication**: the 1-device program on half the environments,
#   dispatched on device 0 *and* device 1 before waiting for either. Not a correct training
#   run (the halves never average their gradients), but exactly the 2-device run's work
#   without its all-reduces: the most this machine's 2 cores can give, the **ceiling**.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.checklist import SPEEDUP_RUNS, dp_speedup

with watchdog(300, "data-parallel PPO throughput, 1 vs 2 CPU devices"):
    load_before = os.getloadavg()[0]
    thr = dp_speedup(DP_CONFIG, repeats=5)
print(f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
for run in SPEEDUP_RUNS:
    cpu = np.median(thr.cpu_per_wall[run])
    print(f"{run:27} median {thr.median(run):.3f} s -> {thr.steps_per_s(run):,.0f} env steps/s, {cpu:.2f} CPU s per s")
print(f"speed-up 2 devices / 1 device: {thr.speedup:.2f}x   ceiling (2 halves / 1 device): {thr.ceiling:.2f}x")

# %%
# The figures vary with the load (printed): another process on the machine takes a core
# from the 2-device runs first. What holds on any load: splitting the run over 2 devices
# does not cost more than it gains, and it gives the same parameters.
assert thr.speedup > 0.7, thr.speedup
assert thr.max_abs_diff < 1e-5

# %% [markdown]
# How to read it (the `bench/bench_dp_scaling.py` table in BENCHMARKS.md has the same three
# runs at 32 and 128 envs). The gap between the speed-up and the ceiling is what keeping
# the devices in step costs: 18 rendezvous per update, at each of which the faster device
# waits for the slower (with one rendezvous per all-reduce, 50 per update, the benchmark
# measured 1.24x against a ceiling of 1.73x). The ceiling itself is below 2 because one
# device already uses more than one core for part of its work (XLA's intra-op threads: its
# CPU seconds per second, printed, are above 1): the larger the batch, the more of the
# second core the 1-device run takes for itself and the less a second device can add (at
# 128 envs the benchmark's ceiling is about 1.2x). On GPUs each device has its own
# silicon and the ceiling is N; there, too, the count and placement of collectives is
# what decides how close a run comes.

# %% [markdown]
# ## 4 · A 2-D mesh: data x model (tensor parallelism)
#
# When the weights, not the batch, are the problem, split the *weights*. In a 2-layer MLP
# $y = \mathrm{relu}(xW_1 + b_1)W_2 + b_2$ (Megatron-LM's layout), $W_1$ is split by
# **columns** over `model` (each device computes a slice of the hidden units, no
# communication), and $W_2$ by **rows** (each device multiplies its hidden slice by its
# rows, giving a *partial* $y$); one `psum` over `model` adds the partials. On a
# `data` x `model` mesh the batch is split over `data` as before, and the gradients of the
# weights are all-reduced over `data` only.

# %%
from course_lib.scaling import tensor_parallel as tp

B, D_IN, H, D_OUT = 16, 8, 32, 4
mlp_params = tp.init_mlp(jax.random.key(0), D_IN, H, D_OUT, bias_scale=0.1)
x = jax.random.normal(jax.random.key(1), (B, D_IN))
reference = tp.mlp_reference(mlp_params, x)
with watchdog(120, "tensor-parallel MLP on 2-D meshes of 4 CPU devices"):
    for n_data, n_model in ((4, 1), (2, 2), (1, 4)):
        out = jax.block_until_ready(tp.tp_mlp(mlp_params, x, tp.tp_mlp_mesh(n_data, n_model)))
        err = float(jnp.abs(out - reference).max())
        print(f"mesh data={n_data} x model={n_model}: max |y - y_unsharded| {'< 1e-5' if err < 1e-5 else f'= {err:.1e}'}")
        assert err < 1e-5

# %% [markdown]
# What each layout must send per training step (ring collectives, eq. 05.2; float32),
# for a layer big enough to matter, 8 devices, batch 1024, 4096 -> 16384 -> 4096:

# %%
comm = tp.layout_communication(batch=1024, d_in=4096, d_hidden=16384, d_out=4096, n_data=2, n_model=4)
print(f"{'layout':<16} {'mesh':>7} {'forward MB':>11} {'backward+sync MB':>17} {'weights MB/device':>18}")
for c in comm.values():
    print(
        f"{c.layout:<16} {c.n_data:>3}x{c.n_model:<3} {c.forward_bytes / 1e6:11.1f} {c.backward_bytes / 1e6:17.1f}"
        f" {c.param_bytes_per_device / 1e6:18.1f}"
    )

# %% [markdown]
# Data parallelism sends the whole gradient (every weight) each step but keeps a full copy
# of the weights on every device; tensor parallelism sends activations, which scale with
# the batch, and stores $1/N$ of the weights; the 2-D layout trades between them. Which
# wins depends on batch size, layer size and which links are fast (tensor parallelism
# inside a node on NVLink, data parallelism across nodes), exactly the reasoning of
# Megatron-LM and of lesson 08's layout model.

# %% [markdown]
# ## 5 · Many processes: `jax.distributed` on localhost
#
# On a cluster each host runs its own Python process (*multi-controller* JAX): every
# process runs the same script, calls `jax.distributed.initialize(coordinator, N, i)`,
# and then sees every process's devices in `jax.devices()` while holding data only on
# its own (`jax.local_devices()`). Each process builds its part of the batch on the host
# and `jax.make_array_from_process_local_data(sharding, local)` makes one global array
# of the pieces; the same `jit(shard_map(...))` program then runs with its `pmean`
# crossing process boundaries (gloo over TCP on CPUs, NCCL on GPUs).
#
# `course_lib.scaling.multihost` is that script; `course_lib.runtime.jax_processes.launch`
# starts the processes with a timeout, each in its own process group, and if one dies it
# stops the others at once and says which one died and why: no orphan waits 100 s for a
# peer's heartbeat. Two processes, one CPU device each, run data-parallel SGD on a
# regression, each with its own half of a 32-row batch; we compare with the same steps in
# this kernel on one device and the whole batch.

# %%
from course_lib.scaling import multihost
from course_lib.runtime.jax_processes import ProcessFailed

t0 = time.perf_counter()
results = multihost.launch_program("dp_sgd", n_processes=2, timeout_s=120)
launch_s = time.perf_counter() - t0
opts = multihost.WorkerOptions()
x_all, y_all = multihost.regression_rows(opts.seed, 0, 2 * opts.batch_per_process, opts.d_in)
init = multihost.init_mlp(jax.random.key(opts.seed), opts.d_in, opts.hidden)
one = data_mesh(1)
with watchdog(60, "dp_sgd on one device"):
    single, _ = jax.block_until_ready(
        multihost.make_dp_sgd(one, opts.steps, opts.lr)(
            jax.device_put(init, NamedSharding(one, P())), *(jax.device_put(a, NamedSharding(one, P("data"))) for a in (x_all, y_all))
        )
    )
diff = max(float(np.abs(np.asarray(r.result["params"][k]) - np.asarray(single[k])).max()) for r in results for k in single)
print(f"2 processes, global batch {results[0].result['global_batch']}, {opts.steps} SGD steps")
print(f"loss {results[0].result['losses'][0]:.3f} -> {results[0].result['losses'][-1]:.3f}")
print(f"max |params(2 processes) - params(1 device, whole batch)|: {'< 1e-5' if diff < 1e-5 else f'{diff:.1e}'}")
assert diff < 1e-5 and results[0].result["losses"][-1] < 0.5 * results[0].result["losses"][0]

# %% [markdown]
# And when a process dies (an injected crash in process 1, half a second in), the
# launcher ends the other one and raises an error that names the culprit:

# %%
try:
    multihost.launch_program("psum", n_processes=2, timeout_s=60, fault="crash", fault_process=1, fault_after_s=0.5)
except ProcessFailed as err:
    print(type(err).__name__ + ":", re.sub(r"after [0-9.]+ s", "after (varies) s", str(err).splitlines()[0]))

# %% [markdown]
# **On real hosts** the same worker runs unchanged: start one process per host (or per
# GPU) with `COURSE_COORDINATOR_ADDRESS=<host 0>:<port>`, `COURSE_NUM_PROCESSES` and
# `COURSE_PROCESS_ID` set (or, on TPU pods and SLURM, with none of them:
# `jax.distributed.initialize()` finds them itself), e.g.
#
# ```
# host0$ COURSE_COORDINATOR_ADDRESS=10.0.0.1:1234 COURSE_NUM_PROCESSES=2 COURSE_PROCESS_ID=0 python -m course_lib.scaling.multihost --program dp_ppo --backend default
# host1$ COURSE_COORDINATOR_ADDRESS=10.0.0.1:1234 COURSE_NUM_PROCESSES=2 COURSE_PROCESS_ID=1 python -m course_lib.scaling.multihost --program dp_ppo --backend default
# ```
#
# The test suite runs the `dp_ppo` program (this lesson's PPO) in 2 processes and checks
# it against the single-device run (`tests/test_jax_processes.py`); it is left out here
# because compiling it in two more processes costs about a minute on this machine.

# %% [markdown]
# ## 6 · Memory and precision tools, measured
#
# Scaling out buys memory and compute by adding devices; four tools buy them inside a
# device, each with a price.
#
# **Rematerialisation** (`jax.checkpoint`, Chen et al. 2016). Backpropagation keeps every
# layer's activations from the forward pass. Wrapping a layer in `jax.checkpoint` keeps
# only its input and recomputes the rest during the backward pass: less memory, one more
# forward's worth of compute. We read the memory from XLA's analysis of the *compiled*
# gradient program (`compiled.memory_analysis()`: arguments, outputs and `temp`, the
# scratch buffers that hold the activations), for a 16-layer MLP of width 512 on a batch
# of 256.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.remat import compare_remat

remat = compare_remat(depth=16, width=512, batch=256, repeats=3, variants=("none", "per_layer"))
print(f"load average {os.getloadavg()[0]:.1f}")
print(f"{'variant':<14} {'temp MB':>8} {'total MB':>9} {'median ms':>10} {'same grad':>10}")
for r in remat:
    print(f"{r.variant:<14} {r.temp_bytes / 1e6:8.1f} {r.total_bytes / 1e6:9.1f} {r.median_step_s * 1e3:10.1f} {r.grad_equal!s:>10}")

# %%
by = {r.variant: r for r in remat}
assert all(r.grad_equal for r in remat)
assert by["per_layer"].temp_bytes < 0.6 * by["none"].temp_bytes  # remat keeps far fewer activations

# %% [markdown]
# The memory falls by the factor the table shows, with the same gradient; the time cost
# (one more forward per layer) is the median column, measured interleaved.
#
# **bf16 mixed precision** keeps float32 *master* weights and does the forward and
# backward in bfloat16 (8 bits of mantissa, float32's exponent range, so no loss
# scaling is needed, unlike float16). Its error against float32 on 3 fresh problems,
# and its speed (medians of 5 interleaved steps):

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.precision import precision_errors, step_times

errors = precision_errors(seeds=(0, 1, 2))
speed = step_times(repeats=5)
print(f"bf16 vs f32: loss relative error mean {errors.loss_mean:.1e} (max {errors.loss_max:.1e}); "
      f"gradient relative error mean {errors.grad_mean:.1e} (max {errors.grad_max:.1e}); gradient dtype {errors.grad_dtype}")
print(f"load average {os.getloadavg()[0]:.1f} | step f32 {speed.f32_median_s * 1e3:.1f} ms, bf16 {speed.bf16_median_s * 1e3:.1f} ms "
      f"-> bf16 speedup {speed.bf16_speedup:.2f}x")

# %%
assert 0 < errors.grad_max < 5e-2 and errors.grad_dtype == "float32"
assert speed.bf16_speedup < 1.15  # no bf16 gain on this CPU (XLA converts to float32 and back)

# %% [markdown]
# The error is real but small (bf16 carries about 3 significant digits). On this CPU
# bf16 is not faster: there are no bf16 matrix units, and XLA converts. On GPUs (tensor
# cores) and TPUs (the MXU) bf16 matrix products run at 2x or more the float32 rate and
# halve the bytes moved, which is why large-scale training uses it.
#
# **Gradient accumulation** computes a large batch's gradient as the mean of $K$
# micro-batch gradients, one after the other (`lax.scan`):
#
# $$\nabla L_B = \frac{1}{K}\sum_{k=1}^{K} \nabla L_{M_k}, \qquad |M_k| = |B|/K \tag{05.3}$$
#
# equal to the full-batch gradient, with the activations of one micro-batch in memory:

# %%
# NBVAL_IGNORE_OUTPUT
# (XLA's buffer assignment, and so the temp bytes, differs by a few percent between compilations)
from course_lib.scaling.accumulation import accumulated_grad, accumulation_memory
from course_lib.scaling.remat import mlp_loss, mlp_problem

acc_params, acc_x, acc_y = mlp_problem(0, 4, 64, 256)
full_grad = jax.grad(mlp_loss)(acc_params, acc_x, acc_y)
worst = 0.0
for n_micro in (2, 4, 8):
    acc = accumulated_grad(lambda p, b: mlp_loss(p, *b), acc_params, (acc_x, acc_y), n_micro)
    worst = max(worst, max(float(jnp.abs(a - f).max()) for a, f in zip(jax.tree.leaves(acc), jax.tree.leaves(full_grad))))
print(f"accumulated over 2, 4, 8 micro-batches vs one batch: max |difference| {'< 1e-5' if worst < 1e-5 else f'{worst:.1e}'}")
assert worst < 1e-5
rows = accumulation_memory(n_micros=(1, 4, 16))
for row in rows:
    label = "whole batch" if row.n_micro == 0 else f"{row.n_micro} x {row.micro_batch}"
    print(f"{label:>12}: temp {row.memory.temp_bytes / 1e6:6.1f} MB")
assert rows[-1].memory.temp_bytes < 0.5 * rows[0].memory.temp_bytes

# %% [markdown]
# **Learning-rate scaling.** A $k$ times larger batch gives a gradient with $1/k$ the
# variance, and takes $k$ times fewer steps over the same samples. To keep up, the rate
# grows: linearly (Goyal et al. 2017, with warm-up, for SGD) or with the square root
# (Krizhevsky 2014; Hoffer et al. 2017, which keeps the update's noise constant):
#
# $$\eta(B) = \eta_0\,\frac{B}{B_0} \quad\text{or}\quad \eta(B) = \eta_0\sqrt{B/B_0} \tag{05.4}$$
#
# A small experiment: a student MLP learns a teacher's labels with plain SGD, the same
# 65,536 samples at every batch size, 4 seeds per cell (final held-out loss, mean ± std):

# %%
from course_lib.scaling.lr_rules import lr_scaling_experiment

lr_result = lr_scaling_experiment(batch_sizes=(32, 128, 1024), seeds=(0, 1, 2, 3))
print(lr_result.table())
mean, std = lr_result.mean_std()
rules = list(lr_result.rules)
none, linear = rules.index("none"), rules.index("linear")
print(f"largest batch {lr_result.batch_sizes[-1]}: unscaled {mean[-1, none]:.3f} vs linear {mean[-1, linear]:.3f}")
assert mean[-1, none] > mean[-1, linear] + 2 * std[-1, linear]
assert mean[-1, linear] < mean[-1, rules.index("sqrt")] < mean[-1, none]

# %% [markdown]
# Without scaling, the largest batch takes 32 times fewer steps of the same size and ends
# far behind; linear scaling recovers nearly all of the gap here and the square root
# most of it. The rules are starting points, not
# laws: past a *critical batch size* (McCandlish et al. 2018) larger batches stop paying,
# and Adam-type optimisers follow the square-root rule more closely.

# %% [markdown]
# ## 7 · Profiling a data-parallel run: where the time goes
#
# `jax.profiler.trace(folder)` records every XLA op each device ran, with its start and
# duration, into the folder (`plugins/profile/<time>/`: an `.xplane.pb` for TensorBoard's
# profile plugin or XProf, and Chrome-trace / Perfetto JSON). `course_lib.scaling.profiling`
# reads the JSON and sums the ops' own time (not counting what is nested inside them) by
# category: compute, collectives (their time includes waiting at the rendezvous for the
# slower device) and host work. We trace one call of the 2-device PPO program of
# section 3.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.course.paths import output_dir
from course_lib.scaling.profiling import summarize_trace, trace

mesh2, key = data_mesh(2), jax.random.key(1)  # section 3's 2-device program (compiled, cached)
flat, keys = shard_inputs(mesh2, init_flat_params(key, DP_CONFIG), env_keys(key, DP_CONFIG.num_envs))
fn, args = compiled_dp_train(DP_CONFIG, mesh2), (flat, keys, jax.device_put(key, NamedSharding(mesh2, P())))
run_dir = trace(fn, *args, out_dir=output_dir() / "05_scaling_jax" / "profile")
summary = summarize_trace(run_dir)
print(f"load average {os.getloadavg()[0]:.1f}")
print(summary.table(top=6))
print("trace written to", run_dir.relative_to(output_dir().parent))

# %%
assert summary.categories.get("compute", 0) > 0 and summary.categories.get("collective", 0) > 0
assert summary.n_devices == 2

# %% [markdown]
# How to read it: the shares are of *thread* time, summed over every thread XLA and the
# profiler used, so on this 2-core machine much of it is threads waiting for work
# (`waiting`) and the profiler's own bookkeeping (`profiler`). Of the work, the matrix
# products (`dot`) lead, and the all-reduces (`psum.*`: the gradient of every minibatch
# step, the advantage statistics once per update) come next; their time includes the
# rendezvous, where the faster device waits for the slower one, which is why it is
# larger than the pure transfer cost that the checklist in section 8 measures.
#
# To look at it yourself, open `perfetto_trace.json.gz` from that folder in
# <https://ui.perfetto.dev> (the file stays on your machine: the page runs locally in the
# browser), or point TensorBoard with the profile plugin (or XProf) at the `profile`
# folder. You will see the two devices' rows, each minibatch step's fusions and, between
# them, the all-reduce where the faster device waits for the slower one.

# %% [markdown]
# ## 8 · The scaling checklist, executable
#
# Before trusting a scaled-out run, check five things; `course_lib.scaling.checklist` measures them
# for the data-parallel PPO of section 3 (1 device vs 2) and returns a report:
#
# 1. **learning-rate scaling**: the global batch differs from the one the rate was tuned
#    at (here, say, a quarter of it): what the linear and square-root rules (05.4) suggest;
# 2. **1 vs N devices**: the same seed and global batch give the same parameters;
# 3. **communication**: the share of the run spent in the gradient all-reduce (a chain of
#    all-reduces of the gradient's size, one per minibatch step, timed on the same mesh);
# 4. **memory per device**: from the compiled programs' memory analysis;
# 5. **reproducible**: the same run twice is bitwise equal.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.checklist import scaling_checklist

report = scaling_checklist(DP_CONFIG, n_devices=2, base_batch=DP_CONFIG.minibatch_size // 4, base_lr=DP_CONFIG.lr)
print(f"load average {os.getloadavg()[0]:.1f}")
print(report.table())

# %%
assert report.row("1 vs N devices").verdict == "ok" and report.row("reproducible").verdict == "ok"

# %% [markdown]
# ## Equation -> function
#
# | equation | what | where |
# |---|---|---|
# | 05.1 | data-parallel gradient $g = \frac1N\sum_d g_d$ | `course_lib.scaling.ppo_dp.synced_gradient`, `make_dp_train` (`sync="pmean"` / `"vma"`) |
# | 05.2 | ring all-reduce: $2\frac{N-1}{N}M$ bytes sent per device | `course_lib.scaling.collectives.ring_allreduce`, `ring_allreduce_bytes_sent_per_device` |
# | α-β model | $t = 2(N-1)\alpha + 2\frac{N-1}{N}M/\beta$ | `course_lib.scaling.collectives.allreduce_time_model`, `fit_alpha_beta` |
# | layouts | bytes per step of data / tensor / 2-D parallelism | `course_lib.scaling.tensor_parallel.layout_communication` |
# | 05.3 | gradient accumulation $g = \frac1K\sum_k g_k$ | `course_lib.scaling.accumulation.accumulated_grad` |
# | 05.4 | learning-rate scaling $\eta = \eta_0 \frac{B}{B_0}$ or $\eta_0\sqrt{B/B_0}$ | `course_lib.scaling.lr_rules.scaled_lr` |
#
# ## Glossary of measured quantities
#
# | quantity | meaning |
# |---|---|
# | max \|param difference\| | largest absolute difference between two runs' final flat parameters |
# | env steps/s | environment steps of a whole data-parallel PPO run / its wall-clock time, compile excluded |
# | psum ms, ring ms | median time of one blocked all-reduce call (interleaved with the other) |
# | α (us/step), β (GB/s) | per-message latency and bandwidth of the fitted α-β model |
# | forward / backward+sync MB | bytes each device sends per training step in a layout (ring collectives) |
# | temp / peak bytes | XLA's compiled-memory analysis: scratch buffers / arguments + outputs + scratch |
# | compute / collective / waiting | thread-ms in compute ops / collectives (incl. rendezvous) / idle in a profile |
#
# ## Summary
#
# * Where each array lives is a `NamedSharding` (mesh + `PartitionSpec`); `jit` compiles
#   for the shardings its inputs carry and XLA inserts the collectives the computation
#   needs. `shard_map` writes the per-device program yourself, with explicit collectives.
# * A ring all-reduce is a reduce-scatter plus an all-gather, each device sending
#   $2\frac{N-1}{N}M$ bytes (05.2); built from `ppermute` it equals `psum`.
# * Data-parallel PPO gives the same parameters on 1, 2 and 4 devices (to float rounding)
#   because randomness is keyed per environment, minibatches are stratified by
#   environment, and global statistics use collectives. The `check_vma` trap gives $N$
#   times the gradient, and Adam hides it: test equivalence, not only the loss.
# * Tensor parallelism splits the weights (column- then row-parallel: one all-reduce of
#   activations per MLP); the layouts trade gradient traffic against activation traffic
#   and memory.
# * Several processes run one program after `jax.distributed.initialize`; host-local
#   pieces become global arrays; a launcher must stop every process when one dies.
# * On CPUs, LAPACK calls inside multi-device programs deadlock the shared thread pool:
#   keep them out, and run multi-device work under a watchdog.
#
# ## Full scale
#
# `COURSE_SCALE=full` uses 4096 environments for the data-parallel PPO and message sizes
# up to 64 MiB for the all-reduce. On one GPU the mesh has one device (the single-device
# path); the absolute figures, where a GPU was lent, are in BENCHMARKS.md ("Full scale on
# a GPU"). The 2-core CPU benchmarks (`python bench/run.py dp_scaling collectives`) are
# there too.
#
# ## References
#
# * JAX documentation: *Distributed arrays and automatic parallelization*; *Manual
#   parallelism with `shard_map`*; *Multi-process environments* (docs.jax.dev).
# * P. Patarasuk, X. Yuan (2009). *Bandwidth optimal all-reduce algorithms for clusters of
#   workstations.* JPDC. (The ring all-reduce's $2\frac{N-1}{N}M$.)
# * M. Shoeybi et al. (2019). *Megatron-LM: Training Multi-Billion Parameter Language
#   Models Using Model Parallelism.* arXiv:1909.08053. (Column- and row-parallel layers.)
# * P. Goyal et al. (2017). *Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour.*
#   arXiv:1706.02677. (Linear learning-rate scaling.) A. Krizhevsky (2014). *One weird
#   trick for parallelizing convolutional neural networks.* arXiv:1404.5997. (Square root.)
# * T. Chen, B. Xu, C. Zhang, C. Guestrin (2016). *Training Deep Nets with Sublinear
#   Memory Cost.* arXiv:1604.06174. (Rematerialisation.)
# * P. Micikevicius et al. (2018). *Mixed Precision Training.* ICLR.
# * C. Lu et al. (2022). *Discovered Policy Optimisation* (PureJaxRL).
#
# ## Exercises
#
# `exercises/05_scaling_jax.ipynb`: partition specs for a batch and a data x model MLP,
# the ring all-reduce from `ppermute`, a data-parallel gradient (and the traps: `psum`
# instead of `pmean`, averaging twice), and gradient accumulation with `lax.scan`. Grade
# with `course grade exercises/05_scaling_jax.ipynb`.
