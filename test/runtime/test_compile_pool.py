"""The compile pool and its worker: yielding to heavy calls, one-function builds, validation."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynshape_perception.compiler.cache import SIDECAR
from dynshape_perception.errors import ConfigError, ValidationError
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime import compile_pool as compile_pool_module
from dynshape_perception.runtime import compile_workers
from dynshape_perception.runtime.compile_pool import (
    TRIAL_MARGIN,
    TRIAL_SAMPLES,
    TRIAL_STRETCH,
    CompilePool,
    choose_mode,
)
from dynshape_perception.runtime.compile_workers import (
    WORKER_NICENESS,
    DaemonThreadExecutor,
    build_specialisation,
    compile_to_cache,
    validate_in_worker,
)
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import InterferenceMeter, JitConfig
from dynshape_perception.runtime.shapes import Padding, Signature, sample_inputs
from dynshape_perception.runtime.validation import CompileRequest, CompileResult
from dynshape_perception.testing.faults import (
    STALL_S,
    crashing_compiler_fault_injector,
    failing_compiler_fault_injector,
    slow_or_crashing_compiler_fault_injector,
    stalling_compiler_fault_injector,
)

ASSOC = model_definition("associator")
PRED = model_definition("predictor")
WEIGHTS = {
    "associator": init_weights(parameter_shapes(ASSOC), seed=8),
    "predictor": init_weights(parameter_shapes(PRED), seed=8),
}

# A bound on a hang, not a timing: a worker process imports TVM in seconds on an idle host
# and in minutes on one loaded many times over.
WORKER_START_S = 600.0


def process_state(pid: int) -> str:
    """The scheduler state letter of a process: R, S, D, T (stopped), ..."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def settles_to(pid: int, states: str, within_s: float = 10.0) -> bool:
    """Signals land asynchronously: the process changes state when it next runs, which for an
    idle-priority worker beside a busy CPU can take a while. Poll until it does."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if process_state(pid) in states:
            return True
        time.sleep(0.001)
    return process_state(pid) in states


def worker_pids(pool: CompilePool) -> list[int]:
    return [p.pid for p in getattr(pool._executor, "_processes", {}).values() if p.pid]


def request(key: Signature, cache_root: Path, model: str = "associator") -> CompileRequest:
    definition = model_definition(model)
    sample = sample_inputs(definition, key.function, key.as_dict(), seed=1)
    return CompileRequest(model, "x86_64", key, str(cache_root), sample=sample)


def test_a_heavy_call_suspends_the_running_compile_process(tmp_path: Path) -> None:
    done = threading.Event()
    results: list[str] = []

    def on_done(key: Signature, result: CompileResult | None, s: float, reason: str) -> None:
        results.append(reason)
        done.set()

    pool = CompilePool(
        WEIGHTS,
        "x86_64",
        tmp_path,
        mode="process",
        compile_fn=stalling_compiler_fault_injector,
    )
    try:
        # A worker still importing has set no parent-death guard and is never stopped.
        assert pool.wait_started(WORKER_START_S)
        key = Signature.of("forward", {"N": 4, "M": 4})
        assert pool.submit(request(key, tmp_path), 1.0, on_done)
        deadline = time.monotonic() + 60
        while not pool.compiling_now() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.compiling_now()
        (pid,) = worker_pids(pool)
        time.sleep(0.2)
        assert process_state(pid) in "RS"
        with pool.yielding():
            assert settles_to(pid, "T"), "the compile is stopped while the call runs"
            assert not pool.compiling_now()
            with pool.yielding():
                assert process_state(pid) == "T"
            assert process_state(pid) == "T", "nested yields resume only at the outermost"
            time.sleep(STALL_S + 0.5)
            assert not done.is_set(), "a stopped compile makes no progress"
        assert settles_to(pid, "RS")
        assert done.wait(STALL_S + 30), "the compile resumes and finishes after the call"
        assert results and "injected stall" in results[0]
        assert pool.yields == 1 and pool.yield_s >= STALL_S
    finally:
        pool.shutdown()


def test_shutdown_while_suspended_does_not_hang(tmp_path: Path) -> None:
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="process", compile_fn=stalling_compiler_fault_injector
    )
    assert pool.wait_started(WORKER_START_S)
    key = Signature.of("forward", {"N": 4, "M": 4})
    pool.submit(request(key, tmp_path), 1.0, lambda *a: None)
    deadline = time.monotonic() + 60
    while not pool.compiling_now() and time.monotonic() < deadline:
        time.sleep(0.01)
    (pid,) = worker_pids(pool)
    ctx = pool.yielding()
    ctx.__enter__()
    assert settles_to(pid, "T")
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 15
    time.sleep(0.5)
    assert not Path(f"/proc/{pid}").exists() or process_state(pid) in "ZX"


def test_thread_pools_cannot_yield(tmp_path: Path) -> None:
    pool = CompilePool(WEIGHTS, "x86_64", tmp_path, mode="thread")
    try:
        assert not pool.can_yield
        with pool.yielding():
            assert pool.yields == 0
    finally:
        pool.shutdown()


def test_a_specialisation_holds_only_its_function(cache_root: Path) -> None:
    key = Signature.of("decode", {"A": 3})
    result = compile_to_cache(request(key, cache_root, "predictor"), WEIGHTS["predictor"])
    side = json.loads((Path(result.path).parent / SIDECAR).read_text())
    assert side["functions"] == ["decode"] and side["pinned_dims"] == {"A": 3}
    assert result.speedup > 0


def test_small_calls_are_timed_over_more_pairs_than_the_minimum() -> None:
    """Five pairs are a floor: short calls are timed as long as the budget lasts, long ones
    stop at the floor, and nothing runs past the cap of pairs."""
    from dynshape_perception.runtime import validation

    calls = {"special": 0, "generic": 0}
    # A clock that a call advances by its duration: the pair count depends on no host timing.
    now = [0.0]

    def clock() -> float:
        return now[0]

    def counted(side: str, seconds: float) -> Any:
        def run() -> None:
            calls[side] += 1
            now[0] += seconds

        return run

    budget_s = 0.02
    ratio = validation._interleaved_ratio(
        counted("special", 1e-4), counted("generic", 2e-4), 5, budget_s, clock
    )
    assert ratio == pytest.approx(0.5)
    assert calls["special"] == calls["generic"] == round(budget_s / 3e-4)
    calls.update(special=0, generic=0)
    validation._interleaved_ratio(counted("special", 0.01), counted("generic", 0.01), 5, 0.0, clock)
    assert calls == {"special": 5, "generic": 5}
    calls.update(special=0, generic=0)
    validation._interleaved_ratio(counted("special", 0.0), counted("generic", 0.0), 5, 60.0, clock)
    assert calls["special"] == validation.MAX_TIMED_PAIRS


def test_the_worker_times_a_specialisation_as_a_hit_runs_it(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Padding and cropping are part of every hit, so they are part of its timing."""
    from dynshape_perception.compiler.cache import ArtefactCache
    from dynshape_perception.compiler.targets import load_profile
    from dynshape_perception.runtime import validation
    from dynshape_perception.runtime.executable import LoadedModel

    artefact = ArtefactCache(cache_root).get_or_build(
        ASSOC, WEIGHTS["associator"], load_profile("x86_64")
    )
    generic = LoadedModel(ASSOC, artefact.library_path)
    key = Signature.of("forward", {"N": 4, "M": 4})
    sample = sample_inputs(ASSOC, "forward", {"N": 3, "M": 2}, seed=1)
    checked = CompileRequest(
        "associator",
        "x86_64",
        key,
        str(cache_root),
        weak_edges={"N": (4,), "M": (4,)},
        sample=sample,
    )
    real_pad = Padding.pad

    def slow_padding_fault_injector(*args: Any) -> list[np.ndarray]:
        time.sleep(0.002)
        return real_pad(*args)

    monkeypatch.setattr(Padding, "pad", slow_padding_fault_injector)
    # The generic build serves the padded key too: only the padding tells the two apart.
    assert validation.validate(ASSOC, generic, generic, checked) > 5.0


