"""Collectives inside ``jax.shard_map``, and a ring all-reduce built from ``ppermute`` alone (lesson 05).

Inside ``jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)`` the function ``f`` sees
one device's *block* of each array, and talks to the other devices of a mesh axis only
through collectives named by that axis:

==================  =============================================================
``psum(x, a)``      every device gets the sum of all devices' ``x``      (all-reduce)
``pmean(x, a)``     the same divided by the axis size
``all_gather``      every device gets every device's ``x``, stacked      (all-gather)
``psum_scatter``    device ``i`` gets the sum of all devices' chunk ``i`` (reduce-scatter)
``ppermute``        device ``src`` sends its ``x`` to device ``dst``     (point to point)
==================  =============================================================

:func:`collective_demo` runs each on a tiny array so the lesson can print what every device
holds before and after.

**The ring all-reduce.** An all-reduce is a reduce-scatter followed by an all-gather, and
both halves can be built from ``ppermute`` on a ring ``0 -> 1 -> ... -> N-1 -> 0``. Split
each device's ``x`` into ``N`` chunks. In each of the ``N - 1`` reduce-scatter steps every
device sends one partial sum (one chunk, ``1/N`` of the data) to its right neighbour, which
adds its own copy of that chunk; after them device ``i`` holds chunk ``i`` summed over all
devices (:func:`ring_reduce_scatter`). In each of the ``N - 1`` all-gather steps every device
passes the last finished chunk it received on to the right (:func:`ring_all_gather`). Every
step moves ``1/N`` of the data over every link at once, so each device sends::

    bytes_sent_per_device = 2 (N - 1) / N * nbytes

which tends to ``2 * nbytes`` however many devices there are: the ring is *bandwidth
optimal* (no algorithm can make every device send less than ``(N-1)/N * nbytes`` in each
half). Its time in the alpha-beta model (``alpha``: the fixed cost of one step, latency and
launch; ``bandwidth``: bytes per second over one link)::

    t(N, nbytes) = 2 (N - 1) * alpha + 2 (N - 1) / N * nbytes / bandwidth

Small messages are latency-bound (the ``2 (N - 1) alpha`` term: many small steps), large
ones bandwidth-bound. :func:`fit_alpha_beta` fits ``alpha`` and ``bandwidth`` to measured
times and :func:`measure_allreduce` measures ``psum`` (XLA's built-in all-reduce) against
the ring over message sizes.

On CPU host devices every "link" is a memory copy inside one process and XLA's all-reduce
is not a ring (it rendezvous all devices and reduces in shared memory), so the fitted
``bandwidth`` is a memory-copy rate and ``alpha`` mostly the cost of a rendezvous; on GPUs
NCCL runs rings (and trees) over NVLink or the network, where the same model holds with
other constants.

Rules kept here: every function that runs a multi-device program blocks on its result and
runs under :func:`course_lib.runtime.watchdog.watchdog`, and no linear algebra runs inside a
multi-device program (:mod:`course_lib.scaling.devices`; the least-squares fit runs in NumPy).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.devices import check_multidevice_safe

#: Message sizes (bytes per device) that :func:`measure_allreduce` times by default: 4 KiB to 16 MiB.
DEFAULT_SIZES_BYTES: tuple[int, ...] = tuple(4096 * 4**k for k in range(7))


# ---------------------------------------------------------------------------
# The ring, from ppermute
# ---------------------------------------------------------------------------


def _check_axis(axis_name: str, axis_size: int) -> None:
    """Refuse an ``axis_size`` that is not the size of mesh axis ``axis_name`` (inside shard_map)."""
    actual = jax.lax.axis_size(axis_name)
    if actual != axis_size:
        raise ValueError(
            f"axis_size={axis_size} but mesh axis {axis_name!r} has {actual} devices: pass "
            f"axis_size=mesh.shape[{axis_name!r}]"
        )


def _ring_right(axis_size: int) -> list[tuple[int, int]]:
    """The ``ppermute`` pairs that send every device's value to its right neighbour on the ring."""
    return [(i, (i + 1) % axis_size) for i in range(axis_size)]


