"""Lesson 11's graded exercises: the capstone job's three small decisions, its loss (11.1) and
how the ranks of a restarted job agree on their attempt.

The learner writes:

* ``assign_roles(rank, world_size, n_trainers) -> dict``  (role, index within the role, process groups)
* ``sync_and_admit(announced, consumed, version, k, max_lag, B) -> (version, may_start)``  (the handshake)
* ``restart_accounting(generated, resumed_from, final_step, B) -> dict``  (the ledger after restores)
* ``data_parallel_losses(shards, clip_c) -> [loss per shard]``  (11.1: the global token count)
* ``join_step(store, me) -> None | ("joined", n) | ("superseded", newest)``  (one call of the attempt protocol)

What each exercise teaches, and how its checks see that mechanism (not only its values):

* assign_roles: mechanism: one comparison with n_trainers decides the role, the index counts within
  the role, and both groups are built without the rank (every rank passes new_group the same list);
  observed on every rank of every layout up to 10 ranks and by comparing the groups across ranks.
* sync_and_admit: mechanism: pull only forwards, then admit with the version held after the pull
  under k < consumed + (max_lag + 1) B; observed on every small snapshot and in an event simulation
  (both channels, a buffer newer than the announcement) that checks the lag of every trained group.
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
* data_parallel_losses: mechanism: every shard divides its sum by the one global count of real
  tokens, with sg[] on the truncated weight at the given c; observed through autograd (each shard's
  gradient, and none through another shard) on ragged batches at several c, with answers whose
  advantage is zero (they count in N_tok).
* join_step: mechanism: rank 0 takes the next number once and steps aside when a newer one exists;
  another rank waits at a key only it knows (a fresh nonce), checks the welcome against the newest
  number, and confirms at a key of its attempt; observed in launches played against a store that
  records who wrote each key (the dead attempt's keys, its lingering rank 0, its late welcomes).

The checks never call ``course_lib.capstone``: they compare with the oracles below, each
written a different way from the statement's rule. The roles oracle hands the ranks out
one by one; the handshake oracle states the bound as a lag (``floor(k / B) - consumed / B <=
max_lag``) and a small event simulation (trainer 0 publishing, two generators, random
interleavings) checks the lag guarantee, monotone versions and progress on the learner's
own decisions; the accounting oracle simulates runs attempt by attempt (checkpoints as
copies of the update history, a corrupt newest checkpoint sometimes skipped) and reads the
truth off the final history; the data-parallel loss is checked against lesson 07's (07.2)
written for the whole batch in one process (torch autograd), and its slips are computed
shard by shard; the attempt protocol is checked by the truth of the simulated launch (which
start each process belongs to), not by a reference implementation (``reference_join_step``,
written as a table of phases, is for the tests). Each oracle takes keyword switches that
compute a known slip, so a wrong answer that matches one is named.

The runner-wide guard (``grading.guard``) refuses an answer that names course_lib's losses;
lesson 11 keeps its own tripwires on ``pipeline_loss``, ``truncated_is_loss`` and
``capstone.trainer.shard_loss`` for the one case that guard cannot see: a loss fetched without
naming course_lib and called on the learner's behalf by another library's Python code (e.g.
``torch.utils.checkpoint.checkpoint``), which its call tracer attributes to that library.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import os
import random
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
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
from course_lib.course.grading.helpers import assert_scalar_tensor
from course_lib.course.grading.vocab import (
    as_int,
    assert_value_error,
    fail_on_violation,
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
    hints=(
        "Check the three impossible cases first; then one comparison, rank < n_trainers, decides the role.",
        "A generator's index is its distance from the first generator: rank - n_trainers.",
        "Every rank must build the very same group lists, whatever its own rank (a collective whose ranks disagree "
        "on the group hangs): which ranks exchange gradients, and which need the new weights and from whom? Return "
        "the four keys the statement names.",
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
    before_pull: bool = False,
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
    held = version if before_pull else hold  # the version admission looks at
    return hold, bool(admitted and (held >= 0 or not needs_weights))


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
    "decided may_start with the version held before this step's pull: pull first, then admit with the version "
    "you will hold (a fresh generator pulls version 0 and starts at once)": dict(before_pull=True),
}


def _sa_answer(fn: Callable[..., Any], *args: int) -> tuple[int, bool]:
    what = f"{SA}{args}"
    got = call(fn, *args)
    if not isinstance(got, tuple | list) or len(got) != 2:
        fail(f"{what} returned {describe_type(got)}; expected a tuple (version, may_start)")
    hold, start = as_int(got[0]), got[1]
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
                fail_on_violation(where, run)
                if not run.finished:
                    fail(
                        f"{where}: the run never finished (no group could start: the backpressure bound is too "
                        "tight, or the generators never take the new weights)"
                    )


@check_case("raises ValueError when max_lag < 0 or B < 1")
def _sa_bad(fn: Callable[..., Any]) -> None:
    for args in ((0, 0, 0, 0, -1, 4), (0, 0, 0, 0, 1, 0), (0, 0, 0, 0, 0, -2)):
        what = f"{SA}{args}"
        assert_value_error(
            fn, *args, what=what, no_error=returned_instead_of_value_error(what, "max_lag >= 0 and B >= 1")
        )


SYNC_AND_ADMIT = Exercise(
    name=SA,
    points=15,
    title="the weight-version handshake: pull a newer version, admit group k under the lag bound",
    checks=(_sa_known, _sa_oracle, _sa_simulation, _sa_bad),
    hints=(
        "Two independent decisions: first the version (compare announced with version), then admission, using the "
        "version you will hold after the pull.",
        "With max_lag = 0 and B = 4, after one update (consumed = 4) groups 4..7 may start and group 8 may not: it "
        "would be trained on by update 2, two versions after the one the generator holds.",
        "Versions only move forwards, and a generator holding no weights yet may start nothing. For admission, "
        "write (11.2) for one group index: which update will train on it, and how many updates past the consumed "
        "ones may that be? Validate `max_lag` and `B` first.",
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
    hints=(
        "each update u of the final run counts once, done by one attempt: of the attempts that could have "
        "done it (those that resumed at or before u), which one's work survived the restarts that followed?",
        "each line belongs to one update, the one that would train on its group; ask whether the final run still "
        "counts that update, and if so, whether this line's attempt is the one whose work on it survived",
        'collect (attempt, k) into three lists, add samples to the line\'s total and to "generated"; sort at the end',
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: data_parallel_losses
# ---------------------------------------------------------------------------------------

DP = "data_parallel_losses"
CLIP_C = 2.0
#: the truncations the random batches are checked at (the lesson's run uses CLIP_C)
CLIPS = (1.0, 1.5, 3.0, 1.2, 5.0, 2.0)
PROMPT = 2  # positions before each answer (mask False), as pad_groups lays a row out

Shard = dict[str, Any]


def dp_batch(seed: int, n_shards: int, *, ragged: bool = True) -> list[Shard]:
    """Random shards (one per trainer), each padded to its own longest row: a prompt of
    ``PROMPT`` positions, then an answer of 1-7 tokens, then padding; ratios crossing every
    clip in ``CLIPS``; garbage behaviour log-probs outside the answers; about a third of the
    answers (at least one) with a zero advantage, as GRPO gives every answer of a group whose
    rewards are all alike. With ``ragged`` (retried until so) the shards hold different token
    counts; else every shard holds the same."""
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
            for s in shards:
                s["adv"][torch.tensor(rng.random(len(s["adv"])) < 0.35)] = 0.0
            if all(bool(s["adv"].all()) for s in shards):
                shards[-1]["adv"][0] = 0.0  # an answer that carries no signal still counts in N_tok
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
    clip_at: float | None = None,
    signal_count: bool = False,
) -> tuple[list[float], list[NDArray[np.float64]]]:
    """Each shard's term of (11.1), computed shard by shard (one "rank" at a time): the values
    and each shard's gradient with respect to its own ``logp_new``. The switches compute known
    slips, to name them in messages."""
    import torch

    def real(s: Shard) -> Any:  # the tokens N_tok counts
        if padded_count:
            return torch.ones_like(s["mask"])
        return s["mask"] & (s["adv"] != 0)[:, None] if signal_count else s["mask"]

    global_count = sum(int(real(s).sum()) for s in shards)
    values, grads = [], []
    for s in shards:
        logp_new = s["logp_new"].detach().clone().requires_grad_(True)
        m = s["mask"].to(torch.float64)
        ratio = torch.exp((logp_new if no_sg else logp_new.detach()) - s["logp_behaviour"])
        w = ratio if no_clip else torch.clamp(ratio, max=c if clip_at is None else clip_at)
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
    "the weights are truncated at 2 whatever clip_c is: truncate at the clip_c argument (2 is only the value "
    "of the lesson's run)": dict(clip_at=CLIP_C),
    "the token count leaves out the answers with a zero advantage: N_tok counts every real token (07.2), those "
    "of answers that carry no signal too (a group whose rewards are all alike)": dict(signal_count=True),
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


_COURSE_LIB_DIR = str(Path(__file__).resolve().parents[3]) + os.sep
_INSTALLED_DIRS = tuple(
    sorted(
        {
            str(Path(path).resolve()) + os.sep
            for key in ("stdlib", "platstdlib", "purelib", "platlib")
            if (path := sysconfig.get_paths().get(key))
        }
    )
)


def _called_by_another_library() -> bool:
    """Whether the nearest caller outside course_lib (above the tripwire) is installed code
    (torch, the standard library): a call made on the learner's behalf, which the runner-wide
    guard's tracer does not see. False for the learner's own code."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_COURSE_LIB_DIR):
        frame = frame.f_back
    if frame is None or frame.f_code.co_filename.startswith("<"):
        return False
    return str(Path(frame.f_code.co_filename).resolve()).startswith(_INSTALLED_DIRS)


