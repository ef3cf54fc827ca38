"""Pin PyTorch to bit-reproducible CPU arithmetic: portable kernels, one thread, seeds."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

log = logging.getLogger(__name__)

# Kernel choices that vary with the CPU (AVX-512 or AVX2 paths, MKL's per-CPU code) would
# change the fitted bits from one machine to the next; these select the portable paths.
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
}
TORCH_VERSION = "2.13.0"


def pin_environment() -> None:
    """Set the pinned variables; they only take effect if torch is not imported yet."""
    if "torch" in sys.modules:
        if any(os.environ.get(k) != v for k, v in PINNED_ENV.items()):
            log.warning("torch was imported before fitting pinned its kernels; bits may differ")
        return
    os.environ.update(PINNED_ENV)


def configure(torch: Any, seed: int) -> None:
    """One thread, deterministic algorithms, no oneDNN, and the seed."""
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.backends.mkldnn.enabled = False
    torch.manual_seed(seed)


def fit_environment(torch: Any) -> dict[str, str]:
    """What the manifest records about the numeric environment of a fit."""
    return {
        "torch": str(torch.__version__).split("+")[0],
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        **{key: os.environ.get(key, "") for key in sorted(PINNED_ENV)},
    }
