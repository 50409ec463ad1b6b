"""Lesson 12's Ray capstone (``course_lib.capstone_ray``) on a real one-machine Ray cluster.

Every test starts Ray or actors, so every test is marked ``ray``: ``tests/conftest.py`` skips them
outside a loopback-only network namespace. Run them inside one::

    python -m course_lib.runtime.netns -- python -m pytest tests/test_capstone_ray.py
    unshare -n bash -c 'ip link set lo up; .venv/bin/python -m pytest -q tests/test_capstone_ray.py'   # as root

One Ray session serves the module (``ray_session``), started after the first test (a start that
must fail) and stopped at the end, asserting that no process it started is left. Runs are short
(a tiny warm start and held-out set) except the learning run (120 updates, 512 prompts, as
lesson 11's). The pure functions the controller uses are tested in ``test_capstone_ray_pure.py``;
the standalone group and lesson 09's engine on it in ``test_runtime_groups.py``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from course_lib.capstone_ray.cluster import (
    RayStartError,
    listening_sockets,
    loopback_only,
    ray_descendants,
    start_ray,
    stop_ray,
)
from course_lib.capstone_ray.controller import RayRunConfig, run
from course_lib.capstone_ray.cores import DIR_ENV
from course_lib.capstone_ray.placement import bundles_for, pg_strategy

pytestmark = pytest.mark.ray

#: Short runs: a tiny warm start and held-out set (placement, lag, audit and kill are the point).
SHORT = {"warm_steps": 5, "eval_prompts": 32}


@pytest.fixture(scope="module")
def ray_session() -> Iterator[str]:
    temp_dir = tempfile.mkdtemp(prefix="ray")  # short: Ray's unix sockets live under it (107-byte limit)
    # a core registry of its own (Ray's processes inherit it): another run on this machine does not move the cores
    saved = os.environ.get(DIR_ENV)
    os.environ[DIR_ENV] = os.path.join(temp_dir, "cores")
    try:
        start_ray(temp_dir=temp_dir)
        yield temp_dir
        stop_ray()  # raises if a process Ray started outlived the shutdown
        assert not ray_descendants()
    finally:
        if saved is None:
            os.environ.pop(DIR_ENV, None)
        else:
            os.environ[DIR_ENV] = saved
        shutil.rmtree(temp_dir, ignore_errors=True)


def placed_where_planned(rep: dict[str, Any]) -> None:
    """Every actor is in the bundle ``bundles_for`` gives it (the raylet's grant), with its share,
    in the run's one placement group, pinned to its bundle's core."""
    cfg = rep["config"]
    want = bundles_for(cfg["layout"], cfg["n_trainers"], cfg["n_generators"])
    assert rep["placement"] == dataclasses.asdict(want)
    actors = rep["actors"]
    assert len({a["placement_group_id"] for a in actors}) == 1 and actors[0]["placement_group_id"]
    cores = sorted(os.sched_getaffinity(0))
    for a in actors:
        bundle, share = (
            (want.trainer_bundle[a["index"]], want.trainer_cpus)
            if a["role"] == "trainer"
            else (want.generator_bundle[a["index"]], want.generator_cpus)
        )
        assert a["bundle"] == bundle, a
        assert a["cpus"] == pytest.approx(share), a
        assert a["cores"] == [cores[bundle % len(cores)]] == [a["pinned_core"]], a
        assert (a["device"], a["backend"], a["gpu_ids"]) == ("cpu", "gloo", []), a  # no GPU: CPUs and gloo
    assert rep["devices"]["reserve_gpus"] is False


def audit_exact(rep: dict[str, Any]) -> None:
    cfg, audit = rep["config"], rep["audit"]
    assert audit["ok"], audit
    assert audit["consumed_samples"] == cfg["n_updates"] * cfg["groups_per_batch"] * cfg["group_size"]
    assert [m["u"] for m in rep["metrics"]] == list(range(cfg["n_updates"]))


# ---- start and stop --------------------------------------------------------------------------------


def test_a_start_past_its_bound_fails_naming_the_cause_and_leaves_nothing():
    import ray

    assert loopback_only()
    with pytest.raises(RuntimeError, match="Ray is not running"):  # no Ray yet: run() refuses at once
        run(RayRunConfig(n_updates=1))
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            start_ray()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], RayStartError) and "main thread" in str(errors[0])
    temp_dir = tempfile.mkdtemp(prefix="ray")
    try:
        t0 = time.perf_counter()
        with pytest.raises(RayStartError, match=r"timeout_s=0\.5"):
            start_ray(timeout_s=0.5, temp_dir=temp_dir)
        assert time.perf_counter() - t0 < 60
        assert not ray.is_initialized()
        assert not ray_descendants()  # GCS, raylet, agents, workers: all gone
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_listens_on_loopback_only_and_refuses_a_second_start(ray_session):
    sockets = listening_sockets()
    names = {s.name for s in sockets}
    assert {"gcs_server", "raylet"} <= names, names
    assert all(s.loopback for s in sockets), [s for s in sockets if not s.loopback]
    with pytest.raises(RayStartError, match="already running"):
        start_ray()


# ---- the trainer group ---------------------------------------------------------------------------


def _groups(rng: np.random.Generator, n_groups: int, vocab: int, group_size: int = 4) -> list[dict[str, Any]]:
    groups = []
    for k in range(n_groups):
        answers = []
        for j in range(group_size):
            n = int(rng.integers(1, 6))
            answers.append(
                {
                    "j": j,
                    "answer": rng.integers(4, vocab, n).tolist(),
                    "logp": (-rng.random(n)).tolist(),
                    "versions": [0] * n,
                    "reward": float(rng.random() < 0.5),
                }
            )
        groups.append({"k": k, "prompt": [1, 10, 7, 2], "answers": answers})
    return groups


def test_two_trainer_actors_sum_to_the_single_process_gradient(ray_session):
    """Each trainer actor backpropagates its half of the batch and all-reduces over the trainers'
    gloo group: both end with the gradient of (07.2) on the whole batch, as one process computes it."""
    import ray

    from course_lib.capstone_ray.workers import TrainerWorker
    from course_lib.lm.model import TinyLM, sequence_logprobs
    from course_lib.pipeline.loss import group_token_advantages, pad_groups, pipeline_loss
    from course_lib.runtime.weights import flat_parameters

    cfg = RayRunConfig(train_chunk=3)
    torch.manual_seed(1)
    model = TinyLM(cfg.lm())
    flat = flat_parameters(model).numpy()
    groups = _groups(np.random.default_rng(0), 4, cfg.lm().vocab)
    full = pad_groups(groups)
    mask = full["mask"]
    model.zero_grad()
    adv = group_token_advantages(full["rewards"], mask)
    pipeline_loss(sequence_logprobs(model, full["tokens"]), full["logp"], adv, mask, cfg.clip_c).backward()
    want = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()

    T = ray.remote(TrainerWorker)
    trainers = [T.options(num_cpus=0.5).remote(cfg, r, None) for r in range(2)]
    try:
        ray.get([t.load.remote(flat) for t in trainers], timeout=120)
        at = ray.get(trainers[0].open_store.remote(), timeout=60)  # trainer 0 serves the rendezvous
        ray.get([t.join_trainer_group.remote(*at, 2) for t in trainers], timeout=60)
        got = ray.get([t.gradient.remote(groups[r::2]) for r, t in enumerate(trainers)], timeout=60)
    finally:
        for t in trainers:
            ray.kill(t)
    assert np.linalg.norm(want) > 0
    for g in got:
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


def test_bundle_0_of_two_placement_groups_pins_to_two_cores(ray_session):
    """Two placement groups of one bundle each (two runs on one node): each bundle-0 actor claims a
    core on the node, so they pin to different cores (numbered by the bundle alone, both took core 0)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from course_lib.capstone_ray.workers import TrainerWorker

    cfg = RayRunConfig()
    T = ray.remote(TrainerWorker)
    pgs = [placement_group([{"CPU": 1.0}]) for _ in range(2)]
    actors = []
    try:
        ray.get([pg.ready() for pg in pgs], timeout=60)
        actors = [T.options(num_cpus=1.0, scheduling_strategy=pg_strategy(pg, 0)).remote(cfg, 0, 0) for pg in pgs]
        where = ray.get([a.where.remote() for a in actors], timeout=120)
        claims = sorted(p.name for p in (Path(os.environ[DIR_ENV])).glob("*.json"))
    finally:
        for a in actors:
            ray.kill(a)
        for pg in pgs:
            remove_placement_group(pg)
    assert len({w["placement_group_id"] for w in where}) == 2
    assert [w["cores"] for w in where] == [[w["pinned_core"]] for w in where]
    assert sorted(w["pinned_core"] for w in where) == sorted(os.sched_getaffinity(0))[:2]
    assert claims == sorted(f"{w['pid']}.json" for w in where)  # each process's claim, in the registry


# ---- runs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["sync_colocated", "sync_split"])
def test_a_sync_layout_places_every_actor_where_bundles_for_says_and_runs_at_lag_zero(ray_session, layout):
    rep = run(RayRunConfig(layout=layout, n_updates=8, **SHORT))
    placed_where_planned(rep)
    audit_exact(rep)
    assert rep["lag_max"] == 0 and rep["lag_bound"] == 0
    if layout == "sync_colocated":
        assert set(rep["phases_ms_median"]) == {"phase_generate", "phase_handover", "phase_train", "phase_sync"}
        assert all(v > 0 for v in rep["phases_ms_median"].values())


def test_the_pipeline_learns_within_its_lag_bound_and_every_sample_is_consumed_once(ray_session):
    """Lesson 11's learning test on Ray: 120 updates, 512 held-out prompts; measured gains +0.07 to +0.11."""
    rep = run(RayRunConfig(layout="pipeline", n_updates=120, checkpoint_every=40))
    placed_where_planned(rep)
    assert len(rep["checkpoint_ms"]) == 3 and min(rep["checkpoint_ms"]) > 0  # trainer 0 at 40, 80, 120
    audit_exact(rep)
    assert 1 <= rep["lag_max"] <= rep["lag_bound"] == 4  # asynchronous, and within the bound
    assert rep["eval_end"] > rep["eval_start"] + 0.03, (rep["eval_start"], rep["eval_end"])
    assert rep["fails"] == []
    times = [m["time"] for m in rep["metrics"]]
    assert times == sorted(times) and rep["updates_per_s"] > 0


def test_a_killed_generator_loses_groups_that_another_incarnation_regenerates_and_the_run_goes_on(ray_session):
    # the restart takes 3-5 s here; if the last update comes first, the controller waits for the new
    # incarnation after the loop (bounded) and gives it the final weights, so its times are always measured
    cfg = RayRunConfig(layout="pipeline", n_updates=60, kill_at=10, **SHORT)
    rep = run(cfg)
    kill, audit = rep["kill"], rep["audit"]
    audit_exact(rep)  # every sample of the 60 updates once, none of the dead incarnation's
    assert kill["u"] >= 10 and kill["lost_groups"] > 0
    assert audit["lost_groups"] == kill["lost_groups"] and audit["lost_groups_regenerated"]
    assert kill["new_pid"] != kill["old_pid"] and kill["same_process"] is False and not kill["final"]
    assert 0 < kill["detect_s"] < kill["restart_ready_s"] <= kill["rejoined_s"] < cfg.timeout_s
    assert rep["generators"][1]["incarnation"] == 1 and rep["generators"][0]["incarnation"] == 0
    assert rep["sync_group_builds"] >= 3  # everyone, the survivors, everyone again
    assert any(m["started"] > kill["at_s"] for m in rep["metrics"])  # the controller carried on
    assert rep["lag_max"] <= rep["lag_bound"]
    assert isinstance(rep["captured_stdout"], str)


def test_a_generator_cut_off_for_a_moment_is_fenced_with_a_new_epoch_not_replaced(ray_session):
    """``fault="unavailable"``: the reply of generator 1's decoding call is lost, as a passing network
    error loses it (Ray raises ``ActorUnavailableError``, "may be available later"). The controller
    cannot know which of its groups finished, so it counts them all lost and asks for them again;
    the same process, given a new epoch, drops what it held: nothing is doubled, nothing restarts.
    Before, any ``RayActorError`` was a death and this ended the run on an incarnation assert."""
    cfg = RayRunConfig(layout="pipeline", n_updates=40, kill_at=10, fault="unavailable", **SHORT)
    rep = run(cfg)
    kill, audit = rep["kill"], rep["audit"]
    audit_exact(rep)  # the groups it held and dropped were generated again, each consumed once
    assert kill["same_process"] is True and kill["new_pid"] == kill["old_pid"] and not kill["final"]
    assert kill["lost_groups"] > 0 and audit["lost_groups"] == kill["lost_groups"] and audit["lost_groups_regenerated"]
    assert rep["generators"][1]["incarnation"] == 1 and rep["gone"] == []
    assert rep["rejoins"] == [{"g": 1, "epoch": 1, "same_process": True}]
    assert kill["first_group_s"] < cfg.timeout_s  # it decoded on under its new epoch


def test_a_generator_with_no_restart_left_is_gone_and_the_survivor_finishes_the_run(ray_session):
    """``fault="kill_final"``: ``ray.kill(no_restart=True)``. The call that sees the death is a death like
    any other (groups asked for again, a probe); the probe, sent after it, raises ``ActorDiedError``
    (dead for good): the controller stops probing it, never admits to it again, and the run ends on
    generator 0."""
    cfg = RayRunConfig(layout="pipeline", n_updates=40, kill_at=10, fault="kill_final", **SHORT)
    rep = run(cfg)
    kill, audit = rep["kill"], rep["audit"]
    audit_exact(rep)
    assert kill["final"] and rep["gone"] == [1] and rep["rejoins"] == []
    assert rep["restart_expired"] == []  # gone because its probe raised ActorDiedError, not by the restart budget
    assert kill["lost_groups"] > 0 and audit["lost_groups_regenerated"]
    assert not np.isfinite(kill["restart_ready_s"])
    assert any(m["started"] > kill["at_s"] for m in rep["metrics"])  # the survivor carried the run
    assert "unavailable" in rep["generators"][1] and rep["generators"][0]["incarnation"] == 0


def test_a_generator_killed_during_a_weight_transfer_costs_a_timeout_not_a_hang_or_a_sample(ray_session):
    """Killed while trainer 0 sends it weights (engine sync): the transfer may break (the survivors
    wait out the group's timeout, ``sync_timeout_s``), the group is rebuilt without it and again with
    its new process; every sample is still consumed exactly once."""
    cfg = RayRunConfig(layout="pipeline", n_updates=40, kill_at=10, kill_during_sync=True, sync_timeout_s=2.0, **SHORT)
    t0 = time.perf_counter()
    rep = run(cfg)
    kill = rep["kill"]
    audit_exact(rep)
    assert kill["during_sync"] and kill["new_pid"] != kill["old_pid"] and kill["lost_groups"] > 0
    assert kill["restart_ready_s"] <= kill["rejoined_s"] < cfg.timeout_s
    assert rep["sync_group_builds"] >= 3 and rep["generators"][1]["incarnation"] == 1
    assert time.perf_counter() - t0 < cfg.deadline_s / 4  # no hang: a broken transfer costs sync_timeout_s


@pytest.mark.parametrize("sync", ["engine", "object_store"])
def test_a_generator_killed_with_no_call_in_flight_is_noticed_by_its_next_call_and_replaced(ray_session, sync):
    """Killed while held back (by the lag bound, or waiting for weights): nothing of its is awaited.
    Its next call fails, or Ray queues it for the new process, which declines it (it holds no group and
    no weights): either way the controller declares the death, probes, and the new incarnation rejoins.
    Before, the run then crashed (an uncaught rebuild error, "no weights yet", or the ledger's
    incarnation check)."""
    # sync_split: the generators wait for the weights while the trainers train (a pipeline seldom idles)
    cfg = RayRunConfig(layout="sync_split", sync=sync, n_updates=40, kill_at=10, kill_idle=True, **SHORT)
    rep = run(cfg)
    kill = rep["kill"]
    audit_exact(rep)
    assert kill["idle"] and kill["u"] >= 10 and kill["new_pid"] != kill["old_pid"]
    assert kill["lost_groups"] == 0  # an idle generator holds no admitted group
    assert 0 < kill["detect_s"] < kill["restart_ready_s"] <= kill["rejoined_s"] < cfg.timeout_s
    assert rep["generators"][1]["incarnation"] == 1
    assert rep["lag_max"] <= rep["lag_bound"]


def test_the_kill_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match="split layout"):
        RayRunConfig(layout="sync_colocated", kill_at=3)
    with pytest.raises(ValueError, match="sync_split"):
        RayRunConfig(layout="pipeline", max_lag=0)
    with pytest.raises(ValueError, match="layout="):
        RayRunConfig(layout="colocated")
    with pytest.raises(ValueError, match="sync="):
        dataclasses.replace(RayRunConfig(), sync="gloo")
    with pytest.raises(ValueError, match="give kill_at"):
        RayRunConfig(layout="pipeline", kill_idle=True)
    with pytest.raises(ValueError, match="give kill_at"):
        RayRunConfig(layout="pipeline", fault="kill_final")
    with pytest.raises(ValueError, match="fault="):
        RayRunConfig(layout="pipeline", kill_at=3, fault="boom")
    with pytest.raises(ValueError, match="checkpoint_every"):
        RayRunConfig(checkpoint_every=-1)
    with pytest.raises(ValueError, match="reply"):
        RayRunConfig(layout="pipeline", kill_at=3, fault="unavailable", kill_idle=True)


# ---- weight sync: engine vs object store ---------------------------------------------------------


def test_both_weight_paths_deliver_the_trainers_weights_bit_exact(ray_session):
    from course_lib.capstone_ray.syncbench import compare

    (row,) = compare(sizes=((1, 32),), reps=2)
    assert row["bit_exact"], row
    assert row["n_params"] > 0 and row["mbytes"] == pytest.approx(row["n_params"] * 4 / 1e6)
    assert row["engine_ms"] > 0 and row["object_store_ms"] > 0
    assert len(row["engine_ms_all"]) == len(row["object_store_ms_all"]) == 2
