"""Lesson 11's capstone job: unit tests of its parts, then real torchrun runs on gloo.

The runs are short (a few updates, a tiny warm start and evaluation) and bounded: every
torchrun runs in a process group of its own under a deadline (``launch.run`` kills the
group when it passes), and each test checks that no process it started is left. Kill
tests SIGKILL a generator and, separately, a trainer mid-run; torchrun restarts the job
from the newest checkpoint and the sample ledger must balance exactly.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from course_lib.capstone.colocated import SharedBuffer, remove_buffers, run_key
from course_lib.capstone.config import CapstoneConfig, add_arguments, from_args, parse_arm, to_argv
from course_lib.capstone.job import SetupError, resolve_backend
from course_lib.capstone.launch import check_before_launch, run, torchrun_command
from course_lib.capstone.ledger import Generated, SampleLedger, Trained, answers_digest, audit
from course_lib.capstone.metrics import MetricsWriter
from course_lib.capstone.report import generated_records, load
from course_lib.capstone.roles import assign_roles
from course_lib.capstone.trainer import loss_rows, shard_loss, state_digest
from course_lib.lm.model import TinyLM, sequence_logprobs
from course_lib.pipeline.loss import group_token_advantages, pad_groups, pipeline_loss
from course_lib.runtime.processes import live_children

#: A short run: a few updates, a tiny warm start and held-out set (seconds, not minutes).
SHORT = {
    "n_updates": 16,
    "warm_steps": 5,
    "eval_prompts": 32,
    "checkpoint_every": 5,
    "keep_checkpoints": 10,
    "timeout_s": 45.0,
}
DEADLINE_S = 120.0


# ---- roles, config, bad input ----------------------------------------------------------------------


def test_roles_split_ranks_and_route_every_group_to_one_trainer():
    roles = assign_roles(world_size=5, n_trainers=2, groups_per_batch=4)
    assert roles.trainers == [0, 1] and roles.generators == [2, 3, 4] and roles.sync_ranks == [0, 2, 3, 4]
    assert [roles.role(r) for r in range(5)] == ["trainer", "trainer", "generator", "generator", "generator"]
    for u in range(3):
        shards = [roles.groups_for(t, u, 4) for t in roles.trainers]
        assert sorted(k for s in shards for k in s) == list(range(4 * u, 4 * u + 4))  # a partition
        assert all(len(s) == 2 for s in shards)


@pytest.mark.parametrize(
    ("world", "trainers", "groups", "words"),
    [(2, 2, 4, "at least 3 ranks"), (4, 1, 4, "at least 2 trainer"), (4, 4, 4, "no generator"), (4, 3, 2, "groups")],
)
def test_roles_refuse_layouts_that_cannot_run(world, trainers, groups, words):
    with pytest.raises(ValueError, match=words):
        assign_roles(world, trainers, groups)


def test_config_rejects_bad_input_and_round_trips_through_argv():
    with pytest.raises(ValueError, match="--max-lag must be >= 0"):
        CapstoneConfig(run_dir="x", max_lag=-1)
    with pytest.raises(ValueError, match="--kill-rank and --kill-at-update"):
        CapstoneConfig(run_dir="x", kill_rank=2)
    cfg = CapstoneConfig(run_dir="r", max_lag=0, colocated=True, lr=5e-4, n_trainers=3)
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert from_args(parser.parse_args(to_argv(cfg))) == cfg
    cmd = torchrun_command(cfg, 4, nnodes=2, rdzv_endpoint="h:1", max_restarts=2)
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=h:1" in cmd and "--max-restarts=2" in cmd


def test_launch_refuses_bad_input_before_starting_anything(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        check_before_launch(CapstoneConfig(run_dir=str(tmp_path / "nope"), resume=True), 4)
    with pytest.raises(ValueError, match="no checkpoint"):
        check_before_launch(CapstoneConfig(run_dir=str(tmp_path), resume=True), 4)
    with pytest.raises(ValueError, match="at least 3 ranks"):
        check_before_launch(CapstoneConfig(run_dir=str(tmp_path)), 2)
    (tmp_path / "attempts.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match="already holds a run"):
        check_before_launch(CapstoneConfig(run_dir=str(tmp_path)), 4)


# ---- the ledger --------------------------------------------------------------------------------------


def _gen(attempt, ks, samples=8):
    return [Generated(attempt, k, samples) for k in ks]


def _consume(led, attempt, update, made_by=None, samples=8, ks=None):
    """Record update ``update`` as the trainers would: the groups' own (attempt, k, samples)."""
    B = led.groups_per_batch
    ks = range(update * B, (update + 1) * B) if ks is None else ks
    led.consume(attempt, update, [(attempt if made_by is None else made_by, k, samples) for k in ks], 100)


