"""Lesson 12's graded exercises: three decisions of the Ray controller, as pure functions, and the
controller's loop itself against a stand-in for Ray.

The learner writes:

* ``bundles_for(layout, n_trainers, n_generators) -> Placement``  (lesson 08's layouts as bundles)
* ``admit(next_k, todo, delivered, holding, idle, *, max_lag, groups_per_batch, room, total_groups)
  -> Admission``  (one admission step: deal groups to idle generators under the lag bound)
* ``on_generator_death(g, in_flight, admitted, todo) -> Death``  (a killed generator's lost groups)
* ``on_ready(ref, ray, loop) -> None``  (the ``ray.wait`` loop's reaction to one finished call)

What each exercise teaches, and how its checks see that mechanism (not only its values):

* bundles_for: mechanism: a layout is a list of one-core bundles and, per actor, a bundle and a share,
  the shares of a bundle adding up to its CPU; observed on every layout of 1-4 trainers and 1-8
  generators, on each bundle's load, and on the signature's defaults.
* admit: mechanism: one group at a time to the least-loaded idle generator with weights, re-requests
  first in their queue's order, the bound (12.1) with each generator's own delivered version;
  observed on random steps (queues left unsorted by successive deaths) and in a controller
  simulation where every trained group's lag is checked.
* on_generator_death: mechanism: exactly the groups in flight on the dead generator are lost, go to
  the front of the queue, and keep the incarnation they were admitted to; observed on ledgers taken
  at every kill of simulated runs, and by running those runs with the learner's function.
* on_ready: mechanism: read only the call ray.wait returned; a raised call or one declined by a
  process holding another epoch is a death (died + a rejoin probe for the next epoch); an unavailable
  probe is sent again for the same epoch, never waited for; the probe's answer sets the epoch later
  calls carry; ActorDiedError from a decoding call is a death like any other, from a probe (sent
  after the death: Ray's record of the actor, no restart left) it makes the generator gone: out of
  down, never probed again, no second died; RayTaskError (the method raised) is let out; observed through a stand-in for Ray that refuses a get
  of any other call, and in simulated runs with kills while decoding and while idle (some for good)
  and live generators cut off while holding groups (fenced by the rejoin).

The checks never call ``course_lib.capstone_ray``: they compare with the oracles below, each
written a different way from the statement's rule. The placement oracle fills the bundles
member by member (and a hand-written table pins the statement's layouts); the admission oracle
deals from the list of open generators re-sorted at every step, with the bound written as a lag
(``floor(k / B) - delivered[g] <= max_lag``); the death oracle scans the group ids one by one.
A small event simulation of the controller (weight transfers arriving late and per generator,
decoding calls returning in random order, generators killed and restarted) drives the learner's
``admit`` or ``on_generator_death`` and checks the lag bound, that every group comes back exactly
once, and that every lost group is generated again by another incarnation. The oracles take
keyword switches that compute known slips, so a wrong answer that matches one is named.

The loop's oracle reads the new state off a table of the outcomes a finished call can have
(groups, raised, declined, unavailable, back, a probe's ActorDiedError: gone; a RayTaskError is let
out), and a simulation of the loop (admission, kills, final kills seen by a decoding call and then
its probe, restarts, calls declined by a new process)
drives the learner's handler through them.

The result types (``Placement``, ``Admission``, ``Death``) are the learner's to use (each
exercise's ``allowed``); an answer that is, wraps or calls anything else from course_lib (the
library's answers) is refused by the runner-wide guard (``grading.guard``) before any check.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
    assert_value_error,
    fail_on_violation,
    pin_known,
    returned_instead_of_value_error,
)

LESSON = "12_capstone_ray"
LIBRARY = ("course_lib.capstone_ray",)
#: what the exercises may take from the library: the result types they return
ALLOWED = frozenset(
    (
        "course_lib.capstone_ray.placement.Placement",
        "course_lib.capstone_ray.admission.Admission",
        "course_lib.capstone_ray.ledger.Death",
    )
)
_MISSING = object()


def _field(obj: Any, key: str) -> Any:
    """Attribute ``key`` of the learner's result (a dict's item also works), or ``_MISSING``."""
    if isinstance(obj, Mapping):
        return obj.get(key, _MISSING)
    try:
        return getattr(obj, key, _MISSING)
    except Exception:
        return _MISSING


def _ints(value: Any, what: str, key: str) -> tuple[int, ...]:
    """A sequence of ints as a tuple, or a failure naming ``key``."""
    if not isinstance(value, list | tuple) or any(as_int(v) is None for v in value):
        fail(f"{what}: {key} is {describe_type(value)} {short_repr(value)}; expected a tuple of ints")
    return tuple(int(v) for v in value)


# ---------------------------------------------------------------------------------------
# Exercise 1: bundles_for
# ---------------------------------------------------------------------------------------

BF = "bundles_for"
LAYOUTS = ("sync_colocated", "sync_split", "pipeline")
PLACEMENT_FIELDS = ("bundles", "trainer_bundle", "generator_bundle", "trainer_cpus", "generator_cpus")


@dataclass(frozen=True)
class PlacementView:
    """A placement, normalised: the number of bundles, each actor's bundle, the two shares."""

    n_bundles: int
    trainer_bundle: tuple[int, ...]
    generator_bundle: tuple[int, ...]
    trainer_cpus: float
    generator_cpus: float

    def same(self, other: PlacementView) -> bool:
        return (
            (self.n_bundles, self.trainer_bundle, self.generator_bundle)
            == (other.n_bundles, other.trainer_bundle, other.generator_bundle)
            and math.isclose(self.trainer_cpus, other.trainer_cpus, rel_tol=1e-9, abs_tol=1e-12)
            and math.isclose(self.generator_cpus, other.generator_cpus, rel_tol=1e-9, abs_tol=1e-12)
        )

    def loads(self) -> list[float]:
        """The CPUs the actors claim in each bundle."""
        used = [0.0] * self.n_bundles
        for b in self.trainer_bundle:
            used[b] += self.trainer_cpus
        for b in self.generator_bundle:
            used[b] += self.generator_cpus
        return used


#: The statement's layouts, written out by hand: (layout, trainers, generators) ->
#: (bundles, trainer_bundle, generator_bundle, trainer_cpus, generator_cpus).
TABLE: dict[tuple[str, int, int], PlacementView] = {
    ("sync_colocated", 2, 2): PlacementView(2, (0, 1), (0, 1), 0.5, 0.5),
    ("sync_colocated", 2, 4): PlacementView(2, (0, 1), (0, 1, 0, 1), 0.5, 0.25),
    ("sync_colocated", 1, 3): PlacementView(1, (0,), (0, 0, 0), 0.5, 1 / 6),
    ("sync_colocated", 3, 3): PlacementView(3, (0, 1, 2), (0, 1, 2), 0.5, 0.5),
    ("sync_split", 2, 2): PlacementView(2, (0, 0), (1, 1), 0.5, 0.5),
    ("sync_split", 3, 1): PlacementView(2, (0, 0, 0), (1,), 1 / 3, 1.0),
    ("pipeline", 2, 2): PlacementView(2, (0, 0), (1, 1), 0.5, 0.5),
    ("pipeline", 1, 4): PlacementView(2, (0,), (1, 1, 1, 1), 1.0, 0.25),
}


