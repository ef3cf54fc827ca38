"""Interacting crowds by family (sparse, dense, groups, crossing): social forces with contact."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.sim.scenes import (
    CROWD_STOP_S,
    CROWD_SUBSTEPS,
    CROWD_TURN_RAD,
    GROUP_SCATTER_M,
    GROUP_SPEED_SPREAD,
    SocialPlan,
    _crowd_groups,
    social_substep,
)

MIN_SPEED_MPS = 0.3
MAX_SPEED_MPS = 1.8
# Two bodies never come closer than this (centre to centre): the social force keeps them
# apart, and a contact step pushes apart any pair it let through.
MIN_GAP_M = 0.5
CONTACT_PASSES = 2
PLACEMENT_PASSES = 30
# Nominal annotation step; a scene's true step is this times a jitter (other frame rates).
STEP_S = 0.4
FRAME_JITTER = (0.85, 1.15)
# Scale of the world frame (other cameras' calibrations).
SCALE_JITTER = (0.85, 1.2)
# Flow direction spread around each stream's heading.
FLOW_SPREAD_RAD = 0.25


@dataclass(frozen=True)
class Family:
    """One kind of crowd: each scene draws its behaviour from these ranges.

    ``flows`` lists the stream counts a scene may take: 0 walks every way, 1 is one stream,
    2 a counter flow, 4 two flows crossing at right angles (each with its counter flow).
    """

    name: str
    agents: tuple[int, int]
    density_per_m2: tuple[float, float]
    speed_mps: tuple[float, float]
    group_share: tuple[float, float]
    stand_share: tuple[float, float]
    stop_share: tuple[float, float]
    turn_share: tuple[float, float]
    flows: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if not 1 <= self.agents[0] <= self.agents[1]:
            raise ConfigError(f"{self.name}: agents must be 1 <= lo <= hi, got {self.agents}")
        if not 0 < self.density_per_m2[0] <= self.density_per_m2[1]:
            raise ConfigError(f"{self.name}: densities must be 0 < lo <= hi")
        if not MIN_SPEED_MPS <= self.speed_mps[0] <= self.speed_mps[1] <= MAX_SPEED_MPS:
            raise ConfigError(
                f"{self.name}: speeds must lie in [{MIN_SPEED_MPS}, {MAX_SPEED_MPS}] m/s"
            )
        for lo, hi in (self.group_share, self.stand_share, self.stop_share, self.turn_share):
            if not 0.0 <= lo <= hi <= 1.0:
                raise ConfigError(f"{self.name}: shares must be ranges within [0, 1]")
        if not self.flows or any(f not in (0, 1, 2, 4) for f in self.flows):
            raise ConfigError(f"{self.name}: flows must be drawn from 0, 1, 2 and 4")


FAMILIES: dict[str, Family] = {
    family.name: family
    for family in (
        Family(
            "sparse",
            (1, 8),
            (0.01, 0.05),
            (0.8, 1.8),
            (0.0, 0.3),
            (0.0, 0.1),
            (0.0, 0.2),
            (0.1, 0.5),
        ),
        Family(
            "dense",
            (24, 40),
            (0.4, 1.0),
            (0.3, 1.0),
            (0.2, 0.5),
            (0.1, 0.3),
            (0.2, 0.5),
            (0.1, 0.3),
            (0, 1, 2),
        ),
        Family(
            "groups",
            (8, 24),
            (0.1, 0.4),
            (0.5, 1.3),
            (0.6, 0.9),
            (0.2, 0.4),
            (0.1, 0.4),
            (0.1, 0.4),
        ),
        Family(
            "crossing",
            (10, 30),
            (0.1, 0.5),
            (0.6, 1.6),
            (0.1, 0.4),
            (0.0, 0.1),
            (0.05, 0.2),
            (0.0, 0.2),
            (2, 4),
        ),
    )
}


@dataclass(frozen=True)
class CrowdDraw:
    """One scene's draw from a family."""

    agents: int
    density_per_m2: float
    speed_mps: tuple[float, float]
    group_share: float
    stand_share: float
    stop_share: float
    turn_share: float
    flows: int
    step_s: float
    scale: float


def draw(family: Family, rng: np.random.Generator) -> CrowdDraw:
    lo, hi = family.speed_mps
    centre = float(rng.uniform(lo, hi))
    return CrowdDraw(
        agents=int(rng.integers(family.agents[0], family.agents[1] + 1)),
        density_per_m2=float(np.exp(rng.uniform(*np.log(family.density_per_m2)))),
        speed_mps=(max(lo, centre - 0.25), min(hi, centre + 0.25)),
        group_share=float(rng.uniform(*family.group_share)),
        stand_share=float(rng.uniform(*family.stand_share)),
        stop_share=float(rng.uniform(*family.stop_share)),
        turn_share=float(rng.uniform(*family.turn_share)),
        flows=int(rng.choice(family.flows)),
        step_s=STEP_S * float(rng.uniform(*FRAME_JITTER)),
        scale=float(rng.uniform(*SCALE_JITTER)),
    )


