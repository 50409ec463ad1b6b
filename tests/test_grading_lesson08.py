"""Lesson 08's graders beyond what tests/test_exercises.py checks for every lesson: the
reference solutions agree with the library (`course_lib.layout`) on random inputs, so do
the graders' oracles; bad submissions (wrong types, NaN, an infinite loop) get a report,
never a crash or a hang.

What every lesson gets (solution passes, stub "not implemented yet", every planted bug caught,
the generated notebooks graded by `course grade`) is in tests/test_exercises.py and
tests/test_grade_course_notebooks.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import grading_helpers as gh
import numpy as np
import pytest
from conftest import solution_function
from mutants.l08_cluster_layout import MUTANTS

from course_lib import layout
from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import l08_cluster_layout as l08

ROOT = Path(__file__).resolve().parents[1]
LESSON = "08_cluster_layout"
NAMES = ("max_batch", "balanced_split", "mean_lag", "engine_schedule")


def test_registry_lists_the_four_exercises():
    gh.assert_registry(LESSON, NAMES, ("8", "cluster_layout"), points=50)


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "max_batch-bits",
        "max_batch-no_k_and_v",
        "max_batch-no_layers",
        "max_batch-round",
        "max_batch-float_division",
        "balanced_split-floor",
        "balanced_split-round",
        "mean_lag-one_step_lag_0",
        "mean_lag-cap_off_by_one",
        "mean_lag-counts_training_batch",
        "engine_schedule-end_off_by_one",
        "engine_schedule-slot_taken_late",
        "engine_schedule-static_batching",
    }
    gh.assert_slips_planted(MUTANTS, slips)


# ---------------------------------------------------------------------------------------
# The reference solutions agree with the library; so do the graders' oracles
# ---------------------------------------------------------------------------------------


def test_max_batch_solution_and_oracle_equal_the_library():
    solve = solution_function(LESSON, "max_batch")
    cases = [(s, g, ctx, f) for s, g, ctx, f in l08.random_shapes(1, 200)]
    cases += [(layout.QWEN25_7B, layout.H100_SXM, 4096, 0.9), (layout.QWEN25_32B, layout.H100_SXM, 4096, 0.9)]
    for shape, gpu, context, fraction in cases:
        expected = layout.max_batch(shape, gpu, context, fraction)
        assert solve(shape, gpu, context, fraction) == expected
        assert l08.naive_max_batch(shape, gpu, context, fraction) == expected
    assert solve(layout.QWEN25_7B, layout.H100_SXM, 4096) == 241
    for args in ((layout.QWEN25_32B, l08.GPU_40GB, 1024, 0.9), (layout.QWEN25_32B, layout.H100_SXM, 32768, 0.9)):
        with pytest.raises(ValueError):
            layout.max_batch(*args)
        with pytest.raises(ValueError):
            solve(*args)


def test_balanced_split_solution_and_oracle_equal_the_library():
    """N_s* is `layout.balanced_samplers`; the whole split is `layout.best_split` of a pipeline
    whose cap never binds (max_lag large), where tokens/s = min(N_s p, N_t c) exactly (08.11)."""
    solve = solution_function(LESSON, "balanced_split")
    for n_gpus, b, a_s, b_s, c in l08.random_rates(1, 60):
        p = layout.engine_tokens_per_s(b, a_s, b_s)
        spec = layout.SystemSpec(
            n_gpus=n_gpus,
            batch_samples=64,
            max_batch=b,
            a_s=a_s,
            b_s=b_s,
            train_tokens_per_s_per_gpu=c,
            answer_tokens=100,
            max_lag=n_gpus * b,
        )
        best = layout.best_split("pipeline", spec).n_samplers
        for n_star, n_samplers in (solve(n_gpus, b, a_s, b_s, c), l08.naive_split(n_gpus, b, a_s, b_s, c)):
            assert math.isclose(n_star, layout.balanced_samplers(n_gpus, p, c), rel_tol=1e-12)
            assert n_samplers == best


def test_mean_lag_solution_and_oracle_equal_the_library():
    solve = solution_function(LESSON, "mean_lag")
    cases = l08.random_specs(1, 300)
    cases += [(name, l08.HAND_SPEC) for name in l08.LAYOUT_NAMES]
    cases += [("pipeline", replace(l08.HAND_SPEC, max_lag=k)) for k in (0, 1, 8)]
    cases += [("pipeline", replace(l08.HAND_SPEC, train_tokens_per_s_per_gpu=500.0))]
    for name, spec in cases:
        expected = layout.predict(name, spec).mean_lag_steps
        assert math.isclose(solve(name, spec), expected, rel_tol=1e-12, abs_tol=1e-12), (name, spec)
        assert math.isclose(l08.naive_mean_lag(name, spec), expected, rel_tol=1e-12, abs_tol=1e-12), (name, spec)
    assert math.isclose(solve("pipeline", l08.HAND_SPEC), 2.5 + 0.5 * (128 / 0.026) / 16384, rel_tol=1e-12)


def test_engine_schedule_solution_and_oracle_equal_the_library():
    solve = solution_function(LESSON, "engine_schedule")
    rng = np.random.default_rng(1)
    for _ in range(200):
        lengths = rng.integers(1, 60, size=int(rng.integers(0, 50)))
        max_batch = int(rng.integers(1, 16))
        start, end = layout.engine_schedule(lengths, max_batch)
        got_start, got_end = solve(lengths, max_batch)
        np.testing.assert_array_equal(got_start, start)
        np.testing.assert_array_equal(got_end, end)
        assert got_start.dtype == got_end.dtype == np.int64
        assert l08.naive_schedule(list(lengths), max_batch) == (start.tolist(), end.tolist())


def test_each_slip_of_the_oracles_differs_from_the_right_answer_on_the_hand_cases():
    """A slip the grader can name must change the answer somewhere in the hand-computed cases."""
    shape, gpu = layout.QWEN25_7B, layout.H100_SXM
    right = l08.naive_max_batch(shape, gpu, 4096, 0.9)
    assert all(wrong != right for wrong in l08._mb_mistakes(shape, gpu, 4096, 0.9).values())
    hand = [
        l08.HAND_SPEC,
        replace(l08.HAND_SPEC, max_lag=1),
        replace(l08.HAND_SPEC, max_lag=1, weight_sync_s=5.0),
        replace(l08.HAND_SPEC, train_tokens_per_s_per_gpu=500.0),
    ]
    for slip in l08.ML_SLIPS.values():
        assert any(
            l08.naive_mean_lag(name, spec, **slip) != l08.naive_mean_lag(name, spec)
            for spec in hand
            for name in l08.LAYOUT_NAMES
        ), slip
    for slip in l08.ES_SLIPS.values():
        assert l08.naive_schedule([3, 1, 2, 4, 1], 2, **slip) != l08.naive_schedule([3, 1, 2, 4, 1], 2), slip


# ---------------------------------------------------------------------------------------
# Bad submissions: a report, never a crash or a hang
# ---------------------------------------------------------------------------------------

BAD: dict[str, list[tuple[Callable[..., Any], str]]] = {
    "max_batch": [
        (lambda shape, gpu, ctx, f=0.9: float("nan"), "expected an int"),
        (lambda shape, gpu, ctx, f=0.9: "241", "expected an int"),
        (
            lambda shape, gpu, ctx, f=0.9: float(
                (f * gpu.memory_bytes - shape.weight_bytes)
                // (2 * shape.n_layers * shape.n_kv_heads * shape.head_dim * shape.kv_bytes_per_elem * ctx)
            ),
            "return an int",
        ),
        (lambda shape, gpu, ctx, f=0.9: None, "expected an int"),
    ],
    "balanced_split": [
        (lambda n, b, a, bb, c: 3, "expected a tuple (n_star, n_samplers)"),
        (lambda n, b, a, bb, c: (float("nan"), 1), "expected a finite float"),
        (lambda n, b, a, bb, c: (n * c / (b / (a + bb * b) + c), 2.0), "expected an int"),
        (lambda n, b, a, bb, c: (n * c / (b / (a + bb * b) + c), 0), "leaves the range"),
    ],
    "mean_lag": [
        (lambda layout, spec: None, "expected a finite float"),
        (lambda layout, spec: float("inf"), "expected a finite float"),
        (lambda layout, spec: [0.0], "expected a finite float"),
    ],
    "engine_schedule": [
        (lambda lengths, b: None, "expected a tuple (start_step, end_step)"),
        (lambda lengths, b: ([0] * len(lengths), [1] * len(lengths)), "expected a numpy array"),
        (lambda lengths, b: (np.zeros(len(lengths)), np.ones(len(lengths))), "int64"),
        (lambda lengths, b: (np.zeros(2, dtype=np.int64), np.ones(2, dtype=np.int64)), "expected shape"),
    ],
}


@pytest.mark.parametrize(("name", "fn", "fragment"), gh.bad_submissions(BAD))
def test_bad_submissions_are_reported(name, fn, fragment):
    gh.assert_bad_submission_reported(LESSON, name, fn, fragment)


def test_an_infinite_loop_times_out_and_an_exception_is_reported():
    def forever(lengths, max_batch):
        while True:
            pass

    def broken(layout, spec):
        return spec.no_such_field

    gh.assert_infinite_loop_times_out(l08.ENGINE_SCHEDULE, forever, ["timeout", "skipped", "skipped"])
    outcome = run_exercise(l08.MEAN_LAG, broken)
    assert outcome.results[0].status == "error" and "AttributeError" in outcome.message


def test_not_a_function_is_reported():
    outcome = run_exercise(l08.MAX_BATCH, 241)
    assert not outcome.passed and "not a function" in outcome.message


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = ("bits", "floor", "cap_off_by_one", "static_batching")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
