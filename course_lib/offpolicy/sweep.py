r"""Model size x *distinct data* for SAC on the driving env (lesson 06), after V-Max's scaling table.

V-Max (Charraut et al. 2025, arXiv 2503.08388) reports that larger networks do worse than
small ones when trained on little data and overtake them with more, where "more data" means
more *distinct* driving (hours of the Waymo dataset), not more passes over the same hours.
A sweep that answers that question must move one thing at a time:

- **Axis 1, model width**: the hidden width of the actor and both critics (``widths``).
- **Axis 2, distinct training scenarios** ``K`` (``pool_sizes``): every training reset
  draws its scenario from a pool of ``K`` procedural seeds
  (:class:`course_lib.envs.scenarios.ScenarioPool`); ``K =`` :data:`UNLIMITED` is a
  fresh scenario at every reset.
- **Everything else fixed**: every cell takes the same number of env steps and the same
  number of gradient updates (one :class:`~course_lib.offpolicy.sac.SACConfig`), so a
  difference between cells is the width's or the pool's, not more training.
- **Judged on held-out scenarios**: the deterministic policy's accuracy (and collision,
  off-road rates) on scenarios no training pool contains (indices from
  :data:`~course_lib.envs.scenarios.HELD_OUT_FIRST`, by construction), the same episodes
  for every cell; also on the run's own training pool, which shows memorisation (high on
  the pool, low held out) against generalisation. ``num_seeds`` seeds per cell, reported
  as mean +- standard error.

(The sweep this one replaces took its "data sizes" as snapshots of one run, so experience
and gradient updates moved together and the question was confounded.)

Three things make the whole grid **one** compiled training program:

- **Every width is trained inside the widest network.** A width-``w`` network is embedded
  in the width-``W`` one by padding its weights with zeros: a hidden unit whose incoming
  weights and bias are 0 outputs ``relu(0) = 0``, and since JAX defines ``relu'(0) = 0``,
  no gradient ever reaches its weights (Adam's update of a parameter whose gradients are
  all 0 is exactly 0). The padded network computes the narrow one's function and follows
  its training step for step (:func:`pad_learner`; tested). The price: every width costs
  what the widest does.
- **The pool is data.** ``K``, the pool's first index and its key are fields of the env's
  params (:class:`~course_lib.envs.scenarios.PoolParams`). :func:`course_lib.offpolicy.sac.make_train`
  closes over ``env_params``, which would bake them into the program as constants (one
  compile per ``K``); here ``make_train`` is called *inside* the jitted function, with the
  params as its traced argument (:func:`sweep_programs`), so one program serves every ``K``.
- **Every run is a call of that one program.** ``runs="threads"`` (the CPU's way) calls
  the one-run program once per run on a pool of two threads; ``runs="vmap"``
  (:data:`FULL_SWEEP`, the accelerator's way) stacks the ``R = len(widths) x
  len(pool_sizes) x num_seeds`` runs as rows of one vmapped program, trained chunk by chunk
  with one chunk always queued on the device, and evaluated, held out and on the training
  pools together, by one more program. ``runs="auto"`` (the default) is ``"threads"`` on a
  CPU backend and ``"vmap"`` on any other (:func:`resolve_runs`). Both use uniform
  replay (``prioritized=False``): a prioritized buffer's sum-tree scatters batch badly
  under ``vmap`` (``BENCHMARKS.md``). Measured for :data:`CPU_SWEEP`'s 18 runs on 2 shared
  CPU cores (load average 4-5): once learning, a chunk of every run took 1.0-1.2 s either
  way, but the vmapped chunk program took 18-23 s to compile against 8.6 s for the one-run
  program (and the init 6-8 s either way), so on a CPU the threads win by the compile.

The ``cpu`` scale (:data:`CPU_SWEEP`) is a reduced grid that fits the lesson's notebook on
two CPU cores; :data:`FULL_SWEEP` is V-Max's kind of grid for one GPU (not run on CPU
machines). :func:`sweep_table` prints a result, :func:`sweep_findings` computes what it shows.

**A recorded result.** The full sweep is run once on a GPU from the command line and its
result committed as JSON; the full-scale lesson loads it instead of re-running it::

    python -m course_lib.offpolicy.sweep --scale full --seed 11 --out sweep_full.json

prints the progress (a text bar), the table, the findings and the seconds, and writes the
file with :func:`save_result`: every array with its dtype and shape, the rates held out and
on the training pools, the seconds, and ``meta`` (the :class:`SweepConfig` with its
:class:`~course_lib.offpolicy.sac.SACConfig`, the master key's seed, the devices, the jax
version, the UTC date, the command). :func:`load_result` reads it back exactly
(``(SweepResult, meta)``; :func:`sweep_config_from_dict` rebuilds the config from
``meta["sweep"]``). This path imports no notebook package (IPython, matplotlib, widgets),
and without ``tqdm`` the progress is printed as plain lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array

from course_lib.envs import scenarios
from course_lib.envs.scenarios import HELD_OUT_FIRST, UNLIMITED, PoolParams, ScenarioPool
from course_lib.offpolicy import sac
from course_lib.offpolicy.sac import MLP, Learner, SACConfig, TrainState

#: How the runs of a sweep execute: ``"vmap"``, one vmapped program over all runs;
#: ``"threads"``, the one-run program once per run on a pool of threads; ``"auto"``,
#: threads on a CPU backend, vmap on an accelerator (:func:`resolve_runs`).
RUN_MODES = ("auto", "vmap", "threads")

#: Training pools of different seeds are disjoint: seed ``j``'s finite pool is the indices
#: ``j * SEED_STRIDE + [0, K)`` (so ``K <= SEED_STRIDE`` for finite pools).
SEED_STRIDE = 2**20


@dataclass(frozen=True)
class SweepConfig:
    """The grid and the SAC run every cell shares (its ``width`` is set to the widest of ``widths``)."""

    widths: tuple[int, ...] = field(default=(16, 64), metadata={"help": "hidden widths, actor and critics, increasing"})
    pool_sizes: tuple[int, ...] = field(
        default=(4, 32, UNLIMITED),
        metadata={"help": "distinct training scenarios K, increasing; scenarios.UNLIMITED = every reset fresh"},
    )
    num_seeds: int = field(default=3, metadata={"help": "seeds per cell (each its own pool, network and env stream)"})
    num_episodes: int = field(default=128, metadata={"help": "held-out evaluation episodes per run"})
    pool_eval: bool = field(
        default=True, metadata={"help": "also evaluate each run on num_episodes of its own training pool"}
    )
    runs: str = field(
        default="auto", metadata={"help": "how the runs execute: one of RUN_MODES (auto: threads on CPU, else vmap)"}
    )
    sac: SACConfig = field(
        default=SACConfig(total_env_steps=16_000, prioritized=False, buffer_capacity=2**14),
        metadata={"help": "the SAC run every cell shares: env steps, updates, hyperparameters"},
    )

    @property
    def run_config(self) -> SACConfig:
        """The SAC config of the padded runs: the widest width."""
        return dataclasses.replace(self.sac, width=max(self.widths))

    @property
    def num_runs(self) -> int:
        """Runs of the grid: ``len(widths) x len(pool_sizes) x num_seeds``."""
        return len(self.widths) * len(self.pool_sizes) * self.num_seeds


#: The ``cpu`` scale: 2 widths x 3 pool sizes x 3 seeds = 18 runs of 16,000 env steps and
#: 1,744 gradient updates each (uniform replay), 128 held-out and 128 training-pool episodes
#: per run, runs as threads. Measured on 2 shared CPU cores at load average 2.2-2.4: 36.9 s
#: in all (setup, i.e. compiling the programs and the initial states, 24.4 s; training 8.3 s;
#: evaluation 3.8 s), and 16.4 s for a second sweep in the same process (programs compiled).
#: At this budget the policies are far from trained (most held-out episodes end in a
#: collision) and two master keys gave no separation of widths or pool sizes at 2 s.e.: it
#: shows the method, :func:`sweep_findings` says whether anything separated, and the
#: question itself is :data:`FULL_SWEEP`'s.
CPU_SWEEP = SweepConfig()

#: The ``full`` scale, for one GPU: 2 widths (32, 256) x 4 pool sizes (K = 1, 8, 64,
#: unlimited) x 3 seeds = 24 runs, stacked in **one** vmapped program (``runs="vmap"``).
#: Each run: 256 envs, 4 updates of batch 256 after every vectorised step, actor and twin
#: critics of depth 3 (every width trained inside the width-256 network), uniform replay of
#: 2^18 transitions (24 x 2^18 x 525 B = 3.3 GB of buffers in all), 65,536 warm-up env
#: steps, 4,096,000 env steps in 32 chunks of 500 vectorised steps (128,000 env steps; one
#: progress tick each) = 62,976 gradient updates per run, the same for every cell; 1,024
#: held-out and 1,024 training-pool episodes per run (one evaluation program of 24 x 2 x
#: 1,024 episodes). ``K = 1`` is the legitimate extreme: one scenario, to be memorised.
#:
#: The sizing is an **estimate until measured**, aimed at 150-200 s on one H200, compiling
#: included, from measurements on an H200 (2026-11-27): ``sac.FULL_CONFIG`` (1,024 envs, 4
#: updates of batch 1,024, width 256, depth 3, prioritized) took 3.6 ms per vectorised step
#: (512 envs: 3.0 ms), so its small kernels are launch-bound and stacking 24 runs with vmap
#: costs far less than 24 times one run's kernels; the driving env alone steps 84M env
#: steps/s. A vectorised step of the 24 stacked runs (6,144 envs, 4 x 24 updates of 256) is
#: estimated at 4-8 ms, i.e. 16,000 steps in 65-130 s, plus compiling and evaluation. The
#: recorded result's ``seconds`` (and its ``meta``) say what it really took. Checked on a
#: CPU (not timed for the GPU): its vmapped chunk program compiles (10.8 s on 2 cores), the
#: 24 runs' state is 3.47 GB (3.30 GB of it replay) plus 0.28 GB of temporaries, and the
#: whole vmapped path runs end to end on this grid with a budget of 2 tiny chunks.
FULL_SWEEP = SweepConfig(
    widths=(32, 256),
    pool_sizes=(1, 8, 64, UNLIMITED),
    num_seeds=3,
    num_episodes=1024,
    pool_eval=True,
    runs="vmap",
    sac=dataclasses.replace(
        sac.FULL_CONFIG,
        num_envs=256,
        total_env_steps=4_096_000,
        learning_starts=65_536,
        buffer_capacity=2**18,
        batch_size=256,
        updates_per_step=4,
        depth=3,
        steps_per_chunk=500,
        prioritized=False,
    ),
)


def check_sweep(sweep: SweepConfig) -> None:
    """Refuse a grid the sweep cannot run, saying what was wrong and how to fix it."""
    run = sweep.run_config
    chunk = run.steps_per_chunk_env
    if run.total_env_steps % chunk:
        raise ValueError(
            f"sac.total_env_steps = {run.total_env_steps} is not a multiple of a chunk's {chunk} env steps "
            f"(steps_per_chunk x num_envs); use e.g. {max(1, round(run.total_env_steps / chunk)) * chunk}"
        )
    if not sweep.widths or list(sweep.widths) != sorted(set(sweep.widths)) or min(sweep.widths) < 1:
        raise ValueError(f"widths must be positive and strictly increasing, e.g. (16, 64); got {sweep.widths}")
    if not sweep.pool_sizes or list(sweep.pool_sizes) != sorted(set(sweep.pool_sizes)):
        raise ValueError(
            f"pool_sizes must be strictly increasing, e.g. (4, 32, scenarios.UNLIMITED); got {sweep.pool_sizes}"
        )
    for k in sweep.pool_sizes:
        scenarios.check_pool_size(k)
        if k != UNLIMITED and k > SEED_STRIDE:
            raise ValueError(
                f"a finite pool holds at most SEED_STRIDE = {SEED_STRIDE} scenarios, got K = {k}; "
                "use scenarios.UNLIMITED for more"
            )
    if not 2 <= sweep.num_seeds <= HELD_OUT_FIRST // SEED_STRIDE:
        raise ValueError(f"num_seeds must be 2 .. 1024 (a standard error needs 2), got {sweep.num_seeds}")
    if sweep.num_episodes < 1:
        raise ValueError(f"num_episodes must be >= 1, got {sweep.num_episodes}")
    if sweep.runs not in RUN_MODES:
        raise ValueError(f"runs must be one of {RUN_MODES}, got {sweep.runs!r}")
    sac.check_config(run)


def resolve_runs(sweep: SweepConfig) -> str:
    """How ``sweep``'s runs execute: its ``runs``, with ``"auto"`` made ``"threads"`` on a CPU
    backend and ``"vmap"`` on an accelerator (``jax.default_backend()``)."""
    if sweep.runs != "auto":
        return sweep.runs
    return "threads" if jax.default_backend() == "cpu" else "vmap"


# ---------------------------------------------------------------------------------------
# A narrow network inside a wide one
# ---------------------------------------------------------------------------------------


def pad_mlp(layers: MLP, width: int) -> MLP:
    """Zero-pad every hidden layer of ``layers`` to ``width`` units (the input and output
    sizes stay). Works on stacked critics too (leading axes are kept)."""
    out = []
    for i, layer in enumerate(layers):
        pad_in = 0 if i == 0 else width - layer["w"].shape[-2]
        pad_out = 0 if i == len(layers) - 1 else width - layer["w"].shape[-1]
        lead = [(0, 0)] * (layer["w"].ndim - 2)
        out.append(
            {
                "w": jnp.pad(layer["w"], lead + [(0, pad_in), (0, pad_out)]),
                "b": jnp.pad(layer["b"], lead + [(0, pad_out)]),
            }
        )
    return out


def pad_learner(narrow: Learner, width: int, opt: sac.Optimizers) -> Learner:
    """A learner of ``width`` hidden units that computes, and trains exactly like, ``narrow``
    (its extra units' weights are 0 and stay 0: see the module docstring). Fresh optimizer
    states, as at the start of a run."""
    actor, critics = pad_mlp(narrow.actor, width), pad_mlp(narrow.critics, width)
    targets = pad_mlp(narrow.targets, width)
    return Learner(
        actor, critics, targets, narrow.log_alpha, opt.actor.init(actor), opt.critic.init(critics), narrow.alpha_opt
    )


# ---------------------------------------------------------------------------------------
# The runs: one program of (state, env params), every pool size as data
# ---------------------------------------------------------------------------------------

Init = Callable[[Array, PoolParams], TrainState]
Chunk = Callable[[TrainState, PoolParams], tuple[TrainState, dict[str, Array]]]


def sweep_programs(config: SACConfig, env: ScenarioPool, vmapped: bool) -> tuple[Init, Chunk]:
    """Jitted ``init(key, params)`` and ``run_chunk(state, params)`` (the state donated):
    :func:`course_lib.offpolicy.sac.make_train`'s, with the env params an *argument*.

    ``make_train`` closes over ``env_params``; calling it inside the traced function makes
    that closure a tracer, so the pool (``K``, its first index and key) is data of the
    program, not a constant compiled into it: one program for every ``K``. ``vmapped``: both
    take a leading run axis on every argument. Cached per (config, env, vmapped);
    ``total_env_steps`` is left out of the key (it only says how many chunks to run).
    """
    return _sweep_programs(dataclasses.replace(config, total_env_steps=config.steps_per_chunk_env), env, vmapped)


@functools.lru_cache(maxsize=8)
def _sweep_programs(config: SACConfig, env: ScenarioPool, vmapped: bool) -> tuple[Init, Chunk]:
    def init(key: Array, params: PoolParams) -> TrainState:
        return sac.make_train(config, env, params)[0](key)

    def run_chunk(state: TrainState, params: PoolParams) -> tuple[TrainState, dict[str, Array]]:
        return sac.make_train(config, env, params)[1](state)

    if vmapped:
        init, run_chunk = jax.vmap(init), jax.vmap(run_chunk)
    return jax.jit(init), jax.jit(run_chunk, donate_argnums=0)


class RunGrid(NamedTuple):
    """The runs of a sweep, width-major then pool size then seed (``R`` of them).

    ``keys [R]``: run ``(w, k, j)`` has seed ``j``'s key (network init, env stream), shared by
    every width and pool size, so that cells are compared seed by seed. ``train [R]``: its
    training pool's params; ``held_out [R]``: the held-out params (the same for every run).
    """

    keys: Array
    train: PoolParams
    held_out: PoolParams


def run_grid(sweep: SweepConfig, key: Array, base_params: Any) -> RunGrid:
    """Keys and pool params of every run: seed ``j``'s finite pools are the indices
    ``j * SEED_STRIDE + [0, K)`` of one pool key (nested over ``K``, disjoint between seeds),
    unlimited is ``[0, 2^30)``, held-out ``[2^30, 2^31)``."""
    k_pool, k_seeds = jax.random.split(key)
    seed_keys = jax.random.split(k_seeds, sweep.num_seeds)
    keys, firsts, sizes = [], [], []
    for _ in sweep.widths:
        for k in sweep.pool_sizes:
            for j in range(sweep.num_seeds):
                keys.append(seed_keys[j])
                firsts.append(0 if k == UNLIMITED else j * SEED_STRIDE)
                sizes.append(k)
    r = len(keys)
    base = jax.tree.map(lambda x: jnp.broadcast_to(jnp.asarray(x), (r,) + jnp.shape(x)), base_params)
    pool_keys = jnp.stack([k_pool] * r)
    train = PoolParams(base, pool_keys, jnp.asarray(firsts, jnp.int32), jnp.asarray(sizes, jnp.int32))
    held = PoolParams(base, pool_keys, jnp.full((r,), HELD_OUT_FIRST, jnp.int32), jnp.full((r,), UNLIMITED, jnp.int32))
    return RunGrid(jnp.stack(keys), train, held)


def padded_learners(sweep: SweepConfig, keys: Array, env: ScenarioPool) -> Learner:
    """The learners of every run, stacked ``[R]``: each width's networks initialised at that
    width (``fan_in`` scaling included) from its seed's key, then padded to the widest."""
    run = sweep.run_config
    opt = sac.make_optimizers(run)
    per_width = sweep.num_runs // len(sweep.widths)
    learners = []
    for i, width in enumerate(sweep.widths):
        narrow_config = dataclasses.replace(run, width=width)
        narrow_opt = sac.make_optimizers(narrow_config)

        def padded(k: Array, config: SACConfig = narrow_config, o: sac.Optimizers = narrow_opt) -> Learner:
            narrow = sac.init_learner(jax.random.fold_in(k, 1), config, env.OBS_DIM, env.ACTION_DIM, o)
            return pad_learner(narrow, run.width, opt)

        learners.append(jax.jit(jax.vmap(padded))(keys[i * per_width : (i + 1) * per_width]))
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *learners)


