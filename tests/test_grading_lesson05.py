"""Lesson 05's graders beyond what tests/test_exercises.py checks for every lesson: the
oracles against JAX itself (shard placement, the ring schedule), the check_vma trap the
exercise text states, and a program with a LAPACK call refused before it can deadlock.

What every lesson gets (solution passes, stub "not implemented yet", every planted bug caught,
the generated notebooks graded by `course grade`) is in tests/test_exercises.py and
tests/test_grade_course_notebooks.py.

The session has 4 CPU devices (tests/conftest.py); every multi-device program the graders
run is compiled first, refused if it holds a LAPACK call, and runs under the watchdog.
"""

from __future__ import annotations

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
NAMES = ("partition_specs", "ring_allreduce", "data_parallel_grad", "accumulate_grads")


def test_registry_lists_the_four_exercises():
    gh.assert_registry(LESSON, NAMES, ("5", "scaling_jax"), points=50)


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "ring_allreduce-psum",
        "data_parallel_grad-psum_not_pmean",
        "data_parallel_grad-no_reduction",
        "data_parallel_grad-averaged_twice",
        "accumulate_grads-summed_not_averaged",
        "accumulate_grads-last_micro_batch_dropped",
        "accumulate_grads-interleaved",
    }
    gh.assert_slips_planted(MUTANTS, slips)


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
    picked = ("obs_replicated", "psum", "psum_not_pmean", "interleaved")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
