"""``course portability``: would the committed notebooks pass on another machine?

The notebooks are committed with their outputs, and CI compares those outputs exactly
(strict nbval) on whatever machine it lands on. Two things make an output depend on the
machine rather than on the code:

- **The instruction set.** numpy, XLA and PyTorch pick their kernels at run time from the
  CPU's features (AVX2, AVX-512, ...). Vector widths and polynomial approximations differ,
  so ``exp``, ``pow`` or a reduction can differ in the last bits: printed with enough
  digits, a rounding-level error (``2.4e-07`` here, ``6.0e-08`` there) changes with the CPU.
- **The speed.** A demo that does a fixed amount of work while waiting for something that
  happens after a *time* (a heartbeat timeout, a kill schedule) shows a different thing on
  a faster or a slower machine.

This command re-runs strict nbval over the notebooks in variants of this machine:

- ``isa``: the kernels a machine without this one's vector extensions would run. numpy's
  dispatched features above its baseline are switched off (``NPY_DISABLE_CPU_FEATURES``),
  PyTorch's ATen uses its non-vectorised kernels (``ATEN_CPU_CAPABILITY=default``) and
  oneDNN SSE4.1 (``ONEDNN_MAX_CPU_ISA``), XLA generates SSE4.2 code
  (``--xla_cpu_max_isa=SSE4_2``; its ``AVX2`` setting changed nothing on an AVX-512 EPYC).
  Before trusting a green run, the command checks that these switches change the bits of a
  set of operations here (:func:`switch_effect`) and says which.
- ``hog``: a slower machine: one busy process per core competes with the notebooks.

It prints, per variant, every cell whose output differed (with the lines that differ) or
that failed, and exits 1 if any did. A faster machine cannot be made here: the demos that
race time are written to wait for their event (bounded by a timeout) instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from course_lib.course.paths import repo_root
from course_lib.runtime import netns

VARIANTS = ("isa", "hog")
NOTEBOOK_DIRS = ("lessons", "exercises", "solutions")
XLA_ISA = "SSE4_2"
NBVAL_FLAGS = (
    "--nbval",
    "--nbval-current-env",
    "--nbval-cell-timeout=300",
    "--nbval-sanitize-with",
    "tests/nbval_sanitize.cfg",
)


# ---------------------------------------------------------------------------------------
# The instruction-set variant
# ---------------------------------------------------------------------------------------


def numpy_dispatch_found() -> list[str]:
    """numpy's run-time dispatched CPU features above its baseline that this CPU has (the
    ones ``NPY_DISABLE_CPU_FEATURES`` can switch off; empty on a baseline-only CPU)."""
    import numpy._core as core

    umath = getattr(core, "_multiarray_umath")  # noqa: B009 (private: not in numpy's type stubs)
    return [f for f in umath.__cpu_dispatch__ if umath.__cpu_features__.get(f)]


def isa_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with every switch of the ``isa``
    variant set; other ``XLA_FLAGS`` (a device count, the scheduler flag) are kept."""
    env = dict(os.environ if base is None else base)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_cpu_max_isa")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_cpu_max_isa={XLA_ISA}"])
    env["ATEN_CPU_CAPABILITY"] = "default"
    env["ONEDNN_MAX_CPU_ISA"] = "SSE41"
    found = numpy_dispatch_found()
    if found:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(found)
    else:
        env.pop("NPY_DISABLE_CPU_FEATURES", None)
    return env