def _unstack(tree: Any, n: int) -> list[Any]:
    return [jax.tree.map(lambda x, i=i: x[i], tree) for i in range(n)]


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _concat(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.concatenate(xs), *trees)


class _PrintBar:
    """A progress "bar" of plain lines on stderr, where ``tqdm`` is not installed."""

    def __init__(self, total: int, desc: str) -> None:
        self.n, self.total, self.desc, self.t0 = 0, total, desc, time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        print(
            f"{self.desc}: {self.n}/{self.total} ({time.perf_counter() - self.t0:.1f} s)", file=sys.stderr, flush=True
        )

    def __enter__(self) -> _PrintBar:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _chunk_bar(show: bool, total: int) -> Any:
    """The sweep's progress over ``total`` chunks: :func:`course_lib.progress` (a widget in
    a notebook, a text bar elsewhere), plain lines if ``tqdm`` is missing, nothing if not ``show``."""
    if show and importlib.util.find_spec("tqdm") is None:
        return _PrintBar(total, "sweep chunks")
    return sac.chunk_progress(show, total, "sweep chunks")


def train_and_evaluate(
    sweep: SweepConfig, grid: RunGrid, env: ScenarioPool, key: Array, progress: bool = True
) -> tuple[sac.EvalResult, sac.EvalResult | None, np.ndarray, dict[str, float]]:
    """Train every run for ``num_chunks`` chunks, then evaluate every actor (deterministic)
    on ``num_episodes`` held-out episodes and, if ``pool_eval``, as many of its own training
    pool; returns the two :class:`~course_lib.offpolicy.sac.EvalResult` of ``[R]`` rates,
    what every run really took (``[R, 2]``: env steps, read from its state, and gradient
    updates, read from its actor's Adam step count: :func:`budget_taken`) and the
    wall-clock seconds of each phase (``setup``: compiling the programs, the initial
    states; ``train``; ``evaluate``).

    ``sweep.runs`` says how the runs execute (:data:`RUN_MODES`, :func:`resolve_runs`).
    Either way the ``init``, ``run_chunk`` and evaluation programs are compiled first, side
    by side (one thread each: the compiler is single-threaded). ``"threads"``: the one-run
    programs, called once per run on a pool of two threads (one per core of the course's
    CPU machines). ``"vmap"``: the runs stacked, every program vmapped over them (the
    accelerator's way): one call per chunk for every run, no per-run Python work, the
    next chunk queued while one runs; one evaluation call for every run, held out and on
    its training pool together.
    """
    run = sweep.run_config
    r = sweep.num_runs
    k_held, k_pool = jax.random.split(key)
    clock = _Clock()
    mode = resolve_runs(sweep)
    learners = padded_learners(sweep, grid.keys, env)
    init, chunk = sweep_programs(run, env, vmapped=mode == "vmap")
    bar = _chunk_bar(progress, run.num_chunks)
    if mode == "vmap":
        # Held-out and training-pool evaluation are rows of one program: the [R] actors
        # twice, each row with its own key and params (held-out rows k_held, pool rows k_pool).
        n_eval = 2 if sweep.pool_eval else 1
        eval_keys = jnp.stack([k_held] * r + [k_pool] * r)[: n_eval * r]
        eval_params = _concat([grid.held_out, grid.train][:n_eval])
        shapes = jax.eval_shape(init, grid.keys, grid.train)
        actor_shape = jax.tree.map(
            lambda s: jax.ShapeDtypeStruct((n_eval * r,) + s.shape[1:], s.dtype), shapes.learner.actor
        )
        sac.compile_together(
            [
                (init, (grid.keys, grid.train)),
                (chunk, (shapes, grid.train)),
                (evaluate_runs, (actor_shape, eval_keys, eval_params, sweep.num_episodes, env)),
            ]
        )
        states = jax.block_until_ready(init(grid.keys, grid.train)._replace(learner=learners))
        clock.lap("setup")
        with bar as ticks:
            # One chunk stays queued behind the running one (the device never waits for
            # Python); the bar ticks when a chunk's metrics (not donated) are ready.
            pending = None
            for _ in range(run.num_chunks):
                states, metrics = chunk(states, grid.train)
                if pending is not None:
                    jax.block_until_ready(pending)
                    ticks.update(1)
                pending = metrics
            jax.block_until_ready(pending)
            ticks.update(1)
        taken = np.asarray(jax.vmap(budget_taken)(states))
        clock.lap("train")
        actors = _concat([states.learner.actor] * n_eval)
        both = jax.device_get(evaluate_runs(actors, eval_keys, eval_params, sweep.num_episodes, env))
        held = sac.EvalResult(*(x[:r] for x in both))
        pool = sac.EvalResult(*(x[r:] for x in both)) if sweep.pool_eval else None
        return held, pool, taken, clock.lap("evaluate")

    params, held_params = _unstack(grid.train, r), _unstack(grid.held_out, r)
    shapes = jax.eval_shape(init, grid.keys[0], params[0])
    actor_shape = jax.tree.map(lambda s: jax.ShapeDtypeStruct((1,) + s.shape, s.dtype), shapes.learner.actor)
    sac.compile_together(
        [
            (init, (grid.keys[0], params[0])),
            (chunk, (shapes, params[0])),
            (sac.evaluate_policies, (("actor",), actor_shape, k_held, params[0], sweep.num_episodes, env)),
        ]
    )
    runs = [init(k, p)._replace(learner=lr) for k, p, lr in zip(grid.keys, params, _unstack(learners, r))]
    clock.lap("setup")
    with bar as ticks, ThreadPoolExecutor(2) as threads:
        for _ in range(run.num_chunks):
            runs = list(threads.map(lambda s, p: jax.block_until_ready(chunk(s, p)[0]), runs, params))
            ticks.update(1)
        taken = np.stack([np.asarray(budget_taken(s)) for s in runs])
        clock.lap("train")
        actors = [jax.tree.map(lambda x: x[None], s.learner.actor) for s in runs]
        n = sweep.num_episodes
        held_list = list(
            threads.map(lambda a, p: jax.device_get(_evaluate_one(a, k_held, p, n, env)), actors, held_params)
        )
        pool_list = None
        if sweep.pool_eval:
            pool_list = list(
                threads.map(lambda a, p: jax.device_get(_evaluate_one(a, k_pool, p, n, env)), actors, params)
            )
    merge = lambda rs: sac.EvalResult(*(jnp.concatenate(x) for x in zip(*rs)))  # noqa: E731
    return merge(held_list), (merge(pool_list) if pool_list is not None else None), taken, clock.lap("evaluate")


