"""Which order of the groups the max-load stages walk: the joined sequence of one of two
topological orders of the tasks.

The sequence DP, the segment bound, the window search and the contiguous splits all
walk one order of the groups, and all of them do better the shorter the senders'
spans along it (a sender open across many positions multiplies the DP's states and
charges every interval split between its ends). `TaskGraph.topological_order` pops
the last task made ready first (a depth-first order); on an encoder-decoder such as
T5 it starts with the decoder's first self-attention, which waits on no encoder op,
and puts every decoder layer's cross-attention projections right after the encoder,
so their senders span the whole decoder. The order the program ran its ops (a
profiled graph's op ids) keeps each layer together there. Neither order wins
everywhere (the depth-first one is shorter on BERT and GNMT), so the stages take the
one whose senders span less.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from placement.ideal_dp import joined_sequence, merged_senders
from placement.tasks import TaskGraph


def program_order(tg: TaskGraph) -> tuple[int, ...]:
    """A topological order of the tasks that takes the ready task of least id first:
    on a profiled graph, whose op ids number the ops as the program ran them, that
    order itself."""
    indegree = tg.in_degree.tolist()
    ready = [t for t in range(tg.num_tasks) if indegree[t] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        t = heapq.heappop(ready)
        order.append(t)
        for d, _ in tg.successors[t]:
            indegree[d] -= 1
            if indegree[d] == 0:
                heapq.heappush(ready, d)
    assert len(order) == tg.num_tasks, "task graphs are acyclic by construction"
    return tuple(order)


def sender_span(tg: TaskGraph, root: np.ndarray, seq: Sequence[int]) -> int:
    """The sum over the senders between joined groups (`root`, as `join_roots` gives)
    of the positions from their first to their last member along `seq`."""
    pos = np.empty(tg.num_groups, dtype=np.int64)
    pos[list(seq)] = np.arange(len(seq))
    senders = merged_senders(tg, root)
    total = 0
    for unit, targets in zip(senders.unit.tolist(), senders.targets):
        at = pos[[unit, *targets]]
        total += int(at.max() - at.min())
    return total


def joined_sequences(tg: TaskGraph, root: np.ndarray) -> list[list[int]]:
    """The joined sequences (`ideal_dp.joined_sequence`) of the depth-first and the
    program order, the one of least `sender_span` first (the depth-first on a tie)."""
    sequences = [joined_sequence(tg, root), joined_sequence(tg, root, program_order(tg))]
    return sorted(sequences, key=lambda seq: sender_span(tg, root, seq))
