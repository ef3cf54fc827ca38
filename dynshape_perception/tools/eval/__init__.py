"""Evaluation against real data: trajectory prediction and lidar segmentation."""
