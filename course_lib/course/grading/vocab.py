"""The words the lessons' graders share, written once.

:mod:`~course_lib.course.grading.helpers` holds how a check calls the learner's function and
names known mistakes; this module holds the small vocabulary the lesson graders
(``lessons/lNN_slug.py``) kept writing again on top of it:

* reading a learner's value: :func:`as_int`, :func:`is_int`, :func:`as_real`;
* the stub let through a check's own handling of errors: :func:`pass_stub`;
* the refusal every statement asks for: :func:`assert_value_error` and its messages
  (:func:`not_value_error`, :func:`returned_instead_of_value_error`);
* hand-made cases pinned to their worked-out answers: :func:`pin_known`;
* a simulated run's verdict: :func:`fail_on_violation`;
* numpy's overflow warnings silenced while a check probes a learner's numerics:
  :func:`quiet_floats`.

Nothing here is an oracle: each grader keeps its own, written independently of the library it
checks. Messages stay deterministic and byte-identical to those the graders wrote before
(nbval compares the notebooks' stored outputs).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, TypeVar

import numpy as np

from course_lib.course.grading.checks import LearnerError, fail
from course_lib.course.grading.helpers import assert_raises

Case = TypeVar("Case")

# ---------------------------------------------------------------------------------------
# Reading a learner's value
# ---------------------------------------------------------------------------------------


def as_int(value: Any) -> int | None:
    """``value`` as an int if it is an integer (not a bool), else None."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        return None
    return int(value)


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (a Python or numpy int, not a bool)."""
    return as_int(value) is not None


def as_real(value: Any) -> float | None:
    """``value`` as a finite float if it is a real number (not a bool), else None."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


# ---------------------------------------------------------------------------------------
# Errors: the stub's, and ValueError where the statement asks for one
# ---------------------------------------------------------------------------------------


def pass_stub(exc: LearnerError) -> None:
    """Re-raise the stub's NotImplementedError, so the report says "not implemented yet"."""
    if isinstance(exc.error, NotImplementedError):
        raise exc


def not_value_error(what: str, why: str = "") -> Callable[[Exception], str]:
    """The message for ``what`` raising something other than ValueError:
    ``"{what} raised TypeError; expected ValueError{why}"``."""
    return lambda exc: f"{what} raised {type(exc).__name__}; expected ValueError{why}"


def returned_instead_of_value_error(what: str, why: str) -> str:
    """The message for ``what`` returning where it should raise: ``"{what} returned; expected
    ValueError ({why})"``."""
    return f"{what} returned; expected ValueError ({why})"


def assert_value_error(fn: Callable[..., Any], *args: Any, what: str, no_error: str, other: str = "") -> None:
    """Require ``fn(*args)`` to raise ValueError (the stub's NotImplementedError passes
    through): another exception fails with :func:`not_value_error` (``other`` appended), a
    return with ``no_error``."""
    assert_raises(ValueError, fn, *args, other_error=not_value_error(what, other), no_error=no_error)


# ---------------------------------------------------------------------------------------
# Hand-made cases and simulated runs
# ---------------------------------------------------------------------------------------


def pin_known(
    fn: Callable[..., Any],
    known: Iterable[tuple[Case, Any]],
    *,
    compare: Callable[[Callable[..., Any], Case], None],
    answer: Callable[[Callable[..., Any], Case], Any],
    text: Callable[[Case], str],
) -> None:
    """Hand-made cases with the answers worked out by hand: each case first against the oracle
    (``compare``, which names a known slip or explains the difference), then pinned to its
    answer (``"{text(case)}: got ...; expected ..."``), which the oracle agrees with by
    construction."""
    for case, want in known:
        compare(fn, case)
        got = answer(fn, case)
        if got != want:
            fail(f"{text(case)}: got {got}; expected {want}")


class SimulatedRun(Protocol):
    """A simulated run's record: ``violation`` is the first broken rule, or empty."""

    @property
    def violation(self) -> str | None: ...


def fail_on_violation(where: str, run: SimulatedRun) -> None:
    """Fail with the first rule the simulated run ``run`` broke, prefixed by ``where``."""
    if run.violation:
        fail(f"{where}: {run.violation}")


# ---------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_floats() -> Iterator[None]:
    """Silence numpy's floating-point errors and every warning inside the block: a check that
    feeds a learner's function extreme values reads the result, not the warnings on the way."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
