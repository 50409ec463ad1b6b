"""Lesson 11's graders: the solutions pass, the stubs are "not implemented yet", every planted
bug is rejected with its message (tests/test_exercises.py, for every lesson; the first two
are here too so they run where lessons/11_capstone.py is absent); the graders' oracles agree
with the library (`course_lib.capstone.roles`, `.ledger`, lesson 08's
`course_lib.layout.model.generation_time_s` for the colocated decoding, `capstone.plan.rank_share`
for the fixed share), with the statements' worked examples and with hand-made cases; the
sharing oracle gives each trainer its work in core time; each known slip shows on the checks'
cases; bad submissions get a report, never a crash; an answer that hands the work to the
library (the job's `Roles`, lesson 08's engine model) is refused by the runner-wide guard; one
planted bug per exercise is caught end to end through `course grade`.
"""

from __future__ import annotations

import itertools
import textwrap
from collections.abc import Callable
from typing import Any

import grading_helpers as gh
import grading_outcomes as go
import pytest
from conftest import solution_function
from mutants.l11_capstone import MUTANTS

from course_lib.capstone.ledger import Generated, SampleLedger, audit
from course_lib.capstone.plan import rank_share
from course_lib.capstone.roles import Roles
from course_lib.course.grading.checks import run_check, run_exercise
from course_lib.course.grading.guard import GUARD_DESCRIPTION
from course_lib.course.grading.lessons import get_exercise
from course_lib.course.grading.lessons import l11_capstone as l11
from course_lib.layout.model import generation_time_s

LESSON = "11_capstone"
NAMES = ("assign_roles", "colocated_sync_update", "restart_accounting", "trainers_finish", "join_step")

pytestmark = pytest.mark.timeout(120)


def test_registry_lists_the_five_exercises():
    gh.assert_registry(LESSON, NAMES, ("11", "capstone"), points=80)


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes_and_stub_is_not_implemented(name):
    go.assert_solution_full_and_stub_not_implemented(LESSON, name)


# Every planted bug against its message: tests/test_exercises.py (every lesson).


def test_the_briefs_slips_are_among_the_planted_bugs():
    slips = {
        "assign_roles-boundary_off_by_one",
        "assign_roles-generators_from_the_end",
        "assign_roles-no_rank_check",
        "colocated_sync_update-decodes_for_the_mean_length",
        "colocated_sync_update-full_live_count_every_step",
        "colocated_sync_update-prompt_left_out_of_decoding",
        "colocated_sync_update-prompt_left_out_of_training",
        "colocated_sync_update-update_is_the_sum",
        "colocated_sync_update-update_is_the_mean",
        "colocated_sync_update-slot_use_averaged_over_ranks",
        "colocated_sync_update-no_length_check",
        "restart_accounting-keeps_groups_after_checkpoint",
        "restart_accounting-first_attempts_copy",
        "restart_accounting-step_boundary_off_by_one",
        "trainers_finish-fixed_share_throughout",
        "trainers_finish-finished_trainers_still_runnable",
        "trainers_finish-share_not_capped",
        "trainers_finish-background_forgotten",
        "trainers_finish-mean_finish",
        "trainers_finish-no_negative_work_check",
        "join_step-number_from_the_counter",
        "join_step-nonce_from_the_rank",
        "join_step-trusts_any_welcome",
        "join_step-join_key_counts_as_ready",
        "join_step-welcomes_each_rank_once",
        "join_step-never_steps_aside",
        "join_step-waits_inside_the_call",
    }
    gh.assert_slips_planted(MUTANTS, slips, NAMES)
    assert len({m.id for m in MUTANTS}) == len(MUTANTS)


# ---------------------------------------------------------------------------------------
# The graders' oracles agree with the library and with hand-made cases
# ---------------------------------------------------------------------------------------


def test_roles_oracle_and_solution_equal_the_library():
    solve = solution_function(LESSON, "assign_roles")
    for world_size in range(2, 13):
        for n_trainers in range(1, world_size):
            roles, table = Roles(world_size, n_trainers), l11.naive_roles(world_size, n_trainers)
            for rank in range(world_size):
                got = solve(rank, world_size, n_trainers)
                assert got == table[rank]
                assert got["role"] == roles.role(rank)
                assert got["trainer_group"] == roles.trainers and got["sync_group"] == roles.sync_ranks
                members = roles.trainers if got["role"] == "trainer" else roles.generators
                assert members[got["index"]] == rank


