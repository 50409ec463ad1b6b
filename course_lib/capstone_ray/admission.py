"""Admission: which groups each idle generator may start now, under the lag bound.

The controller calls :func:`admit` before it submits the generators' next decoding calls. It is
lesson 07's rule (``may_start_group``) applied per generator, with *that generator's* weight
version: a generator that has loaded version ``v`` starts group ``k`` only if every update that can
consume ``k`` is at most ``max_lag`` updates newer than ``v``:

    k < (v + max_lag + 1) * B        (B = groups per update)

Group ids are given out in order; re-requested groups (lost with a killed generator, ``todo``) go
first and keep their ids (same prompt), so a sample can never be counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from course_lib.rl.staleness import may_start_group


@dataclass(frozen=True)
class Admission:
    """The outcome of one admission step.

    Attributes:
        groups: generator -> the group ids it starts now, in order (every idle generator that holds
            weights has an entry, possibly empty).
        next_k: the next never-started group id after this step.
        todo: re-requested groups not yet admitted, in order.
    """

    groups: dict[int, list[int]]
    next_k: int
    todo: tuple[int, ...]


def admit(
    next_k: int,
    todo: Sequence[int],
    delivered: Sequence[int],
    holding: Sequence[int],
    idle: Iterable[int],
    *,
    max_lag: int,
    groups_per_batch: int,
    room: int,
    total_groups: int,
) -> Admission:
    """Deal groups one at a time to the idle generator holding the fewest.

    Args:
        next_k: the next group id never started.
        todo: re-requested group ids, dealt before any new one.
        delivered: per generator, the newest weight version it has loaded (``-1``: none yet).
        holding: per generator, the groups admitted to it and not yet returned.
        idle: the generators with no decoding call in flight (the ones that can take groups now).
        max_lag: the most updates a token may lag behind the weights that consume it.
        groups_per_batch: ``B``, groups per update.
        room: the most groups a generator may hold (its slots, plus one queued when asynchronous).
        total_groups: groups the run needs (``n_updates * B``); none beyond is started.

    Returns:
        :class:`Admission`; the inputs are not changed.

    Raises:
        ValueError: a negative ``max_lag``, ``groups_per_batch`` or ``room`` below 1, or an idle
            generator that does not exist.
    """
    if max_lag < 0:
        raise ValueError(f"max_lag={max_lag}: the lag bound counts updates and cannot be negative")
    if groups_per_batch < 1:
        raise ValueError(f"groups_per_batch={groups_per_batch}: an update consumes at least one group")
    if room < 1:
        raise ValueError(f"room={room}: a generator must be able to hold at least one group")
    if len(delivered) != len(holding):
        raise ValueError(f"delivered has {len(delivered)} generators but holding has {len(holding)}")
    candidates = sorted(set(idle))
    for g in candidates:
        if not 0 <= g < len(delivered):
            raise ValueError(f"idle generator {g} does not exist: there are {len(delivered)} (0..{len(delivered) - 1})")
    live = [g for g in candidates if delivered[g] >= 0]  # no weights yet: nothing to decode with
    groups: dict[int, list[int]] = {g: [] for g in live}
    queue = list(todo)
    while live:
        g = min(live, key=lambda h: (holding[h] + len(groups[h]), h))
        if holding[g] + len(groups[g]) >= room:
            break  # the least-loaded generator is full, so all are
        k = queue[0] if queue else next_k
        if k >= total_groups or not may_start_group(k, delivered[g] * groups_per_batch, max_lag, groups_per_batch):
            live.remove(g)  # its weights are too old for k (a newer generator may still take it)
            continue
        if queue:
            queue.pop(0)
        else:
            next_k += 1
        groups[g].append(k)
    return Admission(groups=groups, next_k=next_k, todo=tuple(queue))
