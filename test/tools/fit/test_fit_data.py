"""Training-data plumbing of the fits: source lists, generated windows, provenance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="fitting needs PyTorch (requirements-fit.txt)")

from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.tools.fit.data import (
    GeneratedFamilies,
    SyntheticPedestrians,
    annotate,
    family_windows,
    parse_sources,
    run_windows,
    synthetic_windows,
    track_windows,
)
from dynshape_perception.tools.fit.runner import fit_command

ALLOWED = ("eth", "hotel", "synthetic")


def test_sources_are_normalised() -> None:
    assert parse_sources("Synthetic, hotel,hotel", ALLOWED) == ("hotel", "synthetic")
    assert fit_command("predictor", ("hotel", "synthetic"), 3) == (
        "dynshape-perception fit --model predictor --data hotel,synthetic --seed 3"
    )


@pytest.mark.parametrize("text", ["", "zara1", "eth,kitti", " , "])
def test_unknown_sources_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--data takes"):
        parse_sources(text, ALLOWED)


def test_synthetic_windows_are_seeded_and_shaped() -> None:
    spec = SyntheticPedestrians(scenes=2, agents=4, steps=22, idle_share=0.5)
    first, detail = synthetic_windows(5, spec, history=10)
    again, _ = synthetic_windows(5, spec, history=10)
    other, _ = synthetic_windows(6, spec, history=10)
    walking = 2 * 4 * (22 - 20 + 1)
    assert first.positions.shape == (2 * walking, 10 + 12, 2)
    assert (first.lengths == 8).all()
    # Two rows before the eight observed ones repeat the first of them.
    np.testing.assert_array_equal(first.positions[:, 0], first.positions[:, 2])
    np.testing.assert_array_equal(first.positions, again.positions)
    assert not np.array_equal(first.positions, other.positions)
    assert f"{walking} walking windows" in detail
    assert f"{walking} idle ones" in detail
    with pytest.raises(ConfigError, match="observe 8"):
        synthetic_windows(5, spec, history=6)


def test_run_windows_see_every_step_through_up_to_history_steps() -> None:
    steps = np.arange(20, dtype=np.float64)
    runs = np.stack([np.c_[steps, 0 * steps], np.c_[0 * steps, -steps]])  # two agents, 20 steps
    windows = run_windows(runs, history=4, horizon=12)
    # Last observations at steps 1..7 (12 steps must follow), for each of the two runs.
    assert windows.count == 2 * 7
    np.testing.assert_array_equal(windows.lengths[:7], [2, 3, 4, 4, 4, 4, 4])
    first = windows.positions[0, :, 0]
    np.testing.assert_array_equal(first, [0, 0, 0, 1, *range(2, 14)])
    last = windows.positions[6, :, 0]
    np.testing.assert_array_equal(last, range(4, 20))
    np.testing.assert_array_equal(windows.positions[7:, :, 1], -windows.positions[:7, :, 0])
    assert run_windows(runs[:, :13], history=4, horizon=12).count == 0
    with pytest.raises(ConfigError, match="history >= 2"):
        run_windows(runs, history=1, horizon=12)


def test_track_windows_stop_at_gaps_in_the_frames() -> None:
    frames = np.r_[np.arange(0, 150, 10), np.arange(300, 450, 10)]  # two runs of 15 frames
    xy = np.c_[np.arange(30.0), np.zeros(30)]
    windows = track_windows({4: (frames, xy)}, history=8, horizon=12)
    assert windows.count == 2 * (15 - 12 - 1)
    # No window spans the gap: each one's steps are consecutive.
    assert (np.diff(windows.positions[..., 0], axis=1) >= 0).all()
    assert np.diff(windows.positions[..., 0], axis=1).max() == 1.0
    assert track_windows({}, 8, 12).count == 0


def test_annotation_holds_a_standing_mark_and_marks_a_walker_every_step() -> None:
    rng = np.random.default_rng(0)
    steps = np.arange(20, dtype=np.float64)
    standing = np.zeros((1, 20, 2)) + rng.normal(0.0, 0.005, (1, 20, 2))  # shuffling on the spot
    walking = np.stack([np.c_[0.5 * steps, 0.0 * steps]])
    marked = annotate(rng, np.concatenate([standing, walking]), noise_m=0.03, hold_m=0.08)
    # Whatever its hold, the standing one moved less than the smallest: some marks repeat.
    still = np.linalg.norm(np.diff(marked[0], axis=0), axis=1)
    walked = np.linalg.norm(np.diff(marked[1], axis=0), axis=1)
    assert (still == 0.0).mean() > 0.5
    assert (walked > 0.3).all() and np.abs(marked[1] - walking[0]).max() < 4 * 0.03
    exact = annotate(rng, walking, noise_m=0.0, hold_m=0.0)
    np.testing.assert_array_equal(exact, walking)


def test_family_windows_are_seeded_and_varied() -> None:
    spec = GeneratedFamilies(scenes=2, steps=20)
    first, source = family_windows("groups", 2, spec, history=6)
    again, _ = family_windows("groups", 2, spec, history=6)
    np.testing.assert_array_equal(first.positions, again.positions)
    assert first.positions.shape[1:] == (6 + 12, 2)
    assert first.lengths.min() == 2 and first.lengths.max() == 6
    assert source.name == "groups" and "annotation noise up to 0.04 m" in source.detail
    steps = np.linalg.norm(np.diff(first.positions[:, -13:], axis=1), axis=2)
    assert 0.02 < (steps == 0.0).mean() < 0.6, "standing marks repeat, walking ones do not"
    speeds = steps[:, 1:] / 0.4
    assert np.median(speeds) > 0.3, "most of them walk"
    with pytest.raises(ConfigError, match="unknown crowd family"):
        family_windows("parade", 0, spec, history=6)
    with pytest.raises(ConfigError, match="hold_m"):
        GeneratedFamilies(hold_m=-0.1)


def test_synthetic_spec_is_checked() -> None:
    with pytest.raises(ConfigError, match="steps"):
        SyntheticPedestrians(steps=10)
    with pytest.raises(ConfigError, match="idle_share"):
        SyntheticPedestrians(idle_share=1.0)


def test_sources_without_any_window_are_a_data_error(tmp_path: Path) -> None:
    from dynshape_perception.tools.fit.predictor import PredictorFitConfig, training_windows

    (tmp_path / "eth_ucy").mkdir()
    (tmp_path / "eth_ucy" / "biwi_hotel.txt").write_text("")
    with pytest.raises(DataError, match="nothing to fit on"):
        training_windows(("hotel",), 0, PredictorFitConfig(), tmp_path)


def test_real_scenes_can_come_from_named_files(tmp_path: Path) -> None:
    from dynshape_perception.tools.fit.predictor import PredictorFitConfig, training_windows

    rows = [f"{10 * i}\t1\t{0.4 * i:.2f}\t0.0" for i in range(25)]
    scene = tmp_path / "lane.txt"
    scene.write_text("\n".join(rows) + "\n")
    data = training_windows(("lane",), 0, PredictorFitConfig(), scene_files={"lane": scene})
    real, generated = data.pools(("lane",))
    assert generated.count == 0
    # 25 frames: last observations at steps 1..12 each leave 12 steps to predict.
    assert real.count == 12 and real.positions.shape[1] == 32 + 12
    (source,) = data.sources
    assert source.name == "lane" and source.file == "lane.txt" and len(source.sha256) == 64


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_fit_seeds_are_checked_before_anything_runs(seed: int, tmp_path: Path) -> None:
    from dynshape_perception.tools.fit.runner import fit_and_save

    with pytest.raises(ConfigError, match="--seed must be an integer"):
        fit_and_save("associator", None, seed, tmp_path)
    assert not list(tmp_path.iterdir())
