"""The check framework: exercises, checks, assertion helpers and the in-process runner.

A lesson's checks module (``course_lib/course/grading/lessons/lNN_slug.py``) declares its
exercises with the pieces defined here::

    @check_case("hand-computed values")
    def _known_values(fn):
        got = call(fn, [1.0, 0.0, 2.0], [0, 0, 0], 0.5)
        assert_allclose(got, [1.5, 1.0, 2.0], what="discounted_returns(...)")

    EXERCISES = (Exercise("discounted_returns", points=10, checks=(_known_values,),
                          hints=("Loop backwards over t ...",)),)

A check receives the learner's function and raises :class:`CheckFailure` (the assertion
helpers do) when the answer is wrong. :func:`run_exercise` runs every check of an
exercise, each under its own time limit, and turns whatever happens (a wrong value, an
exception in the learner's code, an infinite loop, a stub that raises
``NotImplementedError``) into a one-line, deterministic :class:`CheckResult`.

What the lessons' checks share beyond these basics (calling on copies, naming a known
mistake, requiring a scalar tensor or an exception) is in
:mod:`course_lib.course.grading.helpers`.

Messages never contain timings, addresses or random values: the in-notebook
:func:`course_lib.course.grading.check` prints them, and nbval compares that output verbatim.
"""

from __future__ import annotations

import contextlib
import io
import math
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

#: Default time limit of one check, in seconds.
DEFAULT_CHECK_SECONDS = 10.0
#: The message every stub gets (its body is ``raise NotImplementedError("not implemented yet")``).
NOT_IMPLEMENTED = "not implemented yet"
#: Longest message a check result keeps (the rest is cut with "...").
MAX_MESSAGE_CHARS = 300

Status = Literal["pass", "fail", "error", "timeout", "not_implemented", "skipped"]
CheckFn = Callable[[Callable[..., Any]], None]


class CheckFailure(AssertionError):
    """The learner's answer is wrong; the message says how, in one line."""


class CheckTimeout(BaseException):
    """A check ran past its time limit.

    A ``BaseException`` so that a learner's ``except Exception:`` does not swallow it.
    """


class LearnerError(Exception):
    """The learner's function raised; carries the original exception and the call.

    Attributes:
        error: the exception the learner's code raised.
        call_repr: the call that raised it, e.g. ``discounted_returns([1.0], [0], 0.9)``.
    """

    def __init__(self, error: BaseException, call_repr: str) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.call_repr = call_repr


@dataclass(frozen=True)
class Check:
    """One check of an exercise.

    Attributes:
        description: what it verifies, shown before its failure message
            (e.g. ``"hand-computed values"``).
        fn: called with the learner's function; raises :class:`CheckFailure` when wrong.
        time_limit: seconds the check may take before it counts as an infinite loop.
    """

    description: str
    fn: CheckFn
    time_limit: float = DEFAULT_CHECK_SECONDS


