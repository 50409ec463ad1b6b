"""What every rank knows about itself and its run: torchrun's environment, the store, the attempt.

torchrun gives every rank its place in environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``GROUP_RANK`` (the node), ``MASTER_ADDR``/``MASTER_PORT`` (the store of the
agent of node 0), ``TORCHELASTIC_RUN_ID`` (the ``--rdzv-id``), ``TORCHELASTIC_RESTART_COUNT``);
:class:`RankEnv` reads them. The ranks talk through that store (:class:`RunStore`): small
control values (the announced weight version, the groups consumed, the stop flag), the
group counter, and the finished groups themselves.

**The attempt.** torchrun's agent keeps one store for the whole launch, so every start of
the ranks (an *attempt*) needs keys of its own: a restarted attempt must never read what a
dead one left behind. ``TORCHELASTIC_RESTART_COUNT`` cannot name the attempt: it is each
agent's own count of the restarts *it* decided. When a rank dies under agent A, A restarts
its workers (its count goes up) and re-rendezvous; agent B sees a node waiting and restarts
its workers as a membership change, which does not count (torch's
``SimpleElasticAgent._invoke_run``), so B's ranks would keep the old number. Nothing of the
rendezvous round reaches the workers either (``MASTER_PORT`` stays the same, and the store
the workers get is not the round's prefixed one). So the ranks agree on the attempt through
the store (:func:`join_attempt`):

1. rank 0 takes the next number ``n`` from the counter ``capstone/attempts`` (1, 2, ... in this
   launch: the store lives as long as the launch) and, in the first attempt, makes the
   launch's id (``TORCHELASTIC_RUN_ID`` and a random suffix, ``capstone/launch``);
2. every other rank ``k`` posts a fresh random nonce at ``capstone/join/k`` and waits for
   ``capstone/welcome/<nonce>``: a key only this process can be waiting for, so never stale;
3. rank 0 reads each ``join/k`` and posts the welcome (attempt ``n``, the launch id) until
   rank ``k`` confirms at ``capstone/ready/n/k`` (a key of this attempt). A ``join/k`` left by
   the dead attempt's rank ``k`` gets a welcome nobody reads; rank 0 reads again until the
   new rank ``k`` has written its own;
4. a rank that was welcomed checks that ``n`` is still the newest number: a welcome from a
   rank 0 of an older attempt is refused, and the rank joins again; a rank 0 that sees a
   newer number than its own steps aside (:class:`AttemptSuperseded`).

torchelastic stops every worker of a round before the next round's workers start (an agent
restarts its whole worker group, and the rendezvous completes only when every agent has
rejoined), so a rank of a dead attempt is at most a process being killed; step 4 keeps one
that lingers from mixing in once the new rank 0 has taken its number. Ranks killed before
they joined are no trouble: their ``join`` key is never read again by a rank 0 that waits
for ``ready/n/k``, and every wait is bounded (a rank that never arrives: a clear error
after ``timeout_s`` naming it, not a hang). All keys of attempt ``n`` then live under
``capstone/a{n}/``, and ``init_process_group`` gets ``capstone/a{n}/pg/``.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

#: Seconds between two looks at the store while ranks join an attempt.
POLL_S = 0.02


@dataclass(frozen=True)
class RankEnv:
    """This rank's torchrun environment (see the module docstring)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    restart_count: int
    master_addr: str
    master_port: int
    run_id: str = ""

    @classmethod
    def from_environ(cls) -> RankEnv:
        """Read torchrun's variables.

        Raises:
            RuntimeError: not started by torchrun (the variables are missing).
        """
        env = os.environ
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise RuntimeError(
                f"{', '.join(missing)} not set: start the capstone job with torchrun "
                "(`course capstone`, or `torchrun --standalone --nproc-per-node 4 -m course_lib.capstone.job ...`)"
            )
        return cls(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            node=int(env.get("GROUP_RANK", "0")),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            run_id=env.get("TORCHELASTIC_RUN_ID", ""),
        )


@dataclass(frozen=True)
class Attempt:
    """One start of the ranks within a launch, as every rank of it sees it (:func:`join_attempt`).

    ``number`` counts the attempts of this launch (1, 2, ...: ``number - 1`` restarts so far);
    ``launch`` names the launch (``TORCHELASTIC_RUN_ID`` and a random suffix), the same in
    every attempt of it and different from any other launch, even one with the same
    ``--rdzv-id``.
    """

    number: int
    launch: str

    @property
    def restarts(self) -> int:
        """Restarts of this launch before this attempt (every agent's ranks agree on it)."""
        return self.number - 1


class AttemptSuperseded(RuntimeError):
    """A newer attempt of the launch started: this rank belongs to a dead one."""


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.0)


