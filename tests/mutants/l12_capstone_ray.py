"""Planted bugs in lesson 12's exercises, each a one-place edit of the real solution
(see `Mutant` in tests/conftest.py); `expected` is a fragment the grader's message must hold."""

from conftest import Mutant

BF, AD, GD, OR = "bundles_for", "admit", "on_generator_death", "on_ready"

SPLIT = "trainer_bundle=(0,) * n_trainers,\n        generator_bundle=(1,) * n_generators,"
COLOCATED_GENERATORS = "generator_bundle=tuple(i % n_trainers for i in range(n_generators)),"
BOUND = "k >= (delivered[g] + max_lag + 1) * groups_per_batch"
CANDIDATE = (
    "        k = queue[0] if queue else next_k\n"
    "        if k >= total_groups or k >= (delivered[g] + max_lag + 1) * groups_per_batch:\n"
    "            live.remove(g)  # g's weights are too old for k; one with newer weights may take it\n"
    "            continue\n"
    "        if queue:\n"
    "            queue.pop(0)\n"
    "        else:\n"
    "            next_k += 1\n"
)
NO_TODO = (
    "        k = next_k  # the re-requested groups are never looked at\n"
    "        if k >= total_groups or k >= (delivered[g] + max_lag + 1) * groups_per_batch:\n"
    "            live.remove(g)\n"
    "            continue\n"
    "        next_k += 1\n"
)
FEWEST = "    while live:\n        g = min(live, key=lambda h: (holding[h] + len(groups[h]), h))"
ROUND_ROBIN = "    turn = 0\n    while live:\n        g = live[turn % len(live)]  # in turn\n        turn += 1"
LOST = "lost = tuple(sorted(in_flight[g]))"
DEATH = (
    '        if out is None or out.get("restarted"):  # raised, or declined: a death\n'
    '            loop["died"](g)\n'
    '            new = loop["inc"][g] + 1  # a new epoch: whoever answers holds nothing, old calls are declined\n'
    '            loop["calls"][loop["submit"]("rejoin", g, new)] = ("rejoin", g, new)\n'
    "            return\n"
    '        for k in out["groups"]:\n'
)
REPROBE = (
    "    elif out is None:  # unavailable: ask again later (the same epoch), through ray.wait\n"
    '        loop["calls"][loop["submit"]("rejoin", g, epoch)] = ("rejoin", g, epoch)\n'
)
CATCH = (
    "    except ray.exceptions.RayActorError:\n"
    "        out = None  # dead, restarting, or cut off: the controller cannot tell which\n"
)
FINAL = (
    "    except ray.exceptions.ActorDiedError:\n"
    '        if method == "rejoin":  # sent after the death, it meets Ray\'s record: dead, no restart left\n'
    '            loop["gone"].add(g)\n'
    '            loop["down"].discard(g)  # it will never answer a probe: none is sent\n'
    "            return\n"
    "        out = None  # a decoding call: a death like any other; its probe will tell\n"
)
#: the rule before: ActorDiedError final from either kind of call (died if not down yet, gone, no probe)
FINAL_FROM_ANY_CALL = (
    "    except ray.exceptions.ActorDiedError:  # dead for good: Ray will not restart it\n"
    '        if g not in loop["down"]:\n'
    '            loop["died"](g)  # its groups are lost as in any death\n'
    '        loop["gone"].add(g)\n'
    '        loop["down"].discard(g)  # it will never answer a probe: none is sent\n'
    "        return\n"
)
LEDGER_CHECK = "if owner is None or owner[0] != g:"

