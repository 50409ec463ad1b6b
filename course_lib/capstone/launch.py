"""Launching the job: the torchrun command line, a subprocess with a deadline, a progress bar.

:func:`torchrun_command` builds the command (no home-made launcher: torchrun starts the ranks,
restarts them on failure (``--max-restarts``) and tears them down); :func:`run` runs it in a
process group of its own, shows a progress bar fed by trainer 0's metrics, kills the whole
group if the deadline passes, checks that no process is left, and returns the run's
:class:`~course_lib.capstone.report.CapstoneReport`::

    from course_lib.capstone import run
    report = run("runs/capstone")                       # 4 ranks on this machine, COURSE_SCALE sizes
    report = run("runs/capstone", kill_rank=3, kill_at_update=60, max_restarts=1)   # a generator dies, the job recovers
    report = run("runs/capstone-2", agents=2)           # two torchrun agents (two "hosts") on localhost, c10d rendezvous

``agents=2`` starts two torchrun agents on this machine that meet through a c10d rendezvous
on 127.0.0.1, as two hosts would (:mod:`course_lib.capstone.job` has the real-hosts command).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from course_lib.capstone.colocated import remove_buffers, run_key
from course_lib.capstone.config import CapstoneConfig, to_argv
from course_lib.capstone.metrics import metrics_path, read_lines
from course_lib.capstone.report import CapstoneReport, load
from course_lib.runtime.processes import free_port

#: Lines of the job's output :func:`run` echoes (the rest goes to ``run_dir/torchrun.log``).
ECHO = ("layout:", "calibrated in", "lesson 08's model", "[capstone", "capstone:", "capstone rank")


class CapstoneFailed(RuntimeError):
    """The job exited with an error or ran past its deadline (the message has the log's tail)."""


def torchrun_command(
    config: CapstoneConfig,
    nproc_per_node: int,
    *,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_id: str = "capstone",
    max_restarts: int = 0,
    monitor_interval_s: float = 0.2,
) -> list[str]:
    """The torchrun command of one agent (``python -m torch.distributed.run``, this interpreter).

    One node without an endpoint: ``--standalone`` (a rendezvous on a free local port).
    Otherwise a c10d rendezvous at ``rdzv_endpoint`` (``host:port``) for ``nnodes`` agents.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if rdzv_endpoint is None:
            raise ValueError("several nodes need a rendezvous endpoint host:port (rdzv_endpoint)")
        cmd += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--rdzv-id={rdzv_id}",
            "--rdzv-conf=join_timeout=60,last_call_timeout=1",
        ]
    cmd += [f"--max-restarts={max_restarts}", f"--monitor-interval={monitor_interval_s}"]
    return cmd + ["-m", "course_lib.capstone.job", *to_argv(config)]


def pinned_cores(cores: int | None) -> set[int] | None:
    """The first ``cores`` of the cores this process may use (``None``: no pinning).

    Where the system has no CPU affinity (macOS) it says so and returns ``None``: the job
    runs on every core.

    Raises:
        ValueError: ``cores`` < 1, or more cores than this process may use.
    """
    if cores is None:
        return None
    if not hasattr(os, "sched_setaffinity"):  # macOS: no CPU affinity; run unpinned and say so
        print(f"capstone: this system cannot pin processes to cores; the job runs on all {os.cpu_count()} of them, "
              f"not {cores}", flush=True)  # fmt: skip
        return None
    mine = sorted(os.sched_getaffinity(0))
    if not 1 <= cores <= len(mine):
        raise ValueError(f"cores={cores}: this process may use {len(mine)} core(s); pass 1 .. {len(mine)} or None")
    return set(mine[:cores])


def check_before_launch(config: CapstoneConfig, world_size: int) -> None:
    """Refuse bad input before starting anything (the job checks again, rank 0 first).

    Raises:
        ValueError: too few ranks, ``--resume`` without a run or checkpoint, or a fresh start
            in a directory that already holds a run; the message says what to do.
    """
    from course_lib.capstone.job import ATTEMPTS, roles_of
    from course_lib.capstone.trainer import checkpoint_root

    if world_size < 3:
        raise ValueError(f"the capstone needs at least 3 ranks (1 generator + 2 trainers), got {world_size}")
    for arm in [config.arm(i) for i in range(len(config.arm_list))] if config.arms else [config]:
        if arm.n_trainers or arm.colocated_sync:
            roles_of(arm, world_size, arm.n_trainers)
    run_dir = Path(config.run_dir)
    if not config.run_dir:
        raise ValueError("run_dir is required (where the run writes metrics and checkpoints)")
    if config.resume:
        if not run_dir.is_dir():
            raise ValueError(f"--resume: the run directory {run_dir} does not exist; start a run there without resume")
        if not any(checkpoint_root(run_dir).glob("step_*")):
            raise ValueError(f"--resume: {run_dir} holds no checkpoint (checkpoints/step_*); start a fresh run instead")
    elif any((Path(d) / ATTEMPTS).exists() for d in _run_dirs(config)):
        raise ValueError(f"{run_dir} already holds a run: resume it (resume=True / --resume) or use another run_dir")


def _pump(stream: Any, log: Any, echo: Callable[[str], None] | None) -> None:
    """Copy a child's output to the log file, echoing the lines that matter."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        log.write(line)
        log.flush()
        text = line.split("]:", 1)[-1].strip() if line.startswith("[rank") else line.strip()
        if echo is not None and (text.startswith(ECHO) or "will restart worker group" in text):
            echo(text)


def _run_dirs(config: CapstoneConfig) -> list[str]:
    """The run directories of a launch: its own, or one per arm of ``--arms``."""
    if not config.arms:
        return [config.run_dir]
    return [config.arm(i).run_dir for i in range(len(config.arm_list))]


def _updates_done(config: CapstoneConfig) -> int:
    """Distinct updates trainer 0 has logged, over the launch's run directories (an update redone
    after a restart counts once)."""
    return sum(
        len({x["update"] for x in read_lines(metrics_path(d, 0)) if x.get("kind") == "update"})
        for d in _run_dirs(config)
    )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's whole process group (torchrun and every rank), then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            continue
        if not group_alive(proc.pid):
            return


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` is still alive (zombies do not count)."""
    import psutil

    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    return False


def run(
    run_dir: str | Path | CapstoneConfig,
    *,
    nproc_per_node: int = 4,
    agents: int = 1,
    max_restarts: int = 2,
    deadline_s: float = 600.0,
    show_progress: bool = True,
    echo: Callable[[str], None] | None = print,
    cores: int | None = None,
    **overrides: Any,
) -> CapstoneReport:
    """Run the capstone job under torchrun and return its report (see the module docstring).

    ``run_dir`` is the run directory (or a whole :class:`CapstoneConfig`); ``overrides`` set
    config fields (``n_updates=60``, ``max_lag=0``, ``resume=True``, ``kill_rank=3``, ...).
    ``agents`` torchrun agents share the ``nproc_per_node x agents`` ranks (c10d rendezvous on
    127.0.0.1 when more than one). ``cores`` pins the whole job (agents and ranks) to that many
    of this process's cores (:func:`pinned_cores`): the same share of a core per rank on any
    machine; ``None`` leaves it on every core. The job's output goes to ``run_dir/torchrun.log``; the
    lines that matter (layout, restarts, the end) are passed to ``echo`` (``None``: silent).

    Raises:
        ValueError: bad input (see :func:`check_before_launch`).
        CapstoneFailed: the job failed (after its restarts) or ran past ``deadline_s``; every
            process it started is gone by then.
    """
    base = run_dir if isinstance(run_dir, CapstoneConfig) else CapstoneConfig(run_dir=str(run_dir))
    config = replace(base, **overrides)
    if config.arms:
        raise ValueError("a config with arms runs several jobs: use capstone.launch.run_arms")
    _launch(config, nproc_per_node, agents, max_restarts, deadline_s, show_progress, echo, cores)
    report = load(config.run_dir)
    if echo is not None:
        echo(report.summary())
    return report


def run_arms(
    run_dir: str | Path,
    arms: list[str],
    *,
    nproc_per_node: int = 4,
    deadline_s: float = 600.0,
    show_progress: bool = True,
    echo: Callable[[str], None] | None = print,
    cores: int | None = None,
    **overrides: Any,
) -> list[tuple[str, CapstoneReport]]:
    """Run ``arms`` (:data:`~.config.ARMS`, each optionally ``@TxS``; e.g. three rounds of
    them, interleaved) one after another in **one** torchrun launch (``--arms``): one start-up
    for all, each arm a fresh run in ``run_dir/NN-ARM`` from the same seed and warm start.
    ``cores`` as in :func:`run`. Returns ``(arm, report)`` in the order run. No restarts: a
    failure fails the launch.

    Raises:
        ValueError, CapstoneFailed: as :func:`run`.
    """
    config = replace(CapstoneConfig(run_dir=str(run_dir)), arms=",".join(arms), **overrides)
    _launch(config, nproc_per_node, 1, 0, deadline_s, show_progress, echo, cores)
    return [(name, load(config.arm(i).run_dir)) for i, name in enumerate(config.arm_list)]


def agent_gpus(agents: int, nproc_per_node: int, visible: list[str], colocated: bool) -> list[str | None]:
    """``CUDA_VISIBLE_DEVICES`` for each of ``agents`` torchrun agents started on this one host
    (``None``: leave the environment as it is), given the GPUs this process sees (``visible``).

    Each agent numbers its ranks' ``LOCAL_RANK`` from 0, so two agents on one host would put
    their first ranks on the same GPU, which NCCL refuses. So: one agent, or ``--colocated``
    (every rank on GPU 0 by design): unchanged; a GPU per rank for every agent: each agent its
    own slice; fewer: no GPU for any agent, every rank on the CPUs (one backend for the world,
    as :func:`~course_lib.capstone.job.resolve_backend` needs)."""
    if agents == 1 or colocated or not visible:
        return [None] * agents
    if len(visible) >= agents * nproc_per_node:
        return [",".join(visible[a * nproc_per_node : (a + 1) * nproc_per_node]) for a in range(agents)]
    return [""] * agents


def _visible_gpus() -> list[str]:
    """The GPUs this process sees, as ``CUDA_VISIBLE_DEVICES`` names them (or their indices)."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [g for g in named.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def _launch(
    config: CapstoneConfig,
    nproc_per_node: int,
    agents: int,
    max_restarts: int,
    deadline_s: float,
    show_progress: bool,
    echo: Callable[[str], None] | None,
    cores: int | None = None,
) -> None:
    """Start the torchrun agent(s), wait (progress bar, deadline), leave no process; raise on failure."""
    world = nproc_per_node * agents
    check_before_launch(config, world)
    pin = pinned_cores(cores)
    path = Path(config.run_dir)
    path.mkdir(parents=True, exist_ok=True)
    endpoint = f"127.0.0.1:{free_port()}" if agents > 1 else None
    rdzv_id = f"capstone-{uuid.uuid4().hex[:8]}"  # one per launch, as on real hosts
    commands = [
        torchrun_command(
            config, nproc_per_node, nnodes=agents, rdzv_endpoint=endpoint, rdzv_id=rdzv_id, max_restarts=max_restarts
        )
        for _ in range(agents)
    ]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    gpus = agent_gpus(agents, nproc_per_node, _visible_gpus() if agents > 1 else [], config.colocated)
    procs: list[subprocess.Popen[bytes]] = []
    with open(path / "torchrun.log", "a") as log:
        try:
            for cmd, visible in zip(commands, gpus):
                procs.append(
                    subprocess.Popen(
                        cmd,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env=env if visible is None else dict(env, CUDA_VISIBLE_DEVICES=visible),
                        preexec_fn=None if pin is None else lambda: os.sched_setaffinity(0, pin),
                    )
                )
            pumps = [threading.Thread(target=_pump, args=(p.stdout, log, echo), daemon=True) for p in procs]
            for t in pumps:
                t.start()
            _wait(procs, path, config, deadline_s, show_progress)
            for t in pumps:
                t.join(5.0)
        finally:
            for p in procs:
                kill_group(p)
            for d in _run_dirs(config):
                remove_buffers(run_key(d))  # colocated mode's /dev/shm files, whatever happened
    codes = [p.returncode for p in procs]
    if any(group_alive(p.pid) for p in procs):
        raise CapstoneFailed(
            f"processes of the job are still alive after it ended (process groups {[p.pid for p in procs]})"
        )
    if any(c != 0 for c in codes):
        tail = "".join((path / "torchrun.log").read_text().splitlines(keepends=True)[-25:])
        raise CapstoneFailed(f"the capstone job failed (torchrun exit codes {codes}); last lines of its log:\n{tail}")


def _wait(
    procs: list[subprocess.Popen[bytes]], run_dir: Path, config: CapstoneConfig, deadline_s: float, show_progress: bool
) -> None:
    """Wait for every agent to exit, with a progress bar of trainer 0's updates; kill all at the deadline."""
    from course_lib.course.display import progress

    deadline = time.monotonic() + deadline_s
    done = 0
    total = config.n_updates * len(_run_dirs(config))
    if show_progress:
        bar_cm: Any = progress(total, "capstone updates", unit="update")
    else:
        from contextlib import nullcontext

        bar_cm = nullcontext(None)
    with bar_cm as bar:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                for p in procs:
                    kill_group(p)
                raise CapstoneFailed(
                    f"the capstone job ran past its {deadline_s:g} s deadline: every process of it was killed"
                )
            now = min(_updates_done(config), total)
            if bar is not None and now > done:
                bar.update(now - done)
                done = now
            time.sleep(0.25)
        now = min(_updates_done(config), total)
        if bar is not None and now > done:
            bar.update(now - done)
