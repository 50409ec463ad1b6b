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
# answer: that is the first thing we test.
#
# Without enough accelerators, XLA splits the CPU into several *host devices*, each a
# full JAX device with its own buffers: meshes, shardings and collectives run the same
# programs as on GPUs or TPUs; the speeds and some of the compiler's choices differ.
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
#    the communication each layout needs; shard the parameters and optimizer state too
#    (FSDP / ZeRO) and measure the memory per device.
# 5. Lay a mesh over a pod of several slices (fast links inside, slow ones between) and
#    match its axes to the links' bandwidth.
# 6. Run the data-parallel step in several processes (`jax.distributed`), and use the
#    memory and precision tools (remat, bf16, gradient accumulation, learning-rate
#    scaling) with their costs measured.
# 7. Read a profile of a data-parallel step, and run the scaling checklist.
#
# Builds on lesson 04 (the jitted PPO, `course_lib.ppo.jax_ppo`).

# %% [markdown]
# XLA reads its flags and the device count once, when JAX starts, so the first cell sets
# them first: 4 CPU devices, and on GPUs deterministic kernels and full float32 matrix
# products (not TF32), so that 1 and N devices agree to 1e-5. `device_plan` puts the
# meshes on 4 or more accelerators, or else on 4 CPU host devices.

# %%
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()

from course_lib.ppo.jax_ppo import use_reliable_xla_cpu_flags
from course_lib.scaling.devices import device_plan, use_cpu_devices

use_reliable_xla_cpu_flags()  # before the backend starts (use_cpu_devices starts it): later it does nothing
use_cpu_devices(4)

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
from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.devices import data_mesh

jax.config.update("jax_default_matmul_precision", "highest")  # GPUs: true float32, not TF32 (no-op on CPUs)
plan = device_plan(4)
print(f"course_lib {course_lib.__version__} | scale: {current_scale()} | backend: {jax.default_backend()}")
print("plan:", plan.describe())
print("meshes use:", list(plan.multi))

# %% [markdown]
# ### Two rules for several CPU devices
#
# All CPU host devices share one thread pool, and JAX's LAPACK kernels (QR, Cholesky,
# eigh, and so `jax.nn.initializers.orthogonal`) block a pool thread while their tasks
# wait on the same pool: two devices inside such a kernel at once can deadlock. So:
# * **no linear algebra inside a program that runs on several CPU devices**: initialise
#   on one device and pass the result in (`check_multidevice_safe(jitted, *args)`
#   refuses a program that holds a LAPACK call);
# * **every multi-device computation runs under `watchdog(seconds, what)`**: a hung XLA
#   call cannot be interrupted from Python, so on expiry the watchdog prints what hung and
#   every thread's stack, and ends the process (exit code 124).

# %% [markdown]
# ## 1 · Devices, meshes and shardings
#
# A **mesh** arranges devices in a named grid; a **`PartitionSpec`** says, per array
# dimension, which mesh axis splits it (`None`: not split); a **`NamedSharding`** is the
# pair. A batch `[B, D]` with `P("data")` is cut into row blocks, one per device; the
# parameters with `P()` are *replicated*: every device holds a full copy.

# %%
mesh = plan.mesh(4)  # 1-D mesh over 4 devices, axis "data"
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
# carry. On this mesh (`jax.make_mesh`, whose axes are `Explicit` by default in this JAX,
# as the next part explains) JAX works out each result's sharding from type rules while it
# traces, and XLA inserts the collectives the computation needs; on `Auto` axes XLA's
# partitioner decides the shardings itself. Multiplying a row-sharded batch by replicated weights needs no
# communication (each device multiplies its rows) and the product stays row-sharded; a
# sum over the batch needs an all-reduce, and XLA adds it.

# %%
with watchdog(60, "jit on sharded inputs (4 CPU devices)"):
    product = jax.block_until_ready(jax.jit(lambda x, w: x @ w)(batch_sharded, weights_replicated))
    total = jax.block_until_ready(jax.jit(lambda x: x.sum(0))(batch_sharded))
print("x @ w sharding:", product.sharding.spec, "| x.sum(0) sharding:", total.sharding.spec)


def inserted(f, *args):
    """The collectives XLA put into the compiled program of ``f``."""
    hlo = jax.jit(f).lower(*args).compile().as_text()
    return sorted({op for op in ("all-reduce", "all-gather", "all-to-all", "collective-permute") if op in hlo})


print("collectives XLA inserted: x @ w", inserted(lambda x, w: x @ w, batch_sharded, weights_replicated),
      "| x.sum(0)", inserted(lambda x: x.sum(0), batch_sharded))
assert product.sharding.spec[0] == "data" and inserted(lambda x, w: x @ w, batch_sharded, weights_replicated) == []
assert "all-reduce" in inserted(lambda x: x.sum(0), batch_sharded)

# %% [markdown]
# On this mesh, whose axes are `Explicit`, a program refuses an input placed differently
# from what it expects instead of moving it: `shard_map` rejects an array that is not
# split as its `in_specs` say. (On `Auto` axes `jit` reshards such an uncommitted input
# itself, without a word.)

# %%
unplaced = jnp.ones((8, 3))  # on device 0 only, not split
try:
    jax.jit(jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(unplaced)
except ValueError as err:
    print("ValueError:", str(err).split(". ")[0])

# %% [markdown]
# ### Steering the partitioner: `with_sharding_constraint`, explicit sharding, `jax.set_mesh`
#
# A mesh's axes come in two kinds. On an **`Auto`** axis the compiler chooses the layout
# of every intermediate (GSPMD propagation) and you steer it with
# `jax.lax.with_sharding_constraint(x, sharding)`, a hint at one point of the program:
# here, making a row-sharded intermediate replicated makes XLA insert an all-gather.
# On an **`Explicit`** axis (the default of `jax.make_mesh` in this JAX) the sharding is
# part of each array's *type*, visible at trace time (`jax.typeof(x)` prints
# `float32[8@data,3]`); an operation whose output layout is ambiguous is an error until
# you say it (`out_sharding=`), and `jax.sharding.reshard` moves data on purpose.
# `jax.set_mesh(mesh)` makes a mesh the context, so a bare `PartitionSpec` names its axes.

# %%
from jax.sharding import AxisType

auto_mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,), devices=plan.multi)
x_auto = jax.device_put(batch, NamedSharding(auto_mesh, P("data")))
replicate = jax.jit(lambda x: jax.lax.with_sharding_constraint(jnp.tanh(x), NamedSharding(auto_mesh, P())) * 2)
hlo_wsc = replicate.lower(x_auto).compile().as_text()
print("Auto axis, tanh(x) constrained to P():", replicate(x_auto).sharding.spec, "| XLA inserted all-gather:", "all-gather" in hlo_wsc)

explicit_mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,), devices=plan.multi)
x_exp = jax.device_put(batch, NamedSharding(explicit_mesh, P("data")))
with jax.set_mesh(explicit_mesh), watchdog(60, "explicit sharding on 4 devices"):
    print("Explicit axis, types:", jax.typeof(x_exp), "@", jax.typeof(jax.jit(lambda x: x @ jnp.ones((3, 2)))(x_exp)))
    try:
        jax.jit(lambda x: x.T @ x)(x_exp)  # contracts over the sharded axis: which layout should the result have?
    except Exception as err:  # noqa: BLE001  (JAX's ShardingTypeError)
        print(f"x.T @ x -> {type(err).__name__}: {str(err).split('. ')[0]}")
    gram = jax.jit(lambda x: jnp.matmul(x.T, x, out_sharding=P()))(x_exp)
    print("with out_sharding=P():", jax.typeof(gram), "| equals the unsharded x.T @ x:", np.allclose(np.asarray(gram), np.asarray(batch.T @ batch)))
