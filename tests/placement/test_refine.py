"""The critical chain of a schedule and the local search that moves its groups."""

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.coarsen import chain_branches
from placement.graph import Edge, Op, OpGraph
from placement.heuristics import heft
from placement.refine import (chain_search, chain_sweep, justified, kicked_search,
                              local_search, order_search, ordered_move_search,
                              schedule_search)
from placement.simulate import critical_chain, evaluate_order, list_schedule
from tests.placement.helpers import dag
from tests.placement.milp_cases import (fits_memory, problem, search_step_time,
                                        topological_orders, training_dag)
from tests.placement.test_simulate import random_dags, random_placement, tasks


@settings(max_examples=80, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 3), st.randoms())
def test_the_critical_chain_adds_up_to_the_step_time(graph, k, micro, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    sched = list_schedule(tg, gd, k)
    chain = critical_chain(tg, sched)
    # Last first: it ends at the last finish and starts at time 0, and each task
    # starts exactly when the one after it in the list delivers (its output plus the
    # transfer, or its device frees up), so the chain's times sum to the step time.
    # Float sums of the durations along different paths agree to rounding only (seen:
    # 15.000000074505806 against 15.000000059604645).
    tolerance = 1e-7 * max(1.0, sched.step_time_s)
    assert sched.finish_s[chain[0]] == sched.step_time_s
    assert sched.start_s[chain[-1]] <= tolerance
    total = 0.0
    for later, earlier in zip(chain, chain[1:]):
        cost = {p: c for p, c in tg.predecessors[later]}.get(earlier)
        crossing = sched.device[later] != sched.device[earlier]
        delay = cost if cost is not None and crossing else 0.0
        assert abs(sched.start_s[later] - (sched.finish_s[earlier] + delay)) <= tolerance
        total += tg.duration_s[later] + delay
    total += tg.duration_s[chain[-1]]
    assert abs(total - sched.step_time_s) <= tolerance


def chain_score(tg, k):
    def score(gd, below):
        sched = list_schedule(tg, gd, k)
        if below is not None and not (sched.step_time_s, 0.0) < below:
            return None
        groups = dict.fromkeys(tg.group[critical_chain(tg, sched)].tolist())
        return (sched.step_time_s, 0.0), list(groups)
    return score


def test_chain_search_splits_two_independent_chains():
    # Two chains of three 1 s ops, everything on device 0: 6 s. Moving the groups of
    # the critical chain one at a time ends with one chain on each device: 3 s.
    g = dag([1.0] * 6, [(0, 1), (1, 2), (3, 4), (4, 5)], cost=0.0)
    tg = tasks(g, training=False)
    start = np.zeros(tg.num_groups, dtype=np.int64)
    gd, value = chain_search(start, chain_score(tg, 2), num_devices=2,
                             group_memory=np.zeros(tg.num_groups), memory_cap=1.0,
                             deadline=time.perf_counter() + 10)
    assert value == 3.0
    assert list_schedule(tg, gd, 2).step_time_s == 3.0
    assert start.tolist() == [0] * 6, "the start placement is not changed in place"


def test_chain_search_moves_a_whole_branch_where_no_single_move_helps():
    # s (1 s) forks to a branch x1 -> x2 (2 s each) and to y (4 s), which join in j
    # (1 s); everything on device 0: 10 s. The branch's inner edge costs 10 and y's
    # edges 5, so moving x1, x2 or y alone to device 1 only adds transfers; the branch
    # moved whole pays 0.5 in and 0.5 out and runs beside y: 1 + 0.5 + 4 + 0.5 + 1 = 7.
    times = [1.0, 2.0, 2.0, 4.0, 1.0]
    edges = [(0, 1, 0.5), (1, 2, 10.0), (2, 4, 0.5), (0, 3, 5.0), (3, 4, 5.0)]
    graph = OpGraph(ops=tuple(Op(id=i, name=f"op{i}", forward_s={"any": t})
                              for i, t in enumerate(times)),
                    edges=tuple(Edge(src=s, dst=d, cost_s=c) for s, d, c in edges))
    tg = tasks(graph, training=False)
    start = np.zeros(tg.num_groups, dtype=np.int64)
    common = dict(num_devices=2, group_memory=np.zeros(tg.num_groups), memory_cap=1.0,
                  deadline=time.perf_counter() + 10)
    assert chain_search(start, chain_score(tg, 2), **common)[1] == 10.0
    gd, value = chain_search(start, chain_score(tg, 2), **common,
                             branches=chain_branches(tg))
    assert value == 7.0
    assert gd.tolist() == [0, 1, 1, 0, 0]


def capped_start(tg, k: int, rnd):
    """Random group memory, a random placement, and the cap that placement just fits."""
    memory = np.array([rnd.uniform(0, 1) for _ in range(tg.num_groups)])
    start = np.array([rnd.randrange(k) for _ in range(tg.num_groups)])
    return memory, start, float(np.bincount(start, weights=memory, minlength=k).max())


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(2, 3), st.booleans(), st.randoms())
def test_chain_search_keeps_memory_caps_and_never_loses(graph, k, whole_branches, rnd):
    tg = tasks(graph)
    memory, start, cap = capped_start(tg, k, rnd)
    gd, value = chain_search(start, chain_score(tg, k), num_devices=k,
                             group_memory=memory, memory_cap=cap,
                             deadline=time.perf_counter() + 10,
                             branches=chain_branches(tg) if whole_branches else None)
    assert np.bincount(gd, weights=memory, minlength=k).max() <= cap * (1 + 1e-12)
    assert value == list_schedule(tg, gd, k).step_time_s
    assert value <= list_schedule(tg, start, k).step_time_s


