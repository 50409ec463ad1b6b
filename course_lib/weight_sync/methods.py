"""The weight-sync methods: one class each, behind one interface (:class:`SyncMethod`).

* :class:`Naive` (09.1): save a safetensors file; receivers load it, copy it into the model, read it.
* :class:`PerTensor` (09.1): one ``dist.broadcast`` per tensor, straight into the receiver's model.
* :class:`Flat` (09.1): one broadcast of a single, already packed buffer: the roofline. With
  ``verify=True`` the sender checksums it (sum64) and the receiver verifies it: the like-for-like
  roofline of the checksummed methods.
* :class:`Prestaged` (09.1): the bucketed broadcast's transfer alone, buckets packed beforehand.
* :class:`Bucketed` (09.2): pack a bucket of ``bucket_mb``, broadcast it, verify, unpack; then the next.
* :class:`Pipelined` (09.3): the same with two buffers: pack next / send current / unpack previous.
* :class:`ZeroCopyPipelined` (09.3): ``pipelined`` with ``in_place``: every bucket in flight at
  once, checksummed and verified beside the transfer.

:func:`method_class` is the one place a :class:`SyncConfig` picks its class. Every method
runs on both sides of an update in named steps, each timed into :class:`Phases`: the sender
**stages** (save, pack, checksum) and **transfers**; every receiver **transfers** and
**reloads** (load, verify, unpack into its staging weights). The bucket methods share
:class:`BucketMethod`'s per-bucket ``stage`` and ``reload`` and differ only in how they
schedule the transfer.

Options of the bucket methods: ``reshard`` (each receiver keeps its tensor-parallel shard,
09.5), ``wire_dtype="bf16"`` (half the bytes), ``delta`` (send ``W_new - W_old``, with the
sender tracking what receivers hold so rounding errors do not pile up) and ``in_place``
(zero-copy: both sides keep their weights as views of bucket-layout storage, so there is
nothing to pack or unpack; only checksums and verification remain).

Integrity (09.6): every bucket carries a header (version, index, size, checksum); a
receiver that finds a bad bucket keeps receiving (so that no rank is left waiting), then
all ranks all-reduce a status code and everyone raises; only a fully verified update is
committed (by the :class:`~course_lib.weight_sync.endpoints.Receiver`).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch
from torch.distributed import ProcessGroup, Work

from course_lib.weight_sync import comm
from course_lib.weight_sync.buckets import BucketPlan, plan_buckets
from course_lib.weight_sync.config import WIRE_DTYPES, Phases, SyncConfig
from course_lib.weight_sync.integrity import (
    HEADER_BYTES,
    BucketHeader,
    CorruptBucketError,
    OutOfOrderBucketError,
    ShapeMismatchError,
    WeightSyncError,
    checksum,
    verify_bucket,
)
from course_lib.weight_sync.specs import TensorSpec

if TYPE_CHECKING:
    from course_lib.weight_sync.endpoints import Receiver, Sender

__all__ = [
    "BucketMethod",
    "Bucketed",
    "Flat",
    "Naive",
    "PerTensor",
    "Phases",
    "Pipelined",
    "Prestaged",
    "SyncConfig",
    "SyncMethod",
    "ZeroCopyPipelined",
    "method_class",
]

Weights = dict[str, torch.Tensor]


class SyncMethod(ABC):
    """One weight-sync method: both sides of one update.

    ``send`` (group rank 0) returns the all-reduced status code (0: every receiver accepted);
    ``receive`` (every other rank of the group) writes into ``receiver.store.staging`` and
    returns the error that rejects the update, or ``None``. Both add each step's seconds to
    ``ph``. Every collective runs on ``group`` (``None``: the default process group).
    """

    #: False for a roofline that moves bytes only: the receiver's weights are not written.
    delivers_weights: ClassVar[bool] = True

    def __init__(
        self, config: SyncConfig, plan: BucketPlan, device: torch.device, group: ProcessGroup | None = None
    ) -> None:
        self.config = config
        self.plan = plan
        self.device = device
        self.group = group

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from the sender to the group (blocking)."""
        comm.broadcast(tensor, self.group)

    def post(self, tensor: torch.Tensor) -> Work:
        """Start a broadcast of ``tensor`` from the sender; returns the handle to wait on."""
        return comm.post(tensor, self.group)

    def small(self, value: int) -> torch.Tensor:
        """A control message (a version, a status code) on this rank's device."""
        return comm.small(value, self.device)

    def all_reduce_status(self, code: int) -> int:
        """Every rank's status code in, the worst (largest) out."""
        return comm.all_reduce_status(code, self.group, self.device)

    @classmethod
    def make_plan(cls, config: SyncConfig, specs: list[TensorSpec]) -> BucketPlan:
        """The sender's plan: without buckets, one bucket holding every tensor (the metadata, sent once)."""
        return plan_buckets(specs, 2**62)

    @property
    def stream(self) -> str:
        """The messages of one update, in words (for the error a broken transfer gives)."""
        return f"message stream of {len(self.plan.metas)}"

    @abstractmethod
    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int: ...

    @abstractmethod
    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None: ...


