"""Lesson 12's graders: the solutions pass, the stubs are "not implemented yet", every planted
bug is rejected with its message (here, and in tests/test_exercises.py once the lesson's source
exists); the graders' oracles agree with the library's reference functions
(`course_lib.capstone_ray`: `bundles_for`, `admit`, `on_generator_death`) and with hand-made
cases; the controller simulation runs clean with the references, covers what the checks rely on
(kills, re-requested groups, generators on different versions) and catches an admission against
the newest version by the lag bound alone; an answer that imports the library's answer is refused
however it imports it, the result types are allowed; bad submissions get a report, never a crash;
one planted bug per exercise is caught end to end through `course grade`, and the committed
notebooks grade 100% and 0% through it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grading_helpers as gh
import grading_outcomes as go
import pytest
from conftest import solution_function
from mutants.l12_capstone_ray import MUTANTS

from course_lib.capstone_ray.admission import Admission, admit
from course_lib.capstone_ray.ledger import Death, on_generator_death
from course_lib.capstone_ray.placement import LAYOUTS, Placement, bundles_for
from course_lib.course.catalog import get_lesson
from course_lib.course.grading.checks import MAX_MESSAGE_CHARS, NOT_IMPLEMENTED, run_exercise
from course_lib.course.grading.lessons import get_exercise
from course_lib.course.grading.lessons import l12_capstone_ray as l12
from course_lib.course.paths import repo_root

LESSON = "12_capstone_ray"
NAMES = ("bundles_for", "admit", "on_generator_death", "on_ready")

pytestmark = pytest.mark.timeout(180)


def test_registry_lists_the_four_exercises():
    gh.assert_registry(LESSON, NAMES, ("12", "capstone_ray"), points=65)


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_and_stub_is_not_implemented(name):
    go.assert_solution_full_and_stub_not_implemented(LESSON, name)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_every_planted_bug_is_caught_with_its_message(mutant):
    """Also in tests/test_exercises.py once lessons/12_capstone_ray.py exists; here so that it runs before."""
    from conftest import mutant_function

    outcome = run_exercise(get_exercise(LESSON, mutant.function), mutant_function(LESSON, mutant))
    assert not outcome.passed
    assert mutant.expected in outcome.message, outcome.message
    assert NOT_IMPLEMENTED not in outcome.message
    failed = next(r for r in outcome.results if not r.passed)
    assert len(failed.message) < MAX_MESSAGE_CHARS, failed.message  # whole, not cut at the limit


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "bundles_for-trainers_generators_swapped",
        "bundles_for-shares_do_not_sum_to_the_bundle",
        "bundles_for-colocated_generators_all_in_bundle_0",
        "admit-global_version",
        "admit-ignores_todo",
        "admit-round_robin",
        "admit-lag_bound_off_by_one",
        "admit-mutates_todo",
        "on_generator_death-forgets_queued_groups",
        "on_generator_death-lost_at_the_back_of_todo",
        "on_generator_death-rerequests_returned_groups",
        "on_generator_death-no_ledger_check",
        "admit-deals_todo_smallest_first",
        "admit-returns_todo_sorted",
        "bundles_for-wrong_defaults",
        "on_ready-waits_for_the_probe",
        "on_ready-declined_call_taken_as_a_return",
        "on_ready-lets_the_death_out",
        "on_ready-keeps_the_old_incarnation",
        "on_ready-unavailable_probe_dropped",
        "on_ready-rejoin_with_the_old_epoch",
        "on_ready-catches_everything_as_a_death",
        "on_ready-final_death_reprobed",
        "on_ready-final_death_without_died",
        "on_ready-decoding_call_died_taken_as_final",
    }
    gh.assert_slips_planted(MUTANTS, slips, NAMES)


# ---------------------------------------------------------------------------------------
# The oracles against the library's reference functions
# ---------------------------------------------------------------------------------------


def _view(p: Placement) -> l12.PlacementView:
    assert all(b == {"CPU": 1.0} for b in p.bundles)
    return l12.PlacementView(len(p.bundles), p.trainer_bundle, p.generator_bundle, p.trainer_cpus, p.generator_cpus)


def test_placement_table_and_oracle_equal_the_library():
    solve = solution_function(LESSON, "bundles_for")
    for (layout, n_trainers, n_generators), want in l12.TABLE.items():
        assert l12.naive_placement(layout, n_trainers, n_generators).same(want)
        assert _view(bundles_for(layout, n_trainers, n_generators)).same(want)
    for layout in LAYOUTS:
        for n_trainers in range(1, 6):
            for n_generators in range(1, 11):
                if layout == "sync_colocated" and n_generators % n_trainers:
                    continue
                lib = bundles_for(layout, n_trainers, n_generators)
                assert _view(lib).same(l12.naive_placement(layout, n_trainers, n_generators))
                assert solve(layout, n_trainers, n_generators) == lib


def test_each_placement_slip_differs_from_the_right_answer_on_the_table():
    for message, slip in l12.BF_SLIPS.items():
        assert any(not l12.naive_placement(*key, **slip).same(l12.naive_placement(*key)) for key in l12.TABLE), message


def _lib_admit(case: l12.AdmitCase) -> l12.AdmitOut:
    out = case.call(admit)
    return {g: tuple(ks) for g, ks in out.groups.items() if ks}, out.next_k, out.todo


def _cases_seen_in_simulations() -> list[l12.AdmitCase]:
    seen: list[l12.AdmitCase] = []

    def spy(case: l12.AdmitCase) -> l12.AdmitOut:
        seen.append(case)
        return l12.naive_admit(case)

    for config in l12.SIM_CONFIGS:
        for seed in range(3):
            l12.simulate_controller(spy, l12.naive_death_out, seed=seed, **config)
    return seen


def test_admission_oracle_and_solution_equal_the_library():
    solve = solution_function(LESSON, "admit")
    rng = random.Random(0)
    cases = [c for c, _ in l12.KNOWN_ADMITS] + list(l12.PROBES) + [l12._random_case(rng) for _ in range(2000)]
    cases += _cases_seen_in_simulations()
    assert len(cases) > 2500
    for case in cases:
        want = l12.naive_admit(case)
        assert _lib_admit(case) == want, case
        out = case.call(solve)
        assert isinstance(out, Admission)
        assert ({g: tuple(ks) for g, ks in out.groups.items() if ks}, out.next_k, out.todo) == want
    for case, want in l12.KNOWN_ADMITS:
        assert l12.naive_admit(case) == want


def test_the_random_steps_cover_every_rule():
    """The oracle check's 400 random steps reach each branch: a todo group dealt, a generator
    without weights, one dropped for old weights while another takes the group, room reached,
    total_groups reached."""
    rng = random.Random(12)
    cases = [l12._random_case(rng) for _ in range(400)]
    outs = [l12.naive_admit(c) for c in cases]
    assert any(c.todo and out[2] != c.todo for c, out in zip(cases, outs))
    assert any(any(c.delivered[g] < 0 for g in c.idle) for c in cases)
    assert any(out[1] == c.total > c.next_k for c, out in zip(cases, outs))
    assert any(
        len(out[0]) == 1 and len([g for g in c.idle if c.delivered[g] >= 0 and c.holding[g] < c.room]) > 1
        for c, out in zip(cases, outs)
    )
    assert any(
        all(c.holding[g] + len(out[0].get(g, ())) == c.room for g in c.idle if c.delivered[g] >= 0)
        for c, out in zip(cases, outs)
    )


def test_each_admission_slip_differs_somewhere_on_the_probes():
    for message, slip in l12.AD_SLIPS.items():
        assert any(l12.naive_admit(p, **slip) != l12.naive_admit(p) for p in l12.PROBES), message


def _lib_death(g, in_flight, admitted, todo) -> l12.DeathOut:
    out = on_generator_death(g, in_flight, admitted, todo)
    return out.lost, out.lost_entries, out.todo


def test_death_oracle_and_solution_equal_the_library():
    solve = solution_function(LESSON, "on_generator_death")
    cases = [c for c, _ in l12.KNOWN_DEATHS] + l12.death_cases()
    assert len(cases) > 20 and any(c.queued for c in cases) and any(not c.as_sets for c in cases)
    for case in cases:
        want = l12.naive_death(case)
        assert _lib_death(*case.args()) == want, case
        out = solve(*case.args())
        assert isinstance(out, Death) and (out.lost, out.lost_entries, out.todo) == want
    for case, want in l12.KNOWN_DEATHS:
        assert l12.naive_death(case) == want


def test_the_simulated_deaths_include_returned_groups_of_the_dead_generator():
    """What makes 're-requesting returned groups' visible: at some kill the ledger holds groups
    the dead generator already returned."""
    cases = l12.death_cases()
    assert any(
        any(who[0] == c.g and k not in c.in_flight[c.g] for k, who in c.admitted) and c.in_flight[c.g] for c in cases
    )
    assert any(c.todo and c.in_flight[c.g] for c in cases)  # older re-requests still waiting at a death


# ---------------------------------------------------------------------------------------
# The controller simulation
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("config", l12.SIM_CONFIGS, ids=l12._sim_text)
def test_the_simulation_runs_clean_with_the_library(config):
    def lib_death(g, in_flight, admitted, todo):
        return _lib_death(g, in_flight, admitted, todo)

    for seed in range(8):
        run = l12.simulate_controller(_lib_admit, lib_death, seed=seed, **config)
        assert run.finished and not run.violation, run.violation
        total = l12.SIM_UPDATES * config["B"]
        assert sorted(run.returned) == list(range(total))
        admitted_count = {k: sum(a[0] == k for a in run.admissions) for k in range(total)}
        lost_count = {k: sum(entry[0] == k for entry in run.lost) for k in range(total)}
        assert all(admitted_count[k] == 1 + lost_count[k] for k in range(total))  # once, plus once per loss
        for k, _, _, version in run.admissions:
            assert k < (version + config["max_lag"] + 1) * config["B"] and version >= 0


def test_the_simulations_kill_rerequest_and_spread_the_versions():
    runs = [
        l12.simulate_controller(l12._oracle_admit, l12.naive_death_out, seed=seed, **config)
        for config in l12.SIM_CONFIGS
        for seed in range(3)
    ]
    assert all(r.finished for r in runs)
    assert sum(len(r.deaths) for r in runs) >= 10 and sum(len(r.lost) for r in runs) >= 15
    assert any(r.version_spread >= 2 for r in runs)
    # a lost group came back from another incarnation of the same generator, and from another generator
    assert any(any(r.returned[k][0] == g for k, g, _ in r.lost) for r in runs)
    assert any(any(r.returned[k][0] != g for k, g, _ in r.lost) for r in runs)


def test_the_lag_check_alone_catches_an_admission_against_the_newest_version():
    """Without the step-by-step comparison, the simulated run still fails the slip: its groups lag."""

    def newest(case: l12.AdmitCase) -> l12.AdmitOut:
        return l12.naive_admit(case, newest_version=True)

    runs = [
        l12.simulate_controller(newest, l12.naive_death_out, seed=seed, **config)
        for config in l12.SIM_CONFIGS
        for seed in range(3)
    ]
    assert any("max_lag" in r.violation for r in runs)


def test_the_simulation_names_a_death_that_forgets_or_rerequests():
    def forgets(g, in_flight, admitted, todo):
        lost, entries, _ = l12.naive_death_out(g, in_flight, admitted, todo)
        return lost[:1], entries[:1], lost[:1] + tuple(todo)

    def returned_too(g, in_flight, admitted, todo):
        lost = tuple(sorted(k for k, (h, _) in admitted.items() if h == g))
        return lost, tuple((k, g, admitted[k][1]) for k in lost), lost + tuple(todo)

    for death, fragment in ((forgets, "would never be generated"), (returned_too, "was already returned")):
        runs = [
            l12.simulate_controller(l12._oracle_admit, death, seed=seed, **config)
            for config in l12.SIM_CONFIGS
            for seed in range(3)
        ]
        assert any(fragment in r.violation for r in runs), fragment


# ---------------------------------------------------------------------------------------
# on_ready: the loop around it, with a stand-in for Ray
# ---------------------------------------------------------------------------------------


def _oracle_handler(state: l12.LoopRun, what: str) -> None:
    """The loop's reaction written from the oracle's table, through the stand-in's pieces."""
    loop, ref = state.loop, state.ray.ready
    method, g, i = loop["calls"].pop(ref)
    try:
        out = state.ray.get(ref)
    except l12.ActorDiedError:
        if method == "rejoin":  # Ray's record of the actor: dead, no restart left
            loop["down"].discard(g)
            loop["gone"].add(g)
            return
        out = None  # a decoding call: a death like any other
    except l12.RayActorError:
        out = None
    if method == "rejoin":
        if out is None:
            loop["calls"][loop["submit"]("rejoin", g, i)] = ("rejoin", g, i)
        else:
            loop["inc"][g] = out["incarnation"]
            loop["down"].discard(g)
    elif out is not None and "groups" in out:
        loop["done"].update({k: (g, i) for k in out["groups"]})
        loop["in_flight"][g] -= set(out["groups"])
    else:
        loop["died"](g)
        e = loop["inc"][g] + 1
        loop["calls"][loop["submit"]("rejoin", g, e)] = ("rejoin", g, e)


