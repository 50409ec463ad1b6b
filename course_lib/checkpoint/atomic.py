"""The commit protocol: a checkpoint is either complete and verified, or it does not exist.

A save that dies half way (SIGKILL, a full disk, a lost host) must never leave something
that loads as valid but wrong, and must never replace the last good checkpoint. The
protocol, the one every checkpoint of lesson 10 goes through::

    commit(root, step, files):
        tmp = root/.tmp-step_XXXXXXXX-<pid>-<random>/       a private, hidden directory
        write every file into tmp; fsync each               data durable
        write tmp/manifest.json (sha256 + size per file)    temp file, fsync, os.replace
        fsync(tmp)                                           names durable
        os.replace(tmp, root/step_XXXXXXXX)                  the commit point: one rename
        fsync(root)                                          the rename durable

    restore(root):
        for step_* newest first:
            verify manifest (every listed file: present, size, sha256)
            load; return it                                  skip (and report) corrupt ones

A reader never looks at ``.tmp-*`` directories, so a kill anywhere before the rename
leaves only garbage that :func:`keep_last` removes once its writer is dead; a kill after
it leaves a complete checkpoint. The manifest catches what the rename cannot: a file
truncated or bit-flipped later, on disk or in a copy.

:func:`write_manifest` and :func:`verify_manifest` work on any directory, so checkpoints
written by other libraries (Orbax step directories) get the same check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from course_lib.checkpoint.crash import KillPoint, maybe_kill

log = logging.getLogger(__name__)

#: The manifest's file name inside a checkpoint directory.
MANIFEST = "manifest.json"
#: Committed checkpoints are ``root/step_XXXXXXXX`` (zero padded: names sort as numbers).
STEP_PREFIX = "step_"
#: In-progress writes are ``root/.tmp-step_XXXXXXXX-<pid>-<random>``: hidden, never read.
TMP_PREFIX = ".tmp-"
#: Quarantined corrupt checkpoints are ``root/.corrupt-step_XXXXXXXX-<random>``.
CORRUPT_PREFIX = ".corrupt-"
MANIFEST_FORMAT = 1
_STEP_RE = re.compile(r"^step_(\d{8,})$")
_TMP_RE = re.compile(r"^\.tmp-step_\d{8,}-(\d+)-[0-9a-f]+$")
_CHUNK = 1 << 20

T = TypeVar("T")


class CheckpointError(RuntimeError):
    """A checkpoint operation was asked for something it cannot do (bad root, bad step,
    nothing to restore, a step already committed); the message says how to fix it."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint directory does not match its manifest (or has none).

    Attributes:
        path: the checkpoint directory.
        file: the file at fault, relative to ``path`` (``manifest.json`` for the manifest).
        reason: what is wrong with it (missing, truncated, sha256 mismatch, ...).
    """

    def __init__(self, path: Path, file: str, reason: str) -> None:
        self.path = Path(path)
        self.file = file
        self.reason = reason
        super().__init__(
            f"corrupt checkpoint {self.path}: {file}: {reason}. "
            f"restore falls back to the previous checkpoint; delete {self.path} to silence this"
        )


@dataclass(frozen=True)
class FileEntry:
    """One file of a manifest: its sha256 (hex) and its size in bytes."""

    sha256: str
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint directory holds: ``step``, ``{relative posix path: FileEntry}``
    and free-form JSON ``metadata`` (the writer's; e.g. library versions)."""

    step: int
    files: dict[str, FileEntry]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        """The manifest as JSON text (sorted keys, stable across runs)."""
        return json.dumps(
            {
                "format": MANIFEST_FORMAT,
                "step": self.step,
                "files": {name: {"sha256": e.sha256, "bytes": e.bytes} for name, e in sorted(self.files.items())},
                "metadata": self.metadata,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Manifest:
        """Parse :meth:`to_json`'s output; ``ValueError``/``KeyError``/``TypeError`` if it is not one."""
        raw = json.loads(text)
        if raw.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unknown manifest format {raw.get('format')!r} (expected {MANIFEST_FORMAT})")
        files = {str(k): FileEntry(sha256=str(v["sha256"]), bytes=int(v["bytes"])) for k, v in raw["files"].items()}
        return cls(step=int(raw["step"]), files=files, metadata=dict(raw["metadata"]))


@dataclass(frozen=True)
class Restored(Generic[T]):
    """What :func:`restore_latest` returns: the ``value`` loaded from checkpoint ``step``
    at ``path``, and the newer checkpoints it ``skipped`` as ``(path, reason)``."""

    step: int
    value: T
    path: Path
    skipped: list[tuple[Path, str]]


def step_dir(root: Path, step: int) -> Path:
    """``root/step_XXXXXXXX``: where checkpoint ``step`` is committed."""
    return Path(root) / f"{STEP_PREFIX}{step:08d}"


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the names in it (a new file, a rename) survive a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """fsync a file's data to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, flush, fsync (not atomic by itself: see :func:`commit`)."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _digest(path: Path, fsync: bool) -> FileEntry:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            n += len(chunk)
        if fsync:
            os.fsync(f.fileno())
    return FileEntry(sha256=h.hexdigest(), bytes=n)


def _files_under(directory: Path) -> list[str]:
    """Relative posix paths of the regular files under ``directory``, sorted, except the manifest
    (and its temp files)."""
    out = []
    for p in directory.rglob("*"):
        rel = p.relative_to(directory).as_posix()
        if p.is_file() and not p.is_symlink() and rel != MANIFEST and not rel.startswith(f".{MANIFEST}"):
            out.append(rel)
    return sorted(out)


def write_manifest(
    directory: Path, step: int, metadata: dict[str, Any] | None = None, fsync_files: bool = True
) -> Manifest:
    """Digest every regular file under ``directory`` and write ``directory/manifest.json`` atomically.

    Files are found recursively (relative posix paths; symlinks and the manifest itself
    are left out), each hashed with sha256 and, with ``fsync_files``, fsynced, so the
    data is durable before the manifest that vouches for it. The manifest goes to a temp
    file in the same directory, is flushed and fsynced, ``os.replace``\\d into place, and
    the directory is fsynced. Works on any directory (e.g. an Orbax step directory once
    Orbax has finalised it).

    Raises:
        CheckpointError: if ``directory`` is not a directory or ``step < 0``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"write_manifest: {directory} is not a directory; write the checkpoint's files first")
    _check_step(step)
    files = {rel: _digest(directory / rel, fsync_files) for rel in _files_under(directory)}
    manifest = Manifest(step=step, files=files, metadata=dict(metadata or {}))
    tmp = directory / f".{MANIFEST}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    write_bytes_durably(tmp, manifest.to_json().encode())
    os.replace(tmp, directory / MANIFEST)
    fsync_dir(directory)
    return manifest


def verify_manifest(directory: Path) -> Manifest:
    """Check ``directory`` against its manifest; return the manifest if every listed file matches.

    Checked per listed file: it exists, its size (a truncated file), its sha256 (flipped
    bits). Files the manifest does not list are allowed and ignored: the manifest vouches
    for what the writer wrote, and tools may add files next to it later (a library's own
    marker or metadata file); our loaders read only listed files. A listed path that
    escapes the directory (absolute, ``..``) counts as corrupt.

    Raises:
        CorruptCheckpoint: naming the file at fault: the manifest missing, not text or
            not a manifest, or a listed file missing, truncated/grown, or with other bytes.
        OSError: reading failed (EIO, EACCES, ESTALE): not a reason to fall back.
    """
    directory = Path(directory)
    try:
        text = (directory / MANIFEST).read_text()
    except FileNotFoundError:
        raise CorruptCheckpoint(directory, MANIFEST, "missing (the save did not finish)") from None
    except UnicodeDecodeError as e:  # other OSErrors (EIO, EACCES, ESTALE) are not corruption: they propagate
        raise CorruptCheckpoint(directory, MANIFEST, f"not text ({e})") from None
    try:
        manifest = Manifest.from_json(text)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCheckpoint(directory, MANIFEST, f"not a valid manifest ({type(e).__name__}: {e})") from None
    for rel, entry in manifest.files.items():
        _verify_file(directory, rel, entry)
    return manifest


def _verify_file(directory: Path, rel: str, entry: FileEntry) -> None:
    if rel.startswith("/") or ".." in Path(rel).parts:
        raise CorruptCheckpoint(directory, rel, "listed path escapes the checkpoint directory")
    path = directory / rel
    if not path.is_file():
        raise CorruptCheckpoint(directory, rel, "listed in the manifest but missing")
    size = path.stat().st_size
    if size != entry.bytes:
        raise CorruptCheckpoint(directory, rel, f"size {size} bytes, manifest says {entry.bytes} (truncated?)")
    actual = _digest(path, fsync=False).sha256
    if actual != entry.sha256:
        raise CorruptCheckpoint(
            directory, rel, f"sha256 {actual[:12]}... != manifest {entry.sha256[:12]}... (bytes changed)"
        )


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be an int >= 0, got {step!r}")


def _check_root(root: Path) -> Path:
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"checkpoint root {root} is a file, not a directory; pass a directory")
    return root


