"""The noise-scale calibration against a brute-force reference: every sample's own
gradient at the initial weights of a linear regression (lr ~ 0 keeps them there)."""

from __future__ import annotations

import pytest
import torch

from orchestrator.models import build
from orchestrator.train.calibrate import measure_noise_scale, num_parts
from placement.errors import UserError

REGRESSION = "tests.orchestrator.user_models:regression"


def brute_force_b_simple() -> float:
    """tr(Sigma) / |G|^2 over the whole data set, from per-sample gradients."""
    spec = build(REGRESSION)
    x, y = spec.data[:]
    grads = []
    for i in range(len(x)):
        spec.module.zero_grad()
        spec.module(x[i:i + 1], y[i:i + 1]).backward()
        grads.append(torch.cat([p.grad.flatten() for p in spec.module.parameters()]))
    g = torch.stack(grads).double()
    mean = g.mean(0)
    return float(((g - mean) ** 2).sum(1).mean() / mean.dot(mean))


def test_the_measured_noise_scale_matches_per_sample_gradients():
    # 32 steps of 16 samples: one epoch of the 512-sample data set.
    measured = measure_noise_scale(REGRESSION, "tiny", global_batch=16, steps=32, lr=1e-9)
    assert measured == pytest.approx(brute_force_b_simple(), rel=0.1)


def test_the_batch_must_split_into_equal_parts():
    assert [num_parts(b) for b in (8, 9, 10, 6)] == [4, 3, 2, 3]
    with pytest.raises(UserError, match="batch 7 does not allow: pass an even --batch-size"):
        num_parts(7)
