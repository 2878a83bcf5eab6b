"""What `jobs/train.py` is asked to do: its flags (`JobArgs`; the path flags are checked,
and --curve read, as they are parsed: orchestrator/cli/paths.py), and what is checked of
them before Ray starts (`check_job`: the model builds and imports, its batch size, its
data's first batch in --data, a sweep already in --storage)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torch.utils.data import Dataset

from orchestrator.cli import _Parser
from orchestrator.cli.paths import input_dir, loaded_by, output_dir
from orchestrator.profile.capture import GRANULARITIES
from orchestrator.sweep import EXPERIMENT
from orchestrator.train.batches import check_data
from orchestrator.train.checks import model_for_checks
from placement.cluster import PRESET_NAMES
from placement.errors import UserError
from placement.scaling.efficiency import (
    EpochCurve,
    StatisticalEfficiency,
    dataset_size_for,
    known_efficiency,
    load_curve,
)


#: The planning stage's budget: keeps `make demo` (BigLSTM tiny, 2 cores) within 3
#: minutes end to end (docs/benchmarks.md, "The job's planning stage").
DEFAULT_PLAN_TIME_LIMIT_S = 20.0
#: SGD-with-momentum learning rate at the model's batch, for a model naming none.
DEFAULT_LR = 0.05


@dataclass(frozen=True, kw_only=True)
class JobArgs:
    model: str
    preset: str
    batch_size: int | None
    """The global batch the sweep scales (x1, x2, x4); None: the model's own."""
    data: str | None
    num_gpus: int | None
    """Devices the job may use (GPUs, or CPU cores on a CPU cluster); None: all."""
    max_trials: int
    time_budget_s: float | None
    storage: Path
    resume: bool
    trial_steps: int
    final_steps: int
    cluster: str | None
    """Preset for the projection; None: dgx1-v100 with GPUs, the local cores without."""
    fake_cluster: str | None
    curve: EpochCurve | None
    """--curve as read: epochs to the target at each measured global batch."""
    noise_scale: float | None
    """Gradient noise scale B_noise in samples."""
    min_epochs: float | None
    """E_min in epochs with --noise-scale or a calibration; None: the model's, else 1."""
    dataset_size: float | None
    """Samples per epoch; None: the model's, its data set's length, else 1e6."""
    calibration_steps: int
    """Steps of the noise-scale calibration of a model without efficiency figures."""
    plan_time_limit_s: float = DEFAULT_PLAN_TIME_LIMIT_S
    """Seconds the planning stage may take over all its plans (the MILP's budget)."""
    granularity: str = "module"
    """What one op of the profiled graph is (`orchestrator profile --granularity`); the
    plans, and so the trials' workers, cut the model the same way."""

    def __post_init__(self) -> None:
        if self.max_trials < 1:
            raise UserError(f"--max-trials {self.max_trials}: must be >= 1")
        if self.num_gpus is not None and self.num_gpus < 1:
            raise UserError(f"--num-gpus {self.num_gpus}: must be >= 1")
        if self.trial_steps < 2 or self.final_steps < 1:
            raise UserError("--trial-steps must be >= 2 and --final-steps >= 1")
        if self.calibration_steps < 1:
            raise UserError(f"--calibration-steps {self.calibration_steps}: must be >= 1")
        if self.min_epochs is not None and not self.min_epochs > 0:
            raise UserError(f"--min-epochs {self.min_epochs}: must be > 0")
        if self.plan_time_limit_s <= 0:
            raise UserError(f"--plan-time-limit {self.plan_time_limit_s}: must be > 0 "
                            f"seconds (default {DEFAULT_PLAN_TIME_LIMIT_S:g})")