def test_chain_sweep_splits_two_independent_chains():
    g = dag([1.0] * 6, [(0, 1), (1, 2), (3, 4), (4, 5)], cost=0.0)
    tg = tasks(g, training=False)
    start = np.zeros(tg.num_groups, dtype=np.int64)
    score = chain_score(tg, 2)
    gd, key, _ = chain_sweep(start, score(start, None), score, 2, np.zeros(tg.num_groups),
                             1.0, time.perf_counter() + 10)
    assert key[0] == 3.0 == list_schedule(tg, gd, 2).step_time_s
    assert start.tolist() == [0] * 6, "the start placement is not changed in place"


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(2, 3), st.randoms())
def test_chain_sweep_keeps_memory_caps_never_loses_and_ends_where_no_chain_move_helps(
        graph, k, rnd):
    tg = tasks(graph)
    memory, start, cap = capped_start(tg, k, rnd)
    score = chain_score(tg, k)
    gd, key, chain = chain_sweep(start, score(start, None), score, k, memory, cap,
                                 time.perf_counter() + 10)
    used = np.bincount(gd, weights=memory, minlength=k)
    assert used.max() <= cap * (1 + 1e-12)
    assert score(gd, None) == (key, chain)
    assert key[0] <= list_schedule(tg, start, k).step_time_s
    for g in chain:
        for d in range(k):
            if d != gd[g] and used[d] + memory[g] <= cap:
                moved = gd.copy()
                moved[g] = d
                assert score(moved, key) is None


def test_kicks_escape_where_single_chain_moves_stop():
    # With a transfer on every crossing edge, single moves of chain groups from
    # everything on device 0 stop at 3.5 s; kicks of two groups at a time reach 3.25.
    g = dag([1.0] * 6, [(0, 1), (1, 2), (3, 4), (4, 5)], cost=0.25)
    tg = tasks(g, training=False)
    start = np.zeros(tg.num_groups, dtype=np.int64)
    common = dict(num_devices=2, group_memory=np.zeros(tg.num_groups), memory_cap=1.0)
    _, single = chain_search(start, chain_score(tg, 2), **common,
                             deadline=time.perf_counter() + 10)
    gd, kicked = kicked_search(start, chain_score(tg, 2), **common,
                               deadline=time.perf_counter() + 0.5,
                               rng=np.random.default_rng(0))
    assert single == 3.5
    assert kicked <= 3.25
    assert kicked == list_schedule(tg, gd, 2).step_time_s
    gd, swept = kicked_search(start, chain_score(tg, 2), **common,
                              deadline=time.perf_counter() + 0.5,
                              rng=np.random.default_rng(0), descent=chain_sweep)
    assert swept <= 3.25
    assert swept == list_schedule(tg, gd, 2).step_time_s


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(2, 3), st.booleans(), st.randoms())
def test_kicks_of_whole_branches_keep_memory_caps_and_never_lose(graph, k, sweep, rnd):
    tg = tasks(graph)
    memory, start, cap = capped_start(tg, k, rnd)
    gd, value = kicked_search(start, chain_score(tg, k), num_devices=k, group_memory=memory,
                              memory_cap=cap, deadline=time.perf_counter() + 10,
                              rng=np.random.default_rng(rnd.randrange(2**32)), patience=10,
                              branches=chain_branches(tg),
                              **({"descent": chain_sweep} if sweep else {}))
    assert np.bincount(gd, weights=memory, minlength=k).max() <= cap * (1 + 1e-12)
    assert value == list_schedule(tg, gd, k).step_time_s
    assert value <= list_schedule(tg, start, k).step_time_s


