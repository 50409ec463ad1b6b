"""The helper layer every lesson's checks module shares.

:mod:`course_lib.course.grading.checks` is the framework (exercises, checks, the runner)
and its basic assertions; this module holds what the lessons' checks kept writing again
around them: calling the learner's function on copies of its inputs, naming the call in
a message, requiring a scalar torch tensor, an exception or a numpy (not torch) result,
naming a known mistake when a wrong answer matches one, and seeding torch without
touching the caller's random state. A lesson module (``lessons/lNN_slug.py``) then holds
only its exercises' specifics: oracles, inputs, checks and hints.

Messages stay deterministic (no timings, addresses or random values), as the in-notebook
check prints them and nbval compares them verbatim.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from course_lib.course.grading.checks import call, copy_input, describe_type, fail, fmt_number


def call_on_copies(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's ``fn`` on copies of every argument (see :func:`~.checks.copy_input`),
    so that a check can reuse its inputs however the learner's code treats them."""
    return call(fn, *(copy_input(a) for a in args), **{k: copy_input(v) for k, v in kwargs.items()})


def call_text(name: str, *parts: str, **kwargs: Any) -> str:
    """How a message names a call: ``name(part, ..., key=value, ...)``.

    ``parts`` are written as given (e.g. ``"rewards of shape (3, 5)"``), keyword values
    with :func:`~.checks.fmt_number` (``None`` as ``None``).
    """
    named = [f"{k}={fmt_number(v) if v is not None else None}" for k, v in kwargs.items()]
    return f"{name}({', '.join([*parts, *named])})"


def fail_if_known_mistake(
    got: Any,
    mistakes: Mapping[str, Any],
    *,
    expected: Any = None,
    what: str = "",
    rtol: float = 1e-6,
    atol: float = 1e-8,
    equal_nan: bool = False,
) -> None:
    """Fail with the message of the first known mistake whose answer ``got`` matches.

    Args:
        got: the learner's answer (numbers, array-like).
        mistakes: ``{message: what that mistake returns}``, tried in order; a value may be
            a function of no arguments, called only when its turn comes.
        expected: the right answer; when given, a mistake whose answer equals it is
            skipped (the two cannot be told apart).
        what: when given, the message is ``"{what}: {message}"``.
        rtol, atol, equal_nan: closeness, as in ``np.allclose``; shapes must be equal.
    """
    arr = np.asarray(got, dtype=np.float64)
    for message, answer in mistakes.items():
        wrong = np.asarray(answer() if callable(answer) else answer, dtype=np.float64)
        if expected is not None and np.shape(expected) == wrong.shape and np.allclose(wrong, expected):
            continue
        if arr.shape == wrong.shape and np.allclose(arr, wrong, rtol=rtol, atol=atol, equal_nan=equal_nan):
            fail(f"{what}: {message}" if what else message)


def assert_scalar_tensor(out: Any, *, what: str, advice: str, type_text: Callable[[Any], str] = describe_type) -> Any:
    """Require a 0-d torch tensor (a loss) and return it.

    Args:
        out: what the learner's function returned.
        what: how messages name the call.
        advice: said when ``out`` is not a tensor, e.g. ``"autograd needs it: don't call .item()"``.
        type_text: how that message describes what ``out`` is.
    """
    import torch

    if out is None:
        fail(f"{what} is None; did you forget to `return` the loss?")
    if not isinstance(out, torch.Tensor):
        fail(f"{what} is {type_text(out)}; expected a torch tensor ({advice})")
    if out.dim() != 0:
        fail(f"{what} has shape {tuple(out.shape)}; expected a scalar (shape ()): average over the samples")
    return out


def assert_numpy_result(got: Any, name: str) -> None:
    """Fail when the learner's ``name`` returned a torch tensor where a numpy array is expected."""
    import torch

    if isinstance(got, torch.Tensor):
        fail(f"{name} returned a torch tensor; return a numpy array (np.asarray(...))")


def assert_raises(
    error: type[Exception],
    fn: Callable[..., Any],
    *args: Any,
    other_error: Callable[[Exception], str],
    no_error: str,
) -> None:
    """Require ``fn(*args)`` to raise ``error``.

    The stub's ``NotImplementedError`` passes through (the check reports "not implemented
    yet"); another exception fails with ``other_error(exc)``, a normal return with
    ``no_error``.
    """
    try:
        fn(*args)
    except error:
        return
    except NotImplementedError:
        raise
    except Exception as exc:
        fail(other_error(exc))
    fail(no_error)


@contextlib.contextmanager
def torch_seeded(seed: int) -> Iterator[None]:
    """Seed torch inside the block without touching the caller's global random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
