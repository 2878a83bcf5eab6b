"""The suffix charge against brute force: in every placement of max-load at most L,
the senders lying wholly in units j.. add at least 2 T_j(L) to the loads."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.sequence_dp import _Model
from placement.suffix_charge import suffix_charges
from tests.placement.test_sequence_dp import _case


def _loads_and_charges(model: _Model, unit_device: np.ndarray) -> tuple[float, np.ndarray]:
    """The placement's max-load, and per j the load its senders with first member at or
    after j add (c on every device holding a member, when on two or more)."""
    loads = np.bincount(unit_device, weights=model.work, minlength=model.k)
    added = np.zeros(model.n + 1)
    for m, c in zip(model.members, model.cost.tolist()):
        held = np.unique(unit_device[m])
        if len(held) > 1:
            loads[held] += c
            added[:m[0] + 1] += c * len(held)
    return float(loads.max()), added


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10**6))
def test_every_placement_adds_at_least_twice_the_suffix_charge(seed):
    p, units, _ = _case(seed)
    model = _Model(p.tg, units, p.num_devices)
    for placement in itertools.product(range(model.k), repeat=model.n):
        value, added = _loads_and_charges(model, np.array(placement))
        charges = suffix_charges(model.work, model.members, model.cost, value)
        assert (added >= 2 * charges - 1e-9 * value).all()


def test_a_long_suffix_must_be_cut():
    """Three units of work 1 in a row, senders of cost 0.25 between neighbours: within
    L = 1.5 no segment holds two units, so units 0..2 pay both links (T_0 = 0.5),
    units 1..2 one (T_1 = 0.25) and unit 2 alone none; within 2.5 a segment holds two
    units, not three, so units 0..2 pay one link; a unit heavier than L makes every
    reading through it impossible."""
    work = np.ones(3)
    members, cost = [[0, 1], [1, 2]], np.array([0.25, 0.25])
    assert suffix_charges(work, members, cost, 1.5).tolist() == [0.5, 0.25, 0.0, 0.0]
    assert suffix_charges(work, members, cost, 2.5).tolist() == [0.25, 0.0, 0.0, 0.0]
    assert math.isinf(suffix_charges(work, members, cost, 0.5)[0])
