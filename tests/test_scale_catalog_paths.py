"""The run contract (course_lib.course.scale), the lesson registry and the paths."""

import pytest

from course_lib.course import catalog, paths, scale


def test_scale_default_and_pick(monkeypatch):
    monkeypatch.delenv("COURSE_SCALE", raising=False)
    assert scale.current_scale() == "cpu"
    assert scale.pick(cpu=1, full=2) == 1
    monkeypatch.setenv("COURSE_SCALE", "FULL")
    assert scale.current_scale() == "full"
    assert scale.pick(cpu=1, full=2) == 2


def test_bad_scale_names_variable_and_choices(monkeypatch):
    monkeypatch.setenv("COURSE_SCALE", "gpu")
    with pytest.raises(ValueError, match=r"COURSE_SCALE='gpu'.*cpu, full"):
        scale.current_scale()


def test_catalog_is_ordered_and_closed():
    numbers = [lesson.number for lesson in catalog.LESSONS]
    assert numbers == list(range(13))
    for lesson in catalog.LESSONS:
        assert all(r < lesson.number for r in lesson.requires), lesson.id


@pytest.mark.parametrize("name", [0, "0", "00", "00_welcome", "welcome", "lessons/00_welcome.ipynb"])
def test_get_lesson_accepts_common_spellings(name):
    assert catalog.get_lesson(name).id == "00_welcome"


def test_get_lesson_unknown_lists_valid_names():
    with pytest.raises(KeyError, match="00_welcome"):
        catalog.get_lesson("99")


def test_lesson_00_available_and_repo_root_found():
    root = paths.repo_root()
    assert (root / "lessons" / "00_welcome.py").exists()
    assert catalog.get_lesson(0) in catalog.available_lessons()


def test_directories_move_with_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSE_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "o"))
    assert paths.cache_dir() == tmp_path / "c"
    assert paths.output_dir() == tmp_path / "o"
