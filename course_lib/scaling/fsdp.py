"""FSDP / ZeRO-3: parameters *and* optimizer state sharded over ``data``, measured against data parallelism (lesson 05).

**Data parallelism** (lesson 05's PPO, :mod:`course_lib.scaling.ppo_dp`) keeps a full copy of
the parameters and of Adam's state (``mu``, ``nu``) on every device and all-reduces the
gradients: each of ``N`` devices stores ``16`` bytes per fp32 parameter however large ``N``.
**ZeRO** (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
Parameter Models") removes that redundancy in three stages: stage 1 shards the optimizer
state over the ``N`` data-parallel devices, stage 2 the gradients as well, stage 3 the
parameters too; PyTorch's **FSDP** (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling
Fully Sharded Data Parallel") is ZeRO-3. Each device then holds ``1/N`` of everything and
the full weights exist only transiently, one layer at a time:

1. before a layer's forward, **all-gather** its weight shards (every device gets the full
   ``W``: ``jax.lax.all_gather(w_shard, "data", axis=0, tiled=True)``);
2. compute the layer on the device's own slice of the batch (as in data parallelism);
3. in the backward pass the gradient of the local loss with respect to the *full* ``W`` is
   a per-device partial; the transpose of ``all_gather`` is ``psum_scatter``, a
   **reduce-scatter**: device ``i`` receives the sum over devices of chunk ``i`` only, i.e.
   exactly the gradient of its own shard;
4. Adam updates the shard with the device's shard of ``mu`` and ``nu`` (Adam is elementwise,
   so the shard's update equals the matching slice of the replicated update).

**What this module writes and what JAX derives.** :func:`fsdp_step` writes only the
``all_gather`` (per layer, just before use) and takes ``jax.grad`` with respect to the
*sharded* parameters: JAX's transpose of ``all_gather`` inserts the ``psum_scatter``
(the compiled HLO holds ``reduce-scatter`` ops, one per parameter:
:func:`collective_counts`), so no explicit ``psum_scatter`` appears. Both layouts use
``check_vma=False`` with an explicit average (the ``"pmean"`` convention of
:mod:`course_lib.scaling.ppo_dp`): data parallelism ``pmean``-s the gradients, FSDP divides the
reduce-scattered sum by ``N``.

**Re-gathering in the backward pass.** Without rematerialisation the all-gathered weights
are residuals of the forward pass and the backward reuses them: one all-gather and one
reduce-scatter per parameter per step, the same ``2 (N-1)/N * M`` bytes per device as
data parallelism's all-reduce of ``M`` gradient bytes, but the full weights of every layer
are alive at the end of the forward (in XLA's ``temp``). ZeRO-3 and FSDP free each
layer's full weights after use and gather them *again* in the backward: ZeRO's
``3 (N-1)/N * M`` = 1.5x data parallelism's traffic (the paper's Section 7.2.2;
:func:`ring_bytes_sent_per_device` gives both). ``regather_in_backward=True`` asks for it
by wrapping each layer in ``jax.checkpoint``: the program JAX traces then holds 11
all-gathers for the 3-layer MLP instead of 6 (the backward re-gathers every ``w`` and the
two hidden ``b``). Measured on jaxlib 0.10.2's CPU backend (2026-11): XLA's common
subexpression elimination merges each re-gather with the forward's gather of the same
shard, so the *compiled* program gathers 6 times either way and keeps the full weights
(``temp`` does not shrink). The table prints both counts, and the bytes sent computed from
the compiled collectives (:func:`hlo_ring_bytes_sent_per_device`) next to the formula;
production FSDP frees and re-gathers by scheduling, not by XLA's CSE.

XLA:CPU also *combines* data parallelism's 6 gradient all-reduces (and the loss's) into one
tuple all-reduce: the compiled DP step holds a single all-reduce of all the gradients.

**Memory per device** is *measured*: the bytes of every shard of the parameters and the
optimizer state that sits on each device (``array.addressable_shards[i].data.nbytes``,
:func:`resident_bytes_per_device`), and XLA's buffer assignment of the compiled step
(``compiled.memory_analysis()``: :func:`course_lib.scaling.remat.compiled_memory`). Every
weight and bias is sharded along its first axis (so every width must be divisible by ``N``);
the one replicated leaf is Adam's step count (an int32 scalar, 4 bytes per device), so FSDP's
resident bytes are ``(DP's - 4) / N + 4``.

:func:`zero_memory_per_device` is ZeRO's analytic accounting (Figure 1 of the paper), which
the tests check against the published numbers.

Parameters are initialised with plain scaled normals on one device, before any multi-device
program (no LAPACK inside multi-device CPU programs: :mod:`course_lib.scaling.devices`), and every
multi-device call runs under :func:`course_lib.runtime.watchdog.watchdog`, blocked step by step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.collectives import (
    ring_all_gather_bytes_sent_per_device,
    ring_allreduce_bytes_sent_per_device,
    ring_reduce_scatter_bytes_sent_per_device,
)
from course_lib.scaling.devices import check_multidevice_safe, data_mesh
from course_lib.scaling.profiling import hlo_collectives
from course_lib.scaling.remat import MemoryStats, compiled_memory

DATA = "data"
Layout = Literal["dp", "fsdp"]
LAYOUTS: tuple[str, ...] = ("dp", "fsdp")
#: The collectives :func:`collective_counts` looks for in compiled HLO text.
COLLECTIVES: tuple[str, ...] = ("all-gather", "reduce-scatter", "all-reduce")


class Layer(NamedTuple):
    """One dense layer: ``y = x @ w + b``; ``w``: ``[d_in, d_out]``, ``b``: ``[d_out]``."""

    w: jax.Array
    b: jax.Array


Params = tuple[Layer, ...]


# ---------------------------------------------------------------------------
# The model and the data
# ---------------------------------------------------------------------------


def check_widths(widths: Sequence[int], n_devices: int, batch: int | None = None) -> None:
    """Raise ``ValueError`` unless every width (and the batch) divides evenly over ``n_devices``.

    FSDP shards each ``w`` (``[d_in, d_out]``) along ``d_in`` and each ``b`` along ``d_out``,
    so every width must be a multiple of ``N``; the batch is split over ``data`` in both layouts.
    """
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")
    widths = list(widths)
    if len(widths) < 2 or any(w < 1 for w in widths):
        raise ValueError(f"widths must be >= 2 positive layer widths [d_in, hidden..., d_out], got {widths}")
    bad = [w for w in widths if w % n_devices]
    if bad:
        raise ValueError(
            f"FSDP shards every weight and bias along its first axis over {n_devices} devices, so every width must "
            f"be divisible by {n_devices}; widths {bad} of {widths} are not: round them to multiples of {n_devices}"
        )
    if batch is not None and (batch < 1 or batch % n_devices):
        raise ValueError(f"batch {batch} must be a positive multiple of the {n_devices} devices (split over 'data')")


def init_mlp(key: jax.Array, widths: Sequence[int]) -> Params:
    """Weights ``~ N(0, 1/d_in)``, biases 0 (plain normals: no orthogonal/QR initialisation).

    Call on one device, before any multi-device program (:mod:`course_lib.scaling.devices`).
    """
    check_widths(widths, 1)
    keys = jax.random.split(key, len(widths) - 1)
    return tuple(
        Layer(jax.random.normal(k, (a, b), jnp.float32) / np.sqrt(a), jnp.zeros((b,), jnp.float32))
        for k, a, b in zip(keys, widths[:-1], widths[1:], strict=True)
    )


def regression_batch(batch: int, d_in: int, d_out: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A fixed regression batch: ``x ~ N(0, 1)`` ``[batch, d_in]``, ``y = sin(x @ A)`` ``[batch, d_out]`` (NumPy, float32)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, d_in), dtype=np.float32)
    a = rng.standard_normal((d_in, d_out), dtype=np.float32) / np.sqrt(d_in)
    return x, np.sin(x @ a).astype(np.float32)


def mlp(params: Params, x: jax.Array) -> jax.Array:
    """The unsharded MLP: ``tanh`` between layers, linear output. ``x``: ``[B, d_in]`` -> ``[B, d_out]``."""
    for i, layer in enumerate(params):
        x = x @ layer.w + layer.b
        if i < len(params) - 1:
            x = jnp.tanh(x)
    return x


def mse(pred: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error over the (local) batch."""
    return jnp.mean((pred - y) ** 2)


