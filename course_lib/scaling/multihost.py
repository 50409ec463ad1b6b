r"""One JAX program over several processes (lesson 05): the worker every process runs.

Multi-controller JAX: every process runs *this same script*. After
``jax.distributed.initialize`` each process sees every process's devices
(``jax.devices()``: the global list) but holds data only on its own
(``jax.local_devices()``). A mesh over the global devices and a
``NamedSharding`` make one global array out of the processes' host-local pieces
(``jax.make_array_from_process_local_data``), and a ``jit(shard_map(...))`` program runs
on all of them at once, with its collectives (``psum``, ``pmean``) crossing process
boundaries. On a CPU the cross-process collectives are gloo's (TCP).

Run by :func:`course_lib.runtime.jax_processes.launch`, which starts ``N`` processes
and gives each the rendezvous in its environment; :func:`launch_program` does that for
one of the programs here::

    results = launch_program("dp_sgd", n_processes=2, timeout_s=90)
    results[0].result["params"]              # process 0's final (replicated) parameters

or by hand, ``python -m course_lib.scaling.multihost --program psum`` with
``COURSE_COORDINATOR_ADDRESS``, ``COURSE_NUM_PROCESSES`` and ``COURSE_PROCESS_ID`` set.

**Programs** (``--program``):

- ``psum``: each process contributes its own rows (process ``p``'s block is
  ``arange + 100 (p + 1)``); a ``shard_map`` ``psum`` returns their sum to every process.
- ``dp_sgd``: data-parallel SGD on a small tanh-MLP regression. The global batch is the
  processes' shards; parameters are replicated (made from the same key in every process:
  normal initialisation, no QR); each step averages the processes' gradients with a
  ``pmean`` (eq. 05.2), so the result equals the same steps on the full batch in one
  process::

      theta <- theta - lr * (1/N) sum_p grad L_p(theta)        L_p: mean loss on process p's rows

- ``dp_ppo``: lesson 04's PPO, data-parallel over processes (:mod:`course_lib.scaling.ppo_dp`):
  each process computes the keys of only its own environments, ``fold_in(key, i)``.

**Reliability.** Each program runs under :func:`course_lib.runtime.watchdog.watchdog`
(exit code 124 instead of a hang); the process ends itself if its launcher dies
(:func:`course_lib.runtime.processes.watch_parent`); JAX's preemption service is off, so
the launcher's SIGTERM ends it (with the service on, JAX catches SIGTERM as a
"preemption notice" and goes on). ``--fault crash|hang --fault-process K
--fault-after-s T`` makes process ``K`` exit with code 17, or stop forever, ``T``
seconds into its program: the launcher's tests use it.

**The same worker on real multi-host GPUs or TPUs** (documentation: the course runs on
one machine).

- *One process per host* (TPU pods, and GPU hosts where one process drives all the
  host's GPUs) or *one process per GPU* (the usual SLURM/``torchrun``-style layout). Each
  process's ``jax.local_devices()`` are its accelerators, the mesh spans
  ``jax.devices()``, and ``make_array_from_process_local_data`` takes each process's
  rows for *all* its local devices. With one process per GPU and the ``COURSE_*``
  variables, set ``COURSE_LOCAL_DEVICE_IDS`` (e.g. ``0``, the local rank) so each process
  claims only its GPU (``jax.distributed.initialize(local_device_ids=...)``); SLURM's
  auto-detection does this itself. ``dp_ppo``'s ``--num-envs`` must split over every
  device of every process (e.g. ``--num-envs 4096`` on 2 x 8 GPUs): the program checks it
  after joining and names the fix.
- *The coordinator* is process 0's host: ``COURSE_COORDINATOR_ADDRESS=host0:PORT`` on every
  host (a reachable address, not ``127.0.0.1``; the port open between hosts), with
  ``COURSE_NUM_PROCESSES`` and each host's ``COURSE_PROCESS_ID``; start the same command on
  every host (``srun``, ``mpirun``, ``gcloud compute tpus tpu-vm ssh --worker=all``).
- *Or let JAX find them*: without ``COURSE_COORDINATOR_ADDRESS`` this worker calls
  ``jax.distributed.initialize()`` with no arguments, which detects Cloud TPU pods,
  SLURM (``srun``; one process per GPU) and Open MPI (``mpirun``) on its own.
- *Collectives*: ``--backend default`` leaves the platform to JAX, which then uses
  NCCL between GPUs and the ICI/DCN network between TPUs; ``jax_cpu_collectives_implementation``
  (gloo) only matters on CPUs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.runtime.jax_processes import ProcessResult, launch, process_info, write_result
from course_lib.runtime.processes import INJECTED_CRASH_EXIT, watch_parent
from course_lib.runtime.watchdog import watchdog

#: ``python -m`` name of this worker.
MODULE = "course_lib.scaling.multihost"
PROGRAMS: tuple[str, ...] = ("psum", "dp_sgd", "dp_ppo")
FAULTS: tuple[str, ...] = ("crash", "hang")
AXIS = "data"

Params = dict[str, Array]


@dataclass(frozen=True)
class WorkerOptions:
    """The worker's options (``--name-with-dashes`` on its command line). :func:`course_lib.describe` lists the help."""

    seed: int = field(default=0, metadata={"help": "seed of data, parameters and environments"})
    rows: int = field(default=2, metadata={"help": "psum: rows each device contributes (3 columns)"})
    repeats: int = field(default=20, metadata={"help": "psum: timed calls (each blocked) for seconds_per_call"})
    batch_per_process: int = field(default=16, metadata={"help": "dp_sgd: rows of the global batch per process"})
    steps: int = field(default=5, metadata={"help": "dp_sgd: SGD steps"})
    lr: float = field(default=0.1, metadata={"help": "dp_sgd: SGD learning rate"})
    d_in: int = field(default=4, metadata={"help": "dp_sgd: input features"})
    hidden: int = field(default=16, metadata={"help": "dp_sgd and dp_ppo: hidden width of the MLPs"})
    num_envs: int = field(default=4, metadata={"help": "dp_ppo: global number of environments (split over processes)"})
    num_steps: int = field(default=16, metadata={"help": "dp_ppo: rollout length T per update"})
    updates: int = field(default=2, metadata={"help": "dp_ppo: PPO updates"})
    num_minibatches: int = field(default=2, metadata={"help": "dp_ppo: minibatches per epoch"})
    update_epochs: int = field(default=2, metadata={"help": "dp_ppo: epochs per update"})
    watchdog_s: float = field(default=120.0, metadata={"help": "the program's watchdog: exit 124 after this long"})
    init_timeout_s: int = field(default=60, metadata={"help": "jax.distributed.initialize's wait for all processes"})
    backend: str = field(default="cpu", metadata={"help": "'cpu' (gloo, one CPU device per process) or 'default'"})
    fault: str | None = field(default=None, metadata={"help": "inject a fault: 'crash' (exit 17) or 'hang'"})
    fault_process: int = field(default=1, metadata={"help": "the process the fault hits"})
    fault_after_s: float = field(default=0.0, metadata={"help": "seconds into the program before the fault"})

    def to_argv(self) -> list[str]:
        """The command-line arguments that give these options (defaults left out)."""
        argv = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                argv += [f"--{f.name.replace('_', '-')}", str(value)]
        return argv


