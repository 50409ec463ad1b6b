"""Lesson 11's graded exercises: two of the capstone job's small decisions, how the ranks of a
restarted job agree on their attempt, and two accounts of what section 8 measured (the
colocated baseline's tail, and cores shared when trainers wait).

The learner writes:

* ``assign_roles(rank, world_size, n_trainers) -> dict``  (role, index within the role, process groups)
* ``colocated_sync_update(shares, prompt_steps, a_s, b_s, train_steps_per_s) -> dict``  (the tail)
* ``restart_accounting(generated, resumed_from, final_step, B) -> dict``  (the ledger after restores)
* ``trainers_finish(work, cores, background) -> dict``  (processor sharing against the fixed share)
* ``join_step(store, me) -> None | ("joined", n) | ("superseded", newest)``  (one call of the attempt protocol)

What each exercise teaches, and how its checks see that mechanism (not only its values):

* assign_roles: mechanism: one comparison with n_trainers decides the role, the index counts within
  the role, and both groups are built without the rank (every rank passes new_group the same list);
  observed on every rank of every layout up to 10 ranks and by comparing the groups across ranks.
* colocated_sync_update: mechanism: a rank decodes until its longest answer is done, each step
  paying a_s plus b_s per answer still live (the tail), then trains on its answer-steps; the
  update waits for the slowest rank; the slot use pools live over held slot-steps. Observed on
  batches with long tails, empty ranks and equal lengths, against the decoding played step by step.
* restart_accounting: mechanism: update u's copy is the one of the last attempt that resumed at or
  before u; observed on runs simulated attempt by attempt (fallbacks to older checkpoints) whose
  true history the grader keeps, and on the audit identity (11.6). The rule checked is each line's
  class against that history. In the statement's model (as in ``course_lib.capstone``, whose group
  counter restarts at ``resumed_from[a] * B``) no attempt generates a group below its resume step,
  so the attempt that did update u is also the newest attempt that generated u's groups: "keep the
  newest copy of each k < final_step * B" classifies every run the model allows the same way, and
  is accepted; the statement says so. What the checks tell apart is the history itself (fallbacks
  to an older step than the attempt before, lines generated after a checkpoint and lost, in-flight
  groups of earlier attempts), not which of the two equivalent readings a function uses.
* trainers_finish: mechanism: between two finishes every runnable process (the trainers with work
  left and the background) gets min(1, cores / R) of a core, R dropping at each finish; observed
  on trainers with no work, ties, more cores than processes and fractional cores, against the
  fixed share the model uses.
* join_step: mechanism: rank 0 takes the next number once and steps aside when a newer one exists;
  another rank waits at a key only it knows (a fresh nonce), checks the welcome against the newest
  number, and confirms at a key of its attempt; observed in launches played against a store that
  records who wrote each key (the dead attempt's keys, its lingering rank 0, its late welcomes).

The checks never call ``course_lib``'s implementations: they compare with the oracles below,
each written a different way from the statement's rule. The roles oracle hands the ranks out
one by one; the colocated oracle plays each rank's decoding step by step (the solution sums
it in closed form); the accounting oracle simulates runs attempt by attempt (checkpoints as
copies of the update history, a corrupt newest checkpoint sometimes skipped) and reads the
truth off the final history; the sharing oracle runs processor sharing in exact fractions,
finding each next finish afresh (the solution sorts); the attempt protocol is checked by the
truth of the simulated launch (which start each process belongs to), not by a reference
implementation (``reference_join_step``, written as a table of phases, is for the tests).
Each oracle takes keyword switches that compute a known slip, so a wrong answer that matches
one is named.

No exercise allows any course_lib code (``Exercise.allowed`` is empty), so the runner-wide guard
(:mod:`course_lib.course.grading.guard`) refuses, before any check and again at run time, a
submission that hands the work to the library, however it reaches it: for assign_roles the job's
``course_lib.capstone.roles.Roles`` and ``assign_roles`` (a wrapper around ``Roles`` with the
validation added would otherwise pass every check); for colocated_sync_update lesson 08's
``course_lib.layout.model.generation_time_s`` (its linear path is ``a_s * steps + b_s * tokens``,
exactly the tail), ``engine_finish_times_s``, ``engine_schedule``, ``decode_latency_s`` and
``course_lib.capstone.plan.colocated_sync_rate``; for restart_accounting ``course_lib.capstone.ledger``;
for trainers_finish ``capstone.plan.rank_share`` (only the fixed share, not the answer); for
join_step ``capstone.context.join_attempt``. ``advice`` says what to write each one from instead.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from course_lib.course.grading.checks import (
    Exercise,
    LearnerError,
    call,
    check_case,
    describe_type,
    fail,
    fmt_number,
    short_repr,
)
from course_lib.course.grading.vocab import (
    as_int,
    as_real,
    assert_value_error,
    returned_instead_of_value_error,
)

LESSON = "11_capstone"


# ---------------------------------------------------------------------------------------
# Exercise 1: assign_roles
# ---------------------------------------------------------------------------------------

AR = "assign_roles"
KEYS = ("role", "index", "trainer_group", "sync_group")

Layout = dict[int, dict[str, Any]]


def naive_roles(
    world_size: int,
    n_trainers: int,
    *,
    extra_trainer: bool = False,
    from_the_end: bool = False,
    global_index: bool = False,
    sync: str = "source+generators",
) -> Layout:
    """Every rank's answer, handing the ranks out one by one: trainers until there are
    ``n_trainers``, then generators. The switches compute known slips."""
    wanted = n_trainers + (1 if extra_trainer else 0)
    trainers: list[int] = []
    generators: list[int] = []
    roles: dict[int, tuple[str, int]] = {}
    for rank in range(world_size):
        if len(trainers) < wanted:
            roles[rank] = ("trainer", len(trainers))
            trainers.append(rank)
        else:
            roles[rank] = ("generator", len(generators))
            generators.append(rank)
    if from_the_end:
        roles = {r: (role, world_size - 1 - r if role == "generator" else i) for r, (role, i) in roles.items()}
    if global_index:
        roles = {r: (role, r) for r, (role, _) in roles.items()}
    sync_group = {
        "source+generators": trainers[:1] + generators,
        "generators": list(generators),
        "everyone": list(range(world_size)),
    }[sync]
    return {
        r: {"role": role, "index": i, "trainer_group": list(trainers), "sync_group": list(sync_group)}
        for r, (role, i) in roles.items()
    }


AR_SLIPS: dict[str, dict[str, Any]] = {
    "off by one at the trainer/generator boundary: ranks 0 .. n_trainers-1 train, rank n_trainers is "
    "the first generator": dict(extra_trainer=True),
    "generators counted from the wrong end: the first generator, rank n_trainers, is generator 0": dict(
        from_the_end=True
    ),
    "the index is the position within the role, not the global rank: generator index = rank - n_trainers": dict(
        global_index=True
    ),
    "the sync group needs trainer 0, the source of every weight update: [0] + the generators": dict(sync="generators"),
    "the sync group holds trainer 0 and the generators only: the other trainers would wait on a transfer "
    "they take no part in": dict(sync="everyone"),
}


def _ar_answer(fn: Callable[..., Any], rank: int, world_size: int, n_trainers: int) -> dict[str, Any]:
    """The learner's answer, normalised (lists of ints), or a failure naming what is wrong."""
    what = f"{AR}({rank}, {world_size}, {n_trainers})"
    got = call(fn, rank, world_size, n_trainers)
    if not isinstance(got, dict) or not set(KEYS) <= set(got):
        fail(f"{what} returned {describe_type(got)}; expected a dict with keys {', '.join(KEYS)}")
    out: dict[str, Any] = {"role": got["role"], "index": as_int(got["index"])}
    if out["role"] not in ("trainer", "generator"):
        fail(f"{what}: role is {short_repr(got['role'])}; expected 'trainer' or 'generator'")
    if out["index"] is None:
        fail(f"{what}: index is {describe_type(got['index'])}; expected an int")
    for key in ("trainer_group", "sync_group"):
        members = got[key]
        if not isinstance(members, list | tuple | range) or any(as_int(m) is None for m in members):
            fail(f"{what}: {key} is {describe_type(members)}; expected a list of ranks (ints)")
        out[key] = [int(m) for m in members]
    return out


