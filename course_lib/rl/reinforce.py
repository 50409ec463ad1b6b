"""REINFORCE on gymnasium CartPole with torch: the classic CPU loop (lesson 01).

Williams (1992): sample complete episodes with the current policy, weight every
``grad log pi(a_t|s_t)`` by the reward-to-go ``G_t`` minus a baseline, and take a
gradient step on the surrogate loss (eq. 01.7)::

    for update in 1..n_updates:
        run n_envs envs until each has finished one episode       (acting: torch.no_grad)
        G_t = r_t + gamma (1 - d_t) G_{t+1}                        (01.3, discounted_returns)
        A_t = (G_t - mean G) / std G                               (01.5, baseline + scale)
        L   = -mean_t A_t log pi(a_t|s_t);  theta <- Adam(grad L)  (01.7, surrogate_loss)

The loop reads top to bottom (CleanRL style), takes a typed :class:`ReinforceConfig`
and returns every episode's return, so learning curves can be drawn. Later lessons reuse
:func:`train_reinforce` as "the classic CPU loop": a Python loop that steps a
gymnasium vector env and a small torch MLP on the CPU, one step at a time.

The environment is ``gym.make_vec(env_id, n_envs, vectorization_mode=...)``:
``"vector_entry_point"`` (default) is gymnasium's own numpy-vectorised CartPole,
``"sync"`` a ``SyncVectorEnv`` of ``n_envs`` ordinary envs (about 2x slower here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from course_lib.rl.pg import discounted_returns, episode_returns, surrogate_loss

if TYPE_CHECKING:
    import gymnasium as gym
    import torch
    from torch import nn

Baseline = Literal["none", "mean"]


@dataclass(frozen=True)
class ReinforceConfig:
    """Everything a REINFORCE run depends on. ``help(ReinforceConfig)`` or :func:`course_lib.describe` lists the help."""

    env_id: str = field(default="CartPole-v1", metadata={"help": "gymnasium id of an env with a discrete action space"})
    n_envs: int = field(
        default=16, metadata={"help": "episodes per update: one complete episode from each vectorised env"}
    )
    n_updates: int = field(default=50, metadata={"help": "policy-gradient updates (one batch of n_envs episodes each)"})
    hidden: int = field(default=32, metadata={"help": "width of the two tanh hidden layers of the policy MLP"})
    lr: float = field(default=0.01, metadata={"help": "Adam learning rate"})
    lr_anneal: bool = field(default=False, metadata={"help": "decay the learning rate linearly to 0 over the run"})
    gamma: float = field(default=0.99, metadata={"help": "discount of the returns (01.3)"})
    reward_to_go: bool = field(
        default=True, metadata={"help": "weight step t by G_t (True) or by the whole episode's return (False)"}
    )
    baseline: Baseline = field(
        default="mean", metadata={"help": "'mean': subtract the batch mean of the weights (01.5); 'none'"}
    )
    normalize: bool = field(
        default=True, metadata={"help": "divide the weights by their batch std (a step-size choice)"}
    )
    seed: int = field(default=0, metadata={"help": "seeds torch (weights, action sampling) and the env resets"})
    torch_threads: int = field(
        default=1, metadata={"help": "torch intra-op threads while training (1 is fastest for tiny nets)"}
    )
    vectorization: Literal["vector_entry_point", "sync"] = field(
        default="vector_entry_point",
        metadata={"help": "gym.make_vec mode: the env's numpy-vectorised version or a SyncVectorEnv"},
    )


def make_env(config: ReinforceConfig) -> gym.vector.VectorEnv:
    """``config.n_envs`` copies of ``config.env_id`` behind one vector-env interface."""
    import gymnasium as gym

    return gym.make_vec(config.env_id, num_envs=config.n_envs, vectorization_mode=config.vectorization)


def make_policy(obs_dim: int, n_actions: int, hidden: int) -> nn.Module:
    """``obs [N, obs_dim] -> logits [N, n_actions]``: an MLP with two tanh hidden layers."""
    from torch import nn

    return nn.Sequential(
        nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, n_actions)
    )


@dataclass(frozen=True)
class EpisodeBatch:
    """One complete episode from each of ``B`` envs, time-major and padded to the longest.

    Attributes:
        obs: ``[T, B, obs_dim]`` float32 observations.
        actions: ``[T, B]`` int64 actions.
        rewards: ``[T, B]`` float64 rewards (0 at padding).
        dones: ``[T, B]`` 1 at each episode's last step and at every padding step.
        mask: ``[T, B]`` True at real steps.
    """

    obs: NDArray[np.float32]
    actions: NDArray[np.int64]
    rewards: NDArray[np.float64]
    dones: NDArray[np.float64]
    mask: NDArray[np.bool_]

    @property
    def returns(self) -> NDArray[np.float64]:
        """``[B]`` undiscounted return of each episode."""
        return self.rewards.sum(axis=0)

    @property
    def n_steps(self) -> int:
        """Real (unpadded) environment steps in the batch."""
        return int(self.mask.sum())

    def back_to_back(
        self,
    ) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.float64], NDArray[np.float64]]:
        """The real steps as one column, episodes back to back: ``(obs [N, 1, obs_dim],
        actions [N, 1], rewards [N, 1], dones [N, 1])`` with ``N`` = :attr:`n_steps`.

        Every step is real and ``dones`` marks each episode's last step, the layout
        lesson 01's ``reinforce_update`` exercise takes.
        """
        m = self.mask.T  # [B, T]: episode by episode, each in time order
        obs = self.obs.transpose(1, 0, 2)[m]
        return obs[:, None, :], self.actions.T[m][:, None], self.rewards.T[m][:, None], self.dones.T[m][:, None]


def collect_episodes(
    envs: gym.vector.VectorEnv,
    policy: nn.Module,
    seed: int,
    generator: torch.Generator,
    max_steps: int = 100_000,
) -> EpisodeBatch:
    """Run every env of ``envs`` from a reset until it finishes one episode.

    Acting uses ``torch.no_grad()``; actions are sampled from ``softmax(policy(obs))``
    with ``generator``. Envs that finish early keep stepping (a vector env steps all of
    them) but their steps are masked out.

    Raises:
        RuntimeError: if some episode is still running after ``max_steps`` steps (an
            environment without a time limit).
    """
    import torch

    obs, _ = envs.reset(seed=seed)
    n = obs.shape[0]
    alive = np.ones(n, dtype=bool)
    obs_l: list[NDArray[np.floating]] = []
    act_l: list[NDArray[np.int64]] = []
    rew_l: list[NDArray[np.float64]] = []
    done_l: list[NDArray[np.bool_]] = []
    mask_l: list[NDArray[np.bool_]] = []
    with torch.no_grad():
        while alive.any():
            if len(obs_l) >= max_steps:
                raise RuntimeError(
                    f"{int(alive.sum())} episode(s) still running after {max_steps} steps; wrap the env in a time limit"
                )
            probs = torch.softmax(policy(torch.from_numpy(obs)), dim=-1)
            actions = torch.multinomial(probs, 1, generator=generator).squeeze(1).numpy()
            next_obs, reward, terminated, truncated, _ = envs.step(actions)
            ended = np.logical_or(terminated, truncated)
            obs_l.append(obs)
            act_l.append(actions)
            rew_l.append(np.where(alive, reward, 0.0))
            done_l.append(np.logical_or(ended, ~alive))
            mask_l.append(alive.copy())
            alive &= ~ended
            obs = next_obs
    return EpisodeBatch(
        obs=np.stack(obs_l).astype(np.float32),
        actions=np.stack(act_l).astype(np.int64),
        rewards=np.stack(rew_l).astype(np.float64),
        dones=np.stack(done_l).astype(np.float64),
        mask=np.stack(mask_l),
    )


def step_weights(
    batch: EpisodeBatch, gamma: float, reward_to_go: bool, baseline: Baseline, normalize: bool
) -> NDArray[np.float64]:
    """``[T, B]`` weight ``A_t`` of each step's score (0 at padding).

    ``G_t`` (reward-to-go, 01.3) or the episode's whole return ``R(tau)`` (01.2), minus
    the batch mean over real steps if ``baseline == "mean"`` (01.5), divided by the
    batch std if ``normalize``.
    """
    if baseline not in ("none", "mean"):
        raise ValueError(f"baseline must be 'none' or 'mean', got {baseline!r}")
    psi = (discounted_returns if reward_to_go else episode_returns)(batch.rewards, batch.dones, gamma)
    real = psi[batch.mask]
    if baseline == "mean" and real.size:
        psi = psi - real.mean()
    if normalize and real.size:
        psi = psi / (real.std() + 1e-8)
    return np.where(batch.mask, psi, 0.0)


def batch_loss(policy: nn.Module, batch: EpisodeBatch, weights: NDArray[np.float64]) -> torch.Tensor:
    """The surrogate loss (01.7) over the real steps of ``batch``."""
    import torch

    m = batch.mask
    logits = policy(torch.from_numpy(batch.obs[m]))
    return surrogate_loss(logits, torch.from_numpy(batch.actions[m]), torch.from_numpy(weights[m]).float())


def flat_policy_gradient(policy: nn.Module, batch: EpisodeBatch, weights: NDArray[np.float64]) -> NDArray[np.float64]:
    """The policy-gradient estimate ``g_hat = -grad L`` as one flat float64 vector (no step taken)."""
    import torch

    params = [p for p in policy.parameters() if p.requires_grad]
    grads = torch.autograd.grad(batch_loss(policy, batch, weights), params)
    return -torch.cat([g.reshape(-1) for g in grads]).double().numpy()


@dataclass
class ReinforceResult:
    """What :func:`train_reinforce` returns.

    Attributes:
        config: the run's configuration.
        returns: ``[n_updates, n_envs]`` undiscounted return of every episode, in order.
        lengths: ``[n_updates, n_envs]`` steps of every episode.
        loss: ``[n_updates]`` surrogate loss of each update.
        entropy: ``[n_updates]`` mean entropy of the acting policy over each batch's steps (nats).
        grad_norm: ``[n_updates]`` L2 norm of each update's gradient.
        seconds: wall-clock seconds of the run; ``act_seconds`` of it spent collecting episodes.
        env_steps: real environment steps sampled.
        policy: the trained policy.
    """

    config: ReinforceConfig
    returns: NDArray[np.float64]
    lengths: NDArray[np.int64]
    loss: NDArray[np.float64]
    entropy: NDArray[np.float64]
    grad_norm: NDArray[np.float64]
    seconds: float
    act_seconds: float
    env_steps: int
    policy: Any = field(repr=False)

    @property
    def episode_returns(self) -> NDArray[np.float64]:
        """``[n_updates * n_envs]`` every episode's return in the order they were collected."""
        return self.returns.reshape(-1)

    def final_mean_return(self, n_episodes: int = 100) -> float:
        """Mean return of the last ``n_episodes`` episodes."""
        return float(self.episode_returns[-n_episodes:].mean())

    @property
    def steps_per_second(self) -> float:
        """Environment steps per wall-clock second (SPS), acting and learning together."""
        return self.env_steps / self.seconds if self.seconds > 0 else float("nan")

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self.config),
            "final_mean_return": self.final_mean_return(),
            "env_steps": self.env_steps,
            "seconds": self.seconds,
            "sps": self.steps_per_second,
        }


