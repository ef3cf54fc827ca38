"""The artefact cache: hits, atomic writes under concurrent processes, corrupt files rebuilt."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.compiler import cache as cache_module
from dynshape_perception.compiler.build import BuildResult, bound_module, compile_model
from dynshape_perception.compiler.cache import (
    EVICT_PREFIX,
    LIBRARY,
    RECENT_USE_S,
    SIDECAR,
    STAGE_PREFIX,
    STALE_STAGE_S,
    ArtefactCache,
    cache_key,
    file_sha256,
)
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.executable import LoadedModel

MODEL = model_definition("associator")
WEIGHTS = init_weights(parameter_shapes(MODEL), seed=5)
DET = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)


def test_second_compile_is_a_hit(tmp_path: Path) -> None:
    cache = ArtefactCache(tmp_path)
    first = cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    second = cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert (cache.hits, cache.misses) == (1, 1)
    assert first.library_path == second.library_path


def test_key_changes_with_weights_target_and_dims() -> None:
    x86, v3 = load_profile("x86_64"), load_profile("x86_64-v3")
    base, _ = cache_key(MODEL, WEIGHTS, x86)
    other_weights = init_weights(parameter_shapes(MODEL), seed=6)
    assert cache_key(MODEL, other_weights, x86)[0] != base
    assert cache_key(MODEL, WEIGHTS, v3)[0] != base
    assert cache_key(MODEL, WEIGHTS, x86, {"N": 4, "M": 4})[0] != base
    assert cache_key(MODEL, WEIGHTS, x86)[0] == base


def test_sidecar_records_provenance(tmp_path: Path) -> None:
    artefact = ArtefactCache(tmp_path).get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    side = json.loads((artefact.library_path.parent / SIDECAR).read_text())
    assert side["model"] == "associator" and side["target"] == "x86_64"
    assert side["symbolic_vars"] == {"N": 128, "M": 128}
    assert side["tvm_version"].startswith("0.27")
    assert len(side["library_sha256"]) == 64 and side["model_hash"]


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_corrupt_library_is_discarded_and_rebuilt(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ArtefactCache(tmp_path)
    artefact = cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    data = artefact.library_path.read_bytes()
    if damage == "truncate":
        artefact.library_path.write_bytes(data[: len(data) // 2])
    else:
        artefact.library_path.write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])
    with caplog.at_level(logging.WARNING):
        rebuilt = ArtefactCache(tmp_path).get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    assert not rebuilt.cache_hit
    assert "discarding corrupt cache entry" in caplog.text
    assert rebuilt.library_path.read_bytes() != data[: len(data) // 2]
    out = LoadedModel(MODEL, rebuilt.library_path)("forward", DET, DET)[0]
    np.testing.assert_allclose(out, MODEL.reference("forward", WEIGHTS, [DET, DET])[0], rtol=1e-4)


@pytest.mark.parametrize("damage", ["nested", "other_model", "other_weights", "other_dims"])
def test_a_sidecar_that_does_not_describe_its_key_is_discarded(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The key is a hash: a hostile or misplaced sidecar must not make another build a hit."""
    artefact = ArtefactCache(tmp_path).get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    side_path = artefact.library_path.parent / SIDECAR
    side = json.loads(side_path.read_text())
    if damage == "nested":
        side_path.write_text("[" * 100_000 + "]" * 100_000)
    else:
        field, value = {
            "other_model": ("model", "predictor"),
            "other_weights": ("weights_checksum", "0" * 64),
            "other_dims": ("pinned_dims", {"N": 7}),
        }[damage]
        side[field] = value
        side_path.write_text(json.dumps(side))
    with caplog.at_level(logging.WARNING):
        again = ArtefactCache(tmp_path).get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    assert not again.cache_hit
    assert "discarding corrupt cache entry" in caplog.text
    assert json.loads((again.library_path.parent / SIDECAR).read_text())["model"] == "associator"


def test_missing_library_with_sidecar_is_rebuilt(tmp_path: Path) -> None:
    cache = ArtefactCache(tmp_path)
    artefact = cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64"))
    artefact.library_path.unlink()
    assert (
        not ArtefactCache(tmp_path).get_or_build(MODEL, WEIGHTS, load_profile("x86_64")).cache_hit
    )


