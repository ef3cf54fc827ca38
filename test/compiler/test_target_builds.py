"""Every target profile builds and exports: x86, AArch64 (ELF check) and both CUDA profiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.targets import available_profiles, load_profile
from dynshape_perception.compiler.tvm_adapter import system_cpu
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights

EM_X86_64 = 62
EM_AARCH64 = 183


def e_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF", f"{path} is not an ELF file"
    return int.from_bytes(head[18:20], "little")


def test_profiles_are_the_documented_four_plus_portable_x86() -> None:
    assert set(available_profiles()) >= {
        "x86_64",
        "x86_64-v3",
        "aarch64",
        "cuda-orin",
        "cuda-hopper",
    }


def test_native_cpu_is_resolved_into_the_target_key() -> None:
    spec = load_profile("x86_64").resolved_spec()
    assert spec["mcpu"] == system_cpu() != "native"


def test_unknown_profile_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="unknown target profile 'riscv'"):
        load_profile("riscv")


@pytest.mark.parametrize(
    ("profile", "machine"),
    [("aarch64", EM_AARCH64), ("cuda-orin", EM_AARCH64), ("cuda-hopper", EM_X86_64)],
)
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cross_targets_build_and_export(
    cache_root: Path, profile: str, machine: int, name: str
) -> None:
    model = model_definition(name)
    weights = init_weights(parameter_shapes(model), seed=0)
    artefact = ArtefactCache(cache_root).get_or_build(model, weights, load_profile(profile))
    assert e_machine(artefact.library_path) == machine
    assert artefact.sidecar.target == profile
    if profile.startswith("cuda"):
        assert set(artefact.sidecar.schedule.values()) == {"dlight.gpu"}
        # GPU schedules choose by extents: a specialisation may compile other code there.
        assert not artefact.sidecar.shape_invariant
