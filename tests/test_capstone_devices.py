"""The capstone's device- and layout-choice branches, with the device counts faked.

This machine has no GPU, so every branch that depends on how many GPUs, ranks or hosts a
run has is tested here with those counts passed in: the backend, the share of a compute
unit the layout model gives a rank (1, 4 and 8 GPUs, colocated or not, 1 or 2 hosts), the
trainer count the layout may choose (capped at what a batch can feed), the routing of
groups to trainers, and the trainer's and sampler's code run with an explicit device. The
tests marked ``cuda`` run the same code on a GPU where there is one (the lent GPU machine:
BENCHMARKS.md, "Full scale on a GPU").
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.distributed as dist

from course_lib.capstone.config import SLOT_CHOICES, CapstoneConfig
from course_lib.capstone.job import SetupError, rank_device, resolve_backend
from course_lib.capstone.ledger import SampleLedger, answers_digest
from course_lib.capstone.plan import (
    Rates,
    answer_rate,
    calibrate,
    choose_layout,
    rank_share,
    spec_for,
    trainer_capacity,
    trainer_choices,
)
from course_lib.capstone.roles import assign_roles
from course_lib.capstone.trainer import Trainer, TrainerState, heldout_reward
from course_lib.lm.model import LMConfig, TinyLM
from course_lib.lm.sampler import SlotSampler, generator_for, sample_problems
from course_lib.lm.task import EOS, CountdownTask

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the lent GPU machine)")


def _rates(device="cpu", units=2, local_ranks=4, colocated=False, step_s=1e-3, c=1e5, answers=(8,) * 32):
    share = rank_share(device, units, local_ranks, colocated)
    return Rates(
        decode_step_s={16: step_s, 32: 1.2 * step_s, 64: 1.5 * step_s},
        train_steps_per_s=c,
        answer_tokens=tuple(answers),
        cpu_share=share,
        seconds=1.0,
        device=device,
        units=units,
        local_ranks=local_ranks,
        colocated=colocated,
    )


# ---- the backend and the device of a rank ------------------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "colocated", "ranks", "gpus", "expected"),
    [
        ("auto", False, 4, 0, ("gloo", "cpu")),
        ("auto", False, 4, 1, ("gloo", "cpu")),  # fewer GPUs than ranks and not colocated: CPUs
        ("auto", False, 4, 4, ("nccl", "cuda")),
        ("auto", False, 8, 8, ("nccl", "cuda")),
        ("auto", False, 4, 8, ("nccl", "cuda")),  # 4 ranks of a 2-node run on an 8-GPU host
        ("auto", True, 4, 1, ("gloo", "cuda")),
        ("auto", True, 4, 4, ("gloo", "cuda")),
        ("auto", True, 8, 8, ("gloo", "cuda")),
        ("gloo", False, 4, 8, ("gloo", "cpu")),
        ("nccl", False, 8, 8, ("nccl", "cuda")),
    ],
)
def test_backend_for_1_4_and_8_gpus(backend, colocated, ranks, gpus, expected):
    assert resolve_backend(backend, colocated, ranks, gpus) == expected


@pytest.mark.parametrize(
    ("device_type", "colocated", "local_rank", "gpus", "expected"),
    [
        ("cpu", False, 3, 0, "cpu"),
        ("cuda", True, 3, 1, "cuda:0"),  # colocated: every rank on GPU 0
        ("cuda", True, 7, 8, "cuda:0"),
        ("cuda", False, 3, 4, "cuda:3"),  # one GPU per rank, by its rank on the host (not its global rank)
        ("cuda", False, 7, 8, "cuda:7"),
    ],
)
def test_each_rank_gets_its_device(device_type, colocated, local_rank, gpus, expected):
    assert rank_device(device_type, colocated, local_rank, gpus) == torch.device(expected)


def test_a_rank_without_a_gpu_of_its_own_is_refused():
    with pytest.raises(SetupError, match="local rank 4 has no GPU of its own"):
        rank_device("cuda", False, 4, 4)


@pytest.mark.parametrize(("ranks", "gpus"), [(4, 1), (8, 4)])
def test_nccl_with_fewer_gpus_than_ranks_says_what_to_do(ranks, gpus):
    with pytest.raises(SetupError, match=f"{ranks} ranks on this host, {gpus} GPU"):
        resolve_backend("nccl", False, ranks, gpus)


# ---- the share of a compute unit (the layout model's rates) -------------------------------------------


@pytest.mark.parametrize(
    ("device", "units", "busy", "colocated", "share"),
    [
        ("cpu", 2, 4, False, 0.5),  # this laptop: 4 ranks on 2 cores
        ("cpu", 16, 4, False, 1.0),
        ("cpu", 2, 2, False, 1.0),  # synchronous RL: half the ranks busy at a time
        ("cuda", 1, 4, True, 0.25),  # colocated: 4 ranks on GPU 0
        ("cuda", 8, 4, True, 0.25),  # colocated on an 8-GPU box: still GPU 0 alone (not 8 / 4)
        ("cuda", 8, 8, True, 0.125),
        ("cuda", 4, 4, False, 1.0),  # NCCL: a GPU per rank
        ("cuda", 8, 8, False, 1.0),
    ],
)
def test_rank_share_per_device_and_placement(device, units, busy, colocated, share):
    assert rank_share(device, units, busy, colocated) == pytest.approx(share)


def test_rank_share_refuses_an_empty_host():
    with pytest.raises(ValueError, match="at least one compute unit"):
        rank_share("cpu", 0, 4, False)


def test_two_hosts_share_their_own_cores_not_the_world_s():
    """4 ranks per host on 2 hosts of 2 cores: each rank gets half a core (its host's), not a quarter."""
    cfg = CapstoneConfig(run_dir="x")
    two_hosts = _rates(units=2, local_ranks=4)
    spec = spec_for(two_hosts, cfg, 8, 2, 16)
    assert two_hosts.cpu_share == 0.5
    assert spec.a_s == pytest.approx(1e-3 / 0.5) and spec.n_gpus == 8 and spec.n_samplers == 6
    assert spec.train_tokens_per_s_per_gpu == pytest.approx(1e5 * 0.5)


def test_synchronous_rl_gives_each_side_the_cores_the_other_leaves():
    cfg = CapstoneConfig(run_dir="x")
    rates = _rates(units=2, local_ranks=4)
    pipe, sync = spec_for(rates, cfg, 4, 2, 16), spec_for(rates, cfg, 4, 2, 16, max_lag=0)
    assert pipe.a_s == pytest.approx(2e-3) and sync.a_s == pytest.approx(1e-3)  # 2 generators on 2 cores
    assert sync.train_tokens_per_s_per_gpu == pytest.approx(2 * pipe.train_tokens_per_s_per_gpu)
    assert pipe.admission == "wait" and sync.admission == "fifo" and sync.max_lag == 0
    gpu = _rates("cuda", units=1, local_ranks=4, colocated=True)
    assert spec_for(gpu, cfg, 4, 3, 16, max_lag=0).a_s == pytest.approx(1e-3)  # 1 generator alone on the GPU
    assert spec_for(gpu, cfg, 4, 3, 16).a_s == pytest.approx(4e-3)


def test_a_measured_weight_send_slows_a_trainer_bound_prediction_and_a_negative_one_is_refused():
    """``weight_sync_s`` is lesson 08's d: trainer 0 sends in series, so a trainer-bound layout
    consumes less; the plan itself uses 0 (nothing to time before the run)."""
    cfg = CapstoneConfig(run_dir="x")
    rates = _rates("cuda", units=8, local_ranks=8, step_s=1e-4, c=2e3)  # trainer-bound
    assert spec_for(rates, cfg, 8, 2, 16).weight_sync_s == 0.0
    assert spec_for(rates, cfg, 8, 2, 16, weight_sync_s=0.01).weight_sync_s == 0.01
    free, sent = answer_rate(rates, cfg, 8, 2, 16), answer_rate(rates, cfg, 8, 2, 16, weight_sync_s=0.05)
    assert sent.step_s > free.step_s and sent.tokens_per_s < free.tokens_per_s
    with pytest.raises(ValueError, match="weight_sync_s"):
        spec_for(rates, cfg, 8, 2, 16, weight_sync_s=-1.0)


# ---- trainers: capped at the batch, groups routed evenly -----------------------------------------------


def test_the_layout_never_picks_more_trainers_than_groups_per_batch():
    """8 ranks, trainer-bound rates (slow trainers, fast decoding): more trainers always look
    faster, but a batch of 4 groups feeds at most 4; the plan must be one assign_roles accepts."""
    cfg = CapstoneConfig(run_dir="x")
    rates = _rates("cuda", units=8, local_ranks=8, step_s=1e-4, c=2e3)
    assert trainer_choices(cfg, 8) == [4, 3, 2]
    plan = choose_layout(rates, cfg, 8)
    assert plan.n_trainers == 4
    assign_roles(8, plan.n_trainers, cfg.groups_per_batch)  # runs
    wide = replace(cfg, groups_per_batch=16)
    assert max(trainer_choices(wide, 8)) == 7
    assert choose_layout(rates, wide, 8).n_trainers <= 7


def test_a_trainer_count_that_does_not_divide_the_batch_counts_as_what_it_consumes():
    assert trainer_capacity(2, 4) == 2 and trainer_capacity(4, 4) == 4
    assert trainer_capacity(3, 4) == 2  # the update waits for the trainer with 2 groups
    cfg = CapstoneConfig(run_dir="x")
    rates = _rates("cuda", units=8, local_ranks=8, step_s=1e-4, c=2e3)
    three, two = answer_rate(rates, cfg, 8, 3, 16), answer_rate(rates, cfg, 8, 2, 16)
    assert three.tokens_per_s == pytest.approx(two.tokens_per_s, rel=0.02)  # 3 trainers are no faster than 2


@pytest.mark.parametrize(("trainers", "groups"), [(2, 4), (3, 4), (3, 8), (4, 4), (5, 8), (7, 16)])
def test_routing_is_a_partition_with_trainer_0_least_loaded(trainers, groups):
    roles = assign_roles(trainers + 1, trainers, groups)
    for u in range(3):
        shards = [roles.groups_for(t, u, groups) for t in roles.trainers]
        assert sorted(k for s in shards for k in s) == list(range(u * groups, (u + 1) * groups))
        sizes = [len(s) for s in shards]
        assert max(sizes) == math.ceil(groups / trainers) and min(sizes) == groups // trainers
        assert sizes[0] == min(sizes)  # trainer 0 also sends weights and writes checkpoints


def test_infeasible_layouts_are_never_chosen(monkeypatch):
    """A split the model calls infeasible is skipped; none feasible is an error naming why."""
    import course_lib.capstone.plan as plan_mod

    cfg = CapstoneConfig(run_dir="x")
    rates = _rates()
    real = plan_mod.answer_rate

    def only_two_trainers_fit(rates_, cfg_, world, n_trainers, n_slots, **kw):
        p = real(rates_, cfg_, world, n_trainers, n_slots, **kw)
        return p if n_trainers == 2 else replace(p, tokens_per_s=1e12, infeasible="trainer memory (planted)")

    monkeypatch.setattr(plan_mod, "answer_rate", only_two_trainers_fit)
    assert choose_layout(rates, cfg, 4).n_trainers == 2
    monkeypatch.setattr(plan_mod, "answer_rate", lambda *a, **k: replace(real(*a, **k), infeasible="lag (planted)"))
    with pytest.raises(ValueError, match=r"no feasible layout: 3 trainers x 16 slots: lag \(planted\)"):
        choose_layout(rates, cfg, 4)


# ---- the trainer's and the sampler's code with an explicit device ------------------------------------


def _tiny() -> TinyLM:
    from course_lib.lm.task import TaskConfig

    task = TaskConfig()
    torch.manual_seed(0)
    return TinyLM(LMConfig(vocab=task.vocab, d_model=16, n_layers=1, n_heads=2, max_len=task.max_len))


def _check_sampler_on(device: torch.device) -> None:
    model = _tiny().to(device)
    sampler = SlotSampler(model, 4, EOS, generator_for(model, 0))
    assert sampler.tokens.device.type == device.type and sampler.cache[0].device.type == device.type
    task = CountdownTask()
    problems = task.sample(np.random.default_rng(0), 6)
    results = sample_problems(model, [p.prompt for p in problems], 4, EOS, generator_for(model, 0))
    assert all(r["tokens"].device.type == "cpu" for r in results)  # results come back to the host
    total, n = heldout_reward(model, task, 16, 0, 0, 2)
    assert n == 8 and 0.0 <= total <= 8.0


def test_sampler_and_heldout_reward_run_on_the_model_s_device():
    _check_sampler_on(torch.device("cpu"))


def test_a_generator_on_another_device_than_the_model_is_refused():
    model = _tiny()
    model.to("meta")
    with pytest.raises(ValueError, match="random generator is on cpu, the model on meta"):
        SlotSampler(model, 2, EOS, torch.Generator())


@CUDA
def test_sampler_and_heldout_reward_run_on_a_gpu():
    _check_sampler_on(torch.device("cuda", 0))


def _trainer_update(device: torch.device) -> dict:
    """One Trainer.update on a one-rank gloo group, the model on ``device``; ``trained``: what its
    metrics recorded as entering the loss."""
    import tempfile

    from course_lib.capstone.metrics import MetricsWriter, metrics_path, read_lines
    from course_lib.capstone.roles import Roles

    cfg = CapstoneConfig(run_dir="x", groups_per_batch=2, group_size=4)
    model = _tiny().to(device)
    state = TrainerState(model, torch.optim.Adam(model.parameters(), 1e-3), 0, SampleLedger(4, 2), None)
    rng = np.random.default_rng(0)
    groups = []
    for k in range(2):  # as a generator hands them over: identity, answers, behaviour log-probs, versions
        answers = [
            {"answer": rng.integers(4, 30, 3).tolist(), "logp": [-1.0] * 3, "versions": [0] * 3, "reward": float(i % 2)}
            for i in range(4)
        ]
        groups.append(
            {"k": k, "attempt": 0, "rank": 2, "start_version": 0, "prompt": [1, 10, 7, 2], "answers": answers}
        )
    # the reference: (07.2) on the whole batch, its loss divided by the batch's tokens before the backward pass
    import copy

    from course_lib.capstone.trainer import shard_loss
    from course_lib.pipeline.loss import pad_groups

    ref = copy.deepcopy(model)
    batch = pad_groups(groups)
    ref_loss, _ = shard_loss(ref, batch, int(batch["mask"].sum()), cfg.clip_c, cfg.train_chunk)
    ref_loss.backward()
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        run_dir = tempfile.mkdtemp(prefix="capstone-update-")
        metrics = MetricsWriter(run_dir, 0, "trainer", 0)
        trainer = Trainer(cfg, Roles(3, 1), 0, 0, state, None, metrics, dist.group.WORLD, None, device)  # type: ignore[arg-type]
        m = trainer.update(0, groups, state.optimizer)
        metrics.close()
        # one message carried the summed gradients and the token count: divided after, the same gradient
        for p, q in zip(model.parameters(), ref.parameters()):
            assert p.grad is not None and q.grad is not None
            assert torch.allclose(p.grad.cpu(), q.grad.cpu(), rtol=1e-4, atol=1e-7)
        assert m["tokens"] == 24 and m["loss"] == pytest.approx(float(ref_loss), rel=1e-5)
    finally:
        dist.destroy_process_group()
    (line,) = [x for x in read_lines(metrics_path(run_dir, 0)) if x["kind"] == "trained"]
    m["trained"] = line["groups"]
    for (attempt, k, rows, tokens, digest), g in zip(line["groups"], groups):
        assert (attempt, k, rows, tokens) == (0, g["k"], 4, 12)
        assert digest == answers_digest(a["answer"] for a in g["answers"])  # type: ignore[attr-defined]
    assert next(model.parameters()).device.type == device.type
    return m


def test_trainer_update_records_the_groups_own_identities():
    m = _trainer_update(torch.device("cpu"))
    assert m["consumed"] == [(0, 0, 4), (0, 1, 4)] and m["samples"] == 8 and np.isfinite(m["loss"])


@CUDA
def test_trainer_update_on_a_gpu():
    m = _trainer_update(torch.device("cuda", 0))
    assert m["consumed"] == [(0, 0, 4), (0, 1, 4)]


def test_calibration_records_where_and_how_it_was_timed():
    cfg = CapstoneConfig(run_dir="x", n_slots=16, d_model=16, n_layers=1, n_heads=2)
    model = TinyLM(cfg.lm)
    rates = calibrate(model, CountdownTask(), cfg, local_ranks=4)
    assert rates.device == "cpu" and rates.local_ranks == 4 and rates.colocated is False
    assert rates.cpu_share == pytest.approx(min(1.0, rates.units / 4))
    assert set(rates.decode_step_s) == {16} and 16 in SLOT_CHOICES


def test_layout_rows_hold_the_chosen_layout_as_their_fastest_and_say_what_binds():
    from course_lib.capstone.plan import format_layout_rows, layout_rows

    cfg = CapstoneConfig(run_dir="x")
    rates = _rates(units=2, local_ranks=4)
    rows = layout_rows(rates, cfg, 4)
    assert [(r.trainers, r.slots) for r in rows] == [(t, s) for t in trainer_choices(cfg, 4) for s in (16, 32, 64)]
    plan = choose_layout(rates, cfg, 4)
    best = max(rows, key=lambda r: r.tokens_per_s)
    assert (best.trainers, best.slots) == (plan.n_trainers, plan.n_slots)
    assert best.tokens_per_s == pytest.approx(plan.predicted_tokens_per_s)
    for r in rows:
        assert r.tokens_per_s <= min(r.production, r.consumption) * (1 + 1e-9)  # no bound beats either side alone
        assert r.bound in ("production", "consumption", "the admission window (08.11)", "the straggler wait (08.14)")
    text = format_layout_rows(rows, 4, chosen=(best.trainers, best.slots))
    assert text.count("<- chosen") == 1 and len(text.splitlines()) == len(rows) + 1


def test_predict_arm_matches_the_plan_s_own_predictions_per_regime():
    from course_lib.capstone.plan import colocated_sync_rate, predict_arm

    cfg = CapstoneConfig(run_dir="x")
    rates = _rates(units=2, local_ranks=4)
    slower = replace(rates, train_steps_per_s=rates.train_steps_per_s / 2)
    answers = (5,) * 32
    colo = predict_arm(rates, cfg, 4, "sync-colocated", 2, 16, answers, slower)
    assert colo.updates_per_s == pytest.approx(1 / colocated_sync_rate(rates, cfg, 2, answer_tokens=answers).step_s)
    assert colo.updates_per_s_measured_cd < colo.updates_per_s and colo.mean_lag == 0.0
    trainer_bound = replace(rates, train_steps_per_s=rates.train_steps_per_s / 50)  # c measured far below c1
    pipe = predict_arm(rates, cfg, 4, "async", 2, 16, answers, trainer_bound, weight_sync_s=0.01)
    assert pipe.updates_per_s == pytest.approx(1 / answer_rate(rates, cfg, 4, 2, 16, answer_tokens=answers).step_s)
    assert pipe.updates_per_s_measured_cd < pipe.updates_per_s and 0 < pipe.mean_lag <= cfg.max_lag
    sync = predict_arm(rates, cfg, 4, "sync", 2, 16, answers, rates)
    assert sync.mean_lag == 0.0 and sync.gen_share == pytest.approx(1.0)  # the trainers' cores lent while they wait


@pytest.mark.parametrize(
    ("agents", "nproc", "visible", "colocated", "expected"),
    [
        (1, 4, ["0", "1", "2", "3"], False, [None]),  # one agent: its ranks' LOCAL_RANKs are distinct already
        (2, 2, [], False, [None, None]),  # no GPU: nothing to split
        (2, 2, ["0", "1"], False, ["", ""]),  # 2 GPUs for 4 ranks: every rank on the CPUs, one backend
        (2, 2, ["0", "1", "2", "3"], False, ["0,1", "2,3"]),  # a GPU per rank: a slice per agent
        (2, 2, ["4", "5", "6", "7", "0"], False, ["4,5", "6,7"]),  # the GPUs the parent was given, in its order
        (2, 4, [str(g) for g in range(8)], False, ["0,1,2,3", "4,5,6,7"]),
        (2, 2, ["0", "1"], True, [None, None]),  # --colocated: every rank on GPU 0 by design
    ],
)
def test_two_agents_on_one_host_never_share_a_gpu(agents, nproc, visible, colocated, expected):
    from course_lib.capstone.launch import agent_gpus

    assert agent_gpus(agents, nproc, visible, colocated) == expected
