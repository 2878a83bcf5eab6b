"""Exact max-load by a dynamic program along a sequence of units (the joined sequence).

Place the units one by one in sequence order. What the rest of the placement can
still cost depends only on the devices' loads so far and, per *open* sender (one with
members, its unit and its successor units, both placed and not yet placed), the set
of devices its placed members sit on: a sender whose members end on two or more
devices charges its cost c to each of them (`simulate.device_loads`), so a new member
on a device outside the set charges c there, and also on the set's one device when
the set had one. On operator graphs senders are short-lived along the sequence (a
skip connection spans a block), so few are open at once, and the states are few.

Is there a placement with max-load at most L? Drop a state when a load passes L or
when the loads and the work still to place pass k L; keep, per sender sets, only the
load vectors no other one dominates (each load at most, one less: its completions
cost no more); devices are interchangeable, so each state is relabelled to a
canonical numbering first. No state left at the end proves L out; a state left is a
placement with max-load at most L (traced back). Bisection on L between a proven
bound and the incumbent gives the optimum, or, past a deadline or a cap on the states
a layer may hold, the largest L proven out and the best placement found.

Memory caps are not modelled, so the bound holds with or without them and a plan found
is the caller's to check. Hand-written: the state (open senders' device sets) is this
model's own, which no solver or library offers.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from placement.ideal_dp import merged_senders
from placement.pooled_work import Pool, anchored_pools, releases
from placement.suffix_charge import first_segment_charges
from placement.tasks import TaskGraph
from placement.tied_units import TiedUnits, tied_units

#: States one layer may hold; past it the layer keeps the least loaded (a beam), so
#: the test at that L can still find a plan but proves nothing.
MAX_STATES = 50_000
#: Before bisecting, one test just under the incumbent (this share below it) looks for a
#: better plan with a narrower beam (`MAX_STATES` / `TOP_BEAM_DIVISOR` states a layer):
#: near the incumbent almost every state survives, so the test is a beam search, and a
#: plan it finds lowers the top of the bisection.
TOP_PROBE_SHARE = 0.005
TOP_BEAM_DIVISOR = 10
#: Dominance is tested in rounds against this many states of the least total load with
#: the same sender sets not yet probed, at most DOMINANCE_ROUNDS rounds a layer (keeping
#: a dominated state only costs time). One round of 24 probes left a layer of decomposed
#: ResNet-50 with 27,520 states where 1,208 are undominated. The rounds after the first
#: few drop little: on the 12-layer Llama's line test (1.0413 W/4, cells of 0.03 W/4)
#: the first dropped 196,551 of 6.7 million states over the walk, the 16th 7,136, and
#: the test took 31.6-34.9 s with 1-5 rounds against 46.2 with 16 (one run each).
DOMINANCE_PROBES = 24
DOMINANCE_ROUNDS = 3
#: States compared at once in the dominance test (bounds its memory).
CHUNK = 20_000
#: The relaxation's test at the gap line may hold MAX_STATES states a layer for each
#: LINE_STATES_SECONDS it may run (so none more within a minute's budget), up to
#: MAX_LINE_CHILDREN / devices: its proof ends the search, and with the cap fixed
#: more time bought nothing. On the 12-layer Llama (`benchmarks.op_graphs`) that
#: test, at 1.0413 W/4 with cells of 0.02 W/4, needs 262,098 states (153 s; at its
#: peak layer, whose parents times four devices make 1,048,392 children before any
#: release's copies, the process reached 1.2 GB: about what the cap allows); at the
#: fixed cap the planner proved 1.0361 W/4 in 600 s (gap 2.38%), with this one 1.0412
#: (1.90%); in 300 s the cap, 196,000, still stops it.
LINE_STATES_SECONDS = 60.0
MAX_LINE_CHILDREN = 1_200_000
#: Where the line test's cells let a relaxed placement through, it runs again with
#: cells this much narrower, at most LINE_CELL_TRIES runs in all. On the 12-layer Llama
#: (`benchmarks.op_graphs`, gradients summed per device) the line at 1.0340 W/4 let one
#: through with cells of 0.03 W/4 in 11.7 s and proved with 0.02 in 16.8 s (alone).
LINE_CELL_NARROWING = 2 / 3
LINE_CELL_TRIES = 3
#: Relative slack on the feasibility checks, so rounding never rejects a real plan.
SLACK = 1e-9
#: Devices the state's bit sets can hold.
MAX_DEVICES = 8
#: A test stops as soon as both the mean time of its last this many layers and its
#: mean time per layer so far, times the layers left, pass its deadline: a test that
#: cannot finish proves nothing, and the time it would burn is the MILP's (on graphs of
#: a thousand units with many open senders one test at the state cap takes minutes).
#: The recent pace alone stopped tests in a passing burst of states: on bert12
#: (core-aten) a test at 1.0295 W/4 that finishes in 9.6 s was stopped with 25 s left.
PACE_LAYERS = 8
#: `relaxed_bound` stops bisecting when its interval is this share of its top; its
#: first step up from the bound it starts from, as a share of that bound.
BOUND_RESOLUTION = 1e-4
RELAXED_FIRST_STEP = 0.005
#: ... and the most of what is left between its bound and its top that one step
#: takes: a test above what the relaxation can prove walks every layer (8.6 s on
#: decomposed ResNet-50 at 1.137 W/4 under load 4), one below it stops early (1-2 s).
RELAXED_REACH = 0.25
#: A segment of the suffix charge that holds units of a tied component lies on the
#: component's device, so its work is at most that device's room: the charges are
#: tabled for these shares of L as that limit, each state read at the least share
#: above the room. On decomposed bert12 (the tail of the loss head tied to the
#: embedding) the shares 1.0, 0.9, 0.8, 0.7 and the read-ahead proved 1.041 W/4 in
#: 29 s, 1.0, 0.85, 0.7 in 74 s and 1.0, 0.95, ..., 0.7 in 39 s (load 5-8).
TIED_ROOM_SHARES = np.array([1.0, 0.9, 0.8, 0.7])
#: The tables cost more than a test far below what the DP can prove (on decomposed
#: bert12 four rows 6-8 s, a test at 1.0057 W/4 0.1 s), so they are made once where
#: a test finds none at or above its bound, CHARGE_AHEAD above it, and a test reuses
#: the least of them at or above its own bound (they hold there, a little weaker).
#: The relaxation makes its first at CHARGE_GAP under the incumbent, where a proof
#: meets the 2% gap the max-load planner aims to prove: on decomposed bert12 the
#: tests below it then take 0-1.5 s.
CHARGE_AHEAD = 0.004
CHARGE_GAP = 0.02
#: The walk starts at the end nearer the heaviest unit where that unit's tied block
#: holds at least this share of total work / devices (`heavy_end_first`): a lighter one
#: leaves every device's load about as free as before, and the walk is kept (decomposed
#: ResNet-50's heaviest unit, 0.047 W/4 near its end, keeps its recorded 1.80%).
HEAVY_UNIT_SHARE = 0.25


@dataclass(frozen=True, eq=False)
class SequenceDP:
    lower_bound: float
    """A proven bound on the max-load of every placement (memory aside)."""
    unit_device: np.ndarray | None
    """The best placement found, per unit its device; None when no test at an L at
    most `upper` found one."""
    value: float
    """That placement's max-load (inf when none)."""


