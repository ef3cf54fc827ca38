"""Atomic writes publish whole files and folders with the umask's mode and never touch the umask."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from dynshape_perception.fsutil import StagedDir, atomic_write, current_umask


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


def test_a_staged_folder_appears_whole_and_leaves_nothing_hidden(tmp_path: Path) -> None:
    target = tmp_path / "run"
    with StagedDir(target) as staged:
        (staged.path / "a.txt").write_text("a")
        assert not target.exists(), "nothing is visible before publishing"
        assert staged.path.parent.name.startswith(".run.")
        staged.publish()
    assert (target / "a.txt").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o777 & ~current_umask()


def test_a_failed_staged_write_leaves_the_old_folder_and_no_trace(tmp_path: Path) -> None:
    target = tmp_path / "bundle"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(OSError), StagedDir(target) as staged:
        (staged.path / "new.txt").write_text("new")
        staged.publish()  # a folder is in the way and replace is off
    assert sorted(p.name for p in target.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    with StagedDir(target) as staged:
        (staged.path / "new.txt").write_text("new")
        staged.publish(replace=True)
    assert sorted(p.name for p in target.iterdir()) == ["new.txt"]


def test_a_staged_folder_for_a_writer_that_creates_it_is_not_created(tmp_path: Path) -> None:
    with StagedDir(tmp_path / "bag", create=False) as staged:
        assert staged.path.parent.is_dir() and not staged.path.exists()
    assert list(tmp_path.iterdir()) == []
