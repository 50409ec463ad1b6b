"""No lesson shows the solution of one of its own exercises (issue 45).

A lesson that prints the body an exercise then asks for turns the exercise into
copy-typing. For every lesson with graded exercises this test reads what a learner sees
in the lesson, without executing anything:

* the code cells and markdown of ``lessons/NN_slug.py`` (as ``course build`` renders them),
* the outputs stored in the executed ``lessons/NN_slug.ipynb`` (streams, ``text/plain``,
  ``text/html``, ``text/markdown``: a ``show_source`` listing is an output),

and fails when

(a) a code cell defines a function with an exercise's name;
(b) that text holds the solution's code: the body of the solved function (from the
    solution notebook generated from ``exercises/src/NN_slug.py``), normalised (no def
    line, docstring, comments, blank lines or markers; whitespace dropped; trivial lines
    left out), where 2 consecutive lines, or 40% of its lines, appear in the lesson. A
    line appears if the whole of it, its right-hand side, or one of its calls with the
    solution's single-assignment locals written out does (``jax.vmap(jax.vmap(train,
    ...), ...)`` shows ``inner = jax.vmap(train, ...)`` and ``jax.vmap(inner, ...)``);
(c) the lesson lists course_lib's own implementation of an exercise, as named per
    exercise by ``tests/delegation_cases.py`` (``CASES``: ``lesson``, ``name``, ``module``,
    ``attr``): a ``show_source`` call on it, or a stored listing of its source. For a
    class, its methods that the case's delegating body calls count; where the library
    answers the exercise exactly (``passes_unguarded``), so do the functions of the same
    module the implementation calls (``vtrace_recursion`` for ``vtrace``). Skipped while
    that file does not exist.
"""

from __future__ import annotations

import ast
import copy
import functools
import html
import importlib
import importlib.util
import inspect
import io
import json
import re
import sys
import textwrap
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import exercise_function_source

from course_lib.course.catalog import LESSONS
from course_lib.course.grading.lessons import exercises_for
from course_lib.course.notebooks.source import render, targets_for
from course_lib.course.paths import repo_root

ROOT = repo_root()
LESSON_IDS = [lesson.id for lesson in LESSONS if exercises_for(lesson.id)]
DELEGATION_CASES = Path(__file__).with_name("delegation_cases.py")

#: a normalised line shorter than this says nothing on its own (``return out``, ``else:``)
MIN_CHARS = 12
#: flagged when this many consecutive solution lines appear ...
CONSECUTIVE = 2
#: ... or this share of them
SHARE = 0.4

HOW_TO_FIX = (
    "Fix: take it out of lessons/{lesson}.py (show instead what the lesson teaches that no exercise asks for), "
    "then rebuild the notebook with `course build {nn} --only lesson`."
)


# ---------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------

_TAG = re.compile(r"<[^>]*>")
_STYLE = re.compile(r"<style.*?</style>", re.DOTALL | re.IGNORECASE)
_SPACE = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """Text as compared with solution lines: HTML unescaped and without tags, no
    whitespace at all, lower case, one kind of quote."""
    text = html.unescape(_TAG.sub("", _STYLE.sub("", text)))
    return _SPACE.sub("", text).lower().replace("'", '"')


@dataclass(frozen=True)
class CodeLine:
    """One logical line of a solution: as written, and its normalised forms."""

    text: str  # as written, without comments (for messages)
    full: str  # normalised whole line
    value: str  # normalised right-hand side (``x = <value>``, ``return <value>``), or ""
    #: normalised calls of the line once the solution's single-assignment locals are
    #: written out (``f(g(x))`` for ``y = g(x); f(y)``), where that changed them
    inlined: tuple[str, ...] = ()

    def found_in(self, normalised: str) -> bool:
        return (
            self.full in normalised
            or (len(self.value) >= MIN_CHARS and self.value in normalised)
            or any(call in normalised for call in self.inlined)
        )


_ASSIGN = ("=", "+=", "-=", "*=", "/=", "//=", "|=", "&=", "^=", "@=", "%=")


