"""Lesson 10's graded exercises: an atomic write-then-rename commit, restoring the newest
complete checkpoint, the optimal checkpoint interval, and resuming a JAX key stream exactly.

The learner writes:

* ``commit_checkpoint(root, step, files) -> Path``  (write and fsync each file, fsync the temporary
  folder, os.replace, fsync the root folder)
* ``newest_complete(root) -> (step, path) | None``  (the newest committed checkpoint that verifies; newer
  corrupt ones quarantined, I/O errors propagated, RuntimeError when none of the committed ones verifies)
* ``optimal_interval(C, M, R) -> (tau, waste)``  (the minimiser of the exact waste, eq. 10.5)
* ``train_until(checkpoint, total_steps, step_fn) -> checkpoint``  (the carried-key split)

What each exercise teaches, and what its checks observe beyond the values:

* commit_checkpoint -- mechanism: nothing appears under the committed name before every byte and every
  name under it is durable: each file flushed and fsynced in a temporary folder inside root, the manifest
  last, the folder fsynced, one os.replace, the root fsynced; the temporary name unique to its writer
  (pid and random), and only dead writers' leftovers removed. Observed in the traced os calls (their
  order, the fsynced sizes, a directory's entries, the renamed folder's name), with a live and an exited
  writer's leftovers beside the save, and
  by crashing the save at each traced call, in the middle of each file's write (a torn write) and between
  two files, then trying again (twice after a torn write): the previous checkpoint must survive, no half
  checkpoint may appear, and the resumed attempt must commit.
* newest_complete -- mechanism: a walk of the committed names (step_<digits> in full), newest by number
  first, verifying each manifest (every size and SHA-256) and stopping at the first that verifies; only an
  integrity mismatch counts as corrupt (any other OSError propagates), the newer corrupt ones are renamed
  to .corrupt-<name> once an older one verifies, and committed steps that all fail raise instead of a
  fresh start. Observed on folders broken the ways crashes break them (a torn write, a zero-length file
  from a rename before fsync, a name lost without the folder's fsync, a writer killed between files, a
  torn or missing manifest, leftovers of crashed attempts), with faked I/O errors (six errnos, through open and os.open), by
  recording every file it opens (none of a checkpoint older than the one it returns) and by comparing the
  folder before and after with the quarantine expected.
* optimal_interval -- mechanism: the root of dW/dtau of the exact waste (10.5), found numerically (R drops
  out of it), and W there. Observed over six orders of magnitude of C, M and R against a bisection oracle, to
  a relative 1e-6 (tighter than Daly's approximation is in most cases).
* train_until -- mechanism: the run's whole random state is the carried key: restore it from the
  checkpoint, split it three ways a step, carry the first key, save the carried key. Observed through a
  step_fn that records every key it gets: uninterrupted and resumed runs (a key through numpy as from
  disk, a run that started from another key than key(seed), so replaying the seed's stream is caught),
  and which state each resumed run started from.

The checks never call ``course_lib.checkpoint``: they trace the learner's ``os.fsync``
(with the fsynced file's size on disk and a directory's entries at that moment),
``os.replace`` and ``os.rename`` (patched on the ``os`` module during the call), crash the
save by raising at each traced call in turn, build checkpoint folders by hand, and compare
with the oracles below: a verifier written from the manifest format, a bisection on the
sign of eq. 10.5's derivative, and the key
stream of ``jax.random.split`` replayed step by step. Each oracle takes keyword switches
that compute a known slip, so a wrong answer that matches one is named.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import hashlib
import io
import json
import math
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    call,
    check_case,
    describe_type,
    fail,
    fmt_number,
)
from course_lib.course.grading.helpers import assert_raises
from course_lib.course.grading.vocab import as_real, assert_value_error, pass_stub

LESSON = "10_fault_tolerance"


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    """A fresh folder, removed afterwards whatever the learner's code left in it."""
    folder = Path(tempfile.mkdtemp(prefix="grade10_"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# The manifest format, written and verified independently of the learner
# ---------------------------------------------------------------------------------------


def write_checkpoint(root: Path, step: int, files: dict[str, bytes], *, manifest: Any = None) -> Path:
    """A committed checkpoint built by hand (no fsync needed in a scratch folder)."""
    path = root / f"step_{step:08d}"
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    if manifest is None:
        entries = {n: {"sha256": hashlib.sha256(d).hexdigest(), "size": len(d)} for n, d in files.items()}
        manifest = {"step": step, "files": entries}
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def verify(path: Path, *, check_hash: bool = True) -> bool:
    """Whether ``path``'s manifest parses and every file it lists has that size and sha256."""
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        files = manifest["files"]
        if not isinstance(files, dict):
            return False
        for name, entry in files.items():
            data = (path / name).read_bytes()
            if len(data) != entry["size"]:
                return False
            if check_hash and hashlib.sha256(data).hexdigest() != entry["sha256"]:
                return False
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


# ---------------------------------------------------------------------------------------
# Exercise 1: commit_checkpoint
# ---------------------------------------------------------------------------------------

CC = "commit_checkpoint"


class _Crash(BaseException):
    """The injected crash (a BaseException, so a learner's ``except Exception`` cannot hide it)."""


@dataclass
class _Event:
    kind: str  # "fsync", "replace" or "rename"
    path: str  # the fsynced file or directory, or the rename's source
    dst: str = ""
    listing: tuple[str, ...] = ()  # the entries of the renamed (or fsynced) directory at the call
    is_dir: bool = False  # an fsync of a directory's file descriptor (fstat: S_ISDIR)
    size: int = -1  # an fsynced file's size on disk at the call (fstat: st_size), what the fsync makes durable


def _real_path(p: Any) -> str:
    return os.path.realpath(os.fspath(p))


def _fd_path(number: int) -> str:
    """The path a file descriptor refers to (Linux: /proc; macOS: fcntl F_GETPATH)."""
    try:
        return os.path.realpath(os.readlink(f"/proc/self/fd/{number}"))
    except OSError:
        pass
    try:
        import fcntl

        getpath = getattr(fcntl, "F_GETPATH", None)
        if getpath is not None:
            raw = fcntl.fcntl(number, getpath, bytes(1024))
            return os.path.realpath(raw.split(b"\0")[0].decode())
    except (ImportError, OSError):
        pass
    return f"<fd {number}>"


@dataclass
class _Tracer:
    """Patches os.fsync, os.replace and os.rename to record each call; crashes at call ``crash_at``."""

    crash_at: int | None = None
    events: list[_Event] = field(default_factory=list)

    def _maybe_crash(self) -> None:
        if self.crash_at is not None and len(self.events) == self.crash_at:
            raise _Crash()

    @contextlib.contextmanager
    def patched(self) -> Iterator[_Tracer]:
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd: Any) -> None:
            self._maybe_crash()
            number = fd if isinstance(fd, int) else fd.fileno()
            try:
                info = os.fstat(number)
                is_dir, size = stat.S_ISDIR(info.st_mode), int(info.st_size)
            except OSError:
                is_dir, size = False, -1
            path = _fd_path(number)
            listing = tuple(sorted(os.listdir(path))) if is_dir and os.path.isdir(path) else ()
            self.events.append(_Event("fsync", path, listing=listing, is_dir=is_dir, size=size))
            real_fsync(fd)

        def mover(kind: str, real: Callable[..., None]) -> Callable[..., None]:
            def move(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
                self._maybe_crash()
                s = _real_path(src)
                listing = tuple(sorted(os.listdir(s))) if os.path.isdir(s) else ()
                self.events.append(_Event(kind, s, _real_path(dst), listing))
                real(src, dst, *args, **kwargs)

            return move

        os.fsync, os.replace, os.rename = fsync, mover("replace", real_replace), mover("rename", real_rename)
        try:
            yield self
        finally:
            os.fsync, os.replace, os.rename = real_fsync, real_replace, real_rename


_WRITE_MODES = frozenset("wax+")


@contextlib.contextmanager
def _patched_open(hook: Callable[[str, str, Callable[[], Any]], Any], *, os_open: bool = False) -> Iterator[None]:
    """``open`` (the builtin, and ``io.open`` that pathlib calls) routed through ``hook(path, mode, opener)``
    during the block; ``opener()`` opens the file for real. Descriptors (``open(fd)``) pass untouched. With
    ``os_open``, ``os.open(path, flags)`` too (mode "r" for O_RDONLY, else "w"; calls with ``dir_fd`` pass)."""
    real, real_os_open = builtins.open, os.open

    def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, int):
            return real(file, mode, *args, **kwargs)
        return hook(_real_path(file), mode, lambda: real(file, mode, *args, **kwargs))

    def fake_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if isinstance(path, int) or kwargs.get("dir_fd") is not None:
            return real_os_open(path, flags, *args, **kwargs)
        mode = "r" if flags & os.O_ACCMODE == os.O_RDONLY else "w"
        return int(hook(_real_path(path), mode, lambda: real_os_open(path, flags, *args, **kwargs)))

    builtins.open = io.open = fake_open
    if os_open:
        os.open = fake_os_open
    try:
        yield
    finally:
        builtins.open = io.open = real
        os.open = real_os_open


class _TornFile:
    """A file opened for writing whose first ``write`` writes half its data, flushes it and crashes: the torn
    file a killed writer leaves."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, data: Any) -> int:
        self._file.write(data[: len(data) // 2])
        self._file.flush()
        raise _Crash()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def __enter__(self) -> _TornFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self._file.close()


@dataclass
class _WriteCrash:
    """Crashes a save at its ``at``-th file opened for writing: before it exists (between two files) or, with
    ``torn``, in the middle of its first write. Counts the files opened for writing in ``opened``."""

    at: int | None = None
    torn: bool = False
    opened: list[str] = field(default_factory=list)

    def _hook(self, path: str, mode: str, opener: Callable[[], Any]) -> Any:
        if not _WRITE_MODES & set(mode):
            return opener()
        k = len(self.opened)
        self.opened.append(path)
        if k == self.at and not self.torn:
            raise _Crash()
        return _TornFile(opener()) if k == self.at else opener()

    def patched(self) -> contextlib.AbstractContextManager[None]:
        return _patched_open(self._hook)


FILES = {"params.bin": bytes(range(256)) * 3, "opt_state.bin": b"\x00adam\xff" * 11, "rng.bin": b"\x07" * 8}


def _cc_text(step: int, files: dict[str, bytes]) -> str:
    return f"{CC}(root, {step}, {{{', '.join(repr(n) for n in files)}}})"


def _cc_traced(fn: Callable[..., Any], root: Path, step: int, files: dict[str, bytes]) -> tuple[Any, list[_Event]]:
    tracer = _Tracer()
    with tracer.patched():
        got = call(fn, root, step, dict(files))
    return got, tracer.events


@check_case("the committed directory: the files, their bytes, and a manifest of each file's sha256 and size")
def _cc_result(fn: Callable[..., Any]) -> None:
    for step, files in ((3, FILES), (123456789, {"only.bin": b"x"}), (0, {})):
        with _scratch() as root:
            what = _cc_text(step, files)
            final = root / "ckpt" / f"step_{step:08d}"
            got = call(fn, str(root / "ckpt"), step, dict(files))  # root as a str, not yet there
            if not isinstance(got, Path) or _real_path(got) != _real_path(final):
                fail(f"{what} returned {describe_type(got)}; expected the committed directory {final.name} (a Path)")
            if not final.is_dir():
                fail(f"{what}: no directory {final.name} after the call")
            names = sorted(p.name for p in final.iterdir())
            if names != sorted([*files, "manifest.json"]):
                fail(f"{what}: {final.name} holds {names}; expected the files and manifest.json")
            for name, data in files.items():
                if (final / name).read_bytes() != data:
                    fail(f"{what}: {final.name}/{name} does not hold the bytes given")
            try:
                manifest = json.loads((final / "manifest.json").read_text())
            except ValueError:
                fail(f"{what}: manifest.json is not valid JSON")
            _cc_manifest(manifest, step, files, what)
            left = sorted(p.name for p in (root / "ckpt").iterdir() if p.name != final.name)
            if left:
                fail(f"{what} left {left} beside {final.name}; the temporary directory is renamed, not copied")


def _cc_manifest(manifest: Any, step: int, files: dict[str, bytes], what: str) -> None:
    """The manifest is {"step": step, "files": {name: {"sha256": hex digest, "size": bytes}}}."""
    layout = '{"step": step, "files": {name: {"sha256": ..., "size": ...}}}'
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        fail(f"{what}: manifest.json is {describe_type(manifest)} without a files mapping; expected {layout}")
    if manifest.get("step") != step:
        fail(f"{what}: manifest.json's step is {manifest.get('step')!r}; expected {step}")
    if sorted(manifest["files"]) != sorted(files):
        fail(f"{what}: manifest.json lists {sorted(manifest['files'])}; expected every file, {sorted(files)}")
    for name, data in files.items():
        entry = manifest["files"][name]
        if not isinstance(entry, dict) or entry.get("size") != len(data):
            fail(f"{what}: manifest.json's entry for {name} is {str(entry)[:60]}; expected its size {len(data)}")
        if entry.get("sha256") != hashlib.sha256(data).hexdigest():
            fail(f"{what}: manifest.json's sha256 of {name} is not hashlib.sha256(data).hexdigest() of its bytes")


def _cc_order(events: list[_Event], root: Path, step: int, files: dict[str, bytes], what: str) -> None:
    """The traced calls follow the recipe: fsync each file in tmp, fsync tmp itself, rename tmp -> final,
    fsync root."""
    root_s, final_s = _real_path(root), _real_path(root / f"step_{step:08d}")
    if not any(e.kind == "fsync" for e in events):
        fail(f"{what} never calls os.fsync: without it the bytes may sit in the page cache when the power goes")
    commits = [i for i, e in enumerate(events) if e.kind in ("replace", "rename") and e.dst == final_s]
    inside_final = [e.path for e in events if e.kind == "fsync" and os.path.dirname(e.path) == final_s]
    if not commits or events[commits[0]].path == final_s:
        where = "straight into" if inside_final or final_s in [e.path for e in events] else "without renaming into"
        fail(
            f"{what} writes {where} {Path(final_s).name} (non-atomic): a crash mid-save leaves a half checkpoint "
            "under the committed name; write into a temporary directory inside root, then os.replace it"
        )
    i = commits[0]
    tmp_s = events[i].path
    if os.path.dirname(tmp_s) != root_s:
        fail(f"{what}: the temporary directory must be inside root (a rename is atomic only within one filesystem)")
    listing = events[i].listing
    for name in ["manifest.json", *files]:
        if name not in listing:
            late = "write the manifest before the rename: the rename is the commit" if name == "manifest.json" else ""
            fail(f"{what}: {name} was not in the directory when it was renamed; {late or 'write every file first'}")
    try:
        manifest_size = os.path.getsize(os.path.join(final_s, "manifest.json"))
    except OSError:
        fail(f"{what}: no {Path(final_s).name}/manifest.json after the call")
    for name in [*files, "manifest.json"]:
        synced = [k for k, e in enumerate(events) if e.kind == "fsync" and e.path == os.path.join(tmp_s, name)]
        if not synced:
            after = any(e.kind == "fsync" and e.path == os.path.join(final_s, name) for e in events[i:])
            if after:
                fail(
                    f"{what}: {name} is fsynced after os.replace (renamed before fsync): a crash can commit a "
                    "checkpoint whose bytes are not on disk; fsync every file before the rename"
                )
            fail(f"{what}: {name} is never fsynced (os.fsync(f.fileno()) after f.flush()) before the rename")
        if synced[0] > i:
            fail(f"{what}: {name} is fsynced after os.replace (renamed before fsync); fsync before the rename")
        want = manifest_size if name == "manifest.json" else len(files[name])
        if not any(events[k].size == want for k in synced if k < i):
            fail(
                f"{what}: {name} held {events[synced[0]].size} of its {want} bytes on disk when it was fsynced: "
                "the rest sat in Python's buffer, which fsync never sees; call f.flush() before os.fsync(f.fileno())"
            )
    tmp_syncs = [e for e in events[:i] if e.kind == "fsync" and e.is_dir and e.path == tmp_s]
    if tmp_syncs and not any({*files, "manifest.json"} <= set(e.listing) for e in tmp_syncs):
        fail(
            f"{what}: the temporary directory was fsynced when it held only {list(tmp_syncs[-1].listing)}, before "
            "its entries were written: fsync it after the last file (the manifest) is written and fsynced, just "
            "before os.replace, so that every name it holds is durable"
        )
    if not tmp_syncs:
        fail(
            f"{what}: fsync the temporary directory itself before os.replace (its entries, the files' names, are "
            "data too): without it a power cut after the rename can leave the committed directory without a file"
        )
    if not any(e.kind == "fsync" and e.path == root_s for e in events[i + 1 :]):
        fail(
            f"{what}: fsync the root directory after os.replace (fd = os.open(root, os.O_RDONLY); os.fsync(fd)): "
            "without it the rename itself may be lost on a power cut"
        )
    tmp_name = Path(tmp_s).name
    if not re.fullmatch(rf"\.tmp-step_{step:08d}-{os.getpid()}-[0-9a-f]+", tmp_name):
        fail(
            f"{what} wrote into {tmp_name}: name the temporary directory .tmp-step_{step:08d}-<pid>-<random hex> "
            "(os.getpid(), secrets.token_hex(4)); a fixed name is shared with a writer that may still be alive "
            "(a zombie after a preemption), and cleaning it up deletes a live save"
        )


@check_case(
    "traced os calls: every file flushed and fsynced in a temporary directory, that directory fsynced once it "
    "holds them, then os.replace, then the root fsynced"
)
def _cc_trace(fn: Callable[..., Any]) -> None:
    for step, files in ((3, FILES), (12, {"a.bin": b"a"})):
        with _scratch() as root:
            _, events = _cc_traced(fn, root, step, files)
            _cc_order(events, root, step, files, _cc_text(step, files))


def _describe_event(e: _Event) -> str:
    return f"os.fsync of {Path(e.path).name}" if e.kind == "fsync" else f"os.{e.kind} to {Path(e.dst).name}"


def _crash_and_resume(
    fn: Callable[..., Any], crash: Callable[[], contextlib.AbstractContextManager[Any]], at: str, crashes: int = 1
) -> None:
    """Save step 2 beside a good step 1 under ``crash`` (``crashes`` attempts in a row, as a run restarted
    into the same fault), then once more without it: step 1 must survive every crash, step 2 must never be
    committed half, and the resumed attempt must commit it."""
    files, what = FILES, _cc_text(2, FILES)
    with _scratch() as root:
        good = write_checkpoint(root, 1, {"params.bin": b"good" * 10})
        new = root / "step_00000002"
        for attempt in range(crashes):
            again = " again" if attempt else ""
            try:
                with crash():
                    call(fn, root, 2, dict(files))
            except _Crash:
                pass
            except LearnerError as exc:
                pass_stub(exc)
                fail(
                    f"{what}, tried{again} after a crash at {at}, raised {type(exc.error).__name__}: a crashed "
                    "attempt's leftover must not stop the next save (a fresh temporary name for each attempt)"
                )
            else:
                if attempt == 0:
                    return  # the call path changed under the crash; nothing to judge here
                break  # the resumed attempt took another path and finished: judge what it committed
            if not verify(good):
                fail(f"{what} crashed{again} at {at} and the previous checkpoint step_00000001 no longer verifies")
            if new.exists() and not verify(new):
                fail(
                    f"{what} crashed{again} at {at} and left step_00000002 committed but incomplete (non-atomic): "
                    "only the final os.replace may create the committed name"
                )
            if new.exists():
                return  # committed before the crash (a crash at the root's fsync): nothing to resume
        else:
            try:
                call(fn, root, 2, dict(files))
            except LearnerError as exc:
                pass_stub(exc)
                fail(
                    f"{what} after a crash at {at} raised {type(exc.error).__name__}: a crashed attempt's leftover "
                    "must not stop the next save (a fresh temporary name for each attempt)"
                )
        if not verify(good):
            fail(f"{what}, resumed after a crash at {at}: the previous checkpoint step_00000001 no longer verifies")
        if not verify(new):
            fail(
                f"{what} after a crash at {at}: the resumed attempt did not commit a checkpoint that verifies (start "
                "from an empty temporary directory: a crashed attempt's files may be torn)"
            )


@check_case(
    "a crash at each traced call, between two files and in the middle of each file's write (a torn write), then "
    "resumed: the last good checkpoint survives, no half checkpoint appears, the resumed save commits"
)
def _cc_crash(fn: Callable[..., Any]) -> None:
    with _scratch() as root:
        _, events = _cc_traced(fn, root, 2, FILES)
    for k in range(len(events)):  # a fresh crash for each attempt: the same call crashes again
        _crash_and_resume(fn, functools.partial(_traced_crash, k), _describe_event(events[k]))
    counted = _WriteCrash()
    with _scratch() as root, counted.patched():
        call(fn, root, 2, dict(FILES))
    for k, path in enumerate(counted.opened):
        name = Path(path).name
        _crash_and_resume(fn, functools.partial(_write_crash, k, False), f"the open of {name} (between two files)")
        torn = f"a torn write of {name} (half its bytes written)"
        _crash_and_resume(fn, functools.partial(_write_crash, k, True), torn, crashes=2)


def _traced_crash(k: int) -> contextlib.AbstractContextManager[Any]:
    return _Tracer(crash_at=k).patched()


def _write_crash(k: int, torn: bool) -> contextlib.AbstractContextManager[Any]:
    return _WriteCrash(at=k, torn=torn).patched()


@check_case(
    "an existing step raises FileExistsError and stays as it was; a dead writer's leftover is removed, a live "
    "writer's is left alone"
)
def _cc_existing(fn: Callable[..., Any]) -> None:
    with _scratch() as root:
        old = write_checkpoint(root, 5, {"params.bin": b"old"})
        what = _cc_text(5, {"params.bin": b"new"})
        assert_raises(
            FileExistsError,
            fn,
            root,
            5,
            {"params.bin": b"new"},
            other_error=lambda exc: (
                f"{what} raised {type(exc).__name__} for an existing step; expected FileExistsError"
            ),
            no_error=f"{what} returned for a step already committed; expected FileExistsError (never overwrite one)",
        )
        if (old / "params.bin").read_bytes() != b"old" or not verify(old):
            fail(f"{what} changed the committed step_00000005; a committed checkpoint is never touched again")
    dead_pid = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with _scratch() as root:
            dead, alive = root / f".tmp-step_00000006-{dead_pid}-0badc0de", root / f".tmp-step_00000004-{live.pid}-5afe"
            for leftover in (dead, alive):
                leftover.mkdir()
                (leftover / "params.bin").write_bytes(b"half")
            what = _cc_text(6, {"params.bin": b"whole"})
            try:
                call(fn, root, 6, {"params.bin": b"whole"})
            except LearnerError as exc:
                pass_stub(exc)
                fail(
                    f"{what} beside a dead writer's {dead.name} and a live writer's {alive.name} raised "
                    f"{type(exc.error).__name__}: leftovers must not stop a save"
                )
            final = root / "step_00000006"
            names = sorted(p.name for p in final.iterdir()) if final.is_dir() else []
            if names != ["manifest.json", "params.bin"] or not verify(final):
                fail(f"{what} beside leftovers committed {names}: start from an empty temporary directory")
            if not alive.is_dir() or (alive / "params.bin").read_bytes() != b"half":
                fail(
                    f"{what} deleted or changed {alive.name}, whose writer (pid {live.pid}) is still running: remove "
                    "only the leftovers whose writer is gone (writer_alive(pid) is False); a live save is never touched"
                )
            if dead.exists():
                fail(
                    f"{what} left {dead.name}, whose writer (pid {dead_pid}) has exited and can never finish it: "
                    "remove (shutil.rmtree) the .tmp-step_<digits>-<pid>-<hex> directories whose writer is gone"
                )
    finally:
        live.kill()
        live.wait()


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped (not reused this soon in practice)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


COMMIT_CHECKPOINT = Exercise(
    name=CC,
    points=15,
    title="an atomic checkpoint commit: write, fsync files and the temporary folder, os.replace, fsync the root",
    checks=(_cc_result, _cc_trace, _cc_crash, _cc_existing),
    hints=(
        "follow the recipe's seven steps in order; which of them would a crash between two others expose? "
        "Nothing may appear under the final name before the last byte and the last name are durable",
        "os.fsync takes a file descriptor: an open file gives one with f.fileno(), after f.flush() while it is "
        "still open; the manifest's entries can be built in the loop that writes the files",
        "a directory has no open() file object, but os.open(path, os.O_RDONLY) gives a descriptor for it too "
        "(close it in a finally); two directories need an fsync: which one before the rename, which one after? "
        "Leftovers: your temporary folder's own name says who wrote it; which names in root are another "
        "writer's, and when may such a folder go?",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: newest_complete
# ---------------------------------------------------------------------------------------

NC = "newest_complete"


def naive_newest(
    root: Path, *, string_order: bool = False, check_hash: bool = True, loose_names: bool = False
) -> tuple[int, Path] | None:
    """Every entry of ``root`` checked one by one; the switches compute known slips (``loose_names``:
    any name that contains step_<digits>)."""
    best: tuple[Any, int, Path] | None = None
    for path in root.iterdir():
        match = (re.search if loose_names else re.fullmatch)(r"step_(\d+)", path.name)
        if not match or not path.is_dir() or not verify(path, check_hash=check_hash):
            continue
        step = int(match.group(1))
        order: Any = path.name if string_order else step
        if best is None or order > best[0]:
            best = (order, step, path)
    return None if best is None else (best[1], best[2])


NC_SLIPS: dict[str, dict[str, Any]] = {
    "steps ordered as strings: step_100000000 is newer than step_99999999; compare int(step)": dict(string_order=True),
    "a manifest trusted without checking the hashes: a flipped byte keeps the size; compare each file's sha256": dict(
        check_hash=False
    ),
    "its name is not step_<digits> in full (a temporary directory of a save that never reached its rename is not "
    "committed): match the whole name": dict(loose_names=True),
}


def _snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry under ``root``: its size and SHA-256 (-1 and "" for a directory)."""
    out = {}
    for p in sorted(root.rglob("*")):
        data = b"" if p.is_dir() else p.read_bytes()
        out[p.relative_to(root).as_posix()] = (-1, "") if p.is_dir() else (len(data), hashlib.sha256(data).hexdigest())
    return out


def _changes(before: dict[str, tuple[int, str]], after: dict[str, tuple[int, str]]) -> str:
    gone = [k for k in before if k not in after]
    new = [k for k in after if k not in before]
    changed = [k for k in before if k in after and before[k] != after[k]]
    parts = [
        f"{label} {', '.join(names[:2])}"
        for label, names in (("removed", gone), ("added", new), ("changed", changed))
        if names
    ]
    return "; ".join(parts)


@dataclass
class _Reads:
    """Records every file opened (read or written, by open or os.open) during the block."""

    opened: list[str] = field(default_factory=list)

    def _hook(self, path: str, mode: str, opener: Callable[[], Any]) -> Any:
        self.opened.append(path)
        return opener()

    def patched(self) -> contextlib.AbstractContextManager[None]:
        return _patched_open(self._hook, os_open=True)


def _committed(root: Path) -> list[tuple[int, Path]]:
    return sorted(
        (int(m.group(1)), p) for p in root.iterdir() if (m := re.fullmatch(r"step_(\d+)", p.name)) and p.is_dir()
    )


def _quarantined(before: dict[str, tuple[int, str]], names: list[str]) -> dict[str, tuple[int, str]]:
    """``before`` with each top-level directory of ``names`` renamed to ``.corrupt-<name>``."""
    out = {}
    for key, value in before.items():
        top, _, rest = key.partition("/")
        out[(f".corrupt-{top}/{rest}" if rest else f".corrupt-{top}") if top in names else key] = value
    return out


def _nc_compare(fn: Callable[..., Any], root: Path, case: str) -> None:
    expected = naive_newest(root)
    slips = {message: naive_newest(root, **slip) for message, slip in NC_SLIPS.items()}
    committed = _committed(root)
    what = f"{NC}(root) with {case}"
    before, reads = _snapshot(root), _Reads()
    bad = [p.name for step, p in committed if expected is not None and step > expected[0]]
    try:
        with reads.patched():
            got = call(fn, root)
    except LearnerError as exc:
        pass_stub(exc)
        if expected is None and committed and isinstance(exc.error, RuntimeError):
            changes = _changes(before, _snapshot(root))
            if changes:
                fail(f"{what} raised but changed the folder ({changes}): when nothing verifies, move nothing")
            return
        fail(
            f"{what} raised {type(exc.error).__name__}: a corrupt checkpoint (a missing file or manifest, one that "
            "does not parse) is an integrity mismatch; quarantine it and fall back to the previous one"
        )
    if expected is None and committed:
        fail(
            f"{what} returned {describe_type(got)}; expected RuntimeError: checkpoints are committed but none verifies, "
            "and starting from update 0 over them would silently discard the run"
        )
    _nc_value(got, expected, slips, what)
    changes = _changes(_quarantined(before, bad), _snapshot(root))
    if changes:
        want = f"only {', '.join(bad)} renamed to .corrupt-<name>" if bad else "nothing moved (no newer one is corrupt)"
        fail(
            f"{what} left the folder with {changes} against {want}: quarantine the newer corrupt checkpoints "
            "with os.replace, and leave everything else (leftovers, older checkpoints) as it is"
        )
    if expected is not None:
        older = [p for step, p in committed if step < expected[0]]
        for opened in reads.opened:
            if any(opened.startswith(_real_path(p) + os.sep) for p in older):
                fail(
                    f"{what} opened {Path(opened).parent.name}/{Path(opened).name} although {expected[1].name}, "
                    "newer, verifies: walk the checkpoints newest first and stop at the first that verifies (a "
                    "restore reads the checkpoint it loads, not every one)"
                )


# Errors a read can meet that say nothing about the bytes: a failing disk, a permission, a stale NFS handle, a
# timed-out network mount, a full or read-only filesystem (a reader that writes an access time or a lock file).
IO_ERRNOS = ("EIO", "EACCES", "ESTALE", "ETIMEDOUT", "ENOSPC", "EROFS")


@dataclass
class _FailingReads:
    """Opening a file under ``under`` (by open or os.open) raises ``OSError(code)``: the manifest, or with
    ``data_only`` only the files it lists."""

    under: str
    code: int
    data_only: bool = False

    def _hook(self, path: str, mode: str, opener: Callable[[], Any]) -> Any:
        if path.startswith(self.under + os.sep) and not (self.data_only and path.endswith(os.sep + "manifest.json")):
            raise OSError(self.code, os.strerror(self.code), path)
        return opener()

    def patched(self) -> contextlib.AbstractContextManager[None]:
        return _patched_open(self._hook, os_open=True)


@check_case(
    "an I/O error (EIO, EACCES, ESTALE, ETIMEDOUT, ENOSPC, EROFS) opening the newest's manifest or a file it "
    "lists, by open or os.open, propagates, and nothing is quarantined"
)
def _nc_io(fn: Callable[..., Any]) -> None:
    for i, name in enumerate(IO_ERRNOS):
        code = getattr(errno, name)
        data_only = i % 2 == 1  # the manifest, then a file it lists, in turn
        with _scratch() as root:
            for step in (4, 5, 6):
                write_checkpoint(root, step, _payload(step))
            newest = root / "step_00000006"
            which = "a file it lists" if data_only else "its manifest"
            what = f"{NC}(root) when opening {which} in {newest.name} fails with {name} ({os.strerror(code)})"
            before = _snapshot(root)
            try:
                with _FailingReads(_real_path(newest), code, data_only).patched():
                    got = call(fn, root)
            except LearnerError as exc:
                pass_stub(exc)
                if not isinstance(exc.error, OSError) or exc.error.errno != code:
                    fail(
                        f"{what} raised {type(exc.error).__name__}; let the OSError itself propagate (it is not an "
                        "integrity mismatch, and the person on call needs its errno)"
                    )
            else:
                fail(
                    f"{what} returned {describe_type(got)}: let other OSErrors propagate (catch only "
                    "FileNotFoundError and the parse errors, not a list of errnos); an I/O error says nothing "
                    "about the bytes"
                )
            changes = _changes(before, _snapshot(root))
            if changes:
                fail(
                    f"{what} changed the folder ({changes}): an I/O error is no evidence of corruption; quarantine "
                    "only on an integrity mismatch"
                )


def _nc_value(got: Any, expected: tuple[int, Path] | None, slips: dict[str, Any], what: str) -> None:
    """The returned (step, path) against the oracle's; a wrong choice that a known slip makes is named."""
    if expected is None:
        if got is not None:
            fail(f"{what} returned {describe_type(got)}; expected None: no checkpoint there verifies")
        return
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{what} returned {describe_type(got)}; expected a tuple (step, path)")
    step, path = got
    if not isinstance(path, Path):
        fail(f"{what}: the path is {describe_type(path)}; expected the checkpoint directory's Path")
    if _real_path(path) == _real_path(expected[1]):
        if not isinstance(step, int | np.integer) or isinstance(step, bool) or int(step) != expected[0]:
            fail(f"{what}: the step is {describe_type(step)} {step!r}; expected the int {expected[0]}")
        return
    for message, wrong in slips.items():
        if wrong is not None and wrong[1] != expected[1] and _real_path(path) == _real_path(wrong[1]):
            fail(f"{what} chose {Path(path).name}: {message}")
    fail(f"{what} chose {Path(path).name}; expected {expected[1].name}, the newest that verifies")


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _unlink(*paths: Path) -> None:
    for path in paths:
        path.unlink()


#: How the hand-built cases break the newest checkpoint (each leaves an older good one).
BREAKS: dict[str, Callable[[Path], Any]] = {
    "a flipped byte of the same size in the newest": lambda p: _flip_byte(p / "params.bin"),
    "a torn file in the newest (a writer killed mid-write)": lambda p: (p / "params.bin").write_bytes(
        (p / "params.bin").read_bytes()[:5]
    ),
    "a zero-length file in the newest (renamed before its bytes were fsynced, then a power cut)": lambda p: (
        p / "params.bin"
    ).write_bytes(b""),
    "a missing file in the newest (its name lost: the folder was not fsynced before a power cut)": lambda p: (
        p / "params.bin"
    ).unlink(),
    "the newest written straight into its final name by a writer killed between two files": lambda p: _unlink(
        p / "opt.bin", p / "manifest.json"
    ),
    "a missing manifest in the newest": lambda p: (p / "manifest.json").unlink(),
    "a truncated manifest.json in the newest": lambda p: (p / "manifest.json").write_text(
        (p / "manifest.json").read_text()[:17]
    ),
    "an empty manifest.json in the newest": lambda p: (p / "manifest.json").write_text(""),
    "a manifest whose files are a list": lambda p: (p / "manifest.json").write_text('{"step": 1, "files": ["x"]}'),
}


def _payload(step: int) -> dict[str, bytes]:
    return {"params.bin": (b"p%d-" % step) * 20, "opt.bin": b"o" * (step % 7 + 1)}


@check_case("hand-built folders: the newest that verifies, falling back past a broken newest; None when none verifies")
def _nc_known(fn: Callable[..., Any]) -> None:
    with _scratch() as root:
        _nc_compare(fn, root, "an empty folder")
    with _scratch() as root:
        for step in (1, 2, 3):
            write_checkpoint(root, step, _payload(step))
        _nc_compare(fn, root, "steps 1, 2 and 3, all good")
    for case, damage in BREAKS.items():
        with _scratch() as root:
            for step in (4, 5, 6):
                write_checkpoint(root, step, _payload(step))
            damage(root / "step_00000006")
            _nc_compare(fn, root, case)
    with _scratch() as root:
        for step in (1, 2):
            _flip_byte(write_checkpoint(root, step, _payload(step)) / "params.bin")
        _nc_compare(fn, root, "every checkpoint corrupt")


@check_case("temporary directories and stray files are not checkpoints; steps compare as numbers")
def _nc_names(fn: Callable[..., Any]) -> None:
    with _scratch() as root:
        write_checkpoint(root, 5, _payload(5))
        tmp = write_checkpoint(root, 9, _payload(9))  # complete, but never renamed
        tmp.rename(root / ".tmp-step_00000009")
        (root / "step_00000010").write_bytes(b"a stray file, not a directory")
        _nc_compare(fn, root, "step_00000005, a complete .tmp-step_00000009 and a file step_00000010")
    with _scratch() as root:
        write_checkpoint(root, 5, _payload(5))
        write_checkpoint(root / "x", 11, _payload(11)).rename(root / "step_00000011.old")
        _nc_compare(fn, root, "step_00000005 and a complete step_00000011.old")
    with _scratch() as root:
        for step in (99_999_999, 100_000_000, 7):
            write_checkpoint(root, step, _payload(step))
        _nc_compare(fn, root, "step_99999999, step_100000000 and step_00000007")
    with _scratch() as root:
        for name in ("step_9", "step_10"):
            write_checkpoint(root / "x", 1, _payload(1)).rename(root / name)
        _nc_compare(fn, root, "step_9 and step_10 (not zero-padded)")


@check_case("random folders against an oracle that verifies every candidate")
def _nc_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    damages = list(BREAKS.values())
    for i in range(12):
        with _scratch() as root:
            steps = sorted(
                {int(s) for s in rng.integers(0, 10**9 if i % 3 == 0 else 200, size=int(rng.integers(1, 7)))}
            )
            for step in steps:
                path = write_checkpoint(root, step, _payload(step))
                if rng.random() < 0.4:
                    damages[int(rng.integers(0, len(damages)))](path)
            if rng.random() < 0.5:
                (root / f".tmp-step_{steps[-1] + 1:08d}").mkdir()
            _nc_compare(fn, root, f"random folder {i} (steps {', '.join(map(str, steps))})")


NEWEST_COMPLETE = Exercise(
    name=NC,
    points=15,
    title="restore the newest checkpoint that verifies: quarantine corrupt ones, propagate I/O errors",
    checks=(_nc_known, _nc_names, _nc_oracle, _nc_io),
    hints=(
        "Two questions, kept apart: which directories are committed checkpoints at all, and, for each one from "
        "the newest down, is it intact? A restore stops at the first intact one.",
        "Collect the committed ones with their steps as numbers first, then walk them newest first. Keep the broken "
        "ones you pass on the way: what happens to them depends on whether something older turns out intact, and "
        "what you do when nothing does depends on whether that list is empty.",
        "Corruption shows up as particular exception types (a file that is not there, text that does not parse, a "
        "field that is missing or has the wrong type). A failing disk or a permission raises an OSError of another "
        "kind, whatever its errno: which exception types, then, may your verification catch, and which must it let "
        "through untouched?",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 3: optimal_interval
# ---------------------------------------------------------------------------------------

OI = "optimal_interval"


def exact_waste(tau: float, C: float, M: float, R: float) -> float:
    """(10.5) written out: (M + R)(exp((tau + C)/M) - 1)/tau - 1."""
    return (M + R) * math.expm1((tau + C) / M) / tau - 1.0


def exact_optimum(C: float, M: float) -> float:
    """The minimiser of (10.5): bisection on the sign of dW/dtau, written from the quotient rule in another
    form than the solution's; R does not move it."""

    def slope(tau: float) -> float:  # dW/dtau times tau^2 / (M + R), written from the quotient rule
        return math.exp((tau + C) / M) * tau / M - math.expm1((tau + C) / M)

    lo, hi = 1e-300, float(M)
    for _ in range(400):
        mid = (lo + hi) / 2
        if slope(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _young_daly(C: float, M: float) -> tuple[float, float]:
    young = math.sqrt(2 * C * M)
    if C >= 2 * M:
        return young, float(M)
    x = C / (2 * M)
    return young, young * (1 + math.sqrt(x) / 3 + x / 9) - C


def _oi_compare(fn: Callable[..., Any], C: float, M: float, R: float) -> None:
    what = f"{OI}({fmt_number(C)}, {fmt_number(M)}, {fmt_number(R)})"
    got = call(fn, C, M, R)
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{what} returned {describe_type(got)}; expected a tuple (tau, waste)")
    values = [as_real(v) for v in got]
    for name, v, raw in zip(("tau", "waste"), values, got, strict=True):
        if v is None:
            fail(f"{what}: {name} is {describe_type(raw)}; expected a finite float")
    tau, waste = values
    assert tau is not None and waste is not None
    best = exact_optimum(C, M)
    if not math.isclose(tau, best, rel_tol=1e-6):
        young, daly = _young_daly(C, M)
        for name, other in (("Young's interval (10.2)", young), ("Daly's interval (10.3)", daly)):
            if math.isclose(tau, other, rel_tol=1e-9):
                fail(
                    f"{what}: tau = {fmt_number(tau)} is {name}, which minimises an approximation; (10.5) is "
                    f"smallest at {fmt_number(best)}: solve dW/dtau = 0 for the exact W"
                )
        if R > 0 and math.isclose(as_real(call(fn, C, M, 0.0)[0]) or -1.0, best, rel_tol=1e-6):
            fail(
                f"{what}: tau = {fmt_number(tau)} moves with R; (M + R) multiplies the whole of (10.5), so R changes "
                f"the waste, not the minimiser {fmt_number(best)}"
            )
        fail(
            f"{what}: tau = {fmt_number(tau)}; (10.5) is smallest at {fmt_number(best)} (relative error "
            f"{abs(tau - best) / best:.1e}, allowed 1e-6): find the root of dW/dtau, where W itself is flat"
        )
    want = exact_waste(best, C, M, R)
    if math.isclose(waste, want, rel_tol=1e-8, abs_tol=1e-12):
        return
    if math.isclose(waste, C / best + (best + C) / (2 * M) + R / M, rel_tol=1e-9):
        fail(
            f"{what}: waste = {fmt_number(waste)} is the first-order (10.1); expected the exact (10.5), {fmt_number(want)}"
        )
    if R > 0 and math.isclose(waste, exact_waste(best, C, M, 0.0), rel_tol=1e-9):
        fail(f"{what}: waste = {fmt_number(waste)} leaves out R: (10.5) has (M + R); expected {fmt_number(want)}")
    fail(f"{what}: waste = {fmt_number(waste)}; expected W(tau) of (10.5), {fmt_number(want)}")


@check_case("the lesson's Llama 3 job (C = 60 s, R = 10 min) and hand cases, a save as long as the MTBF included")
def _oi_known(fn: Callable[..., Any]) -> None:
    M_job = 54 * 24 * 3600 / 419
    for C, M, R in (
        (60.0, M_job, 600.0),
        (60.0, 3600.0, 0.0),
        (600.0, 3600.0, 60.0),
        (30.0, 86400.0, 0.0),
        (1.0, 1.0, 0.0),
        (10.0, 2.0, 5.0),
    ):
        _oi_compare(fn, C, M, R)


@check_case("random C, M and R (C/M from 1e-7 to 2) against a root-finding oracle")
def _oi_oracle(fn: Callable[..., Any]) -> None:
    rng = np.random.default_rng(0)
    for _ in range(40):
        M = float(np.exp(rng.uniform(np.log(10.0), np.log(1e6))))
        C = M * float(np.exp(rng.uniform(np.log(1e-7), np.log(2.0))))  # a save from negligible to 2 MTBFs
        R = float(np.exp(rng.uniform(np.log(1.0), np.log(1e4)))) if rng.random() < 0.7 else 0.0
        _oi_compare(fn, C, M, R)


@check_case("raises ValueError when C or M is not positive or R is negative")
def _oi_bad(fn: Callable[..., Any]) -> None:
    for C, M, R in ((0.0, 3600.0, 0.0), (-1.0, 3600.0, 0.0), (60.0, 0.0, 0.0), (60.0, -5.0, 0.0), (60.0, 3600.0, -1.0)):
        what = f"{OI}({fmt_number(C)}, {fmt_number(M)}, {fmt_number(R)})"
        assert_value_error(
            fn,
            C,
            M,
            R,
            what=what,
            no_error=f"{what} returned; expected ValueError: a save cost and an MTBF are positive, a restart not negative",
        )


OPTIMAL_INTERVAL = Exercise(
    name=OI,
    points=10,
    title="the checkpoint interval that minimises the exact waste (eq. 10.5), and that waste",
    checks=(_oi_known, _oi_oracle, _oi_bad),
    advice="by finding the root of dW/dtau with bisection in math",
    hints=(
        "The minimiser is where dW/dtau = 0. Differentiate (10.5) by hand and multiply by something positive "
        "to make it simpler: which factors cannot change the sign, and does R survive?",
        "You need a number, not a formula: look at the sign of your expression at tau = 0 and at tau = M, and "
        "at how it moves in between. A method that only needs signs can then pin the root down to the last bit.",
        "If the answer drifts for tiny C/M, look for a difference of two nearly equal numbers in your expression: "
        "the math module has a function that computes exp(x) - 1 without that cancellation.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: train_until
# ---------------------------------------------------------------------------------------

TU = "train_until"

KeyBits = tuple[int, ...]


def _bits(key: Any) -> KeyBits:
    """A key's bits as a tuple of ints, for typed keys and raw uint32 keys alike."""
    import jax

    arr = key
    if hasattr(key, "dtype") and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        arr = jax.random.key_data(key)
    return tuple(int(x) for x in np.asarray(arr).ravel())


def _params_after(params: np.ndarray, k_batch: KeyBits, k_noise: KeyBits) -> np.ndarray:
    """The grader's step: any deterministic function of both keys (float64, exact)."""
    return params * 0.5 + np.array([k_batch[0] % 1000, k_noise[-1] % 1000, (k_batch[-1] ^ k_noise[0]) % 1000]) / 1000


@dataclass
class _Recorder:
    """A ``step_fn`` that records the keys it is given, and the params of its first call (the state restored)."""

    calls: list[tuple[KeyBits, KeyBits]] = field(default_factory=list)
    first_params: np.ndarray | None = None

    def __call__(self, params: Any, k_batch: Any, k_noise: Any) -> np.ndarray:
        kb, kn = _bits(k_batch), _bits(k_noise)
        if not self.calls:
            self.first_params = np.array(params, dtype=np.float64)
        self.calls.append((kb, kn))
        return _params_after(np.asarray(params, dtype=np.float64), kb, kn)


def naive_keys(
    seed: int, n_steps: int, *, same_key: bool = False, no_carry: bool = False, start: Any = None
) -> list[tuple[Any, ...]]:
    """``[(carried key after step t, k_batch_t, k_noise_t)]`` for t < n_steps, split by split, from
    ``jax.random.key(seed)`` or from the key ``start``."""
    import jax

    key = jax.random.key(seed) if start is None else start
    out = []
    for _ in range(n_steps):
        if same_key:
            new, k = jax.random.split(key)
            k_batch = k_noise = k
        else:
            new, k_batch, k_noise = jax.random.split(key, 3)
        key = key if no_carry else new
        out.append((key, k_batch, k_noise))
    return out


def _fresh(seed: int) -> dict[str, Any]:
    import jax

    return {"seed": seed, "step": 0, "params": np.zeros(3), "key": jax.random.key(seed)}


def _expected_calls(stream: list[tuple[Any, ...]], start: int, stop: int) -> list[tuple[KeyBits, KeyBits]]:
    return [(_bits(b), _bits(n)) for _, b, n in stream[start:stop]]


def _tu_run(fn: Callable[..., Any], checkpoint: dict[str, Any], total: int) -> tuple[dict[str, Any], _Recorder, str]:
    what = f"{TU}(checkpoint at step {checkpoint['step']}, {total}, step_fn)"
    recorder = _Recorder()
    given = dict(checkpoint)
    got = call(fn, given, total, recorder)
    if not isinstance(got, dict) or not {"seed", "step", "params", "key"} <= set(got):
        fail(f"{what} returned {describe_type(got)}; expected a dict with seed, step, params and key")
    if given["step"] != checkpoint["step"] or given["key"] is not checkpoint["key"]:
        fail(f"{what} changed the checkpoint it was given; return a new dict")
    return got, recorder, what


def _tu_stream_slip(calls: list[tuple[KeyBits, KeyBits]], seed: int, n: int) -> str:
    """Name the slip whose key stream the learner's calls follow, or ""."""
    if calls and all(kb == kn for kb, kn in calls):
        return "the batch and the noise draw with one key: split the carried key 3 ways, one key a draw"
    if len(calls) > 1 and len(set(calls)) == 1:
        return "every step draws the same keys: carry the first key of the split forward"
    if calls == _expected_calls(naive_keys(seed, n, no_carry=True), 0, n):
        return "every step draws the same keys: carry the first key of the split forward"
    return ""


def _tu_check_stream(calls: list[tuple[KeyBits, KeyBits]], want: list[tuple[KeyBits, KeyBits]], what: str) -> None:
    if len(calls) != len(want):
        fail(f"{what} ran {len(calls)} steps; expected total_steps - checkpoint['step'] = {len(want)} (off by one?)")
    for t, (got, exp) in enumerate(zip(calls, want, strict=True)):
        if got != exp:
            fail(f"{what}: step {t} of the call drew different keys from key, k_batch, k_noise = split(key, 3)")


@check_case("an uninterrupted run: the keys of the carried split, one batch and one noise key a step")
def _tu_straight(fn: Callable[..., Any]) -> None:
    for seed, n in ((0, 6), (7, 1)):
        stream = naive_keys(seed, n)
        got, recorder, what = _tu_run(fn, _fresh(seed), n)
        want = _expected_calls(stream, 0, n)
        if recorder.calls != want:
            slip = _tu_stream_slip(recorder.calls, seed, n)
            if slip:
                fail(f"{what}: {slip}")
            _tu_check_stream(recorder.calls, want, what)
        if got["step"] != n or isinstance(got["step"], bool):
            fail(f"{what}: the checkpoint's step is {got['step']!r}; expected {n} (steps done; off by one?)")
        if got["seed"] != seed:
            fail(f"{what}: the checkpoint's seed is {got['seed']!r}; keep the run's seed {seed}")
        _tu_check_key(got["key"], stream, n, _fresh(seed)["key"], what)


def _tu_check_key(key: Any, stream: list[tuple[Any, ...]], n: int, start_key: Any, what: str) -> None:
    try:
        bits = _bits(key)
    except Exception:  # not a key at all
        fail(f"{what}: the checkpoint's key is {describe_type(key)}; expected the carried JAX key")
    if bits == _bits(stream[n - 1][0]):
        return
    if bits == _bits(start_key):
        fail(f"{what}: the checkpoint holds the key the run started from, not the carried key: a resume replays it")
    if bits == _bits(stream[n - 1][1]) or bits == _bits(stream[n - 1][2]):
        fail(f"{what}: the checkpoint holds a step's key (k_batch or k_noise), not the carried key")
    if n >= 2 and bits == _bits(stream[n - 2][0]):
        fail(f"{what}: the checkpoint holds the carried key of one step earlier: a resume repeats a step (off by one)")
    fail(f"{what}: the checkpoint's key is not the carried key after the last split; a resume would draw other keys")


@check_case("stopped at step k and resumed: exactly the keys and bitwise the params of the uninterrupted run")
def _tu_resume(fn: Callable[..., Any]) -> None:
    import jax

    seed, total = 3, 8
    stream = naive_keys(seed, total)
    straight = _fresh(seed)["params"]
    for _, kb, kn in stream:
        straight = _params_after(straight, _bits(kb), _bits(kn))
    for k, on_disk in ((1, False), (3, True), (5, False), (7, True)):
        first, _, _ = _tu_run(fn, _fresh(seed), k)
        if on_disk:  # as a checkpoint saved to disk comes back: numpy arrays
            first = dict(
                first, key=jax.random.wrap_key_data(jax.numpy.asarray(np.asarray(jax.random.key_data(first["key"]))))
            )
            first["params"] = np.array(first["params"])
        got, recorder, what = _tu_run(fn, first, total)
        what = f"{what} (resumed at step {k}{', the key loaded from disk' if on_disk else ''})"
        want = _expected_calls(stream, k, total)
        if recorder.calls != want:
            if recorder.calls[:1] == _expected_calls(stream, 0, 1):
                fail(f"{what}: the resumed run draws step 0's keys again: it restarts the key stream from the seed")
            if recorder.calls[:1] == _expected_calls(stream, k - 1, k):
                fail(f"{what}: the resumed run repeats step {k - 1}'s keys (off by one): save the carried key")
            if recorder.calls[:1] == _expected_calls(stream, k + 1, k + 2):
                fail(f"{what}: the resumed run skips step {k}'s keys (off by one)")
            first_key = _bits(jax.random.key(seed))
            if _bits(first["key"]) == first_key:
                fail(f"{what}: the checkpoint at step {k} holds the key the run started from, not the carried key")
            _tu_check_stream(recorder.calls, want, what)
        params = np.asarray(got["params"], dtype=np.float64)
        if params.shape != straight.shape or not np.array_equal(params, straight):
            fail(f"{what}: the params differ from the uninterrupted run's; they must be bitwise equal")


@check_case("nothing to do at total_steps; a checkpoint's step counts the steps done")
def _tu_noop(fn: Callable[..., Any]) -> None:
    seed = 11
    first, _, _ = _tu_run(fn, _fresh(seed), 4)
    if first["step"] != 4:
        fail(f"{TU}(fresh, 4, step_fn): the checkpoint's step is {first['step']!r}; expected 4 (off by one)")
    again, recorder, what = _tu_run(fn, first, 4)
    if recorder.calls:
        fail(f"{what} ran {len(recorder.calls)} steps; at total_steps nothing runs (off by one)")
    if again["step"] != 4 or _bits(again["key"]) != _bits(first["key"]):
        fail(f"{what} changed the step or the key with nothing to do")


@check_case(
    "the state restored is the checkpoint's: its key (a run that started from another key than key(seed)) "
    "and its params"
)
def _tu_restored(fn: Callable[..., Any]) -> None:
    import jax

    seed, k, total = 3, 4, 9
    start = jax.random.fold_in(jax.random.key(seed), 1)  # rank 1 of a data-parallel run: its own stream
    stream = naive_keys(seed, total, start=start)
    params = np.array([0.25, -1.5, 3.0])
    for _, kb, kn in stream[:k]:
        params = _params_after(params, _bits(kb), _bits(kn))
    checkpoint = {"seed": seed, "step": k, "params": params, "key": stream[k - 1][0]}
    got, recorder, what = _tu_run(fn, checkpoint, total)
    what = f"{what} (a run that started from fold_in(key({seed}), 1), saved at step {k})"
    want = _expected_calls(stream, k, total)
    if recorder.calls != want:
        if recorder.calls[:1] == _expected_calls(naive_keys(seed, k + 1), k, k + 1):
            fail(
                f"{what}: the resumed run draws the keys of key({seed})'s stream, replayed from the seed: restore "
                "the key the checkpoint holds; it is the run's random state, whatever key the run started from"
            )
        _tu_check_stream(recorder.calls, want, what)
    if recorder.first_params is not None and not np.array_equal(recorder.first_params, params):
        fail(f"{what}: the first step was given params {recorder.first_params.tolist()}, not the checkpoint's")
    final = params
    for _, kb, kn in stream[k:total]:
        final = _params_after(final, _bits(kb), _bits(kn))
    if not np.array_equal(np.asarray(got["params"], dtype=np.float64), final):
        fail(f"{what}: the params differ from the run's own continuation; they must be bitwise equal")
    _tu_check_key(got["key"], stream, total, start, what)


TRAIN_UNTIL = Exercise(
    name=TU,
    points=10,
    title="resume a JAX key stream exactly: carry the split key, save the carried key",
    checks=(_tu_straight, _tu_resume, _tu_restored, _tu_noop),
    hints=(
        "a resumed run is the same loop as a fresh one, started where the checkpoint says and from the state it "
        "holds: what must the loop carry from one step to the next?",
        "the checkpoint's key is the key after the last step's split, the one the next step would split: save "
        "the carried key, never k_batch or k_noise",
        "the returned checkpoint has the same four fields as the one given; which of them change, and what does "
        "step count once the loop is done?",
    ),
)

EXERCISES: tuple[Exercise, ...] = (COMMIT_CHECKPOINT, NEWEST_COMPLETE, OPTIMAL_INTERVAL, TRAIN_UNTIL)
