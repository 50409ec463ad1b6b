"""``course reset NOTEBOOK``: start an exercise notebook, or one exercise in it, over.

``course reset exercises/01_policy_gradients.ipynb`` replaces the whole notebook by its
stub; ``--exercise 2`` (repeatable; a number or a name such as ``surrogate_loss``)
restores only that exercise's code cells (the cells tagged ``exercise``, its demo cells
and its ``exercise-check`` cell) and leaves every other cell exactly as it is: the other
answers, the participant's own cells and their outputs.

The stub is generated in memory from ``exercises/src/<lesson>.py`` by the same code as
``course build`` (:func:`course_lib.course.notebooks.source.render`); nothing is executed.

An exercise's cells are found by what they are, not where they sit: its ``## Exercise K``
heading, the functions and classes its stub cells define (``def surrogate_loss``), the
name its check cell checks, and the generated cell ids. A stub cell that the participant
deleted is put back after the exercise's previous cell (or its heading); a cell that was
moved is restored where it now is. When an exercise cannot be found at all, or a cell to
restore also holds another exercise's answer, nothing is changed and the message says why.

Before writing, the file being replaced is copied next to it
(``NAME.ipynb.bak-YYYYmmdd-HHMMSS``, never overwriting a backup); the new notebook is
validated with nbformat and written atomically (a temporary file in the same folder,
fsync, ``os.replace``). A file that is not valid JSON can still be reset whole: its bytes
go to the backup. ``--dry-run`` prints what would change and writes nothing.

Exit status: 0 on success (also when there was nothing to change), 2 on any error.
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import os
import re
import secrets
import shlex
import stat
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from collections.abc import Callable

    from nbformat import NotebookNode

#: Tags of the generated exercise notebooks that mark an exercise's cells.
EXERCISE_TAG = "exercise"
CHECK_TAG = "exercise-check"
#: An exercise heading: ``## Exercise 2 · The surrogate loss (...)``.
HEADING = re.compile(r"^\s{0,3}#{1,6}\s*Exercise\s+(\d+)\b", re.IGNORECASE)
#: The call in a check cell: ``check("01_policy_gradients", "surrogate_loss", surrogate_loss)``.
CHECK_CALL = re.compile(r"\bcheck\(\s*[\"'][^\"']*[\"']\s*,\s*[\"'](\w+)[\"']")
#: A top-level definition, for cells that do not parse (a broken answer is why people reset).
DEFINITION = re.compile(r"^(?:async\s+def|def|class)\s+(\w+)", re.MULTILINE)
#: What nbformat 4.5 allows as a cell id.
CELL_ID = re.compile(r"^[a-zA-Z0-9-_]{1,64}$")
#: Lines of a cell's diff that ``--dry-run`` shows.
DIFF_LINES = 30


class ResetError(Exception):
    """The reset cannot be done; the message says why (and nothing was changed)."""


# ---------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``course reset``'s arguments to ``parser``."""
    parser.add_argument("notebook", metavar="NOTEBOOK", help="the exercise notebook (.ipynb) to reset")
    parser.add_argument(
        "-e",
        "--exercise",
        action="append",
        default=[],
        metavar="K",
        help="reset only this exercise: its number (2) or a name it defines (surrogate_loss); repeatable, "
        "or comma-separated. Default: the whole notebook",
    )
    parser.add_argument(
        "--lesson",
        default=None,
        help="the lesson (number, id or slug) when the notebook's metadata and file name do not tell it",
    )
    parser.add_argument("-n", "--dry-run", action="store_true", help="print what would change; write nothing")


def run(args: argparse.Namespace) -> int:
    """Reset the notebook; print what was done, the backup and how to undo it."""
    try:
        for line in reset(Path(args.notebook), args.exercise, lesson=args.lesson, dry_run=args.dry_run):
            print(line)
    except ResetError as exc:
        print(f"course reset: {exc}", file=sys.stderr)
        return 2
    return 0


# ---------------------------------------------------------------------------------------
# The stub and its exercises
# ---------------------------------------------------------------------------------------


