"""The loop each Ray Train worker runs: one model-parallel group executing its plan,
allreducing gradients with the other workers, checkpointing the whole state."""

from __future__ import annotations

import os
import random
import statistics
import signal
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import ray.train
import torch
import torch.distributed as dist

from orchestrator.profile import partition
from orchestrator.runtime.executor import OpPartition, PlanExecutor, batched_inputs
from orchestrator.train.batches import BatchSource
from orchestrator.train.config import TrainConfig
from orchestrator.train.noise_scale import NoiseScaleEstimator
from placement.scaling.efficiency import examples_to_target
from placement.plan import plan_from_dict

STATE_FILE = "state.pt"


def worker_devices(cfg: TrainConfig) -> list[torch.device]:
    """The worker's mp_degree devices: its GPUs, or CPU threads on a CPU host (and on
    fake-GPU test clusters, whose GPUs exist only in Ray's bookkeeping)."""
    if cfg.use_gpu and torch.cuda.is_available():
        devices = ray.train.torch.get_devices()
        assert len(devices) == cfg.mp_degree, (devices, cfg.mp_degree)
        return list(devices)
    return [torch.device("cpu")] * cfg.mp_degree


class DDPSync:
    """One device per worker: torch's DDP allreduces gradient buckets while the backward
    still runs; its communication hook notes each bucket's local squared norm (before
    averaging) for the noise scale."""

    def __init__(self, module: torch.nn.Module):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        self.ddp = torch.nn.parallel.DistributedDataParallel(module, device_ids=None)
        self.local_sq = 0.0

        def hook(state, bucket):
            self.local_sq += float(bucket.buffer().pow(2).sum())
            return default_hooks.allreduce_hook(None, bucket)

        self.ddp.register_comm_hook(None, hook)
        self.params = [p for p in module.parameters() if p.requires_grad]

    def launch(self, device: int) -> None:
        """Nothing left to launch: DDP sent every bucket during the backward."""

    def finish(self) -> tuple[float, float]:
        local_sq, self.local_sq = self.local_sq, 0.0
        # One fused norm over all gradients (Inception has ~300 parameter tensors).
        global_sq = float(torch.nn.utils.get_total_norm([_grad(p) for p in self.params])) ** 2
        return local_sq, global_sq


class GradientSync:
    """Averages gradients over the workers, one bucket per local device, each on its own
    process group (so devices finishing in different orders on different workers never
    interleave their collectives), launched as soon as that device's backward is done."""

    def __init__(self, params_by_device: list[list[torch.nn.Parameter]], world: int):
        self.params_by_device = params_by_device
        self.world = world
        self.groups = ([dist.new_group(backend=dist.get_backend())
                        for _ in params_by_device] if world > 1 else [])
        self.pending: dict[int, tuple[object, torch.Tensor]] = {}
        self.local_sq: dict[int, float] = {}

    def launch(self, device: int) -> None:
        if self.world == 1:
            return
        params = self.params_by_device[device]
        flat = torch.cat([_grad(p).reshape(-1) for p in params]) if params else torch.zeros(1)
        self.local_sq[device] = float(flat.double().pow(2).sum())
        self.pending[device] = (dist.all_reduce(flat, group=self.groups[device],
                                                async_op=True), flat)

    def finish(self) -> tuple[float, float] | None:
        """Wait for every bucket and install the averaged gradients; returns this
        worker's |local gradient|^2 and the |averaged gradient|^2 (for the noise scale),
        or None with a single worker."""
        if self.world == 1:
            return None
        global_sq = 0.0
        for device, params in enumerate(self.params_by_device):
            if device not in self.pending:
                self.launch(device)
            work, flat = self.pending.pop(device)
            work.wait()
            flat /= self.world
            global_sq += float(flat.double().pow(2).sum())
            offset = 0
            for p in params:
                n = p.numel()
                p.grad = flat[offset:offset + n].view_as(p).to(p.device)
                offset += n
        local_sq = sum(self.local_sq.values())
        self.local_sq.clear()
        return local_sq, global_sq


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)


def _params_by_device(part, assignment: Mapping[int, int], model: torch.nn.Module,
                      num_devices: int) -> list[list[torch.nn.Parameter]]:
    named = dict(model.named_parameters())
    owner: dict[str, int] = {}
    for op in part.ops:
        for name in op.params:
            owner.setdefault(name, assignment[op.id])
    buckets: list[list[torch.nn.Parameter]] = [[] for _ in range(num_devices)]
    for name, param in named.items():
        buckets[owner.get(name, 0)].append(param)
    return buckets


