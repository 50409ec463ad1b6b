"""``course reset``: a participant's exercise notebook, or one exercise in it, back to its stub.

The participant's notebook is built in ``tmp_path`` from the generated exercise notebook,
with answers taken from the generated solution notebook (the same cell ids: both come
from ``exercises/src``), so these tests reset what participants really have. No kernel
runs except in the one grading test (lesson 00, numpy only).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.course import cli, reset
from course_lib.course.notebooks.source import render, targets_for
from course_lib.course.paths import repo_root

ROOT = repo_root()
LESSON = "01_policy_gradients"
LESSONS = sorted(p.stem for p in (ROOT / "exercises").glob("*.ipynb"))


@functools.cache
def _stub(lesson_id: str) -> nbformat.NotebookNode:
    return render(next(t for t in targets_for(lesson_id, ROOT) if t.kind == "exercise"))


def stub(lesson_id: str = LESSON) -> nbformat.NotebookNode:
    return copy.deepcopy(_stub(lesson_id))


def tags(cell) -> list[str]:
    return list(cell.metadata.get("tags", []))


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def exercise_ids(lesson_id: str, number: int) -> list[str]:
    """Ids of the stub's code cells of exercise ``number`` (what a reset restores)."""
    s = stub(lesson_id)
    ex = next(e for e in reset.stub_exercises(s) if e.number == number)
    return [s.cells[i].id for i in ex.cells if s.cells[i].cell_type == "code"]


def solved(lesson_id: str, numbers: tuple[int, ...] | None = None) -> nbformat.NotebookNode:
    """The committed exercise notebook with exercises ``numbers`` (default all) answered
    by the solution notebook's cells; outputs as committed."""
    nb = read(ROOT / "exercises" / f"{lesson_id}.ipynb")
    sol = {c.id: c for c in read(ROOT / "solutions" / f"{lesson_id}.ipynb").cells}
    pristine = by_id(stub(lesson_id))
    for ex in reset.stub_exercises(stub(lesson_id)):
        if numbers is not None and ex.number not in numbers:
            continue
        for cell in nb.cells:
            if cell.id in exercise_ids(lesson_id, ex.number) and "exercise" in tags(cell):
                cell.source = sol[cell.id].source
                assert cell.source != pristine[cell.id].source and "NotImplementedError" not in cell.source
    return nb


OWN_CELL = "my_notes = 'gamma 0.99 worked best'  # a participant's own cell\nprint(my_notes)"


def participant(tmp_path: Path, name: str = f"{LESSON}.ipynb") -> Path:
    """Lesson 01 with exercises 1 and 2 answered and a cell of the participant's own, with
    its output, after exercise 1's check."""
    nb = solved(LESSON, (1, 2))
    check1 = next(i for i, c in enumerate(nb.cells) if "exercise-check" in tags(c))
    own = nbformat.v4.new_code_cell(OWN_CELL)
    own.outputs = [nbformat.v4.new_output("stream", name="stdout", text="gamma 0.99 worked best\n")]
    own.execution_count = 42
    nb.cells.insert(check1 + 1, own)
    path = tmp_path / name
    nbformat.write(nb, path)
    return path


def course(*argv: str) -> int:
    return cli.main(["reset", *argv])


def backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(path.name + ".bak-*"))


def by_id(nb) -> dict[str, nbformat.NotebookNode]:
    return {c.id: c for c in nb.cells}


def assert_exercise_is_stub(nb, lesson_id: str, number: int) -> None:
    """Exercise ``number``'s code cells hold the stub's text and tags, no outputs, in the stub's order."""
    want = [(c.source, tags(c)) for c in stub(lesson_id).cells if c.id in exercise_ids(lesson_id, number)]
    s = stub(lesson_id)
    ex = next(e for e in reset.stub_exercises(s) if e.number == number)
    have = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if (cell.source, tags(cell)) in want or (set(reset.defined_names(cell.source)) & set(ex.names)):
            have.append(cell)
    assert [(c.source, tags(c)) for c in have] == want
    assert all(c.outputs == [] and c.execution_count is None for c in have)


