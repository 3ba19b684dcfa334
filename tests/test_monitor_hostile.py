"""The monitor never harms the training it watches (issue 37): a hostile writer replaces the
capture request and the peers' files with every kind of damage while a training loop runs, and
every step completes, nothing is written outside the run directory, the process does not grow,
and each refused request is a note in the rank's log."""

from __future__ import annotations

import json
import os
import resource
import threading
import time
from pathlib import Path

import pytest

from hermes_kb.monitor import Monitor
from hermes_kb.monitor.capture import REQUEST, valid_request
from hermes_kb.monitor.safe_read import read_small_json
from hostile import FakeProfiler


def _hostile_requests(tmp: Path) -> list:
    """What the adversarial run wrote into profile.request (as bytes, or a callable that makes
    the path something else)."""
    def fifo(p: Path) -> None:
        os.mkfifo(p)

    def to_dev_zero(p: Path) -> None:
        os.symlink("/dev/zero", p)

    def huge(p: Path) -> None:
        p.write_bytes(b'{"id": "x", "steps": 2, "pad": "' + b"a" * (2 << 20) + b'"}')

    return [
        b'{"steps": 2}',                                 # no id
        b'{"id": [1], "steps": 2}',                      # a list id
        b'{"id": "a", "steps": "three"}',
        b'{"id": "b", "steps": NaN}',
        b'{"id": "c", "steps": Infinity}',
        b'{"id": "d", "steps": 1000000000000}',
        b'{"id": "/../../../x/pwned", "steps": 1}',
        b'{"id": "e", "steps": 1, "start_after": "soon"}',
        b"[1, 2, 3]",
        b"\xff\xfe garbage",
        fifo, to_dev_zero, huge,
        b'{"id": "ok1", "steps": 1, "reason": "a good one among them"}',
    ]


def _replace(path: Path, what) -> None:
    tmp = path.with_name(path.name + ".hostile")
    for p in (tmp, path):
        try:
            p.unlink()
        except FileNotFoundError:
            pass
    if callable(what):
        what(tmp)
    else:
        tmp.write_bytes(what)
    os.replace(tmp, path)


def test_request_validation():
    assert valid_request({"id": "123", "steps": 3}, 100)[0] == {"id": "123", "steps": 3, "reason": ""}
    for bad in ({"steps": 2}, {"id": [1]}, {"id": "a", "steps": "three"}, {"id": "a", "steps": float("nan")},
                {"id": "a", "steps": True}, {"id": "a", "steps": 101}, {"id": "../x", "steps": 1}, [1], None):  # fmt: skip
        req, why = valid_request(bad, 100)
        assert req is None and why