def test_the_loop_simulation_finishes_and_shows_every_outcome():
    solve = solution_function(LESSON, "on_ready")
    totals = {"kills": 0, "cut_offs": 0, "declined": 0, "unavailable": 0, "final_kills": 0}
    totals |= {"gone_calls": 0, "gone_probes": 0}
    for seed in range(l12.SIM_LOOPS):
        for handler in (_oracle_handler, lambda state, what: l12._or_step(solve, state, what)):
            run = l12.simulate_loop(handler, **l12.loop_config(seed))
            assert run.finished and not run.violation, run.violation
        totals = {k: v + getattr(run, k) for k, v in totals.items()}
    # generators killed while decoding and while idle (the next call declined), live ones cut off while
    # holding groups, restarts that answer "unavailable" for a while: every outcome happens, several times
    assert totals["kills"] >= 20 and totals["declined"] >= 6 and totals["unavailable"] >= 8, totals
    assert totals["cut_offs"] >= 8, totals
    # generators dead for good: a decoding call raises ActorDiedError (a death, a probe), then the probe (gone);
    # the runs finish without them
    assert totals["final_kills"] == 6 and totals["gone_calls"] >= 2 and totals["gone_probes"] >= 2, totals


def test_the_simulated_runs_alone_name_a_final_death_mistake():
    """The planted bugs of ActorDiedError fail the simulated runs too, by name (not only the fixed rows)."""
    from conftest import mutant_function

    for name, fragment in (
        ("final_death_reprobed", "after its probe raised ActorDiedError"),
        ("decoding_call_died_taken_as_final", "decoding call raised ActorDiedError and it was taken as gone"),
        ("final_death_without_died", "decoding call raised ActorDiedError and it was taken as gone"),
        ("final_death_left_down", "still in loop['down']"),
        ("final_death_not_gone", "not in loop['gone']"),
    ):
        bug = mutant_function(LESSON, next(m for m in MUTANTS if m.name == name))

        def handler(state: l12.LoopRun, what: str, bug: Callable[..., Any] = bug) -> None:
            l12._or_step(bug, state, what)

        runs = [l12.simulate_loop(handler, **l12.loop_config(seed)) for seed in range(l12.SIM_LOOPS)]
        assert any(fragment in r.violation for r in runs), (name, [r.violation for r in runs])


