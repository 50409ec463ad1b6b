"""Lesson 08's graded exercises: the largest batch beside the weights, the balanced split of
the GPUs, the pipeline's maximum lag under an admission rule (and the step a hard bound
costs), and the continuous-batching schedule of one engine.

The learner writes:

* ``max_batch(shape, gpu, context_tokens, memory_fraction) -> int``  (eq. 08.1-08.2)
* ``balanced_split(n_gpus, max_batch, a_s, b_s, c) -> (n_star, n_samplers)``  (eq. 08.3, 08.4, 08.6)
* ``max_lag_steps(mean_lag, lengths_tokens, step_latency_s, step_s, max_lag, admission) -> int``  (eq. 08.13),
  and in the same cell ``hard_bound_step_s(lengths_tokens, step_latency_s, weight_sync_s, max_lag) -> float``
  (eq. 08.14), which the exercise's checks find beside it (the function's globals: the notebook's namespace)
* ``engine_schedule(lengths, max_batch) -> (start_step, end_step)``  (the slot refill behind eq. 08.7)

What each exercise teaches, and how its checks observe it:

* max_batch: mechanism: the KV bytes of one token (K and V, every layer, every KV head, in
  bytes), the usable memory f M minus the weights, and the whole sequences that fit,
  floored, none fitting refused; observed on the published shapes and on random shapes, GPUs,
  contexts and fractions (every parameter varied), a slip that coincides with another on one
  case told apart on the next.
* balanced_split: mechanism: production per sampler from the linear decode step, the real
  balance point N c / (p + c), and the whole split as the better of its two neighbours by the
  pipeline's rate min(N_s p, (N - N_s) c), ties to fewer samplers; observed on hand splits
  where the nearest loses, a tie, random rates against every split tried, and the extremes.
* max_lag_steps / hard_bound_step_s: mechanism: the straggler's lead over the mean answer,
  in optimizer steps, added to the mean lag and rounded up (float noise no extra step), the
  hard rules capping at floor(max_lag), FIFO not; the hard bound as the straggler's whole
  generation plus one sync over floor(max_lag) steps; observed on the worked example, sums a
  float hair above a whole number, random batches (lists and arrays left unchanged), every
  rule, fractional bounds and unknown rules.
* engine_schedule: mechanism: continuous batching as events: a freed slot is taken at the
  same step boundary by the next waiting sequence in order, whichever slot frees first;
  observed against a step-by-step simulation of the engine, on hand schedules, stragglers,
  slot counts from 1 to 11, and inputs (lists and arrays) left unchanged.

The checks never call ``course_lib.layout`` or ``course_lib.layout.sim``: they build the
inputs with the library's data containers (``ModelShape``, ``GPU`` and the published
shapes) and compare with the oracles below, which mirror the lesson's equations
term by term (the split by trying every split, the schedule by simulating the engine one
decode step at a time), with hand-computed values and with properties. Each oracle takes
keyword switches that compute a known slip, so a wrong answer that matches one is named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.course.grading.checks import (
    CheckFailure,
    Exercise,
    LearnerError,
    assert_array,
    assert_true,
    call,
    check_case,
    copy_input,
    describe_type,
    fail,
    fmt_number,
    short_repr,
)
from course_lib.course.grading.vocab import as_real, assert_value_error, is_int
from course_lib.layout.model import GPU, H100_SXM, QWEN25_7B, QWEN25_32B, ModelShape

LESSON = "08_cluster_layout"


def _finite(value: Any, message: str) -> float:
    """``value`` as a finite float, or fail with ``message``."""
    f = as_real(value)
    if f is None:
        raise CheckFailure(message)
    return f


# ---------------------------------------------------------------------------------------
# Exercise 1: max_batch
# ---------------------------------------------------------------------------------------

MB = "max_batch"


def naive_max_batch(
    shape: ModelShape,
    gpu: GPU,
    context_tokens: int,
    memory_fraction: float,
    *,
    k_and_v: bool = True,
    per_layer: bool = True,
    bits: bool = False,
    rounding: str = "floor",
    use_fraction: bool = True,
    subtract_weights: bool = True,
    weights_in_params: bool = False,
    fraction_after: bool = False,
) -> int:
    """(08.2) with (08.1) written out term by term; the switches compute known slips
    (``fraction_after``: the usable share taken of what the weights leave, f (M - W))."""
    per_elem = shape.kv_bytes_per_elem * (8 if bits else 1)
    per_token = float((2 if k_and_v else 1) * (shape.n_layers if per_layer else 1) * shape.n_kv_heads * shape.head_dim)
    per_token *= per_elem
    usable = (memory_fraction if use_fraction else 1.0) * gpu.memory_bytes
    weights = shape.n_params * (1.0 if weights_in_params else shape.weight_bytes_per_param)
    free = usable - (weights if subtract_weights else 0.0)
    if fraction_after:
        free = memory_fraction * (gpu.memory_bytes - weights)
    ratio = free / (per_token * context_tokens)
    if rounding == "round":
        return round(ratio)
    if rounding == "ceil":
        return math.ceil(ratio)
    return math.floor(ratio)


def _mb_mistakes(shape: ModelShape, gpu: GPU, context: int, fraction: float) -> dict[str, int]:
    def slip(**kw: Any) -> int:
        return naive_max_batch(shape, gpu, context, fraction, **kw)

    return {
        "the factor 2 of (08.1) is missing: a key AND a value vector per token, layer and KV head": slip(k_and_v=False),
        "every layer keeps its own keys and values: multiply by n_layers (08.1)": slip(per_layer=False),
        "8 times too many bytes a token: that counts bits; sizes are in bytes (kv_bytes_per_elem)": slip(bits=True),
        "rounded to the nearest; a sequence that fits partly does not fit: round down": slip(rounding="round"),
        "rounded up; a sequence that fits partly does not fit: round down": slip(rounding="ceil"),
        "all of the GPU's memory is used; only memory_fraction * memory_bytes is usable": slip(use_fraction=False),
        "the weights are not subtracted: the cache gets what they leave": slip(subtract_weights=False),
        "the weights count one byte a parameter; use shape.weight_bytes": slip(weights_in_params=True),
        "memory_fraction was applied to what the weights leave, f (M - W); the usable memory is f M, and the "
        "weights sit inside it: f M - W": slip(fraction_after=True),
    }


def _mb_text(shape: ModelShape, gpu: GPU, context: int, fraction: float) -> str:
    return f"{MB}({shape.name}, {gpu.name}, {context}, {fmt_number(fraction)})"


#: (shape, gpu, context_tokens, memory_fraction)
MbCase = tuple[ModelShape, GPU, int, float]


def _mb_slip(fn: Callable[..., Any], case: MbCase, value: float, others: Sequence[MbCase]) -> str | None:
    """The known slip that gives ``value`` on ``case``; when several do, the one that also
    gives the learner's answers on ``others`` (two slips can coincide on one case)."""
    expected = naive_max_batch(*case)
    matching = [m for m, wrong in _mb_mistakes(*case).items() if wrong != expected and value == wrong]
    for other in others:
        if len(matching) < 2:
            break
        try:
            answer = call(fn, *other)
        except LearnerError:
            continue
        slips = _mb_mistakes(*other)
        matching = [m for m in matching if as_real(answer) == slips[m]] or matching
    return matching[0] if matching else None


