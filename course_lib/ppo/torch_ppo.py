r"""PPO as a classic loop: torch on the CPU, gymnasium's vectorised CartPole (lesson 04).

The baseline that :mod:`course_lib.ppo.jax_ppo` is measured against, with the same
hyperparameters (:class:`course_lib.ppo.config.PPOConfig`), the same network and
initialisation, the same GAE and loss (eqs. 04.2-04.6). It is written to be a *fair*,
fast classic loop in the CleanRL style (Huang et al. 2022, ``cleanrl/ppo.py``):

- gymnasium's own numpy-vectorised CartPole (``gym.make_vec(..., vectorization_mode=
  "vector_entry_point")``, one numpy call steps every env); ``"sync"`` (a
  ``SyncVectorEnv``) is available for comparison;
- acting under ``torch.no_grad()``, sampling with ``torch.multinomial`` on the
  softmax (no ``torch.distributions`` object per step), preallocated rollout buffers,
  ``torch.from_numpy`` (no copies) between numpy and torch;
- one torch thread (a 64-wide MLP is overhead-bound; more threads only synchronise);
- Adam with ``foreach`` kernels, gradient clipping by global norm.

The loop, top to bottom, per update::

    rollout:  num_steps x (policy forward in torch, env.step in numpy)       Python loop (collect_rollout_torch)
    GAE:      A_t = delta_t + gamma lambda (1 - d_t) A_{t+1}                 Python loop over T (gae_numpy)
    epochs:   shuffle; for each minibatch: loss, backward, clip, Adam step   Python loops (learn_from_rollout)

It imports neither JAX nor (until it runs) torch and gymnasium.

**Next-step auto-reset.** gymnasium 1.x vector envs reset an env on the step *after* it
ended: that step ignores the action and returns the new episode's first observation with
reward 0. Such reset steps are not transitions of the MDP, so they are masked out of the
loss (``RolloutBuffers.valid``); GAE's trace never crosses them because the step before them has
``done = 1``. A reset step does observe the ended episode's final observation, so its
value is V(final obs): the bootstrap of a truncated step (:func:`gae_numpy`). Every env step, reset steps included, counts toward the steps/s figure, the
same way as in the JAX loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from course_lib.ppo.config import PPOConfig

if TYPE_CHECKING:
    import gymnasium as gym
    import torch
    from torch import nn


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    from torch import nn

    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def make_actor_critic(obs_dim: int, n_actions: int, hidden: int) -> tuple[nn.Module, nn.Module]:
    """The same two MLPs as :func:`course_lib.ppo.jax_ppo.init_params`: tanh, orthogonal
    weights (gain sqrt 2; 0.01 for the logits, 1 for the value), zero biases."""
    from torch import nn

    s = float(np.sqrt(2.0))
    actor = nn.Sequential(
        _layer(obs_dim, hidden, s), nn.Tanh(), _layer(hidden, hidden, s), nn.Tanh(), _layer(hidden, n_actions, 0.01)
    )
    critic = nn.Sequential(
        _layer(obs_dim, hidden, s), nn.Tanh(), _layer(hidden, hidden, s), nn.Tanh(), _layer(hidden, 1, 1.0)
    )
    return actor, critic


def gae_numpy(
    rewards: NDArray[Any],
    values: NDArray[Any],
    terminated: NDArray[Any],
    dones: NDArray[Any],
    last_value: NDArray[Any],
    gamma: float,
    gae_lambda: float,
) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """GAE (04.2-04.3) by a Python loop over time on ``[T, B]`` numpy arrays: ``(advantages, targets)``.

    For a next-step auto-reset env (gymnasium's vector envs): the step after an episode
    end observes the episode's final observation, so ``values[t + 1]`` *is* V(final obs)
    and a truncated step bootstraps from it; a terminated one from 0 (``terminated``); the
    trace stops at every end (``dones`` = terminated or truncated).
    """
    n_t = rewards.shape[0]
    adv = np.zeros_like(values, dtype=np.float32)
    next_adv = np.zeros_like(last_value, dtype=np.float32)
    next_value = last_value
    for t in range(n_t - 1, -1, -1):
        delta = rewards[t] + gamma * (1.0 - terminated[t]) * next_value - values[t]
        next_adv = delta + gamma * gae_lambda * (1.0 - dones[t]) * next_adv
        adv[t] = next_adv
        next_value = values[t]
    return adv, adv + values


def ppo_loss_torch(
    actor: nn.Module,
    critic: nn.Module,
    obs: torch.Tensor,
    actions: torch.Tensor,
    old_log_prob: torch.Tensor,
    old_value: torch.Tensor,
    advantages: torch.Tensor,
    targets: torch.Tensor,
    valid: torch.Tensor | None,
    config: PPOConfig,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eqs. 04.4-04.6 on one minibatch; means over ``valid`` samples only (all when None)."""
    import torch

    logits = actor(obs)
    value = critic(obs).squeeze(-1)
    logp_all = torch.log_softmax(logits, dim=-1)
    log_prob = logp_all.gather(1, actions.unsqueeze(1)).squeeze(1)
    if valid is None:

        def mean(x: torch.Tensor) -> torch.Tensor:
            return x.mean()

        adv = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + 1e-8)
    else:
        w = valid / valid.sum().clamp(min=1.0)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * w).sum()

        m = mean(advantages)
        adv = (advantages - m) / (torch.sqrt(mean((advantages - m) ** 2)) + 1e-8)
    entropy = mean(-(logp_all.exp() * logp_all).sum(-1))
    value_clipped = old_value + (value - old_value).clamp(-config.clip_eps, config.clip_eps)
    value_loss = 0.5 * mean(torch.maximum((value - targets) ** 2, (value_clipped - targets) ** 2))
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    policy_loss = -mean(torch.minimum(ratio * adv, ratio.clamp(1 - config.clip_eps, 1 + config.clip_eps) * adv))
    total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    return total, {"losses/policy": policy_loss, "losses/value": value_loss, "losses/entropy": entropy}


