"""When /diagnostics updates: between frames, and never later than one period after due."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter

from dynshape_perception import parameters
from dynshape_perception.nodes.diagnostics import NodeDiagnostics
from dynshape_perception.scheduling.work import WorkCount, holding
from dynshape_perception.testing.processes import leased_context

pytestmark = pytest.mark.ros

WAIT_S = 10.0
# Long enough that the updater's own timer never fires within a test: the tests call its
# callback themselves, so that every tick is one they chose.
NEVER_S = 3600.0


@pytest.fixture
def context() -> Iterator[Context]:
    with leased_context() as ctx:
        yield ctx


class Rig:
    """A node with its diagnostics and frame work, and a second node reading /diagnostics."""

    def __init__(self, context: Context) -> None:
        self.node = Node(
            "diagnostics_timing",
            context=context,
            parameter_overrides=[Parameter("diagnostic_updater.period", value=NEVER_S)],
        )
        self.work = WorkCount()
        values = {n: s.default for n, s in parameters.node_specs("tracker_node").items()}
        self.diagnostics = NodeDiagnostics(self.node, "test", values, lambda: self.work.busy)
        self.work.listen(self.diagnostics.work_ended)
        self.diagnostics.add_task("input", lambda: (0, [], {"frames": 1}))
        self.reader = Node("diagnostics_reader", context=context)
        self.got: list[DiagnosticArray] = []
        self.reader.create_subscription(DiagnosticArray, "/diagnostics", self.got.append, 10)
        self.executor = SingleThreadedExecutor(context=context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.reader)

    def tick(self) -> None:
        """The updater's period has passed: what its timer runs."""
        self.diagnostics.updater.timer.callback()

    def spin_until_updates(self, n: int) -> bool:
        for _ in range(int(WAIT_S / 0.01)):
            if self.diagnostics.updates >= n and self._read(n):
                return True
            self.executor.spin_once(timeout_sec=0.01)
        return False

    def _read(self, n: int) -> bool:
        # Each update publishes one array with the task's status; the updater's start-up
        # message for the task (added before any reader) need not arrive.
        return sum(any(s.name.endswith(": input") for s in a.status) for a in self.got) >= n

    def close(self) -> None:
        self.executor.shutdown()
        self.reader.destroy_node()
        self.node.destroy_node()


@pytest.fixture
def rig(context: Context) -> Iterator[Rig]:
    made = Rig(context)
    yield made
    made.close()


def test_an_idle_node_updates_at_the_tick(rig: Rig) -> None:
    rig.tick()
    assert rig.diagnostics.updates == 1 and rig.diagnostics.deferred == 0
    assert rig.spin_until_updates(1)


def test_an_update_due_mid_frame_waits_for_the_frame_to_end(rig: Rig) -> None:
    rig.work.enter()
    rig.tick()
    assert rig.diagnostics.updates == 0 and rig.diagnostics.deferred == 1
    for _ in range(20):
        rig.executor.spin_once(timeout_sec=0.01)
    assert rig.diagnostics.updates == 0, "nothing runs while the frame is under way"
    rig.work.leave()
    # The end of the frame wakes the executor, which updates without waiting for a tick.
    assert rig.spin_until_updates(1)
    assert rig.diagnostics.updates == 1


def test_a_node_busy_through_a_whole_period_updates_at_the_next_tick(rig: Rig) -> None:
    rig.work.enter()
    rig.tick()
    rig.tick()
    assert rig.diagnostics.updates == 1 and rig.diagnostics.deferred == 1
    # Due again from here: the next tick defers once more, then the one after runs it.
    rig.tick()
    assert rig.diagnostics.updates == 1 and rig.diagnostics.deferred == 2
    rig.tick()
    assert rig.diagnostics.updates == 2
    rig.work.leave()
    assert rig.spin_until_updates(2)
    assert rig.diagnostics.updates == 2, "an update already made is not made again"


def test_frames_ending_with_nothing_due_update_nothing(rig: Rig) -> None:
    for _ in range(3):
        with holding([rig.work]):
            pass
    for _ in range(20):
        rig.executor.spin_once(timeout_sec=0.01)
    assert rig.diagnostics.updates == 0 and rig.work.ends == 3