def _mb_compare(
    fn: Callable[..., Any], shape: ModelShape, gpu: GPU, context: int, fraction: float, others: Sequence[MbCase] = ()
) -> None:
    expected = naive_max_batch(shape, gpu, context, fraction)
    what = _mb_text(shape, gpu, context, fraction)
    try:
        got = call(fn, shape, gpu, context, fraction)
    except LearnerError as exc:  # "nothing fits" where something does: name the slip that shrank it
        if isinstance(exc.error, ValueError):
            for message, wrong in _mb_mistakes(shape, gpu, context, fraction).items():
                if wrong < 1:
                    fail(f"{what} raised ValueError, but {expected} sequences fit: {message}")
        raise
    value = _finite(got, f"{what} returned {describe_type(got)}; expected an int (a number of sequences)")
    if value == expected:
        assert_true(is_int(got), f"{what} returned {fmt_number(got)}, a float; return an int (whole sequences)")
        return
    slip = _mb_slip(fn, (shape, gpu, context, fraction), value, others)
    if slip is not None:
        fail(f"{what} = {fmt_number(got)}: {slip}")
    fail(f"{what} = {fmt_number(got)}; expected {expected} (08.2)")


GPU_24GB = GPU("a 24 GB GPU", memory_bytes=24e9, hbm_bytes_per_s=1e12, peak_flops=1e14)
GPU_40GB = GPU("a 40 GB GPU", memory_bytes=40e9, hbm_bytes_per_s=1.5e12, peak_flops=3e14)
GPU_141GB = GPU("a 141 GB GPU", memory_bytes=141e9, hbm_bytes_per_s=4.8e12, peak_flops=989e12)


@check_case("hand-computed: Qwen2.5-32B and 7B on an H100 (6 and 241 sequences of 4,096 tokens)")
def _mb_known(fn: Callable[..., Any]) -> None:
    cases: tuple[MbCase, ...] = (
        (QWEN25_32B, H100_SXM, 4096, 0.9),  # 6.03 -> 6 (rounding up gives 7)
        (QWEN25_7B, H100_SXM, 4096, 0.9),  # 241.6 -> 241 (rounding to the nearest gives 242)
        (QWEN25_7B, H100_SXM, 32768, 0.9),  # 30.2 -> 30
        (QWEN25_7B, GPU_24GB, 2048, 0.8),  # 33.7 -> 33
    )
    for k, case in enumerate(cases):
        _mb_compare(fn, *case, others=cases[k + 1 :])


def random_shapes(seed: int, n: int) -> list[tuple[ModelShape, GPU, int, float]]:
    """Random (shape, gpu, context, fraction) with at least one sequence fitting and the
    quotient of (08.2) away from a whole number (so float rounding cannot flip the floor)."""
    rng = np.random.default_rng(seed)
    gpus = (GPU_24GB, GPU_40GB, H100_SXM, GPU_141GB)
    out: list[tuple[ModelShape, GPU, int, float]] = []
    while len(out) < n:
        n_layers = int(rng.integers(4, 96))
        shape = ModelShape(
            name=f"a {n_layers}-layer model",
            n_params=float(rng.uniform(0.3e9, 40e9)),
            n_layers=n_layers,
            n_kv_heads=int(rng.choice([1, 2, 4, 8, 16])),
            head_dim=int(rng.choice([64, 96, 128, 256])),
            weight_bytes_per_param=float(rng.choice([1.0, 2.0])),
            kv_bytes_per_elem=float(rng.choice([1.0, 2.0, 4.0])),
        )
        gpu = gpus[int(rng.integers(0, len(gpus)))]
        context = int(rng.choice([512, 1024, 3000, 4096, 8192, 16384]))
        fraction = float(rng.choice([0.8, 0.85, 0.9, 0.95, 1.0]))
        per_token = 2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem
        ratio = (fraction * gpu.memory_bytes - shape.weight_bytes) / (per_token * context)
        if ratio >= 1 and 0.02 < ratio - math.floor(ratio) < 0.98:
            out.append((shape, gpu, context, fraction))
    return out


@check_case("random shapes, GPUs and contexts against (08.1)-(08.2) written out term by term")
def _mb_oracle(fn: Callable[..., Any]) -> None:
    for shape, gpu, context, fraction in random_shapes(0, 25):
        _mb_compare(fn, shape, gpu, context, fraction)


@check_case("raises ValueError when the weights leave no room for one sequence")
def _mb_too_big(fn: Callable[..., Any]) -> None:
    for shape, gpu, context, why in (
        (QWEN25_32B, GPU_40GB, 1024, "the weights alone (65.5 GB) do not fit"),
        (QWEN25_32B, H100_SXM, 32768, "0.75 of a sequence fits"),
    ):
        what = _mb_text(shape, gpu, context, 0.9)
        no_error = f"{what} returned; expected ValueError ({why}): a batch of 0 or fewer is no sampler"
        assert_value_error(fn, shape, gpu, context, 0.9, what=what, no_error=no_error)


