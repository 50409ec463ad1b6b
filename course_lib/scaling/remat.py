r"""Rematerialisation (``jax.checkpoint``): trade compute for activation memory (lesson 05).

**What the backward pass keeps.** Reverse-mode differentiation of a deep network needs,
for every layer, some values of the forward pass ("residuals"). For the tanh layer used
here, ``h_l = tanh(h_{l-1} W_l + b_l)``, the gradient is::

    delta_l      = (dL/dh_l) * (1 - h_l) * (1 + h_l)        tanh'(z) = 1 - tanh(z)^2
    dL/dW_l      = h_{l-1}^T delta_l,      dL/db_l = sum_batch delta_l
    dL/dh_{l-1}  = delta_l W_l^T

so JAX saves the layer input ``h_{l-1}``, the output ``h_l`` and ``1 - h_l``: three
``[B, W]`` arrays per layer (``jax.ad_checkpoint.print_saved_residuals`` lists them). For
``L`` layers that is ``3 L B W`` floats of activations, growing with depth *and* batch,
while the parameters are ``L W^2``: at large batch the activations, not the weights, fill
the accelerator.

**Rematerialisation** (Chen et al. 2016, *Training Deep Nets with Sublinear Memory Cost*,
arXiv 1604.06174; Griewank's checkpointing): wrap each layer in ``jax.checkpoint`` and
the forward pass keeps only the layer *input*; the backward pass recomputes the layer
from it just before it needs the residuals. Memory of the residuals and extra compute::

    residual bytes   none: 3 L B W s      per_layer: L B W s      dots_saveable: 2 L B W s
    extra FLOPs      per_layer: one more forward (~ +1/3 of a fwd+bwd step, which is ~3 fwd)

with ``s`` bytes per float (4 for f32). ``jax.checkpoint(layer,
policy=jax.checkpoint_policies.dots_saveable)`` sits in between: it saves the matmul
outputs ``z_l`` (the expensive part) and recomputes only the cheap elementwise ``tanh``.
Checkpointing every ``k``-th layer instead (segments of ``k``, the ``sqrt(L)`` scheme of
Chen et al.) saves ``L/k`` inputs plus one segment's residuals while it is recomputed
(lesson 05's exercise 5 builds it).

**How the layers are stacked.** The model scans one layer function over stacked
parameters (``W [L, W, W]``, ``b [L, W]``, ``lax.scan``), as large models do (Flax
``nn.scan``, MaxText): compile time does not grow with depth and the residuals are the
scan's stacked outputs, so the memory above is exactly what the compiled program holds.
(Measured on jaxlib 0.10.2 CPU: an *unrolled* Python loop of the same layers lets XLA
store the activations in the not-yet-written gradient output buffers, which hides them
from ``temp`` bytes, and per-layer remat there made ``temp`` larger, not smaller; the
scan form is the honest and the usual one.)

**Reading memory from the compiled program.** ``jitted.lower(*args).compile()
.memory_analysis()`` returns XLA's buffer assignment, before anything runs. On jaxlib
0.10.2's CPU backend it fills (measured 2026-11):

- ``argument_size_in_bytes``: the inputs (parameters and batch);
- ``output_size_in_bytes``: the outputs (here the gradients, same size as the parameters);
- ``temp_size_in_bytes``: the one scratch allocation for every intermediate, sized by
  XLA's liveness analysis: *this* is what rematerialisation shrinks;
- ``alias_size_in_bytes``: outputs that reuse (donated) input buffers, 0 here;
- ``peak_memory_in_bytes``: on CPU ``argument + output`` (give or take a few bytes) with
  ``temp`` left out: it does not move with remat, and a program that sorts a
  ``1000 x 1000`` float32 intermediate (4 MB of temp) reports 8 kB. Do not read it as the
  peak on CPU;
- ``generated_code_size_in_bytes`` and the ``host_*`` fields: 0 on CPU.

:func:`peak_memory` therefore reports ``total_bytes = argument + output + temp - alias``,
an upper bound on the device memory the program needs (on GPUs and TPUs the same fields
are filled by the same buffer assignment, and ``peak_memory_in_bytes`` is meaningful).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

#: The variants :func:`mlp_loss` and :func:`compare_remat` know: no remat, ``jax.checkpoint``
#: around each layer (save only its input), and the policy that saves the matmul outputs.
RematVariant = Literal["none", "per_layer", "dots_saveable"]
REMAT_VARIANTS: tuple[RematVariant, ...] = ("none", "per_layer", "dots_saveable")

#: Parameters of the deep MLP: ``{"W": [L, W, W], "b": [L, W]}``.
MLPParams = dict[str, jax.Array]


def init_mlp(key: jax.Array, depth: int, width: int, dtype: Any = jnp.float32) -> MLPParams:
    """``depth`` square tanh layers of ``width``: ``W ~ N(0, 1/width)``, ``b = 0``.

    The scaled normal init keeps ``Var(h W)`` about ``Var(h)`` so activations neither
    vanish nor saturate over depth. (Plain normal sampling, no QR: an orthogonal init
    calls LAPACK, which lesson 05 keeps out of anything that could run on several CPU
    devices, see :mod:`course_lib.scaling.devices`.)
    """
    if depth < 1 or width < 1:
        raise ValueError(f"depth and width must be >= 1, got depth={depth}, width={width}")
    w = jax.random.normal(key, (depth, width, width), dtype) / np.sqrt(width)
    return {"W": w, "b": jnp.zeros((depth, width), dtype)}


def _layer(h: jax.Array, p: Mapping[str, jax.Array]) -> tuple[jax.Array, None]:
    """One tanh layer as a scan body: ``h_l = tanh(h_{l-1} W_l + b_l)``."""
    return jnp.tanh(h @ p["W"] + p["b"]), None


def remat_layer(remat: RematVariant) -> Callable[[jax.Array, Mapping[str, jax.Array]], tuple[jax.Array, None]]:
    """The scanned layer, as each variant wraps it: bare, in ``jax.checkpoint``, or with a policy."""
    if remat == "none":
        return _layer
    if remat == "per_layer":
        return jax.checkpoint(_layer)
    if remat == "dots_saveable":
        return jax.checkpoint(_layer, policy=jax.checkpoint_policies.dots_saveable)
    raise ValueError(f"unknown remat variant {remat!r}; use one of {REMAT_VARIANTS}")


def mlp_forward(params: MLPParams, x: jax.Array, remat: RematVariant = "none") -> jax.Array:
    """``h_L`` of the deep tanh MLP: ``lax.scan`` of one layer over the stacked parameters.

    ``remat`` wraps the scanned layer in ``jax.checkpoint`` (``"per_layer"``) or in
    ``jax.checkpoint`` with the ``dots_saveable`` policy. The value is the same for all
    variants; only what the backward pass keeps (and recomputes) changes.
    """
    h, _ = lax.scan(remat_layer(remat), x, params)
    return h


def mlp_loss(params: MLPParams, x: jax.Array, y: jax.Array, remat: RematVariant = "none") -> jax.Array:
    """Mean squared error ``L = 1/(2B) sum_b ||h_L(x_b) - y_b||^2``, reduced in float32.

    The output is cast to float32 before the error is formed, so a bfloat16 forward pass
    (:mod:`course_lib.scaling.precision`) still sums the loss in float32.
    """
    h = mlp_forward(params, x, remat).astype(jnp.float32)
    return 0.5 * jnp.mean(jnp.sum((h - y.astype(jnp.float32)) ** 2, axis=-1))


def mlp_problem(seed: int, depth: int, width: int, batch: int) -> tuple[MLPParams, jax.Array, jax.Array]:
    """Parameters, inputs ``x ~ N(0, 1) [batch, width]`` and targets ``y ~ N(0, 0.25)``, from one seed."""
    k_params, k_x, k_y = jax.random.split(jax.random.key(seed), 3)
    params = init_mlp(k_params, depth, width)
    x = jax.random.normal(k_x, (batch, width))
    y = 0.5 * jax.random.normal(k_y, (batch, width))
    return params, x, y


def remat_grad(remat: RematVariant) -> jax.stages.Wrapped:
    """``jit(grad(mlp_loss))`` with the given remat variant: ``(params, x, y) -> dL/dparams``."""
    remat_layer(remat)  # validate the name now, not at the first call
    return jax.jit(jax.grad(lambda p, x, y: mlp_loss(p, x, y, remat)))


@dataclass(frozen=True)
class RematCost:
    """What XLA planned for one variant's gradient at one depth: scratch bytes and FLOPs (compiled, not run)."""

    depth: int
    variant: RematVariant
    temp_bytes: int
    flops: float  # XLA's cost analysis counts a scan's body once: this is per layer (plus the loss), not per depth


