"""SIGTERM or SIGINT at any moment of a node's start-up: exit 0 at once, with no traceback.

Each case waits for an observable sign of its moment (the kernel's record of caught signals,
a generic build published to the cache, the compile worker of a frozen warm-up) before it
signals, and checks from the log that start-up had not finished by itself.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.testing.processes import (
    NodeProcess,
    catches,
    dds_env,
    domain_lease,
    start_node,
)

pytestmark = pytest.mark.ros

NODE = "perception_pipeline"
# Long enough for a cold start of the whole node on a loaded machine; a failure bound only.
WAIT_S = 120.0
# The log line each phase prints once it has finished by itself.
BUILT = "tiered executor:"
WARMED = "warm-up:"
# Predictor shapes of distinct specialisation keys: a frozen warm-up compiles each of them,
# seconds apiece, before the node may spin.
HOT_SHAPES = [{"A": a, "T": t} for a in (3, 9, 17, 33) for t in (4, 12, 24)]


def wait_for(proc: NodeProcess, ready: Callable[[], bool], what: str) -> None:
    if not proc.wait_until(ready, WAIT_S, poll_s=0.005):
        assert proc.alive(), f"{NODE} exited before {what}:\n{proc.log()[-3000:]}"
        raise AssertionError(f"no {what} within {WAIT_S} s:\n{proc.log()[-3000:]}")


def stop(proc: NodeProcess, sig: signal.Signals) -> tuple[int, float]:
    began = time.monotonic()
    code = proc.stop(sig, timeout_s=WAIT_S)
    return code, time.monotonic() - began


def check_clean_exit(proc: NodeProcess, code: int, took_s: float, unfinished: str) -> None:
    log = proc.log()
    print(f"{NODE}: exit {code} {took_s:.2f} s after the signal")
    assert code == 0, log[-3000:]
    assert "Traceback" not in log and "KeyboardInterrupt" not in log, log[-3000:]
    assert "during start-up: exiting" in log, log[-3000:]
    assert unfinished not in log, f"start-up had finished before the signal:\n{log[-3000:]}"


@pytest.fixture
def launch(
    node_overrides: dict[str, bool | int | float | str], tmp_path: Path
) -> Iterator[Callable[..., NodeProcess]]:
    started: list[NodeProcess] = []

    def run(**overrides: bool | int | float | str) -> NodeProcess:
        proc = start_node(
            NODE,
            env=dds_env(domain),
            log_dir=tmp_path / f"run{len(started)}",
            overrides={**node_overrides, **overrides},
        )
        started.append(proc)
        return proc

    with domain_lease() as domain:
        try:
            yield run
        finally:
            for proc in started:
                proc.kill()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_importing_ends_start_up(
    launch: Callable[..., NodeProcess], tmp_path: Path, sig: signal.Signals
) -> None:
    """Signalled as soon as the entry point handles it: rclpy, TVM and the models are still
    being imported (before the handlers, SIGTERM killed the process with -15 and SIGINT
    printed a KeyboardInterrupt traceback)."""
    proc = launch(model_cache_dir=str(tmp_path / "cold"))
    # Python itself handles SIGINT from its first instant; SIGTERM's handler is the
    # entry point's (installed with its SIGINT one), so it tells when the package took over.
    wait_for(proc, lambda: catches(proc.pid, signal.SIGTERM), "signal handler")
    check_clean_exit(proc, *stop(proc, sig), BUILT)


def test_a_signal_during_a_cold_generic_build_ends_start_up(
    launch: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    """Once the first generic build is in the cache, the next one is being built: seconds
    inside TVM, which the node no longer waits out."""
    cache = tmp_path / "cold"
    proc = launch(model_cache_dir=str(cache))

    def one_built() -> bool:
        return cache.is_dir() and any(not p.name.startswith(".") for p in cache.iterdir())

    wait_for(proc, one_built, "generic build")
    check_clean_exit(proc, *stop(proc, signal.SIGTERM), BUILT)


@pytest.fixture
def warm_cache(tmp_path: Path, node_overrides: dict[str, bool | int | float | str]) -> Path:
    """A cache that holds every generic build, as a node's second start finds it."""
    cache = tmp_path / "warm"
    weights = str(node_overrides["weights_dir"])
    folder = Path(weights) if weights else None
    with Engine("x86_64", JitConfig(mode="off"), cache_dir=cache, weights_dir=folder):
        pass
    return cache


def test_a_signal_during_a_frozen_warm_up_ends_start_up(
    launch: Callable[..., NodeProcess], tmp_path: Path, warm_cache: Path
) -> None:
    """A frozen JIT compiles the shape log's hot keys before the node spins. Signalled once its
    compile worker runs (starting, then compiling those keys), the node stops waiting for
    them: it took 36 s before."""
    shapes = tmp_path / "shapes.yaml"
    entries = [{"function": "forward", "dims": d, "calls": 100} for d in HOT_SHAPES]
    shapes.write_text(yaml.safe_dump({"version": 1, "models": {"predictor": entries}}))
    proc = launch(
        model_cache_dir=str(warm_cache),
        **{"jit.mode": "frozen", "jit.warm_up_shapes": str(shapes), "jit.compile_mode": "process"},
    )
    node = psutil.Process(proc.pid)
    wait_for(proc, lambda: bool(node.children(recursive=True)), "compile worker")
    check_clean_exit(proc, *stop(proc, signal.SIGTERM), WARMED)
    # What the killed worker was writing went with it.
    assert not list(warm_cache.glob(".stage-*"))