def _ar_compare(fn: Callable[..., Any], world_size: int, n_trainers: int) -> None:
    """Every rank of one layout against the oracle; a mismatch matching a slip is named."""
    want = naive_roles(world_size, n_trainers)
    got = {r: _ar_answer(fn, r, world_size, n_trainers) for r in range(world_size)}
    if got == want:
        return
    for message, slip in AR_SLIPS.items():
        wrong = naive_roles(world_size, n_trainers, **slip)
        if wrong != want and all(
            got[r][key] == wrong[r][key] for r in got for key in KEYS if got[r][key] != want[r][key]
        ):
            rank = next(r for r in got if got[r] != want[r])
            fail(f"{AR}({rank}, {world_size}, {n_trainers}): {message}")
    rank = next(r for r in got if got[r] != want[r])
    key = next(key for key in KEYS if got[rank][key] != want[rank][key])
    fail(
        f"{AR}({rank}, {world_size}, {n_trainers}): {key} is {short_repr(got[rank][key])}; "
        f"expected {short_repr(want[rank][key])}"
    )


@check_case("hand-made layouts: 4 ranks with 2 trainers, 2 ranks with 1, 8 ranks with 3")
def _ar_known(fn: Callable[..., Any]) -> None:
    want = {
        0: ("trainer", 0),
        1: ("trainer", 1),
        2: ("generator", 0),
        3: ("generator", 1),
    }
    for rank, (role, index) in want.items():
        got = _ar_answer(fn, rank, 4, 2)
        if (got["role"], got["index"]) != (role, index):
            _ar_compare(fn, 4, 2)  # names the slip if it is a known one
            fail(f"{AR}({rank}, 4, 2): ({got['role']!r}, {got['index']}); expected ({role!r}, {index})")
        if got["trainer_group"] != [0, 1] or got["sync_group"] != [0, 2, 3]:
            _ar_compare(fn, 4, 2)
            fail(f"{AR}({rank}, 4, 2): groups {got['trainer_group']}, {got['sync_group']}; expected [0, 1], [0, 2, 3]")
    _ar_compare(fn, 2, 1)
    _ar_compare(fn, 8, 3)


@check_case("every layout of 2 to 10 ranks, every rank, against an oracle that hands the ranks out one by one")
def _ar_oracle(fn: Callable[..., Any]) -> None:
    for world_size in range(2, 11):
        for n_trainers in range(1, world_size):
            _ar_compare(fn, world_size, n_trainers)


@check_case("properties: each index once a role, the same groups on every rank, trainer 0 in both groups")
def _ar_properties(fn: Callable[..., Any]) -> None:
    for world_size, n_trainers in ((6, 2), (9, 4), (16, 7)):
        answers = [_ar_answer(fn, r, world_size, n_trainers) for r in range(world_size)]
        what = f"{AR}(rank, {world_size}, {n_trainers})"
        for role, count in (("trainer", n_trainers), ("generator", world_size - n_trainers)):
            indices = sorted(a["index"] for a in answers if a["role"] == role)
            if indices != list(range(count)):
                fail(f"{what}: the {role} indices are {short_repr(indices)}; expected 0 .. {count - 1}, once each")
        for key in ("trainer_group", "sync_group"):
            if any(a[key] != answers[0][key] for a in answers):
                fail(
                    f"{what}: {key} differs between ranks: every rank calls new_group with the same list, "
                    "or it hangs; build it without looking at rank"
                )
        first = answers[0]
        if first["sync_group"] != sorted(first["sync_group"]) or first["sync_group"][:1] != [0]:
            fail(f"{what}: the sync group {short_repr(first['sync_group'])} must be ascending, starting at 0")
        if sorted(set(first["trainer_group"]) & set(first["sync_group"])) != [0]:
            fail(f"{what}: trainer 0 must be the only rank in both groups")


@check_case("raises ValueError for impossible layouts: no trainer, no generator, a rank outside the world")
def _ar_bad(fn: Callable[..., Any]) -> None:
    cases = (
        (0, 4, 0, "no trainer"),
        (0, 4, 4, "no generator left"),
        (0, 4, 5, "more trainers than ranks"),
        (0, 1, 1, "a world of one rank"),
        (4, 4, 2, "rank == world_size"),
        (-1, 4, 2, "a negative rank"),
    )
    for rank, world_size, n_trainers, why in cases:
        what = f"{AR}({rank}, {world_size}, {n_trainers})"
        no_error = returned_instead_of_value_error(what, f"{why}: an impossible layout")
        assert_value_error(fn, rank, world_size, n_trainers, what=what, no_error=no_error)


