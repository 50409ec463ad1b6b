"""Lesson 04's jitted PPO, checkpointed with Orbax and resumed bit-exact after a SIGKILL.

Lesson 04 runs a whole PPO training as one jitted program (:func:`course_lib.ppo.jax_ppo.
make_train`): nothing leaves the device until it ends, so nothing can be saved on the way.
To checkpoint it we cut the same run into *chunks*: :func:`run_chunk` is a jitted
``lax.scan`` of the same ``update_step`` (:func:`course_lib.ppo.jax_ppo.make_update_step`) over
``n`` updates, and between chunks the host saves the whole :class:`~course_lib.ppo.jax_ppo.
RunnerState` (flat parameters, Adam's moments and count, every env's state and observation,
the running episode returns, the run's PRNG key) plus the metrics so far; the update index
is the checkpoint's step. Nothing else carries state from one update to the next (the data
order of an update is drawn from the runner's key), so a run restored from step ``k`` and
run to the end is the uninterrupted run, bit for bit::

    runner_0 = init(config, key)                  (jitted, as make_train's first lines)
    for k in every, 2 every, ...:
        runner_k, metrics = run_chunk(config, runner_{k - every}, every)
        save(k, (runner_k, metrics so far))       async: blocks for the host copy (eq. 10.4)

:func:`train_checkpointed` restores the newest complete checkpoint
(:meth:`~course_lib.checkpoint.jax_state.JaxCheckpoints.restore_latest`), trains to
``config.num_updates`` and honours a :class:`~course_lib.checkpoint.crash.KillPoint`, so
tests and the lesson can SIGKILL it before, during or after a save, or mid-update, and
resume it in a fresh process.

Chunked vs one program: the chunks run the same XLA computation per update as
``make_train``'s single ``lax.scan``; on this CPU the final parameters and metrics of the
two are bitwise equal (``tests/test_checkpoint_jax.py`` checks it). XLA does not promise
that in general (a compiler may fuse a loop body differently in a different program), which
is why the bit-exact contract of this module is stated between *chunked* runs: killed and
resumed vs uninterrupted, with the same chunk length.

This module imports :mod:`course_lib.ppo.jax_ppo` first: it sets the XLA CPU flag the PPO
programs need before JAX starts its backend.
"""

from __future__ import annotations

# isort: off
from course_lib.ppo import jax_ppo as ppo_jax  # first: sets XLA_FLAGS before JAX starts a backend

# isort: on
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import jax
import numpy as np
from jax import Array
from jax.flatten_util import ravel_pytree

from course_lib.checkpoint.crash import KillPoint, maybe_kill
from course_lib.checkpoint.jax_state import JaxCheckpoints, Restored
from course_lib.ppo.config import PPOConfig
from course_lib.ppo.jax_ppo import RunnerState

Metrics = dict[str, np.ndarray]


class Progress(Protocol):
    """Anything with tqdm's ``update(n)`` (e.g. ``course_lib.progress``'s bar)."""

    def update(self, n: float | None = 1) -> bool | None: ...


class CheckpointedRun(NamedTuple):
    """What :func:`train_checkpointed` returns.

    Attributes:
        runner: the final :class:`RunnerState` (after ``config.num_updates`` updates).
        metrics: ``{name: [num_updates]}`` per-update metrics of the whole run (those from
            before a resume come from the checkpoint).
        resumed_from: the update index restored from, None for a fresh start.
        skipped: newer checkpoints that failed verification (each names the bad file).
        updates_run: updates this call computed (work redone after a failure included).
        save_blocked_s: seconds each save blocked the training loop.
        seconds: wall-clock seconds of the call.
    """

    runner: RunnerState
    metrics: Metrics
    resumed_from: int | None
    skipped: list[str]
    updates_run: int
    save_blocked_s: list[float]
    seconds: float


@functools.partial(jax.jit, static_argnums=0)
def _init(config: PPOConfig, key: Array) -> RunnerState:
    return ppo_jax.init_runner(config, key, config.lr)[0]


def init(config: PPOConfig, key: Array) -> RunnerState:
    """The run's first :class:`RunnerState`, exactly as ``make_train(config)(key)`` starts
    (``config.lr``; jitted, one program per config)."""
    ppo_jax.check_config(config)
    return _init(config, key)


@functools.lru_cache(maxsize=16)
def _chunk_program(config: PPOConfig, n_updates: int) -> Callable[[RunnerState], tuple[RunnerState, dict[str, Array]]]:
    """``jit(runner -> lax.scan(update_step, runner, None, n_updates))``, built once per
    ``(config, n_updates)`` (so compiled once per chunk length)."""
    unravel = ravel_pytree(ppo_jax.init_params(jax.random.key(0), hidden=config.hidden))[1]  # layout only
    optimizer = ppo_jax.make_optimizer(config, config.lr)
    update_step = ppo_jax.make_update_step(config, unravel, optimizer)
    return jax.jit(lambda runner: jax.lax.scan(update_step, runner, None, n_updates))


def run_chunk(config: PPOConfig, runner: RunnerState, n_updates: int) -> tuple[RunnerState, dict[str, Array]]:
    """``n_updates`` PPO updates from ``runner``: the new runner and ``{name: [n_updates]}``
    metrics (``make_train``'s ``metrics`` for those updates)."""
    if n_updates < 1:
        raise ValueError(f"n_updates must be >= 1, got {n_updates}")
    return _chunk_program(config, n_updates)(runner)


