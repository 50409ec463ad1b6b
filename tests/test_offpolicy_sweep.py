"""Lesson 06's model-size x distinct-data sweep (course_lib.offpolicy.sweep) and its scenario
pool (course_lib.envs.scenarios), on the tiny point-mass env of test_offpolicy_sac."""

from __future__ import annotations

import dataclasses

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
        ({"runs": "pmap"}, r"runs must be one of \('vmap', 'threads'\)"),
    ],
)
def test_bad_grids_are_refused_saying_what_to_change(change, message):
    with pytest.raises(ValueError, match=message):
        sac_sweep.check_sweep(dataclasses.replace(SMALL, **change))


def test_the_shipped_grids_are_valid():
    for grid in (sac_sweep.CPU_SWEEP, sac_sweep.FULL_SWEEP, SMALL):
        sac_sweep.check_sweep(grid)
    assert sac_sweep.CPU_SWEEP.pool_sizes[-1] == sac_sweep.FULL_SWEEP.pool_sizes[-1] == UNLIMITED


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
