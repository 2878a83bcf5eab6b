"""The gradient noise scale B_simple = tr(Sigma) / |G|^2 from gradients a data-parallel
step already has: each worker's local gradient (batch B_small) and the allreduced one
(batch B_big = num_workers * B_small). McCandlish et al. 2018, appendix A.1.

E[|G_est(B)|^2] = |G|^2 + tr(Sigma) / B (eq. A.1), so two batch sizes give unbiased
estimates of both terms (eq. A.2). Their ratio is biased, so the paper averages each
term over many steps (exponential moving averages) before dividing; so does
`NoiseScaleEstimator`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


def squared_norm(grads: Sequence[torch.Tensor]) -> float:
    """|g|^2 over a list of gradient tensors (one per parameter)."""
    return float(sum(g.detach().double().pow(2).sum() for g in grads))


def true_gradient_sq(small_sq: float, big_sq: float, b_small: float, b_big: float) -> float:
    """|G|^2 = (B_big |G_big|^2 - B_small |G_small|^2) / (B_big - B_small)."""
    # see McCandlish et al. 2018 eq. A.2
    return (b_big * big_sq - b_small * small_sq) / (b_big - b_small)


def trace_sigma(small_sq: float, big_sq: float, b_small: float, b_big: float) -> float:
    """S = tr(Sigma) = (|G_small|^2 - |G_big|^2) / (1 / B_small - 1 / B_big)."""
    # see McCandlish et al. 2018 eq. A.2
    return (small_sq - big_sq) / (1 / b_small - 1 / b_big)


def b_simple(trace: float, grad_sq: float) -> float:
    """B_simple = tr(Sigma) / |G|^2."""
    # see McCandlish et al. 2018 eq. 2.9
    return trace / grad_sq


@dataclass
class NoiseScaleEstimator:
    """Running estimate of B_simple from (local, global) gradient norms per step."""

    decay: float = 0.95
    """Weight of the past in the moving averages of |G|^2 and tr(Sigma)."""
    grad_sq: float | None = field(default=None, init=False)
    trace: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.decay < 1:
            raise ValueError(f"decay {self.decay} must lie in [0, 1)")

    def update(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> None:
        """One step: `small_sq` = mean over workers of |local gradient|^2 (batch
        `b_small` each), `big_sq` = |allreduced gradient|^2 (batch `b_big`)."""
        if not b_big > b_small > 0:
            raise ValueError(f"need B_big > B_small > 0, got B_small={b_small}, B_big={b_big}")
        g2 = true_gradient_sq(small_sq, big_sq, b_small, b_big)
        s = trace_sigma(small_sq, big_sq, b_small, b_big)
        self.grad_sq = g2 if self.grad_sq is None else self.decay * self.grad_sq + (1 - self.decay) * g2
        self.trace = s if self.trace is None else self.decay * self.trace + (1 - self.decay) * s

    def update_from_grads(self, worker_grads: Sequence[Sequence[torch.Tensor]],
                          b_small: float) -> None:
        """One step from each worker's per-parameter gradients (means over `b_small`
        samples each); the global gradient is their mean, as an allreduce gives."""
        num_workers = len(worker_grads)
        small_sq = sum(squared_norm(g) for g in worker_grads) / num_workers
        mean = [torch.stack([w[i].detach() for w in worker_grads]).mean(0)
                for i in range(len(worker_grads[0]))]
        self.update(small_sq, squared_norm(mean), b_small, b_small * num_workers)

    @property
    def b_simple(self) -> float:
        if self.grad_sq is None or self.trace is None:
            raise ValueError("no steps recorded yet: call update() first")
        return b_simple(self.trace, self.grad_sq)
