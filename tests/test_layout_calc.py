"""The calculator's trust features (course_lib.layout.calc): near-optimal ranges, per-GPU
throughput, sensitivity, the admission rules side by side, lag per token, rounding, refusing
an infeasible split, and unbounded lags."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from course_lib.layout.calc import (
    AdmissionRow,
    SensitivityRow,
    SplitRange,
    admissions_text,
    best_tokens_per_s_vs_lag,
    check_split,
    compare_admissions,
    fmt_lag,
    fmt_sig,
    near_optimal_splits,
    recommend,
    recommendation_text,
    robust_splits,
    round_sig,
    sensitivity,
    sensitivity_text,
    token_lag,
)
from course_lib.layout.model import SystemSpec, best_split, predict, sweep

# A pipeline whose throughput is min(production, consumption): a sharp peak at the balance.
PEAKED = SystemSpec(
    n_gpus=40, batch_samples=64, max_batch=64, a_s=0.01, b_s=0.0005,
    train_tokens_per_s_per_gpu=1500.0, answer_tokens=200, max_lag=100,
)  # fmt: skip
# A synchronous split whose step is one straggler's decode: the same at (almost) every split.
FLAT = SystemSpec(
    n_gpus=20, batch_samples=64, max_batch=64, a_s=0.01, b_s=0.0,
    train_tokens_per_s_per_gpu=1e6, answer_tokens=(100,) * 63 + (5000,), max_lag=1,
)  # fmt: skip


def _sig_digits(number: str) -> int:
    digits = number.replace(",", "")
    if "." in digits:
        return len(digits.replace(".", "").lstrip("0"))
    return len(digits.lstrip("0").rstrip("0")) or 1


# ------------------------------------------------------------------------------ rounding


@pytest.mark.parametrize(
    ("x", "sig", "rounded", "text"),
    [
        (37180.0, 2, 37000.0, "37,000"),
        (0.6234, 2, 0.62, "0.62"),
        (1.23, 2, 1.2, "1.2"),
        (2.0, 2, 2.0, "2.0"),
        (9.96, 2, 10.0, "10"),
        (0.0, 2, 0.0, "0"),
        (-1234.0, 2, -1200.0, "-1,200"),
        (0.001234, 2, 0.0012, "0.0012"),
        (37180.0, 3, 37200.0, "37,200"),
    ],
)
def test_round_sig_and_fmt_sig(x: float, sig: int, rounded: float, text: str) -> None:
    assert round_sig(x, sig) == pytest.approx(rounded)
    assert fmt_sig(x, sig) == text


def test_fmt_of_unbounded_and_missing_figures() -> None:
    assert fmt_sig(math.inf) == "unbounded" and fmt_sig(float("nan")) == "n/a"
    assert round_sig(math.inf) == math.inf
    assert fmt_lag(math.inf) == "unbounded" and fmt_lag(2) == "2" and fmt_lag(1.83) == "1.8"
    assert fmt_lag(np.int64(2**63 - 1)) == "unbounded"  # the model's integer stand-in for an unbounded lag
    with pytest.raises(ValueError, match="sig"):
        round_sig(1.0, 0)


# ------------------------------------------------------------------------------ near-optimal range


@pytest.mark.parametrize("spec", [PEAKED, FLAT], ids=["peaked", "flat"])
def test_range_holds_the_best_and_every_split_within_five_percent(spec: SystemSpec) -> None:
    layout = "pipeline" if spec is PEAKED else "sync_split"
    r = near_optimal_splits(layout, spec)
    s = sweep(layout, spec)
    best = s.tokens_per_s[s.feasible].max()
    assert r.best == best_split(layout, spec).n_samplers and r.best_tokens_per_s == pytest.approx(best)
    assert r.lo <= r.best <= r.hi and r.best in r.members
    expected = [int(n) for n, t, ok in zip(s.n_samplers, s.tokens_per_s, s.feasible) if ok and t >= 0.95 * best]
    assert list(r.members) == expected  # every member within 5%, and every split within 5% a member
    assert r.lo == min(expected) and r.hi == max(expected)
    assert r.tokens_per_s_lo == pytest.approx(min(t for n, t in zip(s.n_samplers, s.tokens_per_s) if n in expected))
    assert r.tokens_per_s_lo >= 0.95 * r.best_tokens_per_s
    assert r.best_tokens_per_s_per_gpu == pytest.approx(r.best_tokens_per_s / spec.n_gpus)
    assert r.tokens_per_s_lo_per_gpu == pytest.approx(r.tokens_per_s_lo / spec.n_gpus)


def test_flat_optimum_gives_a_wide_range_and_a_peaked_one_a_narrow_range() -> None:
    flat, peaked = near_optimal_splits("sync_split", FLAT), near_optimal_splits("pipeline", PEAKED)
    assert flat.width >= 0.8 * FLAT.n_gpus and flat.contiguous
    assert peaked.width <= 3 and peaked.contiguous
    assert near_optimal_splits("pipeline", PEAKED, within=0.0).members == (peaked.best,)
    assert near_optimal_splits("pipeline", PEAKED, within=0.2).width > peaked.width


def test_a_gapped_range_is_marked() -> None:
    p = predict("pipeline", replace(PEAKED, n_samplers=5))
    r = SplitRange("pipeline", 5, 1, 6, (1, 5, 6), 10.0, 9.6, n_gpus=40, tp=2, within=0.05, prediction=p)
    assert not r.contiguous and r.samplers_text() == "10 (2-12*)"  # printed in GPUs


def test_no_feasible_split_raises_naming_the_constraint() -> None:
    with pytest.raises(ValueError, match=r"no split .*one_step.*max lag 1 > max_lag 0"):
        near_optimal_splits("one_step", replace(FLAT, max_lag=0))
    with pytest.raises(ValueError, match="trainer memory"):
        near_optimal_splits("sync_split", replace(FLAT, min_trainers=FLAT.n_gpus))
    colocated = near_optimal_splits("sync_colocated", FLAT)
    assert colocated.members == (FLAT.n_gpus,) and colocated.lo == colocated.hi == colocated.best
    with pytest.raises(ValueError, match="unknown layout"):
        near_optimal_splits("async", FLAT)
    with pytest.raises(ValueError, match="within"):
        near_optimal_splits("pipeline", PEAKED, within=1.0)


# ------------------------------------------------------------------------------ the recommendation


def test_recommendation_has_ranges_per_gpu_throughput_and_rounded_text() -> None:
    rec = recommend(32, max_lag=8)  # a loose bound: the pipeline wins, over a range of splits
    assert rec.layout == "pipeline"
    for layout, p in rec.best.items():
        if p is None:
            continue
        spec_k = rec.round_spec(rec.batches_per_generation[layout])  # the K it was best at
        assert best_split(layout, spec_k).n_samplers == p.n_samplers  # the same best split as the model
        assert rec.ranges[layout].best == p.n_samplers
    assert rec.n_gpus == 32 and rec.tokens_per_s_per_gpu == pytest.approx(rec.prediction.tokens_per_s / 32)
    assert rec.split_range is not None and rec.split_range.lo <= rec.prediction.n_samplers <= rec.split_range.hi
    text = recommendation_text(rec)
    assert "per GPU" in text and fmt_sig(rec.tokens_per_s_per_gpu) in text and "token lag" in text
    r = rec.split_range
    assert f"{r.lo}-{r.hi}" in text and "within 5%" in text
    numbers = re.findall(r"\d[\d,]*(?:\.\d+)?", text)
    assert numbers and max(_sig_digits(n) for n in numbers) <= 4, text  # never 5 significant figures
    assert fmt_sig(rec.prediction.tokens_per_s) in text and f"{rec.prediction.tokens_per_s:,.0f}" not in text


def test_recommendation_in_tensor_parallel_units_prints_gpus() -> None:
    rec = recommend(16, "Qwen2.5-32B", max_lag=2)
    assert rec.tp == 2 and rec.n_gpus == 16
    assert rec.tokens_per_s_per_gpu == pytest.approx(rec.prediction.tokens_per_s / 16)
    assert rec.split_range is not None and rec.split_range.best_tokens_per_s_per_gpu == pytest.approx(
        rec.tokens_per_s_per_gpu
    )
    assert f"{rec.prediction.n_samplers * 2} samplers : {rec.prediction.n_trainers * 2} trainers" in (
        recommendation_text(rec)
    )


# ------------------------------------------------------------------------------ sensitivity


def test_sensitivity_moves_the_split_the_physical_way() -> None:
    args: dict[str, Any] = {"n_gpus": 32, "max_lag": 8}  # the pipeline wins at every row
    rows = sensitivity(**args)
    assert isinstance(rows[0], SensitivityRow) and rows[0].input == "baseline"
    assert [(r.input, r.factor) for r in rows[1:]] == [
        (name, f) for name in ("mfu", "efficiency", "mean_tokens") for f in (0.7, 1.3)
    ]
    base = recommend(**args)
    assert rows[0].range is not None and rows[0].range.best == base.prediction.n_samplers
    by = {(r.input, r.factor): r.range for r in rows if r.range is not None}
    b = rows[0].range
    # slower trainers (lower MFU) need more of them: fewer samplers at the best split and at the range's top
    assert by[("mfu", 0.7)].best <= b.best <= by[("mfu", 1.3)].best
    assert by[("mfu", 0.7)].hi <= b.hi <= by[("mfu", 1.3)].hi
    assert by[("mfu", 0.7)].best < by[("mfu", 1.3)].best
    # slower decoding (lower bandwidth efficiency) lowers the throughput
    assert by[("efficiency", 0.7)].best_tokens_per_s < b.best_tokens_per_s < by[("efficiency", 1.3)].best_tokens_per_s
    assert rows[3].value == pytest.approx(0.7 * 0.7) and rows[2].value == pytest.approx(0.52)
    robust = robust_splits(rows)
    assert all(n in r.members for n in robust for r in by.values())
    text = sensitivity_text(rows)
    assert "mfu" in text and "near-optimal under every row" in text


def test_sensitivity_refuses_arguments_recommend_does_not_take() -> None:
    with pytest.raises(ValueError, match="unknown argument"):
        sensitivity(32, mfus=0.3)
    with pytest.raises(ValueError, match="cannot vary"):
        sensitivity(32, inputs=("model",))


def test_robust_splits_is_the_intersection() -> None:
    p = predict("pipeline", replace(PEAKED, n_samplers=5))

    def row(members: tuple[int, ...]) -> SensitivityRow:
        rng = SplitRange("pipeline", members[0], min(members), max(members), members, 1.0, 1.0, 40, 1, 0.05, p)
        return SensitivityRow("mfu", 1.0, 0.4, "pipeline", rng)

    assert robust_splits([row((3, 4, 5)), row((4, 5, 6))]) == (4, 5)
    assert robust_splits([row((3,)), row((4,))]) == ()
    assert robust_splits([row((3, 4)), SensitivityRow("mfu", 0.7, 0.28, None, None, "no layout")]) == ()


# ------------------------------------------------------------------------------ lag per token


def test_token_lag_is_below_the_sample_lag_for_long_answers_and_equal_when_decoding_is_instant() -> None:
    spec = replace(PEAKED, max_lag=4, admission="wait")
    p = best_split("pipeline", spec).prediction
    tl = token_lag(p, spec)
    k = p.generation_s / spec.mean_answer_tokens / p.step_s
    assert tl.in_flight and tl.steps_per_token == pytest.approx(k) and k > 0
    length = float(spec.lengths_tokens[0])  # equal lengths: every sample's first-token lag is the mean
    assert tl.token_mean == pytest.approx(max(0.0, p.mean_lag_steps - k * (length - 1) / 2))
    assert tl.token_mean < tl.sample_mean == p.mean_lag_steps and tl.sample_max == p.max_lag_steps
    assert tl.token_share_over_bound == 0.0
    instant = token_lag(replace(p, generation_s=0.0), spec)  # l -> 0: no weights change under a sequence
    assert instant.token_mean == pytest.approx(p.mean_lag_steps) and instant.steps_per_token == 0.0
    tiny = token_lag(replace(p, generation_s=1e-9 * p.generation_s), spec)
    assert tiny.token_mean == pytest.approx(p.mean_lag_steps, rel=1e-6)


def test_token_lag_follows_the_brief_formula_when_the_window_is_full() -> None:
    rec = recommend(32, max_lag=2)  # "wait", the window full: every first token at the bound
    p, spec = rec.best["pipeline"], rec.spec
    assert p is not None
    assert p.mean_lag_steps == pytest.approx(2.0)
    tl = token_lag(p, spec)
    lengths = spec.lengths_tokens.astype(float)
    k = p.generation_s / lengths.mean() / p.step_s
    formula = p.mean_lag_steps - np.sum(lengths**2) / (2 * np.sum(lengths)) * k
    assert tl.token_mean == pytest.approx(max(0.0, formula), abs=2 * k)  # L(L-1)/2 vs L^2/2 differ by k/2
    assert tl.token_mean < tl.sample_mean and tl.token_share_over_bound == 0.0


def test_fifo_stragglers_put_tokens_past_the_bound_and_synchronous_tokens_keep_the_sample_lag() -> None:
    spec = replace(recommend(32, max_lag=2).spec, admission="fifo")
    p = predict("pipeline", replace(spec, n_samplers=20))
    assert p.max_lag_steps > 2
    tl = token_lag(p, spec)
    assert 0.0 < tl.token_share_over_bound < 1.0
    one = predict("one_step", replace(spec, n_samplers=20))
    sync = token_lag(one, spec)
    assert not sync.in_flight and sync.token_mean == one.mean_lag_steps == 1.0
    assert sync.token_share_over_bound == 0.0
    assert token_lag(one, replace(spec, max_lag=0)).token_share_over_bound == 1.0


# ------------------------------------------------------------------------------ admission rules


def test_compare_admissions_lists_every_rule_with_its_lags_or_its_reason() -> None:
    spec = recommend(32, max_lag=2).spec
    rows = compare_admissions(spec)
    assert [r.admission for r in rows] == ["fifo", "wait", "drop"] and all(isinstance(r, AdmissionRow) for r in rows)
    fifo, wait, drop = rows
    assert wait.feasible and wait.range is not None
    assert wait.prediction == best_split("pipeline", replace(spec, admission="wait")).prediction
    assert wait.token_lag is not None and wait.token_lag.token_mean <= wait.prediction.mean_lag_steps
    assert not fifo.feasible and fifo.reason is not None and "max lag" in fifo.reason and fifo.range is None
    assert fifo.prediction is not None and fifo.prediction.max_lag_steps > 2  # its least stale split, still over
    assert drop.dropped_fraction >= 0.0 and (drop.feasible or drop.reason)
    text = admissions_text(rows, spec.max_lag)
    assert all(rule in text for rule in ("fifo", "wait", "drop")) and "token lag" in text and "dropped" in text
    assert "fifo: no split" in text


# ------------------------------------------------------------------------------ checking a split


def test_check_split_refuses_an_infeasible_split_with_the_reason_and_a_fix() -> None:
    spec = replace(recommend(32, max_lag=2).spec, admission="fifo")
    with pytest.raises(ValueError, match=r"infeasible: max lag \d+ > max_lag 2.*admission='wait'"):
        check_split("pipeline", replace(spec, n_samplers=20))
    with pytest.raises(ValueError, match=r"trainer memory.*at least 2 trainers"):
        check_split("pipeline", replace(spec, n_samplers=31, admission="wait"))
    with pytest.raises(ValueError, match=r"max lag 1 > max_lag 0.*synchronous layout"):
        check_split("one_step", replace(spec, n_samplers=20, max_lag=0))
    with pytest.raises(ValueError, match=r"needs spec\.n_samplers"):
        check_split("sync_split", spec)
    ok = replace(spec, n_samplers=20, admission="wait")
    assert check_split("pipeline", ok) == predict("pipeline", ok)
    with pytest.raises(ValueError, match=r"Feasible instead: \d+ samplers"):
        check_split("pipeline", replace(ok, n_samplers=31))


# ------------------------------------------------------------------------------ unbounded lag


def test_an_unbounded_pipeline_never_crashes_the_calculator() -> None:
    rec = recommend(16, max_lag=math.inf, admission="fifo")
    text = recommendation_text(rec)
    assert "max_lag unbounded" in text
    if any(p is not None and not math.isfinite(p.mean_lag_steps) for p in rec.best.values()):
        assert "unbounded" in text.split("\n", 2)[2]
    rows = compare_admissions(rec.spec)
    assert rows[0].feasible
    assert not rows[1].feasible and "finite max_lag" in (rows[1].reason or "")
    assert "unbounded" in admissions_text(rows, rec.spec.max_lag)
    t = best_tokens_per_s_vs_lag(rec.spec, [1, math.inf])
    assert np.isfinite(t[1]) and (np.isnan(t[0]) or t[0] <= t[1])
    r = near_optimal_splits("pipeline", rec.spec)
    assert r.best_tokens_per_s > 0
    tl = token_lag(r.prediction, rec.spec)
    assert tl.token_share_over_bound == 0.0
    toy = replace(PEAKED, max_lag=math.inf)
    for n in (5, 30):  # a sampler-bound and a trainer-bound split
        assert check_split("pipeline", replace(toy, n_samplers=n)).tokens_per_s > 0


def test_synchronous_layouts_get_as_many_batches_per_weight_version_as_the_bound_allows() -> None:
    """A fair synchronous baseline: K batches per weight version (lags 0 .. K - 1; one_step
    1 .. K) up to the bound, each round's batches drawn independently, the fastest K kept."""
    rec = recommend(128, max_lag=2)
    k = rec.batches_per_generation
    assert k["pipeline"] == 1 and 1 <= k["one_step"] <= 2 and 1 <= k["sync_colocated"] <= 3 and k["sync_split"] <= 3
    for layout in ("sync_colocated", "sync_split", "one_step"):
        p = rec.best[layout]
        assert p is not None and p.max_lag_steps <= 2
        spec_k = rec.round_spec(k[layout])
        assert spec_k.batches_per_generation == k[layout] and len(spec_k.round_lengths_tokens) == k[layout] * 1024
        one = best_split(layout, rec.round_spec(1)).prediction if layout != "sync_colocated" else None
        if one is not None:
            assert p.tokens_per_s >= one.tokens_per_s  # the kept K is at least as fast as one batch
    # with a 1% tail at the limit and every lag held by waiting, three batches per round beat the pipeline
    assert rec.layout == "sync_colocated" and k["sync_colocated"] == 3
    assert "sync_colocated x3" in recommendation_text(rec)
    # an unbounded lag tries up to the cap, a zero bound only one batch
    assert recommend(16, max_lag=0).batches_per_generation["sync_colocated"] == 1