def probe_hashes() -> dict[str, str]:
    """A short hash of the bits of a few float32 operations per library, as this process's
    kernels compute them: the same inputs give other bits under other kernels."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal(100_003).astype(np.float32)
    a, b = rng.standard_normal((64, 300)).astype(np.float32), rng.standard_normal((300, 64)).astype(np.float32)
    xj, xt = jnp.asarray(x), torch.from_numpy(x)

    def h(v: object) -> str:
        return hashlib.sha1(np.ascontiguousarray(np.asarray(v)).tobytes()).hexdigest()[:10]

    rows = x[:100_000].reshape(1000, 100)
    return {
        "numpy pow": h(np.abs(x) ** np.float32(0.6)),
        "numpy exp": h(np.exp(x)),
        "numpy log": h(np.log(np.abs(x))),
        "numpy tanh": h(np.tanh(x)),
        "jax exp": h(jax.jit(jnp.exp)(xj)),
        "jax tanh": h(jax.jit(jnp.tanh)(xj)),
        "jax log_softmax": h(jax.jit(jax.nn.log_softmax)(jnp.asarray(rows))),
        "jax matmul": h(jax.jit(jnp.matmul)(a, b)),
        "torch pow": h(xt.abs() ** 0.6),
        "torch log_softmax": h(torch.log_softmax(torch.from_numpy(rows), -1)),
        "torch linear": h(torch.nn.functional.linear(torch.from_numpy(a), torch.from_numpy(b.T.copy()))),
    }


def _probe_in(env: dict[str, str], timeout_s: float = 120.0) -> dict[str, str]:
    code = "import json; from course_lib.course.portability import probe_hashes; print(json.dumps(probe_hashes()))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"the arithmetic probe failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def switch_effect(env: dict[str, str] | None = None) -> list[str]:
    """The operations of :func:`probe_hashes` whose bits differ between this machine's
    kernels and those of the ``isa`` variant (``env``, default :func:`isa_env`), each run
    in a fresh process. Empty means the switches change nothing here: a green ``isa`` run
    would then prove nothing."""
    native, other = _probe_in(dict(os.environ)), _probe_in(isa_env() if env is None else env)
    return [op for op in native if native[op] != other.get(op)]


# ---------------------------------------------------------------------------------------
# The slow-machine variant
# ---------------------------------------------------------------------------------------


@contextmanager
def cpu_hog(n: int | None = None) -> Iterator[list[int]]:
    """``n`` busy processes (default: one per core) for the duration of the block; yields
    their pids. They are killed and reaped on exit, whatever happens in the block."""
    n = (os.cpu_count() or 1) if n is None else n
    if n < 1:
        raise ValueError(f"a CPU hog needs at least 1 process, got {n}")
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


# ---------------------------------------------------------------------------------------
# nbval under a variant
# ---------------------------------------------------------------------------------------


@dataclass
class VariantResult:
    """One variant's nbval run: cells compared, the failures (node id -> what differed)."""

    variant: str
    seconds: float
    passed: int = 0
    failures: dict[str, str] = field(default_factory=dict)
    notebook_seconds: dict[str, float] = field(default_factory=dict)
    exit_code: int = 0


def default_notebooks(root: Path) -> list[str]:
    """Every committed notebook of the course, relative to ``root``."""
    return [str(p.relative_to(root)) for d in NOTEBOOK_DIRS for p in sorted((root / d).glob("*.ipynb"))]


def run_nbval(variant: str, notebooks: Sequence[str], root: Path, env: dict[str, str]) -> VariantResult:
    """Strict nbval over ``notebooks`` with ``env``; the outcome of every cell."""
    with tempfile.TemporaryDirectory(prefix="course-portability-") as tmp:
        report = Path(tmp) / "report.jsonl"
        env = {**env, "COURSE_PYTEST_REPORT": str(report)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "course_lib.course.notebooks.pytest_report"]
        cmd += [*notebooks, *NBVAL_FLAGS]
        # lesson 12 starts Ray, whose processes must talk over loopback only (as in `make test`)
        cmd = netns.command(cmd, require=False)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=root, env=env, check=False, capture_output=True, text=True)
        result = VariantResult(variant, time.perf_counter() - start, exit_code=done.returncode)
        lines = report.read_text(encoding="utf-8").splitlines() if report.exists() else []
    for raw in lines:
        line = json.loads(raw)
        file = Path(line["file"])
        path = str(file.relative_to(root)) if file.is_relative_to(root) else str(file)
        result.notebook_seconds[path] = result.notebook_seconds.get(path, 0.0) + line["seconds"]
        if line["outcome"] == "passed":
            result.passed += 1
        elif line["outcome"] == "failed":
            result.failures[f"{path}::{line['name']}"] = line["message"]
    if done.returncode not in (0, 1) or (done.returncode == 1 and not result.failures):
        result.failures["pytest"] = f"pytest exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}"
    return result


