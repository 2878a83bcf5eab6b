"""Analytic scaling model: DP vs hybrid DP x MP time to accuracy and the cross-over.

- `comm`: alpha-beta allreduce (ring, hierarchical) and its overlap with backward.
- `efficiency`: epochs to target vs global batch (curve, noise scale, model defaults).
- `step`: a worker's step time at a per-worker batch, re-simulated from its plan.
- `crossover`: HybridConfig, time to accuracy, and the cross-over search.
"""
