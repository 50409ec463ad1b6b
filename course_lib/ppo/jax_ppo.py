r"""End-to-end jitted PPO on the JAX CartPole (lesson 04), in the PureJaxRL style.

Lu et al. (2022), "Discovered Policy Optimisation" / PureJaxRL: when the environment is
a pure JAX function, acting, advantage estimation and every gradient step of a whole
training run are *one* program. :func:`make_train` returns ``train(key)``; ``jax.jit``
compiles it once, and ``jax.vmap`` runs it for many seeds (or learning rates) at once::

    train = make_train(PPOConfig())
    result = jax.jit(train)(jax.random.key(0))                          # one seed
    results = jax.jit(jax.vmap(train))(jax.random.split(key, 16))       # 16 seeds, one program

One call of ``train`` is (PPO: Schulman et al. 2017, arXiv 1707.06347; GAE: Schulman
et al. 2016, arXiv 1506.02438; equation numbers as in the lesson)::

    for update in 1..num_updates:                                   lax.scan  (update_step)
        rollout: num_steps steps of num_envs envs                    lax.scan  (collect_rollout, act_and_step)
        TD targets: y_t = r_t + gamma (1 - term_t) V'_t              (td_targets, 04.2: V' = V(final obs))
        GAE:     A_t = y_t - V_t + gamma lambda (1 - d_t) A_{t+1}    reverse lax.scan  (gae, 04.3)
        shuffle: one permutation per epoch, all by one sort           (shuffle_order, shuffled_minibatches)
        for each of update_epochs * num_minibatches minibatches:     lax.scan  (minibatch_update)
            theta <- Adam(clip_grad(grad L(theta)))                   (ppo_loss, 04.4-04.6; optax)

Nothing leaves the device until ``train`` returns: no host round trip per step, no
Python between steps. The hyperparameters are :class:`course_lib.ppo.config.PPOConfig`
(re-exported here); the classic loop with the same hyperparameters is
:mod:`course_lib.ppo.torch_ppo`.

**Importing this module sets an XLA flag** (:func:`use_reliable_xla_cpu_flags`): the one
setting the course's JAX training programs need on a CPU. See that function for why it is
set here and why that is early enough.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.flatten_util import ravel_pytree

from course_lib.envs import cartpole
from course_lib.envs.interface import auto_reset
from course_lib.ppo.config import PPOConfig

Params = dict[str, Any]

#: XLA flag that the JAX training programs of lessons 04-06 need on a CPU backend. With
#: XLA's concurrency-optimised scheduler (the default in jaxlib 0.10.2), a vmapped training
#: program of nested ``lax.scan`` loops sometimes never finishes on a 2-core machine: every
#: XLA worker thread waits for work and ``block_until_ready`` waits forever (seen with 16
#: vmapped PPO seeds; a gdb backtrace shows all pool threads idle). The default scheduler
#: order runs the same program reliably and as fast.
#:
#: Not solved by this flag (measured 2026-11-21, jaxlib 0.10.2, 2 cores): the same 16-seed
#: program split over two host devices (``--xla_force_host_platform_device_count=2``, then
#: ``jit(shard_map(vmap(train)))``, no collectives) ran 2.2x faster when it finished but hung
#: in 1 of 3 runs even with ``--xla_cpu_multi_thread_eigen=false``; one executable per device
#: from one process hung in 3 of 4. Code that needs two CPU devices must run under a timeout.
XLA_CPU_FLAGS = "--xla_cpu_enable_concurrency_optimized_scheduler=false"


def use_reliable_xla_cpu_flags() -> None:
    """Add :data:`XLA_CPU_FLAGS` to the ``XLA_FLAGS`` environment variable (idempotent).

    XLA reads ``XLA_FLAGS`` once, when JAX starts its backend: at the first computation or
    device query (``jax.devices()``, ``jax.random.key(0)``, the first jitted call), *not* at
    ``import jax``. So this takes effect when it runs before the process's first JAX
    computation, and does nothing after it.

    Where it is called, and why that is early enough: this module calls it when it is
    imported, and this module is the one entry point to the programs that hang without it
    (the vmapped nested scans of :func:`make_train`), so every process that builds them
    has set it; it is in time where the process imports this module before its first JAX
    computation, as every user here does. Lesson 04's notebook and ``bench/bench_purejaxrl.py``
    import this module at their top, before their first JAX computation; under pytest every
    test module is imported (collection) before the first test runs, and none computes at
    import. Lesson 04's exercise notebook (which the grader's kernel runs) builds no PPO
    program but calls this function in its first cell, so that kernel runs with the same
    XLA settings as the lesson. Child processes inherit the variable. Nothing else sets it:
    importing :mod:`course_lib.envs` has no side effect.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if XLA_CPU_FLAGS.split("=")[0] not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {XLA_CPU_FLAGS}".strip()


