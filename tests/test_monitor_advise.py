"""hermes advise / analyze on a monitor RUN_DIR: facts from synthetic logs with hand-computed
numbers, findings, bad input, and a real 2-process run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_kb
from hermes_kb.analysis.run_dir import analyze_run_dir

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests/data/monitor_runs/two_ranks"


def write_log(d: Path, rank: int, steps: list[dict], env: dict | None = None, samples: dict | None = None) -> Path:
    """A rank<R>.jsonl as the Monitor writes it; ``samples`` maps step -> resource fields."""
    env_rec = {"type": "environment", "rank": rank, "env": {}, "gc_thresholds": [700, 10, 10], "cpu_count": 8,
               "affinity": list(range(8)), "versions": {"python": "3.11"}, "hostname": "h0", **(env or {})}  # fmt: skip
    lines = [env_rec]
    for i, s in enumerate(steps):
        rec = {"type": "step", "rank": rank, "step": i, "wall_s": 0.010, "data_wait_s": 0.001, "gc_count": 0,
               "gc_pause_s": 0.0, "cpu_s": 0.008, "fluctuation": False, **s}  # fmt: skip
        rec.update((samples or {}).get(i, {}))
        lines.append(rec)
    lines.append({"type": "end", "rank": rank, "steps": len(steps)})
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"rank{rank}.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


def facts_of(run_dir: Path, kind: str) -> list:
    return [f for f in analyze_run_dir(run_dir).facts if f.kind == kind]


def spiky_steps() -> list[dict]:
    """100 steps of 10 ms; GC spikes (40 ms, 28 ms full collection) at 10, 30, 50, 70, 90; a
    checkpoint spike (35 ms, 25 ms save) at 60; a data-wait spike (30 ms, 21 ms wait) at 80."""
    steps = [{} for _ in range(100)]
    for i in (10, 30, 50, 70, 90):
        steps[i] = {"wall_s": 0.040, "gc_pause_s": 0.028, "gc_count": 3, "gc_gen2": 1}
    steps[60] = {"wall_s": 0.035, "events": {"checkpoint": 0.025}}
    steps[80] = {"wall_s": 0.030, "data_wait_s": 0.021}
    return steps


def test_spike_facts_by_hand(tmp_path):
    write_log(tmp_path, 0, spiky_steps())
    by_cause = {f.cause: f for f in facts_of(tmp_path, "monitor_spikes")}
    assert set(by_cause) == {"all", "gc", "checkpoint", "data_wait"}
    # steps 0-1 are warm-up: 98 analysed, 91 x 10 ms + 5 x 40 + 35 + 30 = 1175 ms
    total = 91 * 10 + 5 * 40 + 35 + 30
    gcf = by_cause["gc"]
    # the rolling median is exactly 10 ms and the MAD 0: each GC spike's excess is 30 ms
    assert gcf.spikes_count == 5 and gcf.spike_steps == [10, 30, 50, 70, 90]
    assert gcf.excess_us == pytest.approx(150_000) and gcf.excess_ratio == pytest.approx(150 / total)
    assert gcf.excess_per_step_us == pytest.approx(150_000 / 98) and gcf.mean_step_us == pytest.approx(total / 98 * 1e3)
    assert gcf.period_steps == 20 and gcf.period_regularity_ratio == 1.0
    assert gcf.with_gen2_ratio == 1.0 and gcf.with_gc_ratio == 1.0
    ck = by_cause["checkpoint"]
    assert ck.spike_steps == [60] and ck.excess_us == pytest.approx(25_000) and ck.events == ["checkpoint"]
    dw = by_cause["data_wait"]  # wait above the median wait (1 ms): 20 ms of a 20 ms excess
    assert dw.spike_steps == [80] and dw.excess_us == pytest.approx(20_000)
    alls = by_cause["all"]
    assert alls.spikes_count == 7 and alls.with_gc_ratio == pytest.approx(5 / 7)
    assert alls.with_event_ratio == pytest.approx(1 / 7) and alls.with_data_wait_ratio == pytest.approx(1 / 7)
    (steps,) = facts_of(tmp_path, "monitor_steps")
    assert steps.steps_count == 98 and steps.warmup_steps_count == 2 and steps.median_us == pytest.approx(10_000)
    assert steps.gc_ratio == pytest.approx(5 * 28 / total) and steps.gc_gen2_count == 5
    assert steps.data_wait_us == pytest.approx((97 * 1 + 21) / 98 * 1e3)


def test_slow_rank_unsynchronised(tmp_path):
    for r, wall in ((0, 0.010), (1, 0.015), (2, 0.010)):
        write_log(tmp_path, r, [{"wall_s": wall} for _ in range(50)])
    (f,) = facts_of(tmp_path, "monitor_slow_rank")
    assert (f.rank, f.group, f.synchronized, f.cause) == (1, "all", False, "compute")
    assert f.step_us == pytest.approx(15_000) and f.others_step_us == pytest.approx(10_000)
    assert f.excess_us == pytest.approx(5_000) and f.compute_excess_us == pytest.approx(5_000)
    assert f.excess_ratio == pytest.approx(1 / 3) and f.data_share_ratio == 0.0


def test_slow_rank_synchronised_by_data_and_by_cpu(tmp_path):
    # data: all ranks 20 ms (they wait for each other); rank 2 waits 6 ms for data, the others 1 ms
    d = tmp_path / "data"
    for r in range(4):
        write_log(d, r, [{"wall_s": 0.020, "data_wait_s": 0.006 if r == 2 else 0.001} for _ in range(30)])
    (f,) = facts_of(d, "monitor_slow_rank")
    assert (f.rank, f.synchronized, f.cause) == (2, True, "data_wait")
    assert f.data_wait_excess_us == pytest.approx(5_000) and f.excess_us == pytest.approx(5_000)
    # cpu: rank 1 burns 16 ms of CPU per step, the others 8 ms; no data wait: its 20 ms of own
    # work at its rate -> 20 x (1 - 8/16) = 10 ms of excess
    c = tmp_path / "cpu"
    for r in range(3):
        write_log(c, r, [{"wall_s": 0.020, "data_wait_s": 0.0, "cpu_s": 0.016 if r == 1 else 0.008} for _ in range(30)])
    (f,) = facts_of(c, "monitor_slow_rank")
    assert (f.rank, f.cause) == (1, "compute") and f.compute_excess_us == pytest.approx(10_000)
    assert f.excess_ratio == pytest.approx(0.5)


def test_slow_rank_data_prepared_in_process_is_not_counted_again_as_compute(tmp_path):
    # 2 ranks, synchronised at 24 ms. Rank 1 prepares its batches in the process (no workers):
    # 12 ms of data wait, all of it CPU (data_wait_cpu_s), and 22 ms of CPU per step in all;
    # rank 0 waits 0.4 ms for data and burns 12 ms. Without the wait's CPU, rank 1's own work
    # burns 22 - 12 = 10 ms against rank 0's 12 - 0.4 = 11.6 ms: no compute excess, the excess
    # is the data wait alone (12 - 0.4 = 11.6 ms). Counting the whole CPU time would add
    # (24 - 12) x (1 - 12/22) = 5.45 ms of "compute" on top (the wait's CPU counted twice).
    for r, (dw, cpu) in enumerate(((0.0004, 0.012), (0.012, 0.022))):
        write_log(tmp_path, r, [{"wall_s": 0.024, "data_wait_s": dw, "data_wait_cpu_s": dw, "cpu_s": cpu}
                                for _ in range(30)])  # fmt: skip
    (f,) = facts_of(tmp_path, "monitor_slow_rank")
    assert (f.rank, f.cause, f.measure) == (1, "data_wait", "cpu")
    assert f.data_wait_excess_us == pytest.approx(11_600) and f.compute_excess_us == pytest.approx(0.0)
    assert f.excess_us == pytest.approx(11_600) and f.per_rank_cpu_us == {1: pytest.approx(10_000), 0: pytest.approx(11_600)}
    # logs without the field (older monitors, or data waits measured without wrap()): unchanged
    old = tmp_path / "old"
    for r, (dw, cpu) in enumerate(((0.0004, 0.012), (0.012, 0.022))):
        write_log(old, r, [{"wall_s": 0.024, "data_wait_s": dw, "cpu_s": cpu} for _ in range(30)])
    (f,) = facts_of(old, "monitor_slow_rank")
    assert f.compute_excess_us == pytest.approx(12_000 * (1 - 12 / 22))


def test_slow_rank_when_collectives_are_timed_at_zero(tmp_path):
    # DDP on gloo issues its all-reduces from C++: the monitor's comm timing is on but sees 0 s on
    # both ranks. Rank 1 prepares batches in-process (10 ms of CPU-busy data wait); rank 0 waits
    # for it inside DDP's untimed all-reduce. "step less communication" would name rank 0 (its
    # whole step is "own work"); with nothing timed the CPU measure decides: rank 1, data.
    for r, (dw, cpu) in enumerate(((0.0004, 0.011), (0.010, 0.021))):
        write_log(tmp_path, r, [{"wall_s": 0.022, "data_wait_s": dw, "data_wait_cpu_s": dw, "cpu_s": cpu, "comm_s": 0.0}
                                for _ in range(30)])  # fmt: skip
    (f,) = facts_of(tmp_path, "monitor_slow_rank")
    assert (f.rank, f.cause, f.measure) == (1, "data_wait", "cpu")
    assert f.data_wait_excess_us == pytest.approx(9_600) and f.per_rank_comm_us == {}


def test_slow_rank_per_communication_domain(tmp_path):
    walls = {0: 0.010, 1: 0.012, 2: 0.020, 3: 0.030}
    for r, w in walls.items():
        write_log(tmp_path, r, [{"wall_s": w} for _ in range(20)], env={"domains": ["dp0" if r < 2 else "dp1", "all_tp"]})
    got = {f.group: (f.rank, round(f.excess_us)) for f in facts_of(tmp_path, "monitor_slow_rank")}
    # all_tp: rank 3 against the median of ranks 0, 1, 2 (12 ms) -> 18 ms
    assert got == {"dp0": (1, 2000), "dp1": (3, 10000), "all_tp": (3, 18000)}


def test_cpu_and_environment_facts(tmp_path):
    samples = {
        i: {"process_cpu_cores": 0.5, "system_cpu_ratio": 1.0, "affinity_count": 8, "runqueue_wait_ratio": 0.4,
            "children_cores": 0.0, "children_count": 0, "others_cores": 6.5, "siblings_cores": 0.0,
            "top_procs": [{"pid": 77, "name": "stress", "cores": 6.0 if i < 40 else 2.0, "rel": "other"},
                          {"pid": 5, "name": "python", "cores": 1.0, "rel": "sibling"}],
            "threads_count": 3, "torch_threads": 8}
        for i in range(0, 60, 20)
    }  # fmt: skip
    env = {"env": {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO", "NCCL_P2P_DISABLE": "1", "OMP_NUM_THREADS": "16"},
           "gc_thresholds": [100, 2, 2], "versions": {"python": "3.11", "torch": "2.13", "cuda": "12.4", "nccl": "2.21"}}  # fmt: skip
    write_log(tmp_path, 0, [{"wall_s": 0.020, "data_wait_s": 0.002, "cpu_s": 0.006, "gc_pause_s": 0.001}] * 60, env, samples)
    (c,) = facts_of(tmp_path, "monitor_cpu")
    assert c.samples_count == 3 and c.runqueue_wait_ratio == 0.4
    assert c.runqueue_wait_us == pytest.approx(0.4 * 20_000) and c.starved_us == pytest.approx(8_000 + 2_000)
    assert c.others_cores == 6.5 and c.top_other == "stress (pid 77)"
    assert c.top_other_cores == pytest.approx((6 + 6 + 2) / 3) and c.top_others == ["stress (pid 77): 4.67 cores"]
    assert c.threads_wanted_count == 8 and c.threads_per_core == 1.0 and not c.pinned
    # the job's 8 threads fit the 8 cores: all of the 8 ms wait is the other processes'
    assert c.wait_from_others_us == pytest.approx(8_000) and c.wait_from_own_us == pytest.approx(0.0)
    by_issue = {f.issue: f for f in facts_of(tmp_path, "monitor_env_setting")}
    assert set(by_issue) == {"launch_blocking", "debug_logging", "p2p_disabled", "omp_threads_too_high",
                             "gc_threshold_lowered"}  # fmt: skip
    lb = by_issue["launch_blocking"]
    # host 6 ms, the rest of the step 20 - 2 (data) - 6 = 12 ms: at most 6 ms could overlap
    assert lb.device == "gpu" and lb.hidden_bound_us == pytest.approx(6_000) and lb.share_ratio == pytest.approx(0.3)
    assert by_issue["gc_threshold_lowered"].hidden_bound_us == pytest.approx(1_000)
    report = hermes_kb.advise(tmp_path)
    ids = {f.case_id for f in report.findings}
    assert {"C-MON-007", "C-MON-010", "C-MON-011"} <= ids  # contention by stress, launch blocking, logging
    lb_finding = next(f for f in report.findings if f.case_id == "C-MON-010")
    assert lb_finding.expected_speedup.model_low == pytest.approx(20 / (20 - 0.5 * 6), abs=1e-3)
    assert lb_finding.expected_speedup.model_high == pytest.approx(20 / (20 - 6), abs=1e-3)
    dbg = next(f for f in report.findings if f.case_id == "C-MON-011")
    assert dbg.expected_speedup.model_low == 1.0 and dbg.severity != "high"
    contention = next(f for f in report.findings if f.case_id == "C-MON-007")
    assert contention.expected_speedup.model_low == pytest.approx(20 / (20 - 0.7 * 8), abs=1e-3)
    assert contention.expected_speedup.model_high == pytest.approx(20 / (20 - 8), abs=1e-3)


def test_runqueue_wait_split_between_others_and_own_threads(tmp_path):
    # 12 threads wanted (4 torch + 8 workers) on 8 cores: 4 threads too many; others use 4 cores:
    # the 10 ms wait (0.5 x 20 ms) splits 4 : 4
    samples = {i: {"process_cpu_cores": 3.0, "system_cpu_ratio": 1.0, "affinity_count": 8, "runqueue_wait_ratio": 0.5,
                   "children_cores": 3.0, "children_count": 8, "others_cores": 4.0, "siblings_cores": 0.0,
                   "top_procs": [{"pid": 9, "name": "stress", "cores": 4.0, "rel": "other"}], "torch_threads": 4}
               for i in range(0, 60, 20)}  # fmt: skip
    write_log(tmp_path, 0, [{"wall_s": 0.020, "cpu_s": 0.01}] * 60, {}, samples)
    (c,) = facts_of(tmp_path, "monitor_cpu")
    assert c.threads_wanted_count == 12 and c.threads_per_core == 1.5
    assert c.wait_from_others_us == pytest.approx(5_000) and c.wait_from_own_us == pytest.approx(5_000)
    ids = {f.case_id: f for f in hermes_kb.advise(tmp_path).findings}
    # both causes rest on the same facts: one finding, the other listed as related
    assert "C-MON-008" in ids["C-MON-007"].related
    assert ids["C-MON-007"].expected_speedup.model_high == pytest.approx(20 / (20 - 5), abs=1e-3)
    assert ids["C-MON-007"].expected_speedup.model_low == pytest.approx(20 / (20 - 0.7 * 5), abs=1e-3)


def test_oversubscription_counts_the_main_threads_barrier_sleeps(tmp_path):
    # CPU job on 2 cores: 8 torch threads + 2 workers, nobody else. Steps of 80 ms with 2 ms of
    # data wait; the main thread ran 25% of the time and waited for a CPU 55%: it slept
    # 80 x (1 - 0.25 - 0.55) - 2 = 14 ms per step. All the wait is the job's own (44 ms), so the
    # high end removes 44 + 14 = 58 ms, the low end half of the 44 ms.
    samples = {i: {"process_cpu_cores": 1.6, "system_cpu_ratio": 1.0, "affinity_count": 2, "runqueue_wait_ratio": 0.55,
                   "main_run_ratio": 0.25, "children_cores": 0.3, "children_count": 2, "others_cores": 0.0,
                   "siblings_cores": 0.0, "top_procs": [], "torch_threads": 8}
               for i in range(0, 40, 10)}  # fmt: skip
    env = {"cpu_count": 2, "affinity": [0, 1]}
    write_log(tmp_path / "cpu", 0, [{"wall_s": 0.080, "data_wait_s": 0.002}] * 40, env, samples)
    (c,) = facts_of(tmp_path / "cpu", "monitor_cpu")
    assert c.wait_from_own_us == pytest.approx(44_000) and c.main_sleep_us == pytest.approx(14_000)
    assert c.own_stall_us == pytest.approx(58_000)
    (f,) = [x for x in hermes_kb.advise(tmp_path / "cpu").findings if x.case_id == "C-MON-008"]
    assert f.expected_speedup.model_low == pytest.approx(80 / (80 - 0.5 * 44), abs=1e-3)
    assert f.expected_speedup.model_high == pytest.approx(80 / (80 - 58), abs=1e-3)
    assert "slept another 14.0 ms" in f.explanation
    # the same on a GPU rank (device step times recorded): its sleeps are device waits, not counted
    steps = [{"wall_s": 0.080, "data_wait_s": 0.002, **({"device_s": [[i, 0.07]]} if i else {})} for i in range(40)]
    write_log(tmp_path / "gpu", 0, steps, env, samples)
    (g,) = facts_of(tmp_path / "gpu", "monitor_cpu")
    assert g.main_sleep_us == pytest.approx(14_000) and g.own_stall_us == pytest.approx(44_000)
    # a log from before main_run_ratio was sampled: the run-queue wait alone
    old = {i: {k: v for k, v in x.items() if k != "main_run_ratio"} for i, x in samples.items()}
    write_log(tmp_path / "old", 0, [{"wall_s": 0.080, "data_wait_s": 0.002}] * 40, env, old)
    (o,) = facts_of(tmp_path / "old", "monitor_cpu")
    assert o.main_sleep_us is None and o.own_stall_us == pytest.approx(44_000)


def test_advise_findings_and_gains_on_synthetic_run(tmp_path):
    write_log(tmp_path, 0, spiky_steps())
    write_log(tmp_path, 1, [{"wall_s": 0.010}] * 100)
    report = hermes_kb.advise(tmp_path)
    by_id = {f.case_id: f for f in report.findings}
    gc_f = by_id["C-MON-001"]
    assert gc_f.ranks == [0] and gc_f.category == "cpu"
    # removes 150 ms / 98 steps per step, of a mean step of 1175 / 98 ms, fraction 0.6-0.95
    t, r = 1175 / 98, 150 / 98
    assert gc_f.expected_speedup.model_low == pytest.approx(t / (t - 0.6 * r), abs=1e-3)
    assert gc_f.expected_speedup.model_high == pytest.approx(t / (t - 0.95 * r), abs=1e-3)
    assert "every 20 steps" in gc_f.explanation
    assert by_id["C-MON-003"].ranks == [0]  # 25 ms / 1175 ms = 2.1% >= 2%: the checkpoint stall
    assert [s.steps_count for s in report.summary] == [98, 98]
    assert report.inputs.ranks == [0, 1]


def test_damaged_lines_warn_and_bad_dirs_fail_in_one_line(tmp_path):
    good = tmp_path / "good"
    p = write_log(good, 0, [{}] * 20)
    p.write_text(p.read_text() + '{"type": "step", "rank": 0, "st\n')
    report = hermes_kb.advise(good)
    assert any("skipped 1 damaged line(s)" in w for w in report.warnings)
    empty = tmp_path / "empty"
    empty.mkdir()
    no_steps = tmp_path / "nosteps"
    no_steps.mkdir()
    (no_steps / "rank0.jsonl").write_text("garbage\n")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hello")
    for d, code, text in ((empty, 5, "no trace files"), (no_steps, 5, "no monitor step records"),
                          (other, 5, "no trace files"), (tmp_path / "missing", 3, "no such file")):  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", str(d)], capture_output=True, text=True)
        assert out.returncode == code, out.stderr
        err = [x for x in out.stderr.splitlines() if x.startswith("hermes: error:")]
        assert len(err) == 1 and str(d) in err[0] and text in err[0] and "Traceback" not in out.stderr
    with pytest.raises(hermes_kb.NoTracesError):
        hermes_kb.analyze(no_steps)


def test_captured_traces_join_the_monitor_facts(tmp_path):
    write_log(tmp_path, 0, [{}] * 20)
    import shutil

    shutil.copy(ROOT / "examples/traces/cpu_dataloader_bound.json.gz", tmp_path / "rank0.captureauto1.json.gz")
    ra = analyze_run_dir(tmp_path)
    kinds = {f.kind for f in ra.facts}
    assert "monitor_steps" in kinds and "dataloader_wait" in kinds
    report = hermes_kb.advise(tmp_path)
    assert "C-IO-001" in {f.case_id for f in report.findings}  # found on the capture
    assert any(s.endswith("rank0.captureauto1.json.gz") for s in report.inputs.sources)


def _check_two_ranks(report: dict, min_excess: float = 0.15) -> None:
    by_id = {f["case_id"]: f for f in report["findings"]}
    assert by_id["C-MON-006"]["ranks"] == [1]  # the slow rank, by its own compute
    slow = next(e for e in by_id["C-MON-006"]["evidence"] if e["fact"] == "monitor_slow_rank")
    assert slow["values"]["cause"] == "compute" and slow["values"]["excess_ratio"] > min_excess
    assert by_id["C-MON-001"]["ranks"] == [0]  # the GC storm
    assert 1 not in by_id["C-MON-001"]["ranks"]


def test_recorded_two_rank_run():
    """The committed run (benchmarks/monitor_two_ranks.py): numbers checked by hand from
    its logs in test_recorded_numbers_by_hand."""
    out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", str(RECORDED), "--format", "json"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    _check_two_ranks(report)
    ckpt = next(f for f in report["findings"] if f["case_id"] == "C-MON-003")  # marked saves, told apart from GC
    assert ckpt["ranks"] == [0, 1]


def test_recorded_numbers_by_hand():
    import statistics

    walls = {}
    for r in (0, 1):
        recs = [json.loads(x) for x in (RECORDED / f"rank{r}.jsonl").read_text().splitlines()]
        walls[r] = [x["wall_s"] for x in recs if x["type"] == "step"][2:]
    (f,) = facts_of(RECORDED, "monitor_slow_rank")
    assert f.per_rank_step_us[1] == pytest.approx(statistics.median(walls[1]) * 1e6)
    assert f.others_step_us == pytest.approx(statistics.median(walls[0]) * 1e6)


def test_real_two_process_run(tmp_path):
    """Two real processes under the Monitor: rank 1 slow, rank 0 with a GC storm."""
    for attempt in range(2):  # a real 2-process run on a shared 2-core machine: one retry when load hid the slow rank
        run = tmp_path / f"run{attempt}"
        subprocess.run([sys.executable, str(ROOT / "benchmarks/monitor_two_ranks.py"), str(run), "--steps", "160"],
                       check=True, timeout=300)  # fmt: skip
        out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", str(run), "--format", "json"],
                             capture_output=True, text=True)  # fmt: skip
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        if any(f["case_id"] == "C-MON-006" for f in report["findings"]):
            break
    # a fresh run on a shared 2-core machine: rank 0's GC storm inflates the reference the slow
    # rank is measured against by a varying amount (10-30% excess seen), so only require a clear lead;
    # under other jobs' load the sleeps of its 1 ms loader stretch to the 4 ms scheduler tick and
    # their data wait can hide it (seen with the code before issue 22 as well)
    _check_two_ranks(report, min_excess=0.05)


def test_real_two_rank_gloo_run(tmp_path):
    """torch.distributed (gloo) + DDP: the ranks synchronise every step; the slow rank is found by
    its own CPU work, the GC storm by rank 0's spikes, and auto-captures are taken and analysed."""
    pytest.importorskip("torch", reason="torch is an optional extra (pip install 'hermes-kb[torch]')")
    for attempt in range(2):  # a real 2-process run on a shared 2-core machine: one retry when load hid the slow rank
        run = tmp_path / f"run{attempt}"
        # 300 steps: the monitor captures only after the warm-up it detects (70-90 steps here), and a
        # recurring slow step once it has seen three (issue 22)
        subprocess.run([sys.executable, str(ROOT / "benchmarks/monitor_two_ranks_gloo.py"), str(run),
                        "--steps", "300"], check=True, timeout=500, capture_output=True)  # fmt: skip
        assert list(run.glob("rank*.capture*.json.gz"))  # the triggers took captures
        out = subprocess.run([sys.executable, "-m", "hermes_kb.cli", "advise", str(run), "--format", "json"],
                             capture_output=True, text=True)  # fmt: skip
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        if any(f["case_id"] == "C-MON-006" for f in report["findings"]):
            break
    # a fresh run, like test_real_two_process_run: 9% excess seen once on a loaded 2-core machine
    _check_two_ranks(report, min_excess=0.05)
    slow = next(e for f in report["findings"] if f["case_id"] == "C-MON-006" for e in f["evidence"]
                if e["fact"] == "monitor_slow_rank")  # fmt: skip
    assert slow["values"]["synchronized"] is True
    assert any(s.endswith(".json.gz") for s in report["inputs"]["sources"])


