"""One real trace per Kineto schema era (docs/trace_bundle.md, "Kineto schema eras"): the reader's
frames against numbers computed here from the raw JSON with the standard library only."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

import hermes_kb
from conftest import ROOT, SHARED, X, write_trace

# written out here, independently of hermes_kb.trace.names
SCOPES = ("ProfilerStep#", "enumerate(DataLoader)", "Optimizer.step#", "Optimizer.zero_grad#")
LAUNCH_WORDS = ("LaunchKernel", "LaunchCooperativeKernel")


def trace(rel: str) -> Path:
    path = SHARED / rel
    if not path.is_file():
        pytest.skip(f"../shared/data/{rel} is absent (outside the project's CI)")
    return path


def events_of(path: Path) -> list[dict]:
    data = path.read_bytes()
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def load(path: Path):
    bundle = hermes_kb.load(path)
    assert len(bundle) == 1 and not bundle.problems
    return next(iter(bundle))


def top_level_count(ops: list[dict]) -> int:
    """Ops enclosed by no other op of their thread: a sweep in start order, longer first."""
    n = 0
    by_tid = defaultdict(list)
    for e in ops:
        by_tid[str(e["tid"])].append((e["ts"], -e.get("dur", 0)))
    for spans in by_tid.values():
        reach = float("-inf")
        for ts, neg_dur in sorted(spans):
            if ts >= reach:
                n += 1
            reach = max(reach, ts - neg_dur)
    return n


def raw_summary(events: list[dict]) -> dict:
    by = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            by[(e.get("cat") or "").lower()].append(e)
    ops, scopes = [], []
    for e in by["cpu_op"] + by["operator"]:  # 2021: the scopes are "Operator" events
        (scopes if e["name"].startswith(SCOPES) else ops).append(e)
    annotations = by["user_annotation"] + scopes
    steps: dict[int, float] = {}
    for e in annotations:
        if e["name"].startswith("ProfilerStep#"):
            n = int(e["name"].split("#")[1])
            steps[n] = max(steps.get(n, 0.0), e["dur"])
    runtime = by["cuda_runtime"] + by["cuda_driver"] + by["runtime"]
    call_of = {}
    for e in runtime:
        call_of.setdefault(e.get("args", {}).get("correlation"), e["name"])
    kernels = by["kernel"]
    kernel_calls = [call_of.get(k.get("args", {}).get("correlation")) for k in kernels]
    syncs = by["cuda_sync"]
    return {
        "ops": len(ops),
        "top_level": top_level_count(ops),
        "annotations": len(annotations),
        "steps": steps,
        "dataloader": [e["dur"] for e in annotations if e["name"].startswith("enumerate(DataLoader)")],
        "kernels": len(kernels),
        "kernels_linked": sum(c is not None for c in kernel_calls),
        "kernels_by_launch": sum(c is not None and ("Launch" in c) for c in kernel_calls),
        "runtime": len(runtime),
        "launches": sum(any(w in e["name"] for w in LAUNCH_WORDS) for e in runtime),
        "graph_launches": sum("GraphLaunch" in e["name"] for e in runtime),
        "memcpy": sum(len(by[c]) for c in ("gpu_memcpy", "gpu_memset", "memcpy", "memset")),
        "syncs": len(syncs),
        "syncs_linked": sum(s.get("args", {}).get("correlation") in call_of for s in syncs),
        "memory": sum(1 for e in events if e.get("name") == "[memory]" and "Bytes" in e.get("args", {})),
        "python": len(by["python_function"]),
        "gpu_annotations": len(by["gpu_user_annotation"]),
        "driver": len(by["cuda_driver"]),
    }


def check_against_raw(t, raw: dict) -> None:
    """What every era must give: the same events in the same frames, a sane call tree, links."""
    assert len(t.cpu_ops) == raw["ops"]
    assert int((t.cpu_ops["depth"] == 0).sum()) == raw["top_level"]
    top = set(t.cpu_ops.loc[t.cpu_ops["depth"] == 0, "name"].astype(str))
    assert not any(n.startswith(SCOPES) for n in top)  # depth 0 holds operators, not scopes
    assert len(t.annotations) == raw["annotations"]
    assert sorted(t.steps["step"].tolist()) == sorted(raw["steps"])
    if raw["steps"]:
        mean = sum(raw["steps"].values()) / len(raw["steps"])
        assert t.steps["dur"].mean() == pytest.approx(mean, rel=1e-12)
    dl = t.annotations[t.annotations["kind"] == "dataloader"]
    assert len(dl) == len(raw["dataloader"])
    assert sorted(dl["dur"].tolist()) == pytest.approx(sorted(raw["dataloader"]))
    assert len(t.kernels) == raw["kernels"]
    assert len(t.runtime) == raw["runtime"]
    assert int((t.runtime["kind"] == "launch").sum()) == raw["launches"]
    assert int((t.runtime["kind"] == "graph_launch").sum()) == raw["graph_launches"]
    links = t.links
    k_links = links[links["gpu_kind"] == "kernel"]
    assert k_links["gpu_idx"].nunique() == raw["kernels_linked"]
    callers = t.runtime["kind"].to_numpy()[k_links["runtime_idx"].to_numpy()]
    assert int(sum(k in ("launch", "graph_launch") for k in callers)) == raw["kernels_by_launch"]
    assert len(t.memcpy) == raw["memcpy"]
    assert len(t.syncs) == raw["syncs"]
    assert int((links["gpu_kind"] == "sync").sum()) == raw["syncs_linked"]
    assert len(t.memory) == raw["memory"]
    assert len(t.python) == raw["python"]
    assert len(t.gpu_annotations) == raw["gpu_annotations"]
    assert int((t.runtime["api"] == "driver").sum()) == raw["driver"]


def kinds(t) -> dict[str, int]:
    return dict(Counter(t.annotations["kind"].astype(str)))


def test_2021_schema_hand_made(tmp_path):
    """The 2021 differences without ../shared/data: scopes as Operator events, "external id",
    [memory] instants without a category, async flows."""
    ev = [
        X("Operator", "ProfilerStep#4", 0, 100, tid="11", args={"External id": 1}),
        X("Operator", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 2, 40, tid="11",
          args={"External id": 2}),  # fmt: skip
        X("Operator", "aten::to", 50, 20, tid="11", args={"External id": 3, "Input Dims": [[8]]}),
        X("Operator", "aten::copy_", 52, 15, tid="11", args={"External id": 4, "Input Dims": [[8], [8]]}),
        X("Runtime", "cudaLaunchKernel", 55, 5, tid="11", args={"external id": 4, "correlation": 9}),
        X("Kernel", "k", 80, 10, pid=0, tid="stream 7", args={"external id": 4, "correlation": 9}),
        X("Operator", "Optimizer.step#SGD.step", 75, 20, tid="11", args={"External id": 5}),
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 11, "ts": 53, "args": {"Bytes": 32}},
        {"ph": "s", "id": 9, "pid": 1, "tid": 11, "ts": 55, "cat": "async", "name": "launch"},
        {"ph": "f", "id": 9, "pid": 0, "tid": "stream 7", "ts": 80, "cat": "async", "name": "launch"},
    ]
    t = load(write_trace(tmp_path / "t.json", ev))
    assert t.cpu_ops["name"].tolist() == ["aten::to", "aten::copy_"]
    assert t.cpu_ops["depth"].tolist() == [0, 1]
    assert kinds(t) == {"step": 1, "dataloader": 1, "optimizer": 1}
    assert t.steps.to_dict("records") == [{"step": 4, "ts": 0.0, "dur": 100.0, "end": 100.0}]
    assert t.kernels["ext_id"].tolist() == [4] and t.runtime["ext_id"].tolist() == [4]
    assert t.links["ext_id"].tolist() == [4] and t.links["runtime_idx"].tolist() == [0]
    assert t.memory["bytes"].tolist() == [32] and t.memory["ts"].tolist() == [53.0]
    assert t.counts["async"] == 2


@pytest.mark.parametrize(
    "name, step_ms, loader_ms",
    [("resnet50_num_workers_0", 174.8, 69.3), ("resnet50_num_workers_4", 139.7, 1.4)],
)
def test_era_2021_pytorch_1_8_operator_scopes(name, step_ms, loader_ms):
    """Capitalised categories, scopes as Operator events, "external id", [memory] without a category."""
    path = trace(f"kineto_2021/{name}.pt.trace.json.gz")
    events = events_of(path)
    raw = raw_summary(events)
    t = load(path)
    check_against_raw(t, raw)
    # the README's numbers, from the raw JSON and from the frames
    raw_steps = sorted(raw["steps"].items())
    assert [n for n, _ in raw_steps] == [5, 6, 7, 8, 9, 10]
    assert round(sum(d for _, d in raw_steps) / 6 / 1e3, 1) == step_ms
    assert round(sum(raw["dataloader"]) / len(raw["dataloader"]) / 1e3, 1) == loader_ms
    assert t.steps["step"].tolist() == [5, 6, 7, 8, 9, 10]
    assert round(t.steps["dur"].mean() / 1e3, 1) == step_ms
    dl = t.annotations[t.annotations["kind"] == "dataloader"]
    assert round(dl["dur"].mean() / 1e3, 1) == loader_ms
    assert kinds(t) == {"step": 6, "dataloader": 6, "optimizer": 12}
    assert not t.cpu_ops["name"].astype(str).str.startswith(SCOPES).any()
    # the device and runtime events' "external id" fills ext_id
    for frame, cats in ((t.kernels, {"Kernel"}), (t.runtime, {"Runtime"}), (t.memcpy, {"Memcpy", "Memset"})):
        expect = sorted(e["args"]["external id"] for e in events if e.get("cat") in cats)
        assert sorted(frame["ext_id"].tolist()) == expect and min(expect) >= 0
    assert t.counts["async"] == sum(e.get("cat") == "async" for e in events)
    raw_bytes = sum(e["args"]["Bytes"] for e in events if e.get("name") == "[memory]")
    assert int(t.memory["bytes"].sum()) == raw_bytes
    assert len(t.links) == raw["kernels_linked"] + len(t.memcpy)  # every kernel, memcpy and memset


def test_era_2022_async_cpu_to_gpu_flows():
    """PyTorch ~1.12 (mid 2022): lower-case categories, user_annotation scopes, async_cpu_to_gpu flows."""
    path = trace("hta/trace_diff/control/control.json.gz")
    events = events_of(path)
    raw = raw_summary(events)
    t = load(path)
    check_against_raw(t, raw)
    assert kinds(t) == {"step": 6, "dataloader": 6, "optimizer": 12, "other": 264}
    assert t.counts["async_cpu_to_gpu"] == sum(e.get("cat") == "async_cpu_to_gpu" for e in events)
    assert raw["kernels_linked"] == raw["kernels"] > 0
    # this era's runtime and device External id is the correlation id, not the launching op's
    rt = t.runtime
    assert (rt["ext_id"] == rt["correlation"]).all()


def test_era_2023_ac2g_integer_microseconds():
    """PyTorch ~1.13-2.2 (late 2022 - early 2024): ac2g flows, "Ev Idx", integer µs, and the runtime
    and device External id is still the correlation id."""
    path = trace("param/dlrm_kineto_8rank/worker0_step_12.1694128201545.pt.trace.json.gz")
    raw = raw_summary(events_of(path))
    t = load(path)
    check_against_raw(t, raw)
    assert kinds(t) == {"step": 1, "dataloader": 1, "optimizer": 2, "other": 36}
    assert raw["kernels_linked"] == raw["kernels"] > 0 and raw["launches"] > 0


def test_era_2023_cuda_sync_events():
    """enable_cuda_sync_events (2023 on): cuda_sync device events, each linked to its runtime call."""
    path = trace("hta/critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz")
    events = events_of(path)
    raw = raw_summary(events)
    t = load(path)
    check_against_raw(t, raw)
    assert raw["syncs"] == raw["syncs_linked"] == len(t.syncs) > 0
    linked = t.links[t.links["gpu_kind"] == "sync"]
    calls = set(t.runtime["kind"].to_numpy()[linked["runtime_idx"].to_numpy()])
    assert calls <= {"sync", "wait_event", "event"}
    raw_kinds = Counter(e["args"]["cuda_sync_kind"] for e in events if e.get("cat") == "cuda_sync")
    assert dict(Counter(t.syncs["sync_kind"].astype(str))) == dict(raw_kinds)


def test_era_2024_python_function_driver_gpu_annotations():
    """PyTorch 2.3+: baseTimeNanoseconds with fractional µs, python_function, cuda_driver launches,
    gpu_user_annotation, cpu_instant_event memory, overhead events."""
    path = trace("tracelens/h100__google_owlv2-large-patch14-ensemble__1016001.json.gz")
    events = events_of(path)
    raw = raw_summary(events)
    t = load(path)
    check_against_raw(t, raw)
    assert raw["python"] > 0 and raw["driver"] > 0 and raw["gpu_annotations"] > 0 and raw["memory"] > 0
    assert kinds(t)["dataloader"] == 6 and len(t.steps) == 1
    assert raw["kernels_by_launch"] == raw["kernels_linked"] == raw["kernels"]
    driver = t.runtime[t.runtime["api"] == "driver"]
    assert set(driver["name"].astype(str)) == {e["name"] for e in events if e.get("cat") == "cuda_driver"}
    assert (t.kernels["ext_id"] >= 0).all()


def test_era_rocm_hip_runtime():
    """ROCm (roctracer): hip* calls in cuda_runtime, no cbid; kernels queued before the window
    carry no External id and no launch; the others' External id reaches the ops."""
    path = trace("tracelens/mi300__resnet_act_checkpoint.json.gz")
    events = events_of(path)
    raw = raw_summary(events)
    t = load(path)
    check_against_raw(t, raw)
    assert "roctracer_version" in t.meta.versions
    assert not any("cbid" in e.get("args", {}) for e in events)
    launches = set(t.runtime.loc[t.runtime["kind"] == "launch", "name"].astype(str))
    assert launches and all(n.startswith("hip") and n.endswith("LaunchKernel") for n in launches)
    assert kinds(t) == {"step": 3, "optimizer": 6, "other": 15}
    # the kernels without an External id are the unlinked ones (queued before the window)
    raw_ext = [e["args"].get("External id", -1) for e in events if e.get("cat") == "kernel"]
    assert sorted(t.kernels["ext_id"].tolist()) == sorted(raw_ext)
    assert sum(x < 0 for x in raw_ext) == raw["kernels"] - raw["kernels_linked"] > 0


