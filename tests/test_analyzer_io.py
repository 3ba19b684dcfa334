"""The io analyzer: data-loader wait and its make-up, untraced host time, host-to-device copies.

Hand-made traces with every expected value worked out in the comments, the bundled example
(a processing-bound single-process DataLoader), real data-loading traces, and a run over every
real Kineto trace in ../shared/data.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import hermes_kb
from hermes_kb.analyzers.io import io as A
from hermes_kb.analyzers.selection import MAX_STEP_FACTS
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import EXAMPLE, SHARED, X, kineto_traces, needs_shared, write_trace

SINGLE = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
MULTI = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"


def contexts(path):
    return [step_context(t)[0] for t in hermes_kb.load(path)]


def facts_of(ctx, kind, step="any"):
    fs = [f for f in A.per_rank(ctx) if f.kind == kind]
    return fs if step == "any" else [f for f in fs if f.step == step]


def PY(name, ts, dur, pid_, parent=None):
    args = {"Python id": pid_}
    if parent is not None:
        args["Python parent id"] = parent
    return X("python_function", name, ts, dur, args=args)


# Two ProfilerSteps on thread 1: step 1 = [0, 1000), step 2 = [1000, 2000).
SINGLE_TRACE = [
    X("user_annotation", "ProfilerStep#1", 0, 1000),
    X("user_annotation", "ProfilerStep#2", 1000, 1000),
    X("user_annotation", SINGLE, 100, 600),  # the iterator: [100, 700)
    PY("torch/utils/data/dataloader.py(700): __next__", 100, 600, 1),  # covers the whole iterator
    PY("my_data.py(5): transform", 150, 400, 2, parent=1),  # [150, 550): Python processing
    PY(
        "<built-in method read of _io.BufferedReader object at 0x1>", 560, 100, 3, parent=1
    ),  # [560, 660): reading
    X("cpu_op", "aten::stack", 660, 30),  # [660, 690): a cpu op inside the iterator
    X("cpu_op", "aten::mm", 750, 200),  # [750, 950): the model, outside the iterator
    X("cpu_op", "aten::mm", 1100, 800),  # step 2: [1100, 1900)
]


def test_single_process_loader_split_into_processing_and_reading(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", SINGLE_TRACE))
    (f,) = facts_of(ctx, "dataloader_wait", step=1)
    assert f.iterator == "single_process" and f.calls_count == 1
    assert f.wait_us == 600 and f.step_us == 1000 and f.step_share_ratio == pytest.approx(0.6)
    # inside [100, 700): cpu op 30 µs; Python frames cover everything else (570); nothing untraced
    assert (f.cpu_ops_us, f.python_us, f.untraced_us) == (30, 570, 0)
    assert f.cpu_ops_ratio + f.python_ratio + f.untraced_ratio == pytest.approx(1.0)
    assert f.python_stacks
    # reading = self time of the read call = 100; processing = 30 (op) + 570 - 100 = 500
    assert f.reading_us == 100 and f.processing_us == 500
    assert f.fetching_us == 0 and f.worker_wait_us == 0 and f.unattributed_us == 0
    assert f.data_time_us == 600 and f.data_share_ratio == pytest.approx(0.6)
    assert f.classification == "processing" and f.classification_ratio == pytest.approx(500 / 600)
    assert f.critical_path_us is None and f.critical_path_share_ratio is None  # no critical path computed
    # the aggregate covers both steps: 600 µs of 2000
    (agg,) = facts_of(ctx, "dataloader_wait", step=None)
    assert agg.wait_us == 600 and agg.step_us == 2000 and agg.step_share_ratio == pytest.approx(0.3)
    # top Python self time: transform 400, then __next__ itself 600-400-100 = 100 and read 100
    assert agg.top_python[0].name == "my_data.py(5): transform" and agg.top_python[0].time_us == 400
    assert facts_of(ctx, "dataloader_wait", step=2) == []  # no iterator in step 2


def test_untraced_host_time_and_its_gaps(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", SINGLE_TRACE))
    (f,) = facts_of(ctx, "untraced_host_time", step=1)
    # host window [0, 1000); ops and the iterator annotation cover [100, 700) and [750, 950)
    # gaps: [0, 100) = 100, [700, 750) = 50, [950, 1000) = 50 -> 200 µs, none under a python frame
    assert f.window_us == 1000 and f.outside_ops_us == 200 and f.python_us == 0 and f.untraced_us == 200
    assert f.untraced_ratio == pytest.approx(0.2) and f.gaps_count == 3
    assert f.large_gaps_count == 0  # all below 1 ms
    g = f.top_gaps
    assert [(x.start_us, x.end_us) for x in g] == [(0, 100), (700, 750), (950, 1000)]
    assert (g[0].before, g[0].after) == (None, SINGLE)
    assert (g[1].before, g[1].after) == (SINGLE, "aten::mm")
    assert (g[2].before, g[2].after) == ("aten::mm", None)
    # step 2: [1000, 1100) and [1900, 2000) -> 200 µs; aggregate 400 of 2000
    (agg,) = facts_of(ctx, "untraced_host_time", step=None)
    assert agg.untraced_us == 400 and agg.window_us == 2000 and agg.untraced_ratio == pytest.approx(0.2)


def test_python_work_between_ops_is_not_untraced(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 5000),
        X("cpu_op", "aten::add", 0, 1000),
        PY("train.py(10): log_metrics", 1000, 3000, 1),  # Python work, no op: [1000, 4000)
        X("cpu_op", "aten::add", 4500, 500),  # [4000, 4500) is untraced
    ]
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "untraced_host_time", step=1)
    assert f.outside_ops_us == 3500 and f.python_us == 3000 and f.untraced_us == 500
    assert f.large_gaps_count == 1 and f.large_gaps_us == 3500  # one gap [1000, 4500)
    (g,) = f.top_gaps
    assert g.python_function == "train.py(10): log_metrics" and g.untraced_us == 500
    assert (g.before, g.after) == ("aten::add", "aten::add")


def _copy(ts, dur, corr, kind, bytes_, stream=7):
    return X("gpu_memcpy", kind, ts, dur, pid=0, tid=stream,
             args={"device": 0, "stream": stream, "correlation": corr, "bytes": bytes_})  # fmt: skip


# Step 5 = [0, 1000): a multi-process iterator [0, 400) with one op inside, then a pageable copy.
# Step 6 = [1000, 2000): a pinned copy.
MULTI_TRACE = [
    X("user_annotation", "ProfilerStep#5", 0, 1000),
    X("user_annotation", "ProfilerStep#6", 1000, 1000),
    X("user_annotation", MULTI, 0, 400),
    X("cpu_op", "aten::set_", 350, 10),
    X("cpu_op", "aten::to", 435, 235, args={"External id": 3}),
    X("cpu_op", "aten::copy_", 440, 220, args={"External id": 4}),
    X("cuda_runtime", "cudaMemcpyAsync", 450, 200, args={"External id": 4, "correlation": 11}),
    _copy(500, 100, 11, "Memcpy HtoD (Pageable -> Device)", 1_000_000),
    X("cpu_op", "aten::to", 1090, 30, args={"External id": 5}),
    X("cuda_runtime", "cudaMemcpyAsync", 1100, 10, args={"External id": 5, "correlation": 12}),
    _copy(1120, 20, 12, "Memcpy HtoD (Pinned -> Device)", 2_000_000, stream=8),
]


def test_multi_process_loader_waits_for_workers_and_fetching(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", MULTI_TRACE))
    (f,) = facts_of(ctx, "dataloader_wait", step=5)
    assert f.iterator == "multi_process" and not f.python_stacks
    # [0, 400): 10 µs in aten::set_, 390 untraced -> waiting for the workers
    assert (f.cpu_ops_us, f.python_us, f.untraced_us) == (10, 0, 390)
    assert f.worker_wait_us == 390 and f.processing_us == 10 and f.unattributed_us == 0
    # fetching = host time of the HtoD copy call in the step (200); its device time is 100
    assert f.fetching_us == 200 and f.h2d_device_us == 100
    assert f.data_time_us == 600 and f.classification == "worker_wait"
    assert f.classification_ratio == pytest.approx(390 / 600)


def test_critical_path_share_counts_host_segments_only(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", MULTI_TRACE))
    # the device ran a kernel during [0, 300) of the iterator: that part is not the loader's
    ctx.shared["critical_path"] = {5: pd.DataFrame({
        "start_us": [0.0, 300.0, 400.0], "end_us": [300.0, 400.0, 1000.0],
        "category": ["kernel", "host_gap", "cpu_op"], "name": ["k", MULTI, "aten::to"]})}  # fmt: skip
    (f,) = facts_of(ctx, "dataloader_wait", step=5)
    # path 1000 µs; host segments inside the iterator [0, 400): [300, 400) = 100
    assert f.critical_path_us == 1000 and f.critical_path_loader_us == 100
    assert f.critical_path_share_ratio == pytest.approx(0.1)


def test_h2d_copies_pageable_and_pinned(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", MULTI_TRACE))
    got = {f.src: f for f in facts_of(ctx, "h2d_copies")}
    assert set(got) == {"pageable", "pinned"}
    pg, pn = got["pageable"], got["pinned"]
    assert pg.pageable and not pn.pageable
    assert (pg.copies_count, pg.copied_bytes, pg.device_us, pg.host_us) == (1, 1_000_000, 100, 200)
    assert pg.bandwidth_gbps == pytest.approx(10.0)  # 1e6 bytes / 100 µs = 1e4 B/µs = 10 GB/s
    assert pn.bandwidth_gbps == pytest.approx(100.0)  # 2e6 / 20 µs
    assert pg.share_of_h2d_bytes_ratio == pytest.approx(
        1 / 3
    ) and pn.share_of_h2d_bytes_ratio == pytest.approx(2 / 3)


def test_single_process_without_stacks_is_undetermined(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("user_annotation", SINGLE, 0, 800),
        X("cpu_op", "aten::stack", 700, 100),
    ]
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "dataloader_wait", step=1)
    # 700 µs untraced inside a num_workers=0 iterator: I/O or untraced Python, the trace cannot tell
    assert f.unattributed_us == 700 and f.processing_us == 100
    assert f.classification == "undetermined" and f.classification_ratio == pytest.approx(0.875)


def test_per_step_facts_are_capped(tmp_path):
    ev = []
    for i in range(12):
        ev.append(X("user_annotation", f"ProfilerStep#{i}", i * 100, 100))
        ev.append(X("user_annotation", SINGLE, i * 100, 10 + i))
        ev.append(X("cpu_op", "aten::mm", i * 100 + 50, 40))
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    steps = [f.step for f in facts_of(ctx, "dataloader_wait")]
    # 12 steps (the last is not partial: same length), per-step facts for the 8 longest waits + aggregate
    assert len(steps) == MAX_STEP_FACTS + 1 and steps[-1] is None
    assert sorted(steps[:-1]) == list(range(4, 12))


def test_bundled_example_is_processing_bound():
    (ctx,) = contexts(EXAMPLE)
    per_step = facts_of(ctx, "dataloader_wait")
    agg = per_step.pop()
    assert agg.step is None and len(per_step) == 5
    # README: ~91.9% of each step inside the single-process __next__, a heavy numpy transform
    assert agg.iterator == "single_process" and agg.classification == "processing"
    assert 0.85 < agg.step_share_ratio < 0.95
    assert agg.classification_ratio > 0.95 and agg.python_stacks
    assert all(f.classification == "processing" and f.step_share_ratio > 0.85 for f in per_step)
    assert "_transform" in agg.top_python[0].name
    assert facts_of(ctx, "h2d_copies") == []  # CPU only


@needs_shared()
def test_resnet_multiprocess_loader_and_pageable_copies():
    (ctx,) = contexts(SHARED / "param" / "resnet_kineto.json.gz")
    (agg,) = facts_of(ctx, "dataloader_wait", step=None)
    # README: enumerate(DataLoader) 8.2 s of a 16.2 s trace, multiprocess DataLoader; the steps are
    # inferred from the 30 optimizer steps, and the first window (trace start to the first
    # optimizer step's end, 4.8 s of set-up) is left out: the loader's calls after it, from the JSON
    import gzip
    import json

    ev = json.load(gzip.open(SHARED / "param" / "resnet_kineto.json.gz"))["traceEvents"]
    first_opt_end = min(e["ts"] + e["dur"] for e in ev if str(e.get("name", "")).startswith("Optimizer.step#"))
    dl = [e["dur"] for e in ev if str(e.get("name", "")).startswith("enumerate(DataLoader)") and e["ts"] >= first_opt_end]
    assert ctx.excluded_steps == [0]
    assert agg.iterator == "multi_process" and agg.calls_count == len(dl) == 29
    assert agg.wait_us == pytest.approx(sum(dl), rel=0.01)
    assert agg.classification == "worker_wait" and agg.step_share_ratio > 0.5
    (pg,) = facts_of(ctx, "h2d_copies")
    assert pg.src == "pageable" and pg.host_us > pg.device_us


@needs_shared()
def test_owlv2_single_process_loader():
    (ctx,) = contexts(SHARED / "tracelens" / "h100__google_owlv2-large-patch14-ensemble__1016001.json.gz")
    (agg,) = facts_of(ctx, "dataloader_wait", step=None)
    # README: single-process DataLoader 619 ms of a 1211 ms step
    assert agg.wait_us == pytest.approx(619e3, rel=0.01) and agg.step_share_ratio == pytest.approx(
        0.51, abs=0.01
    )
    assert agg.classification == "processing"
    assert agg.top_python[0].name == "<built-in function zoom_shift>"  # scipy resize in the image processor


@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: str(p.relative_to(SHARED)))
def test_every_real_trace(path):
    for ctx in contexts(path):
        for f in A.per_rank(ctx):
            type(f).model_validate(f.model_dump())  # ratios within 0..1, types hold
            assert f.rank == ctx.rank
            if f.kind == "dataloader_wait":
                assert f.cpu_ops_us + f.python_us + f.untraced_us == pytest.approx(f.wait_us, abs=1e-3)
                parts = f.processing_us + f.reading_us + f.fetching_us + f.worker_wait_us + f.unattributed_us
                assert parts == pytest.approx(f.data_time_us, abs=1e-3)
                assert f.wait_us <= f.step_us + 1e-6
                assert f.processing_us >= 0 and f.reading_us >= 0 and f.worker_wait_us >= 0
            elif f.kind == "untraced_host_time":
                assert f.python_us + f.untraced_us == pytest.approx(f.outside_ops_us, abs=1e-3)
                assert f.outside_ops_us <= f.window_us + 1e-6
                assert len(f.top_gaps) <= 3 and f.large_gaps_us <= f.outside_ops_us + 1e-6
            elif f.kind == "h2d_copies":
                assert f.copies_count > 0 and f.copied_bytes >= 0
        n_step = sum(1 for f in A.per_rank(ctx) if f.step is not None)
        assert n_step <= 2 * MAX_STEP_FACTS


def test_python_io_time_is_separated_from_other_python(tmp_path):
    # step [0, 1000): ops cover [0, 100) and [900, 1000); between them Python runs for 800 µs,
    # of which fsync [300, 500) and a write [600, 650) block on I/O: 250 µs of I/O, 800 of Python
    from hermes_kb.analyzers.timeline.steps import step_context
    from hermes_kb.analyzers.io import io as io_an

    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "aten::mm", 0, 100),
        X("cpu_op", "aten::add", 900, 100),
        X("python_function", "train.py(10): step", 100, 800, args={"Python id": 1}),
        X("python_function", "<built-in function fsync>", 300, 200, args={"Python id": 2, "Python parent id": 1}),
        X("python_function", "<built-in method write of _io.TextIOWrapper object at 0x1>", 600, 50,
          args={"Python id": 3, "Python parent id": 1}),  # fmt: skip
    ]
    t = next(iter(hermes_kb.load(write_trace(tmp_path / "t.json", ev))))
    ctx, _ = step_context(t)
    u = next(f for f in io_an.per_rank(ctx) if f.kind == "untraced_host_time" and f.step is None)
    assert u.python_us == 800.0 and u.python_io_us == 250.0
    assert u.python_io_share_ratio == pytest.approx(250 / 800) and u.python_io_ratio == pytest.approx(250 / 1000)


def test_inline_preprocessing_time_is_measured_between_operators(tmp_path):
    # step [0, 1000): ops cover [0, 100) and [900, 1000). Python between them [100, 900): a
    # pipeline's preprocess frame [150, 650) holding an image processor [200, 600), and inside
    # it an operator [300, 350) (an operator, not Python: not counted); model code the rest.
    # Preprocessing between operators = 500 - 50 = 450 µs of the 800 µs of Python.
    from hermes_kb.analyzers.timeline.steps import step_context
    from hermes_kb.analyzers.io import io as io_an

    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "aten::mm", 0, 100),
        X("cpu_op", "aten::add", 900, 100),
        X("cpu_op", "aten::div", 300, 50),
        X("python_function", "run.py(10): step", 100, 800, args={"Python id": 1}),
        X("python_function", "transformers/pipelines/video_classification.py(129): preprocess", 150, 500,
          args={"Python id": 2, "Python parent id": 1}),
        X("python_function", "transformers/models/videomae/image_processing_videomae.py(235): preprocess", 200, 400,
          args={"Python id": 3, "Python parent id": 2}),
        X("python_function", "transformers/modeling_utils.py(1): forward", 700, 150, args={"Python id": 4, "Python parent id": 1}),
    ]  # fmt: skip
    t = next(iter(hermes_kb.load(write_trace(tmp_path / "t.json", ev))))
    ctx, _ = step_context(t)
    u = next(f for f in io_an.per_rank(ctx) if f.kind == "untraced_host_time" and f.step is None)
    assert u.python_us == 750.0  # 800 minus the operator inside
    assert u.python_preprocess_us == 450.0
    assert u.python_preprocess_share_ratio == pytest.approx(450 / 750)
    assert u.python_preprocess_ratio == pytest.approx(450 / 1000)
    assert u.preprocess_frames == ["transformers/pipelines/video_classification.py(129): preprocess"]
    pre = ctx.shared["whatif_sets"]["python_preprocess"]  # the what-if set the case's gain replays
    assert list(zip(pre.host_start, pre.host_end)) == [(150.0, 300.0), (350.0, 650.0)]


@pytest.mark.parametrize("name, hit", [
    ("PIL/Image.py(3210): open", True),
    ("torchvision/transforms/transforms.py(354): forward", True),
    ("transformers/image_processing_utils.py(40): __call__", True),
    ("transformers/models/clip/image_processing_clip.py(300): preprocess", True),
    ("transformers/models/bert/tokenization_bert_fast.py(10): __call__", True),
    ("transformers/pipelines/image_classification.py(150): preprocess", True),
    ("transformers/pipelines/image_classification.py(160): _forward", False),
    ("transformers/models/bert/modeling_bert.py(400): forward", False),
    ("torch/nn/modules/module.py(1743): _call_impl", False),
    ("my_av/model.py(3): forward", False),
    ("numpy/core/fromnumeric.py(50): sum", False),
])
def test_preprocess_frames_by_path(name, hit):
    from hermes_kb.analyzers.io.untraced import PREPROCESS_RE

    assert bool(PREPROCESS_RE.search(name)) is hit


@pytest.mark.parametrize("name,hit", [
    ("json/__init__.py(293): load", True),  # json.load(fp): reads the file
    ("json/__init__.py(179): dump", True),  # json.dump(obj, fp): writes it
    ("/usr/lib/python3.11/json/__init__.py(293): load", True),
    ("json/__init__.py(346): loads", False),  # a string parsed in memory: CPU work, not I/O
    ("json/__init__.py(231): dumps", False),
    ("json/decoder.py(337): decode", False),
    ("pickle.py(1205): load", True),
    ("<built-in method read of _io.BufferedReader object at 0x7f>", True),
])
def test_python_io_frames_json_file_calls_only(name, hit):
    from hermes_kb.analyzers.io.untraced import PYTHON_IO_RE

    assert bool(PYTHON_IO_RE.search(name)) is hit


def test_periodic_io_steps_count_all_they_add(tmp_path):
    # Four steps. Steps 1 and 3: 1000 µs of ops. Steps 2 and 4 save a checkpoint: the same ops, then
    # 3000 µs of save_checkpoint, of which a torch.save frame of 2000 µs (I/O); the other 1000 µs
    # builds the state dict in Python. The quiet steps take 1000 µs, the I/O steps 4000 µs: they add
    # 2 x 3000 µs, the I/O frames 2 x 2000 µs (4000 >= half of 6000: the I/O sets them apart).
    from hermes_kb.analyzers.timeline.steps import step_context
    from hermes_kb.analyzers.io import io as io_an

    ev, pid = [], 1
    for k, t0 in enumerate((0, 1000, 5000, 6000)):
        io_step = k in (1, 3)
        ev += [X("user_annotation", f"ProfilerStep#{k + 1}", t0, 4000 if io_step else 1000),
               X("cpu_op", "aten::mm", t0, 1000)]  # fmt: skip
        if io_step:
            ev += [X("python_function", "train.py(30): save_checkpoint", t0 + 1000, 3000, args={"Python id": pid}),
                   X("python_function", "torch/serialization.py(900): save", t0 + 2000, 2000,
                     args={"Python id": pid + 1, "Python parent id": pid})]  # fmt: skip
            pid += 2
    t = next(iter(hermes_kb.load(write_trace(tmp_path / "t.json", ev))))
    ctx, _ = step_context(t)
    u = next(f for f in io_an.per_rank(ctx) if f.kind == "untraced_host_time" and f.step is None)
    assert u.python_io_us == 4000.0 and u.io_steps_count == 2
    assert u.io_step_excess_us == pytest.approx(6000.0) and u.blocking_io_us == pytest.approx(6000.0)
    # each step alone has no quiet step to compare with: the I/O frames only
    per_step = [f for f in io_an.per_rank(ctx) if f.kind == "untraced_host_time" and f.step is not None]
    assert all(f.io_step_excess_us is None and f.blocking_io_us == f.python_io_us for f in per_step)


def test_the_monitors_own_frames_are_not_python_between_operators(tmp_path):
    # step [0, 2000): ops cover [0, 100) and [1900, 2000); the loop's Python covers [100, 1900), and
    # inside it hermes' monitor samples its resources for [1000, 1600) (600 µs, nested frames):
    # Python between operators is 1800 - 600 = 1200 µs, the monitor's 600 µs are reported apart
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 2000),
        X("cpu_op", "aten::mm", 0, 100),
        X("cpu_op", "aten::add", 1900, 100),
        PY("train.py(10): step", 100, 1800, 1),
        PY("/site-packages/hermes_kb/monitor/recorder.py(202): step", 1000, 600, 2, parent=1),
        PY("/site-packages/hermes_kb/monitor/procs.py(80): scan", 1100, 400, 3, parent=2),
    ]
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "untraced_host_time", step=1)
    assert (f.monitor_us, f.python_us, f.outside_ops_us) == (600, 1200, 1200)
    assert f.gaps_count == 2  # [100, 1000) and [1600, 1900)


def test_pipe_reads_from_worker_handoff_are_worker_wait_not_reading(tmp_path):
    # a multi-process iterator whose only Python work is a read() called by multiprocessing's
    # connection._recv: a batch arriving from a worker (worker wait), not storage reading
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 0, 600),
        X("python_function", "multiprocessing/connection.py(379): _recv", 10, 500, args={"Python id": 1}),
        X("python_function", "<built-in function read>", 20, 480, args={"Python id": 2, "Python parent id": 1}),
        X("cpu_op", "aten::mm", 700, 100),
    ]
    from hermes_kb.analyzers.timeline.steps import step_context

    t = next(iter(hermes_kb.load(write_trace(tmp_path / "t.json", ev))))
    ctx, _ = step_context(t)
    d = next(f for f in A.per_rank(ctx) if f.kind == "dataloader_wait" and f.step is None)
    assert d.reading_us == 0.0 and d.worker_wait_us >= 480.0


# Reading samples out of a zip archive and opening many small files inside the iterator (step 1
# = [0, 1000); two next() calls: [100, 500) and [550, 950)):
#   call 1: zipfile.py read [120, 420) with a zlib decompress [200, 400) inside it
#   call 2: three builtin open() [560, 600), [600, 640), [700, 740) and an os.stat [800, 820)
# archive = union of zip + zlib frames = [120, 420) = 300; archive_ratio = 300 / 800
# opens = 3 open() calls over 2 next() calls = 1.5 per call; open_us = 40 + 40 + 40 + 20 = 140
ARCHIVE_TRACE = [
    X("user_annotation", "ProfilerStep#1", 0, 1000),
    X("user_annotation", SINGLE, 100, 400),
    X("user_annotation", SINGLE, 550, 400),
    PY("torch/utils/data/dataloader.py(700): __next__", 100, 400, 1),
    PY("zipfile/__init__.py(1010): read", 120, 300, 2, parent=1),
    PY("<built-in method decompress of zlib.Decompress object at 0x7f>", 200, 200, 3, parent=2),
    PY("torch/utils/data/dataloader.py(700): __next__", 550, 400, 4),
    PY("<built-in function open>", 560, 40, 5, parent=4),
    PY("<built-in function open>", 600, 40, 6, parent=4),
    PY("<built-in function open>", 700, 40, 7, parent=4),
    PY("<built-in function stat>", 800, 20, 8, parent=4),
    PY("<built-in function open>", 960, 20, 9),  # outside the iterator: not counted
]


def test_archive_members_and_file_opens_in_the_iterator(tmp_path):
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ARCHIVE_TRACE))
    (f,) = facts_of(ctx, "dataloader_wait", step=None)
    assert f.wait_us == 800 and f.calls_count == 2
    assert f.archive_us == pytest.approx(300) and f.archive_ratio == pytest.approx(300 / 800)
    assert f.file_opens_count == 3 and f.opens_per_call == pytest.approx(1.5)
    assert f.open_us == pytest.approx(140) and f.open_ratio == pytest.approx(140 / 800)
    (g,) = [x for x in facts_of(ctx, "dataloader_wait", step=1)]
    assert g.archive_us == pytest.approx(300) and g.file_opens_count == 3


def test_image_decoding_in_the_iterator(tmp_path):
    # one next() [100, 900): PIL ImageFile.load [200, 600) with its decoder [250, 550) inside, and a
    # torchvision decode_jpeg [650, 750): decode = 400 + 100 = 500 of an 800 µs wait
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("user_annotation", SINGLE, 100, 800),
        PY("torch/utils/data/dataloader.py(700): __next__", 100, 800, 1),
        PY("PIL/ImageFile.py(260): load", 200, 400, 2, parent=1),
        PY("<method 'decode' of 'ImagingDecoder' objects>", 250, 300, 3, parent=2),
        PY("torchvision/io/image.py(180): decode_jpeg", 650, 100, 4, parent=1),
    ]
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "dataloader_wait", step=None)
    assert f.decode_us == pytest.approx(500) and f.decode_ratio == pytest.approx(500 / 800)
    assert f.archive_us == 0 and f.file_opens_count == 0


def test_recorded_archive_scenario_reads_as_archive_and_its_twin_does_not():
    # benchmarks/scenarios/loader_compressed_archive: the bad run opens the zip and inflates a
    # member per sample inside next(); its fixed twin indexes an unpacked memory-mapped array
    from hermes_kb.analysis.run_dir import analyze_run_dir

    zoo = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/loader_compressed_archive"

    def wait(variant):
        return next(f for f in analyze_run_dir(zoo / variant).facts if f.kind == "dataloader_wait" and f.step is None)

    bad, fixed = wait("bad"), wait("fixed")
    assert bad.archive_ratio > 0.5 and bad.archive_us > 0.5 * bad.wait_us
    assert not fixed.archive_us
    top = hermes_kb.advise(str(zoo / "bad")).findings[0]
    assert top.case_id == "C-IO-008"
    # the fix removes the work: no CPU-budget cap, the high end reaches the archive's whole share
    assert top.expected_speedup.high > 3.0


def test_waiting_for_a_gloo_collective_is_not_python_between_operators(tmp_path):
    # CPU training with gloo, step [0, 1000) on thread 1: aten::mm [0, 100), then the thread blocks
    # in dist.all_reduce while gloo's thread 2 runs the collective [300, 800) (no operator on
    # thread 1), aten::add [900, 1000); the loop's Python frame covers the whole step. Gaps of
    # thread 1: [100, 900) = 800 µs, of which [300, 800) is waiting for the collective: Python
    # between operators is [100, 300) + [800, 900) = 300 µs in 2 gaps
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "aten::mm", 0, 100),
        X("cpu_op", "aten::add", 900, 100),
        PY("train.py(10): step", 0, 1000, 1),
        X("user_annotation", "gloo:all_reduce", 300, 500, tid=2),
    ]
    (ctx,) = contexts(write_trace(tmp_path / "t.json", ev))
    (f,) = facts_of(ctx, "untraced_host_time", step=1)
    assert (f.outside_ops_us, f.python_us, f.untraced_us, f.gaps_count) == (300, 300, 0, 2)
    # with device activity the rank's collectives are read from the device: nothing changes
    ev.append(X("kernel", "gemm", 0, 50, pid=0, tid=7, args={"device": 0, "stream": 7}))
    (ctx,) = contexts(write_trace(tmp_path / "g.json", ev))
    (f,) = facts_of(ctx, "untraced_host_time", step=1)
    assert (f.outside_ops_us, f.python_us, f.gaps_count) == (800, 800, 1)