def test_core_bound_by_hand():
    from hermes_kb.analyzers.monitor.loader_cores import bounded, busy_cores, job_cores
    from hermes_kb.facts.io import DataLoaderWait
    from hermes_kb.facts.monitor import MonitorCpu

    base = dict(data_wait_us=0.0, starved_us=0.0, starved_ratio=0.0, mean_step_us=1.0, samples_count=3, rank=0)
    wait = DataLoaderWait(rank=0, iterator="single_process", calls_count=5, wait_us=80.0, step_us=100.0,
                          step_share_ratio=0.8, cpu_ops_us=0.0, python_us=80.0, untraced_us=0.0, cpu_ops_ratio=0.0,
                          python_ratio=1.0, untraced_ratio=0.0, python_stacks=True, h2d_device_us=0.0,
                          processing_us=80.0, reading_us=0.0, fetching_us=0.0, worker_wait_us=0.0,
                          unattributed_us=0.0, data_time_us=80.0, data_share_ratio=0.8,
                          classification="processing", classification_ratio=1.0)  # fmt: skip
    # 1 busy core of 2: the step cannot go below 100 x 1/2 = 50 (> the 20 outside loading): 50 can go
    two = MonitorCpu(machine_cores=2, usable_cores=2, host_usable_cores=2, process_cores=1.0, children_cores=0.0, **base)
    b = bounded(wait, two)
    assert (b.job_cores, b.busy_cores, b.core_bound_us) == (2.0, 1.0, pytest.approx(50.0))
    # the cores are full (1.9 of 2): only 5 can go
    full = two.model_copy(update={"process_cores": 0.4, "children_cores": 1.5})
    assert bounded(wait, full).core_bound_us == pytest.approx(5.0)
    # plenty of idle cores: the bound is the data time itself (the step keeps its 20 outside loading)
    many = two.model_copy(update={"machine_cores": 32, "usable_cores": 32, "host_usable_cores": 32})
    assert bounded(wait, many).core_bound_us == pytest.approx(80.0)
    # pinned to 1 of 4 cores: unpinning is part of the advice, so the budget is the machine's, per rank on the host
    pinned = two.model_copy(update={"machine_cores": 4, "usable_cores": 1, "host_usable_cores": 1, "pinned": True,
                                    "host_ranks_count": 2})  # fmt: skip
    assert job_cores(pinned) == 2.0
    # no monitor CPU samples: no bound
    assert bounded(wait, two.model_copy(update={"process_cores": None})).core_bound_us is None
    # the scans missed the workers (children unknown) but the machine was 100% busy: its 2 busy
    # cores are the measure; nothing idle is left for more workers
    unscanned = two.model_copy(update={"process_cores": 0.45, "children_cores": None, "system_busy_ratio": 1.0})
    b = bounded(wait, unscanned)
    assert (b.busy_cores, b.core_bound_us) == (pytest.approx(2.0), pytest.approx(0.0))
    # the machine 75% busy (1.5 cores) while the job itself used 1: others hold half a core, the
    # step cannot go below 100 x 1.5/2 = 75, so 25 can go
    others = two.model_copy(update={"system_busy_ratio": 0.75})
    assert bounded(wait, others).core_bound_us == pytest.approx(25.0)
    # two ranks on the host: the machine's busy cores are shared between them (1.5 / 2 per rank)
    shared = two.model_copy(update={"machine_cores": 4, "system_busy_ratio": 0.75, "host_ranks_count": 2})
    assert busy_cores(shared) == pytest.approx(1.5)


