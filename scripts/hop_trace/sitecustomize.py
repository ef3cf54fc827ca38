"""Per-frame timestamps in every process of a bench run, with HOP_TRACE_DIR set (see report.py)."""

from __future__ import annotations

import gc
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

NS_PER_S = 1_000_000_000
_DIR = os.environ.get("HOP_TRACE_DIR")
_gc_start = [0.0]
_out: list[Any] = []  # this process's log file, opened on its first line


def _write(line: str) -> None:
    # Written as it comes (line-buffered), not at exit: a node stopped by a signal may end
    # without running atexit, and a forked child must not write its parent's lines.
    assert _DIR is not None
    if not _out or _out[0][0] != os.getpid():
        out = open(os.path.join(_DIR, f"{os.getpid()}.log"), "a", buffering=1)
        out.write(f"# {' '.join(sys.argv)}\n")
        _out[:] = [(os.getpid(), out)]
    _out[0][1].write(line)


def log(kind: str, topic: str = "-", stamp_ns: int = 0) -> None:
    # perf_counter is CLOCK_MONOTONIC on Linux: one clock for every process of the run.
    thread = threading.current_thread().name.replace(" ", "_")
    _write(f"{time.perf_counter():.6f} {kind} {topic} {stamp_ns} {thread}\n")


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
        return
    ms = (time.perf_counter() - _gc_start[0]) * 1e3
    _write(f"{time.perf_counter():.6f} gc{info['generation']} {ms:.3f} 0 gc\n")


def _stamp_ns(data: Any, raw: bool) -> int:
    from dynshape_perception.errors import DynshapeError
    from dynshape_perception.io.cdr import header_of

    if not raw:
        return int(data.header.stamp.sec) * NS_PER_S + int(data.header.stamp.nanosec)
    try:
        sec, nanosec, _ = header_of(data)
    except DynshapeError:
        return -1
    return sec * NS_PER_S + nanosec


def _patch_outputs(module: ModuleType) -> None:
    original = module.Output.publish_serialized

    def publish_serialized(self: Any, data: bytes, stamp: Any) -> None:
        ns = int(stamp.sec) * NS_PER_S + int(stamp.nanosec)
        log("pub0", self.name, ns)
        original(self, data, stamp)
        log("pub1", self.name, ns)

    module.Output.publish_serialized = publish_serialized


_named: set[int] = set()


def _name_threads() -> None:
    """Each Python thread's native id and name, once: the kernel knows them all by the
    process's name, and the sched lines name threads by id."""
    for thread in threading.enumerate():
        if thread.native_id is not None and thread.native_id not in _named:
            _named.add(thread.native_id)
            name = thread.name.replace(" ", "_")
            _write(f"{time.perf_counter():.6f} thread {thread.native_id} 0 {name}\n")


def _patch_base(module: ModuleType) -> None:
    original = module.PerceptionNode.subscribe
    original_record = module.PerceptionNode.record_latency

    def subscribe(
        self: Any, msg_type: Any, topic: str, callback: Callable[[Any], None], raw: bool = False
    ) -> None:
        name = self.resolve_topic_name(topic)

        def traced(msg: Any) -> None:
            ns = _stamp_ns(msg, raw)
            _name_threads()
            log("rx", name, ns)
            callback(msg)
            log("rxdone", name, ns)

        original(self, msg_type, topic, traced, raw)

    def record_latency(self: Any, stages: dict[str, float]) -> None:
        log("times0")
        original_record(self, stages)
        log("times1")

    module.PerceptionNode.subscribe = subscribe
    module.PerceptionNode.record_latency = record_latency


def _node_tasks() -> list[str]:
    """The threads of the harness's child processes (the nodes), as /proc paths."""
    me = os.getpid()
    found: list[str] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) != me:
                    continue
            found.extend(f"/proc/{entry}/task/{tid}" for tid in os.listdir(f"/proc/{entry}/task"))
        except (OSError, ValueError, IndexError):
            continue
    return found


def sched(stamp_ns: int) -> None:
    """Each node thread's counters, read before a scan goes out and once its predictions
    are in: ns on a core, ns runnable but waiting for one, times scheduled in (schedstat),
    minor page faults. A slow frame then shows which thread ran longer, and which waited."""
    for task in _node_tasks():
        try:
            with open(f"{task}/schedstat") as stat:
                run_ns, wait_ns, slices = stat.read().split()[:3]
            with open(f"{task}/stat") as stat:
                faults = stat.read().rsplit(")", 1)[1].split()[7]
        except OSError:
            continue
        tid = task.rsplit("/", 1)[1]
        if int(tid) not in _named:
            # Native threads (Fast DDS's) by the name the kernel has for them.
            _named.add(int(tid))
            with open(f"{task}/comm") as comm:
                name = comm.read().strip().replace(" ", "_")
            _write(f"{time.perf_counter():.6f} thread {tid} 0 {name}\n")
        counters = f"{run_ns} {wait_ns} {slices} {faults}"
        _write(f"{time.perf_counter():.6f} sched {tid} {stamp_ns} {counters}\n")


def _patch_probe(module: ModuleType) -> None:
    probe = module.Probe
    publish_cloud = probe.publish_cloud
    objects_cb = probe._objects_cb

    def traced_publish(self: Any, cloud: Any, ns: int, frame_id: str = "lidar") -> None:
        sched(ns)
        log("send", "points", ns)
        publish_cloud(self, cloud, ns, frame_id)

    def traced_objects_cb(self: Any, topic: str) -> Callable[[bytes, Any], None]:
        inner = objects_cb(self, topic)

        def on_objects(data: bytes, info: Any) -> None:
            ns = _stamp_ns(data, raw=True)
            log("probe", topic, ns)
            inner(data, info)
            if topic.endswith("predicted_objects"):
                sched(ns)

        return on_objects

    probe.publish_cloud = traced_publish
    probe._objects_cb = traced_objects_cb


def _patch_diagnostics(module: ModuleType) -> None:
    original = module.NodeDiagnostics._update

    def update(self: Any) -> None:
        log("diag0")
        original(self)
        log("diag1")

    module.NodeDiagnostics._update = update


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "dynshape_perception.nodes.diagnostics": _patch_diagnostics,
    "dynshape_perception.nodes.outputs": _patch_outputs,
    "dynshape_perception.nodes.base": _patch_base,
    "dynshape_perception.testing.probe": _patch_probe,
}


class _Patcher(importlib.abc.MetaPathFinder):
    """Patches each module of PATCHES just after it is first executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        execute = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            patch(module)

        loader.exec_module = exec_module
        return spec


if _DIR:
    gc.callbacks.append(_on_gc)
    sys.meta_path.insert(0, _Patcher())
