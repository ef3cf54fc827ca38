"""The debug timing topics' messages, built as CDR bytes, are those rclpy and rosbags build."""

from __future__ import annotations

import pytest
from rclpy.serialization import serialize_message
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from std_msgs.msg import Float64

from dynshape_perception.nodes.debug_times import float64_bytes, float64_stamped_bytes

pytestmark = pytest.mark.ros

VALUES = (0.0, 1.25, -3.5e-7, 12345.678, float("inf"))
STAMPED = "autoware_internal_debug_msgs/msg/Float64Stamped"


@pytest.mark.parametrize("value", VALUES)
def test_float64_bytes_are_rclpys(value: float) -> None:
    assert float64_bytes(value) == bytes(serialize_message(Float64(data=value)))


@pytest.mark.parametrize("value", VALUES)
def test_float64_stamped_bytes_are_the_cdr_of_autowares_type(value: float) -> None:
    store = get_typestore(Stores.ROS2_JAZZY)
    store.register(get_types_from_msg("builtin_interfaces/Time stamp\nfloat64 data\n", STAMPED))
    time_type = store.types["builtin_interfaces/msg/Time"]
    msg = store.types[STAMPED](stamp=time_type(sec=1_700_000_123, nanosec=999_999_999), data=value)
    expected = bytes(store.serialize_cdr(msg, STAMPED))
    assert float64_stamped_bytes(1_700_000_123, 999_999_999, value) == expected