@dataclass
class TorchPPOResult:
    """What :func:`train_torch` returns.

    Attributes:
        episode_return: ``[n_updates]`` mean return of the episodes that ended in each
            update (NaN if none); ``episodes`` how many ended.
        update_seconds: ``[n_updates]`` wall-clock seconds of each update (rollout + learning);
            ``rollout_seconds`` the rollout part.
        env_steps: environment steps taken (``n_updates * num_envs * num_steps``).
    """

    config: PPOConfig
    episode_return: NDArray[np.float64]
    episodes: NDArray[np.int64]
    update_seconds: NDArray[np.float64]
    rollout_seconds: NDArray[np.float64]
    env_steps: int
    actor: Any = field(repr=False)
    critic: Any = field(repr=False)

    @property
    def seconds(self) -> float:
        return float(self.update_seconds.sum())

    def steady_steps_per_second(self, skip: int = 2) -> float:
        """Env steps per second over the updates after the first ``skip`` (warm-up)."""
        secs = self.update_seconds[skip:]
        return self.config.batch_size * len(secs) / float(secs.sum()) if len(secs) else float("nan")

    def final_return(self, last_updates: int = 10) -> float:
        """Mean return of the episodes that ended in the last ``last_updates`` updates."""
        ret, n = self.episode_return[-last_updates:], self.episodes[-last_updates:]
        return float(np.where(n > 0, np.nan_to_num(ret) * n, 0.0).sum() / max(int(n.sum()), 1))


def make_vector_cartpole(config: PPOConfig, vectorization: str = "vector_entry_point") -> gym.vector.VectorEnv:
    """``config.num_envs`` gymnasium ``CartPole-v1`` envs behind gymnasium's vector interface
    (its next-step auto-reset)."""
    import gymnasium as gym

    return gym.make_vec("CartPole-v1", num_envs=config.num_envs, vectorization_mode=vectorization)