def check_options(program: str, n_processes: int, options: WorkerOptions) -> None:
    """Refuse what would fail inside the processes, before any is started."""
    if program not in PROGRAMS:
        raise ValueError(f"unknown program {program!r}; choose one of {', '.join(PROGRAMS)}")
    if options.backend not in ("cpu", "default"):
        raise ValueError(f"backend must be 'cpu' or 'default', got {options.backend!r}")
    if options.fault is not None:
        if options.fault not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS} or None, got {options.fault!r}")
        if not 0 <= options.fault_process < n_processes:
            raise ValueError(f"fault_process = {options.fault_process} is not a process of 0..{n_processes - 1}")
    for name in ("rows", "repeats", "batch_per_process", "steps", "d_in", "hidden", "num_envs", "num_steps", "updates"):
        if getattr(options, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(options, name)}")
    if program == "dp_ppo" and options.num_envs % n_processes:
        raise ValueError(f"num_envs = {options.num_envs} does not split over {n_processes} processes: use a multiple")


# ---------------------------------------------------------------------------------------
# Host-local pieces and global arrays
# ---------------------------------------------------------------------------------------


def global_array(mesh: Mesh, spec: P, local: Any) -> Array:
    """The global array whose process-local part is ``local`` (numpy or a JAX array).

    With ``P(AXIS)`` each process passes its own rows (for all its local devices) and the
    global array is their concatenation in process order; with ``P()`` every process
    passes the same whole value (a replicated array).
    """
    return jax.make_array_from_process_local_data(NamedSharding(mesh, spec), local)


def local_value(x: Array) -> np.ndarray:
    """A replicated (or this process's first shard of a sharded) global array, as numpy:
    ``np.asarray`` cannot read a global array that spans other processes' devices."""
    return np.asarray(x.addressable_data(0))


