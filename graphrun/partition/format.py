"""The partition directory format (version 1). Writer and reader follow."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graphrun.errors import PartitionFormatError

FORMAT = "graphrun-partition"
VERSION = 1
CONFIG_FILE = "partition.json"


def load_partition_config(path: str | Path) -> dict[str, Any]:
    """Read and check ``partition.json`` of a partition directory (or the file itself)."""
    p = Path(path)
    cfile = p if p.name == CONFIG_FILE else p / CONFIG_FILE
    if not cfile.parent.is_dir():
        raise PartitionFormatError(f"{cfile.parent}: no such partition directory")
    if not cfile.is_file():
        raise PartitionFormatError(f"{cfile}: missing (partition config)")
    try:
        cfg = json.loads(cfile.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PartitionFormatError(f"{cfile}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise PartitionFormatError(f"{cfile}: expected a JSON object")
    if cfg.get("format") != FORMAT:
        raise PartitionFormatError(
            f"{cfile}: field 'format' is {cfg.get('format')!r}, not {FORMAT!r}"
        )
    if cfg.get("version") != VERSION:
        raise PartitionFormatError(
            f"{cfile}: field 'version' is {cfg.get('version')!r}; "
            f"this graphrun reads version {VERSION}"
        )
    return cfg
