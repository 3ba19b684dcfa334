"""Host-side habits that cost step time (issue 20, CPU cases C-CPU-029..045): the facts of
analyzers/host/pyframes.py, the new fields of ``compilation`` and ``optimizer_step``, and the
``zero_grad``, ``ddp_buffer_broadcast``, ``data_parallel``, ``sync_batchnorm``,
``device_allocation``, ``graph_capture`` and ``npu_task_queue`` facts, each on a tiny hand-made
trace whose numbers are worked out in the comments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hermes_kb
from hermes_kb.analyzers.host import cpu as A
from hermes_kb.analyzers.host import dispatch as D
from hermes_kb.analyzers.host import pyframes as P
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, ascend_x, write_trace

RECORDED = Path(__file__).resolve().parents[1] / "benchmarks" / "scenarios" / "recorded"


def ctx_of(path):
    return step_context(hermes_kb.load(path)[0])[0]


def facts(mod, tmp_path, ev, kind):
    ctx = ctx_of(write_trace(tmp_path / "t.json", ev))
    return [f for f in mod.per_rank(ctx) if f.kind == kind and f.step is None], ctx


def PY(name, ts, dur, pid_, parent=None, tid=1):
    args = {"Python id": pid_}
    if parent is not None:
        args["Python parent id"] = parent
    return X("python_function", name, ts, dur, tid=tid, args=args)


def K(name, ts, dur, corr, stream=7):
    return X("kernel", name, ts, dur, pid=0, tid=stream, args={"device": 0, "stream": stream, "correlation": corr})


def RT(name, ts, dur, corr, tid=1):
    return X("cuda_runtime", name, ts, dur, tid=tid, args={"correlation": corr})


STEPS = [X("user_annotation", "ProfilerStep#1", 0, 1000), X("user_annotation", "ProfilerStep#2", 1000, 1000)]


# ---------------------------------------------------------------- pyframes


def test_autograd_anomaly(tmp_path):
    # Step 1: a forward linear [100, 300) whose node captures the stack: format_stack frame
    # [150, 250) (100 µs) inside it. Step 2: one backward node [1100, 1300) with its function
    # (AddmmBackward0 [1100, 1200)) and the anomaly check: isnan [1200, 1220) (with ne inside),
    # _is_any_true [1220, 1240), item [1240, 1250); a second node [1400, 1450) without a check;
    # an item elsewhere (in a node without isnan) is not a check.
    ev = STEPS + [
        X("cpu_op", "aten::linear", 100, 200),
        PY("torch/fx/traceback.py(497): format_stack", 150, 100, 1),
        PY("traceback.py(217): extract_stack", 160, 50, 2, parent=1),
        X("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 1100, 200),
        X("cpu_op", "AddmmBackward0", 1100, 100),
        X("cpu_op", "aten::isnan", 1200, 20),
        X("cpu_op", "aten::ne", 1205, 10),
        X("cpu_op", "aten::_is_any_true", 1220, 20),
        X("cpu_op", "aten::item", 1240, 10),
        X("cpu_op", "autograd::engine::evaluate_function: ReluBackward0", 1400, 50),
        X("cpu_op", "aten::item", 1420, 10),
    ]
    (f,), _ = facts(P, tmp_path, ev, "autograd_anomaly")
    assert f.nan_checks_count == 1 and f.nan_check_us == pytest.approx(20 + 20 + 10)
    assert f.stack_captures_count == 1 and f.stack_capture_us == pytest.approx(100)
    assert f.anomaly_us == pytest.approx(150) and f.anomaly_ratio == pytest.approx(150 / 2000)
    assert f.stacks_recorded


def test_no_anomaly_no_fact(tmp_path):
    ev = STEPS + [X("cpu_op", "autograd::engine::evaluate_function: ReluBackward0", 1400, 50),
                  X("cpu_op", "aten::item", 1420, 10), PY("train.py(10): step", 0, 900, 1)]  # fmt: skip
    assert facts(P, tmp_path, ev, "autograd_anomaly")[0] == []


def test_tensor_formatting_without_its_device_wait(tmp_path):
    # Step 1: f"{logits}" -> Tensor.__format__ [100, 400) with _tensor_str frames inside and an
    # aten::item [150, 350) (its _local_scalar_dense inside counts once) blocked in a
    # cudaStreamSynchronize [160, 340) (180 µs waiting for the device). Step 2: repr [1100, 1150).
    # format_us = 300 + 50 - 180 = 170; blocking_us = 180; 2 calls in 2 steps; 1 element read.
    ev = STEPS + [
        PY("torch/_tensor.py(1136): __format__", 100, 300, 1),
        PY("torch/_tensor_str.py(712): _str", 110, 280, 2, parent=1),
        X("cpu_op", "aten::item", 150, 200),
        X("cpu_op", "aten::_local_scalar_dense", 151, 198),
        RT("cudaStreamSynchronize", 160, 180, 9),
        PY("torch/_tensor.py(558): __repr__", 1100, 50, 3),
        PY("train.py(20): log", 1090, 80, 4),
    ]
    (f,), _ = facts(P, tmp_path, ev, "tensor_formatting")
    assert f.calls_count == 2 and f.calls_per_step == 1.0
    assert f.blocking_us == pytest.approx(180) and f.format_us == pytest.approx(170)
    assert f.format_ratio == pytest.approx(170 / 2000) and f.item_calls_count == 1


def test_tensor_formatting_read_back_is_a_wait_on_a_device_rank(tmp_path):
    # No runtime sync event (as on Ascend level 0): on a rank with device work the read-back
    # operator aten::item [150, 350) is the wait, 200 µs; format_us = 300 + 50 - 200 = 150.
    # Without device work the same item is the printer's own element read: nothing is blocked.
    ev = STEPS + [
        PY("torch/_tensor.py(1136): __format__", 100, 300, 1),
        X("cpu_op", "aten::item", 150, 200),
        X("cpu_op", "aten::_local_scalar_dense", 151, 198),
        PY("torch/_tensor.py(558): __repr__", 1100, 50, 3),
    ]
    (f,), _ = facts(P, tmp_path, ev + [K("sm80_gemm", 10, 80, 5), RT("cudaLaunchKernel", 5, 4, 5)], "tensor_formatting")
    assert f.blocking_us == pytest.approx(200) and f.format_us == pytest.approx(150)
    (c,), _ = facts(P, tmp_path, ev, "tensor_formatting")
    assert c.blocking_us == pytest.approx(0) and c.format_us == pytest.approx(350)


def test_module_hooks(tmp_path):
    # Step 1: Linear's call wrapper [100, 400) runs forward [110, 200) (not a hook), a user forward
    # hook [210, 260), torch/utils/hooks.py's setup [270, 300) (machinery) and a torch-internal
    # hook [310, 330) (not counted: torch/...). Step 2: a BackwardHookFunctionBackward node
    # [1100, 1140) inside its engine wrapper [1098, 1142), and the wrapper's hook path
    # (module.py `inner` [1190, 1220), taken only for hooked modules) with a user hook frame
    # [1200, 1210) and no forward: all 30 µs of it count.
    # hook_us = 50 + 30 + 44 + 30 = 154; 2 hook calls; 1 backward hook node.
    ev = STEPS + [
        PY("torch/nn/modules/module.py(1782): _call_impl", 100, 300, 1),
        PY("torch/nn/modules/linear.py(130): forward", 110, 90, 2, parent=1),
        PY("train.py(18): watch", 210, 50, 3, parent=1),
        PY("torch/utils/hooks.py(200): setup_output_hook", 270, 30, 4, parent=1),
        PY("torch/distributed/fsdp/_fully_shard/_fsdp_state.py(200): _pre_forward", 310, 20, 5, parent=1),
        X("cpu_op", "autograd::engine::evaluate_function: BackwardHookFunctionBackward", 1098, 44),
        X("cpu_op", "BackwardHookFunctionBackward", 1100, 40),
        PY("torch/nn/modules/module.py(1794): inner", 1190, 30, 6),
        PY("monitor.py(5): <lambda>", 1200, 10, 7, parent=6),
    ]
    (f,), _ = facts(P, tmp_path, ev, "module_hooks")
    assert f.hook_calls_count == 2 and f.hook_calls_per_step == 1.0
    assert f.backward_hook_nodes_count == 1
    assert f.hook_us == pytest.approx(154) and f.hook_ratio == pytest.approx(154 / 2000)


def test_object_construction(tmp_path):
    # Step 1: nn.Linear built in forward: linear.py __init__ [100, 300) -> module.py __init__
    # [110, 120) and reset_parameters [130, 290). Step 2: an optimizer built [1100, 1150)
    # (optimizer.py __init__ inside adamw.py __init__). A Module.__init__ inside the DataLoader's
    # next() (a transform built per sample) is not counted.
    ev = STEPS + [
        PY("torch/nn/modules/linear.py(96): __init__", 100, 200, 1),
        PY("torch/nn/modules/module.py(476): __init__", 110, 10, 2, parent=1),
        PY("torch/nn/modules/linear.py(117): reset_parameters", 130, 160, 3, parent=1),
        PY("torch/optim/adamw.py(20): __init__", 1100, 50, 4),
        PY("torch/optim/optimizer.py(370): __init__", 1105, 40, 5, parent=4),
        X("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1500, 100),
        PY("torch/nn/modules/module.py(476): __init__", 1510, 20, 6),
    ]
    (f,), _ = facts(P, tmp_path, ev, "object_construction")
    assert (f.modules_count, f.optimizers_count) == (1, 1) and f.constructions_per_step == 1.0
    assert f.construction_us == pytest.approx(250) and f.construction_ratio == pytest.approx(250 / 2000)


def test_gc_collect_calls(tmp_path):
    # gc.collect() at [800, 900) in step 1 and [1700, 1740) in step 2
    ev = STEPS + [
        PY("<built-in method collect of module object at 0x7f00>", 800, 100, 1),
        X("python_function", "Python GC", 805, 90),
        PY("<built-in method collect of module object at 0x7f00>", 1700, 40, 2),
    ]
    (f,), ctx = facts(P, tmp_path, ev, "gc_collect_calls")
    # the recorded collection lies inside the first call: an explicit one (C-CPU-011 stands aside)
    (g,) = [x for x in A.per_rank(ctx) if x.kind == "gc_pauses"]
    assert g.gc_count == 1 and g.explicit_count == 1 and g.explicit_ratio == 1.0
    assert f.calls_count == 2 and f.calls_per_step == 1.0 and f.steps_with_call_ratio == 1.0
    assert f.collect_us == 140 and f.longest_us == 100 and f.collect_ratio == pytest.approx(140 / 2000)


# ---------------------------------------------------------------- compilation: calls of compiled code


def test_compiled_calls_graph_breaks(tmp_path):
    # Per step two forward regions of different frames (0/0 then the resume function 1/0) and a
    # backward; each call has a guard check (5 µs) before it and generated code inside:
    # step 1: lookup [95, 100), region 0/0 [100, 200) with FX [120, 180); lookup [295, 300), region
    # 1/0 [300, 350) with FX [310, 340); CompiledFunctionBackward [500, 600) with FX [510, 590).
    # wrapper = 5 + 40 + 5 + 20 + 20 = 90 per step; step 2 the same shifted by 1000.
    # regions_per_step = 2 -> wrapper_excess = 180 x (1 - 1/2) = 90.
    ev = list(STEPS)
    for b in (0, 1000):
        ev += [
            X("cpu_op", "TorchDynamo Cache Lookup", b + 95, 5),
            X("cpu_op", "Torch-Compiled Region: 0/0", b + 100, 100),
            X("user_annotation", "## Call CompiledFxGraph abc ##", b + 120, 60),
            PY("model.py(12): torch_dynamo_resume_in_forward_at_12", b + 290, 70, 10 + b),
            X("cpu_op", "TorchDynamo Cache Lookup", b + 295, 5),
            X("cpu_op", "Torch-Compiled Region: 1/0", b + 300, 50),
            X("user_annotation", "## Call CompiledFxGraph def ##", b + 310, 30),
            X("cpu_op", "CompiledFunctionBackward", b + 500, 100),
            X("user_annotation", "## Call CompiledFxGraph ghi ##", b + 510, 80),
        ]
    ctx = ctx_of(write_trace(tmp_path / "t.json", ev))
    (c,) = [f for f in A.per_rank(ctx) if f.kind == "compilation" and f.step is None]
    assert c.forward_regions_count == 4 and c.regions_per_step == 2.0
    assert c.distinct_frames_max == 2 and c.frame_calls_max == 1 and c.resume_frames_count == 2
    assert c.wrapper_us == pytest.approx(180) and c.wrapper_ratio == pytest.approx(180 / 2000)
    assert c.wrapper_excess_us == pytest.approx(90) and c.wrapper_excess_ratio == pytest.approx(90 / 2000)
    assert c.region_device_idle_us is None  # CPU only


def test_compiled_calls_without_generated_code_marks(tmp_path):
    # a region without '## Call CompiledFxGraph ##' inside: the wrapper time is unknown
    ev = STEPS + [X("cpu_op", "Torch-Compiled Region: 0/0", 100, 100), X("cpu_op", "Torch-Compiled Region: 0/0", 300, 100)]
    ctx = ctx_of(write_trace(tmp_path / "t.json", ev))
    (c,) = [f for f in A.per_rank(ctx) if f.kind == "compilation" and f.step is None]
    assert c.frame_calls_max == 2 and c.wrapper_us is None and c.wrapper_excess_us is None
    assert c.resume_frames_count is None  # no Python stacks


# ---------------------------------------------------------------- dispatch: framework operators


def test_zero_grad_fills_and_accumulation(tmp_path):
    # zero_grad [100, 200) in step 1 with two aten::zero_ (fill_ inside each) launching a fill
    # kernel each; zero_grad [1100, 1120) in step 2 with nothing inside (set_to_none). Backward in
    # step 2: two AccumulateGrad nodes, one adding into an existing gradient (aten::add_).
    ev = STEPS + [
        X("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", 100, 100),
        X("cpu_op", "aten::zero_", 110, 30), X("cpu_op", "aten::fill_", 112, 25), RT("cudaLaunchKernel", 115, 10, 1),
        X("cpu_op", "aten::zero_", 150, 30), X("cpu_op", "aten::fill_", 152, 25), RT("cudaLaunchKernel", 155, 10, 2),
        K("fill_kernel", 130, 3, 1), K("fill_kernel", 170, 3, 2),
        X("user_annotation", "Optimizer.zero_grad#SGD.zero_grad", 1100, 20),
        X("cpu_op", "torch::autograd::AccumulateGrad", 1500, 20), X("cpu_op", "aten::add_", 1505, 10),
        X("cpu_op", "torch::autograd::AccumulateGrad", 1600, 10), X("cpu_op", "aten::detach", 1602, 5),
    ]  # fmt: skip
    (z,), _ = facts(D, tmp_path, ev, "zero_grad")
    assert z.optimizer == "SGD" and z.calls_count == 2 and z.zero_grad_us == 120
    assert z.zero_grad_ratio == pytest.approx(120 / 2000)
    assert z.fill_ops_count == 2 and z.fills_gradients and z.device_work_count == 2
    assert z.accumulate_add_count == 1


def test_optimizer_device_idle(tmp_path):
    # optimizer.step [100, 300) launches a kernel running [150, 250): the device idles 100 of the 200 µs
    ev = STEPS + [
        X("user_annotation", "Optimizer.step#AdamW.step", 100, 200), X("cpu_op", "aten::_foreach_add_", 110, 20),
        RT("cudaLaunchKernel", 115, 10, 1), K("multi_tensor_apply_kernel", 150, 100, 1),
    ]  # fmt: skip
    (o,), _ = facts(D, tmp_path, ev, "optimizer_step")
    assert o.implementation == "foreach" and o.device_idle_us == pytest.approx(100)
    assert o.device_idle_ratio == pytest.approx(100 / 2000)


def test_ddp_buffer_broadcast(tmp_path):
    # DistributedDataParallel.forward [100, 900) in step 1: flatten [110, 130), broadcast
    # [130, 140), record_param_comms [140, 142), unflatten [145, 185), three copies back
    # [190, 200), [200, 210), [210, 220); then the model's conv [300, 800). Phase = [110, 220) = 110.
    ev = STEPS + [
        X("user_annotation", "DistributedDataParallel.forward", 100, 800),
        X("cpu_op", "aten::flatten_dense_tensors", 110, 20), X("cpu_op", "c10d::broadcast_", 130, 10),
        X("cpu_op", "record_param_comms", 140, 2), X("cpu_op", "aten::unflatten_dense_tensors", 145, 40),
        X("cpu_op", "aten::copy_", 190, 10), X("cpu_op", "aten::copy_", 200, 10), X("cpu_op", "aten::copy_", 210, 10),
        X("cpu_op", "aten::conv2d", 300, 500),
    ]  # fmt: skip
    (b,), _ = facts(D, tmp_path, ev, "ddp_buffer_broadcast")
    assert (b.forward_calls_count, b.broadcasts_count, b.copies_count) == (1, 1, 3)
    assert b.broadcast_host_us == pytest.approx(110) and b.broadcast_ratio == pytest.approx(110 / 2000)


def test_data_parallel(tmp_path):
    # replicate [100, 150), scatter [160, 170), gather [600, 620) in step 1; the reduce of the
    # gradients [1700, 1740) and a BroadcastBackward [1750, 1760) in step 2: 50+10+20+40+10 = 130
    ev = STEPS + [
        X("cpu_op", "Broadcast", 100, 50), X("cpu_op", "Scatter", 160, 10), X("cpu_op", "Gather", 600, 20),
        X("cpu_op", "ReduceAddCoalesced", 1700, 40), X("cpu_op", "BroadcastBackward", 1750, 10),
        X("cpu_op", "aten::mm", 300, 100, tid=2),
    ]  # fmt: skip
    (d,), _ = facts(D, tmp_path, ev, "data_parallel")
    assert (d.replicate_calls_count, d.scatter_gather_calls_count, d.reduce_calls_count) == (1, 2, 1)
    assert d.dp_host_us == pytest.approx(130) and d.threads_count == 2


def test_scatter_alone_is_not_data_parallel(tmp_path):
    assert facts(D, tmp_path, STEPS + [X("cpu_op", "Scatter", 160, 10)], "data_parallel")[0] == []


def test_sync_batchnorm(tmp_path):
    # SyncBatchNorm forward [100, 300) blocks in cudaStreamSynchronize [150, 250) (100 µs); a second
    # forward [400, 450) without a sync; its backward [1100, 1200)
    ev = STEPS + [
        X("cpu_op", "SyncBatchNorm", 100, 200), RT("cudaStreamSynchronize", 150, 100, 1),
        X("cpu_op", "SyncBatchNorm", 400, 50), X("cpu_op", "SyncBatchNormBackward", 1100, 100),
        RT("cudaLaunchKernel", 410, 5, 2), K("bn_kernel", 420, 10, 2),
    ]  # fmt: skip
    (s,), _ = facts(D, tmp_path, ev, "sync_batchnorm")
    assert (s.forward_calls_count, s.backward_calls_count) == (2, 1)
    assert s.syncbn_us == pytest.approx(350) and s.blocking_us == pytest.approx(100) and s.blocking_calls_count == 1
    assert s.blocking_ratio == pytest.approx(100 / 2000)


# ---------------------------------------------------------------- runtime calls


def test_device_allocation(tmp_path):
    # before the steps: cudaMalloc [-500, -400) (warm-up, not counted). Step 1: cudaMalloc [100, 130),
    # cudaFree [200, 260) and a torch.cuda.empty_cache() frame around it; step 2: cudaHostAlloc
    # [1100, 1180). Device: 30 + 60 = 90 µs in 2 calls, in 1 of 2 steps; pinned: 80 µs.
    ev = [X("user_annotation", "ProfilerStep#0", -1000, 1000)] + STEPS + [
        RT("cudaMalloc", -500, 100, 1),
        RT("cudaMalloc", 100, 30, 2), PY("<built-in function _cuda_emptyCache>", 190, 80, 1), RT("cudaFree", 200, 60, 3),
        RT("cudaHostAlloc", 1100, 80, 4), RT("cudaLaunchKernel", 1300, 5, 5), K("k", 1310, 5, 5),
    ]  # fmt: skip
    ctx = ctx_of(write_trace(tmp_path / "t.json", ev))
    ctx.windows = [w for w in ctx.windows if w.step != 0]  # analyse steps 1 and 2 only
    (a,) = [f for f in A.per_rank(ctx) if f.kind == "device_allocation"]
    assert (a.malloc_count, a.free_count, a.alloc_us) == (1, 1, 90.0)
    assert a.alloc_ratio == pytest.approx(90 / 2000) and a.steps_with_alloc_ratio == 0.5
    assert (a.host_alloc_count, a.host_alloc_us) == (1, 80.0) and a.empty_cache_calls_count == 1


def test_graph_capture(tmp_path):
    # step 1: capture [100, 400) (begin [100, 110) ... end [390, 400)), instantiate [420, 520);
    # step 2: the graph launched. capture 300 + instantiate 100 = 400 µs
    ev = STEPS + [
        RT("cudaStreamBeginCapture", 100, 10, 1), RT("cudaStreamGetCaptureInfo", 200, 1, 2),
        RT("cudaStreamEndCapture", 390, 10, 3), RT("cudaGraphInstantiateWithFlags", 420, 100, 4),
        RT("cudaGraphLaunch", 1100, 20, 5), K("k", 1130, 50, 5),
    ]  # fmt: skip
    ctx = ctx_of(write_trace(tmp_path / "t.json", ev))
    (g,) = [f for f in A.per_rank(ctx) if f.kind == "graph_capture"]
    assert (g.captures_count, g.capture_us, g.instantiations_count, g.instantiate_us) == (1, 300.0, 1, 100.0)
    assert g.graph_launches_count == 1 and g.capture_ratio == pytest.approx(400 / 2000)


def _ascend(tmp: Path, queue: bool) -> Path:
    """Two 1000 µs steps on the Python thread (tid 7); two operator launches in step 1, on the
    Python thread (task queue off) or on a second thread (tid 8) behind Enqueue / Dequeue events."""
    ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "Python"}},
          {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "CANN"}},
          ascend_x(1, "ProfilerStep#1", 1000, 1000, "cpu_op"), ascend_x(1, "ProfilerStep#2", 2000, 1000, "cpu_op"),
          ascend_x(1, "aten::add", 1010, 5, "cpu_op")]  # fmt: skip
    tid = 8 if queue else 7
    ev += [ascend_x(2, "AscendCL@aclnnAdd", 1100, 40, tid=tid), ascend_x(2, "Node@launch", 1140, 10, tid=tid),
           ascend_x(2, "AscendCL@aclnnMul", 1300, 30, tid=tid), ascend_x(2, "Node@launch", 1330, 10, tid=tid)]  # fmt: skip
    if queue:
        ev += [ascend_x(1, "Enqueue", 1050, 2, "enqueue"), ascend_x(1, "Dequeue@aclnnAdd", 1100, 50, "dequeue", tid=8)]
    out = tmp / "rank0_ascend_pt"
    (out / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (out / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(ev))
    return out


def test_npu_task_queue_off(tmp_path):
    (q,) = [f for f in hermes_kb.analyze(_ascend(tmp_path, queue=False)) if f.kind == "npu_task_queue"]
    # launches (Node@launch) on the Python thread; CANN time there: 40 + 10 + 30 + 10 = 90 µs
    assert not q.queue_enabled and (q.launches_count, q.main_thread_launches_count) == (2, 2)
    assert q.main_thread_launch_ratio == 1.0 and q.main_thread_cann_us == 90.0
    assert q.main_thread_cann_ratio == pytest.approx(90 / 2000)


def test_npu_task_queue_on(tmp_path):
    (q,) = [f for f in hermes_kb.analyze(_ascend(tmp_path, queue=True)) if f.kind == "npu_task_queue"]
    assert q.queue_enabled and (q.enqueue_count, q.dequeue_count) == (1, 1)
    assert q.main_thread_launches_count == 0 and q.main_thread_cann_us == 0.0


def test_state_copies(tmp_path):
    # step 1: copy.deepcopy(model) [100, 400) with a nested deepcopy [120, 200) (counted once) and
    # two aten::clone (copy_ inside one of them: the same copy); step 2: model.state_dict()
    # [1100, 1150). copy_us = 300 + 50 = 350.
    ev = STEPS + [
        PY("copy.py(128): deepcopy", 100, 300, 1),
        PY("copy.py(128): deepcopy", 120, 80, 2, parent=1),
        X("cpu_op", "aten::clone", 130, 20), X("cpu_op", "aten::copy_", 135, 10),
        X("cpu_op", "aten::clone", 250, 20),
        PY("torch/nn/modules/module.py(2100): state_dict", 1100, 50, 3),
    ]
    (f,), _ = facts(P, tmp_path, ev, "state_copies")
    assert (f.deepcopy_calls_count, f.state_dict_calls_count, f.clone_ops_count) == (1, 1, 2)
    assert f.copies_per_step == 1.0 and f.copy_us == pytest.approx(350)
    assert f.copy_ratio == pytest.approx(350 / 2000)


def test_printer_operators_are_not_dispatch(tmp_path):
    # 40 one-element reads (aten::item, 5 µs each, 5 µs apart) inside a tensor __repr__ frame are
    # the printer's: the dispatch fact counts none of them, only the two small muls outside
    ev = STEPS + [PY("torch/_tensor.py(558): __repr__", 100, 500, 1)]
    ev += [X("cpu_op", "aten::item", 105 + 10 * i, 5, args={"Input Dims": [[]]}) for i in range(40)]
    ev += [X("cpu_op", "aten::mul", 700 + 20 * i, 10, args={"Input Dims": [[64], [64]]}) for i in range(2)]
    ctx = ctx_of(write_trace(tmp_path / "t.json", ev))
    (d,) = [f for f in D.per_rank(ctx) if f.kind == "operator_dispatch"]
    assert d.small_ops_count == 2 and d.ops_count == 2


def test_hook_path_minus_forward(tmp_path):
    # a hooked module: `inner` [100, 300) runs forward [120, 260) and nothing else that is a
    # frame: the hook path costs 200 - 140 = 60 µs (argument handling, hook dispatch)
    ev = STEPS + [
        PY("torch/nn/modules/module.py(1782): _call_impl", 95, 210, 1),
        PY("torch/nn/modules/module.py(1794): inner", 100, 200, 2, parent=1),
        PY("torch/nn/modules/linear.py(130): forward", 120, 140, 3, parent=2),
    ]
    (f,), _ = facts(P, tmp_path, ev, "module_hooks")
    assert f.hook_calls_count == 0 and f.hook_us == pytest.approx(60)


# ---------------------------------------------------------------- the recorded scenarios

SCENARIOS = {
    "anomaly_detection": "C-CPU-029", "tensor_logging": "C-CPU-030", "module_hooks": "C-CPU-031",
    "compiled_small_fn": "C-CPU-033", "explicit_gc_collect": "C-CPU-034", "module_in_step": "C-CPU-035",
    "weights_snapshot": "C-CPU-045",
}  # fmt: skip


@pytest.mark.parametrize("scenario,case", sorted(SCENARIOS.items()))
def test_recorded_scenario_leads_with_its_case_and_the_twin_is_quiet(scenario, case):
    bad, fixed = RECORDED / scenario / "bad", RECORDED / scenario / "fixed"
    if not bad.is_dir():
        pytest.skip(f"{scenario} is not recorded")
    rep = hermes_kb.advise(bad)
    assert rep.findings[0].case_id == case
    assert case not in {f.case_id for f in hermes_kb.advise(fixed).findings}
