"""A /proc stat line's fields follow the last parenthesis, whatever the command name holds."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from dynshape_perception.procfs import GONE_STATES, stat_fields


def test_fields_follow_a_name_with_spaces_and_parentheses() -> None:
    line = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 17 0 0 0\n"
    fields = stat_fields(line)
    assert fields[0] == "S"
    assert fields[1:4] == ["1", "4242", "4242"]


def test_a_thread_whose_name_mimics_a_zombie_reads_as_running() -> None:
    # A thread renamed to hold ") Z (" would fool a split on the first parenthesis.
    seen: list[list[str]] = []

    def read() -> None:
        tid = threading.get_native_id()
        Path(f"/proc/self/task/{tid}/comm").write_text(") Z (x")
        seen.append(stat_fields(Path(f"/proc/self/task/{tid}/stat").read_text()))

    thread = threading.Thread(target=read)
    thread.start()
    thread.join()
    # A thread reading its own line is running, and its parent is its process's.
    assert seen[0][0] == "R" and seen[0][0] not in GONE_STATES
    assert seen[0][1] == str(os.getppid())
