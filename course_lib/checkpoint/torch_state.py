"""A torch training state on disk: safetensors for tensors, JSON for the rest, one atomic commit.

Resuming bit-exact needs more than the weights. A checkpoint directory holds::

    model.safetensors      the model's state_dict                          name -> tensor
    optimizer.safetensors  the optimizer's tensor state (Adam: exp_avg, exp_avg_sq, step)
                           keyed "<param index>.<name>", as optimizer.state_dict() numbers them
    rng.safetensors        torch's global CPU RNG state and the generator's state (uint8)
    state.json             step, optimizer param_groups (lr, betas, ...) and non-tensor
                           state, python's and numpy's global RNG states, and ``extra``
                           (the caller's: data position, history, config)
    manifest.json          sha256 + size of each of the above (course_lib.checkpoint.atomic)

safetensors holds raw tensor bytes and a JSON header: no pickle, so loading runs no code,
and tensors load exactly (bitwise). JSON floats round-trip exactly too (``repr``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from course_lib.checkpoint.atomic import CheckpointError, CorruptCheckpoint, commit
from course_lib.checkpoint.crash import KillPoint

if TYPE_CHECKING:
    import torch
    from torch import nn

MODEL = "model.safetensors"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
STATE = "state.json"


def _to_bytes(tensors: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.detach().cpu().clone().contiguous() for k, v in tensors.items()})


def _split_optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``({"<i>.<name>": tensor}, {"param_groups": ..., "scalars": {"<i>": {name: value}}})``."""
    import torch

    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for index, state in sd["state"].items():
        for name, value in state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{name}"] = value
            else:
                scalars.setdefault(str(index), {})[name] = value
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def save_torch_state(
    root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator | None = None,
    extra: dict[str, Any] | None = None,
    kill_point: KillPoint | None = None,
) -> Path:
    """Commit checkpoint ``step`` of a torch training state under ``root``; return its directory.

    Saved: ``model.state_dict()``, the optimizer's state (tensors and param_groups),
    torch's global CPU RNG state, ``generator``'s state, python's and numpy's global RNG
    states, and ``extra`` (JSON-able: the data position, per-step history, ...). Written
    through :func:`course_lib.checkpoint.atomic.commit` (``kill_point`` is passed on:
    ``"mid_save"`` dies after ``model.safetensors``, before the rest).

    Raises:
        CheckpointError: for a bad root/step, a step already committed, or ``extra`` that
            is not JSON-able.
    """
    import torch

    opt_tensors, opt_rest = _split_optimizer_state(optimizer)
    rng = {"torch_cpu": torch.get_rng_state()}
    if generator is not None:
        rng["generator"] = generator.get_state()
    state = {
        "step": step,
        "optimizer": opt_rest,
        "python_random": random.getstate(),
        "numpy_random": _numpy_state(),
        "extra": extra or {},
    }
    try:
        state_json = json.dumps(state).encode()
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"save_torch_state: extra must be JSON-able (numbers, str, lists, dicts): {e}") from None
    files = {MODEL: _to_bytes(model.state_dict()), OPTIMIZER: _to_bytes(opt_tensors), RNG: _to_bytes(rng)}
    files[STATE] = state_json
    return commit(
        root, step, files, metadata={"format": "torch_state/1", "torch": torch.__version__}, kill_point=kill_point
    )


def _read_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    try:
        return load((path / name).read_bytes())
    except FileNotFoundError:
        raise CorruptCheckpoint(path, name, "missing") from None
    except OSError:  # EIO, EACCES, ESTALE: not corruption, never a reason to fall back
        raise
    except Exception as e:  # safetensors raises its own SafetensorError for a bad header
        raise CorruptCheckpoint(path, name, f"not a readable safetensors file ({e})") from None


def _read_state(path: Path) -> dict[str, Any]:
    try:
        state: dict[str, Any] = json.loads((path / STATE).read_text())
    except FileNotFoundError:
        raise CorruptCheckpoint(path, STATE, "missing") from None
    except ValueError as e:
        raise CorruptCheckpoint(path, STATE, f"not valid JSON ({e})") from None
    return state