def test_core_bound_caps_the_loader_gain(tmp_path):
    # the bundled example (single-process loader, 1 trainer thread) captured in a run whose monitor saw
    # the process use 1 core of 2: moving the transform to workers cannot beat half the step
    samples = {i: {"process_cpu_cores": 1.0, "system_cpu_ratio": 0.5, "affinity_count": 2, "runqueue_wait_ratio": 0.0,
                   "children_cores": 0.0, "children_count": 0, "others_cores": 0.0, "siblings_cores": 0.0,
                   "top_procs": [], "torch_threads": 1} for i in range(0, 60, 20)}  # fmt: skip
    write_log(tmp_path, 0, [{"wall_s": 0.070, "cpu_s": 0.07}] * 60, {"cpu_count": 2, "affinity": [0, 1]}, samples)
    import shutil

    shutil.copy(ROOT / "examples/traces/cpu_dataloader_bound.json.gz", tmp_path / "rank0.captureauto1.json.gz")
    (d,) = [f for f in facts_of(tmp_path, "dataloader_wait") if f.step is None]
    t, r = d.step_us, d.processing_us
    assert d.job_cores == 2.0 and d.busy_cores == 1.0
    assert d.core_bound_us == pytest.approx(t - max(t - d.data_time_us, t / 2))
    f = next(f for f in hermes_kb.advise(tmp_path).findings if f.case_id == "C-IO-001")
    cap = d.core_bound_us
    assert cap < 0.95 * r  # the bound binds
    assert f.expected_speedup.model_high == pytest.approx(t / (t - cap), rel=1e-3)
    assert f.expected_speedup.model_low == pytest.approx(t / (t - min(0.5 * r, cap)), rel=1e-3)
    assert "Bound: at most" in f.assumption and "cores per rank on this machine" in f.explanation
    # without the monitor the same trace keeps the unbounded range
    plain = next(f for f in hermes_kb.advise(tmp_path / "rank0.captureauto1.json.gz").findings if f.case_id == "C-IO-001")
    assert plain.expected_speedup.model_high == pytest.approx(t / (t - 0.95 * r), rel=1e-3)


