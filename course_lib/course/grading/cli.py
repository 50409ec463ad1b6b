"""``course grade PATH...``: grade exercise notebooks in a separate kernel and report.

Each notebook runs in its own fresh ``python3`` kernel (see
:mod:`course_lib.course.grading.runner`); the terminal shows a table per notebook, and
``--json``, ``--junit`` and ``--markdown`` write reports for CI. The exit status is 0
iff every notebook reaches the pass mark.

This module imports nothing heavy at import time (``course --help`` stays fast).
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from course_lib.course.grading.report import DEFAULT_PASS_MARK


def positive_seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def fraction_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.7, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``course grade``'s arguments to ``parser``."""
    parser.add_argument("paths", nargs="+", metavar="PATH", help="exercise notebooks (.ipynb) to grade")
    parser.add_argument(
        "--lesson",
        default=None,
        help="grade as this lesson (number, id or slug); default: the notebook's metadata, else its file name",
    )
    parser.add_argument("--json", metavar="FILE", default=None, help="write the full report as JSON")
    parser.add_argument("--junit", metavar="FILE", default=None, help="write JUnit XML (one testcase per exercise)")
    parser.add_argument(
        "--markdown", metavar="FILE", default=None, help="write a Markdown summary (e.g. $GITHUB_STEP_SUMMARY)"
    )
    add_limit_arguments(parser)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """The pass mark and the time limits, shared by ``course grade`` and ``course grade-class``."""
    parser.add_argument(
        "--pass-mark",
        type=fraction_arg,
        default=DEFAULT_PASS_MARK,
        metavar="FRACTION",
        help=f"fraction of the points needed to pass (default {DEFAULT_PASS_MARK})",
    )
    parser.add_argument(
        "--cell-timeout",
        type=positive_seconds_arg,
        default=60.0,
        metavar="S",
        help="seconds each cell may run (default 60)",
    )
    parser.add_argument(
        "--total-timeout",
        type=positive_seconds_arg,
        default=300.0,
        metavar="S",
        help="seconds the whole notebook may run, kernel start included; the checks then get at most "
        "min(cell timeout, 10 s) more (default 300)",
    )
    parser.add_argument(
        "--check-timeout",
        type=positive_seconds_arg,
        default=10.0,
        metavar="S",
        help="seconds each check of an exercise may run (default 10)",
    )


def run(args: argparse.Namespace) -> int:
    """Grade every PATH, print tables, write the requested reports.

    Returns:
        0 if every notebook reaches the pass mark, 1 otherwise, 2 if a report file
        could not be written.
    """
    from course_lib.course.grading.report import (
        NotebookReport,
        render_table,
        to_json,
        to_junit,
        to_markdown,
        write_text,
    )
    from course_lib.course.grading.runner import GradeOptions, grade_notebook

    options = GradeOptions(
        lesson=args.lesson,
        pass_mark=args.pass_mark,
        cell_timeout=args.cell_timeout,
        total_timeout=args.total_timeout,
        check_timeout=args.check_timeout,
    )
    reports: list[NotebookReport] = []
    for path in args.paths:
        print(f"grading {path} ...", flush=True)
        try:
            report = grade_notebook(path, options)
        except Exception as exc:
            report = NotebookReport(path=str(path), lesson=None, pass_mark=options.pass_mark)
            report.error = f"internal grader error: {type(exc).__name__}: {exc} (set COURSE_GRADE_DEBUG=1 for details)"
            if os.environ.get("COURSE_GRADE_DEBUG"):
                traceback.print_exc()
        reports.append(report)
        print(render_table(report), flush=True)
        print()

    status = 0 if reports and all(r.passed for r in reports) else 1
    if len(reports) > 1:
        passed = sum(r.passed for r in reports)
        print(f"{passed}/{len(reports)} notebooks reached the pass mark")
    writers = ((args.json, to_json), (args.junit, to_junit), (args.markdown, to_markdown))
    for target, render in writers:
        if target:
            try:
                write_text(target, render(reports))
            except OSError as exc:
                print(f"course grade: cannot write {target}: {exc.strerror or exc}", file=sys.stderr)
                status = 2
    return status


def main(argv: list[str] | None = None) -> int:
    """``python -m course_lib.course.grading.cli PATH...``: the same as ``course grade PATH...``."""
    parser = argparse.ArgumentParser(prog="course grade", description="grade exercise notebooks in a separate kernel")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
