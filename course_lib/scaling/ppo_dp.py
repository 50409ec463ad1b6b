r"""Data-parallel PPO (lesson 05): lesson 04's training step split over devices, one answer for any device count.

Data parallelism is a sharded batch plus an all-reduce of gradients. Each of ``N``
devices runs ``num_envs / N`` of the environments, computes the PPO loss's gradient on
its share of every minibatch, and the devices average their gradients before the
(identical, replicated) Adam step (eq. 05.2)::

    g = (1/N) sum_d g_d,   g_d = grad of the mean loss over device d's M/N samples   (05.2)

Because every device holds the same parameters and applies the same averaged gradient,
they stay identical without ever being broadcast. The whole run is still *one* program:
``jax.jit(jax.shard_map(train, mesh, ...))``, with the collective inside.

**One answer for any device count.** A run on 1 device and a run on ``N`` devices with
the same seed and the same *global* batch must give the same parameters (up to float
summation order). Three things make that true here, and each is a choice a real system
has to make too:

1. *Randomness per environment, not per device.* Env ``i``'s key is
   ``fold_in(key, i)`` (:func:`env_keys`); its actions, resets and minibatch order at
   update ``u`` come from ``fold_in(env_key_i, u)``. Which device runs env ``i`` changes
   nothing. (Lesson 04's ``make_train`` draws the noise of all envs from one key; it is
   the same algorithm with a different random stream.)
2. *Minibatches stratified by environment.* Each epoch shuffles every env's ``T`` steps
   on its own and minibatch ``m`` takes slots ``[m T/M, (m+1) T/M)`` of *every* env. A
   global minibatch is then the union of the devices' local minibatches, whatever ``N``.
   (Shuffling across all ``num_envs x T`` samples, as lesson 04 does, would need every
   device's data on every device.)
3. *Global statistics by collectives.* Advantages are normalised with the global
   minibatch's mean and standard deviation, losses and metrics are averaged (``pmean``)
   or summed (``psum``) over devices.

**Few collectives.** On CPU host devices every all-reduce is a rendezvous of all devices
(tens of microseconds inside a compiled program, a few hundred called from Python:
``bench/bench_collectives.py``), and each is a point where the faster device waits for the
slower, so the count matters more than the bytes. The gradient is one flat vector (one all-reduce per minibatch step), the
advantage statistics of *every* minibatch of the update are combined by one collective
before the learning epochs (:func:`minibatch_adv_stats`), not two per minibatch step, and
the metrics are reduced by one ``psum`` after the last update (:func:`global_metrics`).
With 4 epochs x 4 minibatches that is 17 rendezvous per update instead of 50.

**The heart** is :func:`ppo_on_my_envs`, what every device runs: rollout and GAE on its
own envs, then the minibatch steps with the one gradient ``pmean`` each.
:func:`make_dp_train` only checks the config, builds the optimiser and wraps it in
``jit(shard_map(...))``.

**The check_vma trap** (GOTCHAS). ``jax.shard_map`` tracks which values vary across
devices (``check_vma=True``, the default). Then the gradient of a replicated ``P()``
parameter taken inside the map comes back *already summed* over devices (the transpose
of the implicit broadcast is a ``psum``), and a ``pmean`` on it does nothing: the step
is ``N`` times the mean gradient. :func:`make_dp_train`'s ``sync`` chooses between the
two correct spellings and the trap, so tests and the lesson can show all three:

- ``"pmean"``: ``check_vma=False``; local gradients, averaged by an explicit ``pmean``.
- ``"vma"``: ``check_vma=True``; the loss is scaled by ``1/N`` so the automatic sum is the mean.
- ``"trap"``: ``check_vma=True`` plus an explicit ``pmean``: ``N`` x the gradient (wrong).

**Initialisation outside.** The orthogonal initialisation runs a QR decomposition, a
LAPACK call that deadlocks several CPU devices (:mod:`course_lib.scaling.devices`), so the
parameters are made once on one device (:func:`init_flat_params`) and passed in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.envs import cartpole
from course_lib.ppo.jax_ppo import (
    EnvCarry,
    Params,
    PPOConfig,
    Transition,
    act_and_step,
    advantages_and_targets,
    init_params,
    make_optimizer,
    ppo_loss,
    shuffle_order,
)
from course_lib.scaling.devices import check_multidevice_safe

Sync = Literal["pmean", "vma", "trap"]
SYNCS: tuple[str, ...] = ("pmean", "vma", "trap")

_reset_envs = jax.vmap(cartpole.reset, in_axes=(0, None))


def env_keys(key: Array, num_envs: int) -> Array:
    """``[num_envs]`` keys, env ``i``'s being ``fold_in(key, i)``: any subset of envs can be
    keyed on its own (a process or device computes only the keys of the envs it runs)."""
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_envs))


def init_flat_params(key: Array, config: PPOConfig) -> Array:
    """Lesson 04's actor-critic initialisation as one flat f32 vector, computed on one device
    (it runs a QR decomposition: keep it out of multi-device programs)."""
    flat, _ = ravel_pytree(jax.jit(functools.partial(init_params, hidden=config.hidden))(key))
    return flat


def _unravel_for(config: PPOConfig) -> Callable[[Array], Params]:
    """The flat-vector -> params function, from shapes only (no initialisation runs)."""
    shapes = jax.eval_shape(functools.partial(init_params, hidden=config.hidden), jax.random.key(0))
    _, unravel = ravel_pytree(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes))
    return unravel


def check_dp_config(config: PPOConfig, n_devices: int) -> None:
    """Refuse configs that do not split evenly over devices and minibatch slots."""
    if config.num_envs % n_devices:
        raise ValueError(
            f"num_envs = {config.num_envs} does not split over {n_devices} devices: use a multiple of {n_devices}"
        )
    if config.num_steps % config.num_minibatches:
        raise ValueError(
            f"minibatches are stratified by env: num_steps = {config.num_steps} must be divisible by "
            f"num_minibatches = {config.num_minibatches}"
        )
    if config.num_updates < 1:
        raise ValueError(
            f"total_timesteps = {config.total_timesteps} is less than one rollout ({config.batch_size} steps)"
        )


def minibatch_adv_stats(advantages: Array, axis: str) -> tuple[Array, Array]:
    """Mean and (population) standard deviation of every global minibatch's advantages, at once.

    ``advantages`` is ``[K, n_local]``: ``K`` minibatches (all epochs of an update), each
    device holding an equal share ``n_local`` of each. Returns ``([K], [K])``, identical on
    every device, from *one* collective however many minibatches there are: every device's
    local mean and sum of squared deviations ``M2`` are gathered (``all_gather``, one
    rendezvous) and combined exactly (Chan et al. 1979, the parallel variance)::

        mean = (1/N) sum_d mean_d,   M2 = sum_d M2_d + n_local sum_d (mean_d - mean)^2,   var = M2 / (N n_local)

    Two-pass on each device and no ``E[x^2] - mean^2`` cancellation, so one device gives
    exactly its own two-pass statistics.
    """
    local_mean = advantages.mean(axis=1)
    local_m2 = ((advantages - local_mean[:, None]) ** 2).sum(axis=1)
    gathered = jax.lax.all_gather(jnp.stack([local_mean, local_m2]), axis)  # [N, 2, K]: the one rendezvous
    means, m2s = gathered[:, 0], gathered[:, 1]
    mean = means.mean(axis=0)
    m2 = m2s.sum(axis=0) + advantages.shape[1] * ((means - mean) ** 2).sum(axis=0)
    return mean, jnp.sqrt(m2 / (advantages.shape[1] * gathered.shape[0]))


def dp_ppo_loss(
    params: Params,
    batch: Transition,
    advantages: Array,
    targets: Array,
    config: PPOConfig,
    adv_mean: Array,
    adv_std: Array,
) -> tuple[Array, dict[str, Array]]:
    """Lesson 04's PPO loss (eqs. 04.4-04.6) on a device's share of a minibatch, with the
    advantages normalised by the *global* minibatch's statistics ``adv_mean``, ``adv_std``
    (:func:`minibatch_adv_stats`). Returns the local mean loss (its pmean over devices is
    the global minibatch's loss) and its parts."""

    def normalize(adv: Array) -> Array:
        return (adv - adv_mean) / (adv_std + 1e-8)

    return ppo_loss(
        params, batch, advantages, targets, config.clip_eps, config.vf_coef, config.ent_coef, normalize=normalize
    )


def _env_noise(
    key: Array, config: PPOConfig, env_params: cartpole.EnvParams
) -> tuple[Array, tuple[Array, cartpole.EnvState], Array]:
    """One env's randomness for one update, from its own key: Gumbel noise ``[T, A]``, a fresh
    reset per step ``([T, 4], state[T])`` and the per-epoch order of its steps ``[E, T]``."""
    k_act, k_env, k_shuffle = jax.random.split(key, 3)
    gumbel = jax.random.gumbel(k_act, (config.num_steps, cartpole.N_ACTIONS))
    fresh = _reset_envs(jax.random.split(k_env, config.num_steps), env_params)
    order = shuffle_order(k_shuffle, config.update_epochs, config.num_steps)
    return gumbel, fresh, order


def _stratified_minibatches(data: Any, order: Array, config: PPOConfig) -> Any:
    """``[T, B_local, ...]`` data -> ``[E * M, B_local * T/M, ...]``: in epoch ``e`` minibatch ``m``
    holds slots ``order[b, e, m T/M : (m+1) T/M]`` of every local env ``b``."""
    e, m = config.update_epochs, config.num_minibatches
    per = config.num_steps // m
    # order: [B_local, E, T] -> [E, M, B_local, per]
    idx = order.reshape(order.shape[0], e, m, per).transpose(1, 2, 0, 3)
    envs = jnp.arange(order.shape[0])[None, None, :, None]

    def pick(x: Array) -> Array:
        picked = x[idx, envs]  # [E, M, B_local, per, ...]
        return picked.reshape((e * m, -1) + x.shape[2:])

    return jax.tree.map(pick, data)


def _as_varying(x: Array, axis: str) -> Array:
    """Mark ``x`` as varying over ``axis`` (check_vma bookkeeping: a scan carry must keep its type)."""
    return x if axis in jax.typeof(x).manual_axis_type.varying else jax.lax.pcast(x, (axis,), to="varying")


def _global_gradient(
    loss: Callable[[Array], tuple[Array, dict[str, Array]]], flat: Array, axis: str, sync: Sync
) -> tuple[Array, dict[str, Array]]:
    """The gradient of the global minibatch's mean loss (eq. 05.2), the same on every device,
    and this device's loss parts. With ``sync="vma"`` the map's own sum does the reduction
    (the loss is scaled by 1/N); otherwise an explicit ``pmean``. Not listed in the lesson:
    exercise 3 asks for it."""
    grads, parts = jax.grad(loss, has_aux=True)(flat)
    if sync != "vma":
        grads = jax.lax.pmean(grads, axis)
    return grads, parts


def ppo_on_my_envs(
    flat: Array,
    keys: Array,
    *,
    config: PPOConfig,
    env_params: cartpole.EnvParams,
    unravel: Callable[[Array], Params],
    optimizer: optax.GradientTransformation,
    axis: str,
    sync: Sync,
) -> tuple[Array, dict[str, Array]]:
    """What every device runs in data-parallel PPO (eq. 05.2): the whole run, on this device's envs.

    ``flat`` is the replicated flat parameter vector; ``keys`` the ``[num_envs / N]`` keys of
    *my* envs. Returns the final parameters (identical on every device) and per-update metrics.
    """
    split = jax.vmap(jax.random.split)(keys)  # per env: (its first reset, the run's stream)
    obs, env_state = _reset_envs(split[:, 0], env_params)
    loss_scale = 1.0 / jax.lax.axis_size(axis) if sync == "vma" else 1.0  # "vma": the map sums, so scale

    def minibatch_step(carry: tuple[Array, Any], minibatch: Any) -> tuple[tuple[Array, Any], dict[str, Array]]:
        flat, opt_state = carry
        batch, advantages, targets, adv_mean, adv_std = minibatch

        def my_loss(f: Array) -> tuple[Array, dict[str, Array]]:  # mean over MY share of the minibatch
            loss, parts = dp_ppo_loss(unravel(f), batch, advantages, targets, config, adv_mean, adv_std)
            return loss * loss_scale, parts

        # THE all-reduce (05.2), g = (1/N) sum_d g_d, one per minibatch step: exercise 3 writes it
        grads, parts = _global_gradient(my_loss, flat, axis, sync)
        updates, opt_state = optimizer.update(grads, opt_state, flat)  # identical on every device
        return (optax.apply_updates(flat, updates), opt_state), parts

    def update(carry: tuple[Array, Any, EnvCarry], u: Array) -> tuple[tuple[Array, Any, EnvCarry], dict[str, Array]]:
        flat, opt_state, env = carry
        params = unravel(flat)
        # 1. rollout of MY envs, each env's noise from its own key: no communication
        gumbel, fresh, order = jax.vmap(lambda k: _env_noise(jax.random.fold_in(k, u), config, env_params))(split[:, 1])
        step = functools.partial(act_and_step, params, env_params)
        env, (traj, final_obs) = jax.lax.scan(step, env, _time_major((gumbel, fresh)), unroll=config.unroll)
        # 2. GAE on MY envs: no communication
        advantages, targets = advantages_and_targets(params, traj, final_obs, env.obs, config)
        # 3. every epoch's minibatches (slots m of each of MY envs), and the advantage
        #    statistics of all of them over ALL devices: one collective per update
        minibatches = _stratified_minibatches((traj, advantages, targets), order, config)
        adv_mean, adv_std = minibatch_adv_stats(minibatches[1], axis)
        # 4. the learning epochs: one gradient all-reduce per minibatch step
        (flat, opt_state), parts = jax.lax.scan(minibatch_step, (flat, opt_state), (*minibatches, adv_mean, adv_std))
        return (flat, opt_state, env), _local_metrics(traj, parts)

    env = _vma_safe(EnvCarry(env_state, obs, jnp.zeros(keys.shape[0])), axis, sync)
    (flat, _, _), local = jax.lax.scan(update, (flat, optimizer.init(flat), env), jnp.arange(config.num_updates))
    return flat, global_metrics(local, axis)  # one all-reduce, after the run


def _time_major(tree: Any) -> Any:
    """Per-env ``[B, T, ...]`` -> the rollout scan's time-major ``[T, B, ...]``."""
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), tree)


