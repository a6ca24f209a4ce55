"""The spool: exchanges appended to segment files before the answer leaves, by any number
of proxy processes on one host, loaded by one (other hosts' segments reach it through
object storage: `handoff.py`).

One `write()` per exchange to a segment of the writer's own, `O_APPEND`, under its
`flock`: a crash of the writer (kill -9) loses nothing a client received, and a dead
writer's open segment is claimed by the loader. A closed segment is loadable only when no
segment that may hold an earlier turn of one of its lines is still open (`loadable()`,
`batches()`), so a turn is never placed before the one it continues. Loading after a crash
is the normal path: the loader never takes exchanges from memory. A segment DuckDB refuses
is loaded line by line, each line refused alone set aside in `failed/` with its reason.
docs/collector.md, "The spool", says why each rule holds. The processes sharing a
directory are one host's (`flock` across hosts is not to be relied on); other hosts hand
their segments over through object storage (`handoff.py`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

OPEN = ".part"
CLOSED = ".jsonl"
FAILED = "failed"  # the subdirectory of segments set aside


@dataclass(frozen=True)
class Segment:
    """A closed segment: `opened` and `closed` in ms (epoch), from its name."""

    path: Path
    opened: int
    closed: int

    @property
    def name(self) -> str:
        return self.path.name


def _ms() -> int:
    return int(time.time() * 1000)


def _closed(path: Path) -> Segment:
    parts = path.stem.split("-")
    try:
        opened, closed = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        opened = closed = 0  # a name from before several writers: load it first
    return Segment(path, opened, closed)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _opened(path: Path) -> int:
    try:
        return int(path.stem.split("-")[0])
    except ValueError:
        return 0


class Spool:
    def __init__(
        self,
        directory: Path,
        *,
        fsync: str = "never",
        max_segment_bytes: int = 64 << 20,
        writer: str | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.chmod(0o700)  # users' traffic: its owner's alone, however made
        self.fsync = fsync  # "never", "segment" (at each close) or "always" (each line)
        self.max_segment_bytes = max_segment_bytes
        # Unique across processes, hosts and restarts: the database remembers loaded
        # names until their file is gone.
        self.writer = writer or uuid.uuid4().hex[:12]
        self._seq = 0
        self._fd = -1
        self._current: Path | None = None
        self._opened = 0
        self._bytes = 0

    # -- writing -------------------------------------------------------------------------

    def append(self, line: bytes) -> None:
        if self._fd < 0:
            self._open()
        view = memoryview(line + b"\n")
        while view:
            view = view[os.write(self._fd, view) :]
        if self.fsync == "always":
            os.fsync(self._fd)
        self._bytes += len(line) + 1
        if self._bytes >= self.max_segment_bytes:
            self.rotate()

    @property
    def segment(self) -> int:
        """The sequence number of the segment the next `append` writes to."""
        return self._seq if self._fd >= 0 else self._seq + 1

    def _open(self) -> None:
        self._seq += 1
        self._opened = _ms()
        name = f"{self._opened:013d}-{self.writer}-{self._seq:06d}"
        # Locked before it gets its `.part` name: a loader never sees it unlocked while
        # this writer lives.
        tmp = self.directory / f".{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path = self.directory / f"{name}{OPEN}"
        os.rename(tmp, path)
        self._fd, self._current, self._bytes = fd, path, 0

    def rotate(self) -> None:
        """Close the current segment (if any line went into it): it becomes loadable."""
        if self._fd < 0:
            return
        path, fd = self._current, self._fd
        self._fd, self._current = -1, None
        if self.fsync == "segment":
            os.fsync(fd)
        _close(path, self._opened)
        if self.fsync != "never":  # the rename too: a closed segment stays closed
            _fsync_directory(self.directory)
        os.close(fd)  # after the rename: the lock is held until the segment is closed

    def close(self) -> None:
        self.rotate()

    # -- loading -------------------------------------------------------------------------

    def loadable(self, before: int | None = None) -> list[Segment]:
        """Claim the open segments of writers that died, then return the closed segments
        that may be loaded now, oldest opened first (see the module's docstring).
        `before`: the earliest opening (ms) of a segment elsewhere, not yet in this
        directory (another host's, `handoff.py`), held like a local open segment."""
        held_from = before  # the earliest opening of another live writer's open segment
        for path in self.directory.glob(f"*{OPEN}"):
            if _claim(path):  # this writer's own open segment counts as held too
                continue
            opened = _opened(path)
            held_from = opened if held_from is None else min(held_from, opened)
        closed = sorted(
            (_closed(p) for p in self.directory.glob(f"*{CLOSED}")), key=lambda s: s.opened
        )
        if held_from is None:
            return closed
        # A segment that closed after a held one opened may hold a turn continuing one of
        # the held segment's: it is held too, which may hold more.
        while True:
            earliest = min(
                (s.opened for s in closed if s.closed > held_from and s.opened < held_from),
                default=None,
            )
            if earliest is None:
                return [s for s in closed if s.closed <= held_from]
            held_from = earliest

    def others_writing(self) -> bool:
        """Whether another live writer holds an open segment (its lines are not loadable yet)."""
        return any(p != self._current and _locked(p) for p in self.directory.glob(f"*{OPEN}"))

    def set_aside(self, segment: Segment, why: str) -> Path:
        """Move a closed segment that cannot be loaded to `failed/`, with why; its path there."""
        failed = self.directory / FAILED
        failed.mkdir(mode=0o700, exist_ok=True)
        (failed / f"{segment.name}.error").write_text(why + "\n")
        return segment.path.replace(failed / segment.name)

    def set_aside_line(self, segment: str, number: int, text: bytes, why: str) -> Path:
        """Write line `number` of a segment to `failed/` on its own, with why; its path there.
        (Moved back into the directory, it loads like a segment.)"""
        failed = self.directory / FAILED
        failed.mkdir(mode=0o700, exist_ok=True)
        stem = segment.removesuffix(CLOSED)
        path = failed / f"{stem}-line{number}{CLOSED}"
        (failed / f"{path.name}.error").write_text(why + "\n")
        path.write_bytes(text if text.endswith(b"\n") else text + b"\n")
        return path

    def set_aside_count(self) -> int:
        """How many segments (or single lines of one) lie in `failed/`."""
        return sum(1 for _ in (self.directory / FAILED).glob(f"*{CLOSED}"))

    def bytes_held(self) -> int:
        """What the directory's segments, open and closed, hold (set-aside ones apart)."""
        total = 0
        for path in self.segments():
            with contextlib.suppress(FileNotFoundError):  # loaded or uploaded meanwhile
                total += path.stat().st_size
        return total

    def segments(self) -> list[Path]:
        """Every segment on disk, open and closed."""
        return sorted(
            [*self.directory.glob(f"*{OPEN}"), *self.directory.glob(f"*{CLOSED}")],
            key=lambda p: p.name,
        )


def batches(segments: list[Segment], budget_bytes: int) -> list[list[Segment]]:
    """`segments` (oldest opened first) in batches of at most `budget_bytes` (a segment
    larger than that alone), each closed under overlap: a segment opened before another in
    the batch closed joins it, whatever the size."""
    out: list[list[Segment]] = []
    i = 0
    while i < len(segments):
        batch, size, until = [], 0, 0
        while i < len(segments):
            seg = segments[i]
            n = 0
            with contextlib.suppress(OSError):  # loaded and deleted meanwhile: 0
                n = seg.path.stat().st_size
            if batch and seg.opened >= until and size + n > budget_bytes:
                break
            batch.append(seg)
            size += n
            until = max(until, seg.closed)
            i += 1
        out.append(batch)
    return out


def _close(path: Path, opened: int) -> Path:
    """An open segment's closed name (opened ms, closed ms, writer, seq)."""
    _, writer, seq = path.stem.split("-", 2)
    closed = path.with_name(f"{opened:013d}-{_ms():013d}-{writer}-{seq}{CLOSED}")
    os.rename(path, closed)
    return closed


def _locked(path: Path) -> bool:
    """Whether a live writer holds `path` (its lock cannot be taken)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _claim(path: Path) -> bool:
    """Close the open segment of a writer that died; True if it was (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True  # closed by its writer meanwhile
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if os.fstat(fd).st_size == 0:
            path.unlink(missing_ok=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                _close(path, _opened(path))
        return True
    finally:
        os.close(fd)
