"""``course_lib.runtime.groups.StandaloneGroup`` and lesson 09's engine on it (no Ray needed).

The members of a group are threads of this process (gloo groups are independent objects, so a
process may hold several members, as it may hold several groups); the store is a ``TCPStore``
on 127.0.0.1 hosted by the test, as the Ray controller hosts it. Every wait is bounded: each
group has a short gloo timeout and every thread is joined with a deadline.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from course_lib.runtime.groups import StandaloneGroup
from course_lib.runtime.processes import free_port
from course_lib.weight_sync import comm
from course_lib.weight_sync.config import SyncConfig
from course_lib.weight_sync.endpoints import Receiver, Sender
from course_lib.weight_sync.specs import TensorSpec

HOST = "127.0.0.1"
TIMEOUT_S = 2.0  # the groups' gloo timeout: what a missing member costs the others
JOIN_S = 30.0  # the most a test waits for its threads
SPECS = [TensorSpec("a.weight", (33, 17)), TensorSpec("b.bias", (5,)), TensorSpec("c.weight", (64, 64))]
CONFIG = SyncConfig(method="pipelined", bucket_mb=0.01)  # several buckets for these few KB


@pytest.fixture
def store() -> Iterator[tuple[int, Any]]:
    port = free_port()
    master = dist.TCPStore(HOST, port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10))
    yield port, master
    del master


def in_threads(n: int, body: Callable[[int], Any]) -> dict[int, Any]:
    """``body(r)`` for r in 0..n-1, each in a thread; returns each result or the exception it raised."""
    out: dict[int, Any] = {}

    def run(r: int) -> None:
        try:
            out[r] = body(r)
        except BaseException as exc:
            out[r] = exc

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    end = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), f"a member did not finish within {JOIN_S} s"
    return out


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + version)
    return {s.name: torch.randn(s.shape, generator=g) for s in SPECS}


def test_collectives_run_outside_the_default_world(store):
    port, _ = store

    def member(r: int) -> tuple[Any, ...]:
        g = StandaloneGroup(HOST, port, "t/0", r, 3, TIMEOUT_S)
        x = torch.full((4,), float(r))
        g.broadcast(x, src=1)
        y = torch.tensor([float(r + 1)])
        g.all_reduce(y)
        z = torch.tensor([r], dtype=torch.int64)
        g.all_reduce(z, dist.ReduceOp.MAX)
        obj = g.broadcast_object({"plan": [r, "from", r]}, src=2)
        return g.rank(), g.size(), comm.rank(g), comm.world_size(g), comm.device(g), x, y.item(), z.item(), obj

    out = in_threads(3, member)
    for r in range(3):
        assert not isinstance(out[r], BaseException), out[r]
        rank, size, crank, cworld, dev, x, y, z, obj = out[r]
        assert (rank, size, crank, cworld, dev) == (r, 3, r, 3, torch.device("cpu"))
        assert torch.equal(x, torch.full((4,), 1.0))  # rank 1's tensor everywhere
        assert y == 6.0 and z == 2
        assert obj == {"plan": [2, "from", 2]}
    assert not dist.is_initialized()  # none of it touched torch.distributed's default world


def _transfer(port: int, prefix: str, size: int, versions: list[int], idle: int | None = None) -> dict[int, Any]:
    """Lesson 09's engine on a StandaloneGroup: rank 0 sends ``versions`` in turn, the others receive
    and return what they hold after each; rank ``idle`` joins the group but never takes part."""

    def member(r: int) -> Any:
        g = StandaloneGroup(HOST, port, prefix, r, size, TIMEOUT_S)
        if r == 0:
            sender = Sender(CONFIG, SPECS, group=g)  # type: ignore[arg-type]  # comm accepts a StandaloneGroup
            return [sender.send(weights(v), v).total for v in versions]
        receiver = Receiver(CONFIG, SPECS, group=g)  # type: ignore[arg-type]
        if r == idle:
            time.sleep(3 * TIMEOUT_S)  # alive, holding its end, taking no part
            return None
        held: list[Any] = []
        for v in versions:
            try:
                receiver.receive(v)
            except Exception as exc:
                held.append(exc)
            held.append({k: t.clone() for k, t in receiver.store.active.items()})
        return held

    return in_threads(size, member)


def test_engine_delivers_bit_exact_weights_on_a_standalone_group(store):
    port, _ = store
    out = _transfer(port, "sync/0", 3, [1, 2])
    assert not isinstance(out[0], BaseException), out[0]
    for r in (1, 2):
        assert not isinstance(out[r], BaseException), out[r]
        for held, v in zip(out[r], [1, 2]):
            assert set(held) == {s.name for s in SPECS}
            for name, t in weights(v).items():
                assert torch.equal(held[name], t), (r, v, name)  # bit-exact, not close


def test_a_member_that_never_joins_costs_the_timeout_then_the_group_is_rebuilt_smaller(store):
    port, _ = store
    t0 = time.perf_counter()
    out = in_threads(2, lambda r: StandaloneGroup(HOST, port, "sync/0", r, 3, TIMEOUT_S))  # rank 2 never comes
    waited = time.perf_counter() - t0
    for r in (0, 1):
        assert isinstance(out[r], TimeoutError), out[r]
        assert "sync/0" in str(out[r]) and f"rank {r} of 3" in str(out[r])
    assert TIMEOUT_S * 0.9 <= waited < TIMEOUT_S + 10
    # the survivors, on a new prefix (epoch): a group of 2 that works
    out = _transfer(port, "sync/1", 2, [5])
    assert not isinstance(out[1], BaseException), out[1]
    for name, t in weights(5).items():
        assert torch.equal(out[1][0][name], t)


def test_a_member_gone_mid_transfer_leaves_the_others_weights_then_a_rebuilt_group_delivers(store):
    """Rank 2 holds its end but takes no part (as a dead generator): the update fails within the
    group's timeout, receiver 1 keeps what it held (all-or-nothing), and a new group without
    rank 2 delivers bit-exact weights."""
    port, _ = store
    t0 = time.perf_counter()
    out = _transfer(port, "sync/0", 3, [1], idle=2)
    waited = time.perf_counter() - t0
    assert isinstance(out[0], BaseException), "the sender cannot have completed an update rank 2 never took"
    error, held = out[1]
    assert isinstance(error, Exception), error
    assert all(torch.equal(t, torch.zeros_like(t)) for t in held.values())  # nothing half-written
    assert waited < 3 * TIMEOUT_S + 10  # bounded: rank 2's sleep, not a hang
    out = _transfer(port, "sync/1", 2, [1])
    assert not isinstance(out[0], BaseException) and not isinstance(out[1], BaseException), out
    for name, t in weights(1).items():
        assert torch.equal(out[1][0][name], t)


@pytest.mark.parametrize(
    "rank, size, timeout_s, prefix, words",
    [
        (0, 0, 1.0, "p", "size=0"),
        (3, 3, 1.0, "p", "rank=3"),
        (0, 2, 0.0, "p", "timeout_s=0"),
        (0, 2, 1.0, "", "prefix"),
    ],
)
def test_bad_arguments_are_refused_naming_them(rank, size, timeout_s, prefix, words):
    with pytest.raises(ValueError, match=words):
        StandaloneGroup(HOST, 1, prefix, rank, size, timeout_s)


def test_no_store_is_a_bounded_timeout_error():
    port = free_port()  # nothing listens there
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match=f"{HOST}:{port}"):
        StandaloneGroup(HOST, port, "p", 0, 2, 1.0)
    assert time.perf_counter() - t0 < 15
