"""The lesson catalog's prerequisites, the paths through the course and the course-map figure
(course_lib.course.catalog, course_lib.course.plots.map_layout / course_map)."""

from __future__ import annotations

import itertools
import re

import matplotlib

from course_lib.course import catalog, plots
from course_lib.course.paths import repo_root

matplotlib.use("Agg")

Point = tuple[float, float]


def _segments(points: list[Point]) -> list[tuple[Point, Point]]:
    return list(itertools.pairwise(points))


def _cuts_box(p: Point, q: Point, centre: Point, pad: float = 0.0) -> bool:
    """Whether the segment p-q passes through the inside of the box at ``centre`` (Liang-Barsky)."""
    x0, x1 = centre[0] - plots.MAP_BOX_W / 2 - pad, centre[0] + plots.MAP_BOX_W / 2 + pad
    y0, y1 = centre[1] - plots.MAP_BOX_H / 2 - pad, centre[1] + plots.MAP_BOX_H / 2 + pad
    dx, dy = q[0] - p[0], q[1] - p[1]
    lo, hi = 0.0, 1.0
    for step, room in ((-dx, p[0] - x0), (dx, x1 - p[0]), (-dy, p[1] - y0), (dy, y1 - p[1])):
        if step == 0:
            if room < 0:
                return False
            continue
        t = room / step
        if step < 0:
            lo = max(lo, t)
        else:
            hi = min(hi, t)
    return hi - lo > 1e-9


def _cross(a: tuple[Point, Point], b: tuple[Point, Point]) -> bool:
    """A proper crossing of two segments (touching at an end, as arrows sharing a box do, is not one)."""

    def orient(p: Point, q: Point, r: Point) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    (p1, p2), (p3, p4) = a, b
    d1, d2, d3, d4 = orient(p3, p4, p1), orient(p3, p4, p2), orient(p1, p2, p3), orient(p1, p2, p4)
    return d1 * d2 < -1e-12 and d3 * d4 < -1e-12


# --------------------------------------------------------------------------- the catalog


def test_prerequisites_the_lessons_state():
    """Lesson 10 builds on 03's actor-learner and 04's jitted PPO (its "Builds on" line); 11 on 05's collectives."""
    assert catalog.get_lesson(10).requires == (3, 4)
    assert 5 in catalog.get_lesson(11).requires


def test_every_builds_on_line_names_only_prerequisites():
    """The lessons a lesson's "Builds on" line names are among what the catalog says it needs."""
    root = repo_root()
    for lesson in catalog.LESSONS[1:]:
        text = lesson.source(root).read_text(encoding="utf-8")
        match = re.search(r"^# Builds on (.*?)(?:\n#\s*\n|\n\n|\n# %%)", text, re.M | re.S)
        assert match, f"{lesson.id} has no 'Builds on' line"
        named = {int(n) for n in re.findall(r"\b(\d\d)\b", match.group(1))}
        assert named, f"{lesson.id}: the 'Builds on' line names no lesson"
        assert named <= set(catalog.closure(lesson.requires)), (lesson.id, named, lesson.requires)


def test_direct_requires_is_the_transitive_reduction():
    reduced = catalog.direct_requires()
    for lesson in catalog.LESSONS:
        # the same lessons are needed, through the reduced arrows as through requires
        assert set(catalog.closure(reduced[lesson.number])) == set(catalog.closure(lesson.requires))
        for r in reduced[lesson.number]:  # and no arrow is implied by another
            others = [o for o in reduced[lesson.number] if o != r]
            assert r not in catalog.closure([m for o in others for m in catalog.get_lesson(o).requires] + others)
    assert reduced[10] == (4,) and reduced[11] == (5, 8, 9, 10) and reduced[4] == (3,)


def test_the_two_paths():
    assert catalog.path_lessons("accelerator path") == (0, 1, 2, 3, 4, 5, 6)
    llm = catalog.path_lessons("LLM-systems path")
    assert {0, 1, 2, 3, 7, 8, 9, 10, 11, 12} <= set(llm) and 5 in llm and 6 not in llm
    for name in catalog.PATHS:  # a path holds everything each of its lessons needs
        lessons = set(catalog.path_lessons(name))
        assert all(set(catalog.get_lesson(n).requires) <= lessons for n in lessons)


# --------------------------------------------------------------------------- the map


def test_map_arrows_are_the_reduction_left_to_right():
    boxes, arrows = plots.map_layout()
    assert set(boxes) == {lesson.number for lesson in catalog.LESSONS}
    edges = sum(len(v) for v in catalog.direct_requires().values())
    assert len(arrows) == edges
    for points in arrows:
        assert all(p[0] < q[0] for p, q in _segments(points) if p[1] != q[1] or p[0] != q[0])


def test_no_arrow_crosses_a_box_or_another_arrow():
    boxes, arrows = plots.map_layout()
    centres = list(boxes.values())
    for i, a in enumerate(centres):  # boxes do not overlap
        for b in centres[i + 1 :]:
            assert abs(a[0] - b[0]) >= plots.MAP_BOX_W or abs(a[1] - b[1]) >= plots.MAP_BOX_H
    for points in arrows:
        for p, q in _segments(points):
            cut = [c for c in centres if _cuts_box(p, q, c)]
            assert not cut, f"the arrow {points} passes through the box at {cut}"
    for i, a in enumerate(arrows):
        for b in arrows[i + 1 :]:
            crossing = [(s, t) for s in _segments(a) for t in _segments(b) if _cross(s, t)]
            assert not crossing, f"arrows {a} and {b} cross"


def test_the_checks_see_a_bad_arrow():
    boxes, _ = plots.map_layout()
    (x0, y0), (x2, y2) = boxes[0], boxes[2]
    assert _cuts_box((x0, y0), (x2, y2), boxes[1])  # 00 -> 02 straight through 01
    assert _cross(((0, 0), (1, 1)), ((0, 1), (1, 0)))
    assert not _cross(((0, 0), (1, 1)), ((0, 0), (1, -1)))  # two arrows leaving one box


def test_map_legend_names_only_what_is_drawn():
    import matplotlib.pyplot as plt

    fig = plots.course_map()
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        parts = {lesson.part for lesson in catalog.LESSONS}
        planned = any(not lesson.available() for lesson in catalog.LESSONS)
        assert set(labels) == parts | ({"planned"} if planned else set())
        assert "dashed" not in ax.get_title() and "planned" not in ax.get_title()
        texts = [t.get_text() for t in ax.texts]
        assert all(any(t.startswith(f"{n.number:02d}\n") for t in texts) for n in catalog.LESSONS)
    finally:
        plt.close(fig)