def budget_taken(state: TrainState) -> Array:
    """``[env steps, gradient updates]`` a run has taken: its ``env_steps`` counter and its
    actor's Adam step count (one per update; the warm-up's skipped updates do not count)."""
    count = optax.tree_utils.tree_get(state.learner.actor_opt, "count")
    return jnp.stack([state.env_steps, count]).astype(jnp.int32)


class _Clock:
    """Wall-clock seconds of consecutive phases: ``lap(name)`` ends the phase ``name``."""

    def __init__(self) -> None:
        self.t, self.laps = time.perf_counter(), dict[str, float]()

    def lap(self, name: str) -> dict[str, float]:
        now = time.perf_counter()
        self.laps[name], self.t = now - self.t, now
        return self.laps


@functools.partial(jax.jit, static_argnames=("num_episodes", "env"))
def evaluate_runs(actors: MLP, keys: Array, params: PoolParams, num_episodes: int, env: ScenarioPool) -> sac.EvalResult:
    """Each actor of ``actors [R]`` (deterministic) on ``num_episodes`` episodes of its own
    params ``params [R]`` with its own key ``keys [R]``, one vmapped program (rows with the
    same key and params meet the same scenarios). Returns ``[R]`` rates."""

    def one(actor: MLP, k: Array, p: PoolParams) -> sac.EvalResult:
        result = sac.run_evaluation(("actor",), jax.tree.map(lambda x: x[None], actor), k, p, num_episodes, env)
        return sac.EvalResult(*(x[0] for x in result))

    return jax.vmap(one)(actors, keys, params)


