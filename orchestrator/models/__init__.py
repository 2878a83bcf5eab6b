"""The models of the research this project follows, each with presets, and a registry.

`build(name, preset, seq_chunk=None, device=None) -> ModelSpec`. A spec's `module` takes
a whole batch and returns the scalar training loss (`module(*spec.make_batch(b))`), so a
traced graph contains the loss too and a step is fully described by one module. Models:

- `biglstm`: Jozefowicz et al. 2016, 2-layer LSTM-8192-1024, sampled softmax.
- `gnmt`: Wu et al. 2016 / GNMT v2, 4+4 layers of 1024, attention, 32k vocabulary.
- `inception_v3`: Szegedy et al. 2016, 299x299, 1000 classes, auxiliary head.
- `vgg16`: Simonyan & Zisserman 2015, configuration D.

Presets: `paper` (as published) and `tiny` (a forward and backward in well under a
second on one CPU core, for tests). A model of your own: `"my_pkg.my_mod:build_fn"`,
where `build_fn()` (or `build_fn(preset)`, given the preset only when it has a parameter
named `preset`) returns a `ModelSpec`, or `(module, make_batch)` with `module(*batch)`
returning the loss, or `(module, make_batch, loss_fn)` with the loss
`loss_fn(module(*batch[:-1]), batch[-1])`; `make_batch(batch_size)` returns a tuple of
tensors. Only a `ModelSpec` carries a batch size and the model's own data (`data`);
a bare tuple gets its batch from the run (--batch-size, --global-batch) and is fed by
`make_batch`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from orchestrator.models import biglstm, gnmt, inception, vgg
from placement.errors import UserError


class UnknownModelError(UserError):
    pass


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    name: str
    preset: str
    module: nn.Module
    """forward(*batch) -> scalar loss of the step."""
    make_batch: Callable[..., tuple[torch.Tensor, ...]]
    """make_batch(batch_size, *, device='cpu', seed=0) -> the step's input tensors."""
    batch: int | None
    """The preset's batch (samples per step); None: the model names none and the run
    gives it (a user's bare (module, make_batch) pair)."""
    seq_chunk: int | None = None
    """Time steps per op for recurrent models; None for the others."""
    lr: float | None = None
    """The SGD-with-momentum learning rate the model trains at with `batch` samples a
    step; None: the job's default (orchestrator/job_args.py DEFAULT_LR)."""
    data: Dataset | Callable[[int, int, int], Iterable[tuple[torch.Tensor, ...]]] | None = None
    """The model's own training data; None: `make_batch` feeds the steps. Either a
    `torch.utils.data.Dataset` whose items are one sample's tensors in the order of
    `module(*batch)` (each worker takes its rows of every global batch), or a function
    `data(rank, world_size, batch_size)` yielding worker `rank`'s batches of
    `batch_size` samples (its share of the global batch, disjoint from the other
    workers'), one per step."""

    def __post_init__(self) -> None:
        if self.batch is not None and self.batch < 1:
            raise UserError(f"model {self.name}: batch={self.batch} must be >= 1")
        if self.lr is not None and not self.lr > 0:
            raise UserError(f"model {self.name}: lr={self.lr} must be > 0")
        if self.data is not None and not (isinstance(self.data, Dataset)
                                          or callable(self.data)):
            raise UserError(f"model {self.name}: data is a {type(self.data).__name__}: give "
                            "a torch.utils.data.Dataset or a function (rank, world_size, "
                            "batch_size) yielding batches")

    def batch_size(self, given: int | None, flag: str = "--batch-size") -> int:
        """Samples per step: `given` (the run's `flag`) or else the spec's own batch."""
        if given is not None:
            if given < 1:
                raise UserError(f"{flag} {given}: must be >= 1")
            return given
        if self.batch is None:
            raise UserError(f"model {self.name} names no batch size: pass {flag} N, or "
                            "return a ModelSpec with batch=N from the builder")
        return self.batch


_MODELS = {
    "biglstm": (biglstm.PRESETS, biglstm.BigLSTM, biglstm.make_batch),
    "gnmt": (gnmt.PRESETS, gnmt.GNMT, gnmt.make_batch),
    "inception_v3": (inception.PRESETS, inception.InceptionV3, inception.make_batch),
    "vgg16": (vgg.PRESETS, vgg.VGG16, vgg.make_batch),
}

