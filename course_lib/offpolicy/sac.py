r"""Soft Actor-Critic with an on-device replay buffer, the whole loop one jitted program (lesson 06).

SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications", arXiv
1812.05905) learns off-policy from a replay buffer: twin Q networks and their Polyak-averaged
targets, a tanh-squashed Gaussian actor and a learned entropy temperature. Written in the
PureJaxRL style of :mod:`course_lib.ppo.jax_ppo` and in the spirit of V-Max (Valeo AI, arXiv
2503.08388: SAC on Waymax, JAX end to end), *acting, storing, sampling and learning compile
into one program*: the replay buffer (:mod:`course_lib.offpolicy.replay`) is a pytree of device
arrays carried through ``lax.scan`` like the env states and the parameters. One call of
``run_chunk`` (:func:`make_train`) is::

    for t in 1..steps_per_chunk:                                  lax.scan  (train_step)
        a ~ pi(.|s) for num_envs envs                              (sample_action)
        s', r, terminated, truncated, info = step(s, a)            vmapped env, auto-reset
        buffer <- (s, a, r, terminated, info["final_obs"])        (replay add)
        for u in 1..updates_per_step:                                           lax.scan  (learn_step)
            batch ~ buffer                                         (uniform or prioritized)
            critics <- Adam(grad critic loss)                      (06.2, 06.3)
            actor   <- Adam(grad policy loss)                      (06.4)
            log alpha <- Adam(grad temperature loss)               (06.5)
            targets <- tau critics + (1 - tau) targets             (06.6)

The first ``learning_starts`` env steps take uniformly random actions and skip the updates
(SAC's warm-up, a ``lax.cond`` in the same program). ``init(key)`` builds the networks, the
optimizers, the empty buffer and the envs. :func:`train` is the driver a lesson runs:
``run_chunk`` in a Python loop with a progress bar between chunks, several seeds as one
thread each (or one vmapped program); :func:`make_train_fn` is the same run as one function
of a key (every chunk in one more ``lax.scan``), to ``jax.vmap`` over seeds. For one key
both give the same numbers, bit for bit. :func:`evaluate` measures V-Max's accuracy
(``env.episode_success``), collision and off-road rates of the deterministic policy;
:func:`time_breakdown` says where a training step's time goes.

**Importing this module sets an XLA flag** (:func:`course_lib.ppo.jax_ppo.use_reliable_xla_cpu_flags`),
as lesson 04's module does: the nested scans here are the programs that need it.

The environment is any module with the continuous-control interface of
:class:`ContinuousEnv` (:mod:`course_lib.envs.driving` by default). Metrics follow
CleanRL's namespaces (``charts/``, ``losses/``); :data:`METRICS` explains each.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array

from course_lib.envs import driving
from course_lib.offpolicy import replay
from course_lib.ppo.jax_ppo import use_reliable_xla_cpu_flags

use_reliable_xla_cpu_flags()

Params = Any  # a pytree of arrays
MLP = list[dict[str, Array]]

#: Bounds of the actor's log standard deviation (CleanRL's and most SAC code's).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


# ---------------------------------------------------------------------------------------
# The environment interface SAC needs, and the hyperparameters
# ---------------------------------------------------------------------------------------


class ContinuousEnv(Protocol):
    """A continuous-action JAX env module (:mod:`course_lib.envs.driving` is the lesson's).

    ``step`` auto-resets; its ``info`` holds ``final_obs`` (the observation reached, before
    a reset) and, on that pre-reset state, ``collision``, ``offroad`` (bool) and
    ``progress_ratio`` (float), which :func:`episode_success` turns into V-Max's accuracy.
    """

    OBS_DIM: int
    ACTION_DIM: int

    def __hash__(self) -> int: ...  # a module is: programs are compiled once per env

    def reset(self, key: Array, params: Any) -> tuple[Array, Any]: ...

    def step(
        self, key: Array, state: Any, action: Array, params: Any
    ) -> tuple[Array, Any, Array, Array, Array, dict[str, Array]]: ...

    def episode_success(self, collision: Array, offroad: Array, progress_ratio: Array, params: Any) -> Array: ...


@dataclass(frozen=True)
class SACConfig:
    """Every SAC hyperparameter. :func:`course_lib.describe` lists the help.

    The defaults are the lesson's ``cpu`` scale (:data:`CPU_CONFIG`); :data:`FULL_CONFIG`
    is the GPU scale.
    """

    num_envs: int = field(default=8, metadata={"help": "parallel environments stepped together"})
    total_env_steps: int = field(
        default=160_000, metadata={"help": "environment steps of the whole run, all envs together, warm-up included"}
    )
    learning_starts: int = field(
        default=2_048, metadata={"help": "env steps of uniformly random actions that fill the buffer before learning"}
    )
    buffer_capacity: int = field(default=2**16, metadata={"help": "replay buffer size in transitions (a power of 2)"})
    batch_size: int = field(default=64, metadata={"help": "transitions per gradient update"})
    updates_per_step: int = field(
        default=1,
        metadata={"help": "gradient updates after each vectorised env step (one step of every env)"},
    )
    width: int = field(default=64, metadata={"help": "hidden units per layer, actor and both critics"})
    depth: int = field(default=2, metadata={"help": "hidden layers (ReLU), actor and both critics"})
    actor_lr: float = field(default=3e-4, metadata={"help": "Adam learning rate of the actor"})
    critic_lr: float = field(default=3e-4, metadata={"help": "Adam learning rate of the twin critics"})
    alpha_lr: float = field(default=3e-4, metadata={"help": "Adam learning rate of log alpha (the temperature)"})
    gamma: float = field(default=0.99, metadata={"help": "discount"})
    tau: float = field(default=0.005, metadata={"help": "Polyak rate of the target critics (06.6)"})
    init_alpha: float = field(default=0.1, metadata={"help": "initial entropy temperature alpha"})
    target_entropy: float = field(
        default=-2.0, metadata={"help": "entropy the temperature steers towards (06.5); -ACTION_DIM"}
    )
    reward_scale: float = field(default=1.0, metadata={"help": "rewards are multiplied by this before storing"})
    prioritized: bool = field(default=True, metadata={"help": "prioritized replay (else uniform)"})
    per_alpha: float = field(default=0.6, metadata={"help": "prioritized replay: priority exponent"})
    per_beta: float = field(default=0.4, metadata={"help": "prioritized replay: importance-weight exponent"})
    per_eps: float = field(default=1e-3, metadata={"help": "prioritized replay: added to |TD error|"})
    steps_per_chunk: int = field(
        default=100, metadata={"help": "vectorised env steps per run_chunk call (one progress-bar tick)"}
    )

    @property
    def utd(self) -> float:
        """The update-to-data ratio: gradient updates per environment transition,
        ``updates_per_step / num_envs``."""
        return self.updates_per_step / self.num_envs

    @property
    def warmup_steps(self) -> int:
        """Vectorised env steps of random actions before learning: ``ceil(learning_starts / num_envs)``."""
        return -(-self.learning_starts // self.num_envs)

    @property
    def steps_per_chunk_env(self) -> int:
        """Env steps (all envs) of one chunk."""
        return self.steps_per_chunk * self.num_envs

    @property
    def num_chunks(self) -> int:
        """Chunks of one run, the warm-up's included: ``total_env_steps // (steps_per_chunk * num_envs)``."""
        return self.total_env_steps // self.steps_per_chunk_env

    @property
    def env_steps_per_run(self) -> int:
        """Env steps one run really takes (whole chunks)."""
        return self.num_chunks * self.steps_per_chunk_env

    @property
    def updates_per_run(self) -> int:
        """Gradient updates of one run (none in the warm-up)."""
        return max(self.num_chunks * self.steps_per_chunk - self.warmup_steps, 0) * self.updates_per_step


def check_config(config: SACConfig) -> None:
    """Refuse a config the program cannot run."""
    cap = config.buffer_capacity
    if cap <= 0 or cap & (cap - 1):
        raise ValueError(f"buffer_capacity must be a power of 2, got {cap}")
    if config.learning_starts < config.batch_size:
        raise ValueError(f"learning_starts = {config.learning_starts} is less than batch_size = {config.batch_size}")
    if config.learning_starts > config.buffer_capacity:
        raise ValueError(f"learning_starts = {config.learning_starts} exceeds buffer_capacity")
    if config.num_chunks < 1:
        raise ValueError(f"total_env_steps = {config.total_env_steps} is less than one chunk")


#: The lesson's ``cpu`` scale (the defaults): 8 envs, 160k env steps, 19,744 updates of a
#: 64 x 64 actor and twin critics on batches of 64 from prioritized replay. Measured
#: 2026-11 on 2 shared CPU cores, 3 seeds as threads (:func:`train`): 41-49 s of training,
#: compilation included, at load average 1-4; over 9 seeds the deterministic policy's
#: accuracy was 0.91-0.96 (random actions 0.00, the heuristic 1.00; a later run on 256
#: episodes had one seed at 0.81 and 0.18 collisions), collisions 0.04-0.09
#: (random 0.23), off-road 0.00-0.03 (random 0.77). With uniform replay the same budget
#: left one seed in three at a random policy's collision rate; 15k updates were not enough
#: for every seed either (one of 6 above 0.2 collisions).
CPU_CONFIG = SACConfig()

#: The ``full`` scale, for a GPU (not run on the CPU machines): thousands of envs, wider and
#: deeper nets, a larger buffer and batch, more updates per env step; 10M env steps (half
#: V-Max's repository default of 20M, so that the full-scale lesson fits a GPU session).
#: Measured 2026-11-27 on one H200 (``sac.training_rates``, one seed): 282k env steps/s and
#: 1,100 gradient updates/s (a vectorised step of 1024 envs and its 4 updates: 3.6 ms), so
#: one seed's 10M steps take about 35 s after compiling.
FULL_CONFIG = SACConfig(
    num_envs=1024,
    total_env_steps=10_000_000,
    learning_starts=131_072,
    buffer_capacity=2**22,
    batch_size=1024,
    updates_per_step=4,
    width=256,
    depth=3,
    steps_per_chunk=100,
)


# ---------------------------------------------------------------------------------------
# Networks: small MLPs, a tanh-squashed Gaussian actor, twin critics
# ---------------------------------------------------------------------------------------


def init_mlp(key: Array, sizes: list[int]) -> MLP:
    """Dense layers ``sizes[0] -> ... -> sizes[-1]``: PyTorch's default scale (uniform,
    variance 1 / (3 fan_in)), zero biases. No LAPACK call (safe on several CPU devices)."""
    init = jax.nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
    keys = jax.random.split(key, len(sizes) - 1)
    return [
        {"w": init(k, (n_in, n_out), jnp.float32), "b": jnp.zeros((n_out,), jnp.float32)}
        for k, n_in, n_out in zip(keys, sizes[:-1], sizes[1:])
    ]


def mlp(layers: MLP, x: Array) -> Array:
    """``x [..., in] -> [..., out]``, ReLU between layers."""
    for layer in layers[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def init_actor(key: Array, obs_dim: int, action_dim: int, width: int, depth: int) -> MLP:
    """The actor: ``obs -> width x depth -> (mean, raw log std)`` (``2 action_dim`` outputs)."""
    return init_mlp(key, [obs_dim] + [width] * depth + [2 * action_dim])


def init_critics(key: Array, obs_dim: int, action_dim: int, width: int, depth: int) -> MLP:
    """Two critics ``(obs, action) -> width x depth -> Q``, stacked: every leaf has a leading axis of 2."""
    sizes = [obs_dim + action_dim] + [width] * depth + [1]
    return jax.vmap(lambda k: init_mlp(k, sizes))(jax.random.split(key, 2))


def q_values(critics: MLP, obs: Array, action: Array) -> Array:
    """Both critics at once: ``obs [..., O], action [..., A] -> Q [2, ...]``."""
    x = jnp.concatenate([obs, action], axis=-1)
    return jax.vmap(mlp, in_axes=(0, None))(critics, x)[..., 0]


def actor_distribution(actor: MLP, obs: Array) -> tuple[Array, Array]:
    """``obs [..., O] -> (mean, log_std)``, each ``[..., A]``; the log std squashed into
    ``[LOG_STD_MIN, LOG_STD_MAX]`` by a tanh (smooth bounds)."""
    mean, raw = jnp.split(mlp(actor, obs), 2, axis=-1)
    log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (jnp.tanh(raw) + 1.0)
    return mean, log_std


def tanh_gaussian_log_prob(u: Array, mean: Array, log_std: Array) -> Array:
    r"""``log pi(a|s)`` of ``a = tanh(u)``, ``u ~ N(mean, exp(log_std)^2)`` per dimension: ``[..., A] -> [...]``.

    Change of variables (SAC paper, appendix C): the density of ``a`` is the Gaussian's
    divided by ``|da/du| = prod_i (1 - tanh(u_i)^2)``, so::

        log pi(a|s) = sum_i [ log N(u_i; mean_i, std_i) - log(1 - tanh(u_i)^2) ]

    with ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``, exact and finite for
    every ``u`` (``1 - tanh(u)^2`` rounds to 0 for ``|u| > 9`` in float32).
    """
    z = (u - mean) * jnp.exp(-log_std)
    gaussian = -0.5 * z**2 - log_std - 0.5 * math.log(2.0 * math.pi)
    log_det = 2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u))
    return (gaussian - log_det).sum(-1)


