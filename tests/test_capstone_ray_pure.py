"""The Ray controller's three pure decisions (`course_lib.capstone_ray`: `placement.bundles_for`,
`admission.admit`, `ledger.on_generator_death`) and the `Ledger` audit, without Ray.

Placement: every layout fills each one-core bundle exactly, puts each actor where lesson 08's
layout says, and refuses bad arguments naming them. Admission: the statement's worked step;
properties of every step on random states (only idle generators with weights, room, the lag bound
with each generator's own version, todo first, nothing left that could still start, the inputs
unchanged); and whole runs of a small controller simulated here (weight versions reaching the
generators late and in random order, decoding calls returning random subsets, generators killed
and restarted): every admitted group satisfies ``k < (delivered[g] + max_lag + 1) * B`` when it is
admitted and lags at most ``max_lag`` updates when trained on, every group of the run is admitted
exactly once (once more per loss when generators are killed), and the ledger's audit balances.
Death: the order of the lost groups and of the new queue, the entries' incarnations, returned
groups left alone, the errors.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from collections import Counter
from typing import Any

import pytest

from course_lib.capstone_ray.admission import Admission, admit
from course_lib.capstone_ray.ledger import Death, Ledger, on_generator_death
from course_lib.capstone_ray.placement import LAYOUTS, Placement, bundles_for
from course_lib.capstone_ray.report import layout_check, occupancy, phase_costs, predict_layouts, window

# ---------------------------------------------------------------------------------------
# bundles_for
# ---------------------------------------------------------------------------------------

SIZES = [
    (layout, n_trainers, n_generators)
    for layout in LAYOUTS
    for n_trainers in range(1, 7)
    for n_generators in range(1, 13)
    if layout != "sync_colocated" or n_generators % n_trainers == 0
]


@pytest.mark.parametrize(("layout", "n_trainers", "n_generators"), SIZES)
def test_every_bundle_is_one_core_filled_exactly(layout, n_trainers, n_generators):
    p = bundles_for(layout, n_trainers, n_generators)
    assert isinstance(p, Placement) and p.layout == layout and p.strategy == "PACK"
    assert all(b == {"CPU": 1.0} for b in p.bundles)
    assert len(p.trainer_bundle) == n_trainers and len(p.generator_bundle) == n_generators
    assert all(0 <= b < len(p.bundles) for b in (*p.trainer_bundle, *p.generator_bundle))
    used = [0.0] * len(p.bundles)
    for b in p.trainer_bundle:
        used[b] += p.trainer_cpus
    for b in p.generator_bundle:
        used[b] += p.generator_cpus
    assert all(math.isclose(u, 1.0, rel_tol=1e-12) for u in used), used
    assert p.load() == pytest.approx(used, rel=1e-12)
    assert p.trainer_cpus > 0 and p.generator_cpus > 0


@pytest.mark.parametrize(("n_trainers", "n_generators"), [(1, 1), (1, 3), (2, 2), (2, 4), (3, 6), (4, 4)])
def test_colocated_puts_each_generator_beside_its_trainer(n_trainers, n_generators):
    p = bundles_for("sync_colocated", n_trainers, n_generators)
    assert len(p.bundles) == n_trainers and p.trainer_bundle == tuple(range(n_trainers))
    for i, b in enumerate(p.generator_bundle):
        assert b == p.trainer_bundle[i % n_trainers]  # generator i beside trainer i % n_trainers
    assert Counter(p.generator_bundle) == dict.fromkeys(range(n_trainers), n_generators // n_trainers)
    assert p.trainer_cpus == 0.5 and p.generator_cpus * (n_generators // n_trainers) == pytest.approx(0.5)


@pytest.mark.parametrize(("n_trainers", "n_generators"), [(1, 1), (2, 2), (2, 3), (3, 1), (1, 5)])
def test_split_and_pipeline_are_placed_alike_trainers_then_generators(n_trainers, n_generators):
    split, pipe = bundles_for("sync_split", n_trainers, n_generators), bundles_for("pipeline", n_trainers, n_generators)
    assert dataclasses.replace(split, layout="pipeline") == pipe
    assert len(split.bundles) == 2
    assert set(split.trainer_bundle) == {0} and set(split.generator_bundle) == {1}
    assert split.trainer_cpus == pytest.approx(1 / n_trainers) and split.generator_cpus == pytest.approx(
        1 / n_generators
    )


def test_the_defaults_are_two_and_two_and_the_placement_is_frozen_with_fresh_bundles():
    p = bundles_for("sync_colocated")
    assert (p.trainer_bundle, p.generator_bundle, p.trainer_cpus, p.generator_cpus) == ((0, 1), (0, 1), 0.5, 0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.trainer_cpus = 1.0
    p.bundles[0]["CPU"] = 9.0  # a caller changing its copy changes no other bundle, no later call
    assert p.bundles[1] == {"CPU": 1.0} and bundles_for("sync_colocated").bundles[0] == {"CPU": 1.0}


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("colocated", 2, 2), r"layout='colocated' is not one of sync_colocated, sync_split, pipeline"),
        (("", 2, 2), r"layout='' is not one of"),
        (("sync_split", 0, 2), r"n_trainers=0"),
        (("pipeline", -1, 2), r"n_trainers=-1"),
        (("pipeline", 2, 0), r"n_generators=0"),
        (("sync_colocated", 2, 3), r"n_generators=3 is not a multiple of n_trainers=2"),
        (("sync_colocated", 4, 2), r"n_generators=2 is not a multiple of n_trainers=4"),
    ],
)
def test_bad_placements_raise_naming_the_argument(args, pattern):
    with pytest.raises(ValueError, match=pattern):
        bundles_for(*args)


# ---------------------------------------------------------------------------------------
# admit: single steps
# ---------------------------------------------------------------------------------------


def _step(next_k, todo, delivered, holding, idle, max_lag=1, B=2, room=3, total=20) -> Admission:
    return admit(
        next_k, todo, delivered, holding, idle, max_lag=max_lag, groups_per_batch=B, room=room, total_groups=total
    )


def test_the_statements_worked_step():
    """todo first, the fewest held, a tie to the lowest index, generator 1 too old for 7,
    generator 0 up to room, generator 2 without weights left out."""
    out = _step(6, [3], [2, 1, -1], [1, 0, 0], [0, 1, 2])
    assert out == Admission(groups={0: [6, 7], 1: [3]}, next_k=8, todo=())


def test_a_generator_with_old_weights_does_not_stop_one_with_newer_weights():
    # generator 0 (version 0, bound 2) is the least loaded but cannot take 4; generator 1 (version 2) can
    out = _step(4, [], [0, 2], [0, 1], [0, 1], max_lag=0)
    assert out.groups == {0: [], 1: [4, 5]} and out.next_k == 6


def test_ties_go_to_the_lowest_index_whatever_the_order_of_idle():
    for idle in ([0, 1, 2], [2, 1, 0], (1, 2, 0), {2, 0, 1}, [0, 0, 1, 2, 2]):
        out = _step(0, [], [0, 0, 0], [0, 0, 0], idle, max_lag=2, room=1)
        assert out.groups == {0: [0], 1: [1], 2: [2]}, idle


def test_a_re_requested_group_no_one_may_take_waits_and_blocks_new_ones():
    out = _step(8, [7], [1, 4], [0, 0], [0], max_lag=0)
    assert out == Admission(groups={0: []}, next_k=8, todo=(7,))


def test_nothing_starts_at_or_beyond_total_groups():
    out = _step(10, [], [5, 5], [0, 0], [0, 1], total=12)
    assert out.groups == {0: [10], 1: [11]} and out.next_k == 12


def test_no_idle_generator_or_none_with_weights_admits_nothing():
    assert _step(3, [1], [2, 2], [0, 0], []) == Admission(groups={}, next_k=3, todo=(1,))
    assert _step(3, [1], [-1, -1], [0, 0], [0, 1]) == Admission(groups={}, next_k=3, todo=(1,))


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        (dict(max_lag=-1), r"max_lag=-1"),
        (dict(B=0), r"groups_per_batch=0"),
        (dict(room=0), r"room=0"),
        (dict(idle=[0, 2]), r"idle generator 2 does not exist"),
        (dict(idle=[-1]), r"idle generator -1 does not exist"),
        (dict(holding=[0]), r"delivered has 2 generators but holding has 1"),
    ],
)
def test_bad_admissions_raise_naming_the_argument(kwargs, pattern):
    args: dict[str, Any] = dict(next_k=0, todo=[], delivered=[0, 0], holding=[0, 0], idle=[0, 1]) | kwargs
    with pytest.raises(ValueError, match=pattern):
        _step(**args)


def _random_state(rng: random.Random) -> dict[str, Any]:
    n = rng.randint(1, 5)
    B, max_lag, room = rng.randint(1, 4), rng.randint(0, 3), rng.randint(1, 5)
    top = rng.randint(0, 8)
    next_k = rng.randint(max(0, top - 1) * B, (top + max_lag + 1) * B + 2)
    older = range(max(0, next_k - 5 * B), next_k)
    return dict(
        next_k=next_k,
        todo=sorted(rng.sample(list(older), min(len(older), rng.randint(0, 3)))),
        delivered=[rng.choice([-1, *range(max(0, top - 3), top + 1)]) for _ in range(n)],
        holding=[rng.randint(0, room) for _ in range(n)],
        idle=[g for g in range(n) if rng.random() < 0.7],
        max_lag=max_lag,
        B=B,
        room=room,
        total=next_k + rng.choice([0, 1, 3, 5 * B, 100]),
    )


def test_every_step_keeps_the_rules_and_leaves_nothing_that_could_start():
    rng = random.Random(35)
    for _ in range(3000):
        s = _random_state(rng)
        given = copy.deepcopy(s)
        out = _step(**s)
        assert s == given  # the inputs are not changed
        B, max_lag, room = s["B"], s["max_lag"], s["room"]
        live = {g for g in s["idle"] if s["delivered"][g] >= 0}
        assert set(out.groups) == live  # an entry (maybe empty) per idle generator with weights
        taken = len(s["todo"]) - len(out.todo)
        assert list(out.todo) == s["todo"][taken:]  # todo is taken from the front, in order
        started = [k for ks in out.groups.values() for k in ks]
        assert sorted(started) == sorted(s["todo"][:taken] + list(range(s["next_k"], out.next_k)))
        if out.next_k > s["next_k"]:
            assert taken == len(s["todo"])  # a new group only once todo is empty
        for g, ks in out.groups.items():
            assert s["holding"][g] + len(ks) <= room
            for k in ks:
                assert k < s["total"] and k < (s["delivered"][g] + max_lag + 1) * B
        # maximal: every live generator is full, or cannot take the next candidate (with todo
        # ascending the candidates only grow, so a generator dropped for one cannot take a later one)
        candidate = out.todo[0] if out.todo else out.next_k
        for g in live:
            full = s["holding"][g] + len(out.groups[g]) >= room
            too_old = candidate >= (s["delivered"][g] + max_lag + 1) * B or candidate >= s["total"]
            assert full or too_old, (s, out)


def test_a_generator_dropped_for_a_newer_re_request_waits_behind_it():
    """After two deaths close together the queue is not ascending (the later losses first: 8, 9
    ahead of 4, 5). A generator too old for the head is dropped for the call even though it could
    take the older re-requests behind it (as the spec says); it waits until the head is taken or
    its weights are new enough. Only a delay: every queued group was admissible once, at a
    version every live generator eventually receives."""
    out = _step(12, [8, 9, 4, 5], [2, 4], [0, 2], [0, 1], max_lag=0, room=3)
    assert out == Admission(groups={0: [], 1: [8]}, next_k=12, todo=(9, 4, 5))
    assert _step(12, list(out.todo), [2, 4], [0, 3], [0], max_lag=0, room=3).groups == {0: []}
    newer = _step(12, list(out.todo), [4, 4], [0, 3], [0], max_lag=0, room=3)
    assert newer.groups == {0: [9, 4, 5]}


def test_the_deal_goes_to_the_fewest_held():
    """With equal versions and room to spare, the loads after a step differ by at most one among
    the generators that took a group, and a generator that took one held no more than one that did not."""
    rng = random.Random(7)
    for _ in range(500):
        n = rng.randint(2, 5)
        holding = [rng.randint(0, 3) for _ in range(n)]
        out = _step(
            0, [], [9] * n, holding, range(n), max_lag=0, B=rng.randint(1, 12), room=6, total=rng.randint(1, 12)
        )
        loads = [holding[g] + len(out.groups[g]) for g in range(n)]
        takers = [g for g in range(n) if out.groups[g]]
        for g in takers:
            # g's last group went to it while it held the fewest: loads[g] - 1 <= every load then
            assert all(loads[g] - 1 <= loads[h] for h in range(n)), (holding, out)


# ---------------------------------------------------------------------------------------
# admit and on_generator_death in whole simulated runs
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    ledger: Ledger
    admissions: Counter[int]
    updates: int
    total: int
    kills: int
    spread: int  # the most two idle generators' versions differed at an admission


def simulate(seed: int, *, n_gen: int, max_lag: int, B: int, room: int, n_updates: int, kills: int) -> Run:
    """A controller driving ``n_gen`` generators with the library's admit and on_generator_death:
    one random event at a time (a decoding call returns a random subset of what its generator holds,
    a weight version reaches one generator, the trainer trains a complete batch, a busy generator is
    killed, a dead one restarts); asserts the lag bound at every admission and at every update."""
    rng = random.Random(seed)
    total, group_size = n_updates * B, 2
    delivered, inc = [-1] * n_gen, [0] * n_gen
    alive, busy = [True] * n_gen, [False] * n_gen
    in_flight: list[set[int]] = [set() for _ in range(n_gen)]
    transfers = [(g, 0, 0) for g in range(n_gen)]
    ledger, admissions = Ledger(), Counter[int]()
    start_version: dict[int, int] = {}
    todo: list[int] = []
    next_k = u = spread = 0
    kills_left = kills
    for _ in range(20_000):
        idle = [g for g in range(n_gen) if alive[g] and not busy[g]]
        rng.shuffle(idle)
        versions = [delivered[g] for g in idle if delivered[g] >= 0]
        spread = max(spread, max(versions) - min(versions)) if versions else spread
        step = admit(
            next_k,
            todo,
            delivered,
            [len(s) for s in in_flight],
            idle,
            max_lag=max_lag,
            groups_per_batch=B,
            room=room,
            total_groups=total,
        )
        for g, ks in step.groups.items():
            assert g in idle and delivered[g] >= 0 and len(in_flight[g]) + len(ks) <= room
            for k in ks:
                assert k < (delivered[g] + max_lag + 1) * B, (k, g, delivered[g])
                admissions[k] += 1
                ledger.admitted[k] = (g, inc[g])
                start_version[k] = delivered[g]
                in_flight[g].add(k)
        for g in idle:
            busy[g] = busy[g] or bool(in_flight[g])
        next_k, todo = step.next_k, list(step.todo)
        if u == n_updates:
            break
        events: list[tuple[str, int]] = [("return", g) for g in range(n_gen) if busy[g]]
        events += [("transfer", i) for i in range(len(transfers))]
        events += [("restart", g) for g in range(n_gen) if not alive[g]]
        if all(k in ledger.returned for k in range(u * B, (u + 1) * B)):
            events.append(("train", u))
        victims = [g for g in range(n_gen) if busy[g]]
        if kills_left and victims and rng.random() < 0.1:
            events = [("kill", rng.choice(victims))]
        kind, x = rng.choice(events)
        if kind == "return":
            for k in sorted(in_flight[x]):
                if rng.random() < 0.4:
                    ledger.returned_by(k, (x, inc[x]))
                    in_flight[x].discard(k)
            busy[x] = False
        elif kind == "transfer":
            g, v, i = transfers.pop(x)
            if alive[g] and inc[g] == i:
                delivered[g] = max(delivered[g], v)
        elif kind == "train":
            batch = range(u * B, (u + 1) * B)
            assert all(u - start_version[k] <= max_lag for k in batch)  # the lag bound, as the trainers check it
            ledger.consumed += [(k, j) for k in batch for j in range(group_size)]
            u += 1
            transfers += [(g, u, inc[g]) for g in range(n_gen) if alive[g]]
        elif kind == "kill":
            kills_left -= 1
            death = on_generator_death(x, in_flight, ledger.admitted, todo)
            assert set(death.lost) == in_flight[x]
            for k in death.lost:
                del ledger.admitted[k]
            ledger.lost += death.lost_entries
            in_flight[x].clear()
            todo = list(death.todo)
            alive[x], busy[x], delivered[x] = False, False, -1
        else:  # restart: the next incarnation, the current version on its way
            alive[x], inc[x] = True, inc[x] + 1
            transfers.append((x, u, inc[x]))
    return Run(ledger, admissions, u, total, kills - kills_left, spread)


CONFIGS = [
    dict(n_gen=1, max_lag=0, B=1, room=1),
    dict(n_gen=2, max_lag=0, B=2, room=2),
    dict(n_gen=2, max_lag=1, B=2, room=3),
    dict(n_gen=3, max_lag=2, B=3, room=4),
    dict(n_gen=4, max_lag=4, B=2, room=2),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_runs_without_kills_admit_every_group_once_within_the_lag(config):
    for seed in range(15):
        run = simulate(seed, n_updates=8, kills=0, **config)
        assert run.updates == 8
        assert run.admissions == dict.fromkeys(range(run.total), 1)  # every k in [0, total) exactly once
        report = run.ledger.audit(run.total, 2)
        assert report["ok"] and report["lost_groups"] == 0, report


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_runs_with_kills_regenerate_every_lost_group_and_the_audit_balances(config):
    kills = lost = 0
    for seed in range(15):
        run = simulate(seed, n_updates=8, kills=3, **config)
        assert run.updates == 8
        losses = Counter(k for k, _, _ in run.ledger.lost)
        assert run.admissions == {k: 1 + losses[k] for k in range(run.total)}  # once, plus once per loss
        report = run.ledger.audit(run.total, 2)
        assert report["ok"] and report["lost_groups_regenerated"], report
        assert report["consumed_samples"] == report["expected_samples"] == 2 * run.total
        kills, lost = kills + run.kills, lost + len(run.ledger.lost)
    assert kills >= 10 and lost >= 10  # the runs did kill generators holding groups


def test_the_simulated_generators_hold_different_versions():
    """What makes 'each generator's own version' matter: at some admission two idle generators'
    versions differ by two or more."""
    assert any(simulate(s, n_updates=8, kills=2, **CONFIGS[3]).spread >= 2 for s in range(10))


# ---------------------------------------------------------------------------------------
# on_generator_death and the ledger
# ---------------------------------------------------------------------------------------


def test_a_death_loses_what_is_in_flight_ascending_ahead_of_the_old_queue():
    in_flight = [{4}, {17, 10, 3}]  # iterates 17, 10, 3: the answer must sort
    admitted = {1: (1, 0), 3: (1, 2), 4: (0, 0), 8: (1, 1), 10: (1, 2), 17: (1, 2)}
    before = copy.deepcopy((in_flight, admitted))
    out = on_generator_death(1, in_flight, admitted, (9, 5))
    assert out == Death(lost=(3, 10, 17), lost_entries=((3, 1, 2), (10, 1, 2), (17, 1, 2)), todo=(3, 10, 17, 9, 5))
    assert (in_flight, admitted) == before  # the controller removes them afterwards
    assert 1 not in out.lost and 8 not in out.lost  # admitted to generator 1 and returned: not lost


def test_a_death_with_nothing_in_flight_changes_nothing():
    assert on_generator_death(0, [set(), {2}], {2: (1, 0)}, [5, 1]) == Death((), (), (5, 1))


def test_a_lost_group_already_waiting_in_todo_is_not_queued_twice():
    out = on_generator_death(0, [[6, 2]], {2: (0, 0), 6: (0, 0)}, [2, 9])
    assert out.todo == (2, 6, 9)


@pytest.mark.parametrize(
    ("g", "in_flight", "admitted", "pattern"),
    [
        (2, [set(), set()], {}, r"generator 2 does not exist: there are 2"),
        (-1, [set(), set()], {}, r"generator -1 does not exist"),
        (1, [set(), {5, 6}], {5: (1, 0), 6: (0, 0)}, r"group 6 is in flight on generator 1 but admitted to \(0, 0\)"),
        (1, [set(), {5, 6}], {5: (1, 0)}, r"group 6 is in flight on generator 1 but admitted to None: the ledger is"),
    ],
)
def test_bad_deaths_raise(g, in_flight, admitted, pattern):
    with pytest.raises(ValueError, match=pattern):
        on_generator_death(g, in_flight, admitted, [])


def test_the_ledger_refuses_answers_from_an_incarnation_a_group_was_not_admitted_to():
    ledger = Ledger(admitted={3: (1, 1)})
    with pytest.raises(AssertionError, match=r"group 3 returned by \(1, 0\), admitted to \(1, 1\)"):
        ledger.returned_by(3, (1, 0))  # the dead incarnation's answer
    with pytest.raises(AssertionError, match="admitted to None"):
        ledger.returned_by(4, (0, 0))
    ledger.returned_by(3, (1, 1))
    ledger.returned_by(3, (1, 1))
    assert ledger.duplicates == 1


def test_the_audit_names_a_sample_counted_twice_or_missing():
    run = simulate(3, n_updates=4, kills=2, **CONFIGS[2])
    assert run.ledger.audit(run.total, 2)["ok"]
    twice = dataclasses.replace(run.ledger, consumed=[*run.ledger.consumed, run.ledger.consumed[0]])
    report = twice.audit(run.total, 2)
    assert not report["ok"] and report["twice"] == [run.ledger.consumed[0]]
    missing = dataclasses.replace(run.ledger, consumed=run.ledger.consumed[1:])
    report = missing.audit(run.total, 2)
    assert not report["ok"] and report["missing"] == [run.ledger.consumed[0]]
    if run.ledger.lost:  # a lost group "returned" by the incarnation that lost it: not regenerated
        k, g, i = run.ledger.lost[0]
        stale = dataclasses.replace(run.ledger, returned={**run.ledger.returned, k: (g, i)})
        assert not stale.audit(run.total, 2)["lost_groups_regenerated"]


def test_outcome_reads_rays_errors_as_ray_documents_them():
    """``ActorDiedError`` is "died" (a death for a decoding call or a transfer; only for a probe, sent
    after the death, no restart left), any other ``RayActorError`` (that is ``ActorUnavailableError``:
    restarting, or cut off) and a call declined by a new process are "down", a method's own exception
    is a broken transfer, and a wait past its bound is let out as a ``TimeoutError``. Ray's real
    exception classes, raised by a stand-in ``ray.get``."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError, RayTaskError

    from course_lib.capstone_ray.split_loop import outcome

    class StandIn:
        def __init__(self, result: Any) -> None:
            self.result = result
            self.timeouts: list[float | None] = []

        def get(self, f: Any, timeout: float | None = None) -> Any:
            self.timeouts.append(timeout)
            if isinstance(self.result, BaseException):
                raise self.result
            return self.result

    assert outcome(StandIn({"groups": [3]}), 1) == ("ok", {"groups": [3]})
    assert outcome(StandIn(ActorDiedError()), 1) == ("died", None)
    assert outcome(StandIn(ActorUnavailableError("restarting", None)), 1) == ("down", None)
    assert outcome(StandIn({"restarted": 1, "incarnation": 2, "expected": 1}), 1) == ("down", None)
    kind, why = outcome(StandIn(RayTaskError("receive_weights", "tb", TimeoutError("gloo timed out"))), 1)
    assert kind == "broken" and why
    ray = StandIn(GetTimeoutError("not yet"))
    with pytest.raises(TimeoutError):
        outcome(ray, 1, timeout=2.5)
    assert ray.timeouts == [2.5]


