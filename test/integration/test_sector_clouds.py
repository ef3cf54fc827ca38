"""pointcloud_node over DDS on sector clouds: near field per sector, whole-scan obstacles."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest

from dynshape_perception.resources import config_path
from dynshape_perception.testing.probe import Probe, probe_session
from dynshape_perception.testing.processes import dds_env, domain_lease, start_node
from dynshape_perception.tools.sim.scenes import sensor_sectors

pytestmark = pytest.mark.ros

SECTORS = 36
REVOLUTIONS = 6
FIRST_NS = 30_000_000_000
STEP_NS = 100_000_000
TIMEOUT_S = 30.0
PRIME_TURNS = 8
PRIME_TIMEOUT_S = 5.0
STARTUP_S = 120.0
DETECTED, NEAR = "detected_objects", "near_objects"


@dataclass
class Pair:
    """One pointcloud_node on whole scans (``/whole``), one on sector clouds (``/sectors``)."""

    whole: Probe
    sectors: Probe
    parts: list[np.ndarray]


@pytest.fixture(scope="module")
def pair(
    node_overrides: dict[str, bool | int | float | str],
    tmp_path_factory: pytest.TempPathFactory,
    kitti_points: np.ndarray,
) -> Iterator[Pair]:
    parts = [p for p in sensor_sectors(kitti_points, SECTORS) if p.shape[0]]
    logs = tmp_path_factory.mktemp("sector_logs")
    with ExitStack() as stack:
        domain = stack.enter_context(domain_lease())
        env = dds_env(domain)
        for name, per_revolution in (("whole", 1), ("sectors", len(parts))):
            proc = start_node(
                "pointcloud_node",
                env=env,
                log_dir=logs,
                params_file=config_path("x86_dev.param.yaml"),
                overrides={
                    **node_overrides,
                    "points.sectors_per_revolution": per_revolution,
                    # Generic kernels score a point alike in any chunk: exact comparisons.
                    "jit.mode": "off",
                },
                remaps=[("__ns", f"/{name}")],
                name=f"pointcloud_{name}",
            )
            stack.callback(proc.stop)
        whole = stack.enter_context(probe_session(domain, "probe_whole", "/whole"))
        sectors = stack.enter_context(probe_session(domain, "probe_sectors", "/sectors"))
        for probe in (whole, sectors):
            up = probe.wait_for_graph({"points": 1}, {DETECTED: 1, NEAR: 1}, timeout_s=STARTUP_S)
            assert up, f"{probe.get_namespace()}: pointcloud_node not up"
        yield Pair(whole, sectors, parts)


def _has(received: Mapping[int, object], stamp: int) -> bool:
    return stamp in received


def _turn(pair: Pair, first: int, timeout_s: float = TIMEOUT_S) -> list[int] | None:
    """One revolution to both nodes; returns the stamps of its sectors, or None as soon as a
    sector's near field has not come back within ``timeout_s`` (the revolution is short)."""
    count = len(pair.parts)
    stamps = [first + k * (STEP_NS // count) for k in range(count)]
    near = pair.sectors.received[NEAR]
    for k, (part, stamp) in enumerate(zip(pair.parts, stamps, strict=True)):
        if k:
            # Spread over the scan period as a spinning lidar's driver sends them, and each
            # after the node answered the one before: on a loaded host a sector sent sooner
            # may overflow the node's input queue (qos.input_depth), and a revolution short
            # of a sector has no whole-scan obstacles to compare.
            pair.sectors.spin_for(STEP_NS * 1e-9 / count)
            if not pair.sectors.spin_until(partial(_has, near, stamps[k - 1]), timeout_s):
                return None
        pair.sectors.publish_points(part, stamp)
    # A whole-scan driver sends the revolution at its last sector's stamp.
    pair.whole.publish_points(np.concatenate(pair.parts), stamps[-1])
    for probe in (pair.whole, pair.sectors):

        def detected(probe: Probe = probe, stamp: int = stamps[-1]) -> bool:
            return stamp in probe.received[DETECTED]

        probe.spin_until(detected, timeout_s)
    return stamps


def test_sectors_give_the_whole_scan_obstacles_once_per_revolution(pair: Pair) -> None:
    count = len(pair.parts)
    turn = 0
    # Discovery settles: a first sector lost on the way cuts its revolution short, and the
    # next revolution is sent after a short wait, not after the timeout of a measured one.
    for turn in range(PRIME_TURNS):
        stamps = _turn(pair, FIRST_NS + turn * STEP_NS, PRIME_TIMEOUT_S)
        if stamps and all(stamps[-1] in p.received[DETECTED] for p in (pair.whole, pair.sectors)):
            break
    else:
        pytest.fail("no revolution came through both nodes")
    near_before = len(pair.sectors.received[NEAR])
    for k in range(1, REVOLUTIONS + 1):
        stamps = _turn(pair, FIRST_NS + (turn + k) * STEP_NS)
        assert stamps is not None, f"a sector of revolution {k} got no near field back"
        got = pair.sectors.received[DETECTED].get(stamps[-1])
        want = pair.whole.received[DETECTED].get(stamps[-1])
        assert got is not None, f"no obstacles of revolution {k} from the sector node"
        assert want is not None, f"no obstacles of revolution {k} from the whole-scan node"
        assert got.table is not None and want.table is not None and want.table.shape[0] > 5
        np.testing.assert_array_equal(got.table, want.table)
        # Nothing before the last sector: one obstacle message per revolution.
        assert not set(stamps[:-1]) & set(pair.sectors.received[DETECTED])
    near = pair.sectors.received[NEAR]
    want_near = near_before + count * REVOLUTIONS
    assert pair.sectors.spin_until(lambda: len(near) >= want_near, TIMEOUT_S), len(near)

    def counted() -> bool:
        status = pair.sectors.task("pointcloud_sectors", "sectors")
        return status is not None and int(status.values["sectors.revolutions"]) >= REVOLUTIONS

    assert pair.sectors.spin_until(counted, TIMEOUT_S)
