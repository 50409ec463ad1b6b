"""The lessons' numbered equations have one source: every copy must agree with it.

A lesson states each equation once, in a display block of its markdown tagged
``\\qquad (NN.M)``. Some are copied on purpose, for a reader who has only that file open:
into the exercise notebook's source (LaTeX, tagged the same way) and into library and
grader docstrings (plain text in a ``::`` literal block, the bare tag ``(NN.M)`` at the
end of the equation's first line, continuation lines under it; a mention that is not a
copy is written ``eq. NN.M``). These tests find every tagged copy, bring it
and the lesson's equation to one plain notation (:func:`canonical`) and require the two
to agree, so a copy that drifts (an index, a bound, a threshold) fails here.

The canonical form keeps the symbols, operators and indices in order and drops what
only typesets (spacing, bracket sizes, the brackets themselves, ``*``); so it does not
see a moved bracket, but it sees every changed symbol, bound or clause.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Lessons whose numbered equations are checked, and where their copies may live.
LESSONS = (
    "00_welcome",
    "01_policy_gradients",
    "02_importance_sampling",
    "03_impala_vtrace",
    "06_off_policy_scale",
    "10_fault_tolerance",
    "11_capstone",
)
DOCSTRING_FILES = (
    "course_lib/rl/pg.py",
    "course_lib/rl/bandits.py",
    "course_lib/rl/verifiable.py",
    "course_lib/rl/reinforce.py",
    "course_lib/rl/importance.py",
    "course_lib/rl/staleness.py",
    "course_lib/rl/vtrace.py",
    "course_lib/course/grading/lessons/l00_welcome.py",
    "course_lib/course/grading/lessons/l01_policy_gradients.py",
    "course_lib/course/grading/lessons/l02_importance_sampling.py",
    "course_lib/course/grading/lessons/l03_impala_vtrace.py",
    "course_lib/envs/driving.py",
    "course_lib/offpolicy/replay.py",
    "course_lib/offpolicy/sac.py",
    "course_lib/course/grading/lessons/l06_off_policy_scale.py",
    "course_lib/checkpoint/interval.py",
    "course_lib/course/grading/lessons/l10_fault_tolerance.py",
)

_TAG = re.compile(r"\\qquad\s*\((\d\d\.\d+)\)\s*$", re.S)
_DOC_TAG = re.compile(r"^(\s*)(\S.*?)\s{2,}\((\d\d\.\d+)\)\s*$")

#: LaTeX spellings of the library's names, longest first.
_NOTATION = (
    (r"\begin{gathered}", ""),
    (r"\end{gathered}", ""),
    (r"\\", ","),
    (r"\bar\theta", "theta_bar"),
    (r"\mathrm{clip}", "clip"),
    (r"\bar{\mathcal H}", "H_bar"),
    (r"\mathcal ", ""),
    (r"\tilde a", "a~"),
    (r"\leftarrow", "<-"),
    (r"\bar\rho_{pg}", "pg_rho_bar"),
    (r"\bar\rho", "rho_bar"),
    (r"\bar c", "c_bar"),
    (r"\ge", ">="),
    (r"\le", "<="),
    (r"\mid", "|"),
)
_WORDS = (
    "rho",
    "gamma",
    "delta",
    "lambda",
    "pi",
    "mu",
    "min",
    "max",
    "sum",
    "prod",
    "exp",
    "log",
    "tau",
    "sqrt",
    "alpha",
    "beta",
    "psi",
    "theta",
    "arctan",
    "tan",
    "cos",
    "sin",
)
_SPACING = re.compile(r"\\[Bb]igg?[lr]?|\\[,;!]|\\quad")


def _markdown(path: Path) -> str:
    """The markdown text of a jupytext percent source (its ``# ``-commented lines)."""
    return "\n".join(line[2:] if line.startswith("# ") else "" for line in path.read_text().splitlines())


def lesson_equations(path: Path) -> dict[str, str]:
    """``{label: LaTeX}`` of every display block ``$$ ... \\qquad (NN.M)$$`` in ``path``."""
    out = {}
    for block in re.findall(r"\$\$(.+?)\$\$", _markdown(path), re.S):
        tag = _TAG.search(block)
        if tag:
            out[tag.group(1)] = block[: tag.start()]
    return out


def docstring_equations(path: Path) -> dict[str, str]:
    """``{label: text}`` of the plain-text equations tagged ``(NN.M)`` in ``path``'s docstrings.

    An equation is its tagged line and the lines under it at the same indentation (one
    clause each), up to a blank line or the next tagged line.
    """
    out = {}
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = (ast.get_docstring(node) or "").splitlines()
        literal = _literal_lines(lines)
        for i, line in enumerate(lines):
            tag = _DOC_TAG.match(line)
            if not tag or i not in literal:
                continue
            indent, clauses = tag.group(1), [tag.group(2)]
            for nxt in lines[i + 1 :]:
                if not nxt.strip() or _DOC_TAG.match(nxt) or not nxt.startswith(indent) or nxt[len(indent)] == " ":
                    break
                clauses.append(nxt.strip())
            out[tag.group(3)] = ", ".join(clauses)
    return out


def _literal_lines(lines: list[str]) -> set[int]:
    """Indices of the lines inside ``::`` literal blocks (indented under the line ending in ``::``)."""
    inside, opener_indent = set(), None
    for i, line in enumerate(lines):
        indent = len(line) - len(line.lstrip())
        if opener_indent is not None and line.strip() and indent <= opener_indent:
            opener_indent = None
        if opener_indent is not None and line.strip():
            inside.add(i)
        if line.rstrip().endswith("::"):
            opener_indent = indent
    return inside


def _replace_fracs(tex: str) -> str:
    r"""``\frac{a}{b}`` -> ``a/b`` (nested braces allowed)."""
    while (start := tex.find(r"\frac{")) >= 0:
        parts, i = [], start + len(r"\frac")
        for _ in range(2):
            depth, j = 0, i
            while True:
                depth += {"{": 1, "}": -1}.get(tex[j], 0)
                if depth == 0:
                    break
                j += 1
            parts.append(tex[i + 1 : j])
            i = j + 1
        tex = tex[:start] + f"{parts[0]}/{parts[1]}" + tex[i:]
    return tex


def latex_to_plain(tex: str) -> str:
    """A LaTeX equation in the docstrings' notation (``\\qquad`` separates clauses, as ``,``)."""
    text = _replace_fracs(tex)
    for latex, plain in _NOTATION:
        text = text.replace(latex, plain)
    text = re.sub(r"\\qquad", ",", text)
    text = _SPACING.sub(" ", text)
    text = re.sub(r"\\(" + "|".join(_WORDS) + r")(?![a-zA-Z])", r"\1", text)
    left = re.findall(r"\\[a-zA-Z]+", text)
    if left:
        raise ValueError(f"no plain spelling for {sorted(set(left))} in {tex!r}: add it to _NOTATION or _WORDS")
    return text


def canonical(plain: str) -> tuple[str, ...]:
    """The clauses of a plain-text equation (split at top-level commas), each with brackets,
    ``*`` and whitespace removed; empty clauses and trailing punctuation dropped."""
    clauses: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in plain:
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            clauses.append("".join(current))
            current = []
        else:
            current.append(ch)
    clauses.append("".join(current))
    squeezed = (re.sub(r"[\s*(){}\[\]]", "", c).rstrip(".,") for c in clauses)
    return tuple(c for c in squeezed if c)


def copies() -> list[tuple[str, str, str]]:
    """``(label, where, plain text)`` of every tagged copy outside the lessons."""
    found = []
    for lesson in LESSONS:
        exercise = ROOT / "exercises" / "src" / f"{lesson}.py"
        if exercise.exists():
            for label, tex in lesson_equations(exercise).items():
                found.append((label, f"exercises/src/{lesson}.py", latex_to_plain(tex)))
    for rel in DOCSTRING_FILES:
        for label, text in docstring_equations(ROOT / rel).items():
            found.append((label, rel, text))
    return found


def _lesson_of(label: str) -> str:
    return next(lesson for lesson in LESSONS if lesson.startswith(label[:2]))


@pytest.mark.parametrize(
    ("label", "where", "text"), [pytest.param(*c, id=f"{c[0]}-{Path(c[1]).stem}") for c in copies()]
)
def test_copy_agrees_with_the_lesson(label, where, text):
    lesson = _lesson_of(label)
    source = lesson_equations(ROOT / "lessons" / f"{lesson}.py")
    assert label in source, f"{where} copies ({label}), which lessons/{lesson}.py does not state"
    expected = canonical(latex_to_plain(source[label]))
    assert canonical(text) == expected, (
        f"({label}) in {where} no longer agrees with lessons/{lesson}.py:\n"
        f"  copy:   {canonical(text)}\n  lesson: {expected}\n"
        "edit the copy to match the lesson (the lesson is the source)"
    )


def test_the_vtrace_equations_are_found_in_every_copy():
    """(03.1)-(03.4) stand in the lesson, the exercise and the library (so the test above sees them)."""
    where = {(label, w) for label, w, _ in copies()}
    for label in ("03.1", "03.2", "03.3", "03.4"):
        assert (label, "exercises/src/03_impala_vtrace.py") in where
        assert (label, "course_lib/rl/vtrace.py") in where
    for label in ("00.1", "00.2", "00.3"):
        assert (label, "course_lib/rl/pg.py") in where


def test_a_drifted_copy_is_caught():
    """The comparison sees an off-by-one index, a swapped threshold and a dropped clause."""
    lesson = lesson_equations(ROOT / "lessons" / "03_impala_vtrace.py")
    library = docstring_equations(ROOT / "course_lib" / "rl" / "vtrace.py")
    right = canonical(latex_to_plain(lesson["03.2"]))
    assert canonical(library["03.2"]) == right
    assert canonical(library["03.2"].replace("prod_{i=s}^{t-1}", "prod_{i=s}^{t}")) != right
    rho = canonical(latex_to_plain(lesson["03.1"]))
    assert canonical(library["03.1"].replace("min(c_bar", "min(rho_bar")) != rho
    assert canonical(library["03.1"].replace(",   rho_bar >= c_bar", "")) != rho


def test_latex_to_plain_spells_the_library_names():
    tex = r"A_s = \min\Big(\bar\rho_{pg}, \frac{\pi(a_s\mid x_s)}{\mu(a_s\mid x_s)}\Big)\,\big(r_s\big)"
    assert canonical(latex_to_plain(tex)) == ("A_s=minpg_rho_bar,pia_s|x_s/mua_s|x_sr_s",)
    with pytest.raises(ValueError, match="no plain spelling"):
        latex_to_plain(r"\mathbb E")
