"""A process's or a thread's ``/proc/.../stat`` line, read the one way that holds for any
command name."""

from __future__ import annotations

# Zombie (exited, not yet reaped) and dead: no longer running.
GONE_STATES = frozenset({"Z", "X"})


def stat_fields(stat: str) -> list[str]:
    """The fields after the command name, the scheduler state first. The name is in
    parentheses and may itself hold spaces and parentheses, so they follow its last ")"."""
    return stat.rsplit(")", 1)[1].split()