assert "all-gather" in hlo_wsc and replicate(x_auto).sharding.spec == P()
assert np.allclose(np.asarray(gram), np.asarray(batch.T @ batch))

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
from course_lib.scaling.collectives import collective_demo, format_collective_demo

demo = collective_demo(mesh)
print(format_collective_demo(demo))
assert np.array_equal(demo["ring_allreduce"], demo["psum"])

# %% [markdown]
# **The older spelling, `jax.pmap`**: the input's leading axis *is* the device axis.
# It gives the same answer; new code uses `shard_map`, which works on any mesh.

# %%
rows = jnp.arange(16, dtype=jnp.float32).reshape(4, 4)  # device i holds row i, as in the table above
with watchdog(60, "pmap on 4 devices"):
    by_pmap = jax.pmap(lambda r: jax.lax.psum(r, "i"), axis_name="i", devices=plan.multi)(rows)
same = np.array_equal(np.asarray(by_pmap), demo["psum"])
print("pmap's psum on device 0:", np.asarray(by_pmap)[0], "| equal to shard_map's on every device:", same)
assert same

# %% [markdown]
# ### A ring all-reduce from `ppermute`
#
# NCCL and gloo implement a large all-reduce as a **ring**: cut the $M$-byte buffer into
# $N$ chunks; in $N-1$ *reduce-scatter* steps each device passes one chunk to its
# neighbour and adds the chunk it receives, so that each device ends up owning the full
# sum of one chunk; in $N-1$ *all-gather* steps the finished chunks travel round the ring.
# Each step sends $M/N$ bytes, so every device sends
#
# $$\text{bytes sent per device} = 2\,\frac{N-1}{N}\,M \tag{05.1}$$
#
# independent of $N$ for large $N$: the ring uses every link's bandwidth at once. With a
# per-step latency $\alpha$ and a link bandwidth $\beta$, the time is
# $t(M) = 2(N-1)\,\alpha + 2\frac{N-1}{N}\frac{M}{\beta}$ (the $\alpha$-$\beta$ model).
#
# We time the ring against the built-in `psum` over message sizes, interleaved, and fit
# the $\alpha$-$\beta$ model to each. On host devices the "links" are memory copies, so
# the absolute numbers say little about a GPU cluster; the *shape* (latency-bound small
# messages, bandwidth-bound large ones) is the same everywhere.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.collectives import measure_allreduce

SIZES = plan.pick(cpu=[2**k for k in range(12, 23, 2)], full=[2**k for k in range(12, 27, 2)], scale=current_scale())
measured = measure_allreduce(mesh, SIZES, repeats=plan.pick(cpu=5, full=9, scale=current_scale()))
print(f"load average {os.getloadavg()[0]:.1f} | 4 {plan.multi_platform} devices | medians of {measured.repeats} interleaved calls")
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
ax.set_title(f"All-reduce on 4 {plan.multi_platform.upper()} devices")
ax.legend()
plt.show()

# %%
# The claims the table shows, on any load: the ring gives psum's values (to float rounding:
# it adds in another order), and the cost per byte falls
# with the message (latency-bound at the small end, bandwidth-bound at the large end:
# 1000x the bytes for far less than 1000x the time).
assert max(r.max_abs_diff for r in measured.rows) < 1e-5  # float rounding: the additions in another order
small, large = measured.rows[0], measured.rows[-1]
for name in ("ring_s", "psum_s"):
    assert getattr(large, name) / large.nbytes < 0.2 * getattr(small, name) / small.nbytes, name
assert np.median([r.ring_over_psum for r in measured.rows]) > 1  # the next cell's point: XLA's own is faster

# %% [markdown]
# The hand-written ring gives psum's values but is slower than XLA's own all-reduce on
# CPU host devices, where `psum` is not a ring but one reduction in shared memory, while
# our ring pays a rendezvous for each of its $2(N-1)$ steps. So eq. 05.1 describes the
# ring, not XLA's CPU all-reduce. It is the model for networks: NCCL and gloo run a ring
# (or a tree: the same bandwidth term, a latency term in $\log N$) over real links, where
# $2\frac{N-1}{N}M$ is the least an all-reduce among the devices can send per device.
# Switches that reduce in the network (NVLink SHARP, InfiniBand SHARP) halve it: each
# device sends its $M$ bytes once and receives the sum.

# %% [markdown]
# ## 3 · Data-parallel PPO: one program, one answer, any device count
#
# Each of $N$ devices runs `num_envs / N` environments and computes the PPO gradient on
# its share of every minibatch; the devices average their gradients before the identical
# Adam step:
#
# $$g = \frac{1}{N}\sum_{d=1}^{N} g_d, \qquad g_d = \nabla_\theta \frac{1}{|B_d|}\sum_{i \in B_d} \ell_i(\theta) \tag{05.2}$$
#
# With equal shares $|B_d| = |B|/N$, $g$ is exactly the full minibatch's gradient. Every
# device then applies the same update to the same parameters, so they stay identical
# without being broadcast.
#
# In pseudocode, what every device runs:
#
# ```
# params = the same initial parameters on every device          # replicated, P()
# for each update:
#     rollout and GAE on MY num_envs / N environments            # no communication
#     mean, std of the advantages = over ALL devices             # one collective
#     for each minibatch (my share of it):
#         g_d = grad of the mean loss over my share
#         g   = all-reduce-mean of g_d over devices              # eq. 05.2
#         params = Adam(params, g)                                # identical everywhere
# ```
#
# Three choices make the answer independent of $N$: randomness per *environment*, not per
# device; minibatches stratified by environment (minibatch $m$ takes slots $m$ of every
# env's shuffled steps, so a global minibatch is the union of the local ones; lesson 04
# shuffled all samples together, so this learner draws different minibatches from the same
# algorithm); and global statistics by collectives. Here is the per-device function, run
# inside `jit(shard_map(..., in_specs=(P(), P("data"), P()), out_specs=P()))` with the
# parameters replicated (initialised on one device: the orthogonal initialisation is a
# QR) and the env keys split over `data`. The gradient and its all-reduce are one call
# here, because exercise 3 asks you to write them:

# %%
from course_lib.scaling.ppo_dp import (
    PPOConfig,
    compiled_dp_train,
    env_keys,
    init_flat_params,
    ppo_on_my_envs,
    run_dp,
    shard_inputs,
    synced_gradient,
)

show_source(ppo_on_my_envs)

# %% [markdown]
# Per update that is one collective for the advantage statistics of all its minibatches
# and one gradient all-reduce per minibatch step; the metrics are reduced once, after the
# last update. Now the test that matters: the same seed on 1, 2 and 4 devices.

# %%

N_ENVS = plan.pick(cpu=32, full=4096, scale=current_scale())
DP_CONFIG = PPOConfig(num_envs=N_ENVS, num_steps=128, total_timesteps=N_ENVS * 128 * 4)
runs = {}
with watchdog(300, f"data-parallel PPO on 1, 2 and 4 {plan.multi_platform} devices"):
    for n in (1, 2, 4):
        runs[n] = run_dp(DP_CONFIG, plan.mesh(n), seed=0)
start = np.asarray(init_flat_params(jax.random.split(jax.random.key(0))[0], DP_CONFIG))  # what run_dp starts from
print(f"{DP_CONFIG.num_updates} updates x {DP_CONFIG.grad_steps_per_update} minibatch steps, {DP_CONFIG.num_envs} envs, {len(start)} parameters")
moved = np.abs(runs[1][0] - start).max()
print(f"how far training moved the parameters (max |change|): {'> 1e-3' if moved > 1e-3 else f'{moved:.1e}'}")
for n in (2, 4):
    diff = np.abs(runs[n][0] - runs[1][0]).max()
    print(f"{n} devices vs 1 device: max |param difference| {'< 1e-5' if diff < 1e-5 else f'= {diff:.1e}'}")
    assert diff < 1e-5
    if plan.multi_platform == "cpu":  # on GPUs a float near-tie in action sampling could move one episode
        assert np.array_equal(runs[n][1]["charts/episodes"], runs[1][1]["charts/episodes"])
