"""Lesson 01's REINFORCE on CartPole as a resumable loop: killed any number of times, bit-exact.

The loop of :func:`course_lib.rl.reinforce.train_reinforce`, with a checkpoint every
``every`` updates and a restore at the start::

    model, Adam, generator <- fresh from config.seed
    if root holds a complete checkpoint:                   restore_latest (falls back over corrupt)
        weights, Adam state, generator + global RNG states, update index, history <- it
    for update in start .. n_updates - 1:
        batch <- collect_episodes(envs, reset seed = seed * 100_003 + update, generator)
        reinforce_update(policy, Adam, batch)              (eq. 01.7)
        if (update + 1) % every == 0 or last: save_torch_state(step = update + 1)

Checkpoint ``step`` N holds the state after N updates. Everything the next update reads is
in it: the weights, Adam's moments and step count, the action generator's state, and the
update index (the data position: it seeds the env resets). So a run killed at any point
and resumed in a fresh process ends with parameters bitwise equal to an uninterrupted run.
``leave_out`` restores all but one piece (a careless resume, for the lesson's demonstration):
the run then departs from the uninterrupted one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from course_lib.checkpoint.atomic import CheckpointError, NoCheckpoint, keep_last, quarantine, restore_latest
from course_lib.checkpoint.crash import KillPoint, maybe_kill
from course_lib.checkpoint.torch_state import load_torch_state, save_torch_state
from course_lib.rl.reinforce import ReinforceConfig, collect_episodes, make_env, policy_for, reinforce_update

if TYPE_CHECKING:
    import torch
    from torch import nn

log = logging.getLogger(__name__)

#: Config fields a resumed run may change (everything else must match the checkpoint's).
RESUMABLE_CHANGES = ("n_updates",)


@dataclass
class ResumableResult:
    """What :func:`train_reinforce_checkpointed` returns.

    Attributes:
        params: ``[n_params]`` float32, the final policy parameters, flat (``parameters()`` order).
        returns: ``[n_updates, n_envs]`` every episode's return, the restored history included.
        resumed_from: the checkpoint steps resumed from on the way to this result, in order
            (a run that died before its next save leaves no trace in the checkpoints, so none here).
        saved: the checkpoint steps this process committed.
        skipped: ``(path, reason)`` of corrupt checkpoints passed over (and quarantined) on restore.
        save_seconds: wall-clock seconds this process spent saving (blocking).
        seconds: wall-clock seconds of this process's run.
    """

    params: NDArray[np.float32]
    returns: NDArray[np.float64]
    resumed_from: list[int]
    saved: list[int] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    save_seconds: float = 0.0
    seconds: float = 0.0


def flat_params(policy: nn.Module) -> NDArray[np.float32]:
    """``[n_params]`` the policy's parameters concatenated (a copy)."""
    import torch

    return torch.cat([p.detach().reshape(-1) for p in policy.parameters()]).numpy().copy()


def _check_config(config: ReinforceConfig, saved: dict[str, Any], path: Path) -> None:
    ours = asdict(config)
    diff = [
        f"{k}: checkpoint {saved.get(k)!r}, now {v!r}"
        for k, v in ours.items()
        if k not in RESUMABLE_CHANGES and saved.get(k) != v
    ]
    if diff:
        raise CheckpointError(
            f"checkpoint {path} was written by a run with another configuration ({'; '.join(diff)}); "
            "resume with the same config or use a fresh checkpoint root"
        )


def _restore(
    config: ReinforceConfig, root: Path, policy: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator
) -> tuple[int, dict[str, Any], list[tuple[Path, str]]]:
    """``(start update, restored extra or {}, skipped)``; quarantines corrupt checkpoints passed over once an
    older one restores; raises NoCheckpoint when checkpoints are committed but none verifies."""

    def load(path: Path) -> dict[str, Any]:
        return load_torch_state(path, policy, optimizer, generator)

    try:
        restored = restore_latest(root, load)
    except NoCheckpoint as e:
        if e.skipped:  # committed checkpoints exist but none verifies: never restart from 0 over them
            raise
        return 0, {}, []
    for path, _ in restored.skipped:
        quarantine(path)
    _check_config(config, restored.value["config"], restored.path)
    if restored.step > config.n_updates:
        raise CheckpointError(
            f"checkpoint {restored.path} is at update {restored.step}, past n_updates={config.n_updates}; "
            "raise n_updates or use a fresh checkpoint root"
        )
    log.info("resumed from step %d (%s)", restored.step, restored.path)
    return restored.step, restored.value, restored.skipped