def parse_args(argv: Sequence[str] | None, model: str | None = None,
               prog: str = "jobs/train.py") -> JobArgs:
    """The job's flags; `model` fixes the model (a preset job has no --model flag)."""
    p = _Parser(prog=prog, description=__doc__)
    if model is None:
        p.add_argument("--model", required=True,
                       help="biglstm, gnmt, inception_v3, vgg16, or MODULE:FUNCTION (a model "
                            "of your own, importable from the working directory)")
    p.add_argument("--preset", default="tiny", choices=("tiny", "paper"))
    p.add_argument("--batch-size", type=int, default=None, dest="batch_size",
                   help="global batch the sweep scales x1, x2, x4 (default: the preset's, "
                        "or the batch of the model's ModelSpec)")
    p.add_argument("--data", type=input_dir,
                   help="dataset root in a built-in model's real layout (default: a small "
                        "synthetic dataset, nothing downloaded)")
    p.add_argument("--num-gpus", type=int, default=None, dest="num_gpus",
                   help="devices to use (default: what the cluster has)")
    p.add_argument("--max-trials", type=int, default=4, dest="max_trials")
    p.add_argument("--time-budget-s", type=float, default=None, dest="time_budget_s")
    p.add_argument("--storage", default="results", type=output_dir,
                   help="where the sweep, checkpoints and report go")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted sweep in --storage")
    p.add_argument("--trial-steps", type=int, default=6, dest="trial_steps")
    p.add_argument("--final-steps", type=int, default=20, dest="final_steps")
    p.add_argument("--cluster", choices=PRESET_NAMES, default=None,
                   help="preset whose links the projection uses")
    p.add_argument("--fake-cluster", dest="fake_cluster", metavar="NODESxGPUS",
                   help="run on a local cluster of fake-GPU nodes (testing)")
    stats = p.add_mutually_exclusive_group()
    stats.add_argument("--curve", type=loaded_by(load_curve),
                       help="CSV of global_batch,epochs measured to the target")
    stats.add_argument("--noise-scale", type=float, dest="noise_scale",
                       help="gradient noise scale B_noise in samples (default: the model's "
                            "figures, else measured in a calibration run)")
    p.add_argument("--min-epochs", type=float, dest="min_epochs",
                   help="E_min in epochs (default: the model's, else 1)")
    p.add_argument("--dataset-size", type=float, dest="dataset_size",
                   help="samples per epoch (default: the model's, the length of its data "
                        "set, else 1e6; scales the projected times, not their ranking)")
    p.add_argument("--calibration-steps", type=int, default=10, dest="calibration_steps",
                   help="steps of the noise-scale calibration (default 10)")
    p.add_argument("--plan-time-limit", type=float, default=DEFAULT_PLAN_TIME_LIMIT_S,
                   dest="plan_time_limit", help="seconds the planning stage's MILP solves "
                   f"may take in all (default {DEFAULT_PLAN_TIME_LIMIT_S:g})")
    p.add_argument("--granularity", default="module", choices=GRANULARITIES,
                   help="what one op of the placed graph is (as orchestrator profile "
                        "--granularity; default: module)")
    a = p.parse_args(argv)
    return JobArgs(model=model or a.model, preset=a.preset, batch_size=a.batch_size,
                   data=a.data, num_gpus=a.num_gpus,
                   max_trials=a.max_trials, time_budget_s=a.time_budget_s,
                   storage=Path(a.storage).resolve(), resume=a.resume,
                   trial_steps=a.trial_steps, final_steps=a.final_steps,
                   cluster=a.cluster, fake_cluster=a.fake_cluster, curve=a.curve,
                   noise_scale=a.noise_scale, min_epochs=a.min_epochs,
                   dataset_size=a.dataset_size, calibration_steps=a.calibration_steps,
                   plan_time_limit_s=a.plan_time_limit, granularity=a.granularity)


@dataclass(frozen=True, kw_only=True)
class JobInputs:
    """What the job found out about its model before Ray started."""

    base_batch: int
    """The global batch the sweep scales."""
    efficiency: StatisticalEfficiency | None
    """The given or documented statistical efficiency; None: calibrate."""
    dataset_size: float
    """Samples per epoch."""
    base_lr: float
    """Learning rate at `base_batch`: the model's own (`ModelSpec.lr`) or DEFAULT_LR at
    its batch, scaled linearly to `base_batch` (Goyal et al. 2017)."""


def base_lr(spec_lr: float | None, spec_batch: int | None, base_batch: int) -> float:
    """The learning rate at `base_batch`, from the model's at its own batch."""
    lr = DEFAULT_LR if spec_lr is None else spec_lr
    return lr if spec_batch is None else lr * base_batch / spec_batch


def check_job(args: JobArgs) -> JobInputs:
    """Everything that can be checked before Ray starts: the model builds (and its
    module imports), its batch size, its data's first batch (from --data)."""
    if (args.storage / EXPERIMENT).exists() and not args.resume:
        raise UserError(f"{args.storage} already holds a sweep: pass --resume to continue "
                        "it, or choose another --storage")
    spec = model_for_checks(args.model, args.preset)
    base_batch = spec.batch_size(args.batch_size)
    check_data(spec, data=args.data, global_batch=base_batch, dp_degree=1)
    own_samples = len(spec.data) if isinstance(spec.data, Dataset) else None
    return JobInputs(base_batch=base_batch,
                     efficiency=known_efficiency(args.curve, args.noise_scale, args.min_epochs,
                                                 args.model),
                     dataset_size=dataset_size_for(args.dataset_size, args.model, own_samples),
                     base_lr=base_lr(spec.lr, spec.batch, base_batch))
