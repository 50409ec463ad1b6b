"""Actor faults in lesson 03's actor-learner system (lesson 10): heartbeats catch a frozen
actor (SIGSTOP), which is killed and restarted; a restarted actor acts with the learner's
current weights; the queued part of every lag stays within the slot bound under faults;
the fault injector kills actors while every update still gets done; faults vs none."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from course_lib.actor_learner.faults import FaultInjector, compare_faults, fault_run, lag_bound
from course_lib.actor_learner.heartbeats import Heartbeats, SupervisorConfig, beat
from course_lib.actor_learner.system import ActorLearnerSystem, SystemConfig
from course_lib.runtime.processes import live_children
from course_lib.runtime.processes import wait_gone as gone

FAST = SystemConfig(
    n_actors=2, envs_per_actor=4, unroll=8, batch_size=2, poll_s=0.05, stall_timeout_s=20.0, join_timeout_s=2.0
)
# 2 s: on a loaded 2-core machine a just-restarted actor can be descheduled for over a second, and a
# 1 s heartbeat then restarts it again (an extra restart the exact asserts below would reject)
QUICK_HEARTBEAT = SupervisorConfig(heartbeat_timeout_s=2.0)

pytestmark = pytest.mark.usefixtures("no_helpers_left_behind")


# ---------------------------------------------------------------------------------------
# Pieces, in one process
# ---------------------------------------------------------------------------------------


def test_heartbeats_tell_frozen_from_starting_and_alive():
    beats = Heartbeats(2)
    config = SupervisorConfig(heartbeat_timeout_s=2.0, start_timeout_s=10.0)
    beats.spawned(0)
    now = time.monotonic()
    assert beats.silent_for(0, config, now + 5.0) is None  # still starting: the start timeout applies
    assert beats.silent_for(0, config, now + 11.0) == pytest.approx(11.0, abs=0.5)
    beat(beats.row(0), unrolls=3, version=7, mid_unroll=True)
    assert beats.mid_unroll(0) and beats.table[0, 1] == 3 and beats.table[0, 2] == 7
    assert beats.silent_for(0, config, time.monotonic() + 1.0) is None
    assert beats.silent_for(0, config, time.monotonic() + 3.0) == pytest.approx(3.0, abs=0.5)
    assert beats.silent_for(0, SupervisorConfig(heartbeat_timeout_s=None), now + 1e6) is None  # off
    assert beats.table.is_shared() and beats.row(1).data_ptr() == beats.table[1].data_ptr()
    beat(None, 0, 0, mid_unroll=False)  # no row: nothing to do


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="heartbeat_timeout_s"):
        SupervisorConfig(heartbeat_timeout_s=0.0)
    with pytest.raises(ValueError, match="start_timeout_s"):
        SupervisorConfig(start_timeout_s=-1.0)
    with pytest.raises(ValueError, match="kill_every_s"):
        FaultInjector(ActorLearnerSystem(FAST), kill_every_s=0.0)
    with pytest.raises(ValueError, match="repeats"):
        compare_faults(FAST, seconds=1.0, repeats=0)
    with pytest.raises(ValueError, match="exactly one of kill_every_s"):
        FaultInjector(ActorLearnerSystem(FAST), kill_every_s=1.0, kill_every_updates=10)
    with pytest.raises(ValueError, match="kill_every_updates must be >= 1"):
        FaultInjector(ActorLearnerSystem(FAST), kill_every_updates=0)
    with pytest.raises(ValueError, match="not both"):
        compare_faults(FAST, seconds=1.0, kill_every_updates=10)
    with pytest.raises(ValueError, match="the faults arm needs one"):
        compare_faults(FAST, seconds=1.0, kill_every_s=None)


def test_lag_bound_counts_the_slots_ahead_in_the_queue():
    assert lag_bound(FAST) == 1  # 4 slots, batches of 2: at most 3 ahead, 1 update
    assert lag_bound(SystemConfig(n_actors=8, slots_per_actor=2, batch_size=4)) == 3
    assert lag_bound(SystemConfig(n_actors=1, slots_per_actor=2, batch_size=2)) == 0


# ---------------------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------------------

FROZEN = re.compile(r"actor (\d) \(pid (\d+)\) frozen: no heartbeat for (\d+\.\d) s; killed and restarted as pid (\d+)")


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("layout", "frozen"), [("impala", [1]), ("seed", [1]), ("impala", [0, 1])])
def test_a_frozen_actor_is_killed_and_restarted_and_training_goes_on(layout, frozen, no_orphans):
    """SIGSTOP (alive, silent): only the heartbeat can tell. Freezing every actor used to end
    in the stall timeout (see test_actor_learner); with heartbeats the system recovers."""
    cfg = SystemConfig(**{**FAST.__dict__, "layout": layout})
    with ActorLearnerSystem(cfg, QUICK_HEARTBEAT) as system:
        system.train(n_updates=3)
        stopped = {i: system.actors[i].process.pid for i in frozen}
        for pid in stopped.values():
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        report = system.train_until(  # an event after a time: not a window that must hold N updates
            lambda: (
                len(system.restart_log) == len(frozen)
                and (layout == "seed" or all(r.first_version is not None for r in system.restart_log))
            ),
            "every frozen actor replaced (and, IMPALA, its replacement learned from)",
            timeout_s=30.0,
        )
        took = time.monotonic() - start
        after = system.train(n_updates=10)  # and on, with the replacements
        pids = system.pids()
    assert report.updates >= 1 and after.updates == 10 and QUICK_HEARTBEAT.heartbeat_timeout_s <= took < 30
    found = {int(m[1]): m for e in report.events if (m := FROZEN.fullmatch(e))}
    assert set(found) == set(frozen), report.events
    for i, m in found.items():
        assert int(m[2]) == stopped[i] and float(m[3]) >= QUICK_HEARTBEAT.heartbeat_timeout_s
        assert int(m[4]) == pids[i] != stopped[i], report.events
    assert system.restarts == len(frozen) and [r.reason for r in system.restart_log] == ["frozen"] * len(frozen), (
        system.events
    )
    assert gone(pids + list(stopped.values())) and not live_children()


@pytest.mark.timeout(90)
def test_train_until_waits_for_a_timed_event_and_names_it_when_it_never_comes(no_orphans):
    """Lesson 10's frozen-actor demo waits for the restart (an event after the heartbeat
    *time*) instead of a fixed number of updates, which a fast CPU finished first."""
    with ActorLearnerSystem(FAST, QUICK_HEARTBEAT) as system:
        system.train(n_updates=3)
        os.kill(system.actors[1].process.pid, signal.SIGSTOP)
        start = time.monotonic()
        report = system.train_until(
            lambda: bool(system.restart_log) and system.restart_log[0].first_version is not None,
            "the frozen actor's replacement learned from",
            timeout_s=30.0,
        )
        waited = time.monotonic() - start
        (restart,) = system.restart_log
    assert restart.reason == "frozen" and restart.first_version is not None and report.updates >= 1
    assert waited >= QUICK_HEARTBEAT.heartbeat_timeout_s  # it waited for the time, whatever the CPU's speed
    with ActorLearnerSystem(FAST) as system:
        with pytest.raises(
            TimeoutError, match=r"^never: did not happen within 0.5 s \(\d+ updates ran\); the system's"
        ):
            system.train_until(lambda: False, "never", timeout_s=0.5)
        with pytest.raises(ValueError, match="timeout_s must be > 0"):
            system.train_until(lambda: True, "x", timeout_s=0)
    assert not live_children()


@pytest.mark.timeout(90)
def test_a_restarted_actor_acts_with_the_current_weights(no_orphans):
    with ActorLearnerSystem(FAST, QUICK_HEARTBEAT) as system:
        system.train(n_updates=10)
        at_kill = system.learner.version
        system.kill_actor(0)
        report = system.train(n_updates=30)
    (restart,) = system.restart_log
    assert restart.reason == "died" and restart.actor == 0 and restart.learner_version >= at_kill == 10
    assert restart.first_version is not None and restart.first_lag is not None
    # not the initial weights (version 0): the ones published when it started, or newer
    assert restart.first_version >= restart.learner_version
    assert 0 <= restart.first_lag <= int(report.lags.max())
    assert restart.recovery_s is not None and 0 < restart.recovery_s < 30
    assert report.restarts == 1 and not live_children()


@pytest.mark.timeout(90)
def test_the_injector_kills_actors_every_update_is_done_and_queued_lag_stays_bounded(no_orphans):
    # kills on an update schedule: 3 (after updates 100, 200 and 300) on any machine; a
    # clock (kill_every_s) would give fewer on a machine that does 300 updates quickly
    run = fault_run(FAST, seconds=None, n_updates=300, kill_every_s=None, kill_every_updates=100)
    r = run.report
    assert r.updates == 300 and run.arm == "faults"
    assert run.kills == 3, r.events
    assert [int(e.rsplit(" ", 1)[1]) for e in r.events if e.startswith("fault injector")] == [100, 200, 300]
    assert run.kills - 1 <= r.restarts <= run.kills  # the last kill may land after the last update
    assert sum(e.startswith("fault injector: SIGKILL actor") for e in r.events) == run.kills
    assert sum("died: killed by SIGKILL; restarted as pid" in e for e in r.events) == r.restarts
    assert 0 <= r.lost_unrolls <= r.restarts
    assert len(run.recoveries_s) >= r.restarts - 1 and all(0 < x < 30 for x in run.recoveries_s)
    assert len(r.queue_lags) == len(r.lags) == 300 * 2
    assert r.queue_lags.min() >= 0 and run.queue_lag_max <= run.lag_bound == 1
    assert (r.queue_lags <= r.lags).all()
    assert not live_children()


@pytest.mark.timeout(120)
def test_compare_faults_on_an_update_schedule_gives_every_run_the_same_updates_and_kills(no_orphans):
    result = compare_faults(FAST, seconds=None, n_updates=120, kill_every_s=None, kill_every_updates=50, repeats=1)
    (none,), (faults,) = result.runs["none"], result.runs["faults"]
    assert none.report.updates == faults.report.updates == 120
    assert (none.kills, faults.kills) == (0, 2) and faults.report.restarts == 2
    assert 0 < result.throughput_ratio() < 10 and not live_children()


@pytest.mark.timeout(120)
def test_compare_faults_interleaves_paired_seeds_and_summarises(no_orphans):
    order: list[tuple[str, int]] = []
    base = SystemConfig(**{**FAST.__dict__, "seed": 5})
    result = compare_faults(
        base, seconds=1.5, kill_every_s=0.4, repeats=2, progress=lambda r: order.append((r.arm, r.seed))
    )
    assert order == [("none", 5), ("faults", 5), ("none", 6), ("faults", 6)]
    assert all(r.kills == 0 and r.report.restarts == 0 for r in result.runs["none"])
    assert all(r.kills >= 1 and r.report.restarts >= 1 for r in result.runs["faults"])
    summary = result.summary()
    assert set(summary) == {"none", "faults"}
    assert set(summary["none"]) >= {"frames/s", "updates/s", "restarts", "lost unrolls", "lag max", "final return"}
    assert summary["faults"]["restarts"][0] >= 1 and summary["none"]["frames/s"][0] > 0
    assert 0 < result.throughput_ratio() < 10
    assert all(r.queue_lag_max <= r.lag_bound for runs in result.runs.values() for r in runs)
    assert torch.get_num_threads() >= 1 and not live_children()
