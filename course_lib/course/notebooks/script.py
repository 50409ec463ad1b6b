"""Run a lesson's code cells in one Python process, without Jupyter (``course run --no-kernel``).

For a machine that has the course's libraries but no notebook stack (a GPU machine with
torch and JAX and no Jupyter, say): the code cells of ``lessons/NN_slug.py`` run one after
the other in one namespace, as a kernel runs them. A failing cell prints its traceback and
the run goes on with the next cell (nbval, too, reports every cell); the summary at the end
names every failed cell, and the exit code is 1 if any failed. The cells run in the
lesson's folder, as a notebook's do.

Run it as ``python -m course_lib.course.notebooks.script LESSON.py`` (``course run
--no-kernel`` does), not by executing the lesson file itself: ``python lessons/NN.py``
breaks every lesson that starts processes, because forkserver and spawn children import
``__main__`` by its path and would run the whole lesson again in every child. Here
``__main__`` is this module, whose work is guarded by ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

CELL_MARKER = "# %%"


@dataclass(frozen=True)
class CellOutcome:
    """One code cell's run: its index among the code cells, its first line in the source,
    how long it took, and the error it ended with (``None``: it ran)."""

    index: int
    line: int
    seconds: float
    error: str | None = None


def code_cells(path: Path) -> list[tuple[int, str]]:
    """``(first line, source)`` of every code cell of a jupytext percent file, in order."""
    cells: list[tuple[int, str]] = []
    kind: str | None = None
    start, body = 0, list[str]()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.startswith(CELL_MARKER):
            if kind == "code":
                cells.append((start, "\n".join(body)))
            kind = "markdown" if "[markdown]" in line else "code"
            start, body = number, list[str]()
        elif kind is not None:
            body.append(line)
    if kind == "code":
        cells.append((start, "\n".join(body)))
    return cells


def run_cells(path: Path, skip: frozenset[int] = frozenset(), out: TextIO = sys.stdout) -> list[CellOutcome]:
    """Run the code cells of ``path`` (all but the indices in ``skip``) in one namespace.

    Each cell's stdout and stderr go where this process's go; a line ``### [cell I]`` marks
    where each cell begins, and ``### [cell I] FAILED`` follows a traceback.
    """
    namespace: dict[str, object] = {"__name__": "__main__"}
    outcomes = []
    for index, (line, source) in enumerate(code_cells(path)):
        if index in skip:
            print(f"### [cell {index}] line {line}: skipped", file=out, flush=True)
            continue
        print(f"### [cell {index}] line {line}", file=out, flush=True)
        start = time.perf_counter()
        error = None
        try:
            exec(compile(source, f"{path}:cell {index} (line {line})", "exec"), namespace)
        except Exception as exc:  # report it and go on with the next cell, as nbval does
            traceback.print_exc(file=out)
            error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
            print(f"### [cell {index}] FAILED", file=out, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        outcomes.append(CellOutcome(index, line, time.perf_counter() - start, error))
    return outcomes


def summary(path: Path, outcomes: list[CellOutcome], seconds: float) -> str:
    """``### SUMMARY lessons/NN.py: 30 cells run, 1 failed, 141.3 s`` and one line per failure."""
    failed = [o for o in outcomes if o.error is not None]
    lines = [f"### SUMMARY {path}: {len(outcomes)} cells run, {len(failed)} failed, {seconds:.1f} s"]
    lines += [f"###   FAILED [cell {o.index}] line {o.line}: {o.error}" for o in failed]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lib.course.notebooks.script",
        description="Run a lesson's code cells in this process, without Jupyter; go on past failing cells.",
    )
    parser.add_argument("lesson", type=Path, help="a jupytext percent source, e.g. lessons/04_purejaxrl.py")
    parser.add_argument("--skip", default="", help="code-cell indices to leave out, e.g. 3,7")
    args = parser.parse_args(argv)
    if not args.lesson.is_file():
        parser.error(f"{args.lesson} is not a file; pass a lesson source such as lessons/00_welcome.py")
    try:
        skip = frozenset(int(s) for s in args.skip.split(",") if s.strip())
    except ValueError:
        parser.error(f"--skip takes comma-separated cell numbers, got {args.skip!r}")
    lesson = args.lesson.resolve()
    os.chdir(lesson.parent)  # as a kernel runs a notebook: relative paths start at the lesson's folder
    start = time.perf_counter()
    outcomes = run_cells(lesson, skip)
    print(summary(lesson, outcomes, time.perf_counter() - start), flush=True)
    return 1 if any(o.error is not None for o in outcomes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