def _evaluate_one(actor: MLP, key: Array, params: PoolParams, num_episodes: int, env: ScenarioPool) -> sac.EvalResult:
    """One actor (a leading axis of 1) on ``num_episodes`` episodes of ``params``: ``[1]`` rates."""
    return sac.evaluate_policies(("actor",), actor, key, params, num_episodes, env)


# ---------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------


class CellRates(NamedTuple):
    """Evaluation rates of every cell, numpy arrays ``[W, K, S]`` (width, pool size, seed):
    the fields of :class:`~course_lib.offpolicy.sac.EvalResult`."""

    accuracy: np.ndarray
    collision_rate: np.ndarray
    offroad_rate: np.ndarray
    progress_ratio: np.ndarray
    episode_return: np.ndarray


class SweepResult(NamedTuple):
    """Evaluation of every cell. ``held_out`` and ``train_pool``: :class:`CellRates`
    ``[W, K, S]`` (width, pool size, seed) of the deterministic policy: on held-out scenarios, and on the run's own training
    pool (``None`` unless ``pool_eval``). ``env_steps`` and ``updates`` ``[W, K, S]``: what
    every run took, read from its final state (all equal: the budget is fixed); ``seconds``: the sweep's wall-clock time per phase
    (``setup``, ``train``, ``evaluate``, and ``total``, compilation included)."""

    widths: tuple[int, ...]
    pool_sizes: tuple[int, ...]
    env_steps: np.ndarray
    updates: np.ndarray
    held_out: CellRates
    train_pool: CellRates | None
    seconds: dict[str, float]


