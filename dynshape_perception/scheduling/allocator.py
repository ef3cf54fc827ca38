"""How much freed memory the C allocator keeps, so that per-frame arrays reuse it."""

from __future__ import annotations

import ctypes
import logging

from dynshape_perception.errors import ConfigError

log = logging.getLogger(__name__)

# glibc's mallopt parameters, and the largest mmap threshold it takes on 64-bit hosts.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
_INT_MAX = 2**31 - 1


def keep_freed_memory(megabytes: int) -> bool:
    """Let glibc keep up to ``megabytes`` of freed memory for reuse (its trim threshold), and
    serve arrays up to 32 MB from its heaps rather than fresh mappings; returns whether the
    C library took both settings (False where it is not glibc).

    By default a freed cloud's pages go back to the system, at the top of a heap or as a
    whole mapping, and the next frame's arrays fault fresh zeroed pages in again. The
    setting is process-wide and stays: memory kept for reuse is not a leak.
    """
    if isinstance(megabytes, bool) or not isinstance(megabytes, int) or megabytes < 1:
        raise ConfigError(
            f"memory kept for reuse must be a whole number of MB >= 1, got {megabytes!r}"
        )
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    keep = min(megabytes * 1024 * 1024, _INT_MAX)
    trimmed = mallopt(M_TRIM_THRESHOLD, keep) == 1
    mapped = mallopt(M_MMAP_THRESHOLD, min(keep, MMAP_THRESHOLD_MAX)) == 1
    return bool(trimmed and mapped)
