"""Lesson 12's controller on a running two-node Ray cluster that it joins by address.

The two nodes are two raylets on this machine (``ray.cluster_utils.Cluster``, Ray's own way of
testing several nodes on one host), one CPU each, so the placement group's two bundles land on
different nodes: the trainers on one, the generators on the other. Every rendezvous is served by
trainer 0 on its node's address (:meth:`~course_lib.capstone_ray.workers.TrainerWorker.open_store`),
so the generators' weight-sync group meets across the nodes; the fault is injected through Ray
(``ray.kill``), never by a pid on the driver's host. Marked ``ray``: run inside a loopback-only
namespace (``python -m course_lib.runtime.netns -- python -m pytest tests/test_capstone_ray_cluster.py``).
"""

from __future__ import annotations

import psutil
import pytest

from course_lib.capstone_ray.cluster import start_ray, stop_ray
from course_lib.capstone_ray.controller import RayRunConfig, run

pytestmark = pytest.mark.ray


def test_the_controller_joins_a_two_node_cluster_and_its_groups_meet_across_the_nodes():
    from ray.cluster_utils import Cluster

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        start_ray(address=cluster.address)
        try:
            cfg = RayRunConfig(layout="pipeline", n_updates=24, kill_at=6, warm_steps=5, eval_prompts=32)
            rep = run(cfg)
        finally:
            stop_ray()
        nodes = {a["role"]: set() for a in rep["actors"]}
        for a in rep["actors"]:
            nodes[a["role"]].add(a["node_id"])
        assert len(nodes["trainer"]) == len(nodes["generator"]) == 1 and nodes["trainer"] != nodes["generator"]
        assert rep["audit"]["ok"], rep["audit"]
        assert [m["u"] for m in rep["metrics"]] == list(range(cfg.n_updates))
        kill = rep["kill"]  # killed through Ray on the other node, restarted there, back in the sync group
        assert kill["new_pid"] != kill["old_pid"] and kill["restart_ready_s"] <= kill["rejoined_s"] < cfg.timeout_s
        assert rep["sync_group_builds"] >= 3
    finally:
        cluster.shutdown()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], left