MUTANTS: list[Mutant] = [
    # bundles_for: which bundle, the shares, the layouts, the validation
    Mutant(
        BF,
        "trainers_generators_swapped",
        SPLIT,
        "trainer_bundle=(1,) * n_trainers,\n        generator_bundle=(0,) * n_generators,",
        "trainers and generators swapped",
    ),
    Mutant(
        BF,
        "shares_do_not_sum_to_the_bundle",
        "generator_cpus=0.5 / per_bundle,",
        "generator_cpus=0.5 / n_generators,",
        "the shares in a bundle must add up to exactly its CPU",
    ),
    Mutant(
        BF,
        "colocated_generators_all_in_bundle_0",
        COLOCATED_GENERATORS,
        "generator_bundle=tuple(0 for i in range(n_generators)),",
        "all generators in bundle 0",
    ),
    Mutant(
        BF,
        "colocated_generators_in_blocks",
        COLOCATED_GENERATORS,
        "generator_bundle=tuple(i // per_bundle for i in range(n_generators)),",
        "generators dealt in blocks",
    ),
    Mutant(
        BF,
        "pipeline_placed_as_colocated",
        'if layout == "sync_colocated":',
        'if layout in ("sync_colocated", "pipeline"):',
        "pipeline is placed like sync_split",
    ),
    # issue 45: the signature's defaults, a rule of the statement
    Mutant(
        BF,
        "wrong_defaults",
        "def bundles_for(layout, n_trainers=2, n_generators=2):",
        "def bundles_for(layout, n_trainers=1, n_generators=1):",
        "by default 2 trainers and 2 generators",
    ),
    Mutant(
        BF,
        "no_divisibility_check",
        "if n_generators % n_trainers != 0:",
        "if n_generators < n_trainers:",
        "expected ValueError (3 generators cannot be spread evenly beside 2 trainers)",
    ),
    # admit: whose version, todo, the dealing, the bound, weights, the inputs
    Mutant(
        AD, "global_version", BOUND, "k >= (max(delivered) + max_lag + 1) * groups_per_batch", "not the generator's own"
    ),
    Mutant(AD, "ignores_todo", CANDIDATE, NO_TODO, "ignored todo"),
    Mutant(AD, "round_robin", FEWEST, ROUND_ROBIN, "dealt round robin"),
    Mutant(
        AD,
        "lag_bound_off_by_one",
        BOUND,
        "k > (delivered[g] + max_lag + 1) * groups_per_batch",
        "off by one in the lag",
    ),
    Mutant(AD, "mutates_todo", "queue = list(todo)", "queue = todo", "changed the `todo` list"),
    Mutant(
        AD,
        "deals_to_generators_without_weights",
        "live = [g for g in idle if delivered[g] >= 0]",
        "live = list(idle)",
        "no weights yet",
    ),
    Mutant(
        AD,
        "stops_at_old_weights",
        "            live.remove(g)  # g's weights are too old for k; one with newer weights may take it\n"
        "            continue\n",
        "            break\n",
        "stopped dealing at the first generator whose weights are too old",
    ),
    Mutant(AD, "no_validation", "if max_lag < 0 or groups_per_batch < 1 or room < 1:", "if room < 1:", "max_lag = -1"),
    # wrong mechanism (issue 45): the queue dealt oldest group first, right whenever todo happens to be ascending
    Mutant(AD, "deals_todo_smallest_first", "queue = list(todo)", "queue = sorted(todo)", "smallest first"),
    # wrong mechanism (issue 45): the groups left in the queue handed back sorted
    Mutant(AD, "returns_todo_sorted", "todo=tuple(queue)", "todo=tuple(sorted(queue))", "left in todo sorted"),
    # on_generator_death: which groups, their order, the entries, the ledger check, the inputs
    Mutant(GD, "forgets_queued_groups", LOST, "lost = tuple(sorted(in_flight[g])[:1])", "lost misses group(s)"),
    Mutant(
        GD,
        "rerequests_returned_groups",
        LOST,
        "lost = tuple(sorted(k for k, (h, _) in admitted.items() if h == g))",
        "already returned",
    ),
    Mutant(
        GD,
        "lost_at_the_back_of_todo",
        "todo=lost + tuple(todo)",
        "todo=tuple(todo) + lost",
        "the lost groups go to the front",
    ),
    Mutant(GD, "no_ledger_check", LEDGER_CHECK, "if owner is None:", "the ledger is inconsistent"),
    Mutant(GD, "unsorted", LOST, "lost = tuple(in_flight[g])", "is not ascending"),
    Mutant(
        GD,
        "wrong_incarnation",
        "entries.append((k, g, owner[1]))",
        "entries.append((k, g, 0))",
        "the incarnation the group was admitted to",
    ),
    Mutant(
        GD,
        "clears_in_flight",
        "    entries = []\n",
        "    in_flight[g].clear()  # the controller's job, done here\n    entries = []\n",
        "changed the `in_flight`",
    ),
    # on_ready: reading only the finished call, a death raised or declined, probes, the new incarnation
    # wrong mechanism (issue 45): waits for the restarted actor inside the handler
    Mutant(
        OR,
        "waits_for_the_probe",
        '            loop["calls"][loop["submit"]("rejoin", g, new)] = ("rejoin", g, new)\n            return\n',
        '            probe = loop["submit"]("rejoin", g, new)\n'
        '            loop["calls"][probe] = ("rejoin", g, new)\n'
        "            try:\n"
        "                ray.get(probe)  # wait until the new incarnation answers\n"
        "            except ray.exceptions.RayActorError:\n"
        "                pass\n"
        "            return\n",
        "would block the whole loop",
    ),
    # wrong mechanism (issue 45): a declined call read as a return with no groups
    Mutant(
        OR,
        "declined_call_taken_as_a_return",
        DEATH,
        DEATH.replace(' or out.get("restarted")', "").replace('out["groups"]', 'out.get("groups", [])'),
        "was declined by a process holding another epoch",
    ),
    # wrong mechanism (issue 45): the failed call's exception is let out of the loop
    Mutant(OR, "lets_the_death_out", CATCH, "", "let RayActorError out"),
    # wrong mechanism (issue 45): the new incarnation's number never reaches the calls
    Mutant(OR, "keeps_the_old_incarnation", '        loop["inc"][g] = out["incarnation"]\n', "", "must carry"),
    Mutant(OR, "unavailable_probe_dropped", REPROBE, "    elif out is None:\n        pass\n", "still restarting"),
    # wrong mechanism: the probe asks for the epoch the generator already had (no fence)
    Mutant(
        OR,
        "rejoin_with_the_old_epoch",
        '            new = loop["inc"][g] + 1',
        '            new = loop["inc"][g]',
        "new epoch",
    ),
    Mutant(OR, "ref_left_in_calls", 'loop["calls"].pop(ref)', 'loop["calls"][ref]', "still in loop['calls']"),
    Mutant(
        OR,
        "probe_not_recorded",
        REPROBE,
        '    elif out is None:\n        loop["submit"]("rejoin", g, epoch)\n',
        "did not put it in loop['calls']",
    ),
    # ActorDiedError (a death from a decoding call; from a probe, no restart left) and a method that raised
    # (RayTaskError)
    # wrong mechanism: every exception of ray.get read as a death, RayTaskError included
    Mutant(
        OR,
        "catches_everything_as_a_death",
        CATCH,
        CATCH.replace("ray.exceptions.RayActorError", "Exception"),
        "swallowed a RayTaskError",
    ),
    # wrong mechanism: a probe's ActorDiedError read as any RayActorError: the dead actor probed for ever
    Mutant(
        OR,
        "final_death_reprobed",
        FINAL,
        "",
        "re-probed generator 2 after its probe raised ActorDiedError",
    ),
    # wrong mechanism (the rule before): a decoding call's ActorDiedError taken as final, with no probe,
    # though the call that sees a death cannot tell whether Ray restarts the actor
    Mutant(
        OR,
        "decoding_call_died_taken_as_final",
        FINAL,
        FINAL_FROM_ANY_CALL,
        "decoding call raised ActorDiedError and it was taken as gone",
    ),
    # ... and the same without even the death's bookkeeping: gone at once, its groups never asked for again
    Mutant(
        OR,
        "final_death_without_died",
        '        if method == "rejoin":  # sent after',
        "        if True:  # sent after",
        "decoding call raised ActorDiedError and it was taken as gone",
    ),
    Mutant(
        OR,
        "final_death_left_down",
        '            loop["down"].discard(g)  # it will never answer a probe: none is sent\n',
        "",
        "still in loop['down']",
    ),
    Mutant(
        OR,
        "final_death_not_gone",
        '            loop["gone"].add(g)\n            loop["down"].discard(g)',
        '            loop["down"].discard(g)',
        "not in loop['gone']",
    ),
    Mutant(
        OR,
        "final_death_of_a_down_generator_died_again",
        '            loop["gone"].add(g)\n',
        '            loop["died"](g)\n            loop["gone"].add(g)\n',
        "was called again after generator 2's probe raised ActorDiedError",
    ),
]