def sample_action(actor: MLP, obs: Array, key: Array) -> tuple[Array, Array]:
    """A reparameterised sample ``a = tanh(mean + std eps)``, ``eps ~ N(0, 1)``, and its
    ``log pi(a|s)``: ``obs [..., O] -> (action [..., A] in (-1, 1), log_prob [...])``."""
    mean, log_std = actor_distribution(actor, obs)
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    return jnp.tanh(u), tanh_gaussian_log_prob(u, mean, log_std)


def deterministic_action(actor: MLP, obs: Array) -> Array:
    """The evaluation action ``tanh(mean)``: ``obs [..., O] -> [..., A]``."""
    return jnp.tanh(actor_distribution(actor, obs)[0])


# ---------------------------------------------------------------------------------------
# The maths: pure functions, one per equation of the lesson
# ---------------------------------------------------------------------------------------


def soft_bellman_target(
    reward: Array, done: Array, q1_next: Array, q2_next: Array, logp_next: Array, alpha: Array | float, gamma: float
) -> Array:
    r"""The critics' regression target (eq. 06.2), all arguments ``[B]`` (``alpha``, ``gamma`` scalars)::

        y = r + gamma (1 - d) (min(Q_1', Q_2') - alpha log pi(a'|s'))  (06.2)

    ``Q_j' = Q_target_j(s', a')`` with ``a' ~ pi(.|s')`` sampled from the *current* actor
    and ``logp_next = log pi(a'|s')``. Pass ``done = terminated`` (bool or 0/1): a truncated
    transition (time limit) still bootstraps, from ``s' = info["final_obs"]``. The twin
    minimum counters the overestimation a maximised noisy critic builds up (TD3's clipped
    double Q, Fujimoto et al. 2018); the entropy bonus belongs to the value of ``s'``, so it
    is discounted and masked with it.
    """
    reward = jnp.asarray(reward)
    soft_value = jnp.minimum(q1_next, q2_next) - alpha * logp_next
    return reward + gamma * (1.0 - jnp.asarray(done, reward.dtype)) * soft_value


