"""The two actors: :class:`TrainerWorker` and :class:`GeneratorWorker`.

Plain classes: the controller applies ``ray.remote`` (with their concurrency groups), so this
module imports without Ray, and a test can run a worker's code in-process. Everything heavy
(torch, the model) is imported inside the methods, in the actor's process.

* :class:`TrainerWorker`: one data-parallel trainer: lesson 07's truncated-IS loss on its share of
  the batch (lesson 11's ``shard_loss``), token count and flattened gradient all-reduced over the
  trainers' own gloo group (lesson 11's exact-sum scheme: the summed gradient is the gradient of
  the whole batch's loss), Adam. Trainer 0 is also the sender of the weight sync: lesson 09's
  engine on a :class:`~course_lib.runtime.groups.StandaloneGroup` with the generators, or its
  weights as one numpy array for Ray's object store.
* :class:`GeneratorWorker`: lesson 07's ``SlotSampler`` (KV cache, continuous batching). Three
  concurrency groups: decoding (default: one call = up to ``chunk_steps`` steps), ``sync`` (weights
  land in the engine's staging store while decoding goes on, then are copied into the model under
  a lock between two decoding steps: the in-flight update, KV cache kept) and ``control``
  (``ready``/``where`` answer while a decode call runs).

Every actor pins itself to a core its bundle claims on its node (:mod:`.cores`; Ray's ``num_cpus``
is bookkeeping only; without pinning every layout is the same schedule on the machine's cores) and
runs one torch thread. Its device is the controller's :class:`~.placement.DevicePlan`, decided
again with the CUDA devices the actor sees: ``cuda:0`` (its bundle's GPU) or the CPU; the trainers'
group runs on the plan's backend. The weight-sync group stays gloo (buffers in host memory, copied
to and from the models on either device).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import warnings
from collections import deque
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from course_lib.capstone_ray.controller import RayRunConfig
    from course_lib.capstone_ray.placement import DevicePlan


def setup_process(core: int | None) -> int | None:
    """One torch thread; with ``core`` (the bundle's index among its placement group's bundles on
    this node) pinned to the core :func:`~.cores.claim_core` gives it on this node. Returns that
    core, or ``None``: not pinned (no ``core`` given, or every core this process may use is held
    by other placement groups)."""
    import torch

    torch.set_num_threads(1)
    if core is None or not hasattr(os, "sched_setaffinity"):
        return None
    from course_lib.capstone_ray.cores import claim_core

    group = "none"
    try:
        import ray

        if ray.is_initialized():  # the group and the Ray node: two Ray nodes on one host hold different bundles
            ctx = ray.get_runtime_context()
            group = f"{ctx.get_placement_group_id() or 'none'}@{ctx.get_node_id()}"
    except ImportError:
        pass
    chosen = claim_core(group, core, sorted(os.sched_getaffinity(0)))
    if chosen is not None:
        os.sched_setaffinity(0, {chosen})
    return chosen


def actor_devices(devices: DevicePlan | None) -> tuple[DevicePlan, Any]:
    """The controller's plan decided again in this process (``None``: CPUs and gloo), and the torch device.

    Raises:
        ValueError: ``device='cuda'`` and this process sees no CUDA device (:func:`~.placement.plan_devices`).
    """
    import torch

    from course_lib.capstone_ray.placement import plan_devices

    plan = plan_devices("cpu", 0, 0) if devices is None else devices.in_actor(torch.cuda.device_count())
    if plan.device == "cuda":
        torch.cuda.set_device(0)  # Ray's CUDA_VISIBLE_DEVICES: the bundle's GPU is this process's device 0
        return plan, torch.device("cuda", 0)
    return plan, torch.device("cpu")


def placed(worker: Any) -> dict[str, Any]:
    """What a worker decided at its start: the core it pinned itself to (``None``: not pinned), its
    torch device, the trainers' backend and why (the device plan's reason)."""
    return {
        "pinned_core": worker.pinned_core,
        "device": str(worker.device),
        "backend": worker.devices.backend,
        "device_reason": worker.devices.reason,
    }


def where_am_i() -> dict[str, Any]:
    """Where Ray put this actor: pid, placement group, the bundle its CPUs were granted from (read
    from the raylet's grant, ``CPU_group_<bundle>_<pg>``), its CPU share, the cores it may run on,
    and the GPUs Ray granted it (``ray.get_gpu_ids()``; empty without GPUs)."""
    import ray

    ctx = ray.get_runtime_context()
    bundle: int | None = None
    share = 0.0
    try:  # the raylet's grant; no public API names the bundle
        worker: Any = ray._private.worker.global_worker
        for name, slots in worker.core_worker.resource_ids().items():
            parts = name.split("_")
            if name.startswith("CPU_group_") and len(parts) == 4 and parts[2].isdigit():
                bundle, share = int(parts[2]), float(sum(x[1] for x in slots))
    except Exception:
        pass
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return {
        "pid": os.getpid(),
        "node_id": ctx.get_node_id(),
        "placement_group_id": ctx.get_placement_group_id(),
        "bundle": bundle,
        "cpus": share,
        "cores": cores,
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }


class TrainerWorker:
    """One data-parallel trainer (see the module docstring)."""

    def __init__(self, cfg: RayRunConfig, rank: int, core: int | None, devices: DevicePlan | None = None) -> None:
        self.pinned_core = setup_process(core)
        import torch

        from course_lib.lm.model import TinyLM

        self.cfg, self.rank = cfg, rank
        self.devices, self.device = actor_devices(devices)
        # where the trainers' collectives run: the GPU under NCCL, else host memory (gloo)
        self.comm_device = self.device if self.devices.backend == "nccl" else torch.device("cpu")
        self.model = TinyLM(cfg.lm()).to(self.device)
        torch.manual_seed(cfg.seed)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.lr)
        self.sender: Any = None
        self.store: Any = None
        self.ckpt_root: Any = None  # trainer 0's checkpoint directory, on its node (:meth:`checkpoint`)
        self.version = 0

    def pid(self) -> int:
        return os.getpid()

    def open_store(self) -> tuple[str, int]:
        """Trainer 0: the run's rendezvous, a TCPStore served by this process on its own node's address,
        on a port the OS picks as it binds (no port chosen elsewhere and bound later). The trainers'
        group and every weight-sync group meet there. Returns (address, port)."""
        import datetime

        import ray
        import torch.distributed as dist

        host = ray.util.get_node_ip_address()
        timeout = datetime.timedelta(seconds=self.cfg.timeout_s)
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timeout)
        return host, int(self.store.port)

    def where(self) -> dict[str, Any]:
        """See :func:`where_am_i`."""
        return where_am_i() | {"role": "trainer", "index": self.rank, **placed(self)}

    def load(self, flat: np.ndarray) -> None:
        """The warm-started weights (every trainer the same)."""
        import torch

        from course_lib.runtime.weights import load_flat_parameters

        load_flat_parameters(self.model, torch.from_numpy(np.array(flat)))

    def join_trainer_group(self, host: str, port: int, world: int) -> float:
        """Join the trainers' own group (this process's default group) at trainer 0's store ``host:port``."""
        import datetime

        import torch.distributed as dist

        t0 = time.perf_counter()
        timeout = datetime.timedelta(seconds=self.cfg.timeout_s)
        store = self.store or dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
        dist.init_process_group(
            self.devices.backend,
            store=dist.PrefixStore("trainers", store),
            rank=self.rank,
            world_size=world,
            timeout=timeout,
        )
        return time.perf_counter() - t0

    def join_sync(self, host: str, port: int, epoch: int, world: int) -> float:
        """Trainer 0: be rank 0 (the sender) of sync group ``epoch`` (lesson 09's engine, handshake included),
        on the store this process serves (:meth:`open_store`)."""
        from course_lib.capstone.channels import BroadcastChannel
        from course_lib.runtime.groups import StandaloneGroup
        from course_lib.weight_sync.config import SyncConfig

        t0 = time.perf_counter()
        group = StandaloneGroup(host, port, f"sync/{epoch}", 0, world, self.cfg.sync_timeout_s, store=self.store)
        config = SyncConfig(method="pipelined", bucket_mb=self.cfg.bucket_mb)
        self.sender = BroadcastChannel(cast(Any, group), True, self.model, config)  # comm.py takes a StandaloneGroup
        return time.perf_counter() - t0

    def send_weights(self, version: int) -> dict[str, float]:
        """Send ``version`` to the sync group's generators (lesson 09's engine)."""
        t = self.sender.send(self.model, version)
        return {"total": t.total, "stage": t.stage, "transfer": t.transfer}

    def get_flat(self) -> np.ndarray:
        """The weights as one float32 numpy array (Ray stores it in the object store: zero-copy reads)."""
        from course_lib.runtime.weights import flat_parameters

        return flat_parameters(self.model).cpu().numpy()

    def _summed_gradient(self, batch: dict[str, Any]) -> tuple[Any, float]:
        """Backward of this shard's part of (07.2), then the token count and the flattened gradient
        all-reduced over the trainers: every trainer's ``.grad`` is the whole batch's gradient.
        Returns (the real tokens' ``log pi - log mu``, seconds in all-reduce)."""
        import torch
        import torch.distributed as dist

        from course_lib.capstone.trainer import shard_loss

        n_tok = torch.tensor([float(batch["mask"].sum())], dtype=torch.float64, device=self.comm_device)
        t1 = time.perf_counter()
        dist.all_reduce(n_tok)
        t_ar = time.perf_counter() - t1
        loss, log_ratio = shard_loss(self.model, batch, int(n_tok.item()), self.cfg.clip_c, self.cfg.train_chunk)
        self.opt.zero_grad()
        loss.backward()
        params = list(self.model.parameters())
        flat = torch.cat([p.grad.reshape(-1) for p in params]).to(self.comm_device)  # type: ignore[union-attr]
        t1 = time.perf_counter()
        dist.all_reduce(flat)
        t_ar += time.perf_counter() - t1
        offset = 0
        for p in params:
            p.grad = flat[offset : offset + p.numel()].view_as(p).to(p.device, copy=True)
            offset += p.numel()
        return log_ratio, t_ar

    def gradient(self, groups: list[dict[str, Any]]) -> np.ndarray:
        """The all-reduced gradient for this trainer's ``groups`` (every trainer calls it with its
        share), flattened, without an optimizer step (what :meth:`update` steps with)."""
        import torch

        from course_lib.pipeline.loss import pad_groups

        self._summed_gradient(pad_groups(groups))
        grads = [p.grad.reshape(-1) for p in self.model.parameters()]  # type: ignore[union-attr]
        return torch.cat(grads).cpu().numpy()

    def update(self, u: int, groups: list[dict[str, Any]]) -> dict[str, Any]:
        """One step at version ``u`` on this trainer's ``groups``; returns sums the controller adds up.

        Raises:
            AssertionError: ``u`` is not this trainer's version, or a token lags more than the bound.
        """
        import torch

        from course_lib.pipeline.loss import pad_groups, token_lags

        t0 = time.perf_counter()
        cfg = self.cfg
        assert u == self.version, (u, self.version)
        batch = pad_groups(groups)
        mask = batch["mask"]
        lag = token_lags(u, batch["versions"].numpy(), mask.numpy())[mask.numpy()]
        if lag.size and int(lag.max()) > cfg.lag_bound:
            raise AssertionError(f"update {u}: a token lags {int(lag.max())} > bound {cfg.lag_bound}")
        log_ratio, t_ar = self._summed_gradient(batch)
        self.opt.step()
        self.version = u + 1
        w = torch.exp(log_ratio.double().clamp(max=50.0))
        ids = [[g["k"], a["j"]] for g in groups for a in g["answers"]]
        return {
            "u": u,
            "reward_sum": float(batch["rewards"].sum()),
            "n_seq": int(batch["rewards"].size),
            "tokens": int(mask.sum()),
            "lag_max": int(lag.max()) if lag.size else 0,
            "lag_sum": float(lag.sum()),
            "lag_hist": np.bincount(lag, minlength=cfg.lag_bound + 1).tolist(),
            "w_sum": float(w.sum()),
            "w2_sum": float((w * w).sum()),
            "ids": ids,
            "seconds": time.perf_counter() - t0,
            "allreduce_s": t_ar,
        }

    def checkpoint(self, step: int) -> float:
        """Trainer 0: commit the training state (model, Adam) as lesson 11's trainer does, with lesson
        10's atomic save, into a directory of this process's node (kept: the last two); returns seconds."""
        import tempfile
        from pathlib import Path

        from course_lib.checkpoint.atomic import keep_last
        from course_lib.checkpoint.torch_state import save_torch_state

        t0 = time.perf_counter()
        if self.ckpt_root is None:
            self.ckpt_root = Path(tempfile.mkdtemp(prefix="ray-capstone-ckpt-"))
        save_torch_state(self.ckpt_root, step, self.model, self.opt, extra={"version": self.version})
        keep_last(self.ckpt_root, 2)
        return time.perf_counter() - t0

    def drop_checkpoints(self) -> None:
        """Remove this process's checkpoint directory (the end of a run)."""
        import shutil

        if self.ckpt_root is not None:
            shutil.rmtree(self.ckpt_root, ignore_errors=True)
            self.ckpt_root = None

    def evaluate(self, shard: int, n_shards: int) -> tuple[float, int]:
        """(sum of rewards, count) on this trainer's share of the held-out prompts (lesson 11's measure)."""
        from course_lib.capstone.trainer import heldout_reward
        from course_lib.lm.task import CountdownTask

        # on a GPU the sampler's new tensors go beside the model (as lesson 11's trainer)
        with self.device if self.device.type == "cuda" else contextlib.nullcontext():
            return heldout_reward(
                self.model, CountdownTask(), self.cfg.eval_prompts, self.cfg.eval_seed, shard, n_shards
            )

    def offload(self) -> float:
        """Colocated: hand the bundle over: the gradients dropped. (A GPU system would also move the
        optimizer state to host memory and empty the allocator's cache; this one does not.)"""
        t0 = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    def ping(self) -> int:
        return self.version