MODEL_NAMES = tuple(_MODELS)
PRESET_NAMES = ("paper", "tiny")


def build(name: str, preset: str = "tiny", *, seq_chunk: int | None = None,
          device: str | torch.device | None = None, seed: int = 0) -> ModelSpec:
    """Build a model (weights initialised from `seed`) on `device` ('meta': no memory)."""
    if ":" in name:
        return _build_user(name, preset, device, seed)
    if name not in _MODELS:
        raise UnknownModelError(
            f"unknown model {name!r}: choose one of {', '.join(MODEL_NAMES)}, or give "
            "MODULE:FUNCTION for a model of your own")
    presets, cls, make_batch = _MODELS[name]
    if preset not in presets:
        raise UnknownModelError(
            f"model {name} has no preset {preset!r}: choose one of {', '.join(presets)}")
    cfg = presets[preset]
    if seq_chunk is not None:
        if not hasattr(cfg, "seq_chunk"):
            raise UserError(f"--seq-chunk applies to recurrent models only; {name} has no "
                            "time steps: leave it out")
        if seq_chunk < 1:
            raise UserError(f"--seq-chunk {seq_chunk} must be >= 1 time step")
        cfg = dataclasses.replace(cfg, seq_chunk=seq_chunk)
    torch.manual_seed(seed)
    with torch.device(device or "cpu"):
        module = cls(cfg)

    def batch_fn(batch: int, *, device: str | torch.device = "cpu", seed: int = 0):
        return make_batch(cfg, batch, device=device, seed=seed)

    return ModelSpec(name=name, preset=preset, module=module, make_batch=batch_fn,
                     batch=cfg.batch, seq_chunk=getattr(cfg, "seq_chunk", None),
                     lr=getattr(cfg, "lr", None))


class WithLoss(nn.Module):
    """A user's (module, loss_fn) pair as one module returning the loss; the last batch
    tensor is the target. Built by `with_loss`, which gives `forward` one named
    parameter per batch tensor (torch.fx traces the class's forward and cannot trace
    `*args`)."""

    def __init__(self, model: nn.Module, loss_fn: Callable) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn


def with_loss(model: nn.Module, loss_fn: Callable, num_tensors: int) -> WithLoss:
    if num_tensors < 2:
        raise UserError(f"a (module, make_batch, loss_fn) model needs inputs and a "
                        f"target, but make_batch returned {num_tensors} tensor(s): "
                        "return (inputs..., target)")
    names = [f"x{i}" for i in range(num_tensors)]
    scope: dict[str, object] = {}
    exec(f"def forward(self, {', '.join(names)}):\n"  # noqa: S102 - fixed arity only
         f"    return self.loss_fn(self.model({', '.join(names[:-1])}), {names[-1]})",
         scope)
    cls = type(f"WithLoss{num_tensors}", (WithLoss,), {"forward": scope["forward"]})
    return cls(model, loss_fn)


def _builder_failed(ref: str, err: Exception) -> UserError:
    """The user's builder raised: the error and where, in one line (the builder is the
    user's code, so the failure is theirs to fix, and its traceback is one call away)."""
    where = traceback.extract_tb(err.__traceback__)[-1]
    message = str(err).strip().splitlines()[0][:160] if str(err).strip() else ""
    return UserError(f"{ref} raised {type(err).__name__}{': ' + message if message else ''} "
                     f"(at {where.filename}:{where.lineno}): fix the function; calling it "
                     "alone shows the whole traceback")


