"""The runner-wide guard: a learner's function must be the learner's own code.

Every exercise asks for something course_lib already implements (the lessons import the
reference implementations), so a submission that hands the work to course_lib passes every
value check. :func:`course_lib.course.grading.checks.run_exercise` therefore guards every
exercise of every lesson twice:

* **Statically, before any check** (:func:`static_refusal`): the learner's function, what it
  wraps (``functools.partial``, ``functools.wraps``, ``jax.jit``), its closure, defaults, and
  every code object in it, with the learner's own helper functions beside it, are walked for
  course_lib modules and functions (imports, attribute access, module names in strings,
  :func:`~course_lib.course.grading.helpers.library_references`).
* **At run time, during every check** (:class:`CallTracer`): a trace hook records each call
  into course_lib's code made directly from the learner's code, however the learner reached
  it (``importlib`` with a computed name, ``__import__``, ``sys.modules``, ``getattr``). A
  call from a library (numpy, jax, torch, the grader itself) on the learner's behalf is not
  the learner's call; a wrapper around a library function is caught statically.

* **Copies** (:func:`copied_from`): learner code whose bytecode is a course_lib function's (its
  source pasted into the notebook, or its file read and compiled there) is refused as that
  function, statically and at run time; short functions (a sort key) are not compared.

An exercise names the course_lib pieces it may legitimately use (a model, an environment,
the result and error types of its contract) in ``Exercise.allowed``, as dotted names or
prefixes (``"course_lib.lm.model.TinyLM"`` allows the class and its methods). What the
grader hands to the learner (its fakes, layers and callbacks, defined in
``course_lib.course.grading``) may be called; naming the grader's code in the learner's own
(an import of its oracles) is refused statically like any other course_lib code.

An exercise that is one compiled JAX program (``Exercise.compiled``) also refuses a host
callback (``jax.pure_callback``, ``io_callback``, ``jax.debug.callback``): that leaves the
program the exercise teaches.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: What a refused submission's guard check is called in reports.
GUARD_DESCRIPTION = "written as your own code, not course_lib's"
#: The package whose implementations the learner must not hand the work to.
LIBRARY = ("course_lib",)
#: The grader's own package: what it hands the learner (fakes, layers, callbacks) may be
#: called at run time; the static walk still refuses the learner's code naming it.
GRADING = "course_lib.course.grading"
#: jax's host-callback functions: calling one leaves the compiled program.
HOST_CALLBACKS = frozenset({"pure_callback", "io_callback", "callback", "debug_callback", "id_tap", "call"})
_HOST_CALLBACK_MODULES = ("jax._src.callback", "jax._src.debug", "jax.experimental.host_callback")

_COURSE_LIB_DIR = str(Path(__file__).resolve().parents[2]) + os.sep


def _library_dirs() -> tuple[str, ...]:
    """Folders of installed code (the standard library and site-packages): not the learner's."""
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(str(Path(path).resolve()) + os.sep)
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        dirs.add(str(Path(prefix).resolve() / "lib") + os.sep)
    return tuple(sorted(dirs))


_LIBRARY_DIRS = _library_dirs()


def is_allowed(name: str, allowed: Iterable[str]) -> bool:
    """``name`` (a dotted name) is one of ``allowed`` or lies under one of them."""
    return any(name == a or name.startswith(a + ".") for a in allowed)


def refusal_message(name: str, used: list[str], advice: str) -> str:
    """The one line a refused submission gets: what it used and what to write instead."""
    more = f" (and {', '.join(used[1:3])})" if len(used) > 1 else ""
    how = f", {advice}" if advice else " from the building blocks the statement names"
    return (
        f"{name} uses {used[0]}{more}, the library's own implementation: write {name} yourself{how}; "
        "the checks grade your code, not course_lib's"
    )


def process_message(name: str, what: str) -> str:
    """The one line a submission that starts a process while it is checked gets."""
    return (
        f"{name} started a process ({what}) while it was checked: calls made in another process are out of the "
        "checks' sight, so the exercise is graded in one process; compute the result in your own code"
    )


