"""The learning-rate schedule every fit uses, and the shared binary-classifier training loop."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)
LOG_EVERY_STEPS = 500


def cosine_share(step: int, steps: int, final_share: float) -> float:
    """The share of the base rate at ``step``: 1 at the start, ``final_share`` at the end."""
    progress = step / max(steps - 1, 1)
    return final_share + (1.0 - final_share) * 0.5 * (1.0 + math.cos(math.pi * progress))


def set_learning_rate(optimizer: Any, rate: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = rate


def adam(params: Iterable[Any], learning_rate: float) -> torch.optim.Adam:
    """Adam whose update is one fused kernel of plain float arithmetic.

    The default CPU Adam takes its square root from MKL's vector sqrt, whose bits vary with
    the CPU model (see ``torch_models.exact_sqrt``); the fused kernel's do not.
    """
    return torch.optim.Adam(params, lr=learning_rate, fused=True)


class BinaryFitConfig(Protocol):
    @property
    def steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def final_lr_share(self) -> float: ...


def train_binary_logit(
    name: str,
    net: Any,
    params: Iterable[Any],
    inputs: torch.Tensor,
    labels: torch.Tensor,
    fit: BinaryFitConfig,
    seed: int,
) -> float:
    """Adam on binary cross-entropy of ``net.logit`` over seeded random batches with the
    cosine schedule; returns the last batch's loss."""
    opt = adam(params, fit.learning_rate)
    gen = torch.Generator().manual_seed(seed)
    loss_value = float("nan")
    for step in range(fit.steps):
        set_learning_rate(
            opt, fit.learning_rate * cosine_share(step, fit.steps, fit.final_lr_share)
        )
        pick = torch.randint(inputs.shape[0], (fit.batch_size,), generator=gen)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            net.logit(inputs[pick]), labels[pick]
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_value = float(loss.detach())
        if step % LOG_EVERY_STEPS == 0 or step == fit.steps - 1:
            log.info("%s step %d/%d loss %.5f", name, step, fit.steps, loss_value)
    return loss_value
