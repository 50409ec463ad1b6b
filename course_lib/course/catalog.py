"""The lesson map: one registry that the CLI, the course-map figure and the grader share.

A lesson id is ``NN_slug`` (``00_welcome``); the text source of a lesson is
``lessons/<id>.py`` and its executed notebook ``lessons/<id>.ipynb``. A lesson is
*available* once its source exists; the map lists the planned ones too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from course_lib.course.paths import repo_root


@dataclass(frozen=True)
class Lesson:
    """One lesson of the course.

    Attributes:
        number: position in the sequence (0-12; 12 is the capstone's second part).
        slug: short name used in file names.
        title: human title shown in the map and tables.
        requires: numbers of the lessons it builds on.
        part: the part of the course it belongs to (used to colour the map).
    """

    number: int
    slug: str
    title: str
    requires: tuple[int, ...]
    part: str

    @property
    def id(self) -> str:
        return f"{self.number:02d}_{self.slug}"

    def source(self, root: Path | None = None) -> Path:
        return (root or repo_root()) / "lessons" / f"{self.id}.py"

    def notebook(self, root: Path | None = None) -> Path:
        return (root or repo_root()) / "lessons" / f"{self.id}.ipynb"

    def exercise_source(self, root: Path | None = None) -> Path:
        return (root or repo_root()) / "exercises" / "src" / f"{self.id}.py"

    def available(self, root: Path | None = None) -> bool:
        return self.source(root).exists()


LESSONS: tuple[Lesson, ...] = (
    Lesson(0, "welcome", "Welcome and setup", (), "foundations"),
    Lesson(1, "policy_gradients", "Policy gradients: sample, grade, reinforce", (0,), "foundations"),
    Lesson(2, "importance_sampling", "Importance sampling: no free lunch", (1,), "foundations"),
    Lesson(3, "impala_vtrace", "IMPALA: actors, learner, V-trace", (1, 2), "actor-learner"),
    Lesson(4, "purejaxrl", "PureJaxRL: the whole loop on the accelerator", (1, 2, 3), "accelerator"),
    Lesson(5, "scaling_jax", "Scaling out in JAX", (4,), "accelerator"),
    Lesson(6, "off_policy_scale", "Off-policy at scale", (4, 5), "accelerator"),
    Lesson(7, "pipeline_rl", "Pipeline RL: in-flight weight updates", (1, 2, 3), "LLM RL systems"),
    Lesson(8, "cluster_layout", "Laying out the cluster", (7,), "LLM RL systems"),
    Lesson(9, "weight_sync", "Checkpoint-engine weight sync", (7,), "LLM RL systems"),
    Lesson(10, "fault_tolerance", "Fault tolerance and checkpointing", (3, 4), "LLM RL systems"),
    Lesson(11, "capstone", "Capstone: a multi-process asynchronous RL run", (5, 7, 8, 9, 10), "capstone"),
    Lesson(12, "capstone_ray", "Capstone, part 2: the same run on Ray", (11,), "capstone"),
)


def get_lesson(name: str | int) -> Lesson:
    """Find a lesson by number (``1``, ``"01"``), id (``"01_policy_gradients"``) or slug.

    Raises:
        KeyError: with the list of valid names when nothing matches.
    """
    key = str(name).strip().removesuffix(".ipynb").removesuffix(".py")
    key = Path(key).name
    for lesson in LESSONS:
        if key in (lesson.id, lesson.slug) or (key.isdigit() and int(key) == lesson.number):
            return lesson
    valid = ", ".join(lesson.id for lesson in LESSONS)
    raise KeyError(f"no lesson named {name!r}; choose a number (e.g. 0) or one of: {valid}")


def available_lessons(root: Path | None = None) -> list[Lesson]:
    """The lessons whose source exists in this checkout, in order."""
    return [lesson for lesson in LESSONS if lesson.available(root)]


def closure(numbers: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """``numbers`` and every lesson they need, directly or through another, in order."""
    needed: set[int] = set()
    todo = list(numbers)
    while todo:
        n = todo.pop()
        if n not in needed:
            needed.add(n)
            todo.extend(get_lesson(n).requires)
    return tuple(sorted(needed))


def direct_requires() -> dict[int, tuple[int, ...]]:
    """The transitive reduction of ``requires``: each lesson's prerequisites that no other of
    its prerequisites already needs (what the course map draws as arrows)."""
    out: dict[int, tuple[int, ...]] = {}
    for lesson in LESSONS:
        through = {m for r in lesson.requires for m in closure(get_lesson(r).requires)}
        out[lesson.number] = tuple(r for r in lesson.requires if r not in through)
    return out


#: the two paths through the course, each named by the lessons it ends with; a path is
#: those lessons and everything they need (:func:`closure`)
PATHS: dict[str, tuple[int, ...]] = {
    "LLM-systems path": (12,),
    "accelerator path": (6,),
}


def path_lessons(name: str) -> tuple[int, ...]:
    """The lessons of the path ``name`` (a key of :data:`PATHS`), in order."""
    return closure(PATHS[name])
