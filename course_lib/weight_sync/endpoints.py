"""The two ends of a weight update: a :class:`Sender` on rank 0, a :class:`Receiver` on every other rank.

Both run on one process group, ``group`` (default ``None``: every rank of the job); ranks are
ranks *in that group*, so the sender is group rank 0 and ranks outside the group take no
part. Both are built from the same :class:`SyncConfig`; on construction they meet (the handshake:
the sender's bucket plan is sent once and every receiver checks it against its model), and
each gets the method object :func:`~course_lib.weight_sync.methods.method_class` picks for the
config. ``Sender.send(weights, version)`` and ``Receiver.receive(version)`` then run one
update; the endpoints hold the weights (the sender's delta mirror, the receiver's
double-buffered :class:`WeightStore`), the method decides how bytes move.

If the transfer stops (sender dead, timeout) the receiver raises :class:`SenderLostError`
and keeps its previous weights.
"""

from __future__ import annotations

import time

import torch
from torch.distributed import ProcessGroup

from course_lib.weight_sync import comm
from course_lib.weight_sync.buckets import TensorMeta, pack, view
from course_lib.weight_sync.config import Phases, SyncConfig
from course_lib.weight_sync.faults import Fault
from course_lib.weight_sync.integrity import HEADER_BYTES, SenderLostError, WeightSyncError
from course_lib.weight_sync.methods import method_class
from course_lib.weight_sync.reshard import shard_index, shard_shape
from course_lib.weight_sync.specs import TensorSpec
from course_lib.weight_sync.store import WeightStore


class _Endpoint:
    """What both ends share: the config, the process group, the plan agreed in the handshake, and the method."""

    is_sender = False

    def __init__(self, config: SyncConfig, specs: list[TensorSpec], group: ProcessGroup | None = None) -> None:
        self.config = config
        self.specs = list(specs)
        self.group = group
        self.rank, self.world_size = comm.rank(group), comm.world_size(group)
        if self.rank < 0:
            raise ValueError(f"{type(self).__name__}: this process is not a member of the weight-sync group")
        if self.is_sender != (self.rank == comm.SOURCE):
            raise ValueError(
                f"{type(self).__name__} on group rank {self.rank}: the sender is group rank {comm.SOURCE}, "
                "every other rank of the group receives"
            )
        self.device = comm.device(group)
        cls = method_class(config)
        plan = cls.make_plan(config, self.specs) if self.is_sender else None
        self.plan = comm.handshake(plan, self.specs, group, self.device)
        self.method = cls(config, self.plan, self.device, group)