assert moved > 1e-3  # 100x the tolerance: the comparison is of trained parameters

# %% [markdown]
# The final parameters agree to float rounding (two halves summed instead of one whole),
# after every minibatch step of every update: a step that differed would have moved
# every later one. **Reproducibility** is the stronger, bitwise property of running the
# same program twice (on GPUs it needs the first cell's deterministic kernels):

# %%
with watchdog(120, f"data-parallel PPO twice on 2 {plan.multi_platform} devices"):
    again = run_dp(DP_CONFIG, plan.mesh(2), seed=0)[0]
print("same seed, same devices, bitwise equal:", np.array_equal(again, runs[2][0]))
assert np.array_equal(again, runs[2][0])

# %% [markdown]
# ### The `check_vma` trap
#
# `shard_map` tracks which values vary across devices (`check_vma=True`, the default).
# Then the gradient of a replicated `P()` parameter, taken inside the map, comes back
# **already summed** over devices (the transpose of the implicit broadcast is a `psum`),
# and a `pmean` on it does nothing: the gradient is $N$ times eq. 05.2. Two spellings are
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
# ### The same gradient without `shard_map`: `jit` and shardings alone
#
# `shard_map` writes the per-device program by hand. The other way (MaxText's, and
# `jax.jit`'s whole design) is to write the *global* program, place the inputs, and let
# XLA's partitioner split it: the batch sharded over `data`, the parameters replicated,
# and the mean over the batch inside the loss becomes a per-device partial sum plus an
# all-reduce that XLA inserts itself. The toy gradient again, this way:

# %%
auto_dp_mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,), devices=plan.multi)
placed_params = jax.device_put(toy_params, NamedSharding(auto_dp_mesh, P()))
placed_batch = jax.device_put(toy_batch, NamedSharding(auto_dp_mesh, P("data")))
global_grad = jax.jit(jax.grad(mse))
with watchdog(60, "a data-parallel gradient by jit alone"):
    auto_g = global_grad(placed_params, placed_batch)["v"]
auto_hlo = global_grad.lower(placed_params, placed_batch).compile().as_text()
auto_diff = float(np.abs(np.asarray(auto_g) - np.asarray(one_device)).max())
print("gradient sharding:", auto_g.sharding.spec, "| all-reduce inserted by XLA:", "all-reduce" in auto_hlo,
      f"| max |g - one-device g| {'< 1e-5' if auto_diff < 1e-5 else f'= {auto_diff:.1e}'}")
assert "all-reduce" in auto_hlo and auto_diff < 1e-5 and auto_g.sharding.spec == P()

# %% [markdown]
# The same gradient and no trap: the global program says "mean over the whole batch",
# and the partitioner keeps that meaning whatever the layout. The price is control: which
# collective runs where is the compiler's choice; `shard_map` decides it yourself, as
# `ppo_dp` does to keep its rendezvous few.
#
# ### Throughput against the device count, with its ceiling
#
# Every all-reduce is a rendezvous where the faster device waits for the slower, so
# `ppo_dp` keeps their *count* low: 17 per update here (16 minibatch steps, one for the
# advantage statistics). `checklist.dp_scaling` times, in 5 interleaved rounds:
#
# - **N devices** for N = 1, 2, 4: the data-parallel run;
# - **N pieces, no communication**: the 1-device program on $1/N$ of the environments on
#   each of the N devices at once. Not a correct training run (the pieces never average
#   their gradients), but the N-device run's work without its all-reduces: the
#   **ceiling** it is measured against (a reference, not a strict bound: a smaller program
#   can fit the caches better).
#
# The share of the ideal that synchronising costs is then $1 - \text{speed-up}/\text{ceiling}$
# (transfers, rendezvous and waiting, together): by definition, arithmetic on the medians.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.checklist import ceiling_run, device_run, dp_scaling

with watchdog(300, f"data-parallel PPO throughput on 1, 2, 4 {plan.multi_platform} devices"):
    thr = dp_scaling(DP_CONFIG, (1, 2, 4), repeats=5, devices=plan.multi)
print(f"load average {thr.load_before[0]:.1f} before, {thr.load_after[0]:.1f} after | {DP_CONFIG.num_envs} envs")
print(f"{'devices':>7} {'env steps/s':>12} {'ceiling steps/s':>16} {'speed-up':>9} {'ceiling':>8} {'lost to sync':>13}")
for n in thr.device_counts:
    ceil = thr.steps_per_s(ceiling_run(n)) if n > 1 else thr.steps_per_s(device_run(1))
    print(f"{n:>7} {thr.steps_per_s(device_run(n)):>12,.0f} {ceil:>16,.0f} {thr.speedup(n):>8.2f}x {thr.ceiling(n):>7.2f}x"
          f" {thr.sync_share(n):>12.0%}")

counts = list(thr.device_counts)
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(counts, [thr.steps_per_s(device_run(n)) for n in counts], "o-", label="data-parallel run")
ax.plot(counts, [thr.steps_per_s(ceiling_run(n)) if n > 1 else thr.steps_per_s(device_run(1)) for n in counts], "s--",
        label="ceiling: N pieces, no communication")
ax.plot(counts, [n * thr.steps_per_s(device_run(1)) for n in counts], ":", color="grey", label="N x one device")
ax.set_xticks(counts)
ax.set_xlabel(f"{plan.multi_platform.upper()} devices")
ax.set_ylabel("env steps / s")
ax.set_title(f"Data-parallel PPO, {DP_CONFIG.num_envs} envs (medians of 5)")
ax.legend()
plt.show()

# %%
# NBVAL_IGNORE_OUTPUT
# Each round gives one run / ceiling ratio (t_pieces / t_run); a verdict only where every round agrees.
assert all(thr.max_abs_diff[n] < 1e-5 for n in thr.device_counts)  # the timed runs trained alike
for n in thr.device_counts[1:]:
    per_round = sorted(p / r for p, r in zip(thr.times[ceiling_run(n)], thr.times[device_run(n)], strict=True))
    lo, hi = per_round[0], per_round[-1]
    if hi < 1:
        verdict = "below the ceiling in every round: keeping the devices in step cost something here"
    elif lo > 1:
        verdict = "above the ceiling in every round: the pieces ran slower than the run, so no cost can be read"
    else:
        verdict = "the rounds straddle the ceiling: no cost of synchronisation shows beyond this run's noise"
    print(f"{n} devices: {thr.fraction(n):.2f} of the ceiling (rounds {lo:.2f} to {hi:.2f}); {verdict}")

# %% [markdown]
# The printed rounds are this run's noise: a gap smaller than their spread says nothing.
# Here the CPU devices share the machine's few cores (oversubscription, not scaling), and
# another process takes a core from one device (hence the load printed above). On GPUs
# each device has its own silicon: the speed-up approaches N with enough work per device
# between collectives, and their count and placement decide how close a run comes.
#
# At full scale on an accelerator, the same PPO with 4,096 environments on one device
# (`plan.main`):