def commit(
    root: Path,
    step: int,
    write: Callable[[Path], None] | dict[str, bytes],
    metadata: dict[str, Any] | None = None,
    kill_point: KillPoint | None = None,
) -> Path:
    """Write checkpoint ``step`` under ``root`` atomically; return ``root/step_XXXXXXXX``.

    ``write`` is either ``{relative name: bytes}`` or a function that writes the files
    into the directory it is given. See the module docstring for the protocol: a private
    ``.tmp-*`` directory, fsync every file, the manifest, ``os.replace`` to the final
    name, fsync ``root``. ``kill_point`` kills the process at ``"before_save"`` (nothing
    written), ``"mid_save"`` (the first file written, or for a ``write`` function all of
    its files, but no manifest, no rename) or ``"after_save"`` (committed).

    Raises:
        CheckpointError: ``root`` is a file, ``step < 0``, a name is not a plain relative
            path, or checkpoint ``step`` is already committed (never replaced silently).
    """
    root = _check_root(root)
    _check_step(step)
    final = step_dir(root, step)
    if final.exists():
        raise CheckpointError(
            f"checkpoint step {step} is already committed at {final}; a resumed run continues after the newest "
            f"checkpoint (restore_latest), or delete {final} to write it again"
        )
    maybe_kill(kill_point, step, "before_save")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        _write_files(tmp, step, write, kill_point)
        write_manifest(tmp, step, metadata, fsync_files=True)
        if final.exists():
            raise CheckpointError(f"checkpoint step {step} was committed at {final} by another writer meanwhile")
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root)
    maybe_kill(kill_point, step, "after_save")
    return final