def test_ledger_balances_across_a_restart_and_refuses_gaps():
    led = SampleLedger(group_size=8, groups_per_batch=2)
    for u in range(3):
        _consume(led, 0, u)
    saved = SampleLedger.from_json(json.loads(json.dumps(led.to_json())))  # the checkpoint at step 3
    # attempt 0 went on: updates 3, 4 (groups 6..9) and groups 10..12 in flight, then died
    generated = _gen(0, range(13))
    assert saved.resume(attempt=1, step=3, generated=generated) == 7  # groups 6..12
    for u in range(3, 6):
        _consume(saved, 1, u)
    generated += _gen(1, range(6, 14))  # attempt 1 made 6..13; 12 and 13 are left over at the end
    assert saved.finish(attempt=1, generated=generated) == 2
    result = audit(saved, generated)
    assert result["ok"], result
    assert result["generated_samples"] == 8 * (13 + 8) == result["consumed_samples"] + 8 * (7 + 2)
    assert saved.segments == [[0, 0, 6, 8], [1, 6, 12, 8]]
    with pytest.raises(ValueError, match="lost or counted twice"):
        _consume(saved, 1, 7)


def _finished(consumed_ks, generated_ks, samples=8, consumed_samples=8, made_by=0):
    """A one-attempt run: two groups per update, ``consumed_ks`` recorded (as the trainers got them)."""
    led = SampleLedger(group_size=8, groups_per_batch=2)
    for u in range(len(consumed_ks) // 2):
        _consume(led, 0, u, made_by=made_by, samples=consumed_samples, ks=consumed_ks[2 * u : 2 * u + 2])
    generated = _gen(0, generated_ks, samples)
    led.finish(0, generated)
    return audit(led, generated)


def test_audit_fails_on_a_lost_or_duplicated_sample_read_from_the_groups_themselves():
    assert _finished([0, 1, 2, 3], [0, 1, 2, 3, 4])["ok"]  # group 4 left over at the end
    # a trainer got group 1 twice and never group 2 (a routing slip): consumed twice, group 2 unaccounted
    bad = _finished([0, 1, 1, 3], [0, 1, 2, 3])
    assert not bad["ok"] and bad["consumed_twice"] == 1 and bad["unaccounted"] == [(0, 2)]
    # an answer lost on the way: the trainers recorded 7 samples of groups the generators made with 8
    lost = _finished([0, 1], [0, 1], consumed_samples=7)
    assert not lost["ok"] and lost["samples_differ"] == [(0, 0), (0, 1)]
    assert lost["generated_samples"] != lost["consumed_samples"] + lost["discarded_samples"] + lost["leftover_samples"]
    # a group consumed but never generated, and one handed over twice
    assert _finished([0, 1], [0])["consumed_not_generated"] == [(0, 1)]
    assert _finished([0, 1], [0, 1, 1])["duplicate_lines"] == 1
    # groups of another attempt (a stale payload read after a restart): never generated by this one
    assert not _finished([0, 1], [0, 1], made_by=1)["ok"]


def test_audit_fails_when_a_dead_attempt_s_group_is_also_consumed():
    led = SampleLedger(group_size=8, groups_per_batch=2)
    _consume(led, 0, 0)
    generated = _gen(0, range(4))  # attempt 0 made 0..3, checkpointed after update 0, died
    led.resume(1, 1, generated)  # groups 2, 3 of attempt 0 discarded
    _consume(led, 1, 1, made_by=0)  # ... but the trainers of attempt 1 trained on attempt 0's payloads
    generated += _gen(1, [2, 3])
    led.finish(1, generated)
    result = audit(led, generated)
    assert not result["ok"] and result["in_two_classes"] == [(0, 2), (0, 3)]


def test_audit_holds_what_entered_each_loss_against_what_the_generator_made():
    """The content check: a group's rows, tokens under the mask and token digest, as the trainer
    read them from its padded batch, must be the generator's; a token altered on the way, an
    answer masked out, or a consumed group that entered no loss, fails the audit."""
    rng = np.random.default_rng(0)
    groups = _groups(rng, 2)
    for g in groups:
        g["attempt"] = 0
    gen = [
        Generated(0, g["k"], len(g["answers"]), 2, sum(len(a["answer"]) for a in g["answers"]),
                  answers_digest(a["answer"] for a in g["answers"]))
        for g in groups
    ]  # fmt: skip
    led = SampleLedger(group_size=4, groups_per_batch=2)
    led.consume(0, 0, [(0, 0, 4), (0, 1, 4)], 10)
    led.finish(0, gen)
    rows = loss_rows(groups, pad_groups(groups))
    trained = [Trained(*r) for r in rows]
    assert audit(led, gen, trained)["ok"]
    altered = [dict(g, answers=[dict(a) for a in g["answers"]]) for g in groups]
    altered[1]["answers"][2]["answer"] = [t + 1 for t in altered[1]["answers"][2]["answer"]]
    bad = audit(led, gen, [Trained(*r) for r in loss_rows(altered, pad_groups(altered))])
    assert not bad["ok"] and bad["content_differs"] == [(0, 1)]
    batch = pad_groups(groups)
    batch["mask"][0] = False  # an answer masked out of the loss
    masked = audit(led, gen, [Trained(*r) for r in loss_rows(groups, batch)])
    assert not masked["ok"] and masked["content_differs"] == [(0, 0)]
    missing = audit(led, gen, trained[:1])
    assert not missing["ok"] and missing["not_in_a_loss"] == [(0, 1)]


# ---- the data-parallel loss ----------------------------------------------------------------------


def _groups(rng, n_groups, group_size=4):
    groups = []
    for k in range(n_groups):
        answers = []
        for _ in range(group_size):
            n = int(rng.integers(1, 6))
            answers.append(
                {
                    "answer": rng.integers(4, 60, n).tolist(),
                    "logp": (-rng.random(n)).tolist(),
                    "versions": [0] * n,
                    "reward": float(rng.random() < 0.5),
                }
            )
        groups.append({"k": k, "prompt": [1, 10, 7, 2], "answers": answers})
    return groups


def test_shard_losses_sum_to_the_single_process_loss_gradient():
    """Two trainers' gradients, summed (the all-reduce), equal the gradient of (07.2) on the whole batch."""
    torch.manual_seed(0)
    from course_lib.lm.model import LMConfig

    model = TinyLM(LMConfig(vocab=64, d_model=16, n_layers=1, n_heads=2, max_len=16))
    groups = _groups(np.random.default_rng(0), 4)
    full = pad_groups(groups)
    mask = full["mask"]
    logp_new = sequence_logprobs(model, full["tokens"])
    adv = group_token_advantages(full["rewards"], mask)
    model.zero_grad()
    pipeline_loss(logp_new, full["logp"], adv, mask, 2.0).backward()
    want = [p.grad.clone() for p in model.parameters()]
    n_tokens = int(mask.sum())
    summed = [torch.zeros_like(p) for p in model.parameters()]
    for shard in (groups[0::2], groups[1::2]):
        model.zero_grad()
        loss, _ = shard_loss(model, pad_groups(shard), n_tokens, 2.0, chunk=3)
        loss.backward()
        summed = [s + p.grad for s, p in zip(summed, model.parameters())]
    for s, w in zip(summed, want):
        torch.testing.assert_close(s, w, rtol=1e-5, atol=1e-7)


# ---- colocated shared buffer ---------------------------------------------------------------------


def test_backend_and_device_follow_the_gpus_per_rank():
    assert resolve_backend("auto", False, 4, 0) == ("gloo", "cpu")
    assert resolve_backend("auto", False, 4, 4) == ("nccl", "cuda")
    assert resolve_backend("auto", True, 4, 1) == ("gloo", "cuda")  # ranks share the GPU, weights by CUDA IPC
    assert resolve_backend("auto", True, 4, 8) == ("gloo", "cuda")  # colocated: one GPU, whatever the count
    assert resolve_backend("auto", True, 4, 0) == ("gloo", "cpu")  # colocated on CPUs: /dev/shm
    assert resolve_backend("gloo", False, 4, 1) == ("gloo", "cpu")
    with pytest.raises(SetupError, match="one GPU per rank: 4 ranks on this host, 1 GPU"):
        resolve_backend("nccl", False, 4, 1)
    with pytest.raises(SetupError, match="--colocated puts every rank on one GPU"):
        resolve_backend("nccl", True, 4, 4)
    with pytest.raises(SetupError, match="needs CUDA GPUs"):
        resolve_backend("nccl", False, 4, 0)


def test_shared_buffer_hands_weights_over_without_a_copy(tmp_path):
    path = tmp_path / "weights"
    writer = SharedBuffer(path, numel=10, create=True, readers=2)
    reader = SharedBuffer(path, numel=10)
    pieces = [torch.arange(4.0), torch.arange(6.0).reshape(2, 3) + 10]
    params = [torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(2, 3))]
    with pytest.raises(TimeoutError, match="has the writer published"):
        reader.attach(params, reader=0, timeout_s=0.01)  # nothing published yet
    writer.publish(pieces, version=3)
    assert reader.attach(params, reader=0) == 3
    assert all(torch.equal(a, b) for a, b in zip(params, pieces))
    # zero copy: the parameters are views on the buffer's slot, in publish order
    assert params[0].data_ptr() == reader.slots[0].data_ptr()
    assert params[1].data_ptr() == reader.slots[0].data_ptr() + 4 * 4
    assert writer.held() == {0: 0}
    # version 4 goes to the other slot; reader 0 keeps decoding with version 3 meanwhile
    writer.publish([p + 100 for p in pieces], version=4)
    assert torch.equal(params[0].detach(), torch.arange(4.0))
    # version 5 would overwrite reader 0's slot: the writer waits, then says who holds it
    with pytest.raises(TimeoutError, match=r"reader\(s\) \[0\].*still decode with slot 0"):
        writer.publish([p + 200 for p in pieces], version=5, timeout_s=0.05)
    assert torch.equal(params[0].detach(), torch.arange(4.0))  # untouched by the refused publish
    assert reader.attach(params, reader=0) == 4 and writer.held() == {0: 1}
    writer.publish([p + 200 for p in pieces], version=5)  # slot 0 is free now
    assert torch.equal(params[0].detach(), torch.arange(4.0) + 100)
    reader.release(0)
    assert writer.held() == {}
    with pytest.raises(ValueError, match="bytes of weights"):
        SharedBuffer(path, numel=11)
    with pytest.raises(ValueError, match="reader 2 out of range"):
        reader.attach(params, reader=2)
    with pytest.raises(ValueError, match="float32"):
        writer.publish([p.double() for p in pieces], version=6)


