"""Parameter groups of segmentation, tracking, published objects, prediction and markers."""

from __future__ import annotations

from dynshape_perception.parameters.limits import (
    BOUNDS,
)
from dynshape_perception.paramspec import OFF, ParamSpec, declared
from dynshape_perception.perception.clustering import ClusterParams
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.perception.tracking import TrackerParams

PREDICTION = "prediction"
# Not a field of PredictionSettings: its 0 stands for the fitted window (readers.history_steps).
HISTORY_STEPS = ParamSpec(
    f"{PREDICTION}.history_steps",
    OFF,
    "history samples (at the predictor's step) fed to the predictor; 0: "
    "predictor.history_steps of config/models.yaml; at most bounds.max_history_steps",
    read_only=True,
    low=OFF,
    high=BOUNDS.T,
)
TRACKER_INPUT_OBJECTS = "detected_objects"
TRACKER_INPUT_TABLE = "table"
TRACKER_INPUT_VISION = "vision_msgs"


def segmentation_group() -> tuple[ParamSpec, ...]:
    return declared(ClusterParams, "segmentation")


def tracking_group() -> tuple[ParamSpec, ...]:
    return declared(TrackerParams, "tracking")


def tracker_input_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "tracker.input_type",
            TRACKER_INPUT_OBJECTS,
            "detections input: autoware_perception_msgs/DetectedObjects on 'detected_objects', "
            "vision_msgs/Detection3DArray on 'detections', or the obstacle table (PointCloud2) "
            "on 'obstacles'",
            read_only=True,
            choices=(TRACKER_INPUT_OBJECTS, TRACKER_INPUT_VISION, TRACKER_INPUT_TABLE),
        ),
    )


def prediction_group() -> tuple[ParamSpec, ...]:
    first, *rest = declared(PredictionSettings, PREDICTION)
    return (first, HISTORY_STEPS, *rest)


def markers_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "debug.publish_markers",
            True,
            "publish RViz markers (track boxes, ids, predicted paths) on 'markers', built "
            "only while something subscribes",
            read_only=True,
        ),
        ParamSpec("markers.box_alpha", 0.5, "opacity of the track boxes", low=0.0, high=1.0),
        ParamSpec("markers.text_size_m", 1.0, "height of the track id labels", low=0.01, high=10.0),
        ParamSpec(
            "markers.path_width_m",
            0.15,
            "line width of the predicted paths (their alpha is the probability)",
            low=0.01,
            high=5.0,
        ),
    )


def objects_group() -> tuple[ParamSpec, ...]:
    return declared(ObjectParams, "objects")
