"""Pool moves and boundary swaps never make a plan worse, report the simulator's value
of what they return, keep each unit whole, and reach plans single-group local search
does not; boundary swaps keep a binding memory cap and reach plans pool moves do not;
the max-load search reaches local search's plans."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.pool_moves import boundary_swaps, max_load_search, pool_moves
from placement.refine import local_search
from placement.sequence_dp import _Model
from placement.simulate import device_loads, max_load
from tests.placement.test_sequence_dp import _case
from tests.placement.test_simulate import random_dags, random_placement, tasks


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_pool_moves_never_worsen_a_plan(seed, start):
    p, units, optimum = _case(seed)
    k = p.num_devices
    rng = np.random.default_rng(start)
    group_device = np.empty(p.tg.num_groups, dtype=np.int64)
    for groups in units:
        group_device[groups] = rng.integers(k)
    before = max_load(p.tg, group_device, k)
    costs = np.sort(_Model(p.tg, units, k).cost)
    for light in costs[[len(costs) // 2, -1]] if len(costs) else [0.0]:
        placed, value = pool_moves(p.tg, k, units, group_device, float(light),
                                   p.group_memory, math.inf, math.inf)
        assert value == max_load(p.tg, placed, k)
        assert optimum * (1 - 1e-9) <= value <= before * (1 + 1e-9)
        assert all(len(set(placed[groups].tolist())) == 1 for groups in units)


def test_a_run_moves_where_single_groups_cannot():
    """Seed 785 (from random start 0, after single-group local search, 58): moving a
    run of pooled units reaches the optimum, 57."""
    p, units, optimum = _case(785)
    k = p.num_devices
    rng = np.random.default_rng(0)
    group_device = np.empty(p.tg.num_groups, dtype=np.int64)
    for groups in units:
        group_device[groups] = rng.integers(k)
    group_device, value = local_search(
        group_device, lambda gd: (max_load(p.tg, gd, k), device_loads(p.tg, gd, k)),
        num_devices=k, group_memory=p.group_memory, memory_cap=math.inf,
        deadline=math.inf)
    costs = np.sort(_Model(p.tg, units, k).cost)
    light = float(costs[len(costs) // 2])
    placed, moved = pool_moves(p.tg, k, units, group_device, light, p.group_memory,
                               math.inf, math.inf)
    assert (value, moved, optimum) == (58.0, 57.0, 57.0)


def _random_start(p, units, start):
    rng = np.random.default_rng(start)
    group_device = np.empty(p.tg.num_groups, dtype=np.int64)
    for groups in units:
        group_device[groups] = rng.integers(p.num_devices)
    return group_device


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_boundary_swaps_never_worsen_a_plan_and_keep_the_memory_cap(seed, start):
    p, units, optimum = _case(seed)
    k = p.num_devices
    group_device = _random_start(p, units, start)
    before = max_load(p.tg, group_device, k)
    # The start's fullest device as the cap: it binds wherever a move fills a device.
    cap = float(np.bincount(group_device, weights=p.group_memory, minlength=k).max())
    placed, value = boundary_swaps(p.tg, k, units, group_device, p.group_memory, cap,
                                   math.inf)
    assert value == max_load(p.tg, placed, k)
    assert optimum * (1 - 1e-9) <= value <= before * (1 + 1e-9)
    assert all(len(set(placed[groups].tolist())) == 1 for groups in units)
    assert np.bincount(placed, weights=p.group_memory, minlength=k).max() <= cap * (1 + 1e-9)


def test_a_boundary_swap_where_pool_moves_cannot():
    """Seed 2 (7 units, 2 devices; random start 1, after single-group local search,
    46): no pool move at any sender threshold improves the plan; swapping two runs at
    its cuts reaches the optimum, 40."""
    p, units, optimum = _case(2)
    k = p.num_devices
    group_device, value = local_search(
        _random_start(p, units, 1),
        lambda gd: (max_load(p.tg, gd, k), device_loads(p.tg, gd, k)),
        num_devices=k, group_memory=p.group_memory, memory_cap=math.inf,
        deadline=math.inf)
    pooled = min(pool_moves(p.tg, k, units, group_device, float(light), p.group_memory,
                            math.inf, math.inf)[1]
                 for light in _Model(p.tg, units, k).cost)
    _, swapped = boundary_swaps(p.tg, k, units, group_device, p.group_memory, math.inf,
                                math.inf)
    assert (value, pooled, swapped, optimum) == (46.0, 46.0, 40.0, 40.0)


@settings(max_examples=60, deadline=None)
@given(random_dags(min_time=0.01), st.integers(2, 4), st.integers(1, 2), st.booleans(),
       st.randoms())
def test_max_load_search_makes_local_searchs_moves(graph, k, micro, capped, rnd):
    """The same neighbourhood and choice as `local_search` with the max-load score, so
    the same plan up to the devices' names (random float times: the only ties are
    between devices alike, which rounding may break either way). Times of zero make
    plateaus of equal moves, where the two may take different ones: with every op
    free, a graph of one sender left the two at 1.08 and 2.17."""
    tg = tasks(graph, k=micro)
    memory = np.array([rnd.uniform(0.5, 2.0) for _ in range(tg.num_groups)])
    gd = random_placement(tg, k, rnd)
    cap = float(np.bincount(gd, weights=memory, minlength=k).max()) if capped else np.inf
    expected, value = local_search(gd, lambda g: (max_load(tg, g, k), device_loads(tg, g, k)),
                                   num_devices=k, group_memory=memory, memory_cap=cap,
                                   deadline=np.inf)
    found, found_value = max_load_search(tg, gd, num_devices=k, group_memory=memory,
                                         memory_cap=cap, deadline=np.inf)
    assert np.sort(device_loads(tg, found, k)).tolist() == pytest.approx(
        np.sort(device_loads(tg, expected, k)).tolist())
    assert found_value == pytest.approx(value)
    assert found_value == max_load(tg, found, k)
    assert np.bincount(found, weights=memory, minlength=k).max() <= cap
