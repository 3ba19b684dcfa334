"""Gradient-bucket search (analyzers/comm/buckets.py, fact bucket_search).

The hand-built DDP trace below has its optimum worked out by hand in the comments; the shared
DDP traces are checked against counts and sizes read from their raw JSON."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

import hermes_kb
from hermes_kb.analyzers.comm import buckets as B
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import SHARED, X, needs_shared, write_trace

MIB = 1024 * 1024
ALPHA = 500.0  # µs per collective
BETA = 4 * MIB / 1000.0  # bytes per µs: 1 MiB takes 250 µs, 2 MiB 500 µs

# ----------------------------------------------------------------------------- the tiny DDP trace
#
# One step. The autograd thread (tid 2) produces 8 gradients, g1..g4 of 1 MiB and g5..g8 of
# 2 MiB (fp32: 262144 / 524288 elements), ready on the host at h = 1000, 1050, ..., 1350 µs (the
# end of each inner AccumulateGrad). The device is ahead: each gradient's backward kernel ends
# 2 µs before its h, so every gradient is ready on the device at h. One last backward operator
# (1371-1390) launches a kernel that runs to 1450: the backward's device work ends at E = 1450.
#
# The trace's own bucketing is one bucket per gradient (as with a tiny bucket_cap_mb), issued from
# inside each AccumulateGrad, and the collectives run one after the other with cost
# alpha + bytes / beta = 500 + 250 = 750 µs (1 MiB), 1000 µs (2 MiB):
#   k1..k4: 1000-1750-2500-3250-4000, k5..k8: 4000-5000-6000-7000-8000
# measured exposed = 8000 - 1450 = 6550 µs; the fit (shortest of each size) gives back alpha
# and beta exactly, so the simulator's prediction for these buckets is 6550 too.
#
# The search (every bucket at the cap; cumulative sizes 1,2,3,4,6,8,10,12 MiB at
# t = 1000..1350):
#   cap 1: 6550 (as now)                 cap 2: 7050 - 1450 = 5600
#   cap 3: buckets {1-3}@1100 -> 2350, {4,5}@1200 -> 3600, {6,7}@1300 -> 5100, {8} -> 6100: 4650
#   cap 4: {1-4}@1150 -> 2650, {5,6} -> 4150, {7,8} -> 5650: 4200
#   cap 5, 6: {1-5}@1200 -> 3200, {6-8} -> 5200: 3750
#   cap 7, 8: {1-6}@1250 -> 3750, {7,8} -> 5250: 3800
#   cap 9, 10: {1-7}@1300 -> 4300, {8} -> 5300: 3850
#   cap >= 11: one bucket of 12 MiB at 1350: 1350 + 500 + 3000 = 4850: 3400  <- the optimum
# DDP's default (1 MiB first bucket, then 25 MiB): {1}@1000 -> 1750, {2-8}@1350 starts at 1750
# -> 1750 + 500 + 2750 = 5000: 3550. Recommended: 11 MiB (the smallest reaching 3400), saving
# 6550 - 3400 = 3150 µs.

H = [1000.0 + 50.0 * i for i in range(8)]
NUMEL = [262144] * 4 + [524288] * 4
KERNELS = [(1000.0, 1750.0), (1750.0, 2500.0), (2500.0, 3250.0), (3250.0, 4000.0),
           (4000.0, 5000.0), (5000.0, 6000.0), (6000.0, 7000.0), (7000.0, 8000.0)]  # fmt: skip


def _ddp_events(sized: bool = True, numel=NUMEL, kernels=KERNELS, shapes: bool = True) -> list[dict]:
    ev = [X("user_annotation", "ProfilerStep#1", 0, 10000, tid=1)]
    corr = 100
    for i, (h, n, (ks, ke)) in enumerate(zip(H, numel, kernels)):
        ext = 1000 + 10 * i
        # the gradient's own backward kernel, ending 2 µs before h
        ev.append(X("cuda_runtime", "cudaLaunchKernel", h - 30, 3, tid=2, args={"correlation": corr}))
        ev.append(X("kernel", "void wgrad_kernel", h - 28, 26, pid=0, tid=7,
                    args={"correlation": corr, "stream": 7, "device": 0}))  # fmt: skip
        corr += 1
        ev.append(X("cpu_op", "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", h - 20, 39, tid=2))
        inner_args = {"Input Dims": [[n]], "Input type": ["float"]} if shapes else {}
        ev.append(X("cpu_op", "torch::autograd::AccumulateGrad", h - 15, 15, tid=2, args=inner_args))
        rpc = {"External id": ext, "Collective name": "allreduce", "dtype": "Float", "Group size": 2,
               "Process Group Name": "0", "Process Group Ranks": "[0, 1]"}  # fmt: skip
        if sized:
            rpc.update({"In msg nelems": n, "Out msg nelems": n})
        ev.append(X("cpu_op", "record_param_comms", h + 2, 15, tid=2, args=rpc))
        ev.append(X("cpu_op", "nccl:all_reduce", h + 4, 11, tid=2, args={"External id": ext + 1}))
        ev.append(X("cuda_runtime", "cudaLaunchKernel", h + 6, 3, tid=2, args={"External id": ext + 1, "correlation": corr}))
        ev.append(X("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", ks, ke - ks, pid=0, tid=20,
                    args={"correlation": corr, "External id": ext + 1, "stream": 20, "device": 0}))  # fmt: skip
        corr += 1
    # the last backward kernel, launched after g8 is in place, ends the backward on the device
    ev.append(X("cpu_op", "autograd::engine::evaluate_function: ConvolutionBackward0", 1371, 19, tid=2))
    ev.append(X("cuda_runtime", "cudaLaunchKernel", 1375, 3, tid=2, args={"correlation": corr}))
    ev.append(X("kernel", "void dgrad_kernel", 1380, 70, pid=0, tid=7, args={"correlation": corr, "stream": 7, "device": 0}))
    return ev


def _facts(tmp_path, events, name="ddp.json") -> list:
    p = write_trace(tmp_path / name, events, distributedInfo={"rank": 0, "world_size": 2, "backend": "nccl"})
    bundle = hermes_kb.load(p)
    ctx, _ = step_context(bundle[0])
    return B.per_rank(ctx)


# ----------------------------------------------------------------------------- the simulator itself


def test_cap_boundaries_close_at_the_limit():
    sizes = np.array([1, 1, 1, 1, 2, 2, 2, 2], dtype=float) * MIB
    assert B.cap_boundaries(sizes, 4 * MIB, None).tolist() == [3, 5, 7]  # {1-4}=4, {5,6}=4, {7,8}=4
    assert B.cap_boundaries(sizes, 5 * MIB, None).tolist() == [4, 7]  # {1-5}=6 >= 5, rest
    assert B.cap_boundaries(sizes, 25 * MIB, 1 * MIB).tolist() == [0, 7]  # DDP's 1 MiB first bucket
    assert B.cap_boundaries(sizes, 100 * MIB, None).tolist() == [7]
    assert B.cap_boundaries(np.zeros(0), MIB, None).tolist() == []


def test_simulate_serialises_the_stream():
    ready = np.array([0.0, 100.0, 200.0])
    sizes = np.array([1.0, 1.0, 2.0]) * MIB
    # buckets {1},{2},{3}: 0-750, 750-1500, 1500-2500; backward ends at 1000 -> 1500 exposed
    exposed, starts, ends = B.simulate(ready, sizes, np.array([0, 1, 2]), 1000.0, ALPHA, BETA)
    assert starts.tolist() == [0.0, 750.0, 1500.0]
    assert ends.tolist() == [750.0, 1500.0, 2500.0]
    assert exposed == pytest.approx(1500.0)
    # one bucket at 200: 200 + 500 + 1000 = 1700 -> 700 exposed
    assert B.simulate(ready, sizes, np.array([2]), 1000.0, ALPHA, BETA)[0] == pytest.approx(700.0)
    # ends before the backward: nothing exposed
    assert B.simulate(ready, sizes, np.array([2]), 5000.0, ALPHA, BETA)[0] == 0.0


def test_fit_takes_the_shortest_of_each_size():
    x = np.array([1, 1, 2, 2], dtype=float) * MIB
    y = np.array([750.0, 4000.0, 1000.0, 1300.0])  # 4000 and 1300: waiting for a late peer
    alpha, beta, fit, n = B.fit_cost(x, y)
    assert fit == "affine" and n == 2
    assert alpha == pytest.approx(ALPHA) and beta == pytest.approx(BETA)
    # one size only: no slope, no latency
    alpha, beta, fit, n = B.fit_cost(np.array([MIB, MIB]), np.array([750.0, 800.0]))
    assert (fit, alpha, n) == ("bandwidth_only", 0.0, 1) and beta == pytest.approx(MIB / 750.0)


# ----------------------------------------------------------------------------- the hand-built trace


def test_tiny_ddp_trace_optimum(tmp_path):
    facts = _facts(tmp_path, _ddp_events())
    assert len(facts) == 1
    f = facts[0]
    assert (f.collective, f.knob, f.process_group, f.granularity) == ("all_reduce", "bucket_cap_mb", "0", "parameter")
    assert f.searched and f.sizes_known
    assert f.collectives_count == 8 and f.grads_per_step_count == 8
    assert f.gradient_bytes == 12 * MIB
    assert f.latency_us == pytest.approx(ALPHA) and f.bandwidth_gbps == pytest.approx(BETA / 1e3)
    assert f.fit_error_ratio == pytest.approx(0.0, abs=1e-9)
    assert f.measured_exposed_us == pytest.approx(6550.0)
    assert f.predicted_current_us == pytest.approx(6550.0)
    assert f.model_error_us == pytest.approx(0.0, abs=1e-6)
    assert f.recommended_cap_mb == 11 and f.recommended_first_bucket_mb == 11
    assert f.recommended_buckets_count == 1
    assert f.predicted_best_us == pytest.approx(3400.0)
    assert f.predicted_default_us == pytest.approx(3550.0)
    assert f.saving_us == pytest.approx(3150.0) and f.saving_low_us == pytest.approx(3150.0)
    assert f.curve_us["1"] == pytest.approx(6550.0)
    assert f.curve_us["5"] == pytest.approx(3750.0)
    assert f.curve_us["10"] == pytest.approx(3850.0)
    assert f.curve_us["25"] == pytest.approx(3400.0)
    assert f.saving_share_ratio == pytest.approx(3150.0 / f.analysed_us)


def test_tiny_trace_without_shapes_splits_buckets_evenly(tmp_path):
    # one bucket per gradient: an even split of a one-gradient bucket is the gradient itself,
    # so the answer is the same, but the granularity says how it was known
    f = _facts(tmp_path, _ddp_events(shapes=False))[0]
    assert f.granularity == "bucket_even_split"
    assert f.recommended_cap_mb == 11 and f.predicted_best_us == pytest.approx(3400.0)


def test_sizes_unknown_searches_nothing(tmp_path):
    f = _facts(tmp_path, _ddp_events(sized=False))[0]
    assert not f.sizes_known and not f.searched and "no message size" in f.reason
    assert f.recommended_cap_mb is None and f.saving_us is None
    assert f.measured_exposed_us == pytest.approx(6550.0)  # still measured


def test_one_size_only_searches_nothing(tmp_path):
    # all gradients 1 MiB: durations cannot separate a fixed cost from bandwidth
    kernels = [(1000.0 + 750 * i, 1750.0 + 750 * i) for i in range(8)]
    f = _facts(tmp_path, _ddp_events(numel=[262144] * 8, kernels=kernels))[0]
    assert f.sizes_known and not f.searched and f.fit == "bandwidth_only"
    assert "do not grow with the message size" in f.reason


def test_collectives_outside_the_backward_are_not_gradients(tmp_path):
    ev = [e for e in _ddp_events() if "evaluate_function" not in e["name"]]
    assert _facts(tmp_path, ev) == []


def test_fact_reaches_the_report(tmp_path):
    p = write_trace(tmp_path / "ddp.json", _ddp_events(), distributedInfo={"rank": 0, "world_size": 2, "backend": "nccl"})
    facts = hermes_kb.analyze(p)
    kinds = [f.kind for f in facts]
    assert "bucket_search" in kinds
    rep = hermes_kb.advise(p)
    f = next((f for f in rep.findings if f.case_id == "C-COMM-010"), None)
    assert f is not None
    assert "11 MiB" in f.explanation


# ----------------------------------------------------------------------------- shared DDP traces


def _raw(path):
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


def _search(path, rank=None):
    bundle = hermes_kb.load(path)
    t = bundle[rank if rank is not None else bundle.rank_ids[0]]
    ctx, _ = step_context(t)
    return B.per_rank(ctx)


@needs_shared()
def test_mi300_resnet_ddp_parameter_granularity():
    path = SHARED / "tracelens/mi300__resnet_act_checkpoint.json.gz"
    ev = _raw(path)
    # from the raw JSON: the gradient all-reduces' sizes (BFloat16 elements x 2) and the
    # AccumulateGrad shapes, which DDP's buckets are made of
    rpc = [e for e in ev if e.get("name") == "record_param_comms" and e.get("args", {}).get("Collective name") == "allreduce"]
    bucket_bytes = sorted({int(e["args"]["In msg nelems"]) * 2 for e in rpc})
    grads = [e for e in ev if e.get("name") == "torch::autograd::AccumulateGrad" and e.get("cat") == "cpu_op"]
    grad_bytes = sum(int(np.prod(e["args"]["Input Dims"][0])) * 2 for e in grads)
    (f,) = _search(path)
    assert f.granularity == "parameter"  # the shapes add up to the buckets exactly
    assert f.buckets_per_step_count == 2 and f.steps_count == 3
    assert f.grads_per_step_count == len(grads) / 3
    assert f.gradient_bytes == sum(bucket_bytes) == grad_bytes / 3
    # the simulator reproduces the trace's own exposed time within 5% (measured: -3.7%)
    assert abs(f.model_error_us) <= 0.05 * f.measured_exposed_us
    # one bucket instead of DDP's default two (1 MiB first bucket): the fitted fixed cost is paid once
    assert f.recommended_buckets_count == 1
    assert f.recommended_cap_mb == np.ceil(sum(bucket_bytes) / MIB)
    assert f.saving_us > 0


@needs_shared()
def test_nccl_parser_config_host_bound_ddp():
    path = SHARED / "hta/nccl_parser_config/nccl_data.json.gz"
    ev = _raw(path)
    kernels = [e for e in ev if e.get("cat") == "kernel" and "AllReduce" in e.get("name", "")]
    (f,) = _search(path)
    assert f.collectives_count == len(kernels) == 15
    assert f.granularity == "bucket_even_split"  # no record_shapes: AccumulateGrad has no Input Dims
    assert f.searched
    assert abs(f.model_error_us) <= 0.15 * f.measured_exposed_us  # measured: +8.5%
    # a host-bound step: the gradient tail is under 1% of the step, and no size changes that much
    assert f.measured_exposed_share_ratio < 0.01 and f.saving_share_ratio < 0.005


@needs_shared()
def test_df_index_resolver_sizes_unknown():
    path = SHARED / "hta/df_index_resolver/df_index_resolver.json.gz"
    ev = _raw(path)
    n = sum(1 for e in ev if e.get("cat") == "kernel" and "AllReduce" in e.get("name", ""))
    (f,) = _search(path)
    assert f.collectives_count == n == 2020
    assert not f.sizes_known and not f.searched
