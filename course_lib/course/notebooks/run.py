"""``course run``: execute lessons headless at a scale and print a timing table.

The committed notebooks are left untouched: executed copies go to
``outputs/run/<scale>/`` (``COURSE_OUTPUT_DIR`` moves it), so a ``full``-scale run on a
GPU keeps its figures for BENCHMARKS.md.

``--no-kernel`` runs each lesson's code cells in a plain Python process instead
(:mod:`course_lib.course.notebooks.script`), for a machine without Jupyter; the output
goes to ``outputs/run/<scale>/<lesson>.log``, and a failing cell does not stop the run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from course_lib.course.scale import SCALES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lessons", nargs="*", metavar="LESSON", help="lesson number or id (default: every lesson)")
    parser.add_argument("--scale", choices=SCALES, default="cpu", help="problem sizes (default: cpu)")
    parser.add_argument("--cell-timeout", type=int, default=1800, help="seconds a cell may run (default 1800)")
    parser.add_argument(
        "--no-kernel",
        action="store_true",
        help="run the code cells in a plain Python process (no Jupyter needed); log to <lesson>.log",
    )
    parser.add_argument(
        "--lesson-timeout", type=int, default=3600, help="--no-kernel: seconds a whole lesson may run (default 3600)"
    )


def run_without_kernel(source: Path, log: Path, scale: str, timeout_s: int) -> str:
    """Run one lesson's code cells in a child Python process; its output goes to ``log``.

    Returns the status for the table: ``ok``, ``N cells failed (first: ...)`` or ``timeout``.
    """
    env = {**os.environ, "COURSE_SCALE": scale, "MPLBACKEND": "Agg", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "course_lib.course.notebooks.script", str(source)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        try:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return f"timeout (> {timeout_s} s for the lesson)"
    if done.returncode == 0:
        return "ok"
    failures = [line for line in log.read_text().splitlines() if line.startswith("###   FAILED")]
    if not failures:
        return f"error: exit code {done.returncode} (see {log.name})"
    return f"{len(failures)} cell(s) failed (first: {failures[0].removeprefix('###   FAILED ')[:80]})"


def run_in_kernel(source: Path, notebook: Path, lesson_id: str, scale: str, cell_timeout: int) -> str:
    """Execute one lesson as a notebook in a Jupyter kernel; write the executed copy to ``notebook``."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    from course_lib.course.notebooks.execute import execute_notebook, write_notebook
    from course_lib.course.notebooks.source import Target, render

    nb = render(Target(lesson_id, "lesson", source, notebook))
    status = "ok"
    try:
        execute_notebook(nb, source.parent, scale=scale, cell_timeout=cell_timeout)
    except CellTimeoutError:
        status = f"timeout (> {cell_timeout} s in one cell)"
    except CellExecutionError as exc:
        last = str(exc).strip().splitlines()[-1] if str(exc).strip() else exc.__class__.__name__
        status = f"error: {last[:100]}"
    except DeadKernelError:
        status = "error: kernel died"
    write_notebook(nb, notebook)
    return status


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from course_lib.course.notebooks.build import _lesson_ids
    from course_lib.course.paths import output_dir, repo_root

    root = repo_root()
    try:
        ids = _lesson_ids(args.lessons, root)
    except KeyError as exc:
        print(f"course run: {exc.args[0]}", file=sys.stderr)
        return 2
    out = output_dir() / "run" / args.scale
    rows: list[tuple[str, float, str]] = []
    for lesson_id in tqdm(ids, desc=f"running lessons ({args.scale})", unit="lesson", file=sys.stderr):
        source = root / "lessons" / f"{lesson_id}.py"
        start = time.perf_counter()
        if args.no_kernel:
            status = run_without_kernel(source, out / f"{lesson_id}.log", args.scale, args.lesson_timeout)
        else:
            status = run_in_kernel(source, out / f"{lesson_id}.ipynb", lesson_id, args.scale, args.cell_timeout)
        rows.append((lesson_id, time.perf_counter() - start, status))
    width = max(len(r[0]) for r in rows) if rows else 6
    print(f"\n{'lesson':<{width}}  {'seconds':>8}  status")
    for lesson_id, seconds, status in rows:
        print(f"{lesson_id:<{width}}  {seconds:8.1f}  {status}")
    print(f"{'logs' if args.no_kernel else 'executed notebooks'}: {out}")
    return 0 if all(r[2] == "ok" for r in rows) else 1
