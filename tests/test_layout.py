"""course_lib.layout: the lesson-08 throughput model, against hand computations and brute force."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from course_lib.layout import (
    GPU,
    H100_SXM,
    LAYOUTS,
    QWEN25_7B,
    QWEN25_32B,
    LengthDist,
    ModelShape,
    SystemSpec,
    balanced_samplers,
    best_split,
    body_tail_lengths,
    consumption_tokens_per_s,
    deal_to_engines,
    decode_latency_roofline,
    engine_finish_times_s,
    engine_schedule,
    fit_decode_latency,
    generation_time_s,
    kv_bytes_per_token,
    lognormal_lengths,
    max_batch,
    predict,
    production_tokens_per_s,
    spec_from_hardware,
    sweep,
    tail_tokens_for_extra_s,
    train_tokens_per_s_per_gpu,
)

# The tiny system of the hand computations: l(B) = 1 + 0.1 B seconds, lengths [1, 2, 3, 10].
TINY = dict(batch_samples=4, max_batch=4, a_s=1.0, b_s=0.1, answer_tokens=(1, 2, 3, 10))


def _naive_engine_time_s(lengths, max_batch, a_s, b_s):
    """Step by step: every step costs a + b * (sequences running); a finished slot refills next step."""
    waiting, running, clock = list(lengths), [], 0.0
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append(waiting.pop(0))
        clock += a_s + b_s * len(running)
        running = [r - 1 for r in running if r > 1]
    return clock


# ---------------------------------------------------------------- hardware and model


def test_kv_bytes_per_token_by_hand():
    assert kv_bytes_per_token(QWEN25_7B) == 2 * 28 * 4 * 128 * 2 == 57_344
    assert kv_bytes_per_token(QWEN25_32B) == 2 * 64 * 8 * 128 * 2 == 262_144
    fp8 = replace(QWEN25_7B, kv_bytes_per_elem=1.0)
    assert kv_bytes_per_token(fp8) == 57_344 / 2


def test_max_batch_by_hand():
    # 0.9 * 80e9 - 2 * 7.62e9 = 56.76e9 bytes for the cache; 57,344 * 4096 bytes a sequence
    assert max_batch(QWEN25_7B, H100_SXM, 4096) == math.floor(56.76e9 / (57_344 * 4096)) == 241
    toy = ModelShape("toy", n_params=10, n_layers=1, n_kv_heads=1, head_dim=1, weight_bytes_per_param=1)
    gpu = GPU("toy", memory_bytes=100, hbm_bytes_per_s=1, peak_flops=1)
    # KV: 2 * 1 * 1 * 1 * 2 = 4 bytes a token; (100 - 10) / (4 * 5) = 4.5 -> 4
    assert max_batch(toy, gpu, 5, memory_fraction=1.0) == 4
    assert max_batch(toy, gpu, 5, memory_fraction=0.5) == 2  # (50 - 10) / 20


def test_max_batch_errors():
    with pytest.raises(ValueError, match="do not fit"):
        max_batch(QWEN25_32B, H100_SXM, 4096, memory_fraction=0.5)  # 65.5 GB of weights in 40 GB
    with pytest.raises(ValueError, match="not one sequence"):
        max_batch(QWEN25_32B, H100_SXM, 32_768)  # 6.5 GB left, 8.6 GB a sequence
    with pytest.raises(ValueError, match="context_tokens"):
        max_batch(QWEN25_7B, H100_SXM, 0)


def test_roofline_by_hand():
    a_s, b_s = decode_latency_roofline(QWEN25_7B, H100_SXM, 4096)
    assert a_s == pytest.approx(15.24e9 / 3.35e12)  # 4.55 ms: one weight read
    assert b_s == pytest.approx(57_344 * 4096 / 3.35e12 + 2 * 7.62e9 / 989e12)  # KV read + FLOPs
    a2, b2 = decode_latency_roofline(QWEN25_7B, H100_SXM, 4096, efficiency=0.5)
    assert (a2, b2) == pytest.approx((2 * a_s, 2 * b_s))


def test_fit_recovers_a_known_line():
    batches = [1, 8, 32, 64, 128, 256]
    a_s, b_s = fit_decode_latency(batches, [0.005 + 1e-4 * b for b in batches])
    assert (a_s, b_s) == pytest.approx((0.005, 1e-4))
    rng = np.random.default_rng(0)
    noisy = [0.005 + 1e-4 * b + rng.normal(0, 1e-5) for b in batches]
    a_s, b_s = fit_decode_latency(batches, noisy)
    assert a_s == pytest.approx(0.005, rel=0.01) and b_s == pytest.approx(1e-4, rel=0.01)
    with pytest.raises(ValueError, match="two distinct"):
        fit_decode_latency([8, 8], [0.1, 0.2])


def test_train_tokens_by_hand():
    assert train_tokens_per_s_per_gpu(QWEN25_7B, H100_SXM) == pytest.approx(0.4 * 989e12 / (6 * 7.62e9))
    with pytest.raises(ValueError, match="mfu"):
        train_tokens_per_s_per_gpu(QWEN25_7B, H100_SXM, mfu=0.0)


# ---------------------------------------------------------------- lengths


def test_lognormal_lengths_have_the_asked_mean_and_tail():
    d = lognormal_lengths(1000, p99_over_median=5.0, n_samples=40_000, seed=1)
    assert d.mean_tokens == pytest.approx(1000, rel=0.03)
    assert d.quantile_tokens(0.99) / d.quantile_tokens(0.5) == pytest.approx(5.0, rel=0.05)
    assert d.max_tokens == max(d.tokens) and list(d.tokens) == sorted(d.tokens)
    capped = lognormal_lengths(1000, 5.0, n_samples=1000, max_tokens=2000)
    assert capped.max_tokens <= 2000


def test_body_tail_and_batch():
    d = body_tail_lengths(100, 10, 20, tail_tokens=500, tail_fraction=0.02)
    assert d.tokens.count(500) == 2 and d.tokens[0] == 10 and d.tokens[97] == 20
    batch = d.batch(100, seed=3)
    assert sorted(batch) == list(d.tokens)  # a permutation: the tail is kept exactly
    assert len(d.batch(250)) == 250 and len(d.batch(7)) == 7
    with pytest.raises(ValueError, match="sorted"):
        LengthDist((3, 1))
    with pytest.raises(ValueError, match=">= 1 token"):
        LengthDist.from_samples([0, 4])


# ---------------------------------------------------------------- the straggler


def test_engine_schedule_by_hand():
    # max_batch 2: [1] and [2] start at 0; [3] takes [1]'s slot at step 1; [10] takes [2]'s at step 2
    start, end = engine_schedule([1, 2, 3, 10], max_batch=2)
    assert start.tolist() == [0, 0, 1, 2] and end.tolist() == [1, 2, 4, 12]
    a, b = 1.0, 0.1
    # steps 0-3 run 2 sequences, steps 4-11 run one: 12 steps, 16 tokens
    assert generation_time_s([1, 2, 3, 10], 1, 2, a, b) == pytest.approx(4 * (a + 2 * b) + 8 * (a + b))
    assert generation_time_s([1, 2, 3, 10], 1, 2, a, b) == pytest.approx(12 * a + 16 * b)
    finish = engine_finish_times_s([1, 2, 3, 10], 2, a, b)
    assert finish == pytest.approx([1.2, 2.4, 4.8, 4.8 + 8 * 1.1])


def test_generation_time_matches_a_naive_step_loop():
    rng = np.random.default_rng(0)
    for _ in range(20):
        lengths = rng.integers(1, 40, size=int(rng.integers(1, 30))).tolist()
        n_engines, cap = int(rng.integers(1, 4)), int(rng.integers(1, 6))
        shares = [lengths[e::n_engines] for e in range(n_engines)]
        naive = max(_naive_engine_time_s(s, cap, 0.3, 0.05) for s in shares)
        assert generation_time_s(lengths, n_engines, cap, 0.3, 0.05) == pytest.approx(naive)
        assert [s.tolist() for s in deal_to_engines(lengths, n_engines)] == shares


def test_talk_straggler_example():
    """99% of an engine's samples done at ~T, the last 1% needing 80 s more (a tail sequence alone)."""
    a_s, b_s = decode_latency_roofline(QWEN25_7B, H100_SXM, 4096)
    tail = tail_tokens_for_extra_s(80.0, body_max_tokens=2000, tail_per_engine=1, a_s=a_s, b_s=b_s)
    d = body_tail_lengths(100, 1000, 2000, tail_tokens=tail, tail_fraction=0.01)
    finish = np.sort(engine_finish_times_s(d.tokens, max_batch=256, a_s=a_s, b_s=b_s))
    assert finish[-1] - finish[-2] == pytest.approx(80.0, abs=a_s + b_s)  # within one step
    assert 10 < finish[-2] < 40  # the body: 2000 steps at a falling batch