@dataclass
class StubExercise:
    """One exercise of the stub notebook.

    Attributes:
        number: K of its ``## Exercise K`` heading.
        title: the heading's first line without the ``#`` marks.
        heading: index of the heading cell in the stub.
        cells: indices of the stub cells in its section (heading to next exercise heading).
        names: the functions and classes its ``exercise`` cells define, then the names its
            check cells check (each once).
    """

    number: int
    title: str
    heading: int
    cells: list[int]
    names: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"exercise {self.number} ({', '.join(self.names) or 'no names'})"


def stub_notebook(lesson_id: str, root: Path) -> NotebookNode:
    """The pristine, unexecuted exercise notebook of ``lesson_id``, generated from its source."""
    from course_lib.course.notebooks.source import SourceError, Target, render

    source = root / "exercises" / "src" / f"{lesson_id}.py"
    if not source.exists():
        raise ResetError(f"lesson {lesson_id} has no exercises (no {source}), so there is no stub to reset to")
    try:
        return render(Target(lesson_id, "exercise", source, root / "exercises" / f"{lesson_id}.ipynb"))
    except SourceError as exc:
        raise ResetError(f"cannot generate the stub of lesson {lesson_id}: {exc}") from None


def _tags(cell: NotebookNode) -> list[str]:
    tags = cell.get("metadata", {}).get("tags", [])
    return [str(t) for t in tags] if isinstance(tags, list) else []


def _text(cell: NotebookNode) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def _heading_number(cell: NotebookNode) -> int | None:
    if cell.get("cell_type") != "markdown":
        return None
    for line in _text(cell).splitlines():
        if line.strip():
            match = HEADING.match(line)
            return int(match.group(1)) if match else None
    return None


