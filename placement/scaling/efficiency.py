"""Statistical efficiency: how much data training needs to reach its target quality as a
function of the global batch.

Three sources, in this order of preference: a curve the user measured (CSV of
global_batch, epochs); the gradient-noise-scale model of McCandlish et al. 2018 with a
measured noise scale; documented defaults per model (`MODEL_DEFAULTS`).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training", arXiv:1812.06162):
with S the optimizer steps and E = B * S the examples to reach a target loss,
(S / S_min - 1)(E / E_min - 1) = 1 (eq. 2.11) and B_crit = E_min / S_min (eq. 2.12).
At a fixed batch B these give S = S_min (1 + B_crit / B) and E = E_min (1 + B / B_crit);
the paper predicts B_crit ~ B_noise, estimated by B_simple = tr(Sigma) / |G|^2 (eq. 2.9).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from placement.errors import UserError


class CurveError(UserError):
    """A statistical-efficiency curve that cannot be used."""


class StatisticalEfficiency(Protocol):
    source: str

    def epochs(self, global_batch: float) -> float:
        """Passes over the data set needed to reach the target at this global batch."""


def steps_to_target(s_min: float, b_noise: float, batch: float) -> float:
    """S = S_min (1 + B_noise / B): small batches waste steps on gradient noise."""
    # see McCandlish et al. 2018 eq. 2.11 with eq. 2.12, at fixed B
    return s_min * (1 + b_noise / batch)


def examples_to_target(e_min: float, b_noise: float, batch: float) -> float:
    """E = E_min (1 + B / B_noise): large batches waste examples past the noise scale."""
    # see McCandlish et al. 2018 eq. 2.11 with eq. 2.12, at fixed B
    return e_min * (1 + batch / b_noise)


def critical_batch(e_min: float, s_min: float) -> float:
    """B_crit = E_min / S_min, the batch that balances time and compute."""
    # see McCandlish et al. 2018 eq. 2.12
    return e_min / s_min


def steps_per_run(epochs: float, dataset_size: float, global_batch: float) -> float:
    """Optimizer steps of a run: epochs x examples per epoch / examples per step."""
    return epochs * dataset_size / global_batch


@dataclass(frozen=True, kw_only=True)
class NoiseScaleModel:
    """McCandlish et al.'s model with B_crit taken as the measured noise scale."""

    b_noise: float
    """Gradient noise scale B_noise (~ B_crit ~ B_simple), in samples."""
    min_epochs: float
    """E_min in epochs: the data needed as the batch goes to zero."""
    source: str = "gradient noise scale"

    def __post_init__(self) -> None:
        if not (self.b_noise > 0 and math.isfinite(self.b_noise)):
            raise UserError(f"noise scale {self.b_noise}: must be a positive number of "
                            "samples (measure it with orchestrator.train.noise_scale)")
        if not (self.min_epochs > 0 and math.isfinite(self.min_epochs)):
            raise UserError(f"minimum epochs {self.min_epochs}: must be > 0")

    def epochs(self, global_batch: float) -> float:
        return examples_to_target(self.min_epochs, self.b_noise, global_batch)


