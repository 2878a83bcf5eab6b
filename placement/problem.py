"""The placement problem every placer works on, and what turns a placement into a Plan.

Shared by the planner's entry point (`placement.planner`) and the MILP
(`placement.milp`), which therefore need not import each other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from placement import heuristics
from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import OpGraph
from placement.plan import OBJECTIVES, Plan
from placement.simulate import (
    busy_time,
    device_loads,
    evaluate_order,
    list_schedule,
    max_load,
    max_load_lower_bound,
    memory_bytes,
)
from placement.step_bound import step_time_bound
from placement.tasks import TaskGraph, build_tasks, corun_slowdown, split_overhead


class InfeasiblePlacementError(UserError):
    """No placement satisfies the memory caps or the colocation groups."""


@dataclass(frozen=True, kw_only=True)
class PlanConfig:
    num_devices: int
    """Devices of one worker (its mp_degree); they share one node."""
    objective: str = "makespan"
    """'makespan' (step time of one training step) or 'max-load' (pipelined)."""
    num_micro_batches: int = 1
    """Micro-batches per step; each op runs once per micro-batch at 1/K of its time."""
    solver: str = "heuristic"
    time_limit_s: float = 60.0
    """Wall-clock limit for a MILP solver."""
    gap: float = 0.01
    """Relative gap at which a MILP solver may stop."""
    threads: int | None = None
    """Solver threads; None lets the solver choose."""
    training: bool = True
    """Include the backward pass of ops that carry backward times."""
    param_state_factor: float = 4.0
    """Bytes kept per parameter byte: weights, gradients and Adam's two moments."""
    device_memory_bytes: float | None = None
    """Memory per device; None takes the graph's (peer format) or the cluster's."""

    def __post_init__(self) -> None:
        if self.num_devices < 1:
            raise UserError(f"--devices {self.num_devices}: a worker needs at least 1 device")
        if self.objective not in OBJECTIVES:
            raise UserError(f"objective {self.objective!r} is unknown: choose one of "
                            f"{', '.join(OBJECTIVES)}")
        if self.num_micro_batches < 1:
            raise UserError(f"--micro-batches {self.num_micro_batches}: must be >= 1")
        if self.time_limit_s <= 0:
            raise UserError(f"--time-limit {self.time_limit_s}: must be > 0 seconds")
        if not 0 <= self.gap < 1:
            raise UserError(f"--gap {self.gap}: a relative gap lies in [0, 1)")


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a placer needs, derived once from graph, cluster and config."""

    tg: TaskGraph
    config: PlanConfig
    group_memory: np.ndarray
    memory_cap: float

    @property
    def num_devices(self) -> int:
        return self.config.num_devices

    def lower_bound(self) -> float:
        return self._lower_bound

    @cached_property
    def _lower_bound(self) -> float:
        # Computed once: the step-time bound's join heads take a second on 2,000 tasks.
        if self.config.objective == "max-load":
            return max_load_lower_bound(self.tg, self.num_devices)
        return step_time_bound(self.tg, self.num_devices)

    def evaluate(self, group_device: np.ndarray) -> float:
        """The objective's value of a placement (step time with a list schedule)."""
        if self.config.objective == "max-load":
            return max_load(self.tg, group_device, self.num_devices)
        return list_schedule(self.tg, group_device, self.num_devices).step_time_s


def make_problem(graph: OpGraph, cluster: ClusterSpec, config: PlanConfig) -> Problem:
    if config.num_devices > cluster.devices_per_node:
        raise UserError(
            f"--devices {config.num_devices}: a worker's devices share one node and "
            f"{cluster.name} has {cluster.devices_per_node} per node: use at most that many"
        )
    kind = cluster.device.name
    tg = build_tasks(graph, link=cluster.intra_node, device_kind=kind,
                     num_micro_batches=config.num_micro_batches, training=config.training,
                     time_factor=split_overhead(graph, kind, config.num_devices,
                                                config.num_micro_batches),
                     corun_slowdown=corun_slowdown(graph, kind, config.num_devices,
                                                   config.num_micro_batches))
    cap = (config.device_memory_bytes or graph.metadata.get("device_memory_bytes")
           or cluster.device.memory_bytes)
    group_memory = memory_bytes(tg, np.arange(tg.num_groups), tg.num_groups,
                                config.param_state_factor)
    _check_memory(tg, group_memory, cap, config.num_devices)
    return Problem(tg=tg, config=config, group_memory=group_memory, memory_cap=float(cap))


