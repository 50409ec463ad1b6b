r"""Laying out the cluster: a first-principles throughput and staleness model for async RL (lesson 08).

The question (Applied Compute's talk "Efficient RL"): given ``N`` GPUs, a training batch
and the staleness the learning algorithm tolerates, how should the GPUs be split between
*samplers* (generating answers) and *trainers* (optimizer steps), and which layout --
synchronous, one-step off-policy or fully pipelined -- gives the most generated tokens per
second while every sample's lag stays within the bound? This module answers it with
pen-and-paper physics; :mod:`course_lib.layout.sim` plays the same system event by event,
and :mod:`course_lib.layout.published` holds the model against published systems.

**1. One sampler GPU** (an inference engine with a paged KV cache, as vLLM and SGLang).
Each token leaves a key and a value vector per layer and KV head::

    kv = 2 * n_layers * n_kv_heads * head_dim * kv_bytes_per_elem                 (08.1)

A paged engine holds only the tokens a sequence has written so far. A sequence of ``L``
answer tokens after ``P`` prompt tokens holds ``P + j`` tokens at its ``j``-th decode step,
so averaged over the time sequences are resident (longer ones count longer)::

    R = P + (E[L^2] - E[L]) / (2 E[L])         resident tokens per sequence
    B_max = floor((f * M - W) / (kv * R))                                         (08.2)

(``f M`` usable memory, ``W`` weight bytes; vLLM's ``max_num_seqs`` may cap it lower.
The pessimistic variant reserves the full context ``P + L_limit`` per sequence.)

One decode step advances every running sequence by one token. It reads the weights once
and the resident KV cache, and computes ``2 n_params`` FLOPs per token processed: the answer
tokens, and the prompts' prefill, which chunked prefill interleaves with decoding (a running
sequence of ``L`` answer tokens carries ``P / L`` prompt tokens into each of its steps). The
step takes the longer of its memory time and its compute time (roofline, at an efficiency
``eta`` of peak bandwidth ``beta`` and peak FLOP/s ``F``)::

    l = max(a_s + b_s * B + r_s * R_t,  f_s * (B + P * sum_i 1 / L_i))            (08.3)
      a_s = W / (eta beta),  r_s = kv / (eta beta),  f_s = 2 n_params / (eta F)

with ``B`` sequences running, ``R_t`` tokens resident and the sum over the running sequences
(``b_s``: a fixed per-sequence cost, 0 for the roofline, fitted for a measured engine).
In steady state ``R_t = B R`` and the sum is ``B / E[L]``, and one engine makes::

    p = B_max / l(B_max)  answer tokens/s                                       (08.4)

**2. One trainer GPU.** A sample of ``P + L`` tokens costs ``6 n_params`` FLOPs per token
for the update and ``2 n_params`` per extra forward pass (``k`` of them: the old policy's
log-probs when they are recomputed, a reference model's for a KL term); at a model-FLOPs
utilisation ``u``, in *answer* tokens/s::

    c = u F E[L] / ((6 + 2 k) n_params (P + E[L]))                               (08.5)

Its memory: mixed-precision Adam keeps 16 bytes per parameter (bf16 weights and
gradients, fp32 master weights and two moments: ZeRO, Rajbhandari et al. 2020), sharded
over the ``N_t`` trainers (ZeRO-3 / FSDP)::

    16 n_params / N_t <= f M   ->   N_t >= N_t_min = ceil(16 n_params / (f M))    (08.5b)

**3. The balance.** ``P = N_s p`` tokens/s produced, ``C = N_t c`` consumed; the cluster
runs at ``min(P, C)``, and the split that wastes neither side is::

    N_s* = N c / (p + c)                                                          (08.6)

**4. The straggler.** A synchronous layout waits for the batch's *last* answer. Samples are
dealt round robin to the engines; each engine runs continuous batching (at most ``B_max``
sequences; a freed slot is refilled at the next step). Summing (08.3) over the steps of the
schedule (:func:`engine_schedule`) gives each engine's phase exactly; the batch is done when
the slowest engine is::

    T_gen = max_e sum_t l(B_e,t, R_e,t, S_e,t)                                    (08.7)

(For a linear engine, ``r_s = f_s = 0``, this is ``a_s S_e + b_s K_e``: steps and tokens.)

**5. The layouts** (``G`` answer tokens per batch, ``K`` batches generated per weight
version: 1, or PipelineRL's conventional baseline that takes several optimizer steps per
generation round; ``d`` the weight sync; ``T_train = K G / (N_t c)``)::

    sync_colocated:  step = T_gen(N engines, K batches) + K G / (N c) + d         (08.8)
    sync_split:      step = T_gen(N_s engines, K batches) + T_train + d           (08.9)
    one_step:        step = max(T_gen(N_s engines, K batches), T_train + d)       (08.10)

tokens/s ``= K G / step``; lags ``0 .. K - 1`` (one_step: ``1 .. K``).

**6. The pipeline** (in-flight weight updates; a running sequence keeps generating across
updates, its lag counts from the weights its first token used). AReaL's admission rule
(arXiv 2505.24298, sec. 4.1) with staleness ``eta_s`` = ``max_lag``: a sample may start
only while fewer than ``(eta_s + 1) B`` samples are held (started, and not consumed by an
update whose weights have reached the samplers). The held samples are the ones in flight,
the finished ones queued (half a batch on average), the batch being trained (for the
share ``T_train / step`` of the time) and the one whose weights are on their way
(``d / step``), so the sequences in flight are at most::

    I = (eta_s + 1) B - B (1/2 + (T_train + d) / step)
    B_eff = min(B_max, I / N_s),  tokens/s = min(N_s B_eff / l(B_eff), N_t c)     (08.11)

(``step`` depends on tokens/s: (08.11) is solved as a fixed point.) When the trainers also
stop for the sync (``SystemSpec.sync_blocks_trainer``, the default), they consume
``C_d = G / (G / (N_t c) + d)`` instead of ``N_t c``. The mean lag, by Little's law (samples
held = rate x time held) on the samples held before their update, in flight and queued
(half a batch while sampler-bound; the rest of the full window while trainer-bound)::

    mean_lag = min(eta_s, (N_s B_eff + B/2) / B + d / step)       sampler-bound   (08.12)
    mean_lag = min(eta_s, eta_s + 1 - (T_train + d) / step + d / step)  trainer-bound

(both give ``eta_s`` at the balance when the window sets what is in flight; when ``N_s B_max``
does, the queue fills past the balance and the lag steps up to ``eta_s``; with no bound,
``eta_s = inf``, a trainer-bound lag is ``inf`` and its maximum :data:`UNBOUNDED_LAG`.)

A sample's lag grows with its length: the longest answer (``L_max``; a planner's batch holds
one at the generation limit, :func:`spec_from_hardware`) is ``(L_max - E[L]) l(B_eff)``
seconds behind the mean one, so if nothing stops it::

    lag_max = ceil(mean_lag + (L_max - E[L]) l(B_eff) / step)                     (08.13)

**7. The admission rule and the maximum lag.** AReaL's rule bounds what *starts*; it bounds
the lag of every sample only if samples are consumed in the order they started. What the
trainer does with a straggler decides the maximum:

* ``"fifo"``: the trainer takes finished samples first come, first served; a straggler is
  consumed late, with the lag (08.13), past the bound when ``L_max`` is long.
* ``"wait"`` (a hard bound by waiting): the trainer takes the oldest sample first whenever a
  deadline forces it, and waits for it if it is still generating. Every lag is at most
  ``floor(eta_s)``; the price: a straggler started at version ``s`` must be finished before
  update ``s + eta_s`` starts, ``eta_s`` steps minus the sync after its start::

      step >= (L_max l(B_w) + d) / eta_s                                           (08.14)

  While the trainer waits, the window fills with finished samples and the engines run only
  what is consumed: ``B_w`` is the batch at which ``N_s B_w / l(B_w)`` equals the throughput
  (at least 1: the straggler itself), so the straggler decodes faster than in a full engine.

* ``"drop"`` (a hard bound by refusing): a sample that cannot be consumed within the
  bound is aborted, its tokens wasted. Answers longer than
  ``L_cut = (eta_s step - d) / l(B_eff)`` are dropped (the share ``P(L > L_cut)``); the
  trainer gets ``E[L; L <= L_cut]`` answer tokens per started sample for
  ``E[min(L, L_cut)]`` generated::

      useful tokens/s = min(production * E[L; L <= L_cut] / E[min(L, L_cut)], N_t c)   (08.15)

  (dropping long answers biases learning towards short ones: a cost this model does not price.)

A split is **feasible** if its trainers hold the model (08.5b) and its maximum lag is within
``max_lag`` under the admission rule; :func:`best_split` returns the fastest feasible split
and says which constraint failed when none is.

All throughputs count generated (answer) tokens; the prompt enters as KV, prefill and
trainer FLOPs. Every batch is assumed to have the lengths of ``SystemSpec.answer_tokens``.

References: Applied Compute, "Efficient RL" (talk: the throughput question, production =
consumption, the straggler); W. Kwon et al., vLLM / PagedAttention (SOSP 2023: a paged KV
cache holds the tokens written so far); S. Rajbhandari et al., ZeRO (SC 2020: 16 bytes per
parameter for mixed-precision Adam, sharded over data-parallel ranks); W. Fu et al., AReaL
(arXiv 2505.24298, sec. 4.1: the admission rule); verl's fully-async docs (rollouts in
flight bounded by a staleness threshold); J. D. C. Little (1961), ``L = lambda W``.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal

import numpy as np
from numpy.typing import NDArray

Layout = Literal["sync_colocated", "sync_split", "one_step", "pipeline"]
#: The layouts, by their exact names (shared with :mod:`course_lib.layout.sim`).
LAYOUTS: tuple[Layout, ...] = ("sync_colocated", "sync_split", "one_step", "pipeline")
Admission = Literal["fifo", "wait", "drop"]
#: What the trainer does with a sample that would break the lag bound (section 7 above).
ADMISSIONS: tuple[Admission, ...] = ("fifo", "wait", "drop")

#: Bytes of training state per parameter for mixed-precision Adam: bf16 weights (2) and
#: gradients (2), fp32 master weights (4) and two moments (8) (ZeRO, Rajbhandari et al. 2020).
TRAIN_STATE_BYTES_PER_PARAM = 16.0


# --------------------------------------------------------------------------------------
# 1. Hardware and model
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that set its memory and time costs.

    Attributes:
        name: for tables and plots.
        n_params: parameters (all of them, embeddings included: they are read and stored).
        n_layers: transformer blocks.
        n_kv_heads: key/value heads per layer (grouped-query attention: fewer than query heads).
        head_dim: width of one head.
        weight_bytes_per_param: 2 for bf16.
        kv_bytes_per_elem: 2 for a bf16 KV cache.
    """

    name: str
    n_params: float
    n_layers: int
    n_kv_heads: int
    head_dim: int
    weight_bytes_per_param: float = 2.0
    kv_bytes_per_elem: float = 2.0

    @property
    def weight_bytes(self) -> float:
        """Bytes of the weights: ``n_params * weight_bytes_per_param``."""
        return self.n_params * self.weight_bytes_per_param


