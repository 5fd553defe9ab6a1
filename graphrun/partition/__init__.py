"""Partitioning: algorithms (METIS, KaMinPar, random), relabelling, the partition book,
the partition directory format and quality metrics. See ``format.py`` for the layout.

The distributed mode (``distributed.py``, with ``xtrapulp.py``, ``shuffle.py`` and
``comm.py``) uses torch.distributed and is imported on its own, not from here."""

from graphrun.partition.book import PartitionBook
from graphrun.partition.format import (
    IdMapping,
    Partition,
    load_id_mapping,
    load_partition,
    load_partition_book,
    load_partition_config,
)
from graphrun.partition.partitioner import PartitionResult, assign, partition_graph
from graphrun.partition.quality import Quality

__all__ = [
    "IdMapping",
    "Partition",
    "PartitionBook",
    "PartitionResult",
    "Quality",
    "assign",
    "load_id_mapping",
    "load_partition",
    "load_partition_book",
    "load_partition_config",
    "partition_graph",
]
