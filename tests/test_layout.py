"""course_lib.layout: the lesson-08 throughput model, against hand computations and brute force."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from course_lib.layout.model import (
    ADMISSIONS,
    GPU,
    H20,
    H100_SXM,
    H800_SXM,
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
    min_trainers,
    predict,
    production_tokens_per_s,
    resident_tokens,
    spec_from_hardware,
    step_costs,
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


# ---------------------------------------------------------------- paged KV, the step, the trainer


def _naive_step_clock_s(lengths, max_batch, costs, prompt):
    """Step by step with (08.3): each running sequence holds P + (tokens so far) and carries P / L
    prompt tokens of prefill into each of its L steps (chunked prefill)."""
    waiting, running, clock = list(lengths), [], 0.0  # running: [tokens left, tokens written]
    while waiting or running:
        while waiting and len(running) < max_batch:
            running.append([waiting.pop(0), 0])
        b = len(running)
        resident = sum(prompt + done for _, done in running)
        memory = costs.a_s + costs.b_s * b + costs.r_s * resident
        compute = costs.f_s * (b + sum(prompt / (left + done) for left, done in running))
        clock += max(memory, compute)
        running = [[left - 1, done + 1] for left, done in running if left > 1]
    return clock


def test_resident_tokens_by_hand():
    # lengths 1 and 3 after 10 prompt tokens: steps hold 10 | 10, 11, 12 -> (10 + 33) / 4 steps
    assert resident_tokens([1, 3], 10) == pytest.approx((10 + 10 + 11 + 12) / 4)
    assert resident_tokens([5, 5], 0) == pytest.approx(2.0)  # 0, 1, 2, 3, 4
    d = LengthDist.from_samples([1, 3])
    assert d.mean_resident_tokens(10) == pytest.approx(resident_tokens([1, 3], 10))


def test_paged_engine_holds_more_than_a_reserving_one():
    lengths = lognormal_lengths(2000, 8.0, n_samples=4096, seed=0, max_tokens=16384)
    common = dict(n_gpus=8, batch_samples=512, answer_tokens=lengths.batch(512), prompt_tokens=1024)
    paged = spec_from_hardware(QWEN25_7B, H100_SXM, generation_limit=16384, **common)
    reserve = spec_from_hardware(QWEN25_7B, H100_SXM, generation_limit=16384, kv="reserve", **common)
    assert reserve.max_batch == max_batch(QWEN25_7B, H100_SXM, 1024 + 16384)
    assert paged.max_batch == max_batch(QWEN25_7B, H100_SXM, resident_tokens(paged.lengths_tokens, 1024))
    assert paged.max_batch > 3 * reserve.max_batch
    capped = spec_from_hardware(
        QWEN25_7B,
        H100_SXM,
        n_gpus=8,
        batch_samples=512,
        answer_tokens=lengths.batch(512),
        prompt_tokens=1024,
        max_num_seqs=64,
    )
    assert capped.max_batch == 64


def test_step_costs_by_hand():
    c = step_costs(QWEN25_7B, H20, efficiency=0.5)
    assert c.a_s == pytest.approx(15.24e9 / (0.5 * 4.0e12))
    assert c.r_s == pytest.approx(57_344 / (0.5 * 4.0e12))
    assert c.f_s == pytest.approx(2 * 7.62e9 / (0.5 * 148e12))
    assert c.b_s == 0.0
    # H20 decodes compute-bound sooner than an H100: the compute term passes the weight read at a
    # smaller batch (a_s / f_s sequences)
    h100 = step_costs(QWEN25_7B, H100_SXM)
    assert c.a_s / c.f_s < h100.a_s / h100.f_s / 5
    assert H800_SXM.peak_flops == H100_SXM.peak_flops and H800_SXM.hbm_bytes_per_s == H100_SXM.hbm_bytes_per_s


def test_generation_time_with_kv_and_compute_matches_a_naive_loop():
    rng = np.random.default_rng(1)
    costs = step_costs(QWEN25_7B, H20)
    for _ in range(15):
        lengths = rng.integers(1, 60, size=int(rng.integers(1, 25))).tolist()
        cap, prompt = int(rng.integers(1, 8)), float(rng.integers(0, 500))
        naive = _naive_step_clock_s(lengths, cap, costs, prompt)
        got = generation_time_s(
            lengths, 1, cap, costs.a_s, costs.b_s, r_s=costs.r_s, f_s=costs.f_s, prompt_tokens=prompt
        )
        assert got == pytest.approx(naive, rel=1e-9)


def test_steady_state_latency_is_the_max_of_memory_and_compute():
    spec = SystemSpec(
        n_gpus=4,
        n_samplers=2,
        batch_samples=4,
        max_batch=8,
        a_s=1.0,
        b_s=0.0,
        r_s=0.01,
        f_s=0.2,
        prompt_tokens=4.0,
        train_tokens_per_s_per_gpu=1.0,
        answer_tokens=(2, 2, 6, 6),
    )
    r = 4 + (np.mean(np.square([2, 2, 6, 6])) - 4) / (2 * 4)  # P + (E[L^2] - E[L]) / (2 E[L])
    for b in (1, 4, 8):
        assert spec.latency_s(b) == pytest.approx(max(1.0 + 0.01 * b * r, 0.2 * b * (1 + 4 / 4)))


def test_trainer_rate_counts_prompt_and_extra_forwards():
    base = train_tokens_per_s_per_gpu(QWEN25_7B, H100_SXM)
    assert base == pytest.approx(0.4 * 989e12 / (6 * 7.62e9))
    got = train_tokens_per_s_per_gpu(
        QWEN25_7B, H100_SXM, mean_answer_tokens=1000, prompt_tokens=250, extra_forward_passes=1
    )
    assert got == pytest.approx(0.4 * 989e12 / (8 * 7.62e9) * 1000 / 1250)
    with pytest.raises(ValueError, match="mean_answer_tokens"):
        train_tokens_per_s_per_gpu(QWEN25_7B, H100_SXM, prompt_tokens=100)


def test_min_trainers_by_hand():
    # 16 bytes a parameter: 7B -> 121.9 GB over 72 GB usable per H100 -> 2; 32B -> 524 GB -> 8
    assert min_trainers(QWEN25_7B, H100_SXM) == math.ceil(16 * 7.62e9 / 72e9) == 2
    assert min_trainers(QWEN25_32B, H100_SXM) == math.ceil(16 * 32.76e9 / 72e9) == 8
    assert min_trainers(QWEN25_7B, H20) == 2


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


def test_several_batches_per_generation_round():
    """PipelineRL's conventional baseline: K batches generated with one weight version, then K steps."""
    spec = SystemSpec(
        n_gpus=3,
        n_samplers=2,
        train_tokens_per_s_per_gpu=4.0,
        weight_sync_s=0.5,
        batches_per_generation=3,
        max_lag=2,
        **TINY,
    )
    p = predict("sync_split", spec)
    gen = generation_time_s(np.tile([1, 2, 3, 10], 3), 2, 4, 1.0, 0.1)
    assert p.generation_s == pytest.approx(gen)
    assert p.tokens_per_s == pytest.approx(3 * 16 / (gen + 3 * 4 + 0.5))
    assert (p.mean_lag_steps, p.max_lag_steps) == (1.0, 2) and p.feasible
    assert not predict("sync_split", replace(spec, max_lag=1)).feasible  # lag 2 > 1


