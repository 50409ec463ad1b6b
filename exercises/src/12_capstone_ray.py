# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Exercises 12 · Capstone, part 2: the same run on Ray
#
# This notebook is generated from `exercises/src/12_capstone_ray.py`; the worked solutions
# are in `solutions/12_capstone_ray.ipynb`. Write the function bodies where they raise
# `NotImplementedError`, run the *check yourself* cell under each one, and when all pass
# grade the notebook from a terminal:
#
# ```
# course grade exercises/12_capstone_ray.ipynb
# ```
#
# The equations are numbered as in `lessons/12_capstone_ray.ipynb`. Lesson 12 runs lesson
# 11's asynchronous system as **one controller** (the notebook's own Python process, Ray's
# *driver*) driving Ray actors: trainers and generators placed in a placement group,
# decoding calls submitted with `.remote()`, and a loop around `ray.wait` that reacts to
# whatever finishes first (`course_lib/capstone_ray/controller.py`). Three decisions of that
# controller are pure functions you can write and test without starting Ray, and the
# controller calls exactly these: where each actor goes, which groups each idle generator
# may start now, and what a generator's death costs. The fourth exercise is the loop itself:
# its reaction to one finished call, deaths and actor restarts included, against a stand-in
# for Ray. Nothing here starts Ray.
#
# | exercise | points | difficulty | time |
# |---|---|---|---|
# | 1. `bundles_for`: lesson 08's layouts as placement-group bundles | 10 | ★☆☆ | 10 min |
# | 2. `admit`: deal groups to idle generators under the lag bound | 20 | ★★☆ | 25 min |
# | 3. `on_generator_death`: the lost groups, their order, the ledger entries | 15 | ★★☆ | 15 min |
# | 4. `on_ready`: the `ray.wait` loop's reaction to one finished call | 20 | ★★☆ | 25 min |

# %%
import copy
import itertools

from course_lib import check
from course_lib.capstone_ray.admission import Admission
from course_lib.capstone_ray.ledger import Death
from course_lib.capstone_ray.placement import Placement

# %% [markdown]
# ## Exercise 1 · Layouts as placement-group bundles (★☆☆, 10 min, 10 points)
#
# A Ray **placement group** reserves a list of *bundles* of resources at once (all or
# nothing), and the controller schedules each actor into one bundle of it. Here every bundle
# is one CPU core, `{"CPU": 1.0}`, and each actor claims a share of its bundle with
# `num_cpus`. Lesson 08's three layouts become three ways of filling the bundles:
#
# ```
# sync_colocated, 2 trainers, 4 generators       sync_split or pipeline, 2 trainers, 2 generators
#   bundle 0: trainer 0 (0.5)  gen 0 (0.25)  gen 2 (0.25)     bundle 0: trainer 0 (0.5)  trainer 1 (0.5)
#   bundle 1: trainer 1 (0.5)  gen 1 (0.25)  gen 3 (0.25)     bundle 1: gen 0 (0.5)      gen 1 (0.5)
#   each core alternates: generate, then train               one core trains, the other generates
# ```
#
# `sync_split` and `pipeline` are placed alike; they differ in the controller's schedule (in
# `sync_split` one side waits while the other works, in `pipeline` both work at once under
# the lag bound). Ray's `num_cpus` is bookkeeping only: it keeps a bundle from being
# over-subscribed but pins nothing, so each actor also pins itself to a core its bundle claims
# on its node (another placement group there gets other cores). That is why the shares in a
# bundle must add up to **exactly** its one CPU: less leaves part of the reserved bundle
# unclaimed, so a later actor of this placement group could be scheduled into it, onto a core
# already pinned; more and the actors would never fit.
#
# Write `bundles_for(layout, n_trainers=2, n_generators=2)` returning a `Placement` (the
# dataclass imported above) with `layout`, and as tuples:
#
# - `bundles`: one `{"CPU": 1.0}` per bundle;
# - `trainer_bundle[r]`, `generator_bundle[i]`: the bundle of trainer `r` and of generator `i`;
# - `trainer_cpus`, `generator_cpus`: each trainer's and each generator's share.
#
# `"sync_colocated"`: `n_trainers` bundles; trainer `r` in bundle `r` with 0.5 CPU; generator
# `i` in bundle `i % n_trainers` (beside trainer `i % n_trainers`), the generators of a bundle
# sharing its other 0.5 evenly. It needs `n_generators` to be a multiple of `n_trainers`.
# `"sync_split"` and `"pipeline"`: two bundles, every trainer in bundle 0 (`1 / n_trainers`
# each), every generator in bundle 1 (`1 / n_generators` each). Raise `ValueError` (say which
# argument and what is allowed) for an unknown layout, `n_trainers < 1`, `n_generators < 1`,
# or a colocated layout whose generators cannot be spread evenly.
#
# **How it is graded:** the layout alone (the defaults, 2 trainers and 2 generators); a
# hand-written table of the layouts (2 trainers with 2 and 4
# generators, 1 with 3, 3 with 1), every layout with 1 to 4 trainers and 1 to 8 generators
# against an oracle that fills the bundles member by member, each bundle's shares adding up to
# its CPU, and `ValueError` on bad arguments. Trainers and generators swapped between the
# bundles, all generators in bundle 0, generators dealt in blocks, `pipeline` or `sync_split`
# placed as colocated, shares that do not add up to the bundle and a missing check are named
# in the message. Importing `course_lib`'s `bundles_for` is refused (the `Placement` class is
# yours to use).
#
# (At full size: `course_lib.capstone_ray.placement.bundles_for`, which the controller passes
# to `ray.util.placement_group`.)


