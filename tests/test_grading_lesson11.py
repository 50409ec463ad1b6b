"""Lesson 11's graders: the solutions pass, the stubs are "not implemented yet", every planted
bug is rejected with its message (tests/test_exercises.py, for every lesson; the first two
are here too so they run where lessons/11_capstone.py is absent); the
graders' oracles agree with the library (`course_lib.capstone.roles`, `.ledger`,
`course_lib.rl.staleness.may_start_group`, `course_lib.pipeline.loss.pipeline_loss` rescaled
as `capstone.trainer.shard_loss` does) and with hand-made cases; the handshake
simulation catches a trainer that raises `consumed` before it announces; bad submissions
get a report, never a crash; an answer that calls course_lib's loss is named however it
imports it, and the library is restored afterwards; one planted bug per exercise is caught end to end through
`course grade`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import grading_helpers as gh
import grading_outcomes as go
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import solution_function
from mutants.l11_capstone import MUTANTS

from course_lib.capstone.ledger import Generated, SampleLedger, audit
from course_lib.capstone.roles import Roles
from course_lib.course.grading.checks import run_exercise
from course_lib.course.grading.lessons import get_exercise
from course_lib.course.grading.lessons import l11_capstone as l11
from course_lib.pipeline.loss import pipeline_loss
from course_lib.rl.staleness import may_start_group

LESSON = "11_capstone"
NAMES = ("assign_roles", "sync_and_admit", "restart_accounting", "data_parallel_losses", "join_step")

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
        "sync_and_admit-pulls_older_version",
        "sync_and_admit-bound_one_group_over",
        "restart_accounting-keeps_groups_after_checkpoint",
        "restart_accounting-first_attempts_copy",
        "restart_accounting-step_boundary_off_by_one",
        "data_parallel_losses-local_token_count",
        "data_parallel_losses-per_rank_mean",
        "data_parallel_losses-no_stop_gradient",
        "data_parallel_losses-padding_in_the_count",
        "data_parallel_losses-calls_the_library",
        "data_parallel_losses-truncates_at_a_constant",
        "data_parallel_losses-skips_zero_advantage_tokens",
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


def test_handshake_oracle_and_solution_equal_the_library_bound():
    solve = solution_function(LESSON, "sync_and_admit")
    for B in (1, 2, 4):
        for max_lag in (0, 1, 3):
            for updates in range(4):
                consumed = updates * B
                for k in range(consumed, consumed + (max_lag + 3) * B):
                    for announced, version in ((updates, updates), (updates + 1, updates - 1), (updates, updates + 1)):
                        want = may_start_group(k, consumed, max_lag, B)
                        hold = max(announced, version)
                        assert l11.naive_handshake(announced, consumed, version, k, max_lag, B) == (hold, want)
                        assert solve(announced, consumed, version, k, max_lag, B) == (hold, want)


def test_each_handshake_slip_differs_somewhere_on_the_grid():
    grid = [
        (a, c * B, v, k, L, B)
        for B in (1, 2)
        for L in (0, 1)
        for c in (0, 1)
        for a in range(-1, 3)
        for v in range(-1, 3)
        for k in range(c * B, (c + L + 2) * B + 1)
    ]
    for slip in l11.SA_SLIPS.values():
        assert any(l11.naive_handshake(*args, **slip) != l11.naive_handshake(*args) for args in grid), slip


def _right(announced: int, consumed: int, version: int, k: int, max_lag: int, B: int) -> tuple[int, bool]:
    return l11.naive_handshake(announced, consumed, version, k, max_lag, B)


@pytest.mark.parametrize("channel", sorted(l11.TRAINER_ORDERS))
def test_the_simulation_finishes_within_the_bound_with_the_right_order(channel):
    for seed in range(10):
        run = l11.simulate_handshake(_right, seed=seed, max_lag=1, B=2, channel=channel)
        assert run.finished and not run.violation
        assert len(run.start_version) >= 12


@pytest.mark.parametrize("channel", sorted(l11.TRAINER_ORDERS))
def test_a_trainer_raising_consumed_first_breaks_the_lag_bound(channel):
    """Why the trainer raises ``consumed`` last: the right generator, the wrong trainer order."""
    order = ("consumed", *(m for m in l11.TRAINER_ORDERS[channel] if m != "consumed"))
    runs = [l11.simulate_handshake(_right, seed=s, max_lag=0, B=2, channel=channel, order=order) for s in range(30)]
    assert any("lags" in r.violation for r in runs)


def test_the_shared_buffer_shows_a_version_newer_than_announced():
    """The case that catches a generator pulling an older version: it happens in the simulation."""
    seen = []

    def spy(announced: int, consumed: int, version: int, k: int, max_lag: int, B: int) -> tuple[int, bool]:
        seen.append(version > announced)
        return _right(announced, consumed, version, k, max_lag, B)

    for seed in range(4):
        l11.simulate_handshake(spy, seed=seed, max_lag=1, B=2, channel="shared_buffer")
    assert any(seen)


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


def _pad(shards: list[dict[str, Any]], key: str) -> torch.Tensor:
    """The shards' ``key`` tensors as one batch, right-padded to the widest shard."""
    width = max(s["mask"].shape[1] for s in shards)
    return torch.cat([F.pad(s[key], (0, width - s[key].shape[1])) for s in shards])


