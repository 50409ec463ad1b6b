"""``course pace``: workshop schedules from the measured notebook times and the exercises' estimates.

Three kinds of figure go into a schedule, and they are kept apart because they are not
equally solid:

- **run time**, MEASURED: seconds each lesson notebook takes, from BENCHMARKS.md's
  notebook table (between ``<!-- bench:notebooks -->`` and ``<!-- /bench:notebooks -->``),
  on the reference machine and date named above that table;
- **reading time**, ESTIMATED: the words of the lesson's markdown cells at
  :data:`READING_WPM` words per minute (technical text with equations);
- **exercise time**, STATED: the ``time`` column of each exercise source's header table
  (``exercises/src/NN_*.py``), summed over the exercises a format does in the room.

Two more kinds of block are ASSUMED, fixed minutes that no measurement gives: the room's
setup at the start of day 1 (:data:`SETUP_MIN`: ``course doctor``, ``make lab``, open
lesson 00, as INSTRUCTORS.md's "the morning" asks) and a discussion after each lesson
taught (:data:`DISCUSSION_MIN`: the 2-3 questions INSTRUCTORS.md section 3 gives per
lesson). A lesson and its discussion are kept in one session (never split by a break).

The parsed figures ship as ``pacing_reference.json`` beside this module, so ``course pace``
also works from an installed package without the checkout; ``course pace
--write-reference`` regenerates it from the checkout, and tests/test_pacing.py fails when it
differs from BENCHMARKS.md and exercises/src (one source of truth, no drift).

Live or stored: a notebook that runs under :data:`LIVE_LIMIT_S` on the room's machine
(the reference time times ``--machine-factor``) has no cell over that limit, so it is run
live; a longer one may have such cells (BENCHMARKS.md records whole notebooks, not cells),
so its outputs are read from the committed notebook and it can be re-run after the
session. ``course doctor --time`` measures the factor of a room laptop on lesson 00.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: assumed reading speed for technical text with equations (words per minute): an estimate
READING_WPM = 150
#: reading alone, to understand (equations, outputs, plots): the course's fresh reviewers reported
#: 60-120 words a minute on these lessons; self-study figures (README, lesson 00) use this rate
SELF_STUDY_WPM = 80
#: a notebook (or cell) that runs longer than this on the room's machine is read from its stored outputs
LIVE_LIMIT_S = 60.0
#: the room's setup at the start of day 1, in minutes (an assumption, not a measurement)
SETUP_MIN = 15
SETUP_WHAT = "setup: course doctor, make lab, open lesson 00"
#: minutes of discussion after each lesson taught (an assumption: 2-3 questions, INSTRUCTORS.md section 3)
DISCUSSION_MIN = 5
#: where the parsed figures ship (package data)
REFERENCE_PATH = Path(__file__).with_name("pacing_reference.json")

BENCH_START = "<!-- bench:notebooks -->"
BENCH_END = "<!-- /bench:notebooks -->"
_TITLE = re.compile(r"^### .*\bat the cpu scale$")
_MEASURED = re.compile(r"Measured (\d{4}-\d{2}-\d{2})\b(.*?) on: (.+?)(?:;|\.$)")
_TABLE_HEADER = re.compile(r"^\| notebook \| seconds \| within (\d+) s \|$")
_TABLE_SEP = "|---|---|---|"
_TABLE_ROW = re.compile(
    r"^\| `((?:lessons|exercises|solutions)/\d\d_[a-z0-9_]+\.ipynb)` \| (\d+(?:\.\d+)?) \| (yes|no|\*\*no\*\*) \|$"
)
_TABLE_ROW_SHAPE = "| `lessons/NN_slug.ipynb` | 12.4 | yes |"

EXERCISE_HEADER = "# | exercise | points | difficulty | time |"
EXERCISE_SEP = "# |---|---|---|---|"
_EXERCISE_ROW = re.compile(r"^# \| (\d+)\. (.+?) \| (\d+) \| ([^|]+?) \| (\d+) min \|$")
_EXERCISE_ROW_SHAPE = "# | 1. `name` | 10 | ★☆☆ | 10 min |"

_ALNUM = re.compile(r"[^\W_]")


class PacingFormatError(ValueError):
    """A source whose format changed: the message names the file and the line."""


# --------------------------------------------------------------------------- parsing


def parse_benchmarks(text: str, name: str = "BENCHMARKS.md") -> dict[str, Any]:
    """The notebook-time table of BENCHMARKS.md and the machine it was measured on.

    Returns:
        ``{"reference": {"title", "date", "machine", "method", "budget_s"}, "notebooks": {path: seconds}}``.

    Raises:
        PacingFormatError: naming ``name`` and the line, if the block, its header lines or
            a table row do not have the expected shape.
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == BENCH_START]
    if len(starts) != 1:
        raise PacingFormatError(f"{name}: expected exactly one line {BENCH_START!r}, found {len(starts)}")
    start = starts[0]
    ends = [i for i, line in enumerate(lines) if line.strip() == BENCH_END and i > start]
    if not ends:
        raise PacingFormatError(f"{name}, line {start + 1}: {BENCH_START!r} is never closed by {BENCH_END!r}")
    end = ends[0]

    def err(i: int, what: str) -> PacingFormatError:
        return PacingFormatError(f"{name}, line {i + 1}: {what}; found: {lines[i]!r}")

    i = start + 1
    while i < end and not lines[i].strip():
        i += 1
    if i == end or not _TITLE.match(lines[i].strip()):
        raise err(min(i, end), "expected the title '### Notebook execution time at the cpu scale'")
    title = lines[i].strip().removeprefix("### ")
    header_at = next((j for j in range(i + 1, end) if lines[j].startswith("|")), None)
    if header_at is None:
        raise PacingFormatError(f"{name}, lines {start + 1}-{end + 1}: no table in the notebooks block")
    measured_at = [j for j in range(i + 1, header_at) if "Measured " in lines[j]]
    if len(measured_at) != 1:
        raise PacingFormatError(
            f"{name}, lines {i + 1}-{header_at + 1}: expected one line 'Measured YYYY-MM-DD ... on: MACHINE; ...' "
            f"above the table, found {len(measured_at)}"
        )
    m = _MEASURED.search(lines[measured_at[0]])
    if m is None:
        raise err(measured_at[0], "expected 'Measured YYYY-MM-DD ... on: MACHINE;' (or '... on: MACHINE.')")
    date, how, machine = m.group(1), m.group(2), m.group(3).strip()
    method = (
        "nbval, one fresh kernel per notebook"
        if "nbval" in how
        else "`course build`'s executor (nbclient), one fresh kernel per notebook"
    )
    header = _TABLE_HEADER.match(lines[header_at].strip())
    if header is None:
        raise err(header_at, "expected the table header '| notebook | seconds | within N s |'")
    if header_at + 1 >= end or lines[header_at + 1].strip() != _TABLE_SEP:
        raise err(min(header_at + 1, end), f"expected the separator {_TABLE_SEP!r}")
    notebooks: dict[str, float] = {}
    j = header_at + 2
    while j < end and lines[j].startswith("|"):
        row = _TABLE_ROW.match(lines[j].strip())
        if row is None:
            raise err(j, f"expected a row like {_TABLE_ROW_SHAPE!r}")
        if row.group(1) in notebooks:
            raise err(j, f"{row.group(1)} appears twice")
        notebooks[row.group(1)] = float(row.group(2))
        j += 1
    if not notebooks:
        raise err(header_at, "the table has no rows")
    reference = {"title": title, "date": date, "machine": machine, "method": method, "budget_s": int(header.group(1))}
    return {"reference": reference, "notebooks": notebooks}


