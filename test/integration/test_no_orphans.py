"""A node killed by SIGKILL in the middle of a compile leaves no process of its tree behind."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from dynshape_perception.compiler.cache import STAGE_PREFIX
from dynshape_perception.runtime.shape_log import dump_shape_log
from dynshape_perception.runtime.shapes import Signature
from dynshape_perception.testing.processes import (
    ORPHAN_WAIT_S,
    dds_env,
    domain_lease,
    kill_session,
    session_left,
    session_members,
    start_node,
)

pytestmark = pytest.mark.ros

STARTUP_TIMEOUT_S = 300.0
# Obstacle and track counts the tracker specialises on exactly: one compile each, in turn.
WARM_UP_SHAPES = tuple((n, m) for n in (3, 5, 7) for m in (2, 4, 6))
HOT_CALLS = 1_000


def _compiling(cache: Path) -> bool:
    """A worker is building a specialisation: its staging folder is in the cache."""
    return cache.is_dir() and any(p.name.startswith(STAGE_PREFIX) for p in cache.iterdir())


def _all_guarded(tree: dict[int, str]) -> bool:
    """Every compile worker is past its start-up: it has set its parent-death guard, which
    makes it the leader of its own process group. (One killed while still importing ends
    once its imports are done, seconds later, instead of at once.)"""
    workers = [pid for pid, cmd in tree.items() if "spawn_main" in cmd]
    try:
        return bool(workers) and all(os.getpgid(pid) == pid for pid in workers)
    except ProcessLookupError:
        return False


def test_a_node_killed_mid_compile_leaves_no_process_of_its_tree(
    node_overrides: dict[str, bool | int | float | str], tmp_path: Path
) -> None:
    shapes = tmp_path / "shapes.yaml"
    counter = Counter(
        {Signature.of("forward", {"N": n, "M": m}): HOT_CALLS for n, m in WARM_UP_SHAPES}
    )
    dump_shape_log({"associator": counter}, shapes)
    cache = tmp_path / "cache"
    overrides = {
        **node_overrides,
        # A cache of its own: the warm-up's compiles are never hits of another test's.
        "model_cache_dir": str(cache),
        "jit.mode": "adaptive",
        "jit.compile_mode": "process",
        "jit.warm_up_shapes": str(shapes),
    }
    with domain_lease() as domain:
        # One engine, one compile pool: its worker starts before the warm-up is queued.
        node = start_node(
            "tracker_node", env=dds_env(domain), log_dir=tmp_path, overrides=overrides
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S

            def queued() -> bool:
                return "specialisation(s) queued" in node.log()

            def compiling() -> bool:
                return _compiling(cache) and _all_guarded(session_members(node.pid))

            # The node builds its generic model first (staging in the cache too), then queues
            # the warm-up: only a staging folder after that is a worker's compile.
            assert node.wait_until(queued, STARTUP_TIMEOUT_S), node.log()[-3000:]
            left_s = deadline - time.monotonic()
            assert node.wait_until(compiling, left_s, poll_s=0.01), node.log()[-3000:]
            tree = session_members(node.pid)
            assert any("resource_tracker" in cmd for cmd in tree.values()), tree
            os.kill(node.pid, signal.SIGKILL)
            node.popen.wait(timeout=ORPHAN_WAIT_S)
            assert session_left(node.pid) == {}, node.log()[-3000:]
        finally:
            node.stop(signal.SIGKILL, timeout_s=1.0)
            kill_session(node.pid)