def wrong_weights_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: the build comes out with other numbers than the generic one."""
    wrong = {name: (w * 1.5 + 0.1).astype(w.dtype) for name, w in weights.items()}
    path = build_specialisation(request, wrong).library_path
    return CompileResult(str(path), 0.0, validate_in_worker(request, weights, path))


def test_a_specialisation_that_differs_from_generic_is_a_strike(cache_root: Path) -> None:
    key = Signature.of("forward", {"N": 4, "M": 4})
    with pytest.raises(ValidationError, match="differ from the generic build"):
        wrong_weights_compiler_fault_injector(request(key, cache_root), WEIGHTS["associator"])
    config = JitConfig(
        mode="adaptive",
        hotness_threshold=2,
        compile_mode="thread",
        min_benefit_ms=-1e12,
        accept_ratio=100.0,
        weak_edges={"associator": {"N": (4,), "M": (4,)}},
    )
    with Engine(
        "x86_64",
        config,
        cache_dir=cache_root,
        models=("associator",),
        weights={"associator": WEIGHTS["associator"]},
        compile_fn=wrong_weights_compiler_fault_injector,
    ) as eng:
        inputs = sample_inputs(ASSOC, "forward", {"N": 3, "M": 2}, seed=4)
        want = eng["associator"].generic.run_unchecked("forward", inputs)
        for _ in range(3):
            got = eng["associator"]("forward", *inputs)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
            assert eng.pool is not None and eng.pool.wait_idle(120)
        assert eng.metrics.hits == 0 and eng.metrics.compiles_failed >= 1
        assert "differ from the generic build" in eng.metrics.events[0].reason


def test_a_library_for_another_key_is_refused(cache_root: Path, tmp_path: Path) -> None:
    from dynshape_perception.runtime.specialisations import check_sidecar

    built = compile_to_cache(
        request(Signature.of("forward", {"N": 4, "M": 4}), cache_root), WEIGHTS["associator"]
    )
    check_sidecar(Path(built.path), "associator", Signature.of("forward", {"N": 4, "M": 4}))
    with pytest.raises(ValidationError, match="not forward"):
        check_sidecar(Path(built.path), "associator", Signature.of("forward", {"N": 8, "M": 4}))
    with pytest.raises(ValidationError, match="holds"):
        check_sidecar(Path(built.path), "predictor", Signature.of("forward", {"N": 4, "M": 4}))
    # Truncated after the worker validated it: loading it would crash the process (SIGBUS).
    # A copy is damaged: the cached file may be mapped into this process already.
    copy = tmp_path / "copy"
    copy.mkdir()
    data = Path(built.path).read_bytes()
    (copy / Path(built.path).name).write_bytes(data[: len(data) // 2])
    shutil.copy(Path(built.path).parent / SIDECAR, copy / SIDECAR)
    with pytest.raises(ValidationError, match="checksum"):
        check_sidecar(
            copy / Path(built.path).name, "associator", Signature.of("forward", {"N": 4, "M": 4})
        )


def run_one(pool: CompilePool, n: int, cache_root: Path) -> str:
    done = threading.Event()
    reasons: list[str] = []

    def on_done(key: Signature, result: CompileResult | None, s: float, reason: str) -> None:
        reasons.append(reason)
        done.set()

    assert pool.submit(request(Signature.of("forward", {"N": n, "M": 1}), cache_root), 1.0, on_done)
    assert done.wait(WORKER_START_S)
    return reasons[0]


def trial_pool(tmp_path: Path) -> tuple[CompilePool, InterferenceMeter]:
    """An auto pool whose compiles fail at once, with a meter the test feeds by hand."""
    meter = InterferenceMeter(prior_weight=0.5, min_samples=3)
    pool = CompilePool(
        WEIGHTS,
        "x86_64",
        tmp_path,
        mode="auto",
        compile_fn=failing_compiler_fault_injector,
        meter=meter,
    )
    # Else the first compile's clock runs through the worker's import of TVM, and on a loaded
    # host it times out before the injected failure.
    assert pool.wait_started(WORKER_START_S)
    return pool, meter


@pytest.mark.parametrize(
    ("thread_ratio", "chosen"), [(1.1, "thread"), (1.49, "process"), (2.0, "process")]
)
def test_auto_mode_measures_process_then_thread_and_keeps_the_gentler(
    tmp_path: Path, thread_ratio: float, chosen: str
) -> None:
    pool, meter = trial_pool(tmp_path)
    try:
        assert pool.mode == "process" and pool.can_yield
        assert "injected" in run_one(pool, 1, tmp_path), "a compile too few calls saw: no switch"
        assert pool.mode == "process"
        for _ in range(TRIAL_SAMPLES):
            meter.observe(1.0, 1.0, None)
            meter.observe(1.5, 1.0, "process")
        run_one(pool, 2, tmp_path)
        assert pool.mode == "thread" and not pool.choice and not pool.can_yield
        for _ in range(TRIAL_SAMPLES):
            meter.observe(thread_ratio, 1.0, "thread")
        run_one(pool, 3, tmp_path)
        assert pool.choice["mode"] == chosen and pool.mode == chosen
        assert pool.choice["slowdown"]["process"] == pytest.approx(0.5)
        assert "injected" in run_one(pool, 4, tmp_path), "compiles go on in the chosen mode"
    finally:
        pool.shutdown()


@pytest.mark.parametrize(
    ("slowdown", "stretch", "chosen"),
    [
        # A clear difference in slowdown decides, however stretched the process compiles.
        ({"process": 0.30, "thread": 0.05}, 1.0, "thread"),
        ({"process": 0.00, "thread": 0.05}, 3.0, "process"),
        # Within the margin, threads win only where stops stretched process compiles.
        ({"process": 0.0, "thread": 0.0}, 2.7, "thread"),
        ({"process": 0.01, "thread": 0.02}, 1.2, "process"),
        # No successful process compile: the stretch is unknown, so process.
        ({"process": 0.0, "thread": 0.0}, None, "process"),
    ],
)
def test_the_trial_prefers_the_gentler_mode_then_the_unstretched_one(
    slowdown: dict[str, float], stretch: float | None, chosen: str
) -> None:
    assert choose_mode(slowdown, stretch) == chosen


def test_the_stretch_tie_break_sits_exactly_at_its_ratio() -> None:
    even = {"process": 0.1, "thread": 0.1 + TRIAL_MARGIN / 2}
    assert choose_mode(even, TRIAL_STRETCH) == "thread"
    assert choose_mode(even, TRIAL_STRETCH * 0.99) == "process"


def test_the_trial_measures_how_long_process_compiles_were_stopped(cache_root: Path) -> None:
    pool = CompilePool(WEIGHTS, "x86_64", cache_root, mode="auto")
    done = threading.Event()
    try:
        assert pool.wait_started(WORKER_START_S)
        key = Signature.of("forward", {"N": 7, "M": 5})
        assert pool.submit(request(key, cache_root), 1.0, lambda *_: done.set())
        deadline = time.monotonic() + 60
        while pool.compiling_now() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        with pool.yielding():
            time.sleep(0.5)
        assert done.wait(WORKER_START_S)
        assert pool._trial_stopped_s >= 0.45
        assert pool._trial_wall_s > pool._trial_stopped_s
    finally:
        pool.shutdown()


def test_unknown_compile_mode_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="compile mode must be auto, process or thread"):
        CompilePool(WEIGHTS, "x86_64", tmp_path, mode="fork")


def sleeping_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: a compile that takes 2 s (a thread cannot be stopped), then fails."""
    time.sleep(2.0)
    raise RuntimeError("injected slow compile")


