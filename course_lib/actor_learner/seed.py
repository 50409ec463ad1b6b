"""SEED RL layout: actors only step environments; one process runs every inference (lesson 03).

Espeholt et al. 2020, *SEED RL: Scalable and Efficient Deep-RL with Accelerated Central
Inference*, arXiv 1910.06591. In IMPALA every actor holds a copy of the policy, runs it
on its own CPU and ships whole unrolls (plus, the other way, whole weight vectors). In
SEED the actors send one observation per step and get one action back; the central
process batches the observations of all actors into one forward pass (on the learner's
accelerator in the paper) and assembles the trajectories itself, so no weights ever
travel to actors.

Here each actor ``i`` shares with the server small tensors ``obs [B, obs_dim]``,
``reward [B]``, ``done [B]`` (of the previous step) and ``actions [B]``, and a pipe that
carries one empty message per step each way ("my observation is ready", "your actions
are ready"). The server keeps one rollout slot per actor and hands full slots to the
learner exactly as IMPALA actors do; the learner cannot tell the layouts apart.
"""

from __future__ import annotations

import collections
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from course_lib.actor_learner.actor import INJECTED_CRASH_EXIT, QUIET_EXIT, EpisodeTracker, child_setup
from course_lib.actor_learner.model import sample_actions
from course_lib.actor_learner.timers import Timings

SEED_ACTOR_PHASES = ("wait for actions", "env step")
SERVER_PHASES = ("wait for requests", "inference", "bookkeeping", "wait for free slot")

START, STEP = b"s", b"c"  # a request: first observation of a (re)started actor, or a next step


def allocate_channels(n_actors: int, n_envs: int, obs_dim: int) -> dict[str, torch.Tensor]:
    """The per-actor shared tensors the actors and the server exchange through."""
    return {
        "obs": torch.zeros(n_actors, n_envs, obs_dim).share_memory_(),
        "reward": torch.zeros(n_actors, n_envs).share_memory_(),
        "done": torch.zeros(n_actors, n_envs, dtype=torch.bool).share_memory_(),
        "actions": torch.zeros(n_actors, n_envs, dtype=torch.int64).share_memory_(),
    }


def seed_actor_main(
    actor_id: int,
    config: Any,
    channels: dict[str, torch.Tensor],
    conn: Connection,
    stop: Any,
    timing_row: torch.Tensor,
    seed: int,
    crash_after: int | None = None,
) -> None:
    """A SEED actor: write the observation, ask for actions, step the envs; no policy here."""
    from course_lib.actor_learner.envs import make_envs

    child_setup(seed)
    timings = Timings(SEED_ACTOR_PHASES, shared=timing_row.numpy())
    envs = make_envs(config.env_id, config.envs_per_actor)
    obs, _ = envs.reset(seed=seed)
    my = {name: t[actor_id] for name, t in channels.items()}
    kind = START
    steps = 0
    try:
        while not stop.is_set():
            my["obs"].copy_(torch.as_tensor(obs))
            conn.send_bytes(kind)
            with timings.phase("wait for actions"):
                while not conn.poll(0.1):
                    if stop.is_set():
                        return
                conn.recv_bytes()
            with timings.phase("env step"):
                obs, reward, terminated, truncated, _ = envs.step(my["actions"].numpy().copy())
            my["reward"].copy_(torch.as_tensor(reward, dtype=torch.float32))
            my["done"].copy_(torch.as_tensor(np.logical_or(terminated, truncated)))
            kind = STEP
            steps += 1
            if crash_after is not None and steps >= crash_after * config.unroll:
                raise SystemExit(INJECTED_CRASH_EXIT)
    except QUIET_EXIT:
        pass
    finally:
        envs.close()


class _Trajectory:
    """The server's bookkeeping for one actor: its slot, the next step, its episode returns."""

    def __init__(self, n_envs: int) -> None:
        self.index: int | None = None
        self.t = 0
        self.tracker = EpisodeTracker(n_envs)
        self.finished: list[float] = []


