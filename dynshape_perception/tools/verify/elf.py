"""Just enough ELF reading to check libraries and cubins: machine, symbols, needed libraries."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dynshape_perception.tools.verify.common import VerifyError

EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190
MACHINE_NAMES = {EM_X86_64: "x86-64", EM_AARCH64: "AArch64", EM_CUDA: "NVIDIA CUDA"}

_SHT_SYMTAB = 2
_SHT_DYNAMIC = 6
_SHT_DYNSYM = 11
_DT_NEEDED = 1
_STT_FUNC = 2
_EI_ABIVERSION = 8
# From ELF ABI version 8 (CUDA 12.8+) a cubin keeps its SM number in e_flags bits 8-15.
_CUDA_ABI_SM_IN_BYTE1 = 8


@dataclass(frozen=True)
class Section:
    name: str
    kind: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: int
    section: int
    value: int
    size: int


@contextmanager
def _parsing(origin: str) -> Iterator[None]:
    """Offsets read from a truncated or corrupt file point past its end: say so, once."""
    try:
        yield
    except (struct.error, IndexError, ValueError) as err:
        raise VerifyError(f"{origin} is a truncated or corrupt ELF file: {err}") from err


class ElfFile:
    """A 64-bit little-endian ELF image held in memory."""

    def __init__(self, data: bytes, origin: str = "ELF data") -> None:
        with _parsing(origin):
            self._parse(data, origin)

    def _parse(self, data: bytes, origin: str) -> None:
        if data[:4] != b"\x7fELF" or len(data) < 64:
            raise VerifyError(f"{origin} is not an ELF file")
        if data[4] != 2 or data[5] != 1:
            raise VerifyError(f"{origin} is not a 64-bit little-endian ELF file")
        self.data = data
        self.origin = origin
        self.machine: int = struct.unpack_from("<H", data, 18)[0]
        self.flags: int = struct.unpack_from("<I", data, 48)[0]
        self.abi_version = data[_EI_ABIVERSION]
        shoff = struct.unpack_from("<Q", data, 40)[0]
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 58)
        raw = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names = raw[shstrndx][4] if shnum else 0
        self.sections = [
            Section(self._cstr(names + r[0]), r[1], r[3], r[4], r[5], r[6], r[9]) for r in raw
        ]

    @classmethod
    def read(cls, path: Path) -> ElfFile:
        try:
            return cls(path.read_bytes(), str(path))
        except OSError as err:
            raise VerifyError(f"cannot read {path}: {err}") from err

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"machine {self.machine}")

    def _cstr(self, offset: int) -> str:
        end = self.data.index(b"\0", offset)
        return self.data[offset:end].decode(errors="replace")

    def symbols(self) -> list[Symbol]:
        with _parsing(self.origin):
            return self._symbols()

    def _symbols(self) -> list[Symbol]:
        out: list[Symbol] = []
        for sec in self.sections:
            if sec.kind not in (_SHT_SYMTAB, _SHT_DYNSYM) or not sec.entsize:
                continue
            strtab = self.sections[sec.link].offset
            for i in range(sec.size // sec.entsize):
                name, info, _, shndx, value, size = struct.unpack_from(
                    "<IBBHQQ", self.data, sec.offset + i * sec.entsize
                )
                out.append(Symbol(self._cstr(strtab + name), info & 0xF, shndx, value, size))
        return out

    def function_names(self) -> set[str]:
        return {s.name for s in self.symbols() if s.kind == _STT_FUNC}

    def symbol_bytes(self, name: str) -> bytes:
        """The bytes a defined data symbol covers in the file."""
        for sym in self.symbols():
            if sym.name == name and 0 < sym.section < len(self.sections):
                sec = self.sections[sym.section]
                start = sec.offset + (sym.value - sec.addr)
                if start < 0 or start + sym.size > len(self.data):
                    raise VerifyError(f"{self.origin}: symbol {name} lies outside the file")
                return self.data[start : start + sym.size]
        raise VerifyError(f"{self.origin} defines no symbol {name}")

    def needed_libraries(self) -> list[str]:
        """DT_NEEDED entries: the shared libraries the dynamic loader must find."""
        with _parsing(self.origin):
            return self._needed_libraries()

    def _needed_libraries(self) -> list[str]:
        needed: list[str] = []
        for sec in self.sections:
            if sec.kind != _SHT_DYNAMIC:
                continue
            strtab = self.sections[sec.link].offset
            for i in range(sec.size // 16):
                tag, value = struct.unpack_from("<qQ", self.data, sec.offset + i * 16)
                if tag == _DT_NEEDED:
                    needed.append(self._cstr(strtab + value))
        return needed

    def cuda_arch(self) -> str:
        """``sm_XX`` of a cubin."""
        if self.machine != EM_CUDA:
            raise VerifyError(f"{self.origin} is {self.machine_name}, not a CUDA cubin")
        if self.abi_version >= _CUDA_ABI_SM_IN_BYTE1:
            return f"sm_{(self.flags >> 8) & 0xFF}"
        return f"sm_{self.flags & 0xFF}"