# Shapes from the published config.json of Qwen/Qwen2.5-7B and Qwen/Qwen2.5-32B (Hugging Face):
# 7B: hidden 3584, intermediate 18944, 28 layers, 28 query / 4 KV heads, head_dim 3584/28 = 128,
#     vocab 152064, untied embeddings -> 7.62e9 parameters counted from the config (card: 7.61B).
#     Qwen2.5-Math-7B has the same shape (its config: the same hidden size, layers and heads).
# 32B: hidden 5120, intermediate 27648, 64 layers, 40 query / 8 KV heads, head_dim 5120/40 = 128,
#     vocab 152064, untied embeddings -> 32.76e9 counted from the config (card rounds to 32.5B).
QWEN25_7B = ModelShape("Qwen2.5-7B", n_params=7.62e9, n_layers=28, n_kv_heads=4, head_dim=128)
QWEN25_32B = ModelShape("Qwen2.5-32B", n_params=32.76e9, n_layers=64, n_kv_heads=8, head_dim=128)


@dataclass(frozen=True)
class GPU:
    """One accelerator: memory, memory bandwidth and dense bf16 peak.

    Attributes:
        name: for tables and plots.
        memory_bytes: HBM capacity.
        hbm_bytes_per_s: HBM bandwidth.
        peak_flops: dense (no sparsity) bf16 FLOP/s.
    """

    name: str
    memory_bytes: float
    hbm_bytes_per_s: float
    peak_flops: float


#: NVIDIA H100 SXM (datasheet): 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense bf16.
H100_SXM = GPU("H100 SXM", memory_bytes=80e9, hbm_bytes_per_s=3.35e12, peak_flops=989e12)
#: NVIDIA H800 SXM (the export H100: the same compute and HBM; NVLink 400 GB/s instead of 900).
H800_SXM = GPU("H800 SXM", memory_bytes=80e9, hbm_bytes_per_s=3.35e12, peak_flops=989e12)
#: NVIDIA H20 (datasheet): 96 GB HBM3, 4.0 TB/s, 148 TFLOP/s dense bf16: a memory-rich, compute-poor Hopper.
H20 = GPU("H20", memory_bytes=96e9, hbm_bytes_per_s=4.0e12, peak_flops=148e12)
#: The GPUs above, by name.
GPUS: dict[str, GPU] = {g.name: g for g in (H100_SXM, H800_SXM, H20)}


def kv_bytes_per_token(shape: ModelShape) -> float:
    """KV-cache bytes one token occupies (08.1): K and V, every layer and KV head."""
    return 2.0 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem


def kv_capacity_tokens(shape: ModelShape, gpu: GPU, memory_fraction: float = 0.9) -> float:
    """Tokens of KV cache that fit beside the weights: ``(f M - W) / kv``.

    Raises ValueError if the weights alone do not fit in ``memory_fraction`` of the memory.
    """
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    free_bytes = memory_fraction * gpu.memory_bytes - shape.weight_bytes
    if free_bytes <= 0:
        raise ValueError(
            f"{shape.name}'s weights ({shape.weight_bytes / 1e9:.1f} GB) do not fit in {memory_fraction:.0%} "
            f"of {gpu.name}'s {gpu.memory_bytes / 1e9:.0f} GB: shard the model (tensor parallelism) or use a bigger GPU"
        )
    return free_bytes / kv_bytes_per_token(shape)


def max_batch(shape: ModelShape, gpu: GPU, context_tokens: float, memory_fraction: float = 0.9) -> int:
    """Sequences of ``context_tokens`` resident tokens each whose KV cache fits beside the weights (08.2).

    ``context_tokens`` is what one sequence holds: the mean resident tokens ``R`` of a paged
    cache (:meth:`LengthDist.mean_resident_tokens`), or the full context ``P + L_limit`` when
    every sequence reserves it. ``memory_fraction`` of the GPU's memory is usable (the rest:
    activations, CUDA context, fragmentation). Raises ValueError if the weights alone do not
    fit, or not even one sequence does.
    """
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    capacity = kv_capacity_tokens(shape, gpu, memory_fraction)
    n = math.floor(capacity / context_tokens)
    if n < 1:
        raise ValueError(
            f"not one sequence of context_tokens={context_tokens:g} fits beside {shape.name}'s weights on {gpu.name} "
            f"({capacity * kv_bytes_per_token(shape) / 1e9:.2f} GB left for the KV cache): shorten the context or "
            "shard the model"
        )
    return n


def decode_latency_roofline(
    shape: ModelShape, gpu: GPU, context_tokens: float, efficiency: float = 1.0
) -> tuple[float, float]:
    """``(a_s, b_s)`` of a *linear*, memory-bound decode step ``l(B) = a_s + b_s * B`` at a fixed
    ``context_tokens`` per sequence: ``a_s`` one read of the weights, ``b_s`` one read of a
    sequence's cache plus its ``2 n_params`` FLOPs. The simplest roofline, kept to show how
    (08.3) grows from it; :func:`step_costs` gives the full (08.3) terms.
    """
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    if not 0.0 < efficiency <= 1.0:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    a_s = shape.weight_bytes / gpu.hbm_bytes_per_s
    b_s = kv_bytes_per_token(shape) * context_tokens / gpu.hbm_bytes_per_s + 2.0 * shape.n_params / gpu.peak_flops
    return a_s / efficiency, b_s / efficiency


@dataclass(frozen=True)
class StepCosts:
    """The terms of one decode step (08.3): ``l = max(a_s + b_s B + r_s R, f_s (B + P S))``.

    Attributes:
        a_s: seconds per step (the weight read).
        b_s: seconds per running sequence per step (0 for the roofline; a measured engine's fit).
        r_s: seconds per resident KV token per step (the KV read).
        f_s: seconds of compute per token processed (an answer token, or a prompt token in prefill).
    """

    a_s: float
    b_s: float = 0.0
    r_s: float = 0.0
    f_s: float = 0.0


def step_costs(shape: ModelShape, gpu: GPU, efficiency: float = 0.7) -> StepCosts:
    """The roofline terms of (08.3) for ``shape`` on ``gpu`` at ``efficiency`` of peak bandwidth and FLOP/s."""
    if not 0.0 < efficiency <= 1.0:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    bw, flops = efficiency * gpu.hbm_bytes_per_s, efficiency * gpu.peak_flops
    return StepCosts(
        a_s=shape.weight_bytes / bw,
        r_s=kv_bytes_per_token(shape) / bw,
        f_s=2.0 * shape.n_params / flops,
    )