def _vma_safe(env: EnvCarry, axis: str, sync: Sync) -> EnvCarry:
    """With ``check_vma`` on (``sync != "pmean"``), mark the env carry's per-env constants as
    varying over ``axis`` (a scan carry must keep its type); without it, ``env`` unchanged."""
    return env if sync == "pmean" else jax.tree.map(functools.partial(_as_varying, axis=axis), env)


def _local_metrics(traj: Transition, parts: dict[str, Array]) -> dict[str, Array]:
    """This device's share of one update's metrics: mean loss parts, episodes ended, their return sum."""
    local = {k: v.mean() for k, v in parts.items()}
    local["charts/episodes"] = traj.done.sum()
    local["charts/episode_return"] = traj.episode_return.sum()  # 0 where no episode ended
    return local


def global_metrics(local: dict[str, Array], axis: str) -> dict[str, Array]:
    """Every update's metrics over all devices, from one ``psum`` of them stacked ``[U, k]``:
    loss parts averaged over devices, ``charts/episodes`` the global count (int32) and
    ``charts/episode_return`` the mean return of the global episodes (NaN where none ended)."""
    names = sorted(local)
    summed = jax.lax.psum(jnp.stack([local[k].astype(jnp.float32) for k in names], axis=-1), axis)
    out = {k: summed[..., i] / jax.lax.axis_size(axis) for i, k in enumerate(names)}
    n_done = summed[..., names.index("charts/episodes")]
    out["charts/episodes"] = n_done.astype(jnp.int32)
    out["charts/episode_return"] = jnp.where(
        n_done > 0, summed[..., names.index("charts/episode_return")] / n_done, jnp.nan
    )
    return out


