"""Multi-slice (hybrid) meshes: fast links inside a slice, slow ones between, and which mesh axis goes where (lesson 05).

At pod scale devices are joined by two kinds of links: fast ones inside a *slice* (a TPU
slice's inter-chip interconnect, ICI; the NVLink of one GPU node) and slower ones between
slices (the data-center network, DCN: Ethernet or InfiniBand). A collective runs at the
speed of the slowest link its group crosses, so a mesh axis whose collectives are
frequent, latency-bound and on the critical path (``model``: tensor parallelism all-reduces
activations in every layer, forward and backward) belongs *inside* a slice, and the axis
that communicates once per step and can overlap with the backward pass (``data``: one
gradient all-reduce) is the one to stretch *across* slices.

**The mesh.** ``jax.experimental.mesh_utils.create_hybrid_device_mesh(ici_shape, dcn_shape,
devices)`` groups ``devices`` by ``device.slice_index``, lays each slice out as
``ici_shape`` and tiles the slices as ``dcn_shape``: the result has shape
``ici_shape[i] * dcn_shape[i]`` on each axis, and along an axis with ``dcn_shape[i] > 1``
the *outer* index (the block) is the slice. With ``ici_shape=(1, 4)``, ``dcn_shape=(2, 1)``
and axes ``("data", "model")``, ``data`` (size 2) crosses slices and each ``model`` row of 4
stays inside one slice. CPU host devices have no ``slice_index``; :func:`hybrid_mesh` then
treats consecutive devices as fake slices (``prod(ici_shape)`` per slice) and builds the
same arrangement (:func:`hybrid_device_array`; the tests check it against
``create_hybrid_device_mesh`` called on light fake devices that carry a ``slice_index``).
The program is the same on either mesh; only which devices sit where changes, and with it
which links each collective crosses (:func:`psum_demo`).

**The cost.** :func:`allreduce_time` is the ring alpha-beta model of
:func:`course_lib.scaling.collectives.allreduce_time_model`; :func:`axis_assignment_cost` applies
it to a Megatron MLP stack on a ``data x model`` layout of a 2-slice job, once with
``model`` on the fast links and ``data`` on DCN, once the reverse, with the per-link
figures of :data:`PUBLISHED_LINKS`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.collectives import allreduce_time_model, ring_allreduce_bytes_sent_per_device
from course_lib.scaling.devices import check_multidevice_safe

# ---------------------------------------------------------------------------
# Published link figures
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """A published bandwidth of one kind of link, per chip or per GPU, in **bytes per second**.

    ``per_direction_bytes_per_s``: what one device can send while it also receives as much
    (what a ring step uses); ``bidirectional_bytes_per_s``: send + receive, the figure vendors
    usually quote. ``scope``: ``"ici"`` (inside a slice / node) or ``"dcn"`` (between).
    ``derived`` says the figure was computed from the source's numbers (the note says how).
    """

    name: str
    scope: str
    per_direction_bytes_per_s: float
    bidirectional_bytes_per_s: float
    source: str
    year: int
    note: str = ""
    derived: bool = False


GB = 1e9  # bytes
Gbit = 1e9 / 8  # bytes

#: Link figures found in vendors' documents (2022-2024). Bits are converted to bytes (``/ 8``) and
#: every figure is stored per direction and bidirectional, in bytes/s.
PUBLISHED_LINKS: dict[str, Link] = {
    "h100_nvlink4": Link(
        "NVIDIA H100 SXM, NVLink 4 (per GPU)",
        "ici",
        450 * GB,
        900 * GB,
        "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: NVLink 900 GB/s); 18 NVLink 4 links x 50 GB/s",
        2022,
        "900 GB/s is bidirectional (send + receive); 450 GB/s each way",
    ),
    "ndr_infiniband_cx7": Link(
        "InfiniBand NDR, ConnectX-7 (one 400 Gb/s port per GPU in a DGX H100)",
        "dcn",
        400 * Gbit,
        800 * Gbit,
        "NVIDIA ConnectX-7 VPI adapter user manual (single-port OSFP, NDR 400Gb/s); NVIDIA DGX H100 User Guide "
        "(eight ConnectX-7 ports, each mapped to one GPU)",
        2022,
        "400 Gb/s = 50 GB/s per direction (the port is full duplex)",
    ),
    "tpu_v5e_ici": Link(
        "TPU v5e ICI (per chip)",
        "ici",
        200 * GB,
        400 * GB,
        "Google Cloud TPU v5e documentation: bidirectional ICI bandwidth per chip 400 GBps, 4 ICI ports, 2D torus",
        2023,
        "sum over the chip's 4 ports; one ring uses 2 of them",
    ),
    "tpu_v5e_dcn": Link(
        "TPU v5e DCN (per chip)",
        "dcn",
        2 * 100 * Gbit / 8,
        2 * 2 * 100 * Gbit / 8,
        "Google Cloud TPU v5e documentation: per-host NIC 2 x 100 Gbps, 8 chips per host",
        2023,
        "derived: 200 Gb/s per host / 8 chips = 25 Gb/s = 3.125 GB/s per chip each way",
        derived=True,
    ),
    "tpu_v5p_ici": Link(
        "TPU v5p ICI (per chip)",
        "ici",
        600 * GB,
        1200 * GB,
        "Google Cloud TPU v5p documentation: bidirectional ICI bandwidth per chip 1200 GBps "
        "(also listed as 4800 Gbps = 600 GB/s), 3D torus",
        2023,
        "sum over the chip's 6 torus directions; one ring uses 2 of them",
    ),
    "tpu_v5p_dcn": Link(
        "TPU v5p DCN (per chip)",
        "dcn",
        50 * Gbit,
        2 * 50 * Gbit,
        "Google Cloud TPU v5p documentation: data center network (DCN) bandwidth per chip 50 Gbps",
        2023,
        "50 Gb/s = 6.25 GB/s per chip each way",
    ),
}

#: Per-step latency ``alpha`` of a ring step, **assumed** (not from the sources above): a few
#: microseconds on NVLink / ICI, tens on the data-center network.
ASSUMED_ALPHA_S: dict[str, float] = {"ici": 5e-6, "dcn": 20e-6}


def format_links(links: dict[str, Link] | None = None) -> str:
    """The table of link figures (GB/s = 1e9 bytes/s), with the source of each."""
    links = PUBLISHED_LINKS if links is None else links
    lines = [f"{'link':<70} {'scope':<5} {'each way':>10} {'both ways':>10}"]
    for link in links.values():
        lines.append(
            f"{link.name:<70} {link.scope:<5} {link.per_direction_bytes_per_s / GB:>6.1f} GB/s "
            f"{link.bidirectional_bytes_per_s / GB:>6.1f} GB/s"
        )
    lines.append("sources: " + "; ".join(f"{k}: {v.source} ({v.year})" for k, v in links.items()))
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Hybrid meshes
# ---------------------------------------------------------------------------


def _check_shapes(
    ici_shape: Sequence[int], dcn_shape: Sequence[int], n_devices: int, axis_names: Sequence[str] | None
) -> None:
    if len(ici_shape) != len(dcn_shape):
        raise ValueError(
            f"ici_shape {tuple(ici_shape)} and dcn_shape {tuple(dcn_shape)} need one entry per mesh axis "
            f"(use 1 where an axis does not cross slices)"
        )
    if axis_names is not None and len(axis_names) != len(ici_shape):
        raise ValueError(
            f"axis_names {tuple(axis_names)} must name the {len(ici_shape)} axes of ici_shape {tuple(ici_shape)}"
        )
    if any(int(s) < 1 for s in (*ici_shape, *dcn_shape)):
        raise ValueError(f"mesh shapes must be >= 1, got ici_shape {tuple(ici_shape)}, dcn_shape {tuple(dcn_shape)}")
    need = math.prod(ici_shape) * math.prod(dcn_shape)
    if need != n_devices:
        raise ValueError(
            f"prod(ici_shape) * prod(dcn_shape) = {math.prod(ici_shape)} * {math.prod(dcn_shape)} = {need} devices, "
            f"but {n_devices} were given: change the shapes or pass {need} devices"
        )


def hybrid_device_array(ici_shape: Sequence[int], dcn_shape: Sequence[int], devices: Sequence[Any]) -> np.ndarray:
    """The device array ``create_hybrid_device_mesh`` builds, with consecutive devices as slices.

    Slice ``s`` holds ``devices[s*k : (s+1)*k]`` (``k = prod(ici_shape)``), laid out row-major
    as ``ici_shape``; the slices are tiled row-major as ``dcn_shape``. The device at mesh
    index ``g`` is device ``k * ravel(g // ici_shape, dcn_shape) + ravel(g % ici_shape, ici_shape)``.
    Shape: ``ici_shape * dcn_shape`` elementwise.
    """
    devices = list(devices)
    _check_shapes(ici_shape, dcn_shape, len(devices), None)
    ici, dcn = np.asarray(ici_shape), np.asarray(dcn_shape)
    shape = tuple(int(s) for s in ici * dcn)
    index = np.indices(shape).reshape(len(shape), -1)  # [axes, positions]
    slice_of = np.ravel_multi_index(tuple(index // ici[:, None]), tuple(dcn))
    within = np.ravel_multi_index(tuple(index % ici[:, None]), tuple(ici))
    order = slice_of * int(ici.prod()) + within
    out = np.empty(len(devices), dtype=object)
    out[:] = [devices[i] for i in order]
    return out.reshape(shape)


def hybrid_mesh(
    ici_shape: Sequence[int],
    dcn_shape: Sequence[int],
    axis_names: Sequence[str] = ("data", "model"),
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A ``jax.sharding.Mesh`` whose axes with ``dcn_shape[i] > 1`` cross slices, the rest stay inside one.

    Devices whose ``slice_index`` values name exactly ``prod(dcn_shape)`` slices (TPU slices,
    GPU hosts of a multi-node job) go through
    ``jax.experimental.mesh_utils.create_hybrid_device_mesh``; others (CPU host devices with
    no index, the GPUs of one host, which all carry slice index 0) are split into
    ``prod(dcn_shape)`` fake slices of consecutive devices (:func:`hybrid_device_array`). Default: ``("data", "model")``, e.g. ``ici_shape=(1, 2)``,
    ``dcn_shape=(2, 1)``: ``data`` crosses the 2 slices, ``model`` stays inside each.
    Raises ``ValueError`` when the shapes' product is not the number of devices.
    """
    devices = list(devices if devices is not None else jax.devices())
    _check_shapes(ici_shape, dcn_shape, len(devices), axis_names)
    slices = {getattr(d, "slice_index", None) for d in devices}
    if None not in slices and len(slices) == math.prod(dcn_shape):
        from jax.experimental.mesh_utils import create_hybrid_device_mesh

        array = create_hybrid_device_mesh(list(ici_shape), list(dcn_shape), devices)
    else:
        array = hybrid_device_array(ici_shape, dcn_shape, devices)
    return Mesh(array, tuple(axis_names))


def slice_indices(mesh: Mesh, per_slice: int) -> np.ndarray:
    """Which fake slice each mesh position's device is in (device position in ``jax.devices()`` // ``per_slice``)."""
    position = {d.id: i for i, d in enumerate(jax.devices())}
    return np.vectorize(lambda d: position[d.id] // per_slice)(mesh.devices)


def psum_demo(mesh: Mesh, watchdog_s: float = 60.0) -> dict[str, np.ndarray]:
    """``psum`` over each axis of a 2-D mesh, and over both, of a tiny array: what each mesh position gets.

    The device at mesh position ``(i, j)`` starts with the value ``10 * i + j``; the result
    arrays have the mesh's shape. The same program runs on any device arrangement: only
    which devices (and which links) each sum crosses changes.
    """
    if len(mesh.axis_names) != 2:
        raise ValueError(f"psum_demo needs a 2-D mesh, got axes {mesh.axis_names}")
    a, b = (str(n) for n in mesh.axis_names)
    rows, cols = mesh.devices.shape
    values = (10 * np.arange(rows)[:, None] + np.arange(cols)[None, :]).astype(np.float32)
    x = jax.device_put(jnp.asarray(values), NamedSharding(mesh, P(a, b)))

    def body(v: jax.Array) -> dict[str, jax.Array]:
        return {
            "input": v,
            f"psum over {a}": jax.lax.psum(v, a),
            f"psum over {b}": jax.lax.psum(v, b),
            "psum over both": jax.lax.psum(v, (a, b)),
        }

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(a, b), out_specs=P(a, b), check_vma=False))
    with watchdog(watchdog_s, f"psum over the axes of a {rows} x {cols} hybrid mesh on CPU devices"):
        out = jax.block_until_ready(check_multidevice_safe(program, x)(x))
    return {k: np.asarray(out[k]) for k in ("input", f"psum over {a}", f"psum over {b}", "psum over both")}


