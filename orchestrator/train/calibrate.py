"""A short calibration run that measures a model's gradient noise scale, for a model
without statistical-efficiency figures of its own (placement/scaling/efficiency.py).

Each step splits the global batch B into k equal parts, takes the gradient of each
(batch B/k) and their mean (the gradient of batch B), and trains on the mean. The two
batch sizes give unbiased estimates of |G|^2 and tr(Sigma) (McCandlish et al. 2018,
eq. A.2); as the paper does, each is averaged over the steps before their ratio
B_simple (eq. 2.9) is taken.
"""

from __future__ import annotations

import math
import statistics

import ray
import torch

from orchestrator.models import build
from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.runtime.executor import batched_inputs
from orchestrator.train.batches import BatchSource
from orchestrator.train.errors import user_errors_raised
from orchestrator.train.noise_scale import b_simple, squared_norm, trace_sigma, true_gradient_sq
from placement.errors import UserError

#: Parts a calibration step splits its batch into, the first that divides it.
NUM_PARTS = (4, 3, 2)


def num_parts(global_batch: int) -> int:
    parts = next((k for k in NUM_PARTS if global_batch % k == 0 and global_batch > k), None)
    if parts is None:
        raise UserError(f"the noise-scale calibration splits each batch into 2 to 4 equal "
                        f"parts, which batch {global_batch} does not allow: pass an even "
                        "--batch-size, or --noise-scale X or --curve FILE.csv")
    return parts


def measure_noise_scale(model: str, preset: str, *, global_batch: int, steps: int,
                        lr: float, data: str | None = None, seed: int = 0) -> float:
    """B_simple, in samples, over `steps` SGD steps (momentum 0.9) at `global_batch`
    from the model's own initial weights and data, on this process's GPU or else one
    CPU thread."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.set_num_threads(1)
    spec = build(model, preset, seed=seed)
    module = spec.module.to(device)
    source = BatchSource(spec, data=data, global_batch=global_batch, rank=0, dp_degree=1,
                         seed=seed)
    batched = batched_inputs(spec.make_batch)
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=lr, momentum=0.9)
    k = num_parts(global_batch)
    grad_sq, trace = [], []
    for step in range(steps):
        batch = [t.to(device) for t in source.batch(step)]
        part_grads = []
        for i in range(k):
            optimizer.zero_grad(set_to_none=True)
            module(*(t.tensor_split(k)[i] if b else t for t, b in zip(batch, batched))).backward()
            part_grads.append([p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                               for p in params])
        mean = [torch.stack(g).mean(0) for g in zip(*part_grads)]
        small_sq = statistics.fmean(squared_norm(g) for g in part_grads)
        big_sq = squared_norm(mean)
        grad_sq.append(true_gradient_sq(small_sq, big_sq, global_batch / k, global_batch))
        trace.append(trace_sigma(small_sq, big_sq, global_batch / k, global_batch))
        for p, g in zip(params, mean):
            p.grad = g
        optimizer.step()
    measured = b_simple(statistics.fmean(trace), statistics.fmean(grad_sq))
    if not (math.isfinite(measured) and measured > 0):
        raise UserError(f"the calibration run measured no usable noise scale (B_simple = "
                        f"{measured:.3g} over {steps} steps of batch {global_batch}): pass "
                        "more --calibration-steps, or --noise-scale X or --curve FILE.csv")
    return measured


def noise_scale_on_cluster(model: str, preset: str, *, global_batch: int, steps: int,
                           lr: float, data: str | None, kind: DeviceKind) -> float:
    """`measure_noise_scale` as a Ray task on one device of the cluster (a GPU where the
    cluster has them: the driver's node may have none); a user's error raised in it
    comes back as itself."""
    task = ray.remote(measure_noise_scale).options(num_cpus=1, num_gpus=int(kind.ray_gpus))
    with user_errors_raised(ray.exceptions.RayTaskError):
        return ray.get(task.remote(model, preset, global_batch=global_batch, steps=steps,
                                   lr=lr, data=data))
