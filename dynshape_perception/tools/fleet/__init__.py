"""Replay and tune a corpus of bags on Ray: the package never needs Ray elsewhere."""