def remat_costs(
    depths: Sequence[int], width: int = 512, batch: int = 256, variants: Sequence[RematVariant] = REMAT_VARIANTS
) -> list[RematCost]:
    """Temp bytes (``memory_analysis``) and FLOPs (``cost_analysis``) of each variant's gradient, per depth.

    Nothing runs: each program is compiled and XLA's own accounting is read, so the
    figures are the same on every machine of one backend (give or take XLA's buffer
    packing). Per-layer remat should keep about a third of the residuals and add one
    forward pass, about a third more FLOPs (module docstring).
    """
    if not depths or min(depths) < 1:
        raise ValueError(f"depths must be >= 1 layers, got {list(depths)}")
    out = []
    for depth in depths:
        params, x, y = mlp_problem(0, depth, width, batch)
        for v in variants:
            compiled = remat_grad(v).lower(params, x, y).compile()
            raw = compiled.cost_analysis()
            cost: dict[str, float] = (raw[0] if isinstance(raw, list) else raw) or {}
            out.append(
                RematCost(depth, v, compiled_memory(compiled).temp_bytes, float(cost.get("flops", float("nan"))))
            )
    return out


# ---------------------------------------------------------------------------------------
# Memory of a compiled program, and interleaved timing
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryStats:
    """Buffer sizes of one compiled program (bytes), from ``Compiled.memory_analysis()``.

    Attributes:
        argument_bytes: the inputs.
        output_bytes: the outputs.
        temp_bytes: the scratch buffer for all intermediates (what remat and gradient
            accumulation shrink).
        alias_bytes: outputs written into donated inputs (counted once in the total).
        total_bytes: ``argument + output + temp - alias``, the program's memory need.
        xla_peak_bytes: XLA's own ``peak_memory_in_bytes``; on the CPU backend of jaxlib
            0.10.2 it is about ``argument + output`` and leaves ``temp`` out.
    """

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    total_bytes: int
    xla_peak_bytes: int


