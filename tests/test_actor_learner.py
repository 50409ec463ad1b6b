"""The actor-learner system of lesson 03: its pieces in one process, then real processes:
IMPALA and SEED layouts learn, report timings and lags; a killed or crashing actor is
detected and restarted (or the system shuts down cleanly); the learner never hangs; no
child process survives a stop, an exception, or the death of the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from course_lib.actor_learner.actor import EpisodeTracker, unroll
from course_lib.actor_learner.buffers import RolloutBuffers
from course_lib.actor_learner.envs import SameStepCartPoleVectorEnv, make_envs
from course_lib.actor_learner.heartbeats import UNROLLS, SupervisorConfig
from course_lib.actor_learner.learner import Learner, LossConfig, loss_terms, rollout_lag
from course_lib.actor_learner.model import ActorCritic
from course_lib.actor_learner.system import ActorLearnerSystem, SystemConfig, SystemFault, compare_layouts
from course_lib.actor_learner.timers import Timings, timing_table
from course_lib.pipeline.lag import Arm, LagConfig, run_lag_ablation
from course_lib.runtime.processes import exit_reason, live_children
from course_lib.runtime.processes import wait_gone as gone
from course_lib.runtime.weights import SharedWeights, flat_parameters, load_flat_parameters

# small and quick: every system test finishes in seconds
FAST = SystemConfig(
    n_actors=2, envs_per_actor=4, unroll=8, batch_size=2, poll_s=0.05, stall_timeout_s=20.0, join_timeout_s=2.0
)


pytestmark = pytest.mark.usefixtures("no_helpers_left_behind")


# ---------------------------------------------------------------------------------------
# Pieces, in one process
# ---------------------------------------------------------------------------------------


def test_same_step_cartpole_has_gymnasium_dynamics_and_resets_in_the_same_step():
    ours = SameStepCartPoleVectorEnv(num_envs=1)
    ref = gym.make("CartPole-v1").unwrapped
    obs, _ = ours.reset(seed=3)
    ref.reset(seed=0)
    ref.state = ours.state[:, 0].copy()  # the same float64 state
    rng = np.random.default_rng(0)
    for step in range(200):
        a = int(rng.integers(2))
        ref_obs, ref_r, ref_term, _, _ = ref.step(a)
        obs, r, term, trunc, info = ours.step(np.array([a]))
        assert r[0] == ref_r and bool(term[0]) == ref_term and not trunc[0]
        if ref_term:
            np.testing.assert_allclose(info["final_obs"][0], ref_obs, rtol=1e-6)
            assert np.abs(obs[0]).max() <= 0.05  # already the next episode's first observation
            ref.reset(seed=step)
            ref.state = ours.state[:, 0].copy()
        else:
            np.testing.assert_allclose(obs[0], ref_obs, rtol=1e-6, atol=1e-7)


def test_same_step_cartpole_truncates_at_500_steps():
    env = SameStepCartPoleVectorEnv(num_envs=1)
    env.reset(seed=0)
    for _ in range(499):
        env.state[:] = 0.0  # hold the pole upright
        _, _, term, trunc, _ = env.step(np.array([0]))
        assert not (term[0] or trunc[0])
    env.state[:] = 0.0
    _, _, term, trunc, _ = env.step(np.array([0]))
    assert trunc[0] and not term[0] and env.steps[0] == 0


def test_buffer_slots_are_views_of_shared_memory_and_batches_are_copies():
    buffers = RolloutBuffers.allocate(unroll=3, n_envs=2, obs_dim=4, n_slots=3)
    assert all(t.is_shared() for t in buffers.tensors.values())
    slot = buffers.slot(1)
    slot["rewards"][2, 1] = 5.0
    assert buffers.tensors["rewards"][1, 2, 1] == 5.0
    batch = buffers.batch([1, 0])
    assert batch["obs"].shape == (4, 4, 4) and batch["actions"].shape == (3, 4)
    assert batch["rewards"][2, 1] == 5.0 and batch["rewards"][2, 3] == 0.0
    batch["rewards"][2, 1] = -1.0
    assert buffers.tensors["rewards"][1, 2, 1] == 5.0
    assert buffers.nbytes_per_slot == 4 * 2 * 4 * 4 + 3 * 2 * (8 + 4 + 4 + 1 + 8)


def test_shared_weights_publish_and_pull_by_version():
    torch.manual_seed(0)
    learner_net, actor_net = ActorCritic(4, 2, 8), ActorCritic(4, 2, 8)
    weights = SharedWeights(learner_net)
    assert weights.version == 0 and weights.nbytes == flat_parameters(learner_net).numel() * 4
    assert actor_net is not learner_net and weights.pull(actor_net, -1) == 0
    torch.testing.assert_close(flat_parameters(actor_net), flat_parameters(learner_net))
    with torch.no_grad():
        for p in learner_net.parameters():
            p.add_(1.0)
    assert weights.pull(actor_net, 0) == 0  # nothing new published yet
    weights.publish(learner_net, 1)
    assert weights.version == 1 and weights.pull(actor_net, 0) == 1
    torch.testing.assert_close(flat_parameters(actor_net), flat_parameters(learner_net))
    with pytest.raises(ValueError, match="numbers"):
        load_flat_parameters(actor_net, torch.zeros(3))


def test_unroll_fills_a_slot_consistently():
    torch.manual_seed(0)
    envs = make_envs("CartPole-v1", 3)
    obs, _ = envs.reset(seed=0)
    net = ActorCritic(4, 2, 8)
    buffers = RolloutBuffers.allocate(unroll=30, n_envs=3, obs_dim=4, n_slots=1)
    slot = buffers.slot(0)
    timings = Timings(("inference", "env step"))
    last = unroll(envs, net, obs, slot, version=5, generator=torch.Generator().manual_seed(0), timings=timings)
    np.testing.assert_allclose(slot["obs"][0].numpy(), obs)
    np.testing.assert_allclose(slot["obs"][30].numpy(), last)
    assert (slot["versions"] == 5).all() and slot["rewards"].sum() == 90 and slot["dones"].any()
    with torch.no_grad():
        logp = torch.log_softmax(net(slot["obs"][:30])[0], -1).gather(-1, slot["actions"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(slot["behaviour_logp"], logp)
    assert all(v > 0 for v in timings.as_dict().values())
    tracker = EpisodeTracker(3)
    finished = tracker.update(slot["rewards"].numpy(), slot["dones"].numpy())
    assert len(finished) == int(slot["dones"].sum()) and all(f >= 1 for f in finished)


def test_rollout_lag_counts_from_the_oldest_step():
    np.testing.assert_array_equal(rollout_lag(12, np.array([[10, 7, 11], [10, 7, 12]])), [2, 5, 1])
    np.testing.assert_array_equal(rollout_lag(3, torch.full((4, 2), 3)), [0, 0])
    with pytest.raises(ValueError, match="newer"):
        rollout_lag(2, np.array([[3]]))


def test_loss_terms_on_policy_data_need_no_correction():
    torch.manual_seed(0)
    net = ActorCritic(4, 2, 8)
    n_t, n = 6, 5
    obs = torch.randn(n_t + 1, n, 4)
    logits, values = net(obs)
    actions = torch.randint(0, 2, (n_t, n))
    logp = torch.log_softmax(logits[:n_t], -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1).detach()
    rewards = np.ones((n_t, n))
    dones = np.zeros((n_t, n), dtype=bool)
    dones[2, 1] = True
    cfg = LossConfig()
    vt = loss_terms(logits, values, actions, logp, rewards, dones, cfg, correct=True)
    nc = loss_terms(logits, values, actions, logp, rewards, dones, cfg, correct=False)
    torch.testing.assert_close(vt.pg, nc.pg)
    torch.testing.assert_close(vt.baseline, nc.baseline)
    stale = logp - 0.3 * torch.randn(n_t, n)  # a behaviour policy that differs
    vt_stale = loss_terms(logits, values, actions, stale, rewards, dones, cfg, correct=True)
    mixed = loss_terms(
        logits, values, actions, stale, rewards, dones, cfg, correct=torch.tensor([True, False, True, False, True])
    )
    assert not torch.allclose(vt_stale.pg, nc.pg)
    torch.testing.assert_close(mixed.pg[:, 0], vt_stale.pg[:, 0])
    torch.testing.assert_close(mixed.pg[:, 1], nc.pg[:, 1])
    loss = vt_stale.total(cfg)
    loss.backward()
    assert all(p.grad is not None for p in net.parameters())
    with pytest.raises(ValueError, match="T \\+ 1"):
        loss_terms(logits[:n_t], values[:n_t], actions, logp, rewards, dones, cfg)


def test_learner_update_bumps_the_version():
    torch.manual_seed(0)
    buffers = RolloutBuffers.allocate(unroll=4, n_envs=2, obs_dim=4, n_slots=2)
    buffers.tensors["obs"].normal_()
    learner = Learner(ActorCritic(4, 2, 8), lr=1e-2, cfg=LossConfig())
    before = flat_parameters(learner.model)
    metrics = learner.update(buffers.batch([0, 1]))
    assert learner.version == 1 and not torch.equal(before, flat_parameters(learner.model))
    assert set(metrics) >= {"loss", "entropy", "grad_norm", "mean_rho"} and np.isfinite(metrics["loss"])


def test_timings_accumulate_into_a_shared_row():
    row = np.zeros(4)
    timings = Timings(("a", "b"), shared=row)
    with timings.phase("a"):
        time.sleep(0.01)
    timings.add("b", 0.5)
    assert row[0] >= 0.01 and row[1] == 0.5 and row[2] == 0.0
    assert "a" in timing_table({"p": timings.as_dict()}, 1.0)
    with pytest.raises(ValueError):
        Timings(("a", "b", "c"), shared=np.zeros(2))


def test_exit_reasons_are_named():
    assert exit_reason(-9) == "killed by SIGKILL"
    assert exit_reason(17) == "exit code 17 (injected crash)"
    assert exit_reason(None) == "still running"


# ---------------------------------------------------------------------------------------
# Real processes
# ---------------------------------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["impala", "seed"])
def test_system_learns_reports_and_leaves_no_process(layout, no_orphans):
    cfg = SystemConfig(**{**FAST.__dict__, "layout": layout})
    with ActorLearnerSystem(cfg) as system:
        pids = system.pids()
        assert len(pids) == (2 if layout == "impala" else 3)
        assert {p.pid for p in live_children()} >= set(pids)
        report = system.train(n_updates=30)
    assert gone(pids) and not live_children()
    assert report.updates == 30 and report.frames == 29 * 2 * 4 * 8 and report.frames_per_second > 0
    assert len(report.lags) == 30 * 2 and report.lags.min() >= 0 and report.lags.max() <= 30
    assert report.returns and all(r >= 1 for r in report.returns)
    processes = {"actor 0", "actor 1", "learner"} | ({"inference server"} if layout == "seed" else set())
    assert set(report.timings) == processes
    assert all(v >= 0 for phases in report.timings.values() for v in phases.values())
    assert report.timings["learner"]["learn"] > 0
    assert not any("died" in e for e in report.events) and system.events[-1].startswith("stop: all")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["impala", "seed"])
def test_no_slot_is_lost_between_train_calls_and_every_actor_keeps_delivering(layout, no_orphans):
    """Slots received beyond a call's last batch used to be dropped when train() returned:
    after a few short calls one actor held no slot, sent nothing, and a restarted actor's
    first unroll was never learned from (a flaky frozen-actor test found it)."""
    cfg = SystemConfig(**{**FAST.__dict__, "layout": layout})
    with ActorLearnerSystem(cfg) as system:
        for _ in range(12):
            system.train(n_updates=3)
            held = system.held_slots()
            assert sum(held.values()) == cfg.n_slots, held
        before = system.heartbeats.table[:, UNROLLS].tolist()  # unrolls each actor has written
        system.train(n_updates=20)
        after = system.heartbeats.table[:, UNROLLS].tolist()
    assert all(a > b for a, b in zip(after, before)), (before, after)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["impala", "seed"])
def test_a_killed_actor_is_detected_and_restarted(layout, no_orphans):
    cfg = SystemConfig(**{**FAST.__dict__, "layout": layout})
    with ActorLearnerSystem(cfg) as system:
        system.train(n_updates=5)
        killed = system.kill_actor(1)
        report = system.train(n_updates=40)
        replacement = system.actors[1].process.pid
        assert replacement != killed and system.restarts == 1
        pids = system.pids()
    assert report.updates == 40
    assert any(
        f"actor 1 (pid {killed}) died: killed by SIGKILL; restarted as pid {replacement}" == e for e in report.events
    ), report.events
    assert gone(pids + [killed]) and not live_children()


@pytest.mark.timeout(120)
def test_an_actor_that_keeps_crashing_ends_in_a_clean_shutdown(no_orphans):
    cfg = SystemConfig(**{**FAST.__dict__, "crash_after": 2, "max_restarts": 0})
    system = ActorLearnerSystem(cfg)
    system.start()
    pids = system.pids()
    start = time.monotonic()
    with pytest.raises(SystemFault, match="gave up after 0 restarts"):
        system.train(n_updates=1000)
    assert time.monotonic() - start < 30
    assert any("exit code 17 (injected crash)" in e for e in system.events)
    assert gone(pids) and not live_children()


@pytest.mark.timeout(120)
def test_crashing_actors_are_restarted_until_the_budget_runs_out(no_orphans):
    cfg = SystemConfig(**{**FAST.__dict__, "crash_after": 3, "max_restarts": 5})
    with ActorLearnerSystem(cfg) as system:
        report = system.train(n_updates=40)  # both first actors crash; their restarts do not
    assert system.restarts == 2 and report.updates == 40
    assert sum("injected crash" in e for e in report.events) == 2


@pytest.mark.timeout(120)
def test_the_learner_never_hangs_when_actors_freeze(no_orphans):
    """With heartbeats off, frozen actors are caught only by the stall timeout: a clean
    shutdown. (With heartbeats on, the default, they are killed and restarted and training
    goes on: tests/test_actor_faults.py.)"""
    cfg = SystemConfig(**{**FAST.__dict__, "stall_timeout_s": 1.5, "join_timeout_s": 0.5})
    system = ActorLearnerSystem(cfg, SupervisorConfig(heartbeat_timeout_s=None))
    system.start()
    system.train(n_updates=2)
    pids = system.pids()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)  # alive, but producing nothing
    start = time.monotonic()
    with pytest.raises(SystemFault, match="no rollout arrived"):
        system.train(n_updates=100)
    assert time.monotonic() - start < 10
    assert any("sent kill" in e for e in system.events)  # frozen processes ignore the stop event and SIGTERM
    assert gone(pids) and not live_children()


@pytest.mark.timeout(120)
def test_a_dead_inference_server_ends_in_a_clean_shutdown(no_orphans):
    cfg = SystemConfig(**{**FAST.__dict__, "layout": "seed"})
    system = ActorLearnerSystem(cfg)
    system.start()
    system.train(n_updates=2)
    pids = system.pids()
    os.kill(system.server.process.pid, signal.SIGKILL)
    with pytest.raises(SystemFault, match="inference server died"):
        system.train(n_updates=100)
    assert gone(pids) and not live_children()


@pytest.mark.timeout(120)
def test_an_exception_in_the_with_block_leaves_no_process(no_orphans):
    with pytest.raises(KeyError), ActorLearnerSystem(FAST) as system:
        pids = system.pids()
        system.train(n_updates=1)
        raise KeyError("the notebook cell failed")
    assert gone(pids) and not live_children()


@pytest.mark.timeout(120)
def test_children_exit_when_the_parent_dies_without_cleaning_up(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys
        from course_lib.actor_learner.system import ActorLearnerSystem, SystemConfig
        if __name__ == "__main__":
            system = ActorLearnerSystem(SystemConfig(n_actors=2, envs_per_actor=2, unroll=4))
            system.start()
            system.train(n_updates=2)
            print(" ".join(map(str, system.pids())), flush=True)
            os._exit(0)  # no stop(), no atexit: as if the kernel were killed
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2, done.stderr
    assert gone(pids, within=10.0)


def test_lag_ablation_acts_with_exactly_k_updates_old_weights() -> None:
    """k = 0 acts with the learner's own weights (divergence 0); k = 2 acts with version 0 for
    updates 0..2 (divergence 0 at update 0 only); the run is reproducible."""
    arms = [Arm("v-trace", 0), Arm("no correction", 2), Arm("v-trace", 2)]
    config = LagConfig(n_envs=4, unroll=4, n_updates=6, hidden=8)
    result = run_lag_ablation(arms, [0, 1], config)
    assert result.returns.shape == result.entropy.shape == result.divergence.shape == (3, 2, 6)
    assert result.frames == 16
    np.testing.assert_allclose(result.divergence[0], 0.0, atol=1e-6)
    np.testing.assert_allclose(result.divergence[1:, :, 0], 0.0, atol=1e-6)
    assert (result.divergence[1:, :, 1:] > 1e-6).all()
    again = run_lag_ablation(arms, [0, 1], config)
    np.testing.assert_array_equal(np.nan_to_num(again.returns), np.nan_to_num(result.returns))
    np.testing.assert_array_equal(again.entropy, result.entropy)


def test_compare_layouts_interleaves_and_counts_cpu() -> None:
    order: list[int] = []
    base = SystemConfig(n_actors=1, envs_per_actor=2, unroll=4, batch_size=1)
    runs = compare_layouts(base, (16,), repeats=2, seconds=0.5, progress=lambda: order.append(len(order)))
    assert list(runs) == [("impala", 16), ("seed", 16)] and len(order) == 4
    for rs in runs.values():
        assert len(rs) == 2
        for r in rs:
            assert r.report.frames > 0 and r.cpu_seconds > 0 and r.cpu_ms_per_1k_frames > 0
    assert not live_children()
