"""The input thread: it alone takes its subscriptions' messages and events, one callback at a
time with the node's other callbacks, and it stops cleanly or says why it stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rclpy.context import Context
from rclpy.event_handler import QoSRequestedIncompatibleQoSInfo, SubscriptionEventCallbacks
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from dynshape_perception.errors import DynshapeError
from dynshape_perception.nodes.inputs import InputThread
from dynshape_perception.testing.processes import leased_context

pytestmark = pytest.mark.ros

WAIT_S = 10.0
# No timed wake-ups: a message the thread is not woken for is never taken.
FOREVER = -1
MESSAGES = 30
TICK_S = 0.001


@pytest.fixture
def context() -> Iterator[Context]:
    with leased_context() as ctx:
        yield ctx


def wait_for(done: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if done():
            return True
        time.sleep(0.005)
    return done()


class Rig:
    """A node whose topic ``in`` the input thread takes, and a publisher on it."""

    def __init__(self, context: Context, qos: QoSProfile | int = 10, **kwargs: Any) -> None:
        self.node = Node("inputs_taker", context=context)
        self.turn = threading.RLock()
        self.inputs = InputThread(context, "inputs_taker", self.turn, poll_ns=FOREVER)
        self.got: list[tuple[str, str]] = []
        self.subscribe("in", qos, **kwargs)
        self.sender = Node("inputs_sender", context=context)
        self.pub = self.sender.create_publisher(String, "in", 10)

    def subscribe(self, topic: str, qos: QoSProfile | int = 10, **kwargs: Any) -> None:
        def on_message(msg: String) -> None:
            self.got.append((msg.data, threading.current_thread().name))

        self.inputs.add(
            self.node.create_subscription(
                String, topic, on_message, qos, callback_group=self.inputs.group, **kwargs
            )
        )

    def send(self, data: str) -> None:
        self.pub.publish(String(data=data))

    def connected(self) -> bool:
        return wait_for(lambda: self.pub.get_subscription_count() > 0)

    def close(self) -> None:
        self.inputs.close()
        self.sender.destroy_node()
        self.node.destroy_node()


@pytest.fixture
def rig(context: Context) -> Iterator[Rig]:
    made = Rig(context)
    yield made
    made.close()


def test_every_message_is_taken_on_the_input_thread_with_an_executor_on_the_node(
    context: Context, rig: Rig
) -> None:
    # rclpy's executor waits on everything else of the node meanwhile, woken often by a
    # timer as a node's are: it must neither run the callbacks nor take their wake-ups (the
    # thread has no timed ones to fall back on).
    rig.node.create_timer(TICK_S, lambda: None)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(rig.node)
    spinning = threading.Thread(target=executor.spin, daemon=True)
    spinning.start()
    try:
        rig.inputs.start()
        assert rig.connected()
        for i in range(MESSAGES):
            rig.send(str(i))
            assert wait_for(lambda: len(rig.got) > i), f"message {i} was not taken"  # noqa: B023
        assert [data for data, _ in rig.got] == [str(i) for i in range(MESSAGES)]
        assert {thread for _, thread in rig.got} == {"inputs_taker_inputs"}
    finally:
        executor.shutdown()
        spinning.join(WAIT_S)


def test_a_callback_sees_its_message_s_delivery(rig: Rig) -> None:
    """From a message's publication to its take, as its callback asks: within the span from
    just before the publish call to the callback, whatever the load."""
    seen: list[tuple[float | None, int]] = []

    def on_message(_: String) -> None:
        seen.append((rig.inputs.delivery_ms(), time.time_ns()))

    rig.inputs.add(
        rig.node.create_subscription(String, "way", on_message, 10, callback_group=rig.inputs.group)
    )
    way = rig.sender.create_publisher(String, "way", 10)
    assert rig.inputs.delivery_ms() is None, "a time before any message was taken"
    rig.inputs.start()
    assert wait_for(lambda: way.get_subscription_count() > 0)
    for i in range(5):
        before_ns = time.time_ns()
        way.publish(String(data=str(i)))
        assert wait_for(lambda: len(seen) > i), f"message {i} was not taken"  # noqa: B023
        ms, called_ns = seen[i]
        assert ms is not None
        assert 0.0 <= ms <= (called_ns - before_ns) / 1e6, (ms, before_ns, called_ns)


def test_a_callback_waits_for_the_turn(rig: Rig) -> None:
    rig.inputs.start()
    assert rig.connected()
    with rig.turn:
        rig.send("held")
        time.sleep(0.3)
        assert rig.got == [], "ran while another callback held the turn"
    assert wait_for(lambda: len(rig.got) == 1)


def test_a_subscription_added_after_the_start_is_taken(context: Context, rig: Rig) -> None:
    rig.inputs.start()
    rig.subscribe("later")
    later = rig.sender.create_publisher(String, "later", 10)
    assert wait_for(lambda: later.get_subscription_count() > 0)
    later.publish(String(data="late"))
    assert wait_for(lambda: [data for data, _ in rig.got] == ["late"])


def test_its_subscriptions_qos_events_reach_their_handlers(context: Context) -> None:
    events: list[str] = []

    def incompatible(info: QoSRequestedIncompatibleQoSInfo) -> None:
        events.append(threading.current_thread().name)

    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    rig = Rig(
        context, reliable, event_callbacks=SubscriptionEventCallbacks(incompatible_qos=incompatible)
    )
    try:
        rig.inputs.start()
        best_effort = QoSProfile(depth=10, reliability=ReliabilityPolicy.BEST_EFFORT)
        rig.sender.create_publisher(String, "in", best_effort)
        assert wait_for(lambda: bool(events)), "the incompatible publisher was not reported"
        assert set(events) == {"inputs_taker_inputs"}
    finally:
        rig.close()


def test_close_stops_the_thread_and_the_taking(rig: Rig) -> None:
    rig.inputs.start()
    assert rig.connected()
    rig.send("before")
    assert wait_for(lambda: len(rig.got) == 1)
    rig.inputs.close()
    assert not rig.inputs.running
    rig.send("after")
    time.sleep(0.3)
    assert [data for data, _ in rig.got] == ["before"]
    assert rig.inputs.failure is None


def test_what_escapes_a_callback_is_kept_and_shuts_the_context_down(context: Context) -> None:
    node = Node("inputs_failing", context=context)
    inputs = InputThread(context, "inputs_failing", threading.RLock(), poll_ns=FOREVER)

    def exiting_fault_injector(_: String) -> None:
        """Fault injector: a callback lets out what no guard catches."""
        raise SystemExit("out of a callback")

    inputs.add(
        node.create_subscription(
            String, "in", exiting_fault_injector, 10, callback_group=inputs.group
        )
    )
    pub = node.create_publisher(String, "in", 10)
    inputs.start()
    assert wait_for(lambda: pub.get_subscription_count() > 0)
    pub.publish(String(data="x"))
    assert wait_for(lambda: not inputs.running)
    assert isinstance(inputs.failure, SystemExit)
    assert not context.ok(), "the node's spin must end"
    inputs.close()


def test_a_subscription_of_another_group_is_refused(context: Context) -> None:
    node = Node("inputs_refusing", context=context)
    inputs = InputThread(context, "inputs_refusing", threading.RLock())
    sub = node.create_subscription(String, "in", lambda _: None, 10)
    with pytest.raises(DynshapeError, match="not in the input thread's group"):
        inputs.add(sub)
    inputs.close()
    node.destroy_node()
