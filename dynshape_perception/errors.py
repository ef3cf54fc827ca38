"""The package's one exception hierarchy."""

from __future__ import annotations


class DynshapeError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(DynshapeError):
    """A configuration file or parameter value is invalid."""


class ShapeError(DynshapeError):
    """A tensor has the wrong rank, dtype, width, or a count above its bound."""


class InputValueError(DynshapeError):
    """A tensor holds values the models cannot take (NaN, Inf)."""


class BoundError(ShapeError):
    """A symbolic dimension exceeds its configured upper bound."""


class CompileError(DynshapeError):
    """Building a TVM module failed."""


class CacheError(DynshapeError):
    """An artefact in the on-disk cache is missing or corrupt."""


class WeightsError(DynshapeError):
    """Model weights are missing, mismatched, or fail their checksum."""


class DataError(DynshapeError):
    """A dataset, scan, or bag file cannot be read."""


class MessageError(DynshapeError):
    """A ROS message cannot be converted (bad layout, lengths, or datatypes)."""


class TransformError(DynshapeError):
    """A coordinate transform is unknown, out of its time range, or degenerate."""


class SchedulingError(DynshapeError):
    """Work cannot be admitted or scheduled."""


class ValidationError(CompileError):
    """A specialisation built, but does not match the generic build on a recorded call."""
