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
    assert config["docker"]["image"] == "rayproject/ray:2.60.0-py311-gpu"
    assert any("glpk-utils" in c and "coinor-cbc" in c for c in config["setup_commands"])
    for node_type in types.values():
        assert all(isinstance(v, int) for v in node_type["resources"].values())
