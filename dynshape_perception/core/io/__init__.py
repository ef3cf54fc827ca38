"""core/io."""
