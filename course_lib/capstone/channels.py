"""How new weights reach the generators: lesson 09's engine on its own process group, or a shared buffer.

Both channels move the weights of trainer rank 0's model into every generator's model, and
say how long it took (:class:`SyncTiming`). Trainer 0 first *announces* the version in the
rendezvous store; a generator notices between two decoding steps, joins the transfer, loads
the weights and goes on decoding with its KV cache kept (the in-flight update of lesson 07).

* :class:`BroadcastChannel`: lesson 09's :class:`~course_lib.weight_sync.endpoints.Sender` and
  :class:`~course_lib.weight_sync.endpoints.Receiver` (bucketed, pipelined, checksummed,
  all-or-nothing) on the *sync group* (trainer 0 + generators, ``torch.distributed.new_group``):
  the other trainers take no part in the transfer, but they do wait for it: trainer 0 sends
  before its next update, so they sit in that update's all-reduce meanwhile (lesson
  11, sections 3 and 5: the other trainers' all-reduce time exceeds trainer 0's by about
  the send).
* :class:`SharedBufferChannel`: colocated mode (:mod:`course_lib.capstone.colocated`): no
  collective, the trainer writes, generators on the same host re-point their parameters at
  the new slot when they notice (one copy per update in all).

**The engine on a process group.** Lesson 09's endpoints take the process group they run on
(``Sender(config, specs, group=sync_group)``); every collective of the engine then runs on
that group, with group rank 0 as the source (trainer 0: global rank 0 is the sync group's
rank 0, see :mod:`.roles`) and group ranks for everything else, so the other trainers take
no part in a weight transfer.

Engine versions start at 1 (its receivers hold version 0 before the first update, and
commit only newer versions): policy version ``v`` travels as engine version ``v + 1``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from course_lib.capstone.colocated import SharedBuffer
from course_lib.weight_sync.config import SyncConfig
from course_lib.weight_sync.endpoints import Receiver, Sender
from course_lib.weight_sync.specs import TensorSpec


@dataclass
class SyncTiming:
    """Seconds of one weight update on one side (``stage``/``transfer``/``reload`` as lesson 09's
    :class:`~course_lib.weight_sync.config.Phases`), and the bytes moved."""

    total: float
    stage: float = 0.0
    transfer: float = 0.0
    reload: float = 0.0
    load: float = 0.0  # receiver: copying the committed weights into the model
    nbytes: int = 0
    version: int = -1  # the policy version the receiver now holds (colocated: possibly newer than announced)
    wait: float = 0.0  # colocated sender: waiting for the generators to leave the slot it overwrites

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class WeightChannel(Protocol):
    """Trainer 0 ``send`` s version ``v`` of its model; every generator ``receive`` s it into its own.

    ``announce_first``: trainer 0 announces before sending (a collective: the generators must
    join it) or after (a buffer: the weights must be there when a generator looks).
    """

    announce_first: bool

    def send(self, model: nn.Module, version: int) -> SyncTiming: ...

    def receive(self, model: nn.Module, version: int) -> SyncTiming: ...


def model_specs(model: nn.Module) -> list[TensorSpec]:
    """The engine's description of ``model``'s parameters (names, shapes, dtypes)."""
    return [TensorSpec(name, tuple(p.shape), p.dtype) for name, p in model.named_parameters()]


def _nbytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class BroadcastChannel:
    """Lesson 09's engine on the sync group (see the module docstring); trainer 0 is the sender.

    Building it is the engine's handshake (a collective of the sync group): every member
    builds its end at the same point of the program.
    """

    announce_first = True

    def __init__(self, group: dist.ProcessGroup, sender: bool, model: nn.Module, config: SyncConfig) -> None:
        self.end: Sender | Receiver = (Sender if sender else Receiver)(config, model_specs(model), group=group)
        self.nbytes = _nbytes(model)

    def send(self, model: nn.Module, version: int) -> SyncTiming:
        assert isinstance(self.end, Sender)
        weights = {name: p.detach() for name, p in model.named_parameters()}
        ph = self.end.send(weights, version + 1)
        return SyncTiming(
            ph.total, stage=ph.stage, transfer=ph.transfer, reload=ph.reload, nbytes=self.nbytes, version=version
        )

    def receive(self, model: nn.Module, version: int) -> SyncTiming:
        """Receive ``version`` into ``model`` (all-or-nothing: a rejected update raises and the model is untouched)."""
        assert isinstance(self.end, Receiver)
        ph = self.end.receive(version + 1)
        t0 = time.perf_counter()
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(self.end.store.active[name])
        load = time.perf_counter() - t0
        return SyncTiming(
            ph.total + load,
            stage=ph.stage,
            transfer=ph.transfer,
            reload=ph.reload,
            load=load,
            nbytes=self.nbytes,
            version=version,
        )


class SharedBufferChannel:
    """Colocated mode: trainer 0 writes its parameters into a :class:`SharedBuffer`; a same-host
    generator points its own parameters at the new slot when it notices the announcement (no
    collective, no copy on its side). The buffer holds ``v + 1`` for policy version ``v``
    (0: nothing published yet). ``reader``: the generator's index among the generators
    (``None`` on trainer 0)."""

    announce_first = False

    def __init__(self, buffer: SharedBuffer, reader: int | None, timeout_s: float) -> None:
        self.buffer, self.reader, self.timeout_s = buffer, reader, timeout_s

    def send(self, model: nn.Module, version: int) -> SyncTiming:
        wait, copy = self.buffer.publish(list(model.parameters()), version + 1, self.timeout_s)
        return SyncTiming(wait + copy, stage=copy, wait=wait, nbytes=self.buffer.nbytes, version=version)

    def receive(self, model: nn.Module, version: int) -> SyncTiming:
        assert self.reader is not None
        t0 = time.perf_counter()
        got = self.buffer.attach(list(model.parameters()), self.reader, self.timeout_s) - 1
        seconds = time.perf_counter() - t0
        if got < version:
            raise RuntimeError(f"the shared buffer holds version {got}, older than the announced {version}")
        return SyncTiming(seconds, reload=seconds, nbytes=self.buffer.nbytes, version=got)

    def close(self) -> None:
        """A generator leaving: its slot is free for the writer."""
        if self.reader is not None:
            self.buffer.release(self.reader)
