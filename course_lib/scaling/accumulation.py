r"""Gradient accumulation: the gradient of a large batch, computed in micro-batches (lesson 05).

**Why.** The memory of a gradient step grows with the batch: every sample's activations
are kept for the backward pass (:mod:`course_lib.scaling.remat`). When the batch you want does
not fit, split it into ``n`` micro-batches, take their gradients one after another and
average them: the same gradient, with the activation memory of one micro-batch.

**The equation.** For a loss that is a mean over the batch, ``L_B = (1/B) sum_i l_i``,
split into ``n`` micro-batches ``M_1..M_n`` of equal size ``m = B/n``::

    L_B = (1/B) sum_i l_i = (1/n) sum_k (1/m) sum_{i in M_k} l_i = (1/n) sum_k L_{M_k}
    grad L_B = (1/n) sum_k grad L_{M_k}            (the gradient is linear)

so the mean of the micro-batch *mean* gradients is the full-batch gradient. Two classic
bugs: summing the ``n`` micro-gradients without dividing (an ``n`` times larger step),
and averaging micro-batches of *unequal* size with equal weights (the right weights are
``m_k / B``). :func:`accumulated_grad` refuses a batch that ``n`` does not divide instead
of padding it.

**How.** ``lax.scan`` over the micro-batches (a ``[n, B/n, ...]`` view of the batch),
carrying the running sum of gradients: one compiled loop, so XLA keeps one micro-batch's
activations alive at a time. The price is ``n`` smaller, less efficient steps in sequence
(and the full batch itself still sits in memory as an input here; a data loader would
stream it). The sum of ``n`` float32 gradients is reordered compared with the full-batch
reduction, so the two agree to rounding, not bitwise (:data:`ACCUM_RTOL`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from course_lib.scaling.remat import MemoryStats, mlp_loss, mlp_problem, peak_memory

#: Tolerance of "equal to the full-batch gradient" in float32: the micro-batch sums are
#: reordered, so the last bits differ (measured 2026-11: max |diff| 1.3e-7 on gradients
#: of size ~0.1, n_micro 2..96).
ACCUM_RTOL, ACCUM_ATOL = 1e-4, 1e-6


def _check_divides(size: int, n_micro: int) -> None:
    if not isinstance(n_micro, int) or n_micro < 1:
        raise ValueError(f"n_micro must be a positive int, got {n_micro!r}")
    if size % n_micro:
        raise ValueError(
            f"batch size {size} is not divisible by n_micro={n_micro}: micro-batches of unequal size would "
            f"need weights m_k/B, not a plain mean. Pick n_micro among the divisors of {size}, or drop "
            f"{size % n_micro} samples."
        )


def split_micro_batches(batch: Any, n_micro: int) -> Any:
    """Reshape every leaf ``[B, ...]`` of ``batch`` to ``[n_micro, B / n_micro, ...]``.

    Micro-batch ``k`` holds samples ``k m .. (k + 1) m - 1`` (``m = B / n_micro``).
    Raises ``ValueError`` if ``n_micro`` is not positive, the leaves disagree on ``B``,
    or ``n_micro`` does not divide ``B``.
    """
    leaves = jax.tree.leaves(batch)
    if not leaves:
        raise ValueError("batch has no arrays")
    sizes = {jnp.shape(leaf)[0] if jnp.ndim(leaf) else None for leaf in leaves}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            f"every leaf of batch needs the same leading (batch) axis, got sizes {sorted(map(str, sizes))}"
        )
    (size,) = sizes
    assert size is not None
    _check_divides(int(size), n_micro)
    return jax.tree.map(lambda a: a.reshape(n_micro, size // n_micro, *a.shape[1:]), batch)


def accumulated_value_and_grad(
    loss_fn: Callable[[Any, Any], jax.Array], params: Any, batch: Any, n_micro: int
) -> tuple[jax.Array, Any]:
    """``(L_B, grad L_B)`` computed as the mean over ``n_micro`` equal micro-batches.

    ``loss_fn(params, micro_batch)`` must return the *mean* loss over its micro-batch.
    ``lax.scan`` runs the micro-batches in sequence, carrying the sums (gradients
    accumulated in float32 whatever the parameters' dtype, then cast back); both sums are
    divided by ``n_micro`` at the end::

        L_B = (1/n) sum_k L_{M_k},      grad L_B = (1/n) sum_k grad L_{M_k}

    Works inside or outside ``jit``; ``n_micro`` must be a Python int (it sets shapes).
    """
    micro = split_micro_batches(batch, n_micro)
    value_and_grad = jax.value_and_grad(loss_fn)

    def body(carry: tuple[jax.Array, Any], mb: Any) -> tuple[tuple[jax.Array, Any], None]:
        loss_sum, grad_sum = carry
        loss, grads = value_and_grad(params, mb)
        grad_sum = jax.tree.map(lambda s, g: s + g.astype(jnp.float32), grad_sum, grads)
        return (loss_sum + loss.astype(jnp.float32), grad_sum), None

    zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
    (loss_sum, grad_sum), _ = lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
    grads = jax.tree.map(lambda s, p: (s / n_micro).astype(jnp.result_type(p)), grad_sum, params)
    return loss_sum / n_micro, grads


def accumulated_grad(loss_fn: Callable[[Any, Any], jax.Array], params: Any, batch: Any, n_micro: int) -> Any:
    """``grad L_B = (1/n) sum_k grad L_{M_k}`` over ``n_micro`` equal micro-batches (see
    :func:`accumulated_value_and_grad`); equal to ``jax.grad(loss_fn)(params, batch)``
    within :data:`ACCUM_RTOL` / :data:`ACCUM_ATOL`."""
    return accumulated_value_and_grad(loss_fn, params, batch, n_micro)[1]


# ---------------------------------------------------------------------------------------
# Memory: the point of accumulating
# ---------------------------------------------------------------------------------------


def _mlp_batch_loss(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return mlp_loss(params, x, y)


@dataclass(frozen=True)
class AccumulationMemory:
    """Compiled memory of one way of computing the deep MLP's full-batch gradient.

    Attributes:
        n_micro: micro-batches (``0`` marks plain ``jax.grad`` on the whole batch).
        micro_batch: samples per micro-batch (the whole batch for ``n_micro`` 0 or 1).
        memory: the compiled program's :class:`course_lib.scaling.remat.MemoryStats`.
    """

    n_micro: int
    micro_batch: int
    memory: MemoryStats


def accumulation_memory(
    n_micros: Sequence[int] = (1, 2, 4, 8, 16),
    depth: int = 8,
    width: int = 256,
    batch: int = 2048,
    seed: int = 0,
) -> list[AccumulationMemory]:
    """Memory of the deep MLP gradient (:func:`course_lib.scaling.remat.mlp_loss`) for the whole
    batch at once (first entry, ``n_micro=0``), then accumulated over each ``n_micros``.

    Only compiles (nothing runs): :func:`course_lib.scaling.remat.peak_memory` of
    ``jit(grad)`` and of ``jit(accumulated_grad)``. The activations kept for the backward
    pass are ``3 L m W`` floats for a micro-batch of ``m`` (module docstring of
    :mod:`course_lib.scaling.remat`), so ``temp`` falls roughly as ``1/n_micro`` until the gradient
    buffers (a few copies of the parameters) dominate. Measured (defaults, 2026-11): temp
    54.3 MiB for the whole batch, 29.3 / 15.8 / 9.0 / 5.6 MiB accumulated over 2 / 4 / 8 / 16;
    total 62.3 -> 13.7 MiB.
    """
    for n in n_micros:  # the clear error, before building and compiling anything
        _check_divides(batch, n)
    params, x, y = mlp_problem(seed, depth, width, batch)
    full = jax.jit(jax.grad(_mlp_batch_loss))
    rows = [AccumulationMemory(0, batch, peak_memory(full, params, (x, y)))]
    for n in n_micros:
        accumulated = jax.jit(lambda p, b, n=n: accumulated_grad(_mlp_batch_loss, p, b, n))
        rows.append(AccumulationMemory(n, batch // n, peak_memory(accumulated, params, (x, y))))
    return rows
