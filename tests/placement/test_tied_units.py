"""Tied units and the merged layers of the sequence DP against brute force: no placement
within L splits a tied component, the DP's forced fit counts a component's work still
to place, and the relaxation that merges close states never proves above the optimum."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.sequence_dp import BOUND_RESOLUTION, _merge_close, _Model, relaxed_bound
from placement.simulate import max_load_lower_bound
from placement.tied_units import tied_units
from tests.placement.test_sequence_dp import _case


def _dear_case(seed: int) -> tuple[_Model, float]:
    """A brute-force case with its senders 4 times dearer (a quarter of them then tie
    units at the optimum) and its optimum."""
    p, units, _ = _case(seed)
    model = _Model(p.tg, units, p.num_devices)
    model.cost = 4 * model.cost
    optimum = min(model.max_load(np.array(placement))
                  for placement in itertools.product(range(model.k), repeat=model.n))
    return model, optimum


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_no_placement_within_l_splits_a_tied_component_and_the_dp_stays_exact(seed):
    model, optimum = _dear_case(seed)
    total = float(model.work.sum())
    for placement in itertools.product(range(model.k), repeat=model.n):
        unit_device = np.array(placement)
        value = model.max_load(unit_device)
        for members in tied_units(model.work, model.members, model.cost, model.k,
                                  value, total).units:
            assert len(np.unique(unit_device[members])) == 1
    assert model.placement_within(optimum * (1 - 1e-6), math.inf, 10**6)[:2] == (None, True)
    found, proven, finished = model.placement_within(optimum, math.inf, 10**6)
    assert proven and finished
    assert model.max_load(found) <= optimum * (1 + 1e-9)


def test_dear_senders_tie_their_members_transitively():
    """Units of work 1 on 2 devices; senders {0, 2} and {2, 3} of cost 5 and {1, 3} of
    cost 0.1. Within L = 3 the loads have room for 2 more than the work (2 x 3 - 4), so
    a sender of cost 5 (10 when cut) is never cut: units 0, 2 and 3 share a device;
    within L = 8 (room for 12) nothing is tied."""
    work = np.ones(4)
    members, cost = [[0, 2], [2, 3], [1, 3]], np.array([5.0, 5.0, 0.1])
    tied = tied_units(work, members, cost, 2, 3.0, 4.0)
    assert tied.component.tolist() == [0, 0, -1]
    assert [u.tolist() for u in tied.units] == [[0, 2, 3]]
    assert tied.later_work(0, 0) == 2.0 and tied.later_work(0, 2) == 1.0
    assert tied_units(work, members, cost, 2, 8.0, 4.0).units == ()


def test_a_tied_component_forces_all_its_later_work_onto_its_device():
    """Units of work 1, 1, 2, 2 on 2 devices; senders {0, 2} and {2, 3} of cost 5;
    units 0 and 1 placed on devices 0 and 1. The open sender {0, 2} alone forces unit
    2 (load 1 + 2 = 3, within L = 4); its component forces units 2 and 3 (1 + 4), which
    do not fit."""
    model = _Model.__new__(_Model)
    model.k, model.work = 2, np.array([1.0, 1.0, 2.0, 2.0])
    model.members, model.cost = [[0, 2], [2, 3]], np.array([5.0, 5.0])
    loads, masks, slack = np.array([[1.0, 1.0]]), np.array([[1]]), np.array([2.0])
    tied = tied_units(model.work, model.members, model.cost, 2, 4.0, 6.0)
    assert model._forced_fit(loads, masks, [0], 1, slack, 4.0)[0]
    assert not model._forced_fit(loads, masks, [0], 1, slack, 4.0, tied)[0]


def test_close_states_with_the_same_senders_merge_into_their_least_loads():
    loads = np.array([[3.2, 1.1], [3.4, 1.0], [3.3, 1.05], [3.2, 1.1], [5.0, 1.0]])
    masks = np.array([[1], [1], [2], [1], [1]])
    kept, least = _merge_close(loads, masks, 0.5)
    merged = {tuple(masks[i]): [] for i in kept}
    for i, row in zip(kept.tolist(), least.tolist()):
        merged[tuple(masks[i])].append(row)
    assert sorted(merged[(1,)]) == [[3.2, 1.0], [5.0, 1.0]]
    assert merged[(2,)] == [[3.3, 1.05]]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6))
def test_the_merged_relaxation_never_proves_above_the_optimum(seed):
    """Cells of a tenth of the optimum merge most states of a layer; the bound drops
    but never passes the optimum. Cells finer than any load difference merge nothing,
    and the bound is then the exact DP's (to its resolution)."""
    p, units, optimum = _case(seed)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    coarse = relaxed_bound(p.tg, units, k, lower, 2 * optimum, 0.0, merge=optimum / 10)
    assert lower <= coarse <= optimum * (1 + 1e-9)
    fine = relaxed_bound(p.tg, units, k, lower, 2 * optimum, 0.0, merge=1e-9 * optimum)
    assert optimum * (1 - 3 * BOUND_RESOLUTION) <= fine <= optimum * (1 + 1e-9)
