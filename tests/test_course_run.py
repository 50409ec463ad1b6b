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


LESSON = """# %% [markdown]
# # A lesson in miniature

# %%
import multiprocessing as mp
import time
print("first cell ran")
shared = 41

# %%
assert shared == 0, "a failing cell"

# %%
shared += 1
child = mp.get_context("forkserver").Process(target=time.sleep, args=(0.01,))
child.start()
child.join(30)
print(f"later cells ran: shared = {shared}, child exit code {child.exitcode}")
"""


def test_script_runner_goes_on_past_a_failing_cell_and_children_do_not_rerun_the_lesson(tmp_path):
    from course_lib.course.notebooks.script import code_cells

    lesson = tmp_path / "99_mini.py"
    lesson.write_text(LESSON)
    assert [line for line, _ in code_cells(lesson)] == [4, 10, 13]
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.course.notebooks.script", str(lesson)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one cell failed
    # a forkserver child imports __main__: had __main__ been the lesson, the child would run it again
    assert done.stdout.count("first cell ran") == 1, done.stdout
    assert "later cells ran: shared = 42, child exit code 0" in done.stdout
    assert "AssertionError: a failing cell" in done.stdout
    summary = done.stdout.splitlines()[-2:]
    assert summary[0].startswith(f"### SUMMARY {lesson.resolve()}: 3 cells run, 1 failed"), summary
    assert summary[1].startswith("###   FAILED [cell 1] line 10: AssertionError: a failing cell"), summary


def test_script_runner_names_bad_input():
    done = subprocess.run(
        [sys.executable, "-m", "course_lib.course.notebooks.script", "lessons/no_such_lesson.py"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "is not a file" in done.stderr


def test_run_no_kernel_writes_a_log_and_the_table(tmp_path):
    env = {**os.environ, "COURSE_OUTPUT_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "course_lib", "run", "00", "--no-kernel"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("00_welcome"))
    assert row.split()[-1] == "ok", row
    log = (tmp_path / "run" / "cpu" / "00_welcome.log").read_text()
    assert "scale: cpu" in log and "failed, " in log.splitlines()[-1] and " 0 failed" in log.splitlines()[-1]
