"""The executable scaling checklist (lesson 05): each row measures what it says, and catches what it should.

The config is tests/test_ppo_dp.py's, so the compiled PPO programs (cached per config and
mesh) are shared when both files run in one session. Every multi-device run is under the
watchdog (scaling_checklist has its own; the oracles here have theirs).
"""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from course_lib.scaling.devices import data_mesh
from course_lib.scaling.ppo_dp import PPOConfig, compiled_dp_train, init_flat_params, run_dp
from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.checklist import CHECKS, SPEEDUP_RUNS, allreduce_chain_seconds, dp_speedup, scaling_checklist

CONFIG = PPOConfig(num_envs=8, num_steps=32, total_timesteps=8 * 32 * 4, hidden=32)
HAS_LR_SCALING = True
try:
    import course_lib.scaling.lr_rules  # noqa: F401
except ImportError:  # pragma: no cover - another helper's module
    HAS_LR_SCALING = False


@pytest.fixture(scope="module")
def report():
    return scaling_checklist(CONFIG, n_devices=2, seed=3, repeats=2)


def test_every_check_is_a_row_and_the_table_prints_them(report):
    names = [r.name for r in report.rows]
    expected = [c for c in CHECKS if HAS_LR_SCALING or c != "lr scaling"]
    assert names == expected
    table = report.table().splitlines()
    assert table[0] == "| check | value | verdict | why |"
    assert len([line for line in table if line.startswith("| ")]) == 1 + len(expected)
    assert all(r.verdict in ("ok", "warn") for r in report.rows)
    # every check is ok except perhaps communication, a timing: its verdict must follow its measured share
    assert all(r.verdict == "ok" for r in report.rows if r.name != "communication"), report.table()
    comm = report.row("communication")
    assert comm.verdict == ("ok" if report.measured["overhead"] < 0.2 else "warn"), report.table()
    assert report.ok == (comm.verdict == "ok")


def test_equivalence_row_is_the_real_difference(report):
    with watchdog(120, "data-parallel PPO on 1 and 2 devices (oracle)"):
        p1, _ = run_dp(CONFIG, data_mesh(1), seed=3)
        p2, _ = run_dp(CONFIG, data_mesh(2), seed=3)
    assert report.measured["max_abs_diff"] == pytest.approx(float(np.abs(p1 - p2).max()), abs=1e-12)
    assert report.measured["max_abs_diff"] <= 1e-5
    assert report.measured["bitwise_equal"] is True


def test_equivalence_verdict_follows_the_tolerance(report):
    """The same (cached) programs judged with a tolerance below the measured difference must warn."""
    diff = report.measured["max_abs_diff"]
    strict = scaling_checklist(CONFIG, n_devices=2, seed=3, tolerance=diff / 2, repeats=1)
    assert strict.measured["max_abs_diff"] == diff  # deterministic
    assert strict.row("1 vs N devices").verdict == ("warn" if diff > 0 else "ok")
    assert strict.ok == (diff == 0)


def test_communication_and_memory_rows_use_the_program_sizes(report):
    n_params = int(init_flat_params(jax.random.key(0), CONFIG).size)
    # by hand: actor 4->32->32->2 and critic 4->32->32->1, weights and biases
    assert n_params == (4 * 32 + 32 + 32 * 32 + 32 + 32 * 2 + 2) + (4 * 32 + 32 + 32 * 32 + 32 + 32 + 1)
    assert report.measured["n_params"] == n_params
    assert report.measured["grad_steps"] == CONFIG.num_updates * CONFIG.update_epochs * CONFIG.num_minibatches == 64
    assert report.measured["comm_s"] > 0
    assert report.measured["run_s"] > 0
    assert math.isclose(report.measured["overhead"], report.measured["comm_s"] / report.measured["run_s"])
    mem_1, mem_2 = report.measured["memory_1"], report.measured["memory_n"]
    # the replicated parameters are an argument and an output on every device
    for mem in (mem_1, mem_2):
        assert mem["argument_bytes"] >= 4 * n_params and mem["output_bytes"] >= 4 * n_params
    # the rollout and activations are split over devices: fewer temporaries per device
    assert mem_2["temp_bytes"] < mem_1["temp_bytes"]
    m = compiled_dp_train(CONFIG, data_mesh(2)).memory_analysis()
    assert mem_2["temp_bytes"] == m.temp_size_in_bytes


@pytest.mark.skipif(not HAS_LR_SCALING, reason="course_lib.scaling.lr_rules is not in this checkout")
def test_lr_row_suggests_linear_and_sqrt():
    from course_lib.scaling.checklist import _lr_row

    base = CONFIG.minibatch_size // 4  # tuned on a quarter of the batch: k = 4
    row = _lr_row(CONFIG, base, 1e-3)
    assert row is not None
    assert "linear 0.004" in row.value and "sqrt 0.002" in row.value
    assert row.verdict == "warn"  # config.lr = 2.5e-4 is below both
    ok = _lr_row(PPOConfig(num_envs=8, num_steps=32, total_timesteps=8 * 32 * 4, hidden=32, lr=3e-3), base, 1e-3)
    assert ok is not None and ok.verdict == "ok"


def test_allreduce_chain_grows_with_steps():
    """Not a timing assertion on the machine's speed: 200 dependent all-reduces cannot take less than 1."""
    mesh = data_mesh(2)
    with watchdog(60, "all-reduce chain on 2 devices"):
        one = allreduce_chain_seconds(mesh, 1024, 1, repeats=3)
        many = allreduce_chain_seconds(mesh, 1024, 200, repeats=3)
    assert many > one > 0
    with pytest.raises(ValueError, match="steps"):
        allreduce_chain_seconds(mesh, 1024, 0)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="n_devices"):
        scaling_checklist(CONFIG, n_devices=1)
    with pytest.raises(ValueError, match="n_devices"):
        scaling_checklist(CONFIG, n_devices=jax.device_count() + 1)
    with pytest.raises(ValueError, match="num_envs"):
        scaling_checklist(PPOConfig(num_envs=6, num_steps=32, total_timesteps=6 * 32 * 4, hidden=32), n_devices=4)


def test_dp_speedup_times_three_runs_and_the_two_device_run_is_the_same_training():
    """Behaviour, not speed: three runs timed ``repeats`` times each, ratios from the medians, and
    the 1- and 2-device parameters equal (the same training)."""
    with watchdog(180, "dp_speedup: 1 device, 2 devices, 2 halves"):
        r = dp_speedup(CONFIG, repeats=3, seed=3)
    assert list(r.times) == list(SPEEDUP_RUNS)
    assert all(len(t) == 3 and min(t) > 0 for t in r.times.values())
    assert r.speedup == pytest.approx(r.median("1 device") / r.median("2 devices"))
    assert r.ceiling == pytest.approx(r.median("1 device") / r.median("2 halves, no communication"))
    assert r.steps_per_s("1 device") == pytest.approx(CONFIG.steps_per_run / r.median("1 device"))
    assert 0 <= r.max_abs_diff <= 1e-5  # the 2-device run is the 1-device training, split
    with pytest.raises(ValueError, match="even"):
        dp_speedup(PPOConfig(num_envs=7, num_steps=32, total_timesteps=7 * 32 * 4, hidden=32))
