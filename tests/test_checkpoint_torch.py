"""A torch training state in safetensors + JSON (torch_state), and lesson 01's REINFORCE
killed with SIGKILL at named points and resumed in fresh processes: bitwise equal results."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from course_lib.checkpoint.atomic import (
    CheckpointError,
    CorruptCheckpoint,
    NoCheckpoint,
    latest_complete,
    list_steps,
    restore_latest,
    step_dir,
    write_manifest,
)
from course_lib.checkpoint.crash import PHASES, KillPoint, run_in_child
from course_lib.checkpoint.reinforce_resume import (
    ResumableResult,
    train_reinforce_checkpointed,
    train_to_file,
)
from course_lib.checkpoint.torch_state import MODEL, load_torch_state, save_torch_state
from course_lib.rl.reinforce import ReinforceConfig, make_policy
from course_lib.runtime.processes import live_children, wait_gone

# every child reaped, and multiprocessing's forkserver and resource tracker stopped after the module:
# later suites (tests/test_grading_kernel.py) assert the test process has no children at all
pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_helpers_left_behind")]

CONFIG = ReinforceConfig(n_envs=4, n_updates=12, hidden=16, seed=3)
EVERY = 3


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    left = live_children()
    assert wait_gone([p.pid for p in left], within=5.0), f"child processes left behind: {left}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> ResumableResult:
    """The uninterrupted run, checkpointing as the killed ones do."""
    return train_reinforce_checkpointed(CONFIG, tmp_path_factory.mktemp("reference"), EVERY)


# --- torch_state ----------------------------------------------------------------------


def _trained(hidden: int = 8, steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = make_policy(4, 2, hidden)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.85, 0.995))
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
    return model, opt


def test_torch_state_round_trip_is_bitwise(tmp_path):
    model, opt = _trained()
    gen = torch.Generator().manual_seed(42)
    torch.rand(3, generator=gen)
    random.seed(5)
    np.random.seed(6)
    path = save_torch_state(tmp_path, 3, model, opt, gen, extra={"position": 17, "history": [0.1, 1 / 3]})
    assert sorted(p.name for p in path.iterdir()) == [
        "manifest.json",
        "model.safetensors",
        "optimizer.safetensors",
        "rng.safetensors",
        "state.json",
    ]
    expected = (torch.rand(4, generator=gen), torch.rand(4), random.random(), np.random.random())

    fresh, fresh_opt = _trained(steps=0)
    fresh_opt.param_groups[0]["lr"] = 0.5
    fresh_gen = torch.Generator().manual_seed(0)
    torch.manual_seed(99)
    random.seed(99)
    np.random.seed(99)
    extra = load_torch_state(path, fresh, fresh_opt, fresh_gen)

    assert extra == {"position": 17, "history": [0.1, 1 / 3]}
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    for i, state in saved["state"].items():
        for name, value in state.items():
            assert torch.equal(value, loaded["state"][i][name]), (i, name)
    got = (torch.rand(4, generator=fresh_gen), torch.rand(4), random.random(), np.random.random())
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), "torch RNG streams resume exactly"
    assert got[2:] == expected[2:], "python and numpy RNG streams resume exactly"


def test_a_checkpoint_of_another_shape_names_the_tensor_and_changes_nothing(tmp_path):
    model, opt = _trained(hidden=8)
    path = save_torch_state(tmp_path, 1, model, opt)
    other, other_opt = _trained(hidden=16, steps=1)
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(CheckpointError) as info:
        load_torch_state(path, other, other_opt)
    message = str(info.value)
    assert "0.weight: checkpoint has (8, 4) torch.float32, model has (16, 4) torch.float32" in message
    assert "4.weight" in message and str(path / MODEL) in message and "Build the model" in message
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(), strict=True)), "model left unchanged"


def test_unparseable_safetensors_is_corrupt_and_restore_falls_back(tmp_path):
    model, opt = _trained()
    save_torch_state(tmp_path, 1, model, opt)
    bad = save_torch_state(tmp_path, 2, model, opt)
    (bad / MODEL).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    write_manifest(bad, 2)  # the manifest vouches for the bad bytes: only the loader can tell
    with pytest.raises(CorruptCheckpoint, match=r"model\.safetensors: not a readable safetensors file"):
        load_torch_state(bad, model, opt)
    restored = restore_latest(tmp_path, lambda p: load_torch_state(p, model, opt))
    assert restored.step == 1 and restored.skipped[0][0] == bad


# --- REINFORCE: kill, resume, compare bits --------------------------------------------


def _run_killed(root: Path, out: Path, kill_point: KillPoint | None) -> int:
    """One fresh process of the resumable loop; returns the newest complete step after it."""
    outcome = run_in_child(train_to_file, CONFIG, str(root), EVERY, kill_point, str(out), timeout_s=120)
    assert not outcome.timed_out, outcome
    assert outcome.killed == (kill_point is not None), outcome
    found = latest_complete(root)
    return -1 if found is None else found[0]


def _assert_same_run(out: Path, reference: ResumableResult) -> np.ndarray:
    result = np.load(out)
    assert np.array_equal(result["params"], reference.params), "final parameters differ from the uninterrupted run"
    assert np.array_equal(result["returns"], reference.returns), "per-update returns differ"
    return result["resumed_from"]


def test_reinforce_killed_at_named_points_resumes_bitwise(tmp_path, reference):
    root, out = tmp_path / "ckpts", tmp_path / "out.npz"
    chain = [
        (KillPoint(5, "mid_update"), 3),
        (KillPoint(6, "mid_save"), 3),
        (KillPoint(6, "mid_save"), 3),  # killed twice in a row at the same point
        (KillPoint(9, "after_save"), 9),
        (None, 12),
    ]
    for kill_point, newest in chain:
        assert _run_killed(root, out, kill_point) == newest, kill_point
    assert reference.saved == [3, 6, 9, 12] and reference.resumed_from == []
    assert list(_assert_same_run(out, reference)) == [3, 9]
    assert list_steps(root) == [6, 9, 12], "keep=3"


def _random_kill_points(seed: int, n: int) -> list[KillPoint]:
    """``n`` kill points in run order: a random phase, then a random step where that phase occurs."""
    rng = np.random.default_rng(seed)
    saves = [s for s in range(1, CONFIG.n_updates + 1) if s % EVERY == 0]
    points = []
    for _ in range(n):
        phase = PHASES[int(rng.integers(len(PHASES)))]
        step = int(rng.integers(1, CONFIG.n_updates + 1)) if phase == "mid_update" else int(rng.choice(saves))
        points.append(KillPoint(step, phase))
    return sorted(points, key=lambda k: (k.step, PHASES.index(k.phase)))


def test_reinforce_killed_at_random_points_resumes_bitwise(tmp_path, reference):
    root, out = tmp_path / "ckpts", tmp_path / "out.npz"
    points = _random_kill_points(seed=10, n=2)
    for kill_point in points:
        _run_killed(root, out, kill_point)
    assert _run_killed(root, out, None) == CONFIG.n_updates
    _assert_same_run(out, reference)


def test_resume_skips_and_quarantines_a_corrupt_checkpoint_and_stays_exact(tmp_path, reference):
    short = ReinforceConfig(**{**CONFIG.__dict__, "n_updates": 6})
    first = train_reinforce_checkpointed(short, tmp_path, EVERY)
    assert first.saved == [3, 6]
    weights = step_dir(tmp_path, 6) / MODEL
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))

    resumed = train_reinforce_checkpointed(CONFIG, tmp_path, EVERY)
    assert resumed.resumed_from == [3] and resumed.saved == [6, 9, 12]
    assert "sha256" in resumed.skipped[0][1] and resumed.skipped[0][0] == step_dir(tmp_path, 6)
    assert len(list(tmp_path.glob(".corrupt-step_00000006-*"))) == 1
    assert np.array_equal(resumed.params, reference.params)
    assert np.array_equal(resumed.returns, reference.returns)


def test_resume_with_another_config_is_refused(tmp_path):
    short = ReinforceConfig(**{**CONFIG.__dict__, "n_updates": 3})
    train_reinforce_checkpointed(short, tmp_path, EVERY)
    changed = ReinforceConfig(**{**CONFIG.__dict__, "lr": 0.02})
    with pytest.raises(CheckpointError, match=r"another configuration \(lr: checkpoint 0.01, now 0.02\)"):
        train_reinforce_checkpointed(changed, tmp_path, EVERY)
    with pytest.raises(CheckpointError, match="does not fit this model"):
        train_reinforce_checkpointed(ReinforceConfig(**{**CONFIG.__dict__, "hidden": 8}), tmp_path, EVERY)
    with pytest.raises(CheckpointError, match="every must be >= 1"):
        train_reinforce_checkpointed(CONFIG, tmp_path, 0)


@pytest.mark.parametrize(("piece", "first_apart"), [("generator", 6), ("optimizer", 7)])
def test_a_resume_that_leaves_out_one_piece_departs_from_the_uninterrupted_run(tmp_path, reference, piece, first_apart):
    """The test of the test: without the action generator's state the first update after the
    resume already collects other episodes; without Adam's state the first batch is the
    same, its update is not, so the next batch differs. With every piece: bitwise equal."""
    short = ReinforceConfig(**{**CONFIG.__dict__, "n_updates": 6})
    train_reinforce_checkpointed(short, tmp_path / "all", EVERY)
    whole = train_reinforce_checkpointed(CONFIG, tmp_path / "all", EVERY)
    assert np.array_equal(whole.params, reference.params)
    train_reinforce_checkpointed(short, tmp_path / piece, EVERY)
    careless = train_reinforce_checkpointed(CONFIG, tmp_path / piece, EVERY, leave_out=piece)
    same = [np.array_equal(a, b) for a, b in zip(careless.returns, reference.returns, strict=True)]
    assert same.index(False) == first_apart and all(same[:first_apart])
    assert not np.array_equal(careless.params, reference.params)


def test_leave_out_names_a_piece(tmp_path):
    with pytest.raises(ValueError, match="leave_out must be None or one of"):
        train_reinforce_checkpointed(CONFIG, tmp_path, EVERY, leave_out="weights")


def test_every_checkpoint_corrupt_refuses_a_fresh_start_and_moves_nothing(tmp_path):
    short = ReinforceConfig(**{**CONFIG.__dict__, "n_updates": 6})
    assert train_reinforce_checkpointed(short, tmp_path, EVERY).saved == [3, 6]
    for step in (3, 6):
        weights = step_dir(tmp_path, step) / MODEL
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0x01
        weights.write_bytes(bytes(data))
    with pytest.raises(NoCheckpoint, match="starting from scratch would discard"):
        train_reinforce_checkpointed(CONFIG, tmp_path, EVERY)
    assert list_steps(tmp_path) == [3, 6] and not list(tmp_path.glob(".corrupt-*"))