def _space_sizes(envs: gym.vector.VectorEnv) -> tuple[int, int]:
    """``(obs_dim, n_actions)`` of a vector env with a Box observation, Discrete actions and
    next-step auto-reset; anything else is refused with a ValueError."""
    import gymnasium as gym

    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    if obs_space.shape is None or not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(f"train_torch needs a Box observation and a Discrete action space, got {envs}")
    if not str(envs.metadata.get("autoreset_mode", "")).lower().endswith("next_step"):
        raise ValueError(
            f"train_torch needs a next-step auto-reset vector env (gymnasium 1.x's default); got "
            f"autoreset_mode {envs.metadata.get('autoreset_mode')!r}"
        )
    return int(np.prod(obs_space.shape)), int(action_space.n)


@dataclass
class RolloutBuffers:
    """One rollout, preallocated once and refilled every update; ``[T, B]`` (``obs`` ``[T, B, obs_dim]``).

    Torch tensors for what the networks read, numpy for what GAE reads; ``valid`` is 0 on
    gymnasium's reset steps (module docstring).
    """

    obs: torch.Tensor
    action: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    reward: NDArray[np.float32]
    done: NDArray[np.float32]
    terminated: NDArray[np.float32]
    valid: NDArray[np.float32]

    @classmethod
    def zeros(cls, n_t: int, n_b: int, obs_dim: int) -> RolloutBuffers:
        import torch

        return cls(
            obs=torch.zeros((n_t, n_b, obs_dim)),
            action=torch.zeros((n_t, n_b), dtype=torch.long),
            log_prob=torch.zeros((n_t, n_b)),
            value=torch.zeros((n_t, n_b)),
            reward=np.zeros((n_t, n_b), dtype=np.float32),
            done=np.zeros((n_t, n_b), dtype=np.float32),
            terminated=np.zeros((n_t, n_b), dtype=np.float32),
            valid=np.ones((n_t, n_b), dtype=np.float32),
        )


@dataclass
class EnvCursor:
    """Where the vector env stands between rollouts: the next observation ``[B, obs_dim]``,
    which envs ended at the last step ``[B]`` (their next step is a reset step) and the
    return so far of each env's running episode ``[B]``."""

    next_obs: torch.Tensor
    prev_done: NDArray[np.bool_]
    episode_return: NDArray[np.float64]


def collect_rollout_torch(
    actor: nn.Module, critic: nn.Module, envs: gym.vector.VectorEnv, buf: RolloutBuffers, cursor: EnvCursor
) -> tuple[list[float], NDArray[Any]]:
    """``num_steps`` steps of every env with the policy, under ``torch.no_grad()``: fills
    ``buf``, advances ``cursor``, and returns the returns of the episodes that ended and
    V(the observation after the last step) ``[B]``."""
    import torch

    finished: list[float] = []
    with torch.no_grad():
        for t in range(buf.obs.shape[0]):
            buf.obs[t] = cursor.next_obs
            logits = actor(cursor.next_obs)
            buf.value[t] = critic(cursor.next_obs).squeeze(-1)
            logp = torch.log_softmax(logits, dim=-1)
            action = torch.multinomial(logp.exp(), 1).squeeze(1)
            buf.action[t] = action
            buf.log_prob[t] = logp.gather(1, action.unsqueeze(1)).squeeze(1)
            obs_np, reward, terminated, truncated, _ = envs.step(action.numpy())
            done = terminated | truncated
            buf.valid[t] = ~cursor.prev_done  # a reset step: no transition of the MDP
            cursor.prev_done = done
            buf.reward[t] = reward
            buf.done[t] = done
            buf.terminated[t] = terminated
            cursor.episode_return += reward
            if done.any():
                finished.extend(cursor.episode_return[done].tolist())
                cursor.episode_return[done] = 0.0
            cursor.next_obs = torch.from_numpy(obs_np)
        last_value = critic(cursor.next_obs).squeeze(-1).numpy()
    return finished, last_value