def test_a_timed_out_thread_compile_is_abandoned_and_holds_back_the_next(tmp_path: Path) -> None:
    done: list[tuple[Signature, str, float]] = []
    pool = CompilePool(
        WEIGHTS,
        "x86_64",
        tmp_path,
        mode="thread",
        timeout_s=0.3,
        compile_fn=sleeping_compiler_fault_injector,
    )
    try:
        first = Signature.of("forward", {"N": 4, "M": 4})
        second = Signature.of("forward", {"N": 5, "M": 5})
        started = time.monotonic()
        pool.submit(request(first, tmp_path), 2.0, lambda k, r, s, why: done.append((k, why, 0)))
        pool.submit(
            request(second, tmp_path),
            1.0,
            lambda k, r, s, why: done.append((k, why, time.monotonic() - started)),
        )
        assert pool.wait_idle(30.0)
        assert [(k, why) for k, why, _ in done] == [(first, "timeout"), (second, "timeout")]
        # The second compile did not start beside the abandoned first one, still running.
        assert done[1][2] >= 2.0
        # The abandoned threads are daemons: they cannot keep the process from exiting.
        builders = [t for t in threading.enumerate() if t.name.startswith("jit-build")]
        assert builders and all(t.daemon for t in builders)
    finally:
        pool.shutdown()


