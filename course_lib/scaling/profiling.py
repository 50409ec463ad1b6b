"""Profile one call of a compiled JAX program and say where its time went (lesson 05).

:func:`trace` runs a function once to compile and warm it, then records one more call under
``jax.profiler.trace``. With jax/jaxlib 0.10.2 on CPU that writes, under
``out_dir/plugins/profile/<YYYY_MM_DD_HH_MM_SS>/``:

- ``<host>.xplane.pb``: the raw profile (a protobuf, what TensorBoard's profile plugin and
  XProf read);
- ``<host>.trace.json.gz``: the same events in the Chrome trace-event JSON format;
- ``perfetto_trace.json.gz``: the same again for Perfetto (``create_perfetto_trace=True``,
  which works offline; ``create_perfetto_link=True`` would instead wait for a browser).

and :func:`trace` adds ``<module>.hlo.txt``, the compiled program's HLO text, which names
the operation (``fusion``, ``dot``, ``all-reduce``, ...) behind every op in the trace.

**How to look at a trace.** Open ``perfetto_trace.json.gz`` at https://ui.perfetto.dev
("Open trace file": the page runs in the browser and loads the file locally) or
``*.trace.json.gz`` in Chrome's ``chrome://tracing``; with the ``xprof`` (formerly
``tensorboard-plugin-profile``) package, ``xprof --logdir out_dir`` serves the xplane file
with its op statistics. Each CPU device is a thread (``tf_XLA...``) whose slices are the
program's ops with their HLO names; the ``python`` thread shows dispatch and waiting.

**What** :func:`summarize_trace` **reports.** It parses the JSON trace (no extra package)
and gives every event its *self time* (its duration minus that of the events nested in
it, on the same thread), then sums self times by category:

- ``compute``: XLA ops that are not collectives (fusions, dots, convolutions, copies,
  custom calls), on the device threads;
- ``collective``: ``all-reduce``, ``all-gather``, ``reduce-scatter``,
  ``collective-permute``, ``all-to-all``, including the time a device waits at the
  rendezvous for the others (nested events inside an op count for that op);
- ``host: python``: Python functions (the profiler's Python tracer, ``$file:line name``);
- ``host: dispatch``: JAX and PjRt runtime work: argument handling, launching the
  executable, the executor's bookkeeping between ops;
- ``waiting``: a thread blocked outside any op: the host in ``block_until_ready``, an
  executor thread waiting for the ops it handed to the thread pool;
- ``profiler``: starting and stopping the trace itself.

Times are *thread* milliseconds: with ``N`` devices working at once, compute and
collectives can add up to ``N`` times the wall-clock time. Which op is a collective is
read from the saved HLO text; without it (a trace written by someone else) an op counts
as a collective if a ``Rendezvous`` is nested in it or its name says so (``psum``,
``all-reduce``, ...).
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax

from course_lib.runtime.watchdog import watchdog

#: HLO opcodes that move data between devices.
COLLECTIVE_OPCODES = frozenset(
    {"all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all", "collective-broadcast"}
)

CATEGORIES = ("compute", "collective", "host: python", "host: dispatch", "waiting", "profiler")

_COLLECTIVE_NAME = re.compile(
    r"all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|collective[-_]?permute|all[-_]?to[-_]?all|"
    r"psum|pmean|pmax|pmin|ppermute"
)


# ---------------------------------------------------------------------------
# HLO text: instructions, shapes, collectives
# ---------------------------------------------------------------------------

_BYTES_PER_ELEMENT = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1,
}  # fmt: skip
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


def shape_bytes(hlo_type: str) -> int:
    """Bytes of an HLO type such as ``f32[128,64]{1,0}`` or a tuple ``(f32[2]{0}, bf16[3,4]{1,0})``."""
    total = 0.0
    for dtype, dims in _ARRAY.findall(hlo_type):
        if dtype not in _BYTES_PER_ELEMENT:
            continue  # token[], etc.
        total += _BYTES_PER_ELEMENT[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return int(total)


def _matching(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``text[start]``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    for j in range(start, len(text)):
        c = text[j]
        if c in pairs:
            stack.append(pairs[c])
        elif stack and c == stack[-1]:
            stack.pop()
            if not stack:
                return j + 1
    raise ValueError(f"unbalanced brackets in HLO line: {text!r}")


@dataclass(frozen=True)
class HloInstruction:
    """One instruction of an HLO module's text: name, result type, opcode, operands, attributes."""

    name: str
    type: str
    opcode: str
    operands: tuple[str, ...]
    attributes: str


