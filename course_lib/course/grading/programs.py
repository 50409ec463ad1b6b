"""Probes of a compiled JAX program, shared by the graders of lessons 04-06.

An exercise that is one compiled JAX program is graded on the program as well as its values:
its jaxpr (``jax.make_jaxpr``), walked into every nested program (jit, scan, while, cond,
custom derivatives, shard_map), must hold no host callback. (The runner's guard,
:mod:`course_lib.course.grading.guard`, also refuses a call of ``jax.pure_callback`` from the
learner's code in an exercise marked ``compiled``; the jaxpr sees ``jax.debug.print`` too.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from course_lib.course.grading.checks import fail

#: Primitives that leave the compiled program for Python on the host: ``jax.pure_callback``,
#: ``jax.experimental.io_callback``, ``jax.debug.print`` and ``jax.debug.callback``.
HOST_CALLBACKS = ("pure_callback", "io_callback", "debug_callback", "debug_print")


def all_eqns(jaxpr: Any) -> Iterator[Any]:
    """Every equation of ``jaxpr`` and of the programs nested in it (jit, scan, while, cond,
    custom derivatives, shard_map), outermost first."""
    from jax.extend import core as jcore

    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, list | tuple) else (param,):
                if isinstance(sub, jcore.ClosedJaxpr):
                    yield from all_eqns(sub.jaxpr)
                elif isinstance(sub, jcore.Jaxpr):
                    yield from all_eqns(sub)


def host_callbacks(jaxpr: Any) -> list[str]:
    """The host-callback primitives anywhere in ``jaxpr`` (sorted, each once)."""
    names = {e.primitive.name for e in all_eqns(jaxpr)}
    return sorted(n for n in names if n in HOST_CALLBACKS or "callback" in n)


def refuse_host_callbacks(jaxpr: Any, what: str) -> None:
    """Fail when the program ``jaxpr`` (a ``Jaxpr``, the ``.jaxpr`` of ``jax.make_jaxpr``'s
    result) calls back to the host: the exercise is one compiled JAX program, and a callback
    runs Python on the host at every call (a device-host round trip, a sync, numpy instead
    of XLA) even though the numbers come out right."""
    found = host_callbacks(jaxpr)
    if found:
        fail(
            f"{what} leaves the compiled program: its jaxpr holds {', '.join(found)}, Python run on the host at "
            "every call (jax.pure_callback, io_callback, jax.debug.print, jax.debug.callback); write it with "
            "jax.numpy and jax.lax only, and remove debugging prints"
        )
