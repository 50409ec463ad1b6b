"""bf16 mixed precision (course_lib.scaling.precision): small nonzero error, float32 master
weights, bf16 compute in the program JAX builds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.scaling import precision as mp
from course_lib.scaling.remat import mlp_loss, mlp_problem

#: a bf16 pass must be off by at least half a bf16 roundoff (else it was not bf16)
BF16_FLOOR = mp.BF16_UNIT_ROUNDOFF / 2


def test_bf16_error_is_small_but_not_zero():
    errors = mp.precision_errors(depth=2, width=32, batch=16, seeds=(0, 1, 2))
    assert errors.grad_dtype == "float32"
    assert len(errors.grad_rel_err) == 3
    # measured 2026-11: gradient 6e-3..7e-3 (~2 bf16 roundoffs), loss 3e-5..3e-4 at this size;
    # per seed the loss error can come close to 0 (1e-6 seen), so only its max is bounded below
    assert BF16_FLOOR < errors.grad_mean <= errors.grad_max < 5e-2, errors
    assert 0 < errors.loss_max < 1e-2, errors


def test_float32_control_has_no_error():
    """The same wrapper with float32 compute is the float32 pass: exactly zero error."""
    errors = mp.precision_errors(depth=2, width=32, batch=16, seeds=(0,), compute_dtype=jnp.float32)
    assert errors.loss_rel_err == (0.0,) and errors.grad_rel_err == (0.0,)


def test_master_weights_stay_float32_and_the_update_is_sgd():
    params, x, y = mlp_problem(0, depth=2, width=32, batch=16)
    lr = 0.1
    new_params, loss = mp.train_step(mlp_loss, lr, jnp.bfloat16)(params, x, y)
    assert {str(a.dtype) for a in jax.tree.leaves(new_params)} == {"float32"}
    assert loss.dtype == jnp.float32
    # oracle: the bf16 gradient, then the float32 SGD update by hand
    grads = jax.grad(mp.mixed_precision_loss(mlp_loss))(params, x, y)
    for name in params:
        want = np.asarray(params[name]) - lr * np.asarray(grads[name])
        np.testing.assert_allclose(np.asarray(new_params[name]), want, rtol=1e-6, atol=1e-7)
    assert not np.array_equal(np.asarray(new_params["W"]), np.asarray(params["W"]))


def test_compute_is_bf16_in_the_jaxpr():
    params, x, y = mlp_problem(0, depth=2, width=32, batch=16)
    bf16 = mp.jaxpr_dot_dtypes(jax.grad(mp.mixed_precision_loss(mlp_loss)), params, x, y)
    f32 = mp.jaxpr_dot_dtypes(jax.grad(mlp_loss), params, x, y)
    # the scanned layer: one dot forward, two backward (dW and dh)
    assert bf16 == {"bfloat16 x bfloat16": 3}, bf16
    assert f32 == {"float32 x float32": 3}, f32


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="documents the CPU backend's kernels")
def test_cpu_backend_multiplies_bf16_in_float32():
    """The module docstring says XLA CPU upcasts bf16 dots (why bf16 is slower here): keep it true."""
    params, x, y = mlp_problem(0, depth=2, width=32, batch=16)
    dots = mp.compiled_dot_dtypes(jax.jit(jax.grad(mp.mixed_precision_loss(mlp_loss))), params, x, y)
    assert dots and set(dots) == {"f32"}, dots


def test_bf16_has_float32_range_so_no_loss_scaling():
    tiny = 1e-30  # a gradient this small: float16 flushes it to zero, bfloat16 keeps it
    assert float(jnp.asarray(tiny, jnp.float16)) == 0.0
    assert float(jnp.asarray(tiny, jnp.bfloat16)) == pytest.approx(tiny, rel=2 * mp.BF16_UNIT_ROUNDOFF)
    assert float(jnp.finfo(jnp.bfloat16).eps) / 2 == mp.BF16_UNIT_ROUNDOFF
    # precision is what bf16 gives up: 1 + u rounds back to 1 (a tie, to even), 1 + 2u does not
    assert float(jnp.asarray(1.0, jnp.bfloat16) + jnp.asarray(mp.BF16_UNIT_ROUNDOFF, jnp.bfloat16)) == 1.0
    assert float(jnp.asarray(1.0 + 2 * mp.BF16_UNIT_ROUNDOFF, jnp.bfloat16)) > 1.0


def test_cast_floating_leaves_integers():
    tree = {"w": jnp.ones(3, jnp.float32), "step": jnp.asarray(7, jnp.int32)}
    cast = mp.cast_floating(tree, jnp.bfloat16)
    assert cast["w"].dtype == jnp.bfloat16 and cast["step"].dtype == jnp.int32


def test_step_times_reports_interleaved_rounds():
    times = mp.step_times(depth=2, width=32, batch=16, repeats=2)
    assert len(times.f32_s) == len(times.bf16_s) == 2
    assert times.bf16_speedup == pytest.approx(times.f32_median_s / times.bf16_median_s)


def test_bad_inputs():
    with pytest.raises(ValueError, match="seeds is empty"):
        mp.precision_errors(seeds=())
    with pytest.raises(ValueError, match="trees differ"):
        mp.tree_relative_error({"a": jnp.ones(2)}, {"a": jnp.ones(3)})
