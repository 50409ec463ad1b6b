"""The node-local core claim of lesson 12's actors (``course_lib.capstone_ray.cores``), without Ray.

Each pinned actor claims a core in a registry on its node, so that two placement groups on one
node (two runs on one cluster, or a node holding bundle 1 of a group only) do not all pin their
bundle 0 to core 0. Tested here with faked core sets and claims (:func:`choose_core`), the
registry in a directory of its own with a dead pid and a reused pid, every claim order of two
groups, and two real processes of two fake placement groups claiming at once.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course_lib.capstone_ray.cores import (
    DIR_ENV,
    Claim,
    choose_core,
    claim_core,
    claims_dir,
    node_local_index,
    pid_alive,
    read_claims,
    release,
)

# ---- choose_core --------------------------------------------------------------------------------


def test_alone_on_a_node_bundle_b_gets_the_b_th_allowed_core_modulo():
    assert [choose_core("A", i, [0, 1, 2, 3], []) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [choose_core("A", i, [7, 2, 5], []) for i in range(4)] == [2, 5, 7, 2]  # sorted, not in given order


def test_cores_of_another_placement_group_are_skipped():
    other = [Claim("B", 0, 0), Claim("B", 1, 1)]
    assert choose_core("A", 0, [0, 1, 2, 3], other) == 2
    assert choose_core("A", 1, [0, 1, 2, 3], other) == 3
    # a core another group holds outside this process's allowed cores changes nothing
    assert choose_core("A", 0, [2, 3], [Claim("B", 0, 0)]) == 2


def test_a_sibling_of_the_same_group_and_bundle_shares_its_core():
    """Colocated: trainer r and generator r share bundle r's core, whatever core it is."""
    claims = [Claim("A", 0, 3), Claim("B", 0, 0)]
    assert choose_core("A", 0, [0, 1, 2, 3], claims) == 3
    # ... but not a sibling's core this process may not run on
    assert choose_core("A", 0, [0, 1, 2], claims) == 1


def test_a_core_of_its_own_group_is_left_to_its_bundle_while_one_is_free():
    # bundle 1 of A claimed core 1 first; then B took core 0; bundle 0 of A prefers core 1 (the 0th
    # core B does not hold) but it is bundle 1's, so it takes the first core nobody holds
    claims = [Claim("A", 1, 1), Claim("B", 0, 0)]
    assert choose_core("A", 0, [0, 1, 2, 3], claims) == 2


def test_more_bundles_than_free_cores_share_the_groups_own_cores_modulo():
    claims = [Claim("A", 0, 0), Claim("A", 1, 1)]
    assert choose_core("A", 2, [0, 1], claims) == 0  # the plain modulo, as before: no other group's core
    assert choose_core("A", 3, [0, 1, 2, 3], claims + [Claim("B", 0, 2), Claim("B", 1, 3)]) == 1


def test_no_core_when_other_groups_hold_every_allowed_core():
    claims = [Claim("B", 0, 0), Claim("C", 0, 1)]
    assert choose_core("A", 0, [0, 1], claims) is None
    assert choose_core("A", 0, [], []) is None
    with pytest.raises(ValueError, match="preferred_index=-1"):
        choose_core("A", -1, [0, 1], [])


@pytest.mark.parametrize("n_cores", [4, 5, 8])
def test_every_claim_order_of_two_groups_gives_disjoint_cores_and_siblings_one_core(n_cores):
    """Two placement groups of two bundles, two actors per bundle (colocated), claiming in every
    order (random subsets of the orders for speed): the groups' cores are disjoint, each bundle's two
    actors share one core, the two bundles of a group have two."""
    actors = [(g, b, a) for g in "AB" for b in (0, 1) for a in (0, 1)]
    orders = list(itertools.permutations(actors))
    for order in random.Random(n_cores).sample(orders, 400):
        claims: list[Claim] = []
        got: dict[tuple[str, int, int], int] = {}
        for g, b, a in order:
            core = choose_core(g, b, range(n_cores), claims)
            assert core is not None, order
            claims.append(Claim(g, b, core))
            got[g, b, a] = core
        per_bundle = {(g, b): {got[g, b, 0], got[g, b, 1]} for g in "AB" for b in (0, 1)}
        assert all(len(c) == 1 for c in per_bundle.values()), (order, got)
        a_cores = per_bundle["A", 0] | per_bundle["A", 1]
        b_cores = per_bundle["B", 0] | per_bundle["B", 1]
        assert len(a_cores) == len(b_cores) == 2 and not a_cores & b_cores, (order, got)