def _maybe_fail(cfg: TrainConfig, step: int, rank: int, marker_dir: str | None) -> None:
    """Test hook: fail once (a marker file remembers it) at each injected step, rank 0."""
    modes = [mode for at, mode in cfg.inject_failures if at == step]
    if not modes or rank != 0 or marker_dir is None:
        return
    marker = Path(marker_dir) / f"failed-at-{step}"
    if marker.exists():
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    if modes[0] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected failure at step {step} (test hook)")


def _projection(projection: Mapping | None, noise: NoiseScaleEstimator, global_batch: int,
                step_times: list[float]) -> dict[str, float]:
    """The scaling model's time to accuracy at this run's median step time, and the
    gradient noise scale this run measured (with several workers, once positive).

    The projection keeps the job's statistical efficiency (one B_noise for every trial of
    a sweep): a noise scale measured in a few steps of a tiny run is too noisy to rank
    trials by, and trials of one worker cannot measure it at all."""
    metrics = {}
    if noise.grad_sq is not None and noise.grad_sq > 0 and noise.trace > 0:
        metrics["noise_scale"] = noise.b_simple
    if projection:
        steps = examples_to_target(projection["min_epochs"] * projection["dataset_size"],
                                   projection["b_noise"], global_batch) / global_batch
        metrics["projected_time_s"] = steps * statistics.median(step_times)
    return metrics


def _save(model, optimizer, step: int, history: dict) -> ray.train.Checkpoint:
    directory = tempfile.mkdtemp(prefix="ckpt-")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, "history": history,
                "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                        "python": random.getstate()}},
               Path(directory) / STATE_FILE)
    return ray.train.Checkpoint.from_directory(directory)


def _restore(model, optimizer, resume_from: str | None) -> tuple[int, dict]:
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None and resume_from is not None:
        checkpoint = ray.train.Checkpoint.from_directory(resume_from)
    if checkpoint is None:
        return 0, {"losses": [], "step_times_s": []}
    with checkpoint.as_directory() as directory:
        state = torch.load(Path(directory) / STATE_FILE, weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return state["step"], state["history"]


def train_loop_per_worker(config: dict) -> dict:
    train = config["train"]
    cfg = TrainConfig(**{**train, "inject_failures": tuple(map(tuple, train["inject_failures"]))})
    plan = plan_from_dict(config["plan"])
    torch.set_num_threads(1)  # one core per device: a worker's devices are its threads
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    devices = worker_devices(cfg)
    part, spec = partition(cfg.model, preset=cfg.preset, seed=cfg.seed)
    model = spec.module
    executor = PlanExecutor(
        OpPartition(part.module, {op.id: op.nodes for op in part.ops}), plan.assignment,
        plan.order, devices, num_micro_batches=cfg.num_micro_batches,
        batched=batched_inputs(spec.make_batch),
        autocast_dtype=torch.bfloat16 if cfg.mixed_precision else None)
    if world > 1 and len(devices) == 1:
        sync = DDPSync(part.module)
        executor.whole_module = sync.ddp
    else:
        sync = GradientSync(_params_by_device(part, plan.assignment, model, len(devices)),
                            world)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    start, history = _restore(model, optimizer, config.get("resume_from"))
    global_batch = cfg.global_batch or spec.batch
    source = BatchSource(spec, data=cfg.data, global_batch=global_batch, rank=rank,
                         dp_degree=world, seed=cfg.seed)
    noise = NoiseScaleEstimator()
    for step in range(start, cfg.steps):
        _maybe_fail(cfg, step, rank, config.get("marker_dir"))
        batch = source.batch(step)
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = executor.step(batch, global_batch // world, on_device_done=sync.launch)
        norms = sync.finish()
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad_norm)
        optimizer.step()
        step_time = time.perf_counter() - started
        # One allreduce for the loss and the local gradient norm (both averaged).
        scalars = torch.tensor([loss, norms[0] if norms else 0.0], dtype=torch.float64)
        if world > 1:
            dist.all_reduce(scalars)
            scalars /= world
            noise.update(float(scalars[1]), norms[1], global_batch / world, global_batch)
        history["losses"].append(float(scalars[0]))
        history["step_times_s"].append(step_time)
        metrics = {"step": step + 1, "loss": history["losses"][-1], "step_time_s": step_time,
                   "samples_per_s": global_batch / step_time,
                   **_projection(config.get("projection"), noise, global_batch,
                                 history["step_times_s"])}
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            checkpoint = _save(model, optimizer, step + 1, history) if rank == 0 else None
            ray.train.report(metrics, checkpoint=checkpoint)
        else:
            ray.train.report(metrics)
    node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
    me = {"rank": rank, "node_id": node_id,
          "devices": [str(d) for d in devices]}
    workers = [None] * world
    if world > 1:
        dist.all_gather_object(workers, me)
    else:
        workers = [me]
    return {**history, "workers": workers,
            "final_params": {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}}