def test_shared_buffer_readers_never_see_a_torn_or_overwritten_slot(tmp_path):
    """A writer thread publishes versions as fast as it can (every number of version v is v);
    two readers re-attach in a loop and check their weights are whole and stay unchanged
    while they hold them (torch's copies release the GIL, so the threads really overlap)."""
    import threading

    numel = 1 << 18
    path = tmp_path / "weights"
    writer = SharedBuffer(path, numel, create=True, readers=2)
    writer.publish([torch.full((numel,), 1.0)], version=1)
    stop = threading.Event()
    errors: list[str] = []
    published = [1]

    def write() -> None:
        v = 1
        while not stop.is_set():
            v += 1
            writer.publish([torch.full((numel,), float(v))], version=v, timeout_s=5.0)
            published.append(v)

    def read(r: int) -> None:
        buf = SharedBuffer(path, numel)
        param = torch.nn.Parameter(torch.zeros(numel))
        last = 0
        for _ in range(60):
            v = buf.attach([param], reader=r)
            for _ in range(3):  # decode a little with it: it must not change under us
                lo, hi = float(param.detach().min()), float(param.detach().max())
                if not lo == hi == v or v < last:
                    errors.append(f"reader {r}: version {v} (after {last}) holds values {lo}..{hi}")
                time.sleep(0.0002)
            last = v
        buf.release(r)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads[1:]:
        t.join(timeout=60)
    stop.set()
    threads[0].join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[:3]
    assert len(published) > 10  # the writer really ran beside the readers


