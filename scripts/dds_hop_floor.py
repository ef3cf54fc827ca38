"""The least a hop between two nodes costs on the host it runs on: publish to callback.

Usage: PYTHON scripts/dds_hop_floor.py [BYTES] [MESSAGES]  (default: 5000 300)
Two processes with the transport settings the nodes get (loopback, config/fastdds_profile.xml)
on a leased ROS domain, and the QoS of the object topics (reliable, keep last 10): one
publishes a message of BYTES every 16 ms, as serialized bytes with its send time in it, and
the other takes it raw. It is taken three times over, one run each: on the input thread the
nodes take theirs on (``nodes.inputs``), in rclpy's ``SingleThreadedExecutor``, and on the
input thread again while this process holds idle cores polling (a CPU latency request of
0 µs, as ``power.max_cpu_latency_us`` does in the nodes; skipped without write access to
/dev/cpu_dma_latency). Prints, per way, the median and 90th percentile from the publish call
to the callback (one monotonic clock for both processes): the floor under each hop of
``bench e2e --setups separate``.
"""

from __future__ import annotations

import contextlib
import statistics
import struct
import subprocess
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rclpy.qos import QoSProfile

GAP_S = 0.016
DISCOVERY_S = 1.0
LISTEN_S = 60.0
# A UInt8MultiArray in little-endian CDR: encapsulation, an empty layout (no dimensions, offset
# 0), the data's length; the send time sits in the data's first 8 bytes.
_HEAD = struct.Struct("<4sIII")
_STAMP = struct.Struct("<d")
_END = -1.0
INPUT_THREAD = "input thread"
EXECUTOR = "SingleThreadedExecutor"
# (way, CPU latency request held meanwhile in µs, or None for the kernel's choice).
WAYS: tuple[tuple[str, int | None], ...] = (
    (INPUT_THREAD, None),
    (EXECUTOR, None),
    (INPUT_THREAD, 0),
)


def _message(size: int, sent: float) -> bytes:
    data = bytearray(_HEAD.size + max(size, _STAMP.size))
    _HEAD.pack_into(data, 0, b"\x00\x01\x00\x00", 0, 0, len(data) - _HEAD.size)
    _STAMP.pack_into(data, _HEAD.size, sent)
    return bytes(data)


def _qos() -> QoSProfile:
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE
    )


def subscriber(way: str) -> None:
    import threading

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from std_msgs.msg import UInt8MultiArray

    from dynshape_perception.nodes.inputs import InputThread

    rclpy.init()
    node = Node("dds_hop_floor_sub")
    hops_ms: list[float] = []
    done = threading.Event()

    def on_message(data: bytes) -> None:
        now = time.perf_counter()
        sent = _STAMP.unpack_from(data, _HEAD.size)[0]
        if sent == _END:
            done.set()
        else:
            hops_ms.append((now - sent) * 1e3)

    if way == INPUT_THREAD:
        inputs = InputThread(node.context, node.get_name(), threading.RLock())
        inputs.add(
            node.create_subscription(
                UInt8MultiArray, "hop", on_message, _qos(), callback_group=inputs.group, raw=True
            )
        )
        inputs.start()
        done.wait(LISTEN_S)
        inputs.close()
    else:
        node.create_subscription(UInt8MultiArray, "hop", on_message, _qos(), raw=True)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        deadline = time.monotonic() + LISTEN_S
        while not done.is_set() and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
    print(" ".join(f"{h:.4f}" for h in hops_ms), flush=True)
    rclpy.try_shutdown()


def publish(size: int, count: int) -> None:
    import rclpy
    from rclpy.node import Node
    from std_msgs.msg import UInt8MultiArray

    rclpy.init()
    node = Node("dds_hop_floor_pub")
    pub = node.create_publisher(UInt8MultiArray, "hop", _qos())
    while pub.get_subscription_count() == 0:
        time.sleep(0.05)
    time.sleep(DISCOVERY_S)
    for _ in range(count):
        pub.publish(_message(size, time.perf_counter()))
        time.sleep(GAP_S)
    pub.publish(_message(size, _END))
    time.sleep(DISCOVERY_S)
    rclpy.try_shutdown()


def hop(way: str, size: int, count: int, env: dict[str, str]) -> list[float]:
    sub = subprocess.Popen(
        [sys.executable, __file__, "--sub", way], env=env, stdout=subprocess.PIPE, text=True
    )
    subprocess.run([sys.executable, __file__, "--pub", str(size), str(count)], env=env, check=True)
    out, _ = sub.communicate(timeout=LISTEN_S + 30)
    return sorted(float(v) for v in out.split())


def main() -> None:
    from dynshape_perception.runtime.cpu_latency import CpuLatency
    from dynshape_perception.testing.processes import dds_env, domain_lease

    size = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    with domain_lease() as domain:
        env = dds_env(domain)
        for way, latency_us in WAYS:
            name = way if latency_us is None else f"{way}, idle cores held to {latency_us} µs"
            with contextlib.ExitStack() as stack:
                if latency_us is not None:
                    request = stack.enter_context(CpuLatency(latency_us))
                    if not request.held:
                        print(f"{name}: skipped, the request was refused ({request.refused})")
                        continue
                hops = hop(way, size, count, env)
            if not hops:
                raise SystemExit(f"{name}: no message came through")
            p90 = hops[int(0.9 * (len(hops) - 1))]
            print(
                f"{name}: {size} bytes, {len(hops)} of {count} messages: publish to callback "
                f"p50 {statistics.median(hops):.3f} ms, p90 {p90:.3f} ms"
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sub"]:
        subscriber(sys.argv[2])
    elif sys.argv[1:2] == ["--pub"]:
        publish(int(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
