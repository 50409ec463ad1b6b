"""Data-parallel PPO (lesson 05): one answer for any device count, the check_vma trap, bad input.

The test session has 4 CPU devices (conftest). Every multi-device run is under the watchdog.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from course_lib.scaling.devices import blocking_calls, data_mesh
from course_lib.scaling.ppo_dp import (
    PPOConfig,
    compiled_dp_train,
    init_flat_params,
    make_dp_train,
    run_dp,
    synced_gradient,
)
from course_lib.runtime.watchdog import watchdog

#: Small but complete: 8 envs, 4 updates of 4 epochs x 4 minibatches.
CONFIG = PPOConfig(num_envs=8, num_steps=32, total_timesteps=8 * 32 * 4, hidden=32)

#: Measured max |difference| after 5 updates at 1 vs 2 vs 4 devices: 6e-8 (float
#: summation order only); the tolerance leaves room for other CPUs' kernels.
ATOL = 1e-5


@pytest.fixture(scope="module")
def single_device_run():
    with watchdog(120, "data-parallel PPO on 1 device"):
        return run_dp(CONFIG, data_mesh(1), seed=3)


@pytest.mark.parametrize(("n_devices", "sync"), [(2, "pmean"), (4, "vma")])
def test_same_parameters_on_any_device_count(single_device_run, n_devices, sync):
    params_1, metrics_1 = single_device_run
    with watchdog(120, f"data-parallel PPO on {n_devices} devices ({sync})"):
        params_n, metrics_n = run_dp(CONFIG, data_mesh(n_devices), seed=3, sync=sync)
    np.testing.assert_allclose(params_n, params_1, rtol=0, atol=ATOL)
    # the parameters moved (the comparison is not of two untouched initialisations)
    start = np.asarray(init_flat_params(jax.random.split(jax.random.key(3))[0], CONFIG))
    assert np.abs(params_1 - start).max() > 100 * ATOL
    np.testing.assert_array_equal(metrics_n["charts/episodes"], metrics_1["charts/episodes"])
    np.testing.assert_allclose(metrics_n["losses/total"], metrics_1["losses/total"], atol=1e-4)


def test_reproducible_bitwise():
    mesh = data_mesh(2)
    with watchdog(120, "data-parallel PPO twice on 2 devices"):
        a, _ = run_dp(CONFIG, mesh, seed=5)
        b, _ = run_dp(CONFIG, mesh, seed=5)
        c, _ = run_dp(CONFIG, mesh, seed=6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def _loss(params, batch):
    x, y = batch
    return ((jnp.tanh(x @ params["w"]) @ params["v"] - y) ** 2).mean()


@pytest.mark.parametrize("n_devices", [2, 4])
def test_synced_gradient_and_the_check_vma_trap(n_devices):
    k = jax.random.split(jax.random.key(0), 4)
    params = {"w": jax.random.normal(k[0], (5, 7)), "v": jax.random.normal(k[1], (7,))}
    batch = (jax.random.normal(k[2], (16, 5)), jax.random.normal(k[3], (16,)))
    full = jax.grad(_loss)(params, batch)  # one device, the whole batch
    mesh = data_mesh(n_devices)
    with watchdog(60, f"synced gradients on {n_devices} devices"):
        grads = {s: synced_gradient(_loss, params, batch, mesh, sync=s) for s in ("pmean", "vma", "trap")}
    for sync in ("pmean", "vma"):
        for name in params:
            np.testing.assert_allclose(grads[sync][name], full[name], rtol=1e-5, atol=1e-6)
    # check_vma=True sums the replicated parameter's gradient already; pmean on top changes nothing
    for name in params:
        np.testing.assert_allclose(grads["trap"][name], n_devices * full[name], rtol=1e-5, atol=1e-6)


def test_dp_program_has_no_blocking_call():
    """The rule that keeps several CPU devices from deadlocking holds for the PPO program
    (run_dp compiles through check_multidevice_safe, which would have raised)."""
    compiled = compiled_dp_train(CONFIG, data_mesh(2))
    assert blocking_calls(compiled.as_text()) == []
    assert "all-reduce" in compiled.as_text()


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="does not split over 4 devices"):
        make_dp_train(PPOConfig(num_envs=6, num_steps=32, total_timesteps=6 * 32), data_mesh(4))
    with pytest.raises(ValueError, match="num_steps = 30 must be divisible"):
        make_dp_train(PPOConfig(num_envs=4, num_steps=30, total_timesteps=4 * 30), data_mesh(2))
    with pytest.raises(ValueError, match="sync must be one of"):
        make_dp_train(CONFIG, data_mesh(2), sync="psum")
    with pytest.raises(ValueError, match="not 'model'"):
        make_dp_train(CONFIG, data_mesh(2), axis="model")
