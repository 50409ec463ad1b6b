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
import re
import types
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


# ---------------------------------------------------------------------------------------
# The learner's function must be the learner's: what it names from course_lib (guard.py uses it)
# ---------------------------------------------------------------------------------------


_DOTTED = re.compile(r"(?<![\w.])[A-Za-z_]\w*(?:\.\w+)+|(?<![\w.])course_lib\b")


def _under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _library_name(obj: Any, packages: tuple[str, ...]) -> str | None:
    """``obj``'s dotted name when it is a module under ``packages`` or a function, class or
    callable object defined there (a callable instance reads its class's module); else None."""
    import types

    if isinstance(obj, types.ModuleType):
        return obj.__name__ if _under(obj.__name__, packages) else None
    try:
        module = getattr(obj, "__module__", None)
    except Exception:
        return None
    if not (isinstance(module, str) and callable(obj) and _under(module, packages)):
        return None
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__name__
    return f"{module}.{name}"


#: Values too common to tell where they came from (small ints and strings are shared).
_PLAIN = (int, float, complex, str, bytes, bool, type(None), type, types.ModuleType)


def _library_data(packages: tuple[str, ...]) -> dict[int, str]:
    """``id -> dotted name`` of the data constants (tables, specs, arrays, configs) that the
    loaded modules under ``packages`` define: reading one is reading the library's answer
    when the answer is data (a layout of PartitionSpecs, say)."""
    import sys

    found: dict[int, str] = {}
    for module_name, module in list(sys.modules.items()):
        if module is None or not _under(module_name, packages) or module_name.startswith("course_lib.course"):
            continue
        for attr, value in list(vars(module).items()):
            if attr.startswith("__") or isinstance(value, _PLAIN) or callable(value):
                continue
            if getattr(value, "__module__", None) == module_name and isinstance(value, type):
                continue
            found.setdefault(id(value), f"{module_name}.{attr}")
    return found


