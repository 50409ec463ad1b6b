"""Lesson 09's graders beyond what tests/test_exercises.py checks for every lesson: the guard
that refuses course_lib's own implementations (the library's ``shard_range``, or
``BucketHeader.read`` + ``verify_bucket``, pass every check), however they are reached, while
the reference solutions and the error classes the exercises raise pass it."""

from __future__ import annotations

import functools
import textwrap
from typing import Any

import pytest
from conftest import mutant_function, solution_function
from mutants.l09_weight_sync import MUTANTS

from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.helpers import library_references
from course_lib.course.grading.lessons import l09_weight_sync as l09

LESSON = "09_weight_sync"
NAMES = ("pack_buckets", "pipeline_schedule", "shard_range", "verify_bucket", "update_time")
EXERCISES = {e.name: e for e in l09.EXERCISES}

pytestmark = pytest.mark.timeout(300)

FORMS = textwrap.dedent(
    """
    import functools
    import course_lib.weight_sync.reshard as reshard_module
    from course_lib.weight_sync import reshard
    from course_lib.weight_sync.reshard import shard_range as library_shard_range
    from course_lib.weight_sync.integrity import (BucketHeader, CorruptBucketError, OutOfOrderBucketError,
                                                  verify_bucket as library_verify)

    direct = library_shard_range

    def wrapper(size, tp_rank, tp_size):
        return library_shard_range(size, tp_rank, tp_size)

    def via_module(size, tp_rank, tp_size):
        return reshard.shard_range(size, tp_rank, tp_size)

    def via_import_inside(size, tp_rank, tp_size):
        from course_lib.weight_sync.reshard import shard_range
        return shard_range(size, tp_rank, tp_size)

    partial = functools.partial(library_shard_range)

    def verify_wrapper(slot, expected_version, expected_index):
        library_verify(slot[:-64], BucketHeader.read(slot), version=expected_version, index=expected_index)
        return slot[:-64]

    def own_verify_raising_library_errors(slot, expected_version, expected_index):
        if expected_version < 0:
            raise OutOfOrderBucketError("stale")
        raise CorruptBucketError("not written yet")
    """
)


def _namespace() -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(FORMS, "<learner>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("form", ["direct", "wrapper", "via_module", "via_import_inside", "partial"])
def test_the_guard_refuses_the_library_shard_range_however_it_is_reached(form: str) -> None:
    fn = _namespace()[form]
    results = run_exercise(EXERCISES["shard_range"], fn).results
    assert results[0].status == "fail" and all(r.status == "skipped" for r in results[1:]), results
    assert "course_lib.weight_sync.reshard.shard_range, the library's own implementation" in results[0].message


def test_the_guard_refuses_a_two_line_wrapper_of_the_library_verify() -> None:
    results = run_exercise(EXERCISES["verify_bucket"], _namespace()["verify_wrapper"]).results
    assert results[0].status == "fail" and all(r.status == "skipped" for r in results[1:])
    assert "course_lib.weight_sync.integrity." in results[0].message
    assert "the library's own implementation" in results[0].message


def test_the_error_classes_may_be_imported() -> None:
    fn = _namespace()["own_verify_raising_library_errors"]
    found = library_references(fn, ("course_lib",))
    assert found and set(found) <= l09.ALLOWED
    results = run_exercise(EXERCISES["verify_bucket"], fn).results
    assert not any("the library's own implementation" in r.message for r in results)


@pytest.mark.parametrize("name", NAMES)
def test_every_reference_solution_passes_the_guard_and_every_check(name: str) -> None:
    fn = solution_function(LESSON, name)
    assert [f for f in library_references(fn, ("course_lib",)) if f not in l09.ALLOWED] == []
    results = run_exercise(EXERCISES[name], fn).results
    assert all(r.status == "pass" for r in results), [(r.status, r.message) for r in results]


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if "library" in m.name], ids=lambda m: m.id)
def test_the_planted_library_answers_are_refused(mutant: Any) -> None:
    results = run_exercise(EXERCISES[mutant.function], mutant_function(LESSON, mutant)).results
    assert results[0].status == "fail" and mutant.expected in results[0].message, results[0].message


def test_partial_is_the_library_function() -> None:  # the form above really is the library's
    assert isinstance(_namespace()["partial"], functools.partial)


def test_the_update_time_oracle_agrees_with_the_library_model() -> None:
    """The grader's oracle walks the buckets through the ping-pong buffers (no closed form); the lesson's
    scale model writes (09.1)-(09.3) in closed form: they must agree on random updates."""
    import numpy as np

    from course_lib.weight_sync import scale_model as sm

    rng = np.random.default_rng(4)
    for _ in range(200):
        nbytes, k, bucket_bytes, r = l09._random_case(rng)
        hw = sm.Hardware(
            bandwidth=r["beta"],
            latency=r["alpha"],
            stage_bw=r["sigma"],
            reload_bw=r["rho"],
            write_bw=r["write"],
            read_bw=r["read"],
            overlap=r["eta"],
            tensor_cost=r["gamma"],
        )
        for method in l09.METHODS:
            want = sm.update_time(method, nbytes, hw, n_tensors=k, bucket_bytes=bucket_bytes)
            assert l09.simulate_update(method, nbytes, k, bucket_bytes, r) == pytest.approx(want, rel=1e-12)


def test_the_hand_computed_update_times() -> None:
    for method, seconds in l09.BY_HAND_SECONDS.items():
        got = l09.simulate_update(method, 10**9, 100, 250_000_000, l09.BY_HAND)
        assert got == pytest.approx(seconds, rel=1e-12), method


def test_the_pack_oracle_reads_the_bytes_a_view_shows() -> None:
    """The byte-by-byte oracle (struct, element by element) agrees with torch's own bytes of each view."""
    import torch

    for t in l09._views() + l09._tensors(0):
        assert l09._logical_bytes(t) == t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
