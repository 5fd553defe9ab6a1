"""What PyG leaves in the temporary directory, removed by the processes that made it.

PyG (``torch_geometric.template``) renders a message-passing class's ``propagate`` (and
``edge_updater``) into a new file of the temporary directory the first time a process
builds one, imports it and leaves it there (``delete=False``): one file per cold trainer
and four per warm server, every run (480 in /tmp after a day of jobs). Imported, nothing
reads them again (graphrun scripts no model), so the warm server
(:mod:`graphrun.machine.warm`) removes its own once built and a trainer
(:mod:`graphrun.machine.trainer`) its own as it ends. A trainer killed with SIGKILL
leaves its one.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path


def drop_pyg_templates() -> int:
    """Remove the files of the modules PyG generated in this process; returns how many.
    Only a module of ``torch_geometric`` whose file PyG named so (``<module>_<random>.py``,
    directly in the temporary directory) is touched."""
    tmp = Path(tempfile.gettempdir()).resolve()
    dropped = 0
    for name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if not name.startswith("torch_geometric.") or not isinstance(file, str):
            continue
        path = Path(file)
        if (
            path.name.startswith(f"{name}_")
            and path.suffix == ".py"
            and path.parent.resolve() == tmp
        ):
            with contextlib.suppress(FileNotFoundError):  # a warm server's: it went first
                path.unlink()
                dropped += 1
    return dropped
