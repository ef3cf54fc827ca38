"""A corpus of rosbag2 bags: a folder searched at any depth, or a manifest with goldens, tags."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynshape_perception.config import read_yaml
from dynshape_perception.errors import ConfigError

BAG_METADATA = "metadata.yaml"
MANIFEST_SUFFIXES = (".yaml", ".yml")
MANIFEST_KEYS = {"bags", "golden_root"}
ENTRY_KEYS = {"path", "golden", "tags", "name"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class BagEntry:
    """One bag of the corpus: ``name`` names its result folder and is unique in the corpus."""

    name: str
    path: Path
    golden: Path | None = None
    tags: tuple[str, ...] = ()


def result_name(relative: Path) -> str:
    """A folder name from a bag's path below the corpus root: ``city/day1`` -> ``city__day1``."""
    parts = [_UNSAFE.sub("_", p) for p in relative.parts if p not in ("", ".")]
    name = "__".join(p for p in parts if p.strip("._"))
    return name or "bag"


def find_bags(root: Path) -> list[Path]:
    """Every bag folder (one holding a rosbag2 ``metadata.yaml``) under ``root``, sorted."""
    root = Path(root)
    if (root / BAG_METADATA).is_file():
        return [root]
    found = sorted(p.parent for p in root.rglob(BAG_METADATA) if p.is_file())
    # A bag holds no other bag: a metadata.yaml below a bag folder is not a bag of its own.
    return [p for p in found if not any(q in p.parents for q in found)]


def _unique(entries: list[BagEntry], where: Path) -> list[BagEntry]:
    seen: dict[str, Path] = {}
    for entry in entries:
        if entry.name in seen:
            raise ConfigError(
                f"{where}: bags {seen[entry.name]} and {entry.path} would share the result "
                f"folder {entry.name!r}; give one a name"
            )
        seen[entry.name] = entry.path
    return entries


def _golden_for(golden_root: Path | None, name: str) -> Path | None:
    if golden_root is None:
        return None
    candidate = golden_root / name
    return candidate if candidate.is_dir() else None


def _entry(manifest: Path, index: int, raw: Any, golden_root: Path | None) -> BagEntry:
    where = f"{manifest}: bags[{index}]"
    if isinstance(raw, str):
        raw = {"path": raw}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a path or a mapping with a path")
    unknown = set(raw) - ENTRY_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown, key=str)}")
    path = raw.get("path")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where} needs a path (a bag folder)")
    base = manifest.parent
    bag = (base / path).resolve()
    tags = raw.get("tags", [])
    if isinstance(tags, str):
        tags = [tags]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"{where}: tags must be a list of strings, got {tags!r}")
    name = raw.get("name")
    if name is None:
        name = result_name(Path(path))
    elif not isinstance(name, str) or result_name(Path(name)) != name:
        raise ConfigError(f"{where}: name {name!r} must be a plain folder name")
    golden = raw.get("golden")
    if golden is not None and not isinstance(golden, str):
        raise ConfigError(f"{where}: golden must be a folder path, got {golden!r}")
    golden_path = (base / golden).resolve() if golden else _golden_for(golden_root, name)
    return BagEntry(name, bag, golden_path, tuple(tags))


def load_manifest(path: Path, golden_root: Path | None = None) -> list[BagEntry]:
    """Bags listed in a manifest; relative paths are relative to the manifest's folder."""
    raw = read_yaml(path, "corpus manifest")
    if not isinstance(raw, dict) or not isinstance(raw.get("bags"), list):
        raise ConfigError(f"{path}: a corpus manifest needs a 'bags' list")
    unknown = set(raw) - MANIFEST_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown, key=str)}")
    root = raw.get("golden_root")
    if root is not None and not isinstance(root, str):
        raise ConfigError(f"{path}: golden_root must be a folder path, got {root!r}")
    root_path = (Path(path).parent / root).resolve() if root else golden_root
    if not raw["bags"]:
        raise ConfigError(f"{path}: the manifest lists no bags")
    entries = [_entry(Path(path), i, item, root_path) for i, item in enumerate(raw["bags"])]
    return _unique(entries, Path(path))


def load_corpus(corpus: Path, golden_root: Path | None = None) -> list[BagEntry]:
    """The bags of a folder (at any depth) or of a manifest file, each with its result name.

    ``golden_root/NAME``, where it exists, is the golden folder of the bag named NAME
    (a manifest's own ``golden`` entries come first).
    """
    corpus = Path(corpus)
    if golden_root is not None and not golden_root.is_dir():
        raise ConfigError(f"golden folder {golden_root} does not exist")
    if corpus.is_file():
        if corpus.suffix not in MANIFEST_SUFFIXES:
            raise ConfigError(f"{corpus} is neither a folder of bags nor a manifest (.yaml)")
        return load_manifest(corpus, golden_root)
    if not corpus.is_dir():
        raise ConfigError(f"corpus {corpus} does not exist")
    bags = find_bags(corpus)
    if not bags:
        raise ConfigError(f"no rosbag2 bag (a folder with {BAG_METADATA}) under {corpus}")
    entries = []
    for bag in bags:
        name = result_name(Path(bag.name) if bag == corpus else bag.relative_to(corpus))
        entries.append(BagEntry(name, bag.resolve(), _golden_for(golden_root, name)))
    return _unique(entries, corpus)