# %%
# NBVAL_IGNORE_OUTPUT
if plan.pick_main(cpu=False, full=True, scale=current_scale()):
    MAIN_CONFIG = PPOConfig(num_envs=4096, num_steps=128, total_timesteps=4096 * 128 * 4)
    main_mesh = data_mesh(1, devices=plan.main)
    with watchdog(600, f"PPO, 4096 envs on one {plan.main_platform} device"):
        run_dp(MAIN_CONFIG, main_mesh, seed=0)  # compiles
        t0 = time.perf_counter()
        run_dp(MAIN_CONFIG, main_mesh, seed=0)
        main_s = time.perf_counter() - t0
    print(f"one {plan.main_platform} device, {MAIN_CONFIG.num_envs} envs: {MAIN_CONFIG.total_timesteps / main_s:,.0f} env steps/s "
          f"({MAIN_CONFIG.total_timesteps:,} steps in {main_s:.2f} s, compile excluded)")
else:
    print(f"(full scale on an accelerator only; here: scale {current_scale()}, main device {plan.main_platform})")

# %% [markdown]
# ## 4 · A 2-D mesh: data x model (tensor parallelism)
#
# When the weights, not the batch, are the problem, split the *weights*. In a 2-layer MLP
# $y = \mathrm{relu}(xW_1 + b_1)W_2 + b_2$ (Megatron-LM's layout), $W_1$ is split by
# **columns** over `model` (each device computes a slice of the hidden units, no
# communication), and $W_2$ by **rows** (each device multiplies its hidden slice by its
# rows, giving a *partial* $y$); one `psum` over `model` adds the partials. On a
# `data` x `model` mesh the batch is split over `data` as before, and the gradients of the
# weights are all-reduced over `data` only. Each device runs this block on its shard of
# the weights and of the batch:

# %%
from course_lib.scaling import tensor_parallel as tp

show_source(tp.tp_block)

# %%

B, D_IN, H, D_OUT = 16, 8, 32, 4
mlp_params = tp.init_mlp(jax.random.key(0), D_IN, H, D_OUT, bias_scale=0.1)
x = jax.random.normal(jax.random.key(1), (B, D_IN))
reference = tp.mlp_reference(mlp_params, x)
with watchdog(120, f"tensor-parallel MLP on 2-D meshes of 4 {plan.multi_platform} devices"):
    for n_data, n_model in ((4, 1), (2, 2), (1, 4)):
        out = jax.block_until_ready(tp.tp_mlp(mlp_params, x, tp.tp_mlp_mesh(n_data, n_model, devices=list(plan.multi))))
        err = float(np.abs(np.asarray(out) - np.asarray(reference)).max())
        print(f"mesh data={n_data} x model={n_model}: max |y - y_unsharded| {'< 1e-5' if err < 1e-5 else f'= {err:.1e}'}")
        assert err < 1e-5

# %% [markdown]
# **The backward pass.** The forward psum's transpose is free (its cotangent is already
# the same on every `model` device). But the gradient with respect to the block's input,
# $dx = dh\,W_1^\top$, is a *partial* sum on each device (each holds only its columns of
# $W_1$). For the first layer, whose input is data, nobody needs $dx$; for a block inside
# a deep network (every Megatron layer after the first) it must be completed by a second
# all-reduce over `model`, of $x$'s size. The compiled gradient shows it: the all-reduces
# XLA put into one training step of the block on a 2 x 2 mesh, without and with $dx$:

# %%
tp_mesh = tp.tp_mlp_mesh(2, 2, devices=list(plan.multi))
with watchdog(120, "tensor-parallel gradients on a 2 x 2 mesh"):
    first_layer = tp.training_allreduces(mlp_params, x, tp_mesh, x_needs_grad=False)
    inner_block = tp.training_allreduces(mlp_params, x, tp_mesh, x_needs_grad=True)
for name, found in (("first layer (x is data)", first_layer), ("inside a deep network", inner_block)):
    print(f"{name}:")
    for shapes, axis in found:
        print(f"    all-reduce over {axis:<5} of {shapes}")
extra = sorted(set(inner_block) - set(first_layer))
print("extra in the deep network's backward:", extra)
assert extra == [(f"f32[{B // 2},{D_IN}]", "model")] and len(inner_block) == len(first_layer) + 1

# %% [markdown]
# What each layout must send per training step (ring collectives, eq. 05.1; float32),
# for a block big enough to matter, 8 devices, batch 1024, 4096 -> 16384 -> 4096, as a
# block inside a deep network (the $dx$ all-reduce counted):

# %%
comm = tp.layout_communication(batch=1024, d_in=4096, d_hidden=16384, d_out=4096, n_data=2, n_model=4, x_needs_grad=True)
print(f"{'layout':<16} {'mesh':>7} {'forward MB':>11} {'backward dx MB':>15} {'grad sync MB':>13} {'weights MB/device':>18}")
for c in comm.values():
    print(
        f"{c.layout:<16} {c.n_data:>3}x{c.n_model:<3} {c.forward_bytes / 1e6:11.1f} {c.dx_bytes / 1e6:15.1f}"
        f" {c.grad_sync_bytes / 1e6:13.1f} {c.param_bytes_per_device / 1e6:18.1f}"
    )
tpc = comm["tensor parallel"]
assert tpc.dx_bytes == tpc.forward_bytes  # x and y are both [B, 4096]: the backward all-reduce equals the forward one
assert comm["data parallel"].forward_bytes == comm["data parallel"].dx_bytes == 0

# %% [markdown]
# Data parallelism sends the whole gradient (every weight) each step but keeps a full copy
# of the weights on every device; tensor parallelism sends activations twice per block
# (forward $y$, backward $dx$, the same size here), which scale with the batch, and
# stores $1/N$ of the weights; the 2-D layout trades between them. Which
# wins depends on batch size, layer size and which links are fast (tensor parallelism
# inside a node on NVLink, data parallelism across nodes), exactly the reasoning of
# Megatron-LM and of lesson 08's layout model.

# %% [markdown]
# ## 5 · Sharding the parameters too: FSDP / ZeRO
#
# Data parallelism keeps a full copy of the parameters *and* of the optimizer state on
# every device: with Adam in float32 that is 4 + 8 bytes per parameter, plus 4 for the
# gradient, on each of $N$ devices. **ZeRO** (Rajbhandari et al. 2020) and PyTorch's
# **FSDP** (Zhao et al. 2023) shard them over the same `data` axis instead: each device
# holds $1/N$ of every weight and of its Adam moments; just before a layer runs, its
# weights are **all-gathered**; the gradient comes back **reduce-scattered**, so each device
# receives only the (summed) gradient of its own shard and updates it with its own shard
# of the optimizer state. In pseudocode, one device's step:
#
# ```
# my_shard = 1/N of every weight; my_adam = Adam state of my_shard only
# for each layer, forward:   W = all-gather(my_shard of the layer)      # (N-1)/N M in all
#                            activations = layer(W, my batch)          # (free W, or keep it)
# for each layer, backward:  (all-gather W again if it was freed)      # ZeRO-3: +(N-1)/N M
#                            g_shard = reduce-scatter(dL/dW) / N       # (N-1)/N M in all
# my_shard = Adam(my_shard, g_shard, my_adam)                          # no communication
# ```
#
# The all-gather plus the reduce-scatter send $2\frac{N-1}{N}M$ bytes per device, the ring
# all-reduce's (eq. 05.1): an all-reduce *is* a reduce-scatter followed by an all-gather,
# and FSDP moves the all-gather to where the weights are needed. Gathering again in the
# backward makes it 1.5x (ZeRO's figure).
#
# One device's step, written with `shard_map`: the gradient is taken with respect to the
# *shards*, so JAX transposes each `all_gather` into a reduce-scatter by itself:

# %%
from course_lib.scaling import fsdp

show_source(fsdp._gathered_layer)
show_source(fsdp.fsdp_forward)
show_source(fsdp.fsdp_step)

# %% [markdown]
# Against data parallelism (`pmean` of replicated gradients, replicated Adam), the same
# MLP, batch and 5 Adam steps on 4 devices. Memory per device is *measured*: the bytes of
# the parameter and Adam-state shards that actually live on each device
# (`addressable_shards`), then XLA's plan for the step; the collectives are read from the
# program JAX traced and from the one XLA compiled.

