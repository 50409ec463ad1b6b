"""The grader's side inside the learner's kernel.

``course grade`` executes the learner's notebook in a separate kernel, then injects one
cell per exercise that calls :func:`grade_exercise` with the kernel's globals. Results
go to a JSON-lines file, one line per event, flushed as they happen, so the grader
keeps what was checked even if the kernel is killed midway. Events::

    {"exercise": "discounted_returns", "event": "start"}
    {"exercise": "discounted_returns", "event": "missing"}         # name not defined
    {"exercise": "discounted_returns", "event": "check", "description": ..., "status": ..., "message": ...}
    {"exercise": "discounted_returns", "event": "end"}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TextIO

from course_lib.course.grading.checks import CheckResult, run_exercise
from course_lib.course.grading.lessons import get_exercise


def _write(stream: TextIO, record: dict[str, Any]) -> None:
    stream.write(json.dumps(record) + "\n")
    stream.flush()


def grade_exercise(
    lesson_id: str,
    name: str,
    namespace: Mapping[str, Any],
    results_path: str,
    *,
    check_timeout: float | None = None,
    module: str | None = None,
) -> None:
    """Check exercise ``name`` against ``namespace[name]``, appending events to ``results_path``.

    Args:
        lesson_id: the lesson whose exercise this is.
        name: the exercise (the learner's function name).
        namespace: the kernel's globals (the learner's definitions).
        results_path: the JSON-lines file the grader reads.
        check_timeout: cap, in seconds, on every check's own time limit.
        module: checks module to use instead of the lesson's (tests).
    """
    exercise = get_exercise(lesson_id, name, module)
    with open(results_path, "a", encoding="utf-8") as stream:
        _write(stream, {"exercise": name, "event": "start"})
        if name not in namespace:
            _write(stream, {"exercise": name, "event": "missing"})
        else:

            def on_result(result: CheckResult) -> None:
                _write(stream, {"exercise": name, "event": "check", **result.to_dict()})

            run_exercise(exercise, namespace[name], time_limit_s=check_timeout, on_result=on_result)
        _write(stream, {"exercise": name, "event": "end"})
