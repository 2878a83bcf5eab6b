"""What moving the pooled units off their neighbours' device must cost, for the relaxed
sequence DP (`sequence_dp.relaxed_bound`).

The relaxation drops the senders of cost at most `light` and takes the units then
left with none (a decomposed batch norm's per-channel chains) out of the walk. Pooled
as fluid work that any device may take any part of for free, they made the
relaxation's optimum on decomposed ResNet-50 1.1299 W/4, where placing them for real
behind the same walked placement gives 1.289: the fluid filled every device's slack,
while a real chain sits with its neighbours unless a sender is cut.

So each connected *pool* of such units (joined by dropped senders) is homed on its
last *anchor* (the walked units sharing a dropped sender with it; the DP tracks, by a
sender of no cost over them, whether they all share the home's device), and the DP
keeps its work on the home's device unless it *releases* some: a release (r, h, t)
pours r of the work into the fluid (which may still land on the home's device),
adds h to the home's device and t - h to the fluid. Why every placement is covered:
let S be the pool's units off the home's device.
- All anchors on the home's device: a dropped sender with a member in S and one in
  the rest of the pool or an anchor has members on two devices, one of them the
  home's, so it charges its cost c there and to another device; so S is covered by
  the point (work(S), cost(S), 2 cost(S)) of the Pareto front over every S, cost(S)
  the summed cost of those senders.
- Anchors on two or more devices: take the units the home's device reaches within
  the pool (through senders with members on it); every sender around them has a
  member on the home's device and one off it, and they cut the home from an anchor
  off its device: at least the least such cut (`_apart`) on the home's device and as
  much off it, and at most the whole pool moves.
A sender touching two pools would join them, and the walk's kept senders touch
walked units only, so these charges add to what the walk charges. Pools of more than
MAX_ENUMERATED units get one release, all their work for their cheapest dropped
sender (a nonempty S, or anchors apart, cuts one: the pool and its anchors are
connected). On decomposed ResNet-50 (128 pools, 0.525 W/4 of work; states merged in
cells of 0.02 W/4) the fluid let a relaxed placement through at 1.1295 W/4, the
homed pools prove 1.13 and let one through at 1.1303 (also with cells of 0.01):
the relaxation's optimum hardly moves, since a chain's run moves for about a third
of its work (0.0032 W/4 for 0.0007 on each side), but what it proves does.

Hand-written: a bound of this model's own load function, which no library computes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np
from networkx.utils import UnionFind

#: Pools up to this many units have every subset enumerated (2^n of them).
MAX_ENUMERATED = 16
#: Releases kept per home (each multiplies the DP's states): runs of consecutive
#: points of the front become one, of the run's largest work and least cost.
MAX_RELEASES = 3
#: Pools of more anchors than this take their cheapest dropped sender as the cut
#: between anchors (a cut between two connected anchors cuts one) instead of a max
#: flow per anchor: on the generated 60-layer transformer (`benchmarks.max_load
#: --generated`) one pool has 240 anchors, whose 239 flows took 63 s in a 10-s solve,
#: twice; the operator-level graphs of the benchmarks have at most 6.
MAX_FLOW_ANCHORS = 8


@dataclass(frozen=True)
class Pool:
    units: tuple[int, ...]
    anchors: tuple[int, ...]
    """Its walked neighbours, ascending."""
    work: float
    together: tuple[tuple[float, float], ...]
    """The front of (work(S), cost(S)) with every anchor on one device, (0, 0) first."""
    apart: float
    """The least cost of its senders that cut its last anchor from another (inf for
    one anchor)."""


def anchored_pools(work: np.ndarray, members: Sequence[Sequence[int]], cost: np.ndarray,
                   walked: np.ndarray) -> tuple[list[Pool], float]:
    """The pools of the units not `walked` (a boolean per unit), joined by the senders
    `members`/`cost` (those the walk dropped), and the work of the pooled units with
    no anchor (fluid any device takes for free)."""
    cost = np.asarray(cost, dtype=float)
    sets = UnionFind()
    for m in members:
        sets.union(*(int(x) for x in m if not walked[x]))
    touching: dict[int, list[int]] = {}
    for j, m in enumerate(members):
        pooled = [int(x) for x in m if not walked[x]]
        if pooled:
            touching.setdefault(sets[pooled[0]], []).append(j)
    pools = []
    for senders in touching.values():
        pool = sorted({int(x) for j in senders for x in members[j] if not walked[x]})
        anchors = sorted({int(x) for j in senders for x in members[j] if walked[x]})
        if anchors:
            mine, costs = [members[j] for j in senders], cost[senders]
            pools.append(Pool(units=tuple(pool), anchors=tuple(anchors),
                              work=float(work[pool].sum()),
                              together=tuple(_front(work, mine, costs, pool, anchors)),
                              apart=_apart(mine, costs, anchors)))
    free = float(work[~walked].sum()) - sum(p.work for p in pools)
    return pools, max(free, 0.0)


def releases(pools: Sequence[Pool],
             together: Sequence[bool]) -> list[tuple[float, float, float]]:
    """The releases (work poured into the fluid, charge to the home's device, charge
    to the loads' sum in all) covering every placement of `pools`, homed on one unit,
    where each pool's anchors do or do not share its device (`together`): the
    cheapest first ((0, 0, 0), keeping all, where every pool's anchors share it),
    then at most MAX_RELEASES more."""
    front = [(0.0, 0.0, 0.0)]
    for pool, joined in zip(pools, together):
        # Anchors together: each cut sender has a member on the home's device and one
        # off it. Anchors apart: so does each sender around the units the home's
        # device reaches within the pool (a cut between the home and an anchor off
        # its device), and at most the pool moves.
        mine = ([(w, c, 2 * c) for w, c in pool.together] if joined
                else [(pool.work, pool.apart, 2 * pool.apart)])
        front = _sum_fronts(front, mine)
    return front[:1] + _merged(front[1:])


def _front(work: np.ndarray, members: Sequence[Sequence[int]], cost: np.ndarray,
           pool: list[int], anchors: list[int]) -> list[tuple[float, float]]:
    """The Pareto front of (work(S), cost(S)) over the nonempty S of `pool` off the
    device of all its `anchors`, by increasing work, (0, 0) first."""
    if len(pool) > MAX_ENUMERATED:
        return [(0.0, 0.0), (float(work[pool].sum()), float(cost.min()))]
    bit = {x: 1 << q for q, x in enumerate(pool)}
    subsets = np.arange(1, 1 << len(pool), dtype=np.int64)
    charge = np.zeros(len(subsets))
    for m, c in zip(members, cost.tolist()):
        mask = sum(bit.get(int(x), 0) for x in m)
        held = (subsets & mask) != 0
        rest = ((~subsets & mask) != 0) | bool(set(anchors) & {int(x) for x in m})
        charge += np.where(held & rest, c, 0.0)
    moved = np.zeros(len(subsets))
    for x, b in bit.items():
        moved += np.where(subsets & b, work[x], 0.0)
    front = [(0.0, 0.0)]
    for s in np.lexsort((-moved, charge)).tolist():
        if moved[s] > front[-1][0]:
            front.append((float(moved[s]), float(charge[s])))
    return front


def _apart(members: Sequence[Sequence[int]], cost: np.ndarray,
           anchors: list[int]) -> float:
    """The least cost of the senders `members` that separate the last anchor (the
    home) from another (inf for one anchor): a max flow per other anchor, or, past
    MAX_FLOW_ANCHORS anchors, the cheapest sender (a bound under it)."""
    if len(anchors) < 2:
        return math.inf
    if len(anchors) > MAX_FLOW_ANCHORS:
        return float(cost.min())
    graph = nx.DiGraph()
    for j, (m, c) in enumerate(zip(members, cost.tolist())):
        # A sender is cut once however many of its members lie across: one arc of
        # capacity c that each member reaches and that reaches each member.
        graph.add_edge(("in", j), ("out", j), capacity=c)
        for x in m:
            graph.add_edge(int(x), ("in", j))
            graph.add_edge(("out", j), int(x))
    return float(min(nx.maximum_flow_value(graph, anchors[-1], a) for a in anchors[:-1]))


def _sum_fronts(a: list[tuple[float, float, float]],
                b: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """The front of two pools released independently: the sums no other sum beats
    (at least its work for at most both charges), by increasing charge in all."""
    points = sorted(((wa + wb, ha + hb, ca + cb) for wa, ha, ca in a for wb, hb, cb in b),
                    key=lambda p: (p[2], p[1], -p[0]))
    front: list[tuple[float, float, float]] = []
    for p in points:
        if not any(q[0] >= p[0] and q[1] <= p[1] for q in front):
            front.append(p)
    return front


def _merged(front: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """At most MAX_RELEASES releases covering `front`: runs of consecutive points
    become one of the run's largest work and least charges."""
    runs = np.array_split(np.arange(len(front)), min(MAX_RELEASES, len(front)) or 1)
    return [(max(front[q][0] for q in r), min(front[q][1] for q in r),
             min(front[q][2] for q in r)) for r in runs if len(r)]
