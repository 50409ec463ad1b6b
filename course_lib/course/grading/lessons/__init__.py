"""The registry of graded exercises: one checks module per lesson.

Lesson ``NN_slug``'s checks live in ``course_lib/course/grading/lessons/lNN_slug.py`` (a module
name cannot start with a digit), which defines ``EXERCISES: tuple[Exercise, ...]``. A
lesson without such a module has no graded exercises. Adding a lesson's exercises is
adding that one module; nothing here changes.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from course_lib.course.catalog import get_lesson
from course_lib.course.grading.checks import Exercise


def module_name(lesson_id: str) -> str:
    """The dotted name of lesson ``lesson_id``'s checks module (``...lessons.l00_welcome``)."""
    return f"{__name__}.l{get_lesson(lesson_id).id}"


def _load(lesson_id: str, module: str | None) -> ModuleType | None:
    name = module or module_name(lesson_id)
    if module is None and importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def exercises_for(lesson_id: str, module: str | None = None) -> tuple[Exercise, ...]:
    """The graded exercises of ``lesson_id``, in order (empty if it has none).

    Args:
        lesson_id: a lesson name :func:`course_lib.course.catalog.get_lesson` accepts.
        module: load the exercises from this dotted module instead of the lesson's own
            (tests use it to grade against made-up lessons).

    Raises:
        KeyError: if ``lesson_id`` is not a lesson.
    """
    mod = _load(lesson_id, module)
    if mod is None:
        return ()
    return tuple(mod.EXERCISES)


def get_exercise(lesson_id: str, name: str, module: str | None = None) -> Exercise:
    """The exercise ``name`` of lesson ``lesson_id``.

    Raises:
        KeyError: naming the lesson's exercises when there is no such exercise.
    """
    exercises = exercises_for(lesson_id, module)
    for exercise in exercises:
        if exercise.name == name:
            return exercise
    names = ", ".join(e.name for e in exercises) or "none"
    raise KeyError(f"lesson {get_lesson(lesson_id).id} has no exercise named {name!r} (its exercises: {names})")
