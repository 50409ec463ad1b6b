"""The commit protocol (course_lib.checkpoint.atomic) and the kill harness (crash), tested
with real files and real SIGKILLs: a checkpoint is complete and verified, or it is not there."""

from __future__ import annotations

import json
import operator
import os
import time
from pathlib import Path

import numpy as np
import pytest

from course_lib.checkpoint.atomic import (
    MANIFEST,
    CheckpointError,
    CorruptCheckpoint,
    Manifest,
    NoCheckpoint,
    commit,
    keep_last,
    latest_complete,
    list_steps,
    quarantine,
    restore_latest,
    step_dir,
    verify_manifest,
    write_manifest,
)
from course_lib.checkpoint.crash import (
    KillPoint,
    _child_main,
    kill_self,
    known_files,
    run_in_child,
    save_known_steps,
)
from course_lib.runtime.processes import live_children, wait_gone

# every child reaped, and multiprocessing's forkserver and resource tracker stopped after the module:
# later suites (tests/test_grading_kernel.py) assert the test process has no children at all
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_helpers_left_behind")]


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    left = live_children()
    assert wait_gone([p.pid for p in left], within=5.0), f"child processes left behind: {left}"


def _files(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "weights.bin").write_bytes(bytes(range(256)) * 40)
    (d / "sub" / "state.json").write_text('{"step": 7}')
    return d


def _read_listed(path: Path) -> dict[str, bytes]:
    return {name: (path / name).read_bytes() for name in verify_manifest(path).files}


# --- manifest --------------------------------------------------------------------------


def test_manifest_round_trip_lists_every_file_recursively(tmp_path):
    d = _files(tmp_path)
    m = write_manifest(d, 7, {"lib": "test"})
    assert sorted(m.files) == ["sub/state.json", "weights.bin"]
    assert m.files["weights.bin"].bytes == 256 * 40
    assert Manifest.from_json(m.to_json()) == m
    assert verify_manifest(d) == m
    assert json.loads((d / MANIFEST).read_text())["step"] == 7
    assert not [p for p in d.iterdir() if p.name.startswith(".")], "the manifest's temp file was left behind"
    (d / "added_later.txt").write_text("a marker another tool writes")
    assert verify_manifest(d) == m, "unlisted extra files are allowed"


def _truncate(d: Path) -> None:
    p = d / "weights.bin"
    p.write_bytes(p.read_bytes()[:-100])


def _flip(d: Path) -> None:
    p = d / "weights.bin"
    data = bytearray(p.read_bytes())
    data[5000] ^= 0x01
    p.write_bytes(bytes(data))


def _garble(d: Path) -> None:
    (d / MANIFEST).write_text('{"format": 1, "step": 7, "files": {"weights.bin": ')


@pytest.mark.parametrize(
    ("damage", "file", "words"),
    [
        (_truncate, "weights.bin", "truncated"),
        (_flip, "weights.bin", "sha256"),
        (lambda d: (d / "sub" / "state.json").unlink(), "sub/state.json", "missing"),
        (lambda d: (d / MANIFEST).unlink(), MANIFEST, "missing"),
        (_garble, MANIFEST, "not a valid manifest"),
    ],
    ids=["truncated", "flipped-bit", "missing-file", "missing-manifest", "garbled-manifest"],
)
def test_verify_names_the_damaged_file(tmp_path, damage, file, words):
    d = _files(tmp_path)
    write_manifest(d, 7)
    damage(d)
    with pytest.raises(CorruptCheckpoint) as info:
        verify_manifest(d)
    assert info.value.file == file and info.value.path == d
    message = str(info.value)
    assert file in message and words in message and "falls back to the previous checkpoint" in message
    assert f"delete {d}" in message


# --- commit, list, restore --------------------------------------------------------------


def _commit_steps(root: Path, steps: list[int]) -> None:
    for s in steps:
        commit(root, s, known_files(s, size=1024), metadata={"s": s})


def test_commit_writes_a_verified_step_dir_and_nothing_else(tmp_path):
    root = tmp_path / "ckpts"
    path = commit(root, 12, {"a.bin": b"abc", "nested/b.bin": b"defg"})
    assert path == root / "step_00000012" == step_dir(root, 12)
    assert os.listdir(root) == ["step_00000012"], "no temp dir may survive a commit"
    assert _read_listed(path) == {"a.bin": b"abc", "nested/b.bin": b"defg"}
    assert verify_manifest(path).step == 12

    def write(d: Path) -> None:
        (d / "x.bin").write_bytes(b"x")

    assert _read_listed(commit(root, 100, write)) == {"x.bin": b"x"}
    assert list_steps(root) == [12, 100], "numeric order"