def _split_rows(grad: torch.Tensor, shards: list[dict[str, Any]]) -> list[np.ndarray]:
    out, row = [], 0
    for s in shards:
        n, t = s["mask"].shape
        out.append(grad[row : row + n, :t].detach().numpy())
        row += n
    return out


@pytest.mark.parametrize("n_shards", [1, 2, 3, 4])
def test_loss_oracles_agree_with_pipeline_loss_and_the_solution(n_shards):
    """The whole-batch reference is `pipeline_loss` on the padded batch; the shard-by-shard
    oracle and the solution equal it summed, and equal the library's rescaled shard terms."""
    solve = solution_function(LESSON, "data_parallel_losses")
    for seed in range(4):
        shards = l11.dp_batch(seed, n_shards)
        leaf = _pad(shards, "logp_new").requires_grad_(True)
        mask = _pad(shards, "mask")
        adv = torch.cat([s["adv"] for s in shards])[:, None] * mask
        lib = pipeline_loss(leaf, _pad(shards, "logp_behaviour"), adv, mask, l11.CLIP_C)
        lib_grads = _split_rows(torch.autograd.grad(lib, leaf)[0], shards)
        value, grads = l11.whole_batch_loss(shards, l11.CLIP_C)
        assert value == pytest.approx(float(lib.detach()), rel=1e-12)
        assert all(np.allclose(g, h, rtol=1e-12) for g, h in zip(grads, lib_grads, strict=True))
        values, naive_grads = l11.naive_shard_losses(shards, l11.CLIP_C)
        assert sum(values) == pytest.approx(value, rel=1e-12)
        assert all(np.allclose(g, h, rtol=1e-12) for g, h in zip(naive_grads, grads, strict=True))
        n_tokens = sum(int(s["mask"].sum()) for s in shards)
        got = solve([dict(s, logp_new=s["logp_new"].clone().requires_grad_(True)) for s in shards], l11.CLIP_C)
        for s, loss in zip(shards, got, strict=True):
            m = s["mask"]
            part = pipeline_loss(s["logp_new"], s["logp_behaviour"], s["adv"][:, None] * m, m, l11.CLIP_C)
            assert float(loss.detach()) == pytest.approx(float(part * m.sum() / n_tokens), rel=1e-12)  # as shard_loss


def _differs(shards: list[dict[str, Any]], slip: dict[str, Any], c: float = l11.CLIP_C) -> bool:
    (a, ga), (b, gb) = l11.naive_shard_losses(shards, c, **slip), l11.naive_shard_losses(shards, c)
    return not np.isclose(sum(a), sum(b)) or not all(np.allclose(g, h) for g, h in zip(ga, gb, strict=True))


def test_each_loss_slip_differs_from_the_right_answer_on_the_checks_shards():
    cases = [
        (l11.worked_shards(), l11.CLIP_C),
        *((l11.dp_batch(seed, 2 + seed % 3), l11.CLIPS[seed]) for seed in range(6)),
    ]
    for name, slip in l11.DP_SLIPS.items():
        assert any(_differs(shards, slip, c) for shards, c in cases), name
    values, _ = l11.naive_shard_losses(l11.worked_shards(), l11.CLIP_C)
    assert values[0] == pytest.approx(-3 * math.log(0.5) / 12)


def test_the_worked_example_gives_the_short_shard_three_times_the_weight_locally():
    """The statement's numbers: 3 and 9 tokens, local counts weigh shard 0's tokens 3x."""
    shards = l11.worked_shards()
    _, right = l11.naive_shard_losses(shards, l11.CLIP_C)
    for slip in ("local", "per_rank_mean"):
        _, grads = l11.naive_shard_losses(shards, l11.CLIP_C, **{slip: True})
        token0 = grads[0][0, l11.PROMPT] / right[0][0, l11.PROMPT]
        token1 = grads[1][0, l11.PROMPT] / right[1][0, l11.PROMPT]
        assert token0 / token1 == pytest.approx(3.0)
    assert right[0][0, l11.PROMPT] == pytest.approx(-1 / 12)


def test_ragged_batches_are_ragged_and_equal_ones_equal():
    for seed in range(6):
        counts = [int(s["mask"].sum()) for s in l11.dp_batch(seed, 2 + seed % 3)]
        assert len(set(counts)) == len(counts)
    assert len({int(s["mask"].sum()) for s in l11.dp_batch(11, 3, ragged=False)}) == 1


def _shard_terms(shards: list[dict[str, Any]], clip_c: float, lib: Callable[..., Any]) -> list[torch.Tensor]:
    n_tokens = sum(int(s["mask"].sum()) for s in shards)
    return [
        lib(s["logp_new"], s["logp_behaviour"], s["adv"][:, None] * s["mask"], s["mask"], clip_c)
        * s["mask"].sum()
        / n_tokens
        for s in shards
    ]


