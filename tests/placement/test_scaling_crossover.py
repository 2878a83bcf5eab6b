"""Time to accuracy and the cross-over search."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placement.cluster import preset
from placement.errors import UserError
from placement.scaling.comm import allreduce_s
from placement.scaling.crossover import HybridConfig, ScalingParams, crossover, gpu_grid, project
from placement.scaling.efficiency import NoiseScaleModel
from placement.scaling.step import WorkerStep

CLUSTER = preset("dgx1-v100")


def worker(mp: int, batch: float, compute_s: float, grad_bytes: float = 1e8,
           memory: float = 1e9) -> WorkerStep:
    return WorkerStep(mp_degree=mp, batch=batch, num_micro_batches=mp, compute_s=compute_s,
                      backward_s=compute_s * 2 / 3, gradient_bytes=grad_bytes,
                      param_bytes=grad_bytes, memory_bytes=memory)


def test_hybrid_config():
    c = HybridConfig(dp_degree=4, mp_degree=2, global_batch=256, num_micro_batches=2)
    assert c.num_gpus == 8 and c.worker_batch == 64
    with pytest.raises(ValueError, match="dp_degree=0"):
        HybridConfig(dp_degree=0, mp_degree=2, global_batch=256, num_micro_batches=2)


def test_gpu_grid():
    assert gpu_grid(1) == (1,)
    assert gpu_grid(5) == (1, 2, 4)
    assert gpu_grid(4096)[-1] == 4096 and len(gpu_grid(4096)) == 13
    with pytest.raises(UserError, match="--max-gpus 0"):
        gpu_grid(0)


def test_project_hand_computed():
    w = worker(2, 64, compute_s=0.3)
    eff = NoiseScaleModel(b_noise=1000, min_epochs=10)
    params = ScalingParams(overlap_fraction=0.5, optimizer_passes=7)
    p = project(w, 32, CLUSTER, eff, 1e6, params)
    ar = allreduce_s(32, 1e8, CLUSTER, 2)
    exposed = ar - min(0.5 * ar, 0.2)
    opt = 7 * 1e8 / CLUSTER.device.memory_bandwidth_bytes_per_s
    epochs = 10 * (1 + 2048 / 1000)
    assert p.config.global_batch == 2048 and p.config.num_gpus == 64
    assert p.exposed_allreduce_s == pytest.approx(exposed)
    assert p.step_s == pytest.approx(0.3 + exposed + opt)
    assert p.time_to_accuracy_s == pytest.approx(epochs * 1e6 / 2048 * (0.3 + exposed + opt))


@given(st.floats(0.01, 1.0), st.floats(1e6, 1e9))
def test_time_to_accuracy_grows_with_step_time_and_comm(compute, grad):
    eff = NoiseScaleModel(b_noise=1000, min_epochs=1)
    base = project(worker(1, 32, compute, grad), 64, CLUSTER, eff, 1e6, ScalingParams())
    slower = project(worker(1, 32, compute * 1.5, grad), 64, CLUSTER, eff, 1e6, ScalingParams())
    heavier = project(worker(1, 32, compute, grad * 2), 64, CLUSTER, eff, 1e6, ScalingParams())
    assert slower.time_to_accuracy_s > base.time_to_accuracy_s
    assert heavier.time_to_accuracy_s >= base.time_to_accuracy_s


def workers(mp_speedup: float) -> list[WorkerStep]:
    """Per-sample cost 1 ms on one device; an mp=2 worker runs `mp_speedup` x faster."""
    out = []
    for b in (16, 32, 64):
        out.append(worker(1, b, 1e-3 * b, grad_bytes=1e6))
        out.append(worker(2, b, 1e-3 * b / mp_speedup, grad_bytes=5e5))
    return out


def test_without_a_statistical_penalty_a_sublinear_split_never_wins():
    eff = NoiseScaleModel(b_noise=1e12, min_epochs=1)
    r = crossover(workers(1.5), CLUSTER, eff, 1e6, 1024)
    assert r.crossover_num_gpus is None
    assert all(row.speedup < 1 for row in r.rows if row.speedup is not None)


def test_a_small_noise_scale_makes_hybrid_win_at_scale_and_the_crossover_is_the_first_win():
    eff = NoiseScaleModel(b_noise=256, min_epochs=1)
    r = crossover(workers(1.5), CLUSTER, eff, 1e6, 1024)
    wins = [row.num_gpus for row in r.rows if row.hybrid_wins]
    assert wins and r.crossover_num_gpus == wins[0]
    assert r.rows[-1].speedup > 1
    # brute force: the best DP and hybrid times over every projection
    for row in r.rows:
        here = [p for p in r.projections if p.config.num_gpus == row.num_gpus]
        dp = min(p.time_to_accuracy_s for p in here if p.config.mp_degree == 1)
        assert row.dp.time_to_accuracy_s == dp
        hy = [p.time_to_accuracy_s for p in here if p.config.mp_degree > 1]
        assert (row.hybrid is None) == (not hy)
        if hy:
            assert row.hybrid.time_to_accuracy_s == min(hy)
            assert row.speedup == pytest.approx(dp / min(hy))


def test_configurations_that_do_not_fit_are_marked_not_dropped():
    ws = workers(1.5) + [worker(1, 128, 0.128, grad_bytes=1e6, memory=1e12)]
    eff = NoiseScaleModel(b_noise=1e12, min_epochs=1)
    r = crossover(ws, CLUSTER, eff, 1e6, 8)
    unfit = [p for p in r.projections if not p.fits_memory]
    assert unfit and all(p.config.worker_batch == 128 for p in unfit)
    assert all(row.dp.config.worker_batch != 128 for row in r.rows)
    assert any(not c["fits_memory"] for c in r.to_dict()["configs"])


def test_hybrid_wins_where_dp_does_not_fit():
    ws = [worker(1, 32, 0.032, memory=1e12), worker(2, 32, 0.03)]
    r = crossover(ws, CLUSTER, NoiseScaleModel(b_noise=1e6, min_epochs=1), 1e6, 4)
    assert r.rows[0].dp is None and r.crossover_num_gpus == 2
    assert r.rows[1].speedup is None and r.rows[1].hybrid_wins
