"""The README stays short and its links, and those of docs/, lead to files that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 300
# [text](target) outside code; the target's own anchor (#...) is not checked.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _prose(text: str) -> str:
    """The text without fenced code blocks, where brackets are code, not links."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def _local_links(path: Path) -> list[str]:
    targets = LINK.findall(_prose(path.read_text()))
    return [t.split("#", 1)[0] for t in targets if not EXTERNAL.match(t) and not t.startswith("#")]


def _broken(path: Path) -> list[str]:
    return [t for t in _local_links(path) if t and not (path.parent / t).exists()]


def test_the_readme_is_at_most_300_lines() -> None:
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


def test_the_readme_links_to_docs_that_exist() -> None:
    links = _local_links(README)
    assert any(t.startswith("docs/") for t in links)
    assert _broken(README) == []


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {(ROOT / t).resolve() for t in _local_links(README)}
    assert sorted(p.name for p in (ROOT / "docs").glob("*.md") if p not in linked) == []


def test_links_between_docs_resolve() -> None:
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert [f"{p.name}: {t}" for p in docs for t in _broken(p)] == []


def test_a_broken_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](page.md) [gone](docs/missing.md#part) [web](https://example.org)\n"
        "```\n[code](not/a/link.md)\n```\n"
    )
    assert _broken(page) == ["docs/missing.md"]
