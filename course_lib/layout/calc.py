"""The cluster-layout calculator (lesson 08): from a few numbers to a recommended layout.

Inputs a planner knows: GPUs, model, training batch, the staleness the algorithm
tolerates, the admission rule that enforces it, and the shape of the answer lengths.
:func:`recommend` builds the :class:`~course_lib.layout.model.SystemSpec` from first
principles (eqs. 08.1-08.5b), finds each layout's best *feasible* split
(:func:`~course_lib.layout.model.best_split`: trainers that hold the model, every sample's
lag, the maximum, within the bound under the rule) and picks the layout with the most
tokens/s. A layout with no feasible split is shown with the constraint that failed. The
notebook's widgets only call :func:`recommend` and print :func:`recommendation_text`.

**How much to trust it.** The inputs are uncertain by about +-30% (a 40% MFU, 70% of peak
bandwidth, the answer-length distribution), so the calculator reports what they support:

* a *range* of splits, not one (:func:`near_optimal_splits`): every feasible split within
  5% of the best. Throughput is often flat over a wide range of splits, and the one best
  split is then an artefact of the inputs' last digits;
* every printed figure rounded to two significant figures (:func:`fmt_sig`);
* how the range moves when MFU, decode bandwidth efficiency or the mean answer length is
  off by 30% (:func:`sensitivity`), and which splits stay near-optimal under all of them;
* all three admission rules side by side (:func:`compare_admissions`);
* the lag per *token* beside the lag per sample (:func:`token_lag`): with in-flight weight
  updates the tokens a sample decodes after a weight swap come from newer weights, so the
  first-token lag the bound is judged on overstates how off-policy the tokens are;
* a requested split checked, and refused with the reason and what to change
  (:func:`check_split`).

A model too large for one GPU's memory runs on **tensor-parallel groups**
(:func:`tensor_parallel`): ``tp`` GPUs act as one unit with ``tp`` times the memory,
bandwidth and FLOP/s (ideal scaling: an optimistic assumption, real TP loses some of it
to all-reduces). The split is then in units of ``tp`` GPUs (the text prints GPUs).

The weight sync is ``weight_bytes / sync_bytes_per_s``; the default 125 GB/s is the rate
behind verl's reported 0.12 s update of a 7B model (verl fully_async docs).
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.layout.model import (
    ADMISSIONS,
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
    lognormal_lengths,
    predict,
    spec_from_hardware,
)

#: The models the calculator offers, by name.
MODELS: dict[str, ModelShape] = {QWEN25_7B.name: QWEN25_7B, QWEN25_32B.name: QWEN25_32B}

#: Splits whose tokens/s is within this share of the best are reported as near-optimal.
NEAR_OPTIMAL_WITHIN = 0.05
#: Significant figures of every printed estimate: the inputs are uncertain by about +-30%.
SIG_FIGS = 2


# --------------------------------------------------------------------------------------
# Rounding to what the inputs support
# --------------------------------------------------------------------------------------


def round_sig(x: float, sig: int = SIG_FIGS) -> float:
    """``x`` rounded to ``sig`` significant figures (``round_sig(37180) == 37000.0``,
    ``round_sig(0.6234) == 0.62``); 0, infinities and NaN come back unchanged."""
    if sig < 1:
        raise ValueError(f"sig must be >= 1, got {sig}")
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return x
    return round(x, sig - 1 - math.floor(math.log10(abs(x))))


def fmt_sig(x: float, sig: int = SIG_FIGS) -> str:
    """``x`` to ``sig`` significant figures, with thousands separators and no more decimals
    than the figures need: ``"37,000"``, ``"0.62"``, ``"1.2"``, ``"2.0"``; an infinity is
    ``"unbounded"`` (an unbounded lag) and NaN ``"n/a"``."""
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "unbounded" if x > 0 else "-unbounded"
    r = round_sig(x, sig)
    if r == 0:
        return "0"
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(r))))
    return f"{r:,.{decimals}f}"


def _is_unbounded(x: float | np.integer) -> bool:
    return not math.isfinite(float(x)) or bool(x >= sys.maxsize // 2)


def fmt_lag(x: float | np.integer) -> str:
    """A lag in optimizer steps: a whole number as it is (``"2"``), a mean to two
    significant figures (``"1.8"``), an infinite or unbounded one as ``"unbounded"``."""
    if isinstance(x, float) and math.isnan(x):
        return "n/a"
    if _is_unbounded(x):
        return "unbounded"
    if isinstance(x, int | np.integer):
        return str(int(x))
    return fmt_sig(x)


def _fmt_max_lag(max_lag: float) -> str:
    return "unbounded" if math.isinf(max_lag) else f"{max_lag:g}"


def _fmt_tokens(n: float) -> str:
    """A token count as a planner says it: ``"16k"``, ``"4.1k"``, ``"500"``."""
    return f"{fmt_sig(n / 1000)}k" if n >= 1000 else fmt_sig(n)


# --------------------------------------------------------------------------------------
# Tensor parallelism
# --------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------
# Predicting a split, guarded
# --------------------------------------------------------------------------------------

_UNBOUNDED_QUEUE = (
    "unbounded lag: the trainers are the bottleneck and max_lag=inf lets the queue of finished samples "
    "grow without limit (no steady state); give a finite max_lag or more trainers"
)


def _predict(layout: Layout, spec: SystemSpec) -> Prediction | str:
    """``predict``, or the reason it has no steady state (an unbounded window whose queue grows
    without limit: ``max_lag = inf`` with the trainers as the bottleneck)."""
    try:
        return predict(layout, spec)
    except OverflowError:  # an infinite lag made an integer: the model's unbounded-window case
        return _UNBOUNDED_QUEUE


def _reason(p: Prediction | str) -> str | None:
    return p if isinstance(p, str) else p.infeasible


def _sweep(layout: Layout, spec: SystemSpec) -> list[Prediction | str]:
    """Every split of ``layout`` (``n_samplers = 1 .. N - 1``; one prediction for sync_colocated)."""
    if layout == "sync_colocated":
        return [_predict(layout, replace(spec, n_samplers=None))]
    if spec.n_gpus < 2:
        raise ValueError(f"a split layout needs n_gpus >= 2, got {spec.n_gpus}")
    return [_predict(layout, replace(spec, n_samplers=n)) for n in range(1, spec.n_gpus)]


def _why_none(layout: Layout, spec: SystemSpec, preds: list[Prediction | str]) -> str:
    """The message of :func:`~course_lib.layout.model.best_split` when no split is feasible:
    each failed constraint with the splits it failed at."""
    if layout == "sync_colocated":
        return f"sync_colocated on {spec.n_gpus} GPUs is infeasible: {_reason(preds[0])}"
    by_reason: dict[str, list[tuple[int, str]]] = {}
    for n, p in enumerate(preds, start=1):
        reason = _reason(p)
        if reason is None:
            continue
        key = reason.split(":")[0] if reason.startswith(("trainer memory", "unbounded")) else "max lag"
        key = "drops" if reason.startswith("drops") else key
        by_reason.setdefault(key, []).append((n, reason))
    parts = []
    for key, found in by_reason.items():
        first, last = found[0][0], found[-1][0]
        span = f"N_s={first}" if len(found) == 1 else f"N_s={first}..{last}"
        lags = [p.max_lag_steps for n, _ in found if isinstance(p := preds[n - 1], Prediction)]
        if key == "max lag" and lags and min(lags) != max(lags):  # the span's own maxima, not the first split's
            parts.append(f"{span}: max lag {fmt_lag(min(lags))}-{fmt_lag(max(lags))} > max_lag {spec.max_lag:g}")
        else:
            parts.append(f"{span}: {found[0][1]}")
    rule = f" under admission={spec.admission!r}" if layout == "pipeline" else ""
    return f"no split of {spec.n_gpus} GPUs makes {layout} feasible{rule}: " + "; ".join(parts)


# --------------------------------------------------------------------------------------
# 1. The near-optimal splits
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SplitRange:
    """Every feasible split of a layout within ``within`` of the best feasible one.

    Counts are in units of the spec (``tp`` GPUs each; the ``*_gpus`` properties count GPUs).

    Attributes:
        layout: the layout.
        best: ``n_samplers`` of the best feasible split (ties: the fewest samplers, as
            :func:`~course_lib.layout.model.best_split`).
        lo, hi: the smallest and largest near-optimal ``n_samplers``.
        members: every near-optimal ``n_samplers``, ascending (``contiguous`` says whether
            they fill ``lo .. hi``: a split between two near-optimal ones may be infeasible or slow).
        best_tokens_per_s: the best split's tokens/s.
        tokens_per_s_lo: the worst tokens/s among the members.
        n_gpus: units in the system (``N``).
        tp: GPUs per unit.
        within: the tolerance (0.05: within 5% of the best).
        prediction: the best split's prediction.
    """

    layout: Layout
    best: int
    lo: int
    hi: int
    members: tuple[int, ...]
    best_tokens_per_s: float
    tokens_per_s_lo: float
    n_gpus: int
    tp: int
    within: float
    prediction: Prediction

    @property
    def contiguous(self) -> bool:
        return len(self.members) == self.hi - self.lo + 1

    @property
    def best_tokens_per_s_per_gpu(self) -> float:
        """The best split's tokens/s over every GPU of the system."""
        return self.best_tokens_per_s / (self.n_gpus * self.tp)

    @property
    def tokens_per_s_lo_per_gpu(self) -> float:
        """The worst near-optimal split's tokens/s over every GPU of the system."""
        return self.tokens_per_s_lo / (self.n_gpus * self.tp)

    @property
    def width(self) -> int:
        """``hi - lo``: how many units the near-optimal splits span (0: one split stands out)."""
        return self.hi - self.lo

    def samplers_text(self) -> str:
        """``"121 (45-121)"`` in GPUs: the best split and the range; ``*`` if not contiguous."""
        best, lo, hi = self.best * self.tp, self.lo * self.tp, self.hi * self.tp
        if self.lo == self.hi:
            return f"{best}"
        return f"{best} ({lo}-{hi}{'' if self.contiguous else '*'})"


