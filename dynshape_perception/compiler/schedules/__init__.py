"""CPU schedule rules that stay valid for symbolic extents, chosen per target."""

from dynshape_perception.compiler.schedules.context import (
    CpuScheduleContext,
    context_for_target,
)
from dynshape_perception.compiler.schedules.rules import ScheduleReport, apply_cpu_rules

__all__ = ["CpuScheduleContext", "ScheduleReport", "apply_cpu_rules", "context_for_target"]
