"""Weight sync, trainer 0 -> 2 generator actors: lesson 09's engine on a group vs Ray's object store.

:func:`compare` places one :class:`~.workers.TrainerWorker` (bundle 0) and two
:class:`~.workers.GeneratorWorker` s (bundle 1, as the split layouts do) for each model size and
times, end to end as the controller sees it (submit -> every generator has loaded the weights):

* ``engine``: lesson 09's engine (pipelined, checksummed buckets) on a
  :class:`~course_lib.runtime.groups.StandaloneGroup` {trainer 0, generators}, the controller's path
  with ``sync="engine"``;
* ``object_store``: trainer 0 returns its weights as one numpy array, Ray keeps it in the
  shared-memory object store, each generator reads it zero-copy and copies it into its model
  (``sync="object_store"``).

Measured here (BENCHMARKS, 2026-12-01, medians of 3 rounds of 5): 0.5 MB: engine 6.7 ms, object
store 6.6 ms; 13.1 MB: 26.9 vs 18.8 ms; 101.8 MB: 171.7 vs 97.0 ms (the object store faster in every
round from 13 MB). On one host shared memory beats a TCP-loopback broadcast once the bytes dominate;
across hosts Ray's object manager moves the bytes, and on
GPUs NCCL broadcasts device to device while the object store goes through host memory.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


def _config(n_layers: int, d_model: int) -> Any:
    from course_lib.capstone_ray.controller import RayRunConfig

    heads = 4 if d_model <= 64 else 8
    return RayRunConfig(
        layout="sync_split", n_layers=n_layers, d_model=d_model, n_heads=heads, bucket_mb=0.25 if d_model <= 64 else 4.0
    )


def measure(n_layers: int, d_model: int, reps: int = 5, timeout_s: float = 60.0) -> dict[str, Any]:
    """Both paths for a TinyLM of ``n_layers`` x ``d_model``, ``reps`` updates each after one warm-up
    (alternating engine, object store); medians in ms. Needs a running Ray; removes its actors."""
    import ray
    import torch
    from ray.util.placement_group import placement_group, remove_placement_group

    from course_lib.capstone_ray.placement import pg_strategy
    from course_lib.capstone_ray.workers import GeneratorWorker, TrainerWorker
    from course_lib.lm.model import TinyLM
    from course_lib.runtime.weights import flat_parameters

    if reps < 1:
        raise ValueError(f"reps={reps} must be at least 1")
    cfg = _config(n_layers, d_model)
    pg = placement_group([{"CPU": 1.0}, {"CPU": 1.0}], strategy="PACK")
    actors: list[Any] = []
    try:
        ray.get(pg.ready(), timeout=timeout_s)
        remote: Any = ray.remote  # its stubs do not know concurrency_groups
        T = remote(concurrency_groups={"control": 1})(TrainerWorker)
        G = remote(concurrency_groups={"sync": 1, "control": 1})(GeneratorWorker)
        tr = T.options(num_cpus=1.0, scheduling_strategy=pg_strategy(pg, 0)).remote(cfg, 0, 0)
        gens = [G.options(num_cpus=0.5, scheduling_strategy=pg_strategy(pg, 1)).remote(cfg, i, 1) for i in range(2)]
        actors = [tr, *gens]
        torch.manual_seed(0)
        flat = flat_parameters(TinyLM(cfg.lm())).numpy()
        ray.get(tr.load.remote(flat), timeout=timeout_s)
        ray.get([g.ready.options(concurrency_group="control").remote() for g in gens], timeout=timeout_s)
        host, port = ray.get(tr.open_store.remote(), timeout=timeout_s)  # the rendezvous, served by the sender
        ray.get(
            [tr.join_sync.remote(host, port, 0, 3)]
            + [
                g.join_sync.options(concurrency_group="sync").remote(host, port, 0, 3, i + 1)
                for i, g in enumerate(gens)
            ],
            timeout=timeout_s,
        )
        res: dict[str, list[float]] = {"engine": [], "engine_send": [], "engine_recv": [], "object_store": []}
        res["object_store_recv"] = []
        v = 0
        for rep in range(reps + 1):
            v += 1
            t0 = time.perf_counter()
            futs = [tr.send_weights.remote(v)]
            futs += [g.receive_weights.options(concurrency_group="sync").remote(v) for g in gens]
            outs = ray.get(futs, timeout=timeout_s)
            t = time.perf_counter() - t0
            if rep:
                res["engine"].append(t)
                res["engine_send"].append(outs[0]["total"])
                res["engine_recv"].append(max(o["total"] for o in outs[1:]))
            v += 1
            t0 = time.perf_counter()
            ref = tr.get_flat.remote()
            outs = ray.get(
                [g.set_weights.options(concurrency_group="sync").remote(ref, v) for g in gens], timeout=timeout_s
            )
            t = time.perf_counter() - t0
            if rep:
                res["object_store"].append(t)
                res["object_store_recv"].append(max(o["total"] for o in outs))
            del ref
        # what arrived, bit for bit, per path: new weights on the trainer first (ones no earlier transfer
        # delivered), sent by that path alone, read back from both generators
        exact = True
        for i, path in enumerate(("object_store", "engine")):
            want = flat + np.float32(i + 1) * np.float32(1e-3)
            ray.get(tr.load.remote(want), timeout=timeout_s)
            v += 1
            if path == "engine":
                futs = [tr.send_weights.remote(v)]
                futs += [g.receive_weights.options(concurrency_group="sync").remote(v) for g in gens]
                ray.get(futs, timeout=timeout_s)
            else:
                ref = tr.get_flat.remote()
                ray.get(
                    [g.set_weights.options(concurrency_group="sync").remote(ref, v) for g in gens], timeout=timeout_s
                )
                del ref
            arrived = ray.get([g.get_flat.options(concurrency_group="sync").remote() for g in gens], timeout=timeout_s)
            exact = exact and all(np.array_equal(a, want) for a in arrived)
    finally:
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
        with contextlib.suppress(Exception):
            remove_placement_group(pg)
    return {
        "n_layers": n_layers,
        "d_model": d_model,
        "n_params": int(flat.size),
        "mbytes": flat.nbytes / 1e6,
        "reps": reps,
        "bit_exact": exact,
        **{f"{k}_ms": float(np.median(x) * 1e3) for k, x in res.items()},
        "engine_ms_all": [round(x * 1e3, 2) for x in res["engine"]],
        "object_store_ms_all": [round(x * 1e3, 2) for x in res["object_store"]],
    }


def compare(sizes: Sequence[tuple[int, int]] = ((2, 64), (4, 256)), reps: int = 5) -> list[dict[str, Any]]:
    """:func:`measure` for each ``(n_layers, d_model)`` in ``sizes``: one dict per size with ``n_params``,
    ``mbytes``, ``engine_ms`` and ``object_store_ms`` (medians, end to end), ``engine_send_ms``,
    ``engine_recv_ms``, ``object_store_recv_ms`` (the sides' own times) and ``bit_exact`` (both
    generators hold the trainer's weights bit for bit after either path)."""
    return [measure(n, d, reps) for n, d in sizes]