def separate(position: np.ndarray, gap_m: float, passes: int) -> np.ndarray:
    """``position [A, 2]`` with each pair closer than ``gap_m`` pushed apart symmetrically."""
    count = position.shape[0]
    if count < 2:
        return position
    eye = np.eye(count, dtype=bool)
    for _ in range(passes):
        offset = position[:, None] - position[None]
        distance = np.linalg.norm(offset, axis=2)
        close = (distance < gap_m) & ~eye
        if not close.any():
            break
        # Coincident agents split along a fixed, index-dependent direction: deterministic.
        fallback = np.stack([np.cos(np.arange(count)), np.sin(np.arange(count))], axis=1)
        unit = np.where(
            (distance > 1e-9)[..., None],
            offset / np.maximum(distance, 1e-9)[..., None],
            fallback[:, None] - fallback[None],
        )
        push = np.where(close, (gap_m - distance) / 2.0, 0.0)
        position = position + (push[..., None] * unit).sum(axis=1)
    return position


def simulate(rng: np.random.Generator, scene: CrowdDraw, steps: int) -> np.ndarray:
    """Tracks ``[A, steps, 2]`` of one drawn scene, marked every ``scene.step_s`` seconds,
    in a world frame scaled by ``scene.scale``."""
    count, dt = scene.agents, scene.step_s
    area = float(np.sqrt(count / scene.density_per_m2))
    leader = _crowd_groups(rng, count, scene.group_share)
    members = np.bincount(leader, minlength=count).astype(np.float64)
    desired = rng.uniform(*scene.speed_mps, count)[leader]
    desired *= rng.uniform(1 - GROUP_SPEED_SPREAD, 1 + GROUP_SPEED_SPREAD, count)
    desired = np.clip(desired, MIN_SPEED_MPS, MAX_SPEED_MPS)
    standing = (rng.random(count) < scene.stand_share)[leader]
    position = rng.uniform(-area / 2.0, area / 2.0, (count, 2))
    scatter = rng.normal(0.0, GROUP_SCATTER_M, (count, 2))
    position = position[leader] + (leader != np.arange(count))[:, None] * scatter
    position = separate(position, MIN_GAP_M * 1.2, PLACEMENT_PASSES)
    base = rng.uniform(-np.pi, np.pi)
    if scene.flows == 0:
        heading = rng.uniform(-np.pi, np.pi, count)
    else:
        stream = rng.integers(0, scene.flows, count)
        heading = base + stream * (2 * np.pi / scene.flows) + rng.normal(0, FLOW_SPREAD_RAD, count)
    heading = heading[leader]
    span_s = steps * dt
    turn_at = np.where(rng.random(count) < scene.turn_share, rng.uniform(0, span_s, count), np.inf)
    turn_by = rng.uniform(*CROWD_TURN_RAD, count) * rng.choice((-1.0, 1.0), count)
    stop_at = np.where(rng.random(count) < scene.stop_share, rng.uniform(0, span_s, count), np.inf)
    stop_end = stop_at + rng.uniform(*CROWD_STOP_S, count)
    turn_at, turn_by, stop_at, stop_end = (v[leader] for v in (turn_at, turn_by, stop_at, stop_end))
    plan = SocialPlan(leader, members, desired, standing, turn_at, turn_by, stop_at, stop_end)
    velocity = np.c_[np.cos(heading), np.sin(heading)] * (desired * ~standing)[:, None]
    wobble = np.zeros(count)
    h = dt / CROWD_SUBSTEPS
    tracks = np.empty((count, steps, 2))
    for step in range(steps):
        tracks[:, step] = position
        for sub in range(CROWD_SUBSTEPS):
            t = step * dt + sub * h
            velocity, wobble = social_substep(
                rng, plan, position, velocity, wobble, heading, t, h, MAX_SPEED_MPS
            )
            moved = separate(position + h * velocity, MIN_GAP_M, CONTACT_PASSES)
            # What contact took off a step is taken off the velocity too: bodies do not bounce.
            velocity = np.where(
                (np.linalg.norm(moved - position, axis=1) < h * MAX_SPEED_MPS)[:, None],
                (moved - position) / h,
                velocity,
            )
            position = moved
    return tracks * scene.scale


def family_scenes(
    family: Family, seed: int, scenes: int, steps: int
) -> list[tuple[CrowdDraw, np.ndarray]]:
    """``scenes`` seeded scenes of ``family``: each one's draw and tracks ``[A, steps, 2]``."""
    if scenes < 0 or steps < 2:
        raise ConfigError(f"need scenes >= 0 and steps >= 2, got {scenes}, {steps}")
    out = []
    for index in range(scenes):
        rng = np.random.default_rng([seed, index, sum(map(ord, family.name))])
        scene = draw(family, rng)
        out.append((scene, simulate(rng, scene, steps)))
    return out