def defined_names(source: str) -> list[str]:
    """Top-level functions and classes a cell defines (by regex when it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return list(dict.fromkeys(DEFINITION.findall(source)))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return list(dict.fromkeys(node.name for node in tree.body if isinstance(node, kinds)))


def checked_names(source: str) -> list[str]:
    """The exercise names a check cell checks."""
    return list(dict.fromkeys(CHECK_CALL.findall(source)))


def stub_exercises(stub: NotebookNode) -> list[StubExercise]:
    """The exercises of a stub notebook, in order."""
    headings = [(i, n) for i, c in enumerate(stub.cells) if (n := _heading_number(c)) is not None]
    out: list[StubExercise] = []
    for k, (start, number) in enumerate(headings):
        end = headings[k + 1][0] if k + 1 < len(headings) else len(stub.cells)
        first = next(line for line in _text(stub.cells[start]).splitlines() if line.strip())
        ex = StubExercise(number, first.strip().lstrip("#").strip(), start, list(range(start, end)))
        names: list[str] = []
        for i in ex.cells:
            cell = stub.cells[i]
            if cell.cell_type == "code" and EXERCISE_TAG in _tags(cell):
                names += defined_names(_text(cell))
        for i in ex.cells:
            cell = stub.cells[i]
            if cell.cell_type == "code" and CHECK_TAG in _tags(cell):
                names += checked_names(_text(cell))
        ex.names = list(dict.fromkeys(names))
        out.append(ex)
    return out


def select_exercises(exercises: list[StubExercise], specs: list[str], lesson_id: str) -> list[StubExercise]:
    """The exercises named by ``specs`` (numbers or names), in notebook order.

    Raises:
        ResetError: naming the valid choices when a spec matches no exercise.
    """
    wanted: set[int] = set()
    for spec in (s.strip() for raw in specs for s in raw.split(",")):
        if not spec:
            continue
        key = re.sub(r"^exercise\s*", "", spec, flags=re.IGNORECASE)
        found = [
            ex
            for ex in exercises
            if (key.isdigit() and int(key) == ex.number) or key in ex.names or key.lower() in map(str.lower, ex.names)
        ]
        if not found:
            valid = ", ".join(f"{ex.number} ({', '.join(ex.names)})" for ex in exercises)
            raise ResetError(f"lesson {lesson_id} has no exercise {spec!r}; choose a number or a name: {valid}")
        wanted.update(ex.number for ex in found)
    return [ex for ex in exercises if ex.number in wanted]


# ---------------------------------------------------------------------------------------
# Reading the participant's file
# ---------------------------------------------------------------------------------------


@dataclass
class Participant:
    """The file being reset: its bytes and, when they are a readable notebook, the notebook."""

    path: Path
    data: bytes
    nb: NotebookNode | None
    problem: str | None  # why the bytes are not a readable notebook


def read_participant(path: Path) -> Participant:
    """Read ``path``; a corrupt file is not an error here (a whole reset replaces it).

    Raises:
        ResetError: if the file is missing, a folder or cannot be read at all.
    """
    import nbformat

    if not path.exists():
        raise ResetError(f"{path}: no such file (exercise notebooks are exercises/NN_*.ipynb)")
    if path.is_dir():
        raise ResetError(f"{path} is a folder, not a notebook")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ResetError(f"{path} cannot be read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return Participant(path, data, None, "it is not UTF-8 text")
    import json

    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{exc.msg} at line {exc.lineno}, column {exc.colno}"
        return Participant(path, data, None, f"not valid JSON: {where}" if data.strip() else "the file is empty")
    if not isinstance(raw, dict) or not isinstance(raw.get("cells"), list) or "nbformat" not in raw:
        return Participant(path, data, None, 'JSON, but not a notebook (no "cells" and "nbformat")')
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nb = nbformat.reads(text, as_version=4)
            probe = copy.deepcopy(nb)
            _fix_ids(probe)  # ids missing in a pre-4.5 notebook are not a reason to refuse it
            nbformat.validate(probe)
    except Exception as exc:
        first = str(getattr(exc, "message", None) or exc).strip().splitlines()
        return Participant(path, data, None, f"not a valid notebook: {first[0] if first else type(exc).__name__}")
    return Participant(path, data, nb, None)


def _is_under(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _lesson_of(part: Participant, requested: str | None, root: Path) -> str:
    """The lesson to reset ``part`` as; refuses lesson and solution notebooks."""
    from course_lib.course.grading.runner import resolve_lesson

    for folder in ("lessons", "solutions"):
        if _is_under(part.path, root / folder):
            raise ResetError(
                f"{part.path} is in the course's {folder}/ folder: course reset restores exercise notebooks "
                "only (exercises/NN_*.ipynb), never a lesson or a solution"
            )
    if part.nb is not None:
        course = part.nb.metadata.get("course")
        kind = course.get("kind") if isinstance(course, dict) else None
        if kind is not None and kind != "exercise":
            raise ResetError(
                f"{part.path} is a {kind} notebook (its metadata says course.kind = {kind!r}), not an exercise "
                "notebook: course reset restores exercise notebooks only (exercises/NN_*.ipynb)"
            )
    lesson_id, problem = resolve_lesson(part.path, part.nb, requested)
    if lesson_id is None and part.nb is None and requested is None:
        # no metadata to read: say why (the file is broken), not "no course.lesson in its metadata"
        command = f"course reset {shlex.quote(str(part.path))} --lesson NN"
        raise ResetError(
            f"{part.path} is not a readable notebook ({part.problem}), so its metadata cannot say which lesson it "
            f"belongs to, and its name has no lesson number. Pass the lesson: `{command}` (e.g. --lesson 01) "
            "replaces the whole file by that lesson's stub and keeps the current bytes in a backup"
        )
    if problem is not None or lesson_id is None:
        raise ResetError(problem or f"cannot tell the lesson of {part.path}; pass --lesson")
    return lesson_id


# ---------------------------------------------------------------------------------------
# Matching one exercise's stub cells to the participant's cells
# ---------------------------------------------------------------------------------------

Role = Literal["heading", "markdown", "exercise", "check", "demo"]


def _role(cell: NotebookNode, index: int, ex: StubExercise) -> Role:
    if index == ex.heading:
        return "heading"
    if cell.cell_type != "code":
        return "markdown"
    tags = _tags(cell)
    if EXERCISE_TAG in tags:
        return "exercise"
    if CHECK_TAG in tags:
        return "check"
    return "demo"


@dataclass
class Match:
    """Where one stub cell of an exercise is in the participant's notebook."""

    stub_index: int
    role: Role
    found: int | None = None  # index in the participant's notebook
    how: str = ""