class GeneratorWorker:
    """Lesson 07's SlotSampler in an actor (see the module docstring)."""

    def __init__(self, cfg: RayRunConfig, index: int, core: int | None, devices: DevicePlan | None = None) -> None:
        self.pinned_core = setup_process(core)
        import ray
        import torch

        from course_lib.lm.model import TinyLM
        from course_lib.lm.sampler import SlotSampler, generator_for
        from course_lib.lm.task import EOS, CountdownTask

        self.cfg, self.index = cfg, index
        # the epoch the controller gave this process (:meth:`rejoin`); None: a new process, told nothing yet
        self.incarnation: int | None = None
        with warnings.catch_warnings():  # Ray 2.60's own property trips its actor_id deprecation warning
            warnings.simplefilter("ignore", DeprecationWarning)
            self.reconstructed = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        self.devices, self.device = actor_devices(devices)
        self.model = TinyLM(cfg.lm()).to(self.device)
        self.task = CountdownTask()
        self._generator_for = generator_for
        self.sampler = SlotSampler(self.model, cfg.n_slots, EOS, self._rng(0), version=-1)
        self.lock = threading.Lock()
        self.queue: deque[int] = deque()  # admitted groups not started yet
        self.groups: dict[int, dict[str, Any]] = {}
        self.owner: dict[int, tuple[int, int]] = {}  # slot -> (k, j)
        self.issuing, self.next_j = -1, 0
        self.receiver: Any = None
        self.tokens = 0
        self.busy_s = 0.0
        self.steps = 0  # decoding steps taken, and busy slots summed over them (occupancy)
        self.slot_steps = 0
        self.swaps_in_flight = 0
        self._torch = torch

    def _rng(self, epoch: int) -> Any:
        return self._generator_for(self.model, self.cfg.seed * 1_000_003 + self.index * 1009 + epoch * 7919)

    # -- control (own concurrency group: answers while a decode call runs) --
    def ready(self) -> dict[str, Any]:
        """pid, incarnation (the controller's epoch; None before :meth:`rejoin`), index, process age."""
        import psutil

        return {
            "pid": os.getpid(),
            "incarnation": self.incarnation,
            "index": self.index,
            "reconstructed": self.reconstructed,
            "process_age_s": time.time() - psutil.Process().create_time(),
        }

    # -- fencing (default group: runs after any decoding call of the controller's still running) --
    def rejoin(self, epoch: int) -> dict[str, Any]:
        """Take ``epoch`` from the controller: calls meant for any other are declined from now on.

        A new process (Ray restarted the actor) holds nothing. A live one was cut off (a call to it
        raised ``ActorUnavailableError``, "may be available later"), so the controller has already
        asked for its groups again: it drops every group it holds, queued or half decoded, before
        answering. Either way the controller's ledger stays exact. ``was``: the epoch it held
        (None: a new process)."""
        with self.lock:
            was = self.incarnation
            if was is not None:  # the same process: forget the groups the controller counts as lost
                self.queue.clear()
                self.groups.clear()
                self.owner.clear()
                self.sampler.active[:] = False
                self.issuing, self.next_j = -1, 0
            self.incarnation = epoch
            self.sampler.generator = self._rng(epoch)
        return self.ready() | {"was": was}

    def where(self) -> dict[str, Any]:
        """See :func:`where_am_i`."""
        return where_am_i() | {"role": "generator", "index": self.index, **placed(self)}

    # -- weights (sync group thread) --
    def join_sync(self, host: str, port: int, epoch: int, world: int, rank: int) -> float:
        """Be rank ``rank`` (a receiver) of sync group ``epoch``, at trainer 0's store ``host:port``."""
        from course_lib.capstone.channels import BroadcastChannel
        from course_lib.runtime.groups import StandaloneGroup
        from course_lib.weight_sync.config import SyncConfig

        t0 = time.perf_counter()
        group = StandaloneGroup(host, port, f"sync/{epoch}", rank, world, self.cfg.sync_timeout_s)
        config = SyncConfig(method="pipelined", bucket_mb=self.cfg.bucket_mb)
        self.receiver = BroadcastChannel(cast(Any, group), False, self.model, config)
        return time.perf_counter() - t0

    def _restarted(self, incarnation: int | None) -> dict[str, Any] | None:
        """The answer to a call meant for another incarnation of this actor. A call sent while
        Ray restarts an actor runs on the new process: that process holds no group, no sync group
        and no weights (and no epoch until :meth:`rejoin`), so it declines, and the controller
        learns of the death. A process fenced by :meth:`rejoin` declines its old epoch's calls too."""
        if incarnation is None or incarnation == self.incarnation:
            return None
        return {"restarted": 1, "incarnation": self.incarnation, "expected": incarnation}

    def receive_weights(self, version: int, incarnation: int | None = None) -> dict[str, Any]:
        """Lesson 09's receive into the engine's staging store (no lock: decoding goes on), then
        the copy into the model between two decoding steps (under the lock)."""
        if (declined := self._restarted(incarnation)) is not None:
            return declined
        t0 = time.perf_counter()
        ph = self.receiver.end.receive(version + 1)
        t1 = time.perf_counter()
        with self.lock, self._torch.no_grad():
            for name, p in self.model.named_parameters():
                p.copy_(self.receiver.end.store.active[name])
            self._changed(version)
        return {"total": time.perf_counter() - t0, "transfer": ph.transfer, "load": time.perf_counter() - t1}

    def set_weights(self, flat: np.ndarray, version: int, incarnation: int | None = None) -> dict[str, Any]:
        """Object-store path: ``flat`` arrives as a read-only view of the object store."""
        from course_lib.runtime.weights import load_flat_parameters

        if (declined := self._restarted(incarnation)) is not None:
            return declined
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # from_numpy of a read-only (zero-copy) array
            t = self._torch.from_numpy(flat)
        with self.lock:
            if version < self.sampler.version:  # an older transfer finishing late: never load it over a newer one
                return {"total": time.perf_counter() - t0, "stale": 1.0}
            load_flat_parameters(self.model, t)
            self._changed(version)
        return {"total": time.perf_counter() - t0}

    def get_flat(self) -> np.ndarray:
        """The generator's weights as one float32 array (tests: what arrived)."""
        from course_lib.runtime.weights import flat_parameters

        with self.lock:
            return flat_parameters(self.model).cpu().numpy().copy()

    def _changed(self, version: int) -> None:
        if version > self.sampler.version:
            if self.sampler.n_active:
                self.swaps_in_flight += 1
            self.sampler.weights_changed(version, recompute=False)

    # -- decoding (default group) --
    def _refill(self) -> None:
        from course_lib.capstone.generator import problem_for
        from course_lib.lm.sampler import sample_key

        for slot in self.sampler.free_slots():
            if self.next_j == 0 or self.next_j == self.cfg.group_size:
                if not self.queue:
                    return
                k = self.queue.popleft()
                self.groups[k] = {
                    "problem": problem_for(self.task, self.cfg.seed, k),
                    "start_version": self.sampler.version,
                    "answers": [],
                }
                self.issuing, self.next_j = k, 0
            # answer j of group k draws from (seed, k, j) alone: the same answers in every layout at lag 0
            key = sample_key(self.cfg.seed, self.issuing, self.next_j)
            self.sampler.start(slot, self.groups[self.issuing]["problem"].prompt, key=key)
            self.owner[slot] = (self.issuing, self.next_j)
            self.next_j += 1

    def _finish(self, slot: int) -> dict[str, Any] | None:
        k, j = self.owner.pop(slot)
        res = self.sampler.result(slot)
        p = int(res["prompt_len"])
        g = self.groups[k]
        answer = res["tokens"][p:].tolist()
        g["answers"].append(
            {
                "j": j,
                "answer": answer,
                "logp": res["logp"][p:].tolist(),
                "versions": res["versions"][p:].tolist(),
                "reward": self.task.reward(g["problem"], answer),
            }
        )
        self.tokens += len(answer)
        if len(g["answers"]) < self.cfg.group_size:
            return None
        self.groups.pop(k)
        g["answers"].sort(key=lambda a: a["j"])
        return {
            "k": k,
            "gen": self.index,
            "incarnation": self.incarnation,
            "start_version": g["start_version"],
            "prompt": g["problem"].prompt,
            "answers": g["answers"],
        }

    def run(self, admit: list[int], until_done: bool = False, incarnation: int | None = None) -> dict[str, Any]:
        """Queue ``admit`` (group numbers), decode up to ``chunk_steps`` steps (or, ``until_done``,
        until every admitted group is finished) and return the groups that finished. A call meant
        for an earlier ``incarnation`` is declined (:meth:`_restarted`)."""
        if (declined := self._restarted(incarnation)) is not None:
            return declined
        assert self.sampler.version >= 0, "no weights yet"
        self.queue.extend(admit)
        done: list[dict[str, Any]] = []
        steps, slot_steps0 = 0, self.slot_steps
        t0 = time.perf_counter()
        while until_done or steps < self.cfg.chunk_steps:
            self._refill()
            active = self.sampler.n_active
            if active == 0:
                break
            with self.lock:
                finished = self.sampler.step()
            steps += 1
            self.steps += 1
            self.slot_steps += active  # a step costs the same however many slots are busy
            for slot in finished:
                g = self._finish(slot)
                if g is not None:
                    done.append(g)
            if done and not until_done and steps >= 4:
                break
        self.busy_s += time.perf_counter() - t0
        return {
            "groups": done,
            "steps": steps,
            "slot_steps": self.slot_steps - slot_steps0,
            "seconds": time.perf_counter() - t0,
            "active": self.sampler.n_active,
            "queued": len(self.queue),
            "version": self.sampler.version,
        }

    def offload(self) -> float:
        """Colocated: free the KV cache between phases (on a GPU: the memory the trainer then uses)."""
        t0 = time.perf_counter()
        assert self.sampler.n_active == 0
        self.sampler.cache = None  # type: ignore[assignment]
        return time.perf_counter() - t0

    def onload(self) -> float:
        """Colocated: the KV cache back before the next generation phase."""
        t0 = time.perf_counter()
        if self.sampler.cache is None:
            self.sampler.cache = self.model.new_cache(self.cfg.n_slots)
        return time.perf_counter() - t0

    def stats(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "busy_s": self.busy_s,
            "steps": self.steps,
            "occupancy": self.slot_steps / (self.steps * self.cfg.n_slots) if self.steps else None,
            "swaps": self.sampler.swaps,
            "swaps_in_flight": self.swaps_in_flight,
            "incarnation": self.incarnation,
        }
