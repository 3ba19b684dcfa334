"""``workers.in_two``: the same numbers split over two processes as computed here, and a child
that dies costs nothing but time. Run in a fresh interpreter: a process where Dask has run keeps
threads and no longer forks."""

from __future__ import annotations

import os

import pytest
from conftest import in_fresh_process

from hermes_kb.core import workers

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

_SETUP = """
import os
from hermes_kb.core import workers
forks = []
real = os.fork
def counted():
    forks.append(1)
    return real()
os.fork = counted
workers.core_free = lambda: True
"""


def test_split_results_equal_the_sequential_ones():
    in_fresh_process(_SETUP + """
items = [0.1 * k for k in range(7)]
got = workers.in_two(lambda x: x * x / 3.0, items)
assert forks == [1], forks
assert got == [x * x / 3.0 for x in items]  # bit for bit: doubles sent as doubles
""")


def test_the_childs_items_are_redone_here_when_it_dies():
    in_fresh_process(_SETUP + """
parent = os.getpid()
def fn(x):
    if os.getpid() != parent:
        os._exit(3)  # the child dies before sending anything
    return x + 1.0
assert workers.in_two(fn, [1.0, 2.0, 3.0, 4.0]) == [2.0, 3.0, 4.0, 5.0]
assert forks == [1]
""")


def test_an_exception_here_is_raised_and_the_child_reaped():
    in_fresh_process(_SETUP + """
def fn(x):
    if x == 0.0:
        raise ValueError("bad item")
    return x
try:
    workers.in_two(fn, [0.0, 1.0])
    raise SystemExit("no exception")
except ValueError:
    pass
try:
    os.waitpid(-1, os.WNOHANG)
    raise SystemExit("a child is left")
except ChildProcessError:
    pass
""")


def test_no_second_process_when_no_core_is_free_or_one_item(monkeypatch):
    forks: list[int] = []
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or 0)
    monkeypatch.setattr(workers, "core_free", lambda: False)
    assert workers.in_two(lambda x: x * 2.0, [1.0, 2.0]) == [2.0, 4.0]
    monkeypatch.setattr(workers, "core_free", lambda: True)
    assert workers.in_two(lambda x: x * 2.0, [1.0]) == [2.0]
    assert forks == []


def test_hermes_no_split_says_no(monkeypatch):
    monkeypatch.setenv("HERMES_NO_SPLIT", "1")
    assert not workers.core_free()
