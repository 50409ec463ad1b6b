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
from pathlib import Path
from typing import Any

import grading_helpers as gh
import numpy as np
import pytest
from conftest import exercise_function_source, solution_function
from mutants.l08_cluster_layout import MUTANTS

from course_lib.course.grading.checks import NOT_IMPLEMENTED, run_exercise
from course_lib.course.grading.lessons import l08_cluster_layout as l08
from course_lib.layout import model as layout

ROOT = Path(__file__).resolve().parents[1]
LESSON = "08_cluster_layout"
NAMES = ("max_batch", "balanced_split", "max_lag_steps", "engine_schedule")


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
        "max_lag_steps-mean_lag_rounded_up",
        "max_lag_steps-mean_lag_returned",
        "max_lag_steps-fifo_under_hard_rule",
        "max_lag_steps-mean_length_for_longest",
        "max_lag_steps-mean_length_for_straggler",
        "max_lag_steps-sync_forgotten",
        "max_lag_steps-max_lag_not_floored",
        "max_lag_steps-cap_not_floored",
        "max_lag_steps-round_not_ceil",
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


def _pipeline_specs(seed: int, n: int) -> list[layout.SystemSpec]:
    """Random pipelines under the three admission rules (some with a long straggler, some
    with a fractional bound) that the model can solve."""
    rng = np.random.default_rng(seed)
    out: list[layout.SystemSpec] = []
    while len(out) < n:
        n_gpus = int(rng.integers(2, 33))
        batch = int(rng.integers(4, 129))
        lengths = rng.integers(20, 600, size=batch)
        if rng.random() < 0.5:
            lengths[rng.integers(0, batch)] = rng.integers(1000, 6000)
        admission = layout.ADMISSIONS[int(rng.integers(0, 3))]
        bounds = (1, 1.5, 2, 3, 4) if admission != "fifo" else (0.5, 1, 1.5, 2, 3, 4)
        spec = layout.SystemSpec(
            n_gpus=n_gpus,
            n_samplers=int(rng.integers(1, n_gpus)),
            batch_samples=batch,
            max_batch=int(rng.integers(4, 300)),
            a_s=float(rng.uniform(1e-3, 2e-2)),
            b_s=float(rng.uniform(1e-6, 1e-4)),
            train_tokens_per_s_per_gpu=float(np.exp(rng.uniform(np.log(500.0), np.log(50000.0)))),
            answer_tokens=tuple(int(x) for x in lengths),
            weight_sync_s=float(rng.choice([0.0, rng.uniform(0.1, 20.0)])),
            max_lag=bounds[int(rng.integers(0, len(bounds)))],
            admission=admission,
        )
        try:
            layout.predict("pipeline", spec)
        except ValueError:  # "drop" with no answer short enough: no progress
            continue
        out.append(spec)
    return out


