"""One bag of a corpus, replayed in the calling process: the work of one fleet task."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dynshape_perception.errors import DynshapeError
from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.io import bags
from dynshape_perception.io.topics import plan_topics
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.tools.fleet.corpus import BagEntry
from dynshape_perception.tools.replay import golden
from dynshape_perception.tools.replay.inprocess import InProcessReplay, ReplayOptions
from dynshape_perception.tools.replay.params import Value
from dynshape_perception.tools.replay.rundir import RunRecorder
from dynshape_perception.tools.replay.settings import (
    ReplaySettings,
    params_yaml,
    settings_from_values,
)

RESULT_FILE = "fleet.json"
OK, REGRESSED, FAILED, EMPTY, INTERRUPTED = "ok", "regressed", "failed", "empty", "interrupted"
# A result folder holding one of these is complete: a rerun keeps it.
COMPLETE = (OK, REGRESSED)
KIB = 1024


@dataclass(frozen=True)
class EngineSpec:
    """What a worker's engine is built from; equal specs share one engine in a worker."""

    target: str | None = None
    cache_dir: Path | None = None
    weights_dir: Path | None = None


@dataclass(frozen=True)
class ReplayJob:
    entry: BagEntry
    out_dir: Path
    values: Mapping[str, Value] = field(default_factory=dict)
    engine: EngineSpec = field(default_factory=EngineSpec)
    storage: str = "mcap"
    max_frames: int | None = None
    submitted_s: float = 0.0


@dataclass
class WorkerInfo:
    """Where a task ran and what its worker process has done so far."""

    host: str
    pid: int
    node_id: str | None
    engines_built: int
    compiles: int
    cache_hits: int
    peak_rss_mb: float


@dataclass
class BagOutcome:
    name: str
    bag: str
    status: str
    reason: str | None = None
    tags: tuple[str, ...] = ()
    summary: dict[str, Any] = field(default_factory=dict)
    golden: str | None = None
    golden_lines: list[str] = field(default_factory=list)
    output_sha256: str | None = None
    worker: dict[str, Any] = field(default_factory=dict)
    # Wall-clock seconds (time.time()) and durations of the engine's steps.
    timing: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["tags"] = list(self.tags)
        return out


# The engines of this worker process by spec: a task reuses the engine of an earlier task.
_ENGINES: dict[tuple[EngineSpec, str], Engine] = {}


def engine_for(spec: EngineSpec, settings: ReplaySettings) -> Engine:
    """This process's engine for ``spec``: built on first use, loading the compiled
    artefacts from the content-addressed cache (compiling only what it lacks)."""
    key = (spec, settings.target)
    engine = _ENGINES.get(key)
    if engine is None:
        engine = Engine(
            settings.target, settings.jit, cache_dir=spec.cache_dir, weights_dir=spec.weights_dir
        )
        _ENGINES[key] = engine
    return engine


def close_engines() -> None:
    while _ENGINES:
        _, engine = _ENGINES.popitem()
        engine.close()


