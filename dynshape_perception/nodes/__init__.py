"""The rclpy nodes: the only package besides the test harness that imports rclpy."""
