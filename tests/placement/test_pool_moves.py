"""Pool moves never make a plan worse, report the simulator's value of what they
return, keep each unit whole, and reach plans single-group local search does not."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.pool_moves import pool_moves
from placement.refine import local_search
from placement.sequence_dp import _Model
from placement.simulate import device_loads, max_load
from tests.placement.test_sequence_dp import _case


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
    """Seed 71 (from random start 4, after single-group local search, 69): moving a
    run of pooled units reaches the optimum, 60."""
    p, units, optimum = _case(71)
    k = p.num_devices
    rng = np.random.default_rng(4)
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
    assert (value, moved, optimum) == (69.0, 60.0, 60.0)
