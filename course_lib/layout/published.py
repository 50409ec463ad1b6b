"""Published asynchronous-RL systems as data, and the layout model held against them (lesson 08).

Each :class:`PublishedCase` records a comparison a paper or a framework's documentation
published: the setting it states (model, GPU kind and count, the split, the batch, the
generation limit, the staleness knob, what the trainer recomputes) and the speedup it
measured over a stated baseline. :func:`predicted_speedup` runs both arms through
:func:`course_lib.layout.model.predict` and returns the model's ratio beside the published one.

What the sources do not state is chosen **once**, in :data:`SHARED`, and used by every case;
nothing here is fitted to a case's published ratio:

* answer lengths: log-normal with a mean of 2,000 tokens and ``p99 / median = 8`` (the
  calculator's defaults: a reasoning workload with the talk's 1% straggler tail), clipped at
  the case's generation limit. A check, not a fit: verl's colocated 128-GPU run spent 114 s
  per step in its update (8,192 samples on 128 H20s), which at 40% MFU is 2,050 answer
  tokens per sample after 256 prompt tokens (:func:`implied_mfu` turns it around);
* 256 prompt tokens per sample;
* training at 40% MFU (large dense runs report 38-43% bf16 MFU on H100s: Llama 3, arXiv
  2407.21783, Table 4), decode at 70% of peak bandwidth and FLOP/s (an assumption: a
  well-tuned engine), 90% of memory usable;
* the weight sync at 125 GB/s (the rate behind verl's 0.12 s update of a 7B model).

The model compares *steady states*: it has no start-up, no evaluation, and lengths that do
not drift over training. Where a published ratio and the model's differ by more than 25%,
:attr:`PublishedCase.known_gap` names what the model lacks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from course_lib.layout.model import (
    GPU,
    H20,
    H100_SXM,
    QWEN25_7B,
    Admission,
    Layout,
    LengthDist,
    ModelShape,
    Prediction,
    SystemSpec,
    lognormal_lengths,
    predict,
    spec_from_hardware,
)


@dataclass(frozen=True)
class Shared:
    """The assumptions every case shares (module docstring): one choice, never per case."""

    mean_answer_tokens: float = 2000.0
    p99_over_median: float = 8.0
    prompt_tokens: int = 256
    mfu: float = 0.4
    decode_efficiency: float = 0.7
    memory_fraction: float = 0.9
    sync_bytes_per_s: float = 125e9
    n_length_samples: int = 8192
    seed: int = 0

    def lengths(self, generation_limit: int) -> LengthDist:
        """The shared answer-length distribution under a generation limit."""
        return lognormal_lengths(
            self.mean_answer_tokens, self.p99_over_median, n_samples=self.n_length_samples, seed=self.seed,
            max_tokens=generation_limit,
        )  # fmt: skip


#: The shared assumptions.
SHARED = Shared()


@dataclass(frozen=True)
class Arm:
    """One side of a published comparison, as the source states it.

    Attributes:
        layout: the model's layout for it.
        n_gpus: GPUs in all.
        n_samplers: sampler GPUs of a split layout (``None`` for sync_colocated).
        max_lag: the staleness knob in optimizer steps (``math.inf``: none).
        admission: what happens to a straggler (``"fifo"`` unless the system bounds every lag).
        extra_forward_passes: forward passes the trainer runs besides the update (old-policy
            log-probs recomputed: 1; a reference model: 1 more).
        batches_per_generation: batches generated per weight version (synchronous arms).
    """

    layout: Layout
    n_gpus: int
    n_samplers: int | None = None
    max_lag: float = 0.0
    admission: Admission = "fifo"
    extra_forward_passes: int = 0
    batches_per_generation: int = 1

    def label(self) -> str:
        split = f"{self.n_samplers}:{self.n_gpus - self.n_samplers}" if self.n_samplers else f"{self.n_gpus} GPUs"
        return f"{self.layout} {split}"


@dataclass(frozen=True)
class PublishedCase:
    """A published speedup and the setting behind it.

    Attributes:
        name: short label.
        source: where the figure is published (paper section, documentation page).
        model, gpu: the model's shape and the GPU kind.
        batch_samples: samples per optimizer step (or per weight version).
        generation_limit: the maximum answer length, tokens.
        system, baseline: the two arms compared.
        published_speedup: the published ratio (baseline time / system time, equal work).
        max_num_seqs: the engine's cap on concurrent sequences, when the source states it.
        setting: the stated setting, in words.
        known_gap: what the model lacks, where its ratio misses the published one by more than 25%.
        published_step_s: seconds per optimizer step (system, baseline), where published.
        published_train_s: the trainer's seconds per step (update plus recomputed log-probs),
            (system, baseline), where published.
    """

    name: str
    source: str
    model: ModelShape
    gpu: GPU
    batch_samples: int
    generation_limit: int
    system: Arm
    baseline: Arm
    published_speedup: float
    max_num_seqs: int | None = None
    setting: str = ""
    known_gap: str = ""
    published_step_s: tuple[float | None, float | None] = (None, None)
    published_train_s: tuple[float | None, float | None] = (None, None)
    shared: Shared = field(default=SHARED, repr=False)

    def spec(self, arm: Arm) -> SystemSpec:
        """The model's :class:`SystemSpec` of one arm, from the case and :data:`SHARED`."""
        s = self.shared
        lengths = s.lengths(self.generation_limit)
        model = self.model
        return spec_from_hardware(
            model,
            self.gpu,
            n_gpus=arm.n_gpus,
            n_samplers=arm.n_samplers,
            batch_samples=self.batch_samples,
            answer_tokens=lengths.batch(self.batch_samples, seed=s.seed),
            prompt_tokens=s.prompt_tokens,
            generation_limit=self.generation_limit,
            max_num_seqs=self.max_num_seqs,
            mfu=s.mfu,
            memory_fraction=s.memory_fraction,
            efficiency=s.decode_efficiency,
            extra_forward_passes=arm.extra_forward_passes,
            weight_sync_s=model.weight_bytes / s.sync_bytes_per_s,
            max_lag=arm.max_lag,
            admission=arm.admission,
            batches_per_generation=arm.batches_per_generation,
        )


