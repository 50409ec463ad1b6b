"""An analytic model of weight-update time, calibrated here and extrapolated to 1T parameters.

With ``B`` bytes, ``n`` messages, per-message latency ``alpha`` (s), link bandwidth
``beta`` (bytes/s), staging and reload rates ``sigma`` and ``rho`` (bytes/s), bucket size
``b``, ``N`` receivers and tensor-parallel degree ``tp``:

* (09.1) transfer:            ``T_x = n alpha + B / beta``  (``n = 1``: the single-buffer roofline)
* (09.2) bucketed, in turn:   ``T = T_x + B / sigma + B / (tp rho)``, ``n = ceil(B / b)``
* (09.3) pipelined:           ``T = t_1 + (n - 1) max(b / sigma, alpha + b / beta, b / (tp rho))``,
  ``t_1 = b / sigma + alpha + b / beta + b / (tp rho)`` (fill one bucket, then the slowest stage sets the pace)
* (09.4) ``N`` receivers:     a pipelined broadcast adds ``ceil(log2 N)`` hops of latency, not bandwidth;
  a loop of blocking per-tensor broadcasts pays the hops on every message, ``n ceil(log2 N) alpha``
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


def transfer_time(nbytes: float, n_messages: int, hw: Hardware, n_receivers: int = 1, overlapped: bool = True) -> float:
    """(09.1) and (09.4): ``(n + ceil(log2 N)) alpha + B / beta`` for back-to-back messages.

    ``overlapped=False`` is a loop of blocking calls (one broadcast per tensor): each message
    crosses all ``ceil(log2 N)`` hops of the tree before the next starts, ``n ceil(log2 N) alpha``.
    """
    hops = math.ceil(math.log2(n_receivers)) if n_receivers > 1 else 0
    if not overlapped:
        return n_messages * max(hops, 1) * hw.latency + nbytes / hw.bandwidth
    return (n_messages + hops) * hw.latency + nbytes / hw.bandwidth


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
    if method == "bucketed":  # (09.2)
        return transfer_time(nbytes, n, hw, n_receivers) + nbytes / hw.stage_bw + nbytes / (tp * hw.reload_bw)
    if method == "pipelined":  # (09.3)
        hop = transfer_time(b, 1, hw, n_receivers)
        stages = (b / hw.stage_bw, hw.latency + b / hw.bandwidth, b / (tp * hw.reload_bw))
        return b / hw.stage_bw + hop + b / (tp * hw.reload_bw) + (n - 1) * max(stages)
    raise ValueError(f"unknown method {method!r}")


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


# Assumed rates of a GPU cluster for the extrapolation (assumptions, not published figures):
# a 400 Gb/s RDMA NIC per GPU (50 GB/s) bounds what each GPU receives; staging is
# host-to-device copies of ~25 GB/s per GPU, done by the GPUs that own the buckets, four at
# a time (100 GB/s); on-GPU reload copies ~1 TB/s; a shared file system that writes 10 GB/s
# and serves 50 GB/s to all its readers together.
CLUSTER_ASSUMED = Hardware(bandwidth=50e9, latency=50e-6, stage_bw=100e9, reload_bw=1000e9, write_bw=10e9, read_bw=50e9)

# Published (MoonshotAI/checkpoint-engine README, see /work/shared/REFERENCES.md): seconds to update.
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