# ---------------------------------------------------------------------------
# The two training steps (bodies of jax.shard_map over a 1-D "data" mesh)
# ---------------------------------------------------------------------------


def dp_step(
    params: Params,
    opt_state: Any,
    x: jax.Array,
    y: jax.Array,
    optimizer: optax.GradientTransformation,
    axis: str = DATA,
) -> tuple[Params, Any, jax.Array]:
    """Data parallelism, one device's part: full replicated params and Adam state, ``pmean`` of the gradients.

    ``x``, ``y``: this device's slice of the batch. Returns the new params, the new Adam
    state and the global mean loss (``pmean`` of the local losses).
    """
    loss, grads = jax.value_and_grad(lambda p: mse(mlp(p, x), y))(params)
    grads = jax.lax.pmean(grads, axis)  # all-reduce: every device gets the mean gradient
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, jax.lax.pmean(loss, axis)


def _gathered_layer(layer: Layer, h: jax.Array, axis: str, last: bool) -> jax.Array:
    w = jax.lax.all_gather(layer.w, axis, axis=0, tiled=True)  # [d_in/N, d_out] -> [d_in, d_out]
    b = jax.lax.all_gather(layer.b, axis, axis=0, tiled=True)  # [d_out/N] -> [d_out]
    h = h @ w + b
    return h if last else jnp.tanh(h)