def test_the_bundle_index_on_its_node():
    assert node_local_index({0: "n1", 1: "n1", 2: "n1"}) == {0: 0, 1: 1, 2: 2}
    # a node holding only bundle 1 gives it index 0 there: its first free core
    assert node_local_index({0: "n1", 1: "n2"}) == {0: 0, 1: 0}
    assert node_local_index({2: "a", 0: "a", 1: "b", 3: "b"}) == {0: 0, 1: 0, 2: 1, 3: 1}


# ---- the registry --------------------------------------------------------------------------------


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def write_claim(directory: Path, pid: int, pg: str, index: int, core: int, started: float | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{pid}.json"
    path.write_text(json.dumps({"pg": pg, "index": index, "core": core, "started": started}))
    return path


def test_a_claim_is_recorded_read_back_and_released(tmp_path):
    me = os.getpid()
    assert claim_core("A", 0, [0, 1, 2], tmp_path, release_at_exit=False) == 0
    assert read_claims(tmp_path) == {me: Claim("A", 0, 0)}
    # claiming again replaces this process's own claim instead of counting it as someone else's
    assert claim_core("B", 1, [0, 1, 2], tmp_path, release_at_exit=False) == 1
    assert read_claims(tmp_path) == {me: Claim("B", 1, 1)}
    release(tmp_path)
    assert read_claims(tmp_path) == {}


def test_a_dead_processs_claim_is_ignored_and_swept(tmp_path):
    stale = write_claim(tmp_path, dead_pid(), "B", 0, 0)
    assert not pid_alive(int(stale.stem))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            write_claim(tmp_path, live.pid, "C", 0, 1)
            # core 0 is free again (its claimant died), core 1 is C's
            assert claim_core("A", 0, [0, 1, 2], tmp_path, release_at_exit=False) == 0
            assert not stale.exists()
            assert claim_core("A2", 0, [0, 1, 2], tmp_path, pid=dead_pid(), release_at_exit=False) == 2
        finally:
            live.kill()
    assert set(read_claims(tmp_path)) == {os.getpid()}  # C's process and the dead claimant: swept


def test_a_reused_pid_does_not_keep_a_claim_alive(tmp_path):
    """A claim whose pid now belongs to a process started after it (another start time) is stale."""
    write_claim(tmp_path, os.getpid(), "B", 0, 0, started=1.0)  # this process did not start in 1970
    assert read_claims(tmp_path) == {}
    write_claim(tmp_path, os.getpid(), "B", 0, 0)  # no start time recorded: os.kill alone decides
    assert read_claims(tmp_path) == {os.getpid(): Claim("B", 0, 0)}


def test_faked_liveness_and_unreadable_files(tmp_path):
    write_claim(tmp_path, 11, "A", 0, 0)
    write_claim(tmp_path, 12, "B", 0, 1)
    (tmp_path / "13.json").write_text("{half a claim")
    (tmp_path / "notapid.json").write_text("{}")
    assert read_claims(tmp_path, alive=lambda pid, started: pid == 12) == {12: Claim("B", 0, 1)}
    assert not (tmp_path / "11.json").exists() and (tmp_path / "13.json").exists()


def test_no_core_and_no_claim_when_other_groups_hold_them_all(tmp_path):
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as live:
        try:
            write_claim(tmp_path, live.pid, "B", 0, 0)
            write_claim(tmp_path, live.pid + 10**7, "B", 1, 1)  # no such pid: swept
            assert claim_core("A", 0, [0], tmp_path, release_at_exit=False) is None
            assert not (tmp_path / f"{os.getpid()}.json").exists()
        finally:
            live.kill()


def test_the_registry_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(DIR_ENV, raising=False)
    assert claims_dir() == Path(tempfile.gettempdir()) / f"course_lib_ray_cores_{os.getuid()}"
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    assert claims_dir() == tmp_path


CLAIMANT = """
import sys
from pathlib import Path
from course_lib.capstone_ray.cores import claim_core
print(claim_core(sys.argv[1], 0, [0, 1], Path(sys.argv[2])), flush=True)
sys.stdin.readline()
"""


def test_two_processes_of_two_placement_groups_claim_disjoint_cores_at_once_and_release_at_exit(tmp_path):
    """Two processes, each bundle 0 of its own (fake) placement group, started together: before the
    registry both pinned core 0; now each has a core of its own, and both claims go at their exit."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMANT, pg, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for pg in ("pg-one", "pg-two")
    ]
    try:
        assert all(p.stdout is not None for p in procs)
        cores = [int(p.stdout.readline()) for p in procs if p.stdout is not None]
        assert sorted(cores) == [0, 1]
        assert {c.pg: c.core for c in read_claims(tmp_path).values()} == {"pg-one": cores[0], "pg-two": cores[1]}
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)
    assert [p.returncode for p in procs] == [0, 0]
    assert not list(tmp_path.glob("*.json"))  # released at exit (atexit)
