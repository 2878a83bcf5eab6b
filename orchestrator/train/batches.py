"""Each model's batches: a built-in model's from its real data layout (or a synthetic
dataset written in that layout), a model of your own from its `ModelSpec.data` or its
`make_batch`. Step s on worker r of dp gives rows [r*B/dp, (r+1)*B/dp) of global batch
s, so any (dp_degree, mp_degree) sees the same data at the same step, and a resumed run
continues from the step it stopped at (a user's data function gets rank and world size
and slices the global batch itself)."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch.utils.data import Dataset

from orchestrator.data.common import DataError, GlobalBatchSampler
from orchestrator.data.images import ImageFolderDataset
from orchestrator.data.synthetic import VERSION, write_images, write_lm1b, write_wmt
from orchestrator.data.text import LM1BDataset, ParallelTextDataset
from orchestrator.models import ModelSpec
from orchestrator.runtime.executor import batched_inputs

DATA_CACHE = Path(tempfile.gettempdir()) / "hybrid-orchestrator-data"


def _synthetic(name: str, writer: Callable[[Path], Path]) -> Path:
    """Write a synthetic dataset once per machine; workers on one node may race to
    write it, so each writes a private copy and the first rename wins."""
    final = DATA_CACHE / name
    if not final.exists():
        scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=DATA_CACHE.parent))
        writer(scratch)
        DATA_CACHE.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(scratch, final)
        except OSError:
            shutil.rmtree(scratch, ignore_errors=True)
    return final


class BatchSource:
    """Batches of one worker for any step: from the model's real data layout (built-in
    models), the model's own data (`ModelSpec.data`), or else its `make_batch`."""

    def __init__(self, spec: ModelSpec, *, data: str | None, global_batch: int,
                 rank: int, dp_degree: int, seed: int) -> None:
        self.spec = spec
        self.seed = seed
        self.rank = rank
        self.local_batch = global_batch // dp_degree
        self.global_batch = global_batch
        self.dataset = None
        self.stream = None
        self.reference = None
        if spec.data is not None and data is not None:
            raise DataError(f"--data {data}: model {spec.name} brings its own data "
                            "(ModelSpec.data): leave --data out")
        if spec.name in _LOADERS:
            self.dataset = _LOADERS[spec.name](spec.module.cfg, data)
        elif data is not None:
            raise DataError(f"--data {data}: a model of your own reads no data layout; give "
                            "its data in the ModelSpec it returns (data=a Dataset or a "
                            "function (rank, world_size, batch_size) yielding batches)")
        elif isinstance(spec.data, Dataset):
            self.dataset = spec.data
        elif spec.data is not None:
            self.stream = BatchStream(spec.data, rank=rank, world_size=dp_degree,
                                      batch_size=self.local_batch)
        else:
            self.batched = batched_inputs(spec.make_batch)
        if spec.data is not None:
            # The graph was traced and costed on make_batch's tensors: the model's own
            # data must match them.
            self.reference = spec.make_batch(self.local_batch, device="meta")
        if self.dataset is not None:
            self.sampler = GlobalBatchSampler(num_samples=len(self.dataset),
                                              global_batch=global_batch, rank=rank,
                                              dp_degree=dp_degree, seed=seed)

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        out = self._batch(step)
        if self.reference is not None:
            check_batch(out, self.reference, f"batch {step} of worker {self.rank}")
        return out

    def _batch(self, step: int) -> tuple[torch.Tensor, ...]:
        if self.stream is not None:
            return self.stream.batch(step)
        if self.dataset is None:
            # Every worker draws the whole global batch of the step and keeps its rows,
            # so any dp_degree trains on the same samples.
            full = self.spec.make_batch(self.global_batch, seed=self.seed * 1_000_003 + step)
            begin = self.rank * self.local_batch
            return tuple(t[begin:begin + self.local_batch] if batched else t
                         for t, batched in zip(full, self.batched))
        rows = [_sample(self.dataset[i]) for i in self.sampler.indices(step)]
        columns = tuple(torch.stack([torch.as_tensor(r[c]) for r in rows])
                        for c in range(len(rows[0])))
        if self.spec.name == "biglstm":
            # The sampled-softmax negatives are shared by the whole global batch, so every
            # worker draws the same ones from the step's seed.
            samples = self.spec.make_batch(1, seed=self.seed * 1_000_003 + step)[-1]
            return (*columns, samples)
        return columns


