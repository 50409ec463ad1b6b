r"""Model size x data size for SAC on the driving env (lesson 06), after V-Max's scaling table.

V-Max (Charraut et al. 2025, arXiv 2503.08388) reports that larger networks do worse than
small ones when trained on little data and overtake them with more. :func:`scaling_sweep`
measures the same grid for :mod:`course_lib.offpolicy.sac`: a few network widths (actor and
critics) against a few amounts of experience (env steps), each cell the deterministic
policy's accuracy over ``num_episodes`` evaluation episodes, for several seeds.

Two things make the whole grid **one** compiled training program and one evaluation program:

- **Every width is trained inside the widest network.** A width-``w`` network is embedded
  in the width-``W`` one by padding its weights with zeros: a hidden unit whose incoming
  weights and bias are 0 outputs ``relu(0) = 0``, and since JAX defines ``relu'(0) = 0``,
  no gradient ever reaches its weights (Adam's update of a parameter whose gradients are
  all 0 is exactly 0). The padded network computes the narrow one's function and follows
  its training step for step (:func:`pad_learner`; tested), so every (width, seed) run has
  the same shapes: one compiled one-seed ``run_chunk`` serves them all (and the lesson's
  main run of the same config), each run in its own thread (on 2 CPU cores that is faster
  than one vmapped program: :func:`course_lib.offpolicy.sac.train`). On a GPU, ``jax.vmap`` over
  the runs is the natural form. The price: every width costs what the widest does.
- **Every data size is a snapshot of one run.** The learning rates are constant, so the
  first ``n`` env steps of a long run are exactly a run of ``n`` env steps; the actors are
  kept at each budget and evaluated together at the end.

The ``cpu`` scale (:data:`CPU_SWEEP`) is a reduced grid that fits a notebook on two CPU
cores; :data:`FULL_SWEEP` is V-Max's kind of grid for a GPU (not run on CPU machines).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from course_lib.offpolicy import sac
from course_lib.offpolicy.sac import MLP, ContinuousEnv, Learner, SACConfig, TrainState


@dataclass(frozen=True)
class SweepConfig:
    """The grid and the SAC run every cell shares (its ``width`` and ``total_env_steps`` are
    set from ``widths`` and ``budgets``)."""

    widths: tuple[int, ...] = field(default=(16, 64), metadata={"help": "hidden widths, actor and critics"})
    budgets: tuple[int, ...] = field(
        default=(16_000, 40_000, 72_000),
        metadata={"help": "env steps (all envs) after which the actors are evaluated; multiples of a chunk's"},
    )
    num_seeds: int = field(default=2, metadata={"help": "seeds per width (every run in its own thread)"})
    num_episodes: int = field(default=128, metadata={"help": "evaluation episodes per (width, budget, seed)"})
    sac: SACConfig = field(default=SACConfig(), metadata={"help": "the SAC hyperparameters every cell shares"})

    @property
    def run_config(self) -> SACConfig:
        """The SAC config of the padded runs: the widest width, the largest budget."""
        return dataclasses.replace(self.sac, width=max(self.widths), total_env_steps=max(self.budgets))


#: The ``cpu`` scale: 2 widths x 3 budgets x 2 seeds, a reduced grid for two CPU cores (25-40 s
#: with the main run's programs already compiled, load 1.5-3.5). Its cells are dominated by
#: seed noise (two seeds differ by up to 0.5 in accuracy at 16k-40k steps): it shows the
#: question and the method, not V-Max's answer.
CPU_SWEEP = SweepConfig()

#: The ``full`` scale for a GPU (not run on CPU machines): V-Max-like widths and budgets.
FULL_SWEEP = SweepConfig(
    widths=(32, 128, 512),
    budgets=(1_024_000, 4_096_000, 16_384_000),
    num_seeds=4,
    num_episodes=1024,
    sac=dataclasses.replace(sac.FULL_CONFIG, num_envs=512, steps_per_chunk=500),
)


def check_sweep(sweep: SweepConfig) -> None:
    """Refuse budgets that do not fall on chunk boundaries."""
    chunk = sweep.run_config.steps_per_chunk_env
    bad = [b for b in sweep.budgets if b % chunk]
    if bad:
        raise ValueError(f"budgets {bad} are not multiples of a chunk's {chunk} env steps")
    if sorted(sweep.budgets) != list(sweep.budgets):
        raise ValueError(f"budgets must increase, got {sweep.budgets}")


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


def init_padded(sweep: SweepConfig, key: Array, env: ContinuousEnv, env_params: Any) -> list[TrainState]:
    """Initial states of every (width, seed) run, width-major: seed ``j`` starts from the
    same envs at every width (``init`` of the shared one-seed program), and each width's
    networks are initialised at that width (``fan_in`` scaling included), then padded."""
    run = sweep.run_config
    init, _ = sac.jitted_programs(run, env, env_params)
    opt = sac.make_optimizers(run)
    keys = jax.random.split(key, sweep.num_seeds)
    states = []
    for width in sweep.widths:
        narrow_config = dataclasses.replace(run, width=width)
        narrow_opt = sac.make_optimizers(narrow_config)

        @jax.jit
        def padded(k: Array, config: SACConfig = narrow_config, o: sac.Optimizers = narrow_opt) -> Learner:
            narrow = sac.init_learner(jax.random.fold_in(k, 1), config, env.OBS_DIM, env.ACTION_DIM, o)
            return pad_learner(narrow, run.width, opt)

        states += [init(k)._replace(learner=padded(k)) for k in keys]
    return states


# ---------------------------------------------------------------------------------------
# The sweep
# ---------------------------------------------------------------------------------------


class SweepResult(NamedTuple):
    """Evaluation of every cell: arrays ``[W, B, S]`` (width, budget, seed)."""

    widths: tuple[int, ...]
    budgets: tuple[int, ...]
    accuracy: np.ndarray
    collision_rate: np.ndarray
    offroad_rate: np.ndarray
    progress_ratio: np.ndarray
    episode_return: np.ndarray


def scaling_sweep(
    sweep: SweepConfig,
    key: Array,
    progress: bool = True,
    env: ContinuousEnv | None = None,
    env_params: Any = None,
) -> SweepResult:
    """Train every (width, seed) up to the largest budget, keep the actors at each budget,
    then evaluate them all on the same episodes in one program.

    Every run has the widest network's shapes, so all of them are calls of one compiled
    one-seed ``run_chunk`` (:func:`course_lib.offpolicy.sac.jitted_programs`, shared with
    :func:`course_lib.offpolicy.sac.train` for the same config), each run in its own thread on a
    CPU; on an accelerator the runs are stacked and run as one vmapped program.

    Returns:
        :class:`SweepResult` (deterministic-policy rates, ``[W, B, S]``).
    """
    check_sweep(sweep)
    env, env_params = sac.default_env(env, env_params)
    run = sweep.run_config
    k_init, k_eval = jax.random.split(key)
    states = init_padded(sweep, k_init, env, env_params)
    run_chunks = _threaded_chunks if jax.default_backend() == "cpu" else _vmapped_chunks
    stops = {b // run.steps_per_chunk_env for b in sweep.budgets}
    snapshots: list[MLP] = []
    with sac.chunk_progress(progress, run.num_chunks, "sweep chunks") as bar:
        for actors_now in run_chunks(run, env, env_params, states, stops):
            if actors_now is not None:
                snapshots.append(actors_now)
            bar.update(1)
    actors = jax.tree.map(lambda *xs: jnp.concatenate(xs), *snapshots)  # [B * W * S]
    result = sac.evaluate(actors, k_eval, env_params, sweep.num_episodes, env=env)
    shape = (len(sweep.budgets), len(sweep.widths), sweep.num_seeds)
    cells = [np.asarray(x).reshape(shape).transpose(1, 0, 2) for x in result]
    return SweepResult(sweep.widths, sweep.budgets, *cells)


def _threaded_chunks(
    run: SACConfig, env: ContinuousEnv, env_params: Any, states: list[TrainState], stops: set[int]
) -> Iterator[MLP | None]:
    """Every chunk of every run, one thread per run; yields after each chunk the actors
    ``[n_runs]`` stacked where the chunk ends a budget (``stops``), else ``None``."""
    _, chunk = sac.jitted_programs(run, env, env_params)
    with ThreadPoolExecutor(len(states)) as pool:
        for i in range(1, run.num_chunks + 1):
            states = list(pool.map(lambda s: jax.block_until_ready(chunk(s)[0]), states))
            yield jax.tree.map(lambda *xs: jnp.stack(xs), *[s.learner.actor for s in states]) if i in stops else None


def _vmapped_chunks(
    run: SACConfig, env: ContinuousEnv, env_params: Any, states: list[TrainState], stops: set[int]
) -> Iterator[MLP | None]:
    """:func:`_threaded_chunks` as one vmapped program over the stacked runs (for accelerators)."""
    _, chunk = sac.jitted_programs(run, env, env_params, vmapped=True)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
    for i in range(1, run.num_chunks + 1):
        stacked, _ = chunk(stacked)
        yield jax.tree.map(jnp.copy, stacked.learner.actor) if i in stops else None


def sweep_table(result: SweepResult) -> str:
    """The grid as text: one row per width, one column per budget, accuracy mean +- spread
    (min-max over seeds)."""
    head = "width | " + " | ".join(f"{b:>9,} steps" for b in result.budgets)
    rows = [head, "-" * len(head)]
    for i, w in enumerate(result.widths):
        cells = []
        for j in range(len(result.budgets)):
            acc = result.accuracy[i, j]
            cells.append(f"{acc.mean():.2f} [{acc.min():.2f}-{acc.max():.2f}]")
        rows.append(f"{w:>5} | " + " | ".join(f"{c:>15}" for c in cells))
    return "\n".join(rows)
