"""``dynshape-perception cache``: the summary of what is on disk, and pruning it to a size."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.compiler.cache import RECENT_USE_S, ArtefactCache
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights

MODEL = model_definition("associator")
WEIGHTS = init_weights(parameter_shapes(MODEL), seed=11)


def _summary(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(["cache", *argv, "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_cache_lists_entries_by_kind_and_prunes_the_least_recently_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = ArtefactCache(tmp_path)
    profile = load_profile("x86_64")
    generic = cache.get_or_build(MODEL, WEIGHTS, profile).library_path.parent
    special = cache.get_or_build(MODEL, WEIGHTS, profile, {"N": 2, "M": 2}).library_path.parent
    old = time.time() - 2 * RECENT_USE_S
    for folder in (generic, special):
        os.utime(folder, (old, old))
    summary = _summary(capsys, ["--cache-dir", str(tmp_path)])
    assert summary["entries"] == 2
    assert summary["by_kind"] == {"associator generic": 1, "associator specialised": 1}
    total = summary["bytes"]
    assert isinstance(total, int) and total > 0
    generic_bytes = sum(f.stat().st_size for f in generic.iterdir())
    summary = _summary(capsys, ["--cache-dir", str(tmp_path), "--prune-to", str(generic_bytes)])
    assert summary["pruned"] == {
        "max_bytes": generic_bytes,
        "evicted": 1,
        "freed_bytes": total - generic_bytes,
        "over_bound": False,
    }
    assert summary["by_kind"] == {"associator generic": 1}
    assert main(["cache", "--cache-dir", str(tmp_path), "--prune-to", "1K"]) == 0
    assert "evicted 1" in capsys.readouterr().out and not generic.exists()


def test_cache_on_a_folder_that_does_not_exist_is_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = _summary(capsys, ["--cache-dir", str(tmp_path / "none"), "--prune-to", "1G"])
    assert (summary["entries"], summary["bytes"]) == (0, 0)


@pytest.mark.parametrize("size", ["abc", "0", "-5M", "1.5G", ""])
def test_a_bad_prune_size_is_a_usage_error(
    tmp_path: Path, size: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["cache", "--cache-dir", str(tmp_path), f"--prune-to={size}"])
    assert exit_.value.code == 2
    assert "byte count" in capsys.readouterr().err


def test_a_cache_dir_that_is_a_file_or_a_bad_keep_window_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv in (
        ["--cache-dir", str(afile)],
        ["--cache-dir", str(tmp_path), "--keep-recent-s", "nan"],
        ["--cache-dir", str(tmp_path), "--keep-recent-s", "-1"],
    ):
        assert main(["cache", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
