"""A running store (2 partitions, real server processes) shared by the tests of this
package, stopped when they are done (later packages check that no child process is left)."""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from graphrun.graph import Graph
from graphrun.local.stores import start_stores
from graphrun.partition import IdMapping, load_id_mapping, partition_graph
from graphrun.testing.graphs import random_graph, random_hetero_graph


@dataclass
class Served:
    graph: Graph
    servers: list[str]
    ids: IdMapping
    pids: list[int]

    def orig_nodes(self, new):
        return np.asarray(self.ids.orig_nids)[np.asarray(new)]

    def orig_edges(self, new):
        return np.asarray(self.ids.orig_eids)[np.asarray(new)]


#: the tests' clients mostly send no heartbeats (``heartbeat_interval=0``): a session is
#: then dropped after this much silence, so it is not the 30 s a loader's workers could
#: take to start on a busy box (a fork server that imports torch and PyG: the parent's
#: session then idles; stop 50 saw test_cache's dropped at load 17)
SILENCE_S = 600.0


def _serve(graph: Graph, out: Path) -> Iterator[Served]:
    partition_graph(graph, out, 2, method="metis", seed=0)
    with start_stores(out, 2, heartbeat_timeout=SILENCE_S) as stores:
        yield Served(
            graph, [s.address for s in stores], load_id_mapping(out), [s.pid for s in stores]
        )


@pytest.fixture(scope="package")
def served(tmp_path_factory) -> Iterator[Served]:
    yield from _serve(random_graph(), tmp_path_factory.mktemp("homo") / "parts")


@pytest.fixture(scope="package")
def served_hetero(tmp_path_factory) -> Iterator[Served]:
    yield from _serve(random_hetero_graph(), tmp_path_factory.mktemp("hetero") / "parts")
