import re

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from tests.conftest import REPO


def load():
    return yaml.safe_load((REPO / "cluster.yaml").read_text())


def test_cluster_yaml_passes_rays_own_validator():
    validate_config(prepare_config(load()))


def test_gpu_node_types_and_image():
    config = load()
    types = config["available_node_types"]
    assert types["gpu_v100"]["node_config"]["InstanceType"] == "p3.16xlarge"
    assert types["gpu_a100"]["node_config"]["InstanceType"] == "p4d.24xlarge"
    assert types["head"]["resources"]["GPU"] == 0
    assert config["docker"]["image"] == "rayproject/ray:2.60.0-py311-cu128"
    assert any("glpk-utils" in c and "coinor-cbc" in c for c in config["setup_commands"])
    for node_type in types.values():
        assert all(isinstance(v, int) for v in node_type["resources"].values())


def test_every_node_gets_a_cuda_torch_matching_the_image_and_the_project():
    config = load()
    cuda = re.search(r"-cu(\d+)$", config["docker"]["image"]).group(1)
    setup = config["setup_commands"]
    torch_line = next(c for c in setup if "torch==" in c)
    assert re.search(r"torch==\d+\.\d+\.\d+ ", torch_line), torch_line   # pinned
    assert torch_line.endswith(f"download.pytorch.org/whl/cu{cuda}")
    project = next(i for i, c in enumerate(setup) if "pip install -q -e" in c)
    assert setup.index(torch_line) < project   # pip keeps the CUDA build
    assert any("torch.cuda.is_available()" in c for c in config["worker_setup_commands"])


def test_storage_is_shared_by_every_node():
    config = load()
    assert any("mount -t nfs4" in c and "/mnt/efs" in c
               for c in config["initialization_commands"])
    assert "--volume=/mnt/efs:/mnt/efs" in config["docker"]["run_options"]


def test_no_efa_settings_without_an_efa_interface():
    config = load()
    efa = any(ni.get("InterfaceType") == "efa"
              for t in config["available_node_types"].values()
              for ni in t["node_config"].get("NetworkInterfaces", []))
    commands = [c for key in ("setup_commands", "worker_setup_commands",
                              "worker_start_ray_commands") for c in config.get(key, [])]
    assert efa or not any(re.search(r"\bFI_\w+=|NCCL_NET", c) for c in commands)
