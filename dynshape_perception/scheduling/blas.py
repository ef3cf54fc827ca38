"""The thread counts of the libraries the lanes call (NumPy's OpenBLAS, OpenCV): one lane
must not wait on another's."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from pathlib import Path

from dynshape_perception.errors import ConfigError

log = logging.getLogger(__name__)

# (set, get) entry points of the OpenBLAS builds NumPy ships or links: scipy-openblas
# (64-bit and 32-bit integer builds), then a plain OpenBLAS.
_SYMBOLS = (
    ("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
    ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
    ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
    ("openblas_set_num_threads", "openblas_get_num_threads"),
)


def _loaded_openblas() -> Iterator[Path]:
    """OpenBLAS libraries mapped into this process (NumPy's, once NumPy is imported)."""
    seen: set[str] = set()
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return
    for line in maps:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and "openblas" in Path(parts[5]).name.lower() and parts[5] not in seen:
            seen.add(parts[5])
            yield Path(parts[5])


def set_blas_threads(threads: int) -> int | None:
    """Set the thread count of every loaded OpenBLAS; returns the previous count (of the
    first), or None when none could be set (no OpenBLAS, or an unknown build).

    A multithreaded BLAS call hands part of its work to OpenBLAS' own worker threads, which
    run at normal priority and spin after each call: a real-time lane calling BLAS then
    waits on a thread that any lower-tier lane pre-empts, and the spinning takes a core
    from the lanes. With one thread, every BLAS call runs on the lane that made it.
    """
    if threads < 1:
        raise ConfigError(f"BLAS threads must be >= 1, got {threads}")
    import numpy  # noqa: F401 - NumPy loads the OpenBLAS whose threads are set here

    previous: int | None = None
    for path in _loaded_openblas():
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as err:
            log.warning("cannot open %s to set its threads: %s", path, err)
            continue
        for set_name, get_name in _SYMBOLS:
            setter = getattr(lib, set_name, None)
            getter = getattr(lib, get_name, None)
            if setter is None or getter is None:
                continue
            getter.restype = ctypes.c_int
            setter.argtypes = [ctypes.c_int]
            old = int(getter())
            setter(int(threads))
            previous = old if previous is None else previous
            break
    return previous


def set_opencv_threads(threads: int) -> int:
    """Set OpenCV's thread count (process-wide); returns the previous one.

    OpenCV splits a call (the clustering's closing and labelling) over its own worker
    threads: on a host whose lanes already fill the cores, those workers only take a core
    from another lane, and the call waits for the slowest of them.
    """
    if threads < 1:
        raise ConfigError(f"OpenCV threads must be >= 1, got {threads}")
    import cv2

    previous = int(cv2.getNumThreads())
    cv2.setNumThreads(int(threads))
    return previous