def critic_loss(q1: Array, q2: Array, target: Array, weights: Array | None = None) -> Array:
    r"""The twin critics' loss (eq. 06.3): the squared soft TD error, averaged over the batch
    ``B`` and both critics, ``[B] -> []``::

        L_Q = 1/(2|B|) sum_B w [(Q_1(s,a) - y)^2 + (Q_2(s,a) - y)^2]  (06.3)

    ``weights`` ``w`` are prioritized replay's importance weights (eq. 06.8; all 1 when
    ``None``); ``target`` ``y`` (eq. 06.2) carries no gradient (it is stopped here).
    """
    y = jax.lax.stop_gradient(target)
    w = jnp.ones_like(y) if weights is None else weights
    return 0.5 * ((w * (q1 - y) ** 2).mean() + (w * (q2 - y) ** 2).mean())


def policy_loss(logp: Array, q1: Array, q2: Array, alpha: Array | float) -> Array:
    r"""The actor's loss (eq. 06.4), ``[B] -> []``, with ``a~ ~ pi(.|s)`` reparameterised
    (``a~ = tanh(mean + std eps)``), so the gradient flows through ``a~`` into both
    ``log pi`` and the critics' values (the critics' own parameters are not trained here)::

        L_pi = 1/|B| sum_B (alpha log pi(a~|s) - min_i Q_i(s, a~))  (06.4)
    """
    return (alpha * logp - jnp.minimum(q1, q2)).mean()


def temperature_loss(log_alpha: Array, logp: Array, target_entropy: float) -> Array:
    r"""The temperature's loss (eq. 06.5), ``[B] -> []``, with ``log pi`` stopped and
    ``H_bar`` = ``target_entropy``::

        L_alpha = 1/|B| sum_B -log alpha (log pi(a~|s) + H_bar)  (06.5)

    Its gradient ``-mean(log pi + H_bar)`` is negative when the policy's entropy ``-E[log pi]``
    is below the target, so gradient descent raises alpha (more exploration), and lowers it
    when the entropy is above the target. SAC learns ``log alpha`` (always positive alpha).
    """
    return (-log_alpha * (jax.lax.stop_gradient(logp) + target_entropy)).mean()


def polyak_update(target: Params, online: Params, tau: float) -> Params:
    r"""Move the target parameters ``theta_bar`` a fraction ``tau`` towards the online ones
    ``theta`` (eq. 06.6), leaf by leaf of two pytrees of the same structure::

        theta_bar_j <- tau theta_j + (1 - tau) theta_bar_j  (06.6)

    After ``n`` updates towards a fixed online network the gap has shrunk by ``(1 - tau)^n``.
    """
    return jax.tree.map(lambda t, o: tau * o + (1.0 - tau) * t, target, online)


# ---------------------------------------------------------------------------------------
# One gradient update: critics, then actor and temperature, then the targets
# ---------------------------------------------------------------------------------------


class Transition(NamedTuple):
    """One stored transition (``[B, ...]`` when batched); ``next_obs`` is ``info["final_obs"]``."""

    obs: Array
    action: Array
    reward: Array
    terminated: Array
    next_obs: Array


class Learner(NamedTuple):
    """The networks and their optimizer states."""

    actor: MLP
    critics: MLP
    targets: MLP
    log_alpha: Array
    actor_opt: Any
    critic_opt: Any
    alpha_opt: Any


class Optimizers(NamedTuple):
    """One Adam per parameter set (``optax.flatten``: each updates one flat vector, fewer kernels)."""

    actor: optax.GradientTransformation
    critic: optax.GradientTransformation
    alpha: optax.GradientTransformation


def make_optimizers(config: SACConfig) -> Optimizers:
    return Optimizers(
        optax.flatten(optax.adam(config.actor_lr)),
        optax.flatten(optax.adam(config.critic_lr)),
        optax.adam(config.alpha_lr),
    )


def critic_step(
    learner: Learner, batch: Transition, weights: Array, key: Array, config: SACConfig, opt: Optimizers
) -> tuple[Learner, Array, dict[str, Array]]:
    """One Adam step of both critics on eq. 06.3 with the target of eq. 06.2.

    Returns the new learner, ``|TD error| [B]`` (mean of the two critics: prioritized
    replay's new priorities) and metrics.
    """
    alpha = jnp.exp(learner.log_alpha)
    next_action, logp_next = sample_action(learner.actor, batch.next_obs, key)
    q_next = q_values(learner.targets, batch.next_obs, next_action)
    y = soft_bellman_target(batch.reward, batch.terminated, q_next[0], q_next[1], logp_next, alpha, config.gamma)

    def loss_fn(critics: MLP) -> tuple[Array, Array]:
        q = q_values(critics, batch.obs, batch.action)
        return critic_loss(q[0], q[1], y, weights), q

    (loss, q), grads = jax.value_and_grad(loss_fn, has_aux=True)(learner.critics)
    updates, critic_opt = opt.critic.update(grads, learner.critic_opt)
    critics = optax.apply_updates(learner.critics, updates)
    td = jnp.abs(q - y[None]).mean(0)
    metrics = {"losses/critic": loss, "losses/q_mean": q.mean()}
    return learner._replace(critics=critics, critic_opt=critic_opt), td, metrics


def actor_and_temperature_step(
    learner: Learner, obs: Array, key: Array, config: SACConfig, opt: Optimizers
) -> tuple[Learner, dict[str, Array]]:
    """One Adam step of the actor (eq. 06.4, the critics fixed) and of log alpha (eq. 06.5)."""
    alpha = jnp.exp(learner.log_alpha)

    def loss_fn(actor: MLP) -> tuple[Array, Array]:
        action, logp = sample_action(actor, obs, key)
        q = q_values(learner.critics, obs, action)
        return policy_loss(logp, q[0], q[1], alpha), logp

    (loss, logp), grads = jax.value_and_grad(loss_fn, has_aux=True)(learner.actor)
    updates, actor_opt = opt.actor.update(grads, learner.actor_opt)
    actor = optax.apply_updates(learner.actor, updates)

    t_loss, t_grad = jax.value_and_grad(temperature_loss)(learner.log_alpha, logp, config.target_entropy)
    t_updates, alpha_opt = opt.alpha.update(t_grad, learner.alpha_opt)
    log_alpha = optax.apply_updates(learner.log_alpha, t_updates)
    metrics = {
        "losses/actor": loss,
        "losses/temperature": t_loss,
        "losses/alpha": alpha,
        "losses/entropy": -logp.mean(),
    }
    return learner._replace(actor=actor, actor_opt=actor_opt, log_alpha=log_alpha, alpha_opt=alpha_opt), metrics


def sac_update(
    learner: Learner, batch: Transition, weights: Array, key: Array, config: SACConfig, opt: Optimizers
) -> tuple[Learner, Array, dict[str, Array]]:
    """One SAC gradient update on one batch: critics, then actor and temperature, then the
    Polyak step of the targets (eqs. 06.2-06.6). Returns the learner, ``|TD error| [B]`` and metrics."""
    k_critic, k_actor = jax.random.split(key)
    learner, td, critic_metrics = critic_step(learner, batch, weights, k_critic, config, opt)
    learner, actor_metrics = actor_and_temperature_step(learner, batch.obs, k_actor, config, opt)
    learner = learner._replace(targets=polyak_update(learner.targets, learner.critics, config.tau))
    return learner, td, critic_metrics | actor_metrics


# ---------------------------------------------------------------------------------------
# Replay: uniform or prioritized behind one pair of functions
# ---------------------------------------------------------------------------------------


def buffer_init(config: SACConfig, example: Transition) -> Any:
    """An empty on-device buffer of ``buffer_capacity`` transitions shaped like ``example``."""
    if config.prioritized:
        return replay.per_init(example, config.buffer_capacity, config.per_alpha)
    return replay.uniform_init(example, config.buffer_capacity)


def buffer_add(config: SACConfig, buffer: Any, items: Transition) -> Any:
    """Append ``items`` (``[num_envs, ...]``); prioritized: at the highest priority seen."""
    return replay.per_add(buffer, items) if config.prioritized else replay.uniform_add(buffer, items)


