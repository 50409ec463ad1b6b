"""Planted bugs in lesson 05's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

PS, RA, DP, AG = "partition_specs", "ring_allreduce", "data_parallel_grad", "accumulate_grads"
RS = "remat_segments"
REPLICATED = '"w1": P(), "b1": P(), "w2": P(), "b2": P()}'
TENSOR_PARALLEL = '"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P()}'
REDUCE_SCATTER = (
    "    for s in range(n - 1):  # reduce-scatter: add the left neighbour's running sum\n"
    "        recv = jax.lax.ppermute(chunks[(i - s) % n], axis_name, right)\n"
    "        chunks = chunks.at[(i - s - 1) % n].add(recv)\n"
)
ALL_GATHER = (
    "    for s in range(n - 1):  # all-gather: pass the finished chunks on\n"
    "        recv = jax.lax.ppermute(chunks[(i + 1 - s) % n], axis_name, right)\n"
    "        chunks = chunks.at[(i - s) % n].set(recv)\n"
)
PMEAN = "return jax.lax.pmean(grads, axis_name)"
RESHAPE = "x.reshape((n_micro, batch_size // n_micro) + x.shape[1:])"
SCAN = "total, _ = jax.lax.scan(step, jax.tree.map(jnp.zeros_like, params), micro)"
DP_SOLUTION = (
    "    grads = jax.grad(loss_fn)(params, batch)  # the gradient of this shard's mean\n"
    "    return jax.lax.pmean(grads, axis_name)  # the mean of the shards' gradients"
)
OUTER_SCAN = "    h, _ = jax.lax.scan(run_segment, x, segments)\n    return h"
CHECKPOINT = "    @jax.checkpoint  # keep only the segment's input; the backward pass recomputes its k layers\n"
INNER_SCAN = "h, _ = jax.lax.scan(lambda h, p: (layer(h, p), None), h, stacked)"

MUTANTS: list[Mutant] = [
    # partition_specs
    Mutant(PS, "obs_replicated", 'obs = P("data", None)', "obs = P()", "obs is replicated"),
    Mutant(PS, "obs_split_by_features", 'obs = P("data", None)', 'obs = P(None, "data")', "its features are split"),
    Mutant(
        PS,
        "params_split_over_data",
        REPLICATED,
        '"w1": P("data", None), "b1": P(), "w2": P("data", None), "b2": P()}',
        "w1 is split over 'data' (P('data'))",
    ),
    Mutant(
        PS,
        "w1_w2_swapped",
        TENSOR_PARALLEL,
        '"w1": P("model", None), "b1": P("model"), "w2": P(None, "model"), "b2": P()}',
        "w1 and w2 are swapped",
    ),
    Mutant(
        PS,
        "b1_replicated",
        TENSOR_PARALLEL,
        '"w1": P(None, "model"), "b1": P(), "w2": P("model", None), "b2": P()}',
        "b1 is replicated but w1's output columns are split",
    ),
    Mutant(
        PS,
        "b2_split",
        TENSOR_PARALLEL,
        '"w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P("model")}',
        "b2 is added once",
    ),
    Mutant(
        PS,
        "size_dependent_layout",
        'if "model" not in mesh.axis_names:',
        'if "model" not in mesh.axis_names or mesh.shape["model"] == 1:',
        "w1 is replicated on the ('data', 'model') mesh",
    ),
    # ring_allreduce
    Mutant(RA, "psum", "return chunks.reshape(x.shape)", "return jax.lax.psum(x, axis_name)", "uses psum"),
    Mutant(
        RA,
        "all_gather_builtin",
        ALL_GATHER,
        "    chunks = jax.lax.all_gather(chunks[(i + 1) % n], axis_name)\n    chunks = jnp.roll(chunks, 1, axis=0)\n",
        "uses all_gather",
    ),
    Mutant(RA, "reduce_scatter_only", ALL_GATHER, "", "it stops after the reduce-scatter"),
    Mutant(
        RA,
        "all_gather_adds",
        "chunks = chunks.at[(i - s) % n].set(recv)",
        "chunks = chunks.at[(i - s) % n].add(recv)",
        "the all-gather adds what it receives",
    ),
    Mutant(
        RA,
        "whole_array_round_the_ring",
        "    chunks = x.reshape(n, -1)\n",
        "    chunks = x.reshape(n, -1)\n"
        "    total, passing = x, x\n"
        "    for _ in range(n - 1):\n"
        "        passing = jax.lax.ppermute(passing, axis_name, [(j, (j + 1) % n) for j in range(n)])\n"
        "        total = total + passing\n"
        "    return total\n",
        "each device sends 36 elements for an x of 12",
    ),
    Mutant(
        RA,
        "direct_exchange",
        REDUCE_SCATTER + ALL_GATHER,
        "    for s in range(1, n):  # reduce-scatter by direct exchange: chunk k goes straight to device k\n"
        "        recv = jax.lax.ppermute(chunks[(i + s) % n], axis_name, [(j, (j + s) % n) for j in range(n)])\n"
        "        chunks = chunks.at[i].add(recv)\n"
        "    for s in range(1, n):  # all-gather by direct exchange\n"
        "        recv = jax.lax.ppermute(chunks[i], axis_name, [(j, (j + s) % n) for j in range(n)])\n"
        "        chunks = chunks.at[(i - s) % n].set(recv)\n",
        "on a ring every device sends to its neighbour",
    ),
    Mutant(
        RA,
        "imports_library_ring",
        "def ring_allreduce(x, axis_name, axis_size):\n",
        "from course_lib.scaling.collectives import ring_allreduce\n\n\ndef my_ring_allreduce(x, axis_name, axis_size):\n",
        "ring_allreduce uses course_lib.scaling.collectives.ring_allreduce, the library's own implementation: "
        "write ring_allreduce yourself",
    ),
    Mutant(RA, "hardcoded_axis", "i = jax.lax.axis_index(axis_name)", 'i = jax.lax.axis_index("data")', "raised"),
    # data_parallel_grad
    Mutant(DP, "psum_not_pmean", PMEAN, "return jax.lax.psum(grads, axis_name)", "2 times too large: psum"),
    Mutant(DP, "no_reduction", PMEAN, "return grads", "no reduction"),
    Mutant(
        DP,
        "averaged_twice",
        PMEAN,
        "return jax.tree.map(lambda g: g / jax.lax.psum(1, axis_name), jax.lax.pmean(grads, axis_name))",
        "averaged twice",
    ),
    Mutant(DP, "hardcoded_axis", PMEAN, 'return jax.lax.pmean(grads, "data")', "raised"),
    Mutant(
        DP,
        "moves_the_batch",
        DP_SOLUTION,
        "    whole = jax.lax.all_gather(batch, axis_name, tiled=True)  # every device gets the whole batch\n"
        "    return jax.grad(loss_fn)(params, whole)",
        "it moves the data, not the gradients: all_gather on the batch itself",
    ),
    Mutant(
        DP,
        "batch_summed_into_place",
        DP_SOLUTION,
        "    n, i = jax.lax.psum(1, axis_name), jax.lax.axis_index(axis_name)\n"
        "    def place(x):  # this shard in its slot of a zero batch, summed over devices: the whole batch\n"
        "        slots = jnp.zeros((n,) + x.shape, x.dtype).at[i].set(x)\n"
        "        return jax.lax.psum(slots, axis_name).reshape((-1,) + x.shape[1:])\n"
        "    return jax.grad(loss_fn)(params, jax.tree.map(place, batch))",
        "it moves the data, not the gradients: psum on the batch itself",
    ),
    Mutant(
        DP,
        "batch_gathered_by_scalar_psums",
        DP_SOLUTION,
        "    n, i = jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)\n"
        "    gather = lambda x: jax.lax.map(lambda v: jax.lax.psum(v, axis_name),\n"
        "        jnp.zeros((n,) + x.shape, x.dtype).at[i].set(x).reshape(-1)).reshape((-1,) + x.shape[1:])\n"
        "    return jax.lax.pmean(jax.grad(loss_fn)(params, jax.tree.map(gather, batch)), axis_name)",
        "inside loops (lax.map, lax.scan, fori_loop or while) that send something on every trip",
    ),
    Mutant(
        DP,
        "moves_tainted_batch",
        DP_SOLUTION,
        "    z = 0 * jax.tree.leaves(params)[0].sum()  # the batch now depends on the parameters too\n"
        "    taint = lambda b: (b + z).astype(b.dtype)\n"
        "    full = jax.tree.map(lambda b: jax.lax.all_gather(taint(b), axis_name, tiled=True), batch)\n"
        "    return jax.lax.pmean(jax.grad(loss_fn)(params, full), axis_name)",
        "it moves the data, not the gradients: all_gather on the batch itself",
    ),
    # accumulate_grads
    Mutant(
        AG,
        "imports_library_accumulation",
        "def accumulate_grads(loss_fn, params, batch, n_micro):\n",
        "from course_lib.scaling.accumulation import accumulated_grad as accumulate_grads\n\n\n"
        "def my_accumulate_grads(loss_fn, params, batch, n_micro):\n",
        "accumulate_grads uses course_lib.scaling.accumulation.accumulated_grad, the library's own implementation: "
        "write accumulate_grads yourself",
    ),
    Mutant(
        AG,
        "summed_not_averaged",
        "return jax.tree.map(lambda g: g / n_micro, total)",
        "return total",
        "summed, not averaged",
    ),
    Mutant(
        AG,
        "last_micro_batch_dropped",
        SCAN,
        "total, _ = jax.lax.scan(step, jax.tree.map(jnp.zeros_like, params), jax.tree.map(lambda x: x[:-1], micro))",
        "the last micro-batch is dropped",
    ),
    Mutant(
        AG,
        "interleaved",
        RESHAPE,
        "x.reshape((batch_size // n_micro, n_micro) + x.shape[1:]).swapaxes(0, 1)",
        "the micro-batches are interleaved",
    ),
    Mutant(
        AG,
        "python_loop",
        SCAN,
        "total = jax.tree.map(jnp.zeros_like, params)\n"
        "    for k in range(n_micro):\n"
        "        total, _ = step(total, jax.tree.map(lambda x, k=k: x[k], micro))",
        "holds no lax.scan",
    ),
    Mutant(
        AG,
        "no_size_check",
        "if n_micro < 1 or batch_size % n_micro:",
        "if n_micro < 1:",
        "raised TypeError",
    ),
    # remat_segments
    Mutant(RS, "no_checkpoint", CHECKPOINT, "", "the program holds no jax.checkpoint"),
    Mutant(
        RS,
        "whole_network_one_checkpoint",
        OUTER_SCAN,
        "    return jax.checkpoint(run_layers)(x, params)  # one segment: k is ignored",
        "one jax.checkpoint around all 36 layers (k ignored)",
    ),
    Mutant(
        RS,
        "checkpoint_each_layer",
        INNER_SCAN + "\n        return h\n\n" + CHECKPOINT,
        "h, _ = jax.lax.scan(jax.checkpoint(lambda h, p: (layer(h, p), None)), h, stacked)\n        return h\n\n",
        "checkpoints each layer alone (12 checkpoints of 1 layer): per-layer remat, not segments",
    ),
    Mutant(
        RS,
        "k_taken_as_segment_count",
        "leaf.reshape((n // k, k) + leaf.shape[1:])",
        "leaf.reshape((k, n // k) + leaf.shape[1:])",
        "runs 3 checkpoints of 4 layers each; segments of k=3 are 4 checkpoints of 3 layers",
    ),
    Mutant(RS, "no_divisibility_check", "if k < 1 or n % k:", "if k < 1:", "raised TypeError"),
    Mutant(
        AG,
        "error_names_nothing",
        'raise ValueError(f"n_micro={n_micro} does not divide the batch of {batch_size} rows; pick a divisor")',
        'raise ValueError("n_micro must divide the batch")',
        "which does not name 10 or 4",
    ),
    # wrong mechanism (issue 45): lax.map stacks every micro-batch's gradient (n_micro copies alive at once)
    # instead of carrying their running sum
    Mutant(
        AG,
        "stacked_by_lax_map",
        SCAN + "\n    return jax.tree.map(lambda g: g / n_micro, total)",
        "stacked = jax.lax.map(lambda mb: jax.grad(loss_fn)(params, mb), micro)  # every micro-batch's gradient\n"
        "    return jax.tree.map(lambda g: g.mean(axis=0), stacked)",
        "the micro-batches' gradients are stacked",
    ),
    # wrong mechanism (issue 45): a debugging print left in the scan, a host round trip per micro-batch
    Mutant(
        AG,
        "debug_print_in_scan",
        "        grads = jax.grad(loss_fn)(params, micro_batch)\n",
        "        grads = jax.grad(loss_fn)(params, micro_batch)\n"
        '        jax.debug.print("micro-batch loss {l}", l=loss_fn(params, micro_batch))\n',
        "debug_print",
    ),
    # wrong mechanism (issue 45): every micro-batch's gradient taken at once by jax.vmap, the scan only summing
    # them (n_micro gradients and their activations alive at once)
    Mutant(
        AG,
        "vmapped_grads_summed_by_scan",
        "    def step(total, micro_batch):\n"
        "        grads = jax.grad(loss_fn)(params, micro_batch)\n"
        "        return jax.tree.map(jnp.add, total, grads), None\n"
        "\n"
        "    " + SCAN + "\n",
        "    g = jax.vmap(lambda mb: jax.grad(loss_fn)(params, mb))(micro)  # every micro-batch's gradient at once\n"
        "\n"
        "    def step(total, grads):\n"
        "        return jax.tree.map(jnp.add, total, grads), None\n"
        "\n"
        "    total, _ = jax.lax.scan(step, jax.tree.map(jnp.zeros_like, params), g)\n",
        "the gradients are not computed inside the scan",
    ),
    # wrong mechanism (issue 45): the segments run by a Python loop (n / k checkpoints unrolled into the program)
    Mutant(
        RS,
        "python_loop_over_segments",
        OUTER_SCAN,
        "    h = x\n"
        "    for s in range(n // k):  # one checkpointed segment after another\n"
        "        h, _ = run_segment(h, jax.tree.map(lambda leaf, s=s: leaf[s], segments))\n"
        "    return h",
        "a Python loop over the segments",
    ),
    # wrong mechanism (issue 45): a segment's layers unrolled by a Python loop inside the checkpoint
    Mutant(
        RS,
        "python_loop_inside_segment",
        INNER_SCAN,
        "for j in range(k):  # the segment's layers, unrolled\n"
        "            h = layer(h, jax.tree.map(lambda leaf, j=j: leaf[j], stacked))",
        "a Python loop over the k layers of a segment",
    ),
]