def sequence_dp(tg: TaskGraph, units: Sequence[Sequence[int]], num_devices: int,
                lower: float, upper: float, gap: float, deadline: float = math.inf,
                max_states: int = MAX_STATES) -> SequenceDP:
    """The optimum within relative `gap` where the tests finish: bisection on L in
    [lower, upper] (`lower` a proven bound, `upper` the value of some placement);
    `units` partition the groups, in the order the program walks them."""
    none = SequenceDP(lower_bound=lower, unit_device=None, value=math.inf)
    if num_devices <= 1 or num_devices > MAX_DEVICES or not upper > lower:
        return none
    model = _Model(tg, units, num_devices, shares=TIED_ROOM_SHARES[:1])
    lo, hi, best, value = lower, upper, None, math.inf
    top = upper * (1 - TOP_PROBE_SHARE)
    if top > lower:
        found, proven, finished = model.placement_within(
            top, deadline, max(1, max_states // TOP_BEAM_DIVISOR))
        if not finished:
            return none
        if found is not None and model.max_load(found) < hi:
            best, value = found, model.max_load(found)
            hi = value
        elif found is None and proven:
            lo = top
    ceiling = hi  # tests above it gave up: no proof, no plan
    while min(hi, ceiling) - lo > gap * hi and time.perf_counter() < deadline:
        probe = 0.5 * (lo + min(hi, ceiling))
        found, proven, finished = model.placement_within(probe, deadline, max_states)
        if not finished:
            break
        if found is not None:
            if model.max_load(found) >= hi:
                break  # within the feasibility slack of the best: nothing left to split
            best, value = found, model.max_load(found)
            hi = value
        elif proven:
            lo = probe
        elif lo > lower:
            ceiling = probe
        else:
            break  # the first test already passed the cap: lower ones would too, mostly
    return SequenceDP(lower_bound=lo, unit_device=best, value=value)


def relaxed_bound(tg: TaskGraph, units: Sequence[Sequence[int]], num_devices: int,
                  lower: float, upper: float, light: float, deadline: float = math.inf,
                  max_states: int = MAX_STATES, merge: float = 0.0,
                  max_merge: float = 0.0, line_deadline: float | None = None,
                  line_merge: float = 0.0, line: bool = True,
                  settled: Callable[[], bool] = lambda: False) -> float:
    """A proven max-load bound (at least `lower`) from the DP on a relaxation with
    fewer states: senders of cost at most `light` dropped (every load can only fall),
    and the units then left with no sender, such as a decomposed batch norm's
    per-channel ops, taken out of the walk: homed on a walked neighbour's device unless
    released, for what their senders must charge, into fluid work any device may take
    any part of (`pooled_work`; the last layer's loads plus the fluid must fit k L).
    Every L at which no state
    survives is out for the relaxation, so for every placement. The tests climb from
    `lower` in steps that double while they prove (the first RELAXED_FIRST_STEP of it)
    and shrink fourfold when one does not (never past RELAXED_REACH of what is left): a
    test that passes the state cap, runs past its pace, or finds a relaxed placement
    (no plan of the real problem) lowers the top, and a test stops at the cap, since
    it can then prove nothing. A test costs more the closer it lies to what the DP
    can prove: bisecting from the middle at once spent a whole budget on one test far
    above it (decomposed bert12 under load 3.8), and bisecting after the first failed
    test spent 13 of 23 s on one test that failed its pace there. On decomposed
    ResNet-50 the exact DP passes the state cap in the batch norms' pockets; the
    relaxation walks a third of the units.
    `merge` > 0 relaxes each layer further (`_merge_close`, cells of that width); a
    test that passes the state cap or its pace is run again, and the tests after it,
    with cells of `max_merge` (wider cells prove a little less but keep far fewer
    states: on decomposed ResNet-50 a test at 1.12 W/4 passes the cap with cells of
    0.005 W/4 and proves in 1 s with 0.02; doubling the cells instead spent 2 s more
    on tests at 0.01 that failed too).
    The first test lies a hair inside CHARGE_GAP under `upper` (`line_target`), with
    cells of the widest of `merge`, `max_merge` and `line_merge`, and may run until
    `line_deadline` (`deadline` where None), its cap growing with that time
    (LINE_STATES_SECONDS): a proof there meets that gap whatever the climb would
    reach, and ends the climb.
    On decomposed bert12 the climb spent its time on the tests below it (at 1.0362
    W/4 6 s with cells of 0.005 W/4, failing its pace, then 7 s with 0.02) and the
    test at the line, which proves in 15-25 s, never ran; on decomposed ResNet-50 the
    line lies above what the relaxation can prove, and the test there finds a relaxed
    placement in 3-6 s. A test that fails there leaves the climb as it was: with its
    top at the line, the climb on T5 (`aten`) proved 0.0970 instead of 0.0973 (one
    run each). `line` False leaves that test to the caller (`line_test` in a process
    of its own, `placement.line_process`), and the climb stops between tests once
    `settled()` says the caller has its bound."""
    if num_devices <= 1 or num_devices > MAX_DEVICES or not upper > lower:
        return lower
    model = _Model(tg, units, num_devices, light)
    target = line_target(lower, upper)
    # The climb's tests lie under the line and reuse these tables.
    model._first_segment_charges(target, deadline)
    lo, hi, step = lower, upper, RELAXED_FIRST_STEP * lower
    if line and target > lower:
        line_deadline = deadline if line_deadline is None else line_deadline
        allowance = max(0.0, line_deadline - time.perf_counter()) / LINE_STATES_SECONDS
        line_states = max(max_states, int(min(MAX_LINE_CHILDREN // num_devices,
                                              max_states * allowance)))
        if model.proves(target, line_deadline, line_states,
                        max(merge, max_merge, line_merge)):
            # A test above the line needs tables of its own (5 s on decomposed bert12)
            # for a bound the gap does not need; the time is the plan search's.
            return target
    while (hi - lo > BOUND_RESOLUTION * hi and time.perf_counter() < deadline
           and not settled()):
        probe = min(lo + max(step, BOUND_RESOLUTION * hi), lo + RELAXED_REACH * (hi - lo))
        found, proven, finished = model.placement_within(probe, deadline, max_states,
                                                         proof_only=True, merge=merge)
        if found is None and proven and finished:
            lo, step = probe, 2 * step
        elif found is None and 0 < merge < max_merge:
            merge = max_merge  # past the state cap or its pace: the same test, wider cells
        else:
            hi, step = probe, step / 4  # no proof at or above this L
    return lo


def line_target(lower: float, upper: float) -> float:
    """The relaxation's first test: a hair inside CHARGE_GAP under `upper`, so that the
    gap it proves is under that share after rounding too (at the line itself bert12's
    read 2.0000000000000014%), and never under `lower`."""
    return max(lower, (1 - CHARGE_GAP * (1 - BOUND_RESOLUTION)) * upper)


def line_test(tg: TaskGraph, units: Sequence[Sequence[int]], num_devices: int,
              light: float, bound: float, deadline: float, max_states: int,
              merge: float) -> bool:
    """Whether `relaxed_bound`'s relaxation (senders of at most `light` dropped, cells
    of `merge`, narrowed where they let a relaxed placement through: LINE_CELL_TRIES)
    proves every placement's max-load above `bound` by `deadline`, with at
    most `max_states` states a layer: its test at the line, standing alone on a core
    of its own, so with no pace check (its time has no other use; on the 12-layer
    Llama the states peak in the walk's first third, and the pace read there stopped
    a test that would have proved)."""
    if num_devices <= 1 or num_devices > MAX_DEVICES:
        return False
    model = _Model(tg, units, num_devices, light)
    for _ in range(LINE_CELL_TRIES):
        found, proven, finished = model.placement_within(
            bound, deadline, max_states, proof_only=True, merge=merge, pace=False)
        if found is None:
            return proven and finished
        if merge <= 0:
            return False
        # A relaxed placement within the bound: merged states may have stood for loads
        # that fail it, so narrower cells may still prove (the tables are kept). A test
        # that passed the state cap or its deadline would only do worse.
        merge *= LINE_CELL_NARROWING
    return False


def heavy_end_first(tg: TaskGraph, units: Sequence[Sequence[int]], num_devices: int,
                    bound: float) -> list[Sequence[int]]:
    """`units`, reversed where the units that must share a device with the heaviest
    (`tied_units` at `bound`) hold at least HEAVY_UNIT_SHARE of a device's share of
    the work and start later walking forward than walking back. The DP is exact in
    either direction; met early, such a block fixes one device's load near full, and
    the loads that follow vary over the other devices only, while met last it leaves
    every device's load free until the end. On a 12-layer Llama (`benchmarks.op_graphs`,
    its untied LM head and loss 0.79 W/4, last in the sequence) the relaxation's test
    at 1.0402 W/4 passes the state cap at the 96th of 997 units walking forward and
    proves walking back (at most 190,000 states, 109 s); in 60 s the relaxation proves
    1.0266 W/4 forward and 1.0353 back. On BERT the head is tied to the embedding,
    first in the sequence, so the walk stays forward (walking back, decomposed
    bert12's line test failed: gap 2.00% -> 2.94%)."""
    work, cost_of = _unit_senders(tg, units)
    if not len(work):
        return list(units)
    total = float(work.sum())
    heaviest = int(np.argmax(work))
    tied = tied_units(work, list(cost_of), np.array(list(cost_of.values())), num_devices,
                      bound, total)
    block = next((u for u in tied.units if heaviest in u), np.array([heaviest]))
    ahead, behind = float(work[:block[0]].sum()), float(work[block[-1] + 1:].sum())
    if work[block].sum() < HEAVY_UNIT_SHARE * total / num_devices or behind >= ahead:
        return list(units)
    return list(units)[::-1]


def _unit_senders(tg: TaskGraph, units: Sequence[Sequence[int]]
                  ) -> tuple[np.ndarray, dict[tuple[int, ...], float]]:
    """Per unit its work, and per sender (its members, sorted) its cost."""
    unit_of_group = np.empty(tg.num_groups, dtype=np.int64)
    for i, groups in enumerate(units):
        unit_of_group[list(groups)] = i
    senders = merged_senders(tg, unit_of_group)
    work = np.bincount(unit_of_group[tg.group], weights=tg.duration_s, minlength=len(units))
    # A sender's charge depends only on its members' devices, so senders with the
    # same members (a tensor and its gradient) are one, with the summed cost.
    cost_of: dict[tuple[int, ...], float] = {}
    for u, t, c in zip(senders.unit.tolist(), senders.targets, senders.cost.tolist()):
        members = tuple(sorted({int(u), *t}))
        cost_of[members] = cost_of.get(members, 0.0) + c
    return work, cost_of


class _Model:
    def __init__(self, tg: TaskGraph, units: Sequence[Sequence[int]], k: int,
                 light: float = 0.0, shares: np.ndarray = TIED_ROOM_SHARES) -> None:
        """`light` > 0 builds the relaxation of `relaxed_bound`: senders of at most
        that cost dropped, and the units left with no sender pooled as fluid work.
        `shares`: the TIED_ROOM_SHARES its tables take (the exact DP takes one: on
        decomposed bert12 it cannot finish a test, and the four cost 8 s of the 10 s
        its one test got)."""
        self.shares = shares
        work, cost_of = _unit_senders(tg, units)
        kept = {m: c for m, c in cost_of.items() if c > light} if light > 0 else cost_of
        walked = np.arange(len(units))
        if light > 0:
            walked = np.unique([x for m in kept for x in m]).astype(np.int64)
        position = np.full(len(units), -1)
        position[walked] = np.arange(len(walked))
        self.k, self.n = k, len(walked)
        self.work = work[walked]
        self.members = [position[list(m)].tolist() for m in kept]
        costs = list(kept.values())
        is_walked = np.zeros(len(units), dtype=bool)
        is_walked[walked] = True
        dropped = [m for m in cost_of if m not in kept]
        pools, self.fluid = anchored_pools(work, dropped, [cost_of[m] for m in dropped],
                                           is_walked)
        """Work of the pooled units with no anchor, placed as a fluid."""
        self.home = np.zeros(self.n)
        """Per walked unit: the pooled work homed on it (`pooled_work`), on its device
        unless released."""
        homed: dict[int, list[tuple[int | None, Pool]]] = {}
        for pool in pools:
            # Homed on its last anchor, where a sender of no cost over its anchors
            # tells whether they all share the home's device.
            at = position[list(pool.anchors)].tolist()
            together = None
            if len(at) > 1:
                together = len(self.members)
                self.members.append(at)
                costs.append(0.0)
            homed.setdefault(at[-1], []).append((together, pool))
            self.home[at[-1]] += pool.work
        self.releases = {i: ([j for j, _ in mine], _release_table(mine))
                         for i, mine in homed.items()}
        """Per home: its pools' zero-cost senders (None: one anchor) and per pattern
        of which pools' anchors share the home's device, its releases."""
        self.cost = np.array(costs, dtype=float)
        self.at: list[list[int]] = [[] for _ in range(self.n)]
        for j, m in enumerate(self.members):
            for x in m:
                self.at[x].append(j)
        walk = self.work + self.home
        self.rest = np.concatenate([np.cumsum(walk[::-1])[::-1], [0.0]]) + self.fluid
        self._charges: dict[float, np.ndarray] = {}
        """Per bound B: `first_segment_charges` at B (`_first_segment_charges`)."""

    def max_load(self, unit_device: np.ndarray) -> float:
        loads = np.bincount(unit_device, weights=self.work + self.home, minlength=self.k)
        for m, c in zip(self.members, self.cost.tolist()):
            held = np.unique(unit_device[m])
            if len(held) > 1:
                loads[held] += c
        return float(loads.max())

    def proves(self, bound: float, deadline: float, max_states: int,
               merge: float, pace: bool = True) -> bool:
        """Whether the test at `bound` (`placement_within`, proof only) proves it out."""
        found, proven, finished = self.placement_within(bound, deadline, max_states,
                                                        proof_only=True, merge=merge,
                                                        pace=pace)
        return found is None and proven and finished

    def placement_within(self, bound: float, deadline: float, max_states: int,
                         proof_only: bool = False, merge: float = 0.0, pace: bool = True
                         ) -> tuple[np.ndarray | None, bool, bool]:
        """A placement of max-load at most `bound` or None, whether None is a proof
        that there is none, and whether the test finished. Past the state cap a layer
        keeps the `max_states` states of least (max, total) load, so a placement may
        still be found, but no proof (`proof_only`: the test ends there); a test
        stopped at the deadline, or earlier where its pace says it would not finish
        (PACE_LAYERS; `pace` False: at the deadline only), gives neither. `merge` > 0
        relaxes the test (`_merge_close`): a proof still holds, a placement found may
        pass `bound`."""
        k, lim = self.k, bound * (1 + SLACK)
        # The work still to place and the charge its own senders must add (a state
        # whose loads plus these pass k L has no completion within L).
        tied = tied_units(self.work, self.members, self.cost, k, lim, float(self.rest[0]))
        tables = self._first_segment_charges(bound, deadline)
        if tables is None:
            return None, False, False
        table_bound, first = tables
        layer_ends = [time.perf_counter()]
        loads = np.zeros((1, k))
        masks = np.zeros((1, 0), dtype=np.int64)
        debt = np.zeros(1)  # per state: released pooled work and its charges
        open_ids: list[int] = []
        trail = []  # per layer: (parent, device in the parent's labels, relabelling)
        proven = True
        for i in range(self.n):
            now = time.perf_counter()
            if now > deadline or (pace and i >= PACE_LAYERS and now + (self.n - i) * min(
                    (now - layer_ends[-1 - PACE_LAYERS]) / PACE_LAYERS,
                    (now - layer_ends[0]) / i) > deadline):
                return None, False, False
            col = {j: q for q, j in enumerate(open_ids)}
            starting = [j for j in self.at[i] if self.members[j][0] == i]
            new_open = [j for j in open_ids if self.members[j][-1] > i] + starting
            parts = [self._place(loads, masks, col, i, d, new_open) for d in range(k)]
            new_loads = np.concatenate([p[0] for p in parts])
            new_masks = np.concatenate([p[1] for p in parts])
            parent = np.concatenate([np.arange(len(loads))] * k)
            device = np.repeat(np.arange(k), len(loads))
            new_debt = np.concatenate([debt] * k)
            if i in self.releases:
                new_loads, new_masks, new_debt, parent, device = self._with_releases(
                    i, masks, col, new_loads, new_masks, new_debt, parent, device)
            room = k * lim - new_loads.sum(axis=1) - new_debt - self.rest[i + 1]
            # The charges below are never negative, so the states these cheap checks
            # drop fail them too: only the others are read ahead (on decomposed bert12
            # the read-ahead and the forced fit were a third of a test's time).
            keep = (new_loads.max(axis=1) <= lim) & (room >= 0)
            new_loads, new_masks, new_debt = new_loads[keep], new_masks[keep], new_debt[keep]
            parent, device, room = parent[keep], device[keep], room[keep]
            ahead, with_open = self._ahead(
                first, _tied_room_row(new_loads, new_masks, new_open, i, lim, tied,
                                      self.shares * table_bound * (1 + SLACK)),
                new_masks, new_open, i)
            # The forced fit adds what cutting an open sender costs to the slack that
            # leaves the open senders out.
            keep = ((room >= with_open)
                    & self._forced_fit(new_loads, new_masks, new_open, i, room - ahead,
                                       lim, tied))
            if not keep.any():
                return None, proven, True
            new_loads, new_masks, new_debt = new_loads[keep], new_masks[keep], new_debt[keep]
            parent, device = parent[keep], device[keep]
            new_loads, new_masks, perm = _canonical(new_loads, new_masks, k, lim)
            # The debt enters every later check through the loads' sum only, so a state
            # is compared by its loads and that sum with the debt (one more column).
            new_loads = np.concatenate(
                [new_loads, (new_loads.sum(axis=1) + new_debt)[:, None]], axis=1)
            if merge > 0:
                rep, new_loads = _merge_close(new_loads, new_masks, merge)
                new_masks, parent, device, perm = (new_masks[rep], parent[rep],
                                                   device[rep], perm[rep])
            chosen = _undominated(new_loads, new_masks)
            if len(chosen) > max_states:
                if proof_only:
                    return None, False, True
                proven = False
                chosen = chosen[np.lexsort((new_loads[chosen, :k].max(axis=1),
                                            new_loads[chosen].sum(axis=1)))[:max_states]]
            loads, masks = new_loads[chosen, :k], new_masks[chosen]
            debt = new_loads[chosen, k] - loads.sum(axis=1)
            trail.append((parent[chosen], device[chosen], perm[chosen]))
            open_ids = new_open
            layer_ends.append(time.perf_counter())
        return self._trace(trail, int(np.argmin(loads.max(axis=1)))), proven, True

    def _first_segment_charges(self, bound: float, deadline: float = math.inf
                               ) -> tuple[float, np.ndarray] | None:
        """The least bound B at or above `bound` with tables, and `first_segment_charges`
        at B with the tied segments limited to TIED_ROOM_SHARES of it (made at
        CHARGE_AHEAD above `bound` where none is; None where making them passes
        `deadline`). Tables at B >= L hold at L: a reading within L is one within B,
        and ties at B are ties at L, each of its components within one of L's."""
        made = [b for b in self._charges if b >= bound]
        if made:
            return min(made), self._charges[min(made)]
        bound *= 1 + CHARGE_AHEAD
        tied = tied_units(self.work, self.members, self.cost, self.k,
                          bound * (1 + SLACK), float(self.rest[0]))
        marked = np.zeros(self.n, dtype=bool)
        for units in tied.units:
            marked[units] = True
        charges = first_segment_charges(self.work, self.members, self.cost, bound,
                                        tied.joined(self.n), marked, self.shares * bound,
                                        deadline)
        if charges is None:
            return None
        self._charges[bound] = charges
        return bound, charges

    def _ahead(self, first, rows, masks, open_ids, i) -> tuple[np.ndarray, np.ndarray]:
        """Per state, the least the loads must still grow by in charges: of the senders
        first met after i, and of those and the open senders. Where the run of units
        i+1..e on one device g starts what follows, the former add twice their
        reading's charge (`first[row, i + 1, e - i - 1]`), and each open sender with a
        unit in that run and none on g yet adds its cost on g, and again on its one
        device where it had one (`_place`)."""
        if i + 1 >= self.n:
            return np.zeros(len(masks)), np.zeros(len(masks))
        charge = 2 * first[:, i + 1, :]  # per row and run length
        width = charge.shape[1]
        nxt = np.array([self.members[j][np.searchsorted(self.members[j], i + 1)]
                        for j in open_ids], dtype=np.int64) - (i + 1)
        order = np.argsort(nxt, kind="stable")
        # Run lengths [cut[q], cut[q + 1]) hold the first q open senders' next units.
        cut = np.concatenate([[0], np.minimum(nxt[order], width), [width]])
        least = np.full((charge.shape[0], len(cut) - 1), math.inf)
        for q in range(len(cut) - 1):
            if cut[q] < cut[q + 1]:
                least[:, q] = charge[:, cut[q]:cut[q + 1]].min(axis=1)
        least = least[rows]
        # paid[g]: what the first q open senders add on device g, for q = 0, 1, ...
        # (device-major: the least over devices then reads k contiguous rows, where
        # a reduction over a state's k loads took a fifth of a relaxed test's time).
        paid = np.zeros((self.k, len(masks)))
        with_open = least[:, 0].copy()
        adds = _open_sender_adds(self.k)
        for q, col in enumerate(order.tolist()):
            paid += float(self.cost[open_ids[col]]) * adds[:, masks[:, col]]
            np.minimum(with_open, least[:, q + 1] + paid.min(axis=0), out=with_open)
        return least.min(axis=1), with_open

    def _with_releases(self, i, masks, col, loads, new_masks, debt, parent, device):
        """The states with each release of unit i's pooled work (`pooled_work`): those
        of the pattern of which of its pools' anchors share its device (`masks`: the
        parents' sets, by `col`)."""
        senders, (work, home_charge, charge) = self.releases[i]
        pattern = np.zeros(len(loads), dtype=np.int64)
        for q, j in enumerate(senders):
            joined = (np.ones(len(loads), dtype=bool) if j is None
                      else masks[parent, col[j]] == 1 << device)
            pattern |= joined.astype(np.int64) << q
        rows, home = np.arange(len(loads)), float(self.home[i])
        all_loads, all_debt = [], []
        for t in range(work.shape[1]):
            placed = loads.copy()
            placed[rows, device] += home - work[pattern, t] + home_charge[pattern, t]
            all_loads.append(placed)
            all_debt.append(debt + work[pattern, t] + charge[pattern, t]
                            - home_charge[pattern, t])
        copies = len(all_loads)
        return (np.concatenate(all_loads), np.concatenate([new_masks] * copies),
                np.concatenate(all_debt), np.concatenate([parent] * copies),
                np.concatenate([device] * copies))

    def _forced_fit(self, loads, masks, open_ids, i, slack, lim,
                    tied: TiedUnits | None = None) -> np.ndarray:
        """Per state, whether each device can take the units it is forced to: a sender
        whose placed members sit on one device d adds at least 2 c to the loads'
        sum if it is ever cut (c on d and on another device), beyond what `slack`
        counts (the suffix charge holds only senders with no member placed), so where
        2 c passes the state's slack its members still to place must join d. `tied`
        (`placement.tied_units`): every unit still to place of a component with a
        placed unit on d must join d too, the components' work summed."""
        fits = np.ones(len(loads), dtype=bool)
        if not open_ids:
            return fits
        cost = self.cost[open_ids]
        later = np.array([sum(self.work[x] for x in self.members[j] if x > i)
                          for j in open_ids])
        # need[d]: the most work a sender forced onto d still has to place there. Built
        # a sender at a time over contiguous rows: a reduction over each state's few
        # open senders took over a tenth of a relaxed test's time.
        need = np.zeros((self.k, len(loads)))
        for q, m in enumerate(np.ascontiguousarray(masks.T)):
            forced = 2 * cost[q] > slack
            for d in range(self.k):
                np.maximum(need[d], np.where(forced & (m == 1 << d), later[q], 0.0),
                           out=need[d])
        components = _open_components(tied, open_ids, i)
        for d in range(self.k):
            held = sum((np.where(masks[:, q] == 1 << d, work, 0.0)
                        for q, work in components), np.zeros(len(loads)))
            fits &= loads[:, d] + np.maximum(need[d], held) <= lim
        return fits

    def _place(self, loads, masks, col, i, d, new_open):
        """Every state with unit i on device d: its loads and its new open senders' sets."""
        loads = loads.copy()
        loads[:, d] += self.work[i]
        bit = 1 << d
        sets = {j: masks[:, q] for j, q in col.items()}
        for j in self.at[i]:
            m = sets.get(j)
            if m is None:  # i is the sender's first member
                sets[j] = np.full(len(loads), bit, dtype=np.int64)
                continue
            outside = (m & bit) == 0
            c = float(self.cost[j])
            loads[outside, d] += c
            alone = outside & ((m & (m - 1)) == 0)
            for e in range(self.k):
                loads[alone & (m == 1 << e), e] += c
            sets[j] = m | bit
        new_masks = (np.stack([sets[j] for j in new_open], axis=1) if new_open
                     else np.zeros((len(loads), 0), dtype=np.int64))
        return loads, new_masks

    def _trace(self, trail, s: int) -> np.ndarray:
        """The placement of state s of the last layer, in one device numbering."""
        unit_device = np.empty(self.n, dtype=np.int64)
        to_final = np.arange(self.k)  # current layer's labels -> final labels
        for i in range(self.n - 1, -1, -1):
            parent, device, perm = trail[i]
            unit_device[i] = to_final[perm[s, device[s]]]
            to_final = to_final[perm[s]]
            s = parent[s]
        return unit_device


@functools.lru_cache(maxsize=None)
def _open_sender_adds(k: int) -> np.ndarray:
    """[g, set]: what `_ahead` counts for an open sender of cost 1 whose placed members
    sit on the devices of `set` when a later member joins device g: nothing where g is
    in the set; else 1, and 1 more where the set is one device (the sender is cut
    only now, so that device pays too)."""
    sets = np.arange(1 << k)
    single = (sets & (sets - 1)) == 0
    off = ((sets[None, :] >> np.arange(k)[:, None]) & 1) == 0
    adds = off * (1.0 + single)[None, :]
    adds.flags.writeable = False  # shared by every call for k
    return adds


def _release_table(pools: list[tuple[int | None, Pool]]) -> tuple[np.ndarray, ...]:
    """(work, charge on the home's device, charge in all)[pattern, t]: the releases
    of pools homed on one unit, per pattern (bit q: pool q's anchors share the home's
    device), each pattern's list padded with its last release."""
    table = [releases([pool for _, pool in pools],
                      [bool(pattern >> q & 1) or j is None
                       for q, (j, _) in enumerate(pools)])
             for pattern in range(1 << len(pools))]
    width = max(len(options) for options in table)
    padded = np.array([options + options[-1:] * (width - len(options))
                       for options in table]).reshape(len(table), width, 3)
    return padded[:, :, 0], padded[:, :, 1], padded[:, :, 2]


def _tied_room_row(loads, masks, open_ids, i, lim, tied: TiedUnits,
                   limits: np.ndarray) -> np.ndarray:
    """Per state, the index of the least of `limits` (descending, the first at least
    L) at least the room of every device holding a tied component with units still
    to place: a segment holding such units lies on that device."""
    if tied.starts_after(i):  # its units may go to any device
        return np.zeros(len(loads), dtype=np.int64)
    room = np.zeros(len(loads))
    for q, _ in _open_components(tied, open_ids, i):
        single = (masks[:, q] & (masks[:, q] - 1)) == 0
        held = np.log2(np.maximum(masks[:, q], 1)).astype(np.int64)
        room = np.maximum(room, np.where(single, lim - loads[np.arange(len(loads)), held],
                                         lim))
    return (limits[None, :] >= room[:, None]).sum(axis=1) - 1


def _open_components(tied: TiedUnits | None, open_ids: list[int],
                     i: int) -> list[tuple[int, float]]:
    """Per tied component with units on both sides of position i: the column of one
    of its open senders (a component spanning i has one; its placed members all sit on
    the one device of the component, else the state has paid the cut and failed its
    slack) and the work of its units after i."""
    if tied is None:
        return []
    seen: dict[int, tuple[int, float]] = {}
    for q, j in enumerate(open_ids):
        c = int(tied.component[j])
        if c >= 0 and c not in seen:
            seen[c] = (q, tied.later_work(c, i))
    return [v for v in seen.values() if v[1] > 0]


def _canonical(loads: np.ndarray, masks: np.ndarray, k: int, lim: float):
    """Relabel each state's devices: by which open senders' sets hold them, then by
    load, descending. Returns the loads and sets relabelled and per state the map
    old label -> new label."""
    code = np.zeros(loads.shape, dtype=np.float64)
    for q in range(masks.shape[1]):
        for e in range(k):
            code[:, e] += ((masks[:, q] >> e) & 1) * float(2 ** q)
    # Loads are at most lim, so they break ties only within one membership code.
    order = np.argsort(-(code + loads / (2 * lim)), axis=1, kind="stable")
    perm = np.empty_like(order)
    np.put_along_axis(perm, order, np.arange(k)[None, :].repeat(len(loads), 0), axis=1)
    new_loads = np.take_along_axis(loads, order, axis=1)
    new_masks = np.zeros_like(masks)
    for e in range(k):
        bit = (masks >> e) & 1
        new_masks |= bit << perm[:, e:e + 1]
    return new_loads, new_masks, perm


def _row_classes(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The first row of each distinct row (in sorted order) and each row's class.
    Non-negative integer rows are packed into as few int64 words as hold their bits
    (the same rows, the same words) and sorted by those: numpy's unique over rows
    compares them as raw records, several times slower."""
    if not len(rows):
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    words, used = [np.zeros(len(rows), dtype=np.int64)], 0
    for q, v in enumerate(rows.max(axis=0, initial=0).tolist()):
        b = max(1, int(v).bit_length())
        if used + b > 62:
            words.append(np.zeros(len(rows), dtype=np.int64))
            used = 0
        words[-1] = (words[-1] << b) | rows[:, q]
        used += b
    if len(words) == 1:  # numpy's flat unique: the lexsort below is slower on one word
        _, first, cls = np.unique(words[0], return_index=True, return_inverse=True)
        return first, cls.ravel()
    order = np.lexsort(words[::-1])  # stable: a class's first row leads its run
    new = np.ones(len(rows), dtype=bool)
    new[1:] = np.logical_or.reduce([w[order[1:]] != w[order[:-1]] for w in words])
    cls = np.empty(len(rows), dtype=np.int64)
    cls[order] = np.cumsum(new) - 1
    return order[new], cls


def _merge_close(loads: np.ndarray, masks: np.ndarray, width: float):
    """A relaxation of a layer: the states with the same sender sets whose loads fall in
    the same cells of `width` (per device, after relabelling) become one, with the
    least load of each device among them. That state's completions cost no more than
    any of theirs (each load at most, the same sets), so a placement within L of any
    of them is one of it: what no state survives stays impossible, while a state
    kept may stand for none. Returns the kept states' indices (the first of each
    cell) and their loads."""
    key = np.concatenate([masks, np.floor(loads / width).astype(np.int64)], axis=1)
    first, cell = _row_classes(key)
    least = np.full((len(first), loads.shape[1]), np.inf)
    np.minimum.at(least, cell, loads)
    return first, least


def _undominated(loads: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """Indices of the states kept: per sender sets, those no other state dominates
    (each load at most, one less; of exact duplicates the first). In rounds: each
    round's probes are the DOMINANCE_PROBES least-total states of each sender sets not
    yet probed, and every state not yet probed is tested against them, so a state
    survives only when each earlier probe fails; past DOMINANCE_ROUNDS the states not
    yet probed are kept (keeping a dominated state only costs time). Dominance is
    transitive, so a state dropped always has a kept dominator."""
    if masks.shape[1]:
        _, group = _row_classes(masks)
    else:
        group = np.zeros(len(loads), dtype=np.int64)
    order = np.lexsort((loads.sum(axis=1), group))
    loads, group = loads[order], group[order]
    alive = np.ones(len(order), dtype=bool)
    probed = np.zeros(len(order), dtype=bool)
    for _ in range(DOMINANCE_ROUNDS):
        open_ = np.flatnonzero(alive & ~probed)
        if not len(open_):
            break
        _dominance_round(loads, group[open_], open_, alive, probed)
    return np.sort(order[alive])


def _dominance_round(loads, group, open_, alive, probed) -> None:
    """One round over the states `open_` (sorted by sender sets, then total load, their
    sets' ids `group`): probe the first DOMINANCE_PROBES of each sets, drop what a
    probe dominates."""
    starts = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])
    sizes = np.diff(np.r_[starts, len(open_)])
    gid = np.repeat(np.arange(len(starts)), sizes)
    rank = np.arange(len(open_)) - np.repeat(starts, sizes)
    probes = min(DOMINANCE_PROBES, int(sizes.max()))
    sel = rank < probes
    probed[open_[sel]] = True
    # One table per device, so that each comparison below reads contiguous rows.
    tables = np.full((loads.shape[1], len(starts), probes), np.inf)
    table_pos = np.full((len(starts), probes), -1)
    tables[:, gid[sel], rank[sel]] = loads[open_[sel]].T
    table_pos[gid[sel], rank[sel]] = open_[sel]
    for a in range(0, len(open_), CHUNK):
        part = slice(a, a + CHUNK)
        rows, cand_pos, pos = gid[part], table_pos[gid[part]], open_[part, None]
        # A state is dropped when a probe that comes before it is at most its loads in
        # every column. The order is by total load, so a probe less in one column and
        # at most in the others comes first (a total can tie only by rounding, which
        # keeps both); of exact duplicates the first is kept; no state drops itself.
        # An empty slot (inf) is never at most a load.
        le = cand_pos < pos
        for e, table in enumerate(tables):
            le &= table[rows] <= loads[open_[part], e][:, None]
        dominated = le.any(axis=1)
        alive[open_[part][dominated]] = False
