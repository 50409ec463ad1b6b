"""Shared test helpers: the real exercise and solution code, taken from the single
source (`exercises/src/NN_slug.py`) exactly as the generated notebooks hold it, so the
grader is tested on what learners see rather than on copies written into the tests."""

from __future__ import annotations

import contextlib
import functools
import io
from typing import Any

from course_lib.course.notebooks.source import render, targets_for
from course_lib.course.paths import repo_root
from course_lib.scaling.devices import use_cpu_devices

#: The test session's JAX has 4 CPU host devices (lesson 05's meshes, shardings and
#: collectives); single-device code runs on the first, as before. Set before any test
#: module computes with JAX (conftest is imported first).
TEST_CPU_DEVICES = 4
use_cpu_devices(TEST_CPU_DEVICES)


def _render(lesson_id: str, kind: str):
    return render(next(t for t in targets_for(lesson_id, repo_root()) if t.kind == kind))


def exercise_cells(lesson_id: str, kind: str) -> list[str]:
    """Source of the code cells up to and including the last cell tagged ``exercise``
    (setup code and the exercise functions), as in the ``kind`` notebook
    (``"exercise"`` = stubs, ``"solution"`` = solved). Check cells and demo cells (those
    that raise in the stub notebook) are left out."""
    demos = {c.source for c in _render(lesson_id, "exercise").cells if "raises-exception" in c.metadata.get("tags", [])}
    cells = [c for c in _render(lesson_id, kind).cells if c.cell_type == "code"]
    last = max(i for i, c in enumerate(cells) if "exercise" in c.metadata.get("tags", []))
    return [
        c.source
        for c in cells[: last + 1]
        if "exercise-check" not in c.metadata.get("tags", []) and c.source not in demos
    ]


def exercise_function_source(lesson_id: str, name: str, kind: str) -> str:
    """The source of the cell that defines ``name`` in the ``kind`` notebook."""
    for source in exercise_cells(lesson_id, kind):
        if f"def {name}(" in source:
            return source
    raise KeyError(f"no cell defines {name} in the {kind} notebook of {lesson_id}")