def what_differed(message: str, max_lines: int = 14) -> list[str]:
    """The informative lines of an nbval failure: the output diff, or the error's last lines."""
    lines = re.sub(r"\x1b\[[0-9;]*m", "", message).splitlines()
    diff = [ln for ln in lines if ln.lstrip().startswith(("- ", "+ ", "? ")) or "mismatch" in ln]
    picked = diff if diff else [ln for ln in lines if ln.strip()][-max_lines:]
    return picked[:max_lines] + ([f"... ({len(picked) - max_lines} more lines)"] if len(picked) > max_lines else [])


def describe_env(env: dict[str, str]) -> str:
    keys = ("XLA_FLAGS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "NPY_DISABLE_CPU_FEATURES")
    return " ".join(f"{k}={env[k]!r}" for k in keys if env.get(k) != os.environ.get(k))


def _print_result(result: VariantResult) -> None:
    minutes, seconds = divmod(round(result.seconds), 60)
    print(f"  {result.passed} cells matched, {len(result.failures)} differed or failed ({minutes} min {seconds} s)")
    slowest = sorted(result.notebook_seconds.items(), key=lambda kv: -kv[1])[:3]
    if slowest:
        print("  slowest notebooks: " + ", ".join(f"{p} {s:.0f} s" for p, s in slowest))
    for node, message in result.failures.items():
        print(f"  DIFFERS  {node}")
        for line in what_differed(message):
            print(f"      {line}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "notebooks", nargs="*", help="notebooks to check (default: every notebook in lessons/, exercises/, solutions/)"
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=list(VARIANTS),
        help="isa: another instruction set's kernels; hog: a slower machine (default: both)",
    )
    parser.add_argument(
        "--hog-processes", type=int, default=None, help="busy processes for 'hog' (default: one per core)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")


def run(args: argparse.Namespace) -> int:
    root = repo_root()
    notebooks = list(args.notebooks) or default_notebooks(root)
    missing = [n for n in notebooks if not (root / n).is_file() and not Path(n).is_file()]
    if missing:
        print(f"course portability: no such notebook: {', '.join(missing)}", file=sys.stderr)
        return 2
    results: list[VariantResult] = []
    for variant in args.variants:
        if variant == "isa":
            env = isa_env()
            changed = switch_effect(env)
            print(f"variant isa: {describe_env(env)}")
            if not changed:
                print(
                    "  the switches change no operation's bits on this machine (probe: numpy, JAX, PyTorch):"
                    " an isa run here would prove nothing; run it on a machine with AVX2 or newer",
                    file=sys.stderr,
                )
                return 2
            print(f"  checked: these operations give other bits under the switches: {', '.join(changed)}")
            result = run_nbval(variant, notebooks, root, env)
        else:
            with cpu_hog(args.hog_processes) as pids:
                print(f"variant hog: {len(pids)} busy processes beside the notebooks on {os.cpu_count()} cores")
                result = run_nbval(variant, notebooks, root, dict(os.environ))
        _print_result(result)
        results.append(result)
    bad = sum(len(r.failures) for r in results)
    print(
        f"portability: {len(notebooks)} notebooks, variants {', '.join(args.variants)}: "
        + ("no difference" if not bad else f"{bad} cells differ or fail")
    )
    if args.json is not None:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1), encoding="utf-8")
    return 1 if bad else 0
