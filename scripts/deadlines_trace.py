"""Where the slow tier-1 units of ``bench deadlines`` spend their time.

Usage: PYTHON scripts/deadlines_trace.py [--rate FACTOR] [--slowest N] [--json FILE]
       [any option of ``dynshape-perception bench deadlines``]

Prepares the bench as ``bench deadlines`` does, then runs its tiered executor once at FACTOR
times the sustainable rate (default 2: the 2x run) with every step of every job timed: its
start, its end, and the CPU time of the lane thread that ran it. ``time.thread_time`` takes
no lock and lets no other thread in, so the trace leaves the contention it measures as it
was; reading /proc at each step would not (each read lets the GIL go and waits to get it
back). A tier-1 unit counts from its frame's jobs being made, just before they are
submitted. Prints the tier-1 units' p50, p99, max and misses, the median unit, and for the
N slowest: the wait before it started, its run and CPU time, which scan it served, what the
other threads ran meanwhile (per thread, job and step of the job: the steps that overlapped
it, the wall time of the overlap, those steps' CPU time) and any garbage collection. Run
time well above CPU time was spent waiting for a core or for the GIL. Last, the CPU time of
the generator thread (it makes and submits each frame's jobs) and of each lane, and how much
of a lane's went into its jobs' steps: the rest is the executor's own work.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dynshape_perception.scheduling.executor_base import ExecutorBase
from dynshape_perception.scheduling.tiers import Tier
from dynshape_perception.scheduling.work import Lane
from dynshape_perception.tools.bench.deadlines import (
    add_arguments,
    held_cpu_latency,
    prepared,
    stream,
)
from dynshape_perception.tools.bench.deadlines.strategies import load_run

MS = 1e3
DEFAULT_SLOWEST = 8


@dataclass(frozen=True)
class Step:
    job: str
    # Which step of a job that yields between steps (0: the first, or a job that does not).
    step: int
    frame: int
    tier: int
    thread: str
    start_s: float
    end_s: float
    cpu_s: float


@dataclass(frozen=True)
class Unit:
    frame: int
    submitted_s: float
    start_s: float
    end_s: float
    cpu_s: float
    thread: str

    @property
    def latency_ms(self) -> float:
        return (self.end_s - self.submitted_s) * MS


class Trace:
    """Every job step of the runs, the frames' submission times, and each collection."""

    def __init__(self) -> None:
        self.steps: list[Step] = []
        self.submitted: dict[int, float] = {}
        self.collections: list[tuple[str, int, float]] = []

    def _record(self, job: stream.Job, frame: int, step: int, start: float, cpu: float) -> None:
        self.steps.append(
            Step(
                job.name,
                step,
                frame,
                int(job.tier),
                threading.current_thread().name,
                start,
                time.perf_counter(),
                time.thread_time() - cpu,
            )
        )

    def _steps(self, gen: Generator[Any, None, Any], job: stream.Job, frame: int) -> Any:
        for step in itertools.count():
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                value = next(gen)
            except StopIteration as stop:
                self._record(job, frame, step, start, cpu)
                return stop.value
            self._record(job, frame, step, start, cpu)
            yield value

    def _timed(self, job: stream.Job, frame: int) -> stream.Job:
        def run() -> Any:
            start, cpu = time.perf_counter(), time.thread_time()
            out = job.fn()
            if isinstance(out, Generator):
                return self._steps(out, job, frame)
            self._record(job, frame, 0, start, cpu)
            return out

        return stream.Job(run, job.tier, job.name, job.topic, job.speculative, job.size)

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        self.collections.append((phase, info["generation"], time.perf_counter()))

    @contextmanager
    def installed(self) -> Iterator[None]:
        jobs = stream.Run.jobs

        def timed_jobs(run: stream.Run, frame: int, stamp_s: float) -> list[stream.Job]:
            self.submitted[frame] = time.perf_counter()
            return [self._timed(job, frame) for job in jobs(run, frame, stamp_s)]

        stream.Run.jobs = timed_jobs  # type: ignore[method-assign,assignment]
        gc.callbacks.append(self._collected)
        try:
            yield
        finally:
            stream.Run.jobs = jobs  # type: ignore[method-assign]
            gc.callbacks.remove(self._collected)

    def tier1_units(self) -> list[Unit]:
        """Each frame's tier-1 unit, its steps joined (the near field is one), by latency."""
        steps: dict[int, list[Step]] = defaultdict(list)
        for step in self.steps:
            if step.tier == Tier.COLLISION and step.frame in self.submitted:
                steps[step.frame].append(step)
        units = [
            Unit(
                frame,
                self.submitted[frame],
                min(s.start_s for s in own),
                max(s.end_s for s in own),
                sum(s.cpu_s for s in own),
                own[-1].thread,
            )
            for frame, own in steps.items()
        ]
        return sorted(units, key=lambda u: u.latency_ms)

    def beside(self, unit: Unit) -> dict[tuple[str, str], list[float]]:
        """Per (thread, job and step) of the other threads, the steps that overlapped the unit (from
        its submission to its end): how many, the overlap's wall ms, those steps' CPU ms."""
        seen: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for step in self.steps:
            if step.thread == unit.thread:
                continue
            overlap = min(step.end_s, unit.end_s) - max(step.start_s, unit.submitted_s)
            if overlap > 0:
                row = seen[(step.thread, f"{step.job} {step.step}")]
                row[0] += 1
                row[1] += overlap * MS
                row[2] += step.cpu_s * MS
        return dict(seen)


