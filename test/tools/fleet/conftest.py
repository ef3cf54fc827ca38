"""Fixtures of the fleet tests: a network namespace with only loopback, a real two-node Ray
cluster inside it, and a private PostgreSQL server; each stopped, and its processes gone,
when the tests that use it are done."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest

BIN = Path(sys.executable).parent
STARTED = "Ray runtime started."
START_TIMEOUT_S = 180.0
_names = itertools.count()


def _required(why: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}; CI=true requires it (make test installs it)")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Namespace:
    """A network namespace of the test's own with only ``lo`` up: whatever Ray binds or
    dials in it stays on this namespace's loopback."""

    name: str

    def pids(self) -> list[int]:
        out = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False
        )
        return [int(p) for p in out.stdout.split()]

    def command(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def end_processes(self, grace_s: float = 20.0) -> list[int]:
        """SIGKILL whatever still runs in the namespace (all of it started by the test);
        returns what was found after ``grace_s``."""
        deadline = time.monotonic() + grace_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = self.pids()
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return left


class Namespaces:
    """Makes namespaces; ``close`` ends what runs in them and deletes them."""

    def __init__(self) -> None:
        self.made: list[Namespace] = []

    def new(self) -> Namespace:
        ns = Namespace(f"dsp-{os.getpid()}-{next(_names)}")
        subprocess.run(["ip", "netns", "add", ns.name], check=True, capture_output=True)
        self.made.append(ns)
        subprocess.run(ns.command(["ip", "link", "set", "lo", "up"]), check=True)
        return ns

    def close(self) -> None:
        for ns in self.made:
            ns.end_processes(grace_s=0.0)
            subprocess.run(["ip", "netns", "del", ns.name], check=False, capture_output=True)


@pytest.fixture(scope="module")
def namespaces() -> Iterator[Namespaces]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        _required("network namespaces need root and iproute2")
    made = Namespaces()
    yield made
    made.close()


@pytest.fixture(scope="module")
def ray_env() -> Iterator[dict[str, str]]:
    """What every Ray process of a test gets: token authentication with a shared token,
    no usage reports, and a short temp folder (Ray's socket paths must stay short)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        _required("Ray is not installed (requirements-fleet.txt)")
    temp = tempfile.mkdtemp(prefix="dspray", dir="/tmp")
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(16),
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_TMPDIR": temp,
        "PYTHONUNBUFFERED": "1",
    }
    yield env
    shutil.rmtree(temp, ignore_errors=True)


@dataclass
class RayCluster:
    ns: Namespace
    address: str
    env: dict[str, str]
    nodes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cli(self, args: Sequence[str], timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """``dynshape-perception ARGS`` inside the cluster's namespace."""
        return subprocess.run(
            self.popen_args(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def popen_args(self, args: Sequence[str]) -> list[str]:
        return self.ns.command([sys.executable, "-m", "dynshape_perception.cli.main", *args])


def _wait_started(log: Path, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if STARTED in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise AssertionError(f"{what} did not start:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def ray_cluster(
    namespaces: Namespaces, ray_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RayCluster]:
    """A head node and a second node, each with one CPU and a resource of its own, started
    with ``ray start --block`` (which stops its node's processes on SIGTERM)."""
    ns = namespaces.new()
    port = _free_port()
    cluster = RayCluster(ns, f"127.0.0.1:{port}", ray_env)
    logs = tmp_path_factory.mktemp("ray-logs")
    temp = ray_env["RAY_TMPDIR"]
    common = [
        "--block",
        "--node-ip-address=127.0.0.1",
        "--num-cpus=1",
        "--object-store-memory=80000000",
        "--disable-usage-stats",
    ]
    heads = [
        str(BIN / "ray"),
        "start",
        "--head",
        f"--port={port}",
        "--include-dashboard=false",
        f"--temp-dir={temp}",
        '--resources={"head_node": 1}',
        *common,
    ]
    second = [
        str(BIN / "ray"),
        "start",
        f"--address={cluster.address}",
        '--resources={"second_node": 1}',
        *common,
    ]
    try:
        for argv, name in ((heads, "head"), (second, "second")):
            log = logs / f"{name}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen(
                    ns.command(argv), env=ray_env, stdout=out, stderr=subprocess.STDOUT
                )
            cluster.nodes.append(proc)
            _wait_started(log, proc, f"the {name} node")
        yield cluster
    finally:
        for proc in reversed(cluster.nodes):
            proc.send_signal(signal.SIGTERM)
        for proc in reversed(cluster.nodes):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        left = ns.end_processes()
        assert not left, f"Ray processes outlived the cluster: {left}"


def _postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if found:
        return found[-1].parent
    pg_ctl = shutil.which("pg_ctl")
    return Path(pg_ctl).parent if pg_ctl else None


@pytest.fixture(scope="module")
def postgres() -> Iterator[dict[str, str]]:
    """A PostgreSQL server of Debian's packages in a temporary folder, on a private port of
    127.0.0.1 and a socket in that folder, run as ``nobody`` (the server refuses root).
    Yields the URLs of its database ``tune`` over TCP and over the socket."""
    bindir = _postgres_bin()
    if bindir is None or os.geteuid() != 0:
        _required("PostgreSQL (Debian's postgresql) and root to run it as nobody")
    root = Path(tempfile.mkdtemp(prefix="dsppg", dir="/tmp"))
    shutil.chown(root, "nobody", "nogroup")
    data, port = root / "data", _free_port()

    def as_nobody(*argv: str) -> None:
        subprocess.run(
            ["runuser", "-u", "nobody", "--", *argv],
            check=True,
            capture_output=True,
            cwd=root,
            timeout=120,
        )

    try:
        as_nobody(str(bindir / "initdb"), "-D", str(data), "-U", "tuner", "--auth=trust", "-N")
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        as_nobody(
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(root / "log"),
            "-o",
            options,
            "-w",
            "start",
        )
        as_nobody(
            str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "tuner", "tune"
        )
        yield {
            "tcp": f"postgresql://tuner@127.0.0.1:{port}/tune",
            "socket": f"postgresql://tuner@/tune?host={root}&port={port}",
        }
    finally:
        if (data / "postmaster.pid").exists():
            as_nobody(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(root, ignore_errors=True)
