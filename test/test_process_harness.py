"""The process harness: ``session_left`` does not count a session's helper that ends on its
own after its leader (as multiprocessing's resource tracker does, on EOF), and counts one
that stays; a node, or a ``ros2`` command, that does not stop in time writes its stacks
before it is killed; what a killed DDS participant left in shared memory is cleaned."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dynshape_perception.testing.processes import (
    NodeProcess,
    abort_for_stacks,
    clean_dds_shared_memory,
    dds_env,
    domain_lease,
    dump_stacks,
    fastdds_tool,
    python_stacks_env,
    session_left,
    session_members,
    thread_states,
)
from dynshape_perception.testing.ros2cli import Launched

pytestmark = pytest.mark.ros

SHM = "/dev/shm"

# The leader starts a child in its session that reads the pipe until EOF, prints the child's
# pid, and exits.
LEADER = """
import subprocess, sys
fd = int(sys.argv[1])
child = subprocess.Popen(
    [sys.executable, "-c", "import os, sys\\nwhile os.read(int(sys.argv[1]), 1): pass", str(fd)],
    pass_fds=(fd,),
)
print(child.pid, flush=True)
"""


@contextmanager
def orphan_reading_a_pipe() -> Iterator[tuple[int, int, Callable[[], None]]]:
    """(the ended leader's session, its orphaned child, what closes the pipe's write end)."""
    read_end, write_end = os.pipe()
    closed = threading.Lock()

    def close() -> None:
        # Once only: a second close could hit a descriptor reopened meanwhile.
        if closed.acquire(blocking=False):
            os.close(write_end)

    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", LEADER, str(read_end)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            pass_fds=(read_end,),
        )
        os.close(read_end)
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        proc.stdout.close()
        proc.wait(timeout=30.0)
        yield proc.pid, child, close
    finally:
        close()


def test_a_child_that_ends_during_the_wait_is_not_left() -> None:
    with orphan_reading_a_pipe() as (session, child, close):
        assert child in session_members(session)
        closer = threading.Timer(0.3, close)
        closer.start()
        try:
            assert session_left(session, wait_s=30.0) == {}
        finally:
            closer.join()


def test_a_child_that_stays_is_left_after_the_wait() -> None:
    with orphan_reading_a_pipe() as (session, child, _close):
        assert list(session_left(session, wait_s=0.5)) == [child]


# A node whose shutdown never ends: it ignores SIGINT once it has said so.
STUCK = """
import faulthandler, signal, sys, time
from dynshape_perception.interrupts import STACKS_SIGNAL
faulthandler.register(STACKS_SIGNAL, all_threads=True)
signal.signal(signal.SIGINT, signal.SIG_IGN)

def stuck_in_shutdown():
    print("stopping", flush=True)
    time.sleep(600)

stuck_in_shutdown()
"""


def started(code: str, tmp_path: Path) -> NodeProcess:
    log_path = tmp_path / "node.log"
    log = log_path.open("wb")
    popen = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    node = NodeProcess("stuck", popen, log_path, log)
    assert node.wait_until(lambda: "stopping" in node.log(), 60.0), node.log()
    return node


def test_a_node_that_does_not_stop_writes_its_stacks_before_it_is_killed(
    tmp_path: Path,
) -> None:
    node = started(STUCK, tmp_path)
    assert node.stop(timeout_s=0.5) == -signal.SIGKILL
    log = node.log()
    assert "most recent call first" in log and "stuck_in_shutdown" in log, log


def test_a_process_that_does_not_catch_the_signal_is_not_sent_it(tmp_path: Path) -> None:
    node = started('print("stopping", flush=True); import time; time.sleep(600)', tmp_path)
    try:
        assert dump_stacks([node.pid], wait_s=0.2) == []
        assert node.alive()
    finally:
        node.stop(signal.SIGKILL)


def test_thread_states_give_each_thread_its_state() -> None:
    done = threading.Event()
    sleeper = threading.Thread(target=done.wait)
    sleeper.start()
    try:
        me = str(threading.get_native_id())

        def states() -> dict[str, list[str]]:
            return {line.split()[0]: line.split()[1:] for line in thread_states(os.getpid())}

        # Running as it reads, and the other thread asleep on its Event once it gets there.
        deadline = time.monotonic() + 10.0
        while states()[str(sleeper.native_id)][1] != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        found = states()
        assert found[me][1] == "R" and found[str(sleeper.native_id)][1] == "S", found
        assert all(len(fields) == 3 for fields in found.values()), found
    finally:
        done.set()
        sleeper.join()
    assert thread_states(2**22 + 1) == []


def test_waiting_on_a_node_ends_when_it_exits(tmp_path: Path) -> None:
    node = started('print("stopping", flush=True)', tmp_path)
    try:
        assert not node.wait_until(lambda: False, 600.0)
        assert not node.alive()
    finally:
        node.stop()


# A command (not a node) that ignores Ctrl-C, as a ``ros2`` command stuck in its exit does.
STUCK_COMMAND = """
import signal, time
signal.signal(signal.SIGINT, signal.SIG_IGN)

