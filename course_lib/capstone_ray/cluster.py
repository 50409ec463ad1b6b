"""Start (or join) and stop a Ray cluster, bounded, quiet and checked.

* :func:`start_ray`: ``ray.init`` with bounded resources (CPUs, object store), no dashboard,
  Ray's death-report wait set (``death_info_ms``), quiet output, and a bounded wait. The bound is
  a ``SIGALRM`` timer in the main thread, not ``ray.init`` in a helper thread: Ray starts its GCS
  and raylet with ``PR_SET_PDEATHSIG``, which fires when the *thread* that started them exits
  (measured: both became zombies and the driver aborted 60 s later, "Failed to connect to GCS").
* :func:`stop_ray`: ``ray.shutdown()`` returns before every worker has exited (measured once:
  a ``ray::IDLE`` worker alive 0.5 s later), so it polls this process's own descendants until
  none is left, then kills stragglers by pid and raises. It never matches process names
  machine-wide: other users may run Ray on the same machine.
* :func:`loopback_only`, :func:`listening_sockets`, :func:`listening_addresses`: whether this
  process sits in a loopback-only network namespace, and where the Ray processes listen.

Quiet (nothing a notebook's stored outputs would have to ignore): ``logging_level="ERROR"``
drops the "Token authentication is enabled" line, ``log_to_driver=False`` the actors' prints,
``TORCH_CPP_LOG_LEVEL=ERROR`` (inherited by every Ray worker) c10d's "hostname of the client
socket cannot be retrieved" warning inside the namespace, and the driver's fd 2 is redirected
around ``ray.init`` (Ray's C++ "Failed to determine local IP via external connectivity" line
in a namespace without a route). A killed actor makes a Ray thread of the driver print "A
worker died or was killed ..." to ``sys.stdout``: :func:`course_lib.capstone_ray.controller.run`
captures it.

Ray is imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

#: Environment set (unless already set) before Ray starts; its processes inherit it.
QUIET_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "TORCH_CPP_LOG_LEVEL": "ERROR"}

# (pid, create_time) of the children this process had before start_ray: not Ray's, never killed
_before: set[tuple[int, float]] = set()


class RayStartError(RuntimeError):
    """Ray did not start; the message says what failed and what to do. Nothing of it is left running."""


def _key(p: Any) -> tuple[int, float]:
    try:
        return p.pid, p.create_time()
    except Exception:
        return p.pid, 0.0


def ray_descendants() -> list[Any]:
    """This process's live descendants (``psutil.Process``) that were not there before :func:`start_ray`."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE and _key(p) not in _before:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


#: the death-report wait (s) in the cluster this process started or joined (see :func:`death_info_wait_s`)
_death_info_s = 1.0


def death_info_wait_s() -> float:
    """The longest a call to a killed actor waits for the death report before it raises, in the cluster
    this process started (``death_info_ms``) or joined (Ray's default, 1 s, unless the cluster's own
    start set another): what a check of the detection time may allow for."""
    return _death_info_s


