"""The least transfer charge the units after a point of a sequence must still add.

Units 0..n-1 in a fixed order; a sender is a set of units (its *members*, sorted) with
a cost c: in a placement where its members sit on two or more devices, every device
holding one pays c (`simulate.device_loads`), so the loads sum to at least 2 c more.

Take any placement of max-load at most L and read units j..n-1 as *segments*, the
maximal runs of one device: each segment's work is at most L, and two adjacent
segments sit on different devices. Charge each sender whose first member is at or
after j once, when it leaves the segment X holding its first member: if the next
segment holds a member, the sender is cut (both segments' devices hold one). So the
senders lying wholly in j..n-1 add at least 2 T_j(L) to the loads, where T_j(L) is the
least such charge over every reading of j..n-1 into segments of work at most L:

    T_j = min_e F(j, e),  F(s, e) = min_{e2} F(e + 1, e2) + C_e(s, e2),  F(s, n-1) = 0,

with C_e(s, e2) the cost of the senders whose first member lies in s..e and whose
next member after e lies in e+1..e2. One backward pass gives every T_j. The sequence
DP uses it to drop a partial placement of units 0..j-1 whose loads, plus the work and
this charge still to come, pass k L: such a state has no completion within L.
Hand-written: a bound of this model's own load function, which no library computes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: Relative slack on the segment work limit, so rounding never rejects a real plan.
SLACK = 1e-9


def suffix_charges(work: np.ndarray, members: Sequence[Sequence[int]],
                   cost: np.ndarray, bound: float) -> np.ndarray:
    """T_j(bound) for j = 0..n (T_n = 0; inf where no reading fits: a unit heavier
    than `bound`). `members`: per sender its units, sorted; `cost`: per sender."""
    n = len(work)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    limit = bound * (1 + SLACK)
    last = np.searchsorted(prefix, prefix[:-1] + limit, side="right") - 2
    fits = last >= np.arange(n)  # the unit alone fits
    width = int((np.maximum(last, np.arange(n)) - np.arange(n)).max(initial=0)) + 1
    spans = _spans(members, cost, n, width)
    best = np.full((n + 1, width), math.inf)  # best[s, e - s] = F(s, e)
    charges = np.full(n + 1, math.inf)
    charges[n] = 0.0
    for e in range(n - 1, -1, -1):
        starts = np.arange(max(0, e - width + 1), e + 1)
        ok = fits[starts] & (last[starts] >= e)
        if e == n - 1:
            values = np.zeros(len(starts))
        else:
            ends = min(n - 1, e + width) - e  # next segments e+1..e+1+x, x < ends
            first, after, c = spans[e]
            take = (first >= starts[0]) & (after - (e + 1) < ends)
            grid = np.zeros((len(starts) + 1, ends + 1))
            np.add.at(grid, (first[take] - starts[0], after[take] - (e + 1)), c[take])
            # C_e(s, e2): first member at or after s, next member at or before e2
            grid = np.cumsum(np.cumsum(grid[::-1], axis=0)[::-1], axis=1)
            values = (grid[:len(starts), :ends] + best[e + 1, :ends][None, :]).min(axis=1)
        best[starts, e - starts] = np.where(ok, values, math.inf)
    charges[:n] = best[:n].min(axis=1)
    return charges


def _spans(members: Sequence[Sequence[int]], cost: np.ndarray, n: int,
           width: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per position e: (first member, next member after e, cost) of each sender with
    members at or before e and after it whose first member lies within `width` of e
    (a segment from farther back cannot reach e)."""
    rows: list[list[tuple[int, int, float]]] = [[] for _ in range(n)]
    for m, c in zip(members, np.asarray(cost, dtype=float).tolist()):
        first = int(m[0])
        for a, b in zip(m[:-1], m[1:]):
            for e in range(int(a), min(int(b), first + width)):
                rows[e].append((first, int(b), c))
    out = []
    for row in rows:
        arr = np.array(row, dtype=float).reshape(-1, 3)
        out.append((arr[:, 0].astype(np.int64), arr[:, 1].astype(np.int64), arr[:, 2]))
    return out
