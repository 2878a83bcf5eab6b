"""The loop each Ray Train worker runs: one model-parallel group executing its plan,
allreducing gradients with the other workers, checkpointing the whole state."""

from __future__ import annotations

import os
import random
import statistics
import signal
import tempfile
import time
from pathlib import Path

import numpy as np
import ray.train
import torch
import torch.distributed as dist

from orchestrator.runtime.devices import (load_state, plan_devices,
                                          random_streams_and_buffers_kept, synchronize)
from orchestrator.train.batches import BatchSource
from orchestrator.train.config import TrainConfig
from orchestrator.train.job import PROBE, TIMED_HERE, Projection, WorkerJob
from orchestrator.train.step_breakdown import WARMUP_STEPS, StepClock, device_timer
from orchestrator.train.speed_probe import SpeedProbe
from orchestrator.train.step_timing import time_in_worker
from orchestrator.train.sync import collective_device
from orchestrator.train.noise_scale import NoiseScaleEstimator
from orchestrator.train.worker_executor import build_executor, gradient_sync

STATE_FILE = "state.pt"

#: Seconds between metric-only reports. Train V2's controller takes one report per
#: worker per poll, every 2 s (RAY_TRAIN_HEALTH_CHECK_INTERVAL_S), and a worker's
#: report blocks until the previous one is taken: reporting every 25 ms step, a run of
#: 40 tiny-BigLSTM steps took 118 s where one of 5 took 49 s (about 2 s a step).
REPORT_INTERVAL_S = 2.0
#: Steps between two runs of the host-speed probe (after the step's clock stops): 15
#: probes in a 60-step trial, each about 0.6 ms beside a tiny BigLSTM step of 10-20 ms.
#: The step after a probe, which takes some 5% longer (speed_probe.py), is left out of
#: the medians.
PROBE_EVERY = 4


def worker_devices(cfg: TrainConfig) -> list[torch.device]:
    """The torch device of each of the worker's mp_degree plan devices: its GPUs, or
    CPU threads on a CPU host and on fake-GPU test clusters."""
    cuda = torch.cuda.is_available()
    return plan_devices(cfg.mp_degree, kind=cfg.device_kind, cuda_available=cuda,
                        visible=(ray.train.torch.get_devices()
                                 if cfg.device_kind.cuda and cuda else []),
                        node=_node_name())


def _node_name() -> str:
    if not ray.is_initialized():
        return "local"
    return (f"{ray.util.get_node_ip_address()} "
            f"(Ray node {ray.get_runtime_context().get_node_id()[:12]})")


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


def _projection(projection: Projection | None, noise: NoiseScaleEstimator,
                global_batch: int, step_times: list[float]) -> dict[str, float]:
    """The scaling model's time to accuracy at this run's median step time, and the
    gradient noise scale this run measured (with several workers, once positive)."""
    metrics = {}
    if noise.grad_sq is not None and noise.grad_sq > 0 and noise.trace > 0:
        metrics["noise_scale"] = noise.b_simple
    if projection is not None:
        metrics["projected_time_s"] = projection.time_to_accuracy_s(
            global_batch, statistics.median(step_times))
    return metrics


def _save(directory: str, model, optimizer, step: int, history: dict) -> ray.train.Checkpoint:
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
        state = load_state(Path(directory) / STATE_FILE)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    np.random.set_state(state["rng"]["numpy"])
    random.setstate(state["rng"]["python"])
    return state["step"], state["history"]


