"""Who does what: the roles of the ranks, their process groups, and which trainer gets which group.

torchrun starts ``W`` identical processes; each reads its ``RANK`` and takes its role here::

    rank:   0          1 .. T-1        T .. W-1
    role:   trainer 0  trainers        generators
    group:  |------ trainer group ---|              gradients (all-reduce), metrics
            |-- sync group --|       |---------|    weights (lesson 09's broadcast), rank 0 = source

Trainer rank 0 is global rank 0 *and* rank 0 of the sync group (``new_group`` keeps ranks
in ascending order), the source lesson 09's engine expects.

**Routing.** Groups (one prompt, ``G`` answers) are numbered ``k = 0, 1, ...`` in the order
generators start them; update ``u`` consumes ``k = uB .. (u+1)B - 1`` (lesson 07's rule), and
trainer ``t`` takes the ones with ``T - 1 - ((k - uB) mod T) == t``: a data-parallel shard of
the batch, the same for every run, so the accounting is exact and no trainer waits on
another's groups. Every trainer gets ``floor(B / T)`` or ``ceil(B / T)`` groups, and the
extra ones go to the *last* trainers: trainer 0 also sends the weights and writes the
checkpoints, so it gets the fewest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["trainer", "generator"]


@dataclass(frozen=True)
class Roles:
    """The split of ``world_size`` ranks into ``n_trainers`` trainers (ranks ``0 .. T-1``) and generators."""

    world_size: int
    n_trainers: int

    @property
    def n_generators(self) -> int:
        return self.world_size - self.n_trainers

    @property
    def trainers(self) -> list[int]:
        return list(range(self.n_trainers))

    @property
    def generators(self) -> list[int]:
        return list(range(self.n_trainers, self.world_size))

    @property
    def sync_ranks(self) -> list[int]:
        """The weight-sync group: trainer 0 (the source) and every generator."""
        return [0, *self.generators]

    def role(self, rank: int) -> Role:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside the world of {self.world_size} ranks")
        return "trainer" if rank < self.n_trainers else "generator"

    def trainer_of(self, k: int, groups_per_batch: int) -> int:
        """The trainer rank that consumes group ``k`` (see "Routing")."""
        return self.n_trainers - 1 - (k % groups_per_batch) % self.n_trainers

    def groups_for(self, trainer: int, update: int, groups_per_batch: int) -> list[int]:
        """Group numbers trainer ``trainer`` consumes in update ``update``, ascending."""
        first = update * groups_per_batch
        return [k for k in range(first, first + groups_per_batch) if self.trainer_of(k, groups_per_batch) == trainer]


def assign_roles(world_size: int, n_trainers: int, groups_per_batch: int) -> Roles:
    """The roles of ``world_size`` ranks with ``n_trainers`` trainers; the rest generate.

    Raises:
        ValueError: fewer than 3 ranks, fewer than 2 trainers, no generator left, or fewer
            groups per batch than trainers (a trainer would get no data); the message says
            what to change.
    """
    if world_size < 3:
        raise ValueError(
            f"the capstone needs at least 3 ranks (1 generator + 2 trainers), torchrun started {world_size}: "
            "raise --nproc-per-node (or --nnodes)"
        )
    if n_trainers < 2:
        raise ValueError(f"the capstone needs at least 2 trainer ranks (data parallel), got {n_trainers}")
    if n_trainers > world_size - 1:
        raise ValueError(
            f"{n_trainers} trainers leave no generator in a world of {world_size} ranks: "
            f"use --n-trainers <= {world_size - 1} or start more ranks"
        )
    if groups_per_batch < n_trainers:
        raise ValueError(
            f"--groups-per-batch {groups_per_batch} < {n_trainers} trainers: each trainer needs at least one "
            "group per update; raise --groups-per-batch or lower --n-trainers"
        )
    return Roles(world_size, n_trainers)
