"""The emulated aarch64 Python (qemu user mode, Debian rootfs, aarch64 TVM wheels) under .emu/."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynshape_perception.tools.verify.common import VerifyError, repo_root

log = logging.getLogger(__name__)

QEMU = "qemu-aarch64-static"
SETUP_SCRIPT = Path("scripts") / "setup_aarch64_emu.sh"
STAMP = ".complete"
PYTHON = Path("usr/bin/python3.11")


def default_emu_dir() -> Path:
    env = os.environ.get("DYNSHAPE_EMU_DIR")
    return Path(env) if env else repo_root() / ".emu"


@dataclass(frozen=True)
class EmulatedPython:
    """``QEMU_LD_PREFIX=root PYTHONPATH=site qemu-aarch64-static root/usr/bin/python3.11``."""

    root: Path
    site: Path

    @classmethod
    def at(cls, emu_dir: Path) -> EmulatedPython:
        return cls(emu_dir / "aarch64" / "root", emu_dir / "aarch64" / "site")

    @property
    def ready(self) -> bool:
        return (self.root.parent / STAMP).is_file() and (self.root / PYTHON).is_file()

    def command(self, script: Path, args: Sequence[str] = ()) -> list[str]:
        return [QEMU, str(self.root / PYTHON), str(script), *args]

    def environment(self, runtime_only: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "QEMU_"))}
        env.update(QEMU_LD_PREFIX=str(self.root), PYTHONPATH=str(self.site), PYTHONNOUSERSITE="1")
        if runtime_only:
            env["TVM_USE_RUNTIME_LIB"] = "1"
        return env

    def run(
        self, script: Path, args: Sequence[str] = (), timeout_s: float = 1800.0
    ) -> subprocess.CompletedProcess[str]:
        """One emulated Python process; raises VerifyError with its output if it crashes."""
        cmd = self.command(script, args)
        log.info("running %s", " ".join(cmd))
        try:
            return subprocess.run(
                cmd,
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise VerifyError(f"emulated aarch64 Python failed to run: {err}") from err


def missing_tools() -> list[str]:
    tools = (QEMU, "debootstrap", "dpkg-deb", "unzip")
    return [tool for tool in tools if shutil.which(tool) is None]


def ensure_emulator(emu_dir: Path | None = None, set_up: bool = True) -> EmulatedPython:
    """The emulated Python, set up first (scripts/setup_aarch64_emu.sh) when it is missing."""
    emu_dir = emu_dir or default_emu_dir()
    python = EmulatedPython.at(emu_dir)
    if python.ready:
        return python
    script = repo_root() / SETUP_SCRIPT
    if not set_up or not script.is_file():
        raise VerifyError(
            f"no emulated aarch64 Python under {emu_dir}; run `make emu-aarch64` in the checkout"
        )
    missing = missing_tools()
    if missing:
        raise VerifyError(
            f"cannot set up aarch64 emulation: {', '.join(missing)} missing (make system-deps)"
        )
    started = time.perf_counter()
    env = dict(os.environ, DYNSHAPE_EMU_DIR=str(emu_dir))
    proc = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not python.ready:
        raise VerifyError(f"{SETUP_SCRIPT} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    log.info("set up %s in %.1f s", emu_dir, time.perf_counter() - started)
    return python