# ---- the report reader -----------------------------------------------------------------------------


def test_report_reads_every_rank_into_tables(tmp_path):
    for rank, role in ((0, "trainer"), (2, "generator")):
        m = MetricsWriter(tmp_path, rank, role, attempt=0)
        if rank == 0:
            m.log("start", restart_count=0, resumed_step=0, plan={"n_trainers": 2})
            m.log("eval", when="start", reward=0.1, prompts=8, step=0)
            for u in range(3):
                m.log(
                    "update",
                    update=u,
                    started=time.time(),
                    reward=0.1 * u,
                    tokens=100,
                    samples=8,
                    lag_mean=1.0,
                    lag_max=2,
                    ess=0.9,
                    clipped=0.0,
                    loss=0.1,
                    time_wait=0.01,
                    time_train=0.02,
                    time_allreduce=0.005,
                    lag_hist=[1, 2, 3, 0],
                )
            m.log("eval", when="end", reward=0.3, prompts=8, step=3)
            m.log("sync", side="send", version=1, total=0.01, stage=0.0, transfer=0.01, reload=0.0, load=0.0, nbytes=10)
        else:
            m.log("generated", k=0, samples=8, tokens=40, start_version=0)
            m.busy(1.0, 1.001)
            m.busy(1.0015, 1.002)  # merged with the previous step
            m.busy(2.0, 2.1)
        m.close()
    (tmp_path / "metrics" / "rank2.jsonl").open("a").write('{"kind": "upd')  # a torn last line
    rep = load(tmp_path)
    assert rep.updates["reward"].tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert rep.lag_histogram().tolist() == [3, 6, 9, 0]
    assert rep.held_out() == (0.1, 0.3)
    decode = rep.phases["phase"] == "decode"
    assert decode.sum() == 2 and rep.phases["end"][decode][0] == pytest.approx(1.002)
    (gen,) = generated_records(rep.lines)
    assert (gen.attempt, gen.k, gen.samples, gen.rank) == (0, 0, 8, 2)
    assert rep.tokens_per_s > 0 and "evaluation reward: 0.100" in rep.summary()
    with pytest.raises(FileNotFoundError, match="no capstone metrics"):
        load(tmp_path / "empty")


