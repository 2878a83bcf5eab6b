"""The job's devices on an autoscaling cluster: the request built from the node types
(pure), the wait (an injected node listing), and against a real Ray cluster whose GPU
node joins after the job has asked for it (ray.cluster_utils.Cluster standing in for
the autoscaler), with the profile task on that node."""

import threading
import time

import pytest
import ray
import yaml

from orchestrator.runtime.device_kind import DeviceKind
from orchestrator.runtime.devices import NoCudaError
from orchestrator.train.config import TrainConfig
from orchestrator.train.capacity import NodeResources
from orchestrator.train.resources import (NodeType, decide_devices, node_types,
                                          plan_gpu_request, plan_on_gpus,
                                          plan_worker_request, preset_for,
                                          profile_on_gpu_worker, wait_for_gpus)
from placement.errors import UserError
from tests.conftest import REPO


def cluster_yaml_types():
    return node_types(yaml.safe_load((REPO / "cluster.yaml").read_text()))


def test_node_types_come_from_the_cluster_file():
    types = {t.name: t for t in cluster_yaml_types()}
    assert set(types) == {"gpu_v100", "gpu_a100"}   # the head has no GPU
    assert (types["gpu_v100"].gpus, types["gpu_v100"].max_workers) == (8, 4)
    assert types["gpu_a100"].instance_type == "p4d.24xlarge"


def test_the_request_is_whole_nodes_from_the_largest_type_first():
    types = [NodeType(name="small", gpus=4, max_workers=2),
             NodeType(name="big", gpus=8, max_workers=1)]
    default = plan_gpu_request(types, None)
    assert default.num_gpus == 8 and default.bundles == ({"GPU": 8},)
    twenty = plan_gpu_request(types, 14)
    assert twenty.bundles == ({"GPU": 8}, {"GPU": 4}, {"GPU": 2})
    assert plan_gpu_request(cluster_yaml_types(), 64).bundles == ({"GPU": 8},) * 8


def test_more_gpus_than_the_node_types_hold_is_refused_naming_what_fits():
    with pytest.raises(UserError, match=r"--num-gpus 65: .* at most 64 GPUs .*"
                                        r"gpu_v100: 4 x 8.*use --num-gpus 64 or less"):
        plan_gpu_request(cluster_yaml_types(), 65)
    with pytest.raises(UserError, match="no GPU node type"):
        plan_gpu_request([], 8)


def test_a_training_run_asks_for_one_bundle_per_worker_and_is_refused_if_it_never_fits():
    types = cluster_yaml_types()
    request = plan_worker_request(types, 3, 4)
    assert request.bundles == ({"GPU": 4},) * 3 and request.num_gpus == 12
    with pytest.raises(UserError, match=r"--mp 16: .* 8 GPUs per node: use --mp 8"):
        plan_worker_request(types, 1, 16)
    with pytest.raises(UserError, match=r"at most 16 worker\(s\) of 4 GPU\(s\): use --dp 16"):
        plan_worker_request(types, 17, 4)


def node(gpus, **custom):
    return NodeResources(node_id="n", cpus=8, gpus=gpus, custom=custom)


def test_the_preset_follows_the_gpus_ray_detected_on_the_nodes():
    types = cluster_yaml_types()
    a100 = node(8, **{"accelerator_type:A100": 1.0})
    v100 = node(8, **{"accelerator_type:V100": 1.0})
    assert preset_for(types, [node(0), a100]) == "p4d.24xlarge"
    assert preset_for(types, [node(0), v100]) == "p3.16xlarge"
    assert preset_for(types, [node(8)]) == "p3.16xlarge"   # undetected: the first largest
    assert preset_for(None, [node(8)]) == "dgx1-v100"


def test_the_wait_says_how_far_it_got_and_ends_when_the_gpus_are_there():
    views = iter([[node(0)], [node(0), node(4)], [node(0), node(4), node(4)]])
    lines = []
    live = wait_for_gpus(8, timeout_s=60, poll_s=0, say=lines.append,
                         nodes=lambda: next(views))
    assert sum(n.gpus for n in live) == 8
    assert lines[0].startswith("waiting for GPUs: 0 of 8")
    assert lines[1].startswith("waiting for GPUs: 4 of 8")
    assert lines[2].startswith("8 GPU(s) on 2 node(s)")


def test_a_wait_that_times_out_names_what_came_up():
    with pytest.raises(UserError, match=r"has 4 of the 8 GPUs .* `ray status`"):
        wait_for_gpus(8, timeout_s=0, poll_s=0, say=lambda _: None, nodes=lambda: [node(4)])


@pytest.fixture(scope="module")
def head_only_cluster():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.ray
def test_the_job_asks_for_gpus_and_waits_for_a_node_that_joins_later(head_only_cluster):
    types = [NodeType(name="gpu", gpus=2, max_workers=1)]
    result, lines = {}, []

    def job():
        try:
            result["devices"] = decide_devices(None, fake_cluster=False, cluster_name=None,
                                               types=types, say=lines.append,
                                               timeout_s=120)
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            result["error"] = err

    thread = threading.Thread(target=job)
    thread.start()
    time.sleep(3)
    assert thread.is_alive(), result  # nothing to run on yet: the job waits
    head_only_cluster.add_node(num_cpus=2, num_gpus=2)
    thread.join(timeout=90)
    assert not thread.is_alive() and "error" not in result, result
    devices = result["devices"]
    assert devices.kind is DeviceKind.GPU and devices.num_gpus == 2 and devices.requested
    assert devices.cluster.name == "dgx1-v100"
    assert lines[0] == "asking the autoscaler for 2 GPU(s) as 1 bundle(s) [{'GPU': 2}]"
    assert any(line.startswith("waiting for GPUs: 0 of 2") for line in lines)
    assert lines[-1].startswith("2 GPU(s) on 1 node(s)")


@pytest.mark.ray
def test_profiling_on_a_gpu_node_without_cuda_is_one_line_naming_it(head_only_cluster):
    if not any(n["Resources"].get("GPU") for n in ray.nodes() if n["Alive"]):
        head_only_cluster.add_node(num_cpus=2, num_gpus=2)
    with pytest.raises(NoCudaError, match=r"^node [\d.]+: the profile task holds a GPU "
                                          r"but torch .* has no CUDA") as caught:
        profile_on_gpu_worker("vgg16", preset_name="tiny", batch=2, target="v100",
                              timeout_s=120)
    assert "\n" not in str(caught.value)


@pytest.mark.ray
def test_a_gpu_training_run_is_planned_from_a_gpu_worker_not_the_driver(head_only_cluster):
    """`orchestrator train --gpu` without --plan profiles its micro-batch on a GPU node
    (here one whose torch has no CUDA, so it fails naming that node), not on the
    driver's CPU with the cpu preset as it did."""
    if not any(n["Resources"].get("GPU") for n in ray.nodes() if n["Alive"]):
        head_only_cluster.add_node(num_cpus=2, num_gpus=2)
    cfg = TrainConfig(model="vgg16", preset="tiny", mp_degree=2, global_batch=4,
                      device_kind=DeviceKind.GPU)
    with pytest.raises(NoCudaError, match=r"^node [\d.]+: the profile task holds a GPU"):
        plan_on_gpus(cfg, solver="heuristic", time_limit_s=5.0)
