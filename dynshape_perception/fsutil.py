"""Atomic file writes: readers in other processes never see a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _umask_by_setting() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# Read once, at import: setting the umask to read it would, for that instant, give files
# created by other threads world-writable modes.
_IMPORT_UMASK = _umask_by_setting()


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over the target."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; published files get the usual umask-derived mode.
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, text.encode())
