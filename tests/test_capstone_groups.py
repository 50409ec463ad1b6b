"""The capstone's subgroups fail after the job's timeout, not the backend's default (30 min for gloo)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from course_lib.runtime.processes import live_children
from course_lib.runtime.ranks import RankGroup

pytestmark = pytest.mark.usefixtures("no_helpers_left_behind")

GROUP_TIMEOUT_S = 2.0


def _trainer_waits_for_a_silent_peer(rank: int, results: Any) -> None:
    import torch
    import torch.distributed as dist

    from course_lib.capstone.job import subgroups

    trainers, _sync = subgroups([0, 1], [0, 2], GROUP_TIMEOUT_S)  # every rank creates both, in order
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(1), group=trainers)  # rank 1 never joins this one
            results.put((rank, time.monotonic() - t0, None))
        except Exception as exc:
            results.put((rank, time.monotonic() - t0, type(exc).__name__))
    else:
        time.sleep(6 * GROUP_TIMEOUT_S)  # alive but silent: only a timeout can end rank 0's wait
        results.put((rank, 0.0, None))


def _failed(rank: int, exc: BaseException) -> tuple[int, None, str]:
    return (rank, None, f"{type(exc).__name__}: {exc}")


def test_a_subgroup_collective_fails_after_the_jobs_timeout():
    with RankGroup(
        3, _trainer_waits_for_a_silent_peer, _failed, name="test-groups", preload=__name__, timeout_s=120
    ) as g:
        got = {}
        while len(got) < 3:
            rank, seconds, error = g.results.get(timeout=60)
            got[rank] = (seconds, error)
    seconds, error = got[0]
    assert error is not None, "the all-reduce with a silent peer returned instead of timing out"
    assert GROUP_TIMEOUT_S * 0.5 <= seconds < 4 * GROUP_TIMEOUT_S, seconds  # the group's timeout, not the world's 120 s
    assert not live_children()