# ---------------------------------------------------------------- invariants


def test_balance_formula_against_brute_force():
    for n_gpus, p, c in [(8, 9000.0, 3000.0), (16, 5000.0, 8650.0), (64, 1.0, 1.0), (10, 7.0, 2.0)]:
        n_star = balanced_samplers(n_gpus, p, c)
        assert n_star * p == pytest.approx((n_gpus - n_star) * c)
        rates = {n: min(n * p, (n_gpus - n) * c) for n in range(1, n_gpus)}
        best = max(rates, key=lambda n: rates[n])
        assert best in (math.floor(n_star), math.ceil(n_star))
    assert production_tokens_per_s(3, 4, 1.0, 0.1) == pytest.approx(3 * 4 / 1.4)
    assert consumption_tokens_per_s(5, 100.0) == 500.0


# ---------------------------------------------------------------- layouts on the tiny case


def test_sync_layouts_by_hand():
    # 2 engines: engine 0 gets [1, 3] (3 steps at B = 2, 1 -> 3.4 s), engine 1 gets [2, 10]:
    # 2 steps at B = 2 + 8 at B = 1 = 2 * 1.2 + 8 * 1.1 = 11.2 s. The batch: G = 16 tokens.
    spec = SystemSpec(n_gpus=3, n_samplers=2, train_tokens_per_s_per_gpu=4.0, weight_sync_s=0.5, **TINY)
    split = predict("sync_split", spec)
    assert split.generation_s == pytest.approx(11.2)
    assert split.train_s == pytest.approx(16 / 4)
    assert split.step_s == pytest.approx(11.2 + 4 + 0.5)
    assert split.tokens_per_s == pytest.approx(16 / 15.7)
    assert split.trainer_idle_fraction == pytest.approx(1 - 4 / 15.7)
    assert split.sampler_idle_fraction == pytest.approx(1 - (16 / 15.7) / (2 * 4 / 1.4))
    assert (split.mean_lag_steps, split.max_lag_steps) == (0.0, 0)

    one = predict("one_step", spec)
    assert one.step_s == pytest.approx(max(11.2, 4 + 0.5)) and one.tokens_per_s == pytest.approx(16 / 11.2)
    assert (one.mean_lag_steps, one.max_lag_steps) == (1.0, 1)

    colo = predict("sync_colocated", replace(spec, n_gpus=2, n_samplers=None))
    assert (colo.n_samplers, colo.n_trainers) == (2, 2)
    assert colo.step_s == pytest.approx(11.2 + 16 / (2 * 4) + 0.5)


