"""A replay's run directory: the recorded output bag, metrics.json and the parameters used.

The directory is assembled under a hidden name beside its target and renamed when complete,
so an interrupted or failed run leaves nothing half-written behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import StagedDir
from dynshape_perception.io import bags, msgtypes
from dynshape_perception.io.objects import (
    TrackStates,
    detected_objects,
    predicted_objects,
    tracked_objects,
)
from dynshape_perception.io.topics import OBJECT_TOPICS, OUTPUT_TOPICS
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.prediction.paths import PredictedPaths

OUTPUT_BAG = "output"
METRICS_FILE = "metrics.json"
PARAMS_FILE = "params.yaml"


@dataclass(frozen=True)
class FrameOutputs:
    """What one replayed frame put out, and the frames its outputs are in."""

    obstacle_frame: str
    fixed_frame: str
    obstacles: np.ndarray
    states: TrackStates
    predictions: np.ndarray
    paths: PredictedPaths
    params: ObjectParams


# What the report and the replay summary read from metrics.json, with the type each must have.
_NUMBER = (int, float)
_METRICS_KEYS: dict[str, type | tuple[type, ...]] = {
    "frames": list,
    "summary": dict,
    "stages": list,
    "tiers": dict,
}
_SUMMARY_KEYS: dict[str, type | tuple[type, ...]] = {
    "frames": int,
    "dropped_frames": int,
    "sim_s": _NUMBER,
    "wall_s": _NUMBER,
    "deadline_misses": dict,
    "drops": dict,
    "hit_rate": _NUMBER,
    "compile_events": int,
}
_FRAME_KEYS: dict[str, type | tuple[type, ...]] = {
    "t_s": _NUMBER,
    "latency_ms": dict,
    "counts": dict,
    "jit_calls": int,
    "jit_hits": int,
    "hit_rate": _NUMBER,
}
_OPTIONAL_KEYS: dict[str, type | tuple[type, ...]] = {
    "run": dict,
    "topics": dict,
    "drop_units": dict,
    "compile_events": list,
}


def _check_types(
    path: Path,
    where: str,
    doc: dict[str, Any],
    keys: dict[str, type | tuple[type, ...]],
    required: bool = True,
) -> None:
    for key, kind in keys.items():
        if key not in doc:
            if required:
                raise ConfigError(f"{path} is not a replay run's metrics.json: no {where}{key}")
            continue
        value = doc[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ConfigError(
                f"{path} is not a replay run's metrics.json: {where}{key} is {value!r:.60}"
            )


def read_metrics(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / METRICS_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(f"{path} is not a replay run's metrics.json: {err}") from err
    if not isinstance(doc, dict) or "frames" not in doc:
        raise ConfigError(f"{path} is not a replay run's metrics.json")
    _check_types(path, "", doc, _METRICS_KEYS)
    _check_types(path, "", doc, _OPTIONAL_KEYS, required=False)
    _check_types(path, "summary.", doc["summary"], _SUMMARY_KEYS)
    for name in ("deadline_misses", "drops"):
        counts = doc["summary"][name]
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in counts.values()):
            raise ConfigError(f"{path}: summary.{name} must map tiers to counts")
    for i, frame in enumerate(doc["frames"]):
        if not isinstance(frame, dict):
            raise ConfigError(f"{path}: frames[{i}] is not a mapping")
        _check_types(path, f"frames[{i}].", frame, _FRAME_KEYS)
    for tier, spec in doc["tiers"].items():
        if not isinstance(spec, dict):
            raise ConfigError(f"{path}: tiers.{tier} is not a mapping")
        _check_types(path, f"tiers.{tier}.", spec, {"stages": list})
        deadline = spec.get("deadline_ms")
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, _NUMBER)
        ):
            raise ConfigError(f"{path}: tiers.{tier}.deadline_ms is {deadline!r:.60}")
    return doc


class RunRecorder:
    """Writes the output tables of every frame, then metrics and parameters, atomically."""

    def __init__(self, run_dir: Path, storage: str = "mcap", force: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.storage = storage
        self.force = force
        self._staged = StagedDir(self.run_dir)
        self._bag: bags.BagWriter | None = None
        self.object_topics: dict[str, str] = {}

    def __enter__(self) -> RunRecorder:
        if self.run_dir.exists() and not self.force:
            raise ConfigError(f"{self.run_dir} exists already; remove it or pass --force")
        self._staged = StagedDir(self.run_dir).open()
        try:
            self._bag = bags.BagWriter(self._staged.path / OUTPUT_BAG, self.storage).__enter__()
            for topic in OUTPUT_TOPICS:
                self._bag.add_topic(topic, bags.POINTCLOUD2)
            # Written where this installation has the message definitions.
            self.object_topics = {
                t: m for t, m in OBJECT_TOPICS.items() if m in msgtypes.object_types()
            }
            for topic, msgtype in self.object_topics.items():
                self._bag.add_topic(topic, msgtype)
        except BaseException:
            self._staged.discard()
            raise
        return self

    def write_frame(self, log_ns: int, stamp_ns: int, out: FrameOutputs) -> None:
        assert self._bag is not None
        tables = (out.obstacles, out.states.tracks, out.predictions)
        frames = (out.obstacle_frame, out.fixed_frame, out.fixed_frame)
        for topic, table, frame in zip(OUTPUT_TOPICS, tables, frames, strict=True):
            self._bag.write(topic, log_ns, bags.table_message(table, stamp_ns, frame))
        messages = {
            "/detected_objects": lambda: detected_objects(
                stamp_ns, out.obstacle_frame, out.obstacles
            ),
            "/tracked_objects": lambda: tracked_objects(
                stamp_ns, out.fixed_frame, out.states, out.params
            ),
            "/predicted_objects": lambda: predicted_objects(
                stamp_ns, out.fixed_frame, out.states, out.paths, out.params
            ),
        }
        for topic in self.object_topics:
            self._bag.write_raw(topic, log_ns, messages[topic]())

    def write_raw(self, topic: str, log_ns: int, data: bytes) -> None:
        """A serialised output table as received over DDS."""
        assert self._bag is not None
        self._bag.write_raw(topic, log_ns, data)

    def finish(self, metrics: dict[str, Any], params_yaml: str) -> Path:
        """Close the bag, write metrics and parameters, and move the run into place."""
        assert self._bag is not None
        bag, self._bag = self._bag, None
        bag.__exit__(None, None, None)
        (self._staged.path / METRICS_FILE).write_text(json.dumps(metrics, indent=1) + "\n")
        (self._staged.path / PARAMS_FILE).write_text(params_yaml)
        return self._staged.publish(replace=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bag is not None:
            self._bag.__exit__(exc_type or RuntimeError, exc, tb)
            self._bag = None
        self._staged.discard()
