"""``bench kernels --smoke``: every peer runs the exported models at sizes other than the export's
and agrees with TVM."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="bench peers (requirements-bench.txt, make test)")
torch = pytest.importorskip("torch", reason="bench peers (requirements-bench.txt, make test)")

from dynshape_perception.tools.bench import kernels  # noqa: E402
from dynshape_perception.tools.fit import torch_models  # noqa: E402

MODELS = ("segmenter", "associator", "predictor")
PEERS = ("ort", "torch", "inductor", "numpy")
# Smoke runs compile three models with inductor on a shared CI machine.
SMOKE_TIMEOUT_S = 900


def test_smoke_run_checks_every_peer_against_tvm(tmp_path: Path, cache_root: Path) -> None:
    out = tmp_path / "kernels.json"
    argv = ["bench", "kernels", "--smoke", "--runs", "2", "--warmup", "0"]
    argv += ["--json", str(out), "--cache-dir", str(cache_root)]
    done = subprocess.run(
        [sys.executable, "-m", "dynshape_perception.cli.main", *argv],
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report) == {"smoke", "rows", "overhead_us", "inductor"}
    assert report["smoke"] is True
    assert [(r["model"], r["size"]) for r in report["rows"]] == [
        (m, s) for m in MODELS for s in kernels.SMOKE_SIZES[m]
    ]
    for row in report["rows"]:
        for backend in kernels.BACKENDS:
            assert row[f"{backend}_ms"] > 0.0, (row["model"], row["size"], backend)
        assert set(row["max_abs_diff"]) == set(PEERS)
        for peer, diff in row["max_abs_diff"].items():
            assert 0.0 <= diff <= kernels.RTOL + kernels.ATOL, (row["model"], peer, diff)
    assert report["overhead_us"] > 0.0
    assert report["inductor"]["compile_s"] > 0.0


def test_no_smoke_size_is_an_export_size() -> None:
    for model, sizes in kernels.SMOKE_SIZES.items():
        assert kernels.EXPORT_SIZES[model] not in sizes


def test_an_export_that_traced_a_dim_as_static_is_a_bench_error(tmp_path: Path) -> None:
    """The segmenter twin's NumPy square root, traced, is a constant of the example's P."""
    model, weights, _ = kernels.model_weights("segmenter")
    twin = torch_models.Segmenter(model.config).eval()
    torch_models.load_numpy(twin, weights)
    args = kernels.make_inputs("segmenter", kernels.EXPORT_SIZES["segmenter"], seed=0)
    path = tmp_path / "segmenter.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            twin,
            tuple(torch.from_numpy(a) for a in args),
            str(path),
            dynamo=False,
            input_names=["points", "ground"],
            output_names=["scores"],
            dynamic_axes={"points": {0: "P"}, "scores": {0: "P"}},
        )
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with pytest.raises(kernels.BenchError, match="kept a dynamic dim static"):
        kernels.check_export("segmenter", twin, session, ["points", "ground"])


def test_the_export_graph_computes_the_twin() -> None:
    from dynshape_perception.tools.bench.torch_graphs import traceable_segmenter

    model, weights, _ = kernels.model_weights("segmenter")
    twin = torch_models.Segmenter(model.config).eval()
    torch_models.load_numpy(twin, weights)
    inputs = [torch.from_numpy(a) for a in kernels.make_inputs("segmenter", {"P": 500}, seed=4)]
    with torch.inference_mode():
        want = twin(*inputs).numpy()
        got = traceable_segmenter(model.config, weights)(*inputs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
