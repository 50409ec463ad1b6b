r"""SAC over a device mesh, one compiled program: sharded envs and replay, averaged gradients (lesson 06).

:mod:`course_lib.offpolicy.sac` runs SAC as one jitted ``lax.scan`` on one device. Brax and
V-Max scale the same program to many accelerators by **data parallelism** over lesson 05's
1-D mesh (axis ``"data"``): every device steps its own environments, keeps its own replay
shard, samples its own part of the batch, and the devices exchange nothing but gradients,
one ``lax.pmean`` per parameter set per update. Parameters and optimizer states are
replicated: every device applies the same Adam step to the same numbers. The whole
training chunk is one ``jax.jit(jax.shard_map(...))`` program with the ``lax.scan`` inside.

**Logical shards, so that 1, 2 and 4 devices give the same parameters.** A naive split
("device ``d`` owns ``N / D`` envs and draws ``B / D`` transitions with its own key") runs
different maths on different device counts: other keys, other batches, other envs per
buffer. Here the work is cut into a fixed number ``S`` of *logical shards* (``S`` = the
largest device count the run should reproduce, e.g. 4), independent of ``D``::

    logical shard g (g = 0 .. S-1) owns:  N / S envs,  a replay buffer of C / S transitions,
                                          B / S transitions of every update's batch
    its randomness at vectorised step t:  key(t, g) = fold_in(fold_in(run_key, t), g)
    device d of D holds shards  d S/D .. (d+1) S/D - 1  and jax.vmap's over them

    per update:  g_s = grad of shard s's mean loss over its B/S transitions  (on its device)
                 g   = pmean over the S/D local shards (vmap axis "shards")
                           and over the D devices         (mesh axis "data")
                     = 1/S sum_s g_s = the gradient of the mean loss over all B transitions
                 params <- Adam(g)                                      (the same everywhere)

With equal shard sizes the mean over shards of per-shard means is the mean over the
global batch, so ``D = 1, 2, 4`` compute the same numbers and differ only in the order of
floating-point additions. Measured (2026-11, 2 CPU cores, :data:`CPU_SHARDED_CONFIG` on the
driving env, 296 updates): max |parameter difference| 3.4e-7 (2 devices) and 3.9e-7 (4)
against one device, the same episode counts in every chunk. That agreement is not forever:
RL feeds the parameters back into the data. A last-bit difference in an action can, many
updates later, end one episode differently (a collision just avoided); from then on the
runs see different data and drift apart like two seeds (measured: ~1e-6 after 496 updates,
4e-3 after 596). So compare device counts over a fixed horizon, as the test does (1e-5
after 296 updates on its small env); reproducibility on a *fixed* device count is bitwise.
The price of the design: a logical shard's buffer only holds its own envs' transitions and
each shard samples its own ``B / S`` (the batch is *stratified* by shard), with ``N / S``
envs per shard that is still many episodes per buffer.

**Where the averaging sits.** :func:`sac.critic_step` and :func:`sac.actor_and_temperature_step`
call ``opt.critic.update(grads, ...)`` (and ``opt.actor``, ``opt.alpha``) on the gradients of
the local mean loss. :func:`averaged` puts :func:`average_gradients` (an optax
transformation whose ``update`` is ``lax.pmean(grads, ("shards", "data"))``) in front of
each optimizer, so sac.py's update runs unchanged, vmapped over the local shards, and its
gradients are averaged over every shard of every device before Adam sees them. Three
all-reduces per update: the critics' gradient, then the actor's, then log alpha's (a
scalar). SAC's actor loss uses the critics *after* their step, so the first two cannot be
merged; the third could ride with the second. Episode statistics and learner metrics are
reduced once per chunk.

**The check_vma trap** (GOTCHAS; lesson 05, ``ppo_dp``). With ``check_vma=True`` (the
default) the gradient of a replicated ``P()`` parameter taken inside ``shard_map`` comes
back *already summed* over devices, and the ``pmean`` then does nothing: ``D`` times the
gradient. Adam hides a constant factor (its step is nearly scale-free), so the run still
"learns"; only an equivalence test sees it. This program uses ``check_vma=False`` with the
explicit ``pmean`` (``ppo_dp``'s ``sync="pmean"``), and ``tests/test_offpolicy_sharded.py``
checks one update with plain SGD (which does *not* hide the factor) against per-shard
steps computed with sac.py on one device, and the whole run on 1, 2 and 4 devices.

**Replay.** Uniform (ring) or prioritized (a sum-tree per logical shard, vmapped), chosen by
``config.prioritized`` exactly as in sac.py (:func:`sac.buffer_add`, :func:`sac.learn_step`).
Prioritized replay here is *per shard*: shard ``g`` draws in proportion to ``p_i^alpha``
among its own transitions, and its importance weights use its own size and batch maximum
(Ape-X-style distributed replay keeps one global distribution instead).

**CPU safety** (:mod:`course_lib.scaling.devices`, GOTCHAS). The learner and the reset envs are
made outside the sharded program on the mesh's first device (compiled once, whatever
``D``) and then placed (replicated, or split by shard); the empty buffers are zeros written
by a jitted program on each shard's own device (no LAPACK anywhere). The chunk is compiled
through :func:`check_multidevice_safe`; the drivers block on every chunk (a Python loop
dispatching collective programs back to back deadlocks fake CPU devices) under
:func:`course_lib.runtime.watchdog.watchdog`.

**The same program on real devices.** On one GPU, ``D = 1``: the single-device path, a
``vmap`` over the ``S`` logical shards. On ``D`` GPUs the same function, a larger mesh (not
run on GPUs here). On this machine's 2 CPU cores the devices share the cores, so more
devices are *slower* (:func:`measure_sharded_throughput`; measured at load 3.6: 1,268
updates/s on 1 device, 907 on 2, 659 on 4): each of the 3 all-reduces of an update is a
rendezvous of the device threads (~0.1 ms, lesson 05), 300 per chunk of 100 updates.

**Replay capacity at full scale** (:func:`replay_capacity`). A driving-env transition is
525 bytes (obs and next_obs 64 float32, action 2 float32, reward float32, terminated bool),
533 with prioritized replay's sum-tree (float32 ``[2 C]``). The full-scale learner (actor,
twin critics, targets, log alpha, Adam moments; :func:`learner_nbytes`) is 6.3 MiB: it does
not matter. With 10 % of the memory left for activations and XLA's workspace, an H100 (80
GB) holds 144 million transitions per device and an H200 (141 GB) 255 million; a
sum-tree's power-of-two capacity is 2^27 (134 million) on both (2^28 does not fit on an H200).

API: :func:`make_sharded_train` (``init``, ``run_chunk``), :func:`train_sharded` (the
driver), :func:`device_step` (the per-device heart), :func:`run_on_device_counts` and
:func:`max_param_difference` (the equivalence), :func:`measure_sharded_throughput`,
:func:`transition_nbytes`, :func:`learner_nbytes`, :func:`replay_capacity`;
:data:`CPU_SHARDED_CONFIG` / :data:`FULL_SHARDED_CONFIG` with :data:`NUM_SHARDS` /
:data:`FULL_NUM_SHARDS`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.envs import driving
from course_lib.offpolicy import sac
from course_lib.offpolicy.sac import ContinuousEnv, EnvCarry, Learner, Optimizers, SACConfig, Transition
from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.devices import check_multidevice_safe, data_mesh

#: The mesh axis the devices are split along (lesson 05's :func:`course_lib.scaling.devices.data_mesh`).
DATA = "data"
#: The ``vmap`` axis over a device's logical shards.
SHARDS = "shards"

#: Logical shards of the lesson's CPU runs: the largest device count it compares (1, 2, 4).
NUM_SHARDS = 4

#: The lesson's ``cpu`` scale for the 1/2/4-device equivalence: the driving env, 16 envs
#: (4 per logical shard), uniform replay, a 64 x 64 actor and twin critics, batches of 64
#: (16 per shard), 3 chunks of 100 vectorised steps, 4 of them warm-up: 296 updates.
#: Measured 2026-11 on 2 shared cores at load 3.5-4.3: :func:`run_on_device_counts` took
#: 59.5 s for 1, 2 and 4 devices, nearly all of it compiling the three programs (the
#: driving env's step is large; sac.py's own one-device program takes 10-25 s to compile
#: here); the 3 x 3 chunks run in under 1.5 s.
CPU_SHARDED_CONFIG = SACConfig(
    num_envs=16,
    total_env_steps=16 * 300,
    learning_starts=64,
    buffer_capacity=2**12,
    batch_size=64,
    width=64,
    depth=2,
    prioritized=False,
    steps_per_chunk=100,
)

#: Logical shards of the full scale: up to 8 GPUs reproduce one GPU's run.
FULL_NUM_SHARDS = 8

#: The ``full`` scale: sac's :data:`sac.FULL_CONFIG` (1,024 envs, batch 1,024, 2^22
#: transitions of prioritized replay, 256 x 3 networks); one GPU runs it with ``D = 1``,
#: 2, 4 or 8 GPUs with the same program. Not measured on CPU.
FULL_SHARDED_CONFIG = sac.FULL_CONFIG


# ---------------------------------------------------------------------------------------
# The state, its layout on the mesh, and the per-shard config
# ---------------------------------------------------------------------------------------


class ShardedState(NamedTuple):
    """Everything a sharded run carries between chunks, with its layout on the mesh.

    ``learner`` (replicated, ``P()``): the networks and optimizer states, the same on every
    device. ``buffers`` and ``envs`` (``P("data")``): a leading axis of the ``S`` logical
    shards (``[S, C/S, ...]`` and ``[S, N/S, ...]``), ``S/D`` of them on each device.
    ``shard_ids`` (``[S]`` int32, ``P("data")``): each shard's ``g``, which its keys fold in.
    ``key`` (replicated): the run's key, never split (the step and ``g`` are folded in).
    ``step`` (replicated int32): vectorised env steps taken so far.
    """

    learner: Learner
    buffers: Any
    envs: EnvCarry
    shard_ids: Array
    key: Array
    step: Array


#: Each field's PartitionSpec (a prefix of its pytree): the in and out specs of the chunk.
_REPLICATED: Any = P()
_SHARDED: Any = P(DATA)
STATE_SPECS = ShardedState(_REPLICATED, _SHARDED, _SHARDED, _SHARDED, _REPLICATED, _REPLICATED)


def check_sharding(config: SACConfig, num_shards: int, num_devices: int | None = None) -> None:
    """Refuse a split the program cannot make, saying how to fix it.

    ``num_envs``, ``batch_size`` and ``buffer_capacity`` must divide into ``num_shards``
    equal parts (so that the mean over shards is the global mean), ``num_shards`` into
    ``num_devices`` (each device holds the same number of shards), and JAX must have
    ``num_devices`` devices.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    for name in ("num_envs", "batch_size", "buffer_capacity", "learning_starts"):
        value = getattr(config, name)
        if value % num_shards:
            raise ValueError(
                f"{name} = {value} is not divisible by num_shards = {num_shards}: every logical shard needs "
                f"the same share (the mean over shards must be the global mean); make {name} a multiple of "
                f"{num_shards}, e.g. {max(num_shards, value // num_shards * num_shards)}"
            )
    sac.check_config(shard_config(config, num_shards))
    if num_devices is None:
        return
    if num_devices < 1 or num_shards % num_devices:
        raise ValueError(
            f"num_shards = {num_shards} is not divisible by {num_devices} devices: each device must hold the "
            f"same number of logical shards; use a device count that divides {num_shards} (or num_shards a "
            f"multiple of {num_devices})"
        )
    if num_devices > jax.device_count():
        raise ValueError(
            f"a mesh of {num_devices} devices, but JAX has {jax.device_count()} ({jax.default_backend()}): on a "
            f"CPU call course_lib.scaling.devices.use_cpu_devices({num_devices}) before anything touches JAX (restart "
            f"the kernel first), or use fewer devices"
        )