def fsdp_forward(shards: Params, x: jax.Array, axis: str = DATA, regather_in_backward: bool = False) -> jax.Array:
    """The MLP from parameter *shards*: each layer's weights all-gathered just before use.

    With ``regather_in_backward`` each layer is a ``jax.checkpoint``: its full weights are
    not kept for the backward pass but gathered again there (ZeRO-3 / FSDP's memory saving,
    at 1.5x the traffic).
    """
    h = x
    for i, layer in enumerate(shards):
        last = i == len(shards) - 1

        def apply(layer: Layer, h: jax.Array, last: bool = last) -> jax.Array:
            return _gathered_layer(layer, h, axis, last)

        h = jax.checkpoint(apply)(layer, h) if regather_in_backward else apply(layer, h)
    return h


def fsdp_step(
    shards: Params,
    opt_state: Any,
    x: jax.Array,
    y: jax.Array,
    optimizer: optax.GradientTransformation,
    axis: str = DATA,
    regather_in_backward: bool = False,
) -> tuple[Params, Any, jax.Array]:
    """FSDP / ZeRO-3, one device's part: gather weights per layer, reduce-scatter gradients, update the shard.

    ``shards``: this device's ``1/N`` of every ``w`` (rows) and ``b``; ``opt_state``: its
    ``1/N`` of Adam's ``mu`` and ``nu`` (the step count replicated). The gradient is taken
    with respect to the shards, so JAX transposes each ``all_gather`` into a
    ``psum_scatter`` (reduce-scatter): the sum over devices of the gradient of *this* shard;
    dividing by ``N`` makes it the mean, exactly the slice of data parallelism's ``pmean``.
    """
    n = jax.lax.axis_size(axis)
    loss, grads = jax.value_and_grad(lambda s: mse(fsdp_forward(s, x, axis, regather_in_backward), y))(shards)
    grads = jax.tree.map(lambda g: g / n, grads)  # reduce-scatter gave the sum over devices
    updates, opt_state = optimizer.update(grads, opt_state, shards)
    return optax.apply_updates(shards, updates), opt_state, jax.lax.pmean(loss, axis)


# ---------------------------------------------------------------------------
# Placement, programs, measurements
# ---------------------------------------------------------------------------