def test_a_paused_pool_is_quiet_once_its_running_compile_delivered(tmp_path: Path) -> None:
    """``wait_quiet`` returns once the running compile's result is delivered; the queued one
    stays queued while paused, so counters read then cannot move."""
    called: list[str] = []
    pool = running_thread_compile(tmp_path, called)
    try:
        queued = Signature.of("forward", {"N": 6, "M": 6})
        pool.submit(request(queued, tmp_path), 1.0, lambda *a: called.append("queued"))
        pool.pause()
        assert pool.wait_quiet(30.0)
        assert called == ["done"] and pool.busy == 0
        assert pool.in_flight("associator", queued) and not pool.idle(settle=False)
        pool.resume()
        assert pool.wait_idle(30.0)
        assert called == ["done", "queued"]
    finally:
        pool.shutdown()


def running_thread_compile(tmp_path: Path, called: list[str]) -> CompilePool:
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="thread", compile_fn=sleeping_compiler_fault_injector
    )
    pool.submit(
        request(Signature.of("forward", {"N": 4, "M": 4}), tmp_path),
        1.0,
        lambda *a: called.append("done"),
    )
    deadline = time.monotonic() + 5
    while not pool.compiling_now() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.compiling_now() == "thread"
    return pool


def compile_threads(pool: CompilePool) -> list[threading.Thread]:
    executor = pool._executor
    assert isinstance(executor, DaemonThreadExecutor)
    return [t for t in executor.threads if t.is_alive()]