def test_profiler_overhead_by_hand():
    from array import array

    from hermes_kb.analyzers.monitor.profiler_overhead import overhead_of
    from hermes_kb.monitor.reader import RankLog

    # 12 steps back to back from t = 1000 s: 10 ms each, except steps 6-8 (15 ms), the profiled ones
    walls = [0.010] * 6 + [0.015] * 3 + [0.010] * 3
    ends, t = [], 1000.0
    for w in walls:
        t += w
        ends.append(t)
    log = RankLog(rank=0, path="x", step=array("q", range(12)), wall_s=array("d", walls), end_s=array("d", ends))
    start6 = (ends[5]) * 1e6
    windows = [(start6 + 100.0, ends[8] * 1e6 - 100.0)]  # the capture's steps, a little inside the monitor's
    oh = overhead_of(0, log, windows)
    # warm-up steps 0-1 and step 9 (after the capture, which writes the trace) left out
    assert oh.profiled_steps_count == 3 and oh.unprofiled_steps_count == 12 - 3 - 2 - 1
    assert oh.profiled_step_us == pytest.approx(15_000) and oh.unprofiled_step_us == pytest.approx(10_000)
    assert oh.added_per_step_us == pytest.approx(5_000) and oh.added_ratio == pytest.approx(1 / 3)
    assert oh.inflation_factor == pytest.approx(1.5)
    # clocks that do not meet: no fact, rather than a wrong one
    assert overhead_of(0, log, [(1.0, 2.0)]) is None
    # ... unless the monitor's own capture record names the steps (6-8; step 9 wrote the trace)
    from hermes_kb.analyzers.monitor.profiler_overhead import _captured

    log.captures.append({"type": "capture", "step": 8, "steps": 3, "trace": "/run/rank0.capture17.json.gz"})
    assert _captured(log, "/elsewhere/rank0.capture17.json.gz") == (6, 8)
    assert _captured(log, "/run/rank0.capture18.json.gz") is None
    oh = overhead_of(0, log, [(1.0, 2.0)], captured=(6, 8))
    assert oh.profiled_steps_count == 3 and oh.unprofiled_steps_count == 12 - 4 - 2
    assert oh.added_per_step_us == pytest.approx(5_000)


