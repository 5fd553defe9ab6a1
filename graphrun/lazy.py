"""Names a package exports but imports only when first used (PEP 562's module
``__getattr__``): a process that needs one module of a package (a store server the
sampling kernels, a writer the live writer, a machine worker the shared-memory
segments) does not import torch, torch_geometric or zmq through its other modules.

    __getattr__ = lazy_names(__name__, {"KVClient": "client", ...})
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_names(package: str, where: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: ``where[name]`` is the module of the
    package (``package.<module>``) that defines ``name``, imported on its first use."""

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
