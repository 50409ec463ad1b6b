"""Fault injection for teaching and tests: a sender that breaks one update on purpose (lesson 09, section 7).

A :class:`Fault` is handed to a :class:`~course_lib.weight_sync.endpoints.Sender` (``sender.fault =
CorruptBucket(2)``; in real processes ``Trial(..., fault=CorruptBucket(2))`` arms it for the first
timed update). The bucket methods call its two hooks, which do nothing in the base class:

* :meth:`Fault.after_stage`: bucket ``b`` is packed, its header and checksum written;
* :meth:`Fault.after_post`: bucket ``b`` was handed to the transport (``work``: its handle when
  the send is asynchronous).

Production code never sets a fault: ``Sender.fault`` is ``None`` and nothing is parsed or checked
beyond that.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, replace

import torch
from torch.distributed import Work

from course_lib.weight_sync.config import SyncConfig
from course_lib.weight_sync.integrity import HEADER_BYTES, BucketHeader


@dataclass(frozen=True)
class Fault:
    """No fault: the hooks every fault may override."""

    def check(self, config: SyncConfig) -> None:
        """Raise ``ValueError`` if this fault cannot be injected into ``config``'s method."""
        if not config.bucketed:
            raise ValueError(f"faults are injected into the bucket stream (bucketed, pipelined), not {config.method!r}")

    def after_stage(self, b: int, slot: torch.Tensor) -> None:
        """Bucket ``b`` is in ``slot`` (payload, then the header with its checksum)."""

    def after_post(self, b: int, work: Work | None) -> None:
        """Bucket ``b`` was handed to the transport (``work``: the handle of an asynchronous send, else ``None``)."""


@dataclass(frozen=True)
class CorruptBucket(Fault):
    """One bit of bucket ``bucket`` flipped after its checksum was taken (the receiver: CorruptBucketError)."""

    bucket: int

    def check(self, config: SyncConfig) -> None:
        super().check(config)
        if config.in_place:
            raise ValueError("corrupting a bucket needs a staging buffer (in_place=False): it would damage the weights")

    def after_stage(self, b: int, slot: torch.Tensor) -> None:
        if b == self.bucket:
            payload = slot[:-HEADER_BYTES]
            payload[payload.numel() // 2] ^= 0x10


@dataclass(frozen=True)
class ReorderBuckets(Fault):
    """Buckets ``first`` and ``second`` sent with swapped indices (the receiver: OutOfOrderBucketError)."""

    first: int = 1
    second: int = 2

    def after_stage(self, b: int, slot: torch.Tensor) -> None:
        swap = {self.first: self.second, self.second: self.first}
        if b in swap:
            replace(BucketHeader.read(slot), index=swap[b]).write(slot)


@dataclass(frozen=True)
class StaleVersion(Fault):
    """Every bucket labelled with the previous version (the receiver: OutOfOrderBucketError)."""

    def after_stage(self, b: int, slot: torch.Tensor) -> None:
        header = BucketHeader.read(slot)
        replace(header, version=header.version - 1).write(slot)


@dataclass(frozen=True)
class KillSender(Fault):
    """The sender killed with ``SIGKILL`` once bucket ``after_bucket`` is on the wire (the receiver: SenderLostError)."""

    after_bucket: int

    def after_post(self, b: int, work: Work | None) -> None:
        if b == self.after_bucket:
            if work is not None:
                work.wait()
            os.kill(os.getpid(), signal.SIGKILL)
