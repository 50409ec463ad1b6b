"""Execute a notebook headless, in its own folder, with a chosen course scale.

Lesson notebooks that start Ray (:data:`ISOLATED_LESSONS`) are executed inside a
loopback-only network namespace (:mod:`course_lib.runtime.netns`): the executor and its
kernel run in a child process there (``python -m course_lib.course.notebooks.execute``),
since a kernel inside the namespace cannot talk to a client outside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode

from course_lib.course.scale import ENV_VAR, SCALES

if TYPE_CHECKING:
    from course_lib.course.notebooks.source import Target

#: Lesson notebooks that start Ray. ``course build`` executes them inside a loopback-only
#: network namespace, so their stored outputs show every Ray socket on loopback, and CI's
#: nbval checks them there (tests/conftest.py skips them outside it). Their exercise and
#: solution notebooks do not start Ray and run anywhere.
ISOLATED_LESSONS: frozenset[str] = frozenset({"12_capstone_ray"})

_MODULE = "course_lib.course.notebooks.execute"
#: the child's stderr line that carries a failing cell's error (the rest is the kernel's noise)
_ERROR_MARK = "course execute error: "


class IsolationError(RuntimeError):
    """The notebook could not be executed in the namespace; the message says why and the fix."""


def needs_isolation(target: Target) -> bool:
    """Whether ``course build`` must execute ``target`` in a loopback-only network namespace."""
    return target.kind == "lesson" and target.lesson_id in ISOLATED_LESSONS


@contextmanager
def _scale_env(scale: str) -> Iterator[None]:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    old = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = scale
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = old


def execute_notebook(
    nb: NotebookNode,
    workdir: Path,
    *,
    scale: str = "cpu",
    cell_timeout: int = 600,
    allow_errors: bool = False,
    isolate_network: bool = False,
) -> float:
    """Run every cell of ``nb`` in a fresh ``python3`` kernel started in ``workdir``.

    Outputs are stored in ``nb`` in place. The kernel inherits this process's
    environment with ``COURSE_SCALE`` set to ``scale``. Cells tagged
    ``raises-exception`` may raise; any other error raises
    ``nbclient.exceptions.CellExecutionError`` naming the cell.

    ``isolate_network=True`` runs the executor and its kernel inside a loopback-only
    network namespace (:func:`execute_in_namespace`) unless this process is in one already.

    Returns:
        wall-clock seconds spent executing.
    """
    if isolate_network:
        from course_lib.runtime.netns import in_loopback_namespace

        if not in_loopback_namespace():
            return execute_in_namespace(nb, workdir, scale=scale, cell_timeout=cell_timeout, allow_errors=allow_errors)
    client = NotebookClient(
        nb,
        timeout=cell_timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        allow_errors=allow_errors,
        record_timing=False,
    )
    start = time.perf_counter()
    with _scale_env(scale):
        client.execute()
    # the kernel fills in its own version details; keep the stored metadata stable
    nb.metadata["language_info"] = {"name": "python"}
    return time.perf_counter() - start


def write_notebook(nb: NotebookNode, path: Path) -> None:
    """Write with a stable layout (sorted keys, one-space indent, trailing newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.validate(nb)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
    tmp.replace(path)


def execute_in_namespace(
    nb: NotebookNode,
    workdir: Path,
    *,
    scale: str = "cpu",
    cell_timeout: int = 600,
    allow_errors: bool = False,
) -> float:
    """:func:`execute_notebook` in a child process inside a loopback-only network namespace.

    Outputs are stored in ``nb`` in place, as by :func:`execute_notebook`. If this process
    is interrupted or stopped, the child is stopped too (SIGTERM, which shuts its kernel
    down; SIGKILL after 15 s).

    Raises:
        nbclient.exceptions.CellExecutionError: a cell raised (its message is the child's).
        IsolationError: no namespace can be made here, or the child failed otherwise.
    """
    from nbclient.exceptions import CellExecutionError

    from course_lib.runtime.netns import EXIT_UNAVAILABLE, command

    with tempfile.TemporaryDirectory(prefix="course-execute-") as tmp:
        source, result, log = Path(tmp) / "in.ipynb", Path(tmp) / "out.ipynb", Path(tmp) / "log.txt"
        nbformat.write(nb, source)
        argv = [sys.executable, "-m", _MODULE, str(source), str(result), "--workdir", str(workdir)]
        argv += ["--scale", scale, "--cell-timeout", str(cell_timeout), *(["--allow-errors"] if allow_errors else [])]
        # output to a file, not a pipe: a process the notebook leaves behind would hold a pipe open
        with log.open("w") as handle:
            proc = subprocess.Popen(command(argv, require=True), stdout=handle, stderr=subprocess.STDOUT)
            try:
                returncode = proc.wait()
            except BaseException:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                raise
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
        if returncode != 0:
            marked = [line[len(_ERROR_MARK) :] for line in lines if line.startswith(_ERROR_MARK)]
            if marked and marked[-1].startswith("CellExecutionError: "):
                message = marked[-1].removeprefix("CellExecutionError: ").replace("\\n", "\n")
                raise CellExecutionError(message, "CellExecutionError", message)
            why = marked[-1] if marked else (lines[-1] if lines else "no message")
            if returncode == EXIT_UNAVAILABLE and why.startswith("netns:"):
                raise IsolationError(f"this notebook starts Ray and must run loopback-only: {why}")
            raise IsolationError(f"executing in the network namespace failed (exit code {returncode}): {why}")
        executed = nbformat.read(result, as_version=4)
        seconds = float(json.loads(result.with_suffix(".json").read_text())["seconds"])
    nb.cells = executed.cells
    nb.metadata = executed.metadata
    return seconds


def main(argv: Sequence[str] | None = None) -> int:
    """The child of :func:`execute_in_namespace`: ``IN OUT --workdir D [--scale S] [--cell-timeout N]``."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {_MODULE}", description="execute a notebook (course build)")
    parser.add_argument("notebook", type=Path)
    parser.add_argument("output", type=Path)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--cell-timeout", type=int, default=600)
    parser.add_argument("--allow-errors", action="store_true")
    args = parser.parse_args(argv)

    def _stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds nbclient, which then shuts its kernel down

    signal.signal(signal.SIGTERM, _stop)
    nb = nbformat.read(args.notebook, as_version=4)
    try:
        seconds = execute_notebook(
            nb, args.workdir, scale=args.scale, cell_timeout=args.cell_timeout, allow_errors=args.allow_errors
        )
    except Exception as exc:
        text = str(exc).replace("\n", "\\n")
        print(f"{_ERROR_MARK}{type(exc).__name__}: {text}", file=sys.stderr)
        return 1
    write_notebook(nb, args.output)
    args.output.with_suffix(".json").write_text(json.dumps({"seconds": seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