def static_refusal(fn: Any, name: str, allowed: Iterable[str], advice: str, compiled: bool = False) -> str | None:
    """The refusal message when ``fn`` names course_lib code it may not use (or, for a compiled
    exercise, a host callback); ``None`` when it is the learner's own code."""
    from course_lib.course.grading.helpers import library_references

    allowed = tuple(allowed)
    used = [ref for ref in library_references(fn, LIBRARY) if not is_allowed(ref, allowed)]
    used += [f"a copy of {src}" for src in _copies_in(fn) if not is_allowed(src, allowed) and src not in used]
    if used:
        return refusal_message(name, used, advice)
    if compiled:
        callbacks = _callback_names(fn)
        if callbacks:
            return callback_message(name, callbacks[0])
    return None


def _copies_in(fn: Any) -> list[str]:
    """course_lib functions whose bytecode the learner's ``fn`` (under its wrappers, with the
    code nested in it) repeats."""
    while isinstance(fn, types.MethodType) or getattr(fn, "__wrapped__", None) is not None:
        fn = fn.__func__ if isinstance(fn, types.MethodType) else fn.__wrapped__
    code = getattr(fn, "__code__", None)
    if code is None:
        code = getattr(vars(type(fn)).get("__call__"), "__code__", None)
    found: list[str] = []
    stack = [code] if isinstance(code, types.CodeType) else []
    while stack:
        current = stack.pop()
        source = copied_from(current)
        if source is not None and source not in found:
            found.append(source)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return found


def callback_message(name: str, callback: str) -> str:
    return (
        f"{name} calls {callback}, a host callback: the exercise is one compiled JAX program, so write "
        "that step with jax.numpy and jax.lax inside the program instead of calling back into Python"
    )


def _callback_names(fn: Any) -> list[str]:
    """Host-callback names the learner's code (and its own helpers) reads."""
    found: list[str] = []
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        while isinstance(obj, types.MethodType) or getattr(obj, "__wrapped__", None) is not None:
            obj = obj.__func__ if isinstance(obj, types.MethodType) else obj.__wrapped__
        if (
            not isinstance(obj, types.FunctionType)
            or id(obj) in seen
            or not _is_learner_file(obj.__code__, obj.__globals__.get("__name__"))
        ):
            return
        seen.add(id(obj))
        stack = [obj.__code__]
        while stack:
            code = stack.pop()
            for n in code.co_names:
                if n in {"pure_callback", "io_callback", "host_callback", "id_tap"} and n not in found:
                    found.append(f"jax's {n}")
                value = obj.__globals__.get(n)
                if isinstance(value, types.FunctionType):
                    visit(value)
            if "debug" in code.co_names and "callback" in code.co_names:
                found.append("jax.debug.callback")
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))

    visit(fn)
    return found


# ---------------------------------------------------------------------------------------
# The run-time half: who called course_lib
# ---------------------------------------------------------------------------------------

_LEARNER: dict[types.CodeType, bool] = {}
_TARGET: dict[types.CodeType, str | None] = {}


def _is_learner_file(code: types.CodeType, module: str | None = None) -> bool:
    """Code the learner wrote: not course_lib's, not installed (stdlib, site-packages), not frozen.

    Source without a file (``<...>``: a cell exec'd by a test, ``<ipython-input-...>``) is the
    learner's unless ``module`` (the running frame's ``__name__``) says otherwise: the
    ``__init__`` a dataclass generates runs as ``<string>`` in its class's module."""
    known = _LEARNER.get(code)
    if known is not None:
        return known
    filename = code.co_filename
    if filename.startswith("<frozen") or filename.startswith(_COURSE_LIB_DIR):
        result = False
    elif filename.startswith("<"):
        result = module is None or not _installed_module(module)
    else:
        try:
            resolved = str(Path(filename).resolve())
        except (OSError, ValueError):
            resolved = filename
        result = not (resolved.startswith(_COURSE_LIB_DIR) or resolved.startswith(_LIBRARY_DIRS))
    _LEARNER[code] = result
    return result


def _installed_module(module: str) -> bool:
    """``module`` is course_lib's or an installed package's (not the learner's notebook or files)."""
    if module.startswith("course_lib"):
        return True
    if module == "__main__":  # a notebook's or a script's own namespace
        return False
    top = sys.modules.get(module.split(".")[0])
    path = getattr(top, "__file__", None) if top is not None else None
    if not path:
        return top is not None and module.split(".")[0] in sys.builtin_module_names
    return str(Path(path).resolve()).startswith((_COURSE_LIB_DIR, *_LIBRARY_DIRS))


