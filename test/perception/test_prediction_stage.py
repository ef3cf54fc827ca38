"""The prediction stage: incremental equals full, speculation changes nothing, resets, counts."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.perception.prediction.speculative import snap
from dynshape_perception.perception.prediction.stage import (
    IdleSpeculation,
    PredictionStage,
    StageOutput,
    _Samples,
    speculation_summary,
)
from dynshape_perception.perception.records import TRACK_DTYPE
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.tools.sim.scenes import pedestrian_scene

RTOL, ATOL = 1e-4, 1e-5
FRAME_S = 0.1
JITTER_S = 0.004


def table(ids: np.ndarray, xy: np.ndarray) -> np.ndarray:
    rows = np.zeros(ids.size, dtype=TRACK_DTYPE)
    rows["id"], rows["x"], rows["y"] = ids, xy[:, 0], xy[:, 1]
    return rows


def drive(
    seed: int, agents: int, frames: int, lifetime: int | None = 150
) -> Iterator[tuple[float, np.ndarray]]:
    """Track tables at 10 Hz with jittered stamps; with a ``lifetime`` (frames), tracks
    restart under a new id that often, and miss single frames (forgotten, then afresh)."""
    paths = pedestrian_scene(seed=seed, num_agents=agents, num_steps=frames, dt_s=FRAME_S)
    rng = np.random.default_rng(seed)
    base_ids = np.arange(1, agents + 1)
    for frame in range(frames):
        stamp = 100.0 + frame * FRAME_S + float(rng.uniform(-JITTER_S, JITTER_S))
        seen = np.ones(agents, bool)
        ids = base_ids.copy()
        if lifetime is not None:
            ids = base_ids + 1000 * ((frame + 7 * base_ids) // lifetime)
            seen &= (base_ids % 4 != 0) | (rng.random(agents) > 0.03)
        yield stamp, table(ids[seen], paths[seen, frame])


def assert_same(got: StageOutput, want: StageOutput, exact: bool = False) -> None:
    np.testing.assert_array_equal(got.ids, want.ids)
    assert got.reference_s == want.reference_s
    if exact:
        np.testing.assert_array_equal(got.traj, want.traj)
        np.testing.assert_array_equal(got.probs, want.probs)
    else:
        np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("history_steps", "stride"), [(8, 0), (8, 1), (8, 7), (32, 0), (128, 0), (128, 3)]
)
def test_incremental_equals_full_recompute(engine: Engine, history_steps: int, stride: int) -> None:
    settings = PredictionSettings(history_steps=history_steps, history_stride=stride, max_agents=64)
    incremental = PredictionStage(engine["predictor"], settings)
    full = PredictionStage(engine["predictor"], replace(settings, mode="full"))
    # Long enough for the first tracks to pass the window and restart their histories.
    lifetime = 4 * history_steps + 30
    frames = lifetime + 60
    predicted = 0
    ego = Pose2D(1.0, -2.0, 0.3)
    for stamp, tracks in drive(history_steps, 16, frames, lifetime):
        got = incremental.predict(tracks, stamp, ego)
        assert_same(got, full.predict(tracks, stamp, ego))
        predicted += got.ids.size
    d = incremental.diagnostics()
    assert predicted > 8 * frames
    assert int(d["stepped"]) > 0 and int(d["encoded"]) > 16 and int(d["evicted"]) > 0
    # Histories past the window restart and are encoded afresh; none takes forward.
    assert int(d["slid"]) > 0 and d["forwarded"] == 0 and d["forward_calls"] == 0
    assert full.diagnostics()["step_decode_calls"] == 0


def test_steady_frames_cost_one_call_whatever_the_history_length(engine: Engine) -> None:
    """Below the window, a frame of continuing tracks is one step_decode, at any length."""
    stage = PredictionStage(engine["predictor"], PredictionSettings(history_steps=128))
    calls_per_frame = []
    for k, (stamp, tracks) in enumerate(drive(5, 12, 4 * 100, lifetime=None)):
        before = stage.diagnostics()
        stage.predict(tracks, stamp)
        after = stage.diagnostics()
        if k >= 4 * 3:
            calls = sum(
                int(after[key]) - int(before[key])
                for key in ("step_decode_calls", "encode_calls", "decode_calls")
            )
            calls_per_frame.append(calls)
    assert calls_per_frame == [1] * len(calls_per_frame)
    d = stage.diagnostics()
    assert d["slid"] == 0 and d["encoded"] == 12 * 4


def test_history_lengths_restart_by_the_stride_past_the_window() -> None:
    settings = PredictionSettings(history_steps=8, history_stride=3)
    lengths = [settings.history_length(steps) for steps in range(1, 19)]
    assert lengths == [*range(1, 9), 6, 7, 8, 6, 7, 8, 6, 7, 8, 6]
    assert PredictionSettings(history_steps=8).stride == 4
    assert PredictionSettings(history_steps=128).stride == 64
    # Half the window would restart below the minimum: the stride keeps to it.
    assert PredictionSettings(history_steps=4, min_history_steps=4).stride == 1
    assert max(settings.history_length(n) for n in range(1, 1000)) == 8


def test_past_the_window_a_frame_steps_and_a_chain_restarts_once_per_stride(
    engine: Engine,
) -> None:
    """Past the window a frame is one step_decode, but on the frames where a grid point's
    histories restart (once every ``stride`` of its frames): one encode and one decode."""
    settings = PredictionSettings(history_steps=8, history_stride=4)
    stage = PredictionStage(engine["predictor"], settings)
    keys = ("step_decode_calls", "encode_calls", "decode_calls", "forward_calls", "slid")
    # Frame k's histories hold (k - 1) // phases + 1 steps: frame 33 is the first past 8.
    timed = range(4 * 8 + 1, 4 * 8 + 1 + 4 * 4 * 3)
    restarts = 0
    for k, (stamp, tracks) in enumerate(drive(8, 10, timed.stop, lifetime=None)):
        before = stage.diagnostics()
        stage.predict(tracks, stamp)
        after = stage.diagnostics()
        if k in timed:
            calls = [int(after[key]) - int(before[key]) for key in keys]
            assert calls in ([1, 0, 0, 0, 0], [0, 1, 1, 0, 10]), (k, calls)
            restarts += calls[-1] == 10
    assert restarts == len(timed) // settings.stride


class HypothesisWorld:
    """Agents that follow the first predicted step of their likeliest hypothesis (give or
    take a centimetre) on most frames, so that speculation verifies; on every fifth they
    walk on instead, and one leaves half way."""

    def __init__(self, seed: int, agents: int = 10) -> None:
        self.rng = np.random.default_rng(seed)
        self.pos = self.rng.uniform(-10.0, 10.0, (agents, 2))
        self.velocity = self.rng.uniform(-1.0, 1.0, (agents, 2))
        self.ids = np.arange(1, agents + 1)
        self.stamp = 50.0

    def next(
        self, frame: int, source: StageOutput | None, step_s: float
    ) -> tuple[float, np.ndarray]:
        """The next table; ``source`` predicted its grid point, one ``step_s`` ahead."""
        previous, self.stamp = self.stamp, self.stamp + FRAME_S
        step = self.velocity * FRAME_S
        if source is not None and source.reference_s is not None and frame % 5:
            target_s = source.reference_s + step_s
            lookup = {int(i): k for k, i in enumerate(source.ids.tolist())}
            # The stage samples the path at target_s, between the last frame and this one.
            share = (self.stamp - previous) / (target_s - previous)
            for a, track_id in enumerate(self.ids.tolist()):
                k = lookup.get(track_id)
                if k is not None:
                    best = int(np.argmax(source.probs[k]))
                    goal = source.traj[k, best, 0] + self.rng.integers(-1, 2, 2) * 0.01
                    step[a] = (goal - self.pos[a]) * share
        self.pos = self.pos + step
        keep = self.ids != 4 if frame > 80 else np.ones(self.ids.size, bool)
        return self.stamp, table(self.ids[keep], self.pos[keep].astype(np.float32))


@pytest.mark.parametrize("history_steps", [8, 128])
def test_speculation_never_changes_an_output(engine: Engine, history_steps: int) -> None:
    """At 8 steps the histories pass the window and restart; at 128 they stay below it."""
    settings = PredictionSettings(history_steps=history_steps, speculation=True)
    spec = PredictionStage(engine["predictor"], settings)
    plain = PredictionStage(engine["predictor"], replace(settings, speculation=False))
    full = PredictionStage(engine["predictor"], replace(settings, mode="full"))
    world = HypothesisWorld(seed=3)
    phases = settings.phases
    outputs: list[StageOutput] = []
    for k in range(160):
        # Frame k lands on the grid point whose chain last predicted at frame k - phases.
        source = outputs[k - phases] if k >= phases else None
        stamp, tracks = world.next(k, source, settings.step_s)
        got = spec.predict(tracks, stamp)
        # The generic kernels compute every row alike at any batch size: a promoted
        # speculation is the very output the step would have given.
        assert_same(got, plain.predict(tracks, stamp), exact=True)
        assert_same(got, full.predict(tracks, stamp))
        outputs.append(got)
        if k % 9 != 4:
            spec.speculate()
    d = spec.diagnostics()
    assert int(d["speculation.promoted_frames"]) > 5
    assert 0.0 < float(d["speculation.acceptance_rate"]) < 1.0
    assert int(d["step_decode_calls"]) < int(plain.diagnostics()["step_decode_calls"])
    assert plain.speculate() == 0 and plain.diagnostics()["speculation.candidates"] == 0
    # Both kinds of frame were timed: the saving is measured, whatever its sign.
    assert d["speculation.saved_measured"] is True
    assert speculation_summary(d).startswith(
        f"acceptance {d['speculation.accepted']}/{d['speculation.verified']}"
    )
    assert speculation_summary(plain.diagnostics()) == "speculation off"
    assert (int(d["slid"]) > 0) == (history_steps < 160 // settings.phases)


def test_speculation_reports_no_saving_before_any_promotion(engine: Engine) -> None:
    stage = PredictionStage(engine["predictor"], PredictionSettings(speculation=True))
    d = stage.diagnostics()
    assert d["speculation.saved_measured"] is False and d["speculation.saved_ms_total"] == 0.0
    assert speculation_summary(d) == "speculation on: no observation verified yet, no latency saved"
    for stamp, tracks in drive(2, 3, 8, lifetime=None):
        stage.predict(tracks, stamp)
    # Speculation never ran: nothing verified, nothing saved, and the summary says so.
    assert stage.diagnostics()["speculation.saved_ms_total"] == 0.0
    assert "no latency saved" in speculation_summary(stage.diagnostics())
    full = stage.diagnostics() | {"mode": "full"}
    assert speculation_summary(full) == "speculation idle: it runs in incremental mode only"


def test_a_time_jump_backwards_resets(engine: Engine) -> None:
    stage = PredictionStage(engine["predictor"])
    frames = list(drive(2, 6, 60, lifetime=None))
    for stamp, tracks in frames:
        stage.predict(tracks, stamp)
    assert stage.predict(frames[-1][1], frames[-1][0]).ids.size == 6
    before = stage.diagnostics()
    # The log restarts: no track has the history it needs on the first frames after.
    assert stage.predict(frames[0][1], frames[0][0]).ids.size == 0
    after = stage.diagnostics()
    assert int(after["resets"]) == int(before["resets"]) + 1
    fresh = PredictionStage(engine["predictor"])
    fresh.predict(frames[0][1], frames[0][0])
    for stamp, tracks in frames[1:30]:
        assert_same(stage.predict(tracks, stamp), fresh.predict(tracks, stamp), exact=True)


def test_a_frame_on_the_same_grid_point_repeats_the_output(engine: Engine) -> None:
    stage = PredictionStage(engine["predictor"])
    frames = list(drive(1, 5, 30, lifetime=None))
    for stamp, tracks in frames:
        out = stage.predict(tracks, stamp)
    stamp, tracks = frames[-1]
    again = stage.predict(tracks[1:], stamp + 0.01)
    assert not again.computed and again.reference_s == out.reference_s
    np.testing.assert_array_equal(again.ids, out.ids[out.ids != tracks["id"][0]])
    assert stage.diagnostics()["frames_reused"] == 1


def test_agents_beyond_the_bound_are_the_farthest_and_counted(engine: Engine) -> None:
    stage = PredictionStage(engine["predictor"], PredictionSettings(max_agents=3))
    for stamp, tracks in drive(4, 8, 20, lifetime=None):
        out = stage.predict(tracks, stamp)
    dist = np.hypot(tracks["x"], tracks["y"])
    nearest = tracks["id"][np.argsort(dist, kind="stable")[:3]]
    np.testing.assert_array_equal(out.ids, nearest)
    assert int(stage.diagnostics()["agents_dropped"]) > 0


def test_evicted_tracks_start_afresh_and_leave_the_others_alone(engine: Engine) -> None:
    settings = PredictionSettings(history_steps=32)
    stage = PredictionStage(engine["predictor"], settings)
    reference = PredictionStage(engine["predictor"], settings)
    frames = list(drive(6, 6, 40, lifetime=None))
    for stamp, tracks in frames[:30]:
        stage.predict(tracks, stamp)
        reference.predict(tracks, stamp)
    before = int(stage.diagnostics()["evicted"])
    assert stage.evict([1, 2, 99]) == 2
    # Every chain held both tracks.
    assert int(stage.diagnostics()["evicted"]) == before + 2 * stage.settings.phases
    # Until their new histories span a predictor step, they are not predicted.
    for stamp, tracks in frames[30:35]:
        got, want = stage.predict(tracks, stamp), reference.predict(tracks, stamp)
        keep = ~np.isin(want.ids, [1, 2])
        same = StageOutput(
            want.ids[keep], want.traj[keep], want.probs[keep], want.reference_s, True
        )
        assert_same(got, same, exact=True)
    for stamp, tracks in frames[35:]:
        got = stage.predict(tracks, stamp)
    assert {1, 2} <= set(got.ids.tolist())


def test_bad_tables_are_refused_and_leave_the_state_alone(engine: Engine) -> None:
    stage = PredictionStage(engine["predictor"])
    frames = list(drive(7, 4, 20, lifetime=None))
    for stamp, tracks in frames[:-1]:
        stage.predict(tracks, stamp)
    stamp, tracks = frames[-1]
    bad = tracks.copy()
    bad["x"][1] = np.nan
    with pytest.raises(InputValueError, match="NaN"):
        stage.predict(bad, stamp)
    twice = np.concatenate([tracks, tracks[:1]])
    with pytest.raises(InputValueError, match="repeat"):
        stage.predict(twice, stamp)
    with pytest.raises(InputValueError, match="finite"):
        stage.predict(tracks, float("inf"))
    with pytest.raises(ShapeError, match="id, x and y"):
        stage.predict(np.zeros((3, 2), np.float32), stamp)
    reference = PredictionStage(engine["predictor"])
    for s, t in frames:
        want = reference.predict(t, s)
    assert_same(stage.predict(tracks, stamp), want, exact=True)


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="mode"):
        PredictionSettings(mode="fast")
    with pytest.raises(ConfigError, match="phases"):
        PredictionSettings(phases=0)
    with pytest.raises(ConfigError, match="exceeds history_steps"):
        PredictionSettings(history_steps=4, min_history_steps=5)
    with pytest.raises(ConfigError, match="quantum_m"):
        PredictionSettings(quantum_m=0.0)
    with pytest.raises(ConfigError, match="step_s"):
        PredictionSettings(step_s=float("nan"))
    with pytest.raises(ConfigError, match="history_stride"):
        PredictionSettings(history_stride=-1)
    with pytest.raises(ConfigError, match="below min_history_steps"):
        PredictionSettings(history_steps=8, min_history_steps=3, history_stride=7)
    assert PredictionSettings(history_steps=8, min_history_steps=3, history_stride=6).stride == 6


def test_idle_speculation_on_its_own_thread_changes_no_output(engine: Engine) -> None:
    settings = PredictionSettings(history_steps=128, speculation=True)
    spec = PredictionStage(engine["predictor"], settings)
    plain = PredictionStage(engine["predictor"], replace(settings, speculation=False))
    idle = IdleSpeculation(spec)
    world = HypothesisWorld(seed=5)
    outputs: list[StageOutput] = []
    try:
        for k in range(60):
            source = outputs[k - settings.phases] if k >= settings.phases else None
            stamp, tracks = world.next(k, source, settings.step_s)
            got = spec.predict(tracks, stamp)
            assert_same(got, plain.predict(tracks, stamp), exact=True)
            outputs.append(got)
            idle.frame_done()
            # Waiting makes the speculation complete before the next frame, every frame.
            assert idle.wait_idle(30.0)
    finally:
        idle.close()
    d = spec.diagnostics()
    assert idle.runs == 60 and idle.abandoned == 0
    assert int(d["speculation.candidates"]) > 0 and int(d["speculation.promoted_frames"]) > 0


def one_by_one(stage: PredictionStage, track_id: int, tick: int, length: int) -> np.ndarray:
    """A track's snapped positions at ``length`` grid times one predictor step apart, ending
    at ``tick``'s."""
    s = stage.settings
    times = stage._grid_time(tick - s.phases * np.arange(length - 1, -1, -1))
    return snap(stage._log[track_id].at(times), s.quantum_m)[1]


