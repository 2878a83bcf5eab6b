"""The host-speed probe times real work: its seconds follow the work it is given."""

import pickle

import torch

from orchestrator.train.speed_probe import COPIES, SpeedProbe


def test_the_probe_times_its_copies_and_leaves_the_callers_threads():
    threads = torch.get_num_threads()
    one = SpeedProbe().median_s(9)
    ten = SpeedProbe(copies=10 * COPIES).median_s(9)
    # About a millisecond of copying (a probe that timed nothing would take a few
    # microseconds), and ten times the copies take several times as long: medians of
    # nine, so that another session's burst on this shared host does not decide.
    assert 1e-4 < one < 0.05, one
    assert ten > 5 * one, (one, ten)
    assert torch.get_num_threads() == threads


def test_a_pickled_probe_is_its_recipe_not_its_buffers():
    probe = SpeedProbe(copies=3)
    text = pickle.dumps(probe)
    assert len(text) < 1000
    back = pickle.loads(text)
    assert back.copies == 3 and back.source.shape == probe.source.shape and back() > 0
