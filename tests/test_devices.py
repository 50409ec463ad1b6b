"""course_lib.scaling.devices: the device count, meshes, and the guard against the CPU LAPACK deadlock."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.scaling.devices import MultiDeviceHazard, blocking_calls, check_multidevice_safe, data_mesh, use_cpu_devices


def test_session_has_the_requested_devices():
    assert jax.device_count() == 4  # tests/conftest.py
    use_cpu_devices(4)  # same count again: allowed
    with pytest.raises(RuntimeError, match="Restart the kernel"):
        use_cpu_devices(2)
    with pytest.raises(ValueError, match=">= 1"):
        use_cpu_devices(0)


def test_data_mesh():
    mesh = data_mesh(2)
    assert mesh.shape == {"data": 2} and list(mesh.devices) == jax.devices()[:2]
    assert data_mesh().shape == {"data": 4}
    with pytest.raises(ValueError, match=r"needs 1\.\.4"):
        data_mesh(5)


def _qr_program(n):
    mesh = data_mesh(n)
    fn = jax.jit(jax.shard_map(lambda x: jnp.linalg.qr(x)[0], mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    x = jax.device_put(jnp.ones((4, 3, 3)), NamedSharding(mesh, P("data")))
    return fn, x


def test_lapack_on_several_cpu_devices_is_refused_before_it_runs():
    fn, x = _qr_program(2)  # compiled only: this program would deadlock the two devices
    with pytest.raises(MultiDeviceHazard, match=r"lapack_sgeqrf_ffi.*Move the linear algebra"):
        check_multidevice_safe(fn, x)


def test_one_device_and_safe_programs_are_allowed():
    fn, x = _qr_program(1)
    assert blocking_calls(check_multidevice_safe(fn, x).as_text())  # QR is there, on one device: fine
    mesh = data_mesh(4)
    safe = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "data"), mesh=mesh, in_specs=P("data"), out_specs=P()))
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("data")))
    compiled = check_multidevice_safe(safe, x)
    assert blocking_calls(compiled.as_text()) == []
    assert jnp.allclose(compiled(x), jnp.arange(8.0).reshape(4, 2).sum(0))
