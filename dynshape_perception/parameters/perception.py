"""Parameter groups of segmentation, tracking, published objects, prediction and markers."""

from __future__ import annotations

from dynshape_perception.parameters.limits import (
    BOUNDS,
    CLUSTER,
    MAX_COUNT,
    MAX_STD,
    OBJECTS,
    OFF,
    TRACKER,
)
from dynshape_perception.paramspec import ParamSpec, declared
from dynshape_perception.perception.prediction.stage import PredictionSettings

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
    return (
        ParamSpec(
            "segmentation.score_threshold",
            CLUSTER.score_threshold,
            "obstacle score above which a point joins a cluster",
            low=0.0,
            high=1.0,
        ),
        ParamSpec(
            "segmentation.cell_size_m",
            CLUSTER.cell_size_m,
            "bird's-eye-view cell size of the clustering",
            low=0.02,
            high=2.0,
        ),
        ParamSpec(
            "segmentation.min_points",
            CLUSTER.min_points,
            "points a cluster needs to become an obstacle",
            low=1,
            high=MAX_COUNT,
        ),
        ParamSpec(
            "segmentation.closing_cells",
            CLUSTER.closing_cells,
            "radius of the morphological closing in cells; 0 disables it",
            low=0,
            high=16,
        ),
        ParamSpec(
            "segmentation.max_height_m",
            CLUSTER.max_height_m,
            "points higher above the ground are left out of clusters",
            low=0.1,
            high=50.0,
        ),
        ParamSpec(
            "segmentation.fragment_gap_rad",
            CLUSTER.fragment_gap_rad,
            "a cluster of a cell or two joins its nearest cluster within this angle times its "
            "range (far objects fall apart into lidar columns); 0 disables it",
            low=0.0,
            high=0.2,
        ),
    )


def tracking_group() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec(
            "tracking.gate_distance_m",
            TRACKER.gate_distance_m,
            "largest distance between a detection and the track it may join",
            low=0.01,
            high=100.0,
        ),
        ParamSpec(
            "tracking.min_affinity",
            TRACKER.min_affinity,
            "smallest associator affinity of a match, in [0, 1)",
            low=0.0,
            high=0.999,
        ),
        ParamSpec(
            "tracking.max_missed_frames",
            TRACKER.max_missed_frames,
            "frames a track survives without a detection",
            low=0,
            high=MAX_COUNT,
        ),
        ParamSpec(
            "tracking.min_hits_to_confirm",
            TRACKER.min_hits_to_confirm,
            "detections before a track is published",
            low=1,
            high=MAX_COUNT,
        ),
        ParamSpec(
            "tracking.velocity_smoothing",
            TRACKER.velocity_smoothing,
            "weight of the newest velocity estimate, in (0, 1]",
            low=0.01,
            high=1.0,
        ),
        ParamSpec(
            "tracking.max_acceleration_mps2",
            TRACKER.max_acceleration_mps2,
            "largest change of a track's velocity estimate per second since its last "
            "measurement: a jumping cluster centre cannot throw the velocity off",
            low=0.1,
            high=1000.0,
        ),
        ParamSpec(
            "tracking.publish_coasting",
            TRACKER.publish_coasting,
            "also publish tracks that missed their detection this frame",
        ),
    )


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
    what = {
        "position_std_m": "standard deviation of a track's position (x, y)",
        "height_std_m": "standard deviation of a track's height (z)",
        "yaw_std_rad": "standard deviation of a track's heading",
        "velocity_std_mps": "standard deviation of a track's velocity (x, y)",
    }
    return (
        *(
            ParamSpec(
                f"objects.{name}",
                float(getattr(OBJECTS, name)),
                f"{text} in the published covariance; it grows with each frame the track "
                "coasts without a detection",
                low=1e-6,
                high=MAX_STD,
            )
            for name, text in what.items()
        ),
        ParamSpec(
            "objects.stationary_speed_mps",
            OBJECTS.stationary_speed_mps,
            "tracks slower than this are published as stationary",
            low=1e-6,
            high=MAX_STD,
        ),
    )