def shard_config(config: SACConfig, num_shards: int) -> SACConfig:
    """The config one logical shard runs sac.py's functions with: ``1/S`` of the envs, the
    batch, the buffer, the warm-up and the run's env steps; everything else unchanged."""
    return dataclasses.replace(
        config,
        num_envs=config.num_envs // num_shards,
        batch_size=config.batch_size // num_shards,
        buffer_capacity=config.buffer_capacity // num_shards,
        learning_starts=config.learning_starts // num_shards,
        total_env_steps=config.total_env_steps // num_shards,
    )


def average_gradients() -> optax.GradientTransformation:
    """An optax transformation that replaces the gradients by their mean over every logical
    shard of every device, ``lax.pmean(grads, ("shards", "data"))``: the vmap axis of a
    device's shards and the mesh axis of the devices. Stateless; put it first in a chain
    (:func:`averaged`)."""

    def update(grads: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        return jax.lax.pmean(grads, (SHARDS, DATA)), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def averaged(opt: Optimizers) -> Optimizers:
    """sac.py's optimizers, each with :func:`average_gradients` in front."""
    return Optimizers(*(optax.chain(average_gradients(), tx) for tx in opt))


def shard_keys(run_key: Array, step: Array, shard_id: Array, updates_per_step: int) -> tuple[Array, ...]:
    """Logical shard ``shard_id``'s keys at vectorised step ``step``: ``(act, random action,
    env, learn [updates_per_step])``, from ``fold_in(fold_in(run_key, step), shard_id)``. They
    depend on the step and the shard only, never on the device count."""
    k_act, k_random, k_env, k_learn = jax.random.split(
        jax.random.fold_in(jax.random.fold_in(run_key, step), shard_id), 4
    )
    return k_act, k_random, k_env, jax.random.split(k_learn, updates_per_step)


# ---------------------------------------------------------------------------------------
# The per-device program
# ---------------------------------------------------------------------------------------


class _Static(NamedTuple):
    """What the per-device functions close over (no arrays)."""

    config: SACConfig  # the global config
    shard: SACConfig  # one logical shard's (shard_config)
    opt: Optimizers  # with the gradient averaging in front
    env: ContinuousEnv
    env_params: Any


def act_and_store(
    s: _Static, actor: sac.MLP, warmup: Array, envs: EnvCarry, buffer: Any, keys: tuple[Array, ...]
) -> tuple[EnvCarry, Any, dict[str, Array]]:
    """One logical shard's vectorised env step (sac.py's sampling, env step and replay add):
    the actor's sampled actions, or uniform ones in the warm-up; returns the envs, the
    buffer with the ``N/S`` new transitions, and the episode-end sums."""
    k_act, k_random, k_env, _ = keys
    action, _ = sac.sample_action(actor, envs.obs, k_act)
    random_action = jax.random.uniform(k_random, action.shape, minval=-1.0, maxval=1.0)
    envs, transition, sums = sac.env_step(
        s.env, s.env_params, s.config.reward_scale, envs, jnp.where(warmup, random_action, action), k_env
    )
    return envs, sac.buffer_add(s.shard, buffer, transition), sums


def learn_on_my_shards(
    s: _Static, buffers: Any, learner: Learner, priorities: Any, keys: Array
) -> tuple[Learner, Any, dict[str, Array]]:
    """``updates_per_step`` updates: in each, every local shard runs :func:`sac.learn_step`
    on its own buffer (vmapped, axis ``"shards"``), and ``s.opt`` averages the gradients over
    all shards of all devices, so every shard ends with the same learner (kept once).
    ``keys`` ``[L, U]``. Returns the learner, the shards' priorities and the local mean metrics.
    Same signature as :func:`sac.skip_updates`, its warm-up twin in ``lax.cond``."""
    step = jax.vmap(functools.partial(sac.learn_step, s.shard, s.opt), in_axes=(0, (None, 0), 0), axis_name=SHARDS)

    def one_update(carry: tuple[Learner, Any], k: Array) -> tuple[tuple[Learner, Any], dict[str, Array]]:
        (learners, priorities), metrics = step(buffers, carry, k)
        return (jax.tree.map(lambda x: x[0], learners), priorities), metrics

    (learner, priorities), metrics = jax.lax.scan(one_update, (learner, priorities), jnp.swapaxes(keys, 0, 1))
    return learner, priorities, {k: v.mean() for k, v in metrics.items()}


def device_step(
    s: _Static, state: ShardedState, _: Any = None
) -> tuple[ShardedState, tuple[dict[str, Array], dict[str, Array]]]:
    """One vectorised env step on ONE device, for its ``L = S/D`` logical shards, then the
    updates. The only communication is inside ``s.opt`` (the gradient ``pmean``)."""
    keys = jax.vmap(shard_keys, in_axes=(None, None, 0, None))(  # [L]: (step, g) only, never D
        state.key, state.step, state.shard_ids, s.config.updates_per_step
    )
    warmup = state.step * s.config.num_envs < s.config.learning_starts
    # 1. act and store: my shards' envs step, each shard's buffer takes its own transitions
    act = jax.vmap(functools.partial(act_and_store, s, state.learner.actor, warmup))
    envs, buffers, sums = act(state.envs, state.buffers, keys)
    # 2. learn: each shard samples B/S from its own buffer; gradients averaged over all S
    learn = functools.partial(learn_on_my_shards, s, buffers)
    priorities = jax.vmap(functools.partial(sac.get_priorities, s.shard))(buffers)
    learner, priorities, metrics = jax.lax.cond(warmup, sac.skip_updates, learn, state.learner, priorities, keys[3])
    buffers = jax.vmap(functools.partial(sac.set_priorities, s.shard))(buffers, priorities)
    state = state._replace(learner=learner, buffers=buffers, envs=envs, step=state.step + 1)
    return state, ({k: v.sum() for k, v in sums.items()}, metrics)


def device_chunk(s: _Static, state: ShardedState) -> tuple[ShardedState, dict[str, Array]]:
    """``steps_per_chunk`` :func:`device_step` in a ``lax.scan``, then the chunk's metrics:
    episode sums added over devices (``psum``), learner metrics averaged (``pmean``)."""
    state, (sums, learn) = jax.lax.scan(functools.partial(device_step, s), state, None, s.config.steps_per_chunk)
    sums, learn = jax.lax.psum(sums, DATA), jax.lax.pmean(learn, DATA)
    return state, sac.chunk_metrics(sums, learn, state.step * s.config.num_envs)


# ---------------------------------------------------------------------------------------
# init and run_chunk on a mesh
# ---------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _default_optimizers(config: SACConfig) -> Optimizers:
    """sac.py's optimizers, one object per config (so the learner's init compiles once)."""
    return sac.make_optimizers(config)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _init_learner(key: Array, config: SACConfig, obs_dim: int, action_dim: int, opt: Optimizers) -> Learner:
    return sac.init_learner(key, config, obs_dim, action_dim, opt)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _reset_shards(key: Array, num_shards: int, envs_per_shard: int, env: ContinuousEnv, env_params: Any) -> EnvCarry:
    """``[S, N/S]`` reset envs, shard ``g``'s from ``fold_in(key, g)`` (one device; compiled once per shape)."""

    def one(g: Array) -> EnvCarry:
        keys = jax.random.split(jax.random.fold_in(key, g), envs_per_shard)
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(keys, env_params)
        return EnvCarry(state, obs, jnp.zeros(envs_per_shard))

    return jax.vmap(one)(jnp.arange(num_shards, dtype=jnp.int32))


@dataclasses.dataclass(frozen=True)
class ShardedTrain:
    """:func:`make_sharded_train`'s program: ``init(key)``, ``run_chunk(state)`` and
    ``compile(state)`` (compile ahead, e.g. several meshes' programs in threads)."""

    init: Callable[[Array], ShardedState]
    run_chunk: Callable[[ShardedState], tuple[ShardedState, dict[str, Array]]]
    compile: Callable[[ShardedState], Any]
    mesh: Mesh
    num_shards: int


@functools.lru_cache(maxsize=16)
def make_sharded_train(
    config: SACConfig,
    num_shards: int,
    mesh: Mesh,
    env: ContinuousEnv | None = None,
    env_params: Any = None,
    opt: Optimizers | None = None,
) -> ShardedTrain:
    """SAC over ``mesh`` (1-D, axis ``"data"``) with ``num_shards`` logical shards.

    ``init(key) -> ShardedState`` places a fresh run on the mesh: the learner made on the
    mesh's first device by :func:`sac.init_learner` and replicated; each shard's ``N/S``
    reset envs (keys ``fold_in(k_reset, g)``, made on one device) and its empty buffer
    (written on its own device). ``run_chunk(state) -> (state, metrics)``:
    ``steps_per_chunk`` steps of :func:`device_step` on every device, one
    ``jit(shard_map(...))`` program (state donated; compiled through
    :func:`check_multidevice_safe` on first use); metrics as :func:`sac.chunk_metrics`.
    The caller blocks on each chunk (:func:`train_sharded` does). Kept per arguments (all
    hashable), so the equivalence run and the throughput measurement of the same config
    and mesh share one compiled program.

    ``opt``: sac.py-style optimizers (default :func:`sac.make_optimizers`); the gradient
    averaging (:func:`averaged`) is put in front of them here. ``env`` defaults to the
    driving env.
    """
    env, env_params = sac.default_env(env, env_params)
    num_devices = int(mesh.shape[DATA])
    check_sharding(config, num_shards, num_devices)
    base_opt = opt or _default_optimizers(config)
    s = _Static(config, shard_config(config, num_shards), averaged(base_opt), env, env_params)
    shardings = jax.tree.map(functools.partial(NamedSharding, mesh), STATE_SPECS)
    example = Transition(*(jnp.zeros(x.shape, x.dtype) for x in example_transition(env, env_params)))
    empty_buffers = jax.jit(
        lambda: jax.vmap(lambda _: sac.buffer_init(s.shard, example))(jnp.arange(num_shards)),
        out_shardings=shardings.buffers,
    )

    def init(key: Array) -> ShardedState:
        k_learner, k_reset, k_run = jax.random.split(key, 3)
        with jax.default_device(mesh.devices.flat[0]):  # parameters and envs: one device, then placed
            learner = _init_learner(k_learner, config, env.OBS_DIM, env.ACTION_DIM, base_opt)
            envs = _reset_shards(k_reset, num_shards, s.shard.num_envs, env, env_params)
        # the averaging transformation's state (empty) in front of each optimizer's, as optax.chain keeps them
        learner = learner._replace(**{f: (optax.EmptyState(), getattr(learner, f)) for f in _OPT_FIELDS})
        state = ShardedState(
            learner, empty_buffers(), envs, jnp.arange(num_shards, dtype=jnp.int32), k_run, jnp.int32(0)
        )
        return jax.block_until_ready(jax.device_put(state, shardings))

    program = jax.jit(
        jax.shard_map(
            functools.partial(device_chunk, s),
            mesh=mesh,
            in_specs=(STATE_SPECS,),
            out_specs=(STATE_SPECS, P()),
            check_vma=False,  # local gradients, averaged by the explicit pmean (the check_vma trap)
        ),
        donate_argnums=0,
    )
    compiled: list[Any] = []

    def compile_chunk(state: ShardedState) -> Any:
        if not compiled:
            compiled.append(check_multidevice_safe(program, state))
        return compiled[0]

    def run_chunk(state: ShardedState) -> tuple[ShardedState, dict[str, Array]]:
        return compile_chunk(state)(state)

    return ShardedTrain(init, run_chunk, compile_chunk, mesh, num_shards)


#: The :class:`sac.Learner` fields that hold optimizer states.
_OPT_FIELDS = ("actor_opt", "critic_opt", "alpha_opt")


class ShardedResult(NamedTuple):
    """A sharded run's final state and its metrics (numpy, ``[num_chunks]`` per key)."""

    state: ShardedState
    metrics: dict[str, np.ndarray]


def _run_chunks(program: ShardedTrain, state: ShardedState, num_chunks: int) -> ShardedResult:
    """``num_chunks`` chunks, each blocked on; numpy metrics ``[num_chunks]``."""
    history = []
    for _ in range(num_chunks):
        state, metrics = program.run_chunk(state)
        history.append(jax.device_get(metrics))  # blocks until the chunk is done
    return ShardedResult(state, {k: np.stack([m[k] for m in history]) for k in history[0]} if history else {})


def train_sharded(
    config: SACConfig,
    num_shards: int,
    mesh: Mesh,
    key: Array,
    env: ContinuousEnv | None = None,
    env_params: Any = None,
    num_chunks: int | None = None,
    opt: Optimizers | None = None,
    watchdog_s: float = 600.0,
) -> ShardedResult:
    """The driver: ``init(key)``, then ``num_chunks`` (default ``config.num_chunks``) calls of
    ``run_chunk``, each blocked on (the CPU dispatch deadlock), all under the watchdog."""
    program = make_sharded_train(config, num_shards, mesh, env, env_params, opt)
    with watchdog(watchdog_s, f"sharded SAC on {mesh.shape[DATA]} device(s), {num_shards} logical shards"):
        return _run_chunks(program, program.init(key), config.num_chunks if num_chunks is None else num_chunks)


def run_on_device_counts(
    config: SACConfig = CPU_SHARDED_CONFIG,
    num_shards: int = NUM_SHARDS,
    devices: Sequence[int] = (1, 2, 4),
    seed: int = 0,
    env: ContinuousEnv | None = None,
    env_params: Any = None,
    opt: Optimizers | None = None,
    num_chunks: int | None = None,
    watchdog_s: float = 600.0,
) -> dict[int, ShardedResult]:
    """The same run (same seed, same global ``num_envs`` and ``batch_size``, same logical
    shards) on meshes of the first ``D`` devices for each ``D`` in ``devices``, in this
    process: the programs compiled side by side (one thread each), then run one after
    another. Compare the learners with :func:`max_param_difference`."""
    for d in devices:
        check_sharding(config, num_shards, d)
    programs = {d: make_sharded_train(config, num_shards, data_mesh(d), env, env_params, opt) for d in devices}
    chunks = config.num_chunks if num_chunks is None else num_chunks
    with watchdog(watchdog_s, f"sharded SAC on {tuple(devices)} devices, {num_shards} logical shards"):
        states = {d: p.init(jax.random.key(seed)) for d, p in programs.items()}
        with ThreadPoolExecutor(len(programs)) as pool:
            list(pool.map(lambda d: programs[d].compile(states[d]), programs))
        return {d: _run_chunks(p, states[d], chunks) for d, p in programs.items()}


def max_param_difference(a: Learner, b: Learner) -> float:
    """``max |a - b|`` over the actor, critics, targets and log alpha of two learners."""
    pa = jax.device_get((a.actor, a.critics, a.targets, a.log_alpha))
    pb = jax.device_get((b.actor, b.critics, b.targets, b.log_alpha))
    return float(
        max(np.max(np.abs(np.asarray(x) - np.asarray(y))) for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)))
    )