def test_close_lets_a_running_thread_compile_return(tmp_path: Path) -> None:
    called: list[str] = []
    pool = running_thread_compile(tmp_path, called)
    assert compile_threads(pool)
    pool.shutdown()
    assert not compile_threads(pool), "no compile thread may outlive the pool's close"
    assert called == [], "a closed pool reports nothing"


def test_close_abandons_a_thread_compile_past_its_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_workers, "EXIT_WAIT_S", 0.2)
    pool = running_thread_compile(tmp_path, [])
    started = time.monotonic()
    pool.shutdown()
    assert time.monotonic() - started < 1.5
    assert compile_threads(pool), "a hung compile is abandoned, not waited for"
    for thread in compile_threads(pool):
        thread.join(5.0)


EXIT_WHILE_COMPILING = """
import sys
from pathlib import Path
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.runtime.shapes import sample_inputs
from dynshape_perception.models import model_definition

config = JitConfig(mode="adaptive", hotness_threshold=2, compile_mode="thread",
                   prior_compile_s=0.0, prior_speedup=0.5, accept_ratio=100.0,
                   min_benefit_ms=-1e12)
with Engine("x86_64", config, cache_dir=Path(sys.argv[1]), models=("associator",)) as engine:
    x = sample_inputs(model_definition("associator"), "forward", {"N": 7, "M": 3}, 0)
    for _ in range(3):
        engine["associator"]("forward", *x)
    engine.metrics.settle()
"""