def test_an_infeasible_rules_row_shows_its_fastest_split_and_the_span_of_lags() -> None:
    spec = recommend(128, max_lag=2).spec
    fifo = {r.admission: r for r in compare_admissions(spec)}["fifo"]
    assert not fifo.feasible and fifo.prediction is not None
    sweep_fifo = [predict("pipeline", replace(spec, admission="fifo", n_samplers=n)) for n in range(1, 127)]
    assert fifo.prediction.tokens_per_s == pytest.approx(max(p.tokens_per_s for p in sweep_fifo))
    lags = [p.max_lag_steps for p in sweep_fifo]
    assert f"max lag {min(lags)}-{max(lags)} > max_lag 2" in (fifo.reason or "")


def test_a_colocation_penalty_slows_only_the_colocated_layout() -> None:
    free, slowed = recommend(128, max_lag=2), recommend(128, max_lag=2, colocated_slowdown=1.4)
    a, b = free.best["sync_colocated"], slowed.best["sync_colocated"]
    assert a is not None and b is not None and b.tokens_per_s < a.tokens_per_s / 1.2
    for layout in ("sync_split", "one_step", "pipeline"):  # dedicated GPUs: unchanged
        p, q = free.best[layout], slowed.best[layout]
        assert p is not None and q is not None and q.tokens_per_s == pytest.approx(p.tokens_per_s)
    assert free.layout == "sync_colocated" and slowed.layout == "sync_split"
    with pytest.raises(ValueError, match="colocated_slowdown must be >= 1"):
        recommend(16, colocated_slowdown=0.5)


def test_the_drop_limit_is_an_input() -> None:
    tight, loose = (
        recommend(128, admission="drop", max_dropped=0.01),
        recommend(128, admission="drop", max_dropped=0.05),
    )
    t, lo = tight.best["pipeline"], loose.best["pipeline"]
    assert t is not None and lo is not None
    assert t.dropped_fraction <= 0.01 < lo.dropped_fraction <= 0.05 and lo.tokens_per_s > t.tokens_per_s
    assert tight.spec.max_dropped_fraction == 0.01
    with pytest.raises(ValueError, match="max_dropped_fraction must be in"):
        recommend(16, max_dropped=1.5)


def test_planning_for_the_cap_raises_each_batchs_longest_answer() -> None:
    planned, drawn = recommend(64, max_lag=2), recommend(64, max_lag=2, plan_for_cap=False)
    assert int(planned.spec.lengths_tokens.max()) == 16384 > int(drawn.spec.lengths_tokens.max())
    p, d = planned.best["pipeline"], drawn.best["pipeline"]
    assert (
        p is not None and d is not None and d.tokens_per_s > p.tokens_per_s
    )  # a waiting pipeline's straggler is shorter