def _range(
    layout: Layout, spec: SystemSpec, preds: list[Prediction | str], within: float, tp: int
) -> SplitRange | None:
    """The near-optimal range of a sweep, ``None`` if no split is feasible."""
    ok = [p for p in preds if isinstance(p, Prediction) and p.feasible]
    if not ok:
        return None
    best = max(ok, key=lambda p: p.tokens_per_s)  # max keeps the first: the fewest samplers on a tie
    floor = (1.0 - within) * best.tokens_per_s
    members = [p for p in ok if p.tokens_per_s >= floor]
    ns = tuple(p.n_samplers for p in members)
    return SplitRange(
        layout=layout,
        best=best.n_samplers,
        lo=min(ns),
        hi=max(ns),
        members=ns,
        best_tokens_per_s=best.tokens_per_s,
        tokens_per_s_lo=min(p.tokens_per_s for p in members),
        n_gpus=spec.n_gpus,
        tp=tp,
        within=within,
        prediction=best,
    )


def near_optimal_splits(
    layout: str, spec: SystemSpec, within: float = NEAR_OPTIMAL_WITHIN, *, tp: int = 1
) -> SplitRange:
    """Every feasible ``n_samplers`` whose tokens/s is within ``within`` of the best feasible
    split's (:class:`SplitRange`). ``sync_colocated`` has one "split", all ``N`` units.

    The model cannot tell the members apart: its inputs are uncertain by far more than
    ``within``, so pick among them by what the model leaves out (fewer samplers leave
    trainers spare for a longer answer or a larger batch; more samplers run fewer
    sequences each, so a straggler decodes faster). Raises ValueError naming the constraint
    that failed (the model's messages) if no split is feasible.
    """
    if not 0.0 <= within < 1.0:
        raise ValueError(f"within must be in [0, 1), got {within}")
    name = _layout(layout)
    preds = _sweep(name, spec)
    r = _range(name, spec, preds, within, tp)
    if r is None:
        raise ValueError(_why_none(name, spec, preds))
    return r


