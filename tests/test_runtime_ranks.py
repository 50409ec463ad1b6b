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