def ring_reduce_scatter(x: jax.Array, axis_name: str, axis_size: int) -> jax.Array:
    """Reduce-scatter along the leading axis by ``axis_size - 1`` ring steps of ``ppermute``.

    Call inside ``shard_map`` over mesh axis ``axis_name``. Each device's ``x`` (shape
    ``[m, ...]``) is cut into ``axis_size`` chunks of ``m / axis_size`` rows; device ``i``
    returns chunk ``i`` summed over all devices, like
    ``jax.lax.psum_scatter(x, axis_name, scatter_dimension=0, tiled=True)``.

    Step ``s`` (``s = 0 .. N-2``): device ``i`` sends its running sum of chunk
    ``(i - s - 1) mod N`` to device ``i + 1`` and receives the running sum of chunk
    ``(i - s - 2) mod N`` from device ``i - 1``, to which it adds its own copy. After the
    last step the chunk received is chunk ``i``, summed over all ``N`` devices.

    Raises ``ValueError`` if ``m`` is not divisible by ``axis_size`` (as ``psum_scatter``
    does; :func:`ring_allreduce` pads instead).
    """
    _check_axis(axis_name, axis_size)
    if x.ndim == 0 or x.shape[0] % axis_size:
        raise ValueError(
            f"ring_reduce_scatter splits the leading axis into {axis_size} equal chunks, but x has shape "
            f"{x.shape}: make the leading dimension a multiple of {axis_size} (pad it with zeros), or use "
            f"ring_allreduce, which pads"
        )
    n = axis_size
    chunks = x.reshape(n, x.shape[0] // n, *x.shape[1:])
    if n == 1:
        return chunks[0]
    i = jax.lax.axis_index(axis_name)
    acc = jax.lax.dynamic_index_in_dim(chunks, (i - 1) % n, axis=0, keepdims=False)
    for s in range(n - 1):
        received = jax.lax.ppermute(acc, axis_name, perm=_ring_right(n))
        acc = received + jax.lax.dynamic_index_in_dim(chunks, (i - s - 2) % n, axis=0, keepdims=False)
    return acc


def ring_all_gather(chunk: jax.Array, axis_name: str, axis_size: int) -> jax.Array:
    """All-gather along the leading axis by ``axis_size - 1`` ring steps of ``ppermute``.

    Call inside ``shard_map`` over mesh axis ``axis_name``; device ``i`` holds ``chunk``
    (shape ``[c, ...]``). Every device returns the ``[axis_size * c, ...]`` concatenation of
    all devices' chunks in device order, like ``jax.lax.all_gather(chunk, axis_name, tiled=True)``.

    Step ``s``: device ``i`` passes on the chunk it received last (its own at ``s = 0``) and
    receives chunk ``(i - s - 1) mod N`` from device ``i - 1``. The chunks arrive in the
    order ``i, i-1, ..., i-N+1``; one gather puts them in device order at the end (measured
    1.5x faster at 16 MiB than writing each into a zeroed buffer as it arrives).
    """
    _check_axis(axis_name, axis_size)
    if chunk.ndim == 0:
        raise ValueError(
            f"ring_all_gather concatenates along the leading axis: give chunk one (chunk[None]), got shape {chunk.shape}"
        )
    n = axis_size
    if n == 1:
        return chunk
    i = jax.lax.axis_index(axis_name)
    arrived = [chunk]  # arrived[k] is chunk (i - k) mod n
    for _ in range(n - 1):
        arrived.append(jax.lax.ppermute(arrived[-1], axis_name, perm=_ring_right(n)))
    in_device_order = jnp.take(jnp.stack(arrived), (i - jnp.arange(n)) % n, axis=0, mode="clip")
    return in_device_order.reshape(n * chunk.shape[0], *chunk.shape[1:])


def ring_allreduce(x: jax.Array, axis_name: str, axis_size: int) -> jax.Array:
    """All-reduce (sum over mesh axis ``axis_name``) as a ring reduce-scatter then a ring all-gather.

    Call inside ``shard_map``; equals ``jax.lax.psum(x, axis_name)`` up to the order of the
    floating-point additions. ``x`` may have any shape: it is flattened and **padded with
    zeros** to a multiple of ``axis_size`` elements (as NCCL works on flat buffers), reduced,
    and cut back. Each device sends ``2 (N-1)/N`` of ``x``'s bytes
    (:func:`ring_allreduce_bytes_sent_per_device`) in ``2 (N-1)`` messages.
    """
    _check_axis(axis_name, axis_size)
    if axis_size == 1:
        return x
    flat = x.reshape(-1)
    pad = (-flat.shape[0]) % axis_size
    if pad:
        flat = jnp.concatenate([flat, jnp.zeros((pad,), flat.dtype)])
    mine = ring_reduce_scatter(flat, axis_name, axis_size)
    full = ring_all_gather(mine, axis_name, axis_size)
    return full[: x.size].reshape(x.shape)


# ---------------------------------------------------------------------------
# The cost model
# ---------------------------------------------------------------------------


def _check_n(n_devices: int) -> None:
    if n_devices < 1:
        raise ValueError(f"n_devices must be >= 1, got {n_devices}")


def ring_reduce_scatter_bytes_sent_per_device(n_devices: int, nbytes: float) -> float:
    """Bytes each device sends in a ring reduce-scatter of an ``nbytes`` buffer: ``(N-1)/N * nbytes``."""
    _check_n(n_devices)
    return (n_devices - 1) / n_devices * nbytes


def ring_all_gather_bytes_sent_per_device(n_devices: int, nbytes: float) -> float:
    """Bytes each device sends in a ring all-gather whose *result* is ``nbytes``: ``(N-1)/N * nbytes``."""
    _check_n(n_devices)
    return (n_devices - 1) / n_devices * nbytes


def ring_allreduce_bytes_sent_per_device(n_devices: int, nbytes: float) -> float:
    """Bytes each device sends in a ring all-reduce of an ``nbytes`` buffer: ``2 (N-1)/N * nbytes``."""
    _check_n(n_devices)
    return 2 * (n_devices - 1) / n_devices * nbytes


def allreduce_time_model(n_devices: int, nbytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Alpha-beta time of a ring all-reduce: ``2 (N-1) alpha + 2 (N-1)/N * nbytes / bandwidth`` (seconds)."""
    _check_n(n_devices)
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {bandwidth_bytes_per_s}")
    return (
        2 * (n_devices - 1) * alpha_s + ring_allreduce_bytes_sent_per_device(n_devices, nbytes) / bandwidth_bytes_per_s
    )


@dataclass(frozen=True)
class AlphaBetaFit:
    """The alpha-beta model fitted to measured all-reduce times on ``n_devices`` devices.

    ``alpha_s``: seconds per ring step (latency); ``bandwidth_bytes_per_s``: bytes per second
    per link; ``rel_rms_error``: root-mean-square of ``(model - measured) / measured``.
    """

    n_devices: int
    alpha_s: float
    bandwidth_bytes_per_s: float
    rel_rms_error: float

    def predict_s(self, nbytes: float) -> float:
        """The model's all-reduce time for an ``nbytes`` message, in seconds."""
        return allreduce_time_model(self.n_devices, nbytes, self.alpha_s, self.bandwidth_bytes_per_s)


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float], n_devices: int) -> AlphaBetaFit:
    """Least-squares fit of ``t = 2 (N-1) alpha + 2 (N-1)/N * nbytes * beta`` to measurements.

    The model is linear in ``(alpha, beta)`` with ``beta = 1 / bandwidth``. Sizes span
    orders of magnitude, so the fit minimises the *relative* error (each row divided by its
    measured time; plain least squares would let the largest message decide everything and
    leave ``alpha`` to noise), and both coefficients are kept non-negative (if the
    unconstrained optimum has one negative, that one is set to 0 and the other refitted).
    Needs at least 2 distinct sizes and ``n_devices >= 2`` (one device sends nothing).
    """
    sizes = np.asarray(sizes_bytes, dtype=np.float64)
    times = np.asarray(times_s, dtype=np.float64)
    if sizes.shape != times.shape or sizes.ndim != 1:
        raise ValueError(
            f"sizes_bytes and times_s must be 1-D and the same length, got {sizes.shape} and {times.shape}"
        )
    if len(np.unique(sizes)) < 2:
        raise ValueError(f"fitting alpha and bandwidth needs at least 2 distinct message sizes, got {sizes.tolist()}")
    if n_devices < 2:
        raise ValueError(f"the ring model needs n_devices >= 2 (one device sends nothing), got {n_devices}")
    if np.any(times <= 0) or np.any(sizes < 0):
        raise ValueError("times_s must be > 0 and sizes_bytes >= 0")
    n = n_devices
    design = np.stack([np.full_like(sizes, 2.0 * (n - 1)), 2.0 * (n - 1) / n * sizes], axis=1)
    weighted, target = design / times[:, None], np.ones_like(times)

    def solve(columns: list[int]) -> np.ndarray:
        coef = np.zeros(2)
        coef[columns] = np.linalg.lstsq(weighted[:, columns], target, rcond=None)[0]
        return coef

    coef = solve([0, 1])
    if coef[0] < 0 or coef[1] <= 0:
        candidates = [c for c in (solve([0]), solve([1])) if np.all(c >= 0)]
        coef = min(candidates, key=lambda c: float(np.sum((weighted @ c - target) ** 2)))
    alpha, beta = float(coef[0]), float(coef[1])
    bandwidth = 1.0 / beta if beta > 0 else float("inf")
    rel = (design @ coef - times) / times
    return AlphaBetaFit(n, alpha, bandwidth, float(np.sqrt(np.mean(rel**2))))


