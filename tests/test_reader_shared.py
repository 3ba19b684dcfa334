"""Every Kineto trace in ../shared/data loads, and its counts match an independent stdlib count."""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pytest

import hermes_kb
from conftest import SHARED, kineto_traces, needs_shared

pytestmark = needs_shared()

# category (lower-cased) -> frame, written out here independently of the reader
FRAME_OF = {
    "cpu_op": "cpu_ops", "python_function": "python", "user_annotation": "annotations",
    "gpu_user_annotation": "gpu_annotations", "kernel": "kernels", "cuda_runtime": "runtime",
    "cuda_driver": "runtime", "gpu_memcpy": "memcpy", "gpu_memset": "memcpy", "cuda_sync": "syncs",
}  # fmt: skip


def stdlib_counts(path):
    doc = json.loads(gzip.decompress(path.read_bytes()))
    rows = Counter()
    cats = Counter()
    steps = set()
    memory = 0
    for e in doc["traceEvents"]:
        cat = e.get("cat")
        if cat:
            cats[cat] += 1
        frame = FRAME_OF.get((cat or "").lower())
        if frame and e.get("ph") == "X":
            rows[frame] += 1
            if frame == "annotations" and e["name"].startswith("ProfilerStep#"):
                steps.add(int(e["name"].split("#")[1]))
        if cat == "cpu_instant_event" and "Bytes" in e.get("args", {}):
            memory += 1
    rows["memory"] = memory
    return doc, rows, cats, steps


@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: str(p.relative_to(SHARED)))
def test_counts_match_stdlib(path):
    doc, rows, cats, steps = stdlib_counts(path)
    bundle = hermes_kb.load(path)
    assert len(bundle) == 1 and not bundle.problems
    t = next(iter(bundle))
    for frame in ("cpu_ops", "python", "annotations", "gpu_annotations", "kernels", "runtime", "memcpy", "syncs",
                  "memory"):  # fmt: skip
        assert len(getattr(t, frame)) == rows[frame], frame
    for cat, n in cats.items():
        assert t.counts[cat] == n
    assert sorted(t.steps["step"].tolist()) == sorted(steps)
    # times are relative to the earliest event and ends are consistent
    for frame in ("cpu_ops", "kernels", "runtime", "memcpy", "annotations"):
        df = getattr(t, frame)
        if len(df):
            assert df["ts"].min() >= 0
            assert ((df["end"] - df["ts"] - df["dur"]).abs() < 1e-6).all()
    # rank: distributedInfo when present
    dist = doc.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        assert t.rank == dist["rank"] and t.meta.rank_source == "distributedInfo"
    devs = doc.get("deviceProperties") or []
    if devs and devs[0].get("name"):
        assert t.meta.device_name == devs[0]["name"]


