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


def training_dag(seed: int, num_ops: int, *, edge_prob: float = 0.5) -> OpGraph:
    """A random DAG whose ops carry backward times (so each op is a forward and a
    backward task, colocated), parameters of 1-4 bytes, and ops 0 and n-1 colocated."""
    rng = np.random.default_rng(seed)
    ops = [Op(id=i, name=f"op{i}", forward_s={"any": float(rng.integers(1, 8))},
              backward_s={"any": float(rng.integers(1, 12))},
              param_bytes=float(rng.integers(1, 5)),
              colocation="pair" if i in (0, num_ops - 1) else None)
           for i in range(num_ops)]
    edges = [Edge(src=i, dst=j, cost_s=float(rng.integers(0, 8)))
             for i in range(num_ops) for j in range(i + 1, num_ops)
             if rng.random() < edge_prob]
    return OpGraph(ops=tuple(ops), edges=tuple(edges), name=f"training{seed}",
                   time_unit="unit")


def problem(graph: OpGraph, num_devices: int, objective: str, solver: str = "heuristic",
            time_limit_s: float = 30.0, gap: float = 0.0, num_micro_batches: int = 1,
            device_memory_bytes: float | None = None) -> Problem:
    return make_problem(graph, CLUSTER, PlanConfig(
        num_devices=num_devices, objective=objective, solver=solver,
        time_limit_s=time_limit_s, gap=gap, num_micro_batches=num_micro_batches,
        param_state_factor=1.0, device_memory_bytes=device_memory_bytes))


def placements(tg: TaskGraph, k: int, fits=lambda gd: True):
    """Every group -> device array with devices numbered by first use (one per class
    of device relabellings: devices are identical) for which `fits` holds."""
    for combo in itertools.product(range(k), repeat=tg.num_groups):
        seen = -1
        ok = True
        for d in combo:
            if d > seen + 1:
                ok = False
                break
            seen = max(seen, d)
        if ok and fits(np.array(combo, dtype=np.int64)):
            yield np.array(combo, dtype=np.int64)


def fits_memory(p: Problem):
    """Whether a placement keeps every device within the problem's memory cap."""
    def fits(gd: np.ndarray) -> bool:
        used = np.bincount(gd, weights=p.group_memory, minlength=p.num_devices)
        return bool(used.max() <= p.memory_cap)
    return fits


def brute_max_load(tg: TaskGraph, k: int, fits=lambda gd: True) -> float:
    return min(max_load(tg, gd, k) for gd in placements(tg, k, fits))


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


def brute_step_time(tg: TaskGraph, k: int, fits=lambda gd: True) -> float:
    """Least step time over all placements and all per-device orders (each per-device
    order combination that does not deadlock comes from some topological order)."""
    orders = list(topological_orders(tg))
    best = np.inf
    for gd in placements(tg, k, fits):
        dev = tg.task_devices(gd)
        combos = {tuple(tuple(t for t in o if dev[t] == d) for d in range(k)) for o in orders}
        for combo in combos:
            best = min(best, evaluate_order(tg, gd, combo).step_time_s)
    return float(best)


def search_step_time(tg: TaskGraph, k: int, fits=lambda gd: True) -> float:
    """The same optimum as `brute_step_time`, found by depth-first search fast enough
    for 20-30 tasks. For a placement, an optimal schedule is the as-soon-as-possible
    one of some per-device orders; listing its tasks by (start, topological position)
    gives an order in which each task's start follows from the ones before it, and
    whose keys never decrease. So the search appends one ready task at a time, only
    with a key no smaller than the last one's, and prunes a branch once a device's
    free time plus its work left, or a ready task's start plus its tail, reaches the
    best step time found."""
    position = np.empty(tg.num_tasks, dtype=np.int64)
    position[list(tg.topological_order)] = np.arange(tg.num_tasks)
    tail = np.zeros(tg.num_tasks)
    for t in reversed(tg.topological_order):
        tail[t] = tg.duration_s[t] + max((tail[s] for s, _ in tg.successors[t]), default=0.0)
    best = [np.inf]
    for gd in placements(tg, k, fits):
        _search_order(tg, tg.task_devices(gd), k, position, tail, best)
    return float(best[0])


def _search_order(tg: TaskGraph, dev: np.ndarray, k: int, position: np.ndarray,
                  tail: np.ndarray, best: list[float]) -> None:
    n = tg.num_tasks
    finish = np.zeros(n)
    waiting = np.bincount(tg.edge_dst, minlength=n)
    free = np.zeros(k)
    left = np.bincount(dev, weights=tg.duration_s, minlength=k)
    ready = {t for t in range(n) if waiting[t] == 0}

    def start_of(t: int) -> float:
        arrive = max((finish[p] + (c if dev[p] != dev[t] else 0.0)
                      for p, c in tg.predecessors[t]), default=0.0)
        return max(arrive, free[dev[t]])

    def extend(done: int, last: tuple[float, int], makespan: float) -> None:
        if done == n:
            best[0] = min(best[0], makespan)
            return
        if (free + left).max() >= best[0]:
            return
        starts = {t: start_of(t) for t in ready}
        if max(s + tail[t] for t, s in starts.items()) >= best[0]:
            return
        for t in sorted(starts, key=lambda t: (starts[t], position[t])):
            key = (starts[t], int(position[t]))
            if key < last:
                continue
            d = dev[t]
            saved = free[d]
            finish[t] = starts[t] + tg.duration_s[t]
            free[d] = finish[t]
            left[d] -= tg.duration_s[t]
            ready.discard(t)
            released = []
            for s, _ in tg.successors[t]:
                waiting[s] -= 1
                if waiting[s] == 0:
                    ready.add(s)
                    released.append(s)
            extend(done + 1, key, max(makespan, finish[t]))
            for s, _ in tg.successors[t]:
                waiting[s] += 1
            ready.difference_update(released)
            ready.add(t)
            left[d] += tg.duration_s[t]
            free[d] = saved

    extend(0, (-np.inf, -1), 0.0)
