"""Parallel configurations of a layer (Jia et al. 2018, Section 3) and their tiles.

A configuration gives a degree per dimension; its `degree` (their product) is the
number of tasks. Task k runs on device k, with k numbering the task grid in row-major
order over (sample, channel, height, width): sample outermost, width innermost. Every
task owns an equal slice [i/d, (i+1)/d) of each split dimension of the layer's
output, so tiles are fractions and need no divisibility.

Choice where the paper leaves room: every degree divides the device count and so does
their product (powers of two on 4, 8 or 16 devices, as in the paper's experiments); a
dimension of known size is never split into more parts than it has elements.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from placement.layerwise.layers import DIMS, Layer


@dataclass(frozen=True, kw_only=True, order=True)
class ParallelConfig:
    sample: int = 1
    channel: int = 1
    height: int = 1
    width: int = 1

    def __post_init__(self) -> None:
        for dim in DIMS:
            if getattr(self, dim) < 1:
                raise ValueError(f"degree of {dim} is {getattr(self, dim)}: must be >= 1")

    @property
    def degrees(self) -> tuple[int, int, int, int]:
        return (self.sample, self.channel, self.height, self.width)

    @property
    def degree(self) -> int:
        """|c|: the number of tasks, one per device."""
        return self.sample * self.channel * self.height * self.width

    @property
    def label(self) -> str:
        """E.g. 'n4c2' (unsplit dimensions left out; '1' for a single task)."""
        parts = [f"{d[0] if d != 'sample' else 'n'}{k}"
                 for d, k in zip(DIMS, self.degrees) if k > 1]
        return "".join(parts) or "1"

    def task_indices(self) -> np.ndarray:
        """(degree, 4) array: task k's index along each dimension (row-major grid)."""
        return _task_grid(self.degrees)

    def to_dict(self) -> dict[str, Any]:
        return {**dict(zip(DIMS, self.degrees)), "degree": self.degree,
                "devices": list(range(self.degree))}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ParallelConfig:
        return ParallelConfig(**{d: int(data.get(d, 1)) for d in DIMS})


@functools.cache
def _task_grid(degrees: tuple[int, int, int, int]) -> np.ndarray:
    grid = np.indices(degrees).reshape(4, -1).T
    grid.flags.writeable = False
    return grid


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def configurations(layer: Layer, num_devices: int) -> tuple[ParallelConfig, ...]:
    """All configurations of `layer` on `num_devices` devices, the unsplit one first."""
    choices = []
    for dim in DIMS:
        if dim not in layer.dims:
            choices.append([1])
            continue
        size = layer.size(dim)
        choices.append([d for d in _divisors(num_devices) if size is None or d <= size])
    configs = [ParallelConfig(sample=n, channel=c, height=h, width=w)
               for n, c, h, w in itertools.product(*choices)
               if num_devices % (n * c * h * w) == 0]
    # Ties in cost go to the first: fewer devices, then fewer split dimensions, then
    # samples before channels before pixels (the cheapest to run for real).
    return tuple(sorted(configs, key=lambda c: (
        c.degree, sum(k > 1 for k in c.degrees), tuple(-k for k in c.degrees))))


def tile_bounds(configs: Sequence[ParallelConfig], axis_dims: Sequence[str | None],
                num_devices: int, halos: Sequence[float] | None = None) -> np.ndarray:
    """(len(configs), num_devices, len(axis_dims), 2) array of [lo, hi) fractions.

    For configuration p and device d, the slice of each tensor axis that task d
    covers: the task's slice of the dimension `axis_dims[a]` follows, or the whole
    axis where that is None, widened by `halos[a]` (a fraction of the axis) on each
    side within [0, 1]. Devices without a task get empty slices [0, 0).
    """
    out = np.zeros((len(configs), num_devices, len(axis_dims), 2))
    for p, config in enumerate(configs):
        idx = config.task_indices()
        deg = np.array(config.degrees)
        for a, dim in enumerate(axis_dims):
            if dim is None:
                out[p, :config.degree, a] = (0.0, 1.0)
            else:
                j = DIMS.index(dim)
                out[p, :config.degree, a, 0] = idx[:, j] / deg[j]
                out[p, :config.degree, a, 1] = (idx[:, j] + 1) / deg[j]
                if halos is not None and deg[j] > 1:
                    out[p, :config.degree, a, 0] -= halos[a]
                    out[p, :config.degree, a, 1] += halos[a]
    return np.clip(out, 0.0, 1.0)
