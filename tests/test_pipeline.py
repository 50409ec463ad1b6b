"""Lesson 07's pipeline: the loss and per-token bookkeeping, the three regimes with real
processes, the lag bound under backpressure, and faults (nothing hangs, no orphans)."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from course_lib.lm import CountdownTask, SlotSampler, TinyLM
from course_lib.lm.task import EOS, warm_start
from course_lib.pipeline import system as pipeline_system
from course_lib.pipeline.loss import group_token_advantages, pad_groups, pipeline_loss, token_ess_fraction, token_lags
from course_lib.pipeline.system import (
    LM,
    GroupGenerator,
    PipelineConfig,
    PipelineFault,
    PipelineSystem,
)
from course_lib.rl.importance import truncated_is_loss
from course_lib.rl.staleness import may_start_group
from course_lib.runtime.processes import SharedFlag, live_children
from course_lib.runtime.processes import wait_gone as gone
from course_lib.runtime.weights import SharedWeights, flat_parameters, load_flat_parameters

FAST = PipelineConfig(
    n_slots=8, group_size=2, groups_per_batch=4, n_updates=6, poll_s=0.05, stall_timeout_s=20.0, join_timeout_s=1.0
)


def init_flat() -> torch.Tensor:
    torch.manual_seed(0)
    return flat_parameters(TinyLM(LM))


def warm_flat() -> torch.Tensor:
    """A briefly warm-started model: its answers end, and its log-probs react to weight changes."""
    torch.manual_seed(0)
    model = TinyLM(LM)
    warm_start(model, CountdownTask(), steps=20)
    return flat_parameters(model)


pytestmark = pytest.mark.usefixtures("no_helpers_left_behind")


# -- the loss and the bookkeeping, in one process ------------------------------------------


def test_group_token_advantages_broadcast_each_groups_normalised_reward():
    rewards = np.array([[1.0, 0.0], [1.0, 1.0]])
    mask = torch.tensor([[0, 1, 1], [0, 1, 0], [0, 1, 1], [1, 1, 1]], dtype=torch.bool)
    adv = group_token_advantages(rewards, mask)
    assert torch.allclose(adv[0], torch.tensor([0.0, 1.0, 1.0]), atol=1e-5)
    assert torch.allclose(adv[1], torch.tensor([0.0, -1.0, 0.0]), atol=1e-5)
    assert torch.equal(adv[2:], torch.zeros(2, 3))  # a group with equal rewards carries no signal
    with pytest.raises(ValueError, match="n_groups"):
        group_token_advantages(rewards, mask[:3])


def test_token_lags_count_each_token_and_refuse_future_versions():
    versions = np.array([[-1, 3, 4, 5], [-1, 5, 5, 0]])
    mask = np.array([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=bool)
    assert token_lags(5, versions, mask).tolist() == [[0, 2, 1, 0], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="newer"):
        token_lags(4, versions, mask)


def test_pipeline_loss_is_the_per_token_truncated_is_formula():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, requires_grad=True)
    logp_new = torch.log_softmax(logits, -1)
    logp_mu = logp_new.detach() + torch.randn(3, 5)
    adv = torch.randn(3, 1).expand(3, 5).clone()
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 1, 0, 1, 0]], dtype=torch.bool)
    loss = pipeline_loss(logp_new, logp_mu, adv, mask, c=1.5)
    terms = [
        min(1.5, torch.exp(logp_new[i, t] - logp_mu[i, t]).item()) * adv[i, t] * logp_new[i, t]
        for i in range(3)
        for t in range(5)
        if mask[i, t]
    ]
    assert torch.allclose(loss, -sum(terms) / len(terms), atol=1e-6)
    loss.backward()  # the weights are constants: the gradient is that of sum w A log pi
    w = torch.clamp(torch.exp(logp_new.detach() - logp_mu), max=1.5) * adv * mask
    logits2 = logits.detach().clone().requires_grad_(True)
    (-(w * torch.log_softmax(logits2, -1)).sum() / mask.sum()).backward()
    assert torch.allclose(logits.grad, logits2.grad, atol=1e-6)
    assert token_ess_fraction(np.zeros((2, 3)), np.ones((2, 3), dtype=bool)) == pytest.approx(1.0)


def test_pipeline_loss_equals_the_token_level_truncated_is_loss_and_drops_the_weights_without_correction():
    torch.manual_seed(1)
    logp_new = torch.log_softmax(torch.randn(4, 6), -1).requires_grad_(True)
    logp_mu = logp_new.detach() + torch.randn(4, 6)
    adv = torch.randn(4, 1).expand(4, 6).clone()
    mask = torch.rand(4, 6) < 0.7
    mask[:, 0] = True
    got = pipeline_loss(logp_new, logp_mu, adv, mask, c=2.0)
    assert torch.allclose(got, truncated_is_loss(logp_new, logp_mu, adv, c=2.0, mask=mask, level="token"), atol=1e-6)
    plain = pipeline_loss(logp_new, logp_mu, adv, mask, c=2.0, correct=False)  # no correction: weight 1
    assert torch.allclose(plain, -(adv * logp_new * mask).sum() / mask.sum(), atol=1e-6)
    assert not torch.allclose(plain, got)


def _answer(tokens, logp, versions, reward):
    return {"answer": tokens, "logp": logp, "versions": versions, "reward": reward}


def test_pad_groups_lays_out_answers_group_after_group_right_padded():
    groups = [
        {
            "prompt": [5, 6],
            "answers": [_answer([7, 8, 9], [-0.1, -0.2, -0.3], [0, 0, 1], 1.0), _answer([], [], [], 0.0)],
        },
        {"prompt": [5], "answers": [_answer([4], [-0.5], [2], 0.0), _answer([3, 3], [-1.0, -2.0], [1, 2], 1.0)]},
    ]
    b = pad_groups(groups)
    assert b["tokens"].tolist() == [[5, 6, 7, 8, 9], [5, 6, 0, 0, 0], [5, 4, 0, 0, 0], [5, 3, 3, 0, 0]]  # PAD = 0
    assert b["mask"].int().tolist() == [[0, 0, 1, 1, 1], [0] * 5, [0, 1, 0, 0, 0], [0, 1, 1, 0, 0]]
    assert b["versions"].tolist() == [[0, 0, 0, 0, 1], [0] * 5, [0, 2, 0, 0, 0], [0, 1, 2, 0, 0]]
    want_logp = [[0, 0, -0.1, -0.2, -0.3], [0] * 5, [0, -0.5, 0, 0, 0], [0, -1.0, -2.0, 0, 0]]
    torch.testing.assert_close(b["logp"], torch.tensor(want_logp, dtype=torch.float32))
    assert b["tokens"].dtype == torch.long and b["versions"].dtype == torch.long
    assert b["rewards"].dtype == np.float64 and b["rewards"].tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert pad_groups(groups, pad=-1)["tokens"][1].tolist() == [5, 6, -1, -1, -1]


def test_backpressure_rule_bounds_the_lag_of_every_group():
    assert pipeline_system.may_start_group is may_start_group  # lesson 07 imports it from the system
    """Simulate the rule: a generator that starts every group it may, a trainer consuming
    B groups per update; a group started at version consumed // B is used by update k // B."""
    for bound in (0, 1, 2, 5):
        for groups_per_batch in (1, 3, 4):
            consumed, next_group, worst = 0, 0, 0
            started_at: dict[int, int] = {}
            for _ in range(60):
                while may_start_group(next_group, consumed, bound, groups_per_batch):
                    started_at[next_group] = consumed // groups_per_batch  # the version it pulls
                    next_group += 1
                assert next_group == consumed + (bound + 1) * groups_per_batch  # the window is full, no more
                update = consumed // groups_per_batch
                for k in range(consumed, consumed + groups_per_batch):
                    worst = max(worst, update - started_at[k])
                consumed += groups_per_batch
            assert worst == bound