def parse_exercise_table(text: str, name: str) -> list[dict[str, Any]]:
    """The exercises of one exercise source, from its header table ``| exercise | points | difficulty | time |``.

    Returns:
        ``[{"name": "`discounted_returns`", "minutes": 10}, ...]`` in the table's order.

    Raises:
        PacingFormatError: naming ``name`` and the line, if the table is missing, repeated,
            numbered out of order or a row does not have the expected shape.
    """
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if line.rstrip() == EXERCISE_HEADER]
    if len(headers) != 1:
        raise PacingFormatError(f"{name}: expected exactly one header line {EXERCISE_HEADER!r}, found {len(headers)}")
    h = headers[0]
    if h + 1 >= len(lines) or lines[h + 1].rstrip() != EXERCISE_SEP:
        found = lines[h + 1] if h + 1 < len(lines) else "end of file"
        raise PacingFormatError(f"{name}, line {h + 2}: expected the separator {EXERCISE_SEP!r}; found: {found!r}")
    out: list[dict[str, Any]] = []
    i = h + 2
    while i < len(lines) and lines[i].startswith("# |"):
        row = _EXERCISE_ROW.match(lines[i].rstrip())
        if row is None:
            raise PacingFormatError(
                f"{name}, line {i + 1}: expected a row like {_EXERCISE_ROW_SHAPE!r}; found: {lines[i]!r}"
            )
        number = int(row.group(1))
        if number != len(out) + 1:
            raise PacingFormatError(f"{name}, line {i + 1}: exercise numbered {number}, expected {len(out) + 1}")
        minutes = int(row.group(5))
        if minutes <= 0:
            raise PacingFormatError(f"{name}, line {i + 1}: time must be a positive number of minutes")
        out.append({"name": row.group(2).strip(), "minutes": minutes})
        i += 1
    if not out:
        raise PacingFormatError(f"{name}, line {h + 3}: the exercise table has no rows")
    return out


