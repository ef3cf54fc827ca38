"""The bench's seeded long-tail shape stream, its inputs and the open-loop server."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dynshape_perception.runtime.executable import LoadedModel

POINT_SHARE = 0.12
MIN_POINTS, MAX_POINTS = 5_000, 150_000
# Predictor history lengths and agent counts follow a long tail: a few common values, many rare.
HISTORY_LENGTHS = (*range(2, 26), 32, 40, 48, 64)
ZIPF_EXPONENT = 1.3
MAX_AGENTS = 64


@dataclass(frozen=True)
class Call:
    model: str
    dims: dict[str, int]
    seed: int

    @property
    def signature(self) -> tuple[str, tuple[tuple[str, int], ...]]:
        """The model and its dims in a canonical order: what makes two calls the same shape."""
        return self.model, tuple(sorted(self.dims.items()))


def shape_stream(calls: int, seed: int) -> list[Call]:
    """Documented stream: 12 % point-stage calls with continuous P in [5k, 150k] (log-uniform,
    never repeating a count), 88 % predictor calls whose T and A follow Zipf long tails."""
    rng = np.random.default_rng(seed)
    stream: list[Call] = []
    lengths = np.asarray(HISTORY_LENGTHS)
    t_weights = 1.0 / np.arange(1, len(lengths) + 1) ** ZIPF_EXPONENT
    t_weights /= t_weights.sum()
    a_values = np.arange(1, MAX_AGENTS + 1)
    a_weights = 1.0 / a_values**ZIPF_EXPONENT
    a_weights /= a_weights.sum()
    used: set[int] = set()
    for i in range(calls):
        if rng.random() < POINT_SHARE:
            p = int(np.exp(rng.uniform(np.log(MIN_POINTS), np.log(MAX_POINTS))))
            while p in used:
                p = int(np.exp(rng.uniform(np.log(MIN_POINTS), np.log(MAX_POINTS))))
            used.add(p)
            stream.append(Call("segmenter", {"P": p}, i))
        else:
            t = int(rng.choice(lengths, p=t_weights))
            a = int(rng.choice(a_values, p=a_weights))
            stream.append(Call("predictor", {"A": a, "T": t}, i))
    return stream


def make_inputs(call: Call) -> list[np.ndarray]:
    rng = np.random.default_rng(call.seed)
    if call.model == "segmenter":
        p = call.dims["P"]
        pts = rng.uniform(-40, 40, size=(p, 4)).astype(np.float32)
        pts[:, 2] = rng.uniform(-2.0, 1.0, size=p)
        pts[:, 3] = rng.uniform(0, 1, size=p)
        return [pts, np.array([0.0, 0.0, 1.0, 1.73], np.float32)]
    a, t = call.dims["A"], call.dims["T"]
    hist = np.cumsum(rng.normal(0, 0.4, size=(a, t, 2)), axis=1).astype(np.float32)
    return [hist, rng.integers(1, t + 1, size=a).astype(np.int32)]


@dataclass
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)
    service_ms: list[float] = field(default_factory=list)
    served_special: list[bool] = field(default_factory=list)
    accepted: list[bool] = field(default_factory=list)
    # Calls whose key was accepted at any time up to the call, even if a compile later
    # failed, was slower or was demoted (then ``accepted`` no longer counts them).
    ever_accepted: list[bool] = field(default_factory=list)
    compiles: int = 0
    calling_thread_compile_s: float = 0.0
    total_s: float = 0.0
    wall_s: float = 0.0
    busy_by_model_s: dict[str, float] = field(default_factory=dict)
    served_calls: int = 0
    extrapolated: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


Runner = Callable[[Call, list[np.ndarray]], tuple[bool, bool]]


def open_loop(
    stream: list[Call],
    inputs: list[list[np.ndarray]],
    arrivals: np.ndarray,
    run: Runner,
    budget_s: float | None = None,
    compile_clock: Callable[[], float] | None = None,
    probe: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Serve calls at their arrival times; latency includes any wait behind earlier calls.

    ``total_s`` is the calling thread's busy time (serving plus any compiling it does): the
    wall time of an open-loop run is set by the arrival schedule, not by the strategy.
    ``probe`` runs before each call, off the clock, and the arrival schedule waits for it:
    the bench's own bookkeeping is charged to no strategy, neither as service time nor as
    queueing behind it. ``clock`` and ``sleep`` are the wall clock's, unless a test drives
    the schedule on a clock of its own.
    """
    out = Outcome()
    start = clock()
    # Seconds spent in probe: the schedule stops meanwhile, so it delays neither this call's
    # latency nor the next call's start.
    paused = 0.0
    for i, call in enumerate(stream):
        now = clock() - start - paused
        if arrivals[i] > now:
            sleep(arrivals[i] - now)
        if probe is not None:
            t = clock()
            probe()
            paused += clock() - t
        began = clock()
        special, accepted = run(call, inputs[i])
        finished = clock()
        done = finished - start - paused
        out.total_s += finished - began
        out.busy_by_model_s[call.model] = out.busy_by_model_s.get(call.model, 0.0) + (
            finished - began
        )
        out.latencies_ms.append((done - arrivals[i]) * 1000.0)
        out.service_ms.append((finished - began) * 1000.0)
        out.served_special.append(special)
        out.accepted.append(accepted)
        out.served_calls = i + 1
        if budget_s is not None and compile_clock is not None and compile_clock() > budget_s:
            break
    out.wall_s = clock() - start - paused
    return out


def closed_loop_mean_s(
    stream: list[Call], inputs: list[list[np.ndarray]], generic: Mapping[str, LoadedModel]
) -> float:
    """Mean generic service time over these very calls, back to back."""
    began = time.perf_counter()
    for call, args in zip(stream, inputs, strict=True):
        generic[call.model]("forward", *args)
    return (time.perf_counter() - began) / max(len(stream), 1)


def arrival_times(mean_service_s: float, rate_fraction: float, calls: int) -> np.ndarray:
    """Poisson arrivals at ``rate_fraction`` of a throughput of one call per
    ``mean_service_s``, the first at 0. One seed for every rate: a schedule set for another
    rate is this one scaled in time, with its bursts in the same places."""
    gaps = np.random.default_rng(1).exponential(mean_service_s / rate_fraction, size=calls)
    return np.cumsum(gaps) - gaps[0]


def generic_runner(generic: Mapping[str, LoadedModel]) -> Runner:
    """The generic strategy: every call through its model's generic build. Every strategy
    validates its inputs, as the runtime does: a fair comparison serves calls equally safely."""

    def run(call: Call, args: list[np.ndarray]) -> tuple[bool, bool]:
        generic[call.model]("forward", *args)
        return False, False

    return run