# ---------------------------------------------------------------------------------------
# Throughput against the device count
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ShardedThroughput:
    """Seconds per chunk of the sharded program on each device count (after compilation and
    the warm-up; ``repeats`` interleaved samples each) and what they mean per second."""

    config: SACConfig
    num_shards: int
    seconds: dict[int, list[float]]
    load_before: float
    load_after: float

    def median(self, devices: int) -> float:
        return statistics.median(self.seconds[devices])

    def env_steps_per_s(self, devices: int) -> float:
        """Environment steps (all envs) per second."""
        return self.config.steps_per_chunk_env / self.median(devices)

    def updates_per_s(self, devices: int) -> float:
        """Gradient updates (each on the global batch) per second."""
        return self.config.steps_per_chunk * self.config.updates_per_step / self.median(devices)

    def table(self) -> str:
        rows = [f"{'devices':>7} {'s/chunk':>8} {'env steps/s':>12} {'updates/s':>10} {'speed-up':>8}"]
        for d in self.seconds:
            rows.append(
                f"{d:>7} {self.median(d):>8.3f} {self.env_steps_per_s(d):>12,.0f} {self.updates_per_s(d):>10,.0f} "
                f"{self.median(min(self.seconds)) / self.median(d):>7.2f}x"
            )
        return "\n".join(rows)


