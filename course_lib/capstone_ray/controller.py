"""Lesson 11's capstone on Ray: one controller (this process) drives placed actors.

::

    controller (driver; may run on any node: every rendezvous is served by trainer 0, on its node's address)
      placement group: bundles_for(layout) -> one-core bundles (+ one GPU each: plan_devices), PACK
        sync_colocated: bundle r = trainer r (0.5 CPU) + its generators (0.5)  generate, hand over, train, sync
        sync_split:     bundle 0 = the trainers, bundle 1 = the generators       the same steps, lag 0
        pipeline:       the same bundles; generators decode continuously, weights arrive in flight
      TrainerWorker x n_trainers: own gloo group (gradient all-reduce); trainer 0 also sends the weights
      GeneratorWorker x n_generators (max_restarts=1): lesson 07's SlotSampler, in-flight weight updates

* :func:`run`: one run in an already started Ray (:func:`course_lib.capstone_ray.cluster.start_ray`);
  returns the report (see :meth:`Controller.go`), with :func:`check_run`'s verdicts and whatever Ray
  printed meanwhile (captured, not shown).
* The split loop (``sync_split``, ``pipeline``; :class:`~.split_loop.SplitLoop`, which also reads
  Ray's failures) is one ``ray.wait(num_returns=1)`` over decode calls,
  transfers, the train step and restart probes. Its three decisions are the pure functions of
  :mod:`.placement` (:func:`~.placement.bundles_for`: where every actor goes), :mod:`.admission`
  (:func:`~.admission.admit`: which groups each idle generator starts, under the lag bound, with
  the version *its* receive delivered) and :mod:`.ledger` (:func:`~.ledger.on_generator_death`:
  which groups a dead generator loses and in which order they are asked for again).
* A group's prompt depends only on ``(seed, k)``, so a lost group is re-generated under the same
  id by another incarnation; the :class:`~.ledger.Ledger` audits that every sample of the run was
  consumed exactly once and each returned by the incarnation it was admitted to.
* Weight sync: ``sync="engine"``: lesson 09's engine on a
  :class:`~course_lib.runtime.groups.StandaloneGroup` {trainer 0, live generators}, rebuilt (new key
  prefix) when a generator dies and when it is back; a transfer broken by a dying member costs the
  survivors the group's timeout (``sync_timeout_s``; gloo's ``abort()`` did not unblock a waiting
  receive, measured), during which the controller goes on and defers the next transfer.
  ``sync="object_store"``: trainer 0 returns its weights as one numpy array, every generator reads
  it zero-copy from Ray's object store; no group to rebuild.

Every wait is bounded: ``timeout_s`` per ``ray.wait``/``ray.get``, ``deadline_s`` for the whole run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import pickle
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from course_lib.capstone_ray.cores import node_local_index
from course_lib.capstone_ray.ledger import Ledger
from course_lib.capstone_ray.placement import DEVICES, LAYOUTS, DevicePlan, bundles_for, pg_strategy, plan_devices
from course_lib.capstone_ray.split_loop import SplitLoop
from course_lib.capstone_ray.workers import GeneratorWorker, TrainerWorker

#: Weight-sync paths: lesson 09's engine on a gloo group, or Ray's object store.
SYNCS: tuple[str, ...] = ("engine", "object_store")
#: What ``kill_at`` does to generator 1: ``kill`` (``ray.kill``; Ray restarts it), ``kill_final``
#: (``ray.kill(no_restart=True)``: gone for the rest of the run, Ray raises ``ActorDiedError``) or
#: ``unavailable`` (the reply of its decoding call is dropped, as a passing network error drops it:
#: Ray raises ``ActorUnavailableError`` and the process lives on)
FAULTS: tuple[str, ...] = ("kill", "kill_final", "unavailable")


@dataclass(frozen=True)
class RayRunConfig:
    """One run. Sizes default to lesson 11's CPU run (TinyLM 2 x 64, 4 prompts x 8 answers per update,
    2 trainers, 2 generators x 16 slots, 120 updates).

    ``layout``: lesson 08's name (``sync_colocated``, ``sync_split``, ``pipeline``); ``max_lag`` is
    the pipeline's bound (the two sync layouts run at lag 0 whatever it says). ``kill_at``: split
    layouts only: inject ``fault`` (one of :data:`FAULTS`) into generator 1, through Ray, once this
    many updates are done, while it decodes, between two weight transfers (or during one:
    ``kill_during_sync``), or while it has no decoding call in flight (``kill_idle``: held back by
    the lag bound, or waiting for weights); ``-1``: never. ``death_info_ms`` is Ray's (see
    :func:`~course_lib.capstone_ray.cluster.start_ray`), kept here for the command line.
    """

    layout: str = "pipeline"
    sync: str = "engine"
    n_updates: int = 120
    group_size: int = 8
    groups_per_batch: int = 4
    max_lag: int = 4
    n_trainers: int = 2
    n_generators: int = 2
    n_slots: int = 16
    lr: float = 1e-3
    clip_c: float = 2.0
    train_chunk: int = 8
    warm_steps: int = 30
    eval_prompts: int = 512
    eval_seed: int = 123
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seed: int = 0
    kill_at: int = -1
    kill_during_sync: bool = False
    kill_idle: bool = False  # kill generator 1 while no decoding call of its is in flight
    fault: str = "kill"  # what kill_at does: see FAULTS
    checkpoint_every: int = 0  # trainer 0 commits its state every this many updates (lesson 11's cadence: 40); 0: never
    pin: bool = True  # actors pin themselves to a core their bundle claims on its node (capstone_ray.cores)
    device: str = "auto"  # auto, cpu, cuda: GPUs in the bundles and NCCL for the trainers (placement.plan_devices)
    chunk_steps: int = 24  # most decoding steps per generator call
    bucket_mb: float = 0.25
    timeout_s: float = 30.0  # every ray.wait / ray.get
    sync_timeout_s: float = 5.0  # the sync group's gloo timeout: what a transfer broken by a dying member costs
    death_info_ms: int = 0
    restart_timeout_s: float = 60.0  # a generator not back this long after its death is dropped (GPU engines: minutes)
    deadline_s: float = 600.0  # the whole run (actors, warm start, updates, evaluations)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not one of {', '.join(LAYOUTS)}")
        if self.device not in DEVICES:
            raise ValueError(f"device={self.device!r} is not one of {', '.join(DEVICES)}")
        if self.sync not in SYNCS:
            raise ValueError(f"sync={self.sync!r} is not one of {', '.join(SYNCS)}")
        bundles_for(self.layout, self.n_trainers, self.n_generators)  # raises on a bad combination
        if self.max_lag < 0:
            raise ValueError(f"max_lag={self.max_lag}: the lag bound cannot be negative")
        if self.layout == "pipeline" and self.max_lag < 1:
            raise ValueError("layout='pipeline' with max_lag=0 is the synchronous split: use layout='sync_split'")
        for name in ("n_updates", "group_size", "groups_per_batch", "n_slots", "train_chunk", "chunk_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")
        if self.groups_per_batch % self.n_trainers:
            raise ValueError(
                f"groups_per_batch={self.groups_per_batch} must be a multiple of n_trainers={self.n_trainers} "
                "(every trainer takes the same number of groups)"
            )
        if self.checkpoint_every < 0:
            raise ValueError(f"checkpoint_every={self.checkpoint_every}: give a number of updates, or 0 for none")
        for name in ("timeout_s", "sync_timeout_s", "deadline_s", "bucket_mb", "restart_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)} must be positive")
        if self.kill_at >= 0:
            if self.layout == "sync_colocated":
                raise ValueError("kill_at: the kill demo runs in a split layout (sync_split or pipeline)")
            if self.n_generators < 2:
                raise ValueError("kill_at: generator 1 is killed, so n_generators must be at least 2")
            if self.kill_at >= self.n_updates:
                raise ValueError(f"kill_at={self.kill_at} must be below n_updates={self.n_updates}")
            if self.fault == "unavailable" and (self.kill_idle or self.kill_during_sync):
                raise ValueError(
                    "fault='unavailable' drops a decoding call's reply: not with kill_idle or kill_during_sync"
                )
        elif self.kill_idle or self.kill_during_sync or self.fault != "kill":
            raise ValueError("kill_idle / kill_during_sync / fault say when and how to kill: give kill_at too")
        if self.fault not in FAULTS:
            raise ValueError(f"fault={self.fault!r} is not one of {', '.join(FAULTS)}")

    @property
    def lag_bound(self) -> int:
        """The most updates a token may lag: ``max_lag`` for the pipeline, 0 for the sync layouts."""
        return self.max_lag if self.layout == "pipeline" else 0

    @property
    def split(self) -> bool:
        """Trainers and generators on bundles of their own (``sync_split``, ``pipeline``)."""
        return self.layout != "sync_colocated"

    def lm(self) -> Any:
        from course_lib.lm.model import LMConfig
        from course_lib.lm.task import TaskConfig

        t = TaskConfig()
        return LMConfig(
            vocab=t.vocab, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, max_len=t.max_len
        )


class Controller:
    """One run: :meth:`go` places the actors, warm-starts, runs the layout's loop, evaluates, audits."""

    def __init__(self, cfg: RayRunConfig) -> None:
        self.cfg = cfg
        self.t: dict[str, float] = {}
        self.trainers: list[Any] = []
        self.gens: list[Any] = []
        self.pg: Any = None
        self.metrics: list[dict[str, Any]] = []
        self.ledger = Ledger()
        self.sync_times: list[float] = []
        self.sync_send: list[float] = []
        self.sync_recv: list[float] = []
        self.blocked_s = 0.0
        self.kill: dict[str, Any] = {}
        self.decode_calls = 0
        self.reprobes = 0  # "are you back?" calls a restarting generator answered "unavailable"
        self.sync_errors: list[str] = []
        self.train_started: dict[int, float] = {}
        self.gen_steps = self.gen_slot_steps = 0  # decoding steps and busy slots over them, all generators
        self.group_builds: list[int] = []
        self.sync_members: list[int] = []
        self.actors: list[dict[str, Any]] = []
        self.gen_info: list[dict[str, Any]] = []
        self.gone: set[int] = set()  # generators Ray will not restart (ActorDiedError)
        self.rejoins: list[dict[str, Any]] = []  # every probe answered: generator, epoch, the same process?
        self.returns: list[tuple[float, int, int, int]] = []  # (seconds since t0, generator, epoch, group)
        self.checkpoints: list[Any] = []  # trainer 0's checkpoint calls
        self.driver_bytes: list[int] = []  # per update: the batch's bytes passing through the driver
        self.t0 = self.deadline = 0.0
        self.checkpoint_s: list[float] = []
        self.restart_expired: list[int] = []  # generators dropped because their restart outlasted restart_timeout_s
        self.count_s = 0.0  # time spent counting the driver's bytes (instrumentation, not the controller's cost)

    # ---- setup ----
    def place(self) -> None:
        """The placement group of :func:`bundles_for`, the actors in their bundles, the warm start
        (in this process, while the actors' processes start), the trainers' group, the sync group."""
        import ray
        from ray.util.placement_group import placement_group

        cfg = self.cfg
        self.devices = self.plan_devices()
        self.placement = bundles_for(
            cfg.layout, cfg.n_trainers, cfg.n_generators, gpus_per_bundle=1.0 if self.devices.reserve_gpus else 0.0
        )
        p = self.placement
        t0 = time.perf_counter()
        self.pg = placement_group([dict(b) for b in p.bundles], strategy=p.strategy)
        ray.get(self.pg.ready(), timeout=cfg.timeout_s)
        self.t["placement_group_s"] = time.perf_counter() - t0
        # each bundle's index among this group's bundles on its node: the core it prefers there (cores.py)
        local = node_local_index(ray.util.placement_group_table(self.pg)["bundles_to_node_id"])
        # concurrency groups must be given to ray.remote, not .options() (Ray raises there)
        remote: Any = ray.remote  # its stubs do not know concurrency_groups
        T = remote(concurrency_groups={"control": 1})(TrainerWorker)
        G = remote(concurrency_groups={"sync": 1, "control": 1})(GeneratorWorker)
        t0 = time.perf_counter()
        self.trainers = [
            T.options(
                num_cpus=p.trainer_cpus, num_gpus=p.trainer_gpus, scheduling_strategy=pg_strategy(self.pg, b)
            ).remote(cfg, r, local[b] if cfg.pin else None, self.devices)
            for r, b in enumerate(p.trainer_bundle)
        ]
        self.gens = [
            G.options(
                num_cpus=p.generator_cpus,
                num_gpus=p.generator_gpus,
                scheduling_strategy=pg_strategy(self.pg, b),
                max_restarts=1,
                max_task_retries=0,
            ).remote(cfg, i, local[b] if cfg.pin else None, self.devices)
            for i, b in enumerate(p.generator_bundle)
        ]
        self.warm_start()
        init = ray.put(self.init_flat)
        ray.get([t.load.remote(init) for t in self.trainers], timeout=cfg.timeout_s * 4)
        self.gen_info = ray.get([g.rejoin.remote(0) for g in self.gens], timeout=cfg.timeout_s * 4)  # epoch 0
        self.t["actors_start_s"] = time.perf_counter() - t0 - self.t["warm_start_s"]
        self.t["actors_and_warm_start_s"] = time.perf_counter() - t0
        self.actors = ray.get(
            [a.where.options(concurrency_group="control").remote() for a in self.trainers + self.gens],
            timeout=cfg.timeout_s,
        )
        backends = {a["backend"] for a in self.actors if a["role"] == "trainer"}
        if len(backends) != 1:  # device='auto' and some trainers see a CUDA device, others not
            raise RuntimeError(f"the trainers decided different backends, {sorted(backends)}: {self.actors}")
        t0 = time.perf_counter()
        # the rendezvous lives in trainer 0, on its node's address (the driver may be on another node)
        self.store_at = ray.get(self.trainers[0].open_store.remote(), timeout=cfg.timeout_s)
        n = len(self.trainers)
        ray.get([t.join_trainer_group.remote(*self.store_at, n) for t in self.trainers], timeout=cfg.timeout_s)
        self.t["trainer_group_s"] = time.perf_counter() - t0
        self.epoch = -1
        if cfg.sync == "engine":
            t0 = time.perf_counter()
            self.build_sync_group()
            self.t["sync_group_s"] = time.perf_counter() - t0
        self.blocked_s = 0.0  # the controller's overhead counts the loop's waits only

    def plan_devices(self) -> DevicePlan:
        """:func:`~.placement.plan_devices` for this run on the cluster Ray declares (each actor decides
        again with the CUDA devices it sees)."""
        import ray

        cfg = self.cfg
        p = bundles_for(cfg.layout, cfg.n_trainers, cfg.n_generators)
        share = len(set(p.trainer_bundle)) < len(p.trainer_bundle)
        return plan_devices(cfg.device, float(ray.cluster_resources().get("GPU", 0)), len(p.bundles), None, share)

    def build_sync_group(self, members: list[int] | None = None) -> None:
        """Trainer 0 = rank 0, the member generators ranks 1.., on a new key prefix (epoch)."""
        members = list(range(len(self.gens))) if members is None else sorted(members)
        self.epoch += 1
        world = 1 + len(members)
        host, port = self.store_at
        futs = [self.trainers[0].join_sync.remote(host, port, self.epoch, world)]
        futs += [
            self.gens[g].join_sync.options(concurrency_group="sync").remote(host, port, self.epoch, world, r + 1)
            for r, g in enumerate(members)
        ]
        # blocking: trainer 0 joins after the update it is running (its default concurrency group), so
        # the controller waits that long; counted as blocked time, bounded like every other wait
        self._get(futs)
        self.sync_members = members
        self.group_builds.append(self.epoch)

    def sync_futures(self, version: int, gens: list[int] | None = None) -> tuple[list[Any], list[Any]]:
        """Start sending ``version`` to the generators; returns (sender futures, per-generator futures)."""
        gens = list(range(len(self.gens))) if gens is None else gens
        if self.cfg.sync == "engine":
            if sorted(gens) != self.sync_members:  # a generator left or came back: a new group
                self.build_sync_group(gens)
            send = [self.trainers[0].send_weights.remote(version)]
            recv = [
                self.gens[i].receive_weights.options(concurrency_group="sync").remote(version, self._inc(i))
                for i in gens
            ]
        else:
            ref = self.trainers[0].get_flat.remote()
            send = [ref]
            recv = [
                self.gens[i].set_weights.options(concurrency_group="sync").remote(ref, version, self._inc(i))
                for i in gens
            ]
        return send, recv

    def _inc(self, g: int) -> int | None:
        """The incarnation of generator ``g`` the controller knows (its calls carry it)."""
        return self.gen_info[g]["incarnation"] if self.gen_info else None

    def warm_start(self) -> None:
        """Lesson 07's supervised warm start, in this process (one torch thread: the actors are
        starting on the same cores; measured 2.9 s -> 26.8 s when the driver kept its threads)."""
        import torch

        torch.set_num_threads(1)
        from course_lib.lm.model import TinyLM
        from course_lib.lm.task import CountdownTask, warm_start
        from course_lib.runtime.weights import flat_parameters

        t0 = time.perf_counter()
        torch.manual_seed(self.cfg.seed)
        model = TinyLM(self.cfg.lm())
        warm_start(model, CountdownTask(), self.cfg.warm_steps, seed=self.cfg.seed)
        self.init_flat = flat_parameters(model).numpy()
        self.t["warm_start_s"] = time.perf_counter() - t0

    def evaluate(self) -> float:
        """Held-out reward (lesson 11's measure), the prompts split over the trainers."""
        import ray

        futs = [t.evaluate.remote(i, len(self.trainers)) for i, t in enumerate(self.trainers)]
        parts = ray.get(futs, timeout=self.cfg.timeout_s * 4)
        return sum(p[0] for p in parts) / max(sum(p[1] for p in parts), 1)

    # ---- the loops ----
    def train_step(self, u: int, groups: dict[int, dict[str, Any]]) -> list[Any]:
        """Start update ``u`` on every trainer, each with its share of groups ``uB .. (u+1)B - 1``."""
        B = self.cfg.groups_per_batch
        self.train_started[u] = time.perf_counter() - self.t0
        ks = list(range(u * B, (u + 1) * B))
        share = len(ks) // len(self.trainers)
        shares = [[groups.pop(k) for k in ks[i * share : (i + 1) * share]] for i in range(len(self.trainers))]
        # the rollouts pass through this process by value: received from the generators, sent on (counted once)
        t0 = time.perf_counter()
        self.driver_bytes.append(sum(len(pickle.dumps(x, protocol=5)) for x in shares))
        self.count_s += time.perf_counter() - t0
        return [t.update.remote(u, x) for t, x in zip(self.trainers, shares)]

    def record(self, u: int, results: list[dict[str, Any]], t_end: float) -> None:
        n_tok = sum(r["tokens"] for r in results)
        w, w2 = sum(r["w_sum"] for r in results), sum(r["w2_sum"] for r in results)
        width = self.cfg.lag_bound + 1
        hist = np.sum([np.pad(r["lag_hist"], (0, width - len(r["lag_hist"]))) for r in results], axis=0)
        self.metrics.append(
            {
                "u": u,
                "time": t_end - self.t0,
                "started": self.train_started[u],
                "reward": sum(r["reward_sum"] for r in results) / sum(r["n_seq"] for r in results),
                "tokens": n_tok,
                "lag_max": max(r["lag_max"] for r in results),
                "lag_mean": sum(r["lag_sum"] for r in results) / n_tok,
                "lag_hist": hist.tolist(),
                "ess": w * w / (n_tok * w2),
                "train_s": max(r["seconds"] for r in results),
                "gen_steps": self.gen_steps,  # running totals: a window's slot occupancy
                "gen_slot_steps": self.gen_slot_steps,
                "allreduce_s": max(r["allreduce_s"] for r in results),
            }
        )
        for r in results:
            self.ledger.consumed += [(int(k), int(j)) for k, j in r["ids"]]

    def maybe_checkpoint(self, done: int) -> None:
        """After ``done`` updates, every ``checkpoint_every``: trainer 0 commits its state once the weights
        are on their way, before its next update (in series with training, as lesson 11's trainer 0)."""
        every = self.cfg.checkpoint_every
        if every and done % every == 0:
            self.checkpoints.append(self.trainers[0].checkpoint.remote(done))

    def _check_deadline(self, u: int) -> None:
        if time.perf_counter() > self.deadline:
            raise TimeoutError(f"the run passed deadline_s={self.cfg.deadline_s} s at update {u}")

    def _get(self, futs: list[Any]) -> list[Any]:
        import ray

        t0 = time.perf_counter()
        out = ray.get(futs, timeout=self.cfg.timeout_s * 4)
        self.blocked_s += time.perf_counter() - t0
        return out

    def count_steps(self, out: Mapping[str, Any]) -> None:
        """A decoding call's steps and busy slots, summed (each update's record keeps the running totals)."""
        self.gen_steps += int(out.get("steps", 0))
        self.gen_slot_steps += int(out.get("slot_steps", 0))

    def _returned(self, grp: dict[str, Any]) -> None:
        self.ledger.returned_by(grp["k"], (grp["gen"], grp["incarnation"]))

    def run_colocated(self) -> None:
        """sync_colocated: every update: generate (every bundle's generators), hand over, train, sync."""
        cfg, B = self.cfg, self.cfg.groups_per_batch
        self.t0 = time.perf_counter()
        send, recv = self.sync_futures(0)
        self._get(send + recv)
        for u in range(cfg.n_updates):
            self._check_deadline(u)
            ta = time.perf_counter()
            ks = list(range(u * B, (u + 1) * B))
            futs = []
            for i, g in enumerate(self.gens):
                mine = ks[i :: len(self.gens)]
                for k in mine:
                    self.ledger.admitted[k] = (i, 0)
                futs.append(g.run.remote(mine, until_done=True))
            groups = {}
            for out in self._get(futs):
                self.count_steps(out)
                for grp in out["groups"]:
                    self._returned(grp)
                    groups[grp["k"]] = grp
            tb = time.perf_counter()
            self._get([g.offload.remote() for g in self.gens])  # the bundles go to the trainers
            tc = time.perf_counter()
            results = self._get(self.train_step(u, groups))
            td = time.perf_counter()
            self._get([t.offload.remote() for t in self.trainers] + [g.onload.remote() for g in self.gens])
            te = time.perf_counter()
            send, recv = self.sync_futures(u + 1)
            self._get(send + recv)
            tf = time.perf_counter()
            self.record(u, results, td)
            self.metrics[-1].update(
                {
                    "phase_generate": tb - ta,
                    "phase_handover": (tc - tb) + (te - td),
                    "phase_train": td - tc,
                    "phase_sync": tf - te,
                }
            )
            self.sync_times.append(tf - te)
            self.maybe_checkpoint(u + 1)
        self.t["run_s"] = time.perf_counter() - self.t0

    def run_split(self) -> None:
        """sync_split / pipeline: generators decode continuously; the controller admits groups under
        the lag bound, trains when a batch is complete, syncs after every update, and carries on
        through a generator's failure (:class:`~.split_loop.SplitLoop`)."""
        loop = SplitLoop(self)
        self.t0 = time.perf_counter()
        loop.start_sync(0)  # version 0 to every generator
        while loop.u < self.cfg.n_updates:
            self._check_deadline(loop.u)
            loop.admit()  # idle generators get groups, under the lag bound (12.1)
            loop.maybe_train()  # batch u complete and no update running: update u on every trainer
            loop.maybe_inject_fault()  # the demo's fault (kill_at)
            f = loop.wait_one()  # the first call to finish: a decode, a transfer, a probe, the update
            if f is not None:
                loop.handle(f)
        self.t["run_s"] = time.perf_counter() - self.t0
        loop.drain()

    # ---- one run ----
    def go(self) -> dict[str, Any]:
        """Place, warm-start, evaluate, run the layout's loop, evaluate, audit; the actors and the
        placement group are removed whatever happens. Returns the report (keys: see the code)."""
        import ray

        if self.metrics:
            raise RuntimeError("a Controller runs once: make a new one for the next run")
        t_all = time.perf_counter()
        self.deadline = t_all + self.cfg.deadline_s
        try:
            self.place()
            t0 = time.perf_counter()
            eval_start = self.evaluate()
            self.t["eval_s"] = time.perf_counter() - t0
            if self.cfg.split:
                self.run_split()
            else:
                self.run_colocated()
            t0 = time.perf_counter()
            eval_end = self.evaluate()
            self.t["eval_s"] += time.perf_counter() - t0
            self.checkpoint_s = [float(x) for x in ray.get(self.checkpoints, timeout=self.cfg.timeout_s)]
            if self.checkpoints:
                ray.get(self.trainers[0].drop_checkpoints.remote(), timeout=self.cfg.timeout_s)
            gstats = []
            for g in self.gens:  # a generator still restarting when the run ends answers "unavailable"
                try:
                    gstats.append(ray.get(g.stats.remote(), timeout=self.cfg.timeout_s))
                except ray.exceptions.RayActorError as exc:
                    gstats.append({"unavailable": type(exc).__name__})
        finally:
            t0 = time.perf_counter()
            self.teardown()
            self.t["teardown_s"] = time.perf_counter() - t0
        return self.report(eval_start, eval_end, gstats, time.perf_counter() - t_all)

    def teardown(self) -> None:
        """Kill every actor (trainer 0's store goes with it), remove the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for a in self.trainers + self.gens:
            with contextlib.suppress(Exception):
                ray.kill(a)
        if self.pg is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.pg)

    def report(self, eval_start: float, eval_end: float, gstats: list[Any], wall_s: float) -> dict[str, Any]:
        cfg, m = self.cfg, self.metrics
        run_s = self.t["run_s"]
        audit = self.ledger.audit(cfg.n_updates * cfg.groups_per_batch, cfg.group_size)
        # per second of updating, as lesson 11's report: first update's start to the last one's end
        first = m[0]["started"]
        upd_s = len(m) / (m[-1]["time"] - first)
        # controller overhead: the loop's time not spent blocked in ray.wait / ray.get, per update
        overhead = (run_s - self.blocked_s - self.count_s) / cfg.n_updates
        kill: dict[str, Any] = {}
        if self.kill:
            k = self.kill
            kill = {
                "u": k["u"],
                "idle": bool(k.get("idle")),
                "lost_groups": len(k.get("lost_groups", [])),
                "detect_s": k.get("t_detect", np.nan) - k["t_kill"],
                "restart_ready_s": k.get("t_ready", np.nan) - k["t_kill"],
                "rejoined_s": k.get("t_rejoined", np.nan) - k["t_kill"],
                "first_group_s": k.get("t_first_group", np.nan) - k["t_kill"],
                "at_s": k["t_kill"] - self.t0,
                "old_pid": k["pid"],
                "new_pid": k.get("new_pid"),
                "new_process_age_at_ready_s": k.get("new_process_age_s"),
                "fault": k["fault"],
                "during_sync": bool(k["during_sync"]),
                "same_process": k.get("same_process"),
                "final": 1 in self.gone,
            }
        syncs = self.sync_send if cfg.split else self.sync_times
        return {
            "config": dataclasses.asdict(cfg),
            "placement": dataclasses.asdict(self.placement),
            "devices": dataclasses.asdict(self.devices),
            "actors": self.actors,
            "times": self.t,
            "wall_s": wall_s,
            "updates_per_s": upd_s,
            "samples_per_s": upd_s * cfg.group_size * cfg.groups_per_batch,
            "answer_tokens_per_s": sum(x["tokens"] for x in m) / (m[-1]["time"] - first),
            "controller_overhead_ms_per_update": overhead * 1e3,
            "lag_max": max(x["lag_max"] for x in m),
            "lag_mean": float(np.mean([x["lag_mean"] for x in m])),
            "lag_bound": cfg.lag_bound,
            "lag_hist": np.sum([x["lag_hist"] for x in m], axis=0).tolist(),
            "ess_min": min(x["ess"] for x in m),
            "eval_start": eval_start,
            "eval_end": eval_end,
            "sync_send_ms_median": float(np.median(syncs) * 1e3) if syncs else None,
            "sync_recv_ms_median": float(np.median(self.sync_recv) * 1e3) if self.sync_recv else None,
            "train_ms_median": float(np.median([x["train_s"] for x in m]) * 1e3),
            "allreduce_ms_median": float(np.median([x["allreduce_s"] for x in m]) * 1e3),
            "phases_ms_median": {
                p: float(np.median([x[p] for x in m]) * 1e3)
                for p in ("phase_generate", "phase_handover", "phase_train", "phase_sync")
                if p in m[0]
            },
            "metrics": m,
            "generators": gstats,
            "audit": audit,
            "kill": kill,
            "decode_calls": self.decode_calls,
            "reprobes": self.reprobes,
            "rejoins": self.rejoins,
            "restart_expired": self.restart_expired,
            "returns": self.returns,
            "checkpoint_ms": [x * 1e3 for x in self.checkpoint_s],
            "driver_kb_per_update": float(np.median(self.driver_bytes)) / 1e3,
            "gone": sorted(self.gone),
            "sync_group_builds": len(self.group_builds),
            "sync_errors": self.sync_errors,
            "blocked_s": self.blocked_s,
            "run_s": run_s,
        }


def check_run(rep: dict[str, Any], min_gain: float = 0.03) -> list[str]:
    """The claims, as failures (empty: all hold): the lag bound kept, an exact audit, learning (held-out
    reward above the warm start by more than ``min_gain``; 120 updates: +0.07 to +0.11 measured), and
    with a kill while it decoded: groups lost in flight."""
    fails = []
    if rep["lag_max"] > rep["lag_bound"]:
        fails.append(f"lag {rep['lag_max']} > bound {rep['lag_bound']}")
    if not rep["audit"]["ok"]:
        fails.append(f"audit: {rep['audit']}")
    if not rep["eval_end"] > rep["eval_start"] + min_gain:
        fails.append(f"did not learn: {rep['eval_start']:.3f} -> {rep['eval_end']:.3f}")
    if rep["kill"] and not rep["kill"]["idle"] and not rep["audit"]["lost_groups"]:
        fails.append("a generator was killed but no group was lost in flight")
    return fails


def run(cfg: RayRunConfig, *, min_gain: float = 0.03, quiet: bool = True) -> dict[str, Any]:
    """One run in the Ray this process started (:func:`~course_lib.capstone_ray.cluster.start_ray`).

    Returns :meth:`Controller.go`'s report plus ``fails`` (:func:`check_run`), ``load_1min_before``
    and ``captured_stdout``: with ``quiet``, what was printed to ``sys.stdout`` during the run (a
    Ray thread of this process prints "A worker died or was killed ..." after a kill; a notebook
    would show it). Main keys: ``updates_per_s``, ``samples_per_s``, ``answer_tokens_per_s``,
    ``controller_overhead_ms_per_update``, ``lag_max``, ``lag_bound``, ``lag_hist``, ``eval_start``,
    ``eval_end``, ``audit``, ``kill``, ``phases_ms_median`` (sync_colocated), ``metrics`` (one dict
    per update: ``u``, ``time`` and ``started`` in seconds since the loop began, ``reward``,
    ``tokens``, ``lag_max``, ``lag_mean``, ``ess``, ...), ``placement``, ``actors`` (where each landed),
    ``times``, ``wall_s``.

    The warm start runs in this process with one torch thread (``torch.set_num_threads(1)``, left so:
    the actors start on the same cores meanwhile).

    Raises:
        RuntimeError: Ray is not running in this process.
        TimeoutError: nothing finished within ``cfg.timeout_s``, or the run passed ``cfg.deadline_s``
            (the actors are removed first).
    """
    import ray

    if not ray.is_initialized():
        raise RuntimeError("Ray is not running in this process: call cluster.start_ray() first")
    load = os.getloadavg()[0]
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
            rep = Controller(cfg).go()
    except Exception as exc:
        if out.getvalue():
            exc.add_note(f"printed during the run (captured): {out.getvalue()[-2000:]}")
        raise
    rep["fails"] = check_run(rep, min_gain)
    rep["load_1min_before"] = load
    rep["captured_stdout"] = out.getvalue()
    return rep
