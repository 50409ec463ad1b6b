"""How long `course grade` takes on lesson notebooks: the learner's wait per grade.

Grading starts a separate kernel, executes the notebook and runs the checks, so the
figure is dominated by kernel start and the notebook's own cells.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.course.catalog import available_lessons
from course_lib.course.paths import repo_root


def run() -> Result:
    root = repo_root()
    rows = []
    for lesson in available_lessons(root):
        for folder in ("solutions", "exercises"):
            path = root / folder / f"{lesson.id}.ipynb"
            if not path.exists():
                continue
            start = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "course_lib", "grade", str(path)], capture_output=True, text=True, timeout=600
            )
            seconds = time.perf_counter() - start
            rows.append([f"`{folder}/{path.name}`", f"{seconds:.1f}", str(done.returncode)])
    return Result(
        title="Time to grade a notebook (`course grade`)",
        columns=["notebook", "seconds", "exit code"],
        rows=rows,
        notes=["Exit code 0 on solutions (pass mark reached), 1 on the untouched exercise stubs."],
    )