# %% tags=["exercise"]
def bundles_for(layout, n_trainers=2, n_generators=2):
    """The placement of ``n_trainers`` trainers and ``n_generators`` generators for ``layout``.

    Returns:
        Placement(layout, bundles, trainer_bundle, generator_bundle, trainer_cpus, generator_cpus).

    Raises:
        ValueError: an unknown layout, no trainer or no generator, or colocated generators that
            cannot be spread evenly over the trainers' bundles.
    """
    ### BEGIN SOLUTION
    layouts = ("sync_colocated", "sync_split", "pipeline")
    if layout not in layouts:
        raise ValueError(f"layout={layout!r} is not one of {', '.join(layouts)}")
    if n_trainers < 1:
        raise ValueError(f"n_trainers={n_trainers}: a layout needs at least one trainer")
    if n_generators < 1:
        raise ValueError(f"n_generators={n_generators}: a layout needs at least one generator")
    if layout == "sync_colocated":
        if n_generators % n_trainers != 0:
            raise ValueError(
                f"sync_colocated: n_generators={n_generators} is not a multiple of n_trainers={n_trainers}"
            )
        per_bundle = n_generators // n_trainers
        return Placement(
            layout=layout,
            bundles=tuple({"CPU": 1.0} for _ in range(n_trainers)),
            trainer_bundle=tuple(range(n_trainers)),  # trainer r in bundle r
            generator_bundle=tuple(i % n_trainers for i in range(n_generators)),  # beside trainer i % n_trainers
            trainer_cpus=0.5,
            generator_cpus=0.5 / per_bundle,  # the bundle's other half, shared
        )
    return Placement(  # sync_split and pipeline: the same bundles, a different schedule
        layout=layout,
        bundles=({"CPU": 1.0}, {"CPU": 1.0}),
        trainer_bundle=(0,) * n_trainers,
        generator_bundle=(1,) * n_generators,
        trainer_cpus=1.0 / n_trainers,
        generator_cpus=1.0 / n_generators,
    )
    ### END SOLUTION


# %% tags=["raises-in-stub"]
for layout in ("sync_colocated", "sync_split", "pipeline"):
    p = bundles_for(layout, 2, 4)
    print(f"{layout:15s} trainers -> {p.trainer_bundle}  generators -> {p.generator_bundle}")
    print(f"{'':15s} shares {p.trainer_cpus:.3f} / {p.generator_cpus:.3f}, CPU per bundle {p.load()}")
    assert len(p.trainer_bundle) == 2 and len(p.generator_bundle) == 4, "one bundle index per actor"
    assert all(abs(cpu - 1.0) < 1e-9 for cpu in p.load()), "the shares in every bundle add up to its one CPU"
try:
    bundles_for("sync_colocated", 2, 3)
except ValueError as exc:
    print("ValueError:", exc)