def hlo_instructions(hlo_text: str) -> dict[str, HloInstruction]:
    """Every instruction of an HLO module's text (``compiled.as_text()``), by name."""
    out: dict[str, HloInstruction] = {}
    for line in hlo_text.splitlines():
        line = re.sub(r"/\*.*?\*/", "", line)  # XLA numbers long lists: "/*index=5*/%f" is operand %f
        m = _INSTRUCTION.match(line)
        if not m:
            continue
        name, rest = m.group(1), m.group(2)
        if rest.startswith("("):
            end = _matching(rest, 0)
            type_, rest = rest[:end], rest[end:].lstrip()
        else:
            type_, _, rest = rest.partition(" ")
        op = re.match(r"([a-z][a-z0-9\-]*)\(", rest)
        if not op:
            continue
        close = _matching(rest, op.end() - 1)
        operands = tuple(
            t.strip().split(" ")[-1].lstrip("%") for t in _split_top(rest[op.end() : close - 1]) if t.strip()
        )
        out[name] = HloInstruction(name, type_, op.group(1), operands, rest[close:])
    return out


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return parts


def hlo_module_name(hlo_text: str) -> str:
    """The module's name from the ``HloModule NAME, ...`` header line."""
    m = re.search(r"^HloModule\s+([\w.\-]+)", hlo_text, re.M)
    if not m:
        raise ValueError("not HLO module text: no 'HloModule NAME' header line")
    return m.group(1)


def _group_size(attributes: str, num_partitions: int) -> int:
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=", attributes)
    if iota:
        return int(iota.group(2))
    explicit = re.search(r"replica_groups=\{\{([0-9,]*)\}", attributes)
    if explicit:
        return len([d for d in explicit.group(1).split(",") if d])
    return num_partitions  # replica_groups={} : every device


@dataclass(frozen=True)
class HloCollective:
    """A collective in a compiled program and what a ring implementation makes each device send.

    ``bytes_sent_per_device``: ``2 (G-1)/G * operand`` for an all-reduce over groups of
    ``G``; ``(G-1) * operand`` for an all-gather (``(G-1)/G`` of its result);
    ``(G-1)/G * operand`` for a reduce-scatter or all-to-all; the operand once for a
    collective-permute (every device in its pairs sends one buffer).
    """

    name: str
    opcode: str
    operand_bytes: int
    group_size: int
    bytes_sent_per_device: float


def hlo_collectives(hlo_text: str) -> list[HloCollective]:
    """The collectives of a compiled HLO module, with operand sizes read from the instructions they use."""
    header = re.search(r"num_partitions=(\d+)", hlo_text)
    num_partitions = int(header.group(1)) if header else 1
    instructions = hlo_instructions(hlo_text)
    found = []
    for ins in instructions.values():
        opcode = ins.opcode.removesuffix("-start")
        if opcode not in COLLECTIVE_OPCODES or ins.opcode.endswith("-done"):
            continue
        operand = sum(shape_bytes(instructions[o].type) for o in ins.operands if o in instructions)
        g = _group_size(ins.attributes, num_partitions)
        if opcode == "all-reduce":
            sent = 2 * (g - 1) / g * operand
        elif opcode == "all-gather":
            sent = (g - 1) * operand
        elif opcode in ("reduce-scatter", "all-to-all"):
            sent = (g - 1) / g * operand
        else:  # collective-permute, collective-broadcast
            sent = float(operand)
        found.append(HloCollective(ins.name, opcode, operand, g, sent))
    return found


# ---------------------------------------------------------------------------
# Recording a trace
# ---------------------------------------------------------------------------


def _run_dirs(out_dir: Path) -> list[Path]:
    root = out_dir / "plugins" / "profile"
    return sorted((p for p in root.glob("*") if p.is_dir()), key=lambda p: (p.stat().st_mtime, p.name))


def _compiled_text(fn: Callable[..., Any], args: tuple[Any, ...]) -> str | None:
    try:
        if hasattr(fn, "as_text"):  # a jax.stages.Compiled
            text = fn.as_text()
        elif hasattr(fn, "lower"):  # a jitted function
            text = fn.lower(*args).compile().as_text()
        else:
            return None
    except Exception:  # the trace is still useful without the HLO
        return None
    return text if isinstance(text, str) else None


