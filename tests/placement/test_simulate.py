import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.cluster import Link
from placement.graph import Edge, Op, OpGraph
from placement.io import load_graph, load_peer_split
from placement import simulate
from placement.simulate import (
    OrderError,
    device_loads,
    dispatch_schedule,
    evaluate_order,
    list_schedule,
    max_load,
    max_load_lower_bound,
    step_time_lower_bound,
    upward_rank,
)
from placement.tasks import build_tasks, corun_slowdown, split_overhead
from tests.placement.helpers import chain_graph, dag

UNIT_LINK = Link(latency_s=0.0, bandwidth_bytes_per_s=1.0)


def tasks(graph, k=1, training=True):
    return build_tasks(graph, link=UNIT_LINK, device_kind="any", num_micro_batches=k,
                       training=training)


def random_placement(tg, k, rnd):
    """Each group on a device drawn by hypothesis's `rnd`."""
    return np.array([rnd.randrange(k) for _ in range(tg.num_groups)])


def place(tg, assignment):
    return tg.group_devices(assignment)


def test_chain_split_by_hand():
    tg = tasks(chain_graph([1.0, 2.0, 3.0], cost=0.5))
    gd = place(tg, {0: 0, 1: 1, 2: 1})
    assert list_schedule(tg, gd, 2).step_time_s == pytest.approx(1 + 0.5 + 2 + 3)
    assert device_loads(tg, gd, 2).tolist() == pytest.approx([1 + 0.5, 5 + 0.5])


def test_fork_pays_send_once_and_receive_once_per_device():
    g = dag([1.0, 2.0, 2.0], [(0, 1), (0, 2)], cost=1.0)
    tg = tasks(g)
    spread = place(tg, {0: 0, 1: 1, 2: 2})
    assert device_loads(tg, spread, 3).tolist() == pytest.approx([2.0, 3.0, 3.0])
    assert list_schedule(tg, spread, 3).step_time_s == pytest.approx(4.0)
    paired = place(tg, {0: 0, 1: 1, 2: 1})
    assert device_loads(tg, paired, 2).tolist() == pytest.approx([2.0, 5.0])
    assert list_schedule(tg, paired, 2).step_time_s == pytest.approx(6.0)


def test_implied_backward_runs_on_the_forward_device_in_reverse():
    g = OpGraph(ops=(Op(id=0, name="a", forward_s={"any": 1.0}, backward_s={"any": 2.0}),
                     Op(id=1, name="b", forward_s={"any": 2.0}, backward_s={"any": 4.0})),
                edges=(Edge(src=0, dst=1, bytes=1.0),))
    tg = tasks(g)
    assert tg.num_tasks == 4
    one = place(tg, {0: 0, 1: 0})
    assert list_schedule(tg, one, 1).step_time_s == pytest.approx(9.0)
    # f0 [0,1], send 1 -> f1 [2,4], b1 [4,8], gradient back 1 -> b0 [9,11]
    split = place(tg, {0: 0, 1: 1})
    assert list_schedule(tg, split, 2).step_time_s == pytest.approx(11.0)
    assert tasks(g, training=False).num_tasks == 2


