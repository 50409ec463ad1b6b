"""checkpoint-engine's broadcast update, stage by stage, against its published table (lesson 09).

What the engine does (MoonshotAI/checkpoint-engine, ``ParameterServer._update_per_bucket`` in
``checkpoint_engine/ps.py`` at the commit of its table, summarised in REFERENCES.md): each of the
``W`` GPUs holds a shard of the new weights in pinned host memory, ``B / W`` bytes, cut into buckets
of at most ``b`` bytes. The update runs in **rounds**; in each round

1. every GPU copies its next bucket host-to-device (**H2D**, over its own PCIe link, all GPUs at once,
   then a device synchronise: this copy is on the critical path of the round);
2. the ``W`` owners **broadcast** their buckets one after another to all ``W`` GPUs (NCCL; a ring that
   runs over NVLink inside a node and through the RDMA NICs between nodes) into a double (ping-pong)
   CUDA-IPC buffer shared with the inference engine;
3. while bucket ``g`` is being broadcast, the engine **reloads** bucket ``g - 1`` (vLLM's
   ``load_weights``: every tensor of the bucket goes through its weight loader, each TP rank keeping
   its shard); then a barrier and a ZeroMQ round trip hand bucket ``g`` over (**per-bucket overhead**).

So with ``n = rounds x W`` buckets of ``b`` bytes and ``k`` tensors each (the stages of one bucket:
``t_h2d = b / h``, ``t_bc = (W - 1)(a + c / beta) + b / beta``, ``t_rl = k gamma + b / (tp m / 2)``)::

    T = T_0 + rounds t_h2d + n [max(t_bc, t_rl) + o] + min(t_bc, t_rl)

the overlapped pair paced by its slower stage, plus the other stage for one bucket (fill/drain), the
H2D copies that nothing hides, the per-bucket overheads and a fixed cost per update. The ring term
``(W - 1)(a + c / beta)`` is the time for the first chunk ``c`` to reach the last of ``W`` GPUs; it is
why more GPUs cost more per bucket, and the broadcast rate ``beta`` is NVLink's inside one node and
the smaller of NVLink and the node's NICs across nodes.

Every constant below is a datasheet figure or a stated assumption, the same for every row; nothing
is fitted per row. Three of them are not datasheet rates but software costs (:data:`PER_TENSOR_S`,
:data:`PER_BUCKET_S`, :data:`PER_UPDATE_S`): round values, stated once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GIB = 2**30

# --- datasheet rates ---------------------------------------------------------------------------
# PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b coding = 63 GB/s per direction (PCI-SIG); a
# pinned-memory host-to-device copy reaches about 80% of it (packet headers, DMA): 50 GB/s.
# Assumption: every GPU of a node copies at that rate at once (the README binds each GPU to its
# NUMA node "to ensure stable H2D transfer speeds"; two sockets of 8-channel DDR5-4800, 614 GB/s,
# feed 8 x 50 GB/s).
PCIE_GEN5_X16_H2D = 50e9
# NVIDIA datasheets: H800 SXM NVLink 400 GB/s, H20 NVLink 900 GB/s (both directions together),
# HBM3 3.35 TB/s (H800 SXM) and 4.0 TB/s (H20).
NVLINK_PER_DIRECTION = {"H800": 400e9 / 2, "H20": 900e9 / 2}
HBM = {"H800": 3.35e12, "H20": 4.0e12}
GPUS_PER_NODE = 8  # HGX boards: 8 GPUs per node
# NICs per node: 8 x 400 Gb/s RDMA (Kimi-K2 technical report, arXiv 2507.20534, for Moonshot's H800
# cluster; assumed the same for the H20 nodes, whose NICs are not published).
NIC_PER_NODE = 8 * 400e9 / 8

# --- global assumptions, the same for every row ------------------------------------------------
NCCL_EFFICIENCY = 0.8  # bus bandwidth a ring collective attains of the link's peak (nccl-tests range)
RING_HOP_S = 5e-6  # latency of one ring step (NVLink or RDMA)
RING_CHUNK = 4 * 2**20 // 8  # NCCL's pipelining chunk: NCCL_BUFFSIZE (4 MiB default) / NCCL_STEPS (8)
PER_BUCKET_S = 1e-3  # barrier + device synchronise + ZeroMQ round trip + Python, per bucket
PER_TENSOR_S = 1e-4  # the engine's weight loader per tensor (name mapping, narrow, copy launch)
PER_UPDATE_S = 1.0  # request to the engine, IPC handles, bucket-size all-reduce, post-load hook


@dataclass(frozen=True)
class Checkpoint:
    """A model's weights as the engine moves them: bytes and number of tensors."""

    name: str
    nbytes: float
    n_tensors: int