@dataclass(frozen=True)
class Comparison:
    """The model's two arms of a case and their ratio beside the published one."""

    case: PublishedCase
    system: Prediction
    baseline: Prediction

    @property
    def predicted_speedup(self) -> float:
        return self.system.tokens_per_s / self.baseline.tokens_per_s

    @property
    def ratio(self) -> float:
        """Predicted / published speedup (1.0 = exact)."""
        return self.predicted_speedup / self.case.published_speedup

    @property
    def within_25_percent(self) -> bool:
        return abs(self.ratio - 1.0) <= 0.25

    def implied_mfu(self) -> tuple[float | None, float | None]:
        """The MFU at which the model's trainer would take the published trainer time per step,
        with the shared lengths (system, baseline); ``None`` where no time is published. Above 1
        is impossible: the published run's answers were shorter than the shared ones."""
        out: list[float | None] = []
        for pred, published in zip((self.system, self.baseline), self.case.published_train_s):
            out.append(None if published is None else self.case.shared.mfu * pred.train_s / published)
        return out[0], out[1]


def predicted_speedup(case: PublishedCase) -> Comparison:
    """Both arms of ``case`` through the model (:func:`~course_lib.layout.model.predict`)."""
    return Comparison(
        case,
        predict(case.system.layout, case.spec(case.system)),
        predict(case.baseline.layout, case.spec(case.baseline)),
    )


_VERL_ASYNC = (
    "verl docs, advance/fully_async.md ('Asynchronous Training on 7B Model'): Qwen2.5-Math-7B, H20, DAPO, "
    "max response 28K, rollout.n 16, train_batch_size 512 prompts (8,192 samples per weight version), "
    "async: require_batches 4, trigger_parameter_sync_step 4, staleness_threshold 0.5, partial rollouts, "
    "old log-probs from the rollout; colocated sync recomputes them (its old_log_prob stage); totals at 400 steps"
)
_VERL_ASYNC_GAP = (
    "the published per-stage times show the separated trainer updating as fast on half the GPUs as the "
    "colocated one on all of them (update_actor {async_s} s on {n_t} GPUs vs {sync_s} s on {n} GPUs per step); "
    "a model that charges training by FLOPs over the trainer GPUs cannot: it lacks what slows a colocated "
    "trainer (sharing memory with the engine: offloading, smaller micro-batches, context switches) and the "
    "response-length drift between the runs"
)
_VERL_ONE_STEP = (
    "verl docs, advance/one_step_off.md: Qwen2.5-Math-7B, 16 H20 (4 generate, 12 train), DAPO, vLLM; "
    "max response {limit:,} ({engine}); both arms recompute old log-probs; the batch is not stated in the doc: "
    "6,144 samples (train_prompt_bsz 512 x n_resp_per_prompt 12, as a copy of the recipe script "
    "dapo_7b_math_fsdp2_4_12.sh has it)"
)
_VERL_ONE_STEP_GAP = (
    "on the compute-poor H20 the model's trainer (40% MFU of 148 TFLOP/s) is the bottleneck of both arms, so "
    "moving 4 GPUs from training to generation gains nothing; the published stage times show generation and "
    "training of similar length, so either its answers were shorter than the shared 2,000 tokens or its trainer "
    "ran well above 40% MFU (implied_mfu)"
)