def trace(fn: Callable[..., Any], *args: Any, out_dir: str | Path, watchdog_s: float = 120.0) -> Path:
    """Record one call ``fn(*args)`` with ``jax.profiler.trace``; return the run's folder.

    ``fn`` is called once first and blocked on (compilation and warm-up stay out of the
    trace), then once more inside the trace, blocked before the trace stops. Both calls
    run under a watchdog of ``watchdog_s`` seconds (``fn`` may run on several devices).
    The folder (``out_dir/plugins/profile/<timestamp>/``) holds the xplane, Chrome-trace
    and Perfetto files, and, when ``fn`` is jitted (or compiled), its HLO text as
    ``<module>.hlo.txt`` for :func:`summarize_trace`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    before = set(_run_dirs(out))
    name = getattr(fn, "__name__", type(fn).__name__)
    with watchdog(watchdog_s, f"profiling one call of {name}"):
        jax.block_until_ready(fn(*args))
        with jax.profiler.trace(str(out), create_perfetto_trace=True):
            jax.block_until_ready(fn(*args))
    new = [d for d in _run_dirs(out) if d not in before] or _run_dirs(out)
    if not new:
        raise RuntimeError(f"jax.profiler.trace wrote no run folder under {out / 'plugins' / 'profile'}")
    run_dir = new[-1]
    text = _compiled_text(fn, args)
    if text is not None:
        (run_dir / f"{hlo_module_name(text)}.hlo.txt").write_text(text)
    return run_dir


# ---------------------------------------------------------------------------
# Summarising it
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OpTime:
    """One XLA op's time in the trace, summed over devices and calls."""

    name: str
    opcode: str  # from the HLO text; "?" when it was not saved
    category: str
    total_ms: float
    count: int


@dataclass(frozen=True)
class TraceSummary:
    """Where the traced call's time went: thread-milliseconds per category, and per op."""

    trace_file: Path
    categories: dict[str, float]
    ops: list[OpTime]
    n_devices: int
    device_span_ms: float  # first op start to last op end, over all devices
    hlo_found: bool
    notes: list[str] = field(default_factory=list)

    def table(self, top: int = 8) -> str:
        """The summary as two small plain-text tables (categories, then the ``top`` ops)."""
        total = sum(self.categories.values()) or 1.0
        lines = [
            f"{self.n_devices} device(s); device span {self.device_span_ms:.3f} ms (first op start to last op end); "
            "times are thread-ms summed over threads",
            f"{'category':<16}{'ms':>10}{'share':>8}",
        ]
        lines += [f"{c:<16}{ms:>10.3f}{ms / total:>8.1%}" for c, ms in self.categories.items()]
        lines += ["", f"{'op':<32}{'opcode':<20}{'category':<12}{'ms':>9}{'calls':>7}"]
        lines += [
            f"{o.name[:31]:<32}{o.opcode[:19]:<20}{o.category:<12}{o.total_ms:>9.3f}{o.count:>7}"
            for o in self.ops[:top]
        ]
        return "\n".join(lines + [f"note: {n}" for n in self.notes])


def _find_trace_file(path: Path) -> Path:
    if path.is_file():
        return path
    runs = _run_dirs(path) or ([path] if path.is_dir() else [])
    for run_dir in reversed(runs):
        for pattern in ("*.trace.json.gz", "perfetto_trace.json.gz", "*.trace.json"):
            hits = sorted(run_dir.glob(pattern))
            if hits:
                return hits[0]
        if list(run_dir.glob("*.xplane.pb")):
            raise FileNotFoundError(
                f"{run_dir} holds only an xplane.pb, which needs protobuf and the xprof package to read; "
                "record with course_lib.scaling.profiling.trace (jax.profiler.trace also writes *.trace.json.gz)"
            )
    raise FileNotFoundError(
        f"no profiler trace under {path}: record one with course_lib.scaling.profiling.trace(fn, *args, out_dir=...)"
    )


