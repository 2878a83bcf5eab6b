"""Small graph builders shared by the placement tests."""

from placement.graph import Edge, Op, OpGraph


def chain_graph(times, *, cost=None, backward=None, name="chain"):
    """Ops 0..n-1 in a line, forward times `times` (kind 'any'), explicit edge costs."""
    ops = tuple(
        Op(id=i, name=f"op{i}", forward_s={"any": t},
           backward_s={"any": backward[i]} if backward else {})
        for i, t in enumerate(times))
    edges = tuple(Edge(src=i, dst=i + 1, cost_s=cost) for i in range(len(times) - 1))
    return OpGraph(ops=ops, edges=edges, name=name)


def dag(times, edges, *, cost=1.0, colocation=None):
    colocation = colocation or {}
    ops = tuple(Op(id=i, name=f"op{i}", forward_s={"any": t}, colocation=colocation.get(i))
                for i, t in enumerate(times))
    return OpGraph(ops=ops, edges=tuple(Edge(src=s, dst=d, cost_s=cost) for s, d in edges))
