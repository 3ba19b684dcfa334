"""Step windows: ProfilerStep, inferred steps, the partial last step, and the analyze driver."""

from __future__ import annotations

import pytest

import hermes_kb
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import X, kineto_traces, needs_shared, write_trace


def facts_of(tmp_path, events, **top):
    t = next(iter(hermes_kb.load(write_trace(tmp_path / "t.json", events, **top))))
    return step_context(t)


def test_profiler_steps_and_partial_last_step(tmp_path):
    ev = [X("user_annotation", f"ProfilerStep#{i}", i * 100, 90) for i in range(4)]
    ev.append(X("user_annotation", "ProfilerStep#4", 400, 20))  # cut short: 20 < 0.6 * 100
    ev.append(X("cpu_op", "aten::mm", 5, 10))
    ctx, facts = facts_of(tmp_path, ev)
    structure = facts[0]
    assert structure.kind == "step_structure" and structure.source == "profiler_step"
    assert structure.excluded_steps == [4] and "partial" in structure.excluded_reason
    times = [f for f in facts if f.kind == "step_time"]
    # windows run to the next step's start: 100 µs each, the CPU part 90 µs
    assert [(f.step, f.duration_us, f.cpu_duration_us) for f in times] == [
        (0, 100.0, 90.0), (1, 100.0, 90.0), (2, 100.0, 90.0), (3, 100.0, 90.0)]  # fmt: skip


def test_last_step_extends_to_its_device_work(tmp_path):
    ev = [
        X("user_annotation", "ProfilerStep#0", 0, 100),
        X("user_annotation", "ProfilerStep#1", 100, 100),
        X("cuda_runtime", "cudaLaunchKernel", 150, 5, args={"correlation": 9}),
        X("kernel", "k", 180, 70, pid=0, tid=7, args={"correlation": 9, "stream": 7}),
    ]
    ctx, facts = facts_of(tmp_path, ev)
    last = [f for f in facts if f.kind == "step_time"][-1]
    assert (last.start_us, last.end_us, last.cpu_duration_us) == (100.0, 250.0, 100.0)


def test_steps_inferred_from_optimizer_steps(tmp_path):
    ev = [X("cpu_op", "aten::mm", 0, 5)]
    ev += [X("user_annotation", "Optimizer.step#SGD.step", 90 + i * 100, 10) for i in range(3)]
    ctx, facts = facts_of(tmp_path, ev)
    s = facts[0]
    assert s.source == "optimizer_step" and s.inferred and s.marker == "Optimizer.step#SGD.step"
    # a step ends where its optimizer step ends: [0, 100), [100, 200), [200, 300)
    assert [(w.start_us, w.end_us) for w in ctx.windows] == [(0.0, 100.0), (100.0, 200.0), (200.0, 300.0)]


def test_steps_inferred_from_repeating_annotation(tmp_path):
    ev = [X("user_annotation", "train_iter", i * 50, 40) for i in range(4)]
    ctx, facts = facts_of(tmp_path, ev)
    assert facts[0].source == "repeating_annotation" and facts[0].marker == "train_iter"
    assert len(ctx.windows) == 4


def test_whole_trace_when_no_structure(tmp_path):
    ctx, facts = facts_of(tmp_path, [X("cpu_op", "aten::add", 10, 5), X("cpu_op", "aten::mul", 30, 5)])
    assert facts[0].source == "whole_trace" and [(w.start_us, w.end_us) for w in ctx.windows] == [(0.0, 25.0)]


@needs_shared()
@pytest.mark.parametrize("path", kineto_traces(), ids=lambda p: p.name)
def test_every_shared_trace_analyses_without_error(path):
    facts = hermes_kb.analyze(path)
    errors = [f"{f.analyzer}: {f.message}" for f in facts if f.kind == "analyzer_error"]
    assert not errors
    kinds = {f.kind for f in facts}
    assert {"step_structure", "step_time"} <= kinds