def test_profiler_overhead_on_a_recorded_run(tmp_path):
    # the vectorised dispatch twin: its profiled steps are the monitor's last six; the first two are
    # left out, the one before the six (the profiler's warm-up step, no events kept) counts as unprofiled
    import shutil
    import statistics

    run = ROOT / "benchmarks/scenarios/recorded/dispatch_tiny_ops/fixed"
    recs = [json.loads(x) for x in (run / "rank0.jsonl").read_text().splitlines()]
    walls = {r["step"]: r["wall_s"] * 1e6 for r in recs if r.get("type") == "step"}
    n = len(walls)

    def q1(xs: list[float]) -> float:  # the lower quartile, as numpy's default percentile
        return statistics.quantiles(xs, n=4, method="inclusive")[0]

    prof = q1([walls[s] for s in range(n - 6, n)])
    unprof = q1([walls[s] for s in range(2, n - 6)])
    (oh,) = facts_of(run, "profiler_overhead")
    assert oh.profiled_steps_count == 6 and oh.unprofiled_steps_count == n - 8  # the capture is the run's end
    assert oh.profiled_step_us == pytest.approx(prof) and oh.unprofiled_step_us == pytest.approx(unprof)
    (u,) = [f for f in facts_of(run, "untraced_host_time") if f.step is None]
    added = u.window_us * (prof - unprof) / prof
    assert u.profiler_added_us == pytest.approx(added)
    (c,) = facts_of(run, "monitor_cpu")
    waited = u.window_us * c.runqueue_wait_ratio
    assert u.cpu_wait_us == pytest.approx(waited)
    assert u.python_own_us == pytest.approx(max(u.python_us - added - waited, 0.0))
    # the trace alone calls its Python between operators a problem; with the monitor's timing it is
    # no more than what the profiler added, and the finding goes
    shutil.copy(run / "rank0.capture-profile.json.gz", tmp_path / "t.json.gz")
    assert "C-CPU-003" in {f.case_id for f in hermes_kb.advise(tmp_path / "t.json.gz").findings}
    report = hermes_kb.advise(run)
    assert "C-CPU-003" not in {f.case_id for f in report.findings}
    assert any("profiling slowed the captured steps" in w for w in report.warnings)