class Sender(_Endpoint):
    """Group rank 0: sends versioned updates of ``weights`` (a dict of tensors matching ``specs``).

    With ``in_place`` the trainer writes its weights into :attr:`weights` (views of
    bucket-layout storage) and passes that dict to :meth:`send`.
    """

    is_sender = True

    def __init__(self, config: SyncConfig, specs: list[TensorSpec], group: ProcessGroup | None = None) -> None:
        super().__init__(config, specs, group)
        # delta: ``mirror`` is what every receiver holds; an update is packed against it into
        # ``pending``, which becomes the mirror only once every receiver accepted the update (a
        # rejected one leaves the receivers, and so the mirror, where they were)
        self.mirror = {s.name: torch.zeros(s.shape, device=self.device) for s in self.specs} if config.delta else None
        self.pending = {s.name: torch.zeros(s.shape, device=self.device) for s in self.specs} if config.delta else None
        self.storage = (
            WeightStore.in_bucket_layout(self.plan, HEADER_BYTES, str(self.device)) if config.in_place else None
        )
        self.weights: dict[str, torch.Tensor] = self.storage.active if self.storage is not None else {}
        self.fault: Fault | None = None  # teaching and tests only: see arm()

    def arm(self, fault: Fault | None) -> None:
        """Teaching and tests: break the following updates with ``fault`` (``None``: send them intact)."""
        if fault is not None:
            fault.check(self.config)
        self.fault = fault

    def bucket_storage(self, b: int) -> torch.Tensor:
        """``in_place``: bucket ``b`` is the weights' own storage."""
        assert self.storage is not None
        return self.storage.active_flats[b]

    def pack_bucket(self, weights: dict[str, torch.Tensor], metas: list[TensorMeta], payload: torch.Tensor) -> None:
        """Copy these tensors into a bucket's ``payload`` (cast to the wire dtype); with ``delta`` send
        ``W - (what receivers hold)`` and note what they will hold if the update commits (``pending``);
        with ``in_place`` nothing (they are views of it)."""
        if self.config.in_place:
            return
        if self.mirror is None:
            pack(weights, metas, payload)
            return
        assert self.pending is not None
        for m in metas:
            out = view(payload, m)
            out.copy_(weights[m.name] - self.mirror[m.name])
            torch.add(self.mirror[m.name], out.float(), out=self.pending[m.name])

    def send(self, weights: dict[str, torch.Tensor], version: int) -> Phases:
        """Send version ``version`` of ``weights`` to every receiver.

        Raises:
            WeightSyncError: if a receiver rejected the update (it kept its previous weights).
        """
        if self.config.in_place and weights is not self.weights:
            raise ValueError(
                "with in_place=True, write the weights into sender.weights (bucket-layout storage) and pass that dict"
            )
        ph = Phases()
        start = time.perf_counter()
        status = self.method.send(self, weights, version, ph)
        ph.total = time.perf_counter() - start
        if status:
            raise WeightSyncError(
                f"a receiver rejected version {version} ({comm.STATUS.get(status, status)}); "
                "every receiver kept its previous weights"
            )
        if self.mirror is not None and self.pending is not None:  # committed everywhere: the receivers hold pending
            self.mirror, self.pending = self.pending, self.mirror
        return ph


class Receiver(_Endpoint):
    """Every group rank but 0: receives updates into a double-buffered :class:`WeightStore`.

    With ``reshard`` the receiver is tensor-parallel rank ``rank - 1`` of ``world - 1`` (ranks in the group).
    """

    def __init__(self, config: SyncConfig, specs: list[TensorSpec], group: ProcessGroup | None = None) -> None:
        super().__init__(config, specs, group)
        self.tp_rank, self.tp_size = (self.rank - 1, self.world_size - 1) if config.reshard else (0, 1)
        if config.in_place:
            self.store = WeightStore.in_bucket_layout(self.plan, HEADER_BYTES, str(self.device))
        else:
            self.store = WeightStore(
                {m.name: shard_shape(m.shape, m.tp_dim, self.tp_rank, self.tp_size) for m in self.plan.metas},
                device=str(self.device),
            )
        self.index = {m.name: shard_index(m.shape, m.tp_dim, self.tp_rank, self.tp_size) for m in self.plan.metas}

    def bucket_storage(self, b: int) -> torch.Tensor:
        """``in_place``: bucket ``b`` lands in the staging weights themselves."""
        return self.store.staging_flats[b]

    def unpack_bucket(self, payload: torch.Tensor, metas: list[TensorMeta]) -> None:
        """Copy this receiver's shard of each tensor out of a verified bucket into the staging weights
        (with ``delta``: active + delta); with ``in_place`` nothing (the bucket is the staging weights)."""
        if self.config.in_place:
            return
        active, staging = self.store.active, self.store.staging
        for m in metas:
            src = view(payload, m)[self.index[m.name]]
            if self.config.delta:
                torch.add(active[m.name], src, out=staging[m.name])
            else:
                staging[m.name].copy_(src)

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
            error = self.method.receive(self, version, ph)
        except WeightSyncError:
            raise
        except RuntimeError as exc:  # gloo: connection closed by the dead peer, or the timeout
            raise SenderLostError(
                f"version {version} stopped part-way ({self.method.stream}; "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}); kept version {self.store.version}"
            ) from None
        if error is not None:
            raise error
        with ph.timed("reload"):
            self.store.commit(version)
        ph.total = time.perf_counter() - start
        return ph
