"""Small training graphs and brute-force references for the max-load tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from placement.graph import Edge, Op, OpGraph
from placement.ideal_dp import forward_tasks
from placement.planner import PlanConfig, Problem, make_problem
from placement.simulate import max_load
from tests.placement.milp_cases import CLUSTER, placements


def training_dag(seed: int, num_ops: int, *, edge_prob: float = 0.5,
                 colocate: bool = False) -> OpGraph:
    """Forward ops 0..n-1 with backward times (so each op gets a backward task on its
    device), edges i->j (i<j) with transfer costs, parameters, and optionally ops 0
    and n-1 in one colocation group."""
    rng = np.random.default_rng(seed)
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": float(rng.integers(1, 10))},
                   backward_s={"any": float(rng.integers(1, 15))},
                   param_bytes=float(rng.integers(1, 5)),
                   colocation="pair" if colocate and i in (0, num_ops - 1) else None)
                for i in range(num_ops))
    edges = tuple(Edge(src=i, dst=j, cost_s=float(rng.integers(0, 6)))
                  for i in range(num_ops) for j in range(i + 1, num_ops)
                  if rng.random() < edge_prob)
    return OpGraph(ops=ops, edges=edges, name=f"training{seed}", time_unit="unit")


def max_load_problem(graph: OpGraph, num_devices: int, *, memory_cap: float | None = None,
                     solver: str = "heuristic", time_limit_s: float = 30.0,
                     gap: float = 0.0) -> Problem:
    """`memory_cap` is in the graph's parameter bytes (4 bytes kept per parameter byte)."""
    return make_problem(graph, CLUSTER, PlanConfig(
        num_devices=num_devices, objective="max-load", solver=solver,
        time_limit_s=time_limit_s, gap=gap,
        device_memory_bytes=None if memory_cap is None else 4.0 * memory_cap))


def fits(p: Problem, group_device: np.ndarray) -> bool:
    used = np.bincount(group_device, weights=p.group_memory, minlength=p.num_devices)
    return bool(used.max() <= p.memory_cap)


def is_contiguous(p: Problem, group_device: np.ndarray) -> bool:
    """Whether the devices' forward quotient graph is acyclic: then ordering the devices
    topologically makes every prefix of them an ideal (a contiguous split)."""
    tg = p.tg
    forward = forward_tasks(tg)
    dev = tg.task_devices(group_device)
    both = forward[tg.edge_src] & forward[tg.edge_dst]
    arcs = {(int(a), int(b)) for a, b in zip(dev[tg.edge_src[both]], dev[tg.edge_dst[both]])
            if a != b}
    left = set(range(p.num_devices))
    while left:
        sources = [d for d in left if not any(b == d and a in left for a, b in arcs)]
        if not sources:
            return False
        left -= set(sources)
    return True


def brute_max_load(p: Problem, *, contiguous: bool) -> float:
    """The least max-load over placements that fit (and, if asked, are contiguous);
    inf when none does."""
    return min((max_load(p.tg, gd, p.num_devices) for gd in placements(p.tg, p.num_devices)
                if fits(p, gd) and (not contiguous or is_contiguous(p, gd))), default=np.inf)


def peer_host_work(path: Path, p: Problem) -> np.ndarray:
    """Per group the peer file's `cpuLatency` sum: the time on the peer program's CPU."""
    cpu = {n["id"]: n["cpuLatency"] for n in json.loads(path.read_text())["nodes"]}
    return np.array([sum(cpu[op] for op in ops) for ops in p.tg.group_ops])

