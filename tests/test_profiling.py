"""Profiling: a trace of a jitted function with a psum on 2 devices is written (all the files
jax 0.10.2 writes on CPU) and summarised (compute time > 0, an all-reduce among the ops);
and the HLO reader that classifies ops and counts collective bytes, on hand-written HLO."""

from __future__ import annotations

import gzip
import json

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from course_lib.scaling.devices import data_mesh
from course_lib.scaling.profiling import (
    CATEGORIES,
    hlo_collectives,
    hlo_instructions,
    hlo_module_name,
    shape_bytes,
    summarize_trace,
    trace,
)


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """One trace of a small step on 2 devices: a matmul, a tanh, a psum over the mesh."""
    mesh = data_mesh(2)

    def step(x):
        return jax.lax.psum(jnp.tanh(x @ x.T), "data")

    program = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("data"), out_specs=P()))
    x = jax.device_put(jnp.ones((256, 64)), NamedSharding(mesh, P("data")))
    out_dir = tmp_path_factory.mktemp("trace")
    run_dir = trace(program, x, out_dir=out_dir, watchdog_s=60)
    return out_dir, run_dir


def test_trace_writes_the_files_jax_writes(traced):
    out_dir, run_dir = traced
    assert run_dir.parent == out_dir / "plugins" / "profile"
    names = sorted(p.name for p in run_dir.iterdir())
    assert any(n.endswith(".xplane.pb") for n in names)
    assert any(n.endswith(".trace.json.gz") for n in names)
    assert "perfetto_trace.json.gz" in names
    assert "jit_step.hlo.txt" in names
    with gzip.open(next(run_dir.glob("*.trace.json.gz")), "rt") as f:
        assert "traceEvents" in json.load(f)


def test_summary_has_compute_and_a_collective(traced):
    out_dir, _ = traced
    summary = summarize_trace(out_dir)
    assert summary.hlo_found and summary.n_devices == 2
    assert list(summary.categories) == list(CATEGORIES)
    assert summary.categories["compute"] > 0
    assert summary.categories["collective"] > 0
    collectives = [o for o in summary.ops if o.category == "collective"]
    assert [o.opcode for o in collectives] == ["all-reduce"]
    assert collectives[0].count == 2  # one per device
    assert any(o.opcode in ("fusion", "dot") and o.category == "compute" for o in summary.ops)
    assert summary.device_span_ms > 0
    text = summary.table()
    assert "collective" in text and "all-reduce" in text


def test_summary_without_the_hlo_still_finds_the_collective(traced):
    """A trace without the saved HLO (written by plain jax.profiler.trace): the all-reduce is
    recognised by the rendezvous nested in it."""
    _, run_dir = traced
    summary = summarize_trace(next(run_dir.glob("*.trace.json.gz")).resolve())
    assert summary.hlo_found  # the HLO beside the file is still read ...
    for hlo in run_dir.glob("*.hlo.txt"):
        hlo.rename(hlo.with_suffix(".bak"))
    try:
        bare = summarize_trace(run_dir)
    finally:
        for bak in run_dir.glob("*.bak"):
            bak.rename(bak.with_suffix(".txt"))
    assert not bare.hlo_found and bare.notes
    assert bare.categories["collective"] > 0 and bare.categories["compute"] > 0
    assert {o.opcode for o in bare.ops} == {"?"}


def test_summarize_trace_says_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no profiler trace"):
        summarize_trace(tmp_path)
    only_xplane = tmp_path / "plugins" / "profile" / "2026_01_01_00_00_00"
    only_xplane.mkdir(parents=True)
    (only_xplane / "host.xplane.pb").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"only an xplane\.pb"):
        summarize_trace(tmp_path)


HLO = """HloModule jit_step, is_scheduled=true, num_partitions=4

%region (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

ENTRY %main (p0: f32[8,16], p1: bf16[4]) -> (f32[8,16], bf16[16]) {
  %p0 = f32[8,16]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %p1 = bf16[4]{0} parameter(1)
  %ar = f32[8,16]{1,0} all-reduce(%p0), channel_id=1, replica_groups={{0,1},{2,3}}, to_apply=%region
  %ag = bf16[16]{0} all-gather(%p1), channel_id=2, replica_groups=[1,4]<=[4], dimensions={0}
  %cp = f32[8,16]{1,0} collective-permute(%ar), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %rs = f32[2,16]{1,0} reduce-scatter(%cp), channel_id=4, replica_groups={}, dimensions={0}, to_apply=%region
  ROOT %t = (f32[8,16]{1,0}, bf16[16]{0}) tuple(%cp, %ag)
}
"""


def test_hlo_reader_on_hand_written_hlo():
    assert hlo_module_name(HLO) == "jit_step"
    assert shape_bytes("f32[8,16]{1,0}") == 512
    assert shape_bytes("(f32[2]{0}, bf16[3,4]{1,0})") == 8 + 24
    assert shape_bytes("f32[]") == 4
    ins = hlo_instructions(HLO)
    assert ins["ar"].opcode == "all-reduce" and ins["ar"].operands == ("p0",)
    assert ins["t"].opcode == "tuple" and ins["t"].type.startswith("(f32[8,16]")
    found = {c.name: c for c in hlo_collectives(HLO)}
    assert set(found) == {"ar", "ag", "cp", "rs"}
    # all-reduce of 512 B over groups of 2: 2 * 1/2 * 512
    assert (found["ar"].group_size, found["ar"].bytes_sent_per_device) == (2, 512)
    # all-gather of a 8-byte bf16[4] over 4 (iota groups [1,4]): (4-1) * 8
    assert (found["ag"].group_size, found["ag"].operand_bytes, found["ag"].bytes_sent_per_device) == (4, 8, 24)
    # collective-permute: the operand once
    assert found["cp"].bytes_sent_per_device == 512
    # reduce-scatter over every device (replica_groups={}, num_partitions=4): 3/4 * 512
    assert (found["rs"].group_size, found["rs"].bytes_sent_per_device) == (4, 384)


def test_hlo_collectives_reads_operands_after_xla_index_comments():
    # XLA prints "/*index=5*/" before the sixth item of long lists (operands and tuple types)
    params = "\n".join(f"  %p{i} = f32[4]{{0}} parameter({i})" for i in range(7))
    types = ", ".join(("/*index=5*/" if i == 5 else "") + "f32[4]{0}" for i in range(7))
    operands = ", ".join(("/*index=5*/" if i == 5 else "") + f"%p{i}" for i in range(7))
    hlo = (
        "HloModule m, num_partitions=2\nENTRY %main {\n"
        + params
        + f"\n  %ar = ({types}) all-reduce({operands}), replica_groups={{{{0,1}}}}, to_apply=%sum\n}}"
    )
    (found,) = hlo_collectives(hlo)
    assert found.operand_bytes == 7 * 16 and found.bytes_sent_per_device == 7 * 16
