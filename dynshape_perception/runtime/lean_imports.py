"""What a process that serves models keeps out of its imports."""

from __future__ import annotations

import sys

# tvm_ffi imports PyTorch whenever it is installed (JetPack ships it, so do development
# environments), only to bridge DLPack with torch tensors, which the nodes never hold: about
# 200 MB resident in every node and compile worker.
UNUSED = ("torch",)


def keep_unused_out() -> None:
    """Make ``import torch`` fail in this process, unless it is already imported. Call it
    before TVM is first imported."""
    for name in UNUSED:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]
