"""The cluster-layout calculator (lesson 08): from a few numbers to a recommended layout.

Inputs a planner knows: GPUs, model, training batch, the staleness the algorithm
tolerates, the admission rule that enforces it, and the shape of the answer lengths.
:func:`recommend` builds the :class:`~course_lib.layout.model.SystemSpec` from first
principles (eqs. 08.1-08.5b), finds each layout's best *feasible* split
(:func:`~course_lib.layout.model.best_split`: trainers that hold the model, every sample's
lag, the maximum, within the bound under the rule) and picks the layout with the most
tokens/s. A layout with no feasible split is shown with the constraint that failed. The
notebook's widgets only call :func:`recommend` and print :func:`recommendation_text`.

A model too large for one GPU's memory runs on **tensor-parallel groups**
(:func:`tensor_parallel`): ``tp`` GPUs act as one unit with ``tp`` times the memory,
bandwidth and FLOP/s (ideal scaling: an optimistic assumption, real TP loses some of it
to all-reduces). The split is then in units of ``tp`` GPUs.

The weight sync is ``weight_bytes / sync_bytes_per_s``; the default 125 GB/s is the rate
behind verl's reported 0.12 s update of a 7B model (verl fully_async docs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray

from course_lib.layout.model import (
    GPU,
    H100_SXM,
    LAYOUTS,
    QWEN25_7B,
    QWEN25_32B,
    Admission,
    Layout,
    LengthDist,
    ModelShape,
    Prediction,
    SystemSpec,
    best_split,
    lognormal_lengths,
    spec_from_hardware,
)

#: The models the calculator offers, by name.
MODELS: dict[str, ModelShape] = {QWEN25_7B.name: QWEN25_7B, QWEN25_32B.name: QWEN25_32B}


def tensor_parallel(gpu: GPU, tp: int) -> GPU:
    """``tp`` GPUs as one unit: ``tp`` x memory, bandwidth and FLOP/s (ideal scaling)."""
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    if tp == 1:
        return gpu
    return GPU(f"{tp}x {gpu.name} (TP{tp})", tp * gpu.memory_bytes, tp * gpu.hbm_bytes_per_s, tp * gpu.peak_flops)


def smallest_tp(shape: ModelShape, gpu: GPU, memory_fraction: float = 0.9, kv_share: float = 0.5) -> int:
    """The smallest power-of-two ``tp`` whose group keeps at least ``kv_share`` of its usable
    memory free for the KV cache after the weights."""
    tp = 1
    while shape.weight_bytes > (1.0 - kv_share) * memory_fraction * tp * gpu.memory_bytes:
        tp *= 2
    return tp


@dataclass(frozen=True)
class Recommendation:
    """Every layout's best split on one system, and the winner.

    Attributes:
        spec: the system (``n_gpus`` counts tensor-parallel units of ``tp`` GPUs).
        tp: GPUs per unit.
        lengths: the answer-length distribution.
        best: each layout's best feasible prediction, ``None`` where no split is feasible.
        why_not: for each layout without a feasible split, the constraint that failed.
        layout: the layout with the most tokens/s among the feasible ones.
    """

    spec: SystemSpec
    tp: int
    lengths: LengthDist
    best: dict[Layout, Prediction | None]
    why_not: dict[Layout, str]
    layout: Layout

    @property
    def prediction(self) -> Prediction:
        p = self.best[self.layout]
        assert p is not None
        return p


def recommend(
    n_gpus: int,
    model: str = QWEN25_7B.name,
    batch_samples: int = 1024,
    max_lag: int = 2,
    mean_tokens: float = 2000.0,
    p99_over_median: float = 8.0,
    max_tokens: int = 16384,
    prompt_tokens: int = 1024,
    gpu: GPU = H100_SXM,
    mfu: float = 0.4,
    efficiency: float = 0.7,
    admission: Admission = "wait",
    extra_forward_passes: int = 0,
    sync_bytes_per_s: float = 125e9,
    seed: int = 0,
) -> Recommendation:
    """The best feasible layout and split for ``n_gpus`` GPUs training ``model`` (module docstring).

    Lengths are log-normal (:func:`~course_lib.layout.model.lognormal_lengths`) with
    ``mean_tokens`` and ``p99_over_median``, capped at ``max_tokens``; the KV cache is paged
    (08.2); ``admission`` decides how the pipeline keeps every lag within ``max_lag``. Raises
    ValueError naming every layout's failed constraint if no layout is feasible.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
    shape = MODELS[model]
    tp = smallest_tp(shape, gpu)
    units = n_gpus // tp
    if n_gpus % tp:
        raise ValueError(f"{n_gpus} GPUs do not divide into TP{tp} units for {model}: use a multiple of {tp}")
    if units < 2:
        raise ValueError(f"{n_gpus} GPUs make {units} unit(s) of TP{tp} for {model}: need at least 2 units")
    lengths = lognormal_lengths(mean_tokens, p99_over_median, seed=seed, max_tokens=max_tokens)
    spec = spec_from_hardware(
        shape,
        tensor_parallel(gpu, tp),
        n_gpus=units,
        batch_samples=batch_samples,
        answer_tokens=lengths.batch(batch_samples, seed=seed),
        prompt_tokens=prompt_tokens,
        generation_limit=max_tokens,
        mfu=mfu,
        efficiency=efficiency,
        extra_forward_passes=extra_forward_passes,
        weight_sync_s=shape.weight_bytes / sync_bytes_per_s,
        max_lag=max_lag,
        admission=admission,
    )
    best: dict[Layout, Prediction | None] = {}
    why_not: dict[Layout, str] = {}
    for layout in LAYOUTS:
        try:
            best[layout] = best_split(layout, spec).prediction
        except ValueError as exc:  # no split keeps this layout feasible
            best[layout] = None
            why_not[layout] = str(exc)
    feasible = {k: p for k, p in best.items() if p is not None and p.feasible}
    if not feasible:
        raise ValueError("no layout is feasible: " + " | ".join(f"{k}: {v}" for k, v in why_not.items()))
    winner = max(feasible, key=lambda k: feasible[k].tokens_per_s)
    return Recommendation(spec=spec, tp=tp, lengths=lengths, best=best, why_not=why_not, layout=winner)


