"""core/compiler."""
