"""The max-load-optimal contiguous split over the ideals of the DAG (Tarnawski et al.,
NeurIPS 2020, "Efficient Algorithms for Device Placement of DNN Graph Operators").

A *contiguous split* gives device j the blocks I_j minus I_(j-1) of a chain of ideals
(down-sets) {} = I_0 <= I_1 <= ... <= I_k = all blocks of the forward graph, where a
block is a strongly connected set of placement groups (colocation can join groups into
a cycle, and a contiguous split must then keep them together); backward tasks follow
their groups, as in the peer program. The family holds the splits of every
topological order, so it contains `heuristics.contiguous_split`'s.

The dynamic program: f_c(I) = min over ideals I' <= I of max(f_(c-1)(I'), load(I - I')),
where load is a device's max-load (work, plus the send cost of each of its tasks with a
successor outside, plus that of each outside task feeding it: `simulate.device_loads`).

Reductions that keep it exact: side inputs (`side_inputs`) join their one neighbour;
with U a max-load to beat, a piece of a split at most as good has work <= U, so I_c has
work in [total - (k-c) U, c U] and a piece spans at most U of work: pairs outside these
windows are never compared. What it guarantees: when the ideals number at most
`max_ideals` (and fit `MAX_IDEAL_CELLS`) and the DP ends before its deadline,
`IdealSplit.exact` is True and the value is the optimum over all contiguous splits that
fit in memory; otherwise the result is the contiguous heuristic's (`exact` False).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.heuristics import contiguous_split, group_sequence
from placement.simulate import device_loads, max_load
from placement.tasks import TaskGraph

#: Enumerating ideals stops here: each costs about 40 us to enumerate and a DP step of
#: numpy work on its window, so the cap keeps the DP to seconds on 2 cores.
MAX_IDEALS = 60_000
#: ... and where ideals x blocks passes this (the DP keeps an ideal x block table).
MAX_IDEAL_CELLS = 30_000_000


@dataclass(frozen=True, eq=False)
class IdealSplit:
    group_device: np.ndarray
    value: float
    exact: bool
    """Whether `value` is proven optimal over every contiguous split (all ideals were
    enumerated and the DP finished); False: this is the contiguous heuristic's split."""
    num_ideals: int
    """Ideals enumerated (the cap when they passed it)."""


@dataclass(frozen=True, eq=False)
class Senders:
    """Tasks merged by (unit, set of successor units): they cross devices together."""

    unit: np.ndarray
    """Per sender: the unit (cluster of groups) holding its tasks."""
    targets: tuple[tuple[int, ...], ...]
    """Per sender: the other units holding a successor."""
    cost: np.ndarray
    """Per sender: the summed send cost of its tasks."""


def merged_senders(tg: TaskGraph, unit_of_group: np.ndarray) -> Senders:
    unit_of_task = unit_of_group[tg.group]
    senders: dict[tuple[int, tuple[int, ...]], float] = {}
    for u in np.flatnonzero(tg.send_s > 0).tolist():
        mine = int(unit_of_task[u])
        targets = tuple(sorted({int(unit_of_task[v]) for v, _ in tg.successors[u]} - {mine}))
        if targets:
            senders[(mine, targets)] = senders.get((mine, targets), 0.0) + float(tg.send_s[u])
    return Senders(unit=np.array([k[0] for k in senders], dtype=np.int64),
                   targets=tuple(k[1] for k in senders),
                   cost=np.array(list(senders.values()), dtype=float))


