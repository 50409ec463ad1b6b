"""A process group outside torch.distributed's default world: :class:`StandaloneGroup`.

``torch.distributed.init_process_group`` gives a process *one* default world, and
``new_group`` only carves subgroups out of it. A Ray trainer actor is already in its trainer
group (the two trainers' gradient all-reduce: its default world); the weight-sync group spans
trainer 0 and the generators, another membership, and must be rebuilt when a generator
restarts without touching the trainers' group. (``ray.util.collective``'s gloo backend cannot
help: it also initialises the default group, once per process.)

What vLLM's ``StatelessProcessGroup``, OpenRLHF and NeMo-RL do instead, and what this module
does: a gloo group of its own, ``ProcessGroupGloo(PrefixStore(prefix, store), rank, size)``,
from a ``TCPStore`` that someone (here: the Ray controller) hosts on 127.0.0.1. Every
rebuild uses a new ``prefix`` (one per *epoch*), so the members of a new group never read a
dead group's keys. The group is not registered with torch.distributed (``dist.get_rank(g)``
refuses it), so lesson 09's engine talks to it through
:mod:`course_lib.weight_sync.comm`, which accepts a :class:`StandaloneGroup` wherever it
accepts a process group.

Every collective waits at most ``timeout_s``: a member that never joins or dies mid-transfer
costs the others that long, and then an error (gloo: a ``RuntimeError``).
"""

from __future__ import annotations

import datetime
import pickle
from typing import Any

import torch
import torch.distributed as dist


class StandaloneGroup:
    """A gloo group of ``size`` ranks built from the store at ``host:port`` under key ``prefix``.

    Building it is a rendezvous: it returns once all ``size`` members have built theirs with
    the same ``prefix``, or raises :class:`TimeoutError` after ``timeout_s``. ``store``: an
    existing store to use instead of connecting a client to ``host:port``.

    Raises:
        ValueError: ``size < 1``, ``rank`` outside ``0 .. size - 1``, ``timeout_s <= 0`` or an
            empty ``prefix``.
        TimeoutError: not every member joined within ``timeout_s`` (or the store did not answer).
    """

    backend = "gloo"

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str,
        rank: int,
        size: int,
        timeout_s: float = 30.0,
        store: dist.Store | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"size={size}: a group has at least one member")
        if not 0 <= rank < size:
            raise ValueError(f"rank={rank} is not a rank of a group of size {size} (0 .. {size - 1})")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s}: every wait of the group needs a positive bound")
        if not prefix:
            raise ValueError("prefix is empty: give every group (every rebuild) a key prefix of its own")
        self.prefix, self.timeout_s = prefix, float(timeout_s)
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            self.store = store or dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
            self.pg: Any = dist.ProcessGroupGloo(dist.PrefixStore(prefix, self.store), rank, size, timeout)
        except (dist.DistStoreError, dist.DistNetworkError) as exc:  # the store: no answer, or the others never came
            raise TimeoutError(
                f"StandaloneGroup {prefix!r}: rank {rank} of {size} gave up after {timeout_s} s waiting for "
                f"the store at {host}:{port} or for the other members to join ({exc})"
            ) from exc

    def __repr__(self) -> str:
        return f"StandaloneGroup({self.prefix!r}, rank={self.rank()}, size={self.size()})"

    def rank(self) -> int:
        """This member's rank in the group."""
        return int(self.pg.rank())

    def size(self) -> int:
        """How many members the group has."""
        return int(self.pg.size())

    def broadcast(self, tensor: torch.Tensor, src: int, async_op: bool = False) -> dist.Work | None:
        """Broadcast ``tensor`` from rank ``src`` (in place); with ``async_op`` return the handle."""
        opts = dist.BroadcastOptions()
        opts.rootRank = src
        opts.rootTensor = 0
        work = self.pg.broadcast([tensor], opts)
        if async_op:
            return work
        work.wait()
        return None

    def all_reduce(self, tensor: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        """Reduce ``tensor`` over the group with ``op``, in place on every member (blocking)."""
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        self.pg.allreduce([tensor], opts).wait()

    def broadcast_object(self, obj: Any, src: int) -> Any:
        """Rank ``src``'s ``obj`` (pickled) on every member; ``obj`` is ignored elsewhere."""
        if self.rank() == src:
            payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
            n = torch.tensor([payload.numel()], dtype=torch.int64)
        else:
            n = torch.zeros(1, dtype=torch.int64)
        self.broadcast(n, src)
        if self.rank() != src:
            payload = torch.empty(int(n.item()), dtype=torch.uint8)
        self.broadcast(payload, src)
        return obj if self.rank() == src else pickle.loads(payload.numpy().tobytes())