def _tiny_pipeline(**kw):
    base = dict(n_gpus=3, n_samplers=2, train_tokens_per_s_per_gpu=4.0, weight_sync_s=0.5, max_lag=2)
    base.update(kw)
    return SystemSpec(**{**TINY, **base})


def test_pipeline_fifo_by_hand():
    # At throughput X: step 16/X, held window (2 + 1) * 4 = 12 samples, of which half a batch queued,
    # the batch training for X/4 of the time and the one syncing for 0.5 X / 16:
    # in flight I = 12 - 4 (1/2 + X/4 + X/32) = 10 - 1.125 X. With a sync that overlaps the next
    # step, C = 4: at X = 4, I = 5.5, B_eff = 2.75, production 2 * 2.75 / 1.275 = 4.31 > 4: trainer-bound.
    p = predict("pipeline", _tiny_pipeline(sync_blocks_trainer=False))
    assert p.tokens_per_s == pytest.approx(4.0) and p.step_s == pytest.approx(4.0)
    assert p.engine_batch == pytest.approx(2.75) and p.cap_binds
    assert p.mean_lag_steps == 2.0  # trainer-bound: the window is full
    assert p.max_lag_steps == math.ceil(2 + (10 - 4) * 1.275 / 4)  # the 10-token straggler: 4
    assert p.infeasible == "max lag 4 > max_lag 2" and not p.feasible and p.admission == "fifo"

    # the trainer stops for the sync (the default): C_d = 16 / (16 / 4 + 0.5) = 32 / 9, step 4.5 s;
    # I = 10 - 1.125 * 32 / 9 = 6, B_eff = 3, l = 1.3, production 2 * 3 / 1.3 = 4.6 > C_d: trainer-bound.
    # Held before the update: 12 - 4 (X/4 + 0.5/4.5) = 8, lag 8/4 + 0.5/4.5 = 2.11, capped at 2.
    blocked = predict("pipeline", _tiny_pipeline())
    assert blocked.tokens_per_s == pytest.approx(32 / 9) and blocked.step_s == pytest.approx(4.5)
    assert blocked.engine_batch == pytest.approx(3.0) and blocked.train_s == pytest.approx(4.0)
    assert blocked.mean_lag_steps == 2.0
    assert blocked.max_lag_steps == math.ceil(2 + (10 - 4) * 1.3 / 4.5)  # 4

    # a fast trainer: sampler-bound; X solves X = 2 B/(1 + 0.1 B) with B = (10 - X/4 ... ) / 2
    fast = predict("pipeline", _tiny_pipeline(train_tokens_per_s_per_gpu=100.0, max_lag=3, sync_blocks_trainer=False))
    x = fast.tokens_per_s
    in_flight = min(8.0, 16 - 4 * (0.5 + x / 100 + 0.5 * x / 16))
    assert x == pytest.approx(in_flight / (1 + 0.1 * in_flight / 2), rel=1e-6)
    little = (in_flight + 2) / 4 + 0.5 / fast.step_s
    assert fast.mean_lag_steps == pytest.approx(min(3.0, little))