def test_a_frames_histories_are_built_together_exactly_as_one_by_one() -> None:
    """A frame's histories are built in one batch: the same snapped samples as each track's
    built on its own, whatever the tracks' ages."""
    settings = PredictionSettings(history_steps=8)
    stage = PredictionStage(lambda *_: [], replace(settings, mode="full"))
    tables = list(drive(seed=9, agents=12, frames=60))
    for stamp, rows in tables:
        stage._record(rows["id"].tolist(), rows["x"].tolist(), rows["y"].tolist(), stamp)
    tick = stage._tick_of(tables[-1][0])
    ids = [i for i in stage._log if stage._log[i].first_s <= float(stage._grid_time(tick))]
    lengths = {i: 1 + n % settings.history_steps for n, i in enumerate(ids)}
    flat, got_lengths = stage._histories(ids, tick, lengths)
    assert got_lengths.tolist() == [lengths[i] for i in ids]
    want = np.concatenate([one_by_one(stage, i, tick, lengths[i]) for i in ids])
    np.testing.assert_array_equal(flat, want)
    assert len(ids) > 6 and flat.dtype == np.float32


# Positions whose differences overflow, and infinite ones: np.interp's other branches.
POSITIONS = st.one_of(st.floats(-1e3, 1e3), st.sampled_from([1e308, -1e308, np.inf, -np.inf]))


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.137]), min_size=1, max_size=40),
    positions=st.lists(st.tuples(POSITIONS, POSITIONS), min_size=1, max_size=40),
    trim_at=st.integers(0, 40),
    between=st.floats(0.0, 1.0),
    where=st.sampled_from(["sample", "between", "before", "after", "nan"]),
)
# inf to inf: the slope is NaN, and the value the two ends share.
@example([0.1, 0.1], [(np.inf, 1.0), (np.inf, -np.inf)], 0, 0.5, "between")
# inf to -inf: NaN from either end.
@example([0.1, 0.1], [(np.inf, 1e308), (-np.inf, -1e308)], 0, 0.5, "between")
def test_one_time_of_every_agent_is_the_interpolation_of_many(
    gaps: list[float],
    positions: list[tuple[float, float]],
    trim_at: int,
    between: float,
    where: str,
) -> None:
    """A frame's position of each agent, in Python floats, is np.interp's value at that
    one time: at a sample, between two, outside them, and where np.interp meets inf."""
    samples = _Samples()
    stamps = (100.0 + np.cumsum(gaps))[: len(positions)]
    for stamp, (x, y) in zip(stamps.tolist(), positions[: stamps.size], strict=True):
        samples.append(stamp, x, y)
    samples.trim(float(stamps[min(trim_at, stamps.size - 1)]) - 0.01)
    live = samples.buf[samples.start : samples.end, 0]
    k = int(between * (live.size - 1))
    time_s = {
        "sample": float(live[k]),
        "between": float(live[k] + between * (live[min(k + 1, live.size - 1)] - live[k])),
        "before": float(live[0]) - 0.5,
        "after": float(live[-1]) + 0.5,
        "nan": float("nan"),
    }[where]
    with np.errstate(all="ignore"):
        want = samples.at(np.array([time_s]))[0]
        got = np.array(samples.at_one(time_s), np.float32)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=200, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.05, 0.1, 0.3]), min_size=1, max_size=60),
    # A cutoff anywhere, or on a sample's stamp (by its index).
    cutoffs=st.lists(st.one_of(st.floats(99.0, 110.0), st.integers(0, 59)), min_size=1, max_size=8),
)
def test_trimming_keeps_the_newest_sample_at_or_before_the_cutoff(
    gaps: list[float], cutoffs: list[float | int]
) -> None:
    samples = _Samples()
    stamps = 100.0 + np.cumsum(gaps)
    for stamp in stamps.tolist():
        samples.append(stamp, 0.0, 0.0)
    for at in cutoffs:
        cutoff = float(stamps[at % stamps.size]) if isinstance(at, int) else at
        live = samples.buf[samples.start : samples.end, 0]
        want = samples.start + max(int(np.searchsorted(live, cutoff, side="right")) - 1, 0)
        samples.trim(cutoff)
        assert samples.start == want and samples.end == stamps.size
