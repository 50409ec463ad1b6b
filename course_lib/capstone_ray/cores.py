"""Which core an actor pins itself to: a node-local claim, so placement groups do not collide.

Ray's ``num_cpus`` is bookkeeping: it keeps a bundle from being over-subscribed but pins
nothing, so each actor pins itself (``workers.setup_process``). Numbering the core by the
bundle alone would put bundle 0 of *every* placement group on core 0: two runs on one cluster,
or a node of a multi-node cluster that holds only bundle 1 of a group (its bundle 0 elsewhere).

So every pinned actor process claims its core in a registry on its node: one small JSON file
per process in :func:`claims_dir`, named by its pid and holding (placement group, preferred
index, core, the process's start time). :func:`choose_core` picks from the claims of the live
processes:

* an actor of the same placement group with the same preferred index already holds a core:
  that core (the colocated layout's trainer ``r`` and generator ``r`` share bundle ``r``'s core);
* else the ``preferred_index``-th core (modulo) among the allowed cores that no *other*
  placement group holds; if this group's own actors hold it already, the first core nobody
  holds; if every such core is this group's, the ``preferred_index``-th one all the same (a
  group with more bundles on the node than cores shares them, as the plain modulo did);
* ``None`` when other placement groups hold every allowed core: the actor does not pin (it
  reports ``pinned_core: None`` and the cores it may run on).

The preferred index is the bundle's index among its placement group's bundles *on this node*
(:func:`node_local_index`), so a node holding only bundle 1 pins it to its first free core, and
one run alone on a node pins bundle ``b`` to core ``b``, as before. The group of a claim is the
placement group *and* the Ray node (``workers.setup_process``): two Ray nodes on one host
(``ray.cluster_utils.Cluster``) each hold bundles of the group with the same node-local indices,
and must not share a core.

Claims of dead processes (``os.kill(pid, 0)`` raises ``ProcessLookupError``, or the pid now
belongs to a process started after the claim) are ignored and their files removed by the next
reader; a process removes its own file at exit where it can (``atexit``: not after SIGKILL,
which ``ray.kill`` sends, hence the sweep). Reading the claims, choosing and writing the claim
happen under an exclusive ``flock`` on the directory's lock file, so two placement groups
starting at the same instant on one node do not pick the same core.

Limits: the registry sees only actors that claim through it (another program pinned to a core
is not seen); the directory is per user (``course_lib_ray_cores_<uid>`` under the temporary
directory), so two users' runs on one node do not see each other's claims; a group whose actors
start while another group's actors are exiting may pin beside a core that is freed a moment
later (claims are made once, at the actor's start, and never moved).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Environment variable naming another registry directory (tests: a run of their own).
DIR_ENV = "COURSE_LIB_RAY_CORES_DIR"


@dataclass(frozen=True)
class Claim:
    """One live pinned actor process: its group (placement group and Ray node), preferred index and core."""

    pg: str
    index: int
    core: int


def claims_dir() -> Path:
    """The node-local registry: ``$COURSE_LIB_RAY_CORES_DIR``, else ``<tmp>/course_lib_ray_cores_<uid>``."""
    named = os.environ.get(DIR_ENV)
    if named:
        return Path(named)
    return Path(tempfile.gettempdir()) / f"course_lib_ray_cores_{os.getuid()}"


def node_local_index(bundles_to_node: Mapping[int, Any]) -> dict[int, int]:
    """Each bundle's index among its placement group's bundles on the same node.

    ``bundles_to_node``: bundle index -> node id (``ray.util.placement_group_table(pg)["bundles_to_node_id"]``
    once the group is ready). One node: ``{b: b}``; bundles 0 and 2 on node A and 1 on node B:
    ``{0: 0, 1: 0, 2: 1}``.
    """
    seen: dict[Any, int] = {}
    out: dict[int, int] = {}
    for b in sorted(bundles_to_node):
        node = bundles_to_node[b]
        out[b] = seen.get(node, 0)
        seen[node] = out[b] + 1
    return out


def choose_core(pg: str, preferred_index: int, allowed_cores: Sequence[int], claims: Sequence[Claim]) -> int | None:
    """The core for an actor of group ``pg`` (placement group and Ray node) with ``preferred_index``
    (see the module docstring), given the cores this process may run on and the live claims on its
    node; ``None``: do not pin.

    Raises:
        ValueError: a negative ``preferred_index``.
    """
    if preferred_index < 0:
        raise ValueError(f"preferred_index={preferred_index} must be at least 0")
    allowed = sorted(set(allowed_cores))
    for c in claims:  # a sibling (same group, same bundle) is pinned already: share its core
        if c.pg == pg and c.index == preferred_index and c.core in allowed:
            return c.core
    others = {c.core for c in claims if c.pg != pg}
    avail = [core for core in allowed if core not in others]
    if not avail:
        return None
    mine = {c.core for c in claims if c.pg == pg}
    preferred = avail[preferred_index % len(avail)]
    if preferred not in mine:
        return preferred
    free = [core for core in avail if core not in mine]
    return free[0] if free else preferred


def pid_alive(pid: int, started: float | None = None) -> bool:
    """Whether process ``pid`` lives and (``started`` given) is the process that started then, not a
    later one given the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: the pid was reused (the registry is per user)
        return False
    if started is None:
        return True
    try:
        import psutil

        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except Exception:  # gone meanwhile, or no psutil: trust os.kill
        return True


def read_claims(directory: Path, alive: Callable[[int, float | None], bool] = pid_alive) -> dict[int, Claim]:
    """The claims of live processes in ``directory`` (pid -> claim); the files of dead ones are removed,
    unreadable ones skipped (a claim being written is renamed into place whole, never read half)."""
    out: dict[int, Claim] = {}
    if not directory.is_dir():
        return out
    for f in directory.glob("*.json"):
        try:
            pid = int(f.stem)
            d = json.loads(f.read_text())
            claim = Claim(str(d["pg"]), int(d["index"]), int(d["core"]))
            started = d.get("started")
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if alive(pid, None if started is None else float(started)):
            out[pid] = claim
        else:
            with contextlib.suppress(OSError):
                f.unlink()
    return out


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _started(pid: int) -> float | None:
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:
        return None


def claim_core(
    pg: str,
    preferred_index: int,
    allowed_cores: Sequence[int],
    directory: Path | None = None,
    pid: int | None = None,
    release_at_exit: bool = True,
) -> int | None:
    """Choose (:func:`choose_core`) and record this process's core, under the registry's lock; ``None``:
    every allowed core is another placement group's, nothing recorded. ``pid``: the claimant (default
    this process); its earlier claim, if any, is replaced. With ``release_at_exit`` the claim is removed
    when this process exits normally."""
    directory = claims_dir() if directory is None else directory
    pid = os.getpid() if pid is None else pid
    with _locked(directory):
        claims = read_claims(directory)
        claims.pop(pid, None)
        core = choose_core(pg, preferred_index, allowed_cores, list(claims.values()))
        path = directory / f"{pid}.json"
        if core is None:
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        tmp = directory / f".{pid}.tmp"
        tmp.write_text(json.dumps({"pg": pg, "index": preferred_index, "core": core, "started": _started(pid)}))
        os.replace(tmp, path)
    if release_at_exit:
        atexit.register(release, directory, pid)
    return core


def release(directory: Path | None = None, pid: int | None = None) -> None:
    """Remove the claim of ``pid`` (default: this process), if any."""
    directory = claims_dir() if directory is None else directory
    with contextlib.suppress(OSError):
        (directory / f"{os.getpid() if pid is None else pid}.json").unlink()
