"""Bucket plans: where every tensor's bytes live in a few flat buffers (eq. 09.2).

A plan is the metadata of one update, computed once and sent once: for each tensor its
name, shape, dtype, bucket and byte offset. Packing copies tensors into a flat ``uint8``
buffer at their offsets; unpacking views the same bytes back as tensors. Offsets are
aligned to :data:`ALIGN` bytes so that every view is aligned for its dtype and the
checksum can read the buffer as 8-byte words. A tensor larger than the bucket size gets a
bucket of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from course_lib.weight_sync.specs import TensorSpec

ALIGN = 64  # bytes; a multiple of every dtype's size and of the checksum's 8-byte word


@dataclass(frozen=True)
class TensorMeta:
    """Where one tensor's bytes are: ``bucket`` and ``offset`` (bytes) in it; ``dtype`` on the wire."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    bucket: int
    offset: int
    nbytes: int
    tp_dim: int | None = None


@dataclass(frozen=True)
class BucketPlan:
    """All tensors' places, and each bucket's size in bytes (a multiple of :data:`ALIGN`)."""

    metas: tuple[TensorMeta, ...]
    bucket_nbytes: tuple[int, ...]

    @property
    def n_buckets(self) -> int:
        return len(self.bucket_nbytes)

    @property
    def total_nbytes(self) -> int:
        return sum(self.bucket_nbytes)

    def in_bucket(self, index: int) -> list[TensorMeta]:
        """The tensors of bucket ``index``, in offset order."""
        return [m for m in self.metas if m.bucket == index]

    def max_bucket_nbytes(self) -> int:
        return max(self.bucket_nbytes)


def aligned(n: int, align: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``align``."""
    return -(-n // align) * align


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int, wire_dtype: torch.dtype | None = None) -> BucketPlan:
    """Assign tensors, in order, to buckets of at most ``bucket_bytes`` (eq. 09.2).

    Greedy in order: a tensor goes at the next aligned offset of the current bucket if it
    fits, else it opens a new bucket; a tensor larger than ``bucket_bytes`` fills a bucket
    alone. ``wire_dtype`` (e.g. ``torch.bfloat16``) changes the floating tensors' dtype on
    the wire, hence their size.

    Raises:
        ValueError: if ``bucket_bytes`` is not positive or ``specs`` is empty or has a repeated name.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    if not specs:
        raise ValueError("specs is empty: nothing to send")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("specs has repeated tensor names; every tensor needs a unique name")
    metas: list[TensorMeta] = []
    sizes: list[int] = []
    offset = 0
    for s in specs:
        dtype = wire_dtype if wire_dtype is not None and s.dtype.is_floating_point else s.dtype
        nbytes = s.numel * torch.empty((), dtype=dtype).element_size()
        if not sizes or (offset > 0 and offset + nbytes > bucket_bytes):
            if sizes:
                sizes[-1] = aligned(offset)
            sizes.append(0)
            offset = 0
        metas.append(TensorMeta(s.name, tuple(s.shape), dtype, len(sizes) - 1, offset, nbytes, s.tp_dim))
        offset = aligned(offset + nbytes)
    sizes[-1] = aligned(offset)
    return BucketPlan(tuple(metas), tuple(sizes))


def view(flat: torch.Tensor, meta: TensorMeta) -> torch.Tensor:
    """The tensor ``meta`` describes, as a view of the flat ``uint8`` buffer ``flat`` (no copy)."""
    return flat[meta.offset : meta.offset + meta.nbytes].view(meta.dtype).view(meta.shape)


def pack(tensors: dict[str, torch.Tensor], metas: list[TensorMeta], flat: torch.Tensor) -> torch.Tensor:
    """Copy each tensor of ``metas`` into ``flat`` at its offset (casting to the wire dtype); return ``flat``.

    Raises:
        KeyError: naming a tensor the plan holds and ``tensors`` lacks.
        ValueError: if a tensor's shape differs from the plan's.
    """
    for m in metas:
        if m.name not in tensors:
            raise KeyError(f"pack: the plan holds {m.name!r} but the weights have no such tensor")
        src = tensors[m.name]
        if tuple(src.shape) != m.shape:
            raise ValueError(f"pack: {m.name!r} has shape {tuple(src.shape)}, the plan says {m.shape}")
        view(flat, m).copy_(src)
    return flat


def unpack(flat: torch.Tensor, metas: list[TensorMeta]) -> dict[str, torch.Tensor]:
    """Views of every tensor of ``metas`` in ``flat`` (no copy: copy them out before reusing ``flat``)."""
    return {m.name: view(flat, m) for m in metas}