def test_pipeline_by_hand():
    # 2 samplers, max_lag 2: in flight min(2 * 4, 2 * 4) = 8, B_eff = 4, P = 2 * 4 / 1.4 = 5.71 tokens/s
    spec = SystemSpec(n_gpus=3, n_samplers=2, train_tokens_per_s_per_gpu=4.0, weight_sync_s=0.5, max_lag=2, **TINY)
    p = predict("pipeline", spec)  # trainer-bound: C = 4 < P
    assert p.tokens_per_s == pytest.approx(4.0) and p.step_s == pytest.approx(16 / 4)
    assert p.trainer_idle_fraction == pytest.approx(0.0)
    assert p.sampler_idle_fraction == pytest.approx(1 - 4 / (2 * 4 / 1.4))
    assert p.mean_lag_steps == 2.0  # the cap binds: (max_lag + 1) batches held, one training
    assert p.max_lag_steps == math.ceil(2 + (10 - 4) * 1.4 / 4)  # the 10-token straggler: 5
    assert not p.cap_binds

    fast = predict("pipeline", replace(spec, train_tokens_per_s_per_gpu=10.0, max_lag=3))  # sampler-bound
    prod = 2 * 4 / 1.4
    step_s = 16 / prod
    assert fast.tokens_per_s == pytest.approx(prod) and fast.step_s == pytest.approx(step_s)
    little = (8 + 4 / 2) / 4 + 0.5 / step_s  # (in flight + half a batch queued) / batch + sync
    assert fast.mean_lag_steps == pytest.approx(little)
    assert fast.max_lag_steps == math.ceil(little + 6 * 1.4 / step_s)

    capped = predict("pipeline", replace(spec, max_lag=1))  # in flight min(8, 4) = 4: B_eff = 2
    assert capped.cap_binds and capped.engine_batch == 2.0
    assert capped.tokens_per_s == pytest.approx(min(2 * 2 / 1.2, 4.0))


