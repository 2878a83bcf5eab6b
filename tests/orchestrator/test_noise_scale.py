"""The appendix-A estimator on synthetic gradients of known noise."""

import pytest
import torch

from orchestrator.train.noise_scale import (
    NoiseScaleEstimator,
    b_simple,
    trace_sigma,
    true_gradient_sq,
)


def test_exact_expectations_give_exact_answers():
    g2, tr, bs, bb = 4.0, 400.0, 8, 64
    small, big = g2 + tr / bs, g2 + tr / bb  # eq. A.1
    assert true_gradient_sq(small, big, bs, bb) == pytest.approx(g2)
    assert trace_sigma(small, big, bs, bb) == pytest.approx(tr)
    assert b_simple(tr, g2) == 100


def test_estimator_recovers_a_known_noise_scale():
    # per-sample gradients G + N(0, sigma^2 I_d): tr(Sigma) = d sigma^2, B_simple = d/|G|^2
    gen = torch.Generator().manual_seed(0)
    d, sigma, workers, b_small = 2000, 1.0, 8, 4
    mean = torch.full((d,), 0.5)  # |G|^2 = 500, so B_simple = 2000 / 500 = 4
    est = NoiseScaleEstimator(decay=0.99)
    for _ in range(400):
        grads = [[mean + torch.randn(d, generator=gen) * sigma / b_small ** 0.5]
                 for _ in range(workers)]
        est.update_from_grads(grads, b_small)
    assert est.b_simple == pytest.approx(4.0, rel=0.1)
    assert est.grad_sq == pytest.approx(500, rel=0.05)


def test_needs_two_batch_sizes_and_a_step():
    est = NoiseScaleEstimator()
    with pytest.raises(ValueError, match="update"):
        est.b_simple
    with pytest.raises(ValueError, match="B_big > B_small"):
        est.update(1.0, 1.0, 8, 8)