# ---- real runs under torchrun ----------------------------------------------------------------------


def _run(run_dir, **overrides):
    """One job under torchrun, short and silent, within the deadline; checks nothing is left running."""
    kwargs = {"nproc_per_node": 4, "max_restarts": 0, **overrides}
    rep = run(run_dir, deadline_s=DEADLINE_S, show_progress=False, echo=None, **kwargs)
    _no_orphans()
    return rep


def _no_orphans():
    assert not live_children(), [p.cmdline() for p in live_children()]


def _checkpoint_digest(run_dir: Path, step: int) -> str:
    from safetensors.torch import load_file

    return state_digest(load_file(str(run_dir / "checkpoints" / f"step_{step:08d}" / "model.safetensors")))


def _check_run(rep, n_updates):
    assert rep.result["audit"]["ok"], rep.result["audit"]
    assert rep.result["updates"] == n_updates
    lags = rep.lag_histogram()
    assert lags[-1] == 0  # no token lagged more than max_lag
    if "generator" not in {x["role"] for x in rep.lines if x["kind"] == "start"}:  # sync-colocated: no generator
        assert set(np.unique(rep.phases["phase"])) >= {"decode", "train", "eval", "checkpoint"}
        return
    assert set(np.unique(rep.phases["phase"])) >= {"decode", "train", "wait", "sync", "eval", "checkpoint"}
    sends = rep.syncs["side"] == "send"
    assert sends.any() and (rep.syncs["total"][sends] > 0).all()


