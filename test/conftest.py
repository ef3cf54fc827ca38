"""Shared fixtures: the real data in ../shared/data (skipped when absent, required under CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynshape_perception.resources import shared_data_dir
from dynshape_perception.testing.processes import dds_settings

# Fast DDS reads its transports and profile once per process, when the first participant of
# any test starts: set here, before every test, so that no order of tests leaves this process
# without the large-data transport (clouds would then never reach an in-process probe).
for _key, _value in dds_settings().items():
    os.environ.setdefault(_key, _value)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("../shared/data is missing, and CI=true requires it")
        pytest.skip("../shared/data is absent")
    return path


@pytest.fixture(scope="session")
def kitti_bin(shared_data: Path) -> Path:
    return shared_data / "lidar" / "kitti_000008.bin"


@pytest.fixture(scope="session")
def eth_file(shared_data: Path) -> Path:
    return shared_data / "eth_ucy" / "biwi_eth.txt"


@pytest.fixture(scope="session")
def hotel_file(shared_data: Path) -> Path:
    return shared_data / "eth_ucy" / "biwi_hotel.txt"


@pytest.fixture(scope="session")
def cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One artefact cache for the whole session, so each model compiles once."""
    return tmp_path_factory.mktemp("artefacts")
