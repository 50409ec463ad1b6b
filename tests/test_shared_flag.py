"""SharedFlag, the stop signal of lessons 03 and 07's systems: no child killed or frozen
while reading it can wedge the parent's set() (a multiprocessing.Event's lock could)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time

import pytest

from course_lib.runtime.processes import SharedFlag, live_children


def _read_until_set(flag: SharedFlag) -> None:
    while not flag.is_set():  # as an actor's loop does, but as often as it can
        pass


def _set_after(flag: SharedFlag, seconds: float) -> None:
    time.sleep(seconds)
    flag.set()


def _set_within(flag: SharedFlag, seconds: float) -> bool:
    """Call ``flag.set()`` in a thread; whether it returned within ``seconds`` (no hang)."""
    setter = threading.Thread(target=flag.set, daemon=True)
    setter.start()
    setter.join(seconds)
    return not setter.is_alive()


@pytest.mark.timeout(120)
def test_readers_killed_mid_read_do_not_wedge_set_and_a_new_reader_sees_it():
    ctx = mp.get_context("spawn")
    flag = SharedFlag(ctx)
    for _ in range(3):  # an mp.Event here is left locked by a killed reader (it reads under its lock)
        reader = ctx.Process(target=_read_until_set, args=(flag,), daemon=True)
        reader.start()
        time.sleep(0.3)  # well inside its loop
        os.kill(reader.pid, signal.SIGKILL)
        reader.join(30)
        assert reader.exitcode == -signal.SIGKILL
    assert _set_within(flag, 5.0), "set() blocked"
    assert flag.is_set()
    late = ctx.Process(target=_read_until_set, args=(flag,), daemon=True)
    late.start()
    late.join(60)
    assert late.exitcode == 0  # it saw the flag and returned
    assert not live_children()


@pytest.mark.timeout(120)
def test_wait_times_out_unset_and_returns_when_another_process_sets_it():
    ctx = mp.get_context("spawn")
    flag = SharedFlag(ctx)
    start = time.monotonic()
    assert flag.wait(0.1) is False
    assert time.monotonic() - start >= 0.1
    setter = ctx.Process(target=_set_after, args=(flag, 0.2), daemon=True)
    setter.start()
    assert flag.wait(60.0) is True
    setter.join(30)
    assert setter.exitcode == 0 and flag.is_set()
