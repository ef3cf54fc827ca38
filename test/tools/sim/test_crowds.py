"""Interacting crowd families: bodies keep apart, walking speeds stay in range, families differ."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.sim.crowds import (
    FAMILIES,
    MAX_SPEED_MPS,
    MIN_GAP_M,
    Family,
    family_scenes,
    separate,
)
from dynshape_perception.tools.sim.scenes import Crowd, crowd_scene

STEPS = 20


def _closest(tracks: np.ndarray) -> float:
    """The smallest centre distance of any two agents at any step."""
    if tracks.shape[0] < 2:
        return np.inf
    gaps = np.linalg.norm(tracks[:, None] - tracks[None], axis=-1)
    gaps[np.arange(tracks.shape[0]), np.arange(tracks.shape[0])] = np.inf
    return float(gaps.min())


def test_no_two_agents_overlap_in_the_densest_family() -> None:
    for scene, tracks in family_scenes(FAMILIES["dense"], 0, 2, STEPS):
        # Bodies of 0.2 m radius: centres never closer than 0.4 m, in the scene's own metres.
        assert _closest(tracks / scene.scale) > 0.4
        assert scene.agents >= 24


def test_contact_pushes_overlapping_bodies_apart() -> None:
    position = np.array([[0.0, 0.0], [0.1, 0.0], [0.1, 0.0], [5.0, 5.0]])
    moved = separate(position, MIN_GAP_M, 30)
    assert _closest(moved[:, None]) > 0.95 * MIN_GAP_M
    np.testing.assert_array_equal(moved[3], position[3])


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_walking_speeds_lie_in_range(name: str) -> None:
    family = FAMILIES[name]
    speeds = []
    for scene, tracks in family_scenes(family, 1, 2, STEPS):
        assert family.speed_mps[0] <= scene.speed_mps[0] <= scene.speed_mps[1]
        assert scene.speed_mps[1] <= family.speed_mps[1]
        step = np.linalg.norm(np.diff(tracks / scene.scale, axis=1), axis=-1) / scene.step_s
        speeds.append(step.ravel())
    every = np.concatenate(speeds)
    assert every.max() <= MAX_SPEED_MPS * 1.05
    walking = every[every > 0.2]
    assert np.percentile(walking, 95) <= family.speed_mps[1] * 1.3


def test_families_differ_in_density_and_are_seeded() -> None:
    def people(name: str) -> list[int]:
        return [scene.agents for scene, _ in family_scenes(FAMILIES[name], 3, 4, 2)]

    assert max(people("sparse")) <= 8 < 24 <= min(people("dense"))
    first = family_scenes(FAMILIES["crossing"], 5, 1, STEPS)[0][1]
    again = family_scenes(FAMILIES["crossing"], 5, 1, STEPS)[0][1]
    np.testing.assert_array_equal(first, again)
    other = family_scenes(FAMILIES["crossing"], 6, 1, STEPS)[0][1]
    assert other.shape != first.shape or not np.array_equal(first, other)


def test_crossing_flows_walk_several_ways() -> None:
    scene, tracks = family_scenes(FAMILIES["crossing"], 2, 1, STEPS)[0]
    heading = tracks[:, -1] - tracks[:, 0]
    angle = np.arctan2(heading[:, 1], heading[:, 0])
    # Counter or crossing streams: some agents walk more than 90 degrees apart.
    spread = np.abs(np.angle(np.exp(1j * (angle[:, None] - angle[None]))))
    assert scene.flows in (2, 4) and spread.max() > np.pi / 2


def test_family_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="speeds"):
        Family("fast", (1, 2), (0.1, 0.2), (0.5, 2.5), (0, 0), (0, 0), (0, 0), (0, 0))
    with pytest.raises(ConfigError, match="flows"):
        Family("odd", (1, 2), (0.1, 0.2), (0.5, 1.0), (0, 0), (0, 0), (0, 0), (0, 0), (3,))
    with pytest.raises(ConfigError, match="agents"):
        Family("none", (0, 2), (0.1, 0.2), (0.5, 1.0), (0, 0), (0, 0), (0, 0), (0, 0))


def _digest(arrays: list[np.ndarray]) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.round(np.asarray(array, np.float64), 6).tobytes())
    return digest.hexdigest()


# Both generators step their velocities with one social-force substep; these digests pin
# their tracks (the committed predictor is fitted on them). Rounded to the micrometre, they
# hold on CPUs whose vector math rounds the last bits differently.
def test_social_force_generators_keep_their_tracks() -> None:
    crowd = Crowd(area_m=8.0, stop_share=0.5, turn_share=0.5)
    scenes = [crowd_scene(seed=s, num_agents=12, num_steps=20, crowd=crowd) for s in (0, 1)]
    assert _digest(scenes) == "b412cfc4a570806546dc733492fa99f0ed2372565ea3211542836c2cb5d81934"
    families = [t for name in sorted(FAMILIES) for _, t in family_scenes(FAMILIES[name], 7, 2, 12)]
    assert _digest(families) == "920e8571d7bb599b27495a6582ed8b13c4b41383de6ce0fb76c32ff697247484"
