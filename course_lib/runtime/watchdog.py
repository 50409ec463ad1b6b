"""A watchdog for computations that may hang: a clear error and a dead process instead.

A hung XLA computation cannot be interrupted from Python: the thread that waits in
``block_until_ready`` sits in C++ and ignores exceptions and ``KeyboardInterrupt``. So
the only honest way out of a hang is to end the process, after saying why. That is what
:func:`watchdog` does: it runs a block, and if the block has not finished after
``seconds`` it writes what was running, for how long, the likely cause and the Python
stack of every thread to the process's standard error, then exits with
:data:`WATCHDOG_EXIT` (124, the code of coreutils' ``timeout``). In a Jupyter kernel the
kernel dies with that message in its log; under pytest the run ends with it; a parent
that launched the process (:mod:`course_lib.runtime.jax_processes`) reads the code.

Lesson 05 runs every multi-device program under one::

    with watchdog(60, "data-parallel PPO on 2 CPU devices"):
        params = jax.block_until_ready(train(params, key))
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress

#: Exit status of a process that the watchdog ended (as coreutils' ``timeout``).
WATCHDOG_EXIT = 124

#: What the message says about the cause when none is given.
DEFAULT_HINT = (
    "A multi-device XLA program on a CPU can deadlock when two devices run a LAPACK call "
    "(QR, Cholesky, eigh: jnp.linalg.*, jax.nn.initializers.orthogonal) at the same time; "
    "see course_lib.scaling.devices.check_multidevice_safe. Restart the kernel (or rerun the "
    "command); if it happens again, run this step in separate processes "
    "(course_lib.runtime.jax_processes)."
)


def _write_to_stderr(text: str) -> None:
    """Write to the process's real standard error (fd 2) and to ``sys.stderr`` if it differs
    (in a Jupyter kernel, ``sys.stderr`` is the cell's output stream)."""
    for stream in {id(s): s for s in (sys.__stderr__, sys.stderr) if s is not None}.values():
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass


@contextmanager
def watchdog(seconds: float, what: str, hint: str = DEFAULT_HINT) -> Iterator[None]:
    """Run the ``with`` block; end the process with a clear error if it takes longer than ``seconds``.

    Args:
        seconds: how long the block may take (wall clock), more than its slowest honest run.
        what: what the block does, for the message (``"ring all-reduce on 4 CPU devices"``).
        hint: the likely cause and what to do, for the message.

    The block must *finish* its work inside (call ``jax.block_until_ready`` on results):
    JAX dispatches asynchronously, so an unblocked block returns before the computation
    ends and the watchdog would watch nothing.
    """
    if not seconds > 0:
        raise ValueError(f"watchdog seconds must be > 0, got {seconds!r}")
    done = threading.Event()
    start = time.monotonic()

    def expire() -> None:
        if done.wait(seconds):
            return
        _write_to_stderr(
            f"\nWATCHDOG: {what!s} did not finish in {time.monotonic() - start:.1f} s "
            f"(limit {seconds:g} s); ending process {os.getpid()} with exit code {WATCHDOG_EXIT}.\n"
            f"Likely cause: {hint}\nPython stacks of every thread:\n"
        )
        with suppress(OSError, ValueError):
            faulthandler.dump_traceback(file=2, all_threads=True)
        os._exit(WATCHDOG_EXIT)

    timer = threading.Thread(target=expire, name=f"watchdog: {what}", daemon=True)
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.join()
