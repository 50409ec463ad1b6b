r"""The scaling checklist, executable (lesson 05): five things to measure before trusting a run on N devices.

Going from one device to ``N`` is only a speed-up if the answer is the same, the
communication is cheap, the memory fits and the run can be repeated. Each row of
:func:`scaling_checklist` measures one of these on data-parallel PPO
(:mod:`course_lib.scaling.ppo_dp`) and gives a verdict, ``ok`` or ``warn``, with the reason:

(a) **Learning rate for the global batch.** A batch ``k = B / B_0`` times the one the
    rate was tuned at takes ``k`` times fewer steps for the same samples; the rules of
    :mod:`course_lib.scaling.lr_rules` suggest ``lr_0 * k`` (linear) or ``lr_0 * sqrt(k)``
    (square root). ``B`` is the global minibatch (``config.minibatch_size``: one gradient
    step's samples over all devices). In :mod:`course_lib.scaling.ppo_dp` ``num_envs`` is the
    *global* count, so changing the device count does not change ``B``; the row matters
    when ``B`` grew because you added devices at a fixed number of envs per device
    (pass ``base_batch``, the minibatch the rate was tuned at). ``ok`` when
    ``config.lr`` lies between the two suggestions (or ``k = 1``).
(b) **One device and N devices give the same parameters** (the same seed, the same global
    batch): ``max |theta_1 - theta_N|`` after a whole run, ``ok`` at most ``tolerance``
    (float summation order moves it ~1e-7). This is the check that catches the check_vma
    trap (``sync="trap"``: ``N`` times the gradient).
(c) **Communication overhead**, by direct measurement of the all-reduce rather than
    a run without it (that would be a different program, with no synchronised
    parameters): ``t_comm = S * t_allreduce``, where ``S`` is the run's number of gradient
    steps (``num_updates * update_epochs * num_minibatches``) and ``t_allreduce`` is the
    time of one ``pmean`` of a gradient-sized float32 vector (``P`` parameters) on the same
    mesh, measured as a compiled ``lax.scan`` of ``S`` dependent ``pmean``\ s (one
    program, so per-call dispatch is not counted; every step depends on the last, so none
    can be removed or overlapped). It is compared with ``t_run``, the compiled run's wall
    time (blocked, median of interleaved repeats: run, all-reduces, run, ...)::

        overhead = t_comm / t_run          (the share of the run spent all-reducing gradients)

    ``ok`` below ``overhead_warn`` (default 20 %). It leaves out the run's few scalar
    all-reduces (advantage statistics, metrics); on CPU host devices an all-reduce is a
    rendezvous of threads plus a memory copy, so ``t_allreduce`` is mostly latency.
(d) **Memory per device**, from XLA's ``compiled.memory_analysis()`` of the run on 1 and
    on N devices: argument, output and temporary bytes (per device: each device runs the
    partitioned program). Data parallelism replicates parameters and optimiser state (they
    do not shrink; ZeRO/FSDP would shard them) and splits activations (temporaries shrink
    about ``1/N``). ``ok`` if the N-device total is not above the 1-device total.
(e) **Reproducibility**: two N-device runs with the same seed are bitwise equal (``ok``)
    -- the randomness is per environment and nothing depends on thread timing.

Every multi-device program runs under :func:`course_lib.runtime.watchdog.watchdog` and
blocks on its result; the compiled PPO programs are :func:`course_lib.scaling.ppo_dp.compiled_dp_train`'s
(cached per config and mesh, and checked for LAPACK calls).
"""

from __future__ import annotations

import functools
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.scaling.devices import check_multidevice_safe, data_mesh
from course_lib.scaling.ppo_dp import PPOConfig, Sync, compiled_dp_train, env_keys, init_flat_params, run_dp, shard_inputs
from course_lib.runtime.watchdog import watchdog

Verdict = Literal["ok", "warn"]

#: The rows' names, in order.
CHECKS: tuple[str, ...] = ("lr scaling", "1 vs N devices", "communication", "memory per device", "reproducible")


@dataclass(frozen=True)
class CheckRow:
    """One measured check: its ``name``, the measured ``value`` (as text), ``verdict`` and why."""

    name: str
    value: str
    verdict: Verdict
    explanation: str


