"""``workers.in_two``: the same numbers split over two processes as computed here, and a child
that dies costs nothing but time."""

from __future__ import annotations

import os

import pytest

from hermes_kb import workers

pytestmark = pytest.mark.skipif(not workers.can_fork(), reason="needs fork")


@pytest.fixture
def free_core(monkeypatch):
    monkeypatch.setattr(workers, "core_free", lambda: True)


def _fork_count(monkeypatch) -> list[int]:
    forks: list[int] = []
    real = os.fork

    def counted():
        forks.append(1)
        return real()

    monkeypatch.setattr(os, "fork", counted)
    return forks


def test_split_results_equal_the_sequential_ones(free_core, monkeypatch):
    forks = _fork_count(monkeypatch)
    items = [0.1 * k for k in range(7)]
    got = workers.in_two(lambda x: x * x / 3.0, items)
    assert forks == [1]
    assert got == [x * x / 3.0 for x in items]  # bit for bit: doubles sent as doubles


def test_the_childs_items_are_redone_here_when_it_dies(free_core, monkeypatch):
    parent = os.getpid()

    def fn(x):
        if os.getpid() != parent:
            os._exit(3)  # the child dies before sending anything
        return x + 1.0

    assert workers.in_two(fn, [1.0, 2.0, 3.0, 4.0]) == [2.0, 3.0, 4.0, 5.0]


def test_no_second_process_when_no_core_is_free_or_one_item(monkeypatch):
    forks = _fork_count(monkeypatch)
    monkeypatch.setattr(workers, "core_free", lambda: False)
    assert workers.in_two(lambda x: x * 2.0, [1.0, 2.0]) == [2.0, 4.0]
    monkeypatch.setattr(workers, "core_free", lambda: True)
    assert workers.in_two(lambda x: x * 2.0, [1.0]) == [2.0]
    assert forks == []


def test_hermes_no_split_says_no(monkeypatch):
    monkeypatch.setenv("HERMES_NO_SPLIT", "1")
    assert not workers.core_free()


def test_an_exception_in_this_process_is_raised_and_the_child_reaped(free_core):
    def fn(x):
        if x == 0.0:
            raise ValueError("bad item")
        return x

    with pytest.raises(ValueError, match="bad item"):
        workers.in_two(fn, [0.0, 1.0])
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no child left behind