ASSIGN_ROLES = Exercise(
    name=AR,
    points=10,
    title="a rank's role, its index within the role and the process groups' members",
    checks=(_ar_known, _ar_oracle, _ar_properties, _ar_bad),
    advice="with one comparison (rank < n_trainers) and the two groups built from range, not with the job's Roles",
    hints=(
        "Check the three impossible cases first; then one comparison, rank < n_trainers, decides the role.",
        "A generator's index is its distance from the first generator: rank - n_trainers.",
        "Every rank must build the very same group lists, whatever its own rank (a collective whose ranks disagree "
        "on the group hangs): which ranks exchange gradients, and which need the new weights and from whom? Return "
        "the four keys the statement names.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: colocated_sync_update
# ---------------------------------------------------------------------------------------

CS = "colocated_sync_update"
CS_KEYS = ("update_s", "decode_s", "train_s", "slot_use")
#: relative and absolute tolerance of every comparison of seconds and slot use
REL, ABS = 1e-9, 1e-12


@dataclass(frozen=True)
class Colocated:
    """One call of ``colocated_sync_update``: the answers' lengths per rank, and the rates."""

    shares: tuple[tuple[int, ...], ...]
    prompt_steps: int
    a_s: float
    b_s: float
    train_steps_per_s: float

    def args(self) -> tuple[list[list[int]], int, float, float, float]:
        return [list(s) for s in self.shares], self.prompt_steps, self.a_s, self.b_s, self.train_steps_per_s

    def text(self) -> str:
        shares = short_repr([list(s) for s in self.shares], max_chars=60)
        return (
            f"{CS}({shares}, prompt_steps={self.prompt_steps}, a_s={fmt_number(self.a_s)}, "
            f"b_s={fmt_number(self.b_s)}, train_steps_per_s={fmt_number(self.train_steps_per_s)})"
        )


def naive_colocated(
    case: Colocated,
    *,
    mean_length: bool = False,
    full_live: bool = False,
    decode_without_prompt: bool = False,
    train_without_prompt: bool = False,
    update: str = "max",
    per_rank_use: bool = False,
) -> dict[str, Any]:
    """Each rank's decoding played step by step: at step ``t`` the answers with ``P + L_i > t``
    are live and the step costs ``a_s + b_s * live``, until none is. The switches compute
    known slips."""
    decode, train, uses = [], [], []
    used = held = 0
    for share in case.shares:
        live_for = [case.prompt_steps + n for n in share]
        steps = max(live_for, default=0)
        played = list(share) if decode_without_prompt else live_for
        seconds = 0.0
        for t in range(max(played, default=0)):
            seconds += case.a_s + case.b_s * sum(1 for n in played if n > t)
        if mean_length and share:  # the steps of the mean answer; the live answer-steps as they are
            seconds = case.a_s * sum(live_for) / len(live_for) + case.b_s * sum(live_for)
        if full_live:  # every step at the full live count
            seconds = steps * (case.a_s + case.b_s * len(share))
        decode.append(seconds)
        train.append(sum(share if train_without_prompt else live_for) / case.train_steps_per_s)
        used += sum(live_for)
        held += len(share) * steps
        if share:
            uses.append(sum(live_for) / (len(share) * steps))
    per_rank = [d + t for d, t in zip(decode, train, strict=True)]
    update_s = {"max": max(per_rank), "sum": sum(per_rank), "mean": sum(per_rank) / len(per_rank)}[update]
    pooled = used / held if held else 1.0
    slot_use = (sum(uses) / len(uses) if uses else 1.0) if per_rank_use else pooled
    return {"update_s": update_s, "decode_s": decode, "train_s": train, "slot_use": slot_use}


CS_SLIPS: dict[str, dict[str, Any]] = {
    "decoded for the mean answer's length: a rank decodes until its longest answer is done (P + max L steps), "
    "paying a_s at every step of the tail": dict(mean_length=True),
    "every decoding step costed at the full live count: answers finish and their slots empty, so step t costs "
    "a_s + b_s * (the answers still live at t)": dict(full_live=True),
    "the prompt steps are left out of decoding: answer i is live for P + L_i steps (its prompt, then its tokens)": dict(
        decode_without_prompt=True
    ),
    "the prompt steps are left out of training: a rank trains on sum_i (P + L_i) sequence steps": dict(
        train_without_prompt=True
    ),
    "the update is the sum over the ranks: they decode and train at the same time and meet at the all-reduce, "
    "so the update is the slowest rank's decode + train (the max)": dict(update="sum"),
    "the update is the mean over the ranks: every rank waits at the all-reduce for the slowest, so the update "
    "is the max of decode + train": dict(update="mean"),
    "the slot use is averaged over the ranks: pool the live answer-steps and the held slot-steps of every rank, "
    "then divide once": dict(per_rank_use=True),
}


def _cs_answer(fn: Callable[..., Any], case: Colocated) -> dict[str, Any]:
    """The learner's answer as floats, or a failure naming what is wrong with its shape."""
    what = case.text()
    got = call(fn, *case.args())
    if not isinstance(got, dict) or not set(CS_KEYS) <= set(got):
        fail(f"{what} returned {describe_type(got)}; expected a dict with keys {', '.join(CS_KEYS)}")
    out: dict[str, Any] = {}
    for key in ("update_s", "slot_use"):
        value = as_real(got[key])
        if value is None:
            fail(f"{what}: {key} is {describe_type(got[key])}; expected a (finite) number")
        out[key] = value
    for key in ("decode_s", "train_s"):
        values = got[key]
        if not isinstance(values, list | tuple) or len(values) != len(case.shares):
            fail(f"{what}: {key} is {describe_type(values)}; expected a list of {len(case.shares)} numbers, one a rank")
        reals = [as_real(v) for v in values]
        if any(v is None for v in reals):
            fail(f"{what}: {key} holds {short_repr(values)}; expected (finite) numbers")
        out[key] = reals
    return out


def _close(a: Any, b: Any) -> bool:
    """Numbers, or lists of numbers, equal to REL relative (ABS absolute near zero)."""
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return math.isclose(a, b, rel_tol=REL, abs_tol=ABS)


def _differing(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    return [key for key in want if not _close(got[key], want[key])]


def _named_slip(
    got: dict[str, Any],
    want: dict[str, Any],
    wrongs: dict[str, dict[str, Any]],
    probe: Callable[[str], bool],
) -> str | None:
    """The slip whose answer the learner's agrees with wherever the learner's is wrong (several
    candidates: the one that agrees on every probe, else the first), or None."""
    keys = _differing(got, want)
    here = [
        message
        for message, wrong in wrongs.items()
        if _differing(wrong, want) and all(_close(got[key], wrong[key]) for key in keys)
    ]
    if len(here) > 1:
        return next((message for message in here if probe(message)), here[0])
    return here[0] if here else None


def _cs_compare(fn: Callable[..., Any], case: Colocated) -> None:
    """The learner against the oracle on ``case``; a mismatch that agrees with a slip is named."""
    got, want = _cs_answer(fn, case), naive_colocated(case)
    if not _differing(got, want):
        return

    def probe(message: str) -> bool:
        slip = CS_SLIPS[message]
        return all(not _differing(_cs_answer(fn, p), naive_colocated(p, **slip)) for p in CS_PROBES)

    message = _named_slip(got, want, {m: naive_colocated(case, **s) for m, s in CS_SLIPS.items()}, probe)
    if message:
        fail(f"{case.text()}: {message}")
    key = _differing(got, want)[0]
    fail(f"{case.text()}: {key} is {short_repr(got[key])}; expected {short_repr(want[key])}")


#: The statement's worked example: rank 0's answers of 1 and 9 tokens, rank 1's of 3 and 3.
WORKED_COLOCATED = Colocated(((1, 9), (3, 3)), 3, 0.01, 0.001, 100.0)

#: Hand-made cases: a rank with no answers, one answer per rank, equal lengths, no answer at all.
KNOWN_COLOCATED: tuple[Colocated, ...] = (
    Colocated(((2, 5), ()), 1, 0.02, 0.004, 50.0),
    Colocated(((4,), (1,), (7,)), 2, 0.01, 0.002, 80.0),
    Colocated(((5, 5, 5), (5, 5, 5)), 3, 0.015, 0.001, 120.0),
    Colocated(((), ()), 3, 0.01, 0.001, 100.0),
)


def random_colocated(seed: int) -> Colocated:
    """1 to 4 ranks of 0 to 6 answers each (long tails: now and then one answer much longer)."""
    rng = random.Random(seed)
    shares = []
    for _ in range(rng.randint(1, 4)):
        share = [rng.randint(1, 12) for _ in range(rng.randint(0, 6))]
        if share and rng.random() < 0.5:
            share[rng.randrange(len(share))] = rng.randint(20, 60)  # the tail
        shares.append(tuple(share))
    if not any(shares):
        shares[0] = (rng.randint(1, 30),)
    return Colocated(
        tuple(shares),
        rng.randint(0, 5),
        rng.uniform(0.001, 0.05),
        rng.choice((0.0, rng.uniform(0.0, 0.005))),
        rng.uniform(20.0, 500.0),
    )


RANDOM_COLOCATED = tuple(random_colocated(seed) for seed in range(40))
#: Small cases on which a wrong answer is matched against each candidate slip as a whole.
CS_PROBES = (WORKED_COLOCATED, *KNOWN_COLOCATED[:3], *RANDOM_COLOCATED[:4])


@check_case("the worked example: 2 ranks, answers of 1 and 9 tokens against 3 and 3")
def _cs_worked(fn: Callable[..., Any]) -> None:
    _cs_compare(fn, WORKED_COLOCATED)
    got = _cs_answer(fn, WORKED_COLOCATED)
    want = {"update_s": 0.296, "decode_s": [0.136, 0.072], "train_s": [0.16, 0.12], "slot_use": 28 / 36}
    key = next(iter(_differing(got, want)), None)
    if key is not None:  # the oracle agrees with these by construction; this names them
        fail(f"{WORKED_COLOCATED.text()}: {key} is {short_repr(got[key])}; expected {short_repr(want[key])}")


@check_case("hand-made cases: a rank with no answers, one answer per rank, equal lengths (slot use 1), no answers")
def _cs_known(fn: Callable[..., Any]) -> None:
    for case in KNOWN_COLOCATED:
        _cs_compare(fn, case)


@check_case("random batches with long tails, 1 to 4 ranks, against the decoding played step by step")
def _cs_oracle(fn: Callable[..., Any]) -> None:
    for case in RANDOM_COLOCATED:
        _cs_compare(fn, case)


@check_case("raises ValueError on no rank, a length < 1, a negative P, a_s or b_s, and train_steps_per_s <= 0")
def _cs_bad(fn: Callable[..., Any]) -> None:
    cases = (
        (Colocated((), 3, 0.01, 0.001, 100.0), "no rank at all"),
        (Colocated(((2, 0),), 3, 0.01, 0.001, 100.0), "an answer of 0 tokens"),
        (Colocated(((2,), (-1,)), 3, 0.01, 0.001, 100.0), "an answer of -1 tokens"),
        (Colocated(((2,),), -1, 0.01, 0.001, 100.0), "prompt_steps < 0"),
        (Colocated(((2,),), 3, -0.01, 0.001, 100.0), "a_s < 0"),
        (Colocated(((2,),), 3, 0.01, -0.001, 100.0), "b_s < 0"),
        (Colocated(((2,),), 3, 0.01, 0.001, 0.0), "train_steps_per_s = 0"),
        (Colocated(((2,),), 3, 0.01, 0.001, -5.0), "train_steps_per_s < 0"),
    )
    for case, why in cases:
        what = case.text()
        no_error = returned_instead_of_value_error(what, why)
        assert_value_error(fn, *case.args(), what=what, no_error=no_error)


COLOCATED_SYNC_UPDATE = Exercise(
    name=CS,
    points=15,
    title="a colocated synchronous update: the slowest rank's decode (with its tail) and training, and the slot use",
    checks=(_cs_worked, _cs_known, _cs_oracle, _cs_bad),
    advice="summing each rank's decode steps (a_s a step, b_s a live answer-step) in plain arithmetic, not with "
    "lesson 08's engine model",
    hints=(
        "Work rank by rank. Answer i is live for P + L_i steps, the rank decodes until the longest is done, and "
        "at each step the cost is a_s plus b_s for every answer still live at that step.",
        "Summed over the steps, a_s is paid once a step (P + the longest length of them) and b_s once for each "
        "live answer-step (sum_i (P + L_i) of them). Training runs over the same answer-steps at "
        "train_steps_per_s.",
        "The ranks work at the same time and meet at the all-reduce: which rank does the update wait for? Slot use "
        "pools every rank's live answer-steps and held slot-steps before one division (a rank with no answers "
        "adds nothing to either). Validate the arguments first.",
    ),
)


# ---------------------------------------------------------------------------------------
# Exercise 3: restart_accounting
# ---------------------------------------------------------------------------------------

RA = "restart_accounting"
KINDS = ("consumed", "discarded", "leftover")

Line = tuple[int, int, int]
Key = tuple[int, int]


@dataclass(frozen=True)
class Scenario:
    """A run with restores: the lines, the steps resumed from, and the final history."""

    lines: tuple[Line, ...]
    resumed_from: tuple[int, ...]
    final_step: int
    B: int
    history: dict[int, int]  # update -> the attempt whose run of it survived

    def args(self) -> tuple[list[Line], list[int], int, int]:
        return list(self.lines), list(self.resumed_from), self.final_step, self.B


def simulate_restarts(seed: int, *, B: int, n_attempts: int, every: int = 2) -> Scenario:
    """A run simulated attempt by attempt. A checkpoint is a copy of the history (update ->
    attempt) at its step; an attempt restores the newest one (sometimes the newest is corrupt
    and deleted first), redoes the updates from there, writes checkpoints every ``every``
    updates, generates the groups of its updates plus some in flight, and dies. Its groups
    start at its resume step times B, as the statement's model (and the capstone's group
    counter) has it, so the newest copy of a group below final_step * B is the consumed one."""
    rng = random.Random(seed)
    checkpoints: dict[int, dict[int, int]] = {0: {}}
    lines: list[Line] = []
    resumed: list[int] = []
    history: dict[int, int] = {}
    end = 0
    for attempt in range(n_attempts):
        last = attempt == n_attempts - 1
        if attempt and len(checkpoints) > 1 and rng.random() < 0.35:
            del checkpoints[max(checkpoints)]  # the newest does not verify: fall back
        start = max(checkpoints)
        resumed.append(start)
        history = dict(checkpoints[start])
        end = start + rng.randint(1 if last else 0, 4)
        for u in range(start, end):
            history[u] = attempt
            if (u + 1) % every == 0 and (u + 1) not in checkpoints:
                checkpoints[u + 1] = dict(history)
        in_flight = rng.randint(0, 2 * B)
        lines += [(attempt, k, rng.randint(1, 8)) for k in range(start * B, end * B + in_flight)]
    rng.shuffle(lines)
    return Scenario(tuple(lines), tuple(resumed), end, B, history)


Answer = dict[str, Any]


def naive_accounting(
    sc: Scenario,
    *,
    keep_every_copy: bool = False,
    first_attempt: bool = False,
    late_boundary: bool = False,
    one_update_too_many: bool = False,
    leftover_any_attempt: bool = False,
    count_groups: bool = False,
) -> Answer:
    """The truth read off the simulated history: group ``k < final_step * B`` was consumed in
    the copy of ``history[k // B]``; the last attempt's later groups are left over; the rest
    is discarded. The switches compute known slips."""
    last = len(sc.resumed_from) - 1
    limit = (sc.final_step + (1 if one_update_too_many else 0)) * sc.B
    out: dict[str, list[Key]] = {kind: [] for kind in KINDS}
    totals = dict.fromkeys(("generated", *KINDS), 0)
    for a, k, n in sc.lines:
        u = k // sc.B
        if k >= limit:
            kind = "leftover" if a == last or leftover_any_attempt else "discarded"
        else:
            owner = sc.history.get(u, last)
            if first_attempt:
                owner = 0
            if late_boundary:  # the attempt resuming at step s credited from update s + 1 only
                owner = max((b for b, s in enumerate(sc.resumed_from) if s < u), default=0)
            kind = "consumed" if keep_every_copy or a == owner else "discarded"
        out[kind].append((a, k))
        totals[kind] += 1 if count_groups else n
        totals["generated"] += 1 if count_groups else n
    return {**{kind: sorted(keys) for kind, keys in out.items()}, "samples": totals}


RA_SLIPS: dict[str, dict[str, Any]] = {
    "kept a group generated after the checkpoint the next attempt resumed from (counted twice): its "
    "update was lost, the group is discarded": dict(keep_every_copy=True),
    "kept the first attempt's copy of a group generated again: the copy of the last attempt that resumed "
    "at or before its update counts": dict(first_attempt=True),
    "off by one at the step boundary: the attempt that resumed from step s redid update s itself "
    "(group k belongs to update k // B)": dict(late_boundary=True),
    "off by one at the last update: update final_step - 1 is the last, groups k >= final_step * B were "
    "never trained on": dict(one_update_too_many=True),
    "an earlier attempt's groups beyond the last update are discarded, not left over (only the last "
    "attempt's are in flight)": dict(leftover_any_attempt=True),
    "the totals count samples (the third field of each line), not groups": dict(count_groups=True),
}


def _ra_keys(got: Any, kind: str, what: str) -> list[Key]:
    value = got[kind]
    if not isinstance(value, list | tuple):
        fail(f"{what}: {kind!r} is {describe_type(value)}; expected a sorted list of (attempt, k) tuples")
    keys: list[Key] = []
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2 or any(as_int(x) is None for x in item):
            fail(f"{what}: {kind!r} holds {short_repr(item)}; expected (attempt, k) tuples of ints")
        keys.append((int(item[0]), int(item[1])))
    return keys


def _ra_answer(fn: Callable[..., Any], sc: Scenario, what: str) -> Answer:
    got = call(fn, *sc.args())
    if not isinstance(got, dict) or not {*KINDS, "samples"} <= set(got):
        fail(f"{what} returned {describe_type(got)}; expected a dict with consumed, discarded, leftover, samples")
    out: Answer = {kind: _ra_keys(got, kind, what) for kind in KINDS}
    samples = got["samples"]
    names = ("generated", *KINDS)
    if (
        not isinstance(samples, dict)
        or not set(names) <= set(samples)
        or any(as_int(samples[n]) is None for n in names)
    ):
        fail(f"{what}: 'samples' is {describe_type(samples)}; expected a dict of int totals {', '.join(names)}")
    out["samples"] = {n: int(samples[n]) for n in names}
    return out


def _ra_text(sc: Scenario) -> str:
    return f"{RA}({len(sc.lines)} lines, resumed_from={list(sc.resumed_from)}, final_step={sc.final_step}, B={sc.B})"


def _ra_compare(fn: Callable[..., Any], sc: Scenario) -> None:
    what = _ra_text(sc)
    got, want = _ra_answer(fn, sc, what), naive_accounting(sc)
    sorted_got = {kind: sorted(got[kind]) for kind in KINDS}
    if any(sorted_got[kind] != got[kind] for kind in KINDS) and all(sorted_got[k] == want[k] for k in KINDS):
        fail(f"{what}: the lists hold the right groups but are not sorted; return sorted(...)")
    if got == want:
        return
    for message, slip in RA_SLIPS.items():
        wrong = naive_accounting(sc, **slip)
        if wrong != want and got == wrong:
            fail(f"{what}: {message}")
    for kind in KINDS:
        extra = sorted(set(got[kind]) - set(want[kind]))
        if extra:
            right = next(k for k in KINDS if extra[0] in want[k])
            fail(f"{what}: group {extra[0]} is {right}, not {kind}")
        missing = sorted(set(want[kind]) - set(got[kind]))
        if missing:
            fail(f"{what}: group {missing[0]} (attempt, k) is missing from {kind!r}")
    fail(f"{what}: samples = {got['samples']}; expected {want['samples']}")


def worked_example() -> Scenario:
    """The statement's example: B = 2, attempt 0 checkpointed step 3 and died after update 4."""
    history = {u: 0 for u in range(3)} | {u: 1 for u in range(3, 6)}
    lines = [(0, k, 4) for k in range(12)] + [(1, k, 4) for k in range(6, 14)]
    return Scenario(tuple(lines), (0, 3), 6, 2, history)


@check_case("the worked example (a restore from step 3, B = 2) and a run without restarts")
def _ra_known(fn: Callable[..., Any]) -> None:
    sc = worked_example()
    _ra_compare(fn, sc)
    got = _ra_answer(fn, sc, _ra_text(sc))
    want = {
        "consumed": [(0, k) for k in range(6)] + [(1, k) for k in range(6, 12)],
        "discarded": [(0, k) for k in range(6, 12)],
        "leftover": [(1, 12), (1, 13)],
        "samples": {"generated": 80, "consumed": 48, "discarded": 24, "leftover": 8},
    }
    if got != want:
        fail(f"{_ra_text(sc)} returned {short_repr(got)}; expected {short_repr(want)}")
    no_restart = Scenario(tuple((0, k, 3) for k in range(10)), (0,), 4, 2, {u: 0 for u in range(4)})
    _ra_compare(fn, no_restart)  # one attempt: nothing discarded, groups 8 and 9 left over


SCENARIOS = tuple(
    simulate_restarts(seed, B=B, n_attempts=n) for seed in range(12) for B, n in ((1, 2), (2, 3), (3, 4), (4, 5))
)


@check_case("runs simulated attempt by attempt (fallbacks to older steps too), lines shuffled")
def _ra_oracle(fn: Callable[..., Any]) -> None:
    for sc in SCENARIOS:
        _ra_compare(fn, sc)


@check_case("the audit: generated = consumed + discarded + leftover, each k consumed once; inputs unchanged")
def _ra_audit(fn: Callable[..., Any]) -> None:
    for sc in SCENARIOS[::5]:
        what = _ra_text(sc)
        lines, resumed, final_step, B = sc.args()
        before = (list(lines), list(resumed))
        got = _ra_answer(fn, sc, what)
        call(fn, lines, resumed, final_step, B)
        if (lines, resumed) != before:
            fail(
                f"{what} changed its inputs (sorted or edited generated or resumed_from in place); leave them as given"
            )
        s = got["samples"]
        if s["generated"] != sum(n for _, _, n in sc.lines):
            fail(f"{what}: samples['generated'] = {s['generated']}; expected the sum over every line")
        if s["generated"] != s["consumed"] + s["discarded"] + s["leftover"]:
            fail(f"{what}: the audit fails, generated != consumed + discarded + leftover ({short_repr(s)})")
        ks = sorted(k for _, k in got["consumed"])
        if ks != list(range(final_step * B)):
            fail(f"{what}: consumed must hold each k < final_step * B = {final_step * B} exactly once")
        if sum(len(got[kind]) for kind in KINDS) != len(sc.lines):
            fail(f"{what}: every line is consumed, discarded or left over, exactly once")


RESTART_ACCOUNTING = Exercise(
    name=RA,
    points=20,
    title="restart accounting: which generated groups are consumed, discarded or left over after restores",
    checks=(_ra_known, _ra_oracle, _ra_audit),
    advice="by classifying each line against the attempts' resume steps, not with the job's SampleLedger",
    hints=(
        "each update u of the final run counts once, done by one attempt: of the attempts that could have "
        "done it (those that resumed at or before u), which one's work survived the restarts that followed?",
        "each line belongs to one update, the one that would train on its group; ask whether the final run still "
        "counts that update, and if so, whether this line's attempt is the one whose work on it survived",
        'collect (attempt, k) into three lists, add samples to the line\'s total and to "generated"; sort at the end',
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: trainers_finish
# ---------------------------------------------------------------------------------------

TF = "trainers_finish"
TF_KEYS = ("finish_s", "update_s", "fixed_share_s")


@dataclass(frozen=True)
class Sharing:
    """One call of ``trainers_finish``: each trainer's CPU-seconds, the cores, the background."""

    work: tuple[float, ...]
    cores: float
    background: int

    def args(self) -> tuple[list[float], float, int]:
        return list(self.work), self.cores, self.background

    def text(self) -> str:
        return f"{TF}({short_repr(list(self.work))}, cores={fmt_number(self.cores)}, background={self.background})"


def naive_sharing(
    case: Sharing,
    *,
    fixed_share: bool = False,
    uncapped: bool = False,
    no_background: bool = False,
    mean_finish: bool = False,
    keep_finished: bool = False,
) -> dict[str, Any]:
    """Processor sharing in exact fractions: from one finish to the next, every process still
    runnable gets ``min(1, cores / R)`` of a core; the next finish is the unfinished trainer with
    the least work left (each is found afresh, nothing sorted). The switches compute known slips."""
    cores, work = Fraction(case.cores), [Fraction(w) for w in case.work]
    background = 0 if no_background else case.background

    def share(runnable: int) -> Fraction:
        return cores / runnable if uncapped else min(Fraction(1), cores / runnable)

    finish = [Fraction(0)] * len(work)
    left = {i: w for i, w in enumerate(work) if w > 0}
    if fixed_share or keep_finished:  # one rate the whole time
        rate = share(max((len(work) if fixed_share else len(left)) + background, 1))
        finish = [w / rate for w in work]
        left = {}
    t = Fraction(0)
    while left:
        rate = share(len(left) + background)
        first = min(left, key=left.__getitem__)
        dt = left[first] / rate
        t += dt
        for i in list(left):
            left[i] -= dt * rate
            if left[i] == 0:
                finish[i] = t
                del left[i]
    update = sum(finish) / len(finish) if mean_finish else max(finish)
    fixed = max(work) / share(len(work) + background)
    return {"finish_s": [float(f) for f in finish], "update_s": float(update), "fixed_share_s": float(fixed)}


TF_SLIPS: dict[str, dict[str, Any]] = {
    "every trainer ran at the fixed share min(1, cores / (trainers + background)) the whole time: that is the "
    "model's fixed_share_s; a trainer that finished waits in the all-reduce without the CPU, so recount the "
    "runnable processes at every finish": dict(fixed_share=True),
    "a trainer that finished is still counted as runnable: once its work is done it waits in the all-reduce and "
    "uses no CPU; R counts the trainers with work left (and the background) at each moment": dict(keep_finished=True),
    "the share is not capped at one core: a process cannot use more than one, min(1, cores / R)": dict(uncapped=True),
    "the background processes are forgotten: the generators are always runnable, R = the trainers with work left "
    "+ background": dict(no_background=True),
    "update_s is the mean finish: the all-reduce waits for the last trainer, update_s = max(finish_s)": dict(
        mean_finish=True
    ),
}


def _tf_answer(fn: Callable[..., Any], case: Sharing) -> dict[str, Any]:
    """The learner's answer as floats, or a failure naming what is wrong with its shape."""
    what = case.text()
    got = call(fn, *case.args())
    if not isinstance(got, dict) or not set(TF_KEYS) <= set(got):
        fail(f"{what} returned {describe_type(got)}; expected a dict with keys {', '.join(TF_KEYS)}")
    out: dict[str, Any] = {}
    finish = got["finish_s"]
    if not isinstance(finish, list | tuple) or len(finish) != len(case.work):
        fail(f"{what}: finish_s is {describe_type(finish)}; expected a list of {len(case.work)} numbers, one a trainer")
    out["finish_s"] = [as_real(v) for v in finish]
    if any(v is None for v in out["finish_s"]):
        fail(f"{what}: finish_s holds {short_repr(finish)}; expected (finite) numbers")
    for key in ("update_s", "fixed_share_s"):
        value = as_real(got[key])
        if value is None:
            fail(f"{what}: {key} is {describe_type(got[key])}; expected a (finite) number")
        out[key] = value
    return out


def _tf_compare(fn: Callable[..., Any], case: Sharing) -> None:
    """The learner against the oracle on ``case``; a mismatch that agrees with a slip is named."""
    got, want = _tf_answer(fn, case), naive_sharing(case)
    if not _differing(got, want):
        return

    def probe(message: str) -> bool:
        slip = TF_SLIPS[message]
        return all(not _differing(_tf_answer(fn, p), naive_sharing(p, **slip)) for p in TF_PROBES)

    message = _named_slip(got, want, {m: naive_sharing(case, **s) for m, s in TF_SLIPS.items()}, probe)
    if message:
        fail(f"{case.text()}: {message}")
    key = _differing(got, want)[0]
    fail(f"{case.text()}: {key} is {short_repr(got[key])}; expected {short_repr(want[key])}")


#: The statement's worked example, on 2 cores: 3 trainers and 1 generator, 2 trainers and 2 generators.
WORKED_SHARING = (Sharing((2, 1, 1), 2, 1), Sharing((2, 2), 2, 2))
WORKED_SHARING_ANSWERS = (
    {"finish_s": [3.0, 2.0, 2.0], "update_s": 3.0, "fixed_share_s": 4.0},
    {"finish_s": [4.0, 4.0], "update_s": 4.0, "fixed_share_s": 4.0},
)

#: Hand-made cases: equal work, trainers with no work, more cores than processes, no background,
#: a fractional number of cores, no work at all.
KNOWN_SHARING: tuple[Sharing, ...] = (
    Sharing((1.5, 1.5, 1.5), 2, 1),
    Sharing((0, 3, 1, 0), 2, 1),
    Sharing((3, 1), 8, 2),
    Sharing((4, 2, 1), 2, 0),
    Sharing((1, 2), 1.5, 1),
    Sharing((0, 0), 2, 0),
)


def random_sharing(seed: int) -> Sharing:
    """1 to 6 trainers (whole groups, or any CPU-seconds; some with none, some tied), 0.5 to 8
    cores, 0 to 4 background processes."""
    rng = random.Random(seed)
    n = rng.randint(1, 6)
    work: list[float] = []
    for _ in range(n):
        r = rng.random()
        if seed % 2:  # whole groups of 1 CPU-second
            work.append(float(rng.randint(0, 3)))
        else:
            work.append(0.0 if r < 0.15 else rng.choice(work) if work and r < 0.4 else rng.uniform(0.1, 5.0))
    cores = rng.choice((0.5, 1, 1.5, 2, 3, 4, 8, rng.uniform(0.3, 6.0)))
    return Sharing(tuple(work), cores, rng.randint(0, 4))


RANDOM_SHARING = tuple(random_sharing(seed) for seed in range(40))
#: Small cases on which a wrong answer is matched against each candidate slip as a whole.
TF_PROBES = (*WORKED_SHARING, *KNOWN_SHARING[:5])


@check_case("the worked example on 2 cores: work [2, 1, 1] with 1 generator, [2, 2] with 2")
def _tf_worked(fn: Callable[..., Any]) -> None:
    for case, want in zip(WORKED_SHARING, WORKED_SHARING_ANSWERS, strict=True):
        _tf_compare(fn, case)
        got = _tf_answer(fn, case)
        key = next(iter(_differing(got, want)), None)
        if key is not None:  # the oracle agrees with these by construction; this names them
            fail(f"{case.text()}: {key} is {short_repr(got[key])}; expected {short_repr(want[key])}")


@check_case("hand-made cases: equal work, trainers with no work, more cores than processes, no background, 1.5 cores")
def _tf_known(fn: Callable[..., Any]) -> None:
    for case in KNOWN_SHARING:
        _tf_compare(fn, case)


@check_case("random trainers, cores and background against processor sharing in exact fractions")
def _tf_oracle(fn: Callable[..., Any]) -> None:
    for case in RANDOM_SHARING:
        _tf_compare(fn, case)


@check_case("raises ValueError on no trainer, a negative work, cores <= 0 and background < 0")
def _tf_bad(fn: Callable[..., Any]) -> None:
    cases = (
        (Sharing((), 2, 1), "no trainer"),
        (Sharing((1, -0.5), 2, 1), "a negative work"),
        (Sharing((1,), 0, 1), "cores = 0"),
        (Sharing((1,), -2, 1), "cores < 0"),
        (Sharing((1,), 2, -1), "background < 0"),
    )
    for case, why in cases:
        what = case.text()
        no_error = returned_instead_of_value_error(what, why)
        assert_value_error(fn, *case.args(), what=what, no_error=no_error)


TRAINERS_FINISH = Exercise(
    name=TF,
    points=15,
    title="processor sharing: when each trainer finishes once the trainers that wait give their cores away",
    checks=(_tf_worked, _tf_known, _tf_oracle, _tf_bad),
    advice="by stepping from one finish to the next with the share min(1, cores / R) in plain arithmetic",
    hints=(
        "Between two finishes nothing changes: the same processes are runnable and each gets the same share, "
        "min(1, cores / R). So the next event is the trainer with the least work left.",
        "Take the trainers in order of their work. Every unfinished trainer has received the same core time so "
        "far (they all ran at the same share); the next one needs its work minus that, at the current share. Then "
        "R drops by one.",
        "R counts the background processes too, and never a finished trainer (nor one with no work to do). Which "
        "finish does the all-reduce wait for? The fixed share is one share for everyone, the whole time.",
    ),
)


# ---------------------------------------------------------------------------------------
# Exercise 5: join_step
# ---------------------------------------------------------------------------------------

JS = "join_step"
#: the writer recorded for a write no learner process made: the dead attempt's rank 0's last
#: welcomes, landing after the next attempt's rank 0 took its number
LATE = -1


class _Spin(Exception):
    """Raised by the store when one call uses it more often than one poll needs."""


@dataclass
class JoinProc:
    """One process of one start: its rank, the attempt number it must join, its memory."""

    pid: int
    start: int  # the launch's starts, counted 1, 2, ...
    attempt: int  # the number its rank 0 takes: one more than the earlier ranks 0 that took one
    rank: int
    me: dict[str, Any]
    result: tuple[str, int] | None = None
    polls: int = 0
    reads: list[tuple[Any, Any, int | None]] = field(default_factory=list)  # (key, value, writer pid)
    looked: set[Any] = field(default_factory=set)  # keys tested with `in`
    writes: list[tuple[Any, Any]] = field(default_factory=list)

    def posted(self) -> list[Any]:
        """The nonces this process posted at its join key, in order."""
        return [value for key, value in self.writes if key == f"join/{self.rank}"]


class JoinStore(dict[Any, Any]):
    """The launch's store as the grader plays it: a dict that remembers who wrote each key,
    records what the process being polled reads and writes, and refuses a call that uses it
    more than ``cap`` times (a call that waits inside itself)."""

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.writer: dict[Any, int] = {}
        self.proc: JoinProc | None = None
        self.ops = 0
        self.spun = False

    def _tick(self) -> None:
        self.ops += 1
        if self.ops > self.cap:
            self.spun = True
            raise _Spin(f"one call used the store more than {self.cap} times")

    def _seen(self, key: Any, value: Any) -> None:
        if self.proc is not None:
            self.proc.reads.append((key, value, self.writer.get(key)))

    def __getitem__(self, key: Any) -> Any:
        self._tick()
        value = dict.__getitem__(self, key)
        self._seen(key, value)
        return value

    def get(self, key: Any, default: Any = None) -> Any:
        self._tick()
        if not dict.__contains__(self, key):
            return default
        value = dict.__getitem__(self, key)
        self._seen(key, value)
        return value

    def __contains__(self, key: Any) -> bool:
        self._tick()
        if self.proc is not None:
            self.proc.looked.add(key)
        return dict.__contains__(self, key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._tick()
        dict.__setitem__(self, key, value)
        self.writer[key] = self.proc.pid if self.proc is not None else LATE
        if self.proc is not None:
            self.proc.writes.append((key, value))

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if not dict.__contains__(self, key):
            self[key] = default
        return self[key]

    def pop(self, key: Any, *default: Any) -> Any:
        self._tick()
        self.writer.pop(key, None)
        return dict.pop(self, key, *default)

    def __delitem__(self, key: Any) -> None:
        self._tick()
        self.writer.pop(key, None)
        dict.__delitem__(self, key)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __iter__(self) -> Iterator[Any]:
        self._tick()
        return iter(list(dict.keys(self)))

    def keys(self) -> Any:
        self._tick()
        return list(dict.keys(self))

    def items(self) -> Any:
        self._tick()
        return list(dict.items(self))

    def values(self) -> Any:
        self._tick()
        return list(dict.values(self))

    def peek(self, key: Any, default: Any = None) -> Any:
        """``key``'s value read by the grader (not recorded, not counted)."""
        return dict.get(self, key, default)


@dataclass(frozen=True)
class JoinScenario:
    """A launch of ``world_size`` ranks started ``starts`` times. ``orders[a]`` is the order in
    which start ``a``'s ranks are polled (a dead start stops after it; the last start then goes
    round robin); without ``orders``, a random order, each dead start killed after a random number
    of polls. ``linger``: a dead start's rank 0 that had not joined is still polled once the next
    rank 0 took its number (a process being killed); ``late``: the dead rank 0's last welcomes
    land then too."""

    world_size: int
    starts: int
    seed: int = 0
    orders: tuple[tuple[int, ...], ...] = ()
    linger: bool = False
    late: bool = False

    def text(self) -> str:
        restarts = self.starts - 1
        extra = [w for w, on in (("the dead rank 0 lingering", self.linger), ("its late welcomes", self.late)) if on]
        return (
            f"{self.world_size} ranks, "
            + ("no restart" if not restarts else f"{restarts} restart{'' if restarts == 1 else 's'}")
            + (f", {' and '.join(extra)}" if extra else "")
            + ("" if self.orders else f", seed {self.seed}")
        )


@dataclass
class JoinRun:
    """What :func:`simulate_joins` saw: the first violation (or ""), and every process."""

    violation: str = ""
    procs: list[JoinProc] = field(default_factory=list)
    late_welcomes: int = 0  # the dead rank 0's welcomes that landed late
    refused: int = 0  # welcomes into an older attempt read by a rank of a newer one
    stepped_aside: int = 0  # dead starts' ranks 0 that stepped aside


JoinFn = Callable[[JoinStore, dict[str, Any]], Any]


def _stale_reason(proc: JoinProc, n: int, dead: set[int], procs: list[JoinProc]) -> str:
    """Why ``proc`` joined the older attempt ``n``: the read that handed it ``n``."""
    mine = set(proc.posted())
    reused = mine & {v for q in procs if q.pid in dead for v in q.posted()}
    handed = [(key, writer) for key, value, writer in proc.reads if value == n and not isinstance(value, bool)]
    for key, _ in reversed(handed):
        if isinstance(key, str) and key.startswith("welcome/") and key[len("welcome/") :] in reused:
            return (
                f"it waited at {key}, but its nonce {key[len('welcome/') :]!r} was not fresh: a dead attempt's rank "
                "posted it too, and that attempt's welcome answered; take every nonce from me['fresh']()"
            )
    for key, _ in reversed(handed):
        if isinstance(key, str) and key.startswith("welcome/") and key[len("welcome/") :] in mine:
            return (
                f"it accepted {key} = {n}, a welcome from the dead attempt's rank 0, without checking that {n} is "
                "still the newest number (`attempts`): refuse it, post a fresh nonce and wait again"
            )
    for key, writer in reversed(handed):
        if key != "attempts" and (writer == LATE or writer in dead):
            return (
                f"it read {key!r}, which a dead attempt wrote: wait only at a key no earlier process can have "
                "written, welcome/<a nonce of its own from me['fresh']()>"
            )
    if any(key == "attempts" for key, _ in handed):
        return (
            "it took the number from `attempts` itself, before its own rank 0 had taken the next one: only "
            "rank 0 takes the number; every other rank learns it from rank 0's welcome"
        )
    return "its number must come from its own rank 0's welcome, checked against `attempts`"


def _unfinished_reason(run: JoinRun, store: JoinStore, n: int) -> str:
    """Why the newest attempt did not finish joining, read off the store and the processes."""
    procs = [p for p in run.procs if p.start == max(q.start for q in run.procs)]
    rank0 = next(p for p in procs if p.rank == 0)
    bumps = [value for key, value in rank0.writes if key == "attempts"]
    if len(bumps) > 1:
        return (
            f"rank 0 wrote `attempts` {len(bumps)} times ({short_repr(bumps)}): it takes the next number once, at its "
            "first call, and keeps it in `me`"
        )
    welcomed = {
        key[len("welcome/") :] for key, _ in rank0.writes if isinstance(key, str) and key.startswith("welcome/")
    }
    for p in procs:
        if p.rank == 0 or p.result is not None:
            continue
        posted = p.posted()
        if not posted:
            return f"rank {p.rank} never posted a nonce at join/{p.rank}, so rank 0 could not welcome it"
        welcome = store.peek(f"welcome/{posted[-1]}")
        if welcome is not None and welcome != n:
            return (
                f"rank {p.rank} read welcome/{posted[-1]} = {welcome}, a welcome into an older attempt, and kept "
                f"waiting on it: post a fresh nonce at join/{p.rank} and wait for the new one's welcome"
            )
        old = {v for q in run.procs if q.start < p.start and q.rank == p.rank for v in q.posted()}
        if welcome is None and welcomed & old:
            return (
                f"rank 0 welcomed the nonce the dead attempt's rank {p.rank} left at join/{p.rank}, never rank "
                f"{p.rank}'s new one: welcome every new nonce that appears at join/{p.rank} (remember the nonce you "
                "welcomed, not only the rank)"
            )
    if rank0.result is None and all(p.result is not None for p in procs if p.rank):
        return f"every other rank confirmed at ready/{n}/k, but rank 0 never joined"
    return f"rank(s) {sorted(p.rank for p in procs if p.result is None)} still waiting"


def simulate_joins(fn: JoinFn, sc: JoinScenario, *, poll: Callable[..., Any] | None = None) -> JoinRun:
    """Start the ranks ``sc.starts`` times, poll them (``fn(store, me)``, one call at a time) and
    check as it goes: a process joins its own attempt's number (1, 2, ... in the order of the
    starts) and never an older or a dead one; a rank 0 joins only once every rank of its attempt
    confirmed at ``ready/n/k``; a dead start's rank 0 steps aside at its first poll after the next
    number was taken; the last start finishes joining within a bounded number of polls.
    ``poll(fn, store, proc, what)`` makes one call (default: the learner's, normalised)."""
    rng = random.Random(sc.seed)
    W = sc.world_size
    store = JoinStore(cap=24 + 8 * W)
    run = JoinRun()
    nonces = itertools.count()
    pids = itertools.count(1)
    poll = poll or _js_poll

    def fresh() -> str:
        return f"nonce-{next(nonces)}"

    lingering: JoinProc | None = None
    for start in range(1, sc.starts + 1):
        last = start == sc.starts
        # a start whose rank 0 was killed before its first call took no number
        attempt = 1 + sum(1 for p in run.procs if p.rank == 0 and p.polls)
        procs = [
            JoinProc(next(pids), start, attempt, r, {"rank": r, "world_size": W, "fresh": fresh}) for r in range(W)
        ]
        run.procs += procs
        dead = {p.pid for p in run.procs if p.start < start}
        what = f"{JS}, start {start} (attempt {attempt}) of {sc.text()}"
        if sc.orders:
            order = list(sc.orders[start - 1]) if start <= len(sc.orders) else []
            extra = (30 + 12 * W) * W if last else 0
            order += [i % W for i in range(extra)]
        else:
            n_polls = (30 + 12 * W) * W if last else rng.randint(0, 5 * W)
            order = [rng.randrange(W) for _ in range(n_polls)]
        late_pending = sc.late and start > 1
        for r in order:
            taken = store.peek("attempts", 0) == attempt  # this start's rank 0 took its number
            if taken and lingering is not None and lingering.result is None and (sc.orders or rng.random() < 0.5):
                got = poll(fn, store, lingering, f"{what} (the dead start's rank 0)")
                newest = store.peek("attempts", 0)
                if got is None or got[0] != "superseded":
                    run.violation = (
                        f"{what}: rank 0 of attempt {lingering.attempt} went on ({short_repr(got)}) after attempt "
                        f"{newest} had started: compare `attempts` with your number first, at every call, and step "
                        "aside, ('superseded', newest)"
                    )
                    return run
                if got[1] != newest:
                    run.violation = f"{what}: ('superseded', {got[1]}); expected the newest number, {newest}"
                    return run
                lingering.result = got
                run.stepped_aside += 1
            if taken and late_pending and (sc.orders or rng.random() < 0.3):
                for p in procs:  # the dead rank 0's last welcomes: to whatever nonces it saw
                    if p.rank and p.result is None and p.posted():
                        dict.__setitem__(store, f"welcome/{p.posted()[-1]}", attempt - 1)
                        store.writer[f"welcome/{p.posted()[-1]}"] = LATE
                        run.late_welcomes += 1
                late_pending = False
            if all(p.result is not None for p in procs):
                break
            proc = procs[r]
            if proc.result is not None:
                continue
            before = len(proc.reads)
            got = poll(fn, store, proc, f"{what}, rank {r}")
            run.refused += any(
                isinstance(k, str) and k.startswith("welcome/") and v != attempt and w in (*dead, LATE)
                for k, v, w in proc.reads[before:]
            )
            if got is None:
                continue
            proc.result = got
            kind, n = got
            if kind == "superseded":
                run.violation = (
                    f"{what}: rank {r} returned ('superseded', {n}) although its attempt, {attempt}, is the newest"
                    + ("" if r == 0 else " (only a rank 0 steps aside)")
                )
                return run
            if n < attempt:
                run.violation = (
                    f"{what}: rank {r} joined attempt {n}, an older one: {_stale_reason(proc, n, dead, run.procs)}"
                )
                return run
            if n > attempt:
                run.violation = (
                    f"{what}: rank {r} joined attempt {n}, not {attempt}: rank 0 takes the next number once, at its "
                    "first call (`attempts` + 1), so the numbers count the starts whose rank 0 ran: 1, 2, ..."
                )
                return run
            if r == 0:
                for k in range(1, W):
                    writer = store.writer.get(f"ready/{n}/{k}")
                    if writer != procs[k].pid:
                        run.violation = (
                            f"{what}: rank 0 joined attempt {n} before rank {k} of it had confirmed at "
                            f"ready/{n}/{k}: only ready/{n}/{k} says that rank {k} of this attempt joined (join/{k} "
                            "may still hold the nonce of a dead attempt's rank)"
                        )
                        return run
                if store.peek("attempts") != n:
                    run.violation = (
                        f"{what}: rank 0 joined attempt {n} but `attempts` holds {short_repr(store.peek('attempts'))}: "
                        "rank 0 takes its number in the counter `attempts` (the other ranks check welcomes against it)"
                    )
                    return run
        if last and any(p.result is None for p in procs):
            run.violation = (
                f"{what}: attempt {attempt} did not finish joining after {len(order)} calls: "
                f"{_unfinished_reason(run, store, attempt)}"
            )
            return run
        rank0 = procs[0]
        lingering = rank0 if sc.linger and rank0.result is None and rank0.polls else None
    return run


def _js_poll(fn: JoinFn, store: JoinStore, proc: JoinProc, what: str) -> tuple[str, int] | None:
    """One call of the learner's ``join_step`` for ``proc``, normalised, or a failure naming what
    is wrong with it."""
    store.proc, store.ops = proc, 0
    proc.polls += 1
    try:
        got = call(fn, store, proc.me)
    except LearnerError as exc:
        if store.spun or isinstance(exc.error, _Spin):
            fail(
                f"{what}: one call used the store more than {store.cap} times: a call must not wait for anything "
                "(nothing in the store changes during one call); return None and look again at the next call"
            )
        raise
    finally:
        store.proc = None
    if store.spun:
        fail(f"{what}: one call used the store more than {store.cap} times: return None instead of waiting")
    if got is None:
        return None
    if (
        not isinstance(got, tuple | list)
        or len(got) != 2
        or got[0] not in ("joined", "superseded")
        or as_int(got[1]) is None
    ):
        fail(f"{what} returned {short_repr(got)}; expected None, ('joined', n) or ('superseded', newest)")
    return str(got[0]), int(got[1])


def _js_check(fn: JoinFn, scenarios: Iterable[JoinScenario]) -> None:
    for sc in scenarios:
        run = simulate_joins(fn, sc)
        if run.violation:
            fail(run.violation)


#: Hand-made launches of 3 ranks: the orders of the polls, start by start.
KNOWN_JOINS: tuple[JoinScenario, ...] = (
    # a fresh start, the other ranks first: they post their nonces and wait; rank 0 takes number 1
    JoinScenario(3, 1, orders=((1, 2, 1, 2, 0, 1, 2, 0),)),
    # every rank of start 1 joined; start 2's ranks 1 and 2 poll before its rank 0 has taken number 2,
    # with every key of attempt 1 still in the store
    JoinScenario(3, 2, orders=((1, 2, 0, 1, 2, 0), (1, 2, 1, 2, 1, 2, 0, 1, 2, 0))),
    # start 1 died before rank 2 posted anything; at start 2, join/1 still holds the dead rank 1's nonce
    # when rank 0 first looks
    JoinScenario(3, 2, orders=((1, 0, 1), (0, 0, 2, 1, 0, 1, 2, 0))),
    # three starts, each killed after a few polls, the last one's rank 0 first
    JoinScenario(3, 3, orders=((0, 1), (2, 1, 0), (0, 1, 2, 0, 1, 2, 0))),
)

#: Launches with the dead rank 0 still running, and its last welcomes landing late.
LATE_JOINS: tuple[JoinScenario, ...] = (
    JoinScenario(3, 2, orders=((1, 2, 0), (1, 2, 0, 1, 2, 0, 1, 2)), linger=True, late=True),
    JoinScenario(2, 2, orders=((0, 1), (1, 0, 1, 0, 1)), linger=True, late=True),
    JoinScenario(4, 3, orders=((3, 0, 1), (1, 2, 3, 0, 1), (3, 2, 1, 0, 1, 2, 3)), linger=True, late=True),
)

#: Random launches: 2 to 4 ranks, 1 to 3 restarts, kills after a random number of polls.
RANDOM_JOINS: tuple[JoinScenario, ...] = tuple(
    JoinScenario(2 + seed % 3, 2 + seed % 3 if seed % 4 else 1, seed=seed, linger=seed % 2 == 0, late=seed % 3 != 1)
    for seed in range(36)
)


@check_case("a fresh start and hand-made restarts (the dead attempt's keys in the store, the new rank 0 late)")
def _js_known(fn: JoinFn) -> None:
    _js_check(fn, KNOWN_JOINS)


@check_case("a welcome from the dead attempt's rank 0 is refused; the dead rank 0 steps aside")
def _js_late(fn: JoinFn) -> None:
    _js_check(fn, LATE_JOINS)


@check_case(
    "random launches (2-4 ranks, up to 3 restarts, kills mid-join): every rank joins its own attempt, none an older "
    "one, within a bounded number of calls"
)
def _js_random(fn: JoinFn) -> None:
    _js_check(fn, RANDOM_JOINS)


def reference_join_step(
    store: dict[str, Any],
    me: dict[str, Any],
    *,
    number_from_store: bool = False,
    fixed_key: bool = False,
    trust_welcome: bool = False,
    join_is_ready: bool = False,
    welcome_rank_once: bool = False,
    never_step_aside: bool = False,
) -> tuple[str, int] | None:
    """The protocol, written as a table of phases (the tests drive it through the simulation; the
    switches compute known slips, which the simulation must catch with their messages)."""
    phase = me.setdefault("phase", "start")
    rank = me["rank"]
    if rank == 0:
        if phase == "start":
            me["n"] = store.get("attempts", 0) + 1
            store["attempts"] = me["n"]
            me["phase"], me["sent"] = "welcoming", {}
        n = me["n"]
        newest = store.get("attempts", 0)
        if newest > n and not never_step_aside:
            return ("superseded", newest)
        done = 0
        for k in range(1, me["world_size"]):
            if (f"join/{k}" if join_is_ready else f"ready/{n}/{k}") in store:
                done += 1
                continue
            nonce = store.get(f"join/{k}")
            seen = me["sent"].get(k)
            if nonce is None or (seen is not None if welcome_rank_once else seen == nonce):
                continue
            store[f"welcome/{k}" if fixed_key else f"welcome/{nonce}"] = n
            me["sent"][k] = nonce
        return ("joined", n) if done == me["world_size"] - 1 else None
    if number_from_store:
        n = store.get("attempts", 0)
        if n < 1:
            return None
        store[f"ready/{n}/{rank}"] = "-"
        return ("joined", n)
    if phase == "start" or phase == "refused":
        me["nonce"], me["phase"] = me["fresh"](), "waiting"
        store[f"join/{rank}"] = me["nonce"]
        return None
    n = store.get(f"welcome/{rank}" if fixed_key else f"welcome/{me['nonce']}")
    if n is None:
        return None
    if not trust_welcome and n != store.get("attempts", 0):
        me["phase"] = "refused"
        return None
    store[f"ready/{n}/{rank}"] = me["nonce"]
    return ("joined", n)


#: The slips of :func:`reference_join_step`, and a fragment of the message each must get.
JS_SLIPS: dict[str, tuple[dict[str, bool], str]] = {
    "number_from_store": (dict(number_from_store=True), "took the number from `attempts` itself"),
    "fixed_key": (dict(fixed_key=True), "which a dead attempt wrote"),
    "trust_welcome": (dict(trust_welcome=True), "without checking"),
    "join_is_ready": (dict(join_is_ready=True), "only ready/"),
    "welcome_rank_once": (dict(welcome_rank_once=True), "remember the nonce you welcomed"),
    "never_step_aside": (dict(never_step_aside=True), "step aside"),
}


JOIN_STEP = Exercise(
    name=JS,
    points=20,
    title="agreeing on the attempt after a restart: one non-blocking call of the store protocol",
    checks=(_js_known, _js_late, _js_random),
    advice="as one non-blocking call on the dict store, with the keys the statement names",
    hints=(
        "One call makes one move and returns. Keep in `me` what a later call needs (rank 0: its number, and per "
        "rank the nonce it welcomed; another rank: its current nonce); a first call is one that finds that memory "
        "still empty.",
        "Rank 0 takes its number at its first call only, and at every call compares `attempts` with it before "
        "anything else. Another rank returns None for as long as the welcome key of its own nonce is absent.",
        "Welcome per nonce, not per rank: join/k may first hold the nonce the dead attempt's rank k left, which the "
        "new rank k's nonce replaces later; count rank k as joined only by ready/n/k. A rank that reads a welcome "
        "whose number is not `attempts` takes a fresh nonce, posts it at its join key and waits again.",
    ),
)


EXERCISES: tuple[Exercise, ...] = (
    ASSIGN_ROLES,
    COLOCATED_SYNC_UPDATE,
    RESTART_ACCOUNTING,
    TRAINERS_FINISH,
    JOIN_STEP,
)
