"""A step-time bound that adds up the optimum of each block between articulation tasks.

An *articulation task* is comparable to every other task: each task is its ancestor or
its descendant. On a graph of modules in sequence (Inception's, a ResNet's stages) the
tasks that join one module and fork the next are such tasks. With a_1 .. a_m the
articulation tasks in topological order, the tasks between a_i and a_(i+1) (descendants
of one, ancestors of the other: the *block*) run after a_i starts and before a_(i+1)
starts, a_1's ancestors before a_1 starts and a_m's descendants after a_m starts, so in
any plan

    step >= OPT_0 - p(a_1) + sum_i (OPT_i - p(a_(i+1))) + OPT_m,

where OPT_i is the least step time of block i alone on the same devices (block 0: a_1
and its ancestors; block m: a_m and its descendants): a plan of the whole graph, cut
down to a block's tasks, is a plan of the block (other tasks only take device time,
inputs from before a_i only add waits, and the memory cap only removes plans). Each
term is also a valid inequality of the step-time MILP (`BlockBound.spans`), which its
LP relaxation misses. The window and join bounds
(`placement.step_bound`) see each block's critical path and how its joins serialize or
pay a transfer one input at a time; OPT_i sees the whole trade inside a module: a side
branch on the critical branch's device queues behind it, and one elsewhere pays the
transfer out of the fork *and* back into the join. On Inception-V3 on two V100s the
blocks' sum is 204.5 ms where the window bound is 192.2; on GNMT the loss forward
and backward cut the step into the forward and backward passes, whose window bounds
add up to more than the whole step's.

Each block's OPT_i is bounded by the step-time MILP on the block alone
(`placement.milp.makespan.block_round`; small: Inception's blocks have 2-44 tasks): the
solver's proven bound when it stops, the block's own window bound before or without
it. Identical blocks (repeated modules) are solved once.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from placement.milp.pipeline_bound import reach_or_self
from placement.step_bound import energetic_bound, step_time_bound
from placement.tasks import TaskGraph


def blocks(tg: TaskGraph) -> list[list[int]]:
    """The graph cut at its articulation tasks a_1 .. a_m: a_1 with its ancestors,
    then per consecutive pair (a, b) the tasks from a to b, then a_m with its
    descendants; each part's tasks in topological order, so a part ends with the task
    the next one starts with. Empty when no task is an articulation task."""
    reach = reach_or_self(tg)
    comparable = (reach | reach.T).all(axis=1)
    arts = [t for t in tg.topological_order if comparable[t]]
    if not arts:
        return []
    position = np.empty(tg.num_tasks, dtype=np.int64)
    position[list(tg.topological_order)] = np.arange(tg.num_tasks)
    masks = ([reach[:, arts[0]]] + [reach[a] & reach[:, b] for a, b in zip(arts, arts[1:])]
             + [reach[arts[-1]]])
    out = []
    for mask in masks:
        inside = np.flatnonzero(mask)
        out.append(inside[np.argsort(position[inside])].tolist())
    return out


def sub_graph(tg: TaskGraph, tasks: list[int]) -> TaskGraph:
    """The task graph of `tasks` alone: their edges among themselves, their groups
    renumbered by first appearance."""
    index = {t: i for i, t in enumerate(tasks)}
    groups = list(dict.fromkeys(tg.group[tasks].tolist()))
    group_index = {g: i for i, g in enumerate(groups)}
    keep = [e for e, (s, d) in enumerate(zip(tg.edge_src.tolist(), tg.edge_dst.tolist()))
            if s in index and d in index]
    return TaskGraph(
        graph=tg.graph, tasks=tuple(tg.tasks[t] for t in tasks),
        duration_s=tg.duration_s[tasks],
        group=np.array([group_index[g] for g in tg.group[tasks].tolist()], dtype=np.int64),
        group_ops=tuple(tg.group_ops[g] for g in groups),
        edge_src=np.array([index[int(tg.edge_src[e])] for e in keep], dtype=np.int64),
        edge_dst=np.array([index[int(tg.edge_dst[e])] for e in keep], dtype=np.int64),
        edge_transfer_s=tg.edge_transfer_s[keep], send_s=tg.send_s[tasks],
        num_micro_batches=1)


#: Most tasks of a block that gets the energetic check (`energetic_bound`, whose time
#: grows with the cube of the tasks: about 0.03 s a check at 80 tasks).
ENERGETIC_MAX_TASKS = 80


@dataclass(frozen=True)
class BlockBound:
    value: float
    """The blocks' sum; -inf when the graph has no articulation task."""
    spans: tuple[tuple[int, int, float], ...]
    """(a, b, s): in every plan, start(b) - start(a) >= s; a = -1 measures from time 0,
    b = -1 to the end of the step. Valid inequalities for the step-time MILP."""
    block_values: tuple[float, ...] = ()
    """Per block of `blocks(tg)`: the bound on its least step time alone."""


def block_bound(tg: TaskGraph, num_devices: int,
                block_optimum: Callable[[TaskGraph, float], float]) -> BlockBound:
    """The blocks' sum (see the module docstring). `block_optimum(block, lower)` gives
    a proven lower bound on a block's least step time from a known one (`lower`, its
    window bound); it is called smallest block first, once per distinct block, and
    may return `lower` (when out of time, say)."""
    parts = blocks(tg)
    if not parts:
        return BlockBound(-math.inf, ())
    subs = [sub_graph(tg, ts) for ts in parts]
    lower = [step_time_bound(s, num_devices) for s in subs]
    lower = [energetic_bound(s, num_devices, lb) if s.num_tasks <= ENERGETIC_MAX_TASKS else lb
             for s, lb in zip(subs, lower)]
    solved: dict[bytes, float] = {}
    for i in sorted(range(len(subs)), key=lambda i: subs[i].num_tasks):
        key = _signature(subs[i])
        if key not in solved:
            solved[key] = block_optimum(subs[i], lower[i])
        lower[i] = max(lower[i], solved[key])
    # Each part but the last ends where the next starts: that task's own time is in
    # the next part's span.
    dur = tg.duration_s
    spans = tuple((ts[0] if i else -1, ts[-1] if i < len(parts) - 1 else -1,
                   float(lb - dur[ts[-1]] if i < len(parts) - 1 else lb))
                  for i, (lb, ts) in enumerate(zip(lower, parts)))
    return BlockBound(float(sum(s for _, _, s in spans)), spans, tuple(lower))


def _signature(s: TaskGraph) -> bytes:
    """Equal for blocks that are the same scheduling problem (a repeated module)."""
    return b"|".join(a.tobytes() for a in (s.duration_s, s.group, s.edge_src, s.edge_dst,
                                            s.edge_transfer_s))
