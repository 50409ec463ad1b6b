"""The collectives every method is built from, and the handshake that sends the bucket plan once.

Rank 0 is always the source. Under gloo every tensor is on the CPU; under NCCL control
messages live on this rank's GPU, like the buffers, with the same code.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import Work

from course_lib.weight_sync.buckets import BucketPlan
from course_lib.weight_sync.integrity import ShapeMismatchError, WeightSyncError
from course_lib.weight_sync.specs import TensorSpec

#: The status codes ranks all-reduce (MAX) after an update.
STATUS = {0: "ok", 1: "corrupt bucket", 2: "out-of-order or stale bucket", 3: "other error"}


def device() -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast(tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 (blocking)."""
    dist.broadcast(tensor, src=0)


def post(tensor: torch.Tensor) -> Work:
    """Start a broadcast of ``tensor`` from rank 0 and return the handle to wait on."""
    work = dist.broadcast(tensor, src=0, async_op=True)
    assert work is not None
    return work


def small(value: int) -> torch.Tensor:
    """A one-element int64 tensor on this rank's device (control messages: versions, status codes)."""
    return torch.tensor([value], dtype=torch.int64, device=device())


def all_reduce_status(code: int) -> int:
    """Every rank's status code in, the worst (largest) out."""
    status = small(code)
    dist.all_reduce(status, op=dist.ReduceOp.MAX)
    return int(status.item())


def check_plan(plan: BucketPlan, specs: list[TensorSpec]) -> None:
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


def handshake(plan: BucketPlan | None, specs: list[TensorSpec]) -> BucketPlan:
    """Rank 0 broadcasts its ``plan`` once; every receiver checks it against its ``specs``; all agree on the outcome.

    Raises:
        ShapeMismatchError: on every rank, if any receiver's model does not match.
    """
    box: list[object] = [plan]
    dist.broadcast_object_list(box, src=0)
    received = box[0]
    assert isinstance(received, BucketPlan)
    error: WeightSyncError | None = None
    if dist.get_rank() != 0:
        try:
            check_plan(received, specs)
        except ShapeMismatchError as exc:
            error = exc
    if all_reduce_status(3 if error else 0):
        if error:
            raise error
        raise ShapeMismatchError(
            "a receiver's model does not match the sender's plan (see its error); no update was sent"
        )
    return received
