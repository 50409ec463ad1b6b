"""The runtime floor's rank launcher (runtime/ranks.py) and the parent watchdog's expected parent."""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import pytest

from course_lib.runtime.processes import live_children, watch_parent
from course_lib.runtime.ranks import RankGroup

# multiprocessing's forkserver and resource tracker are stopped after the module (later
# suites assert the test process has no children at all)
pytestmark = pytest.mark.usefixtures("no_helpers_left_behind")


def _sum_ranks(rank: int, results: Any, scale: int) -> None:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank * scale)])
    dist.all_reduce(t)
    results.put((rank, float(t.item()), None))


def _fail_on_rank_1(rank: int, results: Any, scale: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 broke")
    results.put((rank, float(rank * scale), None))


def _failed(rank: int, exc: BaseException) -> tuple[int, None, str]:
    return (rank, None, f"{type(exc).__name__}: {exc}")


def _messages(group: RankGroup) -> dict[int, tuple[Any, Any]]:
    out: dict[int, tuple[Any, Any]] = {}
    while len(out) < group.world_size:
        rank, value, error = group.results.get(timeout=60)
        out[rank] = (value, error)
    return out


def test_a_rank_group_joins_reports_and_stops():
    with RankGroup(2, _sum_ranks, _failed, name="test-rank", preload=__name__, timeout_s=30, args=(10,)) as g:
        got = _messages(g)
        assert [p.name for p in g.processes] == ["test-rank0", "test-rank1"]
    assert got == {0: (10.0, None), 1: (10.0, None)}
    assert not live_children()


def test_a_failing_rank_reports_through_fail_and_is_stopped():
    with RankGroup(2, _fail_on_rank_1, _failed, name="test-rank", preload=__name__, timeout_s=30, args=(10,)) as g:
        got = _messages(g)
    assert got == {0: (0.0, None), 1: (None, "ValueError: rank 1 broke")}
    assert not live_children()
    with pytest.raises(RuntimeError, match="already started"):
        g.start()


def _watch_then_return(parent_pid: int) -> None:
    watch_parent(parent_pid=parent_pid)


def test_watch_parent_exits_at_once_when_the_parent_is_not_the_expected_one():
    ctx = mp.get_context("spawn")
    wrong = ctx.Process(target=_watch_then_return, args=(os.getpid() + 1_000_000,))  # never our pid
    right = ctx.Process(target=_watch_then_return, args=(os.getpid(),))
    for p in (wrong, right):
        p.start()
    for p in (wrong, right):
        p.join(60)
    assert wrong.exitcode == 3  # its parent is not the one the launcher passed: a re-parented child
    assert right.exitcode == 0


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, n: int) -> list[int]:
    """Make torch see ``n`` CUDA GPUs (none here); returns the list that fake ``set_device`` fills."""
    import torch

    chosen: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def _never_runs(rank: int, results: Any) -> None:
    raise AssertionError("no rank may start")


@pytest.mark.parametrize(("world_size", "gpus"), [(2, 1), (3, 1), (3, 2), (2, 0)])
def test_nccl_with_fewer_visible_gpus_than_ranks_is_refused_before_any_rank_starts(monkeypatch, world_size, gpus):
    _fake_gpus(monkeypatch, gpus)
    kw: dict[str, Any] = dict(name="test-rank", preload=__name__, timeout_s=30, backend="nccl")
    with pytest.raises(ValueError) as err:
        RankGroup(world_size, _never_runs, _failed, **kw)
    msg = str(err.value)
    assert f"{world_size} ranks" in msg and "one GPU per rank" in msg
    assert ("no CUDA GPU is visible" if gpus == 0 else f"only {gpus} GPU(s) are visible") in msg
    assert (f"start at most {gpus} rank(s)" in msg) == (gpus > 0)  # the ways out: fewer ranks, gloo, more GPUs
    assert "backend='gloo'" in msg and f"at least {world_size} GPUs" in msg
    assert not live_children()


def test_the_weight_sync_launcher_refuses_nccl_on_too_few_gpus_before_spawning(monkeypatch):
    from course_lib.weight_sync.config import SyncConfig
    from course_lib.weight_sync.launch import Trial, run_trials
    from course_lib.weight_sync.specs import TensorSpec

    _fake_gpus(monkeypatch, 1)
    trial = Trial(SyncConfig("bucketed", bucket_mb=0.02), (TensorSpec("w", (4, 4)),))
    with pytest.raises(ValueError, match=r"3 ranks, but only 1 GPU\(s\) are visible"):
        run_trials([trial], world_size=3, backend="nccl")
    assert not live_children()


@pytest.mark.parametrize(("world_size", "gpus"), [(1, 1), (2, 2), (2, 8)])
def test_nccl_with_a_gpu_per_rank_is_accepted(monkeypatch, world_size, gpus):
    _fake_gpus(monkeypatch, gpus)
    g = RankGroup(world_size, _never_runs, _failed, name="test-rank", preload=__name__, timeout_s=30, backend="nccl")
    assert (g.world_size, g.backend) == (world_size, "nccl")  # built, not started: no GPU is touched here


def test_gloo_needs_no_gpu_and_a_bad_backend_or_size_is_named(monkeypatch):
    _fake_gpus(monkeypatch, 0)
    kw: dict[str, Any] = dict(name="test-rank", preload=__name__, timeout_s=30)
    assert RankGroup(3, _never_runs, _failed, **kw).backend == "gloo"
    with pytest.raises(ValueError, match="unknown backend 'mpi': use one of 'gloo', 'nccl'"):
        RankGroup(2, _never_runs, _failed, backend="mpi", **kw)
    with pytest.raises(ValueError, match="world_size must be at least 1, got 0"):
        RankGroup(0, _never_runs, _failed, **kw)


class _Queue(list[Any]):
    def put(self, item: Any) -> None:
        self.append(item)


@pytest.mark.parametrize(("gpus", "want_device", "want_error"), [(2, [1], "RuntimeError: stop"), (1, [], "ValueError")])
def test_an_nccl_rank_takes_the_gpu_of_its_rank_or_reports_too_few(monkeypatch, gpus, want_device, want_error):
    """In the rank (run in-process here, torch faked): rank r takes GPU r; if it sees fewer GPUs than
    the parent did, it reports that through ``fail`` instead of sharing a GPU."""
    import torch
    import torch.distributed as dist

    from course_lib.runtime import ranks

    chosen = _fake_gpus(monkeypatch, gpus)
    monkeypatch.setattr(ranks, "watch_parent", lambda **_: None)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("stop")))
    monkeypatch.setenv("MASTER_ADDR", "unset")
    monkeypatch.setenv("MASTER_PORT", "0")
    group = ranks.GroupSpec(2, 12345, "nccl", 5.0, os.getpid())
    results = _Queue()
    ranks._rank_entry(1, group, _never_runs, _failed, Exception, results, ())
    assert chosen == want_device
    assert len(results) == 1 and results[0][0] == 1 and results[0][2].startswith(want_error)
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"  # one node: the rendezvous is this machine
