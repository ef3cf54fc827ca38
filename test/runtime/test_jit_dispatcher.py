"""The JIT dispatcher: equivalence with the generic path, guards, strikes, LRU, threads, warm-up."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.errors import CacheError, ConfigError
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime import compile_workers
from dynshape_perception.runtime import dispatcher as dispatcher_module
from dynshape_perception.runtime.bookkeeper import Bookkeeper
from dynshape_perception.runtime.compile_pool import CompileFn
from dynshape_perception.runtime.compile_workers import compile_to_cache
from dynshape_perception.runtime.dispatcher import JUDGE_HITS
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.runtime.shape_log import dump_shape_log, load_shape_log
from dynshape_perception.runtime.shapes import Signature, sample_inputs
from dynshape_perception.runtime.specialisations import Specialisation
from dynshape_perception.runtime.validation import CompileRequest, CompileResult
from dynshape_perception.scheduling.executor import ExecutorOptions, TieredExecutor
from dynshape_perception.testing.faults import (
    failing_compiler_fault_injector,
    failing_worker_start_fault_injector,
    stalling_compiler_fault_injector,
)
from dynshape_perception.testing.workers import maps_tvm

RTOL, ATOL = 1e-4, 1e-5
ASSOC = model_definition("associator")
PRED = model_definition("predictor")
WEIGHTS = {
    "associator": init_weights(parameter_shapes(ASSOC), seed=8),
    "predictor": init_weights(parameter_shapes(PRED), seed=8),
}
# A bound on a hang, not a timing: how long an ended worker process may take to be gone.
EXIT_BOUND_S = 120.0
EDGES = {
    "associator": {"N": (4, 16, 128), "M": (4, 16, 128)},
    "predictor": {"A": (2, 4, 8), "T": (8, 32, 128)},
}


def eager_config(**overrides: object) -> JitConfig:
    """Specialise on the second call and accept any specialisation that validates."""
    values: dict[str, object] = dict(
        mode="adaptive",
        hotness_threshold=2,
        compile_mode="thread",
        prior_compile_s=0.0,
        prior_speedup=0.5,
        accept_ratio=100.0,
        min_benefit_ms=-1e12,
        weak_edges=EDGES,
    )
    values.update(overrides)
    return JitConfig(**values)  # type: ignore[arg-type]


def associator_engine(
    cache_root: Path,
    config: JitConfig | None = None,
    compile_fn: CompileFn = compile_to_cache,
    bookkeeper: Bookkeeper | None = None,
) -> Engine:
    return Engine(
        "x86_64",
        config or eager_config(),
        cache_dir=cache_root,
        models=("associator",),
        weights=WEIGHTS,
        compile_fn=compile_fn,
        bookkeeper=bookkeeper,
    )


@pytest.fixture()
def engine(cache_root: Path) -> Iterator[Engine]:
    with Engine(
        "x86_64",
        eager_config(),
        cache_dir=cache_root,
        models=("associator", "predictor"),
        weights=WEIGHTS,
    ) as eng:
        yield eng


def independent_guard(key: Signature, sig: Signature, edges: Mapping[str, tuple[int, ...]]) -> bool:
    """The guard, re-derived from the edges without the dispatcher's own code."""
    for (kd, kv), (sd, sv) in zip(key.dims, sig.dims, strict=True):
        if kd != sd or kv < sv:
            return False
        if kd in edges and sv > 0:
            lower = max([0, *[e for e in edges[kd] if e < kv]])
            if not (lower < sv <= kv) and kv != sv:
                return False
        elif kv != sv:
            return False
    return True


def call_inputs(model: str, dims: dict[str, int], seed: int) -> list[np.ndarray]:
    definition = ASSOC if model == "associator" else PRED
    return sample_inputs(definition, "forward", dims, seed)


shape_stream = st.lists(
    st.one_of(
        st.tuples(st.just("associator"), st.integers(0, 20), st.integers(0, 20)),
        st.tuples(st.just("predictor"), st.integers(0, 9), st.integers(1, 40)),
    ),
    min_size=4,
    max_size=14,
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(stream=shape_stream)
def test_outputs_equal_generic_and_guards_hold(
    engine: Engine, stream: list[tuple[str, int, int]]
) -> None:
    generic = {
        name: LoadedModel(d.model, d.generic.library_path) for name, d in engine.dispatchers.items()
    }
    calls = []
    for i, (model, a, b) in enumerate(stream * 2):
        dims = {"N": a, "M": b} if model == "associator" else {"A": a, "T": b}
        calls.append((model, dims, call_inputs(model, dims, seed=i)))
    for rnd in range(2):
        for model, _, inputs in calls:
            got = engine[model]("forward", *inputs)
            want = generic[model]("forward", *inputs)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        if rnd == 0:
            assert engine.pool is not None and engine.pool.wait_idle(120)
    for name, dispatcher in engine.dispatchers.items():
        for key, sig in dispatcher.hit_log:
            assert independent_guard(key, sig, EDGES[name]), (key, sig)
    if any(min(dims.values()) > 0 for _, dims, _ in calls):
        assert engine.metrics.hits > 0, "the second round must be served by specialisations"


def test_specialisations_serve_hot_shapes(engine: Engine) -> None:
    inputs = call_inputs("associator", {"N": 10, "M": 3}, seed=1)
    for _ in range(3):
        engine["associator"]("forward", *inputs)
    assert engine.pool is not None and engine.pool.wait_idle(120)
    engine["associator"]("forward", *inputs)
    key, sig = engine["associator"].hit_log[-1]
    assert key == Signature.of("forward", {"N": 16, "M": 4})
    assert sig == Signature.of("forward", {"N": 10, "M": 3})
    assert engine.metrics.compiles_ok >= 1
    # The first hit plans the signature's padding; later hits reuse that plan.
    (shape,) = [s for s in engine["associator"]._shapes.values() if s.sig == sig]
    plan = shape.padding
    assert plan is not None and not plan.identity
    engine["associator"]("forward", *inputs)
    assert engine["associator"].hit_log[-1] == (key, sig) and shape.padding is plan


def test_failing_compiler_three_strikes_then_blacklisted(
    cache_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        associator_engine(cache_root, compile_fn=failing_compiler_fault_injector) as eng,
        caplog.at_level(logging.WARNING),
    ):
        inputs = call_inputs("associator", {"N": 5, "M": 5}, seed=2)
        want = eng["associator"].generic.run_unchecked("forward", inputs)
        for _ in range(12):
            got = eng["associator"]("forward", *inputs)
            np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)
            assert eng.pool is not None
            eng.pool.wait_idle(30)
        key = Signature.of("forward", {"N": 16, "M": 16})
        state = eng["associator"].key_state(key)
        assert state is not None and state.blacklisted and state.strikes == 3
        assert eng.metrics.compiles_failed == 3 and eng.metrics.blacklisted == 1
        assert caplog.text.count("failed to compile 3 times") == 1