def test_two_processes_building_the_same_key_never_see_a_partial_library(tmp_path: Path) -> None:
    script = tmp_path / "build.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys
            from pathlib import Path
            import numpy as np
            from dynshape_perception.compiler.cache import ArtefactCache
            from dynshape_perception.compiler.targets import load_profile
            from dynshape_perception.runtime.executable import LoadedModel
            from dynshape_perception.models import model_definition
            from dynshape_perception.models.registry import parameter_shapes
            from dynshape_perception.models.weights import init_weights

            model = model_definition("associator")
            weights = init_weights(parameter_shapes(model), seed=5)
            root = Path({str(tmp_path / "cache")!r})
            for _ in range(3):
                artefact = ArtefactCache(root).get_or_build(model, weights, load_profile("x86_64"))
                det = np.ones((2, 8), np.float32)
                LoadedModel(model, artefact.library_path)("forward", det, det)
            print("ok")
            """
        )
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert out.strip() == "ok"
    entries = [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]
    assert len(entries) == 1
    leftovers = [p.name for p in entries[0].iterdir() if p.name not in (LIBRARY, SIDECAR)]
    assert leftovers == [], f"temporary files left behind: {leftovers}"
    assert ArtefactCache(tmp_path / "cache").lookup(entries[0].name) is not None


def _fresh_build(key_dims: dict[str, int] | None = None) -> tuple[str, BuildResult]:
    profile = load_profile("x86_64")
    bound = bound_module(MODEL, WEIGHTS, key_dims, profile.is_cuda, None)
    key, _ = cache_key(MODEL, WEIGHTS, profile, key_dims, None, bound)
    return key, compile_model(MODEL, WEIGHTS, profile, key_dims, None, bound)


def test_a_key_published_first_by_another_writer_is_the_one_kept(tmp_path: Path) -> None:
    """Two writers of one key: the second finds the first's entry whole and serves it, so a
    library is never paired with another build's sidecar."""
    dims = {"N": 6, "M": 6}
    key, late = _fresh_build(dims)
    first = ArtefactCache(tmp_path).get_or_build(MODEL, WEIGHTS, load_profile("x86_64"), dims)
    before = first.library_path.stat()
    second = ArtefactCache(tmp_path).store(key, MODEL, WEIGHTS, late)
    assert second.library_path == first.library_path
    # The very file the first writer published, not a second one moved in under its sidecar.
    after = first.library_path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert file_sha256(second.library_path) == second.sidecar.library_sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == [key]
    assert sorted(p.name for p in (tmp_path / key).iterdir()) == [LIBRARY, SIDECAR]


def test_leftovers_in_an_entrys_place_are_replaced(tmp_path: Path) -> None:
    """A writer of the older layout died mid-write: its folder holds no sidecar."""
    dims = {"N": 7, "M": 7}
    key, result = _fresh_build(dims)
    (tmp_path / key).mkdir()
    (tmp_path / key / ".model.abc123.so").write_bytes(b"half a library")
    artefact = ArtefactCache(tmp_path).store(key, MODEL, WEIGHTS, result)
    assert sorted(p.name for p in (tmp_path / key).iterdir()) == [LIBRARY, SIDECAR]
    found = ArtefactCache(tmp_path).lookup(key)
    assert found is not None and found.library_path == artefact.library_path
    rows = np.random.default_rng(1).standard_normal((7, 8)).astype(np.float32)
    out = LoadedModel(MODEL, found.library_path)("forward", rows, rows)[0]
    np.testing.assert_allclose(out, MODEL.reference("forward", WEIGHTS, [rows, rows])[0], rtol=1e-4)


def test_stages_left_by_killed_writers_are_swept_once_stale(tmp_path: Path) -> None:
    stale, fresh = tmp_path / f"{STAGE_PREFIX}dead", tmp_path / f"{STAGE_PREFIX}writing"
    for stage in (stale, fresh):
        stage.mkdir()
        (stage / LIBRARY).write_bytes(b"partial")
    old = os.stat(stale).st_mtime - STALE_STAGE_S - 60
    os.utime(stale, (old, old))
    ArtefactCache(tmp_path)
    assert not stale.exists() and (fresh / LIBRARY).exists()


def test_stages_of_writers_that_are_gone_are_swept_at_once(tmp_path: Path) -> None:
    """A compile worker killed mid-write (its node stopped during a frozen warm-up) leaves
    a stage named by its pid; the stage of a live writer stays."""
    writer = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL
    )
    try:
        orphan = tmp_path / f"{STAGE_PREFIX}{writer.pid}-abc"
        live = tmp_path / f"{STAGE_PREFIX}{os.getpid()}-def"
        unnamed = tmp_path / f"{STAGE_PREFIX}writing"
        for stage in (orphan, live, unnamed):
            stage.mkdir()
            (stage / LIBRARY).write_bytes(b"partial")
        cache = ArtefactCache(tmp_path)
        assert cache.sweep_orphan_stages() == 0
    finally:
        writer.kill()
        writer.wait()
    assert cache.sweep_orphan_stages() == 1
    assert not orphan.exists() and (live / LIBRARY).exists() and (unnamed / LIBRARY).exists()


def _age(cache: ArtefactCache, key: str, seconds_ago: float) -> None:
    stamp = time.time() - seconds_ago
    os.utime(cache.entry_dir(key), (stamp, stamp))


def _built(cache: ArtefactCache, dims: dict[str, int] | None = None) -> str:
    artefact = cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64"), dims)
    return artefact.library_path.parent.name


def _size(cache: ArtefactCache, key: str) -> int:
    return sum(f.stat().st_size for f in cache.entry_dir(key).iterdir())