#: The pieces of the state that ``leave_out`` can leave out of a restore.
PIECES = ("generator", "optimizer")


def train_reinforce_checkpointed(
    config: ReinforceConfig,
    root: Path,
    every: int,
    kill_point: KillPoint | None = None,
    progress: Callable[[int, Any], None] | None = None,
    keep: int = 3,
    leave_out: str | None = None,
) -> ResumableResult:
    """Train REINFORCE to ``config.n_updates``, resuming from ``root`` and checkpointing every ``every`` updates.

    See the module docstring for the loop. Checkpoints are ``root/step_XXXXXXXX`` (``step``
    = updates done), saved after every ``every``-th update and after the last, keeping the
    newest ``keep``. ``kill_point`` kills this process at a named point (for the kill tests
    and the lesson's demonstration): ``KillPoint(s, "mid_update")`` during the update that
    makes step ``s``; the save phases at saving checkpoint ``s``. ``progress(update, batch)``
    is called after every update. ``leave_out`` (one of :data:`PIECES`) restores everything
    but that piece, which stays as a fresh run builds it: ``"generator"`` the action
    generator seeded from ``config.seed`` again, ``"optimizer"`` a fresh Adam (no moments,
    step count 0).

    Raises:
        ValueError: ``leave_out`` is not None or one of :data:`PIECES`.
        CheckpointError: ``every < 1``; the newest checkpoint was written with another
            config (other than ``n_updates``), is past ``n_updates``, or does not fit the model.
    """
    import torch

    if every < 1:
        raise CheckpointError(f"every must be >= 1 update between checkpoints, got {every}")
    if leave_out is not None and leave_out not in PIECES:
        raise ValueError(f"leave_out must be None or one of {PIECES}; got {leave_out!r}")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(config.torch_threads)
    envs = make_env(config)
    try:
        return _train(config, Path(root), every, keep, kill_point, progress, envs, leave_out)
    finally:
        envs.close()
        torch.set_num_threads(previous_threads)


def _train(
    config: ReinforceConfig,
    root: Path,
    every: int,
    keep: int,
    kill_point: KillPoint | None,
    progress: Callable[[int, Any], None] | None,
    envs: Any,
    leave_out: str | None = None,
) -> ResumableResult:
    import torch

    start_time = time.perf_counter()
    torch.manual_seed(config.seed)
    policy = policy_for(envs, config.hidden)
    optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    generator = torch.Generator().manual_seed(config.seed)
    start, extra, skipped = _restore(config, root, policy, optimizer, generator)
    if start > 0 and leave_out == "generator":
        generator.manual_seed(config.seed)
    if start > 0 and leave_out == "optimizer":
        optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr)
    returns: list[list[float]] = list(extra.get("returns", []))
    resumed_from: list[int] = list(extra.get("resumed_from", [])) + ([start] if extra else [])
    result = ResumableResult(
        params=flat_params(policy), returns=np.zeros(0), resumed_from=resumed_from, skipped=skipped
    )
    for update in range(start, config.n_updates):
        if config.lr_anneal:
            optimizer.param_groups[0]["lr"] = config.lr * (1.0 - update / config.n_updates)
        batch = collect_episodes(envs, policy, seed=config.seed * 100_003 + update, generator=generator)
        reinforce_update(policy, optimizer, batch, config)
        maybe_kill(kill_point, update + 1, "mid_update")
        returns.append(batch.returns.tolist())
        if progress is not None:
            progress(update, batch)
        step = update + 1
        if step % every == 0 or step == config.n_updates:
            t0 = time.perf_counter()
            state = {"config": asdict(config), "returns": returns, "resumed_from": resumed_from}
            save_torch_state(root, step, policy, optimizer, generator, extra=state, kill_point=kill_point)
            keep_last(root, keep)
            result.saved.append(step)
            result.save_seconds += time.perf_counter() - t0
    result.params = flat_params(policy)
    result.returns = np.array(returns, dtype=np.float64).reshape(len(returns), -1)
    result.seconds = time.perf_counter() - start_time
    return result


def train_to_file(config: ReinforceConfig, root: str, every: int, kill_point: KillPoint | None, out: str) -> None:
    """A child-process target (:func:`course_lib.checkpoint.crash.run_in_child`): run
    :func:`train_reinforce_checkpointed` and write ``params``, ``returns`` and
    ``resumed_from`` to the ``.npz`` file ``out`` (only if it finishes)."""
    result = train_reinforce_checkpointed(config, Path(root), every, kill_point=kill_point)
    np.savez(
        out, params=result.params, returns=result.returns, resumed_from=np.array(result.resumed_from, dtype=np.int64)
    )