def learn_from_rollout(
    actor: nn.Module,
    critic: nn.Module,
    optimizer: torch.optim.Optimizer,
    buf: RolloutBuffers,
    last_value: NDArray[Any],
    config: PPOConfig,
) -> None:
    """GAE on the rollout (:func:`gae_numpy`), then ``update_epochs`` passes over it in
    shuffled minibatches: loss (:func:`ppo_loss_torch`), backward, clip, Adam step."""
    import torch

    adv, targets = gae_numpy(
        buf.reward, buf.value.numpy(), buf.terminated, buf.done, last_value, config.gamma, config.gae_lambda
    )
    b_obs = buf.obs.reshape(-1, buf.obs.shape[-1])
    b_act = buf.action.reshape(-1)
    b_logp = buf.log_prob.reshape(-1)
    b_val = buf.value.reshape(-1)
    b_adv = torch.from_numpy(adv.reshape(-1))
    b_tgt = torch.from_numpy(targets.reshape(-1))
    b_valid = torch.from_numpy(buf.valid.reshape(-1))
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for _ in range(config.update_epochs):
        perm = torch.randperm(config.batch_size)
        for start in range(0, config.batch_size, config.minibatch_size):
            idx = perm[start : start + config.minibatch_size]
            loss, _ = ppo_loss_torch(
                actor,
                critic,
                b_obs[idx],
                b_act[idx],
                b_logp[idx],
                b_val[idx],
                b_adv[idx],
                b_tgt[idx],
                b_valid[idx],
                config,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm, foreach=True)
            optimizer.step()


def train_torch(
    config: PPOConfig,
    seed: int = 0,
    n_updates: int | None = None,
    vectorization: Literal["vector_entry_point", "sync"] = "vector_entry_point",
    torch_threads: int = 1,
    progress: Callable[[int], None] | None = None,
) -> TorchPPOResult:
    """PPO with ``config``'s hyperparameters as a classic Python loop; see the module docstring.

    Per update: anneal the learning rate, :func:`collect_rollout_torch`, then
    :func:`learn_from_rollout`, each update timed.

    Args:
        config: the hyperparameters (shared with the JAX loop).
        seed: seeds torch (weights, sampling, shuffles) and the env resets.
        n_updates: stop after this many updates (default ``config.num_updates``); the
            learning-rate schedule still spans ``config.num_updates``, so a short run
            times the same steady-state work per update.
        vectorization: ``"vector_entry_point"`` (numpy-vectorised CartPole) or ``"sync"``.
        torch_threads: torch intra-op threads for the run (restored afterwards).
        progress: called with the update index after each update.
    """
    import torch

    n_updates = config.num_updates if n_updates is None else n_updates
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    envs = make_vector_cartpole(config, vectorization)
    try:
        torch.manual_seed(seed)
        obs_dim, n_actions = _space_sizes(envs)
        actor, critic = make_actor_critic(obs_dim, n_actions, config.hidden)
        params = list(actor.parameters()) + list(critic.parameters())
        optimizer = torch.optim.Adam(params, lr=config.lr, eps=1e-5, foreach=True)
        buf = RolloutBuffers.zeros(config.num_steps, config.num_envs, obs_dim)
        obs_np, _ = envs.reset(seed=seed)
        cursor = EnvCursor(torch.from_numpy(obs_np), np.zeros(config.num_envs, dtype=bool), np.zeros(config.num_envs))
        returns_out, episodes_out, update_s, rollout_s = [], [], [], []
        for update in range(n_updates):
            t_start = time.perf_counter()
            if config.anneal_lr:
                optimizer.param_groups[0]["lr"] = config.lr * (1.0 - update / config.num_updates)
            finished, last_value = collect_rollout_torch(actor, critic, envs, buf, cursor)
            t_rollout = time.perf_counter()
            learn_from_rollout(actor, critic, optimizer, buf, last_value, config)
            update_s.append(time.perf_counter() - t_start)
            rollout_s.append(t_rollout - t_start)
            returns_out.append(float(np.mean(finished)) if finished else float("nan"))
            episodes_out.append(len(finished))
            if progress is not None:
                progress(update)
    finally:
        envs.close()
        torch.set_num_threads(previous_threads)
    return TorchPPOResult(
        config=config,
        episode_return=np.array(returns_out),
        episodes=np.array(episodes_out, dtype=np.int64),
        update_seconds=np.array(update_s),
        rollout_seconds=np.array(rollout_s),
        env_steps=n_updates * config.batch_size,
        actor=actor,
        critic=critic,
    )