def measure_sharded_throughput(
    devices: Sequence[int] = (1, 2, 4),
    config: SACConfig = CPU_SHARDED_CONFIG,
    num_shards: int = NUM_SHARDS,
    repeats: int = 5,
    env: ContinuousEnv | None = None,
    env_params: Any = None,
    seed: int = 0,
    watchdog_s: float = 300.0,
) -> ShardedThroughput:
    """Env steps/s and gradient updates/s of the sharded chunk against the device count.

    The same global ``num_envs``, batch and logical shards on meshes of the first ``D``
    devices. Each program is compiled and run past the warm-up (so every timed step
    learns), then one chunk of each device count is timed in turn, ``repeats + 1`` rounds
    (the first dropped), blocked; :class:`ShardedThroughput` keeps the samples and gives
    medians. Show it beside lesson 05's *no-communication ceiling* (the same work split with
    no all-reduce, :func:`course_lib.scaling.checklist.dp_speedup`): on this machine's 2 cores, 4 CPU
    devices cannot be faster than 2 (they share the cores, and every all-reduce waits for
    the slowest), and one device already uses part of the second core. The point is that
    it is the same program that scales on devices with their own silicon.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    programs = {d: make_sharded_train(config, num_shards, data_mesh(d), env, env_params, None) for d in devices}
    warmup_chunks = -(-config.warmup_steps // config.steps_per_chunk)
    seconds: dict[int, list[float]] = {d: [] for d in devices}
    with watchdog(watchdog_s, f"sharded SAC throughput on {tuple(devices)} devices"):
        states = {d: p.init(jax.random.key(seed)) for d, p in programs.items()}
        with ThreadPoolExecutor(len(programs)) as pool:
            list(pool.map(lambda d: programs[d].compile(states[d]), programs))
        for d, p in programs.items():  # past the warm-up: every timed step learns
            for _ in range(warmup_chunks):
                states[d] = jax.block_until_ready(p.run_chunk(states[d])[0])
        load_before = os.getloadavg()[0]
        for _ in range(repeats + 1):
            for d, p in programs.items():
                t0 = time.perf_counter()
                states[d] = jax.block_until_ready(p.run_chunk(states[d])[0])
                seconds[d].append(time.perf_counter() - t0)
    return ShardedThroughput(
        config, num_shards, {d: s[1:] for d, s in seconds.items()}, load_before, os.getloadavg()[0]
    )


# ---------------------------------------------------------------------------------------
# Replay capacity per device at full scale
# ---------------------------------------------------------------------------------------

#: Device memory as ``nvidia-smi`` reports ``memory.total`` (bytes): H100 SXM "80 GB" and
#: H200 "141 GB".
DEVICE_MEMORY = {"H100 80GB": 81_559 * 2**20, "H200 141GB": 143_771 * 2**20}


def _nbytes(tree: Any) -> int:
    return int(sum(np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def example_transition(env: ContinuousEnv = driving, env_params: Any = None) -> Transition:
    """The shapes and dtypes of one stored transition (``jax.ShapeDtypeStruct``), from ``env.reset``."""
    env, env_params = sac.default_env(env, env_params)
    obs = jax.eval_shape(env.reset, jax.random.key(0), env_params)[0]
    spec: Any = jax.ShapeDtypeStruct  # a Transition of shapes, not of arrays
    return Transition(obs, spec((env.ACTION_DIM,), jnp.float32), spec((), jnp.float32), spec((), jnp.bool_), obs)


def transition_nbytes(env: ContinuousEnv = driving, prioritized: bool = True, env_params: Any = None) -> int:
    """Bytes one stored transition takes in the replay buffer, from the shapes and dtypes.

    The driving env: obs 64 float32 (256 B), action 2 float32 (8), reward float32 (4),
    terminated bool (1), next_obs 64 float32 (256): 525 B; prioritized replay adds the
    sum-tree, float32 ``[2 capacity]``, 8 B per slot: 533 B.
    """
    return _nbytes(example_transition(env, env_params)) + (2 * 4 if prioritized else 0)


def learner_nbytes(config: SACConfig = sac.FULL_CONFIG, env: ContinuousEnv = driving) -> int:
    """Bytes of the learner: actor, twin critics, their targets, log alpha and the Adam
    moments (and counts) of each, from :func:`sac.init_learner`'s shapes."""
    opt = sac.make_optimizers(config)
    shapes = jax.eval_shape(lambda k: sac.init_learner(k, config, env.OBS_DIM, env.ACTION_DIM, opt), jax.random.key(0))
    return _nbytes(shapes)


