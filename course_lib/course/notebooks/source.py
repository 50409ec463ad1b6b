"""Turn the diffable text sources into notebooks (no execution here).

Lessons: ``lessons/NN_slug.py`` (jupytext percent format) -> ``lessons/NN_slug.ipynb``.

Exercises: ``exercises/src/NN_slug.py`` is the one source of both generated notebooks.
Inside a code cell, the solution sits between marker lines::

    def discounted_returns(rewards, dones, gamma):
        \"\"\"...\"\"\"
        ### BEGIN SOLUTION
        ...
        ### END SOLUTION

The exercise notebook replaces each marked block by
``raise NotImplementedError("not implemented yet")`` at the block's indentation; the
solution notebook keeps the block and drops the marker lines. Cell tags steer the rest:

- ``raises-in-stub``: the cell raises in the exercise notebook (it calls a stub), so it
  gets the ``raises-exception`` tag there, which both nbclient and nbval honour;
- ``solution-only`` / ``exercise-only``: the cell appears in one notebook only.

Hints have one source, the grader's ``Exercise(..., hints=(...))``: both notebooks get
each hint of an exercise as its own collapsed markdown cell (a ``<details>`` block),
right after the exercise's statement (the markdown cell with its ``## Exercise N ·``
header); the exercise is the one the statement's ``check(...)`` cell names. In a hint,
`` `code` `` spans become ``<code>`` and the rest is HTML-escaped.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import jupytext
import nbformat
from nbformat import NotebookNode

Kind = Literal["lesson", "exercise", "solution"]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
STUB_LINE = 'raise NotImplementedError("not implemented yet")'
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
_KEPT_TAGS_PREFIX = ("raises-exception", "exercise", "exercise-check", "nbval-", "hide")


class SourceError(ValueError):
    """A text source that cannot be turned into a notebook (names file and cell)."""


@dataclass(frozen=True)
class Target:
    """One notebook that ``course build`` produces from one text source."""

    lesson_id: str
    kind: Kind
    source: Path
    notebook: Path


def targets_for(lesson_id: str, root: Path) -> list[Target]:
    """The notebooks generated for one lesson (those whose source exists), in build order."""
    out: list[Target] = []
    ex_src = root / "exercises" / "src" / f"{lesson_id}.py"
    if ex_src.exists():
        out.append(Target(lesson_id, "exercise", ex_src, root / "exercises" / f"{lesson_id}.ipynb"))
        out.append(Target(lesson_id, "solution", ex_src, root / "solutions" / f"{lesson_id}.ipynb"))
    lesson_src = root / "lessons" / f"{lesson_id}.py"
    if lesson_src.exists():  # last: a lesson may grade its own exercise notebooks
        out.append(Target(lesson_id, "lesson", lesson_src, root / "lessons" / f"{lesson_id}.ipynb"))
    return out


def _stub(source: str, where: str) -> str:
    """Replace every BEGIN/END SOLUTION block of a cell by a NotImplementedError."""
    lines = source.split("\n")
    out: list[str] = []
    inside = False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise SourceError(f"{where}, line {number}: nested {BEGIN!r}")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{STUB_LINE}")
        elif stripped == END:
            if not inside:
                raise SourceError(f"{where}, line {number}: {END!r} without {BEGIN!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise SourceError(f"{where}: {BEGIN!r} is never closed by {END!r}")
    return "\n".join(out)


def _solution(source: str) -> str:
    return "\n".join(line for line in source.split("\n") if line.strip() not in (BEGIN, END))


_EXERCISE_HEADER = re.compile(r"^## Exercise \d+ ·", re.MULTILINE)
_CHECK_CALL = re.compile(r"""\bcheck\(\s*["'][^"']+["']\s*,\s*["']([^"']+)["']""")


def hint_markdown(number: int, text: str) -> str:
    """Hint ``number`` (1 = gentlest) as a collapsed block: `` `code` `` -> ``<code>``."""
    parts = re.split(r"`([^`]*)`", text.strip())
    body = "".join(
        f"<code>{html.escape(part, quote=False)}</code>" if odd else html.escape(part, quote=False)
        for odd, part in ((k % 2 == 1, p) for k, p in enumerate(parts))
    )
    return f"<details><summary>Hint {number}</summary>\n{body}\n</details>"


def _grader_hints(lesson_id: str) -> dict[str, tuple[str, ...]]:
    """Each exercise's hints from the lesson's grader (none for a lesson outside the catalog)."""
    from course_lib.course.grading.lessons import exercises_for

    try:
        exercises = exercises_for(lesson_id)
    except KeyError:
        return {}
    return {e.name: tuple(e.hints) for e in exercises}


def _checked_name(cells: list[NotebookNode]) -> str | None:
    """The exercise that the first ``exercise-check`` cell among ``cells`` checks (before
    the next exercise's statement)."""
    for cell in cells:
        if cell.cell_type == "markdown" and _EXERCISE_HEADER.search(cell.source):
            return None
        if cell.cell_type == "code" and "exercise-check" in cell.metadata.get("tags", []):
            found = _CHECK_CALL.search(cell.source)
            return found.group(1) if found else None
    return None


def _clean_cell(cell: NotebookNode, index: int) -> NotebookNode:
    tags = [t for t in cell.metadata.get("tags", []) if t]
    cell.metadata = {"tags": tags} if tags else {}
    cell.id = f"c{index:03d}"
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    return cell


def render(target: Target) -> NotebookNode:
    """The unexecuted notebook that ``target``'s source defines."""
    try:
        text = target.source.read_text(encoding="utf-8")
        nb = jupytext.reads(text, fmt="py:percent")
    except Exception as exc:  # jupytext raises assorted errors on malformed sources
        raise SourceError(f"{target.source}: cannot read as a jupytext percent script: {exc}") from exc
    cells: list[NotebookNode] = []
    has_marker = False
    hints: dict[str, tuple[str, ...]] | None = None  # the grader's, loaded at the first statement
    for i, cell in enumerate(nb.cells):
        tags = list(cell.metadata.get("tags", []))
        where = f"{target.source.name}, cell {i}"
        if target.kind == "lesson":
            if BEGIN in cell.source:
                raise SourceError(f"{where}: solution markers belong in exercises/src/, not in a lesson")
        else:
            if target.kind == "exercise" and "solution-only" in tags:
                continue
            if target.kind == "solution" and "exercise-only" in tags:
                continue
            if cell.cell_type == "code":
                has_marker |= BEGIN in cell.source
                cell.source = _stub(cell.source, where) if target.kind == "exercise" else _solution(cell.source)
            raises = "raises-in-stub" in tags
            tags = [t for t in tags if t not in ("raises-in-stub", "solution-only", "exercise-only")]
            if raises and target.kind == "exercise":
                tags.append("raises-exception")
        cell.metadata["tags"] = tags
        cells.append(_clean_cell(cell, len(cells)))
        if target.kind != "lesson" and cell.cell_type == "markdown" and _EXERCISE_HEADER.search(cell.source):
            if hints is None:
                hints = _grader_hints(target.lesson_id)
            name = _checked_name(nb.cells[i + 1 :])
            for number, text in enumerate(hints.get(name or "", ()), 1):
                cells.append(_clean_cell(nbformat.v4.new_markdown_cell(hint_markdown(number, text)), len(cells)))
    if target.kind != "lesson" and not has_marker:
        raise SourceError(f"{target.source}: an exercise source needs at least one {BEGIN!r} block")
    out = nbformat.v4.new_notebook()
    out.cells = cells
    out.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": {"name": "python"},
        "course": {"lesson": target.lesson_id, "kind": target.kind},
    }
    return out


_WS = re.compile(r"[ \t]+$", re.MULTILINE)


def cell_signature(nb: NotebookNode) -> list[tuple[str, str, tuple[str, ...]]]:
    """What must agree between a source and its notebook: type, text and tags of each cell."""
    sig = []
    for cell in nb.cells:
        source = cell.source if isinstance(cell.source, str) else "".join(cell.source)
        sig.append((cell.cell_type, _WS.sub("", source).strip("\n"), tuple(cell.metadata.get("tags", []))))
    return sig
