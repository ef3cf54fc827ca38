"""Node executables as separate processes, as ``ros2 run`` starts them, on a private DDS domain."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

from dynshape_perception.errors import ConfigError
from dynshape_perception.interrupts import STACKS_SIGNAL
from dynshape_perception.procfs import GONE_STATES, stat_fields
from dynshape_perception.resources import PACKAGE, config_path

if TYPE_CHECKING:
    from rclpy.context import Context

# Fast DDS ports grow with the domain id; ids above 101 can collide with ephemeral ports.
DOMAIN_IDS = range(1, 102)
DDS_ENV = {
    # Keep discovery and traffic on this host.
    "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
    # Shared memory plus TCP: best-effort subscribers of large clouds get nothing otherwise.
    "FASTDDS_BUILTIN_TRANSPORTS": "LARGE_DATA",
}
# The profile that gives shared memory segments large enough for whole clouds.
FASTDDS_PROFILE = "fastdds_profile.xml"
STOP_TIMEOUT_S = 20.0
# How long a stopped process's helpers may take to leave after it: multiprocessing's
# resource tracker ends only once it reads EOF from every process that held its pipe.
ORPHAN_WAIT_S = 5.0
# How long a node is given to write its stacks before it is killed.
STACKS_WAIT_S = 1.0
# Leases taken by this process so far: each starts its search one domain further on.
_LEASES = itertools.count()


def find_executable(name: str) -> Path:
    """Where ``ros2 run dynshape_perception NAME`` would look, then beside this Python."""
    prefix = Path(sys.prefix)
    for candidate in (
        prefix / "lib" / PACKAGE / name,
        Path(sys.executable).parent / name,
    ):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return Path(found)
    raise ConfigError(f"executable {name!r} not found; is {PACKAGE} installed?")


def dds_settings() -> dict[str, str]:
    """What every process of a run needs: loopback, large-data transport and its profile.

    Fast DDS 3 (Kilted) reads the profile from ``FASTDDS_DEFAULT_PROFILES_FILE``, Fast DDS 2
    (Jazzy) from ``FASTRTPS_DEFAULT_PROFILES_FILE``: without it, Jazzy loses large clouds.
    """
    profile = str(config_path(FASTDDS_PROFILE))
    return {
        **DDS_ENV,
        "FASTDDS_DEFAULT_PROFILES_FILE": profile,
        "FASTRTPS_DEFAULT_PROFILES_FILE": profile,
    }


@contextmanager
def dds_settings_applied() -> Iterator[None]:
    """``dds_settings()`` in this process's own environment (for an in-process participant)
    while the block runs; the earlier values, or their absence, come back after it."""
    settings = dds_settings()
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def dds_env(domain_id: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env.update(dds_settings())
    env["ROS_DOMAIN_ID"] = str(domain_id)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def domain_lease(lock_dir: Path | None = None) -> Iterator[int]:
    """A ROS_DOMAIN_ID that no other run on this host holds while the block runs."""
    folder = lock_dir or Path(tempfile.gettempdir()) / "dynshape_perception_domains"
    folder.mkdir(parents=True, exist_ok=True)
    # A run on the domain an earlier run of this process used often loses its first cloud
    # (the probe counts a subscriber as matched before the new node's is): each lease of a
    # process starts its search on another domain.
    start = (os.getpid() + next(_LEASES)) % len(DOMAIN_IDS)
    for step in range(len(DOMAIN_IDS)):
        domain = DOMAIN_IDS[(start + step) % len(DOMAIN_IDS)]
        handle = (folder / f"{domain}.lock").open("w")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        try:
            yield domain
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        return
    raise ConfigError(f"every ROS domain id in {DOMAIN_IDS} is taken on this host")


@contextmanager
def leased_context() -> Iterator[Context]:
    """An rclpy context on a leased domain (``domain_lease``), shut down after the block
    unless the block did."""
    import rclpy
    from rclpy.context import Context

    with domain_lease() as domain:
        context = Context()
        rclpy.init(args=[], context=context, domain_id=domain)
        try:
            yield context
        finally:
            context.try_shutdown()


def ros_value(value: bool | int | float | str) -> str:
    """A ``-p name:=value`` value (YAML): JSON scalars are valid YAML."""
    return json.dumps(value)


@dataclass
class NodeProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, poll_s: float = 0.05) -> bool:
        """Whether ``ready`` came true within ``timeout_s``; asked a last time, and answered,
        as soon as the node has exited or the time is up."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if not self.alive() or time.monotonic() >= deadline:
                return ready()
            time.sleep(poll_s)
        return True

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """Signal the node, wait; if it does not exit in time, have it write its threads'
        stacks to its log, then kill its whole process group."""
        if self.alive():
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                dump_stacks([self.pid])
                self.kill()
        self.kill_group()
        self._log.close()
        return int(self.popen.returncode)

    def kill(self) -> None:
        self.kill_group()
        self.popen.wait()

    def kill_group(self) -> None:
        """Leftovers of this node's session (compile workers), if any."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler for ``sig`` (its SigCgt mask in /proc)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    return False


def _signal_each(
    pids: Iterable[int], sig: int, wanted: Callable[[int], bool], wait_s: float
) -> list[int]:
    """``sig`` to each of ``pids`` that is ``wanted``, then a wait for what they write: the
    pids signalled."""
    asked: list[int] = []
    for pid in pids:
        if wanted(pid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            asked.append(pid)
    if asked:
        # Written from the signal handler itself: a moment, even under load.
        time.sleep(wait_s)
    return asked


def dump_stacks(pids: Iterable[int], wait_s: float = STACKS_WAIT_S) -> list[int]:
    """Have each node that catches ``STACKS_SIGNAL`` write every thread's stack to its
    stderr (its log); the nodes asked. The signal's default action would end any other
    process, so those are left alone."""
    return _signal_each(pids, STACKS_SIGNAL, lambda pid: catches(pid, STACKS_SIGNAL), wait_s)


def abort_for_stacks(pids: Iterable[int], wait_s: float = STACKS_WAIT_S) -> list[int]:
    """SIGABRT to each process that has Python's faulthandler on it (``PYTHONFAULTHANDLER``,
    as ``python_stacks_env`` sets for commands that are not nodes): it writes every
    thread's Python stack to its stderr and ends. For processes about to be killed anyway;
    one without a SIGABRT handler, or with ``STACKS_SIGNAL`` (a node: ask it instead), is
    left alone."""

    def wanted(pid: int) -> bool:
        return catches(pid, signal.SIGABRT) and not catches(pid, STACKS_SIGNAL)

    return _signal_each(pids, signal.SIGABRT, wanted, wait_s)


def python_stacks_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for a third-party Python command (``ros2``): with faulthandler on from its
    start, so that one that hangs can be made to write its stacks (``abort_for_stacks``)."""
    return {**env, "PYTHONFAULTHANDLER": "1"}


