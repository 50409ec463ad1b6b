"""The checkpoint-interval model of lesson 10 (eq. 10.1-10.4) and its Monte Carlo check."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from course_lib.checkpoint.interval import (
    async_blocking_cost,
    daly_interval,
    exact_waste_fraction,
    simulate_lost_work,
    sweep,
    waste_fraction,
    young_interval,
)

SETTINGS = [(1.0, 1e4, 0.0), (30.0, 86400.0, 120.0), (5.0, 3600.0, 10.0), (0.2, 600.0, 1.0)]


def test_waste_fraction_hand_values_and_shapes():
    # C = 60, M = 3600, tau = 600: 60/600 + 660/7200 + 30/3600
    assert waste_fraction(600.0, 60.0, 3600.0, 30.0) == pytest.approx(0.1 + 660 / 7200 + 30 / 3600, rel=1e-15)
    taus = np.array([[10.0, 100.0], [1000.0, 1e4]])
    out = waste_fraction(taus, 60.0, 3600.0)
    assert out.shape == (2, 2)
    assert out[0, 1] == pytest.approx(waste_fraction(100.0, 60.0, 3600.0))
    assert isinstance(waste_fraction(100.0, 60.0, 3600.0), float)


@pytest.mark.parametrize(("C", "M", "R"), SETTINGS)
def test_young_minimises_the_first_order_waste(C, M, R):
    young = young_interval(C, M)
    assert young == pytest.approx(math.sqrt(2 * C * M), rel=1e-15)
    found = minimize_scalar(
        lambda log_tau: waste_fraction(math.exp(log_tau), C, M, R), bounds=(math.log(C) - 5, math.log(M) + 5)
    )
    assert math.exp(found.x) == pytest.approx(young, rel=1e-4)
    # and the minimum value: 2 sqrt(C / 2M) + C / 2M + R / M
    assert waste_fraction(young, C, M, R) == pytest.approx(math.sqrt(2 * C / M) + C / (2 * M) + R / M, rel=1e-12)


def test_daly_tends_to_young_as_c_over_m_vanishes():
    M = 3600.0
    ratios = []
    for C in (1e-6, 1e-4, 1e-2, 1.0, 60.0):
        d, y = daly_interval(C, M), young_interval(C, M)
        assert d < y  # the "- C" outweighs the corrections
        ratios.append(abs(d / y - 1))
    assert ratios == sorted(ratios)  # closer and closer
    assert ratios[0] < 1e-4
    # hand value: C = 60, M = 3600: x = 1/120
    x = 60 / 7200
    assert daly_interval(60.0, 3600.0) == pytest.approx(
        math.sqrt(2 * 60 * 3600) * (1 + math.sqrt(x) / 3 + x / 9) - 60, rel=1e-14
    )


def test_daly_is_m_when_the_save_is_at_least_two_mtbfs():
    assert daly_interval(2.0, 1.0) == 1.0
    assert daly_interval(50.0, 7.0) == 7.0
    assert 0 < daly_interval(1.999, 1.0) < 2.0


def test_daly_beats_young_on_the_exact_mean_when_c_is_not_small():
    C, M = 600.0, 3600.0
    assert exact_waste_fraction(daly_interval(C, M), C, M) < exact_waste_fraction(young_interval(C, M), C, M)


def test_async_blocking_cost():
    gib = 2.0**30
    cost = async_blocking_cost(4 * gib, copy_bw=20 * gib, disk_bw=1 * gib, tau=60.0)
    assert cost.blocking_s == pytest.approx(0.2) and cost.write_s == pytest.approx(4.0) and cost.keeps_up
    slow = async_blocking_cost(4 * gib, copy_bw=20 * gib, disk_bw=0.05 * gib, tau=60.0)
    assert slow.write_s == pytest.approx(80.0) and not slow.keeps_up
    assert not async_blocking_cost(100.0, 1e9, 10.0, tau=10.0).keeps_up  # exactly tau: the next save waits


@pytest.mark.parametrize(
    ("fn", "args", "fragment"),
    [
        (waste_fraction, (0.0, 1.0, 10.0), "tau must be"),
        (waste_fraction, ([1.0, -2.0], 1.0, 10.0), "tau must be"),
        (waste_fraction, (1.0, 0.0, 10.0), "C must be"),
        (waste_fraction, (1.0, 1.0, -10.0), "M must be"),
        (waste_fraction, (1.0, 1.0, 10.0, -1.0), "R must be"),
        (young_interval, (float("nan"), 10.0), "C must be"),
        (daly_interval, (1.0, 0.0), "M must be"),
        (async_blocking_cost, (1e9, 0.0, 1e9, 10.0), "copy_bw must be"),
        (simulate_lost_work, (10.0, 1.0, 100.0, 0.0, 1000.0, 1), "n_runs must be"),
        (simulate_lost_work, (1e5, 1.0, 100.0), "never finish"),
    ],
)
def test_bad_inputs_name_the_argument(fn, args, fragment):
    with pytest.raises(ValueError, match=fragment):
        fn(*args)


@pytest.mark.parametrize(("C", "M", "R"), [(1.0, 1e5, 0.0), (0.5, 1e5, 20.0), (2.0, 1e6, 100.0)])
def test_simulation_agrees_with_first_order_when_c_is_small(C, M, R):
    """C / M <= 1e-5: (10.1) is within the simulation's 95% band (a few thousand failures)."""
    for tau in (young_interval(C, M), 0.3 * young_interval(C, M), 3 * young_interval(C, M)):
        sim = simulate_lost_work(tau, C, M, R, horizon=40 * M, n_runs=100, seed=7)
        assert sim.failures_per_run * 100 > 2000
        assert sim.low <= waste_fraction(tau, C, M, R) <= sim.high, (tau, sim.waste, sim.stderr)


