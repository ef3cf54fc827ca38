"""core/runtime."""
