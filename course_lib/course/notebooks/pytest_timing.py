"""pytest plugin: print how many seconds each notebook took under nbval.

Loaded by ``-p course_lib.course.notebooks.pytest_timing`` (pyproject's addopts); the table
appears at the end of any pytest run that executed notebooks.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

#: each notebook's budget on the slowest machine CI has met (BENCHMARKS.md)
BUDGET_S = 150

_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = report.nodeid.split("::", 1)[0]
    if path.endswith(".ipynb"):
        _seconds[path] += report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _seconds:
        return
    terminalreporter.section(f"notebook execution seconds (budget: {BUDGET_S} s each)")
    for path, seconds in sorted(_seconds.items()):
        flag = "" if seconds <= BUDGET_S else "   OVER BUDGET"
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}{flag}")