# %%
# NBVAL_IGNORE_OUTPUT
with watchdog(120, f"FSDP vs data parallelism on 4 {plan.multi_platform} devices"):
    zero3 = fsdp.fsdp_vs_dp(4, steps=5, devices=list(plan.multi))
    regather = fsdp.fsdp_vs_dp(4, steps=5, devices=list(plan.multi), regather_in_backward=True)
print(fsdp.format_fsdp_vs_dp(zero3))
print("\nwith the weights gathered again in the backward (regather_in_backward=True):")
print(f"  all-gathers traced by JAX: {regather.fsdp.collectives_traced.get('all-gather', 0)} (kept: "
      f"{zero3.fsdp.collectives_traced.get('all-gather', 0)}); compiled by XLA: {regather.fsdp.collectives.get('all-gather', 0)}; "
      f"traffic FSDP / DP by ZeRO's ring formula, {regather.traffic_ratio:.2f}")

# %%
print("same parameters as data parallelism (<= 1e-6) after training moved them > 1e-2:",
      zero3.max_abs_param_diff <= 1e-6 and zero3.max_param_moved > 1e-2)
print(f"parameters + Adam state per device, DP / FSDP: {zero3.resident_ratio:.2f} (N = 4)")
print(f"bytes per step FSDP / DP by ZeRO's ring formula: kept {zero3.traffic_ratio:.2f}, gathered again {regather.traffic_ratio:.2f}")
print("XLA temp memory per device larger for FSDP (the gathered weights):", zero3.fsdp.memory.temp_bytes > zero3.dp.memory.temp_bytes)
assert zero3.max_abs_param_diff <= 1e-6 and zero3.max_param_moved > 1e-2  # the same training
assert regather.max_abs_param_diff <= 1e-6
assert 3.9 < zero3.resident_ratio <= 4.0  # 1/N of the parameters and optimizer state per device
assert regather.fsdp.collectives_traced["all-gather"] > zero3.fsdp.collectives_traced["all-gather"]
assert zero3.fsdp.memory.temp_bytes > zero3.dp.memory.temp_bytes

# %% [markdown]
# The parameters come out the same as data parallelism's, and each device holds a quarter
# of the parameters and Adam state (the only replicated value is Adam's 4-byte step
# count). The price is visible in XLA's plan: the step's *temporary* memory grows, because
# the gathered full weights live there while the step runs. The first variant gathers
# once and keeps the weights through the backward (PyTorch FSDP's `SHARD_GRAD_OP`): the
# same bytes as data parallelism. FSDP's default (`FULL_SHARD`) and ZeRO-3 gather again in
# the backward: JAX traces the extra all-gathers (a `jax.checkpoint` around each layer),
# 1.5x the bytes by ZeRO's ring formula (a formula chosen by the flag, not read from the
# program). On this CPU backend XLA merges the backward's gathers back into the forward's (the
# compiled count), so the compiled program sends what the first variant does, and the
# memory that re-gathering saves cannot be shown here.
#
# At scale the stages of ZeRO are the memory budget of a run. The paper's Figure 1 (7.5B
# parameters, 64 devices, mixed-precision Adam at 2 + 2 + 12 bytes per parameter),
# recomputed by `zero_memory_per_device`:

# %%
print(fsdp.format_zero_table())
assert [round(fsdp.zero_memory_per_device(7.5e9, 64, stage, accounting="mixed") / 1e9, 1) for stage in (0, 1, 2, 3)] == [120.0, 31.4, 16.6, 1.9]

# %% [markdown]
# ## 6 · Pods of slices: matching mesh axes to the links
#
# A large job's devices are not all connected alike. Inside a TPU slice (or an NVLink
# domain of 8 GPUs) chips talk over **ICI** (NVLink): hundreds of GB/s per chip. Between
# slices (nodes) they talk over the **DCN**, the data-center network (InfiniBand,
# Ethernet): about 9x less per GPU on an H100 system, 60-100x less per chip on TPU v5e/v5p
# (the table below). A mesh for such a job is **hybrid**: its
# outer axis crosses slices, its inner axes stay inside one. JAX builds it with
# `jax.experimental.mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape)`, which
# groups devices by their `slice_index`. `topology.hybrid_mesh` uses it when the devices'
# slice indices name as many slices as the DCN axes ask for; CPU host devices have no
# index and the GPUs of one host all carry index 0, so there it groups consecutive
# devices into "slices" the same way. The program is the same; only which devices sit
# along which axis changes. Two "slices" of two devices:

# %%
from course_lib.scaling import topology

slices_mesh = topology.hybrid_mesh((1, 2), (2, 1), ("data", "model"), devices=list(plan.multi))
print(slices_mesh, "| device ids by [data, model]:", np.vectorize(lambda d: d.id)(slices_mesh.devices).tolist())
with watchdog(60, "psum over each axis of a 2 x 2 hybrid mesh"):
    sums = topology.psum_demo(slices_mesh)
for name, value in sums.items():
    print(f"{name:>15}: {value.tolist()}")
assert sums["psum over both"].tolist() == [[22.0, 22.0], [22.0, 22.0]]

# %% [markdown]
# `data` crosses the slices (DCN), `model` stays inside one (ICI). Why that way round:
# tensor parallelism all-reduces activations twice per layer (section 4), on the critical
# path of every forward and backward, while data parallelism all-reduces the gradient
# once per step and can overlap it with the backward pass. Published link figures (bytes
# per second, each way and both ways):

# %%
print(topology.format_links())

# %% [markdown]
# With them, the communication of one training step of 32 Megatron MLP blocks (d_model
# 4096, 16k tokens per step, bf16; a transformer layer's attention block adds two more
# all-reduces of the same size, doubling the `model` column) on 2 nodes x 8 H100s, tensor parallelism
# over 8 and data parallelism over 2, with `model` on NVLink and `data` on InfiniBand,
# and the other way round (ring all-reduces, eq. 05.1; the latencies are assumptions,
# stated in `topology.ASSUMED_ALPHA_S`):

# %%
placement = topology.axis_assignment_cost(topology.PUBLISHED_LINKS["h100_nvlink4"], topology.PUBLISHED_LINKS["ndr_infiniband_cx7"])
print(topology.format_axis_assignment(placement))
right, wrong = placement["model on fast, data on slow"], placement["model on slow, data on fast"]
assert wrong.total_s > 3 * right.total_s and wrong.model_s > 5 * right.model_s

# %% [markdown]
# The same bytes cost several times more on the wrong links. Megatron-LM keeps tensor
# parallelism inside a node's NVLink domain and data parallelism across nodes; MaxText
# puts `data` across TPU slices and tensor parallelism on ICI. The model gives every hop
# of an axis's ring one link's published bandwidth, and leaves out overlap, hierarchical
# collectives, the several NICs of a node and congestion: read it as the direction of
# the effect, not a step time.

# %% [markdown]
# ## 7 · Many processes: `jax.distributed` on localhost
#
# On a cluster each host runs its own Python process (*multi-controller* JAX): every
# process runs the same script, calls `jax.distributed.initialize(coordinator, N, i)`,
# and then sees every process's devices in `jax.devices()` while holding data only on
# its own (`jax.local_devices()`). Each process builds its part of the batch on the host
# and `jax.make_array_from_process_local_data(sharding, local)` makes one global array
# of the pieces; the same `jit(shard_map(...))` program then runs with its `pmean`
# crossing process boundaries (gloo over TCP on CPUs, NCCL on GPUs).
#
# `course_lib.scaling.multihost` is that script; `jax_processes.launch` starts the
# processes, each in its own process group, and if one dies it stops the others at once
# and says which one died and why. Every process first joins the job and builds one mesh
# over all processes' devices:

