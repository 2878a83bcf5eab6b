"""Alpha-beta allreduce: hand-computed values, a brute-force ring, and monotonicity."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.cluster import Link, preset
from placement.scaling.comm import (
    allreduce_s,
    exposed_allreduce_s,
    hierarchical_allreduce_s,
    ring_allreduce_bytes_per_device,
    ring_allreduce_s,
    ring_reduce_scatter_s,
)

LINK = Link(latency_s=1e-6, bandwidth_bytes_per_s=1e9)


def brute_force_ring(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Run a ring reduce-scatter then all-gather on p vectors cut into p chunks;
    return every device's result and the bytes each device sent."""
    p = len(vectors)
    chunks = [np.array_split(v.astype(float), p) for v in vectors]
    sent = np.zeros(p)
    for step in range(p - 1):  # reduce-scatter: device d sends chunk (d - step) to d+1
        msgs = [(d, (d - step) % p, chunks[d][(d - step) % p].copy()) for d in range(p)]
        for d, c, data in msgs:
            chunks[(d + 1) % p][c] += data
            sent[d] += data.nbytes
    for step in range(p - 1):  # all-gather: device d forwards its complete chunk
        msgs = [(d, (d + 1 - step) % p, chunks[d][(d + 1 - step) % p].copy()) for d in range(p)]
        for d, c, data in msgs:
            chunks[(d + 1) % p][c] = data
            sent[d] += data.nbytes
    return np.array([np.concatenate(c) for c in chunks]), sent


@given(st.integers(2, 9), st.integers(1, 6))
def test_brute_force_ring_sends_2_p_minus_1_over_p_of_the_bytes(p, chunk):
    n = p * chunk
    vectors = np.arange(p * n, dtype=float).reshape(p, n)
    result, sent = brute_force_ring(vectors)
    assert np.allclose(result, vectors.sum(axis=0))
    n_bytes = n * 8
    assert np.allclose(sent, ring_allreduce_bytes_per_device(p, n_bytes))
    assert math.isclose(ring_allreduce_bytes_per_device(p, n_bytes), 2 * (p - 1) / p * n_bytes)


def test_ring_allreduce_hand_computed():
    # p=4, 1 GB over 1 GB/s, 1 us: 2*3*1e-6 + 2*3/4*1 s
    assert ring_allreduce_s(4, 1e9, LINK) == pytest.approx(6e-6 + 1.5)
    assert ring_reduce_scatter_s(4, 1e9, LINK) == pytest.approx(3e-6 + 0.75)
    assert ring_allreduce_s(1, 1e9, LINK) == 0.0


def test_hierarchical_hand_computed():
    intra = Link(latency_s=0.0, bandwidth_bytes_per_s=10e9)
    inter = Link(latency_s=0.0, bandwidth_bytes_per_s=1e9)
    # 8 per node, 2 nodes, 8 GB: RS 7/8*8/10 + AR of 1 GB over 2 nodes 2*1/2*1/1 + AG 0.7
    expected = 0.7 + 1.0 + 0.7
    assert hierarchical_allreduce_s(8, 2, 8e9, intra, inter) == pytest.approx(expected)


@given(st.integers(1, 64), st.floats(1.0, 1e10), st.floats(1.0, 1e10))
def test_ring_time_grows_with_bytes(p, a, b):
    lo, hi = sorted((a, b))
    assert ring_allreduce_s(p, lo, LINK) <= ring_allreduce_s(p, hi, LINK)


@given(st.integers(1, 63), st.floats(1.0, 1e10))
def test_ring_time_grows_with_participants(p, n):
    assert ring_allreduce_s(p, n, LINK) <= ring_allreduce_s(p + 1, n, LINK)


def test_allreduce_inside_one_node_uses_the_intra_node_link():
    c = preset("dgx1-v100")
    assert allreduce_s(8, 1e9, c, 1) == pytest.approx(ring_allreduce_s(8, 1e9, c.intra_node))
    # four 2-device workers fill one node
    assert allreduce_s(4, 1e9, c, 2) == pytest.approx(ring_allreduce_s(4, 1e9, c.intra_node))
    assert allreduce_s(1, 1e9, c, 1) == 0.0


@given(st.sampled_from([16, 32, 64, 512]), st.sampled_from([1, 2, 4, 8]), st.floats(1e3, 1e10))
def test_best_is_the_faster_of_ring_and_hierarchical(dp, mp, n):
    c = preset("dgx1-v100")
    best = allreduce_s(dp, n, c, mp, "best")
    ring, hier = allreduce_s(dp, n, c, mp, "ring"), allreduce_s(dp, n, c, mp, "hierarchical")
    assert best == pytest.approx(min(ring, hier))
    per_node = 8 // mp
    if per_node > 1 and dp > per_node:
        # only the inter-node phase's 1/per_node shard crosses the slow link
        assert hier < ring


@given(st.floats(0, 10), st.floats(0, 10), st.floats(0, 1))
def test_exposed_allreduce_bounds(ar, backward, overlap):
    exposed = exposed_allreduce_s(ar, backward, overlap)
    assert max(0.0, ar - backward) - 1e-12 <= exposed <= ar
    assert exposed >= (1 - overlap) * ar - 1e-12
    assert exposed_allreduce_s(ar, backward, 0.0) == ar
