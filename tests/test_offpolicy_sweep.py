"""Lesson 06's model-size x distinct-data sweep (course_lib.offpolicy.sweep) and its scenario
pool (course_lib.envs.scenarios), on the tiny point-mass env of test_offpolicy_sac."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_offpolicy_sac import PARAMS, TINY, PointMass

from course_lib.envs import scenarios
from course_lib.envs.scenarios import UNLIMITED, ScenarioPool
from course_lib.offpolicy import sac
from course_lib.offpolicy import sweep as sac_sweep
from course_lib.offpolicy.sac import q_values

pytestmark = pytest.mark.timeout(300)

POOL_ENV = ScenarioPool(PointMass, PointMass.metrics)
POOL_KEY = jax.random.key(42)


def _initial_obs(params: scenarios.PoolParams, n: int, seed: int = 0) -> np.ndarray:
    """The first observations of ``n`` resets with fresh keys."""
    keys = jax.random.split(jax.random.key(seed), n)
    obs, _ = jax.jit(jax.vmap(POOL_ENV.reset, in_axes=(0, None)))(keys, params)
    return np.asarray(obs)


def _distinct(rows: np.ndarray) -> set[tuple[float, ...]]:
    return {tuple(r) for r in np.round(rows, 6)}


# ---------------------------------------------------------------------------------------
# The scenario pool
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 4, 32])
def test_a_pool_of_k_scenarios_resets_into_exactly_k_scenarios(k):
    seen = _distinct(_initial_obs(scenarios.pool_params(PARAMS, POOL_KEY, k), 2000))
    assert len(seen) == k  # 2000 draws from 32 miss one with probability 32 (31/32)^2000 ~ 1e-26


def test_unlimited_pool_is_a_fresh_scenario_at_every_reset():
    assert len(_distinct(_initial_obs(scenarios.pool_params(PARAMS, POOL_KEY, UNLIMITED), 2000))) == 2000


def test_pools_are_nested_and_held_out_scenarios_are_in_none():
    small = _distinct(_initial_obs(scenarios.pool_params(PARAMS, POOL_KEY, 4), 500))
    large = _distinct(_initial_obs(scenarios.pool_params(PARAMS, POOL_KEY, 64), 4000))
    assert small <= large and len(large) == 64  # scenario i is the same for every K
    held = _distinct(_initial_obs(scenarios.held_out_params(PARAMS, POOL_KEY), 2000, seed=1))
    assert len(held) == 2000 and not held & large
    # by construction: held-out indices start where training indices end
    assert scenarios.HELD_OUT_FIRST == UNLIMITED and scenarios.HELD_OUT_FIRST + UNLIMITED - 1 == 2**31 - 1


def test_auto_resets_during_training_draw_from_the_pool():
    """Step 64 envs with random actions for 200 steps: every episode that starts after an
    auto-reset starts in one of the K scenarios."""
    params = scenarios.pool_params(PARAMS, POOL_KEY, 3)
    pool = _distinct(_initial_obs(params, 500))
    step = jax.jit(jax.vmap(POOL_ENV.step, in_axes=(0, 0, 0, None)))
    obs, state = jax.vmap(POOL_ENV.reset, in_axes=(0, None))(jax.random.split(jax.random.key(1), 64), params)
    starts = []
    for t in range(200):
        k_act, k_env = jax.random.split(jax.random.key(100 + t))
        action = jax.random.uniform(k_act, (64, 2), minval=-1.0, maxval=1.0)
        obs, state, _, term, trunc, info = step(jax.random.split(k_env, 64), state, action, params)
        starts.append(np.asarray(obs)[np.asarray(term | trunc)])
        assert set(info) >= {"final_obs", "collision", "offroad", "progress_ratio"}
    started = np.concatenate(starts)
    assert len(started) > 100 and _distinct(started) <= pool


def test_pool_sizes_out_of_range_are_refused():
    for k in (0, -3, UNLIMITED + 1):
        with pytest.raises(ValueError, match=r"1 <= K <= UNLIMITED.*scenarios.UNLIMITED"):
            scenarios.pool_params(PARAMS, POOL_KEY, k)


# ---------------------------------------------------------------------------------------
# A narrow network inside a wide one (moved from test_offpolicy_sac)
# ---------------------------------------------------------------------------------------


def test_a_padded_narrow_network_trains_exactly_like_the_narrow_one():
    narrow_cfg, wide = dataclasses.replace(TINY, width=8), 32
    opt_n, opt_w = sac.make_optimizers(narrow_cfg), sac.make_optimizers(dataclasses.replace(TINY, width=wide))
    narrow = sac.init_learner(jax.random.key(0), narrow_cfg, 6, 2, opt_n)
    padded = sac_sweep.pad_learner(narrow, wide, opt_w)
    update_n = jax.jit(lambda lr, b, k: sac.sac_update(lr, b, jnp.ones(64), k, narrow_cfg, opt_n))
    update_w = jax.jit(lambda lr, b, k: sac.sac_update(lr, b, jnp.ones(64), k, narrow_cfg, opt_w))
    rng = np.random.default_rng(0)
    for i in range(5):
        obs, nxt = (jnp.asarray(rng.normal(size=(64, 6)), jnp.float32) for _ in range(2))
        action = jnp.asarray(rng.uniform(-1, 1, size=(64, 2)), jnp.float32)
        batch = sac.Transition(obs, action, jnp.asarray(rng.normal(size=64), jnp.float32), jnp.zeros(64, bool), nxt)
        narrow, _, m_n = update_n(narrow, batch, jax.random.key(i))
        padded, _, m_w = update_w(padded, batch, jax.random.key(i))
        np.testing.assert_allclose(m_n["losses/critic"], m_w["losses/critic"], rtol=1e-4)
    np.testing.assert_allclose(
        q_values(narrow.critics, obs, action), q_values(padded.critics, obs, action), rtol=1e-4, atol=1e-5
    )
    np.testing.assert_allclose(padded.actor[1]["w"][:8, :8], narrow.actor[1]["w"], rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(padded.actor[1]["w"][8:], 0.0)  # the extra units never move
    np.testing.assert_array_equal(padded.critics[0]["w"][:, :, 8:], 0.0)
    np.testing.assert_array_equal(padded.targets[2]["w"][:, 8:], 0.0)


# ---------------------------------------------------------------------------------------
# The grid: bad input, fixed budgets, one run of the whole sweep
# ---------------------------------------------------------------------------------------

#: Two chunks of 800 env steps per run: 136 updates after the 64-step warm-up.
SMALL = sac_sweep.SweepConfig(
    widths=(8, 32),
    pool_sizes=(2, UNLIMITED),
    num_seeds=2,
    num_episodes=64,
    sac=dataclasses.replace(TINY, total_env_steps=1600),
)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"sac": dataclasses.replace(TINY, total_env_steps=1000)}, r"not a multiple of a chunk's 800.*e\.g\. 800"),
        ({"widths": (32, 8)}, r"widths must be positive and strictly increasing, e\.g\."),
        ({"widths": (8, 8)}, r"strictly increasing"),
        ({"pool_sizes": (32, 4)}, r"pool_sizes must be strictly increasing, e\.g\."),
        ({"pool_sizes": (0, 4)}, r"1 <= K <= UNLIMITED .*got K = 0"),
        ({"pool_sizes": (2**21,)}, r"at most SEED_STRIDE.*use scenarios\.UNLIMITED"),
        ({"num_seeds": 1}, r"num_seeds must be 2 \.\. 1024 \(a standard error needs 2\)"),
        ({"num_episodes": 0}, r"num_episodes must be >= 1"),
        ({"runs": "pmap"}, r"runs must be one of \('auto', 'vmap', 'threads'\)"),
    ],
)
def test_bad_grids_are_refused_saying_what_to_change(change, message):
    with pytest.raises(ValueError, match=message):
        sac_sweep.check_sweep(dataclasses.replace(SMALL, **change))


def test_the_shipped_grids_are_valid():
    for grid in (sac_sweep.CPU_SWEEP, sac_sweep.FULL_SWEEP, SMALL):
        sac_sweep.check_sweep(grid)
    assert sac_sweep.CPU_SWEEP.pool_sizes[-1] == sac_sweep.FULL_SWEEP.pool_sizes[-1] == UNLIMITED


def test_the_full_grid_is_24_vmapped_runs_of_one_budget_with_k_1_allowed():
    full = sac_sweep.FULL_SWEEP
    run = full.run_config
    assert full.num_runs == 24 and full.runs == "vmap" and sac_sweep.resolve_runs(full) == "vmap"
    assert full.widths == (32, 256) and full.pool_sizes == (1, 8, 64, UNLIMITED) and full.num_seeds == 3
    assert (
        run.width == 256
        and not run.prioritized
        and (run.num_envs, run.batch_size, run.updates_per_step)
        == (
            256,
            256,
            4,
        )
    )
    # equal budgets: one SACConfig for every cell, whole chunks, no steps lost
    assert run.steps_per_chunk_env == 128_000 and run.num_chunks == 32
    assert run.env_steps_per_run == run.total_env_steps == 4_096_000
    assert run.updates_per_run == (32 * 500 - 65_536 // 256) * 4 == 62_976
    assert full.num_episodes == 1024 and full.pool_eval
    # replay of every run together fits a GPU with room to spare (64 obs floats twice, 2 actions, reward, done)
    assert full.num_runs * run.buffer_capacity * (2 * 64 * 4 + 2 * 4 + 4 + 1) < 4e9
    sac_sweep.check_sweep(dataclasses.replace(SMALL, pool_sizes=(1,)))  # one scenario, memorised: legitimate


def test_auto_runs_as_threads_on_a_cpu_and_vmapped_elsewhere():
    assert sac_sweep.CPU_SWEEP.runs == "auto"
    expected = "threads" if jax.default_backend() == "cpu" else "vmap"
    assert sac_sweep.resolve_runs(sac_sweep.CPU_SWEEP) == expected
    assert sac_sweep.resolve_runs(dataclasses.replace(SMALL, runs="threads")) == "threads"


def test_run_grid_pairs_seeds_and_keeps_seed_pools_apart():
    grid = sac_sweep.run_grid(SMALL, jax.random.key(0), PARAMS)
    r = SMALL.num_runs
    assert grid.keys.shape == (r,) and grid.train.size.shape == (r,)
    data = np.asarray(jax.random.key_data(grid.keys)).reshape(2, 2, 2, -1)  # [W, K, S, 2]
    assert (data == data[:1, :1]).all()  # seed j's key at every width and pool size
    assert not (data[0, 0, 0] == data[0, 0, 1]).all()
    np.testing.assert_array_equal(np.asarray(grid.train.size).reshape(2, 2, 2)[0], [[2, 2], [UNLIMITED] * 2])
    np.testing.assert_array_equal(np.asarray(grid.train.first).reshape(2, 2, 2)[0, 0], [0, sac_sweep.SEED_STRIDE])
    assert (np.asarray(grid.held_out.first) == scenarios.HELD_OUT_FIRST).all()


@pytest.fixture(scope="module")
def small_result() -> sac_sweep.SweepResult:
    return sac_sweep.scaling_sweep(
        SMALL, jax.random.key(0), progress=False, env=PointMass, env_params=PARAMS, info_fn=PointMass.metrics
    )


def test_every_cell_takes_the_same_env_steps_and_updates(small_result):
    run = SMALL.run_config
    assert small_result.env_steps.shape == small_result.updates.shape == (2, 2, 2)
    assert (small_result.env_steps == run.env_steps_per_run).all() and run.env_steps_per_run == 1600
    assert (small_result.updates == run.updates_per_run).all() and run.updates_per_run == 136


def test_the_sweep_evaluates_every_cell_held_out_and_on_its_pool(small_result):
    for rates in (small_result.held_out, small_result.train_pool):
        assert rates is not None and rates.accuracy.shape == (2, 2, 2)
        assert ((rates.accuracy >= 0) & (rates.accuracy <= 1)).all()
        assert (rates.accuracy + rates.collision_rate + rates.offroad_rate <= 1.0 + 1e-6).all()
    assert set(small_result.seconds) == {"setup", "train", "evaluate", "total"}
    table = sac_sweep.sweep_table(small_result)
    assert "1,600 env steps and 136 updates per run" in table and "K=inf" in table and "K=2" in table
    assert table.count(" +- ") == 4 * 2 * 2 + 1  # 4 blocks of 2 widths x 2 pool sizes, and the header


def test_one_vmapped_program_serves_runs_with_different_pool_sizes():
    """The accelerator's path: two runs with K = 1 and K = unlimited as rows of one program
    (the pool is data); both take the same budget, and only the K = 1 run's envs restart
    in one scenario."""
    run = dataclasses.replace(TINY, total_env_steps=800, learning_starts=512)
    init, chunk = sac_sweep.sweep_programs(run, POOL_ENV, vmapped=True)
    sizes = jnp.array([1, UNLIMITED], jnp.int32)
    params = scenarios.PoolParams(
        jax.tree.map(lambda x: jnp.stack([jnp.asarray(x)] * 2), PARAMS),
        jnp.stack([POOL_KEY] * 2),
        jnp.zeros(2, jnp.int32),
        sizes,
    )
    state = init(jnp.stack([jax.random.key(0)] * 2), params)
    start = np.asarray(state.env.obs)  # [2, num_envs, 6]
    assert len(_distinct(start[0])) == 1 and len(_distinct(start[1])) == run.num_envs
    state, _ = chunk(state, params)
    taken = np.asarray(jax.vmap(sac_sweep.budget_taken)(state))
    np.testing.assert_array_equal(taken, [[800, 100 - 64]] * 2)


# ---------------------------------------------------------------------------------------
# What a result shows: computed, not assumed
# ---------------------------------------------------------------------------------------


def _fake(acc: np.ndarray, pool_acc: np.ndarray | None = None) -> sac_sweep.SweepResult:
    def rates(a: np.ndarray) -> sac_sweep.CellRates:
        return sac_sweep.CellRates(a, 1 - a, 0 * a, a, a)

    ones = np.ones(acc.shape, int)
    return sac_sweep.SweepResult(
        (16, 64), (4, UNLIMITED), ones, ones, rates(acc), None if pool_acc is None else rates(pool_acc), {}
    )


def test_findings_detect_a_crossover_and_the_diversity_effect():
    noise = np.array([0.01, -0.01, 0.0])
    acc = np.empty((2, 2, 3))
    acc[0, 0], acc[1, 0] = 0.5 + noise, 0.3 + noise  # little data: the narrow net ahead
    acc[0, 1], acc[1, 1] = 0.7 + noise, 0.9 - noise  # unlimited: the wide net ahead
    found = sac_sweep.sweep_findings(_fake(acc, pool_acc=np.ones_like(acc)))
    np.testing.assert_allclose(found.diversity_gain, [0.2, 0.6])
    np.testing.assert_allclose(found.width_gap, [-0.2, 0.2])
    assert found.width_order == ("narrow", "wide") and found.crossover and found.diversity_separates
    np.testing.assert_allclose(found.memorisation_gap, 1 - acc.mean(-1))
    assert "a crossover" in found.verdict() and "+0.20 +- 0.00" in found.summary()


def test_findings_call_noise_a_tie():
    acc = np.array([[[0.2, 0.8, 0.5], [0.5, 0.3, 0.7]], [[0.6, 0.1, 0.5], [0.4, 0.9, 0.3]]])
    found = sac_sweep.sweep_findings(_fake(acc))
    assert found.width_order == ("tie", "tie") and not found.crossover and not found.diversity_separates
    assert np.isnan(found.memorisation_gap).all()
    assert "does not separate from seed noise" in found.verdict() and "no crossover" in found.verdict()


# ---------------------------------------------------------------------------------------
# The accelerator's path, and a recorded result: save, load, the command line
# ---------------------------------------------------------------------------------------


def test_the_vmapped_sweep_takes_its_budget_and_evaluates_in_one_program(capsys):
    """``runs="vmap"`` on the CPU, end to end: 2 runs (K = 1, the smallest legitimate pool)
    stacked, the same programs as the vmapped test above (compiled once), one evaluation
    call for held-out and pool rows."""
    grid = dataclasses.replace(SMALL, widths=(32,), pool_sizes=(1,), runs="vmap")
    result = sac_sweep.scaling_sweep(
        grid, jax.random.key(0), progress=True, env=PointMass, env_params=PARAMS, info_fn=PointMass.metrics
    )
    assert "sweep chunks" in capsys.readouterr().err  # the bar ticked (text mode, stderr)
    assert (result.env_steps == 1600).all() and (result.updates == 136).all() and result.updates.shape == (1, 1, 2)
    assert result.train_pool is not None and result.held_out.accuracy.shape == (1, 1, 2)
    assert set(result.seconds) == {"setup", "train", "evaluate", "total"}


def test_evaluate_runs_gives_each_row_its_own_key_and_params():
    """Rows with the same actor, key and params agree; the vmapped evaluation of a row
    equals the one-run evaluation (the threads' path) of the same actor, key and params."""
    cfg = dataclasses.replace(TINY, width=8)
    actor = sac.init_learner(jax.random.key(3), cfg, 6, 2, sac.make_optimizers(cfg)).actor
    held = scenarios.held_out_params(PARAMS, POOL_KEY)
    train = scenarios.pool_params(PARAMS, POOL_KEY, 2)
    stack = lambda *ts: jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *ts)  # noqa: E731
    k1, k2 = jax.random.key(1), jax.random.key(2)
    actors = stack(actor, actor, actor)
    out = sac_sweep.evaluate_runs(actors, jnp.stack([k1, k1, k2]), stack(held, held, train), 32, POOL_ENV)
    one = sac_sweep._evaluate_one(jax.tree.map(lambda x: x[None], actor), k2, train, 32, POOL_ENV)
    np.testing.assert_array_equal(out.accuracy[0], out.accuracy[1])
    np.testing.assert_allclose(np.asarray(out.episode_return[2]), np.asarray(one.episode_return[0]), rtol=1e-5)