@settings(max_examples=80, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 3), st.booleans(), st.randoms())
def test_justification_never_loses_and_its_order_gives_its_times(graph, k, micro, dispatch,
                                                                 rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    listed = list_schedule(tg, gd, k)
    better = justified(tg, gd, k, listed, dispatch=dispatch)
    assert better.step_time_s <= listed.step_time_s
    again = evaluate_order(tg, gd, better.order)
    assert np.allclose(again.start_s, better.start_s)


def test_justification_runs_the_short_feeder_first():
    # Device 0 holds a (3 s, sending 3 s to d) and b (1 s, sending 1 s to c); device 1
    # holds c (9 s) and d (8 s). Upward rank runs a first (rank 14 against 11), so c
    # waits until 5 and the step takes 22; b first lets c start at 2 and d at 11: 19,
    # the optimum for this placement.
    graph = OpGraph(ops=tuple(Op(id=i, name=n, forward_s={"any": t}) for i, (n, t) in
                              enumerate([("a", 3.0), ("b", 1.0), ("c", 9.0), ("d", 8.0)])),
                    edges=(Edge(src=0, dst=3, cost_s=3.0), Edge(src=1, dst=2, cost_s=1.0)))
    tg = tasks(graph)
    gd = np.array([0, 0, 1, 1])
    listed = list_schedule(tg, gd, 2)
    assert listed.step_time_s == 22.0
    assert justified(tg, gd, 2, listed).step_time_s == 19.0


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 2), st.randoms())
def test_order_search_never_loses_and_its_order_gives_its_times(graph, k, micro, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    listed = list_schedule(tg, gd, k)
    found = order_search(tg, gd, listed, deadline=time.perf_counter() + 0.2,
                         rng=np.random.default_rng(0), patience=5)
    assert found.step_time_s <= listed.step_time_s
    again = evaluate_order(tg, gd, found.order)
    assert np.allclose(again.start_s, found.start_s)


def early_input_case():
    """Device 0 holds a (7) and e (5); device 1 holds b (6), c (4), d (3) and f (6),
    with a -> b (transfer 4), a -> c (3), b -> d, b -> f and e -> f (3). The ranks put
    b first on device 1, which idles until b's input arrives at 11 and runs c last:
    30. c first (10 to 14, while b's input is on its way) gives 29. Returns the task
    graph, the placement and the best step time over every topological order."""
    times = [7.0, 6.0, 4.0, 3.0, 5.0, 6.0]
    edges = [(0, 1, 4.0), (0, 2, 3.0), (1, 3, 4.0), (1, 5, 3.0), (4, 5, 3.0)]
    graph = OpGraph(ops=tuple(Op(id=i, name=f"op{i}", forward_s={"any": t})
                              for i, t in enumerate(times)),
                    edges=tuple(Edge(src=s, dst=d, cost_s=c) for s, d, c in edges))
    tg = tasks(graph)
    gd = np.array([0, 1, 1, 1, 0, 1])
    dev = tg.task_devices(gd)
    best = min(evaluate_order(tg, gd, [[t for t in o if dev[t] == d] for d in range(2)]
                              ).step_time_s for o in topological_orders(tg))
    return tg, gd, best


def test_order_search_runs_the_early_input_first_where_ranks_and_justification_do_not():
    tg, gd, best = early_input_case()
    listed = list_schedule(tg, gd, 2)
    assert listed.step_time_s == justified(tg, gd, 2, listed).step_time_s == 30.0 > best
    found = order_search(tg, gd, listed, deadline=time.perf_counter() + 5,
                         rng=np.random.default_rng(0), patience=0)
    assert found.step_time_s == best == 29.0


def test_justification_by_dispatch_runs_the_early_input_first():
    # The forward pass in latest-start order puts b before c on device 1 (b's latest
    # start is the earlier), as the list schedule did; dispatched in time, c is the
    # only task of device 1 that has arrived at 10, so it runs while b's input is on
    # its way.
    tg, gd, best = early_input_case()
    listed = list_schedule(tg, gd, 2)
    assert justified(tg, gd, 2, listed, dispatch=True).step_time_s == best == 29.0


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 2), st.randoms())
def test_ordered_moves_never_lose_keep_memory_and_their_order_gives_their_times(graph, k,
                                                                               micro, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    memory = np.array([rnd.uniform(0.0, 1.0) for _ in range(tg.num_groups)])
    cap = max(np.bincount(gd, weights=memory, minlength=k).max(), memory.sum() / k)
    listed = list_schedule(tg, gd, k)
    placed, found = ordered_move_search(tg, gd, listed, group_memory=memory, memory_cap=cap,
                                        deadline=time.perf_counter() + 0.2)
    assert found.step_time_s <= listed.step_time_s
    assert np.bincount(placed, weights=memory, minlength=k).max() <= cap
    again = evaluate_order(tg, placed, found.order)
    assert np.allclose(again.start_s, found.start_s)


def test_ordered_moves_beat_a_searched_order_that_every_freshly_scheduled_move_loses_to():
    """A seeded training DAG of 6 ops on two devices with two micro-batches, HEFT's
    placement in the order the order search finds (52.5): every placement one move
    away, list-scheduled, justified or dispatched (how the placement searches judge a
    move), takes at least 54.5, so no placement search leaves this plan; moves that
    keep the plan's order and search near it reach 50.5."""
    p = problem(training_dag(37, 6), 2, "makespan", num_micro_batches=2)
    tg = p.tg
    gd = heft(tg, 2, p.group_memory, p.memory_cap)
    start = order_search(tg, gd, justified(tg, gd, 2, list_schedule(tg, gd, 2), dispatch=True),
                         deadline=time.perf_counter() + 5, rng=np.random.default_rng(0),
                         patience=50)
    assert start.step_time_s == 52.5
    fresh = []
    for g in range(tg.num_groups):
        moved = gd.copy()
        moved[g] = 1 - gd[g]
        if fits_memory(p)(moved):
            listed = list_schedule(tg, moved, 2)
            fresh += [listed.step_time_s, justified(tg, moved, 2, listed).step_time_s,
                      justified(tg, moved, 2, listed, dispatch=True).step_time_s]
    assert min(fresh) == 54.5
    placed, found = ordered_move_search(tg, gd, start, group_memory=p.group_memory,
                                        memory_cap=p.memory_cap,
                                        deadline=time.perf_counter() + 5)
    assert found.step_time_s == 50.5 and fits_memory(p)(placed)


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(1, 3), st.randoms())
def test_schedule_search_never_loses_keeps_memory_and_its_order_gives_its_times(graph, k,
                                                                                rnd):
    tg = tasks(graph)
    gd = random_placement(tg, k, rnd)
    memory = np.array([rnd.uniform(0.0, 1.0) for _ in range(tg.num_groups)])
    cap = max(np.bincount(gd, weights=memory, minlength=k).max(), memory.sum() / k)
    listed = list_schedule(tg, gd, k)
    placed, found = schedule_search(tg, gd, listed, group_memory=memory, memory_cap=cap,
                                    deadline=time.perf_counter() + 0.1,
                                    rng=np.random.default_rng(0))
    assert found.step_time_s <= listed.step_time_s
    assert np.bincount(placed, weights=memory, minlength=k).max() <= cap
    again = evaluate_order(tg, placed, found.order)
    assert np.allclose(again.start_s, found.start_s)