def test_commit_refuses_to_replace_a_committed_step(tmp_path):
    commit(tmp_path, 3, {"a": b"first"})
    with pytest.raises(CheckpointError, match="step 3 is already committed"):
        commit(tmp_path, 3, {"a": b"second"})
    assert _read_listed(step_dir(tmp_path, 3)) == {"a": b"first"}


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda root: commit(root, -1, {"a": b""}), "step must be an int >= 0"),
        (lambda root: commit(root, 1, {"../evil": b""}), "relative path inside the checkpoint"),
        (lambda root: commit(root, 1, {MANIFEST: b""}), "relative path inside the checkpoint"),
        (lambda root: keep_last(root, 0), "n >= 1"),
        (lambda root: restore_latest(root, Path.read_bytes), "nothing to restore: no committed checkpoint"),
        (lambda root: restore_latest(root / "never-made", Path.read_bytes), "nothing to restore"),
        (lambda root: list_steps(root / "f"), "is a file, not a directory"),
    ],
    ids=["negative-step", "escaping-name", "manifest-name", "keep-zero", "empty-dir", "no-dir", "root-is-file"],
)
def test_bad_input_gets_a_clear_error(tmp_path, call, match):
    (tmp_path / "f").write_text("not a directory")
    with pytest.raises(CheckpointError, match=match):
        call(tmp_path)
    assert not list(tmp_path.glob(".tmp-*")), "a failed commit must clean up its temp dir"


def test_restore_falls_back_over_a_corrupt_newest_checkpoint_and_reports_it(tmp_path):
    _commit_steps(tmp_path, [1, 2, 3])
    _flip_first_byte(step_dir(tmp_path, 3) / "part_1.bin")
    skipped: list[tuple[Path, str]] = []
    assert latest_complete(tmp_path, skipped=skipped) == (2, step_dir(tmp_path, 2))
    assert skipped[0][0] == step_dir(tmp_path, 3) and "part_1.bin" in skipped[0][1]
    assert latest_complete(tmp_path, verify=False) == (3, step_dir(tmp_path, 3))

    restored = restore_latest(tmp_path, _read_listed)
    assert restored.step == 2 and restored.value == known_files(2, size=1024)
    assert [p for p, _ in restored.skipped] == [step_dir(tmp_path, 3)]
    assert "sha256" in restored.skipped[0][1]


def _flip_first_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))


def test_restore_falls_back_when_the_loader_says_corrupt_and_propagates_other_errors(tmp_path):
    _commit_steps(tmp_path, [1, 2])

    def load(path: Path) -> int:
        if path.name.endswith("2"):
            raise CorruptCheckpoint(path, "part_0.bin", "the loader cannot parse it")
        return 1

    restored = restore_latest(tmp_path, load)
    assert restored.step == 1 and "cannot parse" in restored.skipped[0][1]

    def broken(path: Path) -> int:
        raise ValueError("a bug in the loader")

    with pytest.raises(ValueError, match="a bug in the loader"):
        restore_latest(tmp_path, broken)


def test_all_corrupt_is_nothing_to_restore_and_quarantine_hides_them(tmp_path):
    _commit_steps(tmp_path, [1, 2])
    for s in (1, 2):
        (step_dir(tmp_path, s) / MANIFEST).unlink()
    with pytest.raises(NoCheckpoint, match=r"every checkpoint .* is corrupt") as info:
        restore_latest(tmp_path, _read_listed)
    assert len(info.value.skipped) == 2
    moved = quarantine(step_dir(tmp_path, 2))
    assert moved.exists() and moved.name.startswith(".corrupt-step_00000002") and list_steps(tmp_path) == [1]
    commit(tmp_path, 2, {"a": b"again"})  # the step can be written again


