"""Reading a run back: every rank's JSON lines as tidy columns, for a notebook or a summary.

::

    from course_lib.capstone.report import load
    rep = load("runs/capstone")
    rep.updates["reward"], rep.updates["t"]      # per update (trainer 0), numpy columns
    rep.reward_vs_time()                          # (seconds since the first start, reward per update)
    rep.tokens_per_s, rep.lag_histogram()         # throughput, per-token lags of every update
    rep.phases                                    # one row per span: rank, role, phase, start, end
    rep.syncs                                     # weight updates: side, version, seconds per step
    rep.restarts, rep.events, rep.evals, rep.result

A *table* here is a ``dict`` of equal-length numpy arrays (one per column): what pandas would
hold, without depending on it. Rows come in file order (time order per rank); columns a
kind of line lacks are left out. Times are wall-clock seconds since the epoch; ``t0`` (the
first line of the run) turns them into seconds since the start.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from course_lib.capstone.ledger import Generated, Trained
from course_lib.capstone.metrics import METRICS_DIR, read_lines
from course_lib.layout.calibrate import PREFILL_STEPS

Table = dict[str, NDArray[Any]]
RESULT = "result.json"
PHASE_COLOURS = {
    "warm_start": "tab:brown", "calibrate": "tab:pink", "eval": "tab:olive", "decode": "tab:green",
    "train": "tab:blue", "allreduce": "tab:red", "wait": "lightgray", "sync": "tab:orange",
    "checkpoint": "tab:purple",
}  # fmt: skip


def table(rows: Iterable[dict[str, Any]], columns: Iterable[str]) -> Table:
    """Columns of ``rows`` as numpy arrays (a missing value is ``nan`` for numbers, ``None`` otherwise)."""
    rows = list(rows)
    out: Table = {}
    for c in columns:
        values = [r.get(c) for r in rows]
        numeric = all((isinstance(v, (int, float)) and not isinstance(v, bool)) or v is None for v in values)
        if numeric and any(v is not None for v in values):
            out[c] = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        else:
            out[c] = np.array(values, dtype=object)
    return out


def all_lines(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every rank's lines, rank files in rank order."""
    files = sorted((Path(run_dir) / METRICS_DIR).glob("rank*.jsonl"), key=lambda p: int(p.stem[4:]))
    return [line for f in files for line in read_lines(f)]


def generated_records(lines: Iterable[dict[str, Any]]) -> list[Generated]:
    """The generators' ``generated`` lines as ledger records."""
    return [
        Generated(
            int(x["attempt"]), int(x["k"]), int(x["samples"]), int(x["rank"]), int(x.get("tokens", -1)),
            str(x.get("digest", "")),
        )
        for x in lines
        if x.get("kind") == "generated"
    ]  # fmt: skip


def trained_records(lines: Iterable[dict[str, Any]]) -> list[Trained]:
    """The trainers' ``trained`` lines (what entered their losses) as ledger records."""
    return [
        Trained(int(a), int(k), int(rows), int(tokens), str(digest), int(x["attempt"]))
        for x in lines
        if x.get("kind") == "trained"
        for a, k, rows, tokens, digest in x["groups"]
    ]