def psum_rows(process_id: int, rows: int, width: int = 3) -> np.ndarray:
    """What process ``process_id`` contributes to ``psum``: ``arange(rows * width) + 100 (p + 1)``, shape ``[rows, width]``."""
    return (np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 100.0 * (process_id + 1)).astype(
        np.float32
    )


def regression_rows(seed: int, start: int, stop: int, d_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``start..stop-1`` of the regression data: ``x ~ N(0, I)``, ``y = sin(sum x) + 0.1 noise``.

    Row ``r`` comes from its own generator, seeded ``(seed, r)``: a process makes only its
    own rows, and the global batch is the same however it is split.
    """
    xs, ys = [], []
    for r in range(start, stop):
        rng = np.random.default_rng((seed, r))
        x = rng.normal(size=d_in)
        xs.append(x)
        ys.append([np.sin(x.sum()) + 0.1 * rng.normal()])
    return np.asarray(xs, np.float32).reshape(-1, d_in), np.asarray(ys, np.float32).reshape(-1, 1)


@functools.partial(jax.jit, static_argnames=("d_in", "hidden", "d_out"))
def init_mlp(key: Array, d_in: int, hidden: int, d_out: int = 1) -> Params:
    """``d_in -> hidden (tanh) -> d_out``; weights ``N(0, 1/fan_in)``, zero biases. No QR:
    safe in any program (:mod:`course_lib.scaling.devices`). Jitted: one compilation instead of one
    per operation (a second less start-up per process)."""
    k1, k2 = jax.random.split(key)
    return {
        "w1": jax.random.normal(k1, (d_in, hidden), jnp.float32) / np.sqrt(d_in),
        "b1": jnp.zeros((hidden,), jnp.float32),
        "w2": jax.random.normal(k2, (hidden, d_out), jnp.float32) / np.sqrt(hidden),
        "b2": jnp.zeros((d_out,), jnp.float32),
    }


def mse(params: Params, x: Array, y: Array) -> Array:
    """Mean squared error of the MLP over the rows of ``x``."""
    pred = jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
    return jnp.mean((pred - y) ** 2)


def make_dp_sgd(
    mesh: Mesh, steps: int, lr: float, axis: str = AXIS
) -> Callable[[Params, Array, Array], tuple[Params, Array]]:
    """``steps`` SGD steps, data-parallel over ``axis``: ``(params P(), x P(axis), y P(axis)) -> (params, losses[steps])``.

    Each device differentiates its *own copy* of the parameters (``pcast`` to varying):
    with ``check_vma`` on, the gradient of the replicated parameters themselves would come
    back already summed over devices, and the ``pmean`` below would then do nothing (the
    double-counting trap of the GOTCHAS). The ``pmean`` is the all-reduce of eq. 05.2.
    ``losses[s]`` is the global batch's loss before step ``s``. All steps are one program
    (``lax.scan``): no Python loop dispatching collectives back to back.
    """

    def body(params: Params, x: Array, y: Array) -> tuple[Params, Array]:
        def step(p: Params, _: None) -> tuple[Params, Array]:
            mine = jax.tree.map(lambda w: jax.lax.pcast(w, (axis,), to="varying"), p)
            loss, grads = jax.value_and_grad(mse)(mine, x, y)  # this device's rows only
            grads = jax.lax.pmean(grads, axis)  # (1/N) sum_p grad L_p: the all-reduce
            return jax.tree.map(lambda w, g: w - lr * g, p, grads), jax.lax.pmean(loss, axis)

        return jax.lax.scan(step, params, None, length=steps)

    mapped = jax.shard_map(body, mesh=mesh, in_specs=(P(), P(axis), P(axis)), out_specs=(P(), P()))
    return jax.jit(mapped)


# ---------------------------------------------------------------------------------------
# The programs: each returns its JSON-able result
# ---------------------------------------------------------------------------------------


def program_psum(mesh: Mesh, options: WorkerOptions) -> dict[str, Any]:
    """Each process's rows, ``psum``-ed over every device of every process."""
    p = jax.process_index()
    local = np.concatenate([psum_rows(p, options.rows) for _ in jax.local_devices()])
    x = global_array(mesh, P(AXIS), local)
    f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, AXIS), mesh=mesh, in_specs=P(AXIS), out_specs=P()))
    reduced = jax.block_until_ready(f(x))
    times = []
    for _ in range(options.repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))  # block each call: collectives dispatched back to back can deadlock
        times.append(time.perf_counter() - t0)
    return {
        "local_input": local.tolist(),
        "global_shape": list(x.shape),
        "reduced": local_value(reduced).tolist(),
        "seconds_per_call": float(np.median(times)),
    }