def test_keep_last_keeps_the_newest_complete_even_behind_corrupt_ones(tmp_path):
    _commit_steps(tmp_path, [1, 2, 3, 4, 5])
    for s in (4, 5):
        (step_dir(tmp_path, s) / "part_0.bin").unlink()
    deleted = keep_last(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["step_00000001", "step_00000002"]
    assert list_steps(tmp_path) == [3, 4, 5]
    assert restore_latest(tmp_path, _read_listed).step == 3
    assert not list(tmp_path.glob(".tmp-*")), "deleting goes through a hidden rename, then is gone"


def test_keep_last_removes_temp_dirs_only_of_dead_writers(tmp_path):
    outcome = run_in_child(time.sleep, 0, timeout_s=30)
    assert outcome.exitcode == 0
    dead = tmp_path / f".tmp-step_00000009-{_dead_pid()}-abcd1234"
    mine = tmp_path / f".tmp-step_00000009-{os.getpid()}-abcd1234"
    for d in (dead, mine):
        d.mkdir()
        (d / "part_0.bin").write_bytes(b"half")
    _commit_steps(tmp_path, [1])
    assert list_steps(tmp_path) == [1] and restore_latest(tmp_path, _read_listed).step == 1
    assert keep_last(tmp_path, 1) == [dead]
    assert mine.exists() and not dead.exists()


def _dead_pid() -> int:
    """A pid that no process has now (the highest possible pid, checked)."""
    import psutil

    pid = 4_194_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


# --- the kill harness -----------------------------------------------------------------


def test_run_in_child_reports_how_the_child_ended():
    done = run_in_child(time.sleep, 0.0, timeout_s=30)
    assert (done.exitcode, done.killed, done.timed_out) == (0, False, False)
    raised = run_in_child(operator.truediv, 1, 0, timeout_s=30)
    assert raised.exitcode == 1 and not raised.killed
    itself = run_in_child(kill_self, timeout_s=30)
    assert itself.killed and not itself.timed_out and itself.reason == "killed by SIGKILL"
    ours = run_in_child(time.sleep, 60, timeout_s=30, kill_after_s=0.5)
    assert ours.killed and not ours.timed_out and ours.seconds < 10
    late = run_in_child(time.sleep, 60, timeout_s=1.0)
    assert late.killed and late.timed_out and 1.0 <= late.seconds < 10
    with pytest.raises(ValueError, match="kill_after_s"):
        run_in_child(time.sleep, 1, timeout_s=1, kill_after_s=2)
    with pytest.raises(ValueError, match="phase"):
        KillPoint(1, "sometime")


def _ready_then_sleep(ready_file: str) -> None:
    Path(ready_file).write_text("running")
    time.sleep(60)


def test_run_in_child_kills_after_an_event_whatever_the_start_up_takes(tmp_path):
    """``kill_when``: the kill lands after the child did something, not after a fixed time
    that a slow machine spends starting the child (lesson 10's killed writers)."""
    ready = tmp_path / "ready"
    outcome = run_in_child(_ready_then_sleep, str(ready), timeout_s=30, kill_after_s=0.1, kill_when=ready.exists)
    assert ready.read_text() == "running" and outcome.killed and not outcome.timed_out and outcome.seconds < 20
    never = run_in_child(time.sleep, 60, timeout_s=1.0, kill_when=lambda: False)
    assert never.killed and never.timed_out and 1.0 <= never.seconds < 10


def _start_grandchild_then_die(pid_file: str) -> None:
    import multiprocessing as mp

    ready = Path(pid_file + ".ready")
    child = mp.get_context("spawn").Process(target=_child_main, args=(_ready_then_sleep, (str(ready),), os.getpid()))
    child.start()
    Path(pid_file).write_text(str(child.pid))
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    kill_self()


def test_a_child_dies_with_its_parent(tmp_path):
    pid_file = tmp_path / "pid"
    outcome = run_in_child(_start_grandchild_then_die, str(pid_file), timeout_s=30)
    assert outcome.killed
    grandchild = int(pid_file.read_text())
    assert wait_gone([grandchild], within=5.0), "the grandchild outlived its SIGKILLed parent"


def _check_committed(root: Path) -> int:
    """Every committed step verifies and holds exactly its known content; return the newest."""
    steps = list_steps(root)
    for s in steps:
        assert _read_listed(step_dir(root, s)) == known_files(s), f"step {s} holds the wrong bytes"
        assert verify_manifest(step_dir(root, s)).metadata == {"step": s}
    return steps[-1] if steps else -1


def test_sigkill_at_random_times_during_saves_never_leaves_a_bad_checkpoint(tmp_path):
    rng = np.random.default_rng(2026)
    newest = -1
    killed_with_temp = 0
    for delay in rng.uniform(0.25, 0.9, size=12):
        outcome = run_in_child(save_known_steps, str(tmp_path), 100_000, timeout_s=30, kill_after_s=float(delay))
        assert outcome.killed and not outcome.timed_out, outcome
        now = _check_committed(tmp_path)
        assert now >= newest, f"the newest complete step went back from {newest} to {now}"
        assert latest_complete(tmp_path) == (now, step_dir(tmp_path, now))
        assert len(list_steps(tmp_path)) <= 4, "keep_last(3) runs after every commit (one more if killed between)"
        killed_with_temp += bool(list(tmp_path.glob(".tmp-*")))
        newest = now
    assert newest >= 5, f"the saver made too little progress to test anything (newest step {newest})"
    keep_last(tmp_path, 3)
    assert not list(tmp_path.glob(".tmp-*")), "keep_last removes the temp dirs of dead writers"
    print(f"12 kills: newest step {newest}, {killed_with_temp} kills left a half-written temp dir")


@pytest.mark.parametrize(
    ("phase", "committed", "temp_files"),
    [("before_save", [0, 1], None), ("mid_save", [0, 1], ["part_0.bin"]), ("after_save", [0, 1, 2], None)],
)
def test_kill_at_each_save_phase(tmp_path, phase, committed, temp_files):
    outcome = run_in_child(save_known_steps, str(tmp_path), 5, KillPoint(2, phase), timeout_s=30)
    assert outcome.killed, outcome
    assert list_steps(tmp_path) == committed
    assert _check_committed(tmp_path) == committed[-1]
    temps = list(tmp_path.glob(".tmp-*"))
    if temp_files is None:
        assert temps == []
    else:
        assert len(temps) == 1 and sorted(p.name for p in temps[0].iterdir()) == temp_files, "half-written, no manifest"
    assert restore_latest(tmp_path, _read_listed).step == committed[-1], "restore ignores the temp dir"

    resumed = run_in_child(save_known_steps, str(tmp_path), 2, timeout_s=30)
    assert resumed.exitcode == 0, resumed
    assert _check_committed(tmp_path) == committed[-1] + 2
    assert not list(tmp_path.glob(".tmp-*")), "the resumed writer's keep_last cleaned up"
