"""The split layouts' controller loop (``sync_split``, ``pipeline``): one ``ray.wait`` at a time.

:class:`SplitLoop` holds what the controller knows of the work in flight (decoding calls,
transfers, probes, the update running) and reacts to whichever call finished first
(:meth:`SplitLoop.handle`). Its three decisions are pure functions elsewhere:
:func:`~.admission.admit` (which groups each idle generator starts, under the lag bound),
:func:`~.ledger.on_generator_death` (which groups a dead generator loses, in which order they
are asked for again) and :func:`outcome` (what Ray's answer to a call means).

Ray's failures, as Ray documents them:

* Any ``RayActorError`` of a decoding call or a weight transfer (``ActorDiedError``: the actor
  died under the call, or the call went to a dead actor; ``ActorUnavailableError``: restarting,
  or a live actor cut off for a while), or a declined call (``{"restarted": 1}``: it ran on a
  new process): a death, whether Ray will restart the actor or not. The controller **fences**:
  the generator's unreturned groups are asked for again and
  :meth:`~.workers.GeneratorWorker.rejoin` gives it a new epoch (a new process holds nothing; a
  live one drops what it held; calls carrying the old epoch are declined).
* The probe (the ``rejoin`` call) says what follows. It is sent after the death, so it meets the
  actor's state as the GCS holds it, whatever ``timeout_ms_task_wait_for_death_info`` is: an
  in-flight call may raise ``ActorDiedError`` for an actor Ray restarts, a probe does not
  (``max_task_retries=0``). ``ActorDiedError``: DEAD, no restart left: the generator is
  **gone**, out of ``down``, never probed again; the others finish the run. Any other
  ``RayActorError`` (RESTARTING): asked again every ``REPROBE_S`` until it answers, for at most
  ``restart_timeout_s`` (then dropped as gone).
* ``RayTaskError`` of a transfer: a member died mid-transfer; the sync group is rebuilt.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from course_lib.capstone_ray.admission import admit
from course_lib.capstone_ray.ledger import on_generator_death

if TYPE_CHECKING:
    from course_lib.capstone_ray.controller import Controller

#: how long the controller waits before asking a restarting generator again (it answers
#: "unavailable" at once while Ray starts its new process); the loop goes on meanwhile
REPROBE_S = 0.02


def outcome(ray: Any, f: Any, timeout: float | None = None) -> tuple[str, Any]:
    """What a call's answer means: ``("ok", value)``, ``("died", None)`` (Ray's ``ActorDiedError``:
    a death for a decoding call or a transfer; for a probe, sent after the death, no restart left),
    ``("down", None)`` (any other ``RayActorError``, that is ``ActorUnavailableError``, or a call
    declined by a new process) or ``("broken", message)`` (the method raised: a transfer broken by a
    member that died). ``timeout``: for a call that may not have finished (Ray's
    ``GetTimeoutError``, a ``TimeoutError``, is let out)."""
    from ray.exceptions import ActorDiedError, RayActorError, RayTaskError

    try:
        value = ray.get(f, timeout=timeout)
    except ActorDiedError:
        return "died", None
    except RayActorError:
        return "down", None
    except RayTaskError as exc:
        return "broken", str(exc).splitlines()[-1][:160]
    if isinstance(value, dict) and value.get("restarted"):
        return "down", None
    return "ok", value


class SplitLoop:
    """The state of one split-layout run and the reactions to each finished call (see the module)."""

    def __init__(self, ctl: Controller) -> None:
        import ray

        self.ray, self.c, cfg = ray, ctl, ctl.cfg
        self.cfg, self.B, n = cfg, cfg.groups_per_batch, len(ctl.gens)
        self.n_gen = n
        self.delivered = [-1] * n  # the newest version each generator has loaded (its receive resolved)
        self.recv: dict[Any, tuple[int, int]] = {}  # transfer into a generator -> (generator, version)
        self.send: list[Any] = []  # trainer 0's sends (engine)
        self.decoding: dict[Any, int] = {}  # decoding call -> generator
        self.probes: dict[Any, int] = {}  # rejoin call -> generator
        self.down_since: dict[int, float] = {}
        self.held: list[set[int]] = [set() for _ in range(n)]  # admitted to g, not returned
        self.inc = [info["incarnation"] for info in ctl.gen_info]  # the epoch each generator's calls carry
        self.todo: deque[int] = deque()  # re-requested groups (lost with a generator) go first
        self.next_k, self.u = 0, 0
        self.done: dict[int, dict[str, Any]] = {}
        self.train: list[Any] = []
        self.train_left: list[Any] = []  # the update's futures not finished yet (the loop waits on these)
        self.down: set[int] = set()  # seen dead (or cut off), probed, and not answered since
        self.gone = ctl.gone  # the ones Ray will not restart (a probe raised ActorDiedError): not down
        self.reprobe: dict[int, float] = {}  # generator -> when to ask it again
        self.deferred: list[int] = []  # a transfer waiting for those in flight (a group must be rebuilt)
        self.room = math.ceil(cfg.n_slots / cfg.group_size) + (1 if cfg.lag_bound > 0 else 0)

    # ---- one pass of the loop ----
    def admit(self) -> None:
        """Deal the next groups to the idle generators holding the fewest, under the lag bound (12.1)."""
        busy = set(self.decoding.values())
        idle = [g for g in range(self.n_gen) if g not in busy and g not in self.down and g not in self.gone]
        adm = admit(
            self.next_k,
            self.todo,
            self.delivered,
            [len(s) for s in self.held],
            idle,
            max_lag=self.cfg.lag_bound,
            groups_per_batch=self.B,
            room=self.room,
            total_groups=self.cfg.n_updates * self.B,
        )
        self.next_k, self.todo = adm.next_k, deque(adm.todo)
        for g, ks in adm.groups.items():
            for k in ks:
                self.c.ledger.admitted[k] = (g, self.inc[g])
            if ks or self.held[g]:
                self.held[g].update(ks)
                self.decoding[self.c.gens[g].run.remote(ks, incarnation=self.inc[g])] = g

    def maybe_train(self) -> None:
        """Update u on every trainer once its batch is complete and no update runs."""
        u, B = self.u, self.B
        if not self.train and all(k in self.done for k in range(u * B, (u + 1) * B)):
            self.train = self.c.train_step(u, self.done)
            self.train_left = list(self.train)

    def wait_one(self) -> Any:
        """``ray.wait`` for the first call to finish (bounded); None if only a re-probe fell due."""
        now = time.perf_counter()
        for g in [g for g, at in self.reprobe.items() if at <= now]:
            del self.reprobe[g]
            self.probe(g)
        waitable = list(self.decoding) + list(self.recv) + self.send + self.train_left + list(self.probes)
        wait_s = min([self.cfg.timeout_s] + [max(at - time.perf_counter(), 0.0) for at in self.reprobe.values()])
        t0 = time.perf_counter()
        if waitable:
            ready, _ = self.ray.wait(waitable, num_returns=1, timeout=wait_s)
        else:  # only a re-probe is due: nothing else can happen before it
            time.sleep(wait_s)
            ready = []
        self.c.blocked_s += time.perf_counter() - t0
        if not ready and not self.reprobe:
            raise TimeoutError(f"nothing finished for timeout_s={self.cfg.timeout_s} s at update {self.u}")
        return ready[0] if ready else None

    def handle(self, f: Any) -> None:
        """React to the call that finished, by what it was."""
        if f in self.decoding:
            g = self.decoding.pop(f)
            kind, out = outcome(self.ray, f)
            if kind == "ok":
                self.take(g, out)
            else:  # "down", "died": it died under the call, was cut off, or a new process declined it
                self.died(g)  # ActorDiedError too: only the probe tells whether Ray restarts it
        elif f in self.recv:
            g, v = self.recv.pop(f)
            kind, out = outcome(self.ray, f)
            if kind == "ok":
                self.c.sync_recv.append(out["total"])
                self.delivered[g] = max(self.delivered[g], v)
            elif kind == "broken":  # a member died mid-transfer: rebuild the group first
                self.c.sync_errors.append(f"receive v{v} on generator {g}: {out}")
                self.c.sync_members = []
            else:
                self.died(g)
        elif f in self.send:
            self.send.remove(f)
            kind, out = outcome(self.ray, f)
            if kind == "ok":
                self.c.sync_send.append(out["total"])
            elif kind != "broken":  # trainer 0 died: not handled here, the run fails with Ray's error
                self.ray.get(f)
            else:
                self.c.sync_errors.append(f"send: {out}")
                self.c.sync_members = []
        elif f in self.probes:
            if self.answered(f):
                self.start_sync(self.u)  # it rejoins (engine: a new group epoch) with the current weights
        elif f in self.train_left:
            self.train_left.remove(f)  # a finished trainer is not waited on again (no spin on it)
            if self.train_left:
                return
            results, self.train = self.ray.get(self.train), []
            self.c.record(self.u, results, time.perf_counter())
            self.u += 1
            if self.u < self.cfg.n_updates:
                self.start_sync(self.u)
            self.c.maybe_checkpoint(self.u)
        self.resend_if_broken()

    # ---- the reactions ----
    def take(self, g: int, out: dict[str, Any]) -> None:
        """The groups a decoding call returned."""
        c = self.c
        c.decode_calls += 1
        c.count_steps(out)
        for grp in out["groups"]:
            c.returns.append((time.perf_counter() - c.t0, g, grp["incarnation"], grp["k"]))
            c._returned(grp)
            self.held[g].discard(grp["k"])
            self.done[grp["k"]] = grp
            if c.kill and g == 1 and grp["incarnation"] > 0 and "t_first_group" not in c.kill:
                c.kill["t_first_group"] = time.perf_counter()

    def died(self, g: int) -> None:
        """A death (whatever Ray raised): g's unreturned groups are lost and asked for again (first),
        and g is probed (:meth:`~.workers.GeneratorWorker.rejoin`, a new epoch); the probe's answer
        says whether it comes back (:meth:`answered`)."""
        c = self.c
        if g in self.down or g in self.gone:  # already seen: its calls were dropped then
            return
        death = on_generator_death(g, self.held, c.ledger.admitted, self.todo)
        for k in death.lost:
            c.ledger.admitted.pop(k)
        c.ledger.lost.extend(death.lost_entries)
        self.todo = deque(death.todo)
        self.held[g].clear()
        self.down.add(g)
        self.down_since[g] = time.perf_counter()
        self.delivered[g] = -1
        for f in [f for f, (h, _) in self.recv.items() if h == g]:
            del self.recv[f]
        for f in [f for f, h in self.decoding.items() if h == g]:
            del self.decoding[f]
        self.probe(g)
        if c.kill:
            c.kill.update({"t_detect": time.perf_counter(), "lost_groups": list(death.lost)})

    def drop(self, g: int) -> None:
        """g is gone for the run (a probe raised ActorDiedError, or its restart outlasted
        restart_timeout_s): out of ``down``, never probed again; its groups went back at its death."""
        self.gone.add(g)
        self.down.discard(g)
        self.reprobe.pop(g, None)
        if len(self.gone) == self.n_gen:
            raise RuntimeError(
                f"every generator died for good (Ray raised ActorDiedError for {sorted(self.gone)}): "
                "nothing can generate; give the generators more max_restarts"
            )

    def probe(self, g: int) -> None:
        self.probes[self.c.gens[g].rejoin.remote(self.inc[g] + 1)] = g  # the next epoch: old calls declined

    def answered(self, f: Any) -> bool:
        """A probe resolved: True if g answered under its new epoch (a new process, or the same one cut
        off for a while); False if Ray said "unavailable" (asked again after REPROBE_S, for at most
        restart_timeout_s since the death) or "died": sent after the death, the probe meets the state
        the GCS holds (DEAD: no restart left), so g is gone (:meth:`drop`)."""
        g, c = self.probes.pop(f), self.c
        if g in self.gone:
            return False
        kind, info = outcome(self.ray, f)
        if kind == "died":
            self.drop(g)
            return False
        if kind != "ok":
            if time.perf_counter() - self.down_since[g] > self.cfg.restart_timeout_s:
                c.restart_expired.append(g)  # not back in its budget: dropped, as a final death
                self.drop(g)
                return False
            c.reprobes += 1
            self.reprobe[g] = time.perf_counter() + REPROBE_S
            return False
        self.inc[g], c.gen_info[g] = info["incarnation"], info
        self.down.discard(g)
        c.rejoins.append({"g": g, "epoch": info["incarnation"], "same_process": info["was"] is not None})
        if c.kill and "t_ready" not in c.kill:
            c.kill.update(
                {
                    "t_ready": time.perf_counter(),
                    "new_pid": info["pid"],
                    "new_process_age_s": info["process_age_s"],
                    "same_process": info["was"] is not None,
                }
            )
        return True

    def start_sync(self, version: int) -> None:
        """Send ``version`` to every live generator (engine: after a needed rebuild, once the
        transfers in flight have ended)."""
        c, live = self.c, [g for g in range(self.n_gen) if g not in self.down and g not in self.gone]
        if self.cfg.sync == "engine" and live != c.sync_members and (self.send or self.recv):
            self.deferred[:] = [version]
            return
        self.deferred.clear()
        send, recv = c.sync_futures(version, live)
        if c.kill and "t_ready" in c.kill and "t_rejoined" not in c.kill and 1 in live:
            c.kill["t_rejoined"] = time.perf_counter()  # the restarted generator's first transfer began
        self.send.extend(send if self.cfg.sync == "engine" else [])
        for g, f in zip(live, recv):
            self.recv[f] = (g, version)

    def resend_if_broken(self) -> None:
        """A deferred transfer, or one broken by a death, goes out on a new group once those in flight ended."""
        if (
            self.cfg.sync == "engine"
            and not self.send
            and not self.recv
            and self.u < self.cfg.n_updates
            and (self.deferred or not self.c.sync_members)
        ):
            self.start_sync(self.u)  # the newest version (a broken transfer changed no weights)

    # ---- fault injection ----
    def maybe_inject_fault(self) -> None:
        """``kill_at``: inject ``cfg.fault`` into generator 1, through Ray, while it decodes (between two
        transfers, or during one) or while it has no call in flight."""
        cfg, c = self.cfg, self.c
        in_sync = bool(self.send) if cfg.sync == "engine" else bool(self.recv)
        busy = 1 in self.decoding.values()
        if (
            cfg.kill_at < 0
            or self.u < cfg.kill_at
            or c.kill
            or 1 in self.down
            or (busy if cfg.kill_idle else not busy or in_sync != cfg.kill_during_sync)
        ):
            return
        c.kill = {
            "pid": c.gen_info[1]["pid"],
            "t_kill": time.perf_counter(),
            "u": self.u,
            "idle": cfg.kill_idle,
            "fault": cfg.fault,
            "during_sync": in_sync,
        }
        f1 = next((f for f, h in self.decoding.items() if h == 1), None)
        if cfg.fault == "unavailable":  # its reply is lost, as in a passing network error
            assert f1 is not None
            del self.decoding[f1]
            self.died(1)  # what Ray's ActorUnavailableError leads to; the process lives on
            return
        self.ray.kill(c.gens[1], no_restart=cfg.fault == "kill_final")
        # idle: nothing of its is awaited; its next call fails, or runs on the new process, which
        # declines it: either way died(1) follows. Decoding: that call tells, or it had finished
        # before the kill landed (its groups are valid, and the next call tells)
        if f1 is not None:
            del self.decoding[f1]
            kind, out = outcome(self.ray, f1, timeout=cfg.timeout_s)
            if kind == "ok":
                self.take(1, out)
            else:
                self.died(1)  # kill_final too: the probe that follows says it is gone

    # ---- the end ----
    def drain(self) -> None:
        """After the last update: groups decoded beyond it are left over; transfers in flight end; a
        generator still restarting is waited for (bounded by 2 x timeout_s since its death) and given
        the final weights, so every generator ends on them and the report says when it was back."""
        from ray.exceptions import RayActorError

        ray, cfg, c = self.ray, self.cfg, self.c
        for f in list(self.decoding):
            try:
                for grp in ray.get(f, timeout=cfg.timeout_s).get("groups", []):  # a declined call has none
                    c._returned(grp)
            except RayActorError:
                pass
        self.settle()
        while self.down:
            c._check_deadline(self.u)
            if time.perf_counter() - min(self.down_since[g] for g in self.down) > 2 * cfg.restart_timeout_s:
                raise TimeoutError(
                    f"generators {sorted(self.down)} were not back within 2 x restart_timeout_s of their death"
                )
            for g in [g for g, at in self.reprobe.items() if at <= time.perf_counter()]:
                del self.reprobe[g]
                self.probe(g)
            wait_s = min([cfg.timeout_s] + [max(at - time.perf_counter(), 0.0) for at in self.reprobe.values()])
            if not self.probes:
                time.sleep(wait_s)
                continue
            ready, _ = ray.wait(list(self.probes), num_returns=1, timeout=wait_s)
            if ready and self.answered(ready[0]) and not self.down:
                self.start_sync(self.u)
                self.settle()

    def settle(self) -> None:
        """Wait for the transfers in flight; one broken by a death is recorded, not raised."""
        for f in self.send + list(self.recv):
            try:
                kind, out = outcome(self.ray, f, timeout=self.cfg.timeout_s)
            except TimeoutError:
                kind, out = "timeout", f"not finished within timeout_s={self.cfg.timeout_s} s"
            if kind != "ok":
                self.c.sync_errors.append(f"at the end: {kind} {out or ''}".strip())
        self.send.clear()
        self.recv.clear()
