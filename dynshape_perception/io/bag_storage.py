"""Integrity of a bag's storage files: mcap chunk CRCs, sqlite3's structural check, read errors."""

from __future__ import annotations

import sqlite3
import struct
import sys
import zlib
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import apsw
from rosbags.highlevel import AnyReaderError
from rosbags.rosbag2 import ReaderError
from rosbags.rosbag2.storage_mcap import DECOMPRESSORS
from rosbags.serde import SerdeError
from rosbags.typesys import (
    TypesysError,
)

from dynshape_perception.errors import DataError

if sys.version_info >= (3, 14):
    from compression.zstd import ZstdError
else:
    from backports.zstd import ZstdError


# Errors that rosbags and the storage libraries raise on truncated or corrupt files.
READ_ERRORS = (
    AnyReaderError,
    ReaderError,
    SerdeError,
    OSError,
    EOFError,
    ValueError,
    KeyError,
    IndexError,
    TypeError,
    AssertionError,
    ArithmeticError,
    RuntimeError,
    MemoryError,
    struct.error,
    sqlite3.Error,
    apsw.Error,
    UnicodeDecodeError,
    # Corrupt zstd data (file, message or mcap chunk compression); lz4 raises RuntimeError.
    ZstdError,
    TypesysError,
)
_REASON_CHARS = 120
MCAP_MAGIC = b"\x89MCAP0\r\n"
_OP_CHUNK = 0x06
_OP_DATA_END = 0x0F
_OP_FOOTER = 0x02
# A chunk record's fixed head: start and end log time, uncompressed size, uncompressed CRC.
_CHUNK_HEAD = struct.Struct("<QQQI")
_RECORD_HEAD = struct.Struct("<BQ")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


def first_line(err: BaseException) -> str:
    """Parser errors quote the whole definition: their first line names the problem."""
    line = (str(err).strip().splitlines() or [""])[0].rstrip(":")
    if len(line) > _REASON_CHARS:
        line = line[: _REASON_CHARS - 3] + "..."
    return f"{type(err).__name__}: {line}" if line else type(err).__name__


@dataclass
class BagCheck:
    """What ``BagReader.verify`` could check."""

    chunks_checked: int = 0
    chunks_unchecked: int = 0
    sqlite3_files: int = 0
    unchecked_files: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        if self.chunks_checked or self.chunks_unchecked:
            parts.append(f"{self.chunks_checked} mcap chunk(s) matched their CRC")
        if self.chunks_unchecked:
            parts.append(f"{self.chunks_unchecked} chunk(s) carry no CRC to check")
        if self.sqlite3_files:
            parts.append(
                f"{self.sqlite3_files} sqlite3 file(s) structurally sound (sqlite3 keeps no "
                "checksums of messages)"
            )
        if self.unchecked_files:
            parts.append(f"not checked: {', '.join(self.unchecked_files)}")
        return "; ".join(parts) or "nothing to check"


@dataclass(frozen=True)
class _Chunk:
    offset: int
    crc_at: int
    crc: int
    compression: str
    uncompressed_size: int
    data: bytes


def mcap_chunks(path: Path, handle: BinaryIO) -> Iterator[_Chunk]:
    """The chunk records of an mcap file's data section, read record by record."""
    size = path.stat().st_size
    if handle.read(len(MCAP_MAGIC)) != MCAP_MAGIC:
        raise DataError(f"{path} is no mcap file (its magic bytes are wrong)")
    while True:
        offset = handle.tell()
        head = handle.read(_RECORD_HEAD.size)
        if len(head) < _RECORD_HEAD.size:
            raise DataError(f"{path} is truncated: no record at byte offset {offset}")
        op, length = _RECORD_HEAD.unpack(head)
        body_at = offset + _RECORD_HEAD.size
        if body_at + length > size:
            raise DataError(
                f"{path} is damaged: the record at byte offset {offset} runs past the end "
                f"of the file ({length} bytes)"
            )
        if op in (_OP_DATA_END, _OP_FOOTER):
            return
        if op == _OP_CHUNK:
            body = handle.read(length)
            try:
                _, _, usize, crc = _CHUNK_HEAD.unpack_from(body)
                at = _CHUNK_HEAD.size
                (name_len,) = _U32.unpack_from(body, at)
                compression = body[at + 4 : at + 4 + name_len].decode()
                at += 4 + name_len
                (csize,) = _U64.unpack_from(body, at)
            except (struct.error, UnicodeDecodeError) as err:
                raise DataError(
                    f"{path} is damaged: the chunk at byte offset {offset} has a broken "
                    f"header ({reason(err)})"
                ) from err
            data = body[at + 8 : at + 8 + csize]
            if len(data) != csize:
                raise DataError(
                    f"{path} is damaged: the chunk at byte offset {offset} holds "
                    f"{len(data)} of its {csize} bytes"
                )
            yield _Chunk(offset, body_at + 24, crc, compression, usize, data)
        else:
            handle.seek(body_at + length)


def _uncompressed(path: Path, chunk: _Chunk) -> bytes:
    try:
        raw = DECOMPRESSORS[chunk.compression](chunk.data, chunk.uncompressed_size)
    except KeyError as err:
        raise DataError(
            f"{path}: the chunk at byte offset {chunk.offset} has unknown compression "
            f"{chunk.compression!r}"
        ) from err
    except READ_ERRORS as err:
        raise DataError(
            f"{path} is damaged: the chunk at byte offset {chunk.offset} does not "
            f"decompress ({reason(err)})"
        ) from err
    if len(raw) != chunk.uncompressed_size:
        raise DataError(
            f"{path} is damaged: the chunk at byte offset {chunk.offset} holds {len(raw)} "
            f"bytes, its header says {chunk.uncompressed_size}"
        )
    return raw


def seal_mcap_chunks(path: Path) -> int:
    """Write the CRC of every chunk that has none (rosbags writes 0: unchecked); returns
    how many were sealed. Replay then tells a damaged chunk from a good one."""
    sealed = 0
    with path.open("r+b") as handle:
        chunks = [c for c in mcap_chunks(path, handle) if c.crc == 0]
        for chunk in chunks:
            crc = zlib.crc32(_uncompressed(path, chunk))
            handle.seek(chunk.crc_at)
            handle.write(_U32.pack(crc))
            sealed += 1
    return sealed


def check_mcap_chunks(path: Path) -> tuple[int, int]:
    """(chunks whose CRC matched, chunks without a CRC); a DataError names a damaged one."""
    checked = unchecked = 0
    try:
        with path.open("rb") as handle:
            for chunk in mcap_chunks(path, handle):
                if chunk.crc == 0:
                    unchecked += 1
                    continue
                if zlib.crc32(_uncompressed(path, chunk)) != chunk.crc:
                    raise DataError(
                        f"{path} is damaged: the chunk at byte offset {chunk.offset} does not "
                        f"match its CRC"
                    )
                checked += 1
    except OSError as err:
        raise DataError(f"cannot read {path}: {reason(err)}") from err
    return checked, unchecked


def check_sqlite3(path: Path) -> None:
    """sqlite3's own structural check of a storage file; a DataError names what it found."""
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            rows = conn.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as err:
        raise DataError(f"{path} is damaged: {reason(err)}") from err
    problems = [str(r[0]) for r in rows if r[0] != "ok"]
    if problems:
        raise DataError(f"{path} is damaged: {problems[0]}")


def reason(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text}" if text else type(err).__name__