def start_ray(
    num_cpus: int = 2,
    timeout_s: float = 60,
    death_info_ms: int = 0,
    object_store_mb: int = 256,
    temp_dir: str | None = None,
    address: str | None = None,
    num_gpus: int | None = None,
) -> float:
    """Start a local Ray cluster in this process, or join a running one (``address``); returns the
    seconds it took.

    Args:
        num_cpus: CPUs Ray may hand out (placement-group bundles are carved from them).
        timeout_s: the most ``ray.init`` may take (measured here: 6-11 s on 2 loaded cores).
        death_info_ms: Ray's ``timeout_ms_task_wait_for_death_info``: how long a call to a killed
            actor waits for the GCS's death report before it raises. Measured: Ray's default
            (1000) 0.7-1.9 s; 100 or 300: 0.15-1.2 s; 0: 8-50 ms (the error is then an
            ``ActorUnavailableError``, a ``RayActorError``).
        object_store_mb: the shared-memory object store (Ray's default is 30 % of RAM).
        temp_dir: Ray's session directory root (logs, sockets); ``None``: Ray's default, /tmp/ray.
        address: a running cluster's GCS address (``"10.0.0.5:6379"``, or ``"auto"`` on one of its
            nodes): this process joins it as the driver, and the cluster's own resources, object
            store and death-report wait apply (``num_cpus``, ``object_store_mb``, ``death_info_ms``
            and ``temp_dir`` are the cluster's business then, set where it was started).
        num_gpus: GPUs Ray may hand out; ``None``: the GPUs Ray detects (none on a machine without).
            Ray believes the number given: on a machine without GPUs, ``num_gpus=2`` declares two
            that are not there (tests: placement groups and ``ray.get_gpu_ids()`` with GPU bundles).

    The bound is a timer that raises ``TimeoutError`` in the main thread every 0.25 s from
    ``timeout_s`` on. Ray catches exceptions in some start-up steps (measured: its dashboard
    step logs the error and goes on), so an overrun can surface only when ``ray.init`` returns;
    Ray's own waits (60 s for the GCS) bound those steps. Either way it is reported, and every
    process Ray had started is killed by pid.

    Raises:
        RayStartError: called outside the main thread, Ray already running here, or ``ray.init``
            failed or ran past ``timeout_s`` (everything it started is stopped first).
        ValueError: ``timeout_s <= 0``.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RayStartError(
            "start_ray must run in the main thread: Ray's GCS and raylet die with the thread that "
            "started them (PR_SET_PDEATHSIG), and the SIGALRM that bounds the start only reaches the main thread"
        )
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s}: the start needs a positive bound")
    import psutil
    import ray

    if ray.is_initialized():
        raise RayStartError("Ray is already running in this process: call stop_ray() first")
    for k, v in QUIET_ENV.items():
        os.environ.setdefault(k, v)
    _before.clear()
    _before.update(_key(p) for p in psutil.Process().children(recursive=True))

    fired: list[bool] = []

    def expired(signum: int, frame: Any) -> None:
        fired.append(True)
        raise TimeoutError(f"ray.init did not return within timeout_s={timeout_s} s")

    previous = signal.signal(signal.SIGALRM, expired)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        stderr_copy = os.dup(2)
        t0 = time.perf_counter()
        try:
            os.dup2(captured.fileno(), 2)  # Ray's C++ lines at init; its processes log to files of their own
            # measured: ray.init swallows a single TimeoutError raised in it (its own retry loops) and
            # goes on, so the timer fires again every 0.25 s until the error gets out
            signal.setitimer(signal.ITIMER_REAL, float(timeout_s), 0.25)
            kwargs: dict[str, Any] = {}
            if address is not None:  # join: the cluster's resources and settings are its own
                kwargs["address"] = address
            else:
                kwargs |= {
                    "num_cpus": num_cpus,
                    "include_dashboard": False,
                    "object_store_memory": int(object_store_mb) * 1024**2,
                    "_system_config": {"timeout_ms_task_wait_for_death_info": int(death_info_ms)},
                }
                if num_gpus is not None:
                    kwargs["num_gpus"] = int(num_gpus)
                if temp_dir is not None:
                    kwargs["_temp_dir"] = os.path.abspath(temp_dir)
            ray.init(log_to_driver=False, logging_level=logging.ERROR, **kwargs)
            signal.setitimer(signal.ITIMER_REAL, 0)
            global _death_info_s
            _death_info_s = int(death_info_ms) / 1e3 if address is None else 1.0
            if fired:  # it returned, but only after a TimeoutError was raised (and swallowed) in it
                raise TimeoutError(f"ray.init returned after timeout_s={timeout_s} s")
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            os.dup2(stderr_copy, 2)
            captured.seek(0)
            said = captured.read().decode(errors="replace").strip().splitlines()[-5:]
            _shutdown(deadline_s=1.0)  # a half-started node is not known to ray.shutdown(): kill by pid
            if isinstance(exc, KeyboardInterrupt):
                raise
            where = temp_dir or "/tmp/ray"
            cause = (
                f"it did not finish within timeout_s={timeout_s} s (a loaded machine: give it more)"
                if isinstance(exc, TimeoutError)
                else f"{type(exc).__name__}: {exc}"
            )
            raise RayStartError(
                f"Ray did not start: {cause}. Everything it had started was stopped. "
                f"Ray's logs: {where}/session_latest/logs." + (f" Its stderr: {' | '.join(said)}" if said else "")
            ) from exc
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            os.dup2(stderr_copy, 2)
            os.close(stderr_copy)
    return time.perf_counter() - t0


def _shutdown(deadline_s: float) -> list[tuple[int, str]]:
    """``ray.shutdown()``, poll until no process Ray started is left, kill stragglers by pid;
    returns the (pid, name) of those it had to kill."""
    import psutil
    import ray

    ray.shutdown()  # also stops a node that a failed ray.init had half started
    end = time.monotonic() + deadline_s
    while ray_descendants() and time.monotonic() < end:
        time.sleep(0.05)
    left = ray_descendants()
    named = []
    for p in left:
        try:
            named.append((p.pid, p.name()))
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(left, timeout=5)
    return named


def stop_ray(deadline_s: float = 15.0) -> float:
    """``ray.shutdown()``, then wait until no process Ray started is left; returns the seconds it took.

    After :func:`start_ray` joined a running cluster (``address=``) this only disconnects the driver:
    the cluster's processes are not this process's children, and its actors (this run's, with their
    placement groups, ended by :func:`~course_lib.capstone_ray.controller.run`) are the cluster's to
    keep.

    Raises:
        RuntimeError: a process Ray started was still alive ``deadline_s`` after the shutdown (it
            was killed by pid; the message names it).
    """
    t0 = time.perf_counter()
    killed = _shutdown(deadline_s)
    if killed:
        raise RuntimeError(f"processes outlived ray.shutdown() by {deadline_s} s and were killed: {killed}")
    return time.perf_counter() - t0


def loopback_only() -> bool:
    """Whether this process's network is loopback only (``lo`` is the only interface with an address):
    inside the namespace of ``python -m course_lib.runtime.netns -- ...`` (or ``unshare -n``), where
    Ray finds no route out and uses 127.0.0.1 for everything."""
    from course_lib.runtime.netns import in_loopback_namespace

    return in_loopback_namespace()


@dataclass(frozen=True)
class Listener:
    """One listening socket of a Ray process (or of the driver)."""

    pid: int
    name: str
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return is_loopback(self.address)


def is_loopback(address: str) -> bool:
    """127.0.0.0/8, ::1, or an IPv4-mapped loopback address (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def listening_sockets() -> list[Listener]:
    """The TCP sockets listening in the Ray processes this process started, and in this process."""
    import psutil

    out = []
    for p in [psutil.Process(), *ray_descendants()]:
        try:
            conns = p.net_connections(kind="inet")
            name = p.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN and c.laddr:
                out.append(Listener(p.pid, name, c.laddr.ip, c.laddr.port))
    return sorted(out, key=lambda x: (x.name, x.pid, x.port))


def listening_addresses() -> list[str]:
    """The distinct local addresses the Ray processes (and this driver) listen on, sorted.

    Inside a loopback-only namespace: only loopback addresses. Elsewhere Ray listens on every
    interface (``0.0.0.0`` or ``::``), whatever node address it was given."""
    return sorted({x.address for x in listening_sockets()})