def specialise_in_turn(eng: Engine, point_counts: tuple[int, ...]) -> None:
    """Make the associator's (N=n, M=2) hot for each n in order, each compile finished before
    the next shape, so that the keys enter the cache in that order."""
    for n in point_counts:
        inputs = call_inputs("associator", {"N": n, "M": 2}, seed=n)
        for _ in range(2):
            eng["associator"]("forward", *inputs)
        assert eng.pool is not None and eng.pool.wait_idle(120)


def test_lru_bounds_count_and_bytes(cache_root: Path) -> None:
    with associator_engine(cache_root, eager_config(max_entries=2)) as eng:
        specialise_in_turn(eng, (3, 10, 50))
        assert len(eng["associator"].cache) == 2 and eng.metrics.evictions == 1
        oldest = Signature.of("forward", {"N": 4, "M": 4})
        assert oldest not in eng["associator"].cache.keys()
        # Hits reach a specialisation through its key state: eviction must unlink it there,
        # or the evicted library would stay loaded (and keep serving) past the bound.
        evicted = eng["associator"].key_state(oldest)
        assert evicted is not None and evicted.entry is None
        for kept in eng["associator"].cache.keys():
            state = eng["associator"].key_state(kept)
            assert state is not None and state.entry is not None and state.entry.live
        hits = eng.metrics.hits
        eng["associator"]("forward", *call_inputs("associator", {"N": 3, "M": 2}, seed=3))
        assert eng.metrics.hits == hits, "a call of the evicted key is served generic"
    with associator_engine(cache_root, eager_config(max_bytes=1)) as eng:
        specialise_in_turn(eng, (3, 10))
        assert len(eng["associator"].cache) == 1 and eng.metrics.evictions == 1


def test_concurrent_callers(engine: Engine) -> None:
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for i in range(40):
                dims = {"N": int(rng.integers(0, 20)), "M": int(rng.integers(0, 20))}
                inputs = call_inputs("associator", dims, seed=seed * 100 + i)
                got = engine["associator"]("forward", *inputs)[0]
                want = ASSOC.reference("forward", WEIGHTS["associator"], inputs)[0]
                np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[0]
    assert engine.metrics.calls == 160


def test_warm_up_profile_round_trip(cache_root: Path, tmp_path: Path) -> None:
    profile = tmp_path / "shapes.yaml"
    with associator_engine(cache_root, eager_config(mode="off")) as eng:
        for _ in range(5):
            eng["associator"]("forward", *call_inputs("associator", {"N": 12, "M": 7}, seed=3))
        eng.record_shapes(profile)
    assert "N: 12" in profile.read_text()
    with associator_engine(cache_root, eager_config(mode="frozen")) as eng:
        assert eng.warm_up(profile, wait_s=120) == 1
        eng["associator"]("forward", *call_inputs("associator", {"N": 12, "M": 7}, seed=4))
        assert eng.metrics.hits == 1, "a warm start serves the first call specialised"
        for _ in range(5):
            eng["associator"]("forward", *call_inputs("associator", {"N": 2, "M": 2}, seed=5))
        # Settled and drained: a compile the calls had queued would have landed by now.
        eng["associator"].settle()
        assert eng.pool is not None and eng.pool.wait_idle(120)
        assert eng.metrics.compiles_ok == 1, "frozen mode compiles nothing new"
        assert eng["associator"].accepted_keys() == [Signature.of("forward", {"N": 16, "M": 16})]


def test_profile_and_latency_rows_drop_signatures_seen_once_past_their_bound(
    monkeypatch: pytest.MonkeyPatch, cache_root: Path
) -> None:
    monkeypatch.setattr(dispatcher_module, "PROFILE_MAX", 16)
    # Calls stay queued until something settles them: pruning must count them all the same.
    with associator_engine(
        cache_root, eager_config(mode="off"), bookkeeper=Bookkeeper(poll_s=3600.0)
    ) as eng:
        d = eng["associator"]
        hot = Signature.of("forward", {"N": 5, "M": 5})
        for n in range(1, 40):
            d("forward", *call_inputs("associator", {"N": 5, "M": 5}, seed=5))
            d("forward", *call_inputs("associator", {"N": n, "M": 7}, seed=n))
        counts = d.shape_counts()
        assert len(counts) <= 16
        assert counts[hot] == 39, "a signature called all along is never dropped"
        assert d.shape_counts_dropped > 0
        table = eng.metrics.latency_table()["associator"]
        assert set(table) == {str(sig) for sig in counts}, "one bound for profile and latency"
        assert table[str(hot)]["calls"] == 39
        dropped = eng.metrics.snapshot()["latency_signatures_dropped"]
        assert dropped == d.shape_counts_dropped == 40 - len(counts)
        assert eng.metrics.calls == 78