def test_bad_configurations_are_named() -> None:
    with pytest.raises(ValueError, match="n_slots must equal"):
        PipelineConfig(regime="sync", n_slots=8)
    with pytest.raises(ValueError, match="max_lag >= 1"):
        PipelineConfig(max_lag=0)
    with pytest.raises(ValueError, match="regime must be"):
        PipelineConfig(regime="async")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="snapshot_every must be >= 0"):
        PipelineConfig(snapshot_every=-1)


# -- the generator's loop, in this process ---------------------------------------------------


@pytest.fixture
def one_torch_thread():
    """One torch thread, as in the generator process (``child_setup``); tiny decoding steps
    with more threads only spin against each other on a busy machine."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def generator_here(cfg: PipelineConfig) -> tuple[GroupGenerator, TinyLM, SharedWeights, list]:
    """A :class:`GroupGenerator` on the initial weights, its pipe a list; and the trainer's
    model and the shared weights it publishes to."""
    trainer_model = TinyLM(cfg.lm)
    load_flat_parameters(trainer_model, init_flat())
    weights = SharedWeights(trainer_model)
    sampler = SlotSampler(TinyLM(cfg.lm), cfg.n_slots, EOS, torch.Generator().manual_seed(0))
    sampler.version = weights.pull(sampler.model, -1)
    sent: list = []
    task, rng = CountdownTask(cfg.task), np.random.default_rng(0)
    return (
        GroupGenerator(cfg, weights, sampler, task, rng, SimpleNamespace(send=sent.append)),
        trainer_model,
        weights,
        sent,
    )


def run_until_idle(generator: GroupGenerator, consumed: int, max_steps: int = 10_000) -> None:
    """Start what backpressure allows and decode until every slot is idle (the trainer consumes nothing)."""
    for _ in range(max_steps):
        generator.start_groups(consumed=consumed)
        if generator.sampler.n_active == 0:
            return
        generator.decode_step()
    raise AssertionError(f"the generator was still decoding after {max_steps} steps")


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("regime", ["sync", "one_step", "pipeline"])
def test_the_generator_fills_exactly_the_backpressure_window_and_sends_whole_groups(regime):
    """The trainer consumes nothing: groups 0 .. (bound + 1) B - 1 start, no more, and each
    is sent once, with G verified answers sampled by version 0."""
    cfg = replace(FAST, regime=regime, n_slots=8 if regime != "pipeline" else 6)
    generator, _, _, sent = generator_here(cfg)
    run_until_idle(generator, consumed=0)
    assert generator.next_group == cfg.capacity_groups and not generator.groups
    assert sorted(k for _, k, _, _ in sent) == list(range(cfg.capacity_groups))
    for kind, _, group, timeline in sent:
        assert kind == "group" and group["start_version"] == 0 and len(group["answers"]) == cfg.group_size
        for answer in group["answers"]:
            assert set(answer["versions"]) == {0} and len(answer["logp"]) == len(answer["answer"])
            assert answer["reward"] in (0.0, 1.0)
        assert timeline["swaps"] == []
    assert sum(timeline["steps"] for *_, timeline in sent) > 0


@pytest.mark.usefixtures("one_torch_thread")
def test_an_in_flight_update_reaches_the_live_answers_between_two_decoding_steps():
    cfg = replace(FAST, n_slots=6)  # pipeline
    generator, trainer_model, weights, sent = generator_here(cfg)
    generator.start_groups(consumed=0)
    for _ in range(6):  # 4 prompt tokens, then 3 answer tokens sampled by version 0
        generator.decode_step()
    with torch.no_grad():
        for p in trainer_model.parameters():
            p.add_(0.01)
    weights.publish(trainer_model, 1)
    generator.start_groups(consumed=0)  # the swap, between two decoding steps
    assert generator.sampler.version == 1 and [v for _, v in generator.timeline.swaps] == [1]
    while generator.sampler.n_active:
        generator.decode_step()
    first = {k: group for _, k, group, _ in sent if k < cfg.n_slots // cfg.group_size}  # started before the swap
    assert len(first) == 3 and all(group["start_version"] == 0 for group in first.values())
    answers = [a for group in first.values() for a in group["answers"]]
    assert any(set(a["versions"]) == {0, 1} for a in answers)  # one answer, two policies
    assert all(a["versions"] == sorted(a["versions"]) for a in answers)


# -- the regimes, with real processes -------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("regime", ["sync", "one_step", "pipeline"])
def test_each_regime_trains_within_its_lag_bound_and_leaves_no_process(regime, no_orphans):
    cfg = replace(FAST, regime=regime, n_slots=8 if regime != "pipeline" else 6, snapshot_every=2)
    with PipelineSystem(cfg, init_flat()) as system:
        pid = system.pid
        report = system.train()
    assert len(report.metrics) == cfg.n_updates and report.tokens > 0
    # snapshots: the start, then every 2 updates, in time order, copies (the last one is the final state)
    assert [u for u, _, _ in report.snapshots] == list(range(0, cfg.n_updates + 1, 2))
    times = [t for _, t, _ in report.snapshots]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] <= report.seconds
    start = TinyLM(cfg.lm)
    load_flat_parameters(start, init_flat())
    assert all(torch.equal(report.snapshots[0][2][k], v) for k, v in start.state_dict().items())
    assert all(torch.equal(report.snapshots[-1][2][k], v) for k, v in report.final_state.items())
    assert all(report.snapshots[-1][2][k].data_ptr() != v.data_ptr() for k, v in report.final_state.items())
    assert report.state_at(times[2])[0] == 4 and report.state_at(report.seconds)[0] == cfg.n_updates
    with pytest.raises(ValueError, match="no snapshot at or before"):
        report.state_at(-1.0)
    assert report.token_lags.max() <= cfg.lag_bound
    if regime == "sync":
        assert report.token_lags.max() == 0 and report.series("ess").min() > 0.999
    assert report.busy_fraction("generator") > 0 and report.busy_fraction("trainer") > 0
    assert gone([pid]) and not live_children()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("max_lag", [1, 3])
def test_backpressure_holds_the_max_lag_with_a_slow_trainer(max_lag, no_orphans, monkeypatch):
    """A trainer much slower than the generator: lag piles up to the bound, never past it."""
    cfg = replace(FAST, max_lag=max_lag, n_updates=8)
    original = PipelineSystem._update

    def slow_update(self, *args, **kwargs):
        time.sleep(0.05)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PipelineSystem, "_update", slow_update)
    with PipelineSystem(cfg, init_flat()) as system:
        report = system.train()
    assert 1 <= report.token_lags.max() <= max_lag  # the generator ran ahead, and no further than the bound
    assert not any("bound" in e for e in report.events)


@pytest.mark.timeout(120)
def test_in_flight_updates_give_sequences_mixed_versions(no_orphans):
    cfg = replace(FAST, n_slots=8, group_size=2, groups_per_batch=2, max_lag=3, n_updates=20)
    with PipelineSystem(cfg, init_flat()) as system:
        report = system.train()
    assert len(report.swaps) >= 5 and report.series("lag_max").max() <= 3


@pytest.mark.timeout(180)
def test_a_kept_cache_leaves_a_log_prob_gap_that_recomputing_removes(no_orphans):
    """Lag-0 tokens sampled after an in-flight update: with the kept cache their log mu is not
    what the trainer's weights give on a fresh pass; with the cache rebuilt it is (to rounding).
    Without correction the run trains too, and says so in its arm."""
    cfg = replace(FAST, n_slots=8, group_size=2, groups_per_batch=2, max_lag=1, n_updates=20, lr=3e-3)
    reports, warm = {}, warm_flat()
    for name, extra in {"keep": {}, "recompute": {"recompute_cache": True}, "no_is": {"correction": False}}.items():
        with PipelineSystem(replace(cfg, **extra), warm) as system:
            reports[name] = system.train()
    keep, recompute, no_is = reports["keep"], reports["recompute"], reports["no_is"]
    assert len(keep.swaps) >= 5 and len(recompute.swaps) >= 5
    assert keep.series("fresh_tokens").sum() > 0 and recompute.series("fresh_tokens").sum() > 0
    assert recompute.fresh_gap < 1e-4
    assert keep.fresh_gap > 10 * max(recompute.fresh_gap, 1e-6)
    assert recompute.swap_seconds > 0
    assert (keep.arm, recompute.arm, no_is.arm) == ("pipeline", "pipeline_recompute", "pipeline_no_is")
    assert len(no_is.metrics) == cfg.n_updates and no_is.token_lags.max() <= cfg.max_lag


@pytest.mark.timeout(120)
def test_a_killed_generator_is_reported_and_nothing_hangs(no_orphans):
    cfg = replace(FAST, n_updates=10_000)
    with PipelineSystem(cfg, init_flat()) as system:
        pid = system.pid
        kill = lambda u, m: os.kill(pid, signal.SIGKILL) if u == 2 else None  # noqa: E731
        start = time.monotonic()
        with pytest.raises(PipelineFault, match="killed by SIGKILL"):
            system.train(progress=kill)
        assert time.monotonic() - start < 30
    assert any("died: killed by SIGKILL" in e for e in system.events)
    assert gone([pid]) and not live_children()


@pytest.mark.timeout(120)
def test_a_crashing_generator_ends_the_run_cleanly(no_orphans):
    with PipelineSystem(replace(FAST, crash_after_groups=3, n_updates=100), init_flat()) as system:
        pid = system.pid
        with pytest.raises(PipelineFault, match="injected crash"):
            system.train()
    assert gone([pid]) and not live_children()


@pytest.mark.timeout(120)
def test_a_frozen_generator_times_out_instead_of_hanging(no_orphans):
    cfg = replace(FAST, stall_timeout_s=1.0, join_timeout_s=0.5, n_updates=10_000)
    with PipelineSystem(cfg, init_flat()) as system:
        pid = system.pid
        freeze = lambda u, m: os.kill(pid, signal.SIGSTOP) if u == 1 else None  # noqa: E731
        with pytest.raises(PipelineFault, match="waited 1 s"):
            system.train(progress=freeze)
    assert any("sent terminate" in e or "sent kill" in e for e in system.events)
    assert gone([pid]) and not live_children()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP])
def test_stop_returns_when_the_generator_was_killed_or_frozen_while_polling_the_stop_flag(how, no_orphans):
    """The stop signal used to be an mp.Event, whose lock a generator SIGKILLed (or frozen)
    inside is_set() left held: stop() then blocked forever in set() (a clean-clone CI run hung
    in lesson 10's killed-generator demo). It is a lock-free SharedFlag now (tests/test_shared_flag.py
    shows a killed reader wedging an Event and not the flag)."""
    with PipelineSystem(replace(FAST, join_timeout_s=0.5), init_flat()) as system:
        assert isinstance(system._stop, SharedFlag) and isinstance(system._go, SharedFlag)
        pid = system.pid
        time.sleep(0.3)  # the generator is polling its go and stop flags
        os.kill(pid, how)
        start = time.monotonic()
        system.stop()
        took = time.monotonic() - start
    assert took < 10 and gone([pid]) and not live_children()


@pytest.mark.timeout(120)
def test_an_exception_in_the_with_block_leaves_no_process(no_orphans):
    with pytest.raises(KeyboardInterrupt), PipelineSystem(FAST, init_flat()) as system:
        pid = system.pid
        raise KeyboardInterrupt
    assert gone([pid]) and not live_children()


@pytest.mark.timeout(120)
def test_the_generator_exits_when_the_parent_dies_without_cleaning_up(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
        import os
        import torch
        from course_lib.runtime.weights import flat_parameters
        from course_lib.lm import TinyLM
        from course_lib.pipeline.system import LM, PipelineConfig, PipelineSystem
        if __name__ == "__main__":
            system = PipelineSystem(PipelineConfig(n_slots=8, group_size=2, groups_per_batch=4, n_updates=2),
                                    flat_parameters(TinyLM(LM)))
            system.start()
            system.train()
            print(system.pid, flush=True)
            os._exit(0)  # no stop(), no atexit: as if the kernel were killed
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 1, done.stderr
    assert gone(pids, within=10.0)


# -- the arms of the fair comparison (conventional, colocated, drain-then-swap) ----------------


def test_new_arm_configurations_are_checked_and_named() -> None:
    with pytest.raises(ValueError, match="colocated=True alternates"):
        PipelineConfig(regime="pipeline", colocated=True)
    with pytest.raises(ValueError, match="steps_per_round >= 1"):
        PipelineConfig(regime="conventional", steps_per_round=0)
    with pytest.raises(ValueError, match="gap_probe_every must be >= 0"):
        PipelineConfig(gap_probe_every=-1)
    conventional = PipelineConfig(regime="conventional", colocated=True, steps_per_round=4)
    assert conventional.lag_bound == 3 and conventional.capacity_groups == 4 * conventional.groups_per_batch
    assert conventional.arm == "conventional"
    assert replace(conventional, steps_per_round=1).arm == "colocated_sync"
    assert replace(conventional, colocated=False).arm == "conventional_split"
    assert PipelineConfig(inflight=False).arm == "pipeline_drain"
    assert PipelineConfig(recompute_cache=True).arm == "pipeline_recompute"


def test_the_held_out_split_is_never_drawn_for_training() -> None:
    train, held = CountdownTask(split="train"), CountdownTask(split="held_out")
    rng = np.random.default_rng(0)
    train_problems, held_problems = train.sample(rng, 5000), held.sample(rng, 2000)
    assert not any(train.is_held_out(p) for p in train_problems)
    assert all(held.is_held_out(p) for p in held_problems)
    assert len({(p.n, p.k) for p in held_problems}) <= train.config.max_quotient  # one pair per quotient
    # the same power law over answer lengths in both splits
    q_train = np.array([p.n // p.k for p in train_problems])
    q_held = np.array([p.n // p.k for p in held_problems])
    assert abs(np.mean(q_train == 1) - np.mean(q_held == 1)) < 0.05
    with pytest.raises(ValueError, match="split must be one of"):
        CountdownTask(split="test")


@pytest.mark.usefixtures("one_torch_thread")
def test_recompute_rebuilds_the_live_prefixes_as_a_fresh_pass_would() -> None:
    torch.manual_seed(0)
    model = TinyLM(LM)
    load_flat_parameters(model, warm_flat())
    sampler = SlotSampler(model, 4, EOS, torch.Generator().manual_seed(0))
    task = CountdownTask()
    for slot, problem in enumerate(task.sample(np.random.default_rng(1), 3)):  # slot 3 stays free
        sampler.start(slot, problem.prompt)
    for _ in range(5):
        sampler.step()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02)
    n = sampler.recompute_cache()
    live = torch.nonzero(sampler.active).flatten()
    assert n == int(sampler.pos[live].sum()) > 0
    _, (keys, _) = model.forward_kv(sampler.tokens[live, : int(sampler.pos[live].max())])
    for i, slot in enumerate(live.tolist()):
        t = int(sampler.pos[slot])
        assert torch.allclose(sampler.cache[0][:, slot, :, :t], keys[:, i, :, :t], atol=1e-5)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_conventional_round_uses_one_version_and_waits_for_its_last_batch() -> None:
    cfg = replace(FAST, regime="conventional", steps_per_round=3, n_slots=4)
    generator, trainer_model, weights, sent = generator_here(cfg)
    run_until_idle(generator, consumed=0)
    assert generator.next_group == 3 * cfg.groups_per_batch  # the whole round, with 4 slots refilled
    weights.publish(trainer_model, 1)
    generator.start_groups(consumed=2 * cfg.groups_per_batch)  # two of its three batches consumed: wait
    assert generator.sampler.n_active == 0 and generator.sampler.version == 0
    generator.start_groups(consumed=3 * cfg.groups_per_batch)  # all consumed: the next round, new weights
    assert generator.sampler.n_active > 0 and generator.sampler.version == 1
    assert all(set(a["versions"]) == {0} for _, _, g, _ in sent for a in g["answers"])


@pytest.mark.usefixtures("one_torch_thread")
def test_drain_then_swap_starts_nothing_while_newer_weights_wait() -> None:
    cfg = replace(FAST, n_slots=6, inflight=False)
    generator, trainer_model, weights, sent = generator_here(cfg)
    generator.start_groups(consumed=0)
    for _ in range(5):
        generator.decode_step()
    weights.publish(trainer_model, 1)
    while generator.sampler.n_active:
        generator.start_groups(consumed=cfg.groups_per_batch)
        assert generator.sampler.version == 0  # no swap while answers are live
        generator.decode_step()
    generator.start_groups(consumed=cfg.groups_per_batch)  # drained: swap, then refill
    assert generator.sampler.version == 1 and generator.sampler.n_active > 0
    assert generator.timeline.swaps == []  # not an in-flight update
    while generator.sampler.n_active:
        generator.decode_step()
    assert all(len(set(a["versions"])) == 1 for _, _, g, _ in sent for a in g["answers"])


@pytest.mark.timeout(180)
def test_the_arms_run_within_their_bounds_and_colocated_starts_no_process(no_orphans):
    warm = warm_flat()
    cfg = replace(FAST, n_slots=8, group_size=2, groups_per_batch=2, max_lag=2, n_updates=12)
    arms = {
        "colocated_sync": dict(regime="conventional", colocated=True, steps_per_round=1),
        "conventional": dict(regime="conventional", colocated=True, steps_per_round=3),
        "pipeline_drain": dict(inflight=False),
        "pipeline": dict(gap_probe_every=1),
        "pipeline_recompute": dict(recompute_cache=True, gap_probe_every=1),
    }
    threads = torch.get_num_threads()
    reports = {}
    for name, extra in arms.items():
        with PipelineSystem(replace(cfg, **extra), warm) as system:
            reports[name] = system.train()
            if name.startswith(("colocated", "conventional")):
                assert system.process is None and not live_children()
        assert torch.get_num_threads() == threads
        assert reports[name].arm == name and len(reports[name].metrics) == cfg.n_updates
        assert reports[name].token_lags.max() <= reports[name].lag_bound
    assert reports["colocated_sync"].token_lags.max() == 0
    conventional = reports["conventional"]
    assert set(conventional.series("lag_max")) <= {0, 1, 2} and conventional.series("lag_max").max() == 2
    assert conventional.answers_per_second > 0 and conventional.answer_tokens >= 1
    assert reports["pipeline_drain"].swaps == []
    keep, rebuilt = reports["pipeline"], reports["pipeline_recompute"]
    assert keep.gap[1] > 0 and rebuilt.gap[1] > 0  # answers that saw a swap were probed
    assert rebuilt.generator_gap < 1e-4 < keep.generator_gap
    assert rebuilt.recomputed_tokens > 0 and keep.recomputed_tokens == 0


def test_the_experiment_judges_differences_over_seeds_and_names_a_missing_record(tmp_path) -> None:
    from course_lib.pipeline import experiment

    assert experiment.separated([0.05, 0.06, 0.04, 0.05, 0.055]) == "a > b"
    assert experiment.separated([-0.05, -0.06, -0.04]) == "a < b"
    assert experiment.separated([0.05, -0.04, 0.01, -0.02]) == "not separated"
    m, se = experiment.mean_se([1.0, 2.0, 3.0])
    assert m == 2.0 and abs(se - 1 / np.sqrt(3)) < 1e-12
    with pytest.raises(FileNotFoundError, match=r"python -m course_lib\.pipeline\.experiment"):
        experiment.load(tmp_path / "none.json")
    assert experiment.load()["meta"]["seeds"] == list(range(len(experiment.load()["meta"]["seeds"])))


@pytest.mark.usefixtures("one_torch_thread")
def test_two_engines_split_each_conventional_round_between_them() -> None:
    cfg = replace(FAST, regime="conventional", steps_per_round=2, n_slots=4, n_generators=2)
    engines = []
    for index in range(2):
        generator, _, weights, sent = generator_here(replace(cfg, n_slots=4))
        engines.append(
            (
                GroupGenerator(
                    cfg,
                    weights,
                    generator.sampler,
                    generator.task,
                    generator.rng,
                    generator.conn,
                    offset=index,
                    stride=2,
                ),
                sent,
            )
        )
    for generator, _ in engines:
        for _ in range(10_000):
            generator.start_groups(consumed=0)
            if generator.sampler.n_active == 0:
                break
            generator.decode_step()
    kb = 2 * cfg.groups_per_batch
    started = [sorted(k for _, k, _, _ in sent) for _, sent in engines]
    assert started == [list(range(0, kb, 2)), list(range(1, kb, 2))]  # the round, split between the engines
    generator, sent = engines[0]
    generator.start_groups(consumed=kb - 1)  # the round not consumed yet: nothing starts
    assert generator.sampler.n_active == 0
    generator.start_groups(consumed=kb)  # consumed: the next round's even groups
    assert generator.sampler.n_active > 0 and sorted(generator.groups) == [kb, kb + 2]


def test_engine_configurations_are_checked() -> None:
    with pytest.raises(ValueError, match="n_generators > 1 is conventional RL"):
        PipelineConfig(regime="pipeline", n_generators=2)
    with pytest.raises(ValueError, match="divide n_slots"):
        PipelineConfig(regime="conventional", n_generators=3, n_slots=32)
    assert PipelineConfig(regime="conventional", n_generators=2).arm == "conventional_engines"
    with pytest.raises(ValueError, match="dp_trainers must be >= 1 and, above 1, at most n_generators"):
        PipelineConfig(regime="conventional", dp_trainers=2)
    with pytest.raises(ValueError, match="dp_trainers must be >= 1"):
        PipelineConfig(regime="conventional", n_generators=2, dp_trainers=0)
    dp = PipelineConfig(regime="conventional", n_generators=2, dp_trainers=2)
    assert (dp.arm, replace(dp, steps_per_round=1).arm) == ("conventional_dp", "sync_dp")


@pytest.mark.usefixtures("one_torch_thread")
def test_the_shares_gradients_sum_to_the_whole_batchs() -> None:
    torch.manual_seed(0)
    model = TinyLM(LM)
    g, t = 16, 12
    mask = torch.zeros(g, t, dtype=torch.bool)
    for i, n in enumerate(torch.randint(2, 9, (g,)).tolist()):
        mask[i, 3 : 3 + n] = True  # ragged answers after a 3-token prompt
    part = {
        "tokens": torch.randint(4, LM.vocab, (g, t)),
        "logp": -torch.rand(g, t) - 1.0,
        "adv": torch.randn(g, t),
        "mask": mask,
        "fresh": mask & (torch.rand(g, t) < 0.5),
    }
    n_real = float(mask.sum())

    def grads(rows_list):
        model.zero_grad()
        losses = [
            pipeline_system.batch_share_loss(model, {k: v[rows] for k, v in part.items()}, n_real, FAST)[0]
            for rows in rows_list
        ]
        return torch.cat([p.grad.flatten() for p in model.parameters()]), sum(losses)

    whole, loss = grads([torch.arange(g)])
    halves, loss_halves = grads([torch.arange(0, g, 2), torch.arange(1, g, 2)])
    torch.testing.assert_close(halves, whole, rtol=1e-4, atol=1e-6)
    assert abs(loss_halves - loss) < 1e-5 and whole.abs().sum() > 0
    one_half, _ = grads([torch.arange(0, g, 2)])
    assert (one_half - whole).abs().max() > 1e-4  # half the batch alone is not the batch's gradient
    shares = pipeline_system.balanced_shares(mask, 4, 2)  # 4 chunks, longest first: ranks 0, 1, 1, 0
    assert sorted(torch.cat(shares).tolist()) == list(range(g)) and [len(x) for x in shares] == [8, 8]
    ends = mask.sum(1) + 3
    longest = set(torch.argsort(ends, stable=True)[-4:].tolist())
    assert longest <= set(shares[0].tolist())  # the long tail's chunk, with the shortest chunk
    again, _ = grads(shares)
    torch.testing.assert_close(again, whole, rtol=1e-4, atol=1e-6)
    assert [len(x) for x in pipeline_system.balanced_shares(mask[:4], 4, 2)] == [4, 0]  # one chunk: rank 1 idles
    model.zero_grad()
    assert pipeline_system.batch_share_loss(model, {k: v[:0] for k, v in part.items()}, n_real, FAST)[0] == 0.0


@pytest.mark.timeout(120)
def test_the_data_parallel_trainer_takes_the_steps_one_trainer_takes(no_orphans):
    cfg = replace(FAST, regime="conventional", steps_per_round=3, n_slots=8, n_generators=2, n_updates=3, train_chunk=2)
    reports = {}
    for ranks in (1, 2):
        with PipelineSystem(replace(cfg, dp_trainers=ranks), warm_flat()) as system:
            pids = [p.pid for p in system.processes]
            reports[ranks] = system.train()
        assert len(pids) == 1 + ranks and gone(pids) and not live_children()  # two engines, ranks - 1 helpers
    one, dp = reports[1], reports[2]
    assert dp.arm == "conventional_dp" and len(dp.metrics) == 3
    # one round, sampled by version 0 in both runs: the same answers, so the same three steps
    np.testing.assert_allclose(dp.series("loss"), one.series("loss"), rtol=1e-4, atol=1e-6)
    for k, v in one.final_state.items():  # Adam turns rounding in near-zero gradients into ~1e-5;
        torch.testing.assert_close(dp.final_state[k], v, rtol=1e-3, atol=2e-4)  # a lost share moves ~lr = 1e-3
    assert dp.series("ess").min() > 0 and dp.series("tokens").sum() == one.series("tokens").sum()


@pytest.mark.timeout(120)
def test_a_killed_trainer_rank_is_reported_and_nothing_hangs(no_orphans):
    cfg = replace(FAST, regime="conventional", steps_per_round=2, n_slots=8, n_generators=2, dp_trainers=2)
    with PipelineSystem(replace(cfg, n_updates=10_000), warm_flat()) as system:
        rank = system.processes[-1]
        pids = [p.pid for p in system.processes]
        kill = lambda u, m: os.kill(rank.pid, signal.SIGKILL) if u == 2 else None  # noqa: E731
        start = time.monotonic()
        with pytest.raises(PipelineFault, match=r"trainer rank .* killed by SIGKILL"):
            system.train(progress=kill)
        assert time.monotonic() - start < 30
    assert gone(pids) and not live_children()


@pytest.mark.timeout(120)
def test_conventional_with_an_engine_per_core_trains_within_its_bound(no_orphans):
    cfg = replace(FAST, regime="conventional", steps_per_round=3, n_slots=8, n_generators=2, n_updates=9)
    with PipelineSystem(cfg, warm_flat()) as system:
        pids = [p.pid for p in system.processes]
        report = system.train()
    assert len(pids) == 2 and len(report.metrics) == cfg.n_updates
    assert report.series("lag_max").max() == 2 and report.token_lags.max() <= cfg.lag_bound
    assert 0 < report.busy_fraction("generator") <= 1 and report.arm == "conventional_engines"
    assert gone(pids) and not live_children()