def count_words(text: str) -> int:
    """Words in markdown text: whitespace-separated tokens holding a letter or a digit
    (so table rules and lone symbols do not count, ``$G_t$`` does)."""
    return sum(1 for token in text.split() if _ALNUM.search(token))


def lesson_words(source: Path) -> int:
    """Words in the markdown cells of a lesson's text source (``lessons/NN_*.py``)."""
    from course_lib.course.notebooks.source import Target
    from course_lib.course.notebooks.source import render as render_notebook

    nb = render_notebook(Target(source.stem, "lesson", source, source.with_suffix(".ipynb")))
    return sum(count_words(cell.source) for cell in nb.cells if cell.cell_type == "markdown")


def build_reference(root: Path) -> dict[str, Any]:
    """Parse the sources of the figures in the checkout ``root`` (what the JSON file must equal).

    Raises:
        PacingFormatError: on a changed format, or a lesson without its notebook row or exercise source.
    """
    bench_path = root / "BENCHMARKS.md"
    if not bench_path.is_file():
        raise PacingFormatError(f"{bench_path}: not found (the figures come from the checkout's BENCHMARKS.md)")
    parsed = parse_benchmarks(bench_path.read_text(encoding="utf-8"), "BENCHMARKS.md")
    notebooks: dict[str, float] = parsed["notebooks"]
    lesson_rows = sorted(p for p in notebooks if p.startswith("lessons/"))
    sources = sorted((root / "lessons").glob("[0-9][0-9]_*.py"))
    missing = [f"lessons/{s.stem}.ipynb" for s in sources if f"lessons/{s.stem}.ipynb" not in notebooks]
    if missing:
        raise PacingFormatError(f"BENCHMARKS.md: the notebooks table has no row for {', '.join(missing)}")
    lessons: dict[str, Any] = {}
    for row in lesson_rows:
        lesson_id = Path(row).stem
        source = root / "lessons" / f"{lesson_id}.py"
        exercise_source = root / "exercises" / "src" / f"{lesson_id}.py"
        for path in (source, exercise_source):
            if not path.is_file():
                raise PacingFormatError(f"BENCHMARKS.md: {row} has a time but {path.relative_to(root)} does not exist")
        rel = exercise_source.relative_to(root).as_posix()
        lessons[lesson_id] = {
            "words": lesson_words(source),
            "exercises": parse_exercise_table(exercise_source.read_text(encoding="utf-8"), rel),
        }
    return {
        "about": (
            "Figures for `course pace`, parsed from BENCHMARKS.md (the notebooks table), the lessons' markdown "
            "(word counts) and exercises/src (stated times). Regenerate with `course pace --write-reference`."
        ),
        "reference": parsed["reference"],
        "notebooks": notebooks,
        "lessons": lessons,
    }