# ---------------------------------------------------------------------------------------
# One exercise
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["2", "surrogate_loss", "Exercise 2"])
def test_reset_one_exercise_keeps_everything_else(tmp_path, capsys, spec):
    path = participant(tmp_path)
    before_bytes = path.read_bytes()
    before = read(path)
    assert course(str(path), "--exercise", spec) == 0
    out = capsys.readouterr().out
    after = read(path)
    ex2 = set(exercise_ids(LESSON, 2))
    # exercise 2 is the stub again
    assert_exercise_is_stub(after, LESSON, 2)
    assert "raise NotImplementedError" in by_id(after)["c013"].source
    # every other cell is exactly as it was: exercise 1's answer, the own cell and its output
    assert len(after.cells) == len(before.cells)
    for old, new in zip(before.cells, after.cells):
        if old.id not in ex2:
            assert new == old
    answer1 = by_id(after)["c006"].source
    assert "raise NotImplementedError" not in answer1 and "others = (r.sum(axis=1, keepdims=True) - r)" in answer1
    own = next(c for c in after.cells if c.source == OWN_CELL)
    assert own.outputs[0]["text"] == "gamma 0.99 worked best\n" and own.execution_count == 42
    # the backup holds the previous bytes, and the output says how to restore it
    (backup,) = backups(path)
    assert backup.read_bytes() == before_bytes
    assert re.fullmatch(re.escape(path.name) + r"\.bak-\d{8}-\d{6}", backup.name)
    assert f"to undo: cp {backup} {path}" in out
    assert "restored to the stub" in out and "exercise 2 · The surrogate loss:" in out
    # after the write: reload the tab from disk, and restart the kernel that holds the old answer
    assert "File > Reload Notebook from Disk" in out and "restart its kernel (Kernel > Restart Kernel)" in out
    nbformat.validate(after)


def test_cells_are_named_by_role_and_first_line_not_by_a_number_jupyter_does_not_show(tmp_path, capsys):
    path = participant(tmp_path)
    nb = read(path)
    answer = [c.id for c in nb.cells].index("c013")  # exercise 2's answer, below markdown cells
    assert nb.cells[answer - 1].cell_type == "markdown"
    first = nb.cells[answer].source.splitlines()[0]
    assert course(str(path), "-e", "2", "--dry-run") == 0
    out = capsys.readouterr().out
    # the position counts markdown cells too, and says so
    assert f"  answer cell `{first}` (the {answer + 1}th cell, counting markdown cells): restored to the stub" in out
    assert "  check cell `check(" in out and "  demo cell `" in out
    assert not re.search(r"\bcell \d+\b", out), out
    # a dry run writes nothing, so it has no reload/restart advice
    assert "Restart Kernel" not in out
    # the whole-notebook summary names the exercise each differing cell belongs to
    assert course(str(path), "--dry-run") == 0
    out = capsys.readouterr().out
    assert f"    exercise 2's answer cell `{first}` (the {answer + 1}th cell, counting markdown cells)" in out
    assert "    a cell under exercise 1 `my_notes = 'gamma 0.99 worked best'" in out  # the participant's own cell
    assert not re.search(r"\bcell \d+\b", out), out


def test_a_reinserted_cell_is_placed_by_its_neighbour_s_role(tmp_path, capsys):
    path = participant(tmp_path)
    _edit(path, lambda nb: nb.cells.remove(by_id(nb)["c015"]))  # exercise 2's check cell
    assert course(str(path), "-e", "2") == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "was missing" in line)
    assert re.fullmatch(
        r"  check cell `check\(.*` was missing: reinserted after its demo cell `.*` "
        r"\(the \d+th cell, counting markdown cells\)",
        line,
    ), line


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (1, "1st"),
        (2, "2nd"),
        (3, "3rd"),
        (4, "4th"),
        (11, "11th"),
        (12, "12th"),
        (13, "13th"),
        (21, "21st"),
        (22, "22nd"),
        (101, "101st"),
        (111, "111th"),
        (112, "112th"),
    ],
)
def test_ordinals(n, text):
    assert reset._ordinal(n) == text


def test_reset_two_exercises_and_comma_list(tmp_path):
    path = participant(tmp_path)
    assert course(str(path), "-e", "1,surrogate_loss") == 0
    after = read(path)
    assert_exercise_is_stub(after, LESSON, 1)
    assert_exercise_is_stub(after, LESSON, 2)
    assert any(c.source == OWN_CELL for c in after.cells)


def test_an_exercise_already_the_stub_changes_nothing(tmp_path, capsys):
    path = participant(tmp_path)
    assert course(str(path), "-e", "3") == 0  # its demo and check cells had outputs: cleared
    first = path.read_bytes()
    assert len(backups(path)) == 1
    assert course(str(path), "-e", "3") == 0
    assert "nothing to change" in capsys.readouterr().out
    assert path.read_bytes() == first and len(backups(path)) == 1