def specs(layout: Layout, tree: Any, axis: str = DATA) -> Any:
    """The PartitionSpec of every leaf of ``tree`` (params or Adam state) in ``layout``.

    ``"dp"``: everything ``P()``. ``"fsdp"``: every array with an axis ``P(axis)`` (sharded
    along its first axis), scalars (Adam's step count) ``P()``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "dp":
        return jax.tree.map(lambda _: P(), tree)
    return jax.tree.map(lambda leaf: P(axis) if np.ndim(leaf) >= 1 else P(), tree)


def place(tree: Any, tree_specs: Any, mesh: Mesh) -> Any:
    """``jax.device_put`` every leaf of ``tree`` with its spec on ``mesh``."""
    return jax.tree.map(lambda leaf, s: jax.device_put(leaf, NamedSharding(mesh, s)), tree, tree_specs)


def train_step_program(
    layout: Layout,
    mesh: Mesh,
    optimizer: optax.GradientTransformation,
    param_specs: Any,
    state_specs: Any,
    regather_in_backward: bool = False,
) -> Any:
    """One training step of ``layout`` as ``jax.jit(jax.shard_map(...))`` over the 1-D ``mesh``.

    Call it as ``program(params, opt_state, x, y) -> (params, opt_state, loss)`` with the
    inputs placed as ``param_specs`` / ``state_specs`` say and ``x``, ``y`` split over the axis.
    """
    axis = str(mesh.axis_names[0])

    def body(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[Params, Any, jax.Array]:
        if layout == "dp":
            return dp_step(params, opt_state, x, y, optimizer, axis)
        return fsdp_step(params, opt_state, x, y, optimizer, axis, regather_in_backward)

    mapped = jax.shard_map(
        body,
        mesh=mesh,
        in_specs=(param_specs, state_specs, P(axis), P(axis)),
        out_specs=(param_specs, state_specs, P()),
        check_vma=False,
    )
    return jax.jit(mapped)


def resident_bytes_per_device(*trees: Any) -> dict[int, int]:
    """Measured bytes of the arrays' shards on each device: ``{device id: sum of shard.data.nbytes}``.

    A replicated array counts its full size on every device; a sharded one only the
    device's shard. This reads what is actually allocated, not a formula.
    """
    out: dict[int, int] = {}
    for leaf in jax.tree.leaves(trees):
        for shard in leaf.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + int(shard.data.nbytes)
    return out


def collective_counts(hlo_text: str) -> dict[str, int]:
    """How many all-gather, reduce-scatter and all-reduce ops an HLO module's text holds.

    Reads the instructions with :func:`course_lib.scaling.profiling.hlo_collectives` (an async
    pair counts once). Works on compiled (``compiled.as_text()``) and lowered
    (``lowered.as_text(dialect="hlo")``) text.
    """
    ops = [c.opcode for c in hlo_collectives(hlo_text)]
    return {op: ops.count(op) for op in COLLECTIVES}


#: ``%name = SHAPE op(`` with SHAPE an array (``f32[16,64]{1,0}``) or a tuple of arrays.
_COLLECTIVE_LINE_RE = re.compile(r"=\s+(\(.*?\)|\S+)\s+(all-gather|reduce-scatter|all-reduce)\(")
_ARRAY_RE = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f16": 2, "bf16": 2, "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}  # fmt: skip


def _array_bytes(shape_text: str) -> list[int]:
    return [
        _DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
        for dtype, dims in _ARRAY_RE.findall(shape_text)
        if dtype in _DTYPE_BYTES
    ]


def hlo_ring_bytes_sent_per_device(hlo_text: str, n_devices: int) -> float:
    """Bytes each device sends per run of a compiled program: the ring formulas applied to its collectives.

    Read from each collective's *result* shape (every group holds all ``n_devices``): an
    all-reduce of ``M`` bytes (a tuple's arrays summed: XLA combines small all-reduces into
    one) sends ``2 (N-1)/N * M``; an all-gather whose result is ``M`` bytes ``(N-1)/N * M``;
    a reduce-scatter whose result is ``M/N`` bytes ``(N-1)/N * M``. This is the program XLA
    will run, after its CSE and combiners, not the one JAX traced. Written for the
    synchronous forms XLA:CPU emits (async ``-start`` forms are not read).
    """
    total = 0.0
    for shape, op in _COLLECTIVE_LINE_RE.findall(hlo_text):
        sizes = _array_bytes(shape)
        if op == "all-reduce":
            total += ring_allreduce_bytes_sent_per_device(n_devices, sum(sizes))
        elif op == "all-gather":
            total += ring_all_gather_bytes_sent_per_device(n_devices, sum(sizes))
        else:
            total += ring_reduce_scatter_bytes_sent_per_device(n_devices, n_devices * sum(sizes))
    return total


def ring_bytes_sent_per_device(
    layout: Layout, n_devices: int, param_bytes: float, regather_in_backward: bool = False
) -> float:
    """Bytes each device sends per step for the parameters' collectives, by the ring formulas.

    ``"dp"``: an all-reduce of the ``M = param_bytes`` gradient: ``2 (N-1)/N * M``.
    ``"fsdp"``: an all-gather of the weights in the forward, ``(N-1)/N * M``, a reduce-scatter
    of the gradient, ``(N-1)/N * M``, and with ``regather_in_backward`` a second all-gather
    in the backward: ``3 (N-1)/N * M``, ZeRO-3's 1.5x (Rajbhandari et al. 2020, Sec. 7.2.2).
    The loss's scalar all-reduce (4 bytes) is left out.
    """
    if layout == "dp":
        return ring_allreduce_bytes_sent_per_device(n_devices, param_bytes)
    if layout != "fsdp":
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    gathers = 2 if regather_in_backward else 1
    return gathers * ring_all_gather_bytes_sent_per_device(
        n_devices, param_bytes
    ) + ring_reduce_scatter_bytes_sent_per_device(n_devices, param_bytes)


@dataclass(frozen=True)
class LayoutReport:
    """What one layout holds and does per step, per device.

    ``resident_bytes``: measured bytes of params + Adam state on each device (all devices
    hold the same; :func:`resident_bytes_per_device`). ``memory``: XLA's buffer assignment of
    the compiled step (per device). ``collectives_traced``: collective ops in the program
    JAX traced (lowered HLO); ``collectives``: in the program XLA compiled (after its CSE
    and combiners). ``bytes_sent_per_device``: the ring formula for the parameters
    (:func:`ring_bytes_sent_per_device`); ``hlo_bytes_sent_per_device``: the ring formulas
    applied to the compiled program's collectives (:func:`hlo_ring_bytes_sent_per_device`,
    the loss's 4-byte all-reduce included).
    """

    layout: str
    resident_bytes: int
    resident_param_bytes: int
    resident_state_bytes: int
    memory: MemoryStats
    collectives_traced: dict[str, int]
    collectives: dict[str, int]
    bytes_sent_per_device: float
    hlo_bytes_sent_per_device: float
    loss_first: float
    loss_last: float


@dataclass(frozen=True)
class FsdpVsDp:
    """:func:`fsdp_vs_dp`'s result: both layouts after ``steps`` identical Adam steps."""

    n_devices: int
    steps: int
    widths: tuple[int, ...]
    batch: int
    regather_in_backward: bool
    n_params: int
    param_bytes: int  # one full copy of the parameters (fp32)
    max_abs_param_diff: float  # max |params_fsdp - params_dp| after the steps
    max_param_moved: float  # max |params_dp - params_initial|: the training did something
    dp: LayoutReport
    fsdp: LayoutReport

    @property
    def resident_ratio(self) -> float:
        """DP's resident bytes per device over FSDP's (about ``N``)."""
        return self.dp.resident_bytes / self.fsdp.resident_bytes

    @property
    def traffic_ratio(self) -> float:
        """FSDP's bytes sent per device per step over DP's (1.0, or 1.5 with ``regather_in_backward``)."""
        return self.fsdp.bytes_sent_per_device / self.dp.bytes_sent_per_device


