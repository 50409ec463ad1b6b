"""Colocated weight updates: trainer and generators on one host share a buffer instead of a broadcast.

checkpoint-engine's colocated mode: when the inference engine runs beside the trainer (the
same GPU, or the same host), new weights need no network at all; the trainer writes them
into a buffer both processes map, and the engine takes them from there. Here:

* on a CPU, the buffer is a file in ``/dev/shm`` that every local process maps
  (``torch.from_file(..., shared=True)``): ranks started by torchrun share no parent, so
  they meet by file name;
* on a GPU, the two slots are CUDA memory trainer 0 allocates and shares by CUDA IPC handle
  (:meth:`SharedBuffer.cuda_slots`, :func:`cuda_ipc_handles`, :func:`cuda_slots_from_handles`);
  the header stays in ``/dev/shm`` (not run here: this machine has no GPU).

**One copy per update.** The trainer must copy: Adam updates its parameters in place, and
a generator reading them mid-step would decode with half-updated weights. The generator
need not: its parameters *are* views on a slot of the buffer (``param.data = slot[a:b]``),
and taking a new version is re-pointing them at the other slot, no bytes moved. So an
update costs one ``memcpy`` of the weights (the trainer's write) end to end; copying the
slot into the generator's own parameters (an earlier version of this module) cost two.

**All-or-nothing, without locks (a double buffer with readers' marks).** Two slots, one
*active*. The header holds ``seq`` (even when stable), ``active``, ``version``,
``writing`` (the slot being written, -1 when none) and, per reader, the slot it decodes
with (``held``, -1 for none)::

    publish(flat, v):  B = the inactive slot; wait until no reader holds B (they move to the
                       active slot at their next announcement); writing = B; copy flat into B
                       seq += 1; active = B; version = v; seq += 1; writing = -1
    attach(reader):    s = seq (even), a = active, v = version; held[reader] = a
                       keep it if seq == s and writing != a (else put the mark back and retry);
                       point the parameters at slot a

A publish never overwrites a slot a reader holds, and a reader never takes a slot being
written: the seq check catches a publish that ended between its reads (``active`` it read
is then stale), and a publish that starts after the mark is set waits for the reader to
leave. The price of the zero-copy reader is that the writer may wait: a reader keeps its
slot until it notices the next announcement (one decoding step here), and a reader that
died holding a slot makes the writer time out (torchrun then restarts the job, with a new
buffer). On a GPU a reader synchronizes its stream before leaving a slot, so that no queued
kernel still reads it. (The header is plain shared memory, without fences: on x86 a
reader's mark may reach the writer a few nanoseconds after the reader's own check, a window
far shorter than the milliseconds a publish takes; a production engine would use atomics.)
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import pickle
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch

#: Header fields (int64 words), then one ``held`` word per reader from ``HELD``.
SEQ, ACTIVE, VERSION, WRITING, NBYTES, READERS = range(6)
HELD = 8
#: The header's size: a page, so that the slots start page-aligned.
HEADER_BYTES = 4096
MAX_READERS = HEADER_BYTES // 8 - HELD


def shm_path(run_key: str, attempt: int) -> Path:
    """The shared buffer of one attempt of a run: in ``/dev/shm`` (memory) when there is one."""
    return _shm_dir() / f"capstone-{run_key}-a{attempt}-weights"


def _shm_dir() -> Path:
    """``/dev/shm`` (Linux: memory); elsewhere (macOS) the system's temporary folder, whose
    pages the processes share through the page cache all the same."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def remove_buffers(run_key: str) -> list[Path]:
    """Delete every attempt's shared buffer of a run (a dead attempt leaves its file); returns them."""
    gone = list(_shm_dir().glob(f"capstone-{run_key}-a*-weights"))
    for path in gone:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return gone


def run_key(run_dir: str | Path) -> str:
    """A short name for a run directory (its buffers' file names)."""
    return hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]