def test_a_value_without_a_gradient_crosses_forward_only():
    """An edge whose value requires no grad (`grad_bytes` 0: a mask, token ids) has no
    gradient to send back: the producer's backward waits for the reader's as before
    (the executor frees the value then) but pays no transfer, and the max-load model
    charges the value once, where a value with a gradient pays for its return too."""
    def graph(grad_bytes):
        return OpGraph(
            ops=(Op(id=0, name="mask", forward_s={"any": 1.0}, backward_s={"any": 2.0}),
                 Op(id=1, name="b", forward_s={"any": 2.0}, backward_s={"any": 4.0})),
            edges=(Edge(src=0, dst=1, bytes=1.0, grad_bytes=grad_bytes),))
    with_gradient, without = tasks(graph(None)), tasks(graph(0.0))
    split = place(without, {0: 0, 1: 1})
    # f0 [0,1], send 1 -> f1 [2,4], b1 [4,8], nothing back -> b0 [8,10]
    assert list_schedule(without, split, 2).step_time_s == pytest.approx(10.0)
    assert list_schedule(with_gradient, split, 2).step_time_s == pytest.approx(11.0)
    assert device_loads(without, split, 2).tolist() == pytest.approx([3.0 + 1, 6.0 + 1])
    assert device_loads(with_gradient, split, 2).tolist() == pytest.approx([3.0 + 2, 6.0 + 2])
    # Half of a value's bytes require grad: its return costs half of the value's.
    half = tasks(graph(0.5))
    assert list_schedule(half, split, 2).step_time_s == pytest.approx(10.5)
    assert device_loads(half, split, 2).tolist() == pytest.approx([3.0 + 1.5, 6.0 + 1.5])


def test_micro_batches_pipeline():
    tg = tasks(chain_graph([2.0, 2.0], cost=0.0), k=2)
    gd = place(tg, {0: 0, 1: 1})
    assert list_schedule(tg, gd, 2).step_time_s == pytest.approx(3.0)
    assert max_load(tg, gd, 2) == pytest.approx(2.0)


def test_an_order_against_the_edges_is_refused():
    tg = tasks(dag([1.0, 1.0, 1.0, 1.0], [(0, 1), (2, 3)], cost=0.0))
    gd = place(tg, {0: 0, 3: 0, 1: 1, 2: 1})
    # device 0 runs op3 before op0 while device 1 runs op1 before op2: a deadlock
    with pytest.raises(OrderError, match="deadlock"):
        evaluate_order(tg, gd, [[3, 0], [1, 2]])
    with pytest.raises(OrderError, match="deadlock"):  # the shared-host event loop too
        evaluate_order(dataclasses.replace(tg, corun_slowdown=1.2), gd, [[3, 0], [1, 2]])
    with pytest.raises(OrderError, match="leaves out"):
        evaluate_order(tg, gd, [[0], [1, 2]])


@pytest.mark.parametrize("name, expected", [("gnmt_training", 137.154),
                                            ("bert24_training", 49.4049)])
def test_expert_splits_match_the_peer_figures(peer_graphs, name, expected):
    g = load_graph(peer_graphs / f"{name}.json")
    tg = tasks(g)
    split = load_peer_split(peer_graphs / "expert-splits" / f"{name}_expert.json")
    assert max_load(tg, place(tg, split), 6) == pytest.approx(expected, abs=5e-4)


def brute_device_loads(tg, gd, k):
    """Max-load straight from its definition, one task at a time."""
    dev = gd[tg.group]
    loads = [0.0] * k
    for t in range(tg.num_tasks):
        loads[dev[t]] += tg.duration_s[t]
        receivers = {dev[d] for d, _ in tg.successors[t]} - {dev[t]}
        if receivers:
            loads[dev[t]] += tg.send_s[t]
            for r in receivers:
                loads[r] += tg.send_s[t]
    return loads


