"""``course pace`` (course_lib.course.pacing): parsing, the shipped figures, and the schedules."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import pytest

from course_lib.course import catalog, pacing
from course_lib.course.catalog import get_lesson
from course_lib.course.cli import main as course_main

REPO = Path(__file__).resolve().parent.parent

GOOD_BENCH = """# Benchmarks

Some text.

<!-- bench:notebooks -->
### Notebook execution time at the cpu scale

Measured 2026-11-27 under nbval in a clean-clone run, on: Test CPU, 2 cores, 8 GiB, Python 3.11.7, no GPU; whole run 40 min.

| notebook | seconds | within 150 s |
|---|---|---|
| `exercises/00_welcome.ipynb` | 0.9 | yes |
| `lessons/00_welcome.ipynb` | 12.4 | yes |
| `lessons/03_impala_vtrace.ipynb` | 151.0 | **no** |

- notes below the table are ignored.
<!-- /bench:notebooks -->
"""

GOOD_EXERCISES = """# %% [markdown]
# # 00 exercises
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `discounted_returns` | 10 | ★☆☆ | 10 min |
# | 2. `finished_episode_returns`: the ends | 10 | ★★☆ | 25 min |
#
# More text.
"""


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


@pytest.fixture(scope="module")
def reference() -> pacing.Reference:
    return pacing.load_reference()


@pytest.fixture(scope="module")
def plans(reference) -> dict[int, pacing.LessonPlan]:
    return pacing.lesson_plans(reference)


# --------------------------------------------------------------------------- parsing BENCHMARKS.md


def test_parses_the_notebook_table_and_its_reference_machine():
    parsed = pacing.parse_benchmarks(GOOD_BENCH)
    assert parsed["notebooks"] == {
        "exercises/00_welcome.ipynb": 0.9,
        "lessons/00_welcome.ipynb": 12.4,
        "lessons/03_impala_vtrace.ipynb": 151.0,
    }
    ref = parsed["reference"]
    assert ref["date"] == "2026-11-27"
    assert ref["machine"] == "Test CPU, 2 cores, 8 GiB, Python 3.11.7, no GPU"
    assert ref["method"].startswith("nbval") and ref["budget_s"] == 150
    assert ref["title"] == "Notebook execution time at the cpu scale"


def test_parses_the_block_that_bench_run_py_writes(monkeypatch):
    """`python bench/run.py notebooks` rewrites the block: its own layout must parse too."""
    spec = importlib.util.spec_from_file_location("bench_run_for_pacing", REPO / "bench" / "run.py")
    assert spec is not None and spec.loader is not None
    bench_run = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench_run)  # its dataclasses look their module up
    spec.loader.exec_module(bench_run)
    result = bench_run.Result(
        title="Notebook execution time at the cpu scale",
        columns=["notebook", "seconds", "within 150 s"],
        rows=[["`lessons/00_welcome.ipynb`", "13.1", "yes"], ["`solutions/00_welcome.ipynb`", "0.8", "yes"]],
        notes=["Wall-clock seconds including kernel start; one fresh kernel per notebook."],
    )
    parsed = pacing.parse_benchmarks("# Benchmarks\n\n" + bench_run.render("notebooks", result) + "\n")
    assert parsed["notebooks"] == {"lessons/00_welcome.ipynb": 13.1, "solutions/00_welcome.ipynb": 0.8}
    assert parsed["reference"]["machine"] == bench_run.machine()
    assert "course build" in parsed["reference"]["method"]


@pytest.mark.parametrize(
    ("old", "new", "line_of", "message"),
    [
        ("| notebook | seconds |", "| notebook | time (s) |", "| notebook |", "table header"),
        ("| 12.4 | yes |", "| 12.4 s | yes |", "12.4 s", "expected a row like"),
        ("| 0.9 | yes |", "| fast | yes |", "| fast |", "expected a row like"),
        ("|---|---|---|", "|---|---|", "|---|---|", "separator"),
        ("### Notebook execution time at the cpu scale", "### Notebook times", "### Notebook times", "title"),
        ("Measured 2026-11-27 under", "Measured on 27 November, under", "Measured on 27", "Measured YYYY-MM-DD"),
        (
            "| `lessons/03_impala_vtrace.ipynb` | 151.0 | **no** |",
            "| `lessons/00_welcome.ipynb` | 151.0 | **no** |",
            "151.0",
            "appears twice",
        ),
    ],
)
def test_changed_benchmarks_format_names_the_file_and_line(old, new, line_of, message):
    assert old in GOOD_BENCH
    text = GOOD_BENCH.replace(old, new)
    with pytest.raises(pacing.PacingFormatError) as info:
        pacing.parse_benchmarks(text)
    text_of_error = str(info.value)
    assert text_of_error.startswith(f"BENCHMARKS.md, line {_line_of(text, line_of)}: "), text_of_error
    assert message in text_of_error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD_BENCH.replace("<!-- bench:notebooks -->", "<!-- bench:nb -->"), "expected exactly one line"),
        (GOOD_BENCH.replace("<!-- /bench:notebooks -->", ""), "is never closed"),
        (GOOD_BENCH.replace("Measured 2026-11-27", "Run 2026-11-27"), "expected one line 'Measured"),
    ],
)
def test_missing_markers_or_reference_line_are_clear_errors(text, message):
    with pytest.raises(pacing.PacingFormatError, match=r"^BENCHMARKS\.md") as info:
        pacing.parse_benchmarks(text)
    assert message in str(info.value)


# --------------------------------------------------------------------------- parsing exercises/src


def test_parses_the_exercise_header_table():
    assert pacing.parse_exercise_table(GOOD_EXERCISES, "exercises/src/00_welcome.py") == [
        {"name": "`discounted_returns`", "minutes": 10},
        {"name": "`finished_episode_returns`: the ends", "minutes": 25},
    ]


@pytest.mark.parametrize(
    ("old", "new", "line_of", "message"),
    [
        ("| 10 min |", "| 10 minutes |", "10 minutes", "expected a row like"),
        ("| 25 min |", "| 1/2 h |", "1/2 h", "expected a row like"),
        ("# | 2. `finished", "# | 3. `finished", "3. `finished", "numbered 3, expected 2"),
        ("# |---|---|---|---|", "# |---|---|---|", "|---|---|---|", "separator"),
    ],
)
def test_changed_exercise_table_names_the_file_and_line(old, new, line_of, message):
    text = GOOD_EXERCISES.replace(old, new)
    with pytest.raises(pacing.PacingFormatError) as info:
        pacing.parse_exercise_table(text, "exercises/src/00_welcome.py")
    assert str(info.value).startswith(f"exercises/src/00_welcome.py, line {_line_of(text, line_of)}: ")
    assert message in str(info.value)


def test_exercise_source_without_or_with_two_tables_is_an_error():
    no_table = GOOD_EXERCISES.replace("| time |", "| minutes |")
    with pytest.raises(pacing.PacingFormatError, match=r"^exercises/src/x.py: expected exactly one header line"):
        pacing.parse_exercise_table(no_table, "exercises/src/x.py")
    with pytest.raises(pacing.PacingFormatError, match="found 2"):
        pacing.parse_exercise_table(GOOD_EXERCISES + GOOD_EXERCISES, "exercises/src/x.py")


def test_words_count_tokens_with_letters_or_digits():
    assert pacing.count_words("| a | b |\n|---|---|\n$G_t = r_t + \\gamma G_{t+1}$ -- 10 min") == 8


# --------------------------------------------------------------------------- the shipped figures


def test_shipped_json_equals_benchmarks_and_exercise_sources():
    """One source of truth: the JSON that `course pace` reads is exactly what the checkout says."""
    expected = pacing.reference_text(pacing.build_reference(REPO))
    shipped = pacing.REFERENCE_PATH.read_text(encoding="utf-8")
    assert shipped == expected, (
        f"{pacing.REFERENCE_PATH.name} differs from BENCHMARKS.md / lessons / exercises/src: "
        "run `course pace --write-reference`"
    )


def test_shipped_figures_match_the_sources_read_independently(reference):
    """Spot checks with plain searches, not the parser: a lesson time, an exercise time, every lesson."""
    bench = (REPO / "BENCHMARKS.md").read_text()
    row = re.search(r"^\| `lessons/10_fault_tolerance\.ipynb` \| ([\d.]+) \|", bench, re.M)
    assert row and reference.run_s("10_fault_tolerance") == float(row.group(1))
    src = (REPO / "exercises" / "src" / "01_policy_gradients.py").read_text()
    minutes = [int(m) for m in re.findall(r"^# \| \d+\. .*\| (\d+) min \|$", src, re.M)]
    assert [e.minutes for e in reference.exercises["01_policy_gradients"]] == minutes and len(minutes) >= 3
    on_disk = sorted(p.stem for p in (REPO / "lessons").glob("[0-9][0-9]_*.py"))
    assert sorted(reference.words) == on_disk
    assert reference.date in bench and reference.machine in bench


def test_broken_json_is_a_clear_error(tmp_path):
    broken = tmp_path / "pacing_reference.json"
    broken.write_text(json.dumps({"reference": {}}))
    with pytest.raises(pacing.PacingFormatError, match="--write-reference") as info:
        pacing.load_reference(broken)
    assert str(broken) in str(info.value)


# --------------------------------------------------------------------------- per lesson and the live rule


def test_live_rule_follows_the_measured_times(plans):
    for plan in plans.values():
        assert plan.live == (plan.reference_run_s < pacing.LIVE_LIMIT_S)
    live = sorted(n for n, p in plans.items() if p.live)
    assert {0, 1, 2} <= set(live)  # the foundations run live: the 3-hour introduction relies on it
    assert not plans[3].live and plans[3].reference_run_s > 60


@pytest.mark.parametrize(("seconds", "live"), [(59.9, True), (60.0, False), (12.4, True), (96.5, False)])
def test_live_rule_boundary(seconds, live):
    plan = pacing.LessonPlan("00_welcome", 0, "t", seconds, 1.0, 1500, ())
    assert plan.live is live
    # a live lesson's block waits for its run; a stored one only reads
    assert plan.lesson_min == math.ceil(10 + (seconds / 60 if live else 0) - 1e-9)
    item = pacing._lesson_item(plan)
    assert ("run live" in item.what) is live and ("read the stored outputs" in item.what) is (not live)


def test_lesson_figures_add_up(plans, reference):
    for number, plan in plans.items():
        lesson = get_lesson(number)
        assert plan.lesson_id == lesson.id and plan.title == lesson.title
        assert plan.reading_min == reference.words[lesson.id] / pacing.READING_WPM
        assert plan.exercise_min() == sum(e.minutes for e in reference.exercises[lesson.id])
        assert plan.total_min == plan.lesson_min + pacing.DISCUSSION_MIN + plan.exercise_min()
        assert plan.lesson_min >= plan.reading_min


def test_machine_factor_scales_run_times(reference, plans):
    slow = pacing.lesson_plans(reference, 2.0)
    for n, plan in plans.items():
        assert slow[n].run_s == pytest.approx(2 * plan.run_s)
        assert slow[n].live == (2 * plan.reference_run_s < pacing.LIVE_LIMIT_S)
    assert plans[1].live and not slow[1].live  # about 33 s -> 66 s: now read from stored outputs
    assert slow[0].live  # about 15 s -> 30 s
    text, _ = pacing.render(["3h"], reference, 2.0, markdown=False)
    assert "`--machine-factor 2`" in text
    lesson01, lesson00 = 2 * plans[1].reference_run_s, 2 * plans[0].reference_run_s
    assert f"read the stored outputs (the notebook runs {lesson01:.0f} s here, over 60 s)" in text  # lesson 01 at 2x
    assert f"run live: {lesson00:.0f} s" in text  # lesson 00 at 2x
    with pytest.raises(ValueError, match="positive"):
        pacing.lesson_plans(reference, 0.0)
    with pytest.raises(ValueError, match="positive"):
        pacing.lesson_plans(reference, float("nan"))


# --------------------------------------------------------------------------- schedules


def _check_day_sums(day: pacing.DaySchedule, shape: pacing.DayShape) -> None:
    t = day.start
    for block in day.blocks:
        assert block.start == t, f"day {day.day}: gap or overlap at {pacing._hhmm(block.start)}"
        assert block.minutes > 0
        t += block.minutes
    inside = sum(b.minutes for b in day.blocks if b.kind != "over")
    assert inside == shape.length_min == day.box_end - day.start
    assert day.minutes_of("break") == shape.length_min - shape.teaching_min
    assert day.minutes_of("setup", "lesson", "discussion", "exercises", "buffer") == shape.teaching_min
    assert day.end == day.box_end + day.over_min


@pytest.mark.parametrize("key", list(pacing.FORMATS))
def test_every_format_sums_correctly_and_fits(key, plans):
    fmt = pacing.FORMATS[key]
    sched = pacing.schedule(fmt, plans)
    assert sched.fits and not sched.warnings
    for day, parts in zip(sched.days, fmt.days):
        _check_day_sums(day, fmt.shape)
        # what the day teaches is exactly its lessons' blocks and chosen exercises
        expected_lessons = sum(plans[p.lesson].lesson_min for p in parts)
        expected_exercises = sum(plans[p.lesson].exercise_min(p.exercises) for p in parts)
        assert day.minutes_of("lesson") == expected_lessons
        assert day.minutes_of("exercises") == expected_exercises
        assert [b.lesson for b in day.blocks if b.kind == "lesson"] == [f"{p.lesson:02d}" for p in parts]
        # the room's setup opens day 1 (only day 1); each lesson is followed at once by its discussion
        setups = [b for b in day.blocks if b.kind == "setup"]
        if day.day == 1:
            assert day.blocks[0] == pacing.Block("setup", fmt.shape.start_min, pacing.SETUP_MIN, "", pacing.SETUP_WHAT)
            assert setups == [day.blocks[0]] and pacing.SETUP_WHAT == "setup: course doctor, make lab, open lesson 00"
        else:
            assert not setups
        assert day.minutes_of("discussion") == pacing.DISCUSSION_MIN * len(parts)
        for i, block in enumerate(day.blocks):
            if block.kind == "lesson":
                after = day.blocks[i + 1]
                assert (after.kind, after.lesson, after.minutes) == ("discussion", block.lesson, pacing.DISCUSSION_MIN)
                assert after.start == block.start + block.minutes  # same session: no break between them
        # no session runs into its break: breaks sit at the shape's fixed times
        breaks = [b.start for b in day.blocks if b.kind == "break"]
        starts, t = [], fmt.shape.start_min
        for length, (_, minutes) in zip(fmt.shape.sessions, fmt.shape.breaks):
            starts.append(t + length)
            t += length + minutes
        assert breaks == starts
    # every lesson in a format comes after the lessons it needs
    seen: set[int] = set()
    for number in fmt.lessons:
        assert set(get_lesson(number).requires) <= seen, f"{key}: lesson {number:02d} before its prerequisites"
        seen.add(number)


def test_format_time_boxes():
    assert pacing.FORMATS["3h"].shape.length_min == 180 and len(pacing.FORMATS["3h"].days) == 1
    assert pacing.FORMATS["1day"].shape.teaching_min == 390  # 6.5 teaching hours
    assert len(pacing.FORMATS["2day"].days) == 2
    for fmt in pacing.FORMATS.values():
        assert fmt.why and len(fmt.shape.breaks) >= 1


def test_a_format_that_does_not_fit_warns(plans):
    too_much = pacing.WorkshopFormat(
        "x", "everything in 3 hours", "a test", pacing.FORMATS["3h"].shape, (tuple(pacing.Part(n) for n in plans),)
    )
    sched = pacing.schedule(too_much, plans)
    assert not sched.fits
    (day,) = sched.days
    _check_day_sums(day, too_much.shape)
    teaching = pacing.SETUP_MIN + sum(p.total_min for p in plans.values())
    assert day.minutes_of("setup", "lesson", "discussion", "exercises") + day.over_min == teaching
    assert day.over_min >= teaching - too_much.shape.teaching_min
    assert len(sched.warnings) == 1 and f"{day.over_min} min over" in sched.warnings[0]
    text = "\n".join(pacing.render_schedule(sched, markdown=True))
    assert "DOES NOT FIT" in text and "WARNING: x day 1 does not fit its time box (09:00-12:00)" in text
    assert all(b.what.startswith("OVER TIME") for b in day.blocks if b.kind == "over")


def _plan(number: int, words: int, *exercise_minutes: int) -> pacing.LessonPlan:
    exercises = tuple(pacing.Exercise(k, f"`e{k}`", m) for k, m in enumerate(exercise_minutes, 1))
    return pacing.LessonPlan(f"{number:02d}_x", number, f"lesson {number}", 10.0, 1.0, words, exercises)


def test_a_lesson_and_its_discussion_share_a_session():
    """A lesson that fits before the break but whose discussion would not moves with it."""
    shape = pacing.DayShape("09:00", (60, 60), (("break", 15),))
    # setup 15 + lesson 0 (3 min) + discussion 5 + exercise 30 = 53 min; lesson 1's block is 6 min:
    # it would end at 59 (fits in 60), its discussion at 64 (does not): both go after the break
    plans = {0: _plan(0, 300, 30), 1: _plan(1, 750, 20)}
    assert (plans[0].lesson_min, plans[1].lesson_min) == (3, 6)
    fmt = pacing.WorkshopFormat("t", "test", "a test", shape, ((pacing.Part(0), pacing.Part(1)),))
    sched = pacing.schedule(fmt, plans)
    (day,) = sched.days
    rows = [(pacing._hhmm(b.start), b.minutes, b.kind, b.lesson) for b in day.blocks]
    assert rows == [
        ("09:00", 15, "setup", ""),
        ("09:15", 3, "lesson", "00"),
        ("09:18", 5, "discussion", "00"),
        ("09:23", 30, "exercises", "00"),
        ("09:53", 7, "buffer", ""),
        ("10:00", 15, "break", ""),
        ("10:15", 6, "lesson", "01"),
        ("10:21", 5, "discussion", "01"),
        ("10:26", 20, "exercises", "01"),
        ("10:46", 29, "buffer", ""),
    ]
    assert sched.fits
    _check_day_sums(day, shape)
    text = "\n".join(pacing.render_schedule(sched, markdown=False))
    assert (
        "Day 1 totals: setup 15 min + lessons 9 min + discussion 10 min + exercises 50 min = 84 teaching min of 120"
        in text
    )
    # past the last session: lesson 2's block (6 min) would fit in the last 9 minutes, its discussion
    # not, so both run over time together
    plans = {0: _plan(0, 300, 30), 1: _plan(1, 750, 40), 2: _plan(2, 750)}
    fmt = pacing.WorkshopFormat("t", "test", "a test", shape, ((pacing.Part(0), pacing.Part(1), pacing.Part(2)),))
    late = pacing.schedule(fmt, plans)
    assert not late.fits
    over = [(b.kind, b.lesson, b.minutes, pacing._hhmm(b.start)) for b in late.days[0].blocks if b.kind == "over"]
    assert over == [("over", "02", 6, "11:15"), ("over", "02", 5, "11:21")]
    assert late.days[0].blocks[-3] == pacing.Block("buffer", 666, 9, "", "buffer: questions, catching up")
    assert "11 min over, it would end at 11:26" in late.warnings[0]


def test_homework_lists_the_exercises_left_out(plans):
    sched = pacing.schedule(pacing.FORMATS["3h"], plans)
    done = {(p.lesson, n) for p in pacing.FORMATS["3h"].days[0] for n in (p.exercises or ())}
    for part in pacing.FORMATS["3h"].days[0]:
        plan = plans[part.lesson]
        for ex in plan.exercises:
            in_homework = any(h.startswith(f"{part.lesson:02d}:") and ex.name in h for h in sched.homework)
            assert in_homework == (part.exercises is not None and (part.lesson, ex.number) not in done)


# --------------------------------------------------------------------------- the command


def test_course_pace_all_prints_every_format(capsys):
    assert course_main(["pace"]) == 0
    out = capsys.readouterr().out
    for fmt in pacing.FORMATS.values():
        assert f"{fmt.key}: {fmt.title}" in out
    assert "ESTIMATED" in out and "MEASURED" in out and "ASSUMED" in out and "WARNING" not in out
    assert out.count("(fits)") == 4  # 3h, 1day, and the two days of 2day
    # the setup opens day 1 of each format (not day 2); a discussion follows every lesson taught
    assert out.count(f"09:00  {pacing.SETUP_MIN}   setup") == 3
    taught = sum(len(day) for fmt in pacing.FORMATS.values() for day in fmt.days)
    assert len(re.findall(r"^\d\d:\d\d  5    discussion  \d\d ", out, re.M)) == taught


def test_course_pace_markdown_tables_are_self_contained(capsys):
    assert course_main(["pace", "--format", "2day", "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "### 2day: Two-day course" in out and "#### Day 2" in out and "3h:" not in out
    tables = re.findall(r"((?:^\|.*\|\n)+)", out, re.M)
    assert len(tables) == 3  # per lesson, day 1, day 2
    for table in tables:
        rows = table.strip("\n").split("\n")
        assert re.fullmatch(r"\|(---\|)+", rows[1])
        widths = {len(re.split(r"(?<!\\)\|", row)) for row in rows}
        assert len(widths) == 1, table


def test_course_pace_bad_factor_is_a_clear_error(capsys):
    assert course_main(["pace", "--machine-factor", "-1"]) == 2
    assert "machine factor must be a positive number" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        course_main(["pace", "--format", "5day"])


def test_instructors_guide_holds_the_generated_schedules():
    # INSTRUCTORS.md section 2.2 is what `course pace --write-reference` writes there
    text = (REPO / "INSTRUCTORS.md").read_text(encoding="utf-8")
    assert pacing.with_schedules(text, pacing.load_reference()) == text, (
        "INSTRUCTORS.md's schedules are stale: run `course pace --write-reference`"
    )
    with pytest.raises(pacing.PacingFormatError, match="markers"):
        pacing.with_schedules("no markers here", pacing.load_reference())


def test_readme_holds_the_generated_self_study_table():
    # README.md's "How long it takes" is what `course pace --write-reference` writes there
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert pacing.with_study_table(text, pacing.load_reference()) == text, (
        "README.md's self-study table is stale: run `course pace --write-reference`"
    )
    with pytest.raises(pacing.PacingFormatError, match="markers"):
        pacing.with_study_table("no markers here", pacing.load_reference())


def test_self_study_figures_add_up(plans, capsys):
    for p in plans.values():
        assert p.study_min == p.study_reading_min + p.exercise_min()
        assert p.study_reading_min >= p.words / pacing.SELF_STUDY_WPM
    assert course_main(["pace", "--self-study"]) == 0
    out = capsys.readouterr().out
    total = sum(p.study_min for p in plans.values())
    assert "all lessons" in out and f"{total / 60:.1f} h" in out
    assert pacing._lesson_ranges([0, 1, 2, 3, 5, 7, 8]) == "00-03, 05, 07-08"


def test_readme_front_page_is_short_and_for_learners():
    # what a newcomer reads before the maintainers' pointer: at most 1,200 words, and it says
    # who the course is for, how long it takes and how to start
    text = (REPO / "README.md").read_text(encoding="utf-8")
    front = text.split("## For maintainers")[0]
    assert len(front) < len(text), "README.md lost its '## For maintainers' section"
    words = len(re.findall(r"[^\W_][\w'’-]*", front))
    assert words <= 1200, f"README.md's front page is {words} words (at most 1,200): move detail to CONTRIBUTING.md"
    for heading in ("## Who it is for", "## How long it takes", "## Set up"):
        assert heading in front
    assert "make lab" in front and "download.pytorch.org/whl/cpu" in front


def test_readme_hours_match_the_self_study_table(plans):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    (start,) = [i for i, line in enumerate(text.splitlines()) if line.startswith("- **Takes**")]
    line = " ".join(text.splitlines()[start : start + 2])
    total = int(re.findall(r"about (\d+) hours", line)[0])
    paths = [int(n) for n in re.findall(r"path (\d+)", line)]
    assert total == round(sum(p.study_min for p in plans.values()) / 60), line
    want = sorted(
        round(sum(plans[n].study_min for n in catalog.path_lessons(name) if n in plans) / 60) for name in catalog.PATHS
    )
    assert sorted(paths) == want, f"README's path hours {paths} are not the table's {want}: {line}"
