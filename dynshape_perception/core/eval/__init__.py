"""core/eval."""