def reference_text(data: dict[str, Any]) -> str:
    """The JSON file's exact text (stable: sorted keys, one-space indent, trailing newline)."""
    return json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def write_reference(root: Path, path: Path = REFERENCE_PATH) -> Path:
    path.write_text(reference_text(build_reference(root)), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the reference at run time


@dataclass(frozen=True)
class Exercise:
    number: int
    name: str
    minutes: int


@dataclass(frozen=True)
class Reference:
    """The shipped figures: the machine the run times were measured on, and per-lesson inputs."""

    title: str
    date: str
    machine: str
    method: str
    notebooks: dict[str, float]
    words: dict[str, int]
    exercises: dict[str, tuple[Exercise, ...]]

    def run_s(self, lesson_id: str) -> float:
        """Measured seconds of ``lessons/<lesson_id>.ipynb`` on the reference machine."""
        key = f"lessons/{lesson_id}.ipynb"
        if key not in self.notebooks:
            raise KeyError(f"no measured time for {key} in {REFERENCE_PATH.name}")
        return self.notebooks[key]

    def describe(self) -> str:
        return f"{self.machine}, {self.date} ({self.method})"


def load_reference(path: Path = REFERENCE_PATH) -> Reference:
    """Read the shipped figures.

    Raises:
        PacingFormatError: if the file is missing or not the expected shape.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ref = data["reference"]
        lessons = data["lessons"]
        return Reference(
            title=str(ref["title"]),
            date=str(ref["date"]),
            machine=str(ref["machine"]),
            method=str(ref["method"]),
            notebooks={str(k): float(v) for k, v in data["notebooks"].items()},
            words={lid: int(v["words"]) for lid, v in lessons.items()},
            exercises={
                lid: tuple(Exercise(n, str(e["name"]), int(e["minutes"])) for n, e in enumerate(v["exercises"], 1))
                for lid, v in lessons.items()
            },
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PacingFormatError(
            f"{path}: cannot read the pacing figures ({type(exc).__name__}: {exc}); "
            "regenerate it from the checkout with `course pace --write-reference`"
        ) from exc


# --------------------------------------------------------------------------- per lesson


@dataclass(frozen=True)
class LessonPlan:
    """One lesson's figures on the room's machine (run time scaled by the machine factor)."""

    lesson_id: str
    number: int
    title: str
    reference_run_s: float
    factor: float
    words: int
    exercises: tuple[Exercise, ...]

    @property
    def run_s(self) -> float:
        return self.reference_run_s * self.factor

    @property
    def live(self) -> bool:
        """Run live when the whole notebook runs under LIVE_LIMIT_S here (then no cell is longer)."""
        return self.run_s < LIVE_LIMIT_S

    @property
    def reading_min(self) -> float:
        return self.words / READING_WPM

    @property
    def lesson_min(self) -> int:
        """The lesson block: reading (estimated) plus the live run's wait, in whole minutes (rounded up)."""
        return math.ceil(self.reading_min + (self.run_s / 60 if self.live else 0.0) - 1e-9)

    def exercise_min(self, numbers: tuple[int, ...] | None = None) -> int:
        chosen = self.exercises if numbers is None else tuple(e for e in self.exercises if e.number in numbers)
        return sum(e.minutes for e in chosen)

    @property
    def total_min(self) -> int:
        """The lesson block, its discussion and every exercise."""
        return self.lesson_min + DISCUSSION_MIN + self.exercise_min()

    @property
    def study_reading_min(self) -> int:
        """Reading the lesson alone at :data:`SELF_STUDY_WPM`, plus running it, in whole minutes (rounded up)."""
        return math.ceil(self.words / SELF_STUDY_WPM + self.run_s / 60 - 1e-9)

    @property
    def study_min(self) -> int:
        """Self-study: reading and running the lesson, then every exercise."""
        return self.study_reading_min + self.exercise_min()


def lesson_plans(reference: Reference, factor: float = 1.0) -> dict[int, LessonPlan]:
    """Every lesson with a measured time, keyed by number."""
    from course_lib.course.catalog import get_lesson

    _check_factor(factor)
    plans: dict[int, LessonPlan] = {}
    for lesson_id in sorted(reference.words):
        lesson = get_lesson(lesson_id)
        plans[lesson.number] = LessonPlan(
            lesson_id=lesson_id,
            number=lesson.number,
            title=lesson.title,
            reference_run_s=reference.run_s(lesson_id),
            factor=factor,
            words=reference.words[lesson_id],
            exercises=reference.exercises[lesson_id],
        )
    return plans


def _check_factor(factor: float) -> None:
    if not (isinstance(factor, int | float) and math.isfinite(factor) and factor > 0):
        raise ValueError(f"the machine factor must be a positive number, got {factor!r}")


# --------------------------------------------------------------------------- formats (data)


@dataclass(frozen=True)
class Part:
    """A lesson in a format and the exercises done in the room (``None``: all; the rest is homework)."""

    lesson: int
    exercises: tuple[int, ...] | None = None


@dataclass(frozen=True)
class DayShape:
    """A day's time box: teaching sessions at fixed times, with the breaks between them."""

    start: str
    sessions: tuple[int, ...]
    breaks: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if len(self.breaks) != len(self.sessions) - 1:
            raise ValueError("a day needs one break between each two sessions")

    @property
    def start_min(self) -> int:
        hours, minutes = self.start.split(":")
        return int(hours) * 60 + int(minutes)

    @property
    def teaching_min(self) -> int:
        return sum(self.sessions)

    @property
    def length_min(self) -> int:
        return sum(self.sessions) + sum(b for _, b in self.breaks)


@dataclass(frozen=True)
class WorkshopFormat:
    key: str
    title: str
    why: str
    shape: DayShape
    days: tuple[tuple[Part, ...], ...]

    @property
    def lessons(self) -> tuple[int, ...]:
        return tuple(p.lesson for day in self.days for p in day)


_HALF_DAY = DayShape("09:00", (80, 85), (("break", 15),))
_FULL_DAY = DayShape("09:00", (90, 105, 90, 105), (("break", 15), ("lunch", 60), ("break", 15)))

# in the room, each system's own mechanism: the learner's slot protocol and the actor's unroll
# (03's 3 and 4), the truncated-IS loss and in-flight decoding (07's 1 and 4); the one-line
# advantage (03's 2), the lag and time-to-target bookkeeping (07's 2 and 3) and slot refill
# (07's 5) are homework
_ONE_DAY = (Part(0), Part(1), Part(2, (1, 2, 3, 4)), Part(3, (1, 3, 4)), Part(7, (1, 4)))

FORMATS: dict[str, WorkshopFormat] = {
    f.key: f
    for f in (
        WorkshopFormat(
            key="3h",
            title="Three-hour introduction",
            why=(
                "the foundations every later lesson stands on (returns, the policy-gradient estimator, importance "
                "ratios); all three notebooks run live in under a minute, their core exercises fit beside them "
                "after the room's setup, and the buffer absorbs what the setup block does not"
            ),
            shape=_HALF_DAY,
            days=((Part(0, (1,)), Part(1, (1, 2, 3)), Part(2, (1, 2))),),
        ),
        WorkshopFormat(
            key="1day",
            title="One-day course",
            why=(
                "the foundations (00-02), then the two systems built on exactly them: IMPALA with V-trace (03) and "
                "pipeline RL (07, which needs 01-03); it is day 1 of the two-day course"
            ),
            shape=_FULL_DAY,
            days=(_ONE_DAY,),
        ),
        WorkshopFormat(
            key="2day",
            title="Two-day course",
            why=(
                "day 1 is the one-day course; day 2 completes the LLM RL systems track (08 cluster layout, 09 weight "
                "sync, 10 fault tolerance), with lesson 04 read before 10, whose checkpoints save 04's jitted PPO; "
                "the rest of the accelerator track (05-06) and the capstone (11, which needs 05, and its Ray part 12) "
                "are left for self-study"
            ),
            shape=_FULL_DAY,
            days=(_ONE_DAY, (Part(8), Part(9, (1, 2)), Part(4, (1,)), Part(10, (1, 2, 4)))),
        ),
    )
}


# --------------------------------------------------------------------------- schedules


@dataclass(frozen=True)
class Block:
    """One row of a schedule. ``kind``: setup, lesson, discussion, exercises, break, buffer or over
    (past the time box)."""

    kind: str
    start: int  # minutes since midnight
    minutes: int
    lesson: str
    what: str


@dataclass(frozen=True)
class DaySchedule:
    day: int
    start: int
    box_end: int
    blocks: tuple[Block, ...]

    @property
    def end(self) -> int:
        return max(self.box_end, *(b.start + b.minutes for b in self.blocks))

    @property
    def over_min(self) -> int:
        return sum(b.minutes for b in self.blocks if b.kind == "over")

    def minutes_of(self, *kinds: str) -> int:
        return sum(b.minutes for b in self.blocks if b.kind in kinds)


@dataclass(frozen=True)
class Schedule:
    format: WorkshopFormat
    factor: float
    days: tuple[DaySchedule, ...]
    homework: tuple[str, ...]
    not_covered: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return not any(d.over_min for d in self.days)


@dataclass
class _Item:
    kind: str
    lesson: str
    what: str
    minutes: int
    exercises: tuple[Exercise, ...] = ()


def _lesson_item(plan: LessonPlan) -> _Item:
    reading = f"read/present {plan.words:,} words (est. {plan.reading_min:.0f} min)"
    if plan.live:
        what = f"{reading}; run live: {plan.run_s:.0f} s"
    else:
        what = (
            f"{reading}; read the stored outputs (the notebook runs {plan.run_s:.0f} s here, over {LIVE_LIMIT_S:.0f} s)"
        )
    return _Item("lesson", f"{plan.number:02d}", what, plan.lesson_min)


def _exercise_what(exercises: tuple[Exercise, ...]) -> str:
    numbers = ", ".join(str(e.number) for e in exercises)
    names = "; ".join(f"{e.name} ({e.minutes} min)" for e in exercises)
    return f"exercise{'s' if len(exercises) > 1 else ''} {numbers}: {names}"


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _discussion_item(plan: LessonPlan) -> _Item:
    what = f"discussion: lesson {plan.number:02d}'s questions (INSTRUCTORS.md section 3)"
    return _Item("discussion", f"{plan.number:02d}", what, DISCUSSION_MIN)


def _schedule_day(
    day: int, parts: tuple[Part, ...], plans: dict[int, LessonPlan], shape: DayShape, setup: bool
) -> DaySchedule:
    # groups of items placed together: the setup; a lesson with its discussion; each exercise
    groups: list[list[_Item]] = [[_Item("setup", "", SETUP_WHAT, SETUP_MIN)]] if setup else []
    for part in parts:
        plan = plans[part.lesson]
        groups.append([_lesson_item(plan), _discussion_item(plan)])
        for ex in plan.exercises:
            if part.exercises is None or ex.number in part.exercises:
                groups.append([_Item("exercises", f"{plan.number:02d}", "", ex.minutes, (ex,))])

    session_starts = []
    t = shape.start_min
    for k, length in enumerate(shape.sessions):
        session_starts.append(t)
        t += length + (shape.breaks[k][1] if k < len(shape.breaks) else 0)
    box_end = t

    placed: list[list[_Item]] = [[] for _ in shape.sessions]
    over: list[_Item] = []
    session, used = 0, 0
    for group in groups:
        minutes = sum(item.minutes for item in group)
        while session < len(shape.sessions) and used + minutes > shape.sessions[session]:
            session, used = session + 1, 0
        if session == len(shape.sessions):
            over += group
            continue
        for item in group:
            last = placed[session][-1] if placed[session] else None
            if last is not None and last.kind == item.kind == "exercises" and last.lesson == item.lesson:
                last.minutes += item.minutes
                last.exercises += item.exercises
            else:
                placed[session].append(_Item(item.kind, item.lesson, item.what, item.minutes, item.exercises))
        used += minutes

    blocks: list[Block] = []
    for k, (start, length) in enumerate(zip(session_starts, shape.sessions)):
        t = start
        for item in placed[k]:
            what = _exercise_what(item.exercises) if item.kind == "exercises" else item.what
            blocks.append(Block(item.kind, t, item.minutes, item.lesson, what))
            t += item.minutes
        if t < start + length:
            blocks.append(Block("buffer", t, start + length - t, "", "buffer: questions, catching up"))
        if k < len(shape.breaks):
            label, minutes = shape.breaks[k]
            blocks.append(Block("break", start + length, minutes, "", label))
    t = box_end
    for item in over:
        what = _exercise_what(item.exercises) if item.kind == "exercises" else item.what
        blocks.append(Block("over", t, item.minutes, item.lesson, f"OVER TIME: {what}"))
        t += item.minutes
    return DaySchedule(day, shape.start_min, box_end, tuple(blocks))


def schedule(fmt: WorkshopFormat, plans: dict[int, LessonPlan]) -> Schedule:
    """Lay ``fmt`` out in its time box; blocks that do not fit go past the box and raise a warning."""
    unknown = [p.lesson for day in fmt.days for p in day if p.lesson not in plans]
    if unknown:
        raise KeyError(f"format {fmt.key!r} names lessons without figures: {unknown}")
    days = tuple(_schedule_day(d, parts, plans, fmt.shape, setup=d == 1) for d, parts in enumerate(fmt.days, 1))
    homework = []
    for day in fmt.days:
        for part in day:
            plan = plans[part.lesson]
            left = [e for e in plan.exercises if part.exercises is not None and e.number not in part.exercises]
            if left:
                homework.append(f"{plan.number:02d}: {_exercise_what(tuple(left))}")
    covered = set(fmt.lessons)
    not_covered = tuple(f"{p.number:02d}" for p in plans.values() if p.number not in covered)
    warnings = []
    for d in days:
        if d.over_min:
            warnings.append(
                f"WARNING: {fmt.key} day {d.day} does not fit its time box ({_hhmm(d.start)}-{_hhmm(d.box_end)}): "
                f"{d.over_min} min over, it would end at {_hhmm(d.end)}; leave exercises as homework or drop a lesson"
            )
    factor = next(iter(plans.values())).factor if plans else 1.0
    return Schedule(fmt, factor, days, tuple(homework), not_covered, tuple(warnings))


# --------------------------------------------------------------------------- rendering


def _table(headers: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        return out + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def fmt_row(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return [fmt_row(headers), fmt_row(["-" * w for w in widths]), *(fmt_row(r) for r in rows)]


def assumptions(reference: Reference, factor: float) -> list[str]:
    scaled = "" if factor == 1 else f", times {factor:g} for this room (`--machine-factor {factor:g}`)"
    return [
        f'- Run times: MEASURED, BENCHMARKS.md "{reference.title}": {reference.describe()}{scaled}.',
        f"- Reading times: ESTIMATED from each lesson's markdown word count at {READING_WPM} words/min "
        "(technical text with equations); an instructor presenting may go faster or slower.",
        "- Exercise times: the estimates stated in each exercise notebook's header table.",
        f"- Setup and discussion: ASSUMED: {SETUP_MIN} min at the start of day 1 ({SETUP_WHAT.removeprefix('setup: ')}), "
        f"and {DISCUSSION_MIN} min after each lesson for its 2-3 discussion questions (INSTRUCTORS.md section 3), "
        "in the same session as the lesson.",
        f"- Live or stored: a notebook that runs under {LIVE_LIMIT_S:.0f} s here is run live (no cell can be longer); "
        "a longer one may have longer cells (BENCHMARKS.md times whole notebooks), so its stored outputs are read "
        "and it can be re-run after the session.",
    ]


def lesson_table(plans: dict[int, LessonPlan], markdown: bool) -> list[str]:
    headers = [
        "lesson",
        "run, measured (s)",
        "in the room",
        "reading (est. min)",
        "exercises (stated min)",
        "discussion (min)",
        "total (min)",
    ]
    rows = []
    for p in plans.values():
        room = f"live, {p.run_s:.0f} s" if p.live else f"stored ({p.run_s:.0f} s)"
        rows.append(
            [
                f"{p.number:02d} {p.title}",
                f"{p.reference_run_s:.1f}",
                room,
                f"{p.reading_min:.1f}",
                f"{p.exercise_min()} ({len(p.exercises)} exercises)",
                str(DISCUSSION_MIN),
                str(p.total_min),
            ]
        )
    return _table(headers, rows, markdown)


def render_schedule(sched: Schedule, markdown: bool, heading_level: int = 2) -> list[str]:
    fmt = sched.format
    shape = fmt.shape
    box = f"{_hhmm(shape.start_min)}-{_hhmm(shape.start_min + shape.length_min)}"
    n_days = len(fmt.days)
    breaks = shape.length_min - shape.teaching_min
    days = f"{n_days} days, each " if n_days > 1 else ""
    per_day = f"{days}{box}: {shape.teaching_min} teaching min ({shape.teaching_min / 60:g} h) + {breaks} min of breaks"
    lines = [
        f"{'#' * (heading_level + 1) + ' ' if markdown else ''}{fmt.key}: {fmt.title} ({per_day})",
        "",
        f"Why these lessons: {fmt.why}.",
        "",
    ]
    for d in sched.days:
        if n_days > 1:
            lines += [f"{'#' * (heading_level + 2) + ' ' if markdown else ''}Day {d.day}", ""]
        rows = [[_hhmm(b.start), str(b.minutes), b.kind, b.lesson, b.what] for b in d.blocks]
        lines += _table(["start", "min", "block", "lesson", "what"], rows, markdown)
        parts = [(kind, d.minutes_of(kind)) for kind in ("setup", "lesson", "discussion", "exercises")]
        parts = [(kind, minutes) for kind, minutes in parts if minutes or kind in ("lesson", "exercises")]
        names = {"setup": "setup", "lesson": "lessons", "discussion": "discussion", "exercises": "exercises"}
        sums = " + ".join(f"{names[kind]} {minutes} min" for kind, minutes in parts)
        lines += [
            "",
            f"Day {d.day} totals: {sums} = {sum(m for _, m in parts)} teaching min of {shape.teaching_min}; "
            f"breaks {d.minutes_of('break')} min; "
            f"buffer {d.minutes_of('buffer')} min; over time {d.over_min} min; "
            f"{_hhmm(d.start)}-{_hhmm(d.end)} ({'fits' if not d.over_min else 'DOES NOT FIT'}).",
            "",
        ]
    if sched.homework:
        lines += ["Left as homework:", *(f"- {h}" for h in sched.homework), ""]
    if sched.not_covered:
        lines += [f"Not covered (self-study): lessons {', '.join(sched.not_covered)}.", ""]
    lines += [*sched.warnings, *([""] if sched.warnings else [])]
    return lines


def render(
    keys: list[str], reference: Reference, factor: float, markdown: bool, heading_level: int = 2
) -> tuple[str, list[Schedule]]:
    """The per-lesson table and the schedules of ``keys``; markdown headings from ``heading_level``
    (INSTRUCTORS.md includes this at level 4, under its section 2.2)."""
    plans = lesson_plans(reference, factor)
    schedules = [schedule(FORMATS[k], plans) for k in keys]
    lines = [
        f"{'#' * heading_level + ' ' if markdown else ''}Workshop pacing (`course pace`)",
        "",
        *assumptions(reference, factor),
        "",
        f"{'#' * (heading_level + 1) + ' ' if markdown else ''}Per lesson",
        "",
        *lesson_table(plans, markdown),
        "",
    ]
    for sched in schedules:
        lines += render_schedule(sched, markdown, heading_level)
    return "\n".join(lines).rstrip("\n") + "\n", schedules


def _hours(minutes: int) -> str:
    return f"{minutes / 60:.1f} h"


def study_table(plans: dict[int, LessonPlan], markdown: bool) -> list[str]:
    """Self-study time per lesson (reading alone at SELF_STUDY_WPM and running it, then every
    exercise), the whole course and each path: what README.md and lesson 00 show."""
    headers = ["lesson", "read and run (min)", "exercises (min)", "total"]
    rows = [
        [f"{p.number:02d} {p.title}", str(p.study_reading_min), str(p.exercise_min()), f"{p.study_min} min"]
        for p in plans.values()
    ]
    total = sum(p.study_min for p in plans.values())
    rows.append(
        [
            "all lessons",
            str(sum(p.study_reading_min for p in plans.values())),
            str(sum(p.exercise_min() for p in plans.values())),
            _hours(total),
        ]
    )
    from course_lib.course.catalog import PATHS, path_lessons

    for name in PATHS:
        present = [n for n in path_lessons(name) if n in plans]
        rows.append(
            [
                f"{name} ({_lesson_ranges(present)})",
                str(sum(plans[n].study_reading_min for n in present)),
                str(sum(plans[n].exercise_min() for n in present)),
                _hours(sum(plans[n].study_min for n in present)),
            ]
        )
    return _table(headers, rows, markdown)


def _lesson_ranges(numbers: list[int]) -> str:
    """``[0, 1, 2, 3, 5, 7, 8]`` -> ``"00-03, 05, 07-08"``."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]:02d}" if len(r) == 1 else f"{r[0]:02d}-{r[-1]:02d}" for r in runs)


def render_study(reference: Reference, markdown: bool) -> str:
    """``course pace --self-study``: the self-study table with how its figures are made."""
    plans = lesson_plans(reference, 1.0)
    lines = [
        f"{'## ' if markdown else ''}Self-study time (`course pace --self-study`)",
        "",
        f"- Reading: each lesson's markdown words at {SELF_STUDY_WPM} words/min (reading alone, to understand; "
        f"a room presenting goes faster, {READING_WPM} words/min), plus its measured run time "
        f"({reference.describe()}).",
        "- Exercises: the estimates stated in each exercise notebook's header table.",
        "",
        *study_table(plans, markdown),
    ]
    return "\n".join(lines) + "\n"


README_START = "<!-- pace:self-study -->"
README_END = "<!-- /pace:self-study -->"


def with_study_table(text: str, reference: Reference) -> str:
    """README.md's text with the table between its self-study markers regenerated (markdown)."""
    if README_START not in text or README_END not in text:
        raise PacingFormatError(f"README.md: the markers {README_START} and {README_END} are missing")
    start = text.index(README_START) + len(README_START) + 1
    end = text.index(README_END)
    table = "\n".join(study_table(lesson_plans(reference, 1.0), True)) + "\n"
    return text[:start] + table + text[end:]


GUIDE_START = "<!-- pace:all"
GUIDE_END = "<!-- /pace:all -->"


def guide_block(text: str) -> tuple[int, int]:
    """Where INSTRUCTORS.md's generated schedules lie: (start, end) of the text between its markers."""
    if GUIDE_START not in text or GUIDE_END not in text:
        raise PacingFormatError(f"INSTRUCTORS.md: the markers {GUIDE_START} ... --> and {GUIDE_END} are missing")
    start = text.index("-->", text.index(GUIDE_START)) + len("-->\n")
    return start, text.index(GUIDE_END)


def with_schedules(text: str, reference: Reference) -> str:
    """INSTRUCTORS.md's text with its section 2.2 replaced by the schedules of every format
    (markdown, headings at level 4), as ``course pace --write-reference`` writes it."""
    start, end = guide_block(text)
    block, _ = render(list(FORMATS), reference, 1.0, True, heading_level=4)
    return text[:start] + block + text[end:]


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", choices=[*FORMATS, "all"], default="all", help="which workshop format to print (default: all)"
    )
    parser.add_argument("--markdown", action="store_true", help="print markdown tables (what INSTRUCTORS.md includes)")
    parser.add_argument(
        "--machine-factor",
        type=float,
        default=1.0,
        metavar="F",
        help="scale the measured run times by F for the room's machines (`course doctor --time` prints it)",
    )
    parser.add_argument(
        "--self-study",
        action="store_true",
        help="print the time one learner needs per lesson, in all and per path (what README.md and lesson 00 show)",
    )
    parser.add_argument(
        "--write-reference",
        action="store_true",
        help=f"regenerate {REFERENCE_PATH.name} from BENCHMARKS.md, lessons/ and exercises/src in the checkout, and "
        "the schedules in INSTRUCTORS.md, then exit",
    )


def run(args: argparse.Namespace) -> int:
    if args.write_reference:
        from course_lib.course.paths import repo_root

        try:
            path = write_reference(repo_root())
        except (PacingFormatError, FileNotFoundError) as exc:
            print(f"course pace: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {path}")
        guide = repo_root() / "INSTRUCTORS.md"
        if guide.exists():
            guide.write_text(with_schedules(guide.read_text(encoding="utf-8"), load_reference(path)), encoding="utf-8")
            print(f"updated the schedules in {guide}")
        readme = repo_root() / "README.md"
        if readme.exists() and README_START in readme.read_text(encoding="utf-8"):
            readme.write_text(
                with_study_table(readme.read_text(encoding="utf-8"), load_reference(path)), encoding="utf-8"
            )
            print(f"updated the self-study table in {readme}")
        return 0
    try:
        _check_factor(args.machine_factor)
        reference = load_reference()
    except (ValueError, PacingFormatError) as exc:
        print(f"course pace: {exc}", file=sys.stderr)
        return 2
    if args.self_study:
        print(render_study(reference, args.markdown), end="")
        return 0
    keys = list(FORMATS) if args.format == "all" else [args.format]
    text, _ = render(keys, reference, args.machine_factor, args.markdown)
    print(text, end="")
    return 0