# %%
from course_lib.runtime.jax_processes import ProcessFailed
from course_lib.scaling import multihost

show_source(multihost.join_cluster)

# %% [markdown]
# and then turns its own rows into its part of one global array (with `P("data")` the
# global batch is the processes' rows concatenated in process order; with `P()` every
# process passes the same whole value, a replicated array), and runs the same
# `jit(shard_map(...))` step as one process would:

# %%
show_source(multihost.global_array)
show_source(multihost.program_dp_sgd)

# %% [markdown]
# Two processes, one CPU device each, run that data-parallel SGD on a regression, each
# with its own half of a 32-row batch; we compare with the same steps in this kernel on
# one device and the whole batch.

# %%

t0 = time.perf_counter()
results = multihost.launch_program("dp_sgd", n_processes=2, timeout_s=120)
launch_s = time.perf_counter() - t0
opts = multihost.WorkerOptions()
x_all, y_all = multihost.regression_rows(opts.seed, 0, 2 * opts.batch_per_process, opts.d_in)
init = multihost.init_mlp(jax.random.key(opts.seed), opts.d_in, opts.hidden)
one = plan.mesh(1)
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
# host0$ COURSE_COORDINATOR_ADDRESS=10.0.0.1:1234 COURSE_NUM_PROCESSES=2 COURSE_PROCESS_ID=0 python -m course_lib.scaling.multihost --program dp_ppo --backend default --num-envs 4096
# host1$ COURSE_COORDINATOR_ADDRESS=10.0.0.1:1234 COURSE_NUM_PROCESSES=2 COURSE_PROCESS_ID=1 python -m course_lib.scaling.multihost --program dp_ppo --backend default --num-envs 4096
# ```
#
# (one process per host, each driving all its GPUs; `--num-envs` must split over every
# device of the job. With one process per GPU, add `COURSE_LOCAL_DEVICE_IDS=<local rank>`
# so each process claims only its own GPU.)

# %% [markdown]
# ## 8 · Memory and precision tools, measured
#
# Scaling out buys memory and compute by adding devices; four tools buy them inside a
# device, each with a price.
#
# **Rematerialisation** (`jax.checkpoint`, Chen et al. 2016). Backpropagation keeps every
# layer's activations from the forward pass. Wrapping a layer in `jax.checkpoint` keeps
# only its input and recomputes the rest during the backward pass: less memory, one more
# forward's worth of compute. The model scans one layer over stacked weights; the
# variants wrap the scanned layer differently: bare, in `jax.checkpoint`, or in
# `jax.checkpoint` with a *policy* (`dots_saveable`: keep the matrix products, recompute
# only the cheap `tanh`):

# %%
from course_lib.scaling import remat as remat_lib

show_source(remat_lib.remat_layer)

# %% [markdown]
# Memory and compute come from XLA's plans for the *compiled* gradient program
# (`memory_analysis()`: `temp` holds the activations; `cost_analysis()["flops"]`, which
# counts a scanned body once, so per layer), for MLPs of width 512 on a batch of 256, 4
# to 16 layers deep. Nothing runs.

# %%
# NBVAL_IGNORE_OUTPUT
DEPTHS = (4, 8, 16)
costs = remat_lib.remat_costs(DEPTHS, width=512, batch=256)
cost = {(c.depth, c.variant): c for c in costs}
print(f"{'depth':>5} {'variant':<14} {'temp MB':>8} {'FLOPs / none':>13}")
for c in costs:
    print(f"{c.depth:>5} {c.variant:<14} {c.temp_bytes / 1e6:8.1f} {c.flops / cost[c.depth, 'none'].flops:13.2f}")

fig, ax = plt.subplots(figsize=(6, 3.5))
for variant, style in (("none", "o-"), ("dots_saveable", "^-"), ("per_layer", "s-")):
    ax.plot(DEPTHS, [cost[d, variant].temp_bytes / 1e6 for d in DEPTHS], style, label=variant)
ax.set_xlabel("layers")
ax.set_ylabel("temp memory of one gradient (MB)")
ax.set_title("Activation memory with and without remat (width 512, batch 256)")
ax.legend(title="jax.checkpoint")
plt.show()

# %%
saved = {d: cost[d, "none"].temp_bytes - cost[d, "per_layer"].temp_bytes for d in DEPTHS}
residual = {d: d * 256 * 512 * 4 for d in DEPTHS}  # one [B, W] float32 array per layer
print("per_layer saves the 2 arrays per layer it stops keeping (within 1.5 MB), at every depth:",
      all(abs(saved[d] - 2 * residual[d]) <= 1.5e6 for d in DEPTHS))
print("per_layer costs 1.25-1.4x the FLOPs, dots_saveable < 1.05x:",
      all(1.25 < cost[d, "per_layer"].flops / cost[d, "none"].flops < 1.4 for d in DEPTHS)
      and all(cost[d, "dots_saveable"].flops / cost[d, "none"].flops < 1.05 for d in DEPTHS))
for d in DEPTHS:  # differences: what does not depend on the layers (a GPU's matmul workspace) cancels
    assert abs(saved[d] - 2 * residual[d]) <= 1.5e6  # 3 arrays per layer -> 1 (XLA's packing: within 1.5 MB)
    assert 1.25 < cost[d, "per_layer"].flops / cost[d, "none"].flops < 1.4  # one more forward: 4/3 the FLOPs
    assert cost[d, "dots_saveable"].flops / cost[d, "none"].flops < 1.05  # recomputes only tanh
grown = cost[16, "none"].temp_bytes - cost[4, "none"].temp_bytes
assert grown >= 0.9 * 3 * (residual[16] - residual[4])  # 3 arrays per extra layer: activations grow with depth

# %% [markdown]
# Per-layer remat keeps a third of the activations (one saved array per layer instead of
# three; the temp buffer also holds the weights' gradients and scratch, so its total falls
# less, by more the deeper the network) for a third more FLOPs (one more forward; a training step is about
# three forwards). `dots_saveable` sits between them in memory at almost no extra
# compute. Whether the FLOPs cost wall time depends on what bounds the step: timed,
# interleaved, with the gradients compared:

# %%
# NBVAL_IGNORE_OUTPUT
remat = remat_lib.compare_remat(depth=16, width=512, batch=256, repeats=5, variants=("none", "per_layer"))
print(f"load average {os.getloadavg()[0]:.1f}")
print(f"{'variant':<14} {'temp MB':>8} {'total MB':>9} {'median ms':>10} {'same grad':>10}")
for r in remat:
    print(f"{r.variant:<14} {r.temp_bytes / 1e6:8.1f} {r.total_bytes / 1e6:9.1f} {r.median_step_s * 1e3:10.1f} {r.grad_equal!s:>10}")
times = {r.variant: r.median_step_s for r in remat}
time_ratio, flop_ratio = times["per_layer"] / times["none"], cost[16, "per_layer"].flops / cost[16, "none"].flops
paid = (time_ratio - 1) / (flop_ratio - 1)
print(f"per_layer took {time_ratio:.2f}x the time for {flop_ratio:.2f}x the FLOPs: "
      + ("the time followed the FLOPs (compute-bound)" if paid > 0.8 else
         f"{max(paid, 0):.0%} of the extra FLOPs showed as time at this load (memory traffic, which remat cuts, bounds the rest)"))

# %%
assert all(r.grad_equal for r in remat)