#: The published cases (ratios from REFERENCES: verl fully-async and one-step-off docs, PipelineRL sec. 5).
CASES: tuple[PublishedCase, ...] = (
    *(
        PublishedCase(
            name=f"verl fully-async, {n} H20",
            source="verl docs, advance/fully_async.md",
            model=QWEN25_7B,
            gpu=H20,
            batch_samples=8192,
            generation_limit=28 * 1024,
            system=Arm("pipeline", n, n // 2, max_lag=0.5, admission="fifo", extra_forward_passes=0),
            baseline=Arm("sync_colocated", n, extra_forward_passes=1),
            published_speedup=ratio,
            setting=_VERL_ASYNC,
            known_gap=_VERL_ASYNC_GAP.format(async_s=a, sync_s=s, n_t=n // 2, n=n),
            published_step_s=(step_a, step_s),
            published_train_s=(a, s + lp),
        )
        for n, ratio, step_a, a, step_s, s, lp in (
            (32, 2.66, 294.77, 269.80, 790.10, 313.81, 107.71),
            (64, 1.92, 189.26, 156.98, 365.28, 133.41, 70.26),
            (128, 2.35, 150.63, 113.16, 356.30, 113.81, 53.92),
        )
    ),
    *(
        PublishedCase(
            name=f"verl one-step-off, {engine}",
            source="verl docs, advance/one_step_off.md",
            model=QWEN25_7B,
            gpu=H20,
            batch_samples=6144,
            generation_limit=limit,
            system=Arm("one_step", 16, 4, max_lag=1, extra_forward_passes=1),
            baseline=Arm("sync_colocated", 16, extra_forward_passes=1),
            published_speedup=round(sync_min / async_min, 2),
            setting=_VERL_ONE_STEP.format(limit=limit, engine=engine),
            published_step_s=(step_a, step_s),
            published_train_s=(train_a, train_s),
            known_gap=_VERL_ONE_STEP_GAP,
        )
        for engine, limit, sync_min, async_min, step_a, step_s, train_a, train_s in (
            ("FSDP2", 20480, 19 * 60 + 18, 15 * 60 + 34, 520.0, 749.0, 108.0 + 337.0, 88.0 + 286.0),
            ("Megatron", 8192, 18 * 60 + 21, 13 * 60 + 6, 566.0, 699.0, 120.0 + 347.0, 119.0 + 344.0),
        )
    ),
    PublishedCase(
        name="PipelineRL, 128 H100",
        source="PipelineRL, arXiv 2509.19128, sec. 5; conf/base.yaml of ServiceNow/PipelineRL",
        model=QWEN25_7B,
        gpu=H100_SXM,
        batch_samples=1024,
        generation_limit=8192,
        max_num_seqs=64,
        system=Arm("pipeline", 128, 48, max_lag=float("inf"), admission="fifo"),
        baseline=Arm("sync_split", 128, 64, max_lag=31, batches_per_generation=32),
        published_speedup=2.0,
        setting=(
            "Qwen2.5-7B, 16 DGX-H100 nodes: 48 GPUs generating (64 sequences each) and 80 training, batch 1,024, "
            "max_tokens 8,192 and no max_lag (the repository's base config); the conventional baseline takes "
            "32 optimizer steps per generation round, its throughput estimated from 2 generation + 2 training "
            "nodes (a half/half split); about 2x from about 2x sample throughput"
        ),
    ),
)
