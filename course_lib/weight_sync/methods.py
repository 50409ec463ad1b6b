"""The weight-sync methods, behind one interface: a :class:`Sender` on rank 0, a :class:`Receiver` on every other rank.

=============  =====================================================================  ========
method         what one update does                                                   equation
=============  =====================================================================  ========
``naive``      save a safetensors file, receivers load it, copy into the model, read   (09.1)
``per_tensor`` one ``dist.broadcast`` per tensor, straight into the receiver's model   (09.1)
``flat``       one broadcast of a single, already packed buffer (the roofline)         (09.1)
               (``verify=True``: with a sum64 checksum taken by the sender and checked
               by the receiver, the like-for-like roofline of the checksummed methods)
``prestaged``  the bucketed broadcast's transfer alone: buckets packed beforehand      (09.1)
``bucketed``   pack buckets of ``bucket_mb``, one broadcast each, verify, unpack       (09.2)
``pipelined``  the same with two buffers: pack next / send current / unpack previous   (09.3)
=============  =====================================================================  ========

Options of the bucketed methods: ``reshard`` (each receiver keeps its tensor-parallel
shard, 09.5), ``wire_dtype="bf16"`` (half the bytes), ``delta`` (send ``W_new - W_old``,
with the sender tracking what receivers hold so rounding errors do not pile up) and
``in_place`` (zero-copy: both sides keep their weights as views of bucket-layout storage,
so there is nothing to pack or unpack; only checksums and verification remain). With
``in_place`` every bucket has storage of its own, so ``pipelined`` keeps *every* bucket in
flight instead of two: the sender checksums bucket b + 1 while b is on the wire, the
receiver posts all receives at once and verifies bucket b while later ones arrive).

Devices: under gloo every tensor is on the CPU; under NCCL (``launch.run_trials(...,
backend="nccl")``) buffers, weights, control messages and sum64 checksums live on each
rank's GPU (one GPU per rank), with the same code.

Integrity (09.6): the bucket plan (names, shapes, dtypes, offsets) is sent once, when
the sender and receivers meet, and checked against each receiver's model; every bucket
carries a header (version, index, size, checksum); a receiver that finds a bad bucket
keeps receiving (so that no rank is left waiting), then all ranks all-reduce a status
code and everyone raises; only a fully verified update is committed. If the transfer
stops (sender dead, timeout) the receiver raises :class:`SenderLostError` and keeps its
previous weights.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import Work

from course_lib.weight_sync.buckets import BucketPlan, TensorMeta, pack, plan_buckets, view
from course_lib.weight_sync.integrity import (
    HEADER_BYTES,
    BucketHeader,
    CorruptBucketError,
    OutOfOrderBucketError,
    SenderLostError,
    ShapeMismatchError,
    WeightSyncError,
    checksum,
    verify_bucket,
)
from course_lib.weight_sync.reshard import shard_index, shard_shape
from course_lib.weight_sync.specs import MiB, TensorSpec
from course_lib.weight_sync.store import WeightStore

METHODS = ("naive", "per_tensor", "flat", "prestaged", "bucketed", "pipelined")
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
STATUS = {0: "ok", 1: "corrupt bucket", 2: "out-of-order or stale bucket", 3: "other error"}


@dataclass(frozen=True)
class SyncConfig:
    """How weights travel from rank 0 to every other rank."""

    method: str = field(default="pipelined", metadata={"help": f"one of {METHODS}"})
    bucket_mb: float = field(default=32.0, metadata={"help": "bucket size in MiB (bucketed, pipelined)"})
    wire_dtype: str = field(
        default="fp32", metadata={"help": "'fp32' or 'bf16': dtype of floating tensors on the wire"}
    )
    delta: bool = field(default=False, metadata={"help": "send W_new - W_old instead of W_new"})
    reshard: bool = field(default=False, metadata={"help": "each receiver keeps only its tensor-parallel shard"})
    checksum: str = field(default="sum64", metadata={"help": "'sum64' (fast) or 'crc32' (catches swapped words)"})
    in_place: bool = field(
        default=False,
        metadata={
            "help": "zero-copy: the sender's and the receivers' weights are views of bucket-layout storage (as a "
            "trainer with a contiguous parameter buffer keeps them); buckets are sent from and received into "
            "that storage, with no packing or unpacking copy; fp32 without reshard or delta only"
        },
    )
    verify: bool = field(
        default=False,
        metadata={
            "help": "flat only: the sender checksums the single buffer and the receiver verifies it (the same "
            "passes over every byte as the checksummed bucket methods, on one buffer: their like-for-like roofline)"
        },
    )
    workdir: str = field(default="", metadata={"help": "directory for the naive method's checkpoint file"})
    evict_cache: bool = field(
        default=True,
        metadata={
            "help": "naive: fsync the file and drop it from the page cache, so receivers read it from storage as they "
            "would on another machine (False: read from this machine's memory, the best case)"
        },
    )

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.wire_dtype not in WIRE_DTYPES:
            raise ValueError(f"wire_dtype must be one of {tuple(WIRE_DTYPES)}, got {self.wire_dtype!r}")
        if self.bucket_mb <= 0:
            raise ValueError(f"bucket_mb must be positive, got {self.bucket_mb}")
        bucketed = self.method in ("bucketed", "pipelined")
        if (self.reshard or self.delta or self.wire_dtype != "fp32") and not bucketed:
            raise ValueError(f"reshard, delta and bf16 are options of the bucketed methods, not of {self.method!r}")
        if self.in_place and (not bucketed or self.reshard or self.delta or self.wire_dtype != "fp32"):
            raise ValueError(
                "in_place needs the bucketed or pipelined method, fp32, no reshard and no delta "
                "(the wire layout must be the receiver's layout)"
            )
        if self.verify and self.method != "flat":
            raise ValueError(
                f"verify is an option of the flat method (the bucketed methods always verify), not of {self.method!r}"
            )
        if self.method == "naive" and not self.workdir:
            raise ValueError("the naive method needs workdir= (a directory for the checkpoint file)")

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * MiB)

    @property
    def label(self) -> str:
        extra = [f"{self.bucket_mb:g} MiB"] if self.method in ("prestaged", "bucketed", "pipelined") else []
        extra += ["reshard"] * self.reshard + ["bf16"] * (self.wire_dtype == "bf16") + ["delta"] * self.delta
        extra += ["in place"] * self.in_place + ["verified"] * self.verify
        return self.method + (f" ({', '.join(extra)})" if extra else "")


@dataclass
class Phases:
    """Seconds spent per stage by one rank during one update (they overlap in ``pipelined``)."""

    stage: float = 0.0  # sender: pack (and checksum); naive: save
    transfer: float = 0.0  # waiting for messages
    reload: float = 0.0  # receiver: verify and unpack into the model; naive: load, copy, read
    total: float = 0.0


def _broadcast(tensor: torch.Tensor, async_op: bool = False) -> Work | None:
    """Broadcast ``tensor`` from rank 0; with ``async_op`` the handle to wait on, else ``None``."""
    work: Work | None = dist.broadcast(tensor, src=0, async_op=async_op)
    return work


def _post(tensor: torch.Tensor) -> Work:
    """Start a broadcast of ``tensor`` from rank 0 and return the handle to wait on."""
    work = _broadcast(tensor, async_op=True)
    assert work is not None
    return work


def _device() -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _small(value: int) -> torch.Tensor:
    """A one-element int64 tensor on this rank's device (control messages: versions, status codes)."""
    return torch.tensor([value], dtype=torch.int64, device=_device())


