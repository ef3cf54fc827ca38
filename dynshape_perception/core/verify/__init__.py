"""Target checks: aarch64 under emulation, CUDA device code, and a runtime-only runner."""
