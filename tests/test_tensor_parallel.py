"""The tensor-parallel MLP equals the unsharded one (values and gradients) on 2x2, 1x4 and 4x1
meshes, and its communication formula equals the collectives counted in the compiled HLO.

Tolerance: float32, inputs ~N(0, 1), widths <= 32: rtol = 1e-5, atol = 1e-5 (the sharded
products add the same terms in another order). Every multi-device call runs under the
watchdog and is blocked on.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.devices import check_multidevice_safe
from course_lib.scaling.profiling import hlo_collectives
from course_lib.scaling.tensor_parallel import (
    PARAM_SPECS,
    MLPParams,
    init_mlp,
    layout_communication,
    mlp_reference,
    tp_mlp,
    tp_mlp_mesh,
    training_allreduces,
)

RTOL = ATOL = 1e-5
MESHES = [(2, 2), (1, 4), (4, 1)]
B, D_IN, H, D_OUT = 8, 6, 16, 5


def guarded(fn: Any, *args: Any, what: str = "tensor-parallel MLP on CPU devices") -> Any:
    with watchdog(60, what):
        return jax.block_until_ready(fn(*args))


@pytest.fixture(scope="module")
def problem():
    params = init_mlp(jax.random.key(0), D_IN, H, D_OUT, bias_scale=0.5)  # non-zero biases: they are tested too
    x = jax.random.normal(jax.random.key(1), (B, D_IN))
    target = jax.random.normal(jax.random.key(2), (B, D_OUT))
    return params, x, target


def numpy_mlp(params: MLPParams, x: Any) -> np.ndarray:
    """An independent oracle in float64."""
    w1, b1, w2, b2 = (np.asarray(p, np.float64) for p in params)
    return np.maximum(np.asarray(x, np.float64) @ w1 + b1, 0.0) @ w2 + b2


@pytest.mark.parametrize(("n_data", "n_model"), MESHES)
def test_tp_mlp_equals_the_reference(problem, n_data, n_model):
    params, x, _ = problem
    mesh = tp_mlp_mesh(n_data, n_model)
    forward = jax.jit(lambda p, x: tp_mlp(p, x, mesh))
    y = guarded(check_multidevice_safe(forward, params, x), params, x)
    np.testing.assert_allclose(np.asarray(y), numpy_mlp(params, x), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.asarray(y), np.asarray(mlp_reference(params, x)), rtol=RTOL, atol=ATOL)
    assert y.sharding.spec[0] == "data"  # the output stays split over the batch


@pytest.mark.parametrize(("n_data", "n_model"), MESHES)
def test_tp_mlp_gradient_equals_the_reference_gradient(problem, n_data, n_model):
    """Mean squared error over the global batch: the sharded gradient (b2 replicated over
    both axes included) must be the unsharded one, not N times it."""
    params, x, target = problem
    mesh = tp_mlp_mesh(n_data, n_model)

    def loss(f):
        return lambda p, x: jnp.mean((f(p, x) - target) ** 2)

    grad_tp = jax.jit(jax.grad(loss(lambda p, x: tp_mlp(p, x, mesh))))
    got = guarded(grad_tp, params, x)
    want = jax.grad(loss(mlp_reference))(params, x)
    for name, g, w in zip(MLPParams._fields, got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL, err_msg=name)
    # The gradients live where the parameters do.
    for g, spec in zip(got, PARAM_SPECS, strict=True):
        assert tuple(g.sharding.spec) == tuple(spec) + (None,) * (len(g.sharding.spec) - len(spec))


def test_shapes_that_do_not_divide_are_refused(problem):
    params, x, _ = problem
    with pytest.raises(ValueError, match="hidden width 15 must be divisible by the model axis"):
        tp_mlp(init_mlp(jax.random.key(0), D_IN, 15, D_OUT), x, tp_mlp_mesh(1, 2))
    with pytest.raises(ValueError, match="batch divisible by the data axis"):
        tp_mlp(params, x[:7], tp_mlp_mesh(2, 2))


def test_init_mlp_is_scaled_normal():
    p = init_mlp(jax.random.key(3), 256, 512, 64)
    assert float(jnp.std(p.w1)) == pytest.approx(1 / 16, rel=0.05)  # 1 / sqrt(256)
    assert float(jnp.std(p.w2)) == pytest.approx(1 / np.sqrt(512), rel=0.05)
    assert not np.any(np.asarray(p.b1)) and not np.any(np.asarray(p.b2))


def test_layout_communication_by_hand():
    """B=32, d_in=64, H=128, d_out=16, 4 bytes, 4 devices as 2 x 2, counted by hand."""
    comm = layout_communication(32, 64, 128, 16, n_data=2, n_model=2)
    dp, tp, two_d = comm["data parallel"], comm["tensor parallel"], comm["2-D"]
    n_params = 64 * 128 + 128 + 128 * 16 + 16  # 10,384
    # Data parallel, 4 x 1: nothing forward; all gradients all-reduced over 4: 2 * 3/4 * 10,384 * 4 bytes.
    assert (dp.n_data, dp.n_model) == (4, 1)
    assert dp.forward_bytes == 0 and dp.backward_bytes == pytest.approx(1.5 * n_params * 4)
    # Tensor parallel, 1 x 4: psum of y [32, 16] over 4: 2 * 3/4 * 512 * 4; no gradient sync.
    assert tp.forward_bytes == pytest.approx(1.5 * 512 * 4) and tp.backward_bytes == 0
    assert tp.param_bytes_per_device == (n_params - 16) // 4 * 4 + 16 * 4  # b2 is not split
    # 2-D, 2 x 2: psum of y [16, 16] over 2; gradient shards (half of W1, b1, W2, all of b2) over 2.
    assert two_d.forward_bytes == pytest.approx(16 * 16 * 4)
    assert two_d.backward_bytes == pytest.approx((64 * 64 + 64 + 64 * 16 + 16) * 4)
    with_dx = layout_communication(32, 64, 128, 16, 2, 2, x_needs_grad=True)["2-D"]
    assert with_dx.backward_bytes - two_d.backward_bytes == pytest.approx(16 * 64 * 4)  # psum of dx [16, 64] over 2
    assert with_dx.dx_bytes == pytest.approx(16 * 64 * 4) and with_dx.grad_sync_bytes == two_d.backward_bytes
    with pytest.raises(ValueError, match="d_hidden % 4"):
        layout_communication(32, 64, 126, 16, 2, 2)


def _counted_bytes(jitted: Any, *args: Any) -> float:
    """Bytes each device sends, summed over the compiled program's collectives (ring costs)."""
    return sum(c.bytes_sent_per_device for c in hlo_collectives(jitted.lower(*args).compile().as_text()))


