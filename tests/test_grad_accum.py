"""Gradient accumulation (course_lib.scaling.accumulation): the full-batch gradient in micro-batches,
in less memory.

Oracles: the closed-form gradient of least squares, ``X^T (X w - y) / B``, and
``jax.grad`` of the whole batch for the deep MLP.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.scaling import accumulation as ga
from course_lib.scaling.remat import mlp_loss, mlp_problem


def _least_squares(params, batch):
    x, y = batch
    return 0.5 * jnp.mean((x @ params["w"] + params["c"] - y) ** 2)


@pytest.mark.parametrize(("seed", "n_micro"), [(0, 1), (0, 3), (1, 4), (1, 24)])
def test_least_squares_gradient_matches_the_closed_form(seed, n_micro):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((24, 5)).astype(np.float32)
    y = rng.standard_normal(24).astype(np.float32)
    params = {"w": jnp.asarray(rng.standard_normal(5), jnp.float32), "c": jnp.asarray(0.3, jnp.float32)}
    loss, grads = ga.accumulated_value_and_grad(_least_squares, params, (jnp.asarray(x), jnp.asarray(y)), n_micro)
    r = x.astype(np.float64) @ np.asarray(params["w"], np.float64) + 0.3 - y  # residuals, float64
    np.testing.assert_allclose(np.asarray(grads["w"]), x.T.astype(np.float64) @ r / 24, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(grads["c"]), r.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss), 0.5 * np.mean(r**2), rtol=1e-5)


@pytest.mark.parametrize("n_micro", [2, 8, 64])
def test_deep_mlp_gradient_equals_the_full_batch_one(n_micro):
    params, x, y = mlp_problem(n_micro, depth=4, width=32, batch=64)

    def loss(p, b):
        return mlp_loss(p, *b)

    full = jax.grad(loss)(params, (x, y))
    accumulated = jax.jit(lambda p, b: ga.accumulated_grad(loss, p, b, n_micro))(params, (x, y))
    for name in params:
        # measured max |diff| 1.3e-7 on gradients of size ~0.1 (float32 sums reordered)
        np.testing.assert_allclose(
            np.asarray(accumulated[name]), np.asarray(full[name]), rtol=ga.ACCUM_RTOL, atol=ga.ACCUM_ATOL
        )
    # summing without dividing by n_micro (the classic bug) would be n_micro times too large
    ratio = float(jnp.linalg.norm(accumulated["W"]) / jnp.linalg.norm(full["W"]))
    assert ratio == pytest.approx(1.0, rel=1e-4)


def test_micro_batches_are_consecutive_slices():
    batch = {"x": jnp.arange(12.0).reshape(6, 2), "y": jnp.arange(6)}
    micro = ga.split_micro_batches(batch, 3)
    assert micro["x"].shape == (3, 2, 2) and micro["y"].shape == (3, 2)
    np.testing.assert_array_equal(np.asarray(micro["y"][1]), [2, 3])


def test_clear_errors():
    x, y = jnp.ones((10, 3)), jnp.ones(10)
    with pytest.raises(ValueError, match=r"batch size 10 is not divisible by n_micro=3"):
        ga.accumulated_grad(_least_squares, {"w": jnp.ones(3), "c": jnp.zeros(())}, (x, y), 3)
    with pytest.raises(ValueError, match="positive int"):
        ga.split_micro_batches((x, y), 0)
    with pytest.raises(ValueError, match="same leading"):
        ga.split_micro_batches((x, jnp.ones(8)), 2)
    with pytest.raises(ValueError, match="not divisible"):
        ga.accumulation_memory(n_micros=(3,), depth=1, width=8, batch=16)


def test_accumulation_lowers_temp_memory():
    full, four = ga.accumulation_memory(n_micros=(4,), depth=4, width=64, batch=1024)
    assert (full.n_micro, four.n_micro) == (0, 4)
    assert four.micro_batch == 256
    # measured 2026-11: temp 3.77 -> 1.02 MiB; the activations (3 L m W floats) shrink 4x,
    # the gradient buffers do not
    assert four.memory.temp_bytes < 0.5 * full.memory.temp_bytes, (four.memory, full.memory)
    assert four.memory.total_bytes < full.memory.total_bytes
    assert four.memory.argument_bytes == full.memory.argument_bytes  # the whole batch is still an input