class SharedBuffer:
    """A double-buffered, versioned flat ``float32`` buffer shared by name (see the module docstring).

    ``create=True`` (the writer) makes the file and sizes it for ``readers`` readers (at
    most :data:`MAX_READERS`); readers open it. On a GPU the slots move to CUDA memory:
    the writer calls :meth:`cuda_slots`, readers :meth:`use_cuda_slots` with the slots
    rebuilt from the writer's IPC handles.
    """

    def __init__(self, path: str | Path, numel: int, create: bool = False, readers: int = 1) -> None:
        if not 1 <= readers <= MAX_READERS:
            raise ValueError(f"a shared buffer serves 1 to {MAX_READERS} readers, not {readers}")
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
            self.header[ACTIVE] = 1  # the first publish writes slot 0
            self.header[WRITING] = -1
            self.header[NBYTES] = self.nbytes
            self.header[READERS] = readers
            self.header[HELD : HELD + readers] = -1
        elif int(self.header[NBYTES]) != self.nbytes:
            raise ValueError(f"{self.path} holds {int(self.header[NBYTES])} bytes of weights, this model {self.nbytes}")
        self.readers = int(self.header[READERS])

    # ---- GPU slots -------------------------------------------------------------------------
    def cuda_slots(self, device: torch.device) -> list[torch.Tensor]:
        """Writer: move the two slots to ``device`` (CUDA memory); returns them, for
        :func:`cuda_ipc_handles`. The header stays in the file."""
        self.slots = [torch.empty(self.numel, dtype=torch.float32, device=device) for _ in range(2)]
        return self.slots

    def use_cuda_slots(self, slots: list[torch.Tensor]) -> None:
        """Reader: use the writer's CUDA slots (rebuilt from its IPC handles)."""
        if len(slots) != 2 or any(s.numel() != self.numel for s in slots):
            raise ValueError(f"expected two CUDA slots of {self.numel} numbers")
        self.slots = slots

    # ---- state -----------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The version in the active slot (0: nothing published yet)."""
        return int(self.header[VERSION])

    def held(self) -> dict[int, int]:
        """Reader -> the slot it decodes with (readers holding none left out)."""
        marks = self.header[HELD : HELD + self.readers].tolist()
        return {r: int(s) for r, s in enumerate(marks) if s >= 0}

    def _check(self, pieces: Sequence[torch.Tensor]) -> None:
        n = sum(p.numel() for p in pieces)
        if n != self.numel:
            raise ValueError(f"the tensors hold {n} numbers, the shared buffer {self.numel}")
        bad = [tuple(p.shape) for p in pieces if p.dtype != torch.float32]
        if bad:
            raise ValueError(f"the shared buffer holds float32; tensors of shapes {bad} are not")

    # ---- writer ----------------------------------------------------------------------------
    def publish(self, pieces: Sequence[torch.Tensor], version: int, timeout_s: float = 60.0) -> tuple[float, float]:
        """Write ``pieces`` (float32 tensors, e.g. a model's parameters, ``numel`` in all) one
        after the other into the inactive slot as ``version``: one copy, no packing first.

        Returns (seconds waiting for readers to leave the slot, seconds copying).

        Raises:
            TimeoutError: a reader still held the slot after ``timeout_s`` (it is stuck or dead).
        """
        self._check(pieces)
        target = 1 - int(self.header[ACTIVE])
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        while any(s == target for s in self.held().values()):
            if time.monotonic() > deadline:
                stuck = sorted(r for r, s in self.held().items() if s == target)
                raise TimeoutError(
                    f"reader(s) {stuck} of {self.path} still decode with slot {target} after {timeout_s:g} s: "
                    "a reader takes the new slot at its next announcement; is it stuck, or dead?"
                )
            time.sleep(20e-6)
        t1 = time.perf_counter()
        self.header[WRITING] = target
        offset = 0
        for p in pieces:
            self.slots[target][offset : offset + p.numel()].view_as(p).copy_(p.detach())
            offset += p.numel()
        if self.slots[target].is_cuda:
            torch.cuda.synchronize(self.slots[target].device)  # the bytes are there before the header says so
        self.header[SEQ] += 1
        self.header[ACTIVE] = target
        self.header[VERSION] = version
        self.header[SEQ] += 1
        self.header[WRITING] = -1
        return t1 - t0, time.perf_counter() - t1

    # ---- reader ----------------------------------------------------------------------------
    def attach(self, params: Sequence[torch.Tensor], reader: int, timeout_s: float = 10.0) -> int:
        """Point ``params`` (a model's parameters, in :meth:`publish`'s order) at the active
        slot, marked as held by ``reader``; returns the version they now hold. No bytes move.

        Raises:
            ValueError: ``reader`` out of range, or ``params`` do not match the buffer.
            TimeoutError: no stable active slot for ``timeout_s`` (nothing published yet, or
                the writer kept publishing during every try).
        """
        if not 0 <= reader < self.readers:
            raise ValueError(f"reader {reader} out of range: {self.path} has readers 0..{self.readers - 1}")
        self._check(params)
        before = int(self.header[HELD + reader])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seq = int(self.header[SEQ])
            version = int(self.header[VERSION])
            if seq % 2 or version == 0:
                time.sleep(20e-6)
                continue
            slot = int(self.header[ACTIVE])
            if slot != before and self.slots[0].is_cuda:
                torch.cuda.synchronize(self.slots[0].device)  # no queued kernel still reads the old slot
            self.header[HELD + reader] = slot
            if int(self.header[SEQ]) != seq or int(self.header[WRITING]) == slot:
                self.header[HELD + reader] = before
                continue
            offset = 0
            for p in params:
                p.data = self.slots[slot][offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            return version
        raise TimeoutError(f"no stable weights in {self.path} after {timeout_s:g} s (has the writer published?)")

    def release(self, reader: int) -> None:
        """Reader done (its parameters must not be used after this): the writer may reuse its slot."""
        self.header[HELD + reader] = -1

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def cuda_ipc_handles(slots: list[torch.Tensor]) -> str:
    """The writer's two CUDA slots as a string for the store (pickled IPC handles).

    The writer must keep ``slots`` alive while readers use them (CUDA IPC maps the same
    memory, it does not copy it)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return base64.b64encode(pickle.dumps([reduce_tensor(s) for s in slots])).decode()


def cuda_slots_from_handles(handles: str) -> list[torch.Tensor]:
    """The writer's CUDA slots, mapped into this process from :func:`cuda_ipc_handles`'s string."""
    out: list[torch.Tensor] = []
    for handle in pickle.loads(base64.b64decode(handles)):
        rebuild, args = cast(tuple[Any, tuple[Any, ...]], handle)
        out.append(rebuild(*args))
    return out