def ideal_split(tg: TaskGraph, num_devices: int, group_memory: np.ndarray,
                memory_cap: float, *, upper: float | None = None,
                host_work: np.ndarray | None = None, max_ideals: int = MAX_IDEALS,
                deadline: float | None = None) -> IdealSplit | None:
    """The max-load-optimal contiguous split over ideals (see the module docstring).

    `upper`: a max-load to beat (a caller's incumbent); the result is then the optimum
    when it is below `upper`, else None. Without it, the contiguous heuristic's split
    is the bound and the fallback. `host_work` (per group) adds the peer program's CPU
    (`maxCPUs` 1 in its files): one more device, without a memory cap, whose load is
    its groups' host time and which pays no transfers (its neighbours still do); it
    gets device number `num_devices`. None also when no contiguous split fits.
    `deadline` (a time.perf_counter() value): past it the DP stops and the result is
    the fallback, not exact (on operator graphs whose transfers outweigh their work
    the windows span most ideals and the DP takes tens of seconds).
    """
    block_of_group, block_preds = condensed_groups(
        tg, side_inputs(tg, group_memory, memory_cap))
    fallback = None
    if upper is None:
        fallback = contiguous_split(tg, num_devices, group_memory, memory_cap)
        # It bounds the DP only when its split fits (where none does it returns the best
        # regardless of memory) and is one of the family (with colocation the group
        # sequence's intervals need not be).
        fallback_fits = (np.bincount(fallback, weights=group_memory,
                                     minlength=num_devices).max() <= memory_cap)
        if fallback_fits and is_ideal_chain(block_of_group, block_preds, fallback):
            upper = max_load(tg, fallback, num_devices)
        else:
            fallback, upper = None, np.inf
    num_blocks = len(block_preds)
    budget = max(1, min(max_ideals, MAX_IDEAL_CELLS // max(1, num_blocks)))
    ideals = enumerate_ideals(block_preds, budget)
    if ideals is None:
        return None if fallback is None else IdealSplit(
            group_device=fallback, value=upper, exact=False, num_ideals=budget)
    dp = _IdealDP(tg, num_devices, block_of_group, block_preds, ideals,
                  np.bincount(block_of_group, weights=group_memory, minlength=num_blocks),
                  memory_cap, upper,
                  None if host_work is None else np.bincount(
                      block_of_group, weights=host_work, minlength=num_blocks))
    try:
        pieces = dp.solve(deadline)
    except TimeoutError:
        return None if fallback is None else IdealSplit(
            group_device=fallback, value=upper, exact=False, num_ideals=len(ideals))
    if pieces is not None:
        block_device = np.empty(num_blocks, dtype=np.int64)
        device = 0
        for piece, on_host in pieces:
            block_device[_bits(piece)] = num_devices if on_host else device
            device += not on_host
        group_device = block_device[block_of_group]
        value = split_value(tg, group_device, num_devices, host_work)
        if value < upper:
            return IdealSplit(group_device=group_device, value=value, exact=True,
                              num_ideals=len(ideals))
    return None if fallback is None else IdealSplit(
        group_device=fallback, value=upper, exact=True, num_ideals=len(ideals))


def split_value(tg: TaskGraph, group_device: np.ndarray, num_devices: int,
                host_work: np.ndarray | None = None) -> float:
    """Max-load of a placement; with `host_work`, device `num_devices` is the host
    (its load is its host time alone)."""
    if host_work is None:
        return max_load(tg, group_device, num_devices)
    loads = device_loads(tg, group_device, num_devices + 1)
    loads[num_devices] = float(host_work[group_device == num_devices].sum())
    return float(loads.max())


def is_ideal_chain(block_of_group: np.ndarray, block_preds: list[int],
                   group_device: np.ndarray) -> bool:
    """Whether a placement is a contiguous split: each block on one device and the
    devices' quotient of the block DAG acyclic (so some device order makes every
    prefix an ideal)."""
    block_device: dict[int, int] = {}
    for b, d in zip(block_of_group.tolist(), group_device.tolist()):
        if block_device.setdefault(b, d) != d:
            return False
    arcs = {(block_device[a], block_device[b]) for b, mask in enumerate(block_preds)
            for a in _bits(mask) if block_device[a] != block_device[b]}
    left = set(block_device.values())
    while left:
        free = {d for d in left if not any(b == d and a in left for a, b in arcs)}
        if not free:
            return False
        left -= free
    return True


def _bits(mask: int) -> list[int]:
    return [i for i, b in enumerate(reversed(bin(mask)[2:])) if b == "1"]


def forward_tasks(tg: TaskGraph) -> np.ndarray:
    """Per task: whether it is a forward task (neither an implied backward task nor an
    explicit backward op)."""
    explicit = np.array([tg.graph.op(t.op_id).is_backward for t in tg.tasks], dtype=bool)
    implied = np.array([t.backward for t in tg.tasks], dtype=bool)
    return ~(explicit | implied)


def side_inputs(tg: TaskGraph, group_memory: np.ndarray, memory_cap: float) -> np.ndarray:
    """Per group the group it may join without loss (itself where none): a forward
    source whose every edge, either way, meets one other group c, whose work is at
    most the send costs of its tasks that send to c, and whose memory is 0 or the cap
    can never bind. Moving it to c's device takes its work and transfers off its own
    device and adds at most its work to c's device, which no longer receives those
    sends; the devices' quotient stays acyclic. So the optimum over contiguous splits
    keeps it with c, and joining them shrinks the ideals (at operator granularity, a
    weight's transpose feeding one matmul is such a source: one per weight, each
    doubling the ideals of every cut it is pending at)."""
    join = np.arange(tg.num_groups)
    src_group, dst_group = tg.group[tg.edge_src], tg.group[tg.edge_dst]
    forward = forward_tasks(tg)
    forward_pred = np.zeros(tg.num_groups, dtype=bool)
    leaves = src_group != dst_group
    both = forward[tg.edge_src] & forward[tg.edge_dst] & leaves
    forward_pred[dst_group[both]] = True
    neighbours: list[set[int]] = [set() for _ in range(tg.num_groups)]
    for a, b in zip(src_group.tolist(), dst_group.tolist()):
        if a != b:
            neighbours[a].add(b)
            neighbours[b].add(a)
    # Only a task that sends out of its group pays for it when c sits elsewhere (one
    # whose consumers are all in its own group never does), so only those count.
    sends_out = np.bincount(tg.edge_src[leaves], minlength=tg.num_tasks) > 0
    sends = np.bincount(tg.group, weights=tg.send_s * sends_out, minlength=tg.num_groups)
    cap_binds = float(group_memory.sum()) > memory_cap
    for g in range(tg.num_groups):
        if (len(neighbours[g]) == 1 and not forward_pred[g]
                and tg.group_work_s[g] <= sends[g]
                and (group_memory[g] == 0 or not cap_binds)):
            (join[g],) = neighbours[g]
    return join


def join_roots(join: np.ndarray) -> np.ndarray:
    """Per group the group it ends up with under `side_inputs`' joins. A side input's
    one neighbour is its only neighbour's only neighbour when it joins back, so the
    joins form stars and 2-cycles; a 2-cycle keeps its smaller group."""
    root = join.copy()
    back = join[join] == np.arange(len(join))
    root[back] = np.minimum(join[back], np.arange(len(join))[back])
    return root


def joined_sequence(tg: TaskGraph, root: np.ndarray,
                    order: Sequence[int] | None = None) -> list[int]:
    """The group sequence with each joined group moved to just before its root, and
    each *pendant* root (one forward successor root, no forward predecessor but
    pendant ones) moved, with what hangs into it, to just before that successor: at
    operator granularity a batch norm's weight passes through unsqueeze ops that have
    no input in the graph, and the topological order puts all of them first, so every
    interval split of it pays their transfers to the far devices. Side inputs and
    pendants have no forward predecessor outside what moves with them, so this is
    still a topological order of the forward groups, and its intervals keep side
    inputs with their neighbours and pendant chains with their consumers. `order`:
    the topological order of the tasks it starts from (`group_sequence`'s)."""
    members: dict[int, list[int]] = {}
    for g in np.flatnonzero(root != np.arange(len(root))).tolist():
        members.setdefault(int(root[g]), []).append(g)
    roots = [g for g in group_sequence(tg, order) if root[g] == g]
    successor = _pendant_successors(tg, root, roots)
    # What hangs into a root, heaviest first: the lightest (a weight's unsqueeze)
    # then sits next to it, a chain of real work (a pendant main path) before.
    tree_work = np.bincount(root, weights=tg.group_work_s, minlength=len(root))
    feeders: dict[int, list[int]] = {}
    for g in roots:
        if g in successor:
            tree_work[successor[g]] += tree_work[g]
            feeders.setdefault(successor[g], []).append(g)
    for hanging in feeders.values():
        hanging.sort(key=lambda g: -tree_work[g])
    seq: list[int] = []

    def emit(g: int) -> None:
        stack = [(g, False)]
        while stack:
            h, ready = stack.pop()
            if ready:
                seq.extend(members.get(h, []))
                seq.append(h)
                continue
            stack.append((h, True))
            stack.extend((f, False) for f in reversed(feeders.get(h, [])))

    for g in roots:
        if g not in successor:
            emit(g)
    return seq


def _pendant_successors(tg: TaskGraph, root: np.ndarray, roots: list[int]) -> dict[int, int]:
    """Per pendant root (in `roots`, a group sequence of the roots) its one forward
    successor root. A predecessor later in the sequence (colocation can close a
    cycle of groups) counts as not pendant."""
    forward = forward_tasks(tg)
    both = forward[tg.edge_src] & forward[tg.edge_dst]
    src, dst = root[tg.group[tg.edge_src[both]]], root[tg.group[tg.edge_dst[both]]]
    preds: dict[int, set[int]] = {}
    succs: dict[int, set[int]] = {}
    for a, b in zip(src.tolist(), dst.tolist()):
        if a != b:
            succs.setdefault(a, set()).add(b)
            preds.setdefault(b, set()).add(a)
    successor: dict[int, int] = {}
    for g in roots:
        if len(succs.get(g, ())) == 1 and all(p in successor for p in preds.get(g, ())):
            (successor[g],) = succs[g]
    return successor


def condensed_groups(tg: TaskGraph, join: np.ndarray | None = None
                     ) -> tuple[np.ndarray, list[int]]:
    """Per group its block (strongly connected component of the forward group graph,
    after joining each group g with `join[g]`, numbered in a topological order), and
    per block the bit mask of its predecessor blocks. Only forward edges order the
    groups, as in the peer program: a backward task sits on its forward op's device,
    so its edges run against the forward ones and would join every group into one
    component."""
    n = tg.num_groups
    join = np.arange(n) if join is None else join
    forward = forward_tasks(tg)
    both = forward[tg.edge_src] & forward[tg.edge_dst]
    succ: list[set[int]] = [set() for _ in range(n)]
    for a, b in zip(join[tg.group[tg.edge_src[both]]].tolist(),
                    join[tg.group[tg.edge_dst[both]]].tolist()):
        if a != b:
            succ[a].add(b)
    # A joined pair becomes a 2-cycle, so one component.
    for g in np.flatnonzero(join != np.arange(n)).tolist():
        succ[g].add(int(join[g]))
        succ[int(join[g])].add(g)
    pred: list[list[int]] = [[] for _ in range(n)]
    for a in range(n):
        for b in succ[a]:
            pred[b].append(a)
    # Kosaraju: finish order on the graph, then components on the reverse graph in
    # reverse finish order, which numbers them topologically.
    finished: list[int] = []
    seen = [False] * n
    for root in range(n):
        if seen[root]:
            continue
        seen[root] = True
        stack = [(root, iter(succ[root]))]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                finished.append(node)
            elif not seen[nxt]:
                seen[nxt] = True
                stack.append((nxt, iter(succ[nxt])))
    block = np.full(n, -1, dtype=np.int64)
    num_blocks = 0
    for root in reversed(finished):
        if block[root] >= 0:
            continue
        block[root] = num_blocks
        todo = [root]
        while todo:
            node = todo.pop()
            for p in pred[node]:
                if block[p] < 0:
                    block[p] = num_blocks
                    todo.append(p)
        num_blocks += 1
    preds = [0] * num_blocks
    for a in range(n):
        for b in succ[a]:
            if block[a] != block[b]:
                preds[block[b]] |= 1 << int(block[a])
    return block, preds


def enumerate_ideals(block_preds: list[int], max_ideals: int) -> list[int] | None:
    """Every ideal (down-set) of the block DAG as a bit mask, by breadth-first search
    from the empty set: an ideal grows by one of its *ready* blocks (not in it, every
    predecessor in it), and adding block b readies only successors of b. None when
    there are more than `max_ideals`."""
    num_blocks = len(block_preds)
    succ: list[list[int]] = [[] for _ in range(num_blocks)]
    for b, mask in enumerate(block_preds):
        for a in _bits(mask):
            succ[a].append(b)
    seen = {0}
    frontier = [(0, tuple(b for b in range(num_blocks) if not block_preds[b]))]
    while frontier:
        grown = []
        for ideal, ready in frontier:
            for b in ready:
                bigger = ideal | 1 << b
                if bigger in seen:
                    continue
                seen.add(bigger)
                now_ready = [r for r in ready if r != b]
                now_ready += [s for s in succ[b]
                              if block_preds[s] & bigger == block_preds[s]]
                grown.append((bigger, tuple(now_ready)))
            if len(seen) > max_ideals:
                return None
        frontier = grown
    return sorted(seen, key=int.bit_count)


class _IdealDP:
    """The DP's arrays: ideals as packed bit rows (little-endian words), their work,
    memory and out-cost A(I) (send cost of the senders in I with a target outside).

    State (c, h, I): ideal I covered by c accelerators and h in {0, 1} hosts. A piece
    P = I - I' on an accelerator costs work(P) + S1 + S2, where S1 = A(I) minus the
    senders of I' with a target outside I, and S2 = the senders of I' with a target in
    P; both sums run over the senders of I' that leave it, a short list.
    """

    def __init__(self, tg: TaskGraph, num_devices: int, block_of_group: np.ndarray,
                 block_preds: list[int], ideals: list[int], block_memory: np.ndarray,
                 memory_cap: float, upper: float, host_work: np.ndarray | None) -> None:
        num_blocks = len(block_memory)
        words = max(1, -(-num_blocks // 64))
        self.k, self.cap = num_devices, memory_cap
        self.limit = upper * (1 + 1e-12)
        self.bits = self._pack(ideals, words)
        member = np.unpackbits(self.bits.view(np.uint8), axis=1, bitorder="little")
        self.member = member[:, :num_blocks].astype(bool)
        block_work = np.bincount(block_of_group, weights=tg.group_work_s,
                                 minlength=num_blocks)
        self.work = self.member @ block_work
        self.memory = self.member @ block_memory
        self.host = None if host_work is None else self.member @ host_work
        senders = merged_senders(tg, block_of_group)
        kind = _sender_kinds(senders, block_preds)
        self.fwd, self.rev, self.mixed = (_SenderClass(senders, kind == i, words)
                                          for i in range(3))
        # out_cost: A(I), forward senders in I with a target outside I.
        # rev_boundary: RB(I), reverse senders outside I with a target in I.
        self.out_cost = np.zeros(len(ideals))
        self.rev_boundary = np.zeros(len(ideals))
        for cls, into in ((self.fwd, self.out_cost), (self.rev, self.rev_boundary)):
            for unit, targets, cost in zip(cls.unit, cls.target_lists, cls.cost):
                inside = self.member[:, unit]
                if into is self.out_cost:
                    into += cost * (inside & ~self.member[:, targets].all(axis=1))
                else:
                    into += cost * (~inside & self.member[:, targets].any(axis=1))
        self.by_work = np.argsort(self.work, kind="stable")
        self.sorted_work = self.work[self.by_work]

    @staticmethod
    def _pack(masks: list[int], words: int) -> np.ndarray:
        raw = b"".join(m.to_bytes(8 * words, "little") for m in masks)
        return np.frombuffer(raw, dtype="<u8").reshape(len(masks), words).copy()

    def _mask(self, i: int) -> int:
        return int.from_bytes(self.bits[i].tobytes(), "little")

    def solve(self, deadline: float | None) -> list[tuple[int, bool]] | None:
        """The best split's pieces as (block mask, on the host), or None when no split
        beats the upper bound. Ideals are sorted by size: 0 is {}, the last is all."""
        n, k = len(self.work), self.k
        total = float(self.work[-1])
        hosts = (0, 1) if self.host is not None else (0,)
        best = {(c, h): np.full(n, np.inf) for c in range(k + 1) for h in hosts}
        parent = {key: np.full(n, -1, dtype=np.int64) for key in best}
        # via[c, h][I]: the state's last piece is the host's.
        via = {key: np.zeros(n, dtype=bool) for key in best}
        best[0, 0][0] = 0.0
        for c in range(k + 1):
            for h in hosts:
                # Without a host, a split no worse than the bound has every piece's
                # work <= limit, so I_c lies in this band.
                in_band = (np.ones(n, dtype=bool)
                           if self.host is not None or not np.isfinite(self.limit) else
                           (self.work <= c * self.limit)
                           & (total - self.work <= (k - c) * self.limit))
                if c:
                    self._extend(best[c - 1, h], best[c, h], parent[c, h], in_band, False,
                                 deadline)
                if h:
                    keep = best[c, h].copy()
                    self._extend(best[c, 0], best[c, h], parent[c, h], in_band, True,
                                 deadline)
                    via[c, h] = best[c, h] < keep
        key = (k, hosts[-1])
        if not (np.isfinite(best[key][-1]) and best[key][-1] <= self.limit):
            return None
        pieces, i = [], n - 1
        while i:
            j = int(parent[key][i])
            on_host = bool(via[key][i])
            pieces.append((self._mask(i) & ~self._mask(j), on_host))
            key = (key[0], 0) if on_host else (key[0] - 1, key[1])
            i = j
        return pieces[::-1]

    def _extend(self, source: np.ndarray, dest: np.ndarray, parent: np.ndarray,
                allowed: np.ndarray, on_host: bool, deadline: float | None) -> None:
        """dest[I] = min(dest[I], source[I], max(source[I'], load(I - I'))) over I in
        `allowed`, I' <= I, the piece on an accelerator or (`on_host`) the host."""
        keep = allowed & (source < dest)
        dest[keep], parent[keep] = source[keep], np.flatnonzero(keep)
        for src in np.flatnonzero(source <= self.limit).tolist():
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError("the ideal DP ran past its deadline")
            self._relax(src, float(source[src]), dest, parent, allowed, on_host)

    def _relax(self, src: int, value: float, dest: np.ndarray, parent: np.ndarray,
               allowed: np.ndarray, on_host: bool) -> None:
        lo = np.searchsorted(self.sorted_work, self.work[src], side="left")
        hi = (len(self.work) if on_host else
              np.searchsorted(self.sorted_work, self.work[src] + self.limit, side="right"))
        cand = self.by_work[lo:hi]
        cand = cand[allowed[cand]]
        if not on_host:
            cand = cand[self.memory[cand] - self.memory[src] <= self.cap]
        low = self.bits[src]
        cand = cand[~(low & ~self.bits[cand]).any(axis=1)]
        if not len(cand):
            return
        if on_host:
            load = self.host[cand] - self.host[src]
        else:
            load = (self.work[cand] - self.work[src] + self.out_cost[cand]
                    + self.rev_boundary[cand] + self._transfers(src, cand))
        value = np.maximum(value, load)
        better = value < dest[cand]
        dest[cand[better]] = value[better]
        parent[cand[better]] = src

    def _transfers(self, src: int, cand: np.ndarray) -> np.ndarray:
        """The transfer terms of load(I - src) for I in `cand` beyond A(I) + RB(I)."""
        low, high, inside = self.bits[src], self.bits[cand], self.member[src]
        extra = np.zeros(len(cand))
        fwd = self.fwd
        # Forward senders of src leaving it: minus those still leaving I (they are in
        # A(I) but not in the piece), plus those feeding the piece (it receives).
        out = np.flatnonzero(inside[fwd.unit] & (fwd.targets & ~low).any(axis=1))
        if len(out):
            targets = fwd.targets[out][None, :, :]
            still_out = (targets & ~high[:, None, :]).any(axis=2)
            into_piece = (targets & high[:, None, :] & ~low).any(axis=2)
            extra += (into_piece.astype(float) - still_out) @ fwd.cost[out]
        rev = self.rev
        # Reverse senders outside src with a target in it: those inside I sit in the
        # piece and send to src; those outside I are in RB(I) but, with no target
        # in the piece, not received by it.
        edge = np.flatnonzero(~inside[rev.unit] & (rev.targets & low).any(axis=1))
        if len(edge):
            in_high = self.member[cand][:, rev.unit[edge]]
            hits_piece = (rev.targets[edge][None, :, :] & high[:, None, :] & ~low).any(axis=2)
            extra += in_high @ rev.cost[edge] - (~in_high & ~hits_piece) @ rev.cost[edge]
        mixed = self.mixed
        for unit, targets, cost in zip(mixed.unit, mixed.target_lists, mixed.cost):
            piece = self.member[cand][:, targets] & ~inside[targets]
            mine = self.member[cand, unit] & ~inside[unit]
            extra += cost * ((mine & ~piece.all(axis=1)) | (~mine & piece.any(axis=1)))
        return extra


@dataclass(frozen=True, eq=False)
class _SenderClass:
    unit: np.ndarray
    target_lists: tuple[list[int], ...]
    targets: np.ndarray
    """Per sender: its target blocks as a packed bit row."""
    cost: np.ndarray

    def __init__(self, senders: Senders, chosen: np.ndarray, words: int) -> None:
        picked = np.flatnonzero(chosen)
        object.__setattr__(self, "unit", senders.unit[picked])
        object.__setattr__(self, "target_lists",
                           tuple(list(senders.targets[i]) for i in picked))
        object.__setattr__(self, "targets", _IdealDP._pack(
            [sum(1 << t for t in senders.targets[i]) for i in picked], words))
        object.__setattr__(self, "cost", senders.cost[picked])


def _sender_kinds(senders: Senders, block_preds: list[int]) -> np.ndarray:
    """Per sender: 0 when every target is a descendant of its unit in the block DAG
    (it crosses forward, from an earlier piece to later ones), 1 when every target is
    an ancestor (a backward task's gradient, sent to earlier pieces), 2 otherwise."""
    ancestors = [0] * len(block_preds)
    for b, mask in enumerate(block_preds):
        for p in _bits(mask):
            ancestors[b] |= ancestors[p] | 1 << p
    kinds = np.full(len(senders.cost), 2, dtype=np.int64)
    for i, (unit, targets) in enumerate(zip(senders.unit.tolist(), senders.targets)):
        if all(ancestors[t] >> unit & 1 for t in targets):
            kinds[i] = 0
        elif all(ancestors[unit] >> t & 1 for t in targets):
            kinds[i] = 1
    return kinds
