"""Frozen-JIT replays and their HTML report, rendered in headless Chromium."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from dynshape_perception.cli.main import main
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import committed_weights, parameter_shapes
from dynshape_perception.models.weights import init_weights, save_weights
from dynshape_perception.tools.replay import sources
from dynshape_perception.tools.sim.drive import DriveConfig

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
PLOTS = 5
WINDOW = (1100, 3600)


@pytest.fixture(scope="module")
def frozen_runs(tmp_path_factory: pytest.TempPathFactory, cache_root: Path) -> list[Path]:
    """A JIT-off run that records the shape log, then two runs frozen on one hot shape."""
    root = tmp_path_factory.mktemp("report")
    weights = root / "weights"
    for name in MODEL_NAMES:
        init = init_weights(parameter_shapes(model_definition(name)), seed=0)
        save_weights(name, init, {"version": "test-init"}, weights)
    # A segmenter with random weights may score no point an obstacle, and then the associator,
    # whose hot shape the frozen runs compile, is never called.
    save_weights("segmenter", committed_weights("segmenter")[1], {"version": "test"}, weights)
    bag = root / "drive"
    sources.write_generated(
        bag, "mcap", DriveConfig(seed=5, frames=6, segment_frames=3, points_range=(5_000, 8_000))
    )
    common = ["--weights-dir", str(weights), "--cache-dir", str(cache_root), "--no-progress"]
    profile = root / "profile.yaml"
    assert main(["replay", str(bag), "--record-shapes", str(profile), *common]) == 0
    doc = yaml.safe_load(profile.read_text())
    one = {"version": doc["version"], "models": {"associator": doc["models"]["associator"][:1]}}
    (root / "one.yaml").write_text(yaml.safe_dump(one))
    config = root / "jit.yaml"
    config.write_text(
        "/**:\n  ros__parameters:\n    jit:\n      compile_mode: thread\n"
        "      hotness_threshold: 1\n"
    )
    runs = [root / "frozen_a", root / "frozen_b"]
    for run in runs:
        args = ["replay", str(bag), "--jit", "frozen", "--jit-shapes", str(root / "one.yaml")]
        assert main([*args, "--config", str(config), "--record", str(run), *common]) == 0
    return runs


def test_frozen_replays_are_identical_and_use_their_specialisation(
    frozen_runs: list[Path],
) -> None:
    first, second = (
        {f.name: f.read_bytes() for f in (run / "output").iterdir()} for run in frozen_runs
    )
    assert first == second
    doc = json.loads((frozen_runs[0] / "metrics.json").read_text())
    assert doc["run"]["jit"] == "frozen" and doc["run"]["deterministic"] is True
    events = doc["compile_events"]
    assert len(events) == 1 and events[0]["ok"] and events[0]["model"] == "associator"
    assert events[0]["frame"] == -1, "compiled while warming up, before the first frame"
    assert sum(f["jit_hits"] for f in doc["frames"]) >= 1
    assert doc["summary"]["hit_rate"] > 0.0


def _png_images(page: str) -> list[Image.Image]:
    blobs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(b))) for b in blobs]


def _browser() -> str | None:
    return next((path for name in CHROMIUM if (path := shutil.which(name))), None)


def test_report_is_self_contained_and_renders(
    frozen_runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = frozen_runs[0]
    assert main(["report", str(run)]) == 0
    page_path = run / "report.html"
    assert f"report written to {page_path}" in capsys.readouterr().out
    page = page_path.read_text()
    assert "http://" not in page and "https://" not in page and "<script" not in page
    for title in ("Latency per stage", "Deadline misses and drops", "Compile events"):
        assert title in page
    assert "Cache hit rate over time" in page and "Counts per frame" in page
    images = _png_images(page)
    assert len(images) == PLOTS
    for image in images:
        assert image.format == "PNG" and image.width >= 600 and image.height >= 200
        rgb = np.asarray(image.convert("RGB")).reshape(-1, 3)
        assert len(np.unique(rgb, axis=0)) > 50, "a plot, not a blank image"

    browser = _browser()
    if browser is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is required under CI=true (make system-deps installs it)")
        pytest.skip("chromium is not installed: cannot render the report")
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={WINDOW[0]},{WINDOW[1]}",
            f"--screenshot={shot}",
            page_path.resolve().as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    rendered = Image.open(shot)
    assert rendered.format == "PNG" and rendered.size == WINDOW
    pixels = np.asarray(rendered.convert("RGB"), dtype=np.int16)
    assert len(np.unique(pixels.reshape(-1, 3), axis=0)) > 200
    # Matplotlib's first colour (the stage lines) and the deadline red show on the page.
    for colour in ((31, 119, 180), (214, 39, 40)):
        near = np.abs(pixels - np.array(colour)).sum(axis=2) < 40
        assert near.sum() > 200, f"colour {colour} missing from the rendered page"
    painted = (pixels.sum(axis=2) < 600).any(axis=1)
    assert painted[WINDOW[1] // 2 :].sum() > 500, "the lower half of the page shows plots too"
