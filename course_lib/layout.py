r"""Laying out the cluster: a first-principles throughput model for async RL (lesson 08).

The question (Applied Compute's talk "Efficient RL"): given ``N`` GPUs, a training batch
and a maximum staleness the learning algorithm tolerates, how should the GPUs be split
between *samplers* (generating answers) and *trainers* (optimizer steps), and which
layout -- synchronous, one-step off-policy or fully pipelined -- gives the most
generated tokens per second? This module answers it with pen-and-paper physics; the
SimPy simulator of :mod:`course_lib.layout_sim` checks the answers event by event
(both follow one shared definition of the system, stated below).

**1. What one GPU can do.** The models' shapes come from their published
``config.json`` on the Hugging Face hub (:data:`QWEN25_7B`, :data:`QWEN25_32B`). Each
generated token leaves a key and a value vector per layer and KV head in the KV cache::

    kv_bytes_per_token = 2 * n_layers * n_kv_heads * head_dim * kv_bytes_per_elem  (08.1)

(Qwen2.5-7B in bf16: ``2 * 28 * 4 * 128 * 2 = 57,344`` bytes.) The sequences an engine
can hold at once are those whose cache fits beside the weights::

    max_batch = floor((memory_fraction * memory_bytes - weight_bytes) / (kv_bytes_per_token * context_tokens))  (08.2)

One decode step advances every sequence in flight by one token. Decoding is memory
bound: each step reads all the weights once (shared by the batch) and each sequence's
KV cache (one per sequence), and does ``2 * n_params`` FLOPs per sequence. Adding the
three costs (a roofline that assumes no overlap, so slightly pessimistic) gives a
latency linear in the batch ``B``::

    l(B) = a_s + b_s * B  (08.3)
      a_s = weight_bytes / hbm_bytes_per_s
      b_s = kv_bytes_per_token * context_tokens / hbm_bytes_per_s + 2 * n_params / peak_flops

On a real engine, measure ``l(B)`` at a few batch sizes and fit the line
(:func:`fit_decode_latency`). A full engine produces tokens at::

    p = max_batch / l(max_batch)  (08.4)

tokens/s: large batches amortise the weight read, which is why the KV-cache limit
(08.2) is a throughput limit. A trainer GPU costs ``6 * n_params`` FLOPs per token
(forward and backward) at a model-FLOPs utilisation ``mfu``::

    c = mfu * peak_flops / (6 * n_params)  (08.5)

**2. The balance.** ``N_s`` samplers produce ``P = N_s * p`` tokens/s, ``N_t = N - N_s``
trainers consume ``C = N_t * c``. The pipeline runs at ``min(P, C)``; the split that
wastes neither side solves ``N_s * p = (N - N_s) * c``::

    N_s* = N * c / (p + c)  (08.6)

(real-valued: the best integer split is one of its two neighbours, unless a staleness
bound or the straggler moves it.)

**3. The straggler.** A synchronous layout waits for the *last* answer of the batch.
Samples are dealt round robin to the engines (sample ``i`` to engine ``i mod E``, in
the batch's order); each engine runs continuous batching with at most ``max_batch``
sequences, starting its next sequence (in its order) at the step after a slot frees.
The phase ends when the slowest engine ends. With ``l(B)`` linear, the sum of the
per-step latencies ``sum_t l(B_t)`` (``B_t`` = the engine's sequences still running at
step ``t``) collapses to two counts, exactly::

    T_gen = max_e (a_s * S_e + b_s * K_e)  (08.7)

where ``S_e`` is engine ``e``'s number of decode steps (the makespan of its schedule,
:func:`engine_schedule`) and ``K_e`` its number of tokens. A long tail adds steps at
small ``B_t``: each costs ``a_s`` (the weight read) for very few tokens. With equal
lengths and ``max_batch`` dividing the engine's share, (08.7) is ``K_e / p``: the
spec's ideal ``G / (E * p)`` with ``G = batch_samples * mean answer tokens``.

**4. The layouts** (names are the exact strings of :data:`LAYOUTS`). With
``T_train = G / (N_t * c)`` and ``d = weight_sync_s``::

    sync_colocated:  step_s = T_gen(N engines) + G / (N * c) + d  (08.8)
    sync_split:      step_s = T_gen(N_s engines) + T_train + d  (08.9)
    one_step:        step_s = max(T_gen(N_s engines), T_train + d)  (08.10)

and throughput ``G / step_s``. The synchronous layouts have lag 0, one_step has lag 1
(the next batch is generated with the weights before the step that consumes it).

The **pipeline** never waits for a batch: engines stay full by continuous batching, and
finished samples queue for the trainer. Backpressure (the shared spec's rule): an
engine may start a sequence only while fewer than ``(max_lag + 1) * batch_samples``
samples are *held*: started and not yet released, where a sample is released when the
weights of the optimizer step that consumed it have reached the samplers (the step's
end plus ``weight_sync_s``). The batch being trained is held, so ``max_lag *
batch_samples`` is left for sequences in flight; per engine::

    B_eff = min(max_batch, max_lag * batch_samples / N_s)
    tokens_per_s = min(N_s * B_eff / l(B_eff), N_t * c)  (08.11)

With ``max_lag = 0`` the rule admits one batch at a time, released only when its
weights arrive: exactly ``sync_split`` (08.9), which is what the model returns.

**5. Lag from Little's law.** Samples in the system = arrival rate x time in the system,
so a sample's time from start to consumption is ``(in flight + queued) / samples_per_s``,
and dividing by ``step_s = batch_samples / samples_per_s`` counts the optimizer steps
it missed. In flight: ``N_s * B_eff``; queued: about half a batch (the queue fills from 0
to a batch between two steps); the weight sync adds ``d / step_s``::

    mean_lag = min(max_lag, (N_s * B_eff + batch_samples / 2) / batch_samples + d / step_s)  (08.12)

When the trainer is the bottleneck, the cap binds: the system holds exactly
``(max_lag + 1)`` batches, one of them training, and the mean lag is ``max_lag``. The
cap bounds the *mean*; a straggler keeps generating across weight updates, so its lag
is not capped. Its extra tokens over the mean cost ``l(B_eff)`` seconds each::

    max_lag = ceil(mean_lag + (L_max - L_mean) * l(B_eff) / step_s)  (08.13)

All throughputs count generated (answer) tokens only; prompts are ignored in v1
(prefill folded into ``a_s``, training cost counted per answer token). Every batch is
assumed to have the lengths of ``SystemSpec.answer_tokens``.

References: Applied Compute, "Efficient RL" (talk: the throughput question, the
production = consumption invariant, the straggler); AReaL (arXiv 2505.24298, sec. 4.1:
an admission rule bounding staleness); verl's fully-async docs (rollouts in flight
bounded by a staleness threshold); Little (1961), ``L = lambda W``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
from numpy.typing import NDArray

Layout = Literal["sync_colocated", "sync_split", "one_step", "pipeline"]
#: The layouts, by their exact names (shared with :mod:`course_lib.layout_sim`).
LAYOUTS: tuple[Layout, ...] = ("sync_colocated", "sync_split", "one_step", "pipeline")


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


def kv_bytes_per_token(shape: ModelShape) -> float:
    """KV-cache bytes one token occupies (08.1): K and V, every layer and KV head."""
    return 2.0 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem


def max_batch(shape: ModelShape, gpu: GPU, context_tokens: int, memory_fraction: float = 0.9) -> int:
    """Sequences of ``context_tokens`` whose KV cache fits beside the weights (08.2).

    ``memory_fraction`` of the GPU's memory is usable (the rest: activations, CUDA
    context, fragmentation). Raises ValueError if the weights alone do not fit, or not
    even one sequence does.
    """
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    if not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    usable_bytes = memory_fraction * gpu.memory_bytes
    free_bytes = usable_bytes - shape.weight_bytes
    if free_bytes <= 0:
        raise ValueError(
            f"{shape.name}'s weights ({shape.weight_bytes / 1e9:.1f} GB) do not fit in {memory_fraction:.0%} "
            f"of {gpu.name}'s {gpu.memory_bytes / 1e9:.0f} GB: shard the model (tensor parallelism) or use a bigger GPU"
        )
    n = math.floor(free_bytes / (kv_bytes_per_token(shape) * context_tokens))
    if n < 1:
        raise ValueError(
            f"not one sequence of context_tokens={context_tokens} fits beside {shape.name}'s weights on {gpu.name} "
            f"({free_bytes / 1e9:.2f} GB left for the KV cache): shorten the context or shard the model"
        )
    return n


def decode_latency_roofline(
    shape: ModelShape, gpu: GPU, context_tokens: int, efficiency: float = 1.0
) -> tuple[float, float]:
    """``(a_s, b_s)`` of the decode-step latency ``l(B) = a_s + b_s * B`` (08.3), from the roofline.

    ``a_s``: one read of the weights per step (seconds). ``b_s``: per sequence, one read
    of its KV cache at ``context_tokens`` plus ``2 * n_params`` FLOPs (seconds). The costs
    add (no overlap: slightly pessimistic); prefill is ignored. ``efficiency`` in (0, 1] is
    the fraction of peak bandwidth and FLOP/s actually reached: both terms are divided by it.
    """
    if context_tokens < 1:
        raise ValueError(f"context_tokens must be >= 1, got {context_tokens}")
    if not 0.0 < efficiency <= 1.0:
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    a_s = shape.weight_bytes / gpu.hbm_bytes_per_s
    b_s = kv_bytes_per_token(shape) * context_tokens / gpu.hbm_bytes_per_s + 2.0 * shape.n_params / gpu.peak_flops
    return a_s / efficiency, b_s / efficiency


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
    """``l(B) = a_s + b_s * B`` (08.3), seconds per decode step at ``B`` sequences."""
    return a_s + b_s * batch


def engine_tokens_per_s(batch: float, a_s: float, b_s: float) -> float:
    """Tokens/s of one engine with ``batch`` sequences in flight: ``B / l(B)`` (08.4 at ``B = max_batch``)."""
    return batch / decode_latency_s(batch, a_s, b_s)


def train_tokens_per_s_per_gpu(shape: ModelShape, gpu: GPU, mfu: float = 0.4) -> float:
    """Tokens/s one trainer GPU consumes: ``mfu * peak_flops / (6 * n_params)`` (08.5)."""
    if not 0.0 < mfu <= 1.0:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    return mfu * gpu.peak_flops / (6.0 * shape.n_params)


# --------------------------------------------------------------------------------------
# Answer lengths
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


# --------------------------------------------------------------------------------------
# The straggler: one engine's continuous-batching schedule, exactly
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


def engine_finish_times_s(
    lengths_tokens: Sequence[int] | NDArray[np.integer], max_batch: int, a_s: float, b_s: float
) -> NDArray[np.float64]:
    """Seconds from the phase's start until each sequence's last token, on one engine.

    Step ``t`` takes ``l(B_t)``, ``B_t`` = sequences running at step ``t``
    (:func:`engine_schedule`); a sequence finishes at the end of step ``end_step - 1``.
    """
    start, end = engine_schedule(lengths_tokens, max_batch)
    if end.size == 0:
        return np.zeros(0)
    n_steps = int(end.max())
    running = np.zeros(n_steps + 1, dtype=np.int64)
    np.add.at(running, start, 1)
    np.add.at(running, end, -1)
    batch_t = np.cumsum(running)[:n_steps]
    clock_s = np.cumsum(a_s + b_s * batch_t)
    return clock_s[end - 1]


def deal_to_engines(lengths_tokens: Sequence[int] | NDArray[np.integer], n_engines: int) -> list[NDArray[np.int64]]:
    """The batch dealt round robin: engine ``e`` gets samples ``e, e + E, e + 2E, ...`` in order."""
    if n_engines < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines}")
    lengths = _as_lengths(lengths_tokens)
    return [lengths[e::n_engines] for e in range(n_engines)]


def generation_time_s(
    lengths_tokens: Sequence[int] | NDArray[np.integer], n_engines: int, max_batch: int, a_s: float, b_s: float
) -> float:
    """Seconds until the last answer of the batch is done (08.7): ``max_e a_s * S_e + b_s * K_e``.

    Exact for the shared model of an engine (continuous batching, ``l(B) = a_s + b_s B``):
    ``sum_t l(B_t) = a_s * (steps) + b_s * sum_t B_t`` and ``sum_t B_t`` is the tokens.
    """
    worst_s = 0.0
    for share in deal_to_engines(lengths_tokens, n_engines):
        if share.size == 0:
            continue
        _, end = engine_schedule(share, max_batch)
        worst_s = max(worst_s, a_s * float(end.max()) + b_s * float(share.sum()))
    return worst_s


# --------------------------------------------------------------------------------------
# 2. The invariants
# --------------------------------------------------------------------------------------


def production_tokens_per_s(n_samplers: int, max_batch: int, a_s: float, b_s: float) -> float:
    """``P = N_s * p``: tokens/s of ``n_samplers`` full engines (08.4, 08.6)."""
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
# 3. The system and the layouts
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SystemSpec:
    """One RL system to predict: hardware rates, batch, lengths, split and staleness bound.

    Attributes:
        n_gpus: ``N``, all GPUs.
        batch_samples: samples (sequences) per optimizer step.
        max_batch: sequences one engine holds at once (08.2).
        a_s, b_s: decode-step latency ``l(B) = a_s + b_s * B`` seconds (08.3).
        train_tokens_per_s_per_gpu: ``c`` (08.5), answer tokens/s per trainer GPU.
        answer_tokens: every batch's answer lengths, in the order dealt to the engines
            (a tuple of ``batch_samples`` ints), or one int for equal lengths.
        n_samplers: sampler GPUs ``N_s`` of a split layout (``1 .. N - 1``; trainers are
            the rest). ``None`` until chosen (:func:`best_split` chooses it); ignored by
            ``sync_colocated``, where all ``N`` GPUs do both.
        weight_sync_s: seconds for new weights to reach the samplers after a step.
        max_lag: the staleness bound (steps): the pipeline's backpressure cap and the
            feasibility limit of :func:`best_split`.
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
    max_lag: int = 1

    def __post_init__(self) -> None:
        if self.n_gpus < 1:
            raise ValueError(f"n_gpus must be >= 1, got {self.n_gpus}")
        if self.batch_samples < 1:
            raise ValueError(f"batch_samples must be >= 1, got {self.batch_samples}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.a_s < 0 or self.b_s < 0 or self.a_s + self.b_s <= 0:
            raise ValueError(f"need a_s, b_s >= 0 and l(1) > 0, got a_s={self.a_s}, b_s={self.b_s}")
        if self.train_tokens_per_s_per_gpu <= 0:
            raise ValueError(f"train_tokens_per_s_per_gpu must be > 0, got {self.train_tokens_per_s_per_gpu}")
        if self.weight_sync_s < 0:
            raise ValueError(f"weight_sync_s must be >= 0, got {self.weight_sync_s}")
        if self.max_lag < 0:
            raise ValueError(f"max_lag must be >= 0, got {self.max_lag}")
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
        if self.n_samplers is not None and not 1 <= self.n_samplers <= self.n_gpus - 1:
            raise ValueError(
                f"n_samplers={self.n_samplers} is out of range: a split layout needs 1 <= n_samplers <= "
                f"n_gpus - 1 = {self.n_gpus - 1} (at least one sampler and one trainer)"
            )

    @property
    def lengths_tokens(self) -> NDArray[np.int64]:
        """``[batch_samples]`` answer lengths of one batch."""
        if isinstance(self.answer_tokens, int):
            return np.full(self.batch_samples, self.answer_tokens, dtype=np.int64)
        return np.asarray(self.answer_tokens, dtype=np.int64)

    @property
    def batch_tokens(self) -> float:
        """``G``: generated tokens per batch (what one optimizer step trains on)."""
        return float(self.lengths_tokens.sum())

    @property
    def mean_answer_tokens(self) -> float:
        return self.batch_tokens / self.batch_samples

    @property
    def n_trainers(self) -> int | None:
        """``N - N_s`` trainer GPUs of a split layout (``None`` while ``n_samplers`` is)."""
        return None if self.n_samplers is None else self.n_gpus - self.n_samplers

    def latency_s(self, batch: float) -> float:
        """``l(B)`` (08.3)."""
        return decode_latency_s(batch, self.a_s, self.b_s)

    @property
    def engine_full_tokens_per_s(self) -> float:
        """``p = max_batch / l(max_batch)`` (08.4)."""
        return engine_tokens_per_s(self.max_batch, self.a_s, self.b_s)


def spec_from_hardware(
    shape: ModelShape,
    gpu: GPU,
    *,
    n_gpus: int,
    batch_samples: int,
    answer_tokens: int | tuple[int, ...],
    context_tokens: int,
    mfu: float = 0.4,
    memory_fraction: float = 0.9,
    efficiency: float = 1.0,
    weight_sync_s: float = 0.0,
    max_lag: int = 1,
    n_samplers: int | None = None,
) -> SystemSpec:
    """A :class:`SystemSpec` from first principles: ``max_batch`` (08.2) and ``l(B)`` (08.3) at
    ``context_tokens`` (the KV reserved per sequence: prompt + longest answer), ``c`` (08.5)."""
    a_s, b_s = decode_latency_roofline(shape, gpu, context_tokens, efficiency)
    return SystemSpec(
        n_gpus=n_gpus,
        batch_samples=batch_samples,
        max_batch=max_batch(shape, gpu, context_tokens, memory_fraction),
        a_s=a_s,
        b_s=b_s,
        train_tokens_per_s_per_gpu=train_tokens_per_s_per_gpu(shape, gpu, mfu),
        answer_tokens=answer_tokens,
        n_samplers=n_samplers,
        weight_sync_s=weight_sync_s,
        max_lag=max_lag,
    )


@dataclass(frozen=True)
class Prediction:
    """The model's steady state of one layout.

    Attributes:
        layout: the layout's name.
        n_samplers, n_trainers: GPUs per role (``N`` and ``N`` for sync_colocated).
        tokens_per_s: generated tokens per second.
        step_s: seconds per optimizer step (``G / tokens_per_s``).
        generation_s: sync layouts: the generation phase (08.7); pipeline: the mean
            generation latency of one sample, ``L_mean * l(B_eff)``.
        train_s: one optimizer step's compute, ``G / (n_trainers * c)``.
        sampler_idle_fraction: ``1 - tokens_per_s / (n_samplers * p)``: the share of the
            samplers' full-batch capacity not used (idle, or running below ``max_batch``
            while stragglers finish or the cap throttles).
        trainer_idle_fraction: ``1 - tokens_per_s / (n_trainers * c)``: the share of time
            the trainers do not train.
        mean_lag_steps, max_lag_steps: staleness in optimizer steps (08.12, 08.13).
        engine_batch: sequences per engine in steady state (pipeline ``B_eff``; sync
            layouts: the engines' starting batch).
        cap_binds: pipeline only: the backpressure cap keeps engines below ``max_batch``.
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


def _synchronous(layout: Layout, spec: SystemSpec, n_samplers: int, n_trainers: int) -> Prediction:
    """sync_colocated (08.8), sync_split (08.9), one_step (08.10): a batch-at-a-time generation phase."""
    gen_s = generation_time_s(spec.lengths_tokens, n_samplers, spec.max_batch, spec.a_s, spec.b_s)
    train_s = spec.batch_tokens / (n_trainers * spec.train_tokens_per_s_per_gpu)
    if layout == "one_step":
        step_s, lag = max(gen_s, train_s + spec.weight_sync_s), 1
    else:
        step_s, lag = gen_s + train_s + spec.weight_sync_s, 0
    tokens_per_s = spec.batch_tokens / step_s
    return Prediction(
        layout=layout,
        n_samplers=n_samplers,
        n_trainers=n_trainers,
        tokens_per_s=tokens_per_s,
        step_s=step_s,
        generation_s=gen_s,
        train_s=train_s,
        sampler_idle_fraction=1.0 - tokens_per_s / (n_samplers * spec.engine_full_tokens_per_s),
        trainer_idle_fraction=1.0 - tokens_per_s / (n_trainers * spec.train_tokens_per_s_per_gpu),
        mean_lag_steps=float(lag),
        max_lag_steps=lag,
        engine_batch=float(min(spec.max_batch, math.ceil(spec.batch_samples / n_samplers))),
    )


def _pipeline(spec: SystemSpec, n_samplers: int, n_trainers: int) -> Prediction:
    """pipeline: (08.11) throughput, (08.12) mean lag, (08.13) max lag."""
    if spec.max_lag == 0:  # one batch admitted at a time, released when its weights arrive: sync_split
        return replace(_synchronous("sync_split", spec, n_samplers, n_trainers), layout="pipeline")
    lengths = spec.lengths_tokens
    batch = spec.batch_samples
    in_flight = min(n_samplers * spec.max_batch, spec.max_lag * batch)  # sequences in flight, all engines
    engine_batch = in_flight / n_samplers
    if engine_batch >= 1:
        production = n_samplers * engine_tokens_per_s(engine_batch, spec.a_s, spec.b_s)
        step_latency_s = spec.latency_s(engine_batch)
    else:  # fewer sequences than engines: in_flight engines with one each
        production = in_flight / spec.latency_s(1)
        step_latency_s = spec.latency_s(1)
    consumption = consumption_tokens_per_s(n_trainers, spec.train_tokens_per_s_per_gpu)
    tokens_per_s = min(production, consumption)
    step_s = spec.batch_tokens / tokens_per_s
    if consumption <= production:  # the trainer is the bottleneck: the cap binds, (max_lag + 1) batches held
        mean_lag = float(spec.max_lag)
    else:
        little = (in_flight + batch / 2) / batch + spec.weight_sync_s / step_s
        mean_lag = min(float(spec.max_lag), little)
    extra_s = (float(lengths.max()) - spec.mean_answer_tokens) * step_latency_s
    max_lag = math.ceil(mean_lag + extra_s / step_s - 1e-9)
    return Prediction(
        layout="pipeline",
        n_samplers=n_samplers,
        n_trainers=n_trainers,
        tokens_per_s=tokens_per_s,
        step_s=step_s,
        generation_s=spec.mean_answer_tokens * step_latency_s,
        train_s=spec.batch_tokens / consumption,
        sampler_idle_fraction=1.0 - tokens_per_s / (n_samplers * spec.engine_full_tokens_per_s),
        trainer_idle_fraction=1.0 - tokens_per_s / consumption,
        mean_lag_steps=mean_lag,
        max_lag_steps=max_lag,
        engine_batch=engine_batch,
        cap_binds=engine_batch < spec.max_batch,
    )


def predict(layout: str, spec: SystemSpec) -> Prediction:
    """The model's steady state of ``layout`` on ``spec`` (equations 08.7 to 08.13)."""
    name = _check_layout(layout)
    n_samplers, n_trainers = _split(spec, name)
    if name == "pipeline":
        return _pipeline(spec, n_samplers, n_trainers)
    return _synchronous(name, spec, n_samplers, n_trainers)


# --------------------------------------------------------------------------------------
# 4. Choosing the split
# --------------------------------------------------------------------------------------

LagBound = Literal["mean", "max"]


def _feasible(p: Prediction, max_lag: int, bound: LagBound) -> bool:
    lag = p.mean_lag_steps if bound == "mean" else p.max_lag_steps
    return lag <= max_lag + 1e-9


@dataclass(frozen=True)
class SplitSweep:
    """Every split of a layout: ``[N - 1]`` arrays indexed by ``n_samplers = 1 .. N - 1``."""

    layout: Layout
    n_samplers: NDArray[np.int64]
    tokens_per_s: NDArray[np.float64]
    mean_lag_steps: NDArray[np.float64]
    max_lag_steps: NDArray[np.int64]
    feasible: NDArray[np.bool_]


def sweep(layout: str, spec: SystemSpec, lag_bound: LagBound = "mean") -> SplitSweep:
    """Predict ``layout`` at every split ``n_samplers = 1 .. N - 1`` (``spec.n_samplers`` is
    replaced); ``feasible`` marks the splits whose mean (or max) lag is at most ``spec.max_lag``."""
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
        feasible=np.array([_feasible(p, spec.max_lag, lag_bound) for p in preds], dtype=np.bool_),
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


def best_split(layout: str, spec: SystemSpec, lag_bound: LagBound = "mean") -> SplitResult:
    """The highest-throughput ``n_samplers`` in ``1 .. N - 1`` whose lag respects ``spec.max_lag``.

    ``lag_bound`` picks the lag that must be at most ``spec.max_lag``: ``"mean"`` (08.12)
    or ``"max"`` (08.13). Ties go to the fewest samplers. ``sync_colocated`` has no split:
    its one prediction comes back, without neighbours. Raises ValueError if no split is
    feasible (e.g. one_step with ``max_lag = 0``).
    """
    name = _check_layout(layout)
    if name == "sync_colocated":
        return SplitResult(predict(name, spec), None, None)
    s = sweep(name, spec, lag_bound)
    if not s.feasible.any():
        raise ValueError(
            f"no split of {spec.n_gpus} GPUs keeps {name}'s {lag_bound} lag <= max_lag={spec.max_lag}: "
            "raise max_lag or pick a layout with less staleness"
        )
    i = int(np.argmax(np.where(s.feasible, s.tokens_per_s, -np.inf)))
    best = predict(name, replace(spec, n_samplers=int(s.n_samplers[i])))
    below = float(s.tokens_per_s[i - 1]) if i > 0 else None
    above = float(s.tokens_per_s[i + 1]) if i + 1 < s.n_samplers.size else None
    return SplitResult(best, below, above)