else:
    raise AssertionError("3 generators cannot be spread evenly beside 2 trainers")

# %% tags=["exercise-check"]
check("12_capstone_ray", "bundles_for", bundles_for)

# %% [markdown]
# ## Exercise 2 · Admission: deal groups under the lag bound (★★☆, 25 min, 20 points)
#
# In lesson 11 every generator decided for itself whether to start its next group. On Ray the
# **controller** decides: after each `ray.wait`, it takes the generators with no decoding call
# in flight (`idle`), deals them groups and submits one decoding call to each
# (`gen.run.remote(groups)`). Groups are numbered `k = 0, 1, ...` as they are first started;
# update `u` trains on `k = uB .. (u+1)B - 1` (`B = groups_per_batch`). Generator `g` has
# loaded weight version `delivered[g]` (the newest version whose transfer to it has
# finished; `-1`: none yet), and lesson 07's bound is applied with **that generator's own**
# version:
#
# $$k < (\mathrm{delivered}[g] + \mathrm{max\_lag} + 1)\, B$$
#
# This is the lesson's eq. 12.1, with $v_g$ = `delivered[g]` and $k_{max}$ = `max_lag`.
# Group `k` is trained on by update `floor(k / B)`; a generator holding version `v` may start it
# only if that update is at most `max_lag` updates after `v`. The trainer's newest version
# would be wrong here: a generator whose transfer is still on its way decodes with older
# weights, and its groups would lag more than `max_lag`.
#
# One step of the dealing, with `max_lag = 1`, `B = 2`, `room = 3`, `total_groups = 20`,
# `next_k = 6`, `todo = [3]` (group 3 was lost with a killed generator and is asked for again):
#
# ```
#             delivered  holding  idle       bound (delivered + 2) * 2
# generator 0     2         1      yes        8
# generator 1     1         0      yes        6
# generator 2    -1         0      yes        -   (no weights yet: gets nothing)
#
# deal  holding now (g0, g1)  fewest  candidate    result
# 1     1, 0                  g1      3 (todo)     3 < 6: g1 takes 3
# 2     1, 1                  g0      6 (next_k)   6 < 8: g0 takes 6 (a tie: the lowest index)
# 3     2, 1                  g1      7            7 >= 6: g1's weights are too old, g1 leaves
# 4     2, -                  g0      7            7 < 8: g0 takes 7
# 5     3, -                  g0      -            g0 holds room = 3: stop
#
# Admission(groups={0: [6, 7], 1: [3]}, next_k=8, todo=())
# ```
#
# Write `admit(next_k, todo, delivered, holding, idle, *, max_lag, groups_per_batch, room,
# total_groups)`. `holding[g]` counts the groups admitted to `g` and not returned yet;
# `room` is the most a generator may hold. Deal one group at a time:
#
# 1. Only generators in `idle` with `delivered[g] >= 0` take part.
# 2. Pick the one holding the fewest (`holding[g]` plus what it got in this call; ties: the
#    lowest index). If it already holds `room`, stop: every other holds as many.
# 3. The candidate is `todo[0]` if `todo` is not empty (re-requested groups go first), else
#    `next_k`.
# 4. If `k >= total_groups` or `k` breaks the bound for `g`, then `g` takes nothing more in this
#    call (drop it) and dealing goes on with the others: one with newer weights may take `k`.
# 5. Else `g` takes `k`: remove it from the front of `todo`, or move `next_k` on by one.
#
# Return `Admission(groups, next_k, todo)`: `groups[g]` the list of groups `g` takes, in order
# (a generator that takes none may be left out or map to `[]`), `next_k` the next group never
# started, `todo` the re-requested groups not taken, in order, as a tuple. Do not change the
# inputs: `todo` is the controller's own queue. Raise `ValueError` if `max_lag < 0`,
# `groups_per_batch < 1`, `room < 1`, or an idle generator does not exist.
#
# **How it is graded:** the worked example; hand-made steps (the fewest first, ties, each
# generator's own version, the bound's edge, `todo` first, `room`, no weights, `total_groups`,
# a `todo` left by two deaths, not in ascending order);
# random steps against an oracle that writes the bound as a lag (`floor(k / B) - delivered[g]
# <= max_lag`); simulated runs (late weight transfers, decoding calls returning in random
# order, generators killed and restarted) driven by your `admit`, in which no group may lag
# more than `max_lag` updates and every group must come back exactly once; the inputs left
# unchanged; `ValueError` on bad arguments. Admitting against the newest (trainer's) version,
# ignoring `todo`, dealing `todo` smallest first or returning it sorted (it is a queue: its
# order is the controller's), dealing round robin, an off-by-one in the bound, giving groups
# to a generator without weights, stopping at the first generator with old weights and
# changing the inputs are named in the message. Importing `course_lib`'s `admit` is refused.
#
# (At full size: `course_lib.capstone_ray.admission.admit`, called by the controller's loop
# in `course_lib.capstone_ray.controller`.)