def test_the_stand_ins_exceptions_are_rays():
    """ActorDiedError is a RayActorError, RayTaskError is not, as in Ray."""
    ray_exceptions = pytest.importorskip("ray.exceptions")
    for name in ("RayActorError", "ActorDiedError", "RayTaskError"):
        assert hasattr(ray_exceptions, name)
    for ours, theirs in (
        (l12.ActorDiedError, ray_exceptions.ActorDiedError),
        (l12.RayTaskError, ray_exceptions.RayTaskError),
    ):
        assert issubclass(ours, l12.RayActorError) == issubclass(theirs, ray_exceptions.RayActorError)
    ray = l12.StandInRay()
    ray.ready = l12.Ref(1)
    for kind, error in (("error", l12.RayActorError), ("died", l12.ActorDiedError), ("task", l12.RayTaskError)):
        ray.result = (kind, "why")
        with pytest.raises(error):
            ray.get(l12.Ref(1))


def test_the_known_and_random_loops_agree_with_the_solution():
    solve = solution_function(LESSON, "on_ready")
    rng = random.Random(7)
    cases = [*l12.KNOWN_LOOPS, *(l12._random_loop(rng) for _ in range(150))]
    kinds = set()
    for case in cases:
        run = l12._loop_of(case)
        method, g, _ = case.info()
        kinds.add((method, case.result[0], "restarted" in str(case.result[1]), g in case.down))
        if l12._or_step(solve, run, case.text()):  # a RayTaskError, let out
            assert case.result[0] == "task"
            continue
        assert l12._state(run.loop) == l12.naive_on_ready(case)
        assert len(run.deaths) == l12._deaths_due(case)
    # groups, raised, declined, ActorDiedError (decoding); unavailable, answered, gone (probe); RayTaskError from both
    assert len(kinds) == 9, kinds
    assert any(case.gone for case in cases)


