r"""bfloat16 mixed precision with float32 master weights (lesson 05).

**The recipe** (Micikevicius et al. 2018, *Mixed Precision Training*, arXiv 1710.03740;
with bfloat16 as on TPUs, Kalamkar et al. 2019, arXiv 1905.12322). Keep the parameters
("master weights") and the optimiser update in float32; run the forward and backward pass
in bfloat16::

    theta_c = bf16(theta)                       cast the float32 master weights
    L       = loss(f(bf16(x); theta_c))         forward in bf16, the loss reduced in f32
    g       = f32(dL/dtheta_c)                  backward in bf16; the cast's transpose
                                                turns the bf16 cotangent into float32
    theta  <- theta - lr g                      the update in float32

Why the update stays in float32: bfloat16 has 8 significand bits (7 stored; machine
epsilon ``2^-7``, unit roundoff ``u = 2^-8 ~ 3.9e-3``). An update ``lr g`` smaller than
``u |theta|`` is rounded away entirely when added to a bf16 weight, so small steps would
stop training; in float32 (``u = 2^-24 ~ 6e-8``) they accumulate.

**No loss scaling for bfloat16.** float16 has 5 exponent bits: its smallest normal number
is ``6.1e-5`` (subnormals to ``6e-8``), and small gradients underflow to zero, so fp16
training multiplies the loss by a scale ``S`` (and the gradients by ``1/S`` after).
bfloat16 keeps float32's 8 exponent bits, so its range is float32's (``1.2e-38`` to
``3.4e38``): gradients do not underflow, and scaling would only move the exponent.
bfloat16 trades precision, not range.

**What the error looks like.** Each bf16 operation rounds its result to 8 significant
bits, so a deep network's gradient carries a relative error of a few ``u``, growing
with depth (:func:`precision_errors`, width 512, batch 256, 5 seeds, 2026-11: 7.8e-3 at
depth 4, 9.5e-3 at 8, 1.2e-2 at 16, within 2% across seeds). The loss, a mean of many
rounded terms whose errors partly cancel, is off by far less (1e-5 to 1e-4).
The loss is reduced in float32 (:func:`course_lib.scaling.remat.mlp_loss` casts the output
before the squared error): a sum of thousands of terms in bf16 would lose the loss's
digits.

**Speed: where bf16 pays and where it does not.** On GPUs (tensor cores) and TPUs (MXU)
a bf16 matmul runs at 2x or more the float32 rate and moves half the bytes, so mixed
precision speeds up training and halves activation memory. On this machine's CPU, XLA
has no bf16 matmul kernel: the compiled program (:func:`compiled_dot_dtypes`) converts
the bf16 operands to float32, multiplies in float32 and rounds the result back, so
bf16 is *slower* here (extra converts; :func:`step_times` measured 67 vs 49 ms per step,
0.73x, depth 8, width 512, batch 256, 2026-11). The numerics
(bf16 inputs and outputs, float32 accumulation) are those of a GPU or TPU; the speed is
not.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from course_lib.scaling.remat import interleaved_times, mlp_loss, mlp_problem

#: Unit roundoff of bfloat16 (8 significand bits, 7 stored): half its epsilon 2^-7, 2^-8.
BF16_UNIT_ROUNDOFF = 2.0**-8


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Cast every floating-point leaf of ``tree`` to ``dtype``; integer leaves stay."""
    return jax.tree.map(lambda a: a.astype(dtype) if jnp.issubdtype(jnp.result_type(a), jnp.floating) else a, tree)


def mixed_precision_loss(
    loss_fn: Callable[..., jax.Array], compute_dtype: Any = jnp.bfloat16
) -> Callable[..., jax.Array]:
    """``loss_fn`` run in ``compute_dtype``: ``(params, *batch) -> float32 loss``.

    Casts the (float32 master) parameters and every floating input to ``compute_dtype``
    and the loss back to float32. ``jax.grad`` of the result is taken with respect to
    the float32 parameters, so the gradient comes back float32 (the transpose of a cast
    is the cast back), with the precision of the bf16 backward pass.
    """

    def loss(params: Any, *batch: Any) -> jax.Array:
        return loss_fn(cast_floating(params, compute_dtype), *cast_floating(batch, compute_dtype)).astype(jnp.float32)

    return loss


def sgd_update(params: Any, grads: Any, lr: float) -> Any:
    """``theta <- theta - lr g`` in the parameters' own dtype (float32 master weights)."""
    return jax.tree.map(lambda p, g: p - lr * g.astype(p.dtype), params, grads)


def train_step(
    loss_fn: Callable[..., jax.Array], lr: float, compute_dtype: Any = jnp.float32
) -> Callable[..., tuple[Any, jax.Array]]:
    """A jitted SGD step ``(params, *batch) -> (new_params, loss)``: forward and backward in
    ``compute_dtype``, the update in the parameters' dtype (float32 master weights)."""
    loss = loss_fn if jnp.dtype(compute_dtype) == jnp.float32 else mixed_precision_loss(loss_fn, compute_dtype)

    @jax.jit
    def step(params: Any, *batch: Any) -> tuple[Any, jax.Array]:
        value, grads = jax.value_and_grad(loss)(params, *batch)
        return sgd_update(params, grads, lr), value

    return step


# ---------------------------------------------------------------------------------------
# Inspecting the compute dtypes
# ---------------------------------------------------------------------------------------


def _sub_jaxprs(value: Any) -> list[Any]:
    if hasattr(value, "eqns"):  # a Jaxpr
        return [value]
    if hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):  # a ClosedJaxpr
        return [value.jaxpr]
    if isinstance(value, (tuple, list)):
        return [j for v in value for j in _sub_jaxprs(v)]
    return []


