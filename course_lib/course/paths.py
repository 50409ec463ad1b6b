"""Where the course lives on disk and where it may write.

Nothing here depends on the current working directory: the repository root is found
from this package's own location (the course is installed editable by ``make``), and
the writable directories can be moved with environment variables.
"""

from __future__ import annotations

import os
from pathlib import Path

_MARKERS = ("pyproject.toml", "lessons")


def repo_root() -> Path:
    """The course checkout that holds ``lessons/`` and ``pyproject.toml``.

    Raises:
        FileNotFoundError: if course_lib was installed without its checkout.
    """
    here = Path(__file__).resolve().parents[2]  # course_lib/course/paths.py -> the checkout
    if all((here / m).exists() for m in _MARKERS):
        return here
    cwd = Path.cwd().resolve()
    for candidate in (cwd, *cwd.parents):
        if all((candidate / m).exists() for m in _MARKERS) and (candidate / "course_lib").is_dir():
            return candidate
    raise FileNotFoundError(
        "cannot find the course checkout (a folder with pyproject.toml and lessons/). "
        "Install the course with `make lab` or `pip install -e .` from the checkout."
    )


def cache_dir() -> Path:
    """Cache for compiled or generated artefacts (``COURSE_CACHE_DIR`` to move it)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "efficient-rl-course"
    return Path(os.environ.get("COURSE_CACHE_DIR", default))


def output_dir() -> Path:
    """Where runs write executed notebooks, reports and figures (``COURSE_OUTPUT_DIR``)."""
    env = os.environ.get("COURSE_OUTPUT_DIR")
    if env:
        return Path(env)
    try:
        return repo_root() / "outputs"
    except FileNotFoundError:
        return Path.cwd() / "outputs"
