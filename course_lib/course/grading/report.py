"""Grade reports: the data model and its terminal, JSON, JUnit XML and Markdown forms.

One :class:`NotebookReport` per graded notebook holds an :class:`ExerciseResult` per
exercise of its lesson (every exercise is listed, even when the notebook could not be
run: it then scores 0 with the reason as its message), notes about the run (cells
that raised, time limits hit) and, when nothing could be graded, ``error``.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Pass mark used when none is given: the fraction of the points needed to pass.
DEFAULT_PASS_MARK = 0.7


@dataclass
class ExerciseResult:
    """How one exercise scored.

    Attributes:
        name: the exercise (the learner's function name).
        points: points available.
        score: points awarded (all or nothing: ``points`` iff every check passed).
        passed: every check passed.
        message: the first failure in one line (empty when passed).
        hint: the exercise's first hint.
        checks: each check's ``{"description", "status", "message"}``, in order.
    """

    name: str
    points: float
    score: float = 0.0
    passed: bool = False
    message: str = ""
    hint: str = ""
    checks: list[dict[str, str]] = field(default_factory=list)

    @property
    def checks_passed(self) -> int:
        return sum(c.get("status") == "pass" for c in self.checks)


@dataclass
class NotebookReport:
    """The grade of one notebook.

    Attributes:
        path: the notebook as given on the command line.
        lesson: the lesson it was graded as (None if that could not be told).
        pass_mark: fraction of the points needed to pass.
        exercises: one result per exercise of the lesson.
        notes: things the learner should know about the run (one line each).
        error: why nothing could be graded, if so.
        seconds: wall time spent grading it.
    """

    path: str
    lesson: str | None
    pass_mark: float = DEFAULT_PASS_MARK
    exercises: list[ExerciseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return float(sum(e.score for e in self.exercises))

    @property
    def max_score(self) -> float:
        return float(sum(e.points for e in self.exercises))

    @property
    def fraction(self) -> float:
        return self.score / self.max_score if self.max_score > 0 else 0.0

    @property
    def passed(self) -> bool:
        """At least ``pass_mark`` of the points, and something to grade at all."""
        return self.error is None and self.max_score > 0 and self.fraction >= self.pass_mark - 1e-9

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``--json`` format of one notebook)."""
        return {
            "path": self.path,
            "lesson": self.lesson,
            "score": self.score,
            "max_score": self.max_score,
            "fraction": round(self.fraction, 6),
            "pass_mark": self.pass_mark,
            "passed": self.passed,
            "error": self.error,
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
            "exercises": [{**asdict(e), "checks_passed": e.checks_passed} for e in self.exercises],
        }


# ---------------------------------------------------------------------------------------
# Terminal table
# ---------------------------------------------------------------------------------------


def format_points(x: float) -> str:
    return f"{x:g}"


def cut_text(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render_table(report: NotebookReport, *, message_width: int = 70, hint_width: int = 50) -> str:
    """The terminal form: a header, notes, one row per exercise, details, the total."""
    lines = [f"{report.path}  (lesson {report.lesson or '?'})"]
    if report.error:
        lines.append(f"  error: {report.error}")
    lines += [f"  note: {n}" for n in report.notes]
    if report.exercises:
        header = ("exercise", "points", "result", "message", "hint")
        rows = [
            (
                e.name,
                f"{format_points(e.score)}/{format_points(e.points)}",
                "PASS" if e.passed else "FAIL",
                cut_text(e.message, message_width),
                "" if e.passed else cut_text(e.hint, hint_width),
            )
            for e in report.exercises
        ]
        widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
        fmt_row = lambda r: "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
        lines.append(fmt_row(header))
        lines.append(fmt_row(tuple("-" * w for w in widths)))
        lines += [fmt_row(r) for r in rows]
        long = [
            e for e in report.exercises if not e.passed and (len(e.message) > message_width or len(e.hint) > hint_width)
        ]
        for e in long:
            lines.append(f"  {e.name}: {e.message}")
            if e.hint:
                lines.append(f"    hint: {e.hint}")
    verdict = "PASS" if report.passed else "FAIL"
    lines.append(
        f"  total: {format_points(report.score)}/{format_points(report.max_score)} points "
        f"({report.fraction:.0%}), pass mark {report.pass_mark:.0%}: {verdict}"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------


def to_json(reports: Sequence[NotebookReport]) -> str:
    """The ``--json`` document: overall verdict and one entry per notebook."""
    doc = {
        "passed": bool(reports) and all(r.passed for r in reports),
        "notebooks": [r.to_dict() for r in reports],
    }
    return json.dumps(doc, indent=2) + "\n"


_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """``text`` without the characters XML 1.0 cannot hold (escape codes, NULs)."""
    return _XML_BAD.sub("?", text)


def to_junit(reports: Sequence[NotebookReport]) -> str:
    """The ``--junit`` document: a testsuite per notebook, a testcase per exercise.

    A notebook with nothing to grade (unreadable, wrong lesson with no exercises, a
    lesson without exercises) gets one failing testcase ``notebook`` so CI never reads
    it as green.
    """
    root = ET.Element("testsuites", name="course grade")
    total_tests = total_failures = 0
    for report in reports:
        suite = ET.SubElement(root, "testsuite", name=_xml_text(f"{report.lesson or 'unknown'}: {report.path}"))
        cases: list[tuple[str, str | None, str]] = []  # (name, failure message, details)
        for e in report.exercises:
            details = "\n".join(
                f"[{c.get('status')}] {c.get('description')}: {c.get('message')}".rstrip(": ") for c in e.checks
            )
            if e.hint and not e.passed:
                details += f"\nhint: {e.hint}"
            cases.append((e.name, None if e.passed else (e.message or "failed"), details))
        if not report.exercises:
            cases.append(("notebook", report.error or "nothing to grade", "\n".join(report.notes)))
        failures = sum(msg is not None for _, msg, _ in cases)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(failures))
        suite.set("errors", "0")
        suite.set("skipped", "0")
        suite.set("time", f"{report.seconds:.3f}")
        for name, failure, details in cases:
            case = ET.SubElement(
                suite, "testcase", name=_xml_text(name), classname=_xml_text(f"grade.{report.lesson or 'unknown'}")
            )
            case.set("time", "0")
            if failure is not None:
                node = ET.SubElement(case, "failure", message=_xml_text(failure), type="GradeFailure")
                node.text = _xml_text(details)
        if report.notes:
            ET.SubElement(suite, "system-out").text = _xml_text("\n".join(report.notes))
        total_tests += len(cases)
        total_failures += failures
    root.set("tests", str(total_tests))
    root.set("failures", str(total_failures))
    root.set("errors", "0")
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _md(text: str) -> str:
    return _XML_BAD.sub("?", " ".join(text.split())).replace("|", "\\|")


def to_markdown(reports: Sequence[NotebookReport]) -> str:
    """The ``--markdown`` document (for ``$GITHUB_STEP_SUMMARY``)."""
    out: list[str] = []
    for report in reports:
        verdict = "PASS" if report.passed else "FAIL"
        out.append(f"### Grade: `{report.path}` (lesson {report.lesson or '?'})")
        out.append("")
        out.append(
            f"**{format_points(report.score)}/{format_points(report.max_score)} points ({report.fraction:.0%}): {verdict}** "
            f"(pass mark {report.pass_mark:.0%})"
        )
        out.append("")
        if report.error:
            out.append(f"> {_md(report.error)}")
            out.append("")
        for note in report.notes:
            out.append(f"- {_md(note)}")
        if report.notes:
            out.append("")
        if report.exercises:
            out.append("| exercise | points | result | message | hint |")
            out.append("|---|---|---|---|---|")
            for e in report.exercises:
                result = "pass" if e.passed else "fail"
                hint = "" if e.passed else _md(e.hint)
                out.append(
                    f"| `{e.name}` | {format_points(e.score)}/{format_points(e.points)} | {result} | {_md(e.message)} | {hint} |"
                )
            out.append("")
    return "\n".join(out) + "\n"


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path``, creating parent folders."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
