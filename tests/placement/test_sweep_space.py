"""The sweep space: every mp_degree that fits, the batches around each one's best."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placement.cluster import preset
from placement.scaling.crossover import HybridConfig, ScalingParams, project
from placement.scaling.efficiency import NoiseScaleModel
from placement.scaling.step import WorkerStep
from placement.scaling.timed_step import TimedStep
from placement.sweep_space import (BATCH_MULTIPLES, MODELLED, NUM_NEIGHBOURS, TIMED, Candidate,
                                   best_per_mp_degree, scanned_worker_batches, sweep_space)

CLUSTER = preset("dgx1-v100")
EFFICIENCY = NoiseScaleModel(b_noise=256, min_epochs=1)
DATASET = 1e6


def step_model(mp: int, fixed_s: float, per_sample_s: float, micro: int = 1,
               memory: float = 1e8):
    def at(batch: float) -> WorkerStep:
        compute = (fixed_s + per_sample_s * batch) / mp
        return WorkerStep(mp_degree=mp, batch=batch, num_micro_batches=micro, compute_s=compute,
                          backward_s=compute * 2 / 3, gradient_bytes=1e6, param_bytes=1e6,
                          memory_bytes=memory)
    return at


def space(models, num_gpus=8, base_batch=16, timed=None):
    return sweep_space(models, CLUSTER, base_batch=base_batch, num_gpus=num_gpus,
                       efficiency=EFFICIENCY, dataset_size=DATASET, base_lr=0.1, timed=timed)


def brute_force_keys(models, num_gpus, base_batch):
    """Every (mp, batch) scanned, projected one by one; per mp the best and its
    neighbours in the scan."""
    keys = set()
    for mp, model in models.items():
        if mp > num_gpus:
            continue
        dp = num_gpus // mp
        times = []
        for k in BATCH_MULTIPLES:
            w = model(base_batch * k / dp)
            if (base_batch * k) % (dp * w.num_micro_batches):
                continue
            p = project(w, dp, CLUSTER, EFFICIENCY, DATASET, ScalingParams())
            if p.fits_memory:
                times.append((p.time_to_accuracy_s, base_batch * k))
        if times:
            best = min(range(len(times)), key=lambda i: times[i][0])
            for _, gb in times[max(0, best - NUM_NEIGHBOURS):best + NUM_NEIGHBOURS + 1]:
                keys.add(f"mp{mp}-b{gb}")
    return keys


@settings(deadline=None, max_examples=40)
@given(st.dictionaries(st.sampled_from([1, 2, 4, 8, 16]),
                       st.tuples(st.floats(1e-4, 1e-1), st.floats(1e-6, 1e-2),
                                 st.sampled_from([1, 2, 4])), min_size=1, max_size=4),
       st.sampled_from([8, 16, 32]))
def test_the_space_is_each_mp_degrees_best_and_its_neighbours(spec, base_batch):
    models = {mp: step_model(mp, f, s, micro) for mp, (f, s, micro) in spec.items()}
    got = space(models, num_gpus=8, base_batch=base_batch)
    assert {c.key() for c in got} == brute_force_keys(models, 8, base_batch)
    assert [c.predicted_time_s for c in got] == sorted(c.predicted_time_s for c in got)
    for c in got:
        assert c.dp_degree * c.mp_degree == 8
        assert c.global_batch % (c.dp_degree * c.num_micro_batches) == 0
        assert c.lr == pytest.approx(0.1 * c.global_batch / base_batch)


def test_every_mp_degree_that_fits_is_covered_and_one_that_does_not_is_left_out():
    models = {1: step_model(1, 0.01, 1e-3), 2: step_model(2, 0.01, 1e-3),
              4: step_model(4, 0.01, 1e-3, memory=1e12),  # no batch fits a V100
              16: step_model(16, 0.01, 1e-3)}  # more devices than the job has
    got = space(models, num_gpus=8)
    assert {c.mp_degree for c in got} == {1, 2}
    best = best_per_mp_degree(got)
    assert set(best) == {1, 2}
    for mp, c in best.items():
        assert c.predicted_time_s == min(o.predicted_time_s for o in got if o.mp_degree == mp)


def test_a_best_inside_the_scan_keeps_a_batch_on_each_side():
    # Overhead-bound at small batches, the statistical efficiency caps the largest:
    # the best sits inside the scan (sqrt(B_noise * fixed / per-sample) = 256).
    got = space({1: step_model(1, 0.0256, 1e-4)}, num_gpus=1, base_batch=64)
    batches = sorted(c.global_batch for c in got)
    assert len(batches) == 3 and batches[0] * 4 == batches[2]


def test_candidate_round_trip():
    c = Candidate(config=HybridConfig(dp_degree=2, mp_degree=2, global_batch=64,
                                      num_micro_batches=4),
                  lr=0.2, predicted_step_s=0.01, predicted_time_s=100.0)
    assert Candidate.from_dict(c.to_dict()) == c
    assert c.key() == "mp2-b64"


def timed_like(models, num_gpus, base_batch, compute_of_batch):
    """A TimedStep per mp_degree at the worker batches the space may hold, its compute
    `compute_of_batch(mp, batch)` (a multi-device step almost flat in the batch), its
    allreduce 1 ms + 0.1 ms a sample (timed with the job's num_gpus // mp workers)."""
    batches = scanned_worker_batches(models, CLUSTER, base_batch=base_batch, num_gpus=num_gpus,
                                     efficiency=EFFICIENCY, dataset_size=DATASET)
    return {m: TimedStep(mp_degree=m, dp_degree=num_gpus // m,
                         num_micro_batches=models[m](bs[0]).num_micro_batches,
                         batches=tuple(bs), compute_s=tuple(compute_of_batch(m, b) for b in bs),
                         allreduce_s=tuple(1e-3 + 1e-4 * b for b in bs),
                         optimizer_s=0.002, rounds=3)
            for m, bs in batches.items()}


def test_the_worker_batches_to_time_are_those_the_scan_keeps():
    models = {1: step_model(1, 0.01, 1e-3), 2: step_model(2, 0.01, 1e-3, micro=4),
              4: step_model(4, 0.01, 1e-3, memory=1e12), 16: step_model(16, 0.01, 1e-3)}
    got = scanned_worker_batches(models, CLUSTER, base_batch=8, num_gpus=8,
                                 efficiency=EFFICIENCY, dataset_size=DATASET)
    # mp 1: 8 workers, global 8..64; mp 2: 4 workers of 4 micro-batches, so global 8
    # (2 a worker) does not split; mp 4 fits no memory, mp 16 not the job.
    assert got == {1: [1.0, 2.0, 4.0, 8.0], 2: [4.0, 8.0, 16.0]}


def test_a_timed_step_predicts_each_candidate_with_its_timed_allreduce():
    models = {1: step_model(1, 0.01, 1e-3), 2: step_model(2, 0.01, 1e-2, micro=4)}
    timed = timed_like(models, 8, 16, lambda m, b: 0.020 + (1e-3 if m == 1 else 1e-5) * b)
    got = space(models, num_gpus=8, base_batch=16, timed=timed)
    for c in got:
        dp = c.dp_degree
        p = project(models[c.mp_degree](c.global_batch / dp), dp, CLUSTER, EFFICIENCY,
                    DATASET, ScalingParams())
        worker_batch = c.global_batch / dp
        compute = 0.020 + (1e-3 if c.mp_degree == 1 else 1e-5) * worker_batch
        allreduce = 1e-3 + 1e-4 * worker_batch  # the timed one, not the model's
        assert allreduce != pytest.approx(p.exposed_allreduce_s)
        assert c.step_source == TIMED
        assert c.predicted_parts_s == pytest.approx({"compute": compute,
                                                     "allreduce": allreduce,
                                                     "optimizer": 0.002})
        step = compute + allreduce + 0.002
        assert c.predicted_step_s == pytest.approx(step)
        assert c.predicted_time_s == pytest.approx(p.steps * step)
    # The timed steps, not the model's, choose each mp_degree's batches: mp 2's timed
    # step hardly grows, so its best is the largest batch of the scan (with its one
    # neighbour), where the model's per-sample cost puts it at 32 (sqrt(B_noise x
    # fixed x dp / per-sample) = 32).
    assert sorted(c.global_batch for c in got if c.mp_degree == 2) == [64, 128]
    modelled = space(models, num_gpus=8, base_batch=16)
    assert sorted(c.global_batch for c in modelled if c.mp_degree == 2) == [16, 32, 64]
    assert all(c.step_source == MODELLED for c in modelled)
