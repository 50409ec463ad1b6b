"""The capstone job across torchrun agents: the attempt every agent's ranks agree on, the
state trainer 0 shares, and real two-agent runs on localhost in which a rank is SIGKILLed.

torchrun's agents do not keep ``TORCHELASTIC_RESTART_COUNT`` in step: when a rank dies under
one agent, that agent counts a restart, while the other restarts its ranks as a membership
change, which does not count. The ranks therefore agree on the attempt through the store
(:func:`course_lib.capstone.context.join_attempt`); the unit tests below play two agents with
different restart counts in one process, the runs do it with two real agents.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shlex
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
import torch.distributed as dist

from course_lib.capstone.config import CapstoneConfig
from course_lib.capstone.context import Attempt, AttemptSuperseded, RankEnv, RunStore, join_attempt
from course_lib.capstone.job import SetupError, register_attempt, to_cpu
from course_lib.capstone.launch import run, torchrun_command
from course_lib.runtime.processes import free_port, live_children

ROOT = Path(__file__).resolve().parents[1]

# ---- the attempt every rank agrees on -----------------------------------------------------------------


def _env(rank: int, restart_count: int, port: int, world: int = 4) -> RankEnv:
    """Rank ``rank`` of 2 agents x 2 ranks; ``restart_count`` is its agent's own count."""
    return RankEnv(rank, world, rank % 2, 2, rank // 2, restart_count, "127.0.0.1", port, run_id="capstone-t")


def _round(port: int, counts: dict[int, int], order: list[int], timeout_s: float = 10.0) -> dict[int, Any]:
    """Start the ranks of one rendezvous round (threads, each with its own store client) in
    ``order``, a little apart; returns each rank's Attempt, or the exception it raised."""
    out: dict[int, Any] = {}

    def one(rank: int) -> None:
        try:
            store = RunStore(_env(rank, counts[rank], port), timeout_s)
            attempt = store.join()
            store.set_int(f"hello{rank}", attempt.number)  # under this attempt's prefix
            out[rank] = attempt
        except Exception as exc:
            out[rank] = exc

    threads = []
    for rank in order:
        t = threading.Thread(target=one, args=(rank,))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    for t in threads:
        t.join(timeout_s + 5)
    assert not any(t.is_alive() for t in threads)
    return out


@pytest.fixture
def server():
    """The agent's TCP store (a master in this process) and its port."""
    port = free_port()
    master = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=dt.timedelta(seconds=10))
    yield master, port


def test_ranks_of_two_agents_agree_on_the_attempt_whatever_their_restart_counts(server):
    master, port = server
    first = _round(port, {r: 0 for r in range(4)}, [0, 1, 2, 3])
    assert all(isinstance(a, Attempt) for a in first.values()), first
    assert {a.number for a in first.values()} == {1}
    launch = first[0].launch
    assert launch.startswith("capstone-t-") and {a.launch for a in first.values()} == {launch}
    # A rank died under agent B (ranks 2, 3): B counts a restart, agent A restarts its ranks as
    # a membership change and keeps count 0. The new ranks 1..3 arrive before the new rank 0,
    # with the dead attempt's join and welcome keys still in the store: they must wait for it.
    second = _round(port, {0: 0, 1: 0, 2: 1, 3: 1}, [3, 1, 2, 0])
    assert all(isinstance(a, Attempt) for a in second.values()), second
    assert {(a.number, a.launch) for a in second.values()} == {(2, launch)}
    assert {a.restarts for a in second.values()} == {1}
    # each attempt's keys live under a prefix of its own
    assert [int(master.get(f"capstone/a2/hello{r}")) for r in range(4)] == [2, 2, 2, 2]
    assert [int(master.get(f"capstone/a1/hello{r}")) for r in range(4)] == [1, 1, 1, 1]