class ThreadCpu:
    """CPU time over a run of the generator thread (the calling one) and of each lane."""

    def __init__(self) -> None:
        self.generator_s = 0.0
        self.lanes_s: dict[str, float] = {}

    @contextmanager
    def installed(self) -> Iterator[None]:
        serve = ExecutorBase._serve

        def timed_serve(executor: ExecutorBase, lane: Lane) -> None:
            try:
                serve(executor, lane)
            finally:
                # A lane's thread serves until the executor closes: this is all its CPU.
                self.lanes_s[threading.current_thread().name] = time.thread_time()

        ExecutorBase._serve = timed_serve  # type: ignore[method-assign,assignment]
        start = time.thread_time()
        try:
            yield
        finally:
            self.generator_s = time.thread_time() - start
            ExecutorBase._serve = serve  # type: ignore[method-assign]

    def report(self, trace: Trace, frames: int) -> None:
        in_steps: dict[str, float] = defaultdict(float)
        for step in trace.steps:
            in_steps[step.thread] += step.cpu_s
        print(
            f"CPU over the run: generator {self.generator_s * MS:.0f} ms "
            f"({self.generator_s * MS / max(frames, 1):.3f} ms a frame)"
        )
        for name, total in sorted(self.lanes_s.items()):
            steps = in_steps.get(name, 0.0)
            print(
                f"  {name:20s} {total * MS:7.0f} ms, {steps * MS:7.0f} in job steps, "
                f"{(total - steps) * MS / max(frames, 1):.3f} ms a frame besides"
            )


def describe(unit: Unit, source: str) -> str:
    return (
        f"{unit.latency_ms:7.2f} {(unit.start_s - unit.submitted_s) * MS:6.2f} "
        f"{(unit.end_s - unit.start_s) * MS:6.2f} {unit.cpu_s * MS:6.2f}  frame {unit.frame} "
        f"({source}) on {unit.thread}"
    )


def report(trace: Trace, sources: list[str], deadline_ms: float, slowest: int) -> None:
    units = trace.tier1_units()
    if not units:
        print("no tier-1 unit completed")
        return
    latency = np.array([u.latency_ms for u in units])
    misses = int((latency > deadline_ms).sum())
    print(
        f"tier 1: {len(units)} units, p50 {np.percentile(latency, 50):.2f} ms, "
        f"p99 {np.percentile(latency, 99):.2f} ms, max {latency.max():.2f} ms, "
        f"over the {deadline_ms:g} ms deadline: {misses}"
    )
    print("latency   wait    run    cpu  (ms)")
    median = units[len(units) // 2]
    print("median " + describe(median, sources[median.frame % len(sources)]))
    for unit in units[-slowest:]:
        print(describe(unit, sources[unit.frame % len(sources)]))
        for (thread, job), (steps, wall, cpu) in sorted(trace.beside(unit).items()):
            print(
                f"    {thread:20s} {job:14s} {int(steps):3d} steps {wall:6.2f} wall {cpu:6.2f} cpu"
            )
        for phase, generation, at in trace.collections:
            if unit.submitted_s <= at <= unit.end_s:
                print(f"    gc {phase} generation {generation}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--rate", type=float, default=2.0, help="times the sustainable rate")
    parser.add_argument("--slowest", type=int, default=DEFAULT_SLOWEST)
    args = parser.parse_args(argv)
    trace = Trace()
    cpu = ThreadCpu()
    with held_cpu_latency(args.cpu_latency_us), prepared(args) as ready:
        rate_hz = ready.calibration["sustainable_hz"] * args.rate
        with trace.installed(), cpu.installed():
            outcome = load_run(ready.bench, "tiered", rate_hz, args.duration_s, ready.estimates)
        sources = [name for name, _ in ready.bench.sources]
    own = outcome["snapshot"]["tiers"][str(int(Tier.COLLISION))]
    print(
        f"tiered executor at {rate_hz:.1f} Hz for {args.duration_s:g} s; its own count: "
        f"p99 {own['p99_ms']} ms, misses {own['misses']}"
    )
    report(trace, sources, float(own["deadline_ms"]), args.slowest)
    cpu.report(trace, int(outcome["frames"]))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "steps": [asdict(s) for s in trace.steps],
                    "submitted": trace.submitted,
                    "collections": trace.collections,
                    "sources": sources,
                }
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
