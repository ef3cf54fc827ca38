"""The ``ros2`` command line as a user types it on a private DDS domain: calls, launches, daemon."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dynshape_perception.errors import ConfigError
from dynshape_perception.testing.processes import (
    STACKS_WAIT_S,
    STOP_TIMEOUT_S,
    abort_for_stacks,
    dds_env,
    dump_stacks,
    kill_session,
    live_processes,
    python_stacks_env,
    session_left,
    session_members,
    thread_states,
)

# Discovery of a remote node by a fresh ros2 process (daemon or not) may take seconds here.
RETRY_S = 30.0
RETRY_STEP_S = 1.0
CALL_TIMEOUT_S = 60.0
DAEMON_STOP_S = 10.0
# ros2launch's lines on each process it ends: "process has finished cleanly [pid 12]",
# "process has died [pid 12, exit code -2, cmd '...']".
_FINISHED = re.compile(r"\[INFO\] \[([^\]]+)\]: process has finished cleanly \[pid (\d+)\]")
_DIED = re.compile(r"\[ERROR\] \[([^\]]+)\]: process has died \[pid (\d+), exit code (-?\d+)")


def ros2_executable() -> Path | None:
    """The venv's ``ros2`` (beside this Python), as ``make venv`` installs it."""
    path = Path(sys.executable).parent / "ros2"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def ros2_env(domain_id: int) -> dict[str, str]:
    """A shell's environment for ``ros2``: the domain, the DDS settings, this prefix on
    AMENT_PREFIX_PATH (as the venv's activate sets it), and Python's faulthandler on, for
    the stacks of a command that hangs."""
    env = dds_env(domain_id)
    prefixes = [sys.prefix, *filter(None, env.get("AMENT_PREFIX_PATH", "").split(os.pathsep))]
    env["AMENT_PREFIX_PATH"] = os.pathsep.join(dict.fromkeys(prefixes))
    return python_stacks_env(env)


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    out: str
    err: str

    @property
    def said(self) -> str:
        """Both streams: ros2param prints a refusal on stderr."""
        return f"{self.out}\n{self.err}"

    def __str__(self) -> str:
        said = f"{self.out[-3000:]}\n{self.err[-2000:]}"
        return f"ros2 {' '.join(self.args)} -> {self.returncode}:\n{said}"


class Ros2:
    """``ros2`` calls on one domain; ``close`` stops the daemon those calls started."""

    def __init__(self, domain_id: int) -> None:
        exe = ros2_executable()
        if exe is None:
            raise ConfigError(f"no ros2 command beside {sys.executable}: run make venv")
        self.exe = exe
        self.domain_id = domain_id
        self.env = ros2_env(domain_id)

    def call(self, *args: str, timeout_s: float = CALL_TIMEOUT_S) -> Result:
        done = subprocess.run(
            [str(self.exe), *args],
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
        return Result(
            tuple(args),
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    def until(
        self, args: Sequence[str], ok: Callable[[Result], bool], timeout_s: float = RETRY_S
    ) -> Result:
        """Call until ``ok`` holds (a node not discovered yet); the last result either way."""
        deadline = time.monotonic() + timeout_s
        while True:
            result = self.call(*args)
            if ok(result) or time.monotonic() >= deadline:
                return result
            time.sleep(RETRY_STEP_S)

    def popen(self, *args: str, log: Path) -> Launched:
        """A long-running ``ros2`` command in a session of its own, its output in ``log``."""
        handle = log.open("wb")
        try:
            popen = subprocess.Popen(
                [str(self.exe), *args],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            handle.close()
        return Launched(popen, log)

    def close(self) -> None:
        """``ros2 daemon stop``: the daemon the calls started (one per domain) goes too."""
        self.call("daemon", "stop")
        deadline = time.monotonic() + DAEMON_STOP_S
        while daemons(self.domain_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in daemons(self.domain_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def daemons(domain_id: int) -> list[int]:
    """The live ``ros2`` daemons of ``domain_id`` on this host."""
    found: list[int] = []
    for pid, _fields, args in live_processes():
        if not any(a.endswith(b"_ros2_daemon") for a in args[:2]):
            continue
        if f"--ros-domain-id={domain_id}".encode() in args or (
            b"--ros-domain-id" in args
            and args[args.index(b"--ros-domain-id") + 1 :][:1] == [str(domain_id).encode()]
        ):
            found.append(pid)
    return found


@dataclass
class Launched:
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def interrupt(self, group: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGINT as Ctrl-C sends it: to the ``ros2`` process (``ros2 launch`` passes it on),
        or to its whole group (``ros2 run`` does not); killed with its session if it hangs."""
        if self.popen.poll() is None:
            if group:
                os.killpg(self.popen.pid, signal.SIGINT)
            else:
                self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return int(self.popen.returncode)

    def kill(self) -> None:
        """Every process of the session, after each has said where it waits: its Python
        stacks in the log (a node's on ``STACKS_SIGNAL``, a ``ros2`` command's on SIGABRT),
        then its threads' states, read before, appended to the log."""
        members = session_members(self.popen.pid)
        states = {pid: thread_states(pid) for pid in members}
        # One wait for both: each writes from its signal handler at once.
        if dump_stacks(members, wait_s=0.0) + abort_for_stacks(members, wait_s=0.0):
            time.sleep(STACKS_WAIT_S)
        kill_session(self.popen.pid)
        self.popen.wait()
        with self.log_path.open("a") as log:
            for pid, cmdline in members.items():
                threads = "\n  ".join(states[pid])
                log.write(f"\nkilled pid {pid} ({cmdline[:200]}); its threads:\n  {threads}\n")

    def leftovers(self) -> dict[int, str]:
        return session_left(self.popen.pid)


def launch_exits(log: str) -> dict[str, int]:
    """What ``ros2 launch`` said of each process it ended: its name and exit code."""
    exits = {name: 0 for name, _pid in _FINISHED.findall(log)}
    exits.update({name: int(code) for name, _pid, code in _DIED.findall(log)})
    return exits


@contextmanager
def ros2_on(domain_id: int) -> Iterator[Ros2]:
    ros2 = Ros2(domain_id)
    try:
        yield ros2
    finally:
        ros2.close()