def _check_memory(tg: TaskGraph, group_memory: np.ndarray, cap: float,
                  num_devices: int) -> None:
    heaviest = int(np.argmax(group_memory)) if len(group_memory) else 0
    if len(group_memory) and group_memory[heaviest] > cap:
        ops = tg.group_ops[heaviest]
        raise InfeasiblePlacementError(
            f"ops {_ids(ops)} must share a device but need {group_memory[heaviest]:.4g} "
            f"bytes, more than one device's {cap:.4g}: use devices with at least that "
            "much memory or split the colocation group"
        )
    total = float(group_memory.sum())
    if total > cap * num_devices:
        raise InfeasiblePlacementError(
            f"the ops need {total:.4g} bytes, more than {num_devices} devices of "
            f"{cap:.4g} bytes hold: use at least {math.ceil(total / cap)} devices or "
            f"devices with at least {total / num_devices:.4g} bytes"
        )


def _ids(ops: Sequence[int]) -> str:
    return ", ".join(map(str, ops[:5])) + (", ..." if len(ops) > 5 else "")


def finish_plan(problem: Problem, group_device: np.ndarray, *, solver: str, status: str,
                lower_bound: float, solve_seconds: float,
                order: Sequence[Sequence[int]] | None = None,
                notes: Sequence[str] = ()) -> Plan:
    """Simulate a placement (with a given per-device task order, or a list schedule)
    and package it as a Plan whose value is the configured objective's."""
    tg, k = problem.tg, problem.num_devices
    schedule = (evaluate_order(tg, group_device, order) if order is not None
                else list_schedule(tg, group_device, k))
    loads = device_loads(tg, group_device, k)
    step_time = schedule.step_time_s
    if problem.config.objective == "max-load":
        value, device_load = float(loads.max()), loads
    else:
        value, device_load = step_time, busy_time(tg, group_device, k)
    return Plan(
        objective=problem.config.objective, value=value,
        lower_bound=lower_bound, solver=solver, status=status,
        solve_seconds=solve_seconds, num_devices=k,
        num_micro_batches=tg.num_micro_batches, assignment=tg.assignment(group_device),
        order=tuple(tuple(tuple(tg.tasks[t].label()) for t in ts) for ts in schedule.order),
        step_time=step_time, max_load=float(loads.max()),
        device_load=tuple(float(x) for x in device_load),
        device_memory_bytes=tuple(float(x) for x in memory_bytes(
            tg, group_device, k, problem.config.param_state_factor)),
        time_unit=tg.graph.time_unit, graph_name=tg.graph.name,
        granularity=str(tg.graph.metadata.get("granularity", "module")),
        timeline=tuple(
            (*tg.tasks[t].label(), int(schedule.device[t]), float(schedule.start_s[t]),
             float(schedule.finish_s[t]))
            for t in range(tg.num_tasks)),
        notes=tuple(notes),
    )


def heuristic_placements(problem: Problem) -> dict[str, np.ndarray]:
    """Every baseline placer's placement, by name."""
    tg, k = problem.tg, problem.num_devices
    return {
        "single-device": heuristics.single_device(tg),
        "heft": heuristics.heft(tg, k, problem.group_memory, problem.memory_cap),
        "contiguous-dp": heuristics.contiguous_split(tg, k, problem.group_memory,
                                                     problem.memory_cap),
        "memory-first": heuristics.memory_first(tg, k, problem.group_memory,
                                                problem.memory_cap),
    }


def _devices_that_fit(problem: Problem) -> int:
    """The fewest devices on which the memory-first placer fits the groups."""
    k = problem.num_devices
    while True:
        k += 1
        group_device = heuristics.memory_first(problem.tg, k, problem.group_memory,
                                               problem.memory_cap)
        used = np.bincount(group_device, weights=problem.group_memory, minlength=k)
        if used.max() <= problem.memory_cap:
            return k


def best_heuristic(problem: Problem) -> tuple[str, np.ndarray, float]:
    """The baseline with the best objective value that fits in memory."""
    fits = {}
    for name, group_device in heuristic_placements(problem).items():
        used = np.bincount(group_device, weights=problem.group_memory,
                           minlength=problem.num_devices)
        if used.max() <= problem.memory_cap:
            fits[name] = (group_device, problem.evaluate(group_device))
    if not fits:
        raise InfeasiblePlacementError(
            f"no placement the planner tried keeps each of the {problem.num_devices} "
            f"devices within {problem.memory_cap:.4g} bytes (the ops need "
            f"{problem.group_memory.sum():.4g} in all): use at least "
            f"{_devices_that_fit(problem)} devices or devices with more memory")
    name = min(fits, key=lambda n: fits[n][1])
    return name, fits[name][0], fits[name][1]
