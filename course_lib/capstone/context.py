"""What every rank knows about itself and its run: torchrun's environment, the store, the attempt.

torchrun gives every rank its place in environment variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``GROUP_RANK`` (the node), ``MASTER_ADDR``/``MASTER_PORT`` (the agent's
rendezvous store), ``TORCHELASTIC_RESTART_COUNT`` (0, then 1, 2, ... after each restart));
:class:`RankEnv` reads them. The ranks talk through that store (:class:`RunStore`): small
control values (the announced weight version, the groups consumed, the stop flag), the
group counter, and the finished groups themselves. Keys live under a prefix per restart,
so a restarted attempt never reads what a dead one left behind.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist


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


class RunStore:
    """The rendezvous store (a TCP store torchrun's agent hosts), under ``capstone/r{restart}/``.

    Every call waits at most ``timeout_s`` (the store's own timeout); :meth:`get_json` waits
    in slices so that it can say what it waited for.
    """

    def __init__(self, env: RankEnv, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.client = dist.TCPStore(
            env.master_addr, env.master_port, is_master=False, timeout=dt.timedelta(seconds=timeout_s)
        )
        self.store = dist.PrefixStore(f"capstone/r{env.restart_count}/", self.client)

    def for_process_group(self) -> dist.Store:
        """A store of its own for ``init_process_group``: torchrun's agent keeps one store across
        restarts, and a restarted attempt that read the dead attempt's addresses would hang."""
        return dist.PrefixStore("pg/", self.store)

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