def _report(rows: list[tuple[float, float, int]], lag_hist: list[int] | None = None, bound: int = 0) -> dict[str, Any]:
    """A run report's metrics from (started, ended, tokens) per update."""
    hist = lag_hist or [1]
    metrics = [{"started": a, "time": b, "tokens": n, "lag_hist": hist} for a, b, n in rows]
    return {"metrics": metrics, "lag_bound": bound}


def test_the_window_splits_each_update_into_the_trainers_side_and_the_rest():
    rep = _report([(0.0, 0.02, 100), (0.05, 0.07, 200), (0.10, 0.12, 300)])
    w = window(rep, 3)
    assert math.isclose(w["updates_per_s"], 3 / 0.12) and w["tokens"] == 200
    assert math.isclose(w["train_ms"], 20.0) and math.isclose(w["between_ms"], 30.0)
    assert math.isclose(w["waiting"], 0.06 / 0.12)
    with pytest.raises(ValueError, match="logged 3"):
        window(rep, 4)


def test_the_layout_predictions_follow_12_2_and_move_with_the_answers():
    costs = {k: {"median_ms": v, "per_token_ms": c, "tokens": 100.0}
             for k, v, c in (("generate", 30.0, 0.2), ("handover", 5.0, 0.0), ("train", 15.0, 0.05), ("sync", 6.0, 0.0))}  # fmt: skip
    p = predict_layouts(costs, 100.0)
    assert p["sync_split"] == {"train": 30.0, "other": 66.0, "update": 96.0}
    assert p["pipeline"] == {"train": 36.0, "other": 60.0, "update": 60.0}
    q = predict_layouts(costs, 200.0)  # 100 tokens more: generation +20 ms, training +5 ms, each x2 on one core
    assert math.isclose(q["pipeline"]["train"], 46.0) and math.isclose(q["sync_split"]["update"], 146.0)