def program_dp_sgd(mesh: Mesh, options: WorkerOptions) -> dict[str, Any]:
    """Data-parallel SGD: this process's shard of the batch, replicated parameters."""
    p, b = jax.process_index(), options.batch_per_process
    x_local, y_local = regression_rows(options.seed, p * b, (p + 1) * b, options.d_in)
    x, y = global_array(mesh, P(AXIS), x_local), global_array(mesh, P(AXIS), y_local)
    init = init_mlp(jax.random.key(options.seed), options.d_in, options.hidden)  # same key: same values everywhere
    params = {k: global_array(mesh, P(), np.asarray(v)) for k, v in init.items()}
    train = make_dp_sgd(mesh, options.steps, options.lr)
    final, losses = jax.block_until_ready(train(params, x, y))
    return {
        "global_batch": list(x.shape),
        "params": {k: local_value(v).tolist() for k, v in final.items()},
        "losses": local_value(losses).tolist(),
    }


def ppo_config(options: WorkerOptions) -> Any:
    """The lesson-04 :class:`~course_lib.ppo.config.PPOConfig` that ``dp_ppo`` trains with."""
    from course_lib.ppo.config import PPOConfig

    return PPOConfig(
        num_envs=options.num_envs,
        num_steps=options.num_steps,
        total_timesteps=options.updates * options.num_envs * options.num_steps,
        num_minibatches=options.num_minibatches,
        update_epochs=options.update_epochs,
        hidden=options.hidden,
    )


def ppo_keys(seed: int) -> tuple[Array, Array, Array]:
    """``(key, init key, env-keys key)`` of a ``dp_ppo`` run: ``key(seed)`` and its split in two."""
    key = jax.random.key(seed)
    k_init, k_envs = jax.random.split(key)
    return key, k_init, k_envs


def program_dp_ppo(mesh: Mesh, options: WorkerOptions) -> dict[str, Any]:
    """Lesson 04's PPO on the processes' environments (:mod:`course_lib.scaling.ppo_dp`)."""
    from course_lib.scaling import ppo_dp

    config = ppo_config(options)
    if config.num_envs % jax.device_count():
        raise ValueError(
            f"dp_ppo: --num-envs {config.num_envs} does not split over the job's {jax.device_count()} devices "
            f"({jax.process_count()} processes x {jax.local_device_count()}): pass a multiple of {jax.device_count()}"
        )
    key, k_init, k_envs = ppo_keys(options.seed)
    per = config.num_envs // jax.process_count()
    mine = jnp.arange(jax.process_index() * per, (jax.process_index() + 1) * per)
    local_keys = jax.vmap(lambda i: jax.random.fold_in(k_envs, i))(mine)  # = ppo_dp.env_keys(k_envs, E)[mine]
    flat = global_array(mesh, P(), np.asarray(ppo_dp.init_flat_params(k_init, config)))
    keys = global_array(mesh, P(AXIS), local_keys)
    train = ppo_dp.make_dp_train(config, mesh, AXIS)
    out, metrics = jax.block_until_ready(train(flat, keys, global_array(mesh, P(), key)))
    return {
        "flat_params": local_value(out).tolist(),
        "metrics": {k: local_value(v).tolist() for k, v in metrics.items()},
    }


_PROGRAMS: dict[str, Callable[[Mesh, WorkerOptions], dict[str, Any]]] = {
    "psum": program_psum,
    "dp_sgd": program_dp_sgd,
    "dp_ppo": program_dp_ppo,
}


# ---------------------------------------------------------------------------------------
# Launching (the parent's side) and the worker's main
# ---------------------------------------------------------------------------------------


def launch_program(
    program: str,
    n_processes: int = 2,
    timeout_s: float = 120.0,
    *,
    echo: bool = False,
    options: WorkerOptions | None = None,
    **overrides: Any,
) -> list[ProcessResult]:
    """Run ``program`` in ``n_processes`` fresh processes and return their results.

    ``options`` (default :class:`WorkerOptions`) with ``overrides`` applied
    (``launch_program("dp_sgd", 2, steps=10)``). Raises ``ValueError`` before starting
    anything for an unknown program or option; :class:`~course_lib.runtime.jax_processes.ProcessFailed`
    or :class:`~course_lib.runtime.jax_processes.LaunchTimeout` when a process fails or hangs.
    """
    options = options or WorkerOptions()
    known = {f.name for f in dataclasses.fields(WorkerOptions)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown worker option(s) {unknown}; known: {sorted(known)}")
    options = dataclasses.replace(options, **overrides)
    if isinstance(n_processes, bool) or not isinstance(n_processes, int) or n_processes < 1:
        raise ValueError(f"n_processes must be an int >= 1, got {n_processes!r}")
    check_options(program, n_processes, options)
    return launch(MODULE, n_processes, timeout_s, args=["--program", program, *options.to_argv()], echo=echo)


def parse_args(argv: Sequence[str] | None = None) -> tuple[str, WorkerOptions]:
    """``--program NAME`` and the :class:`WorkerOptions` of a command line."""
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n")[0])
    parser.add_argument("--program", required=True, choices=PROGRAMS)
    types: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "str | None": str}
    for f in dataclasses.fields(WorkerOptions):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=types[str(f.type)], default=f.default, help=f.metadata["help"]
        )
    ns = parser.parse_args(argv)
    options = WorkerOptions(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(WorkerOptions)})
    return ns.program, options


