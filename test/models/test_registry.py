"""The model registry: a model declares itself once, its defaults live in its config dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from dynshape_perception.compiler.build import compile_model
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.config import Bounds, load_models_config
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.models import MODEL_NAMES, model_definition, registry
from dynshape_perception.models.common import (
    Dense,
    FunctionSpec,
    ModelDef,
    ModelSpec,
    TensorSpec,
    dense_ref,
)
from dynshape_perception.models.registry import REGISTRY, ModelKind, parameter_shapes, register
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.executable import LoadedModel


@dataclass(frozen=True)
class ToyConfig:
    width: int = 3
    outputs: int = 2
    gain: float = 0.5


class Toy(nn.Module):
    def __init__(self, config: ToyConfig) -> None:
        self.config = config
        self.out = Dense(config.width, config.outputs)

    def forward(self, rows: nn.Tensor, picks: nn.Tensor) -> nn.Tensor:
        rows_of = op.subtract(picks, op.ones(picks.shape, "int32"))
        return op.take(self.out(rows) * self.config.gain, rows_of, axis=0)


def toy_reference(
    function: str, weights: Mapping[str, np.ndarray], inputs: list[np.ndarray], cfg: ToyConfig
) -> list[np.ndarray]:
    rows, picks = inputs
    scaled = dense_ref(rows, weights, "out") * np.float32(cfg.gain)
    return [scaled[picks.astype(np.int64) - 1].astype(np.float32)]


def toy_definition(bounds: Bounds, config: ToyConfig) -> ModelDef:
    spec = ModelSpec(
        model="toy",
        dims=("N", "M"),
        bounds={"N": bounds.N, "M": bounds.M},
        functions=(
            FunctionSpec(
                "forward",
                (
                    TensorSpec("rows", ("N", config.width)),
                    # 1-based row numbers: the runtime checks them from this rule alone.
                    TensorSpec("picks", ("M",), "int32", count_of="N"),
                ),
                (("M", config.outputs),),
            ),
        ),
    )
    return ModelDef(
        name="toy",
        version="1",
        build_module=lambda gpu: Toy(config),
        spec=spec,
        reference=lambda fn, w, x: toy_reference(fn, w, x, config),
        config=config,
    )


def models_yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def scratch_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "REGISTRY", dict(REGISTRY))


@pytest.mark.usefixtures("scratch_registry")
def test_a_new_model_is_one_module_and_one_yaml_section(tmp_path: Path) -> None:
    register(ModelKind("toy", ToyConfig, toy_definition, yaml_keys={"outputs": "K"}))
    config = load_models_config(models_yaml(tmp_path, "bounds: {N: 16}\ntoy:\n  K: 4\n"))
    model = model_definition("toy", config)
    assert model.config == ToyConfig(outputs=4)
    weights = init_weights(parameter_shapes(model), seed=1)
    runner = LoadedModel(model, compile_model(model, weights, load_profile("x86_64")).executable)
    rng = np.random.default_rng(0)
    for count in (1, 2, 16):
        rows = rng.standard_normal((count, 3)).astype(np.float32)
        picks = rng.integers(1, count + 1, size=5).astype(np.int32)
        got = runner("forward", rows, picks)[0]
        assert got.shape == (5, 4)
        want = model.reference("forward", weights, [rows, picks])[0]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    with pytest.raises(ShapeError, match="above its bound 16"):
        runner("forward", np.zeros((17, 3), np.float32), np.ones(1, np.int32))
    with pytest.raises(InputValueError, match=r"picks must lie in \[1, N=2\], got \[1, 3\]"):
        runner("forward", np.zeros((2, 3), np.float32), np.asarray([1, 3], np.int32))


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_a_model_without_a_yaml_section_takes_its_dataclass_defaults(
    tmp_path: Path, name: str
) -> None:
    model = model_definition(name, load_models_config(models_yaml(tmp_path, "bounds: {}\n")))
    kind = REGISTRY[name]
    assert model.config == kind.config()
    assert model.spec == kind.definition(Bounds(), kind.config()).spec


@pytest.mark.parametrize(
    ("name", "key", "field", "value"),
    [
        ("segmenter", "hidden", "hidden", [16, 24]),
        ("segmenter", "range_scale_m", "range_scale_m", 40.0),
        ("associator", "features", "features", 5),
        ("associator", "hidden", "hidden", 12),
        ("predictor", "K", "hypotheses", 3),
        ("predictor", "H", "horizon", 7),
        ("predictor", "step_s", "step_s", 0.1),
        ("predictor", "hidden", "hidden", 16),
    ],
)
def test_a_yaml_key_sets_its_field_and_every_other_field_keeps_its_default(
    tmp_path: Path, name: str, key: str, field: str, value: object
) -> None:
    path = models_yaml(tmp_path, f"{name}:\n  {key}: {value}\n")
    got = model_definition(name, load_models_config(path)).config
    want_value = tuple(value) if isinstance(value, list) else value
    assert got == dataclasses.replace(REGISTRY[name].config(), **{field: want_value})


def test_an_unknown_key_of_a_model_section_is_a_config_error(tmp_path: Path) -> None:
    path = models_yaml(tmp_path, "predictor:\n  hypotheses: 3\n")
    with pytest.raises(ConfigError, match=r"predictor has unknown keys \['hypotheses'\]; known: H"):
        model_definition("predictor", load_models_config(path))


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ("toy:\n  width: true\n", "toy.width must be an integer, got True"),
        ("toy:\n  gain: [1.0]\n", "toy.gain must be a finite number"),
        ("toy:\n  K: 2.0\n", "toy.K must be an integer, got 2.0"),
        ("toy: [1, 2]\n", "section 'toy' must be a mapping"),
    ],
)
@pytest.mark.usefixtures("scratch_registry")
def test_a_wrongly_typed_value_of_a_registered_model_is_a_config_error(
    tmp_path: Path, section: str, match: str
) -> None:
    register(ModelKind("toy", ToyConfig, toy_definition, yaml_keys={"outputs": "K"}))
    with pytest.raises(ConfigError, match=match):
        model_definition("toy", load_models_config(models_yaml(tmp_path, section)))


@pytest.mark.usefixtures("scratch_registry")
def test_a_second_model_of_one_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="'predictor' is registered already"):
        register(ModelKind("predictor", ToyConfig, toy_definition))


def test_a_config_field_no_yaml_can_set_fails_at_registration() -> None:
    @dataclass(frozen=True)
    class Nested:
        layers: list[int] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"nested\.layers: a model config field is a scalar"):
        ModelKind("nested", Nested, toy_definition)  # type: ignore[arg-type]


def test_an_unknown_model_names_the_registered_ones() -> None:
    with pytest.raises(
        KeyError, match="unknown model 'toy'; expected one of associator, predictor, segmenter"
    ):
        model_definition("toy")
