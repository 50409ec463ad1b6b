"""Lesson 05's graders beyond what tests/test_exercises.py checks for every lesson: the
oracles against JAX itself (shard placement, the ring schedule), the check_vma trap the
exercise text states, the dependency walk that tells moved data from all-reduced
gradients, remat's checkpoint count and its memory margin, and a program with a LAPACK
call refused before it can deadlock.

What every lesson gets (solution passes, stub "not implemented yet", every planted bug caught,
the generated notebooks graded by `course grade`) is in tests/test_exercises.py and
tests/test_grade_course_notebooks.py.

The session has 4 CPU devices (tests/conftest.py); every multi-device program the graders
run is compiled first, refused if it holds a LAPACK call, and runs under the watchdog.
"""

from __future__ import annotations

import functools
from pathlib import Path

import grading_helpers as gh
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import solution_function
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from mutants.l05_scaling_jax import MUTANTS

from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import l05_scaling_jax as l05
from course_lib.runtime.watchdog import watchdog

ROOT = Path(__file__).resolve().parents[1]
LESSON = "05_scaling_jax"
NAMES = ("partition_specs", "ring_allreduce", "data_parallel_grad", "accumulate_grads", "remat_segments")


def test_registry_lists_the_five_exercises():
    gh.assert_registry(LESSON, NAMES, ("5", "scaling_jax"), points=65)


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "ring_allreduce-psum",
        "data_parallel_grad-psum_not_pmean",
        "data_parallel_grad-no_reduction",
        "data_parallel_grad-averaged_twice",
        "data_parallel_grad-moves_the_batch",
        "data_parallel_grad-moves_tainted_batch",
        "data_parallel_grad-batch_gathered_by_scalar_psums",
        "ring_allreduce-imports_library_ring",
        "accumulate_grads-imports_library_accumulation",
        "accumulate_grads-summed_not_averaged",
        "accumulate_grads-last_micro_batch_dropped",
        "accumulate_grads-interleaved",
        "remat_segments-no_checkpoint",
        "remat_segments-whole_network_one_checkpoint",
        "remat_segments-checkpoint_each_layer",
        "remat_segments-no_divisibility_check",
    }
    gh.assert_slips_planted(MUTANTS, slips, NAMES)


def test_hints_lead_rather_than_give_the_solution():
    """The ring's and accumulation's hints nudge without the solution's key lines, and exercise 1's
    statement describes the layouts in words (tests/test_hints.py checks every hint of every lesson)."""
    ring, accumulate = l05.RING_ALLREDUCE.hints, l05.ACCUMULATE_GRADS.hints
    assert len(ring) >= 3 and len(accumulate) >= 3
    for line in ("(i - s) % n", "(i - s - 1) % n", "(i + 1 - s) % n", ".add(recv)", ".set(recv)"):
        assert all(line not in h for h in ring), line
    assert all("jax.grad(loss_fn)" not in h and "jnp.add" not in h for h in accumulate)
    text = (ROOT / "exercises" / "src" / f"{LESSON}.py").read_text()
    statement = text[text.index("## Exercise 1") : text.index("def partition_specs")]
    for spec in ('P(None, "model")', 'P("model", None)', 'P("model")', 'P("data", None)', "P()"):
        assert spec not in statement, spec


# ---------------------------------------------------------------------------------------
# The oracles against JAX itself
# ---------------------------------------------------------------------------------------


def test_canonical_specs_ignore_trailing_none_and_one_axis_groups():
    assert l05.canonical(P("data")) == l05.canonical(P("data", None)) == l05.canonical(P(("data",), None))
    assert l05.canonical(P()) == l05.canonical(P(None, None)) == ()
    assert l05.canonical(P(None, "model")) != l05.canonical(P("model", None))