def test_the_stand_in_refuses_a_read_of_another_call():
    ray = l12.StandInRay()
    ray.ready, ray.result = l12.Ref(1), ("value", {"groups": [3], "incarnation": 0})  # a decoding call's answer
    assert ray.get(l12.Ref(1)) == {"groups": [3], "incarnation": 0}
    with pytest.raises(l12._Blocked):
        ray.get(l12.Ref(2))
    assert ray.misused == "get:ObjectRef(2)"


# ---------------------------------------------------------------------------------------
# The library's answer is refused; the result types are not
# ---------------------------------------------------------------------------------------


def test_an_answer_that_imports_the_librarys_is_refused_however_imported():
    namespace: dict[str, Any] = {"lib_admit": admit}
    exec(
        "def from_globals(*args, **kwargs):\n    return lib_admit(*args, **kwargs)\n"
        "def via_module(*args, **kwargs):\n"
        "    import course_lib.capstone_ray.admission as A\n    return A.admit(*args, **kwargs)\n"
        "def from_package(*args, **kwargs):\n"
        "    from course_lib.capstone_ray import admission\n    return admission.admit(*args, **kwargs)\n",
        namespace,
    )
    for fn in (admit, namespace["from_globals"], namespace["via_module"], namespace["from_package"]):
        outcome = run_exercise(get_exercise(LESSON, "admit"), fn)
        assert not outcome.passed
        assert "uses course_lib.capstone_ray.admission.admit, the library's own implementation" in outcome.message
    for name, lib in (("bundles_for", bundles_for), ("on_generator_death", on_generator_death)):
        outcome = run_exercise(get_exercise(LESSON, name), lib)
        assert f"uses course_lib.capstone_ray.{lib.__module__.rsplit('.', 1)[1]}.{name}" in outcome.message


