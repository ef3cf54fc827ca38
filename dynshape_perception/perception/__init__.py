"""Clustering, ground plane, tracking, odometry and the stages wired together, without ROS."""