@contextlib.contextmanager
def _library_blocked(fn: Callable[..., Any]) -> Iterator[list[str]]:
    """Replace course_lib's loss functions (in every loaded ``course_lib`` module and in
    ``fn``'s globals) by tripwires while the block runs; yields the names that were called.

    Kept beside the runner-wide guard for what it cannot see, and for that only: a loss the
    learner fetched without naming course_lib and handed to another library's Python code to
    call (the guard's tracer attributes that call to the library; see the module docstring). A
    call from the learner's own code (directly, or through course_lib's own functions) goes
    through to the original: the runner-wide guard refuses it, with its own message."""
    originals = {}
    for module, name in LIBRARY_LOSSES:
        if module.startswith("course_lib.capstone") and module not in sys.modules:
            continue  # heavy to import; a learner who imports it loads it inside the block, below
        obj = getattr(importlib.import_module(module), name, None)
        if obj is not None:
            originals[id(obj)] = (obj, name)
    called: list[str] = []

    def tripwire(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            if not _called_by_another_library():
                return original(*args, **kwargs)
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
                space[key] = tripwire(originals[id(value)][1], value)
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
    what = f"{DP}(shards of {', '.join(map(str, counts))} tokens, clip_c={fmt_number(c)})"
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


@check_case(
    "random ragged batches over 2, 3 and 4 shards, clip_c from 1 to 5, answers with a zero advantage among them: "
    "the shards' gradients and values sum to (07.2)'s"
)
def _dp_oracle(fn: Callable[..., Any]) -> None:
    for seed in range(6):
        _dp_compare(fn, dp_batch(seed, 2 + seed % 3), CLIPS[seed])


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
    advice="from its terms: the truncated weight (sg), the advantage, the mask and the global token count",
    hints=(
        "Two steps, as on the cluster: first the one number the trainers all-reduce, the count of real tokens over "
        "every shard; then each shard's loss, minus the sum over its own real tokens of sg[w] A log pi, divided by "
        "that global count.",
        "The weight is lesson 07's truncated ratio of each token, computed from `logp_new.detach()` (that is the "
        "sg[]) and truncated from above at `clip_c`. The advantage is per answer: give it a token axis so that it "
        "broadcasts over the answer's tokens.",
        "Ask what the all-reduce computes: a plain sum of the shards' gradients. Which denominator makes that sum "
        "equal the single-process loss's gradient, and which tokens may enter each numerator? Counts as Python ints; "
        "one scalar tensor per shard, in order.",
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
    SYNC_AND_ADMIT,
    RESTART_ACCOUNTING,
    DATA_PARALLEL_LOSSES,
    JOIN_STEP,
)