class Naive(SyncMethod):
    """Through storage: save a safetensors file (stage); receivers load it, copy it into the model, read it (reload)."""

    def path(self, version: int) -> Path:
        return Path(self.config.workdir) / f"weights-v{version}.safetensors"

    def save(self, weights: Weights, version: int) -> Path:
        """Write the checkpoint; with ``evict_cache`` durable and out of the page cache, as another machine reads it."""
        from safetensors.torch import save_file

        path = self.path(version)
        save_file({n: w.contiguous().cpu() for n, w in weights.items()}, str(path))
        if self.config.evict_cache:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return path

    def load(self, staging: Weights, version: int) -> None:
        """Load the checkpoint of ``version`` into ``staging``, then read every tensor once (proof it is there)."""
        from safetensors.torch import load_file

        loaded = load_file(str(self.path(version)), device=str(self.device))
        for name, dst in staging.items():
            if name not in loaded or tuple(loaded[name].shape) != tuple(dst.shape):
                raise ShapeMismatchError(f"checkpoint tensor {name!r} is missing or has another shape")
            dst.copy_(loaded[name])
        del loaded
        float(sum(float(t.sum()) for t in staging.values()))

    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int:
        with ph.timed("stage"):
            path = self.save(weights, version)
        with ph.timed("transfer"):
            self.broadcast(self.small(version))  # "the file is there"
            status = self.all_reduce_status(0)  # receivers have read it
        path.unlink(missing_ok=True)
        return status

    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None:
        with ph.timed("transfer"):
            note = self.small(0)
            self.broadcast(note)
        error: WeightSyncError | None = None
        with ph.timed("reload"):
            try:
                self.load(receiver.store.staging, int(note.item()))
            except WeightSyncError as exc:
                error = exc
        with ph.timed("transfer"):
            self.all_reduce_status(3 if error else 0)
        return error


class PerTensor(SyncMethod):
    """One broadcast per tensor (after the version), straight into the receiver's model: no stage, no reload."""

    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int:
        with ph.timed("transfer"):
            self.broadcast(self.small(version))
            for m in self.plan.metas:
                self.broadcast(weights[m.name])
        return 0

    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None:
        staging = receiver.store.staging
        with ph.timed("transfer"):
            note = self.small(0)
            self.broadcast(note)
            for m in self.plan.metas:
                self.broadcast(staging[m.name])  # straight into the model: no copy
        if int(note.item()) != version:
            return OutOfOrderBucketError(f"got version {int(note.item())}, expected {version}; rejected")
        return None


class Flat(SyncMethod):
    """The roofline of (09.1): broadcast a buffer packed once beforehand. Nothing is packed or unpacked.

    With ``verify`` the one message carries a header: the sender checksums the buffer
    (stage) and the receiver verifies it (reload), the passes of the checksummed methods.
    """

    delivers_weights = False

    def __init__(
        self, config: SyncConfig, plan: BucketPlan, device: torch.device, group: ProcessGroup | None = None
    ) -> None:
        super().__init__(config, plan, device, group)
        extra = HEADER_BYTES if config.verify else 0
        self.flat = torch.zeros(plan.total_nbytes + extra, dtype=torch.uint8, device=device)

    def seal(self, version: int) -> None:
        """Sender, with ``verify``: one checksum pass over the buffer, written into its header."""
        payload = self.flat[:-HEADER_BYTES]
        BucketHeader(version, 0, 1, payload.numel(), checksum(payload, self.config.checksum)).write(self.flat)

    def transfer(self) -> None:
        """The buffer in one message (with ``verify``), else one message per bucket of the plan."""
        if self.config.verify:
            self.broadcast(self.flat)
            return
        start = 0
        for size in self.plan.bucket_nbytes:
            self.broadcast(self.flat[start : start + size])
            start += size

    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int:
        if self.config.verify:
            with ph.timed("stage"):
                self.seal(version)
        with ph.timed("transfer"):
            self.transfer()
        return 0

    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None:
        with ph.timed("transfer"):
            self.transfer()
        if not self.config.verify:
            return None
        with ph.timed("reload"):  # the receiver's pass: the same check a bucket gets
            try:
                header = BucketHeader.read(self.flat)
                verify_bucket(self.flat[:-HEADER_BYTES], header, version=version, index=0, kind=self.config.checksum)
            except WeightSyncError as exc:
                return exc
        return None


