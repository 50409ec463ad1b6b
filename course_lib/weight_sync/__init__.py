"""Lesson 09: moving fresh weights from a trainer to inference engines (checkpoint-engine style).

Modules, one concept each:

* :mod:`.specs`: a transformer-like set of named tensors (hundreds of small ones beside big matrices).
* :mod:`.buckets`: the bucket plan (names, shapes, dtypes, byte offsets), packing and unpacking (09.2).
* :mod:`.integrity`: versions, per-bucket headers and checksums, the errors a receiver raises.
* :mod:`.reshard`: the tensor-parallel shard each receiver keeps (09.5).
* :mod:`.store`: a receiver's weights, double-buffered so that an update is all-or-nothing.
* :mod:`.config`: :class:`SyncConfig` (which method, its options) and the timed steps of one update.
* :mod:`.comm`: the collectives the methods are built from, and the handshake (the plan, sent once),
  on the default process group or the one the endpoints are given.
* :mod:`.methods`: the weight-sync methods, one class each behind one interface (naive, per-tensor,
  flat, prestaged, bucketed, pipelined, zero-copy pipelined; resharding, bf16 and delta as options).
* :mod:`.endpoints`: the :class:`Sender` (group rank 0) and the :class:`Receiver` s that run them.
* :mod:`.faults`: fault injection for teaching and tests (corrupt, reorder, stale, kill), kept
  out of the production path.
* :mod:`.launch`: real processes with torch.distributed (gloo on CPU, NCCL when a GPU is there).
* :mod:`.scale_model`: the analytic model of update time (09.1-09.4) and its calculator.
* :mod:`.engine_model`: checkpoint-engine's broadcast update stage by stage, against its published table.
"""

from __future__ import annotations

__all__ = [
    "buckets",
    "comm",
    "config",
    "endpoints",
    "engine_model",
    "faults",
    "integrity",
    "launch",
    "methods",
    "reshard",
    "scale_model",
    "specs",
    "store",
]
