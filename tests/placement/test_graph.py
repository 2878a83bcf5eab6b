import pytest

from placement.graph import Edge, GraphError, Op, OpGraph
from tests.placement.helpers import dag


def test_topological_order_respects_edges():
    g = dag([1, 1, 1, 1], [(2, 1), (1, 0), (3, 0)])
    pos = {op: i for i, op in enumerate(g.topological_order)}
    for e in g.edges:
        assert pos[e.src] < pos[e.dst]


def test_cycle_is_named():
    with pytest.raises(GraphError, match=r"cycle \(1 -> 2 -> 1\)|cycle \(2 -> 1 -> 2\)"):
        dag([1, 1, 1], [(0, 1), (1, 2), (2, 1)])


def test_long_cycle_needs_no_recursion():
    n = 5000
    edges = [(i, i + 1) for i in range(n - 1)] + [(n - 1, 0)]
    with pytest.raises(GraphError, match="cycle"):
        dag([1.0] * n, edges)


@pytest.mark.parametrize("edge, message", [
    (Edge(src=0, dst=7), "names op 7"),
    (Edge(src=0, dst=0), "self-loop"),
    (Edge(src=0, dst=1, bytes=-1.0), "bytes is -1.0"),
])
def test_bad_edges_are_named(edge, message):
    ops = (Op(id=0, name="a", forward_s={"any": 1.0}), Op(id=1, name="b", forward_s={"any": 1.0}))
    with pytest.raises(GraphError, match=message):
        OpGraph(ops=ops, edges=(edge,))


def test_negative_time_names_the_op():
    with pytest.raises(GraphError, match=r"op 3 \(bad\) forward time"):
        OpGraph(ops=(Op(id=3, name="bad", forward_s={"any": -2.0}),), edges=())


def test_duplicate_ids_rejected():
    op = Op(id=1, name="a", forward_s={"any": 1.0})
    with pytest.raises(GraphError, match="appears twice"):
        OpGraph(ops=(op, op), edges=())


def test_time_for_missing_kind_says_how_to_fix():
    op = Op(id=0, name="a", forward_s={"cpu": 1.0})
    assert op.time_s("cpu") == 1.0
    with pytest.raises(GraphError, match="profile the graph for that target"):
        op.time_s("v100")
