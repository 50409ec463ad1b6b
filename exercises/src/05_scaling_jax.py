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
# # Exercises 05 · Scaling out in JAX
#
# This notebook is generated from `exercises/src/05_scaling_jax.py`; the worked solutions
# are in `solutions/05_scaling_jax.ipynb`. Write the function bodies where they raise
# `NotImplementedError`, run the *check yourself* cell under each one, and when all pass
# grade the notebook from a terminal:
#
# ```
# course grade exercises/05_scaling_jax.ipynb
# ```
#
# The four pieces of a data-parallel step: where each array lives (partition specs), the
# collective that averages gradients (an all-reduce, built here from `ppermute`), the
# gradient itself, and gradient accumulation for a batch that does not fit at once; then
# one way to fit a deeper network on each device, rematerialisation in segments. The
# checks run your code on 2 and 4 devices, so the first cell asks XLA for 4 CPU devices:
# **run it first, before anything else touches JAX** (if JAX already started, restart the
# kernel). Every multi-device call below runs under a watchdog and blocks on its result:
# on this CPU a hung collective ends the kernel with a clear message instead of hanging.
# Every check also reads your function first: one that is, wraps or calls the lesson
# library's own implementation (anything from `course_lib.scaling`) is refused; write each
# from the building blocks its exercise names.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `partition_specs`: where the batch and the MLP's weights live | 10 | ★☆☆ | 15 min |
# | 2. `ring_allreduce`: an all-reduce from `ppermute` only | 15 | ★★★ | 30 min |
# | 3. `data_parallel_grad`: the gradient of the global batch | 15 | ★★☆ | 15 min |
# | 4. `accumulate_grads`: micro-batches by a `lax.scan` | 10 | ★★☆ | 20 min |
# | 5. `remat_segments`: `jax.checkpoint` around segments of layers | 15 | ★★☆ | 25 min |

# %%
from course_lib.scaling.devices import use_cpu_devices

use_cpu_devices(4)  # before the first JAX computation: 4 CPU devices for the meshes below

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib import check
from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.remat import mlp_problem, peak_memory

print("devices:", jax.devices())

# %% [markdown]
# ## Exercise 1 · Where the batch and the weights live (★☆☆, 15 min, 10 points)
#
# A `Mesh` names the devices' axes; a `PartitionSpec` says, for each axis of an array,
# which mesh axis splits it (`None`: not split); `NamedSharding(mesh, spec)` with
# `jax.device_put` places the array. Take a two-layer MLP,
# `h = tanh(obs @ w1 + b1)`, `out = h @ w2 + b2`, with `obs` `[B, D]`, `w1` `[D, H]`,
# `b1` `[H]`, `w2` `[H, A]`, `b2` `[A]`, and return the spec of each array as a dict
# `{"obs": ..., "w1": ..., "b1": ..., "w2": ..., "b2": ...}`. Derive each spec from what
# the devices must compute and what they may send:
#
# * on a mesh with axes `("data",)` (**data parallelism**): each device computes the
#   outputs of its own `B / n` examples, and the forward pass sends nothing;
# * on a mesh with axes `("data", "model")` (**data x tensor parallelism**): the examples
#   are shared out over `"data"` as before, and along `"model"`:
#   1. each of the `m` devices stores `1 / m` of `w1` and `1 / m` of `w2`, and of the biases
#      only the part it uses;
#   2. the devices send nothing between the two layers (`tanh` needs a complete
#      pre-activation for each hidden unit it is applied to);
#   3. after the second layer, one sum over `"model"` leaves every device with the
#      complete `out` of its examples.
#
# Ask, for each weight matrix, which of its two dimensions can be split without breaking
# rule 2, and what each device then holds of `h`. The layout you find needs one
# all-reduce per forward pass, whatever `H`: Megatron-LM's (Shoeybi et al. 2019).
#
# **How it is graded:** on 1-D meshes of 2 and 4 devices and 2-D meshes of 2 x 2 and 1 x 4,
# each spec is used to `jax.device_put` an array of the right shape, and every device's
# shard (`array.addressable_shards`) must hold exactly the rows and columns the layout
# gives it; then the specs themselves must equal the expected ones (an unsplit axis at the
# end may be written as `None` or left out). A replicated batch, parameters split over `"data"`,
# `w1` and `w2` swapped, or a replicated `b1` are named in the message.


