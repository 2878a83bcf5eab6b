"""One plan per mp_degree (read from a directory or computed) and the worker steps
they give at each per-worker batch: the inputs of the cross-over search."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from placement.cluster import ClusterSpec
from placement.errors import UserError
from placement.graph import OpGraph
from placement.plan import Plan, load_plan
from placement.policy import DEFAULT_SOLVER, plan_mp_degrees
from placement.scaling.step import BatchRule, WorkerStep, worker_step

DEFAULT_MP_DEGREES = (2, 4, 8)
#: Seconds the plans that are computed here may take in all.
PLAN_TIME_LIMIT_S = 60.0


def plan_path(plans_dir: str | Path, mp_degree: int) -> Path:
    return Path(plans_dir) / f"plan_mp{mp_degree}.json"


def worker_plans(graph: OpGraph, cluster: ClusterSpec, mp_degrees: Sequence[int],
                 plans_dir: str | Path | None = None,
                 num_micro_batches: Mapping[int, int] | None = None, *,
                 time_limit_s: float = PLAN_TIME_LIMIT_S,
                 solver: str = DEFAULT_SOLVER) -> dict[int, Plan]:
    """A plan per mp_degree (1 included): `plans_dir/plan_mp<m>.json` where present,
    else the planning policy's with `num_micro_batches[m]` (default m) micro-batches,
    all those within `time_limit_s` seconds."""
    if plans_dir is not None and not Path(plans_dir).is_dir():
        raise UserError(f"--plans {plans_dir}: not a directory: give the folder that holds "
                        "plan_mp<M>.json files")
    plans = {}
    to_plan = []
    for m in sorted({1, *mp_degrees}):
        if m > cluster.devices_per_node:
            raise UserError(f"mp_degree {m}: a worker's devices share one node and "
                            f"{cluster.name} has {cluster.devices_per_node} per node: use "
                            "smaller --mp-degrees")
        path = None if plans_dir is None else plan_path(plans_dir, m)
        if path is not None and path.exists():
            plans[m] = _read_plan(path, m)
        else:
            to_plan.append(m)

    def micro_batches(m: int) -> tuple[int, ...]:
        return (1 if m == 1 else (num_micro_batches or {}).get(m, m),)

    plans.update(plan_mp_degrees(graph, cluster, to_plan, time_limit_s=time_limit_s,
                                 solver=solver, micro_batches=micro_batches))
    return dict(sorted(plans.items()))


def _read_plan(path: Path, mp_degree: int) -> Plan:
    p = load_plan(path)
    if p.num_devices != mp_degree:
        raise UserError(f"{path}: the plan uses {p.num_devices} devices, its name says "
                        f"{mp_degree}: rename it plan_mp{p.num_devices}.json")
    return p


def default_batches(profiled_batch: float) -> tuple[float, ...]:
    """Per-worker batches to try: b0/8 ... 4 b0 in powers of two, at least 1 sample."""
    return tuple(sorted({max(1.0, float(round(profiled_batch * 2.0**k))) for k in range(-3, 3)}))


def worker_steps(graph: OpGraph, plans: Mapping[int, Plan], cluster: ClusterSpec,
                 batches: Sequence[float], rule: BatchRule,
                 param_state_factor: float = 4.0) -> list[WorkerStep]:
    """Every (mp_degree, per-worker batch) worker's step."""
    if graph.time_unit != "s":
        raise UserError(f"graph {graph.name!r} gives times in {graph.time_unit!r} units: the "
                        "scaling model needs seconds (profile the model, or convert the graph)")
    if any(b <= 0 for b in batches):
        raise UserError(f"per-worker batches {list(batches)}: each must be > 0 samples")
    return [worker_step(graph, p, cluster, b, rule, param_state_factor)
            for _, p in sorted(plans.items()) for b in batches
            if b >= p.num_micro_batches]