def test_pipeline_with_max_lag_zero_is_sync_split():
    spec = SystemSpec(n_gpus=3, n_samplers=2, train_tokens_per_s_per_gpu=4.0, weight_sync_s=0.5, max_lag=0, **TINY)
    p, s = predict("pipeline", spec), predict("sync_split", spec)
    assert p.layout == "pipeline" and p.tokens_per_s == s.tokens_per_s and p.max_lag_steps == 0


def test_spec_formulas_hold_without_a_tail():
    """Equal lengths, full engines: (08.7) is G / (N_s p) and the layouts are the spec's formulas."""
    p_engine = 8 / (0.01 + 0.001 * 8)
    spec = SystemSpec(
        n_gpus=10, n_samplers=4, batch_samples=64, max_batch=8, a_s=0.01, b_s=0.001,
        train_tokens_per_s_per_gpu=300.0, answer_tokens=100, weight_sync_s=2.0, max_lag=4,
    )  # fmt: skip
    g = 64 * 100
    split = predict("sync_split", spec)
    assert split.step_s == pytest.approx(g / (4 * p_engine) + g / (6 * 300.0) + 2.0)
    colo = predict("sync_colocated", replace(spec, n_samplers=None, batch_samples=80, answer_tokens=100))
    assert colo.step_s == pytest.approx(8000 / (10 * p_engine) + 8000 / (10 * 300.0) + 2.0)
    one = predict("one_step", spec)
    assert one.step_s == pytest.approx(max(g / (4 * p_engine), g / (6 * 300.0) + 2.0))
    pipe = predict("pipeline", spec)  # 4 * 8 = 32 in flight <= max_lag * batch = 256
    assert pipe.tokens_per_s == pytest.approx(min(4 * p_engine, 6 * 300.0)) and not pipe.cap_binds


def test_tail_slows_the_sync_layouts_but_not_the_pipeline():
    body = body_tail_lengths(200, 50, 150, tail_tokens=1000, tail_fraction=0.01)
    tail_batch = body.batch(200, seed=0)
    mean = sum(tail_batch) / 200
    same_total = tuple([round(mean)] * 199 + [sum(tail_batch) - 199 * round(mean)])  # no tail, same tokens
    flat = SystemSpec(
        n_gpus=8, n_samplers=4, batch_samples=200, max_batch=64, a_s=0.02, b_s=0.0005,
        train_tokens_per_s_per_gpu=2000.0, answer_tokens=same_total, max_lag=2,
    )  # fmt: skip
    tailed = replace(flat, answer_tokens=tail_batch)
    assert flat.batch_tokens == tailed.batch_tokens
    for layout in ("sync_split", "sync_colocated", "one_step"):
        spec_f, spec_t = (s if layout != "sync_colocated" else replace(s, n_samplers=None) for s in (flat, tailed))
        assert predict(layout, spec_t).step_s > predict(layout, spec_f).step_s
    pf, pt = predict("pipeline", flat), predict("pipeline", tailed)
    assert pt.tokens_per_s == pytest.approx(pf.tokens_per_s) and pt.mean_lag_steps == pytest.approx(pf.mean_lag_steps)
    assert pt.max_lag_steps >= pf.max_lag_steps


