"""Real processes for weight sync: one sender (rank 0) and receivers, joined by torch.distributed.

:func:`run_trials` starts a :class:`RankGroup` of ``world_size`` processes (``forkserver``;
each runs one torch thread and exits by itself if its parent dies) on a free port of
127.0.0.1, initialises a gloo process group with a timeout (NCCL with ``backend="nccl"``:
rank ``r`` on GPU ``r``, refused before any rank starts when this machine shows fewer GPUs
than ranks), runs a list of :class:`Trial` s in every rank, and returns what
each rank measured. Every wait has a deadline; whatever happens, every child is stopped
the way every system of the course stops its children
(:func:`course_lib.runtime.processes.stop_processes`) and the process group is destroyed in
every rank that can still do it.

One node only: every rank runs on this machine and the rendezvous is 127.0.0.1 (there is
no option for another address; a multi-node job is launched by ``torchrun``, as the
capstone's is).
"""

from __future__ import annotations

import queue as queue_mod
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch

from course_lib.runtime import ranks
from course_lib.weight_sync.config import SyncConfig
from course_lib.weight_sync.endpoints import Receiver, Sender
from course_lib.weight_sync.faults import Fault
from course_lib.weight_sync.integrity import SenderLostError, WeightSyncError
from course_lib.weight_sync.specs import TensorSpec, make_weights, total_bytes

K = TypeVar("K")


@dataclass(frozen=True)
class Trial:
    """One measurement: ``updates`` timed updates (after ``warmup`` untimed ones) of a model.

    ``fault`` (a :class:`~course_lib.weight_sync.faults.Fault`, e.g. ``CorruptBucket(2)``)
    breaks the sender's first timed update; ``receiver_specs`` gives receivers another model
    (shape mismatch); ``drift`` makes every version different (``specs.make_weights``) and
    has the receivers report their error against the exact weights. ``go_on_after_rejection``
    sends the following updates after a rejected one (its error is kept), as a trainer does.
    """

    config: SyncConfig
    specs: tuple[TensorSpec, ...]
    updates: int = 3
    warmup: int = 1
    fault: Fault | None = None
    receiver_specs: tuple[TensorSpec, ...] | None = None
    drift: bool = False
    seed: int = 0
    go_on_after_rejection: bool = False

    def __post_init__(self) -> None:
        if self.fault is not None:
            self.fault.check(self.config)


@dataclass
class TrialResult:
    """What one trial measured, merged over ranks."""

    trial: Trial
    seconds: list[float] = field(default_factory=list)  # per timed update: slowest rank
    phases: dict[int, list[dict[str, float]]] = field(default_factory=dict)  # rank -> per-update stage seconds
    errors: dict[int, str] = field(default_factory=dict)  # rank -> "ErrorType: message"
    max_abs_error: list[float] = field(default_factory=list)  # per update, worst receiver (drift or check)
    max_rel_error: list[float] = field(default_factory=list)
    kept_version: dict[int, int] = field(default_factory=dict)  # receiver rank -> active version at the end
    kept_bytes: dict[int, int] = field(default_factory=dict)  # receiver rank -> bytes of its weights
    final_abs_error: float | None = None  # worst receiver: its active weights against the exact kept version

    @property
    def nbytes(self) -> int:
        return total_bytes(list(self.trial.specs))

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    @property
    def gb_per_s(self) -> float:
        """Effective bandwidth: model bytes over the median update time (GB = 1e9 bytes)."""
        return self.nbytes / self.median_s / 1e9


def _errors(weights: dict[str, torch.Tensor], receiver: Receiver) -> tuple[float, float]:
    """(max abs, max relative) error of a receiver's active weights against ``weights`` (its shards)."""
    worst_abs, worst_ref = 0.0, 0.0
    for name, got in receiver.store.active.items():
        want = weights[name][receiver.index[name]]
        worst_abs = max(worst_abs, float((got - want).abs().max()))
        worst_ref = max(worst_ref, float(want.abs().max()))
    return worst_abs, worst_abs / max(worst_ref, 1e-30)