def _load_events(trace_file: Path) -> list[dict[str, Any]]:
    opener = gzip.open if trace_file.suffix == ".gz" else open
    with opener(trace_file, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph")]


def _host_category(name: str) -> str:
    if "profiler.py" in name or "contextlib.py" in name:
        return "profiler"
    if "block_until_ready" in name or "try_to_block" in name or "wait" in name.lower():
        return "waiting"
    if name.startswith("$"):
        return "host: python"
    return "host: dispatch"


def summarize_trace(path: str | Path) -> TraceSummary:
    """Parse a trace written by :func:`trace` (its ``out_dir``, a run folder or the JSON file) into a summary.

    Uses the newest run folder under ``out_dir``. Raises ``FileNotFoundError`` if there is
    no JSON trace (an xplane.pb alone cannot be read without extra packages).
    """
    trace_file = _find_trace_file(Path(path))
    opcodes: dict[tuple[str, str], str] = {}
    for hlo in trace_file.parent.glob("*.hlo.txt"):
        text = hlo.read_text()
        module = hlo_module_name(text)
        opcodes.update({(module, n): ins.opcode for n, ins in hlo_instructions(text).items()})
    events = _load_events(trace_file)
    complete = [e for e in events if e["ph"] == "X" and "ts" in e and float(e.get("dur", 0)) > 0]

    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in complete:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)

    categories = dict.fromkeys(CATEGORIES, 0.0)
    op_ms: dict[tuple[str, str], list[float]] = {}
    op_category: dict[tuple[str, str], str] = {}
    devices: set[str] = set()
    first, last = math.inf, -math.inf
    eps = 1e-3  # microseconds: slack for rounding in nested ts/dur
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        n = len(thread_events)
        self_us = [float(e["dur"]) for e in thread_events]
        parent: list[int | None] = [None] * n
        stack: list[int] = []
        for j, e in enumerate(thread_events):
            ts, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            while stack and float(thread_events[stack[-1]]["ts"]) + float(thread_events[stack[-1]]["dur"]) <= ts + eps:
                stack.pop()
            if stack:
                top = thread_events[stack[-1]]
                if end <= float(top["ts"]) + float(top["dur"]) + eps:
                    parent[j] = stack[-1]
                    self_us[stack[-1]] -= float(e["dur"])
            stack.append(j)
        # Each event's owner: itself if it is an op (or a profiler event), else its nearest such ancestor.
        owner: list[int | None] = [None] * n
        has_rendezvous: set[int] = set()
        for j, e in enumerate(thread_events):
            args = e.get("args") or {}
            if "hlo_op" in args or _host_category(str(e.get("name", ""))) == "profiler":
                owner[j] = j
            elif (p := parent[j]) is not None:
                owner[j] = owner[p]  # parents come first in this order
            if "Rendezvous" in str(e.get("name", "")) and owner[j] is not None:
                has_rendezvous.add(owner[j])  # type: ignore[arg-type]
        for j, e in enumerate(thread_events):
            o = owner[j]
            if o is None:
                categories[_host_category(str(e.get("name", "")))] += self_us[j] / 1e3
                continue
            oe = thread_events[o]
            args = oe.get("args") or {}
            if "hlo_op" not in args:
                categories["profiler"] += self_us[j] / 1e3
                continue
            op_name, module = str(args["hlo_op"]), str(args.get("hlo_module", ""))
            opcode = opcodes.get((module, op_name), "?")
            if opcode != "?":
                is_collective = opcode.removesuffix("-start") in COLLECTIVE_OPCODES
            else:
                is_collective = o in has_rendezvous or bool(_COLLECTIVE_NAME.search(op_name.lower()))
            category = "collective" if is_collective else "compute"
            categories[category] += self_us[j] / 1e3
            key = (op_name, opcode)
            op_category[key] = category
            times = op_ms.setdefault(key, [0.0, 0.0])
            times[0] += self_us[j] / 1e3
            if o == j:
                times[1] += 1
                devices.add(str(args.get("device_ordinal", "?")))
                first = min(first, float(e["ts"]))
                last = max(last, float(e["ts"]) + float(e["dur"]))
    ops = sorted(
        (
            OpTime(name, opcode, op_category[(name, opcode)], ms, int(count))
            for (name, opcode), (ms, count) in op_ms.items()
        ),
        key=lambda o: -o.total_ms,
    )
    notes = []
    if not opcodes:
        notes.append("no HLO text beside the trace: collectives recognised by their rendezvous or name")
    if not ops:
        notes.append("no XLA op events in the trace (was the traced call blocked on before the trace stopped?)")
    return TraceSummary(
        trace_file=trace_file,
        categories=categories,
        ops=ops,
        n_devices=len(devices),
        device_span_ms=(last - first) / 1e3 if ops else 0.0,
        hlo_found=bool(opcodes),
        notes=notes,
    )
