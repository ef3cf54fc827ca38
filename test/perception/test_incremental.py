"""Incremental encoding equals a full recompute, with tracks appearing, pausing and dying."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from dynshape_perception.errors import InputValueError, ShapeError
from dynshape_perception.perception.prediction.incremental import (
    Histories,
    HistoryFn,
    IncrementalEncoder,
    IncrementalPredictor,
    full_recompute,
    tick_of,
    track_observations,
)
from dynshape_perception.perception.records import OBSTACLE_DTYPE
from dynshape_perception.perception.tracking import Tracker, reference_affinity
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.tools.sim.scenes import Crowd, crowd_scene, pedestrian_scene

RTOL, ATOL = 1e-4, 1e-5
STEP_S = 0.4


def synthetic_world(seed: int, agents: int, ticks: int) -> tuple[np.ndarray, np.ndarray]:
    """Random walks ``[agents, ticks, 2]`` and a visibility mask with births, gaps and deaths."""
    rng = np.random.default_rng(seed)
    walk = np.cumsum(rng.normal(0.0, 0.4, (agents, ticks, 2)), axis=1).astype(np.float32)
    visible = np.zeros((agents, ticks), dtype=bool)
    for a in range(agents):
        start = int(rng.integers(0, ticks // 2)) if a % 3 else 0
        end = ticks if a % 4 == 0 else int(rng.integers(start + 1, ticks + 1))
        visible[a, start:end] = True
        if a % 5 == 1 and end - start > 4:
            visible[a, start + (end - start) // 2] = False
    return walk, visible


def visible_run(walk: np.ndarray, visible: np.ndarray, tick: int, longest: int = 0) -> HistoryFn:
    """Each agent's current run of consecutive visible ticks up to ``tick`` (its last
    ``longest`` only, if given), as a track restarted after a gap."""

    def history_of(agent: int) -> np.ndarray:
        start = tick
        while start > 0 and visible[agent, start - 1]:
            start -= 1
        if longest:
            start = max(start, tick + 1 - longest)
        return walk[agent, start : tick + 1]

    return history_of


def through(walk: np.ndarray, tick: int) -> HistoryFn:
    """Each agent's walk up to and including ``tick``."""
    return lambda agent: walk[agent, : tick + 1]


def run_world(
    engine: Engine, walk: np.ndarray, visible: np.ndarray, max_batch: int | None = None
) -> tuple[IncrementalEncoder, int]:
    predictor = IncrementalPredictor(engine["predictor"], max_batch=max_batch)
    checked = 0
    for tick in range(walk.shape[1]):
        ids = np.flatnonzero(visible[:, tick])
        if ids.size == 0:
            predictor.encoder.evict(predictor.encoder.ids())
            continue

        history_of = visible_run(walk, visible, tick)
        got = predictor.observe(tick, ids, walk[ids, tick], history_of)
        want = full_recompute(engine["predictor"], ids, [history_of(int(a)) for a in ids])
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)
        checked += ids.size
    return predictor.encoder, checked


@pytest.fixture(scope="module")
def committed() -> Iterator[Engine]:
    with Engine("x86_64", JitConfig(mode="off"), models=("predictor",)) as eng:
        yield eng


def test_committed_weights_step_like_a_full_recompute_over_long_tracks(
    committed: Engine,
) -> None:
    """The fitted weights, on crowd tracks of 128 ticks with births, gaps and deaths."""
    tracks = crowd_scene(seed=7, num_agents=24, num_steps=128, crowd=Crowd(area_m=14.0))
    _, visible = synthetic_world(seed=7, agents=24, ticks=128)
    encoder, checked = run_world(committed, tracks, visible)
    assert checked == int(visible.sum())
    assert encoder.counters.stepped > encoder.counters.encoded


@pytest.mark.parametrize("ticks", [8, 32, 128])
def test_incremental_equals_full_recompute(engine: Engine, ticks: int) -> None:
    walk, visible = synthetic_world(seed=ticks, agents=24, ticks=ticks)
    encoder, checked = run_world(engine, walk, visible)
    counters = encoder.counters
    assert checked == int(visible.sum())
    # One fused step_decode call per tick, whatever the history length (24 agents fit one
    # batch); observe never needs a separate step.
    assert counters.step_decode_calls <= ticks and counters.step_calls == 0
    assert counters.stepped > counters.encoded
    assert counters.evicted > 0 and counters.encoded > 24