def _uniform(per_device: dict[int, int], what: str) -> int:
    values = set(per_device.values())
    if len(values) != 1:
        raise RuntimeError(f"{what} differs between devices: {per_device}")
    return values.pop()


def fsdp_vs_dp(
    n_devices: int,
    steps: int = 5,
    widths: Sequence[int] = (16, 64, 64, 8),
    batch: int = 32,
    learning_rate: float = 1e-2,
    regather_in_backward: bool = False,
    seed: int = 0,
    devices: Sequence[Any] | None = None,
    watchdog_s: float = 120.0,
) -> FsdpVsDp:
    """Train the same MLP with Adam for ``steps`` steps, replicated (DP) and sharded (FSDP); compare.

    Both start from the same parameters (:func:`init_mlp`, on one device) and see the same
    fixed batch (:func:`regression_batch`), split over a 1-D ``"data"`` mesh of the first
    ``n_devices`` of ``devices`` (default ``jax.devices()``). Each layout's step is compiled
    once (refused if it holds a LAPACK call: :func:`course_lib.scaling.devices.check_multidevice_safe`),
    its HLO collectives counted and its ``memory_analysis`` read, then run ``steps`` times,
    each step blocked, under one watchdog. Raises ``ValueError`` when a width or the batch is
    not divisible by ``n_devices``.
    """
    widths = tuple(int(w) for w in widths)
    check_widths(widths, n_devices, batch)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    mesh = data_mesh(n_devices, DATA, devices=devices)
    optimizer = optax.adam(learning_rate)
    params0 = init_mlp(jax.random.key(seed), widths)
    state0 = optimizer.init(params0)
    x_np, y_np = regression_batch(batch, widths[0], widths[-1], seed)
    batch_sharding = NamedSharding(mesh, P(DATA))
    x, y = jax.device_put(x_np, batch_sharding), jax.device_put(y_np, batch_sharding)
    param_bytes = sum(int(leaf.nbytes) for leaf in jax.tree.leaves(params0))

    finals: dict[str, Params] = {}
    reports: dict[str, LayoutReport] = {}
    with watchdog(watchdog_s, f"FSDP vs data parallelism on {n_devices} CPU devices, {steps} Adam steps"):
        for layout in LAYOUTS:
            pspec, sspec = specs(layout, params0), specs(layout, state0)  # type: ignore[arg-type]
            params, state = place(params0, pspec, mesh), place(state0, sspec, mesh)
            resident_params = _uniform(resident_bytes_per_device(params), "parameter bytes")
            resident_state = _uniform(resident_bytes_per_device(state), "optimizer-state bytes")
            program = train_step_program(layout, mesh, optimizer, pspec, sspec, regather_in_backward)  # type: ignore[arg-type]
            traced = collective_counts(program.lower(params, state, x, y).as_text(dialect="hlo"))
            compiled = check_multidevice_safe(program, params, state, x, y)
            hlo = compiled.as_text()
            losses = []
            for _ in range(steps):
                params, state, loss = jax.block_until_ready(compiled(params, state, x, y))
                losses.append(float(loss))
            finals[layout] = params
            reports[layout] = LayoutReport(
                layout=layout,
                resident_bytes=resident_params + resident_state,
                resident_param_bytes=resident_params,
                resident_state_bytes=resident_state,
                memory=compiled_memory(compiled),
                collectives_traced=traced,
                collectives=collective_counts(hlo),
                bytes_sent_per_device=ring_bytes_sent_per_device(layout, n_devices, param_bytes, regather_in_backward),  # type: ignore[arg-type]
                hlo_bytes_sent_per_device=hlo_ring_bytes_sent_per_device(hlo, n_devices),
                loss_first=losses[0],
                loss_last=losses[-1],
            )

    def max_abs(a: Any, b: Any) -> float:
        return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))  # fmt: skip

    return FsdpVsDp(
        n_devices=n_devices,
        steps=steps,
        widths=widths,
        batch=batch,
        regather_in_backward=regather_in_backward,
        n_params=sum(int(leaf.size) for leaf in jax.tree.leaves(params0)),
        param_bytes=param_bytes,
        max_abs_param_diff=max_abs(finals["fsdp"], finals["dp"]),
        max_param_moved=max_abs(finals["dp"], params0),
        dp=reports["dp"],
        fsdp=reports["fsdp"],
    )