def logical_lines(source: str) -> list[CodeLine]:
    """The non-trivial logical lines of ``source``: comments, blank lines, string-only
    lines (docstrings) and lines under ``MIN_CHARS`` normalised characters left out."""
    inlined = _inlined_calls(source)
    out: list[CodeLine] = []
    toks: list[tokenize.TokenInfo] = []
    comments: dict[int, int] = {}
    skip = {tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.start[1]
        elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if toks:
                out.append(_code_line(toks, source, comments, inlined.get(toks[0].start[0], ())))
            toks = []
        elif tok.type not in skip:
            toks.append(tok)
    return [line for line in out if len(line.full) >= MIN_CHARS and not _is_string(line.text)]


def _is_string(text: str) -> bool:
    """A statement that is a string alone (a docstring of a nested function)."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return False
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, (ast.Constant, ast.JoinedStr))


def _code_line(
    toks: list[tokenize.TokenInfo], source: str, comments: dict[int, int], inlined: tuple[str, ...]
) -> CodeLine:
    def norm(parts: list[tokenize.TokenInfo]) -> str:
        return normalise_text("".join(t.string for t in parts)) if parts else ""

    value: list[tokenize.TokenInfo] = []
    if toks[0].string in ("return", "yield"):
        value = toks[1:]
    else:
        depth = 0
        for i, tok in enumerate(toks):
            if tok.type == tokenize.OP and tok.string in ("(", "[", "{"):
                depth += 1
            elif tok.type == tokenize.OP and tok.string in (")", "]", "}"):
                depth -= 1
            elif depth == 0 and tok.type == tokenize.OP and tok.string in _ASSIGN:
                value = toks[i + 1 :]
                break
    lines = source.splitlines()
    rows = range(toks[0].start[0], toks[-1].end[0] + 1)
    text = " ".join(lines[r - 1][: comments.get(r)].strip() for r in rows)
    return CodeLine(text=text, full=norm(toks), value=norm(value), inlined=inlined)


def _inlined_calls(source: str) -> dict[int, tuple[str, ...]]:
    """Line number -> the calls of that line's statement with every local assigned once
    (``name = value``) replaced by its value: those not written as such anywhere in
    ``source`` and with at least ``2 * MIN_CHARS`` normalised characters."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    stores: dict[str, int] = {}
    values: dict[str, ast.expr] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, ast.arg):
            stores[node.arg] = stores.get(node.arg, 0) + 2
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value
    single = {
        name: value
        for name, value in values.items()
        if stores.get(name) == 1 and not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(value))
    }

    class Inline(ast.NodeTransformer):
        def __init__(self, depth: int) -> None:
            self.depth = depth

        def visit_Name(self, node: ast.Name) -> ast.AST:
            if isinstance(node.ctx, ast.Load) and node.id in single and self.depth < 4:
                return Inline(self.depth + 1).visit(copy.deepcopy(single[node.id]))
            return node

    def calls(node: ast.AST) -> set[str]:
        return {normalise_text(ast.unparse(n)) for n in ast.walk(node) if isinstance(n, ast.Call)}

    written = calls(tree)
    out: dict[int, tuple[str, ...]] = {}
    for stmt in ast.walk(tree):
        value = getattr(stmt, "value", None)
        if isinstance(stmt, (ast.Assign, ast.AugAssign, ast.Return, ast.Expr)) and value is not None:
            new = calls(Inline(0).visit(copy.deepcopy(value))) - written
            out[stmt.lineno] = tuple(sorted(c for c in new if len(c) >= 2 * MIN_CHARS))
    return out


