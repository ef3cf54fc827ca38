"""The defaults of the core objects and the ranges the parameter table allows."""

from __future__ import annotations

from dynshape_perception.config import default_bounds
from dynshape_perception.perception.clustering import ClusterParams
from dynshape_perception.perception.localization import FrameParams
from dynshape_perception.perception.objects import ObjectParams
from dynshape_perception.perception.pipeline import PipelineParams
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.perception.stamps import StampPolicy
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.tracking import TrackerParams
from dynshape_perception.runtime.policy import JitConfig

CLUSTER = ClusterParams()
TRACKER = TrackerParams()
STAMPS = StampPolicy()
PIPELINE = PipelineParams()
JIT = JitConfig()
BOUNDS = default_bounds()
BOUNDS_PREFIX = "bounds"
MAX_QOS_DEPTH = 1000
NEAR = NearField()
# Intensity scale: 1/65535 (16-bit drivers) must fit, with room on both sides.
MIN_INTENSITY_SCALE = 1e-9
MAX_INTENSITY_SCALE = 1e9
FRAMES = FrameParams()
OBJECTS = ObjectParams()
MAX_RATE_HZ = 10_000.0
MAX_WINDOW = 1000
STAGE = PredictionSettings()
MAX_SECTORS = 4096
