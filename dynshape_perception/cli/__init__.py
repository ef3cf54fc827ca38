"""Command-line verbs of ``dynshape-perception``."""