def _is_accessor(module: str, qualname: str) -> bool:
    """``Class.attr`` is a property (or cached property) of a course_lib class: reading a field of
    an input the grader hands over (``params.total_mass``) is not handing the work to course_lib."""
    import functools

    parts = qualname.split(".")
    if len(parts) != 2:
        return False
    owner = getattr(sys.modules.get(module), parts[0], None)
    attr = vars(owner).get(parts[1]) if isinstance(owner, type) else None
    return isinstance(attr, property | functools.cached_property)


#: Fewest instructions a function must have for its bytecode to be compared with course_lib's:
#: a short function (``return a + b``, a sort key) may well be written the same way independently.
MIN_COPY_INSTRUCTIONS = 40
_FINGERPRINTS: dict[bytes, str] = {}
_FINGERPRINTED_MODULES: set[str] = set()


def _library_copies() -> dict[bytes, str]:
    """``bytecode -> dotted name`` of every function (and nested function) that the loaded
    course_lib modules outside the course tooling define: learner code with the same bytecode
    is a copy of it (its source pasted, or read and compiled in the notebook), whatever it is
    called. Grows as modules load."""
    for module_name, module in list(sys.modules.items()):
        if (
            module is None
            or module_name in _FINGERPRINTED_MODULES
            or not (module_name == "course_lib" or module_name.startswith("course_lib."))
            or module_name.startswith("course_lib.course")
        ):
            continue
        _FINGERPRINTED_MODULES.add(module_name)
        stack: list[tuple[Any, str]] = []
        for attr, value in list(vars(module).items()):
            if getattr(value, "__module__", None) != module_name:
                continue
            if isinstance(value, types.FunctionType):
                stack.append((value.__code__, f"{module_name}.{attr}"))
            elif isinstance(value, type):
                for member, inner in vars(value).items():
                    func = inner.fget if isinstance(inner, property) else getattr(inner, "__func__", inner)
                    if isinstance(func, types.FunctionType):
                        stack.append((func.__code__, f"{module_name}.{attr}.{member}"))
        while stack:
            code, dotted = stack.pop()
            if _long_enough(code):
                _FINGERPRINTS.setdefault(code.co_code, dotted)
            stack.extend((c, dotted) for c in code.co_consts if isinstance(c, types.CodeType))
    return _FINGERPRINTS


def copied_from(code: types.CodeType) -> str | None:
    """The course_lib function whose bytecode ``code`` (learner code) repeats, if any."""
    if not _long_enough(code):
        return None
    return _library_copies().get(code.co_code)


def _long_enough(code: types.CodeType) -> bool:
    """At least :data:`MIN_COPY_INSTRUCTIONS` instructions (inline caches not counted)."""
    import dis

    if len(code.co_code) < 2 * MIN_COPY_INSTRUCTIONS:
        return False
    return sum(1 for i in dis.get_instructions(code) if i.opname != "CACHE") >= MIN_COPY_INSTRUCTIONS


def _target_name(code: types.CodeType, module: str) -> str | None:
    """The dotted name of ``code`` if calling it from learner code counts as using course_lib
    (or, with ``callback:`` in front, a jax host callback); else None."""
    name: str | None = None
    qualname = getattr(code, "co_qualname", code.co_name)
    if code.co_filename.startswith(_COURSE_LIB_DIR) and module.startswith("course_lib"):
        if module == GRADING or module.startswith(GRADING + "."):
            name = None  # the grader's fakes, layers and callbacks are handed to the learner to call
        elif qualname != "<module>" and not _is_accessor(module, qualname):
            name = f"{module}.{qualname.replace('.<locals>', '')}"
    elif module.startswith(_HOST_CALLBACK_MODULES) and code.co_name in HOST_CALLBACKS:
        name = f"callback:{module}.{code.co_name}"
    elif _is_learner_file(code, module or None):
        source = copied_from(code)
        name = f"copy:{source}" if source is not None else None
    _TARGET[code] = name
    return name


#: How many installed-code frames (torch, jax, functools, ...) a call may pass through on its
#: way from the learner's code to course_lib's and still count as the learner's call.
MAX_LIBRARY_FRAMES = 40


