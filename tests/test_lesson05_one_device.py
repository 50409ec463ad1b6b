"""Lesson 05's full-scale code path on a machine with one device (issue 32).

``COURSE_MAX_DEVICES=1`` makes :func:`course_lib.scaling.devices.device_plan` see one device
of the default backend, as on a one-GPU machine: the single-device sections take the
full-scale path and the meshes move to CPU host devices beside it. The whole lesson runs
headless (``course run 05 --scale full --no-kernel``) and every cell must pass.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(900)


def test_lesson05_runs_at_full_scale_with_one_device(tmp_path):
    env = {**os.environ, "COURSE_OUTPUT_DIR": str(tmp_path), "COURSE_MAX_DEVICES": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "course_lib", "run", "05", "--scale", "full", "--no-kernel", "--lesson-timeout", "800"],
        capture_output=True,
        text=True,
        timeout=850,
        env=env,
    )
    log = (tmp_path / "run" / "full" / "05_scaling_jax.log").read_text()
    assert done.returncode == 0, done.stdout + done.stderr + log[-4000:]
    assert "scale: full" in log
    assert "only 1 cpu device(s), fewer than the 4 the meshes need" in log  # the one-device plan was taken
    assert " 0 failed" in log.splitlines()[-1], log[-4000:]