def test_short_run_logs_every_rank_and_resumes_bit_exact(tmp_path):
    run_dir = tmp_path / "run"
    rep = _run(run_dir, **SHORT)
    _check_run(rep, SHORT["n_updates"])
    assert {int(r) for r in np.unique(rep.phases["rank"])} == {0, 1, 2, 3}
    assert rep.layout["world_size"] == 4 and rep.layout["predicted_tokens_per_s"] > 0
    # --resume continues from the newest checkpoint, its weights restored bitwise
    more = dict(SHORT, n_updates=SHORT["n_updates"] + 4)
    rep = _run(run_dir, resume=True, **more)
    start = [x for x in rep.lines if x["kind"] == "start" and x["rank"] == 0][-1]
    assert start["resumed_step"] == SHORT["n_updates"]
    assert start["restored_sha256"] == _checkpoint_digest(run_dir, SHORT["n_updates"])
    _check_run(rep, more["n_updates"])


@pytest.mark.parametrize(("victim", "role", "colocated"), [(3, "generator", True), (1, "trainer", False)])
def test_a_killed_rank_restarts_the_job_from_its_checkpoint_and_the_ledger_balances(tmp_path, victim, role, colocated):
    """The generator's case runs colocated: the dead generator held a slot of the shared buffer,
    and the restarted attempt must start from a fresh one (and leave none behind)."""
    run_dir = tmp_path / role
    rep = _run(
        run_dir, max_restarts=1, kill_rank=victim, kill_at_update=8, calibrate=False, colocated=colocated, **SHORT
    )
    _check_run(rep, SHORT["n_updates"])
    assert not remove_buffers(run_key(run_dir))  # the launcher removed every attempt's buffer
    receives = rep.syncs["side"] == "receive"
    assert receives.any() and (rep.syncs["nbytes"][receives] > 0).all()
    assert (run_dir / "kills" / f"rank{victim}-update8").exists()
    (restart,) = rep.restarts
    assert restart["restart_count"] == 1 and restart["resumed_step"] == 5  # the newest checkpoint before the kill
    assert restart["restored_sha256"] == _checkpoint_digest(run_dir, 5)
    audit_ = rep.result["audit"]
    assert audit_["discarded_groups"] == restart["discarded_groups"] > 0
    assert (
        audit_["generated_samples"]
        == audit_["consumed_samples"] + audit_["discarded_samples"] + audit_["leftover_samples"]
    )
    messages = " ".join(rep.events["message"])
    assert f"{role} rank {victim} kills itself" in messages and "TORCHELASTIC_RESTART_COUNT=1" in messages


def test_arms_run_in_turn_in_one_launch_each_a_run_of_its_own(tmp_path):
    """Every arm in one torchrun launch: each its directory, store keys and ledger; sync-colocated
    trains on every rank with no generator and no weight transfer; an arm may pin its layout."""
    from course_lib.capstone.launch import run_arms

    names = ["async", "sync", "async-shm", "sync-colocated", "async@3x8", "sync-colocated@2x16"]
    arms = run_arms(
        tmp_path / "arms", names, deadline_s=DEADLINE_S, show_progress=False, echo=None,
        calibrate=False, n_trainers=2, n_slots=16, **dict(SHORT, n_updates=6),
    )  # fmt: skip
    _no_orphans()
    assert [name for name, _ in arms] == names
    for name, rep in arms:
        _check_run(rep, 6)
        assert rep.run_dir.name.endswith(name.replace("@", "-")) and rep.result["attempts"] == 1
        assert rep.answer_lengths().size == rep.result["audit"]["generated_samples"]
    for i in (1, 3):  # synchronous: every token sampled by the version it trains
        assert int(np.nanmax(arms[i][1].updates["lag_max"])) == 0
    assert not remove_buffers(run_key(arms[2][1].run_dir))
    colocated = arms[3][1]
    assert colocated.layout["n_trainers"] == 4 and colocated.syncs["side"].size == 0  # no generator, no transfer
    assert set(colocated.phases["phase"][colocated.phases["rank"] == 3]) >= {"decode", "train"}
    assert colocated.result["audit"]["leftover_samples"] == 0  # nothing generated ahead of the trainers
    assert (arms[4][1].layout["n_trainers"], arms[4][1].layout["n_slots"]) == (3, 8)
    two = arms[5][1]  # one rank per core: ranks 0-1 sample and train, ranks 2-3 idle
    assert (two.layout["n_trainers"], two.layout["n_slots"]) == (2, 16)
    assert {x["rank"]: x["role"] for x in two.lines if x["kind"] == "start"} == {
        0: "trainer",
        1: "trainer",
        2: "idle",
        3: "idle",
    }
    assert not two.phases["rank"][two.phases["rank"] >= 2].size  # the idle ranks did no work
    with pytest.raises(ValueError, match="--arms takes async, async-shm, sync, sync-colocated"):
        CapstoneConfig(run_dir="x", arms="async,fast")
    with pytest.raises(ValueError, match="--arms takes"):
        CapstoneConfig(run_dir="x", arms="async@1x8")
    with pytest.raises(ValueError, match="give the async arms --max-lag >= 1"):
        CapstoneConfig(run_dir="x", arms="async,sync", max_lag=0)
    with pytest.raises(ValueError, match="already holds a run"):
        run_arms(tmp_path / "arms", ["async"], echo=None, show_progress=False)
    with pytest.raises(ValueError, match=r"use capstone\.launch\.run_arms"):
        run(tmp_path / "x", arms="async")


