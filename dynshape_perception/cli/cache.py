"""``dynshape-perception cache``: what the artefact cache holds on disk, and pruning it."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from dynshape_perception.errors import ConfigError


def _bytes(text: str) -> int:
    """A byte count, with an optional K, M or G suffix (powers of 1024)."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    raw = text.strip().upper().removesuffix("IB").removesuffix("B")
    factor = scale.get(raw[-1:], 1)
    digits = raw[:-1] if raw[-1:] in scale else raw
    try:
        value = int(digits) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a byte count: {text!r} (e.g. 2147483648, 2G)"
        ) from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"a byte count must be positive, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="artefact cache folder (default: $DYNSHAPE_CACHE_DIR or ~/.cache/dynshape_perception)",
    )
    parser.add_argument(
        "--prune-to",
        type=_bytes,
        default=None,
        metavar="BYTES",
        help="evict least recently used entries until the cache holds at most this (2G, 500M)",
    )
    parser.add_argument(
        "--keep-recent-s",
        type=float,
        default=None,
        help="entries used this recently are kept even over the bound (default 300)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    from dynshape_perception.compiler.cache import (
        RECENT_USE_S,
        ArtefactCache,
        default_cache_dir,
    )

    root = args.cache_dir or default_cache_dir()
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--cache-dir {root} is not a folder")
    recent_s = RECENT_USE_S if args.keep_recent_s is None else args.keep_recent_s
    if not recent_s >= 0:
        raise ConfigError(f"--keep-recent-s must be >= 0, got {args.keep_recent_s!r}")
    cache = ArtefactCache(root)
    summary: dict[str, Any] = {"root": str(root)}
    if args.prune_to is not None:
        report = cache.prune(args.prune_to, recent_s)
        summary["pruned"] = {
            "max_bytes": args.prune_to,
            "evicted": report.evicted,
            "freed_bytes": report.freed_bytes,
            "over_bound": report.over_bound,
        }
    entries = cache.entries()
    kinds: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for e in entries:
        if e.sidecar is None:
            model, kind = "unreadable", "unreadable"
        else:
            model = e.sidecar.model
            kind = f"{model} {'specialised' if e.sidecar.pinned_dims else 'generic'}"
        kinds[kind] += 1
        sizes[model] += e.size_bytes
    summary["entries"] = len(entries)
    summary["bytes"] = sum(e.size_bytes for e in entries)
    summary["by_kind"] = dict(sorted(kinds.items()))
    summary["bytes_by_model"] = dict(sorted(sizes.items()))
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(f"{root}: {summary['entries']} entries, {summary['bytes'] / 1e6:.1f} MB")
    for kind, n in summary["by_kind"].items():
        print(f"  {kind:<28}{n:>6}")
    if "pruned" in summary:
        p = summary["pruned"]
        print(
            f"pruned to {p['max_bytes']} bytes: evicted {p['evicted']} "
            f"({p['freed_bytes'] / 1e6:.1f} MB)"
            + (", still over: what is left was used recently" if p["over_bound"] else "")
        )
    return 0
