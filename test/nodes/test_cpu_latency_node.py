"""Each node holds ``power.max_cpu_latency_us`` while it runs, and withdraws it on close."""

from __future__ import annotations

import os

import pytest

from dynshape_perception.nodes.prediction_node import PredictionNode
from dynshape_perception.nodes.tracker_node import TrackerNode
from dynshape_perception.runtime.cpu_latency import DEVICE, current_cpu_latency_us, open_requests
from dynshape_perception.testing.hostile import nodes_in_process

pytestmark = pytest.mark.ros


def test_a_node_holds_the_request_while_it_runs() -> None:
    """Other processes may hold requests too: the kernel's value is an upper bound, and the
    withdrawal is the device's file closed (the kernel keeps a request while it is open)."""
    writable = os.access(DEVICE, os.W_OK)
    # Requests this process already holds (a node another test left open).
    before = open_requests()
    with nodes_in_process((TrackerNode, PredictionNode), {"power.max_cpu_latency_us": 5}) as nodes:
        for node in nodes.values():
            request = node.cpu_latency
            assert request is not None and request.latency_us == 5
            if writable:
                assert request.held
                assert node.notes["cpu_latency"] == "request of 5 µs held"
            else:
                assert not request.held
                assert node.notes["cpu_latency"].startswith("request of 5 µs refused")
                assert str(DEVICE) in node.notes["cpu_latency"]
        if writable:
            current = current_cpu_latency_us()
            assert current is not None and current <= 5
            assert open_requests() == before + 2
    assert all(not node.cpu_latency.held for node in nodes.values() if node.cpu_latency)
    assert open_requests() == before


def test_minus_one_leaves_the_kernel_its_choice() -> None:
    with nodes_in_process((TrackerNode,), {"power.max_cpu_latency_us": -1}) as nodes:
        assert nodes["tracker_node"].cpu_latency is None
        assert "cpu_latency" not in nodes["tracker_node"].notes
