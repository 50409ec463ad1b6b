"""Every exercise of every lesson refuses a submission that hands the work to course_lib.

`tests/delegation_cases.py` names, per exercise, course_lib's own implementation of its
concept and a body that adapts it to the exercise's contract. From each entry this file
generates submissions that reach that implementation in the ways a learner could (an
import at the top of the cell or in the body, a module attribute, `importlib` or
`__import__` with a computed name, `sys.modules`, a `functools.wraps` wrapper, a callable
object) and asserts that each scores 0 with the guard's message naming course_lib. The
plain delegating submission passes every check when no guard applies (the checks run one
by one with `run_check`), so it is the guard that refuses it, not a wrong value.
"""

from __future__ import annotations

import contextlib
import io
import textwrap
from typing import Any

import pytest
from delegation_cases import CASES, Delegation

from course_lib.course.catalog import available_lessons
from course_lib.course.grading.checks import run_check, run_exercise
from course_lib.course.grading.guard import GUARD_DESCRIPTION
from course_lib.course.grading.lessons import exercises_for, get_exercise
from course_lib.course.paths import repo_root


def _split(name: str) -> str:
    """A string expression that builds ``name`` at run time (no constant the compiler folds)."""
    half = len(name) // 2
    return f'"".join([{name[:half]!r}, {name[half:]!r}])'


def _bind(case: Delegation, module_expr: str) -> str:
    """``lib = <module>.<attr>`` for a module object written as ``module_expr``."""
    getters = module_expr
    for part in case.attr.split("."):
        getters = f"getattr({getters}, {_split(part)})"
    return f"lib = {getters}"


def _function(case: Delegation, first_lines: list[str], name: str | None = None) -> str:
    body = textwrap.indent(textwrap.dedent(case.body).strip(), "    ")
    head = "".join(f"    {line}\n" for line in first_lines)
    return f"def {name or case.name}({case.params}):\n{head}{body}\n"


def _root_import(case: Delegation) -> tuple[str, str]:
    """``from module import Root as _root`` and the expression of ``attr`` from ``_root``."""
    root, *rest = case.attr.split(".")
    return f"from {case.module} import {root} as _root", ".".join(["_root", *rest])


VARIANTS = (
    "import_at_top",
    "import_in_body",
    "module_attribute",
    "importlib_computed",
    "dunder_import_computed",
    "sys_modules_computed",
    "wraps_wrapper",
    "callable_object",
)


def submission(case: Delegation, variant: str) -> str:
    """The source of a notebook cell that defines ``case.name`` by delegating, the ``variant`` way."""
    setup = textwrap.dedent(case.setup).strip()
    imp, expr = _root_import(case)
    if variant == "import_at_top":
        code = f"{imp}\nlib = {expr}\n\n" + _function(case, [])
    elif variant == "import_in_body":
        code = _function(case, [imp, f"lib = {expr}"])
    elif variant == "module_attribute":
        code = f"import {case.module} as _mod\n\n" + _function(case, [f"lib = _mod.{case.attr}"])
    elif variant == "importlib_computed":
        code = "import importlib\n\n" + _function(
            case, [_bind(case, f"importlib.import_module({_split(case.module)})")]
        )
    elif variant == "dunder_import_computed":
        code = _function(case, [_bind(case, f"__import__({_split(case.module)}, fromlist=['_'])")])
    elif variant == "sys_modules_computed":
        code = f"import sys\nimport {case.module.split('.')[0]}  # noqa\n\n" + _function(
            case, [f"__import__({_split(case.module)})", _bind(case, f"sys.modules[{_split(case.module)}]")]
        )
    elif variant == "wraps_wrapper":
        code = (
            "import functools\nimport importlib\n\n"
            + _function(case, [_bind(case, f"importlib.import_module({_split(case.module)})")], name="_impl")
            + f"\n@functools.wraps(_impl)\ndef {case.name}(*args, **kwargs):\n    return _impl(*args, **kwargs)\n"
        )
    elif variant == "callable_object":
        method = _function(case, [_bind(case, f"importlib.import_module({_split(case.module)})")], name="__call__")
        method = method.replace(
            "def __call__(", "def __call__(self, " if case.params.strip() else "def __call__(self", 1
        )
        code = "import importlib\n\nclass _Answer:\n" + textwrap.indent(method, "    ") + f"\n{case.name} = _Answer()\n"
    else:  # pragma: no cover
        raise ValueError(variant)
    return f"{setup}\n{code}" if setup else code


def defined(case: Delegation, variant: str) -> Any:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(submission(case, variant), f"<delegation {case.lesson} {case.name} {variant}>", "exec"), namespace)
    return namespace[case.name]


def test_every_exercise_of_every_lesson_has_a_delegation_case():
    root = repo_root()
    lessons = [lesson.id for lesson in available_lessons(root) if lesson.exercise_source(root).exists()]
    wanted = [(lid, e.name) for lid in lessons for e in exercises_for(lid)]
    have = [(c.lesson, c.name) for c in CASES]
    assert sorted(have) == sorted(wanted), set(wanted) ^ set(have)
    for case in CASES:
        assert case.module.startswith("course_lib.") and not case.module.startswith("course_lib.course"), case
        assert case.passes_unguarded or case.why, f"{case.name}: say why the library cannot answer it"


@pytest.mark.parametrize("case", CASES, ids=[f"{c.lesson[:2]}-{c.name}" for c in CASES])
def test_the_plain_delegation_is_right_so_only_the_guard_refuses_it(case):
    """Without the guard (each check run alone) the delegating function passes every check:
    the library does answer the exercise, which is why the guard must refuse it."""
    if not case.passes_unguarded:
        pytest.skip(case.why)
    fn = defined(case, "import_at_top")
    results = [run_check(check, fn) for check in get_exercise(case.lesson, case.name).checks]
    failed = [f"{r.description}: {r.message}" for r in results if not r.passed]
    assert not failed, failed


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("case", CASES, ids=[f"{c.lesson[:2]}-{c.name}" for c in CASES])
def test_a_delegating_submission_scores_zero_and_is_told_why(case, variant):
    exercise = get_exercise(case.lesson, case.name)
    outcome = run_exercise(exercise, defined(case, variant))
    assert not outcome.passed  # scoring is all or nothing: 0 points
    static = variant in {"import_at_top", "import_in_body", "module_attribute"}
    if not (case.passes_unguarded or static):
        return  # the adapted call may fail before it reaches the library: 0 points is what counts
    message = outcome.message
    assert "the library's own implementation" in message and " uses course_lib" in message, message
    assert f"write {case.name} yourself" in message, message
    if static:  # refused before any check runs
        assert outcome.results[0].description == GUARD_DESCRIPTION, outcome.results
