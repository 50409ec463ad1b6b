r"""Learning-rate scaling rules for large batches, and a small experiment (lesson 05).

Data parallelism over ``N`` devices multiplies the batch by ``N``. With the same number of
samples (epochs), a ``k`` times larger batch takes ``k`` times fewer SGD steps, so with the
same learning rate it travels ``k`` times less far: it must take larger steps. Two rules
give the new rate from a base rate ``lr_0`` tuned at batch ``B_0``::

    linear:  lr(B) = lr_0 * B / B_0            Goyal et al. 2017 (arXiv 1706.02677)
    sqrt:    lr(B) = lr_0 * sqrt(B / B_0)      Krizhevsky 2014 (arXiv 1404.5997);
                                               Hoffer et al. 2017 (arXiv 1705.08741)

*Linear*: one SGD step on a batch of ``kB`` averages ``k`` times as many per-sample
gradients; if the gradient changes little over ``k`` small steps, ``k`` steps of ``lr``
on batches of ``B`` move the weights by about ``k lr g``, which one step of ``k lr`` on
the batch of ``kB`` reproduces. It fails when ``k lr`` passes the stability limit of the
loss (``lr < 2 / lambda_max`` of the Hessian for SGD) and early in training when the
gradient changes fast: Goyal et al. add a warm-up and cap the batch (8k for ResNet-50).
*Square root*: keeps the variance of the update ``lr^2 Var(g_B) ~ lr^2 sigma^2 / B``
constant: a ``k`` times larger batch cuts the gradient noise's variance by ``k``, so
``lr`` may grow by ``sqrt(k)`` at the same noise level. More conservative, it is the
usual rule for adaptive optimisers (Adam) and safer near the stability limit.

:func:`lr_scaling_experiment` measures both on a generated problem: a small MLP learns a
random "teacher" network's labels with plain SGD (no momentum, so the rate alone sets the
step), every run seeing the *same samples* at batch sizes ``B_0 .. 32 B_0``, with the
rate unscaled, scaled linearly and by the square root, over several seeds. The whole
grid is one compiled program: a batch of ``k B_0`` is built from ``k`` chunks of ``B_0``
(gradient accumulation), so one ``lax.scan`` over chunks, ``vmap``-ed over runs and seeds,
trains every run at once (a single scan, no nesting: see GOTCHAS on nested scans on CPU).

What it shows (measured 2026-11, 8 seeds, 65,536 samples, held-out cross-entropy in nats;
the untrained students start at 0.75): with ``lr_0 = 0.1`` at ``B_0 = 32`` (0.128),
unscaled SGD at ``B = 1024`` ends at 0.30 (64 steps of a rate made for 2,048), the linear
rule at 0.131 (``lr = 3.2``, within rounding of the small batch), the square root at
0.145. With ``lr_0 = 0.8`` the linear rule asks for ``lr = 25.6`` at ``B = 1024``, past the
stability limit: 0.41 +- 0.21 over seeds, worse than unscaled (0.139), while the square root
(``lr = 4.5``) gets 0.129. Linear scaling holds until the rate hits the curvature limit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

ScalingRule = Literal["none", "linear", "sqrt"]
#: ``"none"`` keeps ``lr_0`` (the unscaled baseline of the experiment).
SCALING_RULES: tuple[ScalingRule, ...] = ("none", "linear", "sqrt")


def scaled_lr(base_lr: float, base_batch: int, batch: int, rule: ScalingRule) -> float:
    """The learning rate for ``batch`` given ``base_lr`` tuned at ``base_batch``.

    ``"linear"``: ``base_lr * batch / base_batch`` (Goyal et al. 2017);
    ``"sqrt"``: ``base_lr * sqrt(batch / base_batch)`` (Krizhevsky 2014, Hoffer et al. 2017);
    ``"none"``: ``base_lr``. Raises ``ValueError`` for a non-positive or non-finite input
    or an unknown rule.
    """
    for name, value in (("base_lr", base_lr), ("base_batch", base_batch), ("batch", batch)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    ratio = batch / base_batch
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    if rule == "none":
        return float(base_lr)
    raise ValueError(f"unknown scaling rule {rule!r}; use one of {SCALING_RULES}")


# ---------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------

Params = dict[str, jax.Array]


def _init(rng: np.random.Generator, d_in: int, hidden: int) -> dict[str, np.ndarray]:
    """One tanh hidden layer and a logit: ``W ~ N(0, 1/fan_in)``, biases 0 (plain normals, no QR).

    The data and initial weights are drawn with numpy (no JAX program to compile for them);
    only training runs in JAX.
    """
    return {
        "W1": (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal(hidden) / np.sqrt(hidden)).astype(np.float32),
        "b2": np.zeros((), np.float32),
    }


def _logits(params: Any, x: Any) -> Any:
    """``z = tanh(x W1 + b1) w2 + b2``, for numpy or JAX arrays."""
    xp = jnp if isinstance(x, jax.Array) else np
    return xp.tanh(x @ params["W1"] + params["b1"]) @ params["w2"] + params["b2"]


def _bce(params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean binary cross-entropy ``-[y log s(z) + (1 - y) log(1 - s(z))] = softplus(z) - y z`` (nats)."""
    z = _logits(params, x)
    return jnp.mean(jax.nn.softplus(z) - labels * z)