def buffer_sample(config: SACConfig, buffer: Any, key: Array) -> tuple[Transition, Array, Array]:
    """``(batch [batch_size, ...], indices [batch_size], importance weights [batch_size])``;
    uniform replay: indices -1 (unused) and weights 1."""
    if config.prioritized:
        return replay.per_sample(buffer, key, config.batch_size, config.per_beta)
    batch = replay.uniform_sample(buffer, key, config.batch_size)
    return batch, jnp.full((config.batch_size,), -1, jnp.int32), jnp.ones((config.batch_size,), jnp.float32)


def get_priorities(config: SACConfig, buffer: Any) -> Any:
    """What of the buffer the updates change: nothing for uniform replay (``None``), the
    sum-tree and the largest priority for prioritized replay. The stored items are read only,
    so they stay out of the learning loop's carry (XLA never copies them)."""
    return (buffer.tree, buffer.max_priority) if config.prioritized else None


def set_priorities(config: SACConfig, buffer: Any, priorities: Any) -> Any:
    """``buffer`` with the priorities of :func:`get_priorities` put back."""
    if not config.prioritized:
        return buffer
    return dataclasses.replace(buffer, tree=priorities[0], max_priority=priorities[1])


def learn_step(
    config: SACConfig, opt: Optimizers, buffer: Any, carry: tuple[Learner, Any], key: Array
) -> tuple[tuple[Learner, Any], dict[str, Array]]:
    """Sample a batch from ``buffer``, one :func:`sac_update`; prioritized: the sampled items'
    priorities become ``|TD| + per_eps``. ``carry``: the learner and :func:`get_priorities`."""
    learner, priorities = carry
    buffer = set_priorities(config, buffer, priorities)
    k_sample, k_update = jax.random.split(key)
    batch, indices, weights = buffer_sample(config, buffer, k_sample)
    learner, td, metrics = sac_update(learner, batch, weights, k_update, config, opt)
    if config.prioritized:
        buffer = replay.per_update(buffer, indices, td + config.per_eps)
    return (learner, get_priorities(config, buffer)), metrics


def learn_updates(
    config: SACConfig, opt: Optimizers, buffer: Any, learner: Learner, priorities: Any, key: Array
) -> tuple[Learner, Any, dict[str, Array]]:
    """``updates_per_step`` :func:`learn_step` in a ``lax.scan``; metrics averaged over them."""
    step = functools.partial(learn_step, config, opt, buffer)
    (learner, priorities), metrics = jax.lax.scan(
        step, (learner, priorities), jax.random.split(key, config.updates_per_step)
    )
    return learner, priorities, {k: v.mean() for k, v in metrics.items()}


def skip_updates(learner: Learner, priorities: Any, key: Array) -> tuple[Learner, Any, dict[str, Array]]:
    """The warm-up's stand-in for :func:`learn_updates`: nothing changes, metrics are NaN."""
    return learner, priorities, {k: jnp.float32(jnp.nan) for k in LEARN_METRICS}


#: The metrics of one :func:`sac_update`.
LEARN_METRICS = (
    "losses/critic",
    "losses/q_mean",
    "losses/actor",
    "losses/temperature",
    "losses/alpha",
    "losses/entropy",
)


# ---------------------------------------------------------------------------------------
# Acting: the vectorised env, episode statistics at episode ends
# ---------------------------------------------------------------------------------------


class EnvCarry(NamedTuple):
    """The envs between steps (``[num_envs]`` leading axes)."""

    state: Any
    obs: Array
    episode_return: Array


class TrainState(NamedTuple):
    """Everything a run carries from one chunk to the next; ``env_steps`` counts all envs' steps."""

    learner: Learner
    buffer: Any
    env: EnvCarry
    key: Array
    env_steps: Array


#: Sums over the episodes that ended, per step; :func:`chunk_metrics` turns them into rates.
EPISODE_SUMS = ("episodes", "return", "success", "collision", "offroad", "progress_ratio")


def episode_end_sums(
    env: ContinuousEnv, env_params: Any, done: Array, episode_return: Array, info: dict[str, Array]
) -> dict[str, Array]:
    """Sums over the envs whose episode ended at this step (``done [B]``) of what the
    lesson reports: count, return, success (V-Max's accuracy, ``env.episode_success``),
    collision, off-road and progress ratio (``info``'s, read on the pre-reset state)."""
    success = env.episode_success(info["collision"], info["offroad"], info["progress_ratio"], env_params)
    values = {
        "episodes": jnp.ones_like(episode_return),
        "return": episode_return,
        "success": success.astype(jnp.float32),
        "collision": info["collision"].astype(jnp.float32),
        "offroad": info["offroad"].astype(jnp.float32),
        "progress_ratio": info["progress_ratio"].astype(jnp.float32),
    }
    return {k: jnp.where(done, v, 0.0).sum() for k, v in values.items()}


def env_step(
    env: ContinuousEnv, env_params: Any, reward_scale: float, carry: EnvCarry, action: Array, key: Array
) -> tuple[EnvCarry, Transition, dict[str, Array]]:
    """Step every env with ``action [B, A]`` (auto-reset): the new carry, the transitions to
    store (reward scaled, ``terminated``, ``next_obs = final_obs``) and the episode-end sums."""
    keys = jax.random.split(key, carry.obs.shape[0])
    obs, state, reward, terminated, truncated, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
        keys, carry.state, action, env_params
    )
    done = terminated | truncated
    ep_return = carry.episode_return + reward
    sums = episode_end_sums(env, env_params, done, ep_return, info)
    transition = Transition(carry.obs, action, reward_scale * reward, terminated, info["final_obs"])
    return EnvCarry(state, obs, jnp.where(done, 0.0, ep_return)), transition, sums


def chunk_metrics(sums: dict[str, Array], learn: dict[str, Array], env_steps: Array) -> dict[str, Array]:
    """One chunk's metrics (:data:`METRICS`): episode rates over the episodes that ended in the
    chunk (NaN if none ended), the learner's metrics averaged over its updates (NaN in the warm-up)."""
    total = {k: v.sum() for k, v in sums.items()}
    n = total["episodes"]
    rate = {
        "charts/episode_return": "return",
        "charts/accuracy": "success",
        "charts/collision_rate": "collision",
        "charts/offroad_rate": "offroad",
        "charts/progress_ratio": "progress_ratio",
    }
    out = {name: jnp.where(n > 0, total[k] / jnp.maximum(n, 1.0), jnp.nan) for name, k in rate.items()}
    out["charts/episodes"] = n
    out["charts/env_steps"] = env_steps
    return out | {k: jnp.nanmean(v) for k, v in learn.items()}


#: What each metric of a chunk means (CleanRL-style glossary).
METRICS = {
    "charts/env_steps": "env steps taken so far, all envs, warm-up included (at the chunk's end)",
    "charts/episodes": "episodes that ended in the chunk",
    "charts/episode_return": "mean undiscounted return of those episodes (unscaled reward)",
    "charts/accuracy": "share of those episodes that succeeded (env.episode_success: V-Max's accuracy)",
    "charts/collision_rate": "share of those episodes that ended in a collision",
    "charts/offroad_rate": "share of those episodes that ended off the road",
    "charts/progress_ratio": "mean progress ratio at those episodes' ends",
    "losses/critic": "critic loss (06.3), mean over the chunk's updates",
    "losses/q_mean": "mean Q(s, a) of the sampled batches (both critics)",
    "losses/actor": "policy loss (06.4)",
    "losses/temperature": "temperature loss (06.5)",
    "losses/alpha": "entropy temperature alpha",
    "losses/entropy": "policy entropy estimate -E[log pi(a~|s)] (nats)",
}


# ---------------------------------------------------------------------------------------
# make_train: init and run_chunk; make_train_fn: a whole run as one function of a key
# ---------------------------------------------------------------------------------------


class TrainResult(NamedTuple):
    """A run's final state and its metrics, one value per chunk (``[num_chunks]``, with a
    leading seed axis where the run was vmapped over seeds)."""

    state: TrainState
    metrics: dict[str, Any]


