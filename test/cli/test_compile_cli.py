"""``compile --ir-hash``: each model's IR hash for a target, as the artefact cache keys it."""

from __future__ import annotations

import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.compiler.build import hashed_module
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.models.registry import committed_weights


@pytest.mark.parametrize("target", ["x86_64", "cuda-orin"])
def test_ir_hash_prints_the_cache_key_hash_of_every_model(
    target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compile", "--ir-hash", "--target", target]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    profile = load_profile(target)
    expected = []
    for name in MODEL_NAMES:
        model, weights = committed_weights(name)
        expected.append([name, target, hashed_module(model, weights, profile, None, None, None)[2]])
    assert rows == expected


def test_ir_hash_of_one_model_and_compile_without_out(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "--ir-hash", "--model", "associator"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == ["associator"]
    assert main(["compile", "--model", "associator"]) == 2
    assert "compile needs --out" in capsys.readouterr().err