@pytest.mark.parametrize(
    ("shape", "names", "spec"),
    [
        ((4,), ("data",), P("data", None)),
        ((2, 2), ("data", "model"), P(None, "model")),
        ((2, 2), ("data", "model"), P("model", "data")),
        ((2, 2), ("data", "model"), P(("data", "model"), None)),
        ((2, 2), ("data", "model"), P(("model", "data"))),
        ((1, 4), ("data", "model"), P()),
    ],
)
def test_expected_blocks_agree_with_jax_placement(shape, names, spec):
    mesh = jax.make_mesh(shape, names, devices=jax.devices()[: int(np.prod(shape))])
    full = np.arange(64, dtype=np.float32).reshape(8, 8)
    with watchdog(60, "placing an 8 x 8 array"):
        placed = jax.block_until_ready(jax.device_put(full, NamedSharding(mesh, spec)))
    blocks = l05.expected_blocks(mesh, l05.canonical(spec), full.shape)
    assert {s.device.id for s in placed.addressable_shards} == set(blocks)
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), full[blocks[shard.device.id]])


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_ring_simulation_is_an_all_reduce_and_its_slips_differ(n):
    blocks = np.random.default_rng(n).normal(size=(n, 2 * n))
    total = blocks.sum(0)
    np.testing.assert_allclose(l05.ring_simulation(blocks), np.broadcast_to(total, blocks.shape))
    stopped = l05.ring_simulation(blocks, all_gather=False).reshape(n, n, 2)
    for i in range(n):  # after the reduce-scatter, device i holds only chunk (i + 1) mod n in full
        done = [k for k in range(n) if np.allclose(stopped[i, k], total.reshape(n, 2)[k])]
        assert done == [(i + 1) % n]
    assert not np.allclose(l05.ring_simulation(blocks, gather_adds=True), l05.ring_simulation(blocks))


def test_ring_oracle_groups_the_devices_of_each_ring():
    blocks = np.arange(8.0).reshape(4, 2)  # devices (0, 0), (0, 1), (1, 0), (1, 1) of a 2 x 2 grid
    np.testing.assert_array_equal(l05._ra_expected(blocks, (2, 2), 1), [[2, 4], [2, 4], [10, 12], [10, 12]])
    np.testing.assert_array_equal(l05._ra_expected(blocks, (2, 2), 0), [[4, 6], [8, 10], [4, 6], [8, 10]])


def test_the_solutions_ring_matches_psum_directly():
    ring = solution_function(LESSON, "ring_allreduce")
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
    x = jax.device_put(np.random.default_rng(0).normal(size=48).astype(np.float32), NamedSharding(mesh, P("data")))
    prog = jax.jit(
        jax.shard_map(
            lambda b: (ring(b, "data", 4), jax.lax.psum(b, "data")),
            mesh=mesh,
            in_specs=P("data"),
            out_specs=P("data"),
            check_vma=False,
        )
    )
    with watchdog(60, "ring all-reduce vs psum on 4 CPU devices"):
        got, expected = jax.block_until_ready(prog(x))
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)


def test_check_vma_true_returns_the_gradient_already_summed():
    """The trap the exercise text states: with check_vma=True the gradient of a replicated
    parameter comes back summed over devices, and pmean leaves it n times too large."""
    grad_fn = solution_function(LESSON, "data_parallel_grad")
    params, batch = l05.mlp_data(0)
    expected = l05._flat(jax.grad(l05.mlp_loss)(params, batch))
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    placed = (
        jax.device_put(params, NamedSharding(mesh, P())),
        jax.device_put(batch, NamedSharding(mesh, P("data"))),
    )
    results = {}
    for check_vma in (False, True):
        prog = jax.jit(
            jax.shard_map(
                lambda p, b: grad_fn(l05.mlp_loss, p, b, "data"),
                mesh=mesh,
                in_specs=(P(), P("data")),
                out_specs=P(),
                check_vma=check_vma,
            )
        )
        with watchdog(60, f"data-parallel gradient, check_vma={check_vma}"):
            results[check_vma] = l05._flat(jax.block_until_ready(prog(*placed)))
    np.testing.assert_allclose(results[False], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[True], 2 * expected, rtol=1e-5, atol=1e-6)


