"""comm analyzer: per-rank collective statistics and cross-rank synchronisation waste.

Hand-made traces have their expected values worked out in the comments; the shared traces
check that every Kineto trace goes through and that dlrm's R_wait agrees with a direct
computation from the collectives frames."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hermes_kb
from hermes_kb.core.devices import device_link
from hermes_kb.analyzers.comm import bandwidth, collectives, comm, pipeline
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import ROOT, X, kineto_traces, needs_shared, write_trace
from hermes_kb.analysis.rank import digests_of

MIB = 1024 * 1024


def collective(
    ts,
    dur,
    ext,
    corr,
    nelems,
    *,
    pg="0",
    ranks="[0, 1, 2, 3]",
    size=4,
    name="allreduce",
    dtype="Float",
    stream=20,
    kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
):
    """record_param_comms (CPU, at ts-50) > nccl op > launch, and the kernel on the device at ts."""
    t0 = ts - 50
    return [
        X(
            "cpu_op",
            "record_param_comms",
            t0,
            30,
            args={
                "External id": ext,
                "Collective name": name,
                "dtype": dtype,
                "In msg nelems": nelems,
                "Out msg nelems": nelems,
                "Group size": size,
                "Process Group Name": pg,
                "Process Group Ranks": ranks,
            },
        ),
        X("cpu_op", f"nccl:{name}", t0 + 5, 20, args={"External id": ext + 1}),
        X("cuda_runtime", "cudaLaunchKernel", t0 + 10, 5, args={"External id": ext + 1, "correlation": corr}),
        X(
            "kernel",
            kernel,
            ts,
            dur,
            pid=0,
            tid=stream,
            args={"correlation": corr, "External id": ext + 1, "stream": stream, "device": 0},
        ),
    ]


def compute_kernel(ts, dur, corr, stream=7):
    return [
        X("cuda_runtime", "cudaLaunchKernel", max(ts - 20, 0), 5, args={"correlation": corr}),
        X(
            "kernel",
            "void gemm_kernel",
            ts,
            dur,
            pid=0,
            tid=stream,
            args={"correlation": corr, "stream": stream},
        ),
    ]


A100 = [{"id": i, "name": "NVIDIA A100-SXM4-80GB"} for i in range(4)]


def one_rank_trace(tmp_path):
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    ev += compute_kernel(100, 300, corr=1)  # compute [100, 400)
    # all_reduce A: [300, 600), 4 MiB (1 Mi floats, a multiple of 512)
    ev += collective(300, 300, ext=10, corr=2, nelems=1024 * 1024)
    # all_reduce B: [700, 800), 1000 floats = 4000 B (4000 % 512 = 416: unaligned, < 1 MiB)
    ev += collective(700, 100, ext=20, corr=3, nelems=1000)
    # a Work.wait record: not a transfer, must be left out
    ev += [
        X(
            "cpu_op",
            "record_param_comms",
            850,
            4,
            args={"External id": 30, "Collective name": "wait", "dtype": "Byte", "Group size": 1},
        )
    ]
    # a broadcast recorded after the step: outside every analysed window, left out
    ev += [
        X(
            "cpu_op",
            "record_param_comms",
            1500,
            10,
            args={
                "External id": 40,
                "Collective name": "broadcast",
                "dtype": "Float",
                "In msg nelems": 10,
                "Group size": 4,
            },
        )
    ]
    p = write_trace(
        tmp_path / "rank0.json",
        ev,
        deviceProperties=A100,
        distributedInfo={"rank": 0, "world_size": 4, "backend": "nccl"},
    )
    return hermes_kb.load(p)[0]


def test_per_rank_counts_exposure_bandwidth_and_sizes(tmp_path):
    ctx, _ = step_context(one_rank_trace(tmp_path))
    facts = comm.per_rank(ctx)
    stats = [f for f in facts if f.kind == "comm_stats"]
    assert len(stats) == 1
    s = stats[0]
    assert (s.process_group, s.collective, s.source, s.group_ranks) == (
        "0",
        "all_reduce",
        "kernel",
        [0, 1, 2, 3],
    )
    assert s.collectives_count == 2 and s.group_size_count == 4
    assert s.time_us == pytest.approx(400.0)  # 300 + 100
    # A [300, 600) overlaps compute [100, 400) for 100 -> exposed 200; B exposed 100
    assert s.exposed_us == pytest.approx(300.0)
    assert s.exposed_ratio == pytest.approx(0.75)
    bytes_a, bytes_b = 4 * MIB, 4000
    assert s.sizes_known and s.total_bytes == bytes_a + bytes_b
    # algbw = 4_198_304 B / 400 µs = 10_495.76 B/µs = 10.49576 GB/s; busbw x 2(n-1)/n = 1.5
    assert s.algbw_gbps == pytest.approx(10.49576)
    assert s.busbw_gbps == pytest.approx(15.74364)
    # best single message >= 1 MiB: A, 4_194_304 / 300 = 13_981.01 B/µs -> x 1.5 = 20.9715 GB/s
    assert s.best_busbw_gbps == pytest.approx(20.97152, rel=1e-5)
    # A100 SXM4: NVLink 3, 600 GB/s both directions -> 300 GB/s per direction
    assert s.link_peak_gbps == 300.0 and "NVLink 3" in s.link
    assert s.busbw_to_peak_ratio == pytest.approx(15.74364 / 300)
    assert (s.messages_below_1mib_count, s.messages_1_to_32mib_count, s.messages_from_32mib_count) == (
        1,
        1,
        0,
    )
    assert s.small_messages_ratio == 1.0  # both below 32 MiB
    assert s.unaligned_512_count == 1 and s.unaligned_512_ratio == 0.5
    summ = next(f for f in facts if f.kind == "comm_summary")
    assert summ.collectives_count == 2  # the wait and the late broadcast are not counted
    assert summ.comm_time_us == pytest.approx(400.0)
    assert summ.exposed_us == pytest.approx(300.0)
    assert summ.analysed_us == pytest.approx(1000.0)
    assert summ.comm_share_ratio == pytest.approx(0.4) and summ.exposed_share_ratio == pytest.approx(0.3)


def test_sizes_unknown_still_counts_and_times(tmp_path):
    # kernels alone (no record_param_comms, as in older traces): count and time only
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    for i, (ts, dur) in enumerate([(100, 50), (300, 150)]):
        ev += [
            X("cuda_runtime", "cudaLaunchKernel", ts - 20, 5, args={"correlation": 10 + i}),
            X(
                "kernel",
                "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)",
                ts,
                dur,
                pid=0,
                tid=20,
                args={"correlation": 10 + i, "stream": 20},
            ),
        ]
    ctx, _ = step_context(hermes_kb.load(write_trace(tmp_path / "t.json", ev))[0])
    s = next(f for f in comm.per_rank(ctx) if f.kind == "comm_stats")
    assert s.process_group == "unknown" and s.collectives_count == 2 and s.time_us == 200.0
    assert s.exposed_us == 200.0  # no compute kernel at all
    assert not s.sizes_known and s.total_bytes is None and s.algbw_gbps is None and s.busbw_gbps is None
    assert s.small_messages_ratio is None and s.unaligned_512_ratio is None


def test_bus_factors_follow_nccl():
    assert bandwidth.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bandwidth.bus_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert bandwidth.bus_factor("reduce_scatter", 2) == pytest.approx(1 / 2)
    assert bandwidth.bus_factor("all_to_all", 8) == pytest.approx(7 / 8)
    assert bandwidth.bus_factor("broadcast", 8) == 1.0 and bandwidth.bus_factor("send", 2) == 1.0


def test_link_table():
    assert device_link("Tesla V100-SXM2-32GB").peak_gbps == 150.0
    assert device_link("NVIDIA H100 80GB HBM3").total_gbps == 900.0
    assert device_link("NVIDIA GeForce RTX 2080 Ti").name.startswith("PCIe Gen3")
    assert device_link("AMD Instinct MI300X").total_gbps == 896.0
    assert device_link("Some Future GPU") is None and device_link(None) is None


# ------------------------------------------------------------------ cross rank

# per instance and rank: (start, duration); each instance ends at the same time on every rank
INSTANCES = {
    # instance 1 ends at 1000: T = 300, 200, 100 -> mean 200, max 300, R_wait = 1 - 200/300 = 1/3
    #   waits T_i - min: 200, 100, 0
    0: [(700, 300), (1200, 400)],
    # instance 2 ends at 1600: T = 400, 100, 250 -> mean 250, max 400, R_wait = 1 - 250/400 = 0.375
    #   waits: 300, 0, 150
    1: [(800, 200), (1500, 100)],
    2: [(900, 100), (1350, 250)],
}


def three_ranks(tmp_path, compute=(100, 200, 600)):
    for r in range(3):
        ev = [X("user_annotation", "ProfilerStep#5", 0, 2000)]
        ev += compute_kernel(100, compute[r], corr=1)
        for i, (ts, dur) in enumerate(INSTANCES[r]):
            ev += collective(
                ts, dur, ext=10 * (i + 1), corr=2 + i, nelems=1024 * 1024, ranks="[0, 1, 2]", size=3
            )
        write_trace(
            tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 3, "backend": "nccl"}
        )
    bundle = hermes_kb.load(tmp_path)
    return {r: step_context(bundle[r])[0] for r in bundle.rank_ids}


def test_cross_rank_r_wait_by_hand(tmp_path):
    ctxs = three_ranks(tmp_path)
    facts = comm.cross_rank(digests_of(ctxs), [])
    assert len(facts) == 1
    f = facts[0]
    assert (f.process_group, f.collective, f.group_ranks, f.matched_by) == (
        "0",
        "all_reduce",
        [0, 1, 2],
        "step_order",
    )
    assert f.instances_count == 2 and f.unmatched_count == 0
    assert f.r_wait_mean_ratio == pytest.approx((1 / 3 + 0.375) / 2)
    assert f.r_wait_max_ratio == pytest.approx(0.375)
    assert f.r_wait_weighted_ratio == pytest.approx(1 - (200 + 250) / (300 + 400))
    assert f.wait_total_us == pytest.approx(750.0)  # 300 + 450
    assert f.wait_by_rank_us == {0: 500.0, 2: 150.0, 1: 100.0}
    # last to arrive: rank 2 in instance 1, rank 1 in instance 2; the tie goes to the one that
    # waited less in total (rank 1: 100 µs)
    assert f.slowest_rank == 1 and f.slowest_rank_share_ratio == 0.5
    assert f.most_waiting_rank == 0 and f.most_waiting_rank_share_ratio == 1.0
    assert f.most_waiting_rank_wait_us == pytest.approx(500.0)  # rank 0's share of wait_total_us
    assert f.pipeline_p2p is False  # an all-reduce of three ranks
    # start spreads: 900 - 700 = 200 and 1500 - 1200 = 300 -> mean 250
    assert f.arrival_spread_mean_us == pytest.approx(250.0)
    # evidence points at the instance with the most waiting (instance 2: 1200 .. 1600)
    assert f.evidence.time_ranges_us == [(1200.0, 1600.0)]


def test_cross_rank_unmatched_instance_left_out(tmp_path):
    ctxs = three_ranks(tmp_path)
    # drop rank 2's second collective: instance 2 is no longer on every rank
    c = ctxs[2].trace.collectives
    ctxs[2].trace.collectives = c[c["ts"] < 1300].reset_index(drop=True)
    ctxs[2].shared.clear()
    f = comm.cross_rank(digests_of(ctxs), [])[0]
    assert f.instances_count == 1 and f.unmatched_count == 1
    assert f.r_wait_mean_ratio == pytest.approx(1 / 3)


def test_single_rank_has_no_cross_rank_fact(tmp_path):
    ctx, _ = step_context(one_rank_trace(tmp_path))
    assert comm.cross_rank(digests_of({0: ctx}), []) == []


# ------------------------------------------------------------------ shared traces


@needs_shared()
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: p.name[:40])
def test_every_kineto_trace(path):
    bundle = hermes_kb.load(path)
    ctxs = {}
    for r in bundle.rank_ids:
        ctx, _ = step_context(bundle[r])
        ctxs[r] = ctx
        for f in comm.per_rank(ctx):  # raises on a bug; pydantic checks ratios are within 0..1
            if f.kind == "comm_stats":
                assert 0 <= (f.exposed_us or 0) <= f.time_us + 1e-6
                assert f.max_us <= f.time_us + 1e-6
                bins = f.messages_below_1mib_count + f.messages_1_to_32mib_count + f.messages_from_32mib_count
                assert bins == f.sized_count <= f.collectives_count
            elif f.kind == "comm_summary":
                assert f.comm_time_us <= f.analysed_us + 1e-6 or f.analysed_us == 0
    for f in comm.cross_rank(digests_of(ctxs), []):
        assert f.r_wait_mean_ratio <= f.r_wait_max_ratio + 1e-12


def test_dlrm_r_wait_matches_direct_computation(shared):
    bundle = hermes_kb.load(shared / "param" / "dlrm_kineto_8rank")
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    facts = {f.collective: f for f in comm.cross_rank(digests_of(ctxs), [])}
    assert set(facts) == {"send_recv", "all_reduce"}
    for kind, f in facts.items():
        # every rank has the same collectives in the same order (one step): rows = ranks
        colls = [bundle[r].collectives for r in bundle.rank_ids]
        d = np.array([c.loc[c["kind"] == kind, "dur"].to_numpy() for c in colls])
        r_wait = 1 - d.mean(axis=0) / d.max(axis=0)
        assert f.instances_count == d.shape[1] and f.group_ranks == list(range(8))
        assert f.r_wait_mean_ratio == pytest.approx(r_wait.mean())
        assert f.r_wait_max_ratio == pytest.approx(r_wait.max())
        assert f.wait_total_us == pytest.approx((d - d.min(axis=0)).sum())
    # rank 7 arrives last at 4 of the 5 all_to_all (SendRecv) exchanges
    assert facts["send_recv"].slowest_rank == 7 and facts["send_recv"].slowest_rank_share_ratio == 0.8


def test_df_index_resolver_exposure_agrees_with_hta(shared):
    # HTA 0.5.0 reports 0% computation/communication overlap on this trace (tests/data/hta_reference.json)
    ref = json.loads((ROOT / "tests" / "data" / "hta_reference.json").read_text())
    assert ref["hta/df_index_resolver"]["comm_comp_overlap"][0]["comp_comm_overlap_pctg"] == 0.0
    ctx, _ = step_context(hermes_kb.load(shared / "hta/df_index_resolver/df_index_resolver.json.gz")[1])
    s = next(f for f in comm.per_rank(ctx) if f.kind == "comm_summary")
    assert s.exposed_ratio == 1.0 and s.collectives_count > 1000 and not s.sizes_known


def test_collective_belongs_to_the_step_that_issued_it(tmp_path):
    # steps [0, 500) and [500, 1000); the all_reduce is recorded by the CPU at 400 (step 1) but its
    # kernel only runs at [600, 700) (in step 2's window): it counts for step 1
    ev = [X("user_annotation", "ProfilerStep#1", 0, 500), X("user_annotation", "ProfilerStep#2", 500, 500)]
    ev += collective(450, 0, ext=10, corr=2, nelems=256)[:3]  # record_param_comms at 400, launch at 410
    ev.append(
        X(
            "kernel",
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
            600,
            100,
            pid=0,
            tid=20,
            args={"correlation": 2, "External id": 11, "stream": 20},
        )
    )
    ctx, _ = step_context(hermes_kb.load(write_trace(tmp_path / "t.json", ev))[0])
    df = collectives.rank_collectives(ctx)
    assert df["step"].tolist() == [1] and df["ts"].tolist() == [600.0]


@pytest.mark.parametrize(
    ("backend", "size", "bandwidth"), [("nccl", 2, False), ("gloo", 1, False), ("gloo", 2, True)]
)
def test_bandwidth_only_where_the_duration_is_a_transfer(tmp_path, backend, size, bandwidth):
    # CPU-only collectives (no kernel): 1 MiB broadcast in a 100 µs op. NCCL's CPU op only enqueues and a
    # one-rank group sends nothing: no bandwidth; a blocking gloo broadcast over 2 ranks: 1 MiB / 100 µs
    args = {"Collective name": "broadcast", "dtype": "Byte", "In msg nelems": MIB, "Group size": size}
    ev = [
        X("user_annotation", "ProfilerStep#1", 0, 1000),
        X("cpu_op", "record_param_comms", 100, 100, args=args),
    ]
    p = write_trace(
        tmp_path / "t.json", ev, distributedInfo={"rank": 0, "world_size": size, "backend": backend}
    )
    ctx, _ = step_context(hermes_kb.load(p)[0])
    s = next(f for f in comm.per_rank(ctx) if f.kind == "comm_stats")
    assert s.source == "cpu" and s.sizes_known and s.exposed_us is None
    if bandwidth:
        assert (
            s.algbw_gbps == pytest.approx(MIB / 100 / 1e3) and s.busbw_gbps == s.algbw_gbps
        )  # broadcast: x1
    else:
        assert s.algbw_gbps is None and s.busbw_gbps is None


# ------------------------------------------------------------------ transfer after arrival

# two ranks, four all_reduces (floats) and, on rank 0 only, an all_gather beside the first:
#   A 16 MiB: rank 0 [100, 1100), rank 1 [400, 1100): last arrival 400, post-arrival 700 on both
#             rate = 16777216 B / 700 µs = 23.97 GB/s
#   B 32 MiB: [1200, 1300) on both: 33554432 / 100 = 335.54 GB/s (the best)
#   C  8 MiB: [1400, 1480) on both: 8388608 / 80 = 104.86 GB/s
#   D  1 MiB: [1600, 1700): under 8 MiB, not judged
# stall threshold 0.25 x 335.54 = 83.89 GB/s: only A stalls; its excess = 700 - 16777216 / 335544.32
# = 700 - 50 = 650 µs. The all_gather [500, 700) on rank 0 runs during A's post-arrival window
# [400, 1100): 200 µs concurrent on rank 0, none on rank 1.
STALL = {0: [(100, 1000), (1200, 100), (1400, 80), (1600, 100)],
         1: [(400, 700), (1200, 100), (1400, 80), (1600, 100)]}  # fmt: skip
STALL_FLOATS = [4 * MIB, 8 * MIB, 2 * MIB, MIB // 4]


def test_transfer_stall_after_arrival_by_hand(tmp_path):
    for r in range(2):
        ev = [X("user_annotation", "ProfilerStep#5", 0, 2000)]
        for i, (ts, dur) in enumerate(STALL[r]):
            ev += collective(ts, dur, ext=10 * (i + 1), corr=2 + i, nelems=STALL_FLOATS[i], ranks="[0, 1]", size=2)
        if r == 0:
            ev += collective(500, 200, ext=90, corr=9, nelems=1024, ranks="[0, 1]", size=2, name="all_gather",
                             stream=21, kernel="ncclDevKernel_AllGather_RING_LL(ncclDevComm*)")  # fmt: skip
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2, "backend": "nccl"})
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    stalls = {f.rank: f for f in comm.cross_rank(digests_of(ctxs), []) if f.kind == "comm_transfer_stall"}
    assert sorted(stalls) == [0, 1]
    f0, f1 = stalls[0], stalls[1]
    for f in (f0, f1):
        assert (f.collective, f.group_ranks, f.instances_count, f.sized_count) == ("all_reduce", [0, 1], 4, 3)
        assert f.best_gbps == pytest.approx(33554432 / 100 / 1e3) and f.best_bytes == 33554432
        assert f.median_gbps == pytest.approx(8388608 / 80 / 1e3)
        assert f.stalled_count == 1 and f.stalled_us == pytest.approx(700.0)
        assert f.stalled_bytes == 16777216 and f.stalled_gbps == pytest.approx(16777216 / 700 / 1e3)
        assert f.excess_us == pytest.approx(650.0)
        assert f.post_arrival_us == pytest.approx(700 + 100 + 80 + 100)
        assert f.worst_us == pytest.approx(700.0) and f.worst_bytes == 16777216
        assert f.analysed_us == pytest.approx(2000.0) and f.excess_share_ratio == pytest.approx(650 / 2000)
    assert f0.arrival_wait_us == pytest.approx(300.0) and f1.arrival_wait_us == pytest.approx(0.0)
    assert f0.stalled_concurrent_us == pytest.approx(200.0) and f0.stalled_concurrent_ratio == pytest.approx(200 / 700)
    assert f1.stalled_concurrent_us == 0.0
    assert f0.evidence.time_ranges_us == [(400.0, 1100.0)]
    # the same from digests as the streamed path's workers send them (pickled, without the frames)
    import pickle

    again = {f.rank: f for f in comm.cross_rank(pickle.loads(pickle.dumps(digests_of(ctxs))), [])
             if f.kind == "comm_transfer_stall"}  # fmt: skip
    assert again[0].excess_us == pytest.approx(650.0) and again[0].stalled_concurrent_us == pytest.approx(200.0)


def test_transfer_stall_needs_two_sized_instances(tmp_path):
    # only A and D: one sized instance, nothing to compare it with
    for r in range(2):
        ev = [X("user_annotation", "ProfilerStep#5", 0, 2000)]
        for i in (0, 3):
            ts, dur = STALL[r][i]
            ev += collective(ts, dur, ext=10 * (i + 1), corr=2 + i, nelems=STALL_FLOATS[i], ranks="[0, 1]", size=2)
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2, "backend": "nccl"})
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    assert not [f for f in comm.cross_rank(digests_of(ctxs), []) if f.kind == "comm_transfer_stall"]


def test_link_unknown_when_devices_per_node_not_recorded(tmp_path):
    # one rank listing no device: neither 'spans nodes' nor an intra-node link can be claimed,
    # but algbw (bytes / duration) needs no group size
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000)]
    ev += collective(300, 100, ext=10, corr=2, nelems=4 * MIB, ranks="[]", size=-1)
    p = write_trace(tmp_path / "rank0.json", ev, distributedInfo={"rank": 0, "backend": "nccl"})
    ctx, _ = step_context(hermes_kb.load(p)[0])
    st = [f for f in comm.per_rank(ctx) if f.kind == "comm_stats"][0]
    assert st.link == "unknown (devices per node not recorded)" and st.link_peak_gbps is None
    assert st.group_size_count is None and st.busbw_gbps is None
    assert st.algbw_gbps == pytest.approx(16 * MIB / 100 / 1e3)
    # 100 µs of collective in a 1000 µs step, none of it under compute
    assert st.time_share_ratio == pytest.approx(0.1) and st.exposed_share_ratio == pytest.approx(0.1)


def test_transfer_stall_needs_comparable_clocks(tmp_path):
    # rank 1's clock 300 µs ahead: every instance ends 300 µs later there than on rank 0 (median
    # post-arrival 100 µs), so arrival order cannot be read from the two traces: no fact
    for r in range(2):
        ev = [X("user_annotation", "ProfilerStep#5", 0, 3000)]
        for i, (ts, dur) in enumerate(STALL[r]):
            ev += collective(ts + 300 * r, dur, ext=10 * (i + 1), corr=2 + i, nelems=STALL_FLOATS[i], ranks="[0, 1]",
                             size=2)  # fmt: skip
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2, "backend": "nccl"})
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    assert not [f for f in comm.cross_rank(digests_of(ctxs), []) if f.kind == "comm_transfer_stall"]


def test_all_to_all_split_imbalance_and_per_step_count(tmp_path):
    # two steps, one all_to_all each on a 4-rank group, split sizes in elements per peer:
    #   step 1 [100, 600): in [1, 1, 1, 5] (sum 8, largest 5 x 4 peers = 20: 1 - 8/20 = 0.6),
    #          out [2, 2, 2, 2] (even: 0) -> the send side; excess 500 x 0.6 = 300 µs
    #   step 2 [1100, 1300): in [2, 2, 2, 2] (even), out [4, 4, 4, 0] (sum 12, 4 x 4 = 16:
    #          1 - 12/16 = 0.25) -> the receive side; excess 200 x 0.25 = 50 µs
    # aggregate: 1 - (8 + 12) / (20 + 16) = 1 - 20/36 = 0.4444; excess 350 µs; 2 per 2 steps = 1.0
    ev = [X("user_annotation", "ProfilerStep#1", 0, 1000), X("user_annotation", "ProfilerStep#2", 1000, 1000)]
    a2a = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
    for ts, dur, ext, corr, ins, outs in ((100, 500, 10, 1, [1, 1, 1, 5], [2, 2, 2, 2]),
                                          (1100, 200, 20, 2, [2, 2, 2, 2], [4, 4, 4, 0])):  # fmt: skip
        evs = collective(ts, dur, ext, corr, sum(ins), name="all_to_all", kernel=a2a)
        evs[0]["args"]["In split size"] = ins
        evs[0]["args"]["Out split size"] = outs
        ev += evs
    ev += collective(1500, 100, ext=30, corr=3, nelems=1000)  # an all_reduce: no split fields
    p = write_trace(tmp_path / "rank0.json", ev, deviceProperties=A100,
                    distributedInfo={"rank": 0, "world_size": 4, "backend": "nccl"})  # fmt: skip
    ctx, _ = step_context(hermes_kb.load(p)[0])
    stats = {f.collective: f for f in comm.per_rank(ctx) if f.kind == "comm_stats"}
    a = stats["all_to_all"]
    assert a.collectives_count == 2 and a.splits_count == 2
    assert a.per_step_count == pytest.approx(1.0)
    assert a.split_imbalance_ratio == pytest.approx(1 - 20 / 36)
    assert a.split_excess_us == pytest.approx(350.0)
    assert a.split_excess_share_ratio == pytest.approx(350.0 / 2000.0)  # two 1000 µs steps
    r = stats["all_reduce"]
    assert r.splits_count == 0 and r.split_imbalance_ratio is None and r.split_excess_us is None
    assert r.per_step_count == pytest.approx(0.5)  # one all_reduce over two steps


def test_pipeline_neighbours_are_two_stages_of_one_pipeline_group():
    stages = {0: ((0, 2), 0), 2: ((0, 2), 1), 1: ((1, 3), 0), 3: ((1, 3), 1), 4: ((0, 2), 0)}
    assert pipeline.pipeline_neighbours([0, 2], stages)
    assert not pipeline.pipeline_neighbours([0, 1], stages)  # two pipelines' first stages (data parallel)
    assert not pipeline.pipeline_neighbours([0, 4], stages)  # the same stage
    assert not pipeline.pipeline_neighbours([0, 5], stages)  # rank 5: stage unknown
    assert not pipeline.pipeline_neighbours([0, 2, 1], stages)  # three ranks: an all-to-all, not a stage pair