use_reliable_xla_cpu_flags()


class Transition(NamedTuple):
    """One rollout step of every env; ``[T, B]`` (``obs`` ``[T, B, 4]``) once scanned.

    ``terminated`` (the pole fell: no future reward) and ``truncated`` (the 500-step time
    limit: the state reached still has a value) are kept apart, because GAE bootstraps
    differently after each (eq. 04.2); ``episode_return`` is the return of the episode that
    ended at this step, 0 where none ended.
    """

    obs: Array
    action: Array
    log_prob: Array
    value: Array
    reward: Array
    terminated: Array
    truncated: Array
    episode_return: Array

    @property
    def done(self) -> Array:
        """True where an episode ended at this step (``terminated | truncated``)."""
        return self.terminated | self.truncated


class TrainResult(NamedTuple):
    """What ``train`` returns: the final parameters and one value per update for each metric.

    ``metrics`` keys follow CleanRL's namespaces: ``charts/episode_return`` (mean return of
    the episodes that ended in the update, NaN if none), ``charts/episodes``,
    ``losses/{total,policy,value,entropy,approx_kl,clip_frac}`` (means over the update's
    epochs and minibatches).
    """

    params: Params
    metrics: dict[str, Array]


# ---------------------------------------------------------------------------------------
# The actor-critic: two MLPs, PureJaxRL's / CleanRL's initialisation
# ---------------------------------------------------------------------------------------


def _dense_init(key: Array, n_in: int, n_out: int, scale: float) -> dict[str, Array]:
    return {
        "w": jax.nn.initializers.orthogonal(scale)(key, (n_in, n_out), jnp.float32),
        "b": jnp.zeros((n_out,), jnp.float32),
    }


def init_params(
    key: Array, obs_dim: int = cartpole.OBS_DIM, n_actions: int = cartpole.N_ACTIONS, hidden: int = 64
) -> Params:
    """Actor and critic MLPs ``obs -> 64 -> 64 -> out`` with tanh; orthogonal weights
    (gain sqrt 2 in the hidden layers, 0.01 for the logits, 1 for the value), zero biases."""
    k = jax.random.split(key, 6)
    s = float(np.sqrt(2.0))
    return {
        "actor": [
            _dense_init(k[0], obs_dim, hidden, s),
            _dense_init(k[1], hidden, hidden, s),
            _dense_init(k[2], hidden, n_actions, 0.01),
        ],
        "critic": [
            _dense_init(k[3], obs_dim, hidden, s),
            _dense_init(k[4], hidden, hidden, s),
            _dense_init(k[5], hidden, 1, 1.0),
        ],
    }


