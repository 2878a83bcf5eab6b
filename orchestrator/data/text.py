"""Text datasets: the One Billion Word benchmark's layout (BigLSTM) and tokenised
parallel text in the WMT16 En-De style (GNMT). Lines are indexed once and read by
seeking, so only the lines of this worker's rows are ever read and tokenised."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from orchestrator.data.common import DataError, line_offsets, read_line, require_file

LM1B_TRAIN_DIR = "training-monolingual.tokenized.shuffled"
LM1B_VOCAB = "1b_word_vocab.txt"
WMT_PREFIX = "train.tok.clean.bpe.32000"
WMT_VOCAB = "vocab.bpe.32000"

BOS, EOS, UNK, PAD = "<S>", "</S>", "<UNK>", "<pad>"
IGNORE_INDEX = -100
"""Target value of padding positions (torch's cross-entropy default ignore_index)."""


def load_vocab(path: Path, specials: tuple[str, ...]) -> dict[str, int]:
    """One token per line (an optional count after it is ignored); the special tokens
    come first when the file does not already hold them."""
    require_file(path, "vocabulary file")
    vocab: dict[str, int] = {s: i for i, s in enumerate(specials)}
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                word = raw.decode("utf-8").split()
            except UnicodeDecodeError:
                raise DataError(f"{path}: line {number} is not UTF-8 text: the vocabulary "
                                "is corrupt") from None
            if word and word[0] not in vocab:
                vocab[word[0]] = len(vocab)
    if len(vocab) == len(specials):
        raise DataError(f"{path}: the vocabulary is empty")
    return vocab


class _LineIndex:
    """Lines of several files, addressed by one global line number."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        offsets = [line_offsets(p) for p in paths]
        self.offsets = np.concatenate(offsets) if offsets else np.zeros(0, np.int64)
        self.file_of = np.repeat(np.arange(len(paths)), [len(o) for o in offsets])
        self._handles: dict[int, object] = {}

    def __len__(self) -> int:
        return len(self.offsets)

    def line(self, i: int) -> str:
        f = int(self.file_of[i])
        if f not in self._handles:
            self._handles[f] = self.paths[f].open("rb")
        return read_line(self._handles[f], self.offsets[i], self.paths[f])

    def __getstate__(self):
        # File handles do not pickle (DataLoader workers, Ray); reopen lazily.
        state = self.__dict__.copy()
        state["_handles"] = {}
        return state


def _encode(words: list[str], vocab: dict[str, int], length: int) -> list[int]:
    unk = vocab.get(UNK, 0)
    ids = [vocab.get(w, unk) for w in words]
    return ids[:length]


class LM1BDataset(torch.utils.data.Dataset):
    """Sample i = the `seq_len + 1` tokens that start with sentence i of the training
    files (sorted) and run on through the sentences after it, each as `<S> words </S>`
    (the packed streams BigLSTM trains on: no padding). Returns (inputs [T], targets [T])."""

    def __init__(self, root: str | Path, seq_len: int):
        root = Path(root)
        self.vocab = load_vocab(root / LM1B_VOCAB, (BOS, EOS, UNK))
        train = root / LM1B_TRAIN_DIR
        if not train.is_dir():
            raise DataError(f"{train}: missing training directory of the One Billion Word "
                            "layout: check --data")
        paths = sorted(p for p in train.iterdir() if p.name.startswith("news.en"))
        if not paths:
            raise DataError(f"{train}: no news.en-* training files")
        self.lines = _LineIndex(paths)
        self.seq_len = seq_len

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids: list[int] = []
        line = i
        while len(ids) < self.seq_len + 1:
            words = [BOS, *self.lines.line(line % len(self.lines)).split(), EOS]
            ids += _encode(words, self.vocab, self.seq_len + 1 - len(ids))
            line += 1
        tokens = torch.tensor(ids, dtype=torch.long)
        return tokens[:-1], tokens[1:]


class ParallelTextDataset(torch.utils.data.Dataset):
    """Sample i = line i of `<prefix>.<src>` and `<prefix>.<tgt>` (same line count),
    tokenised with the shared vocabulary: (source [S], decoder input [T], target [T])."""

    def __init__(self, root: str | Path, src_len: int, tgt_len: int,
                 src_lang: str = "en", tgt_lang: str = "de"):
        root = Path(root)
        self.vocab = load_vocab(root / WMT_VOCAB, (PAD, UNK, BOS, EOS))
        src = require_file(root / f"{WMT_PREFIX}.{src_lang}", "source-language file")
        tgt = require_file(root / f"{WMT_PREFIX}.{tgt_lang}", "target-language file")
        self.src, self.tgt = _LineIndex([src]), _LineIndex([tgt])
        if len(self.src) != len(self.tgt):
            raise DataError(f"{src} has {len(self.src)} lines but {tgt} has "
                            f"{len(self.tgt)}: parallel files must align line by line")
        self.src_len, self.tgt_len = src_len, tgt_len

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pad = self.vocab[PAD]
        src_ids = _encode(self.src.line(i).split(), self.vocab, self.src_len)
        tgt_ids = _encode([BOS, *self.tgt.line(i).split(), EOS], self.vocab, self.tgt_len + 1)
        source = torch.full((self.src_len,), pad, dtype=torch.long)
        source[:len(src_ids)] = torch.tensor(src_ids, dtype=torch.long)
        decoder = torch.full((self.tgt_len + 1,), pad, dtype=torch.long)
        decoder[:len(tgt_ids)] = torch.tensor(tgt_ids, dtype=torch.long)
        target = decoder[1:].clone()
        target[max(len(tgt_ids) - 1, 0):] = IGNORE_INDEX
        return source, decoder[:-1], target
