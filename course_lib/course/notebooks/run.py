"""``course run``: execute lessons headless at a scale and print a timing table.

The committed notebooks are left untouched: executed copies go to
``outputs/run/<scale>/`` (``COURSE_OUTPUT_DIR`` moves it), so a ``full``-scale run on a
GPU keeps its figures for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import sys
import time

from course_lib.course.scale import SCALES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lessons", nargs="*", metavar="LESSON", help="lesson number or id (default: every lesson)")
    parser.add_argument("--scale", choices=SCALES, default="cpu", help="problem sizes (default: cpu)")
    parser.add_argument("--cell-timeout", type=int, default=1800, help="seconds a cell may run (default 1800)")


def run(args: argparse.Namespace) -> int:
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
    from tqdm.auto import tqdm

    from course_lib.course.notebooks.build import _lesson_ids
    from course_lib.course.notebooks.execute import execute_notebook, write_notebook
    from course_lib.course.notebooks.source import Target, render
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
        target = Target(lesson_id, "lesson", root / "lessons" / f"{lesson_id}.py", out / f"{lesson_id}.ipynb")
        nb = render(target)
        start = time.perf_counter()
        status = "ok"
        try:
            execute_notebook(nb, root / "lessons", scale=args.scale, cell_timeout=args.cell_timeout)
        except CellTimeoutError:
            status = f"timeout (> {args.cell_timeout} s in one cell)"
        except CellExecutionError as exc:
            last = str(exc).strip().splitlines()[-1] if str(exc).strip() else exc.__class__.__name__
            status = f"error: {last[:100]}"
        except DeadKernelError:
            status = "error: kernel died"
        rows.append((lesson_id, time.perf_counter() - start, status))
        write_notebook(nb, target.notebook)
    width = max(len(r[0]) for r in rows) if rows else 6
    print(f"\n{'lesson':<{width}}  {'seconds':>8}  status")
    for lesson_id, seconds, status in rows:
        print(f"{lesson_id:<{width}}  {seconds:8.1f}  {status}")
    print(f"executed notebooks: {out}")
    return 0 if all(r[2] == "ok" for r in rows) else 1
