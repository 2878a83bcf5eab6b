"""Pieces shared by the loaders: errors, line indexes, and the global-batch sampler."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from placement.errors import UserError


class DataError(UserError):
    """A missing, unreadable or corrupt data file; the message names the file."""


def require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: missing {what}: check --data (see the README's data layouts)")
    return path


def line_offsets(path: Path) -> np.ndarray:
    """Byte offset of every non-empty line's start, found by a numpy scan of the file
    (a multi-GB corpus is indexed in seconds; lines are then read by seeking)."""
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as err:
        raise DataError(f"{path}: cannot read it ({err.strerror})") from None
    starts = np.concatenate([[0], np.flatnonzero(data == ord("\n")) + 1])
    ends = np.concatenate([starts[1:] - 1, [len(data)]])
    return starts[ends > starts].astype(np.int64)


def read_line(handle, offset: int, path: Path) -> str:
    handle.seek(int(offset))
    raw = handle.readline()
    try:
        return raw.decode("utf-8").rstrip("\n")
    except UnicodeDecodeError:
        raise DataError(f"{path}: line at byte {offset} is not UTF-8 text: the file is "
                        "corrupt; re-download or regenerate it") from None


@functools.lru_cache(maxsize=2)
def _permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


@dataclass(frozen=True, kw_only=True)
class GlobalBatchSampler(torch.utils.data.Sampler):
    """Yields, for each training step, this worker's slice of the step's global batch.

    Step s of epoch e takes samples perm_e[s*B : (s+1)*B] (a seeded permutation per
    epoch); worker r of `dp_degree` takes rows [r*B/dp, (r+1)*B/dp) of it. So the union
    over workers is exactly what one device with batch B sees, and a run resumed at
    `start_step` continues with the very next batch.
    """

    num_samples: int
    global_batch: int
    rank: int = 0
    dp_degree: int = 1
    seed: int = 0
    start_step: int = 0
    num_steps: int | None = None

    def __post_init__(self) -> None:
        if self.global_batch % self.dp_degree:
            raise UserError(f"global batch {self.global_batch} does not split evenly over "
                            f"{self.dp_degree} workers: use a multiple of {self.dp_degree}")
        if self.num_samples < self.global_batch:
            raise DataError(f"the dataset has {self.num_samples} samples, fewer than one "
                            f"global batch of {self.global_batch}: use a smaller batch")

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.global_batch

    def indices(self, step: int) -> Sequence[int]:
        epoch, within = divmod(step, self.steps_per_epoch)
        perm = _permutation(self.num_samples, self.seed, epoch)
        local = self.global_batch // self.dp_degree
        begin = within * self.global_batch + self.rank * local
        return perm[begin:begin + local].tolist()

    def __iter__(self) -> Iterator[Sequence[int]]:
        step = self.start_step
        while self.num_steps is None or step < self.start_step + self.num_steps:
            yield self.indices(step)
            step += 1

    def __len__(self) -> int:
        if self.num_steps is None:
            raise TypeError("an endless sampler has no length")
        return self.num_steps