def test_phase_costs_fit_generation_and_training_per_token_only():
    rows = [{"tokens": n, "phase_generate": (10 + 0.2 * n) / 1e3, "phase_train": (15 + 0.05 * n) / 1e3,
             "phase_handover": (5 + 0.1 * n) / 1e3, "phase_sync": 0.006} for n in (100, 150, 200, 250)]  # fmt: skip
    c = phase_costs({"metrics": rows}, 4)
    assert math.isclose(c["generate"]["per_token_ms"], 0.2) and math.isclose(c["train"]["per_token_ms"], 0.05)
    assert c["handover"]["per_token_ms"] == 0.0 and c["sync"]["per_token_ms"] == 0.0  # they move no answer
    assert math.isclose(c["train"]["median_ms"], 15 + 0.05 * 175) and c["train"]["tokens"] == 175.0


def test_the_layout_check_compares_each_layout_with_its_own_prediction():
    ph = {"phase_generate": 30.0, "phase_handover": 5.0, "phase_train": 15.0, "phase_sync": 6.0}
    colo = _report([(0.056 * i + 0.035, 0.056 * (i + 1), 100) for i in range(4)])
    for m in colo["metrics"]:
        m |= {k: v / 1e3 for k, v in ph.items()}
    split = _report([(0.096 * i + 0.066, 0.096 * (i + 1), 100) for i in range(4)])
    pipe = _report([(0.036 * i, 0.036 * (i + 1), 100) for i in range(4)], lag_hist=[1, 0, 1, 2, 4], bound=4)
    c = layout_check(colo, split, pipe, 4)
    assert c["same_tokens"] and math.isclose(c["pipeline_at_bound"], 0.75)
    assert math.isclose(c["ratio"]["sync_split"], 4 / (3 * 0.096 + 0.030) * 0.096)  # from the first start
    assert math.isclose(c["window"]["pipeline"]["updates_per_s"] * c["predicted_ms"]["pipeline"]["train"] / 1e3, 1.0)
    assert c["window"]["pipeline"]["waiting"] == 0.0
    assert not layout_check(colo, _report([(0, 1, 100), (1, 2, 100), (2, 3, 100), (3, 4, 99)]), pipe, 4)["same_tokens"]