def check_case(description: str, *, time_limit: float = DEFAULT_CHECK_SECONDS) -> Callable[[CheckFn], Check]:
    """Decorator that turns ``def f(fn): ...`` into a :class:`Check`.

    Args:
        description: what the check verifies (short, lower case, no trailing period).
        time_limit: seconds before the check counts as timed out.
    """

    def wrap(fn: CheckFn) -> Check:
        return Check(description=description, fn=fn, time_limit=time_limit)

    return wrap


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: the learner writes the function ``name``.

    Attributes:
        name: the function the learner implements (also the exercise's id).
        points: what passing every check is worth.
        checks: the checks, run in order.
        hints: tiered hints, gentlest first; reports show the first.
        title: a one-line description for reports.
        allowed: the course_lib pieces the learner's function may use (a model, an
            environment, the result and error types of the contract), as dotted names or
            prefixes; anything else from course_lib is refused (:mod:`.guard`).
        advice: what to write the function from, said when it is refused (e.g. "from
            jax.lax.ppermute and indexing").
        compiled: the exercise is one compiled JAX program: a host callback is refused.
    """

    name: str
    points: float
    checks: tuple[Check, ...]
    hints: tuple[str, ...] = ()
    title: str = ""
    allowed: tuple[str, ...] = ()
    advice: str = ""
    compiled: bool = False

    @property
    def hint(self) -> str:
        """The first (gentlest) hint, or ``""``."""
        return self.hints[0] if self.hints else ""


@dataclass(frozen=True)
class CheckResult:
    """What one check found.

    Attributes:
        description: the check's description.
        status: ``pass``, ``fail`` (wrong answer), ``error`` (the learner's code raised),
            ``timeout``, ``not_implemented`` (the stub) or ``skipped``.
        message: one line for the learner; empty when passed.
    """

    description: str
    status: Status
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_dict(self) -> dict[str, str]:
        return {"description": self.description, "status": self.status, "message": self.message}


@dataclass(frozen=True)
class ExerciseOutcome:
    """Every check result of one exercise, in order."""

    exercise: Exercise
    results: tuple[CheckResult, ...] = field(default_factory=tuple)

    @property
    def n_passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def n_checks(self) -> int:
        return len(self.results)

    @property
    def passed(self) -> bool:
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def message(self) -> str:
        """The first failure, as one line (``""`` when every check passed)."""
        return first_failure_message(self.results)


def first_failure_message(results: Sequence[CheckResult]) -> str:
    """One line describing the first failing check of ``results`` (``""`` if none failed)."""
    for r in results:
        if r.status == "not_implemented":
            return NOT_IMPLEMENTED
        if not r.passed and r.status != "skipped":
            return f"{r.description}: {r.message}" if r.description else r.message
    return ""


# ---------------------------------------------------------------------------------------
# Formatting values deterministically
# ---------------------------------------------------------------------------------------


def fmt_number(x: Any) -> str:
    """A number as short, stable text: ``1.9``, ``0.333333``, ``nan``, ``3``."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    try:
        f = float(x)
    except (TypeError, ValueError):
        return short_repr(x)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    text = f"{f:.6g}"
    return text if any(c in text for c in ".en") else text + ".0"  # 1.0 stays a float


def short_repr(value: Any, max_items: int = 6, max_chars: int = 80) -> str:
    """A short, deterministic description of an argument or a result.

    Sequences show their first ``max_items`` elements; objects without a useful repr
    show their type only (never a memory address).
    """
    if value is None or isinstance(value, (bool, str)):
        text = repr(value)
    elif isinstance(value, (int, float, np.number)):
        text = fmt_number(value)
    elif isinstance(value, np.ndarray):
        if value.ndim == 0:
            text = f"array({fmt_number(value.item())})"
        else:
            flat = [fmt_number(v) for v in value.ravel()[:max_items]]
            more = ", ..." if value.size > max_items else ""
            text = f"array([{', '.join(flat)}{more}], shape={tuple(value.shape)})"
    elif isinstance(value, (list, tuple)):
        items = [short_repr(v, max_items, max_chars) for v in value[:max_items]]
        more = f", ... ({len(value)} items)" if len(value) > max_items else ""
        open_, close = ("[", "]") if isinstance(value, list) else ("(", ")")
        text = f"{open_}{', '.join(items)}{more}{close}"
    else:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def describe_type(value: Any) -> str:
    """``a list of length 4``, ``None``, ``a float``, ``an ndarray of shape (3,)``."""
    if value is None:
        return "None"
    name = type(value).__name__
    article = "an" if name[:1].lower() in "aeiou" else "a"
    if isinstance(value, np.ndarray):
        return f"an array of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{article} {name} of length {len(value)}"
    return f"{article} {name}"


def _clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = " ".join(str(text).split())  # one line
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------------------------
# Calling the learner's function and asserting on what it returns
# ---------------------------------------------------------------------------------------


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's ``fn``; if it raises, re-raise as :class:`LearnerError` naming the call.

    Arguments are passed as given (pass copies if the check compares them afterwards).
    """
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # the learner's code: report, don't crash
        name = getattr(fn, "__name__", "the function")
        parts = [short_repr(a) for a in args] + [f"{k}={short_repr(v)}" for k, v in kwargs.items()]
        raise LearnerError(exc, f"{name}({', '.join(parts)})") from exc


def fail(message: str) -> None:
    """Fail the current check with ``message``."""
    raise CheckFailure(message)


def assert_true(condition: bool, message: str) -> None:
    """Fail with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailure(message)


def copy_input(x: Any) -> Any:
    """A deep enough copy of an input handed to learner code (array, tensor, nested list)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if hasattr(x, "detach"):
        return x.detach().clone()
    return [copy_input(v) if isinstance(v, list) else v for v in x] if isinstance(x, list) else x


def assert_inputs_unchanged(
    fn: Callable[..., Any],
    name: str,
    *extra: Any,
    leading: tuple[Any, ...] = (),
    advice: str = "work on a copy",
    **inputs: Any,
) -> None:
    """Call ``fn(*leading, *copies of inputs, *extra)`` and fail naming the first input it changed.

    ``inputs`` are passed positionally in the order given; a learner who computes in
    place in the caller's array gets "``name`` changed the `rewards` array it was given;
    ``advice``" (no advice when it is empty).
    """
    given = [copy_input(a) for a in inputs.values()]
    call(fn, *leading, *given, *extra)
    tail = f"; {advice}" if advice else ""
    for (arg, before), now in zip(inputs.items(), given, strict=True):
        kind = "tensor" if hasattr(before, "detach") else "array"
        old, new = (x.detach().numpy() if hasattr(x, "detach") else np.asarray(x) for x in (before, now))
        same = bool(np.array_equal(old, new))
        assert_true(same, f"{name} changed the `{arg}` {kind} it was given{tail}")


def assert_array(actual: Any, *, what: str = "the result", shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Require a numpy array (optionally of ``shape``) and return it.

    A list or tuple fails with a message that names its length and, when the length
    is also wrong, the expected shape.
    """
    if isinstance(actual, np.ndarray):
        if shape is not None:
            assert_shape(actual, shape, what=what)
        return actual
    if actual is None:
        fail(f"{what} is None; did you forget to `return` it?")
    if isinstance(actual, (list, tuple)) and shape is not None and len(shape) >= 1 and len(actual) != shape[0]:
        fail(f"{what} is {describe_type(actual)}; expected a numpy array of shape {shape}")
    expect = f" of shape {shape}" if shape is not None else ""
    fail(f"{what} is {describe_type(actual)}; expected a numpy array{expect} (return np.asarray(...))")
    raise AssertionError("unreachable")  # for type checkers


def assert_shape(actual: np.ndarray, shape: tuple[int, ...], *, what: str = "the result") -> None:
    """Require ``actual.shape == shape``."""
    if tuple(actual.shape) != tuple(shape):
        fail(f"{what} has shape {tuple(actual.shape)}; expected shape {tuple(shape)}")


def assert_float_dtype(actual: np.ndarray, *, what: str = "the result") -> None:
    """Require a floating-point dtype (integer or object arrays lose the fractions)."""
    if actual.dtype.kind != "f":
        fail(
            f"{what} has dtype {actual.dtype}; expected a float array "
            "(e.g. np.zeros(T, dtype=np.float64), not np.zeros_like of integer input)"
        )


def _index_text(index: tuple[int, ...]) -> str:
    return str(index[0]) if len(index) == 1 else str(list(index))


def assert_finite(actual: np.ndarray, *, what: str = "the result") -> None:
    """Require every element to be finite (no NaN, no inf)."""
    bad = ~np.isfinite(actual)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        fail(f"{what} contains {fmt_number(actual[index])} at index {_index_text(index)}; expected finite values")


def assert_allclose(
    actual: Any,
    expected: Any,
    *,
    what: str = "the result",
    rtol: float = 1e-6,
    atol: float = 1e-8,
    check_dtype: bool = True,
) -> None:
    """Require ``actual`` to be a numpy array equal to ``expected`` up to tolerance.

    Checks, in order, each with its own message: that it is an array, its shape, its
    dtype (float when ``expected`` is float and ``check_dtype``), that it has no
    NaN/inf where ``expected`` is finite, and its values (naming the first mismatching
    index, what it got and what was expected).

    Args:
        actual: what the learner's function returned.
        expected: the oracle's answer (array-like).
        what: how to name ``actual`` in messages, e.g. ``"discounted_returns(...)"``.
        rtol, atol: tolerances as in ``np.isclose``.
        check_dtype: require a float dtype when ``expected`` is float.
    """
    exp = np.asarray(expected)
    arr = assert_array(actual, what=what, shape=tuple(exp.shape))
    if arr.dtype.kind not in "biuf":
        fail(f"{what} has dtype {arr.dtype}; expected numbers")
    if check_dtype and exp.dtype.kind == "f":
        assert_float_dtype(arr, what=what)
    arr_f = arr.astype(np.float64)
    exp_f = exp.astype(np.float64)
    nonfinite = ~np.isfinite(arr_f) & np.isfinite(exp_f)
    if nonfinite.any():
        index = tuple(int(i) for i in np.argwhere(nonfinite)[0])
        fail(
            f"{what} contains {fmt_number(arr_f[index])} at index {_index_text(index)}; "
            f"expected {fmt_number(exp_f[index])}"
        )
    close = np.isclose(arr_f, exp_f, rtol=rtol, atol=atol, equal_nan=True)
    if not close.all():
        bad = np.argwhere(~close)
        index = tuple(int(i) for i in bad[0])
        fail(
            f"{what} is wrong at index {_index_text(index)}: got {fmt_number(arr_f[index])}, "
            f"expected {fmt_number(exp_f[index])} ({len(bad)} of {arr_f.size} values differ)"
        )


# ---------------------------------------------------------------------------------------
# Running checks: time limits, captured output, exceptions -> CheckResult
# ---------------------------------------------------------------------------------------


class _Discard(io.TextIOBase):
    """A text sink that swallows what the learner's code prints while it is checked."""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        return len(s)


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CheckTimeout` in the block once ``seconds`` have passed.

    Uses ``SIGALRM`` (``signal.setitimer``), so it only works on the main thread, which
    is where ipykernel executes cells; elsewhere, or when ``seconds`` is None, the block
    runs without a limit. The alarm repeats every 0.5 s, so code that swallows one
    :class:`CheckTimeout` is interrupted again.
    """
    usable = (
        seconds is not None
        and seconds > 0
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise CheckTimeout(seconds)

    previous_handler = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, float(seconds), 0.5)  # type: ignore[arg-type]
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous_handler)


def _describe_exception(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_check(
    check: Check, fn: Callable[..., Any], *, time_limit_s: float | None = None, tracer: Any = None
) -> CheckResult:
    """Run one check against ``fn``; never raises (except ``KeyboardInterrupt``).

    Anything ``fn`` prints meanwhile is discarded. ``time_limit_s`` caps the check's
    own ``time_limit``. ``tracer`` (a :class:`~.guard.CallTracer`), when given, is active
    while the check runs.
    """
    limit = check.time_limit if time_limit_s is None else min(check.time_limit, time_limit_s)
    desc = check.description
    sink = _Discard()
    watch = tracer if tracer is not None else contextlib.nullcontext()
    try:
        try:
            with time_limit(limit), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink), watch:
                check.fn(fn)
        except LearnerError as exc:
            inner = exc.error
            if isinstance(inner, NotImplementedError):
                return CheckResult(desc, "not_implemented", NOT_IMPLEMENTED)
            return CheckResult(desc, "error", _clip(f"raised {_describe_exception(inner)} in {exc.call_repr}"))
    except CheckTimeout:
        return CheckResult(desc, "timeout", f"did not finish within {limit:g} s (an infinite loop?)")
    except CheckFailure as exc:
        return CheckResult(desc, "fail", _clip(str(exc)))
    except NotImplementedError:
        return CheckResult(desc, "not_implemented", NOT_IMPLEMENTED)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return CheckResult(desc, "error", _clip(f"raised {_describe_exception(exc)}"))
    return CheckResult(desc, "pass")


def run_exercise(
    exercise: Exercise,
    fn: Any,
    *,
    time_limit_s: float | None = None,
    on_result: Callable[[CheckResult], None] | None = None,
) -> ExerciseOutcome:
    """Run every check of ``exercise`` against the learner's ``fn``, in order.

    Every exercise is guarded (:mod:`.guard`): a function that is, wraps or names course_lib
    code outside ``exercise.allowed`` fails a first check before any other runs, and a check
    during which the learner's code called such code (however it reached it) fails with the
    same message. After a refusal, a timeout or the stub, the remaining checks are skipped
    (they would only repeat it). ``on_result`` is called after each check, so a caller can
    record partial results as they come.

    Args:
        exercise: the exercise to check.
        fn: the learner's object bound to ``exercise.name`` (may not even be callable).
        time_limit_s: cap on every check's time limit, in seconds.
        on_result: callback receiving each :class:`CheckResult` as it is produced.
    """
    results: list[CheckResult] = []

    def record(result: CheckResult) -> None:
        results.append(result)
        if on_result is not None:
            on_result(result)

    if not callable(fn):
        record(CheckResult("", "fail", f"`{exercise.name}` is {describe_type(fn)}, not a function"))
        return ExerciseOutcome(exercise, tuple(results))
    from course_lib.course.grading import guard

    stop_reason = ""
    try:
        refusal = guard.static_refusal(fn, exercise.name, exercise.allowed, exercise.advice, exercise.compiled)
    except Exception as exc:  # a walk that breaks on an odd object must not stop the grading
        refusal = None
        _ = exc
    if refusal is not None:
        record(CheckResult(guard.GUARD_DESCRIPTION, "fail", _clip(refusal)))
        stop_reason = "not run: the function is refused (see the first check)"
    for chk in exercise.checks:
        if stop_reason:
            record(CheckResult(chk.description, "skipped", stop_reason))
            continue
        tracer = guard.CallTracer(exercise.allowed)
        result = run_check(chk, fn, time_limit_s=time_limit_s, tracer=tracer)
        if tracer.used:
            result = CheckResult(
                chk.description, "fail", _clip(guard.refusal_message(exercise.name, tracer.used, exercise.advice))
            )
            stop_reason = "not run: the function is refused (see above)"
        elif tracer.processes:
            result = CheckResult(
                chk.description, "fail", _clip(guard.process_message(exercise.name, tracer.processes[0]))
            )
            stop_reason = "not run: the function is refused (see above)"
        elif tracer.callbacks and exercise.compiled:
            result = CheckResult(
                chk.description, "fail", _clip(guard.callback_message(exercise.name, tracer.callbacks[0]))
            )
            stop_reason = "not run: the function is refused (see above)"
        record(result)
        if result.status == "timeout":
            stop_reason = "not run: an earlier check timed out"
        elif result.status == "not_implemented":
            stop_reason = f"not run: {NOT_IMPLEMENTED}"
    return ExerciseOutcome(exercise, tuple(results))
