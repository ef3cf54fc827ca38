"""prediction_node over DDS: incremental and full predict alike; speculation changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from dynshape_perception.io.objects import predictions_from_predicted_objects
from dynshape_perception.perception.records import LABEL_PEDESTRIAN, TRACK_DTYPE
from dynshape_perception.testing.prediction_session import (
    PredictionSession,
    prediction_session,
)
from dynshape_perception.tools.sim.scenes import pedestrian_scene

pytestmark = pytest.mark.ros

RTOL, ATOL = 1e-4, 1e-5
FRAMES = 90
AGENTS = 10
FIRST_NS = 20_000_000_000
STEP_NS = 100_000_000
TIMEOUT_S = 20.0
PRIME_ATTEMPTS = 5
VARIANTS: dict[str, dict[str, bool | int | float | str]] = {
    "full": {"prediction.mode": "full"},
    "incremental": {"prediction.mode": "incremental"},
    "speculative": {"prediction.mode": "incremental", "prediction.speculation": True},
}
# Short enough that the histories pass the window and restart within the frames.
HISTORY_STEPS = 16


@pytest.fixture(scope="module")
def session(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[PredictionSession]:
    overrides = {
        **node_overrides,
        "prediction.history_steps": HISTORY_STEPS,
        # Generic kernels compute a row alike in any batch: exact comparisons.
        "jit.mode": "off",
    }
    logs = tmp_path_factory.mktemp("prediction_modes_logs")
    with prediction_session(VARIANTS, overrides, logs) as running:
        running.prime(FIRST_NS - PRIME_ATTEMPTS * STEP_NS, STEP_NS, PRIME_ATTEMPTS, TIMEOUT_S)
        yield running


def _tables(frames: int) -> Iterator[tuple[int, np.ndarray]]:
    paths = pedestrian_scene(seed=7, num_agents=AGENTS, num_steps=frames, dt_s=STEP_NS * 1e-9)
    for k in range(frames):
        # Agent 3 leaves half way; the others stay.
        keep = np.arange(AGENTS) != 3 if k > frames // 2 else np.ones(AGENTS, bool)
        rows = np.zeros(int(keep.sum()), TRACK_DTYPE)
        rows["id"] = np.arange(1, AGENTS + 1)[keep]
        rows["x"], rows["y"] = paths[keep, k, 0], paths[keep, k, 1]
        rows["length"] = rows["width"] = 0.6
        rows["height"] = 1.7
        rows["score"] = 0.9
        rows["label"] = LABEL_PEDESTRIAN
        yield FIRST_NS + k * STEP_NS, rows


def _paths(msg: Any) -> dict[bytes, tuple[np.ndarray, np.ndarray]]:
    return {
        p.uuid: (np.asarray(p.confidences), np.stack([q[:, :2] for q in p.paths]))
        for p in predictions_from_predicted_objects(msg)
        if p.paths
    }


def test_every_mode_predicts_alike_through_the_node(session: PredictionSession) -> None:
    predicted_agents = 0
    for stamp, rows in _tables(FRAMES):
        for name in VARIANTS:
            session.publish(name, stamp, rows)

        def from_every_variant(stamp: int = stamp) -> bool:
            return all(stamp in session.received[n] for n in VARIANTS)

        got = session.spin_until(from_every_variant, TIMEOUT_S)
        assert got, f"no predictions of stamp {stamp} from every variant"
        full = _paths(session.received["full"][stamp])
        incremental = _paths(session.received["incremental"][stamp])
        assert incremental.keys() == full.keys()
        for key, (probs, paths) in incremental.items():
            np.testing.assert_allclose(paths, full[key][1], rtol=RTOL, atol=ATOL)
            np.testing.assert_allclose(probs, full[key][0], rtol=RTOL, atol=ATOL)
        speculative = _paths(session.received["speculative"][stamp])
        assert speculative.keys() == incremental.keys()
        for key, (probs, paths) in speculative.items():
            np.testing.assert_array_equal(paths, incremental[key][1])
            np.testing.assert_array_equal(probs, incremental[key][0])
        predicted_agents += len(full)
    assert predicted_agents > AGENTS * FRAMES // 2

    def reported() -> bool:
        tasks = [session.task(name) for name in VARIANTS]
        return all(t is not None and int(t["prediction.frames"]) >= FRAMES for t in tasks)

    assert session.spin_until(reported, TIMEOUT_S)
    full_task, incremental_task, speculative_task = (session.task(n) or {} for n in VARIANTS)
    assert full_task["prediction.mode"] == "full"
    assert int(full_task["prediction.forward_calls"]) > 0
    assert int(incremental_task["prediction.step_decode_calls"]) > 0
    assert int(incremental_task["prediction.slid"]) > 0
    assert int(incremental_task["prediction.forwarded"]) == 0
    assert int(speculative_task["prediction.speculation.candidates"]) > 0
    assert "prediction.speculation.saved_ms_total" in speculative_task
    assert "prediction.speculation.saved_measured" in speculative_task
    assert session.message("full") == session.message("incremental") == "speculation off"
    # Whether anything was promoted yet depends on the idle thread's timing; every message
    # of speculation on says what it saved or that it saved nothing.
    assert "saved" in (session.message("speculative") or "")
