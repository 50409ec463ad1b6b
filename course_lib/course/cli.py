"""The ``course`` command (also ``python -m course_lib``).

Each subcommand lives in the module named for it; this file only wires them up, and
imports a module when its subcommand runs so that ``course --help`` stays fast.
Every subcommand module exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("course_lib.course.doctor", "check this machine can run the course; paste the block into an issue"),
    "lab": ("course_lib.course.lab", "open JupyterLab on the course (what `make lab` runs)"),
    "build": (
        "course_lib.course.notebooks.build",
        "regenerate and execute notebooks from their text sources; --check verifies sync",
    ),
    "run": ("course_lib.course.notebooks.run", "execute lessons headless and print a timing table"),
    "grade": ("course_lib.course.grading.cli", "grade exercise notebooks in a separate kernel and report the score"),
    "grade-class": (
        "course_lib.course.grading.classroom",
        "grade a folder of participants' submissions (one subfolder or notebook each); tables and CSV/JSON",
    ),
    "reset": (
        "course_lib.course.reset",
        "restore an exercise notebook, or one exercise in it, to its stub; the replaced version is backed up",
    ),
    "wheelhouse": (
        "course_lib.course.wheelhouse",
        "download every package the course needs into a folder, for an install with no network",
    ),
    "pace": ("course_lib.course.pacing", "workshop schedules from the measured notebook times and exercise estimates"),
    "site": ("course_lib.course.site", "build the course website (offline) into outputs/site; --serve to view it"),
    "capstone": ("course_lib.capstone.cli", "run lesson 11's torchrun job (generators + trainers) and summarise it"),
    "portability": (
        "course_lib.course.portability",
        "re-run strict nbval under another instruction set and under a CPU hog; print what differs",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="course",
        description="Efficient RL Systems: course tools (doctor, lab, build, run, grade, grade-class, reset, pace, "
        "wheelhouse, site, capstone, portability).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        module = importlib.import_module(module_name)
        module.add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args._module.run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