def stuck_in_exit():
    print("stopping", flush=True)
    time.sleep(600)

stuck_in_exit()
"""


def launched_command(tmp_path: Path, env: dict[str, str]) -> Launched:
    log_path = tmp_path / "command.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-c", STUCK_COMMAND],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    command = Launched(popen, log_path)
    deadline = time.monotonic() + 60.0
    while "stopping" not in command.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "stopping" in command.log(), command.log()
    return command


def test_a_command_that_hangs_writes_its_python_stacks_and_threads_when_killed(
    tmp_path: Path,
) -> None:
    command = launched_command(tmp_path, python_stacks_env(os.environ))
    pid = command.popen.pid
    assert command.interrupt(timeout_s=0.5) in (-signal.SIGABRT, -signal.SIGKILL)
    log = command.log()
    assert "most recent call first" in log and "stuck_in_exit" in log, log
    assert f"killed pid {pid} (" in log and f"its threads:\n  {pid} " in log, log


def test_a_command_without_faulthandler_is_not_aborted(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    command = launched_command(tmp_path, env)
    try:
        assert abort_for_stacks([command.popen.pid], wait_s=0.2) == []
        assert command.popen.poll() is None
    finally:
        assert command.interrupt(timeout_s=0.5) == -signal.SIGKILL
    assert "most recent call first" not in command.log()


PARTICIPANT = """
import rclpy
rclpy.init()
node = rclpy.create_node("holds_shared_memory")
print("up", flush=True)
rclpy.spin(node)
"""
SEGMENT = re.compile(r"^fast(dds|rtps)_[0-9a-f]{16}$")


def segments() -> set[str]:
    return {name for name in os.listdir(SHM) if SEGMENT.match(name)}


def participant(
    domain: int, started: list[subprocess.Popen[str]]
) -> tuple[subprocess.Popen[str], set[str]]:
    """A process with one DDS participant, added to ``started`` (to be ended even if it never
    comes up), and the segments that appeared as it started."""
    before = segments()
    proc = subprocess.Popen(
        [sys.executable, "-c", PARTICIPANT], env=dds_env(domain), stdout=subprocess.PIPE, text=True
    )
    started.append(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "up"
    deadline = time.monotonic() + 10.0
    while not segments() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    return proc, segments() - before


@pytest.mark.skipif(not os.path.isdir(SHM), reason="no /dev/shm")
def test_the_segments_of_a_killed_participant_are_cleaned_and_a_live_ones_kept() -> None:
    assert fastdds_tool() is not None, "Fast DDS's fastdds tool is not installed"
    started: list[subprocess.Popen[str]] = []
    with domain_lease() as domain:
        try:
            killed, killed_segments = participant(domain, started)
            _live, live_segments = participant(domain, started)
            assert killed_segments and live_segments
            killed.kill()
            killed.wait(timeout=30.0)
            assert killed_segments <= segments(), "a killed participant's segments are left"
            report = clean_dds_shared_memory()
            assert "zombie segments cleaned" in report, report
            assert not killed_segments & segments(), report
            assert live_segments <= segments(), report
        finally:
            for proc in started:
                proc.kill()
                proc.wait(timeout=30.0)
            clean_dds_shared_memory()


def test_a_cleaning_tool_that_hangs_is_reported_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hanging_tool_mock = tmp_path / "fastdds.py"
    hanging_tool_mock.write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(
        "dynshape_perception.testing.processes.fastdds_tool", lambda: hanging_tool_mock
    )
    started = time.monotonic()
    report = clean_dds_shared_memory(timeout_s=0.5)
    assert report == "fastdds shm clean did not finish in 0.5 s"
    assert time.monotonic() - started < 30.0
