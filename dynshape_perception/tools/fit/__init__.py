"""Deterministic fitting of the model weights with PyTorch on CPU, pinned to portable kernels."""

from __future__ import annotations

from dynshape_perception.tools.fit.torch_env import pin_environment

# Every submodule imports torch; the pinned kernels must be chosen before it loads.
pin_environment()
