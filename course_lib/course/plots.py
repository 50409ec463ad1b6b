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


def course_map(ax: Axes | None = None) -> Figure:
    """Draw the lessons as boxes in columns of prerequisite depth, with arrows from
    each prerequisite (dotted and drawn across the boxes it passes, where it skips a column).
    Lessons whose notebook exists are drawn solid, planned ones dashed."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    from course_lib.course.catalog import LESSONS

    depth = lesson_depths()
    columns: dict[int, list[int]] = {}
    for lesson in LESSONS:
        columns.setdefault(depth[lesson.number], []).append(lesson.number)
    pos = {}
    for col, numbers in columns.items():
        for row, n in enumerate(numbers):
            pos[n] = (col * 2.8, -(row - (len(numbers) - 1) / 2) * 1.25)
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 4.8))
    else:
        fig = ax.get_figure(root=True)  # type: ignore[assignment]
    w, h = 2.2, 0.9
    for lesson in LESSONS:
        x, y = pos[lesson.number]
        for r in lesson.requires:
            rx, ry = pos[r]
            skips = depth[lesson.number] - depth[r] > 1  # passes a column of other lessons: arc over them
            ax.annotate(
                "",
                xy=(x - w / 2, y + (h / 2 if skips else 0)),
                xytext=(rx + w / 2, ry + (h / 2 if skips else 0)),
                zorder=4 if skips else 1,  # over the boxes it crosses, so it cannot seem to leave one
                arrowprops=dict(
                    arrowstyle="->",
                    color="#888888",
                    lw=0.8,
                    ls=":" if skips else "-",
                    alpha=0.8 if skips else 1.0,
                    shrinkA=2,
                    shrinkB=2,
                    connectionstyle=f"arc3,rad={-0.45 if skips else -0.12}",
                ),
            )
        box = FancyBboxPatch(
            (x - w / 2, y - h / 2),
            w,
            h,
            boxstyle="round,pad=0.04",
            facecolor=PART_COLOURS[lesson.part],
            edgecolor="#333333",
            linestyle="-" if lesson.available() else "--",
            lw=1.0,
            zorder=2,
        )
        ax.add_patch(box)
        title = "\n".join(textwrap.wrap(lesson.title.split(":")[0], 20))
        ax.text(x, y, f"{lesson.number:02d}\n{title}", ha="center", va="center", fontsize=7.5, zorder=3)
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 1.4, max(xs) + 1.4)
    ax.set_ylim(min(ys) - 0.9, max(ys) + 0.9)
    ax.set_xticks(sorted({p[0] for p in pos.values()}))
    ax.set_xticklabels([str(c) for c in sorted(columns)])
    ax.set_yticks([])
    ax.set_xlabel("prerequisite depth (lessons that must come before, along the longest chain)")
    ax.set_title("Efficient RL Systems: lessons and what each builds on (solid = available, dashed = planned)")
    ax.legend(
        handles=[Patch(facecolor=c, edgecolor="#333333", label=p) for p, c in PART_COLOURS.items()],
        loc="upper left",
        fontsize=7,
        ncol=5,
        frameon=False,
        bbox_to_anchor=(0, -0.16),
    )
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig
