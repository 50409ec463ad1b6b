"""What one capstone run depends on (:class:`CapstoneConfig`), and its command line.

The job script (:mod:`course_lib.capstone.job`), the launcher
(:mod:`course_lib.capstone.launch`) and ``course capstone`` share this one dataclass: every
field is a ``--flag`` (underscores become dashes), with the field's help text, so the three
never disagree. Sizes follow the run contract (``COURSE_SCALE``): ``cpu`` (default) is what
CI runs, a 2-core laptop in about a minute; ``full`` is a bigger model and more updates for
GPUs (NCCL).

Bad input fails early with a message that names the field and how to fix it
(:meth:`CapstoneConfig.__post_init__`); what depends on the world size (at least one
generator and two trainers) is checked by :func:`course_lib.capstone.roles.assign_roles`.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from course_lib.course.scale import pick

if TYPE_CHECKING:
    from course_lib.lm.model import LMConfig

BACKENDS = ("auto", "gloo", "nccl")
#: Arms one launch may run in turn (``--arms``): the pipeline as configured (weights by broadcast), the same
#: pipeline with its weights through shared memory, synchronous RL on the same split (generators wait while the
#: trainers train), and synchronous RL colocated (every rank generates its share, then trains on it). An arm may
#: pin its own layout: ``async@3x16`` is the pipeline on 3 trainers and generators of 16 slots.
ARMS = ("async", "async-shm", "sync", "sync-colocated")
#: Decoding slots per generator the layout model chooses among (``--n-slots 0``).
SLOT_CHOICES = (16, 32, 64)


def parse_arm(label: str) -> tuple[str, tuple[int, int] | None]:
    """``"async@3x16"`` -> ``("async", (3, 16))``; ``"sync"`` -> ``("sync", None)``.

    Raises:
        ValueError: an unknown arm, or a layout that is not ``TxS`` with T >= 2 and S >= 1.
    """
    name, _, layout = label.partition("@")
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}: one of {', '.join(ARMS)}")
    if not layout:
        return name, None
    t, _, slots = layout.partition("x")
    if not (t.isdigit() and slots.isdigit()) or int(t) < 2 or int(slots) < 1:
        raise ValueError(f"arm {label!r}: the layout after @ is TxS, T >= 2 trainers and S >= 1 slots, e.g. async@3x16")
    return name, (int(t), int(slots))


def _f(default: Any, help: str) -> Any:
    """A dataclass field with a help string (the ``--flag``'s help)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class CapstoneConfig:
    """Every knob of one run; ``--flag`` per field (see the module docstring)."""

    run_dir: str = _f("", "directory of the run: metrics/*.jsonl, checkpoints/, plan.json, result.json")
    resume: bool = _f(False, "continue from the newest complete checkpoint in run_dir (it must exist)")
    n_updates: int = _f(pick(cpu=240, full=2000), "trainer updates (optimizer steps) in the run")
    group_size: int = _f(8, "G answers sampled per prompt (one GRPO group)")
    groups_per_batch: int = _f(4, "B prompts per update, split over the trainer ranks (B >= trainers)")
    max_lag: int = _f(4, "most updates a consumed token may lag (backpressure); 0 = synchronous RL")
    n_trainers: int = _f(0, "trainer ranks (>= 2); 0 = chosen by lesson 08's layout model")
    n_slots: int = _f(0, f"decoding slots per generator; 0 = chosen by the layout model among {SLOT_CHOICES}")
    lr: float = _f(pick(cpu=3e-4, full=1e-4), "Adam learning rate of the RL updates (BENCHMARKS.md: how it was chosen)")
    clip_c: float = _f(2.0, "truncation level c of the per-token importance weights (eq. 07.1)")
    train_chunk: int = _f(8, "trainer: sequences per forward pass, sorted by length")
    warm_steps: int = _f(60, "supervised warm-start steps before RL (training prompts only)")
    eval_prompts: int = _f(
        pick(cpu=512, full=2048),
        "fixed evaluation prompts (drawn as the training prompts are) scored by the trainers at start and end",
    )
    eval_seed: int = _f(123, "seed of the held-out prompts (lesson 07's)")
    checkpoint_every: int = _f(pick(cpu=40, full=200), "updates between checkpoints (and one at the end)")
    keep_checkpoints: int = _f(3, "committed checkpoints kept (the newest that verifies is always kept)")
    backend: str = _f(
        "auto",
        "'gloo' (CPUs, or one GPU shared with --colocated), 'nccl' (one GPU per rank) or 'auto' (nccl when "
        "there is a GPU per rank and not --colocated)",
    )
    colocated: bool = _f(
        False,
        "the pipeline's weights to the generators through a shared buffer on the host, not the broadcast (GPUs: "
        "every rank on one GPU, CUDA IPC)",
    )
    colocated_sync: bool = _f(
        False,
        "synchronous RL on the same ranks: every rank generates its share of the batch with the current weights, "
        "then trains on it (no generator ranks, no weight transfer; needs --max-lag 0)",
    )
    sync_method: str = _f("pipelined", "lesson 09's method for the broadcast ('bucketed' or 'pipelined')")
    bucket_mb: float = _f(0.25, "bucket size of the weight broadcast in MiB")
    calibrate: bool = _f(True, "time the parts on this machine and let lesson 08's model choose the layout")
    d_model: int = _f(pick(cpu=64, full=256), "TinyLM width")
    n_layers: int = _f(pick(cpu=2, full=4), "TinyLM layers")
    n_heads: int = _f(pick(cpu=4, full=8), "TinyLM attention heads")
    seed: int = _f(0, "seeds the warm start, the prompts (per group number) and the samplers")
    timeout_s: float = _f(60.0, "longest wait for any one thing (a collective, a group, a rank) before failing")
    kill_rank: int = _f(-1, "fault injection: this rank SIGKILLs itself once (-1: none)")
    kill_at_update: int = _f(-1, "... when it reaches this update (trainer: after it; generator: on its weights)")
    arms: str = _f(
        "",
        "run these arms one after another in this one launch (one start-up), each in run_dir/NN-ARM: "
        "'async' (as configured, the broadcast), 'async-shm' (the shared buffer), 'sync' (--max-lag 0, same "
        "split), 'sync-colocated' (--colocated-sync); NAME@TxS pins T trainers and S slots; comma-separated, e.g. "
        "async,sync-colocated,async,sync-colocated (interleaved rounds)",
    )
    round_seeds: bool = _f(
        False,
        "with --arms: the r-th run of an arm label (its round r) uses seed + r, so rounds replicate the whole run "
        "(warm start, prompts, sampling) and every arm of a round shares its seed",
    )

    def __post_init__(self) -> None:
        problems = []
        if self.max_lag < 0:
            problems.append(f"--max-lag must be >= 0 (0 = synchronous), got {self.max_lag}")
        if self.group_size < 2:
            problems.append(f"--group-size must be >= 2 for group-relative advantages, got {self.group_size}")
        for name in ("n_updates", "groups_per_batch", "train_chunk", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                problems.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.n_trainers == 1 or self.n_trainers < 0:
            problems.append(f"--n-trainers must be >= 2 (or 0: chosen by the layout model), got {self.n_trainers}")
        if self.n_slots < 0:
            problems.append(f"--n-slots must be >= 1 (or 0: chosen by the layout model), got {self.n_slots}")
        if self.backend not in BACKENDS:
            problems.append(f"--backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.sync_method not in ("bucketed", "pipelined"):
            problems.append(
                f"--sync-method must be 'bucketed' or 'pipelined' (checksummed buckets), got {self.sync_method!r}"
            )
        if self.warm_steps < 0 or self.eval_prompts < 0:
            problems.append("--warm-steps and --eval-prompts must be >= 0")
        if self.timeout_s <= 0 or self.lr <= 0 or self.clip_c <= 0 or self.bucket_mb <= 0:
            problems.append("--timeout-s, --lr, --clip-c and --bucket-mb must be > 0")
        if (self.kill_rank >= 0) != (self.kill_at_update >= 0):
            problems.append("fault injection needs both --kill-rank and --kill-at-update (or neither)")
        if self.colocated_sync and (self.max_lag != 0 or self.colocated):
            problems.append("--colocated-sync is synchronous RL on every rank: give --max-lag 0, without --colocated")
        if self.arms:
            unknown = []
            for a in self.arm_list:
                try:
                    parse_arm(a)
                except ValueError:
                    unknown.append(a)
            if unknown:
                problems.append(
                    f"--arms takes {', '.join(ARMS)}, each optionally @TxS (comma-separated), got {', '.join(unknown)}"
                )
            if self.resume or self.kill_rank >= 0 or self.colocated or self.colocated_sync:
                problems.append(
                    "--arms runs fresh arms without faults: leave out --resume, --kill-rank, --colocated, "
                    "--colocated-sync"
                )
            if self.max_lag < 1:
                problems.append("--arms compares against synchronous RL: give the async arms --max-lag >= 1")
        if problems:
            raise ValueError("bad capstone configuration: " + "; ".join(problems))
        if self.d_model % self.n_heads or min(self.d_model, self.n_layers, self.n_heads) < 1:
            raise ValueError(
                f"bad capstone configuration: --d-model ({self.d_model}) must be a positive multiple of "
                f"--n-heads ({self.n_heads}), and --n-layers ({self.n_layers}) >= 1"
            )

    @property
    def lm(self) -> LMConfig:
        """The TinyLM's sizes (the vocabulary and length of the countdown task)."""
        from course_lib.lm.model import LMConfig
        from course_lib.lm.task import TaskConfig

        task = TaskConfig()
        return LMConfig(
            vocab=task.vocab, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads, max_len=task.max_len
        )

    @property
    def arm_list(self) -> list[str]:
        """``--arms`` as a list (empty: one run, this config)."""
        return [a.strip() for a in self.arms.split(",") if a.strip()]

    def arm(self, index: int) -> CapstoneConfig:
        """The config of arm ``index`` of ``--arms``: its own run directory ``run_dir/NN-ARM``."""
        label = self.arm_list[index]
        name, layout = parse_arm(label)
        round_ = self.arm_list[:index].count(label)  # earlier runs of this label
        # without @TxS an arm keeps the launch's layout; sync-colocated then trains on every rank
        n_trainers, n_slots = (
            layout if layout else (0, 0) if name == "sync-colocated" else (self.n_trainers, self.n_slots)
        )
        return dataclasses.replace(
            self,
            arms="",
            run_dir=str(Path(self.run_dir) / f"{index:02d}-{label.replace('@', '-')}"),
            max_lag=0 if name.startswith("sync") else self.max_lag,
            colocated=name == "async-shm",
            colocated_sync=name == "sync-colocated",
            n_trainers=n_trainers,
            n_slots=n_slots,
            seed=self.seed + round_ if self.round_seeds else self.seed,
            round_seeds=False,
        )

    @property
    def batch_sequences(self) -> int:
        """Answers per update: ``group_size x groups_per_batch``."""
        return self.group_size * self.groups_per_batch

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


#: Fields a resumed run may change; everything else must match the checkpoint's config.
RESUMABLE_CHANGES = frozenset(
    {"run_dir", "resume", "n_updates", "timeout_s", "kill_rank", "kill_at_update", "calibrate", "backend"}
)


def add_arguments(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One ``--flag`` per :class:`CapstoneConfig` field (booleans: ``--flag`` / ``--no-flag``)."""
    for f in dataclasses.fields(CapstoneConfig):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if isinstance(f.default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=help_text)
        else:
            parser.add_argument(
                flag, type=type(f.default), default=f.default, help=f"{help_text} (default {f.default})"
            )


def from_args(args: argparse.Namespace) -> CapstoneConfig:
    """The config of parsed ``args`` (fields missing from ``args`` keep their defaults)."""
    names = {f.name for f in dataclasses.fields(CapstoneConfig)}
    return CapstoneConfig(**{k: v for k, v in vars(args).items() if k in names})


def to_argv(config: CapstoneConfig) -> list[str]:
    """The ``--flag value`` list that :func:`from_args` turns back into ``config`` (defaults left out)."""
    argv: list[str] = []
    for f in dataclasses.fields(CapstoneConfig):
        value = getattr(config, f.name)
        if value == f.default and f.name != "run_dir":
            continue
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    return argv


def config_differences(saved: dict[str, Any], config: CapstoneConfig) -> list[str]:
    """``"field: checkpoint X, now Y"`` for every field a resume may not change but does."""
    now = config.to_dict()
    return [
        f"{k}: checkpoint {saved.get(k)!r}, now {v!r}"
        for k, v in now.items()
        if k not in RESUMABLE_CHANGES and k in saved and saved[k] != v
    ]
