"""The contiguous split's interval costs against the simulator's device loads."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.heuristics import _interval_costs, group_sequence
from placement.simulate import device_loads
from tests.placement.max_load_cases import max_load_problem, training_dag


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), num_ops=st.integers(2, 9), colocate=st.booleans())
def test_every_interval_costs_what_the_simulator_charges_its_device(seed, num_ops,
                                                                    colocate):
    p = max_load_problem(training_dag(seed, num_ops, colocate=colocate), 2)
    tg = p.tg
    seq = group_sequence(tg)
    cost = _interval_costs(tg, seq, p.group_memory, np.inf, np.inf)
    n = len(seq)
    for i in range(n):
        for j in range(i + 1, n + 1):
            group_device = np.ones(tg.num_groups, dtype=np.int64)
            group_device[seq[i:j]] = 0
            assert cost[i, j] == pytest.approx(device_loads(tg, group_device, 2)[0])
        assert np.isinf(cost[i, : i + 1]).all()
