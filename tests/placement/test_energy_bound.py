"""The group energy bound and its placement model: never above the brute-force optimum
on graphs with several micro-batches, every row holds on every device of every
schedule, and both rise above the window bound where a group's copies must queue."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.energy_bound import busy_by, energy_bound, energy_rows, group_energy
from placement.graph import Op, OpGraph
from placement.milp.backends import BACKENDS
from placement.milp.energy_relaxation import solve_energy_relaxation
from placement.milp.incumbent import Incumbent
from placement.problem import best_heuristic
from placement.simulate import list_schedule, step_time_lower_bound
from placement.step_bound import join_heads_tails, step_time_bound, window_bound
from tests.placement.milp_cases import problem, random_dag, search_step_time, training_dag

SOLVERS = [s for s in ("highs", "cbc") if BACKENDS[s].is_available()]


def energy(p) -> float:
    return energy_bound(group_energy(p.tg, *join_heads_tails(p.tg)), p.num_devices)


def model_bound(p, solver: str = "highs") -> float:
    name, group_device, value = best_heuristic(p)
    incumbent = Incumbent(group_device, value, name)
    bound = solve_energy_relaxation(p, BACKENDS[solver], incumbent,
                                    time.perf_counter() + 20)
    assert not incumbent.notes, incumbent.notes
    return bound


def test_busy_time_is_the_work_conserving_schedule_s():
    # Tasks of 2 released at 0 and 1, one of 1 released at 6: busy 0-4, idle, 6-7.
    at = np.array([0.0, 1.0, 4.0, 5.0, 6.5, 10.0])
    assert busy_by(np.array([0.0, 1.0, 6.0]), np.array([2.0, 2.0, 1.0]), at) == (
        pytest.approx([0.0, 1.0, 4.0, 4.0, 4.5, 5.0]))


# (seed, ops, devices, micro-batches): random DAGs where the bound beats the window
# bound, and brute force takes at most seconds.
CASES = [(0, 3, 2, 3), (1, 3, 2, 3), (1, 4, 2, 3), (4, 4, 2, 3)]


@pytest.mark.parametrize("case", CASES)
def test_the_bound_beats_the_window_bound_and_not_the_optimum(case):
    seed, num_ops, k, micro = case
    p = problem(random_dag(seed, num_ops, edge_prob=0.6), k, "makespan",
                num_micro_batches=micro)
    window = max(step_time_lower_bound(p.tg, k), window_bound(p.tg, k))
    assert window < energy(p) <= search_step_time(p.tg, k) * (1 + 1e-9)
    assert step_time_bound(p.tg, k) == pytest.approx(energy(p))


@pytest.mark.parametrize("seed", range(6))
def test_training_graphs_with_micro_batches_stay_below_the_optimum(seed):
    k = 2 + seed % 2
    p = problem(training_dag(seed, 3), k, "makespan", num_micro_batches=2)
    optimum = search_step_time(p.tg, k)
    assert energy(p) <= optimum * (1 + 1e-9)
    assert model_bound(p) <= optimum * (1 + 1e-6)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(1, 10), k=st.integers(1, 4),
       micro=st.integers(1, 4), training=st.booleans())
def test_every_row_holds_on_every_device_of_every_schedule(seed, num_ops, k, micro,
                                                          training):
    graph = training_dag(seed, num_ops) if training else random_dag(seed, num_ops)
    p = problem(graph, k, "makespan", num_micro_batches=micro)
    rows = energy_rows(group_energy(p.tg, *join_heads_tails(p.tg)), k, 1000)
    rng = np.random.default_rng(seed)
    for _ in range(5):
        gd = rng.integers(0, k, size=p.tg.num_groups)
        step = list_schedule(p.tg, gd, k, stagger_s=float(rng.uniform(0, 3))).step_time_s
        assert step >= energy(p) * (1 - 1e-9)
        for base, mandatory in rows:
            load = np.bincount(gd, weights=mandatory, minlength=k)
            assert step >= (base + load.max()) * (1 - 1e-9)


@pytest.mark.parametrize("solver", SOLVERS)
def test_the_model_charges_a_device_its_groups_energy(solver):
    # Three independent ops of 6 (forward only), two micro-batches of 3, two devices:
    # spread evenly, the work is 9 per device, but one device holds two whole groups.
    graph = OpGraph(ops=tuple(Op(id=i, name=f"op{i}", forward_s={"any": 6.0})
                              for i in range(3)), edges=())
    p = problem(graph, 2, "makespan", num_micro_batches=2)
    assert energy(p) == pytest.approx(9.0)
    assert search_step_time(p.tg, 2) == pytest.approx(12.0)
    assert model_bound(p, solver) == pytest.approx(12.0, rel=1e-6)
