"""course_lib.scaling.devices: the device count, meshes, and the guard against the CPU LAPACK deadlock."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.scaling.devices import (
    MultiDeviceHazard,
    blocking_calls,
    check_multidevice_safe,
    data_mesh,
    device_plan,
    plan_devices,
    use_cpu_devices,
)


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


class _FakeDevice:
    def __init__(self, platform, i):
        self.platform, self.id = platform, i

    def __repr__(self):
        return f"{self.platform}:{self.id}"


def _devs(platform, n):
    return [_FakeDevice(platform, i) for i in range(n)]


def test_plan_enough_accelerators_uses_them():
    plan = plan_devices(4, _devs("gpu", 8), _devs("cpu", 4))
    assert plan.multi_on_main and [d.platform for d in plan.multi] == ["gpu"] * 4
    assert plan.pick(cpu=32, full=4096, scale="full") == 4096 and plan.pick(cpu=32, full=4096, scale="cpu") == 32
    assert "the single-device and the 4-device sections run on them" in plan.describe()


def test_plan_one_gpu_moves_the_meshes_to_cpu_devices_at_cpu_sizes():
    plan = plan_devices(4, _devs("gpu", 1), _devs("cpu", 4))
    assert plan.main_platform == "gpu" and plan.multi_platform == "cpu" and not plan.multi_on_main
    assert len(plan.multi) == 4
    assert plan.pick(cpu=32, full=4096, scale="full") == 32
    assert (
        plan.pick_main(cpu=32, full=4096, scale="full") == 4096 and plan.pick_main(cpu=32, full=4096, scale="cpu") == 32
    )
    assert "only 1 gpu device(s)" in plan.describe() and "4 CPU host devices beside it" in plan.describe()


def test_plan_without_enough_devices_anywhere_says_how_to_fix():
    plan = plan_devices(4, _devs("gpu", 1), [])
    assert plan.multi == () and plan.multi_platform == "none"
    with pytest.raises(RuntimeError, match="JAX_PLATFORMS unset or including 'cpu'"):
        plan.mesh()


def test_plan_limit_and_bad_input():
    plan = plan_devices(4, _devs("cpu", 4), _devs("cpu", 4), limit=1)
    assert len(plan.main) == 1 and len(plan.multi) == 4 and not plan.multi_on_main  # the one-GPU path, on CPU
    assert plan.pick(cpu=32, full=4096, scale="full") == 32 and plan.pick_main(cpu=32, full=4096, scale="full") == 32
    with pytest.raises(ValueError, match="COURSE_MAX_DEVICES must be an int >= 1"):
        plan_devices(4, _devs("cpu", 4), [], limit=0)
    with pytest.raises(ValueError, match="want must be >= 1"):
        plan_devices(0, _devs("cpu", 4), [])


def test_device_plan_reads_the_environment(monkeypatch):
    monkeypatch.setenv("COURSE_MAX_DEVICES", "1")
    plan = device_plan(4)
    assert len(plan.main) == 1 and len(plan.multi) == 4 and plan.mesh(2).shape == {"data": 2}
    monkeypatch.setenv("COURSE_MAX_DEVICES", "one")
    with pytest.raises(ValueError, match="got 'one'"):
        device_plan(4)
    monkeypatch.delenv("COURSE_MAX_DEVICES")
    assert device_plan(4).multi_on_main
