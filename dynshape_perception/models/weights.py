"""Model weights in ``models/<name>.npz`` with a checksummed entry in ``models/manifest.yaml``.

Format: one ``.npz`` per model holding float32 arrays named as the ``nn.Module`` parameters
(``l1.weight`` stored [in, out]). The manifest records model, version, shapes, bounds, the
SHA-256 of the ``.npz``, the command that fits it, and the data's provenance and licence.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dynshape_perception.config import read_yaml
from dynshape_perception.errors import WeightsError
from dynshape_perception.fsutil import atomic_write
from dynshape_perception.resources import models_dir

MANIFEST = "manifest.yaml"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_manifest(directory: Path | None = None) -> dict[str, Any]:
    path = (directory or models_dir()) / MANIFEST
    if not path.is_file():
        return {"models": {}}
    raw = read_yaml(path, "weights manifest", WeightsError) or {}
    if not isinstance(raw, dict):
        raise WeightsError(f"{path} must hold a mapping")
    models = raw.setdefault("models", {})
    if models is None:
        models = raw["models"] = {}
    if not isinstance(models, dict):
        raise WeightsError(f"{path}: models must map names to entries")
    for name, entry in models.items():
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("file"), str)
            and isinstance(entry.get("sha256"), str)
        ):
            raise WeightsError(f"{path}: entry {name!r} needs file and sha256 strings")
    return dict(raw)


def load_weights(
    name: str, expected: Mapping[str, tuple[int, ...]], directory: Path | None = None
) -> dict[str, np.ndarray]:
    """Load and verify weights: checksum, names and shapes must match exactly."""
    directory = directory or models_dir()
    entry = read_manifest(directory)["models"].get(name)
    if entry is None:
        raise WeightsError(f"{directory / MANIFEST} has no entry for model {name!r}")
    path = directory / entry["file"]
    try:
        data = path.read_bytes()
    except OSError as err:
        raise WeightsError(f"cannot read weights {path}: {err}") from err
    if sha256_bytes(data) != entry["sha256"]:
        raise WeightsError(f"{path} fails its manifest checksum; refit or restore it")
    try:
        with np.load(io.BytesIO(data)) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise WeightsError(f"{path} is not a NumPy .npz of arrays: {err}") from err
    check_arrays(arrays, str(path))
    missing = set(expected) - set(arrays)
    extra = set(arrays) - set(expected)
    if missing or extra:
        raise WeightsError(f"{path}: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for key, shape in expected.items():
        if tuple(arrays[key].shape) != tuple(shape):
            raise WeightsError(f"{path}: {key} has shape {arrays[key].shape}, expected {shape}")
    return arrays


def check_arrays(weights: Mapping[str, Any], where: str) -> None:
    """float32 and finite, as fitted: a cast would hide a wrong file, and NaN spreads."""
    for key, value in weights.items():
        if not isinstance(value, np.ndarray) or value.dtype != np.float32:
            got = getattr(value, "dtype", type(value).__name__)
            raise WeightsError(f"{where}: {key} must be a float32 array, got {got}")
        if not np.isfinite(value).all():
            raise WeightsError(f"{where}: {key} holds NaN or Inf")


def weights_checksum(weights: Mapping[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(weights[key], dtype=np.float32).tobytes())
    return digest.hexdigest()


def save_weights(
    name: str,
    weights: Mapping[str, np.ndarray],
    entry: Mapping[str, Any],
    directory: Path | None = None,
) -> Path:
    """Write ``<name>.npz`` deterministically and update the manifest, both atomically."""
    directory = directory or models_dir()
    for key, value in weights.items():
        if not np.isfinite(value).all():
            raise WeightsError(f"{name}: {key} holds NaN or Inf (did the fit diverge?)")
    directory.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    # np.savez stamps zip entries with the current time; fixed order and ZIP_STORED keep
    # the bytes identical across refits so the checksum proves reproducibility.
    _write_npz_deterministic(buf, weights)
    data = buf.getvalue()
    path = directory / f"{name}.npz"
    atomic_write(path, data)
    manifest = read_manifest(directory)
    manifest["models"][name] = {
        **dict(entry),
        "file": path.name,
        "sha256": sha256_bytes(data),
        "shapes": {k: list(v.shape) for k, v in sorted(weights.items())},
    }
    atomic_write(directory / MANIFEST, yaml.safe_dump(manifest, sort_keys=True).encode())
    return path


def _write_npz_deterministic(buf: io.BytesIO, weights: Mapping[str, np.ndarray]) -> None:
    import zipfile

    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(weights):
            arr_buf = io.BytesIO()
            np.lib.format.write_array(
                arr_buf, np.ascontiguousarray(weights[key], dtype=np.float32), allow_pickle=False
            )
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            zf.writestr(info, arr_buf.getvalue())


def init_weights(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Deterministic Glorot-uniform weights and zero biases: the starting point of every fit."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for key in sorted(shapes):
        shape = tuple(shapes[key])
        if len(shape) == 1:
            out[key] = np.zeros(shape, np.float32)
            continue
        fan_in, fan_out = shape[0], shape[-1]
        limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
        out[key] = rng.uniform(-limit, limit, size=shape).astype(np.float32)
    return out
