import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.data.common import DataError, GlobalBatchSampler
from orchestrator.data.images import ImageFolderDataset
from orchestrator.data.synthetic import write_images, write_lm1b, write_wmt
from orchestrator.data.text import (
    LM1B_TRAIN_DIR,
    WMT_PREFIX,
    LM1BDataset,
    ParallelTextDataset,
)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 30), st.integers(0, 3))
def test_workers_together_see_exactly_the_single_device_batch(dp, per_worker, step, seed):
    batch = dp * per_worker
    whole = GlobalBatchSampler(num_samples=50, global_batch=batch, seed=seed)
    parts = [GlobalBatchSampler(num_samples=50, global_batch=batch, rank=r, dp_degree=dp,
                                seed=seed) for r in range(dp)]
    assert [i for p in parts for i in p.indices(step)] == list(whole.indices(step))


def test_resume_continues_with_the_next_batch():
    full = list(GlobalBatchSampler(num_samples=40, global_batch=8, num_steps=12))
    resumed = list(GlobalBatchSampler(num_samples=40, global_batch=8, start_step=7,
                                      num_steps=5))
    assert resumed == full[7:]
    epoch = full[:5]
    assert sorted(i for batch in epoch for i in batch) == list(range(40))


def test_uneven_split_is_refused():
    with pytest.raises(ValueError, match="multiple of 3"):
        GlobalBatchSampler(num_samples=40, global_batch=8, dp_degree=3)


def test_lm1b_layout_round_trip(tmp_path):
    ds = LM1BDataset(write_lm1b(tmp_path, num_sentences=50), seq_len=12)
    assert len(ds) == 50
    inputs, targets = ds[3]
    assert inputs.shape == targets.shape == (12,)
    assert inputs[0] == ds.vocab["<S>"]
    assert torch.equal(targets[:-1], inputs[1:])
    sentence = ds.lines.line(3).split()
    assert [ds.vocab[w] for w in sentence[:11]] == inputs[1:1 + len(sentence)].tolist()[:11]
    last, _ = ds[len(ds) - 1]  # the final sentence wraps around to the first
    assert last.shape == (12,)


def test_parallel_text(tmp_path):
    ds = ParallelTextDataset(write_wmt(tmp_path, num_pairs=30), src_len=10, tgt_len=12)
    source, decoder_in, target = ds[0]
    assert source.shape == (10,) and decoder_in.shape == target.shape == (12,)
    assert decoder_in[0] == ds.vocab["<S>"]


def test_images(tmp_path):
    ds = ImageFolderDataset(write_images(tmp_path, num_classes=3, per_class=2, size=20), 16)
    image, label = ds[5]
    assert image.shape == (3, 16, 16) and label == 2 and ds.num_classes == 3


def test_missing_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(DataError, match="1b_word_vocab.txt: missing vocabulary"):
        LM1BDataset(tmp_path, seq_len=8)
    root = write_wmt(tmp_path / "wmt", num_pairs=10)
    (root / f"{WMT_PREFIX}.de").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"\.de has 2"):
        ParallelTextDataset(root, 8, 8)
    lm = write_lm1b(tmp_path / "lm", num_sentences=10)
    shard = next((lm / LM1B_TRAIN_DIR).iterdir())
    shard.write_bytes(b"\xff\xfe broken\n")
    ds = LM1BDataset(lm, seq_len=8)
    with pytest.raises(DataError, match=f"{shard.name}: line at byte 0 is not UTF-8"):
        [ds[i] for i in range(len(ds))]
    images = write_images(tmp_path / "img", num_classes=1, per_class=1, size=8)
    bad = next((images / "train").iterdir()) / "img0000.JPEG"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match="img0000.JPEG: not a readable image"):
        ImageFolderDataset(images, 8)[0]
