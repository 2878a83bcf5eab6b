"""Step-time plans assembled from the blocks between articulation tasks.

An articulation task (`placement.milp.block_bound`) is comparable to every other task,
so in any plan the step is the sum of the blocks' spans (from each block's first task's
start to its last task's), less the articulation tasks counted twice: the blocks only
interact through the groups they share. A forward block and the backward block of the
same ops share all their groups; a block and the next share one articulation task's
group. Joining the blocks that share any group other than an articulation task's into
one *part*, and chaining a part's blocks in their order by an edge of no transfer (each
block then runs after the one before it, as in the full step), the part's step time is
the sum of its blocks' spans. Parts share articulation groups only; relabelling each
part's devices to agree with the parts placed before it makes the parts' placements one
placement of the whole graph, whose step, list-scheduled, is the parts' sum when the
schedule keeps each block's order. Each part is small (the layered DAGs of 1,000 ops:
at most 404 of 2,000 tasks), so the local search judges it by a short simulation and
reaches far more placements than on the whole graph within the same time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
from networkx.utils import UnionFind

from placement import heuristics
from placement.milp.block_bound import blocks, sub_graph
from placement.tasks import TaskGraph

#: Fewest blocks worth decomposing: with one or two the parts are the whole graph.
MIN_BLOCKS = 3
#: A part's share of the time grows with its task count to this power (`part_weight`).
#: With the simulator's list loops (fd42c90) a move costs a third of what it did, and
#: the largest parts' searches stall within their share: with 1.5 instead of 2 the
#: parts of the layered DAGs reached 2,805 against 2,818 (500 ops) and 5,730 against
#: 5,744 (1,000 ops), the means of two runs each at load 4-5.
PART_TIME_POWER = 1.5
#: Scales of the transfer times under which `block_starts` runs HEFT.
START_TRANSFER_SCALES = (0.5, 1.0, 2.0)


def parts_of(tg: TaskGraph, block_tasks: list[list[int]]) -> list[list[int]]:
    """Indices of the blocks joined into parts (blocks sharing a group that holds no
    articulation task), each part's blocks in order, parts by their first block."""
    # Each block but the first starts, and each but the last ends, at one.
    articulation = {int(tg.group[ts[-1]]) for ts in block_tasks[:-1]}
    parts = UnionFind(range(len(block_tasks)))
    first_block: dict[int, int] = {}
    for i, ts in enumerate(block_tasks):
        for g in set(tg.group[ts].tolist()) - articulation:
            parts.union(i, first_block.setdefault(g, i))
    return sorted(sorted(part) for part in parts.to_sets())


def chained_graph(tg: TaskGraph, block_tasks: list[list[int]], part: list[int]
                  ) -> tuple[TaskGraph, list[int]]:
    """The part's blocks as one task graph, each block after the one before it (an
    edge of no transfer from its last task to the next one's first where they are not
    one articulation task), and the tasks of `tg` it holds, in its task order."""
    tasks = list(dict.fromkeys(t for i in part for t in block_tasks[i]))
    sub = sub_graph(tg, tasks)
    index = {t: i for i, t in enumerate(tasks)}
    links = [(index[block_tasks[a][-1]], index[block_tasks[b][0]])
             for a, b in zip(part, part[1:]) if block_tasks[a][-1] != block_tasks[b][0]]
    if links:
        src, dst = zip(*links)
        sub = dataclasses.replace(
            sub, edge_src=np.concatenate([sub.edge_src, np.array(src, dtype=np.int64)]),
            edge_dst=np.concatenate([sub.edge_dst, np.array(dst, dtype=np.int64)]),
            edge_transfer_s=np.concatenate([sub.edge_transfer_s, np.zeros(len(links))]))
    return sub, tasks


def decomposed_placement(tg: TaskGraph, num_devices: int, deadline: float,
                         place_part: Callable[[TaskGraph, float, list[np.ndarray]],
                                              np.ndarray]) -> np.ndarray | None:
    """A placement of `tg` from its parts' placements (see the module docstring):
    `place_part(part_graph, until, starts)` places one part by `until`, from the best
    of `starts` (`block_starts`); the time to `deadline` is shared over the parts by
    their task counts squared (`part_weight`). None when the graph has fewer than
    MIN_BLOCKS blocks or a part's placement cannot be relabelled to agree with the
    parts placed before it."""
    block_tasks = blocks(tg)
    if len(block_tasks) < MIN_BLOCKS:
        return None
    parts = parts_of(tg, block_tasks)
    graphs = [chained_graph(tg, block_tasks, part) for part in parts]
    left = sum(part_weight(sub) for sub, _ in graphs)
    group_device = np.full(tg.num_groups, -1, dtype=np.int64)
    for part, (sub, tasks) in zip(parts, graphs):
        share = part_weight(sub) / left
        left -= part_weight(sub)
        until = time.perf_counter() + share * max(0.0, deadline - time.perf_counter())
        local = place_part(sub, until, block_starts(sub, tasks, [block_tasks[i] for i in part],
                                                    num_devices))
        groups = list(dict.fromkeys(tg.group[tasks].tolist()))
        relabel = _relabel(local, [group_device[g] for g in groups], num_devices)
        if relabel is None:
            return None
        group_device[groups] = relabel[local]
    assert (group_device >= 0).all(), "every group lies in some block"
    return group_device