def test_occupancy_weights_generators_by_steps_and_moves_the_pipelines_generators_side():
    gens = [{"steps": 100, "occupancy": 0.4}, {"steps": 300, "occupancy": 0.8}, {"unavailable": "ActorDiedError"}]
    assert math.isclose(occupancy({"generators": gens}), (40 + 240) / 400)
    assert occupancy({"generators": []}) is None
    window = {
        "config": {"n_slots": 4},
        "metrics": [{"gen_steps": 10, "gen_slot_steps": 20}, {"gen_steps": 30, "gen_slot_steps": 90}],
    }
    assert occupancy(window, 1) == 0.5 and occupancy(window, 2) == 0.75  # from the start to the end of update n-1
    ph = {"phase_generate": 30.0, "phase_handover": 5.0, "phase_train": 15.0, "phase_sync": 6.0}
    colo = _report([(0.056 * i + 0.035, 0.056 * (i + 1), 100) for i in range(4)])
    for m in colo["metrics"]:
        m |= {k: v / 1e3 for k, v in ph.items()}
    colo["generators"] = [{"steps": 10, "occupancy": 0.4}]
    split = _report([(0.096 * i + 0.066, 0.096 * (i + 1), 100) for i in range(4)])
    pipe = _report([(0.04 * i, 0.04 * (i + 1), 100) for i in range(4)], lag_hist=[0, 0, 0, 1, 1], bound=4)
    pipe["generators"] = [{"steps": 10, "occupancy": 0.6}]
    c = layout_check(colo, split, pipe, 4)
    p = c["predicted_ms"]["pipeline"]
    assert math.isclose(p["other_at_occupancy"], 60.0 * 0.4 / 0.6) and p["update_at_occupancy"] == 40.0
    assert math.isclose(c["ratio"]["pipeline"], 1.0)  # 25 updates/s against max(36, 40) ms