def policy_for(envs: gym.vector.VectorEnv, hidden: int) -> nn.Module:
    """A fresh softmax MLP policy sized for ``envs`` (Box observations, Discrete actions).

    Raises:
        TypeError: if the env's spaces are not a Box observation and Discrete actions.
    """
    import gymnasium as gym

    obs_shape = envs.single_observation_space.shape
    action_space = envs.single_action_space
    if obs_shape is None or not isinstance(action_space, gym.spaces.Discrete):
        raise TypeError(f"REINFORCE here needs a Box observation and Discrete actions, got {envs}")
    return make_policy(int(np.prod(obs_shape)), int(action_space.n), hidden)


def reinforce_update(
    policy: nn.Module, optimizer: torch.optim.Optimizer, batch: EpisodeBatch, config: ReinforceConfig
) -> tuple[float, float, float]:
    """One gradient step on a batch of episodes; returns ``(loss, policy entropy, gradient norm)``.

    The per-step weights come from the config's estimator (:func:`step_weights`: returns,
    reward to go, baseline, normalisation), the loss is (01.7)'s surrogate over the real
    steps, and the norm is the whole gradient's, before the optimizer's step.
    """
    import torch

    weights = step_weights(batch, config.gamma, config.reward_to_go, config.baseline, config.normalize)
    m = batch.mask
    logits = policy(torch.from_numpy(batch.obs[m]))
    loss = surrogate_loss(logits, torch.from_numpy(batch.actions[m]), torch.from_numpy(weights[m]).float())
    optimizer.zero_grad()
    loss.backward()
    squares = torch.zeros(())
    for p in policy.parameters():
        if p.grad is not None:
            squares = squares + (p.grad**2).sum()
    gnorm = float(torch.sqrt(squares))
    optimizer.step()
    with torch.no_grad():
        logp = torch.log_softmax(logits, dim=-1)
        entropy = float(-(logp.exp() * logp).sum(-1).mean())
    return loss.item(), entropy, gnorm


