"""Benchmarks run by ``dynshape-perception bench <name>``."""