def _configure_jax(backend: str) -> None:
    """Before the backend starts: one CPU device per process with gloo collectives, and
    SIGTERM left to end the process (JAX's preemption service would catch it)."""
    jax.config.update("jax_enable_preemption_service", False)
    if backend == "cpu":
        # an inherited --xla_force_host_platform_device_count would give this process several devices
        flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
        os.environ["XLA_FLAGS"] = " ".join(flags)
        jax.config.update("jax_platforms", "cpu")
        jax.config.update("jax_num_cpu_devices", 1)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")


def _inject_fault(options: WorkerOptions) -> None:
    """``--fault``: this process crashes (exit 17) or hangs ``fault_after_s`` seconds into its program."""
    if options.fault is None or jax.process_index() != options.fault_process:
        return
    time.sleep(options.fault_after_s)
    print(
        f"INJECTED {options.fault.upper()}: process {jax.process_index()}, {options.fault_after_s:g} s into the program",
        file=sys.stderr,
        flush=True,
    )
    if options.fault == "crash":
        os._exit(INJECTED_CRASH_EXIT)
    threading.Event().wait()  # hang: the others wait in their next collective


#: Comma-separated local device ids this process drives (one process per GPU: its local rank).
LOCAL_DEVICE_IDS_ENV = "COURSE_LOCAL_DEVICE_IDS"


def join_cluster(info: Any, timeout_s: int) -> Mesh:
    """Join the job (``jax.distributed.initialize``) and return one ``data`` mesh over every process's devices.

    ``info`` holds the coordinator's address, the process count and this process's id
    (from ``COURSE_*`` variables); ``None`` lets JAX find them itself (TPU pods, SLURM,
    Open MPI). Every process must call this before its first computation; afterwards
    ``jax.devices()`` lists all processes' devices and ``jax.local_devices()`` this one's.
    """
    ids = os.environ.get(LOCAL_DEVICE_IDS_ENV, "").strip()  # one process per GPU: which ones are mine
    local_ids = [int(i) for i in ids.split(",")] if ids else None
    if info is None:
        jax.distributed.initialize(initialization_timeout=timeout_s, local_device_ids=local_ids)
    else:
        local = info.coordinator_address.rsplit(":", 1)[0] in ("127.0.0.1", "localhost")
        jax.distributed.initialize(
            coordinator_address=info.coordinator_address,  # process 0's host:port, the same for everyone
            num_processes=info.num_processes,
            process_id=info.process_id,
            local_device_ids=local_ids,
            initialization_timeout=timeout_s,
            coordinator_bind_address=info.coordinator_address if local else None,
        )
    return jax.make_mesh((jax.device_count(),), (AXIS,))  # global: every process's devices


def main(argv: Sequence[str] | None = None) -> int:
    """Initialise jax.distributed, run the program under the watchdog, write the result, shut down."""
    program, options = parse_args(argv)
    watch_parent()  # no orphan: end if the launcher dies
    info = process_info()
    if info is not None:
        check_options(program, info.num_processes, options)
    _configure_jax(options.backend)
    if program == "dp_ppo":
        import course_lib.scaling.ppo_dp  # noqa: F401  (before the backend starts: it sets an XLA CPU flag on import)
    t0 = time.monotonic()
    mesh = join_cluster(info, options.init_timeout_s)
    init_s = time.monotonic() - t0
    what = f"program {program} in process {jax.process_index()} of {jax.process_count()}"
    t1 = time.monotonic()
    with watchdog(options.watchdog_s, what):
        _inject_fault(options)
        result = _PROGRAMS[program](mesh, options)
    result.update(
        program=program,
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        global_devices=jax.device_count(),
        local_devices=jax.local_device_count(),
        init_s=init_s,
        program_s=time.monotonic() - t1,
    )
    write_result(result)
    jax.distributed.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