def check_model_tensors(path: Path, model: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Raise :class:`CheckpointError` naming each tensor of ``tensors`` that does not fit ``model``:
    missing, unexpected, or of another shape or dtype."""
    expected = model.state_dict()
    problems = [f"{k}: missing from the checkpoint" for k in expected if k not in tensors]
    problems += [f"{k}: not in the model" for k in tensors if k not in expected]
    for k, v in tensors.items():
        if k in expected and (v.shape != expected[k].shape or v.dtype != expected[k].dtype):
            problems.append(
                f"{k}: checkpoint has {tuple(v.shape)} {v.dtype}, model has {tuple(expected[k].shape)} {expected[k].dtype}"
            )
    if problems:
        raise CheckpointError(
            f"checkpoint {path / MODEL} does not fit this model: "
            + "; ".join(problems)
            + ". Build the model with the configuration the checkpoint was saved with, or use another checkpoint root"
        )


def _optimizer_state_dict(path: Path, tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        index, _, name = key.partition(".")
        if not index.isdigit() or not name:
            raise CorruptCheckpoint(path, OPTIMIZER, f"tensor name {key!r} is not '<param index>.<name>'")
        state.setdefault(int(index), {})[name] = value
    for index, values in rest["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    return {"state": state, "param_groups": rest["param_groups"]}


def load_torch_state(
    path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator | None = None
) -> dict[str, Any]:
    """Restore a :func:`save_torch_state` checkpoint at ``path`` in place; return its ``extra``.

    Everything is read and checked before anything is changed: a checkpoint that does not
    fit leaves ``model``, ``optimizer`` and the RNGs as they were. Call it on a verified
    directory (:func:`course_lib.checkpoint.atomic.restore_latest` does).

    Raises:
        CheckpointError: the model's tensors differ from the checkpoint's (the message
            names each tensor, with both shapes), or the optimizer's parameter groups do.
        CorruptCheckpoint: a file is missing or not parseable (restore falls back over it).
        OSError: reading failed (EIO, EACCES): propagated.
    """
    import torch

    path = Path(path)
    model_tensors = _read_tensors(path, MODEL)
    opt_tensors = _read_tensors(path, OPTIMIZER)
    rng = _read_tensors(path, RNG)
    state = _read_state(path)
    check_model_tensors(path, model, model_tensors)
    if generator is not None and "generator" not in rng:
        raise CheckpointError(f"checkpoint {path} was saved without a generator; pass generator=None to load it")
    opt_sd = _optimizer_state_dict(path, opt_tensors, state["optimizer"])
    saved_sizes = [len(g["params"]) for g in opt_sd["param_groups"]]
    sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != sizes:
        raise CheckpointError(
            f"checkpoint {path / OPTIMIZER}: parameter groups of sizes {saved_sizes}, this optimizer has {sizes}; "
            "build the optimizer over the same parameters, in the same order"
        )
    _restore_tuples(opt_sd["param_groups"], optimizer.param_groups)
    with torch.no_grad():
        model.load_state_dict(model_tensors, strict=True)
    optimizer.load_state_dict(opt_sd)
    torch.set_rng_state(rng["torch_cpu"])
    if generator is not None:
        generator.set_state(rng["generator"])
    random.setstate(_as_tuples(state["python_random"]))
    _set_numpy_state(state["numpy_random"])
    extra: dict[str, Any] = state["extra"]
    return extra


def _restore_tuples(saved: list[dict[str, Any]], current: list[dict[str, Any]]) -> None:
    """JSON turned hyperparameter tuples (Adam's ``betas``) into lists: make them tuples
    again where the optimizer has a tuple."""
    for saved_group, group in zip(saved, current, strict=True):
        for key, value in saved_group.items():
            if isinstance(group.get(key), tuple) and isinstance(value, list):
                saved_group[key] = tuple(value)


def _as_tuples(value: Any) -> Any:
    """JSON turned python's RNG state tuples into lists; turn them back."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list) else value


def _numpy_state() -> list[Any]:
    """numpy's legacy global RNG state (``np.random.get_state()``) as JSON-able values."""
    state: Any = np.random.get_state(legacy=True)
    name, key, pos, has_gauss, gauss = state
    return [name, key.tolist(), int(pos), int(has_gauss), float(gauss)]


def _set_numpy_state(saved: list[Any]) -> None:
    name, key, pos, has_gauss, gauss = saved
    np.random.set_state((name, np.asarray(key, dtype=np.uint32), pos, has_gauss, gauss))