def peak_memory(jitted: Any, *args: Any, **kwargs: Any) -> MemoryStats:
    """Compile ``jitted`` for ``args`` (nothing runs) and read its buffer assignment.

    ``jitted`` is a ``jax.jit``-wrapped function; the numbers are those XLA planned for
    these argument shapes and dtypes. ``total_bytes = argument + output + temp - alias``.
    """
    if not hasattr(jitted, "lower"):
        raise TypeError(f"peak_memory needs a jax.jit-wrapped function (with .lower), got {type(jitted).__name__}")
    return compiled_memory(jitted.lower(*args, **kwargs).compile())


def compiled_memory(compiled: Any) -> MemoryStats:
    """:class:`MemoryStats` of an already compiled program (``jitted.lower(*args).compile()``)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise RuntimeError("this backend returned no memory analysis for the compiled program")
    arg, out = int(stats.argument_size_in_bytes), int(stats.output_size_in_bytes)
    temp, alias = int(stats.temp_size_in_bytes), int(stats.alias_size_in_bytes)
    return MemoryStats(
        argument_bytes=arg,
        output_bytes=out,
        temp_bytes=temp,
        alias_bytes=alias,
        total_bytes=arg + out + temp - alias,
        xla_peak_bytes=int(getattr(stats, "peak_memory_in_bytes", arg + out)),
    )


def interleaved_times(fns: Mapping[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Wall-clock seconds of each zero-argument function, run ``repeats`` rounds interleaved.

    Each function is called once untimed first (compilation, warm caches), then the rounds
    run A B C, A B C, ... so that every variant sees the same machine load; every call is
    ``jax.block_until_ready``-ed (JAX dispatch is asynchronous). Report the median.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for fn in fns.values():
        jax.block_until_ready(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return times


def tree_max_abs_diff(a: Any, b: Any) -> float:
    """``max |a - b|`` over all leaves of two pytrees of the same structure."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(leaves_a) != len(leaves_b):
        raise ValueError(f"trees differ: {len(leaves_a)} vs {len(leaves_b)} leaves")
    return max(
        float(jnp.max(jnp.abs(jnp.asarray(x, jnp.float32) - jnp.asarray(y, jnp.float32))))
        for x, y in zip(leaves_a, leaves_b)
    )