# %% tags=["exercise"]
def admit(next_k, todo, delivered, holding, idle, *, max_lag, groups_per_batch, room, total_groups):
    """One admission step: deal groups one at a time to the idle generator holding the fewest.

    Args:
        next_k: the next group id never started.
        todo: re-requested group ids, dealt before any new one (not changed).
        delivered: per generator, the newest weight version it has loaded (-1: none yet).
        holding: per generator, the groups admitted to it and not returned yet.
        idle: the generators with no decoding call in flight.
        max_lag: the most updates a group may lag behind the weights that train on it.
        groups_per_batch: B, groups per update.
        room: the most groups a generator may hold.
        total_groups: groups the run needs; none beyond is started.

    Returns:
        Admission(groups={g: [k, ...]}, next_k=..., todo=(...)).
    """
    ### BEGIN SOLUTION
    if max_lag < 0 or groups_per_batch < 1 or room < 1:
        raise ValueError(
            f"need max_lag >= 0, groups_per_batch >= 1, room >= 1; got {max_lag}, {groups_per_batch}, {room}"
        )
    idle = sorted(set(idle))
    unknown = [g for g in idle if not 0 <= g < len(delivered)]
    if unknown:
        raise ValueError(f"idle generator {unknown[0]} does not exist: there are {len(delivered)}")
    live = [g for g in idle if delivered[g] >= 0]  # no weights yet: nothing to decode with
    groups = {g: [] for g in live}
    queue = list(todo)  # a copy: the controller's queue stays as it is
    while live:
        g = min(live, key=lambda h: (holding[h] + len(groups[h]), h))  # the fewest held; ties: lowest index
        if holding[g] + len(groups[g]) >= room:
            break  # the least loaded is full, so all are
        k = queue[0] if queue else next_k
        if k >= total_groups or k >= (delivered[g] + max_lag + 1) * groups_per_batch:
            live.remove(g)  # g's weights are too old for k; one with newer weights may take it
            continue
        if queue:
            queue.pop(0)
        else:
            next_k += 1
        groups[g].append(k)
    return Admission(groups=groups, next_k=next_k, todo=tuple(queue))
    ### END SOLUTION


# %% tags=["raises-in-stub"]
todo, delivered, holding = [3], [2, 1, -1], [1, 0, 0]
step = admit(6, todo, delivered, holding, [0, 1, 2], max_lag=1, groups_per_batch=2, room=3, total_groups=20)
print(step)
assert todo == [3] and delivered == [2, 1, -1] and holding == [1, 0, 0], "admit must not change its inputs"
assert not step.groups.get(2), "generator 2 has no weights yet"
for g, ks in step.groups.items():
    assert holding[g] + len(ks) <= 3, f"generator {g} holds more than room"
    for k in ks:
        assert k // 2 - delivered[g] <= 1, f"group {k} would lag more than max_lag on generator {g}"
dealt = sorted(k for ks in step.groups.values() for k in ks)
assert dealt == sorted([3, *range(6, step.next_k)]), "the groups dealt: todo's, then next_k, next_k + 1, ..."

# %% tags=["exercise-check"]
check("12_capstone_ray", "admit", admit)