def part_gain(tg: TaskGraph, block_values: Sequence[float],
              part_optimum: Callable[[TaskGraph, float], float]) -> float:
    """How much the parts lift the blocks' bound (`block_bound`, whose per-block
    bounds are `block_values`): in any plan a part's blocks, cut out of it and moved
    up to run back to back, are a plan of the part's chained graph (the link edges
    cost nothing, and the tasks between the blocks only took device time), so the
    blocks' spans add up to at least the chained graph's least step time, plus the
    articulation task two adjacent blocks share (their spans both hold it). That
    sees what no block alone does: a forward block and its backward block on one
    placement. `part_optimum(part_graph, lower)` bounds a part's least step time from
    a known bound, as `block_bound`'s `block_optimum`; smallest part first."""
    block_tasks = blocks(tg)
    gain = 0.0
    chained = [(_free_crossings(*chained_graph(tg, block_tasks, part),
                                [block_tasks[i] for i in part]), part)
               for part in parts_of(tg, block_tasks) if len(part) > 1]
    for sub, part in sorted(chained, key=lambda c: c[0].num_tasks):
        shared = sum(float(tg.duration_s[block_tasks[a][-1]])
                     for a, b in zip(part, part[1:])
                     if block_tasks[a][-1] == block_tasks[b][0])
        lower = sum(block_values[i] for i in part) - shared
        gain += max(0.0, part_optimum(sub, lower) - lower)
    return gain


def _free_crossings(sub: TaskGraph, tasks: list[int], part_blocks: list[list[int]]
                    ) -> TaskGraph:
    """`sub` with no transfer on its edges from one block to a later one: moved up,
    a later block starts when the one before it ends, which may be sooner than such
    an edge's transfer allows (in an unrolled training graph these are the edges from
    an op's forward to its own backward, free already)."""
    # Blocks of the part holding each task: one, or two consecutive ones for the
    # articulation task two adjacent blocks share.
    first = np.full(sub.num_tasks, len(part_blocks), dtype=np.int64)
    last = np.full(sub.num_tasks, -1, dtype=np.int64)
    index = {t: i for i, t in enumerate(tasks)}
    for b, ts in enumerate(part_blocks):
        local = [index[t] for t in ts]
        first[local] = np.minimum(first[local], b)
        last[local] = np.maximum(last[local], b)
    u, v = sub.edge_src, sub.edge_dst
    within = (first[u] <= last[v]) & (first[v] <= last[u])
    return dataclasses.replace(sub, edge_transfer_s=np.where(within, sub.edge_transfer_s,
                                                             0.0))


def largest_part(tg: TaskGraph) -> int:
    """Tasks in the largest part (all of them when the graph has fewer than MIN_BLOCKS
    blocks)."""
    block_tasks = blocks(tg)
    if len(block_tasks) < MIN_BLOCKS:
        return tg.num_tasks
    return max(len({t for i in part for t in block_tasks[i]})
               for part in parts_of(tg, block_tasks))


def part_weight(sub: TaskGraph) -> float:
    """A part's claim on the search's time: a move's simulation costs time in its task
    count, and a round of moves needs a number of simulations in it too. By task count
    alone the 1,000-op layered DAG's largest part (404 tasks) got 5 s, less than one
    round of its moves (before fd42c90, at three times the cost of a move)."""
    return float(sub.num_tasks) ** PART_TIME_POWER


def block_starts(sub: TaskGraph, tasks: list[int], part_blocks: list[list[int]],
                 num_devices: int) -> list[np.ndarray]:
    """Distinct placements of a part to search from: HEFT on the part and on each of
    its blocks alone (heaviest first, lifted to the part: groups of no task in the
    block go where the part's HEFT put them), each with its transfers scaled by
    START_TRANSFER_SCALES and once with each task as long as its group's work.

    HEFT on the part places each group by its forward task alone, but a forward block
    and its backward block want different placements: the backward's tasks are longer,
    so spreading pays more there against the same transfers. Which start is best
    varies from part to part (on the layered DAGs of 500 and 1,000 ops the best of
    these was 4-13% below HEFT on the part on each of the seven largest parts), and on
    the largest parts the search has time for one start only."""
    whole = heuristics.heft(sub, num_devices, np.zeros(sub.num_groups), 1.0)
    index = {t: i for i, t in enumerate(tasks)}
    by_work = sorted(([index[t] for t in ts] for ts in part_blocks),
                     key=lambda local: -float(sub.duration_s[local].sum()))
    starts = [whole]
    for local in [list(range(sub.num_tasks))] + by_work:
        block = sub_graph(sub, local)
        groups = list(dict.fromkeys(sub.group[local].tolist()))
        variants = [dataclasses.replace(block, edge_transfer_s=block.edge_transfer_s * scale)
                    for scale in START_TRANSFER_SCALES]
        variants.append(dataclasses.replace(
            block, duration_s=sub.group_work_s[groups][block.group]))
        for variant in variants:
            gd = whole.copy()
            gd[groups] = heuristics.heft(variant, num_devices,
                                         np.zeros(variant.num_groups), 1.0)
            if not any(np.array_equal(gd, other) for other in starts):
                starts.append(gd)
    return starts


def _relabel(local: np.ndarray, placed: list[int], num_devices: int) -> np.ndarray | None:
    """A permutation of the devices taking each group's device in `local` to its
    device in `placed` (-1: not placed yet); None if none exists."""
    to = np.full(num_devices, -1, dtype=np.int64)
    for d, p in zip(local.tolist(), placed):
        if p < 0:
            continue
        if to[d] not in (-1, p) or (to[d] == -1 and p in to):
            return None
        to[d] = p
    free = [d for d in range(num_devices) if d not in to]
    to[to == -1] = free
    return to
