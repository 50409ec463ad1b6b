"""``course build``: regenerate notebooks from their text sources and execute them.

``course build`` (all lessons) or ``course build 00`` writes, for each lesson,
``lessons/<id>.ipynb`` and, where the lesson has exercises, ``exercises/<id>.ipynb`` and
``solutions/<id>.ipynb``, executed at the ``cpu`` scale so their outputs are the ones
nbval checks. ``course build --check`` executes nothing: it names every notebook that
differs from what build would produce and exits non-zero.

The lesson notebooks that start Ray (``execute.ISOLATED_LESSONS``: lesson 12) are executed
inside a loopback-only network namespace (``course_lib.runtime.netns``); where none can be
made, their build fails naming why and how to fix it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from course_lib.course.notebooks.source import Target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lessons", nargs="*", metavar="LESSON", help="lesson number or id (default: every lesson)")
    parser.add_argument("--check", action="store_true", help="verify only: exit 1 and name every notebook out of sync")
    parser.add_argument("--no-execute", action="store_true", help="regenerate notebooks without executing them")
    parser.add_argument(
        "--only",
        choices=("lesson", "exercise", "solution", "exercises"),
        help="build only this kind of notebook ('exercises': the exercise and solution notebooks)",
    )


def _lesson_ids(names: list[str], root: Path) -> list[str]:
    from course_lib.course.catalog import available_lessons, get_lesson

    if not names:
        return [lesson.id for lesson in available_lessons(root)]
    ids = []
    for name in names:
        lesson = get_lesson(name)
        if not lesson.available(root):
            raise KeyError(f"lesson {lesson.id} has no source yet (expected {lesson.source(root)})")
        ids.append(lesson.id)
    return ids


def check_target(target: Target) -> list[str]:
    """Problems that make ``target``'s committed notebook differ from a fresh build."""
    import nbformat

    from course_lib.course.notebooks.source import cell_signature, render

    rel = target.notebook.relative_to(target.notebook.parents[1])
    fix = f"run `course build {target.lesson_id[:2]}`"
    if not target.notebook.exists():
        return [f"{rel}: missing; {fix}"]
    try:
        committed = nbformat.read(target.notebook, as_version=4)
    except Exception as exc:
        return [f"{rel}: not a readable notebook ({exc.__class__.__name__}); {fix}"]
    problems = []
    expected = render(target)
    want, have = cell_signature(expected), cell_signature(committed)
    if want != have:
        n = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        detail = f"{len(have)} cells vs {len(want)} in the source" if len(want) != len(have) else f"cell {n} differs"
        problems.append(f"{rel}: out of sync with {target.source.name} ({detail}); {fix}")
    if committed.metadata.get("course") != expected.metadata["course"]:
        problems.append(
            f"{rel}: metadata 'course' is {committed.metadata.get('course')}, "
            f"expected {expected.metadata['course']}; {fix}"
        )
    unexecuted = [i for i, c in enumerate(committed.cells) if c.cell_type == "code" and c.execution_count is None]
    if unexecuted:
        problems.append(f"{rel}: {len(unexecuted)} code cell(s) not executed (first: cell {unexecuted[0]}); {fix}")
    return problems


def check(root: Path) -> list[str]:
    """Every problem in the checkout; empty when all notebooks are in sync."""
    from course_lib.course.catalog import LESSONS
    from course_lib.course.notebooks.source import targets_for

    problems: list[str] = []
    produced: set[Path] = set()
    for lesson in LESSONS:
        for target in targets_for(lesson.id, root):
            produced.add(target.notebook.resolve())
            problems.extend(check_target(target))
    for folder in ("lessons", "exercises", "solutions"):
        for nb in sorted((root / folder).glob("*.ipynb")):
            if nb.resolve() not in produced:
                problems.append(
                    f"{folder}/{nb.name}: no text source generates it "
                    f"(expected lessons/{nb.stem}.py or exercises/src/{nb.stem}.py)"
                )
    return problems


def build(lesson_ids: list[str], root: Path, execute: bool = True, only: str | None = None) -> list[tuple[str, float]]:
    """Regenerate (and execute) the notebooks of ``lesson_ids``; returns (path, seconds).

    ``only`` keeps one kind of notebook (``"lesson"``, ``"exercise"``, ``"solution"``) or
    ``"exercises"`` (the exercise and solution notebooks, not the lesson)."""
    from tqdm.auto import tqdm

    from course_lib.course.notebooks.execute import execute_notebook, needs_isolation, write_notebook
    from course_lib.course.notebooks.source import render, targets_for

    kinds = {"exercises": ("exercise", "solution")}.get(only or "", (only,) if only else None)
    targets = [t for lid in lesson_ids for t in targets_for(lid, root) if kinds is None or t.kind in kinds]
    timings = []
    for target in tqdm(targets, desc="building notebooks", unit="nb", file=sys.stderr):
        nb = render(target)
        isolate = needs_isolation(target)
        seconds = execute_notebook(nb, target.notebook.parent, isolate_network=isolate) if execute else 0.0
        write_notebook(nb, target.notebook)
        timings.append((str(target.notebook.relative_to(root)), seconds))
    return timings


def run(args: argparse.Namespace) -> int:
    from course_lib.course.paths import repo_root

    root = repo_root()
    if args.check:
        problems = check(root)
        for p in problems:
            print(f"OUT OF SYNC  {p}")
        if problems:
            print(f"course build --check: {len(problems)} problem(s); rebuild with `course build`", file=sys.stderr)
            return 1
        print("course build --check: every notebook matches its source and is executed")
        return 0
    try:
        ids = _lesson_ids(args.lessons, root)
    except KeyError as exc:
        print(f"course build: {exc.args[0]}", file=sys.stderr)
        return 2
    from nbclient.exceptions import CellExecutionError

    from course_lib.course.notebooks.execute import IsolationError
    from course_lib.course.notebooks.source import SourceError

    try:
        timings = build(ids, root, execute=not args.no_execute, only=args.only)
    except (SourceError, CellExecutionError, IsolationError) as exc:
        print(f"course build failed: {exc}", file=sys.stderr)
        return 1
    for path, seconds in timings:
        print(f"{seconds:7.1f} s  {path}")
    return 0