@dataclass
class CapstoneReport:
    """A run's metrics, read back (see the module docstring)."""

    run_dir: Path
    lines: list[dict[str, Any]]
    result: dict[str, Any] = field(default_factory=dict)

    def _of(self, kind: str) -> list[dict[str, Any]]:
        return [x for x in self.lines if x.get("kind") == kind]

    @property
    def t0(self) -> float:
        """The run's first moment: its first log line, or an earlier phase's start (rank 0's warm
        start is logged as a phase once it ended), so that no time since ``t0`` is negative."""
        starts = [float(x["start"]) for x in self._of("phase")]
        return min([float(x["t"]) for x in self.lines] + starts, default=0.0)

    @property
    def updates(self) -> Table:
        """Trainer 0's ``update`` lines: attempt, update, started, t (logged, after the weight send),
        reward, tokens, samples, lag_mean, lag_max, ess, clipped, loss, time_wait, time_train
        (forward, backward, Adam), time_allreduce (the update's all-reduce: gradients, token count and
        statistics in one message)."""
        cols = ("attempt", "update", "started", "t", "reward", "tokens", "samples", "lag_mean", "lag_max", "ess")
        return table(self._of("update"), (*cols, "clipped", "loss", "time_wait", "time_train", "time_allreduce"))

    def reward_vs_time(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(seconds since the run's first line, batch reward) per update, in time order."""
        u = self.updates
        if not len(u.get("t", [])):
            return np.zeros(0), np.zeros(0)
        order = np.argsort(u["t"])
        return u["t"][order] - self.t0, u["reward"][order]

    def lag_histogram(self) -> NDArray[np.int64]:
        """Tokens per lag (``[max_lag + 2]``: lags 0 .. max_lag, then "more") over every logged update."""
        hists = [np.asarray(x["lag_hist"], dtype=np.int64) for x in self._of("update")]
        if not hists:
            return np.zeros(0, dtype=np.int64)
        width = max(h.size for h in hists)
        return np.sum([np.pad(h, (0, width - h.size)) for h in hists], axis=0)

    def _rate(self, field: str | None) -> float:
        """``field`` summed over the updates (``None``: the updates themselves) per second of
        updating: each attempt from the start of its first update to the end of its last
        (start-up, evaluation and restarts left out)."""
        amount, seconds = 0.0, 0.0
        for attempt in sorted({x["attempt"] for x in self._of("update")}):
            ups = [x for x in self._of("update") if x["attempt"] == attempt]
            first = min(x["started"] for x in ups)
            amount += len(ups) if field is None else sum(x[field] for x in ups)
            seconds += max(x["t"] for x in ups) - first
        return amount / seconds if seconds > 0 else float("nan")

    @property
    def tokens_per_s(self) -> float:
        """Answer tokens the trainers consumed per second of updating (moves with the policy's answer length)."""
        return self._rate("tokens")

    @property
    def updates_per_s(self) -> float:
        """Updates per second of updating: the fair rate between runs whose answers differ in length."""
        return self._rate(None)

    @property
    def samples_per_s(self) -> float:
        """Answers trained on per second of updating (every update is exactly one batch of them)."""
        return self._rate("samples")

    def updating_window(self) -> tuple[float, float]:
        """(start of the first update, end of the last): the seconds the rates count."""
        u = self.updates
        return float(np.min(u["started"])), float(np.max(u["t"]))

    def phase_seconds(self, rank: int) -> dict[str, float]:
        """Seconds ``rank`` spent in each phase inside :meth:`updating_window`."""
        lo, hi = self.updating_window()
        p = self.phases
        mine = p["rank"] == rank
        out: dict[str, float] = {}
        for name, a, b in zip(p["phase"][mine], p["start"][mine], p["end"][mine]):
            out[str(name)] = out.get(str(name), 0.0) + max(0.0, min(float(b), hi) - max(float(a), lo))
        return out

    def allreduce_own_seconds(self, n_trainers: int) -> float:
        """Of trainer 0's all-reduce time inside :meth:`updating_window`, the collectives' own cost.

        The trainers run the same all-reduces in the same order, so the k-th ``allreduce`` span of
        every trainer is one collective; the last trainer to arrive waits least, so the shortest
        k-th span is the collective itself, and the rest of trainer 0's span its wait for another."""
        lo, _ = self.updating_window()
        p = self.phases
        spans = []
        for r in range(n_trainers):
            sel = (p["rank"] == r) & (p["phase"] == "allreduce")
            spans.append((p["start"][sel], p["end"][sel] - p["start"][sel]))
        n = min(len(d) for _, d in spans)
        own = np.min([d[:n] for _, d in spans], axis=0)
        return float(own[spans[0][0][:n] >= lo].sum())

    def batch_slot_use(self, groups_per_batch: int, prompt_steps: int = PREFILL_STEPS) -> float:
        """Synchronous runs: the share of a batch's slot-steps its answers fill. A rank's answers of
        one update decode together until the longest ends, each holding its slot for the prompt's
        steps and its answer's tokens, so each (rank, update) batch of ``n`` answers holds
        ``n (P + longest)`` slot-steps, of which it fills ``n P + sum of lengths`` (the slot use of
        (08.7)); the tail is the rest. Returns the filled over the held, over every batch."""
        batches: dict[tuple[int, int, int], list[int]] = {}
        for x in self._of("generated"):
            key = (int(x["attempt"]), int(x["rank"]), int(x["k"]) // groups_per_batch)
            batches.setdefault(key, []).extend(int(n) for n in x.get("lengths", []))
        filled = sum(len(v) * prompt_steps + sum(v) for v in batches.values())
        held = sum(len(v) * (prompt_steps + max(v)) for v in batches.values() if v)
        return filled / held if held else float("nan")

    @property
    def phases(self) -> Table:
        """One row per span of work: rank, role, attempt, phase, start, end (for a Gantt chart)."""
        return table(self._of("phase"), ("rank", "role", "attempt", "phase", "start", "end"))

    @property
    def syncs(self) -> Table:
        """Weight updates: rank, side (send/receive), version, total, stage, transfer, reload, load,
        wait (colocated: the sender waiting for generators to leave a slot), nbytes, in_flight."""
        cols = (
            "rank",
            "attempt",
            "side",
            "version",
            "total",
            "stage",
            "transfer",
            "reload",
            "load",
            "wait",
            "nbytes",
            "in_flight",
        )
        return table(self._of("sync"), cols)

    @property
    def evals(self) -> Table:
        """Evaluation rewards: when (start/end), reward, prompts, step, attempt."""
        return table(self._of("eval"), ("when", "reward", "prompts", "step", "attempt", "t"))

    @property
    def events(self) -> Table:
        """Lines for humans: restarts, kills, the end."""
        return table(self._of("event"), ("t", "rank", "role", "attempt", "message"))

    @property
    def restarts(self) -> list[dict[str, Any]]:
        """One entry per attempt after the first: its number, torchrun's restart count, the step
        it resumed from and the groups it counted as discarded."""
        return [x for x in self._of("start") if x.get("rank") == 0 and x["attempt"] > 0]

    @property
    def layout(self) -> dict[str, Any]:
        """The plan rank 0 chose (and its prediction) in the first attempt."""
        starts = [x for x in self._of("start") if x.get("rank") == 0]
        return dict(starts[0]["plan"]) if starts else {}

    @property
    def generated(self) -> list[Generated]:
        return generated_records(self.lines)

    def answer_lengths(self) -> NDArray[np.int64]:
        """Every generated answer's length in tokens (``<eos>`` included), from the generators' lines."""
        lengths = [n for x in self._of("generated") for n in x.get("lengths", [])]
        return np.asarray(lengths, dtype=np.int64)

    def held_out(self) -> tuple[float, float]:
        """(evaluation reward at the start, at the end); ``nan`` where missing."""
        e = self.evals
        whens = list(e.get("when", []))
        start = e["reward"][whens.index("start")] if "start" in whens else np.nan
        end = e["reward"][len(whens) - 1 - whens[::-1].index("end")] if "end" in whens else np.nan
        return float(start), float(end)

    def by_class(self, when: str) -> list[dict[str, Any]]:
        """The evaluation ``when`` ("start" or "end", the last of its kind) per quotient class:
        ``quotients`` [lo, hi], ``prompts``, ``reward`` and mean ``answer_tokens`` (``None`` for a
        class without prompts); empty if that evaluation is missing."""
        rows = [x for x in self._of("eval") if x.get("when") == when and "by_class" in x]
        return list(rows[-1]["by_class"]) if rows else []

    def class_table(self) -> list[dict[str, Any]]:
        """Per quotient class: ``name``, ``prompts``, ``reward`` and ``answer_tokens`` at the start
        and the end (``(start, end)`` pairs), and ``correct``: the mean length of a correct answer
        (``q`` numbers and ``<eos>``, weighted by the task's power law over the class's quotients)."""
        from course_lib.lm.task import QUOTIENT_CLASSES, CountdownTask

        probs = CountdownTask().quotient_probs
        rows = []
        for (lo, hi), a, b in zip(QUOTIENT_CLASSES, self.by_class("start"), self.by_class("end")):
            q = np.arange(lo, hi + 1)
            p = probs[lo - 1 : hi]
            rows.append(
                {
                    "name": f"{lo}" if lo == hi else f"{lo}-{hi}",
                    "prompts": int(b["prompts"]),
                    "reward": (a["reward"], b["reward"]),
                    "answer_tokens": (a["answer_tokens"], b["answer_tokens"]),
                    "correct": float((p * (q + 1)).sum() / p.sum()),
                }
            )
        return rows

    def arm_figures(self, groups_per_batch: int) -> dict[str, float]:
        """One run's rates and costs, for lesson 11's comparison of arms: updates/s, samples/s,
        answer tokens/s, answer length, trainer 0's median ``send ms``, max and mean lag (per
        consumed token), ``slot use`` (:meth:`batch_slot_use`, synchronous runs) and trainer 0's
        milliseconds per update in each phase (``wait ms``, ``decode ms``, ...)."""
        u, s = self.updates, self.syncs
        send = s["side"] == "send" if len(s.get("side", [])) else np.zeros(0, dtype=bool)
        per_update = {k: 1e3 * v / len(u["update"]) for k, v in self.phase_seconds(0).items()}
        return {
            "updates/s": self.updates_per_s,
            "samples/s": self.samples_per_s,
            "answer tokens/s": self.tokens_per_s,
            "answer length": float(u["tokens"].sum() / u["samples"].sum()),
            "send ms": 1e3 * float(np.median(s["total"][send])) if send.any() else 0.0,
            "max lag": int(np.nanmax(u["lag_max"])),
            "mean lag": float((u["lag_mean"] * u["tokens"]).sum() / u["tokens"].sum()),
            "slot use": self.batch_slot_use(groups_per_batch),
            **{f"{k} ms": per_update.get(k, 0.0) for k in ("wait", "decode", "train", "allreduce", "sync")},
        }

    def gantt(self, ax: Any, window: tuple[float, float], n_trainers: int, ranks: int = 4) -> None:
        """One row per rank on matplotlib ``ax``: a bar per logged phase inside ``window`` (seconds
        since :attr:`t0`), coloured by :data:`PHASE_COLOURS`."""
        p, t0 = self.phases, self.t0
        a, b = window
        for name, colour in PHASE_COLOURS.items():
            for r in range(ranks):
                sel = (p["rank"] == r) & (p["phase"] == name) & (p["end"] - t0 > a) & (p["start"] - t0 < b)
                bars = [(s - t0, e - s) for s, e in zip(p["start"][sel], p["end"][sel])]
                ax.broken_barh(bars, (r - 0.38, 0.76), color=colour, label=name if r == 0 or name == "decode" else None)
        ax.set_yticks(
            range(ranks), [f"rank {r} ({'trainer' if r < n_trainers else 'generator'})" for r in range(ranks)]
        )
        ax.set_xlim(a, b)
        ax.invert_yaxis()
        ax.set_xlabel("wall-clock time since the run's first log line (s)")

    def summary(self) -> str:
        """A few lines: learning, throughput, lag, weight sync, restarts, the ledger's audit."""
        start, end = self.held_out()
        u = self.updates
        n = len(set(u["update"].tolist())) if len(u.get("update", [])) else 0
        lines = [
            f"run {self.run_dir}: {n} updates ({len(u.get('update', []))} logged, counting those redone after a restart)"
        ]
        lines.append(f"evaluation reward: {start:.3f} at the start -> {end:.3f} at the end")
        if len(u.get("update", [])):
            lines.append(
                f"throughput: {self.tokens_per_s:,.0f} answer tokens/s; lag: mean {np.nanmean(u['lag_mean']):.2f}, "
                f"max {int(np.nanmax(u['lag_max']))} updates; ESS/N {np.nanmean(u['ess']):.3f}"
            )
        s = self.syncs
        if len(s.get("side", [])):
            send = s["total"][s["side"] == "send"]
            if send.size:
                lines.append(f"weight sync (trainer 0, per update): median {1e3 * np.median(send):.1f} ms")
        for r in self.restarts:
            lines.append(
                f"restart: attempt {r['attempt']} (torchrun restart {r['restart_count']}) resumed from step "
                f"{r['resumed_step']}, discarded {r.get('discarded_groups', 0)} groups generated after that checkpoint"
            )
        audit = self.result.get("audit")
        if audit:
            lines.append(
                f"ledger: generated {audit['generated_samples']} samples = consumed {audit['consumed_samples']} + "
                f"discarded {audit['discarded_samples']} + left over {audit['leftover_samples']}: "
                f"{'exact' if audit['ok'] else 'MISMATCH'}"
            )
        return "\n".join(lines)


def load(run_dir: str | Path) -> CapstoneReport:
    """Read every rank's metrics and ``result.json`` (if the run finished) from ``run_dir``.

    Raises:
        FileNotFoundError: ``run_dir`` holds no metrics (not a capstone run directory).
    """
    run_dir = Path(run_dir)
    lines = all_lines(run_dir)
    if not lines:
        raise FileNotFoundError(
            f"{run_dir} holds no capstone metrics ({METRICS_DIR}/rank*.jsonl): is it a run directory?"
        )
    result_path = run_dir / RESULT
    result = json.loads(result_path.read_text()) if result_path.exists() else {}
    return CapstoneReport(run_dir, lines, result)