def test_waits_for_a_cpu_are_taken_out_of_the_python_time(tmp_path):
    # the vectorised dispatch twin's capture alone: 31% of its step is Python between operators and
    # C-CPU-003 fires; beside a (hand-made) monitor log whose samples say the thread waited for a CPU
    # half of the time, that Python is within the waits (python_own = max(python - wait, 0) = 0)
    import shutil

    samples = {i: {"process_cpu_cores": 1.0, "system_cpu_ratio": 1.0, "affinity_count": 2, "runqueue_wait_ratio": 0.5,
                   "children_cores": 0.0, "children_count": 0, "others_cores": 1.0, "siblings_cores": 0.0,
                   "top_procs": [], "torch_threads": 1} for i in range(0, 60, 20)}  # fmt: skip
    write_log(tmp_path, 0, [{"wall_s": 0.002, "cpu_s": 0.001}] * 60, {"cpu_count": 2, "affinity": [0, 1]}, samples)
    trace = ROOT / "benchmarks/scenarios/recorded/dispatch_tiny_ops/fixed/rank0.capture-profile.json.gz"
    shutil.copy(trace, tmp_path / "rank0.captureauto1.json.gz")
    assert "C-CPU-003" in {f.case_id for f in hermes_kb.advise(tmp_path / "rank0.captureauto1.json.gz").findings}
    (u,) = [f for f in facts_of(tmp_path, "untraced_host_time") if f.step is None]
    assert u.python_ratio > 0.15 and u.profiler_added_us == 0.0  # the log's clock never meets the capture's
    assert u.cpu_wait_us == pytest.approx(0.5 * u.window_us) and u.python_own_us == 0.0
    assert "C-CPU-003" not in {f.case_id for f in hermes_kb.advise(tmp_path).findings}