def test_a_process_closing_its_engine_mid_compile_exits_cleanly(cache_root: Path) -> None:
    """A real TVM compile in a thread when the process exits: before closing waited for it,
    the interpreter's exit aborted the process (std::terminate, status 134)."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_COMPILING, str(cache_root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_raising_completion_callback_does_not_stall_the_pool(tmp_path: Path) -> None:
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="thread", compile_fn=failing_compiler_fault_injector
    )
    seen: list[Signature] = []

    def broken_callback_fault_injector(key: Signature, *rest: object) -> None:
        seen.append(key)
        raise RuntimeError("injected callback failure")

    try:
        for n in (4, 5):
            key = Signature.of("forward", {"N": n, "M": n})
            pool.submit(request(key, tmp_path), 1.0, broken_callback_fault_injector)
        assert pool.wait_idle(30.0)
        assert len(seen) == 2
        assert not pool.in_flight("associator", Signature.of("forward", {"N": 4, "M": 4}))
    finally:
        pool.shutdown()


def test_stopped_time_does_not_count_against_the_compile_timeout(tmp_path: Path) -> None:
    """A worker stopped through heavy calls for longer than the timeout is not timed out."""
    done: list[str] = []
    pool = CompilePool(
        WEIGHTS,
        "x86_64",
        tmp_path,
        mode="process",
        timeout_s=STALL_S + 2.0,
        compile_fn=stalling_compiler_fault_injector,
    )
    try:
        # Else the stop may land while the worker still imports TVM, and the import (seconds
        # under load) plus the whole stall after the resume overruns the timeout.
        assert pool.wait_started(WORKER_START_S)
        pool.submit(
            request(Signature.of("forward", {"N": 4, "M": 4}), tmp_path),
            1.0,
            lambda k, r, s, why: done.append(why),
        )
        deadline = time.monotonic() + 60
        while not pool.compiling_now() and time.monotonic() < deadline:
            time.sleep(0.01)
        with pool.yielding():
            time.sleep(STALL_S + 2.5)
        assert pool.wait_idle(30.0)
        assert done and done[0] != "timeout" and "injected stall" in done[0]
    finally:
        pool.shutdown()


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_the_worker_process_runs_at_idle_priority_from_its_spawn(tmp_path: Path) -> None:
    """Lowered before the interpreter has imported anything: that import takes seconds of CPU
    beside the serving thread."""
    pool = CompilePool(WEIGHTS, "x86_64", tmp_path, mode="process")
    try:
        assert worker_pids(pool) == [], "workers start with the first compile, or on request"
        pool.start_workers()
        (pid,) = worker_pids(pool)
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        assert os.getpriority(os.PRIO_PROCESS, pid) == WORKER_NICENESS
        assert not pool.wait_started(0.0), "still importing: the check ran before its start"
        assert pool.wait_started(WORKER_START_S)
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
    finally:
        pool.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps: Linux")
def test_the_worker_process_imports_the_compiler_and_never_pytorch(tmp_path: Path) -> None:
    """tvm_ffi imports PyTorch whenever it is installed: about 200 MB per worker, unused."""
    pytest.importorskip("torch", reason="only where PyTorch is installed can it be kept out")
    pool = CompilePool(WEIGHTS, "x86_64", tmp_path, mode="process")
    try:
        pool.start_workers()
        assert pool.wait_started(WORKER_START_S)
        (pid,) = worker_pids(pool)
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "libtvm" in maps and "libtorch" not in maps
    finally:
        pool.shutdown()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority: Linux")
def test_a_compile_thread_runs_at_idle_priority_and_the_caller_does_not() -> None:
    def own_priority() -> tuple[int, int]:
        tid = threading.get_native_id()
        return os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)

    caller = own_priority()
    executor = DaemonThreadExecutor("priority-check")
    assert executor.submit(own_priority).result(timeout=5.0) == (os.SCHED_IDLE, WORKER_NICENESS)
    assert own_priority() == caller, "only the compile thread is lowered"
    assert caller[0] != os.SCHED_IDLE


def test_a_crashed_worker_is_a_strike_and_the_next_compile_gets_a_new_one(
    tmp_path: Path,
) -> None:
    done: list[tuple[Signature, CompileResult | None, str]] = []
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="process", compile_fn=crashing_compiler_fault_injector
    )
    try:
        assert pool.wait_started(WORKER_START_S)
        (first_pid,) = worker_pids(pool)
        crashing = Signature.of("forward", {"N": 3, "M": 3})
        healthy = Signature.of("forward", {"N": 4, "M": 4})
        # Both queued before either runs, so the crash comes first (the larger benefit).
        pool.pause()
        pool.submit(request(crashing, tmp_path), 2.0, lambda k, r, s, w: done.append((k, r, w)))
        pool.submit(request(healthy, tmp_path), 1.0, lambda k, r, s, w: done.append((k, r, w)))
        pool.resume()
        assert pool.wait_idle(180.0)
        (k1, r1, why1), (k2, r2, why2) = done
        assert k1 == crashing and r1 is None and why1.startswith("worker crashed")
        assert k2 == healthy and r2 is not None and why2 == ""
        assert worker_pids(pool) and worker_pids(pool) != [first_pid]
    finally:
        pool.shutdown()


def timing_out_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: a compiler whose own wait times out (a lock, a remote cache)."""
    raise TimeoutError("injected timeout inside the compiler")