def test_a_rank_that_never_arrives_is_named_and_the_next_round_still_agrees(server):
    _, port = server
    _round(port, {r: 0 for r in range(4)}, [0, 1, 2, 3])
    t0 = time.monotonic()
    broken = _round(port, {r: 1 for r in range(4)}, [0, 1, 2], timeout_s=1.5)  # rank 3 killed before it arrived
    assert time.monotonic() - t0 < 6
    assert isinstance(broken[0], TimeoutError) and "rank(s) [3] to join attempt 2" in str(broken[0])
    assert all(isinstance(broken[r], Attempt) and broken[r].number == 2 for r in (1, 2))
    again = _round(port, {0: 2, 1: 2, 2: 1, 3: 1}, [2, 0, 3, 1])
    assert {a.number for a in again.values()} == {3}, again


def test_without_rank_0_a_rank_times_out_with_a_clear_error(server):
    _, port = server
    store = RunStore(_env(2, 0, port), 0.5)
    with pytest.raises(TimeoutError, match=r"rank 2 waited 0\.5 s for rank 0 to welcome it"):
        store.join()
    with pytest.raises(RuntimeError, match=r"join\(\) first"):
        store.set_int("x", 1)


def test_a_rank_0_of_an_older_attempt_steps_aside(server):
    """A rank 0 of a dead attempt still waiting (ranks 1..3 never came) when the next attempt's
    rank 0 starts: the old one gives up, and the new ranks all join the new attempt."""
    master, port = server
    root = dist.PrefixStore("capstone", master)
    old: dict[str, Any] = {}

    def old_rank0() -> None:
        try:
            old["attempt"] = join_attempt(root, 0, 4, "capstone-t", 10.0)
        except Exception as exc:
            old["error"] = exc

    t = threading.Thread(target=old_rank0)
    t.start()
    time.sleep(0.2)
    new = _round(port, {r: 1 for r in range(4)}, [0, 1, 2, 3])
    t.join(15)
    assert isinstance(old.get("error"), AttemptSuperseded), old
    assert "attempt 2 of this launch started while attempt 1 was joining" in str(old["error"])
    assert {a.number for a in new.values() if isinstance(a, Attempt)} == {2} and len(new) == 4, new


def test_a_welcome_into_an_older_attempt_is_refused_and_the_rank_joins_again(server):
    """Played by hand: attempt 2's rank 0 has taken its number, and a rank 0 of attempt 1 (a
    dead attempt) welcomes rank 1 first. Rank 1 refuses, posts a new nonce, and takes attempt 2."""
    master, port = server
    root = dist.PrefixStore("capstone", master)
    root.add("attempts", 2)
    out: dict[str, Any] = {}
    rank1 = RunStore(_env(1, 0, port), 5.0)  # a client of its own, as a rank has
    t = threading.Thread(target=lambda: out.update(a=join_attempt(rank1.root, 1, 4, "capstone-t", 5.0)))
    t.start()
    root.wait(["join/1"], dt.timedelta(seconds=5))
    first = root.get("join/1").decode()
    root.set(f"welcome/{first}", json.dumps({"attempt": 1, "launch": "L"}))  # the dead attempt's rank 0
    deadline = time.monotonic() + 5
    while root.get("join/1").decode() == first and time.monotonic() < deadline:
        time.sleep(0.01)
    second = root.get("join/1").decode()
    assert second != first and not root.check(["ready/1/1"])
    root.set(f"welcome/{second}", json.dumps({"attempt": 2, "launch": "L"}))  # attempt 2's rank 0
    t.join(5)
    assert out["a"] == Attempt(2, "L") and root.get("ready/2/1").decode() == second


# ---- the restore decision ----------------------------------------------------------------------------