def test_cpu_wait_is_not_python_work():
    # the unpinned loader twin: 2 workers and the trainer on 2 cores; the trainer waited for a core
    # 27% of the time (the monitor's run-queue share), which is not interpreter work. (In the 2026-11-22
    # recording its Python gaps, 26% of the step, were all such waits, and the trace alone fired
    # C-CPU-003; on the faster host of the current recording they are 6% of the step.)
    run = ROOT / "benchmarks/scenarios/recorded/loader_workers_pinned/fixed"
    (c,) = facts_of(run, "monitor_cpu")
    (u,) = [f for f in facts_of(run, "untraced_host_time") if f.step is None]
    assert c.runqueue_wait_ratio > 0.2
    assert u.cpu_wait_us == pytest.approx(u.window_us * c.runqueue_wait_ratio)
    assert u.python_own_us == pytest.approx(max(u.python_us - u.profiler_added_us - u.cpu_wait_us, 0.0))
    assert "C-CPU-003" not in {f.case_id for f in hermes_kb.advise(run).findings}


def faulting_steps() -> list[dict]:
    """40 steps of 10 ms: 3 ms of system time and 2000 minor faults each (1.5 us per fault), of
    which 1200 faults and 2 ms inside a 6 ms optimizer.step(); every 4th step (accumulation) has
    no optimizer step and faults only 800 times for 1 ms of system time."""
    steps = []
    for i in range(40):
        if i % 4 == 3:
            steps.append({"wall_s": 0.010, "sys_s": 0.001, "minflt": 800})
        else:
            steps.append({"wall_s": 0.010, "sys_s": 0.003, "minflt": 2000, "optimizer_s": 0.006,
                          "optimizer_sys_s": 0.002, "optimizer_minflt": 1200})  # fmt: skip
    return steps