def _layout(layout: str) -> Layout:
    for name in LAYOUTS:
        if layout == name:
            return name
    raise ValueError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")


# --------------------------------------------------------------------------------------
# 5. Lag per token
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenLag:
    """A prediction's staleness per sample and per token (:func:`token_lag`).

    Attributes:
        sample_mean: mean lag over samples, counted from each sample's first token (08.12).
        sample_max: the largest sample's lag (08.13; the hard rules cap it at the bound).
        token_mean: mean lag over the trained tokens, each counted from the weights that decoded it.
        token_share_over_bound: the share of trained tokens whose own lag exceeds ``max_lag``.
        steps_per_token: ``l / step``: how many optimizer steps newer the weights get per token
            a sequence decodes (0 without in-flight weight updates).
        in_flight: whether weights change under a running sequence (the pipeline, ``max_lag > 0``).
    """

    sample_mean: float
    sample_max: float
    token_mean: float
    token_share_over_bound: float
    steps_per_token: float
    in_flight: bool


def _first_token_lags(lengths: NDArray[np.float64], mean_lag: float, k: float, cap: float) -> NDArray[np.float64]:
    """Each sample's first-token lag ``min(cap, c + (L_i - E[L]) k)`` (08.13 for every sample,
    capped at the bound under a hard rule), ``c`` set so that their mean is ``mean_lag`` (08.12)."""
    spread = (lengths - lengths.mean()) * k
    if math.isinf(cap):
        return mean_lag + spread
    if mean_lag >= cap - 1e-12:
        return np.full_like(lengths, cap)
    lo, hi = mean_lag, cap - float(spread.min())  # mean(min(cap, lo + spread)) <= mean_lag; at hi, all are cap
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if float(np.mean(np.minimum(cap, mid + spread))) < mean_lag:
            lo = mid
        else:
            hi = mid
    return np.minimum(cap, 0.5 * (lo + hi) + spread)


def token_lag(prediction: Prediction, spec: SystemSpec) -> TokenLag:
    """The lag per token beside the lag per sample.

    With in-flight weight updates (the pipeline) a running sequence keeps decoding across
    weight swaps: its ``j``-th token is decoded ``j l`` seconds after its first, by weights
    ``k j`` steps newer, ``k = l / step`` (``l`` the decode step's latency, ``generation_s /
    E[L]`` of the prediction; ``step`` the optimizer step). A token's lag is its sample's
    (first-token) lag ``lambda_i`` less that, and the token-weighted mean over lengths ``L_i``
    (the kept ones under ``"drop"``) is::

        token_mean = sum_i sum_{j < L_i} max(0, lambda_i - k j) / sum_i L_i
                   = mean_i lambda_i - sum L (L - 1) / (2 sum L) * k    if every lambda_i is the same
                                                                          (and no term is clamped)

    **The approximation: each sample's first-token lag.** The model gives only the mean
    (08.12) and the maximum (08.13). Here ``lambda_i = c + (L_i - E[L]) k``, the straggler
    rule (08.13) applied to every sample (a sample ``L - E[L]`` tokens longer is that many
    decode steps staler), capped at ``max_lag`` under ``"wait"`` and ``"drop"``, with ``c``
    set so the lambdas' mean is the model's mean lag. When the window is full (the mean lag
    is the bound, as under a binding ``"wait"``) every ``lambda_i`` is the bound and the
    formula above holds: the token mean is below the sample mean by ``E[L^2] / (2 E[L]) k``.
    Under FIFO the long samples hold most tokens and are the stalest, so the token mean can
    *exceed* the sample mean (by ``Var(L) / E[L] - E[L] / 2`` times ``k``, about, with a
    heavy tail). The share of tokens past the bound counts the tokens with ``lambda_i - k j
    > max_lag``: 0 under the hard rules, which hold every first token within the bound.

    Without in-flight updates (the synchronous layouts, the pipeline at ``max_lag = 0``) a
    sample is decoded by one version: the token lags are the sample lags. An unbounded
    mean lag stays infinite.
    """
    m, m_max = float(prediction.mean_lag_steps), prediction.max_lag_steps
    bound = float(spec.max_lag)
    lengths = spec.lengths_tokens.astype(np.float64)
    in_flight = prediction.layout == "pipeline" and spec.max_lag > 0
    if not in_flight:
        per_round = spec.batches_per_generation if prediction.layout != "pipeline" else 1
        hi = float(m_max)
        lags = (
            np.array([np.inf])
            if _is_unbounded(hi)
            else np.arange(int(hi) - per_round + 1, int(hi) + 1, dtype=np.float64)
        )
        share = float(np.mean(lags > bound + 1e-9))
        return TokenLag(m, m_max, m, share, 0.0, False)
    mean_l = float(lengths.mean())
    per_token_s = prediction.generation_s / mean_l
    k = per_token_s / prediction.step_s if 0 < prediction.step_s < math.inf else 0.0
    if prediction.dropped_fraction > 0 and per_token_s > 0:  # "drop": only the kept answers are trained on
        cut = (spec.lag_bound * prediction.step_s - spec.weight_sync_s) / per_token_s
        kept = lengths[lengths <= cut]
        lengths = kept if kept.size else lengths
    if not math.isfinite(m):
        return TokenLag(m, m_max, m, 0.0 if math.isinf(bound) else 1.0, k, True)
    cap = bound if spec.admission != "fifo" else math.inf
    lam = _first_token_lags(lengths, m, k, cap)
    total = float(lengths.sum())
    if k > 0:
        n = np.minimum(lengths, np.floor(np.maximum(lam, 0.0) / k) + 1.0)  # tokens with a positive lag
        token_mean = float(np.sum(n * lam - k * n * (n - 1.0) / 2.0)) / total
        over = np.clip(np.ceil((lam - bound) / k - 1e-9), 0.0, lengths) if math.isfinite(bound) else 0.0 * lam
    else:
        token_mean = float(np.sum(lengths * lam)) / total
        over = np.where(lam > bound + 1e-9, lengths, 0.0)
    share = float(np.sum(over)) / total
    return TokenLag(m, m_max, max(0.0, token_mean), share, k, True)