def test_a_result_saved_and_loaded_is_the_same_to_the_bit(small_result, tmp_path):
    meta = sac_sweep.run_meta(SMALL, 0, "pytest", note="tiny")
    path = sac_sweep.save_result(small_result, tmp_path / "sub" / "sweep.json", meta)
    loaded, meta_back = sac_sweep.load_result(path)
    assert loaded.widths == small_result.widths and loaded.pool_sizes == small_result.pool_sizes
    for a, b in [
        (loaded.env_steps, small_result.env_steps),
        (loaded.updates, small_result.updates),
        *zip(loaded.held_out, small_result.held_out),
        *zip(loaded.train_pool, small_result.train_pool),
    ]:
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    assert loaded.seconds == small_result.seconds
    assert meta_back == json.loads(json.dumps(meta)) and meta_back["note"] == "tiny"
    assert sac_sweep.sweep_config_from_dict(meta_back["sweep"]) == SMALL
    assert set(meta_back) >= {"seed", "devices", "jax_version", "date_utc", "command", "runs", "backend"}
    assert sac_sweep.sweep_table(loaded) == sac_sweep.sweep_table(small_result)
    assert sac_sweep.sweep_findings(loaded).summary() == sac_sweep.sweep_findings(small_result).summary()


def test_a_result_without_its_training_pool_round_trips(tmp_path):
    acc = np.random.default_rng(0).uniform(size=(2, 2, 3)).astype(np.float32)
    fake = _fake(acc)._replace(seconds={"total": 1.25})
    loaded, _ = sac_sweep.load_result(sac_sweep.save_result(fake, tmp_path / "s.json", {}))
    assert loaded.train_pool is None and loaded.held_out.accuracy.dtype == np.float32
    np.testing.assert_array_equal(loaded.held_out.accuracy, acc)


