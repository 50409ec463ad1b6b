"""A learner's install is a learner's: `make lab` installs the course without the maintainers' tools.

Measured once with pip's resolver (``pip install --dry-run --report r.json -e .`` in a fresh
Python 3.11 venv, 2026-11-29): 151 distributions, none of the `dev` extra's. nbval (and pytest
under it) stays: it is how anyone checks that a notebook still reproduces its stored outputs
(``python -m pytest --nbval lessons/01_policy_gradients.ipynb``), and `course doctor` checks it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: test runners, linters, type checker, browser driver, site builder
DEV_TOOLS = {
    "pytest-timeout",
    "playwright",
    "mkdocs",
    "mkdocs-material",
    "pymdown-extensions",
    "django-static-mathjax",
    "ruff",
    "mypy",
}


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[=<>!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_dev_tools_are_an_extra_not_a_dependency():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not _names(project["dependencies"]) & DEV_TOOLS, "a development tool is a learner's dependency"
    assert _names(project["optional-dependencies"]["dev"]) == DEV_TOOLS
    # what the course runs for a learner stays: notebooks, their checks, grading
    assert {"jupyterlab", "ipywidgets", "nbval", "nbclient", "jupytext"} <= _names(project["dependencies"])


def _prerequisites(makefile: str, target: str) -> list[str]:
    (line,) = re.findall(rf"^{re.escape(target)}:([^\n]*)$", makefile, flags=re.M)
    return line.split()


def test_make_lab_installs_no_dev_tool_and_make_test_does():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert _prerequisites(makefile, "lab") == ["install"]
    assert _prerequisites(makefile, "install") == ["$(STAMP)"]
    # the learner's stamp installs `-e .`; only the dev stamp names the extra
    stamp_rule = makefile.split("$(STAMP): pyproject.toml")[1].split("\n\n")[0]
    assert "-e ." in stamp_rule and "[dev]" not in stamp_rule
    for target in ("lint", "site", "portability"):
        assert _prerequisites(makefile, target) == ["install-dev"], target
    assert _prerequisites(makefile, "test") == ["lint"]
    assert '-e ".[dev]"' in makefile.split("$(DEV_STAMP): $(STAMP)")[1].split("\n\n")[0]


def test_make_refuses_a_python_outside_the_range_before_making_a_venv(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy2(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'probe'\nversion = '0'\n")
    fake = tmp_path / "python3.10"  # answers like a Python 3.10
    fake.write_text("#!/bin/sh\nexec python3 -c 'import sys; sys.exit(1)'\n")
    fake.chmod(0o755)
    for python in (str(fake), str(tmp_path / "no-such-python")):
        done = subprocess.run(
            ["make", "install", f"PYTHON={python}"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0
        assert "is not Python 3.11-3.13" in done.stderr and "make lab PYTHON=python3.12" in done.stderr, done.stderr
        assert not (tmp_path / ".venv").exists(), "a .venv was left behind"