def _all_reduce_status(code: int) -> int:
    status = _small(code)
    dist.all_reduce(status, op=dist.ReduceOp.MAX)
    return int(status.item())


def _check_plan(plan: BucketPlan, specs: list[TensorSpec]) -> None:
    """Raise :class:`ShapeMismatchError` if the receiver's model and the sender's plan disagree."""
    mine = {s.name: s for s in specs}
    theirs = {m.name for m in plan.metas}
    missing, extra = sorted(theirs - set(mine)), sorted(set(mine) - theirs)
    if missing or extra:
        raise ShapeMismatchError(
            f"the sender's plan and this receiver's model hold different tensors "
            f"(only the sender's: {missing[:3]}, only the receiver's: {extra[:3]})"
        )
    for m in plan.metas:
        if tuple(mine[m.name].shape) != m.shape:
            raise ShapeMismatchError(
                f"tensor {m.name!r}: the sender sends shape {m.shape}, this receiver's model "
                f"has {tuple(mine[m.name].shape)}; rebuild the receiver with the trainer's config"
            )


class _Endpoint:
    """What the sender and receivers share: the config, the plan, and the handshake (metadata sent once)."""

    plan: BucketPlan  # set by each subclass's handshake

    def __init__(self, config: SyncConfig, specs: list[TensorSpec]) -> None:
        self.config = config
        self.specs = list(specs)
        self.bucketed = config.method in ("bucketed", "pipelined")
        self.buffers: list[torch.Tensor] = []
        self.flat: torch.Tensor | None = None
        self.device = _device()

    def _handshake(self, plan: BucketPlan | None) -> BucketPlan:
        """Rank 0 broadcasts the plan once; every receiver checks it; all agree on the outcome."""
        box: list[object] = [plan]
        dist.broadcast_object_list(box, src=0)
        received = box[0]
        assert isinstance(received, BucketPlan)
        error: WeightSyncError | None = None
        if dist.get_rank() != 0:
            try:
                _check_plan(received, self.specs)
            except ShapeMismatchError as exc:
                error = exc
        if _all_reduce_status(3 if error else 0):
            if error:
                raise error
            raise ShapeMismatchError(
                "a receiver's model does not match the sender's plan (see its error); no update was sent"
            )
        return received

    def _alloc_buffers(self, plan: BucketPlan) -> None:
        size = plan.max_bucket_nbytes() + HEADER_BYTES
        n_buffers = 2 if self.config.method == "pipelined" else 1
        self.buffers = [torch.zeros(size, dtype=torch.uint8, device=self.device) for _ in range(n_buffers)]
        if self.config.method in ("flat", "prestaged"):
            extra = HEADER_BYTES if self.config.verify else 0
            self.flat = torch.zeros(plan.total_nbytes + extra, dtype=torch.uint8, device=self.device)

    def _slot(self, plan: BucketPlan, b: int) -> torch.Tensor:
        return self.buffers[b % len(self.buffers)][: plan.bucket_nbytes[b] + HEADER_BYTES]

    def _broadcast_prepacked(self) -> float:
        """flat / prestaged: broadcast the buffer packed once beforehand (one message, or one per bucket);
        return the seconds it took. Nothing is packed, verified or unpacked: the transfer alone
        (flat with ``verify``: the one message carries the header and checksum too)."""
        assert self.flat is not None
        t = time.perf_counter()
        if self.config.verify:
            _broadcast(self.flat)
            return time.perf_counter() - t
        start_byte = 0
        for size in self.plan.bucket_nbytes:
            _broadcast(self.flat[start_byte : start_byte + size])
            start_byte += size
        return time.perf_counter() - t


