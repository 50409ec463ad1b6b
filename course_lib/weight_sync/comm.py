"""The collectives every method is built from, and the handshake that sends the bucket plan once.

Every function runs on the process group ``group`` it is given (``None``: the default group,
every rank of the job), and group rank 0 (:data:`SOURCE`) is always the source. A job with
more roles than sender and receivers (lesson 11: generators and several trainers) runs the
engine on a group of its own (``torch.distributed.new_group``), so that ranks outside it
never wait on a weight transfer. Under gloo every tensor is on the CPU; under NCCL control
messages live on this rank's GPU, like the buffers, with the same code.

``group`` may also be a :class:`~course_lib.runtime.groups.StandaloneGroup` (a gloo group
outside the default world, lesson 12's sync group between Ray actors): every function below
then runs the same collective on it.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup, Work

from course_lib.runtime.groups import StandaloneGroup
from course_lib.weight_sync.buckets import BucketPlan
from course_lib.weight_sync.integrity import ShapeMismatchError, WeightSyncError
from course_lib.weight_sync.specs import TensorSpec

#: The status codes ranks all-reduce (MAX) after an update.
STATUS = {0: "ok", 1: "corrupt bucket", 2: "out-of-order or stale bucket", 3: "other error"}

#: The sender's rank in the engine's group.
SOURCE = 0

#: What the engine runs on: a torch.distributed group (``None``: the default one) or a standalone group.
Group = ProcessGroup | StandaloneGroup | None


def rank(group: Group) -> int:
    """This process's rank in ``group`` (-1 if it is not a member)."""
    if isinstance(group, StandaloneGroup):
        return group.rank()
    return dist.get_rank(group)


def world_size(group: Group) -> int:
    """How many ranks ``group`` holds: the sender and its receivers."""
    if isinstance(group, StandaloneGroup):
        return group.size()
    return dist.get_world_size(group)


def device(group: Group) -> torch.device:
    """Where this rank's tensors live: its GPU under NCCL, else the CPU (a standalone group is gloo)."""
    if isinstance(group, StandaloneGroup):
        return torch.device("cpu")
    if dist.is_initialized() and dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast(tensor: torch.Tensor, group: Group) -> None:
    """Broadcast ``tensor`` from the sender (group rank 0) to ``group`` (blocking)."""
    if isinstance(group, StandaloneGroup):
        group.broadcast(tensor, SOURCE)
        return
    dist.broadcast(tensor, group=group, group_src=SOURCE)


def post(tensor: torch.Tensor, group: Group) -> Work:
    """Start a broadcast of ``tensor`` from the sender to ``group`` and return the handle to wait on."""
    if isinstance(group, StandaloneGroup):
        work = group.broadcast(tensor, SOURCE, async_op=True)
    else:
        work = dist.broadcast(tensor, group=group, group_src=SOURCE, async_op=True)
    assert work is not None
    return work


def small(value: int, device: torch.device) -> torch.Tensor:
    """A one-element int64 tensor on ``device`` (control messages: versions, status codes)."""
    return torch.tensor([value], dtype=torch.int64, device=device)


def all_reduce_status(code: int, group: Group, device: torch.device) -> int:
    """Every rank of ``group``: its status code in, the worst (largest) out."""
    status = small(code, device)
    if isinstance(group, StandaloneGroup):
        group.all_reduce(status, dist.ReduceOp.MAX)
    else:
        dist.all_reduce(status, op=dist.ReduceOp.MAX, group=group)
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


def handshake(plan: BucketPlan | None, specs: list[TensorSpec], group: Group, device: torch.device) -> BucketPlan:
    """The sender (group rank 0) broadcasts its ``plan`` once; every receiver checks it against its
    ``specs``; every rank of ``group`` agrees on the outcome.

    Raises:
        ShapeMismatchError: on every rank, if any receiver's model does not match.
    """
    if isinstance(group, StandaloneGroup):
        received = group.broadcast_object(plan, SOURCE)
    else:
        box: list[object] = [plan]
        dist.broadcast_object_list(box, group=group, group_src=SOURCE)
        received = box[0]
    assert isinstance(received, BucketPlan)
    error: WeightSyncError | None = None
    if rank(group) != SOURCE:
        try:
            check_plan(received, specs)
        except ShapeMismatchError as exc:
            error = exc
    if all_reduce_status(3 if error else 0, group, device):
        if error:
            raise error
        raise ShapeMismatchError(
            "a receiver's model does not match the sender's plan (see its error); no update was sent"
        )
    return received