# %% [markdown]
# ## Exercise 3 · A generator dies: which groups are lost (★★☆, 15 min, 15 points)
#
# The controller learns of a death when the generator's decoding call raises
# `RayActorError`. Ray restarts the actor (`max_restarts=1`) as a new process, the generator's
# next **incarnation**: whatever the dead process held is gone. The controller keeps two
# records:
#
# - `in_flight[g]`: the groups admitted to generator `g` and not returned yet, whatever became
#   of them inside the process: **queued** (admitted, waiting for a free slot), **decoding**, or
#   **finished but not returned** (the decoding call returns them at its end);
# - `admitted[k] = (generator, incarnation)`: the live admission of every group, returned ones
#   included (the ledger checks that each answer comes from the incarnation it was given to).
#
# ```
# generator 1, incarnation 1, room 3, 2 slots, dies:
#   decoding: 12, 13   queued: 15            -> lost, asked for again
#   returned earlier: 9, 11                  -> in admitted, not in flight: they count, not lost
# re-request queue before: todo = [7]        -> after: (12, 13, 15, 7)
# ```
#
# A lost group keeps its id: group `k`'s prompt depends only on the run's seed and `k`, so the
# group generated again has the same prompt, and since the dead incarnation's answers never
# reached the controller, no sample can be counted twice. The lost groups go to the **front**
# of the queue: they are the oldest unfinished groups, and the next update waits for them.
#
# Write `on_generator_death(g, in_flight, admitted, todo)` returning `Death(lost,
# lost_entries, todo)`, tuples:
#
# - `lost`: every group in `in_flight[g]`, ascending;
# - `lost_entries`: `(k, g, incarnation)` for each lost group in the same order, with the
#   incarnation it was admitted to, `admitted[k][1]`;
# - `todo`: the lost groups first (ascending), then the old `todo` in its order.
#
# Every lost group must have been admitted to `g` (`admitted[k][0] == g`); otherwise the
# ledger is inconsistent: raise `ValueError`. Raise `ValueError` too if generator `g` does not
# exist. Do not change the inputs: the controller removes the lost groups from `admitted` and
# `in_flight[g]` afterwards.
#
# **How it is graded:** the worked example; hand-made deaths (nothing in flight, groups
# re-admitted out of order, later incarnations, re-requests left by earlier deaths); ledgers
# taken from simulated runs at every kill, against a brute-force scan over group ids;
# simulated runs with kills driven by your function, in which every group must come back
# exactly once and every lost group from another incarnation; the inputs left unchanged;
# `ValueError` on bad arguments. Forgetting the queued
# groups (a subset of `in_flight[g]`), re-requesting groups already returned, lost groups at
# the back of `todo`, an unsorted `lost`, the wrong incarnation, a missing ledger check and
# changing the inputs are named in the message. Importing `course_lib`'s `on_generator_death`
# is refused.
#
# (At full size: `course_lib.capstone_ray.ledger.on_generator_death` and `Ledger.audit`.)


# %% tags=["exercise"]
def on_generator_death(g, in_flight, admitted, todo):
    """Generator ``g`` died: its lost groups, their ledger entries and the new re-request queue.

    Args:
        g: the generator that died.
        in_flight: per generator, the groups admitted to it and not returned.
        admitted: group -> (generator, incarnation) of its live admission.
        todo: the re-request queue before the death.

    Returns:
        Death(lost=(...), lost_entries=((k, g, incarnation), ...), todo=(...)).
    """
    ### BEGIN SOLUTION
    if not 0 <= g < len(in_flight):
        raise ValueError(f"generator {g} does not exist: there are {len(in_flight)}")
    lost = tuple(sorted(in_flight[g]))  # queued, decoding or finished: none came back
    entries = []
    for k in lost:
        owner = admitted.get(k)
        if owner is None or owner[0] != g:
            raise ValueError(
                f"group {k} is in flight on generator {g} but admitted to {owner}: the ledger is inconsistent"
            )
        entries.append((k, g, owner[1]))  # the incarnation it was given to
    return Death(lost=lost, lost_entries=tuple(entries), todo=lost + tuple(todo))
    ### END SOLUTION