def _template(config: PPOConfig, key_seed: int) -> dict[str, Any]:
    """The checkpointed state of a run at its start: the runner and empty metric buffers."""
    runner = init(config, jax.random.key(key_seed))
    shapes = jax.eval_shape(lambda r: run_chunk(config, r, 1)[1], runner)
    metrics = {name: np.zeros(config.num_updates, s.dtype) for name, s in shapes.items()}
    return {"runner": runner, "metrics": metrics}


def _record(metrics: Metrics, chunk: dict[str, Array], start: int) -> Metrics:
    """New buffers (never mutated after: an async save may still be reading the old ones)."""
    out = {name: buf.copy() for name, buf in metrics.items()}
    for name, values in chunk.items():
        out[name][start : start + len(values)] = np.asarray(values)
    return out


def _run_metadata(config: PPOConfig, key_seed: int) -> dict[str, Any]:
    """What identifies a run: its seed and every hyperparameter (JSON)."""
    return {"key_seed": key_seed, "config": dataclasses.asdict(config)}


def _check_same_run(ckpts: JaxCheckpoints, found: Restored | None, expected: dict[str, Any]) -> None:
    """Refuse to resume another run's checkpoint (another seed or config under the same root)."""
    if found is None:
        return
    saved = ckpts.metadata(found.step)
    if {k: saved.get(k) for k in expected} != expected:
        raise ValueError(
            f"{ckpts.step_dir(found.step)} is a checkpoint of another run "
            f"(seed {saved.get('key_seed')}, config {saved.get('config')}); this run is seed "
            f"{expected['key_seed']}, config {expected['config']}: use another root or delete it"
        )


def restore_run(config: PPOConfig, key_seed: int, root: Path | str) -> tuple[int, RunnerState, Metrics] | None:
    """The newest complete checkpoint of a run under ``root``: ``(update, runner, metrics)``,
    or None if there is none."""
    with JaxCheckpoints(root, async_save=False) as ckpts:
        found = ckpts.restore_latest(_template(config, key_seed))
    if found is None:
        return None
    return found.step, found.state["runner"], {k: np.asarray(v) for k, v in found.state["metrics"].items()}


def train_checkpointed(
    config: PPOConfig,
    key_seed: int,
    root: Path | str,
    every: int,
    async_save: bool,
    kill_point: KillPoint | None = None,
    progress: Progress | None = None,
    keep: int = 3,
) -> CheckpointedRun:
    """Train PPO to ``config.num_updates``, resuming from the newest complete checkpoint in
    ``root`` and saving every ``every`` updates (and at the end).

    ``kill_point`` SIGKILLs this process (:mod:`course_lib.checkpoint.crash`) at update
    ``kill_point.step``: ``"mid_update"`` after computing that update, before it is saved;
    ``"before_save"`` before saving checkpoint ``step``; ``"mid_save"`` (``async_save``
    only) in Orbax's background thread, every file written, before the commit;
    ``"after_save"`` once Orbax committed it, before our manifest seals it. ``progress.update(n)`` is called
    after each chunk with the updates it ran.

    Raises:
        ValueError: ``every < 1``, or a ``"mid_save"`` kill point with ``async_save=False``.
    """
    if every < 1:
        raise ValueError(f"every must be >= 1 update, got {every}")
    if kill_point is not None and kill_point.phase == "mid_save" and not async_save:
        raise ValueError("a mid_save kill point needs async_save=True (it runs in Orbax's background thread)")
    start_time = time.perf_counter()

    def before_commit(step: int) -> None:
        maybe_kill(kill_point, step, "mid_save")

    def before_seal(step: int) -> None:
        maybe_kill(kill_point, step, "after_save")

    blocked: list[float] = []
    ran = 0
    with JaxCheckpoints(
        root,
        keep=keep,
        async_save=async_save,
        before_commit=before_commit if async_save else None,
        before_seal=before_seal,
    ) as ckpts:
        template = _template(config, key_seed)
        found = ckpts.restore_latest(template)
        _check_same_run(ckpts, found, _run_metadata(config, key_seed))
        state = found.state if found is not None else template
        done = found.step if found is not None else 0
        runner, metrics = state["runner"], {k: np.asarray(v) for k, v in state["metrics"].items()}
        while done < config.num_updates:
            n = min(every - done % every, config.num_updates - done)
            runner, chunk = run_chunk(config, runner, n)
            jax.block_until_ready(runner)
            for k in range(done + 1, done + n + 1):
                maybe_kill(kill_point, k, "mid_update")
            metrics, done, ran = _record(metrics, chunk, done), done + n, ran + n
            maybe_kill(kill_point, done, "before_save")
            blocked.append(
                ckpts.save(
                    done,
                    {"runner": runner, "metrics": metrics},
                    metadata=_run_metadata(config, key_seed) | {"update": done},
                )
            )
            if progress is not None:
                progress.update(n)
    return CheckpointedRun(
        runner,
        metrics,
        None if found is None else found.step,
        [] if found is None else found.skipped,
        ran,
        blocked,
        time.perf_counter() - start_time,
    )


def train_checkpointed_in_child(
    config: PPOConfig, key_seed: int, root: str, every: int, async_save: bool, kill_point: KillPoint | None
) -> None:
    """A child target for :func:`course_lib.checkpoint.crash.run_in_child`: resume and train
    (the result is the final checkpoint on disk)."""
    train_checkpointed(config, key_seed, root, every, async_save, kill_point)
