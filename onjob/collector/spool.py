"""The spool: exchanges appended to local segment files before the answer leaves.

An exchange is written with one `write()` to a file opened `O_APPEND` before the
client gets its answer, so it survives a crash of the server process (kill -9):
the kernel holds the data. (Surviving a power cut would need an fsync per
exchange; `fsync=True` buys that at a large cost in throughput.)

The writer never takes exchanges from memory: it rotates the current segment,
loads every closed segment into DuckDB, then deletes it. Normal operation and
replay after a crash are one code path, and when DuckDB falls behind the closed
segments pile up on disk rather than in memory. A segment is closed at
`max_segment_bytes` even between flushes, so one load (which DuckDB reads whole)
stays bounded in memory however far loading falls behind.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


class Spool:
    def __init__(
        self, directory: Path, *, fsync: bool = False, max_segment_bytes: int = 64 << 20
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.max_segment_bytes = max_segment_bytes
        existing = self.segments()
        self._seq = _seq(existing[-1]) + 1 if existing else 1
        # Names are unique across runs (the database remembers loaded names until the
        # file is gone), even when the sequence starts again from an empty spool.
        self._run = uuid.uuid4().hex[:8]
        self._fd = -1
        self._bytes = 0
        self._open()

    def segments(self) -> list[Path]:
        return sorted(self.directory.glob("*.jsonl"), key=_seq)

    def _open(self) -> None:
        path = self.directory / f"{self._seq:012d}-{self._run}.jsonl"
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._current = path
        self._bytes = 0

    def append(self, line: bytes) -> None:
        view = memoryview(line + b"\n")
        while view:
            view = view[os.write(self._fd, view) :]
        if self.fsync:
            os.fsync(self._fd)
        self._bytes += len(line) + 1
        if self._bytes >= self.max_segment_bytes:
            self._next()

    def rotate(self) -> list[Path]:
        """Close the current segment if not empty; return all closed segments, oldest first."""
        if self._bytes:
            self._next()
        return [p for p in self.segments() if p != self._current]

    def _next(self) -> None:
        os.close(self._fd)
        self._seq += 1
        self._open()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            if self._bytes == 0:
                self._current.unlink(missing_ok=True)


def _seq(path: Path) -> int:
    return int(path.stem.split("-")[0])
