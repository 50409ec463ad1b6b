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
import contextlib
from multiprocessing.connection import Connection, wait
from typing import Any

import numpy as np
import torch

from course_lib.actor_learner.actor import EpisodeTracker
from course_lib.actor_learner.heartbeats import beat
from course_lib.actor_learner.model import ActorCritic, sample_actions
from course_lib.actor_learner.timers import Timings
from course_lib.runtime.processes import INJECTED_CRASH_EXIT, QUIET_EXIT, child_setup

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
    heartbeat: torch.Tensor | None = None,
) -> None:
    """A SEED actor: write the observation, ask for actions, step the envs; no policy here.

    ``heartbeat`` (its row of :class:`~course_lib.actor_learner.heartbeats.Heartbeats`) is
    stamped every step and every poll while it waits for the server (``unrolls`` counts
    complete unrolls of ``config.unroll`` steps; the weight version column stays -1: the
    server holds the policy; once it has asked for actions the server holds a half-written
    slot of its steps, so it is always mid-unroll)."""
    from course_lib.actor_learner.envs import make_envs

    child_setup(seed)
    timings = Timings(SEED_ACTOR_PHASES, shared=timing_row.numpy())
    envs = make_envs(config.env_id, config.envs_per_actor)
    obs, _ = envs.reset(seed=seed)
    my = {name: t[actor_id] for name, t in channels.items()}
    kind = START
    steps = 0
    beat(heartbeat, 0, -1, mid_unroll=False)
    try:
        while not stop.is_set():
            my["obs"].copy_(torch.as_tensor(obs))
            conn.send_bytes(kind)
            with timings.phase("wait for actions"):
                while not conn.poll(0.1):
                    if stop.is_set():
                        return
                    beat(heartbeat, steps // config.unroll, -1, mid_unroll=True)
                conn.recv_bytes()
            with timings.phase("env step"):
                obs, reward, terminated, truncated, _ = envs.step(my["actions"].numpy().copy())
            my["reward"].copy_(torch.as_tensor(reward, dtype=torch.float32))
            my["done"].copy_(torch.as_tensor(np.logical_or(terminated, truncated)))
            kind = STEP
            steps += 1
            beat(heartbeat, steps // config.unroll, -1, mid_unroll=True)
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


class _InferenceServer:
    """The central inference server: its model, the actors' trajectories, the free slots.

    One pass of :meth:`serve`'s loop: wait for requests (batching the actors that ask
    within ``batch_wait_s``), read them, record the outcome of each actor's previous
    action (handing a complete unroll to the learner), run one batched forward pass, and
    reply with the actions.
    """

    def __init__(
        self,
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
        self.config, self.buffers, self.weights, self.channels = config, buffers, weights, channels
        self.learner_conn, self.stop = learner_conn, stop
        self.timings = Timings(SERVER_PHASES, shared=timing_row.numpy())
        self.model = ActorCritic(buffers.obs_dim, n_actions, config.hidden)
        self.generator = torch.Generator().manual_seed(seed)
        self.conns: list[Connection | None] = list(actor_conns)
        self.trajectories = [_Trajectory(config.envs_per_actor) for _ in self.conns]
        self.free: collections.deque[int] = collections.deque()
        self.version = -1

    def serve(self) -> None:
        """Answer the actors until the stop event is set."""
        while not self.stop.is_set():
            requesting = self._wait_for_requests()
            if not requesting:
                continue
            batch = self._read_requests(requesting)
            if not batch:
                continue
            if not self._record_outcomes(batch):
                return  # stopped while waiting for a free slot
            ids = [i for i, _ in batch]
            actions, logp = self._infer(ids)
            self._reply(ids, actions, logp)

    # -- the learner's messages and the slots ---------------------------------------------

    def _handle_learner_message(self, message: tuple[Any, ...]) -> None:
        if message[0] == "free":
            self.free.append(message[1])
        elif message[0] == "attach":
            _, actor_id, conn = message
            self._drop(actor_id)
            self.conns[actor_id] = conn

    def _drop(self, actor_id: int) -> None:
        """Forget an actor (it died): its half-written slot goes back to the free list."""
        traj = self.trajectories[actor_id]
        if traj.index is not None:
            self.free.append(traj.index)
        self.trajectories[actor_id] = _Trajectory(self.config.envs_per_actor)
        self.conns[actor_id] = None

    def _take_free_slot(self) -> int | None:
        """The next free slot, waiting for the learner to free one; None once stopped."""
        with self.timings.phase("wait for free slot"):
            while not self.free:
                if self.stop.is_set():
                    return None
                if self.learner_conn.poll(0.1):
                    self._handle_learner_message(self.learner_conn.recv())
            return self.free.popleft()

    # -- one pass of the loop ---------------------------------------------------------------

    def _wait_for_requests(self) -> list[int]:
        """Ids of the actors asking for actions (after a learner message, if one came first)."""
        with self.timings.phase("wait for requests"):
            live = [c for c in self.conns if c is not None]
            ready = wait([*live, self.learner_conn], timeout=0.1)
            if self.learner_conn in ready:
                self._handle_learner_message(self.learner_conn.recv())
            requesting = [i for i, c in enumerate(self.conns) if c is not None and c in ready]
            if requesting and len(requesting) < len(live) and self.config.batch_wait_s > 0:
                rest = [c for c in live if c not in ready]
                more = wait(rest, timeout=self.config.batch_wait_s)
                requesting += [i for i, c in enumerate(self.conns) if c is not None and c in more]
        return requesting

    def _read_requests(self, requesting: list[int]) -> list[tuple[int, bytes]]:
        """``(actor id, START or STEP)`` of each request; an actor whose pipe broke is dropped."""
        with self.timings.phase("bookkeeping"):
            batch = []
            for i in requesting:
                try:
                    kind = self.conns[i].recv_bytes()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    self._drop(i)
                    continue
                batch.append((i, kind))
        return batch

    def _record_outcomes(self, batch: list[tuple[int, bytes]]) -> bool:
        """Write each actor's previous outcome, hand complete unrolls to the learner, and give
        every actor without a slot a free one. False if stopped while waiting for a slot."""
        for i, kind in batch:
            traj = self.trajectories[i]
            if kind == STEP and traj.index is not None:
                self._record_outcome(i, traj)
            if traj.index is None:
                traj.index, traj.t = self._take_free_slot(), 0
                if traj.index is None:
                    return False
        return True

    def _record_outcome(self, i: int, traj: _Trajectory) -> None:
        """Reward and done of actor ``i``'s previous action; after step ``T``, ``x_T`` and hand the slot over."""
        channels, n_t = self.channels, self.buffers.unroll
        slot = self.buffers.slot(traj.index)
        slot["rewards"][traj.t - 1] = channels["reward"][i]
        slot["dones"][traj.t - 1] = channels["done"][i]
        traj.finished += traj.tracker.update(channels["reward"][i].numpy()[None], channels["done"][i].numpy()[None])
        if traj.t == n_t:  # the unroll is complete: x_T, then hand it over
            slot["obs"][n_t] = channels["obs"][i]
            self.learner_conn.send(("full", traj.index, traj.finished))
            traj.index, traj.finished = None, []

    def _infer(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward pass over the observations of actors ``ids`` with the newest weights:
        ``(actions [len(ids), B], log mu [len(ids), B])``."""
        with self.timings.phase("inference"):
            self.version = self.weights.pull(self.model, self.version)
            with torch.no_grad():
                logits, _ = self.model(self.channels["obs"][ids].reshape(-1, self.buffers.obs_dim))
                actions, logp = sample_actions(logits, self.generator)
            return actions.view(len(ids), -1), logp.view(len(ids), -1)

    def _reply(self, ids: list[int], actions: torch.Tensor, logp: torch.Tensor) -> None:
        """Write step ``t`` of each actor's slot and send it its actions."""
        with self.timings.phase("bookkeeping"):
            for j, i in enumerate(ids):
                traj = self.trajectories[i]
                slot = self.buffers.slot(traj.index)
                slot["obs"][traj.t] = self.channels["obs"][i]
                slot["actions"][traj.t] = actions[j]
                slot["behaviour_logp"][traj.t] = logp[j]
                slot["versions"][traj.t] = self.version
                traj.t += 1
                self.channels["actions"][i] = actions[j]
                try:
                    self.conns[i].send_bytes(b"")  # type: ignore[union-attr]
                except (BrokenPipeError, OSError):
                    self._drop(i)


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
    """The central inference server process (see the module docstring).

    ``learner_conn`` receives ``("free", index)`` and ``("attach", actor_id, conn)`` (a
    restarted actor's pipe); it sends ``("full", index, finished_returns)``.
    """
    child_setup(seed)
    server = _InferenceServer(
        config, n_actions, buffers, weights, channels, actor_conns, learner_conn, stop, timing_row, seed
    )
    with contextlib.suppress(*QUIET_EXIT):
        server.serve()


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
