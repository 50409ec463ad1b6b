"""Devices and meshes for lesson 05, and the one rule that keeps CPU multi-device code from hanging.

On a machine without accelerators, XLA can split the CPU into several *host devices*
(``jax_num_cpu_devices``); each is a full JAX device with its own buffers, so meshes,
shardings and collectives behave as on GPUs or TPUs, and a program written for them runs
unchanged on a pod. The count must be set before JAX starts its backend (the first
computation or device query): :func:`use_cpu_devices` does that and says clearly when it
is too late.

**Why multi-device CPU programs hung, and the rule that fixes it** (measured on jaxlib
0.10.2, 2 cores, 2026-11-23). All host devices share one intra-op thread pool of one
thread per core. JAX's LAPACK kernels (QR, Cholesky, eigh, ... behind ``jnp.linalg`` and
``jax.nn.initializers.orthogonal``) split a batched call into tasks on that pool and
*block* a pool thread until the tasks finish. When two devices run such a kernel at the
same time, both pool threads block waiting for tasks that no free thread will ever run:
a deadlock (gdb: both ``tf_XLAEigen`` threads in ``jax::ParallelBatchMap`` ->
``BlockingCounter::Wait``). The minimal reproducer: 100 blocked calls of this hung in 6 of
6 processes on the idle machine (load about 1) and in none of 5 at load 2.5-3: the two
devices must be inside the kernel at the same moment, which other work on the cores
makes rarer (a hazard that comes and goes with the load is the worst kind)::

    jax.jit(jax.shard_map(lambda x: jnp.linalg.qr(x)[0], mesh=mesh_of_2,
                          in_specs=P("data"), out_specs=P("data")))(x + i)   # x: [256, 64, 64]

Lesson 04's PPO initialises its layers orthogonally (a batched QR once seeds are
vmapped), which is why ``jit(shard_map(vmap(train)))`` hung in 4 of 6 runs; with the
initialisation outside the sharded program it ran 8 of 8. So: **no LAPACK call inside a
program that runs on several CPU devices**; initialise parameters before, on one device.
:func:`check_multidevice_safe` enforces it on the compiled program, and every
multi-device program of the lesson also runs under :func:`course_lib.runtime.watchdog.watchdog`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
from jax._src import xla_bridge
from jax.sharding import Mesh

#: Custom-call targets that block a shared CPU pool thread (JAX's LAPACK FFI kernels).
_BLOCKING_CALL = re.compile(r'custom_call_target="(lapack_[A-Za-z0-9_]+)"')


class MultiDeviceHazard(RuntimeError):
    """A program about to run on several CPU devices contains a call that can deadlock them."""


def use_cpu_devices(n: int) -> None:
    """Ask XLA for ``n`` CPU host devices (``jax_num_cpu_devices``), without starting the backend.

    Must run before the process's first JAX computation (``jax.devices()``,
    ``jax.random.key``, a jitted call). Afterwards it changes nothing, so it checks: if
    the backend is already up on a CPU with a different count, it raises and says to
    restart the kernel. On a GPU or TPU machine the accelerators are the default devices
    and the ``n`` CPU devices exist beside them (``jax.devices("cpu")``):
    :func:`device_plan` runs the multi-device sections there when there are too few
    accelerators.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 CPU devices, got {n}")
    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_num_cpu_devices", n)
        return
    if jax.default_backend() == "cpu" and jax.device_count() != n:
        raise RuntimeError(
            f"JAX already started with {jax.device_count()} CPU device(s); the device count is "
            f"fixed at the first computation. Restart the kernel (or process) and call "
            f"use_cpu_devices({n}) before anything else touches JAX."
        )