ONE_ENTRY = "version: 1\nmodels: {associator: [{function: forward, %s}]}"


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (b"\xff\xfe not utf-8", "cannot read"),
        (
            ONE_ENTRY % "dims: {N: 3.9, M: 2}, calls: 9",
            "must be integers",
        ),
        (
            ONE_ENTRY % "dims: {N: true, M: 2}, calls: 9",
            "must be integers",
        ),
        (
            ONE_ENTRY % "dims: {N: 3, M: 2}, calls: -5",
            "negative",
        ),
        (
            ONE_ENTRY % "dims: {N: .inf, M: 2}, calls: 9",
            "must be integers",
        ),
        ("version: 1\nmodels: {associator: [{function: forward, dims: {N: 3}}]}", "needs"),
        ("version: 1\nmodels: [1, 2]", "must be a mapping"),
        ("version: 1\nmodels: {associator: 2024-13-45}", "cannot read"),
        ("version: 1\nmodels: {associator: 7}", "must list"),
        ("version: 1\nmodels: " + "[" * 5000 + "]" * 5000, "cannot read|must be a mapping"),
    ],
)
def test_a_malformed_shape_profile_is_a_config_error(
    tmp_path: Path, text: str | bytes, match: str
) -> None:
    path = tmp_path / "shapes.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_shape_log(path)