# %% [markdown]
# The gradients are the same, and the last line sets the time against the FLOPs: a step
# bound by its matrix units pays the whole extra third; one bound by moving activations
# through memory pays less, since the remat program moves fewer.
#
# **bf16 mixed precision** keeps float32 *master* weights and does the forward and
# backward in bfloat16 (8 significand bits, 7 of them stored, and float32's 8-bit
# exponent, so float32's range: no loss scaling is needed, unlike float16). The loss is
# wrapped so the cast happens inside it, and the gradient comes back float32 because it is
# taken with respect to the float32 parameters (the transpose of a cast is the cast back):

# %%
from course_lib.scaling import precision

show_source(precision.mixed_precision_loss)
show_source(precision.train_step)

# %% [markdown]
# Its error against float32 on 3 fresh problems, and its speed (medians of 5 interleaved
# steps):

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.precision import precision_errors, step_times

errors = precision_errors(seeds=(0, 1, 2))
WIDTH, BATCH = plan.pick_main(cpu=(512, 256), full=(4096, 4096), scale=current_scale())  # full: big enough for tensor cores
speed = step_times(width=WIDTH, batch=BATCH, repeats=5)
print(f"timed: 8 layers of width {WIDTH}, batch {BATCH}, on {plan.main_platform}")
print(f"bf16 vs f32: loss relative error mean {errors.loss_mean:.1e} (max {errors.loss_max:.1e}); "
      f"gradient relative error mean {errors.grad_mean:.1e} (max {errors.grad_max:.1e}); gradient dtype {errors.grad_dtype}")
print(f"load average {os.getloadavg()[0]:.1f} | step f32 {speed.f32_median_s * 1e3:.1f} ms, bf16 {speed.bf16_median_s * 1e3:.1f} ms "
      f"-> bf16 speedup {speed.bf16_speedup:.2f}x")

# %%
assert 0 < errors.grad_max < 2e-2 and errors.grad_dtype == "float32"  # 2 to 3 significant digits
cpu_flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
if jax.default_backend() == "cpu" and not any(f in cpu_flags for f in ("avx512_bf16", "amx_bf16")):
    assert speed.bf16_speedup < 1.15  # no bf16 gain on a CPU without bf16 instructions (XLA converts)

# %% [markdown]
# The error is small (bf16 carries 2 to 3 significant decimal digits). On a CPU without
# bf16 instructions (AVX512-BF16, AMX) bf16 is not faster: XLA converts to float32 and
# back. On GPUs and TPUs bf16 matrix products run at 2x or more the float32 rate and halve
# the bytes moved; at full scale on a GPU this cell measures it (against true float32,
# since the first cell turned TF32 off).
#
# **Gradient accumulation** computes a large batch's gradient as the mean of $K$
# micro-batch gradients, one after the other (`lax.scan`):
#
# $$\nabla L_B = \frac{1}{K}\sum_{k=1}^{K} \nabla L_{M_k}, \qquad |M_k| = |B|/K \tag{05.3}$$
#
# equal to the full-batch gradient, with the activations of one micro-batch in memory:

# %%
# NBVAL_IGNORE_OUTPUT
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
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.lr_rules import lr_scaling_experiment

lr_result = lr_scaling_experiment(batch_sizes=(32, 128, 1024), seeds=(0, 1, 2, 3))
print(lr_result.table())
mean, std = lr_result.mean_std()
rules = list(lr_result.rules)
none, linear = rules.index("none"), rules.index("linear")
gap = mean[-1, none] - mean[0, none]  # what the largest batch loses, unscaled, against the smallest
recovered = {rule: (mean[-1, none] - mean[-1, rules.index(rule)]) / gap for rule in ("linear", "sqrt")}
print(f"largest batch {lr_result.batch_sizes[-1]}: unscaled {mean[-1, none]:.3f} vs linear {mean[-1, linear]:.3f}; "
      f"of the gap to batch {lr_result.batch_sizes[0]}, linear recovers {recovered['linear']:.0%}, sqrt {recovered['sqrt']:.0%}")

# %%
print(f"at batch {lr_result.batch_sizes[-1]}: unscaled worse than linear by more than 2 std:",
      bool(mean[-1, none] > mean[-1, linear] + 2 * std[-1, linear]),
      "| linear < sqrt < unscaled:", bool(mean[-1, linear] < mean[-1, rules.index("sqrt")] < mean[-1, none]))
assert mean[-1, none] > mean[-1, linear] + 2 * std[-1, linear]
assert mean[-1, linear] < mean[-1, rules.index("sqrt")] < mean[-1, none]
assert recovered["linear"] > 0.9 and recovered["sqrt"] > 0.5

# %% [markdown]
# Without scaling, the largest batch takes far fewer steps of the same size and ends
# behind; the printed shares say how much of that gap each rule recovers. The rules are
# starting points, not laws: past a *critical batch size* (McCandlish et al. 2018) larger batches stop paying,
# and Adam-type optimisers follow the square-root rule more closely.

# %% [markdown]
# ## 9 · Profiling a data-parallel run: where the time goes
#
# `jax.profiler.trace(folder)` records every XLA op each device ran, with its start and
# duration, into the folder (an `.xplane.pb` for TensorBoard or XProf, and Perfetto
# JSON). `course_lib.scaling.profiling` reads the JSON and sums the ops' own time by
# category and counts each op's calls. The recording wraps one blocked call, after a
# warm-up call that keeps compilation out of the trace:

# %%
from course_lib.course.paths import output_dir
from course_lib.scaling.profiling import summarize_trace, trace

show_source(trace)

# %% [markdown]
# We trace one call of the 2-device PPO program of section 3.

# %%
# NBVAL_IGNORE_OUTPUT
mesh2, key = plan.mesh(2), jax.random.key(1)  # section 3's 2-device program (compiled, cached)
flat, keys = shard_inputs(mesh2, init_flat_params(key, DP_CONFIG), env_keys(key, DP_CONFIG.num_envs))
fn, args = compiled_dp_train(DP_CONFIG, mesh2), (flat, keys, jax.device_put(key, NamedSharding(mesh2, P())))
run_dir = trace(fn, *args, out_dir=output_dir() / "05_scaling_jax" / "profile")
summary = summarize_trace(run_dir)
print("trace written to", run_dir.relative_to(output_dir().parent))
work = {c: ms for c, ms in summary.categories.items() if c not in ("waiting", "profiler")}
print(f"one call of the 2-device program took {summary.device_span_ms:.0f} ms on the devices")

# %%
steps = DP_CONFIG.num_updates * DP_CONFIG.grad_steps_per_update
grad_allreduce = [o for o in summary.ops if o.opcode == "all-reduce" and o.count == 2 * steps]
adv_stats = [o for o in summary.ops if o.category == "collective" and o.count == 2 * DP_CONFIG.num_updates]
print(f"an all-reduce ran {2 * steps} times (2 devices x {steps} minibatch steps): the gradient pmean:", bool(grad_allreduce))
print(f"a collective ran {2 * DP_CONFIG.num_updates} times (2 devices x {DP_CONFIG.num_updates} updates): the advantage statistics:", bool(adv_stats))
if plan.multi_platform == "cpu":  # GPU traces name kernels, not HLO ops: read them in Perfetto instead
    assert summary.n_devices == 2 and grad_allreduce and adv_stats and work["collective"] > 0

# %% [markdown]
# On a shared CPU most of a trace's thread time is waiting and the profiler's own
# bookkeeping (`summary.table()` lists it); what one trace shows reliably is the
# program's structure, in the call counts: one gradient all-reduce per minibatch step on
# each device, one collective per update for the advantage statistics.
#
# To look at it yourself, open `perfetto_trace.json.gz` from that folder in
# <https://ui.perfetto.dev> (the page runs locally in the browser), or point TensorBoard's
# profile plugin (or XProf) at the `profile` folder: each device's row, each minibatch
# step's fusions and, between them, the all-reduces.