def _first_line(source: str, limit: int = 60) -> str:
    for line in source.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return "(empty)"


#: how the report calls each role (the ``exercise`` cell is the one the participant answers in)
SHOWN_ROLE: dict[str, str] = {
    "heading": "heading",
    "markdown": "text",
    "exercise": "answer",
    "check": "check",
    "demo": "demo",
}


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _cell_name(nb: NotebookNode, index: int, label: str = "the cell") -> str:
    """A cell as a participant finds it: ``label`` (e.g. "exercise 2's answer cell"), its first line,
    and its position counted with the markdown cells (Jupyter shows no cell numbers)."""
    first = _first_line(_text(nb.cells[index]))
    return f"{label} `{first}` (the {_ordinal(index + 1)} cell, counting markdown cells)"


def _exercise_of(nb: NotebookNode, index: int) -> int | None:
    """K of the last ``## Exercise K`` heading at or above cell ``index`` (None above the first)."""
    for i in range(index, -1, -1):
        number = _heading_number(nb.cells[i])
        if number is not None:
            return number
    return None


def _label(nb: NotebookNode, index: int) -> str:
    """What a cell is, from the headings above it and its tags: "exercise 2's answer cell" (or check
    cell), "a cell under exercise 2", or "the cell" above the first exercise."""
    number = _exercise_of(nb, index)
    if number is None:
        return "the cell"
    tags = _tags(nb.cells[index])
    if EXERCISE_TAG in tags or CHECK_TAG in tags:
        return f"exercise {number}'s {'answer' if EXERCISE_TAG in tags else 'check'} cell"
    return f"a cell under exercise {number}"