def test_micro_batch_oracle_agrees_with_the_full_batch_for_a_mean_loss():
    params, batch = l05.mlp_data(1, batch_size=12)
    full = l05._flat(jax.grad(l05.mlp_loss)(params, batch))
    for n_micro in (1, 2, 3, 4):
        np.testing.assert_allclose(l05.micro_batch_mean(l05.mlp_loss, params, batch, n_micro), full, rtol=1e-5)
    # per-micro-batch normalisation: contiguous and interleaved micro-batches give different gradients
    params, batch = l05.pg_data(2)
    contiguous = l05.micro_batch_mean(l05.normalized_pg_loss, params, batch, 4)
    interleaved = l05.micro_batch_mean(l05.normalized_pg_loss, params, batch, 4, interleaved=True)
    assert not np.allclose(contiguous, interleaved, rtol=1e-3)


def _dp_operands(body, batch_size=8):
    """The collective operands of ``body(params, batch)`` inside a 2-device shard_map, by
    :func:`l05.collective_operands`: ``[(primitive, size, labels)]``."""
    params, batch = l05.mlp_data(0, batch_size=batch_size)
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    prog = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=False)
    args = (jax.device_put(params, NamedSharding(mesh, P())), jax.device_put(batch, NamedSharding(mesh, P("data"))))
    (inner,) = [e.params["jaxpr"] for e in jax.make_jaxpr(prog)(*args).jaxpr.eqns if e.primitive.name == "shard_map"]
    labels = [frozenset({"params"})] * 4 + [frozenset({"batch"})] * 2
    return l05.collective_operands(inner, labels)


def test_dependency_walk_labels_gathered_batch_and_reduced_gradients():
    def gathered(p, b):
        return jax.grad(l05.mlp_loss)(p, jax.lax.all_gather(b, "data", tiled=True))

    def reduced(p, b):
        return jax.lax.pmean(jax.grad(l05.mlp_loss)(p, b), "data")

    # x [4, 3] and y [4, 2] per device are gathered: computed from the batch alone
    assert _dp_operands(gathered) == [("all_gather", (4, 3), {"batch"}, 1), ("all_gather", (4, 2), {"batch"}, 1)]
    # the gradient depends on both; pmean is a psum per leaf (w1 24, b1 8, w2 16, b2 2 numbers)
    ops = _dp_operands(reduced)
    assert sorted(op.size for op in ops) == [2, 8, 16, 24]
    assert all(op.primitive.startswith("psum") and op.deps == {"params", "batch"} for op in ops)


def test_dependency_walk_sees_through_jit_and_loops():
    def gathered_in_jit(p, b):
        gather = jax.jit(lambda b: jax.lax.all_gather(b, "data", tiled=True))
        return jax.grad(l05.mlp_loss)(p, gather(b))

    def scanned(p, b):  # a loop carry started from zeros picks up the batch: still labelled from it
        def step(acc, _):
            return acc + jax.lax.psum(b["x"], "data"), None

        acc, _ = jax.lax.scan(step, jnp.zeros_like(b["x"]), None, length=2)
        return jax.tree.map(lambda w: w + acc.sum(), p)

    assert [(op.primitive, op.deps) for op in _dp_operands(gathered_in_jit)] == [("all_gather", {"batch"})] * 2
    (op,) = _dp_operands(scanned)
    assert op.primitive == "psum" and "batch" in op.deps and op.trips == 2  # the scan's length


def test_the_batch_gathered_inside_jit_is_caught():
    def gathered_in_jit(loss_fn, params, batch, axis_name):
        whole = jax.jit(lambda b: jax.lax.all_gather(b, axis_name, tiled=True))(batch)
        return jax.grad(loss_fn)(params, whole)

    outcome = run_exercise(l05.DATA_PARALLEL_GRAD, gathered_in_jit)
    assert [r.status for r in outcome.results] == ["pass", "pass", "pass", "fail"]  # right numbers, wrong traffic
    assert "it moves the data, not the gradients: all_gather" in outcome.message, outcome.message


def test_gradient_shapes_are_a_leaf_or_a_flat_vector_of_one_leaf_or_of_all():
    params, _ = l05.mlp_data(0)  # w1 (3, 8), b1 (8,), w2 (8, 2), b2 (2,): 50 numbers
    for shape in [(3, 8), (8,), (8, 2), (2,), (24,), (16,), (50,)]:
        assert l05.gradient_shaped(shape, params), shape
    for shape in [(8, 3), (4, 3), (4, 2), (12,), (1, 50), (2, 8, 2)]:
        assert not l05.gradient_shaped(shape, params), shape