def test_the_result_types_are_allowed():
    """The solutions build Placement, Admission and Death (imported from the library): they pass."""
    from course_lib.course.grading.helpers import library_references

    for name in NAMES[:3]:
        found = library_references(solution_function(LESSON, name), l12.LIBRARY)
        assert found and set(found) <= l12.ALLOWED, found
    assert not library_references(solution_function(LESSON, "on_ready"), ("course_lib",))


def test_dicts_are_accepted_as_results():
    def as_dict(*args, **kwargs):
        out = solution_function(LESSON, "admit")(*args, **kwargs)
        return {"groups": out.groups, "next_k": out.next_k, "todo": list(out.todo)}

    assert run_exercise(get_exercise(LESSON, "admit"), as_dict).passed


# ---------------------------------------------------------------------------------------
# Bad submissions: a report, never a crash or a hang
# ---------------------------------------------------------------------------------------

# the result types built with wrong field types on purpose
_Placement: Any = Placement
_Admission: Any = Admission
_Death: Any = Death


def _sleeps_then_solves(ref, ray, loop):
    """The solution with a pause before it: passes every state check, and would stall a real loop."""
    import time

    time.sleep(0.01)
    return _solved("on_ready")(ref, ray, loop)


BAD: dict[str, list[tuple[Callable[..., Any], str]]] = {
    "bundles_for": [
        (lambda layout, n_trainers=2, n_generators=2: None, "forget to `return` the Placement"),
        (lambda layout, n_trainers=2, n_generators=2: {"bundles": []}, "without trainer_bundle"),
        (
            lambda layout, n_trainers=2, n_generators=2: _Placement(layout, ({"GPU": 1.0},), (0,), (0,), 1.0, 1.0),
            "expected {'CPU': 1.0}",
        ),
        (
            lambda layout, n_trainers=2, n_generators=2: _Placement(layout, ({"CPU": 1.0},), (0, 0), (5, 0), 0.5, 0.5),
            "names bundle 5",
        ),
        (
            lambda layout, n_trainers=2, n_generators=2: _Placement(layout, ({"CPU": 1.0},), (0,), (0, 0), 0.5, 0.25),
            "trainer_bundle has 1 entries; expected 2",
        ),
        (
            lambda layout, n_trainers=2, n_generators=2: _Placement(
                "pipeline", ({"CPU": 1.0},) * 2, (0, 0), (1, 1), 0.5, "half"
            ),
            "layout is 'pipeline'",
        ),
    ],
    "admit": [
        (lambda *args, **kwargs: None, "forget to `return` the Admission"),
        (lambda *args, **kwargs: _Admission(groups=[6, 7], next_k=8, todo=()), "expected a dict generator"),
        (lambda *args, **kwargs: _Admission(groups={0: [6.0]}, next_k=8, todo=()), "expected a tuple of ints"),
        (lambda *args, **kwargs: _Admission(groups={}, next_k="8", todo=()), "next_k is a str"),
        (lambda *args, **kwargs: (), "without groups, next_k, todo"),
        (lambda *args, **kwargs: _Admission(groups={7: [6]}, next_k=7, todo=(3,)), "generator 7, which does not"),
    ],
    "on_generator_death": [
        (lambda *args: None, "forget to `return` the Death"),
        (lambda *args: _Death(lost={12, 13}, lost_entries=(), todo=()), "lost is a set"),
        (lambda *args: _Death(lost=(12, 13, 15), lost_entries=((12, 1),), todo=()), "(k, generator, incarnation)"),
        (lambda *args: _Death(lost=(12, 13, 15), lost_entries=None, todo=()), "lost_entries is None"),
    ],
    "on_ready": [
        (lambda ref, ray, loop: None, "the finished call is still in loop['calls']"),
        (lambda ref, ray, loop: ray.wait(list(loop["calls"])), "called ray.wait"),
        (lambda ref, ray, loop: [ray.get(r) for r in list(loop["calls"])], "not on the call ray.wait returned"),
        (lambda ref, ray, loop: loop["calls"].pop(ref) and loop["nothing"], "raised KeyError"),
        (_sleeps_then_solves, "called time.sleep"),
    ],
}


