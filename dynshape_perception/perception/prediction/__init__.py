"""Trajectory prediction: histories, the predictor's batches, incremental and speculative steps."""
