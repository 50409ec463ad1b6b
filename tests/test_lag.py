"""The controlled-lag ablation's ring of policy snapshots (course_lib.pipeline.lag).

The full-scale ablation collapses most seeds at k = 4, more than at k = 64 or 128; this pins
down that the ring is not the cause: at update ``u`` agent ``i`` acts with exactly version
``max(u - k_i, 0)`` (version ``v`` = the weights after ``v`` updates), for every lag at once,
also after the ring has wrapped around many times.
"""

from __future__ import annotations

import torch

from course_lib.pipeline.lag import _PolicyRing, _Population


def test_ring_acts_with_version_u_minus_k_for_every_agent() -> None:
    lags = [0, 1, 4, 16, 64, 128, 4]
    population = _Population(list(range(len(lags))), hidden=4)
    with torch.no_grad():
        for v in population.params.values():
            v.fill_(0.0)  # version 0: every parameter 0
    ring = _PolicyRing(population, torch.tensor(lags))
    for update in range(400):  # > 3 wraps of the largest ring (129 slots)
        behaviour = ring.behaviour(update)
        for i, k in enumerate(lags):
            want = float(max(update - k, 0))
            for name, value in behaviour.items():
                assert torch.all(value[i] == want), (update, k, name, value[i].flatten()[:3])
        with torch.no_grad():  # the "update": version update + 1 has every parameter = update + 1
            for v in population.params.values():
                v.fill_(float(update + 1))
        ring.record(update, population)


def test_ring_hands_each_agent_its_own_weights() -> None:
    lags = [2, 2, 0]
    population = _Population([0, 1, 2], hidden=4)
    ring = _PolicyRing(population, torch.tensor(lags))
    first = {k: v.detach().clone() for k, v in population.params.items()}
    behaviour = ring.behaviour(0)
    for name, value in behaviour.items():
        torch.testing.assert_close(value, first[f"policy.{name}"])
    assert not torch.equal(behaviour["0.weight"][0], behaviour["0.weight"][1])  # seeds 0 and 1 differ