def node_id() -> str | None:
    """The Ray node this process runs on; None outside Ray."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    return str(ray.get_runtime_context().get_node_id())


def worker_info() -> WorkerInfo:
    return WorkerInfo(
        host=socket.gethostname(),
        pid=os.getpid(),
        node_id=node_id(),
        engines_built=len(_ENGINES),
        compiles=sum(e.cache.misses for e in _ENGINES.values()),
        cache_hits=sum(e.cache.hits for e in _ENGINES.values()),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB, 1),
    )


def output_digest(run_dir: Path) -> str:
    """SHA-256 over the output bag's files, by name: equal digests mean identical bytes."""
    digest = hashlib.sha256()
    output = golden.output_bag_of(run_dir)
    for path in sorted(output.iterdir()):
        digest.update(path.name.encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def read_outcome(out_dir: Path) -> BagOutcome | None:
    """A bag's recorded outcome, if its result folder is complete."""
    try:
        raw = json.loads((out_dir / RESULT_FILE).read_text())
        outcome = BagOutcome(**{**raw, "tags": tuple(raw.get("tags", ()))})
    except (OSError, ValueError, TypeError, RecursionError):
        return None
    if outcome.status not in COMPLETE or not golden.output_bag_of(out_dir).is_dir():
        return None
    return outcome


def _run_info(job: ReplayJob, settings: ReplaySettings) -> dict[str, Any]:
    return {
        "bag": str(job.entry.path),
        "mode": "inprocess",
        "jit": settings.jit.mode,
        "deterministic": settings.jit.mode in ("off", "frozen"),
        "target": settings.target,
        "fleet": {"name": job.entry.name, "tags": list(job.entry.tags)},
        "ignored_parameters": list(settings.ignored),
    }


def replay_bag(job: ReplayJob) -> dict[str, Any]:
    """Replay one bag into ``job.out_dir`` (as ``replay --record`` writes it), check it
    against its golden folder, and return the outcome; a bag that cannot be read gives
    a failed outcome with the reason, never an exception."""
    started = time.time()
    entry = job.entry
    outcome = BagOutcome(entry.name, str(entry.path), FAILED, tags=entry.tags)
    timing = {"submitted_s": job.submitted_s, "started_s": started}
    try:
        _replay(job, outcome, timing)
    except DynshapeError as err:
        outcome.status, outcome.reason = FAILED, " ".join(str(err).split())
    except OSError as err:
        outcome.status, outcome.reason = FAILED, f"{type(err).__name__}: {err}"
    timing["finished_s"] = time.time()
    outcome.timing = {k: round(v, 6) for k, v in timing.items()}
    outcome.worker = asdict(worker_info())
    if outcome.status in COMPLETE:
        # Written last: its presence is what marks the folder complete.
        atomic_write_text(job.out_dir / RESULT_FILE, json.dumps(outcome.as_dict(), indent=1))
    return outcome.as_dict()


def _replay(job: ReplayJob, outcome: BagOutcome, timing: dict[str, float]) -> None:
    entry = job.entry
    settings = settings_from_values(job.values, "off", job.engine.target)
    if entry.golden is not None:
        golden.load_golden(entry.golden)
    with bags.BagReader(entry.path) as reader:
        reader.verify()
        plan = plan_topics(reader.topics(), None, {})
    if plan.driver is None:
        outcome.status = EMPTY
        outcome.reason = "no usable topic (needs points, or obstacles/detections)"
        return
    t0 = time.perf_counter()
    engine = engine_for(job.engine, settings)
    timing["engine_s"] = time.perf_counter() - t0
    replay = InProcessReplay(engine, settings)
    options = ReplayOptions(max_frames=job.max_frames, progress=False)
    t0 = time.perf_counter()
    with RunRecorder(job.out_dir, job.storage, force=True) as recorder:
        result = replay.run(entry.path, options, recorder, _run_info(job, settings))
        if result.interrupted:
            outcome.status, outcome.reason = INTERRUPTED, "interrupted"
            return
        recorder.finish(result.metrics.document(), params_yaml(settings))
    timing["replay_s"] = time.perf_counter() - t0
    outcome.summary = result.summary()
    outcome.output_sha256 = output_digest(job.out_dir)
    outcome.status = OK
    if entry.golden is not None:
        t0 = time.perf_counter()
        report = golden.check_golden(golden.output_bag_of(job.out_dir), entry.golden)
        timing["golden_s"] = time.perf_counter() - t0
        outcome.golden = "pass" if report.passed else "fail"
        outcome.golden_lines = report.text(entry.golden).splitlines()[:20]
        if not report.passed:
            outcome.status = REGRESSED


def warm_engine(spec: EngineSpec, values: Mapping[str, Value]) -> dict[str, Any]:
    """Build this worker's engine: the first build compiles into the shared cache."""
    t0 = time.perf_counter()
    engine_for(spec, settings_from_values(values, "off", spec.target))
    return {"engine_s": round(time.perf_counter() - t0, 3), **asdict(worker_info())}