# %% [markdown]
# ## 10 · The scaling checklist, executable
#
# Before trusting a scaled-out run, check five things; `course_lib.scaling.checklist` measures them
# for the data-parallel PPO of section 3 (1 device vs 2) and returns a report:
#
# 1. **learning-rate scaling**: whether the global batch is the one the rate was tuned at
#    (if not, retune: 05.4's rules come from SGD);
# 2. **1 vs N devices**: the same seed and global batch give the same parameters;
# 3. **communication**: $1 -$ speed-up / ceiling as in section 3, with the gradient
#    all-reduces alone timed beside it (a chain of them, one per minibatch step);
# 4. **memory per device**: from the compiled programs' memory analysis;
# 5. **reproducible**: the same run twice is bitwise equal.

# %%
# NBVAL_IGNORE_OUTPUT
from course_lib.scaling.checklist import scaling_checklist

TUNED_AT = PPOConfig().minibatch_size  # the minibatch of PureJaxRL's CartPole defaults, where its rate was tuned
report = scaling_checklist(DP_CONFIG, n_devices=2, base_batch=TUNED_AT, base_lr=PPOConfig().lr, devices=plan.multi)
print(f"load average {os.getloadavg()[0]:.1f}")
print(report.table())

# %%
# NBVAL_IGNORE_OUTPUT
print("rows:", [(r.name, r.verdict) for r in report.rows if r.name != "communication"])
assert [r.name for r in report.rows] == ["lr scaling", "1 vs N devices", "communication", "memory per device", "reproducible"]
assert report.row("1 vs N devices").verdict == "ok" and report.row("reproducible").verdict == "ok"
assert report.row("memory per device").verdict == "ok"

# %% [markdown]
# The learning-rate row compares this run's global minibatch with the one the rate was
# tuned at ($B_0$, PureJaxRL's CartPole defaults); its verdict is on the
# environment count, not on $N$: data parallelism over more devices keeps the global
# batch, while keeping the per-device batch would multiply it by $N$. The parameters
# agree, the rerun is bitwise equal, and the N-device program needs no more memory per device than the
# 1-device one (its temporaries are split; the replicated parameters and optimizer state
# are not: section 5's FSDP shards those). The communication row is section 3's
# measurement again, with the gradient all-reduces' own time beside it: what the loss
# exceeds that by is rendezvous and waiting.

# %% [markdown]
# ## Equation -> function
#
# | equation | what | where |
# |---|---|---|
# | 05.1 | ring all-reduce: $2\frac{N-1}{N}M$ bytes sent per device | `course_lib.scaling.collectives.ring_allreduce`, `ring_allreduce_bytes_sent_per_device` |
# | 05.2 | data-parallel gradient $g = \frac1N\sum_d g_d$ | `course_lib.scaling.ppo_dp.ppo_on_my_envs`, `synced_gradient` (`sync="pmean"` / `"vma"`) |
# | α-β model | $t = 2(N-1)\alpha + 2\frac{N-1}{N}M/\beta$ | `course_lib.scaling.collectives.allreduce_time_model`, `fit_alpha_beta` |
# | layouts | bytes per step of data / tensor / 2-D parallelism | `course_lib.scaling.tensor_parallel.layout_communication` |
# | FSDP / ZeRO | all-gather + reduce-scatter $= 2\frac{N-1}{N}M$; memory per device by stage | `course_lib.scaling.fsdp.fsdp_step`, `zero_memory_per_device` |
# | axes to links | ring time of each axis on ICI vs DCN | `course_lib.scaling.topology.axis_assignment_cost` |
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
# | forward / backward dx / grad sync MB | bytes each device sends per training step in a layout (ring collectives) |
# | resident bytes | parameter and optimizer-state bytes held on one device (`addressable_shards`) |
# | FLOPs / none | XLA's cost analysis of a compiled gradient (`cost_analysis()["flops"]`) over no remat's |
# | lost to sync | $1 - $ speed-up / ceiling: the share of the ideal lost to keeping devices in step |
# | temp / peak bytes | XLA's compiled-memory analysis: scratch buffers / arguments + outputs + scratch |
#
# ## Summary
#
# * An array's place is a `NamedSharding` (mesh + `PartitionSpec`); `jit` compiles for
#   its inputs' shardings and XLA inserts the collectives; `shard_map` writes the
#   per-device program and its collectives yourself.
# * A ring all-reduce is a reduce-scatter plus an all-gather, $2\frac{N-1}{N}M$ bytes
#   sent per device (05.1); built from `ppermute` it equals `psum`.
# * Data-parallel PPO gives the same parameters on 1, 2 and 4 devices (per-environment
#   keys, stratified minibatches, global statistics by collectives). The `check_vma` trap
#   gives $N$ times the gradient and Adam hides it: test equivalence, not the loss.
# * Tensor parallelism splits the weights and moves activations; FSDP / ZeRO shards
#   parameters and optimizer state ($1/N$ per device, measured) and splits the all-reduce
#   into an all-gather before use and a reduce-scatter of the gradients.
# * On a pod, put tensor parallelism on the fast links inside a slice and data
#   parallelism across slices.
# * Several processes run one program after `jax.distributed.initialize`; a launcher must
#   stop every process when one dies. On CPUs, keep LAPACK out of multi-device programs.
#
# ## Full scale
#
# `python -m course_lib run 05 --scale full --no-kernel`. With 4 or more accelerators
# every section but 7 runs on them (4,096 environments, all-reduces up to 64 MiB). With
# one GPU the multi-device sections run on 4 CPU host devices and the single-device parts
# on the GPU at full size (PPO with 4,096 environments, the bf16 timing). The CPU
# benchmarks (`python bench/run.py dp_scaling collectives`) are in BENCHMARKS.md.
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
#   E. Hoffer, I. Hubara, D. Soudry (2017). *Train longer, generalize better.* NeurIPS.
#   S. McCandlish et al. (2018). *An Empirical Model of Large-Batch Training.*
#   arXiv:1812.06162. (The critical batch size.) S. Malladi et al. (2022). *On the SDEs and
#   Scaling Rules for Adaptive Gradient Algorithms.* NeurIPS. (Square-root scaling for Adam.)
# * T. Chen, B. Xu, C. Zhang, C. Guestrin (2016). *Training Deep Nets with Sublinear
#   Memory Cost.* arXiv:1604.06174. (Rematerialisation.)
# * P. Micikevicius et al. (2018). *Mixed Precision Training.* ICLR.
# * S. Rajbhandari, J. Rasley, O. Ruwase, Y. He (2020). *ZeRO: Memory Optimizations Toward
#   Training Trillion Parameter Models.* SC20, arXiv:1910.02054. (Stages 1-3, Figure 1.)
# * Y. Zhao et al. (2023). *PyTorch FSDP: Experiences on Scaling Fully Sharded Data
#   Parallel.* VLDB, arXiv:2304.11277.
# * JAX documentation: *Explicit sharding* (`jax.set_mesh`, `AxisType`), and
#   `jax.experimental.mesh_utils.create_hybrid_device_mesh`; Google Cloud TPU and NVIDIA
#   datasheets for the link figures (`course_lib.scaling.topology.PUBLISHED_LINKS` names each).
# * C. Lu et al. (2022). *Discovered Policy Optimisation* (PureJaxRL).
#
# ## Exercises
#
# `exercises/05_scaling_jax.ipynb`: partition specs for a batch and a data x model MLP,
# the ring all-reduce from `ppermute`, a data-parallel gradient (and the traps: `psum`
# instead of `pmean`, averaging twice, moving the data instead of the gradients),
# gradient accumulation with `lax.scan`, and rematerialisation by segments of $k$ layers
# (Chen et al.'s $\sqrt{n}$ checkpointing). Grade with
# `course grade exercises/05_scaling_jax.ipynb`.
