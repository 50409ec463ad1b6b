"""Lesson 11's graded exercises: the capstone job's three small decisions and its loss (11.1).

The learner writes:

* ``assign_roles(rank, world_size, n_trainers) -> dict``  (role, index within the role, process groups)
* ``sync_and_admit(announced, consumed, version, k, max_lag, B) -> (version, may_start)``  (the handshake)
* ``restart_accounting(generated, resumed_from, final_step, B) -> dict``  (the ledger after restores)
* ``data_parallel_losses(shards, clip_c) -> [loss per shard]``  (11.1: the global token count)

The checks never call ``course_lib.capstone``: they compare with the oracles below, each
written a different way from the statement's rule. The roles oracle hands the ranks out
one by one; the handshake oracle states the bound as a lag (``floor(k / B) - consumed / B <=
max_lag``) and a small event simulation (trainer 0 publishing, two generators, random
interleavings) checks the lag guarantee, monotone versions and progress on the learner's
own decisions; the accounting oracle simulates runs attempt by attempt (checkpoints as
copies of the update history, a corrupt newest checkpoint sometimes skipped) and reads the
truth off the final history; the data-parallel loss is checked against lesson 07's (07.2)
written for the whole batch in one process (torch autograd), and its slips are computed
shard by shard, while course_lib's own losses (``pipeline_loss``, ``truncated_is_loss``,
``capstone.trainer.shard_loss``) are replaced by tripwires, so an answer that calls them is
named. Each oracle takes keyword switches that compute a known slip, so a wrong answer that
matches one is named.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

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
from course_lib.course.grading.helpers import assert_raises, assert_scalar_tensor

LESSON = "11_capstone"


def _int(value: Any) -> int | None:
    """``value`` as an int if it is an integer (not a bool), else None."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        return None
    return int(value)


def _other_than_value_error(what: str) -> Callable[[Exception], str]:
    return lambda exc: f"{what} raised {type(exc).__name__}; expected ValueError"


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
    out: dict[str, Any] = {"role": got["role"], "index": _int(got["index"])}
    if out["role"] not in ("trainer", "generator"):
        fail(f"{what}: role is {short_repr(got['role'])}; expected 'trainer' or 'generator'")
    if out["index"] is None:
        fail(f"{what}: index is {describe_type(got['index'])}; expected an int")
    for key in ("trainer_group", "sync_group"):
        members = got[key]
        if not isinstance(members, list | tuple | range) or any(_int(m) is None for m in members):
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
        assert_raises(
            ValueError,
            fn,
            rank,
            world_size,
            n_trainers,
            other_error=_other_than_value_error(what),
            no_error=f"{what} returned; expected ValueError ({why}: an impossible layout)",
        )


