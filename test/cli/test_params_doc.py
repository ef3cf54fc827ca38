"""docs/parameters.md is the parameter table as ``dynshape-perception params`` prints it."""

from __future__ import annotations

from pathlib import Path

from dynshape_perception import parameters
from dynshape_perception.cli.main import main
from dynshape_perception.cli.params import markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "parameters.md"


def test_docs_parameters_is_current() -> None:
    assert DOC.read_text() == markdown(), (
        "docs/parameters.md is stale: run dynshape-perception params --out docs/parameters.md"
    )


def test_every_parameter_has_a_row() -> None:
    text = markdown()
    for name, spec in parameters.all_specs().items():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert ("read-only" if spec.read_only else "live") in row


def test_the_verb_writes_the_file(tmp_path: Path) -> None:
    out = tmp_path / "p.md"
    assert main(["params", "--out", str(out)]) == 0
    assert out.read_text() == markdown()
    assert main(["params", "--out", str(tmp_path)]) == 2