def test_schedule_search_finds_the_optimum_where_placement_then_order_search_does_not():
    # Seeded random training DAGs of 7 ops (14 tasks) on two devices, from HEFT's
    # placement: the brute-force optimum over placements and orders against local
    # search under justified list schedules followed by the order search (the
    # planner's way before the schedule search), each given the same time.
    missed_by_schedule, missed_before = [], []
    for seed in range(20):
        p = problem(training_dag(seed, 7), 2, "makespan")
        tg = p.tg
        optimum = search_step_time(tg, 2, fits_memory(p))
        gd = heft(tg, 2, p.group_memory, p.memory_cap)
        start = justified(tg, gd, 2, list_schedule(tg, gd, 2))
        _, found = schedule_search(tg, gd, start, group_memory=p.group_memory,
                                   memory_cap=p.memory_cap,
                                   deadline=time.perf_counter() + 0.5,
                                   rng=np.random.default_rng(0))
        if found.step_time_s > optimum:
            missed_by_schedule.append(seed)

        def score(g):
            return justified(tg, g, 2, list_schedule(tg, g, 2)).step_time_s, np.zeros(2)

        placed, _ = local_search(gd, score, num_devices=2, group_memory=p.group_memory,
                                 memory_cap=p.memory_cap, deadline=time.perf_counter() + 0.25)
        ordered = order_search(tg, placed, justified(tg, placed, 2,
                                                     list_schedule(tg, placed, 2)),
                               deadline=time.perf_counter() + 0.25,
                               rng=np.random.default_rng(0))
        if ordered.step_time_s > optimum:
            missed_before.append(seed)
    assert len(missed_by_schedule) <= 1 < len(missed_before)