class Prestaged(Flat):
    """The bucketed broadcast's transfer alone: buckets of ``bucket_mb`` packed beforehand, one broadcast each."""

    @classmethod
    def make_plan(cls, config: SyncConfig, specs: list[TensorSpec]) -> BucketPlan:
        return plan_buckets(specs, config.bucket_bytes)


class BucketMethod(SyncMethod):
    """Checksummed buckets (09.2, 09.6), staged and reloaded one at a time; subclasses schedule the transfer.

    Sender, :meth:`stage`: pack bucket b (or delta-encode it; nothing with ``in_place``),
    then write its header and checksum. Receiver, :meth:`reload`: verify bucket b, unpack it
    into the staging weights. After the last bucket every rank all-reduces a status code.
    """

    #: Reused bucket-sized buffers per rank (none with ``in_place``: buckets are the weights' storage).
    n_buffers: ClassVar[int] = 1

    def __init__(
        self, config: SyncConfig, plan: BucketPlan, device: torch.device, group: ProcessGroup | None = None
    ) -> None:
        super().__init__(config, plan, device, group)
        size = plan.max_bucket_nbytes() + HEADER_BYTES
        n = 0 if config.in_place else self.n_buffers
        self.buffers = [torch.zeros(size, dtype=torch.uint8, device=device) for _ in range(n)]

    @classmethod
    def make_plan(cls, config: SyncConfig, specs: list[TensorSpec]) -> BucketPlan:
        return plan_buckets(specs, config.bucket_bytes, WIRE_DTYPES[config.wire_dtype])

    @property
    def stream(self) -> str:
        return f"bucket stream of {self.plan.n_buckets}"

    def slot(self, endpoint: Sender | Receiver, b: int) -> torch.Tensor:
        """Bucket ``b``'s bytes and header: a reused buffer, or with ``in_place`` the weights' own storage."""
        if self.config.in_place:
            return endpoint.bucket_storage(b)
        return self.buffers[b % len(self.buffers)][: self.plan.bucket_nbytes[b] + HEADER_BYTES]

    def stage(self, sender: Sender, weights: Weights, version: int, b: int) -> torch.Tensor:
        """Sender: bucket ``b`` packed into its slot, with its header and checksum; returns the slot."""
        slot = self.slot(sender, b)
        payload = slot[:-HEADER_BYTES]
        sender.pack_bucket(weights, self.plan.in_bucket(b), payload)
        sent = checksum(payload, self.config.checksum)
        BucketHeader(version, b, self.plan.n_buckets, payload.numel(), sent).write(slot)
        if sender.fault is not None:  # teaching and tests only (faults.py)
            sender.fault.after_stage(b, slot)
        return slot

    @staticmethod
    def posted(sender: Sender, b: int, work: Work | None) -> None:
        """Bucket ``b`` was handed to the transport: the fault hook's moment (a no-op in production)."""
        if sender.fault is not None:
            sender.fault.after_post(b, work)

    def reload(self, receiver: Receiver, version: int, b: int, error: WeightSyncError | None) -> WeightSyncError | None:
        """Receiver: verify bucket ``b`` and unpack it into the staging weights; return the update's first error.

        After a bad bucket nothing more is reloaded, but the caller keeps receiving so that
        the sender is not left waiting.
        """
        if error is not None:
            return error
        slot = self.slot(receiver, b)
        payload = slot[:-HEADER_BYTES]
        try:
            verify_bucket(payload, BucketHeader.read(slot), version=version, index=b, kind=self.config.checksum)
        except WeightSyncError as exc:
            return exc
        receiver.unpack_bucket(payload, self.plan.in_bucket(b))
        return None

    def agree(self, version: int, error: WeightSyncError | None) -> WeightSyncError | None:
        """Receiver, after the last bucket: all-reduce the status; return this rank's or another's rejection."""
        code = 0 if error is None else 1 if isinstance(error, CorruptBucketError) else 2
        status = self.all_reduce_status(code)
        if error is None and status:
            error = WeightSyncError(
                f"another receiver rejected version {version} ({comm.STATUS.get(status, status)}); "
                "kept the previous weights"
            )
        return error


