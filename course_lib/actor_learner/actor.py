"""IMPALA actors: step environments with a possibly stale copy of the policy (lesson 03).

An actor process loops::

    index = next free slot (from the learner)
    pull the newest published weights, if any        -> its policy may be stale by then
    unroll T steps of its B envs into slot `index`   (env step + inference on its own CPU)
    hand `index` back as full

:func:`unroll` is one pass of that loop body, the piece lesson 03's exercise 4 asks for;
:func:`actor_main` is the process.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from course_lib.actor_learner.heartbeats import beat
from course_lib.actor_learner.model import sample_actions
from course_lib.actor_learner.timers import Timings
from course_lib.runtime.processes import INJECTED_CRASH_EXIT, QUIET_EXIT, child_setup

ACTOR_PHASES = ("wait for free slot", "weight sync", "inference", "env step")


def unroll(
    envs: Any,
    policy: nn.Module,
    obs: np.ndarray,
    slot: dict[str, torch.Tensor],
    version: int,
    generator: torch.Generator,
    timings: Timings | None = None,
) -> np.ndarray:
    """Step ``envs`` for ``T = slot["actions"].shape[0]`` steps with ``policy``, writing into ``slot``.

    For ``t = 0 .. T-1``: ``slot["obs"][t] = x_t``; sample ``a_t ~ softmax(policy(x_t)[0])``
    with ``generator``; ``slot["actions"][t] = a_t``, ``slot["behaviour_logp"][t] =
    log mu(a_t|x_t)``, ``slot["versions"][t] = version``; step the envs (same-step autoreset);
    ``slot["rewards"][t] = r_t``, ``slot["dones"][t] = terminated or truncated``. Finally
    ``slot["obs"][T] = x_T``, the bootstrap state. No gradients are recorded.

    Args:
        envs: a vector env with same-step autoreset (:func:`course_lib.actor_learner.envs.make_envs`).
        policy: maps ``[B, obs_dim]`` float32 to ``(logits [B, K], values [B])``.
        obs: ``[B, obs_dim]`` the current observations ``x_0``.
        slot: views of one buffer slot (:meth:`RolloutBuffers.slot`), written in place.
        version: the weight version of ``policy``.
        generator: the torch generator actions are sampled with.
        timings: optional per-phase timers (``inference``, ``env step``).

    Returns:
        ``[B, obs_dim]`` observations after the last step (``x_T``, the next unroll's ``x_0``).
    """
    n_t = slot["actions"].shape[0]
    with torch.no_grad():
        for t in range(n_t):
            start = time.perf_counter()
            x = torch.as_tensor(obs, dtype=torch.float32)
            logits, _ = policy(x)
            actions, logp = sample_actions(logits, generator)
            slot["obs"][t] = x
            slot["actions"][t] = actions
            slot["behaviour_logp"][t] = logp
            slot["versions"][t] = version
            middle = time.perf_counter()
            obs, reward, terminated, truncated, _ = envs.step(actions.numpy())
            slot["rewards"][t] = torch.as_tensor(reward, dtype=torch.float32)
            slot["dones"][t] = torch.as_tensor(np.logical_or(terminated, truncated))
            if timings is not None:
                timings.add("inference", middle - start)
                timings.add("env step", time.perf_counter() - middle)
        slot["obs"][n_t] = torch.as_tensor(obs, dtype=torch.float32)
    return obs


class EpisodeTracker:
    """Running returns of ``B`` envs across unrolls; :meth:`update` returns those that finished."""

    def __init__(self, n_envs: int) -> None:
        self.running = np.zeros(n_envs)

    def update(self, rewards: np.ndarray, dones: np.ndarray) -> list[float]:
        """``rewards``, ``dones``: ``[T, B]`` of one unroll."""
        finished: list[float] = []
        for r, d in zip(rewards, dones):
            self.running += r
            finished.extend(float(x) for x in self.running[d])
            self.running[d] = 0.0
        return finished


def actor_main(
    actor_id: int,
    config: Any,
    buffers: Any,
    weights: Any,
    conn: Connection,
    stop: Any,
    timing_row: torch.Tensor,
    seed: int,
    crash_after: int | None = None,
    heartbeat: torch.Tensor | None = None,
) -> None:
    """The actor process (see the module docstring).

    ``conn`` is this actor's end of its pipe to the learner: it receives ``("free", index)``
    and sends ``("full", index, finished_episode_returns)``. ``config`` is the system's
    :class:`~course_lib.actor_learner.system.SystemConfig`; ``crash_after`` makes the
    actor raise after that many unrolls (fault injection). ``heartbeat`` is its ``[4]`` row
    of :class:`~course_lib.actor_learner.heartbeats.Heartbeats`, stamped every unroll and
    every idle poll. It loads the newest published weights as soon as it starts (a
    restarted actor acts with the learner's current weights, not the initial ones) and again
    before every unroll.
    """
    from course_lib.actor_learner.envs import make_envs
    from course_lib.actor_learner.model import ActorCritic

    child_setup(seed)
    timings = Timings(ACTOR_PHASES, shared=timing_row.numpy())
    envs = make_envs(config.env_id, config.envs_per_actor)
    obs, _ = envs.reset(seed=seed)
    action_space = envs.single_action_space
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"{config.env_id}: IMPALA actors need discrete actions, got {action_space}")
    model = ActorCritic(buffers.obs_dim, int(action_space.n), config.hidden)
    generator = torch.Generator().manual_seed(seed)
    tracker = EpisodeTracker(config.envs_per_actor)
    version = weights.pull(model, -1)
    unrolls = 0
    beat(heartbeat, unrolls, version, mid_unroll=False)
    try:
        while not stop.is_set():
            with timings.phase("wait for free slot"):
                if not conn.poll(0.1):
                    beat(heartbeat, unrolls, version, mid_unroll=False)  # idle, not frozen
                    continue
                _, index = conn.recv()
            with timings.phase("weight sync"):
                version = weights.pull(model, version)
            beat(heartbeat, unrolls, version, mid_unroll=True)
            slot = buffers.slot(index)
            obs = unroll(envs, model, obs, slot, version, generator, timings)
            finished = tracker.update(slot["rewards"].numpy(), slot["dones"].numpy())
            conn.send(("full", index, finished))
            unrolls += 1
            beat(heartbeat, unrolls, version, mid_unroll=False)
            if crash_after is not None and unrolls >= crash_after:
                raise SystemExit(INJECTED_CRASH_EXIT)  # no traceback, a recognisable exit code
    except QUIET_EXIT:
        pass
    finally:
        envs.close()
