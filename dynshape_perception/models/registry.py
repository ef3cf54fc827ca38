"""The model registry: each model module declares itself once; definitions come from here."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from dynshape_perception.config import Bounds, ModelsConfig, default_config, integer, number
from dynshape_perception.errors import ConfigError
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.weights import load_weights

C = TypeVar("C")
_SCALARS = (bool, int, float, str)


@dataclass(frozen=True)
class ModelKind(Generic[C]):
    """One model: its name, its config dataclass (which holds every default) and how a config
    becomes a definition. Its ``config/models.yaml`` section sets the dataclass' fields."""

    name: str
    config: type[C]
    definition: Callable[[Bounds, C], ModelDef]
    # Fields whose YAML key differs from the field's name (the spec's letters, K for
    # hypotheses), as {field: key}.
    yaml_keys: Mapping[str, str] = field(default_factory=dict)
    # Keys of the section that other code reads, not the config.
    other_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A field of an unreadable type would only fail when a YAML sets it: fail at import.
        for name, kind in self._field_types().items():
            _check_readable(f"{self.name}.{name}", kind)
        unknown = set(self.yaml_keys) - set(self._field_types())
        if unknown:
            raise TypeError(f"{self.name}: yaml_keys names no field {sorted(unknown)}")

    def _field_types(self) -> dict[str, Any]:
        if not dataclasses.is_dataclass(self.config):
            raise TypeError(f"{self.name}: the config must be a dataclass")
        hints = typing.get_type_hints(self.config)
        return {f.name: hints[f.name] for f in dataclasses.fields(self.config) if f.init}

    def config_from(self, section: Mapping[str, Any]) -> C:
        """The config a YAML section sets; fields it leaves out keep the dataclass' default."""
        types_by_key = {self.yaml_keys.get(n, n): (n, t) for n, t in self._field_types().items()}
        unknown = set(section) - set(types_by_key) - set(self.other_keys)
        if unknown:
            known = sorted({*types_by_key, *self.other_keys})
            raise ConfigError(
                f"models.yaml {self.name} has unknown keys {sorted(map(str, unknown))}; "
                f"known: {', '.join(known)}"
            )
        values = {
            name: _read(f"{self.name}.{key}", kind, section[key])
            for key, (name, kind) in types_by_key.items()
            if key in section
        }
        return self.config(**values)


REGISTRY: dict[str, ModelKind[Any]] = {}


def register(kind: ModelKind[C]) -> ModelKind[C]:
    if kind.name in REGISTRY:
        raise ConfigError(f"a model named {kind.name!r} is registered already")
    REGISTRY[kind.name] = kind
    return kind


def model_definition(name: str, config: ModelsConfig | None = None) -> ModelDef:
    """The definition of one model with shapes and bounds from ``config/models.yaml``."""
    kind = REGISTRY.get(name)
    if kind is None:
        raise KeyError(f"unknown model {name!r}; expected one of {', '.join(REGISTRY)}")
    cfg = config or default_config()
    return kind.definition(cfg.bounds, kind.config_from(cfg.section(name)))


def parameter_shapes(model: ModelDef) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the ``nn.Module`` parameters, in export order."""
    module = model.build_module(False)
    return {name: tuple(int(d) for d in p.shape) for name, p in module.named_parameters()}


def committed_weights(
    name: str, directory: Path | None = None
) -> tuple[ModelDef, dict[str, np.ndarray]]:
    model = model_definition(name)
    return model, load_weights(name, parameter_shapes(model), directory)


def _check_readable(name: str, kind: Any) -> None:
    if kind in _SCALARS:
        return
    args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple and args and all(a in _SCALARS for a in args if a != ...):
        return
    raise TypeError(f"{name}: a model config field is a scalar or a tuple of them, not {kind}")


def _read(name: str, kind: Any, value: object) -> Any:
    if typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        variadic = len(args) == 2 and args[1] is Ellipsis
        if not isinstance(value, list) or (not variadic and len(value) != len(args)):
            size = "a list" if variadic else f"a list of {len(args)}"
            raise ConfigError(f"models.yaml {name} must be {size} values, got {value!r}")
        items = args[:1] * len(value) if variadic else args
        return tuple(_read(name, k, v) for k, v in zip(items, value, strict=True))
    if kind is int:
        return integer(name, value)
    if kind is float:
        return number(name, value)
    if not isinstance(value, kind):
        raise ConfigError(f"{name} must be a {kind.__name__}, got {value!r}")
    return value