def test_max_lag_steps_solution_and_oracle_equal_the_library():
    """(08.13) and its cap from the model's own mean lag, step and l(B_eff) (its generation
    time over the mean length); (08.14) is the step of a "wait" pipeline whose stragglers set
    the pace, and no "wait" pipeline steps faster."""
    solve = solution_function(LESSON, "max_lag_steps")
    hard_bound = solution_function(LESSON, "hard_bound_step_s")
    checked = {"fifo": 0, "wait": 0, "drop": 0, "wait_binds": 0, "capped": 0}
    for spec in _pipeline_specs(1, 150):
        p = layout.predict("pipeline", spec)
        latency_s = p.generation_s / spec.mean_answer_tokens
        lengths = spec.lengths_tokens
        total = p.mean_lag_steps + (lengths.max() - lengths.mean()) * latency_s / p.step_s
        if abs(total - round(total)) < 1e-6:  # float noise could flip the ceiling
            continue
        args = (p.mean_lag_steps, lengths, latency_s, p.step_s, spec.max_lag, spec.admission)
        assert solve(*args) == p.max_lag_steps, spec
        assert l08.naive_max_lag(*args) == p.max_lag_steps, spec
        checked[spec.admission] += 1
        checked["capped"] += p.max_lag_steps < math.ceil(total - 1e-9)
        if spec.admission == "wait":
            bound_s = hard_bound(lengths, latency_s, spec.weight_sync_s, spec.max_lag)
            assert math.isclose(
                bound_s, l08.naive_hard_bound(list(lengths), latency_s, spec.weight_sync_s, spec.max_lag)
            )
            assert p.step_s >= bound_s * (1 - 1e-9), spec
            if p.wait_binds:
                assert math.isclose(p.step_s, bound_s, rel_tol=1e-6), spec
                checked["wait_binds"] += 1
    assert min(checked.values()) >= 5, checked
    lengths = list(l08.WORKED_LENGTHS)
    assert [solve(1.3, lengths, 0.02, 4.0, 3, rule) for rule in ("fifo", "wait", "drop")] == [5, 3, 3]
    assert math.isclose(hard_bound(lengths, 0.02, 1.0, 3.5), 19 / 3, rel_tol=1e-12)
    for max_lag in (0, 0.5):
        with pytest.raises(ValueError):
            hard_bound(lengths, 0.02, 1.0, max_lag)


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
    for slip in l08.MX_SLIPS.values():
        assert any(l08.naive_max_lag(*case, **slip) != l08.naive_max_lag(*case) for case in l08.MX_HAND_CASES), slip
    for slip in l08.HB_SLIPS.values():
        assert any(
            not math.isclose(l08.naive_hard_bound(*case, **slip), l08.naive_hard_bound(*case))
            for case in l08.HB_HAND_CASES
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
    "max_lag_steps": [
        (lambda m, lengths, lat, step, k, rule: None, "expected an int"),
        (lambda m, lengths, lat, step, k, rule: float("nan"), "expected an int"),
        (lambda m, lengths, lat, step, k, rule: "5", "expected an int"),
        (lambda m, lengths, lat, step, k, rule: [5], "expected an int"),
        (lambda m, lengths, lat, step, k, rule: 5.0, "return an int"),  # the first case's answer, as a float
        (lambda m, lengths, lat, step, k, rule: lengths.reverse() or 5, "changed the lengths"),
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

    def broken(mean_lag, lengths, latency_s, step_s, max_lag, admission):
        return lengths.no_such_field

    gh.assert_infinite_loop_times_out(l08.ENGINE_SCHEDULE, forever, ["timeout", "skipped", "skipped"])
    outcome = run_exercise(l08.MAX_LAG_STEPS, broken)
    assert outcome.results[0].status == "error" and "AttributeError" in outcome.message


def _max_lag_steps_beside(hard_bound_step_s: Callable[..., Any] | None) -> Callable[..., Any]:
    """The solved ``max_lag_steps`` defined beside ``hard_bound_step_s`` (``None``: not defined),
    as in a notebook whose exercise cell holds both."""
    namespace: dict[str, Any] = {"math": math, "np": np}
    exec(exercise_function_source(LESSON, "max_lag_steps", "solution"), namespace)
    if hard_bound_step_s is None:
        del namespace["hard_bound_step_s"]
    else:
        namespace["hard_bound_step_s"] = hard_bound_step_s
    return namespace["max_lag_steps"]


def _stub(lengths, lat, d, k):
    raise NotImplementedError("not implemented yet")


@pytest.mark.parametrize(
    ("hard_bound_step_s", "fragment"),
    [
        (None, "hard_bound_step_s is not defined beside max_lag_steps"),
        (_stub, "hard_bound_step_s still raises NotImplementedError"),
        (lambda lengths, lat, d, k: None, "expected a finite float (seconds)"),
        (lambda lengths, lat, d, k: float("nan"), "expected a finite float (seconds)"),
        (lambda lengths, lat, d, k: (max(lengths) * lat + d) / math.floor(k) if k >= 1 else 0.0, "expected ValueError"),
        (lambda lengths, lat, d, k: 1 / 0, "raised ZeroDivisionError"),
    ],
    ids=["missing", "stub", "none", "nan", "no_value_error", "raises"],
)
def test_the_hard_bound_is_graded_beside_max_lag_steps(hard_bound_step_s, fragment):
    """max_lag_steps right, hard_bound_step_s missing, a stub or wrong: its own checks fail with
    a message that names it (never the bare "not implemented yet" of an untouched exercise)."""
    outcome = run_exercise(l08.MAX_LAG_STEPS, _max_lag_steps_beside(hard_bound_step_s))
    assert [r.status for r in outcome.results[:3]] == ["pass"] * 3
    assert not outcome.passed and fragment in outcome.message, outcome.message
    assert NOT_IMPLEMENTED not in outcome.message
    assert run_exercise(l08.MAX_LAG_STEPS, _max_lag_steps_beside(solution_function(LESSON, "hard_bound_step_s"))).passed


def test_not_a_function_is_reported():
    outcome = run_exercise(l08.MAX_BATCH, 241)
    assert not outcome.passed and "not a function" in outcome.message


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = ("bits", "floor", "fifo_under_hard_rule", "static_batching")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
