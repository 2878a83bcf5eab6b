"""Units that every placement within a max-load L keeps on one device.

A sender (a set of units, its *members*, with a cost c) whose members sit on two or
more devices charges c to each of them, so the k loads then sum to at least the total
work W plus 2 c. A placement within L has loads summing to at most k L, so a sender
with 2 c > k L - W is never cut: its members share a device. Such senders join their
members into *tied components* (transitively: two tied senders with a common member
share one device). On BERT the decoder shares the word embedding's weight, so the
embedding at the head of the sequence and the whole loss head at its tail (joined by
the logits, 0.49 W/4 each) form one component: wherever the head goes, 0.76 W/4 of
work must follow at the end.

The sequence DP (`sequence_dp._Model._forced_fit`) uses the components: a device that
holds a placed unit of a component must still find room for the component's units not
yet placed, and its suffix charge (`suffix_charge.suffix_charges`) reads no segment
ending between two neighbouring units of one component.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from networkx.utils import UnionFind


@dataclass(frozen=True)
class TiedUnits:
    component: np.ndarray
    """Per sender: its tied component's id, or -1 when the sender may be cut."""
    units: tuple[np.ndarray, ...]
    """Per component: its units, ascending."""
    work_from: tuple[np.ndarray, ...]
    """Per component: work_from[c][q] = the work of units[c][q:] (one entry more)."""

    def later_work(self, component: int, position: int) -> float:
        """The work of the component's units after `position`."""
        units = self.units[component]
        return float(self.work_from[component][np.searchsorted(units, position,
                                                               side="right")])

    def starts_after(self, position: int) -> bool:
        """Whether some component has all its units after `position`."""
        return any(units[0] > position for units in self.units)

    def joined(self, n: int) -> np.ndarray:
        """Per unit e of n: whether units e and e+1 lie in one component (share a
        device), so that no run of a placement within the bound ends at e."""
        out = np.zeros(n, dtype=bool)
        for units in self.units:
            out[units[:-1][np.diff(units) == 1]] = True
        return out


def tied_units(work: np.ndarray, members: Sequence[Sequence[int]], cost: np.ndarray,
               num_devices: int, bound: float, total_work: float) -> TiedUnits:
    """The senders no placement of max-load at most `bound` cuts (2 c > k bound - W,
    with W = `total_work`, which may count work outside `work`) and the components
    they join the units of `work` into."""
    spare = num_devices * bound - total_work
    cost = np.asarray(cost, dtype=float)
    tied = np.flatnonzero(2 * cost > spare).tolist()
    sets = UnionFind()
    for j in tied:
        sets.union(*(int(x) for x in members[j]))
    units = sorted((sorted(group) for group in sets.to_sets()), key=lambda u: u[0])
    index = {x: c for c, group in enumerate(units) for x in group}
    component = np.full(len(members), -1, dtype=np.int64)
    for j in tied:
        component[j] = index[int(members[j][0])]
    unit_arrays = tuple(np.array(u, dtype=np.int64) for u in units)
    work_from = tuple(np.concatenate([np.cumsum(work[u][::-1])[::-1], [0.0]])
                      for u in unit_arrays)
    return TiedUnits(component=component, units=unit_arrays, work_from=work_from)