def moe_tensors(layers: int, moe_layers: int, experts: int, fp8_scales: bool, other_per_layer: int = 16) -> int:
    """Tensors of a mixture-of-experts checkpoint from its config: 3 per expert (gate, up, down) in
    every MoE layer, doubled by FP8 block scales, plus about ``other_per_layer`` (attention, norms,
    router, shared expert) in every layer."""
    per_expert = 3 * (2 if fp8_scales else 1)
    return moe_layers * experts * per_expert + layers * other_per_layer


# Sizes from the models' cards and configs (parameters x bytes per parameter; FP8 about 1 byte).
GLM_45_AIR = Checkpoint("GLM-4.5-Air BF16", 106e9 * 2, moe_tensors(47, 46, 128, False))  # 46 layers + 1 MTP
QWEN3_235B = Checkpoint("Qwen3-235B-A22B BF16", 235e9 * 2, moe_tensors(94, 94, 128, False))
DEEPSEEK_V31 = Checkpoint("DeepSeek-V3.1 FP8", 685e9, moe_tensors(62, 59, 256, True))  # 61 layers + 1 MTP
KIMI_K2 = Checkpoint("Kimi-K2 FP8", 1.0e12, moe_tensors(61, 60, 384, True))


@dataclass(frozen=True)
class Stages:
    """Seconds of one update in each term of the model (module docstring)."""

    fixed: float  # T_0
    h2d: float  # rounds t_h2d: the host-to-device copies, on the critical path
    overlapped: float  # n max(t_bc, t_rl): broadcast and reload side by side
    fill_drain: float  # min(t_bc, t_rl): the other stage for one bucket
    overheads: float  # n o
    n_buckets: int
    broadcast_s: float  # t_bc of one bucket
    reload_s: float  # t_rl of one bucket
    ring_fill_s: float  # (W - 1)(a + c / beta): the broadcast's ring latency, per bucket
    beta: float  # broadcast rate, bytes/s

    @property
    def total(self) -> float:
        return self.fixed + self.h2d + self.overlapped + self.fill_drain + self.overheads

    @property
    def bound(self) -> str:
        """Which stage paces the overlapped pair."""
        return "broadcast" if self.broadcast_s >= self.reload_s else "reload"


def broadcast_rate(gpu: str, n_gpus: int, nic_per_node: float = NIC_PER_NODE) -> float:
    """Bytes/s of a ring broadcast: NVLink inside one node; across nodes the smaller of NVLink and the
    node's NICs (every byte enters each node once); times :data:`NCCL_EFFICIENCY`."""
    if gpu not in NVLINK_PER_DIRECTION:
        raise ValueError(f"unknown GPU {gpu!r}; known: {sorted(NVLINK_PER_DIRECTION)}")
    link = NVLINK_PER_DIRECTION[gpu]
    if n_gpus > GPUS_PER_NODE:
        link = min(link, nic_per_node)
    return NCCL_EFFICIENCY * link


