"""A tensor-parallel MLP on a 2-D mesh (``data`` x ``model``), and what each layout must communicate (lesson 05).

The model is a 2-layer MLP::

    h = relu(x W1 + b1)        x: [B, d_in]    W1: [d_in, H]    b1: [H]
    y = h W2 + b2              W2: [H, d_out]  b2: [d_out]      y: [B, d_out]

On a mesh of ``n_data x n_model`` devices the batch is split over ``data`` (each row of
devices sees ``B / n_data`` examples) and the hidden layer over ``model`` (Megatron-LM's
layout, Shoeybi et al. 2019):

- **column-parallel W1** (``P(None, "model")``, ``b1``: ``P("model")``): device ``j`` of the
  ``model`` axis holds columns ``j`` of W1, so it computes its own slice of ``h``,
  ``relu`` included (relu acts element by element), with no communication;
- **row-parallel W2** (``P("model", None)``): the same device holds the matching rows of
  W2, and ``h_j W2_j`` is a *partial* sum of ``y``; one ``psum`` over ``model`` adds the
  partial sums, then ``b2`` (replicated, ``P()``) is added once.

So the forward pass costs one all-reduce of ``[B / n_data, d_out]`` over ``model`` and
nothing else, and each device stores ``1 / n_model`` of the weights.

**Communication per layout** (:func:`layout_communication`). Bytes each device *sends*,
counting a ring all-reduce of ``M`` bytes over ``G`` devices as ``2 (G-1)/G * M``
(:func:`course_lib.scaling.collectives.ring_allreduce_bytes_sent_per_device`); ``e`` is bytes per
element::

    forward  = 2 (n_model-1)/n_model * (B/n_data) * d_out * e                 (psum of y over model)
    backward = 2 (n_data-1)/n_data * (d_in*H/n_model + H/n_model
                                      + H*d_out/n_model + d_out) * e          (gradient all-reduce over data)
             [+ 2 (n_model-1)/n_model * (B/n_data) * d_in * e                  (psum of dx over model, if x needs a gradient)]

Pure data parallelism is ``n_model = 1`` (no forward traffic; the whole gradient,
``d_in*H + H + H*d_out + d_out`` elements, is all-reduced every step); pure tensor
parallelism is ``n_data = 1`` (no gradient sync: each device owns its slice of every
weight; the traffic is activations, and grows with the batch). The backward of the
forward ``psum`` is free (its cotangent is already replicated over ``model``); the ``dx``
all-reduce appears only when the MLP's input is itself an activation that needs a gradient
(a block inside a deeper network), not for the data batch.

Parameters are initialised outside any multi-device program (:func:`init_mlp`: scaled
normals, no orthogonal/QR initialisation, which deadlocks XLA:CPU host devices, see
:mod:`course_lib.scaling.devices`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.scaling.collectives import ring_allreduce_bytes_sent_per_device

DATA, MODEL = "data", "model"


class MLPParams(NamedTuple):
    """The MLP's weights (a pytree): ``y = relu(x w1 + b1) w2 + b2``."""

    w1: jax.Array  # [d_in, H]
    b1: jax.Array  # [H]
    w2: jax.Array  # [H, d_out]
    b2: jax.Array  # [d_out]


#: Where each parameter lives on the ``data`` x ``model`` mesh (the parameters' pytree, holding specs).
PARAM_SPECS: Any = MLPParams(w1=P(None, MODEL), b1=P(MODEL), w2=P(MODEL, None), b2=P())  # type: ignore[arg-type]
#: The batch: split over ``data``, replicated over ``model``.
BATCH_SPEC = P(DATA, None)


def init_mlp(
    key: jax.Array, d_in: int, d_hidden: int, d_out: int, bias_scale: float = 0.0, dtype: Any = jnp.float32
) -> MLPParams:
    """Weights ``~ N(0, 1/fan_in)`` (LeCun normal), biases ``~ N(0, bias_scale**2)`` (zero by default).

    Call it on one device, before any multi-device program (no linear algebra inside
    those: :mod:`course_lib.scaling.devices`). One jitted program (not a dozen eager ops).
    """
    for name, v in (("d_in", d_in), ("d_hidden", d_hidden), ("d_out", d_out)):
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    return _init_mlp(key, d_in, d_hidden, d_out, bias_scale, jnp.dtype(dtype))


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 5))
def _init_mlp(key: jax.Array, d_in: int, d_hidden: int, d_out: int, bias_scale: float, dtype: Any) -> MLPParams:
    k1, k2, k3, k4 = jax.random.split(key, 4)
    return MLPParams(
        w1=(jax.random.normal(k1, (d_in, d_hidden)) / jnp.sqrt(d_in)).astype(dtype),
        b1=(bias_scale * jax.random.normal(k2, (d_hidden,))).astype(dtype),
        w2=(jax.random.normal(k3, (d_hidden, d_out)) / jnp.sqrt(d_hidden)).astype(dtype),
        b2=(bias_scale * jax.random.normal(k4, (d_out,))).astype(dtype),
    )