def test_a_batch_tainted_with_the_parameters_is_still_moved_data():
    """The reviewer's defeat of a dependency-only rule: the gathered batch depends on the
    parameters too, but it is shaped like the batch, so it is data crossing devices."""

    def tainted(p, b):
        z = 0 * jax.tree.leaves(p)[0].sum()
        full = jax.tree.map(lambda x: jax.lax.all_gather(x + z, "data", tiled=True), b)
        return jax.lax.pmean(jax.grad(l05.mlp_loss)(p, full), "data")

    params, _ = l05.mlp_data(0)
    ops = _dp_operands(tainted)
    assert {op.deps for op in ops if op.primitive == "all_gather"} == {frozenset({"params", "batch"})}
    not_gradient, copied = l05.moved_operands(ops, params)
    assert [(op.primitive, op.shape) for op in not_gradient] == [("all_gather", (4, 3)), ("all_gather", (4, 2))]
    assert copied == []


def test_a_flattened_pmean_passes_and_a_gathered_gradient_is_named():
    from jax.flatten_util import ravel_pytree

    def flat_pmean(loss_fn, params, batch, axis_name):
        flat, unravel = ravel_pytree(jax.grad(loss_fn)(params, batch))
        return unravel(jax.lax.pmean(flat, axis_name))

    def gathered_gradient(loss_fn, params, batch, axis_name):
        grads = jax.grad(loss_fn)(params, batch)
        return jax.tree.map(lambda g: jax.lax.all_gather(g, axis_name).mean(0), grads)

    outcome = run_exercise(l05.DATA_PARALLEL_GRAD, flat_pmean)
    assert outcome.passed, outcome.message
    outcome = run_exercise(l05.DATA_PARALLEL_GRAD, gathered_gradient)
    assert [r.status for r in outcome.results] == ["pass", "pass", "pass", "fail"]
    assert "it copies the gradient between devices with all_gather" in outcome.message, outcome.message


def test_a_reduce_scatter_then_all_gather_is_an_all_reduce_and_passes():
    """Section 5's all-reduce, a reduce-scatter then an all-gather, on the flat (zero-padded) gradient
    and leaf by leaf: both pass (review of lesson 05, defect 17); gathering the unreduced gradient does not."""
    from jax.flatten_util import ravel_pytree

    def flat_rs_ag(loss_fn, params, batch, axis_name):
        flat, unravel = ravel_pytree(jax.grad(loss_fn)(params, batch))
        n = jax.lax.axis_size(axis_name)
        padded = jnp.pad(flat, (0, -flat.size % n)).reshape(n, -1)
        piece = jax.lax.psum_scatter(padded, axis_name, scatter_dimension=0)  # my piece of the sum
        whole = jax.lax.all_gather(piece, axis_name, tiled=False).reshape(-1)[: flat.size]
        return unravel(whole / n)

    def leafwise_rs_ag(loss_fn, params, batch, axis_name):
        n = jax.lax.axis_size(axis_name)

        def all_reduce_mean(g):
            flat = jnp.pad(g.reshape(-1), (0, -g.size % n))
            piece = jax.lax.psum_scatter(flat, axis_name, tiled=True)
            return jax.lax.all_gather(piece, axis_name, tiled=True)[: g.size].reshape(g.shape) / n

        return jax.tree.map(all_reduce_mean, jax.grad(loss_fn)(params, batch))

    def gathered_then_scattered(loss_fn, params, batch, axis_name):  # the copy comes first: still refused
        grads = jax.grad(loss_fn)(params, batch)
        return jax.tree.map(lambda g: jax.lax.all_gather(g, axis_name).mean(0), grads)

    for fn in (flat_rs_ag, leafwise_rs_ag):
        outcome = run_exercise(l05.DATA_PARALLEL_GRAD, fn)
        assert outcome.passed, (fn.__name__, outcome.message)
    outcome = run_exercise(l05.DATA_PARALLEL_GRAD, gathered_then_scattered)
    assert not outcome.passed and "copies the gradient" in outcome.message, outcome.message