# ---------------------------------------------------------------------------
# Measuring psum against the ring
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AllreduceRow:
    """Median times of one message size (``nbytes`` per device, float32) on ``n_devices`` devices."""

    n_devices: int
    nbytes: int
    psum_s: float
    ring_s: float
    ring_model_s: float
    psum_model_s: float
    max_abs_diff: float  # |ring - psum| over all devices' results

    @property
    def ring_over_psum(self) -> float:
        """How many times slower the ppermute ring is than the built-in psum."""
        return self.ring_s / self.psum_s

    def bus_bytes_per_s(self, seconds: float) -> float:
        """nccl-tests' "bus bandwidth": the bytes each device sends, ``2 (N-1)/N * nbytes``, per second."""
        return ring_allreduce_bytes_sent_per_device(self.n_devices, self.nbytes) / seconds


@dataclass(frozen=True)
class AllreduceMeasurement:
    """What :func:`measure_allreduce` measured: one row per size, both fits, the machine's load."""

    n_devices: int
    repeats: int
    rows: list[AllreduceRow]
    ring_fit: AlphaBetaFit
    psum_fit: AlphaBetaFit
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


def _mesh_axis(mesh: Mesh) -> str:
    if len(mesh.axis_names) != 1:
        raise ValueError(
            f"measure_allreduce needs a 1-D mesh, got axes {mesh.axis_names}: build one with course_lib.scaling.devices.data_mesh(n)"
        )
    return str(mesh.axis_names[0])


