"""Layouts as placement groups: which bundle each actor lands in, and its share of it.

A Ray placement group reserves *bundles* of resources (here ``{"CPU": 1.0}``: one core each) and
actors are scheduled into a named bundle. Lesson 08's layouts become bundle assignments:

    sync_colocated   bundle r = {trainer r, its generators}   the phases alternate on every core
    sync_split       bundle 0 = {trainers}, bundle 1 = {generators}   lag 0: one side waits
    pipeline         the same bundles as sync_split; generators decode while trainers train

Ray's ``num_cpus`` is bookkeeping: it keeps the bundle from being over-subscribed but pins nothing, so
each actor also pins itself to a core its bundle claims on its node (:mod:`.cores`).

GPUs (:func:`plan_devices` decides): every bundle also reserves one GPU (``{"CPU": 1.0, "GPU": 1.0}``)
and each actor takes its share of it as ``num_gpus``, as it takes ``num_cpus``; Ray then sets each
actor's ``CUDA_VISIBLE_DEVICES`` to its bundle's GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAYOUTS: tuple[str, ...] = ("sync_colocated", "sync_split", "pipeline")
#: What ``RayRunConfig.device`` may ask for (:func:`plan_devices`).
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Placement:
    """Where every actor of a layout goes.

    Attributes:
        layout: lesson 08's name of the layout.
        bundles: one resource dict per bundle (``{"CPU": 1.0}``, with GPUs ``{"CPU": 1.0, "GPU": 1.0}``).
        trainer_bundle: bundle index of trainer ``r``.
        generator_bundle: bundle index of generator ``i``.
        trainer_cpus: each trainer's ``num_cpus`` (its share of its bundle).
        generator_cpus: each generator's ``num_cpus``.
        strategy: the placement group's strategy (one node here: ``PACK``).
        trainer_gpus: each trainer's ``num_gpus`` (its share of its bundle's GPU; 0: no GPU).
        generator_gpus: each generator's ``num_gpus``.
    """

    layout: str
    bundles: tuple[dict[str, float], ...]
    trainer_bundle: tuple[int, ...]
    generator_bundle: tuple[int, ...]
    trainer_cpus: float
    generator_cpus: float
    strategy: str = "PACK"
    trainer_gpus: float = 0.0
    generator_gpus: float = 0.0

    def load(self) -> list[float]:
        """The CPUs claimed in each bundle (equal to each bundle's CPU in every layout)."""
        used = [0.0] * len(self.bundles)
        for b in self.trainer_bundle:
            used[b] += self.trainer_cpus
        for b in self.generator_bundle:
            used[b] += self.generator_cpus
        return used


def bundles_for(layout: str, n_trainers: int = 2, n_generators: int = 2, gpus_per_bundle: float = 0.0) -> Placement:
    """The placement of ``n_trainers`` trainers and ``n_generators`` generators for ``layout``.

    ``sync_colocated``: ``n_trainers`` one-core bundles; trainer ``r`` in bundle ``r`` with 0.5 CPU;
    generator ``i`` in bundle ``i % n_trainers``, the generators of a bundle sharing its other 0.5.
    ``sync_split`` and ``pipeline``: two one-core bundles, the trainers in bundle 0 and the generators
    in bundle 1, each side splitting its core evenly.

    ``gpus_per_bundle`` (0: none; :func:`plan_devices` says whether to use 1): every bundle also
    reserves that many GPUs, and every actor's ``num_gpus`` is its share of them, the same fraction
    of its bundle as its ``num_cpus`` (colocated: trainer ``r`` and its generators share bundle
    ``r``'s GPU; split: the trainers share bundle 0's, the generators bundle 1's).

    Raises:
        ValueError: an unknown layout, fewer than one actor of a role, a colocated layout whose
            generators cannot be spread evenly over the trainers' bundles, or a negative
            ``gpus_per_bundle``.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    if n_trainers < 1:
        raise ValueError(f"n_trainers={n_trainers}: a layout needs at least one trainer")
    if n_generators < 1:
        raise ValueError(f"n_generators={n_generators}: a layout needs at least one generator")
    if gpus_per_bundle < 0:
        raise ValueError(f"gpus_per_bundle={gpus_per_bundle}: give 0 (no GPU) or a positive number")
    one = {"CPU": 1.0} | ({"GPU": float(gpus_per_bundle)} if gpus_per_bundle else {})
    g = float(gpus_per_bundle)
    if layout == "sync_colocated":
        if n_generators % n_trainers:
            raise ValueError(
                f"sync_colocated puts the generators evenly beside the trainers: n_generators={n_generators} "
                f"is not a multiple of n_trainers={n_trainers}"
            )
        per_bundle = n_generators // n_trainers
        return Placement(
            layout=layout,
            bundles=tuple(dict(one) for _ in range(n_trainers)),
            trainer_bundle=tuple(range(n_trainers)),
            generator_bundle=tuple(i % n_trainers for i in range(n_generators)),
            trainer_cpus=0.5,
            generator_cpus=0.5 / per_bundle,
            trainer_gpus=g * 0.5,
            generator_gpus=g * 0.5 / per_bundle,
        )
    return Placement(
        layout=layout,
        bundles=(dict(one), dict(one)),
        trainer_bundle=(0,) * n_trainers,
        generator_bundle=(1,) * n_generators,
        trainer_cpus=1.0 / n_trainers,
        generator_cpus=1.0 / n_generators,
        trainer_gpus=g / n_trainers,
        generator_gpus=g / n_generators,
    )


@dataclass(frozen=True)
class DevicePlan:
    """Where the actors compute and what their trainers' group runs on (:func:`plan_devices`).

    Attributes:
        requested: ``RayRunConfig.device`` (``auto``, ``cpu``, ``cuda``).
        reserve_gpus: every bundle reserves one GPU (``bundles_for(..., gpus_per_bundle=1.0)``).
        device: the actors' torch device type, ``cuda`` (inside an actor: ``cuda:0``, the bundle's
            GPU, all Ray's ``CUDA_VISIBLE_DEVICES`` shows it) or ``cpu``.
        backend: the trainers' process group: ``nccl`` when each trainer has a GPU of its own, else
            ``gloo`` (on GPUs its collectives go through host memory).
        reason: why, in words.
        cluster_gpus: the GPUs the cluster declares; ``gpus_needed``: one per bundle;
            ``trainers_share_gpu``: the trainers sit in one bundle (split layouts): the inputs an
            actor decides again with the CUDA devices it sees (:meth:`in_actor`).
    """

    requested: str
    reserve_gpus: bool
    device: str
    backend: str
    reason: str
    cluster_gpus: float = 0.0
    gpus_needed: int = 0
    trainers_share_gpu: bool = False

    def in_actor(self, cuda_devices: int) -> DevicePlan:
        """The plan again, in an actor process that sees ``cuda_devices`` CUDA devices."""
        return plan_devices(self.requested, self.cluster_gpus, self.gpus_needed, cuda_devices, self.trainers_share_gpu)


def plan_devices(
    requested: str,
    cluster_gpus: float,
    gpus_needed: int,
    cuda_devices: int | None = None,
    trainers_share_gpu: bool = False,
) -> DevicePlan:
    """CPUs and gloo, or GPUs (one per bundle) and NCCL: the one place the device is decided.

    Args:
        requested: ``cpu``; ``cuda`` (GPUs or an error); ``auto``: GPUs only when the cluster declares
            one per bundle and (``cuda_devices``) this process sees a CUDA device, else CPUs.
        cluster_gpus: the GPUs the Ray cluster declares (``ray.cluster_resources().get("GPU", 0)``).
        gpus_needed: the bundles (one GPU each).
        cuda_devices: the CUDA devices this process sees (``torch.cuda.device_count()`` in an actor);
            ``None`` in the controller, which does not run on the actors' devices: it only decides
            whether the bundles reserve GPUs.
        trainers_share_gpu: the trainers sit in one bundle, so on one GPU: their group stays ``gloo``
            (NCCL refuses two ranks of one communicator on one GPU).

    Raises:
        ValueError: an unknown ``requested``; ``cuda`` on a cluster that declares no GPU or fewer than
            ``gpus_needed``, or in a process that sees no CUDA device (the message says what to do).
    """
    if requested not in DEVICES:
        raise ValueError(f"device={requested!r} is not one of {', '.join(DEVICES)}")
    inputs: dict[str, Any] = {
        "cluster_gpus": float(cluster_gpus),
        "gpus_needed": gpus_needed,
        "trainers_share_gpu": trainers_share_gpu,
    }

    def cpu(reason: str, reserve: bool = False) -> DevicePlan:
        return DevicePlan(requested, reserve, "cpu", "gloo", reason, **inputs)

    if requested == "cpu":
        return cpu("device='cpu': CPUs and gloo")
    enough = cluster_gpus > 0 and cluster_gpus >= gpus_needed
    if requested == "cuda":
        if cluster_gpus <= 0:
            raise ValueError(
                "device='cuda' but the Ray cluster declares no GPU: start Ray with GPUs "
                "(cluster.start_ray(num_gpus=...), or `ray start --num-gpus N` on each node), "
                "or use device='auto' or 'cpu'"
            )
        if not enough:
            raise ValueError(
                f"device='cuda' needs one GPU per bundle, {gpus_needed}, and the Ray cluster declares "
                f"{cluster_gpus:g}: add GPUs, use fewer trainers (colocated: one bundle per trainer), "
                "or use device='auto' or 'cpu'"
            )
        if cuda_devices == 0:
            raise ValueError(
                "device='cuda': Ray granted this actor a GPU but it sees no CUDA device (GPUs declared to Ray "
                "that are not there, or a CPU build of torch): use device='auto' (falls back to CPUs) or 'cpu'"
            )
    elif not enough:
        return cpu(f"device='auto': the cluster declares {cluster_gpus:g} GPU(s), the layout needs {gpus_needed}: CPUs")
    elif cuda_devices == 0:
        return cpu("device='auto': GPUs reserved, but this process sees no CUDA device: CPUs and gloo", reserve=True)
    backend = "gloo" if trainers_share_gpu else "nccl"
    why = "the trainers share one GPU: their group on gloo" if trainers_share_gpu else "one GPU per trainer: NCCL"
    seen = "" if cuda_devices is None else f", {cuda_devices} CUDA device(s) seen"
    return DevicePlan(
        requested,
        True,
        "cuda",
        backend,
        f"device={requested!r}: {cluster_gpus:g} GPU(s) declared{seen}; {why}",
        **inputs,
    )


def pg_strategy(pg: Any, bundle: int) -> Any:
    """Ray's scheduling strategy that puts an actor into ``bundle`` of placement group ``pg``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
