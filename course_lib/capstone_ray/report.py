"""Reading run reports: side-by-side rows, phases, the kill timeline, reward against wall clock;
and lesson 11's torchrun job on the same task, for the side-by-side.

Every function takes the dicts :func:`course_lib.capstone_ray.controller.run` returns (and
:func:`run_torchrun_same_task`'s), so a notebook can print or plot them without Ray.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The side-by-side columns: (heading, report key).
COLUMNS: tuple[tuple[str, str], ...] = (
    ("updates/s", "updates_per_s"),
    ("samples/s", "samples_per_s"),
    ("controller ms/update", "controller_overhead_ms_per_update"),
    ("lag max", "lag_max"),
    ("held-out start", "eval_start"),
    ("held-out end", "eval_end"),
)


def side_by_side(runs: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per run (``name -> report``): the :data:`COLUMNS` (``None`` where a report lacks one,
    e.g. the torchrun job's controller overhead) and whether its audit was exact."""
    rows = []
    for name, rep in runs.items():
        row: dict[str, Any] = {"run": name}
        for heading, key in COLUMNS:
            row[heading] = rep.get(key)
        audit = rep.get("audit")
        row["audit"] = ("exact" if audit["ok"] else "FAILED") if isinstance(audit, Mapping) else "-"
        rows.append(row)
    return rows


