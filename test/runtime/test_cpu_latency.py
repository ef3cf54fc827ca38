"""A CPU latency request holds idle cores to a wake-up latency while it is open."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.runtime.cpu_latency import (
    DEVICE,
    LEAVE,
    MAX_CPU_LATENCY_US,
    CpuLatency,
    current_cpu_latency_us,
    hold_cpu_latency,
    open_requests,
)

writable = pytest.mark.skipif(not os.access(DEVICE, os.W_OK), reason=f"no write access to {DEVICE}")


@pytest.mark.parametrize("value", [-1, MAX_CPU_LATENCY_US + 1, True, 2.0, "0"])
def test_a_request_outside_its_range_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="whole number of µs"):
        CpuLatency(value, DEVICE)  # type: ignore[arg-type]


def test_leave_makes_no_request() -> None:
    assert hold_cpu_latency(LEAVE) is None


def test_the_request_is_one_native_s32(tmp_path: Path) -> None:
    device = tmp_path / "device"
    device.write_bytes(b"")
    with CpuLatency(1234, device) as request:
        assert request.held and not request.refused
        assert open_requests(device) == 1
    assert not request.held and open_requests(device) == 0
    assert device.read_bytes() == struct.pack("=i", 1234)


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_a_device_that_takes_no_request_is_refused_with_its_reason(
    tmp_path: Path, kind: str
) -> None:
    device = tmp_path / "device"
    if kind == "folder":
        device.mkdir()
    request = CpuLatency(0, device)
    assert not request.held
    assert str(device) in request.refused
    request.close()
    assert current_cpu_latency_us(tmp_path / "missing") is None


@writable
def test_the_kernel_holds_each_open_request_until_it_is_closed() -> None:
    """Other processes may hold requests of their own meanwhile (the kernel keeps the lowest
    of all): the value is checked as an upper bound, the withdrawal by the file's close."""
    before = open_requests()
    with CpuLatency(7) as outer:
        assert outer.held and open_requests() == before + 1
        current = current_cpu_latency_us()
        assert current is not None and current <= 7
        with CpuLatency(2):
            current = current_cpu_latency_us()
            assert current is not None and current <= 2
            assert open_requests() == before + 2
        assert open_requests() == before + 1
    assert not outer.held and open_requests() == before