def test_pipeline_wait_pays_for_the_straggler():
    fifo = predict("pipeline", _tiny_pipeline())
    wait = predict("pipeline", _tiny_pipeline(admission="wait"))
    assert wait.max_lag_steps <= 2 and wait.feasible and wait.wait_binds
    assert wait.tokens_per_s < fifo.tokens_per_s
    # (08.14): the step is the straggler's generation plus the sync, over the bound
    lat = 1.0 + 0.1 * wait.engine_batch
    assert wait.step_s == pytest.approx((10 * lat + 0.5) / 2, rel=1e-6)


def test_pipeline_drop_aborts_what_cannot_make_its_deadline():
    spec = _tiny_pipeline(admission="drop", answer_tokens=(1, 2, 3, 30))
    p = predict("pipeline", spec)
    assert p.max_lag_steps <= 2 and p.dropped_fraction == pytest.approx(0.25)  # the 30-token answer
    lat = 1.0 + 0.1 * p.engine_batch
    cut = (2 * p.step_s - 0.5) / lat
    assert 3 <= cut < 30
    assert p.step_s == pytest.approx(4 * np.mean([1, 2, 3]) / p.tokens_per_s)  # the kept batch
    assert p.infeasible is not None and "drops 25.0%" in p.infeasible


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
    pipe = predict("pipeline", replace(spec, sync_blocks_trainer=False))  # 32 in flight, inside 5 batches
    assert pipe.tokens_per_s == pytest.approx(min(4 * p_engine, 6 * 300.0)) and not pipe.cap_binds
    blocked = predict("pipeline", spec)  # the trainers also stop 2 s a step for the sync: trainer-bound
    assert blocked.tokens_per_s == pytest.approx(min(4 * p_engine, g / (g / (6 * 300.0) + 2.0)))
    assert blocked.tokens_per_s < 4 * p_engine


def test_tail_slows_the_sync_layouts_and_the_hard_bounds_but_not_the_fifo_pipeline():
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
    assert pt.tokens_per_s == pytest.approx(pf.tokens_per_s, rel=0.02)
    assert pt.max_lag_steps > pf.max_lag_steps
    assert predict("pipeline", replace(tailed, admission="wait")).tokens_per_s < pt.tokens_per_s


# ---------------------------------------------------------------- choosing the split


def _h100_spec(**kw):
    base = dict(
        n_gpus=16,
        batch_samples=512,
        prompt_tokens=256,
        answer_tokens=body_tail_lengths(512, 200, 1800, tail_tokens=3500).batch(512, seed=0),
        max_lag=2,
    )
    base.update(kw)
    return spec_from_hardware(QWEN25_7B, H100_SXM, **base)


@pytest.mark.parametrize("admission", ADMISSIONS)
def test_best_split_is_the_brute_force_argmax_of_the_feasible(admission):
    spec = _h100_spec(admission=admission)
    for layout in ("sync_split", "one_step", "pipeline"):
        preds = {n: predict(layout, replace(spec, n_samplers=n)) for n in range(1, 16)}
        feasible = {n: p.tokens_per_s for n, p in preds.items() if p.feasible}
        if not feasible:
            with pytest.raises(ValueError, match="no split"):
                best_split(layout, spec)
            continue
        result = best_split(layout, spec)
        assert result.n_samplers == max(feasible, key=lambda n: feasible[n])
        assert result.prediction == preds[result.n_samplers]
        n = result.n_samplers
        assert result.below_tokens_per_s == (preds[n - 1].tokens_per_s if n > 1 else None)
        assert result.above_tokens_per_s == (preds[n + 1].tokens_per_s if n < 15 else None)
        s = sweep(layout, spec)
        assert s.n_samplers.tolist() == list(range(1, 16))
        assert s.feasible.tolist() == [preds[n].feasible for n in range(1, 16)]