def engine_update(
    ckpt: Checkpoint,
    gpu: str,
    n_gpus: int,
    tp: int,
    bucket_bytes: float,
    *,
    nic_per_node: float = NIC_PER_NODE,
    per_bucket_s: float = PER_BUCKET_S,
) -> Stages:
    """The model of the module docstring for one update of ``ckpt`` on ``n_gpus`` GPUs (engines of
    ``tp`` GPUs) with buckets of at most ``bucket_bytes``."""
    if n_gpus < 1 or tp < 1 or n_gpus % tp or bucket_bytes <= 0:
        raise ValueError(
            f"need n_gpus >= 1 divisible by tp >= 1 and a positive bucket, got {n_gpus}, {tp}, {bucket_bytes}"
        )
    beta = broadcast_rate(gpu, n_gpus, nic_per_node)
    shard = ckpt.nbytes / n_gpus  # each GPU's part of the new weights, in pinned host memory
    rounds = math.ceil(shard / bucket_bytes)
    b = shard / rounds  # the buckets of a shard, equal in size
    n = rounds * n_gpus
    ring_fill = (n_gpus - 1) * (RING_HOP_S + RING_CHUNK / beta)
    t_bc = ring_fill + b / beta
    t_rl = ckpt.n_tensors / n * PER_TENSOR_S + b / (tp * HBM[gpu] / 2)  # a copy reads and writes HBM
    return Stages(
        fixed=PER_UPDATE_S,
        h2d=rounds * b / PCIE_GEN5_X16_H2D,
        overlapped=n * max(t_bc, t_rl),
        fill_drain=min(t_bc, t_rl),
        overheads=n * per_bucket_s,
        n_buckets=n,
        broadcast_s=t_bc,
        reload_s=t_rl,
        ring_fill_s=ring_fill,
        beta=beta,
    )


# checkpoint-engine's README (its table, vLLM 0.10.2rc1; see REFERENCES.md): broadcast update, seconds.
# (checkpoint, GPU, GPUs, TP, bucket GiB, published seconds)
PUBLISHED_TABLE: list[tuple[Checkpoint, str, int, int, float, float]] = [
    (GLM_45_AIR, "H800", 8, 8, 3.02, 3.47),
    (QWEN3_235B, "H800", 8, 8, 2.67, 6.22),
    (DEEPSEEK_V31, "H20", 16, 16, 5.39, 10.19),
    (KIMI_K2, "H20", 16, 16, 5.89, 14.36),
    (DEEPSEEK_V31, "H20", 256, 16, 8.00, 11.33),
    (KIMI_K2, "H20", 256, 16, 8.00, 16.04),
]


@dataclass(frozen=True)
class Row:
    setting: str
    published_s: float
    stages: Stages

    @property
    def predicted_s(self) -> float:
        return self.stages.total

    @property
    def ratio(self) -> float:
        """predicted / published."""
        return self.predicted_s / self.published_s


def published_comparison(table: list[tuple[Checkpoint, str, int, int, float, float]] | None = None) -> list[Row]:
    """The model against every row of ``table`` (default :data:`PUBLISHED_TABLE`), same constants."""
    rows = []
    for ckpt, gpu, n_gpus, tp, bucket_gib, published in PUBLISHED_TABLE if table is None else table:
        setting = f"{ckpt.name}, {n_gpus}x{gpu} TP{tp}, bucket {bucket_gib:.2f} GiB"
        rows.append(Row(setting, published, engine_update(ckpt, gpu, n_gpus, tp, bucket_gib * GIB)))
    return rows


def format_table(rows: list[Row]) -> str:
    """The comparison as a plain-text table (stable digits: s to 0.01 or 0.1, ratios to 0.01)."""
    lines = [
        f"{'setting':<54} {'published':>9} {'model':>6} {'ratio':>5}  {'H2D':>4} {'bcast':>5} {'reload':>6} "
        f"{'ring':>4} {'bound':>9} {'buckets':>7}"
    ]
    for r in rows:
        s = r.stages
        lines.append(
            f"{r.setting:<54} {r.published_s:>8.2f}s {r.predicted_s:>5.1f}s {r.ratio:>5.2f}  "
            f"{s.h2d:>4.1f} {s.broadcast_s * s.n_buckets:>5.1f} {s.reload_s * s.n_buckets:>6.1f} "
            f"{s.ring_fill_s * s.n_buckets:>4.1f} {s.bound:>9} {s.n_buckets:>7}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    rows = published_comparison()
    print(format_table(rows))
    print(f"largest ratio {max(r.ratio for r in rows):.2f}, smallest {min(r.ratio for r in rows):.2f}")