def train_reinforce(
    config: ReinforceConfig,
    progress: Callable[[int, EpisodeBatch], None] | None = None,
) -> ReinforceResult:
    """Train a softmax MLP policy with REINFORCE; see the module docstring for the loop.

    Seeded: torch's global seed (initial weights), a torch generator (actions) and the
    env resets (``seed * 100_003 + update``) all derive from ``config.seed``.

    Args:
        config: the run.
        progress: called after every update with its index and batch (e.g. to advance a
            :func:`course_lib.course.display.progress` bar).
    """
    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.torch_threads)
    envs = make_env(config)
    try:
        torch.manual_seed(config.seed)
        policy = policy_for(envs, config.hidden)
        optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
        generator = torch.Generator().manual_seed(config.seed)
        returns, lengths, losses, entropies, gnorms = [], [], [], [], []
        act_seconds = 0.0
        env_steps = 0
        start = time.perf_counter()
        for update in range(config.n_updates):
            if config.lr_anneal:
                optimizer.param_groups[0]["lr"] = config.lr * (1.0 - update / config.n_updates)
            t0 = time.perf_counter()
            batch = collect_episodes(envs, policy, seed=config.seed * 100_003 + update, generator=generator)
            act_seconds += time.perf_counter() - t0
            loss, entropy, gnorm = reinforce_update(policy, optimizer, batch, config)
            losses.append(loss)
            entropies.append(entropy)
            gnorms.append(gnorm)
            returns.append(batch.returns)
            lengths.append(batch.mask.sum(axis=0))
            env_steps += batch.n_steps
            if progress is not None:
                progress(update, batch)
        seconds = time.perf_counter() - start
    finally:
        envs.close()
        torch.set_num_threads(previous_threads)
    return ReinforceResult(
        config=config,
        returns=np.array(returns, dtype=np.float64),
        lengths=np.array(lengths, dtype=np.int64),
        loss=np.array(losses),
        entropy=np.array(entropies),
        grad_norm=np.array(gnorms),
        seconds=seconds,
        act_seconds=act_seconds,
        env_steps=env_steps,
        policy=policy,
    )


