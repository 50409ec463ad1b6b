"""Lesson 12's Ray run with GPUs, on this machine without one: the device plan with faked counts,
GPU bundles and shares, and Ray started with declared-but-fake GPUs.

``placement.plan_devices`` decides CPUs and gloo or GPUs and NCCL in one place: every branch is
tested here with the cluster's GPUs and the CUDA devices an actor sees passed in. The test
marked ``ray`` starts a Ray of its own with ``num_gpus=2`` (Ray believes what it is told): the
placement group's bundles reserve the GPUs, every actor is granted its bundle's GPU
(``ray.get_gpu_ids()``), and with ``device='auto'`` the actors, seeing no CUDA device, run
today's CPU and gloo path; ``device='cuda'`` is refused naming the fix. Run it inside a
loopback-only namespace (``python -m course_lib.runtime.netns -- python -m pytest ...``).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile

import pytest

from course_lib.capstone_ray.controller import RayRunConfig
from course_lib.capstone_ray.cores import DIR_ENV
from course_lib.capstone_ray.placement import LAYOUTS, DevicePlan, bundles_for, plan_devices

# ---- plan_devices, every branch -------------------------------------------------------------------


def test_cpu_is_cpu_and_gloo_whatever_the_cluster_holds():
    for gpus, seen in [(0, None), (8, None), (8, 8)]:
        p = plan_devices("cpu", gpus, 2, seen)
        assert (p.reserve_gpus, p.device, p.backend) == (False, "cpu", "gloo")


def test_auto_without_a_gpu_per_bundle_is_todays_cpu_path():
    for gpus in (0, 1):
        p = plan_devices("auto", gpus, 2)
        assert (p.reserve_gpus, p.device, p.backend) == (False, "cpu", "gloo")
        assert f"declares {gpus} GPU(s), the layout needs 2" in p.reason
        assert p.in_actor(0) == p  # an actor decides the same


def test_auto_with_a_gpu_per_bundle_reserves_them_and_each_actor_decides_with_what_it_sees():
    p = plan_devices("auto", 2, 2)  # the controller: it does not see the actors' devices
    assert (p.reserve_gpus, p.device, p.backend) == (True, "cuda", "nccl")
    seen = p.in_actor(1)  # Ray's CUDA_VISIBLE_DEVICES: the bundle's GPU
    assert (seen.reserve_gpus, seen.device, seen.backend) == (True, "cuda", "nccl")
    fake = p.in_actor(0)  # GPUs declared to Ray but not there (this machine), or a CPU torch
    assert (fake.reserve_gpus, fake.device, fake.backend) == (True, "cpu", "gloo")
    assert "sees no CUDA device" in fake.reason


def test_trainers_sharing_one_gpu_keep_gloo_for_their_group():
    """Split layouts put the trainers in one bundle, on one GPU: NCCL refuses two ranks there."""
    for requested in ("auto", "cuda"):
        p = plan_devices(requested, 2, 2, 1, trainers_share_gpu=True)
        assert (p.device, p.backend) == ("cuda", "gloo") and "share one GPU" in p.reason


def test_cuda_is_refused_naming_the_problem_and_the_fix():
    with pytest.raises(ValueError, match=r"declares no GPU.*num_gpus.*device='auto'"):
        plan_devices("cuda", 0, 2)
    with pytest.raises(ValueError, match=r"one GPU per bundle, 3, and the Ray cluster declares 2"):
        plan_devices("cuda", 2, 3)
    p = plan_devices("cuda", 2.0, 2)
    assert (p.reserve_gpus, p.device, p.backend) == (True, "cuda", "nccl")
    with pytest.raises(ValueError, match=r"sees no CUDA device.*device='auto'"):
        p.in_actor(0)
    assert p.in_actor(1).backend == "nccl"
    with pytest.raises(ValueError, match="device='gpu' is not one of auto, cpu, cuda"):
        plan_devices("gpu", 2, 2)
    with pytest.raises(ValueError, match="device='tpu'"):
        RayRunConfig(device="tpu")


# ---- bundles_for with GPUs --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("n_trainers", "n_generators"), [(1, 1), (2, 2), (2, 4), (3, 6)])
def test_gpu_bundles_hold_one_gpu_and_every_actor_its_share_of_it(layout, n_trainers, n_generators):
    cpu = bundles_for(layout, n_trainers, n_generators)
    gpu = bundles_for(layout, n_trainers, n_generators, gpus_per_bundle=1.0)
    assert all(b == {"CPU": 1.0, "GPU": 1.0} for b in gpu.bundles)
    assert dataclasses.replace(gpu, bundles=cpu.bundles, trainer_gpus=0.0, generator_gpus=0.0) == cpu
    assert (gpu.trainer_gpus, gpu.generator_gpus) == pytest.approx((gpu.trainer_cpus, gpu.generator_cpus))
    used = [0.0] * len(gpu.bundles)
    for b in gpu.trainer_bundle:
        used[b] += gpu.trainer_gpus
    for b in gpu.generator_bundle:
        used[b] += gpu.generator_gpus
    assert used == pytest.approx([1.0] * len(gpu.bundles))  # every bundle's GPU exactly claimed
    assert cpu.trainer_gpus == cpu.generator_gpus == 0.0 and all(b == {"CPU": 1.0} for b in cpu.bundles)
    with pytest.raises(ValueError, match="gpus_per_bundle=-1"):
        bundles_for(layout, n_trainers, n_generators, gpus_per_bundle=-1)


# ---- Ray with declared-but-fake GPUs ------------------------------------------------------------------


@pytest.mark.ray
def test_fake_gpus_are_reserved_by_the_bundles_and_granted_to_each_actor_and_auto_stays_on_cpus(monkeypatch):
    import time

    import ray

    from course_lib.capstone_ray.cluster import start_ray, stop_ray
    from course_lib.capstone_ray.controller import Controller, run

    temp_dir = tempfile.mkdtemp(prefix="rayg")
    monkeypatch.setenv(DIR_ENV, f"{temp_dir}/cores")  # a core registry of its own (Ray's processes inherit it)
    try:
        start_ray(num_cpus=2, num_gpus=2, temp_dir=temp_dir)
        try:
            assert ray.cluster_resources().get("GPU") == 2
            # cuda with more bundles than GPUs: refused before anything is placed
            with pytest.raises(ValueError, match="one GPU per bundle, 3"):
                Controller(
                    RayRunConfig(
                        layout="sync_colocated", n_trainers=3, n_generators=3, groups_per_batch=3, device="cuda"
                    )
                ).place()
            cfg = RayRunConfig(layout="sync_colocated", n_updates=2, warm_steps=5, eval_prompts=32)
            # cuda with enough (fake) GPUs: placed, then every actor refuses, seeing no CUDA device
            with pytest.raises(ray.exceptions.RayActorError, match=r"sees no CUDA device.*device='auto'"):
                run(dataclasses.replace(cfg, device="cuda"))
            rep = run(cfg)
            end = time.monotonic() + 30  # the placement group's GPUs are back once Ray has removed it
            while ray.available_resources().get("GPU") != 2 and time.monotonic() < end:
                time.sleep(0.1)
            assert ray.available_resources().get("GPU") == 2
        finally:
            stop_ray()
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    devices = DevicePlan(**rep["devices"])
    assert devices.reserve_gpus and devices.cluster_gpus == 2 and devices.gpus_needed == 2
    assert rep["placement"] == dataclasses.asdict(bundles_for("sync_colocated", 2, 2, gpus_per_bundle=1.0))
    assert rep["audit"]["ok"], rep["audit"]
    by_bundle: dict[int, set[tuple[str, ...]]] = {}
    for a in rep["actors"]:
        assert len(a["gpu_ids"]) == 1, a  # Ray granted each actor its bundle's (fake) GPU
        assert (a["device"], a["backend"]) == ("cpu", "gloo"), a  # no CUDA device seen: today's path
        assert "sees no CUDA device" in a["device_reason"]
        assert a["cores"] == [a["pinned_core"]], a
        by_bundle.setdefault(a["bundle"], set()).add(tuple(a["gpu_ids"]))
    # trainer r and generator r share bundle r's GPU; the two bundles hold two GPUs
    assert sorted(by_bundle) == [0, 1] and all(len(v) == 1 for v in by_bundle.values())
    assert by_bundle[0] != by_bundle[1]