def init_learner(key: Array, config: SACConfig, obs_dim: int, action_dim: int, opt: Optimizers) -> Learner:
    """Fresh networks (targets = a copy of the critics), ``log alpha = log init_alpha``, optimizer states."""
    k_actor, k_critic = jax.random.split(key)
    actor = init_actor(k_actor, obs_dim, action_dim, config.width, config.depth)
    critics = init_critics(k_critic, obs_dim, action_dim, config.width, config.depth)
    log_alpha = jnp.asarray(math.log(config.init_alpha), jnp.float32)
    return Learner(
        actor, critics, critics, log_alpha, opt.actor.init(actor), opt.critic.init(critics), opt.alpha.init(log_alpha)
    )


def make_train(
    config: SACConfig, env: ContinuousEnv, env_params: Any
) -> tuple[Callable[[Array], TrainState], Callable[[TrainState], tuple[TrainState, dict[str, Array]]]]:
    """``(init, run_chunk)``, pure functions to ``jax.jit`` (and ``jax.vmap`` over seeds).

    ``init(key) -> TrainState``: networks, optimizers, ``num_envs`` reset envs, an empty buffer.
    ``run_chunk(state) -> (state, metrics)``: ``steps_per_chunk`` vectorised env steps, each
    followed by ``updates_per_step`` gradient updates, in one ``lax.scan`` (metrics: :func:`chunk_metrics`).
    While fewer than ``learning_starts`` env steps are taken, the actions are uniformly
    random and the updates are skipped (SAC's warm-up, in the same program as learning).
    """
    check_config(config)
    opt = make_optimizers(config)
    act_dim = env.ACTION_DIM
    step_envs = functools.partial(env_step, env, env_params, config.reward_scale)

    def init(key: Array) -> TrainState:
        key, k_learner, k_reset = jax.random.split(key, 3)
        learner = init_learner(k_learner, config, env.OBS_DIM, act_dim, opt)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, config.num_envs), env_params)
        envs = EnvCarry(state, obs, jnp.zeros(config.num_envs))
        example = Transition(obs[0], jnp.zeros(act_dim), jnp.float32(0.0), jnp.bool_(False), obs[0])
        return TrainState(learner, buffer_init(config, example), envs, key, jnp.int32(0))

    def train_step(state: TrainState, key: Array) -> tuple[TrainState, tuple[dict[str, Array], dict[str, Array]]]:
        k_act, k_random, k_env, k_learn = jax.random.split(key, 4)
        warmup = state.env_steps < config.learning_starts
        action, _ = sample_action(state.learner.actor, state.env.obs, k_act)
        random_action = jax.random.uniform(k_random, action.shape, minval=-1.0, maxval=1.0)
        envs, transition, sums = step_envs(state.env, jnp.where(warmup, random_action, action), k_env)
        buffer = buffer_add(config, state.buffer, transition)
        learn = functools.partial(learn_updates, config, opt, buffer)
        learner, priorities, learn_metrics = jax.lax.cond(
            warmup, skip_updates, learn, state.learner, get_priorities(config, buffer), k_learn
        )
        buffer = set_priorities(config, buffer, priorities)
        return TrainState(learner, buffer, envs, state.key, state.env_steps + config.num_envs), (sums, learn_metrics)

    def run_chunk(state: TrainState) -> tuple[TrainState, dict[str, Array]]:
        key, k_steps = jax.random.split(state.key)
        state, (sums, learn_metrics) = jax.lax.scan(
            train_step, state._replace(key=key), jax.random.split(k_steps, config.steps_per_chunk)
        )
        return state, chunk_metrics(sums, learn_metrics, state.env_steps)

    return init, run_chunk


def make_train_fn(config: SACConfig, env: ContinuousEnv, env_params: Any) -> Callable[[Array], TrainResult]:
    """A whole run as one pure function ``train(key) -> TrainResult``: ``init``, then every
    chunk in one ``lax.scan``. ``jax.jit(jax.vmap(train))(keys)`` runs several seeds as one
    program; for the same key it gives :func:`train`'s numbers."""
    init, run_chunk = make_train(config, env, env_params)

    def train_fn(key: Array) -> TrainResult:
        state, metrics = jax.lax.scan(lambda s, _: run_chunk(s), init(key), None, config.num_chunks)
        return TrainResult(state, metrics)

    return train_fn


def default_env(env: ContinuousEnv | None, env_params: Any) -> tuple[ContinuousEnv, Any]:
    """The lesson's driving env and its ``DEFAULT_PARAMS`` where none are given."""
    env = driving if env is None else env
    return env, getattr(env, "DEFAULT_PARAMS", None) if env_params is None else env_params


def jitted_programs(
    config: SACConfig, env: ContinuousEnv, env_params: Any, vmapped: bool = False
) -> tuple[Callable[[Array], TrainState], Callable[[TrainState], tuple[TrainState, dict[str, Array]]]]:
    """``jax.jit`` of :func:`make_train`'s ``(init, run_chunk)`` (``run_chunk`` donates the
    state), vmapped over seeds if ``vmapped``; kept per (config, env, env_params), so runs of
    the same shape (:func:`train`, :func:`course_lib.offpolicy.sweep.scaling_sweep`) compile once.
    ``total_env_steps`` only tells the driver how many chunks to run: it is left out of the key.
    """
    one_chunk = dataclasses.replace(config, total_env_steps=config.steps_per_chunk_env)
    return _jitted_programs(one_chunk, env, env_params, vmapped)


@functools.lru_cache(maxsize=16)
def _jitted_programs(
    config: SACConfig, env: ContinuousEnv, env_params: Any, vmapped: bool
) -> tuple[Callable[[Array], TrainState], Callable[[TrainState], tuple[TrainState, dict[str, Array]]]]:
    init, run_chunk = make_train(config, env, env_params)
    if vmapped:
        init, run_chunk = jax.vmap(init), jax.vmap(run_chunk)
    return jax.jit(init), jax.jit(run_chunk, donate_argnums=0)


#: How :func:`train` runs several seeds: one vmapped program, or the single-seed program
#: once per seed, one thread per seed (the calls run side by side on the CPU cores).
SEED_MODES = ("vmap", "threads")


def train(
    config: SACConfig,
    key: Array,
    progress: bool = True,
    env: ContinuousEnv | None = None,
    env_params: Any = None,
    seeds: str | None = None,
) -> TrainResult:
    """The driver a lesson runs: jitted ``init``, then jitted ``run_chunk`` ``num_chunks`` times
    with a progress bar (:func:`course_lib.progress`) between chunks.

    ``key`` is one key (one run) or a ``[S]`` array of keys (``jax.random.split(key, S)``),
    for ``S`` seeds; every array of the result then has a leading ``[S]`` axis. ``seeds``
    says how they run (:data:`SEED_MODES`; default: ``"threads"`` on a CPU, ``"vmap"`` on an
    accelerator): ``"vmap"``, one vmapped program (the GPU's way); ``"threads"``, the
    one-seed program once per seed, each seed in its own thread between the bar's ticks.
    On 2 CPU cores the threads are faster (``bench/bench_sac.py``: 1.7-1.8x the seeds one
    after another, against 0.65-0.7x for the vmapped program with prioritized replay, whose
    sum-tree scatters batch badly, and 1.05-1.3x with uniform replay, whose small products
    already keep a core busy). With threads, seed ``i`` of the result is bit for bit the
    one-seed run of ``key[i]``. ``env`` defaults to :mod:`course_lib.envs.driving` and
    ``env_params`` to its ``DEFAULT_PARAMS``.

    Returns:
        :class:`TrainResult` with numpy metrics ``[num_chunks]`` (``[S, num_chunks]``).
    """
    seeds = seeds or ("threads" if jax.default_backend() == "cpu" else "vmap")
    if seeds not in SEED_MODES:
        raise ValueError(f"seeds must be one of {SEED_MODES}, got {seeds!r}")
    env, env_params = default_env(env, env_params)
    init_jit, chunk_jit = jitted_programs(config, env, env_params, vmapped=key.ndim == 1 and seeds == "vmap")
    per_seed = key.ndim == 1 and seeds == "threads"
    states = [init_jit(k) for k in key] if per_seed else [init_jit(key)]
    history: list[list[dict[str, np.ndarray]]] = [[] for _ in states]

    def one_chunk(state: TrainState) -> tuple[TrainState, dict[str, np.ndarray]]:
        state, metrics = chunk_jit(state)
        return state, jax.device_get(metrics)  # blocks this thread until the chunk is done

    with chunk_progress(progress, config.num_chunks) as bar, ThreadPoolExecutor(len(states)) as pool:
        for _ in range(config.num_chunks):
            results = list(pool.map(one_chunk, states))
            states = [state for state, _ in results]
            for h, (_, m) in zip(history, results):
                h.append(m)
            bar.update(1)
    runs = [{k: np.stack([m[k] for m in h], axis=-1) for k in h[0]} for h in history]
    if not per_seed:
        return TrainResult(states[0], runs[0])
    stack = functools.partial(jax.tree.map, lambda *xs: jnp.stack(xs))
    return TrainResult(stack(*states), {k: np.stack([r[k] for r in runs]) for k in runs[0]})


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def chunk_progress(show: bool, total: int, desc: str = "SAC chunks") -> Any:
    """:func:`course_lib.progress` over ``total`` chunks, or a bar that shows nothing."""
    if not show:
        return _NoBar()
    from course_lib import progress

    return progress(total, desc, unit="chunk")