@functools.cache
def make_dp_train(
    config: PPOConfig,
    mesh: Mesh,
    axis: str = "data",
    sync: Sync = "pmean",
    env_params: cartpole.EnvParams = cartpole.DEFAULT_PARAMS,
) -> Callable[[Array, Array, Array], tuple[Array, dict[str, Array]]]:
    """A whole data-parallel PPO run: ``train(flat_params, env_keys, key) -> (flat_params, metrics)``.

    :func:`ppo_on_my_envs` on every device of ``mesh``'s ``axis``, as one
    ``jax.jit(jax.shard_map(...))``.

    Args:
        config: lesson 04's hyperparameters; ``num_envs`` is the *global* count, split over
            the mesh's ``axis``; ``num_steps`` must divide by ``num_minibatches``.
        mesh: the devices; ``axis`` names the data-parallel axis (other axes are unused).
        sync: how gradients are averaged (module docstring): ``"pmean"``, ``"vma"`` or
            the deliberately wrong ``"trap"``.

    The returned function is jitted, and cached per argument set (a second call with the
    same config and mesh reuses the compiled program). Its inputs: ``flat_params`` (replicated, ``P()``, from
    :func:`init_flat_params`), ``env_keys`` (``[num_envs]``, sharded ``P(axis)``, from
    :func:`env_keys`; :func:`shard_inputs` places both) and ``key`` (replicated; it seeds
    nothing per env and is kept for the signature's symmetry with lesson 04). Metrics are
    per update, identical on every device: mean losses, ``charts/episodes`` (global count)
    and ``charts/episode_return`` (mean over the global episodes, NaN if none).
    """
    if sync not in SYNCS:
        raise ValueError(f"sync must be one of {SYNCS}, got {sync!r}")
    if axis not in mesh.axis_names:
        raise ValueError(f"mesh has axes {mesh.axis_names}, not {axis!r}")
    check_dp_config(config, mesh.shape[axis])
    heart = functools.partial(
        ppo_on_my_envs,
        config=config,
        env_params=env_params,
        unravel=_unravel_for(config),
        optimizer=make_optimizer(config, config.lr),
        axis=axis,
        sync=sync,
    )

    def body(flat: Array, keys: Array, key: Array) -> tuple[Array, dict[str, Array]]:
        del key  # kept for the signature's symmetry with lesson 04's train(key)
        return heart(flat, keys)

    mapped = jax.shard_map(
        body, mesh=mesh, in_specs=(P(), P(axis), P()), out_specs=(P(), P()), check_vma=sync != "pmean"
    )
    return jax.jit(mapped)


