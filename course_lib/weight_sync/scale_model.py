"""An analytic model of weight-update time, calibrated here and extrapolated to 1T parameters.

With ``B`` bytes, ``n`` messages, per-message latency ``alpha`` (s), link bandwidth
``beta`` (bytes/s), staging and reload rates ``sigma`` and ``rho`` (bytes/s), bucket size
``b``, ``N`` receivers and tensor-parallel degree ``tp``:

* (09.1) transfer:            ``T_x = n alpha + B / beta``  (``n = 1``: the single-buffer roofline)
* (09.2) bucketed, in turn:   ``T = T_x + B / sigma + B / (tp rho) + 2 k gamma``, ``n = ceil(B / b)``, with ``k``
  tensors and a fixed cost ``gamma`` per tensor packed or unpacked (Python work or a kernel launch per copy)
* (09.3) pipelined:           ``T = t_1 + (n - 1) [m + (1 - eta) (s - m)]`` with the per-bucket stage times
  ``b / sigma + k gamma / n``, ``alpha + b / beta``, ``b / (tp rho) + k gamma / n``, their maximum ``m`` and sum
  ``s = t_1`` (fill one bucket,
  then the slowest stage sets the pace). ``eta`` is the **overlap efficiency**: 1 hides every stage but the
  slowest (the ideal of the ping-pong buffer), 0 runs the stages in turn (no gain over 09.2), below 0 running them
  side by side costs more than running them in turn (they compete for the same cores, as on a 2-core CPU).
  :func:`fit_overlap` measures it from stage times measured on the machine (:func:`pipelined_from_stages`).
* (09.4) ``N`` receivers:     a pipelined broadcast adds ``h`` hops of latency, not bandwidth: ``h = ceil(log2 N)``
  for a tree, ``h = N - 1`` for a chain (ring); a loop of blocking per-tensor broadcasts pays the hops on every
  message, ``n h alpha``
* (09.5) resharding:          each receiver reloads ``B / tp`` bytes (its shard), hence ``tp rho``
* naive:                      ``T = B / W_write + N B / W_read + B / rho`` (one writer, ``N`` readers sharing storage)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Hardware:
    """Rates of one setting (bytes/s and seconds)."""

    bandwidth: float  # beta: broadcast bandwidth per receiver link
    latency: float  # alpha: fixed cost of one message
    stage_bw: float  # sigma: pack (host-to-device copy on GPUs)
    reload_bw: float  # rho: unpack into the engine's weights
    write_bw: float  # naive: checkpoint write to (shared) storage
    read_bw: float  # naive: aggregate read bandwidth of that storage
    overlap: float = 1.0  # eta of (09.3): 1 perfect overlap of the pipelined stages, 0 none, < 0 contention
    tensor_cost: float = 0.0  # gamma: fixed seconds per tensor packed (and again per tensor unpacked)
    topology: str = "tree"  # how a broadcast reaches N receivers (09.4): "tree" or "chain"


def hops(n_receivers: int, topology: str = "tree") -> int:
    """(09.4): extra latency hops of a broadcast to ``N`` receivers: ``ceil(log2 N)`` (tree), ``N - 1`` (chain)."""
    if n_receivers < 1:
        raise ValueError(f"n_receivers must be at least 1, got {n_receivers}")
    if topology == "tree":
        return math.ceil(math.log2(n_receivers)) if n_receivers > 1 else 0
    if topology == "chain":
        return n_receivers - 1
    raise ValueError(f"topology must be 'tree' or 'chain', got {topology!r}")


def transfer_time(nbytes: float, n_messages: int, hw: Hardware, n_receivers: int = 1, overlapped: bool = True) -> float:
    """(09.1) and (09.4): ``(n + h) alpha + B / beta`` for back-to-back messages (``h`` from :func:`hops`).

    ``overlapped=False`` is a loop of blocking calls (one broadcast per tensor): each message
    crosses all ``h`` hops before the next starts, ``n h alpha``.
    """
    h = hops(n_receivers, hw.topology)
    if not overlapped:
        return n_messages * max(h, 1) * hw.latency + nbytes / hw.bandwidth
    return (n_messages + h) * hw.latency + nbytes / hw.bandwidth


def update_time(
    method: str,
    nbytes: float,
    hw: Hardware,
    *,
    n_tensors: int = 1,
    bucket_bytes: float = 2**30,
    n_receivers: int = 1,
    tp: int = 1,
) -> float:
    """Predicted seconds of one update by ``method`` (``naive``, ``per_tensor``, ``flat``, ``bucketed``, ``pipelined``)."""
    if nbytes <= 0 or bucket_bytes <= 0 or tp < 1 or n_receivers < 1:
        raise ValueError("nbytes and bucket_bytes must be positive, tp and n_receivers at least 1")
    if method == "flat":
        return transfer_time(nbytes, 1, hw, n_receivers)
    if method == "per_tensor":
        return transfer_time(nbytes, n_tensors, hw, n_receivers, overlapped=False)
    if method == "naive":
        return nbytes / hw.write_bw + n_receivers * nbytes / hw.read_bw + nbytes / hw.reload_bw
    n = max(1, math.ceil(nbytes / bucket_bytes))
    b = nbytes / n
    fixed = n_tensors * hw.tensor_cost  # per side: one small copy per tensor
    if method == "bucketed":  # (09.2)
        return (
            transfer_time(nbytes, n, hw, n_receivers) + nbytes / hw.stage_bw + nbytes / (tp * hw.reload_bw) + 2 * fixed
        )
    if method == "pipelined":  # (09.3)
        hop = transfer_time(b, 1, hw, n_receivers)
        stage, reload = b / hw.stage_bw + fixed / n, b / (tp * hw.reload_bw) + fixed / n
        stages = (stage, hw.latency + b / hw.bandwidth, reload)
        pace = max(stages) + (1.0 - hw.overlap) * (sum(stages) - max(stages))
        return stage + hop + reload + (n - 1) * pace
    raise ValueError(f"unknown method {method!r}")


def pipelined_from_stages(stage_s: float, transfer_s: float, reload_s: float, n_buckets: int, overlap: float) -> float:
    """(09.3) from measured stage times: seconds of a whole update in each stage, run in turn.

    ``stage_s``, ``transfer_s`` and ``reload_s`` are what packing, moving and unpacking all
    ``n_buckets`` buckets took (e.g. the bucketed method's sender stage, the flat broadcast of
    the same bytes, the bucketed method's receiver reload); each bucket takes ``1/n`` of each.
    The result is ``t_1 + (n - 1) [m + (1 - eta) (t_1 - m)]`` with per-bucket times.
    """
    if n_buckets < 1:
        raise ValueError(f"n_buckets must be at least 1, got {n_buckets}")
    per_bucket = (stage_s / n_buckets, transfer_s / n_buckets, reload_s / n_buckets)
    t_1, m = sum(per_bucket), max(per_bucket)
    return t_1 + (n_buckets - 1) * (m + (1.0 - overlap) * (t_1 - m))


def fit_overlap(
    measured_s: list[float],
    stages: list[tuple[float, float, float, int]],
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> float:
    """The overlap efficiency ``eta`` of (09.3) that best explains measured pipelined updates.

    ``stages[i]`` is ``(stage_s, transfer_s, reload_s, n_buckets)`` of the update measured in
    ``measured_s[i]`` (see :func:`pipelined_from_stages`). Least squares on
    ``log(predicted / measured)`` (relative errors, so that large and small models count
    alike), searched on a grid of ``bounds`` in steps of 0.001. Updates of a single bucket carry
    no information about overlap; if every update is a single bucket the result is 1.0.
    """
    if len(measured_s) != len(stages) or not stages:
        raise ValueError("measured_s and stages must be non-empty and of the same length")
    informative = [(t, st) for t, st in zip(measured_s, stages) if st[3] > 1]
    if not informative:
        return 1.0
    grid = np.round(np.arange(bounds[0], bounds[1] + 5e-4, 1e-3), 3)

    def loss(eta: float) -> float:
        return sum(math.log(pipelined_from_stages(*st, overlap=float(eta)) / t) ** 2 for t, st in informative)

    return float(min(grid, key=loss))


def calibrate_link(
    nbytes: list[float], flat_s: list[float], per_tensor_s: list[float], n_tensors: list[int]
) -> tuple[float, float]:
    """Robust ``(alpha, beta)`` of (09.1) from flat and per-tensor updates of the same models.

    ``alpha`` is the median over models of ``(T_per_tensor - T_flat) / (n - 1)`` (the extra
    messages are the only difference); ``beta`` the median of ``B / (T_flat - alpha)``. Medians,
    so that one disturbed measurement on a shared machine does not move the fit.
    """
    alphas = [(p - f) / max(n - 1, 1) for f, p, n in zip(flat_s, per_tensor_s, n_tensors)]
    alpha = float(max(np.median(alphas), 1e-7))
    betas = [b / max(f - alpha, 1e-9) for b, f in zip(nbytes, flat_s)]
    return alpha, float(np.median(betas))


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    """Theil-Sen fit ``y = slope x + intercept`` (medians of pairwise slopes and of the intercepts)."""
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x)) if x[j] != x[i]]
    slope = float(np.median(slopes))
    return slope, float(np.median([yi - slope * xi for xi, yi in zip(x, y)]))


def calibrate_stages(
    nbytes: list[float], n_tensors: list[int], stage_s: list[float], reload_s: list[float]
) -> tuple[float, float, float]:
    """``(sigma, rho, gamma)`` of (09.2) from the stage and reload times of bucketed updates of several sizes.

    Each side's time is a line in the bytes, ``t = k gamma + B / rate``: the slope gives the rate,
    the intercept the fixed cost of the ``k`` tensors (Python work, or a kernel launch per copy),
    which dominates small models. Theil-Sen fits (medians of pairwise slopes), less moved by one
    disturbed point than least squares; ``gamma`` is the mean of the two sides' fixed costs per
    tensor (at least 0).

    Raises:
        ValueError: fewer than two sizes, or a time that does not grow with the bytes.
    """
    if len({len(nbytes), len(n_tensors), len(stage_s), len(reload_s)}) != 1 or len(set(nbytes)) < 2:
        raise ValueError("need stage and reload times of at least two model sizes, one per size")
    (s_slope, s_cut), (r_slope, r_cut) = _line(nbytes, stage_s), _line(nbytes, reload_s)
    if s_slope <= 0 or r_slope <= 0:
        raise ValueError("stage or reload time does not grow with the bytes: the measurements are too noisy to fit")
    gamma = max(0.0, (s_cut + r_cut) / 2 / float(np.median(n_tensors)))
    return 1 / s_slope, 1 / r_slope, gamma


# Assumed rates of a GPU cluster for the extrapolation (assumptions, not published figures):
# a 400 Gb/s RDMA NIC per GPU (50 GB/s) bounds what each GPU receives; staging is
# host-to-device copies of ~25 GB/s per GPU, done by the GPUs that own the buckets, four at
# a time (100 GB/s); on-GPU reload copies ~1 TB/s; a shared file system that writes 10 GB/s
# and serves 50 GB/s to all its readers together. Overlap eta = 1 (the ideal of 09.3: copy
# engines, NICs and SMs are different hardware) and no per-tensor cost: the bytes alone through
# the network and the copies. Lesson 09's section 9 (engine_model) shows that checkpoint-engine's
# published updates take more than that, mostly in the engine's per-tensor reload, which this
# model and its calculator leave out.
CLUSTER_ASSUMED = Hardware(bandwidth=50e9, latency=50e-6, stage_bw=100e9, reload_bw=1000e9, write_bw=10e9, read_bw=50e9)

# Published (MoonshotAI/checkpoint-engine README, quoted in the course's REFERENCES.md): seconds to update.
# The stage-by-stage model of those runs, all six rows of the table, is in :mod:`.engine_model`.
PUBLISHED = {
    "Kimi-K2 FP8, 16xH20, TP16 (bucket 5.89 GiB)": (14.36, 16, 16, 5.89),
    "Kimi-K2 FP8, 256xH20, TP16 (bucket 8.00 GiB)": (16.04, 256, 16, 8.00),
}
KIMI_K2_BYTES = 1.0e12  # ~1T parameters in FP8: ~1 byte each


def kimi_k2_table(hw: Hardware = CLUSTER_ASSUMED) -> list[tuple[str, float, float, float]]:
    """(setting, published s, model pipelined s, model naive s) for the published Kimi-K2 rows."""
    rows = []
    for name, (published, gpus, tp, bucket_gib) in PUBLISHED.items():
        n_engines = gpus // tp
        piped = update_time("pipelined", KIMI_K2_BYTES, hw, bucket_bytes=bucket_gib * 2**30, n_receivers=gpus, tp=tp)
        naive = update_time("naive", KIMI_K2_BYTES, hw, n_receivers=n_engines)
        rows.append((name, published, piped, naive))
    return rows


def calculator(hw: Hardware = CLUSTER_ASSUMED) -> Any:
    """An ipywidgets calculator of (09.1)-(09.5): sliders for model size, bandwidth, bucket, receivers, tp."""
    import ipywidgets as w

    params = w.FloatLogSlider(value=1e12, base=10, min=8, max=12.5, description="parameters")
    bytes_per = w.Dropdown(options=[("FP8", 1), ("BF16", 2), ("FP32", 4)], value=1, description="dtype")
    bw = w.FloatLogSlider(value=hw.bandwidth / 1e9, base=10, min=-1, max=3, description="link GB/s")
    lat = w.FloatLogSlider(value=hw.latency * 1e6, base=10, min=0, max=4, description="latency us")
    bucket = w.FloatLogSlider(value=8.0, base=2, min=-6, max=5, description="bucket GiB")
    gpus = w.IntSlider(value=256, min=2, max=4096, description="GPUs")
    tp = w.IntSlider(value=16, min=1, max=64, description="TP")
    out = w.HTML()

    def show(*_: Any) -> None:
        h = replace(hw, bandwidth=bw.value * 1e9, latency=lat.value * 1e-6)
        nbytes = params.value * bytes_per.value
        lines = []
        for method in ("naive", "per_tensor", "bucketed", "pipelined"):
            t = update_time(
                method,
                nbytes,
                h,
                n_tensors=max(1, int(params.value / 15e6)),
                bucket_bytes=bucket.value * 2**30,
                n_receivers=gpus.value if method != "naive" else max(1, gpus.value // tp.value),
                tp=tp.value,
            )
            lines.append(f"{method:<11} {t:>10.1f} s")
        out.value = "<pre>" + "\n".join(lines) + "</pre>"

    for widget in (params, bytes_per, bw, lat, bucket, gpus, tp):
        widget.observe(show, names="value")
    show()
    return w.VBox([w.HBox([params, bytes_per]), w.HBox([bw, lat]), w.HBox([bucket, gpus, tp]), out])