class _Matcher:
    """Finds the stub cells of the selected exercises among the participant's cells."""

    def __init__(self, nb: NotebookNode, stub: NotebookNode, chosen: list[StubExercise]) -> None:
        self.nb = nb
        self.stub = stub
        self.taken: set[int] = set()
        self.stub_ids = {str(c.get("id")) for c in stub.cells}
        self.heading_at: dict[int, int] = {}
        for i, cell in enumerate(nb.cells):
            number = _heading_number(cell)
            if number is not None:
                self.heading_at.setdefault(number, i)
        self.chosen = chosen

    def section(self, number: int) -> range:
        """The participant's cells under ``## Exercise number`` (empty when it has no such heading)."""
        start = self.heading_at.get(number)
        if start is None:
            return range(0)
        later = [i for i in self.heading_at.values() if i > start]
        return range(start, min(later, default=len(self.nb.cells)))

    def _free_code(self) -> list[int]:
        return [i for i, c in enumerate(self.nb.cells) if c.cell_type == "code" and i not in self.taken]

    def _by_names(
        self, s: NotebookNode, names: list[str], read: Callable[[str], list[str]], section: range
    ) -> int | None:
        """The best free code cell that defines (or checks, as ``read`` tells) one of ``names``."""
        candidates = []
        for i in self._free_code():
            cell = self.nb.cells[i]
            if set(read(_text(cell))) & set(names) and not self._belongs_elsewhere(i, names):
                rank = (set(_tags(s)) <= set(_tags(cell)), cell.get("id") == s.get("id"), i in section)
                candidates.append((rank, -i, i))
        return max(candidates)[2] if candidates else None

    def _belongs_elsewhere(self, index: int, names: list[str]) -> bool:
        """Whether cell ``index`` sits under another chosen exercise's heading and holds that one's answer."""
        cell = self.nb.cells[index]
        have = set(defined_names(_text(cell))) | set(checked_names(_text(cell)))
        for other in self.chosen:
            if not set(other.names) & set(names) and index in self.section(other.number) and have & set(other.names):
                return True
        return False

    def _by_id(self, s: NotebookNode) -> int | None:
        """The cell with ``s``'s generated id and tags; for a code cell, also one turned into
        markdown or raw by accident (Jupyter keeps the id and the tags)."""
        for i, cell in enumerate(self.nb.cells):
            if i in self.taken or cell.get("id") != s.get("id") or set(_tags(cell)) != set(_tags(s)):
                continue
            if cell.get("cell_type") == s.cell_type or (s.cell_type == "code" and _heading_number(cell) is None):
                return i
        return None

    def match(self, ex: StubExercise) -> list[Match]:
        section = self.section(ex.number)
        matches = [Match(i, _role(self.stub.cells[i], i, ex)) for i in ex.cells]

        def claim(m: Match, found: int | None, how: str) -> None:
            if found is not None and m.found is None:
                m.found, m.how = found, how
                if m.role not in ("heading", "markdown"):
                    self.taken.add(found)

        for m in matches:  # the heading, and markdown the participant kept: anchors only
            s = self.stub.cells[m.stub_index]
            if m.role == "heading":
                claim(m, self.heading_at.get(ex.number), "its heading")
            elif m.role == "markdown":
                same = [i for i, c in enumerate(self.nb.cells) if c.cell_type == "markdown" and _text(c) == _text(s)]
                claim(m, same[0] if same else self._by_id(s), "same text")
        for m in matches:  # the answer cells, by the names they define
            s = self.stub.cells[m.stub_index]
            if m.role == "exercise":
                claim(m, self._by_names(s, defined_names(_text(s)), defined_names, section), "defines it")
            elif m.role == "check":
                claim(m, self._by_names(s, checked_names(_text(s)), checked_names, section), "checks it")
        for m in matches:  # then by the generated cell id
            if m.found is None and m.role in ("exercise", "check", "demo"):
                claim(m, self._by_id(self.stub.cells[m.stub_index]), "same cell id")
        for m in matches:  # demo cells: unchanged text anywhere, else the same tags in the section
            s = self.stub.cells[m.stub_index]
            if m.found is None and m.role == "demo":
                same = [i for i in self._free_code() if _text(self.nb.cells[i]).strip() == _text(s).strip()]
                claim(m, min(same, key=lambda i: (i not in section, i)) if same else None, "same text")
        for m in matches:
            s = self.stub.cells[m.stub_index]
            if m.found is None and m.role == "demo" and _tags(s):
                near = [
                    i
                    for i in self._free_code()
                    if i in section
                    and set(_tags(self.nb.cells[i])) == set(_tags(s))
                    and str(self.nb.cells[i].get("id")) not in self.stub_ids
                ]
                claim(m, near[0] if near else None, "same tags, in its section")
        return matches


# ---------------------------------------------------------------------------------------
# Planning and applying a per-exercise reset
# ---------------------------------------------------------------------------------------


def _new_id(used: set[str]) -> str:
    while True:
        candidate = f"reset-{secrets.token_hex(4)}"
        if candidate not in used:
            used.add(candidate)
            return candidate


def _stub_copy(cell: NotebookNode) -> NotebookNode:
    out = copy.deepcopy(cell)
    if out.cell_type == "code":
        out.outputs = []
        out.execution_count = None
    return out


def _restored(cell: NotebookNode, stub_cell: NotebookNode) -> NotebookNode:
    """``stub_cell``'s type, text and tags, no outputs; ``cell``'s id and other metadata."""
    out = _stub_copy(stub_cell)
    out["id"] = cell.get("id", stub_cell.get("id"))
    metadata = copy.deepcopy(dict(cell.get("metadata", {})))
    metadata.pop("tags", None)
    tags = _tags(stub_cell)
    out.metadata = {**metadata, "tags": list(tags)} if tags else metadata
    return out


def _diff(old: str, new: str) -> list[str]:
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), "yours", "stub", lineterm="", n=1))
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... ({len(lines) - DIFF_LINES} more diff lines)"]
    return ["      " + line for line in lines]


