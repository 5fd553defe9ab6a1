"""graphrun.distributed: the user-facing distributed API.

    ctx = initialize(servers, rank=r, world_size=w, job="j", keys=keys)   # -> DistContext
    g = DistGraph(ctx)
    ids = node_split(g.mask_ids("train_mask"), g.partition_book, r, w)
    cache = plan_feature_cache(g, ids, [25, 10], batch_size=1000, budget_bytes=256 << 20)
    for batch in DistNodeDataLoader(g, ids, [25, 10], batch_size=1000, num_workers=2,
                                    cache=cache): ...

No process-global state: everything hangs off the context ``initialize`` returns.
"""

from graphrun.distributed.cache import CachePlan
from graphrun.distributed.context import DistConfig, DistContext, initialize
from graphrun.distributed.graph import DistGraph
from graphrun.distributed.loader import (
    DistLinkDataLoader,
    DistNodeDataLoader,
    plan_feature_cache,
)
from graphrun.distributed.split import edge_split, node_split, trainer_partitions

__all__ = [
    "CachePlan",
    "DistConfig",
    "DistContext",
    "DistGraph",
    "DistLinkDataLoader",
    "DistNodeDataLoader",
    "edge_split",
    "initialize",
    "node_split",
    "plan_feature_cache",
    "trainer_partitions",
]