@dataclass(frozen=True, kw_only=True)
class EpochCurve:
    """Measured epochs to target at a few global batches, interpolated linearly in
    log(batch) vs log(epochs); below the first point the first point's epochs (E never
    drops below E_min), above the last the last segment's slope, never falling."""

    global_batch: tuple[float, ...]
    epochs_at: tuple[float, ...]
    source: str = "measured curve"

    def __post_init__(self) -> None:
        where = f" in {self.source}" if self.source else ""
        if len(self.global_batch) != len(self.epochs_at):
            raise CurveError(f"{len(self.global_batch)} batch sizes but "
                             f"{len(self.epochs_at)} epoch counts{where}: give one of each per row")
        if len(self.global_batch) < 2:
            raise CurveError(f"the curve{where} has {len(self.global_batch)} point(s): give at "
                             "least two rows of global_batch,epochs")
        for b in self.global_batch:
            if not (b > 0 and math.isfinite(b)):
                raise CurveError(f"global batch {b}{where}: batch sizes must be positive numbers")
        for b, e in zip(self.global_batch, self.epochs_at):
            if not math.isfinite(e) or e < 0:
                raise CurveError(f"epochs {e} at global batch {b:g}{where} is negative: "
                                 "epochs to target must be > 0")
            if e == 0:
                raise CurveError(f"epochs 0 at global batch {b:g}{where}: epochs to target "
                                 "must be > 0")
        for a, b in zip(self.global_batch, self.global_batch[1:]):
            if b <= a:
                raise CurveError(f"global batch {b:g} follows {a:g}{where}: sort the rows by "
                                 "strictly increasing global_batch (one row per batch size)")

    def epochs(self, global_batch: float) -> float:
        xs = [math.log(b) for b in self.global_batch]
        ys = [math.log(e) for e in self.epochs_at]
        x = math.log(global_batch)
        if x <= xs[0]:
            return self.epochs_at[0]
        i = next((k for k in range(1, len(xs)) if x <= xs[k]), len(xs) - 1)
        slope = (ys[i] - ys[i - 1]) / (xs[i] - xs[i - 1])
        if x > xs[-1]:
            slope = max(slope, 0.0)
        return math.exp(ys[i - 1] + slope * (x - xs[i - 1]))


def load_curve(path: str | Path) -> EpochCurve:
    """Read a CSV of `global_batch,epochs` rows (a header row is allowed)."""
    path = Path(path)
    try:
        text = path.read_text()
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as err:
        raise CurveError(f"{path}: cannot read the curve file ({err.__class__.__name__}): "
                         "check the path") from None
    rows = [r for r in csv.reader(text.splitlines()) if r and any(c.strip() for c in r)]
    if rows and not _is_number(rows[0][0]):
        rows = rows[1:]
    batches, epochs = [], []
    for n, row in enumerate(rows, start=1):
        if len(row) < 2 or not (_is_number(row[0]) and _is_number(row[1])):
            raise CurveError(f"{path}: row {n} {row!r} is not 'global_batch,epochs': write two "
                             "numbers per row")
        batches.append(float(row[0]))
        epochs.append(float(row[1]))
    return EpochCurve(global_batch=tuple(batches), epochs_at=tuple(epochs), source=str(path))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True)
class ModelDefaults:
    """What a published source says about one model's data needs."""

    dataset_size: float
    """Samples per epoch."""
    efficiency: NoiseScaleModel
    sample: str
    """What one sample is (an image, a sentence pair, a 20-token sequence)."""
    notes: str