@pytest.mark.parametrize(("n_data", "n_model"), MESHES)
@pytest.mark.parametrize("x_needs_grad", [False, True])
def test_layout_communication_equals_the_compiled_collectives(problem, n_data, n_model, x_needs_grad):
    """Forward alone, then forward + backward (+ gradient sync) as one program: the bytes
    the formula predicts equal those of the all-reduces XLA compiled, counted from their
    operand sizes and replica groups. (XLA may merge all-reduces over the same group, e.g.
    y's and dx's psums over model: the totals still agree.)"""
    params, x, _ = problem
    mesh = tp_mlp_mesh(n_data, n_model)
    dy = jax.random.normal(jax.random.key(4), (B, D_OUT))

    def step(p, x, dy):
        if x_needs_grad:
            y, vjp = jax.vjp(lambda p, x: tp_mlp(p, x, mesh), p, x)
        else:
            y, vjp = jax.vjp(lambda p: tp_mlp(p, x, mesh), p)
        return y, vjp(dy)  # y kept: the forward psum is part of the step

    predicted = layout_communication(B, D_IN, H, D_OUT, n_data, n_model, x_needs_grad=x_needs_grad)["2-D"]
    assert _counted_bytes(jax.jit(lambda p, x: tp_mlp(p, x, mesh)), params, x) == pytest.approx(predicted.forward_bytes)
    assert _counted_bytes(jax.jit(step), params, x, dy) == pytest.approx(predicted.step_bytes)
    assert predicted.step_bytes > 0


def test_backward_inside_a_deep_network_pays_a_second_model_allreduce():
    """Megatron: the dx psum over `model` appears in the compiled gradient only when x needs a gradient."""
    params = init_mlp(jax.random.key(0), 8, 32, 4, bias_scale=0.1)
    x = jax.random.normal(jax.random.key(1), (16, 8))
    mesh = tp_mlp_mesh(2, 2)
    with watchdog(120, "tensor-parallel gradients on 2 x 2 CPU devices"):
        first = training_allreduces(params, x, mesh, x_needs_grad=False)
        deep = training_allreduces(params, x, mesh, x_needs_grad=True)
    assert ("f32[8,4]", "model") in first and [a for _, a in first].count(
        "model"
    ) == 1  # forward psum of y [B/2, d_out]
    assert [a for _, a in first].count("data") == 1  # the weights' gradients, combined into one all-reduce
    assert sorted(deep) == sorted([*first, ("f32[8,8]", "model")])  # + dx [B/2, d_in] over model