def naive_placement(
    layout: str,
    n_trainers: int,
    n_generators: int,
    *,
    colocated: tuple[str, ...] = ("sync_colocated",),
    swapped: bool = False,
    all_in_zero: bool = False,
    blocked: bool = False,
) -> PlacementView:
    """The placement built member by member: open the bundles, put each actor into its bundle,
    then read every actor's share off the members of its bundle. The switches compute known
    slips."""
    members: list[list[str]] = []
    trainer_at: list[int] = []
    generator_at: list[int] = []
    if layout in colocated:
        members = [[] for _ in range(n_trainers)]
        per_bundle = max(n_generators // n_trainers, 1)
        for r in range(n_trainers):
            members[r].append("trainer")
            trainer_at.append(r)
        for i in range(n_generators):  # dealt in turn over the trainers' bundles
            b = 0 if all_in_zero else (min(i // per_bundle, n_trainers - 1) if blocked else i % n_trainers)
            members[b].append("generator")
            generator_at.append(b)
        trainer_share = 0.5
        generator_share = 0.5 / per_bundle
    else:
        home, away = (1, 0) if swapped else (0, 1)
        members = [[], []]
        for _ in range(n_trainers):
            members[home].append("trainer")
            trainer_at.append(home)
        for _ in range(n_generators):
            members[away].append("generator")
            generator_at.append(away)
        trainer_share = 1.0 / members[home].count("trainer")
        generator_share = 1.0 / members[away].count("generator")
    return PlacementView(len(members), tuple(trainer_at), tuple(generator_at), trainer_share, generator_share)


BF_SLIPS: dict[str, dict[str, Any]] = {
    "trainers and generators swapped between the bundles: the trainers share bundle 0, the generators bundle 1": dict(
        swapped=True
    ),
    "all generators in bundle 0: in sync_colocated generator i goes beside trainer i % n_trainers, into bundle "
    "i % n_trainers": dict(all_in_zero=True),
    "generators dealt in blocks: deal them in turn, generator i into bundle i % n_trainers (beside trainer "
    "i % n_trainers)": dict(blocked=True),
    "pipeline is placed like sync_split (trainers in bundle 0, generators in bundle 1); only the controller's "
    "schedule differs": dict(colocated=("sync_colocated", "pipeline")),
    "sync_split places the trainers and the generators in separate bundles (0 and 1), as pipeline does; only "
    "sync_colocated shares a core": dict(colocated=("sync_colocated", "sync_split")),
}


def _bf_what(layout: str, n_trainers: int, n_generators: int) -> str:
    return f"{BF}({layout!r}, {n_trainers}, {n_generators})"


def _bf_answer(
    fn: Callable[..., Any], layout: str, n_trainers: int, n_generators: int, *, defaults: bool = False
) -> PlacementView:
    """The learner's placement, normalised, or a failure naming what is wrong with its shape
    (``defaults``: called with the layout alone)."""
    what = (
        f"{BF}({layout!r}) (by default 2 trainers and 2 generators)"
        if defaults
        else _bf_what(layout, n_trainers, n_generators)
    )
    got = call(fn, layout) if defaults else call(fn, layout, n_trainers, n_generators)
    if got is None:
        fail(f"{what} returned None; did you forget to `return` the Placement?")
    missing = [key for key in PLACEMENT_FIELDS if _field(got, key) is _MISSING]
    if missing:
        fail(f"{what} returned {describe_type(got)} without {', '.join(missing)}; expected a Placement(...)")
    given = _field(got, "layout")
    if given is not _MISSING and given != layout:
        fail(f"{what}: layout is {short_repr(given)}; expected {layout!r}, the layout asked for")
    bundles = _field(got, "bundles")
    if not isinstance(bundles, list | tuple) or not bundles:
        fail(f"{what}: bundles is {describe_type(bundles)}; expected a tuple of {{'CPU': 1.0}}, one per bundle")
    for b, bundle in enumerate(bundles):
        ok = isinstance(bundle, Mapping) and set(bundle) == {"CPU"}
        if not ok or isinstance(bundle["CPU"], bool) or not isinstance(bundle["CPU"], int | float | np.number):
            fail(f"{what}: bundles[{b}] is {short_repr(bundle)}; expected {{'CPU': 1.0}} (one core)")
        if not math.isclose(float(bundle["CPU"]), 1.0):
            fail(f"{what}: bundles[{b}] is {short_repr(dict(bundle))}; every bundle is one core, {{'CPU': 1.0}}")
    trainer_bundle = _ints(_field(got, "trainer_bundle"), what, "trainer_bundle")
    generator_bundle = _ints(_field(got, "generator_bundle"), what, "generator_bundle")
    for key, at, n, role in (
        ("trainer_bundle", trainer_bundle, n_trainers, "trainer"),
        ("generator_bundle", generator_bundle, n_generators, "generator"),
    ):
        if len(at) != n:
            fail(f"{what}: {key} has {len(at)} entries; expected {n}, the bundle of each {role}")
        bad = [b for b in at if not 0 <= b < len(bundles)]
        if bad:
            fail(f"{what}: {key} names bundle {bad[0]}, but there are {len(bundles)} bundles (0 .. {len(bundles) - 1})")
    shares = []
    for key in ("trainer_cpus", "generator_cpus"):
        value = _field(got, key)
        if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not math.isfinite(value):
            fail(f"{what}: {key} is {describe_type(value)}; expected a float, each actor's share of its bundle's CPU")
        shares.append(float(value))
    return PlacementView(len(bundles), trainer_bundle, generator_bundle, shares[0], shares[1])


def _members(view: PlacementView, b: int) -> str:
    parts = []
    for role, at, share in (
        ("trainer", view.trainer_bundle, view.trainer_cpus),
        ("generator", view.generator_bundle, view.generator_cpus),
    ):
        n = at.count(b)
        if n:
            parts.append(f"{n} {role}{'s' if n > 1 else ''} x {fmt_number(share)}")
    return " + ".join(parts) or "nothing"


def _bf_compare(fn: Callable[..., Any], layout: str, n_trainers: int, n_generators: int) -> None:
    """The learner's placement against the oracle; a known slip is named, then bundles whose
    shares do not add up, then the first field that differs."""
    what = _bf_what(layout, n_trainers, n_generators)
    got = _bf_answer(fn, layout, n_trainers, n_generators)
    want = naive_placement(layout, n_trainers, n_generators)
    if got.same(want):
        return
    for message, slip in BF_SLIPS.items():
        wrong = naive_placement(layout, n_trainers, n_generators, **slip)
        if not wrong.same(want) and got.same(wrong):
            fail(f"{what}: {message}")
    for b, load in enumerate(got.loads()):
        if not math.isclose(load, 1.0, rel_tol=1e-9):
            fail(
                f"{what}: bundle {b} holds {fmt_number(load)} CPU of actors ({_members(got, b)}) but has 1.0: "
                "the shares in a bundle must add up to exactly its CPU"
            )
    for key in ("n_bundles", "trainer_bundle", "generator_bundle", "trainer_cpus", "generator_cpus"):
        mine, right = getattr(got, key), getattr(want, key)
        if mine != right and not (isinstance(mine, float) and math.isclose(mine, right, rel_tol=1e-9)):
            name = "the number of bundles" if key == "n_bundles" else key
            fail(f"{what}: {name} is {short_repr(mine)}; expected {short_repr(right)}")


@check_case(
    "returns a Placement (bundles, trainer_bundle, generator_bundle, trainer_cpus, generator_cpus); by default 2 "
    "trainers and 2 generators"
)
def _bf_shape(fn: Callable[..., Any]) -> None:
    for layout in LAYOUTS:
        _bf_answer(fn, layout, 2, 2)
    for layout in LAYOUTS:  # the defaults give what 2 and 2 give (whether that is right, later checks say)
        got = _bf_answer(fn, layout, 2, 2, defaults=True)
        if not got.same(_bf_answer(fn, layout, 2, 2)):
            fail(
                f"{BF}({layout!r}) = {got}, not what {_bf_what(layout, 2, 2)} gives: with the layout alone it places "
                "2 trainers and 2 generators (the defaults n_trainers=2, n_generators=2 of the statement's signature)"
            )


@check_case("a hand-written table: 2 trainers with 2 and 4 generators, 1 with 3 and 4, 3 with 1 and 3")
def _bf_known(fn: Callable[..., Any]) -> None:
    for (layout, n_trainers, n_generators), want in TABLE.items():
        _bf_compare(fn, layout, n_trainers, n_generators)  # names a known slip first
        got = _bf_answer(fn, layout, n_trainers, n_generators)
        if not got.same(want):  # the oracle agrees with the table by construction; this pins it
            fail(f"{_bf_what(layout, n_trainers, n_generators)} = {got}; expected {want}")


@check_case("every layout with 1 to 4 trainers and 1 to 8 generators against an oracle; each bundle's shares sum to 1")
def _bf_oracle(fn: Callable[..., Any]) -> None:
    for layout in LAYOUTS:
        for n_trainers in range(1, 5):
            for n_generators in range(1, 9):
                if layout == "sync_colocated" and n_generators % n_trainers:
                    continue
                _bf_compare(fn, layout, n_trainers, n_generators)


@check_case("raises ValueError for an unknown layout, no trainer or generator, colocated generators not spread evenly")
def _bf_bad(fn: Callable[..., Any]) -> None:
    cases = (
        ("colocated", 2, 2, "an unknown layout: the three are sync_colocated, sync_split, pipeline"),
        ("async", 2, 2, "an unknown layout: the three are sync_colocated, sync_split, pipeline"),
        ("sync_split", 0, 2, "no trainer"),
        ("pipeline", 2, 0, "no generator"),
        ("sync_colocated", 0, 2, "no trainer"),
        ("sync_colocated", 2, -2, "a negative number of generators"),
        ("sync_colocated", 2, 3, "3 generators cannot be spread evenly beside 2 trainers"),
        ("sync_colocated", 3, 4, "4 generators cannot be spread evenly beside 3 trainers"),
    )
    for layout, n_trainers, n_generators, why in cases:
        what = _bf_what(layout, n_trainers, n_generators)
        no_error = returned_instead_of_value_error(what, why)
        assert_value_error(fn, layout, n_trainers, n_generators, what=what, no_error=no_error)


BUNDLES_FOR = Exercise(
    name=BF,
    allowed=tuple(sorted(ALLOWED)),
    points=10,
    title="lesson 08's layouts as placement-group bundles: each actor's bundle and share",
    checks=(_bf_shape, _bf_known, _bf_oracle, _bf_bad),
    advice="from the bundles and the shares the statement gives (Placement is yours to use)",
    hints=(
        "Check the arguments first; then two cases: colocated (one bundle per trainer) and the two split layouts (two "
        "bundles).",
        "In a colocated bundle the trainer takes half and the bundle's n_generators // n_trainers generators share "
        "the other half.",
        "Colocated: one bundle of one CPU per trainer; generator i shares the bundle of trainer i modulo n_trainers. "
        "Split layouts: bundle 0 holds every trainer and bundle 1 every generator, each side sharing its bundle's CPU "
        "evenly. Return a `Placement`; raise `ValueError` for an unknown layout, fewer than one trainer or generator, "
        "or (colocated) generators that do not divide evenly among the trainers.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 2: admit
# ---------------------------------------------------------------------------------------

AD = "admit"

#: an admission normalised: ({generator: (groups, ...)} without empty entries, next_k, todo)
AdmitOut = tuple[dict[int, tuple[int, ...]], int, tuple[int, ...]]


@dataclass(frozen=True)
class AdmitCase:
    """The arguments of one admission step."""

    next_k: int
    todo: tuple[int, ...]
    delivered: tuple[int, ...]
    holding: tuple[int, ...]
    idle: tuple[int, ...]
    max_lag: int
    B: int
    room: int
    total: int

    def call(self, fn: Callable[..., Any]) -> Any:
        """``fn`` on fresh lists of this case's arguments."""
        return call(
            fn,
            self.next_k,
            list(self.todo),
            list(self.delivered),
            list(self.holding),
            list(self.idle),
            max_lag=self.max_lag,
            groups_per_batch=self.B,
            room=self.room,
            total_groups=self.total,
        )

    def invoke(self, fn: Callable[..., Any]) -> Any:
        """``fn`` on fresh lists, called directly (its exceptions pass through unchanged)."""
        return fn(
            self.next_k,
            list(self.todo),
            list(self.delivered),
            list(self.holding),
            list(self.idle),
            max_lag=self.max_lag,
            groups_per_batch=self.B,
            room=self.room,
            total_groups=self.total,
        )

    def text(self) -> str:
        return (
            f"{AD}({self.next_k}, todo={list(self.todo)}, delivered={list(self.delivered)}, "
            f"holding={list(self.holding)}, idle={list(self.idle)}, max_lag={self.max_lag}, B={self.B}, "
            f"room={self.room}, total={self.total})"
        )


def naive_admit(
    case: AdmitCase,
    *,
    newest_version: bool = False,
    ignore_todo: bool = False,
    round_robin: bool = False,
    lag_off_by_one: bool = False,
    weightless: bool = False,
    ignore_total: bool = False,
    stop_when_blocked: bool = False,
    smallest_first: bool = False,
    sorted_rest: bool = False,
) -> AdmitOut:
    """One admission step, the bound written as a lag: group ``k`` is trained on by update
    ``k // B``, and generator ``g`` may start it if that is at most ``max_lag`` updates after the
    version it holds. At every deal the open generators are sorted afresh by what they hold.
    The switches compute known slips."""
    B = case.B

    def version(g: int) -> int:
        return max(case.delivered) if newest_version else case.delivered[g]

    def may_take(g: int, k: int) -> bool:
        if k >= case.total and not ignore_total:
            return False
        lag = k // B - version(g)
        return lag <= case.max_lag or (lag_off_by_one and k == (version(g) + case.max_lag + 1) * B)

    got: dict[int, list[int]] = {g: [] for g in sorted(set(case.idle)) if weightless or case.delivered[g] >= 0}
    queue = [] if ignore_todo else (sorted(case.todo) if smallest_first else list(case.todo))
    fresh = case.next_k
    closed: set[int] = set()
    turn = 0
    while True:
        open_ = [g for g in got if g not in closed]
        if not open_:
            break
        if round_robin:
            g = open_[turn % len(open_)]
            turn += 1
        else:
            g = sorted(open_, key=lambda h: (case.holding[h] + len(got[h]), h))[0]
        if case.holding[g] + len(got[g]) >= case.room:
            break
        k = queue[0] if queue else fresh
        if not may_take(g, k):
            if stop_when_blocked:
                break
            closed.add(g)
            continue
        if queue:
            queue.pop(0)
        else:
            fresh += 1
        got[g].append(k)
    todo = tuple(case.todo) if ignore_todo else tuple(sorted(queue) if sorted_rest else queue)
    return {g: tuple(ks) for g, ks in got.items() if ks}, fresh, todo


AD_SLIPS: dict[str, dict[str, Any]] = {
    "admitted against the newest version (the trainer's), not the generator's own: the bound uses delivered[g]": dict(
        newest_version=True
    ),
    "ignored todo: the re-requested groups (lost with a killed generator) are dealt first, before next_k": dict(
        ignore_todo=True
    ),
    "dealt round robin: each group goes to the generator holding the fewest (holding + what it got; ties: lowest "
    "index)": dict(round_robin=True),
    "off by one in the lag bound: k < (delivered[g] + max_lag + 1) * B, strictly": dict(lag_off_by_one=True),
    "gave groups to a generator with no weights yet (delivered = -1)": dict(weightless=True),
    "started groups k >= total_groups: the run needs no more": dict(ignore_total=True),
    "stopped dealing at the first generator whose weights are too old: drop it for this call, go on with the "
    "others": dict(stop_when_blocked=True),
    "dealt the re-requested groups smallest first: deal todo in its own order, from its front (the latest death's "
    "lost groups lead it, ahead of older re-requests)": dict(smallest_first=True),
    "returned the groups left in todo sorted: keep them in todo's order, the controller's queue": dict(
        sorted_rest=True
    ),
}


def _admit_answer(fn: Callable[..., Any], case: AdmitCase) -> AdmitOut:
    """The learner's admission, normalised, or a failure naming what is wrong with its shape."""
    what = case.text()
    got = case.call(fn)
    if got is None:
        fail(f"{what} returned None; did you forget to `return` the Admission?")
    missing = [key for key in ("groups", "next_k", "todo") if _field(got, key) is _MISSING]
    if missing:
        fail(f"{what} returned {describe_type(got)} without {', '.join(missing)}; expected an Admission(...)")
    groups = _field(got, "groups")
    if not isinstance(groups, Mapping):
        fail(f"{what}: groups is {describe_type(groups)}; expected a dict generator -> list of groups")
    out: dict[int, tuple[int, ...]] = {}
    for g, ks in groups.items():
        if as_int(g) is None:
            fail(f"{what}: groups has the key {short_repr(g)}; expected generator indices (ints)")
        if not 0 <= int(g) < len(case.delivered):
            fail(f"{what}: groups has generator {g}, which does not exist (0 .. {len(case.delivered) - 1})")
        taken = _ints(ks, what, f"groups[{g}]")
        if taken:
            out[int(g)] = taken
    next_k = as_int(_field(got, "next_k"))
    if next_k is None:
        fail(f"{what}: next_k is {describe_type(_field(got, 'next_k'))}; expected an int")
    assert next_k is not None
    todo = _ints(_field(got, "todo"), what, "todo")
    return out, next_k, todo


def _admit_explain(case: AdmitCase, got: AdmitOut, want: AdmitOut) -> str:
    """Why ``got`` is wrong, read off its properties (for answers no known slip explains)."""
    groups, next_k, todo = got
    for g, ks in sorted(groups.items()):
        if g not in case.idle:
            return f"generator {g} is not idle (a decoding call is in flight): only generators in idle get groups"
        if case.delivered[g] < 0:
            return f"generator {g} has no weights yet (delivered = -1): it gets no group"
        if case.holding[g] + len(ks) > case.room:
            return f"generator {g} would hold {case.holding[g] + len(ks)} groups, more than room = {case.room}"
        for k in ks:
            if k >= case.total:
                return f"group {k} >= total_groups = {case.total}: the run needs no more"
            bound = (case.delivered[g] + case.max_lag + 1) * case.B
            if k >= bound:
                return (
                    f"group {k} went to generator {g}, which holds version {case.delivered[g]}: it needs "
                    f"k < (delivered[g] + max_lag + 1) * B = {bound}"
                )
    mine = sorted(k for ks in groups.values() for k in ks)
    right = sorted(k for ks in want[0].values() for k in ks)
    if mine != right:
        if case.todo and set(right) & set(case.todo) and not set(mine) & set(case.todo):
            return "ignored todo: the re-requested groups are dealt first, before next_k"
        if len(mine) < len(right):
            return (
                f"started groups {mine}; {right} could start: a generator whose weights are too old leaves this "
                "call, the others go on until the least loaded holds room"
            )
        return f"started groups {mine}; expected {right}: todo's groups first, in order, then next_k, next_k + 1, ..."
    if groups != want[0]:
        return (
            f"groups = {groups}; expected {want[0]}: deal each group to the idle generator holding the fewest "
            "(holding[g] + what it got in this call; ties: the lowest index)"
        )
    if next_k != want[1]:
        return f"next_k = {next_k}; expected {want[1]}, the next group never started"
    return f"todo = {todo}; expected {want[2]}, the re-requested groups not dealt, in order"


def _random_case(rng: random.Random) -> AdmitCase:
    """A random, consistent admission step: todo holds older groups than next_k."""
    n = rng.randint(1, 4)
    B = rng.randint(1, 3)
    max_lag = rng.randint(0, 2)
    room = rng.randint(1, 4)
    top = rng.randint(0, 6)
    delivered = tuple(rng.choice([-1, *range(max(0, top - 2), top + 1)]) for _ in range(n))
    next_k = rng.randint(max(0, top - 1) * B, (top + max_lag + 1) * B + 1)
    older = list(range(max(0, next_k - 4 * B), next_k))
    lost = sorted(rng.sample(older, min(len(older), rng.choice([0, 0, 1, 2, 3, 4]))))
    cut = rng.randint(0, len(lost))
    # as the controller leaves it: each death puts its lost groups (ascending) in front of the older ones
    todo = tuple(lost[cut:] + lost[:cut]) if rng.random() < 0.6 else tuple(lost)
    holding = tuple(rng.randint(0, room) for _ in range(n))
    idle = tuple(g for g in range(n) if rng.random() < 0.75)
    rng_idle = list(idle)
    rng.shuffle(rng_idle)
    total = next_k + rng.choice([0, 1, 2, 3 * B, 50])
    return AdmitCase(next_k, todo, delivered, holding, tuple(rng_idle), max_lag, B, room, total)


#: Random steps on which a wrong answer is matched against every slip as a whole.
PROBES = tuple(_random_case(random.Random(1000 + i)) for i in range(150))


def _admit_compare(fn: Callable[..., Any], case: AdmitCase) -> None:
    """The learner's step against the oracle; a mismatch is named by the slip that agrees with
    the learner on every probe (else the first that agrees here), else explained."""
    got, want = _admit_answer(fn, case), naive_admit(case)
    if got == want:
        return
    what = case.text()
    here = {m: s for m, s in AD_SLIPS.items() if naive_admit(case, **s) == got}
    if here:
        answers = {p: _admit_answer(fn, p) for p in PROBES}
        for message, slip in here.items():
            if all(naive_admit(p, **slip) == answers[p] for p in PROBES):
                fail(f"{what}: {message}")
        fail(f"{what}: {next(iter(here))}")
    fail(f"{what}: {_admit_explain(case, got, want)}")


def worked_admit_case() -> AdmitCase:
    """The statement's example."""
    return AdmitCase(6, (3,), (2, 1, -1), (1, 0, 0), (0, 1, 2), 1, 2, 3, 20)


#: Hand-made steps and their answers, worked out by hand (see the comments).
KNOWN_ADMITS: tuple[tuple[AdmitCase, AdmitOut], ...] = (
    # the statement's example: todo first, the fewest, a tie, g1 too old, room, g2 without weights
    (worked_admit_case(), ({0: (6, 7), 1: (3,)}, 8, ())),
    # two equal generators, idle given in any order: 0, 1, 0, 1 (ties to the lowest index), then room
    (AdmitCase(0, (), (0, 0), (0, 0), (1, 0), 1, 2, 2, 10), ({0: (0, 2), 1: (1, 3)}, 4, ())),
    # each generator's own version: g1 holds version 0, bound 2; g0 holds 2, bound 6
    (AdmitCase(4, (), (2, 0), (0, 0), (0, 1), 0, 2, 4, 20), ({0: (4, 5)}, 6, ())),
    # the bound's edge: (1 + 1 + 1) * 2 = 6, so 5 starts and 6 does not
    (AdmitCase(5, (), (1,), (0,), (0,), 1, 2, 4, 20), ({0: (5,)}, 6, ())),
    # todo first: g1 (holding 1) takes 2, g0 takes 5, then 9 is beyond both bounds (8)
    (AdmitCase(9, (2, 5), (3, 3), (2, 1), (0, 1), 0, 2, 3, 12), ({0: (5,), 1: (2,)}, 9, ())),
    # room: g1 fills up to 3, then g0 (holding 3) is the least loaded and full: stop
    (AdmitCase(0, (), (0, 0), (3, 1), (0, 1), 2, 2, 3, 20), ({1: (0, 1)}, 2, ())),
    # g0 has no weights (its bound would be 2), g2 is busy: only g1 (version 1) takes groups, up to room
    (AdmitCase(0, (), (-1, 1, 1), (0, 0, 2), (0, 1), 1, 2, 2, 10), ({1: (0, 1)}, 2, ())),
    # total_groups: 10 and 11 start, 12 does not although the bound (14) allows it
    (AdmitCase(10, (), (5, 5), (0, 0), (0, 1), 1, 2, 3, 12), ({0: (10,), 1: (11,)}, 12, ())),
    # a re-requested group no idle generator may take yet stays in todo
    (AdmitCase(8, (7,), (1, 4), (0, 0), (0,), 0, 2, 2, 20), ({}, 8, (7,))),
    # two deaths: the later one's lost groups (12, 13) lead the queue, ahead of the older 7: g0 (holding
    # 0) takes 12, then 13 (a tie with g1: the lower index); g1 takes 7; g0 is full: stop
    (AdmitCase(14, (12, 13, 7), (6, 6), (0, 1), (0, 1), 1, 2, 2, 20), ({0: (12, 13), 1: (7,)}, 14, ())),
    # the queue's order survives: room for one more group, 9 goes, 3, 11 and 5 stay in their order
    (AdmitCase(12, (9, 3, 11, 5), (5, 5), (2, 3), (0, 1), 1, 2, 3, 20), ({0: (9,)}, 12, (3, 11, 5))),
)


@check_case("returns an Admission (groups, next_k, todo): the statement's example")
def _ad_shape(fn: Callable[..., Any]) -> None:
    case = worked_admit_case()
    _admit_answer(fn, case)
    _admit_compare(fn, case)


@check_case("hand-made steps: fewest first, ties, each generator's own version, the bound's edge, todo, room")
def _ad_known(fn: Callable[..., Any]) -> None:
    pin_known(fn, KNOWN_ADMITS, compare=_admit_compare, answer=_admit_answer, text=AdmitCase.text)


@check_case("random steps against an oracle that deals one group at a time, the bound written as a lag")
def _ad_oracle(fn: Callable[..., Any]) -> None:
    rng = random.Random(12)
    for _ in range(400):
        _admit_compare(fn, _random_case(rng))


@check_case(
    "simulated runs (late weights, random returns, kills): no group lags more than max_lag, each comes back once",
    time_limit=20.0,
)
def _ad_simulation(fn: Callable[..., Any]) -> None:
    def learner(case: AdmitCase) -> AdmitOut:
        return _admit_answer(fn, case)

    _fail_on_simulated_runs(learner, naive_death_out)


@check_case("does not modify its inputs (todo, delivered, holding, idle)")
def _ad_inputs(fn: Callable[..., Any]) -> None:
    for case, _ in KNOWN_ADMITS:
        given = [list(case.todo), list(case.delivered), list(case.holding), list(case.idle)]
        before = copy.deepcopy(given)
        call(
            fn,
            case.next_k,
            *given,
            max_lag=case.max_lag,
            groups_per_batch=case.B,
            room=case.room,
            total_groups=case.total,
        )
        for name, now, then in zip(("todo", "delivered", "holding", "idle"), given, before):
            if now != then:
                fail(
                    f"{case.text()} changed the `{name}` list it was given ({short_repr(then)} -> {short_repr(now)}): "
                    "it is the controller's; work on a copy"
                )


@check_case(
    "raises ValueError for max_lag < 0, groups_per_batch < 1, room < 1, or an idle generator that does not exist"
)
def _ad_bad(fn: Callable[..., Any]) -> None:
    cases = (
        (AdmitCase(0, (), (0, 0), (0, 0), (0, 1), -1, 2, 2, 10), "max_lag = -1"),
        (AdmitCase(0, (), (0, 0), (0, 0), (0, 1), 1, 0, 2, 10), "groups_per_batch = 0"),
        (AdmitCase(0, (), (0, 0), (0, 0), (0, 1), 1, 2, 0, 10), "room = 0"),
        (AdmitCase(0, (), (0, 0), (0, 0), (0, 2), 1, 2, 2, 10), "idle generator 2 of 2"),
        (AdmitCase(0, (), (0, 0), (0, 0), (-1,), 1, 2, 2, 10), "idle generator -1"),
    )
    for case, why in cases:
        what = case.text()
        assert_value_error(case.invoke, fn, what=what, no_error=returned_instead_of_value_error(what, why))


# ---------------------------------------------------------------------------------------
# Exercise 3: on_generator_death
# ---------------------------------------------------------------------------------------

GD = "on_generator_death"

#: a death normalised: (lost, lost_entries, todo)
DeathOut = tuple[tuple[int, ...], tuple[tuple[int, int, int], ...], tuple[int, ...]]


@dataclass(frozen=True)
class DeathCase:
    """The arguments of one death, and which of the dead generator's groups were queued."""

    g: int
    in_flight: tuple[tuple[int, ...], ...]  # per generator, in admission order
    admitted: tuple[tuple[int, tuple[int, int]], ...]
    todo: tuple[int, ...]
    queued: frozenset[int] = frozenset()
    as_sets: bool = True

    def args(self) -> tuple[int, list[Any], dict[int, tuple[int, int]], list[int]]:
        """Fresh arguments: ``in_flight`` as a list of sets (as the controller keeps it) or of
        lists in admission order."""
        flights = [set(ks) if self.as_sets else list(ks) for ks in self.in_flight]
        return self.g, flights, dict(self.admitted), list(self.todo)

    def text(self) -> str:
        flights = [sorted(ks) if self.as_sets else list(ks) for ks in self.in_flight]
        return f"{GD}({self.g}, in_flight={flights}, todo={list(self.todo)})"


def naive_death(case: DeathCase) -> DeathOut:
    """Brute force: scan every group id up to the largest seen; those in flight on the dead
    generator are lost, in the order of the scan; each entry reads its admission."""
    flying = case.in_flight[case.g]
    admitted = dict(case.admitted)
    top = max([*flying, *admitted, *case.todo, -1])
    lost = tuple(k for k in range(top + 1) if k in flying)
    entries = tuple((k, case.g, admitted[k][1]) for k in lost)
    return lost, entries, lost + case.todo


def naive_death_out(
    g: int, in_flight: Sequence[Sequence[int]], admitted: Mapping[int, tuple[int, int]], todo: Sequence[int]
) -> DeathOut:
    """:func:`naive_death` on the simulation's arguments."""
    case = DeathCase(g, tuple(tuple(ks) for ks in in_flight), tuple(admitted.items()), tuple(todo))
    return naive_death(case)


def _death_answer(fn: Callable[..., Any], case: DeathCase) -> DeathOut:
    """The learner's death, normalised, or a failure naming what is wrong with its shape."""
    what = case.text()
    got = call(fn, *case.args())
    if got is None:
        fail(f"{what} returned None; did you forget to `return` the Death?")
    missing = [key for key in ("lost", "lost_entries", "todo") if _field(got, key) is _MISSING]
    if missing:
        fail(f"{what} returned {describe_type(got)} without {', '.join(missing)}; expected a Death(...)")
    lost = _ints(_field(got, "lost"), what, "lost")
    raw = _field(got, "lost_entries")
    if not isinstance(raw, list | tuple):
        fail(f"{what}: lost_entries is {describe_type(raw)}; expected a tuple of (k, generator, incarnation)")
    entries = []
    for entry in raw:
        if not isinstance(entry, list | tuple) or len(entry) != 3 or any(as_int(x) is None for x in entry):
            fail(f"{what}: lost_entries holds {short_repr(entry)}; expected (k, generator, incarnation) tuples of ints")
        entries.append((int(entry[0]), int(entry[1]), int(entry[2])))
    todo = _ints(_field(got, "todo"), what, "todo")
    return lost, tuple(entries), todo


def _death_explain(case: DeathCase, got: DeathOut, want: DeathOut) -> str:
    """Why ``got`` is wrong, in the order a learner would fix it."""
    lost, entries, todo = got
    flying = set(case.in_flight[case.g])
    admitted = dict(case.admitted)
    missing = sorted(flying - set(lost))
    if missing:
        kind = "queued (admitted, waiting for a slot)" if set(missing) <= case.queued else "in flight"
        return (
            f"lost misses group(s) {missing}, {kind} on generator {case.g}: every group admitted to it and not "
            "returned is lost (queued, decoding or finished: the dead process took them all)"
        )
    extra = sorted(set(lost) - flying)
    if extra:
        k = extra[0]
        if admitted.get(k, (None,))[0] == case.g:
            return (
                f"group {k} was already returned by generator {case.g} (it is in admitted, not in flight): asking "
                "for it again would generate it twice; the lost groups are in_flight[g]"
            )
        return f"group {k} is not in flight on generator {case.g}: only in_flight[g] is lost"
    if len(lost) != len(set(lost)):
        return f"lost = {lost} holds a group twice"
    if list(lost) != sorted(lost):
        return f"lost = {lost} is not ascending: sort the groups (the oldest gate the next update)"
    if entries != want[1]:
        if [e[0] for e in entries] == list(lost) and all(e[1] == case.g for e in entries):
            return (
                f"lost_entries = {short_repr(entries)}; expected {short_repr(want[1])}: each entry holds the "
                "incarnation the group was admitted to, admitted[k][1]"
            )
        return f"lost_entries = {short_repr(entries)}; expected {short_repr(want[1])}: (k, g, admitted[k][1]) per lost group"
    if todo != want[2]:
        if case.todo and lost and todo == case.todo + lost:
            return (
                f"todo = {todo}: the lost groups go to the front, ahead of the older re-requests "
                "(they are the oldest unfinished groups: the next update waits for them)"
            )
        return f"todo = {todo}; expected {want[2]}: the lost groups (ascending), then the old todo in its order"
    return f"got {got}; expected {want}"


def _death_compare(fn: Callable[..., Any], case: DeathCase) -> None:
    got, want = _death_answer(fn, case), naive_death(case)
    if got != want:
        fail(f"{case.text()}: {_death_explain(case, got, want)}")


def worked_death_case() -> DeathCase:
    """The statement's example: generator 1 (incarnation 1) dies decoding 12, 13 with 15 queued."""
    admitted = {9: (1, 1), 10: (0, 0), 11: (1, 1), 12: (1, 1), 13: (1, 1), 14: (0, 0), 15: (1, 1)}
    return DeathCase(1, ((10, 14), (12, 13, 15)), tuple(admitted.items()), (7,), frozenset({15}))


KNOWN_DEATHS: tuple[tuple[DeathCase, DeathOut], ...] = (
    (worked_death_case(), ((12, 13, 15), ((12, 1, 1), (13, 1, 1), (15, 1, 1)), (12, 13, 15, 7))),
    # nothing in flight on generator 0: nothing lost, the queue unchanged
    (DeathCase(0, ((), (3,)), ((1, (0, 0)), (2, (0, 0)), (3, (1, 0))), (0,)), ((), (), (0,))),
    # groups re-admitted after an earlier death arrive out of order (a list in admission order);
    # generator 1 is in its third incarnation; group 10, returned by incarnation 1, is not lost
    (
        DeathCase(
            1,
            ((8,), (12, 13, 4)),
            ((4, (1, 2)), (8, (0, 0)), (10, (1, 1)), (12, (1, 2)), (13, (1, 2))),
            (6,),
            frozenset({4}),
            as_sets=False,
        ),
        ((4, 12, 13), ((4, 1, 2), (12, 1, 2), (13, 1, 2)), (4, 12, 13, 6)),
    ),
    # two earlier deaths left re-requests waiting, the later one's first (8, 9, then 4, 5): the old
    # todo keeps its order behind the new losses
    (
        DeathCase(
            0,
            ((12, 13), (10, 11)),
            ((6, (0, 1)), (10, (1, 0)), (11, (1, 0)), (12, (0, 2)), (13, (0, 2))),
            (8, 9, 4, 5),
        ),
        ((12, 13), ((12, 0, 2), (13, 0, 2)), (12, 13, 8, 9, 4, 5)),
    ),
    # a set of ids above 7 does not iterate in order: {3, 10, 17} iterates 17, 10, 3
    (
        DeathCase(0, ((10, 3, 17), ()), ((3, (0, 1)), (10, (0, 1)), (17, (0, 1))), (), frozenset({17})),
        ((3, 10, 17), ((3, 0, 1), (10, 0, 1), (17, 0, 1)), (3, 10, 17)),
    ),
)


@check_case("returns a Death (lost, lost_entries, todo): the statement's example")
def _gd_shape(fn: Callable[..., Any]) -> None:
    case = worked_death_case()
    _death_answer(fn, case)
    _death_compare(fn, case)


@check_case("hand-made deaths: nothing in flight, groups re-admitted out of order, later incarnations, a long todo")
def _gd_known(fn: Callable[..., Any]) -> None:
    pin_known(fn, KNOWN_DEATHS, compare=_death_compare, answer=_death_answer, text=DeathCase.text)


@check_case("the ledger at every kill of simulated runs, against a brute-force scan over group ids", time_limit=20.0)
def _gd_oracle(fn: Callable[..., Any]) -> None:
    for case in death_cases():
        _death_compare(fn, case)


@check_case(
    "simulated runs with kills: every group comes back once, each lost group from another incarnation",
    time_limit=20.0,
)
def _gd_simulation(fn: Callable[..., Any]) -> None:
    def learner(g: int, in_flight: Any, admitted: Any, todo: Any) -> DeathOut:
        case = DeathCase(g, tuple(tuple(ks) for ks in in_flight), tuple(admitted.items()), tuple(todo))
        return _death_answer(fn, case)

    _fail_on_simulated_runs(_oracle_admit, learner)


@check_case("does not modify its inputs (in_flight, admitted, todo)")
def _gd_inputs(fn: Callable[..., Any]) -> None:
    for case, _ in KNOWN_DEATHS:
        args = case.args()
        before = copy.deepcopy(args)
        call(fn, *args)
        for name, now, then in zip(("g", "in_flight", "admitted", "todo"), args, before):
            if now != then:
                fail(
                    f"{case.text()} changed the `{name}` it was given: the controller removes the lost groups "
                    "itself, afterwards; work on copies"
                )


@check_case("raises ValueError for a generator that does not exist or an inconsistent ledger")
def _gd_bad(fn: Callable[..., Any]) -> None:
    admitted = ((5, (1, 0)), (6, (1, 0)), (7, (0, 0)))
    cases = (
        (DeathCase(2, ((7,), (5, 6)), admitted, ()), "generator 2 of 2 does not exist"),
        (DeathCase(-1, ((7,), (5, 6)), admitted, ()), "generator -1 does not exist"),
        (
            DeathCase(1, ((7,), (5, 6)), ((5, (1, 0)), (6, (0, 0)), (7, (0, 0))), ()),
            "group 6 is in flight on generator 1 but the ledger admitted it to generator 0: the ledger is inconsistent",
        ),
        (
            DeathCase(1, ((7,), (5, 6)), ((5, (1, 0)), (7, (0, 0))), ()),
            "group 6 is in flight on generator 1 but was never admitted: the ledger is inconsistent",
        ),
    )
    for case, why in cases:
        what = case.text()
        assert_value_error(fn, *case.args(), what=what, no_error=returned_instead_of_value_error(what, why))


# ---------------------------------------------------------------------------------------
# The controller, simulated: admission, decoding calls, transfers, training, kills, restarts
# ---------------------------------------------------------------------------------------

AdmitFn = Callable[[AdmitCase], AdmitOut]
DeathFn = Callable[[int, list[list[int]], dict[int, tuple[int, int]], list[int]], DeathOut]

#: Updates in a simulated run.
SIM_UPDATES = 8
#: The runs the checks simulate (3 seeds each).
SIM_CONFIGS: tuple[dict[str, int], ...] = (
    dict(n_gen=2, max_lag=0, B=2, room=2, slots=2, kills=1),
    dict(n_gen=2, max_lag=1, B=2, room=3, slots=2, kills=2),
    dict(n_gen=3, max_lag=2, B=3, room=3, slots=2, kills=2),
    dict(n_gen=1, max_lag=1, B=2, room=2, slots=1, kills=1),
)


def _sim_text(config: Mapping[str, int]) -> str:
    return ", ".join(f"{k} = {v}" for k, v in config.items())


def _fail_on_simulated_runs(admit_fn: AdmitFn, death_fn: DeathFn) -> None:
    """Every run of :data:`SIM_CONFIGS` (3 seeds each) with these admission and death
    handlers (the learner's one, the oracle's other): fail on the first broken rule."""
    for config in SIM_CONFIGS:
        for seed in range(3):
            run = simulate_controller(admit_fn, death_fn, seed=seed, **config)
            fail_on_violation(f"simulated run ({_sim_text(config)}, seed {seed})", run)


def _oracle_admit(case: AdmitCase) -> AdmitOut:
    return naive_admit(case)


@dataclass
class SimRun:
    """What :func:`simulate_controller` saw: the first violation (or ""), and the run's record."""

    violation: str = ""
    finished: bool = False
    events: int = 0
    admissions: list[tuple[int, int, int, int]] = field(default_factory=list)  # (k, g, incarnation, version)
    returned: dict[int, tuple[int, int]] = field(default_factory=dict)
    lost: list[tuple[int, int, int]] = field(default_factory=list)
    deaths: list[DeathCase] = field(default_factory=list)
    version_spread: int = 0  # the most two live generators' versions differed at an admission


def simulate_controller(
    admit_fn: AdmitFn,
    death_fn: DeathFn,
    *,
    seed: int,
    n_gen: int = 2,
    max_lag: int = 1,
    B: int = 2,
    room: int = 3,
    slots: int = 2,
    kills: int = 2,
    n_updates: int = SIM_UPDATES,
    kill_p: float = 0.08,
    max_events: int = 3000,
) -> SimRun:
    """A tiny event simulation of the Ray controller's loop, one random event at a time.

    Before every event the controller admits (``admit_fn``) and submits a decoding call to each
    idle generator that holds groups. An event is one of: a decoding call returns (each of the
    generator's first ``slots`` groups is finished with probability 1/2); a weight transfer
    reaches one generator (versions arrive per generator, late and in any order); the trainer
    trains update ``u`` once its ``B`` groups are back (then version ``u + 1`` is sent to every
    live generator); a busy generator is killed (``death_fn`` says what is lost; at most ``kills``
    times, each event with probability ``kill_p``); a dead generator restarts as its next incarnation, with no weights until the current
    version reaches it. Checked as it goes: the admissions (idle generators with weights, room,
    the lag bound with the generator's own version), every group returned once by the
    incarnation it was admitted to, each trained group's lag, the lost groups (exactly the dead
    generator's groups in flight, asked for again); at the end, every lost group returned by
    another incarnation. ``admitted`` keeps returned groups, as the ledger does.
    """
    rng = random.Random(seed)
    total = n_updates * B
    run = SimRun()
    alive, busy = [True] * n_gen, [False] * n_gen
    inc, delivered = [0] * n_gen, [-1] * n_gen
    held: list[list[int]] = [[] for _ in range(n_gen)]  # admitted, not returned, in admission order
    admitted: dict[int, tuple[int, int]] = {}
    start_version: dict[int, int] = {}
    transfers: list[tuple[int, int, int]] = [(g, 0, 0) for g in range(n_gen)]  # (generator, version, incarnation)
    next_k, u, kills_left = 0, 0, kills
    todo: list[int] = []

    def stop(message: str) -> SimRun:
        run.violation = message
        return run

    for event in range(max_events):
        run.events = event
        # admission, and a decoding call to every idle generator holding groups
        idle = [g for g in range(n_gen) if alive[g] and not busy[g]]
        rng.shuffle(idle)
        case = AdmitCase(
            next_k, tuple(todo), tuple(delivered), tuple(len(h) for h in held), tuple(idle), max_lag, B, room, total
        )
        groups, new_next, new_todo = admit_fn(case)
        versions = [delivered[g] for g in idle if delivered[g] >= 0]
        if len(versions) > 1:
            run.version_spread = max(run.version_spread, max(versions) - min(versions))
        dealt = [k for ks in groups.values() for k in ks]
        from_todo = [k for k in todo if k not in new_todo]
        if sorted(dealt) != sorted(from_todo + list(range(next_k, new_next))) or not set(new_todo) <= set(todo):
            return stop(
                f"at next_k = {next_k}, todo = {todo}, admit dealt {sorted(dealt)} and returned next_k = {new_next}, "
                f"todo = {list(new_todo)}: the groups dealt must be those taken from todo and next_k .. next_k' - 1"
            )
        for g, ks in sorted(groups.items()):
            if g not in idle:
                return stop(f"admit gave groups {list(ks)} to generator {g}, which is not idle (busy or dead)")
            if delivered[g] < 0:
                return stop(f"admit gave groups {list(ks)} to generator {g}, which has no weights yet (delivered = -1)")
            if len(held[g]) + len(ks) > room:
                return stop(
                    f"generator {g} was given {len(ks)} groups while holding {len(held[g])}: more than room = {room}"
                )
            for k in ks:
                if k >= total:
                    return stop(f"admit started group {k} >= total_groups = {total}")
                if k // B - delivered[g] > max_lag:
                    return stop(
                        f"group {k} was admitted to generator {g} holding version {delivered[g]}: update {k // B} trains "
                        f"on it, {k // B - delivered[g]} > max_lag = {max_lag} updates later"
                    )
                admitted[k] = (g, inc[g])
                start_version[k] = delivered[g]
                held[g].append(k)
                run.admissions.append((k, g, inc[g], delivered[g]))
        next_k, todo = new_next, list(new_todo)
        for g in idle:
            if held[g]:
                busy[g] = True
        # one event
        if u == n_updates:
            break
        options: list[tuple[str, int]] = [("return", g) for g in range(n_gen) if busy[g]]
        options += [("transfer", i) for i in range(len(transfers))]
        if all(k in run.returned for k in range(u * B, (u + 1) * B)):
            options.append(("train", 0))
        options += [("restart", g) for g in range(n_gen) if not alive[g]]
        victims = [g for g in range(n_gen) if busy[g]]
        if kills_left and victims and rng.random() < kill_p:
            options = [("kill", rng.choice(victims))]
        if not options:
            unseen = sorted(set(range(u * B, (u + 1) * B)) - set(run.returned))
            return stop(
                f"the run stalled before update {u}: groups {unseen} are neither decoding nor in todo, and no "
                "generator can be given one"
            )
        kind, x = rng.choice(options)
        if kind == "return":
            g = x
            back = [k for k in held[g][:slots] if rng.random() < 0.5]
            for k in back:
                if k in run.returned:
                    return stop(f"group {k} came back twice (it was generated again although it had been returned)")
                if admitted.get(k) != (g, inc[g]):
                    return stop(
                        f"group {k} came back from generator {g} but the ledger admitted it to {admitted.get(k)}"
                    )
                run.returned[k] = (g, inc[g])
                held[g].remove(k)
            busy[g] = False
        elif kind == "transfer":
            g, v, i = transfers.pop(x)
            if alive[g] and inc[g] == i:
                delivered[g] = max(delivered[g], v)
        elif kind == "train":
            for k in range(u * B, (u + 1) * B):
                if u - start_version[k] > max_lag:
                    return stop(
                        f"group {k} was started with version {start_version[k]} and trained on by update {u}: it lags "
                        f"{u - start_version[k]} > max_lag = {max_lag} updates"
                    )
            u += 1
            transfers += [(g, u, inc[g]) for g in range(n_gen) if alive[g]]
        elif kind == "kill":
            g = x
            kills_left -= 1
            flights = [list(h) for h in held]
            run.deaths.append(
                DeathCase(
                    g, tuple(tuple(h) for h in held), tuple(admitted.items()), tuple(todo), frozenset(held[g][slots:])
                )
            )
            lost, _, new_todo = death_fn(g, flights, dict(admitted), list(todo))
            truth = set(held[g])
            if set(lost) - truth:
                k = min(set(lost) - truth)
                said = "was already returned" if k in run.returned else "was not in flight on it"
                return stop(f"generator {g} died; group {k} was called lost but {said}: it would be generated twice")
            if truth - set(lost):
                return stop(
                    f"generator {g} died holding groups {sorted(truth)} but only {sorted(set(lost))} were called lost: "
                    f"groups {sorted(truth - set(lost))} would never be generated"
                )
            if sorted(new_todo) != sorted([*lost, *todo]):
                return stop(
                    f"after generator {g} died, todo = {list(new_todo)}: expected the lost groups and the old todo"
                )
            for k in lost:
                run.lost.append((k, g, admitted.pop(k)[1]))
            todo = list(new_todo)
            held[g], alive[g], busy[g], delivered[g] = [], False, False, -1
        else:  # restart: the next incarnation, with the current version on its way
            g = x
            alive[g], inc[g], delivered[g] = True, inc[g] + 1, -1
            transfers.append((g, u, inc[g]))
    if u < n_updates:
        missing = sorted(set(range(total)) - set(run.returned))
        return stop(f"the run never finished: {u} of {n_updates} updates, groups {missing[:6]} never came back")
    for k, g, i in run.lost:
        if run.returned.get(k) == (g, i) or k not in run.returned:
            return stop(f"group {k}, lost with generator {g} (incarnation {i}), was never generated again")
    run.finished = True
    return run


def death_cases() -> list[DeathCase]:
    """Every death of simulated runs with the oracles (more and likelier kills than the checks' runs), as
    checks' cases: the ledger as the controller held it at each kill."""
    cases: list[DeathCase] = []
    for n_gen, slots in ((2, 2), (3, 1)):
        for seed in range(6):
            run = simulate_controller(
                _oracle_admit,
                naive_death_out,
                seed=seed,
                n_gen=n_gen,
                max_lag=1,
                B=2,
                room=3,
                slots=slots,
                kills=5,
                kill_p=0.25,
            )
            for i, case in enumerate(run.deaths):
                cases.append(dataclasses.replace(case, as_sets=(seed + i) % 2 == 0))
    return cases


ADMIT = Exercise(
    name=AD,
    allowed=tuple(sorted(ALLOWED)),
    points=20,
    title="one admission step: deal groups to idle generators under the lag bound, each with its own version",
    checks=(_ad_shape, _ad_known, _ad_oracle, _ad_simulation, _ad_inputs, _ad_bad),
    advice="dealing one group at a time as the statement says (Admission is yours to use)",
    hints=(
        "Deal groups one at a time to the idle generators that have weights, always to the least loaded (what it "
        "holds plus what you gave it now; ties to the lower index), until each is full (`room`) or too stale for the "
        "next candidate. Re-queued groups (`todo`) go before new ones (`next_k`).",
        "Work on copies, so that the inputs stay unchanged: a local queue from `todo`, a local `next_k`, and a dict "
        "from each live generator (ascending) to the list of groups it receives. In the loop, pick the generator with "
        "`min` and a key of (load, index); stop once its load reaches `room`; a generator too stale for the candidate "
        "leaves the live ones and the loop goes on with the others.",
        "A candidate k is admissible for generator g only below `total_groups` and below the end of g's window: the "
        "groups of the max_lag + 1 batches after the weights g holds (`delivered[g]`), `groups_per_batch` per batch. "
        "Take a candidate out of the queue (or advance `next_k`) only once it is admitted. Validate the arguments and "
        "the idle indices first; `delivered[g] < 0` means no weights yet.",
    ),
)

ON_GENERATOR_DEATH = Exercise(
    name=GD,
    allowed=tuple(sorted(ALLOWED)),
    points=15,
    title="a generator dies: its lost groups (ascending), their ledger entries, the new re-request queue",
    checks=(_gd_shape, _gd_known, _gd_oracle, _gd_simulation, _gd_inputs, _gd_bad),
    advice="from in_flight[g] and the ledger (Death is yours to use)",
    hints=(
        "Everything lost is already in in_flight[g]; admitted is there to check and to read the incarnations, not to "
        "find the lost groups (it holds returned groups too).",
        "The lost groups are the generator's in-flight set, sorted, as a tuple. For each, the ledger `admitted` must "
        "say it went to this generator (a pair whose first item is g); anything else is an inconsistent ledger "
        "(`ValueError`), and so is a g out of range.",
        "Each lost entry is (group, generator, incarnation), the incarnation read from the ledger's pair. The lost "
        "groups go to the FRONT of the new queue, before the `todo` already waiting (both as tuples), so that they "
        "are generated again first. Return a `Death`.",
    ),
)

# ---------------------------------------------------------------------------------------
# Exercise 4: on_ready
# ---------------------------------------------------------------------------------------

OR = "on_ready"


class RayActorError(Exception):
    """What the stand-in's ``get`` raises for a call whose actor process died, is restarting, or was
    cut off (Ray's ``ray.exceptions.RayActorError``: its ``ActorUnavailableError``)."""


class ActorDiedError(RayActorError):
    """What the stand-in's ``get`` raises for a call to an actor that died with no restart left (Ray's
    ``ray.exceptions.ActorDiedError``, a ``RayActorError``). From a decoding call, a death like any
    other; from a probe, sent after the death: Ray will not restart it."""


class RayTaskError(Exception):
    """What the stand-in's ``get`` raises for a call whose method itself raised in a live actor (Ray's
    ``ray.exceptions.RayTaskError``, not a ``RayActorError``): not a death."""


#: the stand-in's exception for each kind of failed result: ("error", message) is a RayActorError
#: (Ray's ActorUnavailableError: restarting, or cut off), ("died", ...) an ActorDiedError (dead; no
#: restart left when a probe raises it), ("task", ...) a RayTaskError (the method raised)
RAISED: dict[str, type[Exception]] = {"error": RayActorError, "died": ActorDiedError, "task": RayTaskError}


class _Blocked(Exception):
    """Raised by the stand-in when the learner reads a call that ``ray.wait`` did not return."""


@dataclass(frozen=True)
class Ref:
    """An ObjectRef: what a ``.remote()`` call returns at once."""

    n: int

    def __repr__(self) -> str:
        return f"ObjectRef({self.n})"


class StandInRay:
    """The pieces of Ray's API the handler may touch: ``get`` of the call that ``ray.wait`` returned
    (its value, or the exception of its kind, :data:`RAISED`), and ``exceptions.RayActorError``,
    ``ActorDiedError`` (a subclass of it) and ``RayTaskError``. A ``get`` of any other call, or a
    ``wait``, is recorded (in real Ray it may block the loop) and refused."""

    def __init__(self) -> None:
        self.exceptions = type(
            "exceptions",
            (),
            {"RayActorError": RayActorError, "ActorDiedError": ActorDiedError, "RayTaskError": RayTaskError},
        )
        self.ready: Ref | None = None
        self.result: tuple[str, Any] = ("value", None)  # ("value", v), or (kind, message) with kind in RAISED
        self.misused: str = ""

    def get(self, ref: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(ref, list):
            return [self.get(r) for r in ref]
        if ref != self.ready:
            self.misused = self.misused or f"get:{ref!r}"
            raise _Blocked(f"{ref!r} is not the call ray.wait returned")
        kind, value = self.result
        if kind in RAISED:
            raise RAISED[kind](value)
        return copy.deepcopy(value)

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.misused = self.misused or "wait"
        raise _Blocked("ray.wait is the loop's own call")


#: a call as the controller records it: (method, generator, epoch): the epoch a decoding call
#: carries, or the one a rejoin probe asks for
CallInfo = tuple[str, int, int]


@dataclass
class LoopCase:
    """One finished call and the controller's state around it (plain values, rebuilt per use)."""

    calls: tuple[tuple[int, CallInfo], ...]  # ref number -> call
    inc: tuple[int, ...]
    in_flight: tuple[tuple[int, ...], ...]
    down: tuple[int, ...]
    todo: tuple[int, ...]
    done: tuple[tuple[int, tuple[int, int]], ...]
    ready: int  # the ref number ray.wait returned
    result: tuple[str, Any]  # ("value", v), or (kind, message) with kind in RAISED
    gone: tuple[int, ...] = ()  # generators Ray will not restart (a probe raised ActorDiedError)

    def info(self) -> CallInfo:
        return dict(self.calls)[self.ready]

    def text(self) -> str:
        return f"{OR}: {_call_text(*self.info(), self.result)}"


def _call_text(method: str, g: int, i: int, result: tuple[str, Any]) -> str:
    """A finished call and its outcome, in a few words."""
    kind, value = result
    outcome = f"raised {RAISED[kind].__name__}" if kind in RAISED else f"returned {short_repr(value)}"
    return f"({method!r}, {g}, {i}) {outcome}"


@dataclass
class LoopRun:
    """The state handed to the learner, with the controller's pieces around it."""

    loop: dict[str, Any]
    ray: StandInRay
    refs: dict[int, Ref]
    submitted: list[tuple[Ref, str, int, int]] = field(default_factory=list)
    deaths: list[int] = field(default_factory=list)
    next_ref: int = 1000


def _check_submit(method: Any, g: Any, epoch: Any, n_gen: int) -> None:
    """The handler submits rejoin probes only: ``submit("rejoin", g, epoch)``."""
    if method != "rejoin" or as_int(g) is None or not 0 <= g < n_gen or as_int(epoch) is None:
        raise ValueError(
            f"submit({method!r}, {g!r}, {epoch!r}): the handler submits rejoin probes only, "
            "submit('rejoin', g, epoch), with the epoch the generator is asked to take"
        )


def _loop_of(case: LoopCase) -> LoopRun:
    """Fresh containers for ``case`` (the learner's ``loop``), with ``submit`` and ``died``."""
    refs = {n: Ref(n) for n, _ in case.calls}
    run = LoopRun(
        loop={
            "calls": {refs[n]: info for n, info in case.calls},
            "inc": list(case.inc),
            "in_flight": [set(ks) for ks in case.in_flight],
            "down": set(case.down),
            "gone": set(case.gone),
            "todo": list(case.todo),
            "done": dict(case.done),
        },
        ray=StandInRay(),
        refs=refs,
    )

    def submit(method: str, g: int, epoch: int | None = None) -> Ref:
        _check_submit(method, g, epoch, len(run.loop["inc"]))
        run.next_ref += 1
        ref = Ref(run.next_ref)
        run.submitted.append((ref, method, int(g), int(epoch)))  # type: ignore[arg-type]
        return ref

    def died(g: int) -> None:
        """The controller's bookkeeping of a death (exercise 3): the lost groups, ascending, to the
        front of todo; g marked down."""
        run.deaths.append(g)
        loop = run.loop
        loop["todo"][:0] = sorted(loop["in_flight"][g])
        loop["in_flight"][g] = set()
        loop["down"].add(g)

    run.loop["submit"], run.loop["died"] = submit, died
    run.ray.ready, run.ray.result = refs[case.ready], case.result
    return run


def _state(loop: Mapping[str, Any]) -> dict[str, Any]:
    """The comparable part of a loop: the calls' values (refs dropped), the rest as sorted lists."""
    return {
        "calls": sorted(loop["calls"].values()),
        "inc": list(loop["inc"]),
        "in_flight": [sorted(ks) for ks in loop["in_flight"]],
        "down": sorted(loop["down"]),
        "gone": sorted(loop["gone"]),
        "todo": list(loop["todo"]),
        "done": dict(sorted(loop["done"].items())),
    }


def naive_on_ready(case: LoopCase) -> dict[str, Any]:
    """The state after the finished call, read off a table of the outcomes (a RayTaskError has none:
    it is let out, see :func:`_or_step`)."""
    method, g, i = case.info()
    kind, value = case.result
    calls = [info for n, info in case.calls if n != case.ready]
    inc, down, gone, todo = list(case.inc), set(case.down), set(case.gone), list(case.todo)
    in_flight = [set(ks) for ks in case.in_flight]
    done = dict(case.done)
    declined = kind == "value" and method == "run" and bool(value.get("restarted"))
    if method == "rejoin" and kind == "died":  # sent after the death: no restart left; no probe
        down.discard(g)
        gone.add(g)
    elif method == "run" and (kind in ("error", "died") or declined):  # the generator died
        todo = sorted(in_flight[g]) + todo
        in_flight[g] = set()
        down.add(g)
        calls.append(("rejoin", g, inc[g] + 1))  # a new epoch
    elif method == "run":  # its groups are back
        for k in value["groups"]:
            done[k] = (g, i)
            in_flight[g].discard(k)
    elif kind == "error":  # still restarting: another probe, the same epoch
        calls.append(("rejoin", g, i))
    else:  # it answered under the new epoch
        inc[g] = value["incarnation"]
        down.discard(g)
    return {
        "calls": sorted(calls),
        "inc": inc,
        "in_flight": [sorted(ks) for ks in in_flight],
        "down": sorted(down),
        "gone": sorted(gone),
        "todo": todo,
        "done": dict(sorted(done.items())),
    }


def _or_step(fn: Callable[..., Any], run: LoopRun, what: str) -> bool:
    """One call of the learner's handler on ``run`` (the ref ``run.ray.ready``); a failure names a
    misuse of Ray's calls, an exception the handler let out, or a RayTaskError it swallowed. True if
    the call raised RayTaskError and the handler let it out, as it must (the loop then stops)."""
    ref = run.ray.ready
    info = run.loop["calls"].get(ref)
    kind, value = run.ray.result
    let_out = False

    def no_sleep(*args: Any, **kwargs: Any) -> None:  # the handler runs inside the loop: a pause stops it
        run.ray.misused = run.ray.misused or "sleep"
        raise _Blocked("time.sleep inside on_ready blocks the loop")

    real_sleep = time.sleep
    time.sleep = no_sleep
    try:
        call(fn, ref, run.ray, run.loop)
    except LearnerError as exc:
        if run.ray.misused:
            pass  # named below
        elif kind == "task" and isinstance(exc.error, RayTaskError):
            let_out = True  # the method failed in a live actor: not the loop's to handle
        elif kind == "task":
            fail(
                f"{what}: on_ready raised {type(exc.error).__name__} on a call that raised RayTaskError: let the "
                "RayTaskError itself out (catch only ray.exceptions.RayActorError), so the run stops with the "
                "method's own error"
            )
        elif isinstance(exc.error, ActorDiedError) and info is not None and info[0] == "rejoin":
            fail(
                f"{what}: on_ready let ActorDiedError out of a probe: the generator is dead for good (no restart "
                "left) and the run goes on without it; catch ray.exceptions.ActorDiedError (before RayActorError, "
                "its parent)"
            )
        elif isinstance(exc.error, ActorDiedError):
            fail(
                f"{what}: on_ready let ActorDiedError out of a decoding call: a death like any other (died, a probe "
                "for the next epoch); catch ray.exceptions.RayActorError, its parent"
            )
        elif isinstance(exc.error, RayActorError):
            fail(
                f"{what}: on_ready let RayActorError out: a call that raises says the generator died (a probe: it is "
                "still restarting); catch ray.exceptions.RayActorError"
            )
        elif info is not None and info[0] == "run" and kind == "value" and value.get("restarted"):
            fail(
                f"{what}: on_ready raised {type(exc.error).__name__} on a call declined by the generator's new "
                "incarnation: it carries no groups; it means the generator died (handle it as a death)"
            )
        else:
            raise
    finally:
        time.sleep = real_sleep
    if run.ray.misused == "sleep":
        fail(
            f"{what}: on_ready called time.sleep: the handler runs inside the loop, so a pause stops every other "
            "generator's results from being seen; submit the probe now (submit spaces repeated probes) and return"
        )
    if run.ray.misused == "wait":
        fail(f"{what}: on_ready called ray.wait: waiting is the loop's job; the handler reacts to the one call given")
    if run.ray.misused:
        other = run.ray.misused[len("get:") :]
        fail(
            f"{what}: on_ready called ray.get on {other}, not on the call ray.wait returned: it may not have "
            "finished, and ray.get would block the whole loop; record it in loop['calls'] and return"
        )
    if kind == "task" and not let_out:
        g = info[1] if info is not None else "?"
        fail(
            f"{what}: on_ready swallowed a RayTaskError: the method raised in generator {g}'s live process, not a "
            "death, and the loop cannot guess the fix; catch RayActorError, not Exception, and let it out"
        )
    missing = [ref for ref, _, _, _ in run.submitted if ref not in run.loop["calls"]]
    if missing:
        fail(
            f"{what}: on_ready submitted {missing[0]!r} but did not put it in loop['calls'] (as ('rejoin', g, "
            "epoch)): the loop waits only on the calls it knows"
        )
    return let_out


def _or_explain(case: LoopCase, got: dict[str, Any], want: dict[str, Any], deaths: list[int], stale: bool) -> str:
    """Why the state after the learner's handler differs from the oracle's, in the learner's terms
    (``stale``: the finished call's ref is still in ``loop['calls']``)."""
    method, g, i = case.info()
    kind, value = case.result
    declined = kind == "value" and bool(value.get("restarted"))
    died = method == "run" and (kind in ("error", "died") or declined)
    if stale:
        return "the finished call is still in loop['calls']: pop it, or the loop would wait on it again"
    which = "decoding call" if method == "run" else "probe"
    if method == "rejoin" and kind == "died":
        if deaths:
            return (
                f"loop['died']({deaths[0]}) was called again after generator {g}'s probe raised ActorDiedError: "
                "its death was seen when it went down; only mark it gone"
            )
        if any(c[:2] == ("rejoin", g) for c in got["calls"]):
            return (
                f"re-probed generator {g} after its probe raised ActorDiedError: sent after the death, a probe gets "
                "Ray's record: dead, no restart left. Into loop['gone'], out of loop['down'], no probe"
            )
        if g not in got["gone"]:
            return (
                f"generator {g}'s probe raised ActorDiedError (no restart left) but it is not in loop['gone']: the "
                "loop would deal it groups again"
            )
        if g in got["down"]:
            return (
                f"generator {g} is gone (its probe raised ActorDiedError) but still in loop['down']: it will never "
                "answer a probe, and the run would wait for it; take it out"
            )
        return _first_difference(got, want)
    if set(got["gone"]) - set(want["gone"]):
        h = sorted(set(got["gone"]) - set(want["gone"]))[0]
        if method == "run" and kind == "died" and h == g:
            return (
                f"generator {g}'s decoding call raised ActorDiedError and it was taken as gone: that call saw a "
                "death, not whether Ray restarts it; died and a probe, as any death: only the probe's ActorDiedError "
                "means gone"
            )
        return (
            f"generator {h} was added to loop['gone'], but only a probe that raises ActorDiedError says Ray will "
            f"not restart it; this {which} {'answered' if kind == 'value' else 'raised ' + RAISED[kind].__name__}"
        )
    for h in case.gone:
        if any(c[:2] == ("rejoin", h) for c in got["calls"]):
            return (
                f"re-probed generator {h} after ActorDiedError: Ray will not restart it (it is in loop['gone']); "
                "send it nothing more"
            )
    if died and g not in deaths:
        how = f"raised {RAISED[kind].__name__}" if kind in RAISED else "was declined by a process holding another epoch"
        return (
            f"generator {g} died (its decoding call {how}) but loop['died']({g}) was not called: its groups in "
            "flight would never come back"
        )
    if not died and deaths and method == "rejoin" and kind == "error":
        return (
            f"loop['died']({deaths[0]}) was called again on an 'unavailable' probe: generator {g}'s death was seen "
            "when it went down (its groups are asked for already); only probe again"
        )
    if not died and deaths:
        return f"loop['died']({deaths[0]}) was called, but nothing died: the call answered normally"
    e = case.inc[g] + 1
    if died and ("rejoin", g, e) not in got["calls"]:
        old = [c for c in got["calls"] if c[:2] == ("rejoin", g)]
        if old:
            return (
                f"after generator {g}'s death, ask it to rejoin under a new epoch, loop['inc'][{g}] + 1 = {e}, not "
                f"{old[0][2]}: a live generator that was only cut off would keep its epoch, and calls meant for the "
                "old one would not be declined"
            )
        return (
            f"after generator {g}'s death, probe it: submit('rejoin', {g}, {e}) and record the ref in loop['calls'] "
            f"as ('rejoin', {g}, {e}); its answer says when it holds the new epoch"
            + (" (or, raising ActorDiedError, that Ray will not restart it)" if kind == "died" else "")
        )
    if method == "rejoin" and kind == "error" and ("rejoin", g, i) not in got["calls"]:
        return (
            f"generator {g} is still restarting (its probe raised RayActorError: unavailable): send another probe "
            f"for the same epoch {i} and return, the loop must not wait here"
        )
    if method == "rejoin" and kind == "value":
        j = value["incarnation"]
        if got["inc"][g] != j:
            return (
                f"generator {g} answered under epoch {j}: its calls must carry {j} from now on "
                f"(loop['inc'][{g}] = {j}), or it declines every one"
            )
        if g in got["down"]:
            return f"generator {g} is back (it answered under epoch {j}): remove it from loop['down']"
    if method == "run" and not died:
        ks = value["groups"]
        wrong = [k for k in ks if got["done"].get(k) != (g, i)]
        if wrong:
            k = wrong[0]
            return (
                f"group {k} came back but loop['done'][{k}] = {short_repr(got['done'].get(k))}; expected ({g}, {i}), "
                "the generator and the epoch the call carried"
            )
        if set(ks) & set(got["in_flight"][g]):
            return f"the groups that came back are still in loop['in_flight'][{g}]: remove them"
    return _first_difference(got, want)


def _first_difference(got: dict[str, Any], want: dict[str, Any]) -> str:
    for key in ("calls", "inc", "in_flight", "down", "gone", "todo", "done"):
        if got[key] != want[key]:
            return f"loop[{key!r}] is {short_repr(got[key])}; expected {short_repr(want[key])}"
    return "the state differs"


def _or_compare(fn: Callable[..., Any], case: LoopCase) -> None:
    run = _loop_of(case)
    what = case.text()
    if _or_step(fn, run, what):
        return  # a RayTaskError let out, as it must be: the loop stops
    got, want = _state(run.loop), naive_on_ready(case)
    if got != want or len(run.deaths) != _deaths_due(case):
        if len(run.deaths) > 1:
            fail(f"{what}: loop['died'] was called {len(run.deaths)} times for one death")
        fail(f"{what}: {_or_explain(case, got, want, run.deaths, run.ray.ready in run.loop['calls'])}")


def _deaths_due(case: LoopCase) -> int:
    """How many times the handler must call ``died``: once for a decoding call's death (raised, declined), never
    for a probe (its generator's death was seen when it went down)."""
    method = case.info()[0]
    kind, value = case.result
    return int(method == "run" and (kind in ("error", "died") or (kind == "value" and bool(value.get("restarted")))))


def worked_loop(ready: int, result: tuple[str, Any]) -> LoopCase:
    """The statement's loop: generator 0 (epoch 0) decoding 4 and 6, generator 1 (epoch 1)
    decoding 5 and 7, generator 2 down after its death in epoch 0 and asked to rejoin as 1,
    group 3 re-requested, groups 0-2 returned."""
    return LoopCase(
        calls=((1, ("run", 0, 0)), (2, ("run", 1, 1)), (3, ("rejoin", 2, 1))),
        inc=(0, 1, 0),
        in_flight=((4, 6), (5, 7), ()),
        down=(2,),
        todo=(3,),
        done=((0, (0, 0)), (1, (1, 1)), (2, (0, 0))),
        ready=ready,
        result=result,
    )


KNOWN_LOOPS: tuple[LoopCase, ...] = (
    worked_loop(1, ("value", {"groups": [4, 6], "incarnation": 0})),  # groups back
    worked_loop(2, ("error", "the actor died")),  # killed while decoding
    worked_loop(2, ("value", {"restarted": 1, "incarnation": None, "expected": 1})),  # declined by a new process
    worked_loop(3, ("error", "unavailable: the actor is restarting")),  # still restarting
    worked_loop(3, ("value", {"incarnation": 1, "was": None, "pid": 4242})),  # a new process holds epoch 1
    worked_loop(3, ("value", {"incarnation": 1, "was": 0, "pid": 17})),  # the live process, cut off, fenced
    worked_loop(2, ("died", "the actor died unexpectedly")),  # killed while decoding: a death, a probe
    worked_loop(3, ("died", "the actor died: no restart left")),  # its probe: no restart left: gone
    worked_loop(2, ("task", "ValueError: the method raised")),  # the method raised in a live actor: let out
    worked_loop(3, ("task", "ValueError: the method raised")),  # ... in a probe as well
)


def _random_loop(rng: random.Random) -> LoopCase:
    """A consistent state: generators decoding (one call each), restarting (one probe each) or gone
    (none), and one of their calls finished with an outcome its kind allows."""
    n_gen = rng.randint(2, 4)
    inc = [rng.randint(0, 2) for _ in range(n_gen)]
    k = itertools.count(rng.randint(0, 20))
    done = {next(k): (rng.randrange(n_gen), 0) for _ in range(rng.randint(0, 4))}
    calls: list[tuple[int, CallInfo]] = []
    down: list[int] = []
    gone: list[int] = []
    flights: list[tuple[int, ...]] = []
    for g in range(n_gen):
        if g > 0 and rng.random() < 0.15:  # dead for good earlier: no call, nothing held
            gone.append(g)
            flights.append(())
        elif rng.random() < 0.3:
            down.append(g)
            calls.append((len(calls) + 1, ("rejoin", g, inc[g] + 1)))
            flights.append(())
        else:
            ks = tuple(next(k) for _ in range(rng.randint(1, 3)))
            calls.append((len(calls) + 1, ("run", g, inc[g])))
            flights.append(ks)
    todo = tuple(next(k) for _ in range(rng.choice([0, 0, 1, 2])))
    ready, (method, g, i) = rng.choice(calls)
    if method == "run":
        result = rng.choice(
            [
                ("value", {"groups": list(flights[g]), "incarnation": i}),
                ("error", "the actor died"),
                ("value", {"restarted": 1, "incarnation": rng.choice([None, i + 1]), "expected": i}),
                ("died", "the actor died: no restart left"),
                ("task", "ValueError: the method raised"),
            ]
        )
    else:
        result = rng.choice(
            [
                ("error", "unavailable: the actor is restarting"),
                ("value", {"incarnation": i, "was": rng.choice([None, i - 1])}),
                ("died", "the actor died: no restart left"),
                ("task", "ValueError: the method raised"),
            ]
        )
    return LoopCase(
        tuple(calls), tuple(inc), tuple(flights), tuple(down), todo, tuple(done.items()), ready, result, tuple(gone)
    )


@dataclass(eq=False)
class _Actor:
    """A generator actor as Ray runs it: alive, restarting or dead for good (``final``: no restart
    left, every call raises ActorDiedError: its decoding call, then its probe), the epoch its process
    holds (None: a new process, told nothing yet), and the groups it still holds after a reply of its
    was lost."""

    epoch: int | None = 0
    alive: bool = True
    restart_in: int = 0  # events until the new process is up
    held: set[int] = field(default_factory=set)
    final: bool = False


@dataclass
class ControllerRun:
    """What :func:`simulate_loop` saw: the first violation (or ""), and what happened."""

    violation: str = ""
    finished: bool = False
    kills: int = 0
    cut_offs: int = 0
    declined: int = 0
    unavailable: int = 0
    final_kills: int = 0
    gone_calls: int = 0  # decoding calls that raised ActorDiedError
    gone_probes: int = 0  # probes that raised ActorDiedError
    events: int = 0


def simulate_loop(
    handler: Callable[[LoopRun, str], None],
    *,
    seed: int,
    n_gen: int = 2,
    total: int = 40,
    room: int = 2,
    kills: int = 2,
    kill_p: float = 0.1,
    cut_offs: int = 1,
    final_kills: int = 0,
    final_while_restarting: bool = False,
    max_events: int = 1500,
) -> ControllerRun:
    """The controller's loop around the handler, with a stand-in for Ray.

    Each turn: admission deals ``room`` groups (re-requests first) to every generator that is not
    down and has no decoding call, and submits its call, carrying ``loop["inc"][g]``; then either a
    generator is killed (while decoding, or idle: then its next call runs on the new process, which
    holds no epoch and declines it), or a live generator is cut off (its decoding call raises while
    it lives on, holding the call's groups: it returns them with its next accepted call unless a
    rejoin fences it first), or one finished call is handed to the handler, as ``ray.wait`` would.
    A rejoin probe of a restarting actor raises ("unavailable") until its new process is up; a live
    actor answering one takes the epoch asked for and drops what it holds. ``final_kills`` generators
    (never the last one) die with no restart left (``final_while_restarting``: one already restarting,
    so its probe raises): every call to it raises ActorDiedError from then on, a decoding call (a death:
    died, a probe) and then the probe (gone). Checked after each call: every group comes back once,
    from the epoch it was sent with; at the end, every group is back and no generator is left down
    (the gone ones out of it, never probed again)."""
    rng = random.Random(seed)
    actors = [_Actor() for _ in range(n_gen)]
    stats = ControllerRun()
    state = LoopRun(
        loop={
            "calls": {},
            "inc": [0] * n_gen,
            "in_flight": [set() for _ in range(n_gen)],
            "down": set(),
            "gone": set(),
            "todo": [],
            "done": {},
        },
        ray=StandInRay(),
        refs={},
    )
    loop = state.loop
    groups_of: dict[Ref, tuple[int, ...]] = {}
    failed: set[Ref] = set()  # decoding calls that raise: their process was killed, or their reply lost
    on_process: dict[Ref, tuple[int, int]] = {}  # a decoding call -> (generator, process count) it was sent to
    process = [0] * n_gen
    next_k = 0
    returned: dict[int, tuple[int, int]] = {}

    def new_ref() -> Ref:
        state.next_ref += 1
        return Ref(state.next_ref)

    def submit(method: str, g: int, epoch: int | None = None) -> Ref:
        _check_submit(method, g, epoch, n_gen)
        ref = new_ref()
        state.submitted.append((ref, method, int(g), int(epoch)))  # type: ignore[arg-type]
        return ref

    def died(g: int) -> None:
        state.deaths.append(g)
        loop["todo"][:0] = sorted(loop["in_flight"][g])
        loop["in_flight"][g] = set()
        loop["down"].add(g)

    loop["submit"], loop["died"] = submit, died
    for event in range(max_events):
        stats.events = event
        for h, a in enumerate(actors):  # restarts progress with time
            if not a.alive and not a.final:
                a.restart_in -= 1
                if a.restart_in <= 0:  # a new process: no epoch, nothing held
                    a.alive, a.epoch, a.held = True, None, set()
                    process[h] += 1
        busy = {info[1] for info in loop["calls"].values() if info[0] == "run"}
        for g in range(n_gen):
            if g in loop["down"] or g in loop["gone"] or g in busy or rng.random() < 0.6:  # idle a while
                continue
            ks: list[int] = []
            while len(ks) < room and (loop["todo"] or next_k < total):
                if loop["todo"]:
                    ks.append(loop["todo"].pop(0))
                else:
                    ks.append(next_k)
                    next_k += 1
            if ks:
                ref = new_ref()
                loop["calls"][ref] = ("run", g, loop["inc"][g])
                loop["in_flight"][g].update(ks)
                groups_of[ref] = tuple(ks)
                on_process[ref] = (g, process[g] if actors[g].alive else process[g] + 1)
        if len(returned) == total and not loop["down"] and not loop["calls"]:
            stats.finished = True
            return stats
        alive = [g for g in range(n_gen) if actors[g].alive]
        decoding = {
            ref: info[1]
            for ref, info in loop["calls"].items()
            if info[0] == "run"
            and ref not in failed
            and actors[info[1]].alive
            and on_process[ref][1] == process[info[1]]
        }
        if stats.kills < kills and alive and rng.random() < kill_p:
            busy = {info[1] for info in loop["calls"].values() if info[0] == "run"}
            idle = [g for g in alive if g not in busy]
            g = rng.choice(idle if idle and rng.random() < 0.8 else alive)  # idle: its next call is declined
            actors[g].alive, actors[g].restart_in = False, rng.randint(3, 10)
            stats.kills += 1
            failed.update(ref for ref, h in decoding.items() if h == g)
            continue
        candidates = [h for h in range(n_gen) if not actors[h].final]
        if stats.final_kills < final_kills and len(candidates) > 1 and rng.random() < kill_p:
            restarting = [h for h in candidates if not actors[h].alive]
            if restarting or not final_while_restarting or stats.kills >= kills:
                g = rng.choice(restarting if final_while_restarting and restarting else candidates)
                actors[g].alive, actors[g].final = False, True  # no restart left: every call raises ActorDiedError
                stats.final_kills += 1
                continue
        if stats.cut_offs < cut_offs and decoding and rng.random() < kill_p:
            ref = rng.choice(sorted(decoding, key=lambda r: r.n))  # its reply is lost; the actor lives on
            g = decoding[ref]
            actors[g].held |= set(groups_of[ref])
            failed.add(ref)
            stats.cut_offs += 1
            continue
        finished = [
            ref
            for ref, (method, g, _) in loop["calls"].items()
            if method == "rejoin" or ref in failed or actors[g].alive or actors[g].final
        ]
        if not finished:
            continue  # a call waits for a restart: time passes
        ref = rng.choice(finished)
        method, g, i = loop["calls"][ref]
        a = actors[g]
        if a.final:
            result: tuple[str, Any] = ("died", "the actor died: no restart left")
            if method == "run":
                stats.gone_calls += 1
            else:
                stats.gone_probes += 1
        elif method == "run" and ref in failed:
            result = ("error", "the actor died, or is unavailable")
        elif method == "run" and a.epoch != i:
            result = ("value", {"restarted": 1, "incarnation": a.epoch, "expected": i})
            stats.declined += 1
        elif method == "run":
            result = ("value", {"groups": sorted(set(groups_of[ref]) | a.held), "incarnation": i})
            a.held = set()
        elif not a.alive:
            result = ("error", "unavailable: the actor is restarting")
            stats.unavailable += 1
        else:
            result = ("value", {"incarnation": i, "was": a.epoch})
            a.epoch, a.held = i, set()  # fenced: whatever it held is dropped
        state.ray.ready, state.ray.result, state.ray.misused = ref, result, ""
        state.submitted.clear()
        state.deaths.clear()
        done_before = dict(loop["done"])
        case = LoopCase(
            tuple((r.n, info) for r, info in loop["calls"].items()),
            tuple(loop["inc"]),
            tuple(tuple(sorted(ks)) for ks in loop["in_flight"]),
            tuple(sorted(loop["down"])),
            tuple(loop["todo"]),
            tuple(loop["done"].items()),
            ref.n,
            result,
            tuple(sorted(loop["gone"])),
        )
        what = f"simulated run (seed {seed}, {n_gen} generators, event {event}): {_call_text(method, g, i, result)}"
        handler(state, what)
        if len(state.deaths) > 1:
            stats.violation = f"{what}: loop['died'] was called {len(state.deaths)} times for one death"
            return stats
        got, want = _state(loop), naive_on_ready(case)
        if got != want or len(state.deaths) != _deaths_due(case):
            stats.violation = f"{what}: {_or_explain(case, got, want, state.deaths, ref in loop['calls'])}"
            return stats
        for k, who in loop["done"].items():
            if done_before.get(k) == who:
                continue
            if k in returned:
                stats.violation = f"{what}: group {k} was recorded as returned twice"
                return stats
            if method != "run" or result[0] != "value" or k not in result[1].get("groups", ()):
                stats.violation = f"{what}: loop['done'][{k}] was set, but this call did not return group {k}"
                return stats
            if who != (g, i):
                stats.violation = (
                    f"{what}: group {k} was recorded as {short_repr(who)}; expected ({g}, {i}), the generator and "
                    "the epoch the call carried"
                )
                return stats
            returned[k] = who
    missing = sorted(set(range(total)) - set(returned))
    down = sorted(loop["down"])
    stats.violation = (
        f"simulated run (seed {seed}, {n_gen} generators): the run never finished after {max_events} events: "
        + (f"generator(s) {down} never came back" if down else f"groups {missing[:6]} never came back")
        + ("; " + _stuck_reason(loop, actors) if down or missing else "")
    )
    return stats


def _stuck_reason(loop: Mapping[str, Any], actors: list[_Actor]) -> str:
    """Why a simulated run never finished, read off the loop's state."""
    for g, a in enumerate(actors):
        if a.final and g in loop["down"]:
            return (
                f"generator {g} died for good (its probe raised ActorDiedError) but is still in loop['down']: "
                "take it out, into loop['gone']"
            )
        if a.alive and a.epoch is not None and loop["inc"][g] != a.epoch:
            return (
                f"generator {g} holds epoch {a.epoch} but its calls still carry {loop['inc'][g]}, so it declines "
                "them: record the epoch the probe answers with"
            )
        if g in loop["down"] and not any(info[:2] == ("rejoin", g) for info in loop["calls"].values()):
            return f"generator {g} is down with no probe in flight: probe it until it answers under a new epoch"
    return "see the calls in flight"


#: Simulated runs the check drives the learner's handler through.
SIM_LOOPS = 10


def loop_config(seed: int) -> dict[str, Any]:
    """The simulated run of ``seed``: 2-3 generators, 2-4 kills, 1-2 cut-offs, 1-2 groups per call; in
    six runs of ten one generator dies for good (in five of those one already restarting, if any)."""
    return dict(
        seed=seed,
        n_gen=2 + seed % 2,
        kills=2 + seed % 3,
        cut_offs=1 + seed % 2,
        kill_p=0.15,
        room=1 + seed % 2,
        final_kills=int(seed % 4 < 2),
        final_while_restarting=seed % 4 == 1 or seed % 8 == 0,
    )


@check_case(
    "each kind of finished call: groups back, a decoding call that raised, one declined, a probe answered "
    "'unavailable', a new process and a live one cut off answering under the new epoch, ActorDiedError from a "
    "decoding call (a death) and from a probe (no restart left: gone), RayTaskError (the method raised)"
)
def _or_known(fn: Callable[..., Any]) -> None:
    for case in KNOWN_LOOPS:
        _or_compare(fn, case)


@check_case(
    "random controller states (2-4 generators, some restarting, some gone for good, re-requests waiting) against an "
    "oracle"
)
def _or_oracle(fn: Callable[..., Any]) -> None:
    rng = random.Random(7)
    for _ in range(150):
        _or_compare(fn, _random_loop(rng))


@check_case(
    "simulated runs with a stand-in for Ray (kills while decoding and while idle, some with no restart left: a "
    "death, then the probe raises ActorDiedError, live "
    "generators cut off while holding groups, slow restarts): every group back once, from the epoch it was sent "
    "with, every generator not gone back, a gone one never probed again, nothing blocks",
    time_limit=20.0,
)
def _or_simulation(fn: Callable[..., Any]) -> None:
    def handler(state: LoopRun, what: str) -> None:
        _or_step(fn, state, what)

    for seed in range(SIM_LOOPS):
        run = simulate_loop(handler, **loop_config(seed))
        if run.violation:
            fail(run.violation)


ON_READY = Exercise(
    name=OR,
    points=20,
    title="the controller's loop: react to the one finished call, deaths, cut-offs and restarts included, fenced by "
    "epochs, without blocking",
    checks=(_or_known, _or_oracle, _or_simulation),
    advice="from ray.get of the one finished call and the loop's own dict",
    hints=(
        "Take the finished call's record out of `loop['calls']` first: it says what the call was (decoding or a "
        "probe), to which generator and which epoch. Then read its outcome with `ray.get` on that call only, inside "
        "a `try` that catches `ray.exceptions.ActorDiedError` first, then `ray.exceptions.RayActorError` (its "
        "parent: `except` clauses are tried in order), and nothing else, so that a `RayTaskError` goes out.",
        "A decoding call has three outcomes: groups (each is done, by the call's generator and epoch, and no longer in "
        "flight), an exception (`ActorDiedError` included), or an answer with `restarted` in it. The last two are "
        "the same news, a death: the controller's `died` does the bookkeeping, and a rejoin probe goes out for the "
        "next epoch.",
        "A probe has three outcomes. `ActorDiedError`: sent after the death, the probe meets Ray's record of the "
        "actor, dead with no restart left: into `gone`, out of `down`, no probe and no second `died`. Another "
        "exception means the actor is still restarting: another probe for the same epoch goes out, recorded in "
        "`loop['calls']` like the first, and the handler returns. An answer means the actor now holds that epoch, "
        "which every later call to it must carry; it is no longer down.",
    ),
)


EXERCISES: tuple[Exercise, ...] = (BUNDLES_FOR, ADMIT, ON_GENERATOR_DEATH, ON_READY)