def tree_allclose(a: Any, b: Any, rtol: float, atol: float) -> bool:
    """``allclose`` on every pair of leaves of two pytrees of the same structure."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(
        bool(np.allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)) for x, y in zip(leaves_a, leaves_b)
    )


# ---------------------------------------------------------------------------------------
# The comparison
# ---------------------------------------------------------------------------------------

#: Tolerance of "same gradient": remat recomputes the same float32 operations, so the
#: gradients agree to rounding (measured 2026-11 on CPU: bitwise equal, max |diff| 0).
GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-6


@dataclass(frozen=True)
class RematResult:
    """One remat variant of :func:`compare_remat`.

    Attributes:
        variant: ``"none"``, ``"per_layer"`` or ``"dots_saveable"``.
        memory: the compiled gradient program's :class:`MemoryStats`.
        temp_bytes: ``memory.temp_bytes`` (activations and other intermediates).
        total_bytes: ``memory.total_bytes``.
        expected_residual_bytes: ``k L B W 4`` with ``k = 3, 1, 2`` saved ``[B, W]``
            arrays per layer (module docstring), the activations the variant keeps.
        step_times_s: wall-clock seconds of one gradient, each interleaved round.
        median_step_s: their median.
        grad_equal: gradient ``allclose`` to the ``"none"`` one (``GRAD_RTOL``, ``GRAD_ATOL``).
        max_abs_grad_diff: ``max |g - g_none|``.
    """

    variant: RematVariant
    memory: MemoryStats
    temp_bytes: int
    total_bytes: int
    expected_residual_bytes: int
    step_times_s: tuple[float, ...]
    median_step_s: float
    grad_equal: bool
    max_abs_grad_diff: float


_RESIDUALS_PER_LAYER: dict[str, int] = {"none": 3, "per_layer": 1, "dots_saveable": 2}


def compare_remat(
    depth: int = 16,
    width: int = 512,
    batch: int = 256,
    repeats: int = 5,
    seed: int = 0,
    variants: Sequence[RematVariant] = REMAT_VARIANTS,
) -> list[RematResult]:
    """Memory, time and gradient of each remat variant of the deep MLP's gradient.

    For every variant: compile ``jit(grad(mlp_loss))`` and read :func:`peak_memory`, then
    time one gradient in ``repeats`` interleaved rounds (:func:`interleaved_times`), and
    compare the gradient with the ``"none"`` variant's. The defaults take about 7 s on
    the 2-core machine at load average 4 (2026-11). Results come in the order of
    ``variants``.

    Measured (defaults: depth 16, width 512, batch 256, f32; jaxlib 0.10.2 CPU): temp
    26.5 / 10.5 / 18.5 MiB for none / per_layer / dots_saveable (residuals 24 / 8 / 16
    MiB), total 59.6 / 43.6 / 51.6 MiB (parameters and gradients are 33 MiB of it), the
    gradients bitwise equal; per_layer cost ~5-20% more time per step (noisy, load 4).
    """
    if not variants:
        raise ValueError("variants is empty; pass some of " + repr(REMAT_VARIANTS))
    params, x, y = mlp_problem(seed, depth, width, batch)
    # compile each variant once: the same executable gives the memory and the timings
    compiled = {v: remat_grad(v).lower(params, x, y).compile() for v in dict.fromkeys(variants)}
    memory = {v: compiled_memory(c) for v, c in compiled.items()}
    none = compiled["none"] if "none" in compiled else remat_grad("none").lower(params, x, y).compile()
    reference = jax.block_until_ready(none(params, x, y))
    times = interleaved_times({v: functools.partial(c, params, x, y) for v, c in compiled.items()}, repeats)
    results = []
    for v, c in compiled.items():
        grad = c(params, x, y)
        results.append(
            RematResult(
                variant=v,
                memory=memory[v],
                temp_bytes=memory[v].temp_bytes,
                total_bytes=memory[v].total_bytes,
                expected_residual_bytes=_RESIDUALS_PER_LAYER[v] * depth * batch * width * 4,
                step_times_s=tuple(times[v]),
                median_step_s=statistics.median(times[v]),
                grad_equal=tree_allclose(grad, reference, GRAD_RTOL, GRAD_ATOL),
                max_abs_grad_diff=tree_max_abs_diff(grad, reference),
            )
        )
    return results