def test_each_roles_slip_differs_from_the_right_answer():
    for slip in l11.AR_SLIPS.values():
        assert l11.naive_roles(4, 2, **slip) != l11.naive_roles(4, 2), slip


COLOCATED = (l11.WORKED_COLOCATED, *l11.KNOWN_COLOCATED, *l11.RANDOM_COLOCATED)


def _close_answers(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return not l11._differing(a, b)


def test_colocated_oracle_and_solution_agree_with_lesson_08s_generation_time():
    """The step-by-step oracle, the closed-form solution and the library's (08.7) for one linear
    engine holding every answer of the rank at once agree on every case the checks use."""
    solve = solution_function(LESSON, "colocated_sync_update")
    for case in COLOCATED:
        want = l11.naive_colocated(case)
        assert _close_answers(solve(*case.args()), want), case
        for share, decode in zip(case.shares, want["decode_s"], strict=True):
            steps = [case.prompt_steps + n for n in share]
            lib = generation_time_s(steps, 1, len(steps), case.a_s, case.b_s) if steps else 0.0
            assert decode == pytest.approx(lib, rel=1e-12, abs=1e-15)


def test_the_worked_colocated_example_has_the_statements_numbers():
    got = l11.naive_colocated(l11.WORKED_COLOCATED)
    assert got["decode_s"] == pytest.approx([0.136, 0.072])
    assert got["train_s"] == pytest.approx([0.16, 0.12])
    assert got["update_s"] == pytest.approx(0.296)
    assert got["slot_use"] == pytest.approx(28 / 36)
    rank_1 = got["decode_s"][1] + got["train_s"][1]
    assert got["update_s"] - rank_1 == pytest.approx(0.104)  # rank 1's wait in the all-reduce


def test_the_hand_made_colocated_cases_show_what_they_say():
    empty_rank, one_each, equal, nothing = (l11.naive_colocated(c) for c in l11.KNOWN_COLOCATED)
    assert empty_rank["decode_s"][1] == 0.0 and empty_rank["train_s"][1] == 0.0
    assert one_each["slot_use"] == 1.0 and equal["slot_use"] == 1.0
    assert nothing == {"update_s": 0.0, "decode_s": [0.0, 0.0], "train_s": [0.0, 0.0], "slot_use": 1.0}
    assert sum(1 for c in l11.RANDOM_COLOCATED if any(not s for s in c.shares)) >= 5  # empty ranks, at random too
    assert sum(1 for c in l11.RANDOM_COLOCATED if c.b_s == 0.0) >= 5


def test_each_colocated_slip_differs_from_the_right_answer_on_the_checks_cases():
    for message, slip in l11.CS_SLIPS.items():
        assert any(
            not _close_answers(l11.naive_colocated(c, **slip), l11.naive_colocated(c))
            for c in (l11.WORKED_COLOCATED, *l11.KNOWN_COLOCATED)
        ), message


SHARING = (*l11.WORKED_SHARING, *l11.KNOWN_SHARING, *l11.RANDOM_SHARING)


def test_sharing_oracle_agrees_with_the_solution_and_the_fixed_share_with_the_library():
    """The solution (sorted, floats) equals the oracle (each finish found afresh, fractions);
    fixed_share_s is max(work) over the library's rank_share (whole cores)."""
    solve = solution_function(LESSON, "trainers_finish")
    for case in SHARING:
        want = l11.naive_sharing(case)
        assert _close_answers(solve(*case.args()), want), case
        if float(case.cores).is_integer():
            share = rank_share("cpu", int(case.cores), len(case.work) + case.background, False)
            assert want["fixed_share_s"] == pytest.approx(max(case.work) / share, rel=1e-12)


def test_sharing_gives_every_trainer_its_work_in_core_time():
    """Each trainer's core time, summed over the intervals between finishes, is its work; no
    process ever gets more than a core, and the cores are never oversubscribed."""
    for case in SHARING:
        finish = l11.naive_sharing(case)["finish_s"]
        events = sorted({0.0, *finish})
        for i, w in enumerate(case.work):
            got = 0.0
            for lo, hi in itertools.pairwise(events):
                if hi <= finish[i]:
                    runnable = sum(1 for f in finish if f >= hi) + case.background
                    rate = min(1.0, case.cores / runnable)
                    assert rate * runnable <= case.cores + 1e-12 and rate <= 1.0
                    got += (hi - lo) * rate
            assert got == pytest.approx(w, rel=1e-9, abs=1e-12), (case, i)


def test_the_worked_sharing_example_has_the_statements_numbers():
    three, two = (l11.naive_sharing(c) for c in l11.WORKED_SHARING)
    assert (three, two) == l11.WORKED_SHARING_ANSWERS
    assert three["fixed_share_s"] == two["fixed_share_s"] == two["update_s"] == 4.0  # the model: level
    assert three["update_s"] / two["update_s"] == pytest.approx(0.75)  # shared cores: 25% shorter


def test_each_sharing_slip_differs_from_the_right_answer_on_the_checks_cases():
    for message, slip in l11.TF_SLIPS.items():
        assert any(
            not _close_answers(l11.naive_sharing(c, **slip), l11.naive_sharing(c))
            for c in (*l11.WORKED_SHARING, *l11.KNOWN_SHARING)
        ), message


def test_the_fixed_share_and_finished_trainers_counted_differ_only_with_idle_trainers():
    """Both keep one share the whole time; they part where a trainer has no work at all, which
    the probes hold, so each is named with its own message."""
    fixed, kept = (dict(fixed_share=True), dict(keep_finished=True))
    for case in l11.WORKED_SHARING:
        assert l11.naive_sharing(case, **fixed) == l11.naive_sharing(case, **kept)
    idle = [c for c in l11.TF_PROBES if 0 in c.work]
    assert idle and all(l11.naive_sharing(c, **fixed) != l11.naive_sharing(c, **kept) for c in idle)


def _ledger_of(sc: l11.Scenario, group_size: int = 1) -> tuple[SampleLedger, list[Generated]]:
    """The library's ledger driven through the scenario's attempts, as the job drives it."""
    ledger = SampleLedger(group_size=group_size, groups_per_batch=sc.B)
    records = [Generated(a, k, group_size) for a, k, _ in sc.lines]
    for attempt, start in enumerate(sc.resumed_from):
        if attempt:
            consumed = [seg for seg in ledger.segments if seg[1] < start * sc.B]
            ledger.segments = [[a, f, min(e, start * sc.B), n] for a, f, e, n in consumed]
            ledger.updates = start  # the checkpoint restored: its ledger holds `start` updates
            ledger.resume(attempt, start, records)
        last = attempt == len(sc.resumed_from) - 1
        stop = sc.final_step if last else max((u + 1 for u, a in sc.history.items() if a == attempt), default=start)
        for u in range(start, stop):
            ledger.consume(attempt, u, [(attempt, k, group_size) for k in range(u * sc.B, (u + 1) * sc.B)], 0)
    ledger.finish(len(sc.resumed_from) - 1, records)
    return ledger, records


def test_accounting_oracle_agrees_with_the_solution_and_the_library_ledger():
    solve = solution_function(LESSON, "restart_accounting")
    for sc in (l11.worked_example(), *l11.SCENARIOS):
        want = l11.naive_accounting(sc)
        assert solve(*sc.args()) == want
        assert sorted(k for _, k in want["consumed"]) == list(range(sc.final_step * sc.B))
        if all(sc.resumed_from[i] <= sc.resumed_from[i + 1] for i in range(len(sc.resumed_from) - 1)):
            ledger, records = _ledger_of(sc)
            report = audit(ledger, records)
            assert report["ok"], report
            assert ledger.consumed_keys() == want["consumed"]
            assert ledger.discarded_groups == len(want["discarded"])
            assert ledger.leftover_groups == len(want["leftover"])


def test_the_scenarios_include_fallbacks_and_every_slip_shows():
    scenarios = l11.SCENARIOS
    assert any(any(b < a for a, b in zip(sc.resumed_from, sc.resumed_from[1:], strict=False)) for sc in scenarios)
    for slip in l11.RA_SLIPS.values():
        assert any(l11.naive_accounting(sc, **slip) != l11.naive_accounting(sc) for sc in scenarios), slip


def _newest_copy(generated, resumed_from, final_step, B):
    """The other reading of the rule: the newest attempt's copy of each k < final_step * B."""
    last = len(resumed_from) - 1
    newest: dict[int, int] = {}
    for a, k, _ in generated:
        newest[k] = max(a, newest.get(k, a))
    out: dict[str, Any] = {"consumed": [], "discarded": [], "leftover": []}
    samples = dict.fromkeys(("generated", "consumed", "discarded", "leftover"), 0)
    for a, k, n in generated:
        if k >= final_step * B:
            kind = "leftover" if a == last else "discarded"
        else:
            kind = "consumed" if a == newest[k] else "discarded"
        out[kind].append((a, k))
        samples[kind] += n
        samples["generated"] += n
    return {**{kind: sorted(keys) for kind, keys in out.items()}, "samples": samples}


def test_no_attempt_generates_below_its_resume_step_so_the_newest_copy_is_the_consumed_one():
    """The statement's model (and the capstone's group counter, restarted at step * B) makes the
    two readings equivalent; the grader docstring and the statement say so, and the grader
    accepts both."""
    for sc in l11.SCENARIOS:
        for a, k, _ in sc.lines:
            assert k >= sc.resumed_from[a] * sc.B
        assert _newest_copy(*sc.args()) == l11.naive_accounting(sc)
    outcome = run_exercise(l11.RESTART_ACCOUNTING, _newest_copy)
    assert outcome.passed, outcome.message


# ---------------------------------------------------------------------------------------
# join_step: the launch simulation
# ---------------------------------------------------------------------------------------

SCENARIOS = (*l11.KNOWN_JOINS, *l11.LATE_JOINS, *l11.RANDOM_JOINS)


def test_the_reference_protocol_and_the_solution_join_every_launch():
    solve = solution_function(LESSON, "join_step")
    totals = {"late": 0, "refused": 0, "aside": 0, "restarts": 0}
    for sc in SCENARIOS:
        for fn in (l11.reference_join_step, solve):
            run = l11.simulate_joins(fn, sc)
            assert not run.violation, (sc, run.violation)
        last = max(p.start for p in run.procs)
        assert all(p.result == ("joined", p.attempt) for p in run.procs if p.start == last)
        totals["late"] += run.late_welcomes
        totals["refused"] += run.refused
        totals["aside"] += run.stepped_aside
        totals["restarts"] += sc.starts - 1
    # the launches produce every case the statement names
    assert totals["late"] >= 10 and totals["refused"] >= 10 and totals["aside"] >= 5 and totals["restarts"] >= 30


def test_the_known_launches_show_what_they_say():
    """Launch 2: the new ranks 1 and 2 call before their rank 0 took the number, so a rank that
    reads `attempts` itself joins attempt 1. Launch 3: join/1 still holds the dead rank 1's nonce
    when the new rank 0 first reads it, so a rank 0 that welcomes each rank once never welcomes
    the new rank 1."""
    for sc, slip in ((l11.KNOWN_JOINS[1], "number_from_store"), (l11.KNOWN_JOINS[2], "welcome_rank_once")):
        switches, fragment = l11.JS_SLIPS[slip]
        run = l11.simulate_joins(lambda store, me, sw=switches: l11.reference_join_step(store, me, **sw), sc)
        assert fragment in run.violation, run.violation
    run = l11.simulate_joins(l11.reference_join_step, l11.KNOWN_JOINS[2])
    rank0 = next(p for p in run.procs if p.start == 2 and p.rank == 0)
    dead_nonce = next(p for p in run.procs if p.start == 1 and p.rank == 1).posted()[0]
    assert ("join/1", dead_nonce) in [(key, value) for key, value, _ in rank0.reads]


@pytest.mark.parametrize("slip", sorted(l11.JS_SLIPS))
def test_each_protocol_slip_is_caught_with_its_message(slip):
    switches, fragment = l11.JS_SLIPS[slip]

    def step(store, me):
        return l11.reference_join_step(store, me, **switches)

    for group in (l11.KNOWN_JOINS, l11.LATE_JOINS, l11.RANDOM_JOINS):
        violations = [run.violation for run in (l11.simulate_joins(step, sc) for sc in group) if run.violation]
        if violations:
            assert fragment in violations[0], violations[0]
            return
    raise AssertionError(f"{slip} passes every launch")


def test_the_store_refuses_a_call_that_waits():
    store = l11.JoinStore(cap=5)
    for key in range(5):
        store[f"k{key}"] = key
    with pytest.raises(l11._Spin):
        store.get("k0")
    assert store.spun


# ---------------------------------------------------------------------------------------
# Bad submissions: a report, never a crash or a hang
# ---------------------------------------------------------------------------------------


def _spin_until_welcomed(store, me):
    """Waits inside one call: the store cannot change during it."""
    while "welcome/x" not in store:
        pass


BAD: dict[str, list[tuple[Callable[..., Any], str]]] = {
    "assign_roles": [
        (lambda rank, world_size, n_trainers: None, "expected a dict"),
        (lambda rank, world_size, n_trainers: {"role": "trainer"}, "expected a dict with keys"),
        (
            lambda rank, world_size, n_trainers: {"role": "boss", "index": 0, "trainer_group": [], "sync_group": []},
            "expected 'trainer' or 'generator'",
        ),
    ],
    "colocated_sync_update": [
        (lambda *args: None, "expected a dict with keys update_s, decode_s, train_s, slot_use"),
        (
            lambda *args: {"update_s": 1.0, "decode_s": [1.0], "train_s": [1.0, 1.0], "slot_use": 1.0},
            "expected a list of 2 numbers, one a rank",
        ),
        (
            lambda *args: {"update_s": "fast", "decode_s": [0.0, 0.0], "train_s": [0.0, 0.0], "slot_use": 1.0},
            "update_s is a str; expected a (finite) number",
        ),
        (
            lambda *args: {"update_s": 1.0, "decode_s": [None, 0.0], "train_s": [0.0, 0.0], "slot_use": 1.0},
            "expected (finite) numbers",
        ),
    ],
    "restart_accounting": [
        (lambda *args: [], "expected a dict"),
        (lambda *args: {"consumed": 3, "discarded": [], "leftover": [], "samples": {}}, "sorted list"),
        (
            lambda *args: {"consumed": [], "discarded": [], "leftover": [], "samples": None},
            "expected a dict of int totals",
        ),
    ],
    "trainers_finish": [
        (
            lambda work, cores, background: [3.0, 2.0, 2.0],
            "expected a dict with keys finish_s, update_s, fixed_share_s",
        ),
        (
            lambda work, cores, background: {"finish_s": 3.0, "update_s": 3.0, "fixed_share_s": 4.0},
            "expected a list of 3 numbers, one a trainer",
        ),
        (
            lambda work, cores, background: {"finish_s": list(work), "update_s": float("nan"), "fixed_share_s": 4.0},
            "update_s is a float; expected a (finite) number",
        ),
    ],
    "join_step": [
        (lambda store, me: "joined", "expected None, ('joined', n) or ('superseded', newest)"),
        (lambda store, me: ("joined", "1"), "expected None, ('joined', n)"),
        (lambda store, me: store["attempts"], "raised KeyError"),
        (_spin_until_welcomed, "must not wait"),
    ],
}


@pytest.mark.parametrize(("name", "fn", "fragment"), gh.bad_submissions(BAD))
def test_bad_submissions_are_reported(name, fn, fragment):
    gh.assert_bad_submission_reported(LESSON, name, fn, fragment)


def test_an_infinite_loop_times_out():
    def forever(*args):
        while True:
            pass

    gh.assert_infinite_loop_times_out(l11.COLOCATED_SYNC_UPDATE, forever)


# ---------------------------------------------------------------------------------------
# The library's answers are refused (the runner-wide guard; the checks alone would pass them)
# ---------------------------------------------------------------------------------------

LIBRARY_ANSWERS = textwrap.dedent(
    """
    import importlib

    import course_lib.layout.model as engine
    from course_lib.capstone.roles import Roles, assign_roles as job_roles


    def _roles_answer(roles, rank):
        role = roles.role(rank)
        members = roles.trainers if role == "trainer" else roles.generators
        return {"role": role, "index": members.index(rank), "trainer_group": roles.trainers,
                "sync_group": roles.sync_ranks}


    def _checked(rank, world_size, n_trainers):
        if n_trainers < 1 or n_trainers >= world_size or not 0 <= rank < world_size:
            raise ValueError("an impossible layout")


    def roles_wrapper(rank, world_size, n_trainers):
        _checked(rank, world_size, n_trainers)
        return _roles_answer(Roles(world_size, n_trainers), rank)


    def roles_by_computed_import(rank, world_size, n_trainers):
        _checked(rank, world_size, n_trainers)
        module = importlib.import_module("course_lib.capstone." + "roles")
        return _roles_answer(getattr(module, "Ro" + "les")(world_size, n_trainers), rank)


    def job_assign_roles(rank, world_size, n_trainers):
        _checked(rank, world_size, n_trainers)
        return _roles_answer(job_roles(world_size, n_trainers, n_trainers), rank)


    def _colocated(decode):
        def colocated_sync_update(shares, prompt_steps, a_s, b_s, train_steps_per_s):
            if not shares or any(n < 1 for share in shares for n in share):
                raise ValueError("need a rank and answers of >= 1 token")
            if prompt_steps < 0 or a_s < 0 or b_s < 0 or train_steps_per_s <= 0:
                raise ValueError("bad rates")
            decode_s, train_s, live, held = [], [], 0, 0
            for share in shares:
                steps = [prompt_steps + n for n in share]
                decode_s.append(decode(steps, a_s, b_s) if steps else 0.0)
                train_s.append(sum(steps) / train_steps_per_s)
                live, held = live + sum(steps), held + len(steps) * max(steps, default=0)
            update_s = max(d + t for d, t in zip(decode_s, train_s))
            return {"update_s": update_s, "decode_s": decode_s, "train_s": train_s,
                    "slot_use": live / held if held else 1.0}
        return colocated_sync_update


    def _by_schedule(steps, a_s, b_s):
        start, end = engine.engine_schedule(steps, len(steps))
        return sum(a_s + b_s * int(((start <= t) & (t < end)).sum()) for t in range(int(end.max())))


    def _by_latency(steps, a_s, b_s):
        return sum(engine.decode_latency_s(sum(s > t for s in steps), a_s, b_s) for t in range(max(steps)))


    generation_time = _colocated(lambda steps, a_s, b_s: engine.generation_time_s(steps, 1, len(steps), a_s, b_s))
    finish_times = _colocated(
        lambda steps, a_s, b_s: float(engine.engine_finish_times_s(steps, len(steps), a_s, b_s).max())
    )
    schedule = _colocated(_by_schedule)
    latency = _colocated(_by_latency)
    """
)

#: (exercise, submission, the library piece the refusal names first, whether the checks alone pass it)
LIBRARY_SUBMISSIONS = (
    ("assign_roles", "roles_wrapper", "course_lib.capstone.roles.Roles", True),
    ("assign_roles", "roles_by_computed_import", "course_lib.capstone.roles", True),  # the module, named in a string
    ("assign_roles", "job_assign_roles", "course_lib.capstone.roles.assign_roles", False),  # >= 3 ranks, >= 2 trainers
    ("colocated_sync_update", "generation_time", "course_lib.layout.model.generation_time_s", True),
    ("colocated_sync_update", "finish_times", "course_lib.layout.model.engine_finish_times_s", True),
    ("colocated_sync_update", "schedule", "course_lib.layout.model.engine_schedule", True),
    ("colocated_sync_update", "latency", "course_lib.layout.model.decode_latency_s", True),
)


@pytest.mark.parametrize(
    ("name", "form", "used", "right"), LIBRARY_SUBMISSIONS, ids=[f"{n}-{f}" for n, f, _, _ in LIBRARY_SUBMISSIONS]
)
def test_an_answer_that_hands_the_work_to_the_library_is_refused(name, form, used, right):
    """The review's two routes (the job's Roles wrapped with the validation added; lesson 08's
    generation_time_s, whose linear path is exactly the tail) and the other pieces of the engine
    model that compute the same decode time: each right on every check run alone, each refused
    by the runner-wide guard with the exercise's advice."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(LIBRARY_ANSWERS, "<learner>", "exec"), namespace)
    fn, exercise = namespace[form], get_exercise(LESSON, name)
    assert all(run_check(check, fn).passed for check in exercise.checks) == right
    outcome = run_exercise(exercise, fn)
    assert not outcome.passed and outcome.results[0].description == GUARD_DESCRIPTION, outcome.results
    assert f"{name} uses {used}" in outcome.message and "the library's own implementation" in outcome.message
    assert exercise.advice and exercise.advice in outcome.message


def test_no_lesson_11_exercise_allows_course_lib_code():
    """Nothing is allowed, so every course_lib route (the ledger, rank_share, join_attempt too) is
    refused; each exercise says what to write it from instead."""
    for exercise in l11.EXERCISES:
        assert exercise.allowed == () and exercise.advice, exercise.name


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_orphans")
def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = (
        "boundary_off_by_one",
        "decodes_for_the_mean_length",
        "keeps_groups_after_checkpoint",
        "fixed_share_throughout",
        "number_from_the_counter",
    )
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