def _fix_ids(nb: NotebookNode) -> int:
    """Give every cell a valid, unique id (nbformat 4.5); returns how many were changed."""
    nb.nbformat = 4
    nb.nbformat_minor = max(int(nb.get("nbformat_minor", 0) or 0), 5)
    used: set[str] = set()
    fixed = 0
    for cell in nb.cells:
        cid = cell.get("id")
        if not isinstance(cid, str) or not CELL_ID.match(cid) or cid in used:
            cell["id"] = _new_id(used)
            fixed += 1
        else:
            used.add(cid)
    return fixed


def reset_exercises(
    nb: NotebookNode, stub: NotebookNode, chosen: list[StubExercise], all_exercises: list[StubExercise], verbose: bool
) -> tuple[NotebookNode, list[str], bool]:
    """A copy of ``nb`` with the ``chosen`` exercises' code cells restored to ``stub``'s.

    Returns:
        ``(new_notebook, report_lines, changed)``.

    Raises:
        ResetError: when an exercise cannot be found, or a cell to restore also holds an
            exercise that is not being reset.
    """
    nb = copy.deepcopy(nb)
    matcher = _Matcher(nb, stub, chosen)
    chosen_names = {n for ex in chosen for n in ex.names}
    owner = {n: ex for ex in all_exercises for n in ex.names if n not in chosen_names}
    lines: list[str] = []
    restores: list[tuple[int, int]] = []  # (participant index, stub index)
    after: dict[int, list[NotebookNode]] = {}
    before: dict[int, list[NotebookNode]] = {}
    used_ids = {str(c.get("id")) for c in nb.cells if c.get("id")}
    changed = False
    for ex in chosen:
        matches = matcher.match(ex)
        code = [m for m in matches if m.role in ("exercise", "check", "demo")]
        if not any(m.found is not None for m in matches if m.role != "markdown"):
            raise ResetError(
                f"cannot find {ex.label} in {nb_name(nb)}: no '## Exercise {ex.number}' heading and no cell "
                f"that defines or checks {' or '.join(ex.names) or 'it'}; nothing was changed. "
                "`course reset NOTEBOOK` without --exercise resets the whole notebook (your version is backed up)"
            )
        title = re.sub(r"\s*\([^()]*\)\s*$", "", ex.title.split(" · ", 1)[-1])
        lines.append(f"exercise {ex.number} · {title}:")
        for m in code:
            if m.found is None:
                continue
            cell = nb.cells[m.found]
            clash = [n for n in defined_names(_text(cell)) + checked_names(_text(cell)) if n in owner]
            if clash:
                other = owner[clash[0]]
                raise ResetError(
                    f"{_cell_name(nb, m.found)} holds {ex.label}'s {SHOWN_ROLE[m.role]} cell and also "
                    f"{', '.join(clash)} of exercise {other.number}; restoring it would lose that answer. "
                    f"Split the cell, or reset both: --exercise {ex.number} --exercise {other.number}. "
                    "Nothing was changed"
                )
        for m in code:
            s = stub.cells[m.stub_index]
            shown = f"{SHOWN_ROLE[m.role]} cell"
            if m.found is not None:
                name = _cell_name(nb, m.found, shown)
                cell = nb.cells[m.found]
                same = (
                    cell.get("cell_type") == s.cell_type
                    and _text(cell).strip() == _text(s).strip()
                    and set(_tags(cell)) == set(_tags(s))
                )
                outputs = bool(cell.get("outputs")) or cell.get("execution_count") is not None
                where = "" if m.found in matcher.section(ex.number) else f", found away from its heading ({m.how})"
                if same and not outputs:
                    lines.append(f"  {name}: already the stub")
                elif same:
                    lines.append(f"  {name}: already the stub; outputs cleared{where}")
                    changed = True
                else:
                    kind = "" if cell.get("cell_type") == s.cell_type else f" (it was a {cell.get('cell_type')} cell)"
                    lines.append(f"  {name}: restored to the stub{kind}{where}")
                    if verbose:
                        lines += _diff(_text(cell), _text(s))
                    changed = True
                restores.append((m.found, m.stub_index))
                continue
            new = _stub_copy(s)
            new["id"] = str(s.get("id")) if str(s.get("id")) not in used_ids else _new_id(used_ids)
            used_ids.add(new["id"])
            prev = [p for p in matches[: matches.index(m)] if p.found is not None]
            nxt = [p for p in matches[matches.index(m) + 1 :] if p.found is not None]
            neighbour = prev[-1] if prev else nxt[0]
            anchor = neighbour.found
            assert anchor is not None
            (after if prev else before).setdefault(anchor, []).append(new)
            place = (
                f"{'after' if prev else 'before'} {_cell_name(nb, anchor, f'its {SHOWN_ROLE[neighbour.role]} cell')}"
            )
            lines.append(f"  {shown} `{_first_line(_text(s))}` was missing: reinserted {place}")
            changed = True
        later = _overriding_cells(nb, ex, [m.found for m in code if m.found is not None], matcher.taken)
        lines += later
    for index, stub_index in restores:
        nb.cells[index] = _restored(nb.cells[index], stub.cells[stub_index])
    cells: list[NotebookNode] = []
    for i, cell in enumerate(nb.cells):
        cells += before.get(i, [])
        cells.append(cell)
        cells += after.get(i, [])
    nb.cells = cells
    fixed = _fix_ids(nb)
    if fixed:
        lines.append(f"gave {fixed} cell(s) a new id (missing, invalid or repeated ids are not valid nbformat 4.5)")
    return nb, lines, changed