def fit_decode_latency(batches: Sequence[float], latencies_s: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(a_s, b_s)`` of ``l(B) = a_s + b_s * B`` through measured ``(B, l(B))`` points."""
    x = np.asarray(batches, dtype=np.float64)
    y = np.asarray(latencies_s, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"batches and latencies_s must be 1-D and of equal length, got {x.shape} and {y.shape}")
    if np.unique(x).size < 2:
        raise ValueError("fit_decode_latency needs at least two distinct batch sizes")
    b_s, a_s = np.polyfit(x, y, 1)
    return float(a_s), float(b_s)


def decode_latency_s(batch: float, a_s: float, b_s: float) -> float:
    """``l(B) = a_s + b_s * B``: a linear engine's step (08.3 with ``r_s = f_s = 0``)."""
    return a_s + b_s * batch


def engine_tokens_per_s(batch: float, a_s: float, b_s: float) -> float:
    """Tokens/s of one linear engine with ``batch`` sequences in flight: ``B / l(B)`` (08.4)."""
    return batch / decode_latency_s(batch, a_s, b_s)


def train_tokens_per_s_per_gpu(
    shape: ModelShape,
    gpu: GPU,
    mfu: float = 0.4,
    *,
    mean_answer_tokens: float | None = None,
    prompt_tokens: float = 0.0,
    extra_forward_passes: int = 0,
) -> float:
    """Answer tokens/s one trainer GPU consumes (08.5): ``u F E[L] / ((6 + 2k) n_params (P + E[L]))``.

    Without ``mean_answer_tokens`` (and with ``prompt_tokens = 0``) this is ``u F / (6 n_params)``
    tokens/s of any kind.
    """
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    if prompt_tokens < 0 or extra_forward_passes < 0:
        raise ValueError(
            f"prompt_tokens and extra_forward_passes must be >= 0, got {prompt_tokens}, {extra_forward_passes}"
        )
    per_token = mfu * gpu.peak_flops / ((6.0 + 2.0 * extra_forward_passes) * shape.n_params)
    if mean_answer_tokens is None:
        if prompt_tokens:
            raise ValueError("give mean_answer_tokens with prompt_tokens: the trainer's cost is per answer token")
        return per_token
    return per_token * mean_answer_tokens / (prompt_tokens + mean_answer_tokens)


def min_trainers(shape: ModelShape, gpu: GPU, memory_fraction: float = 0.9) -> int:
    """The fewest trainer GPUs whose sharded Adam state fits (08.5b): ``ceil(16 n_params / (f M))``."""
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    return max(1, math.ceil(TRAIN_STATE_BYTES_PER_PARAM * shape.n_params / (memory_fraction * gpu.memory_bytes)))


# --------------------------------------------------------------------------------------
# 2b. Answer lengths
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthDist:
    """An empirical distribution of answer lengths (tokens), stored sorted ascending.

    Build one with :func:`lognormal_lengths`, :func:`body_tail_lengths` or
    ``LengthDist.from_samples``; draw a batch (in random order) with :meth:`batch`.
    """

    tokens: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) == 0:
            raise ValueError("LengthDist needs at least one length")
        if min(self.tokens) < 1:
            raise ValueError(f"answer lengths must be >= 1 token, got a minimum of {min(self.tokens)}")
        if list(self.tokens) != sorted(self.tokens):
            raise ValueError("LengthDist.tokens must be sorted: build it with LengthDist.from_samples")

    @classmethod
    def from_samples(cls, samples: Sequence[int] | NDArray[np.integer]) -> LengthDist:
        """The distribution of these samples (sorted for you)."""
        return cls(tuple(sorted(int(t) for t in samples)))

    @property
    def mean_tokens(self) -> float:
        return float(np.mean(self.tokens))

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    def mean_resident_tokens(self, prompt_tokens: float = 0.0) -> float:
        """``R`` of (08.2): resident tokens per sequence of a paged cache, time-weighted."""
        return resident_tokens(self.tokens, prompt_tokens)

    def quantile_tokens(self, q: float) -> float:
        """The ``q`` quantile (``0 <= q <= 1``, linear interpolation)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q}")
        return float(np.quantile(self.tokens, q))

    def batch(self, batch_samples: int, seed: int = 0) -> tuple[int, ...]:
        """``batch_samples`` lengths in random order: a permutation of the samples (repeated
        whole as often as needed, then a random part), so a batch as large as the sample
        keeps its tail exactly."""
        if batch_samples < 1:
            raise ValueError(f"batch_samples must be >= 1, got {batch_samples}")
        rng = np.random.default_rng(seed)
        n = len(self.tokens)
        reps, rest = divmod(batch_samples, n)
        parts = [np.asarray(self.tokens)] * reps + [rng.choice(np.asarray(self.tokens), size=rest, replace=False)]
        out = rng.permutation(np.concatenate(parts))
        return tuple(int(t) for t in out)


def lognormal_lengths(
    mean_tokens: float, p99_over_median: float, n_samples: int = 4096, seed: int = 0, max_tokens: int | None = None
) -> LengthDist:
    """Log-normal answer lengths with a given mean and tail ratio ``p99 / median``.

    ``sigma = ln(p99_over_median) / z_0.99`` (``z_0.99 = 2.326``) and ``mu = ln(mean) -
    sigma^2 / 2``; rounded, at least 1, at most ``max_tokens`` (the generation limit).
    """
    if mean_tokens < 1:
        raise ValueError(f"mean_tokens must be >= 1, got {mean_tokens}")
    if p99_over_median < 1:
        raise ValueError(f"p99_over_median must be >= 1, got {p99_over_median}")
    sigma = math.log(p99_over_median) / 2.3263478740408408
    mu = math.log(mean_tokens) - sigma**2 / 2
    x = np.random.default_rng(seed).lognormal(mu, sigma, size=n_samples)
    x = np.clip(np.rint(x), 1, max_tokens if max_tokens is not None else None)
    return LengthDist.from_samples(x.astype(np.int64))


def body_tail_lengths(
    n_samples: int, body_min_tokens: int, body_max_tokens: int, tail_tokens: int, tail_fraction: float = 0.01
) -> LengthDist:
    """Deterministic "body + tail" lengths: ``round(tail_fraction * n_samples)`` answers of
    ``tail_tokens``, the rest evenly spaced over ``[body_min_tokens, body_max_tokens]``.

    The talk's straggler (99% of samples done in ~40 s, the last 1% needing ~80 s more):
    pick the body so an engine finishes it in ~40 s and ``tail_tokens`` with
    :func:`tail_tokens_for_extra_s`.
    """
    if not 0.0 <= tail_fraction < 1.0:
        raise ValueError(f"tail_fraction must be in [0, 1), got {tail_fraction}")
    if not 1 <= body_min_tokens <= body_max_tokens:
        raise ValueError(f"need 1 <= body_min_tokens <= body_max_tokens, got {body_min_tokens}, {body_max_tokens}")
    n_tail = round(tail_fraction * n_samples)
    n_body = n_samples - n_tail
    if n_body < 1:
        raise ValueError(f"n_samples={n_samples} leaves no body at tail_fraction={tail_fraction}")
    body = np.rint(np.linspace(body_min_tokens, body_max_tokens, n_body)).astype(np.int64)
    return LengthDist.from_samples(np.concatenate([body, np.full(n_tail, tail_tokens, dtype=np.int64)]))


def tail_tokens_for_extra_s(extra_s: float, body_max_tokens: int, tail_per_engine: int, a_s: float, b_s: float) -> int:
    """Tail length that keeps an engine busy ``extra_s`` seconds after its body is done:
    with ``tail_per_engine`` sequences left, each step costs ``l(tail_per_engine)``."""
    if tail_per_engine < 1:
        raise ValueError(f"tail_per_engine must be >= 1, got {tail_per_engine}")
    return body_max_tokens + round(extra_s / decode_latency_s(tail_per_engine, a_s, b_s))


def resident_tokens(lengths_tokens: Sequence[int] | NDArray[np.integer], prompt_tokens: float = 0.0) -> float:
    """``R = P + (E[L^2] - E[L]) / (2 E[L])`` (08.2): the mean KV tokens a sequence holds while it
    runs, each sequence weighted by the steps it runs (its ``j``-th step holds ``P + j``)."""
    lengths = _as_lengths(lengths_tokens).astype(np.float64)
    if lengths.size == 0:
        raise ValueError("resident_tokens needs at least one length")
    if prompt_tokens < 0:
        raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens}")
    return float(prompt_tokens + (np.mean(lengths**2) - np.mean(lengths)) / (2.0 * np.mean(lengths)))


# --------------------------------------------------------------------------------------
# 4. The straggler: one engine's continuous-batching schedule, exactly
# --------------------------------------------------------------------------------------


def _as_lengths(lengths_tokens: Sequence[int] | NDArray[np.integer]) -> NDArray[np.int64]:
    lengths = np.asarray(lengths_tokens, dtype=np.int64)
    if lengths.ndim != 1:
        raise ValueError(f"lengths must be 1-D, got shape {lengths.shape}")
    if lengths.size and lengths.min() < 1:
        raise ValueError(f"answer lengths must be >= 1 token, got a minimum of {lengths.min()}")
    return lengths


def engine_schedule(
    lengths_tokens: Sequence[int] | NDArray[np.integer], max_batch: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """``(start_step, end_step)`` of each sequence on one continuous-batching engine.

    Sequences start in the given order; at most ``max_batch`` run at once. Sequence ``j``
    runs during decode steps ``start_step[j] .. end_step[j] - 1`` (one token a step, so
    ``end - start = length``); the slot it frees is taken at step ``end_step[j]`` by the
    next waiting sequence. The engine's step count is ``end_step.max()``.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    lengths = _as_lengths(lengths_tokens)
    free_at = [0] * min(max_batch, lengths.size)  # step at which each slot is free, a min-heap
    start = np.empty(lengths.size, dtype=np.int64)
    for j, length in enumerate(lengths):
        s = heapq.heappop(free_at)
        start[j] = s
        heapq.heappush(free_at, s + int(length))
    return start, start + lengths


