"""The QoS each replayed topic is offered with: the bag's recorded offers, as ``ros2 bag play``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rosbags.interfaces import Qos, QosDurability, QosHistory, QosReliability

from dynshape_perception.config import read_yaml
from dynshape_perception.errors import ConfigError
from dynshape_perception.io import bags
from dynshape_perception.io.topics import absolute_name

RELIABILITIES = ("reliable", "best_effort")
DURABILITIES = ("volatile", "transient_local")
HISTORIES = ("keep_last", "keep_all")
# rosbag2's player keeps the last 10 of each topic (rmw's default depth), whatever the offer.
DEFAULT_DEPTH = 10
# Latched topics keep enough for a late subscriber to get every recorded static transform.
LATCHED_DEPTH = 100
RECORDED, DEFAULT, MIXED, OVERRIDE = "recorded", "default", "mixed offers", "override"
_RELIABILITY = {QosReliability.RELIABLE: "reliable", QosReliability.BEST_EFFORT: "best_effort"}
_DURABILITY = {
    QosDurability.VOLATILE: "volatile",
    QosDurability.TRANSIENT_LOCAL: "transient_local",
}


@dataclass(frozen=True)
class TopicQos:
    """What the player offers on one topic, and where it came from (``source``)."""

    reliability: str = "reliable"
    durability: str = "volatile"
    history: str = "keep_last"
    depth: int = DEFAULT_DEPTH
    source: str = DEFAULT

    def __str__(self) -> str:
        keep = f"keep_last {self.depth}" if self.history == "keep_last" else "keep_all"
        return f"{self.reliability}, {self.durability}, {keep} ({self.source})"


def _default(topic: str) -> TopicQos:
    """Offers unknown: reliable and volatile, but /tf_static latched as tf2 asks for it."""
    if absolute_name(topic).rstrip("/").endswith(bags.TF_STATIC_TOPIC):
        return TopicQos(durability="transient_local", depth=LATCHED_DEPTH)
    return TopicQos()


def adapt(topic: str, offers: Sequence[Qos]) -> TopicQos:
    """rosbag2's player rule: reliable only where every recorded publisher offered reliable,
    transient local only where every one offered it (what a subscriber matched with all of
    them received); history keep last 10, latched topics more. No offers: the default."""
    if not offers:
        return _default(topic)
    reliabilities = {_RELIABILITY.get(q.reliability) for q in offers}
    durabilities = {_DURABILITY.get(q.durability) for q in offers}
    if None in reliabilities or None in durabilities:
        # System default or unknown (older rosbag2 metadata): nothing to adapt to.
        return _default(topic)
    reliability = "reliable" if reliabilities == {"reliable"} else "best_effort"
    durability = "transient_local" if durabilities == {"transient_local"} else "volatile"
    depth = DEFAULT_DEPTH
    if durability == "transient_local":
        depth = max(
            [LATCHED_DEPTH, *(q.depth for q in offers if q.history == QosHistory.KEEP_LAST)]
        )
    source = RECORDED if len(reliabilities) == len(durabilities) == 1 else MIXED
    return TopicQos(reliability, durability, "keep_last", depth, source)


def _choice(topic: str, key: str, value: Any, choices: Sequence[str]) -> str:
    text = str(value).lower()
    if text not in choices:
        raise ConfigError(
            f"QoS override of {topic}: {key} must be one of {list(choices)}, got {value!r}"
        )
    return text


def parse_overrides(document: Any, origin: str = "QoS overrides") -> dict[str, dict[str, Any]]:
    """``ros2 bag play --qos-profile-overrides-path``'s format: per topic, any of
    ``reliability``, ``durability``, ``history``, ``depth``."""
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise ConfigError(
            f"{origin}: expected a mapping of topic names, got {type(document).__name__}"
        )
    overrides: dict[str, dict[str, Any]] = {}
    for topic, fields in document.items():
        name = absolute_name(str(topic))
        if not isinstance(fields, Mapping) or not fields:
            raise ConfigError(f"{origin}: {topic}: expected a mapping of QoS settings")
        entry: dict[str, Any] = {}
        for key, value in fields.items():
            if key == "reliability":
                entry[key] = _choice(name, key, value, RELIABILITIES)
            elif key == "durability":
                entry[key] = _choice(name, key, value, DURABILITIES)
            elif key == "history":
                entry[key] = _choice(name, key, value, HISTORIES)
            elif key == "depth":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ConfigError(
                        f"{origin}: {name}: depth must be an integer >= 1, got {value!r}"
                    )
                entry[key] = value
            else:
                raise ConfigError(
                    f"{origin}: {name}: unknown QoS setting {key!r} "
                    "(reliability, durability, history, depth)"
                )
        overrides[name] = entry
    return overrides


def load_overrides(path: Path) -> dict[str, dict[str, Any]]:
    return parse_overrides(read_yaml(path, "QoS overrides"), str(path))


def topic_qos(
    topic: str, offers: Sequence[Qos], overrides: Mapping[str, Mapping[str, Any]]
) -> TopicQos:
    """The recorded choice, then this topic's override (by its name in the bag) on top."""
    chosen = adapt(topic, offers)
    override = overrides.get(absolute_name(topic))
    if override:
        chosen = replace(chosen, **override, source=OVERRIDE)
    return chosen