def library_references(fn: Any, packages: tuple[str, ...]) -> list[str]:
    """The implementations from ``packages`` (dotted module prefixes, e.g.
    ``("course_lib.scaling",)``) that the learner's ``fn`` is, wraps or names, in the order
    found; empty when it is the learner's own code.

    A static walk, so nothing is run: ``fn`` itself (its ``__module__``); what it wraps
    (``functools.partial``'s function and arguments, ``__wrapped__`` as ``functools.wraps``,
    ``jax.jit`` and ``jax.checkpoint`` set it, a bound method's function); its closure cells
    and default arguments; and its code and every code object nested in it (inner
    functions, lambdas, comprehensions): each global name resolved in ``fn.__globals__``,
    each ``import`` statement and each string constant naming a module under ``packages``.
    A module under ``packages`` is reported by the attributes the code reads from it
    (``collectives.ring_allreduce``), a parent package (``import course_lib``) when the code
    reads the rest of the path. Functions defined in the learner's namespace (the same
    globals) are walked in turn; anything else (jax, numpy, optax, the grader's helpers
    passed as arguments) is only looked up, never walked.
    """
    import dis
    import functools
    import sys
    import types

    found: list[str] = []
    seen: set[int] = set()
    namespaces: set[int] = set()

    def note(name: str) -> None:
        if name not in found:
            found.append(name)

    def note_module(module: types.ModuleType, names: set[str], depth: int = 0) -> None:
        """The module, or the library functions (and submodules) the code reads from it."""
        specific = False
        for attr in sorted(names):
            value = getattr(module, attr, None)
            name = _library_name(value, packages)
            if name is None:
                continue
            specific = True
            if isinstance(value, types.ModuleType) and depth < 4:
                note_module(value, names - {attr}, depth + 1)
            else:
                note(name)
        if not specific:
            note(module.__name__)

    def parent_of_library(module: types.ModuleType, names: set[str]) -> None:
        """``import course_lib`` then ``course_lib.scaling.collectives...``: the rest of a
        package's path read as attributes."""
        for package in packages:
            if package.startswith(module.__name__ + "."):
                rest = package[len(module.__name__) + 1 :].split(".")
                target = sys.modules.get(package)
                if all(part in names for part in rest) and target is not None:
                    note_module(target, names)

    def visit_code(code: types.CodeType, globals_: dict[str, Any]) -> None:
        names = set(code.co_names)
        for instr in dis.get_instructions(code):
            if instr.opname == "IMPORT_NAME" and isinstance(instr.argval, str):
                module = sys.modules.get(instr.argval)
                if _under(instr.argval, packages):
                    if module is not None:
                        note_module(module, names)
                    else:
                        note(instr.argval)
                elif module is not None:
                    parent_of_library(module, names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit_code(const, globals_)
            elif (
                isinstance(const, str) and _under(const, packages) and const.replace(".", "").replace("_", "").isalnum()
            ):
                module = sys.modules.get(const)
                if module is not None:
                    note_module(module, names)
                else:
                    note(const)
            elif isinstance(const, str):
                # a program in a string (run by exec, `python -c` or a subprocess) that imports it
                for dotted in _DOTTED.findall(const):
                    if _under(dotted, packages):
                        note(dotted)
        for name in code.co_names:
            if name not in globals_:
                continue
            value = globals_[name]
            if isinstance(value, types.ModuleType):
                if _under(value.__name__, packages):
                    note_module(value, names)
                else:
                    parent_of_library(value, names)
            elif _library_name(value, packages) is not None:
                visit(value, walk_code=False)
            elif id(value) in data:
                note(data[id(value)])
            elif isinstance(value, types.FunctionType) and id(value.__globals__) in namespaces:
                visit(value)  # the learner's own helper, defined beside fn
            elif isinstance(value, functools.partial) or hasattr(value, "__wrapped__"):
                visit(value, walk_code=False)

    def visit(obj: Any, walk_code: bool = True) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        name = _library_name(obj, packages)
        if name is not None:
            note(name)
            return
        if isinstance(obj, functools.partial):
            for inner in (obj.func, *obj.args, *obj.keywords.values()):
                if callable(inner):
                    visit(inner, walk_code)
            return
        if isinstance(obj, types.MethodType):
            visit(obj.__func__, walk_code)
            return
        try:
            wrapped = getattr(obj, "__wrapped__", None)
        except Exception:
            wrapped = None
        if wrapped is not None:
            visit(wrapped, walk_code=True)
        if not isinstance(obj, types.FunctionType):
            call_method = vars(type(obj)).get("__call__")  # a callable object of the learner's class
            if isinstance(call_method, types.FunctionType) and id(call_method.__globals__) in namespaces:
                visit(call_method)
            return
        own = id(obj.__globals__) in namespaces
        if not (walk_code or own):
            return
        for cell in obj.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(content) or isinstance(content, types.ModuleType):
                visit(content)
            elif id(content) in data:
                note(data[id(content)])
        for default in (*(obj.__defaults__ or ()), *(obj.__kwdefaults__ or {}).values()):
            if callable(default) or isinstance(default, types.ModuleType):
                visit(default)
            elif id(default) in data:
                note(data[id(default)])
        visit_code(obj.__code__, obj.__globals__)

    data = _library_data(packages)
    root = fn
    for _ in range(20):  # the learner's namespace: the globals of the function under the wrappers
        if isinstance(root, functools.partial):
            root = root.func
        elif isinstance(root, types.MethodType):
            root = root.__func__
        elif not isinstance(root, types.FunctionType) and getattr(root, "__wrapped__", None) is not None:
            root = root.__wrapped__
        else:
            break
    if isinstance(root, types.FunctionType):
        namespaces.add(id(root.__globals__))
    elif isinstance(vars(type(root)).get("__call__"), types.FunctionType):
        namespaces.add(id(vars(type(root))["__call__"].__globals__))
    visit(fn)
    return found