def _collectives_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{op} x{k}" for op, k in counts.items() if k) or "none"


def format_fsdp_vs_dp(result: FsdpVsDp, tolerance: float = 1e-6) -> str:
    """A table of :func:`fsdp_vs_dp`'s result for the lesson: bytes and counts only (stable across machines).

    The parameter difference is printed as a comparison with ``tolerance`` and the losses to
    3 significant digits, so the text does not change with the CPU that ran it.
    """
    r, n = result, result.n_devices
    rows = [
        ("params + Adam state on each device (measured, B)", f"{r.dp.resident_bytes:,}", f"{r.fsdp.resident_bytes:,}"),
        ("  of which parameters (B)", f"{r.dp.resident_param_bytes:,}", f"{r.fsdp.resident_param_bytes:,}"),
        ("  of which Adam mu, nu, count (B)", f"{r.dp.resident_state_bytes:,}", f"{r.fsdp.resident_state_bytes:,}"),
        ("XLA arguments per device (B)", f"{r.dp.memory.argument_bytes:,}", f"{r.fsdp.memory.argument_bytes:,}"),
        ("XLA temp per device (B)", f"{r.dp.memory.temp_bytes:,}", f"{r.fsdp.memory.temp_bytes:,}"),
        (
            "collectives traced by JAX (lowered HLO)",
            _collectives_text(r.dp.collectives_traced),
            _collectives_text(r.fsdp.collectives_traced),
        ),
        (
            "collectives XLA runs per step (compiled HLO)",
            _collectives_text(r.dp.collectives),
            _collectives_text(r.fsdp.collectives),
        ),
        (
            "bytes sent per device per step, ring formula",
            f"{r.dp.bytes_sent_per_device:,.0f}",
            f"{r.fsdp.bytes_sent_per_device:,.0f}",
        ),
        (
            "  same, from the compiled collectives",
            f"{r.dp.hlo_bytes_sent_per_device:,.0f}",
            f"{r.fsdp.hlo_bytes_sent_per_device:,.0f}",
        ),
    ]
    w0 = max(len(a) for a, _, _ in rows)
    w1 = max(len(b) for _, b, _ in rows + [("", "data parallel", "")])
    head = (
        f"MLP {'-'.join(map(str, r.widths))} ({r.n_params:,} fp32 parameters = {r.param_bytes:,} B), Adam, "
        f"batch {r.batch}, {n} devices, {r.steps} steps"
        + (", weights re-gathered in the backward" if r.regather_in_backward else "")
    )
    lines = [head, f"{'':<{w0}}  {'data parallel':>{w1}}  FSDP (ZeRO-3)"]
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c}" for a, b, c in rows]
    same = "<=" if r.max_abs_param_diff <= tolerance else ">"
    lines.append(
        f"resident bytes DP / FSDP = {r.resident_ratio:.2f} (N = {n}; Adam's 4-byte step count stays replicated); "
        f"traffic FSDP / DP (ZeRO's ring formula) = {r.traffic_ratio:.2f}"
    )
    lines.append(
        f"max |params_fsdp - params_dp| {same} {tolerance:g} after {r.steps} steps (params moved up to "
        f"{r.max_param_moved:.2g}); loss {r.dp.loss_first:.3g} -> {r.dp.loss_last:.3g}"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# ZeRO's analytic memory per device
# ---------------------------------------------------------------------------

#: Bytes per parameter of (weights, gradients, optimizer state) in the two accountings.
#: ``"fp32"``: fp32 weights and gradients, Adam's ``mu`` and ``nu`` in fp32: 4 + 4 + 8.
#: ``"mixed"``: ZeRO's mixed-precision Adam: fp16 weights and gradients, and an fp32 master
#: copy, momentum and variance (K = 12): 2 + 2 + 12 (Rajbhandari et al. 2020, Sec. 3.1).
ZERO_BYTES_PER_PARAM: dict[str, tuple[int, int, int]] = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}


