"""Sharded torch checkpoints (lesson 10): DCP saved by N real gloo ranks, loaded by M != N
ranks in their own row sharding (bitwise), read whole with no process group, and a save
killed (SIGKILL) before its commit: no ``.metadata``, refused with a clear error, the
previous checkpoint untouched. Every test ends with no live child process."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from course_lib.checkpoint.sharded import (
    SMALL_SHAPES,
    IncompleteCheckpoint,
    RanksFailed,
    ShardedRun,
    check_complete,
    load_full,
    load_resharded,
    row_range,
    row_shard,
    save_sharded,
)
from course_lib.runtime.processes import live_children, wait_gone

# every child reaped, and multiprocessing's forkserver and resource tracker stopped after the module:
# later suites (tests/test_grading_kernel.py) assert the test process has no children at all
pytestmark = [pytest.mark.timeout(90), pytest.mark.usefixtures("no_helpers_left_behind")]


@pytest.fixture(autouse=True)
def no_children_left() -> Iterator[None]:
    yield
    left = live_children()
    assert wait_gone([p.pid for p in left], within=5.0), f"child processes left behind: {left}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ShardedRun]:
    """A checkpoint saved by 2 ranks after 2 Adam steps (weights, moments, step)."""
    directory = tmp_path_factory.mktemp("dcp") / "step-2"
    return directory, save_sharded(directory, world_size=2, seed=0, steps=2)


def assert_resharded(saved: ShardedRun, loaded: ShardedRun) -> None:
    """Every rank of ``loaded`` holds exactly its ``Shard(0)`` rows of every saved tensor, bitwise."""
    keys = set(saved.shards[0])
    assert keys == {f"model.{n}" for n, _ in SMALL_SHAPES} | {
        f"optim.{n}.{s}" for n, _ in SMALL_SHAPES for s in ("step", "exp_avg", "exp_avg_sq")
    }
    for rank in range(loaded.world_size):
        assert set(loaded.shards[rank]) == keys
        for key in keys:
            want = row_shard(saved.full(key), rank, loaded.world_size)
            got = loaded.shards[rank][key]
            assert got.dtype == want.dtype and got.shape == want.shape, (key, rank)
            assert torch.equal(got, want), f"rank {rank} of {loaded.world_size}: {key} differs"


def test_row_range_is_ceil_chunks_and_may_leave_a_rank_empty() -> None:
    assert [row_range(7, r, 3) for r in range(3)] == [(0, 3), (3, 6), (6, 7)]
    assert [row_range(2, r, 3) for r in range(3)] == [(0, 1), (1, 2), (2, 2)]
    assert [row_range(7, r, 2) for r in range(2)] == [(0, 4), (4, 7)]


def test_save_writes_one_data_file_per_rank_and_metadata_last(saved: tuple[Path, ShardedRun]) -> None:
    directory, run = saved
    assert sorted(p.name for p in directory.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert check_complete(directory) == directory
    assert run.shards[0]["model.w0"].shape == (4, 5) and run.shards[1]["model.w0"].shape == (3, 5)
    assert float(run.shards[0]["optim.w0.step"]) == 2.0
    assert not torch.equal(run.full("optim.w0.exp_avg"), torch.zeros(7, 5))  # trained: moments are real


@pytest.mark.parametrize("world_size", [1, 3])
def test_two_rank_checkpoint_reshards_onto_another_world_bitwise(
    saved: tuple[Path, ShardedRun], world_size: int
) -> None:
    directory, run = saved
    loaded = load_resharded(directory, world_size)
    assert_resharded(run, loaded)
    assert loaded.lr == dict.fromkeys(range(world_size), 0.1)  # the ranks built Adam at 0.3: restored
    if world_size == 3:
        assert loaded.shards[2]["model.w1"].shape == (0, 3)  # 2 rows over 3 ranks: the last holds none


def test_one_rank_checkpoint_loads_on_two_and_sharding_does_not_change_the_training(
    saved: tuple[Path, ShardedRun], tmp_path: Path
) -> None:
    one = save_sharded(tmp_path / "one-rank", world_size=1, seed=0, steps=2)
    for key in one.shards[0]:  # elementwise Adam: the same bits whether 1 or 2 ranks trained
        assert torch.equal(one.full(key), saved[1].full(key)), key
    assert_resharded(one, load_resharded(tmp_path / "one-rank", 2))


def test_load_full_without_a_process_group_gathers_every_tensor(saved: tuple[Path, ShardedRun]) -> None:
    directory, run = saved
    full = load_full(directory)
    for name, shape in SMALL_SHAPES:
        assert full[f"model.{name}"].shape == shape
        assert torch.equal(full[f"model.{name}"], run.full(f"model.{name}"))
        for state in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(full[f"optim.state.{name}.{state}"], run.full(f"optim.{name}.{state}"))


def digest(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_rank_killed_mid_save_leaves_no_loadable_checkpoint_and_the_previous_one_intact(
    saved: tuple[Path, ShardedRun],
) -> None:
    previous, run = saved
    before = digest(previous)
    broken = previous.parent / "step-4"
    with pytest.raises(RanksFailed, match=r"rank 1: died without a report \(killed by SIGKILL\)"):
        save_sharded(broken, world_size=2, seed=0, steps=4, kill_rank=1)
    names = sorted(p.name for p in broken.iterdir())
    assert ".metadata" not in names and "__1_0.distcp" in names  # data written, commit never happened
    for load in (lambda: load_resharded(broken, 1), lambda: load_full(broken), lambda: check_complete(broken)):
        with pytest.raises(
            IncompleteCheckpoint, match=r"step-4 is not a complete DCP checkpoint: it has no \.metadata"
        ):
            load()
    assert digest(previous) == before
    assert torch.equal(load_full(previous)["model.w0"], run.full("model.w0"))


def test_coordinator_killed_before_its_commit_leaves_no_metadata_either(tmp_path: Path) -> None:
    with pytest.raises(RanksFailed, match=r"rank 0: died without a report \(killed by SIGKILL\)"):
        save_sharded(tmp_path / "ckpt", world_size=2, kill_rank=0)
    with pytest.raises(IncompleteCheckpoint, match=r"no \.metadata"):
        check_complete(tmp_path / "ckpt")


def test_errors_name_what_was_wrong(saved: tuple[Path, ShardedRun], tmp_path: Path) -> None:
    directory, _ = saved
    with pytest.raises(FileExistsError, match="not empty: save each checkpoint to a fresh directory"):
        save_sharded(directory, world_size=1)
    with pytest.raises(IncompleteCheckpoint, match="no checkpoint directory"):
        load_resharded(tmp_path / "missing", 1)
    with pytest.raises(RanksFailed, match=r"rank 0: .*model\.w0"):  # a model the checkpoint does not hold
        load_resharded(directory, 1, shapes=(("w0", (8, 5)),), optimizer=False)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        load_resharded(directory, 0)
