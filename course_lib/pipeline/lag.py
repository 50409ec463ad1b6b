r"""The controlled-lag ablation: no correction vs V-trace vs on-policy (lesson 03).

In a real actor-learner system the lag between the policy that acted and the policy
that learns is whatever the timing makes it. To study its effect we control it: one
process, one loop, and the batch for update ``u`` is collected with the learner's
weights of update ``u - k`` (a ring of parameter snapshots), so every rollout is exactly
``k`` updates stale (during the first ``k`` updates, the initial weights act: the lag
grows from 0 to ``k``). Then we compare, at each ``k``:

* **no correction**: the on-policy actor-critic loss applied to stale data as if it were
  fresh (IMPALA's "no-correction" baseline: n-step returns, unweighted advantages);
* **V-trace**: the same loss with V-trace targets and truncated-ratio advantages
  (:func:`course_lib.rl.vtrace.vtrace`);
* **on-policy**: ``k = 0``, where both coincide (every ratio is 1).

The loss of one agent, averaged over its ``T x B`` steps (Espeholt et al. 2018, eq. 2-4)::

    L = -A_s log pi(a_s|x_s)  +  baseline_cost * 1/2 (v_s - V(x_s))^2  -  entropy_cost * H(pi(.|x_s))

**A population in one network.** Every (method, lag, seed) is an independent agent, and
all of them train at once: their parameters are stacked along a leading axis
(``torch.func.stack_module_state``) and one ``vmap``-ed forward pass serves them all, on
one big vector env. Adam is element-wise and the total loss is a sum of the agents'
losses, so each agent's update is exactly what it would be alone; running 30 agents
costs little more than running one (the same trick lesson 04 plays with ``jax.vmap``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from numpy.typing import NDArray
from torch.func import functional_call, stack_module_state, vmap

from course_lib.actor_learner import ActorCritic, LossConfig, loss_terms, make_envs

Method = Literal["no correction", "v-trace"]
METHODS: tuple[Method, ...] = ("no correction", "v-trace")


@dataclass(frozen=True)
class LagConfig:
    """The training run every agent of the ablation shares."""

    n_envs: int = field(default=32, metadata={"help": "CartPole envs per agent (B)"})
    unroll: int = field(default=16, metadata={"help": "steps per rollout (T)"})
    n_updates: int = field(default=500, metadata={"help": "learner updates per agent"})
    hidden: int = field(default=64, metadata={"help": "width of the policy and value MLPs"})
    lr: float = field(default=3e-3, metadata={"help": "Adam learning rate"})
    gamma: float = field(default=0.99, metadata={"help": "discount"})
    baseline_cost: float = field(default=0.5, metadata={"help": "weight of the value loss"})
    entropy_cost: float = field(default=0.01, metadata={"help": "weight of the entropy bonus"})
    rho_bar: float = field(default=1.0, metadata={"help": "V-trace rho-bar (value targets)"})
    c_bar: float = field(default=1.0, metadata={"help": "V-trace c-bar (traces)"})
    pg_rho_bar: float = field(default=1.0, metadata={"help": "V-trace rho-bar of the policy-gradient advantage"})
    env_seed: int = field(default=0, metadata={"help": "seed of the shared vector env and of action sampling"})

    @property
    def loss(self) -> LossConfig:
        """The coefficients and thresholds above, as the IMPALA loss takes them."""
        return LossConfig(self.gamma, self.baseline_cost, self.entropy_cost, self.rho_bar, self.c_bar, self.pg_rho_bar)


@dataclass(frozen=True)
class Arm:
    """One condition of the ablation: a correction method at a policy lag ``k`` (updates)."""

    method: Method
    lag: int

    @property
    def label(self) -> str:
        return "on-policy (k = 0)" if self.lag == 0 else f"{self.method}, k = {self.lag}"


@dataclass
class LagResult:
    """Learning curves of every agent.

    Attributes:
        arms: the conditions, in order.
        seeds: the seeds (model initialisation), the same for every arm.
        returns: ``[n_arms, n_seeds, n_updates]`` mean return of the episodes that
            ended during each update's rollout (NaN where none ended).
        entropy: ``[n_arms, n_seeds, n_updates]`` mean entropy of the learner's policy
            on each batch (nats).
        divergence: ``[n_arms, n_seeds, n_updates]`` mean ``|log pi(a|x) - log mu(a|x)|``
            over each batch's actions: how far the learner has moved from the policy that
            acted (measured for every arm, also where the loss ignores it; 0 at ``k = 0``).
        frames: env frames per agent per update (``T * B``).
        seconds: wall-clock seconds of the whole ablation.
    """

    arms: list[Arm]
    seeds: list[int]
    returns: NDArray[np.float64]
    entropy: NDArray[np.float64]
    divergence: NDArray[np.float64]
    frames: int
    seconds: float

    def smoothed(self, window: int = 20) -> NDArray[np.float64]:
        """``returns`` with gaps filled forward and a trailing moving average of ``window`` updates."""
        r = self.returns.copy()
        for idx in np.ndindex(r.shape[:2]):
            row = r[idx]
            last = 0.0
            for u in range(row.shape[0]):
                if np.isnan(row[u]):
                    row[u] = last
                last = row[u]
        kernel = np.ones(window) / window
        out = np.empty_like(r)
        for idx in np.ndindex(r.shape[:2]):
            padded = np.concatenate([np.full(window - 1, r[idx][0]), r[idx]])
            out[idx] = np.convolve(padded, kernel, mode="valid")
        return out

    def final(self, fraction: float = 0.25) -> NDArray[np.float64]:
        """``[n_arms, n_seeds]`` mean return over the last ``fraction`` of the updates."""
        n = max(1, round(self.returns.shape[-1] * fraction))
        return np.nanmean(self.returns[..., -n:], axis=-1)

    def table(self) -> list[tuple[str, float, float, float]]:
        """``(label, mean, min, max)`` over seeds of :meth:`final`, one row per arm."""
        f = self.final()
        return [(a.label, float(f[i].mean()), float(f[i].min()), float(f[i].max())) for i, a in enumerate(self.arms)]


def default_arms(lags: Sequence[int]) -> list[Arm]:
    """On-policy, then no correction and V-trace at each positive lag."""
    arms = [Arm("v-trace", 0)]
    for k in lags:
        if k > 0:
            arms += [Arm("no correction", k), Arm("v-trace", k)]
    return arms


class _Population:
    """Every agent's actor-critic, parameters stacked along a leading agent axis ``[S, ...]``,
    with one ``vmap``-ed forward pass for all of them.

    Agent ``i`` is initialised with ``torch.manual_seed(init_seeds[i])``, in order.
    """

    def __init__(self, init_seeds: Sequence[int], hidden: int) -> None:
        models = []
        for s in init_seeds:
            torch.manual_seed(s)
            models.append(ActorCritic(4, 2, hidden))
        self.params, _ = stack_module_state(models)  # name -> [S, ...] leaf tensors
        self.policy_keys = [k for k in self.params if k.startswith("policy.")]
        base = ActorCritic(4, 2, hidden).to("meta")

        def forward(p: dict[str, torch.Tensor], obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return functional_call(base, p, (obs,))

        def act(p: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
            return functional_call(base.policy, p, (obs,))  # acting needs no value

        self._forward = vmap(forward)
        self._act = vmap(act)

    def __call__(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``obs [S, ..., 4] -> (logits [S, ..., 2], values [S, ...])`` with the current parameters."""
        return self._forward(self.params, obs)

    def policy_logits(self, policy: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        """``obs [S, B, 4] -> logits [S, B, 2]`` of the policy networks ``policy`` (names without ``policy.``)."""
        return self._act(policy, obs)


class _PolicyRing:
    """Snapshots of every agent's policy weights, one per version, for the last ``max(lags) + 1``
    versions, so that agent ``i`` acts at update ``u`` with version ``max(u - lags[i], 0)``."""

    def __init__(self, population: _Population, lags: torch.Tensor) -> None:
        self.lags = lags
        self.size = int(lags.max()) + 1
        self.snapshots = {
            k: population.params[k].detach().unsqueeze(0).repeat(self.size, *[1] * population.params[k].ndim)
            for k in population.policy_keys
        }
        self._agents = torch.arange(len(lags))

    def behaviour(self, update: int) -> dict[str, torch.Tensor]:
        """Each agent's policy weights of version ``update - lag`` (``[S, ...]``, names without ``policy.``)."""
        slot = torch.clamp(update - self.lags, min=0) % self.size
        return {k.removeprefix("policy."): v[slot, self._agents] for k, v in self.snapshots.items()}

    def record(self, update: int, population: _Population) -> None:
        """Store the weights that update ``update`` produced (version ``update + 1``)."""
        with torch.no_grad():
            for k, v in self.snapshots.items():
                v[(update + 1) % self.size] = population.params[k]


@dataclass
class _Rollout:
    """One update's rollout of every agent, time-major: ``obs [T + 1, S, B, 4]``, the rest ``[T, S, B]``."""

    obs: torch.Tensor
    actions: torch.Tensor
    behaviour_logp: torch.Tensor
    rewards: NDArray[np.float64]
    dones: NDArray[np.float64]

    @classmethod
    def zeros(cls, n_t: int, n_agents: int, n_b: int) -> _Rollout:
        return cls(
            obs=torch.zeros(n_t + 1, n_agents, n_b, 4),
            actions=torch.zeros(n_t, n_agents, n_b, dtype=torch.long),
            behaviour_logp=torch.zeros(n_t, n_agents, n_b),
            rewards=np.zeros((n_t, n_agents, n_b)),
            dones=np.zeros((n_t, n_agents, n_b)),
        )


def _collect_rollout(
    envs: Any,
    population: _Population,
    behaviour: dict[str, torch.Tensor],
    obs_np: NDArray[np.float32],
    rollout: _Rollout,
    episode_return: NDArray[np.float64],
    generator: torch.Generator,
) -> tuple[NDArray[np.float32], list[list[float]]]:
    """Step ``envs`` (``S x B`` CartPoles, agent ``i`` owns envs ``i B .. (i + 1) B - 1``) for
    ``T`` steps with every agent's ``behaviour`` policy, writing ``rollout`` in place.

    ``episode_return`` (``[S B]``, running returns) is updated in place. Returns the
    observations after the last step and, per agent, the returns of the episodes that ended.
    """
    n_t, n_agents, n_b = rollout.actions.shape
    finished: list[list[float]] = [[] for _ in range(n_agents)]
    with torch.no_grad():
        for t in range(n_t):
            obs = torch.from_numpy(obs_np).view(n_agents, n_b, 4)
            logp = torch.log_softmax(population.policy_logits(behaviour, obs), dim=-1)
            a = torch.multinomial(logp.exp().view(-1, 2), 1, generator=generator).view(n_agents, n_b)
            rollout.obs[t], rollout.actions[t] = obs, a
            rollout.behaviour_logp[t] = logp.gather(-1, a.unsqueeze(-1)).squeeze(-1)
            obs_np, r, term, trunc, _ = envs.step(a.view(-1).numpy())
            done = np.logical_or(term, trunc)
            episode_return += r
            for i in np.flatnonzero(done):
                finished[i // n_b].append(episode_return[i])
            episode_return[done] = 0.0
            rollout.rewards[t], rollout.dones[t] = r.reshape(n_agents, n_b), done.reshape(n_agents, n_b)
        rollout.obs[n_t] = torch.from_numpy(obs_np).view(n_agents, n_b, 4)
    return obs_np, finished


def _learn(
    population: _Population,
    optimizer: torch.optim.Optimizer,
    rollout: _Rollout,
    corrected: torch.Tensor,
    loss_cfg: LossConfig,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """One Adam step of every agent on its own loss (03.5), V-trace where ``corrected[i]``.

    The columns of :func:`loss_terms` are the (agent, env) pairs; the summed loss gives each
    agent exactly its own gradient. Returns ``[S]`` mean entropies of the learner's policies
    and ``[S]`` mean ``|log pi(a|x) - log mu(a|x)|`` of the actions taken (whatever the loss).
    """
    n_t, n_agents, n_b = rollout.actions.shape
    logits, values = population(rollout.obs.transpose(0, 1))  # [S, T+1, B, 2], [S, T+1, B]
    terms = loss_terms(
        logits=logits.transpose(0, 1).reshape(n_t + 1, n_agents * n_b, 2),
        values=values.transpose(0, 1).reshape(n_t + 1, n_agents * n_b),
        actions=rollout.actions.view(n_t, -1),
        behaviour_logp=rollout.behaviour_logp.view(n_t, -1),
        rewards=rollout.rewards.reshape(n_t, -1),
        dones=rollout.dones.reshape(n_t, -1),
        cfg=loss_cfg,
        correct=corrected.repeat_interleave(n_b),
    )

    def per_agent(x: torch.Tensor) -> torch.Tensor:
        return x.view(n_t, n_agents, n_b).mean(dim=(0, 2))

    losses = (
        per_agent(terms.pg)
        + loss_cfg.baseline_cost * per_agent(terms.baseline)
        - loss_cfg.entropy_cost * per_agent(terms.entropy)
    )
    entropy = per_agent(terms.entropy).detach().numpy()
    with torch.no_grad():
        target_logp = torch.log_softmax(logits[:, :n_t], dim=-1).gather(-1, rollout.actions.transpose(0, 1)[..., None])
        gap = (target_logp.squeeze(-1) - rollout.behaviour_logp.transpose(0, 1)).abs()  # [S, T, B]
        divergence = gap.mean(dim=(1, 2)).numpy()
    optimizer.zero_grad()
    losses.sum().backward()
    optimizer.step()
    return entropy, divergence


def run_lag_ablation(
    arms: Sequence[Arm],
    seeds: Sequence[int],
    config: LagConfig = LagConfig(),
    progress: Callable[[int], None] | None = None,
) -> LagResult:
    """Train one agent per (arm, seed) on CartPole-v1, all at once; see the module docstring.

    Each update: every agent acts ``T`` steps with its policy of ``lag`` updates ago
    (:class:`_PolicyRing`), then learns from that rollout with its current weights.
    Deterministic for given arguments on a given machine (seeded torch generator, seeded
    env, one thread).

    Args:
        arms: the conditions.
        seeds: model-initialisation seeds; each arm gets every seed.
        config: the shared training run.
        progress: called after every update with its index (e.g. a tqdm bar).
    """
    arms, seeds = list(arms), list(seeds)
    n_agents = len(arms) * len(seeds)
    lags = torch.tensor([a.lag for a in arms for _ in seeds])
    corrected = torch.tensor([a.method == "v-trace" for a in arms for _ in seeds])
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    envs = make_envs("CartPole-v1", n_agents * config.n_envs)
    try:
        population = _Population(seeds * len(arms), config.hidden)
        optimizer = torch.optim.Adam(population.params.values(), lr=config.lr)
        ring = _PolicyRing(population, lags)
        generator = torch.Generator().manual_seed(config.env_seed)
        obs_np, _ = envs.reset(seed=config.env_seed)
        episode_return = np.zeros(n_agents * config.n_envs)
        rollout = _Rollout.zeros(config.unroll, n_agents, config.n_envs)
        curves = np.full((n_agents, config.n_updates), np.nan)
        entropies = np.zeros((n_agents, config.n_updates))
        divergences = np.zeros((n_agents, config.n_updates))
        start = time.perf_counter()
        for update in range(config.n_updates):
            obs_np, finished = _collect_rollout(
                envs, population, ring.behaviour(update), obs_np, rollout, episode_return, generator
            )
            for agent, f in enumerate(finished):
                if f:
                    curves[agent, update] = float(np.mean(f))
            entropies[:, update], divergences[:, update] = _learn(
                population, optimizer, rollout, corrected, config.loss
            )
            ring.record(update, population)
            if progress is not None:
                progress(update)
        seconds = time.perf_counter() - start
    finally:
        envs.close()
        torch.set_num_threads(previous_threads)
    shape = (len(arms), len(seeds), config.n_updates)
    return LagResult(
        arms=arms,
        seeds=seeds,
        returns=curves.reshape(shape),
        entropy=entropies.reshape(shape),
        divergence=divergences.reshape(shape),
        frames=config.unroll * config.n_envs,
        seconds=seconds,
    )


# ---------------------------------------------------------------------------------------
# A toy off-policy evaluation: what each target estimates as the policies drift apart
# ---------------------------------------------------------------------------------------


def two_action_chain_targets(
    p_target: float,
    p_behaviour: float,
    n_steps: int = 20,
    gamma: float = 0.9,
    n_trajectories: int = 2000,
    n_iterations: int = 150,
    seed: int = 0,
) -> dict[str, NDArray[np.float64]]:
    """Off-policy evaluation in a one-state, two-action chain, by three targets.

    Every step the agent picks action 0 (reward 1) or action 1 (reward 0): the target
    policy ``pi`` picks 0 with probability ``p_target``, the behaviour ``mu`` with
    ``p_behaviour``. The value estimate ``V`` (one number: there is one state) is
    learned as the fixed point of each target: start at 0, set ``V`` to the mean target
    over ``n_trajectories`` behaviour trajectories, repeat ``n_iterations`` times.

    * no correction ignores the ratios: it converges to ``V^mu``;
    * V-trace (``rho_bar = c_bar = 1``) converges to the value of the policy
      ``pi_rho(a) ~ min(rho_bar mu(a), pi(a))``, between ``mu`` and ``pi``, with bounded variance;
    * importance sampling (no truncation) is unbiased for ``V^pi``, but its variance grows
      with the divergence and with ``n_steps``.

    Returns:
        ``{name: [n_trajectories] targets v_0 at the fixed point}`` for the three, plus
        ``"true value"``: ``[1]`` ``V^pi = p_target / (1 - gamma)`` and ``"V-trace fixed
        point"``: ``[1]`` ``V^{pi_rho}`` (Espeholt et al. 2018, Theorem 1).
    """
    from course_lib.rl.vtrace import vtrace

    rng = np.random.default_rng(seed)
    first: NDArray[np.bool_] = rng.random((n_steps, n_trajectories)) < p_behaviour  # action 0 taken
    rewards = first.astype(np.float64)
    log_rhos = np.full(first.shape, np.log((1 - p_target) / (1 - p_behaviour)))  # log(pi/mu) of action 1
    log_rhos[first] = np.log(p_target / p_behaviour)
    thresholds = {"no correction": (0.0, 1.0), "V-trace": (1.0, 1.0), "importance sampling": (1.0, None)}
    out: dict[str, NDArray[np.float64]] = {}
    for name, (scale, bar) in thresholds.items():
        value = 0.0
        for _ in range(n_iterations):
            targets = vtrace(
                scale * log_rhos,
                np.full(rewards.shape, gamma),
                rewards,
                np.full(rewards.shape, value),
                np.full(n_trajectories, value),
                bar,
                bar,
                bar,
            ).vs[0]
            value = float(targets.mean())
        out[name] = targets
    p_rho = min(p_behaviour, p_target) / (min(p_behaviour, p_target) + min(1 - p_behaviour, 1 - p_target))
    out["true value"] = np.array([p_target / (1 - gamma)])
    out["V-trace fixed point"] = np.array([p_rho / (1 - gamma)])
    return out
