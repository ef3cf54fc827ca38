"""CPU schedule rules that stay valid for symbolic extents, chosen per target."""

from dynshape_perception.core.compiler.schedules.rules import (
    CpuScheduleContext,
    ScheduleReport,
    apply_cpu_rules,
    context_for_target,
)

__all__ = ["CpuScheduleContext", "ScheduleReport", "apply_cpu_rules", "context_for_target"]