def allreduce_programs(mesh: Mesh) -> dict[str, jax.stages.Wrapped]:
    """The two jitted programs :func:`measure_allreduce` times on a 1-D ``mesh``.

    Both take a ``[N * k]`` float32 array sharded over the mesh (``k`` elements per device)
    and return every device's all-reduced block, stacked (``out_specs=P(axis)``), so each
    device's copy can be compared: ``"psum"`` (XLA's all-reduce) and ``"ring"``
    (:func:`ring_allreduce`).
    """
    axis = _mesh_axis(mesh)
    n = mesh.shape[axis]
    spec = P(axis)

    def psum(x: jax.Array) -> jax.Array:
        return jax.lax.psum(x, axis)

    def ring(x: jax.Array) -> jax.Array:
        return ring_allreduce(x, axis, n)

    return {
        name: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec))
        for name, f in (("psum", psum), ("ring", ring))
    }


def measure_allreduce(
    mesh: Mesh,
    sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES,
    repeats: int = 5,
    watchdog_s: float = 300.0,
) -> AllreduceMeasurement:
    """Median time of ``psum`` and of :func:`ring_allreduce` for each message size, and the fitted model.

    For each size (bytes of float32 per device): both programs are compiled (refused if
    they hold a LAPACK call, :func:`course_lib.scaling.devices.check_multidevice_safe`), run once
    to warm up (their results compared: ``max_abs_diff``), then timed ``repeats`` times
    each, interleaved (psum ring, ring psum, ...) so that both see the same machine load,
    every call blocked before the clock stops. The whole measurement runs under one
    watchdog of ``watchdog_s`` seconds. The alpha-beta model is fitted separately to the
    ring's and to psum's medians (:func:`fit_alpha_beta`) and each row carries both
    predictions.
    """
    axis = _mesh_axis(mesh)
    n = mesh.shape[axis]
    if n < 2:
        raise ValueError(f"an all-reduce over {n} device moves nothing: give a mesh of >= 2 devices")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    sizes = [int(s) for s in sizes_bytes]
    if any(s < 4 or s % 4 for s in sizes):
        raise ValueError(f"sizes_bytes are float32 buffers: multiples of 4 bytes, >= 4; got {sizes}")
    programs = allreduce_programs(mesh)
    sharding = NamedSharding(mesh, P(axis))
    load_before = os.getloadavg()
    medians: list[tuple[int, float, float, float]] = []
    with watchdog(watchdog_s, f"psum vs ring all-reduce on {n} CPU devices, {len(sizes)} sizes"):
        for nbytes in sizes:
            k = nbytes // 4
            x = jax.device_put(np.random.default_rng(nbytes).standard_normal(n * k, dtype=np.float32), sharding)
            compiled = {name: check_multidevice_safe(p, x) for name, p in programs.items()}
            warm = {name: np.asarray(jax.block_until_ready(c(x))) for name, c in compiled.items()}
            diff = float(np.max(np.abs(warm["ring"] - warm["psum"])))
            times: dict[str, list[float]] = {"psum": [], "ring": []}
            for r in range(repeats):
                for name in ("psum", "ring") if r % 2 == 0 else ("ring", "psum"):
                    t0 = time.perf_counter()
                    jax.block_until_ready(compiled[name](x))
                    times[name].append(time.perf_counter() - t0)
            medians.append((nbytes, statistics.median(times["psum"]), statistics.median(times["ring"]), diff))
    load_after = os.getloadavg()
    nb = [m[0] for m in medians]
    psum_fit = fit_alpha_beta(nb, [m[1] for m in medians], n)
    ring_fit = fit_alpha_beta(nb, [m[2] for m in medians], n)
    rows = [AllreduceRow(n, s, tp, tr, ring_fit.predict_s(s), psum_fit.predict_s(s), d) for s, tp, tr, d in medians]
    return AllreduceMeasurement(n, repeats, rows, ring_fit, psum_fit, load_before, load_after)