@st.composite
def random_dags(draw, max_ops=8, min_time=0.0):
    n = draw(st.integers(2, max_ops))
    times = draw(st.lists(st.floats(min_time, 5.0), min_size=n, max_size=n))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), unique=True, max_size=2 * n))
    costs = draw(st.lists(st.floats(0.0, 3.0), min_size=n, max_size=n))
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": times[i]},
                   backward_s={"any": times[i] / 2}, output_bytes=costs[i])
                for i in range(n))
    return OpGraph(ops=ops, edges=tuple(Edge(src=s, dst=d, bytes=costs[s]) for s, d in edges))


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 3), st.randoms())
def test_schedules_are_feasible_and_bounded(graph, k, micro, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    sched = list_schedule(tg, gd, k)
    dev = sched.device
    for s, d, c in zip(tg.edge_src, tg.edge_dst, tg.edge_transfer_s):
        delay = c if dev[s] != dev[d] else 0.0
        assert sched.start_s[d] >= sched.finish_s[s] + delay - 1e-9
    for order in sched.order:
        for a, b in itertools.pairwise(order):
            assert sched.start_s[b] >= sched.finish_s[a] - 1e-9
    assert sched.step_time_s >= step_time_lower_bound(tg, k) - 1e-9
    assert device_loads(tg, gd, k).tolist() == pytest.approx(brute_device_loads(tg, gd, k))
    assert max_load(tg, gd, k) >= max_load_lower_bound(tg, k) - 1e-9
    again = evaluate_order(tg, gd, sched.order)
    assert again.step_time_s == pytest.approx(sched.step_time_s)


def test_a_micro_batch_stagger_pipelines_the_copies():
    # Ops of 3, 2 and 3 s (forward and backward alike), the first two on device 0, in
    # 2 micro-batches: by rank alone device 0 runs both copies of an op back to back
    # and device 1 waits until 4 s (14 s in all); ranking micro-batch 1 lower by 2 s
    # sends micro-batch 0 through first, device 1 starts at 2.5 s (11 s in all).
    tg = tasks(chain_graph([3.0, 2.0, 3.0], cost=0.0, backward=[3.0, 2.0, 3.0]), k=2)
    gd = np.array([0, 0, 1])
    assert list_schedule(tg, gd, 2).step_time_s == pytest.approx(14.0)
    assert list_schedule(tg, gd, 2, stagger_s=2.0).step_time_s == pytest.approx(11.0)


@settings(max_examples=40, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(2, 3), st.floats(0.0, 5.0),
       st.randoms())
def test_staggered_schedules_are_feasible(graph, k, micro, stagger, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    sched = list_schedule(tg, gd, k, stagger_s=stagger)
    for s, d, c in zip(tg.edge_src, tg.edge_dst, tg.edge_transfer_s):
        delay = c if sched.device[s] != sched.device[d] else 0.0
        assert sched.start_s[d] >= sched.finish_s[s] + delay - 1e-9
    for order in sched.order:
        for a, b in itertools.pairwise(order):
            assert sched.start_s[b] >= sched.finish_s[a] - 1e-9
    assert sched.step_time_s >= step_time_lower_bound(tg, k) - 1e-9


def test_dispatch_beats_the_list_schedule_at_every_stagger():
    # A 4-op chain in 3 micro-batches, ops 0 and 3 on device 0, 1 and 2 on device 1:
    # device 0 holds the pipeline's first and last stage. The list schedule places
    # tasks in rank order, each into the earliest gap left, so op 0's backward tasks
    # (the lowest ranks) only get what the others left; no stagger (0 to 20 s, in
    # steps of 0.01) brings it under 18 s, where the dispatch, which runs a ready task
    # whenever its device falls idle, takes 17 2/3.
    tg = tasks(chain_graph([3.0, 2.0, 3.0, 3.0], cost=0.0,
                           backward=[3.0, 4.0, 6.0, 6.0]), k=3)
    gd = np.array([0, 1, 1, 0])
    listed = min(list_schedule(tg, gd, 2, stagger_s=s).step_time_s
                 for s in np.arange(0.0, 20.0, 0.01))
    assert listed == pytest.approx(18.0)
    assert dispatch_schedule(tg, gd, 2).step_time_s == pytest.approx(17.0 + 2 / 3)


@settings(max_examples=80, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 3), st.floats(0.0, 5.0),
       st.floats(0.0, 2.0), st.randoms())
def test_a_dispatch_stops_only_where_its_step_ends_after_the_cutoff(
        graph, k, micro, stagger, share, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    whole = dispatch_schedule(tg, gd, k, stagger_s=stagger)
    cutoff = share * whole.step_time_s
    cut = dispatch_schedule(tg, gd, k, stagger_s=stagger, cutoff_s=cutoff)
    if cutoff >= whole.step_time_s:
        assert cut is not None and cut.order == whole.order
        assert np.array_equal(cut.start_s, whole.start_s)
        assert np.array_equal(cut.finish_s, whole.finish_s)
    elif cutoff < whole.step_time_s * (1 - 1e-6):
        assert cut is None


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.integers(1, 3), st.integers(1, 3), st.floats(0.0, 5.0),
       st.randoms())
def test_dispatch_schedules_are_feasible_and_never_idle_a_device_with_a_ready_task(
        graph, k, micro, stagger, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    sched = dispatch_schedule(tg, gd, k, stagger_s=stagger)
    dev = sched.device
    arrival = np.zeros(tg.num_tasks)
    for s, d, c in zip(tg.edge_src, tg.edge_dst, tg.edge_transfer_s):
        arrival[d] = max(arrival[d], sched.finish_s[s] + (c if dev[s] != dev[d] else 0.0))
    assert (sched.start_s >= arrival - 1e-9).all()
    for d, order in enumerate(sched.order):
        assert sorted(order) == np.flatnonzero(dev == d).tolist()
        free = 0.0
        for i, t in enumerate(order):
            assert sched.start_s[t] == pytest.approx(max(free, arrival[t]))
            if sched.start_s[t] > free + 1e-9:
                # The device idled: none of its later tasks had arrived.
                assert all(arrival[u] >= sched.start_s[t] - 1e-9 for u in order[i + 1:])
            free = sched.finish_s[t]
    again = evaluate_order(tg, gd, sched.order)
    assert again.step_time_s == pytest.approx(sched.step_time_s)
    assert sched.step_time_s >= step_time_lower_bound(tg, k) - 1e-9


def brute_upward_rank(tg, weights):
    """Per task: the longest (time + weighted transfer) path from it, over every path."""
    def longest(t):
        return tg.duration_s[t] + max(
            (w + longest(d) for s, d, w in zip(tg.edge_src, tg.edge_dst, weights) if s == t),
            default=0.0)
    return [longest(t) for t in range(tg.num_tasks)]


@settings(max_examples=40, deadline=None)
@given(random_dags(max_ops=6), st.integers(1, 3), st.integers(1, 3), st.sampled_from([1, 10**9]),
       st.randoms())
def test_upward_rank_is_the_longest_path_after_each_task_by_heights_or_by_tasks(
        graph, k, micro, layer_width, rnd):
    tg = tasks(graph, k=micro)
    dev = tg.task_devices(random_placement(tg, k, rnd))
    crossing = (dev[tg.edge_src] != dev[tg.edge_dst]).astype(float)
    # LAYER_WIDTH 1 takes the pass per height on every graph, 10**9 the loop per task.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulate, "LAYER_WIDTH", layer_width)
        rank = upward_rank(tg, crossing)
    assert rank.tolist() == pytest.approx(brute_upward_rank(tg, tg.edge_transfer_s * crossing))


def test_single_device_step_is_the_total_work():
    g = dag([1.0, 2.0, 3.0, 4.0], [(0, 1), (0, 2), (1, 3), (2, 3)], cost=5.0)
    tg = tasks(g)
    assert list_schedule(tg, np.zeros(tg.num_groups, dtype=int), 1).step_time_s == 10.0


def test_split_plans_pay_the_measured_task_overhead():
    """A plan over several devices runs each op as its own task, which the profiler
    measured as a ratio; a one-device plan runs the whole module and pays nothing."""
    g = dag([1.0, 2.0, 3.0, 4.0], [(0, 1), (0, 2), (1, 3), (2, 3)], cost=0.0)
    g = OpGraph(ops=g.ops, edges=g.edges, metadata={"split_overhead": {"any": 1.5}})
    assert split_overhead(g, "any", 1) == 1.0
    assert split_overhead(g, "v100", 2) == 1.0
    plain = build_tasks(g, link=UNIT_LINK, device_kind="any")
    split = build_tasks(g, link=UNIT_LINK, device_kind="any",
                        time_factor=split_overhead(g, "any", 2))
    assert split.duration_s == pytest.approx(1.5 * plain.duration_s)
    # Everything on one of two devices: the split executor still runs, slower.
    one = list_schedule(split, np.zeros(split.num_groups, dtype=int), 2)
    assert one.step_time_s == pytest.approx(15.0)


def test_devices_sharing_a_host_slow_each_other_down_while_both_run():
    # Two independent ops on two devices, 1 s and 2 s of work (no backward).
    g = dag([1.0, 2.0], [], cost=0.0)
    g = OpGraph(ops=g.ops, edges=g.edges, metadata={"corun_slowdown": {"any": 1.5}})
    assert corun_slowdown(g, "any", 1) == 1.0
    assert corun_slowdown(g, "v100", 2) == 1.0
    tg = build_tasks(g, link=UNIT_LINK, device_kind="any", training=False,
                     corun_slowdown=corun_slowdown(g, "any", 2))
    sched = evaluate_order(tg, place(tg, {0: 0, 1: 1}), [[0], [1]])
    # Both run at 1/1.5 until the first ends at 1.5 s, with 1 s of the second's work
    # done; the second runs its last second alone.
    assert sched.finish_s.tolist() == pytest.approx([1.5, 2.5])
    # On one device nothing runs beside anything.
    assert evaluate_order(tg, place(tg, {0: 0, 1: 0}), [[0, 1]]).step_time_s == 3.0
    with pytest.raises(ValueError, match="corun_slowdown"):
        build_tasks(g, link=UNIT_LINK, device_kind="any", corun_slowdown=0.5)


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.integers(2, 3), st.integers(1, 2), st.floats(1.0, 2.0),
       st.randoms())
def test_shared_host_schedules_are_feasible_and_between_the_plain_and_stretched_ones(
        graph, k, micro, slowdown, rnd):
    tg = tasks(graph, k=micro)
    gd = random_placement(tg, k, rnd)
    order = list_schedule(tg, gd, k).order
    plain = evaluate_order(tg, gd, order)
    # A slowdown of (almost) 1 takes the event loop, which must agree with the plain pass.
    near_one = evaluate_order(dataclasses.replace(tg, corun_slowdown=1 + 1e-12), gd, order)
    assert near_one.start_s == pytest.approx(plain.start_s, abs=1e-9)
    assert near_one.finish_s == pytest.approx(plain.finish_s, abs=1e-9)
    shared = evaluate_order(dataclasses.replace(tg, corun_slowdown=slowdown), gd, order)
    dev = shared.device
    for s, d, c in zip(tg.edge_src, tg.edge_dst, tg.edge_transfer_s):
        delay = c if dev[s] != dev[d] else 0.0
        assert shared.start_s[d] >= shared.finish_s[s] + delay - 1e-9
    for device_order in order:
        for a, b in itertools.pairwise(device_order):
            assert shared.start_s[b] >= shared.finish_s[a] - 1e-9
    took = shared.finish_s - shared.start_s
    assert np.all(took >= tg.duration_s - 1e-9)
    assert np.all(took <= slowdown * tg.duration_s + 1e-9)
    # Every task takes between its own time and `slowdown` times it, so the step lies
    # between the plain schedule's and that of every task stretched by `slowdown`.
    stretched = evaluate_order(dataclasses.replace(tg, duration_s=slowdown * tg.duration_s,
                                                   edge_transfer_s=slowdown * tg.edge_transfer_s),
                               gd, order)
    assert plain.step_time_s - 1e-9 <= shared.step_time_s <= stretched.step_time_s + 1e-9