def format_rows(rows: list[dict[str, Any]], digits: int = 3) -> str:
    """A fixed-width text table of ``rows`` (dicts with the same keys), numbers rounded to ``digits``."""
    if not rows:
        return ""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "-" if math.isnan(v) else f"{v:.{digits}g}" if abs(v) >= 1 else f"{v:.{digits}f}"
        return "-" if v is None else str(v)

    keys = list(rows[0])
    cells = [[cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def phases_table(rep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """sync_colocated: the median ms per update of each phase (generate, hand-over, train, sync) and
    its share of their sum. Empty for the split layouts (their phases overlap)."""
    phases = rep.get("phases_ms_median") or {}
    total = sum(phases.values())
    return [
        {"phase": name.removeprefix("phase_"), "ms": ms, "share": ms / total if total else float("nan")}
        for name, ms in phases.items()
    ]


def kill_timeline(rep: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The kill of a generator, as events in seconds after the SIGKILL: the controller sees the death
    (its decoding call fails), the restarted incarnation answers, its first weight transfer starts
    (after any transfer in flight has ended; the engine first rebuilds the group with it), its first
    group comes back. Empty if the run had no kill."""
    k = rep.get("kill") or {}
    if not k:
        return []
    events = [
        (f"SIGKILL of generator 1 (pid {k['old_pid']}) after update {k['u']}", 0.0),
        (f"death seen: its decoding call fails; groups lost in flight: {k['lost_groups']}", k["detect_s"]),
        (f"restarted incarnation answers (pid {k.get('new_pid')})", k["restart_ready_s"]),
        ("it rejoins: its first weight transfer starts (engine: on a rebuilt group)", k["rejoined_s"]),
        ("its first group returns", k["first_group_s"]),
    ]
    # an event that did not happen (a new incarnation back only after the last update returns no group) is left out
    return [{"event": e, "s_after_kill": float(t)} for e, t in events if np.isfinite(t)]


def updates_around(rep: Mapping[str, Any], t: float, window_s: float = 5.0) -> tuple[int, int]:
    """(updates in the ``window_s`` before time ``t``, in the ``window_s`` after), ``t`` in seconds since
    the loop began: the throughput dip of a kill (``t = rep["kill"]["at_s"]``)."""
    times = np.asarray([m["time"] for m in rep["metrics"]])
    return int(((times > t - window_s) & (times <= t)).sum()), int(((times > t) & (times <= t + window_s)).sum())


def reward_vs_time(rep: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since the loop began, batch reward) per update, for a plot against wall clock."""
    m = rep["metrics"]
    return np.asarray([x["time"] for x in m], dtype=float), np.asarray([x["reward"] for x in m], dtype=float)


def heldout_vs_time(rep: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, held-out reward) at the start (0: before the first update) and the end (the last
    update's end): the two evaluations of a run."""
    end = rep["metrics"][-1]["time"] if rep.get("metrics") else 0.0
    return np.asarray([0.0, end]), np.asarray([rep["eval_start"], rep["eval_end"]], dtype=float)


def window(rep: Mapping[str, Any], n: int) -> dict[str, float]:
    """Updates ``0 .. n-1`` of one run: ``updates_per_s`` (from the first update's start to the n-th one's
    end), ``tokens`` (answer tokens per update, mean), ``train_ms`` (median time from submitting an update to
    its end: the trainers' side), ``between_ms`` (median time from one update's end to the next one's start:
    the rest of the loop) and ``waiting`` (share of the window with no update running)."""
    m = rep["metrics"][:n]
    if len(m) < n or n < 2:
        raise ValueError(f"the window needs {n} (at least 2) updates; the run logged {len(rep['metrics'])}")
    span = m[-1]["time"] - m[0]["started"]
    gaps = [m[i + 1]["started"] - m[i]["time"] for i in range(n - 1)]
    return {
        "updates_per_s": n / span,
        "tokens": float(np.mean([x["tokens"] for x in m])),
        "train_ms": 1e3 * float(np.median([x["time"] - x["started"] for x in m])),
        "between_ms": 1e3 * float(np.median(gaps)),
        "waiting": max(0.0, float(sum(gaps))) / span,
    }


def occupancy(rep: Mapping[str, Any], n: int | None = None) -> float | None:
    """The share of the generators' slots busy over their decoding steps: a step costs the same however
    many slots are busy, so 1/occupancy is the price of waiting for a batch's last answers. With ``n``:
    from the run's start to the end of update ``n - 1`` (the running totals each update records);
    without: over the whole run, every generator that reported, weighted by its steps."""
    m = rep.get("metrics", [])
    if n is not None and len(m) >= n and m[n - 1].get("gen_steps"):
        return m[n - 1]["gen_slot_steps"] / (m[n - 1]["gen_steps"] * rep["config"]["n_slots"])
    gens = [g for g in rep.get("generators", []) if g.get("steps")]
    if not gens:
        return None
    return sum(g["occupancy"] * g["steps"] for g in gens) / sum(g["steps"] for g in gens)


def phase_costs(rep: Mapping[str, Any], n: int) -> dict[str, dict[str, float]]:
    """Each colocated phase over updates ``0 .. n-1`` as its median (ms) and, for generation and training,
    its cost per answer token (ms, the slope of a least-squares line through every update's (tokens,
    phase); hand-over and sync move no answer: 0): ``{phase: {"median_ms", "per_token_ms", "tokens"}}``."""
    m = rep["metrics"][:n]
    tok = np.array([x["tokens"] for x in m], dtype=float)
    out = {}
    for k in ("generate", "handover", "train", "sync"):
        ms = 1e3 * np.array([x[f"phase_{k}"] for x in m], dtype=float)
        fit = k in ("generate", "train") and np.ptp(tok) > 0
        slope = float(np.polyfit(tok, ms, 1)[0]) if fit else 0.0
        out[k] = {"median_ms": float(np.median(ms)), "per_token_ms": slope, "tokens": float(tok.mean())}
    return out


def predict_layouts(costs: Mapping[str, Mapping[str, float]], tokens: float) -> dict[str, dict[str, float]]:
    """(12.2) in ms per update for the split placement, at ``tokens`` answer tokens per update, from the
    colocated run's :func:`phase_costs` (both cores per phase): each phase's median moved by its cost per
    token times the difference in tokens, and generation and training twice as long on one core.

    ``sync_split``: the sides in turn (08.9): ``train`` = 2 t_t, ``other`` = 2 t_g + t_s.
    ``pipeline``: the sides overlapped (08.10): ``train`` = the trainers' side 2 t_t + t_s, ``other`` = the
    generators' side 2 t_g (an upper estimate: t_g waits for a batch's last answer, a pipelined generator
    decodes other groups meanwhile); ``update`` = the slower side.
    """
    t_g, t_t, t_s = (costs[k]["median_ms"] + costs[k]["per_token_ms"] * (tokens - costs[k]["tokens"])
                     for k in ("generate", "train", "sync"))  # fmt: skip
    return {
        "sync_split": {"train": 2 * t_t, "other": 2 * t_g + t_s, "update": 2 * t_t + 2 * t_g + t_s},
        "pipeline": {"train": 2 * t_t + t_s, "other": 2 * t_g, "update": max(2 * t_t + t_s, 2 * t_g)},
    }


def layout_check(
    colocated: Mapping[str, Any], sync_split: Mapping[str, Any], pipeline: Mapping[str, Any], n: int
) -> dict[str, Any]:
    """(12.2) against the runs over updates ``0 .. n-1``: each layout's :func:`window`, the colocated
    phases' :func:`phase_costs`, each layout's prediction at its own answer tokens
    (:func:`predict_layouts`; for the pipeline also its generators' side at its own slot
    :func:`occupancy`), measured over predicted rate (``ratio``: for the pipeline against the slower side
    at its occupancy when the runs report it), whether sync_split trained on colocated's tokens update by update, and the share of
    the pipeline's tokens at lag ``bound - 1`` or ``bound`` (the generators held by admission)."""
    w = {name: window(rep, n) for name, rep in (("sync_colocated", colocated), ("sync_split", sync_split),
                                                 ("pipeline", pipeline))}  # fmt: skip
    costs = phase_costs(colocated, n)
    pred = {name: predict_layouts(costs, w[name]["tokens"])[name] for name in ("sync_split", "pipeline")}
    occ = {"sync_colocated": occupancy(colocated, n), "sync_split": occupancy(sync_split, n),
           "pipeline": occupancy(pipeline, n)}  # fmt: skip
    if occ["sync_colocated"] and occ["pipeline"]:  # the generators' side at the pipeline's own occupancy
        gen = pred["pipeline"]["other"] * occ["sync_colocated"] / occ["pipeline"]
        pred["pipeline"] |= {"other_at_occupancy": gen, "update_at_occupancy": max(pred["pipeline"]["train"], gen)}
    width = pipeline["lag_bound"] + 1
    hist = np.sum([np.pad(m["lag_hist"], (0, width - len(m["lag_hist"]))) for m in pipeline["metrics"][:n]], axis=0)
    return {
        "window": w,
        "costs": costs,
        "predicted_ms": pred,
        "ratio": {
            "sync_split": w["sync_split"]["updates_per_s"] * pred["sync_split"]["update"] / 1e3,
            "pipeline": w["pipeline"]["updates_per_s"]
            * pred["pipeline"].get("update_at_occupancy", pred["pipeline"]["update"])
            / 1e3,
        },
        "occupancy": occ,
        "same_tokens": [m["tokens"] for m in colocated["metrics"][:n]]
        == [m["tokens"] for m in sync_split["metrics"][:n]],
        "pipeline_at_bound": float(hist[-2:].sum() / hist.sum()),
    }


def run_torchrun_same_task(
    seed: int = 0,
    n_updates: int = 120,
    max_lag: int = 4,
    deadline_s: float = 300.0,
    *,
    like: Any = None,
    kill_at: int = -1,
    checkpoint_every: int = 40,
) -> dict[str, Any]:
    """Lesson 11's torchrun job with the Ray runs' sizes (2 trainers + 2 generators x 16 slots, the
    same held-out set of 512 prompts), ``max_lag`` 4 (async) or 0 (sync); no calibration; gloo on
    CPUs, as the Ray actors. ``like`` (a :class:`~course_lib.capstone_ray.controller.RayRunConfig`)
    gives the model, learning rate, warm start and batch (default: ``RayRunConfig()``'s), so the two
    runs share their warm start and held-out set at every scale. ``kill_at >= 0``: generator rank 3
    SIGKILLs itself at that update and torchrun restarts the whole job once, from its newest
    checkpoint (every ``checkpoint_every`` updates; none yet: from the warm start).

    Returns ``updates_per_s``, ``samples_per_s``, ``tokens_per_s``, ``eval_start``, ``eval_end``,
    ``lag_max``, ``wall_s``, ``reward_time``/``reward`` (per update, seconds since its first line),
    ``load_1min_before``, and with a kill ``restart``: ``resumed_step``, ``updates_redone``,
    ``discarded_samples``, ``kill_to_restart_s`` (to the restarted attempt's first line) and
    ``kill_to_first_update_s``. Run it inside the loopback namespace like the Ray runs.

    Raises:
        course_lib.capstone.launch.CapstoneFailed: the job failed or ran past ``deadline_s``.
    """
    from course_lib.capstone import run as run_capstone
    from course_lib.capstone_ray.controller import RayRunConfig

    cfg = like if like is not None else RayRunConfig()
    kill = {"kill_rank": 3, "kill_at_update": kill_at} if kill_at >= 0 else {}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        rep = run_capstone(
            d,
            nproc_per_node=4,
            max_restarts=1 if kill_at >= 0 else 0,
            deadline_s=deadline_s,
            show_progress=False,
            echo=None,
            n_updates=n_updates,
            eval_prompts=cfg.eval_prompts,
            eval_seed=cfg.eval_seed,
            calibrate=False,
            n_trainers=2,
            n_slots=cfg.n_slots,
            max_lag=max_lag,
            seed=seed,
            backend="gloo",
            cores=2,  # the two cores the Ray actors pin themselves to (the first two this process may use)
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            lr=cfg.lr,
            clip_c=cfg.clip_c,
            warm_steps=cfg.warm_steps,
            group_size=cfg.group_size,
            groups_per_batch=cfg.groups_per_batch,
            train_chunk=cfg.train_chunk,
            checkpoint_every=checkpoint_every,
            **kill,
        )
        wall = time.perf_counter() - t0
        start, end = rep.held_out()
        hist = rep.lag_histogram()
        times, rewards = rep.reward_vs_time()
        out: dict[str, Any] = {
            "updates_per_s": rep.updates_per_s,
            "samples_per_s": rep.samples_per_s,
            "tokens_per_s": rep.tokens_per_s,
            "eval_start": start,
            "eval_end": end,
            "lag_max": int(max((i for i, h in enumerate(hist) if h), default=0)),
            "wall_s": wall,
            "reward_time": times.tolist(),
            "reward": rewards.tolist(),
            "load_1min_before": load,
        }
        if kill_at >= 0:
            (restart,) = rep.restarts
            kill_t = next(x["t"] for x in rep.lines if x["kind"] == "event" and "kills itself" in x["message"])
            first_line = min(x["t"] for x in rep.lines if x.get("attempt") == 1)
            first_update = min(x["t"] for x in rep.lines if x["kind"] == "update" and x["attempt"] == 1)
            audit = rep.result["audit"]
            out["restart"] = {
                "resumed_step": int(restart["resumed_step"]),
                "updates_redone": len(rep.updates["update"]) - n_updates,
                "discarded_samples": int(audit["discarded_samples"]),
                "audit_ok": bool(audit["ok"]),
                "kill_to_restart_s": first_line - kill_t,
                "kill_to_first_update_s": first_update - kill_t,
            }
        return out