def test_loading_a_missing_file_or_another_format_says_what_to_do(small_result, tmp_path):
    with pytest.raises(
        FileNotFoundError, match=r"no recorded sweep result at .*python -m course_lib\.offpolicy\.sweep"
    ):
        sac_sweep.load_result(tmp_path / "absent.json")
    path = sac_sweep.save_result(small_result, tmp_path / "s.json", {})
    doc = json.loads(path.read_text())
    doc["format"] = 2
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"format 2, this course_lib reads format 1"):
        sac_sweep.load_result(path)
    path.write_text(json.dumps({"something": "else"}))
    with pytest.raises(ValueError, match=r"not a sweep result file"):
        sac_sweep.load_result(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"not a sweep result file \(not JSON"):
        sac_sweep.load_result(path)


def test_the_command_line_parses_its_arguments():
    args = sac_sweep.parse_args(["--scale", "full", "--seed", "11", "--out", "x.json"])
    assert (args.scale, args.seed, args.out, args.no_progress) == ("full", 11, "x.json", False)
    assert sac_sweep.SCALES["full"] is sac_sweep.FULL_SWEEP and sac_sweep.SCALES["cpu"] is sac_sweep.CPU_SWEEP
    with pytest.raises(SystemExit):
        sac_sweep.parse_args(["--scale", "huge", "--out", "x.json"])