# ---------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------


def allreduce_time(nbytes: float, n: int, link_bytes_per_s: float, latency_s: float) -> float:
    """Ring all-reduce time (s) of ``nbytes`` over ``n`` devices: ``2 (n-1) latency + 2 (n-1)/n * nbytes / link``.

    ``link_bytes_per_s``: bytes per second each device sends to its neighbour (a link's
    *per-direction* figure). The same model as
    :func:`course_lib.scaling.collectives.allreduce_time_model` (Patarasuk and Yuan 2009).
    """
    if n == 1:
        return 0.0
    return allreduce_time_model(n, nbytes, latency_s, link_bytes_per_s)


@dataclass(frozen=True)
class AxisAssignment:
    """Per-step communication of one mapping of ``data`` and ``model`` onto fast and slow links (seconds)."""

    name: str
    model_link: str
    data_link: str
    model_bytes_per_step: float  # bytes each device sends over the model axis per step (ring)
    data_bytes_per_step: float  # bytes each device sends over the data axis per step (ring)
    model_s: float  # 2 activation all-reduces per layer (forward y, backward dx)
    data_s: float  # one gradient all-reduce per step

    @property
    def total_s(self) -> float:
        return self.model_s + self.data_s


def axis_assignment_cost(
    fast: Link,
    slow: Link,
    n_slices: int = 2,
    per_slice: int = 8,
    tokens: int = 16384,
    d_model: int = 4096,
    d_hidden: int = 16384,
    layers: int = 32,
    bytes_per_elem: int = 2,
    alpha_fast_s: float = ASSUMED_ALPHA_S["ici"],
    alpha_slow_s: float = ASSUMED_ALPHA_S["dcn"],
) -> dict[str, AxisAssignment]:
    """Per-step communication time of a ``data (n_slices) x model (per_slice)`` Megatron MLP stack, two ways.

    The job: ``layers`` MLP blocks ``d_model -> d_hidden -> d_model`` (the Megatron layout of
    :mod:`course_lib.scaling.tensor_parallel`), ``tokens`` per step split over ``data``,
    ``bytes_per_elem`` per activation and gradient element (2: bf16). Per step each device
    runs, over ``model`` (``G = per_slice`` devices), two all-reduces per layer of
    ``tokens / n_slices * d_model`` elements (``y`` in the forward, ``dx`` in the backward) and,
    over ``data`` (``n_slices`` devices), one all-reduce of its gradient shard,
    ``layers * (2 d_model d_hidden / per_slice + d_hidden / per_slice + d_model)`` elements
    (the sizes of :func:`course_lib.scaling.tensor_parallel.layout_communication` with
    ``x_needs_grad=True``). Times by :func:`allreduce_time`.

    ``"model on fast, data on slow"``: each ``model`` group is one slice (``model`` on
    ``fast``), each ``data`` group crosses slices (``slow``). ``"model on slow, data on fast"``:
    the same mesh shape with the device order reversed, so each ``model`` group straddles
    the slices (a ring is as fast as its slowest link: ``slow``) and each ``data`` group sits
    in one slice. Assumptions: every link of a kind runs at its per-direction figure, one
    ring per collective, no overlap of communication with compute (in practice the gradient
    all-reduce overlaps with the backward pass and tensor parallelism's does not, which
    favours ``model`` on the fast links further), ``alpha`` values assumed (:data:`ASSUMED_ALPHA_S`).
    """
    for name, v in (("n_slices", n_slices), ("per_slice", per_slice), ("tokens", tokens), ("d_model", d_model), ("d_hidden", d_hidden), ("layers", layers), ("bytes_per_elem", bytes_per_elem)):  # fmt: skip
        if v < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    if tokens % n_slices or d_hidden % per_slice:
        raise ValueError(
            f"tokens ({tokens}) must divide over the {n_slices} data groups and d_hidden ({d_hidden}) over the "
            f"{per_slice} model devices"
        )
    n_model, n_data, e = per_slice, n_slices, bytes_per_elem
    act_bytes = tokens // n_data * d_model * e
    grad_bytes = layers * (2 * d_model * d_hidden // n_model + d_hidden // n_model + d_model) * e
    model_bytes = 2 * layers * ring_allreduce_bytes_sent_per_device(n_model, act_bytes)
    data_bytes = ring_allreduce_bytes_sent_per_device(n_data, grad_bytes)
    out = {}
    for name, m_link, d_link in (
        ("model on fast, data on slow", fast, slow),
        ("model on slow, data on fast", slow, fast),
    ):
        m_alpha = alpha_fast_s if m_link is fast else alpha_slow_s
        d_alpha = alpha_fast_s if d_link is fast else alpha_slow_s
        model_s = 2 * layers * allreduce_time(act_bytes, n_model, m_link.per_direction_bytes_per_s, m_alpha)
        data_s = allreduce_time(grad_bytes, n_data, d_link.per_direction_bytes_per_s, d_alpha)
        out[name] = AxisAssignment(name, m_link.name, d_link.name, model_bytes, data_bytes, model_s, data_s)
    return out


def format_axis_assignment(costs: dict[str, AxisAssignment]) -> str:
    """The two assignments side by side, in milliseconds per step, and their ratio."""
    lines = [f"{'assignment':<30} {'model axis':>11} {'data axis':>11} {'total':>11}"]
    for c in costs.values():
        lines.append(f"{c.name:<30} {c.model_s * 1e3:>8.2f} ms {c.data_s * 1e3:>8.2f} ms {c.total_s * 1e3:>8.2f} ms")
    good, bad = costs["model on fast, data on slow"], costs["model on slow, data on fast"]
    lines.append(
        f"putting model on the slow links costs {bad.total_s / good.total_s:.1f}x the communication time per step, "
        f"and {bad.model_s / good.model_s:.0f}x on the tensor-parallel all-reduces (on the critical path; the gradient "
        f"all-reduce can overlap with the backward pass)"
    )
    return "\n".join(lines)
