"""What an importer returns, and which table format a path holds.

Shared by the dispatcher (:mod:`.importers`) and the table reader (:mod:`.tables`),
which must not import each other both ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graphrun.graph.graph import Graph

FORMATS = ("csv", "parquet")


@dataclass(frozen=True, eq=False)
class Imported:
    """An imported graph and the original id of every node, per node type."""

    graph: Graph
    id_maps: dict[str, np.ndarray] = field(default_factory=dict)


def detect_table_format(root: Path) -> str | None:
    """``"csv"``/``"parquet"`` if ``root`` is an edges file or holds edge tables, else None."""
    if root.is_file():
        return root.suffix[1:] if root.suffix[1:] in FORMATS else None
    for fmt in FORMATS:
        if (root / f"edges.{fmt}").is_file() or any((root / "edges").glob(f"*.{fmt}")):
            return fmt
    return None
