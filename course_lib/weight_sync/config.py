"""What a weight update is asked to do (:class:`SyncConfig`) and what it measured (:class:`Phases`).

The method named by ``SyncConfig.method`` (with ``in_place``) picks one strategy class of
:mod:`.methods` (:func:`.methods.method_class`); the other fields are that method's options.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Literal

import torch

from course_lib.weight_sync.specs import MiB

METHODS = ("naive", "per_tensor", "flat", "prestaged", "bucketed", "pipelined")
BUCKET_METHODS = ("bucketed", "pipelined")  # buckets with headers and checksums (09.2, 09.3, 09.6)
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


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
        if (self.reshard or self.delta or self.wire_dtype != "fp32") and not self.bucketed:
            raise ValueError(f"reshard, delta and bf16 are options of the bucketed methods, not of {self.method!r}")
        if self.in_place and (not self.bucketed or self.reshard or self.delta or self.wire_dtype != "fp32"):
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
    def bucketed(self) -> bool:
        """Whether updates travel as checksummed buckets (``bucketed`` or ``pipelined``)."""
        return self.method in BUCKET_METHODS

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * MiB)

    @property
    def label(self) -> str:
        extra = [f"{self.bucket_mb:g} MiB"] if self.method in ("prestaged", *BUCKET_METHODS) else []
        extra += ["reshard"] * self.reshard + ["bf16"] * (self.wire_dtype == "bf16") + ["delta"] * self.delta
        extra += ["in place"] * self.in_place + ["verified"] * self.verify
        return self.method + (f" ({', '.join(extra)})" if extra else "")


Step = Literal["stage", "transfer", "reload"]


@dataclass
class Phases:
    """Seconds spent per step by one rank during one update (they overlap in ``pipelined``)."""

    stage: float = 0.0  # sender: pack (and checksum); naive: save
    transfer: float = 0.0  # waiting for messages
    reload: float = 0.0  # receiver: verify and unpack into the model; naive: load, copy, read
    total: float = 0.0

    @contextmanager
    def timed(self, step: Step) -> Iterator[None]:
        """Add the seconds the ``with`` block takes (even if it raises) to ``step``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, step, getattr(self, step) + time.perf_counter() - start)

    def as_dict(self) -> dict[str, float]:
        return {"stage": self.stage, "transfer": self.transfer, "reload": self.reload, "total": self.total}
