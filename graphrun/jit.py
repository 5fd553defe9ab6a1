"""numba's ``njit`` as every compiled kernel of graphrun takes it: its machine code cached
on disk where numba finds a writable place (beside the source, ``NUMBA_CACHE_DIR`` or the
user's cache directory), and compiled at each start where it finds none (a read-only image
whose user has no home cache either), instead of failing at import.

numba is imported on the first call: a process that compiles nothing does not pay its
import (about 0.3 CPU-s).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


def njit(fn: F, signature: str | list[str] | None = None, **options: bool) -> F:
    """``fn`` compiled by ``numba.njit(**options)`` (e.g. ``nogil``, ``fastmath``),
    cached on disk where it can be; with a ``signature`` (or a list, the first that
    takes a call's arguments used), for it alone (compiled or loaded now, and never
    again for other argument types: an array of another layout is taken as it is, not
    compiled for)."""
    import numba

    args = (signature,) if signature else ()
    try:
        return cast(F, numba.njit(*args, cache=True, **options)(fn))
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return cast(F, numba.njit(*args, **options)(fn))
