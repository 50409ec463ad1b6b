"""Lesson 10's graders: the solutions pass, the stubs are "not implemented yet", every planted
bug is rejected with its message (tests/test_exercises.py repeats these three for every
lesson once lessons/10_fault_tolerance.py exists; they are here too so they run before it
does); the graders' oracles agree with the library (`course_lib.checkpoint.interval`) and
with hand-made folders; bad submissions get a report, never a crash, a hang or a leftover
file; one planted bug per exercise is caught end to end through `course grade`.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grading_helpers as gh
import numpy as np
import pytest
from conftest import mutant_function, solution_function, stub_function
from mutants.l10_fault_tolerance import MUTANTS

from course_lib.checkpoint.interval import daly_interval, exact_waste_fraction, young_interval
from course_lib.course.grading.checks import NOT_IMPLEMENTED, run_check, run_exercise
from course_lib.course.grading.lessons import get_exercise
from course_lib.course.grading.lessons import l10_fault_tolerance as l10

LESSON = "10_fault_tolerance"
NAMES = ("commit_checkpoint", "newest_complete", "optimal_interval", "train_until")

pytestmark = pytest.mark.timeout(120)


def _grader_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("grade10_*")}


def test_registry_lists_the_four_exercises():
    gh.assert_registry(LESSON, NAMES, ("10", "fault_tolerance"), points=50)


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_and_stub_is_not_implemented(name):
    before = _grader_folders()
    outcome = run_exercise(get_exercise(LESSON, name), solution_function(LESSON, name))
    assert outcome.passed, outcome.message
    stub = run_exercise(get_exercise(LESSON, name), stub_function(LESSON, name))
    assert not stub.passed and stub.message == NOT_IMPLEMENTED
    assert _grader_folders() == before  # the graders' scratch folders are removed


# Every planted bug against its message: tests/test_exercises.py (every lesson).


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "commit_checkpoint-rename_before_fsync",
        "commit_checkpoint-no_fsync_at_all",
        "commit_checkpoint-manifest_after_rename",
        "commit_checkpoint-no_dir_fsync",
        "commit_checkpoint-no_tmp_dir_fsync",
        "commit_checkpoint-fsync_without_flush",
        "commit_checkpoint-tmp_dir_fsynced_when_empty",
        "optimal_interval-imports_library_intervals",
        "commit_checkpoint-straight_into_final",
        "newest_complete-string_order",
        "newest_complete-no_hash_check",
        "newest_complete-takes_temporary_dirs",
        "newest_complete-crashes_on_unreadable_manifest",
        "optimal_interval-returns_young",
        "optimal_interval-first_order_waste",
        "newest_complete-quarantines_on_any_exception",
        "newest_complete-errno_whitelist",
        "newest_complete-fresh_start_over_corrupt",
        "commit_checkpoint-fixed_tmp_name",
        "commit_checkpoint-deletes_live_leftovers",
        "train_until-skips_a_step",
        "train_until-reuses_key",
        "train_until-restarts_from_seed",
    }
    gh.assert_slips_planted(MUTANTS, slips, NAMES)


# ---------------------------------------------------------------------------------------
# The graders' oracles agree with the library and with hand-made folders
# ---------------------------------------------------------------------------------------


def test_interval_solution_and_oracle_agree_and_minimise_the_librarys_exact_waste():
    solve = solution_function(LESSON, "optimal_interval")
    rng = np.random.default_rng(0)
    cases = [(60.0, 3600.0, 600.0), (2.0, 1.0, 0.0), (5.0, 1.0, 3.0), (1.999, 1.0, 0.0)]
    cases += [
        (M * float(np.exp(rng.uniform(-16, 0.7))), M, float(rng.uniform(0, 1e4)))
        for M in np.exp(rng.uniform(2, 14, size=200)).tolist()
    ]
    for C, M, R in cases:
        tau, waste = solve(C, M, R)
        assert math.isclose(tau, l10.exact_optimum(C, M), rel_tol=1e-9)
        assert math.isclose(waste, exact_waste_fraction(tau, C, M, R), rel_tol=1e-9)
        for nearby in (tau * 0.999, tau * 1.001):
            assert exact_waste_fraction(nearby, C, M, R) >= waste * (1 - 1e-12)
    for C, M in ((60.0, 3600.0), (5.0, 86400.0)):  # Daly's interval approximates it; Young's less well
        tau = l10.exact_optimum(C, M)
        assert abs(daly_interval(C, M) - tau) < abs(young_interval(C, M) - tau)


def test_the_interval_check_is_tighter_than_dalys_approximation_somewhere():
    rng = np.random.default_rng(0)
    off = 0
    for _ in range(40):  # as the check draws them
        M = float(np.exp(rng.uniform(np.log(10.0), np.log(1e6))))
        C = M * float(np.exp(rng.uniform(np.log(1e-7), np.log(2.0))))
        off += not math.isclose(daly_interval(C, M), l10.exact_optimum(C, M), rel_tol=1e-6)
    assert off >= 10


def test_newest_oracle_and_solution_agree_on_the_hand_folders(tmp_path):
    solve = solution_function(LESSON, "newest_complete")
    for i, (case, damage) in enumerate(l10.BREAKS.items()):
        root = tmp_path / f"case{i}"
        for step in (4, 5, 6):
            l10.write_checkpoint(root, step, l10._payload(step))
        damage(root / "step_00000006")
        assert l10.naive_newest(root) == solve(root) == (5, root / "step_00000005"), case
    root = tmp_path / "names"
    for step in (99_999_999, 100_000_000):
        l10.write_checkpoint(root, step, l10._payload(step))
    assert l10.naive_newest(root)[0] == solve(root)[0] == 100_000_000
    assert l10.naive_newest(root, string_order=True)[0] == 99_999_999


def test_a_checkpoint_committed_by_the_solution_verifies_and_one_byte_breaks_it(tmp_path):
    commit = solution_function(LESSON, "commit_checkpoint")
    path = commit(tmp_path, 4, {"a.bin": b"abc" * 100})
    assert l10.verify(path)
    data = bytearray((path / "a.bin").read_bytes())
    data[7] ^= 1
    (path / "a.bin").write_bytes(bytes(data))
    assert not l10.verify(path) and l10.verify(path, check_hash=False)


def test_the_tracer_records_the_solutions_calls_in_order(tmp_path):
    commit = solution_function(LESSON, "commit_checkpoint")
    _, events = l10._cc_traced(commit, tmp_path, 1, {"x.bin": b"x", "y.bin": b"y"})
    tmp = f".tmp-step_00000001-{os.getpid()}-"
    kinds = [(e.kind, tmp if Path(e.path).name.startswith(tmp) else Path(e.path).name, e.is_dir) for e in events]
    assert kinds == [
        ("fsync", "x.bin", False),
        ("fsync", "y.bin", False),
        ("fsync", "manifest.json", False),
        ("fsync", tmp, True),  # the temporary directory (pid and random suffix), as the lesson's commit does
        ("replace", tmp, False),
        ("fsync", tmp_path.name, True),
    ]
    assert events[4].listing == ("manifest.json", "x.bin", "y.bin")
    assert os.fsync.__module__ == "posix" and os.replace.__module__ == "posix"  # restored


def test_the_solution_fsyncs_what_the_librarys_commit_fsyncs(tmp_path, monkeypatch):
    """Exercise 1's protocol is the lesson's: the same directories fsynced, in the same order
    relative to the rename, as course_lib.checkpoint.atomic.commit."""
    from course_lib.checkpoint.atomic import commit as library_commit

    def directory_fsyncs(fn, root):
        _, events = l10._cc_traced(fn, root, 1, {"x.bin": b"x"})
        i = next(
            k for k, e in enumerate(events) if e.kind in ("replace", "rename") and Path(e.dst).name == "step_00000001"
        )
        before = [Path(e.path).name.startswith(".tmp-") for e in events[:i] if e.kind == "fsync" and e.is_dir]
        after = [e.path == l10._real_path(root) for e in events[i + 1 :] if e.kind == "fsync" and e.is_dir]
        return any(before), any(after)

    solve = solution_function(LESSON, "commit_checkpoint")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert directory_fsyncs(solve, tmp_path / "a") == directory_fsyncs(library_commit, tmp_path / "b") == (True, True)


def test_a_solution_without_the_temporary_folder_fsync_fails_with_its_message():
    for name in ("no_tmp_dir_fsync", "tmp_dir_fsync_after_rename"):
        mutant = next(m for m in MUTANTS if m.function == "commit_checkpoint" and m.name == name)
        outcome = run_exercise(get_exercise(LESSON, "commit_checkpoint"), mutant_function(LESSON, mutant))
        assert not outcome.passed and "fsync the temporary directory itself before os.replace" in outcome.message


def test_the_tracer_records_each_fsynced_files_size_and_each_directorys_entries(tmp_path):
    """What makes a flush-less fsync and an early directory fsync visible: the file's size on
    disk at the fsync (Python's buffer holds a small write until flush) and the directory's
    entries at its fsync."""
    commit = solution_function(LESSON, "commit_checkpoint")
    _, events = l10._cc_traced(commit, tmp_path, 1, {"x.bin": b"x" * 300, "y.bin": b"yy"})
    assert [e.size for e in events[:2]] == [300, 2]
    assert events[3].is_dir and events[3].listing == ("manifest.json", "x.bin", "y.bin")


def _reviewers_commit(root, step, files):
    """The submission an independent review found passing 4/4: the temporary directory fsynced
    right after mkdir (empty), each file fsynced with its bytes still in Python's buffer."""
    import hashlib
    import json
    import shutil

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step_{step:08d}", root / f".tmp-step_{step:08d}"
    if final.exists():
        raise FileExistsError(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    entries = {}
    for name, data in files.items():
        with open(tmp / name, "wb") as f:
            f.write(data)
            os.fsync(f.fileno())
        entries[name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    with open(tmp / "manifest.json", "w") as f:
        json.dump({"step": step, "files": entries}, f)
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(root, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    return final


def test_a_flushless_fsync_and_an_early_directory_fsync_fail():
    outcome = run_exercise(get_exercise(LESSON, "commit_checkpoint"), _reviewers_commit)
    assert not outcome.passed and "call f.flush() before os.fsync" in outcome.message
    assert "held 0 of its 768 bytes on disk" in outcome.message
    for name, fragment in (
        ("fsync_without_flush", "call f.flush() before os.fsync"),
        ("tmp_dir_fsynced_when_empty", "before its entries were written"),
    ):
        mutant = next(m for m in MUTANTS if m.function == "commit_checkpoint" and m.name == name)
        outcome = run_exercise(get_exercise(LESSON, "commit_checkpoint"), mutant_function(LESSON, mutant))
        assert not outcome.passed and fragment in outcome.message, outcome.message


def test_optimal_interval_refuses_the_librarys_implementation():
    def imported(C, M, R=0.0):
        return daly_interval(C, M), float(exact_waste_fraction(daly_interval(C, M), C, M, R))

    assert run_exercise(get_exercise(LESSON, "optimal_interval"), solution_function(LESSON, "optimal_interval")).passed
    outcome = run_exercise(get_exercise(LESSON, "optimal_interval"), imported)
    assert not outcome.passed and "course_lib.checkpoint.interval.daly_interval" in outcome.message


def test_train_until_solution_matches_the_key_oracle():
    solve = solution_function(LESSON, "train_until")
    stream = l10.naive_keys(5, 6)
    recorder = l10._Recorder()
    out = solve(l10._fresh(5), 6, recorder)
    assert recorder.calls == l10._expected_calls(stream, 0, 6)
    assert l10._bits(out["key"]) == l10._bits(stream[-1][0]) and out["step"] == 6


def _os_level_newest(root):
    """A correct exercise 2 that reads through os.open / os.read (review 10, defect 6): it must pass."""
    import hashlib
    import json
    import re

    def read(path):
        fd = os.open(path, os.O_RDONLY)
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 16):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    committed = sorted(
        (
            (int(m.group(1)), p)
            for p in Path(root).iterdir()
            if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()
        ),
        reverse=True,
    )
    corrupt = []
    for step, path in committed:
        try:
            manifest = json.loads(read(path / "manifest.json"))
            ok = all(
                len(data := read(path / name)) == entry["size"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
                for name, entry in manifest["files"].items()
            )
        except (FileNotFoundError, ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if ok:
            for bad in corrupt:
                os.replace(bad, bad.with_name(".corrupt-" + bad.name))
            return step, path
        corrupt.append(path)
    if corrupt:
        raise RuntimeError("no committed checkpoint verifies")
    return None


def test_a_correct_os_open_solution_passes_and_the_errno_whitelist_fails():
    outcome = run_exercise(get_exercise(LESSON, "newest_complete"), _os_level_newest)
    assert outcome.passed, outcome.message
    mutant = next(m for m in MUTANTS if m.function == "newest_complete" and m.name == "errno_whitelist")
    outcome = run_exercise(get_exercise(LESSON, "newest_complete"), mutant_function(LESSON, mutant))
    assert not outcome.passed and "ESTALE" in outcome.message, outcome.message
    assert os.open.__module__ == "posix"  # restored


def test_the_io_errors_reach_the_manifest_and_the_data_files_through_os_open(tmp_path):
    import errno

    l10.write_checkpoint(tmp_path, 6, l10._payload(6))
    newest = l10._real_path(tmp_path / "step_00000006")
    with l10._FailingReads(newest, errno.ESTALE).patched(), pytest.raises(OSError) as caught:
        os.open(tmp_path / "step_00000006" / "manifest.json", os.O_RDONLY)
    assert caught.value.errno == errno.ESTALE
    with l10._FailingReads(newest, errno.EROFS, data_only=True).patched():
        os.close(os.open(tmp_path / "step_00000006" / "manifest.json", os.O_RDONLY))
        with pytest.raises(OSError):
            (tmp_path / "step_00000006" / next(iter(l10._payload(6)))).read_bytes()
    assert os.open.__module__ == "posix"


# ---------------------------------------------------------------------------------------
# Bad submissions: a report, never a crash or a hang
# ---------------------------------------------------------------------------------------

BAD: dict[str, list[tuple[Callable[..., Any], str]]] = {
    "commit_checkpoint": [
        (lambda root, step, files: None, "expected the committed directory"),
        (lambda root, step, files: Path(root) / f"step_{step:08d}", "no directory"),
    ],
    "newest_complete": [
        (lambda root: "step_00000003", "expected None"),
        (lambda root: "step_00000003" if any(Path(root).iterdir()) else None, "expected a tuple (step, path)"),
        (lambda root: None, "expected a tuple (step, path)"),
    ],
    "optimal_interval": [
        (lambda C, M, R=0.0: math.sqrt(2 * C * M), "expected a tuple (tau, waste)"),
        (lambda C, M, R=0.0: (float("nan"), 1.0), "expected a finite float"),
    ],
    "train_until": [
        (lambda ckpt, total, step_fn: None, "expected a dict"),
        (lambda ckpt, total, step_fn: dict(ckpt, step=total), "ran 0 steps"),
    ],
}


@pytest.mark.parametrize(("name", "fn", "fragment"), gh.bad_submissions(BAD))
def test_bad_submissions_are_reported(name, fn, fragment):
    before = _grader_folders()
    gh.assert_bad_submission_reported(LESSON, name, fn, fragment)
    assert _grader_folders() == before  # no scratch folder left behind


def test_an_infinite_loop_times_out_and_os_is_restored():
    def forever(root, step, files):
        os.fsync  # noqa: B018
        while True:
            pass

    real = os.fsync
    gh.assert_infinite_loop_times_out(l10.COMMIT_CHECKPOINT, forever)
    assert os.fsync is real


def test_a_crash_inside_the_traced_call_restores_os():
    def raises(root, step, files):
        os.fsync(2**20)  # EBADF inside the patched call

    real = (os.fsync, os.replace, os.rename)
    result = run_check(l10._cc_trace, raises)
    assert result.status == "error" and "OSError" in result.message
    assert (os.fsync, os.replace, os.rename) == real


def test_the_write_crashes_tear_a_file_or_stop_between_files_and_restore_open(tmp_path):
    """The fakes behind exercise 1's crash check: a torn write leaves half a file in the temporary folder,
    a crash between files leaves the earlier files whole and the next one absent; open is restored."""
    import builtins
    import io

    commit = solution_function(LESSON, "commit_checkpoint")
    real = builtins.open
    counted = l10._WriteCrash()
    with counted.patched():
        commit(tmp_path / "a", 2, dict(l10.FILES))
    names = [Path(p).name for p in counted.opened]
    assert names == [*l10.FILES, "manifest.json"]
    with pytest.raises(l10._Crash), l10._WriteCrash(at=1, torn=True).patched():
        commit(tmp_path / "b", 2, dict(l10.FILES))
    (tmp,) = (tmp_path / "b").glob(f".tmp-step_00000002-{os.getpid()}-*")
    assert (tmp / "params.bin").read_bytes() == l10.FILES["params.bin"]
    assert (tmp / "opt_state.bin").read_bytes() == l10.FILES["opt_state.bin"][: len(l10.FILES["opt_state.bin"]) // 2]
    with pytest.raises(l10._Crash), l10._WriteCrash(at=2).patched():
        commit(tmp_path / "c", 2, dict(l10.FILES))
    (tmp,) = (tmp_path / "c").glob(f".tmp-step_00000002-{os.getpid()}-*")
    assert sorted(p.name for p in tmp.iterdir()) == ["opt_state.bin", "params.bin"]
    assert builtins.open is real and io.open is real


def test_the_read_recorder_sees_the_solutions_reads_of_the_newest_only(tmp_path):
    newest = solution_function(LESSON, "newest_complete")
    for step in (1, 2, 3):
        l10.write_checkpoint(tmp_path, step, l10._payload(step))
    reads = l10._Reads()
    with reads.patched():
        assert newest(tmp_path)[0] == 3
    assert reads.opened and {Path(p).parent.name for p in reads.opened} == {"step_00000003"}


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_orphans")
def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = ("rename_before_fsync", "quarantines_on_any_exception", "returns_young", "reuses_key")
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
