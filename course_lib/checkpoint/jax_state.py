"""JAX train state on Orbax: asynchronous saves, keep-last-N, and checksummed restores.

A thin layer over :class:`orbax.checkpoint.CheckpointManager`, the JAX ecosystem's own
checkpointer. Orbax brings the parts that are hard to get right: an atomic commit (each
step is written into ``<step>.orbax-checkpoint-tmp`` and renamed to ``<step>`` only once
every file is written), asynchronous saves (the call returns once the arrays are copied to
host memory; a background thread writes them, eq. 10.4), and a preservation policy that
keeps the last N steps. :class:`JaxCheckpoints` adds what Orbax does not have:

- **integrity**: Orbax keeps no manifest of whole files (tensorstore's OCDBT checks CRC-32C
  on what a restore reads, below, but names no file and cannot be checked before loading),
  so once a step is committed we *seal* it: we write our manifest (sha256 and size of every file, :func:`course_lib.checkpoint.atomic.
  write_manifest`) into its directory. A restore verifies the manifest first; a truncated or
  corrupted file raises :class:`~course_lib.checkpoint.atomic.CorruptCheckpoint` naming the
  file, and :meth:`JaxCheckpoints.restore_latest` falls back to the previous step. Any other
  error (EIO, permissions, a wrong template) propagates, and a folder whose every step fails
  verification is refused rather than restarted from scratch.
- **typed PRNG keys**: a ``key<fry>`` leaf is saved as its ``uint32`` key data
  (:func:`jax.random.key_data`) and rewrapped with the template's implementation on restore.
- **any pytree** (NamedTuples, registered dataclasses): leaves are saved under flat names,
  their tree paths kept in the step's JSON metadata, and checked against the template.

The rule for a committed step without a manifest (*unsealed*: the process died between
Orbax's commit and our seal, which a background thread writes right after the commit):
Orbax renames the temporary directory only after every file in
it is written and closed, and a SIGKILL cannot undo writes the kernel already holds, so a
crash can leave a step unsealed but never committed and partial. An unsealed step is
therefore restored if Orbax restores it without error, and then sealed. That check is not
empty: Orbax's array format (tensorstore's OCDBT) fails on a missing, short or bit-flipped
data file or metadata file (measured on every file of a step: each damage of a file the
restore reads raised, none loaded wrong values). The manifest adds what OCDBT does not
cover, and a named file in the error.

Shapes: whatever the state pytree holds; nothing is reshaped. Saving blocks for the
device-to-host copy of the state (``C_block = S / B_copy``, eq. 10.4) when asynchronous,
for the whole write when blocking.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple, Self

import jax
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers

from course_lib.checkpoint.atomic import MANIFEST, CheckpointError, CorruptCheckpoint, verify_manifest, write_manifest

log = logging.getLogger(__name__)

PyTree = Any
#: Names of the two items of every step: the arrays (Orbax ``StandardSave``) and our JSON.
STATE, META = "state", "meta"
#: Where :meth:`JaxCheckpoints.restore_latest` moves a step it could not restore.
QUARANTINE = "quarantine"
#: tensorstore's status codes for damaged bytes: a CRC-32C mismatch, a file shorter than its index says.
INTEGRITY_CODES = ("DATA_LOSS", "OUT_OF_RANGE")


class Restored(NamedTuple):
    """What :meth:`JaxCheckpoints.restore_latest` found.

    Attributes:
        step: the step restored (the newest one that verified).
        state: the state pytree, the template's structure, every leaf a ``jax.Array``.
        skipped: one line per newer step that could not be restored, naming the bad file
            (those steps were moved to ``<root>/quarantine/``).
    """

    step: int
    state: PyTree
    skipped: list[str]


def _is_key(leaf: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)


def _paths(state: PyTree) -> list[str]:
    """Each leaf's tree path (``.runner.params``, ``['metrics']['losses/total']``)."""
    return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]


