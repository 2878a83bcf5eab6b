"""The result of placing one worker's ops onto its devices."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from placement.errors import UserError

OBJECTIVES = ("makespan", "max-load")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Op -> device assignment plus each device's task order, with its predicted value.

    `value` is the objective's figure (step time for 'makespan', max-load for
    'max-load') in the graph's time unit; `lower_bound` a proven bound on any plan's.
    """

    objective: str
    value: float
    lower_bound: float
    solver: str
    """Who made the plan: a MILP solver ('highs', 'cbc', 'glpk'), or the baseline placer
    it came from ('heuristic:heft', 'heuristic:heft + local search'), even when a
    solver ran and found nothing better (its notes say so)."""
    status: str
    """'optimal' (proven within the configured gap, whoever made it); else 'feasible' (a
    MILP solver's plan, gap not closed), 'time_limit' (a MILP solver's plan when the
    time ran out or its answer failed a check), or 'heuristic' (a baseline placer's
    plan, maybe refined by local search)."""
    solve_seconds: float
    num_devices: int
    num_micro_batches: int
    assignment: Mapping[int, int]
    """Op id -> device index."""
    order: tuple[tuple[tuple[int, str, int], ...], ...]
    """Per device: tasks (op id, 'forward'|'backward', micro-batch) in execution order."""
    step_time: float
    """Simulated step time of this plan (whatever the objective)."""
    max_load: float
    """Max-load of this plan's assignment (whatever the objective)."""
    device_load: tuple[float, ...]
    """Per device: busy time (makespan) or max-load accounting (max-load)."""
    device_memory_bytes: tuple[float, ...]
    time_unit: str = "s"
    graph_name: str = ""
    granularity: str = "module"
    """What one op of the placed graph is (`orchestrator profile --granularity`): the
    worker cuts the model into ops the same way, so that the op ids mean the same."""
    timeline: tuple[tuple[int, str, int, int, float, float], ...] = ()
    """(op id, phase, micro-batch, device, start, end) per task, for Gantt charts."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Warnings a user should see (a solver fell back, a time limit hit, ...)."""

    def __post_init__(self) -> None:
        assert self.objective in OBJECTIVES, self.objective
        assert self.value >= self.lower_bound - 1e-9 * max(1.0, abs(self.value)), (
            f"plan value {self.value} below its lower bound {self.lower_bound}")

    @property
    def gap(self) -> float:
        """Relative gap between value and bound (0 when proven optimal)."""
        if self.value <= 0:
            return 0.0
        return max(0.0, (self.value - self.lower_bound) / self.value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "value": self.value,
            "lower_bound": self.lower_bound,
            "gap": self.gap,
            "solver": self.solver,
            "status": self.status,
            "solve_seconds": self.solve_seconds,
            "time_unit": self.time_unit,
            "graph": self.graph_name,
            "granularity": self.granularity,
            "num_devices": self.num_devices,
            "num_micro_batches": self.num_micro_batches,
            "step_time": self.step_time,
            "max_load": self.max_load,
            "device_load": list(self.device_load),
            "device_memory_bytes": list(self.device_memory_bytes),
            "assignment": {str(k): v for k, v in sorted(self.assignment.items())},
            "order": [[task[0] for task in tasks] for tasks in self.order],
            "order_tasks": [[list(task) for task in tasks] for tasks in self.order],
            "timeline": [list(row) for row in self.timeline],
            "notes": list(self.notes),
        }

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def plan_from_dict(data: Mapping[str, Any]) -> Plan:
    return Plan(
        objective=data["objective"], value=data["value"], lower_bound=data["lower_bound"],
        solver=data["solver"], status=data["status"], solve_seconds=data["solve_seconds"],
        num_devices=data["num_devices"], num_micro_batches=data["num_micro_batches"],
        assignment={int(k): int(v) for k, v in data["assignment"].items()},
        order=tuple(tuple((int(t[0]), str(t[1]), int(t[2])) for t in tasks)
                    for tasks in data["order_tasks"]),
        step_time=data["step_time"], max_load=data["max_load"],
        device_load=tuple(data["device_load"]),
        device_memory_bytes=tuple(data["device_memory_bytes"]),
        time_unit=data.get("time_unit", "s"), graph_name=data.get("graph", ""),
        granularity=data.get("granularity", "module"),
        timeline=tuple(tuple(row) for row in data.get("timeline", ())),
        notes=tuple(data.get("notes", ())),
    )


def load_plan(path: str | Path) -> Plan:
    """Read a plan file (`Plan.save`, `orchestrator plan --out`); one that is not JSON,
    or JSON that is not a plan, is the user's error."""
    try:
        return plan_from_dict(json.loads(Path(path).read_text()))
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{path}: not a plan file ({err.__class__.__name__}: {err}): write "
                        "it with 'orchestrator plan --out'") from None
