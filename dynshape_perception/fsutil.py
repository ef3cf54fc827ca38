"""Atomic file and folder writes: readers in other processes never see a half-written one."""

from __future__ import annotations

import os
import shutil
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


class StagedDir:
    """A folder written under a hidden name beside its target, then renamed into place whole:
    readers see no folder or a complete one, never a half-written one.

    ``path`` is where to write: the target's name inside a hidden folder (``prefix`` and a
    random suffix) in the target's parent, created with the umask-derived mode unless
    ``create`` is off (for a writer that creates its folder itself). Leaving the ``with``
    block, or ``discard``, removes whatever was not published.
    """

    def __init__(self, target: Path, prefix: str | None = None, create: bool = True) -> None:
        self.target = Path(target)
        self.prefix = f".{self.target.name}." if prefix is None else prefix
        self.create = create
        self._hidden: Path | None = None

    def open(self) -> StagedDir:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self._hidden = Path(tempfile.mkdtemp(dir=self.target.parent, prefix=self.prefix))
        if self.create:
            try:
                self.path.mkdir()
            except BaseException:
                self.discard()
                raise
        return self

    @property
    def path(self) -> Path:
        assert self._hidden is not None, "open() first"
        return self._hidden / self.target.name

    def publish(self, replace: bool = False) -> Path:
        """Rename the written folder to the target; ``replace`` removes a folder there first.
        Without it, a folder in the way fails the rename (``OSError``) and the staged one stays."""
        if replace and self.target.is_dir():
            shutil.rmtree(self.target)
        os.rename(self.path, self.target)
        self.discard()
        return self.target

    def discard(self) -> None:
        if self._hidden is not None:
            shutil.rmtree(self._hidden, ignore_errors=True)
            self._hidden = None

    def __enter__(self) -> StagedDir:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.discard()