#: The estimator variants of lesson 01, section 5: (reward_to_go, baseline).
VARIANTS: dict[str, tuple[bool, Baseline]] = {
    "total return": (False, "none"),
    "total return - baseline": (False, "mean"),
    "reward-to-go": (True, "none"),
    "reward-to-go - baseline": (True, "mean"),
}


def gradients_by_variant(
    policy: nn.Module,
    config: ReinforceConfig,
    n_batches: int,
    gamma: float = 1.0,
    variants: dict[str, tuple[bool, Baseline]] | None = None,
    seed: int = 0,
) -> dict[str, NDArray[np.float64]]:
    """``{variant: [n_batches, n_params]}`` policy-gradient estimates at a fixed ``policy``.

    Every variant is computed on the same ``n_batches`` independent batches of
    ``config.n_envs`` episodes, without normalisation, so their variances compare
    directly. With ``gamma = 1`` all variants estimate the same gradient of the expected
    undiscounted return (the batch-mean baseline adds an ``O(1/n_envs)`` bias).
    """
    import torch

    variants = VARIANTS if variants is None else variants
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.torch_threads)
    envs = make_env(config)
    try:
        generator = torch.Generator().manual_seed(seed)
        out: dict[str, list[NDArray[np.float64]]] = {name: [] for name in variants}
        for i in range(n_batches):
            batch = collect_episodes(envs, policy, seed=seed * 100_003 + i, generator=generator)
            for name, (rtg, base) in variants.items():
                weights = step_weights(batch, gamma, rtg, base, normalize=False)
                out[name].append(flat_policy_gradient(policy, batch, weights))
    finally:
        envs.close()
        torch.set_num_threads(previous_threads)
    return {name: np.stack(v) for name, v in out.items()}