def _overriding_cells(nb: NotebookNode, ex: StubExercise, restored: list[int], taken: set[int]) -> list[str]:
    """Notes about other cells that define the exercise's names after its restored cells."""
    if not restored:
        return []
    last = max(restored)
    notes = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or i in taken or i <= last:
            continue
        names = [n for n in defined_names(_text(cell)) if n in ex.names]
        if names:
            notes.append(
                f"  note: {_cell_name(nb, i)} also defines {', '.join(names)} and runs after the stub, so it "
                "replaces the stub when the notebook runs (and when it is graded); delete it to start over"
            )
    return notes


def nb_name(nb: NotebookNode) -> str:
    course = nb.metadata.get("course")
    lesson = course.get("lesson") if isinstance(course, dict) else None
    return f"the notebook (lesson {lesson})" if lesson else "the notebook"


# ---------------------------------------------------------------------------------------
# Writing: backup, validation, atomic replace
# ---------------------------------------------------------------------------------------


def serialize(nb: NotebookNode) -> bytes:
    """Validate ``nb`` and return the bytes ``course build`` would write for it.

    Raises:
        ResetError: if nbformat finds the notebook invalid.
    """
    import nbformat

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            nbformat.validate(nb)
        except Exception as exc:
            first = str(getattr(exc, "message", None) or exc).strip().splitlines()
            raise ResetError(
                f"the reset notebook would not be valid ({first[0] if first else type(exc).__name__}); nothing was "
                "changed. `course reset NOTEBOOK` without --exercise replaces the whole file by the stub"
            ) from None
        return (nbformat.writes(nb) + "\n").encode("utf-8")