def _mlp(layers: list[dict[str, Array]], x: Array) -> Array:
    for layer in layers[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def policy_value(params: Params, obs: Array) -> tuple[Array, Array]:
    """``obs [..., 4] -> (logits [..., 2], value [...])``."""
    return _mlp(params["actor"], obs), _mlp(params["critic"], obs)[..., 0]


# ---------------------------------------------------------------------------------------
# The pieces: GAE by a reverse scan and the PPO loss
# ---------------------------------------------------------------------------------------


def td_targets(
    rewards: Array,
    values: Array,
    terminated: Array,
    truncated: Array,
    final_values: Array,
    last_value: Array,
    gamma: float,
) -> Array:
    r"""One-step TD targets of an auto-reset rollout (eq. 04.2): ``y_t = r_t + gamma (1 - term_t) V'_t``.

    ``V'_t`` is the value of the state step ``t`` reached, *before* the auto-reset put a new
    episode's first observation in its place::

        V'_t = final_values_t     where the episode ended at t (terminated or truncated)
             = values_{t+1}       otherwise (last_value at t = T - 1)

    A terminated step bootstraps from 0 (the pole fell: no future reward); a truncated one
    from ``V(final obs)`` (the time limit cut the episode, the state still has a value);
    bootstrapping from ``values_{t+1}`` there would use the *next* episode's first state.

    Args:
        rewards, values: ``[T, ...]`` time-major; ``values_t`` = V(the observation acted on at t).
        terminated, truncated: ``[T, ...]`` bool, as the env's ``step`` returned them.
        final_values: ``[T, ...]`` V(``info["final_obs"]``); only read where an episode ended.
        last_value: ``[...]`` V(the observation after the last step).
    """
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    next_values = jnp.where(terminated | truncated, final_values, next_values)
    return rewards + gamma * (1.0 - terminated.astype(values.dtype)) * next_values


def gae(
    rewards: Array,
    values: Array,
    terminated: Array,
    truncated: Array,
    final_values: Array,
    last_value: Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[Array, Array]:
    r"""Generalised advantage estimates by a reverse ``lax.scan`` (eqs. 04.2-04.3).

    With ``y_t`` the TD target of :func:`td_targets` and ``d_t = term_t | trunc_t``::

        delta_t = y_t - V_t = r_t + gamma (1 - term_t) V'_t - V_t           (04.2)
        A_t     = delta_t + gamma lambda (1 - d_t) A_{t+1},   A_T = 0          (04.3)

    The trace stops at every episode end (the next step belongs to another episode); only
    termination zeroes the bootstrap.

    Args: as :func:`td_targets`, plus ``gae_lambda``.

    Returns:
        ``(advantages [T, ...], targets [T, ...])`` with targets ``A_t + V_t``, the
        critic's regression targets.
    """
    deltas = td_targets(rewards, values, terminated, truncated, final_values, last_value, gamma) - values
    not_done = 1.0 - (terminated | truncated).astype(values.dtype)

    def backwards(next_adv: Array, x: tuple[Array, Array]) -> tuple[Array, Array]:
        delta, nd = x
        adv = delta + gamma * gae_lambda * nd * next_adv
        return adv, adv

    _, advantages = jax.lax.scan(backwards, jnp.zeros_like(last_value), (deltas, not_done), reverse=True)
    return advantages, advantages + values


def ppo_loss(
    params: Params,
    batch: Transition,
    advantages: Array,
    targets: Array,
    clip_eps: float,
    vf_coef: float,
    ent_coef: float,
    normalize: Callable[[Array], Array] | None = None,
) -> tuple[Array, dict[str, Array]]:
    r"""PPO's loss on one minibatch (eqs. 04.4-04.6), and its parts.

    ``normalize`` (default: over this minibatch, ``(A - mean A) / (std A + 1e-8)``) is how
    the advantages are normalised; lesson 05's data-parallel loss passes one that uses the
    global minibatch's statistics (:func:`course_lib.scaling.ppo_dp.dp_ppo_loss`).

    ``rho = exp(log pi(a|s) - log pi_old(a|s))``; advantages normalised over the minibatch::

        L_clip  = -mean min(rho A, clip(rho, 1 - eps, 1 + eps) A)                      (04.4)
        L_value = 0.5 mean max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2)   (04.5)
        L       = L_clip + vf_coef L_value - ent_coef mean H[pi(.|s)]                  (04.6)
    """
    logits, value = policy_value(params, batch.obs)
    logp_all = jax.nn.log_softmax(logits)
    log_prob = jnp.take_along_axis(logp_all, batch.action[..., None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()

    value_clipped = batch.value + jnp.clip(value - batch.value, -clip_eps, clip_eps)
    value_loss = 0.5 * jnp.maximum((value - targets) ** 2, (value_clipped - targets) ** 2).mean()

    log_ratio = log_prob - batch.log_prob
    ratio = jnp.exp(log_ratio)
    normalize = normalize or (lambda a: (a - a.mean()) / (a.std() + 1e-8))
    adv = normalize(advantages)
    policy_loss = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv).mean()

    total = policy_loss + vf_coef * value_loss - ent_coef * entropy
    parts = {
        "losses/total": total,
        "losses/policy": policy_loss,
        "losses/value": value_loss,
        "losses/entropy": entropy,
        "losses/approx_kl": ((ratio - 1.0) - log_ratio).mean(),
        "losses/clip_frac": (jnp.abs(ratio - 1.0) > clip_eps).mean(),
    }
    return total, parts


def shuffle_order(key: Array, n_epochs: int, n: int) -> Array:
    """``[n_epochs, n]`` int32: an independent random permutation of ``range(n)`` per epoch, by
    **one** sort.

    Each entry is a packed uint32 key: random bits above, the sample's index in the low
    ``ceil(log2 n)`` bits. Sorting the keys of every epoch at once (one batched sort)
    orders the samples randomly, and the low bits read off the permutation. Two samples
    whose random bits tie keep their index order, a bias of about ``n^2 / 2^(33 - bits)``
    pairs per epoch (~0.016 for ``n`` = 512). ``jax.random.permutation`` per epoch is a
    key split and a key-value sort of its own (one round at ``n`` = 512); one batched sort for
    every epoch was measurably cheaper in the training loop (``BENCHMARKS.md``).

    Above 65,536 samples (more than 16 index bits, e.g. 1024 envs x 128 steps) the tie bias would
    grow, so each epoch draws ``jax.random.permutation`` from its own split key instead.
    """
    bits = max(1, (n - 1).bit_length())
    if bits > 16:
        return jax.vmap(lambda k: jax.random.permutation(k, n))(jax.random.split(key, n_epochs)).astype(jnp.int32)
    index = jnp.arange(n, dtype=jnp.uint32)
    packed = (jax.random.bits(key, (n_epochs, n), jnp.uint32) << bits) | index
    return (jnp.sort(packed, axis=-1) & ((1 << bits) - 1)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------
# make_train(config) -> train(key), and the pieces of one update
# ---------------------------------------------------------------------------------------


def make_optimizer(config: PPOConfig, lr: Array | float) -> optax.GradientTransformation:
    """Global-norm gradient clipping, then Adam (eps 1e-5) with a linearly annealed rate.

    ``lr`` may be a traced array, so a learning-rate sweep is one vmapped program.
    """
    steps_per_update = config.grad_steps_per_update

    def schedule(count: Array) -> Array:
        frac = 1.0 - (count // steps_per_update) / config.num_updates
        return lr * frac

    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adam(learning_rate=schedule if config.anneal_lr else lr, eps=1e-5),
    )


class EnvCarry(NamedTuple):
    """What the rollout scan carries from one env step to the next (``[B]`` leading axes)."""

    env_state: cartpole.EnvState
    obs: Array
    episode_return: Array


class RunnerState(NamedTuple):
    """What the outer scan carries from one update to the next."""

    params: Array
    opt_state: Any
    env: EnvCarry
    key: Array


class TrainFn(Protocol):
    """What :func:`make_train` returns: a whole PPO run as a pure function of a key (and a learning rate)."""

    def __call__(self, key: Array, lr: Array | float | None = None) -> TrainResult: ...


#: The env's functions batched over ``num_envs`` (one params for all).
_reset_envs = jax.vmap(cartpole.reset, in_axes=(0, None))
_step_envs = jax.vmap(cartpole.step_env, in_axes=(None, 0, 0, None))


def check_config(config: PPOConfig) -> None:
    """Refuse a config whose rollout does not split into minibatches or that has no update."""
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"num_envs * num_steps = {config.batch_size} is not divisible by num_minibatches = {config.num_minibatches}"
        )
    if config.num_updates < 1:
        raise ValueError(
            f"total_timesteps = {config.total_timesteps} is less than one rollout ({config.batch_size} steps)"
        )


def act_and_step(
    params: Params,
    env_params: cartpole.EnvParams,
    env: EnvCarry,
    noise: tuple[Array, tuple[Array, cartpole.EnvState]],
) -> tuple[EnvCarry, tuple[Transition, Array]]:
    """One step of every env (the rollout scan's body): sample an action from the policy,
    step the envs, auto-reset the ones whose episode ended.

    ``noise`` is this step's Gumbel noise ``[B, N_ACTIONS]`` and fresh ``(obs, state)`` of a
    reset per env, drawn before the scan (:func:`collect_rollout`). Returns the new carry,
    the :class:`Transition` and the observation each env reached (``final_obs [B, 4]``,
    before the reset).
    """
    gumbel_t, fresh_t = noise
    logits, value = policy_value(params, env.obs)
    action = jnp.argmax(logits + gumbel_t, axis=-1)  # Gumbel-max: a sample of softmax(logits)
    log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
    final_obs, state, reward, terminated, truncated = _step_envs(None, env.env_state, action, env_params)
    done = terminated | truncated
    obs, state = auto_reset(done, (final_obs, state), fresh_t)
    ep_return = env.episode_return + reward
    transition = Transition(
        env.obs, action, log_prob, value, reward, terminated, truncated, jnp.where(done, ep_return, 0.0)
    )
    return EnvCarry(state, obs, jnp.where(done, 0.0, ep_return)), (transition, final_obs)


def collect_rollout(
    params: Params, env: EnvCarry, key: Array, config: PPOConfig, env_params: cartpole.EnvParams
) -> tuple[EnvCarry, tuple[Transition, Array]]:
    """``num_steps`` steps of every env with the policy ``params`` (one ``lax.scan`` of
    :func:`act_and_step`): the carry after the last step, the ``[T, B]`` transitions and
    each step's final observation ``[T, B, 4]`` (before the auto-reset)."""
    n_steps, n_envs = config.num_steps, config.num_envs
    # The rollout's randomness in two calls before the loop: on a CPU a random call
    # inside the loop body costs a small loop of its own (the threefry rounds).
    k_act, k_env = jax.random.split(key)
    gumbel = jax.random.gumbel(k_act, (n_steps, n_envs, cartpole.N_ACTIONS))
    fresh = jax.vmap(_reset_envs, in_axes=(0, None))(jax.random.split(k_env, (n_steps, n_envs)), env_params)
    step = functools.partial(act_and_step, params, env_params)
    return jax.lax.scan(step, env, (gumbel, fresh), unroll=config.unroll)


def advantages_and_targets(
    params: Params, traj: Transition, final_obs: Array, last_obs: Array, config: PPOConfig
) -> tuple[Array, Array]:
    """GAE advantages and critic targets ``[T, B]`` of a rollout (eqs. 04.2-04.3), with the
    critic ``params`` valuing the observation after the last step and every final observation."""
    _, last_value = policy_value(params, last_obs)
    # V(final obs) of every step in one batched pass (branch-free: only the steps
    # where an episode ended are read).
    _, final_values = policy_value(params, final_obs)
    return gae(
        traj.reward,
        traj.value,
        traj.terminated,
        traj.truncated,
        final_values,
        last_value,
        config.gamma,
        config.gae_lambda,
    )


def shuffled_minibatches(
    key: Array, data: tuple[Transition, Array, Array], config: PPOConfig
) -> tuple[Transition, Array, Array]:
    """Every epoch's minibatches of a rollout at once: ``[T, B]`` data flattened, shuffled
    (a permutation per epoch, :func:`shuffle_order`) by one gather, and cut into
    ``[update_epochs * num_minibatches, minibatch_size]``."""
    flat = jax.tree.map(lambda x: x.reshape((config.batch_size,) + x.shape[2:]), data)
    order = shuffle_order(key, config.update_epochs, config.batch_size).reshape(-1)
    shape = (config.grad_steps_per_update, config.minibatch_size)
    return jax.tree.map(lambda x: jnp.take(x, order, axis=0).reshape(shape + x.shape[1:]), flat)


def minibatch_update(
    config: PPOConfig,
    unravel: Callable[[Array], Params],
    optimizer: optax.GradientTransformation,
    carry: tuple[Array, Any],
    minibatch: tuple[Transition, Array, Array],
) -> tuple[tuple[Array, Any], dict[str, Array]]:
    """One gradient step on one minibatch (the learning scan's body): the PPO loss's
    gradient with respect to the flat parameters, clipped and applied by ``optimizer``."""

    def loss_fn(flat: Array, batch: Transition, adv: Array, targets: Array) -> tuple[Array, dict[str, Array]]:
        return ppo_loss(unravel(flat), batch, adv, targets, config.clip_eps, config.vf_coef, config.ent_coef)

    flat, opt_state = carry
    grads, parts = jax.grad(loss_fn, has_aux=True)(flat, *minibatch)
    updates, opt_state = optimizer.update(grads, opt_state, flat)
    return (optax.apply_updates(flat, updates), opt_state), parts


def update_metrics(traj: Transition, parts: dict[str, Array]) -> dict[str, Array]:
    """One update's metrics (:class:`TrainResult`): the loss parts averaged over its
    minibatches, the episodes that ended in its rollout and their mean return."""
    n_done = traj.done.sum()
    metrics = {k: v.mean() for k, v in parts.items()}
    metrics["charts/episodes"] = n_done
    metrics["charts/episode_return"] = jnp.where(n_done > 0, traj.episode_return.sum() / n_done, jnp.nan)
    return metrics


class UpdateFn(Protocol):
    """One PPO update as the outer ``lax.scan``'s body (what :func:`make_update_step` returns)."""

    def __call__(self, runner: RunnerState, _step: None) -> tuple[RunnerState, dict[str, Array]]: ...


def init_runner(
    config: PPOConfig,
    key: Array,
    lr: Array | float,
    env_params: cartpole.EnvParams = cartpole.DEFAULT_PARAMS,
) -> tuple[RunnerState, Callable[[Array], Params], optax.GradientTransformation]:
    """Everything a run starts from: the first :class:`RunnerState` (flat parameters,
    optimizer state, ``num_envs`` reset envs, the run's key), the ``unravel`` of the flat
    parameters and the optimizer. ``key`` is split three ways: the runner's key, the
    parameters' and the envs' resets."""
    key, k_init, k_reset = jax.random.split(key, 3)
    flat_params, unravel = ravel_pytree(init_params(k_init, hidden=config.hidden))
    optimizer = make_optimizer(config, lr)
    obs, env_state = _reset_envs(jax.random.split(k_reset, config.num_envs), env_params)
    env = EnvCarry(env_state, obs, jnp.zeros(config.num_envs))
    return RunnerState(flat_params, optimizer.init(flat_params), env, key), unravel, optimizer


def make_update_step(
    config: PPOConfig,
    unravel: Callable[[Array], Params],
    optimizer: optax.GradientTransformation,
    env_params: cartpole.EnvParams = cartpole.DEFAULT_PARAMS,
) -> UpdateFn:
    """One update, ``update_step(runner, None) -> (runner, metrics)``: a rollout, its
    advantages, every epoch's minibatch steps (the body of :func:`make_train`'s outer scan,
    and of lesson 10's checkpointed chunks, :mod:`course_lib.checkpoint.ppo_resume`)."""
    learn = functools.partial(minibatch_update, config, unravel, optimizer)

    def update_step(runner: RunnerState, _step: None) -> tuple[RunnerState, dict[str, Array]]:
        """One update: a rollout, its advantages, every epoch's minibatch steps."""
        key, k_rollout, k_shuffle = jax.random.split(runner.key, 3)
        params = unravel(runner.params)
        env, (traj, final_obs) = collect_rollout(params, runner.env, k_rollout, config, env_params)
        advantages, targets = advantages_and_targets(params, traj, final_obs, env.obs, config)
        minibatches = shuffled_minibatches(k_shuffle, (traj, advantages, targets), config)
        (flat, opt_state), parts = jax.lax.scan(learn, (runner.params, runner.opt_state), minibatches)
        return RunnerState(flat, opt_state, env, key), update_metrics(traj, parts)

    return update_step


def make_train(config: PPOConfig, env_params: cartpole.EnvParams = cartpole.DEFAULT_PARAMS) -> TrainFn:
    """The whole PPO run as one pure function ``train(key, lr=None) -> TrainResult``.

    ``lr`` (default ``config.lr``) is an argument so that ``jax.vmap`` can sweep it::

        jax.vmap(jax.vmap(train, in_axes=(0, None)), in_axes=(None, 0))(keys, lrs)  # [n_lrs, n_seeds]

    Inside, the parameters live in one flat vector (``ravel_pytree``): the optimizer then
    updates one array with a few fused kernels instead of a dozen small tensors, which
    matters on a CPU where every kernel launch costs about a microsecond. The run is
    :func:`init_runner`, then ``num_updates`` steps of :func:`make_update_step`'s body in
    one ``lax.scan``.
    """
    check_config(config)

    def train(key: Array, lr: Array | float | None = None) -> TrainResult:
        lr = config.lr if lr is None else lr
        runner, unravel, optimizer = init_runner(config, key, lr, env_params)
        update_step = make_update_step(config, unravel, optimizer, env_params)
        runner, metrics = jax.lax.scan(update_step, runner, None, config.num_updates)
        return TrainResult(unravel(runner.params), metrics)

    return train


def final_return(metrics: dict[str, Array] | dict[str, np.ndarray], last_updates: int = 10) -> np.ndarray:
    """Mean return of the episodes that ended in the last ``last_updates`` updates
    (``[...]`` over any leading seed / hyperparameter axes)."""
    ret = np.asarray(metrics["charts/episode_return"])[..., -last_updates:]
    n = np.asarray(metrics["charts/episodes"])[..., -last_updates:]
    total = np.where(n > 0, np.nan_to_num(ret) * n, 0.0).sum(-1)
    return total / np.maximum(n.sum(-1), 1)
