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
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.build import (
    BuildResult,
    bound_module,
    compile_model,
    hashed_module,
    pipeline_version,
)
from dynshape_perception.compiler.targets import TargetProfile
from dynshape_perception.errors import CacheError, ConfigError
from dynshape_perception.fsutil import StagedDir, atomic_write_text
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.weights import weights_checksum
from dynshape_perception.procfs import GONE_STATES, stat_fields

log = logging.getLogger(__name__)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is no zombie (a killed worker not yet reaped);
    True where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    except OSError:
        return True
    return stat_fields(stat)[0] not in GONE_STATES


LIBRARY = "model.so"
SIDECAR = "sidecar.json"
# An entry is written whole into a staging folder, then renamed into place.
STAGE_PREFIX = ".stage-"
# A staging folder this old was left by a writer that died mid-write: no build takes an hour.
STALE_STAGE_S = 3600.0
# An evicted entry is renamed out of sight in one step, then removed at leisure.
EVICT_PREFIX = ".evict-"
# An entry used this recently is never evicted: another process may be between finding it and
# loading its library, and the bound is met again at a later prune.
RECENT_USE_S = 300.0
# Eviction order: entries no sidecar describes, then specialisations (a compile of well under
# a second each), and generic builds, which a start-up waits for, last.
_UNREADABLE, _SPECIALISED, _GENERIC = 0, 1, 2
# What reading a damaged sidecar raises: unreadable, not JSON, other fields, or nested too deep.
_SIDECAR_ERRORS = (OSError, ValueError, TypeError, RecursionError)


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
    # Whether a specialisation would compile the same loops (see ``BuildResult``); sidecars
    # written before it was recorded read as False, which allows specialising.
    shape_invariant: bool = False

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


@dataclass(frozen=True)
class EntryInfo:
    """One published entry as it stands on disk."""

    key: str
    size_bytes: int
    # The folder's mtime: set when the entry is published and at every hit.
    last_used: float
    # None where the sidecar cannot be read: such an entry can never be a hit.
    sidecar: Sidecar | None

    @property
    def rank(self) -> int:
        if self.sidecar is None:
            return _UNREADABLE
        return _SPECIALISED if self.sidecar.pinned_dims else _GENERIC


@dataclass(frozen=True)
class PruneReport:
    evicted: int
    freed_bytes: int
    bytes_left: int
    # Still above the bound: what is left was all used within RECENT_USE_S.
    over_bound: bool


