"""The host-speed probe measures the host: it takes longer when its core is shared."""

import multiprocessing
import os
import statistics

import pytest
import torch

from orchestrator.train.speed_probe import SpeedProbe


def _spin() -> None:
    while True:
        pass


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_the_probe_takes_longer_when_another_process_shares_its_core():
    probe = SpeedProbe()
    threads = torch.get_num_threads()
    core = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    busy = multiprocessing.get_context("fork").Process(target=_spin, daemon=True)
    try:
        alone = statistics.mean(probe() for _ in range(60))
        busy.start()
        os.sched_setaffinity(busy.pid, {core})
        shared = statistics.mean(probe() for _ in range(60))
    finally:
        if busy.pid is not None:
            busy.kill()
            busy.join()
        os.sched_setaffinity(0, before)
    # Real work on a real core: about a millisecond, and with a spinning process on the
    # core the scheduler gives the probe about half of it, in slices of a few ms that
    # cut some probes by the other's turn: on average they take about twice as long (a
    # probe that measured nothing would take the same microseconds either way).
    assert 2e-4 < alone < 0.05
    assert shared > 1.4 * alone, (alone, shared)
    assert torch.get_num_threads() == threads  # the caller's pool is left as it was