def test_df_index_resolver_exact_values(shared):
    path = shared / "hta/df_index_resolver/df_index_resolver.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    ev = doc["traceEvents"]
    t = hermes_kb.load(path)[1]
    origin = min(e["ts"] for e in ev if e.get("ph") == "X" and e.get("cat") not in ("Trace",))
    # a kernel: same duration, same relative start, linked to its launch by correlation
    k = [e for e in ev if e.get("cat") == "kernel"][1000]
    corr = k["args"]["correlation"]
    row = t.kernels[t.kernels["correlation"] == corr].iloc[0]
    assert row["dur"] == k["dur"]
    assert row["ts"] == k["ts"] - origin
    assert row["stream"] == k["args"]["stream"] and row["grid_x"] == k["args"]["grid"][0]
    launch = next(e for e in ev if e.get("cat") == "cuda_runtime" and e["args"].get("correlation") == corr)
    link = t.links[t.links["correlation"] == corr].iloc[0]
    assert link["launch_ts"] == launch["ts"] - origin
    assert t.runtime["name"].iat[int(link["runtime_idx"])] == launch["name"]
    assert link["ext_id"] == k["args"]["External id"]
    # a memcpy: bytes and kind parsed from the name
    m = next(e for e in ev if e.get("cat") == "gpu_memcpy")
    mrow = t.memcpy[(t.memcpy["correlation"] == m["args"]["correlation"])].iloc[0]
    assert mrow["bytes"] == m["args"]["bytes"]
    assert mrow["kind"] == m["name"].split()[1]
    assert abs(mrow["bandwidth_gbps"] - m["args"]["memory bandwidth (GB/s)"]) < 1e-9
    # every NCCL kernel is a collective (all_reduce in this DDP job)
    n_nccl = sum(1 for e in ev if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel"))
    assert len(t.collectives) == n_nccl and set(t.collectives["kind"]) == {"all_reduce"}
    assert t.meta.world_size == 2 and t.meta.backend == "nccl"
    assert len(t.steps) == 5 and t.steps["dur"].iat[0] == 345770.0


def test_dlrm_directory_eight_ranks_with_collective_params(shared):
    bundle = hermes_kb.load(shared / "param/dlrm_kineto_8rank")
    assert bundle.rank_ids == list(range(8))
    assert all(t.meta.rank_source == "distributedInfo" for t in bundle)
    for t in bundle:
        src = json.loads(gzip.decompress(open(t.meta.source, "rb").read()))
        params = [e for e in src["traceEvents"] if e.get("cat") == "cpu_op" and "Collective name" in e.get("args", {})]
        colls = t.collectives
        assert (colls["cpu_idx"] >= 0).sum() == len(params)
        joined = colls[colls["cpu_idx"] >= 0]
        for _, row in joined.iterrows():
            op = t.cpu_ops.iloc[int(row["cpu_idx"])]
            p = next(e for e in params if e["args"]["External id"] == op["ext_id"])
            assert row["collective"] == p["args"]["Collective name"]
            assert row["in_nelems"] == p["args"]["In msg nelems"]
            assert row["group_size"] == p["args"]["Group size"]
            if p["args"]["dtype"] == "Float":
                assert row["in_bytes"] == 4 * p["args"]["In msg nelems"]
    # ranks share one origin: the earliest event of the bundle is at 0 on exactly one rank
    starts = sorted(t.time_span()[0] for t in bundle)
    assert starts[0] == 0.0


def test_rocm_kernels_take_external_id_from_launch(shared):
    t = next(iter(hermes_kb.load(shared / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")))
    doc = json.loads(gzip.decompress((shared / "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes()))
    launches = {e["args"]["correlation"]: e["args"].get("External id") for e in doc["traceEvents"]
                if e.get("cat") == "cuda_runtime"}  # fmt: skip
    for _, k in t.kernels.iterrows():
        if k["correlation"] in launches and launches[k["correlation"]] is not None:
            assert k["ext_id"] == launches[k["correlation"]]
    assert (t.runtime["kind"] == "launch").sum() == sum(
        1 for e in doc["traceEvents"]
        if e.get("cat") == "cuda_runtime" and e["name"] in ("hipLaunchKernel", "hipExtModuleLaunchKernel")
    )
    assert (t.runtime["kind"] == "sync").sum() == 1  # hipDeviceSynchronize


def test_ns_resolution_and_base_time(shared):
    t = next(iter(hermes_kb.load(shared / "hta/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz")))
    # fractional microseconds survive (ns resolution), within float64 precision at this magnitude
    assert (t.kernels["dur"] % 1 != 0).any()
    t2 = next(iter(hermes_kb.load(shared / "hta/nccl_parser_config/nccl_data.json.gz")))
    assert t2.meta.base_time_ns == 1711964646000000000
    assert t2.meta.process_groups and t2.meta.process_groups[0]["ranks"] == [0, 1]


def test_cuda_graph_and_triton(shared):
    t = next(iter(hermes_kb.load(shared / "tracelens/inference__vllm_decode_full__graph_execution.json.gz")))
    assert (t.runtime["kind"] == "graph_launch").sum() >= 1
    t = next(iter(hermes_kb.load(shared / "hta/triton_example/triton_example.json.gz")))
    assert len(t.kernels) == 1 and t.runtime["api"].tolist().count("driver") == 1
