r"""Lesson 11, the capstone: a multi-process asynchronous RL run, launched by torchrun.

Everything of lessons 07-10 in one job: generator ranks decode with lesson 07's KV-cache
sampler (continuous batching, in-flight weight updates), trainer ranks learn data-parallel
with its truncated-IS loss and group advantages, lesson 09's engine broadcasts the weights,
lesson 08's model chooses the layout, lesson 10's checkpoints make it restartable::

      torchrun agent(s) ── restart on failure (--max-restarts), c10d rendezvous, TCP store
            │
            ├── rank 0   TRAINER 0 ──────── checkpoints (atomic, newest complete restored)
            │      │  ▲        │  weights: lesson 09's engine (bucketed, pipelined, checksummed,
            │      │  │        │  all-or-nothing) on the sync group {0, generators}, or a shared
            │ grads│  │        ▼  buffer when colocated
            ├── rank 1   TRAINER 1 ◄─┐     ┌──────────────┬──────────────┐
            │   (all-reduce on the    │     ▼              ▼              ▼
            │    trainer group)       │   rank 2         rank 3   ...  GENERATORS
            │                         │   SlotSampler    SlotSampler   (in-flight updates,
            │                         │                                 KV cache kept)
            │                         └── groups g/{k}: prompt, answers, behaviour log-probs,
            │                             per-token versions, rewards (via the store)
            └── store: announced version, consumed groups (backpressure: lag <= max_lag),
                group counter k, stop

Modules, one concept each:

* :mod:`.config`: :class:`CapstoneConfig`, every knob, and its command line.
* :mod:`.roles`: which rank does what, the process groups, which trainer gets which group.
* :mod:`.plan`: the calibration and lesson 08's layout choice (printed with its prediction).
* :mod:`.channels`, :mod:`.colocated`: how weights reach generators (engine on a group; or a
  shared double buffer whose slots the generators' parameters point at: one copy per update).
* :mod:`.generator`, :mod:`.trainer`: the two roles' loops.
* :mod:`.ledger`: every sample generated is consumed once, discarded, or left over.
* :mod:`.faults`: a rank SIGKILLs itself once (the restart tests and demo).
* :mod:`.metrics`, :mod:`.report`: JSON lines per rank, and reading them back as tables.
* :mod:`.job`: the torchrun entry point (and the command for real hosts).
* :mod:`.launch`: :func:`run` (what a notebook calls) and the torchrun command line.
* :mod:`.cli`: ``course capstone``.

Importing the package imports only the launcher's light parts; the job imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from course_lib.capstone.report import CapstoneReport

__all__ = ["run"]


def run(run_dir: Any, **kwargs: Any) -> CapstoneReport:
    """Run the job under torchrun and return its report: :func:`course_lib.capstone.launch.run`."""
    from course_lib.capstone.launch import run as _run

    return _run(run_dir, **kwargs)
