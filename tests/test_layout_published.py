"""course_lib.layout.published: published systems as data, and the model held against them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from course_lib.layout.model import predict
from course_lib.layout.published import CASES, SHARED, Arm, predicted_speedup


def test_every_case_states_its_source_and_setting():
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names) >= 6
    for c in CASES:
        assert c.source and c.setting and c.published_speedup > 1.0
        assert c.shared is SHARED  # one set of assumptions for all: nothing per case
        assert c.system.layout in ("pipeline", "one_step") and c.baseline.layout in ("sync_colocated", "sync_split")


def test_the_cases_hold_the_published_figures():
    by = {c.name: c for c in CASES}
    assert [by[f"verl fully-async, {n} H20"].published_speedup for n in (32, 64, 128)] == [2.66, 1.92, 2.35]
    assert by["verl fully-async, 128 H20"].published_step_s == (150.63, 356.30)
    assert by["verl one-step-off, FSDP2"].published_speedup == pytest.approx(1158 / 934, abs=0.005)
    assert by["verl one-step-off, Megatron"].published_speedup == pytest.approx(1101 / 786, abs=0.005)
    pipeline_rl = by["PipelineRL, 128 H100"]
    assert (pipeline_rl.system.n_samplers, pipeline_rl.system.n_gpus - pipeline_rl.system.n_samplers) == (48, 80)
    assert pipeline_rl.max_num_seqs == 64 and pipeline_rl.baseline.batches_per_generation == 32


def test_predicted_speedup_is_the_model_on_both_arms():
    for c in CASES:
        r = predicted_speedup(c)
        assert r.system == predict(c.system.layout, c.spec(c.system))
        assert r.baseline == predict(c.baseline.layout, c.spec(c.baseline))
        assert r.predicted_speedup == pytest.approx(r.system.tokens_per_s / r.baseline.tokens_per_s)
        assert r.ratio == pytest.approx(r.predicted_speedup / c.published_speedup)
        # a miss beyond 25% must say what the model lacks
        assert r.within_25_percent or c.known_gap, c.name


def test_arms_differ_only_in_what_the_source_states():
    c = CASES[2]
    sys_spec, base_spec = c.spec(c.system), c.spec(c.baseline)
    assert sys_spec.answer_tokens == base_spec.answer_tokens and sys_spec.max_batch == base_spec.max_batch
    # verl's async arm takes the old log-probs from the rollout; the colocated arm recomputes them
    assert sys_spec.train_tokens_per_s_per_gpu == pytest.approx(base_spec.train_tokens_per_s_per_gpu * 8 / 6)
    assert max(c.shared.lengths(c.generation_limit).tokens) <= c.generation_limit


def test_implied_mfu_turns_a_published_time_into_the_mfu_it_needs():
    c = CASES[2]
    r = predicted_speedup(c)
    _, mfu_base = r.implied_mfu()
    assert mfu_base == pytest.approx(SHARED.mfu * r.baseline.train_s / c.published_train_s[1])
    # the model's trainer at the implied MFU takes exactly the published time
    faster = replace(c, shared=replace(SHARED, mfu=mfu_base))
    assert predicted_speedup(faster).baseline.train_s == pytest.approx(c.published_train_s[1], rel=1e-6)
    assert predicted_speedup(CASES[-1]).implied_mfu() == (None, None)


def test_arm_labels():
    assert Arm("pipeline", 128, 48).label() == "pipeline 48:80"
    assert Arm("sync_colocated", 32).label() == "sync_colocated 32 GPUs"
