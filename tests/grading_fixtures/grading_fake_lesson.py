"""A made-up two-exercise lesson, so tests can grade several exercises in one notebook.

Importable in the kernel too: tests put this folder on PYTHONPATH.
"""

from course_lib.course.grading.checks import Exercise, assert_true, call, check_case


@check_case("square(3) is 9")
def _square(fn):
    got = call(fn, 3)
    assert_true(got == 9, f"square(3) returned {got!r}; expected 9")


@check_case("double(4) is 8")
def _double(fn):
    got = call(fn, 4)
    assert_true(got == 8, f"double(4) returned {got!r}; expected 8")


EXERCISES = (
    Exercise("square", points=5, checks=(_square,), hints=("multiply x by itself",)),
    Exercise("double", points=5, checks=(_double,), hints=("add x to itself",)),
)