def scaling_sweep(
    sweep: SweepConfig,
    key: Array,
    progress: bool = True,
    env: Any = None,
    env_params: Any = None,
    info_fn: Callable[[Any, Any], dict[str, Array]] | None = None,
) -> SweepResult:
    """Train every (width, pool size, seed) run for the same env steps and updates, then
    evaluate every actor on held-out scenarios (and on its training pool).

    ``env`` is a base env module (default :mod:`course_lib.envs.driving`, ``env_params``
    its ``DEFAULT_PARAMS``), wrapped here in a :class:`~course_lib.envs.scenarios.ScenarioPool`
    (``info_fn``: the base env's episode-metrics function, default ``env.episode_metrics``).

    Returns:
        :class:`SweepResult` (rates ``[W, K, S]``).
    """
    t0 = time.perf_counter()
    check_sweep(sweep)
    base, base_params = sac.default_env(env, env_params)
    pool_env = ScenarioPool(base, info_fn)
    k_runs, k_eval = jax.random.split(key)
    grid = run_grid(sweep, k_runs, base_params)
    held, pool, taken, seconds = train_and_evaluate(sweep, grid, pool_env, k_eval, progress)
    shape = (len(sweep.widths), len(sweep.pool_sizes), sweep.num_seeds)

    def cells(result: sac.EvalResult) -> CellRates:
        return CellRates(*(np.asarray(x).reshape(shape) for x in jax.device_get(result)))

    held_out, train_pool = cells(held), (cells(pool) if pool is not None else None)
    return SweepResult(
        sweep.widths,
        sweep.pool_sizes,
        taken[:, 0].reshape(shape),
        taken[:, 1].reshape(shape),
        held_out,
        train_pool,
        seconds | {"total": time.perf_counter() - t0},
    )


