"""Where each frame's time goes between processes, from the logs sitecustomize.py writes.

Usage:
  HOP_TRACE_DIR=/tmp/trace PYTHONPATH=scripts/hop_trace:$PWD \
      dynshape-perception bench e2e --setups separate --inputs kitti --modes incremental \
      --frames 100 --prediction-cost none --params-file config/x86_dev.param.yaml
  PYTHON scripts/hop_trace/report.py /tmp/trace separate   (or composed; one setup per folder)

Per segment of the chain (scan sent, each node's receive callback, each publish, the
probe's receive) the median, 90th percentile and max in ms over the measured frames, the
slowest frames segment by segment, and each process's garbage collections in the measured
window (count, total and longest ms).
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

CHAINS = {
    "separate": (
        "harness:send:points",
        "pointcloud_node:rx:points",
        "pointcloud_node:pub0:detected_objects",
        "tracker_node:rx:detected_objects",
        "tracker_node:pub0:tracked_objects",
        "prediction_node:rx:tracked_objects",
        "prediction_node:pub0:predicted_objects",
        "prediction_node:pub1:predicted_objects",
        "harness:probe:predicted_objects",
    ),
    "composed": (
        "harness:send:points",
        "perception_pipeline:rx:points",
        "perception_pipeline:pub0:detected_objects",
        "perception_pipeline:pub0:tracked_objects",
        "perception_pipeline:pub0:predicted_objects",
        "perception_pipeline:pub1:predicted_objects",
        "harness:probe:predicted_objects",
    ),
}
WARMUP_FRAMES = 5
SLOWEST = 8


def _process(header: str) -> str:
    words = header[1:].split()
    if "bench" in words:
        return "harness"
    return words[0].rsplit("/", 1)[-1] if words else "?"


def read(folder: Path) -> tuple[dict[int, dict[str, float]], list[tuple[float, str, str, float]]]:
    events: dict[int, dict[str, float]] = defaultdict(dict)
    collections: list[tuple[float, str, str, float]] = []
    for path in sorted(folder.glob("*.log")):
        process = "?"
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                process = _process(line)
                continue
            t, kind, topic, stamp = line.split()[:4]
            if kind.startswith("gc"):
                collections.append((float(t), process, kind, float(topic)))
            elif kind in ("rx", "rxdone", "pub0", "pub1", "send", "probe"):
                key = f"{process}:{kind}:{topic.rsplit('/', 1)[-1]}"
                events[int(stamp)].setdefault(key, float(t))
    return events, collections


def main(folder: Path, setup: str) -> None:
    chain = CHAINS[setup]
    events, collections = read(folder)
    frames = [
        [events[s][k] for k in chain] for s in sorted(events) if all(k in events[s] for k in chain)
    ][WARMUP_FRAMES:]
    if not frames:
        raise SystemExit(f"no frame in {folder} went through every point of {setup}")
    segments = [[(b - a) * 1e3 for a, b in pairwise(f)] for f in frames]
    totals = sorted(sum(s) for s in segments)
    print(f"{len(frames)} frames, scan to probe p50 {statistics.median(totals):.2f} ms")
    for k, (a, b) in enumerate(pairwise(chain)):
        values = sorted(s[k] for s in segments)
        p90 = values[int(0.9 * (len(values) - 1))]
        print(
            f"  {a} -> {b}: p50 {statistics.median(values):.3f} p90 {p90:.3f} max {values[-1]:.3f}"
        )
    print("slowest frames, ms per segment:")
    for segment in sorted(segments, key=sum, reverse=True)[:SLOWEST]:
        print(f"  {sum(segment):6.2f} = " + " ".join(f"{v:.2f}" for v in segment))
    start, end = frames[0][0], frames[-1][-1]
    per: dict[tuple[str, str], list[float]] = defaultdict(list)
    for t, process, kind, ms in collections:
        if start <= t <= end:
            per[(process, kind)].append(ms)
    print("garbage collections in the measured window (count, total ms, longest ms):")
    for (process, kind), values in sorted(per.items()):
        print(f"  {process} {kind}: {len(values)} {sum(values):.1f} {max(values):.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "separate")
