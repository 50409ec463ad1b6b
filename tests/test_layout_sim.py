"""The SimPy layout simulator (lesson 08) against hand-computed schedules and the spec's
steady-state formulas: step times of the synchronous layouts exactly (the linear step and
the roofline step (08.3)), pipeline throughput min(production, consumption), lag bounds
under the admission rules ("fifo", "wait", "drop"), conservation of samples and tokens."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import itertools
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from course_lib.layout.model import SystemSpec, generation_time_s
from course_lib.layout.sim import SimConfig, SimResult, gantt, sim_config, simulate

A_S, B_S = 0.01, 0.0005  # l(B) = 0.01 + 0.0005 B seconds
L = 100  # every answer has 100 tokens unless a test says otherwise


def l_of(b: int) -> float:
    return A_S + B_S * b


def cfg(layout, **kw) -> SimConfig:
    base: dict[str, Any] = dict(
        n_gpus=4,
        batch_samples=64,
        max_batch=32,
        a_s=A_S,
        b_s=B_S,
        train_tokens_per_s_per_gpu=5000.0,
        weight_sync_s=0.1,
        max_lag=2,
        n_steps=8,
        warmup_steps=2,
        lengths=(L,),
        admission="wait",  # the hard bound by waiting unless a test says otherwise
    )
    if layout != "sync_colocated":
        base["n_samplers"] = 2
    base.update(kw)
    return SimConfig(layout, **base)


# ------------------------------------------------------------------ synchronous layouts


def test_sync_split_step_is_generation_plus_training_plus_sync():
    c = cfg("sync_split", weight_sync_s=0.3)
    r = simulate(c)
    gen_s = L * l_of(32)  # 32 sequences per engine, all finish after L steps
    train_s = 64 * L / (2 * 5000.0)
    assert r.step_s == pytest.approx(gen_s + train_s + 0.3, rel=1e-9)
    assert r.tokens_per_s == pytest.approx(64 * L / (gen_s + train_s + 0.3), rel=1e-9)
    assert np.all(r.lags == 0)
    assert r.sampler_busy_frac == pytest.approx(gen_s / (gen_s + train_s + 0.3), rel=1e-9)
    assert r.trainer_busy_frac == pytest.approx(train_s / (gen_s + train_s + 0.3), rel=1e-9)
    assert r.trainer_sync_frac == pytest.approx(0.3 / (gen_s + train_s + 0.3), rel=1e-9)
    assert r.sampler_mean_in_flight == pytest.approx(32.0)
    # each engine runs L decode steps per batch; no batch starts after the last step (version n_steps never arrives)
    assert r.n_decode_steps == c.n_steps * 2 * L


def test_sync_split_uneven_quota_pays_a_second_wave():
    # 65 samples on 2 engines: engine 0 gets 33 > max_batch = 32, so its 33rd sequence runs alone afterwards
    r = simulate(cfg("sync_split", batch_samples=65, weight_sync_s=0.0))
    expected = L * l_of(32) + L * l_of(1) + 65 * L / (2 * 5000.0)
    assert r.step_s == pytest.approx(expected, rel=1e-9)


def test_sync_colocated_step_uses_all_gpus_for_both_phases():
    r = simulate(cfg("sync_colocated", weight_sync_s=0.2))
    expected = L * l_of(16) + 64 * L / (4 * 5000.0) + 0.2  # 16 sequences per engine, 4 GPUs train
    assert r.step_s == pytest.approx(expected, rel=1e-9)
    assert np.all(r.lags == 0)
    rows = {(iv.role, iv.resource_index) for iv in r.timeline}
    assert rows == {("gpu", i) for i in range(4)}


def test_sync_straggler_engine_with_unequal_lengths():
    # lengths drawn per sample: the generation phase lasts until the longest answer (hand-summed l(B_t))
    c = cfg("sync_split", n_samplers=1, n_gpus=2, batch_samples=4, max_batch=4, lengths=(3, 7), n_steps=3)
    r = simulate(c)
    lengths = r.sample_lengths
    for k in range(c.n_steps - 1):
        batch = np.sort(lengths[4 * (k + 1) : 4 * (k + 2)])  # step k + 1 trains on batch k + 1
        gen_s = sum(l_of(int(np.sum(batch > t))) for t in range(int(batch[-1])))  # B_t = still running at step t
        train_s = batch.sum() / 5000.0
        assert r.step_end_s[k + 1] - r.step_end_s[k] == pytest.approx(0.1 + gen_s + train_s, rel=1e-9)


# ---------------------------------------------------------------------------- one step


@pytest.mark.parametrize("sync_s", [0.1, 3.5])  # generation-bound, then training+sync-bound
def test_one_step_step_time_and_lag_one(sync_s):
    r = simulate(cfg("one_step", weight_sync_s=sync_s, n_steps=10, warmup_steps=3))
    gen_s = L * l_of(32)
    train_s = 64 * L / (2 * 5000.0)
    assert r.step_s == pytest.approx(max(gen_s, train_s + sync_s), rel=1e-9)
    assert np.all(r.lags == 1)
    first = simulate(cfg("one_step", warmup_steps=0))
    assert np.all(first.lags[:64] == 0) and np.all(first.lags[64:] == 1)


# ---------------------------------------------------------------------------- pipeline


def pipeline_oracle(c: SimConfig) -> float:
    produce = c.n_engines * c.max_batch / (c.a_s + c.b_s * c.max_batch)
    consume = c.n_train_gpus * c.train_tokens_per_s_per_gpu
    return min(produce, consume)


@pytest.mark.parametrize("c_per_gpu", [5000.0, 500.0])  # production-bound, consumption-bound
def test_pipeline_throughput_is_min_of_production_and_consumption(c_per_gpu):
    c = cfg("pipeline", train_tokens_per_s_per_gpu=c_per_gpu, weight_sync_s=0.0, n_steps=14, warmup_steps=4)
    r = simulate(c)
    assert r.tokens_per_s == pytest.approx(pipeline_oracle(c), rel=0.02)
    if c_per_gpu == 500.0:  # trainer-bound: the trainer never waits, the samplers do
        assert r.trainer_busy_frac == pytest.approx(1.0, abs=0.02)
        assert r.sampler_idle_frac == pytest.approx(1 - 1000.0 / (2 * 32 / l_of(32)), abs=0.03)
    else:
        assert r.sampler_busy_frac == pytest.approx(1.0, abs=0.02)


def test_pipeline_sync_that_does_not_block_the_trainer():
    c = cfg(
        "pipeline",
        train_tokens_per_s_per_gpu=500.0,
        weight_sync_s=1.0,
        sync_blocks_trainer=False,
        n_steps=14,
        warmup_steps=4,
    )
    r = simulate(c)
    assert r.tokens_per_s == pytest.approx(1000.0, rel=0.02)
    assert r.trainer_sync_frac == 0.0
    default = simulate(cfg("pipeline", train_tokens_per_s_per_gpu=500.0, weight_sync_s=1.0, n_steps=14, warmup_steps=4))
    assert default.tokens_per_s == r.tokens_per_s  # non-blocking is the pipeline's default
    blocking = simulate(
        cfg("pipeline", train_tokens_per_s_per_gpu=500.0, weight_sync_s=1.0, n_steps=14, sync_blocks_trainer=True)
    )
    assert blocking.tokens_per_s == pytest.approx(6400 / (6.4 + 1.0), rel=0.02)


@pytest.mark.parametrize("admission", ["fifo", "wait", "drop"])
def test_pipeline_with_max_lag_zero_is_synchronous(admission):
    sync = simulate(cfg("sync_split", weight_sync_s=0.2))
    pipe = simulate(cfg("pipeline", max_lag=0, weight_sync_s=0.2, admission=admission))
    assert pipe.step_s == pytest.approx(sync.step_s, rel=1e-9)
    assert np.all(pipe.lags == 0)
    assert pipe.n_dropped == 0


def heavy_tail(rng: np.random.Generator) -> int:
    return int(rng.integers(20, 60)) if rng.random() > 0.05 else int(rng.integers(300, 600))


@pytest.mark.parametrize("admission", ["wait", "drop"])
@pytest.mark.parametrize("max_lag", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("c_per_gpu", [5000.0, 300.0])
def test_pipeline_lag_never_exceeds_max_lag(max_lag, c_per_gpu, admission):
    c = cfg(
        "pipeline",
        admission=admission,
        max_lag=max_lag,
        lengths=heavy_tail,
        batch_samples=16,
        max_batch=8,
        train_tokens_per_s_per_gpu=c_per_gpu,
        n_steps=25,
        warmup_steps=0,
        seed=max_lag,
    )
    r = simulate(c)
    all_lags = r.sample_consumed_version[r.consumed_ids] - r.sample_start_version[r.consumed_ids]
    assert all_lags.max() <= max_lag
    assert r.lag_max <= max_lag


def test_pipeline_fifo_without_r2_lets_stragglers_exceed_max_lag():
    kw = dict(lengths=heavy_tail, batch_samples=16, max_batch=8, n_steps=25, warmup_steps=0, max_lag=2, seed=2)
    strict = simulate(cfg("pipeline", **kw))
    fifo = simulate(cfg("pipeline", **{**kw, "admission": "fifo"}))
    assert strict.lag_max <= 2 < fifo.lag_max
    assert fifo.tokens_per_s >= strict.tokens_per_s  # the strict trainer waits for stragglers


def test_pipeline_mean_lag_grows_with_max_lag_when_production_exceeds_consumption():
    means = []
    for max_lag in (1, 2, 4):
        r = simulate(cfg("pipeline", max_lag=max_lag, train_tokens_per_s_per_gpu=500.0, n_steps=16, warmup_steps=6))
        assert r.lag_max <= max_lag
        means.append(r.lag_mean)
    assert means[0] < means[1] < means[2]
    assert means[2] > 3.0  # the queue is full: samples wait about max_lag steps


def test_tail_slows_sync_split_more_than_pipeline():
    table = np.array([L] * 99 + [3 * L])  # 1% of the answers are 3x longer
    drops = {}
    for layout in ("sync_split", "pipeline"):
        kw = dict(n_steps=30, warmup_steps=2, max_lag=4, weight_sync_s=0.0)
        base = simulate(cfg(layout, **kw))
        tail = simulate(cfg(layout, lengths=table, seed=1, **kw))
        drops[layout] = 1 - tail.tokens_per_s / base.tokens_per_s
    assert drops["sync_split"] > 0.2
    assert drops["pipeline"] < 0.05
    assert drops["sync_split"] > drops["pipeline"] + 0.15


# ------------------------------------------------------------------------ conservation


@pytest.mark.parametrize(
    "layout, kw",
    [
        ("sync_colocated", {}),
        ("sync_split", {}),
        ("one_step", {}),
        ("pipeline", {}),
        ("pipeline", {"admission": "fifo"}),
        ("pipeline", {"admission": "drop", "max_lag": 1}),
        ("pipeline", {"admission": "drop", "max_lag": 1, "r_s": 1e-5, "f_s": 2e-4, "prompt_tokens": 100}),
        ("sync_split", {"r_s": 1e-5, "f_s": 2e-4, "prompt_tokens": 100}),
    ],
)
def test_samples_consumed_at_most_once_and_tokens_counted_once(layout, kw):
    c = cfg(layout, lengths=heavy_tail, batch_samples=24, max_batch=16, n_steps=12, seed=3, **{"max_lag": 3, **kw})
    r = simulate(c)
    ids = r.consumed_ids
    assert len(np.unique(ids)) == len(ids) == r.n_consumed == c.n_steps * c.batch_samples
    assert np.all(r.sample_consumed_version[ids] >= 0)
    assert np.sum(r.sample_consumed_version >= 0) == r.n_consumed
    # every sample started is consumed, dropped or still unconsumed; never consumed and dropped
    dropped = r.sample_dropped_version >= 0
    assert not np.any(dropped[ids])
    assert r.n_dropped == dropped.sum()
    assert r.dropped_tokens == r.sample_progress_tokens[dropped].sum()
    if kw.get("admission") != "drop":
        assert r.n_dropped == r.dropped_tokens == 0
    # consumed samples were finished: all their tokens were decoded
    assert np.all(r.sample_progress_tokens[ids] == r.sample_lengths[ids])
    assert np.all(r.sample_progress_tokens <= r.sample_lengths)
    assert np.sum(r.sample_progress_tokens == r.sample_lengths) == r.n_finished
    assert r.n_started == len(r.sample_lengths) >= r.n_finished >= r.n_consumed
    # the decode steps' ledger (sum of B over steps) equals the per-sample progress
    assert r.decoded_tokens == r.sample_progress_tokens.sum()
    measured = ids[c.warmup_steps * c.batch_samples :]
    assert r.measured_tokens == r.sample_lengths[measured].sum()
    lags = r.sample_consumed_version[measured] - r.sample_start_version[measured]
    assert np.array_equal(r.lags, lags)


def test_same_seed_same_result_other_seed_differs():
    c = cfg("pipeline", lengths=heavy_tail, seed=7, n_steps=10)

    def key(r: SimResult):
        return (r.tokens_per_s, r.step_end_s.tolist(), r.lags.tolist(), r.sample_lengths.tolist(), r.timeline)

    assert key(simulate(c)) == key(simulate(c))
    assert key(simulate(cfg("pipeline", lengths=heavy_tail, seed=8, n_steps=10))) != key(simulate(c))
    arr = cfg("sync_split", lengths=[10, 20, 30, 40], seed=5)
    assert key(simulate(arr)) == key(simulate(arr))


# ---------------------------------------------------------------------------- timeline


def test_timeline_rows_tile_time_and_gantt_draws():
    r = simulate(cfg("one_step", n_steps=6))
    rows: dict[tuple[str, int], list] = {}
    for iv in r.timeline:
        rows.setdefault((iv.role, iv.resource_index), []).append(iv)
    assert set(rows) == {("sampler", 0), ("sampler", 1), ("trainer", 0), ("trainer", 1)}
    for bars in rows.values():
        bars.sort(key=lambda iv: iv.start_s)
        assert bars[0].start_s == 0.0 and bars[-1].end_s == pytest.approx(r.timeline_end_s)
        for a, b in itertools.pairwise(bars):
            assert a.end_s == pytest.approx(b.start_s)  # no overlap, no hole
    kinds = {iv.kind for iv in r.timeline}
    assert {"decode", "train", "sync", "idle"} <= kinds
    ax = gantt(r, until_s=10.0)
    assert ax.get_xlabel() and ax.get_ylabel() and ax.get_legend() is not None
    assert ax.get_xlim()[1] == pytest.approx(10.0)
    import matplotlib.pyplot as plt

    plt.close("all")


def test_timeline_is_bounded():
    r = simulate(cfg("sync_split", n_steps=20, timeline_max_intervals=12))
    assert r.timeline_truncated
    assert r.timeline_end_s < r.step_end_s[-1]
    assert len(r.timeline) <= 2 * (12 + 4) + 4


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "layout, kw, match",
    [
        ("async", {}, "layout must be one of"),
        ("sync_split", {"n_samplers": None}, "give n_samplers"),
        ("sync_split", {"n_samplers": 3, "n_trainers": 3}, "must equal n_gpus"),
        ("sync_split", {"n_samplers": 4}, "n_trainers must be an int >= 1"),
        ("sync_colocated", {"n_samplers": 2}, "leave n_samplers unset"),
        ("pipeline", {"n_gpus": 1, "n_samplers": 1}, "needs >= 2 GPUs"),
        ("pipeline", {"batch_samples": 0}, "batch_samples must be an int >= 1"),
        ("pipeline", {"max_batch": 2.5}, "max_batch must be an int"),
        ("pipeline", {"max_lag": -1}, "max_lag must be a number >= 0"),
        ("pipeline", {"max_lag": float("nan")}, "max_lag must be a number >= 0"),
        ("pipeline", {"max_lag": True}, "max_lag must be a number >= 0"),
        ("pipeline", {"admission": "lifo"}, "admission must be one of \\('fifo', 'wait', 'drop'\\)"),
        ("pipeline", {"admission": "wait", "max_lag": 0.5}, "floor\\(max_lag\\) = 0"),
        ("pipeline", {"admission": "drop", "max_lag": 0.99}, "max_lag=0.99 with admission='drop'"),
        ("pipeline", {"admission": "drop", "max_lag": math.inf}, "needs a finite max_lag"),
        ("pipeline", {"admission": "wait", "max_lag": math.inf}, "use admission='fifo' for no window"),
        ("pipeline", {"r_s": -1e-6}, "r_s must be a finite number >= 0"),
        ("pipeline", {"f_s": float("inf")}, "f_s must be a finite number >= 0"),
        ("pipeline", {"prompt_tokens": -5}, "prompt_tokens must be a finite number >= 0 \\(tokens\\)"),
        ("pipeline", {"prompt_tokens": float("nan")}, "prompt_tokens must be a finite number"),
        ("pipeline", {"warmup_steps": 8}, "warmup_steps=8 must be < n_steps=8"),
        ("pipeline", {"a_s": -0.1}, "a_s must be a finite number >= 0"),
        ("pipeline", {"a_s": 0.0, "b_s": 0.0}, "a_s \\+ b_s \\+ f_s must be > 0"),
        ("pipeline", {"train_tokens_per_s_per_gpu": 0.0}, "train_tokens_per_s_per_gpu must be"),
        ("pipeline", {"weight_sync_s": float("nan")}, "weight_sync_s must be a finite number"),
        ("pipeline", {"lengths": []}, "non-empty 1-D"),
        ("pipeline", {"lengths": [10, 0]}, "must be >= 1 token"),
        ("pipeline", {"lengths": [1.5, 2.0]}, "whole numbers"),
        ("pipeline", {"seed": "x"}, "seed must be an int"),
    ],
)
def test_bad_config_raises(layout, kw, match):
    with pytest.raises(ValueError, match=match):
        cfg(layout, **kw)


def test_bad_length_callable_raises_when_drawn():
    with pytest.raises(ValueError, match="must return an int >= 1"):
        simulate(cfg("pipeline", lengths=lambda rng: 0))
    with pytest.raises(ValueError, match="until_s must be > 0"):
        gantt(simulate(cfg("sync_split", n_steps=3)), until_s=0.0)


def test_pipeline_admission_spreads_sequences_over_engines():
    """(R3): when the lag bound admits fewer sequences than the engines could hold, a
    least-loaded admission keeps every engine near its share instead of filling the first
    ones to max_batch; with l(B) = a + b B that is faster (each step's weight read is shared
    by fewer sequences on an overfull engine)."""
    common: dict[str, Any] = dict(n_gpus=8, n_samplers=4, batch_samples=64, max_batch=64, max_lag=1, n_steps=30)
    common.update(train_tokens_per_s_per_gpu=1e6, lengths=(50, 100, 150), warmup_steps=5)
    balanced = simulate(cfg("pipeline", **common))
    greedy = simulate(cfg("pipeline", balance_engines=False, **common))
    share = 2 * 64 / 4  # (max_lag + 1) batches held at most, spread over 4 engines
    assert balanced.sampler_mean_in_flight <= share + 1
    assert greedy.sampler_mean_in_flight > share + 1
    assert balanced.tokens_per_s > 1.2 * greedy.tokens_per_s
    assert balanced.lag_max <= 1 and greedy.lag_max <= 1


# ------------------------------------------------------------------ the decode step (08.3)

R_S, F_S, P = 1e-5, 4e-4, 100  # seconds per resident KV token, per token processed; 100-token prompts


def naive_generation_s(lengths, max_batch: int, a: float, b: float, r: float, f: float, prompt: float):
    """One engine, token by token: fill free slots in order, then one step of (08.3), each running
    sequence of length L carrying P / L prompt tokens of prefill (chunked prefill).
    Returns (seconds, steps, steps where the compute term bound)."""
    pending = [int(x) for x in lengths]
    running: list[list[int]] = []  # [length, tokens generated so far]
    t, steps, compute_bound = 0.0, 0, 0
    while pending or running:
        while pending and len(running) < max_batch:
            running.append([pending.pop(0), 0])
        n = len(running)
        resident = sum(prompt + generated for _, generated in running)
        prefill = sum(prompt / length for length, _ in running)
        memory_s, compute_s = a + b * n + r * resident, f * (n + prefill)
        t += max(memory_s, compute_s)
        steps += 1
        compute_bound += compute_s > memory_s
        for seq in running:
            seq[1] += 1
        running = [seq for seq in running if seq[1] < seq[0]]
    return t, steps, compute_bound


def test_decode_step_s_is_the_roofline_step():
    linear = cfg("pipeline")
    assert linear.decode_step_s(10) == A_S + B_S * 10
    assert linear.decode_step_s(10, 5000.0, 300.0) == A_S + B_S * 10  # r_s = f_s = 0: R and prefill do not matter
    c = cfg("pipeline", r_s=R_S, f_s=F_S, prompt_tokens=P)
    assert c.decode_step_s(4, 450.0, 0.0) == pytest.approx(A_S + B_S * 4 + R_S * 450)  # memory-bound
    assert c.decode_step_s(4, 450.0, 200.0) == pytest.approx(F_S * (4 + 200))  # prefill: compute-bound


def test_sync_split_step_with_the_roofline_decode_step():
    # one engine, 2 slots, 5 samples per batch: slots refill mid-batch, so steps with and without prefill
    kw: dict[str, Any] = dict(n_samplers=1, n_gpus=2, batch_samples=5, max_batch=2, lengths=(3, 7, 12), n_steps=5)
    c = cfg("sync_split", r_s=R_S, f_s=F_S, prompt_tokens=P, **kw)
    r = simulate(c)
    gens, bound_steps, all_steps = [], 0, 0
    for k in range(c.n_steps - 1):
        batch = r.sample_lengths[5 * (k + 1) : 5 * (k + 2)]  # step k + 1 trains on batch k + 1
        gen_s, steps, compute_bound = naive_generation_s(batch, 2, A_S, B_S, R_S, F_S, P)
        bound_steps, all_steps = bound_steps + compute_bound, all_steps + steps
        model_s = generation_time_s(batch, 1, 2, A_S, B_S, r_s=R_S, f_s=F_S, prompt_tokens=P)
        assert gen_s == pytest.approx(model_s, rel=1e-12)  # the model's (08.7) on one engine
        train_s = batch.sum() / 5000.0
        assert r.step_end_s[k + 1] - r.step_end_s[k] == pytest.approx(0.1 + gen_s + train_s, rel=1e-9)
        gens.append(gen_s)
    assert 0 < bound_steps < all_steps  # both terms of the max bind somewhere
    measured = sum(gens[c.warmup_steps - 1 :])  # batches warmup_steps .. n_steps - 1
    assert r.sampler_busy_frac == pytest.approx(measured / r.measured_s, rel=1e-9)
    linear = simulate(cfg("sync_split", **kw))  # same seed, same lengths; the linear step is faster
    assert np.array_equal(linear.sample_lengths, r.sample_lengths)
    assert linear.step_s < r.step_s


# ------------------------------------------------------------------ admission rules


TAIL = tuple(range(20, 60)) + (350, 500)  # a long-tailed length list: 2 answers in 42 are ~10x longer


def all_lags(r: SimResult) -> np.ndarray:
    ids = r.consumed_ids
    return r.sample_consumed_version[ids] - r.sample_start_version[ids]


@pytest.mark.parametrize("max_lag, sync_s", [(1, 0.1), (1.5, 0.1), (2, 0.1), (1.5, 3.0)])
def test_hard_rules_bound_every_lag_where_fifo_exceeds_it(max_lag, sync_s):
    # sync_s = 3.0 (non-blocking): the weights reach the samplers steps late, samples start stale
    kw: dict[str, Any] = dict(lengths=TAIL, batch_samples=16, max_batch=8, n_steps=25, warmup_steps=0, seed=2)
    runs = {
        a: simulate(cfg("pipeline", admission=a, max_lag=max_lag, weight_sync_s=sync_s, **kw))
        for a in ("fifo", "wait", "drop")
    }
    bound = math.floor(max_lag)
    assert all_lags(runs["fifo"]).max() > bound
    assert all_lags(runs["wait"]).max() <= bound and runs["wait"].lag_max <= bound
    assert all_lags(runs["drop"]).max() <= bound and runs["drop"].lag_max <= bound
    assert runs["fifo"].n_dropped == runs["wait"].n_dropped == 0 < runs["drop"].n_dropped
    assert runs["fifo"].tokens_per_s > runs["wait"].tokens_per_s  # the waiting trainer idles on stragglers
    if max_lag == 1.5 and sync_s == 0.1:  # "wait" needs whole batches: its window is floor(max_lag) + 1
        whole = simulate(cfg("pipeline", admission="wait", max_lag=1, weight_sync_s=sync_s, **kw))
        assert np.array_equal(whole.step_end_s, runs["wait"].step_end_s)


def test_drop_refuses_stale_samples_and_accounts_for_them():
    kw: dict[str, Any] = dict(lengths=TAIL, batch_samples=16, max_batch=8, n_steps=25, warmup_steps=2, seed=2)
    c = cfg("pipeline", admission="drop", train_tokens_per_s_per_gpu=300.0, **kw)
    r = simulate(c)
    lens, prog = r.sample_lengths, r.sample_progress_tokens
    dropped = r.sample_dropped_version >= 0
    consumed = r.sample_consumed_version >= 0
    unconsumed = ~dropped & ~consumed  # running or queued when the run stopped
    assert r.n_dropped == dropped.sum() > 0
    assert not np.any(dropped & consumed)
    assert r.n_started == r.n_consumed + r.n_dropped + unconsumed.sum()
    assert r.n_consumed == c.n_steps * c.batch_samples  # every update still gets a full batch
    # dropped because it would have been consumed past the bound: start + floor(max_lag) < version
    assert np.all(r.sample_dropped_version[dropped] - r.sample_start_version[dropped] > 2)
    # both ways: finished ones taken off the queue, running ones aborted part way
    assert np.any(prog[dropped] == lens[dropped]) and np.any(prog[dropped] < lens[dropped])
    assert r.dropped_tokens == prog[dropped].sum() > 0
    # the decode ledger holds the wasted tokens: decoded = consumed + dropped + still unconsumed
    assert r.decoded_tokens == lens[consumed].sum() + r.dropped_tokens + prog[unconsumed].sum()
    assert np.sum(prog == lens) == r.n_finished  # a dropped sample that got its last token counts as finished
    assert r.measured_tokens == lens[r.consumed_ids[c.warmup_steps * c.batch_samples :]].sum()  # useful tokens only
    ax = gantt(r)
    assert f"{r.n_dropped} dropped" in ax.get_title(loc="left") and "(drop)" in ax.get_title(loc="left")
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.mark.parametrize("c_per_gpu", [5000.0, 300.0])
def test_fifo_fractional_window_holds_at_most_one_and_a_half_batches(c_per_gpu):
    def run(max_lag: float) -> tuple[int, SimResult]:
        kw: dict[str, Any] = dict(max_lag=max_lag, train_tokens_per_s_per_gpu=c_per_gpu, lengths=(50, 100, 150))
        r = simulate(cfg("pipeline", admission="fifo", n_steps=10, **kw))
        # (R1): when sample i started (at version s), i + 1 samples were started and 64 s released
        return int(np.max(np.arange(r.n_started) + 1 - 64 * r.sample_start_version)), r

    (zero, r_zero), (half, r_half), (one, r_one) = run(0), run(0.5), run(1)
    assert (zero, half, one) == (64, 96, 128)  # the windows fill up to (max_lag + 1) batches, no further
    if c_per_gpu == 5000.0:  # production-bound: half a batch of overlap is between synchronous and max_lag = 1
        assert r_zero.tokens_per_s < r_half.tokens_per_s < r_one.tokens_per_s


def test_fifo_without_a_window_keeps_the_engines_full():
    r = simulate(cfg("pipeline", admission="fifo", max_lag=math.inf, train_tokens_per_s_per_gpu=300.0, n_steps=6))
    assert r.sampler_busy_frac == pytest.approx(1.0)
    assert r.sampler_mean_in_flight == pytest.approx(32.0)
    assert r.lag_max > 2  # nothing holds the samplers back: the queue (and the lag) grows


def test_sim_config_copies_the_spec():
    spec = SystemSpec(
        n_gpus=4, batch_samples=16, max_batch=8, a_s=A_S, b_s=B_S, train_tokens_per_s_per_gpu=5000.0, answer_tokens=L,
        n_samplers=2, weight_sync_s=0.1, max_lag=1.5, admission="drop", r_s=R_S, f_s=F_S, prompt_tokens=P, min_trainers=2,
    )  # fmt: skip
    c = sim_config(spec, "pipeline", n_steps=6)
    assert (c.r_s, c.f_s, c.prompt_tokens, c.admission, c.max_lag) == (R_S, F_S, P, "drop", 1.5)
    assert (c.n_samplers, c.n_trainers, c.lengths, c.n_steps) == (2, 2, (L,), 6)
    assert sim_config(spec, "pipeline", admission="wait", max_lag=2).admission == "wait"  # the caller overrides
    assert c.sync_blocks_trainer is True  # the model's default: sending the weights stops the trainers
    assert sim_config(replace(spec, sync_blocks_trainer=False), "pipeline").sync_blocks_trainer is False
    assert sim_config(spec, "one_step").sync_blocks_trainer is True  # (08.10) counts d on the trainer's side
    several = replace(spec, batches_per_generation=2)
    with pytest.raises(ValueError, match=r"spec\.batches_per_generation=2: the simulator generates one batch"):
        sim_config(several, "sync_split")
    assert sim_config(several, "sync_split", batches_per_generation=1).batch_samples == 16
    with pytest.raises(ValueError, match="batches_per_generation=3"):
        sim_config(spec, "sync_split", batches_per_generation=3)