def test_trip_counts_multiply_through_nested_loops_and_a_while_loop_is_unbounded():
    def nested(p, b):
        def inner(c, x):
            return c + jax.lax.psum(x, "data"), None

        def outer(c, xs):
            return jax.lax.scan(inner, c, xs)[0], None

        c, _ = jax.lax.scan(outer, jnp.zeros(3), b["x"].reshape(2, 2, 3))
        return jax.tree.map(lambda w: w + c.sum(), p)

    def looped(p, b):
        c = jax.lax.while_loop(lambda c: c < 3.0, lambda c: c + jax.lax.psum(b["x"].sum(), "data"), 0.0)
        return jax.tree.map(lambda w: w + c, p)

    (op,) = _dp_operands(nested)
    assert (op.shape, op.trips, op.moved) == ((3,), 4, 12)
    assert [op.moved for op in _dp_operands(looped)] == [float("inf")]
    assert l05.crossing_numbers(_dp_operands(looped)) == float("inf")


def test_scalar_psums_round_a_map_gather_the_batch_and_are_caught():
    """Review of lesson 05 (round 2), defect 2: the batch gathered one scalar psum at a time in a
    lax.map gives the right numbers and a final pmean; the numbers it sends, size times trips,
    give it away. So do bias-shaped chunks (gradient-shaped) and a Python loop of scalar psums."""

    def scalar_psums(loss_fn, params, batch, axis_name):
        n, i = jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)

        def gather(x):
            slots = jnp.zeros((n,) + x.shape, x.dtype).at[i].set(x).reshape(-1)
            return jax.lax.map(lambda v: jax.lax.psum(v, axis_name), slots).reshape((-1,) + x.shape[1:])

        return jax.lax.pmean(jax.grad(loss_fn)(params, jax.tree.map(gather, batch)), axis_name)

    def bias_shaped_chunks(loss_fn, params, batch, axis_name):  # chunks of 2 numbers, like b2
        n, i = jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)

        def gather(x):
            slots = jnp.zeros((n,) + x.shape, x.dtype).at[i].set(x).reshape(-1, 2)
            return jax.lax.map(lambda v: jax.lax.psum(v, axis_name), slots).reshape((-1,) + x.shape[1:])

        return jax.lax.pmean(jax.grad(loss_fn)(params, jax.tree.map(gather, batch)), axis_name)

    def unrolled(loss_fn, params, batch, axis_name):
        n, i = jax.lax.axis_size(axis_name), jax.lax.axis_index(axis_name)

        def gather(x):
            flat = jnp.zeros((n,) + x.shape, x.dtype).at[i].set(x).reshape(-1)
            return jnp.stack([jax.lax.psum(flat[k], axis_name) for k in range(flat.size)]).reshape((-1,) + x.shape[1:])

        return jax.lax.pmean(jax.grad(loss_fn)(params, jax.tree.map(gather, batch)), axis_name)

    for fn in (scalar_psums, bias_shaped_chunks, unrolled):
        outcome = run_exercise(l05.DATA_PARALLEL_GRAD, fn)
        assert [r.status for r in outcome.results] == ["pass", "pass", "pass", "fail"], (fn.__name__, outcome.message)
        assert "it moves the data, not the gradients" in outcome.message, (fn.__name__, outcome.message)
        assert "more than 2 times the gradient's 50 numbers" in outcome.message, (fn.__name__, outcome.message)


def test_psum_then_divide_and_a_reported_loss_stay_within_the_budget():
    """Correct forms send about the gradient's size: a psum divided by the device count (a scalar
    psum of 1, exempt), and a pmean of the gradient beside a pmean of the scalar loss."""

    def psum_then_divide(loss_fn, params, batch, axis_name):
        n = jax.lax.psum(1, axis_name)
        return jax.tree.map(lambda g: g / n, jax.lax.psum(jax.grad(loss_fn)(params, batch), axis_name))

    def with_loss(loss_fn, params, batch, axis_name):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        _ = jax.lax.pmean(loss, axis_name)  # the global loss, for a log
        return jax.lax.pmean(grads, axis_name)

    for fn in (psum_then_divide, with_loss):
        outcome = run_exercise(l05.DATA_PARALLEL_GRAD, fn)
        assert outcome.passed, (fn.__name__, outcome.message)