def thread_states(pid: int) -> list[str]:
    """Each thread of ``pid`` as ``tid name state wchan``: its name, its scheduler state and
    the kernel function it sleeps in, from /proc. It tells where a process waits that no
    longer answers ``STACKS_SIGNAL`` (one past the interpreter's finalisation)."""
    states: list[str] = []
    try:
        tasks = sorted(Path(f"/proc/{pid}/task").iterdir(), key=lambda t: int(t.name))
    except OSError:
        return states
    for task in tasks:
        try:
            name = (task / "comm").read_text().strip()
            state = stat_fields((task / "stat").read_text())[0]
            wchan = (task / "wchan").read_text().strip() or "-"
        except (OSError, IndexError):
            continue
        states.append(f"{task.name} {name} {state} {wchan}")
    return states


def live_processes() -> Iterator[tuple[int, list[str], list[bytes]]]:
    """Each live (not zombie) process on the host: its pid, its ``/proc`` stat fields
    (``procfs.stat_fields``) and its arguments. One that ends meanwhile is skipped."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = stat_fields((entry / "stat").read_text())
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if fields[0] not in GONE_STATES:
            yield int(entry.name), fields, args


def session_members(session_id: int) -> dict[int, str]:
    """The live (not zombie) processes of a session, and their command lines: everything a
    process started with ``start_new_session`` left, wherever it was reparented to."""
    return {
        pid: b" ".join(args).decode(errors="replace")
        for pid, fields, args in live_processes()
        if int(fields[3]) == session_id
    }


def kill_session(session_id: int) -> None:
    """SIGKILL to every live process of a session (those that end meanwhile are skipped)."""
    for pid in session_members(session_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def session_left(session_id: int, wait_s: float = ORPHAN_WAIT_S) -> dict[int, str]:
    """What of a session is still alive ``wait_s`` after its leader ended (nothing, as soon
    as it is empty): helpers that leave on their own once their parent has gone are not
    left over."""
    deadline = time.monotonic() + wait_s
    members = session_members(session_id)
    while members and time.monotonic() < deadline:
        time.sleep(0.05)
        members = session_members(session_id)
    return members


def fastdds_tool() -> Path | None:
    """Fast DDS's ``fastdds`` tool: beside this Python's packages (the wheels), or where the
    ``fastdds`` on PATH keeps it (a distro's ``/opt/ros/<distro>``)."""
    candidates = [Path(sys.prefix)]
    on_path = shutil.which("fastdds")
    if on_path:
        candidates.append(Path(on_path).resolve().parent.parent)
    for prefix in candidates:
        tool = prefix / "tools" / "fastdds" / "fastdds.py"
        if tool.is_file():
            return tool
    return None


def clean_dds_shared_memory(timeout_s: float = 60.0) -> str:
    """Remove the shared memory that Fast DDS participants left when they died without
    closing (SIGKILL, a crash): each leaves its segments in ``/dev/shm`` until reboot, 33 MB
    with the package's profile. It runs ``fastdds shm clean`` of this Python's ROS, which
    removes only segments and ports whose lock no live process holds. Its report (or why
    there is none: a tool that did not finish), or "" where this ROS has no ``fastdds`` tool."""
    tool = fastdds_tool()
    if tool is None:
        return ""
    try:
        done = subprocess.run(
            [sys.executable, str(tool), "shm", "clean"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"fastdds shm clean did not finish in {timeout_s:g} s"
    return (done.stdout + done.stderr).strip()


def start_node(
    executable: str,
    *,
    env: Mapping[str, str],
    log_dir: Path,
    params_file: Path | None = None,
    overrides: Mapping[str, bool | int | float | str] | None = None,
    remaps: Sequence[tuple[str, str]] = (),
    name: str | None = None,
) -> NodeProcess:
    """Start one node in its own session, its output in ``log_dir/<name>.log``."""
    name = name or executable
    cmd = [str(find_executable(executable)), "--ros-args"]
    if name != executable:
        cmd += ["-r", f"__node:={name}"]
    if params_file is not None:
        cmd += ["--params-file", str(params_file)]
    for key, value in (overrides or {}).items():
        cmd += ["-p", f"{key}:={ros_value(value)}"]
    for src, dst in remaps:
        cmd += ["-r", f"{src}:={dst}"]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log = log_path.open("wb")
    try:
        popen = subprocess.Popen(
            cmd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as err:
        log.close()
        raise ConfigError(f"cannot start {cmd[0]}: {err}") from err
    return NodeProcess(name, popen, log_path, log)
