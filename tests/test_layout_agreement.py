"""Lesson 08: the analytic layout model (course_lib.layout) and the SimPy simulator
(course_lib.layout.sim) describe one system; where the model's assumptions hold they must agree.

The model is steady-state algebra (eqs. 08.7-08.12); the simulator plays the same system
out event by event (continuous batching, a FIFO of finished samples, weight versions,
backpressure). Equal answer lengths are the model's home ground: all four layouts agree on
throughput to 1e-6 (the same deterministic schedule, computed two ways), in the
sampler-bound and trainer-bound regimes, with and without a weight sync. Mixed lengths without a heavy tail: the pipeline's throughput still within 5% (its
continuous batching keeps the engines full). Trainer-bound pipelines: the mean lag is the
bound in both.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from course_lib.layout.model import LAYOUTS, SystemSpec, predict
from course_lib.layout.sim import SimConfig, sim_config, simulate

N_GPUS, N_SAMPLERS, BATCH, MAX_BATCH, A_S, B_S = 8, 4, 64, 16, 0.01, 0.0005
SAMPLER_BOUND_C = 20_000.0  # 4 trainers x 20,000 tokens/s, far above what 4 engines produce
TRAINER_BOUND_C = 500.0  # 4 trainers x 500 = 2,000 tokens/s < 4 engines x 16 / l(16) = 3,556


def _spec_and_config(
    layout: str, c: float, sync_s: float, lengths: tuple[int, ...], max_lag: int = 2, warmup_steps: int = 8
) -> tuple[SystemSpec, SimConfig]:
    """The same system for the model and for the simulator."""
    split = None if layout == "sync_colocated" else N_SAMPLERS
    common: dict[str, Any] = dict(n_gpus=N_GPUS, batch_samples=BATCH, max_batch=MAX_BATCH, a_s=A_S, b_s=B_S)
    common.update(train_tokens_per_s_per_gpu=c, n_samplers=split, weight_sync_s=sync_s, max_lag=max_lag)
    spec = SystemSpec(answer_tokens=lengths if len(lengths) > 1 else lengths[0], **common)
    # the model's trainer stops for the sync (SystemSpec.sync_blocks_trainer, default True) in every
    # layout; the simulator's default does so only outside the pipeline, so say it explicitly
    blocks = spec.sync_blocks_trainer
    cfg = sim_config(spec, layout, n_steps=40, warmup_steps=warmup_steps, sync_blocks_trainer=blocks)  # type: ignore[arg-type]
    expected = SimConfig(layout=layout, n_steps=40, warmup_steps=warmup_steps, lengths=lengths, **common)  # type: ignore[arg-type]
    assert cfg == replace(expected, sync_blocks_trainer=blocks)
    return spec, cfg


def _pair(layout: str, c: float, sync_s: float, lengths: tuple[int, ...]) -> tuple[float, float]:
    """Throughput (tokens/s): the model's prediction and the simulator's measurement."""
    spec, cfg = _spec_and_config(layout, c, sync_s, lengths)
    return predict(layout, spec).tokens_per_s, simulate(cfg).tokens_per_s


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("c", [SAMPLER_BOUND_C, TRAINER_BOUND_C], ids=["sampler-bound", "trainer-bound"])
@pytest.mark.parametrize("sync_s", [0.0, 0.3])
def test_equal_lengths_model_and_simulator_agree_within_5_percent(layout: str, c: float, sync_s: float) -> None:
    model, sim = _pair(layout, c, sync_s, (100,))
    assert sim == pytest.approx(model, rel=1e-6), (layout, model, sim)  # the same deterministic schedule


@pytest.mark.parametrize("c", [SAMPLER_BOUND_C, TRAINER_BOUND_C], ids=["sampler-bound", "trainer-bound"])
def test_pipeline_with_mixed_lengths_agrees_within_5_percent(c: float) -> None:
    lengths = tuple(int(x) for x in np.random.default_rng(0).integers(50, 151, size=BATCH))
    model, sim = _pair("pipeline", c, 0.0, lengths)
    assert sim == pytest.approx(model, rel=0.05), (model, sim)


def test_a_tail_separates_sync_from_pipeline_in_both() -> None:
    """1 sample in 64 ten times longer: both the model and the simulator charge the synchronous
    layout for the straggler and leave the pipeline nearly untouched."""
    body = (100,) * (BATCH - 1)
    tail = (*body, 1000)
    drops = {}
    for layout in ("sync_split", "pipeline"):
        m0, s0 = _pair(layout, SAMPLER_BOUND_C, 0.0, (100,) * BATCH)
        m1, s1 = _pair(layout, SAMPLER_BOUND_C, 0.0, tail)
        drops[layout] = (1 - m1 / m0 * (sum(body) + 100) / sum(tail), 1 - s1 / s0 * (sum(body) + 100) / sum(tail))
    # throughput per token of work: the synchronous split loses more in model and simulator alike
    assert drops["sync_split"][0] > drops["pipeline"][0] + 0.1, drops
    assert drops["sync_split"][1] > drops["pipeline"][1] + 0.1, drops


@pytest.mark.parametrize("max_lag", [1, 2, 4])
def test_trainer_bound_pipeline_runs_at_the_lag_bound_in_both(max_lag: int) -> None:
    spec, cfg = _spec_and_config("pipeline", TRAINER_BOUND_C, 0.0, (100,), max_lag=max_lag, warmup_steps=12)
    assert predict("pipeline", spec).mean_lag_steps == pytest.approx(max_lag)
    assert simulate(cfg).lag_mean == pytest.approx(max_lag, abs=0.05)
