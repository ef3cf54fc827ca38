"""Per-frame replay metrics and their summary: the content of a run's ``metrics.json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dynshape_perception.stats import DIGITS, percentile
from dynshape_perception.tools.replay.params import REPLAY_STAGES, STAGE_TIERS, TIERS

if TYPE_CHECKING:
    from dynshape_perception.runtime.metrics import CompileEvent

METRICS_VERSION = 1
# What a drop counts in each tier: in-process replay sheds no load, so drops are the
# frames refused at the input and the detections and agents cut at their bounds.
DROP_UNITS = {"1": "input frames", "2": "detections over bound N", "3": "agents over bound A"}
PERCENTILES = (50, 95, 99)


@dataclass
class FrameRecord:
    index: int
    stamp_ns: int
    t_s: float
    wall_s: float
    latency_ms: dict[str, float] = field(default_factory=dict)
    completion_ms: dict[str, float] = field(default_factory=dict)
    missed: list[int] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    drop_reason: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    jit_calls: int = 0
    jit_hits: int = 0
    hit_rate: float = 0.0
    prediction: dict[str, float] = field(default_factory=dict)


def tier_completion(latency_ms: dict[str, float]) -> dict[int, float]:
    """Milliseconds from the frame's arrival until each tier's last stage finished."""
    done: dict[int, float] = {}
    elapsed = 0.0
    for stage in REPLAY_STAGES:
        if stage not in latency_ms:
            continue
        elapsed += latency_ms[stage]
        done[STAGE_TIERS[stage]] = elapsed
    return done


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    out = {f"p{p}": round(percentile(arr, p), DIGITS) for p in PERCENTILES}
    out["mean"] = round(float(arr.mean()), DIGITS)
    out["max"] = round(float(arr.max()), DIGITS)
    return out


class RunMetrics:
    """Collects frame records and compile events; ``document()`` is the metrics.json body."""

    def __init__(
        self,
        deadlines_ms: dict[int, float | None],
        run: dict[str, Any],
        stages: tuple[str, ...] = REPLAY_STAGES,
    ) -> None:
        self.deadlines_ms = deadlines_ms
        self.stages = stages
        self.run = run
        self.frames: list[FrameRecord] = []
        self.events: list[dict[str, Any]] = []
        self.topics: dict[str, Any] = {"used": [], "skipped": []}
        self.summary_extra: dict[str, Any] = {}

    def add_frame(self, record: FrameRecord) -> None:
        completion = tier_completion(record.latency_ms)
        record.completion_ms = {str(t): round(ms, 3) for t, ms in completion.items()}
        record.missed = [
            tier
            for tier, ms in completion.items()
            if (deadline := self.deadlines_ms.get(tier)) is not None and ms > deadline
        ]
        record.latency_ms = {k: round(v, 3) for k, v in record.latency_ms.items()}
        self.frames.append(record)

    def add_event(self, event: CompileEvent, t0_monotonic: float, frame: int) -> None:
        self.events.append(
            {
                "t_s": round(event.t_s - t0_monotonic, 4),
                "frame": frame,
                "model": event.model,
                "key": event.key,
                "ok": bool(event.ok),
                "compile_s": round(float(event.compile_s), 4),
                "reason": event.reason,
            }
        )

    def misses(self) -> dict[str, int]:
        out = {str(t): 0 for t in TIERS}
        for frame in self.frames:
            for tier in frame.missed:
                out[str(tier)] += 1
        return out

    def drops(self) -> dict[str, int]:
        out = {str(t): 0 for t in TIERS}
        for frame in self.frames:
            for tier, n in frame.dropped.items():
                out[tier] += n
        return out

    def summary(self) -> dict[str, Any]:
        processed = [f for f in self.frames if f.drop_reason is None]
        stages = [*self.stages, "total"]
        latency = {
            s: _stats([f.latency_ms[s] for f in processed if s in f.latency_ms]) for s in stages
        }
        tier_frames = {
            str(t): sum(1 for f in processed if str(t) in f.completion_ms) for t in TIERS
        }
        misses = self.misses()
        counts: dict[str, list[int]] = {}
        for frame in processed:
            for name, n in frame.counts.items():
                counts.setdefault(name, []).append(n)
        sim_s = self.frames[-1].t_s - self.frames[0].t_s if len(self.frames) > 1 else 0.0
        wall_s = self.frames[-1].wall_s if self.frames else 0.0
        return {
            "frames": len(self.frames),
            "processed": len(processed),
            "dropped_frames": len(self.frames) - len(processed),
            "sim_s": round(sim_s, 3),
            "wall_s": round(wall_s, 3),
            "realtime_factor": round(sim_s / wall_s, 3) if wall_s > 0 else None,
            "latency_ms": {k: v for k, v in latency.items() if v},
            "deadline_misses": misses,
            "miss_rate": {
                t: round(misses[t] / tier_frames[t], 4) if tier_frames[t] else 0.0 for t in misses
            },
            "drops": self.drops(),
            "hit_rate": self.frames[-1].hit_rate if self.frames else 0.0,
            "compile_events": len(self.events),
            "counts": {k: {"min": min(v), "max": max(v)} for k, v in counts.items()},
            **self.summary_extra,
        }

    def document(self) -> dict[str, Any]:
        return {
            "version": METRICS_VERSION,
            "run": self.run,
            "topics": self.topics,
            "stages": list(self.stages),
            "tiers": {
                str(t): {
                    "deadline_ms": self.deadlines_ms.get(t),
                    "stages": [s for s, st in STAGE_TIERS.items() if st == t],
                }
                for t in TIERS
            },
            "drop_units": DROP_UNITS,
            "summary": self.summary(),
            "frames": [asdict(f) for f in self.frames],
            "compile_events": self.events,
        }