def test_arm_labels_parse_to_a_regime_and_an_optional_layout():
    assert parse_arm("sync-colocated") == ("sync-colocated", None)
    assert parse_arm("async@3x16") == ("async", (3, 16))
    for bad in ("colocated", "async@3", "async@1x16", "async@3x0", "async@x16"):
        with pytest.raises(ValueError):
            parse_arm(bad)
    arm = CapstoneConfig(run_dir="r", arms="sync-colocated,async-shm,async@3x16")
    assert (arm.arm(0).colocated_sync, arm.arm(0).max_lag, arm.arm(0).colocated) == (True, 0, False)
    assert (arm.arm(1).colocated, arm.arm(1).max_lag) == (True, 4)
    assert (arm.arm(2).n_trainers, arm.arm(2).n_slots, arm.arm(2).run_dir) == (3, 16, "r/02-async-3x16")
    assert {arm.arm(i).seed for i in range(3)} == {0}  # every arm from the launch's seed


def test_round_seeds_give_each_round_its_own_seed_shared_by_its_arms():
    rounds = CapstoneConfig(run_dir="r", seed=7, arms="async,sync,sync,async,async,sync", round_seeds=True)
    assert [rounds.arm(i).seed for i in range(6)] == [7, 7, 8, 8, 9, 9]
    assert not rounds.arm(0).round_seeds and rounds.arm(5).run_dir == "r/05-sync"


def test_colocated_sync_needs_a_group_per_rank_and_max_lag_0(tmp_path):
    from course_lib.capstone.job import roles_of

    with pytest.raises(ValueError, match="--colocated-sync is synchronous RL"):
        CapstoneConfig(run_dir="r", colocated_sync=True)
    cfg = CapstoneConfig(run_dir="r", colocated_sync=True, max_lag=0)
    roles = roles_of(cfg, 4, 0)
    assert roles.trainers == [0, 1, 2, 3] and roles.generators == []
    assert roles_of(cfg, 4, 2).trainers == [0, 1]  # two ranks sample and train, two idle
    with pytest.raises(ValueError, match=r"trains on 2 \.\. 4 ranks"):
        roles_of(cfg, 4, 5)
    assert sorted(k for r in range(4) for k in roles.groups_for(r, 5, 4)) == [20, 21, 22, 23]
    with pytest.raises(ValueError, match="raise --groups-per-batch to at least 8"):
        roles_of(cfg, 8, 0)
    with pytest.raises(ValueError, match="raise --groups-per-batch"):
        check_before_launch(replace(cfg, run_dir=str(tmp_path / "c")), 8)


def test_two_torchrun_agents_meet_through_a_c10d_rendezvous(tmp_path):
    rep = _run(tmp_path / "two", nproc_per_node=2, agents=2, calibrate=False, **dict(SHORT, n_updates=8))
    _check_run(rep, 8)
    nodes = {x["rank"]: x["node"] for x in rep.lines if x["kind"] == "start"}
    assert sorted(nodes) == [0, 1, 2, 3] and set(nodes.values()) == {0, 1}  # ranks on both agents


