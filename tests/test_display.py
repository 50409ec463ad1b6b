"""course_lib.course.display: the progress bar leaves one plain line behind; show_source prints real code."""

from __future__ import annotations

import json

import nbformat
import pytest

from course_lib.course.display import progress, show_source, summary_line
from course_lib.course.notebooks.execute import execute_notebook
from course_lib.rl.pg import discounted_returns


def test_summary_line_says_how_far_the_work_got():
    assert summary_line("updates", 250, 250, "update") == "updates: 250/250 updates done"
    assert summary_line("model sizes", 3, 5, "size") == "model sizes: 3/5 sizes stopped early"
    assert summary_line("seeds", 1, 1, "seed") == "seeds: 1/1 seed done"
    assert summary_line("steps", 4, 4, "steps") == "steps: 4/4 steps done"


def test_outside_a_kernel_it_is_a_text_bar_on_stderr(capsys):
    with progress(3, "work", unit="item") as bar:
        for _ in range(3):
            bar.update()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "work" in captured.err and "3/3" in captured.err


def test_a_negative_total_is_refused_with_the_value():
    with pytest.raises(ValueError, match="-1"), progress(-1, "work"):
        pass


def test_show_source_prints_the_library_code(capsys):
    show_source(discounted_returns)
    out = capsys.readouterr().out
    assert out.startswith("# course_lib.rl.pg.discounted_returns\ndef discounted_returns(")
    assert "(00.1)" in out and "(00.2)" in out  # the docstring names the lesson's equations


def test_show_source_names_what_it_cannot_show():
    with pytest.raises(TypeError, match="function or class"):
        show_source(len)


def _run(cells: list[str], tmp_path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    execute_notebook(nb, tmp_path, allow_errors=True)
    return nb


def test_in_a_notebook_the_stored_output_is_the_summary_line_only(tmp_path):
    nb = _run(
        [
            "from course_lib.course.display import progress\n"
            "with progress(4, 'updates', unit='update') as bar:\n"
            "    for _ in range(4):\n"
            "        bar.update()\n"
            "print('after')",
            "with progress(5, 'sizes', unit='size') as bar:\n    bar.update(2)\n    raise RuntimeError('boom')",
        ],
        tmp_path,
    )
    first = nb.cells[0].outputs
    assert [o.output_type for o in first] == ["display_data", "stream"]
    assert first[0].data == {"text/plain": "updates: 4/4 updates done"}
    assert first[1].text == "after\n"
    second = nb.cells[1].outputs
    assert second[0].data == {"text/plain": "sizes: 2/5 sizes stopped early"}
    assert second[-1].output_type == "error" and second[-1].ename == "RuntimeError"
    stored = json.dumps([c.outputs for c in nb.cells])
    assert "%|" not in stored and "it/s" not in stored


def test_in_a_notebook_show_source_stores_the_source_as_plain_text(tmp_path):
    nb = _run(
        [
            "from course_lib.course.display import show_source\nfrom course_lib.rl.pg import discounted_returns\nshow_source(discounted_returns)"
        ],
        tmp_path,
    )
    (out,) = nb.cells[0].outputs
    assert out.data["text/plain"].startswith("# course_lib.rl.pg.discounted_returns\ndef discounted_returns(")
    assert "text/html" in out.data


def test_the_saved_widget_state_holds_no_timings(tmp_path):
    nb = _run(
        [
            "from course_lib.course.display import progress\nwith progress(3, 'updates', unit='update') as bar:\n    bar.update(3)"
        ],
        tmp_path,
    )
    state = json.dumps(nb.metadata.get("widgets", {}))
    assert "3/3" in state
    assert "update/s" not in state and "<00:00" not in state


def test_nbval_passes_on_an_executed_progress_cell_without_ignoring_it(tmp_path):
    """nbval does not apply display updates: it must read the same line the notebook stores."""
    import subprocess
    import sys

    from course_lib.course.notebooks.execute import write_notebook
    from course_lib.course.paths import repo_root

    nb = _run(
        [
            "from course_lib.course.display import progress\nwith progress(4, 'updates', unit='update') as bar:\n    bar.update(4)"
        ],
        tmp_path,
    )
    path = tmp_path / "progress.ipynb"
    write_notebook(nb, path)
    sanitize = repo_root() / "tests" / "nbval_sanitize.cfg"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path), "--nbval", "--nbval-current-env"]
    done = subprocess.run(
        [*cmd, "--nbval-sanitize-with", str(sanitize)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 passed" in done.stdout


def test_describe_lists_every_config_field_with_its_help():
    from dataclasses import dataclass, field

    from course_lib import describe

    @dataclass(frozen=True)
    class Config:
        lr: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
        name: str = field(default="a-rather-long-value-that-overflows-the-column", metadata={"help": "a name"})
        plain: int = 3

    lines = describe(Config()).splitlines()
    assert lines[0].startswith("lr    = 0.001") and lines[0].endswith("# Adam learning rate")
    assert lines[1].endswith("# a name") and "overflows" in lines[1]
    assert lines[2] == "plain = 3"  # no help metadata: no comment
    assert describe(Config(), exclude=("name", "plain")).count("\n") == 0
    with pytest.raises(TypeError, match="dataclass instance"):
        describe(Config)
