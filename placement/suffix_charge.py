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

*Pockets*: a sender whose next member lies past the next segment Y is not charged
there, since the segment Z holding it may sit on X's device. On operator graphs a
one-unit Y (a batch norm's rsqrt) between two segments of a device's work each made
every tensor that goes around it free (the normalised activation, the block's skip
connection). But X and Z on one device would load it with both segments' work, so
where w(X) + w(Z) > L they sit on different devices and a sender with members in
both is cut. So after a one-unit segment Y = e+1 the step looks one segment further:

    F(s, e) = min( min_{e2 > e+1} F(e+1, e2) + C_e(s, e2),
                   min_{e3} P(e3) + C_e(s, e+1)
                            + [w(s..e) + w(e+2..e3) > L] (C_e(s, e3) - C_e(s, e+1)) ),

P(e3) = C_{e+1}(e+1, e3) + F(e+2, e3) the pocket's own step (where the pocket is the
last unit, its term is the first's form). Each sender is still charged at most once,
by its first member's segment, and only when cut. On decomposed ResNet-50's walked
units (senders over 0.005 W/4, L = 1.08-1.15 W/4) this doubled T_0, 0.028 to 0.057
W/4; a run of two one-unit pockets still escapes there. A pocket of POCKET_UNITS
units at most is read the same way (Y = e+1..e+size): on core-aten BERT-12 a
two-unit Y of 0.0005 W/4 between two segments of a device's work each made the
layer's output free at each cut, and T_0 at L = 1.041 W/4 reads 0.0265 W/4 with
one-unit pockets, 0.0451 with two-unit ones (decomposed BERT-12: 0.0248 -> 0.0366;
pockets of 3-6 units add nothing there nor on decomposed ResNet-50).

*Ties*: units that every placement within L keeps on one device (`tied_units`) never
lie in two adjacent segments, so no segment ends between two such units next to each
other (`joined`; on BERT-12 the loss head's units, tied to the embedding: 0.0456).
Hand-written: a bound of this model's own load function, which no library computes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

#: Relative slack on the segment work limit, so rounding never rejects a real plan.
SLACK = 1e-9
#: Segments of up to this many units are read as pockets.
POCKET_UNITS = 2


def suffix_charges(work: np.ndarray, members: Sequence[Sequence[int]],
                   cost: np.ndarray, bound: float,
                   joined: np.ndarray | None = None) -> np.ndarray:
    """T_j(bound) for j = 0..n (T_n = 0; inf where no reading fits: a unit heavier
    than `bound`). `members`: per sender its units, sorted; `cost`: per sender.
    `joined[e]`: units e and e+1 share a device in every placement within `bound`
    (`tied_units`), so no segment ends at e."""
    charges = first_segment_charges(work, members, cost, bound, joined)[0].min(axis=1)
    charges[len(work)] = 0.0
    return charges


def first_segment_charges(work: np.ndarray, members: Sequence[Sequence[int]],
                          cost: np.ndarray, bound: float,
                          joined: np.ndarray | None = None,
                          tied: np.ndarray | None = None,
                          tied_bounds: Sequence[float] = (),
                          deadline: float = math.inf) -> np.ndarray | None:
    """[r, j, x] = F(j, j + x) for j = 0..n-1 (row n: inf): the least charge of the
    readings of units j.. whose first segment is j..j+x (inf where none fits), with
    segments that hold a unit `tied` marks limited to `tied_bounds[r]` (each at most
    `bound`; one row, no such limit, where none is given). The others as in
    `suffix_charges`. None where `deadline` (a `time.perf_counter()` value) passes
    first: the work grows with the units times the square of the most a segment may
    hold (on the generated 120-layer transformer of `benchmarks.max_load`, 3,001
    units, a table took 44 s of a 10-s solve)."""
    n = len(work)
    prefix = np.concatenate([[0.0], np.cumsum(work)])
    limit = bound * (1 + SLACK)
    last = np.searchsorted(prefix, prefix[:-1] + limit, side="right") - 2
    fits = last >= np.arange(n)  # the unit alone fits
    marked = np.flatnonzero(tied) if tied is not None else np.array([], dtype=np.int64)
    next_tied = np.concatenate([marked, [n]])[np.searchsorted(marked, np.arange(n))]
    last_tied = np.stack([np.searchsorted(prefix, prefix[:-1] + b * (1 + SLACK),
                                          side="right") - 2
                          for b in (list(tied_bounds) or [bound])])
    rows = len(last_tied)
    width = int((np.maximum(last, np.arange(n)) - np.arange(n)).max(initial=0)) + 1
    spans = _spans(members, cost, n, width)
    best = np.full((rows, n + 1, width), math.inf)  # best[r, s, e - s] = F(s, e)
    # pocket[r, size, y, x]: P of the pocket y..y+size-1 and a segment after it of
    # x + 1 units.
    pocket = np.full((rows, POCKET_UNITS + 1, n + 1, width), math.inf)
    for e in range(n - 1, -1, -1):
        if time.perf_counter() > deadline:
            return None
        starts = np.arange(max(0, e - width + 1), e + 1)
        ok = fits[starts] & (last[starts] >= e) & (joined is None or not joined[e])
        ok = ok[None, :] & ((next_tied[starts] > e)[None, :] | (last_tied[:, starts] >= e))
        if e == n - 1:
            values = np.zeros((rows, len(starts)))
        else:
            ends = min(n - 1, e + width) - e  # next segments e+1..e+1+x, x < ends
            # Wide enough for a pocket of POCKET_UNITS and a segment of `width` after it.
            grid = _charge_grid(spans[e], starts[0], len(starts), e, ends + POCKET_UNITS)
            step = grid[None, :, :ends] + best[:, e + 1, None, :ends]
            for size in range(1, min(POCKET_UNITS, len(starts)) + 1):
                pocket[:, size, e - size + 1, :ends] = np.where(ok[:, -size, None],
                                                                step[:, -size], math.inf)
            values = step[:, :, POCKET_UNITS:].min(axis=2, initial=math.inf)
            for size in range(1, min(POCKET_UNITS, ends) + 1):
                values = np.minimum(values, step[:, :, size - 1] if e + size == n - 1 else
                                    _around_pocket(grid, pocket[:, size, e + 1], prefix,
                                                   starts, e, size, limit))
        best[:, starts, e - starts] = np.where(ok, values, math.inf)
    return best


def _charge_grid(span, s0: int, rows: int, e: int, cols: int) -> np.ndarray:
    """grid[r, x] = C_e(s0 + r, e + 1 + x): the senders (`_spans(...)[e]`) with first
    member at or after s0 + r whose next member after e lies in e+1..e+1+x."""
    first, after, c = span
    take = (first >= s0) & (after - (e + 1) < cols)
    grid = np.zeros((rows + 1, cols + 1))
    np.add.at(grid, (first[take] - s0, after[take] - (e + 1)), c[take])
    return np.cumsum(np.cumsum(grid[::-1], axis=0)[::-1], axis=1)[:rows, :cols]


def _around_pocket(grid: np.ndarray, pocket: np.ndarray, prefix: np.ndarray,
                   starts: np.ndarray, e: int, size: int, limit: float) -> np.ndarray:
    """Per row of `pocket` and segment start s: the least charge of s..e followed by
    the pocket e+1..e+size and a segment e+size+1..e3, charging what goes around the
    pocket where the two segments' work passes the limit."""
    z = np.arange(min(pocket.shape[1], grid.shape[1] - size, len(prefix) - 2 - e - size))
    into = grid[:, size - 1:size]
    around = grid[:, size + z] - into
    apart = ((prefix[e + 1] - prefix[starts])[:, None]
             + (prefix[e + size + 2 + z] - prefix[e + size + 1])[None, :]) > limit
    return ((into + np.where(apart, around, 0.0))[None] + pocket[:, None, z]).min(
        axis=2, initial=math.inf)


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