def test_no_recommended_split_breaks_the_bound_or_the_memory():
    """Over random systems and every rule: what best_split returns keeps every sample's lag
    within max_lag and has trainers that hold the model."""
    rng = np.random.default_rng(7)
    for _ in range(12):
        lengths = lognormal_lengths(
            float(rng.integers(300, 3000)),
            float(rng.uniform(1.5, 10)),
            n_samples=512,
            seed=int(rng.integers(1000)),
            max_tokens=16384,
        )
        for admission in ADMISSIONS:
            spec = spec_from_hardware(
                QWEN25_7B, H100_SXM, n_gpus=int(rng.integers(4, 24)), batch_samples=256,
                answer_tokens=lengths.batch(256), prompt_tokens=512, max_lag=int(rng.integers(1, 5)),
                admission=admission,
            )  # fmt: skip
            try:
                p = best_split("pipeline", spec).prediction
            except ValueError as exc:
                assert "max lag" in str(exc) or "trainer memory" in str(exc) or "drops" in str(exc)
                continue
            assert p.max_lag_steps <= spec.max_lag and p.n_trainers >= spec.min_trainers and p.feasible


def test_uncapped_pipeline_split_neighbours_the_balance():
    spec = SystemSpec(
        n_gpus=12, batch_samples=1024, max_batch=16, a_s=0.01, b_s=0.001,
        train_tokens_per_s_per_gpu=900.0, answer_tokens=200, max_lag=4,
    )  # fmt: skip
    n_star = balanced_samplers(12, spec.engine_full_tokens_per_s, 900.0)
    assert best_split("pipeline", spec).n_samplers in (math.floor(n_star), math.ceil(n_star))


def test_best_split_edge_cases_say_which_constraint_failed():
    spec = SystemSpec(n_gpus=3, train_tokens_per_s_per_gpu=4.0, max_lag=0, **TINY)
    with pytest.raises(ValueError, match=r"no split.*max lag 1 > max_lag 0"):
        best_split("one_step", spec)  # lag 1 > max_lag 0
    colo = best_split("sync_colocated", spec)
    assert colo.n_samplers == 3 and colo.below_tokens_per_s is None and colo.off_by_one_loss_fraction == 0.0
    with pytest.raises(ValueError, match="no split to sweep"):
        sweep("sync_colocated", spec)
    memory = replace(spec, n_gpus=4, min_trainers=3, max_lag=1)
    assert best_split("sync_split", memory).prediction.n_trainers == 3  # only N_s = 1 leaves 3 trainers
    with pytest.raises(ValueError, match=r"N_s=1\.\.3: trainer memory"):
        best_split("one_step", replace(memory, min_trainers=4))  # no split leaves 4 trainers
    assert best_split("sync_colocated", replace(memory, min_trainers=4)).prediction.n_trainers == 4  # all GPUs train


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
    with pytest.raises(ValueError, match="unknown admission 'lifo'"):
        replace(spec, admission="lifo")
    with pytest.raises(ValueError, match="synchronous RL"):
        replace(spec, admission="wait", max_lag=0.5)
    with pytest.raises(ValueError, match="finite max_lag"):
        replace(spec, admission="drop", max_lag=math.inf)
    with pytest.raises(ValueError, match="max_batch"):
        engine_schedule([1, 2], 0)
    with pytest.raises(ValueError, match="do not fit"):
        spec_from_hardware(
            QWEN25_32B, replace(H100_SXM, memory_bytes=40e9), n_gpus=8, batch_samples=8, answer_tokens=100,
        )  # fmt: skip
    with pytest.raises(ValueError, match="kv must be"):
        spec_from_hardware(QWEN25_7B, H100_SXM, n_gpus=8, batch_samples=8, answer_tokens=100, kv="full")
    assert set(LAYOUTS) == {"sync_colocated", "sync_split", "one_step", "pipeline"}


def test_a_planned_batch_holds_an_answer_at_the_generation_limit():
    lengths = lognormal_lengths(2000, 8.0, n_samples=4096, seed=0, max_tokens=16384)
    batch = lengths.batch(1024, seed=0)
    assert max(batch) < 16384  # this draw missed the tail...
    spec = spec_from_hardware(
        QWEN25_7B, H100_SXM, n_gpus=8, batch_samples=1024, answer_tokens=batch, generation_limit=16384
    )
    assert spec.lengths_tokens.max() == 16384  # ...the planner's batch does not
    assert sorted(spec.lengths_tokens.tolist())[:-1] == sorted(batch)[:-1]
    with pytest.raises(ValueError, match="past generation_limit"):
        spec_from_hardware(
            QWEN25_7B, H100_SXM, n_gpus=8, batch_samples=1024, answer_tokens=batch, generation_limit=1000
        )
