"""`make bench`: run every bench/bench_*.py and rewrite its table in BENCHMARKS.md.

Each benchmark module defines ``run() -> Result``. Its table lives in BENCHMARKS.md
between ``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->``; everything outside those
markers (figures measured by hand on a GPU, notes) is kept as it is.

    python bench/run.py                # all benchmarks
    python bench/run.py notebooks      # only bench/bench_notebooks.py
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent / "BENCHMARKS.md"


@dataclass
class Result:
    """One benchmark's table: what was measured, by which command, and the rows."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def machine() -> str:
    import psutil

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = psutil.virtual_memory().total / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, Python {platform.python_version()}, no GPU"


def render(name: str, result: Result) -> str:
    lines = [
        f"<!-- bench:{name} -->",
        f"### {result.title}",
        "",
        f"Command: `python bench/run.py {name}` (or `make bench`). "
        f"Measured {dt.date.today().isoformat()} on: {machine()}.",
        "",
        "| " + " | ".join(result.columns) + " |",
        "|" + "|".join("---" for _ in result.columns) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in result.rows]
    if result.notes:
        lines += [""] + [f"- {n}" for n in result.notes]
    lines.append(f"<!-- /bench:{name} -->")
    return "\n".join(lines)


def update(name: str, block: str) -> None:
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else "# Benchmarks\n"
    pattern = re.compile(rf"<!-- bench:{re.escape(name)} -->.*?<!-- /bench:{re.escape(name)} -->", re.DOTALL)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block + "\n"
    BENCHMARKS.write_text(text)


def measure_in_child(script: str, path: Path, timeout_s: float, what: str, hang: str) -> dict[str, Any]:
    """Run ``script --measure`` in a fresh interpreter and return the JSON it wrote to ``path``.

    For benchmarks that need several JAX CPU devices: the device count is fixed when JAX
    starts, so the measurement gets a process of its own. Exit code 124 is the watchdog's
    (``hang`` says what hung); any other non-zero code is a failure.
    """
    path.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, str(Path(script).resolve()), "--measure"], timeout=timeout_s, check=False)
    if done.returncode != 0:
        why = f" (the watchdog ended it: {hang})" if done.returncode == 124 else ""
        raise RuntimeError(f"the {what} measurement exited with code {done.returncode}{why}")
    return json.loads(path.read_text())


def child_main(
    argv: list[str], name: str, measure: Callable[[], dict[str, Any]], path: Path, run: Callable[[], Result]
) -> int:
    """``main`` of a benchmark measured in a child: ``--measure`` measures and writes ``path``
    (the child's side); no argument runs the whole benchmark and prints its table."""
    if argv == ["--measure"]:
        data = measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
        print(f"wrote {path}")
        return 0
    print(render(name, run()))
    return 0


def main(names: list[str]) -> int:
    modules = sorted(HERE.glob("bench_*.py"))
    if names:
        wanted = {f"bench_{n}.py" for n in names}
        unknown = wanted - {m.name for m in modules}
        if unknown:
            print(f"unknown benchmark(s): {sorted(unknown)}; have: {[m.stem[6:] for m in modules]}", file=sys.stderr)
            return 2
        modules = [m for m in modules if m.name in wanted]
    for path in modules:
        name = path.stem.removeprefix("bench_")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the benchmark {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"== {name}", flush=True)
        block = render(name, module.run())
        update(name, block)
        print(block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