def test_prune_evicts_specialisations_least_recently_used_first_and_generic_last(
    tmp_path: Path,
) -> None:
    cache = ArtefactCache(tmp_path)
    generic, older, newer = (
        _built(cache),
        _built(cache, {"N": 2, "M": 2}),
        _built(cache, {"N": 3, "M": 3}),
    )
    # The generic build is the least recently used, yet it goes last.
    _age(cache, generic, 3 * RECENT_USE_S)
    _age(cache, older, 2 * RECENT_USE_S)
    _age(cache, newer, 1.5 * RECENT_USE_S)
    sizes = {k: _size(cache, k) for k in (generic, older, newer)}
    report = cache.prune(sizes[generic] + sizes[newer])
    assert (report.evicted, report.freed_bytes) == (1, sizes[older])
    assert report.bytes_left == sizes[generic] + sizes[newer] and not report.over_bound
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([generic, newer])
    assert cache.lookup(older) is None and cache.lookup(newer) is not None
    # The hit just now marked ``newer`` used: it is protected, so the generic build goes.
    report = cache.prune(1)
    assert report.evicted == 1 and report.over_bound
    assert sorted(p.name for p in tmp_path.iterdir()) == [newer]
    assert (cache.evicted, cache.evicted_bytes) == (2, sizes[older] + sizes[generic])


def test_entries_used_recently_stay_even_over_the_bound(tmp_path: Path) -> None:
    cache = ArtefactCache(tmp_path)
    key = _built(cache)
    report = cache.prune(1)
    assert (report.evicted, report.over_bound) == (0, True)
    assert cache.lookup(key) is not None
    _age(cache, key, 2 * RECENT_USE_S)
    assert cache.prune(1, recent_s=RECENT_USE_S).evicted == 1
    assert cache.entries() == []


def test_a_hit_marks_its_entry_used(tmp_path: Path) -> None:
    cache = ArtefactCache(tmp_path)
    key = _built(cache)
    _age(cache, key, 2 * RECENT_USE_S)
    assert cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64")).cache_hit
    assert time.time() - cache.entry_dir(key).stat().st_mtime < 60
    assert cache.prune(1).evicted == 0


def test_a_bounded_cache_prunes_as_it_stores(tmp_path: Path) -> None:
    unbounded = ArtefactCache(tmp_path)
    old = _built(unbounded, {"N": 2, "M": 2})
    _age(unbounded, old, 2 * RECENT_USE_S)
    _built(unbounded, {"N": 3, "M": 3})
    assert unbounded.evicted == 0 and len(unbounded.entries()) == 2
    bounded = ArtefactCache(tmp_path, max_bytes=2 * _size(unbounded, old))
    new = _built(bounded, {"N": 4, "M": 4})
    assert bounded.evicted == 1
    assert old not in {e.key for e in bounded.entries()}
    assert new in {e.key for e in bounded.entries()}


def test_unreadable_entries_go_before_any_build(tmp_path: Path) -> None:
    cache = ArtefactCache(tmp_path)
    generic = _built(cache)
    junk = tmp_path / ("0" * 32)
    junk.mkdir()
    (junk / SIDECAR).write_text("{not json")
    (junk / LIBRARY).write_bytes(b"x" * 10)
    _age(cache, generic, 2 * RECENT_USE_S)
    _age(cache, junk.name, RECENT_USE_S * 1.5)
    entries = {e.key: e for e in cache.entries()}
    assert entries[junk.name].sidecar is None
    report = cache.prune(_size(cache, generic))
    assert report.evicted == 1 and not junk.exists() and cache.entry_dir(generic).exists()


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "1G", None])
def test_a_bound_that_is_not_a_positive_byte_count_is_a_config_error(
    tmp_path: Path, value: object
) -> None:
    with pytest.raises(ConfigError, match="positive integer of bytes"):
        ArtefactCache(tmp_path).prune(value)  # type: ignore[arg-type]
    if value is not None:
        with pytest.raises(ConfigError, match="positive integer of bytes"):
            ArtefactCache(tmp_path, max_bytes=value)  # type: ignore[arg-type]


def test_a_reader_racing_an_eviction_gets_a_miss_not_a_corrupt_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ArtefactCache(tmp_path)
    key = _built(cache)
    _age(cache, key, 2 * RECENT_USE_S)
    other = ArtefactCache(tmp_path)
    real_sha = cache_module.file_sha256

    def evicting_mid_read_fault_injector(path: Path) -> str:
        """Fault injector: another process evicts the entry between two of the reader's reads."""
        assert other.prune(1).evicted == 1
        return real_sha(path)

    monkeypatch.setattr(cache_module, "file_sha256", evicting_mid_read_fault_injector)
    with caplog.at_level(logging.WARNING):
        assert cache.lookup(key) is None
    assert "corrupt" not in caplog.text and cache.rebuilt_corrupt == 0
    monkeypatch.undo()
    assert not cache.get_or_build(MODEL, WEIGHTS, load_profile("x86_64")).cache_hit


def test_what_a_killed_pruner_left_is_swept(tmp_path: Path) -> None:
    left = tmp_path / f"{EVICT_PREFIX}abc" / ("1" * 32)
    left.mkdir(parents=True)
    (left / LIBRARY).write_bytes(b"evicted")
    cache = ArtefactCache(tmp_path)
    assert not (tmp_path / f"{EVICT_PREFIX}abc").exists() and cache.entries() == []