# ---------------------------------------------------------------------------------------
# The guard: course_lib's own implementation is not an answer
# ---------------------------------------------------------------------------------------

_LIBRARY_FORMS = """
import functools
import jax
import course_lib
from course_lib.scaling import collectives
from course_lib.scaling.collectives import ring_allreduce as library_ring


def wrapper(x, axis_name, axis_size):
    return library_ring(x, axis_name, axis_size)


def module_attribute(x, axis_name, axis_size):
    return collectives.ring_allreduce(x, axis_name, axis_size)


def full_path(x, axis_name, axis_size):
    return course_lib.scaling.collectives.ring_allreduce(x, axis_name, axis_size)


def local_import(x, axis_name, axis_size):
    from course_lib.scaling.collectives import ring_allreduce

    return ring_allreduce(x, axis_name, axis_size)


def _helper(x, axis_name, axis_size):
    return [library_ring(x, axis_name, axis_size) for _ in range(1)][0]


def through_a_helper(x, axis_name, axis_size):
    return _helper(x, axis_name, axis_size)


def default_argument(x, axis_name, axis_size, impl=library_ring):
    return impl(x, axis_name, axis_size)


def _make():
    impl = library_ring

    def closure(x, axis_name, axis_size):
        return impl(x, axis_name, axis_size)

    return closure


closure = _make()
partial = functools.partial(library_ring)
jitted = jax.jit(library_ring, static_argnums=(1, 2))


def by_string(x, axis_name, axis_size):
    import importlib

    return importlib.import_module("course_lib.scaling.collectives").ring_allreduce(x, axis_name, axis_size)


def own(x, axis_name, axis_size):
    i = jax.lax.axis_index(axis_name)
    return jax.lax.ppermute(x, axis_name, [(j, (j + 1) % axis_size) for j in range(axis_size)]) + 0 * i
"""
_FORMS = (
    "wrapper",
    "module_attribute",
    "full_path",
    "local_import",
    "through_a_helper",
    "default_argument",
    "closure",
    "partial",
    "jitted",
    "by_string",
)


@pytest.mark.parametrize("form", _FORMS)
def test_the_guard_finds_the_library_ring_however_it_is_reached(form):
    from course_lib.course.grading.helpers import library_references

    namespace: dict = {}
    exec(compile(_LIBRARY_FORMS, "<learner>", "exec"), namespace)
    assert library_references(namespace[form], l05.LIBRARY) == ["course_lib.scaling.collectives.ring_allreduce"]
    outcome = run_exercise(l05.RING_ALLREDUCE, namespace[form])
    assert [r.status for r in outcome.results] == ["fail"] + ["skipped"] * len(l05.RING_ALLREDUCE.checks)
    assert outcome.message.endswith(
        "ring_allreduce uses course_lib.scaling.collectives.ring_allreduce, the library's own implementation: write "
        "ring_allreduce yourself, from jax.lax.ppermute, jax.lax.axis_index and indexing; the checks grade your code, "
        "not course_lib's"
    ), outcome.message


def test_the_guard_passes_the_learners_own_code_and_every_solution():
    from course_lib.course.grading.helpers import library_references

    namespace: dict = {}
    exec(compile(_LIBRARY_FORMS, "<learner>", "exec"), namespace)
    assert library_references(namespace["own"], l05.LIBRARY) == []
    for name in NAMES:  # the solutions' namespace imports course_lib.scaling (devices, remat): unused, so not named
        assert library_references(solution_function(LESSON, name), l05.LIBRARY) == [], name


@pytest.mark.parametrize("name", ["ppo_dp.synced_gradient", "remat.mlp_forward", "tensor_parallel.shard_mlp_params"])
def test_the_guard_names_any_course_lib_scaling_function(name):
    import importlib

    from course_lib.course.grading.helpers import library_references

    module, attr = name.split(".")
    library_fn = getattr(importlib.import_module(f"course_lib.scaling.{module}"), attr)
    assert library_references(lambda *a: library_fn(*a), l05.LIBRARY) == [f"course_lib.scaling.{name}"]


