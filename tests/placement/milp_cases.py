"""Random DAGs and brute-force optima for the MILP and coarsening tests and benchmarks."""

from __future__ import annotations

import itertools

import numpy as np

from placement.cluster import preset
from placement.graph import Edge, Op, OpGraph
from placement.planner import PlanConfig, Problem, make_problem
from placement.simulate import evaluate_order, max_load
from placement.tasks import TaskGraph

CLUSTER = preset("dgx1-v100")


def random_dag(seed: int, num_ops: int, *, edge_prob: float = 0.4,
               colocate: bool = False) -> OpGraph:
    """Ops 0..n-1 with random times, edges i->j (i<j) with random transfer costs."""
    rng = np.random.default_rng(seed)
    ops = [Op(id=i, name=f"op{i}", forward_s={"any": float(rng.integers(1, 10))},
              colocation="pair" if colocate and i in (0, num_ops - 1) else None)
           for i in range(num_ops)]
    edges = [Edge(src=i, dst=j, cost_s=float(rng.integers(0, 6)))
             for i in range(num_ops) for j in range(i + 1, num_ops)
             if rng.random() < edge_prob]
    return OpGraph(ops=tuple(ops), edges=tuple(edges), name=f"random{seed}",
                   time_unit="unit")


def problem(graph: OpGraph, num_devices: int, objective: str, solver: str = "heuristic",
            time_limit_s: float = 30.0, gap: float = 0.0) -> Problem:
    return make_problem(graph, CLUSTER, PlanConfig(
        num_devices=num_devices, objective=objective, solver=solver,
        time_limit_s=time_limit_s, gap=gap))


def placements(tg: TaskGraph, k: int):
    """Every group -> device array with devices numbered by first use (one per class
    of device relabellings: devices are identical)."""
    for combo in itertools.product(range(k), repeat=tg.num_groups):
        seen = -1
        ok = True
        for d in combo:
            if d > seen + 1:
                ok = False
                break
            seen = max(seen, d)
        if ok:
            yield np.array(combo, dtype=np.int64)


def brute_max_load(tg: TaskGraph, k: int) -> float:
    return min(max_load(tg, gd, k) for gd in placements(tg, k))


def topological_orders(tg: TaskGraph):
    indegree = np.bincount(tg.edge_dst, minlength=tg.num_tasks).tolist()
    order: list[int] = []

    def extend():
        if len(order) == tg.num_tasks:
            yield list(order)
            return
        for t in range(tg.num_tasks):
            if indegree[t] == 0 and t not in order:
                order.append(t)
                for s, _ in tg.successors[t]:
                    indegree[s] -= 1
                yield from extend()
                for s, _ in tg.successors[t]:
                    indegree[s] += 1
                order.pop()
    yield from extend()


def brute_step_time(tg: TaskGraph, k: int) -> float:
    """Least step time over all placements and all per-device orders (each per-device
    order combination that does not deadlock comes from some topological order)."""
    orders = list(topological_orders(tg))
    best = np.inf
    for gd in placements(tg, k):
        dev = tg.task_devices(gd)
        combos = {tuple(tuple(t for t in o if dev[t] == d) for d in range(k)) for o in orders}
        for combo in combos:
            best = min(best, evaluate_order(tg, gd, combo).step_time_s)
    return float(best)
