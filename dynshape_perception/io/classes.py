"""The one class map: table labels, their names, and autoware ObjectClassification labels."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynshape_perception.errors import MessageError
from dynshape_perception.perception.records import (
    LABEL_CAR,
    LABEL_PEDESTRIAN,
    LABEL_POLE,
    LABEL_UNKNOWN,
)

# autoware_perception_msgs/ObjectClassification labels (the standard's numbering).
UNKNOWN = 0
CAR = 1
TRUCK = 2
BUS = 3
TRAILER = 4
MOTORCYCLE = 5
BICYCLE = 6
PEDESTRIAN = 7
ANIMAL = 8
HAZARD = 9
OVER_DRIVABLE = 10
UNDER_DRIVABLE = 11
MAX_CLASSIFICATION = UNDER_DRIVABLE


@dataclass(frozen=True)
class ObjectClass:
    """One class of the obstacle tables and what it is called on the standard messages."""

    label: int
    name: str
    classification: int
    aliases: tuple[str, ...] = ()


# Table label -> class. A pole is a static obstacle that ObjectClassification has no label
# for: it goes out as UNKNOWN, as Autoware reports static clutter.
CLASSES: dict[int, ObjectClass] = {
    c.label: c
    for c in (
        ObjectClass(LABEL_UNKNOWN, "unknown", UNKNOWN),
        ObjectClass(LABEL_CAR, "car", CAR, ("vehicle", "truck", "bus", "trailer")),
        ObjectClass(LABEL_PEDESTRIAN, "pedestrian", PEDESTRIAN, ("person", "walker")),
        ObjectClass(LABEL_POLE, "pole", UNKNOWN),
    )
}
_BY_NAME = {name: c.label for c in CLASSES.values() for name in (c.name, *c.aliases)}
# ObjectClassification label -> table label: the road users that share a table class.
_BY_CLASSIFICATION = {CAR: LABEL_CAR, TRUCK: LABEL_CAR, BUS: LABEL_CAR, TRAILER: LABEL_CAR}
_BY_CLASSIFICATION[PEDESTRIAN] = LABEL_PEDESTRIAN


def name_of(label: int) -> str:
    return CLASSES.get(int(label), CLASSES[LABEL_UNKNOWN]).name


# Indexed by table label.
_CLASSIFICATIONS = np.zeros(max(CLASSES) + 1, dtype=np.uint8)
_CLASSIFICATIONS[list(CLASSES)] = [c.classification for c in CLASSES.values()]
_CLASSIFICATIONS.flags.writeable = False


def classification_of(labels: np.ndarray) -> np.ndarray:
    """ObjectClassification labels (uint8) of table labels; labels not in the map: UNKNOWN."""
    labels = np.asarray(labels, dtype=np.int64)
    known = (labels >= 0) & (labels < _CLASSIFICATIONS.size)
    return _CLASSIFICATIONS[np.where(known, labels, LABEL_UNKNOWN)]


def label_of_classification(classification: int) -> int:
    """The table label of an ObjectClassification label (vehicles: car; unmapped: unknown)."""
    value = int(classification)
    if not 0 <= value <= 255:
        raise MessageError(f"classification label {value} is not a uint8")
    return _BY_CLASSIFICATION.get(value, LABEL_UNKNOWN)


def label_of_class_id(class_id: str) -> int:
    """The table label of a vision_msgs ``class_id``: a class name (any case; unknown names
    give unknown), or an ObjectClassification label in unsigned ASCII digits."""
    text = str(class_id).strip().lower()
    if text.isascii() and text.isdecimal():
        if len(text) > 3 or int(text) > 255:
            raise MessageError(f"class_id {class_id!r} is above the uint8 classification labels")
        return label_of_classification(int(text))
    # int() would take these (or fail on them); a label is an unsigned ASCII number.
    if text.lstrip("+-").isnumeric():
        raise MessageError(f"class_id {class_id!r} is not an unsigned ASCII number")
    return _BY_NAME.get(text, LABEL_UNKNOWN)
