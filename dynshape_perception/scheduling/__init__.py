"""Tiers, the deadline executor, incremental, streaming and speculative computation."""