def _write_files(
    tmp: Path, step: int, write: Callable[[Path], None] | dict[str, bytes], kill_point: KillPoint | None
) -> None:
    if callable(write):
        write(tmp)
        maybe_kill(kill_point, step, "mid_save")
        return
    for i, (name, data) in enumerate(write.items()):
        if not name or name.startswith("/") or ".." in Path(name).parts or name == MANIFEST:
            raise CheckpointError(f"file name {name!r} must be a relative path inside the checkpoint, not {MANIFEST}")
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_durably(path, data)
        if i == 0:
            maybe_kill(kill_point, step, "mid_save")


def list_steps(root: Path) -> list[int]:
    """Committed checkpoint steps under ``root`` (``step_XXXXXXXX`` dirs), ascending; ``[]`` if none.

    Committed means renamed into place; it says nothing of whether the files are still
    intact (see :func:`latest_complete`). ``.tmp-*`` and ``.corrupt-*`` dirs are not listed.
    """
    root = _check_root(root)
    if not root.exists():
        return []
    steps = [int(m.group(1)) for p in root.iterdir() if p.is_dir() and (m := _STEP_RE.match(p.name))]
    return sorted(steps)


def latest_complete(
    root: Path, verify: bool = True, skipped: list[tuple[Path, str]] | None = None
) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest committed checkpoint that verifies; ``None`` if there is none.

    Corrupt ones (:class:`CorruptCheckpoint`) are skipped, logged as warnings and
    appended to ``skipped`` as ``(path, reason)``. ``verify=False`` trusts the newest
    committed one without reading it.
    """
    for step in reversed(list_steps(root)):
        path = step_dir(root, step)
        if not verify:
            return step, path
        try:
            verify_manifest(path)
        except CorruptCheckpoint as e:
            _report_skip(path, str(e), skipped)
            continue
        return step, path
    return None


def _report_skip(path: Path, reason: str, skipped: list[tuple[Path, str]] | None) -> None:
    log.warning("skipping checkpoint %s: %s", path, reason)
    if skipped is not None:
        skipped.append((path, reason))


def restore_latest(root: Path, load: Callable[[Path], T]) -> Restored[T]:
    """Load the newest checkpoint under ``root`` that verifies and loads, falling back over corrupt ones.

    Newest first: :func:`verify_manifest`, then ``load(path)``. A checkpoint is skipped
    (and reported in ``Restored.skipped`` and the log) when verification or ``load``
    raises :class:`CorruptCheckpoint`; a loader raises that for "this checkpoint is
    unusable, try an older one". Any other exception from ``load`` (a model of another
    shape, a bug) propagates: older checkpoints would fail the same way.

    Raises:
        CheckpointError: ``root`` is a file, or holds no checkpoint that verifies and
            loads (the message lists what was skipped and why).
    """
    root = _check_root(root)
    skipped: list[tuple[Path, str]] = []
    for step in reversed(list_steps(root)):
        path = step_dir(root, step)
        try:
            verify_manifest(path)
            value = load(path)
        except CorruptCheckpoint as e:
            _report_skip(path, str(e), skipped)
            continue
        return Restored(step=step, value=value, path=path, skipped=skipped)
    raise NoCheckpoint(root, skipped)


class NoCheckpoint(CheckpointError):
    """:func:`restore_latest` found nothing to restore; ``skipped`` lists the corrupt ones."""

    def __init__(self, root: Path, skipped: list[tuple[Path, str]]) -> None:
        self.root = root
        self.skipped = skipped
        if not skipped:
            what = f"no committed checkpoint (step_XXXXXXXX dir) in {root}"
            advice = "Start from scratch, or point at the right directory"
        else:
            what = f"every checkpoint in {root} is corrupt: " + "; ".join(r for _, r in skipped)
            advice = "Inspect or move them: starting from scratch would discard a run that has committed steps"
        super().__init__(f"nothing to restore: {what}. {advice}")


def quarantine(path: Path) -> Path:
    """Rename a corrupt committed checkpoint to ``.corrupt-step_XXXXXXXX-<random>`` beside it.

    Readers stop seeing it, the step can be written again, and the bytes stay for a
    post-mortem. Returns the new path.
    """
    path = Path(path)
    target = path.parent / f"{CORRUPT_PREFIX}{path.name}-{secrets.token_hex(4)}"
    os.replace(path, target)
    fsync_dir(path.parent)
    log.warning("quarantined corrupt checkpoint %s as %s", path, target.name)
    return target


def _writer_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def keep_last(root: Path, n: int) -> list[Path]:
    """Delete all but the newest ``n`` committed checkpoints, and stale ``.tmp-*`` dirs; return what was deleted.

    The newest checkpoint that verifies is always kept, even when newer corrupt ones
    fill the ``n``. A ``.tmp-step_*-<pid>-*`` dir is deleted only when process ``pid`` is
    gone (its writer can never finish it); a live writer's is left alone (a reused pid
    keeps garbage a little longer, never deletes a live write).

    Raises:
        CheckpointError: for ``n < 1`` or a ``root`` that is a file.
    """
    root = _check_root(root)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise CheckpointError(f"keep_last needs n >= 1 checkpoints to keep, got {n!r}")
    if not root.exists():
        return []
    steps = list_steps(root)
    keep = set(steps[-n:])
    newest = latest_complete(root)
    if newest is not None:
        keep.add(newest[0])
    doomed = [step_dir(root, s) for s in steps if s not in keep]
    for p in root.iterdir():
        m = _TMP_RE.match(p.name)
        if m and p.is_dir() and not _writer_alive(int(m.group(1))):
            doomed.append(p)
    for p in doomed:
        _delete(p)
    return doomed


def _delete(path: Path) -> None:
    """Delete a checkpoint dir: first rename it out of sight (atomic, a ``.tmp-*`` name of
    this process), then remove it, so a kill mid-delete never leaves a half-deleted
    ``step_*`` that readers see."""
    if not path.name.startswith(TMP_PREFIX):
        hidden = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}-{secrets.token_hex(4)}"
        os.replace(path, hidden)
        fsync_dir(path.parent)
        path = hidden
    shutil.rmtree(path, ignore_errors=True)