def _step_clock_s(
    start: NDArray[np.int64], end: NDArray[np.int64], costs: StepCosts, prompt_tokens: float
) -> NDArray[np.float64]:
    """``[n_steps]`` cumulative seconds at the end of each step of one engine's schedule (08.3, 08.7)."""
    n_steps = int(end.max())
    running = np.zeros(n_steps + 1, dtype=np.int64)  # B_t by a difference array
    np.add.at(running, start, 1)
    np.add.at(running, end, -1)
    batch_t = np.cumsum(running)[:n_steps].astype(np.float64)
    # resident tokens R_t = sum over running of (P + t - start) = B_t (P + t) - sum of their starts
    starts_sum = np.zeros(n_steps + 1, dtype=np.float64)
    np.add.at(starts_sum, start, start.astype(np.float64))
    np.add.at(starts_sum, end, -start.astype(np.float64))
    steps = np.arange(n_steps, dtype=np.float64)
    resident_t = batch_t * (prompt_tokens + steps) - np.cumsum(starts_sum)[:n_steps]
    inv_len = np.zeros(n_steps + 1, dtype=np.float64)  # sum of 1 / L over the running sequences
    lengths = (end - start).astype(np.float64)
    np.add.at(inv_len, start, 1.0 / lengths)
    np.add.at(inv_len, end, -1.0 / lengths)
    memory_s = costs.a_s + costs.b_s * batch_t + costs.r_s * resident_t
    compute_s = costs.f_s * (batch_t + prompt_tokens * np.cumsum(inv_len)[:n_steps])
    return np.cumsum(np.maximum(memory_s, compute_s))


def _phase_all_start_s(lengths: NDArray[np.int64], costs: StepCosts, prompt_tokens: float) -> float:
    """(08.7) for one engine whose sequences all start at step 0 (no more than ``B_max`` of them),
    in closed form: between two consecutive finishing lengths the running set is fixed, so the
    memory time grows linearly with the step and the compute time is constant; the sum of their
    max over those steps is two arithmetic series. O(k log k) for k sequences instead of O(steps)."""
    ends = np.sort(lengths).astype(np.float64)
    k = ends.size
    inv_tail = np.cumsum((1.0 / ends)[::-1])[::-1]  # sum of 1/L over the sequences still running
    total, lo = 0.0, 0.0
    for j in range(k):
        hi = ends[j]
        if hi > lo:
            b = float(k - j)
            alpha = costs.a_s + costs.b_s * b + costs.r_s * b * prompt_tokens  # memory time at step 0 ...
            beta = costs.r_s * b  # ... growing by this per step
            gamma = costs.f_s * (b + prompt_tokens * inv_tail[j])  # compute time, constant here
            n = hi - lo
            if beta > 0:  # steps before the crossover are compute-bound
                n_compute = min(max(math.ceil((gamma - alpha) / beta - lo - 1e-12), 0), n) if gamma > alpha else 0.0
            else:
                n_compute = n if gamma > alpha else 0.0
            first = lo + n_compute  # memory-bound from here to hi - 1
            n_memory = n - n_compute
            total += gamma * n_compute + alpha * n_memory + beta * (first + hi - 1.0) * n_memory / 2.0
        lo = hi
    return total


def engine_finish_times_s(
    lengths_tokens: Sequence[int] | NDArray[np.integer],
    max_batch: int,
    a_s: float,
    b_s: float,
    *,
    r_s: float = 0.0,
    f_s: float = 0.0,
    prompt_tokens: float = 0.0,
) -> NDArray[np.float64]:
    """Seconds from the phase's start until each sequence's last token, on one engine.

    Step ``t`` takes (08.3) with the sequences running at ``t`` (:func:`engine_schedule`); a
    sequence finishes at the end of step ``end_step - 1``.
    """
    start, end = engine_schedule(lengths_tokens, max_batch)
    if end.size == 0:
        return np.zeros(0)
    clock_s = _step_clock_s(start, end, StepCosts(a_s, b_s, r_s, f_s), prompt_tokens)
    return clock_s[end - 1]


def deal_to_engines(lengths_tokens: Sequence[int] | NDArray[np.integer], n_engines: int) -> list[NDArray[np.int64]]:
    """The batch dealt round robin: engine ``e`` gets samples ``e, e + E, e + 2E, ...`` in order."""
    if n_engines < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines}")
    lengths = _as_lengths(lengths_tokens)
    return [lengths[e::n_engines] for e in range(n_engines)]


def generation_time_s(
    lengths_tokens: Sequence[int] | NDArray[np.integer],
    n_engines: int,
    max_batch: int,
    a_s: float,
    b_s: float,
    *,
    r_s: float = 0.0,
    f_s: float = 0.0,
    prompt_tokens: float = 0.0,
) -> float:
    """Seconds until the last answer of the batch is done (08.7): the slowest engine's sum of steps.

    Exact for the shared model of an engine (continuous batching, step (08.3)). For a linear
    engine (``r_s = f_s = 0``) each engine's sum collapses to ``a_s * steps + b_s * tokens``.
    """
    worst_s = 0.0
    costs = StepCosts(a_s, b_s, r_s, f_s)
    linear = r_s == 0.0 and f_s == 0.0
    for share in deal_to_engines(lengths_tokens, n_engines):
        if share.size == 0:
            continue
        if not linear and share.size <= max_batch:  # every sequence starts at once: closed form
            worst_s = max(worst_s, _phase_all_start_s(share, costs, prompt_tokens))
            continue
        start, end = engine_schedule(share, max_batch)
        if linear:
            t = a_s * float(end.max()) + b_s * float(share.sum())
        else:
            t = float(_step_clock_s(start, end, costs, prompt_tokens)[-1])
        worst_s = max(worst_s, t)
    return worst_s


# --------------------------------------------------------------------------------------
# 3. The invariants
# --------------------------------------------------------------------------------------


def production_tokens_per_s(n_samplers: int, max_batch: int, a_s: float, b_s: float) -> float:
    """``P = N_s * p``: tokens/s of ``n_samplers`` full linear engines (08.4, 08.6)."""
    return n_samplers * engine_tokens_per_s(max_batch, a_s, b_s)


def consumption_tokens_per_s(n_trainers: int, train_tokens_per_s_per_gpu: float) -> float:
    """``C = N_t * c``: tokens/s that ``n_trainers`` data-parallel trainers consume (08.5, 08.6)."""
    return n_trainers * train_tokens_per_s_per_gpu


def balanced_samplers(n_gpus: int, production_per_gpu: float, consumption_per_gpu: float) -> float:
    """The real-valued ``N_s`` with ``N_s * p = (N - N_s) * c``: ``N * c / (p + c)`` (08.6)."""
    if production_per_gpu <= 0 or consumption_per_gpu <= 0:
        raise ValueError("production_per_gpu and consumption_per_gpu must be > 0")
    return n_gpus * consumption_per_gpu / (production_per_gpu + consumption_per_gpu)


