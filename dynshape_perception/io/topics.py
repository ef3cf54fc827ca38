"""Which bag topics a replay uses, under which name, and why it skips the others."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.bags import (
    DETECTION3D_ARRAY,
    ODOMETRY,
    POINTCLOUD2,
    TF_MESSAGE,
    TopicInfo,
)
from dynshape_perception.io.objects import DETECTED_OBJECTS, PREDICTED_OBJECTS, TRACKED_OBJECTS

# The debug tables (what golden checks compare) and the standard object messages.
OUTPUT_TOPICS = ("/obstacles", "/tracks", "/predictions")
OBJECT_TOPICS = {
    "/detected_objects": DETECTED_OBJECTS,
    "/tracked_objects": TRACKED_OBJECTS,
    "/predicted_objects": PREDICTED_OBJECTS,
}

POINTS, OBSTACLES, ODOM, TRUTH = "points", "obstacles", "odom", "ground_truth"
TF, TF_STATIC = "tf", "tf_static"
# Input names (after remapping, without the leading slash) and the types each accepts.
ROLES: dict[str, tuple[str, ...]] = {
    POINTS: (POINTCLOUD2,),
    OBSTACLES: (POINTCLOUD2, DETECTED_OBJECTS, DETECTION3D_ARRAY),
    ODOM: (ODOMETRY,),
    TRUTH: (POINTCLOUD2,),
    TF: (TF_MESSAGE,),
    TF_STATIC: (TF_MESSAGE,),
}
ALIASES = {"detections": OBSTACLES, "detected_objects": OBSTACLES}


def parse_remaps(items: Sequence[str]) -> dict[str, str]:
    """``from:=to`` pairs, as ``ros2 bag play --remap`` takes them."""
    out: dict[str, str] = {}
    for item in items:
        source, sep, target = item.partition(":=")
        if not sep or not source or not target:
            raise ConfigError(f"a remap must look like from:=to, got {item!r}")
        out[absolute_name(source)] = absolute_name(target)
    return out


def absolute_name(name: str) -> str:
    return name if name.startswith("/") else f"/{name}"


@dataclass(frozen=True)
class Skipped:
    topic: str
    msgtype: str
    reason: str


@dataclass(frozen=True)
class Used:
    topic: str
    msgtype: str
    name: str
    role: str
    count: int


@dataclass
class TopicPlan:
    used: dict[str, Used] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def driver(self) -> Used | None:
        """The input that makes frames: lidar points, else a detection stream."""
        return self.used.get(POINTS) or self.used.get(OBSTACLES)

    def lines(self) -> list[str]:
        out = [
            f"  using   {u.topic} ({u.msgtype}, {u.count} messages) as {u.role}"
            for u in self.used.values()
        ]
        out += [f"  skipped {s.topic} ({s.msgtype}): {s.reason}" for s in self.skipped]
        return out


def plan_topics(
    topics: Sequence[TopicInfo], select: Sequence[str] | None, remaps: Mapping[str, str]
) -> TopicPlan:
    """Map bag topics to the pipeline's inputs by name (after remapping) and type."""
    chosen = {absolute_name(t) for t in select} if select else None
    plan = TopicPlan()
    candidates: list[tuple[int, str, Used]] = []
    for info in topics:
        topic = absolute_name(info.name)
        if chosen is not None and topic not in chosen:
            plan.skipped.append(Skipped(info.name, info.msgtype, "not among --topics"))
            continue
        if info.unreadable:
            plan.skipped.append(Skipped(info.name, info.msgtype, info.unreadable))
            continue
        name = remaps.get(topic, topic)
        base = name.lstrip("/")
        role = ALIASES.get(base, base)
        accepted = ROLES.get(role)
        if accepted is None:
            fits = [
                r for r, types in ROLES.items() if info.msgtype in types and r not in (TRUTH, TF)
            ]
            hint = (
                f"no input named {name} (--remap {info.name}:={fits[0]} would feed it)"
                if fits
                else "not an input type of the pipeline"
            )
            plan.skipped.append(Skipped(info.name, info.msgtype, hint))
        elif info.msgtype not in accepted:
            plan.skipped.append(
                Skipped(
                    info.name, info.msgtype, f"{role} takes {' or '.join(accepted)}, not this type"
                )
            )
        elif info.count == 0:
            plan.skipped.append(Skipped(info.name, info.msgtype, "holds no messages"))
        else:
            used = Used(info.name, info.msgtype, name, role, info.count)
            candidates.append((accepted.index(info.msgtype), info.name, used))
    # The package's own table types come before the standard messages; then names decide.
    for _, _, used in sorted(candidates, key=lambda c: (c[0], c[1])):
        if used.role in plan.used:
            owner = plan.used[used.role].topic
            plan.skipped.append(Skipped(used.topic, used.msgtype, f"{owner} feeds {used.role}"))
        else:
            plan.used[used.role] = used
    if POINTS in plan.used and OBSTACLES in plan.used:
        extra = plan.used.pop(OBSTACLES)
        plan.skipped.append(
            Skipped(extra.topic, extra.msgtype, "the points drive the pipeline; not needed")
        )
    return plan