def _build_user(ref: str, preset: str, device, seed: int) -> ModelSpec:
    fn = _builder(ref)
    torch.manual_seed(seed)

    def call():
        return fn(preset=preset) if "preset" in inspect.signature(fn).parameters else fn()

    try:
        with torch.device(device or "cpu"):
            built = call()
    except (NotImplementedError, RuntimeError) as err:
        in_fake_mode = torch._guards.detect_fake_mode() is not None
        if str(device) != "meta" and not in_fake_mode:
            raise _builder_failed(ref, err) from err
        built = _built_on_meta(call, device or "cpu") if in_fake_mode else None
        if built is None:
            # Meta tensors have shapes and no values: a builder that reads or makes
            # data (a dataset, weights from a file) cannot run there, and that is no
            # bug of its.
            raise UserError(f"{ref} cannot be built on the meta device "
                            f"({type(err).__name__}: "
                            f"{str(err).strip().splitlines()[0][:160]}): profile it where "
                            "its tensors hold values, --device cpu (or cuda)") from err
    except UserError:
        raise  # a builder that calls this package's API keeps that API's message
    except Exception as err:
        raise _builder_failed(ref, err) from err
    if isinstance(built, ModelSpec):
        if built.name in _MODELS:
            raise UserError(f"{ref} returned a ModelSpec named {built.name!r}, the name of a "
                            "built-in model: give it a name of its own")
        return built
    if not isinstance(built, tuple) or len(built) not in (2, 3):
        raise UserError(f"{ref} returned {type(built).__name__}: return a ModelSpec, "
                        "(module, make_batch) or (module, make_batch, loss_fn)")
    module, user_batch = built[0], built[1]
    if len(built) == 3:
        module = with_loss(module, built[2], len(user_batch(1)))

    def batch_fn(batch: int, *, device: str | torch.device = "cpu", seed: int = 0):
        # Seeded on a fork of the RNG: drawing a batch leaves training's random stream
        # (dropout, the next batch) where it was.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return tuple(t.to(device) for t in user_batch(batch))

    return ModelSpec(name=ref, preset=preset, module=module, make_batch=batch_fn, batch=None)


def _built_on_meta(call: Callable, device: str | torch.device):
    """`call()` run on the meta device outside the active FakeTensorMode, its module's
    tensors then made that mode's (empty, of the same shapes, on `device`). An operator
    capture builds in a FakeTensorMode (`profile.api._tensors_for`), where torch also
    runs the builder's weight init on the fake tensors; an init that branches on values
    cannot run there (torch 2.13's `trunc_normal_` is a rejection loop: ViT, DeiT and
    Swin in transformers initialise with it). On the meta device torch skips the values
    and transformers skips init altogether. Hand-written: `Module.to_empty` makes a new
    tensor per module that holds one, so a tied weight would come out as two (and with
    swap_module_params_on_conversion it cannot swap a meta parameter for a fake one)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    try:
        with unset_fake_temporarily(), torch.device("meta"):
            built = call()
    except (NotImplementedError, RuntimeError):
        return None
    module = built.module if isinstance(built, ModelSpec) else (
        built[0] if isinstance(built, tuple) and built else None)
    if isinstance(module, nn.Module):
        _fake_in_place(module, device)
    return built


def _fake_in_place(module: nn.Module, device: str | torch.device) -> None:
    """Each meta parameter and buffer of `module` replaced by an empty tensor of the
    active mode on `device`, a tensor that several modules hold by one tensor."""
    made: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, tensor in table.items():
                if tensor is None or not tensor.is_meta:
                    continue
                if id(tensor) not in made:
                    empty = torch.empty_like(tensor, device=device)
                    made[id(tensor)] = (nn.Parameter(empty, requires_grad=tensor.requires_grad)
                                        if isinstance(tensor, nn.Parameter) else empty)
                table[name] = made[id(tensor)]


def _builder(ref: str) -> Callable:
    """The function `ref` names, checked to be callable with no argument but `preset`."""
    module_name, _, fn_name = ref.partition(":")
    # MODULE is looked up in the current directory too, as `python -m` would: the
    # `orchestrator` script and jobs/*.py are started from elsewhere (and local Ray's
    # workers get the driver's current directory on their path).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as err:
        raise UnknownModelError(
            f"cannot load model builder {ref!r} ({err}): give MODULE:FUNCTION of an "
            f"importable function, or one of {', '.join(MODEL_NAMES)}") from None
    if not callable(fn):
        raise UnknownModelError(f"{ref} is a {type(fn).__name__}, not a function: give "
                                "MODULE:FUNCTION of a model builder")
    required = [name for name, p in inspect.signature(fn).parameters.items()
                if name != "preset" and p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise UserError(f"{ref} needs argument(s) {', '.join(required)}: a model builder "
                        "takes none, or only one named preset")
    return fn