def test_warm_up_skips_profile_entries_the_models_cannot_take(
    cache_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A profile from another model version or other bounds: its stray entries are skipped
    with a warning and a count, the rest still warms."""
    profile = tmp_path / "shapes.yaml"
    good = Signature.of("forward", {"N": 12, "M": 7})
    stray = {
        Signature.of("nope", {"N": 3, "M": 3}): 50,
        Signature.of("forward", {"N": 100_000_000_000, "M": 3}): 50,
        Signature.of("forward", {"N": 500, "M": 3}): 50,
        Signature.of("forward", {"N": 3}): 50,
    }
    dump_shape_log({"associator": Counter({good: 20, **stray})}, profile)
    with associator_engine(cache_root, eager_config(mode="frozen")) as eng:
        with caplog.at_level(logging.WARNING):
            assert eng.warm_up(profile, wait_s=120) == 1
        assert eng.metrics.snapshot()["shape_log_entries_skipped"] == 4
        assert eng["associator"].cache.keys() == [eng["associator"].key_of(good)]
    assert "no function 'nope'" in caplog.text and "outside [0, 128]" in caplog.text


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_failed_engine_start_leaves_no_compile_workers(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """The pool exists before the generic builds load: a failure there must close it."""
    get_or_build = ArtefactCache.get_or_build

    def failing_predictor_build_fault_injector(
        self: ArtefactCache, model: Any, *args: Any, **kwargs: Any
    ) -> Any:
        if model.name == "predictor":
            raise CacheError("injected failure of the predictor's generic build")
        return get_or_build(self, model, *args, **kwargs)

    monkeypatch.setattr(ArtefactCache, "get_or_build", failing_predictor_build_fault_injector)
    # Only what this engine starts counts: a test before it may have left its own behind.
    threads_before = set(threading.enumerate())
    children_before = set(multiprocessing.active_children())
    with pytest.raises(CacheError, match="injected"):
        Engine(
            "x86_64",
            eager_config(compile_mode=mode),
            cache_dir=cache_root,
            models=("associator", "predictor"),
            weights=WEIGHTS,
        )

    def new_children() -> set[Any]:
        return set(multiprocessing.active_children()) - children_before

    deadline = time.monotonic() + EXIT_BOUND_S
    while time.monotonic() < deadline and new_children():
        time.sleep(0.1)
    new_threads = set(threading.enumerate()) - threads_before
    assert not [t for t in new_threads if t.name.startswith("jit-compile")]
    assert not new_children(), "the compile worker process outlived it"


def test_warm_up_counts_hotness_per_bucket_not_per_point_count(
    cache_root: Path, tmp_path: Path
) -> None:
    """A point count never repeats, but the bucket it falls in can be hot."""
    profile = tmp_path / "shapes.yaml"
    spread = Counter({Signature.of("forward", {"N": n, "M": 3}): 1 for n in range(5, 15)})
    dump_shape_log({"associator": spread}, profile)
    with associator_engine(cache_root, eager_config(mode="frozen")) as eng:
        assert eng.warm_up(profile, wait_s=120) == 1
        assert eng["associator"].cache.keys() == [Signature.of("forward", {"M": 4, "N": 16})]


def slow_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: a compiler that takes far longer than the frame loop tolerates."""
    time.sleep(0.5)
    return failing_compiler_fault_injector(request, weights)


def test_auto_degrade_and_resume(cache_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = eager_config(max_strikes=100, degrade_min_misses=20, degrade_cooldown_s=0.3)
    with (
        associator_engine(cache_root, config, compile_fn=slow_compiler_fault_injector) as eng,
        caplog.at_level(logging.WARNING),
    ):
        dispatcher = eng["associator"]
        # Shapes of one bucket: every call after the first is a miss of an accepted key.
        for i in range(60):
            dims = {"N": 1 + i % 3, "M": 2 + i % 3}
            dispatcher("forward", *call_inputs("associator", dims, seed=i))
            if eng.metrics.degraded_episodes:
                break
            time.sleep(0.1)  # a frame period: the failing compiles finish meanwhile
        assert eng.metrics.degraded_episodes == 1 and eng.metrics.degraded
        assert "auto-degrade" in caplog.text
        time.sleep(0.4)
        dispatcher("forward", *call_inputs("associator", {"N": 3, "M": 3}, seed=99))
        assert not dispatcher.degrade.active, "specialisation resumes after the cool-down"


def test_a_caller_refilling_its_arrays_does_not_change_the_compile_sample(
    cache_root: Path,
) -> None:
    # Bookkeeping that never runs by itself: the sample is taken before the caller refills.
    with associator_engine(cache_root, bookkeeper=Bookkeeper(poll_s=3600.0)) as eng:
        dispatcher = eng["associator"]
        # Held until the sample is checked: a published key lets go of its sample.
        assert eng.pool is not None
        eng.pool.pause()
        arrays = call_inputs("associator", {"N": 5, "M": 3}, seed=4)
        original = [a.copy() for a in arrays]
        for _ in range(2):
            for a, value in zip(arrays, original, strict=True):
                a[...] = value
            dispatcher("forward", *arrays)
            # A frame loop refills its buffers before the bookkeeping has run.
            for a in arrays:
                a.fill(np.nan)
        state = dispatcher.key_state(dispatcher.key_of(Signature.of("forward", {"N": 5, "M": 3})))
        assert state is not None and state.accepted and state.sample is not None
        for got, want in zip(state.sample, original, strict=True):
            np.testing.assert_array_equal(got, want)
        eng.pool.resume()
        # A compile thread still in TVM when the interpreter exits aborts it.
        assert eng.pool.wait_idle(120)
        assert state.entry is not None and state.sample is None


def test_one_compile_at_a_time_tests_an_unmeasured_function(cache_root: Path) -> None:
    with associator_engine(cache_root, compile_fn=slow_compiler_fault_injector) as eng:
        for n in (3, 10, 50):
            for _ in range(3):
                eng["associator"]("forward", *call_inputs("associator", {"N": n, "M": 2}, n))
        assert eng["associator"].accepted_keys() == [Signature.of("forward", {"N": 4, "M": 4})]
    with associator_engine(cache_root) as eng:
        inputs = call_inputs("associator", {"N": 3, "M": 2}, seed=1)
        for _ in range(2):
            eng["associator"]("forward", *inputs)
        assert eng.pool is not None and eng.pool.wait_idle(120)
        for n in (10, 50):
            for _ in range(2):
                eng["associator"]("forward", *call_inputs("associator", {"N": n, "M": 2}, n))
        assert len(eng["associator"].accepted_keys()) == 3, "once measured, compiles may queue"


def test_a_shape_invariant_model_is_never_compiled_where_another_is(cache_root: Path) -> None:
    """The segmenter's one kernel is a template, so a specialisation would run the same loops:
    the hot calls that get the predictor a compile, with compiles free and a 2x gain assumed,
    get the segmenter none, nor a copy of a point cloud to check one on."""
    seg = model_definition("segmenter")
    weights = {"segmenter": init_weights(parameter_shapes(seg), seed=8), **WEIGHTS}
    config = JitConfig(
        mode="adaptive",
        hotness_threshold=2,
        compile_mode="thread",
        prior_compile_s=0.0,
        prior_speedup=0.5,
        weak_edges=EDGES,
    )
    models = ("segmenter", "predictor")
    # Bookkeeping that never runs by itself: the queued call records show the samples taken.
    with Engine(
        "x86_64",
        config,
        cache_dir=cache_root,
        models=models,
        weights=weights,
        bookkeeper=Bookkeeper(poll_s=3600.0),
    ) as eng:
        points = sample_inputs(seg, "forward", {"P": 3000}, seed=1)
        history = call_inputs("predictor", {"A": 2, "T": 8}, seed=1)
        for _ in range(8):
            eng["segmenter"]("forward", *points)
            eng["predictor"]("forward", *history)
        sampled = {name: [record[5] is not None for record in eng[name]._inbox] for name in models}
        assert sampled["segmenter"] == [False] * 8, "no compile to check: no copy"
        assert sampled["predictor"][1], "the call that makes the key hot is copied"
        assert eng.pool is not None and eng.pool.wait_idle(120)
        compiled = Counter(event.model for event in eng.metrics.events)
        assert compiled["predictor"] >= 1 and compiled["segmenter"] == 0, compiled
        assert eng["segmenter"].accepted_keys() == []
        belief = eng["segmenter"].cost_snapshot()["forward"]
        assert belief["floor"] == 1.0 and belief["speedup"] == 1.0
        assert eng["predictor"].cost_snapshot()["forward"]["floor"] == 0.0


def test_warm_up_compiles_no_key_of_a_shape_invariant_model(
    cache_root: Path, tmp_path: Path
) -> None:
    seg = model_definition("segmenter")
    weights = {"segmenter": init_weights(parameter_shapes(seg), seed=8), **WEIGHTS}
    hot = {
        "segmenter": Counter({Signature.of("forward", {"P": 3000}): 50}),
        "associator": Counter({Signature.of("forward", {"N": 3, "M": 3}): 50}),
    }
    shapes = tmp_path / "shapes.yaml"
    dump_shape_log(hot, shapes)
    models = ("segmenter", "associator")
    config = eager_config(mode="frozen")
    with Engine("x86_64", config, cache_dir=cache_root, models=models, weights=weights) as eng:
        assert eng["segmenter"].shape_invariant and not eng["associator"].shape_invariant
        assert eng.warm_up(shapes, wait_s=120) == 1
        assert eng["segmenter"].cache.keys() == []
        assert eng["associator"].cache.keys() == [Signature.of("forward", {"N": 4, "M": 4})]


@pytest.mark.parametrize("release", ["judged", "stale"])
def test_compiles_wait_for_judgements_in_place_before_more_queue(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch, release: str
) -> None:
    """Until IN_PLACE_MIN specialisations of a function were judged where they serve, no more
    than that many are queued, compiling or live awaiting judgement at once."""
    shapes = [(3, 2), (10, 2), (50, 2), (10, 10)]
    keys = [Signature.of("forward", {"N": b, "M": c}) for b, c in [(4, 4), (16, 4), (128, 4)]]
    held = Signature.of("forward", {"N": 16, "M": 16})
    with associator_engine(cache_root) as eng:
        dispatcher = eng["associator"]
        inputs = [call_inputs("associator", {"N": n, "M": m}, seed=n + m) for n, m in shapes]
        for _ in range(2):
            dispatcher("forward", *inputs[0])
        assert eng.pool is not None and eng.pool.wait_idle(120)
        for args in inputs[1:]:
            for _ in range(2):
                dispatcher("forward", *args)
        assert sorted(dispatcher.accepted_keys()) == sorted(keys), "the fourth key waits"
        assert eng.pool.wait_idle(120)
        for _ in range(8):
            dispatcher("forward", *inputs[3])
        assert held not in dispatcher.accepted_keys(), "three live, unjudged: still waiting"
        if release == "judged":
            for _ in range(JUDGE_HITS):
                dispatcher("forward", *inputs[0])
        else:
            monkeypatch.setattr(dispatcher_module, "TRIAL_PATIENCE_S", 0.0)
        for _ in range(8):
            dispatcher("forward", *inputs[3])
        assert held in dispatcher.accepted_keys()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps: Linux")
def test_an_engine_starts_a_lean_worker_that_imports_the_compiler_with_the_first_compile(
    cache_root: Path,
) -> None:
    """The worker's spawn (milliseconds of the engine's own process) comes with the engine,
    not in the middle of serving; until the first compile it holds no compiler, so an engine
    that never specialises never holds hundreds of MB."""
    with associator_engine(cache_root, eager_config(compile_mode="process")) as eng:
        assert eng.pool is not None
        (pid,) = eng.pool.worker_pids()
        assert eng.pool.worker_starts == 1
        assert eng.pool.wait_idle(10.0) and not maps_tvm(pid)
        inputs = call_inputs("associator", {"N": 9, "M": 7}, seed=3)
        for _ in range(3):
            eng["associator"]("forward", *inputs)
        assert eng.pool.wait_idle(180)
        assert eng.metrics.compiles_ok == 1 and maps_tvm(pid)
        assert eng.pool.worker_starts == 1 and eng.pool.worker_pids() == [pid]


def test_an_engine_asked_to_start_its_compile_worker_does_so_at_once(cache_root: Path) -> None:
    """With ``start_workers`` the worker (its interpreter and TVM import) starts before any
    call; the first compile then runs on it rather than starting another."""
    config = eager_config(compile_mode="process", start_workers=True)
    with associator_engine(cache_root, config) as eng:
        assert eng.pool is not None
        assert eng.pool.worker_starts == 1
        (pid,) = eng.pool.worker_pids()
        # Built once the worker had imported the compiler: its start runs beside no call.
        assert eng.pool.wait_started(0.0)
        inputs = call_inputs("associator", {"N": 9, "M": 7}, seed=3)
        for _ in range(3):
            eng["associator"]("forward", *inputs)
        assert eng.pool.wait_idle(180)
        assert eng.metrics.compiles_ok == 1
        assert eng.pool.worker_starts == 1 and eng.pool.worker_pids() == [pid]


def test_an_engine_whose_compile_worker_cannot_start_serves_generic(
    cache_root: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compile_workers, "start_worker", failing_worker_start_fault_injector)
    config = eager_config(compile_mode="process", max_strikes=1)
    with caplog.at_level(logging.WARNING), associator_engine(cache_root, config) as eng:
        inputs = call_inputs("associator", {"N": 5, "M": 6}, seed=2)
        expected = eng["associator"].generic("forward", *inputs)
        for _ in range(3):
            for got, want in zip(eng["associator"]("forward", *inputs), expected, strict=True):
                np.testing.assert_array_equal(got, want)
        assert eng.pool is not None and eng.pool.wait_idle(120.0)
        # The worker starts with the first compile, which finds it broken: a strike.
        assert "compile worker failed to start" in caplog.text
        key = eng["associator"].key_of(Signature.of("forward", {"N": 5, "M": 6}))
        state = eng["associator"].key_state(key)
        assert state is not None and state.blacklisted
        assert eng.metrics.compiles_failed == 1 and eng.metrics.hits == 0


def test_process_pool_compiles_off_thread(cache_root: Path) -> None:
    with associator_engine(cache_root, eager_config(compile_mode="process")) as eng:
        inputs = call_inputs("associator", {"N": 30, "M": 30}, seed=6)
        started = time.perf_counter()
        for _ in range(3):
            eng["associator"]("forward", *inputs)
        assert time.perf_counter() - started < 5.0
        assert eng.pool is not None and eng.pool.wait_idle(180)
        eng["associator"]("forward", *inputs)
        assert eng.metrics.hits == 1


@pytest.mark.parametrize(("yield_min_ms", "stops"), [(0.0, True), (1e6, False)])
def test_calls_stop_a_running_compile_process_unless_below_yield_min_ms(
    cache_root: Path, yield_min_ms: float, stops: bool
) -> None:
    """Calls expected to take ``yield_min_ms`` or more stop a running compile process, and
    none stops the workers while no compile runs."""
    config = eager_config(compile_mode="process", yield_min_ms=yield_min_ms)
    with associator_engine(cache_root, config, stalling_compiler_fault_injector) as eng:
        pool = eng.pool
        assert pool is not None and pool.wait_started(60.0)
        inputs = call_inputs("associator", {"N": 3, "M": 3}, seed=1)
        eng["associator"]("forward", *inputs)
        assert pool.yields == 0 and not pool.running
        eng["associator"]("forward", *inputs)
        deadline = time.monotonic() + 30
        while not pool.running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.running, "the second call makes the key hot and queues its compile"
        eng["associator"]("forward", *inputs)
        assert pool.running and (pool.yields == 1) == stops


def process_states(pids: list[int]) -> set[str]:
    """Each process's state letter from ``/proc/<pid>/stat`` (``T``: stopped by a signal)."""
    return {Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] for pid in pids}


def wait_states(pids: list[int], want: set[str], timeout_s: float = 10.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while (states := process_states(pids)) != want and time.monotonic() < deadline:
        time.sleep(0.005)
    return states


def test_a_compile_process_stays_stopped_while_frame_work_is_under_way(cache_root: Path) -> None:
    """The engine's gate, held by an executor with a unit queued or running (or by a node's
    frame callback), stops the running compile process, and lets it run on once nothing has
    been under way for ``compile_idle_ms``. No call of the dispatcher yields here
    (``yield_min_ms`` is out of reach)."""
    config = eager_config(compile_mode="process", yield_min_ms=1e6)
    with associator_engine(cache_root, config, stalling_compiler_fault_injector) as eng:
        pool = eng.pool
        assert pool is not None and pool.wait_started(60.0)
        inputs = call_inputs("associator", {"N": 3, "M": 3}, seed=1)
        for _ in range(2):
            eng["associator"]("forward", *inputs)
        deadline = time.monotonic() + 30
        while not pool.running and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.running and pool.yields == 0
        pids = pool.worker_pids()
        assert pids
        release = threading.Event()
        options = ExecutorOptions(reserved_workers=1, shared_workers=1)
        with TieredExecutor(options=options, gates=[eng.gate]) as ex:
            frame = ex.submit(lambda: release.wait(10.0), 2)
            after = ex.submit(lambda: "after", 3)
            assert wait_states(pids, {"T"}) == {"T"}
            assert pool.yields == 1 and eng.gate.shut
            release.set()
            assert frame.result(timeout=10.0) and after.result(timeout=10.0) == "after"
            assert "T" not in wait_states(pids, {"R"})
            assert not eng.gate.shut


def test_a_frozen_run_serves_its_warm_specialisations_however_they_timed(
    cache_root: Path, tmp_path: Path
) -> None:
    """Frozen replays must not depend on timing: a build timed slower than generic (an
    acceptance ratio no build can meet) still serves, and is never demoted in place."""
    key = Signature.of("forward", {"N": 16, "M": 4})
    profile = tmp_path / "profile.yaml"
    counts = Counter({Signature.of("forward", {"N": 10, "M": 3}): 5})
    dump_shape_log({"associator": counts}, profile)
    with associator_engine(cache_root, eager_config(mode="frozen", accept_ratio=1e-9)) as eng:
        assert eng.warm_up(profile, wait_s=120) == 1
        dispatcher = eng["associator"]
        assert key in dispatcher.cache.keys()
        state = dispatcher.key_state(key)
        assert state is not None
        state.idle_ms = 1e-6  # any in-place timing would demote it
        inputs = call_inputs("associator", {"N": 10, "M": 3}, seed=1)
        for _ in range(JUDGE_HITS + 5):
            dispatcher("forward", *inputs)
        assert eng.metrics.hits == JUDGE_HITS + 5 and eng.metrics.demoted == 0
        assert eng.metrics.compiles_rejected == 0


@pytest.mark.parametrize(("baseline_ms", "kept"), [(1e-6, False), (1e6, True)])
def test_a_specialisation_slower_in_place_is_demoted(
    cache_root: Path, baseline_ms: float, kept: bool
) -> None:
    with associator_engine(cache_root) as eng:
        dispatcher = eng["associator"]
        inputs = call_inputs("associator", {"N": 10, "M": 3}, seed=1)
        for _ in range(2):
            dispatcher("forward", *inputs)
        assert eng.pool is not None and eng.pool.wait_idle(120)
        key = Signature.of("forward", {"N": 16, "M": 4})
        assert key in dispatcher.cache.keys(), "eager_config publishes any valid build"
        # Judged in place against the default ratio from here on.
        dispatcher.config = dataclasses.replace(dispatcher.config, accept_ratio=0.95)
        state = dispatcher.key_state(key)
        assert state is not None
        # The generic latency the key had before: injected, so the verdict is known.
        state.idle_ms = baseline_ms
        want = dispatcher.generic.run_unchecked("forward", inputs)
        for _ in range(JUDGE_HITS + 5):
            got = dispatcher("forward", *inputs)
            np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL)
        assert (key in dispatcher.cache.keys()) is kept
        assert eng.metrics.demoted == (0 if kept else 1)
        assert eng.metrics.hits == (JUDGE_HITS + 5 if kept else JUDGE_HITS)
        if not kept:
            assert state.rejected and not state.accepted
            assert "demoted" in eng.metrics.events[-1].reason


def published(eng: Engine, dims: dict[str, int]) -> tuple[list[np.ndarray], Signature, Any]:
    """Inputs of ``dims``, made hot until their key's specialisation serves; the key and its
    state."""
    dispatcher = eng["associator"]
    inputs = call_inputs("associator", dims, seed=1)
    for _ in range(2):
        dispatcher("forward", *inputs)
    assert eng.pool is not None and eng.pool.wait_idle(120)
    key = dispatcher.key_of(Signature.of("forward", dims))
    state = dispatcher.key_state(key)
    assert state is not None and state.entry is not None, "eager_config publishes any build"
    return inputs, key, state


def test_a_miss_settled_after_its_keys_build_landed_builds_nothing_more(cache_root: Path) -> None:
    with associator_engine(cache_root, bookkeeper=Bookkeeper(poll_s=3600.0)) as eng:
        dispatcher, pool = eng["associator"], eng.pool
        assert pool is not None
        inputs = call_inputs("associator", {"N": 10, "M": 3}, seed=1)
        key = dispatcher.key_of(Signature.of("forward", {"N": 10, "M": 3}))
        pool.pause()
        for _ in range(2):
            dispatcher("forward", *inputs)
        dispatcher.settle()
        assert pool.in_flight("associator", key)
        # Calls that begin before the build lands; their records wait in the inbox.
        for _ in range(3):
            dispatcher("forward", *inputs)
        pool.resume()
        deadline = time.monotonic() + 120
        while key not in dispatcher.cache.keys() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert key in dispatcher.cache.keys()
        dispatcher.settle()
        assert pool.wait_idle(120)
        assert eng.metrics.compiles_ok == 1 and len(eng.metrics.events) == 1


def test_a_build_landing_for_a_demoted_key_is_not_put_back(cache_root: Path) -> None:
    with associator_engine(cache_root) as eng:
        dispatcher = eng["associator"]
        inputs, key, state = published(eng, {"N": 10, "M": 3})
        library = state.entry.model.library_path
        dispatcher.config = dataclasses.replace(dispatcher.config, accept_ratio=0.95)
        state.idle_ms = 1e-6
        for _ in range(JUDGE_HITS):
            dispatcher("forward", *inputs)
        assert state.rejected and key not in dispatcher.cache.keys()
        assert state.sample is None, "a rejected key keeps no inputs"
        # A build of the key, queued before the demotion, lands after it.
        dispatcher._compiled(key, CompileResult(str(library), 0.1, 0.5), 0.1, "")
        assert key not in dispatcher.cache.keys() and state.entry is None
        assert eng.metrics.compiles_rejected == 1
        assert "demoted meanwhile" in eng.metrics.events[-1].reason


def test_hits_that_race_past_the_judging_count_are_still_judged_once(cache_root: Path) -> None:
    with associator_engine(cache_root) as eng:
        dispatcher = eng["associator"]
        inputs, key, state = published(eng, {"N": 10, "M": 3})
        dispatcher.config = dataclasses.replace(dispatcher.config, accept_ratio=0.95)
        state.idle_ms = 1e6
        errors: list[BaseException] = []

        def hit_many() -> None:
            try:
                for _ in range(JUDGE_HITS // 2):
                    dispatcher("forward", *inputs)
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        threads = [threading.Thread(target=hit_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        assert dispatcher.cost_snapshot()["forward"]["judged_in_place"] == 1
        # As if two callers' increments interleaved so that neither saw the count itself.
        entry = Specialisation(key, state.entry.model, 0, 0.5, hits=JUDGE_HITS, hit_ms=1.0)
        state.idle_ms = 1e-6
        dispatcher._judge(entry, 1.0)
        assert dispatcher.cost_snapshot()["forward"]["judged_in_place"] == 2
        assert eng.metrics.demoted == 1 and state.rejected


def test_a_compile_failing_before_its_submit_returns_leaves_nothing_outstanding(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with associator_engine(cache_root, compile_fn=failing_compiler_fault_injector) as eng:
        dispatcher, pool = eng["associator"], eng.pool
        assert pool is not None
        submit = pool.submit

        def preempted_submitter_fault_injector(
            request: CompileRequest, benefit_ms: float, on_done: Any
        ) -> bool:
            """Fault injector: the submitting thread loses its core until the compile failed."""
            queued = submit(request, benefit_ms, on_done)
            deadline = time.monotonic() + 30
            while not pool.idle(settle=False) and time.monotonic() < deadline:
                time.sleep(0.01)
            return queued

        monkeypatch.setattr(pool, "submit", preempted_submitter_fault_injector)
        inputs = call_inputs("associator", {"N": 5, "M": 5}, seed=2)
        for _ in range(4):
            dispatcher("forward", *inputs)
            dispatcher.settle()
        assert eng.metrics.compiles_failed >= 1
        assert dispatcher._outstanding["forward"] == 0


def test_key_states_go_with_their_last_signature(
    monkeypatch: pytest.MonkeyPatch, cache_root: Path
) -> None:
    """Exact keys are as many as their signatures: pruning one prunes the other."""
    monkeypatch.setattr(dispatcher_module, "PROFILE_MAX", 16)
    config = eager_config(mode="off", weak_edges={"associator": {}})
    with associator_engine(cache_root, config) as eng:
        dispatcher = eng["associator"]
        for n in range(1, 40):
            dispatcher("forward", *call_inputs("associator", {"N": 5, "M": 5}, seed=5))
            dispatcher("forward", *call_inputs("associator", {"N": n, "M": 7}, seed=n))
        dispatcher.settle()
        assert dispatcher.shape_counts_dropped > 0
        kept = {shape.key for shape in dispatcher._shapes.values()}
        assert set(dispatcher._keys) == kept


def slow_succeeding_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: a compiler that succeeds, but only after 2 s."""
    time.sleep(2.0)
    return compile_to_cache(request, weights)


def test_a_frozen_warm_up_waits_for_its_compiles_and_drops_any_landing_later(
    cache_root: Path, tmp_path: Path
) -> None:
    profile = tmp_path / "shapes.yaml"
    counts = Counter({Signature.of("forward", {"N": 12, "M": 7}): 20})
    dump_shape_log({"associator": counts}, profile)
    key = Signature.of("forward", {"N": 16, "M": 16})
    config = eager_config(mode="frozen")
    # No wait given: frozen mode waits by itself, here for a slow build.
    with associator_engine(cache_root, config, slow_succeeding_compiler_fault_injector) as eng:
        assert eng.warm_up(profile) == 1
        assert eng["associator"].cache.keys() == [key]
    # A wait shorter than the build: it lands after the freeze and never serves.
    with associator_engine(cache_root, config, slow_succeeding_compiler_fault_injector) as eng:
        assert eng.warm_up(profile, wait_s=0.1) == 1
        assert eng.pool is not None and eng.pool.wait_idle(120)
        dispatcher = eng["associator"]
        inputs = call_inputs("associator", {"N": 12, "M": 7}, seed=4)
        want = dispatcher.generic.run_unchecked("forward", inputs)
        got = dispatcher("forward", *inputs)
        np.testing.assert_array_equal(got[0], want[0])
        assert len(dispatcher.cache) == 0 and eng.metrics.hits == 0
        assert eng.metrics.compiles_rejected == 1
        assert eng.metrics.events[-1].reason == "landed after the freeze"


def test_new_cache_bounds_and_hotness_apply_at_once(cache_root: Path) -> None:
    config = eager_config(max_entries=4)
    with associator_engine(cache_root, config) as eng:
        dispatcher = eng["associator"]
        for n in (3, 10, 50):
            published(eng, {"N": n, "M": 2})
        assert len(dispatcher.cache) == 3 and eng.metrics.evictions == 0
        newest = dispatcher.cache.keys()[-1]
        dispatcher.reconfigure(dataclasses.replace(config, max_entries=1, hotness_threshold=6))
        assert dispatcher.cache.keys() == [newest] and eng.metrics.evictions == 2
        # Hot after six calls now, not two.
        inputs = call_inputs("associator", {"N": 2, "M": 9}, seed=9)
        key = dispatcher.key_of(Signature.of("forward", {"N": 2, "M": 9}))
        for _ in range(5):
            dispatcher("forward", *inputs)
        dispatcher.settle()
        pool = eng.pool
        assert pool is not None
        assert not pool.in_flight("associator", key) and key not in dispatcher.cache.keys()
        dispatcher("forward", *inputs)
        dispatcher.settle()
        assert pool.wait_idle(120)
        assert dispatcher.cache.keys() == [key]


def test_bucket_edges_past_a_bound_are_cut_back_to_it(cache_root: Path) -> None:
    """The associator's bound is 128: an edge at 256 would name a key no build can take."""
    edges = {"associator": {"N": (4, 16, 256), "M": (4, 16, 256)}}
    with associator_engine(cache_root, eager_config(weak_edges=edges)) as eng:
        dispatcher = eng["associator"]
        sig = Signature.of("forward", {"N": 100, "M": 3})
        assert dispatcher.key_of(sig) == Signature.of("forward", {"N": 128, "M": 4})
        inputs, _, _ = published(eng, {"N": 100, "M": 3})
        hits = eng.metrics.hits
        dispatcher("forward", *inputs)
        assert eng.metrics.hits == hits + 1 and eng.metrics.compiles_failed == 0


def test_warm_up_checks_each_key_on_its_most_called_recorded_shape(
    cache_root: Path, tmp_path: Path
) -> None:
    """As a live compile is checked on the call that made its key hot: a shape below its
    key's edges is checked through the padding it will be served with."""
    samples: list[tuple[tuple[int, ...], ...]] = []

    def recording_compiler(
        request: CompileRequest, weights: Mapping[str, np.ndarray]
    ) -> CompileResult:
        assert request.sample is not None
        samples.append(tuple(tuple(a.shape) for a in request.sample))
        return compile_to_cache(request, weights)

    profile = tmp_path / "shapes.yaml"
    hot = {
        Signature.of("forward", {"N": 10, "M": 3}): 20,
        Signature.of("forward", {"N": 12, "M": 2}): 5,
        Signature.of("forward", {"N": 100, "M": 16}): 9,
    }
    dump_shape_log({"associator": Counter(hot)}, profile)
    with associator_engine(cache_root, compile_fn=recording_compiler) as eng:
        assert eng.warm_up(profile, wait_s=120) == 2
        keys = {eng["associator"].key_of(sig) for sig in hot}
        assert keys == {
            Signature.of("forward", {"N": 16, "M": 4}),
            Signature.of("forward", {"N": 128, "M": 16}),
        }
    assert sorted(samples) == [((10, 8), (3, 8)), ((100, 8), (16, 8))]


def test_a_build_fetched_from_the_artefact_cache_is_no_compile_time_estimate(
    tmp_path: Path,
) -> None:
    """A cache of its own: the first engine builds the key, the second fetches it."""
    config = eager_config(prior_compile_s=600.0)
    for round_ in range(2):
        with associator_engine(tmp_path, config) as eng:
            published(eng, {"N": 10, "M": 3})
            snapshot = eng["associator"].cost_snapshot()["forward"]
            event = eng.metrics.events[-1]
            if round_ == 0:
                assert snapshot["compile_s"] < 600.0 and event.reason == ""
            else:
                assert snapshot["compile_s"] == 600.0, "a cache hit is not a compile"
                assert event.reason == "from the artefact cache"


def test_a_profile_of_aliases_standing_for_billions_of_items_is_a_config_error(
    tmp_path: Path,
) -> None:
    """YAML aliases share structure: nine short lines stand for 10**9 items, which an error
    message must not walk."""
    lines = ["version: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    lines.append("models: {associator: [*a8]}")
    path = tmp_path / "shapes.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="needs function, dims, calls"):
        load_shape_log(path)
