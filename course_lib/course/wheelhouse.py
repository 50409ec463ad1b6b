"""``course wheelhouse``: a folder of wheels for installing the course with no network.

For a workshop room whose network cannot take everyone downloading the same wheels
(about 560 MB for Python 3.11 on Linux x86-64, measured; the installed venv is ~1.9 GB)::

    course wheelhouse /media/stick/wheels --python-version 3.11 --platform manylinux_2_28_x86_64
    # in the room, in the course checkout, with no network:
    make install WHEELHOUSE=/media/stick/wheels
    # or, without make:
    python3.11 -m venv .venv && .venv/bin/pip install --no-index --find-links /media/stick/wheels -e .

What goes in the folder:

- every pin of ``pyproject.toml``'s ``dependencies`` and what they need, resolved by
  ``pip download --only-binary=:all:`` for the given Python version and platform(s) (one
  resolution per platform; default: this interpreter's), with the build backend
  (``[build-system] requires``: setuptools, wheel) in the same resolution, because the
  editable install ``make install`` does (``pip install -e .``) builds the course;
- the course's own wheel, built with ``pip wheel --no-deps`` from a clean copy of the
  checkout, with ``--no-index --find-links DIR``: the build finds its backend in the
  wheelhouse, which shows the backend is there;
- ``MANIFEST.json`` (Python version, platforms, each file with its size, sha256, Requires-Python
  and where pip took it from, the total size, pip's version and configuration, the course
  version, the date) and ``README.txt`` (the install command); ``pip.log`` holds pip's output.

Two things pip does not do for you, done here: ``--platform manylinux_2_28_x86_64`` is
expanded to every older manylinux tag (pip takes it literally, and jaxlib 0.10.2 is a
``manylinux_2_27`` wheel); and ``--python-version 3.11`` is read by pip as 3.11.0, while
pymdown-extensions 13.1 needs 3.11.5: the resolution is redone for the oldest release the
pins allow, and the manifest records it (``python_at_least``), which ``--check`` enforces.

pip runs with this machine's configuration (``pip config list``: find-links, extra index
URLs, a constraint file), which the manifest records. Here that configuration holds the
CPU build of torch (``torch-2.13.0+cpu``, a local wheel for Python 3.11): a wheelhouse
built where there is no such wheel gets the registry's torch 2.13.0, the CUDA build, with
its ``nvidia-*`` wheels (several GB); the summary says which one it got. For the CPU
build elsewhere, set ``PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu``.

``course wheelhouse --check DIR`` verifies a folder against the Python running it: the
manifest's Python version and platform match this interpreter, every listed file is there
with its sha256, no unlisted wheel lies beside them, every wheel's tags and Requires-Python
admit this interpreter. It needs only the standard library and pip, so it also runs before
the course is installed: ``python3 -m course_lib.course.wheelhouse --check DIR`` from the checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DIST_NAME = "efficient-rl-course"
MANIFEST = "MANIFEST.json"
README = "README.txt"
PIP_LOG = "pip.log"
FORMAT = 1

#: Files of the checkout that building the course's wheel reads (pyproject's readme and package).
_BUILD_FILES = ("pyproject.toml", "README.md")
_BUILD_DIRS = ("course_lib",)
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".mypy_cache", ".ruff_cache")

DOWNLOAD_TIMEOUT_S = 3600
BUILD_TIMEOUT_S = 900
_PIP_TAIL_LINES = 4


class WheelhouseError(Exception):
    """A problem the user can act on; ``run`` prints its message as one ``error:`` line."""


# --------------------------------------------------------------------------- versions and tags


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _spec_allows(version: str, specifier: str) -> bool:
    """Whether ``MAJOR.MINOR`` meets a ``requires-python`` specifier such as ``>=3.11,<3.14``.

    Enough PEP 440 for requires-python: ``>= > <= < == != ~=`` with numeric versions and
    ``==X.Y.*``; a clause it cannot read raises WheelhouseError rather than passing.
    """
    have = _version_tuple(version)
    for clause in filter(None, (c.strip() for c in specifier.split(","))):
        m = re.fullmatch(r"(~=|==|!=|>=|<=|>|<)\s*(\d+(?:\.\d+)*)(\.\*)?", clause)
        if m is None:
            raise WheelhouseError(f"cannot read the requires-python clause {clause!r}")
        op, text, star = m.group(1), m.group(2), m.group(3)
        want = _version_tuple(text)
        if star:
            same = have[: len(want)] == want
            if (op == "==" and not same) or (op == "!=" and same):
                return False
            continue
        n = max(len(have), len(want))
        a, b = have + (0,) * (n - len(have)), want + (0,) * (n - len(want))
        ok = {
            ">=": a >= b,
            ">": a > b,
            "<=": a <= b,
            "<": a < b,
            "==": a == b,
            "!=": a != b,
            "~=": a >= b and have[: len(want) - 1] == want[:-1],
        }[op]
        if not ok:
            return False
    return True


def parse_python_version(text: str, requires_python: str = "") -> str:
    """``"3.11"`` from ``"3.11"`` or ``"311"``, ``"3.11.7"`` from ``"3.11.7"``; checked against
    ``requires_python``. pip reads ``3.11`` as 3.11.0 when it checks a wheel's Requires-Python
    (pymdown-extensions 13.1 needs 3.11.5): give the room's micro release where that matters.

    Raises:
        WheelhouseError: for a string that is not a Python version, or a version the course
            does not support.
    """
    raw = text.strip()
    m = re.fullmatch(r"(\d)\.(\d{1,2})(?:\.(\d{1,3}))?", raw) or re.fullmatch(r"(3)(\d{2})()", raw)
    if m is None:
        raise WheelhouseError(
            f"unknown Python version {text!r}: give MAJOR.MINOR, e.g. --python-version 3.11"
            + (f" (the course supports {requires_python})" if requires_python else "")
        )
    version = f"{int(m.group(1))}.{int(m.group(2))}" + (f".{int(m.group(3))}" if m.group(3) else "")
    # "3.11" names a series: supported if one of its releases is (">=3.11.5": 3.11.5 on); "3.11.2" is one release
    supported = _spec_allows(version, requires_python) if m.group(3) else oldest_release(version, [requires_python])
    if requires_python and not supported:
        raise WheelhouseError(
            f"Python {version} is not supported by the course (pyproject.toml: requires-python {requires_python}); "
            "pick a version inside that range"
        )
    return version


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def host_python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def host_python_full_version() -> str:
    return ".".join(str(n) for n in sys.version_info[:3])


def _allows(version: str, specifier: str) -> bool | None:
    """:func:`_spec_allows`, None where the specifier cannot be read (a wheel's odd Requires-Python)."""
    try:
        return _spec_allows(version, specifier)
    except WheelhouseError:
        return None


def oldest_release(minor: str, specifiers: Iterable[str]) -> str | None:
    """The first ``minor.N`` release every specifier allows (``3.11.5`` for ``>=3.11.5``); None if none."""
    specs = [s for s in specifiers if s]
    for micro in range(100):
        version = f"{minor}.{micro}"
        if all(_allows(version, s) is not False for s in specs):
            return version
    return None


def _tags_module() -> Any:
    """``packaging.tags``, or pip's vendored copy; None where neither is importable."""
    try:
        from packaging import tags

        return tags
    except ImportError:
        pass
    try:
        from pip._vendor.packaging import tags as vendored

        return vendored
    except ImportError:
        return None


def host_platforms() -> list[str]:
    """This interpreter's platform tags, most specific first (``manylinux_2_39_x86_64``, ...)."""
    tags = _tags_module()
    if tags is None:
        import sysconfig

        return [re.sub(r"[-.]", "_", sysconfig.get_platform())]
    return list(dict.fromkeys(tags.platform_tags()))


def native_platform() -> str:
    """The tag recorded for a wheelhouse built for this interpreter's platform: its most specific
    portable one (``manylinux_2_36_x86_64`` rather than the bare ``linux_x86_64`` that
    packaging lists first, which no registry wheel carries)."""
    tags = host_platforms()
    return next((t for t in tags if not t.startswith("linux_")), tags[0])


def host_tags() -> set[str] | None:
    """``py3-none-any``-style strings of every tag this interpreter installs; None if unknown."""
    tags = _tags_module()
    if tags is None:
        return None
    return {str(t) for t in tags.sys_tags()}


def wheel_tags(filename: str) -> set[str]:
    """The expanded ``python-abi-platform`` tags of a wheel file name (compressed sets split)."""
    stem = filename[: -len(".whl")]
    parts = stem.split("-")
    if len(parts) not in (5, 6):
        raise WheelhouseError(f"{filename} is not a wheel file name (name-version[-build]-python-abi-platform.whl)")
    pys, abis, plats = parts[-3], parts[-2], parts[-1]
    return {f"{p}-{a}-{pl}" for p in pys.split(".") for a in abis.split(".") for pl in plats.split(".")}


#: platform tags of the systems the course supports (CONTRIBUTING.md, "Platforms"), for messages
PLATFORM_EXAMPLES = "manylinux_2_28_x86_64 (Linux x86-64) or macosx_14_0_arm64 (macOS 14 or later on Apple silicon)"
#: what ``--help`` says about macOS, checked with pip against its index on 2026-11-28 (``pip index versions torch
#: --platform TAG --python-version 3.11 --only-binary=:all:``): macosx_15_0_x86_64 lists torch 2.0.0-2.2.2 only,
#: macosx_15_0_arm64 lists up to 2.15.0 with 2.13.0, macosx_13_0_arm64 stops at 2.11.0; tests/test_wheelhouse.py
#: checks that pyproject.toml still pins the torch named here
TORCH_PIN = "2.13.0"
MACOS_NOTE = (
    "Linux and macOS only: the course does not run on Windows (use WSL 2, a Linux). macOS on Intel (x86_64) "
    f"cannot install it: PyTorch publishes no macOS x86-64 wheels after torch 2.2 (2.2.2), and the course pins "
    f"torch {TORCH_PIN}. On Apple silicon, torch {TORCH_PIN}'s wheel is macosx_14_0_arm64: it needs macOS 14 or later."
)


def _validate_platform(text: str) -> str:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", text):
        raise WheelhouseError(f"unknown platform tag {text!r}: give a wheel platform tag such as {PLATFORM_EXAMPLES}")
    if text.startswith("win"):
        raise WheelhouseError(
            f'{text} is a Windows tag, and the course does not run on Windows (CONTRIBUTING.md, "Platforms"); in WSL 2 '
            f"the machines install Linux wheels: give a tag such as {PLATFORM_EXAMPLES}"
        )
    return text


_MANYLINUX = re.compile(r"manylinux_(\d+)_(\d+)_(\w+)")
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MUSLLINUX = re.compile(r"musllinux_(\d+)_(\d+)_(\w+)")


def _glibc(tag: str) -> tuple[tuple[int, int], str] | None:
    """``((2, 28), "x86_64")`` for ``manylinux_2_28_x86_64`` (legacy aliases too); None if not manylinux."""
    m = _MANYLINUX.fullmatch(tag)
    if m:
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    legacy, _, arch = tag.partition("_")
    if legacy in _LEGACY_MANYLINUX and arch:
        return _LEGACY_MANYLINUX[legacy], arch
    return None


def expand_platform(tag: str) -> list[str]:
    """The tags a machine of platform ``tag`` installs, for pip's ``--platform`` (repeated).

    pip takes ``--platform manylinux_2_28_x86_64`` literally (a ``manylinux_2_27`` wheel, as
    jaxlib 0.10.2's, does not match it), while a glibc 2.28 machine installs every older
    manylinux tag: those are listed here, legacy aliases included, and older musllinux ones
    likewise. Other tags (macOS) pip expands itself.
    """
    glibc = _glibc(tag)
    if glibc is not None:
        (major, minor), arch = glibc
        tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
        tags += [f"{alias}_{arch}" for alias, floor in _LEGACY_MANYLINUX.items() if (major, minor) >= floor]
        return tags
    m = _MUSLLINUX.fullmatch(tag)
    if m:
        return [f"musllinux_{m.group(1)}_{n}_{m.group(3)}" for n in range(int(m.group(2)), -1, -1)]
    return [tag]


def needed_platform(filenames: Iterable[str], fallback: str) -> str:
    """The oldest manylinux tag every platform-specific wheel of ``filenames`` installs on.

    A wheelhouse resolved for this interpreter's platform is recorded with the platform it
    needs (``manylinux_2_28_x86_64`` when torch's wheel is the newest requirement) rather than
    this machine's glibc, so that ``--check`` on an older machine of the room passes when it
    should. ``fallback`` where some wheel is not manylinux or all are pure Python.
    """
    needs: list[tuple[tuple[int, int], str]] = []
    for name in filenames:
        plats = {t.split("-")[2] for t in wheel_tags(name)}
        if plats == {"any"}:
            continue
        glibcs = [g for g in map(_glibc, plats) if g is not None]
        if not glibcs:
            return fallback
        needs.append(min(glibcs))
    if not needs or len({arch for _, arch in needs}) > 1:
        return fallback
    (major, minor), arch = max(needs)
    return f"manylinux_{major}_{minor}_{arch}"


# --------------------------------------------------------------------------- the project


@dataclass(frozen=True)
class Project:
    root: Path
    version: str
    requires_python: str
    dependencies: tuple[str, ...]
    build_requires: tuple[str, ...]
    optional: dict[str, tuple[str, ...]] = field(default_factory=dict)


def load_project(root: Path | None = None) -> Project:
    """The course's pins and build requirements from its checkout's ``pyproject.toml``.

    Raises:
        WheelhouseError: if there is no checkout (the course was installed from a wheel).
    """
    if root is None:
        from course_lib.course.paths import repo_root

        try:
            root = repo_root()
        except FileNotFoundError as exc:
            raise WheelhouseError(f"course wheelhouse builds the course's wheel from its checkout, and {exc}") from None
    path = root / "pyproject.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise WheelhouseError(f"cannot read {path}: {exc}") from None
    proj = data.get("project", {})
    return Project(
        root=root,
        version=str(proj.get("version", "0")),
        requires_python=str(proj.get("requires-python", "")),
        dependencies=tuple(proj.get("dependencies", [])),
        build_requires=tuple(data.get("build-system", {}).get("requires", ["setuptools", "wheel"])),
        optional={k: tuple(v) for k, v in proj.get("optional-dependencies", {}).items()},
    )


def _course_version() -> str:
    from importlib import metadata

    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        try:
            return load_project().version
        except WheelhouseError:
            return "unknown"


# --------------------------------------------------------------------------- pip


_SECRET = re.compile(r"(://)[^/@\s]+@")


def _redact(text: str) -> str:
    return _SECRET.sub(r"\1****@", text)


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PIP_NO_INPUT", "1")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def pip_version(python: str = sys.executable) -> str:
    out = subprocess.run(
        [python, "-m", "pip", "--version"], capture_output=True, text=True, timeout=120, env=_pip_env()
    )
    m = re.match(r"pip (\S+)", out.stdout)
    return m.group(1) if m else "unknown"


def pip_configuration() -> dict[str, Any]:
    """What shapes pip's choices here: ``pip config list`` and the ``PIP_*`` environment (URLs redacted)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=120
        )
        config = [_redact(line) for line in out.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired) as exc:
        config = [f"(pip config list failed: {exc})"]
    env = {k: _redact(v) for k, v in sorted(os.environ.items()) if k.startswith("PIP_")}
    return {"config": config, "env": env}


class PipFailed(WheelhouseError):
    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


def _tail(output: str, n: int = _PIP_TAIL_LINES) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip() and "is ignored: it is neither" not in ln]
    lines = [ln if len(ln) <= 240 else ln[:120] + " … " + ln[-100:] for ln in lines[-n:]]
    return " | ".join(lines) if lines else "(no output)"


def run_pip(python: str, args: Sequence[str], log: Path, timeout: float, what: str) -> str:
    """Run ``python -m pip ARGS``, append its output to ``log``; return the output.

    Raises:
        PipFailed: pip's failure in one line, with its last lines and the log's path.
    """
    cmd = [python, "-m", "pip", *args]
    with log.open("a") as fh:
        fh.write(f"$ {_redact(' '.join(cmd))}\n")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_pip_env())
    except subprocess.TimeoutExpired as exc:
        partial_out = exc.stdout if isinstance(exc.stdout, str) else ""
        raise PipFailed(
            f"{what}: pip did not finish within {timeout:.0f} s (slow or unreachable index?): {_tail(partial_out)}",
            partial_out,
        ) from None
    output = proc.stdout + proc.stderr
    with log.open("a") as fh:
        fh.write(output + f"(exit {proc.returncode})\n\n")
    if proc.returncode != 0:
        raise PipFailed(f"{what}: pip failed (exit {proc.returncode}): {_tail(output)} (full output: {log})", output)
    return output


class NeedsLaterPython(WheelhouseError):
    """A pin's Requires-Python excludes the requested release; ``release`` is the oldest it allows."""

    def __init__(self, message: str, release: str | None, requirement: str, specifier: str) -> None:
        super().__init__(message)
        self.release, self.requirement, self.specifier = release, requirement, specifier


_NO_MATCH = re.compile(r"No matching distribution found for (\S+)")
_OTHER_PYTHON = re.compile(r"Package '([^']+)' requires a different Python: (\S+) not in '([^']*)'")
_IGNORED = re.compile(r"Ignored the following versions that require a different python version: (.*)")
_NO_VERSION = re.compile(r"satisfies the requirement (\S+)(?: \(from (?!versions)([^)]*)\))?")


def _needs_later_python(exc: PipFailed, req: str, needed_by: str, spec: str, python_version: str) -> NeedsLaterPython:
    example = oldest_release(_minor(python_version), [spec])
    read_as = " (pip reads that as .0)" if python_version.count(".") == 1 else ""
    fix = (
        f"give the room's exact release, e.g. --python-version {example}, if every machine has at least that"
        if example
        else f"pick a Python that {spec} allows"
    )
    return NeedsLaterPython(
        f"{req}{needed_by} needs Python {spec} (its Requires-Python), and this wheelhouse is for Python "
        f"{python_version}{read_as}: {fix}; or pin an older release of it. pip said: {_tail(exc.output, 1)}",
        release=example if example and _version_tuple(example) > _version_tuple(python_version) else None,
        requirement=req,
        specifier=spec,
    )


def _no_wheel_error(exc: PipFailed, python_version: str, platform: str) -> WheelhouseError | None:
    """The one-line 'no wheel for X' message when pip found no candidate, else None."""
    other = _OTHER_PYTHON.search(exc.output)  # a find-links wheel whose METADATA excludes this Python
    if other:
        return _needs_later_python(exc, other.group(1), "", other.group(3), python_version)
    m = _NO_MATCH.search(exc.output)
    if m is None:
        return None
    req = m.group(1)
    needed_by = ""
    for v in _NO_VERSION.finditer(exc.output):
        if v.group(1) == req and v.group(2):
            needed_by = f" (needed by {v.group(2)})"
    ignored = _IGNORED.search(exc.output)
    if ignored:
        entries = [e.strip() for e in ignored.group(1).split(";") if "Requires-Python" in e]
        pinned = re.search(r"===?\s*([^\s,;]+)", req)
        chosen = [e for e in entries if pinned and e.split()[0] == pinned.group(1)] or entries[-1:]
        if chosen:
            spec = chosen[0].split("Requires-Python", 1)[1].strip()
            return _needs_later_python(exc, req, needed_by, spec, python_version)
    return WheelhouseError(
        f"no wheel of {req}{needed_by} for Python {python_version} on {platform} in the indexes pip uses here "
        "(see `pip config list`; a wheelhouse takes wheels only, no source archives). "
        f"Pick a --python-version/--platform it publishes wheels for, or build the wheel on a {platform} machine "
        f"with Python {python_version} (`pip wheel '{req}' -w WHEELS`) and pass --find-links WHEELS. "
        f"pip said: {_tail(exc.output, 2)}"
    )


_SAVED = re.compile(r"^(?:Saved|File was already downloaded) (.+\.whl)\s*$", re.M)
_LOCAL = re.compile(r"^Processing (\S+\.whl)", re.M)


def _sources(output: str) -> dict[str, str]:
    """File name -> where pip took it: a local path, or 'index' (downloaded or pip's cache)."""
    local = {Path(p).name: p for p in _LOCAL.findall(output)}
    return {Path(p).name: local.get(Path(p).name, "index") for p in _SAVED.findall(output)}


def _python_for(version: str) -> tuple[str, str]:
    """The interpreter to run pip under for ``version``, and a note on how markers are evaluated.

    ``pip download --python-version`` checks wheel tags and Requires-Python for the target but
    evaluates environment markers (``; python_version < "3.12"``) for the Python running pip,
    so a matching ``pythonX.Y`` with pip is used where there is one.
    """
    if version == host_python_version():
        return sys.executable, "resolved by this interpreter"
    found = shutil.which(f"python{version}")
    if found:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            probe = subprocess.run(
                [found, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            if probe.returncode == 0 and probe.stdout.strip() == version:
                return found, f"resolved by {found} (markers evaluated for Python {version})"
    return sys.executable, (
        f"resolved by Python {host_python_version()} with --python-version {version}: no python{version} with pip "
        f"on PATH, so environment markers were evaluated for Python {host_python_version()}"
    )


# --------------------------------------------------------------------------- files


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def wheel_requires_python(path: Path) -> str:
    """The ``Requires-Python`` of a wheel's METADATA ('' where it has none)."""
    from email.parser import HeaderParser

    try:
        with zipfile.ZipFile(path) as zf:
            name = next((n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), None)
            if name is None:
                raise WheelhouseError(f"{path.name} has no .dist-info/METADATA: it is not a wheel")
            meta = HeaderParser().parsestr(zf.read(name).decode("utf-8", "replace"))
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelhouseError(f"cannot read {path}: {exc}") from None
    return str(meta.get("Requires-Python") or "").strip()


def _prepare_dir(directory: Path) -> dict[str, Any] | None:
    """Create ``directory`` (and parents), check it is writable; return a previous manifest.

    A folder may be reused only if it is empty or a previous wheelhouse (its manifest lists
    what it holds), so that no stray wheel changes what pip installs from it.
    """
    if directory.exists() and not directory.is_dir():
        raise WheelhouseError(f"{directory} exists and is not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise WheelhouseError(
            f"cannot write to {directory} ({exc.strerror or exc}): give a folder you can write to"
        ) from None
    old = None
    manifest = directory / MANIFEST
    if manifest.exists():
        with contextlib.suppress(OSError, ValueError):
            old = json.loads(manifest.read_text())
    known = {f["name"] for f in (old or {}).get("files", [])} | {MANIFEST, README, PIP_LOG}
    strays = sorted(p.name for p in directory.iterdir() if p.name not in known and not p.name.startswith("."))
    if strays:
        shown = ", ".join(strays[:5]) + (f" and {len(strays) - 5} more" if len(strays) > 5 else "")
        raise WheelhouseError(
            f"{directory} already holds files that are not from a wheelhouse ({shown}): give an empty or new folder"
        )
    return old


def _merge(src_dir: Path, directory: Path) -> list[str]:
    """Move the wheels of ``src_dir`` into ``directory``; return their names."""
    names = []
    for path in sorted(src_dir.glob("*.whl")):
        target = directory / path.name
        if target.exists() and target.stat().st_size == path.stat().st_size and sha256_of(target) == sha256_of(path):
            path.unlink()
        else:
            os.replace(path, target)
        names.append(path.name)
    return names


# --------------------------------------------------------------------------- building


@dataclass
class BuildOptions:
    python_version: str | None = None  # None: this interpreter's
    platforms: tuple[str, ...] = ()  # empty: this interpreter's
    extras: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    extra_index_urls: tuple[str, ...] = ()
    no_index: bool = False
    requirements: tuple[str, ...] | None = None  # None: pyproject's dependencies (tests give a few)
    include_project: bool = True


def _requirements(project: Project, opts: BuildOptions) -> list[str]:
    reqs = list(project.dependencies if opts.requirements is None else opts.requirements)
    for extra in opts.extras:
        reqs.extend(project.optional.get(extra, (extra,)))
    if opts.include_project:
        reqs.extend(project.build_requires)
    return list(dict.fromkeys(reqs))


def _index_args(opts: BuildOptions, extra_links: Iterable[str] = ()) -> list[str]:
    args: list[str] = ["--no-index"] if opts.no_index else []
    for url in opts.extra_index_urls:
        args += ["--extra-index-url", url]
    for link in (*opts.find_links, *extra_links):
        args += ["--find-links", link]
    return args


def _copy_checkout(root: Path, dest: Path) -> Path:
    src = dest / "src"
    src.mkdir()
    for name in _BUILD_FILES:
        if (root / name).exists():
            shutil.copy2(root / name, src / name)
    for name in _BUILD_DIRS:
        shutil.copytree(root / name, src / name, ignore=_IGNORE)
    return src


def _torch_note(files: list[dict[str, Any]]) -> str | None:
    torch = [f for f in files if f["name"].lower().startswith("torch-")]
    nvidia = [f for f in files if f["name"].lower().startswith("nvidia_")]
    if not torch:
        return None
    names = ", ".join(f"{f['name']} from {f['source']}" for f in torch)
    if nvidia:
        mb = sum(f["size"] for f in nvidia) / 1e6
        return (
            f"torch: {names}: the CUDA build, with {len(nvidia)} nvidia-* wheels ({mb:.0f} MB); for the CPU build "
            "set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu and build again"
        )
    kind = "the CPU build" if any("+cpu" in f["name"] for f in torch) else "no nvidia-* wheels"
    return f"torch: {names} ({kind})"


def install_command(directory: Path, python_version: str) -> str:
    return (
        f"python{python_version} -m venv .venv && "
        f".venv/bin/pip install --no-index --find-links {_shell_quote(str(directory))} -e ."
    )


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _download(
    python: str,
    opts: BuildOptions,
    version: str,
    platform: str | None,
    label: str,
    reqs: list[str],
    dest: Path,
    log: Path,
    notes: list[str],
) -> tuple[str, str]:
    """``pip download`` for one platform (None: this interpreter's); return pip's output and the
    Python version it resolved for.

    Given ``X.Y`` without a micro release, pip checks Requires-Python against ``X.Y.0``; when a
    pin needs a later release (pymdown-extensions 13.1: ``>=3.11.5``) the download is redone for
    the oldest release that allows it, and a note says so (a few rounds at most).
    """
    micro_given = opts.python_version is None or version.count(".") == 2
    for _ in range(5):
        args = ["download", "--only-binary=:all:", "--dest", str(dest), "--progress-bar", "off"]
        if opts.python_version is not None or _minor(version) != host_python_version():
            args += ["--python-version", version]
        for tag in expand_platform(platform) if platform else []:
            args += ["--platform", tag]
        args += _index_args(opts) + reqs
        print(f"pip download: {len(reqs)} requirements for Python {version} on {label} ...", flush=True)
        try:
            return run_pip(python, args, log, DOWNLOAD_TIMEOUT_S, f"pip download for {label}"), version
        except PipFailed as exc:
            error = _no_wheel_error(exc, version, label)
            if not isinstance(error, NeedsLaterPython) or error.release is None or micro_given:
                raise (error or exc) from None
            notes.append(
                f"{error.requirement} needs Python {error.specifier}: resolved for Python {error.release} "
                f"instead of {version}"
            )
            version = error.release
    raise WheelhouseError(f"pip download for {label}: gave up after 5 rounds of raising the Python release ({notes})")


def _python_floor(directory: Path, files: list[dict[str, Any]], minor: str, notes: list[str]) -> str:
    """The oldest ``minor.N`` release every wheel's Requires-Python allows (a note names the wheels that set it)."""
    specs = {f["name"]: wheel_requires_python(directory / f["name"]) for f in files}
    at_least = oldest_release(minor, specs.values())
    if at_least is None:
        raise WheelhouseError(f"no Python {minor} release satisfies every wheel's Requires-Python: {specs}")
    if not at_least.endswith(".0"):
        below = f"{minor}.{int(at_least.rsplit('.', 1)[1]) - 1}"
        setters = [f"{n} ({s})" for n, s in specs.items() if _allows(below, s) is False]
        notes.append(f"needs Python {at_least} or a later {minor} release: {', '.join(setters)}")
    return at_least


def build_wheelhouse(directory: Path, opts: BuildOptions, project: Project | None = None) -> dict[str, Any]:
    """Fill ``directory`` with wheels, ``MANIFEST.json`` and ``README.txt``; return the manifest.

    Raises:
        WheelhouseError: bad version or folder, pip's failure, or a dependency with no wheel.
    """
    project = project or load_project()
    version = parse_python_version(opts.python_version or host_python_version(), project.requires_python)
    minor = _minor(version)
    given = tuple(_validate_platform(p) for p in opts.platforms)
    directory = directory.expanduser().resolve()
    old = _prepare_dir(directory)
    log = directory / PIP_LOG
    log.write_text("")
    python, resolver = _python_for(minor)
    notes = [resolver]
    reqs = _requirements(project, opts)
    by_name: dict[str, dict[str, Any]] = {}
    indexes: list[str] = []
    platforms: list[str] = []
    for platform in given or (None,):
        label = platform or native_platform()
        with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as tmp:
            output, version = _download(python, opts, version, platform, label, reqs, Path(tmp), log, notes)
            indexes += [
                ln.strip() for ln in output.splitlines() if ln.startswith(("Looking in indexes", "Looking in links"))
            ]
            sources = _sources(output)
            names = _merge(Path(tmp), directory)
            if platform is None:  # this interpreter's platform: record the one these wheels need
                label = needed_platform(names, label)
            platforms.append(label)
            for name in names:
                entry = by_name.setdefault(name, {"name": name, "source": sources.get(name, "index"), "platforms": []})
                entry["platforms"].append(label)
    if opts.include_project:
        print(
            "pip wheel --no-deps: the course's own wheel, its build backend taken from the wheelhouse ...", flush=True
        )
        with tempfile.TemporaryDirectory(prefix="course-wheel-") as tmp:
            src = _copy_checkout(project.root, Path(tmp))
            out = Path(tmp) / "out"
            args = ["wheel", "--no-deps", "--wheel-dir", str(out), "--progress-bar", "off"]
            args += [
                "--no-index",
                "--find-links",
                str(directory),
                *(a for link in opts.find_links for a in ("--find-links", link)),
            ]
            run_pip(sys.executable, [*args, str(src)], log, BUILD_TIMEOUT_S, "pip wheel (the course's own wheel)")
            for name in _merge(out, directory):
                by_name[name] = {"name": name, "source": f"built from {project.root}", "platforms": list(platforms)}
    # wheels of a previous build that this one no longer needs
    for f in (old or {}).get("files", []):
        if f["name"] not in by_name:
            with contextlib.suppress(FileNotFoundError):
                (directory / f["name"]).unlink()
    files = []
    for name in sorted(by_name, key=str.lower):
        path = directory / name
        files.append(
            {
                **by_name[name],
                "size": path.stat().st_size,
                "sha256": sha256_of(path),
                "requires_python": wheel_requires_python(path),
            }
        )
    total = sum(f["size"] for f in files)
    at_least = _python_floor(directory, files, minor, notes)
    torch_note = _torch_note(files)
    if torch_note:
        notes.append(torch_note)
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "course": {"name": DIST_NAME, "version": project.version},
        "python_version": minor,
        "python_at_least": at_least,
        "python_requested": opts.python_version,
        "platforms": platforms,
        "platforms_from": "--platform" if given else "this interpreter (the oldest tag its wheels install on)",
        "built_on": {"python": sys.version.split()[0], "platform": native_platform()},
        "pip": {
            "version": pip_version(python),
            "python": python,
            "sources": sorted(set(indexes)),
            **pip_configuration(),
        },
        "requirements": reqs,
        "install": install_command(directory, minor),
        "notes": notes,
        "files": files,
        "file_count": len(files),
        "total_size": total,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    (directory / README).write_text(_readme(directory, manifest))
    return manifest


def _readme(directory: Path, m: dict[str, Any]) -> str:
    return (
        f"{m['install']}\n"
        f"\n"
        f"Run that line in the course checkout, with no network needed (if this folder has moved, put its new path\n"
        f"after --find-links). With make: make install WHEELHOUSE={_shell_quote(str(directory))}\n"
        f"To verify the folder first, in the checkout: python{m['python_version']} -m course_lib.course.wheelhouse --check "
        f"{_shell_quote(str(directory))}\n"
        f"\n"
        f"Wheels of the Efficient RL Systems course {m['course']['version']} and everything it needs, for Python "
        f"{m['python_at_least']} or a later {m['python_version']} release on {', '.join(m['platforms'])}: {m['file_count']} files, {m['total_size'] / 1e6:.1f} MB, "
        f"made {m['created']} by `course wheelhouse` (MANIFEST.json lists each file with its sha256).\n"
    )


# --------------------------------------------------------------------------- checking


def _load_manifest(directory: Path) -> dict[str, Any]:
    if not directory.is_dir():
        raise WheelhouseError(f"{directory} is not a folder" if directory.exists() else f"no such folder: {directory}")
    path = directory / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise WheelhouseError(f"{directory} holds no {MANIFEST}: it was not made by `course wheelhouse`") from None
    except (OSError, ValueError) as exc:
        raise WheelhouseError(f"cannot read {path}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "files" not in manifest:
        raise WheelhouseError(f"{path} is not a course wheelhouse manifest (format {FORMAT})")
    return manifest


def check_wheelhouse(directory: Path) -> str:
    """Verify ``directory`` against this interpreter; return the one-line verdict.

    Raises:
        WheelhouseError: naming every problem found (another Python or platform, a missing
            or changed file, an unlisted wheel, a wheel that does not install here).
    """
    directory = directory.expanduser().resolve()
    m = _load_manifest(directory)
    here_version = host_python_version()
    built_for = str(m.get("python_version"))
    if built_for != here_version:
        raise WheelhouseError(
            f"{directory} was built for Python {built_for}, but this interpreter ({sys.executable}) is Python "
            f"{sys.version.split()[0]}: install with a Python {built_for}, or build a wheelhouse for this one "
            f"(`course wheelhouse DIR --python-version {here_version}`)"
        )
    platforms = [str(p) for p in m.get("platforms", [])]
    here_platforms = host_platforms()
    matching = [p for p in platforms if p in here_platforms]
    if not matching:
        raise WheelhouseError(
            f"{directory} was built for platform {', '.join(platforms) or '(none recorded)'}, but this interpreter "
            f"installs {native_platform()} (and older tags of the same family): build a wheelhouse with "
            f"--platform {native_platform()}"
        )
    problems: list[str] = []
    here_full = host_python_full_version()
    at_least = str(m.get("python_at_least") or built_for)
    if not re.fullmatch(r"\d+(\.\d+)*", at_least):
        raise WheelhouseError(f"{directory / MANIFEST}: unreadable python_at_least {at_least!r}")
    if _version_tuple(here_full) < _version_tuple(at_least):
        problems.append(f"its wheels need Python {at_least} or a later {built_for} release, and this is {here_full}")
    tags = host_tags()
    listed = set()
    for f in m["files"]:
        name = f["name"]
        listed.add(name)
        path = directory / name
        if not path.is_file():
            problems.append(f"{name} is missing")
            continue
        size = path.stat().st_size
        digest = sha256_of(path)
        if digest != f.get("sha256"):
            problems.append(
                f"sha256 mismatch for {name} (manifest {str(f.get('sha256'))[:12]}…, file {digest[:12]}…, "
                f"{size} bytes vs {f.get('size')}): the file changed or was damaged in copying"
            )
            continue
        if tags is not None and set(f.get("platforms", platforms)) & set(matching) and not wheel_tags(name) & tags:
            problems.append(f"{name} does not install on this interpreter (its tags: {name.rsplit('-', 3)[1:]})")
        spec = str(f.get("requires_python") or "")
        if spec and _allows(here_full, spec) is False:
            problems.append(f"{name} needs Python {spec}, and this interpreter is {here_full}")
    strays = sorted(p.name for p in directory.glob("*.whl") if p.name not in listed)
    problems += [f"{name} is not in the manifest (pip could install it instead of a listed wheel)" for name in strays]
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more" if len(problems) > 6 else "")
        raise WheelhouseError(f"{directory}: {len(problems)} problem(s): {shown}")
    total = sum(int(f.get("size", 0)) for f in m["files"])
    tag_note = "" if tags is not None else " (wheel tags not checked: neither packaging nor pip importable)"
    return (
        f"OK: {directory}: {len(m['files'])} files, {total / 1e6:.1f} MB, every sha256 matches; built for Python "
        f"{at_least}+ on {', '.join(platforms)}, which this interpreter (Python {sys.version.split()[0]}, "
        f"{native_platform()}) installs; made {m.get('created', '?')} with pip {m.get('pip', {}).get('version', '?')}, "
        f"course {m.get('course', {}).get('version', '?')}{tag_note}"
    )


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = f"Platforms: {MACOS_NOTE}"
    parser.add_argument("dir", type=Path, metavar="DIR", help="the folder to fill (created if missing), or to check")
    parser.add_argument(
        "--check",
        action="store_true",
        help="verify DIR against this interpreter (Python version, platform, every sha256) instead of building it",
    )
    parser.add_argument(
        "--python-version",
        metavar="X.Y[.Z]",
        help="the Python of the machines that will install (default: this interpreter's, "
        f"{host_python_full_version()}); pip reads X.Y as X.Y.0, raised here to the release the pins need",
    )
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="TAG",
        help="wheel platform tag of those machines, e.g. manylinux_2_28_x86_64 or macosx_14_0_arm64 (repeat for a "
        "mixed room: one resolution each); default: this interpreter's. No Windows tags, and no macosx_*_x86_64: "
        "see below",
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="REQ",
        help="another requirement to include, e.g. --extra ray==2.60.0 (or an optional-dependencies group name)",
    )
    parser.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR_OR_URL",
        help="also look for wheels there (pip's --find-links), e.g. wheels you built yourself",
    )
    parser.add_argument(
        "--extra-index-url", action="append", default=[], metavar="URL", help="also use this package index"
    )
    parser.add_argument(
        "--no-index", action="store_true", help="use only --find-links and pip's configured find-links, no index"
    )


def run(args: argparse.Namespace) -> int:
    try:
        if args.check:
            given = [
                opt
                for opt, value in (
                    ("--python-version", args.python_version),
                    ("--platform", args.platform),
                    ("--extra", args.extra),
                    ("--find-links", args.find_links),
                    ("--extra-index-url", args.extra_index_url),
                    ("--no-index", args.no_index),
                )
                if value
            ]
            if given:
                raise WheelhouseError(
                    f"--check verifies DIR against the Python running it and takes no {', '.join(given)}"
                )
            print(check_wheelhouse(args.dir))
            return 0
        opts = BuildOptions(
            python_version=args.python_version,
            platforms=tuple(args.platform),
            extras=tuple(args.extra),
            find_links=tuple(str(Path(p).expanduser().resolve()) if "://" not in p else p for p in args.find_links),
            extra_index_urls=tuple(args.extra_index_url),
            no_index=args.no_index,
        )
        manifest = build_wheelhouse(args.dir, opts)
    except WheelhouseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in manifest["notes"]:
        print(f"note: {note}")
    directory = args.dir.expanduser().resolve()
    print(
        f"wheelhouse {directory}: {manifest['file_count']} files, total {manifest['total_size'] / 1e6:.1f} MB "
        f"(Python {manifest['python_at_least']}+, {', '.join(manifest['platforms'])}); MANIFEST.json and README.txt written"
    )
    print(f"install with no network, in the course checkout: {manifest['install']}")
    print(f"  or: make install WHEELHOUSE={_shell_quote(str(directory))}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.course.wheelhouse``: works before the course is installed."""
    parser = argparse.ArgumentParser(
        prog="course wheelhouse", description="wheels of everything the course needs, for an install with no network"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