def test_python_m_help_runs_without_notebook_packages():
    """``python -m course_lib.offpolicy.sweep --help`` in a fresh interpreter, with
    matplotlib, IPython and tqdm made unimportable: the command line needs none of them."""
    root = Path(__file__).resolve().parents[1]
    block = (
        "import sys, runpy\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('matplotlib', 'IPython', 'ipywidgets', 'tqdm'):\n"
        "            raise ImportError(f'blocked {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "sys.argv = ['sweep', '--help']\n"
        "runpy.run_module('course_lib.offpolicy.sweep', run_name='__main__', alter_sys=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", block], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--scale {cpu,full}" in out.stdout and "--out OUT" in out.stdout and "--seed SEED" in out.stdout


def test_record_prints_the_table_and_saves_what_load_reads(tmp_path, capsys):
    """What ``main`` does after parsing, on the tiny env, its progress bar on stderr."""
    out = tmp_path / "rec.json"
    result = sac_sweep.record(
        SMALL, 0, out, "pytest record", progress=True, env=PointMass, env_params=PARAMS, info_fn=PointMass.metrics
    )
    captured = capsys.readouterr()
    printed = captured.out
    assert "sweep chunks" in captured.err
    assert "8 runs (threads)" in printed or "8 runs (vmap)" in printed
    assert "held-out accuracy" in printed and "width 8: held-out accuracy K=inf minus K=2" in printed
    assert "seconds: setup" in printed and f"saved {out}" in printed
    loaded, meta = sac_sweep.load_result(out)
    np.testing.assert_array_equal(loaded.held_out.accuracy, result.held_out.accuracy)
    assert meta["command"] == "pytest record" and meta["seed"] == 0 and meta["num_runs"] == 8


def test_the_plain_progress_lines_count_chunks(capsys):
    with sac_sweep._PrintBar(3, "sweep chunks") as bar:
        for _ in range(3):
            bar.update(1)
    err = capsys.readouterr().err
    assert "sweep chunks: 1/3" in err and "sweep chunks: 3/3" in err
