"""Atomic writes publish whole files with the umask's mode and never touch the umask."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from dynshape_perception.fsutil import atomic_write, current_umask


def test_atomic_writes_never_change_the_process_umask(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        assert current_umask() == 0o077
        stop = threading.Event()
        seen: list[int] = []

        def watch_umask() -> None:
            # What another thread creating files meanwhile would get.
            while not stop.is_set():
                path = tmp_path / f"other{len(seen)}"
                path.touch()
                seen.append(stat.S_IMODE(path.stat().st_mode))
                path.unlink()

        watcher = threading.Thread(target=watch_umask)
        watcher.start()
        try:
            for n in range(2000):
                atomic_write(tmp_path / "out.bin", n.to_bytes(4, "little"))
        finally:
            stop.set()
            watcher.join()
        assert seen and all(mode & 0o077 == 0 for mode in seen)
        assert stat.S_IMODE((tmp_path / "out.bin").stat().st_mode) == 0o600
        assert (tmp_path / "out.bin").read_bytes() == (1999).to_bytes(4, "little")
    finally:
        os.umask(previous)


def test_an_atomic_write_reads_the_umask_without_setting_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = os.umask

    def counting_umask(mask: int) -> int:
        calls.append(mask)
        return real(mask)

    monkeypatch.setattr(os, "umask", counting_umask)
    atomic_write(tmp_path / "x", b"data")
    assert calls == []
