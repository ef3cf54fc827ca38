"""One declaration per parameter: its check, its reader, and that it reaches field and schema."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from dynshape_perception import parameters
from dynshape_perception.config import Bounds, default_bounds
from dynshape_perception.errors import ConfigError
from dynshape_perception.parameters.schema import shared_schema
from dynshape_perception.paramspec import (
    ParamSpec,
    Value,
    check_fields,
    declarations,
    declared,
    derived,
    param,
    read,
    undeclared,
)
from dynshape_perception.perception.scan import SURROUND_ROI, Box, ScanParams
from dynshape_perception.perception.transforms import planar

Readers = Mapping[str, tuple[type, Callable[[Mapping[str, Value]], Any]]]


def _candidates(spec: ParamSpec) -> Iterable[Value]:
    """Values other than the default, nearest first, each within the declared range."""
    if isinstance(spec.default, bool):
        yield not spec.default
    elif isinstance(spec.default, str):
        yield from (c for c in spec.choices if c != spec.default)
        if not spec.choices:
            yield spec.default + "_other"
    else:
        step = 1 if isinstance(spec.default, int) else 0.5 * max(abs(spec.default), 0.01)
        for value in (spec.default + step, spec.default - step, spec.high, spec.low):
            if value is None or value == spec.default:
                continue
            value = type(spec.default)(value)
            if (spec.low is None or value >= spec.low) and (
                spec.high is None or value <= spec.high
            ):
                yield value


def coverage_errors(
    specs: Mapping[str, ParamSpec], readers: Readers, elsewhere: Iterable[str] = ()
) -> list[str]:
    """Why a declared parameter would not reach its dataclass, or a field its declaration.

    Every field of a read dataclass is declared (or says where its value comes from); every
    declared field is a node parameter; and every node parameter under the dataclass' prefix
    or declared on it, set to another valid value, changes what its reader builds, but those
    read ``elsewhere``.
    """
    errors: list[str] = []
    defaults: dict[str, Value] = {name: spec.default for name, spec in specs.items()}
    for prefix, (cls, reader) in readers.items():
        errors += [
            f"{cls.__name__}.{name}: a field with no declaration" for name in undeclared(cls)
        ]
        own = {spec.name for spec in declared(cls, prefix)}
        errors += [f"{name}: declared but no node parameter" for name in sorted(own - set(specs))]
        base = reader(defaults)
        mine = (n for n in specs if n.startswith(f"{prefix}.") or n in own)
        for name in (n for n in mine if n not in elsewhere):
            if not any(_reaches(reader, defaults, name, v, base) for v in _candidates(specs[name])):
                errors.append(f"{name}: reaches no field of {cls.__name__}")
    return errors


def _reaches(
    reader: Callable[[Mapping[str, Value]], Any],
    defaults: Mapping[str, Value],
    name: str,
    value: Value,
    base: Any,
) -> bool:
    try:
        return bool(reader({**defaults, name: value}) != base)
    except ConfigError:
        return False


def schema_errors(specs: Mapping[str, ParamSpec], schema: Mapping[str, Any]) -> list[str]:
    """Parameters that the schema lacks or states otherwise than their declaration."""
    body = schema["definitions"][parameters.schema.SHARED]
    errors = []
    for name, spec in specs.items():
        node: Any = body
        for part in name.split("."):
            node = node.get("properties", {}).get(part)
            if node is None:
                break
        if node is None:
            errors.append(f"{name}: not in the schema")
            continue
        want = {"default": spec.default, "minimum": spec.low, "maximum": spec.high}
        got = {key: node.get(key) for key in want}
        if isinstance(spec.default, bool):
            want.update(minimum=None, maximum=None)
        if got != want or (spec.choices and node.get("enum") != list(spec.choices)):
            errors.append(f"{name}: the schema says {got}, the declaration {want}")
    return errors


# -- the tree ------------------------------------------------------------------------------
def test_every_declared_parameter_reaches_its_dataclass_field() -> None:
    specs, readers = parameters.all_specs(), parameters.DATACLASS_READERS
    assert coverage_errors(specs, readers, parameters.NOT_IN_DATACLASS) == []
    assert set(parameters.NOT_IN_DATACLASS) <= set(specs)


def test_every_parameter_is_in_the_schema_as_declared() -> None:
    assert schema_errors(parameters.all_specs(), shared_schema()) == []


def test_the_groups_are_the_dataclass_declarations() -> None:
    groups = {spec.name for group in parameters.GROUPS.values() for spec in group}
    for prefix, (cls, _) in parameters.DATACLASS_READERS.items():
        names = {spec.name for spec in declared(cls, prefix)}
        assert names <= groups, cls.__name__


# -- seeded breaches -----------------------------------------------------------------------
@dataclass(frozen=True)
class Seeded:
    gain: float = param(1.0, "a gain", low=0.0, high=2.0)
    mode: str = param("a", "a mode", read_only=True, choices=("a", "b"))
    size: int = derived("its default", 3)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class SeededBare:
    gain: float = param(1.0, "a gain", low=0.0, high=2.0)
    size: int = 3


@dataclass(frozen=True)
class SeededPrefixed:
    gain: float = param(1.0, "a gain", low=0.0, high=2.0)
    lag_s: float = param(0.5, "a lag", low=0.0, high=1.0, prefix="other")


def _read_seeded(values: Mapping[str, Value]) -> Seeded:
    return read(Seeded, values, "seeded")


def _specs(*specs: ParamSpec) -> dict[str, ParamSpec]:
    return {spec.name: spec for spec in specs}


def test_the_seeded_declarations_pass() -> None:
    specs = _specs(*declared(Seeded, "seeded"))
    assert coverage_errors(specs, {"seeded": (Seeded, _read_seeded)}) == []


def _bare() -> list[str]:
    return coverage_errors(
        _specs(*declared(SeededBare, "bare")),
        {"bare": (SeededBare, lambda v: read(SeededBare, v, "bare"))},
    )


def _no_field() -> list[str]:
    extra = ParamSpec("seeded.width_m", 1.0, "no field")
    return coverage_errors(
        _specs(*declared(Seeded, "seeded"), extra), {"seeded": (Seeded, _read_seeded)}
    )


def _not_a_node_parameter() -> list[str]:
    return coverage_errors(
        _specs(*declared(Seeded, "seeded")[1:]), {"seeded": (Seeded, _read_seeded)}
    )


def _dropped() -> list[str]:
    return coverage_errors(
        _specs(*declared(Seeded, "seeded")), {"seeded": (Seeded, lambda v: Seeded())}
    )


def _dropped_own_prefix() -> list[str]:
    def reader(values: Mapping[str, Value]) -> SeededPrefixed:
        mine = {k: v for k, v in values.items() if k.startswith("seeded.")}
        return read(SeededPrefixed, mine, "seeded")

    specs = _specs(*declared(SeededPrefixed, "seeded"))
    return coverage_errors(specs, {"seeded": (SeededPrefixed, reader)})


def _not_in_schema() -> list[str]:
    extra = ParamSpec("tracking.spare_m", 1.0, "x")
    return schema_errors({**parameters.all_specs(), extra.name: extra}, shared_schema())


def _other_range() -> list[str]:
    other = ParamSpec("tiers.max_queue_depth", 32, "x", low=1, high=100)
    return schema_errors({**parameters.all_specs(), other.name: other}, shared_schema())


BREACHES: dict[str, tuple[Callable[[], list[str]], str]] = {
    "a field with no declaration": (_bare, "SeededBare.size: a field with no declaration"),
    "a declaration with no field": (_no_field, "seeded.width_m: reaches no field of Seeded"),
    "a declared field no node declares": (_not_a_node_parameter, "seeded.gain: declared but"),
    "a reader that drops a value": (_dropped, "seeded.gain: reaches no field of Seeded"),
    "a reader that drops a field of its own prefix": (
        _dropped_own_prefix,
        "other.lag_s: reaches no field of SeededPrefixed",
    ),
    "a parameter missing from the schema": (_not_in_schema, "tracking.spare_m: not in the"),
    "a schema range other than declared": (_other_range, "tiers.max_queue_depth: the schema"),
}


@pytest.mark.parametrize("breach", BREACHES)
def test_a_seeded_breach_fails(breach: str) -> None:
    errors, reason = BREACHES[breach][0](), BREACHES[breach][1]
    assert any(e.startswith(reason) for e in errors), errors


# -- the declaration, its check and its reader -------------------------------------------------
def test_read_only_is_a_keyword() -> None:
    with pytest.raises(TypeError):
        ParamSpec("a", 1.0, "x", True)  # type: ignore[misc]
    assert ParamSpec("a", 1.0, "x", read_only=True).read_only


@pytest.mark.parametrize(
    ("value", "strict", "match"),
    [
        (2, True, "seeded.gain must be float, got 2"),
        ("2", False, "seeded.gain must be a number"),
        (True, False, "seeded.gain must be a number"),
        (math.inf, False, "must be finite"),
        (2.5, False, "must be <= 2.0"),
        (-0.5, True, "must be >= 0.0"),
    ],
)
def test_a_bad_value_gets_its_reason(value: Any, strict: bool, match: str) -> None:
    spec = declared(Seeded, "seeded")[0]
    with pytest.raises(ConfigError, match=match):
        spec.check(value, strict=strict)


def test_the_dataclass_checks_its_declared_fields_with_their_names() -> None:
    with pytest.raises(ConfigError, match=r"gain must be <= 2\.0"):
        Seeded(gain=3.0)
    with pytest.raises(ConfigError, match=r"mode must be one of \['a', 'b'\]"):
        Seeded(mode="c")
    assert Seeded(gain=2) == Seeded(gain=2.0)


def test_the_reader_takes_its_prefix_only_and_makes_ints_floats() -> None:
    got = read(Seeded, {"seeded.gain": 2, "other.mode": "b", "mode": "b"}, "seeded")
    assert got == Seeded(gain=2.0) and isinstance(got.gain, float)
    with pytest.raises(ConfigError, match=r"gain must be >= 0\.0"):
        read(Seeded, {"seeded.gain": -1.0}, "seeded")


@dataclass(frozen=True)
class SeededOff:
    threads: int | None = param(2, "threads; 0: left as they are", low=0, high=8, none_if=0)

    def __post_init__(self) -> None:
        check_fields(self)


def test_a_none_if_field_is_none_in_the_library_and_its_off_value_reads_as_none() -> None:
    assert SeededOff().threads is None
    assert declarations(SeededOff)["threads"].default == 2
    assert read(SeededOff, {"off.threads": 3}, "off").threads == 3
    assert read(SeededOff, {"off.threads": 0}, "off").threads is None
    with pytest.raises(ConfigError, match="threads must be <= 8"):
        read(SeededOff, {"off.threads": 9}, "off")


def test_the_executor_parameters_default_to_the_nodes_and_zero_turns_them_off() -> None:
    specs = parameters.all_specs()
    defaults = {name: spec.default for name, spec in specs.items()}
    options = parameters.executor_options(defaults)
    assert (options.reserved_rt_priority, options.switch_interval_ms) == (10, 2.0)
    off = parameters.executor_options({**defaults, "executor.blas_threads": 0})
    assert off.blas_threads is None and off.opencv_threads == 1


def test_the_bounds_parameters_default_to_and_stop_at_the_compiled_bounds() -> None:
    specs = parameters.all_specs()
    compiled = default_bounds()
    for dim, spec in declarations(Bounds).items():
        node = specs[f"bounds.{spec.name}"]
        assert node.default == node.high == getattr(compiled, dim), node.name
        assert node.description.startswith(spec.description + "; at most the compiled bound")
    lowered = parameters.bounds_from({"bounds.max_agents": 3})
    assert lowered == replace(compiled, A=3)


def test_a_field_of_its_own_prefix_is_declared_and_read_under_it() -> None:
    assert [s.name for s in declared(SeededPrefixed, "seeded")] == ["seeded.gain", "other.lag_s"]
    only = declared(SeededPrefixed, "seeded", fields=("lag_s",))
    assert [s.name for s in only] == ["other.lag_s"]
    got = read(SeededPrefixed, {"other.lag_s": 0.25, "seeded.lag_s": 0.75}, "seeded")
    assert got.lag_s == 0.25
    whole = _specs(*declared(SeededPrefixed, "seeded"))
    read_all = {"seeded": (SeededPrefixed, lambda v: read(SeededPrefixed, v, "seeded"))}
    assert coverage_errors(whole, read_all) == []


def test_the_scan_parameters_build_the_crop_of_the_pipeline() -> None:
    defaults = {name: spec.default for name, spec in parameters.all_specs().items()}
    crop = parameters.scan_params(defaults)
    assert crop == ScanParams(SURROUND_ROI, None, 0.5)
    ego = parameters.scan_params({**defaults, "scan.crop_ego": True, "scan.ego_x_max_m": 5})
    assert ego is not None and ego.ego == Box((-1.0, 5.0), (-1.0, 1.0), (-0.5, 2.0))
    with pytest.raises(ConfigError, match=r"roi x_m must be finite with min < max"):
        parameters.scan_params({**defaults, "scan.roi_x_min_m": 70.0})


def test_the_mount_parameters_are_the_fallback_mount() -> None:
    defaults = {name: spec.default for name, spec in parameters.all_specs().items()}
    frames = parameters.frame_params({**defaults, "frames.mount_z_m": 1.5})
    np.testing.assert_array_equal(frames.fallback_mount.matrix(), planar(z=1.5))
    assert parameters.frame_params({"odometry.max_extrapolation_s": 2}).max_extrapolation_s == 2.0
