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
blocks' sum is 205.8 ms where the window bound is 192.2; on GNMT the loss forward
and backward cut the step into the forward and backward passes, whose window bounds
add up to more than the whole step's.

Each block's OPT_i is bounded by the step-time MILP on the block alone
(`placement.milp.makespan.block_round`; small: Inception's blocks have 2-44 tasks): the
solver's proven bound when it stops, the block's own window bound before or without
it. Identical blocks (repeated modules) are solved once. A module's forward and
backward blocks share its placement groups, so their two terms are bounded together
too: the MILP on both blocks chained by an edge of no transfer, whose least step time
is the least sum of the two over the placements they share (`joined`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from placement.milp.pipeline_bound import reach_or_self
from placement.step_bound import step_time_bound
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


Span = tuple[tuple[tuple[int, int], ...], float]
"""((a, b), ...), s: in every plan the sum of start(b) - start(a) over the pairs is at
least s; a = -1 measures from time 0, b = -1 to the end of the step."""


@dataclass(frozen=True)
class BlockBound:
    value: float
    """The blocks' sum; -inf when the graph has no articulation task."""
    spans: tuple[Span, ...]
    """Valid inequalities for the step-time MILP; each block is in one of them."""


def block_bound(tg: TaskGraph, num_devices: int,
                block_optimum: Callable[[TaskGraph, float], float]) -> BlockBound:
    """The blocks' sum (see the module docstring). `block_optimum(block, lower)` gives
    a proven lower bound on a block's least step time from a known one (`lower`, its
    window bound); it is called smallest block first, once per distinct block, then
    on the pairs of blocks that share a placement group (`joined`), and may return
    `lower` (when out of time, say)."""
    parts = blocks(tg)
    if not parts:
        return BlockBound(-math.inf, ())
    solved: dict[bytes, float] = {}

    def optimum(s: TaskGraph, lower: float) -> float:
        key = _signature(s)
        if key not in solved:
            solved[key] = block_optimum(s, lower)
        return max(lower, solved[key])

    subs = [sub_graph(tg, ts) for ts in parts]
    lower = [step_time_bound(s, num_devices) for s in subs]
    for i in sorted(range(len(subs)), key=lambda i: subs[i].num_tasks):
        lower[i] = optimum(subs[i], lower[i])
    # Each part but the last ends where the next starts: that task's own time is in
    # the next part's span.
    dur = tg.duration_s
    last = len(parts) - 1
    own = [float(dur[ts[-1]]) if i < last else 0.0 for i, ts in enumerate(parts)]
    ends = [(ts[0] if i else -1, ts[-1] if i < last else -1) for i, ts in enumerate(parts)]
    spans = {i: ((ends[i],), lower[i] - own[i]) for i in range(len(parts))}
    for i, j in _sharing(tg, parts):
        pair = joined(tg, parts[i], parts[j])
        both = optimum(pair, max(lower[i] + lower[j], step_time_bound(pair, num_devices)))
        if both > lower[i] + lower[j]:
            del spans[j]
            spans[i] = ((ends[i], ends[j]), both - own[i] - own[j])
    kept = tuple(spans[i] for i in sorted(spans))
    return BlockBound(float(sum(s for _, s in kept)), kept)


def _sharing(tg: TaskGraph, parts: list[list[int]]) -> list[tuple[int, int]]:
    """Disjoint pairs (i, j), i < j, of parts whose inner tasks share a placement group
    (a module's forward and its backward), smaller pairs first."""
    inner = [set(tg.group[ts[1:-1]].tolist()) for ts in parts]
    pairs, used = [], set()
    for i in range(len(parts)):
        for j in range(i + 1, len(parts)):
            if (i not in used and j not in used and inner[i] & inner[j]
                    and set(parts[i]).isdisjoint(parts[j])):
                pairs.append((i, j))
                used |= {i, j}
    return sorted(pairs, key=lambda p: len(parts[p[0]]) + len(parts[p[1]]))


def joined(tg: TaskGraph, first: list[int], second: list[int]) -> TaskGraph:
    """The task graph of two disjoint blocks with an edge of no transfer from the first
    one's last task to the second one's first: its least step time is the least, over
    the placements of both, of the sum of their step times, which the groups they share
    tie together."""
    s = sub_graph(tg, first + second)
    return dataclasses.replace(
        s, edge_src=np.append(s.edge_src, len(first) - 1),
        edge_dst=np.append(s.edge_dst, len(first)),
        edge_transfer_s=np.append(s.edge_transfer_s, 0.0))


def _signature(s: TaskGraph) -> bytes:
    """Equal for blocks that are the same scheduling problem (a repeated module)."""
    return b"|".join(a.tobytes() for a in (s.duration_s, s.group, s.edge_src, s.edge_dst,
                                            s.edge_transfer_s))
