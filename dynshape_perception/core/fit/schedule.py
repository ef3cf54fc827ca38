"""The learning-rate schedule every fit uses: a cosine decay to a floor."""

from __future__ import annotations

import math
from typing import Any


def cosine_share(step: int, steps: int, final_share: float) -> float:
    """The share of the base rate at ``step``: 1 at the start, ``final_share`` at the end."""
    progress = step / max(steps - 1, 1)
    return final_share + (1.0 - final_share) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: Any, rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = rate