def join_attempt(store: dist.Store, rank: int, world_size: int, run_id: str, timeout_s: float) -> Attempt:
    """Agree with every rank of this start on the attempt (see the module docstring).

    ``store`` is the launch's store under ``capstone/``; rank 0 returns once every rank has
    joined, the others once rank 0 has welcomed them.

    Raises:
        TimeoutError: ``timeout_s`` passed first; the message names the ranks that never
            arrived (rank 0) or says that rank 0 never answered (the others).
        AttemptSuperseded: rank 0 of an attempt that a newer one replaced.
    """
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        number = int(store.add("attempts", 1))
        launch = store.compare_set("launch", "", f"{run_id or 'capstone'}-{uuid.uuid4().hex[:12]}").decode()
        welcome = json.dumps({"attempt": number, "launch": launch})
        pending = set(range(1, world_size))
        welcomed: dict[int, str] = {}
        while pending:
            newest = int(store.add("attempts", 0))
            if newest != number:
                raise AttemptSuperseded(f"attempt {newest} of this launch started while attempt {number} was joining")
            for k in sorted(pending):
                if store.check([f"ready/{number}/{k}"]):
                    pending.discard(k)
                elif store.check([f"join/{k}"]):
                    nonce = store.get(f"join/{k}").decode()
                    if welcomed.get(k) != nonce:
                        store.set(f"welcome/{nonce}", welcome)
                        welcomed[k] = nonce
            if pending and time.monotonic() > deadline:
                raise TimeoutError(
                    f"rank 0 waited {timeout_s:g} s for rank(s) {sorted(pending)} to join attempt {number}: "
                    "their torchrun agent did not start them, or they died before joining (see the log above)"
                )
            if pending:
                time.sleep(POLL_S)
        return Attempt(number, launch)
    while True:
        nonce = uuid.uuid4().hex
        store.set(f"join/{rank}", nonce)
        try:
            store.wait([f"welcome/{nonce}"], dt.timedelta(seconds=max(_remaining(deadline), 0.001)))
        except dist.DistStoreError:
            raise TimeoutError(
                f"rank {rank} waited {timeout_s:g} s for rank 0 to welcome it into an attempt "
                "(store key capstone/welcome/...): rank 0 did not start, or died before it could"
            ) from None
        data = json.loads(store.get(f"welcome/{nonce}"))
        number = int(data["attempt"])
        if int(store.add("attempts", 0)) == number:
            store.set(f"ready/{number}/{rank}", nonce)
            return Attempt(number, str(data["launch"]))
        if time.monotonic() > deadline:  # welcomed by a dead attempt's rank 0 until the end
            raise TimeoutError(f"rank {rank}: only older attempts than the newest answered within {timeout_s:g} s")


class RunStore:
    """The launch's store (a TCP store torchrun's agent hosts), under ``capstone/a{attempt}/``.

    Construct it, then :meth:`join` (every rank, before ``init_process_group``). Every call
    waits at most ``timeout_s`` (the store's own timeout); :meth:`get_json` waits in slices
    so that it can say what it waited for. ``client`` replaces the TCP store (tests).
    """

    def __init__(self, env: RankEnv, timeout_s: float, client: dist.Store | None = None) -> None:
        self.env = env
        self.timeout_s = timeout_s
        if client is None:
            client = dist.TCPStore(
                env.master_addr, env.master_port, is_master=False, timeout=dt.timedelta(seconds=timeout_s)
            )
        self.client = client
        self.root = dist.PrefixStore("capstone", self.client)  # keys capstone/...
        self._attempt: Attempt | None = None
        self._store: dist.Store | None = None

    def join(self) -> Attempt:
        """Agree on the attempt with every other rank (:func:`join_attempt`); returns it."""
        self._attempt = join_attempt(self.root, self.env.rank, self.env.world_size, self.env.run_id, self.timeout_s)
        self._store = dist.PrefixStore(f"a{self._attempt.number}", self.root)
        return self._attempt

    @property
    def attempt(self) -> Attempt:
        if self._attempt is None:
            raise RuntimeError("RunStore.join() first: the attempt is not agreed yet")
        return self._attempt

    @property
    def store(self) -> dist.Store:
        """This attempt's keys (``capstone/a{n}/``)."""
        if self._store is None:
            raise RuntimeError("RunStore.join() first: the attempt is not agreed yet")
        return self._store

    def sub(self, name: str) -> RunStore:
        """The same store under ``capstone/a{n}/{name}/`` (one arm of ``--arms``: keys of its own)."""
        child = copy.copy(self)
        child._store = dist.PrefixStore(name, self.store)
        return child

    def for_process_group(self) -> dist.Store:
        """A store of its own for ``init_process_group`` (``capstone/a{n}/pg/``): torchrun's agent
        keeps one store across restarts, and a restarted attempt that read the dead attempt's
        addresses would hang."""
        return dist.PrefixStore("pg", self.store)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value)

    def set_int(self, key: str, value: int) -> None:
        self.store.set(key, str(int(value)))

    def ints(self, *keys: str) -> list[int]:
        """The integer values of ``keys``, read in one request (a consistent snapshot)."""
        return [int(v) for v in self.store.multi_get(list(keys))]

    def add(self, key: str, amount: int) -> int:
        return int(self.store.add(key, amount))

    def has(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def put_json(self, key: str, value: Any) -> None:
        self.store.set(key, json.dumps(value))

    def get_json(self, key: str, what: str, timeout_s: float | None = None) -> Any:
        """Wait for ``key`` (at most ``timeout_s``, default the store's timeout) and parse it.

        Raises:
            TimeoutError: naming ``what`` was waited for.
        """
        seconds = self.timeout_s if timeout_s is None else timeout_s
        try:
            self.store.wait([key], dt.timedelta(seconds=seconds))
        except dist.DistStoreError:
            raise TimeoutError(f"waited {seconds:g} s for {what} (store key {key!r})") from None
        return json.loads(self.store.get(key))

    def delete(self, key: str) -> None:
        self.store.delete_key(key)