# %% tags=["raises-in-stub"]
in_flight = [{10, 14}, {12, 13, 15}]
admitted = {9: (1, 1), 10: (0, 0), 11: (1, 1), 12: (1, 1), 13: (1, 1), 14: (0, 0), 15: (1, 1)}
before = copy.deepcopy((in_flight, admitted))
death = on_generator_death(1, in_flight, admitted, [7])
print(death)
assert (in_flight, admitted) == before, "on_generator_death must not change its inputs"
assert 9 not in death.lost and 11 not in death.lost, "groups already returned are not lost"
assert all(admitted[k][0] == 1 for k in death.lost), "only generator 1's groups are lost"
assert list(death.lost) == sorted(death.lost) and death.todo[-1] == 7, "lost ascending, the old todo after them"
try:
    on_generator_death(0, [{5}, set()], {5: (1, 0)}, [])
except ValueError as exc:
    print("ValueError:", exc)
else:
    raise AssertionError("group 5 is in flight on generator 0 but admitted to generator 1: inconsistent")

# %% tags=["exercise-check"]
check("12_capstone_ray", "on_generator_death", on_generator_death)

# %% [markdown]
# ## Exercise 4 · The controller's loop: one finished call (★★☆, 25 min, 20 points)
#
# The split layouts' controller is one loop around `ray.wait`: every call it makes to an
# actor returns an `ObjectRef` at once, it keeps them all, and `ray.wait(refs,
# num_returns=1)` hands back whichever finished first; the loop reacts to that one and waits
# again. It must never wait for one particular call: the others keep finishing meanwhile, and
# a `ray.get` of a call that has not finished blocks the whole loop until it has.
#
# What can finish is a generator's decoding call or, once a generator is down, a **rejoin
# probe**. Ray's `ActorUnavailableError` (a `RayActorError`) means the actor is restarting
# **or** was cut off for a moment and is still alive, holding groups; the controller cannot
# tell which. So it **fences**: it counts the generator's groups in flight as lost (they are
# asked for again) and asks the actor to `rejoin` under a new **epoch**. Whoever answers, a
# new process or the live one, holds nothing from then on, and any call carrying another
# epoch is declined. Each call carries the epoch the controller knows for its generator,
# `loop["inc"][g]`:
#
# - a decoding call **returns its groups** `{"groups": [k, ...], "incarnation": i}`;
# - a decoding call **raises** `RayActorError`: the process died under it, or the actor was
#   cut off: a death, as far as the controller can know;
# - a decoding call **returns `{"restarted": 1, "incarnation": j, "expected": i}`**: it ran on
#   a process holding another epoch (or none yet), which **declines** it: a death too;
# - a probe **raises** `RayActorError`: the actor is still restarting ("unavailable");
# - a probe **returns `{"incarnation": e, "was": w, ...}`**: the actor now holds epoch `e`
#   (`w` is None for a new process, the old epoch for a live one that was cut off);
# - a decoding call **raises `ActorDiedError`** (a `RayActorError`): the actor died under it;
#   whether Ray will restart it, this error does not say: a death, as above;
# - a probe **raises `ActorDiedError`**: sent after the death, it meets the actor's state as
#   Ray's control store holds it: dead, no restart left. The generator is **gone**;
# - any call **raises `RayTaskError`** (not a `RayActorError`): the method itself raised in a
#   live actor. No process died and no epoch changed: not a death, and not the loop's to fix.
#
# Write `on_ready(ref, ray, loop)`: the loop's reaction to `ref`, the call `ray.wait`
# returned. `ray` stands in for the `ray` module: `ray.get(ref)` and `ray.exceptions`'
# `RayActorError`, `ActorDiedError` and `RayTaskError`, nothing else (the grader's stand-in
# refuses a `ray.get` of any other call). `loop` is the controller's state, a dict:
#
# - `"calls"`: every call in flight, `ref -> (method, g, epoch)`: `("run", g, i)` a decoding
#   call carrying epoch `i`; `("rejoin", g, e)` a probe asking generator `g` to take epoch `e`;
# - `"inc"`: per generator, the epoch its calls carry;
# - `"in_flight"`: per generator, the set of groups admitted to it and not returned;
# - `"down"`: the generators whose death the loop has seen, until they answer a probe;
# - `"gone"`: the generators Ray will not restart (the loop deals them nothing more);
# - `"todo"`, `"done"`: the re-requested groups, and `k -> (g, epoch)` for every group returned;
# - `"died"`: `died(g)`, the bookkeeping of a death (exercise 3's: the lost groups to the front
#   of `todo`, `in_flight[g]` emptied, `g` added to `down`);
# - `"submit"`: `submit("rejoin", g, e)` sends the probe and returns its ref (the loop's
#   `submit` spaces a generator's repeated probes by a few milliseconds, as `SplitLoop` does,
#   so asking again at once does not spin: not your part).
#
# The reaction: take `ref`'s record out of `calls` (the loop must not wait on it again) and
# read its outcome. Returned groups: record each in `done` as `(g, i)`, the generator and the
# epoch the call carried, and take it out of `in_flight[g]`. A death (raised or declined):
# call `died(g)` once, and send a probe asking for the **next** epoch, `loop["inc"][g] + 1`,
# recording its ref in `calls` as `("rejoin", g, e)`; `ActorDiedError` from a decoding call
# is such a death. A probe that raised another `RayActorError`: send another probe with the
# same epoch (recorded the same way) and return: the loop goes on with everything else while
# the actor restarts. A probe that answered: from now on `g`'s calls carry epoch `e`
# (`inc[g]`), and `g` is no longer down (the loop then sends it the current weights: not
# your part). A probe that raised `ActorDiedError`: add `g` to `gone`, take it out of `down`
# (its `died` came at its death), and send **no** probe, now or later: each would raise
# `ActorDiedError` again. A `RayTaskError`: let it out of `on_ready` (catch `RayActorError`,
# not `Exception`).
#
# ```
# generator 0, epoch 0: decoding 4, 6        ref 1 = ("run", 0, 0)
# generator 1, epoch 1: decoding 5, 7        ref 2 = ("run", 1, 1)
# generator 2: died in epoch 0, restarting   ref 3 = ("rejoin", 2, 1), down = {2}
# todo = [3], done = {0: (0, 0), 1: (1, 1), 2: (0, 0)}
#
# ray.wait returns   its outcome                           the loop after on_ready
# ref 1              {"groups": [4, 6], "incarnation": 0}  done[4] = done[6] = (0, 0); in_flight[0] = {}
# ref 2              raises RayActorError                  died(1): todo = [5, 7, 3], down = {1, 2};
#                                                          a probe ("rejoin", 1, 2) in calls
# ref 2              {"restarted": 1, "incarnation": None, ...}   the same: a death
# ref 3              raises RayActorError                  a new probe ("rejoin", 2, 1) in calls
# ref 3              {"incarnation": 1, "was": None}       inc[2] = 1; down = {}
# ref 3              {"incarnation": 1, "was": 0}          the same (the live process, cut off, now fenced)
# ref 2              raises ActorDiedError                 the same as RayActorError: a death, a probe
# ref 3              raises ActorDiedError                 gone = {2}, down = {}; no probe, no died(2)
# ref 2 or 3         raises RayTaskError                   on_ready lets it out
# ```
#
# **How it is graded:** the rows above (`RayTaskError` from both kinds of call); random
# controller states (2 to 4 generators, some down, some gone, re-requests waiting) against an
# oracle that reads the new state off a table of the outcomes; simulated runs around your
# `on_ready`, with a stand-in for Ray (calls finishing in any order, generators killed while
# decoding and while idle, some for good, live generators cut off while they hold groups,
# restarts answering "unavailable" for a while), in which every group must come back exactly
# once, from the epoch it was sent with, and every generator not gone must come back. A
# `ray.get` of another call than `ref` (waiting for a probe, say) or a `ray.wait`, a
# `RayActorError` let out of `ray.get`, a `RayTaskError` swallowed (`except Exception`), a
# declined call taken for a normal return, a death without `died` or without a probe, a
# decoding call's `ActorDiedError` taken as final, a probe's re-probed, a gone generator not
# in `gone` or still `down`, a probe for the old epoch, an "unavailable" probe not sent
# again, the new epoch not recorded, a probe not recorded in `calls`, `ref` left in `calls`
# and groups recorded with the wrong generator or epoch are named in the message. Nothing
# here starts Ray.


