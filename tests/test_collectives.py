"""The ppermute ring (reduce-scatter, all-gather, all-reduce) against XLA's collectives and NumPy.

The session has 4 CPU devices (conftest); rings of N = 2, 3, 4 run on sub-meshes of them.
Every multi-device call runs under the watchdog and is blocked on. Tolerance for sums of
float32 (values ~N(0, 1), at most 4 terms): rtol = atol = 1e-5 (rounding differs only in
the order of the additions, about 1e-7 relative); gathers, which only copy, are exact.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.collectives import (
    AlphaBetaFit,
    allreduce_time_model,
    collective_demo,
    fit_alpha_beta,
    format_collective_demo,
    measure_allreduce,
    ring_all_gather,
    ring_all_gather_bytes_sent_per_device,
    ring_allreduce,
    ring_allreduce_bytes_sent_per_device,
    ring_reduce_scatter,
    ring_reduce_scatter_bytes_sent_per_device,
)
from course_lib.scaling.devices import data_mesh
from course_lib.scaling.profiling import hlo_collectives

AXIS = "ring"
RTOL = ATOL = 1e-5


def guarded(fn: Any, *args: Any, what: str = "a collective test on CPU devices", seconds: float = 60) -> Any:
    """Run ``fn(*args)`` to completion under the watchdog."""
    with watchdog(seconds, what):
        return jax.block_until_ready(fn(*args))


def sharded_program(n: int, body: Any) -> tuple[Any, Any]:
    """``jit(shard_map(body))`` over the first ``n`` devices, in and out specs ``P(AXIS)``; and the mesh."""
    mesh = data_mesh(n, AXIS)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))), mesh


def random_blocks(rng: np.random.Generator, n: int, lead: int) -> np.ndarray:
    """``n`` device blocks of shape ``[lead, *trailing]`` with 0-2 random trailing dims, stacked: ``[n, lead, ...]``."""
    trailing = tuple(int(d) for d in rng.integers(1, 5, size=int(rng.integers(0, 3))))
    return rng.standard_normal((n, lead, *trailing)).astype(np.float32)


def put(mesh: Any, blocks: np.ndarray) -> jax.Array:
    """The global array whose device ``i`` block is ``blocks[i]``, sharded over AXIS."""
    return jax.device_put(blocks.reshape(-1, *blocks.shape[2:]), NamedSharding(mesh, P(AXIS)))


CASES = [(n, seed) for n in (2, 3, 4) for seed in range(2)]


@pytest.mark.parametrize(("n", "seed"), CASES)
def test_ring_allreduce_equals_psum_and_numpy(n, seed):
    rng = np.random.default_rng(100 * n + seed)
    blocks = random_blocks(rng, n, lead=n * int(rng.integers(1, 4)))
    program, mesh = sharded_program(n, lambda x: (ring_allreduce(x, AXIS, n), jax.lax.psum(x, AXIS)))
    ring, psum = (np.asarray(a).reshape(blocks.shape) for a in guarded(program, put(mesh, blocks)))
    oracle = blocks.astype(np.float64).sum(axis=0)
    for device in range(n):  # every device holds the full sum
        np.testing.assert_allclose(ring[device], oracle, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(ring[device], psum[device], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("n", "seed"), CASES)
def test_ring_reduce_scatter_equals_psum_scatter(n, seed):
    rng = np.random.default_rng(200 * n + seed)
    c = int(rng.integers(1, 4))
    blocks = random_blocks(rng, n, lead=n * c)
    program, mesh = sharded_program(
        n,
        lambda x: (
            ring_reduce_scatter(x, AXIS, n),
            jax.lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True),
        ),
    )
    ring, ref = (np.asarray(a) for a in guarded(program, put(mesh, blocks)))
    # Device i's output is chunk i (rows i*c .. i*c+c) of the sum; stacked in device order that is the whole sum.
    oracle = blocks.astype(np.float64).sum(axis=0)
    assert ring.shape == oracle.shape
    np.testing.assert_allclose(ring, oracle, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ring, ref, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(("n", "seed"), CASES)
def test_ring_all_gather_equals_all_gather(n, seed):
    rng = np.random.default_rng(300 * n + seed)
    blocks = random_blocks(rng, n, lead=int(rng.integers(1, 4)))
    program, mesh = sharded_program(n, lambda x: (ring_all_gather(x, AXIS, n), jax.lax.all_gather(x, AXIS, tiled=True)))
    ring, ref = (np.asarray(a) for a in guarded(program, put(mesh, blocks)))
    everything = blocks.reshape(-1, *blocks.shape[2:])  # all chunks in device order
    per_device = ring.reshape(n, *everything.shape)
    for device in range(n):
        np.testing.assert_array_equal(per_device[device], everything)
    np.testing.assert_array_equal(ring, ref)


@pytest.mark.parametrize("n", [3, 4])
def test_ring_allreduce_pads_shapes_that_do_not_divide(n):
    """Local blocks of 5 x 7 elements (35, not a multiple of 3 or 4): flattened and zero-padded, then cut back."""
    blocks = np.random.default_rng(n).standard_normal((n, 5, 7)).astype(np.float32)
    program, mesh = sharded_program(n, lambda x: ring_allreduce(x, AXIS, n))
    ring = np.asarray(guarded(program, put(mesh, blocks))).reshape(blocks.shape)
    for device in range(n):
        np.testing.assert_allclose(ring[device], blocks.astype(np.float64).sum(0), rtol=RTOL, atol=ATOL)


def test_reduce_scatter_refuses_a_leading_dim_that_does_not_divide():
    program, mesh = sharded_program(4, lambda x: ring_reduce_scatter(x, AXIS, 4))
    x = put(mesh, np.ones((4, 6, 2), np.float32))  # 6 rows per device, 4 devices
    with pytest.raises(ValueError, match="multiple of 4"):
        guarded(program, x)


def test_a_wrong_axis_size_is_refused():
    program, mesh = sharded_program(2, lambda x: ring_allreduce(x, AXIS, 4))
    with pytest.raises(ValueError, match="axis_size=4 but mesh axis 'ring' has 2"):
        guarded(program, put(mesh, np.ones((2, 4), np.float32)))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_compiled_ring_is_only_ppermutes_of_one_nth_and_sends_the_model_bytes(n):
    """Counted in the compiled HLO: 2 (N-1) collective-permutes, no other collective, each
    moving 1/N of the buffer, so each device sends 2 (N-1)/N of it, the cost formula."""
    k = 12 * 4  # float32 elements per device, divisible by 2, 3 and 4
    program, mesh = sharded_program(n, lambda x: ring_allreduce(x, AXIS, n))
    x = put(mesh, np.zeros((n, k), np.float32))
    collectives = hlo_collectives(program.lower(x).compile().as_text())
    assert [c.opcode for c in collectives] == ["collective-permute"] * (2 * (n - 1))
    assert {c.operand_bytes for c in collectives} == {k * 4 // n}
    sent = sum(c.bytes_sent_per_device for c in collectives)
    assert sent == pytest.approx(ring_allreduce_bytes_sent_per_device(n, k * 4))


def test_cost_formulas():
    assert ring_allreduce_bytes_sent_per_device(4, 1000) == pytest.approx(1500)  # 2 * 3/4 * 1000
    assert ring_allreduce_bytes_sent_per_device(1, 1000) == 0
    assert ring_allreduce_bytes_sent_per_device(1024, 1.0) < 2  # tends to 2 x the data
    assert ring_reduce_scatter_bytes_sent_per_device(4, 1000) == pytest.approx(750)
    assert ring_all_gather_bytes_sent_per_device(4, 1000) == pytest.approx(750)
    # 2 (N-1) alpha + 2 (N-1)/N nbytes / bw, N = 4: 6 * 1e-5 + 1.5 * 1e6 / 1e9
    assert allreduce_time_model(4, 1e6, 1e-5, 1e9) == pytest.approx(6e-5 + 1.5e-3)
    with pytest.raises(ValueError, match="n_devices"):
        ring_allreduce_bytes_sent_per_device(0, 10)


def test_fit_alpha_beta_recovers_the_model():
    sizes = [4096 * 4**k for k in range(7)]
    truth = AlphaBetaFit(4, alpha_s=2e-5, bandwidth_bytes_per_s=3e9, rel_rms_error=0.0)
    exact = [truth.predict_s(s) for s in sizes]
    fit = fit_alpha_beta(sizes, exact, n_devices=4)
    assert fit.alpha_s == pytest.approx(2e-5, rel=1e-6)
    assert fit.bandwidth_bytes_per_s == pytest.approx(3e9, rel=1e-6)
    assert fit.rel_rms_error < 1e-9
    noise = np.random.default_rng(0).uniform(0.95, 1.05, size=len(sizes))  # +-5 % per point
    noisy = fit_alpha_beta(sizes, list(np.array(exact) * noise), n_devices=4)
    assert noisy.alpha_s == pytest.approx(2e-5, rel=0.15)
    assert noisy.bandwidth_bytes_per_s == pytest.approx(3e9, rel=0.15)


def test_fit_alpha_beta_keeps_coefficients_non_negative_and_checks_input():
    # Times that fall with size would need a negative bandwidth term: it is clipped to none (infinite bandwidth).
    fit = fit_alpha_beta([1e3, 1e6], [2e-4, 1e-4], n_devices=2)
    assert fit.alpha_s > 0 and fit.bandwidth_bytes_per_s == float("inf")
    with pytest.raises(ValueError, match="2 distinct"):
        fit_alpha_beta([10, 10], [1.0, 1.0], n_devices=2)
    with pytest.raises(ValueError, match="n_devices >= 2"):
        fit_alpha_beta([10, 20], [1.0, 2.0], n_devices=1)


def test_measure_allreduce_small():
    m = measure_allreduce(data_mesh(2, "data"), sizes_bytes=[4096, 65536, 1 << 20], repeats=2, watchdog_s=60)
    assert [r.nbytes for r in m.rows] == [4096, 65536, 1 << 20]
    for row in m.rows:
        assert row.psum_s > 0 and row.ring_s > 0 and row.ring_model_s > 0
        assert row.max_abs_diff < 1e-5  # the ring and psum agreed on these inputs
    assert m.ring_fit.n_devices == 2 and m.ring_fit.alpha_s >= 0 and m.ring_fit.bandwidth_bytes_per_s > 0
    with pytest.raises(ValueError, match="multiples of 4"):
        measure_allreduce(data_mesh(2), sizes_bytes=[6])


@pytest.mark.parametrize("n", [2, 3])
def test_collective_demo_matches_numpy(n):
    results = collective_demo(data_mesh(n))
    rows = np.arange(n * n, dtype=np.float64).reshape(n, n)  # device i holds rows[i]
    expected = {
        "input": rows,
        "psum": np.tile(rows.sum(0), (n, 1)),
        "pmean": np.tile(rows.mean(0), (n, 1)),
        "all_gather": np.tile(rows, (n, 1, 1)),
        "psum_scatter": rows.sum(0)[:, None],
        "ppermute": np.roll(rows, 1, axis=0),  # device i got device i-1's row
        "ring_allreduce": np.tile(rows.sum(0), (n, 1)),
    }
    assert list(results) == list(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(results[name], value, err_msg=name)
    text = format_collective_demo(results)
    assert "psum_scatter" in text and "d1:" in text


def test_ring_allreduce_on_one_device_is_the_identity():
    program, mesh = sharded_program(1, lambda x: ring_allreduce(x, AXIS, 1))
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    np.testing.assert_array_equal(np.asarray(guarded(program, put(mesh, x))), x.reshape(6))
