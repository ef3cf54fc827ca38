"""The embedded Ray's processes end with the run even when one is stuck in a read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from dynshape_perception.tools.fleet import cluster

STUCK = "import os, signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1])"


class MockRayShutdownLeavesAStuckWorker:
    """Injected fault: ``shutdown`` returns while a worker blocked opening a FIFO lives on."""

    def __init__(self, fifo: Path) -> None:
        self.worker = subprocess.Popen([sys.executable, "-c", STUCK, str(fifo)])
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


def test_processes_left_after_shutdown_are_killed(tmp_path: Path) -> None:
    fifo = tmp_path / "never-written"
    os.mkfifo(fifo)
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = cluster._children()
        ray = MockRayShutdownLeavesAStuckWorker(fifo)
        time.sleep(0.2)
        assert ray.worker.poll() is None
        start = time.monotonic()
        cluster._shutdown(ray, before)
        assert ray.shut_down
        # _shutdown reaped it (it is this process's child here), so Popen cannot see the code.
        assert not psutil.pid_exists(ray.worker.pid)
        assert time.monotonic() - start < 3 * cluster.END_GRACE_S
        assert psutil.pid_exists(unrelated.pid) and unrelated.poll() is None
    finally:
        unrelated.kill()
        unrelated.wait()