# %% tags=["exercise"]
def on_ready(ref, ray, loop):
    """React to ``ref``, the call ``ray.wait`` returned; update ``loop`` in place, never block.

    Args:
        ref: the finished call's ObjectRef (a key of ``loop["calls"]``).
        ray: ``ray.get`` (of ``ref`` only) and ``ray.exceptions``' ``RayActorError``,
            ``ActorDiedError`` and ``RayTaskError``.
        loop: the controller's state: ``calls``, ``inc``, ``in_flight``, ``down``, ``gone``, ``todo``,
            ``done``, and the functions ``died(g)`` and ``submit("rejoin", g, epoch)``.

    Raises:
        RayTaskError: the call's method raised in a live actor (let out, not handled).
    """
    ### BEGIN SOLUTION
    method, g, epoch = loop["calls"].pop(ref)
    try:
        out = ray.get(ref)  # ray.wait returned it: it has finished, this does not block
    except ray.exceptions.ActorDiedError:
        if method == "rejoin":  # sent after the death, it meets Ray's record: dead, no restart left
            loop["gone"].add(g)
            loop["down"].discard(g)  # it will never answer a probe: none is sent
            return
        out = None  # a decoding call: a death like any other; its probe will tell
    except ray.exceptions.RayActorError:
        out = None  # dead, restarting, or cut off: the controller cannot tell which
    # a RayTaskError (the method raised in a live actor) is not a death: it goes out of here
    if method == "run":
        if out is None or out.get("restarted"):  # raised, or declined: a death
            loop["died"](g)
            new = loop["inc"][g] + 1  # a new epoch: whoever answers holds nothing, old calls are declined
            loop["calls"][loop["submit"]("rejoin", g, new)] = ("rejoin", g, new)
            return
        for k in out["groups"]:
            loop["done"][k] = (g, epoch)
            loop["in_flight"][g].discard(k)
    elif out is None:  # unavailable: ask again later (the same epoch), through ray.wait
        loop["calls"][loop["submit"]("rejoin", g, epoch)] = ("rejoin", g, epoch)
    else:  # it answered under the new epoch: later calls carry it
        loop["inc"][g] = out["incarnation"]
        loop["down"].discard(g)
    ### END SOLUTION