def function_node(source: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise KeyError(name)


def body_source(source: str, name: str) -> str:
    """The body of function ``name`` in ``source``, without its def line and docstring."""
    node = function_node(source, name)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    if not body:
        return ""
    return textwrap.dedent("\n".join(source.splitlines()[body[0].lineno - 1 : body[-1].end_lineno]))


@functools.cache
def solution_lines(lesson_id: str, name: str) -> tuple[CodeLine, ...]:
    source = exercise_function_source(lesson_id, name, "solution")
    return tuple(logical_lines(body_source(source, name)))


# ---------------------------------------------------------------------------------------
# What a learner sees in a lesson
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """One piece of text a learner sees: where it is, and the text."""

    where: str
    text: str

    @functools.cached_property
    def normalised(self) -> str:
        return normalise_text(self.text)


def _first_line(source: str) -> str:
    line = next((s for s in source.splitlines() if s.strip()), "")
    return line if len(line) <= 70 else line[:67] + "..."


def _joined(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


@functools.cache
def lesson_cells(lesson_id: str) -> tuple[Any, ...]:
    target = next(t for t in targets_for(lesson_id, ROOT) if t.kind == "lesson")
    return tuple(render(target).cells)


def _code_parse(source: str) -> ast.Module | None:
    cleaned = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
    try:
        return ast.parse(cleaned)
    except SyntaxError:
        return None


@functools.cache
def lesson_text(lesson_id: str) -> tuple[Shown, ...]:
    """The code and markdown of the lesson's source, and the stored outputs of its notebook."""
    shown: list[Shown] = []
    for i, cell in enumerate(lesson_cells(lesson_id)):
        kind = "markdown cell" if cell.cell_type == "markdown" else "code cell"
        shown.append(Shown(f"{kind} {i} of lessons/{lesson_id}.py ({_first_line(cell.source)!r})", cell.source))
    notebook = ROOT / "lessons" / f"{lesson_id}.ipynb"
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        call = _first_line(_joined(cell["source"]))
        for output in cell.get("outputs", []):
            texts = [_joined(output.get("text", ""))]
            texts += [_joined(output.get("data", {}).get(m, "")) for m in ("text/plain", "text/html", "text/markdown")]
            for text in texts:
                if text:
                    shown.append(
                        Shown(f"the stored output of code cell {i} of lessons/{lesson_id}.ipynb ({call!r})", text)
                    )
    return tuple(shown)


def where_found(line: CodeLine, shown: tuple[Shown, ...]) -> str | None:
    return next((s.where for s in shown if line.found_in(s.normalised)), None)


# ---------------------------------------------------------------------------------------
# (a) and (b): the solution in the lesson's code, markdown or outputs
# ---------------------------------------------------------------------------------------


def defined_exercises(lesson_id: str) -> list[str]:
    names = {e.name: n for n, e in enumerate(exercises_for(lesson_id), 1)}
    found = []
    for i, cell in enumerate(lesson_cells(lesson_id)):
        tree = _code_parse(cell.source) if cell.cell_type == "code" else None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                found.append(
                    f"lesson {lesson_id}, exercise {names[node.name]} ({node.name}): code cell {i} of "
                    f"lessons/{lesson_id}.py ({_first_line(cell.source)!r}) defines {node.name} itself, so the "
                    f"learner reads the answer before the exercise. "
                    + HOW_TO_FIX.format(lesson=lesson_id, nn=lesson_id[:2])
                )
    return found


#: a call of the array/ML libraries in normalised text (``jax.lax.pmean(`` and ``lax.pmean(`` alike)
_API_CALL = re.compile(r"(?<![\w.])((?:jax|jnp|lax|np|optax|torch)(?:\.\w+)+)\(")


@functools.cache
def api_calls(text: str) -> tuple[str, ...]:
    """The library calls of ``text`` (HTML unescaped, without tags) in order, ``jax.lax.x`` written ``lax.x``."""
    plain = re.sub(r"\s*([.(])\s*", r"\1", html.unescape(_TAG.sub("", _STYLE.sub("", text))))
    return tuple(m.removeprefix("jax.") if m.startswith("jax.lax.") else m for m in _API_CALL.findall(plain))


@functools.cache
def solution_api_calls(lesson_id: str, name: str) -> tuple[str, ...]:
    """The library calls of a solution's body, in order (comments and docstring left out)."""
    return api_calls("\n".join(line.text for line in solution_lines(lesson_id, name)))


def _holds_in_a_row(calls: tuple[str, ...], seq: tuple[str, ...]) -> bool:
    return any(calls[i : i + len(seq)] == seq for i in range(len(calls) - len(seq) + 1))


def shown_mechanism(lesson_id: str, number: int, name: str, shown: tuple[Shown, ...]) -> list[str]:
    """(d) a short solution's library calls, in its order and with no other library call between
    them, in one piece of lesson text: the solution's mechanism under other names
    (``grads, parts = jax.grad(my_loss, has_aux=True)(flat)`` then ``jax.lax.pmean(grads, axis)``
    gives away ``jax.grad(loss_fn)(params, batch)`` then ``jax.lax.pmean(grads, axis_name)``).
    Only for solutions of at most 4 lines: a longer one is caught by its lines."""
    lines = solution_lines(lesson_id, name)
    seq = solution_api_calls(lesson_id, name)
    if len(lines) > 4 or len(seq) < 2 or len(seq) != len(lines):
        return []
    return [
        f"lesson {lesson_id}, exercise {number} ({name}): {s.where} calls {' then '.join(seq)} in a row, the whole "
        f"mechanism of the solution under other names. " + HOW_TO_FIX.format(lesson=lesson_id, nn=lesson_id[:2])
        for s in shown
        if _holds_in_a_row(api_calls(s.text), seq)
    ][:1]


def shown_solution(lesson_id: str) -> list[str]:
    shown = lesson_text(lesson_id)
    found = []
    for number, exercise in enumerate(exercises_for(lesson_id), 1):
        lines = solution_lines(lesson_id, exercise.name)
        if not lines:
            continue
        found += shown_mechanism(lesson_id, number, exercise.name, shown)
        places = [where_found(line, shown) for line in lines]
        hits = [i for i, place in enumerate(places) if place]
        run = max((j - i for i in range(len(lines)) for j in range(i, len(lines) + 1) if all(places[i:j])), default=0)
        if run >= min(CONSECUTIVE, len(lines)) or len(hits) >= SHARE * len(lines):
            listed = "; ".join(f"`{lines[i].text}` in {places[i]}" for i in hits)
            found.append(
                f"lesson {lesson_id}, exercise {number} ({exercise.name}): {len(hits)} of the {len(lines)} "
                f"lines of its solution are shown in the lesson ({run} in a row): {listed}. "
                + HOW_TO_FIX.format(lesson=lesson_id, nn=lesson_id[:2])
            )
    return found


@pytest.mark.parametrize("lesson_id", LESSON_IDS)
def test_no_exercise_defined_in_lesson(lesson_id: str) -> None:
    found = defined_exercises(lesson_id)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("lesson_id", LESSON_IDS)
def test_no_solution_shown_in_lesson(lesson_id: str) -> None:
    found = shown_solution(lesson_id)
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------------------
# (c): course_lib's own implementation of an exercise, listed by the lesson
# ---------------------------------------------------------------------------------------


@functools.cache
def delegation_cases() -> tuple[Any, ...]:
    """``CASES`` of tests/delegation_cases.py, or () while that file does not exist."""
    if not DELEGATION_CASES.exists():
        return ()
    module = sys.modules.get("delegation_cases")
    if module is None:
        spec = importlib.util.spec_from_file_location("delegation_cases", DELEGATION_CASES)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["delegation_cases"] = module  # a dataclass needs its module registered
        spec.loader.exec_module(module)
    return tuple(module.CASES)


def _field(case: Any, name: str, default: Any = None) -> Any:
    return case.get(name, default) if isinstance(case, dict) else getattr(case, name, default)


def _lesson_of(case: Any) -> str | None:
    """The lesson id a case names (``"04"``, ``4`` or ``"04_purejaxrl"``)."""
    lesson = _field(case, "lesson")
    nn = f"{lesson:02d}" if isinstance(lesson, int) else str(lesson)[:2]
    return next((i for i in LESSON_IDS if i[:2] == nn), None)


def _resolve(module: str, attr: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _imported_names(lesson_id: str) -> dict[str, str]:
    """Name -> dotted path, from the import statements of the lesson's code cells."""
    names: dict[str, str] = {}
    for cell in lesson_cells(lesson_id):
        tree = _code_parse(cell.source) if cell.cell_type == "code" else None
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    names[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
    return names


def show_source_targets(lesson_id: str) -> list[tuple[int, str, str]]:
    """(cell, as written, dotted path) of every ``show_source(x)`` call in the lesson."""
    imported = _imported_names(lesson_id)
    out = []
    for i, cell in enumerate(lesson_cells(lesson_id)):
        tree = _code_parse(cell.source) if cell.cell_type == "code" else None
        for node in ast.walk(tree) if tree is not None else ():
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "show_source"
                and node.args
            ):
                written = ast.unparse(node.args[0])
                head, _, rest = written.partition(".")
                dotted = imported.get(head, head) + (f".{rest}" if rest else "")
                out.append((i, written, dotted))
    return out


def _listings(lesson_id: str) -> list[Shown]:
    """Stored outputs that are show_source listings (``# module.qualname`` then source)."""
    return [
        s for s in lesson_text(lesson_id) if "stored output" in s.where and s.text.lstrip().startswith("# course_lib.")
    ]


def _same_object(dotted: str, target: Any) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj = _resolve(".".join(parts[:cut]), ".".join(parts[cut:]))
        except (ImportError, AttributeError):
            continue
        return obj is target or inspect.unwrap(obj) is inspect.unwrap(target)
    return False


def _dotted(obj: Any, fallback: str) -> str:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else fallback


def implementation_parts(case: Any) -> list[tuple[str, Any, str]]:
    """(what it is, object, dotted name) for course_lib's implementation that ``case``
    names: the implementation itself; for a class, the methods the case's delegating body
    calls on it; and, where the library answers the exercise exactly
    (``passes_unguarded``), the functions of the same module that these call (one level
    down: ``vtrace`` computes the targets with ``vtrace_recursion``)."""
    module, attr = _field(case, "module"), _field(case, "attr")
    implementation = _resolve(module, attr)
    parts = [
        ("course_lib's own implementation of the exercise", implementation, _dotted(implementation, f"{module}.{attr}"))
    ]
    if inspect.isclass(implementation):
        try:
            used = {n.attr for n in ast.walk(ast.parse(_field(case, "body"))) if isinstance(n, ast.Attribute)}
        except (SyntaxError, AttributeError, KeyError):
            used = set()
        for name in sorted(used):
            method = inspect.getattr_static(implementation, name, None)
            if inspect.isfunction(method):
                parts.append((f"the method {name} of course_lib's implementation", method, _dotted(method, name)))
    for _, obj, dotted in list(parts) if _field(case, "passes_unguarded", True) else ():
        if not (inspect.isfunction(obj) or inspect.isclass(obj)):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
        except (OSError, TypeError, SyntaxError):
            continue
        home = sys.modules.get(obj.__module__)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                callee = getattr(home, node.func.id, None)
                if inspect.isfunction(callee) and callee.__module__ == obj.__module__ and callee is not obj:
                    what = f"{node.func.id}, which course_lib's implementation ({dotted}) calls"
                    if all(c is not callee for _, c, _ in parts):
                        parts.append((what, callee, _dotted(callee, node.func.id)))
    return parts


def listed_implementations(lesson_id: str, cases: tuple[Any, ...]) -> list[str]:
    numbers = {e.name: n for n, e in enumerate(exercises_for(lesson_id), 1)}
    found: list[str] = []
    for case in cases:
        if _lesson_of(case) != lesson_id:
            continue
        name = _field(case, "name")
        what = f"lesson {lesson_id}, exercise {numbers.get(name, '?')} ({name})"
        fix = HOW_TO_FIX.format(lesson=lesson_id, nn=lesson_id[:2])
        for role, obj, dotted in implementation_parts(case):
            cells = set()
            last = dotted.split(".")[-1]
            for cell, written, target in show_source_targets(lesson_id):
                if target == dotted or (target.split(".")[-1] == last and _same_object(target, obj)):
                    cells.add(cell)
                    found.append(
                        f"{what}: code cell {cell} of lessons/{lesson_id}.py calls show_source({written}), "
                        f"which lists {role} ({dotted}). {fix}"
                    )
            try:
                source = normalise_text(inspect.getsource(obj))
            except (OSError, TypeError):
                source = None
            for listing in _listings(lesson_id):
                cell = int(listing.where.split("code cell ")[1].split()[0])
                if cell in cells:
                    continue
                if listing.text.lstrip().startswith(f"# {dotted}\n") or (source and source in listing.normalised):
                    found.append(f"{what}: {listing.where} is a listing of {role} ({dotted}). {fix}")
    return list(dict.fromkeys(found))


@pytest.mark.parametrize("lesson_id", LESSON_IDS)
def test_no_library_implementation_listed(lesson_id: str) -> None:
    cases = delegation_cases()
    if not cases:
        pytest.skip(
            f"{DELEGATION_CASES.name} does not exist yet (it names course_lib's implementation of each exercise)"
        )
    found = listed_implementations(lesson_id, cases)
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------------------
# The checks themselves see what they must (a check that reads nothing passes everything)
# ---------------------------------------------------------------------------------------


def test_every_lesson_text_holds_its_stored_outputs() -> None:
    for lesson_id in LESSON_IDS:
        shown = lesson_text(lesson_id)
        assert any("stored output" in s.where for s in shown), f"no stored output read from lessons/{lesson_id}.ipynb"
        assert any("markdown cell" in s.where for s in shown), f"no markdown read from lessons/{lesson_id}.py"


def test_a_planted_solution_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lesson 04's old listing of the library's TD targets, and a minibatch shuffle written
    out in a code cell, each flagged against the exercise they give away."""
    listing = exercise_function_source("04_purejaxrl", "autoreset_td_targets", "solution")
    shuffle = exercise_function_source("04_purejaxrl", "make_minibatches", "solution")
    planted = (Shown("a planted listing", listing), Shown("a planted code cell", shuffle))
    monkeypatch.setitem(globals(), "lesson_text", lambda _: planted)
    found = shown_solution("04_purejaxrl")
    assert any("(autoreset_td_targets)" in m for m in found), found
    assert any("(make_minibatches)" in m for m in found), found


def test_a_planted_library_listing_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """``show_source(vtrace_recursion)`` in lesson 03: the recursion that ``vtrace``, the
    library's answer to exercise 1, computes its targets with."""
    import nbformat

    if not delegation_cases():
        pytest.skip(f"{DELEGATION_CASES.name} does not exist yet")
    cell = nbformat.v4.new_code_cell("from course_lib.rl.vtrace import vtrace_recursion\nshow_source(vtrace_recursion)")
    monkeypatch.setitem(globals(), "lesson_cells", lambda _: (cell,))
    monkeypatch.setitem(globals(), "lesson_text", lambda _: ())
    found = listed_implementations("03_impala_vtrace", delegation_cases())
    assert any("(vtrace_targets)" in m and "vtrace_recursion" in m for m in found), found


def test_a_renamed_mechanism_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lesson 05's old listing of ``ppo_on_my_envs``: exercise 3's ``jax.grad`` then
    ``jax.lax.pmean``, under other names and with a line between them (check (d))."""
    listing = (
        "# course_lib.scaling.ppo_dp.ppo_on_my_envs\n"
        "        grads, parts = jax.grad(my_loss, has_aux=True)(flat)\n"
        '        if sync != "vma":\n'
        "            grads = jax.lax.pmean(grads, axis)  # THE all-reduce (05.2)\n"
        "        updates, opt_state = optimizer.update(grads, opt_state, flat)\n"
    )
    monkeypatch.setitem(globals(), "lesson_text", lambda _: (Shown("a planted listing", listing),))
    found = shown_solution("05_scaling_jax")
    assert any("(data_parallel_grad)" in m and "jax.grad then lax.pmean" in m for m in found), found
