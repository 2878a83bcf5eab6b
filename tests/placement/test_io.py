import dataclasses
import json

import pytest

from placement.cluster import preset
from placement.graph import GraphError
from placement.io import graph_to_dict, load_graph, save_graph
from placement.plan import load_plan
from placement.planner import PlanConfig, plan
from tests.conftest import REPO
from tests.placement.helpers import chain_graph


def test_round_trip_of_our_format(tmp_path):
    g = load_graph(REPO / "examples" / "branchy.json")
    save_graph(g, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert again == g
    assert graph_to_dict(again) == graph_to_dict(g)


def test_frozen_bytes_round_trip_and_never_pass_the_parameters(tmp_path):
    g = chain_graph([1.0, 2.0, 3.0])
    ops = list(g.ops)
    ops[1] = dataclasses.replace(ops[1], param_bytes=8.0, frozen_bytes=6.0)
    g = dataclasses.replace(g, ops=tuple(ops))
    save_graph(g, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert again.op(ops[1].id).frozen_bytes == 6.0
    assert again.op(ops[1].id).trainable_bytes == 2.0
    raw = json.loads((tmp_path / "g.json").read_text())
    raw["ops"][1]["frozen_bytes"] = 9.0
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(GraphError, match="frozen_bytes 9 over its param_bytes 8"):
        load_graph(tmp_path / "bad.json")


def test_grad_bytes_round_trip_and_never_pass_the_value(tmp_path):
    g = chain_graph([1.0, 2.0, 3.0], cost=0.5)
    edges = list(g.edges)
    edges[0] = dataclasses.replace(edges[0], bytes=8.0, grad_bytes=0.0)
    g = dataclasses.replace(g, edges=tuple(edges))
    save_graph(g, tmp_path / "g.json")
    again = load_graph(tmp_path / "g.json")
    assert [e.gradient_bytes for e in again.edges] == [0.0] + [e.bytes for e in edges[1:]]
    raw = json.loads((tmp_path / "g.json").read_text())
    raw["edges"][0]["grad_bytes"] = 9.0
    (tmp_path / "bad.json").write_text(json.dumps(raw))
    with pytest.raises(GraphError, match="grad_bytes 9 over its bytes 8"):
        load_graph(tmp_path / "bad.json")


def test_peer_import_keeps_ids_units_and_colour_classes(peer_graphs):
    g = load_graph(peer_graphs / "bert24_training.json")
    raw = json.loads((peer_graphs / "bert24_training.json").read_text())
    assert {op.id for op in g.ops} == {n["id"] for n in raw["nodes"]}
    assert len(g.edges) == len(raw["edges"])
    assert g.time_unit == "peer" and g.metadata["num_devices"] == 6
    node3 = g.op(3)
    assert node3.forward_s == {"any": 0.696}
    assert node3.colocation == g.op(34).colocation  # node3 and node3grad share colour 3
    assert g.op(34).is_backward and not node3.is_backward
    costs = {e["cost"] for e in raw["edges"] if e["sourceId"] == 3}
    assert node3.transfer_s == max(costs)


@pytest.mark.parametrize("text, message", [
    ("{not json", "not valid JSON"),
    ('{"a": 1}', "neither our op-graph format"),
    ('{"format": "hybrid-orchestrator.op-graph", "version": 9, "ops": [], "edges": []}',
     "version 9 is not supported"),
    ('{"format": "hybrid-orchestrator.op-graph", "version": 1, "ops": [{"id": 0}], '
     '"edges": []}', "op 0 has no 'forward_s'"),
    ('{"format": "hybrid-orchestrator.op-graph", "version": 1, '
     '"ops": [{"id": 0, "forward_s": "fast"}], "edges": []}', "forward_s must be a number"),
])
def test_malformed_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(GraphError, match=message) as err:
        load_graph(path)
    assert str(path) in str(err.value)


def test_missing_file():
    with pytest.raises(GraphError, match="no such graph file"):
        load_graph("/nonexistent/graph.json")


@pytest.mark.parametrize("metadata, granularity", [({"granularity": "aten"}, "aten"),
                                                   ({}, "module")])
def test_a_plan_names_its_graphs_granularity_through_its_file(tmp_path, metadata,
                                                              granularity):
    """The worker cuts the model at the plan's granularity: it must survive the file
    (a graph that names none, such as a peer graph, is of layers)."""
    graph = dataclasses.replace(chain_graph([1.0, 2.0, 1.0]), metadata=metadata)
    made = plan(graph, preset("cpu"), PlanConfig(num_devices=2, solver="heuristic"))
    made.save(tmp_path / "plan.json")
    assert made.granularity == load_plan(tmp_path / "plan.json").granularity == granularity