def test_calling_the_library_is_refused_however_it_is_reached():
    """Imports, module attributes and a swallowed call are refused by the runner-wide guard
    (`grading.guard`, before any check); a loss fetched by a computed name and called on the
    learner's behalf by torch's own Python code (which the runner-wide tracer attributes to
    torch) is named by lesson 11's tripwires."""
    from course_lib.pipeline import loss as loss_module
    from course_lib.rl import importance

    exercise = get_exercise(LESSON, "data_parallel_losses")
    namespace: dict[str, Any] = {"_shard_terms": _shard_terms, "pipeline_loss": loss_module.pipeline_loss}
    exec(
        "def from_globals(shards, clip_c):\n    return _shard_terms(shards, clip_c, pipeline_loss)\n"
        "def via_module(shards, clip_c):\n"
        "    import course_lib.pipeline.loss as L\n    return _shard_terms(shards, clip_c, L.pipeline_loss)\n"
        "def swallowed(shards, clip_c):\n"
        "    try:\n        pipeline_loss(None, None, None, None, clip_c)\n    except Exception:\n        pass\n"
        "    return [s['logp_new'].sum() * 0 for s in shards]\n"
        "def routed(shards, clip_c):\n"
        "    import sys, torch.utils.checkpoint as ck\n"
        "    name = ''.join(map(chr, [99, 111, 117, 114, 115, 101, 95, 108, 105, 98])) + '.pipeline.lo' + 'ss'\n"
        "    f = getattr(sys.modules[name], 'pipeline_' + 'loss')\n"
        "    n = sum(int(s['mask'].sum()) for s in shards)\n"
        "    return [ck.checkpoint(f, s['logp_new'], s['logp_behaviour'], s['adv'][:, None] * s['mask'], s['mask'],\n"
        "                          clip_c, use_reentrant=False) * s['mask'].sum() / n for s in shards]\n",
        namespace,
    )

    def truncated(shards, clip_c):
        n_tokens = sum(int(s["mask"].sum()) for s in shards)
        return [
            importance.truncated_is_loss(s["logp_new"], s["logp_behaviour"], s["adv"][:, None], clip_c, s["mask"])
            * s["mask"].sum()
            / n_tokens
            for s in shards
        ]

    for fn, fragment in (
        (namespace["from_globals"], "uses course_lib.pipeline.loss.pipeline_loss"),
        (namespace["via_module"], "uses course_lib.pipeline"),
        (namespace["swallowed"], "uses course_lib.pipeline.loss.pipeline_loss"),
        (truncated, "uses course_lib.rl.importance"),
        (namespace["routed"], "calls course_lib's pipeline_loss"),
    ):
        outcome = run_exercise(exercise, fn)
        assert not outcome.passed and fragment in outcome.message, outcome.message
    # the tripwires are gone afterwards
    assert namespace["pipeline_loss"] is loss_module.pipeline_loss
    assert loss_module.pipeline_loss.__module__ == "course_lib.pipeline.loss"
    assert importance.truncated_is_loss.__name__ == "truncated_is_loss"


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
    "sync_and_admit": [
        (lambda *args: True, "expected a tuple (version, may_start)"),
        (lambda *args: (0.5, True), "expected an int"),
        (lambda *args: (0, "yes"), "expected a bool"),
    ],
    "restart_accounting": [
        (lambda *args: [], "expected a dict"),
        (lambda *args: {"consumed": 3, "discarded": [], "leftover": [], "samples": {}}, "sorted list"),
        (
            lambda *args: {"consumed": [], "discarded": [], "leftover": [], "samples": None},
            "expected a dict of int totals",
        ),
    ],
    "data_parallel_losses": [
        (lambda shards, clip_c: None, "expected a list of"),
        (lambda shards, clip_c: [torch.zeros(())], "expected a list of 3 losses"),
        (lambda shards, clip_c: [1.0 for _ in shards], "expected a torch tensor"),
        (lambda shards, clip_c: [s["logp_new"].sum(1) for s in shards], "expected a scalar"),
        (lambda shards, clip_c: [s["logp_new"].detach().sum() for s in shards], "does not require grad"),
        (
            lambda shards, clip_c: [sum(t["logp_new"].sum() for t in shards) for _ in shards],
            "depends on shard 1's log-probs",
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

    gh.assert_infinite_loop_times_out(l11.SYNC_AND_ADMIT, forever)


# ---------------------------------------------------------------------------------------
# End to end through `course grade` (a separate kernel)
# ---------------------------------------------------------------------------------------


@pytest.mark.usefixtures("no_orphans")
def test_course_grade_catches_one_planted_bug_per_exercise(tmp_path):
    """The solution notebook with each exercise's function cell replaced by a planted bug."""
    picked = (
        "boundary_off_by_one",
        "pulls_older_version",
        "keeps_groups_after_checkpoint",
        "local_token_count",
        "number_from_the_counter",
    )
    gh.assert_planted_bugs_caught_end_to_end(LESSON, MUTANTS, picked, tmp_path)
