"""Hints nudge, they never hand over the solution (issue 45).

Every graded exercise has at least two tiers of hints, written once, in the grader's
``Exercise(..., hints=(...))``: the notebook generator puts each in its own collapsed
cell under the exercise's statement, and ``check()`` prints the next tier on each repeated
failure. No hint may contain the lines the learner has to write: each line of the
solution's body (from the solution notebook generated from ``exercises/src/``, without its
def line, docstring, comments, blank lines and the lines the stub already gives), with its
whitespace removed, and each run of two consecutive ones, is looked for in each hint
(HTML-unescaped, tags and backticks stripped, whitespace removed). A line shorter than
:data:`TRIVIAL` characters (``return out``, ``else:``) is only looked for beside its
neighbour.
"""

from __future__ import annotations

import ast
import html
import io
import itertools
import re
import tokenize

import pytest
from conftest import _render, exercise_function_source

from course_lib.course.catalog import LESSONS
from course_lib.course.grading.lessons import exercises_for
from course_lib.course.notebooks.source import BEGIN, END, hint_markdown
from course_lib.course.paths import repo_root

ROOT = repo_root()
SOURCED = [lesson.id for lesson in LESSONS if (ROOT / "exercises" / "src" / f"{lesson.id}.py").exists()]
EXERCISES = [(lid, e.name) for lid in SOURCED for e in exercises_for(lid)]

#: lines shorter than this (whitespace removed) are too common to count alone
TRIVIAL = 12
#: at most this many characters may separate two consecutive lines in a hint (``;``, ``and``)
JOIN = 3


def _strip_comments(source: str) -> str:
    """``source`` without its comments (a ``#`` inside a string is kept)."""
    lines = source.split("\n")
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, IndentationError):
        return source
    for tok in reversed(tokens):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            lines[row - 1] = lines[row - 1][:col]
    return "\n".join(lines)


def _skipped_rows(source: str) -> set[int]:
    """1-based rows of def headers (decorators and signature) and docstrings."""
    rows: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        body = node.body[0]
        rows.update(range(first, body.lineno))
        is_doc = (
            isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant) and isinstance(body.value.value, str)
        )
        if is_doc:
            rows.update(range(body.lineno, (body.end_lineno or body.lineno) + 1))
        if node.lineno == body.lineno:  # def f(x): return x
            rows.discard(node.lineno)
    return rows


def code_lines(source: str) -> list[tuple[str, str]]:
    """(line as written, key) of each code line of ``source``: no def header, docstring,
    comment, blank line or solution marker; the key has every whitespace removed."""
    source = "\n".join(line for line in source.split("\n") if line.strip() not in (BEGIN, END))
    skipped = _skipped_rows(source)
    out = []
    for row, line in enumerate(_strip_comments(source).split("\n"), 1):
        if row in skipped or not line.strip():
            continue
        out.append((" ".join(line.split()), re.sub(r"\s+", "", line)))
    return out


def solution_lines(lesson_id: str, name: str) -> list[tuple[str, str]]:
    """The lines of ``name``'s solution that the learner writes (those the stub lacks)."""
    given = {key for _, key in code_lines(exercise_function_source(lesson_id, name, "exercise"))}
    return [
        (line, key)
        for line, key in code_lines(exercise_function_source(lesson_id, name, "solution"))
        if key not in given
    ]


def hint_key(markdown: str) -> str:
    """A hint's cell as the test compares it: tags stripped (``<code>`` contents kept),
    HTML-unescaped, backticks and every whitespace removed."""
    text = html.unescape(re.sub(r"<[^>]*>", "", markdown))
    return re.sub(r"\s+", "", text.replace("`", ""))


def leaks(hint: str, lines: list[tuple[str, str]]) -> list[str]:
    """The solution lines (or runs of two) that ``hint`` (a grader's hint, as its notebook
    cell shows it) contains."""
    key = hint_key(hint_markdown(0, hint))
    found = [line for line, k in lines if len(k) >= TRIVIAL and k in key]
    for (a, ka), (b, kb) in itertools.pairwise(lines):
        if len(ka) + len(kb) >= TRIVIAL and re.search(re.escape(ka) + f".{{0,{JOIN}}}" + re.escape(kb), key):
            found.append(f"{a} / {b}")
    return found


def test_the_comparison_catches_a_copied_line():
    lines = code_lines(
        "def f(r, gamma):\n"
        '    """Doc: out = np.zeros_like(r)."""\n'
        "    ### BEGIN SOLUTION\n"
        "    out = np.zeros_like(r)  # the output\n"
        "    for t in range(len(r)):\n"
        "        out[t] = r[t]\n"
        "    return out\n"
        "    ### END SOLUTION\n"
    )
    assert [line for line, _ in lines] == [
        "out = np.zeros_like(r)",
        "for t in range(len(r)):",
        "out[t] = r[t]",
        "return out",
    ]
    assert leaks("start from `out=np.zeros_like( r )`", lines) == ["out = np.zeros_like(r)"]
    assert leaks("then `out[t] = r[t]`; `return out`", lines) == ["out[t] = r[t] / return out"]
    assert leaks("allocate with np.zeros_like, loop over t, return it", lines) == []
    assert hint_key(hint_markdown(1, "`a < b` & `c`, x<y>z")) == "Hint1a<b&c,x<y>z"
    assert hint_key("<details><summary>Hint 2</summary>\n<code>a &lt; b</code>\n</details>") == "Hint2a<b"


@pytest.mark.parametrize(("lesson_id", "name"), EXERCISES)
def test_hints_are_tiered_and_never_the_solution(lesson_id, name):
    exercise = next(e for e in exercises_for(lesson_id) if e.name == name)
    assert len(exercise.hints) >= 2, f"{lesson_id} {name}: needs at least 2 tiers of hints, has {len(exercise.hints)}"
    lines = solution_lines(lesson_id, name)
    assert lines, f"{lesson_id} {name}: no solution lines found"
    problems = [
        f"{lesson_id} {name} hint {tier}: contains the solution's line {line!r}"
        for tier, hint in enumerate(exercise.hints, 1)
        for line in leaks(hint, lines)
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("lesson_id", SOURCED)
def test_hints_have_one_source_and_one_cell_each_under_the_statement(lesson_id):
    text = (ROOT / "exercises" / "src" / f"{lesson_id}.py").read_text(encoding="utf-8")
    assert "<summary>Hint" not in text, (
        f"exercises/src/{lesson_id}.py: hints live in the grader's Exercise(..., hints=(...)) only; "
        "the notebook generator adds them under each statement"
    )
    for kind in ("exercise", "solution"):
        cells = _render(lesson_id, kind).cells
        for i, exercise in enumerate(exercises_for(lesson_id), 1):
            (header,) = [
                k for k, c in enumerate(cells) if c.cell_type == "markdown" and f"## Exercise {i} ·" in c.source
            ]
            shown = [c.source for c in cells[header + 1 : header + 1 + len(exercise.hints)]]
            assert shown == [hint_markdown(n, h) for n, h in enumerate(exercise.hints, 1)], (
                f"{kind} notebook of {lesson_id}: exercise {i}'s hints must follow its statement, one cell each"
            )
