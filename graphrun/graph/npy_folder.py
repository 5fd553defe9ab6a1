"""Import a folder of plain ``.npy`` arrays (a homogeneous graph).

::

    SRC/
      src.npy  dst.npy      required: 1-d integer arrays of equal length, node ids >= 0
      feat.npy              optional: node features, one row per node (numeric)
      label.npy             optional: 1-d integer node labels, one per node
      train_idx.npy         optional: 1-d integer node ids; each becomes a boolean
      val_idx.npy                     ``train_mask``/``val_mask``/``test_mask``
      test_idx.npy

``num_nodes`` is the largest of (max node id in ``src``/``dst``) + 1 and the row
counts of ``feat.npy``/``label.npy``; ``feat.npy`` and ``label.npy`` must then have
exactly ``num_nodes`` rows. Ids are converted to int64; ``feat`` keeps its dtype
(float or integer). Arrays are memory-mapped while they are checked. Every
problem raises a :class:`DatasetError` naming the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphrun.errors import DatasetError
from graphrun.graph.format import load_npy
from graphrun.graph.graph import SPLITS, Graph


def _ids(path: Path) -> np.ndarray:
    arr = load_npy(path)
    if arr.ndim != 1:
        raise DatasetError(f"{path}: expected a 1-d array, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise DatasetError(f"{path}: expected an integer dtype, got {arr.dtype}")
    if len(arr) and int(arr.min()) < 0:
        i = int(np.flatnonzero(arr < 0)[0])
        raise DatasetError(f"{path}: entry {i} is {int(arr[i])}; ids must be >= 0")
    return arr.astype(np.int64, copy=False)


def _rows(path: Path) -> np.ndarray | None:
    if not path.exists():
        return None
    arr = load_npy(path)
    if arr.ndim == 0:
        raise DatasetError(f"{path}: expected one row per node, got a scalar")
    return arr


def import_npy_folder(path: str | Path, name: str | None = None) -> Graph:
    """Build a :class:`Graph` from a folder of ``.npy`` arrays (see the module docstring)."""
    root = Path(path)
    if not root.is_dir():
        raise DatasetError(f"{root}: no such directory")
    src = _ids(root / "src.npy")
    dst = _ids(root / "dst.npy")
    if len(src) != len(dst):
        raise DatasetError(f"{root / 'dst.npy'}: has {len(dst)} entries but src.npy has {len(src)}")
    feat = _rows(root / "feat.npy")
    label = _rows(root / "label.npy")
    max_id = max(int(src.max()) if len(src) else -1, int(dst.max()) if len(dst) else -1)
    n = max([max_id + 1] + [len(a) for a in (feat, label) if a is not None])
    ndata: dict[str, np.ndarray] = {}
    if feat is not None:
        if len(feat) != n:
            raise DatasetError(
                f"{root / 'feat.npy'}: has {len(feat)} rows but the edges reference node "
                f"{max_id} (need {n} rows)"
            )
        if not (np.issubdtype(feat.dtype, np.number) or feat.dtype == np.bool_):
            raise DatasetError(f"{root / 'feat.npy'}: expected a numeric dtype, got {feat.dtype}")
        ndata["feat"] = feat
    if label is not None:
        if label.ndim != 1 or len(label) != n:
            raise DatasetError(
                f"{root / 'label.npy'}: expected {n} labels (1-d), got shape {label.shape}"
            )
        if not np.issubdtype(label.dtype, np.integer):
            raise DatasetError(
                f"{root / 'label.npy'}: expected an integer dtype, got {label.dtype}"
            )
        ndata["label"] = label.astype(np.int64, copy=False)
    for split in SPLITS:
        f = root / f"{split}_idx.npy"
        if not f.exists():
            continue
        idx = _ids(f)
        if len(idx) and int(idx.max()) >= n:
            i = int(np.flatnonzero(idx >= n)[0])
            raise DatasetError(f"{f}: entry {i} is node {int(idx[i])}, out of range [0, {n})")
        mask = np.zeros(n, dtype=bool)
        mask[idx] = True
        ndata[f"{split}_mask"] = mask
    try:
        return Graph(
            num_nodes=n,
            src=src,
            dst=dst,
            ndata={"_N": ndata} if ndata else {},
            name=name or root.name,
        )
    except DatasetError as exc:
        raise DatasetError(f"{root}: {exc}") from None
