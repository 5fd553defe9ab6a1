"""The identity module: roles, edge types, tensor keys and policies, owners."""

import numpy as np
import pytest

from graphrun.errors import ArgumentError, DatasetError
from graphrun.names import (
    MAIN_TRAINER,
    Endpoint,
    PolicyName,
    RoleName,
    TensorKey,
    etype_key,
    home_partition,
    owners,
    parse_etype_key,
    resolve_etype,
    store_address,
)

# --- roles ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, name",
    [
        ("store:3", RoleName.store(3)),
        ("store:3:1", RoleName.store(3, 1)),
        ("store:3:r", RoleName.store(3, replica=1)),
        ("store:3:r2", RoleName.store(3, replica=2)),
        ("trainer:0", RoleName.trainer(0)),
        ("trainer:10", RoleName.trainer(10)),
        ("sampler:2:1", RoleName.sampler(2, 1)),
        ("sampler:2:0", RoleName.sampler(2, 0)),
        ("ps:4", RoleName.ps(4)),
    ],
)
def test_role_names_round_trip(text, name):
    assert str(name) == text and RoleName.parse(text) == name
    assert RoleName.is_valid(text) and RoleName.parse(text).kind == name.kind


def test_the_main_store_server_has_no_backup_suffix():
    assert str(RoleName.store(1, 0)) == "store:1"
    assert RoleName.store(1).is_primary_store and not RoleName.store(1, 1).is_primary_store


@pytest.mark.parametrize(
    "bad",
    [
        "store", "trainer:1:2", "sampler:1", "gpu:0", "store:-1", "ps:x", "store:1:r0",
        "store:1:0",  # the main server is store:1: one spelling per role
        "trainer:01", "trainer: 1", "trainer:1 ", "ps:²", "", "trainer:", "store:1:r1",
    ],
)  # fmt: skip
def test_what_is_no_role_name_is_refused_naming_it(bad):
    with pytest.raises(ArgumentError, match=r"is not a role name \(store:P\[:B\]"):
        RoleName.parse(bad)
    assert not RoleName.is_valid(bad)


def test_role_names_are_dict_keys_and_sort_by_kind_then_numbers():
    placement = {RoleName.trainer(0): "m1", RoleName.store(0): "m0"}
    assert placement[RoleName.parse("trainer:0")] == "m1" and MAIN_TRAINER in placement
    assert "trainer:0" not in placement  # a string is not a role: parse it first
    names = [RoleName.trainer(2), RoleName.trainer(10), RoleName.store(1, 1), RoleName.store(1)]
    assert sorted(names) == [RoleName.store(1), RoleName.store(1, 1), *names[:2]]


def test_home_partition_is_one_function_for_runtime_and_model() -> None:
    from graphrun.distributed import split

    assert split.home_partition is home_partition  # re-exported where it used to live
    assert [home_partition(r, 4, 2) for r in range(4)] == [0, 0, 1, 1]
    assert [home_partition(r, 2, 4) for r in range(2)] == [0, 2]


def test_a_replica_is_not_a_backup():
    assert RoleName.store(1, replica=1) != RoleName.store(1, 1)
    assert RoleName.parse("store:1:r").sub == 0


# --- edge types -------------------------------------------------------------------------

ETYPES = [("author", "writes", "paper"), ("paper", "cites", "paper"), ("user", "cites", "paper")]


def test_etype_keys_round_trip():
    assert etype_key(ETYPES[0]) == "author:writes:paper"
    assert parse_etype_key("author:writes:paper") == ETYPES[0]
    for bad in ("author:writes", "a::b", "a:b:c:d", ""):
        with pytest.raises(DatasetError, match="expected 'src_type:relation:dst_type'"):
            parse_etype_key(bad)


@pytest.mark.parametrize(
    "given, index",
    [(ETYPES[1], 1), (list(ETYPES[2]), 2), ("user:cites:paper", 2), ("writes", 0)],
)
def test_one_resolver_takes_a_triple_a_key_or_a_unique_relation(given, index):
    assert resolve_etype(given, ETYPES) == index


def test_a_shared_relation_is_ambiguous_and_an_unknown_type_names_the_known_ones():
    with pytest.raises(ArgumentError, match=r"fanouts: relation 'cites' is ambiguous"):
        resolve_etype("cites", ETYPES, "fanouts")
    with pytest.raises(ArgumentError, match=r"etype: unknown edge type 'likes'; known: \["):
        resolve_etype("likes", ETYPES)
    with pytest.raises(DatasetError, match="unknown edge type 'a:b:c'"):
        resolve_etype("a:b:c", ETYPES, error=DatasetError)
    with pytest.raises(ArgumentError, match="unknown edge type 3"):
        resolve_etype(3, ETYPES)


def test_the_graph_the_book_and_the_fanouts_resolve_alike():
    from graphrun.sampling.fanout import normalize_fanouts
    from graphrun.testing.graphs import hetero_graph

    g = hetero_graph()
    rel = next(e[1] for e in g.edge_types if [x[1] for x in g.edge_types].count(e[1]) == 1)
    assert g.num_edges_of(rel) == g.num_edges_of(next(e for e in g.edge_types if e[1] == rel))
    layer = normalize_fanouts([{rel: 3}], g.edge_types)[0]
    assert layer.tolist()[resolve_etype(rel, g.edge_types)] == 3


# --- tensor keys and policies -----------------------------------------------------------


