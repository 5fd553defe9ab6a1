"""One entry point for every graph input: :func:`load_graph` and :func:`import_graph`.

Accepted inputs (detected in this order, or forced with ``fmt``):

===========  ==============================================================
``dataset``  a graphrun dataset directory (``graph.json``; :mod:`.format`)
``npy``      a folder with ``src.npy``/``dst.npy`` (:mod:`.npy_folder`)
``csv``      ``edges.csv`` or ``edges/*.csv`` [+ nodes] (:mod:`.tables`)
``parquet``  ``edges.parquet`` or ``edges/*.parquet`` [+ nodes] (:mod:`.tables`)
===========  ==============================================================

PyG objects are converted in memory with :func:`graphrun.graph.pyg.from_pyg`.
Every command that takes a DATASET argument calls :func:`load_graph`, so it works
on an importable folder as well; ``graphrun import`` converts once and keeps the
original-id mapping. Bad input raises one :class:`DatasetError` line.
"""

from __future__ import annotations

from pathlib import Path

from graphrun.errors import DatasetError
from graphrun.graph.format import is_dataset_dir, load_dataset, load_id_maps
from graphrun.graph.graph import Graph
from graphrun.graph.imported import FORMATS, Imported, detect_table_format

__all__ = [
    "FORMATS", "INPUT_FORMATS", "Imported", "detect_format", "detect_table_format",
    "import_graph", "load_graph",
]  # fmt: skip

INPUT_FORMATS = ("dataset", "npy", *FORMATS)


def detect_format(path: str | Path) -> str:
    """Which of :data:`INPUT_FORMATS` ``path`` is; a DatasetError if none."""
    p = Path(path)
    if not p.exists():
        raise DatasetError(f"{p}: no such file or directory")
    if is_dataset_dir(p):
        return "dataset"
    if p.is_dir() and (p / "src.npy").exists():
        return "npy"
    fmt = detect_table_format(p)
    if fmt is not None:
        return fmt
    raise DatasetError(
        f"{p}: not a graphrun dataset (graph.json) nor an importable folder "
        "(src.npy + dst.npy, edges.csv, edges.parquet or edges/)"
    )


def import_graph(path: str | Path, fmt: str | None = None, name: str | None = None) -> Imported:
    """Read any accepted input; ``fmt`` forces the format (see the module docstring)."""
    p = Path(path)
    if fmt is not None and fmt not in INPUT_FORMATS:
        raise DatasetError(f"format {fmt!r}: expected one of {', '.join(INPUT_FORMATS)}")
    if not p.exists():
        raise DatasetError(f"{p}: no such file or directory")
    fmt = fmt or detect_format(p)
    if fmt == "dataset":
        return Imported(load_dataset(p), load_id_maps(p))
    if fmt == "npy":
        from graphrun.graph.npy_folder import import_npy_folder

        return Imported(import_npy_folder(p, name))
    from graphrun.graph.tables import import_tables  # pyarrow is imported only when needed

    return import_tables(p, fmt, name)


def load_graph(path: str | Path, fmt: str | None = None) -> Graph:
    """The graph at ``path``: a dataset directory or any importable input."""
    return import_graph(path, fmt).graph
