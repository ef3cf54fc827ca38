"""Speculative prediction: output equals non-speculative prediction; verify, promote, prune."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.io.datasets import read_eth_ucy
from dynshape_perception.perception.prediction.incremental import (
    HistoryFn,
    IncrementalPredictor,
    Prediction,
    agent_ticks,
)
from dynshape_perception.perception.prediction.speculative import (
    SpeculationConfig,
    SpeculativePredictor,
    snap,
)
from dynshape_perception.runtime.engine import Engine

RTOL, ATOL = 1e-4, 1e-5
QUANTUM_M = 0.01


def assert_same(got: Prediction, want: Prediction) -> None:
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_allclose(got.traj, want.traj, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got.probs, want.probs, rtol=RTOL, atol=ATOL)


def test_snap_is_exact_on_its_own_grid() -> None:
    cells, pos = snap(np.array([[8.46, -3.594], [0.004, 0.006]]), QUANTUM_M)
    np.testing.assert_array_equal(cells, [[846, -359], [0, 1]])
    again_cells, again = snap(pos, QUANTUM_M)
    np.testing.assert_array_equal(again_cells, cells)
    np.testing.assert_array_equal(again, pos)


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="quantum_m must be > 0"):
        SpeculationConfig(quantum_m=0.0)
    with pytest.raises(ConfigError, match="top_hypotheses"):
        SpeculationConfig(top_hypotheses=0)
    assert SpeculationConfig(radius_cells=2).cells_per_hypothesis == 25


def test_output_equals_non_speculative_prediction_when_the_world_follows_hypotheses(
    engine: Engine,
) -> None:
    """Agents move onto their likeliest (or second) hypothesis give or take a few cells, or
    jump elsewhere (on some ticks); agents appear and leave; some ticks get no idle time to
    speculate. Ticks where every agent follows a hypothesis are promoted without a step."""
    rng = np.random.default_rng(1)
    config = SpeculationConfig(quantum_m=QUANTUM_M, radius_cells=3, top_hypotheses=2)
    spec = SpeculativePredictor(engine["predictor"], config)
    plain = IncrementalPredictor(engine["predictor"])
    agents = 12
    paths: dict[int, list[np.ndarray]] = {
        a: [snap(rng.uniform(-10, 10, 2), QUANTUM_M)[1]] for a in range(agents)
    }
    last: Prediction | None = None
    next_id = agents
    for tick in range(40):
        if tick:
            assert last is not None
            for k, agent in enumerate(last.ids.tolist()):
                order = np.argsort(-last.probs[k], kind="stable")
                behaviour = agent % 4
                if behaviour == 3 and tick % 3:
                    target = paths[agent][-1] + rng.normal(0.0, 0.5, 2)
                else:
                    target = last.traj[k, order[min(behaviour, 1)], 0]
                    target = target + rng.integers(-2, 3, 2) * QUANTUM_M
                paths[agent].append(snap(target, QUANTUM_M)[1])
            if tick % 10 == 5:
                gone = int(last.ids[0])
                del paths[gone]
                paths[next_id] = [snap(rng.uniform(-10, 10, 2), QUANTUM_M)[1]]
                next_id += 1
        ids = np.array(sorted(paths), dtype=np.int64)
        positions = np.stack([paths[int(a)][-1] for a in ids])

        def history_of(agent: int) -> np.ndarray:
            return np.stack(paths[agent])

        got = spec.observe(tick, ids, positions, history_of)
        want = plain.observe(tick, ids, positions, history_of)
        assert_same(got, want)
        last = got
        if tick % 7 != 3:
            assert spec.speculate() > 0
    stats = spec.stats
    assert stats.accepted > 100
    assert stats.verified - stats.accepted > 20
    assert stats.unspeculated > 0
    assert set(stats.promoted_rank) == {0, 1}
    # Frames whose continuing agents were all accepted cost no step: fewer steps than
    # observations of continuing agents. Partly accepted frames step every agent.
    assert stats.promoted_frames > 5 and stats.promoted > 50
    assert spec.encoder.counters.installed == stats.promoted < stats.accepted
    assert spec.encoder.counters.stepped < plain.encoder.counters.stepped


def test_a_speculation_overtaken_by_an_observation_is_discarded(engine: Engine) -> None:
    spec = SpeculativePredictor(engine["predictor"], SpeculationConfig(radius_cells=1))
    ids = np.arange(3)
    pos = snap(np.array([[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]), QUANTUM_M)[1]
    spec.observe(0, ids, pos, lambda a: pos[a : a + 1])
    chunks = spec.speculate_chunks()
    next(chunks)
    spec.observe(1, ids, pos + 0.5, lambda a: np.stack([pos[a], pos[a] + 0.5]))
    with pytest.raises(StopIteration) as stop:
        next(chunks)
    assert stop.value.value == 0
    spec.observe(2, ids, pos + 1.0, lambda a: np.stack([pos[a], pos[a] + 0.5, pos[a] + 1.0]))
    assert spec.stats.verified == 0 and spec.stats.unspeculated == 6


def test_output_equals_non_speculative_prediction_on_eth(engine: Engine, eth_file: Path) -> None:
    spec = SpeculativePredictor(engine["predictor"], SpeculationConfig(quantum_m=QUANTUM_M))
    plain = IncrementalPredictor(engine["predictor"])
    frames = 0
    for tick, ids, positions, history_of in agent_ticks(read_eth_ucy(eth_file).tracks()):
        snapped = snap(positions, QUANTUM_M)[1]
        # ETH is annotated on a 1 cm grid: snapping moves nothing by more than float error.
        np.testing.assert_allclose(snapped, positions, atol=1e-5)

        def snapped_history(agent: int, fn: HistoryFn = history_of) -> np.ndarray:
            return snap(fn(agent), QUANTUM_M)[1]

        assert_same(
            spec.observe(tick, ids, positions, history_of),
            plain.observe(tick, ids, snapped, snapped_history),
        )
        spec.speculate()
        frames += 1
        if frames == 150:
            break
    assert frames == 150 and spec.stats.verified > 100


def test_bad_observations_are_refused_before_snapping(engine: Engine) -> None:
    """A NaN would snap to a finite cell far away; float ids would be truncated."""
    spec = SpeculativePredictor(engine["predictor"])
    ids = np.array([1, 2])
    good = np.array([[1.0, 2.0], [0.0, 0.5]], np.float32)
    histories = {1: good[:1], 2: good[1:]}
    with pytest.raises(InputValueError, match="NaN or Inf"):
        spec.observe(
            0, ids, np.array([[1.0, 2.0], [np.nan, 0.5]], np.float32), histories.__getitem__
        )
    with pytest.raises(ShapeError, match="integer"):
        spec.observe(0, np.array([1.7, 2.9]), good, histories.__getitem__)
    bad_history = {1: good[:1], 2: np.array([[np.inf, 0.0], [0.0, 0.5]], np.float32)}
    with pytest.raises(InputValueError, match="history of track 2"):
        spec.observe(0, ids, good, bad_history.__getitem__)
    # Refused ticks leave no trace: the same tick is then accepted.
    assert spec.observe(0, ids, good, histories.__getitem__).ids.tolist() == [1, 2]
    assert spec.stats.frames == 1
