"""The C allocator keeps freed memory for reuse: a frame's arrays come from its heaps."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.scheduling.allocator import M_MMAP_THRESHOLD, keep_freed_memory
from dynshape_perception.scheduling.work import ExecutorOptions

ARRAY_BYTES = 4 * 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None)
    if getattr(libc, "mallinfo2", None) is None:
        pytest.skip("the C library is not glibc 2.33 or later")
    libc.mallinfo2.restype = _MallInfo2
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


def _mapped_while_held(libc: ctypes.CDLL) -> int:
    """Bytes of fresh mappings an array of ARRAY_BYTES adds while it is alive."""
    before = libc.mallinfo2().hblkhd
    held = np.empty(ARRAY_BYTES, np.uint8)
    during = libc.mallinfo2().hblkhd
    del held
    return int(during - before)


def test_an_array_a_frame_frees_and_takes_again_comes_from_the_heap() -> None:
    libc = _libc()
    assert libc.mallopt(M_MMAP_THRESHOLD, 128 * 1024) == 1
    assert _mapped_while_held(libc) >= ARRAY_BYTES
    assert keep_freed_memory(64)
    assert _mapped_while_held(libc) == 0


@pytest.mark.parametrize("megabytes", [0, -1, True, 1.5])
def test_memory_kept_must_be_a_whole_number_of_megabytes(megabytes: object) -> None:
    with pytest.raises(ConfigError, match="kept for reuse"):
        keep_freed_memory(megabytes)  # type: ignore[arg-type]


def test_the_option_refuses_less_than_one_megabyte() -> None:
    with pytest.raises(ConfigError, match="allocator_keep_mb"):
        ExecutorOptions(allocator_keep_mb=0)