MAX_BATCH = Exercise(
    name=MB,
    allowed=("course_lib.layout.model.ModelShape", "course_lib.layout.model.GPU"),
    points=10,
    title="the largest batch whose KV cache fits beside the weights (eq. 08.1-08.2)",
    checks=(_mb_known, _mb_oracle, _mb_too_big),
    hints=(
        "Three steps: the bytes one token occupies in the KV cache (08.1: K and V, every layer, every KV head), the "
        "bytes left beside the weights in the usable share of the GPU's memory, then how many whole sequences of "
        "`context_tokens` tokens fit in them.",
        "Round down (`math.floor`): a sequence that fits only partly does not fit, and the answer is an int. Raise "
        "`ValueError` when not one sequence fits. Traps: forgetting the factor 2 (K and V), and counting attention "
        "heads instead of KV heads.",
        "Qwen2.5-7B in bf16: 2 * 28 * 4 * 128 * 2 = 57,344 bytes a token; an H100 leaves 0.9 * 80e9 - 15.24e9 = "
        "56.76e9 bytes: 241.6 sequences of 4,096 tokens.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: balanced_split
# ---------------------------------------------------------------------------------------

BS = "balanced_split"


def naive_split(
    n_gpus: int,
    max_batch: int,
    a_s: float,
    b_s: float,
    c: float,
    *,
    pick: str = "best",
    swapped: bool = False,
    no_trainer_share: bool = False,
    per_step: bool = False,
) -> tuple[float, int]:
    """``(N_s*, best split)``: (08.6) with ``p`` from (08.3)-(08.4), the split by trying every
    ``N_s`` in ``1 .. N - 1`` (first best). ``pick`` computes a known slip for the whole split
    (``"round"``, ``"floor"``, ``"ceil"``: of ``N_s*``, clipped; ``"last"``: ties to more)."""
    p = (1.0 if per_step else max_batch) / (a_s + b_s * max_batch)
    if no_trainer_share:
        n_star = n_gpus * c / p
    elif swapped:
        n_star = n_gpus * p / (p + c)
    else:
        n_star = n_gpus * c / (p + c)
    roundings: dict[str, Callable[[float], int]] = {"round": round, "floor": math.floor, "ceil": math.ceil}
    rounded = roundings.get(pick)
    if rounded is not None:
        return n_star, min(max(int(rounded(n_star)), 1), n_gpus - 1)
    best, best_rate = 1, -math.inf
    for k in range(1, n_gpus):
        rate = min(k * p, (n_gpus - k) * c)
        if rate > best_rate or (pick == "last" and rate == best_rate):
            best, best_rate = k, rate
    return n_star, best


def _bs_call(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[float, Any, str]:
    n, b, a_s, b_s, c = args
    what = f"{BS}({n}, {b}, {fmt_number(a_s)}, {fmt_number(b_s)}, {fmt_number(c)})"
    got = call(fn, *args)
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{what} returned {describe_type(got)}; expected a tuple (n_star, n_samplers)")
    n_star = _finite(got[0], f"{what}: n_star is {describe_type(got[0])}; expected a finite float, N c / (p + c)")
    return n_star, got[1], what


def _bs_compare(fn: Callable[..., Any], *args: Any) -> None:
    n_star, n_samplers, what = _bs_call(fn, args)
    want_star, want_n = naive_split(*args)
    if not math.isclose(n_star, want_star, rel_tol=1e-9, abs_tol=1e-12):
        star_slips: dict[str, dict[str, Any]] = {
            "p and c are swapped: N_s* = N c / (p + c)": dict(swapped=True),
            "this solves N_s p = N c; the trainers are the other N - N_s GPUs": dict(no_trainer_share=True),
            "p is per decode step; a step makes max_batch tokens: p = max_batch / l(max_batch)": dict(per_step=True),
        }
        for message, slip in star_slips.items():
            wrong = naive_split(*args, **slip)[0]
            if not math.isclose(wrong, want_star, rel_tol=1e-9) and math.isclose(n_star, wrong, rel_tol=1e-9):
                fail(f"{what}: n_star = {fmt_number(n_star)}; {message}")
        fail(f"{what}: n_star = {fmt_number(n_star)}; expected {fmt_number(want_star)} (08.6)")
    if not is_int(n_samplers):
        fail(f"{what}: n_samplers is {describe_type(n_samplers)}; expected an int (whole GPUs)")
    k = int(n_samplers)
    if not 1 <= k <= args[0] - 1:
        fail(f"{what}: n_samplers = {k} leaves the range 1 .. {args[0] - 1}: keep at least one sampler and one trainer")
    if k == want_n:
        return
    pick_slips = {
        "last": "on a tie, take the fewer samplers (the first best)",
        "round": "N_s* rounded to the nearest (the split whose production and consumption are closest) is not always "
        "best: compare min(N_s p, (N - N_s) c) on both sides",
        "floor": "N_s* rounded down is not always best: compare min(N_s p, (N - N_s) c) on both sides",
        "ceil": "N_s* rounded up is not always best: compare min(N_s p, (N - N_s) c) on both sides",
    }
    for pick, message in pick_slips.items():
        wrong = naive_split(*args, pick=pick)[1]
        if wrong != want_n and k == wrong:
            fail(f"{what}: n_samplers = {k}; {message}")
    fail(f"{what}: n_samplers = {k}; expected {want_n}, the split with the highest min(N_s p, (N - N_s) c)")


@check_case("hand-computed splits: the nearest is not always the best; a tie goes to fewer samplers")
def _bs_known(fn: Callable[..., Any]) -> None:
    # Qwen2.5-7B on 64 H100s: p = 9,579 tokens/s, c = 8,653 tokens/s; N_s* = 30.37 -> 30
    _bs_compare(fn, 64, 241, 0.004549253731343283, 8.552324305751324e-05, 8652.668416447945)
    _bs_compare(fn, 8, 1, 0.25, 0.0, 1.0)  # p = 4: N_s* = 1.6 -> 2 (rounding down loses)
    _bs_compare(fn, 7, 1, 0.25, 0.0, 1.0)  # N_s* = 1.4 -> 2 (the nearest, 1, loses)
    _bs_compare(fn, 4, 1, 0.2, 0.0, 2.0)  # p = 5, c = 2: N_s* = 1.14 -> 1 (rounding up loses)
    _bs_compare(fn, 10, 1, 1.0, 0.0, 2.0)  # p = 1, c = 2: N_s* = 6.67; 6 and 7 both give 6 tokens/s -> 6


def random_rates(seed: int, n: int) -> list[tuple[int, int, float, float, float]]:
    """Random (n_gpus, max_batch, a_s, b_s, c) whose two candidate splits are not (nearly) tied."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, int, float, float, float]] = []
    while len(out) < n:
        args = (
            int(rng.integers(2, 130)),
            int(rng.integers(1, 512)),
            float(rng.uniform(1e-3, 2e-2)),
            float(rng.uniform(0.0, 1e-3)),
            float(np.exp(rng.uniform(np.log(100.0), np.log(50000.0)))),
        )
        n_gpus, b, a_s, b_s, c = args
        p = b / (a_s + b_s * b)
        rates = sorted(min(k * p, (n_gpus - k) * c) for k in range(1, n_gpus))
        if len(rates) < 2 or rates[-1] - rates[-2] > 1e-6 * rates[-1]:
            out.append(args)
    return out


@check_case("random rates against trying every split 1 .. N - 1")
def _bs_oracle(fn: Callable[..., Any]) -> None:
    for args in random_rates(0, 40):
        _bs_compare(fn, *args)


@check_case("extremes: far faster or far slower samplers give 1 or N - 1 (one of each role at least)")
def _bs_extremes(fn: Callable[..., Any]) -> None:
    _bs_compare(fn, 16, 256, 0.01, 1e-5, 1.0)  # trainers nearly free: N_s* ~ 0.0001 -> 1
    _bs_compare(fn, 16, 1, 0.5, 0.0, 1e6)  # samplers nearly idle: N_s* ~ 16 -> 15
    _bs_compare(fn, 2, 64, 0.01, 1e-4, 5000.0)  # two GPUs: one of each
    _bs_compare(fn, 3, 1, 1.0, 0.0, 1e-3)  # N_s* = 0.003 -> 1


BALANCED_SPLIT = Exercise(
    name=BS,
    points=10,
    title="the split where production meets consumption, real and whole (eq. 08.3, 08.4, 08.6)",
    checks=(_bs_known, _bs_oracle, _bs_extremes),
    hints=(
        "First the continuous optimum (08.6): a sampler's throughput p from its batch and the latency model, then the "
        "N_s* that balances production and consumption. Then the whole split: compare the two whole numbers around "
        "N_s*.",
        "A full sampler produces `max_batch` tokens (one per sequence) per decode step of `a_s + b_s * max_batch` "
        "seconds: p is per second, not per step. A split with n samplers runs at the smaller of what the n samplers "
        "produce and what the other n_gpus - n GPUs consume; the candidates are the floor and the ceiling of N_s*, "
        "each clipped to 1 .. n_gpus - 1.",
        "Try the candidates in increasing order and keep the first best (Python's `max` with a `key` keeps the first "
        "on a tie, so the fewer samplers win). With p = 4, c = 1 and 7 GPUs: N_s* = 1.4; 1 sampler gives min(4, 6) = "
        "4, 2 give min(8, 5) = 5. The nearest is not the best.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: max_lag_steps, with hard_bound_step_s written in the same cell
# ---------------------------------------------------------------------------------------

MX = "max_lag_steps"
HB = "hard_bound_step_s"
ADMISSION_NAMES = ("fifo", "wait", "drop")
#: A batch, as the checks pass it: a list of ints or an int array.
Lengths = list[int] | NDArray[np.int64]


def naive_max_lag(
    mean_lag: float,
    lengths: Sequence[int],
    latency_s: float,
    step_s: float,
    max_lag: float,
    admission: str,
    *,
    lead: str = "excess",
    in_steps: bool = True,
    rounding: str = "ceil",
    cap: str = "hard rules",
) -> float:
    """(08.13) written out, capped at ``floor(max_lag)`` under the hard rules ("wait", "drop").

    The switches compute known slips: ``lead`` ``"none"`` (the mean lag: the mean length
    used for the longest), ``"whole"`` (``max(L) l``, not ``(max(L) - mean(L)) l``) or
    ``"range"`` (``(max(L) - min(L)) l``); ``in_steps=False`` (the lead's seconds added as
    steps); ``rounding`` ``"round"``, ``"floor"``, ``"none"`` or ``"ceil_raw"`` (no 1e-9:
    float noise above a whole number is one more step); ``cap`` ``"never"``, ``"always"``
    or ``"unfloored"``.
    """
    longest = float(max(lengths))
    mean_length = float(sum(lengths)) / len(lengths)
    lead_tokens = {
        "excess": longest - mean_length,
        "none": 0.0,
        "whole": longest,
        "range": longest - float(min(lengths)),
    }[lead]
    lead_s = lead_tokens * latency_s  # seconds the longest answer runs after the mean one
    total = mean_lag + (lead_s / step_s if in_steps else lead_s)
    lag: float
    if rounding == "ceil":
        lag = math.ceil(total - 1e-9)  # 1e-9: float noise is no extra step
    elif rounding == "ceil_raw":
        lag = math.ceil(total)
    elif rounding == "round":
        lag = round(total)
    elif rounding == "floor":
        lag = math.floor(total)
    else:
        lag = total
    hard = admission in ("wait", "drop")
    if (cap == "hard rules" and hard) or cap == "always":
        return min(lag, math.floor(max_lag))
    if cap == "unfloored" and hard:
        return min(lag, max_lag)
    return lag


#: Each slip the grader names, with the switches of :func:`naive_max_lag` that compute it
#: (the first that matches a wrong answer is named).
MX_SLIPS: dict[str, dict[str, Any]] = {
    "that is ceil(mean_lag), the mean sample's lag (08.12); the maximum is the longest answer's, max(lengths), "
    "(max(L) - mean(L)) l / step_s steps later (08.13)": dict(lead="none"),
    "that is the mean lag (08.12); the maximum adds the longest answer's (max(L) - mean(L)) l / step_s steps "
    "and rounds up (08.13)": dict(lead="none", rounding="none", cap="never"),
    "that is the FIFO value; under 'wait' and 'drop' (hard rules) every lag is at most floor(max_lag)": dict(
        cap="never"
    ),
    "'fifo' bounds nothing: a straggler taken first come, first served keeps its lag (08.13), even past "
    "max_lag; only 'wait' and 'drop' cap it": dict(cap="always"),
    "lags are whole steps: a hard rule caps them at floor(max_lag), not max_lag": dict(cap="unfloored"),
    "the longest answer runs (max(L) - mean(L)) l seconds after the mean one, not max(L) l: the mean lag "
    "already counts the mean answer": dict(lead="whole"),
    "(max(L) - mean(L)) l is in seconds: divide by step_s for optimizer steps": dict(in_steps=False),
    "rounded to the nearest; a sample that misses part of an update misses it: round up (math.ceil)": dict(
        rounding="round"
    ),
    "rounded down; a sample that misses part of an update misses it: round up (math.ceil)": dict(rounding="floor"),
    "float noise made one more step: the sum is a whole number up to rounding (such as 15.000000000000002); "
    "subtract 1e-9 inside the ceiling, math.ceil(x - 1e-9), as the statement says": dict(rounding="ceil_raw"),
    "the lead is over the MEAN answer, (max(L) - mean(L)) l, not over the shortest: the mean lag already counts "
    "the mean answer": dict(lead="range"),
}


def _lengths_text(lengths: Sequence[int]) -> str:
    mean_length = float(sum(lengths)) / len(lengths)
    return f"<{len(lengths)} lengths, mean {fmt_number(mean_length)}, max {int(max(lengths))}>"


def _same_lengths(given: Any, lengths: Lengths) -> bool:
    """``given`` still holds ``lengths`` (the learner's function left its input alone)."""
    try:
        return bool(np.array_equal(np.asarray(given), np.asarray(lengths)))
    except Exception:
        return False


#: (mean_lag, lengths, l, step_s, max_lag, admission)
MxCase = tuple[float, Lengths, float, float, float, str]


def _mx_matches(args: tuple[Any, ...], value: float) -> list[str]:
    """The slips of :data:`MX_SLIPS` that give ``value`` on ``args`` where the right answer differs."""
    expected = naive_max_lag(*args)
    return [
        message
        for message, slip in MX_SLIPS.items()
        if (wrong := naive_max_lag(*args, **slip)) != expected
        and math.isclose(value, wrong, rel_tol=1e-12, abs_tol=1e-12)
    ]


def _mx_slip(fn: Callable[..., Any], args: tuple[Any, ...], value: float, others: Sequence[MxCase]) -> str | None:
    """The known slip that gives ``value`` on ``args``; when several do, the one that also
    gives the learner's answers on ``others`` (two slips can coincide on one case)."""
    matching = _mx_matches(args, value)
    for other in others:
        if len(matching) < 2:
            break
        other_args = (other[0], [int(x) for x in other[1]], *other[2:])
        try:
            answer = as_real(call(fn, other[0], copy_input(other[1]), *other[2:]))
        except LearnerError:
            continue
        if answer is None:
            continue
        expected = naive_max_lag(*other_args)
        keep = [
            m
            for m in matching
            if math.isclose(answer, naive_max_lag(*other_args, **MX_SLIPS[m]), rel_tol=1e-12, abs_tol=1e-12)
            or answer == expected == naive_max_lag(*other_args, **MX_SLIPS[m])
        ]
        matching = keep or matching
    return matching[0] if matching else None


def _mx_compare(
    fn: Callable[..., Any],
    mean_lag: float,
    lengths: Lengths,
    latency_s: float,
    step_s: float,
    max_lag: float,
    admission: str,
    others: Sequence[MxCase] = (),
) -> None:
    args = (mean_lag, [int(x) for x in lengths], latency_s, step_s, max_lag, admission)
    expected = naive_max_lag(*args)
    what = (
        f"{MX}({fmt_number(mean_lag)}, {_lengths_text(args[1])}, {fmt_number(latency_s)}, {fmt_number(step_s)}, "
        f"{fmt_number(max_lag)}, {admission!r})"
    )
    given = copy_input(lengths)
    got = call(fn, mean_lag, given, latency_s, step_s, max_lag, admission)
    assert_true(_same_lengths(given, lengths), f"{what} changed the lengths it was given; work on a copy")
    value = _finite(got, f"{what} returned {describe_type(got)}; expected an int (whole optimizer steps)")
    if value == expected:
        assert_true(is_int(got), f"{what} returned {fmt_number(got)}, a float; return an int (lags are whole steps)")
        return
    message = _mx_slip(fn, args, value, others)
    if message is not None:
        fail(f"{what} = {fmt_number(got)}: {message}")
    rule = ", capped at floor(max_lag)" if admission in ("wait", "drop") else ""
    fail(f"{what} = {fmt_number(got)}; expected {expected} (08.13{rule})")


#: The exercise's worked example: 7 answers of 100 tokens and one of 900 (mean 200).
WORKED_LENGTHS = (100,) * 7 + (900,)
#: (mean_lag, lengths, l, step_s, max_lag, admission) checked by hand; the comments give the answers.
MX_HAND_CASES: tuple[tuple[float, Lengths, float, float, float, str], ...] = (
    (1.3, list(WORKED_LENGTHS), 0.02, 4.0, 3, "fifo"),  # 1.3 + 700 * 0.02 / 4 = 4.8 -> 5
    (1.3, list(WORKED_LENGTHS), 0.02, 4.0, 3, "wait"),  # min(5, 3) = 3
    (1.3, np.array(WORKED_LENGTHS), 0.02, 4.0, 3, "drop"),  # 3
    (1.3, list(WORKED_LENGTHS), 0.02, 4.0, 3.5, "wait"),  # floor(3.5) = 3
    (1.3, list(WORKED_LENGTHS), 0.02, 4.0, 2.5, "fifo"),  # 5: fifo bounds nothing
    (0.9, list(WORKED_LENGTHS), 0.02, 4.0, 8, "wait"),  # 0.9 + 3.5 = 4.4 -> 5, under the bound
    (2.0, [256, 256, 256, 256], 0.01, 2.0, 3, "fifo"),  # no straggler: the mean lag, 2
    (1.0, list(WORKED_LENGTHS), 0.07, 3.5, 16, "fifo"),  # 1 + 700 * 0.07 / 3.5 = 15 (in floats 15.000000000000002)
    (0.2, np.array([10, 20, 30, 100]), 0.07, 1.5, 4, "wait"),  # 0.2 + 60 * 0.07 / 1.5 = 3 (3.0000000000000004)
    (0.5, np.array([40, 60, 500, 80, 120]), 0.05, 10.0, 1, "drop"),  # 0.5 + 340 * 0.05 / 10 = 2.2 -> 3; 1
)


@check_case(
    "hand-computed: the worked example under fifo, wait and drop; a fractional max_lag; no straggler; sums a float "
    "hair above a whole number"
)
def _mx_known(fn: Callable[..., Any]) -> None:
    for k, case in enumerate(MX_HAND_CASES):
        _mx_compare(fn, *case, others=MX_HAND_CASES[k + 1 :])


def random_lag_cases(seed: int, n: int) -> list[tuple[float, Lengths, float, float, float, str]]:
    """Random (mean_lag, lengths, l, step_s, max_lag, admission), lists and arrays, some with a
    long straggler; (08.13)'s quotient away from a whole number (float noise cannot flip the
    ceiling) and ``mean_lag <= max_lag`` as in the model."""
    rng = np.random.default_rng(seed)
    bounds: tuple[float, ...] = (1, 2, 3, 4, 6, 8, 1.5, 2.5, 3.25)
    out: list[tuple[float, Lengths, float, float, float, str]] = []
    while len(out) < n:
        size = int(rng.integers(1, 65))
        if rng.random() < 0.5:
            lengths = rng.integers(1, 2048, size=size)
        else:  # a body and one straggler
            lengths = rng.integers(50, 400, size=size)
            lengths[rng.integers(0, size)] = rng.integers(1000, 8000)
        latency_s = float(rng.uniform(1e-3, 0.05))
        step_s = float(np.exp(rng.uniform(np.log(0.5), np.log(60.0))))
        max_lag = bounds[int(rng.integers(0, len(bounds)))]
        mean_lag = float(rng.uniform(0.05, max_lag))
        admission = ADMISSION_NAMES[int(rng.integers(0, 3))]
        total = mean_lag + (float(lengths.max()) - float(lengths.mean())) * latency_s / step_s
        if abs(total - round(total)) < 1e-6:
            continue
        batch: Lengths = lengths.astype(np.int64) if len(out) % 2 else [int(x) for x in lengths]
        out.append((mean_lag, batch, latency_s, step_s, max_lag, admission))
    return out


@check_case("random batches, latencies, step times and rules against (08.13) written out term by term")
def _mx_oracle(fn: Callable[..., Any]) -> None:
    for case in random_lag_cases(0, 40):
        _mx_compare(fn, *case)


@check_case("an unknown admission rule raises ValueError naming fifo, wait and drop")
def _mx_unknown(fn: Callable[..., Any]) -> None:
    for name in ("async", "hard", ""):
        what = f"{MX}(1.3, <8 lengths>, 0.02, 4.0, 3, {name!r})"
        try:
            fn(1.3, list(WORKED_LENGTHS), 0.02, 4.0, 3, name)
        except ValueError as exc:
            if any(rule not in str(exc) for rule in ADMISSION_NAMES):
                fail(
                    f"{what} raised ValueError({short_repr(str(exc), max_chars=60)}); its message should name "
                    f"the accepted rules: {', '.join(ADMISSION_NAMES)}"
                )
            continue
        except NotImplementedError:
            raise
        except Exception as exc:
            fail(f"{what} raised {type(exc).__name__}; expected ValueError")
        fail(f"{what} returned; expected ValueError: the rules are {', '.join(ADMISSION_NAMES)}")


# The hard bound (08.14): graded through the same exercise, found beside max_lag_steps.


def naive_hard_bound(
    lengths: Sequence[int],
    latency_s: float,
    sync_s: float,
    max_lag: float,
    *,
    longest: str = "max",
    sync: str = "once",
    steps: str = "floor",
) -> float:
    """(08.14) written out: ``(max(L) l + d) / floor(max_lag)``. The switches compute known
    slips: ``longest`` ``"mean"`` or ``"lead"`` (max(L) - mean(L)); ``sync`` ``"none"`` or ``"every step"``; ``steps``
    ``"unfloored"``, ``"one"`` or ``"plus one"``."""
    mean_length = float(sum(lengths)) / len(lengths)
    straggler = {"max": float(max(lengths)), "mean": mean_length, "lead": float(max(lengths)) - mean_length}[longest]
    k = {
        "floor": math.floor(max_lag),
        "unfloored": max_lag,
        "one": 1,
        "plus one": math.floor(max_lag) + 1,
    }[steps]
    generate_s = straggler * latency_s  # the straggler's time on the engine
    if sync == "none":
        return generate_s / k
    if sync == "every step":
        return generate_s / k + sync_s
    return (generate_s + sync_s) / k


HB_SLIPS: dict[str, dict[str, Any]] = {
    "the weight sync is missing: the update trained on the straggler must also reach the samplers, "
    "(L_max l + d) / floor(max_lag)": dict(sync="none"),
    "the bound is floor(max_lag) whole steps (lags are whole steps): divide by floor(max_lag), not max_lag": dict(
        steps="unfloored"
    ),
    "the longest answer, max(lengths), is the straggler that must finish in time, not the mean one": dict(
        longest="mean"
    ),
    "the straggler must finish all of its max(L) tokens in time, not only its lead over the mean answer: "
    "(L_max l + d) / floor(max_lag)": dict(longest="lead"),
    "the straggler has floor(max_lag) steps to finish in, not one: divide by floor(max_lag)": dict(steps="one"),
    "the sync is paid once within the floor(max_lag) steps: (L_max l + d) / floor(max_lag), not "
    "L_max l / floor(max_lag) + d": dict(sync="every step"),
    "off by one: a lag of at most floor(max_lag) gives the straggler floor(max_lag) steps, not "
    "floor(max_lag) + 1": dict(steps="plus one"),
}


def _companion(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The learner's ``hard_bound_step_s``: defined beside ``max_lag_steps`` (same globals)."""
    namespace = getattr(fn, "__globals__", None)
    companion = namespace.get(HB) if isinstance(namespace, dict) else None
    if not callable(companion):
        fail(f"{HB} is not defined beside {MX}: this exercise grades both; write it in the same cell (08.14)")
    assert companion is not None
    return companion


def _hb_call(companion: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(companion, *args)
    except LearnerError as exc:
        if isinstance(exc.error, NotImplementedError):
            fail(f"{HB} still raises NotImplementedError: write it too, this exercise grades both functions (08.14)")
        raise


def _hb_compare(fn: Callable[..., Any], lengths: Lengths, latency_s: float, sync_s: float, max_lag: float) -> None:
    companion = _companion(fn)
    batch = [int(x) for x in lengths]
    expected = naive_hard_bound(batch, latency_s, sync_s, max_lag)
    what = f"{HB}({_lengths_text(batch)}, {fmt_number(latency_s)}, {fmt_number(sync_s)}, {fmt_number(max_lag)})"
    given = copy_input(lengths)
    got = _hb_call(companion, given, latency_s, sync_s, max_lag)
    assert_true(_same_lengths(given, lengths), f"{what} changed the lengths it was given; work on a copy")
    value = _finite(got, f"{what} returned {describe_type(got)}; expected a finite float (seconds)")
    if math.isclose(value, expected, rel_tol=1e-9):
        return
    for message, slip in HB_SLIPS.items():
        wrong = naive_hard_bound(batch, latency_s, sync_s, max_lag, **slip)
        if not math.isclose(wrong, expected, rel_tol=1e-9) and math.isclose(value, wrong, rel_tol=1e-9):
            fail(f"{what} = {fmt_number(value)}: {message}")
    fail(f"{what} = {fmt_number(value)}; expected {fmt_number(expected)} s, (max(L) l + d) / floor(max_lag) (08.14)")


#: (lengths, l, d, max_lag) checked by hand; the comments give the answers.
HB_HAND_CASES: tuple[tuple[Lengths, float, float, float], ...] = (
    (list(WORKED_LENGTHS), 0.02, 1.0, 3),  # (900 * 0.02 + 1) / 3 = 6.333 s
    (list(WORKED_LENGTHS), 0.02, 1.0, 2),  # 19 / 2 = 9.5 s
    (np.array(WORKED_LENGTHS), 0.02, 1.0, 3.5),  # floor(3.5) = 3: 6.333 s
    (list(WORKED_LENGTHS), 0.02, 1.0, 1),  # one step: 19 s
    (np.array([300, 1200, 450]), 0.01, 0.0, 4),  # no sync: 12 / 4 = 3 s
)


@check_case(f"{HB}: hand-computed (08.14), a fractional max_lag, then random batches against it written out")
def _hb_values(fn: Callable[..., Any]) -> None:
    for case in HB_HAND_CASES:
        _hb_compare(fn, *case)
    rng = np.random.default_rng(1)
    for i in range(20):
        lengths = rng.integers(1, 4000, size=int(rng.integers(1, 65)))
        batch: Lengths = lengths.astype(np.int64) if i % 2 else [int(x) for x in lengths]
        sync_s = 0.0 if i % 5 == 0 else float(rng.uniform(0.01, 30.0))
        max_lag = (1, 2, 3, 4, 8, 1.5, 2.75)[i % 7]
        _hb_compare(fn, batch, float(rng.uniform(1e-3, 0.05)), sync_s, max_lag)


@check_case(f"{HB} raises ValueError when max_lag < 1 (a bound below one step is synchronous RL)")
def _hb_invalid(fn: Callable[..., Any]) -> None:
    companion = _companion(fn)
    for max_lag in (0, 0.5):
        what = f"{HB}(<8 lengths>, 0.02, 1.0, {fmt_number(max_lag)})"
        try:
            companion(list(WORKED_LENGTHS), 0.02, 1.0, max_lag)
        except ValueError:
            continue
        except NotImplementedError:
            fail(f"{HB} still raises NotImplementedError: write it too, this exercise grades both functions (08.14)")
        except Exception as exc:
            fail(f"{what} raised {type(exc).__name__}; expected ValueError: floor(max_lag) = 0 steps is synchronous RL")
        fail(f"{what} returned; expected ValueError: floor(max_lag) = 0 steps bounds every lag by 0, synchronous RL")


MAX_LAG_STEPS = Exercise(
    name=MX,
    points=15,
    title="the maximum lag under an admission rule, and the step a hard bound costs (eq. 08.13-08.14)",
    checks=(_mx_known, _mx_oracle, _mx_unknown, _hb_values, _hb_invalid),
    hints=(
        "The straggler sets the lag: the longest answer finishes after the average one by its extra tokens times the "
        "per-token latency, and that lead, in optimizer steps, adds to the mean lag. A hard admission rule ('wait', "
        "'drop') then caps the lag at max_lag; 'fifo' does not.",
        "Check `admission` first (`ValueError` for anything else). The lead in seconds is (longest - mean length) * "
        "step_latency_s; divided by step_s it is in steps. Round mean lag + lead UP to whole steps (`math.ceil`, with "
        "a tiny tolerance against float noise) and, under a hard rule, cap it by the floor of `max_lag`. For (08.14): "
        "lags are whole steps, so the bound is floor(max_lag) steps (`ValueError` below 1).",
        "np.asarray(lengths_tokens) gives .max() and .mean() for a list or an array alike. Worked example: 7 answers "
        "of 100 tokens and one of 900, l = 0.02 s, step 4 s, mean lag 1.3, max_lag 3, d = 1 s: lead 14 s = 3.5 steps, "
        "ceil(4.8) = 5 under fifo, 3 under wait and drop; the hard bound (900 * 0.02 + 1) / 3 = 6.33 s.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: engine_schedule
# ---------------------------------------------------------------------------------------

ES = "engine_schedule"


def naive_schedule(
    lengths: Sequence[int],
    max_batch: int,
    *,
    late: int = 0,
    end_short: bool = False,
    static: bool = False,
    extra_slots: int = 0,
    shortest_first: bool = False,
    round_robin: bool = False,
) -> tuple[list[int], list[int]]:
    """The engine simulated one decode step at a time: at each boundary, finished sequences
    leave and waiting ones take the free slots in order; then every running sequence gets a
    token. The switches compute known slips (a slot back ``late`` steps after it frees, end
    steps one short, static batching, more slots, shortest first, and ``round_robin``: each
    slot a fixed queue, sequence j after sequence j - max_batch)."""
    n = len(lengths)
    if round_robin:
        ends: list[int] = []
        for j in range(n):
            ends.append((ends[j - max_batch] if j >= max_batch else 0) + int(lengths[j]))
        return [e - int(x) for e, x in zip(ends, lengths)], ends
    waiting = sorted(range(n), key=lambda j: lengths[j]) if shortest_first else list(range(n))
    start, end = [-1] * n, [-1] * n
    free = max_batch + extra_slots
    returning: list[int] = []  # steps at which a slot freed `late` steps earlier comes back
    remaining: dict[int, int] = {}
    step = 0
    while waiting or remaining:
        free += returning.count(step)
        returning = [s for s in returning if s != step]
        if not (static and remaining):
            while free > 0 and waiting:
                j = waiting.pop(0)
                start[j], remaining[j] = step, int(lengths[j])
                free -= 1
        step += 1
        for j in list(remaining):
            remaining[j] -= 1
            if remaining[j] == 0:
                del remaining[j]
                end[j] = step - (1 if end_short else 0)
                if late:
                    returning.append(step + late)
                else:
                    free += 1
    return start, end


ES_SLIPS: dict[str, dict[str, Any]] = {
    "this is static batching: a freed slot is taken at once, not when the whole group is done": dict(static=True),
    "a freed slot is taken one step late: the next sequence starts at end_step[j]": dict(late=1),
    "end_step is one short: end_step - start_step = length": dict(end_short=True),
    "shortest first; sequences start in the given order": dict(shortest_first=True),
    "more than max_batch sequences run at once": dict(extra_slots=1),
    "each slot runs a fixed queue (sequence j after sequence j - max_batch); a waiting sequence takes whichever "
    "slot frees first": dict(round_robin=True),
}


def _es_text(lengths: Sequence[int], max_batch: int) -> str:
    shown = ", ".join(str(int(x)) for x in list(lengths)[:6])
    if len(lengths) > 6:
        shown += f", ... ({len(lengths)} sequences)"
    return f"{ES}([{shown}], max_batch={max_batch})"


def _es_call(fn: Callable[..., Any], lengths: Any, max_batch: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    n = len(lengths)
    what = _es_text(lengths, max_batch)
    given = lengths.copy() if isinstance(lengths, np.ndarray) else list(lengths)
    got = call(fn, given, max_batch)
    if not _same_lengths(given, lengths) or type(given) is not type(lengths):
        fail(
            f"{what} changed the lengths {describe_type(lengths)} it was given (a countdown in place?): work on a "
            "copy, np.array(lengths) rather than np.asarray, which returns the same array"
        )
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{what} returned {describe_type(got)}; expected a tuple (start_step, end_step)")
    out = []
    for name, x in zip(("start_step", "end_step"), got):
        arr = assert_array(x, what=f"{what}'s {name}", shape=(n,))
        if arr.dtype.kind not in "iu":
            fail(f"{what}'s {name} has dtype {arr.dtype}; steps are whole numbers: return int64 arrays")
        out.append(arr.astype(np.int64))
    return out[0], out[1]


def _es_compare(fn: Callable[..., Any], lengths: Any, max_batch: int) -> None:
    start, end = _es_call(fn, lengths, max_batch)
    want_start, want_end = naive_schedule(list(lengths), max_batch)
    if start.tolist() == want_start and end.tolist() == want_end:
        return
    what = _es_text(lengths, max_batch)
    for message, slip in ES_SLIPS.items():
        wrong = naive_schedule(list(lengths), max_batch, **slip)
        if wrong != (want_start, want_end) and (start.tolist(), end.tolist()) == wrong:
            fail(f"{what}: {message}")
    length = np.asarray(lengths, dtype=np.int64)
    if not np.array_equal(end - start, length):
        j = int(np.flatnonzero(end - start != length)[0])
        fail(
            f"{what}: sequence {j} of length {int(length[j])} runs from step {start[j]} to {end[j]}; "
            "end_step - start_step must equal its length"
        )
    i = int(np.flatnonzero((start != np.asarray(want_start)) | (end != np.asarray(want_end)))[0])
    fail(
        f"{what}: sequence {i} starts at step {start[i]} and ends at {end[i]}; expected {want_start[i]} and "
        f"{want_end[i]} (the next waiting sequence takes a slot at the boundary where it frees)"
    )


@check_case("hand-computed schedules: 2 slots, 1 slot, more slots than sequences")
def _es_known(fn: Callable[..., Any]) -> None:
    _es_compare(fn, [3, 1, 2, 4, 1], 2)  # starts [0, 0, 1, 3, 3], ends [3, 1, 3, 7, 4]
    _es_compare(fn, np.array([2, 3, 1]), 1)  # one after the other: [0, 2, 5] -> [2, 5, 6]
    _es_compare(fn, [4, 2], 8)  # both at step 0


@check_case("random lengths and slot counts against a step-by-step simulation of the engine")
def _es_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for i in range(30):
        n = int(rng.integers(1, 40))
        if i % 3 == 0:  # a body and a straggler tail
            lengths = rng.integers(5, 15, size=n)
            lengths[rng.integers(0, n)] = 60
        else:
            lengths = rng.integers(1, 50, size=n)
        _es_compare(fn, lengths if i % 2 else [int(x) for x in lengths], int(rng.integers(1, 12)))


@check_case("properties: an empty batch, the input list left unchanged, never more than max_batch at once")
def _es_properties(fn: Callable[..., Any]) -> None:
    start, end = _es_call(fn, [], 4)
    assert_true(start.size == 0 and end.size == 0, f"{ES}([], 4) must return two empty arrays")
    lengths = [5, 1, 7, 2, 2, 9, 1, 3]
    given = list(lengths)
    call(fn, given, 3)
    assert_true(given == lengths, f"{ES} changed the lengths list it was given; work on a copy")
    start, end = _es_call(fn, np.array(lengths), 3)
    if start.min() < 0 or end.max() > sum(lengths):  # also bounds the loop below
        fail(
            f"{_es_text(lengths, 3)} runs from step {start.min()} to {end.max()}; steps count from 0 and no "
            f"schedule takes more than the {sum(lengths)} steps of one sequence after another"
        )
    for t in range(int(end.max())):
        running = int(((start <= t) & (t < end)).sum())
        if running > 3:
            fail(f"{_es_text(lengths, 3)}: {running} sequences run at step {t}; the engine has max_batch = 3 slots")
    _es_compare(fn, np.array(lengths), 3)


ENGINE_SCHEDULE = Exercise(
    name=ES,
    points=15,
    title="the continuous-batching slot refill of one sampler engine (the schedule behind eq. 08.7)",
    checks=(_es_known, _es_oracle, _es_properties),
    hints=(
        "Keep, for every slot, the step at which it is next free (all 0 at first); sequence j starts at the earliest, "
        "and that slot is then free at its start plus `lengths[j]`.",
        "A min-heap of the slots' free times gives the earliest in O(log B): start it with one 0 per usable slot (no "
        "more slots than sequences), then for each sequence, in order, pop the earliest time (the sequence's start) "
        "and push back the time at which that slot is free again.",
        "`heapq.heappop` and `heapq.heappush` on a plain list; record the starts in an int64 array and return "
        "(starts, ends), the ends being the starts plus the lengths. Check: lengths [3, 1, 2, 4, 1] on 2 slots give "
        "starts [0, 0, 1, 3, 3] and ends [3, 1, 3, 7, 4].",
    ),
)

EXERCISES: tuple[Exercise, ...] = (MAX_BATCH, BALANCED_SPLIT, MAX_LAG_STEPS, ENGINE_SCHEDULE)