# ---------------------------------------------------------------------------
# What each collective does, on a tiny array
# ---------------------------------------------------------------------------


def collective_demo(mesh: Mesh, watchdog_s: float = 60.0) -> dict[str, np.ndarray]:
    """Run each collective on a tiny array over a 1-D ``mesh``; return what every device holds.

    Device ``i`` starts with row ``i`` of ``arange(N * N).reshape(N, N)`` (``N`` values).
    Returned arrays have a leading axis of ``N``: entry ``[i]`` is device ``i``'s result.

    - ``input``: device ``i``'s row;
    - ``psum``: the column sums, on every device (all-reduce);
    - ``pmean``: the column means, on every device;
    - ``all_gather``: the whole ``[N, N]`` matrix, on every device;
    - ``psum_scatter``: device ``i`` gets column ``i``'s sum only (reduce-scatter, ``tiled``);
    - ``ppermute``: device ``i`` gets device ``i - 1``'s row (a shift right on the ring);
    - ``ring_allreduce``: :func:`ring_allreduce`, equal to ``psum``.
    """
    axis = _mesh_axis(mesh)
    n = mesh.shape[axis]

    def per_device(row: jax.Array) -> dict[str, jax.Array]:
        row = row[0]  # this device's block is [1, N]
        out = {
            "input": row,
            "psum": jax.lax.psum(row, axis),
            "pmean": jax.lax.pmean(row, axis),
            "all_gather": jax.lax.all_gather(row, axis),
            "psum_scatter": jax.lax.psum_scatter(row, axis, scatter_dimension=0, tiled=True),
            "ppermute": jax.lax.ppermute(row, axis, perm=_ring_right(n)),
            "ring_allreduce": ring_allreduce(row, axis, n),
        }
        return {k: v[None] for k, v in out.items()}

    x = jax.device_put(jnp.arange(n * n, dtype=jnp.float32).reshape(n, n), NamedSharding(mesh, P(axis)))
    program = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=P(axis), out_specs=P(axis)))
    with watchdog(watchdog_s, f"collective demo on {n} CPU devices"):
        result = jax.block_until_ready(check_multidevice_safe(program, x)(x))
    order = ("input", "psum", "pmean", "all_gather", "psum_scatter", "ppermute", "ring_allreduce")
    return {k: np.asarray(result[k]) for k in order}  # (jit returns a dict's keys sorted)


def format_collective_demo(results: dict[str, np.ndarray]) -> str:
    """The demo's results as lines ``name: device 0 -> ..., device 1 -> ...`` (small numbers, no noise)."""
    lines = []
    for name, per_device in results.items():
        cells = "   ".join(
            f"d{i}: {np.array2string(v, precision=2, separator=' ')}".replace("\n", "")
            for i, v in enumerate(per_device)
        )
        lines.append(f"{name:>15}  {cells}")
    return "\n".join(lines)
