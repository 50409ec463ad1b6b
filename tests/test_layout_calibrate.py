"""Lesson 08: the layout model calibrated on lesson 07's parts (course_lib.layout.calibrate)
and the calculator (course_lib.layout.calc)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from course_lib.layout.calc import (
    best_tokens_per_s_vs_lag,
    recommend,
    recommendation_text,
    smallest_tp,
    tensor_parallel,
)
from course_lib.layout.calibrate import (
    PREFILL_STEPS,
    REGIMES,
    Rates,
    compare_regimes,
    lesson07_spec,
    measure_round,
    predict_regime,
    relative_error,
    sample_answer_tokens,
    sequence_steps,
    simulate_regime,
    steady_state,
    time_decode_steps,
    time_generator_steps,
    trainer_timing,
)
from course_lib.layout.model import H100_SXM, QWEN25_7B, QWEN25_32B, predict
from course_lib.lm import TinyLM
from course_lib.lm.task import CountdownTask
from course_lib.pipeline.system import LM, PipelineConfig, RegimeReport
from course_lib.runtime.processes import live_children
from course_lib.runtime.weights import flat_parameters

L32, C = 0.002, 8000.0  # a decode step of 32 slots: 2 ms; the trainer: 8,000 sequence steps/s
RATES = Rates(step_s=L32, per_slot_step_s=0.0, trainer_steps_per_s=C)


def _cfg(regime: str) -> PipelineConfig:
    return PipelineConfig(regime=regime, max_lag=4)  # type: ignore[arg-type]


def _report(
    tokens: list[float], times: list[float], lags: list[float], trainer: list[tuple[float, float]]
) -> RegimeReport:
    metrics = [{"tokens": k, "time": t, "lag_mean": g} for k, t, g in zip(tokens, times, lags)]
    return RegimeReport(
        regime="pipeline",
        lag_bound=4,
        seconds=times[-1],
        tokens=int(sum(tokens)),
        samples=32 * len(tokens),
        metrics=metrics,
        token_lags=np.zeros(1),
        generator=[],
        trainer=trainer,
        swaps=[],
        slot_occupancy=1.0,
        events=[],
    )


def test_sequence_steps_add_the_prompt_steps() -> None:
    assert list(sequence_steps([1, 10])) == [1 + PREFILL_STEPS, 10 + PREFILL_STEPS]
    with pytest.raises(ValueError, match="at least one token"):
        sequence_steps([0])


def test_lesson07_is_one_sampler_and_one_trainer_with_a_flat_step_cost() -> None:
    spec = lesson07_spec(_cfg("pipeline"), RATES, 20)
    assert (spec.n_gpus, spec.n_samplers, spec.n_trainers, spec.max_batch, spec.max_lag) == (2, 1, 1, 32, 4)
    assert spec.latency_s(1) == spec.latency_s(32) == L32  # every slot is computed every step
    loop = lesson07_spec(_cfg("pipeline"), Rates(L32, 1e-5, C), 20)
    assert loop.latency_s(32) == pytest.approx(L32 + 32e-5)  # the loop's bookkeeping per live slot
    assert lesson07_spec(_cfg("sync"), RATES, 20).max_lag == 0


@pytest.mark.parametrize("regime", ["sync", "one_step", "pipeline"])
def test_equal_lengths_prediction_is_the_hand_computed_step(regime: str) -> None:
    """Every answer 17 tokens (20 slot steps): generation 20 l(32), training 32 x 20 / c."""
    gen_s, train_s = 20 * L32, 32 * 20 / C
    expected_step = {"sync": gen_s + train_s, "one_step": max(gen_s, train_s), "pipeline": train_s}[regime]
    if regime == "pipeline":  # trainer-bound: min(production 32/l, consumption c) = c
        assert 32 / L32 > C
    p = predict_regime(_cfg(regime), RATES, np.full(50, 17), n_batches=3)
    assert p.step_s == pytest.approx(expected_step, rel=1e-9)
    assert p.tokens_per_s == pytest.approx(32 * 17 / expected_step, rel=1e-9)
    assert p.mean_lag == {"sync": 0.0, "one_step": 1.0, "pipeline": 4.0}[regime]


@pytest.mark.parametrize("regime", ["sync", "one_step", "pipeline"])
def test_simulator_agrees_with_the_model_on_equal_lengths(regime: str) -> None:
    model = predict_regime(_cfg(regime), RATES, np.full(10, 17), n_batches=2)
    sim = simulate_regime(_cfg(regime), RATES, np.full(10, 17), n_steps=30, warmup_steps=10)
    assert sim.tokens_per_s == pytest.approx(model.tokens_per_s, rel=1e-6)
    assert sim.mean_lag == pytest.approx(model.mean_lag, abs=1e-9)


def test_long_tail_costs_sync_more_than_pipeline_in_the_model() -> None:
    lengths = np.array([5] * 97 + [60] * 3)
    sync = predict_regime(_cfg("sync"), Rates(L32, 0.0, 1e6), lengths, n_batches=50)
    pipe = predict_regime(_cfg("pipeline"), Rates(L32, 0.0, 1e6), lengths, n_batches=50)
    assert pipe.tokens_per_s > 3 * sync.tokens_per_s


def test_steady_state_skips_the_start_and_weights_lag_by_tokens() -> None:
    r = _report([100, 100, 300, 100], [1.0, 2.0, 3.0, 5.0], [0.0, 1.0, 2.0, 6.0], [(0, 0.5)] * 4)
    s = steady_state(r, skip=2)
    assert s.tokens_per_s == pytest.approx(400 / 3.0)
    assert s.mean_lag == pytest.approx((300 * 2 + 100 * 6) / 400)
    assert s.step_s == pytest.approx(1.5)
    with pytest.raises(ValueError, match="skip"):
        steady_state(r, skip=3)


def test_trainer_timing_counts_prompt_steps_and_busy_seconds() -> None:
    r = _report([100, 100, 200], [1, 2, 3], [0, 0, 0], [(0.0, 9.0), (1.0, 1.5), (2.0, 2.5)])
    t = trainer_timing(r, batch_sequences=32, skip=1)
    assert list(t.steps) == [100 + 32 * PREFILL_STEPS, 200 + 32 * PREFILL_STEPS]
    assert t.steps_per_s == pytest.approx((300 + 64 * PREFILL_STEPS) / 1.0)


def test_relative_error() -> None:
    assert relative_error(110.0, 100.0) == pytest.approx(0.1)
    assert relative_error(0.0, 0.0) == 0.0


def test_decode_timing_and_lengths_from_a_policy() -> None:
    torch.manual_seed(0)
    model = TinyLM(LM)
    task = CountdownTask()
    t = time_decode_steps(model, task, [4, 8], n_steps=3)
    assert t.shape == (2,) and np.all(t > 0)
    lengths = sample_answer_tokens(model, task, 16, seed=0)
    assert lengths.shape == (16,) and lengths.min() >= 1 and lengths.max() <= LM.max_len - 4
    assert np.array_equal(lengths, sample_answer_tokens(model, task, 16, seed=0))  # seeded


# ------------------------------------------------------------------------------ calculator


def test_tensor_parallel_group_scales_every_resource() -> None:
    g = tensor_parallel(H100_SXM, 4)
    assert (g.memory_bytes, g.hbm_bytes_per_s, g.peak_flops) == (
        4 * H100_SXM.memory_bytes,
        4 * H100_SXM.hbm_bytes_per_s,
        4 * H100_SXM.peak_flops,
    )
    assert tensor_parallel(H100_SXM, 1) is H100_SXM
    assert smallest_tp(QWEN25_7B, H100_SXM) == 1 and smallest_tp(QWEN25_32B, H100_SXM) == 2


def test_recommend_picks_the_fastest_feasible_layout() -> None:
    rec = recommend(64, max_lag=2)
    feasible = [p for p in rec.best.values() if p is not None and p.feasible]
    assert rec.prediction.tokens_per_s == max(p.tokens_per_s for p in feasible)
    p = rec.prediction
    assert (
        (p.n_samplers, p.n_trainers) == (64, 64)
        if rec.layout == "sync_colocated"
        else p.n_samplers + p.n_trainers == 64
    )
    assert all(p.max_lag_steps <= 2 for p in feasible)  # the bound is on the maximum
    spec_k = rec.round_spec(rec.batches_per_generation[rec.layout])
    again = predict(rec.layout, replace(spec_k, n_samplers=None if rec.layout == "sync_colocated" else p.n_samplers))
    assert again.tokens_per_s == pytest.approx(rec.prediction.tokens_per_s)
    text = recommendation_text(rec)
    assert text == recommendation_text(recommend(64, max_lag=2))  # stable text
    assert "<- recommended" in text and "lag max" in text and "admission 'wait'" in text


def test_recommend_names_the_constraint_a_layout_breaks() -> None:
    rec = recommend(128, max_lag=2, admission="fifo")  # 1% stragglers: every FIFO split runs past the bound
    assert rec.best["pipeline"] is None and "max lag" in rec.why_not["pipeline"]
    assert rec.layout != "pipeline"
    text = recommendation_text(rec)
    assert "pipeline        infeasible: " in text and "max lag" in text
    with pytest.raises(ValueError, match="no layout is feasible"):
        recommend(4, QWEN25_32B.name, max_lag=2)  # 2 TP pairs: 32B Adam state needs >= 4 pairs


def test_recommend_at_lag_zero_has_no_one_step_and_a_synchronous_winner() -> None:
    rec = recommend(32, max_lag=0)
    assert rec.best["one_step"] is None and "max lag 1 > max_lag 0" in rec.why_not["one_step"]
    assert rec.prediction.max_lag_steps == 0
    with pytest.raises(ValueError, match="unknown model"):
        recommend(32, model="GPT-5")
    with pytest.raises(ValueError, match="at least 2 units"):
        recommend(2, model=QWEN25_32B.name)


def test_more_staleness_never_lowers_the_best_pipeline_throughput() -> None:
    spec = recommend(32, max_lag=1).spec
    t = best_tokens_per_s_vs_lag(spec, [0, 1, 2, 4, 8])
    assert np.all(np.diff(t) >= -1e-9 * t[:-1]), t


def test_generator_loop_step_costs_at_least_the_bare_decode_step() -> None:
    torch.manual_seed(0)
    model = TinyLM(LM)
    task = CountdownTask()
    cfg = PipelineConfig(regime="pipeline", n_slots=8, max_lag=2)
    loops, bares = [], []
    for _ in range(3):  # interleaved, and the fastest of each: a busy machine slows single timings 1.5-2x
        loops.append(time_generator_steps(model, task, cfg, n_steps=40))
        bares.append(float(time_decode_steps(model, task, [8], n_steps=40)[0]))
    loop = min(loops, key=lambda r: r.step_s)
    bare = min(bares)
    assert loop.step_s > 0.8 * bare, (loops, bares)  # the loop does the step and more (0.8: timing noise)
    assert 1 <= loop.live_slots <= 8
    assert loop.per_slot_step_s(bare) >= 0.0 and loop.per_slot_step_s(10.0) == 0.0


def test_a_validation_round_measures_every_regime_and_compares() -> None:
    """One small round of lesson 07's regimes (real processes): rates measured, every regime
    run, and the comparison's exact parts hold (sync lag 0 in model and runs, one_step 1)."""
    torch.manual_seed(0)
    model = TinyLM(LM)
    task = CountdownTask()
    base = PipelineConfig(n_updates=12, max_lag=2, lr=0.0)
    init = flat_parameters(model)
    updates: list[int] = []
    rates, reports = measure_round(model, task, base, init, seed=0, skip=3, on_update=lambda u, m: updates.append(u))
    assert set(reports) == set(REGIMES) and len(updates) == 3 * base.n_updates
    assert rates.step_s > 0 and rates.per_slot_step_s >= 0 and rates.trainer_steps_per_s > 0
    own = dict(rates.trainer_by_regime)
    assert set(own) == set(REGIMES) and all(c > 0 for c in own.values())
    assert rates.trainer_steps_per_s == pytest.approx(float(np.median(list(own.values()))))
    assert all(rates.for_regime(r).trainer_steps_per_s == own[r] for r in REGIMES)
    answers = sample_answer_tokens(model, task, 64, seed=1)
    cmp = compare_regimes(base, [rates], [reports], answers, skip=3)
    assert cmp["sync"].measured_lag == 0.0 == cmp["sync"].model_lag
    assert cmp["one_step"].model_lag == 1.0 and cmp["pipeline"].model_lag <= 2.0
    assert all(len(c.model_errors) == 1 and c.measured_tokens_per_s > 0 for c in cmp.values())
    assert not live_children()
    with pytest.raises(ValueError, match="one Rates per round"):
        compare_regimes(base, [], [reports], answers, skip=3)


