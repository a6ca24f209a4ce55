"""A spool segment line by line: the lines DuckDB refuses, and the lines it cannot read.

A segment is loaded whole, in one transaction (`Store.load`). When DuckDB refuses it for
what it holds (a line whose id is already loaded, as from a spool restored out of a
backup), one line must not cost the others: `load_by_line` bisects the segment into
pieces, each a file of its own loaded like a segment, until each refused line stands
alone. The pieces' names are their line ranges, so a crash midway changes nothing: the
segment is refused again, the pieces already loaded are skipped by name (the ledger,
`loaded_segments`), and the same lines are found. The openings (`linear.py`) go first,
in pieces of their own: a turn stored against one finds it in the database, whichever
piece the turn is in. The cost is ~2 log2(lines) loads per refused line (~60 ms each).

DuckDB reads a segment strictly (`Store.load`): a line it cannot parse, a field of the
wrong type, or a line with no `kind` a record has refuses the load, so every line either
loads or is set aside; none is skipped in silence. A crash mid-write tears only a
segment's last line, which then has no line break after it: `unreadable` tells that one,
skipped with a warning, from a line torn elsewhere, which is corruption (a disk, a copy, a
bug), and said loudly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from .records import KINDS

PIECES = ".pieces"  # the spool's subdirectory for the pieces of a refused segment


class _Kind(msgspec.Struct):
    kind: str | None = None


_kind = msgspec.json.Decoder(_Kind).decode


def _kind_of(line: bytes) -> str | None:
    """The line's `kind`, when it is one a spool record has (`records.KINDS`)."""
    try:
        kind = _kind(line).kind
    except msgspec.DecodeError:
        return None
    return kind if kind in KINDS else None


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in its segment
    text: bytes  # with its line break, if it had one
    why: str = ""


@dataclass
class ByLine:
    """What `load_by_line` did: exchanges inserted, and the lines refused, with why."""

    inserted: int = 0
    refused: list[Line] = field(default_factory=list)
    lines: int = 0  # those holding anything


def load_by_line(
    path: Path,
    load: Callable[[Path], int],
    transient: Callable[[BaseException], bool],
) -> ByLine:
    """Load the segment at `path` in pieces (`load(piece)` inserts one, or raises), so
    that only the lines refused alone are left out; a transient error propagates (the
    segment stays, and is tried again). The segment itself is left in place."""
    numbered = [Line(n, text) for n, text in enumerate(path.read_bytes().splitlines(True), 1)]
    work = path.parent / PIECES
    work.mkdir(mode=0o700, exist_ok=True)
    out = ByLine(lines=sum(1 for line in numbered if line.text.strip()))

    def bisect(tag: str, lines: list[Line]) -> None:
        if not lines:
            return
        piece = work / f"{path.stem}.{tag}{lines[0].number}_{lines[-1].number}{path.suffix}"
        piece.write_bytes(b"".join(line.text for line in lines))
        try:
            out.inserted += load(piece)
        except Exception as exc:
            if transient(exc):
                raise
            if len(lines) == 1:
                out.refused.append(Line(lines[0].number, lines[0].text, _reason(exc)))
                return
            half = len(lines) // 2
            bisect(tag, lines[:half])
            bisect(tag, lines[half:])
        finally:
            piece.unlink(missing_ok=True)

    bisect("o", [line for line in numbered if _kind_of(line.text) == "opening"])
    bisect("r", [line for line in numbered if _kind_of(line.text) != "opening"])
    return out


def pieces_of(path: Path) -> str:
    """The prefix of the ledger names of `path`'s pieces (and of `path`'s own)."""
    return f"{path.stem}."


def unreadable(path: Path) -> tuple[list[Line], bool]:
    """The lines of a segment that are no spool record (not JSON, or no `kind` a record
    has), and whether the last of them is the torn tail a crash mid-write leaves (the
    segment's last line, with no line break after it): that one is expected, any other is
    corruption."""
    text = path.read_bytes()
    lines = text.splitlines(True)
    bad = [
        Line(n, line, "not a spool record (not JSON, or no kind a record has)")
        for n, line in enumerate(lines, 1)
        if line.strip() and _kind_of(line) is None
    ]
    tail = bool(bad) and bad[-1].number == len(lines) and not text.endswith(b"\n")
    return bad, tail


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