@pytest.mark.parametrize(("C", "M", "R"), [(1.0, 1e4, 5.0), (60.0, 3600.0, 30.0), (600.0, 3600.0, 0.0)])
def test_simulation_agrees_with_the_exact_mean(C, M, R):
    tau = young_interval(C, M)
    sim = simulate_lost_work(tau, C, M, R, horizon=40 * M, n_runs=200, seed=3)
    assert abs(sim.waste - exact_waste_fraction(tau, C, M, R)) < 4 * sim.stderr


def test_simulation_departs_upwards_from_first_order_when_c_is_not_small():
    """C / M = 1/6: failures also strike the redone work and the save, so the measured waste
    is well above (10.1), by about C (tau + C) / (2 M tau) and more."""
    C, M = 600.0, 3600.0
    for tau in (young_interval(C, M), daly_interval(C, M)):
        sim = simulate_lost_work(tau, C, M, 0.0, horizon=40 * M, n_runs=200, seed=5)
        first = waste_fraction(tau, C, M)
        assert sim.low > first + C * (tau + C) / (2 * M * tau)
        assert sim.waste > 1.3 * first


def test_simulation_is_deterministic_under_a_seed():
    a = simulate_lost_work(100.0, 5.0, 2000.0, 3.0, horizon=1e5, n_runs=50, seed=11)
    b = simulate_lost_work(100.0, 5.0, 2000.0, 3.0, horizon=1e5, n_runs=50, seed=11)
    c = simulate_lost_work(100.0, 5.0, 2000.0, 3.0, horizon=1e5, n_runs=50, seed=12)
    np.testing.assert_array_equal(a.per_run, b.per_run)
    assert a == b and a != c
    assert not np.array_equal(a.per_run, c.per_run)
    assert a.low < a.waste < a.high and a.per_run.shape == (50,)


def test_no_failures_leaves_only_the_save_cost():
    sim = simulate_lost_work(100.0, 5.0, 1e12, 0.0, horizon=1000.0, n_runs=4, seed=0)
    assert sim.failures_per_run == 0 and sim.waste == pytest.approx(0.05, rel=1e-12) and sim.stderr == 0


def test_sweep_is_fast_and_shows_the_optimum():
    start = time.perf_counter()
    result = sweep(60.0, 3600.0, R=30.0, n_runs=100, seed=0)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, elapsed
    assert result.taus.shape == result.simulated.shape == result.first_order.shape == (30,)
    best = result.taus[np.argmin(result.simulated)]
    assert 0.5 * result.young < best < 2 * result.young
    assert result.daly < result.young
    # U-shaped: the ends are far worse than the middle
    assert result.simulated[0] > 2 * result.simulated.min() and result.simulated[-1] > 2 * result.simulated.min()


def test_plot_sweep_draws_labelled_axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from course_lib.checkpoint.interval import plot_sweep

    ax = plot_sweep(sweep(5.0, 600.0, taus=[10.0, 50.0, 100.0, 500.0], n_runs=20))
    assert "interval" in ax.get_xlabel() and ax.get_title()
    plt.close(ax.figure)