# ---------------------------------------------------------------------------------------
# Evaluation: accuracy, collision, off-road, progress over whole episodes
# ---------------------------------------------------------------------------------------


class EvalResult(NamedTuple):
    """Means over ``num_episodes`` whole episodes: V-Max's accuracy (``episode_success``), the
    collision and off-road rates, the progress ratio and the undiscounted return at each
    episode's end (``[S]`` arrays for actors with a seed axis)."""

    accuracy: Array
    collision_rate: Array
    offroad_rate: Array
    progress_ratio: Array
    episode_return: Array


#: The policies :func:`run_evaluation` knows by name: the actor's mean action (``tanh(mean)``),
#: a sample of the actor, uniform random actions, the driving env's hand-written controller.
POLICIES = ("actor", "actor_sampled", "random", "heuristic")

#: A policy by name (:data:`POLICIES`), or a function ``(key, obs [N, O], env_params) -> [N, A]``.
PolicySpec = str | Callable[[Array, Array, Any], Array]


def group_actions(
    policies: tuple[PolicySpec, ...], actors: MLP | None, key: Array, obs: Array, env_params: Any, action_dim: int
) -> Array:
    """Actions ``[G, N, A]`` for ``obs [G, N, O]``: one group of ``N`` envs per policy in
    ``policies`` (:data:`PolicySpec`), in that order; ``"actor"`` and ``"actor_sampled"``
    take one group per actor of ``actors`` (leading seed axis ``[S]``)."""
    out, g = [], 0
    for name in policies:
        if callable(name):
            out.append(name(jax.random.fold_in(key, g), obs[g], env_params)[None])
            g += 1
        elif name in ("actor", "actor_sampled"):
            assert actors is not None
            n_seeds = jax.tree.leaves(actors)[0].shape[0]
            o = obs[g : g + n_seeds]
            if name == "actor":
                out.append(jax.vmap(deterministic_action)(actors, o))
            else:
                keys = jax.random.split(jax.random.fold_in(key, g), n_seeds)
                out.append(jax.vmap(lambda p, x, k: sample_action(p, x, k)[0])(actors, o, keys))
            g += n_seeds
        elif name == "random":
            out.append(
                jax.random.uniform(
                    jax.random.fold_in(key, g), obs[g : g + 1].shape[:-1] + (action_dim,), minval=-1.0, maxval=1.0
                )
            )
            g += 1
        elif name == "heuristic":
            out.append(jax.vmap(driving.heuristic_policy, in_axes=(0, None))(obs[g], env_params)[None])
            g += 1
        else:
            raise ValueError(f"unknown policy {name!r}; known: {POLICIES}")
    return jnp.concatenate(out)


def run_evaluation(
    policies: tuple[PolicySpec, ...],
    actors: MLP | None,
    key: Array,
    env_params: Any,
    num_episodes: int,
    env: ContinuousEnv,
    max_steps: int = 10_000,
) -> EvalResult:
    """Evaluate every policy of :func:`group_actions` on the **same** ``num_episodes``
    episodes (the same reset keys for every group), all in one batch of ``G x N`` envs.

    The envs step side by side (a ``lax.while_loop``) until each has finished one episode,
    at most ``max_steps`` steps; each episode's metrics are read at its end (the step's
    ``info``, on the pre-reset state). Returns :class:`EvalResult` of ``[G]`` means. Pure:
    jit it with ``policies``, ``num_episodes``, ``env`` and ``max_steps`` static.
    """
    n_seeds = jax.tree.leaves(actors)[0].shape[0] if actors is not None else 0
    n_groups = sum(n_seeds if p in ("actor", "actor_sampled") else 1 for p in policies)
    k_reset, k_loop = jax.random.split(key)
    reset_keys = jnp.broadcast_to(jax.random.split(k_reset, num_episodes), (n_groups, num_episodes))
    reset = jax.vmap(jax.vmap(env.reset, in_axes=(0, None)), in_axes=(0, None))
    step = jax.vmap(jax.vmap(env.step, in_axes=(0, 0, 0, None)), in_axes=(0, 0, 0, None))
    obs, state = reset(reset_keys, env_params)
    zeros = jnp.zeros((n_groups, num_episodes))
    carry0 = (obs, state, zeros, zeros.astype(bool), {k: zeros for k in EPISODE_SUMS}, k_loop, jnp.int32(0))

    def not_finished(carry: tuple[Any, ...]) -> Array:
        return (~carry[3].all()) & (carry[6] < max_steps)

    def body(carry: tuple[Any, ...]) -> tuple[Any, ...]:
        obs, state, ep_return, finished, record, key, t = carry
        key, k_act, k_env = jax.random.split(key, 3)
        action = group_actions(policies, actors, k_act, obs, env_params, env.ACTION_DIM)
        env_keys = jax.random.split(k_env, (n_groups, num_episodes))
        obs, state, reward, term, trunc, info = step(env_keys, state, action, env_params)
        ep_return = ep_return + reward
        first_end = (term | trunc) & ~finished
        values = {
            "episodes": jnp.ones_like(ep_return),
            "return": ep_return,
            "success": env.episode_success(info["collision"], info["offroad"], info["progress_ratio"], env_params),
            "collision": info["collision"],
            "offroad": info["offroad"],
            "progress_ratio": info["progress_ratio"],
        }
        record = {k: jnp.where(first_end, values[k].astype(jnp.float32), record[k]) for k in record}
        return obs, state, ep_return, finished | first_end, record, key, t + 1

    record = jax.lax.while_loop(not_finished, body, carry0)[4]
    n = jnp.maximum(record["episodes"].sum(-1), 1.0)
    mean = {k: v.sum(-1) / n for k, v in record.items()}
    return EvalResult(mean["success"], mean["collision"], mean["offroad"], mean["progress_ratio"], mean["return"])


#: :func:`run_evaluation`, jitted.
evaluate_policies = jax.jit(run_evaluation, static_argnames=("policies", "num_episodes", "env", "max_steps"))


def _take(result: EvalResult, start: int, stop: int | None = None) -> EvalResult:
    """Groups ``start:stop`` of a result (``stop`` None: the one group ``start``, no axis)."""
    if stop is None:
        return EvalResult(*(x[start] for x in result))
    return EvalResult(*(x[start:stop] for x in result))