def shard_inputs(mesh: Mesh, flat_params: Array, keys: Array, axis: str = "data") -> tuple[Array, Array]:
    """Place the inputs of :func:`make_dp_train`'s function: parameters replicated on every
    device of ``mesh`` (``P()``), env keys split along ``axis`` (``P(axis)``)."""
    return (
        jax.device_put(flat_params, NamedSharding(mesh, P())),
        jax.device_put(keys, NamedSharding(mesh, P(axis))),
    )


@functools.cache
def compiled_dp_train(config: PPOConfig, mesh: Mesh, axis: str = "data", sync: Sync = "pmean") -> Any:
    """:func:`make_dp_train`'s program compiled for ``mesh`` (cached), after
    :func:`course_lib.scaling.devices.check_multidevice_safe` has checked it holds no call that can
    deadlock several CPU devices. Call it as ``compiled(flat_params, env_keys, key)``."""
    key = jax.random.key(0)
    flat = jax.ShapeDtypeStruct((_unravel_size(config),), jnp.float32, sharding=NamedSharding(mesh, P()))
    keys = jax.ShapeDtypeStruct((config.num_envs,), key.dtype, sharding=NamedSharding(mesh, P(axis)))
    key_spec = jax.ShapeDtypeStruct((), key.dtype, sharding=NamedSharding(mesh, P()))
    return check_multidevice_safe(make_dp_train(config, mesh, axis, sync), flat, keys, key_spec)