@dataclass
class ScalingReport:
    """The checklist's rows, the numbers behind them (``measured``) and notes (what was skipped)."""

    n_devices: int
    rows: list[CheckRow]
    measured: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def row(self, name: str) -> CheckRow:
        """The row called ``name`` (one of :data:`CHECKS`)."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(f"no row {name!r} in this report; it has {[r.name for r in self.rows]}")

    @property
    def ok(self) -> bool:
        """Whether every row's verdict is ``ok``."""
        return all(r.verdict == "ok" for r in self.rows)

    def table(self) -> str:
        """A markdown table: check | value | verdict | why, then the notes."""
        cell: Callable[[str], str] = lambda s: s.replace("|", "\\|").replace("\n", " ")  # noqa: E731
        lines = ["| check | value | verdict | why |", "|---|---|---|---|"]
        lines += [f"| {cell(r.name)} | {cell(r.value)} | {r.verdict} | {cell(r.explanation)} |" for r in self.rows]
        lines += [f"\n{n}" for n in self.notes]
        return "\n".join(lines)


def _lr_row(config: PPOConfig, base_batch: int, base_lr: float) -> CheckRow | None:
    try:
        from course_lib.scaling.lr_rules import scaled_lr
    except ImportError:
        return None
    batch = config.minibatch_size
    linear = scaled_lr(base_lr, base_batch, batch, "linear")
    sqrt = scaled_lr(base_lr, base_batch, batch, "sqrt")
    lo, hi = min(linear, sqrt), max(linear, sqrt)
    within = lo * (1 - 1e-6) <= config.lr <= hi * (1 + 1e-6)
    k = batch / base_batch
    value = f"B = {batch} vs B0 = {base_batch} (k = {k:g}): linear {linear:.3g}, sqrt {sqrt:.3g}; config.lr = {config.lr:.3g}"
    if k == 1:
        why = "the global minibatch is the one the rate was tuned at: no scaling needed"
    elif within:
        why = "config.lr lies between the sqrt (Adam's usual) and linear (SGD, with warm-up) suggestions"
    else:
        why = (
            f"config.lr is outside [{lo:.3g}, {hi:.3g}]: a {k:g}x batch takes {k:g}x fewer steps for the same "
            "samples; scale the rate (sqrt for Adam, linear for SGD with warm-up) or tune it again"
        )
    return CheckRow(CHECKS[0], value, "ok" if k == 1 or within else "warn", why)


@functools.cache
def _allreduce_chain(mesh: Mesh, n_elements: int, steps: int) -> Any:
    """A compiled program of ``steps`` dependent ``pmean``\\ s of a ``[n_elements]`` float32 vector per device."""
    axis = str(mesh.axis_names[0])

    def body(x: jax.Array) -> jax.Array:
        out, _ = jax.lax.scan(lambda c, _: (jax.lax.pmean(c, axis), None), x, None, length=steps)
        return out

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(axis), out_specs=P(axis), check_vma=False))
    spec = jax.ShapeDtypeStruct((mesh.size * n_elements,), jnp.float32, sharding=NamedSharding(mesh, P(axis)))
    return check_multidevice_safe(program, spec)


def allreduce_chain_seconds(mesh: Mesh, n_elements: int, steps: int, repeats: int = 3) -> float:
    """Median wall time of ``steps`` dependent all-reduces (``pmean``) of ``n_elements`` float32 per
    device, in one compiled program on ``mesh`` (1-D), every call blocked. Run it under a watchdog."""
    if len(mesh.axis_names) != 1:
        raise ValueError(f"need a 1-D mesh (course_lib.scaling.devices.data_mesh), got axes {mesh.axis_names}")
    if n_elements < 1 or steps < 1 or repeats < 1:
        raise ValueError(f"n_elements, steps and repeats must be >= 1, got {n_elements}, {steps}, {repeats}")
    program = _allreduce_chain(mesh, n_elements, steps)
    x = jax.device_put(jnp.ones(mesh.size * n_elements, jnp.float32), NamedSharding(mesh, P(mesh.axis_names[0])))
    jax.block_until_ready(program(x))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(program(x))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


#: The three runs of :func:`dp_speedup`.
SPEEDUP_RUNS: tuple[str, ...] = ("1 device", "2 devices", "2 halves, no communication")


