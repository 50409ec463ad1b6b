"""The capstone job: one script, started by torchrun on every rank; each rank takes its role.

One machine (what ``course capstone`` runs; 4 ranks, restarts on failure)::

    torchrun --standalone --nproc-per-node 4 --max-restarts 2 -m course_lib.capstone.job --run-dir runs/capstone

Two machines: the same command on each host, with a c10d rendezvous on a host both can
reach, a ``--rdzv-id`` of its own for each launch, and the run directory on a filesystem both
see (checkpoints and the metrics that the sample ledger reads). It is the command
:func:`~.launch.torchrun_command` builds, which ``tests/test_capstone_multinode.py`` runs as
two agents on localhost, killing a rank under one of them::

    # on host A (10.0.0.1) and on host B, the same line:
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29400 \\
        --rdzv-id=capstone-1 --rdzv-conf=join_timeout=60,last_call_timeout=1 --max-restarts=2 \\
        --monitor-interval=0.2 -m course_lib.capstone.job --run-dir /shared/runs/capstone
    # GPUs: one per rank, NCCL (the default '--backend auto' picks it); or every rank on one
    # GPU with --colocated (gloo, weights through CUDA IPC); see resolve_backend

What a rank does (:func:`run_rank`):

1. read torchrun's environment; watch the agent (a rank exits if its agent dies); agree with
   every rank, on every node, on this attempt through the store
   (:func:`~.context.join_attempt`: not torchrun's restart count, which each agent keeps for
   itself); join the default process group (gloo or NCCL) with a timeout on every collective;
2. rank 0 prepares and posts the *setup* in the store: the attempt number, then either a
   restore (``--resume``, or this launch already registered an attempt, i.e. torchrun
   restarted it: the newest complete checkpoint, the ledger counting what the dead attempt
   generated after it as discarded) or a fresh start (lesson 07's warm start, the calibration
   and lesson 08's layout choice, printed);
3. every rank reads the setup, takes its role (:mod:`.roles`), makes the trainer group and the
   sync group (``new_group``), and runs :class:`~.trainer.Trainer` or :class:`~.generator.Generator`;
4. at the end trainer 0 evaluates (with the other trainers), all ranks meet at a barrier, and
   rank 0 closes the ledger and writes ``result.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from course_lib.capstone.channels import BroadcastChannel, SharedBufferChannel, WeightChannel
from course_lib.capstone.colocated import (
    SharedBuffer,
    cuda_ipc_handles,
    cuda_slots_from_handles,
    remove_buffers,
    run_key,
    shm_path,
)
from course_lib.capstone.config import CapstoneConfig, add_arguments, config_differences, from_args
from course_lib.capstone.context import Attempt, AttemptSuperseded, RankEnv, RunStore
from course_lib.capstone.generator import Generator
from course_lib.capstone.ledger import SampleLedger, audit
from course_lib.capstone.metrics import MetricsWriter
from course_lib.capstone.plan import Plan, calibrate, choose_layout, given_layout
from course_lib.capstone.report import RESULT, all_lines, generated_records, trained_records
from course_lib.capstone.roles import Roles, assign_roles
from course_lib.capstone.trainer import Trainer, TrainerState, checkpoint_root, state_digest
from course_lib.lm.model import TinyLM
from course_lib.lm.task import CountdownTask, warm_start
from course_lib.runtime.processes import watch_parent
from course_lib.weight_sync.config import SyncConfig

ATTEMPTS = "attempts.jsonl"
PLAN = "plan.json"


class SetupError(RuntimeError):
    """Rank 0 could not start the run (bad input, nothing to resume); every rank exits with its message."""


def resolve_backend(name: str, colocated: bool, local_ranks: int, n_gpus: int) -> tuple[str, str]:
    """(process-group backend, device type) for ``--backend name`` on a host with ``local_ranks``
    ranks and ``n_gpus`` GPUs.

    * no GPU: ``gloo`` on CPUs (``--colocated``: the weights through ``/dev/shm``);
    * ``--colocated`` with GPUs: every rank on GPU 0, as checkpoint-engine's colocated mode
      puts the inference engine beside the trainer; the weights go through CUDA IPC (the
      generators' parameters are views on trainer 0's slots, which must be on their GPU),
      and ``gloo`` carries the trainers' all-reduce of CUDA tensors through host memory
      (NCCL refuses two ranks of one communicator on one GPU). Not run here: no GPU;
    * otherwise ``nccl``, one GPU per rank;
    * ``auto``: ``nccl`` when there is a GPU per rank and not ``--colocated``, else ``gloo``.

    Raises:
        SetupError: the backend cannot run on this host, with what to use instead.
    """
    if name == "auto":
        name = "nccl" if n_gpus >= local_ranks and n_gpus > 0 and not colocated else "gloo"
    if name == "nccl":
        if n_gpus == 0:
            raise SetupError("--backend nccl needs CUDA GPUs (one per rank); use --backend gloo on CPUs")
        if colocated:
            raise SetupError(
                "--colocated puts every rank on one GPU, and NCCL needs one GPU per rank: use --backend gloo"
            )
        if n_gpus < local_ranks:
            raise SetupError(
                f"--backend nccl needs one GPU per rank: {local_ranks} ranks on this host, {n_gpus} GPU(s); "
                "start fewer ranks, or share one GPU with --colocated --backend gloo"
            )
        return "nccl", "cuda"
    return "gloo", "cuda" if colocated and n_gpus > 0 else "cpu"


def rank_device(device_type: str, colocated: bool, local_rank: int, n_gpus: int) -> torch.device:
    """The device of the rank with ``local_rank`` on its host (``device_type`` from :func:`resolve_backend`):
    the CPU; GPU 0 for every rank when colocated; else the rank's own GPU, ``local_rank``.

    Raises:
        SetupError: a GPU per rank was asked for and this rank has none.
    """
    if device_type != "cuda":
        return torch.device("cpu")
    if colocated:
        return torch.device("cuda", 0)
    if local_rank >= n_gpus:
        raise SetupError(f"local rank {local_rank} has no GPU of its own ({n_gpus} on this host): start fewer ranks")
    return torch.device("cuda", local_rank)


def _has_checkpoint(run_dir: Path) -> bool:
    from course_lib.checkpoint.atomic import list_steps

    return bool(list_steps(checkpoint_root(run_dir)))


def register_attempt(cfg: CapstoneConfig, env: RankEnv, launch: Attempt) -> tuple[int, bool]:
    """Rank 0: number this start of the job (0, 1, ... over the run's launches and restarts) and
    decide whether it restores: ``--resume``, or this launch already registered an attempt in
    ``attempts.jsonl`` (torchrun restarted it). ``launch`` is the attempt every rank agreed on
    through the store (:func:`~.context.join_attempt`); torchrun's restart count is not used,
    since the agents do not keep it in step.

    Returns (the attempt's number in the run, restoring).

    Raises:
        SetupError: ``--resume`` of a missing run or one without a checkpoint; a fresh start in a
            directory that already holds a run (of another launch).
    """
    run_dir = Path(cfg.run_dir)
    if not cfg.run_dir:
        raise SetupError("--run-dir is required: the directory the run writes its metrics and checkpoints to")
    log = run_dir / ATTEMPTS
    earlier = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    this_launch = any(a.get("launch") == launch.launch for a in earlier)
    if cfg.resume and not run_dir.is_dir():
        raise SetupError(f"--resume: the run directory {run_dir} does not exist; start a run there without --resume")
    if cfg.resume and not this_launch and not _has_checkpoint(run_dir):
        raise SetupError(f"--resume: {run_dir} holds no checkpoint to resume from (checkpoints/step_*); start afresh")
    if not cfg.resume and not this_launch and log.exists():
        raise SetupError(f"{run_dir} already holds a run; pass --resume to continue it, or choose another --run-dir")
    run_dir.mkdir(parents=True, exist_ok=True)
    attempt = len(earlier)
    record = {
        "attempt": attempt,
        "launch": launch.launch,
        "launch_attempt": launch.number,
        "restart_count": env.restart_count,
        "run_id": env.run_id,
        "t": time.time(),
    }
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\n")
    return attempt, cfg.resume or this_launch


@dataclass
class Setup:
    """What rank 0 decided and every rank needs (posted to the store as JSON)."""

    attempt: int
    plan: Plan
    step: int
    shm: str | None

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "plan": self.plan.to_json(), "step": self.step, "shm": self.shm}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Setup:
        return cls(data["attempt"], Plan.from_json(data["plan"]), data["step"], data["shm"])


def new_model(cfg: CapstoneConfig, device: torch.device) -> TinyLM:
    return TinyLM(cfg.lm).to(device)


def new_optimizer(model: TinyLM, cfg: CapstoneConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


#: Warm starts this process made: (TinyLM sizes, steps, seed) -> (weights, torch's RNG state after).
_WARM: dict[tuple[str, int, int], tuple[dict[str, torch.Tensor], torch.Tensor]] = {}


def warm_started(cfg: CapstoneConfig) -> dict[str, torch.Tensor]:
    """Lesson 07's supervised warm start of a fresh TinyLM (seeded: the same weights every time).

    A process that runs several arms (``--arms``) makes it once and reuses it, with torch's
    random state as the warm start left it: an arm then starts exactly as its own launch would.
    """
    key = (repr(cfg.lm), cfg.warm_steps, cfg.seed)
    if key not in _WARM:
        torch.manual_seed(cfg.seed)
        cpu_model = TinyLM(cfg.lm)
        warm_start(cpu_model, CountdownTask(), steps=cfg.warm_steps, seed=cfg.seed)
        _WARM[key] = ({k: v.clone() for k, v in cpu_model.state_dict().items()}, torch.get_rng_state())
    weights, rng = _WARM[key]
    torch.set_rng_state(rng)
    return weights


def prepare_rank0(
    cfg: CapstoneConfig, env: RankEnv, attempt: int, restoring: bool, device: torch.device
) -> tuple[TrainerState, Plan, dict[str, Any]]:
    """Restore from the newest checkpoint (``restoring``: see :func:`register_attempt`), or start
    fresh (warm start + layout); see the module docstring.

    Returns the trainer state, the plan and what the ``start`` line records.
    """
    from course_lib.checkpoint.atomic import NoCheckpoint, quarantine, restore_latest
    from course_lib.checkpoint.torch_state import load_torch_state

    run_dir = Path(cfg.run_dir)
    model = new_model(cfg, device)
    opt = new_optimizer(model, cfg)
    info: dict[str, Any] = {"resumed_step": None, "phases": []}
    if restoring and _has_checkpoint(run_dir):
        try:
            restored = restore_latest(checkpoint_root(run_dir), lambda p: load_torch_state(p, model, opt))
        except NoCheckpoint as exc:
            raise SetupError(str(exc)) from None
        for path, _ in restored.skipped:
            quarantine(path)
        extra = restored.value
        diff = config_differences(extra["config"], cfg)
        if diff:
            raise SetupError(f"checkpoint {restored.path} was written with another configuration: {'; '.join(diff)}")
        plan = Plan.from_json(extra["plan"])
        if plan.world_size != env.world_size:
            raise SetupError(
                f"the checkpoint's run has {plan.world_size} ranks, torchrun started {env.world_size}: "
                f"resume with --nproc-per-node x --nnodes = {plan.world_size}"
            )
        ledger = SampleLedger.from_json(extra["ledger"])
        step, eval_start = restored.step, extra["eval_start"]
        if step > cfg.n_updates:
            raise SetupError(f"the checkpoint is at update {step}, past --n-updates {cfg.n_updates}; raise it")
        info.update(resumed_step=step, checkpoint=str(restored.path), restored_sha256=state_digest(model.state_dict()))
    else:
        t0 = time.time()
        model.load_state_dict(warm_started(cfg))
        info["phases"].append(("warm_start", t0, time.time()))
        plan_file = run_dir / PLAN
        if plan_file.exists():  # a restart before the first checkpoint keeps the run's layout
            plan = Plan.from_json(json.loads(plan_file.read_text()))
        elif cfg.colocated_sync:  # every rank trains and samples: no split to choose
            plan = colocated_layout(cfg, env.world_size)
        elif cfg.calibrate:
            t0 = time.time()
            with device:  # timed where the ranks will run (a GPU's decode step is not a CPU's)
                rates = calibrate(model, CountdownTask(), cfg, env.local_world_size)
            plan = choose_layout(rates, cfg, env.world_size)
            info["phases"].append(("calibrate", t0, time.time()))
        else:
            plan = given_layout(cfg, env.world_size)
        ledger = SampleLedger(cfg.group_size, cfg.groups_per_batch)
        step, eval_start = 0, None
        info.update(resumed_step=0 if restoring else None)
    if restoring:
        info["discarded_groups"] = ledger.resume(attempt, step, generated_records(all_lines(run_dir)))
    roles_of(cfg, env.world_size, plan.n_trainers)  # fail here, with a clear message
    if not (run_dir / PLAN).exists():
        (run_dir / PLAN).write_text(json.dumps(plan.to_json(), indent=1))
    (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    return TrainerState(model, opt, step, ledger, eval_start), plan, info


def to_cpu(obj: Any) -> Any:
    """A copy of ``obj`` (nested dicts, lists, tuples) with every tensor moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(v) for v in obj)
    return obj


def share_state(
    state: TrainerState | None, cfg: CapstoneConfig, group: dist.ProcessGroup, device: torch.device
) -> TrainerState:
    """Trainer 0's state to every trainer (weights, Adam state, step, ledger): a broadcast of the
    state dicts over the trainer group, so that only trainer 0 needs the checkpoint files.

    The state dicts travel as CPU copies (a pickled CUDA tensor would come back on the GPU it
    was saved from, trainer 0's, on every trainer); each trainer loads them onto ``device``,
    its own. The pickled bytes go through ``device`` only where the group needs it (NCCL).
    """
    box: list[Any] = [None]
    if state is not None:
        box = [
            {
                "model": to_cpu(state.model.state_dict()),
                "optimizer": to_cpu(state.optimizer.state_dict()),
                "step": state.step,
                "ledger": state.ledger.to_json(),
                "eval_start": state.eval_start,
            }
        ]
    nccl = dist.get_backend(group) == "nccl"
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group, device=device if nccl else None)
    if state is not None:
        return state
    data = box[0]
    model = new_model(cfg, device)
    model.load_state_dict(data["model"])
    opt = new_optimizer(model, cfg)
    opt.load_state_dict(data["optimizer"])  # Adam's moments follow the parameters onto ``device``
    return TrainerState(model, opt, data["step"], SampleLedger.from_json(data["ledger"]), data["eval_start"])


