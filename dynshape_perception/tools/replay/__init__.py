"""Bag replay: in-process and DDS replay, run directories, golden checks, reports, tuning."""
