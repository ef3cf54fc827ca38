"""Locate the package's share folder (config/, models/, launch/) in a source tree or an install."""

from __future__ import annotations

import os
import site
import sys
from functools import lru_cache
from pathlib import Path

from dynshape_perception.errors import ConfigError

PACKAGE = "dynshape_perception"


@lru_cache(maxsize=1)
def share_dir() -> Path:
    override = os.environ.get("DYNSHAPE_PERCEPTION_SHARE")
    if override:
        return Path(override)
    source_root = Path(__file__).resolve().parents[1]
    # A source tree, then a pip install's data_files (``<prefix>/share/<package>``), which
    # needs no ROS environment; then the ament index, as ament_index_python reads it.
    installed = [Path(sys.prefix), *(Path(p).parents[2] for p in site.getsitepackages())]
    indexed = [
        prefix
        for prefix in ament_prefixes()
        if (prefix / "share" / "ament_index" / "resource_index" / "packages" / PACKAGE).is_file()
    ]
    for root in (source_root, *(prefix / "share" / PACKAGE for prefix in [*installed, *indexed])):
        if (root / "config" / "models.yaml").is_file():
            return root
    raise ConfigError(f"cannot find the {PACKAGE} share folder; set DYNSHAPE_PERCEPTION_SHARE")


def ament_prefixes() -> list[Path]:
    """Install prefixes to search for other packages' share files: ``AMENT_PREFIX_PATH``, as
    a sourced ROS sets it, then this Python's prefix (a venv holding the ROS wheels)."""
    listed = [Path(p) for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    return list(dict.fromkeys([*listed, Path(sys.prefix)]))


def config_path(name: str) -> Path:
    return share_dir() / "config" / name


def models_dir() -> Path:
    return share_dir() / "models"


def shared_data_dir() -> Path | None:
    """The project's sibling ``shared/data`` folder, if present (development and CI only)."""
    env = os.environ.get("DYNSHAPE_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    candidates.append(Path.cwd().parent / "shared" / "data")
    for cand in candidates:
        if cand.is_dir():
            return cand
    return None
