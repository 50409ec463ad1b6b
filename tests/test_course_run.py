"""`course run`: executes lessons headless into the output folder and prints a table."""

import os
import subprocess
import sys

import nbformat


def test_run_lesson_00_writes_executed_copy_and_table(tmp_path):
    env = {**os.environ, "COURSE_OUTPUT_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "course_lib", "run", "00"], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("00_welcome"))
    assert row.split()[-1] == "ok" and float(row.split()[1]) > 0
    assert "running lessons (cpu)" in done.stderr  # the progress bar
    executed = nbformat.read(tmp_path / "run" / "cpu" / "00_welcome.ipynb", as_version=4)
    first = next(c for c in executed.cells if c.cell_type == "code")
    assert "scale: cpu" in first.outputs[0].text


def test_run_rejects_unknown_lesson_and_scale():
    done = subprocess.run([sys.executable, "-m", "course_lib", "run", "77"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no lesson named '77'" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "course_lib", "run", "00", "--scale", "gpu"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "invalid choice: 'gpu'" in done.stderr
