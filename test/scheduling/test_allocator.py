"""The C allocator keeps freed memory for reuse: a frame's arrays come from its heaps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.scheduling.allocator import keep_freed_memory
from dynshape_perception.scheduling.work import ExecutorOptions

# In a fresh process, whose heap holds no freed memory yet that could serve the array: the
# bytes of fresh mappings a 4 MB array adds while it lives, at glibc's default threshold
# and after the setting.
_PROBE = """
import ctypes, json
import numpy as np
from dynshape_perception.scheduling.allocator import keep_freed_memory

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd",
        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
if getattr(libc, "mallinfo2", None) is None:
    print(json.dumps(None))
    raise SystemExit(0)
libc.mallinfo2.restype = MallInfo2
# glibc's default threshold, fixed: freeing a mapped array would otherwise raise it.
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
assert libc.mallopt(-3, 128 * 1024) == 1

def mapped_while_held():
    before = libc.mallinfo2().hblkhd
    held = np.empty(4 * 1024 * 1024, np.uint8)
    during = libc.mallinfo2().hblkhd
    del held
    return int(during - before)

default = mapped_while_held()
kept = keep_freed_memory(64)
print(json.dumps([default, kept, mapped_while_held()]))
"""


def test_an_array_a_frame_frees_and_takes_again_comes_from_the_heap() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result is None:
        pytest.skip("the C library is not glibc 2.33 or later")
    default, kept, after = result
    assert default >= 4 * 1024 * 1024
    assert kept is True
    assert after == 0


@pytest.mark.parametrize("megabytes", [0, -1, True, 1.5])
def test_memory_kept_must_be_a_whole_number_of_megabytes(megabytes: object) -> None:
    with pytest.raises(ConfigError, match="kept for reuse"):
        keep_freed_memory(megabytes)  # type: ignore[arg-type]


def test_the_option_refuses_less_than_one_megabyte() -> None:
    with pytest.raises(ConfigError, match="allocator_keep_mb"):
        ExecutorOptions(allocator_keep_mb=0)