def test_restore_is_decided_by_the_launch_not_by_the_local_restart_count(tmp_path):
    run_dir = tmp_path / "run"
    cfg = CapstoneConfig(run_dir=str(run_dir))
    env0 = RankEnv(0, 4, 0, 2, 0, 0, "127.0.0.1", 1, run_id="capstone-x")
    assert register_attempt(cfg, env0, Attempt(1, "capstone-x-aaa")) == (0, False)
    # torchrun restarted this launch; rank 0's agent did not count it (restart count 0)
    assert register_attempt(cfg, env0, Attempt(2, "capstone-x-aaa")) == (1, True)
    log = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [(a["attempt"], a["launch"], a["launch_attempt"]) for a in log] == [
        (0, "capstone-x-aaa", 1),
        (1, "capstone-x-aaa", 2),
    ]
    # another launch in the same directory, even with the same --rdzv-id and a restart count
    with pytest.raises(SetupError, match="already holds a run; pass --resume"):
        register_attempt(cfg, env0, Attempt(1, "capstone-x-bbb"))
    with pytest.raises(SetupError, match="already holds a run"):
        register_attempt(
            cfg, RankEnv(0, 4, 0, 2, 0, 1, "127.0.0.1", 1, run_id="capstone-x"), Attempt(2, "capstone-x-bbb")
        )
    resume = CapstoneConfig(run_dir=str(run_dir), resume=True)
    with pytest.raises(SetupError, match="holds no checkpoint"):
        register_attempt(resume, env0, Attempt(1, "capstone-x-ccc"))
    with pytest.raises(SetupError, match="does not exist"):
        register_attempt(CapstoneConfig(run_dir=str(tmp_path / "nope"), resume=True), env0, Attempt(1, "l"))
    # a launch whose first attempt died before registering starts afresh on its restart
    other = CapstoneConfig(run_dir=str(tmp_path / "other"))
    assert register_attempt(other, env0, Attempt(2, "capstone-x-ddd")) == (0, False)


# ---- trainer 0's state to the other trainers ------------------------------------------------------------


