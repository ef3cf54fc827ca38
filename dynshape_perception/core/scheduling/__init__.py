"""core/scheduling."""