@dataclass
class Speedup:
    """Wall times (seconds, every run blocked) of :func:`dp_speedup`'s three runs of one config."""

    config: PPOConfig
    times: dict[str, list[float]]
    cpu_per_wall: dict[str, list[float]]
    max_abs_diff: float

    def median(self, run: str) -> float:
        return statistics.median(self.times[run])

    def steps_per_s(self, run: str) -> float:
        """Env steps per second of the whole run (rollout and learning), from the median time."""
        return self.config.steps_per_run / self.median(run)

    @property
    def speedup(self) -> float:
        """1-device time / 2-device time (medians)."""
        return self.median(SPEEDUP_RUNS[0]) / self.median(SPEEDUP_RUNS[1])

    @property
    def ceiling(self) -> float:
        """1-device time / the two halves' time: the most 2 devices give without communication."""
        return self.median(SPEEDUP_RUNS[0]) / self.median(SPEEDUP_RUNS[2])


def two_halves(config: PPOConfig, flat0: jax.Array, keys0: jax.Array, key: jax.Array) -> Callable[[], list[Any]]:
    """The ceiling run of :func:`dp_speedup`, compiled: a call that dispatches the 1-device
    program on the first half of the environments to device 0 and on the second half to
    device 1, then returns both results without waiting (JAX dispatch is asynchronous, so
    the two run at the same time; block on the returned list). Two single-device programs
    that share the CPU's cores and nothing else: no collective, no rendezvous.
    """
    if jax.device_count() < 2:
        raise ValueError(f"two_halves needs 2 devices, JAX has {jax.device_count()}: call use_cpu_devices(2) first")
    if config.num_envs % 2:
        raise ValueError(f"num_envs = {config.num_envs} must be even to split over 2 devices")
    half = replace(config, num_envs=config.num_envs // 2, total_timesteps=config.total_timesteps // 2)
    halves = []
    for i, device in enumerate(jax.devices()[:2]):
        mesh = data_mesh(1, devices=[device])
        share = keys0[i * half.num_envs : (i + 1) * half.num_envs]
        args = (*shard_inputs(mesh, flat0, share), jax.device_put(key, NamedSharding(mesh, P())))
        halves.append(functools.partial(compiled_dp_train(half, mesh), *args))
    return lambda: [h() for h in halves]  # both dispatched before either is waited for


def dp_speedup(config: PPOConfig, repeats: int = 5, seed: int = 0) -> Speedup:
    """Data-parallel PPO on 1 vs 2 devices, and the ceiling: three runs, timed interleaved.

    - ``"1 device"``: the whole global batch on device 0 (XLA may still spread one
      device's large operations over several cores);
    - ``"2 devices"``: the same run data-parallel on a 2-device mesh (same answer up to
      summation order: ``max_abs_diff``);
    - ``"2 halves, no communication"``: the 1-device program on *half* the environments,
      dispatched on device 0 and on device 1 before either is waited for (JAX dispatch is
      asynchronous), so the two run at the same time. That is the 2-device run's work
      without its all-reduces -- not a correct training run, but the most the hardware can
      give it: ``ceiling = t_1 / t_halves``. The gap between ``speedup`` and ``ceiling`` is
      what synchronising the devices costs.

    Compilation and a warm-up call of each are excluded; then the three are timed in
    turn, ``repeats`` times. Needs 2 devices; run it under a watchdog.
    """
    if jax.device_count() < 2:
        raise ValueError(f"dp_speedup needs 2 devices, JAX has {jax.device_count()}: call use_cpu_devices(2) first")
    if config.num_envs % 2:
        raise ValueError(f"num_envs = {config.num_envs} must be even to split over 2 devices")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    key = jax.random.key(seed)
    k_init, k_envs = jax.random.split(key)
    flat0, keys0 = init_flat_params(k_init, config), env_keys(k_envs, config.num_envs)
    calls: dict[str, Callable[[], Any]] = {}
    finals = []
    for n, name in ((1, SPEEDUP_RUNS[0]), (2, SPEEDUP_RUNS[1])):
        mesh = data_mesh(n)
        compiled = compiled_dp_train(config, mesh)
        args = (*shard_inputs(mesh, flat0, keys0), jax.device_put(key, NamedSharding(mesh, P())))
        calls[name] = functools.partial(compiled, *args)
        finals.append(np.asarray(jax.block_until_ready(calls[name]())[0]))  # warm-up
    calls[SPEEDUP_RUNS[2]] = two_halves(config, flat0, keys0, key)
    jax.block_until_ready(calls[SPEEDUP_RUNS[2]]())
    times: dict[str, list[float]] = {r: [] for r in SPEEDUP_RUNS}
    cpu: dict[str, list[float]] = {r: [] for r in SPEEDUP_RUNS}
    for _ in range(repeats):
        for run in SPEEDUP_RUNS:
            t0, c0 = time.perf_counter(), time.process_time()
            jax.block_until_ready(calls[run]())
            times[run].append(time.perf_counter() - t0)
            cpu[run].append((time.process_time() - c0) / times[run][-1])
    return Speedup(config, times, cpu, float(np.max(np.abs(finals[0] - finals[1]))))


def _memory(compiled: Any) -> dict[str, int]:
    m = compiled.memory_analysis()
    out = {
        "argument_bytes": int(m.argument_size_in_bytes),
        "output_bytes": int(m.output_size_in_bytes),
        "temp_bytes": int(m.temp_size_in_bytes),
    }
    out["total_bytes"] = sum(out.values())
    return out


def _kib(b: int) -> str:
    return f"{b / 1024:.0f} KiB"


def scaling_checklist(
    config: PPOConfig,
    n_devices: int = 2,
    seed: int = 0,
    *,
    sync: Sync = "pmean",
    base_batch: int | None = None,
    base_lr: float | None = None,
    tolerance: float = 1e-5,
    repeats: int = 3,
    overhead_warn: float = 0.2,
    watchdog_s: float = 300.0,
) -> ScalingReport:
    """Measure the five checks (module docstring) for data-parallel PPO on 1 vs ``n_devices`` devices.

    Args:
        config: the run (``num_envs`` global, divisible by ``n_devices``).
        n_devices: devices of the multi-device side (the first ``n_devices`` of ``jax.devices()``).
        seed: the runs' seed.
        sync: :func:`course_lib.scaling.ppo_dp.make_dp_train`'s gradient sync (``"trap"`` shows check (b) failing).
        base_batch, base_lr: the minibatch and rate the rate was tuned at (default: this
            config's global minibatch and ``config.lr``, i.e. nothing to scale).
        tolerance: largest ``max |theta_1 - theta_N|`` called equal.
        repeats: timed repeats of the run and of the all-reduce chain (interleaved; medians).
        overhead_warn: communication share of the run above which (c) warns.
        watchdog_s: the limit of the watchdog around all the multi-device work.

    Returns a :class:`ScalingReport` (``.table()`` prints it). Raises ``ValueError`` for a
    device count JAX does not have or a config that does not split over it.
    """
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or not 2 <= n_devices <= jax.device_count():
        raise ValueError(
            f"n_devices must be an int in 2..{jax.device_count()} (JAX's devices), got {n_devices!r}: "
            "ask for more with course_lib.scaling.devices.use_cpu_devices(n) before JAX starts"
        )
    if config.num_envs % n_devices:
        raise ValueError(f"num_envs = {config.num_envs} does not split over {n_devices} devices: use a multiple")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    base_batch = config.minibatch_size if base_batch is None else base_batch
    base_lr = config.lr if base_lr is None else base_lr
    load_before = os.getloadavg()
    mesh_1, mesh_n = data_mesh(1), data_mesh(n_devices)
    rows: list[CheckRow] = []
    notes: list[str] = []
    measured: dict[str, Any] = {}

    lr_row = _lr_row(config, base_batch, base_lr)
    if lr_row is None:
        notes.append("(a) lr scaling skipped: course_lib.scaling.lr_rules is not available in this checkout.")
    else:
        rows.append(lr_row)

    with watchdog(watchdog_s, f"scaling checklist: data-parallel PPO on 1 and {n_devices} CPU devices"):
        # (b) 1 vs N devices, and (e) the same N-device run twice
        params_1, _ = run_dp(config, mesh_1, seed=seed, sync=sync)
        params_n, _ = run_dp(config, mesh_n, seed=seed, sync=sync)
        params_n2, _ = run_dp(config, mesh_n, seed=seed, sync=sync)
        diff = float(np.max(np.abs(params_n - params_1)))
        measured["max_abs_diff"] = diff
        rows.append(
            CheckRow(
                CHECKS[1],
                f"max |theta_1 - theta_{n_devices}| = {diff:.1e} (tolerance {tolerance:g})",
                "ok" if diff <= tolerance else "warn",
                "the same seed and global batch give the same parameters up to summation order"
                if diff <= tolerance
                else "the runs disagree beyond summation order: is the gradient averaged once "
                "(check_vma trap: N x the gradient), is the randomness per env, are the minibatches the same?",
            )
        )

        # (c) communication: S all-reduces of a gradient-sized vector vs the run
        n_params = int(params_1.size)
        grad_steps = config.num_updates * config.update_epochs * config.num_minibatches
        key = jax.random.key(seed)
        k_init, k_envs = jax.random.split(key)
        flat, keys = shard_inputs(mesh_n, init_flat_params(k_init, config), env_keys(k_envs, config.num_envs))
        placed_key = jax.device_put(key, NamedSharding(mesh_n, P()))
        train_n = compiled_dp_train(config, mesh_n, "data", sync)
        jax.block_until_ready(train_n(flat, keys, placed_key))
        allreduce_chain_seconds(mesh_n, n_params, grad_steps, repeats=1)  # compile and warm up
        run_s, comm_s = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(train_n(flat, keys, placed_key))
            run_s.append(time.perf_counter() - t0)
            comm_s.append(allreduce_chain_seconds(mesh_n, n_params, grad_steps, repeats=1))
    t_run, t_comm = statistics.median(run_s), statistics.median(comm_s)
    overhead = t_comm / t_run
    measured.update(run_s=t_run, comm_s=t_comm, overhead=overhead, grad_steps=grad_steps, n_params=n_params)
    rows.append(
        CheckRow(
            CHECKS[2],
            f"{grad_steps} all-reduces of {n_params} f32 ({_kib(4 * n_params)}): {1e3 * t_comm:.1f} ms "
            f"= {100 * overhead:.0f}% of the run's {1e3 * t_run:.1f} ms",
            "ok" if overhead < overhead_warn else "warn",
            f"measured as one compiled chain of {grad_steps} dependent pmeans (per-call dispatch excluded), medians "
            f"of {repeats} interleaved repeats; "
            + (
                "compute dominates"
                if overhead < overhead_warn
                else f"above {100 * overhead_warn:.0f}%: more compute per all-reduce (larger per-device batch, fewer "
                "minibatches) or overlap the all-reduce with the backward pass"
            ),
        )
    )

    # (d) memory per device, from the compiled programs
    mem_1 = _memory(compiled_dp_train(config, mesh_1, "data", sync))
    mem_n = _memory(compiled_dp_train(config, mesh_n, "data", sync))
    measured.update(memory_1=mem_1, memory_n=mem_n)
    rows.append(
        CheckRow(
            CHECKS[3],
            f"1 device: args {_kib(mem_1['argument_bytes'])}, out {_kib(mem_1['output_bytes'])}, temp "
            f"{_kib(mem_1['temp_bytes'])}; {n_devices} devices: args {_kib(mem_n['argument_bytes'])}, out "
            f"{_kib(mem_n['output_bytes'])}, temp {_kib(mem_n['temp_bytes'])} (per device)",
            "ok" if mem_n["total_bytes"] <= mem_1["total_bytes"] else "warn",
            "parameters and optimiser state are replicated (they do not shrink; ZeRO/FSDP shard them); "
            "activations and rollouts are split, so temporaries shrink with the device count",
        )
    )

    # (e) reproducibility
    same = bool(np.array_equal(params_n, params_n2))
    measured["bitwise_equal"] = same
    rows.append(
        CheckRow(
            CHECKS[4],
            "bitwise equal" if same else f"differ by up to {float(np.max(np.abs(params_n - params_n2))):.1e}",
            "ok" if same else "warn",
            "randomness per environment (fold_in), fixed reduction order: a rerun is an exact replay"
            if same
            else "two runs with one seed differ: a nondeterministic reduction or randomness that depends on timing",
        )
    )
    load_after = os.getloadavg()
    measured.update(load_before=load_before, load_after=load_after)
    notes.append(
        f"Load average (1 min) {load_before[0]:.1f} before, {load_after[0]:.1f} after, on {os.cpu_count()} cores: "
        "timings on a shared machine drift 1.5-2x."
    )
    return ScalingReport(n_devices=n_devices, rows=rows, measured=measured, notes=notes)