def test_small_json_reader_refuses_what_could_block_or_bloat(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero")
    (tmp_path / "big").write_bytes(b"[" + b"1," * 100000 + b"1]")
    (tmp_path / "ok").write_text('{"a": 1}')
    assert read_small_json(tmp_path / "ok") == ({"a": 1}, None)
    for name in ("fifo", "zero", "big"):
        value, why = read_small_json(tmp_path / name)
        assert value is None and why, name
    assert read_small_json(tmp_path / "absent") == (None, None)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs mkfifo")
def test_a_training_loop_survives_a_hostile_writer(tmp_path):
    run = tmp_path / "run"
    outside = tmp_path / "x"
    steps_done = 0
    stop = threading.Event()
    hostile = _hostile_requests(tmp_path)
    peers = [b'{"rank": 1, "time": 1e308, "domains": [[1]], "wall_s": "x"}', b"\x00" * 100, lambda p: os.mkfifo(p),
             lambda p: os.symlink("/dev/zero", p)]  # fmt: skip

    def writer() -> None:
        i = 0
        while not stop.is_set():
            _replace(run / REQUEST, hostile[i % len(hostile)])
            (run / "peers").mkdir(exist_ok=True)
            _replace(run / "peers" / "rank1.json", peers[i % len(peers)])
            i += 1
            time.sleep(0.005)

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with Monitor(run, rank=0, profiler_factory=FakeProfiler, poll_s=0.001, sample_every=1, procs_every_s=0,
                 device_events=False, flops=False, peers_every_s=0.01, warmup=2, domains=["dp"]) as mon:  # fmt: skip
        t = threading.Thread(target=writer, daemon=True)
        t.start()
        for _ in range(400):
            time.sleep(0.001)
            mon.step()
            steps_done += 1
        stop.set()
        t.join(5)
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert steps_done == 400
    assert not outside.exists() and not (tmp_path / "pwned").exists()
    assert all(p.parent.resolve() in (run.resolve(), (run / "peers").resolve()) for p in run.rglob("*"))  # the writer's links point anywhere
    assert rss1 - rss0 < 200 * 1024  # kB: nothing read the 2 MB request or /dev/zero
    notes = [json.loads(line) for line in (run / "rank0.monitor.jsonl").read_text().splitlines()]
    refused = [n for n in notes if n.get("type") == "request_refused"]
    assert refused and all("ignored" in n["reason"] for n in refused)
    log = [json.loads(line) for line in (run / "rank0.jsonl").read_text().splitlines()]
    assert len([r for r in log if r.get("type") in (None, "step") and "wall_s" in r]) >= 390


def test_two_logs_claiming_one_rank_are_both_skipped(tmp_path):
    """rank01.jsonl beside rank1.jsonl (or a rank written in non-ASCII digits): no log silently
    wins; the claims are named in a warning and the other ranks are read (issue 37)."""
    import shutil

    from hermes_kb.monitor.reader import read_run

    two = Path(__file__).resolve().parent / "data/monitor_runs/two_ranks"
    for name in ("rank0.jsonl", "rank1.jsonl"):
        shutil.copy(two / name, tmp_path / name)
    shutil.copy(two / "rank0.jsonl", tmp_path / "rank01.jsonl")
    shutil.copy(two / "rank0.jsonl", tmp_path / "rank\u00b2.jsonl")  # superscript two: not a rank log
    run = read_run(tmp_path)
    assert sorted(run.ranks) == [0]
    msg = " ".join(run.warnings)
    assert "rank 1 is claimed by 2 logs (rank01.jsonl, rank1.jsonl): all of them skipped" in msg


WEIRD = ([1], {"a": 1}, None, "x", 1e308, -1, True, 2**70, 2**63 - 1, "")


def test_notes_of_any_shape_never_raise(tmp_path):
    """Every field of every note of a real 2-rank run replaced by a value of another type or range
    (a list id, a dict name, a huge integer, ...): the notes' readers give lines, never an
    exception (issue 37: a list id raised TypeError, a domain with a list name IndexError)."""
    import shutil

    from hermes_kb.analyzers.monitor.notes import notes_warnings
    from hermes_kb.analyzers.monitor.run_log import monitor_facts, summary_of
    from hermes_kb.monitor.reader import read_run

    src = Path(__file__).resolve().parents[1] / "benchmarks/scenarios/recorded/dist_slow_rank_compute/bad"
    for p in src.glob("rank*.jsonl"):
        shutil.copy(p, tmp_path / p.name)
    path = tmp_path / "rank0.monitor.jsonl"
    recs = [json.loads(line) for line in (src / "rank0.monitor.jsonl").read_text().splitlines()]
    done = 0
    for i, rec in enumerate(recs):
        for key in rec:
            if key == "type":
                continue
            for value in WEIRD:
                bad = [dict(r) for r in recs]
                bad[i][key] = value
                if key == "domains":  # and inside the domain records too
                    bad[i][key] = [{"name": value, "ranks": value, "backend": value}]
                path.write_text("\n".join(json.dumps(r) for r in bad) + "\n")
                run = read_run(tmp_path)
                assert isinstance(notes_warnings(run), list)
                monitor_facts(run)
                summary_of(run)
                done += 1
    assert done > 100