def test_the_job_refuses_to_start_with_too_few_ranks(tmp_path):
    """The job itself (not only the launcher) names the problem: 2 ranks cannot hold 2 trainers + 1 generator."""
    import subprocess
    import sys

    cfg = CapstoneConfig(run_dir=str(tmp_path / "small"), warm_steps=1, calibrate=False)
    cmd = torchrun_command(cfg, 2)
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=DEADLINE_S, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert done.returncode != 0
    assert "at least 3 ranks" in done.stdout + done.stderr
    assert sys.executable in cmd[0]
    _no_orphans()


def test_a_pinned_job_runs_on_its_cores_and_calibrates_for_them(tmp_path):
    """``cores=1`` pins the agent and every rank to one core: the calibration sees 1 unit, so each
    of the 4 ranks gets a quarter of it, whatever the machine."""
    from course_lib.capstone.launch import pinned_cores

    assert pinned_cores(None) is None and len(pinned_cores(1)) == 1
    for bad in (0, len(os.sched_getaffinity(0)) + 1):
        with pytest.raises(ValueError, match="this process may use"):
            pinned_cores(bad)
    with pytest.MonkeyPatch.context() as mp:  # macOS: no affinity, the job runs unpinned and says so
        mp.delattr(os, "sched_setaffinity")
        assert pinned_cores(2) is None
    rep = _run(tmp_path / "pinned", cores=1, **dict(SHORT, n_updates=4))
    _check_run(rep, 4)
    rates = rep.layout["rates"]
    assert rates["units"] == 1 and rates["cpu_share"] == 0.25


def test_report_phases_allreduce_split_and_slot_use_from_synthetic_lines(tmp_path):
    from course_lib.capstone.report import CapstoneReport

    def phase(rank, name, a, b):
        return {"kind": "phase", "rank": rank, "role": "trainer", "attempt": 0, "phase": name, "start": a, "end": b,
                "t": b}  # fmt: skip

    def gen(rank, k, lengths):
        return {"kind": "generated", "rank": rank, "attempt": 0, "k": k, "samples": len(lengths), "lengths": lengths,
                "t": 0.0}  # fmt: skip

    lines = [
        {"kind": "update", "attempt": 0, "update": 0, "started": 10.0, "t": 12.0},
        {"kind": "update", "attempt": 0, "update": 1, "started": 12.0, "t": 14.0},
        phase(0, "allreduce", 9.0, 9.5),  # before the first update: not counted
        phase(0, "train", 10.0, 11.0), phase(0, "allreduce", 11.0, 11.8), phase(0, "allreduce", 13.0, 13.3),
        phase(1, "allreduce", 8.0, 9.5), phase(1, "allreduce", 11.5, 11.8), phase(1, "allreduce", 12.5, 13.3),
        phase(0, "sync", 13.5, 15.0),  # half of it after the last update's end
        gen(2, 0, [1, 3]), gen(2, 1, [2, 2]),  # update 0 of rank 2: 8 tokens in 4 answers x longest 3
        gen(3, 2, [4, 4]), gen(2, 2, [1]),  # update 1 (k // 2): rank 3's 8 in 2 x 4; rank 2's 1 in 1 x 1
    ]  # fmt: skip
    rep = CapstoneReport(tmp_path, lines)
    assert rep.updating_window() == (10.0, 14.0)
    assert rep.phase_seconds(0) == pytest.approx({"train": 1.0, "allreduce": 1.1, "sync": 0.5})
    # k-th spans: (0.5, 1.5) before the window; (0.8, 0.3) -> 0.3; (0.3, 0.8) -> 0.3
    assert rep.allreduce_own_seconds(2) == pytest.approx(0.6)
    assert rep.batch_slot_use(2, prompt_steps=0) == pytest.approx((8 + 8 + 1) / (4 * 3 + 2 * 4 + 1 * 1))
    # with 3 prompt steps per answer, as exercise 2's slot use: (n P + sum L) / (n (P + longest)) pooled
    assert rep.batch_slot_use(2, prompt_steps=3) == pytest.approx((20 + 14 + 4) / (24 + 14 + 4))