def check_batch(batch: tuple, reference: tuple[torch.Tensor, ...], where: str) -> None:
    """Refuse a batch of the model's own data whose tensors differ from make_batch's."""
    if len(batch) != len(reference):
        raise DataError(f"{where} of the model's data has {len(batch)} tensor(s) where "
                        f"make_batch gives {len(reference)} (the arguments of "
                        "module(*batch)): give the same tensors, in that order")
    for i, (tensor, ref) in enumerate(zip(batch, reference)):
        if not isinstance(tensor, torch.Tensor):
            raise DataError(f"{where} of the model's data: item {i} is a "
                            f"{type(tensor).__name__}: give tensors")
        if tensor.shape != ref.shape or tensor.dtype != ref.dtype:
            raise DataError(f"{where} of the model's data: tensor {i} is {tensor.dtype} "
                            f"{list(tensor.shape)} but make_batch gives {ref.dtype} "
                            f"{list(ref.shape)} for the worker's batch: give batches of "
                            "make_batch's shapes and dtypes")


def check_data(spec: ModelSpec, *, data: str | None, global_batch: int,
               dp_degree: int, seed: int = 0) -> None:
    """What can be checked of a run's data before Ray starts: --data exists and holds
    the model's layout (its index is built here once more, seconds for a large corpus),
    and the model's own data gives the first step batches of the right shapes."""
    if data is not None and not Path(data).exists():
        raise DataError(f"--data {data}: no such file or directory: give the dataset root")
    if spec.data is not None or data is not None:
        BatchSource(spec, data=data, global_batch=global_batch, rank=0,
                    dp_degree=dp_degree, seed=seed).batch(0)


def _sample(item) -> tuple:
    """A dataset item as a tuple of one sample's tensors (a lone tensor is one)."""
    return tuple(item) if isinstance(item, tuple | list) else (item,)


class BatchStream:
    """A user's data function `data(rank, world_size, batch_size)` read step by step; a
    run resumed at step s skips the first s batches of a fresh iterator."""

    def __init__(self, fn: Callable, *, rank: int, world_size: int, batch_size: int) -> None:
        self.fn, self.rank, self.world_size, self.batch_size = fn, rank, world_size, batch_size
        self.iterator: Iterator | None = None
        self.next_step = 0

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        if self.iterator is None or step != self.next_step:
            self.iterator = itertools.islice(
                iter(self.fn(self.rank, self.world_size, self.batch_size)), step, None)
        try:
            item = next(self.iterator)
        except StopIteration:
            raise DataError(f"the model's data function ended before step {step + 1}: "
                            "yield a batch for every step (cycle over the epochs)") from None
        self.next_step = step + 1
        return _sample(item)


def _lm1b(cfg, data: str | None):
    root = Path(data) if data else _synthetic(
        f"lm1b-s{VERSION}-v{cfg.vocab_size}",
        lambda p: write_lm1b(p, vocab_size=min(100, cfg.vocab_size - 3)))
    return _check_vocab(LM1BDataset(root, seq_len=cfg.num_steps), root, cfg.vocab_size)


def _wmt(cfg, data: str | None):
    root = Path(data) if data else _synthetic(
        f"wmt-s{VERSION}-v{cfg.vocab_size}",
        lambda p: write_wmt(p, vocab_size=min(100, cfg.vocab_size - 4)))
    return _check_vocab(ParallelTextDataset(root, cfg.src_len, cfg.tgt_len), root,
                        cfg.vocab_size)


def _images(cfg, data: str | None):
    root = Path(data) if data else _synthetic(
        f"images-s{VERSION}-{cfg.image_size}-c{min(10, cfg.num_classes)}", lambda p: write_images(
            p, num_classes=min(10, cfg.num_classes), per_class=16, size=cfg.image_size))
    dataset = ImageFolderDataset(root, cfg.image_size)
    if dataset.num_classes > cfg.num_classes:
        raise DataError(f"{root}: {dataset.num_classes} classes, more than the "
                        f"model's {cfg.num_classes}: use the paper preset")
    return dataset


def _check_vocab(dataset, root: Path, model_vocab: int):
    if dataset.vocab_size > model_vocab:
        raise DataError(f"{root}: vocabulary of {dataset.vocab_size} words, more than "
                        f"the model's {model_vocab}: use the paper preset or a smaller "
                        "vocabulary")
    return dataset


#: Each built-in model's dataset in its real layout: (model config, --data) -> Dataset.
_LOADERS = {"biglstm": _lm1b, "gnmt": _wmt, "inception_v3": _images, "vgg16": _images}
