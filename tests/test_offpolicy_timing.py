"""course_lib.offpolicy.sac's timing tools: the time breakdown's parts (the priority update
included for prioritized replay) and the side-by-side training rates of several configs.
Behaviour only (keys, shapes, arithmetic identities); no timing is asserted."""

from __future__ import annotations

import dataclasses

import pytest
from test_offpolicy_sac import PARAMS, TINY, PointMass

from course_lib.offpolicy import sac

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("prioritized", [True, False])
def test_time_breakdown_names_every_part_and_their_sum(prioritized):
    config = dataclasses.replace(TINY, prioritized=prioritized)
    out = sac.time_breakdown(config, env=PointMass, env_params=PARAMS, repeats=1, chunks=1)
    per_update = ["replay_sample", "update"] + (["priority_update"] if prioritized else [])
    assert ("priority_update" in out) == prioritized
    expected = out["env_step"] + out["act"] + out["replay_add"]
    expected += config.updates_per_step * sum(out[k] for k in per_update)
    assert out["parts_sum"] == pytest.approx(expected)
    assert all(out[k] > 0 for k in ["train_step", "env_step", "act", "replay_add", *per_update])
    assert out["updates_per_s"] == pytest.approx(config.updates_per_step / out["train_step"])
    assert out["env_steps_per_s"] == pytest.approx(config.num_envs / out["train_step"])


def test_training_rates_one_entry_per_config_in_order():
    configs = [dataclasses.replace(TINY, updates_per_step=u) for u in (1, 3)]
    rates = sac.training_rates(configs, env=PointMass, env_params=PARAMS, rounds=1)
    assert [r["utd"] for r in rates] == [1 / TINY.num_envs, 3 / TINY.num_envs]
    for c, r in zip(configs, rates):
        assert r["env_steps_per_s"] == pytest.approx(c.num_envs / (r["step_ms"] / 1e3))
        assert r["updates_per_s"] == pytest.approx(r["env_steps_per_s"] * c.utd)


def test_utd_is_updates_per_env_transition() -> None:
    assert sac.CPU_CONFIG.utd == sac.CPU_CONFIG.updates_per_step / sac.CPU_CONFIG.num_envs == 1 / 8
    assert sac.FULL_CONFIG.utd == 4 / 1024
