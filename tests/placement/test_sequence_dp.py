"""The sequence DP against brute force: its bound never above the optimum, its plan the
optimum where no layer passes the state cap, strictly above the transfer bounds where
those are loose, and under a tiny cap a real plan but no proof."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.graph import Edge, Op, OpGraph
from placement.heuristics import group_sequence
from placement.ideal_dp import join_roots, joined_sequence, side_inputs
from placement.path_bound import heavy_group_bound, path_cut_bound
from placement.segment_bound import segment_bound
from placement.sequence_dp import (
    BOUND_RESOLUTION,
    CHARGE_GAP,
    DOMINANCE_PROBES,
    DOMINANCE_ROUNDS,
    HEAVY_UNIT_SHARE,
    TIED_ROOM_SHARES,
    TOP_PROBE_SHARE,
    _Model,
    _row_classes,
    _undominated,
    heavy_end_first,
    relaxed_bound,
    sequence_dp,
)
from placement.simulate import max_load, max_load_lower_bound
from tests.placement.max_load_cases import brute_max_load, max_load_problem, training_dag


def _case(seed: int):
    """A random training DAG of 4-7 ops on 2-3 devices, its optimum, and the units the
    solver walks (groups with their side inputs joined, in the joined sequence)."""
    rng = np.random.default_rng(seed)
    num_ops, k = int(rng.integers(4, 8)), int(rng.integers(2, 4))
    graph = training_dag(seed, num_ops, edge_prob=float(rng.uniform(0.2, 0.7)),
                         colocate=bool(seed % 2))
    p = max_load_problem(graph, k)
    root = join_roots(side_inputs(p.tg, p.group_memory, p.memory_cap))
    members: dict[int, list[int]] = {}
    for g in joined_sequence(p.tg, root):
        members.setdefault(int(root[g]), []).append(g)
    return p, list(members.values()), brute_max_load(p, contiguous=False)


def _group_device(p, units, unit_device):
    group_device = np.empty(p.tg.num_groups, dtype=np.int64)
    for groups, d in zip(units, unit_device.tolist()):
        group_device[groups] = d
    return group_device


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_the_optimum_and_a_bound_never_above_it(seed):
    p, units, optimum = _case(seed)
    k = p.num_devices
    found = sequence_dp(p.tg, units, k, max_load_lower_bound(p.tg, k), 2 * optimum, 1e-9)
    assert found.lower_bound <= optimum * (1 + 1e-9)
    value = max_load(p.tg, _group_device(p, units, found.unit_device), k)
    assert value == pytest.approx(optimum, rel=1e-9)
    assert found.value == pytest.approx(value, rel=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_walking_the_units_back_gives_the_same_optimum(seed):
    """`heavy_end_first` may reverse the walk: the DP and its relaxation stay exact."""
    p, units, optimum = _case(seed)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    back = units[::-1]
    found = sequence_dp(p.tg, back, k, lower, 2 * optimum, 1e-9)
    assert found.lower_bound <= optimum * (1 + 1e-9)
    assert max_load(p.tg, _group_device(p, back, found.unit_device), k) == pytest.approx(
        optimum, rel=1e-9)
    assert optimum * (1 - 3 * BOUND_RESOLUTION) <= relaxed_bound(
        p.tg, back, k, lower, 2 * optimum, 0.0) <= optimum * (1 + 1e-9)


def _heavy_last(light: int = 5, heavy: float = 8.0, num_devices: int = 2,
                dear_first: bool = False):
    """`light` ops of work 2 in a chain (links of cost 1), then one of work `heavy`;
    with `dear_first` op 0 also sends it a tensor of cost 20, too dear to cut."""
    times = [2.0] * light + [heavy]
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": t}) for i, t in enumerate(times))
    edges = [Edge(src=i, dst=i + 1, cost_s=1.0) for i in range(light)]
    if dear_first:
        edges.append(Edge(src=0, dst=light, cost_s=20.0))
    p = max_load_problem(OpGraph(ops=ops, edges=tuple(edges), name="heavy last",
                                 time_unit="unit"), num_devices)
    return p, [[g] for g in group_sequence(p.tg)]


def test_the_walk_starts_at_the_end_nearer_the_heaviest_block():
    """The heavy op last (8 of 18, a device's share 9) reverses the walk; tied to op 0
    by a sender no plan within 11 cuts (2 x 20 > 2 x 11 - 18), its block starts the
    forward walk and the walk stays. Under HEAVY_UNIT_SHARE of a device's share (4
    after 40 ops of 2 on 4 devices: 5.25) it stays too."""
    p, units = _heavy_last()
    assert heavy_end_first(p.tg, units, 2, 11.0) == units[::-1]
    assert heavy_end_first(p.tg, units[::-1], 2, 11.0) == units[::-1]
    p, units = _heavy_last(dear_first=True)
    assert heavy_end_first(p.tg, units, 2, 11.0) == units
    p, units = _heavy_last(light=40, heavy=4.0, num_devices=4)
    assert 4.0 < HEAVY_UNIT_SHARE * 84 / 4 < 8.0
    assert heavy_end_first(p.tg, units, 4, 30.0) == units
    p, units = _heavy_last(light=40, heavy=8.0, num_devices=4)
    assert heavy_end_first(p.tg, units, 4, 30.0) == units[::-1]


def test_the_plan_found_walking_back_is_offered_in_the_graphs_own_units():
    """The planner's sequence DP stage, walking the heavy-last chain back, offers its
    plan, the brute-force optimum, mapped back to the groups (all on one device, 18,
    to start)."""
    from placement.milp.incumbent import Incumbent
    from placement.milp.solve import _sequence_dp

    p, units = _heavy_last()
    start = np.zeros(p.tg.num_groups, dtype=np.int64)
    incumbent = Incumbent(start, max_load(p.tg, start, 2), "one device")
    optimum = brute_max_load(p, contiguous=False)
    walk = heavy_end_first(p.tg, units, 2, incumbent.value)
    assert walk == units[::-1]
    bound = _sequence_dp(p, incumbent, walk, max_load_lower_bound(p.tg, 2),
                         time.perf_counter() + 30, line=None)
    assert incumbent.source == "sequence-dp"
    assert incumbent.value == pytest.approx(optimum)
    assert max_load(p.tg, incumbent.group_device, 2) == pytest.approx(optimum)
    assert bound <= optimum * (1 + 1e-9)


def test_strictly_above_the_transfer_bounds():
    """Seed 16 (6 ops, 3 devices): the path and segment bounds prove 50 against an
    optimum of 60; the DP proves it."""
    p, units, optimum = _case(16)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    old = path_cut_bound(p.tg, k, heavy_group_bound(p.tg, lower), 2 * optimum)
    old = segment_bound(p.tg, k, group_sequence(p.tg), old, 2 * optimum)
    found = sequence_dp(p.tg, units, k, old, 2 * optimum, 1e-9)
    assert optimum == 60
    assert old < 51
    assert found.lower_bound == pytest.approx(optimum, rel=1e-6)


def test_past_the_state_cap_a_real_plan_and_no_proof():
    """With one state a layer the DP is a greedy walk: whatever it finds is a real plan
    (the simulator's value), and what it proves (tests that never passed the cap)
    stays at most the optimum."""
    p, units, optimum = _case(0)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    found = sequence_dp(p.tg, units, k, lower, 10 * optimum, 1e-9, max_states=1)
    assert lower <= found.lower_bound <= optimum
    if found.unit_device is not None:
        value = max_load(p.tg, _group_device(p, units, found.unit_device), k)
        assert found.value == pytest.approx(value, rel=1e-9)
        assert value >= optimum


def test_a_deadline_past_keeps_the_known_bound():
    p, units, optimum = _case(0)
    found = sequence_dp(p.tg, units, p.num_devices, 1.0, 2 * optimum, 1e-9, deadline=0.0)
    assert found.lower_bound == 1.0 and found.unit_device is None
    assert math.isinf(found.value)


def test_a_test_that_cannot_finish_stops_before_its_deadline():
    """80 ops, 500 states a layer: a test takes about a second; given a quarter of its
    own time it stops at its pace check, long before that deadline, with no plan and no
    proof."""
    p = max_load_problem(training_dag(1, 80, edge_prob=0.05), 4)
    units = [[g] for g in group_sequence(p.tg)]
    model = _Model(p.tg, units, 4)
    limit = 1.5 * p.tg.duration_s.sum() / 4
    started = time.perf_counter()
    assert model.placement_within(limit, math.inf, 500)[2]
    quarter = (time.perf_counter() - started) / 4
    started = time.perf_counter()
    found, proven, finished = model.placement_within(limit, started + quarter, 500)
    assert (found, proven, finished) == (None, False, False)
    assert time.perf_counter() - started < quarter


def test_the_probe_just_under_the_incumbent_finds_a_plan_or_proves_it():
    """Before any bisection (a gap of 1 leaves none), one test at `TOP_PROBE_SHARE` under
    the incumbent: with the optimum under that L it returns a plan of at most L, with
    the optimum above it the proof that nothing reaches L."""
    p, units, optimum = _case(0)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    above = optimum * 1.001 / (1 - TOP_PROBE_SHARE)  # its probe lies over the optimum
    found = sequence_dp(p.tg, units, k, lower, above, 1.0)
    assert found.unit_device is not None
    assert optimum * (1 - 1e-9) <= found.value <= above * (1 - TOP_PROBE_SHARE)
    below = optimum * 0.999 / (1 - TOP_PROBE_SHARE)  # its probe lies under it
    found = sequence_dp(p.tg, units, k, lower, below, 1.0)
    assert found.unit_device is None
    assert found.lower_bound == pytest.approx(below * (1 - TOP_PROBE_SHARE))
    assert found.lower_bound <= optimum


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_the_relaxed_bound_never_above_the_optimum(seed):
    """With no sender dropped the relaxation is the DP itself and proves the optimum
    (to its resolution); dropping the cheaper half or all of them, it proves less."""
    p, units, optimum = _case(seed)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    exact = relaxed_bound(p.tg, units, k, lower, 2 * optimum, 0.0)
    assert optimum * (1 - 3 * BOUND_RESOLUTION) <= exact <= optimum * (1 + 1e-9)
    costs = np.sort(_Model(p.tg, units, k).cost)
    for light in costs[[len(costs) // 2, -1]] if len(costs) else []:
        assert lower <= relaxed_bound(p.tg, units, k, lower, 2 * optimum, light) \
            <= optimum * (1 + 1e-9)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_the_relaxed_bound_tests_the_gap_line_first(seed):
    """The first test lies CHARGE_GAP under the incumbent's value: with no sender
    dropped, a line just under the optimum proves and is the bound; a line just above
    it finds a placement, and the climb after it stays at most the optimum, with the
    cheaper half of the senders dropped too."""
    p, units, optimum = _case(seed)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    under = optimum * (1 - 1e-3) / (1 - CHARGE_GAP)
    if (1 - CHARGE_GAP) * under > lower:
        bound = relaxed_bound(p.tg, units, k, lower, under, 0.0)
        assert (1 - CHARGE_GAP) * under < bound < (1 - CHARGE_GAP) * under * (1 + 1e-5)
    over = optimum * (1 + 1e-3) / (1 - CHARGE_GAP)
    costs = np.sort(_Model(p.tg, units, k).cost)
    for light in [0.0, *costs[len(costs) // 2:][:1]]:
        assert lower <= relaxed_bound(p.tg, units, k, lower, over, light) \
            <= optimum * (1 + 1e-9)


def test_the_line_test_holds_more_states_the_longer_it_may_run():
    """Seed 0 (7 units, 3 devices) at a cap of one state a layer: the line test given
    an hour may hold 60 (one per LINE_STATES_SECONDS it may run) and proves the line
    just under the optimum; given a second it keeps the cap, passes it, and the climb
    after it, at one state a layer, proves less than the line."""
    p, units, optimum = _case(0)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    under = optimum * (1 - 1e-3) / (1 - CHARGE_GAP)
    line = (1 - CHARGE_GAP) * under
    assert lower < line
    hour = relaxed_bound(p.tg, units, k, lower, under, 0.0, max_states=1,
                         line_deadline=time.perf_counter() + 3600)
    assert line < hour < line * (1 + 1e-5)
    second = relaxed_bound(p.tg, units, k, lower, under, 0.0, max_states=1,
                           line_deadline=time.perf_counter() + 1)
    assert lower <= second < line


def test_the_relaxation_pools_the_units_it_leaves_and_still_proves_more():
    """Seed 10 (6 units, 3 devices): dropping the senders of at most the median cost
    leaves one unit (work 21) with none, homed on its last walked neighbour
    (`pooled_work`); the relaxation still proves 44 where total work / devices gives
    31 (the optimum is 56)."""
    p, units, optimum = _case(10)
    k, lower = p.num_devices, max_load_lower_bound(p.tg, p.num_devices)
    costs = np.sort(_Model(p.tg, units, k).cost)
    light = costs[len(costs) // 2]
    relaxed = _Model(p.tg, units, k, light)
    assert (relaxed.n, relaxed.fluid, relaxed.home.tolist()) == (5, 0.0, [0, 0, 0, 0, 21])
    assert optimum == 56 and lower == 31
    assert relaxed_bound(p.tg, units, k, lower, 2 * optimum, light) == pytest.approx(
        44, rel=3 * BOUND_RESOLUTION)


def test_a_sender_too_dear_to_cut_forces_its_later_members_onto_its_device():
    """Units of work 1, 1, 3 on 2 devices, one sender of cost 5 joining units 0 and 2;
    units 0 and 1 placed on devices 0 and 1. Within L = 3.5 the sum of the loads has
    room for 2 more than the work (7 - 5), less than a cut's 10, so unit 2 must join
    unit 0, where it does not fit (1 + 3); within 4 it fits. A sender of cost 0.5 may
    be cut, so nothing is forced."""
    model = _Model.__new__(_Model)
    model.k, model.work = 2, np.array([1.0, 1.0, 3.0])
    model.members, model.cost = [[0, 2]], np.array([5.0])
    loads, masks = np.array([[1.0, 1.0]]), np.array([[1]])

    def fits(bound: float) -> bool:
        slack = np.array([2 * bound - 2.0 - 3.0])
        return bool(model._forced_fit(loads, masks, [0], 1, slack, bound)[0])

    assert not fits(3.5)
    assert fits(4.0)
    model.cost = np.array([0.5])
    assert fits(3.5)


def _model_optimum(model: _Model) -> float:
    return min(model.max_load(np.array(placement))
               for placement in itertools.product(range(model.k), repeat=model.n))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.booleans())
def test_a_test_at_the_optimum_never_proves_it_out(seed, dear):
    """The checks that read ahead (each run's reading, the open senders it cuts, tied
    segments within their device's room) drop no state of an optimal placement: at
    the optimum a test finds a plan. Senders 4 times dearer tie units (a component's
    device then holds a placed unit and units still to come)."""
    p, units, _ = _case(seed)
    model = _Model(p.tg, units, p.num_devices)
    if dear:
        model.cost = 4 * model.cost
    optimum = _model_optimum(model)
    found, proven, finished = model.placement_within(optimum, math.inf, 10**6)
    assert finished and found is not None
    assert model.max_load(found) == pytest.approx(optimum, rel=1e-9)


@pytest.mark.parametrize("variant, seed", [("open senders charged on their own devices", 1),
                                           ("tied segments within the least room", 2)])
def test_the_optimum_check_catches_an_over_strong_read_ahead(monkeypatch, variant, seed):
    """The check has teeth: charging each open sender in the first run even on a device
    that holds it already, or limiting every tied segment to the least share of L
    whatever its device's room, proves the optimum out (seeds 1 and 2)."""
    if variant.startswith("open"):
        real = _Model._ahead
        monkeypatch.setattr(_Model, "_ahead", lambda self, first, rows, masks, open_ids, i:
                            real(self, first, rows, masks & 0, open_ids, i))
    else:
        monkeypatch.setattr("placement.sequence_dp._tied_room_row", lambda loads, *rest:
                            np.full(len(loads), len(TIED_ROOM_SHARES) - 1))
    p, units, _ = _case(seed)
    model = _Model(p.tg, units, p.num_devices)
    found, _, _ = model.placement_within(_model_optimum(model), math.inf, 10**6)
    assert found is None


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(1, 60))
def test_the_dominance_prune_keeps_exactly_the_undominated_states(seed, num_states):
    """Small integer loads (so ties and exact duplicates are common) in two sender
    sets; at most 60 states, fewer than the rounds' probes in all (DOMINANCE_ROUNDS x
    DOMINANCE_PROBES), so every state is probed or dropped and the kept states are
    exactly those no state of their set dominates (each column at most, one less), of
    exact duplicates the first."""
    assert num_states < DOMINANCE_ROUNDS * DOMINANCE_PROBES
    rng = np.random.default_rng(seed)
    loads = rng.integers(0, 3, size=(num_states, 3)).astype(float)
    loads = np.concatenate([loads, loads.sum(axis=1, keepdims=True)
                            + rng.integers(0, 2, size=(num_states, 1))], axis=1)
    masks = rng.integers(1, 3, size=(num_states, 1)).astype(np.int64)
    expected = [
        s for s in range(num_states)
        if not any((masks[t] == masks[s]).all() and (loads[t] <= loads[s]).all()
                   and ((loads[t] < loads[s]).any() or t < s)
                   for t in range(num_states) if t != s)]
    assert _undominated(loads, masks).tolist() == expected


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 40), st.integers(1, 12),
       st.sampled_from([2, 5, 1 << 20, 1 << 40]))
def test_row_classes_are_numpys_unique_rows(seed, num_rows, num_cols, high):
    """The packed classes (one word, or several where the bits pass one) are numpy's:
    the same first rows and the same class of each row."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, high, size=(num_rows, num_cols)).astype(np.int64)
    if num_rows:
        rows = rows[rng.integers(0, max(1, num_rows // 3), size=num_rows)]
    first, classes = _row_classes(rows)
    _, numpy_first, numpy_classes = np.unique(rows, axis=0, return_index=True,
                                              return_inverse=True)
    assert first.tolist() == numpy_first.tolist()
    assert classes.tolist() == numpy_classes.ravel().tolist()