def _layer(h, p):
    return jnp.tanh(h @ p["W"] + p["b"])


def _scan(body, h, stacked):
    return jax.lax.scan(lambda h, p: (body(h, p), None), h, stacked)[0]


@pytest.mark.parametrize(
    ("variant", "expected"),
    [("none", []), ("per_layer", [(12, 1)]), ("segments", [(4, 3)]), ("whole", [(1, 12)]), ("unrolled", [(1, 3)] * 4)],
)
def test_checkpoint_count_of_hand_written_remat_programs(variant, expected):
    """(times run, matrix products inside) of each checkpoint, for 12 layers and k = 3."""
    params, x, _ = l05._rs_problem(12, 4, 2)
    segments = jax.tree.map(lambda a: a.reshape((4, 3) + a.shape[1:]), params)
    programs = {
        "none": lambda: _scan(_layer, x, params),
        "per_layer": lambda: _scan(jax.checkpoint(_layer), x, params),
        "segments": lambda: _scan(jax.checkpoint(lambda h, s: _scan(_layer, h, s)), x, segments),
        "whole": lambda: jax.checkpoint(lambda h: _scan(_layer, h, params))(x),
        "unrolled": lambda: functools.reduce(
            lambda h, i: jax.checkpoint(lambda h: _scan(_layer, h, jax.tree.map(lambda a: a[i], segments)))(h),
            range(4),
            x,
        ),
    }
    assert l05.checkpointed_segments(jax.make_jaxpr(programs[variant])().jaxpr) == expected


def test_remat_memory_threshold_has_margin_on_both_sides():
    """The memory check's case: segments of sqrt-ish k sit far below the threshold, no remat
    and one checkpoint around everything far above it (temp bytes of the compiled gradient)."""
    depth, width, batch, k = l05.MEMORY_CASE
    params, x, y = l05._rs_problem(depth, width, batch)
    forwards = {
        "none": lambda p, x: _scan(_layer, x, p),
        "whole": lambda p, x: jax.checkpoint(lambda h: _scan(_layer, h, p))(x),
        "segments": lambda p, x: _scan(
            jax.checkpoint(lambda h, s: _scan(_layer, h, s)),
            x,
            jax.tree.map(lambda a: a.reshape((depth // k, k) + a.shape[1:]), p),
        ),
    }
    temp = {name: l05._rs_temp_bytes(f, params, x, y, name) for name, f in forwards.items()}
    assert temp["segments"] < 0.75 * l05.MEMORY_FRACTION * temp["none"], temp
    assert temp["whole"] > 1.5 * l05.MEMORY_FRACTION * temp["none"], temp


# ---------------------------------------------------------------------------------------
# Safety: the lesson's hang rule, and a clear message without enough devices
# ---------------------------------------------------------------------------------------


def test_a_lapack_call_inside_the_ring_is_refused_before_it_runs():
    def ring_with_qr(x, axis_name, axis_size):
        q = jnp.linalg.qr(jnp.outer(x, x) + jnp.eye(x.size))[0]
        return jax.lax.ppermute(q[0], axis_name, [(j, (j + 1) % axis_size) for j in range(axis_size)])

    outcome = run_exercise(l05.RING_ALLREDUCE, ring_with_qr)
    assert not outcome.passed
    assert "lapack" in outcome.message and "deadlock" in outcome.message, outcome.message


def test_too_few_devices_is_named(monkeypatch):
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    outcome = run_exercise(l05.RING_ALLREDUCE, solution_function(LESSON, "ring_allreduce"))
    assert "need 2 JAX devices and this kernel has 1" in outcome.message
    assert "use_cpu_devices(4)" in outcome.message


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel that runs the notebook's first cell)
# ---------------------------------------------------------------------------------------


def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = ("obs_replicated", "psum", "moves_the_batch", "interleaved", "checkpoint_each_layer")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
