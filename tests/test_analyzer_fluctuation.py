"""fluctuation analyzer: step-time series statistics, spikes, periodicity, the device series and
the job series, with hand-worked values."""

from __future__ import annotations

import numpy as np
import pytest

import hermes_kb
from hermes_kb.analyzers.timeline import fluctuation
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, kineto_traces, needs_shared, write_trace
from hermes_kb.analysis.rank import digests_of


def test_statistics_and_spike_by_hand():
    dur = [100, 102, 98, 100, 300, 101, 99, 100, 100]
    f = fluctuation.series_fact(np.arange(9), np.array(dur, float), rank=0)
    # sorted: 98 99 100 100 100 100 101 102 300 -> median 100
    assert f.p50_us == 100.0 and f.max_us == 300.0 and f.max_step == 4 and f.min_us == 98.0
    # mean = 1100 / 9 = 122.22; population std: squared deviations sum to 35565.6 -> sqrt(35565.6/9) = 62.86
    assert f.mean_us == pytest.approx(1100 / 9)
    assert f.std_us == pytest.approx(62.86, abs=0.01)
    assert f.cv_ratio == pytest.approx(62.863 / 122.222, rel=1e-3)
    # p95 (linear): position 0.95 x 8 = 7.6 between 102 and 300 -> 102 + 0.6 x 198 = 220.8
    assert f.p95_us == pytest.approx(220.8)
    # 9 steps = one window: |x - 100| sorted 0 0 0 0 1 1 2 2 200 -> MAD 1;
    # threshold = 100 + max(3 x 1.4826 x 1 = 4.45, 5% x 100 = 5) = 105: only step 4 (300), 200 above
    assert f.mad_us == 1.0 and f.spikes_checked
    assert f.spike_steps == [4] and f.spikes_count == 1 and f.spike_excess_us == pytest.approx(200.0)
    assert f.periodicity_checked and f.period_steps is None  # one spike is no period


def test_periodicity_by_hand():
    # 100 100 200 repeated 4 times; d = x - 133.3 = (-33.3, -33.3, 66.7) ...; sum d^2 = 4 x 6666.7 = 26666.7
    # lag 3: 9 pairs, 3 x (1111.1 + 1111.1 + 4444.4) = 20000 -> 0.75; lag 2: -0.458, lag 4: -0.29: a peak,
    # above max(0.3, 2/sqrt(12) = 0.577). MAD is 0, so nothing is winsorised.
    dur = np.array([100, 100, 200] * 4, float)
    f = fluctuation.series_fact(np.arange(12), dur, rank=0)
    assert f.period_steps == 3 and f.period_acf_ratio == pytest.approx(0.75)
    # median 100, MAD 0 -> threshold 105: the four 200 µs steps are spikes
    assert f.spike_steps == [2, 5, 8, 11] and f.spike_excess_us == pytest.approx(400.0)


def test_trend_is_not_a_period():
    f = fluctuation.series_fact(np.arange(12), np.linspace(100, 210, 12), rank=0)
    assert f.period_steps is None


def test_few_steps_are_handled():
    one = fluctuation.series_fact(np.array([7]), np.array([500.0]), rank=0)
    assert one.steps_count == 1 and one.cv_ratio == 0.0 and one.p95_us == 500.0
    assert not one.spikes_checked and not one.periodicity_checked and one.spike_steps == []
    two = fluctuation.series_fact(np.array([1, 2]), np.array([100.0, 300.0]), rank=0)
    assert two.p50_us == 200.0 and two.cv_ratio == pytest.approx(0.5) and not two.spikes_checked
    assert fluctuation.series_fact(np.array([]), np.array([]), rank=0) is None


def test_huge_cv_is_capped():
    f = fluctuation.series_fact(np.arange(4), np.array([1.0, 1.0, 1.0, 100.0]), rank=0)
    assert f.cv_ratio == 1.0  # std/mean = 1.67


def cpu_ahead_trace(tmp_path):
    # 3 CPU steps of 100 µs, each launching one 250 µs kernel; the device runs them back to back:
    # [20, 270), [270, 520), [520, 770). Windows: 100, 100 and the last to 770 (570 µs, 470 of drain).
    ev = []
    for i in range(3):
        ev.append(X("user_annotation", f"ProfilerStep#{i}", 100 * i, 100))
        ev.append(X("cuda_runtime", "cudaLaunchKernel", 100 * i + 10, 5, args={"correlation": i + 1}))
        ev.append(
            X(
                "kernel",
                "void big_kernel",
                20 + 250 * i,
                250,
                pid=0,
                tid=7,
                args={"correlation": i + 1, "stream": 7},
            )
        )
    return hermes_kb.load(write_trace(tmp_path / "t.json", ev))[0]