def _share_state_rank(rank: int, init_file: str, out_dir: str) -> None:
    """One of two gloo ranks (spawned): trainer 0 shares a trained model and Adam state."""
    from course_lib.capstone.job import new_model, new_optimizer, share_state
    from course_lib.capstone.ledger import SampleLedger
    from course_lib.capstone.trainer import TrainerState, state_digest

    torch.set_num_threads(1)
    store = dist.FileStore(init_file, 2)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=dt.timedelta(seconds=60))
    try:
        cfg = CapstoneConfig(run_dir=out_dir)
        device = torch.device("cpu")
        group = dist.new_group([0, 1])
        state = None
        if rank == 0:
            torch.manual_seed(3)
            model = new_model(cfg, device)
            opt = new_optimizer(model, cfg)
            model(torch.randint(4, 20, (2, 6))).float().pow(2).mean().backward()
            opt.step()
            ledger = SampleLedger(cfg.group_size, cfg.groups_per_batch)
            state = TrainerState(model, opt, 7, ledger, 0.25)
        got = share_state(state, cfg, group, device)
        moments = [t for s in got.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
        report = {
            "step": got.step,
            "eval_start": got.eval_start,
            "model": state_digest(got.model.state_dict()),
            "adam": state_digest({str(i): t.float() for i, t in enumerate(moments)}),
            "n_moments": len(moments),
            "devices": sorted({str(t.device) for t in [*got.model.state_dict().values(), *moments]}),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()


def test_share_state_sends_cpu_copies_and_each_trainer_loads_them_on_its_device(tmp_path):
    import torch.multiprocessing as mp

    mp.start_processes(
        _share_state_rank,
        args=(str(tmp_path / "init"), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    _no_orphans()
    sent, got = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert got["step"] == 7 and got["eval_start"] == 0.25
    assert got["model"] == sent["model"] and got["adam"] == sent["adam"]  # bitwise the same weights and moments
    assert got["n_moments"] == sent["n_moments"] > 0
    assert got["devices"] == ["cpu"]  # the device share_state was given (a GPU rank's own GPU there)


def test_to_cpu_copies_every_tensor_of_a_state_dict():
    opt_state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.ones(2)}}, "param_groups": [{"lr": 0.1}]}
    copy = to_cpu(opt_state)
    assert copy["state"][0]["exp_avg"].device.type == "cpu" and copy["param_groups"] == [{"lr": 0.1}]
    copy["state"][0]["exp_avg"] += 1  # a copy, not a view on the sender's state
    assert torch.equal(opt_state["state"][0]["exp_avg"], torch.ones(2))


# ---- the two-node command, as documented ---------------------------------------------------------------


def _flags(command: str) -> set[str]:
    words = shlex.split(command.replace("\\\n", " "))
    return {w.split("=", 1)[0] for w in words[: words.index("course_lib.capstone.job")] if w.startswith("--")}


def test_the_documented_two_node_command_is_the_one_the_tests_run():
    built = torchrun_command(
        CapstoneConfig(run_dir="/shared/runs/capstone"), 4, nnodes=2, rdzv_endpoint="HOST:29400", max_restarts=2
    )
    want = _flags(shlex.join(built))
    assert {"--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--max-restarts"} <= want
    guide = (ROOT / "CONTRIBUTING.md").read_text()  # "The capstone on torchrun (lesson 11)"
    (block,) = [b for b in re.findall(r"```\n(torchrun[^`]*?)```", guide) if "--nnodes" in b]
    doc = (ROOT / "course_lib" / "capstone" / "job.py").read_text()
    (line,) = re.findall(r"\n    (torchrun --nnodes.*?--run-dir \S+)", doc, flags=re.S)
    for command in (block, line.replace("\\\\", "\\")):
        assert _flags(command) == want, command
        assert "--rdzv-backend=c10d" in command and "--max-restarts=2" in command


# ---- two torchrun agents, a rank SIGKILLed under one of them -------------------------------------------

SHORT = {
    "n_updates": 10,
    "warm_steps": 5,
    "eval_prompts": 16,
    "checkpoint_every": 4,
    "keep_checkpoints": 10,
    "timeout_s": 30.0,
}
DEADLINE_S = 120.0


def _no_orphans() -> None:
    assert not live_children(), [p.cmdline() for p in live_children()]


@pytest.mark.parametrize(
    ("victim", "role", "node"),
    [(3, "generator", 1), (1, "trainer", 0)],
    ids=["generator-under-agent-1", "trainer-under-agent-0"],
)
@pytest.mark.timeout(DEADLINE_S + 30)
def test_two_agents_recover_from_a_rank_killed_under_one_of_them(tmp_path, victim, role, node):
    """Rank 0 lives under agent 0. Killing rank 3 (agent 1) leaves agent 0's restart count at 0
    when it restarts its ranks as a membership change; the ranks must still agree on attempt 2,
    and rank 0 must restore from the checkpoint instead of refusing a 'fresh start'."""
    run_dir = tmp_path / role
    t0 = time.monotonic()
    rep = run(
        run_dir,
        nproc_per_node=2,
        agents=2,
        max_restarts=1,
        deadline_s=DEADLINE_S,
        show_progress=False,
        echo=None,
        calibrate=False,
        n_trainers=2,
        kill_rank=victim,
        kill_at_update=5,
        **SHORT,
    )
    assert time.monotonic() - t0 < DEADLINE_S  # run() also checked that both agents' process groups are gone
    _no_orphans()
    assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]
    audit = rep.result["audit"]
    assert audit["ok"], audit
    assert rep.result["updates"] == SHORT["n_updates"] and rep.result["attempts"] == 2
    starts = [x for x in rep.lines if x["kind"] == "start"]
    assert {x["rank"]: x["node"] for x in starts if x["attempt"] == 0} == {0: 0, 1: 0, 2: 1, 3: 1}
    assert (run_dir / "kills" / f"rank{victim}-update5").exists()
    assert {x["node"] for x in starts if x["rank"] == victim} == {node}
    (restart,) = rep.restarts
    assert restart["resumed_step"] == 4  # the newest checkpoint before the kill at update 5
    assert restart["restart_count"] == 1  # agreed by every rank, whatever each agent counted
    again = [x for x in starts if x["attempt"] == 1]
    assert sorted(x["rank"] for x in again) == [0, 1, 2, 3]
    assert {(x["restart_count"], x["launch"], x["resumed_step"]) for x in again} == {(1, restart["launch"], 4)}
    # the victim's agent counted a restart; the other may have restarted its ranks without counting
    assert {x["torchelastic_restart_count"] for x in again if x["node"] == node} == {1}
    assert audit["discarded_groups"] == restart["discarded_groups"] > 0
    attempts = [json.loads(x) for x in (run_dir / "attempts.jsonl").read_text().splitlines()]
    assert [a["launch_attempt"] for a in attempts] == [1, 2] and len({a["launch"] for a in attempts}) == 1
