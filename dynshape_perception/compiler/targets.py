"""Target profiles from ``config/targets/*.yaml``."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.config import read_yaml
from dynshape_perception.errors import ConfigError
from dynshape_perception.resources import config_path

NATIVE_CPU = "native"


@dataclass(frozen=True)
class TargetProfile:
    name: str
    target_spec: dict[str, Any]
    cross_compiler: str | None = None
    cuda_arch: str | None = None

    @property
    def kind(self) -> str:
        return str(self.target_spec["kind"])

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def host_arch(self) -> str:
        host = self.target_spec.get("host", self.target_spec)
        return "aarch64" if str(host.get("mtriple", "")).startswith("aarch64") else "x86_64"

    @property
    def host_is_native(self) -> bool:
        """Whether this profile's host code runs on the host (a Jetson runs aarch64)."""
        return self.host_arch == platform.machine()

    def resolved_spec(self) -> dict[str, Any]:
        """The target dict with ``mcpu: native`` replaced by the host's CPU name."""

        def resolve(spec: dict[str, Any]) -> dict[str, Any]:
            out = dict(spec)
            if out.get("mcpu") == NATIVE_CPU:
                out["mcpu"] = tvmx.system_cpu()
            if isinstance(out.get("host"), dict):
                out["host"] = resolve(out["host"])
            return out

        return resolve(self.target_spec)

    def target(self) -> tvmx.Target:
        return tvmx.make_target(self.resolved_spec())

    def key(self) -> str:
        """Exact target identity for cache keys: another CPU must never reuse this build."""
        return json.dumps(self.resolved_spec(), sort_keys=True)


def targets_dir() -> Path:
    return config_path("targets")


def available_profiles() -> list[str]:
    return sorted(p.stem for p in targets_dir().glob("*.yaml"))


def load_profile(name: str) -> TargetProfile:
    # Look the name up first: a name like "../x" or 300 characters never reaches the filesystem.
    if name not in available_profiles():
        raise ConfigError(
            f"unknown target profile {name!r}; available: {', '.join(available_profiles())}"
        )
    path = targets_dir() / f"{name}.yaml"
    raw = read_yaml(path, "target profile")
    try:
        return TargetProfile(
            name=str(raw["name"]),
            target_spec=dict(raw["target"]),
            cross_compiler=raw.get("cross_compiler"),
            cuda_arch=raw.get("cuda_arch"),
        )
    except (KeyError, TypeError) as err:
        raise ConfigError(f"invalid target profile {path}: {err}") from err