# %% tags=["exercise"]
def partition_specs(mesh):
    """The PartitionSpecs of a batch and a two-layer MLP on ``mesh``.

    Args:
        mesh: a jax.sharding.Mesh with axes ("data",) or ("data", "model").

    Returns:
        {"obs": spec, "w1": spec, "b1": spec, "w2": spec, "b2": spec} for obs [B, D],
        w1 [D, H], b1 [H], w2 [H, A], b2 [A], under the rules of the statement.
    """
    ### BEGIN SOLUTION
    obs = P("data", None)  # the batch axis split over "data", every feature on each device
    if "model" not in mesh.axis_names:  # data parallel: every device holds every parameter
        return {"obs": obs, "w1": P(), "b1": P(), "w2": P(), "b2": P()}
    # tensor parallel over "model": w1's output columns (and b1), then w2's input rows
    return {"obs": obs, "w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}
    ### END SOLUTION


# %% tags=["raises-in-stub"]
mesh_2d = jax.make_mesh((2, 2), ("data", "model"), devices=jax.devices()[:4])
specs = partition_specs(mesh_2d)
shapes = {"obs": (8, 6), "w1": (6, 4), "b1": (4,), "w2": (4, 3), "b2": (3,)}
with watchdog(60, "placing an MLP on a 2 x 2 mesh"):
    placed = {
        k: jax.block_until_ready(jax.device_put(jnp.zeros(s), NamedSharding(mesh_2d, specs[k])))
        for k, s in shapes.items()
    }
for k, a in placed.items():
    print(f"{k:3s} {specs[k]!s:22s} shard on each device:", [s.data.shape for s in a.addressable_shards])

# %% tags=["exercise-check"]
check("05_scaling_jax", "partition_specs", partition_specs)

# %% [markdown]
# ## Exercise 2 · A ring all-reduce from `ppermute` (★★★, 30 min, 15 points)
#
# An all-reduce leaves on every device the sum of every device's array. `jax.lax.psum`
# does it in one call; here you build it from the one collective that only talks to
# neighbours, `jax.lax.ppermute(x, axis_name, perm)`, which sends `x` from device `src`
# to device `dst` for every pair `(src, dst)` in `perm` (and returns what this device
# received). On a ring of `n` devices, with each device's array cut into `n` chunks:
#
# 1. **reduce-scatter**, `n - 1` steps: at step `s`, device `i` sends its running sum of
#    chunk `(i - s) mod n` to device `i + 1`, and adds what it receives (from device
#    `i - 1`) to its chunk `(i - s - 1) mod n`. After `n - 1` steps, device `i` holds the
#    full sum of chunk `(i + 1) mod n`;
# 2. **all-gather**, `n - 1` steps: at step `s`, device `i` sends chunk `(i + 1 - s) mod n`
#    (complete) to device `i + 1`, and *replaces* its chunk `(i - s) mod n` with what it
#    receives.
#
# Each device sends `2 (n - 1)` chunks of `N / n` elements, `2 (n - 1) / n` of its array,
# whatever `n` is: that is why the ring is bandwidth-optimal and why NCCL uses it. (Sending
# the whole array around the ring `n - 1` times gives the same sum for `(n - 1) N`.)
#
# Write `ring_allreduce(x, axis_name, axis_size)`, called **inside** `jax.shard_map` on a
# mesh axis `axis_name` of `axis_size` devices: `x` is this device's array (any shape whose
# size `axis_size` divides); return the all-reduced array, same shape. Use
# `jax.lax.axis_index(axis_name)` for this device's position `i` (a traced value: index
# chunks with it, `chunks[k]` and `chunks.at[k].add(...)`, never in a Python `if`); the
# loops over steps are Python loops (`axis_size` is a Python int).
#
# **How it is graded:** against `jax.lax.psum` (and a numpy sum) on random data, on 2 and
# 4 devices and over the `"model"` axis of a 2 x 2 mesh (each row of devices its own ring); the program is
# inspected (`jax.make_jaxpr`): it must hold `ppermute`s and no `psum`, `pmean`,
# `all_gather` or other collective; every `ppermute` must move data one step around
# the ring; each device must send `2 (n - 1) / n` of its array in all (eq. 05.1); and
# nothing may run on the host (`jax.pure_callback`, `jax.debug.print`). Stopping after
# the reduce-scatter, adding instead of replacing in the all-gather, or a built-in
# collective are named in the message.


# %% tags=["exercise"]
def ring_allreduce(x, axis_name, axis_size):
    """All-reduce (sum) ``x`` over the mesh axis ``axis_name`` with a ring of ppermutes.

    Call inside jax.shard_map. Args:
        x: this device's array; its size must be divisible by axis_size.
        axis_name: the mesh axis to reduce over.
        axis_size: the number of devices along it (a Python int).

    Returns:
        the sum of x over the devices of the axis, the same on each, shaped like x.
    """
    ### BEGIN SOLUTION
    n = axis_size
    i = jax.lax.axis_index(axis_name)
    chunks = x.reshape(n, -1)
    right = [(j, (j + 1) % n) for j in range(n)]
    for s in range(n - 1):  # reduce-scatter: add the left neighbour's running sum
        recv = jax.lax.ppermute(chunks[(i - s) % n], axis_name, right)
        chunks = chunks.at[(i - s - 1) % n].add(recv)
    for s in range(n - 1):  # all-gather: pass the finished chunks on
        recv = jax.lax.ppermute(chunks[(i + 1 - s) % n], axis_name, right)
        chunks = chunks.at[(i - s) % n].set(recv)
    return chunks.reshape(x.shape)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
mesh_4 = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
x = jax.device_put(jnp.arange(32.0), NamedSharding(mesh_4, P("data")))  # 4 devices x 8 elements


def both(block):
    return ring_allreduce(block, "data", 4), jax.lax.psum(block, "data")


ring_and_psum = jax.jit(jax.shard_map(both, mesh=mesh_4, in_specs=P("data"), out_specs=P("data"), check_vma=False))
with watchdog(60, "ring all-reduce vs psum on 4 CPU devices"):
    ring, summed = jax.block_until_ready(ring_and_psum(x))
print("ring, device 0:", np.asarray(ring)[:8])
print("psum, device 0:", np.asarray(summed)[:8])

# %% tags=["exercise-check"]
check("05_scaling_jax", "ring_allreduce", ring_allreduce)

# %% [markdown]
# ## Exercise 3 · The gradient of the global batch (★★☆, 15 min, 15 points)
#
# Data parallelism splits a batch of `B` examples into `N` equal shards, one per device,
# and keeps each shard where it is: every device computes on its own `B / N` examples,
# and the devices exchange only what the update needs. The loss a single device would
# minimise is the **global** mean $L(\theta) = \frac{1}{B}\sum_{b=1}^{B} \ell_b(\theta)$;
# device $d$ can compute the mean over its own shard, whose gradient is $g_d$. The update
# needs the gradient of the global mean, which is the mean of the devices' gradients
# (the lesson's eq. 05.2):
#
# $$g = \frac{1}{N}\sum_{d=1}^{N} g_d, \qquad g_d = \nabla_\theta \frac{1}{|B_d|}\sum_{i \in B_d} \ell_i(\theta) \tag{05.2}$$
#
# Every device must end with the same $g$, so that the same update keeps the replicated
# parameters equal. What crosses between devices is therefore the **gradient**, one number
# per parameter whatever the batch size, never the examples themselves: gathering the
# batch on every device gives the same numbers, but each device then does the whole
# batch's work (nothing runs in parallel) and the traffic grows with the batch.
#
# Write `data_parallel_grad(loss_fn, params, batch, axis_name)`, called inside
# `jax.shard_map(..., in_specs=(P(), P(axis_name)), check_vma=False)`: `loss_fn(params, batch)`
# is the mean loss over the batch it is given, `params` is any pytree (replicated), `batch`
# this device's shard. Return $g$, a pytree like `params`, the same on every device.
#
# **The `check_vma` trap.** With `check_vma=True` (the default), `shard_map` tracks which
# values vary across devices; a replicated `P()` parameter used with varying data gets an
# implicit `pvary`, whose transpose is a `psum`. So `jax.grad` there returns the local
# gradients already **summed** over devices, and reducing them again changes nothing: the
# result is $N g$, and the step `N` times too large. This is why the checks (and the
# lesson) use `check_vma=False`, where `jax.grad` returns this device's own $g_d$ and the
# reduction is yours to write. Whatever the setting, test a multi-device gradient against
# the single-device one.
#
# **How it is graded:** against `jax.grad` of the loss over the **whole** batch on one
# device, for an MLP on 2 devices, for a softmax classifier with tuple parameters on 4
# devices, and for three SGD steps on an axis not named `"data"`; each device's result is
# collected, and all must agree. Then the program is inspected (`jax.make_jaxpr`): only
# gradient-shaped values may cross devices (each collective's operand shaped like a
# parameter, or a flat vector of one parameter's size or of all of them), only through a
# reduction (no `all_gather`, `all_to_all` or `ppermute` of anything computed from the
# batch, except the all-gather of a reduce-scatter's pieces: `psum_scatter` then
# `all_gather` is an all-reduce too), every number of the gradient must pass through a
# reduction, and nothing may
# run on the host (`jax.pure_callback`, `jax.debug.print`). Adding instead
# of averaging (`N` times too large), no reduction (each device keeps its own shard's
# gradient), averaging twice (`N` times too small) and gathering the batch are named in the
# message.


# %% tags=["exercise"]
def data_parallel_grad(loss_fn, params, batch, axis_name):
    """The gradient of the global-mean loss, inside jax.shard_map(..., check_vma=False).

    Args:
        loss_fn: (params, batch) -> the mean loss over the batch it is given.
        params: a pytree of replicated parameters.
        batch: this device's shard of the batch (a pytree of arrays, batch axis first).
        axis_name: the mesh axis the batch is split over.

    Returns:
        the gradient of the mean loss over the whole batch, a pytree like params,
        the same on every device.
    """
    ### BEGIN SOLUTION
    grads = jax.grad(loss_fn)(params, batch)  # the gradient of this shard's mean
    return jax.lax.pmean(grads, axis_name)  # the mean of the shards' gradients
    ### END SOLUTION


# %% tags=["raises-in-stub"]
def mse(params, batch):
    """Mean squared error of a linear model on the batch it is given."""
    return jnp.mean((batch["x"] @ params["w"] + params["b"] - batch["y"]) ** 2)


rng = np.random.default_rng(0)
params = {"w": jnp.asarray(rng.normal(size=3), jnp.float32), "b": jnp.float32(0.5)}
batch = {"x": jnp.asarray(rng.normal(size=(16, 3)), jnp.float32), "y": jnp.asarray(rng.normal(size=16), jnp.float32)}
mesh_2 = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
dp_grad = jax.jit(
    jax.shard_map(
        lambda p, b: data_parallel_grad(mse, p, b, "data"),
        mesh=mesh_2,
        in_specs=(P(), P("data")),
        out_specs=P(),
        check_vma=False,
    )
)
with watchdog(60, "data-parallel gradient on 2 CPU devices"):
    got = jax.block_until_ready(
        dp_grad(
            jax.device_put(params, NamedSharding(mesh_2, P())), jax.device_put(batch, NamedSharding(mesh_2, P("data")))
        )
    )
print("data parallel:", np.round(np.asarray(got["w"]), 5))
print("one device:   ", np.round(np.asarray(jax.grad(mse)(params, batch)["w"]), 5))

# %% tags=["exercise-check"]
check("05_scaling_jax", "data_parallel_grad", data_parallel_grad)

# %% [markdown]
# ## Exercise 4 · Gradient accumulation by a `lax.scan` (★★☆, 20 min, 10 points)
#
# When a batch of `B` examples does not fit in memory at once, split it into `n_micro`
# micro-batches of `m = B / n_micro`, take each one's gradient in turn and average them: for
# a mean loss, $\frac{1}{n_{micro}}\sum_{k} \nabla L_{(k)}(\theta) = \nabla L(\theta)$, the
# full-batch gradient (the lesson's eq. 05.3), with the activations of one micro-batch and
# one running sum of gradients alive at a time.
#
# Write `accumulate_grads(loss_fn, params, batch, n_micro)`: `batch` is a pytree of arrays
# with the batch axis first; micro-batch `k` is rows `k m ... (k + 1) m - 1` of every leaf
# (**contiguous**, as a loop over `batch[k * m:(k + 1) * m]` would take them). Run the
# micro-batches with one `jax.lax.scan` whose carry is the running sum of gradients (a
# Python loop would unroll `n_micro` copies of the gradient into the program), and return
# the mean. If `n_micro` does not divide `B`, raise a `ValueError` naming both (dropping the
# remainder would silently train on part of the batch).
#
# Which rows share a micro-batch matters as soon as the loss is not a plain mean over
# examples: PPO normalises advantages *per minibatch*, so interleaved micro-batches
# (rows `k, k + n_micro, ...`) give a different gradient from the run without accumulation.
#
# **How it is graded:** against `jax.grad` over the whole batch for `n_micro` = 1, 2, 4
# and 8 under `jax.jit`; against a Python loop over contiguous slices for a policy-gradient
# loss that normalises advantages per micro-batch; the program is inspected
# (`jax.make_jaxpr`): one `lax.scan` of length `n_micro` whose step takes its micro-batch's
# gradient (the loss's matrix products are inside the scan), whose carry holds the running
# sum and whose per-step outputs hold no gradient (`jax.lax.map` over the micro-batches, or
# a `jax.vmap` of the gradients summed by a scan, gives the right numbers but keeps all
# `n_micro` gradients alive at once), with nothing run on
# the host; and a batch of 10 with `n_micro = 4` must raise a `ValueError` that names 10
# and 4. Summing without dividing, dropping the last micro-batch, interleaved
# micro-batches, stacked gradients and a Python loop are named in the message.


# %% tags=["exercise"]
def accumulate_grads(loss_fn, params, batch, n_micro):
    """The mean of the gradients of n_micro contiguous micro-batches, by one lax.scan.

    Args:
        loss_fn: (params, batch) -> the mean loss over the batch it is given.
        params: a pytree of parameters.
        batch: a pytree of arrays, batch axis first, B rows each.
        n_micro: the number of micro-batches; must divide B.

    Returns:
        a pytree like params: (1 / n_micro) * sum_k grad loss_fn(params, micro-batch k).

    Raises:
        ValueError: if n_micro does not divide B.
    """
    ### BEGIN SOLUTION
    batch_size = jax.tree.leaves(batch)[0].shape[0]
    if n_micro < 1 or batch_size % n_micro:
        raise ValueError(f"n_micro={n_micro} does not divide the batch of {batch_size} rows; pick a divisor")
    micro = jax.tree.map(lambda x: x.reshape((n_micro, batch_size // n_micro) + x.shape[1:]), batch)

    def step(total, micro_batch):
        grads = jax.grad(loss_fn)(params, micro_batch)
        return jax.tree.map(jnp.add, total, grads), None

    total, _ = jax.lax.scan(step, jax.tree.map(jnp.zeros_like, params), micro)
    return jax.tree.map(lambda g: g / n_micro, total)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
full = jax.grad(mse)(params, batch)
accumulated = jax.jit(accumulate_grads, static_argnums=(0, 3))(mse, params, batch, 4)
print("4 micro-batches:", np.round(np.asarray(accumulated["w"]), 5))
print("full batch:     ", np.round(np.asarray(full["w"]), 5))

# %% tags=["exercise-check"]
check("05_scaling_jax", "accumulate_grads", accumulate_grads)

# %% [markdown]
# ## Exercise 5 · Rematerialisation in segments (★★☆, 25 min, 15 points)
#
# Backpropagation through `n` layers keeps, for every layer, the values its backward
# pass needs (for `h_l = tanh(h_{l-1} W_l + b_l)`: the input, the output and `1 - h_l^2`,
# three `[B, W]` arrays). The lesson wraps **each layer** in `jax.checkpoint`: the forward
# pass then keeps only each layer's input, and the backward pass recomputes the layer
# just before it needs it. That still stores `n` arrays.
#
# Chen et al. (2016, *Training Deep Nets with Sublinear Memory Cost*) checkpoint
# **segments** instead: cut the `n` layers into `n / k` segments of `k` consecutive
# layers, and keep only each segment's input. The backward pass recomputes one segment at
# a time, holding that segment's residuals while it differentiates it. Counting `[B, W]`
# arrays:
#
# | | kept through the forward pass | held while one segment is differentiated |
# |---|---|---|
# | no remat | `3 n` | |
# | each layer checkpointed | `n` | `3` |
# | segments of `k` | `n / k` | `3 k` |
#
# `n / k + 3 k` is smallest near `k = sqrt(n / 3)`: memory grows like `sqrt(n)`, for one more
# forward pass of compute, the same as per-layer remat.
#
# Write `remat_segments(layer, params, x, k)`: `layer(h, p)` applies one layer with its
# parameters `p`; `params` is a pytree whose every leaf stacks the `n` layers' parameters
# on a leading axis (`params["W"]` is `[n, W, W]`, layer `l` gets the slices `[l]`); `x`
# is the input `[B, W]`. Return the output of the last layer, computed by `lax.scan`s
# (never a Python loop over layers) so that only segment inputs are kept. If `k` does
# not divide `n` (or `k < 1`), raise a `ValueError` naming both.
#
# **How it is graded:** the output and the gradient (`jax.grad` of a squared error
# through your function) against the same layers scanned without remat, for 12 layers
# and `k` = 3, 4, 1 and 12; the memory XLA plans for `jit(grad)` (the `temp` bytes of
# `compiled.memory_analysis()`) for 36 layers of width 64, batch 512, `k = 6`, which must
# be at most half of what the network needs without remat; the program
# (`jax.make_jaxpr`): `n / k` checkpoints run, each around `k` layers, and the program's
# size must not grow with `n` or with `k` (a Python loop over the segments, or over a
# segment's layers, adds a copy per turn), with nothing run on the host; and 16 layers with
# `k = 5` or `0` must raise a `ValueError` that names 16 and `k`. No checkpoint, one
# checkpoint around the whole network, a checkpoint around each layer, segments of the
# wrong size and a Python loop are named in the message.


# %% tags=["exercise"]
def remat_segments(layer, params, x, k):
    """A deep network's layers by lax.scan, each segment of k layers under jax.checkpoint.

    Args:
        layer: (h, p) -> the next h, one layer with its parameters p.
        params: a pytree whose leaves stack the n layers' parameters on axis 0.
        x: the input [B, W].
        k: layers per checkpointed segment; must divide n.

    Returns:
        h after all n layers, shaped like x: only the n / k segment inputs are kept for
        the backward pass, which recomputes one segment at a time (Chen et al. 2016).

    Raises:
        ValueError: if k < 1 or k does not divide n.
    """
    ### BEGIN SOLUTION
    n = jax.tree.leaves(params)[0].shape[0]
    if k < 1 or n % k:
        raise ValueError(f"k={k} does not divide the {n} layers into equal segments; pick a divisor of {n}")
    segments = jax.tree.map(lambda leaf: leaf.reshape((n // k, k) + leaf.shape[1:]), params)

    def run_layers(h, stacked):  # the inner scan: the layers of one segment, one after another
        h, _ = jax.lax.scan(lambda h, p: (layer(h, p), None), h, stacked)
        return h

    @jax.checkpoint  # keep only the segment's input; the backward pass recomputes its k layers
    def run_segment(h, segment):
        return run_layers(h, segment), None

    h, _ = jax.lax.scan(run_segment, x, segments)
    return h
    ### END SOLUTION


# %% tags=["raises-in-stub"]
# NBVAL_IGNORE_OUTPUT
# (XLA's buffer assignment, and so the temp bytes, can differ between machines)
def tanh_layer(h, p):
    """One layer: h_l = tanh(h_{l-1} W_l + b_l)."""
    return jnp.tanh(h @ p["W"] + p["b"])


def squared_error(forward):
    return lambda p, x, y: 0.5 * jnp.mean(jnp.sum((forward(p, x) - y) ** 2, axis=-1))


deep_params, deep_x, deep_y = mlp_problem(0, 36, 64, 512)  # 36 layers of width 64, a batch of 512
variants = {
    "no remat": lambda p, x: jax.lax.scan(lambda h, q: (tanh_layer(h, q), None), x, p)[0],
    "segments of 6": lambda p, x: remat_segments(tanh_layer, p, x, 6),
}
temp, grads = {}, {}
for label, forward in variants.items():
    grad_fn = jax.jit(jax.grad(squared_error(forward)))
    temp[label] = peak_memory(grad_fn, deep_params, deep_x, deep_y).temp_bytes
    grads[label] = grad_fn(deep_params, deep_x, deep_y)
    print(f"{label:14s} jit(grad) temp memory {temp[label] / 1e6:5.1f} MB")
pairs = zip(jax.tree.leaves(grads["no remat"]), jax.tree.leaves(grads["segments of 6"]))
print("same gradient:", all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs))

# %% tags=["exercise-check"]
check("05_scaling_jax", "remat_segments", remat_segments)

# %% [markdown]
# When every check passes, grade the whole notebook:
# `course grade exercises/05_scaling_jax.ipynb`.
