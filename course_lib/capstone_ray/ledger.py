"""The sample ledger: every sample's identity, from admission to the update that consumed it.

Sample ``(k, j)`` is answer ``j`` of group ``k``; group ``k``'s prompt depends only on the run's seed
and ``k`` (``capstone.generator.problem_for``). Two sources are kept apart: what the generators
returned (stamped with generator and incarnation) and what the trainers say they trained on. The
audit compares them: every sample of the first ``n_updates * B`` groups consumed exactly once, each
returned by the generator incarnation it was admitted to, and every group lost with a killed
generator returned later by another incarnation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Death:
    """What a generator's death costs in groups.

    Attributes:
        lost: the groups admitted to it and not returned, ascending.
        lost_entries: ``(k, generator, incarnation it was admitted to)`` per lost group.
        todo: the lost groups first (ascending), then the old re-request queue.
    """

    lost: tuple[int, ...]
    lost_entries: tuple[tuple[int, int, int], ...]
    todo: tuple[int, ...]


def on_generator_death(
    g: int,
    in_flight: Sequence[Collection[int]],
    admitted: Mapping[int, tuple[int, int]],
    todo: Sequence[int],
) -> Death:
    """Generator ``g`` died: which groups are lost and in which order they are asked for again.

    Every group admitted to ``g`` and not yet returned (queued, decoding, or finished but not yet
    returned) is lost: the controller never saw its answers, so none can be counted. Each keeps its
    id (the same prompt) and goes to the front of the queue, ahead of older re-requests.

    Args:
        g: the generator that died.
        in_flight: per generator, the groups admitted to it and not returned.
        admitted: group -> ``(generator, incarnation)`` of its live admission.
        todo: the re-request queue before the death.

    Raises:
        ValueError: ``g`` does not exist, or a group in flight on ``g`` was not admitted to ``g``
            (the ledger is inconsistent).
    """
    if not 0 <= g < len(in_flight):
        raise ValueError(f"generator {g} does not exist: there are {len(in_flight)}")
    lost = tuple(sorted(in_flight[g]))
    entries = []
    for k in lost:
        who = admitted.get(k)
        if who is None or who[0] != g:
            raise ValueError(
                f"group {k} is in flight on generator {g} but admitted to {who}: the ledger is inconsistent"
            )
        entries.append((k, g, who[1]))
    old = tuple(k for k in todo if k not in set(lost))
    return Death(lost=lost, lost_entries=tuple(entries), todo=lost + old)


@dataclass
class Ledger:
    """Sample identities of one run.

    Attributes:
        admitted: group -> ``(generator, incarnation)`` of its live admission.
        returned: group -> ``(generator, incarnation)`` that returned it.
        lost: ``(k, generator, incarnation)`` per group lost with a killed generator.
        consumed: ``(k, j)`` per sample the trainers trained on.
        duplicates: groups returned more than once (must stay 0).
    """

    admitted: dict[int, tuple[int, int]] = field(default_factory=dict)
    returned: dict[int, tuple[int, int]] = field(default_factory=dict)
    lost: list[tuple[int, int, int]] = field(default_factory=list)
    consumed: list[tuple[int, int]] = field(default_factory=list)
    duplicates: int = 0

    def returned_by(self, k: int, who: tuple[int, int]) -> None:
        """Record that generator incarnation ``who`` returned group ``k``.

        Raises:
            AssertionError: ``k`` was not admitted to ``who`` (a dead incarnation's answers, or a
                group given to two generators).
        """
        if k in self.returned:
            self.duplicates += 1
        if self.admitted.get(k) != who:
            raise AssertionError(f"group {k} returned by {who}, admitted to {self.admitted.get(k)}")
        self.returned[k] = who

    def audit(self, n_consumed_groups: int, group_size: int) -> dict[str, Any]:
        """Every sample of groups ``0 .. n_consumed_groups - 1`` consumed exactly once, and more."""
        c = Counter(self.consumed)
        expected = {(k, j) for k in range(n_consumed_groups) for j in range(group_size)}
        twice = sorted(s for s, n in c.items() if n > 1)
        missing = sorted(expected - set(c))
        extra = sorted(set(c) - expected)
        not_returned = sorted({k for k, _ in c} - set(self.returned))
        regenerated = all(k in self.returned and self.returned[k] != (g, inc) for k, g, inc in self.lost)
        leftover = sorted(set(self.returned) - {k for k, _ in c})
        ok = not twice and not missing and not extra and not not_returned and regenerated and not self.duplicates
        return {
            "ok": ok,
            "consumed_samples": len(self.consumed),
            "expected_samples": len(expected),
            "twice": twice[:5],
            "missing": missing[:5],
            "extra": extra[:5],
            "consumed_not_returned": not_returned[:5],
            "lost_groups": len(self.lost),
            "lost_samples": len(self.lost) * group_size,
            "lost_groups_regenerated": regenerated,
            "leftover_groups": len(leftover),
            "duplicate_returns": self.duplicates,
        }
