"""Hybrid (multi-slice) meshes: the device arrangement equals jax's create_hybrid_device_mesh on fake
devices that carry a slice_index, the outer axis crosses slices, psum over each axis of a real
2 x 2 CPU mesh gives the right sums, and the ICI/DCN cost model favours model-on-fast-links, with
one case computed by hand. The conftest gives the session 4 CPU devices.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np
import pytest
from jax.experimental.mesh_utils import create_hybrid_device_mesh

from course_lib.scaling.topology import (
    ASSUMED_ALPHA_S,
    GB,
    PUBLISHED_LINKS,
    Link,
    allreduce_time,
    axis_assignment_cost,
    format_axis_assignment,
    format_links,
    hybrid_device_array,
    hybrid_mesh,
    psum_demo,
    slice_indices,
)


@dataclass(frozen=True)
class FakeDevice:
    """Just what create_hybrid_device_mesh reads of a device (CPU platform: no TPU torus handling)."""

    id: int
    slice_index: int
    process_index: int = 0
    platform: str = "cpu"
    device_kind: str = "fake slice device"


def ids(array: np.ndarray) -> np.ndarray:
    return np.vectorize(lambda d: d.id)(array)


@pytest.mark.parametrize(
    "ici, dcn",
    [((1, 2), (2, 1)), ((1, 4), (2, 1)), ((2, 2), (1, 2)), ((1, 2, 2), (2, 1, 1)), ((2, 1), (1, 3)), ((2, 3), (2, 2))],
)
def test_arrangement_equals_create_hybrid_device_mesh(ici: tuple[int, ...], dcn: tuple[int, ...]) -> None:
    k = int(np.prod(ici))
    devices = [FakeDevice(i, i // k) for i in range(k * int(np.prod(dcn)))]
    expected = create_hybrid_device_mesh(list(ici), list(dcn), devices)
    mine = hybrid_device_array(ici, dcn, devices)
    assert mine.shape == tuple(i * d for i, d in zip(ici, dcn, strict=True))
    np.testing.assert_array_equal(ids(mine), ids(expected))
    # hybrid_mesh takes the slice_index path for such devices and agrees too.
    mesh_devices = hybrid_mesh(ici, dcn, [f"a{i}" for i in range(len(ici))], devices).devices
    np.testing.assert_array_equal(ids(mesh_devices), ids(expected))


def test_one_host_of_gpus_all_in_slice_0() -> None:
    """The GPUs of one host all carry slice_index 0 (review of lesson 05, defect 1): create_hybrid_device_mesh
    refuses them for 2 slices, so hybrid_mesh groups consecutive devices into fake slices instead."""
    devices = [FakeDevice(i, 0, platform="gpu") for i in range(8)]
    with pytest.raises(ValueError):
        create_hybrid_device_mesh([1, 2], [2, 1], devices[:4])
    mesh = hybrid_mesh((1, 2), (2, 1), ("data", "model"), devices[:4])
    np.testing.assert_array_equal(ids(mesh.devices), [[0, 1], [2, 3]])
    mesh = hybrid_mesh((1, 4), (2, 1), ("data", "model"), devices)
    np.testing.assert_array_equal(ids(mesh.devices), ids(hybrid_device_array((1, 4), (2, 1), devices)))


def test_two_hosts_of_gpus_use_their_slice_index() -> None:
    """Two hosts (slice indices 0 and 1, listed interleaved): the slices come from the index, not the order."""
    devices = [FakeDevice(i, i % 2, platform="gpu") for i in range(8)]
    mesh = hybrid_mesh((1, 4), (2, 1), ("data", "model"), devices)
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    np.testing.assert_array_equal(slice_of, [[0] * 4, [1] * 4])
    np.testing.assert_array_equal(ids(mesh.devices), ids(create_hybrid_device_mesh([1, 4], [2, 1], devices)))


def test_outer_axis_crosses_slices_inner_stays() -> None:
    k, slices = 4, 2
    devices = [FakeDevice(i, i // k) for i in range(k * slices)]
    array = hybrid_device_array((1, k), (slices, 1), devices)  # ("data", "model")
    slice_of = np.vectorize(lambda d: d.slice_index)(array)
    assert (slice_of == np.arange(slices)[:, None]).all()  # each model row is one slice
    for col in slice_of.T:  # each data column visits every slice
        assert sorted(col) == list(range(slices))
    np.testing.assert_array_equal(ids(array[0]), np.arange(k))  # consecutive devices per slice


def test_cpu_hybrid_mesh_and_psum_over_each_axis() -> None:
    devices = jax.devices()[:4]
    mesh = hybrid_mesh((1, 2), (2, 1), ("data", "model"), devices)
    assert dict(mesh.shape) == {"data": 2, "model": 2}
    np.testing.assert_array_equal(ids(mesh.devices), [[devices[0].id, devices[1].id], [devices[2].id, devices[3].id]])
    np.testing.assert_array_equal(slice_indices(mesh, 2), [[0, 0], [1, 1]])
    out = psum_demo(mesh, watchdog_s=60)
    x = out["input"]
    np.testing.assert_array_equal(x, [[0, 1], [10, 11]])
    np.testing.assert_array_equal(out["psum over data"], np.broadcast_to(x.sum(0, keepdims=True), x.shape))
    np.testing.assert_array_equal(out["psum over model"], np.broadcast_to(x.sum(1, keepdims=True), x.shape))
    np.testing.assert_array_equal(out["psum over both"], np.full(x.shape, x.sum()))


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="3 devices, but 4 were given"):
        hybrid_mesh((1, 3), (1, 1), ("data", "model"), jax.devices()[:4])
    with pytest.raises(ValueError, match="one entry per mesh axis"):
        hybrid_mesh((2, 2), (1,), ("data", "model"), jax.devices()[:4])
    with pytest.raises(ValueError, match="axis_names"):
        hybrid_mesh((2, 2), (1, 1), ("data",), jax.devices()[:4])
    with pytest.raises(ValueError, match=">= 1"):
        hybrid_device_array((0, 4), (1, 1), list(range(4)))


def test_link_table_is_in_bytes_per_second() -> None:
    links = PUBLISHED_LINKS
    assert links["h100_nvlink4"].bidirectional_bytes_per_s == 900e9
    assert links["h100_nvlink4"].per_direction_bytes_per_s == 450e9
    assert links["ndr_infiniband_cx7"].per_direction_bytes_per_s == 400e9 / 8  # 400 Gb/s -> 50 GB/s
    assert links["tpu_v5p_dcn"].per_direction_bytes_per_s == 50e9 / 8
    assert links["tpu_v5p_ici"].bidirectional_bytes_per_s == 1200e9
    assert links["tpu_v5e_ici"].bidirectional_bytes_per_s == 400e9
    for link in links.values():
        assert link.scope in ("ici", "dcn") and link.source and 2015 < link.year < 2030
        assert link.bidirectional_bytes_per_s == pytest.approx(2 * link.per_direction_bytes_per_s)
        assert 1e9 <= link.per_direction_bytes_per_s <= 1e13  # bytes/s, not bits or GB
    fast = [v.per_direction_bytes_per_s for v in links.values() if v.scope == "ici"]
    slow = [v.per_direction_bytes_per_s for v in links.values() if v.scope == "dcn"]
    assert min(fast) >= 4 * max(slow)  # v5e ICI 200 GB/s vs NDR 50 GB/s each way
    assert "450.0 GB/s" in format_links()


def test_allreduce_time_by_hand() -> None:
    # 8 devices, 1 MB, 100 GB/s, 5 us: 2*7*5e-6 + 2*7/8*1e6/1e11 = 7e-5 + 1.75e-5
    assert allreduce_time(1e6, 8, 100 * GB, 5e-6) == pytest.approx(8.75e-5)
    assert allreduce_time(1e6, 1, 100 * GB, 5e-6) == 0.0


def test_axis_assignment_by_hand_and_direction() -> None:
    fast = Link("fast", "ici", 100e9, 200e9, "test", 2024)
    slow = Link("slow", "dcn", 10e9, 20e9, "test", 2024)
    c = axis_assignment_cost(
        fast, slow, n_slices=2, per_slice=4, tokens=8, d_model=4, d_hidden=8, layers=1, bytes_per_elem=2,
        alpha_fast_s=1e-6, alpha_slow_s=1e-5,
    )  # fmt: skip
    act = 8 // 2 * 4 * 2  # 32 bytes per activation all-reduce
    grad = (2 * 4 * 8 // 4 + 8 // 4 + 4) * 2  # 44 bytes of gradient per device
    good, bad = c["model on fast, data on slow"], c["model on slow, data on fast"]
    model_fast = 2 * (2 * 3 * 1e-6 + 2 * 3 / 4 * act / 100e9)
    data_slow = 2 * 1 * 1e-5 + 2 * 1 / 2 * grad / 10e9
    assert good.model_s == pytest.approx(model_fast)
    assert good.data_s == pytest.approx(data_slow)
    assert bad.model_s == pytest.approx(2 * (2 * 3 * 1e-5 + 2 * 3 / 4 * act / 10e9))
    assert good.model_bytes_per_step == bad.model_bytes_per_step == pytest.approx(2 * 2 * 3 / 4 * act)
    assert good.total_s < bad.total_s


@pytest.mark.parametrize(
    "fast, slow, per_slice",
    [("h100_nvlink4", "ndr_infiniband_cx7", 8), ("tpu_v5p_ici", "tpu_v5p_dcn", 4), ("tpu_v5e_ici", "tpu_v5e_dcn", 4)],
)
def test_model_on_fast_links_wins_with_published_figures(fast: str, slow: str, per_slice: int) -> None:
    c = axis_assignment_cost(PUBLISHED_LINKS[fast], PUBLISHED_LINKS[slow], per_slice=per_slice)
    good, bad = c["model on fast, data on slow"], c["model on slow, data on fast"]
    assert bad.total_s > 2 * good.total_s
    ratio = PUBLISHED_LINKS[fast].per_direction_bytes_per_s / PUBLISHED_LINKS[slow].per_direction_bytes_per_s
    # time = latency + bytes / bandwidth: the ratio lies between the latencies' and the bandwidths' ratios
    alpha_ratio = ASSUMED_ALPHA_S["dcn"] / ASSUMED_ALPHA_S["ici"]
    assert min(ratio, alpha_ratio) <= bad.model_s / good.model_s <= max(ratio, alpha_ratio)
    assert bad.model_s / good.model_s > 0.5 * ratio  # these messages (tens of MB) are bandwidth-bound
    assert "costs" in format_axis_assignment(c)


def test_cost_model_matches_tensor_parallel_bytes() -> None:
    from course_lib.scaling.tensor_parallel import layout_communication

    c = axis_assignment_cost(PUBLISHED_LINKS["h100_nvlink4"], PUBLISHED_LINKS["ndr_infiniband_cx7"], n_slices=2,
                             per_slice=8, tokens=64, d_model=16, d_hidden=64, layers=1, bytes_per_elem=4)  # fmt: skip
    tp = layout_communication(64, 16, 64, 16, 2, 8, 4, x_needs_grad=True)["2-D"]
    good = c["model on fast, data on slow"]
    assert good.model_bytes_per_step == pytest.approx(tp.forward_bytes + tp.dx_bytes)
    assert good.data_bytes_per_step == pytest.approx(tp.grad_sync_bytes)


def test_cost_model_bad_input() -> None:
    with pytest.raises(ValueError, match="d_hidden"):
        axis_assignment_cost(
            PUBLISHED_LINKS["h100_nvlink4"], PUBLISHED_LINKS["ndr_infiniband_cx7"], per_slice=3, d_hidden=16
        )
