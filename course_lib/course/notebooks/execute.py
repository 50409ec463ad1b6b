"""Execute a notebook headless, in its own folder, with a chosen course scale."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbformat import NotebookNode

from course_lib.course.scale import ENV_VAR, SCALES


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
) -> float:
    """Run every cell of ``nb`` in a fresh ``python3`` kernel started in ``workdir``.

    Outputs are stored in ``nb`` in place. The kernel inherits this process's
    environment with ``COURSE_SCALE`` set to ``scale``. Cells tagged
    ``raises-exception`` may raise; any other error raises
    ``nbclient.exceptions.CellExecutionError`` naming the cell.

    Returns:
        wall-clock seconds spent executing.
    """
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
