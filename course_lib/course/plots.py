"""Figures shared by the lessons. Every figure gets a title, labelled axes with units,
and the lesson prints a one-line takeaway under it."""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

PART_COLOURS = {
    "foundations": "#cfe2f3",
    "actor-learner": "#d9ead3",
    "accelerator": "#fff2cc",
    "LLM RL systems": "#f4cccc",
    "capstone": "#d9d2e9",
}


def lesson_depths() -> dict[int, int]:
    """Column of each lesson in the map: 1 + the deepest lesson it requires."""
    from course_lib.course.catalog import LESSONS

    depth: dict[int, int] = {}
    for lesson in LESSONS:  # LESSONS is ordered so that requirements come first
        depth[lesson.number] = 1 + max((depth[r] for r in lesson.requires), default=-1)
    return depth


#: the map's geometry, in data units: column pitch, row pitch, box width and height
MAP_COLUMN, MAP_ROW, MAP_BOX_W, MAP_BOX_H = 2.9, 1.15, 2.1, 0.85

Node = tuple[int, int]  # (lesson, 0) for a lesson's box; (lesson it leads to, column) for a waypoint


def _crossings(order: dict[int, list[Node]], links: list[tuple[Node, Node]]) -> int:
    """Pairs of links between the same two adjacent columns that cross."""
    rank = {node: i for column in order.values() for i, node in enumerate(column)}
    count = 0
    for i, (a, b) in enumerate(links):
        for c, d in links[i + 1 :]:
            if (rank[a] - rank[c]) * (rank[b] - rank[d]) < 0:
                count += 1
    return count


def map_layout() -> tuple[dict[int, tuple[float, float]], list[list[tuple[float, float]]]]:
    """Where the course map puts each lesson's box (its centre) and each arrow (a polyline).

    The arrows are the transitive reduction of the catalog's ``requires``
    (:func:`~course_lib.course.catalog.direct_requires`). Columns are prerequisite depths; an
    arrow that skips columns passes each of them through a waypoint with a row of its own, so
    it runs in the gaps between boxes and never across one. The rows of each column are
    ordered to minimise crossings (every order of each column in turn, until none improves).
    """
    import itertools

    from course_lib.course.catalog import direct_requires

    depth = lesson_depths()
    reduced = direct_requires()
    order: dict[int, list[Node]] = {}
    for n in sorted(depth):
        order.setdefault(depth[n], []).append((n, 0))
    chains: list[list[Node]] = []
    for n, needs in reduced.items():
        for r in needs:
            chain: list[Node] = [(r, 0)]
            for col in range(depth[r] + 1, depth[n]):
                waypoint = (n, -1 - len(chains) * 100 - col)  # unique per arrow and column
                order[col].append(waypoint)
                chain.append(waypoint)
            chains.append([*chain, (n, 0)])
    links = [(a, b) for chain in chains for a, b in itertools.pairwise(chain)]
    best = _crossings(order, links)
    improved = True
    while improved and best:
        improved = False
        for col in sorted(order):
            if len(order[col]) > 6:
                continue
            for perm in itertools.permutations(order[col]):
                trial = {**order, col: list(perm)}
                count = _crossings(trial, links)
                if count < best:
                    order, best, improved = trial, count, True

    def place(node: Node) -> tuple[float, float]:
        col = next(c for c, column in order.items() if node in column)
        i, size = order[col].index(node), len(order[col])
        return col * MAP_COLUMN, -(i - (size - 1) / 2) * MAP_ROW

    boxes = {n: place((n, 0)) for n in depth}
    half = MAP_BOX_W / 2
    arrows = []
    for chain in chains:
        (x0, y0), (x1, y1) = place(chain[0]), place(chain[-1])
        points = [(x0 + half, y0)]
        for waypoint in chain[1:-1]:
            x, y = place(waypoint)
            points += [(x - half, y), (x + half, y)]
        arrows.append([*points, (x1 - half, y1)])
    return boxes, arrows


def course_map(ax: Axes | None = None) -> Figure:
    """Draw the lessons as boxes in columns of prerequisite depth, with an arrow from each
    direct prerequisite (:func:`map_layout`). Lessons whose source exists are drawn solid,
    planned ones dashed (named in the legend only when there is one)."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    from course_lib.course.catalog import LESSONS

    boxes, arrows = map_layout()
    if ax is None:
        fig, ax = plt.subplots(figsize=(13, 3.9))
    else:
        fig = ax.get_figure(root=True)  # type: ignore[assignment]
    w, h = MAP_BOX_W, MAP_BOX_H
    style = dict(color="#777777", lw=0.9)
    for points in arrows:
        ax.plot([p[0] for p in points[:-1]], [p[1] for p in points[:-1]], zorder=1, solid_capstyle="butt", **style)  # type: ignore[arg-type]
        ax.annotate(
            "",
            xy=points[-1],
            xytext=points[-2],
            zorder=1,
            arrowprops=dict(arrowstyle="-|>", shrinkA=0, shrinkB=1, mutation_scale=9, **style),
        )
    planned = False
    for lesson in LESSONS:
        x, y = boxes[lesson.number]
        planned |= not lesson.available()
        box = FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.02",
            facecolor=PART_COLOURS[lesson.part],
            edgecolor="#333333",
            linestyle="-" if lesson.available() else "--",
            lw=1.0,
            zorder=2,
        )
        ax.add_patch(box)
        title = "\n".join(textwrap.wrap(lesson.title.split(":")[0], 17))
        ax.text(x, y, f"{lesson.number:02d}\n{title}", ha="center", va="center", fontsize=6.5, zorder=3)
    xs = [p[0] for p in boxes.values()]
    ys = [p[1] for p in boxes.values()]
    ax.set_xlim(min(xs) - w / 2 - 0.2, max(xs) + w / 2 + 0.2)
    ax.set_ylim(min(ys) - h / 2 - 0.2, max(ys) + h / 2 + 0.2)
    columns = sorted({p[0] for p in boxes.values()})
    ax.set_xticks(columns)
    ax.set_xticklabels([str(round(c / MAP_COLUMN)) for c in columns])
    ax.set_yticks([])
    ax.set_xlabel("prerequisite depth (lessons that must come before, along the longest chain)")
    ax.set_title("Efficient RL Systems: the lessons; each arrow leads from a lesson to one built directly on it")
    handles: list[Patch] = [Patch(facecolor=c, edgecolor="#333333", label=p) for p, c in PART_COLOURS.items()]
    if planned:
        handles.append(Patch(facecolor="white", edgecolor="#333333", linestyle="--", label="planned"))
    ax.legend(handles=handles, loc="upper left", fontsize=7, ncol=len(handles), frameon=False, bbox_to_anchor=(0, -0.2))
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_aspect("equal")
    fig.tight_layout()
    return fig
