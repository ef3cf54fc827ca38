"""A node's frame work shows in the host's work table, which the other nodes' gates read."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dynshape_perception.nodes.tracker_node import TrackerNode
from dynshape_perception.runtime.host_work import SLOT, default_path
from dynshape_perception.testing.hostile import nodes_in_process

pytestmark = pytest.mark.ros


def _own_slot(path: os.PathLike[str]) -> np.void:
    slots = np.fromfile(path, dtype=SLOT)
    own = np.flatnonzero(slots["pid"] == os.getpid())
    assert own.size == 1, "one slot per process, whatever its engines"
    return slots[own[0]]


def test_a_node_keeps_a_slot_in_the_host_table_and_holds_it_through_a_frame() -> None:
    path = default_path()
    if path is None:
        pytest.skip("the host has no /dev/shm")
    with nodes_in_process((TrackerNode,), {}) as nodes:
        node = nodes["tracker_node"]
        assert node.notes["host_gate"] == str(path)
        assert _own_slot(path)["since"] == 0.0
        with node.handling("a frame"):
            assert _own_slot(path)["since"] > 0.0, "under way"
        slot = _own_slot(path)
        assert slot["since"] == 0.0 and slot["ended"] > 0.0
    with nodes_in_process((TrackerNode,), {"jit.host_gate": False}) as nodes:
        assert nodes["tracker_node"].notes["host_gate"] == "off"
