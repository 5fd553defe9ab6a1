"""graphrun.distributed: the user-facing distributed API.

    keys = load_keys("parts/store.key")   # the store's key file (or the job's own job key)
    ctx = initialize(servers, rank=r, world_size=w, job="j", keys=keys)   # -> DistContext
    g = DistGraph(ctx)
    ids = node_split(g.mask_ids("train_mask"), g.partition_book, r, w)
    cache = plan_feature_cache(g, ids, [25, 10], batch_size=1000, budget_bytes=256 << 20)
    for batch in DistNodeDataLoader(g, ids, [25, 10], batch_size=1000, num_workers=2,
                                    cache=cache): ...

PyG's own loaders take ``remote_backend(ctx)`` (a FeatureStore, GraphStore pair) and a
``RemoteNeighborSampler``: see :mod:`graphrun.distributed.pyg_remote` (stores in ``pyg_stores``).

Everything hangs off the context ``initialize`` returns; DistDGL's names
(``DistTensor(shape, dtype, name)``, ``node_split(mask, pb)``, ``DistGraph(name)``,
``NeighborSampler(fanouts)``, see :mod:`graphrun.distributed.dglnames` and
docs/porting.md) find it as the current context.
"""

from typing import TYPE_CHECKING

from graphrun.lazy import lazy_names
from graphrun.rpc.auth import load_keys

if TYPE_CHECKING:
    from graphrun.distributed.cache import CachePlan
    from graphrun.distributed.context import (
        DistConfig,
        DistContext,
        current_context,
        initialize,
    )
    from graphrun.distributed.dglnames import (
        DistEmbedding,
        DistTensor,
        NeighborSampler,
        SparseAdagrad,
        SparseAdam,
        edge_split,
        node_split,
    )
    from graphrun.distributed.graph import DistGraph
    from graphrun.distributed.loader import (
        DistEdgeDataLoader,
        DistLinkDataLoader,
        DistNodeDataLoader,
        plan_feature_cache,
    )
    from graphrun.distributed.minibatch import shuffled
    from graphrun.distributed.pyg_data import (
        RemoteData,
        StoreDataset,
        read_store_file,
        write_store_file,
    )
    from graphrun.distributed.pyg_remote import (
        LinkNeighborLoader,
        NeighborLoader,
        RemoteNeighborSampler,
    )
    from graphrun.distributed.pyg_stores import (
        RemoteFeatureStore,
        RemoteGraphStore,
        remote_backend,
    )
    from graphrun.distributed.split import trainer_partitions

# Every name but load_keys needs torch (and most torch_geometric) and loads on first use:
# a process that only writes the graph (``graphrun ingest``, a GraphWriter) imports
# graphrun.distributed.writer, and with it this package, and needs neither (importing
# them was 3.8 CPU-s and 400 MB before the first batch; benchmarks/README.md).
_LAZY = {
    "CachePlan": "cache",
    **dict.fromkeys(("DistConfig", "DistContext", "current_context", "initialize"), "context"),
    **dict.fromkeys(
        (
            "DistEmbedding",
            "DistTensor",
            "NeighborSampler",
            "SparseAdagrad",
            "SparseAdam",
            "edge_split",
            "node_split",
        ),
        "dglnames",
    ),
    "DistGraph": "graph",
    **dict.fromkeys(
        ("DistEdgeDataLoader", "DistLinkDataLoader", "DistNodeDataLoader", "plan_feature_cache"),
        "loader",
    ),
    "shuffled": "minibatch",
    **dict.fromkeys(
        ("RemoteData", "StoreDataset", "read_store_file", "write_store_file"), "pyg_data"
    ),
    **dict.fromkeys(
        ("LinkNeighborLoader", "NeighborLoader", "RemoteNeighborSampler"), "pyg_remote"
    ),
    **dict.fromkeys(("RemoteFeatureStore", "RemoteGraphStore", "remote_backend"), "pyg_stores"),
    "trainer_partitions": "split",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = [
    "CachePlan",
    "DistConfig",
    "DistContext",
    "DistEdgeDataLoader",
    "DistEmbedding",
    "DistGraph",
    "DistLinkDataLoader",
    "DistNodeDataLoader",
    "DistTensor",
    "LinkNeighborLoader",
    "NeighborLoader",
    "NeighborSampler",
    "RemoteData",
    "RemoteFeatureStore",
    "RemoteGraphStore",
    "RemoteNeighborSampler",
    "SparseAdagrad",
    "SparseAdam",
    "StoreDataset",
    "current_context",
    "edge_split",
    "initialize",
    "load_keys",
    "node_split",
    "plan_feature_cache",
    "read_store_file",
    "remote_backend",
    "shuffled",
    "trainer_partitions",
    "write_store_file",
]
