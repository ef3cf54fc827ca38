"""The ROS-free core: compiler, JIT runtime, perception, scheduling, I/O and evaluation."""