def mlp_reference(params: MLPParams, x: jax.Array) -> jax.Array:
    """The unsharded MLP: ``relu(x w1 + b1) w2 + b2``."""
    return jax.nn.relu(x @ params.w1 + params.b1) @ params.w2 + params.b2


def tp_mlp_mesh(n_data: int, n_model: int, devices: list[jax.Device] | None = None) -> Mesh:
    """A ``(n_data, n_model)`` mesh with axes ``("data", "model")`` over the first ``n_data * n_model`` devices."""
    devices = list(devices if devices is not None else jax.devices())
    if n_data < 1 or n_model < 1 or n_data * n_model > len(devices):
        raise ValueError(f"a {n_data} x {n_model} mesh needs {n_data * n_model} devices, JAX has {len(devices)}")
    return jax.make_mesh((n_data, n_model), (DATA, MODEL), devices=devices[: n_data * n_model])


def _check_shapes(params: MLPParams, x: jax.Array, mesh: Mesh) -> None:
    if tuple(mesh.axis_names) != (DATA, MODEL):
        raise ValueError(
            f"tp_mlp needs a mesh with axes ('data', 'model'), got {mesh.axis_names}: use tp_mlp_mesh(n_data, n_model)"
        )
    n_data, n_model = mesh.shape[DATA], mesh.shape[MODEL]
    hidden = params.w1.shape[1]
    if hidden % n_model:
        raise ValueError(
            f"the hidden width {hidden} must be divisible by the model axis ({n_model} devices): change d_hidden or the mesh"
        )
    if x.ndim != 2 or x.shape[0] % n_data:
        raise ValueError(
            f"x must be [batch, d_in] with batch divisible by the data axis ({n_data} devices), got shape {x.shape}"
        )


def shard_mlp_params(params: MLPParams, mesh: Mesh) -> MLPParams:
    """Place the parameters on the mesh as :data:`PARAM_SPECS` says."""
    return MLPParams(*(jax.device_put(p, NamedSharding(mesh, s)) for p, s in zip(params, PARAM_SPECS, strict=True)))


def shard_batch(x: jax.Array, mesh: Mesh) -> jax.Array:
    """Place a ``[B, d_in]`` batch on the mesh, split over ``data``."""
    return jax.device_put(x, NamedSharding(mesh, BATCH_SPEC))


def tp_block(params: MLPParams, x: jax.Array) -> jax.Array:
    """One device's part (Megatron's MLP): its slice of h, its partial y, one psum over model, then b2.

    In the backward pass the psum's transpose is free (its cotangent is replicated over
    ``model``), but the gradient with respect to ``x`` is a *partial* sum on each device
    (``dh_j @ W1_j^T``): when ``x`` is an activation of a deeper network, a second psum over
    ``model``, of ``x``'s size, completes it (``layout_communication(..., x_needs_grad=True)``).
    """
    h = jax.nn.relu(x @ params.w1 + params.b1)  # [B/n_data, H/n_model]: column-parallel, no communication
    partial_y = h @ params.w2  # [B/n_data, d_out]: this device's share of the row-parallel product
    return jax.lax.psum(partial_y, MODEL) + params.b2


def tp_mlp(params: MLPParams, x: jax.Array, mesh: Mesh) -> jax.Array:
    """The MLP on a ``("data", "model")`` mesh: column-parallel W1, row-parallel W2, batch over ``data``.

    Returns ``y`` (``[B, d_out]``, split over ``data``). Works eagerly and under ``jit`` and
    ``grad`` (the inputs are placed on the mesh first; inside ``jit`` that is a sharding
    constraint). Raises ``ValueError`` if ``d_hidden`` or the batch do not divide evenly.
    Run it under :func:`course_lib.runtime.watchdog.watchdog` and block on the result.
    """
    _check_shapes(params, x, mesh)
    params, x = shard_mlp_params(params, mesh), shard_batch(x, mesh)
    return jax.shard_map(tp_block, mesh=mesh, in_specs=(PARAM_SPECS, BATCH_SPEC), out_specs=BATCH_SPEC)(params, x)


def _axis_groups(mesh: Mesh) -> dict[str, str]:
    """For each mesh axis, XLA's ``replica_groups`` text of an all-reduce over that axis alone."""
    ids = np.vectorize(lambda d: d.id)(mesh.devices)
    out = {}
    for k, name in enumerate(mesh.axis_names):
        groups = np.moveaxis(ids, k, -1).reshape(-1, ids.shape[k])
        out["{" + ",".join("{" + ",".join(str(int(i)) for i in g) + "}" for g in groups) + "}"] = name
    return out