_CACHE: dict[tuple[int, int, int], dict[str, torch.Tensor]] = {}


def _weights(specs: tuple[TensorSpec, ...], seed: int, version: int) -> dict[str, torch.Tensor]:
    """``make_weights``, keeping the last result: trials on one model reuse its tensors (read-only)."""
    key = (hash(specs), seed, version)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _on_device(make_weights(list(specs), seed, version))
    return _CACHE[key]


def _on_device(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights on this rank's GPU under NCCL (as a trainer's would be), else as they are."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return {n: w.cuda() for n, w in weights.items()}
    return weights


def _connect(trial: Trial, config: SyncConfig, rank: int) -> Sender | Receiver:
    """This rank's end of the trial's updates (the handshake: raises on every rank if a model mismatches)."""
    if rank == 0:
        return Sender(config, list(trial.specs))
    return Receiver(config, list(trial.receiver_specs or trial.specs))


def _weights_for_update(
    trial: Trial, endpoint: Sender | Receiver, version: int, weights: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The weights of update ``version``: with ``drift`` that version's (on every rank: receivers check
    against them), else the same as before. With ``in_place`` the sender, as the trainer, writes them
    into its bucket-layout storage and sends that."""
    if trial.drift:
        weights = _on_device(make_weights(list(trial.specs), trial.seed, version))
    if isinstance(endpoint, Sender) and endpoint.config.in_place and (version == 1 or trial.drift):
        for name, w in weights.items():
            endpoint.weights[name].copy_(w)
        weights = endpoint.weights
    return weights


def _kept(trial: Trial, receiver: Receiver) -> dict[str, Any]:
    """What a receiver holds after the trial: its version, its bytes, and its error against the exact kept version."""
    out: dict[str, Any] = {"kept_version": receiver.store.version, "kept_bytes": receiver.store.nbytes()}
    if receiver.method.delivers_weights and receiver.store.version > 0:  # what inference reads now, against the truth
        reference = _weights(trial.specs, trial.seed, receiver.store.version if trial.drift else 0)
        out["final_abs"] = _errors(reference, receiver)[0]
    return out


def _run_trial(trial: Trial, rank: int, workdir: str) -> dict[str, Any]:
    """One trial in one rank: ``warmup`` untimed then ``updates`` timed updates; what this rank measured."""
    import torch.distributed as dist

    config = replace(trial.config, workdir=workdir) if trial.config.method == "naive" else trial.config
    out: dict[str, Any] = {"seconds": [], "phases": [], "abs": [], "rel": [], "error": None}
    try:
        endpoint = _connect(trial, config, rank)
    except Exception as exc:  # the handshake failed: every rank knows
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    weights = _weights(trial.specs, trial.seed, 0) if rank == 0 and not trial.drift else {}
    for k in range(trial.warmup + trial.updates):
        version = k + 1
        weights = _weights_for_update(trial, endpoint, version, weights)
        if isinstance(endpoint, Sender):
            endpoint.arm(trial.fault if k == trial.warmup else None)
        dist.barrier()
        start = time.perf_counter()
        try:
            phases = endpoint.send(weights, version) if isinstance(endpoint, Sender) else endpoint.receive(version)
        except Exception as exc:
            out["error"] = out["error"] or f"{type(exc).__name__}: {exc}"
            if (
                trial.go_on_after_rejection
                and isinstance(exc, WeightSyncError)
                and not isinstance(exc, SenderLostError)
            ):
                continue  # every receiver kept its previous weights: the next version goes out as usual
            break
        elapsed = time.perf_counter() - start
        if k < trial.warmup:
            continue
        out["seconds"].append(elapsed)
        out["phases"].append(phases.as_dict())
        if isinstance(endpoint, Receiver) and trial.drift:
            a, r = _errors(weights, endpoint)
            out["abs"].append(a)
            out["rel"].append(r)
    if isinstance(endpoint, Receiver):
        out.update(_kept(trial, endpoint))
    return out


def _rank_work(rank: int, results: Any, trials: list[Trial], workdir: str) -> None:
    """One rank, in the group: run every trial, report each, then say goodbye."""
    for i, trial in enumerate(trials):
        report = _run_trial(trial, rank, workdir)
        results.put((rank, i, report, None))  # one message per trial: a rank killed later keeps its reports
        if report["error"] and "SenderLost" in report["error"]:
            break  # the group is broken: nothing more can be sent
    results.put((rank, -1, None, None))


def _rank_failed(rank: int, exc: BaseException) -> tuple[int, int, None, str]:
    """The goodbye of a rank that failed outside a trial (joining the group, say)."""
    return (rank, -1, None, f"{type(exc).__name__}: {exc}")


class RanksFailed(RuntimeError):
    """A rank died or the run passed its deadline; every child was stopped."""


class RankGroup(ranks.RankGroup):
    """``world_size`` rank processes (rank 0 sends) running ``trials`` in one process group.

    A context manager on the runtime floor (:class:`course_lib.runtime.ranks.RankGroup`):
    ``with RankGroup(...) as group:`` starts the ranks, :meth:`collect` gathers their
    reports, and leaving the block always stops every rank the way every system does
    (``stop_processes``: join, terminate, kill) and removes the work directory.
    """

    def __init__(self, trials: list[Trial], world_size: int, backend: str, timeout_s: float) -> None:
        super().__init__(
            world_size,
            _rank_work,
            _rank_failed,
            name="weight-sync-rank",
            preload=__name__,
            timeout_s=timeout_s,
            backend=backend,
            stop_timeout_s=10.0,
            kill_wait_s=5.0,
        )
        self.trials = trials

    def _rank_args(self) -> tuple[Any, ...]:
        """The trials and a fresh work directory (for the naive method's files)."""
        from course_lib.course.paths import cache_dir

        cache_dir().mkdir(parents=True, exist_ok=True)
        self.workdir = tempfile.mkdtemp(prefix="weight-sync-", dir=cache_dir())
        return (self.trials, self.workdir)

    def collect(self, deadline_s: float) -> dict[int, list[dict[str, Any]]]:
        """Each rank's reports, one per trial it finished, once every rank has said goodbye or died.

        Raises:
            RanksFailed: a rank failed outside a trial, or ``deadline_s`` passed.
        """
        received: dict[int, dict[int, dict[str, Any]]] = {r: {} for r in range(self.world_size)}
        done: set[int] = set()
        failures: list[str] = []
        end = time.monotonic() + deadline_s
        while len(done) < self.world_size:
            try:
                rank, index, report, error = self.results.get(timeout=0.5)
            except queue_mod.Empty:
                # ranks that exited without saying goodbye (e.g. an injected kill), 3 s after their exit
                done |= set(self.silent_exits(done, grace_s=3.0))
                if time.monotonic() > end:
                    raise RanksFailed(f"the ranks did not finish within {deadline_s:.0f} s; all were stopped") from None
                continue
            if index >= 0:
                received[rank][index] = report
            else:
                done.add(rank)
                if error:
                    failures.append(f"rank {rank}: {error}")
        if failures:
            raise RanksFailed("; ".join(failures))
        return {r: [got[i] for i in range(len(got)) if i in got] for r, got in received.items()}

    def stop(self) -> None:
        """Stop every started rank (join, then terminate, then kill), close the queue, remove the work directory."""
        super().stop()
        if getattr(self, "workdir", None):
            shutil.rmtree(self.workdir, ignore_errors=True)


def run_trials(
    trials: list[Trial],
    world_size: int = 2,
    *,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    deadline_s: float = 600.0,
) -> list[TrialResult]:
    """Run ``trials`` in ``world_size`` real processes (rank 0 sends); merge what the ranks report.

    One node: every rank runs on this machine, meeting the others on 127.0.0.1.

    Args:
        trials: the measurements, run in order in one process group.
        world_size: 1 sender + ``world_size - 1`` receivers (>= 2).
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (GPUs: rank ``r`` on GPU ``r``, so this machine
            must show at least ``world_size`` GPUs; the weights then live on the GPU).
        timeout_s: torch.distributed's timeout for every collective (a dead peer is reported after at most this).
        deadline_s: the whole run's limit; after it every child is killed.

    Raises:
        ValueError: ``world_size`` below 2, an unknown ``backend``, or ``"nccl"`` with fewer visible
            GPUs than ranks (before any rank starts; the message says what to do instead).
        RanksFailed: a rank died without reporting or the deadline passed (children are stopped first).
    """
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2 (one sender, at least one receiver), got {world_size}")
    with RankGroup(trials, world_size, backend, timeout_s) as group:
        reports = group.collect(deadline_s)
    return [_merge(t, i, reports) for i, t in enumerate(trials)]


def _merge(trial: Trial, i: int, reports: dict[int, list[dict[str, Any]]]) -> TrialResult:
    res = TrialResult(trial)
    per_rank = {r: rep[i] for r, rep in reports.items() if len(rep) > i}
    if per_rank:
        n = min(len(o["seconds"]) for o in per_rank.values())
        res.seconds = [max(o["seconds"][k] for o in per_rank.values()) for k in range(n)]
    for r, o in per_rank.items():
        res.phases[r] = o["phases"]
        if o["error"]:
            res.errors[r] = o["error"]
        if r > 0:
            res.kept_version[r] = o.get("kept_version", 0)
            res.kept_bytes[r] = o.get("kept_bytes", 0)
    for r in reports:
        if len(reports[r]) <= i:
            res.errors.setdefault(r, "no report: the process died")
    receivers = [o for r, o in per_rank.items() if r > 0]
    if receivers and receivers[0]["abs"]:
        res.max_abs_error = [max(o["abs"][k] for o in receivers) for k in range(len(receivers[0]["abs"]))]
        res.max_rel_error = [max(o["rel"][k] for o in receivers) for k in range(len(receivers[0]["rel"]))]
    finals = [o["final_abs"] for o in receivers if "final_abs" in o]
    res.final_abs_error = max(finals) if finals else None
    return res


def merge_rounds(rounds: list[TrialResult]) -> TrialResult:
    """One result from several runs of the same trial: timings, phases and errors of every round together.

    ``final_abs_error`` is the worst round's (``None`` if no round checked it); kept versions and
    bytes are the last round's.
    """
    if not rounds:
        raise ValueError("merge_rounds needs at least one result")
    out = TrialResult(rounds[0].trial)
    for r in rounds:
        out.seconds += r.seconds
        for rank, phases in r.phases.items():
            out.phases.setdefault(rank, []).extend(phases)
        for rank, error in r.errors.items():
            out.errors.setdefault(rank, error)
        out.max_abs_error += r.max_abs_error
        out.max_rel_error += r.max_rel_error
        out.kept_version.update(r.kept_version)
        out.kept_bytes.update(r.kept_bytes)
    finals = [r.final_abs_error for r in rounds if r.final_abs_error is not None]
    out.final_abs_error = max(finals) if finals else None
    return out


def run_interleaved(trials: dict[K, Trial], rounds: int, world_size: int = 2, **kwargs: Any) -> dict[K, TrialResult]:
    """Run every trial ``rounds`` times, interleaved round by round (A B C, A B C, ...), in one process group.

    Variants compared side by side then see the same machine load (on a shared machine the load
    drifts between minutes); each key's rounds are merged with :func:`merge_rounds`, so its
    ``median_s`` is the median over all rounds. ``kwargs`` go to :func:`run_trials`.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    keys = list(trials)
    flat = run_trials([trials[k] for _ in range(rounds) for k in keys], world_size, **kwargs)
    return {k: merge_rounds(flat[i :: len(keys)]) for i, k in enumerate(keys)}
