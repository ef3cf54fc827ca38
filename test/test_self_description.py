"""What the project ships describes the project, never how it was made."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("dynshape_perception", "test", "launch", "config", "scripts", "docs")
SCANNED_FILES = ("README.md", "Makefile", "package.xml", "setup.py")
SUFFIXES = frozenset({".py", ".md", ".yaml", ".xml", ".sh", ".txt", ".cfg", ".toml"})
PROCESS_WORDS = re.compile(
    r"\b(?:(?:\d+(?:st|nd|rd|th)|(?:twenty-)?(?:first|second|third|fourth|fifth|sixth|seventh"
    r"|eighth|ninth)|tenth|eleventh|twelfth|(?:thir|four|fif|six|seven|eigh|nine)teenth|twentieth)"
    r" session|(?:this|last|previous|next|earlier|later) sessions?"
    r"|sessions? `?\d+|closing notes?|issues? `?#?\d+|the issue(?:'s)?|this issue|tasks? `?#?\d+"
    r"|commit `?[0-9a-f]{7,40}|this machine|code review|reviewers?)\b",
    re.IGNORECASE,
)


def _files() -> list[Path]:
    found = [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    for folder in SCANNED:
        found.extend(p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    return sorted(found)


def _hits(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        if path.resolve() == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if PROCESS_WORDS.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    return hits


def test_nothing_speaks_of_sessions_issues_reviews_or_the_machine() -> None:
    assert _hits(_files()) == []


def test_the_readme_and_every_doc_are_scanned() -> None:
    scanned = set(_files())
    assert ROOT / "README.md" in scanned
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs and set(docs) <= scanned


def test_the_pattern_catches_process_words() -> None:
    lines = [
        "as the sixteenth session measured",
        "see the closing note",
        "fixed in issue 29",
        "the issue's stream",
        "at commit d76d864",
        "at commit `d76d864`",
        "see issue `12`",
        "in session `3`",
        "on this machine",
        "after code review",
    ]
    for text in lines:
        assert PROCESS_WORDS.search(text), text
    for text in ("an ONNX Runtime session", "a pytest session fixture", "the node's session"):
        assert not PROCESS_WORDS.search(text), text
