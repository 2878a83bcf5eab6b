"""The blocks' step-time bound: never above the brute-force optimum on graphs of modules
in sequence, and above the window and join bounds where a module's side branch must
queue on the critical branch's device or pay the transfer out of the fork and back."""

from __future__ import annotations

import time

import numpy as np
import pyomo.environ as pyo
import pytest

from placement.graph import Edge, Op, OpGraph
from placement.milp.backends import BACKENDS, SolveOptions
from placement.milp.block_bound import blocks
from placement.milp.incumbent import Incumbent
from placement.milp.makespan import block_round, build_makespan, makespan_data
from placement.problem import best_heuristic
from placement.simulate import list_schedule
from placement.step_bound import step_time_bound
from tests.placement.milp_cases import problem, search_step_time

SOLVERS = [s for s in ("highs", "cbc") if BACKENDS[s].is_available()]


def modules(seed: int, num_modules: int, *, training: bool) -> OpGraph:
    """Fork-join modules in sequence: each module's fork feeds two or three branch ops
    whose outputs meet in a join, the next module's fork; random times and transfers."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    edges: list[Edge] = []

    def op() -> int:
        ops.append(Op(id=len(ops), name=f"op{len(ops)}",
                      forward_s={"any": float(rng.integers(1, 8))},
                      backward_s={"any": float(rng.integers(1, 10))} if training else {}))
        return len(ops) - 1

    fork = op()
    for _ in range(num_modules):
        branches = [op() for _ in range(int(rng.integers(2, 4)))]
        join = op()
        for b in branches:
            edges.append(Edge(src=fork, dst=b, cost_s=float(rng.integers(0, 5))))
            edges.append(Edge(src=b, dst=join, cost_s=float(rng.integers(0, 5))))
        fork = join
    return OpGraph(ops=tuple(ops), edges=tuple(edges), name=f"modules{seed}",
                   time_unit="unit")


def block_bound(p, solver: str = "highs"):
    name, group_device, value = best_heuristic(p)
    incumbent = Incumbent(group_device, value, name)
    result = block_round(p, BACKENDS[solver], incumbent, time.perf_counter() + 100)
    assert not incumbent.notes, incumbent.notes
    return result


def bound(p, solver: str = "highs") -> float:
    return block_bound(p, solver).value


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("solver", SOLVERS)
def test_the_bound_is_at_most_the_brute_force_optimum(seed, solver):
    k = 2 + seed % 3 // 2
    p = problem(modules(seed, 2, training=seed % 2 == 0), k, "makespan")
    assert bound(p, solver) <= search_step_time(p.tg, k) + 1e-9


def fork_join() -> OpGraph:
    return OpGraph(ops=(Op(id=0, name="fork", forward_s={"any": 1.0}),
                        *(Op(id=i, name=f"branch{i}", forward_s={"any": 4.0})
                          for i in (1, 2, 3)),
                        Op(id=4, name="join", forward_s={"any": 1.0})),
                   edges=tuple(Edge(src=s, dst=d, cost_s=3.0) for b in (1, 2, 3)
                               for s, d in ((0, b), (b, 4))))


def test_a_side_branch_pays_both_transfers_or_queues():
    # fork (1) -> a, b, c (4 each) -> join (1), every transfer 3, two devices. The
    # optimum (12) keeps fork and join on one device with two branches, and sends the
    # third away: out at 1 + 3, back at 8 + 3. Fork and join apart make a branch wait
    # behind another on either side (13). The join head lets each input pay one
    # transfer and come from a device of its own: 8, so the old bound is 9.
    p = problem(fork_join(), 2, "makespan")
    assert step_time_bound(p.tg, 2) == pytest.approx(9.0)
    assert search_step_time(p.tg, 2) == pytest.approx(12.0)
    assert bound(p) == pytest.approx(12.0)


def test_a_graph_without_articulation_tasks_has_no_block_bound():
    # Two independent chains: no task is comparable to every other.
    graph = OpGraph(ops=tuple(Op(id=i, name=f"op{i}", forward_s={"any": 1.0})
                              for i in range(4)),
                    edges=(Edge(src=0, dst=1, cost_s=1.0), Edge(src=2, dst=3, cost_s=1.0)))
    p = problem(graph, 2, "makespan")
    assert blocks(p.tg) == []
    assert bound(p) == -np.inf


def test_the_blocks_cover_the_graph_end_to_end():
    p = problem(modules(3, 3, training=True), 2, "makespan")
    parts = blocks(p.tg)
    assert all(a[-1] == b[0] for a, b in zip(parts, parts[1:]))
    covered = [t for part in parts for t in part[1:]] + [parts[0][0]]
    assert sorted(covered) == list(range(p.tg.num_tasks))


@pytest.mark.parametrize("seed", range(8))
def test_every_schedule_keeps_the_spans(seed):
    k = 2 + seed % 3 // 2
    p = problem(modules(seed, 2, training=seed % 2 == 1), k, "makespan")
    spans = block_bound(p).spans
    rng = np.random.default_rng(seed)
    for _ in range(20):
        s = list_schedule(p.tg, rng.integers(0, k, size=p.tg.num_groups), k)
        for a, b, span in spans:
            end = s.step_time_s if b < 0 else s.start_s[b]
            assert end - (s.start_s[a] if a >= 0 else 0.0) >= span - 1e-9


def test_the_spans_lift_the_fine_model_s_relaxation_to_the_block_bound():
    # Without the spans the LP relaxation of the fork-join model sees neither the
    # transfers (z may be fractional) nor the queue: at most the old bound, 9.
    p = problem(fork_join(), 2, "makespan")
    found = block_bound(p)

    def relaxed(spans) -> float:
        data = makespan_data(p.tg, np.arange(p.tg.num_groups), 2, p.group_memory,
                             p.memory_cap, 14.0, step_time_bound(p.tg, 2), spans=spans)
        model = build_makespan(data)
        pyo.TransformationFactory("core.relax_integer_vars").apply_to(model)
        result = BACKENDS["highs"].run(model, SolveOptions(time_limit_s=10, gap=0.0))
        assert result.status == "optimal"
        return model.C.value * data.scale

    assert relaxed(()) <= 9.0 + 1e-6
    assert relaxed(found.spans) == pytest.approx(12.0)