def _solved(name: str) -> Callable[..., Any]:
    return solution_function(LESSON, name)


def _no_room(*args, **kwargs):
    return _solved("admit")(*args, **{**kwargs, "room": 10**6})


def _every_generator(next_k, todo, delivered, holding, idle, **kwargs):
    return _solved("admit")(next_k, todo, delivered, holding, range(len(delivered)), **kwargs)


def _next_k_unchanged(next_k, *args, **kwargs):
    out = _solved("admit")(next_k, *args, **kwargs)
    return Admission(groups=out.groups, next_k=next_k, todo=out.todo)


def _old_todo_reversed(g, in_flight, admitted, todo):
    out = _solved("on_generator_death")(g, in_flight, admitted, todo)
    return Death(out.lost, out.lost_entries, out.lost + tuple(reversed(todo)))


def _another_generators_group(g, in_flight, admitted, todo):
    out = _solved("on_generator_death")(g, in_flight, admitted, todo)
    other = sorted(k for h, ks in enumerate(in_flight) if h != g for k in ks)[:1]
    lost = tuple(sorted([*out.lost, *other]))
    return Death(lost, tuple((k, g, admitted[k][1]) for k in lost), lost + tuple(todo))


#: Wrong answers that no known slip matches: the message explains them from their properties.
EXPLAINED: dict[str, list[tuple[Callable[..., Any], str]]] = {
    "admit": [
        (_no_room, "more than room"),
        (_every_generator, "is not idle"),
        (_next_k_unchanged, "the next group never started"),
    ],
    "on_generator_death": [
        (_old_todo_reversed, "then the old todo in its order"),
        (_another_generators_group, "is not in flight on generator"),
    ],
}