def test_dry_run_changes_nothing(tmp_path, capsys):
    path = participant(tmp_path)
    data = path.read_bytes()
    assert course(str(path), "-e", "2", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "restored to the stub" in out and "dry run: nothing was written" in out
    assert "+    raise NotImplementedError" in out  # the diff of what would be lost
    assert course(str(path), "--dry-run") == 0
    out = capsys.readouterr().out
    assert "would be replaced by the stub" in out and "cell(s) differ from the stub" in out
    assert path.read_bytes() == data and backups(path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


# ---------------------------------------------------------------------------------------
# Deleted, moved and merged cells
# ---------------------------------------------------------------------------------------


def _edit(path: Path, fn) -> None:
    nb = read(path)
    fn(nb)
    nbformat.write(nb, path)


def test_deleted_answer_cell_is_reinserted_after_the_statement_and_its_hints(tmp_path, capsys):
    path = participant(tmp_path)
    _edit(path, lambda nb: nb.cells.remove(by_id(nb)["c013"]))
    assert course(str(path), "-e", "2") == 0
    out = capsys.readouterr().out
    assert (
        "answer cell `def surrogate_loss(" in out
        and "was missing: reinserted after its text cell `<details><summary>Hint 3" in out
    )
    after = read(path)
    ids = [c.id for c in after.cells]
    assert ids[ids.index("c012") : ids.index("c012") + 4] == ["c012", "c013", "c014", "c015"]
    assert_exercise_is_stub(after, LESSON, 2)
    nbformat.validate(after)


def test_deleted_demo_and_check_cells_are_reinserted_after_the_answer(tmp_path, capsys):
    path = participant(tmp_path)
    _edit(path, lambda nb: [nb.cells.remove(by_id(nb)[i]) for i in ("c014", "c015")])
    assert course(str(path), "-e", "2") == 0
    assert capsys.readouterr().out.count("was missing: reinserted") == 2
    ids = [c.id for c in read(path).cells]
    assert ids.index("c013") + 1 == ids.index("c014") and ids.index("c014") + 1 == ids.index("c015")
    assert_exercise_is_stub(read(path), LESSON, 2)


def test_a_deleted_demo_among_two_is_put_back_in_order(tmp_path):
    path = tmp_path / f"{LESSON}.ipynb"
    nb = solved(LESSON)
    nb.cells.remove(by_id(nb)["c029"])  # the first of exercise 4's two demo cells
    nbformat.write(nb, path)
    assert course(str(path), "-e", "4") == 0
    after = read(path)
    ids = [c.id for c in after.cells]
    assert ids[ids.index("c027") :] == ["c027", "c028", "c029", "c030", "c031", "c032"]
    assert_exercise_is_stub(after, LESSON, 4)


def test_moved_answer_cell_is_restored_where_it_is(tmp_path, capsys):
    path = participant(tmp_path)

    def move(nb):
        cell = by_id(nb)["c013"]
        nb.cells.remove(cell)
        cell.id = "moved-by-me"
        nb.cells.append(cell)

    _edit(path, move)
    assert course(str(path), "-e", "surrogate_loss") == 0
    assert "found away from its heading" in capsys.readouterr().out
    after = read(path)
    assert after.cells[-1].id == "moved-by-me" and "raise NotImplementedError" in after.cells[-1].source
    assert sum("def surrogate_loss" in c.source for c in after.cells) == 1


def test_renamed_function_is_found_by_its_cell_id(tmp_path):
    path = participant(tmp_path)
    _edit(path, lambda nb: setattr(by_id(nb)["c013"], "source", "def my_loss(x):\n    return x"))
    assert course(str(path), "-e", "2") == 0
    assert_exercise_is_stub(read(path), LESSON, 2)
    assert "def my_loss" not in path.read_text()


def test_syntax_error_in_the_answer_is_still_matched(tmp_path):
    path = participant(tmp_path)
    _edit(
        path, lambda nb: setattr(by_id(nb)["c013"], "source", "def surrogate_loss(logits, actions, advantages:\n  x =")
    )
    assert course(str(path), "-e", "2") == 0
    assert_exercise_is_stub(read(path), LESSON, 2)


def test_without_heading_the_cells_go_before_the_check(tmp_path):
    path = participant(tmp_path)
    _edit(path, lambda nb: [nb.cells.remove(by_id(nb)[i]) for i in ("c009", "c013", "c014")])
    assert course(str(path), "-e", "2") == 0
    ids = [c.id for c in read(path).cells]
    assert ids[ids.index("c013") : ids.index("c013") + 3] == ["c013", "c014", "c015"]
    assert_exercise_is_stub(read(path), LESSON, 2)


def test_an_exercise_that_cannot_be_found_is_an_error_and_changes_nothing(tmp_path, capsys):
    path = participant(tmp_path)
    _edit(path, lambda nb: [nb.cells.remove(by_id(nb)[i]) for i in ("c009", "c013", "c014", "c015")])
    data = path.read_bytes()
    assert course(str(path), "-e", "2") == 2
    err = capsys.readouterr().err
    assert "cannot find exercise 2 (surrogate_loss)" in err and "nothing was changed" in err
    assert path.read_bytes() == data and backups(path) == []


def test_a_cell_holding_two_answers_is_not_split_silently(tmp_path, capsys):
    path = participant(tmp_path)

    def merge(nb):
        first, second = by_id(nb)["c006"], by_id(nb)["c013"]
        second.source = first.source + "\n\n" + second.source
        nb.cells.remove(first)

    _edit(path, merge)
    data = path.read_bytes()
    assert course(str(path), "-e", "2") == 2
    err = capsys.readouterr().err
    assert "also rloo_advantages of exercise 1" in err and "--exercise 2 --exercise 1" in err
    assert path.read_bytes() == data and backups(path) == []
    assert course(str(path), "-e", "1", "-e", "2") == 0  # both: the merged cell becomes one stub, the other is put back
    assert_exercise_is_stub(read(path), LESSON, 1)
    assert_exercise_is_stub(read(path), LESSON, 2)


def test_a_later_copy_of_the_answer_is_kept_and_named(tmp_path, capsys):
    path = participant(tmp_path)
    copy_source = "def surrogate_loss(logits, actions, advantages):\n    return 0.0  # my second try"
    _edit(path, lambda nb: nb.cells.append(nbformat.v4.new_code_cell(copy_source)))
    assert course(str(path), "-e", "2") == 0
    out = capsys.readouterr().out
    assert "also defines surrogate_loss and runs after the stub" in out
    assert read(path).cells[-1].source == copy_source


def test_an_answer_cell_turned_into_markdown_becomes_code_again(tmp_path, capsys):
    path = participant(tmp_path)

    def to_markdown(nb):
        i = [c.id for c in nb.cells].index("c013")
        old = nb.cells[i]
        nb.cells[i] = nbformat.v4.new_markdown_cell(old.source, metadata=old.metadata)
        nb.cells[i].id = old.id

    _edit(path, to_markdown)
    assert course(str(path), "-e", "2") == 0
    assert "(it was a markdown cell)" in capsys.readouterr().out
    after = read(path)
    assert by_id(after)["c013"].cell_type == "code"
    assert_exercise_is_stub(after, LESSON, 2)
    nbformat.validate(after)


def test_json_that_is_not_a_valid_notebook_is_reset_whole_only(tmp_path, capsys):
    path = participant(tmp_path)
    raw = json.loads(path.read_text())
    raw["cells"][3]["cell_type"] = "spreadsheet"
    path.write_text(json.dumps(raw))
    assert course(str(path), "-e", "2") == 2
    assert "not a valid notebook" in capsys.readouterr().err and backups(path) == []
    assert course(str(path)) == 0
    assert_is_stub(read(path), LESSON)


def test_the_course_command_knows_reset():
    args = cli.build_parser().parse_args(["reset", "x.ipynb", "-e", "1", "--exercise", "2", "--dry-run"])
    assert args._module is reset and args.exercise == ["1", "2"] and args.dry_run and args.lesson is None


def test_a_notebook_without_cell_ids_gets_valid_ones(tmp_path, capsys):
    path = participant(tmp_path)
    raw = json.loads(path.read_text())
    raw["nbformat_minor"] = 4
    for cell in raw["cells"]:
        del cell["id"]
    path.write_text(json.dumps(raw))
    assert course(str(path), "-e", "2") == 0
    assert "a new id" in capsys.readouterr().out
    after = read(path)
    nbformat.validate(after)
    assert after.nbformat_minor >= 5 and len({c.id for c in after.cells}) == len(after.cells)
    assert_exercise_is_stub(after, LESSON, 2)


# ---------------------------------------------------------------------------------------
# The whole notebook, corrupt files
# ---------------------------------------------------------------------------------------


def assert_is_stub(nb, lesson_id: str) -> None:
    want = stub(lesson_id)
    assert [(c.cell_type, c.source, tags(c)) for c in nb.cells] == [
        (c.cell_type, c.source, tags(c)) for c in want.cells
    ]
    assert nb.metadata["course"] == {"kind": "exercise", "lesson": lesson_id}
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")
    nbformat.validate(nb)


def test_whole_reset_equals_the_generated_stub(tmp_path, capsys):
    path = participant(tmp_path)
    data = path.read_bytes()
    assert course(str(path)) == 0
    assert_is_stub(read(path), LESSON)
    (backup,) = backups(path)
    assert backup.read_bytes() == data
    assert "the whole notebook was replaced by the stub" in capsys.readouterr().out


@pytest.mark.parametrize("content", [b'{"cells": [{"cell_type": "code", "sour', b"", b"\xff\xfe\x00garbage"])
def test_a_corrupt_notebook_can_be_reset_whole(tmp_path, capsys, content):
    path = tmp_path / f"{LESSON}.ipynb"
    path.write_bytes(content)
    assert course(str(path), "-e", "2") == 2
    err = capsys.readouterr().err
    assert "is not a readable notebook" in err and "without --exercise" in err
    assert path.read_bytes() == content and backups(path) == []
    assert course(str(path)) == 0
    assert "is not a readable notebook" in capsys.readouterr().out
    assert_is_stub(read(path), LESSON)
    (backup,) = backups(path)
    assert backup.read_bytes() == content


def test_a_corrupt_notebook_with_another_name_needs_lesson(tmp_path, capsys):
    path = tmp_path / "mine.ipynb"
    path.write_bytes(b"{not json")
    assert course(str(path), "-e", "1") == 2  # a corrupt file is named as such before its lesson is asked for
    assert "is not a readable notebook (not valid JSON" in capsys.readouterr().err
    assert course(str(path)) == 2
    err = capsys.readouterr().err
    # the file is broken, and that is what the message says (not "no course.lesson in its metadata")
    assert "mine.ipynb is not a readable notebook (not valid JSON: " in err and "metadata" in err
    assert "no course.lesson" not in err
    assert f"`course reset {path} --lesson NN`" in err and "keeps the current bytes in a backup" in err
    assert path.read_bytes() == b"{not json" and backups(path) == []
    assert course(str(path), "--lesson", "1") == 0
    assert_is_stub(read(path), LESSON)


# ---------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------


def test_errors_are_clear_and_exit_2(tmp_path, capsys):
    assert course(str(tmp_path / "nope.ipynb")) == 2
    assert "no such file" in capsys.readouterr().err
    assert course(str(tmp_path)) == 2
    assert "is a folder" in capsys.readouterr().err
    path = participant(tmp_path)
    data = path.read_bytes()
    assert course(str(path), "-e", "7") == 2
    err = capsys.readouterr().err
    assert "no exercise '7'" in err
    assert "1 (rloo_advantages), 2 (surrogate_loss), 3 (group_relative_advantages), 4 (reinforce_update)" in err
    assert course(str(path), "-e", "no_such_function") == 2
    assert course(str(path), "--lesson", "99") == 2
    assert "no lesson named '99'" in capsys.readouterr().err
    assert course(str(path), "--lesson", "2") == 2  # the metadata says lesson 01
    assert "this notebook is lesson 01_policy_gradients's" in capsys.readouterr().err
    assert path.read_bytes() == data and backups(path) == []


@pytest.mark.parametrize("kind", ["solution", "lesson"])
def test_solution_and_lesson_notebooks_are_refused(tmp_path, capsys, kind):
    path = tmp_path / f"{LESSON}.ipynb"
    nb = read(ROOT / "solutions" / f"{LESSON}.ipynb")
    nb.metadata["course"]["kind"] = kind
    nbformat.write(nb, path)
    data = path.read_bytes()
    assert course(str(path)) == 2
    assert f"is a {kind} notebook" in capsys.readouterr().err
    assert path.read_bytes() == data and backups(path) == []


def test_files_in_the_course_lessons_and_solutions_folders_are_refused(capsys):
    for folder in ("lessons", "solutions"):
        assert course(str(ROOT / folder / f"{LESSON}.ipynb"), "--dry-run") == 2
        assert f"in the course's {folder}/ folder" in capsys.readouterr().err


def test_a_notebook_without_metadata_takes_its_lesson_from_its_name(tmp_path):
    path = participant(tmp_path, name="01-my-attempt.ipynb")
    _edit(path, lambda nb: nb.metadata.pop("course"))
    assert course(str(path), "-e", "2") == 0
    assert_exercise_is_stub(read(path), LESSON, 2)


# ---------------------------------------------------------------------------------------
# Backups and the atomic write
# ---------------------------------------------------------------------------------------


def test_backups_never_overwrite(tmp_path):
    path = tmp_path / "a.ipynb"
    path.write_bytes(b"old")
    when = 1_800_000_000.0
    first = reset.backup_path(path, when)
    first.write_bytes(b"earlier backup")
    second = reset.backup_path(path, when)
    assert second.name == first.name + "-2"
    made = [reset.write_backup(path, b"one"), reset.write_backup(path, b"two"), reset.write_backup(path, b"three")]
    assert len(set(made)) == 3 and [p.read_bytes() for p in made] == [b"one", b"two", b"three"]
    assert first.read_bytes() == b"earlier backup"


def test_a_failed_write_leaves_the_old_file_whole(tmp_path, monkeypatch):
    path = participant(tmp_path)
    data = path.read_bytes()
    os.chmod(path, 0o640)

    def crash(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(reset.os, "replace", crash)
    with pytest.raises(OSError):
        reset.reset(path, ["2"])
    assert path.read_bytes() == data
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".tmp"] == []
    monkeypatch.undo()
    assert course(str(path), "-e", "2") == 0
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)  # the file keeps its permissions


# ---------------------------------------------------------------------------------------
# Every exercise notebook of the course
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("lesson_id", LESSONS)
def test_every_exercise_notebook_resets_whole_and_per_exercise(tmp_path, lesson_id):
    exercises = reset.stub_exercises(stub(lesson_id))
    assert exercises and all(ex.names for ex in exercises)
    path = tmp_path / f"{lesson_id}.ipynb"
    nbformat.write(solved(lesson_id), path)
    for ex in exercises:
        assert reset.reset(path, [str(ex.number)])
        after = read(path)
        assert_exercise_is_stub(after, lesson_id, ex.number)
        for later in exercises:  # the answers not yet reset are still there
            if later.number > ex.number:
                answers = [by_id(after)[i] for i in exercise_ids(lesson_id, later.number)]
                assert any("raise NotImplementedError" not in c.source for c in answers if "exercise" in tags(c))
    # every exercise reset one by one: every cell's text and tags are the stub's again
    assert [(c.source, tags(c)) for c in read(path).cells] == [(c.source, tags(c)) for c in stub(lesson_id).cells]
    nbformat.write(read(ROOT / "exercises" / f"{lesson_id}.ipynb"), path)
    reset.reset(path, [])
    assert_is_stub(read(path), lesson_id)


# ---------------------------------------------------------------------------------------
# Grading a reset notebook (one kernel run, lesson 00: numpy only)
# ---------------------------------------------------------------------------------------


def test_a_reset_exercise_grades_as_the_stub(tmp_path):
    """Exercise 2 reset in a solved notebook grades exactly as in the generated stub (two kernel runs)."""
    from dataclasses import asdict

    from course_lib.course.grading.runner import GradeOptions, grade_notebook

    options = GradeOptions(cell_timeout=20, total_timeout=60, check_timeout=5)
    path = tmp_path / "mine" / "00_welcome.ipynb"
    path.parent.mkdir()
    nbformat.write(solved("00_welcome"), path)
    assert reset.reset(path, ["2"])
    fresh = tmp_path / "stub" / "00_welcome.ipynb"
    fresh.parent.mkdir()
    nbformat.write(stub("00_welcome"), fresh)
    mine, pristine = grade_notebook(path, options), grade_notebook(fresh, options)
    assert mine.error is None and pristine.error is None
    assert mine.exercises[0].passed and mine.exercises[0].score == mine.exercises[0].points
    assert asdict(mine.exercises[1]) == asdict(pristine.exercises[1])
    assert mine.exercises[1].score == 0 and mine.exercises[1].checks[0]["status"] == "not_implemented"
