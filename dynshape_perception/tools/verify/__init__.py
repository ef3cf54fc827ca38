"""Target checks: aarch64 under emulation and CUDA device code."""
