"""The watchdog: a block that finishes is untouched; a block that hangs ends the process
with a clear message and exit code 124, instead of hanging."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from course_lib.runtime.watchdog import WATCHDOG_EXIT, watchdog


def test_finished_block_is_untouched():
    with watchdog(5, "a short sleep"):
        time.sleep(0.01)
    # the process is still alive and later blocks work too
    with watchdog(5, "another"):
        pass


def test_hanging_block_ends_the_process_with_a_clear_error():
    code = (
        "import time\nfrom course_lib.runtime.watchdog import watchdog\n"
        "with watchdog(0.5, 'a deliberately stuck step'):\n    time.sleep(60)\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert time.monotonic() - start < 20
    assert proc.returncode == WATCHDOG_EXIT
    assert "WATCHDOG: a deliberately stuck step did not finish" in proc.stderr
    assert "Likely cause" in proc.stderr and "LAPACK" in proc.stderr
    assert "time.sleep" in proc.stderr or "line 4" in proc.stderr  # the Python stack of the stuck thread


def test_bad_seconds_refused():
    with pytest.raises(ValueError, match="seconds must be > 0"), watchdog(0, "nothing"):
        pass
