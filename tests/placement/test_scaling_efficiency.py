"""Statistical efficiency: McCandlish et al. 2018's formulas and the measured curve."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.errors import UserError
from placement.scaling.efficiency import (
    MODEL_DEFAULTS,
    CurveError,
    EpochCurve,
    NoiseScaleModel,
    DEFAULT_DATASET_SIZE,
    critical_batch,
    dataset_size_for,
    efficiency_for,
    examples_to_target,
    known_efficiency,
    load_curve,
    steps_per_run,
    steps_to_target,
)

batches = st.floats(1.0, 1e7)


def test_hand_computed():
    assert steps_to_target(100, 1000, 1000) == 200  # S = S_min (1 + 1)
    assert steps_to_target(100, 1000, 250) == 500
    assert examples_to_target(1e5, 1000, 1000) == 2e5
    assert examples_to_target(1e5, 1000, 3000) == 4e5
    assert critical_batch(1e5, 100) == 1000
    assert steps_per_run(90, 1_281_167, 256) == pytest.approx(90 * 1_281_167 / 256)


@given(st.floats(1.0, 1e6), st.floats(1.0, 1e6), batches)
def test_steps_and_examples_satisfy_eq_2_11_and_e_equals_b_s(s_min, b_noise, b):
    e_min = s_min * b_noise  # eq. 2.12
    s = steps_to_target(s_min, b_noise, b)
    e = examples_to_target(e_min, b_noise, b)
    assert (s / s_min - 1) * (e / e_min - 1) == pytest.approx(1.0)  # eq. 2.11
    assert e == pytest.approx(b * s)


@given(st.floats(1.0, 1e6), batches, batches)
def test_more_batch_fewer_steps_more_examples(b_noise, a, b):
    lo, hi = sorted((a, b))
    assert steps_to_target(1, b_noise, hi) <= steps_to_target(1, b_noise, lo)
    model = NoiseScaleModel(b_noise=b_noise, min_epochs=2)
    assert model.epochs(lo) <= model.epochs(hi)
    assert model.epochs(lo) >= 2


CURVE = EpochCurve(global_batch=(256, 1024, 4096), epochs_at=(10, 10, 20))


def test_curve_hits_its_points_and_interpolates_in_log_log():
    for b, e in zip(CURVE.global_batch, CURVE.epochs_at):
        assert CURVE.epochs(b) == pytest.approx(e)
    assert CURVE.epochs(2048) == pytest.approx(10 * math.sqrt(2))  # halfway in log
    assert CURVE.epochs(64) == 10  # below the first point: its epochs
    assert CURVE.epochs(8192) == pytest.approx(20 * math.sqrt(2))  # last slope, 1/2


@given(st.lists(st.tuples(st.integers(1, 2**20), st.floats(0.1, 100)), min_size=2,
                max_size=6, unique_by=lambda t: t[0]), st.floats(0, 1), st.floats(0, 1))
def test_a_non_decreasing_curve_interpolates_non_decreasing(points, u, v):
    points.sort()
    bs = [p[0] for p in points]
    if any(y < 1.1 * x for x, y in zip(bs, bs[1:])):
        return  # measured curves step their batch by far more than 10%
    es = sorted(p[1] for p in points)
    curve = EpochCurve(global_batch=tuple(bs), epochs_at=tuple(es))
    lo, hi = sorted((1 + u * 2 * bs[-1], 1 + v * 2 * bs[-1]))
    assert curve.epochs(lo) <= curve.epochs(hi) * (1 + 1e-9)


@pytest.mark.parametrize("batch, epochs, words", [
    ((256,), (10,), "at least two"),
    ((256, 256), (10, 12), "strictly increasing"),
    ((512, 256), (10, 12), "strictly increasing"),
    ((256, 512), (10, -1), "negative"),
])
def test_bad_curves_say_what_is_wrong(batch, epochs, words):
    with pytest.raises(CurveError, match=words):
        EpochCurve(global_batch=batch, epochs_at=epochs)


def test_load_curve_with_header(tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("global_batch,epochs\n256,10\n1024,12\n")
    curve = load_curve(f)
    assert curve.global_batch == (256, 1024) and curve.epochs_at == (10, 12)
    f.write_text("256,ten\n")
    with pytest.raises(CurveError, match="row 1"):
        load_curve(f)


def test_sources_in_order_of_preference():
    assert efficiency_for(CURVE, 100.0, None, "gnmt") is CURVE
    noise = efficiency_for(None, 100.0, None, "gnmt")
    assert noise.b_noise == 100 and noise.min_epochs == MODEL_DEFAULTS["gnmt"].efficiency.min_epochs
    assert efficiency_for(None, None, None, "gnmt") is MODEL_DEFAULTS["gnmt"].efficiency
    with pytest.raises(UserError, match="--curve"):
        efficiency_for(None, None, None, None)
    with pytest.raises(UserError, match="no statistical-efficiency defaults"):
        efficiency_for(None, None, None, "resnet9000")


def test_every_default_names_its_source():
    for name, d in MODEL_DEFAULTS.items():
        assert name in d.efficiency.source and d.dataset_size > 0


def test_a_model_without_figures_has_no_known_efficiency_but_any_given_one_wins():
    curve = EpochCurve(global_batch=(8, 64), epochs_at=(1, 2))
    assert known_efficiency(None, None, None, "my_pkg.mod:build") is None
    assert known_efficiency(curve, None, None, "my_pkg.mod:build") is curve
    given = known_efficiency(None, 300.0, 2.0, "my_pkg.mod:build")
    assert (given.b_noise, given.min_epochs) == (300.0, 2.0)
    assert known_efficiency(None, None, None, "gnmt") is MODEL_DEFAULTS["gnmt"].efficiency


def test_samples_per_epoch_come_from_the_user_the_model_its_data_or_the_default():
    assert dataset_size_for(5e4, "gnmt", 64) == 5e4
    assert dataset_size_for(None, "gnmt", 64) == MODEL_DEFAULTS["gnmt"].dataset_size
    assert dataset_size_for(None, "my_pkg.mod:build", 64) == 64
    assert dataset_size_for(None, "my_pkg.mod:build") == DEFAULT_DATASET_SIZE
    with pytest.raises(UserError, match="--dataset-size 0: must be a positive number"):
        dataset_size_for(0, "gnmt")
