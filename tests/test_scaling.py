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

from course_lib.runtime.watchdog import watchdog
from course_lib.scaling.checklist import (
    ALLREDUCES_RUN,
    CHECKS,
    SPEEDUP_RUNS,
    CommunicationRow,
    allreduce_chain_seconds,
    ceiling_run,
    communication_row,
    device_run,
    dp_scaling,
    dp_speedup,
    n_pieces,
    scaling_checklist,
)
from course_lib.scaling.devices import data_mesh
from course_lib.scaling.ppo_dp import PPOConfig, compiled_dp_train, init_flat_params, run_dp

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
    assert comm.verdict == ("ok" if report.measured["sync_share"] < 0.2 else "warn"), report.table()
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
    assert r.fraction == pytest.approx(r.speedup / r.ceiling)
    with pytest.raises(ValueError, match="even"):
        dp_speedup(PPOConfig(num_envs=7, num_steps=32, total_timesteps=7 * 32 * 4, hidden=32))


def test_communication_row_measures_the_whole_cost_of_keeping_in_step(report):
    """The row's numbers are attributes, from the same interleaved runs as its verdict: the share
    of the ideal lost (1 - speed-up / ceiling) and, beside it, the all-reduces alone."""
    comm = report.row("communication")
    assert isinstance(comm, CommunicationRow)
    timed = report.measured["timings"]
    assert list(timed.times) == [device_run(1), device_run(2), ceiling_run(2), ALLREDUCES_RUN]
    assert all(len(t) == 2 and min(t) > 0 for t in timed.times.values())
    assert comm.speedup == pytest.approx(timed.median(device_run(1)) / timed.median(device_run(2)))
    assert comm.ceiling == pytest.approx(timed.median(device_run(1)) / timed.median(ceiling_run(2)))
    assert comm.sync_share == pytest.approx(1 - comm.speedup / comm.ceiling) == pytest.approx(timed.sync_share(2))
    assert comm.transfer_share == pytest.approx(timed.median(ALLREDUCES_RUN) / timed.median(device_run(2)))
    assert comm.threshold == 0.2 and comm.n_devices == 2
    assert f"{100 * comm.sync_share:.0f}% of the ideal lost" in comm.value
    assert f"{100 * comm.transfer_share:.0f}% of the run" in comm.value


def _row(speedup, ceiling, transfer=0.03, threshold=0.2):
    return communication_row(
        speedup,
        ceiling,
        transfer,
        n_devices=2,
        run_s=0.05,
        grad_steps=64,
        n_params=2500,
        repeats=5,
        threshold=threshold,
    )


def test_communication_row_verdict_from_faked_numbers():
    """ok below the threshold, warn at or above it, whatever the pure transfer share says."""
    quiet = _row(1.61, 1.70)  # 5% of the ideal lost
    assert quiet.verdict == "ok" and quiet.sync_share == pytest.approx(1 - 1.61 / 1.70)
    loaded = _row(1.17, 1.59, transfer=0.03)  # a quarter lost, though the transfers are 3% of the run
    assert loaded.verdict == "warn" and loaded.sync_share == pytest.approx(1 - 1.17 / 1.59)
    assert "26% of the ideal lost" in loaded.value and "3% of the run" in loaded.value
    assert "fewer rendezvous" in loaded.explanation and "fewer rendezvous" not in quiet.explanation
    assert "the rest of the loss is rendezvous" in loaded.explanation
    noisy = _row(1.61, 1.65, transfer=0.06)  # 2% lost, less than the all-reduces' own 6%
    assert "within the all-reduces' own time and the timing noise" in noisy.explanation
    assert "the rest of the loss is rendezvous" not in noisy.explanation
    assert _row(1.5, 2.0, threshold=0.25).verdict == "warn"  # exactly at the threshold (1 - 0.75 is exact)
    assert _row(1.5, 2.0, threshold=0.3).verdict == "ok"
    assert (
        _row(2.1, 2.0).verdict == "ok" and _row(2.1, 2.0).sync_share < 0
    )  # faster than the ceiling: noise, not a loss
    with pytest.raises(ValueError, match="speedup, ceiling and run_s"):
        _row(0.0, 1.5)
    with pytest.raises(ValueError, match="threshold"):
        _row(1.5, 1.6, threshold=1.5)


def test_dp_scaling_times_every_device_count_and_its_ceiling():
    """Structure, not speed: N = 1, 2, 4 and the ceiling of each N > 1, interleaved, the same training on every N."""
    calls = []
    with watchdog(300, "dp_scaling on 1, 2 and 4 devices"):
        r = dp_scaling(CONFIG, (1, 2, 4), repeats=2, seed=3, extra_runs={"marker": lambda: calls.append(1)})
    runs = [device_run(1), device_run(2), ceiling_run(2), device_run(4), ceiling_run(4), "marker"]
    assert list(r.times) == runs and r.device_counts == (1, 2, 4)
    assert len(calls) == 3  # the extra run: one warm-up, then once per round
    assert all(len(t) == 2 and min(t) > 0 for t in r.times.values())
    assert set(r.max_abs_diff) == {1, 2, 4} and r.max_abs_diff[1] == 0 and max(r.max_abs_diff.values()) < 1e-5
    for n in (2, 4):
        assert r.speedup(n) == pytest.approx(r.median(device_run(1)) / r.median(device_run(n)))
        assert r.ceiling(n) == pytest.approx(r.median(device_run(1)) / r.median(ceiling_run(n)))
        assert r.fraction(n) == pytest.approx(r.median(ceiling_run(n)) / r.median(device_run(n)))
        assert r.sync_share(n) == pytest.approx(1 - r.fraction(n))
    assert r.speedup(1) == r.ceiling(1) == r.fraction(1) == 1.0
    assert r.steps_per_s(ceiling_run(4)) == pytest.approx(CONFIG.steps_per_run / r.median(ceiling_run(4)))
    assert len(r.load_before) == len(r.load_after) == 3
    with pytest.raises(ValueError, match="include 1"):
        dp_scaling(CONFIG, (2, 4))
    with pytest.raises(ValueError, match="need 8 devices"):
        dp_scaling(CONFIG, (1, 8))
    with pytest.raises(ValueError, match="does not split evenly over \\[4\\]"):
        dp_scaling(PPOConfig(num_envs=6, num_steps=32, total_timesteps=6 * 32 * 4, hidden=32), (1, 2, 4))
    with pytest.raises(ValueError, match="rename them"):
        dp_scaling(CONFIG, (1, 2), repeats=1, extra_runs={device_run(2): lambda: None})


def test_the_devices_argument_bounds_what_is_used():
    """On a one-GPU machine lesson 05 passes CPU host devices explicitly; the checks count those."""
    with pytest.raises(ValueError, match="need 4 devices, there are 2"):
        dp_scaling(CONFIG, (1, 4), devices=jax.devices()[:2])
    with pytest.raises(ValueError, match=r"n_devices must be an int in 2\.\.2"):
        scaling_checklist(CONFIG, n_devices=4, devices=jax.devices()[:2])
    with pytest.raises(ValueError, match="3 pieces need 3 devices, there are 2"):
        n_pieces(CONFIG, 3, None, None, None, devices=jax.devices()[:2])
