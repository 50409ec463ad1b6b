"""What a checkpoint costs (course_lib.checkpoint.cost), and the kill demonstrations of lesson 10
(course_lib.checkpoint.crash.save_in_place, write_then_die): real SIGKILLs in child processes."""

from __future__ import annotations

import numpy as np
import pytest

from course_lib.checkpoint.atomic import commit, latest_complete, list_steps, step_dir
from course_lib.checkpoint.cost import TimeLost, make_state, save_costs, seal_seconds, state_bytes, training_time_lost
from course_lib.checkpoint.crash import KillPoint, known_files, run_in_child, save_in_place, write_then_die

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_helpers_left_behind")]


def test_make_state_has_the_size_asked_for_and_rejects_nonsense():
    state = make_state(4, n_mats=4)
    assert len(state) == 4 and abs(state_bytes(state) / 2**20 - 4) < 0.01
    for bad in (dict(mib=0), dict(mib=-1), dict(mib=1, n_mats=0), dict(mib=1e-9)):
        with pytest.raises(ValueError):
            make_state(**bad)


def test_save_costs_times_every_size_both_ways(tmp_path):
    costs = save_costs([1, 4], reps=1, root=tmp_path)
    assert [round(c.mib) for c in costs] == [1, 4]
    for c in costs:
        assert c.blocking > 0 and 0 < c.async_call <= c.async_written
        assert {k: len(v) for k, v in c.runs.items()} == {"blocking": 1, "async_call": 1, "async_written": 1}
    assert list(tmp_path.iterdir()) == []  # its scratch folder is removed
    with pytest.raises(ValueError):
        save_costs([], reps=1)


def test_seal_seconds_times_a_real_seal_and_cleans_up(tmp_path):
    small, large = seal_seconds(1, reps=1, root=tmp_path), seal_seconds(32, reps=3, root=tmp_path)
    assert 0 < small < large  # hashing 32 MiB takes longer than 1 MiB
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        seal_seconds(1, reps=0)


def test_training_time_lost_runs_every_mode_and_counts_the_checkpoints(tmp_path):
    lost = training_time_lost(1, steps=6, every=2, reps=2, passes=1, root=tmp_path)
    assert lost.n_checkpoints == 2 and lost.steps == 6  # saves after steps 2 and 4, none at the end
    assert {m: len(v) for m, v in lost.seconds.items()} == {"none": 2, "blocking": 2, "async": 2}
    assert lost.call("blocking") > 0 and lost.call("async") > 0
    assert list(tmp_path.iterdir()) == []
    for bad in (dict(steps=1), dict(every=0), dict(every=6), dict(reps=0), dict(passes=0)):
        with pytest.raises(ValueError):
            training_time_lost(1, **{"steps": 6, "every": 2, **bad})


def test_time_lost_pairs_the_runs_of_one_repeat():
    # repeat 2 ran on a slower machine: unpaired medians would mix it with repeat 1
    lost = TimeLost(
        seconds={"none": [1.0, 3.0, 1.1], "blocking": [1.6, 3.6, 1.7], "async": [1.3, 3.3, 1.4]},
        calls={"blocking": [0.2] * 3, "async": [0.01] * 3},
        n_checkpoints=3,
        steps=60,
        mib=32.0,
    )
    assert np.isclose(lost.lost_per_checkpoint("blocking"), 0.2) and np.isclose(lost.lost_per_checkpoint("async"), 0.1)
    assert lost.median("none") == 1.1 and lost.call("async") == 0.01


def test_a_writer_without_the_rename_killed_mid_save_leaves_a_torn_step_that_only_verification_skips(tmp_path):
    for step in (0, 1):
        commit(tmp_path, step, known_files(step))
    outcome = run_in_child(save_in_place, str(tmp_path), 2, KillPoint(2, "mid_save"), timeout_s=60)
    assert outcome.killed and list_steps(tmp_path) == [0, 1, 2]
    assert {p.name: p.stat().st_size for p in step_dir(tmp_path, 2).iterdir()} == {
        "part_0.bin": 65_536,
        "part_1.bin": 32_768,
    }
    assert latest_complete(tmp_path, verify=False)[0] == 2  # trusting the name picks the torn step
    assert latest_complete(tmp_path)[0] == 1


def test_save_in_place_without_a_kill_writes_a_step_that_verifies(tmp_path):
    save_in_place(str(tmp_path), 3)
    found = latest_complete(tmp_path)
    assert found is not None and found[0] == 3
    assert {f: (found[1] / f).read_bytes() for f in known_files(3)} == known_files(3)


def test_a_kill_does_not_lose_unsynced_bytes(tmp_path):
    path = tmp_path / "x.bin"
    outcome = run_in_child(write_then_die, str(path), 1 << 16, 5, timeout_s=60)
    assert outcome.killed and path.read_bytes() == np.random.default_rng(5).bytes(1 << 16)
