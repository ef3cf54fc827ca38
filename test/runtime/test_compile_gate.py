"""The compile gate: pools stopped while work is under way (on the host too: real processes
in one shared table) and for the hold after it."""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime import host_work
from dynshape_perception.runtime.compile_gate import CompileGate
from dynshape_perception.runtime.compile_pool import CompilePool
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.host_work import SLOT, SLOTS, STALE_BUSY_S, HostState, HostWork
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.runtime.shapes import Signature, sample_inputs
from dynshape_perception.runtime.validation import CompileRequest, CompileResult
from dynshape_perception.scheduling.work import holding
from dynshape_perception.testing.clocks import FakeClock

HOLD_MS = 20.0
WAIT_S = 10.0
# A bound on a hang, not a timing: a real compile on a host loaded many times over.
COMPILE_WAIT_S = 600.0
# Long enough for a keeper that polls the host's table to read it many times over.
QUIET_S = 0.3
ASSOCIATOR_WEIGHTS = {
    "associator": init_weights(parameter_shapes(model_definition("associator")), 1)
}


class RecordingPool:
    def __init__(self, has_work: bool = True) -> None:
        self.calls: list[str] = []
        # Read only by a gate that polls the host's table.
        self.running = has_work
        self.has_work = has_work
        self.wakers: list[Callable[[], None]] = []

    def add_waker(self, wake: Callable[[], None]) -> None:
        self.wakers.append(wake)

    def queue(self) -> None:
        """What a pool does as a compile is queued: it has work, and says so."""
        self.has_work = self.running = True
        for wake in self.wakers:
            wake()

    def enter_yield(self) -> None:
        self.calls.append("stop")

    def leave_yield(self) -> None:
        self.calls.append("go")


def _wait_for(done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done() and time.monotonic() < deadline:
        time.sleep(0.002)
    assert done()


def test_nested_work_stops_the_pools_once_and_they_run_after_the_hold() -> None:
    clock, pool = FakeClock(), RecordingPool()
    gate = CompileGate([pool], HOLD_MS, clock=clock, keeper=False)
    gate.enter()
    gate.enter()
    assert pool.calls == ["stop"] and gate.shut
    gate.leave()
    gate.leave()
    assert pool.calls == ["stop"], "within the hold"
    clock.advance_ms(HOLD_MS - 1)
    gate.poll()
    assert pool.calls == ["stop"]
    clock.advance_ms(2)
    gate.poll()
    assert pool.calls == ["stop", "go"] and not gate.shut
    assert gate.stops == 1


def test_work_within_the_hold_keeps_the_pools_stopped() -> None:
    clock, pool = FakeClock(), RecordingPool()
    gate = CompileGate([pool], HOLD_MS, clock=clock, keeper=False)
    for _ in range(5):
        with holding([gate]):
            clock.advance_ms(10)
        clock.advance_ms(HOLD_MS / 2)
        gate.poll()
    assert pool.calls == ["stop"], "frames closer than the hold: no resume between them"
    clock.advance_ms(HOLD_MS)
    gate.poll()
    assert pool.calls == ["stop", "go"]


def test_without_a_hold_the_pools_run_as_soon_as_work_ends() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], 0.0, keeper=False)
    with holding([gate]):
        assert pool.calls == ["stop"]
    assert pool.calls == ["stop", "go"]


def test_work_that_fails_lets_go_of_the_gate() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], 0.0, keeper=False)
    try:
        with holding([gate]):
            raise RuntimeError("injected stage failure")
    except RuntimeError:
        pass
    assert pool.calls == ["stop", "go"]


def test_the_keeper_resumes_the_pools_after_the_hold() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], HOLD_MS)
    try:
        with holding([gate]):
            pass
        _wait_for(lambda: pool.calls == ["stop", "go"])
    finally:
        gate.close()


def test_closing_resumes_what_the_gate_holds_and_holds_nothing_after() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], 60_000.0)
    gate.enter()
    closer = threading.Thread(target=gate.close)
    closer.start()
    closer.join(WAIT_S)
    assert not closer.is_alive() and pool.calls == ["stop", "go"]
    gate.leave()
    with holding([gate]):
        pass
    assert pool.calls == ["stop", "go"]


def test_a_gate_whose_pools_have_nothing_to_compile_rests_shut_until_one_is_queued() -> None:
    clock, pool = FakeClock(), RecordingPool(has_work=False)
    gate = CompileGate([pool], HOLD_MS, clock=clock, keeper=False)
    assert gate.poll() is None, "at rest: nothing to look at until a pool says so"
    assert pool.calls == ["stop"] and gate.shut
    for _ in range(3):
        with holding([gate]):
            clock.advance_ms(10)
        clock.advance_ms(2 * HOLD_MS)
        gate.poll()
    assert pool.calls == ["stop"] and gate.stops == 0, "frames pass a resting gate by"
    with holding([gate]):
        pool.queue()
        assert pool.calls == ["stop"], "queued within work: it waits for the work and hold"
    pool.queue()
    assert pool.calls == ["stop"]
    clock.advance_ms(HOLD_MS + 1)
    pool.queue()
    assert pool.calls == ["stop", "go"] and not gate.shut
    with holding([gate]):
        assert pool.calls == ["stop", "go", "stop"] and gate.stops == 1
    clock.advance_ms(HOLD_MS + 1)
    gate.poll()
    assert pool.calls == ["stop", "go", "stop", "go"]
    pool.has_work = False
    gate.poll()
    assert pool.calls == ["stop", "go", "stop", "go", "stop"] and gate.shut