def check_max_bytes(value: object, what: str = "artefact cache max_bytes") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer of bytes, got {value!r}")
    return value


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
    _, _, ir_hash = hashed_module(model, weights, profile, dims, functions, bound)
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

    def __init__(self, root: Path | None = None, max_bytes: int | None = None) -> None:
        """``max_bytes`` bounds the whole root on disk, whoever wrote it: each store by this
        object prunes least recently used entries past it. None: this writer never prunes."""
        self.root = root or default_cache_dir()
        self.max_bytes = None if max_bytes is None else check_max_bytes(max_bytes)
        self.hits = 0
        self.misses = 0
        self.rebuilt_corrupt = 0
        self.evicted = 0
        self.evicted_bytes = 0
        self._sweep_stale_stages()

    def sweep_orphan_stages(self) -> int:
        """Remove the staging folders whose writer process is gone (a compile worker killed
        mid-write as its node stopped); how many. Those of live writers stay."""
        removed = 0
        try:
            stages = list(self.root.glob(f"{STAGE_PREFIX}*"))
        except OSError:
            return 0
        for stage in stages:
            pid = stage.name[len(STAGE_PREFIX) :].split("-", 1)[0]
            if pid.isdecimal() and not _running(int(pid)):
                shutil.rmtree(stage, ignore_errors=True)
                removed += 1
        return removed

    def _sweep_stale_stages(self) -> None:
        """Remove what writers killed mid-write (a timed-out compile worker) left behind, and
        what a pruner killed mid-removal left of an evicted entry (nobody can find it)."""
        cutoff = time.time() - STALE_STAGE_S
        try:
            stages = list(self.root.glob(f"{STAGE_PREFIX}*"))
            evicted = list(self.root.glob(f"{EVICT_PREFIX}*"))
        except OSError:
            return
        for stage in stages:
            try:
                stale = stage.lstat().st_mtime < cutoff
            except OSError:
                continue
            if stale:
                shutil.rmtree(stage, ignore_errors=True)
        for folder in evicted:
            shutil.rmtree(folder, ignore_errors=True)

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
        except FileNotFoundError:
            if not folder.exists():
                # Another process evicted the entry while it was read: a miss, not damage.
                return None
            self._discard(folder, f"{lib} vanished while it was read")
            return None
        except (CacheError, *_SIDECAR_ERRORS) as err:
            self._discard(folder, str(err))
            return None
        _touch(folder)
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
        # The writer's pid in the name: once it is gone, nobody finishes this folder.
        with StagedDir(self.entry_dir(key), prefix=f"{STAGE_PREFIX}{os.getpid()}-") as staged:
            stage = staged.path
            tvmx.export_library(result.executable, stage / LIBRARY, result.profile.cross_compiler)
            sidecar = make_sidecar(model, weights, result, file_sha256(stage / LIBRARY))
            (stage / SIDECAR).write_text(sidecar.to_json())
            artefact = self._publish(staged, key, sidecar)
        self.keep_bound()
        return artefact

    def keep_bound(self) -> None:
        """Prune to ``max_bytes``, if set. A bound that cannot be kept now (a read-only or
        vanished root) is logged and kept at a later store."""
        if self.max_bytes is None:
            return
        try:
            self.prune(self.max_bytes)
        except OSError as err:
            log.warning(
                "artefact cache %s: cannot prune to %d bytes (%s)", self.root, self.max_bytes, err
            )

    def entries(self, read_sidecars: bool = True) -> list[EntryInfo]:
        """Every published entry under the root (staging and evicted folders are not)."""
        found: list[EntryInfo] = []
        try:
            listing = list(os.scandir(self.root))
        except FileNotFoundError:
            return found
        for item in listing:
            if item.name.startswith(".") or not item.is_dir(follow_symlinks=False):
                continue
            folder = Path(item.path)
            try:
                last_used = item.stat(follow_symlinks=False).st_mtime
                size = sum(f.stat(follow_symlinks=False).st_size for f in os.scandir(folder))
            except FileNotFoundError:
                continue  # evicted or discarded meanwhile
            sidecar = _read_sidecar(folder / SIDECAR) if read_sidecars else None
            found.append(EntryInfo(item.name, size, last_used, sidecar))
        return found

    def prune(self, max_bytes: int, recent_s: float = RECENT_USE_S) -> PruneReport:
        """Evict entries until the root holds at most ``max_bytes``: unreadable ones first,
        then specialisations, then generic builds, each least recently used first. Entries used
        within ``recent_s`` stay, even over the bound."""
        check_max_bytes(max_bytes)
        listed = self.entries(read_sidecars=False)
        total = sum(e.size_bytes for e in listed)
        evicted = freed = 0
        if total > max_bytes:
            cutoff = time.time() - recent_s
            # Only an entry that may go is worth reading the sidecar of.
            candidates = sorted(
                (
                    replace(e, sidecar=_read_sidecar(self.entry_dir(e.key) / SIDECAR))
                    for e in listed
                    if e.last_used < cutoff
                ),
                key=lambda e: (e.rank, e.last_used),
            )
            for entry in candidates:
                if total <= max_bytes:
                    break
                if self._evict(entry.key, cutoff):
                    total -= entry.size_bytes
                    freed += entry.size_bytes
                    evicted += 1
        if evicted:
            self.evicted += evicted
            self.evicted_bytes += freed
            log.info("artefact cache %s: evicted %d entries (%d bytes)", self.root, evicted, freed)
        return PruneReport(evicted, freed, total, total > max_bytes)

    def _evict(self, key: str, cutoff: float) -> bool:
        """Rename the entry out of sight in one step, so no reader meets it half removed."""
        try:
            if self.entry_dir(key).stat().st_mtime >= cutoff:
                return False  # used since the listing was taken
        except FileNotFoundError:
            return False
        gone = Path(tempfile.mkdtemp(dir=self.root, prefix=EVICT_PREFIX))
        target = gone / key
        try:
            os.rename(self.entry_dir(key), target)
        except FileNotFoundError:
            # Another pruner took it first.
            return False
        finally:
            shutil.rmtree(gone, ignore_errors=True)
        return True

    def _publish(self, staged: StagedDir, key: str, sidecar: Sidecar) -> Artefact:
        folder = self.entry_dir(key)
        # Twice at most: a folder in the way that does not verify is removed, then retried.
        for _ in range(2):
            try:
                staged.publish()
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


def _touch(folder: Path) -> None:
    """Mark an entry used now; a read-only cache (a bundle's) simply keeps its stamps."""
    try:
        os.utime(folder)
    except OSError:
        pass


def _read_sidecar(path: Path) -> Sidecar | None:
    try:
        return Sidecar.from_json(path.read_text())
    except _SIDECAR_ERRORS:
        return None


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
        shape_invariant=result.shape_invariant,
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
