"""``course doctor``: check that this machine can run the course.

Every check is a small function returning ``(status, detail)``; :func:`run_checks` runs
them in order and turns any exception into a FAIL line, so the doctor itself never
shows a traceback. The report is a fenced ``text`` block a learner can paste into an
issue as is::

    from course_lib.course.doctor import doctor
    results = doctor()          # prints the block, returns list[DoctorResult]

Heavy libraries (torch, jax, gymnasium, ...) are imported inside the checks, so
importing this module (and ``course --help``) stays fast.

``course doctor --time`` (opt-in) adds one short line: lesson 00 run headless in a fresh
kernel against its time on BENCHMARKS.md's reference machine, and the factor between them,
which ``course pace --machine-factor`` takes to pace a workshop on this machine. How each
time was taken, and the reference machine, go to the JSON (``--json``), not the line:
see :data:`TIME_METHOD` and :data:`TIME_NOTE`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from types import ModuleType

DIST_NAME = "efficient-rl-course"
INSTALL_HINT = "run `make lab` or `pip install -e .`"
MIN_PYTHON = (3, 11)  # pyproject.toml's requires-python: JAX 0.10, NumPy 2.4 and ipykernel 7 need 3.11
MAX_PYTHON = (3, 14)  # exclusive, as pyproject.toml's requires-python
MIN_CORES = 2
MIN_MEMORY_GIB = 4.0

STATUSES = ("PASS", "WARN", "FAIL")

# (distribution name, import name) of the packages whose versions the report shows.
PACKAGES: tuple[tuple[str, str], ...] = (
    ("jax", "jax"),
    ("jaxlib", "jaxlib"),
    ("torch", "torch"),
    ("gymnasium", "gymnasium"),
    ("jupyterlab", "jupyterlab"),
    ("ipywidgets", "ipywidgets"),
    ("numpy", "numpy"),
    ("matplotlib", "matplotlib"),
    ("nbval", "nbval"),
    # the libraries later lessons import (04-06, 10, 08)
    ("optax", "optax"),
    ("flax", "flax"),
    ("chex", "chex"),
    ("flashbax", "flashbax"),
    ("orbax-checkpoint", "orbax.checkpoint"),
    ("safetensors", "safetensors"),
    ("simpy", "simpy"),
    ("shapely", "shapely"),
    ("ray", "ray"),  # lesson 12 (core only: ray[rllib] pins an older gymnasium)
)

#: packages only some lessons import: missing, they warn (naming those lessons) instead of failing,
#: so a platform without them still runs the rest of the course
ONLY_FOR: dict[str, str] = {"ray": "lesson 12 (the capstone on Ray)"}

#: checks that only running the notebooks in Jupyter needs: without a kernel (``course run
#: --no-kernel``, ``course doctor --no-kernel``) their FAIL is a WARN, so a GPU machine with only
#: the course's libraries passes
NOTEBOOK_ONLY: frozenset[str] = frozenset({"jupyterlab", "ipywidgets", "nbval", "kernel python3"})
NO_KERNEL_NOTE = "only notebooks in Jupyter need it; `course run --no-kernel` runs the lessons without"

# Gymnasium environment ids the lessons construct; later lessons append theirs here.
ENVIRONMENTS: tuple[str, ...] = ("CartPole-v1",)

_NAME_WIDTH = 16
NETNS_NAME = "loopback netns"
_DETAIL_LIMIT = 400

# `course doctor --time`: lesson 00 run headless against BENCHMARKS.md's reference time.
TIME_LESSON = "00_welcome"
TIME_NAME = "lesson 00 time"
TIME_TIMEOUT_S = 300
#: above this factor (this machine's time / the reference's) the time line warns
TIME_WARN_FACTOR = 2.0
#: how ``--time`` measures (the JSON's ``lesson_time.method``)
TIME_METHOD = (
    "`course build`'s executor (nbclient), a fresh python3 kernel, the cpu scale; wall-clock seconds from "
    "kernel start to kernel shutdown"
)
#: why nothing is subtracted, and how much of the factor is noise (the JSON's ``lesson_time.note``; --help)
TIME_NOTE = (
    "Both times include a kernel start and shutdown (BENCHMARKS.md's nbval time counts them in its first and last "
    "cells), so nothing is subtracted: the reference's kernel start was not recorded apart, and here an empty "
    "notebook's kernel start and stop took 0.8-4.1 s from one run to the next. Lesson 00 is short and its time "
    "follows the machine's load as much as its speed: on a 2-core development machine it took 13.2-16.1 s near "
    "idle and 13.3-24.1 s in 6 runs at load averages 1.5-5 (BENCHMARKS.md, 'Portability'), so on a loaded machine "
    "a factor up to about 1.5 is measurement noise. Time an idle laptop, twice if the factor decides anything."
)
_TIME_ERROR_MARK = "course doctor --time error: "


@dataclass(frozen=True)
class DoctorResult:
    """One line of the doctor's report.

    Attributes:
        name: what was checked (``"torch"``, ``"scale"``, ``"env CartPole-v1"``).
        status: ``"PASS"``, ``"WARN"`` or ``"FAIL"``.
        detail: what was found, and for WARN/FAIL what to do about it.
    """

    name: str
    status: str
    detail: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    def line(self) -> str:
        return f"{self.status:<4}  {self.name:<{_NAME_WIDTH}} {self.detail}"


Outcome = tuple[str, str]  # (status, detail) returned by every check function


# --------------------------------------------------------------------------- helpers


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _DETAIL_LIMIT else text[: _DETAIL_LIMIT - 3] + "..."


def _describe(exc: BaseException) -> str:
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence warnings and the "No GPU/TPU found"-style log lines of jax/absl."""
    loggers = [logging.getLogger(n) for n in ("jax", "jax._src.xla_bridge", "absl")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _pins() -> dict[str, str]:
    """Pinned specifiers by normalised distribution name, from the installed metadata.

    Raises:
        importlib.metadata.PackageNotFoundError: if the course is not installed.
    """
    from importlib import metadata

    pins: dict[str, str] = {}
    for requirement in metadata.requires(DIST_NAME) or []:
        text = requirement.split(";", 1)[0].strip()
        if ";" in requirement and "extra" in requirement.split(";", 1)[1]:
            continue  # optional extras are not part of the base environment
        try:
            from packaging.requirements import Requirement

            parsed = Requirement(text)
            pins[_normalise(parsed.name)] = str(parsed.specifier)
        except ImportError:  # pragma: no cover - packaging ships with pip/jupyter
            for op in ("==", ">=", "<=", "~=", "!=", ">", "<"):
                if op in text:
                    name, _, _ = text.partition(op)
                    pins[_normalise(name.split("[")[0])] = text[len(name) :].strip()
                    break
    return pins


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


def _satisfies(version: str, specifier: str) -> bool:
    """Whether ``version`` meets ``specifier`` (PEP 440: ``2.13.0+cpu`` meets ``==2.13.0``)."""
    if not specifier:
        return True
    try:
        from packaging.specifiers import SpecifierSet

        return SpecifierSet(specifier).contains(version, prereleases=True)
    except ImportError:  # pragma: no cover - crude fallback for exact pins only
        wanted = specifier.removeprefix("==").strip()
        return version.split("+", 1)[0] == wanted


def _selected_scale() -> str:
    """COURSE_SCALE for the device checks; an invalid value is reported by check_scale."""
    from course_lib.course.scale import current_scale

    try:
        return current_scale()
    except ValueError:
        return "cpu"


# --------------------------------------------------------------------------- checks


def check_python() -> Outcome:
    version = platform.python_version()
    where = sys.executable or "unknown interpreter"
    if sys.version_info[:2] >= MAX_PYTHON:
        top = ".".join(map(str, MAX_PYTHON))
        return (
            "WARN",
            f"{version} ({where}); the course is tested below Python {top}: its pinned packages may not install",
        )
    if sys.version_info[:3] >= MIN_PYTHON:
        return "PASS", f"{version} ({where})"
    need = ".".join(map(str, MIN_PYTHON))
    return "FAIL", f"{version} ({where}); the course needs Python >= {need}: {INSTALL_HINT} with a newer Python"


def check_package(dist: str, module_name: str) -> Outcome:
    """Importable, and at the version pinned in the course's dependencies."""
    from importlib import metadata

    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a missing or broken install
        if dist in ONLY_FOR:
            return (
                "WARN",
                f"cannot import {module_name} ({_describe(exc)}); only {ONLY_FOR[dist]} needs it: {INSTALL_HINT}",
            )
        return "FAIL", f"cannot import {module_name} ({_describe(exc)}); {INSTALL_HINT}"
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = str(getattr(module, "__version__", "unknown"))

    extra = ""
    if module_name == "torch":
        extra = f" ({_torch_cuda(module)})"

    try:
        pin = _pins().get(_normalise(dist), "")
    except metadata.PackageNotFoundError:
        return "WARN", f"{version}{extra}; {DIST_NAME} is not installed so its pins are unknown: {INSTALL_HINT}"
    if pin and version != "unknown" and not _satisfies(version, pin):
        return "WARN", f"{version}{extra}; the course pins {dist}{pin}: {INSTALL_HINT} to match"
    return "PASS", f"{version}{extra}"


def _torch_cuda(torch: ModuleType) -> str:
    if not torch.cuda.is_available():
        return "CUDA: not available"
    count = torch.cuda.device_count()
    return f"CUDA {torch.version.cuda}: {count} device{'s' if count != 1 else ''}"


def check_jax_devices() -> Outcome:
    # run inside a notebook kernel, the first JAX call on a GPU would reserve 75% of its memory
    # for the kernel's lifetime; only devices are listed here (effective if JAX is not started yet)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    with _quiet():
        import jax

        devices = jax.devices()
    counts: dict[str, int] = {}
    for device in devices:
        counts[device.platform] = counts.get(device.platform, 0) + 1
    listing = ", ".join(f"{platform_} x{n}" for platform_, n in counts.items())
    return "PASS", f"{listing} (default backend: {jax.default_backend()})"


def check_gpu() -> Outcome:
    """A GPU is optional at the default scale; ``COURSE_SCALE=full`` wants one."""
    with _quiet():
        import jax
        import torch

        jax_gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda", "rocm")]
        torch_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if jax_gpus or torch_gpus:
        names = []
        if torch_gpus:
            names.append(f"torch: {torch_gpus} x {torch.cuda.get_device_name(0)}")
        if jax_gpus:
            names.append(f"jax: {len(jax_gpus)} x {getattr(jax_gpus[0], 'device_kind', 'gpu')}")
        if not jax_gpus:  # e.g. PyPI's CUDA torch beside the CPU-only jaxlib the pins install
            return "WARN", (
                f"{names[0]}, but JAX sees no GPU: the JAX lessons (04-06) would run on the CPU at any scale; "
                "install the CUDA build of the pinned jaxlib (JAX's installation guide: the jax[cudaNN] extra)"
            )
        if not torch_gpus:
            return "WARN", (
                f"{names[0]}, but torch sees no GPU: the torch lessons' GPU paths (09, 11) would run on the CPU; "
                "install a CUDA build of the pinned torch"
            )
        return "PASS", "; ".join(names)
    if _selected_scale() == "full":
        return (
            "WARN",
            "CPU only, but COURSE_SCALE=full picks sizes meant for a GPU; expect very long runs (unset it for the cpu scale)",
        )
    return "PASS", "CPU only (the cpu scale, the default, needs no GPU)"


def check_cpus() -> Outcome:
    import psutil

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = psutil.cpu_count(logical=True) or 0
    physical = psutil.cpu_count(logical=False)
    detail = f"{usable} usable logical core{'s' if usable != 1 else ''}"
    if physical:
        detail += f" ({physical} physical on the machine)"
    if usable < MIN_CORES:
        return "WARN", f"{detail}; the cpu scale is sized for {MIN_CORES} cores, lessons will run slower"
    return "PASS", detail


def _cgroup_memory_limit() -> int | None:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            return int(text)
    return None


def check_memory() -> Outcome:
    import psutil

    gib = 1024**3
    vm = psutil.virtual_memory()
    total = vm.total
    detail = f"{vm.total / gib:.1f} GiB total, {vm.available / gib:.1f} GiB available"
    limit = _cgroup_memory_limit()
    if limit is not None and limit < total:
        total = limit
        detail += f", container limit {limit / gib:.1f} GiB"
    if total / gib < MIN_MEMORY_GIB:
        return "WARN", f"{detail}; the course expects at least {MIN_MEMORY_GIB:g} GiB"
    return "PASS", detail


def check_scale() -> Outcome:
    from course_lib.course.scale import ENV_VAR, current_scale

    try:
        scale = current_scale()
    except ValueError as exc:
        return "FAIL", str(exc)
    source = f"{ENV_VAR}={os.environ[ENV_VAR]!r}" if os.environ.get(ENV_VAR, "").strip() else "default"
    return "PASS", f"{scale} ({source})"


def check_environment(env_id: str) -> Outcome:
    with _quiet():
        import gymnasium as gym

        env = gym.make(env_id)
        try:
            observation, _info = env.reset(seed=0)
        finally:
            env.close()
    shape = getattr(observation, "shape", None)
    return "PASS", f"make + reset ok (observation shape {shape}, actions {env.action_space})"


def _check_writable(path: Path, env_var: str) -> Outcome:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-", delete=False) as handle:
            handle.write(b"course doctor write test\n")
            probe = Path(handle.name)
        probe.unlink()
    except OSError as exc:
        return "FAIL", f"{path} is not writable ({_describe(exc)}); set {env_var} to a writable folder"
    return "PASS", f"{path} (writable)"


def check_cache_dir() -> Outcome:
    from course_lib.course.paths import cache_dir

    return _check_writable(cache_dir(), "COURSE_CACHE_DIR")


def check_output_dir() -> Outcome:
    from course_lib.course.paths import output_dir

    return _check_writable(output_dir(), "COURSE_OUTPUT_DIR")


def check_kernel() -> Outcome:
    """A ``python3`` kernel exists and starts this interpreter (what the notebooks use)."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec("python3")
    except NoSuchKernel:
        return "WARN", f"no python3 kernel spec; run `{sys.executable} -m ipykernel install --sys-prefix`"
    command = spec.argv[0] if spec.argv else ""
    fix = f"notebooks may run another Python: run `{sys.executable} -m ipykernel install --sys-prefix`"
    major, minor = sys.version_info[:2]
    if command in ("python", f"python{major}", f"python{major}.{minor}"):
        # jupyter_client swaps these names for the interpreter that runs Jupyter itself.
        if importlib.util.find_spec("ipykernel") is None:
            return "WARN", f"{spec.resource_dir} runs {command!r} but ipykernel is missing here; {INSTALL_HINT}"
        return "PASS", f"{command!r} -> the interpreter that starts Jupyter ({spec.resource_dir})"
    resolved = command if os.path.isabs(command) else (shutil.which(command) or command)
    same = (
        os.path.exists(resolved)
        and os.path.samefile(resolved, sys.executable)
        and Path(os.path.abspath(resolved)).parent == Path(os.path.abspath(sys.executable)).parent
    )
    if same:
        return "PASS", f"{resolved} ({spec.resource_dir})"
    return "WARN", f"python3 runs {resolved}, not {sys.executable}; {fix}"


def check_network_namespace() -> Outcome:
    """Whether a network namespace with only loopback up can be made here (``course_lib.runtime.netns``):
    ``make test`` runs Ray's tests and lesson 12's notebook there. A WARN does not stop the lessons."""
    from course_lib.runtime.netns import in_loopback_namespace, probe

    if in_loopback_namespace():
        return "PASS", "this process is in one already (only lo has addresses): Ray stays on loopback"
    found = probe()
    if found.ok:
        how = " ".join([Path(found.prefix[0]).name, *found.prefix[1:]])
        return "PASS", f"`{how}` makes one: `make test` runs Ray's tests and lesson 12 there, loopback only"
    # lesson 12 still runs without one (Ray then listens on every interface, as the notebook says)
    return "WARN", f"none can be made, and `make test` needs one (Ray's tests, lesson 12): {found.reason}"


# --------------------------------------------------------------------------- timing (--time)


@dataclass(frozen=True)
class LessonTiming:
    """What ``course doctor --time`` measured: lesson 00 here against the reference machine.

    Attributes:
        seconds: this machine's time (None if the run failed or timed out).
        reference_s: BENCHMARKS.md's time for the same notebook on the reference machine.
        machine, date, reference_method: where, when and how BENCHMARKS.md measured ``reference_s``.
        factor: ``seconds / reference_s`` rounded to 0.01 (for ``course pace --machine-factor``).
        status, detail: the report line (short: the details above are in the JSON only).
        method, note: how ``seconds`` was measured, and how to read the factor (:data:`TIME_NOTE`).
    """

    lesson: str
    seconds: float | None
    reference_s: float | None
    machine: str
    date: str
    factor: float | None
    status: str
    detail: str
    reference_method: str = ""
    method: str = TIME_METHOD
    note: str = TIME_NOTE


def _time_child(argv: list[str]) -> int:
    """Child side of :func:`run_timed_lesson`: ``ROOT LESSON_ID CELL_TIMEOUT``; prints ``{"seconds": ...}``.

    Runs the lesson as `course build` does (rendered from its text source, nbclient, a fresh
    ``python3`` kernel, the cpu scale) in a temporary copy of the layout it needs: its
    exercise and solution notebooks rendered from ``exercises/src``, so a learner's edited
    exercise notebook changes neither the result nor the checkout.
    """
    import signal

    def _stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds nbclient, which then shuts its kernel down

    signal.signal(signal.SIGTERM, _stop)
    root, lesson_id, cell_timeout = Path(argv[0]), argv[1], int(argv[2])
    try:
        from course_lib.course.notebooks.execute import execute_notebook, write_notebook
        from course_lib.course.notebooks.source import Target, render

        with tempfile.TemporaryDirectory(prefix="course-doctor-time-") as tmp:
            work = Path(tmp)
            exercise_src = root / "exercises" / "src" / f"{lesson_id}.py"
            for target in (
                Target(lesson_id, "exercise", exercise_src, work / "exercises" / f"{lesson_id}.ipynb"),
                Target(lesson_id, "solution", exercise_src, work / "solutions" / f"{lesson_id}.ipynb"),
            ):
                write_notebook(render(target), target.notebook)
            source = root / "lessons" / f"{lesson_id}.py"
            nb = render(Target(lesson_id, "lesson", source, work / "lessons" / f"{lesson_id}.ipynb"))
            (work / "lessons").mkdir()
            seconds = execute_notebook(nb, work / "lessons", scale="cpu", cell_timeout=cell_timeout)
    except Exception as exc:
        text = str(exc).strip().splitlines()
        print(f"{_TIME_ERROR_MARK}{type(exc).__name__}: {text[-1] if text else ''}"[:300], file=sys.stderr)
        return 1
    print(json.dumps({"seconds": seconds}))
    return 0


def run_timed_lesson(lesson_id: str, timeout_s: float) -> float:
    """Run ``lessons/<lesson_id>`` headless in a child process; return the executor's seconds.

    The child is stopped (SIGTERM, then SIGKILL after 10 s) when it passes ``timeout_s``.

    Raises:
        TimeoutError: if it did not finish within ``timeout_s``.
        RuntimeError: if a cell raised or the child failed otherwise (the message says which).
    """
    from course_lib.course.paths import repo_root

    root = repo_root()
    code = "import sys; from course_lib.course.doctor import _time_child; raise SystemExit(_time_child(sys.argv[1:]))"
    command = [sys.executable, "-c", code, str(root), lesson_id, str(max(1, int(timeout_s)))]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise TimeoutError(f"did not finish within {timeout_s:g} s (--time-timeout)") from None
    if proc.returncode != 0:
        marked = [line[len(_TIME_ERROR_MARK) :] for line in err.splitlines() if line.startswith(_TIME_ERROR_MARK)]
        tail = [line for line in err.splitlines() if line.strip()]
        why = marked[-1] if marked else (tail[-1] if tail else "no message")
        raise RuntimeError(f"exit code {proc.returncode}: {why}")
    try:
        return float(json.loads(out.strip().splitlines()[-1])["seconds"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"the timing child printed no time ({_describe(exc)}): {out[-200:]!r}") from exc


def time_lesson(timeout_s: float = TIME_TIMEOUT_S) -> LessonTiming:
    """Time lesson 00 here (:func:`run_timed_lesson`) and compare it with the reference machine.

    PASS within TIME_WARN_FACTOR of the reference, WARN above it, FAIL if the run errs or
    times out. Never raises. The report line is short; the reference machine and both
    methods are in the returned record (and so in ``--json``).
    """
    lesson = TIME_LESSON[:2]
    try:
        from course_lib.course.pacing import load_reference

        reference = load_reference()
        reference_s = reference.run_s(TIME_LESSON)
    except Exception as exc:
        detail = f"cannot read the reference time ({_describe(exc)})"
        return LessonTiming(lesson, None, None, "", "", None, "FAIL", _one_line(detail))
    machine, date = reference.machine, reference.date
    where = f"reference {reference_s:.1f} s (BENCHMARKS.md)"
    record = partial(LessonTiming, lesson, reference_s=reference_s, machine=machine, date=date)
    try:
        seconds = run_timed_lesson(TIME_LESSON, timeout_s)
    except Exception as exc:
        detail = f"lesson {lesson} failed: {_describe(exc)}; {where}"
        return record(
            seconds=None, factor=None, status="FAIL", detail=_one_line(detail), reference_method=reference.method
        )
    factor = round(seconds / reference_s, 2)
    detail = f"lesson {lesson} ran in {seconds:.1f} s; {where}; factor {factor:.2f}"
    # WARN: over TIME_WARN_FACTOR, `course pace` with this factor reads more lessons from their stored outputs
    status = "WARN" if factor > TIME_WARN_FACTOR else "PASS"
    over = f", over {TIME_WARN_FACTOR:g}" if status == "WARN" else ""
    detail += f"{over} -> course pace --machine-factor {factor:.2f}"
    return record(
        seconds=seconds, factor=factor, status=status, detail=_one_line(detail), reference_method=reference.method
    )


# --------------------------------------------------------------------------- running


def checks() -> list[tuple[str, Callable[[], Outcome]]]:
    """The checks in report order, looked up at call time (so tests can monkeypatch)."""
    items: list[tuple[str, Callable[[], Outcome]]] = [("python", check_python)]
    items += [(dist, partial(check_package, dist, module)) for dist, module in PACKAGES]
    items += [
        ("jax devices", check_jax_devices),
        ("gpu", check_gpu),
        ("cpu", check_cpus),
        ("memory", check_memory),
        ("scale", check_scale),
    ]
    items += [(f"env {env_id}", partial(check_environment, env_id)) for env_id in ENVIRONMENTS]
    items += [
        ("cache dir", check_cache_dir),
        ("output dir", check_output_dir),
        ("kernel python3", check_kernel),
        (NETNS_NAME, check_network_namespace),
    ]
    return items


def run_doctor_check(name: str, check: Callable[[], Outcome]) -> DoctorResult:
    """Run one check; any exception becomes a FAIL line carrying its message."""
    try:
        status, detail = check()
    except Exception as exc:
        detail = _describe(exc)
        if isinstance(exc, ImportError):
            detail += f"; {INSTALL_HINT}"
        return DoctorResult(name, "FAIL", _one_line(detail))
    if status not in STATUSES:
        return DoctorResult(name, "FAIL", _one_line(f"check returned unknown status {status!r}: {detail}"))
    return DoctorResult(name, status, _one_line(detail))


def in_kernel() -> bool:
    """Whether this code runs in a Jupyter kernel (not under ``course run --no-kernel`` or a plain script)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return getattr(shell, "kernel", None) is not None


def run_checks(no_kernel: bool = False) -> list[DoctorResult]:
    """Every check in order; with ``no_kernel``, a FAIL of a :data:`NOTEBOOK_ONLY` check is a WARN."""
    results = [run_doctor_check(name, check) for name, check in checks()]
    if no_kernel:
        results = [
            DoctorResult(r.name, "WARN", _one_line(f"{r.detail}; {NO_KERNEL_NOTE}"))
            if r.status == "FAIL" and r.name in NOTEBOOK_ONLY
            else r
            for r in results
        ]
    return results


def summary(results: list[DoctorResult]) -> str:
    counts = {s: sum(r.status == s for r in results) for s in STATUSES}
    return f"doctor: {counts['PASS']} PASS, {counts['WARN']} WARN, {counts['FAIL']} FAIL"


def one_line(results: list[DoctorResult]) -> str:
    """The report in one line, for a notebook: ``doctor: 29 checks, 28 PASS, 1 WARN (loopback netns), 0 FAIL``
    (the names of the checks that warned or failed in brackets)."""
    parts = [f"doctor: {len(results)} checks"]
    for status in STATUSES:
        names = [r.name for r in results if r.status == status]
        parts.append(f"{len(names)} {status}" + (f" ({', '.join(names)})" if names and status != "PASS" else ""))
    return ", ".join(parts)


def _course_version() -> str:
    from importlib import metadata

    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return "not installed"


def format_report(results: list[DoctorResult]) -> str:
    header = (
        f"course doctor: {DIST_NAME} {_course_version()}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()} {platform.machine()}"
    )
    lines = [
        "Need help? Paste everything between the two ==== lines (fences included) into your issue:",
        "=" * 72,
        "```text",
        header,
        *(r.line() for r in results),
        summary(results),
        "```",
        "=" * 72,
    ]
    return "\n".join(lines)


def _run_all(
    time: bool, time_timeout_s: float, no_kernel: bool = False
) -> tuple[list[DoctorResult], LessonTiming | None]:
    results = run_checks(no_kernel)
    timing = None
    if time:
        print(f"course doctor: timing lesson {TIME_LESSON[:2]} (up to {time_timeout_s:g} s) ...", file=sys.stderr)
        timing = time_lesson(time_timeout_s)
        results.append(DoctorResult(TIME_NAME, timing.status, timing.detail))
    return results, timing


def doctor(
    print_report: bool = True, *, time: bool = False, time_timeout_s: float = TIME_TIMEOUT_S, no_kernel: bool = False
) -> list[DoctorResult]:
    """Run every check; print the pasteable report unless ``print_report`` is False.

    ``time=True`` adds one line: lesson 00 run headless here against the reference machine
    (:func:`time_lesson`; lesson 00 takes 13 s on the idle reference machine, more when loaded).
    ``no_kernel=True`` checks for running the lessons without Jupyter: a missing notebook tool
    (:data:`NOTEBOOK_ONLY`) warns instead of failing.
    """
    results, _ = _run_all(time, time_timeout_s, no_kernel)
    if print_report:
        print(format_report(results), flush=True)
    return results


def to_json(results: list[DoctorResult], timing: LessonTiming | None = None) -> dict:
    data = {
        "course": _course_version(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "summary": {s: sum(r.status == s for r in results) for s in STATUSES},
        "ok": not any(r.status == "FAIL" for r in results),
        "results": [asdict(r) for r in results],
    }
    if timing is not None:
        data["lesson_time"] = asdict(timing)
    return data


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json",
        metavar="FILE",
        type=Path,
        help="also write the results as JSON to FILE",
    )
    parser.add_argument(
        "--time",
        action="store_true",
        help=f"also run lesson {TIME_LESSON[:2]} headless in a fresh kernel and compare its time with BENCHMARKS.md's "
        "reference machine; its factor feeds `course pace --machine-factor`. This adds the lesson's run to the "
        "doctor: lesson 00 took 13-16 s on a 2-core development machine near idle and 13-24 s at load averages 1.5-5 "
        "(the doctor took 13-31 s longer). Both times include a kernel start, so nothing is subtracted; a factor up "
        "to ~1.5 is measurement noise on a loaded machine: time an idle laptop. The line is short; the methods and "
        "the reference machine go to --json",
    )
    parser.add_argument(
        "--no-kernel",
        action="store_true",
        help="check for running the lessons without Jupyter (`course run --no-kernel`): a missing notebook tool "
        f"({', '.join(sorted(NOTEBOOK_ONLY))}) is a WARN, not a FAIL",
    )
    parser.add_argument(
        "--time-timeout",
        type=_positive_seconds,
        default=TIME_TIMEOUT_S,
        metavar="S",
        help=f"--time: seconds the lesson may run before it counts as FAIL (default {TIME_TIMEOUT_S})",
    )


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    results, timing = _run_all(
        bool(getattr(args, "time", False)),
        getattr(args, "time_timeout", TIME_TIMEOUT_S),
        bool(getattr(args, "no_kernel", False)),
    )
    print(format_report(results), flush=True)
    json_path = getattr(args, "json", None)
    if json_path is not None:
        json_path = Path(json_path)
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(to_json(results, timing), indent=2) + "\n")
        print(f"wrote {json_path}")
    return 1 if any(r.status == "FAIL" for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.course.doctor``: the doctor without the rest of the CLI."""
    parser = argparse.ArgumentParser(
        prog="course doctor", description="check this machine can run the course; paste the block into an issue"
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