# --------------------------------------------------------------------------------------
# The recommendation
# --------------------------------------------------------------------------------------


def _no_round_spec(k: int) -> SystemSpec:
    raise ValueError(f"this Recommendation was built without its systems: make it with recommend() to get K={k}")


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
        ranges: each feasible layout's near-optimal splits (:func:`near_optimal_splits`).
        within: the tolerance of ``ranges``.
        round_spec: ``round_spec(k)`` is ``spec`` generating ``k`` batches per weight version
            (the first batch is ``spec``'s, the others drawn independently), as the synchronous
            layouts were tried.
        batches_per_generation: for each synchronous layout, the ``K`` batches per weight
            version of its best row (1 for the pipeline): a synchronous layout may generate
            several batches per round and train on them in turn, as PipelineRL's and verl's
            baselines do, as long as its lags ``0 .. K - 1`` (one_step: ``1 .. K``) stay
            within ``max_lag``.
    """

    spec: SystemSpec
    tp: int
    lengths: LengthDist
    best: dict[Layout, Prediction | None]
    why_not: dict[Layout, str]
    layout: Layout
    ranges: dict[Layout, SplitRange] = field(default_factory=dict)
    within: float = NEAR_OPTIMAL_WITHIN
    batches_per_generation: dict[Layout, int] = field(default_factory=dict)
    round_spec: Callable[[int], SystemSpec] = field(default=lambda k: _no_round_spec(k), repr=False, compare=False)

    @property
    def prediction(self) -> Prediction:
        p = self.best[self.layout]
        assert p is not None
        return p

    @property
    def n_gpus(self) -> int:
        """GPUs in the system (``spec.n_gpus`` units of ``tp``)."""
        return self.spec.n_gpus * self.tp

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """The recommended layout's tokens/s over every GPU."""
        return self.prediction.tokens_per_s / self.n_gpus

    @property
    def split_range(self) -> SplitRange | None:
        """The recommended layout's near-optimal splits."""
        return self.ranges.get(self.layout)

    @property
    def token_lag(self) -> TokenLag:
        """The recommended split's lag per sample and per token."""
        return token_lag(self.prediction, self.spec)


def recommend(
    n_gpus: int,
    model: str = QWEN25_7B.name,
    batch_samples: int = 1024,
    max_lag: float = 2,
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
    within: float = NEAR_OPTIMAL_WITHIN,
    colocated_slowdown: float = 1.0,
    max_dropped: float = 0.02,
    plan_for_cap: bool = True,
) -> Recommendation:
    """The best feasible layout and split for ``n_gpus`` GPUs training ``model`` (module docstring).

    Lengths are log-normal (:func:`~course_lib.layout.model.lognormal_lengths`) with
    ``mean_tokens`` and ``p99_over_median``, capped at ``max_tokens``; the KV cache is paged
    (08.2); ``admission`` decides how the pipeline keeps every lag within ``max_lag``
    (``math.inf``: unbounded, FIFO only). The synchronous layouts are also tried with
    ``K = 2 .. `` :data:`MAX_BATCHES_PER_GENERATION` batches per weight version, as far as
    their lags stay within ``max_lag`` (each round's batches drawn independently); each
    layout keeps its fastest ``K``. ``colocated_slowdown`` charges ``sync_colocated`` for sharing
    each GPU between engine and trainer: its decode step is that much longer and its trainer
    that much slower (1: no penalty; lesson 08's section 4 sizes it in verl's runs at 1.1-2.3x
    for the trainer and at least 1.4x for the engines). ``max_dropped`` is the most a "drop"
    pipeline may abort (``SystemSpec.max_dropped_fraction``). ``plan_for_cap`` plans every batch with
    one answer at the cap ``max_tokens`` (its longest answer raised to it: a bound that must hold
    plans for the worst answer the engine allows); ``False`` takes each batch as drawn, its longest
    answer the tail's. Each feasible layout also gets its splits within
    ``within`` of its best (``Recommendation.ranges``). Raises ValueError naming every
    layout's failed constraint if no layout is feasible.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: use one of {', '.join(MODELS)}")
    if not colocated_slowdown >= 1.0:
        raise ValueError(
            f"colocated_slowdown must be >= 1 (1: a colocated GPU as fast as a dedicated one), got {colocated_slowdown}"
        )
    shape = MODELS[model]
    tp = smallest_tp(shape, gpu)
    units = n_gpus // tp
    if n_gpus % tp:
        raise ValueError(f"{n_gpus} GPUs do not divide into TP{tp} units for {model}: use a multiple of {tp}")
    if units < 2:
        raise ValueError(f"{n_gpus} GPUs make {units} unit(s) of TP{tp} for {model}: need at least 2 units")
    lengths = lognormal_lengths(mean_tokens, p99_over_median, seed=seed, max_tokens=max_tokens)
    first = lengths.batch(batch_samples, seed=seed)

    def spec_for(k: int) -> SystemSpec:
        """The system generating ``k`` batches per weight version (the first is every layout's)."""
        more = lengths.batch((k - 1) * batch_samples, seed=seed + 1) if k > 1 else ()
        spec_k = spec_from_hardware(
            shape,
            tensor_parallel(gpu, tp),
            n_gpus=units,
            batch_samples=batch_samples,
            answer_tokens=first,
            prompt_tokens=prompt_tokens,
            generation_limit=max_tokens if plan_for_cap else None,
            mfu=mfu,
            efficiency=efficiency,
            extra_forward_passes=extra_forward_passes,
            weight_sync_s=shape.weight_bytes / sync_bytes_per_s,
            max_lag=max_lag,
            admission=admission,
            batches_per_generation=k,
            round_answer_tokens=(*first, *more) if k > 1 else None,
        )
        return replace(spec_k, max_dropped_fraction=max_dropped)

    spec = spec_for(1)
    best: dict[Layout, Prediction | None] = {}
    why_not: dict[Layout, str] = {}
    ranges: dict[Layout, SplitRange] = {}
    batches: dict[Layout, int] = {}
    for layout in LAYOUTS:
        for k in range(1, _max_batches(layout, max_lag) + 1):
            spec_k = spec if k == 1 else spec_for(k)
            if layout == "sync_colocated" and colocated_slowdown != 1.0:
                spec_k = _slowed(spec_k, colocated_slowdown)
            preds = _sweep(layout, spec_k)
            r = _range(layout, spec_k, preds, within, tp)
            if r is None:  # no split keeps this layout feasible
                if k == 1:
                    best[layout] = None
                    why_not[layout] = _why_none(layout, spec_k, preds)
            elif best.get(layout) is None or r.prediction.tokens_per_s > best[layout].tokens_per_s:  # type: ignore[union-attr]
                best[layout], ranges[layout], batches[layout] = r.prediction, r, k
                why_not.pop(layout, None)
    feasible = {k: p for k, p in best.items() if p is not None and p.feasible}
    if not feasible:
        raise ValueError("no layout is feasible: " + " | ".join(f"{k}: {v}" for k, v in why_not.items()))
    winner = max(feasible, key=lambda k: feasible[k].tokens_per_s)
    return Recommendation(
        spec=spec, tp=tp, lengths=lengths, best=best, why_not=why_not, layout=winner, ranges=ranges, within=within,
        batches_per_generation={k: batches.get(k, 1) for k in LAYOUTS}, round_spec=spec_for,
    )  # fmt: skip


def _slowed(spec: SystemSpec, factor: float) -> SystemSpec:
    """``spec`` with every GPU ``factor`` times slower at decoding and at training."""
    return replace(
        spec, a_s=spec.a_s * factor, b_s=spec.b_s * factor, r_s=spec.r_s * factor, f_s=spec.f_s * factor,
        train_tokens_per_s_per_gpu=spec.train_tokens_per_s_per_gpu / factor,
    )  # fmt: skip


#: The most batches per weight version :func:`recommend` tries for a synchronous layout.
MAX_BATCHES_PER_GENERATION = 8


def _max_batches(layout: Layout, max_lag: float) -> int:
    """The largest ``K`` whose lags stay within ``max_lag``: ``0 .. K - 1`` for the synchronous
    layouts, ``1 .. K`` for one_step; 1 for the pipeline (its window is ``max_lag``)."""
    if layout == "pipeline":
        return 1
    bound = MAX_BATCHES_PER_GENERATION if math.isinf(max_lag) else math.floor(max_lag + 1e-9)
    k = bound if layout == "one_step" else bound + 1
    return max(1, min(MAX_BATCHES_PER_GENERATION, k))


def recommendation_text(rec: Recommendation) -> str:
    """A fixed-width table of every layout's best feasible split, the recommended one marked ``<-``.

    Each layout's row: the best split's samplers with, in brackets, every split within
    ``rec.within`` of it (``*``: not contiguous), trainers, tokens/s over the system and per
    GPU, the step, the lag per sample (mean, max: from each sample's first token) and the
    mean lag per token (:func:`token_lag`); a layout with no feasible split is listed with
    the constraint that failed. Estimates are rounded to two significant figures (the inputs
    are uncertain by about +-30%); GPU counts are exact. The same text on every machine.
    """
    s, tp = rec.spec, rec.tp
    head = (
        f"{s.n_gpus * tp} GPUs = {s.n_gpus} units of TP{tp} | batch {s.batch_samples} samples, "
        f"mean answer {fmt_sig(s.mean_answer_tokens)} tokens (longest {_fmt_tokens(int(s.lengths_tokens.max()))}), "
        f"prompt {s.prompt_tokens:,.0f} | max_lag {_fmt_max_lag(s.max_lag)}, pipeline admission '{s.admission}' | "
        f"engine: B_max {s.max_batch} (paged KV), {fmt_sig(s.engine_full_tokens_per_s)} tokens/s full | "
        f"trainer {fmt_sig(s.train_tokens_per_s_per_gpu)} tokens/s per unit, >= {s.min_trainers} unit(s) to hold "
        "the model"
    )
    pct = f"{100 * rec.within:g}"
    lines = [
        head,
        f"{'layout (x K batches)':<18} {'samplers (' + pct + '%)':>15} {'trainers':>9} {'tokens/s':>9} {'per GPU':>8} "
        f"{'step s':>7} {'lag mean':>10} {'lag max':>10} {'token lag':>10}",
    ]
    for layout in LAYOUTS:
        p = rec.best[layout]
        if p is None:
            reason = rec.why_not.get(layout, "infeasible").split(": ", 1)[-1]
            lines.append(f"{layout:<15} infeasible: {reason}")
            continue
        r = rec.ranges.get(layout)
        samplers = r.samplers_text() if r is not None else f"{p.n_samplers * tp}"
        tl = token_lag(p, s)
        mark = "  <- recommended" if layout == rec.layout else ""
        k = rec.batches_per_generation.get(layout, 1)
        label = layout if k == 1 else f"{layout} x{k}"
        lines.append(
            f"{label:<18} {samplers:>15} {p.n_trainers * tp:>9} {fmt_sig(p.tokens_per_s):>9} "
            f"{fmt_sig(p.tokens_per_s / rec.n_gpus):>8} {fmt_sig(p.step_s):>7} {fmt_lag(p.mean_lag_steps):>10} "
            f"{fmt_lag(p.max_lag_steps):>10} {fmt_lag(tl.token_mean):>10}{mark}"
        )
    p, r, tl = rec.prediction, rec.split_range, rec.token_lag
    k = rec.batches_per_generation.get(rec.layout, 1)
    rounds = f" generating {k} batches per weight version," if k > 1 else ""
    lines.append(
        f"recommended: {rec.layout},{rounds} {p.n_samplers * tp} samplers : {p.n_trainers * tp} trainers, "
        f"{min(round(p.engine_batch), s.max_batch)} sequences per engine, {fmt_sig(p.tokens_per_s)} tokens/s "
        f"({fmt_sig(rec.tokens_per_s_per_gpu)} per GPU)."
    )
    if r is not None and r.lo != r.hi:
        gaps = "" if r.contiguous else " (not every split between them: * above)"
        lines.append(
            f"  any split of {r.lo * tp}-{r.hi * tp} samplers{gaps} is within {pct}% of it "
            f"({fmt_sig(r.tokens_per_s_lo)} tokens/s at worst): the inputs (+-30%) cannot tell them apart, "
            "see sensitivity()."
        )
    if _is_unbounded(tl.sample_mean):
        lines.append(
            "  the lag grows without bound: the trainers are the bottleneck and nothing stops finished samples "
            "queuing; give a finite max_lag, or fewer samplers (the range's low end)."
        )
    elif tl.in_flight:
        over = f", {fmt_sig(100 * tl.token_share_over_bound)}% of tokens past max_lag" if s.admission == "fifo" else ""
        lines.append(
            f"  lag per sample (first token) mean {fmt_lag(tl.sample_mean)}, max {fmt_lag(tl.sample_max)}; per token "
            f"(in-flight weight updates) mean {fmt_lag(tl.token_mean)}{over}."
        )
    return "\n".join(lines)


def best_tokens_per_s_vs_lag(spec: SystemSpec, max_lags: NDArray[np.number] | Sequence[float]) -> NDArray[np.float64]:
    """``[len(max_lags)]`` best feasible pipeline tokens/s at each staleness bound (0 = synchronous;
    ``math.inf``: unbounded; NaN where no split is feasible)."""
    out = []
    for k in max_lags:
        bound = float(k) if math.isinf(float(k)) else int(k)
        try:
            preds = _sweep("pipeline", replace(spec, max_lag=bound))
        except ValueError:
            out.append(float("nan"))
            continue
        r = _range("pipeline", spec, preds, 0.0, 1)
        out.append(float("nan") if r is None else r.best_tokens_per_s)
    return np.array(out)


# --------------------------------------------------------------------------------------
# 7. Checking a requested split
# --------------------------------------------------------------------------------------


def _advice(layout: Layout, spec: SystemSpec, p: Prediction | None, reason: str) -> str:
    """What to change to make an infeasible split feasible."""
    n = spec.n_gpus
    if reason.startswith("trainer memory"):
        return (
            f"give it at least {spec.min_trainers} trainers (n_samplers <= {n - spec.min_trainers}), "
            "or more GPUs, or a smaller model"
        )
    if reason.startswith("unbounded"):
        return "give a finite max_lag, or more trainers (fewer samplers)"
    if reason.startswith("drops"):
        return (
            "raise max_lag (a later cut drops fewer answers), cap the answer length, or use admission='wait' "
            "(wait for stragglers instead of dropping them)"
        )
    needed = fmt_lag(p.max_lag_steps) if p is not None else "more"
    if layout == "pipeline":
        return (
            f"raise max_lag to {needed}, or use admission='wait' (wait for stragglers: every lag within the bound) "
            "or 'drop' (abort them), or cap the answer length"
        )
    return f"raise max_lag to {needed}, or use a synchronous layout (sync_split, sync_colocated: lag 0)"


def check_split(layout: str, spec: SystemSpec) -> Prediction:
    """The prediction of ``layout`` at ``spec.n_samplers``, or ValueError if that split is
    infeasible: the constraint that failed (trainer memory, the lag bound, drops), what to
    change, and the layout's best feasible split if it has one."""
    name = _layout(layout)
    p = _predict(name, spec)  # ValueError for a missing or out-of-range n_samplers
    reason = _reason(p)
    if reason is None:
        assert isinstance(p, Prediction)
        return p
    pred = p if isinstance(p, Prediction) else None
    split = f"{name} at {spec.n_samplers} samplers : {spec.n_trainers} trainers" if name != "sync_colocated" else name
    msg = f"{split} is infeasible: {reason}; {_advice(name, spec, pred, reason)}"
    if name != "sync_colocated":
        try:
            r = near_optimal_splits(name, spec)
        except ValueError as exc:
            msg += f". No split of this layout is feasible ({exc})"
        else:
            msg += (
                f". Feasible instead: {r.best} samplers ({fmt_sig(r.best_tokens_per_s)} tokens/s), "
                f"within {100 * r.within:g}% at {r.lo}-{r.hi}"
            )
    raise ValueError(msg)


# --------------------------------------------------------------------------------------
# 4. The admission rules side by side
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdmissionRow:
    """One admission rule's pipeline on a system (:func:`compare_admissions`).

    Attributes:
        admission: the rule.
        feasible: whether some split keeps every sample's lag within ``max_lag`` (and the
            trainer memory, and drops within the limit).
        reason: why no split is feasible (the model's message), ``None`` if one is.
        range: the near-optimal splits, ``None`` if none is feasible.
        prediction: the best feasible split; if none is, the fastest split whose trainers hold
            the model, whatever its lag (what the rule would give without the bound), or ``None``.
        token_lag: ``prediction``'s lag per sample and per token.
    """

    admission: Admission
    feasible: bool
    reason: str | None
    range: SplitRange | None
    prediction: Prediction | None
    token_lag: TokenLag | None

    @property
    def tokens_per_s(self) -> float:
        return self.prediction.tokens_per_s if self.prediction is not None else float("nan")

    @property
    def dropped_fraction(self) -> float:
        return self.prediction.dropped_fraction if self.prediction is not None else float("nan")


def compare_admissions(
    spec: SystemSpec, within: float = NEAR_OPTIMAL_WITHIN, *, tp: int = 1
) -> tuple[AdmissionRow, ...]:
    """The pipeline under each admission rule (``"fifo"``, ``"wait"``, ``"drop"``) on ``spec``:
    best split and near-optimal range, tokens/s, lag per sample and per token, dropped share,
    and for a rule with no feasible split the reason and its fastest split that holds the model
    (marked infeasible: what the bound costs is the gap to the feasible rules)
    A rule the spec cannot take (``"wait"`` or ``"drop"`` with ``max_lag = inf``) is a row with the reason."""
    rows = []
    for rule in ADMISSIONS:
        try:
            s = replace(spec, admission=rule)
            preds = _sweep("pipeline", s)
        except ValueError as exc:
            rows.append(AdmissionRow(rule, False, str(exc), None, None, None))
            continue
        r = _range("pipeline", s, preds, within, tp)
        if r is not None:
            rows.append(AdmissionRow(rule, True, None, r, r.prediction, token_lag(r.prediction, s)))
            continue
        held = [p for p in preds if isinstance(p, Prediction) and p.n_trainers >= s.min_trainers]
        closest = max(held, key=lambda p: (p.tokens_per_s, -p.max_lag_steps)) if held else None
        tl = token_lag(closest, s) if closest is not None else None
        rows.append(AdmissionRow(rule, False, _why_none("pipeline", s, preds), None, closest, tl))
    return tuple(rows)


def admissions_text(rows: Sequence[AdmissionRow], max_lag: float | None = None) -> str:
    """A fixed-width table of :func:`compare_admissions`: a rule without a feasible split shows
    its fastest split whatever its lag (marked ``x``) and, below, why it is refused."""
    tp = next((r.range.tp for r in rows if r.range is not None), 1)
    head = "admission rules" + (f" at max_lag {_fmt_max_lag(max_lag)}" if max_lag is not None else "")
    lines = [
        head + " (lag per sample: from its first token; per token: from the weights that decoded it)",
        f"{'rule':<6} {'samplers':>14} {'tokens/s':>9} {'lag mean':>10} {'lag max':>10} {'token lag':>10} "
        f"{'tokens > bound':>15} {'dropped':>8}  feasible",
    ]
    notes = []
    for row in rows:
        p, tl = row.prediction, row.token_lag
        if p is None or tl is None:
            lines.append(f"{row.admission:<6} {'-':>14}  no split: {row.reason}")
            continue
        samplers = row.range.samplers_text() if row.range is not None else f"{p.n_samplers * tp} x"
        ok = "yes" if row.feasible else "no (below)"
        lines.append(
            f"{row.admission:<6} {samplers:>14} {fmt_sig(p.tokens_per_s):>9} {fmt_lag(p.mean_lag_steps):>10} "
            f"{fmt_lag(p.max_lag_steps):>10} {fmt_lag(tl.token_mean):>10} "
            f"{fmt_sig(100 * tl.token_share_over_bound) + '%':>15} {fmt_sig(100 * p.dropped_fraction) + '%':>8}  {ok}"
        )
        if not row.feasible:
            notes.append(f"  {row.admission}: {row.reason}")
    return "\n".join(lines + notes)


# --------------------------------------------------------------------------------------
# 3. Sensitivity to the uncertain inputs
# --------------------------------------------------------------------------------------

#: The inputs :func:`sensitivity` varies: ``recommend``'s argument names.
SENSITIVITY_INPUTS: tuple[str, ...] = ("mfu", "efficiency", "mean_tokens")


@dataclass(frozen=True)
class SensitivityRow:
    """The recommendation with one input scaled (:func:`sensitivity`).

    Attributes:
        input: ``recommend``'s argument scaled (``"baseline"``: none).
        factor: the scale (``0.7``: 30% lower).
        value: the input's value in this row (MFU and efficiency are capped at 1).
        layout: the layout recommended with this input.
        range: the near-optimal splits of the *baseline's* layout with this input (the
            layout one would deploy), ``None`` if it has no feasible split.
        error: why no recommendation or no feasible split exists, else ``None``.
    """

    input: str
    factor: float
    value: float
    layout: Layout | None
    range: SplitRange | None
    error: str | None = None

    @property
    def best_tokens_per_s(self) -> float:
        return self.range.best_tokens_per_s if self.range is not None else float("nan")


def sensitivity(
    n_gpus: int,
    *,
    factors: Sequence[float] = (0.7, 1.3),
    inputs: Sequence[str] = SENSITIVITY_INPUTS,
    **recommend_args: Any,
) -> tuple[SensitivityRow, ...]:
    """How the recommendation moves when an uncertain input is off: ``recommend(n_gpus,
    **recommend_args)`` again with each of ``inputs`` (``recommend``'s ``mfu``, ``efficiency``,
    ``mean_tokens``, or any other numeric argument) times each of ``factors``.

    Call it with ``recommend``'s own arguments: ``sensitivity(**args)`` beside
    ``recommend(**args)``. The first row is the baseline; each row holds the layout recommended
    with that input and the near-optimal splits of the baseline's layout (:func:`robust_splits`:
    the splits near-optimal in every row). MFU and efficiency are capped at 1.
    """
    params = inspect.signature(recommend).parameters
    unknown = sorted(set(recommend_args) - set(params))
    if unknown:
        raise ValueError(f"unknown argument(s) of recommend: {', '.join(unknown)}")
    bound = inspect.signature(recommend).bind(n_gpus, **recommend_args)
    bound.apply_defaults()
    base_args = dict(bound.arguments)
    for name in inputs:
        if name not in params or not isinstance(base_args[name], int | float) or name == "n_gpus":
            raise ValueError(f"cannot vary {name!r}: use numeric arguments of recommend, e.g. {SENSITIVITY_INPUTS}")
    base = recommend(**base_args)
    within = base.within
    rows = [SensitivityRow("baseline", 1.0, float("nan"), base.layout, base.split_range)]
    for name in inputs:
        for f in factors:
            value = float(base_args[name]) * f
            if name in ("mfu", "efficiency"):
                value = min(value, 1.0)
            args = {**base_args, name: type(base_args[name])(value) if name != "mean_tokens" else value}
            try:
                rec = recommend(**args)
            except ValueError as exc:
                rows.append(SensitivityRow(name, f, value, None, None, str(exc)))
                continue
            r = rec.ranges.get(base.layout)
            error = None if r is not None else rec.why_not.get(base.layout, "infeasible")
            if r is not None and r.within != within:
                r = near_optimal_splits(base.layout, rec.spec, within, tp=rec.tp)
            rows.append(SensitivityRow(name, f, value, rec.layout, r, error))
    return tuple(rows)


def robust_splits(rows: Sequence[SensitivityRow]) -> tuple[int, ...]:
    """The ``n_samplers`` (units) near-optimal in every row of :func:`sensitivity` (empty if
    some row has none, or they share none)."""
    common: set[int] | None = None
    for row in rows:
        members = set(row.range.members) if row.range is not None else set()
        common = members if common is None else common & members
    return tuple(sorted(common or ()))


def sensitivity_text(rows: Sequence[SensitivityRow]) -> str:
    """A fixed-width table of :func:`sensitivity`, with the splits that stay near-optimal throughout."""
    base = rows[0]
    layout = base.layout
    tp = base.range.tp if base.range is not None else 1
    within = f"{100 * base.range.within:g}" if base.range is not None else "?"
    lines = [
        f"sensitivity of the {layout} split (samplers: best (all within {within}%), in GPUs)",
        f"{'input':<15} {'x':>4} {'value':>7} {'samplers':>14} {'tokens/s':>9} {'per GPU':>8}  recommended layout",
    ]
    for row in rows:
        value = "" if row.input == "baseline" else fmt_sig(row.value)
        if row.range is None:
            lines.append(f"{row.input:<15} {row.factor:>4g} {value:>7} {'-':>14}  {row.error}")
            continue
        r = row.range
        lines.append(
            f"{row.input:<15} {row.factor:>4g} {value:>7} {r.samplers_text():>14} {fmt_sig(r.best_tokens_per_s):>9} "
            f"{fmt_sig(r.best_tokens_per_s_per_gpu):>8}  {row.layout}"
        )
    robust = robust_splits(rows)
    if layout == "sync_colocated":
        held = all(row.layout == layout for row in rows)
        lines.append(
            f"sync_colocated has no split to choose; it stays the recommended layout in {'every' if held else 'not every'} row"
        )
    elif robust:
        gaps = "" if len(robust) == robust[-1] - robust[0] + 1 else " (not all between)"
        lines.append(
            f"near-optimal under every row: {robust[0] * tp}-{robust[-1] * tp} samplers{gaps}: a split there "
            "survives +-30% errors in these inputs"
        )
    else:
        lines.append("no split is near-optimal under every row: measure the inputs that move it before choosing")
    return "\n".join(lines)
