"""A CPU latency request (Linux PM QoS): how long a sleeping core may take to wake."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from types import TracebackType

from dynshape_perception.errors import ConfigError

DEVICE = Path("/dev/cpu_dma_latency")
# The node parameter's value that makes no request.
LEAVE = -1
# What a node holds unless its parameters say otherwise: idle cores polling.
DEFAULT_CPU_LATENCY_US = 0
MAX_CPU_LATENCY_US = 1_000_000
# The kernel takes and gives the value as a native s32.
_S32 = struct.Struct("=i")


class CpuLatency:
    """A request that idle cores sleep no deeper than a wake-up of ``latency_us``, held
    while this is open; ``close`` (or the end of the process) withdraws it.

    An idle core sleeps in the deepest state whose exit latency fits every open request.
    A message for a thread on a sleeping core waits for it to wake: once per hop between
    nodes, since the receiving node idled while the previous one computed. 0 keeps idle
    cores polling. ``held`` says whether the kernel took the request, ``refused`` why not
    (the device is writable by root only unless a udev rule grants it).
    """

    def __init__(self, latency_us: int, device: Path = DEVICE) -> None:
        if (
            isinstance(latency_us, bool)
            or not isinstance(latency_us, int)
            or not 0 <= latency_us <= MAX_CPU_LATENCY_US
        ):
            raise ConfigError(
                f"a CPU latency request is a whole number of µs in [0, {MAX_CPU_LATENCY_US}], "
                f"got {latency_us!r}"
            )
        self.latency_us = latency_us
        self.device = device
        self.refused = ""
        self._fd: int | None = None
        try:
            fd = os.open(device, os.O_WRONLY)
        except OSError as err:
            self.refused = f"{device}: {err.strerror or err}"
            return
        try:
            os.write(fd, _S32.pack(latency_us))
        except OSError as err:
            os.close(fd)
            self.refused = f"{device}: {err.strerror or err}"
            return
        self._fd = fd

    @property
    def held(self) -> bool:
        return self._fd is not None

    def summary(self) -> str:
        """Held, or refused and why: what a node notes and warns of."""
        if self.held:
            return f"request of {self.latency_us} µs held"
        return (
            f"request of {self.latency_us} µs refused ({self.refused}): idle cores sleep as "
            "deep as the kernel chooses"
        )

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> CpuLatency:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def current_cpu_latency_us(device: Path = DEVICE) -> int | None:
    """What every open request together holds idle cores to, in µs (the kernel's default,
    2,000 s, with none open); None where the device cannot be read."""
    try:
        with open(device, "rb") as f:
            data = f.read(_S32.size)
    except OSError:
        return None
    return _S32.unpack(data)[0] if len(data) == _S32.size else None


def open_requests(device: Path = DEVICE) -> int:
    """How many requests this process holds: its files open on ``device`` (the kernel keeps
    a request exactly as long as its file is open)."""
    target = os.path.realpath(device)
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == target)


def hold_cpu_latency(latency_us: int, device: Path = DEVICE) -> CpuLatency | None:
    """The request of the node parameter's value; None for ``LEAVE`` (-1)."""
    return None if latency_us == LEAVE else CpuLatency(latency_us, device)