def recommendation_text(rec: Recommendation) -> str:
    """A fixed-width table of every layout's best feasible split, the recommended one marked ``<-``,
    with each layout's mean and maximum lag and the admission rule; a layout with no feasible split
    is listed with the constraint that failed. Rounded figures only (the same text on every machine)."""
    s, tp = rec.spec, rec.tp
    head = (
        f"{s.n_gpus * tp} GPUs = {s.n_gpus} units of TP{tp} | batch {s.batch_samples} samples, "
        f"mean answer {s.mean_answer_tokens:,.0f} tokens (longest {int(s.lengths_tokens.max()):,}), "
        f"prompt {s.prompt_tokens:,.0f} | max_lag {s.max_lag:g}, pipeline admission '{s.admission}' | engine: "
        f"B_max {s.max_batch} (paged KV), {s.engine_full_tokens_per_s:,.0f} tokens/s full | trainer "
        f"{s.train_tokens_per_s_per_gpu:,.0f} tokens/s per unit, >= {s.min_trainers} unit(s) to hold the model"
    )
    lines = [
        head,
        f"{'layout':<15} {'samplers':>9} {'trainers':>9} {'tokens/s':>10} {'step s':>8} {'lag mean':>9} {'lag max':>8}",
    ]
    for layout in LAYOUTS:
        p = rec.best[layout]
        if p is None:
            reason = rec.why_not.get(layout, "infeasible").split(": ", 1)[-1]
            lines.append(f"{layout:<15} infeasible: {reason}")
            continue
        mark = "  <- recommended" if layout == rec.layout else ""
        lines.append(
            f"{layout:<15} {p.n_samplers * tp:>9} {p.n_trainers * tp:>9} {p.tokens_per_s:>10,.0f} "
            f"{p.step_s:>8.1f} {p.mean_lag_steps:>9.2f} {p.max_lag_steps:>8}{mark}"
        )
    return "\n".join(lines)


def best_tokens_per_s_vs_lag(spec: SystemSpec, max_lags: NDArray[np.integer] | list[int]) -> NDArray[np.float64]:
    """``[len(max_lags)]`` best feasible pipeline tokens/s at each staleness bound (0 = synchronous;
    NaN where no split is feasible)."""
    out = []
    for k in max_lags:
        try:
            out.append(best_split("pipeline", replace(spec, max_lag=int(k))).prediction.tokens_per_s)
        except ValueError:
            out.append(float("nan"))
    return np.array(out)