def test_page_fault_fact_by_hand(tmp_path):
    write_log(tmp_path, 0, faulting_steps())
    (f,) = facts_of(tmp_path, "monitor_page_faults")
    # steps 2..39 (2 warm-up steps dropped): 38 steps, of which 3, 7, ..., 39 = 10 without step()
    n, quiet = 38, 10
    assert f.steps_count == n
    assert f.faults_per_step == pytest.approx(((n - quiet) * 2000 + quiet * 800) / n)
    assert f.sys_us == pytest.approx(((n - quiet) * 3000 + quiet * 1000) / n)
    assert f.sys_ratio == pytest.approx(f.sys_us / 10000)
    assert f.sys_us_per_fault == pytest.approx(f.sys_us / f.faults_per_step)
    assert f.faulted_mb_per_step == pytest.approx(f.faults_per_step * 4096 / 1e6)
    assert f.optimizer_us == pytest.approx((n - quiet) * 6000 / n)
    assert f.optimizer_sys_us == pytest.approx((n - quiet) * 2000 / n)
    assert f.optimizer_faults_per_step == pytest.approx((n - quiet) * 1200 / n)
    assert f.outside_optimizer_sys_us == pytest.approx(f.sys_us - f.optimizer_sys_us)
    report = hermes_kb.advise(tmp_path)
    (pf,) = [x for x in report.findings if x.case_id == "C-MON-012"]
    t, r = 10000.0, f.sys_us  # fraction 0.5-1.0 of the system time
    assert pf.expected_speedup.model_low == pytest.approx(t / (t - 0.5 * r), abs=1e-3)
    assert pf.expected_speedup.model_high == pytest.approx(t / (t - r), abs=1e-3)


def test_page_faults_absent_or_explained_by_other_kernel_work(tmp_path):
    write_log(tmp_path / "old", 0, [{"wall_s": 0.010}] * 20)  # a log from before the fields existed
    assert facts_of(tmp_path / "old", "monitor_page_faults") == []
    # 5 ms of system time per step for 300 faults (16.7 us each) passes R-MON-009 and C-MON-012 (<= 20 us);
    # 9 ms for 300 (30 us each: writes, reads) passes the rule only
    write_log(tmp_path / "io", 0, [{"wall_s": 0.010, "sys_s": 0.009, "minflt": 300}] * 20)
    write_log(tmp_path / "fa", 0, [{"wall_s": 0.010, "sys_s": 0.005, "minflt": 300}] * 20)
    assert "C-MON-012" not in {f.case_id for f in hermes_kb.advise(tmp_path / "io").findings}
    assert "C-MON-012" in {f.case_id for f in hermes_kb.advise(tmp_path / "fa").findings}


def test_transport_disabled_bounded_by_collective_time(tmp_path):
    # comm_s 4 ms of a 20 ms step on every step: NCCL_P2P_DISABLE can cost at most those 4 ms;
    # NCCL_IB_DISABLE only when the ranks sit on more than one host
    env = {"env": {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}, "versions": {"python": "3.11", "nccl": "2.21"}}
    one = tmp_path / "one"
    for r in range(2):
        write_log(one, r, [{"wall_s": 0.020, "comm_s": 0.004}] * 30, env)
    got = {(f.rank, f.issue): f for f in facts_of(one, "monitor_env_setting")}
    assert got[(0, "p2p_disabled")].hidden_bound_us == pytest.approx(4_000)
    assert got[(0, "p2p_disabled")].share_ratio == pytest.approx(0.2)
    assert got[(0, "ib_disabled")].hidden_bound_us == 0.0  # both ranks on host h0
    two = tmp_path / "two"
    for r in range(2):
        write_log(two, r, [{"wall_s": 0.020, "comm_s": 0.004}] * 30, {**env, "hostname": f"h{r}"})
    got = {(f.rank, f.issue): f for f in facts_of(two, "monitor_env_setting")}
    assert got[(1, "ib_disabled")].hidden_bound_us == pytest.approx(4_000)
    ids = {f.case_id for f in hermes_kb.advise(two).findings}
    assert {"C-COMM-013", "C-COMM-014"} <= ids


def test_nccl_overrides_gdr_and_version_mismatch(tmp_path):
    # three ranks on two hosts; rank 1 forces NCCL's protocol and algorithm, turns GPUDirect RDMA
    # off, runs an older NCCL than the other two, and is 10 ms slower per step (its own CPU work)
    for r in range(3):
        nccl = "2.18.1" if r == 1 else "2.21.5"
        env = {"env": {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring", "NCCL_NET_GDR_LEVEL": "LOC"} if r == 1 else {},
               "versions": {"python": "3.11", "torch": "2.4", "nccl": nccl}, "hostname": f"h{min(r, 1)}"}  # fmt: skip
        wall, cpu = (0.030, 0.018) if r == 1 else (0.020, 0.008)
        write_log(tmp_path, r, [{"wall_s": wall, "cpu_s": cpu, "comm_s": 0.004}] * 30, env)
    got = {(f.rank, f.issue): f for f in facts_of(tmp_path, "monitor_env_setting")}
    t = got[(1, "nccl_tuning_overridden")]
    assert t.variable == "NCCL_ALGO,NCCL_PROTO" and t.value == "NCCL_ALGO=Ring,NCCL_PROTO=Simple"
    assert t.hidden_bound_us == pytest.approx(4_000)
    g = got[(1, "gdr_disabled")]
    assert g.variable == "NCCL_NET_GDR_LEVEL" and g.hidden_bound_us == pytest.approx(4_000)  # two hosts
    v = got[(1, "versions_differ")]
    assert v.variable == "nccl" and v.value == "nccl 2.18.1 (most ranks 2.21.5)" and v.hidden_bound_us == 0.0
    assert not [k for k in got if k[0] != 1]  # ranks 0 and 2 match the majority and set nothing
    ids = {f.case_id for f in hermes_kb.advise(tmp_path).findings}
    assert {"C-COMM-015", "C-COMM-017", "C-PAR-005"} <= ids