@functools.cache
def _namespace(lesson_id: str, kind: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": f"{kind}_{lesson_id}"}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        for source in exercise_cells(lesson_id, kind):
            exec(compile(source, f"<{kind} {lesson_id}>", "exec"), namespace)
    return namespace


def solution_function(lesson_id: str, name: str) -> Any:
    """The solved function ``name`` of lesson ``lesson_id``."""
    return _namespace(lesson_id, "solution")[name]


def stub_function(lesson_id: str, name: str) -> Any:
    """The stub of ``name`` that the exercise notebook ships."""
    return _namespace(lesson_id, "exercise")[name]


# ---------------------------------------------------------------------------
# Planted bugs as edits of the real solution
# ---------------------------------------------------------------------------

from dataclasses import dataclass  # noqa: E402


@dataclass(frozen=True)
class Mutant:
    """A planted bug: the real solution of ``function`` with ``old`` replaced by ``new``.

    ``old`` must occur exactly once in the solution's cell, so a change to the solution
    that makes a mutant meaningless fails loudly instead of silently testing nothing.
    ``expected`` is a fragment the grader's message must contain.
    """

    function: str
    name: str
    old: str
    new: str
    expected: str

    @property
    def id(self) -> str:
        return f"{self.function}-{self.name}"


def mutant_source(lesson_id: str, mutant: Mutant) -> str:
    """The solution cell of ``mutant.function`` with the bug planted."""
    source = exercise_function_source(lesson_id, mutant.function, "solution")
    count = source.count(mutant.old)
    if count != 1:
        raise AssertionError(
            f"mutant {mutant.id}: {mutant.old!r} occurs {count} times in the solution "
            f"of {mutant.function} (must be exactly once); update tests/mutants/"
        )
    return source.replace(mutant.old, mutant.new)


def mutant_function(lesson_id: str, mutant: Mutant) -> Any:
    """The mutated function, defined beside the solution notebook's setup code."""
    namespace = dict(_namespace(lesson_id, "solution"))
    exec(compile(mutant_source(lesson_id, mutant), f"<mutant {mutant.id}>", "exec"), namespace)
    return namespace[mutant.function]


def grade_with_planted_bugs(lesson_id: str, chosen: dict[str, Mutant], tmp_path: Any) -> tuple[int, dict[str, Any]]:
    """``course grade`` (its CLI, a separate kernel) on the solution notebook with each
    exercise's function cell replaced by its planted bug in ``chosen`` (function name ->
    mutant). Returns the exit code and the notebook's JSON report."""
    import json

    import nbformat

    from course_lib.course.grading import cli as grade_cli

    nb = _render(lesson_id, "solution")
    for cell in nb.cells:
        if "exercise" in cell.metadata.get("tags", []):
            cell.source = mutant_source(lesson_id, chosen[cell.source.split("(")[0].removeprefix("def ")])
    tmp_path.mkdir(parents=True, exist_ok=True)
    target, report_path = tmp_path / f"{lesson_id}.ipynb", tmp_path / "report.json"
    nbformat.write(nb, target)
    with contextlib.redirect_stdout(io.StringIO()):
        rc = grade_cli.main([str(target), "--json", str(report_path)])
    (report,) = json.loads(report_path.read_text())["notebooks"]
    return rc, report


# ---------------------------------------------------------------------------------------
# No orphan processes: fixtures for the suites that start real processes (03, 07, 09)
# ---------------------------------------------------------------------------------------

import psutil  # noqa: E402
import pytest  # noqa: E402

from course_lib.runtime.processes import live_children, stop_multiprocessing_helpers, wait_gone  # noqa: E402


@pytest.fixture
def no_orphans():
    """Fail the test if it leaves any child process behind."""
    before = {p.pid for p in live_children()}
    yield
    left = [p for p in live_children() if p.pid not in before]
    assert wait_gone([p.pid for p in left]), f"orphans left: {[(p.pid, p.name()) for p in left]}"


@pytest.fixture(scope="module")
def no_helpers_left_behind():
    """After the module, not even multiprocessing's forkserver and resource tracker remain
    (later tests assert that the test process has no children at all). Opt in with
    ``pytestmark = pytest.mark.usefixtures("no_helpers_left_behind")``."""
    yield
    stop_multiprocessing_helpers()
    assert wait_gone([p.pid for p in psutil.Process().children(recursive=True)])


@pytest.fixture(autouse=True)
def fresh_hint_tiers():
    """Each test starts with no failures seen: its first failing check() prints hint 1
    (check() shows the next hint on each repeated failure in a process)."""
    from course_lib.course.grading.selfcheck import reset_hint_tiers

    reset_hint_tiers()
    yield


# ---------------------------------------------------------------------------------------
# Ray: only inside a loopback-only network namespace (course_lib.runtime.netns)
# ---------------------------------------------------------------------------------------

from pathlib import Path  # noqa: E402

from course_lib.course.notebooks.execute import ISOLATED_LESSONS  # noqa: E402
from course_lib.runtime.netns import HOW_TO_RUN, in_loopback_namespace  # noqa: E402

#: why a Ray test or a Ray lesson notebook is skipped outside the namespace
RAY_SKIP_REASON = f"starts Ray: runs only inside a loopback-only network namespace; run {HOW_TO_RUN}"


def needs_loopback_namespace(item: pytest.Item) -> bool:
    """Items that start Ray: tests marked ``ray``, and nbval's cells of the lesson notebooks
    in ``ISOLATED_LESSONS`` (``lessons/12_capstone_ray.ipynb``; not its exercise and solution
    notebooks, which do not start Ray)."""
    if item.get_closest_marker("ray") is not None:
        return True
    path = Path(str(item.path))
    return path.suffix == ".ipynb" and path.parent.name == "lessons" and path.stem in ISOLATED_LESSONS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the items that start Ray unless this process is in a loopback-only namespace.

    Called for every item of the session, notebooks under ``--nbval`` included, whenever
    ``tests/`` is among pytest's arguments (as in ``make test``)."""
    chosen = [item for item in items if needs_loopback_namespace(item)]
    if chosen and not in_loopback_namespace():
        for item in chosen:
            item.add_marker(pytest.mark.skip(reason=RAY_SKIP_REASON))