class Sender(_Endpoint):
    """Rank 0: sends versioned updates of ``weights`` (a dict of tensors matching ``specs``)."""

    def __init__(self, config: SyncConfig, specs: list[TensorSpec]) -> None:
        super().__init__(config, specs)
        wire = WIRE_DTYPES[config.wire_dtype] if self.bucketed else None
        bucket = config.bucket_bytes if self.bucketed or config.method == "prestaged" else 2**62
        self.plan = self._handshake(plan_buckets(self.specs, bucket, wire))
        self._alloc_buffers(self.plan)
        self.mirror = {s.name: torch.zeros(s.shape, device=self.device) for s in self.specs} if config.delta else None
        if config.in_place:  # the trainer's weights live in the buckets: write them into `self.weights`
            self.storage = WeightStore.in_bucket_layout(self.plan, HEADER_BYTES, str(self.device))
            self.weights = self.storage.active
            self.buffers = []
        self.fault: str | None = None  # for tests: "corrupt:B", "reorder", "stale", "kill:B"

    # -- what one bucket looks like on the wire
    def _slot(self, plan: BucketPlan, b: int) -> torch.Tensor:
        if self.config.in_place:  # the bucket is the weights' own storage
            return self.storage.active_flats[b]
        return super()._slot(plan, b)

    def _fill(self, weights: dict[str, torch.Tensor], version: int, b: int, slot: torch.Tensor) -> None:
        payload = slot[:-HEADER_BYTES]
        metas = self.plan.in_bucket(b)
        if self.config.in_place:
            pass  # already packed: the weights are views of this bucket
        elif self.mirror is not None:  # delta: send W - (what receivers hold), then track it
            for m in metas:
                out = view(payload, m)
                out.copy_(weights[m.name] - self.mirror[m.name])
                self.mirror[m.name] += out.float()
        else:
            pack(weights, metas, payload)
        index = b
        if self.fault == "reorder" and b in (1, 2):
            index = 3 - b
        header = BucketHeader(
            version - (self.fault == "stale"),
            index,
            self.plan.n_buckets,
            payload.numel(),
            checksum(payload, self.config.checksum),
        )
        header.write(slot)
        if self.fault == f"corrupt:{b}":
            payload[payload.numel() // 2] ^= 0x10  # one flipped bit, after the checksum was taken

    def _maybe_die(self, b: int) -> None:
        if self.fault == f"kill:{b}":
            os.kill(os.getpid(), 9)

    def send(self, weights: dict[str, torch.Tensor], version: int) -> Phases:
        """Send version ``version`` of ``weights`` to every receiver.

        Raises:
            WeightSyncError: if a receiver rejected the update (it kept its previous weights).
        """
        if self.config.in_place and (weights is not self.weights or (self.fault or "").startswith("corrupt")):
            raise ValueError(
                "with in_place=True, write the weights into sender.weights (bucket-layout storage) "
                "and pass that dict; corrupt-bucket injection needs a staging buffer (in_place=False)"
            )
        ph = Phases()
        start = time.perf_counter()
        method = self.config.method
        if method == "naive":
            from safetensors.torch import save_file

            t = time.perf_counter()
            path = Path(self.config.workdir) / f"weights-v{version}.safetensors"
            save_file({n: w.contiguous().cpu() for n, w in weights.items()}, str(path))
            if self.config.evict_cache:  # a durable checkpoint, read back from storage as another machine would
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
            ph.stage = time.perf_counter() - t
            t = time.perf_counter()
            _broadcast(_small(version))  # "the file is there"
            status = _all_reduce_status(0)  # receivers have read it
            ph.transfer = time.perf_counter() - t
            path.unlink(missing_ok=True)
        elif method == "per_tensor":
            t = time.perf_counter()
            _broadcast(_small(version))
            for m in self.plan.metas:
                _broadcast(weights[m.name])
            ph.transfer = time.perf_counter() - t
            status = 0
        elif method in ("flat", "prestaged"):
            if self.config.verify:  # one checksum pass over the single buffer, as the bucket methods do per bucket
                assert self.flat is not None
                t = time.perf_counter()
                payload = self.flat[:-HEADER_BYTES]
                sent = checksum(payload, self.config.checksum)
                BucketHeader(version, 0, 1, payload.numel(), sent).write(self.flat)
                ph.stage = time.perf_counter() - t
            ph.transfer = self._broadcast_prepacked()
            status = 0
        elif method == "pipelined" and self.config.in_place:
            # Zero-copy: every bucket has its own storage, so nothing is reused and every
            # send can stay in flight; bucket b + 1 is checksummed while b is on the wire.
            works = []
            for b in range(self.plan.n_buckets):
                slot = self._slot(self.plan, b)
                t = time.perf_counter()
                self._fill(weights, version, b, slot)
                ph.stage += time.perf_counter() - t
                works.append(_post(slot))
                if self.fault == f"kill:{b}":
                    works[-1].wait()
                    self._maybe_die(b)
            t = time.perf_counter()
            for work in works:
                work.wait()
            status = _all_reduce_status(0)
            ph.transfer += time.perf_counter() - t
        else:  # bucketed; pipelined packs bucket b while bucket b - 1 is on the wire (09.3)
            pipelined = method == "pipelined"
            work = None
            for b in range(self.plan.n_buckets):
                slot = self._slot(self.plan, b)
                t = time.perf_counter()
                self._fill(weights, version, b, slot)
                ph.stage += time.perf_counter() - t
                t = time.perf_counter()
                if work is not None:
                    work.wait()
                    self._maybe_die(b - 1)
                work = _broadcast(slot, async_op=pipelined)  # None unless pipelined
                if not pipelined:
                    self._maybe_die(b)
                ph.transfer += time.perf_counter() - t
            t = time.perf_counter()
            if work is not None:
                work.wait()
                self._maybe_die(self.plan.n_buckets - 1)
            status = _all_reduce_status(0)
            ph.transfer += time.perf_counter() - t
        ph.total = time.perf_counter() - start
        if status:
            raise WeightSyncError(
                f"a receiver rejected version {version} ({STATUS.get(status, status)}); "
                "every receiver kept its previous weights"
            )
        return ph


class Receiver(_Endpoint):
    """Every rank but 0: receives updates into a double-buffered :class:`WeightStore`.

    With ``reshard`` the receiver is tensor-parallel rank ``rank - 1`` of ``world - 1``.
    """

    def __init__(self, config: SyncConfig, specs: list[TensorSpec]) -> None:
        super().__init__(config, specs)
        self.plan = self._handshake(None)
        self._alloc_buffers(self.plan)
        self.tp_rank, self.tp_size = (dist.get_rank() - 1, dist.get_world_size() - 1) if config.reshard else (0, 1)
        if config.in_place:
            self.store = WeightStore.in_bucket_layout(self.plan, HEADER_BYTES, str(self.device))
            self.buffers = []
        else:
            self.store = WeightStore(
                {m.name: shard_shape(m.shape, m.tp_dim, self.tp_rank, self.tp_size) for m in self.plan.metas},
                device=str(self.device),
            )
        self.index = {m.name: shard_index(m.shape, m.tp_dim, self.tp_rank, self.tp_size) for m in self.plan.metas}

    def _slot(self, plan: BucketPlan, b: int) -> torch.Tensor:
        if self.config.in_place:  # the bucket lands in the staging weights themselves
            return self.store.staging_flats[b]
        return super()._slot(plan, b)

    def _unpack_bucket(self, payload: torch.Tensor, metas: list[TensorMeta]) -> None:
        if self.config.in_place:
            return
        active, staging = self.store.active, self.store.staging
        for m in metas:
            src = view(payload, m)[self.index[m.name]]
            if self.config.delta:
                torch.add(active[m.name], src, out=staging[m.name])
            else:
                staging[m.name].copy_(src)

    def _accept(self, slot: torch.Tensor, version: int, b: int) -> None:
        payload = slot[:-HEADER_BYTES]
        verify_bucket(payload, BucketHeader.read(slot), version=version, index=b, kind=self.config.checksum)
        self._unpack_bucket(payload, self.plan.in_bucket(b))

    def receive(self, version: int) -> Phases:
        """Receive version ``version``; commit it only if every part arrived intact.

        Raises:
            CorruptBucketError, OutOfOrderBucketError: a bad bucket (the update is rejected).
            ShapeMismatchError: the loaded file does not match the model (naive).
            SenderLostError: the transfer stopped; the previous weights are kept.
        """
        ph = Phases()
        start = time.perf_counter()
        try:
            error = self._receive(version, ph)
        except WeightSyncError:
            raise
        except RuntimeError as exc:  # gloo: connection closed by the dead peer, or the timeout
            n = self.plan.n_buckets if self.bucketed else len(self.plan.metas)
            raise SenderLostError(
                f"version {version} stopped part-way ({'bucket' if self.bucketed else 'message'} "
                f"stream of {n}; {type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
                f"kept version {self.store.version}"
            ) from None
        if error is not None:
            raise error
        t = time.perf_counter()
        self.store.commit(version)
        ph.reload += time.perf_counter() - t
        ph.total = time.perf_counter() - start
        return ph

    def _receive(self, version: int, ph: Phases) -> WeightSyncError | None:
        method = self.config.method
        staging = self.store.staging
        if method == "naive":
            from safetensors.torch import load_file

            t = time.perf_counter()
            note = _small(0)
            _broadcast(note)
            ph.transfer += time.perf_counter() - t
            t = time.perf_counter()
            error: WeightSyncError | None = None
            try:
                loaded = load_file(
                    str(Path(self.config.workdir) / f"weights-v{int(note.item())}.safetensors"), device=str(self.device)
                )
                for name, dst in staging.items():
                    if name not in loaded or tuple(loaded[name].shape) != tuple(dst.shape):
                        raise ShapeMismatchError(f"checkpoint tensor {name!r} is missing or has another shape")
                    dst.copy_(loaded[name])
                del loaded
                float(sum(float(t_.sum()) for t_ in staging.values()))  # the full read that proves it is loaded
            except WeightSyncError as exc:
                error = exc
            ph.reload += time.perf_counter() - t
            t = time.perf_counter()
            _all_reduce_status(3 if error else 0)
            ph.transfer += time.perf_counter() - t
            return error
        if method == "per_tensor":
            t = time.perf_counter()
            note = _small(0)
            _broadcast(note)
            for m in self.plan.metas:
                _broadcast(staging[m.name])  # straight into the model: no copy
            ph.transfer += time.perf_counter() - t
            if int(note.item()) != version:
                return OutOfOrderBucketError(f"got version {int(note.item())}, expected {version}; rejected")
            return None
        if method in ("flat", "prestaged"):
            ph.transfer += self._broadcast_prepacked()
            if self.config.verify:  # the receiver's pass: the same check a bucket gets
                assert self.flat is not None
                t = time.perf_counter()
                try:
                    verify_bucket(
                        self.flat[:-HEADER_BYTES],
                        BucketHeader.read(self.flat),
                        version=version,
                        index=0,
                        kind=self.config.checksum,
                    )
                except WeightSyncError as exc:
                    return exc
                finally:
                    ph.reload += time.perf_counter() - t
            return None
        n = self.plan.n_buckets
        error = None
        if method == "bucketed":
            for b in range(n):
                slot = self._slot(self.plan, b)
                t = time.perf_counter()
                _broadcast(slot)
                ph.transfer += time.perf_counter() - t
                t = time.perf_counter()
                if error is None:  # after a bad bucket: keep receiving, so the sender is not left waiting
                    try:
                        self._accept(slot, version, b)
                    except WeightSyncError as exc:
                        error = exc
                ph.reload += time.perf_counter() - t
        elif self.config.in_place:  # zero-copy: every bucket lands in its own storage, all posted at once
            works = [_post(self._slot(self.plan, b)) for b in range(n)]
            for b, work in enumerate(works):
                t = time.perf_counter()
                work.wait()
                ph.transfer += time.perf_counter() - t
                t = time.perf_counter()
                if error is None:  # verify bucket b while the later ones are still arriving
                    try:
                        self._accept(self._slot(self.plan, b), version, b)
                    except WeightSyncError as exc:
                        error = exc
                ph.reload += time.perf_counter() - t
        else:  # pipelined: receive bucket b + 1 while unpacking bucket b (09.3)
            work = _post(self._slot(self.plan, 0))
            for b in range(n):
                t = time.perf_counter()
                work.wait()
                if b + 1 < n:
                    work = _post(self._slot(self.plan, b + 1))
                ph.transfer += time.perf_counter() - t
                t = time.perf_counter()
                if error is None:
                    try:
                        self._accept(self._slot(self.plan, b), version, b)
                    except WeightSyncError as exc:
                        error = exc
                ph.reload += time.perf_counter() - t
        t = time.perf_counter()
        code = 0 if error is None else 1 if isinstance(error, CorruptBucketError) else 2
        status = _all_reduce_status(code)
        ph.transfer += time.perf_counter() - t
        if error is None and status:
            error = WeightSyncError(
                f"another receiver rejected version {version} ({STATUS.get(status, status)}); kept the previous weights"
            )
        return error