def _unravel_size(config: PPOConfig) -> int:
    shapes = jax.eval_shape(functools.partial(init_params, hidden=config.hidden), jax.random.key(0))
    return sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))


def run_dp(
    config: PPOConfig,
    mesh: Mesh,
    seed: int = 0,
    axis: str = "data",
    sync: Sync = "pmean",
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Initialise on one device, place, train on ``mesh`` (:func:`compiled_dp_train`), and
    return the final flat parameters and metrics as numpy (blocks until the run ends; run
    it under a watchdog)."""
    key = jax.random.key(seed)
    k_init, k_envs = jax.random.split(key)
    flat, keys = shard_inputs(mesh, init_flat_params(k_init, config), env_keys(k_envs, config.num_envs), axis)
    train = compiled_dp_train(config, mesh, axis, sync)
    placed_key = jax.device_put(key, NamedSharding(mesh, P()))
    out, metrics = jax.block_until_ready(train(flat, keys, placed_key))
    return np.asarray(out), {k: np.asarray(v) for k, v in metrics.items()}


def synced_gradient(
    loss_fn: Callable[[Any, Any], Array],
    params: Any,
    batch: Any,
    mesh: Mesh,
    sync: Sync = "pmean",
    axis: str = "data",
) -> Any:
    """Eq. 05.2 on its own: the data-parallel gradient of ``loss_fn(params, batch)`` (a mean
    over the batch's leading axis) with ``batch`` split over ``mesh``'s ``axis``.

    ``"pmean"`` and ``"vma"`` return the full batch's gradient (what one device computes on
    the whole batch); ``"trap"`` returns ``N`` times it. Returns the (replicated) gradient.
    """
    if sync not in SYNCS:
        raise ValueError(f"sync must be one of {SYNCS}, got {sync!r}")
    n_dev = mesh.shape[axis]
    scale = 1.0 / n_dev if sync == "vma" else 1.0

    def body(p: Any, b: Any) -> Any:
        grads = jax.grad(lambda q: loss_fn(q, b) * scale)(p)
        return jax.lax.pmean(grads, axis) if sync in ("pmean", "trap") else grads

    mapped = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P(axis)), out_specs=P(), check_vma=sync != "pmean"))
    placed_params = jax.device_put(params, NamedSharding(mesh, P()))
    placed_batch = jax.device_put(batch, NamedSharding(mesh, P(axis)))
    return jax.block_until_ready(mapped(placed_params, placed_batch))