# --------------------------------------------------------------------------------------
# 5. The system and the layouts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemSpec:
    """One RL system to predict: engine and trainer rates, batch, lengths, split and staleness bound.

    Attributes:
        n_gpus: ``N``, all GPUs (or tensor-parallel units: see :func:`spec_from_hardware`).
        batch_samples: samples (sequences) per optimizer step, ``B``.
        max_batch: sequences one engine holds at once, ``B_max`` (08.2).
        a_s, b_s: decode-step seconds: per step and per running sequence (08.3).
        train_tokens_per_s_per_gpu: ``c`` (08.5), answer tokens/s per trainer GPU.
        answer_tokens: every batch's answer lengths, in the order dealt to the engines
            (a tuple of ``batch_samples`` ints), or one int for equal lengths.
        n_samplers: sampler GPUs ``N_s`` of a split layout (``1 .. N - 1``; trainers are
            the rest). ``None`` until chosen (:func:`best_split` chooses it); ignored by
            ``sync_colocated``, where all ``N`` GPUs do both.
        weight_sync_s: seconds for new weights to reach the samplers after a step, ``d``.
        max_lag: the staleness bound ``eta_s`` (optimizer steps): the pipeline's admission
            window is ``(max_lag + 1) B`` held samples, and a split is feasible only if its
            maximum lag is at most ``max_lag``. May be fractional for the window (verl's
            ``staleness_threshold``); the hard rules bound lags by ``floor(max_lag)``.
        admission: what the pipeline's trainer does with a straggler: ``"fifo"``, ``"wait"``
            or ``"drop"`` (module docstring, section 7).
        r_s: decode seconds per resident KV token per step (08.3; 0 for a linear engine).
        f_s: decode seconds of compute per token processed (08.3; 0 for a linear engine).
        prompt_tokens: ``P``, prompt tokens per sample (KV, prefill; the trainer's share is in ``c``).
        batches_per_generation: ``K``, batches a synchronous layout generates per weight version
            (PipelineRL's conventional baseline takes several optimizer steps per round).
        min_trainers: ``N_t_min`` of (08.5b): fewer trainers cannot hold the training state.
        max_dropped_fraction: the most a "drop" pipeline may abort (:data:`MAX_DROPPED_FRACTION`
            by default): past it, it trains on a sample biased towards short answers.
        round_answer_tokens: all ``K * batch_samples`` answer lengths of one generation round of
            a synchronous layout, batch after batch, each batch drawn independently (e.g.
            ``LengthDist.batch(K * batch_samples, seed)``). ``None`` (the default): the round is
            ``answer_tokens`` repeated ``K`` times, so every engine gets the same answers ``K``
            times -- a too-even load whenever ``K > 1``; give the round to avoid it.
        sync_blocks_trainer: whether the trainer GPUs stop for the weight sync ``d`` after
            every step (they send the weights). ``True`` (the default): a trainer-bound
            pipeline consumes ``C_d = G / (G / (N_t c) + d)`` tokens/s instead of ``N_t c``
            (08.11). ``False``: the sync overlaps the next step (the samplers still wait ``d``).
            The synchronous layouts always count ``d`` in their step (08.8-08.10).
    """

    n_gpus: int
    batch_samples: int
    max_batch: int
    a_s: float
    b_s: float
    train_tokens_per_s_per_gpu: float
    answer_tokens: int | tuple[int, ...]
    n_samplers: int | None = None
    weight_sync_s: float = 0.0
    max_lag: float = 1
    admission: Admission = "fifo"
    r_s: float = 0.0
    f_s: float = 0.0
    prompt_tokens: float = 0.0
    batches_per_generation: int = 1
    min_trainers: int = 1
    max_dropped_fraction: float = 0.02
    round_answer_tokens: tuple[int, ...] | None = None
    sync_blocks_trainer: bool = True

    def __post_init__(self) -> None:
        if self.n_gpus < 1:
            raise ValueError(f"n_gpus must be >= 1, got {self.n_gpus}")
        if self.batch_samples < 1:
            raise ValueError(f"batch_samples must be >= 1, got {self.batch_samples}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if min(self.a_s, self.b_s, self.r_s, self.f_s) < 0 or self.a_s + self.b_s + self.f_s <= 0:
            raise ValueError(
                f"need a_s, b_s, r_s, f_s >= 0 and a decode step that takes time, got a_s={self.a_s}, "
                f"b_s={self.b_s}, r_s={self.r_s}, f_s={self.f_s}"
            )
        if self.train_tokens_per_s_per_gpu <= 0:
            raise ValueError(f"train_tokens_per_s_per_gpu must be > 0, got {self.train_tokens_per_s_per_gpu}")
        if self.weight_sync_s < 0:
            raise ValueError(f"weight_sync_s must be >= 0, got {self.weight_sync_s}")
        if not (isinstance(self.max_lag, int | float) and not math.isnan(self.max_lag) and self.max_lag >= 0):
            raise ValueError(
                f"max_lag must be a number >= 0 (optimizer steps; math.inf: unbounded), got {self.max_lag!r}"
            )
        if math.isinf(self.max_lag) and self.admission != "fifo":
            raise ValueError(f"admission={self.admission!r} needs a finite max_lag to bound lags by")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"unknown admission {self.admission!r}: use one of {', '.join(ADMISSIONS)}")
        if self.admission != "fifo" and 0 < self.max_lag < 1:
            raise ValueError(
                f"admission={self.admission!r} bounds every lag by floor(max_lag) = 0 steps at max_lag={self.max_lag}: "
                "that is synchronous RL (max_lag=0), or use admission='fifo' for a fractional window"
            )
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.batches_per_generation < 1:
            raise ValueError(f"batches_per_generation must be >= 1, got {self.batches_per_generation}")
        if self.min_trainers < 1:
            raise ValueError(f"min_trainers must be >= 1, got {self.min_trainers}")
        if not 0.0 <= self.max_dropped_fraction < 1.0:
            raise ValueError(f"max_dropped_fraction must be in [0, 1), got {self.max_dropped_fraction}")
        if isinstance(self.answer_tokens, int):
            if self.answer_tokens < 1:
                raise ValueError(f"answer_tokens must be >= 1, got {self.answer_tokens}")
        else:
            if len(self.answer_tokens) != self.batch_samples:
                raise ValueError(
                    f"answer_tokens has {len(self.answer_tokens)} lengths but batch_samples={self.batch_samples}: "
                    "give one length per sample of the batch (LengthDist.batch) or a single int"
                )
            _as_lengths(self.answer_tokens)
        if self.round_answer_tokens is not None:
            k, b = self.batches_per_generation, self.batch_samples
            if len(self.round_answer_tokens) != k * b:
                raise ValueError(
                    f"round_answer_tokens has {len(self.round_answer_tokens)} lengths but one generation round holds "
                    f"batches_per_generation * batch_samples = {k} * {b} = {k * b}: give every answer of the round "
                    f"(LengthDist.batch({k * b}, seed)), or None to repeat answer_tokens {k} times"
                )
            _as_lengths(self.round_answer_tokens)
        if not isinstance(self.sync_blocks_trainer, bool):
            raise ValueError(f"sync_blocks_trainer must be True or False, got {self.sync_blocks_trainer!r}")
        if self.n_samplers is not None and not 1 <= self.n_samplers <= self.n_gpus - 1:
            raise ValueError(
                f"n_samplers={self.n_samplers} is out of range: a split layout needs 1 <= n_samplers <= "
                f"n_gpus - 1 = {self.n_gpus - 1} (at least one sampler and one trainer)"
            )

    # Derived figures are cached: the solvers below evaluate l(B) thousands of times per split.
    @cached_property
    def lengths_tokens(self) -> NDArray[np.int64]:
        """``[batch_samples]`` answer lengths of one batch (read-only)."""
        if isinstance(self.answer_tokens, int):
            out = np.full(self.batch_samples, self.answer_tokens, dtype=np.int64)
        else:
            out = np.asarray(self.answer_tokens, dtype=np.int64)
        out.setflags(write=False)
        return out

    @cached_property
    def round_lengths_tokens(self) -> NDArray[np.int64]:
        """``[K * batch_samples]`` answer lengths of one synchronous generation round (read-only):
        ``round_answer_tokens`` when given, else ``answer_tokens`` tiled ``K`` times."""
        if self.round_answer_tokens is None:
            out = np.tile(self.lengths_tokens, self.batches_per_generation)
        else:
            out = np.asarray(self.round_answer_tokens, dtype=np.int64)
        out.setflags(write=False)
        return out

    @cached_property
    def batch_tokens(self) -> float:
        """``G``: generated tokens per batch (what one optimizer step trains on)."""
        return float(self.lengths_tokens.sum())

    @cached_property
    def mean_answer_tokens(self) -> float:
        return self.batch_tokens / self.batch_samples

    @property
    def n_trainers(self) -> int | None:
        """``N - N_s`` trainer GPUs of a split layout (``None`` while ``n_samplers`` is)."""
        return None if self.n_samplers is None else self.n_gpus - self.n_samplers

    @property
    def lag_bound(self) -> int:
        """The bound on every sample's lag: ``floor(max_lag)`` (lags are whole steps)."""
        return sys.maxsize if math.isinf(self.max_lag) else math.floor(self.max_lag + 1e-9)

    @property
    def costs(self) -> StepCosts:
        return StepCosts(self.a_s, self.b_s, self.r_s, self.f_s)

    @cached_property
    def resident_tokens(self) -> float:
        """``R`` (08.2) of this batch's lengths."""
        return resident_tokens(self.lengths_tokens, self.prompt_tokens)

    def latency_s(self, batch: float) -> float:
        """Steady-state ``l(B)`` (08.3): ``R_t = B R`` resident, the spread prefill ``P B / E[L]`` per step."""
        memory = self.a_s + self.b_s * batch + self.r_s * batch * self.resident_tokens
        compute = self.f_s * batch * (1.0 + self.prompt_tokens / self.mean_answer_tokens)
        return max(memory, compute)

    def engine_tokens_per_s(self, batch: float) -> float:
        """One engine's answer tokens/s with ``batch`` sequences: ``B / l(B)``."""
        return batch / self.latency_s(batch)

    @property
    def engine_full_tokens_per_s(self) -> float:
        """``p = B_max / l(B_max)`` (08.4)."""
        return self.engine_tokens_per_s(self.max_batch)