def test_a_compiler_raising_timeout_error_fails_without_a_restart(tmp_path: Path) -> None:
    """Its TimeoutError is its failure, not a hang of the pool's making."""
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="thread", compile_fn=timing_out_compiler_fault_injector
    )
    try:
        pool.start_workers()
        executor = pool._executor
        assert executor is not None
        assert run_one(pool, 1, tmp_path) == "injected timeout inside the compiler"
        assert pool._executor is executor
    finally:
        pool.shutdown()


def test_an_auto_pool_whose_compile_thread_hangs_compiles_in_processes_after(
    tmp_path: Path,
) -> None:
    """A hung thread cannot be ended, a process can."""
    pool = CompilePool(
        WEIGHTS,
        "x86_64",
        tmp_path,
        mode="auto",
        timeout_s=0.3,
        compile_fn=sleeping_compiler_fault_injector,
    )
    try:
        with pool._cv:
            pool._replace_executor("thread")  # the trial's thread phase
        assert run_one(pool, 1, tmp_path) == "timeout"
        assert pool.mode == "process" and pool.can_yield
        assert pool.choice == {"mode": "process", "reason": "a compile thread hung"}
    finally:
        pool.shutdown()


def test_the_trial_chooses_on_what_it_measured_once_compiles_run_dry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_pool_module, "TRIAL_DRY_S", 0.3)
    pool, meter = trial_pool(tmp_path)
    try:
        for _ in range(10):
            meter.observe(1.0, 1.0, None)
            meter.observe(1.5, 1.0, "process")
        with pool._cv:
            pool._replace_executor("thread")
        run_one(pool, 1, tmp_path)
        time.sleep(1.5)
        assert not pool.choice, "no verdict while the thread mode is unmeasured"
        for _ in range(10):
            meter.observe(1.1, 1.0, "thread")
        deadline = time.monotonic() + 10
        while not pool.choice and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.choice["mode"] == "thread" and pool.mode == "thread"
        assert pool.choice["slowdown"] == {"process": 0.5, "thread": pytest.approx(0.1)}
    finally:
        pool.shutdown()


def test_a_crash_beside_other_compiles_is_charged_to_the_crashing_key_alone(
    tmp_path: Path,
) -> None:
    """A broken pool of two cannot say whose compile crashed: each job it broke runs again
    alone, where a crash is its own."""
    done: dict[Signature, str] = {}
    pool = CompilePool(
        WEIGHTS,
        "x86_64",
        tmp_path,
        size=2,
        mode="process",
        compile_fn=slow_or_crashing_compiler_fault_injector,
    )
    try:
        assert pool.wait_started(WORKER_START_S)
        crashing = Signature.of("forward", {"N": 3, "M": 3})
        healthy = Signature.of("forward", {"N": 4, "M": 4})
        pool.pause()
        for key, benefit in ((crashing, 2.0), (healthy, 1.0)):
            pool.submit(request(key, tmp_path), benefit, lambda k, r, s, why: done.update({k: why}))
        pool.resume()
        assert pool.wait_idle(120.0)
        assert done[crashing].startswith("worker crashed")
        assert done[healthy].startswith("injected slow failure"), done[healthy]
    finally:
        pool.shutdown()


def test_a_yield_interrupted_mid_entry_does_not_hold_compiles_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="thread", compile_fn=failing_compiler_fault_injector
    )

    def interrupted_entry_fault_injector() -> None:
        """Fault injector: Ctrl-C lands after the count went up, before the entry returned."""
        with pool._cv:
            pool._yielding += 1
        raise KeyboardInterrupt

    try:
        monkeypatch.setattr(pool, "enter_yield", interrupted_entry_fault_injector)
        with pytest.raises(KeyboardInterrupt), pool.yielding():
            pass
        assert pool._yielding == 0
        assert "injected" in run_one(pool, 1, tmp_path), "compiles still run"
    finally:
        pool.shutdown()


