"""A max-load lower bound from the runs of a placement along a sequence of all groups.

Take any order of the groups (the solver's joined sequence) and any placement with
max-load at most L. Its *segments* are the maximal runs of one device along the order,
so two adjacent segments sit on different devices. A sender (`merged_senders`: a unit
and its successor units, its *members*) is cut when its members sit on two or more
devices, and then every device holding a member pays its cost c (the unit's device
sends, each other one receives), so the k loads sum to the total work W plus at least
2 c per cut sender. Two facts show a sender cut from the segments alone:

(F1) it has members in two adjacent segments (they are on different devices);
(F2) it has members in two *big* segments, each of more than L / 2 work: no device
     holds two of them, since its load would pass L.

A placement is *read* along the order as segments, except that every run of small
segments between two big ones that spans at most GAP_POSITIONS positions is read as one
*gap* G (whose segments the bound does not look into): each placement has exactly one
reading. Each sender is charged once, by the segment X holding its first member p1,
when it leaves X: at the next segment if a member lies there (F1), or, when X is big
and a gap then the big segment C follow it, if a member lies at the first position
after X (F1) or in C (F2). A sender whose first member lies in a gap is charged when it
has members at the gap's last position and in C (F1). So with T(L) the least charge
over all readings of the order whose segments each cost at most L,

    k L >= W + 2 T(L),

else no placement reaches L. A segment's cost is a lower bound on its device's load:
its work, the senders with a member at the position just before it and one in it (F1),
and the senders it charges when it ends (members in it and in the next segment, F1;
or, before a gap, its own senders charged by F1 or F2), each once. T(L) is a dynamic
program over (segment start, segment end). Bisection between a known bound and an
incumbent's value keeps the largest L proven out; every L tested stands alone (the
big threshold moves with it), so any L that fails is a valid bound and a deadline
only stops the bisection early.

Why it matters: on operator graphs a cheap cut of the main path (a batch norm's
per-channel statistics, a bottleneck's narrow tensor) is cheap only while the wide
tensors that go around it (the skip connection, the activation a norm reads twice)
stay on one device; `path_bound` charges the cheap cut alone. Here a short pocket
between two big segments still pays for what goes around it (F2).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from placement.ideal_dp import merged_senders
from placement.tasks import TaskGraph

#: Longest run of small segments between two big ones (positions) read as one gap.
GAP_POSITIONS = 3
#: Relative slack on the feasibility checks, so rounding never rejects a real plan.
SLACK = 1e-9
#: Bisection steps at most (the bound is then within 2^-30 of the interval).
BISECTION_STEPS = 30


def segment_bound(tg: TaskGraph, num_devices: int, seq: Sequence[int], lower: float,
                  upper: float, deadline: float = math.inf,
                  gap_positions: int = GAP_POSITIONS) -> float:
    """A proven lower bound on the max-load of any placement onto `num_devices`, at
    least `lower`; `upper` is the value of some placement. `seq` orders all groups.
    Past `deadline` (a time.perf_counter() value) it returns what it has proven."""
    if num_devices <= 1 or not upper > lower:
        return lower
    model = _SegmentModel(tg, seq, upper, gap_positions)
    lo, hi = lower, upper
    if model.fails(lo, num_devices, deadline):
        for _ in range(BISECTION_STEPS):
            mid = 0.5 * (lo + hi)
            if model.fails(mid, num_devices, deadline):
                lo = mid
            else:
                hi = mid
            if time.perf_counter() > deadline:
                break
    return lo


@dataclass(frozen=True)
class _Span:
    """The senders with a member at or before position e and one after it."""

    cost: np.ndarray
    first: np.ndarray
    """First member's position."""
    last_before: np.ndarray
    """Last member at or before e."""
    next_after: np.ndarray
    """First member after e."""
    after_gap: np.ndarray
    """Per gap length g (row g - 1): e + 1 where that is a member, else the first
    member after e + g (n when none)."""
    left_row: np.ndarray
    left_col: np.ndarray
    left_cost: np.ndarray
    """The (segment start, next member after e, cost) of each sender that `left`
    counts for a segment s..e: a member at s - 1 and one in s..e."""