def test_a_gate_without_pools_holds_nothing() -> None:
    gate = CompileGate([], HOLD_MS)
    with holding([gate]):
        assert not gate.shut
    gate.close()


# Another node, as far as the table goes: it enters and leaves its work when told.
OTHER = """
import sys
from pathlib import Path
from dynshape_perception.runtime.host_work import HostWork
work = HostWork(Path(sys.argv[1]))
print("ready", flush=True)
for line in sys.stdin:
    getattr(work, line.strip())()
    print("done", flush=True)
"""


class OtherProcess:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", OTHER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._reply() == "ready"

    def _reply(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def do(self, what: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(what + "\n")
        self.proc.stdin.flush()
        assert self._reply() == "done"


@contextmanager
def other_process(path: Path) -> Iterator[OtherProcess]:
    other = OtherProcess(path)
    try:
        yield other
    finally:
        other.proc.kill()
        other.proc.wait(WAIT_S)


def test_another_process_work_shows_while_under_way_then_its_end(tmp_path: Path) -> None:
    work = HostWork(tmp_path / "work")
    try:
        assert not work.state().busy
        with other_process(work.path) as other:
            before = time.monotonic()
            other.do("enter")
            assert work.state().busy
            other.do("leave")
            state = work.state()
            assert not state.busy and before <= state.ended <= time.monotonic()
    finally:
        work.close()


def test_a_process_that_died_mid_work_holds_nothing_and_its_slot_is_taken_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "work"
    with other_process(path) as other:
        other.do("enter")
        pid = other.proc.pid
        work = HostWork(path)
        try:
            assert work.state().busy
            other.proc.send_signal(signal.SIGKILL)
            other.proc.wait(WAIT_S)
            assert not work.state().busy, "a dead process's work is over"
        finally:
            work.close()
    slots = np.fromfile(path, dtype=SLOT)
    assert pid in slots["pid"].tolist(), "killed, it never released its slot"
    # Every live slot taken but the dead one's: a new process must get that one.
    slots["pid"] = [os.getppid() if p != pid else p for p in slots["pid"].tolist()]
    slots.tofile(path)
    with other_process(path) as newer:
        assert int(np.fromfile(path, dtype=SLOT)["pid"][slots["pid"].tolist().index(pid)]) == (
            newer.proc.pid
        )


def test_work_is_counted_across_a_process_holders_and_a_hung_one_goes_stale(
    tmp_path: Path,
) -> None:
    clock = FakeClock(start_s=time.monotonic())
    work = HostWork(tmp_path / "work", clock=clock)
    try:
        work.enter()
        work.enter()
        work.leave()
        assert work.state().busy, "one holder is still at work"
        ended = clock()
        work.leave()
        clock.advance_ms(5)
        assert work.state() == (False, ended)
        work.leave()
        assert not work.state().busy, "an unmatched leave changes nothing"
        work.enter()
        clock.advance_ms(STALE_BUSY_S * 1e3 + 1)
        assert not work.state().busy
    finally:
        work.close()
    assert not np.fromfile(tmp_path / "work", dtype=SLOT)["pid"].any(), "closed, slot freed"
    # A gate's thread may still be at work as the process exits and the table closes.
    work.enter()
    work.leave()
    assert work.state() == (False, -math.inf)


def test_a_full_or_unusable_table_is_a_config_error(tmp_path: Path) -> None:
    full = np.zeros(SLOTS, dtype=SLOT)
    full["pid"] = os.getppid()
    full.tofile(tmp_path / "full")
    with pytest.raises(ConfigError, match="no free slot"):
        HostWork(tmp_path / "full")
    with pytest.raises(ConfigError, match="cannot open"):
        HostWork(tmp_path / "missing" / "work")


def test_the_other_engine_of_a_process_holds_a_gate_through_the_shared_slot(
    tmp_path: Path,
) -> None:
    clock, pool = FakeClock(start_s=time.monotonic()), RecordingPool()
    work = HostWork(tmp_path / "work", clock=clock)
    try:
        gate = CompileGate([pool], HOLD_MS, clock=clock, keeper=False, host=work)
        other = CompileGate([RecordingPool()], HOLD_MS, clock=clock, keeper=False, host=work)
        other.enter()
        # It opens no sooner than the hold after the other's work: it looks again then.
        assert gate.poll() == HOLD_MS / 1e3
        assert pool.calls == ["stop"] and gate.shut and gate.host_stops == 1
        clock.advance_ms(5)
        other.leave()
        clock.advance_ms(HOLD_MS - 1)
        gate.poll()
        assert pool.calls == ["stop"], "within the hold after the other's work"
        clock.advance_ms(2)
        gate.poll()
        assert pool.calls == ["stop", "go"] and gate.stops == 0
        with holding([gate]):
            assert pool.calls == ["stop", "go", "stop"]
        clock.advance_ms(HOLD_MS + 1)
        gate.poll()
        assert pool.calls == ["stop", "go", "stop", "go"]
    finally:
        work.close()


def test_another_process_work_stops_a_gate_s_compiles_until_the_hold_after_it(
    tmp_path: Path,
) -> None:
    pool = RecordingPool()
    work = HostWork(tmp_path / "work")
    gate = CompileGate([pool], HOLD_MS, host=work)
    try:
        with other_process(work.path) as other:
            other.do("enter")
            _wait_for(lambda: pool.calls == ["stop"])
            assert gate.shut and gate.host_stops == 1
            other.do("leave")
            ended = work.state().ended
            _wait_for(lambda: pool.calls == ["stop", "go"])
            assert time.monotonic() >= ended + HOLD_MS / 1e3
    finally:
        gate.close()
        work.close()


class CountingHostWork(HostWork):
    """The host's table, counting the gate's reads of it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.reads = 0

    def state(self) -> HostState:
        self.reads += 1
        return super().state()


def test_a_resting_gate_reads_nothing_of_the_host_until_a_compile_is_queued(
    tmp_path: Path,
) -> None:
    pool = RecordingPool(has_work=False)
    work = CountingHostWork(tmp_path / "work")
    gate = CompileGate([pool], HOLD_MS, host=work)
    try:
        _wait_for(lambda: gate.shut)
        with other_process(work.path) as other:
            for _ in range(5):
                with holding([gate]):
                    other.do("enter")
                    other.do("leave")
            time.sleep(QUIET_S)
            assert work.reads == 0 and pool.calls == ["stop"] and gate.host_stops == 0
            pool.queue()
            _wait_for(lambda: pool.calls == ["stop", "go"])
            assert work.reads > 0
            other.do("enter")
            _wait_for(lambda: pool.calls == ["stop", "go", "stop"])
            assert gate.host_stops == 1
            other.do("leave")
            _wait_for(lambda: pool.calls == ["stop", "go", "stop", "go"])
            pool.has_work = pool.running = False
            _wait_for(lambda: pool.calls == ["stop", "go", "stop", "go", "stop"])
            reads = work.reads
            other.do("enter")
            other.do("leave")
            time.sleep(QUIET_S)
            assert work.reads == reads, "at rest again once the pool had nothing left"
    finally:
        gate.close()
        work.close()


def test_a_compile_queued_to_a_resting_gate_runs_once_no_work_holds_it(
    cache_root: Path,
) -> None:
    done = threading.Event()
    results: list[tuple[CompileResult | None, str]] = []

    def on_done(key: Signature, result: CompileResult | None, s: float, reason: str) -> None:
        results.append((result, reason))
        done.set()

    key = Signature.of("forward", {"N": 5, "M": 3})
    sample = sample_inputs(model_definition("associator"), key.function, key.as_dict(), seed=1)
    request = CompileRequest("associator", "x86_64", key, str(cache_root), sample=sample)
    pool = CompilePool(ASSOCIATOR_WEIGHTS, "x86_64", cache_root, mode="thread")
    gate = CompileGate([pool], HOLD_MS)
    try:
        _wait_for(lambda: gate.shut)
        with holding([gate]):
            assert pool.submit(request, 1.0, on_done)
            assert not done.wait(QUIET_S), "no compile starts beside the work"
            assert pool.has_work and not pool.running
        assert done.wait(COMPILE_WAIT_S)
        [(result, reason)] = results
        assert result is not None, reason
        _wait_for(lambda: gate.shut and not pool.has_work)
    finally:
        gate.close()
        pool.shutdown()


def test_an_engine_without_the_host_table_warns_and_gates_its_own_work_injected_fault(
    cache_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    # Injected fault: the host's table lies in a folder that is not there.
    monkeypatch.setattr(host_work, "default_path", lambda: tmp_path / "missing" / "work")
    config = JitConfig(mode="adaptive", compile_mode="thread")
    weights = {"associator": init_weights(parameter_shapes(model_definition("associator")), 1)}
    with (
        caplog.at_level(logging.WARNING),
        Engine(
            "x86_64", config, cache_dir=cache_root, models=("associator",), weights=weights
        ) as engine,
    ):
        assert engine.host_gate.startswith("unavailable: cannot open the host's work table")
        with holding([engine.gate]):
            assert engine.gate.shut, "its own work still holds it"
    assert "compiles see only this process's frames" in caplog.text
    monkeypatch.setattr(host_work, "default_path", lambda: tmp_path / "work")
    with Engine(
        "x86_64", config, cache_dir=cache_root, models=("associator",), weights=weights
    ) as engine:
        assert engine.host_gate == str(tmp_path / "work")
        with holding([engine.gate]):
            assert host_work.shared(tmp_path / "work").state().busy
