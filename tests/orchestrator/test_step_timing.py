"""Timing a plan's worker step before the sweep: the worker's own executor and gradient
sync, at every batch asked for, in alternating rounds, within its budget, with the dp
workers side by side in processes of their own."""

import itertools
import multiprocessing
import sys
import time

import pytest
import torch

from orchestrator.train import step_timing
from orchestrator.train.config import TrainConfig
from orchestrator.train.planning import plan_worker
from orchestrator.train.step_timing import MIN_ROUNDS, time_plan

USER_MLP = "tests.orchestrator.user_models:mlp"


@pytest.fixture(scope="module")
def biglstm_plan():
    """A two-device plan of tiny BigLSTM with two micro-batches, profiled here."""
    return plan_worker(TrainConfig(model="biglstm", mp_degree=2, num_micro_batches=2,
                                   global_batch=8), time_limit_s=5)


def test_a_plans_step_is_timed_at_every_batch_and_grows_with_it(biglstm_plan):
    threads = torch.get_num_threads()
    t = time_plan("biglstm", "tiny", biglstm_plan, [4, 64])
    assert torch.get_num_threads() == threads  # the worker's one thread is not left behind
    assert (t.mp_degree, t.dp_degree, t.num_micro_batches, t.batches) == (2, 1, 2, (4, 64))
    assert MIN_ROUNDS <= t.rounds <= step_timing.MAX_ROUNDS
    # 16x the samples: a real step takes longer, whatever the host's load (the rounds
    # alternate, so a burst lands on both batches alike). Not by a set ratio: tiny
    # BigLSTM's step is mostly per-micro-batch fixed cost (20 and 26 ms on a quiet run).
    assert t.compute_s[1] > t.compute_s[0]
    assert 0 < t.optimizer_s < t.compute_s[0]
    # Two device threads and the one that drives them: busy cores of a real step.
    assert all(0 < c <= 3 for c in t.cores_used), t.cores_used
    # The host-speed probe ran between the rounds: real work, about a millisecond.
    assert 1e-4 < t.probe_s < 0.05, t.probe_s


def test_the_rounds_stop_at_the_budget_and_the_parts_are_cut_like_the_workers():
    # A clock 10 s on at every read: each part of a step takes one read, 10 s, and
    # the budget is spent after the first round, so MIN_ROUNDS are timed.
    ticks = itertools.count(0.0, 10.0)
    # The host-speed probe once after each round, outside the steps' clock: its median.
    probes = iter([0.003, 0.001, 0.002, 0.009])
    t = time_plan(USER_MLP, "tiny", _one_device_plan(), [4, 8], clock=lambda: next(ticks),
                  probe=lambda: next(probes))
    assert t.rounds == MIN_ROUNDS
    assert t.probe_s == 0.002 and next(probes) == 0.009
    assert t.compute_s == (10.0, 10.0) and t.allreduce_s == (10.0, 10.0)
    assert t.optimizer_s == 10.0


def test_two_workers_are_timed_side_by_side_their_allreduce_included(biglstm_plan):
    # dp 2 of a two-device plan: each worker averages one bucket per device with the
    # other process after its backward (GradientSync), a wait the worker alone never
    # has (its sync is a no-op: a few clock reads). Tiny BigLSTM's 1.6 MB gradient
    # takes about 2 ms over gloo between two processes here.
    alone = time_plan("biglstm", "tiny", biglstm_plan, [4, 8])
    pair = time_plan("biglstm", "tiny", biglstm_plan, [4, 8], dp_degree=2)
    assert (pair.dp_degree, pair.batches) == (2, (4, 8))
    assert 1e-4 < pair.probe_s < 0.05, pair.probe_s  # rank 0's probes, from its process
    assert MIN_ROUNDS <= pair.rounds <= step_timing.MAX_ROUNDS
    assert max(alone.allreduce_s) < 1e-4
    assert min(pair.allreduce_s) > 2e-4
    assert min(pair.allreduce_s) > 10 * max(alone.allreduce_s)


def test_a_one_device_worker_among_others_is_timed_with_ddp():
    # DDP allreduces during the backward: its wait is in compute, and the step runs
    # (a DDP without its process group could not be built at all).
    t = time_plan(USER_MLP, "tiny", _one_device_plan(), [4, 8], dp_degree=2)
    assert t.dp_degree == 2 and min(t.compute_s) > 0


def test_a_batch_that_does_not_split_into_the_micro_batches_is_a_bug(biglstm_plan):
    with pytest.raises(AssertionError):
        time_plan("biglstm", "tiny", biglstm_plan, [5])


def _one_device_plan():
    return plan_worker(TrainConfig(model=USER_MLP, global_batch=8), time_limit_s=5)


def test_a_side_by_side_worker_that_fails_ends_the_others_and_raises():
    # The other worker would wait at its next collective until GROUP_TIMEOUT_S.
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=sys.exit, args=(3,)), fork.Process(target=time.sleep, args=(60,))]
    started = time.monotonic()
    for p in procs:
        p.start()
    with pytest.raises(RuntimeError, match=r"exited with \[3, -9\]"):
        step_timing._wait_all(procs)
    assert time.monotonic() - started < 10