def make_channel(
    cfg: CapstoneConfig,
    env: RankEnv,
    roles: Roles,
    setup: Setup,
    sync_group: dist.ProcessGroup,
    model: TinyLM,
    store: RunStore,
    device: torch.device,
) -> WeightChannel:
    """Trainer 0's or a generator's end of the weight channel (building the broadcast one is a
    handshake; in colocated mode on a GPU, trainer 0 posts its slots' CUDA IPC handles)."""
    if setup.shm is not None:
        numel = sum(p.numel() for p in model.parameters())
        buffer = SharedBuffer(setup.shm, numel, create=False)
        if env.rank == 0:
            if device.type == "cuda":  # the slots in GPU memory, shared by CUDA IPC (not run here: no GPU)
                store.put_json("cuda_slots", cuda_ipc_handles(buffer.cuda_slots(device)))
            return SharedBufferChannel(buffer, None, cfg.timeout_s)
        if device.type == "cuda":
            buffer.use_cuda_slots(cuda_slots_from_handles(store.get_json("cuda_slots", "trainer 0's CUDA IPC handles")))
        return SharedBufferChannel(buffer, roles.generators.index(env.rank), cfg.timeout_s)
    return BroadcastChannel(
        sync_group, env.rank == 0, model, SyncConfig(method=cfg.sync_method, bucket_mb=cfg.bucket_mb)
    )