def backup_path(path: Path, when: float | None = None) -> Path:
    """``NAME.ipynb.bak-YYYYmmdd-HHMMSS`` next to ``path`` (``-2``, ``-3``, ... if taken)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    base = path.with_name(f"{path.name}.bak-{stamp}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = base.with_name(f"{base.name}-{n}")
    return candidate


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_backup(path: Path, data: bytes) -> Path:
    """Copy ``data`` (the file's bytes) to a new backup next to ``path``; never overwrites one."""
    for _ in range(100):
        target = backup_path(path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # someone made that name since we looked: take the next
        except OSError as exc:
            raise ResetError(
                f"cannot write a backup next to {path} ({exc.strerror or exc}); nothing was changed"
            ) from None
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(path.parent)
        return target
    raise ResetError(f"cannot find a free backup name next to {path}; nothing was changed")


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically: a crash leaves the old file or the new one, never half."""
    mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


# ---------------------------------------------------------------------------------------
# The whole command
# ---------------------------------------------------------------------------------------


def _whole_summary(nb: NotebookNode | None, stub: NotebookNode) -> list[str]:
    if nb is None:
        return []
    stub_texts = {(c.cell_type, _text(c).strip()) for c in stub.cells}
    differ = [i for i, c in enumerate(nb.cells) if (c.get("cell_type"), _text(c).strip()) not in stub_texts]
    run = sum(1 for c in nb.cells if c.get("outputs") or c.get("execution_count") is not None)
    if not differ:
        return ["  every cell's text is already the stub's" + (f"; {run} cell(s) have outputs, cleared" if run else "")]
    lines = [f"  {len(differ)} cell(s) differ from the stub (answers, edits, cells of your own):"]
    lines += [f"    {_cell_name(nb, i, _label(nb, i))}" for i in differ[:12]]
    if len(differ) > 12:
        lines.append(f"    ... and {len(differ) - 12} more")
    return lines


def reset(path: Path, exercises: list[str], *, lesson: str | None = None, dry_run: bool = False) -> list[str]:
    """Reset ``path`` (whole, or the named ``exercises``); returns the lines to print.

    Raises:
        ResetError: with a one-line reason; nothing is written then.
    """
    from course_lib.course.paths import repo_root

    root = repo_root()
    if path.is_symlink():
        path = path.resolve()
    part = read_participant(path)
    if exercises and part.nb is None:
        raise ResetError(
            f"{path} is not a readable notebook ({part.problem}): one exercise cannot be reset in it. "
            f"`course reset {shlex.quote(str(path))}` (without --exercise) replaces the whole file by the stub "
            "and keeps the current bytes in a backup"
        )
    lesson_id = _lesson_of(part, lesson, root)
    stub = stub_notebook(lesson_id, root)
    all_exercises = stub_exercises(stub)
    if not all_exercises:
        raise ResetError(
            f"the stub of lesson {lesson_id} has no '## Exercise K' headings; nothing to reset by exercise"
        )
    chosen = select_exercises(all_exercises, exercises, lesson_id) if exercises else []
    if exercises and not chosen:
        raise ResetError("no exercise named; pass --exercise K with a number or a name")
    verb = "would be" if dry_run else "was"
    if chosen:
        assert part.nb is not None
        new_nb, lines, changed = reset_exercises(part.nb, stub, chosen, all_exercises, verbose=dry_run)
        head = f"{path}: lesson {lesson_id}, {'exercise' if len(chosen) == 1 else 'exercises'} " + ", ".join(
            str(ex.number) for ex in chosen
        )
        lines = [head, *lines]
    else:
        new_nb = copy.deepcopy(stub)
        changed = True
        if part.nb is None:
            head = (
                f"{path} is not a readable notebook ({part.problem}); the whole file {verb} replaced by the stub "
                f"of lesson {lesson_id}"
            )
        else:
            head = f"{path}: the whole notebook {verb} replaced by the stub of lesson {lesson_id}"
        lines = [head, *_whole_summary(part.nb, stub)]
    data = serialize(new_nb)
    if data == part.data or not changed:
        return [*lines, "nothing to change: the file was left as it is"]
    if dry_run:
        return [*lines, "dry run: nothing was written"]
    backup = write_backup(path, part.data)
    write_atomic(path, data)
    return [
        *lines,
        f"backup of the previous file: {backup}",
        f"to undo: cp {shlex.quote(str(backup))} {shlex.quote(str(path))}",
        "if the notebook is open in Jupyter: reload it from disk (File > Reload Notebook from Disk) before you "
        "save again, or Jupyter writes the old version back; then restart its kernel (Kernel > Restart Kernel), "
        "which still holds your old definitions (a check cell run now would test them, not the stub)",
    ]