def zero_memory_per_device(n_params: float, n_devices: int, stage: int, accounting: str = "fp32") -> float:
    """Bytes of model states per device under ZeRO ``stage`` (0: plain DP, 1: P_os, 2: P_os+g, 3: P_os+g+p).

    With ``Psi`` parameters, ``N`` devices and ``(p, g, k)`` bytes per parameter of weights,
    gradients and optimizer state (:data:`ZERO_BYTES_PER_PARAM`)::

        stage 0: (p + g + k) Psi            stage 2: p Psi + (g + k) Psi / N
        stage 1: (p + g) Psi + k Psi / N    stage 3: (p + g + k) Psi / N

    Activations, buffers and fragmentation are not counted. ZeRO's Figure 1 (7.5B
    parameters, 64 devices, ``"mixed"``): 120 GB -> 31.4 / 16.6 / 1.9 GB.
    """
    if accounting not in ZERO_BYTES_PER_PARAM:
        raise ValueError(f"accounting must be one of {sorted(ZERO_BYTES_PER_PARAM)}, got {accounting!r}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DP), 1 (optimizer state), 2 (+gradients) or 3 (+parameters), got {stage}")
    if n_devices < 1 or n_params < 0:
        raise ValueError(f"n_devices must be >= 1 and n_params >= 0, got {n_devices} and {n_params}")
    p, g, k = ZERO_BYTES_PER_PARAM[accounting]
    sharded = {0: 0, 1: k, 2: g + k, 3: p + g + k}[stage]
    return ((p + g + k) - sharded) * n_params + sharded * n_params / n_devices


def format_zero_table(n_params: float = 7.5e9, n_devices: int = 64, accounting: str = "mixed") -> str:
    """ZeRO's stages side by side, in GB (1e9 bytes) per device (defaults: the paper's Figure 1)."""
    names = ("baseline (DP)", "P_os (stage 1)", "P_os+g (stage 2)", "P_os+g+p (stage 3)")
    p, g, k = ZERO_BYTES_PER_PARAM[accounting]
    lines = [
        f"{n_params / 1e9:g}B parameters, {n_devices} devices, {accounting} Adam ({p}+{g}+{k} bytes per parameter)"
    ]
    for stage, name in enumerate(names):
        lines.append(f"  {name:<20} {zero_memory_per_device(n_params, n_devices, stage, accounting) / 1e9:7.1f} GB")
    return "\n".join(lines)
