"""The predictor fit's augmentation and loss: what a batch becomes, and what each term rewards."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pytest

if TYPE_CHECKING:
    from torch import Tensor

torch = pytest.importorskip("torch", reason="fitting needs PyTorch (requirements-fit.txt)")

from dynshape_perception.errors import ConfigError  # noqa: E402
from dynshape_perception.tools.fit.predictor import (  # noqa: E402
    PredictorFitConfig,
    _reverse,
    augment,
    calibration_folds,
    gate_labels,
    platt,
    wta_loss,
)
from dynshape_perception.tools.fit.torch_models import top_learned  # noqa: E402

HISTORY, HORIZON = 6, 12


def _turning_windows() -> tuple[Tensor, Tensor]:
    """Two windows of a walker on a quarter circle, seen through 4 and 6 steps."""
    angle = np.linspace(0.0, math.pi / 2, HISTORY + HORIZON)
    path = np.c_[5.0 * np.cos(angle), 5.0 * np.sin(angle)] + [2.0, -1.0]
    positions = np.stack([path, path.copy()])
    positions[0, :2] = path[2]  # observed from row 2 on: the rows before repeat it
    return torch.from_numpy(positions), torch.tensor([4, HISTORY])


def test_reversed_windows_keep_their_lengths_and_swap_past_and_future() -> None:
    positions, lengths = _turning_windows()
    back = _reverse(positions, lengths, torch.tensor([True, False]), HORIZON)
    np.testing.assert_array_equal(back[1], positions[1])
    # The observed span (rows 2..17) runs backwards in place; rows before it repeat row 2.
    np.testing.assert_array_equal(back[0, 2:], positions[0, 2:].flip(0))
    np.testing.assert_array_equal(back[0, :2], positions[0, -1:].expand(2, -1))
    again = _reverse(back, lengths, torch.tensor([True, True]), HORIZON)
    np.testing.assert_array_equal(again[0], positions[0])


def test_augment_centres_cuts_and_moves_rigidly() -> None:
    positions, lengths = _turning_windows()
    fit = PredictorFitConfig(reverse_share=0.0, short_share=0.0, extra_noise_share=0.0)
    gen = torch.Generator().manual_seed(3)
    history, kept, future = augment(positions.repeat(50, 1, 1), lengths.repeat(50), fit, 8, gen)
    assert history.dtype == future.dtype == torch.float32 and kept.dtype == torch.int32
    assert history.shape == (100, HISTORY, 2) and future.shape == (100, HORIZON, 2)
    np.testing.assert_array_equal(kept.numpy(), np.tile([4, HISTORY], 50))
    short = history[0::2]
    # Left-aligned: the last observed point is the origin, and the rows past it repeat it.
    np.testing.assert_allclose(short[:, 3], 0.0, atol=1e-6)
    np.testing.assert_allclose(short[:, 4:], 0.0, atol=1e-6)
    np.testing.assert_allclose(history[1::2, -1], 0.0, atol=1e-6)
    # Rotation, mirror and speed scale: every distance of a window scales by one factor.
    seq = torch.cat([history[1::2], future[1::2]], dim=1).double()
    original = positions[1]
    step = (seq[:, 1:] - seq[:, :-1]).norm(dim=-1)
    factor = step / (original[1:] - original[:-1]).norm(dim=-1)
    np.testing.assert_allclose(factor / factor[:, :1], 1.0, rtol=1e-4)
    lo, hi = fit.scale_range
    assert lo <= float(factor.min()) and float(factor.max()) <= hi
    # Both turning senses occur: mirrored copies turn the other way.
    turn = seq[:, -1, 0] * seq[:, 0, 1] - seq[:, -1, 1] * seq[:, 0, 0]
    assert (turn > 0).any() and (turn < 0).any()


def test_augment_cuts_to_the_cap_and_shortens_at_random() -> None:
    positions, lengths = _turning_windows()
    fit = PredictorFitConfig(reverse_share=0.0, short_share=1.0)
    gen = torch.Generator().manual_seed(4)
    _, kept, _ = augment(positions.repeat(200, 1, 1), lengths.repeat(200), fit, 5, gen)
    assert int(kept.min()) == 2 and int(kept.max()) == 5
    _, full, _ = augment(positions, lengths, replace(fit, short_share=0.0), 3, gen)
    np.testing.assert_array_equal(full.numpy(), [3, 3])


def test_the_anchor_term_pulls_mode_one_and_soft_targets_spread_confidence() -> None:
    fut = torch.zeros(1, HORIZON, 2)
    traj = torch.zeros(1, 3, HORIZON, 2)
    traj[0, 1, :, 0] = 1.0  # the central mode misses by 1 m
    traj[0, 2, :, 0] = 0.1  # a near miss beside the exact mode 0
    logits = torch.zeros(1, 3)
    plain = PredictorFitConfig(anchor_weight=0.0, top_anchor_weight=0.0, confidence_temperature=0.0)
    loss, winner = wta_loss(traj, logits, fut, plain, relax=0.0)
    anchored, _ = wta_loss(traj, logits, fut, replace(plain, anchor_weight=0.5), relax=0.0)
    # Mode 0 (constant velocity) is exact here, but takes no part: the near miss wins.
    assert int(winner[0]) == 2
    # The anchor's cost is 1 m mean + 0.5 x 1 m final, weighted by 0.5.
    assert float(anchored - loss) == pytest.approx(0.75, abs=1e-3)
    logits.requires_grad_(True)
    soft = replace(plain, confidence_temperature=0.3)
    wta_loss(traj, logits, fut, soft, relax=0.0)[0].backward()
    grad = logits.grad[0]
    # Gradient descent raises mode 2 (0.15 m off) and lowers mode 1; mode 0's logit takes
    # no part, though mode 0 is exact: the gate alone ranks constant velocity.
    assert grad[2] < 0 < grad[1] and float(grad[0]) == 0.0


def test_windows_constant_velocity_covers_stop_pulling_the_learned_modes() -> None:
    fut = torch.zeros(3, HORIZON, 2)
    traj = torch.zeros(3, 4, HORIZON, 2)
    traj[:, 1:, :, 0] = torch.tensor([1.0, 2.0, 3.0])[None, :, None]
    traj[1, 0, :, 0] = 2.0  # constant velocity misses by 2 m: the learned mode 1 wins
    traj[2, 0, :, 0] = 1.05  # constant velocity 5 % behind mode 1
    fit = PredictorFitConfig(anchor_weight=0.0, top_anchor_weight=0.0, classification_weight=0.0)

    def pulled(cover: float, margin: float) -> np.ndarray:
        modes = traj.clone().requires_grad_(True)
        cfg = replace(fit, cv_margin=margin)
        wta_loss(modes, torch.zeros(3, 4), fut, cfg, relax=0.0, cover=cover)[0].backward()
        return modes.grad[:, 1:].abs().sum(dim=(2, 3)).numpy() > 0

    # Without the weight on covered windows only the learned winner of each window is pulled.
    np.testing.assert_array_equal(pulled(1.0, 0.0)[:, 0], [True, True, True])
    # Window 0 is covered exactly by constant velocity; with a 10 % margin window 2 too.
    np.testing.assert_array_equal(pulled(0.0, 0.0)[:, 0], [False, True, True])
    np.testing.assert_array_equal(pulled(0.0, 0.1)[:, 0], [False, True, False])
    assert not pulled(0.0, 0.1)[:, 1:].any()


def test_fit_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="max_history"):
        PredictorFitConfig(max_history=4)
    with pytest.raises(ConfigError, match="long_share"):
        PredictorFitConfig(long_share=1.5)
    with pytest.raises(ConfigError, match="anchor_weight"):
        PredictorFitConfig(anchor_weight=-1.0)
    with pytest.raises(ConfigError, match="cv_cover_weight"):
        PredictorFitConfig(cv_cover_weight=1.5)
    with pytest.raises(ConfigError, match="cv_cover_steps"):
        PredictorFitConfig(cv_cover_steps=0)
    with pytest.raises(ConfigError, match="top_anchor_weight"):
        PredictorFitConfig(top_anchor_weight=-0.1)
    with pytest.raises(ConfigError, match="extra_noise_share"):
        PredictorFitConfig(extra_noise_share=1.5)
    with pytest.raises(ConfigError, match="extra_noise_m"):
        PredictorFitConfig(extra_noise_m=-0.01)


def test_the_top_anchor_pulls_the_likeliest_learned_mode_wherever_it_loses() -> None:
    fut = torch.zeros(2, HORIZON, 2)
    traj = torch.zeros(2, 4, HORIZON, 2)
    traj[:, 1:, :, 0] = torch.tensor([0.5, 1.0, 0.2])[None, :, None]
    logits = torch.tensor([[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, 3.0]])
    fit = PredictorFitConfig(anchor_weight=0.0, classification_weight=0.0, gate_weight=0.0)

    def pulled(weight: float) -> tuple[float, np.ndarray]:
        modes = traj.clone().requires_grad_(True)
        loss, _ = wta_loss(modes, logits, fut, replace(fit, top_anchor_weight=weight), 0.0)
        loss.backward()
        return float(loss.detach()), modes.grad.abs().sum(dim=(2, 3)).numpy() > 0

    plain, free = pulled(0.0)
    anchored, pull = pulled(0.5)
    # Mode 3 wins both windows; the likeliest learned mode (2, then 3) is pulled as well.
    np.testing.assert_array_equal(free, [[False, False, False, True]] * 2)
    np.testing.assert_array_equal(pull, [[False, False, True, True], [False, False, False, True]])
    # 0.5 x the mean over windows of the top mode's cost (1 m + 0.5 x 1 m, 0.2 m + 0.1 m).
    assert anchored - plain == pytest.approx(0.5 * (1.5 + 0.3) / 2, abs=1e-3)


def test_augment_adds_annotation_noise_in_metres_whatever_the_speed_scale() -> None:
    standing = torch.zeros(400, HISTORY + HORIZON, 2, dtype=torch.float64)
    lengths = torch.full((400,), HISTORY)
    fit = PredictorFitConfig(reverse_share=0.0, short_share=0.0, extra_noise_m=0.05)
    gen = torch.Generator().manual_seed(5)
    clean, _, still = augment(standing, lengths, replace(fit, extra_noise_share=0.0), 8, gen)
    assert float(clean.abs().max()) == 0.0 and float(still.abs().max()) == 0.0
    history, _, future = augment(standing, lengths, replace(fit, extra_noise_share=0.5), 8, gen)
    marks = torch.cat([history, future], dim=1) - history[:, -1:]
    moved = marks.abs().amax(dim=(1, 2)) > 0
    # About half the windows are marked with noise, none of it over 6 sigma of 0.05 m.
    assert 120 < int(moved.sum()) < 280
    assert float(marks.abs().max()) < 2 * 6 * 0.05


def test_the_gate_learns_where_the_top_learned_mode_clearly_beats_constant_velocity() -> None:
    fut = torch.zeros(3, HORIZON, 2)
    traj = torch.zeros(3, 3, HORIZON, 2)
    traj[:, 0, :, 0] = 1.0  # constant velocity misses by 1 m
    traj[:, 1, :, 0] = torch.tensor([0.5, 0.97, 1.5])[:, None]
    traj[:, 2, :, 0] = torch.tensor([2.0, 0.5, 0.5])[:, None]
    # The confidence head ranks mode 1 first in windows 0 and 1, mode 2 in window 2; mode
    # 0's logit, however high, is no learned mode.
    logits = torch.tensor([[9.0, 1.0, 0.0], [9.0, 1.0, 0.0], [9.0, 0.0, 1.0]])
    top = top_learned(logits)
    np.testing.assert_array_equal(top.numpy(), [1, 1, 2])
    labels = gate_labels(traj, fut, 0.05, top)
    # 0.97 m beats 1 m, but not by 5 %: no clear gain; mode 2's 0.5 m in window 1 is not
    # what the top-ranked hypothesis would be.
    np.testing.assert_array_equal(labels.numpy(), [1.0, 0.0, 1.0])
    gate = torch.zeros(3, requires_grad=True)
    fit = PredictorFitConfig(anchor_weight=0.0, classification_weight=0.0)
    wta_loss(traj, logits, fut, fit, relax=0.0, gate=gate)[0].backward()
    assert gate.grad[0] < 0 < gate.grad[1] and gate.grad[2] < 0


def test_platt_calibration_follows_the_outcomes_and_refuses_a_reversed_gate() -> None:
    rng = np.random.default_rng(0)
    raw = rng.normal(0.0, 2.0, 4000)
    truth = 1.0 / (1.0 + np.exp(-(0.5 * raw - 1.0)))
    labels = (rng.random(4000) < truth).astype(float)
    a, b = platt(raw, labels, np.ones(4000))
    assert a == pytest.approx(0.5, abs=0.1) and b == pytest.approx(-1.0, abs=0.15)
    # A gate whose logit runs against the outcome states the base rate: CV stays first.
    a, b = platt(-raw, labels, np.ones(4000))
    assert a == 0.0 and 1.0 / (1.0 + math.exp(-b)) == pytest.approx(labels.mean(), abs=1e-6)


def test_calibration_folds_hold_out_real_and_generated_sources_alike() -> None:
    folds = calibration_folds(("dense", "eth", "groups", "hotel", "sparse", "synthetic"), 2)
    assert folds == [("eth", "dense", "sparse"), ("hotel", "groups", "synthetic")]
