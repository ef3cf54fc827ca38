"""Content-addressed, atomic on-disk artefact cache of exported model libraries."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.core.compiler import tvm_adapter as tvmx
from dynshape_perception.core.compiler.build import (
    BuildResult,
    bound_module,
    compile_model,
    pipeline_version,
)
from dynshape_perception.core.compiler.targets import TargetProfile
from dynshape_perception.errors import CacheError
from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.weights import weights_checksum

log = logging.getLogger(__name__)

LIBRARY = "model.so"
SIDECAR = "sidecar.json"
# An entry is written whole into a staging folder, then renamed into place.
STAGE_PREFIX = ".stage-"
# A staging folder this old was left by a writer that died mid-write: no build takes an hour.
STALE_STAGE_S = 3600.0


def default_cache_dir() -> Path:
    env = os.environ.get("DYNSHAPE_CACHE_DIR")
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "dynshape_perception"


@dataclass(frozen=True)
class Sidecar:
    """What sits beside every exported library: enough to check and to trust it."""

    model: str
    model_version: str
    model_hash: str
    target: str
    target_spec: str
    tvm_version: str
    pipeline_version: str
    weights_checksum: str
    symbolic_vars: dict[str, int]
    pinned_dims: dict[str, int]
    functions: list[str]
    library_sha256: str
    schedule: dict[str, str]
    compile_s: float
    planned_bytes: dict[str, int]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Sidecar:
        return cls(**json.loads(text))


@dataclass
class Artefact:
    library_path: Path
    sidecar: Sidecar
    cache_hit: bool


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(
    model: ModelDef,
    weights: Mapping[str, np.ndarray],
    profile: TargetProfile,
    dims: Mapping[str, int] | None = None,
    functions: Sequence[str] | None = None,
    bound: tuple[tvmx.IRModule, dict[str, int]] | None = None,
) -> tuple[str, str]:
    """(key, IR hash): IR structural hash + exact target + TVM version + weights + pipeline."""
    mod, _ = bound or bound_module(model, weights, dims, profile.is_cuda, functions)
    ir_hash = tvmx.structural_hash(mod)
    parts = [
        model.name,
        model.version,
        ir_hash,
        profile.key(),
        tvmx.TVM_VERSION,
        weights_checksum(weights),
        pipeline_version(),
        json.dumps(dict(sorted((dims or {}).items()))),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32], ir_hash


class ArtefactCache:
    """``root/<key>/{model.so, sidecar.json}``, each entry published whole by one rename.

    Several processes share one root (a node's engines, their compile workers): an entry
    renamed into place can never pair one writer's library with another's sidecar, and the
    first writer of a key wins.
    """

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.rebuilt_corrupt = 0
        self._sweep_stale_stages()

    def _sweep_stale_stages(self) -> None:
        """Remove what writers killed mid-write (a timed-out compile worker) left behind."""
        cutoff = time.time() - STALE_STAGE_S
        try:
            stages = list(self.root.glob(f"{STAGE_PREFIX}*"))
        except OSError:
            return
        for stage in stages:
            try:
                stale = stage.lstat().st_mtime < cutoff
            except OSError:
                continue
            if stale:
                shutil.rmtree(stage, ignore_errors=True)

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> Artefact | None:
        """A verified artefact, or None. A corrupt entry is removed with a warning, never loaded."""
        folder = self.entry_dir(key)
        lib, side = folder / LIBRARY, folder / SIDECAR
        if not side.is_file():
            return None
        try:
            sidecar = Sidecar.from_json(side.read_text())
            if not lib.is_file() or file_sha256(lib) != sidecar.library_sha256:
                raise CacheError(f"{lib} does not match its recorded checksum")
        except (CacheError, OSError, ValueError, TypeError, RecursionError) as err:
            self._discard(folder, str(err))
            return None
        return Artefact(lib, sidecar, cache_hit=True)

    def _discard(self, folder: Path, why: str) -> None:
        log.warning("discarding corrupt cache entry %s (%s); rebuilding", folder, why)
        self.rebuilt_corrupt += 1
        shutil.rmtree(folder, ignore_errors=True)

    def get_or_build(
        self,
        model: ModelDef,
        weights: Mapping[str, np.ndarray],
        profile: TargetProfile,
        dims: Mapping[str, int] | None = None,
        functions: Sequence[str] | None = None,
    ) -> Artefact:
        bound = bound_module(model, weights, dims, profile.is_cuda, functions)
        key, _ = cache_key(model, weights, profile, dims, functions, bound)
        found = self.lookup(key)
        if found is not None:
            # The key is a hash: an entry must also say it holds what was asked for.
            held = _provenance(found.sidecar)
            asked = (model.name, weights_checksum(weights), dict(dims or {}), profile.key())
            if held == asked:
                self.hits += 1
                return found
            self._discard(found.library_path.parent, f"sidecar holds {held[0]} {held[2]}")
        self.misses += 1
        result = compile_model(model, weights, profile, dims, functions, bound)
        return self.store(key, model, weights, result)

    def store(
        self,
        key: str,
        model: ModelDef,
        weights: Mapping[str, np.ndarray],
        result: BuildResult,
    ) -> Artefact:
        self.root.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=self.root, prefix=STAGE_PREFIX))
        try:
            tvmx.export_library(result.executable, stage / LIBRARY, result.profile.cross_compiler)
            sidecar = make_sidecar(model, weights, result, file_sha256(stage / LIBRARY))
            (stage / SIDECAR).write_text(sidecar.to_json())
            return self._publish(stage, key, sidecar)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _publish(self, stage: Path, key: str, sidecar: Sidecar) -> Artefact:
        folder = self.entry_dir(key)
        # Twice at most: a folder in the way that does not verify is removed, then retried.
        for _ in range(2):
            try:
                os.rename(stage, folder)
                return Artefact(folder / LIBRARY, sidecar, cache_hit=False)
            except OSError as err:
                if err.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            found = self.lookup(key)
            if found is not None and _provenance(found.sidecar) == _provenance(sidecar):
                # Another writer published this key first: its entry serves everyone.
                return Artefact(found.library_path, found.sidecar, cache_hit=False)
            # No sidecar (an older writer's leftovers), corrupt, or another build's.
            shutil.rmtree(folder, ignore_errors=True)
        raise CacheError(f"cannot publish cache entry {folder}: something keeps writing there")


def _provenance(side: Sidecar) -> tuple[object, ...]:
    return (side.model, side.weights_checksum, side.pinned_dims, side.target_spec)


def make_sidecar(
    model: ModelDef, weights: Mapping[str, np.ndarray], result: BuildResult, lib_sha: str
) -> Sidecar:
    return Sidecar(
        model=model.name,
        model_version=model.version,
        model_hash=result.ir_hash,
        target=result.profile.name,
        target_spec=result.profile.key(),
        tvm_version=tvmx.TVM_VERSION,
        pipeline_version=pipeline_version(),
        weights_checksum=weights_checksum(weights),
        symbolic_vars=dict(result.bounds),
        pinned_dims=dict(result.dims),
        functions=list(result.functions),
        library_sha256=lib_sha,
        schedule=dict(result.schedule),
        compile_s=round(result.compile_s, 3),
        planned_bytes=dict(result.planned_bytes),
    )


def export_to(artefact: Artefact, out_dir: Path) -> tuple[Path, Path]:
    """Copy a cached artefact to ``out_dir/<model>.so`` with its sidecar ``<model>.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    name = artefact.sidecar.model
    lib = out_dir / f"{name}.so"
    side = out_dir / f"{name}.json"
    shutil.copyfile(artefact.library_path, lib)
    atomic_write_text(side, artefact.sidecar.to_json())
    return lib, side


def sidecar_dict(artefact: Artefact) -> dict[str, Any]:
    return asdict(artefact.sidecar)