@pytest.mark.parametrize(("name", "fn", "fragment"), gh.bad_submissions(EXPLAINED))
def test_unknown_mistakes_are_explained(name, fn, fragment):
    gh.assert_bad_submission_reported(LESSON, name, fn, fragment)


@pytest.mark.parametrize(("name", "fn", "fragment"), gh.bad_submissions(BAD))
def test_bad_submissions_are_reported(name, fn, fragment):
    gh.assert_bad_submission_reported(LESSON, name, fn, fragment)


@pytest.mark.parametrize("exercise", l12.EXERCISES, ids=NAMES)
def test_an_infinite_loop_times_out(exercise):
    def forever(*args, **kwargs):
        while True:
            pass

    gh.assert_infinite_loop_times_out(exercise, forever)


def test_a_learner_error_is_reported_with_its_call():
    def broken(g, in_flight, admitted, todo):
        return in_flight[g][0]  # a set is not indexable

    broken.__name__ = "on_generator_death"
    outcome = run_exercise(get_exercise(LESSON, "on_generator_death"), broken)
    assert outcome.results[0].status == "error"
    assert "raised TypeError" in outcome.message and "on_generator_death(1," in outcome.message


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_orphans")
def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = (
        "trainers_generators_swapped",
        "global_version",
        "forgets_queued_groups",
        "declined_call_taken_as_a_return",
    )
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)


@pytest.mark.skipif(
    get_lesson(LESSON).available(), reason="tests/test_grade_course_notebooks.py grades them once the lesson exists"
)
@pytest.mark.parametrize(("folder", "full"), [("solutions", True), ("exercises", False)])
def test_committed_notebooks_grade_full_and_zero(folder, full, tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "course"), "grade", f"{folder}/{LESSON}.ipynb", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=repo_root(),
    )
    (nb,) = json.loads(report.read_text())["notebooks"]
    if full:
        assert done.returncode == 0 and nb["score"] == nb["max_score"] == 45 and nb["notes"] == [], done.stdout
    else:
        assert done.returncode != 0 and nb["score"] == 0, done.stdout
        assert [ex["message"] for ex in nb["exercises"]] == [NOT_IMPLEMENTED] * 3
