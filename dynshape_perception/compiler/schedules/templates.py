"""Hand-written kernel templates, re-instantiated with each target's register blocking."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.schedules.context import CpuScheduleContext
from dynshape_perception.errors import CompileError

# A template kernel names its factory ("package.module:function") and the parameters it was
# built with; the factory rebuilds it for a schedule context with the same signature.
TEMPLATE_ATTR = "dynshape.template"
PARAMS_ATTR = "dynshape.params"
_TRUSTED_PREFIX = "dynshape_perception."

Factory = Callable[[Mapping[str, Any], CpuScheduleContext], tvmx.PrimFunc]


def template_of(func: tvmx.PrimFunc) -> str | None:
    value = tvmx.func_attr(func, TEMPLATE_ATTR)
    return None if value is None else str(value)


def load_factory(path: str) -> Factory:
    module_name, _, attr = path.partition(":")
    if not module_name.startswith(_TRUSTED_PREFIX) or not attr:
        raise CompileError(f"kernel template {path!r} is not a dynshape_perception factory")
    factory: Factory = getattr(importlib.import_module(module_name), attr)
    return factory


def template_rule(func: tvmx.PrimFunc, ctx: CpuScheduleContext) -> tvmx.PrimFunc | None:
    """The template kernel rebuilt for ``ctx``; None for any other function."""
    path = template_of(func)
    if path is None:
        return None
    params = tvmx.to_python(tvmx.func_attr(func, PARAMS_ATTR) or {})
    rebuilt = load_factory(path)(params, ctx)
    if not tvmx.same_signature(func, rebuilt):
        raise CompileError(f"kernel template {path} changed its signature for {ctx.isa}")
    return rebuilt