def data_mesh(n: int | None = None, axis: str = "data", devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh over the first ``n`` devices (all of them by default), named ``axis``."""
    devices = list(devices if devices is not None else jax.devices())
    n = len(devices) if n is None else n
    if not 1 <= n <= len(devices):
        raise ValueError(f"a mesh of {n} devices needs 1..{len(devices)} (JAX has {len(devices)}): {devices}")
    return jax.make_mesh((n,), (axis,), devices=devices[:n])


def blocking_calls(compiled_hlo: str) -> list[str]:
    """The LAPACK custom calls in a compiled program's HLO text (``jitted.lower(...).compile().as_text()``)."""
    return sorted(set(_BLOCKING_CALL.findall(compiled_hlo)))


def check_multidevice_safe(jitted: Any, *args: Any, **kwargs: Any) -> Any:
    """Compile ``jitted`` for ``args`` and refuse it if it would run a LAPACK call on several CPU devices.

    Returns the compiled executable (call it with the same arguments). On one device, or
    on GPU/TPU devices, everything is allowed; CPU host devices are checked whatever the
    default backend (a GPU machine's lesson runs its multi-device sections on them). Raises :class:`MultiDeviceHazard` naming
    the calls and the fix otherwise.
    """
    compiled = jitted.lower(*args, **kwargs).compile()
    devices = {d for leaf in jax.tree.leaves(compiled.input_shardings) for d in leaf.device_set}
    if len(devices) < 2 or any(d.platform != "cpu" for d in devices):
        return compiled  # one device, or accelerators (a GPU machine's CPU devices are still checked)
    calls = blocking_calls(compiled.as_text())
    if calls:
        raise MultiDeviceHazard(
            f"this program runs on {len(devices)} CPU devices and contains {', '.join(calls)}: on the "
            f"shared CPU thread pool two devices in a LAPACK call at once deadlock. Move the linear algebra "
            f"(jnp.linalg.*, orthogonal initialisation) out of the multi-device program: compute it first "
            f"on one device and pass the result in."
        )
    return compiled


#: Use at most this many of the default backend's devices (unset: all). ``COURSE_MAX_DEVICES=1``
#: runs a lesson as on a machine with one accelerator: its multi-device sections move to CPU
#: host devices, exactly as on a one-GPU machine (the test of lesson 05's one-device path uses it).
MAX_DEVICES_ENV = "COURSE_MAX_DEVICES"


@dataclass(frozen=True)
class DevicePlan:
    """Where a lesson's sections run: its main device(s), and ``want`` devices for its meshes.

    ``main`` are the default backend's devices (at most ``COURSE_MAX_DEVICES``); single-device
    work (and the full-scale figures) runs on ``main[0]``. ``multi`` are the ``want``
    devices the multi-device sections build their meshes from: the default backend's when
    it has enough, else CPU host devices beside it (a one-GPU machine), else none.
    """

    want: int
    main: tuple[Any, ...]
    multi: tuple[Any, ...]

    @property
    def main_platform(self) -> str:
        return str(self.main[0].platform)

    @property
    def multi_platform(self) -> str:
        return str(self.multi[0].platform) if self.multi else "none"

    @property
    def multi_on_main(self) -> bool:
        """True when the meshes use the default backend's own devices (not CPU devices beside them)."""
        return len(self.main) >= self.want

    def mesh(self, n: int | None = None, axis: str = "data") -> Mesh:
        """A 1-D mesh over the first ``n`` (default ``want``) of the plan's multi-device devices."""
        if not self.multi:
            raise RuntimeError(self.describe())
        return data_mesh(n if n is not None else self.want, axis, devices=self.multi)

    def pick(self, *, cpu: Any, full: Any, scale: str) -> Any:
        """``full`` only at the full scale *and* when the meshes are on the main backend's devices.

        Multi-device sections that moved to CPU host devices keep the cpu scale's sizes
        (4,096 environments on CPU host devices would take minutes to teach nothing new).
        """
        return full if scale == "full" and self.multi_on_main else cpu

    def pick_main(self, *, cpu: Any, full: Any, scale: str) -> Any:
        """``full`` only at the full scale on an accelerator: the sizes of the single-device sections.

        A full-scale run on a CPU (``COURSE_MAX_DEVICES=1`` in the tests) takes the same
        code path with the cpu sizes.
        """
        return full if scale == "full" and self.main_platform != "cpu" else cpu

    def describe(self) -> str:
        """One paragraph for the learner: which devices run what, and why."""
        k, plat = len(self.main), self.main_platform
        if self.multi_on_main:
            return f"{k} {plat} device(s): the single-device and the {self.want}-device sections run on them."
        if self.multi:
            return (
                f"only {k} {plat} device(s), fewer than the {self.want} the meshes need: the single-device "
                f"sections run on {plat}, the multi-device sections on {self.want} CPU host devices beside it, "
                f"at the cpu scale's sizes."
            )
        return (
            f"only {k} {plat} device(s) and no {self.want} CPU host devices beside them: the multi-device "
            f"sections cannot run. Fix: let JAX use the CPU too (JAX_PLATFORMS unset or including 'cpu'), call "
            f"use_cpu_devices({self.want}) before JAX starts, and unset {MAX_DEVICES_ENV}."
        )


def plan_devices(want: int, main: Sequence[Any], cpu: Sequence[Any], limit: int | None = None) -> DevicePlan:
    """The :class:`DevicePlan` for device lists given explicitly (what :func:`device_plan` reads; tests fake them)."""
    if want < 1:
        raise ValueError(f"want must be >= 1 devices, got {want}")
    if limit is not None and limit < 1:
        raise ValueError(f"{MAX_DEVICES_ENV} must be an int >= 1, got {limit}")
    if not main:
        raise ValueError("main must hold at least one device (jax.devices() is never empty)")
    main = tuple(main)[:limit] if limit is not None else tuple(main)
    if len(main) >= want:
        return DevicePlan(want, main, main[:want])
    if len(cpu) >= want:
        return DevicePlan(want, main, tuple(cpu)[:want])
    return DevicePlan(want, main, ())


def device_plan(want: int) -> DevicePlan:
    """Plan a lesson's devices from what JAX has: the default backend, and its CPU devices beside it.

    Call :func:`use_cpu_devices` (``want``) first, before JAX starts. ``COURSE_MAX_DEVICES``
    caps the default backend's devices (``1``: run as on a one-GPU machine).
    """
    raw = os.environ.get(MAX_DEVICES_ENV, "").strip()
    try:
        limit = int(raw) if raw else None
    except ValueError:
        raise ValueError(f"{MAX_DEVICES_ENV} must be an int >= 1, got {raw!r}") from None
    try:
        cpu = jax.devices("cpu")
    except RuntimeError:  # JAX_PLATFORMS without cpu
        cpu = []
    return plan_devices(want, jax.devices(), cpu, limit)
