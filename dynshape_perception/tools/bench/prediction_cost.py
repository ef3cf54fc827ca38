"""Per-frame prediction cost at history lengths 8, 32 and 128 and past the window."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from dynshape_perception import stats
from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.pipeline import ModelFn
from dynshape_perception.perception.prediction.settings import MODES, PredictionSettings
from dynshape_perception.perception.prediction.stage import PredictionStage
from dynshape_perception.perception.records import LABEL_PEDESTRIAN, TRACK_DTYPE
from dynshape_perception.tools.sim.scenes import PEDESTRIAN_SIZE_M, pedestrian_scene

if TYPE_CHECKING:
    from dynshape_perception.testing.prediction_session import PredictionSession

LENGTHS = (8, 32, 128)
FIRST_NS = 1_000_000_000
STEP_NS = 100_000_000
# Track ids of one run start here times its number: each run's tracks are new ones.
RUN_IDS = 100_000
ROUND_TRIP_TIMEOUT_S = 10.0
# A node that answers none of this many tables in a row has stopped, not lost a message.
MAX_LOST_IN_A_ROW = 3
PRIME_ATTEMPTS = 10
# The tracks carry boxes and scores as a tracker gives them (the messages need sizes).
TRACK_SCORE = 0.9
FRAME_S = 0.1
MS_PER_S = 1000.0
FIRST_STAMP_S = 1000.0
WINDOW_NOTE = (
    "the window is the longest length: every history advances its GRU state by one "
    "step_decode call in incremental mode; past the window (past_window: one restart cycle, "
    "stride steps) a history restarts stride steps later in both modes, and incremental "
    "mode encodes it once then; agents born together restart on the same frame, one frame "
    "in stride of a grid point, which weighs on mean and p99, not p50"
)
PAST = "past_window"


def _tables(agents: int, frames: int, seed: int) -> list[np.ndarray]:
    paths = pedestrian_scene(seed=seed, num_agents=agents, num_steps=frames, dt_s=FRAME_S)
    ids = np.arange(1, agents + 1, dtype=np.uint32)
    out = []
    for frame in range(frames):
        rows = np.zeros(agents, TRACK_DTYPE)
        rows["id"], rows["x"], rows["y"] = ids, paths[:, frame, 0], paths[:, frame, 1]
        rows["length"], rows["width"], rows["height"] = PEDESTRIAN_SIZE_M
        rows["label"] = LABEL_PEDESTRIAN
        rows["score"] = TRACK_SCORE
        out.append(rows)
    return out


def _summary(values: list[float]) -> dict[str, float | int]:
    data = np.asarray(values, np.float64)
    return {
        "p50_ms": round(stats.median(data), 4),
        "p99_ms": round(stats.percentile(data, 99), 4),
        "mean_ms": round(float(data.mean()), 4),
        "frames": int(data.size),
    }


def _check_sizes(lengths: Sequence[int], agents: int, repeats: int) -> None:
    if not lengths or min(lengths) < 2 or agents < 1 or repeats < 1:
        raise ConfigError(
            f"need history lengths >= 2 (one step to predict from), agents >= 1 and "
            f"repeats >= 1; got {list(lengths)}, {agents}, {repeats}"
        )


def _header(agents: int, window: int, stride: int, repeats: int) -> dict[str, Any]:
    return {
        "agents": agents,
        "window": window,
        "stride": stride,
        "repeats": repeats,
        "note": WINDOW_NOTE,
    }


def _by_length(per_length: dict[int, list[float]], past: list[float]) -> dict[str, Any]:
    """Summaries by history length (those with frames), and past the window if it ran."""
    entry = {str(length): _summary(v) for length, v in per_length.items() if v}
    if past:
        entry[PAST] = _summary(past)
    return entry


def stage_cost(
    predictor: ModelFn,
    settings: PredictionSettings,
    lengths: Sequence[int] = LENGTHS,
    agents: int = 32,
    repeats: int = 10,
) -> dict[str, Any]:
    """Milliseconds of ``PredictionStage.predict`` per frame while every agent's history
    holds exactly L samples, for each L of ``lengths``, in both modes.

    The window (``history_steps``) is the longest length; agents are all born on the
    first frame, so a frame's agents share one length. Per repeat (a new scene), one stage
    per length is brought untimed to the frame before its histories reach L; then the
    ``phases`` frames at L (one per grid point of a predictor step) are timed in rounds
    across the lengths, so that a change of the host's load weighs on every length alike.
    The longest length's stage then goes on past the window for one restart cycle
    (``stride`` predictor steps, every frame timed: ``past_window``).
    """
    _check_sizes(lengths, agents, repeats)
    window = max(lengths)
    stride = replace(settings, history_steps=window, history_stride=0).stride
    result: dict[str, Any] = _header(agents, window, stride, repeats)
    for mode in MODES:
        config = replace(
            settings, mode=mode, history_steps=window, history_stride=stride, speculation=False
        )
        phases = config.phases
        per_length: dict[int, list[float]] = {length: [] for length in lengths}
        past: list[float] = []
        for repeat in range(repeats):
            tables = _tables(agents, phases * (window + stride) + 1, seed=repeat)
            stages = {}
            for length in lengths:
                stage = PredictionStage(predictor, config)
                # Frame k's histories hold (k - 1) // phases + 1 samples (k >= 1): the grid
                # lies just before each frame, so frame 0's agents are not observed yet.
                first = phases * (length - 1) + 1
                for k in range(first):
                    stage.predict(tables[k], FIRST_STAMP_S + k * FRAME_S)
                stages[length] = (stage, first)
            for offset in range(phases):
                for length, (stage, first) in stages.items():
                    k = first + offset
                    start = time.perf_counter()
                    out = stage.predict(tables[k], FIRST_STAMP_S + k * FRAME_S)
                    ms = (time.perf_counter() - start) * MS_PER_S
                    if out.ids.size == agents:
                        per_length[length].append(ms)
            stage = stages[window][0]
            for k in range(phases * window + 1, len(tables)):
                start = time.perf_counter()
                out = stage.predict(tables[k], FIRST_STAMP_S + k * FRAME_S)
                ms = (time.perf_counter() - start) * MS_PER_S
                if out.ids.size == agents:
                    past.append(ms)
        result[mode] = _by_length(per_length, past)
    _ratios(result, "incremental", lengths)
    return result


def _ratios(result: dict[str, Any], name: str, lengths: Sequence[int]) -> None:
    """p50 at the longest length and past the window over p50 at the shortest."""
    entry = result[name]
    first_key, last_key = str(min(lengths)), str(max(lengths))
    if first_key not in entry:
        return
    for key, label in ((last_key, "longest"), (PAST, PAST)):
        if key in entry:
            result[f"{name}_ratio_{label}_to_shortest"] = round(
                entry[key]["p50_ms"] / entry[first_key]["p50_ms"], 3
            )


def node_cost(
    session: PredictionSession,
    lengths: Sequence[int] = LENGTHS,
    agents: int = 32,
    repeats: int = 3,
    phases: int = 4,
) -> dict[str, Any]:
    """Round trips (tracked objects out, predicted objects back) per frame while every
    agent's history holds exactly L samples, through the nodes of ``session``.

    Every variant gets each table, one after the other, so a change of the host's load
    weighs on all alike. Each run (a length of a repeat) brings new track ids, which the
    nodes start afresh; its frames before the histories reach L are sent but not timed.
    The nodes' window is the longest length; its runs go on past the window for one
    restart cycle of the nodes' default stride (``past_window``, every frame timed).

    The nodes take their input best effort, as from a tracker: a table that brings no
    predictions back within the timeout is counted (``<variant>_lost``, all frames, and
    ``<variant>_lost_timed``, those that would have been timed) and the run goes on; a node
    that answers none of ``MAX_LOST_IN_A_ROW`` tables in a row is an error.
    """
    _check_sizes(lengths, agents, repeats)
    names = list(session.publishers)
    window = max(lengths)
    stride = PredictionSettings(history_steps=window).stride
    per: dict[str, dict[int, list[float]]] = {n: {length: [] for length in lengths} for n in names}
    past: dict[str, list[float]] = {n: [] for n in names}
    lost = {n: 0 for n in names}
    lost_timed = {n: 0 for n in names}
    in_a_row = {n: 0 for n in names}
    stamp = session.prime(FIRST_NS, STEP_NS, PRIME_ATTEMPTS, ROUND_TRIP_TIMEOUT_S)
    run = 0
    for repeat in range(repeats):
        # Alternate the order, so no length always follows a longer one.
        order = list(lengths) if repeat % 2 == 0 else list(reversed(lengths))
        for length in order:
            run += 1
            timed = range(phases * (length - 1) + 1, phases * length + 1)
            beyond = range(timed.stop, phases * (window + stride) + 1 if length == window else 0)
            frames = max(timed.stop, beyond.stop)
            for k, tracks in enumerate(_tables(agents, frames, seed=run)):
                tracks["id"] += run * RUN_IDS
                for name in names:
                    ms = session.round_trip(name, stamp, tracks, ROUND_TRIP_TIMEOUT_S)
                    if ms is None:
                        session.check_alive()
                        lost[name] += 1
                        lost_timed[name] += k in timed or k in beyond
                        in_a_row[name] += 1
                        if in_a_row[name] >= MAX_LOST_IN_A_ROW:
                            raise ConfigError(
                                f"no predictions from {name} for {MAX_LOST_IN_A_ROW} tables in "
                                f"a row (the last of stamp {stamp})"
                            )
                        continue
                    in_a_row[name] = 0
                    if k in timed:
                        per[name][length].append(ms)
                    elif k in beyond:
                        past[name].append(ms)
                session.forget(stamp)
                stamp += STEP_NS
    result: dict[str, Any] = _header(agents, window, stride, repeats)
    for name in names:
        result[name] = _by_length(per[name], past[name])
        result[f"{name}_lost"] = lost[name]
        result[f"{name}_lost_timed"] = lost_timed[name]
        _ratios(result, name, lengths)
    return result