MODEL_DEFAULTS: dict[str, ModelDefaults] = {
    # ImageNet-1k train set: 1,281,167 images (Russakovsky et al. 2015). E_min: the
    # 90-epoch schedule Goyal et al. 2017 kept up to batch 8,192. B_noise: McCandlish
    # et al. 2018 (abstract) put ImageNet's limit at "tens of thousands"; we take 30,000,
    # which gives 1.27x the epochs at batch 8,192.
    "inception_v3": ModelDefaults(
        dataset_size=1_281_167, sample="image",
        efficiency=NoiseScaleModel(
            b_noise=30_000, min_epochs=90,
            source="default inception_v3: E_min 90 epochs (Goyal et al. 2017), "
                   "B_noise 30,000 images ('tens of thousands', McCandlish et al. 2018)"),
        notes="B_noise is an order of magnitude from the paper's abstract, not a fit"),
    # WMT16 En-De: 4.5M sentence pairs; NVIDIA's GNMT v2 reference recipe
    # (DeepLearningExamples, PyTorch/Translation/GNMT) trains 6 epochs at global batch
    # 1,024 to BLEU ~24. No published noise scale for GNMT: 4,096 sentence pairs is an
    # assumption to be replaced by a measurement (--noise-scale) or a curve (--curve).
    "gnmt": ModelDefaults(
        dataset_size=4_500_000, sample="sentence pair",
        efficiency=NoiseScaleModel(
            b_noise=4_096, min_epochs=6,
            source="default gnmt: E_min 6 epochs (NVIDIA GNMT v2 recipe), "
                   "B_noise 4,096 sentence pairs ASSUMED (no published measurement)"),
        notes="B_noise assumed"),
    # One Billion Word benchmark (Chelba et al. 2013): ~0.8B training tokens, i.e. 40M
    # sequences of 20 tokens (the unroll length of Jozefowicz et al. 2016's BIG LSTM).
    # McCandlish et al. 2018 measured Billion Word LSTMs but we have not their figure's
    # number at hand: B_noise 4,096 sequences (82k tokens) and 1 epoch are assumptions.
    "biglstm": ModelDefaults(
        dataset_size=40_000_000, sample="20-token sequence",
        efficiency=NoiseScaleModel(
            b_noise=4_096, min_epochs=1,
            source="default biglstm: E_min 1 epoch, B_noise 4,096 sequences ASSUMED "
                   "(order of magnitude; McCandlish et al. 2018 measured Billion Word)"),
        notes="B_noise and E_min assumed"),
}


def model_defaults(name: str) -> ModelDefaults:
    try:
        return MODEL_DEFAULTS[name]
    except KeyError:
        raise UserError(f"no statistical-efficiency defaults for model {name!r} (known: "
                        f"{', '.join(MODEL_DEFAULTS)}): pass --curve FILE.csv or "
                        "--noise-scale X") from None


#: Samples per epoch assumed when neither the user nor a known model gives one: times to
#: accuracy scale with it; speedups, the cross-over and the sweep's ranking do not.
DEFAULT_DATASET_SIZE = 1_000_000


def dataset_size_for(given: float | None, model: str | None,
                     num_samples: int | None = None) -> float:
    """Samples per epoch: `given`, else the model's documented figure, else
    `num_samples` (the length of the model's own data set), else DEFAULT_DATASET_SIZE."""
    if given is not None:
        if not (given > 0 and math.isfinite(given)):
            raise UserError(f"--dataset-size {given}: must be a positive number of samples")
        return given
    if model in MODEL_DEFAULTS:
        return MODEL_DEFAULTS[model].dataset_size
    return float(num_samples) if num_samples else DEFAULT_DATASET_SIZE


def known_efficiency(curve: EpochCurve | None, b_noise: float | None,
                     min_epochs: float | None, model: str | None) -> StatisticalEfficiency | None:
    """The preferred source that is present: curve, then noise scale, then the model's
    defaults; None when there is none (a model of one's own: measure its noise scale)."""
    if curve is not None:
        return curve
    if b_noise is not None:
        default_epochs = (MODEL_DEFAULTS[model].efficiency.min_epochs
                          if model in MODEL_DEFAULTS else 1.0)
        return NoiseScaleModel(b_noise=b_noise,
                               min_epochs=min_epochs if min_epochs is not None else default_epochs,
                               source=f"noise scale B_noise={b_noise:g} (user)")
    if model in MODEL_DEFAULTS:
        return MODEL_DEFAULTS[model].efficiency
    return None


def efficiency_for(curve: EpochCurve | None, b_noise: float | None, min_epochs: float | None,
                   model: str | None) -> StatisticalEfficiency:
    """`known_efficiency`, refusing to go on without one."""
    found = known_efficiency(curve, b_noise, min_epochs, model)
    if found is not None:
        return found
    if model is None:
        raise UserError("no statistical-efficiency data for this graph: pass --curve "
                        "FILE.csv (global_batch,epochs) or --noise-scale X (samples)")
    return model_defaults(model).efficiency