def test_node_and_edge_keys_format_parse_and_name_their_policy() -> None:
    node = TensorKey.node("paper", "feat")
    edge = TensorKey.edge(("author", "writes", "paper"), "weight")
    assert str(node) == "node/paper/feat" and str(edge) == "edge/author:writes:paper/weight"
    assert TensorKey.parse(str(node)) == node and TensorKey.parse(str(edge)) == edge
    assert node.policy == PolicyName.node("paper") and str(node.policy) == "node:paper"
    assert edge.policy == PolicyName.edge(("author", "writes", "paper"))
    assert str(edge.policy) == "edge:author:writes:paper"


def test_other_tensor_names_are_not_graph_features() -> None:
    for name in ("emb", "node/feat", "node//x", "node/paper/", "job/x/y"):
        assert TensorKey.parse(name) is None, name


def test_policy_names_round_trip_and_bad_ones_are_refused() -> None:
    for text in ("node:_N", "edge:author:writes:paper"):
        assert str(PolicyName.parse(text)) == text
    assert PolicyName.parse("edge:a:b:c") == PolicyName.edge("a:b:c")
    for bad in ("node", "node:", "vertex:x", ":x"):
        with pytest.raises(ArgumentError, match="is not a policy name"):
            PolicyName.parse(bad)


# --- owners -----------------------------------------------------------------------------


def test_owners_of_contiguous_blocks_skip_empty_ones():
    bounds = np.array([0, 3, 3, 10])  # block 1 is empty
    got = owners(bounds, np.array([0, 2, 3, 9]))
    assert got.dtype == np.int64 and got.tolist() == [0, 0, 2, 2]


def test_owners_at_the_edges():
    bounds = np.array([0, 5, 10])
    assert owners(bounds, np.array([4, 5, 0, 9])).tolist() == [0, 1, 0, 1]
    assert owners(bounds, np.array([], np.int64)).tolist() == []
    assert owners(bounds, np.array([-1, 10])).tolist() == [-1, 2]  # unchecked ids
    assert owners(np.array([0, 0, 7]), np.array([0, 6])).tolist() == [1, 1]


@pytest.mark.parametrize(
    ("text", "role"),
    [
        ("worker:m0", RoleName.worker("m0")),
        ("worker:node-1.example", RoleName.worker("node-1.example")),
        ("partitioner", RoleName.partitioner()),
        ("partitioner:2", RoleName.partitioner(2)),
        ("generator", RoleName.generator()),
        ("launcher", RoleName.launcher()),
        ("rendezvous", RoleName.rendezvous()),
    ],
)
def test_the_processes_that_run_roles_are_roles_too(text, role):
    assert RoleName.parse(text) == role and str(role) == text
    assert RoleName.is_valid(text) and not RoleName.is_placed(text)
    assert role != RoleName.trainer(0) and hash(role) == hash(RoleName.parse(text))


@pytest.mark.parametrize(
    "text", ["worker:", "worker:-m0", "worker:m 0", "partitioner:01", "launcher:0", "rendezvous:0"]
)
def test_a_misspelled_process_role_is_refused(text):
    with pytest.raises(ArgumentError, match="worker:<machine>, partitioner"):
        RoleName.parse(text)


def test_a_role_name_is_immutable_and_ordered():
    role = RoleName.trainer(1)
    with pytest.raises(AttributeError):
        role.index = 2
    assert sorted([RoleName.worker("m1"), RoleName.trainer(1), RoleName.store(0)]) == [
        RoleName.store(0), RoleName.trainer(1), RoleName.worker("m1")
    ]  # fmt: skip
    assert RoleName.is_placed("trainer:1") and repr(role) == "RoleName('trainer:1')"


@pytest.mark.parametrize("text", ["10.0.0.1:30000", "store-0.job.svc:1", "[::1]:65535"])
def test_endpoints_round_trip(text):
    ep = Endpoint.parse(text)
    assert str(ep) == text and ep == Endpoint(ep.host, ep.port) and {ep: 1}[Endpoint.parse(text)]


@pytest.mark.parametrize("text", ["nohost", ":30000", "a:", "a:0", "a:65536", "a:-1", "a:1x", 5])
def test_what_is_no_endpoint_is_refused_naming_it(text):
    with pytest.raises(ArgumentError, match="is not host:port"):
        Endpoint.parse(text)


@pytest.mark.parametrize(
    ("text", "address"),
    [("h:1", "tcp://h:1"), ("tcp://10.0.0.1:7000", "tcp://10.0.0.1:7000"),
     ("[::1]:65535", "tcp://[::1]:65535")],
)  # fmt: skip
def test_a_store_address_is_read_as_tcp(text, address):
    assert store_address(text) == address


@pytest.mark.parametrize("text", ["h", "h:0", "h:70000", "tcp://::1:7000", "a]:[b:1", "ipc://x", 5])
def test_what_is_no_store_address_is_refused_naming_it(text):
    with pytest.raises(ArgumentError, match=r"is not host:port or tcp://host:port \(port"):
        store_address(text)


def test_an_endpoint_is_checked_when_made_and_is_immutable():
    with pytest.raises(ArgumentError, match=r"port 0 is not in 1\.\.65535"):
        Endpoint("a", 0)
    with pytest.raises(ArgumentError, match="host '' must be"):
        Endpoint("", 1)
    with pytest.raises(AttributeError):
        Endpoint("a", 1).port = 2