def _flat(state: PyTree) -> dict[str, Any]:
    """``{leaf_000: array, ...}`` in tree order, typed keys as their ``uint32`` key data."""
    leaves = jax.tree_util.tree_leaves(state)
    return {f"leaf_{i:03d}": jax.random.key_data(x) if _is_key(x) else x for i, x in enumerate(leaves)}


def _abstract(template: PyTree) -> dict[str, Any]:
    """The restore target of :func:`_flat`'s layout: shape and dtype of each template leaf."""
    return {name: ocp.utils.to_shape_dtype_struct(x) for name, x in jax.eval_shape(_flat, template).items()}


def _unflat(template: PyTree, arrays: dict[str, Any]) -> PyTree:
    """Put restored arrays back into the template's tree, rewrapping typed keys."""
    leaves, treedef = jax.tree_util.tree_flatten(template)
    out = []
    for i, leaf in enumerate(leaves):
        data = arrays[f"leaf_{i:03d}"]
        out.append(jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf)) if _is_key(leaf) else data)
    return jax.tree_util.tree_unflatten(treedef, out)


class JaxCheckpoints:
    """Checkpoints of one run under ``root``: ``root/<step>/`` per step, the last ``keep`` kept.

    Use as a context manager (``close`` waits for the last save and its seal)::

        with JaxCheckpoints(root, keep=3, async_save=True) as ckpts:
            found = ckpts.restore_latest(template)       # None on a fresh run
            ...
            blocked_s = ckpts.save(step, state, metadata={"update": step})

    One step's life: ``save`` (host copy; blocks) -> Orbax writes the files (background) ->
    ``before_commit`` -> Orbax commits (rename) -> ``before_seal`` -> our manifest (sealed).
    With ``async_save`` everything after the host copy runs in background threads (Orbax's,
    then a sealer that waits for Orbax's commit and hashes the files), so the training loop
    blocks only for ``C_block = S / B_copy`` (eq. 10.4); the next ``save``, ``wait`` or
    ``close`` joins them.

    Args:
        root: the run's checkpoint directory (created).
        keep: how many committed steps Orbax keeps (``preservation_policy=LatestN(keep)``,
            what ``max_to_keep`` became: that option is deprecated in orbax-checkpoint 0.12).
        async_save: ``True``: :meth:`save` returns after the host copy; ``False``: it
            returns once the step is committed and sealed.
        before_commit: fault injection (``KillPoint(step, "mid_save")``): called with the
            step in Orbax's background thread once every file is written, before the commit;
            asynchronous saves only.
        before_seal: fault injection (``KillPoint(step, "after_save")``): called with the
            step once Orbax has committed it, before our manifest is written.
        process_index: this process's index in a multi-host job (default
            ``jax.process_index()``). Only process 0 writes to shared state outside Orbax: it
            seals steps and quarantines unreadable ones; any other process verifies and
            restores but leaves a bad step in place (skipped, for process 0 to move). A
            test fakes the index; a real multi-host job also needs the processes to agree on
            the step restored (a barrier), which this class does not do.
    """

    def __init__(
        self,
        root: Path | str,
        keep: int = 3,
        async_save: bool = True,
        before_commit: Callable[[int], None] | None = None,
        before_seal: Callable[[int], None] | None = None,
        process_index: int | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1 (steps to keep), got {keep}")
        if before_commit is not None and not async_save:
            raise ValueError("before_commit runs in Orbax's background thread: it needs async_save=True")
        self.root = Path(root).absolute()
        self.process_index = jax.process_index() if process_index is None else process_index
        if self.process_index < 0:
            raise ValueError(f"process_index must be >= 0, got {self.process_index}")
        self.primary = self.process_index == 0  # the one process that seals and quarantines
        self.async_save = async_save
        self._before_commit = before_commit
        self._before_seal = before_seal
        self._in_flight: int | None = None
        self._sealer: threading.Thread | None = None
        self._sealer_error: BaseException | None = None
        async_options = ocp.AsyncOptions(post_finalization_callback=self._on_written) if async_save else None
        options = ocp.CheckpointManagerOptions(
            preservation_policy=checkpoint_managers.LatestN(n=keep),
            enable_async_checkpointing=async_save,
            async_options=async_options,
            cleanup_tmp_directories=True,  # a killed save's <step>.orbax-checkpoint-tmp is removed
        )
        self._mgr = ocp.CheckpointManager(self.root, options=options)

    # -- saving ------------------------------------------------------------------------

    def save(self, step: int, state: PyTree, metadata: dict[str, Any] | None = None) -> float:
        """Save ``state`` as ``step``; return the seconds this call blocked.

        The previous asynchronous save is joined first (Orbax runs one at a time; it is
        normally long finished). ``metadata`` (JSON) is stored beside the arrays, with the
        leaves' tree paths. Raises ValueError if ``step`` is not newer than every committed step.
        """
        start = time.perf_counter()
        self.wait()
        latest = self._mgr.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(f"step {step} is not newer than the latest checkpoint {latest} in {self.root}")
        meta = {"step": step, "paths": _paths(state), "user": metadata or {}}
        self._in_flight = step
        self._mgr.save(
            step, args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(_flat(state)), META: ocp.args.JsonSave(meta)})
        )
        if self.async_save:
            self._sealer = threading.Thread(target=self._seal_in_background, args=(step,), daemon=True)
            self._sealer.start()
        else:
            self._commit_and_seal(step)
        return time.perf_counter() - start

    def _on_written(self) -> None:
        """Orbax's post-finalization callback: every file written, not yet renamed."""
        if self._before_commit is not None and self._in_flight is not None:
            self._before_commit(self._in_flight)

    def _commit_and_seal(self, step: int) -> None:
        self._mgr.wait_until_finished()
        if self._before_seal is not None:
            self._before_seal(step)
        self._seal(step)

    def _seal_in_background(self, step: int) -> None:
        try:
            self._commit_and_seal(step)
        except BaseException as err:  # re-raised in the training thread by wait()
            self._sealer_error = err

    def wait(self) -> None:
        """Block until the save in flight is committed and sealed; raise what it raised."""
        if self._sealer is not None:
            self._sealer.join()
            self._sealer = None
        self._mgr.wait_until_finished()
        self._in_flight = None
        err, self._sealer_error = self._sealer_error, None
        if err is not None:
            raise err

    def _seal(self, step: int) -> None:
        step_dir = self.step_dir(step)
        if self.primary and not (step_dir / MANIFEST).exists():
            write_manifest(step_dir, step, metadata={"writer": "orbax", "sealed_by": "JaxCheckpoints"})

    def close(self) -> None:
        """Wait for the save in flight and its seal, and close Orbax's manager."""
        self.wait()
        self._mgr.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------

    def step_dir(self, step: int) -> Path:
        """``root/<step>``: the directory Orbax commits step ``step`` to."""
        return self.root / str(step)

    def all_steps(self) -> list[int]:
        """Committed steps, oldest first (Orbax ignores ``*.orbax-checkpoint-tmp`` directories)."""
        return sorted(self._mgr.all_steps())

    def is_sealed(self, step: int) -> bool:
        """Whether step ``step`` carries our manifest."""
        return (self.step_dir(step) / MANIFEST).exists()

    def metadata(self, step: int) -> dict[str, Any]:
        """The JSON ``metadata`` saved with step ``step``."""
        return dict(self._restore_item(step, {META: ocp.args.JsonRestore()})[META]["user"])

    def restore(self, step: int, template: PyTree) -> PyTree:
        """Restore step ``step`` into ``template``'s structure (its leaves give shapes, dtypes
        and key implementations; their values are not read).

        A sealed step is verified against its manifest first; an unsealed one is sealed once
        Orbax has restored it (see the module's rule).

        Raises:
            CorruptCheckpoint: a file of the step is missing, truncated or changed (named),
                or, for an unsealed step, tensorstore's checksum or size check failed.
            ValueError: the checkpoint's tree differs from the template's.
            OSError and other Orbax errors: propagated (not a reason to fall back).
        """
        step_dir = self.step_dir(step)
        sealed = self.is_sealed(step)
        if sealed:
            verify_manifest(step_dir)
        paths = _paths(template)
        saved = self._restore_item(step, {META: ocp.args.JsonRestore()}, unsealed=not sealed)[META]["paths"]
        if saved != paths:
            raise ValueError(
                f"checkpoint {step_dir} holds leaves {saved} but the template has {paths}: "
                "restore with a template of the state that was saved"
            )
        arrays = self._restore_item(step, {STATE: ocp.args.StandardRestore(_abstract(template))}, unsealed=not sealed)[
            STATE
        ]
        if not sealed:
            self._seal(step)
        return _unflat(template, arrays)

    def _restore_item(self, step: int, items: dict[str, Any], unsealed: bool = False) -> Any:
        """Orbax's restore of ``items`` of step ``step``.

        Only an integrity failure becomes :class:`CorruptCheckpoint`: for an ``unsealed`` step
        (no manifest), tensorstore's own checks, a CRC-32C mismatch (``DATA_LOSS``) or a short
        file (``OUT_OF_RANGE``). Everything else (EIO, a stale handle, a permission, a template
        of other shapes, a sealed step whose bytes verified) propagates: an older step would
        fail the same way, and moving steps aside for it would restart the run from scratch.
        """
        try:
            return self._mgr.restore(step, args=ocp.args.Composite(**items))
        except ValueError as err:
            if unsealed and str(err).startswith(INTEGRITY_CODES):
                raise CorruptCheckpoint(
                    self.step_dir(step), "/".join(items), f"Orbax could not restore it: {err}"
                ) from err
            raise

    def restore_latest(self, template: PyTree) -> Restored | None:
        """The newest step that restores and verifies, falling back over corrupt ones.

        A step is passed over only for an integrity failure (:class:`CorruptCheckpoint`: a
        file that does not match the manifest, or tensorstore's checksum on an unsealed step);
        any other error propagates. Once an older step restores, the newer corrupt ones are
        logged, listed in ``skipped`` with the file named, and moved to
        ``root/quarantine/<step>`` (so the run can save that step number again; by process 0
        only, others leave them in place).

        Returns None only when no step is committed (a fresh run).

        Raises:
            CheckpointError: steps are committed but none verifies; nothing is moved, and the
                run does not start from scratch over them.
        """
        self.wait()
        skipped: list[str] = []
        bad: list[int] = []
        for step in reversed(self.all_steps()):
            try:
                state = self.restore(step, template)
            except CorruptCheckpoint as err:
                line = f"step {step} skipped: {err}"
                log.warning(line)
                skipped.append(line)
                bad.append(step)
                continue
            if self.primary:
                for b in bad:
                    self._quarantine(b)
            return Restored(step, state, skipped)
        if bad:
            raise CheckpointError(
                f"every committed step in {self.root} failed verification ({'; '.join(skipped)}); "
                "refusing to start from scratch: inspect or move them, then restart"
            )
        return None

    def _quarantine(self, step: int) -> None:
        target = self.root / QUARANTINE / f"{step}.{time.time_ns()}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.step_dir(step)), str(target))
        self._mgr.reload()


def tree_equal(a: PyTree, b: PyTree) -> bool:
    """Bitwise equality of two pytrees: same structure, and every leaf ``np.array_equal``
    (NaNs equal where both are NaN; typed keys compared by their key data)."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    if str(ta) != str(tb):  # treedefs compare by structure and node data
        return False
    for x, y in zip(la, lb, strict=True):
        x = np.asarray(jax.random.key_data(x) if _is_key(x) else x)
        y = np.asarray(jax.random.key_data(y) if _is_key(y) else y)
        if x.dtype != y.dtype or not np.array_equal(x, y, equal_nan=x.dtype.kind in "fc"):
            return False
    return True