def test_window_and_device_series(tmp_path):
    ctx, _ = step_context(cpu_ahead_trace(tmp_path))
    facts = {f.series: f for f in fluctuation.per_rank(ctx)}
    assert set(facts) == {"window", "device"}
    w = facts["window"]
    assert w.steps_count == 3 and w.max_us == 570.0 and w.last_step_drain_us == pytest.approx(470.0)
    # median 100, MAD 0 -> threshold 105: the last window is a spike of 470 µs
    assert w.spike_steps == [2] and w.spike_excess_us == pytest.approx(470.0)
    d = facts["device"]
    # device step starts 20, 270, 520; last ends at 770 -> 250, 250, 250
    assert d.p50_us == 250.0 and d.max_us == 250.0 and d.cv_ratio == 0.0 and d.spikes_count == 0


def test_no_device_series_when_it_agrees(tmp_path):
    ev = []
    for i in range(3):  # kernel inside each 100 µs step
        ev.append(X("user_annotation", f"ProfilerStep#{i}", 100 * i, 100))
        ev.append(X("cuda_runtime", "cudaLaunchKernel", 100 * i + 1, 2, args={"correlation": i + 1}))
        ev.append(
            X("kernel", "void k", 100 * i + 5, 50, pid=0, tid=7, args={"correlation": i + 1, "stream": 7})
        )
    ctx, _ = step_context(hermes_kb.load(write_trace(tmp_path / "t.json", ev))[0])
    facts = fluctuation.per_rank(ctx)
    assert [f.series for f in facts] == ["window"] and facts[0].cv_ratio == 0.0


def test_job_series_is_the_per_step_max(tmp_path):
    # rank 0 steps 1..3 = 100, 200, 100 µs; rank 1 = 150, 100, 100 (+ a step 4 rank 0 lacks)
    for r, durs in enumerate(([100, 200, 100], [150, 100, 100, 100])):
        ev, t = [], 0
        for i, d in enumerate(durs):
            ev.append(X("user_annotation", f"ProfilerStep#{i + 1}", t, d))
            t += d
        write_trace(tmp_path / f"rank{r}.json", ev, distributedInfo={"rank": r, "world_size": 2})
    bundle = hermes_kb.load(tmp_path)
    ctxs = {r: step_context(bundle[r])[0] for r in bundle.rank_ids}
    (job,) = fluctuation.cross_rank(digests_of(ctxs), [])
    # common steps 1..3; max per step: 150, 200, 100
    assert job.rank is None and job.series == "job_max" and job.steps_count == 3
    assert (job.first_step, job.last_step) == (1, 3)
    assert job.mean_us == pytest.approx(150.0) and job.max_step == 2 and job.p50_us == 150.0
    assert fluctuation.cross_rank(digests_of({0: ctxs[0]}), []) == []


@needs_shared()
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: p.name[:40])
def test_every_kineto_trace(path):
    bundle = hermes_kb.load(path)
    ctxs = {}
    for r in bundle.rank_ids:
        ctx, _ = step_context(bundle[r])
        ctxs[r] = ctx
        facts = fluctuation.per_rank(ctx)
        assert facts and facts[0].series == "window" and facts[0].steps_count == len(ctx.windows)
        for f in facts:
            assert f.min_us <= f.p50_us <= f.p95_us <= f.max_us
            assert len(f.spike_steps) <= 10 and f.spikes_count >= len(f.spike_steps)
    fluctuation.cross_rank(digests_of(ctxs), [])


def test_resnet_period_of_four(shared):
    # param/resnet_kineto: 30 optimizer steps; every 4th step is slow (data loading); the first
    # window (from the trace's start: 4.8 s of set-up) is left out of the steps
    ctx, _ = step_context(hermes_kb.load(shared / "param/resnet_kineto.json.gz")[0])
    assert ctx.excluded_steps == [0]
    w = next(f for f in fluctuation.per_rank(ctx) if f.series == "window")
    assert w.steps_count == 29 and 0 not in w.spike_steps
    assert w.period_steps == 4