def evaluate(
    actor_params: MLP,
    key: Array,
    env_params: Any = None,
    num_episodes: int = 256,
    deterministic: bool = True,
    env: ContinuousEnv | None = None,
) -> EvalResult:
    """Accuracy, collision rate, off-road rate, mean progress ratio and mean return of the
    actor over ``num_episodes`` episodes (deterministic: ``tanh(mean)``; else sampled).

    ``actor_params`` is one actor, or actors with a leading seed axis (a run over ``[S]``
    keys: ``result.state.learner.actor``); then each is evaluated on the same episodes
    and every rate is ``[S]``. One compiled program evaluates one actor; several actors of
    the same shape are calls of it, one thread each (on a CPU this beats compiling a
    program per number of actors). ``env`` defaults to the driving env, ``env_params`` to
    its ``DEFAULT_PARAMS``.
    """
    env, env_params = default_env(env, env_params)
    policy = "actor" if deterministic else "actor_sampled"

    def one(actor: MLP) -> EvalResult:
        one_group = jax.tree.map(lambda x: x[None], actor)
        return _take(jax.device_get(evaluate_policies((policy,), one_group, key, env_params, num_episodes, env)), 0)

    if actor_params[0]["w"].ndim == 2:
        return one(actor_params)
    n_actors = actor_params[0]["w"].shape[0]
    with ThreadPoolExecutor(n_actors) as pool:
        results = list(pool.map(one, [jax.tree.map(lambda x, i=i: x[i], actor_params) for i in range(n_actors)]))
    return EvalResult(*(jnp.stack(xs) for xs in zip(*results)))


def evaluate_random(
    key: Array, env_params: Any = None, num_episodes: int = 256, env: ContinuousEnv | None = None
) -> EvalResult:
    """:func:`evaluate`'s rates for uniformly random actions (the same episodes for the same key)."""
    env, env_params = default_env(env, env_params)
    return _take(evaluate_policies(("random",), None, key, env_params, num_episodes, env), 0)


def compare_policies(
    actor_params: MLP, key: Array, env_params: Any = None, num_episodes: int = 256
) -> dict[str, EvalResult]:
    """SAC's actors (deterministic), uniform random actions and the heuristic controller on
    the driving env, all on the same ``num_episodes`` episodes, in one compiled program.

    Returns ``{"random": ..., "heuristic": ..., "sac": ...}``; ``"sac"`` has a ``[S]`` axis
    when ``actor_params`` does (a run over ``[S]`` keys).
    """
    env_params = driving.DEFAULT_PARAMS if env_params is None else env_params
    stacked = actor_params[0]["w"].ndim == 3
    actors = actor_params if stacked else jax.tree.map(lambda x: x[None], actor_params)
    result = evaluate_policies(("random", "heuristic", "actor"), actors, key, env_params, num_episodes, driving)
    return {
        "random": _take(result, 0),
        "heuristic": _take(result, 1),
        "sac": _take(result, 2, len(result.accuracy)) if stacked else _take(result, 2),
    }


# ---------------------------------------------------------------------------------------
# Throughput: where the time of one training step goes
# ---------------------------------------------------------------------------------------


def _time_once(fn: Callable[..., Any], prepare: Callable[[], tuple[Any, ...]]) -> float:
    """Wall-clock seconds of ``fn(*prepare())``, blocked until ready; ``prepare`` is not timed."""
    args = jax.block_until_ready(prepare())
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def compile_together(programs: list[tuple[Any, tuple[Any, ...]]]) -> None:
    """Compile jitted functions for the given arguments (arrays or ``jax.eval_shape``
    shapes), one thread each: XLA compiles on both cores at once, and the later calls find
    the executables in JAX's cache."""
    with ThreadPoolExecutor(len(programs)) as pool:
        list(pool.map(lambda p: p[0].lower(*p[1]).compile(), programs))


