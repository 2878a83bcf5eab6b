"""Layer-wise parallelism after Jia et al., ICML 2018 ("Exploring Hidden Dimensions in
Parallelizing Convolutional Neural Networks", OptCNN): every layer picks its own split
along samples, channels and pixels; a graph search by node and edge elimination finds
the split per layer that minimises the paper's cost model."""

from placement.layerwise.configs import ParallelConfig, configurations
from placement.layerwise.cost import CostConfig, LayerCosts
from placement.layerwise.search import SearchResult, solve
from placement.layerwise.strategy import (
    BASELINES,
    Comparison,
    LayerwisePlan,
    baseline_choice,
    compare,
)

__all__ = ["BASELINES", "Comparison", "CostConfig", "LayerCosts", "LayerwisePlan",
           "ParallelConfig", "SearchResult", "baseline_choice", "compare",
           "configurations", "solve"]
