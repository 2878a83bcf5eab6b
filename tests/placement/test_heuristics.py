import itertools
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.cluster import preset
from placement.errors import UserError
from placement.graph import Edge, Op, OpGraph
from placement.heuristics import contiguous_split, group_sequence, heft
from placement.io import load_graph
from placement.planner import InfeasiblePlacementError, PlanConfig, make_problem, plan
from placement.simulate import dispatch_schedule, list_schedule, max_load
from tests.placement.test_simulate import random_dags, tasks


def brute_best_contiguous(tg, k):
    """Every split of the group sequence into at most k intervals."""
    seq = group_sequence(tg)
    n = len(seq)
    best = np.inf
    all_cuts = itertools.chain.from_iterable(
        itertools.combinations(range(1, n), c) for c in range(min(k, n)))
    for cuts in all_cuts:
        gd = np.empty(tg.num_groups, dtype=int)
        bounds = (0, *cuts, n)
        for d in range(len(bounds) - 1):
            gd[seq[bounds[d]:bounds[d + 1]]] = d
        best = min(best, max_load(tg, gd, k))
    return best


@settings(max_examples=60, deadline=None)
@given(random_dags(max_ops=7), st.integers(1, 3))
def test_contiguous_split_is_optimal_over_contiguous_splits(graph, k):
    tg = tasks(graph, training=False)
    gd = contiguous_split(tg, k, np.zeros(tg.num_groups), np.inf)
    assert max_load(tg, gd, k) == pytest.approx(brute_best_contiguous(tg, k))
    assert set(gd.tolist()) <= set(range(k))


def test_contiguous_split_respects_memory():
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": 1.0}, param_bytes=10.0)
                for i in range(4))
    g = OpGraph(ops=ops, edges=tuple(Edge(src=i, dst=i + 1, cost_s=0.0) for i in range(3)))
    tg = tasks(g)
    gd = contiguous_split(tg, 2, np.array([10.0, 10.0, 10.0, 10.0]), memory_cap=30.0)
    used = np.bincount(gd, weights=[10.0] * 4)
    assert used.max() <= 30.0


def test_heft_spreads_independent_work():
    g = OpGraph(ops=tuple(Op(id=i, name=f"op{i}", forward_s={"any": 1.0}) for i in range(4)),
                edges=())
    tg = tasks(g)
    gd = heft(tg, 4, np.zeros(tg.num_groups), np.inf)
    assert sorted(gd.tolist()) == [0, 1, 2, 3]


def test_heft_keeps_colocation_groups_together():
    ops = (Op(id=0, name="a", forward_s={"any": 3.0}, colocation="x"),
           Op(id=1, name="b", forward_s={"any": 3.0}),
           Op(id=2, name="c", forward_s={"any": 3.0}, colocation="x"))
    tg = tasks(OpGraph(ops=ops, edges=()))
    assignment = tg.assignment(heft(tg, 3, np.zeros(tg.num_groups), np.inf))
    assert assignment[0] == assignment[2]


def test_a_stagger_lets_heft_place_a_stem_and_its_branches_as_a_pipeline():
    # A stem (ops 0 and 1, 4 and 2 s) forks into two 3 s branches that join in a
    # 1 s op; backward twice forward, 1 s per transfer, 4 micro-batches, 2 devices.
    # Plain HEFT ranks the copies of an op alike and puts the stem's first op and a
    # branch together (30 s at best); a stagger of 0.2 of a micro-batch's work per
    # device (as the step-time search tries it) gives the best of all 32 placements,
    # each judged by its best list schedule or dispatch at the search's staggers.
    times = [4.0, 2.0, 3.0, 3.0, 1.0]
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": t}, backward_s={"any": 2 * t})
                for i, t in enumerate(times))
    edges = tuple(Edge(src=s, dst=d, cost_s=1.0)
                  for s, d in ((0, 1), (1, 2), (1, 3), (2, 4), (3, 4)))
    tg = tasks(OpGraph(ops=ops, edges=edges), k=4)
    per_device = float(tg.duration_s.sum()) / 4 / 2

    def step(gd):
        return min(schedule(tg, np.asarray(gd), 2, f * per_device).step_time_s
                   for schedule in (list_schedule, dispatch_schedule)
                   for f in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4))

    best = min(step(gd) for gd in itertools.product(range(2), repeat=len(times)))
    free = np.zeros(tg.num_groups)
    assert step(heft(tg, 2, free, 1.0)) == pytest.approx(30.0)
    assert step(heft(tg, 2, free, 1.0, 0.2 * per_device)) == pytest.approx(best)
    assert best == pytest.approx(21.5)


def test_plan_never_beaten_by_one_device_and_within_bounds(peer_graphs):
    g = load_graph(peer_graphs / "bert24_training.json")
    for objective in ("makespan", "max-load"):
        p = plan(g, preset("dgx1-v100"), PlanConfig(num_devices=6, objective=objective))
        single = plan(g, preset("dgx1-v100"), PlanConfig(num_devices=1, objective=objective))
        assert p.lower_bound <= p.value <= single.value
    p = plan(g, preset("dgx1-v100"), PlanConfig(num_devices=6, objective="max-load"))
    assert p.value == pytest.approx(41.7458125)  # the peer's optimum over contiguous splits


def test_memory_no_placement_fits_names_the_device_count():
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": 1.0}, activation_bytes=6.0)
                for i in range(4))
    g = OpGraph(ops=ops, edges=())
    with pytest.raises(InfeasiblePlacementError, match="use at least 3 devices"):
        make_problem(g, preset("dgx1-v100"),
                     PlanConfig(num_devices=2, device_memory_bytes=10.0))


def test_colocation_group_bigger_than_a_device():
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": 1.0}, activation_bytes=6.0,
                   colocation="g") for i in range(2))
    with pytest.raises(InfeasiblePlacementError, match="must share a device"):
        make_problem(OpGraph(ops=ops, edges=()), preset("dgx1-v100"),
                     PlanConfig(num_devices=4, device_memory_bytes=10.0))


def test_devices_beyond_one_node_are_refused():
    g = OpGraph(ops=(Op(id=0, name="a", forward_s={"any": 1.0}),), edges=())
    with pytest.raises(UserError, match="8 per node"):
        plan(g, preset("dgx1-v100"), PlanConfig(num_devices=16))


def test_placement_imports_neither_torch_nor_ray():
    code = ("import sys, placement.planner, placement.io, placement.simulate, "
            "placement.heuristics, placement.cluster, placement.sweep_space, "
            "placement.sweep_rank, placement.scaling.timed_step; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