ASSIGN_ROLES = Exercise(
    name=AR,
    points=10,
    title="a rank's role, its index within the role and the process groups' members",
    checks=(_ar_known, _ar_oracle, _ar_properties, _ar_bad),
    hints=(
        "check the three impossible cases first; then rank < n_trainers decides the role",
        "a generator's index is its distance from the first generator: rank - n_trainers",
        "list(range(n_trainers)) and [0] + list(range(n_trainers, world_size)) do not depend on rank: "
        "that is what makes them the same on every rank",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: sync_and_admit
# ---------------------------------------------------------------------------------------

SA = "sync_and_admit"


def naive_handshake(
    announced: int,
    consumed: int,
    version: int,
    k: int,
    max_lag: int,
    B: int,
    *,
    pull_any: bool = False,
    never_pull: bool = False,
    one_group_over: bool = False,
    one_update_short: bool = False,
    from_announced: bool = False,
    needs_weights: bool = True,
) -> tuple[int, bool]:
    """The handshake written as a lag: hold the newest version seen; group ``k`` (trained on by
    update ``k // B``) may start if that update is at most ``max_lag`` after the ``consumed / B``
    updates already done. The switches compute known slips."""
    newer = announced != version if pull_any else announced > version
    hold = announced if newer and not never_pull else version
    lag = k // B - (max(announced, -1) if from_announced else consumed // B)
    admitted = lag <= max_lag - (1 if one_update_short else 0)
    if one_group_over and k == consumed + (max_lag + 1) * B:
        admitted = True
    return hold, bool(admitted and (hold >= 0 or not needs_weights))


SA_SLIPS: dict[str, dict[str, Any]] = {
    "pulled an older version: pull only when announced > version (a generator may hold a newer one than "
    "the announcement it read)": dict(pull_any=True),
    "never pulls: when announced > version, load the announced version before the next decoding step": dict(
        never_pull=True
    ),
    "off by one in the backpressure bound: k < consumed + (max_lag + 1) * B, strictly (group k = the bound "
    "would lag max_lag + 1 updates)": dict(one_group_over=True),
    "the backpressure bound is too tight: k < consumed + (max_lag + 1) * B (with max_lag = 0 nothing could "
    "ever start)": dict(one_update_short=True),
    "the backpressure bound counts from consumed (read in the same snapshot), not from the announced "
    "version: k < consumed + (max_lag + 1) * B": dict(from_announced=True),
    "started a group with no weights yet (version -1): wait for the first announced version": dict(needs_weights=False),
}


def _sa_answer(fn: Callable[..., Any], *args: int) -> tuple[int, bool]:
    what = f"{SA}{args}"
    got = call(fn, *args)
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{what} returned {describe_type(got)}; expected a tuple (version, may_start)")
    hold, start = _int(got[0]), got[1]
    if hold is None:
        fail(f"{what}: the version is {describe_type(got[0])}; expected an int")
    if not isinstance(start, bool | np.bool_):
        fail(f"{what}: may_start is {describe_type(start)}; expected a bool")
    assert hold is not None
    return hold, bool(start)


#: Small snapshots on which a wrong answer is matched against every slip as a whole.
PROBES = tuple(
    (announced, updates * B, version, k, max_lag, B)
    for B in (1, 2)
    for max_lag in (0, 1)
    for updates in (0, 1, 2)
    for announced in range(-1, 4)
    for version in range(-1, 4)
    for k in range(updates * B, (updates + max_lag + 2) * B + 1)
)


def _sa_compare(fn: Callable[..., Any], *args: int) -> None:
    """The learner against the oracle at ``args``; a mismatch is named by the slip that agrees
    with the learner on every probe (else the first that agrees here)."""
    got, want = _sa_answer(fn, *args), naive_handshake(*args)
    if got == want:
        return
    here = {m: s for m, s in SA_SLIPS.items() if naive_handshake(*args, **s) == got}
    if here:
        answers = {p: _sa_answer(fn, *p) for p in PROBES}
        for message, slip in here.items():
            if all(naive_handshake(*p, **slip) == answers[p] for p in PROBES):
                fail(f"{SA}{args} = {got}: {message}")
        fail(f"{SA}{args} = {got}: {next(iter(here))}")
    fail(f"{SA}{args} = {got}; expected {want}")


@check_case("hand-made snapshots: no weights yet, the first version, groups at the bound, a newer version held")
def _sa_known(fn: Callable[..., Any]) -> None:
    cases = {
        (-1, 0, -1, 0, 1, 4): (-1, False),  # nothing announced: no weights, nothing starts
        (0, 0, -1, 0, 1, 4): (0, True),  # the first version: pull it, start group 0
        (0, 0, 0, 7, 1, 4): (0, True),  # the last group max_lag = 1 allows before any update
        (0, 0, 0, 8, 1, 4): (0, False),  # group 8 is trained on by update 2
        (1, 4, 0, 8, 1, 4): (1, True),  # one update later: pull 1, group 8 may start
        (2, 8, 3, 12, 1, 4): (3, True),  # holding a newer version than announced: keep it
        (3, 12, 3, 12, 0, 4): (3, True),  # synchronous: groups 12..15 with version 3
        (3, 12, 3, 16, 0, 4): (3, False),
        (5, 10, 2, 11, 0, 2): (5, True),
    }
    for args, want in cases.items():
        _sa_compare(fn, *args)
        got = _sa_answer(fn, *args)
        if got != want:  # the oracle agrees with these by construction; this names them in order
            fail(f"{SA}{args} = {got}; expected {want}")


@check_case("every small snapshot against the bound written as a lag, floor(k/B) - consumed/B")
def _sa_oracle(fn: Callable[..., Any]) -> None:
    for B in (1, 2, 3):
        for max_lag in (0, 1, 2):
            for updates in (0, 1, 3):
                consumed = updates * B
                for announced in range(-1, 5):
                    for version in range(-1, 5):
                        for k in range(consumed, consumed + (max_lag + 2) * B + 1):
                            _sa_compare(fn, announced, consumed, version, k, max_lag, B)


@dataclass
class _Gen:
    version: int = -1
    waiting_for: int | None = None  # a version being received (broadcast: until it is sent)
    ticket: int | None = None
    active: tuple[int, int, int] | None = None  # (k, start version, decode steps left)


@dataclass
class HandshakeRun:
    """What :func:`simulate_handshake` saw: the first violation (or ""), and whether it finished."""

    violation: str = ""
    finished: bool = False
    start_version: dict[int, int] = field(default_factory=dict)


TRAINER_ORDERS = {
    "broadcast": ("announce", "send", "consumed"),  # receivers must know to join the collective first
    "shared_buffer": ("send", "announce", "consumed"),  # the weights are in the buffer when announced
}


def simulate_handshake(
    decide: Callable[..., Any],
    *,
    seed: int,
    max_lag: int,
    B: int,
    channel: str = "broadcast",
    order: tuple[str, ...] | None = None,
    n_updates: int = 6,
    n_generators: int = 2,
    max_events: int = 4000,
) -> HandshakeRun:
    """A tiny event simulation of trainer 0 and the generators, one random actor an event.

    The trainer waits for update ``u``'s groups, trains, then publishes ``u + 1`` in
    ``order`` (one move an event). A generator takes a snapshot ``(announced, consumed)``
    and asks ``decide`` (the learner's function); a pull takes the generator's next event:
    a broadcast blocks until that version is sent, a shared-buffer read gets whatever the
    buffer holds by then (maybe newer than announced). Otherwise it starts its ticket's
    group or decodes one step. Each group is
    checked when trained on: its lag ``update - start version`` must not exceed ``max_lag``.
    """
    rng = random.Random(seed)
    steps = order or TRAINER_ORDERS[channel]
    store = {"announced": -1, "consumed": 0}
    sent = -1
    pending = [(move, 0) for move in steps]  # version 0: the warm start
    next_k, trained = 0, 0
    handed: dict[int, int] = {}  # k -> start version
    gens = [_Gen() for _ in range(n_generators)]
    run = HandshakeRun(start_version=handed)
    for _ in range(max_events):
        actor = rng.randrange(n_generators + 1)
        if actor == n_generators:  # trainer 0
            if pending:
                move, v = pending.pop(0)
                if move == "announce":
                    store["announced"] = v
                elif move == "send":
                    sent = v
                else:
                    store["consumed"] = v * B
            elif trained < n_updates and all(k in handed for k in range(trained * B, (trained + 1) * B)):
                for k in range(trained * B, (trained + 1) * B):
                    if trained - handed[k] > max_lag:
                        run.violation = (
                            f"group {k} was started with version {handed[k]} and trained on by update {trained}: "
                            f"it lags {trained - handed[k]} > max_lag = {max_lag} updates"
                        )
                        return run
                trained += 1
                pending = [(move, trained) for move in steps]
            elif trained == n_updates and not pending:
                run.finished = True
                return run
            continue
        g = gens[actor]
        if g.waiting_for is not None:  # a pull takes an event of its own
            if channel == "shared_buffer":  # whatever the buffer holds now: maybe newer than announced
                g.version, g.waiting_for = max(sent, g.waiting_for), None
            elif sent >= g.waiting_for:  # a broadcast: done once the trainer has sent that version
                g.version, g.waiting_for = g.waiting_for, None
            continue
        if g.ticket is None:
            g.ticket, next_k = next_k, next_k + 1
        announced, consumed = store["announced"], store["consumed"]
        hold, start = decide(announced, consumed, g.version, g.ticket, max_lag, B)
        if hold < g.version:
            run.violation = f"a generator holding version {g.version} went back to version {hold} (an older version)"
            return run
        if hold > max(announced, g.version):
            run.violation = f"a generator took version {hold}, never announced (announced = {announced})"
            return run
        if hold > g.version:
            g.waiting_for = hold
            continue  # the transfer first; decoding resumes after it
        if g.active is None and start:
            if g.version < 0:
                run.violation = f"a generator started group {g.ticket} with no weights (version -1)"
                return run
            g.active = (g.ticket, g.version, rng.randint(1, 3))
            g.ticket = None
        elif g.active is not None:
            k, v0, left = g.active
            g.active = (k, v0, left - 1) if left > 1 else None
            if left == 1:
                handed[k] = v0
    return run


def _learner_decide(fn: Callable[..., Any]) -> Callable[..., tuple[int, bool]]:
    return lambda *args: _sa_answer(fn, *args)


@check_case("a simulated run, both channels: no group lags more than max_lag, no version goes back, it finishes")
def _sa_simulation(fn: Callable[..., Any]) -> None:
    decide = _learner_decide(fn)
    for channel in TRAINER_ORDERS:
        for max_lag, B in ((0, 2), (1, 2), (2, 3)):
            for seed in range(4):
                run = simulate_handshake(decide, seed=seed, max_lag=max_lag, B=B, channel=channel)
                where = f"simulated run ({channel} channel, max_lag = {max_lag}, B = {B}, seed {seed})"
                if run.violation:
                    fail(f"{where}: {run.violation}")
                if not run.finished:
                    fail(
                        f"{where}: the run never finished (no group could start: the backpressure bound is too "
                        "tight, or the generators never take the new weights)"
                    )


@check_case("raises ValueError when max_lag < 0 or B < 1")
def _sa_bad(fn: Callable[..., Any]) -> None:
    for args in ((0, 0, 0, 0, -1, 4), (0, 0, 0, 0, 1, 0), (0, 0, 0, 0, 0, -2)):
        what = f"{SA}{args}"
        assert_raises(
            ValueError,
            fn,
            *args,
            other_error=_other_than_value_error(what),
            no_error=f"{what} returned; expected ValueError (max_lag >= 0 and B >= 1)",
        )


SYNC_AND_ADMIT = Exercise(
    name=SA,
    points=15,
    title="the weight-version handshake: pull a newer version, admit group k under the lag bound",
    checks=(_sa_known, _sa_oracle, _sa_simulation, _sa_bad),
    hints=(
        "two independent decisions: first the version (compare announced with version), then admission, "
        "using the version you will hold after the pull",
        "with max_lag = 0 and B = 4, after one update (consumed = 4) groups 4..7 may start and group 8 may not",
        "if announced > version: version = announced; then version >= 0 and k < consumed + (max_lag + 1) * B",
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
    updates, generates the groups of its updates plus some in flight, and dies."""
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
        if not isinstance(item, list | tuple) or len(item) != 2 or any(_int(x) is None for x in item):
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
    if not isinstance(samples, dict) or not set(names) <= set(samples) or any(_int(samples[n]) is None for n in names):
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
    hints=(
        "update u of the final run was done by the last attempt that resumed at or before it: "
        "max(a for a, s in enumerate(resumed_from) if s <= u)",
        "for each line, u = k // B: if u >= final_step the line is leftover (last attempt) or discarded (any other); "
        "otherwise it is consumed exactly when its attempt is the one that did update u",
        'collect (attempt, k) into three lists, add samples to the line\'s total and to "generated"; sort at the end',
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: data_parallel_losses
# ---------------------------------------------------------------------------------------

DP = "data_parallel_losses"
CLIP_C = 2.0
PROMPT = 2  # positions before each answer (mask False), as pad_groups lays a row out

Shard = dict[str, Any]


def dp_batch(seed: int, n_shards: int, *, ragged: bool = True) -> list[Shard]:
    """Random shards (one per trainer), each padded to its own longest row: a prompt of
    ``PROMPT`` positions, then an answer of 1-7 tokens, then padding; ratios crossing
    ``CLIP_C``; garbage behaviour log-probs outside the answers. With ``ragged`` (retried
    until so) the shards hold different token counts; else every shard holds the same."""
    import torch

    rng = np.random.default_rng(seed)
    while True:
        shards, counts = [], []
        lengths_all = (
            [rng.integers(1, 8, size=int(rng.integers(1, 4))) for _ in range(n_shards)]
            if ragged
            else [rng.permutation(np.array([2, 3, 5]))] * n_shards
        )
        for lengths in lengths_all:
            n, t = len(lengths), PROMPT + int(max(lengths)) + int(rng.integers(0, 2))
            logp_new = np.log(rng.uniform(0.05, 0.95, size=(n, t)))
            logp_mu = logp_new + rng.normal(0.0, 0.8, size=(n, t))
            mask = np.zeros((n, t), dtype=bool)
            for i, length in enumerate(lengths):
                mask[i, PROMPT : PROMPT + int(length)] = True
            logp_mu[~mask] = -50.0  # garbage: a weight of c wherever the mask is not applied
            counts.append(int(mask.sum()))
            shards.append(
                {
                    "logp_new": torch.tensor(logp_new, dtype=torch.float64),
                    "logp_behaviour": torch.tensor(logp_mu, dtype=torch.float64),
                    "adv": torch.tensor(rng.normal(size=n), dtype=torch.float64),
                    "mask": torch.tensor(mask),
                }
            )
        if not ragged or len(set(counts)) == n_shards:
            return shards


def whole_batch_loss(shards: list[Shard], c: float) -> tuple[float, list[NDArray[np.float64]]]:
    """The single-process reference: lesson 07's (07.2) on the whole batch (every shard's rows
    padded to one width), its value and its gradient, split back into the shards' rows."""
    import torch

    width = max(s["mask"].shape[1] for s in shards)

    def padded(key: str) -> Any:
        return torch.cat([torch.nn.functional.pad(s[key], (0, width - s[key].shape[1])) for s in shards])

    logp_new = padded("logp_new").detach().clone().requires_grad_(True)
    mask = padded("mask").to(torch.float64)
    adv = torch.cat([s["adv"] for s in shards])
    w = torch.clamp(torch.exp(logp_new.detach() - padded("logp_behaviour")), max=c)
    loss = -(w * adv[:, None] * logp_new * mask).sum() / mask.sum()
    (grad,) = torch.autograd.grad(loss, logp_new)
    out, row = [], 0
    for s in shards:
        n, t = s["mask"].shape
        out.append(grad[row : row + n, :t].numpy())
        row += n
    return float(loss.detach()), out


def naive_shard_losses(
    shards: list[Shard],
    c: float,
    *,
    local: bool = False,
    per_rank_mean: bool = False,
    no_sg: bool = False,
    padded_count: bool = False,
    unmasked_sum: bool = False,
    no_clip: bool = False,
) -> tuple[list[float], list[NDArray[np.float64]]]:
    """Each shard's term of (11.1), computed shard by shard (one "rank" at a time): the values
    and each shard's gradient with respect to its own ``logp_new``. The switches compute known
    slips, to name them in messages."""
    import torch

    global_count = sum(int(s["mask"].numel() if padded_count else s["mask"].sum()) for s in shards)
    values, grads = [], []
    for s in shards:
        logp_new = s["logp_new"].detach().clone().requires_grad_(True)
        m = s["mask"].to(torch.float64)
        ratio = torch.exp((logp_new if no_sg else logp_new.detach()) - s["logp_behaviour"])
        w = ratio if no_clip else torch.clamp(ratio, max=c)
        terms = w * s["adv"][:, None] * logp_new * (1.0 if unmasked_sum else m)
        if local:
            norm = m.sum()
        elif per_rank_mean:
            norm = m.sum() * len(shards)
        else:
            norm = torch.tensor(float(global_count), dtype=torch.float64)
        loss = -terms.sum() / norm
        (grad,) = torch.autograd.grad(loss, logp_new)
        values.append(float(loss.detach()))
        grads.append(grad.numpy())
    return values, grads


DP_SLIPS: dict[str, dict[str, Any]] = {
    "each shard divides by its own (local) token count: after the all-reduce a short shard's tokens weigh more; "
    "divide by the token count of the whole batch, all shards (11.1)": dict(local=True),
    "each shard's mean averaged over the ranks (n_local * n_ranks): with ragged shards a short shard's tokens "
    "still weigh more; divide by the whole batch's token count (11.1)": dict(per_rank_mean=True),
    "the gradient flows through the weight: sg[w] is a constant, compute the ratio from logp_new.detach()": dict(
        no_sg=True
    ),
    "the token count includes padding (and prompt) positions: count the real tokens, mask.sum(), over all shards": dict(
        padded_count=True
    ),
    "the sum runs over padded positions too: multiply every term by the mask": dict(unmasked_sum=True),
    "the weights are not truncated: w = min(c, pi/mu), torch.clamp(..., max=clip_c)": dict(no_clip=True),
}

#: course_lib's own implementations of the loss, which the learner's function must not call.
LIBRARY_LOSSES = (
    ("course_lib.pipeline.loss", "pipeline_loss"),
    ("course_lib.rl.importance", "truncated_is_loss"),
    ("course_lib.capstone.trainer", "shard_loss"),
)
LIBRARY_MESSAGE = (
    "calls course_lib's {name} (the library's answer): write the shard's term of (11.1) from its pieces "
    "(the weight, the advantage, the mask, the global count)"
)


class _LibraryCalled(Exception):
    pass


@contextlib.contextmanager
def _library_blocked(fn: Callable[..., Any]) -> Iterator[list[str]]:
    """Replace course_lib's loss functions (in every loaded ``course_lib`` module and in
    ``fn``'s globals) by tripwires while the block runs; yields the names that were called."""
    originals = {}
    for module, name in LIBRARY_LOSSES:
        if module.startswith("course_lib.capstone") and module not in sys.modules:
            continue  # heavy to import; a learner who imports it loads it inside the block, below
        obj = getattr(importlib.import_module(module), name, None)
        if obj is not None:
            originals[id(obj)] = (obj, name)
    called: list[str] = []

    def tripwire(name: str) -> Callable[..., Any]:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            called.append(name)
            raise _LibraryCalled(name)

        return blocked

    spaces = [vars(m) for n, m in list(sys.modules.items()) if n.startswith("course_lib") and m is not None]
    spaces.append(getattr(fn, "__globals__", {}))
    patched = []
    for space in spaces:
        for key, value in list(space.items()):
            if id(value) in originals and originals[id(value)][0] is value:
                patched.append((space, key, value))
                space[key] = tripwire(originals[id(value)][1])
    try:
        yield called
    finally:
        for space, key, value in patched:
            space[key] = value


def _dp_answer(fn: Callable[..., Any], shards: list[Shard], c: float) -> tuple[list[float], list[Any], list[Any]]:
    """The learner's losses on copies of ``shards``: (values, the losses, the fresh leaves)."""
    leaves = [s["logp_new"].detach().clone().requires_grad_(True) for s in shards]
    given = [
        {
            "logp_new": leaf,
            "logp_behaviour": s["logp_behaviour"].clone(),
            "adv": s["adv"].clone(),
            "mask": s["mask"].clone(),
        }
        for leaf, s in zip(leaves, shards, strict=True)
    ]
    what = f"{DP}({len(shards)} shards, clip_c={fmt_number(c)})"
    with _library_blocked(fn) as called:
        try:
            got = call(fn, given, c)
        except LearnerError:
            if called:
                fail(f"{what} {LIBRARY_MESSAGE.format(name=called[0])}")
            raise
    if called:
        fail(f"{what} {LIBRARY_MESSAGE.format(name=called[0])}")
    if not isinstance(got, list | tuple) or len(got) != len(shards):
        fail(f"{what} returned {describe_type(got)}; expected a list of {len(shards)} losses, one per shard")
    for r, loss in enumerate(got):
        assert_scalar_tensor(loss, what=f"{what}[{r}]", advice="one scalar loss per shard, keep the graph")
        if not loss.requires_grad:
            fail(f"{what}[{r}] does not require grad: compute it from the shard's logp_new (not a detached copy)")
    return [float(loss.detach()) for loss in got], list(got), leaves


def _dp_compare(fn: Callable[..., Any], shards: list[Shard], c: float = CLIP_C) -> None:
    """The learner's shard losses against the whole batch's (07.2): the values sum to its value,
    each shard's gradient is its rows of the whole batch's gradient; a known slip is named."""
    import torch

    values, losses, leaves = _dp_answer(fn, shards, c)
    counts = [int(s["mask"].sum()) for s in shards]
    what = f"{DP}(shards of {', '.join(map(str, counts))} tokens)"
    grads = []
    for r, loss in enumerate(losses):
        parts = torch.autograd.grad(loss, leaves, allow_unused=True, retain_graph=True)
        for s, part in enumerate(parts):
            if s != r and part is not None and bool(part.abs().max() > 0):
                fail(
                    f"{what}: shard {r}'s loss depends on shard {s}'s log-probs: a rank sees only its own shard "
                    "(the token count is all it shares)"
                )
        grads.append(np.zeros(leaves[r].shape) if parts[r] is None else parts[r].detach().numpy())
    want_value, want_grads = whole_batch_loss(shards, c)

    def close(a: list[Any], b: list[Any]) -> bool:
        return all(np.allclose(x, y, rtol=1e-7, atol=1e-10) for x, y in zip(a, b, strict=True))

    def right(vals: list[float], grs: list[Any]) -> bool:
        return math.isclose(sum(vals), want_value, rel_tol=1e-7, abs_tol=1e-10) and close(grs, want_grads)

    if right(values, grads):
        return
    for message, slip in DP_SLIPS.items():
        slip_values, slip_grads = naive_shard_losses(shards, c, **slip)
        if not right(slip_values, slip_grads) and close(values, slip_values) and close(grads, slip_grads):
            fail(f"{what}: {message}")
    if not math.isclose(sum(values), want_value, rel_tol=1e-7, abs_tol=1e-10):
        fail(
            f"{what}: the shards' losses sum to {sum(values):.6g}; expected {want_value:.6g}, "
            "the single-process loss (07.2) of the whole batch"
        )
    r = next(r for r, (g, h) in enumerate(zip(grads, want_grads, strict=True)) if not np.allclose(g, h, rtol=1e-7))
    fail(
        f"{what}: shard {r}'s gradient is not its rows of the whole batch's (07.2) gradient, "
        "so the all-reduced sum is not that gradient"
    )


@check_case("returns one scalar loss per shard, each requiring grad, written without course_lib's loss")
def _dp_shape(fn: Callable[..., Any]) -> None:
    _dp_answer(fn, dp_batch(0, 3), CLIP_C)


def worked_shards() -> list[Shard]:
    """The statement's example: shard 0 holds one answer of 3 tokens, shard 1 three answers of
    3 tokens (12 tokens in all); every weight 1 (on-policy)."""
    import torch

    def shard(advantages: list[float]) -> Shard:
        n = len(advantages)
        mask = torch.zeros(n, PROMPT + 3, dtype=torch.bool)
        mask[:, PROMPT:] = True
        logp = torch.log(torch.full((n, PROMPT + 3), 0.5, dtype=torch.float64))
        return {
            "logp_new": logp,
            "logp_behaviour": logp.clone(),
            "adv": torch.tensor(advantages, dtype=torch.float64),
            "mask": mask,
        }

    return [shard([1.0]), shard([1.0, -1.0, 0.5])]


@check_case("the worked example: shards of 3 and 9 tokens, every token's gradient -A / 12")
def _dp_known(fn: Callable[..., Any]) -> None:
    import torch

    shards = worked_shards()
    _dp_compare(fn, shards)
    _, losses, leaves = _dp_answer(fn, shards, CLIP_C)
    (grad,) = torch.autograd.grad(losses[0], leaves[0])
    got = float(grad[0, PROMPT])
    if not math.isclose(got, -1.0 / 12.0, rel_tol=1e-9):
        fail(f"{DP}: the gradient at shard 0's first token is {got:.6g}; expected -A / N_tok = -1/12")


@check_case("random ragged batches over 2, 3 and 4 shards: the shards' gradients and values sum to (07.2)'s")
def _dp_oracle(fn: Callable[..., Any]) -> None:
    for seed in range(6):
        _dp_compare(fn, dp_batch(seed, 2 + seed % 3))


@check_case("one shard is (07.2) itself; equal shards; padding values change nothing")
def _dp_properties(fn: Callable[..., Any]) -> None:
    import torch

    _dp_compare(fn, dp_batch(10, 1))
    _dp_compare(fn, dp_batch(11, 3, ragged=False))
    shards = dp_batch(12, 2)
    values, _, _ = _dp_answer(fn, shards, CLIP_C)
    moved = [
        dict(s, logp_behaviour=torch.where(s["mask"], s["logp_behaviour"], torch.tensor(7.0, dtype=torch.float64)))
        for s in shards
    ]
    again, _, _ = _dp_answer(fn, moved, CLIP_C)
    if not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(values, again, strict=True)):
        fail(f"{DP} changed when only the padding of logp_behaviour changed: apply the mask to every term")


DATA_PARALLEL_LOSSES = Exercise(
    name=DP,
    points=15,
    title="the data-parallel loss (11.1): each shard divides by the whole batch's token count",
    checks=(_dp_shape, _dp_known, _dp_oracle, _dp_properties),
    hints=(
        "two steps, as on the cluster: first the one number the trainers all-reduce, the real tokens of every "
        'shard, sum(int(s["mask"].sum()) for s in shards); then each shard\'s sum of sg[w] A log pi over its '
        "real tokens, divided by that number",
        "the weight is torch.clamp(torch.exp(logp_new.detach() - logp_behaviour), max=clip_c): .detach() is the "
        "sg[]; the advantage is per answer, adv[:, None] broadcasts it over the answer's tokens",
        "m = mask.to(logp_new.dtype); -(w * adv[:, None] * logp_new * m).sum() / n_tokens, with the same n_tokens "
        "for every shard",
    ),
)

EXERCISES: tuple[Exercise, ...] = (ASSIGN_ROLES, SYNC_AND_ADMIT, RESTART_ACCOUNTING, DATA_PARALLEL_LOSSES)
