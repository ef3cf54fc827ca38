"""Weights files and manifests: every malformed one is a WeightsError naming what is wrong."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import yaml

from dynshape_perception.errors import DynshapeError, WeightsError
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import (
    MANIFEST,
    init_weights,
    load_weights,
    read_manifest,
    save_weights,
    sha256_bytes,
)
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig

SHAPES = parameter_shapes(model_definition("associator"))


def saved(tmp_path: Path) -> Path:
    save_weights("associator", init_weights(SHAPES, seed=1), {"version": "test"}, tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("manifest", "match"),
    [
        ("- a\n- list\n", "must hold a mapping"),
        ("models: [1]\n", "models must map"),
        ("models:\n  associator: {sha256: abc}\n", "needs file and sha256"),
        ("models:\n  associator: {file: associator.npz}\n", "needs file and sha256"),
    ],
)
def test_a_malformed_manifest_is_a_weights_error(tmp_path: Path, manifest: str, match: str) -> None:
    (tmp_path / MANIFEST).write_text(manifest)
    with pytest.raises(WeightsError, match=match):
        load_weights("associator", SHAPES, tmp_path)


def test_an_empty_models_section_has_no_entry(tmp_path: Path) -> None:
    (tmp_path / MANIFEST).write_text("models:\n")
    assert read_manifest(tmp_path)["models"] == {}
    with pytest.raises(WeightsError, match="no entry for model 'associator'"):
        load_weights("associator", SHAPES, tmp_path)


def rewrite(folder: Path, data: bytes) -> None:
    """Replace the .npz and fix up its checksum: the file is what it claims to be."""
    (folder / "associator.npz").write_bytes(data)
    manifest = yaml.safe_load((folder / MANIFEST).read_text())
    manifest["models"]["associator"]["sha256"] = sha256_bytes(data)
    (folder / MANIFEST).write_text(yaml.safe_dump(manifest))


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    # Numbers only, as the package writes them and np.load reads them: no pickles.
    np.savez(buf, allow_pickle=False, **arrays)
    return buf.getvalue()


def test_float64_or_nan_weights_are_refused_not_cast(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    weights = init_weights(SHAPES, seed=1)
    rewrite(folder, npz_bytes({k: v.astype(np.float64) for k, v in weights.items()}))
    with pytest.raises(WeightsError, match="must be a float32 array, got float64"):
        load_weights("associator", SHAPES, folder)
    weights["l1.weight"][0, 0] = np.nan
    rewrite(folder, npz_bytes(weights))
    with pytest.raises(WeightsError, match=r"l1\.weight holds NaN or Inf"):
        load_weights("associator", SHAPES, folder)


def test_a_file_that_is_no_npz_is_a_weights_error(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    rewrite(folder, b"not a zip file at all")
    with pytest.raises(WeightsError, match=r"not a NumPy \.npz"):
        load_weights("associator", SHAPES, folder)


def test_a_diverged_fit_is_not_saved(tmp_path: Path) -> None:
    weights = init_weights(SHAPES, seed=1)
    weights["l2.bias"][0] = np.inf
    with pytest.raises(WeightsError, match="did the fit diverge"):
        save_weights("associator", weights, {"version": "test"}, tmp_path)
    assert not (tmp_path / "associator.npz").exists()


def test_engine_weights_must_be_float32_arrays(tmp_path: Path) -> None:
    weights = init_weights(SHAPES, seed=1)
    for bad in (
        {k: v.astype(np.float64) for k, v in weights.items()},
        {k: v.tolist() for k, v in weights.items()},
    ):
        with pytest.raises(DynshapeError, match="must be a float32 array"):
            Engine(
                "x86_64",
                JitConfig(mode="off"),
                cache_dir=tmp_path,
                models=("associator",),
                weights={"associator": bad},  # type: ignore[dict-item]
            )