class Bucketed(BucketMethod):
    """(09.2) in turn: stage bucket b, broadcast it (blocking), the receiver reloads it; then bucket b + 1."""

    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int:
        for b in range(self.plan.n_buckets):
            with ph.timed("stage"):
                slot = self.stage(sender, weights, version, b)
            with ph.timed("transfer"):
                self.broadcast(slot)
                self.posted(sender, b, None)
        with ph.timed("transfer"):
            status = self.all_reduce_status(0)
        return status

    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None:
        error = None
        for b in range(self.plan.n_buckets):
            with ph.timed("transfer"):
                self.broadcast(self.slot(receiver, b))
            with ph.timed("reload"):
                error = self.reload(receiver, version, b, error)
        with ph.timed("transfer"):
            return self.agree(version, error)


class Pipelined(BucketMethod):
    """(09.3) two buffers per side: the sender packs bucket b while b - 1 is on the wire; the
    receiver unpacks bucket b while b + 1 arrives."""

    n_buffers = 2

    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int:
        work: Work | None = None
        for b in range(self.plan.n_buckets):
            with ph.timed("stage"):
                slot = self.stage(sender, weights, version, b)  # the buffer bucket b - 2 used: sent already
            with ph.timed("transfer"):
                if work is not None:
                    work.wait()
                work = self.post(slot)
                self.posted(sender, b, work)
        with ph.timed("transfer"):
            if work is not None:
                work.wait()
            status = self.all_reduce_status(0)
        return status

    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None:
        n, error = self.plan.n_buckets, None
        work = self.post(self.slot(receiver, 0))
        for b in range(n):
            with ph.timed("transfer"):
                work.wait()
                if b + 1 < n:
                    work = self.post(self.slot(receiver, b + 1))
            with ph.timed("reload"):
                error = self.reload(receiver, version, b, error)
        with ph.timed("transfer"):
            return self.agree(version, error)


class ZeroCopyPipelined(BucketMethod):
    """(09.3) with ``in_place``: every bucket has storage of its own, so every bucket is in flight at once.

    The sender checksums bucket b + 1 while b is on the wire; the receiver posts every
    receive at once and verifies bucket b while later ones arrive.
    """

    n_buffers = 0

    def send(self, sender: Sender, weights: Weights, version: int, ph: Phases) -> int:
        works = []
        for b in range(self.plan.n_buckets):
            with ph.timed("stage"):
                slot = self.stage(sender, weights, version, b)
            works.append(self.post(slot))
            self.posted(sender, b, works[-1])
        with ph.timed("transfer"):
            for work in works:
                work.wait()
            status = self.all_reduce_status(0)
        return status

    def receive(self, receiver: Receiver, version: int, ph: Phases) -> WeightSyncError | None:
        error = None
        works = [self.post(self.slot(receiver, b)) for b in range(self.plan.n_buckets)]
        for b, work in enumerate(works):
            with ph.timed("transfer"):
                work.wait()
            with ph.timed("reload"):  # bucket b, while the later ones are still arriving
                error = self.reload(receiver, version, b, error)
        with ph.timed("transfer"):
            return self.agree(version, error)


_BY_NAME: dict[str, type[SyncMethod]] = {
    "naive": Naive,
    "per_tensor": PerTensor,
    "flat": Flat,
    "prestaged": Prestaged,
    "bucketed": Bucketed,
    "pipelined": Pipelined,
}


def method_class(config: SyncConfig) -> type[SyncMethod]:
    """The class that runs ``config``'s method: the one place a config picks its method."""
    if config.method == "pipelined" and config.in_place:
        return ZeroCopyPipelined
    return _BY_NAME[config.method]
