"""A learner's install is a learner's: `make lab` installs the course without the maintainers' tools.

Measured once with pip's resolver (``pip install --dry-run --report r.json -e .`` in a fresh
Python 3.11 venv, 2026-11-29): 151 distributions, none of the `dev` extra's; pytest comes
only as nbval's dependency (nbval is part of the course: lesson 00 runs it).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
