"""Start-up interruption: a signal ends start-up at once, but never inside a section that must
finish, and does nothing once the node spins."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Iterator

import pytest

from dynshape_perception import interrupts
from dynshape_perception.interrupts import StartupInterrupted, uninterrupted


@pytest.fixture
def handlers() -> Iterator[None]:
    """The handlers installed in this process, and the test runner's restored after."""
    saved = {sig: signal.getsignal(sig) for sig in interrupts.STOP_SIGNALS}
    interrupts.install_handlers()
    try:
        yield
    finally:
        with contextlib.suppress(StartupInterrupted):
            interrupts.startup_done()
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_a_signal_during_start_up_raises_at_once(handlers: None) -> None:
    with pytest.raises(StartupInterrupted) as raised:
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("start-up went on after SIGTERM")
    assert raised.value.args == (signal.SIGTERM,)
    # Once: a second signal while the first unwinds is ignored, and the first is remembered
    # for code that turned the exception into one of its own.
    os.kill(os.getpid(), signal.SIGINT)
    assert interrupts.requested() == signal.SIGTERM


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_exception_python_drops_still_ends_start_up(handlers: None) -> None:
    """Handled inside a weakref callback (the import machinery's module locks have them), the
    handler's exception is reported and dropped ("Exception ignored in"): start-up must end
    where it is done, not go on to spin with the signal spent."""

    class Lock:
        pass

    lock = Lock()
    dropped = weakref.ref(lock, lambda _: os.kill(os.getpid(), signal.SIGTERM))
    del lock
    assert dropped() is None and interrupts.requested() == signal.SIGTERM
    with pytest.raises(StartupInterrupted) as raised:
        interrupts.startup_done()
    assert raised.value.args == (signal.SIGTERM,)


def test_a_section_that_must_finish_takes_the_signal_at_its_end(handlers: None) -> None:
    finished = []
    with pytest.raises(StartupInterrupted):
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            with uninterrupted():
                finished.append("inner")
            finished.append("outer")
    assert finished == ["inner", "outer"]


def test_once_started_a_signal_is_left_to_rclpy(handlers: None) -> None:
    interrupts.startup_done()
    os.kill(os.getpid(), signal.SIGTERM)
    with uninterrupted():
        os.kill(os.getpid(), signal.SIGINT)
    assert interrupts.requested() is None


def test_a_node_that_shuts_down_ignores_further_stop_signals() -> None:
    interrupts.shutting_down()
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_a_later_test_and_its_children_get_the_stop_signals_back() -> None:
    """The suite puts them back after each test (test/conftest.py): a child inherits an
    ignored signal across exec, and would ignore the Ctrl-C a test sends it."""
    assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    child = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr


def test_a_suite_started_with_the_stop_signals_ignored_takes_them_back() -> None:
    """A run in the background of a non-interactive shell starts with SIGINT ignored."""

    def ignore_stop_signals() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    test = f"{__file__}::test_a_later_test_and_its_children_get_the_stop_signals_back"
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        preexec_fn=ignore_stop_signals,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