def test_each_regime_is_predicted_from_its_own_trainer_rate() -> None:
    """A run's trainer is predicted from its own busy intervals, not the round's median: a
    regime whose own c is halved is predicted slower, the others unchanged."""
    fast = Rates(L32, 0.0, C, trainer_by_regime=(("sync", C), ("one_step", C), ("pipeline", C)))
    slow = Rates(L32, 0.0, C, trainer_by_regime=(("sync", C), ("one_step", C), ("pipeline", C / 2)))
    assert slow.for_regime("pipeline").trainer_steps_per_s == C / 2
    assert slow.for_regime("sync") == slow.for_regime("sync").for_regime("sync")
    assert Rates(L32, 0.0, C).for_regime("pipeline").trainer_steps_per_s == C  # nothing per regime: the median
    lengths = np.full(256, 12)
    pipe_fast = predict_regime(_cfg("pipeline"), fast.for_regime("pipeline"), lengths, n_batches=5)
    pipe_slow = predict_regime(_cfg("pipeline"), slow.for_regime("pipeline"), lengths, n_batches=5)
    sync_slow = predict_regime(_cfg("sync"), slow.for_regime("sync"), lengths, n_batches=5)
    sync_fast = predict_regime(_cfg("sync"), fast.for_regime("sync"), lengths, n_batches=5)
    assert pipe_slow.tokens_per_s < pipe_fast.tokens_per_s
    assert sync_slow.tokens_per_s == sync_fast.tokens_per_s
