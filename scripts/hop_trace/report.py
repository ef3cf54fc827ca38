"""Where each frame's time goes between processes, from the logs sitecustomize.py writes.

Usage:
  HOP_TRACE_DIR=/tmp/trace PYTHONPATH=scripts/hop_trace:$PWD \
      dynshape-perception bench e2e --setups separate --inputs kitti --modes incremental \
      --frames 100 --prediction-cost none --params-file config/x86_dev.param.yaml
  PYTHON scripts/hop_trace/report.py /tmp/trace separate   (or composed; one setup per folder)

Per segment of the chain (scan sent, each node's receive callback, each publish, the
probe's receive) the median, 90th percentile and max in ms over the measured frames, the
slowest frames segment by segment, each process's garbage collections and diagnostics
updates in the measured window (count, total and longest ms) and the segments they fell in
(a compile worker's show where it ran), and per node thread what a
frame cost it (scan sent to predictions in): ms on a core, ms runnable but waiting for one,
times scheduled in and minor page faults, at the median frame and in the frames whose
threads ran longest together.
"""

from __future__ import annotations

import bisect
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
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
HEAVIEST = 5
# run ns, runnable-wait ns, times scheduled in, minor faults: a sched line's counters.
COUNTERS = 4
NS_PER_MS = 1e6


def _process(header: str) -> str:
    words = header[1:].split()
    if "bench" in words:
        return "harness"
    # multiprocessing's spawn: in these runs, a node's compile worker.
    if "--multiprocessing-fork" in words:
        return "compile_worker"
    return words[0].rsplit("/", 1)[-1] if words else "?"


@dataclass
class Trace:
    # stamp -> "process:kind:topic" -> time (s)
    events: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    # (time, process, kind, ms): garbage collections, and diagnostics updates as "diag"
    pauses: list[tuple[float, str, str, float]] = field(default_factory=list)
    # stamp -> tid -> counters at the scan's send, then at the predictions' arrival
    sched: dict[int, dict[str, list[list[int]]]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(list))
    )
    # tid -> "process/thread"
    threads: dict[str, str] = field(default_factory=dict)


def read(folder: Path) -> Trace:
    trace = Trace()
    for path in sorted(folder.glob("*.log")):
        process = "?"
        diag_start: float | None = None
        for line in path.read_text().splitlines():
            if line.startswith("#"):
                process = _process(line)
                continue
            t, kind, topic, stamp, *rest = line.split()
            if kind.startswith("gc"):
                trace.pauses.append((float(t), process, kind, float(topic)))
            elif kind == "diag0":
                diag_start = float(t)
            elif kind == "diag1" and diag_start is not None:
                ms = (float(t) - diag_start) * 1e3
                trace.pauses.append((diag_start, process, "diag", ms))
            elif kind == "thread" and process == "harness":
                trace.threads.setdefault(topic, rest[0])
            elif kind == "thread":
                # A node's own name for its Python thread, over the kernel's.
                trace.threads[topic] = f"{process}/{rest[0]}"
            elif kind == "sched":
                trace.sched[int(stamp)][topic].append([int(v) for v in rest[:COUNTERS]])
            elif kind in ("rx", "rxdone", "pub0", "pub1", "send", "probe"):
                key = f"{process}:{kind}:{topic.rsplit('/', 1)[-1]}"
                trace.events[int(stamp)].setdefault(key, float(t))
    return trace


def thread_costs(trace: Trace, stamps: list[int]) -> None:
    """Per thread, what a frame cost it: at the median frame, and in the heaviest ones."""
    frames = []
    for stamp in stamps:
        pairs = trace.sched.get(stamp, {})
        frames.append(
            {
                tid: [b - a for a, b in zip(*v, strict=True)]
                for tid, v in pairs.items()
                if len(v) == 2
            }
        )
    frames = [f for f in frames if f]
    if not frames:
        return
    tids = sorted({tid for f in frames for tid in f}, key=int)
    zero = [0] * COUNTERS
    run = [sum(c[0] for c in f.values()) for f in frames]
    heaviest = sorted(range(len(frames)), key=run.__getitem__)[-HEAVIEST:]
    all_median = statistics.median(run) / NS_PER_MS
    all_heavy = statistics.mean(run[i] for i in heaviest) / NS_PER_MS
    print(
        "node threads, per frame: run ms, wait ms, scheduled in, minor faults; median -> "
        f"mean of the {len(heaviest)} frames that ran longest ({all_median:.2f} -> "
        f"{all_heavy:.2f} ms on a core in all)"
    )
    for tid in tids:
        columns = list(zip(*(f.get(tid, zero) for f in frames), strict=True))
        if max(columns[0]) < NS_PER_MS / 10 and max(columns[1]) < NS_PER_MS / 10:
            continue
        median = [statistics.median(c) for c in columns]
        heavy = [statistics.mean(c[i] for i in heaviest) for c in columns]
        print(
            f"  {trace.threads.get(tid, tid)} [{tid}]: "
            f"{median[0] / NS_PER_MS:.2f} -> {heavy[0] / NS_PER_MS:.2f}, "
            f"{median[1] / NS_PER_MS:.2f} -> {heavy[1] / NS_PER_MS:.2f}, "
            f"{median[2]:.0f} -> {heavy[2]:.0f}, {median[3]:.0f} -> {heavy[3]:.0f}"
        )


def main(folder: Path, setup: str) -> None:
    chain = CHAINS[setup]
    trace = read(folder)
    events = trace.events
    stamps = [s for s in sorted(events) if all(k in events[s] for k in chain)][WARMUP_FRAMES:]
    frames = [[events[s][k] for k in chain] for s in stamps]
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
    for t, process, kind, ms in trace.pauses:
        if start <= t <= end:
            per[(process, kind)].append(ms)
    print(
        "collections and diagnostics updates in the measured window (count, total ms, longest ms):"
    )
    for (process, kind), values in sorted(per.items()):
        print(f"  {process} {kind}: {len(values)} {sum(values):.1f} {max(values):.2f}")
    pauses_by_segment(trace, chain, frames)
    thread_costs(trace, stamps)


def pauses_by_segment(trace: Trace, chain: tuple[str, ...], frames: list[list[float]]) -> None:
    """Where each process's collections and diagnostics updates fell: in which segment of
    a frame (numbered as the columns of the slowest frames), or between frames."""
    sends = [f[0] for f in frames]
    where: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for t, process, kind, _ in trace.pauses:
        i = bisect.bisect_right(sends, t) - 1
        if i < 0 or t > frames[-1][-1]:
            continue
        frame = frames[i]
        k = bisect.bisect_right(frame, t) - 1
        where[(process, "diag" if kind == "diag" else "gc")][
            f"{k + 1}" if k < len(chain) - 1 else "between"
        ] += 1
    print("where they fell (segment of the slowest frames' columns, or between frames):")
    for (process, kind), counts in sorted(where.items()):
        order = sorted(counts, key=lambda s: (s == "between", int(s) if s.isdigit() else 0))
        print(f"  {process} {kind}: " + ", ".join(f"{s} {counts[s]}" for s in order))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "separate")
