"""Each model's batches from its real data layout (or a synthetic dataset written in
that layout): step s on worker r of dp gives rows [r*B/dp, (r+1)*B/dp) of global batch s,
so any (dp_degree, mp_degree) sees the same data at the same step, and a resumed run
continues from the step it stopped at."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from orchestrator.data.common import DataError, GlobalBatchSampler
from orchestrator.data.images import ImageFolderDataset
from orchestrator.data.synthetic import write_images, write_lm1b, write_wmt
from orchestrator.data.text import LM1BDataset, ParallelTextDataset
from orchestrator.models import ModelSpec

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
    """Batches of one worker for any step."""

    def __init__(self, spec: ModelSpec, *, data: str | None, global_batch: int,
                 rank: int, dp_degree: int, seed: int) -> None:
        cfg = spec.module.cfg
        self.spec = spec
        self.seed = seed
        if spec.name == "biglstm":
            root = Path(data) if data else _synthetic(
                f"lm1b-v{cfg.vocab_size}", lambda p: write_lm1b(
                    p, vocab_size=min(500, cfg.vocab_size - 3)))
            self.dataset = LM1BDataset(root, seq_len=cfg.num_steps)
            model_vocab = cfg.vocab_size
        elif spec.name == "gnmt":
            root = Path(data) if data else _synthetic(
                f"wmt-v{cfg.vocab_size}", lambda p: write_wmt(
                    p, vocab_size=min(500, cfg.vocab_size - 4)))
            self.dataset = ParallelTextDataset(root, cfg.src_len, cfg.tgt_len)
            model_vocab = cfg.vocab_size
        elif spec.name in ("inception_v3", "vgg16"):
            root = Path(data) if data else _synthetic(
                f"images-{cfg.image_size}-c{min(10, cfg.num_classes)}", lambda p: write_images(
                    p, num_classes=min(10, cfg.num_classes), per_class=16,
                    size=cfg.image_size))
            self.dataset = ImageFolderDataset(root, cfg.image_size)
            if self.dataset.num_classes > cfg.num_classes:
                raise DataError(f"{root}: {self.dataset.num_classes} classes, more than the "
                                f"model's {cfg.num_classes}: use the paper preset")
            model_vocab = None
        else:
            raise DataError(f"no data loader for model {spec.name!r}: train one of biglstm, "
                            "gnmt, inception_v3, vgg16")
        if model_vocab is not None and self.dataset.vocab_size > model_vocab:
            raise DataError(f"{root}: vocabulary of {self.dataset.vocab_size} words, more than "
                            f"the model's {model_vocab}: use the paper preset or a smaller "
                            "vocabulary")
        self.sampler = GlobalBatchSampler(num_samples=len(self.dataset),
                                          global_batch=global_batch, rank=rank,
                                          dp_degree=dp_degree, seed=seed)

    def batch(self, step: int) -> tuple[torch.Tensor, ...]:
        rows = [self.dataset[i] for i in self.sampler.indices(step)]
        columns = tuple(torch.stack([torch.as_tensor(r[c]) for r in rows])
                        for c in range(len(rows[0])))
        if self.spec.name == "biglstm":
            # The sampled-softmax negatives are shared by the whole global batch, so every
            # worker draws the same ones from the step's seed.
            samples = self.spec.make_batch(1, seed=self.seed * 1_000_003 + step)[-1]
            return (*columns, samples)
        return columns
