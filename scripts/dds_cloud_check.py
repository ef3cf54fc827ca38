"""How many best-effort PointCloud2 clouds of a size cross between two processes over DDS.

Usage: PYTHON scripts/dds_cloud_check.py [POINTS ...]  (default: 30000 100000 150000)
Runs with the transport settings the nodes get (loopback, LARGE_DATA, config/fastdds_profile.xml)
on a leased ROS domain, with the rclpy of the Python that runs it (.venv: Kilted, .venv-jazzy:
Jazzy). Prints, per size, how many of CLOUDS clouds a sensor-data subscriber received.
"""

from __future__ import annotations

import subprocess
import sys
import time

CLOUDS = 5
GAP_S = 0.3
LISTEN_S = 20.0


def subscriber() -> None:
    import rclpy
    from rclpy.node import Node
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import PointCloud2

    rclpy.init()
    node = Node("dds_cloud_check_sub")
    got: list[int] = []
    node.create_subscription(
        PointCloud2, "points", lambda m: got.append(m.width), qos_profile_sensor_data
    )
    deadline = time.monotonic() + LISTEN_S
    while time.monotonic() < deadline and len(got) < CLOUDS:
        rclpy.spin_once(node, timeout_sec=0.1)
    print(len(got), flush=True)
    rclpy.try_shutdown()


def publish(points: int) -> None:
    import numpy as np
    import rclpy
    from rclpy.node import Node
    from sensor_msgs.msg import PointCloud2, PointField

    rclpy.init()
    node = Node("dds_cloud_check_pub")
    pub = node.create_publisher(PointCloud2, "points", 5)
    while pub.get_subscription_count() == 0:
        time.sleep(0.05)
    time.sleep(1.0)
    fields = [
        PointField(name=c, offset=4 * i, datatype=PointField.FLOAT32, count=1)
        for i, c in enumerate("xyzi")
    ]
    msg = PointCloud2(
        height=1, width=points, fields=fields, point_step=16, row_step=16 * points, is_dense=True
    )
    msg.data = np.zeros(16 * points, np.uint8).tobytes()
    for _ in range(CLOUDS):
        pub.publish(msg)
        time.sleep(GAP_S)
    time.sleep(2.0)
    rclpy.try_shutdown()


def main() -> None:
    from dynshape_perception.testing.processes import dds_env, domain_lease

    sizes = [int(a) for a in sys.argv[1:]] or [30_000, 100_000, 150_000]
    with domain_lease() as domain:
        env = dds_env(domain)
        for points in sizes:
            sub = subprocess.Popen(
                [sys.executable, __file__, "--sub"], env=env, stdout=subprocess.PIPE, text=True
            )
            subprocess.run([sys.executable, __file__, "--pub", str(points)], env=env, check=True)
            received, _ = sub.communicate(timeout=LISTEN_S + 30)
            size_mb = 16 * points / 1e6
            print(f"{points} points ({size_mb:.1f} MB): {received.strip()} of {CLOUDS} received")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sub"]:
        subscriber()
    elif sys.argv[1:2] == ["--pub"]:
        publish(int(sys.argv[2]))
    else:
        main()
