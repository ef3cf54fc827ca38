"""Launch the perception nodes: three stages over DDS, or the composed pipeline in one process."""

from __future__ import annotations

from typing import Any

from launch.actions import (
    DeclareLaunchArgument,
    GroupAction,
    OpaqueFunction,
    SetEnvironmentVariable,
)
from launch.substitutions import EnvironmentVariable, LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node, PushRosNamespace
from launch_ros.substitutions import FindPackageShare

from launch import LaunchContext, LaunchDescription

PACKAGE = "dynshape_perception"
SEPARATE_NODES = ("pointcloud_node", "tracker_node", "prediction_node")
COMPOSED_NODE = "perception_pipeline"
DEFAULT_PARAMS = ("config", "x86_dev.param.yaml")
FASTDDS_PROFILE = ("config", "fastdds_profile.xml")


def _nodes(context: LaunchContext, *_: Any) -> list[Any]:
    composed = LaunchConfiguration("composed").perform(context).lower() == "true"
    target = LaunchConfiguration("target_profile").perform(context)
    overrides: dict[str, Any] = {"use_sim_time": LaunchConfiguration("use_sim_time")}
    if target:
        overrides["target_profile"] = target
    remaps = [
        ("points", LaunchConfiguration("points_topic")),
        ("odom", LaunchConfiguration("odom_topic")),
    ]
    names = (COMPOSED_NODE,) if composed else SEPARATE_NODES
    nodes = [
        Node(
            package=PACKAGE,
            executable=name,
            name=name,
            parameters=[LaunchConfiguration("params_file"), overrides],
            remappings=remaps,
            output="screen",
            emulate_tty=True,
        )
        for name in names
    ]
    return [GroupAction([PushRosNamespace(LaunchConfiguration("namespace")), *nodes])]


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare(PACKAGE)
    return LaunchDescription(
        [
            DeclareLaunchArgument(
                "params_file",
                default_value=PathJoinSubstitution([share, *DEFAULT_PARAMS]),
                description="node parameters (config/x86_dev.param.yaml, jetson_orin.param.yaml)",
            ),
            DeclareLaunchArgument(
                "target_profile",
                default_value="",
                description="target profile overriding the params file (empty: keep the file's)",
            ),
            DeclareLaunchArgument("use_sim_time", default_value="false", choices=["true", "false"]),
            DeclareLaunchArgument(
                "namespace", default_value="", description="namespace of the nodes"
            ),
            DeclareLaunchArgument(
                "composed",
                default_value="false",
                choices=["true", "false"],
                description="true: one perception_pipeline process; false: three nodes over DDS",
            ),
            DeclareLaunchArgument("points_topic", default_value="points"),
            DeclareLaunchArgument("odom_topic", default_value="odom"),
            # Large clouds to best-effort subscribers: docs/interfaces.md, "DDS and large clouds".
            SetEnvironmentVariable(
                "FASTDDS_BUILTIN_TRANSPORTS",
                EnvironmentVariable("FASTDDS_BUILTIN_TRANSPORTS", default_value="LARGE_DATA"),
            ),
            SetEnvironmentVariable(
                "FASTDDS_DEFAULT_PROFILES_FILE",
                EnvironmentVariable(
                    "FASTDDS_DEFAULT_PROFILES_FILE",
                    default_value=PathJoinSubstitution([share, *FASTDDS_PROFILE]),
                ),
            ),
            # Fast DDS 2.x (Jazzy) reads the profile under its older name.
            SetEnvironmentVariable(
                "FASTRTPS_DEFAULT_PROFILES_FILE",
                EnvironmentVariable(
                    "FASTRTPS_DEFAULT_PROFILES_FILE",
                    default_value=EnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE"),
                ),
            ),
            OpaqueFunction(function=_nodes),
        ]
    )
