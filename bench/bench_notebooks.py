"""How long each notebook takes to execute at the default `cpu` scale (budget: 150 s).

The run contract promises every notebook in at most 150 s on the slowest 2-core CPU CI
has met (`course_lib.course.notebooks.pytest_timing.BUDGET_S`); this
measures it outside pytest, one fresh kernel per notebook, as `course build` runs them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import Result

from course_lib.course.catalog import available_lessons
from course_lib.course.notebooks.execute import execute_notebook, needs_isolation
from course_lib.course.notebooks.pytest_timing import BUDGET_S
from course_lib.course.notebooks.source import render, targets_for
from course_lib.course.paths import repo_root


def run() -> Result:
    root = repo_root()
    rows = []
    for lesson in available_lessons(root):
        for target in targets_for(lesson.id, root):
            nb = render(target)
            seconds = execute_notebook(nb, target.notebook.parent, scale="cpu", isolate_network=needs_isolation(target))
            rel = target.notebook.relative_to(root)
            rows.append([f"`{rel}`", f"{seconds:.1f}", "yes" if seconds <= BUDGET_S else "**no**"])
    return Result(
        title="Notebook execution time at the cpu scale",
        columns=["notebook", "seconds", f"within {BUDGET_S:.0f} s"],
        rows=rows,
        notes=["Wall-clock seconds including kernel start; one fresh kernel per notebook."],
    )