def spec_from_hardware(
    shape: ModelShape,
    gpu: GPU,
    *,
    n_gpus: int,
    batch_samples: int,
    answer_tokens: int | tuple[int, ...],
    prompt_tokens: float = 0.0,
    generation_limit: int | None = None,
    kv: Literal["paged", "reserve"] = "paged",
    max_num_seqs: int | None = None,
    mfu: float = 0.4,
    memory_fraction: float = 0.9,
    efficiency: float = 0.7,
    extra_forward_passes: int = 0,
    weight_sync_s: float = 0.0,
    max_lag: float = 1,
    admission: Admission = "fifo",
    batches_per_generation: int = 1,
    n_samplers: int | None = None,
    round_answer_tokens: tuple[int, ...] | None = None,
    sync_blocks_trainer: bool = True,
) -> SystemSpec:
    """A :class:`SystemSpec` from first principles: (08.2) ``B_max`` from the paged resident tokens
    (or, ``kv="reserve"``, the full context ``prompt_tokens + generation_limit``), capped at
    ``max_num_seqs``; (08.3) step terms at ``efficiency`` of peak; (08.5) ``c`` over prompt and answer
    tokens with ``extra_forward_passes``; (08.5b) the fewest trainers that hold the Adam state.

    With a ``generation_limit`` and a batch of lengths, the batch's longest answer is raised to
    the limit: a planner sizes a layout for the batch that holds an answer at the limit, which
    any batch may (with a tail that reaches the limit, a large batch nearly always does). A
    ``round_answer_tokens`` (``K`` batches of a synchronous round, see :class:`SystemSpec`) gets
    the same treatment batch by batch.
    """

    def raise_longest(batch: Sequence[int]) -> tuple[int, ...]:
        raised = list(batch)
        if generation_limit is None:
            return tuple(int(t) for t in raised)
        if max(raised) > generation_limit:
            raise ValueError(f"an answer of {max(raised)} tokens is past generation_limit={generation_limit}")
        raised[int(np.argmax(raised))] = generation_limit
        return tuple(int(t) for t in raised)

    if generation_limit is not None and not isinstance(answer_tokens, int):
        answer_tokens = raise_longest(answer_tokens)
    if round_answer_tokens is not None and generation_limit is not None:
        b = batch_samples
        round_answer_tokens = tuple(
            t for i in range(0, len(round_answer_tokens), b) for t in raise_longest(round_answer_tokens[i : i + b])
        )
    probe = SystemSpec(
        n_gpus=n_gpus, batch_samples=batch_samples, max_batch=1, a_s=1.0, b_s=0.0,
        train_tokens_per_s_per_gpu=1.0, answer_tokens=answer_tokens,
    )  # fmt: skip
    lengths = probe.lengths_tokens
    if kv == "paged":
        context = resident_tokens(lengths, prompt_tokens)
    elif kv == "reserve":
        limit = generation_limit if generation_limit is not None else int(lengths.max())
        context = prompt_tokens + limit
    else:
        raise ValueError(f"kv must be 'paged' or 'reserve', got {kv!r}")
    b_max = max_batch(shape, gpu, max(context, 1.0), memory_fraction)
    if max_num_seqs is not None:
        b_max = min(b_max, max_num_seqs)
    costs = step_costs(shape, gpu, efficiency)
    c = train_tokens_per_s_per_gpu(
        shape, gpu, mfu, mean_answer_tokens=float(lengths.mean()), prompt_tokens=prompt_tokens,
        extra_forward_passes=extra_forward_passes,
    )  # fmt: skip
    return SystemSpec(
        n_gpus=n_gpus,
        batch_samples=batch_samples,
        max_batch=b_max,
        a_s=costs.a_s,
        b_s=costs.b_s,
        r_s=costs.r_s,
        f_s=costs.f_s,
        prompt_tokens=prompt_tokens,
        train_tokens_per_s_per_gpu=c,
        answer_tokens=answer_tokens,
        n_samplers=n_samplers,
        weight_sync_s=weight_sync_s,
        max_lag=max_lag,
        admission=admission,
        batches_per_generation=batches_per_generation,
        min_trainers=min_trainers(shape, gpu, memory_fraction),
        round_answer_tokens=round_answer_tokens,
        sync_blocks_trainer=sync_blocks_trainer,
    )


@dataclass(frozen=True)
class Prediction:
    """The model's steady state of one layout.

    Attributes:
        layout: the layout's name.
        n_samplers, n_trainers: GPUs per role (``N`` and ``N`` for sync_colocated).
        tokens_per_s: generated answer tokens trained on per second.
        step_s: seconds per optimizer step (``G / tokens_per_s``; drop: the kept tokens).
        generation_s: sync layouts: one generation round (08.7); pipeline: the mean sample's
            generation time, ``E[L] l(B_eff)``.
        train_s: one optimizer step's compute, ``G / (n_trainers * c)``.
        sampler_idle_fraction: ``1 - tokens_per_s / (n_samplers * p)``: the share of the
            samplers' full-batch capacity not used.
        trainer_idle_fraction: ``1 - tokens_per_s / (n_trainers * c)``.
        mean_lag_steps, max_lag_steps: staleness in optimizer steps (08.12, 08.13; the hard
            rules cap the maximum at ``floor(max_lag)``).
        engine_batch: sequences per engine in steady state (pipeline ``B_eff``; sync layouts:
            the engines' starting batch).
        cap_binds: pipeline only: the admission window keeps engines below ``max_batch``.
        admission: the pipeline's rule (``None`` for the synchronous layouts).
        wait_binds: ``"wait"``: stragglers set the trainer's pace (08.14).
        dropped_fraction: ``"drop"``: the share of started samples aborted (08.15).
        infeasible: why this split breaks a constraint (trainer memory, the lag bound), or ``None``.
    """

    layout: Layout
    n_samplers: int
    n_trainers: int
    tokens_per_s: float
    step_s: float
    generation_s: float
    train_s: float
    sampler_idle_fraction: float
    trainer_idle_fraction: float
    mean_lag_steps: float
    max_lag_steps: int
    engine_batch: float
    cap_binds: bool = False
    admission: Admission | None = None
    wait_binds: bool = False
    dropped_fraction: float = 0.0
    infeasible: str | None = None

    @property
    def feasible(self) -> bool:
        return self.infeasible is None


def _check_layout(layout: str) -> Layout:
    for name in LAYOUTS:
        if layout == name:
            return name
    raise ValueError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")


def _split(spec: SystemSpec, layout: Layout) -> tuple[int, int]:
    if layout == "sync_colocated":
        return spec.n_gpus, spec.n_gpus
    if spec.n_samplers is None:
        raise ValueError(f"layout {layout!r} needs spec.n_samplers (1 .. n_gpus - 1), or let best_split choose it")
    return spec.n_samplers, spec.n_gpus - spec.n_samplers


#: ``Prediction.max_lag_steps`` of a pipeline whose lag grows without bound (``max_lag = math.inf``
#: and trainer-bound: finished samples queue up forever); its ``mean_lag_steps`` is ``math.inf``.
#: The largest int64, so that it fits :class:`SplitSweep`'s integer array; feasible only under
#: ``max_lag = math.inf`` (no bound to break).
UNBOUNDED_LAG = sys.maxsize

#: The most a "drop" pipeline may abort: past it, it trains on a sample biased towards short answers
#: (2%: a straggler tail of about 1%, the talk's, may be dropped whole, with room for the variation).
MAX_DROPPED_FRACTION = 0.02


def _infeasible(spec: SystemSpec, n_trainers: int, max_lag_steps: int, dropped: float = 0.0) -> str | None:
    if n_trainers < spec.min_trainers:
        return f"trainer memory: {n_trainers} trainer(s) cannot hold the training state (needs >= {spec.min_trainers}, 08.5b)"
    if max_lag_steps > spec.max_lag + 1e-9:
        return f"max lag {max_lag_steps} > max_lag {spec.max_lag:g}"
    if dropped > spec.max_dropped_fraction:
        return (
            f"drops {dropped:.1%} of its samples (> {spec.max_dropped_fraction:.0%}: a sample biased to short answers)"
        )
    return None


def _synchronous(layout: Layout, spec: SystemSpec, n_samplers: int, n_trainers: int) -> Prediction:
    """sync_colocated (08.8), sync_split (08.9), one_step (08.10): ``K`` batches per generation round.

    The round's answers are ``spec.round_answer_tokens`` when given (``K`` batches drawn
    independently); otherwise the one batch ``answer_tokens`` repeated ``K`` times, which deals
    every engine the same answers ``K`` times (an evener load than independent batches give).
    ``G_r`` is the round's answer tokens (``K G`` when tiled); ``train_s`` is one step's share.
    """
    k = spec.batches_per_generation
    lengths = spec.round_lengths_tokens
    round_tokens = float(lengths.sum())
    gen_s = generation_time_s(
        lengths, n_samplers, spec.max_batch, spec.a_s, spec.b_s, r_s=spec.r_s, f_s=spec.f_s,
        prompt_tokens=spec.prompt_tokens,
    )  # fmt: skip
    train_s = round_tokens / k / (n_trainers * spec.train_tokens_per_s_per_gpu)
    if layout == "one_step":
        round_s, lag_lo = max(gen_s, k * train_s + spec.weight_sync_s), 1
    else:
        round_s, lag_lo = gen_s + k * train_s + spec.weight_sync_s, 0
    tokens_per_s = round_tokens / round_s
    max_lag = lag_lo + k - 1
    return Prediction(
        layout=layout,
        n_samplers=n_samplers,
        n_trainers=n_trainers,
        tokens_per_s=tokens_per_s,
        step_s=round_s / k,
        generation_s=gen_s,
        train_s=train_s,
        sampler_idle_fraction=1.0 - tokens_per_s / (n_samplers * spec.engine_full_tokens_per_s),
        trainer_idle_fraction=1.0 - tokens_per_s / (n_trainers * spec.train_tokens_per_s_per_gpu),
        mean_lag_steps=lag_lo + (k - 1) / 2,
        max_lag_steps=max_lag,
        engine_batch=float(min(spec.max_batch, math.ceil(k * spec.batch_samples / n_samplers))),
        infeasible=_infeasible(spec, n_trainers, max_lag),
    )


def _bisect_rate(h: Callable[[float], float], hi: float) -> float:
    """The largest ``X`` in ``(0, hi]`` with ``h(X) >= X`` (``h`` non-increasing in ``X``: a fixed point)."""
    if h(hi) >= hi:
        return hi
    lo = 0.0
    for _ in range(50):  # 2^-50: far below any printed digit
        mid = 0.5 * (lo + hi)
        if h(mid) >= mid:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class _Flow:
    """The pipeline's engines at a given throughput ``X`` (08.11)."""

    in_flight: float  # sequences allowed in flight, all engines
    engine_batch: float  # B_eff
    production: float  # answer tokens/s the engines make at B_eff
    latency_s: float  # l(B_eff)