_ALL_REDUCE = re.compile(r"= (\(?[^=]*?\)?) all-reduce(?:-start)?\(.*?replica_groups=(\{\{[0-9,{}]*\}\})")


def training_allreduces(params: MLPParams, x: jax.Array, mesh: Mesh, x_needs_grad: bool) -> list[tuple[str, str]]:
    """The all-reduces XLA compiled into one gradient of the tensor-parallel MLP, as ``(shapes, mesh axis)``.

    Reads the compiled HLO of ``jit(grad(sum(tp_mlp(params, x)^2)))`` (with respect to the
    parameters, and to ``x`` too when ``x_needs_grad``): the forward psum of ``y`` over
    ``model``, the weights' gradient sync over ``data`` (XLA combines it into one tuple
    all-reduce), and, only when ``x`` needs a gradient, the psum of ``dx`` over ``model``.
    """
    argnums = (0, 1) if x_needs_grad else 0
    grad = jax.jit(jax.grad(lambda p, a: (tp_mlp(p, a, mesh) ** 2).sum(), argnums=argnums))
    text = grad.lower(params, x).compile().as_text()
    axes = _axis_groups(mesh)
    found = []
    for line in (text or "").splitlines():
        m = _ALL_REDUCE.search(line)
        if m:
            shapes = re.sub(r"\{[0-9,]*\}", "", m.group(1)).strip("()")
            found.append((shapes, axes.get(m.group(2), m.group(2))))
    return found


# ---------------------------------------------------------------------------
# Communication per layout
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutComm:
    """Bytes each device sends for one layout (ring collectives), and the weights it stores."""

    layout: str
    n_data: int
    n_model: int
    forward_bytes: float  # psum of y over model
    backward_bytes: float  # gradient all-reduce over data (+ dx psum over model when asked)
    param_bytes_per_device: float
    dx_bytes: float = 0.0  # the part of backward_bytes that is the psum of dx over model (x_needs_grad)

    @property
    def grad_sync_bytes(self) -> float:
        """The weights' gradient all-reduce over ``data`` (the rest of ``backward_bytes``)."""
        return self.backward_bytes - self.dx_bytes

    @property
    def step_bytes(self) -> float:
        """Forward + backward + gradient sync: one training step."""
        return self.forward_bytes + self.backward_bytes


def layout_communication(
    batch: int,
    d_in: int,
    d_hidden: int,
    d_out: int,
    n_data: int,
    n_model: int,
    bytes_per_elem: int = 4,
    x_needs_grad: bool = False,
) -> dict[str, LayoutComm]:
    """Bytes each device sends per forward and per backward (with gradient sync), for three layouts.

    The layouts use the same ``N = n_data * n_model`` devices: ``"data parallel"``
    (``N x 1``), ``"tensor parallel"`` (``1 x N``) and ``"2-D"`` (``n_data x n_model``).
    With ``G`` devices in a ring all-reduce of ``M`` bytes costing ``2 (G-1)/G * M`` each::

        forward  = 2 (n_model-1)/n_model * (batch/n_data) * d_out * e
        backward = 2 (n_data-1)/n_data * (d_in*H/n_model + H/n_model + H*d_out/n_model + d_out) * e
                   [+ 2 (n_model-1)/n_model * (batch/n_data) * d_in * e   if x_needs_grad]

    ``b2`` is replicated over ``model``, so every device all-reduces all of its gradient
    over ``data``. ``param_bytes_per_device`` is what each device stores of the weights.
    """
    for name, v in (("batch", batch), ("d_in", d_in), ("d_hidden", d_hidden), ("d_out", d_out), ("n_data", n_data), ("n_model", n_model), ("bytes_per_elem", bytes_per_elem)):  # fmt: skip
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    n = n_data * n_model
    out = {}
    for layout, nd, nm in (("data parallel", n, 1), ("tensor parallel", 1, n), ("2-D", n_data, n_model)):
        if d_hidden % nm or batch % nd:
            raise ValueError(
                f"layout {layout} ({nd} x {nm}) needs batch % {nd} == 0 and d_hidden % {nm} == 0; got batch={batch}, d_hidden={d_hidden}"
            )
        e = bytes_per_elem
        local_batch = batch // nd
        forward = ring_allreduce_bytes_sent_per_device(nm, local_batch * d_out * e)
        grad_elems = d_in * d_hidden // nm + d_hidden // nm + d_hidden * d_out // nm + d_out
        backward = ring_allreduce_bytes_sent_per_device(nd, grad_elems * e)
        dx = ring_allreduce_bytes_sent_per_device(nm, local_batch * d_in * e) if x_needs_grad else 0.0
        out[layout] = LayoutComm(layout, nd, nm, forward, backward + dx, grad_elems * e, dx)
    return out
