"""Hand-made traces: each variant the reader must handle, with expected values worked out here."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hermes_kb
from conftest import X, write_trace


def one(path):
    b = hermes_kb.load(path)
    assert len(b) == 1
    return next(iter(b))


def test_times_relative_to_earliest_event_and_call_tree(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#3", 1000, 100, tid=5),
        X("cpu_op", "aten::linear", 1010, 50, tid=5, args={"External id": 7, "Input Dims": [[8, 16], [4, 16], [4]],
                                                          "Input type": ["float", "float", "float"]}),  # fmt: skip
        X("cpu_op", "aten::addmm", 1020, 30, tid=5, args={"External id": 8, "Sequence number": 11}),
        X("cpu_op", "aten::copy_", 1025, 5, tid=5, args={"External id": 9}),
        X("cpu_op", "aten::add", 1070, 10, tid=5, args={"External id": 10}),
        X("cpu_op", "aten::mul", 1012, 3, tid=6, args={"External id": 11}),
    ]
    t = one(write_trace(tmp_path / "t.json", ev))
    ops = t.cpu_ops.set_index("ext_id")
    assert ops.loc[7, "ts"] == 10.0 and ops.loc[7, "end"] == 60.0
    assert t.steps.to_dict("records") == [{"step": 3, "ts": 0.0, "dur": 100.0, "end": 100.0}]
    # linear > addmm > copy_ on thread 5; add is top level; mul on another thread is top level
    idx = {int(e): i for i, e in enumerate(t.cpu_ops["ext_id"])}
    assert t.cpu_ops["parent"].iat[idx[8]] == idx[7]
    assert t.cpu_ops["parent"].iat[idx[9]] == idx[8]
    assert t.cpu_ops["depth"].iat[idx[9]] == 2
    assert t.cpu_ops["parent"].iat[idx[10]] == -1 and t.cpu_ops["parent"].iat[idx[11]] == -1
    assert ops.loc[8, "seq"] == 11
    assert json.loads(ops.loc[7, "input_dims"]) == [[8, 16], [4, 16], [4]]
    assert ops.loc[8, "input_dims"] == ""


def test_capitalised_2021_categories_and_string_stream_ids(tmp_path):
    ev = [
        X("Operator", "aten::mm", 100, 20, args={"External id": 1}),
        X("Runtime", "cudaLaunchKernel", 105, 5, args={"External id": 1, "correlation": 42}),
        X("Kernel", "volta_sgemm_128x64_nn", 130, 40, pid=0, tid="stream 7", args={"correlation": 42}),
        X("Memcpy", "Memcpy HtoD (Pageable -> Device)", 180, 10, pid=0, tid="stream 7",
          args={"correlation": 43, "bytes": 4_000_000}),  # fmt: skip
    ]
    t = one(write_trace(tmp_path / "t.json", ev))
    assert len(t.cpu_ops) == 1 and len(t.kernels) == 1 and len(t.runtime) == 1 and len(t.memcpy) == 1
    assert t.kernels["stream"].iat[0] == 7
    assert t.kernels["ext_id"].iat[0] == 1  # filled from the launch
    assert t.runtime["kind"].iat[0] == "launch"
    m = t.memcpy.iloc[0]
    assert (m["kind"], m["src"], m["dst"]) == ("HtoD", "Pageable", "Device")
    assert m["bandwidth_gbps"] == pytest.approx(4_000_000 / (10 * 1e3))  # bytes / µs / 1e3 = GB/s
    assert t.links["gpu_kind"].tolist() == ["kernel"] and t.links["launch_ts"].iat[0] == 5.0


def test_base_time_and_fractional_timestamps_align_ranks(tmp_path):
    # rank 0's clock starts 2 µs after rank 1's: base 1_000_000 ns + ts 3.5 µs vs base 0 + ts 1001.5 µs
    a = write_trace(tmp_path / "rank0.json", [X("cpu_op", "a", 3.5, 1.25)], baseTimeNanoseconds="1000000",
                    distributedInfo={"rank": 0, "world_size": 2})  # fmt: skip
    b = write_trace(tmp_path / "rank1.json", [X("cpu_op", "b", 1001.5, 2.0)],
                    distributedInfo={"rank": 1, "world_size": 2})  # fmt: skip
    bundle = hermes_kb.load(tmp_path)
    assert bundle[0].cpu_ops["ts"].iat[0] == 2.0
    assert bundle[1].cpu_ops["ts"].iat[0] == 0.0
    assert bundle[0].cpu_ops["dur"].iat[0] == 1.25
    assert bundle.origin_us == 1001.5


def test_profiler_step_recorded_twice_is_deduplicated(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 100),
        X("user_annotation", "ProfilerStep#1", 0, 90, tid=2),
        X("user_annotation", "ProfilerStep#2", 100, 100),
        X("cpu_op", "aten::add", 10, 5),
    ]
    t = one(write_trace(tmp_path / "t.json", ev))
    assert t.steps["step"].tolist() == [1, 2] and t.steps["dur"].tolist() == [100.0, 100.0]
    assert any("more than once" in w for w in t.warnings)


def test_cpu_only_trace_and_dataloader_annotation(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#0", 0, 1000),
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 5, 600),
        X("user_annotation", "Optimizer.step#SGD.step", 900, 50),
        X("python_function", "Python GC", 700, 80, args={"Python id": 3, "Python parent id": 1}),
        X("cpu_op", "aten::mm", 650, 200),
    ]
    t = one(write_trace(tmp_path / "t.json", ev))
    assert not t.has_device
    assert sorted(t.annotations["kind"].astype(str)) == ["dataloader", "optimizer", "step"]
    assert t.python["name"].iat[0] == "Python GC" and t.python["parent_id"].iat[0] == 1


def test_collective_kernel_joined_with_record_param_comms(tmp_path):
    ev = [
        X("cpu_op", "record_param_comms", 100, 50, args={
            "External id": 20, "Collective name": "allreduce", "dtype": "BFloat16", "In msg nelems": 1024,
            "Out msg nelems": 1024, "Group size": 4, "Process Group Name": "0", "Process Group Ranks": "[0, 1, 2, 3]"}),
        X("cpu_op", "nccl:all_reduce", 110, 30, args={"External id": 21}),
        X("cuda_runtime", "cudaLaunchKernel", 115, 10, args={"External id": 21, "correlation": 5}),
        X("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 200, 80,
          pid=0, tid=7, args={"correlation": 5, "External id": 21, "stream": 7, "device": 0}),
        X("kernel", "void at::native::elementwise_kernel", 300, 10, pid=0, tid=7, args={"correlation": 6, "stream": 7}),
    ]  # fmt: skip
    t = one(write_trace(tmp_path / "t.json", ev))
    assert len(t.collectives) == 1
    c = t.collectives.iloc[0]
    assert c["source"] == "kernel" and c["kind"] == "all_reduce" and c["collective"] == "allreduce"
    assert c["in_bytes"] == 2048 and c["group_size"] == 4 and c["pg_ranks"] == "[0, 1, 2, 3]"
    assert t.cpu_ops["name"].iat[int(c["cpu_idx"])] == "record_param_comms"
    assert (c["ts"], c["dur"]) == (100.0, 80.0)  # origin is the first event, at 100


def test_cpu_only_collective_kept_from_cpu_op(tmp_path):
    ev = [X("cpu_op", "record_param_comms", 0, 50, args={"Collective name": "broadcast", "dtype": "Float",
                                                         "In msg nelems": 10, "Group size": 2})]  # fmt: skip
    t = one(write_trace(tmp_path / "t.json", ev))
    c = t.collectives.iloc[0]
    assert c["source"] == "cpu" and c["kind"] == "broadcast" and c["in_bytes"] == 40


def test_runtime_kinds(tmp_path):
    names = ["cudaLaunchKernelExC", "cudaGraphLaunch", "cudaStreamSynchronize", "cudaMemcpyAsync", "cudaMalloc",
             "cudaFree", "cudaEventRecord", "cudaStreamWaitEvent", "cudaGetDevice"]  # fmt: skip
    ev = [X("cuda_runtime", n, i * 10, 5) for i, n in enumerate(names)]
    t = one(write_trace(tmp_path / "t.json", ev))
    assert t.runtime["kind"].astype(str).tolist() == [
        "launch", "graph_launch", "sync", "memcpy", "malloc", "free", "event", "wait_event", "other"]  # fmt: skip


def test_chrome_array_form_and_gzip(tmp_path):
    p = tmp_path / "t.json.gz"
    import gzip

    p.write_bytes(gzip.compress(json.dumps([X("cpu_op", "aten::add", 5, 1)]).encode()))
    t = one(p)
    assert t.cpu_ops["name"].tolist() == ["aten::add"]


def test_rank_from_distributed_info_then_filename_then_order(tmp_path):
    write_trace(tmp_path / "worker3.json", [X("cpu_op", "a", 0, 1)])
    write_trace(tmp_path / "zzz.json", [X("cpu_op", "b", 0, 1)])
    write_trace(tmp_path / "rank-9.json", [X("cpu_op", "c", 0, 1)], distributedInfo={"rank": 5})
    b = hermes_kb.load(tmp_path)
    by_file = {t.meta.source.rsplit("/", 1)[-1]: (t.rank, t.meta.rank_source) for t in b}
    assert by_file == {"worker3.json": (3, "filename"), "rank-9.json": (5, "distributedInfo"),
                       "zzz.json": (0, "order")}  # fmt: skip
    assert any("zzz.json: no rank in distributedInfo or file name; numbered 0 by file order" in w for w in b.warnings)


def test_a_rank_taken_by_another_file_is_named_with_the_number_it_got(tmp_path):
    write_trace(tmp_path / "a.json", [X("cpu_op", "a", 0, 1)], distributedInfo={"rank": 1})
    write_trace(tmp_path / "rank1.json", [X("cpu_op", "b", 0, 1)])
    b = hermes_kb.load(tmp_path)
    notes = [w for w in b.warnings if "rank1.json" in w]
    assert len(notes) == 1 and "rank 1 (filename) already taken by another file; numbered 0 by file order" in notes[0]
    assert not any("no rank in distributedInfo" in w for w in b.warnings)


def test_list_of_files_loads_in_parallel_processes(tmp_path):
    paths = [write_trace(tmp_path / f"rank{r}.json", [X("cpu_op", f"op{r}", r * 10, 1)]) for r in range(3)]
    b = hermes_kb.load(paths, max_workers=2)
    assert b.rank_ids == [0, 1, 2]
    assert [t.cpu_ops["ts"].iat[0] for t in b] == [0.0, 10.0, 20.0]


def test_memory_events(tmp_path):
    ev = [
        X("cpu_op", "aten::empty", 0, 5),
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2, "s": "t",
         "args": {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 2048, "Device Id": 0, "Device Type": 1,
                  "Addr": 99}},  # fmt: skip
        {"ph": "i", "cat": "cpu_instant_event", "name": "other", "pid": 1, "tid": 1, "ts": 3, "s": "t"},
    ]
    t = one(write_trace(tmp_path / "t.json", ev))
    assert t.memory[["ts", "bytes", "total_allocated", "device_type"]].to_dict("records") == [
        {"ts": 2.0, "bytes": 512, "total_allocated": 512, "device_type": 1}
    ]
    assert np.isclose(t.time_span()[1], 5.0)


def test_shift_moves_link_times_too(tmp_path):
    # rank 1 starts 100 µs after rank 0: its link times move with its other times
    write_trace(tmp_path / "rank0.json", [X("cpu_op", "a", 1000, 1)], distributedInfo={"rank": 0})
    write_trace(tmp_path / "rank1.json", [
        X("cuda_runtime", "cudaLaunchKernel", 1100, 5, args={"correlation": 1}),
        X("kernel", "k", 1110, 5, pid=0, tid=7, args={"correlation": 1, "stream": 7}),
    ], distributedInfo={"rank": 1})  # fmt: skip
    t = hermes_kb.load(tmp_path)[1]
    assert t.runtime["ts"].iat[0] == 100.0 and t.links["launch_ts"].iat[0] == 100.0
    assert t.kernels["ts"].iat[0] == 110.0 and t.links["gpu_ts"].iat[0] == 110.0


def _walk(tid, ts, end):
    """The stack walk call_tree replaces: in start order per thread, longer first at equal starts."""
    n = len(ts)
    order = sorted(range(n), key=lambda i: (tid[i], ts[i], -(end[i] - ts[i]), i))
    par, dep, stack, prev = [-1] * n, [0] * n, [], None
    for k in order:
        if tid[k] != prev:
            stack, prev = [], tid[k]
        while stack and end[stack[-1]] <= ts[k]:
            stack.pop()
        if stack:
            par[k], dep[k] = stack[-1], dep[stack[-1]] + 1
        stack.append(k)
    return par, dep


def test_call_tree_is_the_stack_walk_on_random_intervals():
    """Nested, partly overlapping, zero-length and equal-start intervals on three threads."""
    import numpy as np

    from hermes_kb.trace.columns import call_tree

    rng = np.random.default_rng(7)
    for _ in range(400):
        n = int(rng.integers(1, 80))
        tid = rng.integers(0, 3, n)
        ts = rng.integers(0, 60, n).astype(float)
        end = ts + rng.integers(0, 25, n)
        par, dep = call_tree(tid, ts, end)
        want_par, want_dep = _walk(tid.tolist(), ts.tolist(), end.tolist())
        assert par.tolist() == want_par and dep.tolist() == want_dep