# %% tags=["raises-in-stub"]
class StandIn:
    """Ray for this demo: the outcome of each call set by hand (an exception is raised)."""

    class exceptions:
        class RayActorError(Exception):
            pass

        class ActorDiedError(RayActorError):
            pass

        class RayTaskError(Exception):
            pass

    def __init__(self, outcomes):
        self.outcomes = outcomes

    def get(self, ref):
        outcome = self.outcomes[ref]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


probes = itertools.count(1)
demo = {
    "calls": {"run-a": ("run", 0, 0), "run-b": ("run", 1, 0), "run-c": ("run", 2, 0)},
    "inc": [0, 0, 0],
    "in_flight": [{0, 2}, {1, 3}, {4}],
    "down": set(),
    "gone": set(),
    "todo": [],
    "done": {},
    "submit": lambda method, g, epoch: f"probe-{next(probes)}",
}


def demo_died(g):
    demo["todo"][:0] = sorted(demo["in_flight"][g])
    demo["in_flight"][g] = set()
    demo["down"].add(g)


demo["died"] = demo_died
ray_demo = StandIn(
    {
        "run-a": {"groups": [0, 2], "incarnation": 0},
        "run-b": StandIn.exceptions.RayActorError("The actor died unexpectedly"),
        "probe-1": StandIn.exceptions.RayActorError("The actor is temporarily unavailable"),
        "probe-2": {"incarnation": 1, "was": None, "pid": 4242},
        "run-c": StandIn.exceptions.ActorDiedError("The actor died unexpectedly"),
        "probe-3": StandIn.exceptions.ActorDiedError("The actor died: no restart left"),
    }
)
for ref in ("run-a", "run-b", "probe-1", "probe-2", "run-c", "probe-3"):
    on_ready(ref, ray_demo, demo)
    print(f"after {ref:8s} calls={demo['calls']} todo={demo['todo']} down={demo['down']} gone={demo['gone']}")
print("done:", demo["done"], "inc:", demo["inc"])
assert demo["todo"] == [4, 1, 3] and demo["gone"] == {2} and not demo["down"], "generator 2: a death, then gone"
assert not demo["calls"], "generator 2's probe raised ActorDiedError: never probed again"

# %% tags=["exercise-check"]
check("12_capstone_ray", "on_ready", on_ready)