class HybridWorker:
    """One Ray Train worker: a model-parallel group executing its plan on its devices,
    allreducing gradients with the other workers, checkpointing the whole state.
    Built inside a Ray Train worker (it reads the train context)."""

    def __init__(self, job: WorkerJob) -> None:
        self.cfg = cfg = job.train
        self.marker_dir = job.marker_dir
        self.projection = job.projection
        self.plan = plan = job.plan
        self.time_batches = job.time_batches
        #: This trial's own timing of its step, as every report carries it.
        self.timed_here: dict | None = None
        torch.set_num_threads(1)  # one core per device: a worker's devices are its threads
        ctx = ray.train.get_context()
        self.rank, self.world = ctx.get_world_rank(), ctx.get_world_size()
        self.devices = worker_devices(cfg)
        # Parameters reach their devices before DDP, the buckets and the optimizer
        # are built from them.
        planned = build_executor(cfg.model, preset=cfg.preset, seed=cfg.seed, plan=plan,
                                 devices=self.devices, num_micro_batches=cfg.num_micro_batches,
                                 mixed_precision=cfg.mixed_precision)
        self.planned = planned
        spec, self.executor = planned.spec, planned.executor
        self.model = spec.module
        self.backend = dist.get_backend() if self.world > 1 else "gloo"
        self.sync = gradient_sync(planned, plan, self.devices, self.world)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=0.9)
        self.start, self.history = _restore(self.model, self.optimizer, job.resume_from)
        self.global_batch = cfg.global_batch or spec.batch
        self.source = BatchSource(spec, data=cfg.data, global_batch=self.global_batch,
                                  rank=self.rank, dp_degree=self.world, seed=cfg.seed)
        self.noise = NoiseScaleEstimator()
        self.last_report = time.monotonic()
        self.unreported: list[float] = []  # step times since the last report
        self.clock = StepClock(device_timer=device_timer(self.devices))
        # Only a sweep trial (one that times itself) probes the host: its probes explain
        # its measured step against the prediction that ranked it. A final or user run
        # pays neither the buffers nor the pause every PROBE_EVERY steps.
        self.probe = SpeedProbe() if self.time_batches else None
        self.probes_s: list[float] = []  # every host-speed probe of this run
        #: Whether the step under way follows a probe: timed, but left out of the medians
        #: (measured step, projected time) like the warm-up.
        self.after_probe = False
        self.counted_s: list[float] = []  # the step times the medians count

    def train_step(self, step: int) -> dict[str, float]:
        """Step `step` (0-based): train, and return its metrics (`step_time_s`: the
        median since the last report); report them with a checkpoint when one is due,
        and without one once `REPORT_INTERVAL_S` has passed since the last report."""
        cfg, world = self.cfg, self.world
        _maybe_fail(cfg, step, self.rank, self.marker_dir)
        clock = self.clock
        clock.start(counted=not self.after_probe)
        batch = self.source.batch(step)
        clock.mark("data")
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.executor.step(batch, self.global_batch // world,
                                  on_device_done=self.sync.launch)
        clock.mark("compute")
        norms = self.sync.finish()
        clock.mark("allreduce")
        if cfg.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad_norm)
        self.optimizer.step()
        # The step's time is a value the host needs: wait for the devices once here.
        synchronize(self.devices)
        clock.mark("optimizer")
        step_time = clock.current_modelled_s()
        # One allreduce for the loss, the local gradient norm (both averaged) and
        # whether any worker is due to report, so that all report at the same steps.
        due = time.monotonic() - self.last_report >= REPORT_INTERVAL_S
        scalars = torch.tensor([loss, norms[0] if norms else 0.0, float(due)],
                               dtype=torch.float64,
                               device=collective_device(self.backend, self.devices[0]))
        if world > 1:
            dist.all_reduce(scalars)
        scalars = scalars.cpu()
        clock.mark("idle")
        if world > 1:
            scalars[:2] /= world
            self.noise.update(float(scalars[1]), norms[1], self.global_batch / world,
                              self.global_batch)
        self.history["losses"].append(float(scalars[0]))
        self.history["step_times_s"].append(step_time)
        if not self.after_probe:
            self.counted_s.append(step_time)
        self.unreported.append(step_time)
        median_step = statistics.median(self.unreported)
        metrics = {"step": step + 1, "loss": self.history["losses"][-1],
                   "step_time_s": median_step, "samples_per_s": self.global_batch / median_step,
                   **_projection(self.projection, self.noise, self.global_batch,
                                 self.counted_s[WARMUP_STEPS:] or self.counted_s
                                 or self.history["step_times_s"]),
                   **clock.medians()}
        if self.timed_here is not None:
            metrics[TIMED_HERE] = self.timed_here
        if self.probes_s:
            metrics[PROBE] = statistics.median(self.probes_s)
        checkpoint_due = (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps
        report_due = bool(scalars[2] > 0)
        if checkpoint_due:
            # report() copies the checkpoint to the run's storage before it returns, so
            # the local copy goes with the block: one per checkpoint had been left in
            # /tmp for good (a full model and optimizer state each, on every rank-0 node).
            with tempfile.TemporaryDirectory(prefix="ckpt-") as directory:
                checkpoint = (_save(directory, self.model, self.optimizer, step + 1,
                                    self.history)
                              if self.rank == 0 else None)
                ray.train.report(metrics, checkpoint=checkpoint)
        elif report_due:
            ray.train.report(metrics)
        if checkpoint_due or report_due:
            self.last_report = time.monotonic()
            self.unreported.clear()
        clock.mark("reporting")
        clock.finish()
        self.after_probe = (self.probe is not None and self.rank == 0
                            and (step + 1) % PROBE_EVERY == 0)
        if self.after_probe:
            # Rank 0 alone, whose metrics are the trial's: two probes at once share the
            # cache (an e2e run's dp 2 trials probed 0.72-0.83 ms against the driver's
            # single 0.45-0.62). Outside the step's clock; the next step, which finds
            # part of its data evicted (4.7% slower, speed_probe.py), is left out of the
            # medians, and the other workers wait for the probe at its allreduce.
            self.probes_s.append(self.probe())
        return metrics

    def time_here(self) -> None:
        """Time this worker's step at `time_batches` with every worker of the run
        (step_timing.py `time_in_worker`); the steps' reports carry it from then on.
        The training goes on as if nothing had run: the timing updates nothing (lr 0),
        and the random streams and the module's buffers (e.g. batch norm's running
        statistics) come back as they were."""
        # The timing reads the host's clock without a device synchronize: the pipeline
        # asks for it only where the devices are CPU threads (GPU jobs rank by the
        # scaling model's step).
        assert all(d.type == "cpu" for d in self.devices), self.devices
        with random_streams_and_buffers_kept([self.model], self.devices):
            self.timed_here = time_in_worker(self.planned, self.sync, self.plan,
                                             self.time_batches, world=self.world,
                                             probe=self.probe if self.rank == 0 else None
                                             ).to_dict()
        # The report interval counts from the first step, not from before the timing.
        self.last_report = time.monotonic()

    def result(self) -> dict:
        """The run's history, where every worker ran, and the final parameters."""
        node_id = ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"
        me = {"rank": self.rank, "node_id": node_id,
              "devices": [str(d) for d in self.devices]}
        workers = [None] * self.world
        if self.world > 1:
            dist.all_gather_object(workers, me)
        else:
            workers = [me]
        return {**self.history, "workers": workers,
                "final_params": {k: v.detach().cpu().numpy()
                                 for k, v in self.model.state_dict().items()}}


def train_loop_per_worker(config: dict) -> dict:
    """Ray Train's entry point: `config` is a `WorkerJob.to_dict()`."""
    worker = HybridWorker(WorkerJob.from_dict(config))
    if worker.time_batches:
        # Before the first step, so that every report carries it: ASHA may stop a trial
        # at any report, and a trial's last report may not reach Tune (a recorded e2e
        # trial's last result was its step-55 report of 60). The run's own start-ups
        # (Ray Train's DatasetManager) fall on the worker's set-up, which outlasts them.
        worker.time_here()
    for step in range(worker.start, worker.cfg.steps):
        worker.train_step(step)
    return worker.result()