def _flow(spec: SystemSpec, n_samplers: int, tokens_per_s: float, consumption: float, batch_tokens: float) -> _Flow:
    b = spec.batch_samples
    step_s = batch_tokens / tokens_per_s if tokens_per_s > 0 else math.inf
    busy = (tokens_per_s / consumption if consumption > 0 else 0.0) + spec.weight_sync_s / step_s
    in_flight = max(0.0, (spec.max_lag + 1.0) * b - b * (0.5 + busy))
    in_flight = min(in_flight, n_samplers * spec.max_batch)
    if in_flight >= n_samplers:
        engine_batch = in_flight / n_samplers
        lat = spec.latency_s(engine_batch)
        production = n_samplers * engine_batch / lat
    else:  # fewer sequences than engines: each runs alone
        engine_batch = in_flight / n_samplers
        lat = spec.latency_s(1.0)
        production = in_flight / lat
    return _Flow(in_flight, engine_batch, production, lat)


def _mean_lag(
    spec: SystemSpec, flow: _Flow, rate: float, consumption: float, train_rate: float, step_s: float
) -> float:
    """(08.12): Little's law on the samples the window holds before their update starts.

    A sample is held from its first token until the update that trains on it: in flight, then
    queued. Held samples leave at ``B`` per step, so the mean time from first token to update is
    ``(in_flight + queued) / B`` steps, and its weights were already ``d / step`` old:

    * sampler-bound (``rate < consumption``): the trainer takes each batch as soon as it is
      complete, so on average half a batch is queued: ``queued = B / 2``;
    * trainer-bound: finished samples pile up until the window is full; what the window does
      not spend on the batch being trained and the one being synced is in flight or queued:
      ``in_flight + queued = (max_lag + 1) B - B (T_train + d) / step``. Unbounded
      (``max_lag = inf``): the queue grows without end and so does the lag (``math.inf``).

    The two agree at the balance point whenever the window, not the engines' ``B_max``, sets
    what is in flight there. Where ``N_s B_max`` is smaller than the window, the queue
    jumps from half a batch to the rest of the window as production passes consumption: a
    real step in the steady state (a critically loaded queue), which the simulator
    (:mod:`course_lib.layout.sim`) shows too. Capped at ``max_lag``.
    """
    b, d = spec.batch_samples, spec.weight_sync_s
    if rate >= consumption * (1 - 1e-9):  # trainer-bound
        if math.isinf(spec.max_lag):
            return math.inf
        busy = rate / train_rate + d / step_s  # the training batch and the syncing one, in batches
        held = (spec.max_lag + 1.0) * b - b * busy
    else:
        held = flow.in_flight + b / 2  # in flight (at most N_s B_max) and half a batch queued
    return min(float(spec.max_lag), held / b + d / step_s)


def _deadline_rate(
    batch_tokens: float, longest_tokens: float, latency_s: float, weight_sync_s: float, bound: int
) -> float:
    """The most tokens/s a waiting trainer allows: (08.14) turned into a rate (exercise 3)."""
    return batch_tokens * bound / (longest_tokens * latency_s + weight_sync_s)


def _wait_rule(
    spec: SystemSpec, n_samplers: int, fifo_rate: float, train_rate: float, lengths: NDArray[np.float64]
) -> tuple[float, float | None]:
    """(08.14), the "wait" rule: the trainer waits for a straggler when its deadline comes, so
    the step is at least the longest answer's generation (plus the sync) over the bound.

    While the trainer waits, the window fills with finished samples and the engines run only
    what is consumed: the straggler decodes in a lighter engine, which shortens the wait. The
    rate is the fixed point of the two. Returns the rate and, where waiting binds, the engine
    batch it runs at (``None`` where the FIFO pace already meets every deadline)."""
    g, d, bound = spec.batch_tokens, spec.weight_sync_s, spec.lag_bound
    l_max = float(lengths.max())
    cap_batch = _flow(spec, n_samplers, fifo_rate, train_rate, g).engine_batch

    def batch_for(x: float) -> float:
        """The smallest engine batch B with N_s B / l(B) >= x: what the engines run to make x."""
        lo, hi = 0.0, max(cap_batch, 1e-9)
        if n_samplers * spec.engine_tokens_per_s(hi) <= x:
            return hi
        for _ in range(40):
            mid = 0.5 * (lo + hi)
            if n_samplers * spec.engine_tokens_per_s(max(mid, 1e-12)) >= x:
                hi = mid
            else:
                lo = mid
        return hi

    def wait_rate(x: float) -> float:
        lat = spec.latency_s(max(batch_for(x), 1.0))  # the straggler runs in a batch of at least itself
        return min(fifo_rate, _deadline_rate(g, l_max, lat, d, bound))

    waited = _bisect_rate(wait_rate, fifo_rate)
    if waited < fifo_rate * (1 - 1e-9):
        return waited, max(batch_for(waited), 1.0)
    return waited, None


def _drop_rule(
    spec: SystemSpec,
    n_samplers: int,
    fifo_rate: float,
    train_rate: float,
    consumption: float,
    lengths: NDArray[np.float64],
) -> tuple[float, float, float]:
    """(08.15), the "drop" rule: answers that cannot finish within the bound's deadline are
    aborted; the trainer gets the kept ones, and the engines' work on the dropped is wasted.

    Starts from the FIFO pace and lets the cut tighten the step until it settles: the first
    fixed point below the FIFO step (the low-drop one; a system that drops hard can also
    settle into training on short answers only, which this model does not pick). Returns the
    useful rate, the kept tokens per batch and the dropped fraction (rate 0: nothing kept)."""
    g, b, d, bound = spec.batch_tokens, spec.batch_samples, spec.weight_sync_s, spec.lag_bound
    rate, kept_tokens, dropped = fifo_rate, g, 0.0
    step_s = g / rate
    for _ in range(200):
        flow = _flow(spec, n_samplers, kept_tokens / step_s, train_rate, kept_tokens)
        cut = max(0.0, (bound * step_s - d) / flow.latency_s)  # the longest answer that makes its deadline
        keep = lengths <= cut
        if not keep.any():
            return 0.0, kept_tokens, 1.0
        useful = flow.production * float(np.sum(lengths[keep])) / float(np.sum(np.minimum(lengths, cut)))
        rate = min(useful, consumption)
        kept_tokens = float(lengths[keep].mean()) * b
        dropped = float(1.0 - keep.mean())
        new_step = kept_tokens / rate
        if abs(new_step - step_s) <= 1e-9 * step_s:
            break
        step_s = new_step
    return rate, kept_tokens, dropped


def _pipeline(spec: SystemSpec, n_samplers: int, n_trainers: int) -> Prediction:
    """pipeline: (08.11) throughput, (08.12) mean lag, (08.13) max lag, (08.14)/(08.15) the hard rules."""
    if spec.max_lag == 0:  # one batch admitted at a time, released when its weights arrive: sync_split
        one_batch = replace(spec, batches_per_generation=1, round_answer_tokens=None)
        sync = _synchronous("sync_split", one_batch, n_samplers, n_trainers)
        return replace(sync, layout="pipeline", admission=spec.admission)
    lengths = spec.lengths_tokens.astype(np.float64)
    g, d = spec.batch_tokens, spec.weight_sync_s
    train_rate = consumption_tokens_per_s(n_trainers, spec.train_tokens_per_s_per_gpu)  # N_t c
    # what the trainers consume when they are the bottleneck: they also stop for the sync (08.11)
    consumption = g / (g / train_rate + d) if spec.sync_blocks_trainer else train_rate
    full = n_samplers * spec.engine_full_tokens_per_s
    bound = spec.lag_bound
    dropped, wait_binds, kept_tokens = 0.0, False, g

    def fifo_rate(x: float) -> float:
        return min(_flow(spec, n_samplers, x, train_rate, g).production, consumption)

    rate = _bisect_rate(fifo_rate, min(full, consumption))
    engine_batch_override: float | None = None
    if spec.admission == "wait":
        rate, engine_batch_override = _wait_rule(spec, n_samplers, rate, train_rate, lengths)
        wait_binds = engine_batch_override is not None
    elif spec.admission == "drop":
        rate, kept_tokens, dropped = _drop_rule(spec, n_samplers, rate, train_rate, consumption, lengths)
    if rate <= 0:
        raise ValueError(
            f"the pipeline on {n_samplers} samplers makes no progress under admission={spec.admission!r}: "
            "no answer finishes within the lag bound; raise max_lag or use admission='fifo'"
        )
    flow = _flow(spec, n_samplers, rate, train_rate, kept_tokens)
    if engine_batch_override is not None:  # "wait": the engines run what is consumed (08.14)
        flow = _Flow(flow.in_flight, engine_batch_override, rate, spec.latency_s(engine_batch_override))
    step_s = kept_tokens / rate
    mean_lag = _mean_lag(spec, flow, rate, consumption, train_rate, step_s)
    extra_s = (float(lengths.max()) - float(lengths.mean())) * flow.latency_s
    # unbounded window, trainer-bound: the queue grows without end
    max_lag = UNBOUNDED_LAG if math.isinf(mean_lag) else math.ceil(mean_lag + extra_s / step_s - 1e-9)
    if spec.admission != "fifo":
        max_lag = min(max_lag, bound)
    return Prediction(
        layout="pipeline",
        n_samplers=n_samplers,
        n_trainers=n_trainers,
        tokens_per_s=rate,
        step_s=step_s,
        generation_s=float(lengths.mean()) * flow.latency_s,
        train_s=kept_tokens / train_rate,
        sampler_idle_fraction=1.0 - rate / full,
        trainer_idle_fraction=1.0 - rate / train_rate,
        mean_lag_steps=mean_lag,
        max_lag_steps=max_lag,
        engine_batch=flow.engine_batch,
        cap_binds=flow.engine_batch < spec.max_batch - 1e-9,
        admission=spec.admission,
        wait_binds=wait_binds,
        dropped_fraction=dropped,
        infeasible=_infeasible(spec, n_trainers, max_lag, dropped),
    )


