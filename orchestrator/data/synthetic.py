"""Small datasets written locally in the real layouts, so that runs without `--data`
exercise the real loaders. Each has structure a model can learn, so a run that works
shows its loss falling: text is a Zipfian first-order Markov chain of words, parallel
text translates it word by word, and an image's class is its colour and stripes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from orchestrator.data.text import LM1B_TRAIN_DIR, LM1B_VOCAB, WMT_PREFIX, WMT_VOCAB

VERSION = 2
"""What the writers write; bump it when that changes, since datasets are cached by a
name that holds it (orchestrator/train/batches.py) and an old one must not be reused."""

_DONE = ".complete"
#: Likely successors of each word, and how often a word is one of them.
_NUM_SUCCESSORS = 2
_P_SUCCESSOR = 0.9


def _words(vocab_size: int) -> list[str]:
    return [f"w{i}" for i in range(vocab_size)]


def _zipf(vocab_size: int) -> np.ndarray:
    """Word i has frequency proportional to 1/(i+1): ids sorted by frequency, as in the
    One Billion Word vocabulary and the log-uniform sampler BigLSTM draws from, so that
    a model's first steps already gain by learning the word frequencies."""
    p = 1.0 / np.arange(1, vocab_size + 1)
    return p / p.sum()


def _sentences(rng: np.random.Generator, num: int, vocab_size: int) -> list[list[int]]:
    """A first-order Markov chain: each word is followed by one of its two likely
    successors 90% of the time, else by a word drawn by frequency."""
    zipf = _zipf(vocab_size)
    successors = rng.choice(vocab_size, size=(vocab_size, _NUM_SUCCESSORS), p=zipf)
    lengths = rng.integers(5, 21, size=num)
    out = []
    for length in lengths:
        follow = rng.random(length) < _P_SUCCESSOR
        pick = rng.integers(_NUM_SUCCESSORS, size=length)
        fresh = rng.choice(vocab_size, size=length, p=zipf)
        sentence = [int(fresh[0])]
        for t in range(1, length):
            sentence.append(int(successors[sentence[-1], pick[t]] if follow[t] else fresh[t]))
        out.append(sentence)
    return out


def write_lm1b(root: str | Path, *, num_sentences: int = 4000, vocab_size: int = 100,
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


def write_wmt(root: str | Path, *, num_pairs: int = 4000, vocab_size: int = 100,
              seed: int = 0) -> Path:
    """Tokenised parallel text: the source is the Markov chain, the target translates
    it word by word through a fixed dictionary, in the same order (a monotone
    alignment, which attention learns soonest)."""
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
        "\n".join(" ".join(words[dictionary[w]] for w in s) for s in sources) + "\n")
    (root / _DONE).touch()
    return root


def write_images(root: str | Path, *, num_classes: int = 10, per_class: int = 40,
                 size: int = 48, seed: int = 0) -> Path:
    """The ImageNet layout with JPEGs: each class a colour and a stripe direction,
    under pixel noise."""
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
