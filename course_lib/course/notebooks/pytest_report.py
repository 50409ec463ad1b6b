"""pytest plugin: write one JSON line per test outcome to ``$COURSE_PYTEST_REPORT``.

Loaded by ``course portability`` (``-p course_lib.course.notebooks.pytest_report``), which
reads the lines back to say which notebook cells differed and how. Without the
environment variable the plugin does nothing.
"""

from __future__ import annotations

import json
import os

import pytest

ENV = "COURSE_PYTEST_REPORT"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Attach the item's file and name: a node id holds no path for a file outside the rootdir."""
    outcome = yield
    report = outcome.get_result()
    report.user_properties.append(("file", str(item.path)))
    report.user_properties.append(("name", item.name))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(ENV)
    if not path or (report.when != "call" and report.outcome == "passed"):
        return
    props = dict(report.user_properties)
    line = {
        "nodeid": report.nodeid,
        "file": props.get("file", report.nodeid.split("::", 1)[0]),
        "name": props.get("name", report.nodeid.split("::")[-1]),
        "when": report.when,
        "outcome": report.outcome,
        "seconds": round(report.duration, 3),
        "message": report.longreprtext if report.failed else "",
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
