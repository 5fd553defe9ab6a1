"""TensorKey: the one spelling of a graph feature's name in the store."""

from graphrun.store.policy import TensorKey, edge_policy_name, node_policy_name


def test_node_and_edge_keys_format_parse_and_name_their_policy() -> None:
    node = TensorKey.node("paper", "feat")
    edge = TensorKey.edge(("author", "writes", "paper"), "weight")
    assert str(node) == "node/paper/feat" and str(edge) == "edge/author:writes:paper/weight"
    assert TensorKey.parse(str(node)) == node and TensorKey.parse(str(edge)) == edge
    assert node.policy == node_policy_name("paper")
    assert edge.policy == edge_policy_name(("author", "writes", "paper"))


def test_other_tensor_names_are_not_graph_features() -> None:
    for name in ("emb", "node/feat", "node//x", "node/paper/", "job/x/y"):
        assert TensorKey.parse(name) is None, name
