"""A node's subscriptions taken on a thread of their own, from a wait set that holds only them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, cast

from rclpy.callback_groups import CallbackGroup
from rclpy.context import Context
from rclpy.event_handler import EventHandler
from rclpy.exceptions import InvalidHandle
from rclpy.guard_condition import GuardCondition
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.subscription import Subscription

from dynshape_perception.errors import DynshapeError

# A wait that nothing wakes still ends this often (ns), to see a context shut down under it.
POLL_NS = 200_000_000
JOIN_S = 5.0
NS_PER_MS = 1_000_000


@contextmanager
def waited(
    wait_set: Any,
    subscriptions: Sequence[Subscription[Any]],
    timeout_ns: int,
    events: Sequence[EventHandler] = (),
    wake: GuardCondition | None = None,
) -> Iterator[Any]:
    """Wait on ``subscriptions`` (and ``events``, ``wake``) in ``wait_set``; the ready
    subscriptions' handle pointers. Every handle is held, as rclpy's executor holds them,
    through the wait and until the block ends: none is destroyed while its messages are taken."""
    with ExitStack() as held:
        wait_set.clear_entities()
        for sub in subscriptions:
            held.enter_context(sub.handle)
            wait_set.add_subscription(sub.handle)
        for event in events:
            held.enter_context(event)
            event.add_to_wait_set(wait_set)
        if wake is not None:
            held.enter_context(wake.handle)
            wait_set.add_guard_condition(wake.handle)
        wait_set.wait(timeout_ns)
        yield wait_set.get_ready_entities("subscription")


class InputGroup(CallbackGroup):
    """Keeps rclpy's executors off its subscriptions and their QoS event handlers: the input
    thread waits on them all. rmw_fastrtps waits on a subscription's events through the
    status condition of its reader, which its messages change too; an executor that waited
    on the events of subscriptions it does not take spun while a message waited for the
    input thread, and held frames back until the thread's next poll."""

    def can_execute(self, entity: Any) -> bool:
        return False

    def beginning_execution(self, entity: Any) -> bool:
        return False

    def ending_execution(self, entity: Any) -> None:
        pass


class InputThread:
    """Takes each message of its subscriptions and runs their callbacks under ``turn``.

    rclpy's executor rebuilds a wait set of all of a node's entities (parameter services,
    timers, guard conditions, event handlers) for every wake-up, then runs the callback
    through a task: that is most of a hop between two nodes of the frame path. Here a
    message's wake-up goes straight to its callback. ``turn`` is the lock the node's other
    callbacks (rclpy's executor runs those) take too, so that one callback runs at a time,
    as in a single-threaded executor.
    """

    def __init__(
        self, context: Context, name: str, turn: threading.RLock, poll_ns: int = POLL_NS
    ) -> None:
        self.group = InputGroup()
        self._poll_ns = poll_ns
        self._context = context
        self._turn = turn
        self._subscriptions: list[Subscription[Any]] = []
        self._lock = threading.Lock()
        self._changed = False
        self._stopping = False
        self.failure: BaseException | None = None
        # The message whose callback runs: its writer's publication and its take (ns).
        self._published_ns = 0
        self._taken_ns = 0
        self._wake = GuardCondition(None, None, context=context)
        self._thread = threading.Thread(target=self._run, name=f"{name}_inputs", daemon=True)

    def add(self, subscription: Subscription[Any]) -> None:
        """Take ``subscription``'s messages (created with ``callback_group=self.group``)."""
        if subscription.callback_group is not self.group:
            raise DynshapeError(f"{subscription.topic_name}: not in the input thread's group")
        with self._lock:
            self._subscriptions.append(subscription)
            self._changed = True
        self._wake.trigger()

    def start(self) -> None:
        self._thread.start()

    def delivery_ms(self) -> float | None:
        """From the publication of the message whose callback runs (call it from that
        callback) to its take here, in ms: the middleware's delivery and this thread's wake-up.
        Both on the system clock: from another host, the offset between the two clocks too.
        None where the middleware gave no publication time."""
        if self._published_ns <= 0:
            return None
        return (self._taken_ns - self._published_ns) / NS_PER_MS

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop taking messages; waits for a callback under way to end."""
        self._stopping = True
        try:
            self._wake.trigger()
        except InvalidHandle:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(JOIN_S)
        try:
            self._wake.destroy()
        except InvalidHandle:
            pass

    def _run(self) -> None:
        try:
            self._loop()
        except InvalidHandle:
            pass
        except BaseException as err:  # noqa: BLE001 - the node's main thread reports it
            if not self._stopping and self._context.ok():
                self.failure = err
                self._context.try_shutdown()

    def _run_event(self, event: EventHandler) -> None:
        """A QoS event (an incompatible publisher, say): its handler logs it."""
        data = event.take_data()
        step = event.execute(data)
        with self._turn:
            try:
                step.send(None)
            except StopIteration:
                return
        step.close()

    def _loop(self) -> None:
        handle = self._context.handle
        if handle is None:
            return
        subscriptions: list[Subscription[Any]] = []
        events: list[EventHandler] = []
        wait_set: Any = None
        while not self._stopping and self._context.ok():
            with self._lock:
                if self._changed or wait_set is None:
                    subscriptions = list(self._subscriptions)
                    events = [event for sub in subscriptions for event in sub.event_handlers]
                    wait_set = _rclpy.WaitSet(len(subscriptions), 1, 0, 0, 0, len(events), handle)
                    self._changed = False
            with waited(wait_set, subscriptions, self._poll_ns, events, self._wake) as ready:
                for sub in subscriptions:
                    if self._stopping or sub.handle.pointer not in ready:
                        continue
                    taken = sub.handle.take_message(sub.msg_type, sub.raw)
                    if taken is None:
                        continue
                    self._taken_ns = time.time_ns()
                    self._published_ns = int(taken[1].get("source_timestamp", 0))
                    # Message-only callbacks: the node creates no others.
                    callback = cast(Callable[[Any], None], sub.callback)
                    with self._turn:
                        if not self._stopping:
                            callback(taken[0])
                # After the messages: an event is rare, and a message waits on none.
                for event in events:
                    if event.is_ready(wait_set):
                        self._run_event(event)
