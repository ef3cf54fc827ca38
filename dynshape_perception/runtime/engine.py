"""The runtime engine: every model's generic build, its dispatcher, and one compile pool."""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from dynshape_perception.compiler.cache import ArtefactCache, default_cache_dir
from dynshape_perception.compiler.targets import load_profile as load_target
from dynshape_perception.errors import ConfigError
from dynshape_perception.interrupts import uninterrupted
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import committed_weights, parameter_shapes
from dynshape_perception.models.weights import check_arrays
from dynshape_perception.runtime import host_work
from dynshape_perception.runtime.bookkeeper import Bookkeeper
from dynshape_perception.runtime.compile_gate import CompileGate
from dynshape_perception.runtime.compile_pool import CompileFn, CompilePool
from dynshape_perception.runtime.compile_workers import compile_to_cache
from dynshape_perception.runtime.dispatcher import Dispatcher
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.host_work import HostWork
from dynshape_perception.runtime.metrics import JitMetrics
from dynshape_perception.runtime.policy import InterferenceMeter, JitConfig
from dynshape_perception.runtime.shape_log import dump_shape_log, load_shape_log
from dynshape_perception.runtime.shapes import Signature

log = logging.getLogger(__name__)
T = TypeVar("T")


def off_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a helper thread, waited for here. A build is seconds inside TVM, where
    no signal handler of the calling (main) thread can run; this wait lets one end a node's
    start-up at once. The helper thread is a daemon: the cache writes its result atomically."""
    result: Future[T] = Future()

    def run() -> None:
        try:
            result.set_result(fn(*args))
        except BaseException as err:  # noqa: BLE001 - handed over to the waiting thread
            result.set_exception(err)

    threading.Thread(target=run, name="generic-build", daemon=True).start()
    return result.result()


class Engine:
    """Loads (or builds) the generic symbolic library of each model and dispatches calls."""

    def __init__(
        self,
        profile: str = "x86_64",
        jit: JitConfig | None = None,
        cache_dir: Path | None = None,
        models: Sequence[str] = MODEL_NAMES,
        weights: Mapping[str, Mapping[str, np.ndarray]] | None = None,
        weights_dir: Path | None = None,
        compile_fn: CompileFn = compile_to_cache,
        bookkeeper: Bookkeeper | None = None,
    ) -> None:
        self.target = load_target(profile)
        if not self.target.host_is_native or self.target.is_cuda:
            raise ConfigError(f"profile {profile!r} cannot run in this process; use verify")
        self.jit = jit or JitConfig()
        self.cache = ArtefactCache(cache_dir or default_cache_dir(), self.jit.disk_max_bytes)
        self.metrics = JitMetrics()
        self.weights: dict[str, Mapping[str, np.ndarray]] = {}
        self.dispatchers: dict[str, Dispatcher] = {}
        self.planned: dict[str, dict[str, int]] = {}
        for name in models:
            model = model_definition(name)
            if weights is not None and name in weights:
                w = weights[name]
                check_arrays(w, f"weights given for {name}")
                expected = parameter_shapes(model)
                if {k: tuple(v.shape) for k, v in w.items()} != expected:
                    raise ConfigError(f"weights given for {name} do not match its parameters")
            else:
                _, w = committed_weights(name, weights_dir)
            self.weights[name] = w
        self.pool: CompilePool | None = None
        # The host's work table the gate reads, "off", or why it could not be had.
        self.host_gate = "off"
        # Held by the node's frame work: its compiles run between frames. Open until a pool.
        self.gate = CompileGate((), 0.0)
        # The engine owns it, given or not, and stops its thread on close.
        self.bookkeeper: Bookkeeper | None = None
        try:
            if self.jit.mode != "off":
                # Its worker process is spawned here: a start-up cut between the spawn and
                # the hand-shake would leave the worker reading a closed pipe.
                with uninterrupted():
                    self.pool = self._new_pool(compile_fn)
                    self.gate = CompileGate(
                        [self.pool], self.jit.compile_idle_ms, host=self._host_work()
                    )
                    if self.jit.start_workers:
                        # Now, to import the compiler while the generic builds load.
                        self.pool.start_workers()
                    else:
                        self.pool.start_lean()
            self.bookkeeper = bookkeeper or Bookkeeper()
            for name in models:
                model = model_definition(name)
                own = self.weights[name]
                artefact = off_thread(self.cache.get_or_build, model, own, self.target)
                generic = LoadedModel(model, artefact.library_path)
                self.dispatchers[name] = Dispatcher(
                    model,
                    generic,
                    self.jit,
                    self.metrics,
                    self.pool,
                    self.bookkeeper,
                    shape_invariant=artefact.sidecar.shape_invariant,
                )
                self.planned[name] = artefact.sidecar.planned_bytes
            # A bound lowered since the last run holds from the start, not from the first store;
            # the generic builds were just used, so they stay.
            self.cache.keep_bound()
            self.metrics.bump("disk_evictions", self.cache.evicted)
            # Unless asked to start with the engine, the compile workers start lean and import
            # the compiler with the first compile the policy decides on: a node that never
            # specialises never holds it. Imported here, serving waits for the import, which
            # beside the first frames would stretch them.
            if self.pool is not None and self.jit.start_workers:
                self.pool.wait_started(self.jit.compile_timeout_s)
        except BaseException:
            # The pool's threads and worker process would outlive the failed engine.
            self.close()
            raise

    def _new_pool(self, compile_fn: CompileFn) -> CompilePool:
        return CompilePool(
            self.weights,
            self.target.name,
            self.cache.root,
            size=self.jit.pool_size,
            mode=self.jit.compile_mode,
            timeout_s=self.jit.compile_timeout_s,
            compile_fn=compile_fn,
            cache_max_bytes=self.jit.disk_max_bytes,
            idle_exit_s=self.jit.worker_idle_s,
            meter=InterferenceMeter(
                self.jit.prior_compile_weight,
                # Read while a dispatcher settles its calls: it must not wait on them.
                busy_s=lambda: self.metrics.totals(settle=False).busy_s,
            ),
        )

    def __getitem__(self, name: str) -> Dispatcher:
        return self.dispatchers[name]

    def serving(self) -> int:
        """Specialisations cached and serving now, over every model."""
        return sum(len(d.cache) for d in self.dispatchers.values())

    def shape_counts(self) -> dict[str, Counter[Signature]]:
        return {name: d.shape_counts() for name, d in self.dispatchers.items()}

    def record_shapes(self, path: Path) -> None:
        dump_shape_log(self.shape_counts(), path)

    def warm_up(self, path: Path, top: int | None = None, wait_s: float | None = None) -> int:
        """Queue compiles of the hot keys of a recorded shape log, ``top`` most called first;
        returns how many were queued. With ``wait_s``, block until done or that long.

        Hotness is counted per specialisation key, as the dispatcher counts it: point counts
        never repeat, but the bucket they fall in can be hot. In frozen mode the warm-up is
        all there will be: it always waits (each compile ends within its timeout), and what
        lands later is dropped, so outputs never depend on when a compile finished. A model
        whose generic build is shape-invariant gets no compile: it would run the same loops.
        """
        queued = 0
        for name, counter in load_shape_log(path).items():
            dispatcher = self.dispatchers.get(name)
            if dispatcher is None:
                continue
            if dispatcher.shape_invariant:
                log.info("JIT warm-up: %s runs the same loops at every shape; not compiled", name)
                continue
            per_key: Counter[Signature] = Counter()
            # Each key's most called signature: its compile is checked on that shape, as a
            # live compile is on the call that made its key hot.
            hottest: dict[Signature, tuple[int, Signature]] = {}
            for sig, calls in counter.items():
                problem = dispatcher.model.spec.check_signature(sig.function, sig.as_dict())
                if problem is not None:
                    # A shape log from an older model or other bounds: that entry is no guide.
                    log.warning("shape log %s: skipping %s %s: %s", path, name, sig, problem)
                    self.metrics.bump("shape_log_entries_skipped")
                    continue
                key = dispatcher.key_of(sig)
                per_key[key] += calls
                if calls > hottest.get(key, (0, sig))[0]:
                    hottest[key] = (calls, sig)
            signatures = [
                hottest[key][1]
                for key, calls in per_key.most_common(top)
                if calls >= self.jit.threshold and all(v > 0 for _, v in key.dims)
            ]
            queued += dispatcher.warm(signatures)
        frozen = self.jit.mode == "frozen"
        if self.pool is not None and (wait_s is not None or frozen):
            limit = self.jit.compile_timeout_s * (queued + 1) if wait_s is None else wait_s
            if not self.pool.wait_idle(limit):
                log.warning(
                    "JIT warm-up: compiles still running after %.0f s%s",
                    limit,
                    "; they will not serve (frozen mode)" if frozen else "",
                )
        if frozen:
            for dispatcher in self.dispatchers.values():
                dispatcher.freeze()
        return queued

    def _host_work(self) -> HostWork | None:
        path = host_work.default_path() if self.jit.host_gate else None
        if path is None:
            return None
        try:
            work = host_work.shared(path)
        except ConfigError as err:
            # A table that cannot be had costs the nodes only compiles beside each other's frames.
            log.warning("compiles see only this process's frames: %s", err)
            self.host_gate = f"unavailable: {err}"
            return None
        self.host_gate = str(path)
        return work

    def close(self) -> None:
        if self.bookkeeper is not None:
            self.metrics.settle()
            self.bookkeeper.close()
            self.bookkeeper = None
        self.gate.close()
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
            # A worker killed mid-write (a stop during a frozen warm-up) left its stage.
            self.cache.sweep_orphan_stages()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
