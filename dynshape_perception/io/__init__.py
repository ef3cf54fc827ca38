"""Point clouds to and from arrays, rosbag2 bags, data set readers, wire tables."""
