"""The tiered executor and the work wired to it: tiers, lanes, lidar and prediction units."""