def time_breakdown(
    config: SACConfig, env: ContinuousEnv | None = None, env_params: Any = None, repeats: int = 5, chunks: int = 3
) -> dict[str, float]:
    """Training throughput and where one vectorised step's time goes, each part jitted and
    timed on its own in a ``lax.scan`` of ``steps_per_chunk`` repetitions (inputs passed as
    arguments, the buffer donated where it is written, so that no part pays for copying the
    buffer). ``repeats`` rounds, each timing ``chunks`` training chunks and then every part
    once, after a warm-up round; the medians over rounds.

    Returns seconds per vectorised env step (``env_step``: stepping the ``num_envs`` envs with
    random actions, auto-reset and episode sums included; ``act``: the actor's sampled
    actions; ``replay_add``), per gradient update (``replay_sample``: one batch;
    ``update``: one :func:`sac_update` on a fresh batch each time; prioritized replay only,
    ``priority_update``: the batch's new priorities written into the sum-tree), ``train_step`` (one step
    of ``run_chunk`` after the warm-up, its ``updates_per_step`` updates included; ``chunks`` chunks in a
    row, the state donated), ``env_steps_per_s`` and ``updates_per_s`` of training, and
    ``parts_sum`` (env_step + act + replay_add + updates_per_step x (replay_sample + update
    + priority_update)), to compare
    with ``train_step``. The training program is :func:`jitted_programs`' (compiled once).
    """
    env, env_params = default_env(env, env_params)
    init, chunk = jitted_programs(config, env, env_params)
    state = init(jax.random.key(0))
    for _ in range(-(-config.warmup_steps // config.steps_per_chunk)):
        state, _ = chunk(state)  # past the warm-up: every timed step learns
    parts = _part_loops(config, env, env_params, jax.tree.map(jnp.copy, state))  # a copy: chunks donate theirs
    compile_together([(run, prepare()) for run, prepare in parts.values()])
    samples: dict[str, list[float]] = {name: [] for name in ["train_step", *parts]}
    for _ in range(repeats + 1):  # interleaved, so that a change of load hits every part alike
        t0 = time.perf_counter()
        for _ in range(chunks):
            state, metrics = chunk(state)
        jax.block_until_ready(metrics)
        samples["train_step"].append((time.perf_counter() - t0) / chunks)
        for name, (run, prepare) in parts.items():
            samples[name].append(_time_once(run, prepare))
    n = config.steps_per_chunk
    out = {name: statistics.median(times[1:]) / n for name, times in samples.items()}  # the first: warm-up
    out["env_steps_per_s"] = config.num_envs / out["train_step"]
    out["updates_per_s"] = config.updates_per_step / out["train_step"]
    per_step = out["env_step"] + out["act"] + out["replay_add"]
    per_update = out["replay_sample"] + out["update"] + out.get("priority_update", 0.0)
    out["parts_sum"] = per_step + config.updates_per_step * per_update
    return out


def sampling_seconds(
    config: SACConfig, env: ContinuousEnv | None = None, env_params: Any = None, rounds: int = 3
) -> dict[str, float]:
    """Seconds to draw one batch of ``batch_size`` from a *full* buffer of
    ``buffer_capacity`` transitions, prioritized (a sum-tree descent per item, random
    priorities) and uniform (random slots), side by side: each drawn ``steps_per_chunk``
    times in a jitted ``lax.scan``, the two in turn for ``rounds`` rounds after a warm-up
    round; medians. Only replay programs are compiled (the transitions are random arrays of
    the env's shapes), so it is cheap next to :func:`time_breakdown`.

    Returns ``{"prioritized": s, "uniform": s}`` per batch.
    """
    env, env_params = default_env(env, env_params)
    cap, n = config.buffer_capacity, config.steps_per_chunk
    obs = jax.eval_shape(env.reset, jax.random.key(0), env_params)[0]
    k_data, k_prio, k_draw = jax.random.split(jax.random.key(0), 3)
    kd = jax.random.split(k_data, 3)
    items = Transition(
        jax.random.normal(kd[0], (cap, *obs.shape), obs.dtype),
        jax.random.uniform(kd[1], (cap, env.ACTION_DIM), minval=-1.0, maxval=1.0),
        jnp.zeros(cap),
        jnp.zeros(cap, bool),
        jax.random.normal(kd[2], (cap, *obs.shape), obs.dtype),
    )
    example = jax.tree.map(lambda x: x[0], items)
    buffers = {}
    for prioritized in (True, False):
        c = dataclasses.replace(config, prioritized=prioritized)
        buf = jax.jit(lambda it, c=c: buffer_add(c, buffer_init(c, example), it))(items)
        if prioritized:
            buf = jax.jit(replay.per_update)(buf, jnp.arange(cap), jax.random.uniform(k_prio, (cap,)) + config.per_eps)
        buffers["prioritized" if prioritized else "uniform"] = (c, buf)
    keys = jax.random.split(k_draw, n)

    def draws(c: SACConfig) -> Callable[[Any, Array], Array]:
        def loop(buffer: Any, keys: Array) -> Array:
            body = lambda acc, k: (acc + _total(buffer_sample(c, buffer, k)), None)  # noqa: E731
            return jax.lax.scan(body, jnp.float32(0.0), keys)[0]

        return jax.jit(loop)

    programs = {name: (draws(c), buf) for name, (c, buf) in buffers.items()}
    compile_together([(fn, (buf, keys)) for fn, buf in programs.values()])
    times: dict[str, list[float]] = {name: [] for name in programs}

    def args_of(buffer: Any) -> Callable[[], tuple[Any, ...]]:
        return lambda: (buffer, keys)

    for _ in range(rounds + 1):
        for name, (fn, buf) in programs.items():
            times[name].append(_time_once(fn, args_of(buf)))
    return {name: statistics.median(t[1:]) / n for name, t in times.items()}


def training_rates(
    configs: list[SACConfig], env: ContinuousEnv | None = None, env_params: Any = None, rounds: int = 3
) -> list[dict[str, float]]:
    """Env steps/s and gradient updates/s of the training program of each config, side by
    side: the programs compiled together (one thread each), each run past its warm-up, then
    one chunk of each in turn (A B C A B C ...: a change of load hits every config alike) for
    ``rounds`` rounds after a warm-up round; medians. For a knob such as ``updates_per_step``
    (the update-to-data ratio) or ``num_envs``.

    Returns one dict per config: ``env_steps_per_s``, ``updates_per_s``, ``utd`` (updates
    per env transition), ``step_ms`` (one vectorised step).
    """
    env, env_params = default_env(env, env_params)
    programs = [jitted_programs(c, env, env_params) for c in configs]
    shapes = [jax.eval_shape(init, jax.random.key(0)) for init, _ in programs]
    compile_together([(chunk, (shape,)) for (_, chunk), shape in zip(programs, shapes)])
    states = []
    for c, (init, chunk) in zip(configs, programs):
        state = init(jax.random.key(0))
        for _ in range(-(-c.warmup_steps // c.steps_per_chunk)):
            state, _ = chunk(state)  # past the warm-up: every timed step learns
        states.append(jax.block_until_ready(state))
    times: list[list[float]] = [[] for _ in configs]
    for _ in range(rounds + 1):
        for i, (_, chunk) in enumerate(programs):
            t0 = time.perf_counter()
            states[i], metrics = chunk(states[i])
            jax.block_until_ready(metrics)
            times[i].append(time.perf_counter() - t0)
    out = []
    for c, t in zip(configs, times):
        step = statistics.median(t[1:]) / c.steps_per_chunk  # the first round: warm-up
        out.append(
            {
                "env_steps_per_s": c.num_envs / step,
                "updates_per_s": c.updates_per_step / step,
                "utd": c.utd,
                "step_ms": step * 1e3,
            }
        )
    return out


def _total(tree: Any) -> Array:
    """A scalar that depends on every leaf, so that XLA computes (and keeps) all of them."""
    return sum((jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(tree)), jnp.float32(0.0))


def _part_loops(
    config: SACConfig, env: ContinuousEnv, env_params: Any, state: TrainState
) -> dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]]:
    """Each part of a training step as ``(run, prepare)``: ``run(*prepare())`` is a jitted
    ``lax.scan`` of ``steps_per_chunk`` repetitions on the state reached; ``prepare`` makes
    its arguments (untimed: the add loop gets a fresh copy of the buffer to donate)."""
    n = config.steps_per_chunk
    opt = make_optimizers(config)
    step_envs = functools.partial(env_step, env, env_params, config.reward_scale)
    actions = jnp.zeros((config.num_envs, env.ACTION_DIM))
    # the add loop stores a batch of transitions of the right shapes (their values do not
    # change its time): traced, not run, which would dispatch the env step op by op
    shapes = jax.eval_shape(step_envs, state.env, actions, jax.random.key(3))[1]
    transition = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    keys = jax.random.split(jax.random.key(4), n)

    def env_loop(envs: EnvCarry, keys: Array) -> Array:
        def body(c: EnvCarry, k: Array) -> tuple[EnvCarry, Array]:
            k_act, k_env = jax.random.split(k)
            a = jax.random.uniform(k_act, actions.shape, minval=-1.0, maxval=1.0)
            c, tr, sums = step_envs(c, a, k_env)
            return c, _total((tr, sums))

        return jax.lax.scan(body, envs, keys)[1].sum()

    def act_loop(actor: MLP, obs: Array, keys: Array) -> Array:
        def body(c: Array, k: Array) -> tuple[Array, None]:
            return c + _total(sample_action(actor, obs + c, k)) * 1e-9, None

        return jax.lax.scan(body, jnp.float32(0.0), keys)[0]

    def add_loop(buffer: Any, items: Transition) -> Any:
        return jax.lax.scan(lambda b, _: (buffer_add(config, b, items), None), buffer, None, n)[0]

    def sample_loop(buffer: Any, keys: Array) -> Array:
        body = lambda c, k: (c + _total(buffer_sample(config, buffer, k)), None)  # noqa: E731
        return jax.lax.scan(body, jnp.float32(0.0), keys)[0]

    def update_loop(learner: Learner, batches: tuple[Transition, Array, Array], keys: Array) -> Array:
        def body(lr: Learner, xs: tuple[tuple[Transition, Array, Array], Array]) -> tuple[Learner, None]:
            (batch, _, weights), k = xs
            return sac_update(lr, batch, weights, k, config, opt)[0], None

        return jax.lax.scan(body, learner, (batches, keys))[0].log_alpha

    def priority_loop(priorities: Any, indices: Array, td: Array) -> Any:
        # replay.per_update's two lines on (tree, max priority) only: the stored items stay
        # out of the program (closing over the buffer would bake it in as a constant)
        def body(pr: Any, xs: tuple[Array, Array]) -> tuple[Any, None]:
            (tree, top), (idx, err) = pr, xs
            p = err + config.per_eps
            return (replay.sumtree_update(tree, idx, p**config.per_alpha), jnp.maximum(top, p.max())), None

        return jax.lax.scan(body, priorities, (indices, td))[0]

    draw = jax.vmap(lambda buffer, k: buffer_sample(config, buffer, k), in_axes=(None, 0))
    batches = jax.jit(draw)(state.buffer, keys)  # a fresh batch per update (the buffer an argument, not a constant)
    td_errors = jax.random.uniform(jax.random.key(5), (n, config.batch_size))  # their values do not change its time
    parts: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
        "env_step": (jax.jit(env_loop), lambda: (state.env, keys)),
        "act": (jax.jit(act_loop), lambda: (state.learner.actor, state.env.obs, keys)),
        "replay_add": (jax.jit(add_loop, donate_argnums=0), lambda: (jax.tree.map(jnp.copy, state.buffer), transition)),
        "replay_sample": (jax.jit(sample_loop), lambda: (state.buffer, keys)),
        "update": (jax.jit(update_loop), lambda: (state.learner, batches, keys)),
    }
    if config.prioritized:  # writing the batch's new priorities into the sum-tree
        priorities = lambda: (jax.tree.map(jnp.copy, get_priorities(config, state.buffer)), batches[1], td_errors)  # noqa: E731
        parts["priority_update"] = (jax.jit(priority_loop, donate_argnums=0), priorities)
    return parts