class _SegmentModel:
    def __init__(self, tg: TaskGraph, seq: Sequence[int], upper: float,
                 gap_positions: int) -> None:
        n = len(seq)
        self.gaps = gap_positions
        self.long = gap_positions + 1
        assert n == tg.num_groups, "the order must hold every group once"
        pos = np.empty(n, dtype=np.int64)
        pos[np.asarray(seq, dtype=np.int64)] = np.arange(n)
        senders = merged_senders(tg, np.arange(tg.num_groups))
        self.members = [np.unique(pos[[u, *t]]) for u, t in
                        zip(senders.unit.tolist(), senders.targets)]
        self.cost = senders.cost
        self.n = n
        self.total = float(tg.duration_s.sum())
        self.prefix = np.concatenate([[0.0], np.cumsum(tg.group_work_s[np.asarray(seq)])])
        self.width = int(self._ends(upper)[0].max(initial=0)) + 2
        self.left = self._left()
        self.spans = [self._span(e, ids) for e, ids in enumerate(self._spanning())]

    def _ends(self, bound: float) -> tuple[np.ndarray, np.ndarray]:
        """Per start: the length in positions and the last end of the longest segment
        whose work fits `bound`."""
        lim = bound * (1 + SLACK)
        last = np.searchsorted(self.prefix, self.prefix[:-1] + lim, side="right") - 2
        last = np.maximum(last, np.arange(self.n) - 1)
        return last - np.arange(self.n) + 1, last

    def _left(self) -> np.ndarray:
        """left[s, j]: cost of the senders with a member at s - 1 and one in s..s+j."""
        left = np.zeros((self.n, self.width))
        for m, c in zip(self.members, self.cost.tolist()):
            for a, b in zip(m[:-1].tolist(), m[1:].tolist()):
                if b - a - 1 < self.width:
                    left[a + 1, b - a - 1] += c
        return np.cumsum(left, axis=1)

    def _spanning(self) -> list[list[int]]:
        """Per position e: the senders with members at or before e and after it whose
        first member lies within a segment's length of e (no others can matter)."""
        by_e: list[list[int]] = [[] for _ in range(self.n)]
        for i, m in enumerate(self.members):
            for e in range(int(m[0]), min(int(m[-1]), int(m[0]) + self.width)):
                by_e[e].append(i)
        return by_e

    def _span(self, e: int, ids: list[int]) -> _Span:
        after_gap = np.full((self.gaps, len(ids)), self.n, dtype=np.int64)
        first, before, after = (np.zeros(len(ids), dtype=np.int64) for _ in range(3))
        rows, cols, costs = [], [], []
        gaps = e + np.arange(1, self.gaps + 1)
        for j, i in enumerate(ids):
            m = self.members[i]
            k = int(np.searchsorted(m, e, side="right"))
            first[j], before[j], after[j] = m[0], m[k - 1], m[k]
            later = np.searchsorted(m, gaps, side="right")
            inside = later < len(m)
            after_gap[inside, j] = m[later[inside]]
            if after[j] == e + 1:
                after_gap[:, j] = e + 1
            starts = m[:k - 1] + 1  # a member at start - 1, and one (m[k-1]) after it
            rows.append(starts)
            cols.append(np.full(len(starts), after[j]))
            costs.append(np.full(len(starts), self.cost[i]))
        flat = (np.concatenate(x) if x else np.zeros(0) for x in (rows, cols, costs))
        left_row, left_col, left_cost = flat
        return _Span(cost=self.cost[ids], first=first, last_before=before, next_after=after,
                     after_gap=after_gap, left_row=left_row.astype(np.int64),
                     left_col=left_col.astype(np.int64), left_cost=left_cost)

    def fails(self, bound: float, num_devices: int, deadline: float) -> bool:
        """Whether no placement has max-load at most `bound`, k bound < W + 2 T, as far
        as the time until `deadline` shows (False when it ran out)."""
        charge = self.least_charge(bound, deadline)
        return charge is not None and num_devices * bound * (1 + SLACK) < self.total + 2 * charge

    def least_charge(self, bound: float, deadline: float = math.inf) -> float | None:
        """T(bound): inf when no reading of the order fits, None past `deadline`."""
        n, prefix = self.n, self.prefix
        lim = bound * (1 + SLACK)
        _, last = self._ends(bound)
        first_start = np.searchsorted(prefix, prefix[1:] - lim, side="left")
        # best[state, s, e]: least charge of a reading of 0..e whose last segment is
        # s..e (its own leaving charge not yet paid) in that state: 0 big; r in
        # 1..gaps small, ending a run of r positions after a big one (a gap, should a
        # big one follow); long, small in a longer run or one with no big before it.
        best = np.full((self.long + 1, n, n), math.inf)
        fit0 = np.flatnonzero(prefix[1:] <= lim)
        big0 = prefix[fit0 + 1] > 0.5 * bound
        best[0, 0, fit0[big0]] = 0.0
        best[self.long, 0, fit0[~big0]] = 0.0
        for e in range(n - 1):
            if time.perf_counter() > deadline:
                return None
            s0 = int(first_start[e])
            charge = best[:, s0:e + 1, e]
            if not np.isfinite(charge).any():
                continue
            starts = np.arange(s0, e + 1)
            work = prefix[e + 1] - prefix[starts]
            own = work + self.left[starts, e - starts]
            self._next_segment(best, e, s0, charge, own, bound, int(last[e + 1]), lim)
            if np.isfinite(charge[0]).any():
                self._after_gap(best, e, s0, charge[0], own, last, bound, lim)
        s0 = int(first_start[n - 1])
        starts = np.arange(s0, n)
        own = prefix[n] - prefix[starts] + self.left[starts, n - 1 - starts]
        fits = own <= lim
        return float(best[:, starts[fits], n - 1].min()) if fits.any() else math.inf

    def _next_segment(self, best, e, s0, charge, own, bound, e2_last, lim) -> None:
        """Segment s..e followed at once by e+1..e2: it charges its senders with a
        member in the next segment (F1); its cost adds every sender with a member in
        it and in the next one that `left` did not count."""
        ns, ne = e - s0 + 1, e2_last - e
        if ne <= 0:
            return
        span = self.spans[e]
        cols = span.next_after - (e + 1)
        inside = span.next_after <= e2_last
        charged = np.zeros((ns + 1, ne + 1))
        mine = inside & (span.first >= s0)
        np.add.at(charged, (span.first[mine] - s0, cols[mine]), span.cost[mine])
        seen = np.zeros((ns + 1, ne + 1))
        held = inside & (span.last_before >= s0)
        np.add.at(seen, (span.last_before[held] - s0, cols[held]), span.cost[held])
        counted = np.zeros((ns + 1, ne + 1))
        dup = (span.left_row >= s0) & (span.left_col <= e2_last)
        np.add.at(counted, (span.left_row[dup] - s0, span.left_col[dup] - (e + 1)),
                  span.left_cost[dup])
        charged = _suffix_prefix(charged)[:ns, :ne]
        extra = (_suffix_prefix(seen) - np.cumsum(counted, axis=1))[:ns, :ne]
        paid = np.where(own[:, None] + extra <= lim, charged, math.inf)
        # The least charge into each next segment, per reading state of s..e.
        into = np.full((self.long + 1, ne), math.inf)
        for state in range(self.long + 1):
            rows = np.flatnonzero(np.isfinite(charge[state]))
            if len(rows):
                into[state] = (charge[state, rows, None] + paid[rows]).min(axis=0)
        length = np.arange(1, ne + 1)
        nxt = best[:, e + 1, e + 1:e2_last + 1]
        big = self.prefix[e + 1 + length] - self.prefix[e + 1] > 0.5 * bound
        # A big segment may follow a big one or a long run, never a short run (a gap).
        np.minimum(nxt[0], np.where(big, np.minimum(into[0], into[self.long]), math.inf),
                   out=nxt[0])
        for state in range(self.long + 1):
            grown = np.minimum(state + length, self.long)
            for to in np.unique(grown).tolist():
                cells = ~big & (grown == to)
                np.minimum(nxt[to], np.where(cells, into[state], math.inf), out=nxt[to])

    def _after_gap(self, best, e, s0, charge, own, last, bound, lim) -> None:
        """Big segment s..e, a gap e+1..e+g, then big segment e+g+1..e2: it charges
        its senders with a member at e+1 (F1) or in the next big segment (F2); the
        gap's own senders with members at e+g and in that segment pay too (F1)."""
        n, prefix = self.n, self.prefix
        span = self.spans[e]
        rows = np.flatnonzero(np.isfinite(charge))
        for g in range(1, self.gaps + 1):
            start = e + g + 1
            if start >= n:
                return
            ends = np.arange(start, int(last[start]) + 1)
            ends = ends[prefix[ends + 1] - prefix[start] > 0.5 * bound]
            if not len(ends):
                continue
            e2_last = int(ends[-1])
            width = e2_last - start + 1
            # A member at e + 1 (F1) counts for every next big segment.
            found = np.maximum(span.after_gap[g - 1], start)
            mine = (found <= e2_last) & (span.first >= s0)
            charged = np.zeros((len(own) + 1, width + 1))
            np.add.at(charged, (span.first[mine] - s0, found[mine] - start),
                      span.cost[mine])
            charged = _suffix_prefix(charged)[rows, :width]
            fits = own[rows, None] + charged <= lim
            values = np.where(fits, charge[rows, None] + charged, math.inf).min(axis=0)
            values = values + self._gap_senders(e, start, e2_last)
            cols = ends - start
            best[0, start, ends] = np.minimum(best[0, start, ends], values[cols])

    def _gap_senders(self, e: int, start: int, e2_last: int) -> np.ndarray:
        """Per end of the big segment after the gap e+1..start-1: cost of the senders
        whose first member lies in the gap, with members at its last position and in
        the segment."""
        span = self.spans[start - 1]
        take = ((span.first >= e + 1) & (span.last_before == start - 1)
                & (span.next_after <= e2_last))
        out = np.zeros(e2_last - start + 2)
        np.add.at(out, span.next_after[take] - start, span.cost[take])
        return np.cumsum(out)[:-1]


def _suffix_prefix(grid: np.ndarray) -> np.ndarray:
    """Sums over rows at or after each row and columns at or before each column."""
    return np.cumsum(np.cumsum(grid[::-1], axis=0)[::-1], axis=1)