class ReplayCapacity(NamedTuple):
    """How much replay fits on one device (:func:`replay_capacity`)."""

    memory_bytes: int
    headroom_bytes: int
    learner_bytes: int
    env_bytes: int
    transition_bytes: int
    transitions: int  # the most that fit
    power_of_two: int  # the largest power of two that fits (a sum-tree's capacity)


def replay_capacity(
    memory_bytes: int,
    config: SACConfig = sac.FULL_CONFIG,
    env: ContinuousEnv = driving,
    num_devices: int = 1,
    headroom: float = 0.10,
) -> ReplayCapacity:
    """Transitions of replay one device can hold beside the learner and its envs.

    ``memory_bytes - headroom * memory_bytes`` (activations, the sampled batches, XLA's
    workspace) ``- learner`` (:func:`learner_nbytes`: parameters, targets, Adam moments,
    replicated on every device) ``- envs`` (``num_envs / num_devices`` env states,
    observations and returns), divided by :func:`transition_nbytes`. Assumes the buffer is
    updated in place (the chunk donates its state) and that JAX may use that much of the
    device: by default it preallocates 75 % of a GPU, so set
    ``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95`` for a buffer this large.
    """
    per_env = _nbytes(jax.eval_shape(env.reset, jax.random.key(0), getattr(env, "DEFAULT_PARAMS", None))) + 4
    env_bytes = per_env * -(-config.num_envs // num_devices)
    learner = learner_nbytes(config, env)
    per_transition = transition_nbytes(env, config.prioritized)
    spare = int(memory_bytes * (1.0 - headroom))
    fit = max((spare - learner - env_bytes) // per_transition, 0)
    pow2 = 1 << (fit.bit_length() - 1) if fit else 0
    return ReplayCapacity(memory_bytes, memory_bytes - spare, learner, env_bytes, per_transition, fit, pow2)
