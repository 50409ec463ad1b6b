"""Layouts as placement groups: which bundle each actor lands in, and its share of it.

A Ray placement group reserves *bundles* of resources (here ``{"CPU": 1.0}``: one core each) and
actors are scheduled into a named bundle. Lesson 08's layouts become bundle assignments:

    sync_colocated   bundle r = {trainer r, its generators}   the phases alternate on every core
    sync_split       bundle 0 = {trainers}, bundle 1 = {generators}   lag 0: one side waits
    pipeline         the same bundles as sync_split; generators decode while trainers train

Ray's ``num_cpus`` is bookkeeping: it keeps the bundle from being over-subscribed but pins nothing, so
each actor also pins itself to the core numbered by its bundle (``workers._setup_process``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

LAYOUTS: tuple[str, ...] = ("sync_colocated", "sync_split", "pipeline")


@dataclass(frozen=True)
class Placement:
    """Where every actor of a layout goes.

    Attributes:
        layout: lesson 08's name of the layout.
        bundles: one resource dict per bundle (``{"CPU": 1.0}``).
        trainer_bundle: bundle index of trainer ``r``.
        generator_bundle: bundle index of generator ``i``.
        trainer_cpus: each trainer's ``num_cpus`` (its share of its bundle).
        generator_cpus: each generator's ``num_cpus``.
        strategy: the placement group's strategy (one node here: ``PACK``).
    """

    layout: str
    bundles: tuple[dict[str, float], ...]
    trainer_bundle: tuple[int, ...]
    generator_bundle: tuple[int, ...]
    trainer_cpus: float
    generator_cpus: float
    strategy: str = "PACK"

    def load(self) -> list[float]:
        """The CPUs claimed in each bundle (equal to each bundle's CPU in every layout)."""
        used = [0.0] * len(self.bundles)
        for b in self.trainer_bundle:
            used[b] += self.trainer_cpus
        for b in self.generator_bundle:
            used[b] += self.generator_cpus
        return used


def bundles_for(layout: str, n_trainers: int = 2, n_generators: int = 2) -> Placement:
    """The placement of ``n_trainers`` trainers and ``n_generators`` generators for ``layout``.

    ``sync_colocated``: ``n_trainers`` one-core bundles; trainer ``r`` in bundle ``r`` with 0.5 CPU;
    generator ``i`` in bundle ``i % n_trainers``, the generators of a bundle sharing its other 0.5.
    ``sync_split`` and ``pipeline``: two one-core bundles, the trainers in bundle 0 and the generators
    in bundle 1, each side splitting its core evenly.

    Raises:
        ValueError: an unknown layout, fewer than one actor of a role, or a colocated layout whose
            generators cannot be spread evenly over the trainers' bundles.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    if n_trainers < 1:
        raise ValueError(f"n_trainers={n_trainers}: a layout needs at least one trainer")
    if n_generators < 1:
        raise ValueError(f"n_generators={n_generators}: a layout needs at least one generator")
    one = {"CPU": 1.0}
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
        )
    return Placement(
        layout=layout,
        bundles=(dict(one), dict(one)),
        trainer_bundle=(0,) * n_trainers,
        generator_bundle=(1,) * n_generators,
        trainer_cpus=1.0 / n_trainers,
        generator_cpus=1.0 / n_generators,
    )


def pg_strategy(pg: Any, bundle: int) -> Any:
    """Ray's scheduling strategy that puts an actor into ``bundle`` of placement group ``pg``."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle)
