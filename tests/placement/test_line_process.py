"""The relaxed DP's line test in a child process: it answers what the test answers in
this process (a proof just under the brute-force optimum, none at it), names why when
the child fails, and is stopped when the planner is done with it."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from placement.line_process import LineProcess, spare_core
from placement.sequence_dp import _Model, line_test
from tests.placement.test_sequence_dp import _case


@pytest.mark.parametrize("seed", [3, 8, 21])
def test_the_child_proves_just_under_the_optimum_and_not_at_it(seed):
    """Without dropped senders and with cells finer than any load the test is the
    exact DP's: under the optimum it proves, at it a placement exists."""
    p, units, optimum = _case(seed)
    k, merge = p.num_devices, 1e-9 * optimum
    for bound, proves in ((optimum * (1 - 1e-6), True), (optimum, False)):
        assert line_test(p.tg, units, k, 0.0, bound, math.inf, 10**6, merge) is proves
        child = LineProcess(p.tg, units, k, 0.0, bound, time.perf_counter() + 60, 10**6,
                            merge)
        try:
            assert child.proven(wait_until=time.perf_counter() + 60) is proves
            assert child.failure is None
        finally:
            child.close()


def test_cells_that_let_a_relaxed_placement_through_are_narrowed():
    """Seed 20 (7 units, 2 devices) just under its optimum, 61: cells of 0.3 x 61 merge
    states into one that fits, so that test alone proves nothing; the line test runs
    again with narrower cells and proves."""
    p, units, optimum = _case(20)
    k, bound, merge = p.num_devices, optimum * (1 - 1e-6), 0.3 * optimum
    assert optimum == 61
    assert not _Model(p.tg, units, k, 0.0).proves(bound, math.inf, 10**6, merge, pace=False)
    assert line_test(p.tg, units, k, 0.0, bound, math.inf, 10**6, merge)
    assert not line_test(p.tg, units, k, 0.0, optimum, math.inf, 10**6, merge)


def test_a_child_that_fails_names_why_and_proves_nothing():
    p, units, optimum = _case(3)
    bad_units = [*units, [p.tg.num_groups + 5]]  # a group the graph does not have
    child = LineProcess(p.tg, bad_units, p.num_devices, 0.0, 0.5 * optimum,
                        time.perf_counter() + 60, 10**6, 0.0)
    try:
        assert child.proven(wait_until=time.perf_counter() + 60) is False
        assert child.failure is not None and "IndexError" in child.failure
    finally:
        child.close()


def test_close_stops_a_running_child_and_removes_its_input():
    p, units, optimum = _case(3)
    child = LineProcess(p.tg, units, p.num_devices, 0.0, optimum,
                        time.perf_counter() + 60, 10**6, 0.0)
    child.close()
    assert child._proc.poll() is not None
    assert not Path(child._path).exists()
    assert child.proven() is False
    assert child.failure is None  # stopped by the planner, not failed


def test_one_thread_asked_for_leaves_no_core_to_spare():
    assert spare_core(1) is False
