"""One parameter declared once: its spec, the check of a value, and the reader into a dataclass."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, TypeVar

from dynshape_perception.errors import ConfigError

Value = bool | int | float | str
# Where a dataclass field keeps its declaration (dataclasses.Field.metadata).
PARAM = "dynshape_perception.param"
# A field that is no parameter of its own says where its value comes from instead.
DERIVED = "dynshape_perception.derived"
# The parameter value that stands for the field's None (a ROS parameter has no None).
NONE_IF = "dynshape_perception.none_if"
# A field's own prefix, where its parameter belongs to another group than its dataclass'.
PREFIX = "dynshape_perception.prefix"
# Upper bounds shared by many declarations: they stop absurd values, not tune anything.
MAX_COUNT = 1_000_000
MAX_RANGE_M = 500.0
MAX_STAMP_TOLERANCE_S = 3600.0
# Parameters that take None in the core (leave a thread or the interpreter as it is) are 0
# here: a ROS parameter has one fixed type.
OFF = 0
_WORDS = {bool: "a bool", int: "an integer", float: "a number", str: "a string"}

D = TypeVar("D")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its default also fixes its type (rclpy rejects other types)."""

    name: str
    default: Value
    description: str
    _: KW_ONLY
    read_only: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()

    def check(self, value: Any, *, strict: bool = True, name: str | None = None) -> None:
        """Raise ConfigError unless ``value`` fits.

        ``strict``: the type exactly as rclpy holds it (an int is no double), as a ROS
        parameter arrives; otherwise as a dataclass field takes it (an int is a number).
        """
        name = name or self.name
        kind = type(self.default)
        if strict and type(value) is not kind:
            raise ConfigError(f"{name} must be {kind.__name__}, got {value!r}")
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        fits = {
            bool: isinstance(value, bool),
            int: is_number and isinstance(value, int),
            float: is_number,
            str: isinstance(value, str),
        }[kind]
        if not fits:
            raise ConfigError(f"{name} must be {_WORDS[kind]}, got {value!r}")
        if self.choices and value not in self.choices:
            raise ConfigError(f"{name} must be one of {list(self.choices)}, got {value!r}")
        if is_number:
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{name} must be finite, got {value!r}")
            if self.low is not None and value < self.low:
                raise ConfigError(f"{name} must be >= {self.low}, got {value!r}")
            if self.high is not None and value > self.high:
                raise ConfigError(f"{name} must be <= {self.high}, got {value!r}")


def param(
    default: Value,
    description: str,
    *,
    read_only: bool = False,
    low: float | None = None,
    high: float | None = None,
    choices: tuple[str, ...] = (),
    key: str = "",
    prefix: str = "",
    none_if: Value | None = None,
) -> Any:
    """A dataclass field that is a node parameter; ``key`` names it where the field's own
    name would not read well in the YAML (the default: the field's name), ``prefix`` where
    it belongs to another group than the rest of its dataclass.

    ``none_if``: the field is None unless set (the library leaves that setting alone), the
    node's default is ``default``, and the parameter value ``none_if`` reads as None.
    """
    spec = ParamSpec(
        key, default, description, read_only=read_only, low=low, high=high, choices=choices
    )
    metadata: dict[str, Any] = {PARAM: spec}
    if prefix:
        metadata[PREFIX] = prefix
    if none_if is None:
        return dataclasses.field(default=default, metadata=metadata)
    metadata[NONE_IF] = none_if
    return dataclasses.field(default=None, metadata=metadata)


def derived(source: str, default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field that no parameter sets directly; ``source`` says what does."""
    return dataclasses.field(default=default, metadata={DERIVED: source}, **kwargs)


def declarations(cls: type) -> dict[str, ParamSpec]:
    """Field name → its declaration, named by its key alone, in field order."""
    return {
        f.name: dataclasses.replace(spec, name=spec.name or f.name)
        for f in dataclasses.fields(cls)
        if (spec := f.metadata.get(PARAM)) is not None
    }


def full_names(cls: type, prefix: str) -> dict[str, str]:
    """Field name → its parameter's name: ``<prefix>.<key>``, the field's own prefix first."""
    return {
        f.name: f"{f.metadata.get(PREFIX, prefix)}.{f.metadata[PARAM].name or f.name}"
        for f in dataclasses.fields(cls)
        if PARAM in f.metadata
    }


def declared(
    cls: type, prefix: str, note: str = "", fields: tuple[str, ...] = ()
) -> tuple[ParamSpec, ...]:
    """The parameters of ``cls`` as the nodes declare them (those of ``fields`` alone where
    given, for a dataclass whose parameters fall in several groups)."""
    suffix = f" ({note})" if note else ""
    names = full_names(cls, prefix)
    return tuple(
        dataclasses.replace(spec, name=names[field], description=spec.description + suffix)
        for field, spec in declarations(cls).items()
        if not fields or field in fields
    )


def undeclared(cls: type) -> list[str]:
    """Fields that are neither a parameter nor say where their value comes from."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if PARAM not in f.metadata and DERIVED not in f.metadata
    ]


def check_fields(obj: Any, label: str = "") -> None:
    """The one check of a dataclass' declared fields, run by its ``__post_init__``;
    ``label`` starts each field's name in a message."""
    off = _none_ifs(type(obj))
    for name, spec in declarations(type(obj)).items():
        value = getattr(obj, name)
        if not (value is None and name in off):
            spec.check(value, strict=False, name=label + name)


def _none_ifs(cls: type) -> dict[str, Value]:
    return {f.name: f.metadata[NONE_IF] for f in dataclasses.fields(cls) if NONE_IF in f.metadata}


def read_values(cls: type, values: Mapping[str, Value], prefix: str) -> dict[str, Any]:
    """Field name → value of the ``<prefix>.<key>`` entries of a flat parameter mapping (ROS
    parameters, a YAML's ros__parameters); other names are not the dataclass'."""
    picked: dict[str, Any] = {}
    off = _none_ifs(cls)
    names = full_names(cls, prefix)
    for name, spec in declarations(cls).items():
        full = names[name]
        if full not in values:
            continue
        value: Any = values[full]
        # YAML hands over 10 for 10.0; an int where a float is declared is that float.
        if isinstance(spec.default, float) and type(value) is int:
            value = float(value)
        picked[name] = None if name in off and value == off[name] else value
    return picked


def read(cls: type[D], values: Mapping[str, Value], prefix: str, base: D | None = None) -> D:
    """``base`` (else the defaults) with the parameters of ``cls`` among ``values`` applied."""
    start: Any = base if base is not None else cls()
    out: D = dataclasses.replace(start, **read_values(cls, values, prefix))
    return out
