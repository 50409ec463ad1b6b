"""Colocated weight updates: trainer and generator on one host share a buffer instead of a broadcast.

checkpoint-engine's colocated mode: when the inference engine runs beside the trainer (the
same GPU, or the same host), new weights need no network at all; the trainer writes them
into a buffer both processes map, and the engine reads them from there. Here:

* on a CPU, the buffer is a file in ``/dev/shm`` that every local process maps
  (``torch.from_file(..., shared=True)``): ranks started by torchrun share no parent, so
  they meet by file name;
* on a GPU, the two slots are CUDA memory the trainer allocates and shares by CUDA IPC
  handle (``torch.multiprocessing.reductions.reduce_tensor``), the header stays in ``/dev/shm``
  (not tested here: this machine has no GPU).

**All-or-nothing, without locks (a double buffer).** Two slots, one *active*. The header
holds ``seq`` (even when stable), ``active``, ``version`` and ``writing`` (the slot being
written, -1 when none)::

    publish(flat, v):  writing = B (the inactive slot); copy flat into B
                       seq += 1; active = B; version = v; seq += 1; writing = -1
    pull(have):        s = seq (even), a = active, v = version; if v == have: done
                       copy slot a out;  keep it only if seq == s and writing != a, else retry

A reader copies the active slot while the writer fills the other one, so an ordinary
publish never forces a retry; only a second publish during one read (which would overwrite
the slot being read) does. One copy on each side: the update costs what a ``memcpy`` of
the weights costs, twice (the bench measures both against ``memcpy``).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

HEADER_BYTES = 64
SEQ, ACTIVE, VERSION, WRITING, NBYTES = range(5)


def shm_path(run_key: str, attempt: int) -> Path:
    """The shared buffer of one attempt of a run: in ``/dev/shm`` (memory) when there is one."""
    return _shm_dir() / f"capstone-{run_key}-a{attempt}-weights"


def _shm_dir() -> Path:
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path("/tmp")


def remove_buffers(run_key: str) -> list[Path]:
    """Delete every attempt's shared buffer of a run (a dead attempt leaves its file); returns them."""
    gone = list(_shm_dir().glob(f"capstone-{run_key}-a*-weights"))
    for path in gone:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return gone


def run_key(run_dir: str | Path) -> str:
    """A short name for a run directory (its buffers' file names)."""
    import hashlib

    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


class SharedBuffer:
    """A double-buffered, versioned flat ``float32`` buffer shared by name (see the module docstring).

    ``create=True`` (the writer) makes the file and sizes it; readers open it. ``device``
    ``"cuda"`` keeps the slots in GPU memory shared by IPC handle (``ipc_handle`` /
    ``from_ipc``), the header in the file.
    """

    def __init__(self, path: str | Path, numel: int, create: bool = False) -> None:
        self.path = Path(path)
        self.numel = numel
        self.nbytes = numel * 4
        size = HEADER_BYTES + 2 * self.nbytes
        if create:
            with open(self.path, "wb") as f:
                f.truncate(size)
        elif not self.path.exists():
            raise FileNotFoundError(f"shared weight buffer {self.path} does not exist: the writer creates it first")
        raw = torch.from_file(str(self.path), shared=True, size=size, dtype=torch.uint8)
        self.header = raw[:HEADER_BYTES].view(torch.int64)
        self.slots = [
            raw[HEADER_BYTES + i * self.nbytes : HEADER_BYTES + (i + 1) * self.nbytes].view(torch.float32)
            for i in range(2)
        ]
        if create:
            self.header.zero_()
            self.header[WRITING] = -1
            self.header[NBYTES] = self.nbytes
        elif int(self.header[NBYTES]) != self.nbytes:
            raise ValueError(f"{self.path} holds {int(self.header[NBYTES])} bytes of weights, this model {self.nbytes}")

    def use_cuda_slots(self, slots: list[torch.Tensor]) -> None:
        """Keep the two slots in GPU memory (``slots``: the writer's own, or rebuilt from IPC handles)."""
        self.slots = slots

    @property
    def version(self) -> int:
        return int(self.header[VERSION])

    def _check(self, pieces: Sequence[torch.Tensor]) -> None:
        n = sum(p.numel() for p in pieces)
        if n != self.numel:
            raise ValueError(f"the tensors hold {n} numbers, the shared buffer {self.numel}")

    def publish(self, pieces: Sequence[torch.Tensor], version: int) -> float:
        """Write ``pieces`` (float32 tensors, e.g. a model's parameters, ``numel`` in all) one
        after the other as ``version``: one copy, no packing first. Returns the seconds it took."""
        self._check(pieces)
        t0 = time.perf_counter()
        target = 1 - int(self.header[ACTIVE])
        self.header[WRITING] = target
        offset = 0
        for p in pieces:
            self.slots[target][offset : offset + p.numel()].view_as(p).copy_(p.detach())
            offset += p.numel()
        self.header[SEQ] += 1
        self.header[ACTIVE] = target
        self.header[VERSION] = version
        self.header[SEQ] += 1
        self.header[WRITING] = -1
        return time.perf_counter() - t0

    def pull(self, pieces: Sequence[torch.Tensor], have_version: int, timeout_s: float = 10.0) -> int:
        """Copy the active slot into ``pieces`` (in place) if its version is not ``have_version``;
        return the version they hold.

        Raises:
            TimeoutError: the writer kept overwriting the slot being read for ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seq = int(self.header[SEQ])
            if seq % 2:
                continue
            slot, version = int(self.header[ACTIVE]), int(self.header[VERSION])
            if version == have_version:
                return version
            offset = 0
            with torch.no_grad():
                for p in pieces:
                    p.copy_(self.slots[slot][offset : offset + p.numel()].view_as(p))
                    offset += p.numel()
            if int(self.header[SEQ]) == seq and int(self.header[WRITING]) != slot:
                return version
        raise TimeoutError(f"could not read a stable copy of {self.path} in {timeout_s:g} s")

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def cuda_ipc_handles(slots: list[torch.Tensor]) -> list[object]:
    """Picklable IPC handles of two CUDA slots (the writer's side; send them through the store)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return [reduce_tensor(s) for s in slots]


def cuda_slots_from_handles(handles: list[object]) -> list[torch.Tensor]:
    """The writer's CUDA slots, mapped into this process from :func:`cuda_ipc_handles`'s output."""
    out: list[torch.Tensor] = []
    for handle in handles:
        rebuild, args = cast(tuple[Any, tuple[Any, ...]], handle)
        out.append(rebuild(*args))
    return out
