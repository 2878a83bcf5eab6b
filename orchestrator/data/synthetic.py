"""Small datasets written locally in the real layouts, so that runs without `--data`
exercise the real loaders. Each has structure a model can learn (the loss falls)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from orchestrator.data.images import ImageFolderDataset
from orchestrator.data.text import (
    LM1B_TRAIN_DIR,
    LM1B_VOCAB,
    WMT_PREFIX,
    WMT_VOCAB,
    LM1BDataset,
    ParallelTextDataset,
)

_DONE = ".complete"


def _words(vocab_size: int) -> list[str]:
    return [f"w{i}" for i in range(vocab_size)]


def _sentences(rng: np.random.Generator, num: int, vocab_size: int) -> list[list[int]]:
    """A Markov chain in which each word has three likely successors."""
    successors = rng.integers(0, vocab_size, size=(vocab_size, 3))
    out = []
    for _ in range(num):
        word = int(rng.integers(vocab_size))
        sentence = [word]
        for _ in range(int(rng.integers(4, 20))):
            word = int(successors[word, rng.integers(3)] if rng.random() < 0.9
                       else rng.integers(vocab_size))
            sentence.append(word)
        out.append(sentence)
    return out


def write_lm1b(root: str | Path, *, num_sentences: int = 4000, vocab_size: int = 500,
               num_files: int = 4, seed: int = 0) -> Path:
    """The One Billion Word layout: a vocabulary file and `news.en-*` shards."""
    root = Path(root)
    if (root / _DONE).exists():
        return root
    rng = np.random.default_rng(seed)
    words = _words(vocab_size)
    (root / LM1B_TRAIN_DIR).mkdir(parents=True, exist_ok=True)
    (root / LM1B_VOCAB).write_text("\n".join(["<S>", "</S>", "<UNK>", *words]) + "\n")
    sentences = _sentences(rng, num_sentences, vocab_size)
    for f in range(num_files):
        lines = (" ".join(words[w] for w in s) for s in sentences[f::num_files])
        (root / LM1B_TRAIN_DIR / f"news.en-{f:05d}-of-{num_files:05d}").write_text(
            "\n".join(lines) + "\n")
    (root / _DONE).touch()
    return root


def write_wmt(root: str | Path, *, num_pairs: int = 4000, vocab_size: int = 500,
              seed: int = 0) -> Path:
    """Tokenised parallel text: the target is the source reversed through a fixed
    word-to-word dictionary."""
    root = Path(root)
    if (root / _DONE).exists():
        return root
    rng = np.random.default_rng(seed)
    words = _words(vocab_size)
    dictionary = rng.permutation(vocab_size)
    root.mkdir(parents=True, exist_ok=True)
    (root / WMT_VOCAB).write_text("\n".join(words) + "\n")
    sources = _sentences(rng, num_pairs, vocab_size)
    (root / f"{WMT_PREFIX}.en").write_text(
        "\n".join(" ".join(words[w] for w in s) for s in sources) + "\n")
    (root / f"{WMT_PREFIX}.de").write_text(
        "\n".join(" ".join(words[dictionary[w]] for w in reversed(s)) for s in sources) + "\n")
    (root / _DONE).touch()
    return root


def write_images(root: str | Path, *, num_classes: int = 10, per_class: int = 40,
                 size: int = 48, seed: int = 0) -> Path:
    """The ImageNet layout with JPEGs: each class a colour and a stripe direction."""
    root = Path(root)
    if (root / _DONE).exists():
        return root
    rng = np.random.default_rng(seed)
    colours = rng.uniform(0.2, 0.8, size=(num_classes, 3))
    yy, xx = np.mgrid[0:size, 0:size]
    for c in range(num_classes):
        folder = root / "train" / f"n{c:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        stripes = np.sin((xx * np.cos(c) + yy * np.sin(c)) / 3.0)[..., None]
        for i in range(per_class):
            pixels = colours[c] + 0.15 * stripes + rng.normal(0, 0.08, (size, size, 3))
            Image.fromarray((np.clip(pixels, 0, 1) * 255).astype(np.uint8)).save(
                folder / f"img{i:04d}.JPEG", quality=90)
    (root / _DONE).touch()
    return root


def synthetic_lm1b(root: str | Path, seq_len: int) -> LM1BDataset:
    return LM1BDataset(write_lm1b(root), seq_len)


def synthetic_wmt(root: str | Path, src_len: int, tgt_len: int) -> ParallelTextDataset:
    return ParallelTextDataset(write_wmt(root), src_len, tgt_len)


def synthetic_images(root: str | Path, image_size: int) -> ImageFolderDataset:
    return ImageFolderDataset(write_images(root), image_size)