# ---------------------------------------------------------------------------------------
# Reading the result
# ---------------------------------------------------------------------------------------


def mean_se(x: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error of the mean (``std(ddof=1) / sqrt(n)``) along ``axis`` (the seeds)."""
    x = np.asarray(x, np.float64)
    n = x.shape[axis]
    return x.mean(axis), x.std(axis, ddof=1) / math.sqrt(n)


def pool_label(k: int) -> str:
    """``"K=4"``, or ``"K=inf"`` for :data:`UNLIMITED`."""
    return "K=inf" if k == UNLIMITED else f"K={k:,}"


def _one_value(x: np.ndarray) -> str:
    """``"24,000"`` if every run took the same, else ``"min..max"``."""
    lo, hi = int(np.min(x)), int(np.max(x))
    return f"{lo:,}" if lo == hi else f"{lo:,}..{hi:,}"


def sweep_table(result: SweepResult, decimals: int = 2) -> str:
    """The grid as text, mean +- standard error over seeds: one row per width, one column
    per pool size; held-out accuracy, then collision and off-road rates, then (if measured)
    the accuracy on the run's own training pool."""
    head = "width | " + " | ".join(f"{pool_label(k):>11}" for k in result.pool_sizes)
    blocks = [("held-out accuracy", result.held_out.accuracy)]
    blocks += [("held-out collision rate", result.held_out.collision_rate)]
    blocks += [("held-out off-road rate", result.held_out.offroad_rate)]
    if result.train_pool is not None:
        blocks.append(("training-pool accuracy", result.train_pool.accuracy))
    steps, updates = _one_value(result.env_steps), _one_value(result.updates)
    rows = [f"{steps} env steps and {updates} updates per run; mean +- s.e. over seeds"]
    for title, values in blocks:
        rows += ["", title, head, "-" * len(head)]
        mean, se = mean_se(values)
        for i, w in enumerate(result.widths):
            cells = [f"{m:.{decimals}f} +- {s:.{decimals}f}" for m, s in zip(mean[i], se[i])]
            rows.append(f"{w:>5} | " + " | ".join(f"{c:>11}" for c in cells))
    return "\n".join(rows)


class Findings(NamedTuple):
    """What a sweep shows, computed from its numbers (held-out accuracy, paired by seed).

    Differences are paired: run ``(w, k, j)`` and ``(w', k', j)`` share seed ``j``'s key.
    A difference "separates" when ``|mean| > z x s.e.``.

    Attributes:
        diversity_gain: ``[W]`` mean of held-out accuracy at the largest ``K`` minus at the smallest.
        diversity_se: ``[W]`` its standard error.
        width_gap: ``[K]`` mean of the widest minus the narrowest width's held-out accuracy.
        width_se: ``[K]`` its standard error.
        memorisation_gap: ``[W, K]`` training-pool minus held-out accuracy (NaN if not measured).
        z: the threshold used.
    """

    widths: tuple[int, ...]
    pool_sizes: tuple[int, ...]
    diversity_gain: np.ndarray
    diversity_se: np.ndarray
    width_gap: np.ndarray
    width_se: np.ndarray
    memorisation_gap: np.ndarray
    z: float

    @property
    def diversity_separates(self) -> bool:
        """More distinct scenarios help every width by more than ``z`` standard errors."""
        return bool(np.all(self.diversity_gain > self.z * self.diversity_se))

    @property
    def width_order(self) -> tuple[str, ...]:
        """Per pool size: ``"wide"`` (widest ahead by > z s.e.), ``"narrow"``, or ``"tie"``."""
        out = []
        for g, s in zip(self.width_gap, self.width_se):
            out.append("wide" if g > self.z * s else "narrow" if g < -self.z * s else "tie")
        return tuple(out)

    @property
    def crossover(self) -> bool:
        """V-Max's pattern: the narrow width ahead at the smallest ``K``, the wide one at the largest."""
        return self.width_order[0] == "narrow" and self.width_order[-1] == "wide"

    def summary(self, decimals: int = 2) -> str:
        """The findings in words, numbers rounded to ``decimals``."""
        f = f".{decimals}f"
        lo, hi = pool_label(self.pool_sizes[0]), pool_label(self.pool_sizes[-1])
        lines = []
        for w, g, s in zip(self.widths, self.diversity_gain, self.diversity_se):
            lines.append(f"width {w}: held-out accuracy {hi} minus {lo}: {g:+{f}} +- {s:{f}} (s.e.)")
        for k, g, s, o in zip(self.pool_sizes, self.width_gap, self.width_se, self.width_order):
            lines.append(
                f"{pool_label(k)}: width {self.widths[-1]} minus width {self.widths[0]}: {g:+{f}} +- {s:{f}} -> {o}"
            )
        lines.append(self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        """The findings as sentences without numbers (stable across machines when the
        effects are clear; a borderline effect can flip between machines)."""
        diversity = (
            "more distinct scenarios raise held-out accuracy at every width"
            if self.diversity_separates
            else f"the diversity effect does not separate from seed noise at {self.z:g} s.e. for every width"
        )
        orders = ", ".join(f"{pool_label(k)}: {o}" for k, o in zip(self.pool_sizes, self.width_order))
        cross = "a crossover (narrow ahead on little data, wide ahead on more)" if self.crossover else "no crossover"
        return f"{diversity}; width ordering ({orders}): {cross}."


def sweep_findings(result: SweepResult, z: float = 2.0) -> Findings:
    """Compute what ``result`` shows (:class:`Findings`): the diversity effect per width
    (largest ``K`` minus smallest, held out), the width ordering per ``K`` (widest minus
    narrowest), whether it crosses over, and the memorisation gap (training pool minus
    held out). Nothing is assumed: every verdict is a comparison of a paired mean with
    ``z`` standard errors."""
    acc = np.asarray(result.held_out.accuracy, np.float64)  # [W, K, S]
    diversity_gain, diversity_se = mean_se(acc[:, -1] - acc[:, 0])
    width_gap, width_se = mean_se(acc[-1] - acc[0])
    if result.train_pool is None:
        memorisation = np.full(acc.shape[:2], np.nan)
    else:
        memorisation = (np.asarray(result.train_pool.accuracy, np.float64) - acc).mean(-1)
    return Findings(
        result.widths, result.pool_sizes, diversity_gain, diversity_se, width_gap, width_se, memorisation, z
    )


# ---------------------------------------------------------------------------------------
# A recorded result: JSON on disk, and the command line that writes it
# ---------------------------------------------------------------------------------------

#: The version of the file :func:`save_result` writes and :func:`load_result` reads.
FORMAT_VERSION = 1
_KIND = "course_lib.offpolicy.sweep.SweepResult"


def _array_to_json(x: np.ndarray) -> dict[str, Any]:
    a = np.asarray(x)
    return {"dtype": a.dtype.str, "shape": list(a.shape), "data": a.ravel().tolist()}


def _array_from_json(d: dict[str, Any]) -> np.ndarray:
    return np.asarray(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"])


def _rates_to_json(rates: CellRates | None) -> dict[str, Any] | None:
    return None if rates is None else {name: _array_to_json(getattr(rates, name)) for name in CellRates._fields}


def _rates_from_json(d: dict[str, Any]) -> CellRates:
    return CellRates(*(_array_from_json(d[name]) for name in CellRates._fields))


def save_result(result: SweepResult, path: str | os.PathLike[str], meta: dict[str, Any]) -> Path:
    """Write ``result`` and ``meta`` to ``path`` as JSON (format :data:`FORMAT_VERSION`),
    every array with its dtype and shape (floats as JSON numbers: the round trip through
    :func:`load_result` is exact). ``meta`` must be JSON-serialisable (:func:`run_meta` makes
    one). The file is written whole or not at all (a temporary file, then renamed)."""
    path = Path(path)
    doc = {
        "format": FORMAT_VERSION,
        "kind": _KIND,
        "result": {
            "widths": list(result.widths),
            "pool_sizes": list(result.pool_sizes),
            "env_steps": _array_to_json(result.env_steps),
            "updates": _array_to_json(result.updates),
            "held_out": _rates_to_json(result.held_out),
            "train_pool": _rates_to_json(result.train_pool),
            "seconds": {k: float(v) for k, v in result.seconds.items()},
        },
        "meta": meta,
    }
    text = json.dumps(doc, indent=1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)
    return path


def load_result(path: str | os.PathLike[str]) -> tuple[SweepResult, dict[str, Any]]:
    """Read a file :func:`save_result` wrote: ``(SweepResult, meta)``, arrays with the dtypes
    and shapes they were saved with.

    Raises:
        FileNotFoundError: no file at ``path`` (saying the command that makes one).
        ValueError: the file is not a sweep result, or of another format version.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no recorded sweep result at {path}; record one with "
            f"`python -m course_lib.offpolicy.sweep --scale full --seed 11 --out {path}` (on a GPU)"
        )
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not a sweep result file (not JSON: {err})") from err
    if not isinstance(doc, dict) or doc.get("kind") != _KIND or "format" not in doc:
        raise ValueError(f"{path} is not a sweep result file (no 'format' and 'kind': {_KIND!r})")
    if doc["format"] != FORMAT_VERSION:
        raise ValueError(
            f"{path} is sweep result format {doc['format']!r}, this course_lib reads format {FORMAT_VERSION}; "
            "record it again with `python -m course_lib.offpolicy.sweep`"
        )
    r = doc["result"]
    result = SweepResult(
        tuple(int(w) for w in r["widths"]),
        tuple(int(k) for k in r["pool_sizes"]),
        _array_from_json(r["env_steps"]),
        _array_from_json(r["updates"]),
        _rates_from_json(r["held_out"]),
        None if r["train_pool"] is None else _rates_from_json(r["train_pool"]),
        {k: float(v) for k, v in r["seconds"].items()},
    )
    return result, doc["meta"]


def sweep_config_from_dict(d: dict[str, Any]) -> SweepConfig:
    """The :class:`SweepConfig` of ``dataclasses.asdict(config)`` (e.g. a recorded result's
    ``meta["sweep"]``), its :class:`~course_lib.offpolicy.sac.SACConfig` included."""
    fields = dict(d)
    fields["widths"] = tuple(fields["widths"])
    fields["pool_sizes"] = tuple(fields["pool_sizes"])
    fields["sac"] = SACConfig(**fields["sac"])
    return SweepConfig(**fields)


def run_meta(sweep: SweepConfig, seed: int, command: str, **extra: Any) -> dict[str, Any]:
    """What a recorded result says about its run: the config (:func:`dataclasses.asdict`,
    read back by :func:`sweep_config_from_dict`), the master key's seed, how the runs
    executed, the devices, the jax version, the UTC date and time, the command; ``extra``
    added as given."""
    devices = jax.devices()
    return {
        "sweep": dataclasses.asdict(sweep),
        "seed": seed,
        "runs": resolve_runs(sweep),
        "num_runs": sweep.num_runs,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in devices],
        "device_kind": devices[0].device_kind,
        "jax_version": jax.__version__,
        "python_version": sys.version.split()[0],
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),  # noqa: UP017 (3.10)
        "command": command,
    } | extra


#: The sweeps the command line knows by ``--scale``.
SCALES = {"cpu": CPU_SWEEP, "full": FULL_SWEEP}


def record(
    sweep: SweepConfig,
    seed: int,
    out: str | os.PathLike[str],
    command: str,
    progress: bool = True,
    env: Any = None,
    env_params: Any = None,
    info_fn: Callable[[Any, Any], dict[str, Array]] | None = None,
    **meta: Any,
) -> SweepResult:
    """Run ``sweep`` with master key ``jax.random.key(seed)``, print the table, the findings
    and the seconds, and save the result with its :func:`run_meta` to ``out`` (what the
    command line does; ``env``, ``env_params``, ``info_fn`` as for :func:`scaling_sweep`)."""
    print(
        f"sweep: {sweep.num_runs} runs ({resolve_runs(sweep)}) of {sweep.run_config.env_steps_per_run:,} env steps "
        f"and {sweep.run_config.updates_per_run:,} updates; {jax.default_backend()} {jax.devices()}",
        flush=True,
    )
    result = scaling_sweep(
        sweep, jax.random.key(seed), progress=progress, env=env, env_params=env_params, info_fn=info_fn
    )
    print(sweep_table(result))
    print()
    print(sweep_findings(result).summary())
    print()
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in result.seconds.items()))
    path = save_result(result, out, run_meta(sweep, seed, command, **meta))
    print(f"saved {path}", flush=True)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments (``python -m course_lib.offpolicy.sweep --help``)."""
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.offpolicy.sweep",
        description="Run lesson 06's width x distinct-scenarios sweep and record its result as JSON "
        "(read it back with course_lib.offpolicy.sweep.load_result).",
    )
    parser.add_argument("--scale", choices=sorted(SCALES), default="cpu", help="cpu: CPU_SWEEP; full: FULL_SWEEP")
    parser.add_argument("--seed", type=int, default=11, help="seed of the master key jax.random.key(SEED)")
    parser.add_argument("--out", required=True, help="path of the JSON file to write")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.offpolicy.sweep --scale {cpu,full} --seed 11 --out PATH``."""
    args = parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m course_lib.offpolicy.sweep", *words])
    record(SCALES[args.scale], args.seed, args.out, command, progress=not args.no_progress, scale=args.scale)
    return 0


if __name__ == "__main__":
    # Run the importable module's main, so that the classes in the result are
    # course_lib.offpolicy.sweep's (not copies defined in __main__).
    from course_lib.offpolicy.sweep import main as _main

    sys.exit(_main())