def subgroups(trainers: list[int], sync_ranks: list[int], timeout_s: float) -> tuple[Any, Any]:
    """The trainers' group (their all-reduce) and the sync group (trainer 0 + generators: the
    weights), every rank calling it in the same order. Each gets the job's timeout: a subgroup
    does not inherit the world's (``new_group``'s default is the backend's, 30 min for gloo and
    10 for NCCL), and every collective of the job must fail after ``timeout_s``, not hang."""
    timeout = dt.timedelta(seconds=timeout_s)
    return dist.new_group(trainers, timeout=timeout), dist.new_group(sync_ranks, timeout=timeout)


def colocated_layout(cfg: CapstoneConfig, world_size: int) -> Plan:
    """``--colocated-sync``: ``--n-trainers`` ranks (default: all) each sample their own share of
    the batch (their slots: every answer of their groups at once), then train on it; the other
    ranks idle (one rank per core or GPU, as verl's colocated workers)."""
    ranks = cfg.n_trainers or world_size
    per_rank = -(-cfg.groups_per_batch // ranks)
    return Plan(world_size=world_size, n_trainers=ranks, n_slots=per_rank * cfg.group_size)


def roles_of(cfg: CapstoneConfig, world_size: int, n_trainers: int) -> Roles:
    """The roles of a run: lesson 08's split (:func:`~.roles.assign_roles`), or, with
    ``--colocated-sync``, ranks ``0 .. n_trainers - 1`` (0: all) that sample and train, each
    with a group of every batch, and the rest idle.

    Raises:
        ValueError: the split cannot run (the message says what to change).
    """
    if not cfg.colocated_sync:
        return assign_roles(world_size, n_trainers, cfg.groups_per_batch)
    ranks = n_trainers or world_size
    if not 2 <= ranks <= world_size:
        raise ValueError(f"--colocated-sync trains on 2 .. {world_size} ranks (--n-trainers), got {ranks}")
    if cfg.groups_per_batch < ranks:
        raise ValueError(
            f"--colocated-sync gives each of the {ranks} ranks its share of a batch of "
            f"{cfg.groups_per_batch} groups: raise --groups-per-batch to at least {ranks}"
        )
    return Roles(world_size, ranks)


def run_rank(cfg: CapstoneConfig, env: RankEnv, store: RunStore, device: torch.device) -> None:
    """Everything one rank does (see the module docstring)."""
    state: TrainerState | None = None
    launch = store.attempt
    if env.rank == 0:
        try:
            attempt, restoring = register_attempt(cfg, env, launch)
            state, plan, info = prepare_rank0(cfg, env, attempt, restoring, device)
            shm = None
            if cfg.colocated:
                if env.local_world_size != env.world_size:
                    raise SetupError("--colocated needs every rank on one host (the shared buffer is local memory)")
                remove_buffers(run_key(cfg.run_dir))  # what dead attempts left behind
                path = shm_path(run_key(cfg.run_dir), attempt)
                n_generators = env.world_size - plan.n_trainers
                SharedBuffer(path, sum(p.numel() for p in state.model.parameters()), create=True, readers=n_generators)
                shm = str(path)
            setup = Setup(attempt, plan, state.step, shm)
        except (SetupError, ValueError) as exc:
            store.put_json("setup", {"error": str(exc)})
            raise SetupError(str(exc)) from None
        B = cfg.groups_per_batch
        for key, value in (
            ("stop", 0),
            ("announced", -1),
            ("consumed", setup.step * B),
            ("next_group", setup.step * B),
        ):
            store.set_int(key, value)
        store.put_json("setup", setup.to_json())
    else:
        data = store.get_json(
            "setup", "rank 0 to prepare the run (warm start, calibration or restore)", 10 * cfg.timeout_s
        )
        if "error" in data:
            raise SetupError(f"rank 0 could not start the run: {data['error']}")
        setup = Setup.from_json(data)
    roles = roles_of(cfg, env.world_size, setup.plan.n_trainers)
    role = roles.role(env.rank)
    idle = cfg.colocated_sync and role == "generator"  # a rank colocated synchronous RL does not use
    trainer_group, sync_group = subgroups(roles.trainers, roles.sync_ranks, cfg.timeout_s)
    metrics = MetricsWriter(cfg.run_dir, env.rank, "idle" if idle else role, setup.attempt)
    start = {
        "restart_count": launch.restarts,  # this launch's restarts, the same on every node
        "torchelastic_restart_count": env.restart_count,  # this rank's agent's own count
        "launch": launch.launch,
        "resumed_step": setup.step,
        "node": env.node,
        "plan": setup.plan.to_json(),
    }
    if env.rank == 0:
        assert state is not None
        for name, t0, t1 in info.pop("phases"):
            metrics.span(name, t0, t1)
        start.update(info)
        print(setup.plan.text(cfg), flush=True)
        if launch.restarts > 0:
            metrics.event(
                f"torchrun restarted the job (restart {launch.restarts} of this launch; "
                f"TORCHELASTIC_RESTART_COUNT={env.restart_count} on rank 0's node) after a rank died: "
                f"attempt {setup.attempt} resumes from checkpoint step {setup.step}; "
                f"{info.get('discarded_groups', 0)} groups ({info.get('discarded_groups', 0) * cfg.group_size} samples) "
                "generated after that checkpoint are discarded",
                restart=True,
            )
    metrics.log("start", **start)
    try:
        if role == "trainer":
            state = share_state(state, cfg, trainer_group, device)
            channel = (
                make_channel(cfg, env, roles, setup, sync_group, state.model, store, device)
                if env.rank == 0 and roles.n_generators and not cfg.colocated_sync
                else None
            )
            trainer = Trainer(
                cfg, roles, env.rank, setup.attempt, state, store, metrics, trainer_group, channel, device
            )
            if state.eval_start is None:
                state.eval_start = trainer.evaluate("start")
            trainer.run(setup.plan.to_json())
        elif idle:
            pass  # it waits for the trainers' evaluation below, then meets every rank at the barrier
        else:
            with device:  # on a GPU the sampler's tensors live on this rank's GPU (not run here: no GPU)
                model = new_model(cfg, device)
                channel = make_channel(cfg, env, roles, setup, sync_group, model, store, device)
                try:
                    Generator(cfg, env.rank, setup.attempt, model, setup.plan.n_slots, store, metrics, channel).run()
                finally:
                    if isinstance(channel, SharedBufferChannel):
                        channel.close()
        if role == "trainer" and env.rank == 0:
            store.set_int("evaluated", 1)
        elif role == "generator":  # the trainers evaluate after the stop: wait for them here, not in the
            # barrier, whose timeout is the process group's (a 2048-prompt evaluation may take longer)
            store.get_json("evaluated", "the trainers' final evaluation", 20 * cfg.timeout_s)
        metrics.sync()  # every line on disk before rank 0 reads them all (a shared filesystem of several hosts)
        dist.barrier()
        if env.rank == 0:
            assert state is not None
            finish(cfg, setup, state, metrics)
    finally:
        metrics.close()
    for group in (trainer_group, sync_group):  # an arm of --arms makes its own: free these (NCCL communicators)
        dist.destroy_process_group(group)


def finish(cfg: CapstoneConfig, setup: Setup, state: TrainerState, metrics: MetricsWriter) -> None:
    """Rank 0, every rank done: close the ledger (groups left over), audit it, write ``result.json``."""
    lines = all_lines(cfg.run_dir)
    generated = generated_records(lines)
    state.ledger.finish(setup.attempt, generated)
    checks = audit(state.ledger, generated, trained_records(lines))
    ends = [x["reward"] for x in lines if x.get("kind") == "eval" and x.get("when") == "end"]
    result = {
        "updates": state.step,
        "attempts": setup.attempt + 1,
        "eval_start": state.eval_start,
        "eval_end": ends[-1] if ends else None,
        "ledger": state.ledger.to_json(),
        "audit": checks,
    }
    (Path(cfg.run_dir) / RESULT).write_text(json.dumps(result, indent=1))
    if setup.shm:
        SharedBuffer(setup.shm, sum(p.numel() for p in state.model.parameters())).unlink()
    metrics.event(
        f"finished {state.step} updates in {setup.attempt + 1} attempt(s): evaluation reward {state.eval_start:.3f} -> "
        f"{result['eval_end']:.3f}; ledger {'exact' if checks['ok'] else 'MISMATCH'} (generated "
        f"{checks['generated_samples']} = consumed {checks['consumed_samples']} + discarded "
        f"{checks['discarded_samples']} + left over {checks['leftover_samples']})",
        finished=True,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of every rank (``python -m course_lib.capstone.job``, under torchrun)."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.capstone.job", description="The capstone job (start it with torchrun)."
    )
    add_arguments(parser)
    try:
        cfg = from_args(parser.parse_args(argv))
        env = RankEnv.from_environ()
    except (ValueError, RuntimeError) as exc:
        print(f"capstone: {exc}", file=sys.stderr)
        return 2
    watch_parent()  # the torchrun agent: no rank outlives it
    torch.set_num_threads(1)
    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        backend, device_type = resolve_backend(cfg.backend, cfg.colocated, env.local_world_size, n_gpus)
        arms = [resolve_backend(cfg.backend, cfg.arm(i).colocated, env.local_world_size, n_gpus) for i in
                range(len(cfg.arm_list))]  # fmt: skip
        if any(arm != (backend, device_type) for arm in arms):
            raise SetupError(
                "--arms mixes colocated and broadcast arms, which run on different backends or devices on this "
                "host (GPUs): launch them separately"
            )
        device = rank_device(device_type, cfg.colocated, env.local_rank, n_gpus)
        if device.type == "cpu" and n_gpus and env.rank == 0:
            print(
                f"capstone: {n_gpus} GPU(s) for {env.local_world_size} ranks on this host: the ranks run on the "
                "CPUs (gloo). Start one rank per GPU (NCCL), or put every rank on GPU 0 with --colocated",
                flush=True,
            )
    except SetupError as exc:
        print(f"capstone: {exc}", file=sys.stderr)
        return 2
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = RunStore(env, cfg.timeout_s)
    try:
        store.join()  # the attempt every rank of this start agrees on (context.join_attempt)
    except (TimeoutError, AttemptSuperseded) as exc:
        print(f"capstone rank {env.rank}: {exc}", file=sys.stderr, flush=True)
        return 1
    dist.init_process_group(
        backend,
        store=store.for_process_group(),
        rank=env.rank,
        world_size=env.world_size,
        timeout=dt.timedelta(seconds=cfg.timeout_s),
    )
    try:
        if cfg.arms:  # several runs in turn, one start-up: each arm its directory and store keys
            for i in range(len(cfg.arm_list)):
                run_rank(cfg.arm(i), env, store.sub(f"arm{i}"), device)
        else:
            run_rank(cfg, env, store, device)
    except SetupError as exc:
        print(f"capstone rank {env.rank}: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