def test_hidden_state_equals_encode_over_the_whole_history(engine: Engine) -> None:
    walk, _ = synthetic_world(seed=3, agents=10, ticks=128)
    encoder = IncrementalEncoder(engine["predictor"])
    ids = np.arange(10)
    for tick in range(128):
        encoder.update(tick, ids, walk[:, tick], lambda a: walk[a, :1])
    lengths = np.full(10, 128, np.int32)
    want = engine["predictor"]("encode", walk, lengths)
    got = encoder.state(list(range(10)))
    for g, w in zip((got.hidden, got.last_pos, got.last_disp), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
    assert encoder.counters.encode_calls == 1 and encoder.counters.step_calls == 127


def test_batches_above_the_agent_bound_are_split(engine: Engine) -> None:
    walk, visible = synthetic_world(seed=5, agents=20, ticks=12)
    encoder, _ = run_world(engine, walk, visible, max_batch=7)
    assert encoder.counters.step_decode_calls > 11


def test_ticks_must_increase_and_histories_must_end_at_the_observation(engine: Engine) -> None:
    encoder = IncrementalEncoder(engine["predictor"])
    pos = np.zeros((1, 2), np.float32)
    encoder.update(3, np.array([1]), pos, lambda a: pos)
    with pytest.raises(InputValueError, match="ticks must increase"):
        encoder.update(3, np.array([1]), pos, lambda a: pos)
    with pytest.raises(InputValueError, match="not at its observation"):
        encoder.update(4, np.array([2]), pos, lambda a: pos + 1.0)
    with pytest.raises(InputValueError, match="unique"):
        encoder.update(5, np.array([7, 7]), np.zeros((2, 2), np.float32), lambda a: pos)


def in_one_batch(history_of: HistoryFn) -> Histories:
    """The same histories, handed over as one concatenated batch."""

    def of(ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        parts = [np.asarray(history_of(i)) for i in ids]
        return np.concatenate(parts), np.array([len(p) for p in parts])

    return Histories(of)


@pytest.mark.parametrize("max_history", [4, 128])
def test_a_batch_of_histories_encodes_exactly_as_one_history_per_track(
    engine: Engine, max_history: int
) -> None:
    """Tracks born, restarted after gaps and (at 4) longer than the window, in batches of 7."""
    walk, visible = synthetic_world(seed=13, agents=20, ticks=24)
    one = IncrementalEncoder(engine["predictor"], max_batch=7, max_history=max_history)
    batched = IncrementalEncoder(engine["predictor"], max_batch=7, max_history=max_history)
    for tick in range(24):
        ids = np.flatnonzero(visible[:, tick])

        history_of = visible_run(walk, visible, tick)
        want = one.advance(tick, ids, walk[ids, tick], history_of)
        got = batched.advance(tick, ids, walk[ids, tick], in_one_batch(history_of))
        np.testing.assert_array_equal(got.ids, want.ids)
        np.testing.assert_array_equal(got.traj, want.traj)
        np.testing.assert_array_equal(got.probs, want.probs)
    assert batched.counters == one.counters
    assert one.counters.encoded > 20 and one.counters.encode_calls > 3


def test_a_bad_batch_of_histories_is_refused_and_names_the_track(engine: Engine) -> None:
    encoder = IncrementalEncoder(engine["predictor"], max_history=3)
    ids = np.array([5, 9])
    pos = np.array([[1.0, 1.0], [2.0, 2.0]], np.float32)
    rows = np.array([[0.0, 0.0], [1.0, 1.0], [0.0, 2.0], [2.0, 2.0]], np.float32)

    def batch(flat: np.ndarray, lengths: list[int]) -> Histories:
        return Histories(lambda _: (flat, np.array(lengths)))

    with pytest.raises(ShapeError, match="lengths"):
        encoder.update(1, ids, pos, batch(rows, [4]))
    with pytest.raises(ShapeError, match="lengths"):
        encoder.update(1, ids, pos, batch(rows, [4, 0]))
    with pytest.raises(ShapeError, match=r"must be \[4, 2\]"):
        encoder.update(1, ids, pos, batch(rows[:3], [2, 2]))
    with pytest.raises(InputValueError, match="track 9 ends at"):
        encoder.update(1, ids, pos, batch(rows[[0, 1, 2, 2]], [2, 2]))
    with pytest.raises(InputValueError, match="track 9 holds NaN"):
        encoder.update(1, ids, pos, batch(np.insert(rows, 2, np.nan, axis=0), [2, 3]))
    # Older than the window (max_history 3), a NaN is never read: the full path drops it too.
    stale = np.concatenate([np.array([[np.nan, np.nan], [5.0, 5.0]], np.float32), rows])
    assert encoder.update(1, ids, pos, batch(stale, [4, 2])).ids.tolist() == [5, 9]


def obstacles_at(xy: np.ndarray) -> np.ndarray:
    table = np.zeros(xy.shape[0], dtype=OBSTACLE_DTYPE)
    table["x"], table["y"] = xy[:, 0], xy[:, 1]
    table["length"] = table["width"] = 0.6
    table["height"] = 1.7
    return table


def test_tracker_ticks_match_a_full_recompute_of_resampled_histories(engine: Engine) -> None:
    frame_s = 0.1
    tracks = pedestrian_scene(seed=4, num_agents=10, num_steps=160, dt_s=frame_s)
    rng = np.random.default_rng(0)
    tracker = Tracker(reference_affinity)
    predictor = IncrementalPredictor(engine["predictor"])
    last_tick = None
    checked = 0
    for frame in range(tracks.shape[1]):
        stamp = frame * frame_s + 0.05
        # Agents leave and come back; a missed detection makes a track skip a tick.
        seen = (np.arange(10) + frame // 40) % 7 != 0
        seen &= rng.random(10) > 0.1
        tracker.update(obstacles_at(tracks[seen, frame]), stamp)
        tick = tick_of(stamp, STEP_S)
        if last_tick is not None and tick == last_tick:
            continue
        last_tick = tick
        ids, positions, history_of = track_observations(
            tracker, tracker.live_ids(confirmed_only=True), tick, STEP_S
        )
        if ids.size == 0:
            continue
        got = predictor.observe(tick, ids, positions, history_of)
        want = full_recompute(engine["predictor"], ids, [history_of(int(i)) for i in ids])
        np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)
        checked += ids.size
    counters = predictor.encoder.counters
    assert checked > 200 and counters.stepped > counters.encoded > 10


def test_a_tick_skipped_by_the_caller_re_encodes_from_the_history(engine: Engine) -> None:
    """A shed frame means a missing tick: stepping over it would drop a displacement."""
    walk, _ = synthetic_world(seed=9, agents=6, ticks=12)
    predictor = IncrementalPredictor(engine["predictor"])
    ids = np.arange(6)
    for tick in (0, 1, 2, 5, 6, 9):
        got = predictor.observe(tick, ids, walk[:, tick], through(walk, tick))
        want = full_recompute(engine["predictor"], ids, [walk[a, : tick + 1] for a in ids])
        np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)
    counters = predictor.encoder.counters
    assert (counters.encoded, counters.stepped) == (6 * 3, 6 * 3)


def test_a_frame_of_continuing_tracks_costs_one_call(engine: Engine) -> None:
    """Steady state: one fused step_decode per frame, not a step and a decode."""
    walk, _ = synthetic_world(seed=2, agents=16, ticks=40)
    predictor = IncrementalPredictor(engine["predictor"])
    ids = np.arange(16)
    predictor.observe(0, ids, walk[:, 0], lambda a: walk[a, :1])
    counters = predictor.encoder.counters
    for tick in range(1, 40):
        before = counters.calls
        got = predictor.observe(tick, ids, walk[:, tick], through(walk, tick))
        assert counters.calls == before + 1
    want = full_recompute(engine["predictor"], ids, [walk[a] for a in ids])
    np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)


