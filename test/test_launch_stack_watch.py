"""The launch tests' stack watch: a launched process still running shortly after the launch
shuts down writes its stacks before launch escalates to SIGTERM; one that stops writes none."""

from __future__ import annotations

import re
import signal
import sys
from collections import defaultdict

import pytest

from dynshape_perception.testing import launch_stack_required

pytestmark = pytest.mark.ros

try:
    from launch.actions import EmitEvent, ExecuteProcess, RegisterEventHandler
    from launch.event_handlers import OnProcessExit, OnProcessIO
    from launch.events import Shutdown
    from launch.events.process import ProcessExited, ProcessIO
    from launch.launch_context import LaunchContext
    from launch.launch_description import LaunchDescription
    from launch.launch_service import LaunchService

    from dynshape_perception.testing.launching import StackWatch
except ImportError:
    # The Jazzy wheels have no launch stack; make test installs it for Kilted.
    if launch_stack_required():
        raise
    pytest.skip("launch is not installed", allow_module_level=True)

# A process that ignores SIGINT, as a node stuck in its shutdown does, and one that stops.
PROGRAM = """
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
if sys.argv[1] == "stuck":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
else:
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
print("ready", flush=True)
def waits_in_shutdown():
    time.sleep(120)
waits_in_shutdown()
"""


def _role(event: ProcessIO | ProcessExited) -> str:
    """Launch names a process ``<name>-<n>``."""
    return event.process_name.rsplit("-", 1)[0]


def test_a_process_that_does_not_stop_writes_its_stacks_before_sigterm(
    capsys: pytest.CaptureFixture[str],
) -> None:
    watch = StackWatch()
    processes = {
        role: ExecuteProcess(cmd=[sys.executable, "-c", PROGRAM, role], name=role, output="log")
        for role in ("stuck", "prompt")
    }
    ready: set[str] = set()
    stderr: dict[str, str] = defaultdict(str)
    codes: dict[str, int] = {}

    def on_stdout(event: ProcessIO) -> list[EmitEvent] | None:
        if b"ready" not in event.text:
            return None
        ready.add(_role(event))
        # Twice, as a test may: the watch still asks each process once.
        if ready == set(processes):
            return [EmitEvent(event=Shutdown(reason="both ready")) for _ in range(2)]
        return None

    def on_stderr(event: ProcessIO) -> None:
        stderr[_role(event)] += event.text.decode(errors="replace")

    def on_exit(event: ProcessExited, context: LaunchContext) -> None:
        codes[_role(event)] = event.returncode

    service = LaunchService()
    service.include_launch_description(
        LaunchDescription(
            [
                *watch.handlers(),
                *processes.values(),
                RegisterEventHandler(OnProcessIO(on_stdout=on_stdout, on_stderr=on_stderr)),
                RegisterEventHandler(OnProcessExit(on_exit=on_exit)),
            ]
        )
    )
    service.run()
    watch.wait(30.0)
    assert codes == {"stuck": -signal.SIGTERM, "prompt": 0}
    assert "waits_in_shutdown" in stderr["stuck"], stderr["stuck"]
    assert "waits_in_shutdown" not in stderr["prompt"], stderr["prompt"]
    # And the test's own output names it with its threads' states.
    reported = capsys.readouterr().err
    assert re.search(r"pid \d+ still running \(stacks in its log\); threads:\n  \d+ ", reported)
    assert reported.count("still running") == 1, reported