def test_era_cpu_only():
    """No device categories at all (gloo / CPU training)."""
    path = trace("hta/cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    raw = raw_summary(events_of(path))
    t = load(path)
    check_against_raw(t, raw)
    assert not t.has_device and len(t.steps) == 1


def test_era_cpu_only_recorded_torch_2_13():
    """This repository's own recording (torch 2.13, CPU): python_function, fwdbwd flows, DataLoader."""
    path = ROOT / "benchmarks/scenarios/recorded/loader_slow_reads/bad/rank0.capture-profile.json.gz"
    raw = raw_summary(events_of(path))
    t = load(path)
    check_against_raw(t, raw)
    assert len(t.steps) == 6 and kinds(t)["dataloader"] == len(raw["dataloader"]) > 0 and raw["python"] > 0


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gzip"])
def test_bare_event_list(tmp_path, gz):
    """Chrome's array form (a bare list of events, no traceEvents object) loads like the object form."""
    src = trace("hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    events = events_of(src)
    data = json.dumps(events).encode()
    path = tmp_path / ("list.json.gz" if gz else "list.json")
    path.write_bytes(gzip.compress(data) if gz else b"\n " + data)
    t, ref = load(path), load(src)
    check_against_raw(t, raw_summary(events))
    frames = ("cpu_ops", "annotations", "gpu_annotations", "kernels", "runtime", "memcpy", "links", "steps")
    for frame in frames:
        assert len(getattr(t, frame)) == len(getattr(ref, frame)) > 0, frame
    assert t.steps["dur"].tolist() == ref.steps["dur"].tolist()
