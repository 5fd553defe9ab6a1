"""PyG's generated modules, removed by the process that made them (machine.templates)."""

from __future__ import annotations

import os
import subprocess
import sys

BUILD = """
from torch_geometric.nn import GATConv, SAGEConv
from graphrun.machine.templates import drop_pyg_templates
SAGEConv(4, 4)
GATConv(4, 4)
print(drop_pyg_templates())
"""


def test_the_modules_pyg_wrote_are_removed_and_nothing_else(tmp_path):
    """Through a temporary directory that is a symlink, too (macOS's /tmp)."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "tmp").symlink_to(real)
    (real / "torch_geometric.nn.conv.sage_conv_SAGEConv_propagate_other.py").write_text("")
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    out = subprocess.run(
        [sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["3"]  # SAGEConv's propagate, GATConv's and its edge_updater
    # another process's file (the same name but for its random part) is left alone
    assert [p.name for p in real.glob("*.py")] == [
        "torch_geometric.nn.conv.sage_conv_SAGEConv_propagate_other.py"
    ]