def predict(layout: str, spec: SystemSpec) -> Prediction:
    """The model's steady state of ``layout`` on ``spec`` (equations 08.7 to 08.15)."""
    name = _check_layout(layout)
    n_samplers, n_trainers = _split(spec, name)
    if name == "pipeline":
        return _pipeline(spec, n_samplers, n_trainers)
    return _synchronous(name, spec, n_samplers, n_trainers)


# --------------------------------------------------------------------------------------
# 6. Choosing the split
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitSweep:
    """Every split of a layout: ``[N - 1]`` arrays indexed by ``n_samplers = 1 .. N - 1``."""

    layout: Layout
    n_samplers: NDArray[np.int64]
    tokens_per_s: NDArray[np.float64]
    mean_lag_steps: NDArray[np.float64]
    max_lag_steps: NDArray[np.int64]
    feasible: NDArray[np.bool_]
    infeasible: tuple[str | None, ...]


def sweep(layout: str, spec: SystemSpec) -> SplitSweep:
    """Predict ``layout`` at every split ``n_samplers = 1 .. N - 1`` (``spec.n_samplers`` is
    replaced); ``feasible`` marks the splits whose trainers hold the model and whose maximum
    lag is at most ``spec.max_lag`` under ``spec.admission``."""
    name = _check_layout(layout)
    if name == "sync_colocated":
        raise ValueError("sync_colocated has no split to sweep: every GPU samples and trains (use predict)")
    if spec.n_gpus < 2:
        raise ValueError(f"a split layout needs n_gpus >= 2, got {spec.n_gpus}")
    preds = [predict(name, replace(spec, n_samplers=n)) for n in range(1, spec.n_gpus)]
    return SplitSweep(
        layout=name,
        n_samplers=np.arange(1, spec.n_gpus, dtype=np.int64),
        tokens_per_s=np.array([p.tokens_per_s for p in preds]),
        mean_lag_steps=np.array([p.mean_lag_steps for p in preds]),
        max_lag_steps=np.array([p.max_lag_steps for p in preds], dtype=np.int64),
        feasible=np.array([p.feasible for p in preds], dtype=np.bool_),
        infeasible=tuple(p.infeasible for p in preds),
    )


@dataclass(frozen=True)
class SplitResult:
    """The best split of a layout and how much one GPU either way costs.

    Attributes:
        prediction: the best feasible split's prediction (its ``n_samplers``).
        below_tokens_per_s, above_tokens_per_s: throughput with one sampler fewer / more
            (``None`` off the range ``1 .. N - 1``; given whether or not feasible).
    """

    prediction: Prediction
    below_tokens_per_s: float | None
    above_tokens_per_s: float | None

    @property
    def n_samplers(self) -> int:
        return self.prediction.n_samplers

    @property
    def off_by_one_loss_fraction(self) -> float:
        """``1 - best neighbour / best``: what a split one GPU off loses (0 without neighbours)."""
        neighbours = [t for t in (self.below_tokens_per_s, self.above_tokens_per_s) if t is not None]
        if not neighbours:
            return 0.0
        return 1.0 - max(neighbours) / self.prediction.tokens_per_s


def _why_none(s: SplitSweep) -> str:
    """The constraints that failed, each with the splits it failed at."""
    by_reason: dict[str, list[int]] = {}
    for n, reason in zip(s.n_samplers.tolist(), s.infeasible):
        if reason is not None:
            key = reason.split(":")[0] if reason.startswith("trainer memory") else "max lag"
            by_reason.setdefault(key, []).append(n)
    parts = []
    for key, ns in by_reason.items():
        span = f"N_s={ns[0]}" if len(ns) == 1 else f"N_s={ns[0]}..{ns[-1]}"
        example = next(r for n, r in zip(s.n_samplers.tolist(), s.infeasible) if n == ns[0])
        assert example is not None  # ns lists infeasible splits only
        lags = [int(s.max_lag_steps[n - 1]) for n in ns]
        if key == "max lag" and example.startswith("max lag") and min(lags) != max(lags):
            bound = example.split("> ", 1)[1]  # "max_lag <bound>", as the first split's reason has it
            example = f"max lag {min(lags)}-{max(lags)} > {bound}"  # the span's own maxima
        parts.append(f"{span}: {example}")
    return "; ".join(parts)


def best_split(layout: str, spec: SystemSpec) -> SplitResult:
    """The highest-throughput feasible ``n_samplers`` in ``1 .. N - 1``: trainers that hold the
    model (08.5b) and every sample's lag within ``spec.max_lag`` under ``spec.admission``.

    Ties go to the fewest samplers. ``sync_colocated`` has no split: its one prediction comes
    back, without neighbours. Raises ValueError naming the constraint that failed if no split
    is feasible (e.g. one_step with ``max_lag = 0``, or a FIFO pipeline whose stragglers run
    past the bound at every split).
    """
    name = _check_layout(layout)
    if name == "sync_colocated":
        p = predict(name, spec)
        if not p.feasible:
            raise ValueError(f"sync_colocated on {spec.n_gpus} GPUs is infeasible: {p.infeasible}")
        return SplitResult(p, None, None)
    s = sweep(name, spec)
    if not s.feasible.any():
        rule = f" under admission={spec.admission!r}" if name == "pipeline" else ""
        raise ValueError(f"no split of {spec.n_gpus} GPUs makes {name} feasible{rule}: {_why_none(s)}")
    i = int(np.argmax(np.where(s.feasible, s.tokens_per_s, -np.inf)))
    best = predict(name, replace(spec, n_samplers=int(s.n_samplers[i])))
    below = float(s.tokens_per_s[i - 1]) if i > 0 else None
    above = float(s.tokens_per_s[i + 1]) if i + 1 < s.n_samplers.size else None
    return SplitResult(best, below, above)


# --------------------------------------------------------------------------------------
# 7. Calibrating on measured stage times
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """Two factors that make the model's stage times match measured ones (:func:`calibrate`).

    Attributes:
        decode_scale: multiplies every decode-step cost (``a_s``, ``b_s``, ``r_s``, ``f_s``):
            measured generation seconds over the model's (above 1: the engines ran slower than
            the roofline at ``efficiency``).
        train_scale: multiplies the trainer's seconds, i.e. divides ``c``: measured training
            seconds over the model's (above 1: the trainer ran below the assumed MFU).
    """

    decode_scale: float
    train_scale: float

    def apply(self, spec: SystemSpec) -> SystemSpec:
        """``spec`` with the decode costs times ``decode_scale`` and ``c`` over ``train_scale``.

        Scaling all four step terms by one factor scales every decode step (08.3) and so every
        generation time (08.7) by that factor; ``B_max`` (memory) is unchanged."""
        d = self.decode_scale
        return replace(
            spec,
            a_s=spec.a_s * d,
            b_s=spec.b_s * d,
            r_s=spec.r_s * d,
            f_s=spec.f_s * d,
            train_tokens_per_s_per_gpu=spec.train_tokens_per_s_per_gpu / self.train_scale,
        )


def calibrate(spec: SystemSpec, layout: str, generation_s: float, train_s: float) -> Calibration:
    """The two factors that make ``predict(layout, spec)`` take the measured stage times.

    ``layout`` must be synchronous (``sync_colocated``, ``sync_split``, ``one_step``): its
    generation phase (08.7, one round of ``K`` batches) and its training (one optimizer step,
    old log-probs and reference passes included) are separate, so each measured time pins one
    factor: ``decode_scale = generation_s / predicted generation_s`` and ``train_scale =
    train_s / predicted train_s``. After :meth:`Calibration.apply` the prediction reproduces
    both times exactly; nothing else is fitted. Use the factors on another layout of the same
    hardware and model to predict it from a measured baseline.
    """
    name = _check_layout(layout)
    if name == "pipeline":
        raise ValueError(
            "calibrate needs a synchronous layout (sync_colocated, sync_split, one_step), whose generation and "
            "training are separate phases; a pipeline overlaps them, so its stage times do not pin the two factors"
        )
    for label, value in (("generation_s", generation_s), ("train_s", train_s)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{label} must be a finite number of seconds > 0 (a measured stage time), got {value!r}")
    p = predict(name, spec)
    return Calibration(decode_scale=float(generation_s / p.generation_s), train_scale=float(train_s / p.train_s))
