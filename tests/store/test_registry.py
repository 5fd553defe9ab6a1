import numpy as np
import pytest

from graphrun.errors import ArgumentError
from graphrun.store.registry import Registry, load_extensions
from graphrun.store.server import ServerConfig, build_registry
from graphrun.testing.store import store_threads
from tests.store.conftest import connect

EXT = "tests.store.extension_example:register"


def test_extension_adds_a_request_kind_without_touching_the_server(homo, keys):
    graph, parts = homo
    cfg = ServerConfig(parts, 0, keys=keys, extensions=(EXT,))
    with store_threads(cfg, 2) as s, connect(s, keys) as c:
        start, end = c.book.owned_nodes(1)
        ids = np.arange(start, min(end, start + 20))
        reply = c.session.wait(c.session.request(1, "in_degree", {}, (ids,)))
        assert reply.body == {"calls": 1}
        # reference: in-degree in the original graph of the same nodes
        from graphrun.partition import load_id_mapping

        orig = load_id_mapping(parts).orig_nids[ids]
        ref = np.bincount(graph.dst, minlength=graph.num_nodes)[orig]
        np.testing.assert_array_equal(reply.tensors[0], ref)
        with pytest.raises(ArgumentError, match="owned by partition 0"):
            c.session.call(0, "in_degree", {}, tensors=(ids,))


def test_registry_rules():
    reg = build_registry()
    assert {"pull", "push", "init", "join", "stats"} <= set(reg.ops())
    with pytest.raises(ArgumentError, match="already registered"):
        reg.add("pull", lambda state, req: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ArgumentError, match="unknown operation"):
        reg.get("nope")
    for bad in ("nocolon", "no.such.module:register", "tests.store.extension_example:nope"):
        with pytest.raises(ArgumentError, match="extension"):
            load_extensions(Registry(), [bad])