def test_close_ends_a_worker_stopped_behind_the_pools_back(tmp_path: Path) -> None:
    """A stop the pool did not record (an interrupt between the signal and the record) must
    not leave close waiting on a worker that holds its SIGTERM."""
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="process", compile_fn=stalling_compiler_fault_injector
    )
    assert pool.wait_started(WORKER_START_S)
    (pid,) = worker_pids(pool)
    pool.submit(request(Signature.of("forward", {"N": 4, "M": 4}), tmp_path), 1.0, lambda *a: None)
    os.kill(pid, signal.SIGSTOP)
    assert settles_to(pid, "T")
    closing = threading.Thread(target=pool.shutdown)
    closing.start()
    closing.join(20.0)
    if closing.is_alive():
        os.kill(pid, signal.SIGCONT)
    assert not closing.is_alive(), "close waited on a stopped worker"


def _aged_entry(cache_root: Path, name: str, nbytes: int) -> Path:
    """An entry no sidecar describes, last used long ago: the first a bound evicts."""
    from dynshape_perception.compiler.cache import LIBRARY, RECENT_USE_S

    folder = cache_root / name
    folder.mkdir(parents=True)
    (folder / LIBRARY).write_bytes(b"\0" * nbytes)
    stamp = time.time() - 2 * RECENT_USE_S
    os.utime(folder, (stamp, stamp))
    return folder


def test_a_worker_keeps_the_disk_bound_and_reports_what_it_evicted(tmp_path: Path) -> None:
    stale = _aged_entry(tmp_path, "f" * 32, 64 << 20)
    key = Signature.of("forward", {"N": 5, "M": 5})
    bounded = CompileRequest(**{**request(key, tmp_path).__dict__, "cache_max_bytes": 32 << 20})
    result = compile_to_cache(bounded, WEIGHTS["associator"])
    assert result.disk_evictions == 1 and not stale.exists()
    assert Path(result.path).is_file(), "the build just stored is never the one evicted"


def test_an_engine_prunes_its_cache_at_start_and_counts_it(tmp_path: Path) -> None:
    stale = _aged_entry(tmp_path, "e" * 32, 64 << 20)
    config = JitConfig(mode="off", disk_max_bytes=32 << 20)
    with Engine(cache_dir=tmp_path, models=["associator"], weights=WEIGHTS, jit=config) as engine:
        assert engine.metrics.snapshot()["disk_evictions"] == 1
        assert not stale.exists()
        assert engine.cache.lookup(engine.cache.entries()[0].key) is not None


KILLED_MID_COMPILE = """
import sys
import time
from pathlib import Path

from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.compile_pool import CompilePool
from dynshape_perception.runtime.shapes import Signature, sample_inputs
from dynshape_perception.runtime.validation import CompileRequest
from dynshape_perception.testing.faults import stalling_compiler_fault_injector

if __name__ == "__main__":
    root, stopped = Path(sys.argv[1]), sys.argv[2] == "stopped"
    model = model_definition("associator")
    weights = {"associator": init_weights(parameter_shapes(model), seed=8)}
    pool = CompilePool(
        weights, "x86_64", root, mode="process", compile_fn=stalling_compiler_fault_injector
    )
    assert pool.wait_started(600.0)
    key = Signature.of("forward", {"N": 4, "M": 4})
    sample = sample_inputs(model, "forward", key.as_dict(), seed=1)
    pool.submit(CompileRequest("associator", "x86_64", key, str(root), sample=sample), 1.0,
                lambda *a: None)
    while not pool.compiling_now():
        time.sleep(0.01)
    held = pool.yielding()
    if stopped:
        held.__enter__()
    print("compiling", flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("state", ["running", "stopped"])
def test_a_process_killed_mid_compile_leaves_no_process_behind(tmp_path: Path, state: str) -> None:
    """SIGKILL runs no clean-up: the workers and the resource tracker must end by themselves,
    a worker stopped through a heavy call included."""
    from dynshape_perception.testing.processes import (
        ORPHAN_WAIT_S,
        kill_session,
        session_left,
        session_members,
    )

    script = tmp_path / "killed.py"
    script.write_text(KILLED_MID_COMPILE)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "cache"), state],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "compiling\n"
        members = session_members(proc.pid)
        workers = [p for p, cmd in members.items() if "spawn_main" in cmd]
        assert workers and any("resource_tracker" in cmd for cmd in members.values()), members
        if state == "stopped":
            assert all(settles_to(p, "T") for p in workers)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=ORPHAN_WAIT_S)
        assert session_left(proc.pid) == {}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        kill_session(proc.pid)
        proc.wait()
