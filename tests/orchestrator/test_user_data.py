"""A model of your own with its own data: each worker's rows of every global batch, from
a Dataset, a data function or make_batch; checks that refuse data of the wrong shape."""

from __future__ import annotations

import pytest
import torch

from orchestrator.data.common import DataError
from orchestrator.data.synthetic import write_wmt
from orchestrator.models import build
from orchestrator.train.batches import BatchSource, check_data
from orchestrator.train.config import TrainConfig
from tests.orchestrator.test_train_local import run_local

MODELS = "tests.orchestrator.user_models"


def sources(model: str, global_batch: int, dp_degree: int) -> list[BatchSource]:
    spec = build(f"{MODELS}:{model}")
    return [BatchSource(spec, data=None, global_batch=global_batch, rank=r,
                        dp_degree=dp_degree, seed=0) for r in range(dp_degree)]


@pytest.mark.parametrize("model", ["mlp", "mlp_dataset", "mlp_stream"])
def test_workers_take_disjoint_rows_of_the_one_device_batch(model):
    one, = sources(model, 16, 1)
    workers = sources(model, 16, 4)
    seen = []
    # 64 samples: steps 0..4 cross the data set's first epoch.
    for step in range(5):
        whole = one.batch(step)
        parts = [w.batch(step) for w in workers]
        for column, expected in enumerate(whole):
            torch.testing.assert_close(torch.cat([p[column] for p in parts]), expected,
                                       rtol=0, atol=0)
        seen.append(whole[0])
    assert not torch.equal(seen[0], seen[1])  # the steps move on through the data


def test_a_data_function_resumed_at_a_step_continues_with_that_steps_batch():
    fresh, = sources("mlp_stream", 8, 1)
    batches = [fresh.batch(step)[0] for step in range(4)]
    resumed, = sources("mlp_stream", 8, 1)
    assert torch.equal(resumed.batch(2)[0], batches[2])
    assert torch.equal(resumed.batch(3)[0], batches[3])


def test_data_of_the_wrong_shape_or_too_short_is_refused_in_one_line():
    spec = build(f"{MODELS}:mlp_wrong_shape")
    with pytest.raises(DataError, match=r"tensor 0 is torch.float32 \[4, 4\] but make_batch "
                                        r"gives torch.float32 \[4, 6\]"):
        check_data(spec, data=None, global_batch=8, dp_degree=2)
    short, = sources("mlp_short_stream", 8, 1)
    short.batch(0), short.batch(1)
    with pytest.raises(DataError, match="ended before step 3"):
        short.batch(2)
    with pytest.raises(DataError, match="a model of your own reads no data layout"):
        check_data(build(f"{MODELS}:mlp"), data=".", global_batch=8, dp_degree=1)
    with pytest.raises(DataError, match="--data /no/such/dir: no such file"):
        check_data(build("gnmt"), data="/no/such/dir", global_batch=8, dp_degree=1)


def test_a_data_root_without_the_models_layout_is_refused_before_ray(tmp_path):
    with pytest.raises(DataError, match="vocab.bpe.32000: missing vocabulary file"):
        check_data(build("gnmt"), data=str(tmp_path), global_batch=8, dp_degree=1)
    check_data(build("gnmt"), data=str(write_wmt(tmp_path / "wmt", vocab_size=100)),
               global_batch=8, dp_degree=1)


def test_a_user_dataset_trains_on_two_devices_as_on_one(tmp_path):
    model = f"{MODELS}:mlp_dataset"
    single = run_local(TrainConfig(model=model, steps=4, global_batch=8), tmp_path)
    hybrid = run_local(TrainConfig(model=model, steps=4, global_batch=8, mp_degree=2,
                                   num_micro_batches=2), tmp_path)
    assert hybrid["losses"] == pytest.approx(single["losses"], rel=1e-5)
    assert single["losses"][-1] < single["losses"][0]


def test_a_transformers_model_is_a_model_of_your_own():
    """GPT-2 from a tiny config (examples/gpt2.py, nothing downloaded) with its own loss:
    it builds, its batches pass the data checks, its loss trains. Capturing its graph
    needs torch.export (fx cannot trace transformers 5's models)."""
    pytest.importorskip("transformers")
    spec = build("examples.gpt2:build", "tiny")
    check_data(spec, data=None, global_batch=spec.batch, dp_degree=2)
    ids, labels = spec.make_batch(spec.batch)
    assert ids.shape == (8, 32)
    loss = spec.module(ids, labels)
    assert torch.isfinite(loss) and loss.item() > 0