# ---------------------------------------------------------------- choosing the split


def test_best_split_is_the_brute_force_argmax():
    spec = spec_from_hardware(
        QWEN25_7B, H100_SXM, n_gpus=16, batch_samples=512, context_tokens=4096,
        answer_tokens=body_tail_lengths(512, 200, 1800, tail_tokens=3500).batch(512, seed=0), max_lag=2,
    )  # fmt: skip
    for layout in ("sync_split", "one_step", "pipeline"):
        result = best_split(layout, spec)
        preds = {n: predict(layout, replace(spec, n_samplers=n)) for n in range(1, 16)}
        feasible = {n: p.tokens_per_s for n, p in preds.items() if p.mean_lag_steps <= spec.max_lag}
        assert result.n_samplers == max(feasible, key=lambda n: feasible[n])
        assert result.prediction == preds[result.n_samplers]
        n = result.n_samplers
        assert result.below_tokens_per_s == (preds[n - 1].tokens_per_s if n > 1 else None)
        assert result.above_tokens_per_s == (preds[n + 1].tokens_per_s if n < 15 else None)
        assert result.off_by_one_loss_fraction >= 0.0
        s = sweep(layout, spec)
        assert s.n_samplers.tolist() == list(range(1, 16))
        assert s.tokens_per_s == pytest.approx([preds[n].tokens_per_s for n in range(1, 16)])


def test_uncapped_pipeline_split_neighbours_the_balance():
    spec = SystemSpec(
        n_gpus=12, batch_samples=1024, max_batch=16, a_s=0.01, b_s=0.001,
        train_tokens_per_s_per_gpu=900.0, answer_tokens=200, max_lag=4,
    )  # fmt: skip
    n_star = balanced_samplers(12, spec.engine_full_tokens_per_s, 900.0)
    assert best_split("pipeline", spec).n_samplers in (math.floor(n_star), math.ceil(n_star))


def test_best_split_edge_cases():
    spec = SystemSpec(n_gpus=3, train_tokens_per_s_per_gpu=4.0, max_lag=0, **TINY)
    with pytest.raises(ValueError, match="no split"):
        best_split("one_step", spec)  # lag 1 > max_lag 0
    colo = best_split("sync_colocated", spec)
    assert colo.n_samplers == 3 and colo.below_tokens_per_s is None and colo.off_by_one_loss_fraction == 0.0
    with pytest.raises(ValueError, match="no split to sweep"):
        sweep("sync_colocated", spec)


# ---------------------------------------------------------------- bad inputs


def test_bad_inputs():
    with pytest.raises(ValueError, match="n_samplers=3 is out of range"):
        SystemSpec(n_gpus=3, n_samplers=3, train_tokens_per_s_per_gpu=4.0, **TINY)
    with pytest.raises(ValueError, match="n_samplers=0 is out of range"):
        SystemSpec(n_gpus=3, n_samplers=0, train_tokens_per_s_per_gpu=4.0, **TINY)
    spec = SystemSpec(n_gpus=3, train_tokens_per_s_per_gpu=4.0, **TINY)
    with pytest.raises(ValueError, match="unknown layout 'async'"):
        predict("async", spec)
    with pytest.raises(ValueError, match=r"needs spec\.n_samplers"):
        predict("pipeline", spec)
    with pytest.raises(ValueError, match="answer_tokens has 3 lengths"):
        replace(spec, answer_tokens=(1, 2, 3))
    with pytest.raises(ValueError, match="max_batch"):
        engine_schedule([1, 2], 0)
    with pytest.raises(ValueError, match="do not fit"):
        spec_from_hardware(
            QWEN25_32B, replace(H100_SXM, memory_bytes=40e9), n_gpus=8, batch_samples=8,
            answer_tokens=100, context_tokens=1024,
        )  # fmt: skip
    assert set(LAYOUTS) == {"sync_colocated", "sync_split", "one_step", "pipeline"}