def _teacher(task_seed: int, d_in: int, hidden: int) -> dict[str, np.ndarray]:
    """A random wider network whose sign labels the data (``4x`` larger output weights: sharp boundary)."""
    teacher = _init(np.random.default_rng(task_seed), d_in, hidden)
    return {**teacher, "w2": 4.0 * teacher["w2"]}


def _sample(
    rng: np.random.Generator, teacher: dict[str, np.ndarray], n: int, d_in: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` inputs ``x ~ N(0, I)`` and their labels ``1[teacher(x) > 0]`` (float32)."""
    x = rng.standard_normal((n, d_in), dtype=np.float32)
    return x, (_logits(teacher, x) > 0).astype(np.float32)


@dataclass(frozen=True)
class LRScalingResult:
    """What :func:`lr_scaling_experiment` returns (numpy arrays).

    Attributes:
        batch_sizes: ``[nB]`` the batch sizes, ``batch_sizes[0]`` the base batch.
        rules: ``[nR]`` the scaling rules (``"none"``, ``"linear"``, ``"sqrt"``).
        seeds: ``[nS]`` the seeds (student init and data stream; the task is fixed).
        lrs: ``[nB, nR]`` the learning rate of each run, :func:`scaled_lr`.
        steps: ``[nB]`` SGD steps, ``total_samples / batch``.
        final_loss: ``[nB, nR, nS]`` cross-entropy (nats) on a fixed held-out set after
            training (``nan`` where a run diverged).
        curves: ``[nB, nR, nS, n_points]`` training-batch loss averaged over each
            ``1/n_points`` of the sample budget, for plots against samples seen.
        initial_loss: held-out loss of the untrained students, mean over seeds.
        total_samples: the sample budget of every run.
    """

    batch_sizes: np.ndarray
    rules: tuple[ScalingRule, ...]
    seeds: np.ndarray
    lrs: np.ndarray
    steps: np.ndarray
    final_loss: np.ndarray
    curves: np.ndarray
    initial_loss: float
    total_samples: int

    def mean_std(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation over seeds of ``final_loss``: two ``[nB, nR]`` arrays."""
        return self.final_loss.mean(axis=-1), self.final_loss.std(axis=-1)

    def table(self) -> str:
        """Final held-out loss per (batch, rule) as ``mean ± std`` over seeds, one row per batch."""
        mean, std = self.mean_std()
        head = f"{'batch':>6} {'steps':>6} " + " ".join(f"{r + ' (lr)':>24}" for r in self.rules)
        rows = [head]
        for i, b in enumerate(self.batch_sizes):
            cells = " ".join(
                f"{mean[i, j]:>8.4f} ± {std[i, j]:.4f} ({self.lrs[i, j]:5.2f})" for j in range(len(self.rules))
            )
            rows.append(f"{b:>6d} {self.steps[i]:>6d} {cells}")
        return "\n".join(rows)


def lr_scaling_experiment(
    batch_sizes: Sequence[int] = (32, 64, 128, 256, 512, 1024),
    rules: Sequence[ScalingRule] = SCALING_RULES,
    base_lr: float = 0.1,
    total_samples: int = 65536,
    seeds: Sequence[int] = (0, 1, 2, 3, 4, 5, 6, 7),
    d_in: int = 16,
    hidden: int = 32,
    n_points: int = 16,
    task_seed: int = 1234,
    eval_samples: int = 4096,
) -> LRScalingResult:
    """Train the student MLP with plain SGD on the same samples at each batch size and rule.

    ``batch_sizes[0]`` is the base batch ``B_0`` at which ``base_lr`` holds; every batch
    gets :func:`scaled_lr` of each rule. Each seed draws one stream of ``total_samples``
    fresh samples (and one student init) shared by every batch size and rule, so the
    comparison is paired: only the batching and the rate differ.

    **One compiled program for everything.** Batch sizes are multiples of ``B_0``, so a
    step on a batch of ``B = k B_0`` is computed as in :mod:`course_lib.scaling.accumulation`: the
    mean of the gradients of ``k`` chunks of ``B_0`` samples, the update applied after
    every ``k``-th chunk (``theta <- theta - lr (1/k) sum_j g_j``). Then ``k`` and ``lr``
    are just numbers, and one ``lax.scan`` over the ``total_samples / B_0`` chunks,
    ``vmap``-ed over (batch, rule) runs and over seeds, trains all runs at once (one
    compile instead of one per batch shape). ``curves`` average the chunk losses, the loss
    of each training batch before its update. The defaults take about 6 s on the 2-core
    machine at load average 4 (2026-11).
    """
    if not batch_sizes or not rules or not seeds:
        raise ValueError("batch_sizes, rules and seeds must be non-empty")
    base = int(batch_sizes[0])
    for b in batch_sizes:
        if b < base or b % base:
            raise ValueError(f"every batch size must be a multiple of the base batch {base} (batch_sizes[0]), got {b}")
        if total_samples % b or (total_samples // base) % n_points:
            raise ValueError(
                f"total_samples={total_samples} must be divisible by every batch size (got {b}) and "
                f"total_samples / {base} by n_points={n_points}"
            )
    lrs = np.array([[scaled_lr(base_lr, base, int(b), r) for r in rules] for b in batch_sizes], np.float32)
    accum = np.array([[int(b) // base for _ in rules] for b in batch_sizes], np.int32)
    teacher = _teacher(task_seed, d_in, 4 * hidden)
    x_eval, y_eval = (
        jnp.asarray(a) for a in _sample(np.random.default_rng(task_seed + 1), teacher, eval_samples, d_in)
    )
    n_chunks = total_samples // base

    def run(lr: jax.Array, k: jax.Array, params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        """One SGD run with batch ``k B_0`` and rate ``lr`` over chunks ``x [n_chunks, B_0, d]``."""
        zeros = jax.tree.map(jnp.zeros_like, params)

        def chunk(carry: tuple[Params, Params, jax.Array], xy: tuple[jax.Array, jax.Array]) -> tuple[Any, jax.Array]:
            p, g_sum, i = carry
            loss, g = jax.value_and_grad(_bce)(p, *xy)
            g_sum = jax.tree.map(jnp.add, g_sum, g)
            update = (i + 1) % k == 0  # the batch's last chunk: step with the mean gradient
            p = jax.tree.map(lambda a, s: jnp.where(update, a - lr * s / k, a), p, g_sum)
            g_sum = jax.tree.map(lambda s: jnp.where(update, jnp.zeros_like(s), s), g_sum)
            return (p, g_sum, i + 1), loss

        (params, _, _), losses = lax.scan(chunk, (params, zeros, jnp.zeros((), jnp.int32)), (x, y))
        return _bce(params, x_eval, y_eval), losses

    def per_seed(params: Params, x: jax.Array, y: jax.Array, lr: jax.Array, k: jax.Array) -> Any:
        final, losses = jax.vmap(run, in_axes=(0, 0, None, None, None))(lr, k, params, x, y)
        return final, losses, _bce(params, x_eval, y_eval)

    # Per seed: its own student init and sample stream (numpy), shared by all runs of the seed.
    rngs = [np.random.default_rng([task_seed, int(seed)]) for seed in seeds]
    inits = [_init(rng, d_in, hidden) for rng in rngs]
    data = [_sample(rng, teacher, total_samples, d_in) for rng in rngs]
    params = {name: jnp.asarray(np.stack([p[name] for p in inits])) for name in inits[0]}
    x = jnp.asarray(np.stack([d[0] for d in data]).reshape(len(seeds), n_chunks, base, d_in))
    y = jnp.asarray(np.stack([d[1] for d in data]).reshape(len(seeds), n_chunks, base))
    program = jax.jit(jax.vmap(per_seed, in_axes=(0, 0, 0, None, None)))
    final, losses, initial = jax.block_until_ready(
        program(params, x, y, jnp.asarray(lrs.ravel()), jnp.asarray(accum.ravel()))
    )
    n_b, n_r, n_s = len(batch_sizes), len(rules), len(seeds)
    final_np = np.asarray(final).reshape(n_s, n_b, n_r).transpose(1, 2, 0)  # [nB, nR, nS]
    curves = np.asarray(losses).reshape(n_s, n_b, n_r, n_points, -1).mean(-1).transpose(1, 2, 0, 3)
    return LRScalingResult(
        batch_sizes=np.asarray(batch_sizes, np.int64),
        rules=tuple(rules),
        seeds=np.asarray(seeds, np.int64),
        lrs=lrs,
        steps=np.asarray([total_samples // int(b) for b in batch_sizes], np.int64),
        final_loss=np.where(np.isfinite(final_np), final_np, np.nan),
        curves=curves,
        initial_loss=float(np.mean(initial)),
        total_samples=total_samples,
    )
