"""Generated scenes: a ray-cast lidar, streets, drives and pedestrians."""