def inference_main(
    config: Any,
    n_actions: int,
    buffers: Any,
    weights: Any,
    channels: dict[str, torch.Tensor],
    actor_conns: list[Connection | None],
    learner_conn: Connection,
    stop: Any,
    timing_row: torch.Tensor,
    seed: int,
) -> None:
    """The central inference server (see the module docstring).

    ``learner_conn`` receives ``("free", index)`` and ``("attach", actor_id, conn)`` (a
    restarted actor's pipe); it sends ``("full", index, finished_returns)``.
    """
    from course_lib.actor_learner.model import ActorCritic

    child_setup(seed)
    timings = Timings(SERVER_PHASES, shared=timing_row.numpy())
    model = ActorCritic(buffers.obs_dim, n_actions, config.hidden)
    generator = torch.Generator().manual_seed(seed)
    conns: list[Connection | None] = list(actor_conns)
    trajectories = [_Trajectory(config.envs_per_actor) for _ in conns]
    free: collections.deque[int] = collections.deque()
    n_t = buffers.unroll
    version = -1

    def handle_learner_message(message: tuple[Any, ...]) -> None:
        if message[0] == "free":
            free.append(message[1])
        elif message[0] == "attach":
            _, actor_id, conn = message
            drop(actor_id)
            conns[actor_id] = conn

    def drop(actor_id: int) -> None:
        """Forget an actor (it died): its half-written slot goes back to the free list."""
        traj = trajectories[actor_id]
        if traj.index is not None:
            free.append(traj.index)
        trajectories[actor_id] = _Trajectory(config.envs_per_actor)
        conns[actor_id] = None

    def take_free_slot() -> int | None:
        with timings.phase("wait for free slot"):
            while not free:
                if stop.is_set():
                    return None
                if learner_conn.poll(0.1):
                    handle_learner_message(learner_conn.recv())
            return free.popleft()

    try:
        while not stop.is_set():
            with timings.phase("wait for requests"):
                live = [c for c in conns if c is not None]
                ready = wait([*live, learner_conn], timeout=0.1)
                if learner_conn in ready:
                    handle_learner_message(learner_conn.recv())
                requesting = [i for i, c in enumerate(conns) if c is not None and c in ready]
                if requesting and len(requesting) < len(live) and config.batch_wait_s > 0:
                    rest = [c for c in live if c not in ready]
                    more = wait(rest, timeout=config.batch_wait_s)
                    requesting += [i for i, c in enumerate(conns) if c is not None and c in more]
            if not requesting:
                continue
            with timings.phase("bookkeeping"):
                batch = []
                for i in requesting:
                    try:
                        kind = conns[i].recv_bytes()  # type: ignore[union-attr]
                    except (EOFError, OSError):
                        drop(i)
                        continue
                    batch.append((i, kind))
            if not batch:
                continue
            for i, kind in batch:
                traj = trajectories[i]
                if kind == STEP and traj.index is not None:  # the previous action's outcome
                    slot = buffers.slot(traj.index)
                    slot["rewards"][traj.t - 1] = channels["reward"][i]
                    slot["dones"][traj.t - 1] = channels["done"][i]
                    traj.finished += traj.tracker.update(
                        channels["reward"][i].numpy()[None], channels["done"][i].numpy()[None]
                    )
                    if traj.t == n_t:  # the unroll is complete: x_T, then hand it over
                        slot["obs"][n_t] = channels["obs"][i]
                        learner_conn.send(("full", traj.index, traj.finished))
                        traj.index, traj.finished = None, []
                if traj.index is None:
                    traj.index, traj.t = take_free_slot(), 0
                    if traj.index is None:
                        return
            with timings.phase("inference"):
                version = weights.pull(model, version)
                ids = [i for i, _ in batch]
                with torch.no_grad():
                    logits, _ = model(channels["obs"][ids].reshape(-1, buffers.obs_dim))
                    actions, logp = sample_actions(logits, generator)
                actions = actions.view(len(ids), -1)
                logp = logp.view(len(ids), -1)
            with timings.phase("bookkeeping"):
                for j, i in enumerate(ids):
                    traj = trajectories[i]
                    slot = buffers.slot(traj.index)
                    slot["obs"][traj.t] = channels["obs"][i]
                    slot["actions"][traj.t] = actions[j]
                    slot["behaviour_logp"][traj.t] = logp[j]
                    slot["versions"][traj.t] = version
                    traj.t += 1
                    channels["actions"][i] = actions[j]
                    try:
                        conns[i].send_bytes(b"")  # type: ignore[union-attr]
                    except (BrokenPipeError, OSError):
                        drop(i)
    except QUIET_EXIT:
        pass


def wire_bytes_per_frame(layout: str, obs_bytes: int, n_params: int, unroll: int, n_envs: int) -> dict[str, float]:
    """Bytes that cross between actor and learner per environment frame, by direction.

    IMPALA: the actor ships its unroll (observation, action, ``log mu``, reward, done,
    version per step, plus the bootstrap observation once per unroll) and pulls the
    float32 weights once per unroll of ``unroll * n_envs`` frames. SEED: the actor sends
    an observation, reward and done every step and receives an action; trajectories are
    assembled where inference runs and weights never leave the learner.

    Args:
        layout: ``"impala"`` or ``"seed"``.
        obs_bytes: bytes of one observation.
        n_params: parameters of the policy (float32).
        unroll: ``T``; n_envs: environments per actor (``B``).

    Returns:
        ``{"actor -> learner": bytes, "learner -> actor": bytes}`` per frame.
    """
    per_step = 8 + 4 + 4 + 1 + 8  # action int64, log mu float32, reward float32, done bool, version int64
    if layout == "impala":
        return {
            "actor -> learner": obs_bytes + per_step + obs_bytes / unroll,
            "learner -> actor": 4.0 * n_params / (unroll * n_envs),
        }
    if layout == "seed":
        return {"actor -> learner": obs_bytes + 4 + 1, "learner -> actor": 8.0}
    raise ValueError(f"layout must be 'impala' or 'seed', got {layout!r}")