def _called_by_learner(frame: types.FrameType) -> bool:
    """The nearest caller of ``frame`` that is not installed code (the standard library,
    site-packages) is the learner's code: a direct call, or one handed through ``map``,
    ``torch.utils.checkpoint``, ``jax.lax.scan`` and the like. A call from course_lib's own
    code (the grader's checks, a library function calling another) is not."""
    back = frame.f_back
    for _ in range(MAX_LIBRARY_FRAMES):
        if back is None:  # the bottom of a thread's stack: whoever started the thread made the call
            return bool(getattr(threading.current_thread(), _STARTED_BY_LEARNER, False))
        code = back.f_code
        module = back.f_globals.get("__name__")
        if _is_learner_file(code, module):
            return True
        if code.co_filename.startswith(_COURSE_LIB_DIR) or (module or "").startswith("course_lib"):
            return False
        back = back.f_back
    return False


#: Set on each thread started while a :class:`CallTracer` is active: whether the learner's code
#: started it (directly, or through ``concurrent.futures`` and the like). A call whose stack
#: reaches the bottom of such a thread, with course_lib's function as the thread's (or the
#: pool's) target and no learner frame in between, is the learner's call.
_STARTED_BY_LEARNER = "_course_lib_started_by_learner"


class CallTracer:
    """Record, while active, each course_lib function (not in ``allowed``) called directly from
    the learner's code, and each host callback so called.

    Use as a context manager around one check; ``used`` and ``callbacks`` hold what was found,
    in order. It is a global trace function (``sys.settrace``), which Python calls once per
    Python-level call and never per line here (it returns no local tracer), so it costs far less
    than a profile hook, which also sees every C call and every return. It chains to a trace
    function already installed (a debugger's, coverage's)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = tuple(allowed)
        self.used: list[str] = []
        self.callbacks: list[str] = []
        self._previous: Callable[..., Any] | None = None
        self._previous_threading: Callable[..., Any] | None = None
        self._thread_start: Callable[..., Any] | None = None
        self.processes: list[str] = []
        self._patched: list[tuple[Any, str, Any]] = []

    def _trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        target = _TARGET[code] if code in _TARGET else _target_name(code, frame.f_globals.get("__name__", "") or "")
        if target is not None and (target.startswith("copy:") or _called_by_learner(frame)):
            self._record(target)
        return self._previous(frame, event, arg) if self._previous is not None else None

    def _record(self, target: str) -> None:
        if target.startswith("copy:"):
            source = target.removeprefix("copy:")
            if not is_allowed(source, self.allowed):
                copy = f"a copy of {source}"
                if copy not in self.used:
                    self.used.append(copy)
        elif target.startswith("callback:"):
            name = target.removeprefix("callback:")
            if name not in self.callbacks:
                self.callbacks.append(name)
        elif not is_allowed(target, self.allowed) and target not in self.used:
            self.used.append(target)

    def __enter__(self) -> CallTracer:
        self._previous = sys.gettrace()
        self._previous_threading = threading.gettrace()
        sys.settrace(self._trace)
        threading.settrace(self._trace)
        self._thread_start = start = threading.Thread.start

        def traced_start(thread: threading.Thread, *args: Any, **kwargs: Any) -> Any:
            setattr(thread, _STARTED_BY_LEARNER, _called_by_learner(sys._getframe(0)))
            return start(thread, *args, **kwargs)

        threading.Thread.start = traced_start  # type: ignore[method-assign,assignment]
        self._refuse_processes()
        return self

    def _refuse_processes(self) -> None:
        """While active, a process the learner's code starts (``multiprocessing``,
        ``concurrent.futures.ProcessPoolExecutor``, ``os.fork``) is refused: its calls into
        course_lib would run where this tracer cannot see them. Processes that course_lib's
        own code (a grader's harness) starts are not the learner's and go ahead."""
        import multiprocessing.process

        def refusing(owner: Any, attr: str, what: str) -> None:
            original = getattr(owner, attr)

            def start(*args: Any, **kwargs: Any) -> Any:
                if _called_by_learner(sys._getframe(0)):
                    if what not in self.processes:
                        self.processes.append(what)
                    raise PermissionError(f"{what} is not allowed while an exercise is checked")
                return original(*args, **kwargs)

            self._patched.append((owner, attr, original))
            setattr(owner, attr, start)

        refusing(multiprocessing.process.BaseProcess, "start", "multiprocessing")
        if hasattr(os, "fork"):
            refusing(os, "fork", "os.fork")

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._patched):
            setattr(owner, attr, original)
        self._patched.clear()
        if self._thread_start is not None:
            threading.Thread.start = self._thread_start  # type: ignore[method-assign]
        sys.settrace(self._previous)
        threading.settrace(self._previous_threading)  # type: ignore[arg-type,unused-ignore]
