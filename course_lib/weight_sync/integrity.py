"""Versions, bucket headers, checksums, and the errors a receiver raises.

Every bucket travels with a header of :data:`HEADER_WORDS` int64 words appended to its
buffer (so one message carries both): the update's version, the bucket's index, the
number of buckets, the payload size and a checksum of the payload bytes.

**Checksum.** ``sum64``: the sum of the payload read as unsigned 64-bit words, modulo
2^64 (numpy's wrapping add), stored as the int64 with the same 64 bits. It runs at memory speed (~5-10 GB/s here, against ~2 GB/s for
``zlib.crc32``), which matters because it is computed on every byte on both sides; it
catches bit flips, truncation and stale or zeroed buffers, which is what a transport or a
reused buffer does wrong. It does not catch two words swapped (CRC32 does), so
``crc32`` is available as an option (``SyncConfig.checksum``).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch

HEADER_WORDS = 8
HEADER_BYTES = HEADER_WORDS * 8
MAGIC = 0x5753594E43  # "WSYNC"


class WeightSyncError(RuntimeError):
    """Base class: an update was rejected; the receiver kept its previous weights."""


class CorruptBucketError(WeightSyncError):
    """A bucket's checksum does not match its bytes."""


class OutOfOrderBucketError(WeightSyncError):
    """A bucket arrived with an unexpected index or version."""


class ShapeMismatchError(WeightSyncError):
    """The sender's plan and the receiver's model disagree on a tensor (missing, shape or dtype)."""


class SenderLostError(WeightSyncError):
    """The transfer stopped in the middle (the sender died or timed out)."""


def checksum(payload: torch.Tensor, kind: str = "sum64") -> int:
    """Checksum of a flat ``uint8`` tensor whose length is a multiple of 8 (``sum64`` or ``crc32``)."""
    if payload.device.type != "cpu":  # on a GPU: the same wrapping 64-bit sum, as a torch reduction
        if kind == "sum64":
            if payload.numel() % 8:
                raise ValueError(f"sum64 needs a multiple of 8 bytes, got {payload.numel()}")
            return int(payload.view(torch.int64).sum()) if payload.numel() else 0
        payload = payload.cpu()
    data = payload.numpy()
    if kind == "crc32":
        return zlib.crc32(np.ascontiguousarray(data).data)
    if kind == "sum64":
        if data.size % 8:
            raise ValueError(f"sum64 needs a multiple of 8 bytes, got {data.size}; pad the bucket (buckets.aligned)")
        total = int(np.add.reduce(data.view(np.uint64), dtype=np.uint64)) if data.size else 0
        return total - 2**64 if total >= 2**63 else total  # the same 64 bits, as the int64 header word holds them
    raise ValueError(f"checksum kind must be 'sum64' or 'crc32', got {kind!r}")


@dataclass(frozen=True)
class BucketHeader:
    """What travels with every bucket (eq. 09.6's bookkeeping)."""

    version: int
    index: int
    n_buckets: int
    nbytes: int
    checksum: int

    def write(self, buffer: torch.Tensor) -> None:
        """Write into the last :data:`HEADER_BYTES` of the flat ``uint8`` ``buffer``."""
        words = buffer[-HEADER_BYTES:].view(torch.int64)
        words.copy_(torch.tensor([MAGIC, self.version, self.index, self.n_buckets, self.nbytes, self.checksum, 0, 0]))

    @staticmethod
    def read(buffer: torch.Tensor) -> BucketHeader:
        words = buffer[-HEADER_BYTES:].view(torch.int64).tolist()
        if words[0] != MAGIC:
            raise CorruptBucketError("bucket header is damaged (bad magic number): the buffer is not a bucket")
        return BucketHeader(*words[1:6])


def verify_bucket(
    payload: torch.Tensor, header: BucketHeader, *, version: int, index: int, kind: str = "sum64"
) -> None:
    """Check a received bucket against what the receiver expects (version, then order, then bytes).

    Raises:
        OutOfOrderBucketError: wrong version or index.
        CorruptBucketError: wrong size or checksum.
    """
    if header.version != version:
        raise OutOfOrderBucketError(
            f"bucket {header.index} belongs to version {header.version}, expected version "
            f"{version}: a stale or future update; rejected"
        )
    if header.index != index:
        raise OutOfOrderBucketError(
            f"expected bucket {index} of version {version}, got bucket {header.index}: "
            "buckets arrived out of order; rejected"
        )
    if header.nbytes != payload.numel():
        raise CorruptBucketError(
            f"bucket {index} of version {version} says {header.nbytes} bytes, the plan says {payload.numel()}; rejected"
        )
    got = checksum(payload, kind)
    if got != header.checksum:
        raise CorruptBucketError(
            f"bucket {index} of version {version} is corrupt: {kind} checksum "
            f"{got % 2**64:#018x} != {header.checksum % 2**64:#018x} sent; rejected"
        )