def jaxpr_dot_dtypes(fn: Callable[..., Any], *args: Any) -> Counter[str]:
    """How many ``dot_general`` equations of ``make_jaxpr(fn)(*args)`` have each operand dtype.

    Walks nested jaxprs (scan bodies, ``jax.checkpoint``, ``pjit``). Keys are
    ``"lhs_dtype x rhs_dtype"``, e.g. ``"bfloat16 x bfloat16"``: what JAX asks XLA to
    compute, before XLA picks kernels.
    """
    counts: Counter[str] = Counter()

    def walk(jaxpr: Any) -> None:
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                counts[" x ".join(str(v.aval.dtype) for v in eqn.invars)] += 1
            for value in eqn.params.values():
                for sub in _sub_jaxprs(value):
                    walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return counts


_HLO_DOT = re.compile(r"=\s*(\w+)\[[^\]]*\][^=]*?\bdot\(")


def compiled_dot_dtypes(jitted: Any, *args: Any) -> Counter[str]:
    """Result dtypes of the ``dot`` instructions in the *compiled* HLO of ``jitted`` (``"f32"``, ``"bf16"``).

    What the backend actually multiplies in. On jaxlib 0.10.2's CPU backend a bf16
    program's dots come out ``f32`` (converts before and after): no bf16 matmul kernel.
    """
    text = jitted.lower(*args).compile().as_text()
    return Counter(m.group(1) for m in _HLO_DOT.finditer(text))


# ---------------------------------------------------------------------------------------
# Measurements: error vs float32 over seeds, step time interleaved
# ---------------------------------------------------------------------------------------


def tree_relative_error(approx: Any, exact: Any) -> float:
    """``||approx - exact|| / ||exact||`` over all leaves (one global 2-norm), in float64."""
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(approx)])
    e = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(exact)])
    if a.shape != e.shape:
        raise ValueError(f"trees differ in size: {a.size} vs {e.size} entries")
    return float(np.linalg.norm(a - e) / np.linalg.norm(e))


@dataclass(frozen=True)
class PrecisionErrors:
    """Relative errors of the bf16 pass against float32, one entry per seed.

    Attributes:
        seeds: the seeds (each a fresh problem: parameters, inputs, targets).
        loss_rel_err: ``|L_bf16 - L_f32| / |L_f32|`` per seed.
        grad_rel_err: ``||g_bf16 - g_f32|| / ||g_f32||`` (global 2-norm) per seed.
        grad_dtype: dtype of the bf16 pass's gradient (float32: master-weight dtype).
    """

    seeds: tuple[int, ...]
    loss_rel_err: tuple[float, ...]
    grad_rel_err: tuple[float, ...]
    grad_dtype: str

    @property
    def loss_mean(self) -> float:
        return float(np.mean(self.loss_rel_err))

    @property
    def loss_max(self) -> float:
        return float(np.max(self.loss_rel_err))

    @property
    def grad_mean(self) -> float:
        return float(np.mean(self.grad_rel_err))

    @property
    def grad_max(self) -> float:
        return float(np.max(self.grad_rel_err))


def precision_errors(
    depth: int = 8,
    width: int = 512,
    batch: int = 256,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    compute_dtype: Any = jnp.bfloat16,
) -> PrecisionErrors:
    """Loss and gradient of the deep tanh MLP (:func:`course_lib.scaling.remat.mlp_loss`) in
    ``compute_dtype`` vs float32, on one fresh problem per seed."""
    if not seeds:
        raise ValueError("seeds is empty; pass at least one seed")
    exact_fn = jax.jit(jax.value_and_grad(mlp_loss))
    approx_fn = jax.jit(jax.value_and_grad(mixed_precision_loss(mlp_loss, compute_dtype)))
    loss_err, grad_err, dtype = [], [], ""
    for seed in seeds:
        params, x, y = mlp_problem(seed, depth, width, batch)
        (l32, g32), (l16, g16) = exact_fn(params, x, y), approx_fn(params, x, y)
        loss_err.append(abs(float(l16) - float(l32)) / abs(float(l32)))
        grad_err.append(tree_relative_error(g16, g32))
        dtype = str(jax.tree.leaves(g16)[0].dtype)
    return PrecisionErrors(tuple(seeds), tuple(loss_err), tuple(grad_err), dtype)


@dataclass(frozen=True)
class StepTimes:
    """Interleaved wall-clock seconds of one SGD step (forward, backward, update).

    Attributes:
        f32_s / bf16_s: each round's time.
        f32_median_s / bf16_median_s: their medians.
        bf16_speedup: ``f32_median / bf16_median`` (< 1 means bf16 is slower).
    """

    f32_s: tuple[float, ...]
    bf16_s: tuple[float, ...]
    f32_median_s: float
    bf16_median_s: float
    bf16_speedup: float


def step_times(
    depth: int = 8, width: int = 512, batch: int = 256, repeats: int = 7, lr: float = 1e-2, seed: int = 0
) -> StepTimes:
    """Time the float32 and the bf16 SGD step of the deep MLP, interleaved (A B A B ...)."""
    params, x, y = mlp_problem(seed, depth, width, batch)
    f32_step = train_step(mlp_loss, lr, jnp.float32)
    bf16_step = train_step(mlp_loss, lr, jnp.bfloat16)
    times = interleaved_times({"f32": lambda: f32_step(params, x, y), "bf16": lambda: bf16_step(params, x, y)}, repeats)
    f32_med, bf16_med = statistics.median(times["f32"]), statistics.median(times["bf16"])
    return StepTimes(tuple(times["f32"]), tuple(times["bf16"]), f32_med, bf16_med, f32_med / bf16_med)