def test_evicting_some_tracks_keeps_the_others(engine: Engine) -> None:
    walk, _ = synthetic_world(seed=4, agents=6, ticks=6)
    predictor = IncrementalPredictor(engine["predictor"])
    ids = np.arange(6)
    for tick in range(3):
        predictor.observe(tick, ids, walk[:, tick], through(walk, tick))
    assert predictor.encoder.evict([1, 4, 99]) == 2
    assert predictor.encoder.ids() == [0, 2, 3, 5]
    keep = np.array([0, 2, 3, 5])
    got = predictor.observe(3, keep, walk[keep, 3], lambda a: walk[a, :4])
    want = full_recompute(engine["predictor"], keep, [walk[a, :4] for a in keep])
    np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
    assert predictor.encoder.counters.encoded == 6


@pytest.mark.parametrize("max_history", [1, 4])
def test_histories_past_max_history_slide_like_the_full_path(
    engine: Engine, max_history: int
) -> None:
    """The full path encodes the last ``max_history`` steps: continuing tracks must follow it."""
    walk, visible = synthetic_world(seed=11, agents=6, ticks=16)
    predictor = IncrementalPredictor(engine["predictor"], max_history=max_history)
    for tick in range(16):
        ids = np.flatnonzero(visible[:, tick])
        if ids.size == 0:
            continue

        history_of = visible_run(walk, visible, tick, max_history)

        got = predictor.observe(tick, ids, walk[ids, tick], history_of)
        want = full_recompute(engine["predictor"], ids, [history_of(int(a)) for a in ids])
        np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)
    assert predictor.encoder.counters.slid > 0
